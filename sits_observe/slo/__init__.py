"""slo subsystem."""

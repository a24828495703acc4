"""probes subsystem."""

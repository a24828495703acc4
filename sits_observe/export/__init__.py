"""export subsystem."""

"""ui subsystem."""

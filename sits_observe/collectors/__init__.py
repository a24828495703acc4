"""collectors subsystem."""

"""sim subsystem."""

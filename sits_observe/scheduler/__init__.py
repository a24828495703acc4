"""scheduler subsystem."""

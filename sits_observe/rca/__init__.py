"""rca subsystem."""

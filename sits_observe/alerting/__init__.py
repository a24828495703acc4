"""alerting subsystem."""

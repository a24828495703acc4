"""Exposition and HTTP: /metrics (Prometheus text), /healthz, /readyz and the /api/v1 REST API."""

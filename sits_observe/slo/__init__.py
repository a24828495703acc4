"""SLOs: specs (``slos:`` config), the in-daemon burn-rate evaluator and Prometheus rule generation."""

__all__: list[str] = []

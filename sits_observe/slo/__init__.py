"""SLOs: specs (``slos:`` config), the in-daemon burn-rate evaluator and Prometheus rule generation.

``sits_observe.config`` is imported first because it imports this package's config section.
"""

from .. import config as _config  # noqa: F401

__all__: list[str] = []

"""GPU and inference-server sources: NVML, a dcgm-exporter page, vLLM and Triton pages, the real topology."""

# sits_observe.config imports this package's config section after defining Section; importing it first
# keeps that order whichever module a caller imports first.
from .. import config as _config  # noqa: F401

"""GPU and inference-server sources: NVML, a dcgm-exporter page, vLLM and Triton pages, the real topology."""

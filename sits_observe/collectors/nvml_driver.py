"""Loading NVML (pynvml, or a stand-in in tests) and the driver check `sits-observe doctor` shows."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import CollectorError
from .background import Background

__all__ = ["SCALARS", "START_TIMEOUT", "clock_event_reasons", "load_nvml", "nvml_status", "is_unsupported", "started"]

T = TypeVar("T")

START_TIMEOUT = 15.0  # seconds the daemon's start waits for NVML to answer at all (healthy: well under one)

# group, GPU field, pynvml function, names of its extra constant arguments, scale to base units
SCALARS: tuple[tuple[str, str, str, tuple[str, ...], float], ...] = (
    ("sm_clock", "sm_clock_hertz", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",), 1e6),
    ("memory_clock", "memory_clock_hertz", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_MEM",), 1e6),
    ("power", "power_watts", "nvmlDeviceGetPowerUsage", (), 1e-3),
    ("temperature", "temperature_celsius", "nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",), 1.0),
    ("pcie_rx", "pcie_rx_bytes_per_second", "nvmlDeviceGetPcieThroughput", ("NVML_PCIE_UTIL_RX_BYTES",), 1024.0),
    ("pcie_tx", "pcie_tx_bytes_per_second", "nvmlDeviceGetPcieThroughput", ("NVML_PCIE_UTIL_TX_BYTES",), 1024.0),
    ("ecc_corrected", "ecc_corrected_errors_total", "nvmlDeviceGetTotalEccErrors",
     ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"), 1.0),
    ("ecc_uncorrected", "ecc_uncorrected_errors_total", "nvmlDeviceGetTotalEccErrors",
     ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"), 1.0),
)

# Error codes that mean "this GPU or driver does not offer it": the field is omitted, not an error.
_UNSUPPORTED = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_NO_PERMISSION",
                "NVML_ERROR_INVALID_ARGUMENT")


def is_unsupported(nvml: Any, exc: Any) -> bool:
    """Whether an NVMLError means the GPU or driver does not offer the call."""
    return exc.value in {getattr(nvml, name) for name in _UNSUPPORTED}


def load_nvml(nvml: Any = None) -> Any:
    """Initialise NVML (``pynvml`` unless a stand-in is given); one-line CollectorError when it cannot start."""
    if nvml is None:
        import pynvml as nvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise CollectorError(
            f"nvml: NVIDIA driver not available ({exc}); NVML GPU metrics are off. Load the NVIDIA driver, "
            "or set gpu.backend to dcgm (with gpu.dcgm_url), sim or none") from exc
    return nvml


def nvml_status(nvml: Any = None) -> tuple[bool, str]:
    """For ``doctor``: is the driver loadable, and which GPUs does it see (or why not).  A GPU that cannot be
    opened (lost, unpowered) is named with its error after the others, as the daemon reads the others."""
    try:
        nv = load_nvml(nvml)
    except CollectorError as exc:
        return False, str(exc)
    try:
        try:
            driver, count = nv.nvmlSystemGetDriverVersion(), nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            return False, f"nvml: driver loaded but GPUs cannot be listed: {exc}"
        names: Counter[str] = Counter()
        failed = []
        for i in range(count):
            try:
                names[nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(i))] += 1
            except nv.NVMLError as exc:
                failed.append(f"GPU {i} cannot be opened: {exc}")
        gpus = ", ".join(f"{n} x {name}" for name, n in names.items()) or "no GPUs"
        return True, f"NVML driver {driver}: {count} GPU(s): {gpus}" + "".join(f"; {f}" for f in failed)
    finally:
        nv.nvmlShutdown()


def clock_event_reasons(nvml: Any, handle: Any) -> int:
    """The GPU's clock event (throttle) reasons bitmask; the older call on drivers before R535."""
    try:
        return nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    except nvml.NVMLError as exc:
        if exc.value != nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
    return nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)


def started(what: str, fn: Callable[[], T], timeout: float | None = None) -> T:
    """``fn()`` (NVML's start: init, the GPUs, the topology) in a daemon thread, waited for at most ``timeout``
    seconds (:data:`START_TIMEOUT`): a GPU off the bus can hang a driver call for minutes, and the daemon's start
    with it.  One-line CollectorError naming ``what`` then; the call is left to its thread."""
    call: Background[T] = Background(f"{what} start")
    call.start(fn)
    wait = START_TIMEOUT if timeout is None else timeout
    if not call.wait(wait):
        raise CollectorError(f"{what}: no answer from the NVIDIA driver within {wait:g} s at start (a GPU off the bus "
                             "or a hung driver: check `nvidia-smi` and the kernel log for Xid errors); off until a "
                             "restart")
    return call.take()

"""The latest GPU data of the store, and what /metrics says of GPU health, when a tick had no GPU frame."""

from sits_observe.config import parse
from sits_observe.export.fasttext import GpuText
from sits_observe.frame import BucketLayout, Frame, GpuFrame, GpuInfo
from sits_observe.store import SeriesStore

INFO = (GpuInfo(0, "GPU-a", "NVIDIA H100 80GB HBM3", "00000000:18:00.0"),
        GpuInfo(1, "GPU-b", "NVIDIA H100 80GB HBM3", "00000000:2A:00.0"))


def _tick(store: SeriesStore, ts: float, gpu: GpuFrame | None) -> None:
    frame = Frame(ts=ts, interval=1.0)
    frame.gpu = gpu
    store.ingest(frame)


def test_a_tick_without_gpu_data_says_nothing_of_gpu_health() -> None:
    store = SeriesStore(BucketLayout(parse({}, env={}).store.snapped()), history=8)
    text = GpuText(store)
    gpu = GpuFrame.empty(INFO)
    gpu.set(0, "utilization_ratio", 0.5)
    gpu.healthy[1] = False
    _tick(store, 1.0, gpu)
    assert list(store.gpu_latest().healthy) == [True, False]
    assert 'sits_gpu_healthy{gpu="0",' in text.render() and 'sits_gpu_healthy{gpu="1",' in text.render()
    _tick(store, 2.0, None)  # the GPU source is down (dcgm-exporter unreachable): unknown, not healthy
    assert store.gpu_latest() is None and text.render() == ""
    assert store.gpu_info() == INFO  # the GPUs are still known to the history windows
    _tick(store, 3.0, gpu)
    assert list(store.gpu_latest().healthy) == [True, False]

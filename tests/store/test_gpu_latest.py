"""The latest GPU data of the store, and what /metrics says of GPU health, when a tick had no GPU frame."""

import pytest

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


def test_a_gpu_missing_from_a_frame_keeps_its_row_and_every_gpu_its_history() -> None:
    """A dcgm-exporter page without the GPU that fell off the bus (GPUs 0, 1, 3): the rows had shifted (GPU 3's
    values under GPU 2) and every GPU's history had been wiped, the RCA windows and the UI's with it."""
    store = SeriesStore(BucketLayout(parse({}, env={}).store.snapped()), history=16)
    four = tuple(GpuInfo(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", f"00000000:{0x18 + i:02X}:00.0") for i in range(4))

    def tick(ts: float, gpus: tuple[GpuInfo, ...]) -> None:
        gpu = GpuFrame.empty(gpus)
        for k, g in enumerate(gpus):
            gpu.set(k, "utilization_ratio", g.index / 10 + ts / 100)
        _tick(store, ts, gpu)

    for ts in (1.0, 2.0):
        tick(ts, four)
    tick(3.0, (four[0], four[1], four[3]))
    assert store.gpu_info() == four
    util = store.gpu_window("utilization_ratio", 3)
    assert util[:, 3] == pytest.approx([0.31, 0.32, 0.33]) and util[:2, 2] == pytest.approx([0.21, 0.22])
    assert util[2, 2] != util[2, 2]  # NaN: not reported
    assert list(store.gpu_latest().healthy) == [True, True, False, True]
    assert 'sits_gpu_healthy{gpu="2",' in GpuText(store).render()  # said unhealthy, not silently gone
    tick(4.0, four)  # back
    assert store.gpu_window("utilization_ratio", 4)[-1, 2] == pytest.approx(0.24)
    assert list(store.gpu_latest().healthy) == [True] * 4


def test_a_renumbered_gpu_takes_its_history_along_and_rows_stay_bounded() -> None:
    """GPU 2 fell off and the exporter restarted: GPU-3 is listed as index 2.  Its row carries GPU-3's history,
    and GPU-2 (its index now another's) and the old index 3 (its UUID now elsewhere) are dropped; a source
    inventing ever-new indices keeps no more than MAX_GPU_ROWS rows."""
    from sits_observe.store.rings import MAX_GPU_ROWS

    store = SeriesStore(BucketLayout(parse({}, env={}).store.snapped()), history=8)
    four = tuple(GpuInfo(i, f"GPU-{i}", "H100", f"0:{i}") for i in range(4))

    def tick(ts: float, gpus: tuple[GpuInfo, ...], util: list[float]) -> None:
        gpu = GpuFrame.empty(gpus)
        for k, u in enumerate(util):
            gpu.set(k, "utilization_ratio", u)
        _tick(store, ts, gpu)

    tick(1.0, four, [0.0, 0.1, 0.2, 0.3])
    renumbered = (four[0], four[1], GpuInfo(2, "GPU-3", "H100", "0:3"))
    tick(2.0, renumbered, [0.0, 0.1, 0.33])
    assert store.gpu_info() == renumbered
    assert store.gpu_window("utilization_ratio", 2)[:, 2] == pytest.approx([0.3, 0.33])
    assert list(store.gpu_latest().healthy) == [True] * 3
    for i in range(MAX_GPU_ROWS + 10):
        tick(3.0 + i, (GpuInfo(1000 + i, "", "?", ""),), [0.5])
    assert len(store.gpu_info()) <= MAX_GPU_ROWS

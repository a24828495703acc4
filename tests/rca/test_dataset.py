"""The generic dataset format: round trip, gaps on a regular grid, window labels, clear errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from sits_observe.errors import ConfigError
from sits_observe.rca import dataset, writer
from sits_observe.rca.dataset import Dataset
from sits_observe.rca.steps import fill_forward


def test_round_trip_keeps_values_gaps_and_labels(tmp_path: Path, synth: Callable[..., Dataset]) -> None:
    ds = synth(steps=400)
    ent = ds.entities[0]
    ent.values[10, 1] = np.nan  # an empty cell
    ent.values[20] = np.nan  # a whole missing step
    writer.write(tmp_path, ds)
    back = dataset.read(tmp_path)
    assert back.features == ds.features and back.step == ds.step
    assert [e.name for e in back.entities] == [e.name for e in ds.entities]
    for a, b in zip(ds.entities, back.entities):
        assert a.t0 == b.t0
        np.testing.assert_allclose(b.values, a.values, rtol=1e-5)  # NaN compares equal here
    assert back.labels == ds.labels
    assert np.isnan(back.entities[0].values[20]).all() and np.isnan(back.entities[0].values[10, 1])


def test_two_writers_of_one_directory_do_not_share_temporary_files(tmp_path: Path,
                                                                   synth: Callable[..., Dataset]) -> None:
    """Both wrote NAME.tmp: the second dataset written into the directory (`rca dataset --force` twice at once) took
    the first's half-written metrics.csv.tmp, and the first's commit failed or mixed them."""
    first, second = synth(seed=1, steps=300), synth(seed=2, steps=300)
    with writer.Writer(tmp_path, first.features, first.step) as a, \
            writer.Writer(tmp_path, second.features, second.step) as b:
        for ent in first.entities:
            a.add(ent)
        for ent in second.entities:
            b.add(ent)
        b.commit(second.labels)
        a.commit(first.labels)  # the last to commit: the directory holds its set, whole
    back = dataset.read(tmp_path)
    assert back.labels == first.labels and sum(len(e.values) for e in back.entities) == 600
    np.testing.assert_allclose(back.entities[0].values, first.entities[0].values, rtol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["labels.csv", "metrics.csv"]


def test_missing_step_stays_at_its_time_and_does_not_shift_windows(tmp_path: Path) -> None:
    lines = ["timestamp,entity,a,b"]
    for t in range(100, 112):
        if t == 105:
            continue  # a step the exporter never wrote
        lines.append(f"{t}.02,x,{t},{'' if t == 107 else t * 2}")  # jittered timestamps, one empty cell
    (tmp_path / "metrics.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "labels.csv").write_text("entity,start,end,cause\nx,108,110,overheat\n")
    ds = dataset.read(tmp_path)
    grid = ds.entities[0].values
    assert ds.step == 1.0 and len(grid) == 12
    assert np.isnan(grid[5]).all() and grid[6, 0] == 106 and np.isnan(grid[7, 1])
    win = ds.windows(window=4)
    # no window ends on the missing step; every window's label is the cause at its own last step
    assert 105.02 not in win.times.round(2)
    labels = dict(zip(win.times.round(2), win.y))
    assert labels[107.02] == "healthy" and labels[108.02] == "overheat" and labels[110.02] == "healthy"
    assert ds.classes() == ["healthy", "overheat"]
    # the raw window keeps the gap as NaN; carrying forward fills it and marks it missing
    k = list(win.times.round(2)).index(107.02)
    filled, missing = fill_forward(win.batch(np.array([k])))
    assert filled[0, :, 0].tolist() == [104, 104, 106, 107] and missing[0, 1].all()
    assert filled[0, 3, 1] == 212 and missing[0, 3, 1]


@pytest.mark.parametrize("column,expect", [
    ([np.nan, 1.0, np.nan, np.nan, 4.0], [np.nan, 1.0, 1.0, 1.0, 4.0]),
    ([2.0, 3.0, 5.0], [2.0, 3.0, 5.0]),
    ([np.nan, np.nan], [np.nan, np.nan]),
])
def test_fill_forward(column: list[float], expect: list[float]) -> None:
    x = np.array(column, dtype=np.float32)[None, :, None]
    filled, missing = fill_forward(x)
    np.testing.assert_array_equal(filled[0, :, 0], np.array(expect, dtype=np.float32))
    assert missing[0, :, 0].tolist() == [bool(np.isnan(c)) for c in column]


def test_margin_leaves_out_transitions_and_mostly_missing_windows(synth: Callable[..., Dataset]) -> None:
    ds = synth(steps=600, entities=1)
    lab = ds.labels[0]
    near = ds.windows(window=8, margin=5)
    starts = near.times[(near.times >= lab.start) & (near.times < lab.start + 5)]
    assert starts.size == 0
    ds.entities[0].values[200:230] = np.nan
    win = ds.windows(window=8)
    assert not ((win.times >= 1200) & (win.times < 1230)).any()  # the gap's own steps end no window
    assert not ((win.times >= 1230) & (win.times < 1233)).any()  # over half the window missing


@pytest.mark.parametrize("metrics,labels,needle", [
    ("timestamp,entity,a\n1,x,1\n2,x,oops\n", "entity,start,end,cause\n",
     "line 3: column 'a': not a finite number, got 'oops'"),
    ("time,entity,a\n1,x,1\n", "entity,start,end,cause\n", "header must be timestamp,entity"),
    ("timestamp,entity,a\n1,x,1\n2,x,2\n", "entity,start,end,cause\nx,5,3,hot\n", "line 2: start must be before end"),
    ("timestamp,entity,a\n1,x,1\n2,x,2\n", "entity,start,cause\n", "missing column(s) end"),
    ("timestamp,entity,a\n1,x,1\n", "entity,start,end,cause\n", "at least two distinct timestamps"),
    # labels in milliseconds: every window scored healthy without a word
    ("timestamp,entity,a\n1,x,1\n2,x,2\n3,x,3\n", "entity,start,end,cause\nx,1000,2000,hot\n",
     "labels.csv: none of its 1 labels covers a step of metrics.csv (timestamps 1 to 3): give start and end in"),
    # one row replaced the other without a word (the other entity's row at that time is not a duplicate)
    ("timestamp,entity,a\n1,x,1\n2,x,2\n1,y,5\n2,y,6\n2,x,999\n3,x,3\n", "entity,start,end,cause\n",
     "metrics.csv: line 6: entity 'x' has timestamp 2.0 twice; keep one row per entity and timestamp"),
    ("timestamp,entity,a\n1,x,1\n2,x,inf\n", "entity,start,end,cause\n", "line 3: column 'a': not a finite number"),
    ("timestamp,entity,a\n1,x,1\n2,x,1e39\n", "entity,start,end,cause\n", "line 3: column 'a': not a finite number"),
    ("timestamp,entity,a\n1,x,1\ninf,x,2\n", "entity,start,end,cause\n", "line 3: column 'timestamp': not a finite"),
    ("timestamp,entity,a\n1,x,1\n2,x,2\n3,x,3\n50000000000,x,4\n", "entity,start,end,cause\n",
     "line 5: entity 'x': timestamp 50000000000.0 is"),
    ("timestamp,entity,a\n1,x,1\n2,x,2\n", "entity,start,end,cause\nx,1,2,unknown\n", "cause 'unknown' is reserved"),
    ("timestamp,entity,a\n1,x,1\n2,x,2\n", "entity,start,end,cause\nx,5.5,3,hot\n", "got 5.5..3.0; "),
    ("timestamp,entity,a,b,a\n1,x,1,2,3\n2,x,2,3,4\n", "entity,start,end,cause\n",
     "metrics.csv: line 1: column 'a' appears more than once"),
    ("timestamp,entity,a,b\n1,x,1,2\n2,x,2\n3,x,3,4\n", "entity,start,end,cause\n",
     "metrics.csv: line 3: 3 fields, expected 4"),
    ("timestamp,entity,a,b\n1,x,1,2\n2,x,2,3,4\n", "entity,start,end,cause\n", "metrics.csv: line 3: 5 fields"),
    ("timestamp,entity,a\n1,x,1\n2,,2\n", "entity,start,end,cause\n", "metrics.csv: line 3: entity is empty"),
    ("timestamp,entity,a\n1,x,1\n2,x,2\n", "entity,start,end,cause\n,1,2,hot\n", "labels.csv: line 2: entity is empty"),
    ("timestamp,entity,a\n1,x,1\n2,x,2\n", "entity,start,end,cause\nx,1,2,hot\nhost9,1,2,hot\n",
     "labels.csv: line 3: entity 'host9' is not in metrics.csv"),
])
def test_bad_files_name_file_line_and_value(tmp_path: Path, metrics: str, labels: str, needle: str) -> None:
    (tmp_path / "metrics.csv").write_text(metrics)
    (tmp_path / "labels.csv").write_text(labels)
    with pytest.raises(ConfigError) as err:
        dataset.read(tmp_path)
    assert needle in str(err.value) and str(tmp_path) in str(err.value)


def test_missing_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        dataset.read(tmp_path / "nowhere")
    (tmp_path / "metrics.csv").mkdir()
    with pytest.raises(ConfigError, match="metrics.csv: is a directory, not a CSV file"):
        dataset.read(tmp_path)


def test_after_fault_marks_the_healthy_windows_that_still_hold_an_ended_fault() -> None:
    values = np.ones((300, 1), np.float32)
    ds = Dataset(("a",), 1.0, [dataset.Entity("x", 0.0, values), dataset.Entity("y", 0.0, values.copy())],
                 [dataset.Label("x", 100.0, 150.0, "overheat")], "t")
    win = ds.windows(16)
    ends = win.ends  # x's rows are 0..299, y's 300..599
    after = ds.after_fault(win)
    # x: healthy windows ending at 150..164 hold steps 135..149 of the fault; the fault's own windows do not count
    assert (after == ((ends >= 150) & (ends <= 164))).all()
    assert not after[ends >= 300].any()  # y never had a fault; its first window does not reach into x

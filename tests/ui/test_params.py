"""Table-driven checks of the UI's query parameters: every bad value is a 400 naming the parameter."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from werkzeug.exceptions import BadRequest

from sits_observe.ui.params import fmt_gpus, fmt_range, parse_choice, parse_gpu, parse_query, parse_range

HOUR = 3600.0


@pytest.mark.parametrize(("raw", "seconds"), [
    (None, 900.0), ("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("1h", 3600.0), ("0.5h", 1800.0), (" 2m ", 120.0),
])
def test_range_accepts(raw: str | None, seconds: float) -> None:
    assert parse_range(raw, 900.0, HOUR) == seconds


@pytest.mark.parametrize(("raw", "says"), [
    ("abc", "expected a duration"), ("-5m", "expected a duration"), ("1e9", "expected a duration"),
    ("0", "more than 0"), ("0s", "more than 0"), ("2h", "keeps 1h of history"), ("99999999999999d", "keeps 1h"),
    ("inf", "expected a duration"), ("nan", "expected a duration"), ("1y", "expected a duration"), ("", "expected"),
    ("1" + "0" * 400 + "d", "keeps 1h of history"),  # too many digits for a float: it said "must be more than 0"
])
def test_range_refuses(raw: str, says: str) -> None:
    with pytest.raises(BadRequest) as e:
        parse_range(raw, 900.0, HOUR)
    assert says in e.value.description and e.value.description.startswith("range:")


@pytest.mark.parametrize(("raw", "gpus", "says"), [
    ("8", range(8), "no GPU 8 on this host; GPUs are 0-7"), ("-1", range(8), "expected a GPU index (0-7)"),
    ("x", range(8), "expected a GPU index"), ("1" * 40, range(8), "expected a GPU index"),
    ("0", [], "none: no GPU is known"), ("²", range(8), "expected a GPU index (0-7), got '²'"),
    ("１", range(8), "expected a GPU index"), ("2", [0, 1, 3], "no GPU 2 on this host; GPUs are 0, 1, 3"),
])
def test_gpu_refuses(raw: str, gpus: Sequence[int], says: str) -> None:
    with pytest.raises(BadRequest) as e:
        parse_gpu(raw, gpus)
    assert says in e.value.description


def test_gpu_and_choice_accept() -> None:
    assert parse_gpu("7", range(8)) == 7 and parse_gpu(None, range(8)) is None and parse_gpu("3", [0, 1, 3]) == 3
    assert parse_choice("field", None, {"a": 1}, "a") == "a" and parse_choice("field", "b", ["a", "b"], "a") == "b"
    with pytest.raises(BadRequest, match="field: unknown value 'c'; choose one of a, b"):
        parse_choice("field", "c", ["a", "b"], "a")
    with pytest.raises(BadRequest, match="field: expected a string, got dict"):
        parse_choice("field", {"a": 1}, ["a", "b"], "a")  # type: ignore[arg-type]
    assert [fmt_gpus(g) for g in (range(8), [0, 1, 3], [2], [0, 1], [])] == ["0-7", "0, 1, 3", "2", "0, 1",
                                                                          "none: no GPU is known"]


@pytest.mark.parametrize(("search", "says"), [
    ("?foo=1", "unknown parameter 'foo'; allowed: range"), ("?range=1m&range=2m", "given 2 times"),
    ("?" + "x" * 600, "at most 512 are accepted"), ("?range", "malformed query string"),
])
def test_query_refuses(search: str, says: str) -> None:
    with pytest.raises(BadRequest) as e:
        parse_query(search, ("range",), "/causes")
    assert says in e.value.description


def test_query_and_format() -> None:
    assert parse_query("?range=15m", ("range",), "/x") == {"range": "15m"}
    assert parse_query("", (), "/x") == {} and parse_query(None, (), "/x") == {}
    assert [fmt_range(s) for s in (3600, 5400, 45, 86400, 0.5)] == ["1h", "90m", "45s", "1d", "0.5s"]

"""Table-driven checks of the UI's query parameters: every bad value is a 400 naming the parameter."""

from __future__ import annotations

import pytest
from werkzeug.exceptions import BadRequest

from sits_observe.ui.params import fmt_range, parse_choice, parse_gpu, parse_query, parse_range

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
])
def test_range_refuses(raw: str, says: str) -> None:
    with pytest.raises(BadRequest) as e:
        parse_range(raw, 900.0, HOUR)
    assert says in e.value.description and e.value.description.startswith("range:")


@pytest.mark.parametrize(("raw", "n", "says"), [
    ("8", 8, "no GPU 8 on this host; GPUs are 0-7"), ("-1", 8, "expected a GPU index (0-7)"),
    ("x", 8, "expected a GPU index"), ("1" * 40, 8, "expected a GPU index"), ("0", 0, "no GPU topology"),
])
def test_gpu_refuses(raw: str, n: int, says: str) -> None:
    with pytest.raises(BadRequest) as e:
        parse_gpu(raw, n)
    assert says in e.value.description


def test_gpu_and_choice_accept() -> None:
    assert parse_gpu("7", 8) == 7 and parse_gpu(None, 8) is None
    assert parse_choice("field", None, {"a": 1}, "a") == "a" and parse_choice("field", "b", ["a", "b"], "a") == "b"
    with pytest.raises(BadRequest, match="field: unknown value 'c'; choose one of a, b"):
        parse_choice("field", "c", ["a", "b"], "a")


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

"""Fixtures for the SLO tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slo_helpers import SECRET

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "alerting"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))
from alert_receiver import Receiver  # noqa: E402


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A loopback webhook receiver that checks the signature with :data:`slo_helpers.SECRET`."""
    r = Receiver(secret=SECRET)
    yield r
    r.close()

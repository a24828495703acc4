"""Reading a CSV file strictly: every cell as text, and a clear error for what pandas would mend silently.

Errors are :class:`ConfigError` naming the file, the line and, where there is one, the column and value.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError

__all__ = ["numeric", "read_csv", "require"]

FLOAT32_MAX = float(np.finfo(np.float32).max)  # values are kept as float32


def numeric(df: pd.DataFrame, cols: Sequence[str], path: Path) -> np.ndarray:
    """Columns ``cols`` of ``df`` (read as text) as float64; an empty cell is NaN, anything else that is not
    a finite float32 raises ConfigError naming the line, the column and the value."""
    out = np.empty((len(df), len(cols)), dtype=np.float64)
    for j, col in enumerate(cols):
        conv = pd.to_numeric(df[col], errors="coerce")
        values = conv.to_numpy(dtype=np.float64, na_value=np.nan)
        bad = (conv.isna() & df[col].notna() & (df[col].astype(str).str.strip() != "")).to_numpy().copy()
        bad |= np.isinf(values) | (np.abs(np.nan_to_num(values)) > FLOAT32_MAX)  # inf, or beyond float32
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ConfigError(f"{path}: line {i + 2}: column {col!r}: not a finite number, got "
                              f"{str(df[col].iloc[i])[:40]!r}; leave the cell empty where there is no value")
        out[:, j] = values
    return out


def _check_shape(path: Path) -> None:
    """Refuse what pandas would quietly mend: a column named twice in the header (it renames the second
    ``a.1``) and a row with more or fewer fields than the header (a file cut mid-row, a lost separator)."""
    with path.open(newline="", encoding="utf-8") as f:
        rows = csv.reader(f)
        header = next(rows, [])
        twice = sorted({name for name in header if header.count(name) > 1})
        if twice:
            raise ConfigError(f"{path}: line 1: column {twice[0]!r} appears more than once in the header; "
                              "give each column its own name")
        for row in rows:
            if row and len(row) != len(header):
                raise ConfigError(f"{path}: line {rows.line_num}: {len(row)} fields, expected {len(header)} as in "
                                  "the header; a row cut short (a truncated file?) or a separator lost or added")


def read_csv(path: Path, hint: str) -> pd.DataFrame:
    """Every cell as text (empty = NaN); a missing, unreadable or misshapen file raises ConfigError (``hint``
    says what the file should be)."""
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a CSV file; {hint}")
    if not path.is_file():
        raise ConfigError(f"{path}: no such file; {hint}")
    try:
        _check_shape(path)
        return pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"{path}: not a readable CSV file: {exc}") from None


def require(column: pd.Series, path: Path, name: str, why: str) -> None:
    """Refuse an empty cell in ``column``, which every row needs (``why``)."""
    empty = (column.isna() | (column.astype(str).str.strip() == "")).to_numpy()
    if empty.any():
        raise ConfigError(f"{path}: line {int(np.flatnonzero(empty)[0]) + 2}: {name} is empty; {why}")

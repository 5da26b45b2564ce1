"""Reading the aggregate CSVs (:mod:`istar.report.aggregate`) for the tables and figures, with clear errors."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

__all__ = ["read_aggregate", "require_columns", "as_bool", "standin_columns"]


def read_aggregate(path, step: str = "istar aggregate") -> pd.DataFrame:
    """The CSV at ``path``, or ``FileNotFoundError`` naming ``step``, the command that writes it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: run `{step}` first (or pass its path)")
    return pd.read_csv(path)


def require_columns(df: pd.DataFrame, columns, source: str, hint: str = "was it written by `istar aggregate`?") -> None:
    """Raise ``ValueError`` naming the ``columns`` that ``df`` (read from ``source``) lacks, followed by ``hint``."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{source} lacks the column(s) {', '.join(missing)}; {hint}")


def as_bool(values: pd.Series) -> pd.Series:
    """A flag column of an aggregate CSV (``standin``, ``collapsed``) as booleans, whether the reader gave bools,
    0/1 or the strings True/False; an empty value is False."""
    return values.map(lambda v: str(v).strip().lower() in {"true", "1", "1.0", "yes"}).astype(bool)


def standin_columns(rows: pd.DataFrame, tasks: list[str]) -> list[bool]:
    """Per task of ``tasks``, whether any of ``rows`` trained or was evaluated on a stand-in split (``standin``)."""
    flags = as_bool(rows["standin"]).groupby(rows["task"]).any()
    return [bool(flags.get(task, False)) for task in tasks]

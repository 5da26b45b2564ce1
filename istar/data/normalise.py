"""The normalised form of a split: its Arrow schema, dtypes, and the checks every split passes.

Whatever the source (:mod:`istar.data.mirror` or :mod:`istar.data.hub`), a split ends as a
``pandas.DataFrame`` with the columns of :mod:`istar.registry.tasks` and the dtypes of
:func:`split_schema`, checked by :func:`normalise_split` (docs/method.md §6).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from istar.registry.tasks import Task

__all__ = ["STSB_MAX_SCORE", "split_schema", "table_to_frame", "answer_problem", "normalise_split"]

logger = logging.getLogger(__name__)

STSB_MAX_SCORE = 5.0

# The official QQP train split has two pairs with an empty question2 (idx 310137 and 362246
# on the hub); for this task rows with an empty text are dropped and counted in meta.json.
# Every other task treats an empty text as malformed data.
_DROP_EMPTY_TEXT = frozenset({"qqp"})


def split_schema(task: Task) -> pa.Schema:
    """The Arrow schema of a normalised split (also fixes the pandas dtypes)."""
    if task.kind == "qa":
        return pa.schema([*((name, pa.string()) for name in ("id", "title", "context", "question")),
                          ("answer_texts", pa.list_(pa.string())), ("answer_starts", pa.list_(pa.int64()))])
    label_type = pa.float32() if task.kind == "regression" else pa.int64()
    return pa.schema([("idx", pa.int64()), ("text_a", pa.string()), ("text_b", pa.string()), ("label", label_type)])


def table_to_frame(table: pa.Table) -> pd.DataFrame:
    """Arrow table to DataFrame, with list columns as Python lists (not numpy arrays)."""
    frame = table.to_pandas()
    for field in table.schema:
        if pa.types.is_list(field.type):
            frame[field.name] = pd.Series(table.column(field.name).to_pylist(), dtype=object)
    return frame


def _refuse_first(bad: np.ndarray, locate: Callable[[int], str], problem: Callable[[int], str]) -> None:
    """A ValueError naming the first row where the bool mask ``bad`` is set: where it came from and its problem."""
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{locate(first)}: {problem(first)}")


def answer_problem(context: str, texts: Sequence[str], starts: Sequence[int]) -> str | None:
    """Why a question's answers cannot be used, or None when every answer sits at its offset.

    The one check of SQuAD answers: :func:`normalise_split` applies it to every split it loads, so a
    prepared split's answers all pass it (:func:`istar.data.qa.prepare_train_features` relies on that).
    ``texts`` and ``starts`` are the ``answer_texts`` and ``answer_starts`` of one row: parallel, at
    least one answer, each a non-empty text found at its character offset ``start`` of ``context``.
    """
    if len(texts) == 0 or len(texts) != len(starts):
        return f"expected one or more answers with one start each, found {len(texts)} texts and {len(starts)} starts"
    for text, start in zip(texts, starts):
        if isinstance(start, bool) or not isinstance(start, (int, np.integer)):
            return f"answer {text!r} has a start {start!r} that is not a character offset"
        found = context[start : start + len(text)]
        if not text or start < 0 or found != text:
            return f"answer {text!r} is not at answer_start {start} of its context (found {found!r})"
    return None


def normalise_split(frame: pd.DataFrame, task: Task, locate: Callable[[int], str]) -> tuple[pd.DataFrame, list[str]]:
    """Check a parsed split, drop empty-text rows where the task allows it, and cast it to the task's schema.

    Parameters
    ----------
    frame : the split, with the task's columns.
    task : the task (sets the label range and the text columns).
    locate : row position -> where the row came from (``"FILE, line N"``), for messages.

    Returns
    -------
    frame : the split without the dropped rows, index reset, in the dtypes of :func:`split_schema`
        (those :func:`istar.data.read_split` returns).
    dropped : the locations of the dropped rows (empty for every task but QQP).

    Raises ValueError naming the row for a label out of range, an empty text, or (SQuAD) a
    duplicate id, a question without answers or an answer not at its offset (as
    :func:`answer_problem` requires).
    """
    if task.kind == "qa":
        ids = frame["id"]
        _refuse_first(ids.duplicated().to_numpy(), locate, lambda i: f"duplicate question id {ids.iloc[i]!r}")
        problems = [answer_problem(*answers) for answers in zip(frame["context"], frame["answer_texts"],
                                                                 frame["answer_starts"])]
        _refuse_first(np.array([problem is not None for problem in problems], dtype=bool), locate, problems.__getitem__)
        text_columns = ["context", "question"]
    else:
        if task.kind == "classification":
            labels = frame["label"].to_numpy()
            bad = (labels < 0) | (labels >= task.num_labels)
            expected = f"a class in 0..{task.num_labels - 1}"
        else:
            labels = frame["label"].to_numpy(dtype=np.float64)
            bad = ~np.isfinite(labels) | (labels < 0) | (labels > STSB_MAX_SCORE)
            expected = f"a score in [0, {STSB_MAX_SCORE:g}]"
        _refuse_first(bad, locate, lambda i: f"label {labels[i].item()!r} is not {expected}")
        text_columns = ["text_a", "text_b"] if task.paired else ["text_a"]
    empty = np.any([(frame[column].isna() | (frame[column].astype(str).str.strip() == "")).to_numpy()
                    for column in text_columns], axis=0)
    if task.key not in _DROP_EMPTY_TEXT:
        _refuse_first(empty, locate, lambda i: f"empty text (in {' or '.join(text_columns)})")
    dropped = [locate(int(i)) for i in np.flatnonzero(empty)]
    if dropped:
        logger.warning("%s: dropping %d row(s) with an empty text: %s", task.display, len(dropped), "; ".join(dropped))
        frame = frame.loc[~empty].reset_index(drop=True)
    return table_to_frame(pa.Table.from_pandas(frame, schema=split_schema(task), preserve_index=False)), dropped

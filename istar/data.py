"""Benchmark data: load each task from the Hugging Face hub or an offline mirror, normalise it.

Every task of :mod:`istar.tasks` is turned into two ``pandas.DataFrame`` splits, ``train`` and
``validation`` (GLUE's dev set, the evaluation split), with the columns of the
:mod:`istar.tasks` docstring:

- classification / regression: ``idx`` (int64, the row's position in its source split),
  ``text_a`` (str), ``text_b`` (str, null for single-sentence tasks), ``label`` (int64 class,
  or float32 score in [0, 5] for STS-B);
- qa (SQuAD v1.1): ``id``, ``title``, ``context``, ``question`` (str), ``answer_texts``
  (list of str), ``answer_starts`` (list of int64 character offsets into ``context``).

Sources
-------
``hub``
    The ``datasets`` library: ``nyu-mll/glue`` (configs sst2, qnli, rte, mrpc, qqp, cola,
    stsb), ``SetFit/sst5`` and ``rajpurkar/squad``. Needs internet.
``mirror``
    A folder holding the public releases (see ``../shared/data/README.md``)::

        glue/{CoLA,SST-2,MRPC,RTE,STS-B,QNLI,QQP}/{train,dev}.tsv
        sst5/{train,dev}.txt                      Penn-treebank trees, root label 0-4
        squad/{train,dev}-v1.1.json

    TSV files are read with quoting disabled (GLUE sentences contain quote characters).
``auto``
    The mirror when its folder exists, otherwise the hub. The mirror folder is the
    ``mirror`` argument, else the ``ISTAR_DATA_MIRROR`` environment variable, else
    ``../shared/data`` relative to the current directory.

A split missing from the mirror raises :class:`MissingSplitError`. With ``allow_standin`` the
available split is divided, with a seed, into a stand-in train part and a stand-in validation
part (SQuAD by article, so no context is in both); :func:`prepare_task` flags this in
``meta.json``. Results on a stand-in are not comparable with published scores.

:func:`prepare_task` writes ``train.parquet``, ``validation.parquet`` and ``meta.json`` to a
folder (each file atomically, ``meta.json`` last); :func:`read_split` and :func:`read_meta`
read them back. ``python -m istar.data --task rte --out resources/data/rte`` does the same
from the command line (the ``istar prepare-data`` subcommand).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import logging
import os
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from . import __version__, artifacts
from .tasks import SPLITS, TASKS, Task, get_task

__all__ = [
    "SOURCES",
    "MissingSplitError",
    "HubUnavailableError",
    "load_task",
    "prepare_task",
    "read_split",
    "read_meta",
    "missing_mirror_files",
    "add_cli_arguments",
    "run_cli",
]

logger = logging.getLogger(__name__)

SOURCES = ("auto", "hub", "mirror")
"""Accepted values of ``source``."""

MIRROR_ENV = "ISTAR_DATA_MIRROR"
DEFAULT_MIRROR = Path("..") / "shared" / "data"

STSB_MAX_SCORE = 5.0


class MissingSplitError(ValueError):
    """A split of a task is not in the mirror (and no stand-in was allowed or possible)."""


class HubUnavailableError(RuntimeError):
    """The Hugging Face hub could not provide a dataset (offline, or ``datasets`` missing)."""


# ------------------------------------------------------------------ source layouts


@dataclass(frozen=True)
class _TsvLayout:
    """Where a GLUE task's columns are in its release TSV files.

    folder : path of the task's folder inside the mirror, e.g. ``"glue/RTE"``.
    header : the expected header row, or None when the files have none (CoLA).
    n_fields : number of tab-separated fields per row.
    text_a, text_b, label : field positions (``text_b`` None for single-sentence tasks).
    label_names : string labels in class order (``label_names[k]`` is class k), or None for
        numeric labels.
    """

    folder: str
    header: tuple[str, ...] | None
    n_fields: int
    text_a: int
    text_b: int | None
    label: int
    label_names: tuple[str, ...] | None = None


_NLI_LABELS = ("entailment", "not_entailment")  # the hub's GLUE: entailment = 0

_GLUE_TSV: dict[str, _TsvLayout] = {
    "cola": _TsvLayout("glue/CoLA", None, 4, 3, None, 1),
    "sst2": _TsvLayout("glue/SST-2", ("sentence", "label"), 2, 0, None, 1),
    "mrpc": _TsvLayout(
        "glue/MRPC", ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"), 5, 3, 4, 0
    ),
    "rte": _TsvLayout("glue/RTE", ("index", "sentence1", "sentence2", "label"), 4, 1, 2, 3,
                      _NLI_LABELS),
    "qnli": _TsvLayout("glue/QNLI", ("index", "question", "sentence", "label"), 4, 1, 2, 3,
                       _NLI_LABELS),
    "qqp": _TsvLayout(
        "glue/QQP", ("id", "qid1", "qid2", "question1", "question2", "is_duplicate"), 6, 3, 4, 5
    ),
    "stsb": _TsvLayout(
        "glue/STS-B",
        ("index", "genre", "filename", "year", "old_index", "source1", "source2",
         "sentence1", "sentence2", "score"),
        10, 7, 8, 9,
    ),
}

# Hub id, config, and the text columns of the classification / regression datasets.
_HUB: dict[str, tuple[str, str | None]] = {
    **{key: ("nyu-mll/glue", key) for key in _GLUE_TSV},
    "sst5": ("SetFit/sst5", None),
    "squad": ("rajpurkar/squad", None),
}
_HUB_TEXT_COLUMNS: dict[str, tuple[str, str | None]] = {
    "cola": ("sentence", None),
    "sst2": ("sentence", None),
    "mrpc": ("sentence1", "sentence2"),
    "rte": ("sentence1", "sentence2"),
    "qnli": ("question", "sentence"),
    "qqp": ("question1", "question2"),
    "stsb": ("sentence1", "sentence2"),
    "sst5": ("text", None),
}

# The official QQP train split has two pairs with an empty question2 (idx 310137 and 362246
# on the hub); for this task rows with an empty text are dropped and counted in meta.json.
# Every other task treats an empty text as malformed data.
_DROP_EMPTY_TEXT = frozenset({"qqp"})


def _mirror_file(task: str, split: str) -> str:
    """The release file of ``task``'s ``split``, relative to the mirror root (posix)."""
    stem = "train" if split == "train" else "dev"
    if task in _GLUE_TSV:
        return f"{_GLUE_TSV[task].folder}/{stem}.tsv"
    if task == "sst5":
        return f"sst5/{stem}.txt"
    if task == "squad":
        return f"squad/{stem}-v1.1.json"
    raise ValueError(f"no mirror layout for task {task!r}")


def missing_mirror_files(task: str, mirror: str | Path) -> list[Path]:
    """The release files of ``task`` (train and validation) that are not in the mirror folder."""
    root = Path(mirror)
    return [root / _mirror_file(get_task(task).key, split) for split in SPLITS
            if not (root / _mirror_file(task, split)).is_file()]


def _schema(task: Task) -> pa.Schema:
    """The Arrow schema of a normalised split (also fixes the pandas dtypes)."""
    if task.kind == "qa":
        return pa.schema([
            ("id", pa.string()),
            ("title", pa.string()),
            ("context", pa.string()),
            ("question", pa.string()),
            ("answer_texts", pa.list_(pa.string())),
            ("answer_starts", pa.list_(pa.int64())),
        ])
    label_type = pa.float32() if task.kind == "regression" else pa.int64()
    return pa.schema([
        ("idx", pa.int64()),
        ("text_a", pa.string()),
        ("text_b", pa.string()),
        ("label", label_type),
    ])


def _table_to_frame(table: pa.Table) -> pd.DataFrame:
    """Arrow table to DataFrame, with list columns as Python lists (not numpy arrays)."""
    frame = table.to_pandas()
    for field in table.schema:
        if pa.types.is_list(field.type):
            frame[field.name] = pd.Series(table.column(field.name).to_pylist(), dtype=object)
    return frame


def _conform(frame: pd.DataFrame, task: Task) -> pd.DataFrame:
    """Cast a split to the task's schema, so it has the dtypes :func:`read_split` returns."""
    table = pa.Table.from_pandas(frame, schema=_schema(task), preserve_index=False)
    return _table_to_frame(table)


# ------------------------------------------------------------------ mirror parsers


def _read_glue_tsv(path: Path, layout: _TsvLayout, task: Task) -> tuple[pd.DataFrame, list[int]]:
    """Parse a GLUE release TSV file.

    Returns the split (columns ``idx``, ``text_a``, ``text_b``, ``label``) and, per row, its
    line number in the file. Raises ValueError naming the file and line for a wrong header,
    a wrong number of fields or an unreadable label.
    """
    label_index = {name: k for k, name in enumerate(layout.label_names or ())}
    texts_a, texts_b, labels, lines = [], [], [], []
    with open(path, encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        header_pending = layout.header is not None
        for row in reader:
            if not row:
                continue
            where = f"{path}, line {reader.line_num}"
            if header_pending:
                if tuple(row) != layout.header:
                    raise ValueError(
                        f"{where}: expected the header {list(layout.header)}, found {row}"
                    )
                header_pending = False
                continue
            if len(row) != layout.n_fields:
                raise ValueError(
                    f"{where}: expected {layout.n_fields} tab-separated fields, found "
                    f"{len(row)}: {row!r:.300}"
                )
            raw = row[layout.label]
            try:
                if layout.label_names is not None:
                    label = label_index[raw]
                elif task.kind == "regression":
                    label = float(raw)
                else:
                    label = int(raw)
            except (KeyError, ValueError):
                expected = (
                    f"one of {list(layout.label_names)}" if layout.label_names
                    else "a number" if task.kind == "regression" else "an integer class"
                )
                raise ValueError(f"{where}: label {raw!r} is not {expected}") from None
            texts_a.append(row[layout.text_a])
            texts_b.append(None if layout.text_b is None else row[layout.text_b])
            labels.append(label)
            lines.append(reader.line_num)
    if header_pending:
        raise ValueError(f"{path}: the file is empty (expected the header {list(layout.header)})")
    frame = pd.DataFrame({
        "idx": np.arange(len(labels), dtype=np.int64),
        "text_a": texts_a,
        "text_b": texts_b,
        "label": labels,
    })
    return frame, lines


_TREE_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def _parse_tree(line: str) -> tuple[int, str]:
    """Root label and sentence of one Penn-treebank tree such as ``(3 (2 It) (4 works))``.

    The sentence is the tree's leaves joined by single spaces. Raises ValueError (without a
    location) when the tree is malformed.
    """
    tokens = _TREE_TOKEN.findall(line)
    if not tokens or tokens[0] != "(":
        raise ValueError("a tree must start with '('")
    depth, expect_label, root, leaves = 0, False, None, []
    for position, token in enumerate(tokens):
        if token == "(":
            if expect_label:
                raise ValueError("'(' where a node label was expected")
            depth += 1
            expect_label = True
        elif token == ")":
            if expect_label:
                raise ValueError("')' where a node label was expected")
            depth -= 1
            if depth == 0 and position != len(tokens) - 1:
                raise ValueError("text after the end of the tree")
        elif expect_label:
            if not token.isdigit():
                raise ValueError(f"node label {token!r} is not a number")
            if root is None:
                root = int(token)
            expect_label = False
        else:
            leaves.append(token)
    if depth != 0:
        raise ValueError("unbalanced parentheses")
    if not leaves:
        raise ValueError("the tree has no words")
    return root, " ".join(leaves)


def _read_sst5(path: Path) -> tuple[pd.DataFrame, list[int]]:
    """Parse an SST-5 tree file (one tree a line); rows and their line numbers."""
    texts, labels, lines = [], [], []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                label, text = _parse_tree(line)
            except ValueError as exc:
                raise ValueError(f"{path}, line {number}: malformed tree: {exc}") from None
            texts.append(text)
            labels.append(label)
            lines.append(number)
    frame = pd.DataFrame({
        "idx": np.arange(len(labels), dtype=np.int64),
        "text_a": texts,
        "text_b": [None] * len(labels),
        "label": labels,
    })
    return frame, lines


def _read_squad_json(path: Path) -> pd.DataFrame:
    """Parse a SQuAD v1.1 json file into one row per question."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid json ({exc})") from None
    rows, where = [], "the top level"
    try:
        for a, article in enumerate(document["data"]):
            where = f"data[{a}]"
            for p, paragraph in enumerate(article["paragraphs"]):
                where = f"data[{a}].paragraphs[{p}]"
                for q, qa in enumerate(paragraph["qas"]):
                    where = f"data[{a}].paragraphs[{p}].qas[{q}]"
                    rows.append({
                        "id": qa["id"],
                        "title": article["title"],
                        "context": paragraph["context"],
                        "question": qa["question"],
                        "answer_texts": [answer["text"] for answer in qa["answers"]],
                        "answer_starts": [answer["answer_start"] for answer in qa["answers"]],
                    })
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(
            f"{path}: not in the SQuAD v1.1 layout at {where} (missing or wrong field: {exc!r})"
        ) from None
    return pd.DataFrame(rows, columns=list(_schema(TASKS["squad"]).names))


# ------------------------------------------------------------------ validation


def _check_split(
    frame: pd.DataFrame, task: Task, locate: Callable[[int], str]
) -> tuple[pd.DataFrame, list[str]]:
    """Check a normalised split; drop empty-text rows where the task allows it.

    Parameters
    ----------
    frame : the split, with the task's columns.
    task : the task (sets the label range and the text columns).
    locate : row position -> where the row came from (``"FILE, line N"``), for messages.

    Returns
    -------
    frame : the split, without the dropped rows, index reset.
    dropped : the locations of the dropped rows (empty for every task but QQP).

    Raises ValueError naming the row for a label out of range, an empty text, or (SQuAD) a
    duplicate id, a question without answers or an answer not at its offset.
    """
    if task.kind == "qa":
        _check_answers(frame, locate)
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
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{locate(first)}: label {labels[first].item()!r} is not {expected}")
        text_columns = ["text_a", "text_b"] if task.paired else ["text_a"]
    empty = np.zeros(len(frame), dtype=bool)
    for column in text_columns:
        values = frame[column]
        empty |= (values.isna() | (values.astype(str).str.strip() == "")).to_numpy()
    if not empty.any():
        return frame, []
    if task.key not in _DROP_EMPTY_TEXT:
        first = int(np.flatnonzero(empty)[0])
        raise ValueError(f"{locate(first)}: empty text (in {' or '.join(text_columns)})")
    dropped = [locate(int(i)) for i in np.flatnonzero(empty)]
    logger.warning("%s: dropping %d row(s) with an empty text: %s",
                   task.display, len(dropped), "; ".join(dropped))
    return frame.loc[~empty].reset_index(drop=True), dropped


def _check_answers(frame: pd.DataFrame, locate: Callable[[int], str]) -> None:
    """SQuAD: unique ids, at least one answer, each answer found at its offset."""
    duplicated = frame["id"].duplicated().to_numpy()
    if duplicated.any():
        first = int(np.flatnonzero(duplicated)[0])
        raise ValueError(f"{locate(first)}: duplicate question id {frame['id'].iloc[first]!r}")
    rows = zip(frame["context"], frame["answer_texts"], frame["answer_starts"])
    for i, (context, texts, starts) in enumerate(rows):
        if len(texts) == 0 or len(texts) != len(starts):
            raise ValueError(
                f"{locate(i)}: expected one or more answers with one start each, found "
                f"{len(texts)} texts and {len(starts)} starts"
            )
        for text, start in zip(texts, starts):
            if not isinstance(start, (int, np.integer)) or context[start:start + len(text)] != text:
                raise ValueError(
                    f"{locate(i)}: answer {text!r} is not at character {start} of its context"
                )


# ------------------------------------------------------------------ loading


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_mirror_split(task: Task, path: Path) -> tuple[pd.DataFrame, list[str]]:
    """Read, normalise and check one mirror file; the split and its dropped rows."""
    logger.info("reading %s", path)
    if task.kind == "qa":
        frame = _read_squad_json(path)
        ids = frame["id"].tolist()
        locate = lambda i: f"{path}, question id {ids[i]}"  # noqa: E731
    else:
        if task.key == "sst5":
            frame, lines = _read_sst5(path)
        else:
            frame, lines = _read_glue_tsv(path, _GLUE_TSV[task.key], task)
        locate = lambda i: f"{path}, line {lines[i]}"  # noqa: E731
    frame, dropped = _check_split(frame, task, locate)
    return _conform(frame, task), dropped


def _missing_split_message(task: Task, root: Path, missing: list[str], available: str | None,
                           standin_fraction: float, seed: int) -> str:
    """The text of :class:`MissingSplitError`: what is missing, where, and the options."""
    paths = " and ".join(str(root / _mirror_file(task.key, split)) for split in missing)
    head = (
        f"{task.display}: the {' and '.join(missing)} split"
        f"{'s are' if len(missing) > 1 else ' is'} not in the mirror; expected {paths} (the "
        f"public release's file name and layout)."
    )
    hub = (f"use the Hugging Face hub on a machine with internet (`--source hub`; dataset "
           f"{_HUB[task.key][0]})")
    if available is None:
        return (f"{head} A stand-in needs at least one of the splits, so none is possible. "
                f"Options: put the release files there; or {hub}.")
    standin = (
        f"opt into a stand-in with `--allow-standin` (allow_standin=True): the {available} "
        f"file {root / _mirror_file(task.key, available)} is split with seed {seed} into a "
        f"stand-in train part ({1 - standin_fraction:.0%}) and a stand-in validation part "
        f"({standin_fraction:.0%})"
        + (", by article title so no context is in both" if task.kind == "qa" else "")
        + "; meta.json then says \"standin\": true, and scores are not comparable with "
        "published ones"
    )
    return f"{head} Options: put the release file there; or {hub}; or {standin}."


def _standin_split(frame: pd.DataFrame, task: Task, fraction: float,
                   seed: int) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """Split one split into a stand-in train part and a stand-in validation part.

    About ``fraction`` of the rows go to the validation part: chosen at random (seeded)
    for classification and regression; for SQuAD whole articles (``title``) are drawn in a
    seeded random order until the part holds ``fraction`` of the questions. Both parts keep
    the original row order. Returns (train part, validation part, a sentence describing it).
    """
    rng = np.random.default_rng((seed, 0))
    if task.kind == "qa":
        titles = frame["title"].unique()
        if len(titles) < 2:
            raise ValueError(f"{task.display}: a stand-in split by title needs two or more "
                             f"articles, found {len(titles)}")
        sizes = frame["title"].value_counts()
        held, chosen = 0, []
        for title in titles[rng.permutation(len(titles))][:-1]:
            if held >= fraction * len(frame):
                break
            chosen.append(title)
            held += int(sizes[title])
        in_validation = frame["title"].isin(chosen).to_numpy()
        how = (f"whole articles drawn at random by title: {len(titles) - len(chosen)} for "
               f"train, {len(chosen)} for validation, so no context is in both")
    else:
        if len(frame) < 2:
            raise ValueError(f"{task.display}: a stand-in split needs two or more rows, "
                             f"found {len(frame)}")
        n_validation = min(max(1, round(fraction * len(frame))), len(frame) - 1)
        in_validation = np.zeros(len(frame), dtype=bool)
        in_validation[rng.choice(len(frame), size=n_validation, replace=False)] = True
        how = "rows drawn at random"
    train = frame.loc[~in_validation].reset_index(drop=True)
    validation = frame.loc[in_validation].reset_index(drop=True)
    return train, validation, how


def _resolve_mirror(mirror: str | Path | None) -> tuple[Path, str]:
    """The mirror folder and where that choice came from (for messages)."""
    if mirror is not None:
        return Path(mirror), "the mirror argument"
    if os.environ.get(MIRROR_ENV):
        return Path(os.environ[MIRROR_ENV]), f"${MIRROR_ENV}"
    return DEFAULT_MIRROR, f"the default, relative to {Path.cwd()}"


def _load_mirror(task: Task, root: Path, allow_standin: bool, standin_fraction: float,
                 seed: int) -> tuple[dict[str, pd.DataFrame], dict]:
    root = root.resolve()
    paths = {split: root / _mirror_file(task.key, split) for split in SPLITS}
    missing = [split for split in SPLITS if not paths[split].is_file()]
    available = next((split for split in SPLITS if split not in missing), None)
    provenance = {
        "source": "mirror",
        "mirror": str(root),
        "hub_id": None,
        "hub_config": None,
        "files": {},
        "standin": False,
        "standin_note": None,
        "dropped_rows": {},
    }
    if missing and (available is None or not allow_standin):
        raise MissingSplitError(
            _missing_split_message(task, root, missing, available, standin_fraction, seed)
        )
    splits = {}
    for split in SPLITS:
        if split in missing:
            continue
        splits[split], dropped = _read_mirror_split(task, paths[split])
        provenance["files"][_mirror_file(task.key, split)] = _sha256(paths[split])
        provenance["dropped_rows"][split] = dropped
    if missing:
        source_rows = len(splits[available])
        train, validation, how = _standin_split(splits[available], task, standin_fraction, seed)
        splits = {"train": train, "validation": validation}
        provenance["standin"] = True
        provenance["standin_note"] = (
            f"STAND-IN: {paths[missing[0]]} is missing from the mirror, so the {available} "
            f"file {_mirror_file(task.key, available)} ({source_rows:,} rows) was split with "
            f"seed {seed} (validation fraction {standin_fraction:g}, {how}) into a stand-in "
            f"train part of {len(train):,} rows and a stand-in validation part of "
            f"{len(validation):,} rows. No row is in both. Scores on this split are not "
            f"comparable with published {task.display} results."
        )
    return splits, provenance


def _load_hub(task: Task) -> tuple[dict[str, pd.DataFrame], dict]:
    hub_id, config = _HUB[task.key]
    name = hub_id if config is None else f"{hub_id} ({config})"
    advice = (f"Without internet, use source 'mirror' with a path: `istar prepare-data --task "
              f"{task.key} --source mirror --mirror ../shared/data` (a folder in the GLUE "
              f"release layout; see istar.data).")
    try:
        import datasets
    except ImportError as exc:
        raise HubUnavailableError(
            f"source 'hub' needs the `datasets` package ({exc}). {advice}"
        ) from exc
    logger.info("loading %s from the Hugging Face hub", name)
    try:
        loaded = datasets.load_dataset(hub_id, config)
    except Exception as exc:  # offline, unknown dataset, auth: the advice is the same
        raise HubUnavailableError(
            f"could not load {name} from the Hugging Face hub: {type(exc).__name__}: {exc}. "
            f"{advice}"
        ) from exc
    splits, dropped_rows = {}, {}
    for split in SPLITS:
        if split not in loaded:
            raise ValueError(f"{name} on the hub has no {split!r} split "
                             f"(it has {list(loaded)})")
        columns = loaded[split].to_dict()
        n_rows = loaded[split].num_rows
        if task.kind == "qa":
            frame = pd.DataFrame({
                "id": columns["id"],
                "title": columns["title"],
                "context": columns["context"],
                "question": columns["question"],
                "answer_texts": [list(a["text"]) for a in columns["answers"]],
                "answer_starts": [list(a["answer_start"]) for a in columns["answers"]],
            })
        else:
            text_a, text_b = _HUB_TEXT_COLUMNS[task.key]
            frame = pd.DataFrame({
                "idx": columns.get("idx", range(n_rows)),
                "text_a": columns[text_a],
                "text_b": columns[text_b] if text_b else [None] * n_rows,
                "label": columns["label"],
            })
        frame, dropped_rows[split] = _check_split(
            frame, task, lambda i, split=split: f"{name} split {split}, row {i}"
        )
        splits[split] = _conform(frame, task)
    provenance = {
        "source": "hub",
        "mirror": None,
        "hub_id": hub_id,
        "hub_config": config,
        "files": {},
        "standin": False,
        "standin_note": None,
        "dropped_rows": dropped_rows,
    }
    return splits, provenance


def load_task(
    task: str,
    source: str = "auto",
    mirror: str | Path | None = None,
    allow_standin: bool = False,
    standin_fraction: float = 0.2,
    seed: int = 0,
) -> tuple[dict[str, pd.DataFrame], dict]:
    """Load a task's train and validation splits, normalised.

    Parameters
    ----------
    task : str
        Task key of :data:`istar.tasks.TASKS` (``"rte"``, ``"sst2"``, ``"squad"``, ...).
    source : {"auto", "hub", "mirror"}, default="auto"
        Where to read from; ``"auto"`` uses the mirror when its folder exists, else the hub.
    mirror : str or Path, optional
        The mirror folder; default ``$ISTAR_DATA_MIRROR``, else ``../shared/data``.
    allow_standin : bool, default=False
        When one split is missing from the mirror, split the other one into a stand-in
        train part and a stand-in validation part instead of raising.
    standin_fraction : float in (0, 1), default=0.2
        Share of the available split that becomes the stand-in validation part.
    seed : int >= 0, default=0
        Seed of the stand-in split.

    Returns
    -------
    splits : dict
        ``{"train": DataFrame, "validation": DataFrame}``, columns as in :mod:`istar.tasks`:
        ``idx, text_a, text_b, label`` (n_rows rows), or for SQuAD ``id, title, context,
        question, answer_texts, answer_starts`` (one row per question).
    provenance : dict
        ``source`` ("mirror" or "hub"), ``mirror`` (absolute path or None), ``hub_id`` and
        ``hub_config`` (or None), ``files`` (mirror file -> sha256), ``standin`` (bool),
        ``standin_note`` (str or None), ``dropped_rows`` (split read -> locations of rows
        dropped for an empty text; QQP only), ``source_requested`` (the ``source`` argument).

    Raises
    ------
    MissingSplitError
        A split is missing from the mirror and no stand-in was allowed or possible.
    HubUnavailableError
        The hub could not be reached (the message suggests the mirror).
    FileNotFoundError
        ``source="mirror"`` and the mirror folder does not exist.
    ValueError
        Unknown task or source, bad arguments, or malformed data (naming file and line).
    """
    spec = get_task(task)
    if source not in SOURCES:
        raise ValueError(f"unknown data source {source!r}; use one of: {', '.join(SOURCES)}")
    if not 0 < standin_fraction < 1:
        raise ValueError(f"standin_fraction must be in (0, 1), got {standin_fraction!r}")
    _check_count("seed", seed, minimum=0)
    root, origin = _resolve_mirror(mirror)
    if source == "mirror" and not root.is_dir():
        raise FileNotFoundError(
            f"mirror folder {root.absolute()} does not exist (from {origin}). Pass --mirror "
            f"(or set ${MIRROR_ENV}) to a folder in the GLUE release layout, or use "
            f"--source hub on a machine with internet."
        )
    if source == "hub" or (source == "auto" and not root.is_dir()):
        splits, provenance = _load_hub(spec)
    else:
        splits, provenance = _load_mirror(spec, root, allow_standin, standin_fraction, seed)
    provenance["source_requested"] = source
    return splits, provenance


# ------------------------------------------------------------------ prepared folders


def _check_count(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _subsample(frame: pd.DataFrame, max_samples: int | None, seed: int,
               stream: int) -> pd.DataFrame:
    """At most ``max_samples`` rows drawn without replacement (seeded), in their order."""
    if max_samples is None or max_samples >= len(frame):
        return frame
    rng = np.random.default_rng((seed, stream))
    keep = np.sort(rng.choice(len(frame), size=max_samples, replace=False))
    return frame.iloc[keep].reset_index(drop=True)


def _label_summary(frame: pd.DataFrame, task: Task) -> dict:
    """Label counts (classification), score range (regression) or article count (qa)."""
    if task.kind == "classification":
        counts = np.bincount(frame["label"].to_numpy(), minlength=task.num_labels)
        return {"counts": {str(k): int(n) for k, n in enumerate(counts)}}
    if task.kind == "regression":
        scores = frame["label"].to_numpy(dtype=np.float64)
        if len(scores) == 0:
            return {"min": None, "max": None, "mean": None}
        return {"min": float(scores.min()), "max": float(scores.max()),
                "mean": round(float(scores.mean()), 6)}
    return {"articles": int(frame["title"].nunique())}


def prepare_task(
    task: str,
    out_dir: str | Path,
    source: str = "auto",
    mirror: str | Path | None = None,
    allow_standin: bool = False,
    max_train_samples: int | None = None,
    max_eval_samples: int | None = None,
    seed: int = 0,
    standin_fraction: float = 0.2,
) -> dict:
    """Load a task, subsample it and write ``train.parquet``, ``validation.parquet``, ``meta.json``.

    Parameters
    ----------
    task, source, mirror, allow_standin, standin_fraction, seed
        As in :func:`load_task`; ``seed`` also drives the subsampling.
    out_dir : str or Path
        Folder to write to (created if needed). A ``meta.json`` already there is removed
        first and written last, so its presence means the folder is complete.
    max_train_samples, max_eval_samples : int >= 1, optional
        Keep at most this many train / validation rows (SQuAD: questions), drawn at random
        without replacement with ``seed`` and kept in their original order. None keeps all.

    Returns
    -------
    meta : dict
        What ``meta.json`` holds: ``task``, ``source``, ``source_requested``, ``mirror``,
        ``hub_id``, ``hub_config``, ``files`` (mirror file -> sha256), ``standin``,
        ``standin_note``, ``standin_fraction`` (None unless a stand-in), ``dropped_rows``,
        ``rows_before_subsampling`` and ``rows`` (split -> count), ``sha256`` (parquet file ->
        sha256, checked by :func:`read_split`), ``max_train_samples``,
        ``max_eval_samples``, ``seed``, ``labels`` (split -> label counts, score range or,
        for SQuAD, article count), ``created`` (UTC, ISO 8601), ``istar_version``.
    """
    spec = get_task(task)
    for name, value in (("max_train_samples", max_train_samples),
                        ("max_eval_samples", max_eval_samples)):
        if value is not None:
            _check_count(name, value, minimum=1)
    splits, provenance = load_task(task, source=source, mirror=mirror,
                                   allow_standin=allow_standin,
                                   standin_fraction=standin_fraction, seed=seed)
    caps = {"train": max_train_samples, "validation": max_eval_samples}
    kept = {split: _subsample(splits[split], caps[split], seed, stream)
            for stream, split in enumerate(SPLITS, start=1)}
    meta = {
        "task": spec.key,
        **provenance,
        "standin_fraction": standin_fraction if provenance["standin"] else None,
        "rows_before_subsampling": {split: len(splits[split]) for split in SPLITS},
        "rows": {split: len(kept[split]) for split in SPLITS},
        "max_train_samples": max_train_samples,
        "max_eval_samples": max_eval_samples,
        "seed": seed,
        "labels": {split: _label_summary(kept[split], spec) for split in SPLITS},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "istar_version": __version__,
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").unlink(missing_ok=True)
    schema = _schema(spec)
    for split in SPLITS:
        table = pa.Table.from_pandas(kept[split], schema=schema, preserve_index=False)
        with artifacts.atomic_path(out / f"{split}.parquet") as tmp, open(tmp, "wb") as handle:
            pq.write_table(table, handle)
    meta["sha256"] = {f"{split}.parquet": artifacts.file_digest(out / f"{split}.parquet") for split in SPLITS}
    text = json.dumps(meta, indent=2) + "\n"
    artifacts.write_text(out / "meta.json", text)
    return meta


def _prepare_hint(data_dir: Path) -> str:
    task = data_dir.name if data_dir.name in TASKS else "TASK"
    return f"run `istar prepare-data --task {task} --out {data_dir}` first"


def read_split(data_dir: str | Path, split: str) -> pd.DataFrame:
    """Read a split written by :func:`prepare_task`.

    Parameters
    ----------
    data_dir : str or Path
        The folder given to :func:`prepare_task` as ``out_dir``.
    split : {"train", "validation"}

    Returns
    -------
    frame : DataFrame
        The normalised columns (see :mod:`istar.tasks`); SQuAD's ``answer_texts`` and
        ``answer_starts`` hold Python lists.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of: {', '.join(SPLITS)}")
    path = Path(data_dir) / f"{split}.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: {_prepare_hint(Path(data_dir))}")
    if (path.parent / "meta.json").is_file():
        artifacts.verify_file(path, read_meta(data_dir).get("sha256", {}).get(path.name))
    return _table_to_frame(pq.read_table(path))


def read_meta(data_dir: str | Path) -> dict:
    """The ``meta.json`` written by :func:`prepare_task` (see its Returns for the keys)."""
    path = Path(data_dir) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: {_prepare_hint(Path(data_dir))}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid json ({exc}); "
                         f"{_prepare_hint(Path(data_dir)).replace(' first', ' again')}") from None


# ------------------------------------------------------------------ command line


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``prepare-data`` options (``--task``, ``--out``, ...) to ``parser``."""
    parser.add_argument("--task", required=True, choices=list(TASKS), help="task key")
    parser.add_argument("--out", required=True, type=Path,
                        help="folder for train.parquet, validation.parquet and meta.json")
    parser.add_argument("--source", choices=SOURCES, default="auto",
                        help="hub (needs internet), mirror (a local folder in the GLUE "
                             "release layout) or auto (the mirror if its folder exists, else "
                             "the hub); default: auto")
    parser.add_argument("--mirror", type=Path, default=None,
                        help=f"mirror folder (default: ${MIRROR_ENV}, else {DEFAULT_MIRROR})")
    parser.add_argument("--allow-standin", action="store_true",
                        help="if a split is missing from the mirror, split the other one into "
                             "a stand-in train and validation pair (flagged in meta.json; "
                             "scores are then not comparable with published ones)")
    parser.add_argument("--standin-fraction", type=float, default=0.2,
                        help="share of the available split that becomes the stand-in "
                             "validation part (default: 0.2)")
    parser.add_argument("--max-train-samples", type=int, default=None,
                        help="keep at most N train rows, drawn with --seed (default: all)")
    parser.add_argument("--max-eval-samples", type=int, default=None,
                        help="keep at most N validation rows, drawn with --seed (default: all)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the subsampling and the stand-in split (default: 0)")


def run_cli(args: argparse.Namespace) -> int:
    """Run ``prepare-data`` with parsed arguments; print a line per split. Returns the exit code."""
    try:
        meta = prepare_task(
            args.task, args.out, source=args.source, mirror=args.mirror,
            allow_standin=args.allow_standin, max_train_samples=args.max_train_samples,
            max_eval_samples=args.max_eval_samples, seed=args.seed,
            standin_fraction=args.standin_fraction,
        )
    except (ValueError, OSError, HubUnavailableError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    origin = meta["mirror"] if meta["source"] == "mirror" else (
        meta["hub_id"] + (f" ({meta['hub_config']})" if meta["hub_config"] else "")
    )
    standin = " STAND-IN" if meta["standin"] else ""
    for split in SPLITS:
        print(f"{meta['task']} {split}{standin}: {meta['rows'][split]:,} rows (of "
              f"{meta['rows_before_subsampling'][split]:,}) -> {Path(args.out) / split}.parquet")
    print(f"source: {meta['source']} {origin}")
    if meta["standin"]:
        print(meta["standin_note"])
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(
        prog="python -m istar.data",
        description="Prepare a task's data: normalised train and validation parquet files "
                    "and meta.json.",
    )
    add_cli_arguments(_parser)
    sys.exit(run_cli(_parser.parse_args()))

"""Parsers of the public release files a mirror holds: GLUE TSV, SST-5 trees, SQuAD v1.1 json.

Each parser returns the rows in the normalised columns of :mod:`istar.registry.tasks` (not yet checked or
cast: :mod:`istar.data.normalise` does that) and each row's place in the file (``line N``, or SQuAD's
``question id ID``), so that every error names file and place. TSV files are read with quoting disabled
(GLUE sentences contain quote characters).
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from istar.data.normalise import split_schema
from istar.io.text import read_utf8
from istar.registry.tasks import TASKS, Task

__all__ = ["GLUE_TSV", "read_glue_tsv", "parse_tree", "read_sst5", "read_squad_json"]


@dataclass(frozen=True)
class TsvLayout:
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

GLUE_TSV: dict[str, TsvLayout] = {
    "cola": TsvLayout("glue/CoLA", None, 4, 3, None, 1),
    "sst2": TsvLayout("glue/SST-2", ("sentence", "label"), 2, 0, None, 1),
    "mrpc": TsvLayout("glue/MRPC", ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"), 5, 3, 4, 0),
    "rte": TsvLayout("glue/RTE", ("index", "sentence1", "sentence2", "label"), 4, 1, 2, 3, _NLI_LABELS),
    "qnli": TsvLayout("glue/QNLI", ("index", "question", "sentence", "label"), 4, 1, 2, 3, _NLI_LABELS),
    "qqp": TsvLayout("glue/QQP", ("id", "qid1", "qid2", "question1", "question2", "is_duplicate"), 6, 3, 4, 5),
    "stsb": TsvLayout("glue/STS-B", ("index", "genre", "filename", "year", "old_index", "source1", "source2",
                                     "sentence1", "sentence2", "score"), 10, 7, 8, 9),
}


def read_glue_tsv(path: Path, task: Task) -> tuple[pd.DataFrame, list[str]]:
    """Parse a GLUE release TSV file of ``task`` (its :data:`GLUE_TSV` layout).

    Returns the split (columns ``idx``, ``text_a``, ``text_b``, ``label``) and, per row, its
    place in the file (``line N``). Raises ValueError naming the file and line for a wrong header,
    a wrong number of fields or an unreadable label, and the column too for a byte that is not UTF-8.
    """
    layout = GLUE_TSV[task.key]
    label_index = {name: k for k, name in enumerate(layout.label_names or ())}
    parse_label = label_index.__getitem__ if layout.label_names else float if task.kind == "regression" else int
    with io.StringIO(read_utf8(path, skip_bom=True), newline="") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        numbered = [(reader.line_num, row) for row in reader if row]  # line_num: the row's last line
    if layout.header is not None:
        if not numbered:
            raise ValueError(f"{path}: the file is empty (expected the header {list(layout.header)})")
        line, header = numbered.pop(0)
        if tuple(header) != layout.header:
            raise ValueError(f"{path}, line {line}: expected the header {list(layout.header)}, found {header}")
    labels = []
    for line, row in numbered:
        if len(row) != layout.n_fields:
            raise ValueError(f"{path}, line {line}: expected {layout.n_fields} tab-separated fields, found "
                             f"{len(row)}: {row!r:.300}")
        try:
            labels.append(parse_label(row[layout.label]))
        except (KeyError, ValueError):
            expected = (f"one of {list(layout.label_names)}" if layout.label_names
                        else "a number" if task.kind == "regression" else "an integer class")
            raise ValueError(f"{path}, line {line}: label {row[layout.label]!r} is not {expected}") from None
    rows = [row for _, row in numbered]
    texts_b = [None if layout.text_b is None else row[layout.text_b] for row in rows]
    return _sentence_frame([row[layout.text_a] for row in rows], texts_b, labels), [f"line {n}" for n, _ in numbered]


def _sentence_frame(texts_a: list, texts_b: list, labels: list) -> pd.DataFrame:
    """Parsed rows in the normalised columns of classification and regression tasks, ``idx`` their position."""
    return pd.DataFrame({"idx": np.arange(len(labels), dtype=np.int64), "text_a": texts_a, "text_b": texts_b,
                         "label": labels})


_TREE_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def parse_tree(line: str) -> tuple[int, str]:
    """Root label and sentence of one Penn-treebank tree such as ``(3 (2 It) (4 works))``.

    The sentence is the tree's leaves joined by single spaces. Raises ValueError (without a
    location) when the tree is malformed.
    """
    tokens = _TREE_TOKEN.findall(line)
    if not tokens or tokens[0] != "(":
        raise ValueError("a tree must start with '('")
    depth, leaves = 0, []
    for position, token in enumerate(tokens):
        if position and tokens[position - 1] == "(":  # a node's label
            if not token.isdigit():
                raise ValueError(f"{token!r} where a node label (a number) was expected")
        elif token in ("(", ")"):
            depth += 1 if token == "(" else -1
            if depth == 0 and position != len(tokens) - 1:
                raise ValueError("text after the end of the tree")
        else:
            leaves.append(token)
    if depth != 0:
        raise ValueError("unbalanced parentheses")
    if not leaves:
        raise ValueError("the tree has no words")
    return int(tokens[1]), " ".join(leaves)


def read_sst5(path: Path) -> tuple[pd.DataFrame, list[str]]:
    """Parse an SST-5 tree file (one tree a line); rows and their places (``line N``)."""
    texts, labels, places = [], [], []
    with io.StringIO(read_utf8(path), newline=None) as handle:  # universal newlines, as open() reads
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                label, text = parse_tree(line)
            except ValueError as exc:
                raise ValueError(f"{path}, line {number}: malformed tree: {exc}") from None
            texts.append(text)
            labels.append(label)
            places.append(f"line {number}")
    return _sentence_frame(texts, [None] * len(texts), labels), places


def read_squad_json(path: Path) -> tuple[pd.DataFrame, list[str]]:
    """Parse a SQuAD v1.1 json file into one row per question; rows and their places (``question id ID``)."""
    try:
        document = json.loads(read_utf8(path))
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
                    answers = qa["answers"]  # a row in the columns' order of split_schema
                    rows.append((qa["id"], article["title"], paragraph["context"], qa["question"],
                                 [answer["text"] for answer in answers],
                                 [answer["answer_start"] for answer in answers]))
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"{path}: not in the SQuAD v1.1 layout at {where} (missing or wrong field: {exc!r})") from None
    places = [f"question id {row[0]}" for row in rows]
    return pd.DataFrame(rows, columns=list(split_schema(TASKS["squad"]).names)), places

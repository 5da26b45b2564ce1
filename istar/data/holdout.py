"""The held-out selection split: a prepared task's training rows cut in two, ``istar holdout-data``.

Under ``search.selection_split: heldout`` the search must not be scored on the validation split
that Table 1 reports. This step cuts the prepared training split (``DATA/train.parquet``) into

- ``OUT/train.parquet``: the rows the search trains on (and takes Σ_S from), and
- ``OUT/validation.parquet``: the held-out rows that score it,

so that every search step reads ``OUT`` exactly as it would read a prepared task folder. Each
part keeps the rows' original order.

**Groups, not rows.** A row-by-row cut leaks: GLUE's SST-2 training rows are the phrases of the
parse trees of about 6,900 sentences, so most phrases drawn at random lie inside rows the search
trains on; pair tasks (MRPC, QQP, QNLI, RTE, STS-B) reuse one sentence in several pairs; SQuAD's
questions share their article's paragraphs. So the cut draws whole *groups*, decided by the
task's ``heldout_grouping`` (:mod:`istar.registry.tasks`, :data:`GROUPINGS`):

- ``source_sentence`` (SST-2): a row's groups are the *maximal* rows that contain it as a
  whole-token span (a maximal row is one contained in no other row: in SST-2, the sentences);
  a maximal row contains itself;
- ``shared_sentence`` (pair tasks): the connected components of the graph whose nodes are the
  sentence texts and whose edges are the pairs, so no sentence is on both sides;
- ``identical_text`` (CoLA, SST-5): rows with the same text;
- ``article`` (SQuAD): the article (``title``).

Texts are compared as whitespace-separated tokens (``" a  b "`` is ``a b``). A seeded
``fraction`` of the groups is held out, rounded, at least one and at most all but one, drawn
without replacement from ``numpy.random.default_rng((seed, 3))`` over the groups in the order
of their first row. A row all of whose groups are held out is held out; a row none of whose
groups is held out is a search-training row; a row with groups on both sides (a short phrase
common to a held-out and a kept sentence: "the film") goes to neither side and is counted as
*dropped*. Only ``source_sentence`` gives a row several groups, so only it drops rows.

By construction no held-out row is a whole-token span of a search-training row (for SST-2: if
it were, every sentence containing the training row would contain it too, and those are kept),
and under ``shared_sentence`` no sentence is on both sides. :func:`heldout_overlap` measures it
on the written parts and ``meta.json`` records the measurement.

``OUT/meta.json`` is the source folder's, with ``rows`` and ``labels`` of the two parts and a
``heldout`` record: ``{"of", "of_train_sha256", "fraction", "seed", "grouping", "unit",
"held_out", "units", "rows": {"held_out", "search_train", "dropped"}, "overlap"}``
(``held_out`` of ``units`` groups, each a ``unit``: sentence, component, text or article;
``overlap`` as :func:`heldout_overlap` returns it). Training steps copy ``meta.json`` into
``run_config.json``, which is how :func:`istar.report.select.select_best` knows the protocol.
The final runs keep training on ``DATA``, the full training split.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from istar.data.storage import read_meta, read_split, write_prepared
from istar.registry.tasks import Task, get_task

__all__ = ["HOLDOUT_STREAM", "MIN_OVERLAP_WORDS", "Grouping", "GROUPINGS", "Membership", "heldout_overlap",
           "holdout_split", "run_cli"]

HOLDOUT_STREAM = 3
"""The random stream of the held-out draw (prepare-data's subsampling uses 1 and 2 with the data seed)."""

MIN_OVERLAP_WORDS = 5
"""Held-out rows shorter than this are left out of the overlap measure: a phrase of a word or two
("the film") occurs everywhere and says nothing about a shared source sentence."""


# ------------------------------------------------------------------------------ whole-token spans


_HASH_SEED = 20240507
"""Fixes the random token codes and bases of the span keys (any fixed value: keys are compared
within one call only)."""


class _Spans:
    """Texts as token sequences, with a 128-bit key for any contiguous span of any of them.

    The key of tokens t_0 … t_{k−1} is, in each of two independent streams, Σ_j r(t_j)·B^{−j}
    modulo 2^64, r a random 64-bit code per distinct token and B a random odd base: it depends on
    the tokens alone, not on where the span sits, and is computed for every span of a given
    length at once from prefix sums. Two different spans share a key with probability about
    2^−128 per pair, so equal keys are taken as equal spans.
    """

    def __init__(self, texts: Sequence[str]):
        words = [text.split() for text in texts]
        self.lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        self.starts = np.cumsum(self.lengths) - self.lengths
        vocabulary: dict[str, int] = {}
        ids = np.fromiter((vocabulary.setdefault(w, len(vocabulary)) for row in words for w in row),
                          dtype=np.int64, count=int(self.lengths.sum()))
        rng = np.random.default_rng(_HASH_SEED)
        self._prefix, self._powers = [], []
        for _ in range(2):
            codes = rng.integers(1, 2**63, size=max(len(vocabulary), 1), dtype=np.uint64)
            base = int(rng.integers(2**32, 2**63)) | 1
            inverse = _powers(pow(base, -1, 2**64), len(ids))  # B^−i
            prefix = np.zeros(len(ids) + 1, dtype=np.uint64)
            np.cumsum(codes[ids] * inverse[:-1], out=prefix[1:])
            self._prefix.append(prefix)
            self._powers.append(_powers(base, len(ids)))

    def keys(self, positions: np.ndarray, lengths) -> np.ndarray:
        """Keys (void 16 bytes) of the spans starting at flat token ``positions`` with ``lengths``."""
        halves = [(prefix[positions + lengths] - prefix[positions]) * powers[positions]
                  for prefix, powers in zip(self._prefix, self._powers)]
        return np.ascontiguousarray(np.stack(halves, axis=1)).view("V16").ravel()

    def full_keys(self, texts: np.ndarray) -> np.ndarray:
        """Keys of the whole texts of indices ``texts``."""
        return self.keys(self.starts[texts], self.lengths[texts])

    def containing(self, queries: np.ndarray, hosts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every (query, host) pair of text indices, as two arrays, where the query text is a whole-token span
        of the host text (a pair may repeat). A text repeated in ``queries`` is paired under one of its indices."""
        pairs = [(np.empty(0, np.int64), np.empty(0, np.int64))]
        for length in np.unique(self.lengths[queries]):
            these = queries[self.lengths[queries] == length]
            order = np.argsort(keys := self.full_keys(these))
            owners = hosts[self.lengths[hosts] >= length]
            counts = self.lengths[owners] - length + 1
            owners = np.repeat(owners, counts)  # every span of this length of every host that long, at offset
            offsets = np.arange(len(owners)) - np.repeat(np.cumsum(counts) - counts, counts)  # 0 … count − 1
            span_keys = self.keys(self.starts[owners] + offsets, length)
            where = np.minimum(np.searchsorted(keys[order], span_keys), len(these) - 1)
            hit = keys[order][where] == span_keys
            pairs.append((these[order][where[hit]], owners[hit]))
        return tuple(np.concatenate(part) for part in zip(*pairs))


def _powers(base: int, n: int) -> np.ndarray:
    """base^0, base^1, …, base^n modulo 2^64 (uint64 products wrap)."""
    return np.cumprod(np.concatenate([np.ones(1, np.uint64), np.full(n, base, dtype=np.uint64)]))


def _normalised(texts) -> list[str]:
    return [" ".join(str(text).split()) for text in texts]


def _first_appearance_codes(values) -> tuple[np.ndarray, list]:
    """Integer codes of ``values`` numbered in the order of their first appearance, and the distinct values
    in that order."""
    import pandas as pd

    codes, uniques = pd.factorize(pd.Series(list(values), dtype=object), sort=False)
    return codes.astype(np.int64), list(uniques)


# ------------------------------------------------------------------------------------ groupings


@dataclass(frozen=True)
class Membership:
    """Which groups each row belongs to: the pairs (``rows[i]``, ``groups[i]``), every row at least
    once; ``count`` groups, numbered in the order of their first row."""

    rows: np.ndarray
    groups: np.ndarray
    count: int


def _group_by_value(values) -> Membership:
    """Each row in one group: the rows of one value (groups numbered by first appearance)."""
    codes, distinct = _first_appearance_codes(values)
    return Membership(rows=np.arange(len(codes)), groups=codes, count=len(distinct))


def _source_sentences(frame) -> Membership:
    """``source_sentence``: each row in every maximal row that contains it as a whole-token span."""
    import pandas as pd

    codes, unique_texts = _first_appearance_codes(_normalised(frame["text_a"]))
    spans = _Spans(unique_texts)
    everything = np.arange(len(unique_texts))
    text, host = spans.containing(everything, everything)
    # A text is maximal when it is inside no other text (the texts are distinct, so an other text that holds it
    # is longer; containment is transitive, so a text inside a longer one is inside a maximal one). Each text's
    # groups are the maximal texts that hold it, a group numbered by its position in ``maximal``: first-appearance
    # order, as the codes.
    maximal = np.setdiff1d(everything, text[text != host])
    in_maximal = np.isin(host, maximal)
    pairs = pd.DataFrame({"text": text[in_maximal], "group": np.searchsorted(maximal, host[in_maximal])})
    pairs = pairs.drop_duplicates()
    # to rows: each row takes the groups of its text
    rows = pd.DataFrame({"text": codes, "row": np.arange(len(codes))}).merge(pairs, on="text")
    return Membership(rows=rows["row"].to_numpy(), groups=rows["group"].to_numpy(), count=len(maximal))


def _shared_sentences(frame) -> Membership:
    """``shared_sentence``: rows joined by any sentence they share, transitively (connected components)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    first, second = _normalised(frame["text_a"]), _normalised(frame["text_b"])
    codes, sentences = _first_appearance_codes(first + second)
    a, b = codes[:len(first)], codes[len(first):]
    graph = coo_matrix((np.ones(len(a)), (a, b)), shape=(len(sentences), len(sentences)))
    _, component = connected_components(graph, directed=False)
    return _group_by_value(component[a])


@dataclass(frozen=True)
class Grouping:
    """How a task's training rows are grouped for the held-out cut.

    key : the name a task's ``heldout_grouping`` gives.
    unit : what one group is, in words (``meta.json``'s ``heldout.unit`` and the CLI's line).
    members : the training frame → its :class:`Membership`.
    """

    key: str
    unit: str
    members: Callable[[object], Membership]


GROUPINGS: dict[str, Grouping] = {g.key: g for g in (
    Grouping("source_sentence", "sentence", _source_sentences),
    Grouping("shared_sentence", "component", _shared_sentences),
    Grouping("identical_text", "text", lambda frame: _group_by_value(_normalised(frame["text_a"]))),
    Grouping("article", "article", lambda frame: _group_by_value(frame["title"])),
)}


# -------------------------------------------------------------------------------------- overlap


def heldout_overlap(train, heldout, task: Task) -> dict:
    """What the held-out rows share with the rows the search trains on.

    - single-sentence tasks: of the held-out rows of at least :data:`MIN_OVERLAP_WORDS` whitespace tokens,
      how many occur verbatim, as a whole-token span, inside some training row;
    - sentence pairs: of the distinct sentences of the held-out pairs, how many are a sentence of
      some training pair;
    - SQuAD: of the distinct held-out paragraphs, how many are a training question's paragraph.

    Returns ``{"measure": what was counted, "checked": n, "found": k, "share": k / n (None when n = 0)}``.
    """
    if task.paired:  # sentence pairs, and SQuAD's (question, paragraph) pairs by their paragraph
        columns = ["context"] if task.kind == "qa" else ["text_a", "text_b"]
        seen = {text for column in columns for text in _normalised(train[column])}
        checked = sorted({text for column in columns for text in _normalised(heldout[column])})
        found = sum(text in seen for text in checked)
        measure = ("held-out paragraphs that are a training question's paragraph" if task.kind == "qa"
                   else "held-out sentences that are a sentence of a training pair")
    else:
        training = _normalised(train["text_a"])
        checked = [text for text in _normalised(heldout["text_a"]) if len(text.split()) >= MIN_OVERLAP_WORDS]
        spans, queries = _Spans(training + checked), np.arange(len(training), len(training) + len(checked))
        inside = spans.containing(queries, hosts=np.arange(len(training)))[0]
        found = int(np.isin(spans.full_keys(queries), spans.full_keys(inside)).sum())  # every copy of a text found
        measure = f"held-out rows of {MIN_OVERLAP_WORDS} or more words found inside a training row"
    return {"measure": measure, "checked": len(checked), "found": int(found),
            "share": found / len(checked) if checked else None}


# ------------------------------------------------------------------------------------------ cut


def holdout_split(data_dir, out_dir, fraction: float, seed: int) -> dict:
    """Cut ``data_dir``'s training split into the search's training part and its held-out part.

    Parameters
    ----------
    data_dir : a folder written by :func:`istar.data.prepare_task`.
    out_dir : the folder to write (``train.parquet``, ``validation.parquet``, ``meta.json``).
    fraction : share of the groups held out (see the module docstring), in (0, 0.5] (the schema's
        ``search.heldout_fraction`` bounds it; the command line checks it there).
    seed : integer >= 0, the draw's seed.

    Returns
    -------
    The ``meta.json`` written (see the module docstring).
    """
    parent = read_meta(data_dir)
    task = get_task(parent["task"])
    grouping = GROUPINGS[task.heldout_grouping]
    train = read_split(data_dir, "train")
    members = grouping.members(train)
    if members.count < 2:
        raise ValueError(f"{data_dir}/train.parquet has {members.count} {grouping.unit}(s) ({grouping.key}): a held-out "
                         "split needs at least two; raise data.max_train_samples or use search.selection_split: validation")
    count = min(max(1, round(fraction * members.count)), members.count - 1)
    rng = np.random.default_rng((seed, HOLDOUT_STREAM))
    chosen = np.isin(np.arange(members.count), rng.choice(members.count, size=count, replace=False))
    held_groups = np.bincount(members.rows, weights=chosen[members.groups], minlength=len(train))
    held, kept = held_groups == np.bincount(members.rows, minlength=len(train)), held_groups == 0
    # Neither part is empty: every group has a row that belongs to it alone (for source_sentence, its maximal
    # row), and at least one group is held out and one kept.
    parts = {"train": train[kept].reset_index(drop=True), "validation": train[held].reset_index(drop=True)}
    meta = {
        **parent,  # its own rows, labels, hashes, time and version replace the parent's (write_prepared)
        "heldout": {"of": str(data_dir), "of_train_sha256": parent.get("split_sha256", {}).get("train.parquet"),
                    "fraction": fraction, "seed": seed, "grouping": grouping.key, "unit": grouping.unit,
                    "held_out": count, "units": members.count,
                    "rows": {"held_out": int(held.sum()), "search_train": int(kept.sum()),
                             "dropped": int(len(train) - held.sum() - kept.sum())},
                    "overlap": heldout_overlap(parts["train"], parts["validation"], task)},
    }
    return write_prepared(out_dir, task, parts, meta)


def run_cli(args: argparse.Namespace) -> int:
    from istar.config.specs import spec_from_cli

    spec = spec_from_cli(args)
    meta = holdout_split(spec.data_dir, spec.out, spec.fraction, spec.seed)
    heldout = meta["heldout"]
    rows, overlap = heldout["rows"], heldout["overlap"]
    print(f"{meta['task']}: {rows['held_out']:,} of {rows['held_out'] + rows['search_train'] + rows['dropped']:,} "
          f"training rows held out ({heldout['held_out']} of {heldout['units']} {heldout['unit']}s, seed "
          f"{heldout['seed']}), {rows['search_train']:,} left to the search, {rows['dropped']:,} dropped (on both "
          f"sides) -> {Path(spec.out)}")
    share = "n/a" if overlap["share"] is None else f"{overlap['share']:.1%}"
    print(f"overlap: {overlap['found']:,} of {overlap['checked']:,} {overlap['measure']} ({share})")
    return 0

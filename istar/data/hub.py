"""Tasks from the Hugging Face hub through the ``datasets`` library, at a pinned commit.

The datasets and their columns are those of the hub repos (``nyu-mll/glue`` configs sst2, qnli,
rte, mrpc, qqp, cola, stsb; ``SetFit/sst5``; ``rajpurkar/squad``): GLUE's ``label`` is a class
label (RTE/QNLI: entailment = 0), STS-B's a float score, SST-5's an int 0-4, SQuAD's answers a
struct of lists ``answers.text`` / ``answers.answer_start``. SST-5 can also come from
``stanfordnlp/sst`` (``data.hub_datasets.sst5``), the dataset the authors loaded (as ``sst``):
its ``label`` is each sentence's sentiment in [0, 1], cut into the five classes at 0.2, 0.4,
0.6 and 0.8, an edge belonging to the class below it, as the authors' ``np.digitize(label,
[0.2, 0.4, 0.6, 0.8], right=True)`` does (I-STAR/training_utils.py, classification_preprocess),
on the values as the hub stores them (float32). The requested revision (a branch,
tag or commit; default ``main``) is resolved to its commit first (:mod:`istar.io.revisions`), the
data are loaded at that commit, and the commit goes into the provenance (``meta.json``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from istar.data.normalise import normalise_split
from istar.io.revisions import RevisionUnavailableError, resolve_revision
from istar.registry import lookup
from istar.registry.tasks import SPLITS, Task

__all__ = ["HubDataset", "HUB_SOURCES", "HubUnavailableError", "hub_source", "load_hub"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HubDataset:
    """A hub dataset a task can be read from.

    hub_id, config : the repo and its config (None: the repo's only one).
    text : the columns of ``text_a`` and ``text_b`` (``text_b`` None for single-sentence tasks; unused for QA).
    bins : where a float label is cut into classes (an edge belongs to the class below it);
        None: the labels are the task's as they are.
    """

    hub_id: str
    config: str | None
    text: tuple[str, str | None] = ("", None)
    bins: tuple[float, ...] | None = None

    def labels(self, values) -> list:
        """The task's labels from the dataset's label column."""
        if self.bins is None:
            return list(values)
        return np.digitize(np.asarray(values, dtype=np.float64), self.bins, right=True).tolist()


_GLUE_TEXT = {"cola": ("sentence", None), "sst2": ("sentence", None), "mrpc": ("sentence1", "sentence2"),
              "rte": ("sentence1", "sentence2"), "qnli": ("question", "sentence"), "qqp": ("question1", "question2"),
              "stsb": ("sentence1", "sentence2")}

HUB_SOURCES: dict[str, tuple[HubDataset, ...]] = {
    **{key: (HubDataset("nyu-mll/glue", key, text),) for key, text in _GLUE_TEXT.items()},
    "sst5": (HubDataset("SetFit/sst5", None, ("text", None)),
             HubDataset("stanfordnlp/sst", "default", ("sentence", None), bins=(0.2, 0.4, 0.6, 0.8))),
    "squad": (HubDataset("rajpurkar/squad", None),),
}
"""Task key -> the hub datasets it can be read from, the default first (``data.hub_datasets`` picks another)."""


def hub_source(task: str, hub_id: str | None = None) -> HubDataset:
    """The hub dataset ``hub_id`` of ``task`` (None: the task's default)."""
    sources = {source.hub_id: source for source in HUB_SOURCES[task]}
    return lookup(sources, hub_id or next(iter(sources)), f"{task} hub dataset", "data.hub_datasets")


class HubUnavailableError(RuntimeError):
    """The Hugging Face hub could not provide a dataset (offline, or not in the cache)."""


def _frame(task: Task, source: HubDataset, columns: dict, n_rows: int) -> pd.DataFrame:
    """One hub split (``Dataset.to_dict()``) in the normalised columns of :mod:`istar.registry.tasks`."""
    if task.kind == "qa":  # the hub's columns, but the answers' struct of lists as two columns
        return pd.DataFrame({**{name: columns[name] for name in ("id", "title", "context", "question")},
                             "answer_texts": [list(a["text"]) for a in columns["answers"]],
                             "answer_starts": [list(a["answer_start"]) for a in columns["answers"]]})
    text_a, text_b = source.text
    return pd.DataFrame({"idx": columns.get("idx", range(n_rows)), "text_a": columns[text_a],
                         "text_b": columns[text_b] if text_b else [None] * n_rows,
                         "label": source.labels(columns["label"])})


def load_hub(task: Task, revision: str | None = None, hub_id: str | None = None) -> tuple[dict[str, pd.DataFrame], dict]:
    """The task's train and validation splits from the hub at ``revision`` (None = ``main``).

    ``hub_id`` names one of the task's :data:`HUB_SOURCES` (None: its default). Returns the
    normalised splits and the provenance (``source``, ``hub_id``, ``hub_config``, ``hub_revision`` as
    asked, ``hub_commit`` as loaded, ``dropped_rows``). Raises :class:`HubUnavailableError` when the hub
    (or the cache, offline) cannot provide them.
    """
    source = hub_source(task.key, hub_id)
    hub_id, config = source.hub_id, source.config
    name = hub_id if config is None else f"{hub_id} ({config})"
    advice = (f"Without internet, use source 'mirror' with a path: `istar prepare-data --task "
              f"{task.key} --source mirror --mirror DIR` (a folder in the GLUE release layout; "
              f"see istar.data).")
    import datasets  # a dependency of the package, imported here: it takes seconds and only the hub needs it

    try:
        commit = resolve_revision(hub_id, revision, repo_type="dataset")
    except RevisionUnavailableError as exc:
        raise HubUnavailableError(f"{exc}. {advice}") from None
    logger.info("loading %s at commit %s from the Hugging Face hub", name, commit)
    try:
        loaded = datasets.load_dataset(hub_id, config, revision=commit)
    except Exception as exc:  # offline, unknown dataset, auth: the advice is the same
        raise HubUnavailableError(f"could not load {name} from the Hugging Face hub: {type(exc).__name__}: {exc}. "
                                  f"{advice}") from exc
    splits, dropped_rows = {}, {}
    for split in SPLITS:
        if split not in loaded:
            raise ValueError(f"{name} on the hub has no {split!r} split (it has {list(loaded)})")
        frame = _frame(task, source, loaded[split].to_dict(), loaded[split].num_rows)
        splits[split], dropped_rows[split] = normalise_split(frame, task, lambda i: f"{name} split {split}, row {i}")
    return splits, {"source": "hub", "hub_id": hub_id, "hub_config": config, "hub_revision": revision or "main",
                    "hub_commit": commit, "dropped_rows": dropped_rows}

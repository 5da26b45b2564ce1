"""Tasks from the Hugging Face hub through the ``datasets`` library, at a pinned commit.

The datasets and their columns are those of the hub repos (``nyu-mll/glue`` configs sst2, qnli,
rte, mrpc, qqp, cola, stsb; ``SetFit/sst5``; ``rajpurkar/squad``): GLUE's ``label`` is a class
label (RTE/QNLI: entailment = 0), STS-B's a float score, SST-5's an int 0-4, SQuAD's answers a
struct of lists ``answers.text`` / ``answers.answer_start``. The requested revision (a branch,
tag or commit; default ``main``) is resolved to its commit first (:mod:`istar.io.revisions`), the
data are loaded at that commit, and the commit goes into the provenance (``meta.json``).
"""

from __future__ import annotations

import logging

import pandas as pd

from istar.data.normalise import check_split, conform
from istar.io.revisions import RevisionUnavailableError, resolve_revision
from istar.registry.tasks import SPLITS, Task

__all__ = ["HUB_DATASETS", "HubUnavailableError", "load_hub"]

logger = logging.getLogger(__name__)

HUB_DATASETS: dict[str, tuple[str, str | None]] = {
    **{key: ("nyu-mll/glue", key) for key in ("cola", "sst2", "mrpc", "rte", "qnli", "qqp", "stsb")},
    "sst5": ("SetFit/sst5", None),
    "squad": ("rajpurkar/squad", None),
}
"""Task key -> (hub dataset id, config name or None)."""

_TEXT_COLUMNS: dict[str, tuple[str, str | None]] = {
    "cola": ("sentence", None),
    "sst2": ("sentence", None),
    "mrpc": ("sentence1", "sentence2"),
    "rte": ("sentence1", "sentence2"),
    "qnli": ("question", "sentence"),
    "qqp": ("question1", "question2"),
    "stsb": ("sentence1", "sentence2"),
    "sst5": ("text", None),
}


class HubUnavailableError(RuntimeError):
    """The Hugging Face hub could not provide a dataset (offline, or ``datasets`` missing)."""


def _frame(task: Task, columns: dict, n_rows: int) -> pd.DataFrame:
    """One hub split (``Dataset.to_dict()``) in the normalised columns of :mod:`istar.registry.tasks`."""
    if task.kind == "qa":
        return pd.DataFrame({
            "id": columns["id"],
            "title": columns["title"],
            "context": columns["context"],
            "question": columns["question"],
            "answer_texts": [list(a["text"]) for a in columns["answers"]],
            "answer_starts": [list(a["answer_start"]) for a in columns["answers"]],
        })
    text_a, text_b = _TEXT_COLUMNS[task.key]
    return pd.DataFrame({
        "idx": columns.get("idx", range(n_rows)),
        "text_a": columns[text_a],
        "text_b": columns[text_b] if text_b else [None] * n_rows,
        "label": columns["label"],
    })


def load_hub(task: Task, revision: str | None = None) -> tuple[dict[str, pd.DataFrame], dict]:
    """The task's train and validation splits from the hub at ``revision`` (None = ``main``).

    Returns the normalised splits and the provenance (``hub_id``, ``hub_config``,
    ``hub_revision`` as asked, ``hub_commit`` as loaded, ``dropped_rows``). Raises
    :class:`HubUnavailableError` when the hub (or the cache, offline) cannot provide them.
    """
    hub_id, config = HUB_DATASETS[task.key]
    name = hub_id if config is None else f"{hub_id} ({config})"
    advice = (f"Without internet, use source 'mirror' with a path: `istar prepare-data --task "
              f"{task.key} --source mirror --mirror DIR` (a folder in the GLUE release layout; "
              f"see istar.data).")
    try:
        import datasets
    except ImportError as exc:
        raise HubUnavailableError(f"source 'hub' needs the `datasets` package ({exc}). {advice}") from exc
    try:
        commit = resolve_revision(hub_id, revision, repo_type="dataset")
    except RevisionUnavailableError as exc:
        raise HubUnavailableError(f"{exc}. {advice}") from None
    logger.info("loading %s at commit %s from the Hugging Face hub", name, commit)
    try:
        loaded = datasets.load_dataset(hub_id, config, revision=commit)
    except Exception as exc:  # offline, unknown dataset, auth: the advice is the same
        raise HubUnavailableError(
            f"could not load {name} from the Hugging Face hub: {type(exc).__name__}: {exc}. {advice}"
        ) from exc
    splits, dropped_rows = {}, {}
    for split in SPLITS:
        if split not in loaded:
            raise ValueError(f"{name} on the hub has no {split!r} split (it has {list(loaded)})")
        frame = _frame(task, loaded[split].to_dict(), loaded[split].num_rows)
        frame, dropped_rows[split] = check_split(
            frame, task, lambda i, split=split: f"{name} split {split}, row {i}"
        )
        splits[split] = conform(frame, task)
    provenance = {
        "source": "hub",
        "mirror": None,
        "hub_id": hub_id,
        "hub_config": config,
        "hub_revision": revision or "main",
        "hub_commit": commit,
        "files": {},
        "standin": False,
        "standin_note": None,
        "dropped_rows": dropped_rows,
    }
    return splits, provenance

"""The benchmark tasks: what each one is, which head it needs and how it is scored.

One registry, read by the data loaders, the trainer, the evaluator and the workflow.
Task keys are lower-case (``rte``, ``sst2``, ``stsb``, …); ``display`` is the paper's name.

Normalised columns (every split's parquet file; see :mod:`istar.data`):

- classification / regression: ``idx`` (int64), ``text_a`` (str), ``text_b`` (str, null for
  single-sentence tasks), ``label`` (int64 class for classification, float32 score for STS-B);
- qa (SQuAD v1.1): ``id`` (str), ``title`` (str), ``context`` (str), ``question`` (str),
  ``answer_texts`` (list of str), ``answer_starts`` (list of int64, character offsets).
"""

from __future__ import annotations

from dataclasses import dataclass

from istar.registry import lookup

__all__ = ["Task", "TASKS", "get_task", "ordered_tasks", "SPLITS"]

SPLITS = ("train", "validation")
"""The normalised split names: ``validation`` is the evaluation split (GLUE's dev set)."""


@dataclass(frozen=True)
class Task:
    """A benchmark task.

    key : registry key, e.g. ``"rte"``.
    display : the paper's name, e.g. ``"RTE"``.
    kind : ``"classification"``, ``"regression"`` or ``"qa"``.
    num_labels : classes (1 for regression, 0 for extractive QA).
    paired : whether examples have a second text (``text_b``).
    metric : the headline metric used for model selection and Table 1.
    metrics : every metric reported in ``metrics.json``.
    rows : the official (train, validation) row counts of the public release (SQuAD: questions;
        GLUE, SST-5 and SQuAD v1.1 as published, equal to the Hugging Face hub's splits). A mirror
        file with another count is refused unless the data are declared a subset (``data.subset``).
    heldout_grouping : which rows must stay together when part of the training split is held out
        to score the search (:data:`istar.data.holdout.GROUPINGS`): ``source_sentence`` where rows
        are phrases of longer rows (GLUE's SST-2), ``shared_sentence`` where pairs reuse sentences,
        ``identical_text`` for whole sentences, ``article`` for SQuAD's questions.
    """

    key: str
    display: str
    kind: str
    num_labels: int
    paired: bool
    metric: str
    metrics: tuple[str, ...]
    rows: tuple[int, int]
    heldout_grouping: str

    @property
    def percent_scale(self) -> float:
        """What turns the headline score into percent for tables: 100 for the fractions
        (accuracy, F1, correlations), 1 for SQuAD's F1 and exact match, percentages already."""
        return 1.0 if self.kind == "qa" else 100.0


TASKS: dict[str, Task] = {
    task.key: task
    for task in (
        Task("sst2", "SST-2", "classification", 2, False, "accuracy", ("accuracy",), (67_349, 872), "source_sentence"),
        Task("qnli", "QNLI", "classification", 2, True, "accuracy", ("accuracy",), (104_743, 5_463), "shared_sentence"),
        Task("rte", "RTE", "classification", 2, True, "accuracy", ("accuracy",), (2_490, 277), "shared_sentence"),
        Task("mrpc", "MRPC", "classification", 2, True, "accuracy", ("accuracy", "f1"), (3_668, 408), "shared_sentence"),
        Task("qqp", "QQP", "classification", 2, True, "accuracy", ("accuracy", "f1"), (363_846, 40_430), "shared_sentence"),
        Task("cola", "CoLA", "classification", 2, False, "matthews", ("matthews", "accuracy"), (8_551, 1_043), "identical_text"),
        Task("stsb", "STS-B", "regression", 1, True, "pearson", ("pearson", "spearman"), (5_749, 1_500), "shared_sentence"),
        Task("sst5", "SST-5", "classification", 5, False, "accuracy", ("accuracy",), (8_544, 1_101), "identical_text"),
        Task("squad", "SQuAD", "qa", 0, True, "f1", ("f1", "exact_match"), (87_599, 10_570), "article"),
    )
}


def get_task(key: str) -> Task:
    """Look a task up by key, with an error that lists the known tasks."""
    return lookup(TASKS, key, "task")


def ordered_tasks(keys) -> list[str]:
    """The distinct task keys among ``keys`` in registry order; an unknown key raises ``ValueError``."""
    present = {get_task(key).key for key in keys}
    return [key for key in TASKS if key in present]

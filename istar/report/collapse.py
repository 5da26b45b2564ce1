"""The declared rule for collapsed runs (``inference.collapsed_runs``, :mod:`istar.registry.collapse_rules`)
applied to ``runs.csv`` before its runs are paired, and the counts the tables state.

``runs.csv`` flags each run (column ``collapsed``: its final evaluation did not beat the trivial
predictor, :func:`istar.core.metrics.collapsed`; empty for runs evaluated before that was recorded,
which no rule touches). :func:`apply_collapse_rule` is the one place a rule acts: the aggregate step
calls it before ``paired.csv``, the tables before Table 1, the padding table and the claims.
"""

from __future__ import annotations

import pandas as pd

from istar.registry.collapse_rules import get_collapse_rule
from istar.registry.methods import METHODS

__all__ = ["CELL", "COUNT_COLUMNS", "collapsed_flags", "apply_collapse_rule", "collapse_footnote"]

CELL = ("study", "model", "task")
"""The columns of ``runs.csv`` that name one comparison's cell; its arms are its methods."""

COUNT_COLUMNS = (*CELL, "method", "rule", "runs", "collapsed", "excluded")
"""Columns of :func:`apply_collapse_rule`'s counts: per cell and arm, the rule, the arm's runs before
the rule, how many of them collapsed and how many the rule removed."""


def collapsed_flags(runs: pd.DataFrame) -> pd.Series:
    """Per row of ``runs.csv``, True where the run collapsed (False where it did not or was not checked:
    a runs.csv written before the column existed checked none)."""
    if "collapsed" not in runs.columns:
        return pd.Series(False, index=runs.index)
    return runs["collapsed"].map(lambda value: value is True or str(value) == "True").astype(bool)


def apply_collapse_rule(runs: pd.DataFrame, rule: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The runs a paired comparison may use under ``rule``, and what the rule did per arm.

    Parameters
    ----------
    runs : DataFrame
        ``runs.csv`` (any studies; at least the columns of :data:`CELL`, ``method``, ``seed`` and, to
        find a collapse, ``collapsed``).
    rule : str
        ``keep`` or ``exclude`` (:data:`istar.registry.collapse_rules.COLLAPSE_RULES`; ``rerun`` is
        refused with the reason).

    Returns
    -------
    (kept, counts)
        ``kept``: the rows of ``runs`` the rule keeps, in their order (``exclude`` drops, per cell,
        every arm's run of a seed on which any arm collapsed, so a pair leaves whole); ``counts``:
        one row per cell and arm, columns :data:`COUNT_COLUMNS`.
    """
    declared = get_collapse_rule(rule)
    flags = collapsed_flags(runs)
    if declared.excludes:
        failed = runs.loc[flags, [*CELL, "seed"]].drop_duplicates()
        hit = runs[[*CELL, "seed"]].merge(failed, how="left", indicator=True)["_merge"].eq("both").to_numpy()
    else:
        hit = pd.Series(False, index=runs.index).to_numpy()
    arms = runs[[*CELL, "method"]].assign(runs=1, collapsed=flags.astype(int).to_numpy(), excluded=hit.astype(int))
    counts = arms.groupby([*CELL, "method"], sort=False, as_index=False)[["runs", "collapsed", "excluded"]].sum()
    counts.insert(len(CELL) + 1, "rule", rule)
    return runs.loc[~hit], counts[list(COUNT_COLUMNS)]


def collapse_footnote(counts: pd.DataFrame, task_names: dict[str, str]) -> str:
    """A table's sentence on the collapsed runs: the rule that ran and, per cell and arm, the runs it
    counted and removed. ``counts`` from :func:`apply_collapse_rule`; ``task_names``: task key → display."""
    rule = get_collapse_rule(counts["rule"].iloc[0] if len(counts) else "keep")
    touched = counts[counts["collapsed"] > 0]
    head = (f"Collapsed runs (final score no better than the task's trivial predictor on the evaluation split: the "
            f"best constant class, the constant mean, an empty answer; inference.collapsed_runs: {rule.key}, "
            f"{rule.wording})")
    if touched.empty:
        return f"{head}: none."
    studies = counts["study"].nunique() > 1
    cells = []
    for (study, model, task), arms in touched.groupby(list(CELL), sort=False):
        where = f"{study}: " * studies + f"{model} {task_names.get(task, task)}"
        every = counts[(counts["study"] == study) & (counts["model"] == model) & (counts["task"] == task)]
        parts = [f"{METHODS[row.method].label if row.method in METHODS else row.method} {row.collapsed} of {row.runs}"
                 + (f", {row.excluded} excluded" if rule.excludes else "") for row in every.itertuples()]
        cells.append(f"{where} ({'; '.join(parts)})")
    return f"{head}: " + "; ".join(cells) + "."

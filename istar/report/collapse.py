"""The declared rule for collapsed runs (``inference.collapsed_runs``, :mod:`istar.registry.collapse_rules`)
applied to ``runs.csv`` before its runs are paired, and the counts the tables state.

``runs.csv`` flags each run (column ``collapsed``: its final evaluation did not beat the trivial
predictor, :func:`istar.core.metrics.collapsed`; empty for runs evaluated before that was recorded,
which no rule touches). :func:`apply_collapse_rule` is the one place a rule acts: the aggregate step
calls it before ``paired.csv``, the tables before Table 1, the padding table and the claims.

Under ``rerun`` the final runs of a cell are checked once they exist (:func:`collapse_check`, ``istar
collapse-check``, a workflow checkpoint): each seed on which any arm collapsed gets a replacement, the
next unused seed, which the workflow trains in every arm; the rule then acts as ``exclude``.
"""

from __future__ import annotations

import argparse

import pandas as pd

from istar.registry.collapse_rules import get_collapse_rule
from istar.registry.methods import METHODS
from istar.registry.tasks import TASKS
from istar.report.aggregate_csv import as_bool

__all__ = ["CELL", "COUNTS_ATTR", "COUNT_COLUMNS", "collapsed_flags", "apply_collapse_rule", "collapse_footnote", "collapse_check"]

CELL = ("study", "model", "task")
"""The columns of ``runs.csv`` that name one comparison's cell; its arms are its methods."""

COUNTS_ATTR = "collapse_counts"
"""The key in ``kept.attrs`` (pandas' metadata of a DataFrame) under which :func:`apply_collapse_rule` leaves its counts."""

COUNT_COLUMNS = (*CELL, "method", "rule", "runs", "checked", "collapsed", "excluded")
"""Columns of :func:`apply_collapse_rule`'s counts: per cell and arm, the rule, the arm's runs before
the rule, how many of them carry a collapse flag, how many collapsed and how many the rule removed."""


def collapsed_flags(runs: pd.DataFrame) -> pd.Series:
    """Per row of ``runs.csv``, True where the run collapsed (False where it did not or was not checked:
    a runs.csv written before the column existed checked none)."""
    return as_bool(runs.get("collapsed", pd.Series(False, index=runs.index)))


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
    # the seeds the rule removes, per cell: none under a rule that keeps collapsed runs
    failed = runs.loc[flags & declared.excludes, [*CELL, "seed"]].drop_duplicates()
    hit = runs[[*CELL, "seed"]].merge(failed, how="left", indicator=True)["_merge"].eq("both").to_numpy()
    checked = runs["collapsed"].notna() if "collapsed" in runs.columns else pd.Series(False, index=runs.index)
    arms = runs[[*CELL, "method"]].assign(runs=1, checked=checked.astype(int).to_numpy(),
                                          collapsed=flags.astype(int).to_numpy(), excluded=hit.astype(int))
    counts = arms.groupby([*CELL, "method"], sort=False, as_index=False)[["runs", "checked", "collapsed",
                                                                          "excluded"]].sum()
    counts.insert(len(CELL) + 1, "rule", rule)
    kept = runs.loc[~hit].copy()
    # a table that lists its cells from the runs still finds a cell the rule emptied (every seed collapsed)
    kept.attrs[COUNTS_ATTR] = counts[list(COUNT_COLUMNS)]
    return kept, counts[list(COUNT_COLUMNS)]


def collapse_footnote(counts: pd.DataFrame) -> str:
    """A table's sentence on the collapsed runs: the rule that ran and, per cell and arm, the runs it
    counted and removed. ``counts`` from :func:`apply_collapse_rule`; a task the registry does not know is
    named by its key."""
    rule = get_collapse_rule(counts["rule"].iloc[0] if len(counts) else "keep")
    touched = counts[counts["collapsed"] > 0]
    head = (f"Collapsed runs (final score no better than the task's trivial predictor on the evaluation split: the "
            f"best constant class, the constant mean, an empty answer; inference.collapsed_runs: {rule.key}, "
            f"{rule.wording})")
    unchecked = int(counts["runs"].sum() - counts["checked"].sum())
    if touched.empty and unchecked:
        return (f"{head}: not checked for {unchecked} of {int(counts['runs'].sum())} runs (evaluated before the flag "
                "was recorded); none among the others." if counts["checked"].sum() else
                f"{head}: not checked (no run carries the flag: they were evaluated before it was recorded).")
    if touched.empty:
        return f"{head}: none."
    studies = counts["study"].nunique() > 1
    cells = []
    for (study, model, task), arms in touched.groupby(list(CELL), sort=False):
        where = f"{study}: " * studies + f"{model} {TASKS[task].display if task in TASKS else task}"
        every = counts[(counts["study"] == study) & (counts["model"] == model) & (counts["task"] == task)]
        parts = [f"{METHODS[row.method].label if row.method in METHODS else row.method} {row.collapsed} of {row.runs}"
                 + (f", {row.excluded} excluded" if rule.excludes else "") for row in every.itertuples()]
        cells.append(f"{where} ({'; '.join(parts)})")
    return f"{head}: " + "; ".join(cells) + "."


def collapse_check(run_dirs, *, model: str, task: str, out=None) -> dict:
    """Which seeds of one final cell collapsed in any arm, and the seed that replaces each (``rerun``).

    Parameters
    ----------
    run_dirs : the final runs of ``model`` × ``task``, every arm and seed (finished run folders).
    model, task : the cell.
    out : where to write the result as JSON (atomically, with its content hash); None writes nothing.

    Returns
    -------
    dict with ``model``, ``task``, ``seeds`` (those the runs have), ``collapsed`` (the seeds on which
    any arm collapsed) and ``replacements`` (collapsed seed, as a string → its replacement: the next
    seeds after the largest one, in the order of the collapsed seeds).
    """
    from istar.io import artifacts
    from istar.io.results import read_finished_run

    flags = {}
    for run_dir in run_dirs:
        metrics, _ = read_finished_run(run_dir)
        if metrics.get("task") != task:
            raise ValueError(f"run folder {run_dir} is a run of {metrics.get('task')!r}, not of {task!r}: give the "
                             "final runs of one model and task")
        seed = int(metrics["seed"])
        flags[seed] = flags.get(seed, False) or metrics.get("collapsed") is True
    if not flags:
        raise ValueError(f"no final runs given for {model} × {task}: collapse-check reads the finished final runs")
    seeds, collapsed = sorted(flags), sorted(seed for seed, hit in flags.items() if hit)
    result = {"model": model, "task": task, "seeds": seeds, "collapsed": collapsed,
              "replacements": {str(seed): seeds[-1] + 1 + index for index, seed in enumerate(collapsed)}}
    if out is not None:
        result = artifacts.write_json(out, result, digest=True)
    return result


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="the model's short name (the config's key)")
    parser.add_argument("--task", required=True, help="the task key")
    parser.add_argument("--out", required=True, help="output JSON (results/collapse/MODEL/TASK.json)")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="the cell's finished final runs, every arm")


def run_cli(args) -> int:
    result = collapse_check(args.run_dirs, model=args.model, task=args.task, out=args.out)
    replaced = ", ".join(f"{seed} → {new}" for seed, new in result["replacements"].items()) or "none"
    print(f"{args.model} × {args.task}: {len(result['collapsed'])} of {len(result['seeds'])} seed(s) collapsed in "
          f"some arm; replaced (every arm trains again): {replaced} -> {args.out}")
    return 0

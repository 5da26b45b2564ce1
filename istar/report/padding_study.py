"""The padding study's table and figure: does I-STAR's effect depend on padded positions?

The study (config ``studies.padding``, :func:`istar.pipeline.plan.study_settings`) trains, per model ×
task and over the same seeds, the baseline and I-STAR at one λ and ζ twice: with the penalty
and Σ_S over the real tokens, and over every position of batches padded to their longest
sequence, as the authors' code does (``penalty.tokens``, docs/method.md §7). Both read
``runs.csv`` rows with ``study == "padding"``:

- ``score``: the task's headline metric of the final model (×100 where it is a fraction);
- ``isoscore_star``: the global IsoScore* of the final model's *real* tokens on the validation
  split (the measurement analyses real tokens whatever the run trained on, so the three
  variants are compared on the same rows), at the analysis's ζ.

Cells and points are means over seeds with the standard deviation (ddof = 1). The table adds,
per I-STAR variant, its paired difference from the baseline over the seeds both ran, with the
95 % Student-t interval of :mod:`istar.report.paired`, for the score and for IsoScore*.
"""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure

from istar.core.tokens import TOKEN_SELECTIONS
from istar.registry.methods import BASELINE_METHOD, METHODS
from istar.registry.tasks import get_task, ordered_tasks
from istar.report import figure_parts as parts
from istar.report.aggregate_csv import standin_columns
from istar.report.inference import POWER
from istar.report.comparisons import study_tests, variant_label
from istar.report.paired import LEVEL, SIGNIFICANT, difference_cell, power_cell
from istar.report.table_render import Table, spread

__all__ = ["padding_rows", "padding_table", "padding"]

COLUMNS = ("study", "model", "task", "method", "lam", "zeta", "tokens", "seed", "metric", "score", "isoscore_star",
           "standin")


def padding_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """The padding study's rows with ``variant`` (see :func:`variant_label`) and ``performance`` (×100)."""
    rows = parts.with_performance(parts.study_rows(runs, "padding", "runs.csv", "score", COLUMNS))
    variants = [variant_label(m, t) for m, t in zip(rows["method"], rows["tokens"])]
    return rows.assign(variant=variants)


def _order(rows: pd.DataFrame) -> list[str]:
    """Variants in registry order: methods, then token selections."""
    order = [variant_label(m, t) for m in METHODS for t in TOKEN_SELECTIONS]
    return [v for v in dict.fromkeys(order) if v in set(rows["variant"])]


BASE = METHODS[BASELINE_METHOD].label
"""The baseline's variant: it takes no token selection, so its variant is its method's label."""


def padding_table(runs: pd.DataFrame, config: dict | None = None) -> Table:
    """The padding study as a table: rows model × variant, per task the score and the real-token IsoScore*.

    Parameters
    ----------
    runs : ``runs.csv`` of ``istar aggregate`` (rows with ``study == "padding"``).
    config : the resolved config (its ``inference`` section adjusts the tests); None: the schema's defaults.

    Returns
    -------
    Table with columns ``{task} score`` (×100, one decimal) and ``{task} IsoScore*`` (three
    decimals) per task, cells ``mean ± std`` over seeds (a single seed: the value alone), then
    per I-STAR variant a row ``variant − Base``: the paired difference over the seeds both ran
    with its 95 % interval and n (``‡``: the interval excludes 0); the λ | ζ of each
    model × task in a footnote.
    """
    rows = padding_rows(runs)
    tasks = ordered_tasks(rows["task"])
    models = list(dict.fromkeys(rows["model"]))
    tests = study_tests(runs, (config or {}).get("inference"))
    scores, isoscores = tests.cells("padding", "score"), tests.cells("padding", "isoscore_star")
    index, cells = [], []
    for model in models:
        block = rows[rows["model"] == model]
        variants = _order(block)
        for variant in variants:
            mine = block[block["variant"] == variant]
            index.append([model, variant])
            cells.append([text for task in tasks for cell in [mine[mine["task"] == task]]
                          for text in (spread(cell["performance"]), spread(cell["isoscore_star"], digits=3))])
        for variant in (v for v in variants if v != BASE):
            for suffix, cell in (("", difference_cell), (": test", power_cell)):
                index.append([model, f"{variant} − {BASE}{suffix}"])
                cells.append([text for task in tasks for text in (
                    cell(scores.get((model, variant, task)), get_task(task).percent_scale),
                    cell(isoscores.get((model, variant, task)), 1.0, digits=3))])
    settings = [f"{model} on {get_task(task).display}, {variant}: λ = {group['lam'].iloc[0]:g}, "
                f"ζ = {group['zeta'].iloc[0]:g}"
                for (model, task, variant), group in _with_zeta(rows).groupby(["model", "task", "variant"], sort=False)]
    counts = sorted(set(rows.groupby(["model", "task", "variant"])["seed"].nunique()))
    seeds = f"{'–'.join(map(str, counts))} seed{'s' if counts != [1] else ''}"
    columns = [f"{get_task(t).display} {q}" for t in tasks for q in ("score", "IsoScore*")]
    return Table(
        name="padding",
        caption="Padding study: the baseline and I-STAR with the penalty and Σ_S over real tokens or over every "
                f"padded position; the final model's score and real-token IsoScore* ({seeds}).",
        index_names=["Model", "Method"],
        index=index,
        columns=columns,
        standin=[flag for flag in standin_columns(rows, tasks) for _ in range(2)],
        cells=cells,
        footnotes=["Score: the headline metric ×100 (SQuAD F1 as is); IsoScore*: global IsoScore* of the final "
                   "model's real tokens on the validation split (analysis ζ). Mean ± standard deviation (ddof = 1) "
                   "over seeds. " + "; ".join(settings) + ".",
                   f"Rows “variant − {BASE}”: the mean paired difference over the n seeds both ran (variant minus "
                   f"{BASE}, seed by seed), with its {LEVEL:.0%} confidence interval from Student's t with n − 1 "
                   f"degrees of freedom; n = 1: no interval. Rows “…: test”: the paired t-test's p-value (the "
                   "signed-rank test's and the seeds above and below zero in brackets), the p-value after Holm's "
                   f"correction across the study's {tests.family_size} confirmatory tests (the same family as Table 1 "
                   f"and the claims), {SIGNIFICANT} on the difference where it is below {1 - LEVEL:g}, and the minimum "
                   f"detectable effect at {POWER:.0%} power at α / m for the n and paired sd observed.",
                   *tuning_note(runs)],
    )


def tuning_note(runs: pd.DataFrame) -> list[str]:
    """A footnote on the tuned variant's own grid (``studies.padding`` with ``lam: tuned``), from its
    ``padding_tuning`` rows in runs.csv: how many settings and seeds, scored on which split."""
    tuning = runs[runs["study"] == "padding_tuning"]
    if tuning.empty:
        return []
    settings = tuning.groupby(["model", "task", "tokens", "lam", "zeta"]).ngroups
    seeds = sorted(tuning["seed"].dropna().astype(int).unique())
    return [f"The variant over {', '.join(TOKEN_SELECTIONS[t].label for t in sorted(set(tuning['tokens'])))} took the "
            f"λ | ζ its own grid chose: the best mean score of {settings} setting(s) over seeds "
            f"{', '.join(map(str, seeds))}, on the search's selection split (the validation split unless "
            "search.selection_split is heldout, which then favours this variant)."]


def _with_zeta(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of the variants that have a λ | ζ (their method takes ζ: the I-STAR variants)."""
    return rows[rows["method"].map(lambda method: METHODS[method].takes("zeta"))]


def padding(runs: pd.DataFrame) -> Figure:
    """The padding figure: real-token IsoScore* (x) against performance (y), one point per variant.

    Parameters
    ----------
    runs : ``runs.csv``; rows with ``study == "padding"`` and an ``isoscore_star`` value (the axis label
        names the ζ of their analysis, ``analysis_zeta``).

    Returns
    -------
    Figure with one panel per model × task; per variant one point with error bars (std over
    seeds) both ways, coloured by method, marked by token selection.
    """
    rows = padding_rows(runs).dropna(subset=["isoscore_star"])
    if rows.empty:
        raise ValueError("the padding study's rows in runs.csv have no isoscore_star: measure its runs "
                         "(the workflow's measure jobs) before `istar aggregate`")
    summary = parts.summary(rows, ["model", "task", "variant", "method", "tokens"], ["isoscore_star", "performance"])
    fig, axes = parts.panels(rows)
    for (model, task), ax in axes.items():
        panel = summary[(summary["model"] == model) & (summary["task"] == task)]
        penalised = _with_zeta(rows[(rows["model"] == model) & (rows["task"] == task)])
        shared = penalised[["lam", "zeta"]].drop_duplicates()
        for variant in _order(panel):
            point = panel[panel["variant"] == variant]
            method, tokens = point["method"].iloc[0], point["tokens"].iloc[0]
            label = variant
            if len(shared) > 1 and METHODS[method].takes("zeta"):  # a tuned variant: each says its own λ | ζ
                own = penalised[penalised["variant"] == variant].iloc[0]
                label = f"{variant} (λ = {own['lam']:g}, ζ = {own['zeta']:g})"
            ax.errorbar(point["isoscore_star_mean"], point["performance_mean"],
                        xerr=parts.yerr(point["isoscore_star_std"]), yerr=parts.yerr(point["performance_std"]),
                        fmt=TOKEN_SELECTIONS[tokens].marker if METHODS[method].takes("tokens") else "o",
                        markersize=6, capsize=2, color=METHODS[method].colour,
                        markerfacecolor="white" if not TOKEN_SELECTIONS[tokens].masked else METHODS[method].colour,
                        label=label)
        ax.set(xlabel=parts.isoscore_label(rows, "IsoScore* of real tokens"),
               ylabel=parts.PERFORMANCE_LABELS[get_task(task).metric])
        if len(shared) == 1 and not math.isnan(float(shared["zeta"].iloc[0])):
            ax.set_title(f"{ax.get_title()} (λ = {shared['lam'].iloc[0]:g}, ζ = {shared['zeta'].iloc[0]:g})",
                         fontsize="medium")
    parts.figure_legend(fig, axes.values())
    return fig

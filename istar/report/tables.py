"""The paper's tables from the aggregate CSVs: Table 1 (performance) and Table 2 (chosen λ | ζ).

Each table is written three ways next to each other, ``{out_prefix}.csv``, ``.md`` and ``.tex``,
each file atomically (temporary file, then rename); how each format marks best cells,
stand-in columns and footnotes is described in :mod:`istar.report.table_render`.

What the cells hold
-------------------
- Scores are shown ×100 with one decimal (accuracy, Matthews and Pearson correlation are
  fractions in the aggregate CSV); SQuAD's F1 and exact match are already percentages.
- A cell is ``mean ± std (n=k)`` over its k seeds, the std with ddof = 1. A cell from a single
  seed has no std: it is shown as the mean alone (``71.3 (n=1)``), never as ``± 0.0``, and a
  footnote says so.
- SQuAD cells are ``F1/EM (n=k)``, each the mean over seeds (no std, as in the brief of Table 1).
- Below each model's methods, one row per method against Base (``I-STAR − Base``): the mean
  paired difference over the seeds both ran, in the units shown, with its 95 % Student-t
  interval (n − 1 degrees of freedom, :mod:`istar.report.paired`): ``+1.2 [+0.3, +2.1]‡ (n=5)``, the
  ``‡`` where the paired t-test stays significant after Holm's correction across every
  difference of the table; and below it what that comparison could show: its p-value, the
  Holm-adjusted p-value and the minimum detectable effect at 80 % power
  (``p = 0.031, Holm 0.250; MDE 1.4``). Seeds that only one side ran are named in a footnote.
- A footnote states the protocol that chose I-STAR's λ and ζ (from ``selection.csv``,
  :data:`istar.report.select.PROTOCOLS`) and what it costs.
- Best method per model and task: the highest mean *at the precision shown* (SQuAD: F1);
  ties are all marked.
- Tasks trained/evaluated on a stand-in split (made from the dev set because the real
  training file was unavailable offline) are flagged (a dagger on the header) with a footnote.
- Methods appear in the order and with the labels of :data:`istar.registry.methods.METHODS`.
"""

from __future__ import annotations

import math

import pandas as pd

from istar.registry.methods import BASELINE_METHOD, METHOD_NAMES, METHODS
from istar.registry.tasks import get_task, ordered_tasks
from istar.report.aggregate_csv import require_columns, standin_columns
from istar.report.inference import POWER
from istar.report.collapse import COUNTS_ATTR, collapsed_flags
from istar.report.comparisons import study_tests
from istar.report.paired import LEVEL, SIGNIFICANT, difference_cell, power_cell
from istar.report.select import selection_note
from istar.report.table_render import Table, latex_escape, spread, render_csv, render_latex, render_markdown, write_table

__all__ = ["Table", "table1", "table2", "seed_table", "write_table", "render_csv", "render_markdown", "render_latex", "latex_escape"]

METRIC_NOTES = {
    "accuracy": "accuracy (%)",
    "matthews": "Matthews correlation ×100",
    "pearson": "Pearson correlation ×100",
    "f1": "F1/EM (%, means over seeds without std)",
}
"""Headline metric → how Table 1's footnote describes its cells."""

STANDIN_NOTE = (
    "trained and evaluated on a stand-in split made from the dev set (the real training file "
    "was unavailable offline); not comparable with the paper's numbers."
)

RUNS_COLUMNS = ("study", "model", "task", "method", "setting", "seed", "score", "f1", "exact_match", "standin")
SELECTION_COLUMNS = ("model", "task", "lam", "zeta", "standin")
PROTOCOL_COLUMNS = ("protocol", "heldout_fraction", "heldout_seed", "settings")


# --------------------------------------------------------------------------------------
# building the tables
# --------------------------------------------------------------------------------------


def _standin_footnote(columns: list[str], standin: list[bool]) -> list[str]:
    """The stand-in columns' footnote (none where no column is flagged)."""
    flagged = [c for c, s in zip(columns, standin) if s]
    return [f"† {', '.join(flagged)}: {STANDIN_NOTE}"] if flagged else []


def table1(runs: pd.DataFrame, selection: pd.DataFrame | None = None, config: dict | None = None) -> Table:
    """Table 1: Base vs CosReg vs I-STAR per model and task, mean ± std over seeds, and each
    method's paired difference from Base with its 95 % interval.

    Parameters
    ----------
    runs : DataFrame
        ``runs.csv`` of ``istar aggregate``; only rows with ``study == "final"`` are used.
        Each model × task × method must have a single setting there (the chosen one).
    selection : DataFrame, optional
        ``selection.csv`` of ``istar aggregate``: which protocol chose I-STAR's setting (a
        footnote). None: the footnote says that the protocol is not known.
    config : the resolved config: its ``inference`` section's multiplicity plan adjusts the tests
        (:func:`istar.report.comparisons.study_tests`); None: the schema's defaults.

    Returns
    -------
    Table
        Rows model × method (Base, CosReg, I-STAR), then model × ``method − Base``; columns
        the tasks present in registry order; cells as described in the module docstring.

    Raises
    ------
    ValueError
        No final-study rows, missing columns, or several settings of one method.
    """
    require_columns(runs, RUNS_COLUMNS, "runs.csv")
    final = runs[runs["study"] == "final"].copy()
    # the cells the rule for collapsed runs emptied (istar.report.collapse): listed with no runs left
    counts = runs.attrs.get(COUNTS_ATTR)
    emptied = (counts[(counts["study"] == "final") & (counts["runs"] == counts["excluded"])]
               if counts is not None else pd.DataFrame(columns=["model", "task", "method"]))
    if final.empty and emptied.empty:
        raise ValueError(
            "runs.csv has no rows with study == 'final' (Table 1 needs them): enable studies.final "
            "in the config, run the workflow, then `istar aggregate`"
        )
    unknown = sorted(set(final["method"]) - set(METHOD_NAMES))
    if unknown:
        raise ValueError(f"runs.csv (study 'final') has unknown method(s) {unknown}; known: {list(METHOD_NAMES)}")
    settings = final.groupby(["model", "task", "method"])["setting"].nunique()
    if (settings > 1).any():
        model, task, method = settings[settings > 1].index[0]
        raise ValueError(
            f"runs.csv (study 'final') has several settings of {method} for {model} on {task}: "
            f"{sorted(final.query('model == @model and task == @task and method == @method')['setting'].unique())}; "
            "the final study must hold one chosen setting per method"
        )
    cells_present = pd.concat([final[["model", "task", "method"]], emptied[["model", "task", "method"]]])
    tasks = ordered_tasks(cells_present["task"])
    models = list(dict.fromkeys(cells_present["model"]))
    groups = {key: group for key, group in final.groupby(["model", "method", "task"])}
    tests = study_tests(runs, (config or {}).get("inference"))
    paired = tests.cells("final")

    index, cells, best, seed_counts, unpaired = [], [], [], set(), []
    for model in models:
        methods = [m for m in METHOD_NAMES if (cells_present["model"].eq(model) & cells_present["method"].eq(m)).any()]
        block = [[_table1_cell(groups.get((model, method, task)), get_task(task).kind == "qa") for task in tasks]
                 for method in methods]
        tops = [max((row[j][1] for row in block if row[j][1] is not None), default=None) for j in range(len(tasks))]
        for method, row in zip(methods, block):
            index.append([model, METHODS[method].label])
            cells.append([text for text, _, _ in row])
            best.append([key is not None and key == top for (_, key, _), top in zip(row, tops)])
            seed_counts.update(n for _, _, n in row if n)
        for method in [m for m in methods if m != BASELINE_METHOD] if BASELINE_METHOD in methods else []:
            label = f"{METHODS[method].label} − {METHODS[BASELINE_METHOD].label}"
            for suffix, cell in (("", difference_cell), (": test", power_cell)):
                index.append([model, label + suffix])
                cells.append([cell(paired.get((model, method, task)), get_task(task).percent_scale) for task in tasks])
                best.append([False] * len(tasks))
            unpaired += [f"{model} {get_task(task).display} {label}: {paired[(model, method, task)].unpaired}"
                         for task in tasks if (model, method, task) in paired and paired[(model, method, task)].unpaired]

    standin = standin_columns(final, tasks)
    seeds = "–".join(str(n) for n in sorted({min(seed_counts), max(seed_counts)})) if seed_counts else "0"
    scores = "; ".join(f"{METRIC_NOTES.get(metric, metric)} for "
                       + ", ".join(get_task(task).display for task in tasks if get_task(task).metric == metric)
                       for metric in dict.fromkeys(get_task(task).metric for task in tasks))
    footnotes = [
        f"Scores: {scores}. Mean ± standard deviation (ddof = 1) over the n seeds of each cell; a cell without ± "
        "comes from a single seed. Bold: best method per model and task (at the precision shown; ties all marked).",
        f"Rows “method − Base”: the mean paired difference over the n seeds both ran (method minus Base, seed by "
        f"seed; SQuAD: F1), in the units shown, with its {LEVEL:.0%} confidence interval from Student's t with "
        f"n − 1 degrees of freedom. n = 1: no interval.",
        f"Rows “method − Base: test”: the paired t-test's two-sided p-value; in brackets the Wilcoxon signed-rank "
        "test's and the seeds above (+) and below (−) zero; the p-value after Holm's correction across the study's "
        f"{tests.family_size} confirmatory tests (paired.csv and trend.csv: every cell, measure and trend; "
        f"{SIGNIFICANT} on the difference: Holm-adjusted p < {1 - LEVEL:g}); and the minimum detectable effect "
        f"(MDE): the true difference this comparison finds with {POWER:.0%} power at α / m "
        f"= {(1 - LEVEL) / max(tests.family_size, 1):.3g}, the level of Holm's first step, given its n and "
        "observed paired standard deviation, in the units shown. A difference smaller than its MDE can hide behind "
        "a non-significant result. “no information”: the pairs do not vary (e.g. every run of both arms predicted "
        "one class) or fewer than two remain: no test.",
    ]
    if unpaired:
        footnotes.append("Seeds run by one side only, left out of the differences: " + "; ".join(unpaired) + ".")
    footnotes.append(_protocol_footnote(selection))
    footnotes += _standin_footnote([get_task(t).display for t in tasks], standin)
    return Table(
        name="table1",
        caption=f"Performance of {listing([METHODS[m].label for m in METHOD_NAMES if m in set(cells_present['method'])])} "
        f"per model and task ({seeds} seeds), and each method's paired difference from Base with its {LEVEL:.0%} "
        "interval, p-values and minimum detectable effect.",
        index_names=["Model", "Method"],
        index=index,
        columns=[get_task(t).display for t in tasks],
        standin=standin,
        cells=cells,
        best=best,
        footnotes=footnotes,
    )


def _table1_cell(group: pd.DataFrame | None, qa: bool) -> tuple[str, float | None, int]:
    """The cell text, the value compared for 'best' (rounded as shown) and the seed count."""
    values = None if group is None else group["f1" if qa else "score"].dropna().astype(float) * (1.0 if qa else 100.0)
    if values is None or values.empty:
        return "–", None, 0
    mean = float(values.mean())
    if qa:  # F1/EM, means over seeds without std
        em = group["exact_match"].dropna().astype(float)
        return f"{mean:.1f}/{f'{em.mean():.1f}' if len(em) else '–'} (n={len(values)})", round(mean, 1), len(values)
    return f"{spread(values)} (n={len(values)})", round(mean, 1), len(values)


def _protocol_footnote(selection: pd.DataFrame | None) -> str:
    """Which protocol chose I-STAR's λ and ζ, and what it costs (one sentence per protocol found)."""
    if selection is None or selection.empty:
        return "I-STAR's setting: the selection protocol is not recorded here (no selection.csv given)."
    require_columns(selection, PROTOCOL_COLUMNS, "selection.csv")
    return "I-STAR's setting: " + " ".join(selection_note(rows) for _, rows in selection.groupby("protocol", sort=False))


def table2(selection: pd.DataFrame) -> Table:
    """Table 2: the chosen I-STAR λ | ζ per model and task, with per-model averages.

    Parameters
    ----------
    selection : DataFrame
        ``selection.csv`` of ``istar select``: one row per model × task.

    Returns
    -------
    Table
        Rows the models, columns the tasks in registry order plus ``Average``; cells
        ``λ | ζ`` (``-1 | 0.2``), the average ``mean λ | mean ζ`` with two decimals over the
        tasks shown for that model. No best marks.

    Raises
    ------
    ValueError
        No rows, missing columns, or several rows for one model × task.
    """
    require_columns(selection, SELECTION_COLUMNS, "selection.csv")
    if selection.empty:
        raise ValueError(
            "selection.csv has no rows (Table 2 needs them): enable studies.search in the config, "
            "run the workflow, then `istar select` and `istar aggregate`"
        )
    duplicated = selection.duplicated(["model", "task"])
    if duplicated.any():
        model, task = selection.loc[duplicated, ["model", "task"]].iloc[0]
        raise ValueError(f"selection.csv has several rows for {model} on {task}; it must hold one per model × task")
    tasks = ordered_tasks(selection["task"])
    models = list(dict.fromkeys(selection["model"]))
    cells = []
    for model in models:
        chosen = selection[selection["model"] == model].set_index("task")
        lams = chosen["lam"].astype(float)
        zetas = chosen["zeta"].astype(float)[lams != 0]  # where the search chose Base (λ = 0 in its grid): no ζ
        cells.append([("0 | – (Base)" if lams[task] == 0 else f"{_shown(lams[task], 'g')} | {_shown(zetas[task], 'g')}")
                      if task in lams.index else "–" for task in tasks]
                     + [f"{_shown(lams.mean(), '.2f')} | {_shown(zetas.mean(), '.2f')}"])

    columns = [get_task(t).display for t in tasks]
    standin = standin_columns(selection, tasks)
    return Table(
        name="table2",
        caption="Chosen I-STAR tuning parameter λ and shrinkage parameter ζ per model and task, as λ | ζ; "
        "Average: mean λ | mean ζ over the tasks shown.",
        index_names=["Model"],
        index=[[model] for model in models],
        columns=columns + ["Average"],
        standin=standin + [False],
        cells=cells,
        footnotes=_standin_footnote(columns, standin),
    )


def seed_table(runs: pd.DataFrame) -> Table:
    """Per-seed results of the final study: what every mean and paired difference of Table 1 is made of.

    Parameters
    ----------
    runs : DataFrame
        ``runs.csv`` of ``istar aggregate``; rows with ``study == "final"``.

    Returns
    -------
    Table
        Rows model × task × seed; columns each method's score (×100 for fractions; SQuAD: F1),
        then each method − Base on that seed. "–" where a method did not run that seed; a score followed by
        "collapsed" is of a run that did not beat its task's trivial predictor (runs.csv column ``collapsed``).
    """
    require_columns(runs, ("study", "model", "task", "method", "seed", "score"), "runs.csv")
    final = runs[runs["study"] == "final"]
    if final.empty:
        raise ValueError("runs.csv has no rows with study == 'final': run the workflow's final stage, then "
                         "`istar aggregate`")
    methods = [m for m in METHOD_NAMES if m in set(final["method"])]
    others = [m for m in methods if m != BASELINE_METHOD] if BASELINE_METHOD in methods else []
    scores = final.groupby(["model", "task", "seed", "method"])["score"].first()
    failed = set(final.loc[collapsed_flags(final), ["model", "task", "seed", "method"]].itertuples(index=False, name=None))
    index, cells = [], []
    for model in dict.fromkeys(final["model"]):
        for task in ordered_tasks(final.loc[final["model"] == model, "task"]):
            scale = get_task(task).percent_scale
            for seed in sorted(final.loc[(final["model"] == model) & (final["task"] == task), "seed"].astype(int).unique()):
                value = {m: scores.get((model, task, seed, m), math.nan) * scale for m in methods}
                row = ["–" if math.isnan(value[m]) else f"{value[m]:.1f}" + " collapsed" * ((model, task, seed, m) in failed)
                       for m in methods]
                row += ["–" if math.isnan(value[m] - value[BASELINE_METHOD]) else f"{value[m] - value[BASELINE_METHOD]:+.1f}"
                        for m in others]
                index.append([model, get_task(task).display, str(seed)])
                cells.append(row)
    columns = [METHODS[m].label for m in methods] + [f"{METHODS[m].label} − {METHODS[BASELINE_METHOD].label}" for m in others]
    return Table(
        name="seeds",
        caption="Every final run's score, seed by seed, and each method's difference from Base on the same seed.",
        index_names=["Model", "Task", "Seed"],
        index=index,
        columns=columns,
        cells=cells,
        footnotes=["Scores ×100 for fractions (SQuAD: F1 as is); a seed fixes the data order, the classifier's "
                   "initialisation and dropout for every method alike, which is what pairs them.",
                   "“collapsed”: the run's final score is no better than its task's trivial predictor on the "
                   "evaluation split (the best constant class, the constant mean, an empty answer): the fine-tuning "
                   f"failed. {len(failed)} of {len(final)} final runs collapsed; the tables' footnotes say what the "
                   "declared rule (inference.collapsed_runs) did with them."],
    )


def listing(names: list[str]) -> str:
    """``["a", "b", "c"]`` → ``"a, b and c"``; ``"none"`` for no names."""
    return " and ".join(filter(None, [", ".join(names[:-1]), names[-1]])) if names else "none"


def _shown(value: float, spec: str) -> str:
    """``value`` in the format ``spec`` (``g``, ``.2f``), "–" where it is missing (NaN)."""
    return "–" if math.isnan(value) else format(value, spec)

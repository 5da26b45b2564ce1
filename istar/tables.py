"""The paper's tables from the aggregate CSVs: Table 1 (performance) and Table 2 (chosen λ | ζ).

Each table is written three ways next to each other, ``{out_prefix}.csv``, ``.md`` and ``.tex``,
each file atomically (temporary file, then rename).

Formatting decisions
--------------------
- Scores are shown ×100 with one decimal (accuracy, Matthews and Pearson correlation are
  fractions in the aggregate CSV); SQuAD's F1 and exact match are already percentages.
- A cell is ``mean ± std`` over seeds, the std with ddof = 1. A cell from a single seed has
  no std: it is shown as the mean alone (``71.3``), never as ``± 0.0``, and a footnote says so.
- SQuAD cells are ``F1/EM``, each the mean over seeds (no std, as in the brief of Table 1).
- Best method per model and task: the highest mean *at the precision shown* (SQuAD: F1);
  ties are all marked. Markdown ``**…**``, LaTeX ``\\textbf{…}``, CSV: a ``*`` appended to
  the cell (``71.3 ± 1.2*``).
- Tasks trained/evaluated on a stand-in split (made from the dev set because the real
  training file was unavailable offline) get a dagger on the column header (``RTE†``; LaTeX
  ``RTE$^\\dagger$``) and a footnote. Footnotes appear in Markdown and LaTeX; the CSV holds
  the grid only.
- Markdown and LaTeX print a model's name on the first of its rows only; LaTeX separates
  models by ``\\midrule``. The CSV repeats it on every row.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from istar.artifacts import write_text
from istar.tasks import TASKS, get_task

__all__ = ["Table", "table1", "table2", "write_table", "render_csv", "render_markdown", "render_latex", "latex_escape"]

METHOD_NAMES = {"base": "Base", "cosreg": "CosReg", "istar": "I-STAR"}
"""Method key → the name shown in the tables, in the order rows appear."""

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


@dataclass
class Table:
    """A rendered table: every cell already a string, plus what marks and notes go with it.

    Attributes
    ----------
    name : str
        Short name, e.g. ``"table1"`` (used for the LaTeX label).
    caption : str
        One-sentence description (LaTeX caption, Markdown heading).
    index_names : list of str
        Headers of the leading label columns, e.g. ``["Model", "Method"]``.
    index : list of list of str
        Per row, the labels under ``index_names``.
    columns : list of str
        Task display names of the data columns (without the stand-in dagger).
    standin : list of bool
        Per data column, whether it gets the stand-in dagger.
    cells : list of list of str
        Per row, one string per data column.
    best : list of list of bool
        Per row and data column, whether the cell is marked best.
    footnotes : list of str
        Lines printed under the table in Markdown and LaTeX.
    """

    name: str
    caption: str
    index_names: list[str]
    index: list[list[str]]
    columns: list[str]
    standin: list[bool]
    cells: list[list[str]]
    best: list[list[bool]]
    footnotes: list[str]

    def headers(self, dagger: str) -> list[str]:
        """All column headers, stand-in columns suffixed with ``dagger``."""
        return self.index_names + [c + (dagger if s else "") for c, s in zip(self.columns, self.standin)]


# --------------------------------------------------------------------------------------
# building the tables
# --------------------------------------------------------------------------------------


def _as_bool(values: pd.Series) -> pd.Series:
    """``standin`` as booleans whether the CSV reader gave bools, 0/1 or the strings True/False."""
    if values.dtype == bool:
        return values
    return values.map(lambda v: str(v).strip().lower() in {"true", "1", "1.0", "yes"})


def _check_columns(df: pd.DataFrame, required, source: str) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"{source} lacks the column(s) {', '.join(missing)}; was it written by `istar aggregate`?")


def _ordered_tasks(keys) -> list[str]:
    """The task keys present, in registry order (unknown keys raise ``ValueError``)."""
    present = set(keys)
    for key in present:
        get_task(key)
    return [key for key in TASKS if key in present]


def _mean_std(values: pd.Series) -> tuple[float, float, int]:
    """Mean, std (ddof = 1; NaN for a single value) and count of the non-missing values."""
    values = values.dropna().astype(float)
    n = len(values)
    if n == 0:
        return math.nan, math.nan, 0
    return float(values.mean()), float(values.std(ddof=1)) if n > 1 else math.nan, n


def _standin_footnote(columns: list[str], standin: list[bool]) -> list[str]:
    flagged = [c for c, s in zip(columns, standin) if s]
    if not flagged:
        return []
    return [f"† {', '.join(flagged)}: {STANDIN_NOTE}"]


def table1(runs: pd.DataFrame) -> Table:
    """Table 1: Base vs CosReg vs I-STAR per model and task, mean ± std over seeds.

    Parameters
    ----------
    runs : DataFrame
        ``runs.csv`` of ``istar aggregate``; only rows with ``study == "final"`` are used.
        Each model × task × method must have a single setting there (the chosen one).

    Returns
    -------
    Table
        Rows model × method (Base, CosReg, I-STAR), columns the tasks present in registry
        order, cells as described in the module docstring.

    Raises
    ------
    ValueError
        No final-study rows, missing columns, or several settings of one method.
    """
    _check_columns(runs, RUNS_COLUMNS, "runs.csv")
    final = runs[runs["study"] == "final"].copy()
    if final.empty:
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
    final["standin"] = _as_bool(final["standin"])
    tasks = _ordered_tasks(final["task"])
    models = list(dict.fromkeys(final["model"]))
    groups = {key: group for key, group in final.groupby(["model", "method", "task"])}

    index, cells, best, seed_counts = [], [], [], set()
    for model in models:
        methods = [m for m in METHOD_NAMES if (final["model"].eq(model) & final["method"].eq(m)).any()]
        block = [[_table1_cell(groups.get((model, method, task)), get_task(task).kind == "qa") for task in tasks]
                 for method in methods]
        tops = [max((row[j][1] for row in block if row[j][1] is not None), default=None) for j in range(len(tasks))]
        for method, row in zip(methods, block):
            index.append([model, METHOD_NAMES[method]])
            cells.append([text for text, _, _ in row])
            best.append([key is not None and key == top for (_, key, _), top in zip(row, tops)])
            seed_counts.update(n for _, _, n in row if n)

    standin = [bool(final.loc[final["task"] == task, "standin"].any()) for task in tasks]
    seeds = "–".join(str(n) for n in sorted({min(seed_counts), max(seed_counts)})) if seed_counts else "0"
    by_metric: dict[str, list[str]] = {}
    for task in tasks:
        by_metric.setdefault(get_task(task).metric, []).append(get_task(task).display)
    scores = "; ".join(f"{METRIC_NOTES.get(metric, metric)} for {', '.join(names)}" for metric, names in by_metric.items())
    footnotes = [
        f"Scores: {scores}. Mean ± standard deviation (ddof = 1) over seeds; a cell without ± comes "
        "from a single seed. Bold: best method per model and task (at the precision shown; ties all marked)."
    ] + _standin_footnote([get_task(t).display for t in tasks], standin)
    return Table(
        name="table1",
        caption=f"Performance of Base, CosReg and I-STAR per model and task ({seeds} seeds).",
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
    if group is None:
        return "–", None, 0
    if qa:
        f1, _, n = _mean_std(group["f1"])
        em, _, _ = _mean_std(group["exact_match"])
        if n == 0:
            return "–", None, 0
        em_text = "–" if math.isnan(em) else f"{em:.1f}"
        return f"{f1:.1f}/{em_text}", round(f1, 1), n
    mean, std, n = _mean_std(group["score"] * 100.0)
    if n == 0:
        return "–", None, 0
    text = f"{mean:.1f}" if n == 1 else f"{mean:.1f} ± {std:.1f}"
    return text, round(mean, 1), n


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
    _check_columns(selection, SELECTION_COLUMNS, "selection.csv")
    if selection.empty:
        raise ValueError(
            "selection.csv has no rows (Table 2 needs them): enable studies.search in the config, "
            "run the workflow, then `istar select` and `istar aggregate`"
        )
    duplicated = selection.duplicated(["model", "task"])
    if duplicated.any():
        model, task = selection.loc[duplicated, ["model", "task"]].iloc[0]
        raise ValueError(f"selection.csv has several rows for {model} on {task}; it must hold one per model × task")
    selection = selection.assign(standin=_as_bool(selection["standin"]))
    tasks = _ordered_tasks(selection["task"])
    models = list(dict.fromkeys(selection["model"]))
    rows = selection.set_index(["model", "task"])

    cells = []
    for model in models:
        lams, zetas, row = [], [], []
        for task in tasks:
            if (model, task) not in rows.index:
                row.append("–")
                continue
            lam, zeta = float(rows.at[(model, task), "lam"]), float(rows.at[(model, task), "zeta"])
            lams.append(lam)
            zetas.append(zeta)
            row.append(f"{_g(lam)} | {_g(zeta)}")
        row.append(f"{_fixed(_nanmean(lams))} | {_fixed(_nanmean(zetas))}")
        cells.append(row)

    columns = [get_task(t).display for t in tasks]
    standin = [bool(selection.loc[selection["task"] == task, "standin"].any()) for task in tasks]
    return Table(
        name="table2",
        caption="Chosen I-STAR tuning parameter λ and shrinkage parameter ζ per model and task, as λ | ζ; "
        "Average: mean λ | mean ζ over the tasks shown.",
        index_names=["Model"],
        index=[[model] for model in models],
        columns=columns + ["Average"],
        standin=standin + [False],
        cells=cells,
        best=[[False] * (len(columns) + 1) for _ in models],
        footnotes=_standin_footnote(columns, standin),
    )


def _nanmean(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return math.fsum(values) / len(values) if values else math.nan


def _g(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:g}"


def _fixed(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.2f}"


# --------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------


def render_csv(table: Table) -> str:
    """The grid as CSV (UTF-8 text): headers with ``†``, best cells with a trailing ``*``."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(table.headers("†"))
    for labels, cells, best in zip(table.index, table.cells, table.best):
        writer.writerow(labels + [cell + ("*" if b else "") for cell, b in zip(cells, best)])
    return buffer.getvalue()


_MARKDOWN_SPECIAL = "\\|*_`"


def _markdown_escape(text: str) -> str:
    return "".join("\\" + ch if ch in _MARKDOWN_SPECIAL else ch for ch in text)


def _grouped_index(table: Table) -> list[list[str]]:
    """Row labels with a repeated first label blanked (for Markdown and LaTeX)."""
    if len(table.index_names) < 2:
        return table.index
    return [
        ([""] if i and labels[0] == table.index[i - 1][0] else [labels[0]]) + labels[1:]
        for i, labels in enumerate(table.index)
    ]


def render_markdown(table: Table) -> str:
    """The table as GitHub Markdown: caption in bold, ``**best**`` cells, footnotes below."""
    lines = [f"**{_markdown_escape(table.caption)}**", ""]
    headers = table.headers("†")
    lines.append("| " + " | ".join(_markdown_escape(h) for h in headers) + " |")
    lines.append("|" + "|".join([" --- "] * len(table.index_names) + [" :---: "] * len(table.columns)) + "|")
    for labels, cells, best in zip(_grouped_index(table), table.cells, table.best):
        shown = [f"**{_markdown_escape(c)}**" if b else _markdown_escape(c) for c, b in zip(cells, best)]
        lines.append("| " + " | ".join([_markdown_escape(x) for x in labels] + shown) + " |")
    if table.footnotes:
        lines.append("")
        lines.extend(_markdown_escape(note) + "  " for note in table.footnotes)
    return "\n".join(lines) + "\n"


_LATEX_REPLACEMENTS = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "|": r"$|$",
    "±": r"$\pm$",
    "†": r"$^\dagger$",
    "×": r"$\times$",
    "λ": r"$\lambda$",
    "ζ": r"$\zeta$",
    "—": "---",
    "–": "--",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
}


def latex_escape(text: str) -> str:
    """Escape LaTeX's special characters and spell the Unicode symbols the tables use.

    A hyphen directly before a digit at the start of a number becomes a math minus ``$-$``.
    """
    out = []
    for i, ch in enumerate(text):
        if ch == "-" and i + 1 < len(text) and text[i + 1].isdigit() and (i == 0 or not text[i - 1].isalnum()):
            out.append("$-$")
        else:
            out.append(_LATEX_REPLACEMENTS.get(ch, ch))
    return "".join(out)


def render_latex(table: Table) -> str:
    """The table as a LaTeX ``table`` float with a booktabs ``tabular``; needs ``\\usepackage{booktabs}``."""
    n_index = len(table.index_names)
    spec = "l" * n_index + "c" * len(table.columns)
    headers = table.index_names + [
        latex_escape(c) + (r"$^\dagger$" if s else "") for c, s in zip(table.columns, table.standin)
    ]
    lines = [
        f"% {table.name}: generated by `istar table {table.name}`; needs \\usepackage{{booktabs}}",
        r"\begin{table}[htbp]",
        r"\centering",
        f"\\caption{{{latex_escape(table.caption)}}}",
        f"\\label{{tab:{table.name}}}",
        f"\\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(latex_escape(h) if i < n_index else h for i, h in enumerate(headers)) + r" \\",
        r"\midrule",
    ]
    for i, (labels, cells, best) in enumerate(zip(_grouped_index(table), table.cells, table.best)):
        if i and n_index > 1 and labels[0]:
            lines.append(r"\midrule")
        shown = [f"\\textbf{{{latex_escape(c)}}}" if b else latex_escape(c) for c, b in zip(cells, best)]
        lines.append(" & ".join([latex_escape(x) for x in labels] + shown) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if table.footnotes:
        lines.append(r"\par\smallskip")
        lines.extend(f"{{\\footnotesize {latex_escape(note)}\\par}}" for note in table.footnotes)
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def write_table(table: Table, out_prefix) -> list[Path]:
    """Write ``{out_prefix}.csv``, ``.md`` and ``.tex``, each atomically.

    Parameters
    ----------
    table : Table
    out_prefix : str or Path
        Path without suffix, e.g. ``results/tables/table1``; folders are created.

    Returns
    -------
    list of Path
        The three files written.
    """
    prefix = Path(out_prefix)
    paths = []
    for suffix, render in ((".csv", render_csv), (".md", render_markdown), (".tex", render_latex)):
        path = prefix.with_name(prefix.name + suffix)
        write_text(path, render(table))
        paths.append(path)
    return paths


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``istar table``."""
    parser.add_argument("which", choices=("table1", "table2"), help="table1: performance; table2: chosen λ | ζ")
    parser.add_argument("--runs", type=Path, default=Path("results/aggregate/runs.csv"),
                        help="runs.csv of `istar aggregate` (table1; default: %(default)s)")
    parser.add_argument("--selection", type=Path, default=Path("results/aggregate/selection.csv"),
                        help="selection.csv of `istar aggregate` (table2; default: %(default)s)")
    parser.add_argument("--out-prefix", type=Path, default=None,
                        help="output path without suffix; writes .csv, .md and .tex (default: results/tables/WHICH)")


def _read_csv(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: run `istar aggregate` first (or pass its path)")
    return pd.read_csv(path)


def run_cli(args: argparse.Namespace) -> int:
    """Build the chosen table from its CSV and write it; print the files written."""
    table = table1(_read_csv(args.runs)) if args.which == "table1" else table2(_read_csv(args.selection))
    for path in write_table(table, args.out_prefix or Path("results/tables") / args.which):
        print(path)
    return 0

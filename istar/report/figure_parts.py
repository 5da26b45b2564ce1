"""The parts every figure of :mod:`istar.report.plots` is built from: style, study rows, panels, legends, saving.

Style, shared by all figures
----------------------------
- Colours: each method's colour in :data:`istar.registry.methods.METHODS` (Base grey, CosReg orange,
  I-STAR blue) when a method appears with one λ; when a method appears with several λ (a λ
  sweep), each λ gets a colour of the diverging map :data:`LAMBDA_CMAP`: negative λ blue,
  positive λ red, darker for larger |λ|. Base is always grey.
- One panel per model × task (rows: models, columns: tasks in registry order; a single
  task puts the models side by side), titled ``"{model} — {task display}"``; one legend
  for the whole figure, below the panels.
- Performance is shown ×100 (accuracy, Matthews, Pearson are fractions in ``runs.csv``;
  SQuAD F1 is already a percentage), labelled with its metric, e.g. ``"Accuracy (%)"``.
- Error bars: standard deviation over seeds (ddof = 1); none where a point has one seed.

Missing data raise ``ValueError`` naming the study and the config switch that produces it.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.colors
import pandas as pd
from matplotlib import colormaps
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure

from istar.io.artifacts import atomic_path
from istar.registry.methods import METHOD_NAMES, METHODS
from istar.registry.tasks import TASKS, get_task, ordered_tasks
from istar.report.aggregate_csv import require_columns

__all__ = ["LAMBDA_CMAP", "PERFORMANCE_LABELS", "HIGHLIGHT", "PANEL_SIZE", "study_rows", "with_performance",
           "summary", "yerr", "series_styles", "panels", "panel_series", "error_line", "legend_entries",
           "figure_legend", "notice", "save"]

LAMBDA_CMAP = "RdBu_r"
"""Diverging colour map of λ sweeps: negative λ from its blue half, positive λ from its red half."""

PERFORMANCE_LABELS = {
    "accuracy": "Accuracy (%)",
    "matthews": "Matthews correlation (×100)",
    "pearson": "Pearson correlation (×100)",
    "f1": "F1 (%)",
}
"""Headline metric → y-axis label of performance."""

HIGHLIGHT = "#d62728"
"""Red of the paper's reference lines (best ζ in Fig. 7, global penalty in Fig. 8)."""

PANEL_SIZE = (3.6, 2.9)
"""Width and height (inches) of one model × task panel."""


def study_rows(df: pd.DataFrame, study: str, source: str, value: str, columns=()) -> pd.DataFrame:
    """Rows of ``study`` with a value in column ``value``, or a ValueError saying how to get them."""
    require_columns(df, ("study", "model", "task", "method", "lam", "seed", value, *columns), source)
    rows = df[df["study"] == study]
    if rows.empty:
        raise ValueError(
            f"no rows with study == {study!r} in {source}: enable studies.{study} in the config, "
            "run the workflow, then `istar aggregate`"
        )
    rows = rows.dropna(subset=[value])
    if rows.empty:
        raise ValueError(
            f"the rows with study == {study!r} in {source} have no {value!r} values: "
            "measure those runs (`istar measure`) before `istar aggregate`"
        )
    return rows.assign(lam=rows["lam"].fillna(0.0))


def with_performance(runs: pd.DataFrame) -> pd.DataFrame:
    """Add ``performance``: the headline score ×100, except SQuAD (already a percentage)."""
    scale = runs["task"].map(lambda key: get_task(key).percent_scale)
    return runs.assign(performance=runs["score"] * scale)


def isoscore_label(rows: pd.DataFrame, name: str = "IsoScore*") -> str:
    """The axis label of IsoScore* values, with the ζ their analysis used (``analysis_zeta`` of runs.csv or
    layers.csv; records written before that column name none): a figure says what it plots, never the config's ζ.
    Rows measured with several ζ are refused."""
    zetas = sorted(set(rows["analysis_zeta"].dropna())) if "analysis_zeta" in rows else []
    if len(zetas) > 1:
        raise ValueError(f"the rows plotted were measured with several ζ ({', '.join(f'{z:g}' for z in zetas)}): "
                         "measure every run with the analysis's ζ (the workflow's measure jobs) and aggregate again")
    return f"{name} (ζ = {zetas[0]:g})" if zetas else name


def summary(df: pd.DataFrame, by: list[str], values: list[str]) -> pd.DataFrame:
    """Mean and std (ddof = 1; NaN for one seed) of ``values`` per ``by``: columns ``{v}_mean``, ``{v}_std``."""
    grouped = df.groupby(by, sort=True)
    columns = {}
    for value in values:
        columns[f"{value}_mean"] = grouped[value].mean()
        columns[f"{value}_std"] = grouped[value].std(ddof=1)
    return pd.DataFrame(columns).reset_index()


def yerr(std: pd.Series):
    """Error bar lengths, or None when no point has more than one seed (std NaN)."""
    std = pd.Series(std, dtype=float)
    return None if std.isna().all() else std.fillna(0.0).to_numpy()


def _format_lambda(lam: float) -> str:
    return f"{lam:+g}".replace("-", "−")


def series_styles(keys) -> dict[tuple[str, float], tuple[str, str]]:
    """(method, λ) → (label, colour) following the module's colour rules (a method without λ: its label and colour)."""
    keys = sorted(set(keys), key=lambda k: (METHOD_NAMES.index(k[0]), k[1]))
    lams_per_method = {m: {lam for mm, lam in keys if mm == m} for m, _ in keys}
    max_abs = max((abs(lam) for m, lam in keys if METHODS[m].takes("lam")), default=1.0) or 1.0
    cmap = colormaps[LAMBDA_CMAP]
    styles = {}
    for method, lam in keys:
        if not METHODS[method].takes("lam"):
            styles[(method, lam)] = (METHODS[method].label, METHODS[method].colour)
            continue
        label = f"{METHODS[method].label} λ = {_format_lambda(lam)}"
        if len(lams_per_method[method]) == 1 or lam == 0:
            styles[(method, lam)] = (label, METHODS[method].colour)
        else:
            shade = 0.3 * (1.0 - abs(lam) / max_abs)
            styles[(method, lam)] = (label, matplotlib.colors.to_hex(cmap(shade if lam < 0 else 1.0 - shade)))
    return styles


def panels(df: pd.DataFrame, panel_size: tuple[float, float] = PANEL_SIZE) -> tuple[Figure, dict]:
    """A figure with one titled panel per (model, task) in ``df``.

    Rows are models and columns tasks (registry order); with a single task the models sit
    side by side in one row, as in the paper's Fig. 4–8. Returns the figure and a dict
    (model, task) → axes.
    """
    models = list(dict.fromkeys(df["model"]))
    tasks = ordered_tasks(df["task"])
    present = set(zip(df["model"], df["task"]))
    if len(tasks) == 1:
        places = {(model, tasks[0]): (0, i) for i, model in enumerate(models)}
        shape = (1, len(models))
    else:
        places = {(model, task): (i, j) for i, model in enumerate(models) for j, task in enumerate(tasks)}
        shape = (len(models), len(tasks))
    fig = Figure(figsize=(panel_size[0] * shape[1], panel_size[1] * shape[0] + 0.7), layout="constrained")
    grid = fig.add_gridspec(*shape)
    axes = {}
    for (model, task), (i, j) in places.items():
        if (model, task) in present:
            ax = fig.add_subplot(grid[i, j])
            ax.set_title(f"{model} — {TASKS[task].display}", fontsize="medium")
            ax.grid(alpha=0.3)
            axes[(model, task)] = ax
    return fig, axes


def panel_series(summary: pd.DataFrame, axes: dict):
    """Per panel of :func:`panels`: ((model, task), axes, the panel's rows of ``summary``, its series).

    The series are (label, colour, rows) per (method, λ) of ``summary`` that has rows in the
    panel, in the order and style of :func:`series_styles`.
    """
    styles = series_styles(zip(summary["method"], summary["lam"]))
    for (model, task), ax in axes.items():
        panel = summary[(summary["model"] == model) & (summary["task"] == task)]
        series = []
        for (method, lam), (label, colour) in styles.items():
            rows = panel[(panel["method"] == method) & (panel["lam"] == lam)]
            if not rows.empty:
                series.append((label, colour, rows))
        yield (model, task), ax, panel, series


def error_line(ax, rows: pd.DataFrame, x: str, value: str, colour: str, label: str, markersize: float = 4) -> None:
    """One line of ``{value}_mean`` against column ``x`` of ``rows``, error bars ``{value}_std`` (see :func:`yerr`)."""
    ax.errorbar(rows[x], rows[f"{value}_mean"], yerr=yerr(rows[f"{value}_std"]), marker="o", markersize=markersize,
                capsize=2, linewidth=1.4, color=colour, label=label)


def legend_entries(axes) -> dict[str, object]:
    """Label → handle over ``axes``, each label once: data series (error bars) first, reference lines after."""
    series, references = {}, {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            (series if isinstance(handle, ErrorbarContainer) else references).setdefault(label, handle)
    return series | {label: handle for label, handle in references.items() if label not in series}


def figure_legend(fig: Figure, axes, markerscale: float = 1.0) -> None:
    """One legend below the panels, with as many columns as the figure's width holds."""
    entries = legend_entries(axes)
    # a column: the marker and about 0.065 inch per character of the longest label, at least 2.2 inches
    column = max(2.2, 0.5 + 0.065 * max((len(label) for label in entries), default=0))
    ncols = max(1, min(len(entries), int(fig.get_figwidth() // column)))
    fig.legend(list(entries.values()), list(entries), loc="outside lower center", ncols=ncols, fontsize="small",
               frameon=False, markerscale=markerscale)


def notice(text: str) -> Figure:
    """A figure that says, in ``text``, why there is nothing to draw (the config asked for it, the data hold none)."""
    fig = Figure(figsize=(7.2, 1.6), layout="constrained")
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_title(text, fontsize="medium")
    return fig


def save(fig: Figure, out_png) -> tuple[Path, Path]:
    """Write ``fig`` as PNG (150 dpi) and as PDF with the same stem, each atomically.

    Parameters
    ----------
    fig : Figure
    out_png : str or Path
        The PNG path; the PDF goes next to it (``fig3.png`` → ``fig3.pdf``).

    Returns
    -------
    (Path, Path)
        The PNG and PDF written.
    """
    png = Path(out_png).with_suffix(".png")
    pdf = png.with_suffix(".pdf")
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=150)
    with atomic_path(pdf) as tmp:
        fig.savefig(tmp, format="pdf", metadata={"CreationDate": None})
    return png, pdf



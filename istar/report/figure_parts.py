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
from matplotlib.ticker import MaxNLocator

from istar.io.artifacts import atomic_path
from istar.registry.methods import METHOD_NAMES, METHODS
from istar.registry.tasks import TASKS, get_task, ordered_tasks
from istar.report.aggregate_csv import require_columns

__all__ = ["LAMBDA_CMAP", "PERFORMANCE_LABELS", "HIGHLIGHT", "PANEL_SIZE", "study_rows", "with_performance",
           "summary", "yerr", "sequence_colours", "series_styles", "panels", "panel_series", "error_lines", "legend_entries",
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
    stats = df.groupby(by, sort=True)[values].agg(["mean", "std"])  # pandas' std: ddof = 1
    stats.columns = [f"{value}_{stat}" for value, stat in stats.columns]
    return stats.reset_index()


def yerr(std: pd.Series):
    """Error bar lengths, or None when no point has more than one seed (std NaN)."""
    std = pd.Series(std, dtype=float)
    return None if std.isna().all() else std.fillna(0.0).to_numpy()


def sequence_colours(keys) -> dict:
    """Key → colour along viridis (dark to light, its brightest 15 % left out), in the order given: a series per
    ζ of Fig. 2, a line per model of the profiles."""
    keys = list(dict.fromkeys(keys))
    return {key: colormaps["viridis"](0.85 * i / max(len(keys) - 1, 1)) for i, key in enumerate(keys)}


def series_styles(keys) -> dict[tuple[str, float], tuple[str, str]]:
    """(method, λ) → (label, colour) following the module's colour rules (a method without λ: its label and colour)."""
    keys = sorted(set(keys), key=lambda k: (METHOD_NAMES.index(k[0]), k[1]))
    lams_per_method = {m: {lam for mm, lam in keys if mm == m} for m, _ in keys}
    max_abs = max((abs(lam) for m, lam in keys if METHODS[m].takes("lam")), default=1.0) or 1.0

    def style(method: str, lam: float) -> tuple[str, str]:
        entry = METHODS[method]
        if not entry.takes("lam"):
            return entry.label, entry.colour
        label = f"{entry.label} λ = " + f"{lam:+g}".replace("-", "−")  # a typographic minus
        if len(lams_per_method[method]) == 1 or lam == 0:
            return label, entry.colour
        shade = 0.3 * (1.0 - abs(lam) / max_abs)
        return label, matplotlib.colors.to_hex(colormaps[LAMBDA_CMAP](shade if lam < 0 else 1.0 - shade))

    return {key: style(*key) for key in keys}


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
    axes = {cell: fig.add_subplot(grid[place]) for cell, place in places.items() if cell in present}
    for (model, task), ax in axes.items():
        ax.set_title(f"{model} — {TASKS[task].display}", fontsize="medium")
        ax.grid(alpha=0.3)
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


def error_lines(rows: pd.DataFrame, x: str, value: str, xlabel: str, ylabel: str | None = None, *,
                integer_x: bool = True, markersize: float = 4, name=None, decorate=None) -> Figure:
    """A panel per model × task of ``rows`` with, per (method, λ), the mean of ``value`` over seeds against column
    ``x``, error bars its std (:func:`yerr`); one legend below.

    ``ylabel``: the y label, None for the task's performance label; ``integer_x``: integer ticks on x;
    ``name(label, line)``: the legend label of a series from its style's label and its summary rows;
    ``decorate(ax, model, task, panel)``: draws a panel's reference marks (``panel``: its summary rows,
    ``{value}_mean`` and ``{value}_std`` per (method, λ, x))."""
    summary_rows = summary(rows, ["model", "task", "method", "lam", x], [value])
    fig, axes = panels(rows)
    for (model, task), ax, panel, series in panel_series(summary_rows, axes):
        for label, colour, line in series:
            ax.errorbar(line[x], line[f"{value}_mean"], yerr=yerr(line[f"{value}_std"]), marker="o",
                        markersize=markersize, capsize=2, linewidth=1.4, color=colour,
                        label=name(label, line) if name else label)
        if decorate:
            decorate(ax, model, task, panel)
        ax.set(xlabel=xlabel, ylabel=PERFORMANCE_LABELS[get_task(task).metric] if ylabel is None else ylabel)
        if integer_x:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    figure_legend(fig, axes.values())
    return fig


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
    for path, options in ((png, {"dpi": 150}), (pdf, {"metadata": {"CreationDate": None}})):  # the PDF's bytes: no date
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=path.suffix[1:], **options)
    return png, pdf



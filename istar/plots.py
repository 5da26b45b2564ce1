"""The paper's figures: Fig. 2 from a simulation, Fig. 3–8 from the aggregate CSVs.

Every figure function takes DataFrames and returns a :class:`matplotlib.figure.Figure`
(built without pyplot, so no display and no global state are needed); :func:`save` writes it
as PNG (150 dpi) and PDF side by side, each atomically.

Style, shared by all figures
----------------------------
- Colours: :data:`METHOD_COLORS` (Base grey, CosReg orange, I-STAR blue) when a method
  appears with one λ; when a method appears with several λ (a λ sweep), each λ gets a colour
  of the diverging map :data:`LAMBDA_CMAP`: negative λ blue, positive λ red, darker for larger
  |λ|. Base is always grey.
- One panel per model × task (rows: models, columns: tasks in registry order; a single
  task puts the models side by side), titled ``"{model} — {task display}"``; one legend
  for the whole figure, below the panels.
- Performance is shown ×100 (accuracy, Matthews, Pearson are fractions in ``runs.csv``;
  SQuAD F1 is already a percentage), labelled with its metric, e.g. ``"Accuracy (%)"``.
- Error bars: standard deviation over seeds (ddof = 1); none where a point has one seed.

Missing data raise ``ValueError`` naming the study and the config switch that produces it.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib.colors
import pandas as pd
import torch
from matplotlib import colormaps
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from istar.artifacts import atomic_path
from istar.isotropy import isoscore_star_from_covariance
from istar.tasks import TASKS, get_task

__all__ = [
    "METHOD_COLORS",
    "METHOD_LABELS",
    "LAMBDA_CMAP",
    "FIG2_BATCH_SIZES",
    "FIG2_ZETAS",
    "fig2_variances",
    "fig2_true_value",
    "fig2_data",
    "fig2",
    "fig3",
    "fig4",
    "fig5",
    "fig6",
    "fig7",
    "fig8",
    "save",
]

METHOD_COLORS = {"base": "#7f7f7f", "cosreg": "#ff7f0e", "istar": "#1f77b4"}
"""Method key → colour: Base grey, CosReg orange, I-STAR blue."""

METHOD_LABELS = {"base": "Base", "cosreg": "CosReg", "istar": "I-STAR"}
"""Method key → the name shown in legends (and in the tables)."""

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

FIG2_BATCH_SIZES = tuple(2**k for k in range(6, 18))
"""64 … 131,072: the sample IsoScore is within 0.01 of the true value only from ≈ 65,536 points on."""

FIG2_ZETAS = (0.0, 0.2, 0.4, 0.6, 0.8)

_PANEL_SIZE = (3.6, 2.9)


# --------------------------------------------------------------------------------------
# Fig. 2: IsoScore* of mini-batches vs batch size (simulation)
# --------------------------------------------------------------------------------------


def fig2_variances(dim: int = 768) -> torch.Tensor:
    """Variances of the synthetic Gaussian of Fig. 2: diag(10, 6, 4, 4, 1, …, 1) (docs/method.md §2)."""
    if dim < 5:
        raise ValueError(f"the Fig. 2 Gaussian needs dim ≥ 5; got {dim}")
    variances = torch.ones(dim, dtype=torch.float64)
    variances[:4] = torch.tensor([10.0, 6.0, 4.0, 4.0], dtype=torch.float64)
    return variances


def fig2_true_value(dim: int = 768) -> float:
    """IsoScore* of the Fig. 2 distribution itself: ((tr Σ)²/‖Σ‖_F² − 1)/(d − 1) ≈ 0.867 for d = 768."""
    return float(isoscore_star_from_covariance(torch.diag(fig2_variances(dim))))


def _nested_covariances(sizes: list[int], scale: torch.Tensor, generator: torch.Generator, chunk: int = 16_384):
    """Yield (n, Σ_n) for each n in ``sizes`` (ascending): Σ_n the unbiased covariance of the first n rows.

    Rows of N(0, diag(scale²)) are drawn as Z·scale (float32, ``chunk`` rows at a time); the
    Gram matrix Σ xxᵀ and the sum Σ x are accumulated in float64, and
    Σ_n = (Σ xxᵀ − n·x̄x̄ᵀ)/(n − 1). (The distribution has mean zero, so nothing cancels.)
    """
    d = scale.numel()
    gram = torch.zeros(d, d, dtype=torch.float64)
    total = torch.zeros(d, dtype=torch.float64)
    drawn = 0
    for size in sizes:
        for start in range(drawn, size, chunk):
            rows = torch.randn(min(chunk, size - start), d, generator=generator).mul_(scale)
            gram += torch.mm(rows.T, rows).double()
            total += rows.sum(dim=0).double()
        drawn = size
        mean = total / size
        yield size, (gram - size * torch.outer(mean, mean)) / (size - 1)


def fig2_data(batch_sizes=FIG2_BATCH_SIZES, zetas=FIG2_ZETAS, n_shrinkage: int = 75_000, seed: int = 0,
              repeats: int = 3, dim: int = 768) -> pd.DataFrame:
    """IsoScore* of mini-batches of the Fig. 2 Gaussian against batch size, for several ζ.

    Rows are drawn as X = Z·sqrt(variances), Z standard normal (torch, float32). Σ_S is the
    covariance of ``n_shrinkage`` further points of the same distribution (disjoint from
    every mini-batch). Each repeat draws one sample of the largest batch size; the smaller
    batches are its leading rows (nested samples, so one pass of covariance accumulation
    serves every size). The spread over repeats is the spread of each size's estimate.

    Parameters
    ----------
    batch_sizes : sequence of int
        Mini-batch sizes |X| (≥ 2); sorted and de-duplicated.
    zetas : sequence of float
        Shrinkage weights in [0, 1]; ζ = 0 is vanilla IsoScore.
    n_shrinkage : int
        Points behind Σ_S (the paper: 75,000). Not drawn when every ζ is 0.
    seed : int
        Seed of the torch generator.
    repeats : int
        Independent samples per batch size.
    dim : int
        Dimension d (the paper: 768).

    Returns
    -------
    DataFrame
        Columns ``batch_size``, ``zeta``, ``mean``, ``std`` (over repeats, ddof = 1; NaN for
        one repeat), sorted by ζ then batch size.
    """
    sizes = sorted({int(n) for n in batch_sizes})
    if not sizes or sizes[0] < 2:
        raise ValueError(f"batch sizes must be integers ≥ 2; got {list(batch_sizes)}")
    if repeats < 1:
        raise ValueError(f"repeats must be ≥ 1; got {repeats}")
    zetas = [float(z) for z in zetas]
    generator = torch.Generator().manual_seed(seed)
    scale = fig2_variances(dim).sqrt().float()
    sigma_s = None
    if any(z > 0 for z in zetas):
        (_, sigma_s), = _nested_covariances([n_shrinkage], scale, generator)
    records = []
    for repeat in range(repeats):
        for size, cov in _nested_covariances(sizes, scale, generator):
            records += [
                {"batch_size": size, "zeta": zeta, "repeat": repeat,
                 "score": float(isoscore_star_from_covariance(cov, zeta, sigma_s))}
                for zeta in zetas
            ]
    scores = pd.DataFrame(records).groupby(["zeta", "batch_size"])["score"]
    return pd.DataFrame({"mean": scores.mean(), "std": scores.std(ddof=1)}).reset_index()[
        ["batch_size", "zeta", "mean", "std"]
    ]


def fig2(df: pd.DataFrame, true_value: float, dim: int = 768) -> Figure:
    """Draw Fig. 2: IsoScore* vs batch size, one line per ζ, the true value dashed.

    Parameters
    ----------
    df : DataFrame
        Output of :func:`fig2_data`.
    true_value : float
        IsoScore* of the distribution (:func:`fig2_true_value`), drawn as a dashed line.
    dim : int
        Dimension of the points; a dotted vertical line marks |X| = d.

    Returns
    -------
    Figure
        One axes; one error-bar series per ζ plus the two reference lines.
    """
    _require_columns(df, ("batch_size", "zeta", "mean", "std"), "the Fig. 2 data", "make it with fig2_data()")
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    ax = fig.add_subplot()
    zetas = sorted(df["zeta"].unique())
    cmap = colormaps["viridis"]
    for i, zeta in enumerate(zetas):
        part = df[df["zeta"] == zeta].sort_values("batch_size")
        label = f"ζ = {zeta:g}" + (" (IsoScore)" if zeta == 0 else "")
        ax.errorbar(part["batch_size"], part["mean"], yerr=_yerr(part["std"]), marker="o", markersize=3.5,
                    capsize=2, linewidth=1.3, color=cmap(0.85 * i / max(1, len(zetas) - 1)), label=label)
    ax.axhline(true_value, color="black", linestyle="--", linewidth=1, label=f"true IsoScore* = {true_value:.3f}")
    ax.axvline(dim, color="#999999", linestyle=":", linewidth=1, label=f"|X| = d = {dim}")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    ax.set_ylim(0, 1)
    ax.set_xlabel("Batch size |X| (points, log scale)")
    ax.set_ylabel("IsoScore* of the batch")
    ax.set_title(f"IsoScore* of mini-batches of a {dim}-d Gaussian")
    ax.grid(alpha=0.3)
    entries = _legend_entries([ax])
    ax.legend(list(entries.values()), list(entries), loc="lower right", fontsize="small")
    return fig


# --------------------------------------------------------------------------------------
# shared helpers of Fig. 3–8
# --------------------------------------------------------------------------------------


def _require_columns(df: pd.DataFrame, columns, source: str, hint: str = "was it written by `istar aggregate`?") -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{source} lacks the column(s) {', '.join(missing)}; {hint}")


def _study_rows(df: pd.DataFrame, study: str, source: str, value: str, columns=()) -> pd.DataFrame:
    """Rows of ``study`` with a value in column ``value``, or a ValueError saying how to get them."""
    _require_columns(df, ("study", "model", "task", "method", "lam", "seed", value, *columns), source)
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
            "run the analysis step (`istar analyze`) on those runs before `istar aggregate`"
        )
    return rows.assign(lam=rows["lam"].fillna(0.0))


def _with_performance(runs: pd.DataFrame) -> pd.DataFrame:
    """Add ``performance``: the headline score ×100, except SQuAD (already a percentage)."""
    scale = runs["task"].map(lambda key: 1.0 if get_task(key).kind == "qa" else 100.0)
    return runs.assign(performance=runs["score"] * scale)


def _summary(df: pd.DataFrame, by: list[str], values: list[str]) -> pd.DataFrame:
    """Mean and std (ddof = 1; NaN for one seed) of ``values`` per ``by``: columns ``{v}_mean``, ``{v}_std``."""
    grouped = df.groupby(by, sort=True)
    columns = {}
    for value in values:
        columns[f"{value}_mean"] = grouped[value].mean()
        columns[f"{value}_std"] = grouped[value].std(ddof=1)
    return pd.DataFrame(columns).reset_index()


def _yerr(std: pd.Series):
    """Error bar lengths, or None when no point has more than one seed (std NaN)."""
    std = pd.Series(std, dtype=float)
    return None if std.isna().all() else std.fillna(0.0).to_numpy()


def _format_lambda(lam: float) -> str:
    return f"{lam:+g}".replace("-", "−")


def _series_styles(keys) -> dict[tuple[str, float], tuple[str, str]]:
    """(method, λ) → (label, colour) following the module's colour rules."""
    keys = sorted(set(keys), key=lambda k: (list(METHOD_LABELS).index(k[0]), k[1]))
    lams_per_method = {m: {lam for mm, lam in keys if mm == m} for m, _ in keys}
    max_abs = max((abs(lam) for m, lam in keys if m != "base"), default=1.0) or 1.0
    cmap = colormaps[LAMBDA_CMAP]
    styles = {}
    for method, lam in keys:
        if method == "base":
            styles[(method, lam)] = ("Base", METHOD_COLORS["base"])
            continue
        label = f"{METHOD_LABELS[method]} λ = {_format_lambda(lam)}"
        if len(lams_per_method[method]) == 1 or lam == 0:
            styles[(method, lam)] = (label, METHOD_COLORS[method])
        else:
            shade = 0.3 * (1.0 - abs(lam) / max_abs)
            styles[(method, lam)] = (label, matplotlib.colors.to_hex(cmap(shade if lam < 0 else 1.0 - shade)))
    return styles


def _panels(df: pd.DataFrame, panel_size: tuple[float, float] = _PANEL_SIZE) -> tuple[Figure, dict]:
    """A figure with one titled panel per (model, task) in ``df``.

    Rows are models and columns tasks (registry order); with a single task the models sit
    side by side in one row, as in the paper's Fig. 4–8. Returns the figure and a dict
    (model, task) → axes.
    """
    for key in df["task"].unique():
        get_task(key)
    models = list(dict.fromkeys(df["model"]))
    tasks = [key for key in TASKS if key in set(df["task"])]
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


def _legend_entries(axes) -> dict[str, object]:
    """Label → handle over ``axes``, each label once: data series (error bars) first, reference lines after."""
    series, references = {}, {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            (series if isinstance(handle, ErrorbarContainer) else references).setdefault(label, handle)
    return series | {label: handle for label, handle in references.items() if label not in series}


def _figure_legend(fig: Figure, axes, markerscale: float = 1.0) -> None:
    """One legend below the panels, with as many columns as the figure's width holds."""
    entries = _legend_entries(axes)
    ncols = max(1, min(len(entries), int(fig.get_figwidth() // 2.2)))
    fig.legend(list(entries.values()), list(entries), loc="outside lower center", ncols=ncols, fontsize="small",
               frameon=False, markerscale=markerscale)


def _layer_lines(layers: pd.DataFrame, study: str, value: str, ylabel: str) -> Figure:
    """Fig. 5 / Fig. 6: ``value`` per hidden state, one line per (method, λ), panel per model × task."""
    rows = _study_rows(layers, study, "layers.csv", value, ("hidden_state",))
    summary = _summary(rows, ["model", "task", "method", "lam", "hidden_state"], [value])
    styles = _series_styles(zip(summary["method"], summary["lam"]))
    fig, axes = _panels(rows)
    for (model, task), ax in axes.items():
        panel = summary[(summary["model"] == model) & (summary["task"] == task)]
        for key, (label, colour) in styles.items():
            line = panel[(panel["method"] == key[0]) & (panel["lam"] == key[1])]
            if line.empty:
                continue
            ax.errorbar(line["hidden_state"], line[f"{value}_mean"], yerr=_yerr(line[f"{value}_std"]), marker="o",
                        markersize=3.5, capsize=2, linewidth=1.4, color=colour, label=label)
        ax.set_xlabel("Layer (0 = embeddings)")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _figure_legend(fig, axes.values())
    return fig


# --------------------------------------------------------------------------------------
# Fig. 3–8
# --------------------------------------------------------------------------------------


def fig3(runs: pd.DataFrame, analysis_zeta: float = 0.2) -> Figure:
    """Fig. 3: IsoScore* (x) vs performance (y) across the λ sweep.

    Parameters
    ----------
    runs : DataFrame
        ``runs.csv``; rows with ``study == "lambda_sweep"`` and an ``isoscore_star`` value.
    analysis_zeta : float
        ζ with which the analysis computed IsoScore* (for the axis label).

    Returns
    -------
    Figure
        One panel per model × task; per panel one error-bar point (both ways, std over
        seeds) per (method, λ), coloured and labelled by λ.
    """
    rows = _with_performance(_study_rows(runs, "lambda_sweep", "runs.csv", "isoscore_star", ("score",)))
    summary = _summary(rows, ["model", "task", "method", "lam"], ["isoscore_star", "performance"])
    styles = _series_styles(zip(summary["method"], summary["lam"]))
    fig, axes = _panels(rows)
    for (model, task), ax in axes.items():
        panel = summary[(summary["model"] == model) & (summary["task"] == task)]
        for key, (label, colour) in styles.items():
            point = panel[(panel["method"] == key[0]) & (panel["lam"] == key[1])]
            if point.empty:
                continue
            ax.errorbar(point["isoscore_star_mean"], point["performance_mean"], xerr=_yerr(point["isoscore_star_std"]),
                        yerr=_yerr(point["performance_std"]), fmt="o", markersize=5, capsize=2, color=colour,
                        label=label)
        ax.set_xlabel(f"IsoScore* (ζ = {analysis_zeta:g})")
        ax.set_ylabel(PERFORMANCE_LABELS[get_task(task).metric])
    _figure_legend(fig, axes.values())
    return fig


def fig4(dims: pd.DataFrame) -> Figure:
    """Fig. 4: per-dimension mean of last-layer activations, CosReg λ = −1 and +1 vs Base.

    Parameters
    ----------
    dims : DataFrame
        ``dims.csv``; rows with ``study == "cosreg_means"``.

    Returns
    -------
    Figure
        One panel per model × task; one series of dots per (method, λ): the mean activation of
        each dimension, averaged over seeds (dots, not lines, so that series that share an
        outlier dimension stay distinguishable).
    """
    rows = _study_rows(dims, "cosreg_means", "dims.csv", "mean", ("dim",))
    means = rows.groupby(["model", "task", "method", "lam", "dim"])["mean"].mean().reset_index()
    styles = _series_styles(zip(means["method"], means["lam"]))
    fig, axes = _panels(rows, panel_size=(5.2, 3.4))
    for (model, task), ax in axes.items():
        panel = means[(means["model"] == model) & (means["task"] == task)]
        for key, (label, colour) in styles.items():
            line = panel[(panel["method"] == key[0]) & (panel["lam"] == key[1])]
            if not line.empty:
                ax.plot(line["dim"], line["mean"], linestyle="none", marker="o", markersize=2.2, alpha=0.8,
                        color=colour, label=label)
        ax.set_xlabel("Dimension index")
        ax.set_ylabel("Mean activation (last layer)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _figure_legend(fig, axes.values(), markerscale=3.0)
    return fig


def fig5(layers: pd.DataFrame) -> Figure:
    """Fig. 5: TwoNN intrinsic dimension of the [CLS] vectors per layer, one line per λ plus Base.

    Parameters
    ----------
    layers : DataFrame
        ``layers.csv``; rows with ``study == "twonn"`` and a ``twonn_cls`` value.

    Returns
    -------
    Figure
        One panel per model × task; one error-bar line (std over seeds) per (method, λ).
    """
    return _layer_lines(layers, "twonn", "twonn_cls", "Intrinsic dimension (TwoNN)")


def fig6(layers: pd.DataFrame, analysis_zeta: float = 0.2) -> Figure:
    """Fig. 6: IsoScore* per layer for λ = −1, +1 and Base.

    Parameters
    ----------
    layers : DataFrame
        ``layers.csv``; rows with ``study == "layerwise"`` and an ``isoscore_star`` value.
    analysis_zeta : float
        ζ with which the analysis computed IsoScore* (for the axis label).

    Returns
    -------
    Figure
        One panel per model × task; one error-bar line (std over seeds) per (method, λ).
    """
    return _layer_lines(layers, "layerwise", "isoscore_star", f"IsoScore* (ζ = {analysis_zeta:g})")


def fig7(runs: pd.DataFrame) -> Figure:
    """Fig. 7: performance vs ζ, the best ζ marked by a red dashed vertical line.

    Parameters
    ----------
    runs : DataFrame
        ``runs.csv``; rows with ``study == "zeta_sweep"`` and a ``zeta`` value.

    Returns
    -------
    Figure
        One panel per model × task; one error-bar line per λ and one vertical line at the ζ
        of the highest mean performance.
    """
    rows = _with_performance(_study_rows(runs, "zeta_sweep", "runs.csv", "score", ("zeta",)).dropna(subset=["zeta"]))
    if rows.empty:
        raise ValueError("the rows with study == 'zeta_sweep' in runs.csv have no zeta values (no I-STAR runs)")
    summary = _summary(rows, ["model", "task", "method", "lam", "zeta"], ["performance"])
    styles = _series_styles(zip(summary["method"], summary["lam"]))
    fig, axes = _panels(rows)
    for (model, task), ax in axes.items():
        panel = summary[(summary["model"] == model) & (summary["task"] == task)]
        for key, (label, colour) in styles.items():
            line = panel[(panel["method"] == key[0]) & (panel["lam"] == key[1])]
            if not line.empty:
                ax.errorbar(line["zeta"], line["performance_mean"], yerr=_yerr(line["performance_std"]), marker="o",
                            markersize=4, capsize=2, linewidth=1.4, color=colour, label=label)
        best = float(panel.loc[panel["performance_mean"].idxmax(), "zeta"])
        ax.axvline(best, color=HIGHLIGHT, linestyle="--", linewidth=1.2, label="best ζ")
        ax.text(best, 0.02, f" ζ = {best:g}", color=HIGHLIGHT, fontsize="small", ha="left", va="bottom",
                transform=ax.get_xaxis_transform())
        ax.set_xlabel("Shrinkage parameter ζ")
        ax.set_ylabel(PERFORMANCE_LABELS[get_task(task).metric])
    _figure_legend(fig, axes.values())
    return fig


def fig8(runs: pd.DataFrame) -> Figure:
    """Fig. 8: performance with I-STAR on one layer at a time vs the global penalty.

    Parameters
    ----------
    runs : DataFrame
        ``runs.csv``; rows with ``study == "single_layer"``: ``layer`` = the penalised layer,
        or NaN for the global penalty on all layers.

    Returns
    -------
    Figure
        One panel per model × task; one error-bar line over the penalised layer per λ, and
        the global penalty's mean as a red dashed horizontal line (with a band of ± its std
        over seeds when there are several).
    """
    rows = _with_performance(_study_rows(runs, "single_layer", "runs.csv", "score", ("layer",)))
    single = rows.dropna(subset=["layer"])
    if single.empty:
        raise ValueError(
            "the rows with study == 'single_layer' in runs.csv have no single-layer runs (layer is NaN "
            "everywhere): list layers under studies.single_layer in the config"
        )
    summary = _summary(single, ["model", "task", "method", "lam", "layer"], ["performance"])
    overall = _summary(rows[rows["layer"].isna()], ["model", "task"], ["performance"])
    styles = _series_styles(zip(summary["method"], summary["lam"]))
    fig, axes = _panels(single)
    for (model, task), ax in axes.items():
        panel = summary[(summary["model"] == model) & (summary["task"] == task)]
        for key, (label, colour) in styles.items():
            line = panel[(panel["method"] == key[0]) & (panel["lam"] == key[1])]
            if not line.empty:
                ax.errorbar(line["layer"], line["performance_mean"], yerr=_yerr(line["performance_std"]), marker="o",
                            markersize=4, capsize=2, linewidth=1.4, color=colour, label=f"{label} on one layer")
        reference = overall[(overall["model"] == model) & (overall["task"] == task)]
        if not reference.empty:
            mean, std = float(reference["performance_mean"].iloc[0]), float(reference["performance_std"].iloc[0])
            ax.axhline(mean, color=HIGHLIGHT, linestyle="--", linewidth=1.2, label="global penalty (all layers)")
            if not math.isnan(std):
                ax.axhspan(mean - std, mean + std, color=HIGHLIGHT, alpha=0.1, linewidth=0,
                           label="global penalty ± std over seeds")
        ax.set_xlabel("Penalised layer")
        ax.set_ylabel(PERFORMANCE_LABELS[get_task(task).metric])
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _figure_legend(fig, axes.values())
    return fig


# --------------------------------------------------------------------------------------
# output and command line
# --------------------------------------------------------------------------------------


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


FIGURES = {
    "fig3": ("runs.csv", fig3),
    "fig4": ("dims.csv", fig4),
    "fig5": ("layers.csv", fig5),
    "fig6": ("layers.csv", fig6),
    "fig7": ("runs.csv", fig7),
    "fig8": ("runs.csv", fig8),
}
"""Figure name → the aggregate CSV it reads and the function that draws it."""


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``istar figure``."""
    parser.add_argument("which", choices=("fig2", *FIGURES), help="the paper's figure to draw")
    parser.add_argument("--aggregate-dir", type=Path, default=Path("results/aggregate"),
                        help="folder of runs.csv, layers.csv and dims.csv (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None,
                        help="PNG path; the PDF goes next to it (default: results/figures/WHICH.png)")
    parser.add_argument("--analysis-zeta", type=float, default=0.2,
                        help="ζ of the IsoScore* analysis, for axis labels of fig3/fig6 (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="fig2: seed of the simulation (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="fig2: samples per batch size (default: %(default)s)")


def run_cli(args: argparse.Namespace) -> int:
    """Draw the chosen figure and write its PNG and PDF; print the files written."""
    if args.which == "fig2":
        fig = fig2(fig2_data(seed=args.seed, repeats=args.repeats), fig2_true_value())
    else:
        name, draw = FIGURES[args.which]
        path = args.aggregate_dir / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: run `istar aggregate` first (or pass --aggregate-dir)")
        frame = pd.read_csv(path)
        fig = draw(frame, args.analysis_zeta) if args.which in {"fig3", "fig6"} else draw(frame)
    for written in save(fig, args.out or Path("results/figures") / f"{args.which}.png"):
        print(written)
    return 0

"""The paper's figures: Fig. 2 from the stability simulation's CSV, Fig. 3–8 (and Σ_S across
fine-tuning) from the aggregate CSVs.

Every figure function takes DataFrames and returns a :class:`matplotlib.figure.Figure`
(built without pyplot, so no display and no global state are needed);
:func:`istar.report.figure_parts.save` writes it as PNG and PDF. Which CSV each figure reads, and
the ``istar figure`` command, are in the registry :mod:`istar.report.figures`; the style every
figure follows is described in :mod:`istar.report.figure_parts`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from istar.config.layout import DEFAULT_TOKENS
from istar.core.fig2 import STABILITY_COLUMNS, fig2_true_value
from istar.core.tokens import TOKEN_SELECTIONS
from istar.registry.methods import METHODS, SEARCHED_METHOD
from istar.registry.tasks import get_task
from istar.report import figure_parts as parts
from istar.report.aggregate_csv import require_columns

__all__ = ["fig2", "dose_response", "fig3", "fig4", "fig5", "fig6", "fig7", "fig8", "sigma_epochs", "CONTRAST_LABELS", "forest"]


# -------------------- Fig. 2: IsoScore* of mini-batches vs batch size (simulation) ----


def fig2(df: pd.DataFrame, dim: int = 768) -> Figure:
    """Draw Fig. 2: IsoScore* vs batch size, one line per ζ, the true value dashed.

    Parameters
    ----------
    df : DataFrame
        Output of :func:`istar.steps.stability.fig2_data` (``fig2_stability.csv``).
    dim : int
        Dimension of the points; a dotted vertical line marks |X| = d, and the distribution's IsoScore*
        (:func:`istar.core.fig2.fig2_true_value` of ``dim``) is drawn as a dashed line.

    Returns
    -------
    Figure
        One axes; one error-bar series per ζ plus the two reference lines.
    """
    require_columns(df, STABILITY_COLUMNS, "the Fig. 2 data", "make it with `istar stability`")
    true_value = fig2_true_value(dim)
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    ax = fig.add_subplot()
    colours = parts.sequence_colours(sorted(df["zeta"].unique()))
    for zeta, colour in colours.items():
        part = df[df["zeta"] == zeta].sort_values("batch_size")
        label = f"ζ = {zeta:g}" + (" (IsoScore)" if zeta == 0 else "")
        ax.errorbar(part["batch_size"], part["mean"], yerr=parts.yerr(part["std"]), marker="o", markersize=3.5,
                    capsize=2, linewidth=1.3, color=colour, label=label)
    ax.axhline(true_value, color="black", linestyle="--", linewidth=1, label=f"true IsoScore* = {true_value:.3f}")
    ax.axvline(dim, color="#999999", linestyle=":", linewidth=1, label=f"|X| = d = {dim}")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    ax.set(ylim=(0, 1), xlabel="Batch size |X| (points, log scale)", ylabel="IsoScore* of the batch",
           title=f"IsoScore* of mini-batches of a {dim}-d Gaussian")
    ax.grid(alpha=0.3)
    entries = parts.legend_entries([ax])
    ax.legend(list(entries.values()), list(entries), loc="lower right", fontsize="small")
    return fig


# -------------------- Fig. 3–8 --------------------------------------------------------


def _layer_lines(layers: pd.DataFrame, study: str, value: str, ylabel: str) -> Figure:
    """Fig. 5 / Fig. 6: ``value`` per hidden state, one line per (method, λ), panel per model × task."""
    return parts.error_lines(parts.study_rows(layers, study, "layers.csv", value, ("hidden_state",)), "hidden_state",
                             value, "Layer (0 = embeddings)", ylabel, markersize=3.5)


def dose_response(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Fig. 3's numbers: the λ sweep's paired score differences from Base, and its fitted dose-response.

    Parameters
    ----------
    runs : DataFrame
        ``runs.csv``; rows with ``study == "lambda_sweep"`` and a score (Base: λ = 0).

    Returns
    -------
    (differences, fits)
        ``differences``: per model × task × λ ≠ 0 the rows of :func:`istar.report.paired.paired_differences`,
        λ in ``lam``, in points: d_s = score(λ, s) − score(Base, s) over the seeds both ran, their mean
        ``mean_difference``, sd ``sd_difference`` and 95 % t interval ``ci_low`` / ``ci_high``. ``fits``: the λ
        rows of :func:`istar.report.comparisons.trend_tests`, the score's slope β₁ on λ (points per unit, a random
        intercept per seed) with its se and 95 % Wald interval; the expected difference from Base is β₁·λ.
    """
    from istar.report.comparisons import trend_tests
    from istar.report.paired import paired_differences

    rows = parts.with_performance(parts.study_rows(runs, "lambda_sweep", "runs.csv", "score"))
    arms = rows.assign(method=rows["lam"], score=rows["performance"])  # λ names the arm; Base is λ = 0
    differences = paired_differences(arms, "lambda_sweep", reference=0.0).rename(columns={"method": "lam"})
    fits = trend_tests(rows)
    return differences, fits[fits["covariate"] == "lam"]


def fig3(runs: pd.DataFrame) -> Figure:
    """Fig. 3 as a dose-response: each λ's paired score difference from Base, and the line fitted on λ.

    A seed moves every arm alike (data order, initialisation), so each arm's score spreads far more than its
    difference from Base on the same seed (:func:`dose_response`); the line is fitted on λ, what the design sets.

    Parameters
    ----------
    runs : DataFrame
        ``runs.csv``; rows with ``study == "lambda_sweep"`` (Base at λ = 0 and the I-STAR arms).

    Returns
    -------
    Figure
        A panel per model × task (a notice where no Base ran on the sweep's seeds): per λ the mean difference
        (points) with its 95 % interval (thick) and ± the sd of the seeds' differences (thin, grey), the line
        β₁·λ with its 95 % band and its slope written in the panel, and 0 (Base) in black.
    """
    differences, fits = dose_response(runs)
    if differences.empty:  # Base trains in the sweep only where its λ list holds 0
        return parts.notice("The λ sweep's differences from Base: no Base run on the sweep's seeds;\nadd 0 "
                            "(Base) to studies.lambda_sweep.lambdas to draw them")
    fig, axes = parts.panels(differences)
    for (model, task), ax in axes.items():
        cell = differences[(differences["model"] == model) & (differences["task"] == task)].sort_values("lam")
        lam, mean = cell["lam"].to_numpy(dtype=float), cell["mean_difference"].to_numpy(dtype=float)
        ax.errorbar(lam, mean, yerr=parts.yerr(cell["sd_difference"]), fmt="none", color="#999999", capsize=4,
                    linewidth=1, label="± sd over seeds")
        ax.errorbar(lam, mean, yerr=[(mean - cell["ci_low"]).fillna(0), (cell["ci_high"] - mean).fillna(0)], fmt="o",
                    color=METHODS[SEARCHED_METHOD].colour, capsize=2, linewidth=2,
                    label="mean difference, 95% CI (paired t)")
        for fit in fits[(fits["model"] == model) & (fits["task"] == task)].itertuples():
            grid = np.linspace(min(lam.min(), 0.0), max(lam.max(), 0.0), 50)
            ax.plot(grid, fit.slope * grid, color=parts.HIGHLIGHT, linewidth=1.4,
                    label="fit on λ (seed intercepts), 95% band")
            ax.fill_between(grid, fit.ci_low * grid, fit.ci_high * grid, color=parts.HIGHLIGHT, alpha=0.12, linewidth=0)
            ax.text(0.02, 0.97, f"{fit.slope:+.3f} [{fit.ci_low:+.3f}, {fit.ci_high:+.3f}] points per unit λ",
                    transform=ax.transAxes, fontsize="small", va="top")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set(xlabel="λ (0 = Base)", ylabel=f"{parts.PERFORMANCE_LABELS[get_task(task).metric]} − Base (points)")
    parts.figure_legend(fig, axes.values())
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
        A panel per model × task, a series of dots per (method, λ): each dimension's mean activation
        over seeds (dots, not lines: series sharing an outlier dimension stay distinguishable).
    """
    rows = parts.study_rows(dims, "cosreg_means", "dims.csv", "mean", ("dim",))
    means = rows.groupby(["model", "task", "method", "lam", "dim"])["mean"].mean().reset_index()
    fig, axes = parts.panels(rows, panel_size=(5.2, 3.4))
    for (_, task), ax, _, series in parts.panel_series(means, axes):
        for label, colour, line in series:
            ax.plot(line["dim"], line["mean"], linestyle="none", marker="o", markersize=2.2, alpha=0.8,
                    color=colour, label=label)
        ax.set(xlabel="Dimension index", ylabel="Mean activation (last layer)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    parts.figure_legend(fig, axes.values(), markerscale=3.0)
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


def fig6(layers: pd.DataFrame) -> Figure:
    """Fig. 6: IsoScore* per layer for λ = −1, +1 and Base.

    Parameters
    ----------
    layers : DataFrame
        ``layers.csv``; rows with ``study == "layerwise"`` and an ``isoscore_star`` value (the axis label
        names the ζ of their analysis, ``analysis_zeta``).

    Returns
    -------
    Figure
        One panel per model × task; one error-bar line (std over seeds) per (method, λ).
    """
    return _layer_lines(layers, "layerwise", "isoscore_star",
                        parts.isoscore_label(layers[layers["study"] == "layerwise"]))


def fig7(runs: pd.DataFrame) -> Figure:
    """Fig. 7: performance vs ζ, the best ζ marked by a red dashed vertical line.

    Parameters
    ----------
    runs : DataFrame
        ``runs.csv``; rows with ``study == "zeta_sweep"`` and a ``zeta`` value.

    Returns
    -------
    Figure
        A panel per model × task: an error-bar line per λ, a vertical line at the best mean's ζ.
    """
    rows = parts.with_performance(parts.study_rows(runs, "zeta_sweep", "runs.csv", "score", ("zeta",)).dropna(subset=["zeta"]))
    if rows.empty:
        raise ValueError("the rows with study == 'zeta_sweep' in runs.csv have no zeta values (no I-STAR runs)")

    def best_zeta(ax, _model, _task, panel):
        best = float(panel.loc[panel["performance_mean"].idxmax(), "zeta"])
        ax.axvline(best, color=parts.HIGHLIGHT, linestyle="--", linewidth=1.2, label="best ζ")
        ax.text(best, 0.02, f" ζ = {best:g}", color=parts.HIGHLIGHT, fontsize="small", ha="left", va="bottom",
                transform=ax.get_xaxis_transform())

    return parts.error_lines(rows, "zeta", "performance", "Shrinkage parameter ζ", integer_x=False,
                             decorate=best_zeta)


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
        A panel per model × task: an error-bar line over the penalised layer per λ, and the global
        penalty's mean dashed in red (a band of ± its std over seeds where there are several).
    """
    rows = parts.with_performance(parts.study_rows(runs, "single_layer", "runs.csv", "score", ("layer",)))
    single = rows.dropna(subset=["layer"])
    if single.empty:
        raise ValueError(
            "the rows with study == 'single_layer' in runs.csv have no single-layer runs (layer is NaN "
            "everywhere): list layers under studies.single_layer in the config"
        )
    overall = parts.summary(rows[rows["layer"].isna()], ["model", "task"], ["performance"])

    def global_penalty(ax, model, task, _panel):
        reference = overall[(overall["model"] == model) & (overall["task"] == task)]
        if not reference.empty:
            mean, std = float(reference["performance_mean"].iloc[0]), float(reference["performance_std"].iloc[0])
            ax.axhline(mean, color=parts.HIGHLIGHT, linestyle="--", linewidth=1.2, label="global penalty (all layers)")
            if not math.isnan(std):
                ax.axhspan(mean - std, mean + std, color=parts.HIGHLIGHT, alpha=0.1, linewidth=0,
                           label="global penalty ± std over seeds")

    return parts.error_lines(single, "layer", "performance", "Penalised layer",
                             name=lambda label, _: f"{label} on one layer", decorate=global_penalty)


# -------------------- Σ_S across fine-tuning ------------------------------------------


def sigma_epochs(epochs: pd.DataFrame) -> Figure:
    """IsoScore of Σ_S (the training data's token cloud, docs/method.md §3) after each epoch of fine-tuning.

    Parameters
    ----------
    epochs : DataFrame
        ``epochs.csv``: the final runs' ``sigma_s_isoscore`` per ``epoch`` (0 = the pretrained model).

    Returns
    -------
    Figure
        A panel per model × task, a line per (method, λ): the mean over seeds, error bars the std. Where
        the runs' Σ_S read different rows (``tokens``: real tokens, or every padded position with
        ``penalty.tokens: all_positions``), each label says which: padding alone moves the IsoScore.
    """
    rows = parts.study_rows(epochs, "final", "epochs.csv", "sigma_s_isoscore", ("epoch",))
    # runs recorded before the token selection existed have none: they read the default rows
    read = rows.groupby(["method", "lam"])["tokens"].agg(lambda t: ", ".join(
        TOKEN_SELECTIONS[key].label for key in dict.fromkeys(t.fillna(DEFAULT_TOKENS)))) if "tokens" in rows else None
    mixed = read is not None and read.nunique() > 1
    return parts.error_lines(rows, "epoch", "sigma_s_isoscore", "Epochs of fine-tuning (0 = pretrained)",
                             "IsoScore of Σ_S", name=lambda label, line: (
                                 f"{label} (Σ_S over {read[(line['method'].iloc[0], line['lam'].iloc[0])]})"
                                 if mixed else label))


# -------------------- The verdict as a picture ----------------------------------------


CONTRAST_LABELS = {"isoscore_star": "IsoScore*", "cosine_similarity": "last-layer cosine",
                   "last_layer_isoscore_star": "last-layer IsoScore*"}
"""The final study's isotropy contrasts (paired.csv's measures other than the score) → how the forest plot names them."""


def forest(paired: pd.DataFrame, trends: pd.DataFrame | None = None) -> Figure:
    """The forest plot of the final study: the verdicts' estimates with their intervals, one row each.

    Parameters
    ----------
    paired : DataFrame
        ``paired.csv`` of ``istar aggregate`` (:func:`istar.report.comparisons.study_tests`); its rows
        with study ``final`` are drawn.
    trends : DataFrame, optional
        ``trend.csv`` beside it: the λ sweep's slopes (none where the sweep is off).

    Returns
    -------
    Figure
        First panel, a row per model × task × method: our mean paired score difference (points) with its 95 %
        interval (filled circle; open where it holds 0), ± the minimum detectable effect at its test's level (a
        bar around 0), and the paper's own gain for the cell with its Welch interval (square) where the config
        maps the model to one of the paper's; per method a pooled diamond over the informative cells (HKSJ below
        five, none below two). Cells without information are named in the title; with no final score comparison
        at all, a notice. Below, where present, the isotropy contrasts (:data:`CONTRAST_LABELS`, method − Base in
        their own units) and the λ sweep's trends (slope on λ per unit, on IsoScore* per +0.1), 95 % intervals.
    """
    from istar.report.paired import informative, pooled_gains

    require_columns(paired, ("study", "measure", "model", "task", "method", "n", "mean_difference", "sd_difference",
                             "ci_low", "ci_high", "mde", "paper_model", "paper_gain", "paper_low", "paper_high"),
                    "paired.csv", "make it with `istar aggregate`")
    final = paired[paired["study"] == "final"]
    rows = final[final["measure"] == "score"]
    if rows.empty:
        # the config asked for final comparisons (the figure is drawn only then), so none is left: the rule for
        # collapsed runs removed every pair
        return parts.notice("Paired differences from Base by cell: no pair left (paired.csv has no final score "
                            "comparison;\nthe rule for collapsed runs, inference.collapsed_runs, can exclude every seed)")
    usable = rows[[informative(row) for row in rows.itertuples()]]
    left_out = rows.drop(usable.index)
    pooled = pooled_gains(rows).query("scope == 'all' and interval != 'not pooled'")  # over the informative cells
    contrasts = final[final["measure"].isin(list(CONTRAST_LABELS))]
    per = {"lam": (1.0, "on λ (points per unit)"), "isoscore_star": (10.0, "on IsoScore* (points per +0.1)")}
    below = [(entries, xlabel) for entries, xlabel in (
        ([(f"{row.model} {get_task(row.task).display}, {METHODS[row.method].label}: {CONTRAST_LABELS[row.measure]}",
           row.mean_difference, row.ci_low, row.ci_high, METHODS[row.method].colour)
          for row in contrasts.itertuples() if informative(row)], "Isotropy difference from Base (own units; 95% CI)"),
        ([(f"{row.model} {get_task(row.task).display}: slope {per[row.covariate][1]}",
           *(value / per[row.covariate][0] for value in (row.slope, row.ci_low, row.ci_high)), parts.HIGHLIGHT)
          for row in ([] if trends is None else trends.itertuples())], "The λ sweep's trend (95% Wald CI)")) if entries]
    sizes = [max(len(usable) + len(pooled), 1), *(len(entries) for entries, _ in below)]
    fig = Figure(figsize=(7.2, 1.0 + 0.42 * sum(sizes) + 0.5 * len(sizes)), layout="constrained")
    ax, *axes = fig.subplots(len(sizes), 1, gridspec_kw={"height_ratios": sizes}, squeeze=False)[:, 0]
    labels, y = [], 0.0
    for row in usable.itertuples():
        scale = get_task(row.task).percent_scale
        ax.plot([-row.mde * scale, row.mde * scale], [y, y], color="#bbbbbb", linewidth=6, solid_capstyle="butt",
                label="± minimum detectable effect (80% power, at its test's level)", zorder=1)
        _interval_row(ax, y, row.mean_difference * scale, row.ci_low * scale, row.ci_high * scale,
                      METHODS[row.method].colour, f"{METHODS[row.method].label} − Base, this study (95% CI)")
        if isinstance(row.paper_model, str):
            ax.errorbar(row.paper_gain, y - 0.28, xerr=[[row.paper_gain - row.paper_low], [row.paper_high - row.paper_gain]],
                        fmt="s", markersize=4, color="#555555", capsize=2, zorder=2,
                        label="the paper's own cell (Table 1, Welch 95% CI)")
        labels.append((y, f"{row.model} {get_task(row.task).display}, {METHODS[row.method].label}"
                          + (f"\nvs the paper's {row.paper_model}" if isinstance(row.paper_model, str) else "")))
        y -= 1.0
    for entry in pooled.itertuples():
        mean, low, high = entry.mean, entry.ci_low, entry.ci_high
        ax.fill([low, mean, high, mean], [y, y + 0.25, y, y - 0.25], color=METHODS[entry.method].colour, alpha=0.8,
                label="pooled (random effects)")
        name = "HKSJ" if entry.interval == "HKSJ" else "DL"
        labels.append((y, f"{METHODS[entry.method].label}, pooled over {entry.k} cells ({name})"))
        y -= 1.0
    _rows_axis(ax, labels, "Score difference from Base (points)")
    title = "Paired differences from Base by cell"
    if len(left_out):
        title += "\nleft out, no information: " + ", ".join(
            f"{m} {get_task(t).display} {METHODS[k].label}" for m, t, k in zip(left_out["model"], left_out["task"],
                                                                            left_out["method"]))
    ax.set_title(title, fontsize="medium")
    for axis, (entries, xlabel) in zip(axes, below):
        for position, (_, mean, low, high, colour) in enumerate(entries):
            _interval_row(axis, -position, mean, low, high, colour, None)
        _rows_axis(axis, [(-position, entry[0]) for position, entry in enumerate(entries)], xlabel)
    parts.figure_legend(fig, [ax])
    return fig


def _interval_row(ax, y: float, mean: float, low: float, high: float, colour: str, label: str | None) -> None:
    """One estimate at height y with its interval: a filled circle, open where the interval holds 0."""
    ax.errorbar(mean, y, xerr=[[mean - low], [high - mean]], fmt="o", color=colour, capsize=3, zorder=3,
                markerfacecolor="white" if low <= 0 <= high else colour, label=label)


def _rows_axis(ax, labels: list[tuple[float, str]], xlabel: str) -> None:
    """A forest panel's frame: the rows' labels, 0 marked, the x label."""
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks([pos for pos, _ in labels], [text for _, text in labels], fontsize="small")
    ax.set_ylim(min((pos for pos, _ in labels), default=0.0) - 0.6, 0.6)
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)

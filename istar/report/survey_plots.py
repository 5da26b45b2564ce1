"""Figures of the isotropy profiles of pretrained models, from ``results/aggregate/profiles.csv``
and ``profile_projections.csv``.

Six questions, one figure each (registry: :mod:`istar.report.figures`):

* ``profile_layers`` — how isotropic, and how high-dimensional, is each hidden state? IsoScore,
  IsoScore*, the average cosine similarity, the TwoNN intrinsic dimension and the effective rank
  against relative depth (layer / L), one line per model at its latest revision;
* ``profile_steps`` — how does it change during pre-training? The headline measures against the
  training step of each revision (``stepN``), one line per model, coloured by model size:
  I(W) of the input and output matrices as the NAACL paper computes it (raw and centred) and the
  last hidden state's IsoScore, IsoScore*, average cosine, TwoNN and effective rank;
* ``profile_sizes`` — does it depend on the model's size? I(W) and last-layer IsoScore and
  IsoScore* against the parameter count, at each model's latest revision;
* ``profile_final_norm`` — what does the final norm do? IsoScore and IsoScore* of the last
  block's output before and after the final LayerNorm/RMSNorm, per model with one;
* ``profile_gallery`` and ``profile_gallery_steps`` — what do the embedding matrices look like?
  Their rows projected on the top two right singular vectors, raw and centred, per model and per
  training checkpoint, on symmetric axes shared along a row so an offset from the origin (the
  common direction I(W) reacts to) and its change across checkpoints are seen at once.

A figure whose question the data cannot answer (one revision per model, no final norm) says
so in its panel instead of failing, so a profile of any model set renders.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure

from istar.config.specs import AS_GIVEN
from istar.report.aggregate_csv import require_columns
from istar.report.figure_parts import sequence_colours
from istar.report.survey_aggregate import PROFILE_COLUMNS, PROJECTION_COLUMNS

__all__ = ["profile_layers", "profile_steps", "profile_sizes", "profile_final_norm", "profile_gallery",
           "profile_gallery_steps"]

SOURCE = "the profiles CSV (results/aggregate/profiles.csv)"
PROJECTIONS_SOURCE = "the projections CSV (results/aggregate/profile_projections.csv)"
HOW = "make it with `istar survey-aggregate` (snakemake surveys)"
IW = "partition_isotropy_solver_signs"
"""The I(W) the figures show: the NAACL paper's recipe (one sign per eigenvector), comparable with its numbers."""
LABELS = {"isoscore": "IsoScore", "isoscore_star": "IsoScore*", "average_cosine": "average cosine similarity",
          "twonn": "TwoNN intrinsic dimension", "effective_rank": "effective rank (covariance)",
          IW: "I(W) of the input embeddings (one-sign recipe)"}
PANELS = (("input", False), ("input", True), ("output", False), ("output", True))
"""The gallery's columns: matrix × centred."""
MISSING_MATRIX = {"output": "no output matrix\n(an encoder)",
                  "input": "one shared matrix,\nshown as the output (tied)"}
"""Why a gallery panel is empty: a tied causal LM's single matrix is labelled output (docs/method.md §8)."""


def _checked(df: pd.DataFrame, columns=PROFILE_COLUMNS, source=SOURCE) -> pd.DataFrame:
    require_columns(df, columns, source, HOW)
    if df.empty:
        raise ValueError(f"{source} has no rows: list models under survey.models and {HOW}")
    return df


def _latest(df: pd.DataFrame) -> pd.DataFrame:
    """Each model's rows at its latest revision (highest step; else the last revision listed)."""
    # a sort on several columns is stable in pandas: revisions with the same step keep their listed order
    order = df.drop_duplicates(["model", "revision"]).sort_values(["model", "step"], na_position="first")
    latest = order.groupby("model", sort=False).tail(1)
    return df.merge(latest[["model", "revision"]], on=["model", "revision"])


def _stepped(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of the models with several revisions named ``stepN`` (training checkpoints)."""
    stepped = df.dropna(subset=["step"])
    several = stepped.groupby("model")["revision"].nunique()
    return stepped[stepped["model"].isin(several[several > 1].index)]


def _by_size(df: pd.DataFrame) -> list[str]:
    """Model names, smallest first."""
    return list(df.sort_values("parameters").drop_duplicates("model")["model"])


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9, wrap=True)
    ax.set(xticks=[], yticks=[])


def _last_layer(df: pd.DataFrame) -> pd.DataFrame:
    """The last hidden state of every profile (after the final norm where there is one)."""
    layers = df[df["kind"] == "layer"]
    return layers[layers["layer"] == layers["num_layers"]]


def profile_layers(df: pd.DataFrame) -> Figure:
    """IsoScore, IsoScore* and average cosine per hidden state, against depth, one line per model."""
    latest = _latest(_checked(df))
    layers = latest[latest["kind"] == "layer"]
    values = ["isoscore", "isoscore_star", "average_cosine", "twonn", "effective_rank"]
    fig = Figure(figsize=(12, 7), layout="constrained")
    grid = fig.subplots(2, 3, sharex=True)
    axes = list(grid.flat[:len(values)])
    grid.flat[-1].set_axis_off()
    colours = sequence_colours(_by_size(layers))
    for ax, value in zip(axes, values):
        for model in colours:
            rows = layers[layers["model"] == model].sort_values("layer").dropna(subset=[value])
            if not rows.empty:
                revision = rows["revision"].iloc[0]
                ax.plot(rows["depth"], rows[value], marker="o", markersize=3, color=colours[model],
                        label=model if revision == AS_GIVEN else f"{model} @ {revision}")
        ax.set(xlabel="depth (layer / L; 0 = embeddings)", ylabel=LABELS[value])
        ax.grid(alpha=0.3)
    grid.flat[-1].legend(*axes[0].get_legend_handles_labels(), fontsize=8, loc="center")
    fig.suptitle("Isotropy and dimension of every hidden state of the pretrained models "
                 "(TwoNN: the first survey.twonn_tokens tokens)")
    return fig


def _size_colours(df: pd.DataFrame) -> dict[str, tuple]:
    """Model → colour on a log scale of its parameter count (plasma: small dark, large bright)."""
    sizes = df.drop_duplicates("model").set_index("model")["parameters"].astype(float)
    low, high = np.log10(sizes.min()), np.log10(sizes.max())
    cmap = colormaps["plasma"]
    return {model: cmap(0.85 * (np.log10(size) - low) / (high - low) if high > low else 0.0)
            for model, size in sizes.sort_values().items()}


def _step_axis(ax, steps) -> None:
    """A symmetric-log step axis when the positive steps span a decade or more (step 0 stays on it), else linear."""
    positive = [s for s in steps if s > 0]
    if positive and max(positive) / min(positive) >= 10:
        ax.set_xscale("symlog", linthresh=min(positive))
        ax.set_xlabel("training step (log beyond the first checkpoint)")
    else:
        ax.set_xlabel("training step")


def profile_steps(df: pd.DataFrame) -> Figure:
    """The headline measures against the training step of each revision, models coloured by size.

    I(W) (the NAACL paper's one-sign recipe) of the input and the output matrix, raw (solid)
    and centred (dashed); the last hidden state's IsoScore, IsoScore*, average cosine, TwoNN
    dimension and effective rank. Models with one revision only are left out.
    """
    stepped = _stepped(_checked(df))
    fig = Figure(figsize=(14, 6.5), layout="constrained")
    grid = fig.subplots(2, 4)
    if stepped.empty:
        for ax in grid.flat:
            _note(ax, "no model has several revisions\nnamed stepN: list them under\nsurvey.models.*.revisions")
        return fig
    colours = _size_colours(stepped)
    last = _last_layer(stepped)
    panels = [(f"I(W), {which} embeddings", stepped[stepped["kind"] == f"{which}_embeddings"], True)
              for which in ("input", "output")]
    panels += [(value, last, False) for value in ("isoscore", "isoscore_star", "average_cosine", "twonn",
                                                   "effective_rank")]
    steps = sorted(stepped["step"].unique())
    for ax, (value, rows, static) in zip(grid.flat, panels):
        if rows.empty:
            _note(ax, "no surveyed model has a\nseparate output matrix")
            continue
        for model, colour in colours.items():
            line = rows[rows["model"] == model].sort_values("step")
            for column, style in ((IW, "-"), (f"{IW}_centred", "--")) if static else ((value, "-"),):
                points = line.dropna(subset=[column])
                if not points.empty:
                    ax.plot(points["step"], points[column], style, marker="o", markersize=3, color=colour)
        ax.set_ylabel(value if static else LABELS[value] + " (last layer)")
        ax.ticklabel_format(axis="y", useOffset=False)  # I(W) near 1 would read as offsets from 1
        _step_axis(ax, steps)
        ax.grid(alpha=0.3)
    key = grid.flat[-1]
    key.set_axis_off()
    for model, colour in colours.items():
        size = stepped.loc[stepped["model"] == model, "parameters"].iloc[0]
        key.plot([], [], color=colour, marker="o", label=f"{model} ({size / 1e6:,.3g}M parameters)")
    key.plot([], [], "-", color="0.3", label="I(W) raw")
    key.plot([], [], "--", color="0.3", label="I(W) centred")
    key.legend(loc="center", fontsize=8, title="model (colour = size)")
    fig.suptitle("Isotropy and dimension across training checkpoints "
                 "(I(W): one sign per eigenvector, as in Machina & Mercer's code)")
    return fig


def profile_sizes(df: pd.DataFrame) -> Figure:
    """Static I(W), last-layer IsoScore and IsoScore* against the parameter count (latest revisions)."""
    latest = _latest(_checked(df))
    panels = [(IW, latest[latest["kind"] == "input_embeddings"]),
              ("isoscore", _last_layer(latest)), ("isoscore_star", _last_layer(latest))]
    fig = Figure(figsize=(12, 3.8), layout="constrained")
    axes = fig.subplots(1, 3)
    colours = sequence_colours(_by_size(latest))
    for ax, (value, rows) in zip(axes, panels):
        rows = rows.dropna(subset=[value]).sort_values("parameters")
        ax.plot(rows["parameters"], rows[value], color="0.6", linewidth=1, zorder=1)
        for _, row in rows.iterrows():
            ax.scatter(row["parameters"], row[value], color=colours[row["model"]], zorder=2, label=row["model"])
        ax.set(xscale="log", xlabel="parameters", ylabel=LABELS[value] + ("" if value == IW else " (last layer)"))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Isotropy against model size")
    return fig


def profile_final_norm(df: pd.DataFrame) -> Figure:
    """IsoScore and IsoScore* of the last block's output before and after the final norm, per model."""
    latest = _latest(_checked(df))
    before = latest[latest["kind"] == "pre_final_norm"].set_index("model")
    after = _last_layer(latest).set_index("model")
    models = [m for m in _by_size(latest) if m in before.index]
    fig = Figure(figsize=(9, 3.8), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, value in zip(axes, ["isoscore", "isoscore_star"]):
        if not models:
            _note(ax, "no surveyed model has a final norm\n(decoders and pre-LN encoders do)")
            continue
        positions = range(len(models))
        for offset, rows, colour, label in ((-0.2, before, "0.65", "before the final norm"),
                                            (0.2, after, "#1b7837", "after (the model's last hidden state)")):
            bars = ax.bar([p + offset for p in positions], [rows.loc[m, value] for m in models], width=0.4,
                          color=colour, label=label)
            ax.bar_label(bars, fmt="%.3g", fontsize=7)  # a near-zero bar is otherwise invisible
        ax.set_xticks(list(positions), models, rotation=30, ha="right")
        ax.set_ylabel(LABELS[value] + " (last layer)")
        ax.grid(alpha=0.3, axis="y")
    if models:
        axes[0].legend(fontsize=8)
    fig.suptitle("The final norm and isotropy")
    return fig


def _scatter_panel(ax, points: pd.DataFrame, half_width: float, say_rows: bool = True) -> None:
    """One projection: the sampled rows on symmetric axes [−half_width, half_width]², the origin marked;
    ``say_rows``: write "k of V rows" in the panel."""
    # Vector points, not rasterized: in a PDF each rasterized artist is drawn on a bitmap of the
    # whole figure, so the full checkpoint grid (672 panels) took more than 10 minutes to save.
    ax.scatter(points["x"], points["y"], s=1, alpha=0.4, linewidths=0, color="#2c7fb8")
    for line in (ax.axhline, ax.axvline):
        line(0, color="0.6", linewidth=0.5)
    ax.set(xlim=(-half_width, half_width), ylim=(-half_width, half_width), aspect="equal")
    ax.tick_params(labelsize=6)
    if say_rows:
        ax.text(0.02, 0.98, _rows_sampled(points), transform=ax.transAxes, fontsize=6, va="top")


def _rows_sampled(points: pd.DataFrame) -> str:
    first = points.iloc[0]
    return f"{first['sampled_rows']:,} of {first['rows']:,} rows"


def _half_width(points: pd.DataFrame) -> float:
    """The symmetric axis limit shared by a gallery row: the largest |coordinate|, 5 % margin."""
    return 1.05 * float(np.abs(points[["x", "y"]].to_numpy()).max()) or 1.0


def profile_gallery(df: pd.DataFrame) -> Figure:
    """Projections of the embedding matrices, one row per model (latest revision), columns input/output × raw/centred."""
    latest = _latest(_checked(df, PROJECTION_COLUMNS, PROJECTIONS_SOURCE))
    models = _by_size(latest)
    fig = Figure(figsize=(2.4 * len(PANELS), 2.4 * len(models) + 0.6), layout="constrained")
    grid = np.asarray(fig.subplots(len(models), len(PANELS), squeeze=False))
    for row, model in zip(grid, models):
        points = latest[latest["model"] == model]
        half_width = _half_width(points)
        revision = points["revision"].iloc[0]
        for ax, (matrix, centred) in zip(row, PANELS):
            panel = points[(points["matrix"] == matrix) & (points["centred"] == centred)]
            if panel.empty:
                _note(ax, MISSING_MATRIX[matrix])
            else:
                _scatter_panel(ax, panel, half_width)
            ax.set_title(f"{matrix} embeddings, {'centred' if centred else 'raw'}", fontsize=8)
        row[0].set_ylabel(model if revision == AS_GIVEN else f"{model} @ {revision}", fontsize=9)
    fig.suptitle("Embedding matrices on their top two right singular vectors (a seeded sample of rows; "
                 "axes symmetric, shared along a row)", fontsize=10)
    return fig


def profile_gallery_steps(df: pd.DataFrame) -> Figure:
    """Projections at every checkpoint: a row per model × matrix × raw/centred, a column per training step.

    Only models with several ``stepN`` revisions; the axes are shared along a row, so the
    cloud's drift from the origin across training reads left to right.
    """
    stepped = _stepped(_checked(df, PROJECTION_COLUMNS, PROJECTIONS_SOURCE))
    if stepped.empty:
        fig = Figure(figsize=(6, 2.5), layout="constrained")
        _note(fig.subplots(), "no model has several revisions named stepN:\nlist them under survey.models.*.revisions")
        return fig
    steps = sorted(stepped["step"].unique())
    rows = [(model, matrix, centred) for model in _by_size(stepped) for matrix, centred in PANELS
            if not stepped[(stepped["model"] == model) & (stepped["matrix"] == matrix)].empty]
    # The full grid has hundreds of panels (8 Pythia sizes × 4 × 21 checkpoints): a fixed layout in
    # inches instead of the constrained one, whose solver takes minutes per save at that size, and
    # tick labels only where they are needed (rows share their limits, x and y are the same).
    panel, left, top, bottom = 1.3, 2.0, 1.0, 0.2
    width, height = left + panel * len(steps) + 0.2, top + panel * len(rows) + bottom
    fig = Figure(figsize=(width, height))
    grid = np.asarray(fig.subplots(len(rows), len(steps), squeeze=False, gridspec_kw={"wspace": 0.06, "hspace": 0.06}))
    fig.subplots_adjust(left=left / width, right=1 - 0.2 / width, top=1 - top / height, bottom=bottom / height)
    for axes, (model, matrix, centred) in zip(grid, rows):
        points = stepped[(stepped["model"] == model) & (stepped["matrix"] == matrix) & (stepped["centred"] == centred)]
        half_width = _half_width(points)
        for column, (ax, step) in enumerate(zip(axes, steps)):
            panel_points = points[points["step"] == step]
            if panel_points.empty:
                _note(ax, "not surveyed")
            else:
                _scatter_panel(ax, panel_points, half_width, say_rows=False)
            ax.tick_params(labelbottom=False, labelleft=column == 0)
        axes[0].set_ylabel(f"{model}\n{matrix}, {'centred' if centred else 'raw'}\n{_rows_sampled(points)}",
                           fontsize=7, rotation=0, ha="right", va="center")
    for ax, step in zip(grid[0], steps):
        ax.set_title(f"step {int(step):,}", fontsize=8)
    fig.suptitle("Embedding matrices across training checkpoints\non their top two right singular vectors\n"
                 "(a seeded sample of rows; axes symmetric, shared along a row)", fontsize=9, y=1 - 0.1 / height)
    return fig

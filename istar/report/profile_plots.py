"""Figures of the isotropy profiles of pretrained models, from ``results/aggregate/profiles.csv``.

Four questions, one figure each (registry: :mod:`istar.report.figures`):

* ``profile_layers`` — how isotropic is each hidden state? IsoScore, IsoScore* and the average
  cosine similarity against relative depth (layer / L), one line per model at its latest revision;
* ``profile_steps`` — how does isotropy change during pre-training? The input embeddings'
  partition isotropy I(W) and the last hidden state's IsoScore and IsoScore* against the
  training step of each revision (``stepN``), one line per model;
* ``profile_sizes`` — does it depend on the model's size? The same measures against the
  parameter count, at each model's latest revision;
* ``profile_final_norm`` — what does the final norm do? IsoScore and IsoScore* of the last
  block's output before and after the final LayerNorm/RMSNorm, per model with one.

A figure whose question the data cannot answer (one revision per model, no final norm) says
so in its panel instead of failing, so a profile of any model set renders.
"""

from __future__ import annotations

import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure

from istar.report.aggregate_csv import require_columns
from istar.config.specs import AS_GIVEN
from istar.report.profile_aggregate import PROFILE_COLUMNS

__all__ = ["profile_layers", "profile_steps", "profile_sizes", "profile_final_norm"]

SOURCE = "the profiles CSV (results/aggregate/profiles.csv)"
HOW = "make it with `istar profile-aggregate` (snakemake profiles)"
LABELS = {"isoscore": "IsoScore", "isoscore_star": "IsoScore*", "average_cosine": "average cosine similarity",
          "partition_isotropy": "I(W) of the input embeddings"}


def _checked(df: pd.DataFrame) -> pd.DataFrame:
    require_columns(df, PROFILE_COLUMNS, SOURCE, HOW)
    if df.empty:
        raise ValueError(f"{SOURCE} has no rows: list models under profile.models and {HOW}")
    return df


def _latest(df: pd.DataFrame) -> pd.DataFrame:
    """Each model's rows at its latest revision (highest step; else the last revision listed)."""
    order = df.drop_duplicates(["model", "revision"])[["model", "revision", "step"]].reset_index(drop=True)
    order["position"] = order.index
    order = order.sort_values(["model", "step", "position"], na_position="first")
    latest = order.groupby("model", sort=False).tail(1)
    return df.merge(latest[["model", "revision"]], on=["model", "revision"])


def _colours(models) -> dict[str, str]:
    cmap = colormaps["viridis"]
    models = list(dict.fromkeys(models))
    return {m: cmap(0.85 * i / max(len(models) - 1, 1)) for i, m in enumerate(models)}


def _by_size(df: pd.DataFrame) -> list[str]:
    """Model names, smallest first."""
    return list(df.sort_values("parameters").drop_duplicates("model")["model"])


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _last_layer(df: pd.DataFrame) -> pd.DataFrame:
    """The last hidden state of every profile (after the final norm where there is one)."""
    layers = df[df["kind"] == "layer"]
    return layers[layers["layer"] == layers["num_layers"]]


def _label_summary_panel(ax, xlabel: str, value: str) -> None:
    """Axis labels of a panel that shows the static I(W) or a last-layer measure, one point per model."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(LABELS[value] + ("" if value == "partition_isotropy" else " (last layer)"))
    ax.grid(alpha=0.3)


def profile_layers(df: pd.DataFrame) -> Figure:
    """IsoScore, IsoScore* and average cosine per hidden state, against depth, one line per model."""
    latest = _latest(_checked(df))
    layers = latest[latest["kind"] == "layer"]
    values = ["isoscore", "isoscore_star", "average_cosine"]
    fig = Figure(figsize=(12, 3.8), layout="constrained")
    axes = fig.subplots(1, len(values), sharex=True)
    colours = _colours(_by_size(layers))
    for ax, value in zip(axes, values):
        for model in colours:
            rows = layers[layers["model"] == model].sort_values("layer").dropna(subset=[value])
            if not rows.empty:
                revision = rows["revision"].iloc[0]
                ax.plot(rows["depth"], rows[value], marker="o", markersize=3, color=colours[model],
                        label=model if revision == AS_GIVEN else f"{model} @ {revision}")
        ax.set_xlabel("depth (layer / L; 0 = embeddings)")
        ax.set_ylabel(LABELS[value])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Isotropy of every hidden state of the pretrained models")
    return fig


def profile_steps(df: pd.DataFrame) -> Figure:
    """Static I(W), last-layer IsoScore and IsoScore* against the training step of each revision."""
    df = _checked(df)
    stepped = df.dropna(subset=["step"])
    several = stepped.groupby("model")["revision"].nunique()
    stepped = stepped[stepped["model"].isin(several[several > 1].index)]
    fig = Figure(figsize=(12, 3.8), layout="constrained")
    axes = fig.subplots(1, 3)
    if stepped.empty:
        for ax in axes:
            _note(ax, "no model has several revisions named stepN:\nlist them under profile.models.*.revisions")
        return fig
    panels = [("partition_isotropy", stepped[stepped["kind"] == "input_embeddings"]),
              ("isoscore", _last_layer(stepped)), ("isoscore_star", _last_layer(stepped))]
    colours = _colours(_by_size(stepped))
    for ax, (value, rows) in zip(axes, panels):
        for model in colours:
            line = rows[rows["model"] == model].sort_values("step").dropna(subset=[value])
            if not line.empty:
                ax.plot(line["step"], line[value], marker="o", markersize=3, color=colours[model], label=model)
        _label_summary_panel(ax, "training step", value)
    axes[0].legend(fontsize=8)
    fig.suptitle("Isotropy across training checkpoints")
    return fig


def profile_sizes(df: pd.DataFrame) -> Figure:
    """Static I(W), last-layer IsoScore and IsoScore* against the parameter count (latest revisions)."""
    latest = _latest(_checked(df))
    panels = [("partition_isotropy", latest[latest["kind"] == "input_embeddings"]),
              ("isoscore", _last_layer(latest)), ("isoscore_star", _last_layer(latest))]
    fig = Figure(figsize=(12, 3.8), layout="constrained")
    axes = fig.subplots(1, 3)
    colours = _colours(_by_size(latest))
    for ax, (value, rows) in zip(axes, panels):
        rows = rows.dropna(subset=[value]).sort_values("parameters")
        ax.plot(rows["parameters"], rows[value], color="0.6", linewidth=1, zorder=1)
        for _, row in rows.iterrows():
            ax.scatter(row["parameters"], row[value], color=colours[row["model"]], zorder=2, label=row["model"])
        ax.set_xscale("log")
        _label_summary_panel(ax, "parameters", value)
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
            _note(ax, "no profiled model has a final norm\n(decoders and pre-LN encoders do)")
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

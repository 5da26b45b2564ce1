"""The paper's figures: one registry of what each reads and draws, and the ``istar figure`` command.

Each figure is enabled by one switch of the config (``studies.<study>.enabled`` for the I-STAR
paper's figures, ``survey.enabled`` for the isotropy profiles), reads one CSV of
``results/aggregate/`` and is drawn by one function of :mod:`istar.report.plots` or
:mod:`istar.report.survey_plots`. The workflow imports this module (rules ``stability`` and
``figure``), so it imports neither matplotlib nor torch itself: the drawing function is looked
up when a figure is drawn.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from functools import reduce
from operator import getitem
from pathlib import Path

from istar.registry import lookup

__all__ = ["FigureEntry", "FIGURES", "FIGURE_NAMES", "STUDY_FIGURES", "PROFILE_FIGURES", "STABILITY_CSV",
           "PROFILES_CSV", "PROJECTIONS_CSV", "get_figure", "enabled_figures",
           "figure_csvs", "draw"]

STABILITY_CSV = "fig2_stability"
"""Stem of the CSV the Fig. 2 simulation writes (``istar stability``) next to the aggregate CSVs."""

PROFILES_CSV = "profiles"
"""Stem of the CSV of the isotropy profiles (``istar survey-aggregate``) in the aggregate folder."""

PROJECTIONS_CSV = "profile_projections"
"""Stem of the CSV of the embedding matrices' 2-D projections (``istar survey-aggregate``), beside it."""


def switch_enabled(switch: str | None, config: dict) -> bool:
    """Whether the config section ``switch`` (dotted, e.g. ``studies.padding``) is enabled in a
    validated config; None is a figure or table every config draws."""
    return switch is None or bool(reduce(getitem, switch.split("."), config)["enabled"])


@dataclass(frozen=True)
class FigureEntry:
    """A figure of the paper.

    name : ``"fig2"`` … ``"fig8"``, ``"profile_layers"`` …; also the stem of the PNG and PDF and the
        name of the drawing function in ``module``.
    switch : the config section whose ``enabled`` key draws the figure (``studies.lambda_sweep``,
        ``survey``); None: always drawn (its data comes from the final runs every config has).
    data : stem of the CSV in the aggregate folder that the figure reads (``runs`` → ``runs.csv``).
    step : the command that writes that CSV.
    also : stems of further CSVs the same command writes beside it, passed to the drawing function after it.
    caption : one sentence saying what the figure shows.
    module : the module of the drawing function.
    """

    name: str
    switch: str | None
    data: str
    step: str
    caption: str
    module: str = "istar.report.plots"
    also: tuple[str, ...] = ()


FIGURES: dict[str, FigureEntry] = {
    entry.name: entry
    for entry in (
        FigureEntry("fig2", "studies.stability", STABILITY_CSV, "istar stability",
                   "IsoScore* of mini-batches of a known Gaussian against batch size, for several ζ."),
        FigureEntry("fig3", "studies.lambda_sweep", "runs", "istar aggregate",
                   "The I-STAR λ sweep as a dose-response: each λ's paired score difference from Base, and the "
                   "line fitted on λ."),
        FigureEntry("fig4", "studies.cosreg_means", "dims", "istar aggregate",
                   "Per-dimension mean of last-layer activations with CosReg and without a regulariser."),
        FigureEntry("fig5", "studies.twonn", "layers", "istar aggregate",
                   "TwoNN intrinsic dimension of the [CLS] vectors per layer."),
        FigureEntry("fig6", "studies.layerwise", "layers", "istar aggregate",
                   "IsoScore* per layer with I-STAR and without a regulariser."),
        FigureEntry("fig7", "studies.zeta_sweep", "runs", "istar aggregate",
                   "Performance against the shrinkage parameter ζ, the best ζ marked."),
        FigureEntry("fig8", "studies.single_layer", "runs", "istar aggregate",
                   "Performance with I-STAR on one layer at a time against the global penalty."),
        FigureEntry("padding", "studies.padding", "runs", "istar aggregate",
                   "Real-token IsoScore* against performance: base, and I-STAR with the penalty over real tokens "
                   "or over every padded position.", module="istar.report.padding_study"),
        FigureEntry("sigma_epochs", None, "epochs", "istar aggregate",
                   "IsoScore of Σ_S after each epoch of fine-tuning, base, CosReg and I-STAR."),
        FigureEntry("forest", None, "paired", "istar aggregate",
                   "The verdict as a picture: each cell's paired score difference from Base with its interval and "
                   "minimum detectable effect, the pooled estimate, and the paper's own cell beside ours; below, the "
                   "isotropy contrasts and the λ sweep's trends.", also=("trend",)),
        FigureEntry("profile_layers", "survey", PROFILES_CSV, "istar survey-aggregate",
                   "IsoScore, IsoScore* and average cosine similarity of every hidden state of the pretrained "
                   "models, against relative depth.", module="istar.report.survey_plots"),
        FigureEntry("profile_steps", "survey", PROFILES_CSV, "istar survey-aggregate",
                   "The headline measures (I(W) of both embedding matrices as the NAACL paper computes it, raw "
                   "and centred; last-layer IsoScore, IsoScore*, average cosine, TwoNN and effective rank) "
                   "against training step, model size as colour.", module="istar.report.survey_plots"),
        FigureEntry("profile_sizes", "survey", PROFILES_CSV, "istar survey-aggregate",
                   "Input-embedding I(W) and last-layer IsoScore and IsoScore* against model size.",
                   module="istar.report.survey_plots"),
        FigureEntry("profile_final_norm", "survey", PROFILES_CSV, "istar survey-aggregate",
                   "IsoScore and IsoScore* of the last block's output before and after the final norm.",
                   module="istar.report.survey_plots"),
        FigureEntry("profile_gallery", "survey", PROJECTIONS_CSV, "istar survey-aggregate",
                   "2-D SVD projections of the input and output embedding matrices, raw and centred, one row "
                   "per model at its latest revision.", module="istar.report.survey_plots"),
        FigureEntry("profile_gallery_steps", "survey", PROJECTIONS_CSV, "istar survey-aggregate",
                   "2-D SVD projections of the embedding matrices at every training checkpoint, one column "
                   "per checkpoint.", module="istar.report.survey_plots"),
    )
}

FIGURE_NAMES: tuple[str, ...] = tuple(FIGURES)
"""The figure names in registry order."""

STUDY_FIGURES: dict[str, str] = {entry.switch.removeprefix("studies."): entry.name for entry in FIGURES.values()
                                  if entry.switch and entry.switch.startswith("studies.")}
"""Config study → the figure it draws."""

PROFILE_FIGURES: tuple[str, ...] = tuple(entry.name for entry in FIGURES.values() if entry.switch == "survey")
"""The figures of the isotropy profiles."""


def get_figure(name: str) -> FigureEntry:
    """Look a figure up by name, with an error that lists the known figures."""
    return lookup(FIGURES, name, "figure")


def enabled_figures(config: dict) -> list[str]:
    """Names of the figures a validated config asks for (each one's ``enabled`` switch), in registry order."""
    return [entry.name for entry in FIGURES.values() if switch_enabled(entry.switch, config)]


def figure_csvs(name: str, aggregate_dir="results/aggregate") -> list[Path]:
    """Paths of the CSVs that figure ``name`` reads, under ``aggregate_dir``: its ``data``, then its ``also``."""
    entry = get_figure(name)
    return [Path(aggregate_dir) / f"{stem}.csv" for stem in (entry.data, *entry.also)]


def draw(name: str, *frames):
    """Draw figure ``name`` from the DataFrames of its CSVs (:func:`figure_csvs`' order); returns a matplotlib Figure."""
    entry = get_figure(name)
    return getattr(importlib.import_module(entry.module), entry.name)(*frames)


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``istar figure``."""
    parser.add_argument("which", choices=FIGURE_NAMES, help="the figure to draw")
    parser.add_argument("--aggregate-dir", type=Path, default=Path("results/aggregate"),
                        help="folder of the CSVs the figures read: runs.csv, layers.csv, dims.csv, "
                        f"{STABILITY_CSV}.csv, {PROFILES_CSV}.csv and {PROJECTIONS_CSV}.csv (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None,
                        help="PNG path; the PDF goes next to it (default: results/figures/WHICH.png)")


def run_cli(args: argparse.Namespace) -> int:
    """Draw the chosen figure from its CSV and write its PNG and PDF; print the files written."""
    from istar.report.aggregate_csv import read_aggregate
    from istar.report.figure_parts import save

    fig = draw(args.which, *(read_aggregate(path, get_figure(args.which).step)
                             for path in figure_csvs(args.which, args.aggregate_dir)))
    for written in save(fig, args.out or Path("results/figures") / f"{args.which}.png"):
        print(written)
    return 0

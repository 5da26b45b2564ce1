"""The paper's figures: one registry of what each reads and draws, and the ``istar figure`` command.

Each figure is enabled by one switch of the config (``studies.<study>.enabled``), reads one
CSV of ``results/aggregate/`` and is drawn by one function of :mod:`istar.plots`. The
workflow imports this module (rules ``stability`` and ``figure``), so it imports neither
matplotlib nor torch itself: the drawing function is looked up when a figure is drawn.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FigureSpec", "FIGURES", "FIGURE_NAMES", "STUDY_FIGURES", "STABILITY_CSV", "get_figure", "enabled_figures",
           "figure_csv", "draw"]

STABILITY_CSV = "fig2_stability"
"""Stem of the CSV the Fig. 2 simulation writes (``istar stability``) next to the aggregate CSVs."""


@dataclass(frozen=True)
class FigureSpec:
    """A figure of the paper.

    name : ``"fig2"`` … ``"fig8"``; also the stem of the PNG and PDF and of the drawing function in :mod:`istar.plots`.
    study : the config's study whose ``enabled`` switch draws the figure (``studies.<study>``).
    data : stem of the CSV in the aggregate folder that the figure reads (``runs`` → ``runs.csv``).
    step : the command that writes that CSV.
    caption : one sentence saying what the figure shows.
    uses_analysis_zeta : whether the drawing labels an axis with the analysis's ζ.
    """

    name: str
    study: str
    data: str
    step: str
    caption: str
    uses_analysis_zeta: bool = False


FIGURES: dict[str, FigureSpec] = {
    spec.name: spec
    for spec in (
        FigureSpec("fig2", "stability", STABILITY_CSV, "istar stability",
                   "IsoScore* of mini-batches of a known Gaussian against batch size, for several ζ."),
        FigureSpec("fig3", "lambda_sweep", "runs", "istar aggregate",
                   "IsoScore* against performance across the I-STAR λ sweep.", uses_analysis_zeta=True),
        FigureSpec("fig4", "cosreg_means", "dims", "istar aggregate",
                   "Per-dimension mean of last-layer activations with CosReg and without a regulariser."),
        FigureSpec("fig5", "twonn", "layers", "istar aggregate",
                   "TwoNN intrinsic dimension of the [CLS] vectors per layer."),
        FigureSpec("fig6", "layerwise", "layers", "istar aggregate",
                   "IsoScore* per layer with I-STAR and without a regulariser.", uses_analysis_zeta=True),
        FigureSpec("fig7", "zeta_sweep", "runs", "istar aggregate",
                   "Performance against the shrinkage parameter ζ, the best ζ marked."),
        FigureSpec("fig8", "single_layer", "runs", "istar aggregate",
                   "Performance with I-STAR on one layer at a time against the global penalty."),
    )
}

FIGURE_NAMES: tuple[str, ...] = tuple(FIGURES)
"""The figure names in registry order."""

STUDY_FIGURES: dict[str, str] = {spec.study: spec.name for spec in FIGURES.values()}
"""Config study → the figure it draws."""


def get_figure(name: str) -> FigureSpec:
    """Look a figure up by name, with an error that lists the known figures."""
    try:
        return FIGURES[name]
    except KeyError:
        raise ValueError(f"unknown figure {name!r}; known figures: {', '.join(FIGURES)}") from None


def enabled_figures(config: dict) -> list[str]:
    """Names of the figures a validated config asks for (``studies.<study>.enabled``), in registry order."""
    return [spec.name for spec in FIGURES.values() if config["studies"][spec.study]["enabled"]]


def figure_csv(name: str, aggregate_dir="results/aggregate") -> Path:
    """Path of the CSV that figure ``name`` reads, under ``aggregate_dir``."""
    return Path(aggregate_dir) / f"{get_figure(name).data}.csv"


def draw(name: str, frame, analysis_zeta: float = 0.2):
    """Draw figure ``name`` from the DataFrame of its CSV; returns a matplotlib Figure.

    ``analysis_zeta`` is the ζ of the IsoScore* analysis, shown on the axes of the figures
    that use it.
    """
    spec = get_figure(name)
    function = getattr(importlib.import_module("istar.plots"), spec.name)
    return function(frame, analysis_zeta) if spec.uses_analysis_zeta else function(frame)


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``istar figure``."""
    parser.add_argument("which", choices=FIGURE_NAMES, help="the paper's figure to draw")
    parser.add_argument("--aggregate-dir", type=Path, default=Path("results/aggregate"),
                        help="folder of the CSVs the figures read: runs.csv, layers.csv, dims.csv and "
                        f"{STABILITY_CSV}.csv (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None,
                        help="PNG path; the PDF goes next to it (default: results/figures/WHICH.png)")
    parser.add_argument("--analysis-zeta", type=float, default=0.2,
                        help="ζ of the IsoScore* analysis, for axis labels of fig3/fig6 (default: %(default)s)")


def run_cli(args: argparse.Namespace) -> int:
    """Draw the chosen figure from its CSV and write its PNG and PDF; print the files written."""
    from istar.aggregate_csv import read_aggregate
    from istar.figure_parts import save

    frame = read_aggregate(figure_csv(args.which, args.aggregate_dir), get_figure(args.which).step)
    fig = draw(args.which, frame, args.analysis_zeta)
    for written in save(fig, args.out or Path("results/figures") / f"{args.which}.png"):
        print(written)
    return 0

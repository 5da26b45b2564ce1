"""Fig. 2's simulation: IsoScore* of mini-batches of a known Gaussian against batch size (docs/method.md §2).

No model and no data: rows are drawn from N(0, diag(10, 6, 4, 4, 1, …, 1)) in d = 768, whose
IsoScore* is known in closed form, and the score of each mini-batch size is compared with it
for several shrinkage weights ζ. The workflow's ``stability`` rule writes the result with
``istar stability`` to ``results/aggregate/fig2_stability.csv`` (columns ``batch_size``,
``zeta``, ``mean``, ``std``), which :func:`istar.report.plots.fig2` draws; redrawing never reruns it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from istar.config.schema import default_of
from istar.core.covariance import CovarianceAccumulator
from istar.core.fig2 import STABILITY_COLUMNS, fig2_variances
from istar.core.isotropy import isoscore_star_from_covariance
from istar.io.artifacts import write_text

__all__ = ["FIG2_BATCH_SIZES", "FIG2_ZETAS", "fig2_data",
           "write_stability"]

FIG2_BATCH_SIZES = tuple(2**k for k in range(6, 18))
"""64 … 131,072: the sample IsoScore is within 0.01 of the true value only from ≈ 65,536 points on."""

FIG2_ZETAS = (0.0, 0.2, 0.4, 0.6, 0.8)

def _nested_covariances(sizes: list[int], scale: torch.Tensor, generator: torch.Generator, chunk: int = 16_384):
    """Yield (n, Σ_n) for each n in ``sizes`` (ascending): Σ_n the unbiased (d, d) covariance of the first n rows.

    Rows of N(0, diag(scale²)) are drawn as Z·scale (float32, ``chunk`` rows at a time) into one streaming
    :class:`istar.core.covariance.CovarianceAccumulator` (float64 sums), read at each size.
    """
    d = scale.numel()
    accumulator = CovarianceAccumulator(d)
    for size in sizes:
        while accumulator.count < size:
            accumulator.add(torch.randn(min(chunk, size - accumulator.count), d, generator=generator).mul_(scale))
        yield size, accumulator.covariance()


def fig2_data(batch_sizes=FIG2_BATCH_SIZES, zetas=FIG2_ZETAS, n_shrinkage: int = 75_000, seed: int = 0,
              repeats: int = default_of("studies.stability.repeats"), dim: int = 768) -> pd.DataFrame:
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
    scale = torch.from_numpy(fig2_variances(dim)).sqrt().float()
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
    return pd.DataFrame({"mean": scores.mean(), "std": scores.std(ddof=1)}).reset_index()[list(STABILITY_COLUMNS)]


def write_stability(frame: pd.DataFrame, path) -> Path:
    """Write :func:`fig2_data`'s frame to ``path`` as CSV, atomically; returns the path."""
    write_text(path, frame.to_csv(index=False))
    return Path(path)


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``istar stability``."""
    parser.add_argument("--out", type=Path, default=Path("results/aggregate/fig2_stability.csv"),
                        help="CSV to write (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulation (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=default_of("studies.stability.repeats"), help="samples per batch size (default: %(default)s)")


def run_cli(args: argparse.Namespace) -> int:
    """Run the simulation and write its CSV; print the file written."""
    print(write_stability(fig2_data(seed=args.seed, repeats=args.repeats), args.out))
    return 0

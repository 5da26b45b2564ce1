"""The Gaussian of Fig. 2 (docs/method.md §2): its variances and its IsoScore* in closed form.

Shared by the simulation (:mod:`istar.steps.stability`), which draws from it, and the figure
(:func:`istar.report.plots.fig2`), which marks the value every mini-batch estimate should
approach. NumPy only, so drawing the figure loads no torch.
"""

from __future__ import annotations

import numpy as np

__all__ = ["STABILITY_COLUMNS", "fig2_variances", "fig2_true_value"]

STABILITY_COLUMNS = ("batch_size", "zeta", "mean", "std")
"""Columns of the simulation's CSV, in order."""


def fig2_variances(dim: int = 768) -> np.ndarray:
    """Variances of the synthetic Gaussian, shape (dim,), float64: diag(10, 6, 4, 4, 1, …, 1)."""
    if dim < 5:
        raise ValueError(f"the Fig. 2 Gaussian needs dim ≥ 5; got {dim}")
    variances = np.ones(dim, dtype=np.float64)
    variances[:4] = (10.0, 6.0, 4.0, 4.0)
    return variances


def fig2_true_value(dim: int = 768) -> float:
    """IsoScore* of the distribution itself, ((tr Σ)²/‖Σ‖_F² − 1)/(d − 1) with Σ = diag(variances): ≈ 0.867 for d = 768."""
    variances = fig2_variances(dim)
    return float((variances.sum() ** 2 / (variances**2).sum() - 1.0) / (dim - 1))

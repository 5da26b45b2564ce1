"""The isotropy measures IsoScore replaces, kept for the comparison studies.

Average cosine similarity (the "random pairs" measure) and the partition isotropy I(X) of
Mu et al. (2017) — over both signs of each eigenvector (:func:`partition_isotropy`), and with
the one sign an eigen-solver returned (:func:`partition_isotropy_one_sign`, the recipe of
Machina & Mercer's code, NAACL 2024). IsoScore and IsoScore* are in :mod:`istar.core.isotropy`.
Each computes in float64 and raises ``ValueError`` for NaN or inf input.
"""

from __future__ import annotations

import math

import torch

__all__ = ["average_cosine_similarity", "cosine_from_unit_sum", "partition_isotropy", "partition_isotropy_one_sign",
           "FP32_EXP_LIMIT", "finite_rows"]


def cosine_from_unit_sum(unit_sum: torch.Tensor, count: int) -> float:
    """Average cosine similarity over all N(N − 1) ordered pairs of distinct rows from Σ x̂ (x̂ = x/‖x‖), N = ``count``:
    Σ_{i≠j} x̂_iᵀx̂_j = ‖Σ_i x̂_i‖² − N."""
    unit_sum = unit_sum.double()
    return float((unit_sum @ unit_sum - count) / (count * (count - 1)))


def finite_rows(X, at_least: int) -> torch.Tensor:
    """``X`` as a finite float64 (n, d) tensor with n ≥ ``at_least`` rows, or a ValueError naming what is wrong."""
    X = torch.as_tensor(X).to(torch.float64)
    if X.ndim != 2 or X.shape[0] < at_least:
        raise ValueError(f"X must have shape (n, d) with n ≥ {at_least}; got {tuple(X.shape)}")
    if not torch.isfinite(X).all():
        raise ValueError("X contains NaN or inf")
    return X


def average_cosine_similarity(X) -> float:
    """Average cosine similarity over all pairs of distinct points (the "random pairs" measure).

    Exactly the mean of x̂_iᵀx̂_j over i ≠ j, x̂ = x/‖x‖, computed in O(n·d) from
    Σ_{i≠j} x̂_iᵀx̂_j = ‖Σ_i x̂_i‖² − n. Zero vectors raise ``ValueError``.

    Parameters
    ----------
    X : torch.Tensor or array_like
        array of shape (n, d), n ≥ 2.

    Returns
    -------
    float in [−1/(n−1), 1].

    Examples
    --------
    >>> import torch, istar
    >>> abs(round(istar.average_cosine_similarity(torch.randn(4000, 64)), 2))   # random directions
    0.0
    >>> round(istar.average_cosine_similarity(torch.randn(4000, 64) + 10.0), 2)   # one common offset
    0.99
    """
    X = finite_rows(X, 2)
    norms = torch.linalg.vector_norm(X, dim=1, keepdim=True)
    if (norms == 0).any():
        raise ValueError("X contains zero vectors, whose cosine similarity is undefined")
    return cosine_from_unit_sum((X / norms).sum(dim=0), X.shape[0])


def partition_isotropy(X) -> float:
    """Partition isotropy score I(X) of Mu et al. (2017), as in the paper's §2.1.

    I(X) = min_c Z(c) / max_c Z(c) with Z(c) = Σ_x exp(cᵀx), c ranging over the unit
    eigenvectors of XᵀX (uncentred, as in Mu et al.) **and their negatives**.

    Departure (docs/method.md §7): an eigenvector is defined only up to its sign, and
    Z(c) ≠ Z(−c) in general (Z(−c) sums exp(−cᵀx)), so the score of the published recipe
    depends on which sign the eigen-solver happens to return (LAPACK versions, GPU vs
    CPU, a transposed input). Taking the min and max over all 2d vectors ±c makes the
    score a function of X alone; it can only be lower than (or equal to) the one-sign
    score. Computed in log-space for stability, in float64.

    Parameters
    ----------
    X : torch.Tensor or array_like
        array of shape (n, d), n ≥ 1 (the rows are the points, e.g. a vocabulary × d matrix).

    Returns
    -------
    float in (0, 1]; 1 = isotropic under this (flawed: mean- and rotation-sensitive) measure.

    Examples
    --------
    >>> import torch, istar
    >>> 0.0 < istar.partition_isotropy(torch.randn(1000, 8)) <= 1.0
    True
    """
    X = finite_rows(X, 1)
    _, eigenvectors = torch.linalg.eigh(X.T @ X)
    projections = X @ eigenvectors  # (n, d): cᵀx for every point and eigenvector
    log_z = torch.cat([torch.logsumexp(projections, dim=0), torch.logsumexp(-projections, dim=0)])
    return float(torch.exp(log_z.min() - log_z.max()))


FP32_EXP_LIMIT = math.log(torch.finfo(torch.float32).max)
"""≈ 88.72: the largest exponent whose plain ``exp`` is finite in float32 (above it, inf)."""


def partition_isotropy_one_sign(X, eigenvectors) -> tuple[float, float]:
    """Partition isotropy with **one sign per eigenvector**, as a solver returned them.

    I₁(X) = min_j Z(c_j) / max_j Z(c_j), Z(c) = Σ_x exp(cᵀx), over the d given columns c_j
    only (not their negatives): the recipe of Machina & Mercer's public code (NAACL 2024),
    which takes ``eigh(XᵀX)``'s columns as returned. Flipping the sign of one column can change
    I₁ (Z(−c) ≠ Z(c)); :func:`partition_isotropy` takes ±c and cannot, and is ≤ I₁.

    The ratio is computed from log Z(c) = logsumexp_x cᵀx in float64, so it is finite where
    a plain exp would overflow: ``max_exponent`` = max over x and j of c_jᵀx says whether it
    would (a float32 exp overflows above :data:`FP32_EXP_LIMIT`).

    Parameters
    ----------
    X : array (n, d), n ≥ 1, the rows the sums run over (every row, none dropped).
    eigenvectors : array (d, d), the directions c_j as columns (any signs).

    Returns
    -------
    (I₁ in (0, 1], max_exponent).
    """
    X = finite_rows(X, 1)
    C = torch.as_tensor(eigenvectors).to(device=X.device, dtype=torch.float64)
    if C.ndim != 2 or C.shape[0] != X.shape[1]:
        raise ValueError(f"eigenvectors must have shape (d, k) with d = {X.shape[1]}; got {tuple(C.shape)}")
    projections = X @ C  # (n, k): cᵀx for every row and direction
    log_z = torch.logsumexp(projections, dim=0)
    return float(torch.exp(log_z.min() - log_z.max())), float(projections.max())

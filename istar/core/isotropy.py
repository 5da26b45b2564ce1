"""Isotropy of point clouds: IsoScore (Algorithm 2) and IsoScore* (Algorithm 1).

The two measures share their input checks and the moment-based score below, so they live
together. Elsewhere: the streaming covariance (rows seen batch by batch, whose covariance
:func:`isoscore_star_from_covariance` scores) in :mod:`istar.core.covariance`; the measures
IsoScore replaces (average cosine similarity, partition isotropy) in
:mod:`istar.core.baseline_measures`; the intrinsic dimension (TwoNN) in :mod:`istar.core.twonn`.

Conventions
-----------
A point cloud ``X`` is an array of shape ``(n, d)``: ``n`` points (rows) in ``R^d``.
Covariances are unbiased (divide by ``n - 1``) and have shape ``(d, d)``.
All functions accept ``torch.Tensor`` or anything ``torch.as_tensor`` understands
(NumPy arrays, nested lists).

Equations refer to Rudman & Eickhoff, "Stable Anisotropic Regularization", ICLR 2024
(Algorithm 1 = IsoScore*, Algorithm 2 = IsoScore) and to docs/method.md §2, whose closed form

    IsoScore*(Σ) = ((tr Σ)² / ‖Σ‖_F² − 1) / (d − 1)

needs no eigendecomposition: steps 2–6 of the algorithms depend on the eigenvalues only
through ``Σλ = tr Σ`` and ``Σλ² = ‖Σ‖_F²``.

Edge cases (all raise ``ValueError`` with a message naming the problem):
fewer than 2 points, ``d < 2`` (the normalisation divides by ``d − √d = 0``), a covariance
with zero total variance (every point identical: isotropy is undefined), NaN or inf input.
"""

from __future__ import annotations

import math

import torch

__all__ = ["isoscore", "isoscore_from_eigenvalues", "isoscore_star", "isoscore_star_from_covariance", "check_sigma_s"]


# --------------------------------------------------------------------------------------
# input checks
# --------------------------------------------------------------------------------------


def _as_points(X, name: str = "X") -> torch.Tensor:
    """Return ``X`` as a floating tensor of shape (n, d), n ≥ 2 and d ≥ 2."""
    X = torch.as_tensor(X)
    if not X.is_floating_point():
        X = X.to(torch.float64)
    if X.ndim != 2:
        raise ValueError(f"{name} must be a 2-D point cloud of shape (n, d); got shape {tuple(X.shape)}")
    n, d = X.shape
    if n < 2:
        raise ValueError(f"{name} has {n} point(s); a covariance needs at least 2 points")
    if d < 2:
        raise ValueError(f"{name} has d = {d} dimension(s); isotropy is defined for d ≥ 2 (the normalisation of "
                         "Algorithm 2 divides by d − √d)")
    return X


def _as_covariance(cov, name: str) -> torch.Tensor:
    cov = torch.as_tensor(cov)
    if not cov.is_floating_point():
        cov = cov.to(torch.float64)
    if cov.ndim != 2 or cov.shape[0] != cov.shape[1]:
        raise ValueError(f"{name} must be a square (d, d) matrix; got shape {tuple(cov.shape)}")
    if cov.shape[0] < 2:
        raise ValueError(f"{name} is {cov.shape[0]}×{cov.shape[0]}; isotropy is defined for d ≥ 2")
    return cov


def check_sigma_s(sigma_s) -> torch.Tensor:
    """Σ_S as given by a user, checked once where it enters: a finite, symmetric, positive semi-definite (d, d) matrix.

    Symmetry and the smallest eigenvalue are judged relative to the largest entry (1e-6 of it), so the
    rounding of a covariance computed in float32 passes and a sign error or a transposed half does not.

    Returns
    -------
    Σ_S as float64 (d, d); ``ValueError`` naming the problem and where a valid Σ_S comes from otherwise.
    """
    sigma_s = _as_covariance(sigma_s, "sigma_s").to(torch.float64)
    fix = "give a covariance matrix (istar.shrinkage_covariance, or the file `istar shrinkage` writes)"
    if not torch.isfinite(sigma_s).all():
        raise ValueError(f"sigma_s contains NaN or inf: {fix}")
    tolerance = 1e-6 * float(sigma_s.abs().max())
    asymmetry = float((sigma_s - sigma_s.T).abs().max())
    if asymmetry > tolerance:
        raise ValueError(f"sigma_s is not symmetric (entries differ from their transposes by up to {asymmetry:.3g}): {fix}")
    smallest = float(torch.linalg.eigvalsh(sigma_s)[0])
    if smallest < -tolerance:
        raise ValueError(f"sigma_s is not positive semi-definite (an eigenvalue is {smallest:.3g}): {fix}")
    return sigma_s


def _check_zeta(zeta: float, sigma_s, d: int, device) -> torch.Tensor | None:
    """Validate the shrinkage weight and Σ_S's shape and return Σ_S as float64 on ``device`` (None if ζ = 0); a
    non-finite Σ_S is refused where the score's moments are (:func:`_score_from_moments`)."""
    zeta = float(zeta)
    if not 0.0 <= zeta <= 1.0:  # (NaN too: every comparison with it is false)
        raise ValueError(f"zeta must lie in [0, 1] (0 = no shrinkage, 1 = Σ_S alone); got {zeta}")
    if zeta == 0.0:
        return None
    if sigma_s is None:
        raise ValueError(f"zeta = {zeta} > 0 needs a shrinkage covariance sigma_s of shape ({d}, {d})")
    sigma_s = _as_covariance(sigma_s, "sigma_s")
    if sigma_s.shape[0] != d:
        raise ValueError(f"sigma_s has shape {tuple(sigma_s.shape)} but the points have d = {d}: compute Σ_S on the "
                         "same model (istar.shrinkage_covariance)")
    return sigma_s.to(device=device, dtype=torch.float64)


def _shrunk(cov_x: torch.Tensor, zeta: float, sigma_s: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """Σ_ζ = (1 − ζ)·Σ_X + ζ·Σ_S (Σ_X itself without Σ_S), its trace and its squared Frobenius norm."""
    cov = cov_x if sigma_s is None else (1.0 - zeta) * cov_x + zeta * sigma_s
    return cov, torch.trace(cov), (cov * cov).sum()


def _score_from_moments(trace: torch.Tensor, frobenius_sq: torch.Tensor, d: int) -> torch.Tensor:
    """IsoScore from tr Σ and ‖Σ‖_F² (docs/method.md §2), after checking they make sense."""
    if not (torch.isfinite(trace) and torch.isfinite(frobenius_sq)):
        raise ValueError("the covariance is not finite: the points or Σ_S contain NaN or inf (or overflow)")
    if frobenius_sq <= 0:
        raise ValueError("the covariance has zero total variance (all points identical): isotropy is undefined")
    return (trace * trace / frobenius_sq - 1.0) / (d - 1)


# --------------------------------------------------------------------------------------
# vanilla IsoScore (Algorithm 2) and the literal eigenvalue formula
# --------------------------------------------------------------------------------------


def isoscore_from_eigenvalues(eigenvalues) -> float:
    """IsoScore of a spectrum, computed literally as steps 3–6 of Algorithm 2.

    Parameters
    ----------
    eigenvalues : array of shape (d,)
        The variances along the principal components (eigenvalues of a covariance), d ≥ 2.

    Returns
    -------
    float
        ι = (d·φ − 1)/(d − 1) with Λ̂ = √d·Λ/‖Λ‖₂, δ = ‖Λ̂ − 1‖/√(2(d − √d)),
        φ = (d − δ²(d − √d))²/d². In [0, 1] for a non-negative spectrum.
    """
    lam = torch.as_tensor(eigenvalues, dtype=torch.float64).flatten()
    d = lam.numel()
    if d < 2:
        raise ValueError(f"isotropy is defined for d ≥ 2 eigenvalues; got {d}")
    if not torch.isfinite(lam).all():
        raise ValueError("eigenvalues contain NaN or inf")
    norm = torch.linalg.vector_norm(lam)
    if norm == 0:
        raise ValueError("all eigenvalues are zero: zero total variance, isotropy is undefined")
    lam_hat = math.sqrt(d) * lam / norm
    delta = torch.linalg.vector_norm(lam_hat - 1.0) / math.sqrt(2.0 * (d - math.sqrt(d)))
    phi = (d - delta**2 * (d - math.sqrt(d))) ** 2 / d**2
    return float((d * phi - 1.0) / (d - 1.0))


def isoscore(X) -> float:
    """Vanilla IsoScore of a point cloud (Algorithm 2; Rudman et al., 2022).

    Eigenvalues of the unbiased covariance of ``X`` in float64, then steps 3–6 of
    Algorithm 2. Not differentiable; for training use :func:`isoscore_star`, which equals
    this at ``zeta = 0`` (the paper's Appendix A).

    Parameters
    ----------
    X : torch.Tensor or array_like
        (n, d) points, n ≥ 2, d ≥ 2.

    Returns
    -------
    float in [0, 1]: 1 = isotropic, 0 = all variance along one direction.

    Examples
    --------
    >>> import torch, istar
    >>> round(istar.isoscore(torch.randn(5000, 8)), 1)           # isotropic Gaussian points
    1.0
    >>> round(istar.isoscore(torch.randn(5000, 8) * torch.tensor([10.0] + [0.01] * 7)), 2)   # one direction
    0.0
    """
    X = _as_points(X)
    cov = torch.cov(X.to(torch.float64).T)
    if not torch.isfinite(cov).all():
        raise ValueError("the covariance is not finite: X contains NaN or inf")
    return isoscore_from_eigenvalues(torch.linalg.eigvalsh(cov))


# --------------------------------------------------------------------------------------
# IsoScore* (Algorithm 1), closed form
# --------------------------------------------------------------------------------------


def isoscore_star_from_covariance(cov_x, zeta: float = 0.0, sigma_s=None) -> torch.Tensor:
    """IsoScore* of a sample covariance (Algorithm 1 from step 4 on), differentiable.

    Uses ``((tr Σ_ζ)² / ‖Σ_ζ‖_F² − 1) / (d − 1)`` with Σ_ζ = (1 − ζ)·Σ_X + ζ·Σ_S formed in
    float64 (docs/method.md §2), as :func:`isoscore_star` does from its points. Gradients flow into ``cov_x`` by ordinary autograd; this is
    the entry point when the covariance comes from all-reduced sufficient statistics.

    Parameters
    ----------
    cov_x : torch.Tensor
        (d, d) tensor, the sample covariance Σ_X.
    zeta : float
        float in [0, 1], weight of ``sigma_s``.
    sigma_s : torch.Tensor or None
        (d, d) shrinkage covariance Σ_S, required when ``zeta > 0``.

    Returns
    -------
    0-d float64 tensor in [0, 1].

    Examples
    --------
    >>> import torch, istar
    >>> points = torch.randn(2000, 16) * torch.linspace(0.1, 3.0, 16)
    >>> from_covariance = istar.isoscore_star_from_covariance(torch.cov(points.T), zeta=0.2, sigma_s=torch.eye(16))
    >>> bool(torch.isclose(from_covariance, istar.isoscore_star(points, zeta=0.2, sigma_s=torch.eye(16))))
    True
    """
    cov_x = _as_covariance(cov_x, "cov_x")
    d = cov_x.shape[0]
    sigma_s = _check_zeta(zeta, sigma_s, d, cov_x.device)
    with torch.autocast(device_type=cov_x.device.type, enabled=False):
        _, trace, frob_sq = _shrunk(cov_x.to(torch.float64), float(zeta), sigma_s)
        return _score_from_moments(trace, frob_sq, d)


class _IsoScoreStarOfPoints(torch.autograd.Function):
    """IsoScore*(X) with a hand-written backward that costs one (n, d)×(d, d) product.

    With Σ_ζ = (1 − ζ)·X_cᵀX_c/(n − 1) + ζ·Σ_S, t = tr Σ_ζ, f = ‖Σ_ζ‖_F²:
        ∂ score / ∂ Σ_ζ = (2t/f · I − 2t²/f² · Σ_ζ) / (d − 1)          (symmetric)
        ∂ score / ∂ X   = 2(1 − ζ)/(n − 1) · X_c · ∂ score / ∂ Σ_ζ
    (the centring drops out because the columns of X_c sum to zero). Autograd through
    ``X_cᵀX_c`` would instead pay two such products.
    """

    @staticmethod
    def forward(ctx, X, zeta, sigma_s):
        n, d = X.shape
        work = torch.float64 if X.dtype == torch.float64 else torch.float32
        # The product X_cᵀX_c runs in float16 or bfloat16 where autocast in that dtype is on for X's device (fp32
        # accumulation: cuBLAS's and oneDNN's half-precision products accumulate in float32; accuracy against
        # float64: bench/RESULTS.md); low = None: in ``work``, the input's float32 or float64.
        low = torch.get_autocast_dtype(X.device.type) if torch.is_autocast_enabled(X.device.type) else None
        if X.dtype == torch.float64 or low not in (torch.float16, torch.bfloat16):
            low = None
        with torch.autocast(device_type=X.device.type, enabled=False):
            Xc = X.to(work, copy=True)
            Xc -= X.mean(dim=0, dtype=work)
            if low is None:
                cov_x = torch.mm(Xc.T, Xc).div_(n - 1).to(torch.float64)
                rescale = None
            else:  # the product in the autocast dtype, on rows scaled so that no entry of it passes 2^14
                peak = Xc.abs().amax().clamp_min(torch.finfo(work).tiny).to(torch.float64)
                rescale = peak * (math.sqrt(n) / 128.0)  # X_c = rescale · Xs, |Xs| ≤ 128/√n
                Xc = Xc.mul_((1.0 / rescale).to(work)).to(low)
                cov_x = torch.mm(Xc.T, Xc).to(torch.float64).mul_(rescale * rescale / (n - 1))
            cov, trace, frob_sq = _shrunk(cov_x, zeta, sigma_s)
            score = _score_from_moments(trace, frob_sq, d)
        alpha = 2.0 * trace / frob_sq / (d - 1)
        beta = -2.0 * trace * trace / (frob_sq * frob_sq) / (d - 1)
        if rescale is None:
            ctx.save_for_backward(Xc, cov.to(work), alpha, beta)
        else:
            ctx.save_for_backward(Xc, cov, alpha, beta, rescale)
        ctx.scale = 2.0 * (1.0 - zeta) / (n - 1)
        ctx.input_dtype = X.dtype
        return score

    @staticmethod
    def backward(ctx, grad_score):
        Xc, cov, alpha, beta, *rescale = ctx.saved_tensors
        with torch.autocast(device_type=Xc.device.type, enabled=False):
            coef = grad_score.to(torch.float64) * ctx.scale
            if rescale:  # X_c·(αI + βΣ) as one product in the saved dtype, its d × d factor scaled to at most 1
                factor = cov * (coef * beta * rescale[0])
                factor.diagonal().add_(coef * alpha * rescale[0])
                size = factor.abs().amax().clamp_min(torch.finfo(torch.float32).tiny)
                grad = torch.mm(Xc, (factor / size).to(Xc.dtype)).to(ctx.input_dtype).mul_(size.to(ctx.input_dtype))
                return grad, None, None
            grad = torch.mm(Xc, cov).mul_((coef * beta).to(Xc.dtype))
            grad.add_(Xc, alpha=float(coef * alpha))
        return grad.to(ctx.input_dtype), None, None


def isoscore_star(X, zeta: float = 0.0, sigma_s=None) -> torch.Tensor:
    """IsoScore* of a point cloud (Algorithm 1), differentiable with respect to ``X``.

    Σ_X is the unbiased covariance of ``X``; Σ_ζ = (1 − ζ)·Σ_X + ζ·Σ_S; the score is
    ``((tr Σ_ζ)² / ‖Σ_ζ‖_F² − 1) / (d − 1)`` (docs/method.md §2), which equals steps 5–9 of
    Algorithm 1 exactly without an eigendecomposition. ``zeta = 0`` gives vanilla
    :func:`isoscore`.

    Precision: fp16/bf16 input is promoted to float32 for the centring and the product
    X_cᵀX_c; under fp16 or bf16 autocast the product (and the backward's) runs in the autocast
    dtype with float32 accumulation, on centred rows scaled so that it cannot overflow (score
    within about 5e-5 of float64, gradient within 0.06 % in fp16 and 0.5 % in bf16:
    bench/RESULTS.md). The d×d reductions run in float64. The backward pass costs one
    (n, d)×(d, d) product.

    Parameters
    ----------
    X : torch.Tensor
        tensor of shape (n, d), n ≥ 2, d ≥ 2; may require grad.
    zeta : float
        float in [0, 1]; weight of the shrinkage covariance (0 = none, 1 = Σ_S alone).
    sigma_s : torch.Tensor or None
        tensor of shape (d, d), the shrinkage covariance Σ_S (required if zeta > 0;
        treated as a constant).

    Returns
    -------
    0-d float64 tensor in [0, 1].

    Examples
    --------
    >>> import torch, istar
    >>> points = torch.randn(2000, 16) * torch.linspace(0.1, 3.0, 16)
    >>> round(float(istar.isoscore_star(points)), 4) == round(istar.isoscore(points), 4)   # ζ = 0: IsoScore
    True
    >>> shrunk = istar.isoscore_star(points, zeta=0.5, sigma_s=torch.eye(16))   # towards an isotropic Σ_S
    >>> bool(shrunk > istar.isoscore_star(points))
    True
    """
    X = _as_points(X)
    sigma_s = _check_zeta(zeta, sigma_s, X.shape[1], X.device)
    return _IsoScoreStarOfPoints.apply(X, float(zeta), sigma_s)

"""TwoNN intrinsic dimension of a point cloud (Facco et al., 2017; docs/method.md §5).

The estimate needs each point's two nearest neighbours. They are found with a k-d tree where
the dimension is low and by a chunked exhaustive search elsewhere (:data:`KDTREE_MAX_DIM`);
both give the same neighbours, so the estimate does not depend on the search.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from istar.core.baseline_measures import finite_rows

__all__ = ["twonn_dimension", "KDTREE_MAX_DIM"]



KDTREE_MAX_DIM = 10
"""Largest dimension d at which TwoNN finds neighbour candidates with a k-d tree rather than by
exhaustive search. Measured on points near a 10-d subspace (bench/RESULTS.md): at 5,000 points
the tree is faster up to d = 8 and exhaustive search from d = 12 on; at 20,000 points the tree
wins up to d = 16. A tree's cost grows with the data's intrinsic dimension, exhaustive search's
with n² instead."""

NEIGHBOUR_SEARCHES = ("auto", "kdtree", "exhaustive")


def _kdtree_candidates(X: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (n, k) of each row's k nearest other rows, from a k-d tree in float64.

    The tree's own distance values are not used: :func:`_two_nearest_distances` recomputes
    them, so both searches give the same distances for the same neighbours. ``X`` has distinct
    rows, so a row's own index is its nearest hit; where rounding ties it with another row at
    distance 0 and leaves it out of the k + 1 hits, the farthest hit is dropped instead.
    """
    from scipy.spatial import cKDTree  # scipy only on this path: the package imports without it

    points = X.numpy()
    _, hits = cKDTree(points).query(points, k=k + 1, workers=-1)
    own = hits == np.arange(len(hits))[:, None]
    own[~own.any(axis=1), -1] = True
    return torch.from_numpy(hits[~own].reshape(len(hits), k))


def _exhaustive_candidates(X32: torch.Tensor, sq_norms: torch.Tensor, start: int, stop: int, k: int) -> torch.Tensor:
    """Indices (stop − start, k) of the k nearest other rows of rows start…stop−1, by all distances.

    Ranked by ‖b‖² − 2a·b in float32 against every row b (memory (stop − start) × n): the squared
    distance ‖a − b‖² less ‖a‖², which is the same for every candidate of row a, so leaving it
    out changes no ranking and saves two passes over the block.
    """
    approx = torch.addmm(sq_norms[None, :], X32[start:stop], X32.T, alpha=-2.0)
    approx[torch.arange(stop - start), torch.arange(start, stop)] = float("inf")
    return torch.topk(approx, k, dim=1, largest=False).indices


def _two_nearest_distances(X: torch.Tensor, chunk_size: int, search: str = "auto", candidates: int = 4) -> torch.Tensor:
    """Distances (n, 2) of each row of ``X`` (float64, distinct rows) to its first and second nearest other row.

    The best ``candidates`` rows are found by a k-d tree (``search="kdtree"``; the default for
    d ≤ :data:`KDTREE_MAX_DIM`) or by exhaustive search in float32 one chunk of rows at a time
    (``"exhaustive"``); the distances to them are then computed exactly in float64 from the
    differences, so near neighbours are not spoiled by the cancellation of the float32
    expansion, and both searches give identical distances whenever their candidates hold the
    same two nearest rows.
    """
    if search not in NEIGHBOUR_SEARCHES:
        raise ValueError(f"search must be one of {', '.join(NEIGHBOUR_SEARCHES)}; got {search!r}")
    n, d = X.shape
    k = min(candidates, n - 1)
    tree = search == "kdtree" or (search == "auto" and d <= KDTREE_MAX_DIM)
    if tree:
        hits = _kdtree_candidates(X, k)
        # Blocks of (rows, k, d) differences, kept under torch's 32,768-element threshold for
        # splitting an operation across threads: work this small finishes sooner on one thread than
        # the wait for a second one on a busy machine (about 12 ms an operation, measured).
        chunk_size = max(1, 16_384 // (k * d))
    else:
        X32 = X.to(torch.float32)
        sq_norms = (X32 * X32).sum(dim=1)
    out = torch.empty(n, 2, dtype=torch.float64)
    for start in range(0, n, chunk_size):
        stop = min(start + chunk_size, n)
        idx = hits[start:stop] if tree else _exhaustive_candidates(X32, sq_norms, start, stop, k)
        neighbours = X.index_select(0, idx.reshape(-1)).view(stop - start, k, d)
        exact = torch.linalg.vector_norm(neighbours - X[start:stop, None, :], dim=2)
        out[start:stop] = torch.sort(exact, dim=1).values[:, :2]
    return out


def twonn_dimension(X, discard_fraction: float = 0.1, chunk_size: int = 1024, search: str = "auto") -> float:
    """TwoNN intrinsic dimension of a point cloud (Facco et al., 2017; docs/method.md §5).

    For each point, μ = r₂/r₁ (distances to its second and first nearest neighbours).
    The μ are sorted, the largest ``discard_fraction`` dropped, and the slope of the
    line through the origin fitting −log(1 − F(μ)) against log μ is returned, F being the
    empirical CDF F(μ_(i)) = i/N.

    Duplicates: exact duplicate rows are collapsed to one before neighbours are searched.
    A duplicate has r₁ = 0 and so no finite μ; it carries no information about the local
    dimension, and keeping it would put infinite μ at the top of the sample.

    Neighbours: in low dimension (d ≤ :data:`KDTREE_MAX_DIM`) a k-d tree (scipy's ``cKDTree``)
    finds them; above it, exhaustive search one chunk of ``chunk_size`` rows at a time (peak
    memory ≈ 4·chunk_size·n bytes besides X), so 50,000 × 768 points fit in well under 1 GB.
    Both are exact and give the same μ: see :func:`_two_nearest_distances`.

    Parameters
    ----------
    X : torch.Tensor or array_like
        array of shape (n, d), at least 3 distinct rows.
    discard_fraction : float
        float in [0, 1); the fraction of largest μ left out of the fit.
        The largest μ is always left out, since F = 1 there.
    chunk_size : int
        rows per distance block of the exhaustive search.
    search : str
        ``"auto"`` (by dimension, as above), ``"kdtree"`` or ``"exhaustive"``.

    Returns
    -------
    float, the estimated intrinsic dimension.

    Examples
    --------
    >>> import torch, istar
    >>> plane = torch.randn(4000, 2) @ torch.randn(2, 50)       # a 2-dimensional plane in 50 dimensions
    >>> round(istar.twonn_dimension(plane))
    2
    """
    if not 0.0 <= discard_fraction < 1.0:
        raise ValueError(f"discard_fraction must lie in [0, 1); got {discard_fraction}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive; got {chunk_size}")
    X = finite_rows(X, 1)
    # the distinct rows in lexicographic order (torch.unique(X, dim=0)'s rows); NumPy sorts the rows as records,
    # faster than a column-by-column lexsort at model widths (2,000 × 768: about 31 ms against 303 ms, measured)
    X = torch.from_numpy(np.unique(X.cpu().numpy(), axis=0))
    n = X.shape[0]
    if n < 3:
        raise ValueError(f"TwoNN needs at least 3 distinct points; got {n}")
    r = _two_nearest_distances(X, chunk_size, search)
    mu = torch.sort(r[:, 1] / r[:, 0]).values
    keep = min(int(math.floor(n * (1.0 - discard_fraction))), n - 1)
    if keep < 2:
        raise ValueError(f"only {keep} ratio(s) left after discarding {discard_fraction:.0%} of {n}: too few points")
    x = torch.log(mu[:keep])
    y = -torch.log1p(-torch.arange(1, keep + 1, dtype=torch.float64) / n)
    denominator = (x * x).sum()
    if denominator == 0:
        raise ValueError("every point's two nearest neighbours are equidistant: the dimension is undefined")
    return float((x * y).sum() / denominator)

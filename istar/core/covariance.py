"""The streaming covariance: the mean and unbiased covariance of rows seen batch by batch.

Every per-layer statistic the project keeps — Σ_S of a pretrained model
(:mod:`istar.core.shrinkage`), the isotropy of a model measured while it streams
(:mod:`istar.core.measurement`), a survey's hidden states — is one
:class:`CovarianceAccumulator` per hidden state, merged over batches, chunks and processes;
the measures of :mod:`istar.core.isotropy` then read its covariance.
"""

from __future__ import annotations

import torch

__all__ = ["CovarianceAccumulator"]


class CovarianceAccumulator:
    """Streaming mean and unbiased covariance of rows in R^d, in O(d²) memory.

    Batches are centred on their own mean (float32, or float64 for float64 input) and
    their statistics merged into float64 running sums with the pairwise update of Chan,
    Golub & LeVeque (1979), so no rows are ever stacked and large offsets do not cancel.

    >>> acc = CovarianceAccumulator(dim=768)
    >>> for hidden, mask in batches:          # hidden (B, T, 768), mask (B, T)
    ...     acc.add(hidden, mask=mask)        # keeps rows where mask is true
    >>> sigma_s = acc.covariance()            # (768, 768) float64

    Parameters
    ----------
    dim : int
        d, the rows' dimension.
    device : torch.device or str
        Where the float64 sums live (the rows' device, to avoid copies).

    Examples
    --------
    >>> import torch, istar
    >>> accumulator = istar.CovarianceAccumulator(dim=4)
    >>> for batch in torch.randn(1000, 4).split(300):
    ...     _ = accumulator.add(batch)   # returns the accumulator
    >>> accumulator.count, tuple(accumulator.covariance().shape)
    (1000, (4, 4))
    """

    def __init__(self, dim: int, device: torch.device | str = "cpu"):
        if int(dim) < 1:
            raise ValueError(f"dim must be a positive integer; got {dim}")
        self.dim = int(dim)
        self.count = 0
        self.mean = torch.zeros(self.dim, dtype=torch.float64, device=device)
        self.m2 = torch.zeros(self.dim, self.dim, dtype=torch.float64, device=device)

    @torch.no_grad()
    def add(self, rows: torch.Tensor, mask: torch.Tensor | None = None) -> "CovarianceAccumulator":
        """Add rows of shape (..., d); with ``mask`` of shape (...), only rows where it is true."""
        rows = torch.as_tensor(rows).detach()
        if rows.ndim < 1 or rows.shape[-1] != self.dim:
            raise ValueError(f"rows must have shape (..., {self.dim}); got {tuple(rows.shape)}")
        if mask is not None:
            mask = torch.as_tensor(mask, device=rows.device)
            if tuple(mask.shape) != tuple(rows.shape[:-1]):
                raise ValueError(f"mask shape {tuple(mask.shape)} does not match the rows' leading shape "
                                 f"{tuple(rows.shape[:-1])}")
            rows = rows[mask.bool()]
        rows = rows.reshape(-1, self.dim)
        k = rows.shape[0]
        if k == 0:
            return self
        work = torch.float64 if rows.dtype == torch.float64 else torch.float32
        with torch.autocast(device_type=rows.device.type, enabled=False):
            batch_mean = rows.mean(dim=0, dtype=torch.float64)
            centred = rows.to(work, copy=True)
            centred -= batch_mean.to(work)
            batch_m2 = torch.mm(centred.T, centred).to(torch.float64)
        if not (torch.isfinite(batch_mean).all() and torch.isfinite(batch_m2).all()):
            raise ValueError("rows contain NaN or inf (or overflow float32)")
        self._combine(k, batch_mean.to(self.mean.device), batch_m2.to(self.m2.device))
        return self

    def merge(self, other: "CovarianceAccumulator") -> "CovarianceAccumulator":
        """Fold another accumulator's rows into this one (chunks, processes)."""
        if other.dim != self.dim:
            raise ValueError(f"cannot merge accumulators of dim {self.dim} and {other.dim}")
        if other.count:
            self._combine(other.count, other.mean.to(self.mean.device), other.m2.to(self.m2.device))
        return self

    def _combine(self, k: int, mean_b: torch.Tensor, m2_b: torch.Tensor) -> None:
        n_a = self.count
        n = n_a + k
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (k / n)
        self.m2 = self.m2 + m2_b + torch.outer(delta, delta) * (n_a * k / n)
        self.count = n

    def covariance(self) -> torch.Tensor:
        """The unbiased covariance (d, d) in float64 of all rows added so far."""
        if self.count < 2:
            raise ValueError(f"the covariance needs at least 2 rows; {self.count} were added")
        return self.m2 / (self.count - 1)

    @classmethod
    def from_state_dict(cls, state: dict) -> "CovarianceAccumulator":
        acc = cls(state["mean"].numel(), device=state["mean"].device)
        acc.count, acc.mean, acc.m2 = int(state["count"]), state["mean"].double(), state["m2"].double()
        return acc

"""A model's isotropy per layer, from streamed statistics: what ``istar measure`` reports, in memory.

For every hidden state l = 0 (embeddings) … L of the batches seen (docs/method.md §2, §5):

- ``isoscore``: IsoScore of the covariance of its real (non-padding) token vectors;
- ``isoscore_star``: IsoScore* of the same covariance shrunk towards that layer's own Σ_S with
  weight ζ (None without a Σ_S);
- ``twonn_cls``: the TwoNN intrinsic dimension of its first-token ([CLS]) vectors (None where
  it is undefined, e.g. fewer than 3 distinct vectors; the reason is in ``warnings``);
- ``cosine_similarity``: the exact average cosine similarity over all pairs of distinct
  tokens, (‖Σ x̂‖² − N)/(N(N − 1)) from the running sum of unit vectors;

and ``overall``: the union of the selected layers' tokens, whose IsoScore* uses the Σ_S of the
same selection (the global I-STAR penalty's point cloud).

:class:`IsotropyMetric` accumulates batches (``update`` / ``compute`` / ``reset``, in the manner
of a torchmetrics metric, without the dependency) in O(L·d²) memory plus the [CLS] vectors;
:func:`isotropy_of_statistics` scores accumulated statistics, and is what both the metric and
the ``istar measure`` step's analysis (:mod:`istar.steps.analyze`) calls.

Return types: everything here is a Python ``float`` (or None), as are the non-differentiable
measures (:func:`istar.core.isotropy.isoscore`, :func:`istar.core.twonn.twonn_dimension`);
only what training differentiates (:func:`istar.core.isotropy.isoscore_star` and the
penalties) returns tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from istar.core.baseline_measures import cosine_from_unit_sum
from istar.core.covariance import CovarianceAccumulator
from istar.core.isotropy import isoscore_star_from_covariance
from istar.core.regularizers import LayerSelection, check_hidden_states, resolve_layers
from istar.core.shrinkage import Processes, current_processes, load_layer_statistics, merge_across_processes, merge_layers
from istar.core.twonn import twonn_dimension

__all__ = ["LayerIsotropy", "OverallIsotropy", "IsotropyReport", "isotropy_of_statistics", "IsotropyMetric"]


@dataclass(frozen=True)
class LayerIsotropy:
    """One hidden state's measures (see the module docstring); ``tokens`` = N, the rows behind them."""

    layer: int
    isoscore_star: float | None
    isoscore: float
    twonn_cls: float | None
    cosine_similarity: float
    tokens: int


@dataclass(frozen=True)
class OverallIsotropy:
    """The union of the selected layers' tokens: ``rows`` = N · len(layers)."""

    layers: list[int]
    isoscore_star: float | None
    isoscore: float
    rows: int


@dataclass(frozen=True)
class IsotropyReport:
    """What :class:`IsotropyMetric` and :func:`istar.models.measurement.measure_isotropy` return.

    ``layers[l]`` is hidden state l (0 = embeddings); :meth:`to_dict` gives the ``global`` /
    ``layers`` part of a measured run's analysis.

    Attributes
    ----------
    zeta : float
        ζ of every IsoScore*.
    tokens : int
        The real tokens measured.
    overall : OverallIsotropy
        The union of the selected layers' tokens.
    layers : list of LayerIsotropy
        One per hidden state, 0 = embeddings.
    warnings : list of str
        Why a measure is None (TwoNN of too few distinct vectors, …).

    Examples
    --------
    >>> report = istar.measure_isotropy(model, sentences, tokenizer, sigma_s=sigma_s)   # doctest: +SKIP
    >>> report.overall.isoscore_star, report.to_dict()["layers"][1]["isoscore"]         # doctest: +SKIP
    """

    zeta: float
    tokens: int
    overall: OverallIsotropy
    layers: list[LayerIsotropy]
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"zeta": self.zeta, "tokens": self.tokens, "global": asdict(self.overall),
                "layers": [asdict(layer) for layer in self.layers], "warnings": list(self.warnings)}


def _sigma_layers(sigma_s, num_hidden_states: int, dim: int) -> list[CovarianceAccumulator] | torch.Tensor | None:
    """Σ_S as given: a Σ_S file's path → its per-layer statistics; accumulators or a (d, d) tensor as they are
    (a tensor's shape is checked where IsoScore* reads it, :func:`istar.core.isotropy.isoscore_star_from_covariance`)."""
    if sigma_s is None or isinstance(sigma_s, torch.Tensor):
        return sigma_s
    if isinstance(sigma_s, (str, Path)):
        sigma_s, _ = load_layer_statistics(sigma_s)
    sigma_s = list(sigma_s)
    if len(sigma_s) != num_hidden_states or sigma_s[0].dim != dim:
        raise ValueError(f"the Σ_S statistics ({len(sigma_s)} hidden states of dimension {sigma_s[0].dim}) do not match "
                         f"the model ({num_hidden_states} hidden states of dimension {dim}): use the Σ_S of the same model")
    return sigma_s


def isotropy_of_statistics(per_layer: Sequence[CovarianceAccumulator], unit_sums: Sequence[torch.Tensor],
                           cls: Sequence[torch.Tensor] | None, *, zeta: float = 0.2, sigma_s=None,
                           layers: LayerSelection = "all", twonn_discard: float = 0.1) -> IsotropyReport:
    """Score accumulated token statistics (the module docstring's measures).

    Parameters
    ----------
    per_layer : one accumulator per hidden state, each over the same N tokens.
    unit_sums : per hidden state, Σ x/‖x‖ over those tokens (d,).
    cls : per hidden state, the (n, d) first-token vectors for TwoNN; None leaves TwoNN out.
    zeta : ζ ∈ [0, 1], the weight of Σ_S in IsoScore* (0 = IsoScore).
    sigma_s : the per-layer Σ_S statistics (a list of accumulators, e.g. from
        :func:`istar.models.shrinkage.accumulate_shrinkage`, or the path of a Σ_S file): every
        layer's IsoScore* uses its own Σ_S, the overall one the merge over ``layers``; or one
        (d, d) Σ_S of the ``layers`` selection (from ``istar.shrinkage_covariance``), which
        scores ``overall`` only; or None (no IsoScore* unless ζ = 0).
    layers : the hidden states of ``overall`` (see :data:`istar.core.regularizers.LayerSelection`).
    twonn_discard : fraction in [0, 1) of the largest neighbour ratios left out of the TwoNN fit.
    """
    zeta = float(zeta)
    if not 0.0 <= zeta <= 1.0:
        raise ValueError(f"zeta must lie in [0, 1] (0 = no shrinkage, 1 = Σ_S alone); got {zeta}")
    if not 0.0 <= twonn_discard < 1.0:
        raise ValueError(f"twonn_discard must lie in [0, 1); got {twonn_discard}")
    count = per_layer[0].count  # (fewer than 2: each covariance below raises)
    sigma_s = _sigma_layers(sigma_s, len(per_layer), per_layer[0].dim)
    selection = resolve_layers(layers, len(per_layer))

    def scores(rows: CovarianceAccumulator, sigma: torch.Tensor | None) -> tuple[float | None, float]:
        """IsoScore* against ``sigma`` (None without one, unless ζ = 0, which reads none) and IsoScore of ``rows``."""
        cov = rows.covariance()
        star = None if zeta > 0 and sigma is None else float(isoscore_star_from_covariance(cov, zeta, sigma))
        return star, float(isoscore_star_from_covariance(cov, 0.0))

    per_layer_sigma = sigma_s if isinstance(sigma_s, list) else None
    union = merge_layers(per_layer, selection)
    overall_sigma = merge_layers(per_layer_sigma, selection).covariance() if per_layer_sigma is not None else sigma_s
    overall = OverallIsotropy(selection, *scores(union, overall_sigma), union.count)
    warnings, scored = [], []
    for layer, accumulator in enumerate(per_layer):
        twonn = None
        if cls is not None:
            try:
                twonn = twonn_dimension(cls[layer], discard_fraction=twonn_discard)
            except ValueError as error:
                warnings.append(f"layer {layer}: TwoNN of the [CLS] vectors is undefined ({error})")
        sigma = per_layer_sigma[layer].covariance() if per_layer_sigma is not None else None
        scored.append(LayerIsotropy(layer, *scores(accumulator, sigma), twonn,
                                    cosine_from_unit_sum(unit_sums[layer], count), count))
    return IsotropyReport(zeta, count, overall, scored, warnings)


class IsotropyMetric:
    """Streaming per-layer isotropy of a model's hidden states (the module docstring's measures).

    >>> metric = IsotropyMetric(zeta=0.2, sigma_s="sigma0.pt")          # doctest: +SKIP
    >>> for batch in loader:                                           # doctest: +SKIP
    ...     out = model(**batch, output_hidden_states=True)
    ...     metric.update(out.hidden_states, batch["attention_mask"])
    >>> report = metric.compute()                                      # doctest: +SKIP
    >>> report.layers[-1].isoscore, report.overall.isoscore_star       # doctest: +SKIP

    Parameters
    ----------
    zeta, sigma_s, layers, twonn_discard : float, optional, LayerSelection, float
        as in :func:`isotropy_of_statistics`.
    twonn : bool
        keep the [CLS] vectors for TwoNN (n × d floats per layer); False leaves TwoNN out.

    Notes
    -----
    Only real tokens (attention mask 1) are rows, as in ``istar measure``. Under several
    processes, :meth:`compute` merges every process's statistics (and [CLS] vectors), so every
    process gets the same report.

    Examples
    --------
    >>> import torch
    >>> metric = istar.IsotropyMetric(zeta=0.0, twonn=False)
    >>> metric.update(tuple(torch.randn(2, 6, 8) for _ in range(3)), torch.ones(2, 6, dtype=torch.long))
    >>> report = metric.compute()
    >>> len(report.layers), report.tokens
    (3, 12)
    """

    def __init__(self, zeta: float = 0.2, sigma_s=None, layers: LayerSelection = "all", twonn_discard: float = 0.1,
                 twonn: bool = True):
        self.zeta, self.sigma_s, self.layers, self.twonn_discard, self.twonn = zeta, sigma_s, layers, twonn_discard, twonn
        self.reset()

    def reset(self) -> None:
        """Forget every batch: this process's ``per_layer`` accumulators, ``unit_sums`` (Σ x/‖x‖, (d,) float64)
        and ``cls`` (the [CLS] vectors of each batch, (B, d) float32), one entry per hidden state."""
        self.per_layer: list[CovarianceAccumulator] = []
        self.unit_sums: list[torch.Tensor] = []
        self.cls: list[list[torch.Tensor]] = []

    @torch.no_grad()
    def update(self, hidden_states: Sequence[torch.Tensor], attention_mask: torch.Tensor) -> None:
        """Add one batch: ``outputs.hidden_states`` (L + 1 tensors (B, T, d)) and its (B, T) attention mask."""
        hidden_states, attention_mask = check_hidden_states(hidden_states, attention_mask, "real")
        if not self.per_layer:
            dim = hidden_states[0].shape[-1]
            self.per_layer = [CovarianceAccumulator(dim) for _ in hidden_states]
            self.unit_sums = [torch.zeros(dim, dtype=torch.float64) for _ in hidden_states]
            self.cls = [[] for _ in hidden_states]
        elif len(hidden_states) != len(self.per_layer):
            raise ValueError(f"this batch has {len(hidden_states)} hidden states, earlier ones {len(self.per_layer)}: "
                             "measure one model per metric (or call reset())")
        mask = attention_mask.bool()
        for layer, hidden in enumerate(hidden_states):
            rows = hidden.float()[mask].cpu()
            self.per_layer[layer].add(rows)
            self.unit_sums[layer] += torch.nn.functional.normalize(rows.double(), dim=1).sum(dim=0)
            if self.twonn:
                self.cls[layer].append(hidden[:, 0].float().cpu())

    def compute(self, accelerator=None, sync: bool = True) -> IsotropyReport:
        """The report over every batch since the last :meth:`reset`, merged across processes
        (through ``accelerator`` if given, else an initialised ``torch.distributed`` group; every
        process must call it then). ``sync=False`` reports this process's batches alone."""
        if not self.per_layer:
            raise ValueError("no batch was added: call update(outputs.hidden_states, attention_mask) first")
        processes = current_processes(accelerator) if sync else Processes()
        per_layer = [merge_across_processes(accumulator, processes) for accumulator in self.per_layer]
        unit_sums = list(self.unit_sums)
        cls = [torch.cat(vectors) for vectors in self.cls] if self.twonn else None
        if processes.gather is not None:
            unit_sums = [processes.gather(s.to(processes.device)[None]).sum(dim=0).cpu() for s in unit_sums]
            if cls is not None:
                cls = [_gather_rows(vectors, processes) for vectors in cls]
        return isotropy_of_statistics(per_layer, unit_sums, cls, zeta=self.zeta, sigma_s=self.sigma_s,
                                      layers=self.layers, twonn_discard=self.twonn_discard)


def _gather_rows(rows: torch.Tensor, processes) -> torch.Tensor:
    """Every process's (n_p, d) rows, concatenated in rank order (n_p may differ: padded for the gather)."""
    sizes = processes.gather(torch.tensor([rows.shape[0]], device=processes.device)).cpu().tolist()
    padded = torch.nn.functional.pad(rows, (0, 0, 0, max(sizes) - rows.shape[0]))  # zero rows after this process's
    gathered = processes.gather(padded.to(processes.device)[None]).cpu()
    return torch.cat([part[:size] for part, size in zip(gathered, sizes)])

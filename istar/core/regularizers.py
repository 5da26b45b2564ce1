"""Regularisation penalties on a transformer's hidden states: I-STAR and CosReg.

Both take the ``hidden_states`` of a Hugging Face model called with
``output_hidden_states=True`` — a tuple of L + 1 tensors of shape (B, T, d): index 0 is the
embedding output, index l the output of transformer layer l — and the batch's
``attention_mask`` of shape (B, T) (1 = real token, 0 = padding). Which positions enter a
penalty is a setting (:data:`istar.core.tokens.TOKEN_SELECTIONS`): the real tokens only (the default), or every
position of the padded batch, padding included, as the public reference code does
(docs/method.md §7).

Each penalty returns a :class:`Penalty`: the term to add to the task loss and detached
values to log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence, Union

import torch

from istar.core.isotropy import isoscore_star, isoscore_star_from_covariance
from istar.core.shrinkage import current_processes
from istar.core.tokens import get_token_selection

__all__ = ["Penalty", "resolve_layers", "parse_layer_selection", "check_hidden_states", "check_lam", "token_rows", "istar_penalty", "global_istar_penalty",
           "global_isoscore_star", "cosreg_penalty", "LayerSelection"]

LayerSelection = Union[str, int, Sequence[int]]
"""Which hidden states a penalty reads: ``"all"`` (layers 1..L, the paper's default),
``"all+embeddings"`` (0..L), one layer index, or a list of indices (0 = embedding output)."""



@dataclass(frozen=True)
class Penalty:
    """A loss term and what to log about it.

    Attributes
    ----------
    term : torch.Tensor
        0-d (float32), to add to the task loss; carries the gradient.
    logs : dict[str, torch.Tensor]
        Detached 0-d tensors, e.g. ``{"isoscore_star": …}`` or ``{"cosine_similarity": …}``.
        Call ``.item()`` only when logging, to avoid a device sync on every step.

    Examples
    --------
    >>> import torch, istar
    >>> penalty = istar.istar_penalty((torch.randn(1, 6, 4), torch.randn(1, 6, 4)), torch.ones(1, 6),
    ...                               lam=-1.0, zeta=0.0, sigma_s=None)
    >>> sorted(penalty.logs), penalty.term.shape
    (['isoscore_star', 'penalty_rows'], torch.Size([]))
    """

    term: torch.Tensor
    logs: dict = field(default_factory=dict)


NAMED_SELECTIONS = {"all": 1, "all+embeddings": 0}
"""The layer selections by name: every hidden state from this index on (0 = the embeddings' output)."""


def resolve_layers(layers: LayerSelection, num_hidden_states: int) -> list[int]:
    """Turn a layer specification into a sorted list of indices into ``hidden_states``.

    Parameters
    ----------
    layers : "all" | "all+embeddings" | int | sequence of int (see :data:`LayerSelection`).
        Negative integers count from the end (−1 = last layer).
    num_hidden_states : L + 1, the length of the model's ``hidden_states`` tuple.
    """
    last = num_hidden_states - 1
    if isinstance(layers, str):
        if layers not in NAMED_SELECTIONS:
            raise ValueError(f"unknown layer selection {layers!r}: use 'all', 'all+embeddings', an index or a list")
        return list(range(NAMED_SELECTIONS[layers], num_hidden_states))
    indices = [layers] if isinstance(layers, int) else list(layers)
    if not indices:
        raise ValueError("the layer selection is empty")
    for index in indices:
        if isinstance(index, bool) or not isinstance(index, int):
            raise ValueError(f"layer indices must be integers; got {index!r}")
        if not -num_hidden_states <= index <= last:
            raise ValueError(f"layer {index} does not exist: this model has layers 0 (embeddings) to {last}")
    return sorted({index % num_hidden_states for index in indices})


def parse_layer_selection(text: str) -> LayerSelection:
    """Parse a command-line layer selection: ``all``, ``all+embeddings``, ``6`` or ``1,3,5``."""
    text = str(text).strip()
    if text in NAMED_SELECTIONS:
        return text
    try:
        indices = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"cannot read layer selection {text!r}: use all, all+embeddings, an index or a list like 1,3,5") from None
    return indices[0] if len(indices) == 1 else indices


def check_hidden_states(hidden_states, attention_mask, tokens: str = "real"):
    """The hidden states as a list of (B, T, d) tensors and a (B, T) mask, or an error naming the fix."""
    if hidden_states is None:
        raise ValueError("hidden_states is None: call the model with output_hidden_states=True "
                         "(outputs = model(**batch, output_hidden_states=True)) and pass outputs.hidden_states")
    if isinstance(hidden_states, torch.Tensor):
        raise ValueError(f"hidden_states is one tensor of shape {tuple(hidden_states.shape)}; pass the tuple "
                         "outputs.hidden_states of a model called with output_hidden_states=True (embeddings + one "
                         "(B, T, d) tensor per layer), not last_hidden_state")
    hidden_states = list(hidden_states)
    if not hidden_states or any(not isinstance(h, torch.Tensor) or h.ndim != 3 for h in hidden_states):
        shapes = [tuple(h.shape) if isinstance(h, torch.Tensor) else type(h).__name__ for h in hidden_states]
        raise ValueError(f"hidden_states must be a tuple of (B, T, d) tensors, one per hidden state (the model's "
                         f"outputs.hidden_states with output_hidden_states=True); got {shapes}")
    if attention_mask is None:
        if get_token_selection(tokens).masked:
            raise ValueError("attention_mask is None: pass batch['attention_mask'] (the tokenizer returns it; keep it "
                             "in the batch) so that padding is left out, or tokens='all_positions' to read every "
                             "position of the padded batch")
        attention_mask = torch.ones(hidden_states[0].shape[:2], dtype=torch.bool, device=hidden_states[0].device)
    if tuple(attention_mask.shape) != tuple(hidden_states[0].shape[:2]):
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} does not match hidden states "
                         f"{tuple(hidden_states[0].shape[:2])} (batch, tokens): pass the mask of the same batch "
                         "the model was called with")
    return hidden_states, attention_mask


def check_lam(lam) -> None:
    """Refuse a λ that is NaN or infinite (the penalty and every gradient would be too, without a word)."""
    if not math.isfinite(float(lam)):
        raise ValueError(f"lam must be a finite number (λ < 0 lowers isotropy, > 0 raises it); got {float(lam)}")


def token_rows(hidden_states: Sequence[torch.Tensor], attention_mask: torch.Tensor | None, layers: LayerSelection = "all",
               tokens: str = "real") -> torch.Tensor:
    """The token vectors of the selected layers, stacked: X̃ of the paper's Fig. 1.

    Parameters
    ----------
    hidden_states : tuple of L + 1 tensors (B, T, d) (``outputs.hidden_states`` of a model
        called with ``output_hidden_states=True``).
    attention_mask : (B, T), non-zero at real tokens; may be None with ``tokens="all_positions"``.
    layers : see :data:`LayerSelection`.
    tokens : a key of :data:`istar.core.tokens.TOKEN_SELECTIONS`: ``real`` keeps the positions where the mask is
        non-zero, ``all_positions`` all B·T positions.

    Returns
    -------
    tensor (len(layers) · M, d), M = number of selected positions in the batch (real tokens,
    or B·T); differentiable.

    Raises
    ------
    ValueError
        Naming the fix, for the common mistakes: no hidden states (the model was called without
        ``output_hidden_states=True``), one tensor instead of the tuple, a missing or
        mismatched attention mask.
    """
    hidden_states, attention_mask = check_hidden_states(hidden_states, attention_mask, tokens)
    indices = resolve_layers(layers, len(hidden_states))
    mask = get_token_selection(tokens).mask(attention_mask)
    if len(indices) == 1:
        return hidden_states[indices[0]][mask]
    return torch.stack([hidden_states[i] for i in indices])[:, mask].flatten(0, 1)


def istar_penalty(hidden_states: Sequence[torch.Tensor], attention_mask: torch.Tensor, *, lam: float, zeta: float,
                  sigma_s: torch.Tensor | None, layers: LayerSelection = "all", tokens: str = "real") -> Penalty:
    """The I-STAR term λ·(1 − IsoScore*(X̃, ζ, Σ_S)) of the paper's Eq. (2) / docs/method.md §3.

    Parameters
    ----------
    hidden_states, attention_mask : tuple of torch.Tensor, torch.Tensor
        model outputs and mask, see module docstring
        (``outputs.hidden_states`` of ``model(**batch, output_hidden_states=True)`` and
        ``batch["attention_mask"]``).
    lam : float
        λ; λ < 0 lowers isotropy (the paper's winning direction), λ > 0 raises it; 0 adds
        nothing to the gradient but still logs IsoScore*.
    zeta : float
        ζ ∈ [0, 1], weight of Σ_S in the shrinkage (0 = batch covariance alone).
    sigma_s : torch.Tensor or None
        (d, d) shrinkage covariance Σ_S of the same layers and tokens, from
        :func:`istar.models.shrinkage.shrinkage_covariance` (``istar.shrinkage_covariance``);
        may be None when ζ = 0. Keep it on the model's device (it is returned there).
    layers : LayerSelection
        which hidden states form X̃ (default: every transformer layer, no embeddings).
    tokens : str
        which positions form X̃ (:data:`istar.core.tokens.TOKEN_SELECTIONS`; Σ_S must come from the same selection).

    Returns
    -------
    Penalty with ``term`` (float32) and ``logs = {"isoscore_star": score, "penalty_rows": rows of X̃}``.

    Notes
    -----
    **Refresh Σ_S every epoch.** The paper computes Σ_S from the pretrained model before
    training and again from the current model at the start of every later epoch; a Σ_S kept
    from the pretrained model for the whole run is not what it trained with. In a plain loop::

        for epoch in range(epochs):
            sigma_s = istar.shrinkage_covariance(model, sigma_loader, layers=layers, tokens=tokens)
            for batch in train_loader:
                outputs = model(**batch, output_hidden_states=True)
                penalty = istar.istar_penalty(outputs.hidden_states, batch["attention_mask"],
                                              lam=-1.0, zeta=0.2, sigma_s=sigma_s, layers=layers, tokens=tokens)
                (outputs.loss + penalty.term).backward()
                ...

    :class:`istar.integrations.trainer.IStarTrainer` does this for a ``transformers.Trainer``.

    Examples
    --------
    >>> import torch, istar
    >>> hidden_states = tuple(torch.randn(2, 5, 8, requires_grad=True) for _ in range(3))   # L = 2 layers
    >>> mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    >>> penalty = istar.istar_penalty(hidden_states, mask, lam=-1.0, zeta=0.2, sigma_s=torch.eye(8))
    >>> penalty.term.backward()                  # add it to the task loss instead
    >>> int(penalty.logs["penalty_rows"])       # 7 real tokens × layers 1 and 2
    14
    """
    return _istar_term(isoscore_star, hidden_states, attention_mask, lam, zeta, sigma_s, layers, tokens)


def _istar_term(score_of, hidden_states, attention_mask, lam, zeta, sigma_s, layers, tokens) -> Penalty:
    """λ·(1 − score) with ``score = score_of(X̃, ζ, Σ_S)`` of the selected token rows X̃."""
    check_lam(lam)
    rows = token_rows(hidden_states, attention_mask, layers, tokens)
    score = score_of(rows, zeta, sigma_s)
    return Penalty(term=(lam * (1.0 - score)).to(torch.float32),
                   logs={"isoscore_star": score.detach(), "penalty_rows": _row_count(rows)})


def _row_count(rows: torch.Tensor) -> torch.Tensor:
    return torch.tensor(float(rows.shape[0]), device=rows.device)


class _SumOverProcesses(torch.autograd.Function):
    """Differentiable sum of a tensor over all processes (a blocking ``all_reduce``).

    Written here rather than taken from ``torch.distributed.nn.functional.all_reduce``
    (deprecated in torch 2.13) or ``torch.distributed._functional_collectives`` (private, and
    its ``all_reduce`` has no autograd formula): the gradient of y = Σ_p x_p with respect to
    this process's x is Σ_p ∂L_p/∂y, so the backward is the same sum over processes. Both
    directions are plain synchronous collectives, completed before they return, so no
    collective is ever left in flight when a process group is torn down.
    """

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        total = tensor.contiguous().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total

    backward = forward


def global_isoscore_star(rows: torch.Tensor, zeta: float, sigma_s: torch.Tensor | None) -> torch.Tensor:
    """IsoScore* of the union of every process's rows, differentiable on every process.

    Parameters
    ----------
    rows : (n_p, d) this process's token rows (n_p may differ between processes).
    zeta, sigma_s : as in :func:`istar.core.isotropy.isoscore_star`.

    Notes
    -----
    The global row count, mean and centred second moment are summed over processes, so the
    score equals IsoScore* of all rows stacked. Every process adds the same score to its
    loss; data-parallel training averages parameter gradients over processes, and the
    backward sum in :class:`_SumOverProcesses` makes that average the exact gradient of the
    global penalty (docs/method.md §3).
    """
    x = rows.double() if rows.dtype == torch.float64 else rows.float()
    with torch.autocast(device_type=x.device.type, enabled=False):  # the product must not run in fp16
        count = _SumOverProcesses.apply(torch.tensor([float(x.shape[0])], device=x.device, dtype=torch.float64))
        mean = _SumOverProcesses.apply(x.sum(dim=0, dtype=torch.float64)) / count
        centred = x - mean.to(x.dtype)
        second_moment = _SumOverProcesses.apply((centred.T @ centred).double())
    return isoscore_star_from_covariance(second_moment / (count - 1), zeta, sigma_s)


def global_istar_penalty(hidden_states: Sequence[torch.Tensor], attention_mask: torch.Tensor, *, lam: float,
                         zeta: float, sigma_s: torch.Tensor | None, layers: LayerSelection = "all",
                         tokens: str = "real") -> Penalty:
    """:func:`istar_penalty` on the global batch of all data-parallel processes.

    Same arguments and result as :func:`istar_penalty`. Under several processes (an
    initialised ``torch.distributed`` group: ``accelerate launch``, ``torchrun``) the score is
    IsoScore* of every process's rows together; in one process (``python script.py``, or no
    process group) the global batch is the local one, and this is exactly
    :func:`istar_penalty`, so one script runs both ways. The public reference code penalises
    each process's local batch instead.

    Parameters
    ----------
    hidden_states, attention_mask, lam, zeta, sigma_s, layers, tokens
        As in :func:`istar_penalty`.

    Returns
    -------
    Penalty
        ``term`` = λ·(1 − IsoScore*(X̃_global, ζ, Σ_S)) (the paper's Eq. 2 on the global batch),
        the same value on every process; ``logs`` as in :func:`istar_penalty`.

    Examples
    --------
    >>> import torch, istar
    >>> hidden_states = tuple(torch.randn(2, 5, 8) for _ in range(3))
    >>> mask = torch.ones(2, 5, dtype=torch.long)
    >>> one = istar.global_istar_penalty(hidden_states, mask, lam=-1.0, zeta=0.0, sigma_s=None)
    >>> bool(one.term == istar.istar_penalty(hidden_states, mask, lam=-1.0, zeta=0.0, sigma_s=None).term)
    True
    """
    score_of = global_isoscore_star if current_processes().size > 1 else isoscore_star
    return _istar_term(score_of, hidden_states, attention_mask, lam, zeta, sigma_s, layers, tokens)


def cosreg_penalty(hidden_states: Sequence[torch.Tensor], attention_mask: torch.Tensor, *, lam: float = 1.0,
                   tokens: str = "real") -> Penalty:
    """The CosReg term of Gao et al. (2019) as adapted by the paper (docs/method.md §4).

    λ · (1/M²) Σ_i Σ_{j≠i} x̂_iᵀx̂_j over the M selected positions of the last layer (``tokens``:
    :data:`istar.core.tokens.TOKEN_SELECTIONS`), x̂ = x/‖x‖, computed in O(M·d) as λ·(‖Σ_i x̂_i‖² − M)/M².
    Reductions in float32.

    Returns
    -------
    Penalty with ``term`` and ``logs = {"cosine_similarity": mean over pairs i ≠ j, "penalty_rows": M}``.

    Parameters
    ----------
    hidden_states : tuple of torch.Tensor
        ``outputs.hidden_states``: L + 1 tensors (B, T, d); the last is read.
    attention_mask : torch.Tensor or None
        (B, T), non-zero at real tokens (None with ``tokens="all_positions"``).
    lam : float
        λ, the penalty's weight (default 1, the paper's CosReg); > 0 lowers the mean cosine similarity.
    tokens : str
        ``"real"`` or ``"all_positions"`` (:data:`istar.core.tokens.TOKEN_SELECTIONS`).

    Examples
    --------
    >>> import torch, istar
    >>> hidden_states = (torch.randn(2, 4, 8), torch.randn(2, 4, 8) + 3.0)   # the last layer shares an offset
    >>> penalty = istar.cosreg_penalty(hidden_states, torch.ones(2, 4, dtype=torch.long))
    >>> bool(penalty.logs["cosine_similarity"] > 0.5)
    True
    """
    check_lam(lam)
    rows = token_rows(hidden_states, attention_mask, layers=-1, tokens=tokens)
    m = rows.shape[0]
    if m < 2:
        raise ValueError(f"CosReg needs at least 2 token rows in the batch; got {m}")
    with torch.autocast(device_type=rows.device.type, enabled=False):
        unit = torch.nn.functional.normalize(rows.float(), dim=1)
        total = unit.sum(dim=0)
        pair_sum = total @ total - m
        term = lam * pair_sum / (m * m)
    return Penalty(term=term, logs={"cosine_similarity": (pair_sum / (m * (m - 1))).detach(),
                                    "penalty_rows": _row_count(rows)})


"""The disk space a fine-tuning run (:mod:`istar.steps.train`) needs, checked before its first step,
so that a full disk stops the run at its start rather than at a state's save hours later."""

from __future__ import annotations

from pathlib import Path

from istar.config.specs import TrainSpec
from istar.io import artifacts
from istar.registry.methods import get_method
from istar.steps.resume import STATES_AT_ONCE

__all__ = ["space_needed", "check_free_space"]


def space_needed(spec: TrainSpec, model) -> dict[str, int]:
    """What a run writes into its folder at most, in bytes, estimated from the model's weights (count and
    dtype): ``state`` (one resume state), ``model`` (the final model), ``sigma_copy`` (one Σ_S copy,
    ``sigma_epoch{e}.pt``), ``copies`` (how many: I-STAR's) and ``total`` (all of them at the fullest moment)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    d, hidden_states = model.config.hidden_size, model.config.num_hidden_layers + 1
    copies = ((1 + (spec.epochs - 1 if spec.recompute_shrinkage else 0))
              if get_method(spec.method).needs_sigma_s(spec.zeta) else 0)
    # a state: the weights, AdamW's two moments (each in its weight's dtype), the current Σ_S (float64);
    # a state and the final model also hold small files (RNG states, progress, log; the tokenizer)
    small = 1 << 20
    state, final_model = 3 * weights + (8 * d * d if copies else 0) + small, weights + small
    # save_shrinkage: Σ_S and its mean, and every hidden state's count, mean and sums of products (float64)
    sigma_copy = 8 * (d * d + d + hidden_states * (1 + d + d * d))
    # STATES_AT_ONCE while a state replaces the last; the final model is written beside the last state
    total = state + max((STATES_AT_ONCE - 1) * state, final_model) + copies * sigma_copy
    return {"state": state, "model": final_model, "sigma_copy": sigma_copy, "copies": copies, "total": total}


def check_free_space(spec: TrainSpec, model, out: Path, resume_dir: Path) -> None:
    """Before the first step: room on the run folder ``out``'s disk for :func:`space_needed`, less what
    the folder holds of it already (a state to resume from in ``resume_dir``, earlier Σ_S copies).
    Raises :class:`istar.io.artifacts.NotEnoughSpaceError` saying how much is missing."""
    need = space_needed(spec, model)
    held = sum(p.stat().st_size for state in resume_dir.glob("state-*") for p in state.rglob("*") if p.is_file()) \
        + sum(p.stat().st_size for p in out.glob("sigma_epoch*.pt"))
    size, copies = artifacts.format_bytes, need["copies"]
    what = (f"training writes resume states of about {size(need['state'])} each ({STATES_AT_ONCE} at once while one "
            f"replaces the other) and the final model ({size(need['model'])}) beside the last one"
            + (f", and {copies} Σ_S cop{'y' if copies == 1 else 'ies'} of {size(need['sigma_copy'])}" if copies else "")
            + f": {size(need['total'])} at most")
    artifacts.check_free_space(out, need["total"] - held, what, "no training step was taken")

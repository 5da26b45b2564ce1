"""Σ_S while a run trains (:mod:`istar.steps.train`): the given Σ_S checked and kept, and Σ_S of
the current model measured before training and after every epoch.

Every run, whatever its method, measures Σ_S over ``spec.layers`` (the configured selection,
whatever the method's penalty reads) on ``shrinkage_rows`` rows of the training data, and records
its IsoScore per epoch (``sigma_s_isoscore`` in metrics.json, index = epochs trained). An I-STAR
run instead starts from the Σ_S it was given (``istar shrinkage``, over its penalty's layers,
which for I-STAR are ``spec.layers``), saved as ``sigma_epoch0.pt``; with ``recompute_shrinkage``
it trains each later epoch with the Σ_S measured after the one before (``sigma_epoch{e}.pt``).
All processes use the same Σ_S.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from istar.config.specs import TrainSpec
from istar.core.isotropy import isoscore_star_from_covariance
from istar.core.regularizers import resolve_layers
from istar.core.shrinkage import (
    check_sigma_fits,
    check_sigma_settings,
    load_layer_statistics,
    merge_layers,
    save_shrinkage,
)
from istar.core.tokens import get_token_selection
from istar.data.storage import read_meta
from istar.models.loading import model_shape
from istar.registry.methods import get_method
from istar.models.shrinkage import SigmaSchedule
from istar.steps.shrinkage import STALE_SIGMA_FIX, training_statistics

if TYPE_CHECKING:
    from istar.core.covariance import CovarianceAccumulator
    from istar.models.shrinkage import SigmaStatistics
    from istar.steps.run_state import TrainingRun

    GivenSigma = tuple[list[CovarianceAccumulator], dict]  # a given Σ_S file's per-layer statistics and provenance

__all__ = ["read_given_sigma", "start_sigma", "sigma_after_epoch"]


def read_given_sigma(spec: TrainSpec) -> GivenSigma | None:
    """The Σ_S file the run was given, as (per-layer statistics, provenance), read and checked (hash,
    NaN / inf, token rows; the settings it was made with; of the data's task and the model's shape, read from
    their ``meta.json`` and config) before the model and data are loaded; None for a method that needs none."""
    if not get_method(spec.method).needs_sigma_s(spec.zeta):
        return None
    given = load_layer_statistics(spec.sigma_s)
    # (not its layers: a one-layer run reads the Σ_S of the config's penalty layers, whose per-layer statistics hold its own)
    check_sigma_settings(spec.sigma_s, given[1], {"rows": spec.shrinkage_rows, "tokens": spec.tokens, "model": spec.model},
                         STALE_SIGMA_FIX)
    check_sigma_fits(spec.sigma_s, *given, task=read_meta(spec.data_dir)["task"], data=spec.data_dir,
                     shape=model_shape(spec.model), model=spec.model)
    return given


def _advance(run: TrainingRun, epoch: int, compute) -> torch.Tensor | None:
    """The schedule's Σ_S for the start of ``epoch`` (0-based), from and into the state in ``run.progress``
    (and, for the penalty, ``run.penalty_sigma`` on the device); returns the new Σ_S, None when none was set.
    Which Σ_S an epoch trains with is :class:`istar.models.shrinkage.SigmaSchedule`'s rule, as in the library."""
    spec, progress = run.spec, run.progress
    schedule = SigmaSchedule(get_method(spec.method).needs_sigma_s(spec.zeta), spec.recompute_shrinkage,
                             progress.sigma_s, progress.sigma_epoch)
    sigma = schedule.advance(epoch, compute)
    progress.sigma_s, progress.sigma_epoch = schedule.sigma_s, schedule.sigma_epoch
    run.penalty_sigma = None if progress.sigma_s is None else progress.sigma_s.to(run.accelerator.device)
    return sigma


def start_sigma(run: TrainingRun, given: GivenSigma | None) -> float | None:
    """Before the first step of this process: the given Σ_S (``read_given_sigma``) for the first epoch
    unless a resumed state holds one, and IsoScore(Σ_S) before training unless a state has it.

    Returns that IsoScore when it was measured now (None on resuming)."""
    spec, progress = run.spec, run.progress
    layers = resolve_layers(spec.penalty_layers, run.context.model.config.num_hidden_layers + 1)
    # Σ_S of the penalty's layers from the given file's statistics, read and checked once (read_given_sigma:
    # of this model's shape)
    first = _advance(run, 0, lambda: merge_layers(given[0], layers).covariance())
    if first is not None and run.accelerator.is_main_process:
        save_shrinkage(run.out / "sigma_epoch0.pt", given[0], layers, given[1])
    if progress.sigma_isoscore:
        return None
    # I-STAR's Σ_S before training is the file it was given; the other runs measure their own.
    sigma = progress.sigma_s if progress.sigma_s is not None else _measure(run, 0).selection.covariance().cpu()
    progress.sigma_isoscore.append(float(isoscore_star_from_covariance(sigma)))  # IsoScore: ζ = 0 (docs/method.md §2)
    return progress.sigma_isoscore[-1]


def sigma_after_epoch(run: TrainingRun, epochs_done: int) -> None:
    """Σ_S of the model after ``epochs_done`` epochs: its IsoScore is recorded, and when the schedule
    sets a new Σ_S for the next epoch (I-STAR with ``recompute_shrinkage``) it is this one (saved as
    ``sigma_epoch{e}.pt``)."""
    spec, accelerator = run.spec, run.accelerator
    statistics = _measure(run, epochs_done)
    sigma = statistics.selection.covariance().cpu()
    run.progress.sigma_isoscore.append(float(isoscore_star_from_covariance(sigma)))
    if epochs_done >= spec.epochs or _advance(run, epochs_done, lambda: sigma) is None:
        return
    if accelerator.is_main_process:
        save_shrinkage(run.out / f"sigma_epoch{epochs_done}.pt", statistics.per_layer, statistics.layers, {
            "model": f"{run.context.model_name} fine-tuned for {epochs_done} epoch(s)", "layer_spec": spec.layers,
            "epoch": epochs_done, "requested_rows": spec.shrinkage_rows, "tokens": spec.tokens,
            "num_processes": accelerator.num_processes})
    accelerator.print(f"Σ_S recomputed for epoch {epochs_done + 1}: {statistics.selection.count:,} rows")


def _measure(run: TrainingRun, epoch: int) -> SigmaStatistics:
    """Σ_S of the current model over ``spec.layers`` (:func:`istar.steps.shrinkage.training_statistics`), measured
    outside the training wrapper on ``run.context.model``: the module accelerate wraps (``accelerator.unwrap_model``
    gives it back), which a resumed state is loaded into.

    The rows (``shrinkage_rows`` of the training split) come in an order fixed by the run's
    seed and ``epoch``; the result is identical on all processes.
    """
    spec = run.spec
    batch_size = spec.batch_size if get_token_selection(spec.tokens).sigma_uses_training_batches \
        else spec.eval_batch_size
    return training_statistics(run.context, spec.layers, spec.shrinkage_rows, batch_size,
                               spec.seed + 7919 * (epoch + 1), spec.tokens, features=run.train_features,
                               description=f"Σ_S after {epoch} epoch(s)")

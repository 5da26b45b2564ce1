"""Fine-tuning with a baseline, CosReg or I-STAR loss, on accelerate (one readable loop).

    loss = task loss                                       method "base"
    loss = task loss + λ·(1/M²)·Σ_{i≠j} x̂_iᵀx̂_j           method "cosreg" (docs/method.md §4)
    loss = task loss + λ·(1 − IsoScore*(X̃, ζ, Σ_S))        method "istar"  (docs/method.md §3)

I-STAR starts from a Σ_S computed beforehand (``istar shrinkage``) and recomputes it from
the current model at the start of every later epoch, as in the paper; all processes use
the same Σ_S. With ``global_penalty`` the IsoScore* of the *global* batch is penalised under
data parallelism, by all-reducing the covariance statistics differentiably (the reference
code penalises each process's local batch).

Nothing is lost when a job dies: the accelerate state (model, optimizer, scheduler, RNGs,
progress, current Σ_S, training log) is saved atomically at every epoch end and every
``checkpoint_every`` optimizer steps under ``OUT/resume/``; the same command resumes from
the newest one — but only when the run's fingerprint (:func:`istar.steps.resume.run_fingerprint`: every setting,
the data, Σ_S and the model it starts from) is unchanged. A state of a run whose settings
changed is discarded with one line naming what changed, and the run starts afresh; a damaged
state (its files differ from the hashes saved with it) is discarded with one line too.

Faults a cluster delivers (docs/reliability.md): SIGTERM or SIGINT saves a state at the next
optimizer step boundary and exits 128 + signal with one line naming the state (the same command
resumes); one process writes a run folder at a time (:mod:`istar.io.runlock`); the folder's
writability is checked before the model and data are loaded, and the free space its states, model
and Σ_S copies need (:func:`space_needed`) before the first step; a disk that fills during the run
names the file and the state kept, and the same command resumes once space is freed. The given
Σ_S is checked (finite, of this task, of this model's shape) before any forward pass.
Outputs appear atomically when the run is done:

    OUT/metrics.json        per-epoch and final metrics (the last file written; content hash and
                            the model's, checked by every reader: istar.steps.run_folder)
    OUT/train_log.csv       step, loss, task_loss, penalty, isoscore_star, cosine_similarity, penalty_tokens
                            (which positions the penalty and its logged IsoScore* saw: real or
                            all_positions), penalty_rows (rows of X̃ per micro-batch, mean), lr
    OUT/run_config.json     the resolved configuration, precision and environment
    OUT/model/              the final model and tokenizer (save_pretrained)
    OUT/sigma_epoch{e}.pt   the Σ_S used in epoch e (I-STAR)
    OUT/tracking/           TensorBoard and DVCLive files, when ``trackers`` asks for them (:mod:`istar.steps.tracking`)

``run_config.json`` also records the code's provenance (:mod:`istar.io.provenance`: git commit,
uncommitted changes, package versions); the trackers show the same curves live.

Every run, whatever its method, also measures Σ_S of its current model before training and
after every epoch (the same statistic I-STAR recomputes, on ``shrinkage_rows`` rows of the
training data) and records its IsoScore per epoch in metrics.json (``sigma_s_isoscore``,
index = epochs trained): how isotropy moves during fine-tuning, at the cost of one
inference pass over those rows per epoch.

The module runs to about 500 lines because the loop and the Σ_S passes, saves and stops it
interleaves read best in one file; resume states, fingerprints and the stop request live in
:mod:`istar.steps.resume`, the writer lock in :mod:`istar.io.runlock`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import math
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from istar import __version__
from istar.config.specs import TrainSpec, add_spec_arguments, spec_from_cli
from istar.core.isotropy import isoscore_star_from_covariance
from istar.core.regularizers import Penalty, resolve_layers
from istar.core.shrinkage import check_sigma_fits, load_layer_statistics, load_shrinkage, merge_layers, save_shrinkage
from istar.core.tokens import get_token_selection
from istar.data.encoding import EpochShuffleSampler
from istar.io import artifacts
from istar.io.provenance import code_provenance
from istar.io.runlock import writer_lock
from istar.models.shrinkage import accumulate_shrinkage
from istar.registry.methods import get_method
from istar.registry.precisions import PRECISIONS
from istar.steps.evaluate import evaluate_model
from istar.steps.resume import (
    STATES_AT_ONCE,
    Interrupted,
    StopRequest,
    fingerprint_hash,
    latest_state,
    matching_state,
    restore_log,
    run_fingerprint,
    save_state,
    saved_tracking,
)
from istar.steps.run_folder import clear_earlier_outputs, model_sha256
from istar.steps.tracking import Tracking, settings_as_parameters

__all__ = ["TrainSpec", "train", "optimization_step", "build_optimizer", "space_needed", "check_free_space"]

LOG_COLUMNS = ("step", "epoch", "loss", "task_loss", "penalty", "isoscore_star", "cosine_similarity", "penalty_tokens",
               "penalty_rows", "lr")


@dataclass
class Progress:
    """Training progress, saved and restored with the accelerate state."""

    epoch: int = 0
    batches_in_epoch: int = 0
    step: int = 0
    sigma_epoch: int = -1
    sigma_s: torch.Tensor | None = None
    history: list = field(default_factory=list)
    sigma_isoscore: list = field(default_factory=list)  # IsoScore(Σ_S) after 0, 1, … epochs

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)


# ------------------------------------------------------------------------------------- penalty


def compute_penalty(spec: TrainSpec, hidden_states, attention_mask, sigma_s, distributed: bool) -> Penalty | None:
    """The method's term for one batch (None for a method without a penalty, e.g. the baseline)."""
    penalty = get_method(spec.method).penalty
    if penalty is None:
        return None
    return penalty(hidden_states, attention_mask, lam=spec.lam, zeta=spec.zeta, sigma_s=sigma_s, layers=spec.layers,
                   global_batch=spec.global_penalty and distributed, tokens=spec.tokens)


# ------------------------------------------------------------------------------------- training


def build_optimizer(model, spec: TrainSpec) -> torch.optim.Optimizer:
    """AdamW (ε = ``spec.adam_epsilon``) with ``spec.weight_decay`` on every weight but biases and normalisation gains."""
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")
    decay = [p for n, p in model.named_parameters() if p.requires_grad and not n.endswith(no_decay)]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and n.endswith(no_decay)]
    groups = [{"params": decay, "weight_decay": spec.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=spec.learning_rate, eps=spec.adam_epsilon)


def optimization_step(spec: TrainSpec, accelerator, model, optimizer, scheduler, batch: dict, sigma_s,
                      distributed: bool):
    """One micro-batch of training: forward, task loss + penalty, backward, and (when the
    accumulated gradients are synchronised) clipping and the optimizer and scheduler steps.

    Returns (loss, model outputs, Penalty or None); ``loss`` still carries the graph.
    """
    with accelerator.accumulate(model):
        penalised = get_method(spec.method).penalty is not None
        outputs = model(**batch, output_hidden_states=penalised)
        penalty = compute_penalty(spec, outputs.hidden_states, batch["attention_mask"], sigma_s, distributed) \
            if penalised else None
        loss = outputs.loss if penalty is None else outputs.loss + penalty.term
        accelerator.backward(loss)
        if accelerator.sync_gradients and spec.max_grad_norm > 0:
            accelerator.clip_grad_norm_(model.parameters(), spec.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return loss, outputs, penalty


@dataclass
class Run:
    """What the loop and the final write share about one run (no settings: those are in ``spec``)."""

    spec: TrainSpec
    step: object  # istar.steps.common.Step
    out: Path
    resume_dir: Path
    log_path: Path
    precision: str
    fingerprint: dict
    tracking: Tracking
    total_steps: int = 0

    def save_state(self, step: int) -> None:
        """A resumable state; the trackers hold every point up to it first."""
        self.tracking.commit()
        save_state(self.step.accelerator, self.resume_dir, step, self.log_path, self.fingerprint, self.tracking.state())


def train(spec: TrainSpec, restart: bool = False) -> dict:
    """Fine-tune ``spec.model`` on the prepared task in ``spec.data_dir``; see the module docstring.

    ``restart`` discards any saved state and starts from scratch.

    Returns
    -------
    The content of ``metrics.json``.
    """
    spec.validate()
    out = Path(spec.output_dir)
    resume_dir = out / "resume"
    created_resume_dir = not resume_dir.exists()
    # Before any model or data is loaded: the folder must be writable, and this run its only writer.
    artifacts.check_writable(out)
    # One lock per run: the main process holds it for all (RANK is set by accelerate/torchrun).
    lock = writer_lock(out) if os.environ.get("RANK", "0") == "0" else contextlib.nullcontext()
    try:
        with lock:
            return _train(spec, out, resume_dir, restart)
    except BaseException:
        # A run that failed before saving any state leaves no empty folder behind.
        if created_resume_dir and resume_dir.is_dir() and not any(resume_dir.iterdir()):
            resume_dir.rmdir()
        raise


def _train(spec: TrainSpec, out: Path, resume_dir: Path, restart: bool) -> dict:
    from accelerate.utils import set_seed
    from transformers import get_scheduler

    from istar.steps.common import open_step

    tracking = Tracking(spec.trackers, out, spec.tracking_experiment, spec.mlflow_tracking_uri)
    tracking.preflight()  # a tracking server that does not answer stops the run before anything is loaded
    # The given Σ_S is read (hash, NaN / inf) before the model and data are loaded.
    given_sigma = load_layer_statistics(spec.sigma_s) if get_method(spec.method).needs_sigma_s(spec.zeta) else None
    # (files written before the setting existed hold real-token rows)
    if given_sigma is not None and given_sigma[1].get("tokens", "real") != spec.tokens:
        raise ValueError(f"{spec.sigma_s} holds Σ_S of {given_sigma[1].get('tokens', 'real')} rows but this run's "
                         f"penalty reads {spec.tokens} rows: compute it with `istar shrinkage --tokens {spec.tokens}`")
    step = open_step(spec, model_seed=spec.seed, gradient_accumulation_steps=spec.gradient_accumulation_steps,
                     log_with=tracking.log_with, project_dir=tracking.project_dir)
    accelerator, task, model = step.accelerator, step.task, step.model
    if given_sigma is not None:  # of this task and this model's shape, before any forward pass
        check_sigma_fits(spec.sigma_s, *given_sigma, task=task.key, data=spec.data_dir,
                         shape=(model.config.hidden_size, model.config.num_hidden_layers + 1), model=step.model_name)
    precision = step.precision.label
    distributed = accelerator.num_processes > 1
    if accelerator.is_main_process:
        if restart:
            shutil.rmtree(resume_dir, ignore_errors=True)
        resume_dir.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    num_hidden, hidden_size = model.config.num_hidden_layers + 1, model.config.hidden_size
    # the layers the penalty reads and Σ_S is measured over (the registry gives every method some)
    layer_indices = resolve_layers(spec.penalty_layers, num_hidden)
    set_seed(spec.seed, device_specific=True)

    selection = get_token_selection(spec.tokens)
    pad_multiple = 8 if step.precision.key != "no" and selection.pad_multiple else None
    eval_columns = step.columns("validation")
    train_features = step.features("train")
    eval_features = step.features("validation", columns=eval_columns, for_qa_eval=True)
    sampler = EpochShuffleSampler(len(train_features), spec.seed)
    train_loader = step.loader(train_features, spec.batch_size, sampler=sampler, pad_to_multiple_of=pad_multiple)
    eval_loader = step.loader(eval_features, spec.eval_batch_size, pad_to_multiple_of=pad_multiple)

    steps_per_epoch = math.ceil(len(train_loader) / spec.gradient_accumulation_steps)
    total_steps = steps_per_epoch * spec.epochs
    optimizer = build_optimizer(model, spec)
    scheduler = get_scheduler(spec.scheduler, optimizer, num_warmup_steps=int(spec.warmup_ratio * total_steps),
                              num_training_steps=total_steps)
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    fingerprint = run_fingerprint(spec, step.meta, step.model_path, accelerator.num_processes, precision)
    run = Run(spec=spec, step=step, out=out, resume_dir=resume_dir, log_path=resume_dir / "train_log.csv",
              precision=precision, fingerprint=fingerprint, tracking=tracking, total_steps=total_steps)
    state = matching_state(resume_dir, fingerprint, accelerator.print) if accelerator.is_main_process else None
    accelerator.wait_for_everyone()
    state = latest_state(resume_dir)  # every process sees what the main process kept
    if state is not None:
        _load_state(accelerator, state)
        accelerator.print(f"resuming from {state} (epoch {progress.epoch + 1}, batch {progress.batches_in_epoch}, step {progress.step})")
    if accelerator.is_main_process:
        # A folder reused (another setting, or the same one trained again) must not keep the old
        # metrics.json and model/ beside the new run's state.
        clear_earlier_outputs(out, resuming=state is not None, print_fn=accelerator.print)
        restore_log(run.log_path, state)
    accelerator.wait_for_everyone()
    check_free_space(run, accelerator.unwrap_model(model))
    tracking.start(accelerator, settings_as_parameters(spec, code_provenance()),
                   resume_step=progress.step if state is not None else None, saved=saved_tracking(state))

    unwrapped = accelerator.unwrap_model(model)
    if given_sigma is not None and progress.sigma_s is None:
        per_layer, provenance = given_sigma
        progress.sigma_s, _ = load_shrinkage(spec.sigma_s, expected_layers=layer_indices, expected_dim=hidden_size)
        progress.sigma_epoch = 0
        if accelerator.is_main_process:
            save_shrinkage(out / "sigma_epoch0.pt", per_layer, layer_indices, provenance)
    if not progress.sigma_isoscore:
        # I-STAR's Σ_S before training is the file it was given; the other runs measure their own.
        sigma = (progress.sigma_s if progress.sigma_s is not None
                 else _sigma_pass(run, unwrapped, train_features, 0)[1].covariance().cpu())
        progress.sigma_isoscore.append(_isoscore(sigma))
        tracking.log({"sigma_s_isoscore": progress.sigma_isoscore[0]}, step=0)
    sigma_device = progress.sigma_s.to(accelerator.device) if progress.sigma_s is not None else None

    requested = PRECISIONS[spec.mixed_precision].label
    accelerator.print(
        f"{spec.method} on {task.display} ({len(train_features):,} train features, {len(eval_features):,} eval) | "
        f"{accelerator.num_processes} process(es) on {accelerator.device.type} | precision {precision}"
        + (f" (asked for {spec.mixed_precision})" if precision != requested else "")
        + f" | {total_steps} optimizer steps")
    start_time = time.perf_counter()
    with StopRequest() as stop:
        _loop(run, stop, model, optimizer, scheduler, train_loader, eval_loader, eval_columns, eval_features,
              train_features, progress, sigma_device, distributed)
    return _finish(run, unwrapped, progress, time.perf_counter() - start_time)


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


def check_free_space(run: Run, model) -> None:
    """Before the first step: room on the run folder's disk for :func:`space_needed`, less what the
    folder holds of it already (a state to resume from, earlier Σ_S copies). Raises
    :class:`istar.io.artifacts.NotEnoughSpaceError` saying how much is missing."""
    need = space_needed(run.spec, model)
    held = sum(p.stat().st_size for state in run.resume_dir.glob("state-*") for p in state.rglob("*") if p.is_file()) \
        + sum(p.stat().st_size for p in run.out.glob("sigma_epoch*.pt"))
    size, copies = artifacts.format_bytes, need["copies"]
    what = (f"training writes resume states of about {size(need['state'])} each ({STATES_AT_ONCE} at once while one "
            f"replaces the other) and the final model ({size(need['model'])}) beside the last one"
            + (f", and {copies} Σ_S cop{'y' if copies == 1 else 'ies'} of {size(need['sigma_copy'])}" if copies else "")
            + f": {size(need['total'])} at most")
    artifacts.check_free_space(run.out, need["total"] - held, what, "no training step was taken")


def _load_state(accelerator, state: Path) -> None:
    try:
        accelerator.load_state(str(state))
    except Exception as error:
        # The model may be half overwritten by now: this process cannot start afresh by itself.
        raise ValueError(f"the saved state {state} cannot be loaded ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}): run the same command with `--restart` "
                         f"to start this run afresh (or remove {state.parent})") from None


def _stop_if_asked(run: Run, stop: StopRequest, progress: Progress, save: bool) -> None:
    """At a step boundary: if a signal asked to stop, save a state (``save``) and raise :class:`Interrupted`."""
    signum = stop.requested(run.step.accelerator)
    if signum is None:
        return
    if save:
        run.save_state(progress.step)
    state = latest_state(run.resume_dir)
    raise Interrupted(signum, f"stopped by {signal.Signals(signum).name} after optimizer step {progress.step} "
                              f"(epoch {progress.epoch + (1 if progress.batches_in_epoch else 0)}); the state is saved in "
                              f"{state}: run the same command again to resume from it")


def _loop(run: Run, stop: StopRequest, model, optimizer, scheduler, train_loader, eval_loader, eval_columns, eval_features,
          train_features, progress: Progress, sigma_device, distributed: bool) -> None:
    """The epochs still to train (from ``progress``): steps, periodic states, evaluation, Σ_S, epoch-end state."""
    spec, accelerator, task = run.spec, run.step.accelerator, run.step.task
    resume_dir, fingerprint = run.resume_dir, run.fingerprint
    unwrapped = accelerator.unwrap_model(model)
    for epoch in range(progress.epoch, spec.epochs):
        loader = train_loader
        if progress.batches_in_epoch:
            loader = accelerator.skip_first_batches(train_loader, progress.batches_in_epoch)
        loader.set_epoch(epoch)  # accelerate passes it on to the sampler: the order is fixed by (seed, epoch)
        model.train()
        sums: dict[str, float] = {}
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{spec.epochs}", disable=not accelerator.is_local_main_process,
                   initial=progress.batches_in_epoch, total=len(train_loader))
        for batch in bar:
            loss, outputs, penalty = optimization_step(spec, accelerator, model, optimizer, scheduler, batch,
                                                       sigma_device, distributed)
            progress.batches_in_epoch += 1
            _add_to_sums(sums, loss, outputs.loss, penalty)
            if not math.isfinite(sums["loss"]):
                raise FloatingPointError(
                    f"non-finite loss at epoch {epoch + 1}, batch {progress.batches_in_epoch}, optimizer step "
                    f"{progress.step + 1} (task loss {float(outputs.loss):.4g}"
                    + (f", penalty {float(penalty.term):.4g}" if penalty is not None else "")
                    + "): lower the learning rate or |λ|, or use fp32/bf16. The last saved state is kept in "
                    f"{resume_dir}; a run with a changed setting starts afresh by itself, and `--restart` "
                    "(or removing that folder) starts the same settings from scratch")
            if not accelerator.sync_gradients:
                continue
            progress.step += 1
            if progress.step % spec.log_every == 0:
                row = _log_row(accelerator, sums, progress.step, epoch + 1, scheduler.get_last_lr()[0], spec.tokens)
                if accelerator.is_main_process:
                    _append_log(run.log_path, row)
                    run.tracking.log({f"train/{key}": row[key] for key in LOG_COLUMNS if key not in ("step", "epoch")},
                                 step=progress.step)
                bar.set_postfix(loss=f"{row['loss']:.4f}", **({"iso*": f"{row['isoscore_star']:.3f}"} if row["isoscore_star"] != "" else {}))
            sums = {}
            checkpoint = spec.checkpoint_every and progress.step % spec.checkpoint_every == 0
            if checkpoint:
                run.save_state(progress.step)
            _stop_if_asked(run, stop, progress, save=not checkpoint)
        bar.close()

        result = evaluate_model(model, eval_loader, task, accelerator, features=eval_features, columns=eval_columns)
        progress.history.append({"epoch": epoch + 1, "step": progress.step, **result})
        accelerator.print(f"epoch {epoch + 1}: " + ", ".join(f"{k} = {v:.4f}" for k, v in result.items()))
        progress.epoch, progress.batches_in_epoch = epoch + 1, 0
        sigma_device = _track_sigma(run, unwrapped, train_features, epoch + 1, progress, sigma_device)
        run.tracking.log({"epoch": epoch + 1, "sigma_s_isoscore": progress.sigma_isoscore[-1],
                      **{f"eval/{key}": value for key, value in result.items()}}, step=progress.step)
        run.save_state(progress.step)
        _stop_if_asked(run, stop, progress, save=False)


def _sigma_pass(run: Run, model, train_features, epoch: int):
    """Σ_S statistics of the current model: (per-layer accumulators, their merge over the selected layers, indices).

    The rows (``shrinkage_rows`` of the training split) come in an order fixed by the run's
    seed and ``epoch``; the result is identical on all processes.
    """
    from accelerate.data_loader import prepare_data_loader

    spec, accelerator = run.spec, run.step.accelerator
    selection = get_token_selection(spec.tokens)
    batch_size = spec.batch_size if selection.sigma_uses_training_batches else spec.eval_batch_size
    loader = run.step.loader(train_features, batch_size,
                             sampler=EpochShuffleSampler(len(train_features), spec.seed + 7919 * (epoch + 1)))
    # even_batches=False: accelerate would otherwise repeat rows to even out the shards, and Σ_S
    # would count them twice.
    loader = prepare_data_loader(loader, accelerator.device, accelerator.num_processes, accelerator.process_index,
                                 put_on_device=True, even_batches=False)
    per_layer = accumulate_shrinkage(model, loader, spec.layers, spec.shrinkage_rows, accelerator,
                                     description=f"Σ_S after {epoch} epoch(s)", tokens=spec.tokens)
    indices = resolve_layers(spec.layers, len(per_layer))
    return per_layer, merge_layers(per_layer, indices), indices


def _isoscore(sigma: torch.Tensor) -> float:
    """IsoScore of a covariance (d, d): IsoScore* with ζ = 0 (docs/method.md §2)."""
    return float(isoscore_star_from_covariance(sigma, 0.0))


def _track_sigma(run: Run, model, train_features, epochs_done: int, progress: Progress, sigma_device):
    """Σ_S of the model after ``epochs_done`` epochs: its IsoScore is recorded, and I-STAR with
    ``recompute_shrinkage`` trains the next epoch with it (saved as ``sigma_epoch{e}.pt``).

    Returns the Σ_S the next epoch's penalty uses (on the device), unchanged for the other runs.
    """
    spec, accelerator = run.spec, run.step.accelerator
    per_layer, selection, indices = _sigma_pass(run, model, train_features, epochs_done)
    sigma = selection.covariance().cpu()
    progress.sigma_isoscore.append(_isoscore(sigma))
    if not (get_method(spec.method).needs_sigma_s(spec.zeta) and spec.recompute_shrinkage and epochs_done < spec.epochs):
        return sigma_device
    progress.sigma_s, progress.sigma_epoch = sigma, epochs_done
    if accelerator.is_main_process:
        save_shrinkage(run.out / f"sigma_epoch{epochs_done}.pt", per_layer, indices, {
            "model": f"{run.step.model_name} fine-tuned for {epochs_done} epoch(s)", "layer_spec": spec.layers,
            "epoch": epochs_done, "requested_rows": spec.shrinkage_rows, "tokens": spec.tokens,
            "num_processes": accelerator.num_processes})
    accelerator.print(f"Σ_S recomputed for epoch {epochs_done + 1}: {selection.count:,} rows")
    return sigma.to(accelerator.device)


def _add_to_sums(sums: dict, loss, task_loss, penalty: Penalty | None) -> None:
    values = {"loss": loss, "task_loss": task_loss}
    if penalty is not None:
        values["penalty"] = penalty.term
        values.update(penalty.logs)
    for key, value in values.items():
        sums[key] = sums.get(key, 0.0) + float(value.detach())
    sums["micro_batches"] = sums.get("micro_batches", 0) + 1


def _log_row(accelerator, sums: dict, step: int, epoch: int, lr: float, tokens: str) -> dict:
    """One train_log.csv row: micro-batch means, averaged over processes."""
    keys = [k for k in ("loss", "task_loss", "penalty", "isoscore_star", "cosine_similarity", "penalty_rows") if k in sums]
    local = torch.tensor([sums[k] / sums["micro_batches"] for k in keys], device=accelerator.device)
    averaged = accelerator.reduce(local, reduction="mean").tolist() if accelerator.num_processes > 1 else local.tolist()
    row = {k: "" for k in LOG_COLUMNS}
    row.update(zip(keys, averaged))
    row.update(step=step, epoch=epoch, lr=lr, **({"penalty_tokens": tokens} if "penalty_rows" in sums else {}))
    return row


def _append_log(path: Path, row: dict) -> None:
    new = not path.exists()
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=LOG_COLUMNS)
        if new:
            writer.writeheader()
        writer.writerow(row)


def _finish(run: Run, model, progress: Progress, seconds: float) -> dict:
    """Write the final outputs atomically; metrics.json last, as the run's completion mark."""
    spec, step, out = run.spec, run.step, run.out
    accelerator, task, meta = step.accelerator, step.task, step.meta
    method = get_method(spec.method)
    final = progress.history[-1] if progress.history else {}
    fingerprint = fingerprint_hash(run.fingerprint)
    report = {
        "task": task.key, "model": step.model_name, "method": spec.method, "lam": spec.lam,
        "zeta": spec.zeta if method.takes("zeta") else None,
        "layers": spec.layers if method.takes("layers") else None, "tokens": spec.tokens, "seed": spec.seed,
        "standin": step.standin, "standin_note": meta.get("standin_note"),
        "metric": task.metric, "final": final, "epochs": progress.history,
        "sigma_s_isoscore": progress.sigma_isoscore, "fingerprint": fingerprint,
    }
    if accelerator.is_main_process:
        state = latest_state(run.resume_dir)
        kept = (f"the trained state {state} is kept (metrics.json is written last, so the run is not marked done); "
                "the same command finishes the run from it")
        try:
            report = _write_outputs(run, model, report, seconds)
        except artifacts.OutOfSpaceError as error:
            raise artifacts.OutOfSpaceError(error.path, kept) from None
        shutil.rmtree(run.resume_dir, ignore_errors=True)
    run.tracking.finish()
    accelerator.wait_for_everyone()
    accelerator.print(f"done: {task.metric} = {final.get(task.metric, float('nan')):.4f} -> {out}")
    return report


def _write_outputs(run: Run, model, report: dict, seconds: float) -> dict:
    """The final model, log, run_config.json and metrics.json (last), each atomically; returns the
    report as written (with its content hash and the model's)."""
    spec, step, out = run.spec, run.step, run.out
    accelerator, task = step.accelerator, step.task
    staging = out / ".model-staging"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with artifacts.storage_errors(out / "model"):
            model.save_pretrained(staging, save_function=accelerator.save)
            step.tokenizer.save_pretrained(staging)
            artifacts.record_digests(staging)  # checked whenever the model is loaded again
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    artifacts.replace_directory(staging, out / "model")
    with artifacts.atomic_path(out / "train_log.csv") as tmp:
        shutil.copy2(run.log_path, tmp) if run.log_path.exists() else tmp.write_text(",".join(LOG_COLUMNS) + "\n")
    report["model_sha256"] = model_sha256(out / "model")
    artifacts.write_json(out / "run_config.json", {
        **dataclasses.asdict(spec), "model_path": step.model_path, "task": task.key,
        "precision": {"requested": spec.mixed_precision, "effective": run.precision},
        "num_processes": accelerator.num_processes, "device": accelerator.device.type,
        "total_optimizer_steps": run.total_steps, "train_seconds": round(seconds, 2),
        "model_source": step.model_name, "data_meta": step.meta, "fingerprint": report["fingerprint"],
        "fingerprint_inputs": run.fingerprint, "istar_version": __version__, "torch_version": torch.__version__,
        "provenance": code_provenance(), "trackers": {"names": list(spec.trackers), **run.tracking.state()},
    }, digest=True)
    # Last, as the completion mark; its hash and model_sha256 are checked by every reader (istar.steps.run_folder).
    return artifacts.write_json(out / "metrics.json", report, digest=True)


# ------------------------------------------------------------------------------------- CLI


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arguments(parser, TrainSpec)
    parser.add_argument("--restart", action="store_true",
                        help="discard any saved state of this run and start from scratch")


def run_cli(args) -> int:
    train(spec_from_cli(args), restart=args.restart)
    return 0

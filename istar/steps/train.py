"""Fine-tuning with a baseline, CosReg or I-STAR loss, on accelerate (one readable loop).

    loss = task loss                                       method "base"
    loss = task loss + λ·(1/M²)·Σ_{i≠j} x̂_iᵀx̂_j           method "cosreg" (docs/method.md §4)
    loss = task loss + λ·(1 − IsoScore*(X̃, ζ, Σ_S))        method "istar"  (docs/method.md §3)

The module reads top to bottom: :func:`prepare` builds a :class:`istar.steps.run_state.TrainingRun` (model, optimizer,
scheduler, loaders, progress, Σ_S tracking), :func:`train_epochs` trains it, and
:func:`istar.steps.train_outputs.finish_run` writes the outputs, atomically, ``metrics.json`` last
as the run's completion mark. With ``global_penalty`` the IsoScore* of the *global* batch is
penalised under data parallelism, by all-reducing the covariance statistics differentiably (the
reference code penalises each process's local batch).

Σ_S (:mod:`istar.steps.sigma_tracking`): I-STAR starts from a Σ_S computed beforehand (``istar
shrinkage``) and recomputes it from the current model at the start of every later epoch, as in
the paper; all processes use the same Σ_S. Every run, whatever its method, also measures Σ_S of
its current model before training and after every epoch over ``layers`` (the configured
selection, whatever layers the method's penalty reads; for I-STAR they are the same), on
``shrinkage_rows`` rows of the training data, and records its IsoScore per epoch in metrics.json
(``sigma_s_isoscore``, index = epochs trained).

Nothing is lost when a job dies (docs/reliability.md): the accelerate state (model, optimizer,
scheduler, RNGs, progress, current Σ_S, training log) is saved atomically at every epoch end,
every ``checkpoint_every`` optimizer steps and on SIGTERM or SIGINT, under ``OUT/resume/``; the
same command resumes from the newest one when the run's fingerprint
(:func:`istar.steps.resume.run_fingerprint`) is unchanged. One process writes a run folder at a
time (:mod:`istar.io.runlock`); its writability and the given Σ_S (finite, of this task, of this
model's shape) are checked before the model and data are loaded, and the free
space the run needs (:func:`istar.steps.resume.check_free_space`) before the first step.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from istar.config.specs import TrainSpec, add_spec_arguments, spec_from_cli
from istar.core.regularizers import Penalty
from istar.core.tokens import get_token_selection
from istar.data.encoding import EpochShuffleSampler
from istar.io import artifacts
from istar.io.runlock import writer_lock
from istar.registry.compile_modes import BUCKET_MULTIPLE, get_compile_mode
from istar.registry.precisions import PRECISIONS
from istar.steps.evaluate import evaluate_model, print_evaluation
from istar.steps.gpu_memory import claim_gpu_share
from istar.steps.common import ModelContext
from istar.steps.resume import (
    Interrupted,
    Progress,
    StopRequest,
    check_free_space,
    latest_state,
    load_state,
    matching_state,
    restore_log,
    run_fingerprint,
    saved_tracking,
)
from istar.steps.run_folder import clear_earlier_outputs
from istar.steps.run_state import TrainingRun
from istar.steps.sigma_tracking import read_given_sigma, sigma_after_epoch, start_sigma
from istar.steps.tracking import Tracking
from istar.steps.train_outputs import add_to_sums, finish_run, log_step
from istar.steps.train_step import build_optimizer, optimization_step, step_forward

__all__ = ["TrainSpec", "train", "prepare", "train_epochs", "deterministic_algorithms"]


# cuBLAS's deterministic mode needs a fixed workspace (PyTorch's reproducibility notes); it is read when the
# process's first cuBLAS handle is created, so it is set before the model reaches the GPU.
CUBLAS_WORKSPACE = ":4096:8"


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool):
    """Run the block with PyTorch's deterministic algorithms (``training.deterministic``) when ``enabled``;
    the earlier setting and ``CUBLAS_WORKSPACE_CONFIG`` come back afterwards (a step called in-process
    leaves its caller as it was). run_config.json records what ran (its ``determinism``)."""
    if not enabled:
        yield
        return
    before, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)
        if workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


# ------------------------------------------------------------------------------------- the run's state


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
        with lock, deterministic_algorithms(spec.deterministic):
            run = prepare(spec, out, resume_dir, restart)
            start_time = time.perf_counter()
            with StopRequest() as stop:
                train_epochs(run, stop)
            return finish_run(run, time.perf_counter() - start_time)
    except BaseException:
        # A run that failed before saving any state leaves no empty folder behind.
        if created_resume_dir and resume_dir.is_dir() and not any(resume_dir.iterdir()):
            resume_dir.rmdir()
        raise


def prepare(spec: TrainSpec, out: Path, resume_dir: Path, restart: bool) -> TrainingRun:
    """Everything before the first step, what fails soonest first: the trackers answer, the given Σ_S
    is sound, then the model, data, optimizer and scheduler are built and a saved state of this run
    (the same fingerprint) is resumed; the disk has room, and Σ_S before training is recorded."""
    from accelerate.utils import set_seed

    from istar.steps.common import open_model_context

    tracking = Tracking(spec)
    tracking.preflight()  # a tracking server that does not answer stops the run before anything is loaded
    given_sigma = read_given_sigma(spec)  # before the model and data are loaded
    context = open_model_context(spec, model_seed=spec.seed, gradient_accumulation_steps=spec.gradient_accumulation_steps,
                                 log_with=tracking.log_with, project_dir=tracking.project_dir)
    claim_gpu_share(context.model, spec.batch_size, spec.max_length, context.precision, context.accelerator.device)
    forward = step_forward(spec.compile, context.accelerator.device)  # refused here where it cannot run
    accelerator = context.accelerator
    if accelerator.is_main_process:
        if restart:
            shutil.rmtree(resume_dir, ignore_errors=True)
        resume_dir.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    set_seed(spec.seed, device_specific=True)
    run = _build(spec, context, out, resume_dir, tracking, forward)
    state = _resume(run)
    check_free_space(spec, accelerator.unwrap_model(run.model), out, resume_dir)
    tracking.start(accelerator, run.progress.step if state is not None else None, saved_tracking(state))
    isoscore = start_sigma(run, given_sigma)
    if isoscore is not None:
        tracking.log({"sigma_s_isoscore": isoscore}, step=0)
    precision, requested = context.precision.label, PRECISIONS[spec.mixed_precision].label
    accelerator.print(
        f"{spec.method} on {context.task.display} ({len(run.train_features):,} train features, "
        f"{len(run.eval_features):,} eval) | {accelerator.num_processes} process(es) on {accelerator.device.type} | "
        f"precision {precision}" + (f" (asked for {spec.mixed_precision})" if precision != requested else "")
        + f" | {run.total_steps} optimizer steps")
    return run


def batch_pad_multiple(spec: TrainSpec, precision) -> int | None:
    """What a batch's length is rounded up to (None: its longest sequence): nothing where the penalty counts
    padding (:class:`istar.core.tokens.TokenSelection`), else a compiled step's few bucket lengths
    (:data:`istar.registry.compile_modes.BUCKET_MULTIPLE`), else 8 in fp16/bf16 (its kernels' tile)."""
    if not get_token_selection(spec.tokens).pad_multiple:
        return None
    if get_compile_mode(spec.compile).compiles:
        return BUCKET_MULTIPLE
    return 8 if precision.key != "no" else None


def _build(spec: TrainSpec, context: ModelContext, out: Path, resume_dir: Path, tracking: Tracking,
           forward: Callable) -> TrainingRun:
    """The loaders, the optimizer and the scheduler, prepared by accelerate, and a fresh progress (its Σ_S
    is started once a saved state is resumed: :func:`istar.steps.sigma_tracking.start_sigma`)."""
    from transformers import get_scheduler

    accelerator = context.accelerator
    pad_multiple = batch_pad_multiple(spec, context.precision)
    eval_columns = context.columns("validation")
    train_features = context.features("train")
    eval_features = context.features("validation", columns=eval_columns, for_qa_eval=True)
    sampler = EpochShuffleSampler(len(train_features), spec.seed)
    train_loader = context.loader(train_features, spec.batch_size, sampler=sampler, pad_to_multiple_of=pad_multiple)
    eval_loader = context.loader(eval_features, spec.eval_batch_size, pad_to_multiple_of=pad_multiple)

    total_steps = math.ceil(len(train_loader) / spec.gradient_accumulation_steps) * spec.epochs
    optimizer = build_optimizer(context.model, spec)
    scheduler = get_scheduler(spec.scheduler, optimizer, num_warmup_steps=int(spec.warmup_ratio * total_steps),
                              num_training_steps=total_steps)
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        context.model, optimizer, train_loader, eval_loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    fingerprint = run_fingerprint(spec, context.meta, context.model_path, accelerator.num_processes,
                                  context.precision.label)
    return TrainingRun(spec=spec, context=context, out=out, resume_dir=resume_dir, tracking=tracking, model=model,
                       optimizer=optimizer, scheduler=scheduler, train_loader=train_loader, eval_loader=eval_loader,
                       train_features=train_features, eval_features=eval_features, eval_columns=eval_columns,
                       progress=progress, fingerprint=fingerprint, total_steps=total_steps, forward=forward)


def _resume(run: TrainingRun) -> Path | None:
    """Load the newest saved state of this run (a state of other settings is discarded by the main
    process first); the run folder keeps no outputs of an earlier run. Returns the state, or None."""
    accelerator, progress = run.accelerator, run.progress
    if accelerator.is_main_process:
        matching_state(run.resume_dir, run.fingerprint, accelerator.print)
    accelerator.wait_for_everyone()
    state = latest_state(run.resume_dir)  # every process sees what the main process kept
    if state is not None:
        load_state(accelerator, state)
        accelerator.print(f"resuming from {state} (epoch {progress.epoch + 1}, batch {progress.batches_in_epoch}, "
                          f"step {progress.step})")
    if accelerator.is_main_process:
        # A folder reused (another setting, or the same one trained again) must not keep the old
        # metrics.json and model/ beside the new run's state.
        clear_earlier_outputs(run.out, resuming=state is not None, print_fn=accelerator.print)
        restore_log(run.log_path, state)
    accelerator.wait_for_everyone()
    return state


# ------------------------------------------------------------------------------------- the loop


def train_epochs(run: TrainingRun, stop: StopRequest) -> None:
    """The epochs still to train (from ``run.progress``): steps, periodic states, evaluation, Σ_S, epoch-end state."""
    for epoch in range(run.progress.epoch, run.spec.epochs):
        _train_epoch(run, stop, epoch)
        _end_epoch(run, stop, epoch)


def _train_epoch(run: TrainingRun, stop: StopRequest, epoch: int) -> None:
    """The optimizer steps of one epoch (the rest of it, on resuming), with the log and periodic states."""
    spec, accelerator, progress = run.spec, run.accelerator, run.progress
    loader = run.train_loader
    if progress.batches_in_epoch:
        loader = accelerator.skip_first_batches(run.train_loader, progress.batches_in_epoch)
    loader.set_epoch(epoch)  # accelerate passes it on to the sampler: the order is fixed by (seed, epoch)
    run.model.train()
    sums: dict[str, float] = {}
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{spec.epochs}", disable=not accelerator.is_local_main_process,
               initial=progress.batches_in_epoch, total=len(run.train_loader))
    for batch in bar:
        loss, outputs, penalty = optimization_step(spec, accelerator, run.model, run.optimizer, run.scheduler, batch,
                                                   run.penalty_sigma, accelerator.num_processes > 1, run.forward)
        progress.batches_in_epoch += 1
        add_to_sums(sums, loss, outputs.loss, penalty)
        if not math.isfinite(sums["loss"]):
            raise _non_finite(run, epoch, outputs.loss, penalty)
        if not accelerator.sync_gradients:
            continue
        progress.step += 1
        if progress.step % spec.log_every == 0:
            row = log_step(run, sums, epoch + 1)
            bar.set_postfix(loss=f"{row['loss']:.4f}", **({"iso*": f"{row['isoscore_star']:.3f}"} if row["isoscore_star"] != "" else {}))
        sums = {}
        checkpoint = spec.checkpoint_every and progress.step % spec.checkpoint_every == 0
        if checkpoint:
            run.save_state()
        _stop_if_asked(run, stop, save=not checkpoint)
    bar.close()


def _end_epoch(run: TrainingRun, stop: StopRequest, epoch: int) -> None:
    """After the last step of ``epoch``: evaluation, Σ_S of the model, and a state."""
    accelerator, progress = run.accelerator, run.progress
    result = evaluate_model(run.model, run.eval_loader, run.context.task, accelerator, features=run.eval_features,
                            columns=run.eval_columns)
    progress.history.append({"epoch": epoch + 1, "step": progress.step, **result})
    print_evaluation(accelerator, f"epoch {epoch + 1}", result, run.context.task)
    progress.epoch, progress.batches_in_epoch = epoch + 1, 0
    sigma_after_epoch(run, epoch + 1)
    run.tracking.log({"epoch": epoch + 1, "sigma_s_isoscore": progress.sigma_isoscore[-1],
                      **{f"eval/{key}": value for key, value in result.items()}}, step=progress.step)
    run.save_state()
    _stop_if_asked(run, stop, save=False)


def _non_finite(run: TrainingRun, epoch: int, task_loss, penalty: Penalty | None) -> FloatingPointError:
    progress = run.progress
    return FloatingPointError(
        f"non-finite loss at epoch {epoch + 1}, batch {progress.batches_in_epoch}, optimizer step "
        f"{progress.step + 1} (task loss {float(task_loss):.4g}"
        + (f", penalty {float(penalty.term):.4g}" if penalty is not None else "")
        + "): lower the learning rate or |λ|, or use fp32/bf16. The last saved state is kept in "
        f"{run.resume_dir}; a run with a changed setting starts afresh by itself, and `--restart` "
        "(or removing that folder) starts the same settings from scratch")


def _stop_if_asked(run: TrainingRun, stop: StopRequest, save: bool) -> None:
    """At a step boundary: if a signal asked to stop, save a state (``save``) and raise :class:`Interrupted`."""
    signum = stop.requested(run.accelerator)
    if signum is None:
        return
    if save:
        run.save_state()
    progress, state = run.progress, latest_state(run.resume_dir)
    raise Interrupted(signum, f"stopped by {signal.Signals(signum).name} after optimizer step {progress.step} "
                              f"(epoch {progress.epoch + (1 if progress.batches_in_epoch else 0)}); the state is saved in "
                              f"{state}: run the same command again to resume from it")


# ------------------------------------------------------------------------------------- CLI


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec_arguments(parser, TrainSpec)
    parser.add_argument("--restart", action="store_true",
                        help="discard any saved state of this run and start from scratch")


def run_cli(args) -> int:
    train(spec_from_cli(args), restart=args.restart)
    return 0

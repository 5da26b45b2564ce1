"""What a fine-tuning run (:mod:`istar.steps.train`) writes: its ``train_log.csv`` rows while it
trains, and its outputs, each atomically, when it is done::

    OUT/metrics.json        per-epoch and final metrics (the last file written; content hash and
                            the model's, checked by every reader: istar.io.results), the trivial
                            predictor's score beside them and ``collapsed``: whether the final
                            evaluation failed to beat it (istar.core.metrics.collapsed)
    OUT/train_log.csv       step, loss, task_loss, penalty, isoscore_star, cosine_similarity, penalty_tokens
                            (which positions the penalty and its logged IsoScore* saw: real or
                            all_positions), penalty_rows (rows of X̃ per micro-batch, mean), lr
    OUT/run_config.json     the resolved configuration, precision, determinism (whether PyTorch's
                            deterministic algorithms ran: training.deterministic) and environment, and the code's
                            provenance (:mod:`istar.io.provenance`: git commit, uncommitted changes,
                            package versions)
    OUT/model/              the final model and tokenizer (save_pretrained)

(``sigma_epoch{e}.pt``, the Σ_S used in epoch e, are written by :mod:`istar.steps.sigma_tracking`.)
"""

from __future__ import annotations

import csv
import dataclasses
import os
import shutil
from typing import TYPE_CHECKING

import torch

from istar import __version__
from istar.core import metrics
from istar.core.regularizers import Penalty
from istar.io import artifacts
from istar.io.provenance import code_provenance, portable_path
from istar.registry.methods import get_method
from istar.steps.resume import fingerprint_hash, latest_state
from istar.io.results import model_sha256

if TYPE_CHECKING:
    from istar.steps.run_state import TrainingRun

__all__ = ["LOG_COLUMNS", "add_to_sums", "log_step", "finish_run"]

LOG_COLUMNS = ("step", "epoch", "loss", "task_loss", "penalty", "isoscore_star", "cosine_similarity", "penalty_tokens",
               "penalty_rows", "lr")


def add_to_sums(sums: dict, loss, task_loss, penalty: Penalty | None) -> None:
    """Add one micro-batch's losses (and the penalty's logs) to the sums of the current log row."""
    values = {"loss": loss, "task_loss": task_loss}
    if penalty is not None:
        values["penalty"] = penalty.term
        values.update(penalty.logs)
    for key, value in values.items():
        sums[key] = sums.get(key, 0.0) + float(value.detach())
    sums["micro_batches"] = sums.get("micro_batches", 0) + 1


def log_step(run: TrainingRun, sums: dict, epoch: int) -> dict:
    """The row of ``run``'s current optimizer step: the means of the micro-batch ``sums`` since the last
    row, averaged over processes; appended to the live train_log.csv and sent to the trackers by the
    main process. Returns the row."""
    accelerator, step = run.accelerator, run.progress.step
    keys = [key for key in LOG_COLUMNS if key in sums]  # the losses and the penalty's logs
    local = torch.tensor([sums[k] / sums["micro_batches"] for k in keys], device=accelerator.device)
    averaged = accelerator.reduce(local, reduction="mean").tolist() if accelerator.num_processes > 1 else local.tolist()
    row = {**dict.fromkeys(LOG_COLUMNS, ""), **dict(zip(keys, averaged)), "step": step, "epoch": epoch,
           "lr": run.scheduler.get_last_lr()[0]}
    if "penalty_rows" in sums:
        row["penalty_tokens"] = run.spec.tokens
    if accelerator.is_main_process:
        new = not run.log_path.exists()
        with run.log_path.open("a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=LOG_COLUMNS)
            if new:
                writer.writeheader()
            writer.writerow(row)
        run.tracking.log({f"train/{key}": row[key] for key in LOG_COLUMNS if key not in ("step", "epoch")}, step=step)
    return row


def finish_run(run: TrainingRun, seconds: float) -> dict:
    """Write the final outputs of ``run`` atomically;
    metrics.json last, as the run's completion mark. Returns the content of metrics.json."""
    spec, context, progress = run.spec, run.context, run.progress
    accelerator, task, meta = context.accelerator, context.task, context.meta
    method = get_method(spec.method)
    final = progress.history[-1] if progress.history else {}
    report = {
        "task": task.key, "model": context.model_name, "method": spec.method, "lam": spec.lam,
        "zeta": spec.zeta if method.takes("zeta") else None,
        "layers": spec.layers if method.takes("layers") else None, "tokens": spec.tokens, "seed": spec.seed,
        "standin": context.standin, "standin_note": meta.get("standin_note"),
        "metric": task.metric, "final": final, "collapsed": metrics.collapsed(final, task.metric),
        "epochs": progress.history,
        "sigma_s_isoscore": progress.sigma_isoscore, "fingerprint": fingerprint_hash(run.fingerprint),
    }
    if accelerator.is_main_process:
        state = latest_state(run.resume_dir)
        kept = (f"the trained state {state} is kept (metrics.json is written last, so the run is not marked done); "
                "the same command finishes the run from it")
        try:
            report = _write_outputs(run, report, seconds)
        except artifacts.OutOfSpaceError as error:
            raise artifacts.OutOfSpaceError(error.path, kept) from None
        shutil.rmtree(run.resume_dir, ignore_errors=True)
    run.tracking.finish()
    accelerator.wait_for_everyone()
    accelerator.print(f"done: {task.metric} = {final.get(task.metric, float('nan')):.4f} -> {run.out}")
    return report


def _write_outputs(run: TrainingRun, report: dict, seconds: float) -> dict:
    """The final model, log, run_config.json and metrics.json (last), each atomically; returns the
    report as written (with its content hash and the model's)."""
    spec, context, out = run.spec, run.context, run.out
    accelerator, task = context.accelerator, context.task
    staging = out / ".model-staging"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with artifacts.storage_errors(out / "model"):
            accelerator.unwrap_model(run.model).save_pretrained(staging, save_function=accelerator.save)
            context.tokenizer.save_pretrained(staging)
            artifacts.record_digests(staging)  # checked whenever the model is loaded again
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    artifacts.replace_directory(staging, out / "model")
    with artifacts.atomic_path(out / "train_log.csv") as tmp:
        shutil.copy2(run.log_path, tmp) if run.log_path.exists() else tmp.write_text(",".join(LOG_COLUMNS) + "\n")
    report["model_sha256"] = model_sha256(out / "model")
    artifacts.write_json(out / "run_config.json", {
        **dataclasses.asdict(spec), "model_path": portable_path(context.model_path), "task": task.key,
        "precision": {"requested": spec.mixed_precision, "effective": context.precision.label},
        # what ran: whether PyTorch's deterministic algorithms were on (training.deterministic,
        # istar.steps.train.deterministic_algorithms) and the cuBLAS workspace they ran with
        "determinism": {"algorithms": torch.are_deterministic_algorithms_enabled(),
                        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG")},
        "threads": torch.get_num_threads(), "num_processes": accelerator.num_processes,
        "device": accelerator.device.type,
        "total_optimizer_steps": run.total_steps, "train_seconds": round(seconds, 2),
        "model_source": context.model_name, "data_meta": context.meta, "fingerprint": report["fingerprint"],
        "fingerprint_inputs": run.fingerprint, "istar_version": __version__, "torch_version": torch.__version__,
        "provenance": code_provenance(), "trackers": {"names": list(spec.trackers), **run.tracking.state()},
    }, digest=True)
    # Last, as the completion mark; its hash and model_sha256 are checked by every reader (istar.io.results).
    return artifacts.write_json(out / "metrics.json", report, digest=True)

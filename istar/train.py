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
the newest one. Outputs appear atomically when the run is done:

    OUT/metrics.json        per-epoch and final metrics (the last file written)
    OUT/train_log.csv       step, loss, task_loss, penalty, isoscore_star, cosine_similarity, lr
    OUT/run_config.json     the resolved configuration, precision and environment
    OUT/model/              the final model and tokenizer (save_pretrained)
    OUT/sigma_epoch{e}.pt   the Σ_S used in epoch e (I-STAR)
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import __version__, artifacts
from .encoding import EpochShuffleSampler, encode_split, make_loader
from .evaluate import evaluate_model
from .regularizers import (LayerSpec, Penalty, cosreg_penalty, global_istar_penalty, istar_penalty, parse_layer_spec,
                           resolve_layers)
from .shrinkage import (DEFAULT_ROWS, accumulate_shrinkage, load_layer_statistics, load_shrinkage, merge_layers,
                        save_shrinkage)

__all__ = ["TrainConfig", "train", "METHODS"]

METHODS = ("base", "cosreg", "istar")
LOG_COLUMNS = ("step", "epoch", "loss", "task_loss", "penalty", "isoscore_star", "cosine_similarity", "lr")


@dataclass
class TrainConfig:
    """Everything a fine-tuning run depends on. Saved as ``run_config.json``."""

    model: str
    data_dir: str
    output_dir: str
    method: str = "base"
    lam: float | None = None
    zeta: float = 0.2
    layers: LayerSpec = "all"
    sigma_s: str | None = None
    shrinkage_rows: int = DEFAULT_ROWS
    recompute_shrinkage: bool = True
    global_penalty: bool = False
    learning_rate: float = 3e-5
    batch_size: int = 32
    eval_batch_size: int = 64
    epochs: int = 3
    gradient_accumulation_steps: int = 1
    warmup_ratio: float = 0.0
    scheduler: str = "linear"
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    max_length: int = 128
    doc_stride: int = 128
    seed: int = 0
    mixed_precision: str = "no"
    checkpoint_every: int = 0
    log_every: int = 1

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}; got {self.method!r}")
        if self.method == "cosreg" and self.lam is None:
            self.lam = 1.0
        if self.method == "istar":
            if self.lam is None:
                raise ValueError("method istar needs lam (λ), e.g. --lam -1")
            if not 0.0 <= self.zeta <= 1.0:
                raise ValueError(f"zeta must lie in [0, 1]; got {self.zeta}")
            if self.zeta > 0 and not self.sigma_s:
                raise ValueError("method istar with zeta > 0 needs --sigma-s, the file written by `istar shrinkage`")
        if self.method == "base":
            self.lam = 0.0
        for name in ("batch_size", "eval_batch_size", "epochs", "gradient_accumulation_steps", "max_length", "shrinkage_rows"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be a positive integer; got {getattr(self, name)}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be positive; got {self.learning_rate}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"warmup_ratio must lie in [0, 1); got {self.warmup_ratio}")
        if self.mixed_precision not in ("no", "fp16", "bf16"):
            raise ValueError(f"mixed_precision must be no, fp16 or bf16; got {self.mixed_precision!r}")
        if self.checkpoint_every < 0 or self.log_every < 1:
            raise ValueError("checkpoint_every must be ≥ 0 and log_every ≥ 1")


@dataclass
class Progress:
    """Training progress, saved and restored with the accelerate state."""

    epoch: int = 0
    batches_in_epoch: int = 0
    step: int = 0
    sigma_epoch: int = -1
    sigma_s: torch.Tensor | None = None
    history: list = field(default_factory=list)

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)


# ------------------------------------------------------------------------------------- penalty


def compute_penalty(cfg: TrainConfig, hidden_states, attention_mask, sigma_s, distributed: bool) -> Penalty | None:
    if cfg.method == "cosreg":
        return cosreg_penalty(hidden_states, attention_mask, lam=cfg.lam)
    if cfg.method == "istar":
        if cfg.global_penalty and distributed:
            return global_istar_penalty(hidden_states, attention_mask, lam=cfg.lam, zeta=cfg.zeta, sigma_s=sigma_s,
                                        layers=cfg.layers)
        return istar_penalty(hidden_states, attention_mask, lam=cfg.lam, zeta=cfg.zeta, sigma_s=sigma_s, layers=cfg.layers)
    return None


# ------------------------------------------------------------------------------------- resume


def latest_state(resume_dir: Path) -> Path | None:
    """The newest complete saved state (a folder with a COMPLETE marker), or None."""
    if not resume_dir.is_dir():
        return None
    complete = [p for p in resume_dir.glob("state-*") if (p / "COMPLETE").is_file()]
    return max(complete, key=lambda p: int(p.name.split("-")[1]), default=None)


def save_state(accelerator, resume_dir: Path, step: int, log_path: Path) -> None:
    """Save the accelerate state atomically as ``state-{step}``; drop older states."""
    final = resume_dir / f"state-{step:08d}"
    staging = resume_dir / f".staging-{step:08d}"
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))
    if accelerator.is_main_process:
        if log_path.exists():
            shutil.copy2(log_path, staging / "train_log.csv")
        (staging / "COMPLETE").write_text(f"step {step}\n")
        artifacts.replace_directory(staging, final)
        for old in resume_dir.glob("state-*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


# ------------------------------------------------------------------------------------- training


def effective_precision(accelerator, requested: str) -> str:
    """What actually runs: accelerate silently trains in fp32 when fp16 is asked for on a CPU."""
    if requested == "fp16" and accelerator.device.type == "cpu":
        return "fp32"
    return {"no": "fp32"}.get(requested, requested)


def _optimizer(model, cfg: TrainConfig) -> torch.optim.Optimizer:
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")
    decay = [p for n, p in model.named_parameters() if p.requires_grad and not n.endswith(no_decay)]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and n.endswith(no_decay)]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate)


def train(cfg: TrainConfig) -> dict:
    """Fine-tune ``cfg.model`` on the prepared task in ``cfg.data_dir``; see the module docstring.

    Returns
    -------
    The content of ``metrics.json``.
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from transformers import get_scheduler

    from .data import read_meta, read_split
    from .models import load_model, load_tokenizer, resolve_model_source
    from .tasks import get_task

    cfg.validate()
    out = Path(cfg.output_dir)
    resume_dir = out / "resume"
    accelerator = Accelerator(mixed_precision=cfg.mixed_precision, gradient_accumulation_steps=cfg.gradient_accumulation_steps)
    precision = effective_precision(accelerator, cfg.mixed_precision)
    distributed = accelerator.num_processes > 1
    if accelerator.is_main_process:
        resume_dir.mkdir(parents=True, exist_ok=True)
    set_seed(cfg.seed, device_specific=True)

    meta = read_meta(cfg.data_dir)
    task = get_task(meta["task"])
    train_frame, eval_frame = read_split(cfg.data_dir, "train"), read_split(cfg.data_dir, "validation")
    tokenizer = load_tokenizer(cfg.model)
    set_seed(cfg.seed)  # the new head's initialisation depends on the run seed only
    model = load_model(cfg.model, task)
    num_hidden, hidden_size = model.config.num_hidden_layers + 1, model.config.hidden_size
    layer_indices = resolve_layers(cfg.layers if cfg.method == "istar" else -1, num_hidden)
    set_seed(cfg.seed, device_specific=True)

    pad_multiple = 8 if precision in ("fp16", "bf16") else None
    train_features = encode_split(train_frame, task, tokenizer, cfg.max_length, cfg.doc_stride)
    eval_features = encode_split(eval_frame, task, tokenizer, cfg.max_length, cfg.doc_stride,
                                 for_qa_eval=task.kind == "qa")
    sampler = EpochShuffleSampler(len(train_features), cfg.seed)
    train_loader = make_loader(train_features, tokenizer, cfg.batch_size, sampler=sampler, pad_to_multiple_of=pad_multiple)
    eval_loader = make_loader(eval_features, tokenizer, cfg.eval_batch_size, pad_to_multiple_of=pad_multiple)

    steps_per_epoch = math.ceil(len(train_loader) / cfg.gradient_accumulation_steps)
    total_steps = steps_per_epoch * cfg.epochs
    optimizer = _optimizer(model, cfg)
    scheduler = get_scheduler(cfg.scheduler, optimizer, num_warmup_steps=int(cfg.warmup_ratio * total_steps),
                              num_training_steps=total_steps)
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    state = latest_state(resume_dir)
    if state is not None:
        accelerator.load_state(str(state))
        accelerator.print(f"resuming from {state} (epoch {progress.epoch + 1}, batch {progress.batches_in_epoch}, step {progress.step})")
    log_path = resume_dir / "train_log.csv"
    if accelerator.is_main_process:
        _restore_log(log_path, state)

    if cfg.method == "istar" and progress.sigma_s is None and cfg.zeta > 0:
        per_layer, provenance = load_layer_statistics(cfg.sigma_s)
        progress.sigma_s, _ = load_shrinkage(cfg.sigma_s, expected_layers=layer_indices, expected_dim=hidden_size)
        progress.sigma_epoch = 0
        if accelerator.is_main_process:
            save_shrinkage(out / "sigma_epoch0.pt", per_layer, layer_indices, provenance)
    sigma_device = progress.sigma_s.to(accelerator.device) if progress.sigma_s is not None else None

    accelerator.print(
        f"{cfg.method} on {task.display} ({len(train_features):,} train features, {len(eval_features):,} eval) | "
        f"{accelerator.num_processes} process(es) on {accelerator.device.type} | precision {precision}"
        + (f" (asked for {cfg.mixed_precision})" if precision != {"no": "fp32"}.get(cfg.mixed_precision, cfg.mixed_precision) else "")
        + f" | {total_steps} optimizer steps")
    start_time = time.perf_counter()
    unwrapped = accelerator.unwrap_model(model)

    for epoch in range(progress.epoch, cfg.epochs):
        if cfg.method == "istar" and cfg.zeta > 0 and cfg.recompute_shrinkage and epoch > 0 and progress.sigma_epoch < epoch:
            sigma_device = _recompute_sigma(cfg, unwrapped, train_features, tokenizer, accelerator, epoch, out, progress)
        loader = train_loader
        if progress.batches_in_epoch:
            loader = accelerator.skip_first_batches(train_loader, progress.batches_in_epoch)
        loader.set_epoch(epoch)  # accelerate passes it on to the sampler: the order is fixed by (seed, epoch)
        model.train()
        sums: dict[str, float] = {}
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=not accelerator.is_local_main_process,
                   initial=progress.batches_in_epoch, total=len(train_loader))
        for batch in bar:
            with accelerator.accumulate(model):
                outputs = model(**batch, output_hidden_states=cfg.method != "base")
                penalty = compute_penalty(cfg, outputs.hidden_states, batch["attention_mask"], sigma_device, distributed) \
                    if cfg.method != "base" else None
                loss = outputs.loss if penalty is None else outputs.loss + penalty.term
                accelerator.backward(loss)
                if accelerator.sync_gradients and cfg.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            progress.batches_in_epoch += 1
            _add_to_sums(sums, loss, outputs.loss, penalty)
            if not math.isfinite(sums["loss"]):
                raise FloatingPointError(
                    f"non-finite loss at epoch {epoch + 1}, batch {progress.batches_in_epoch}, optimizer step "
                    f"{progress.step + 1} (task loss {float(outputs.loss):.4g}"
                    + (f", penalty {float(penalty.term):.4g}" if penalty is not None else "")
                    + "): lower the learning rate or |λ|, or use fp32/bf16; the last saved state is kept in "
                    f"{resume_dir}")
            if not accelerator.sync_gradients:
                continue
            progress.step += 1
            if progress.step % cfg.log_every == 0:
                row = _log_row(accelerator, sums, progress.step, epoch + 1, scheduler.get_last_lr()[0])
                if accelerator.is_main_process:
                    _append_log(log_path, row)
                bar.set_postfix(loss=f"{row['loss']:.4f}", **({"iso*": f"{row['isoscore_star']:.3f}"} if row["isoscore_star"] != "" else {}))
            sums = {}
            if cfg.checkpoint_every and progress.step % cfg.checkpoint_every == 0:
                save_state(accelerator, resume_dir, progress.step, log_path)
        bar.close()

        result = evaluate_model(model, eval_loader, task, accelerator, features=eval_features, frame=eval_frame)
        progress.history.append({"epoch": epoch + 1, "step": progress.step, **result})
        accelerator.print(f"epoch {epoch + 1}: " + ", ".join(f"{k} = {v:.4f}" for k, v in result.items()))
        progress.epoch, progress.batches_in_epoch = epoch + 1, 0
        save_state(accelerator, resume_dir, progress.step, log_path)

    report = _finish(cfg, accelerator, unwrapped, tokenizer, task, meta, progress, precision, out, log_path,
                     resolve_model_source(cfg.model), time.perf_counter() - start_time, total_steps)
    return report


def _recompute_sigma(cfg, model, train_features, tokenizer, accelerator, epoch, out, progress) -> torch.Tensor:
    """Σ_S of the current model at the start of ``epoch`` (identical on all processes); saved per epoch."""
    from accelerate.data_loader import prepare_data_loader

    loader = make_loader(train_features, tokenizer, cfg.eval_batch_size,
                         sampler=EpochShuffleSampler(len(train_features), cfg.seed + 7919 * (epoch + 1)))
    loader = prepare_data_loader(loader, accelerator.device, accelerator.num_processes, accelerator.process_index,
                                 put_on_device=True)
    per_layer = accumulate_shrinkage(model, loader, cfg.layers, cfg.shrinkage_rows, accelerator,
                                     description=f"Σ_S epoch {epoch + 1}")
    indices = resolve_layers(cfg.layers, len(per_layer))
    selection = merge_layers(per_layer, indices)
    progress.sigma_s, progress.sigma_epoch = selection.covariance().cpu(), epoch
    if accelerator.is_main_process:
        save_shrinkage(out / f"sigma_epoch{epoch}.pt", per_layer, indices, {
            "model": f"{cfg.model} fine-tuned for {epoch} epoch(s)", "layer_spec": cfg.layers, "epoch": epoch,
            "requested_rows": cfg.shrinkage_rows, "num_processes": accelerator.num_processes})
    accelerator.print(f"Σ_S recomputed for epoch {epoch + 1}: {selection.count:,} rows")
    return progress.sigma_s.to(accelerator.device)


def _add_to_sums(sums: dict, loss, task_loss, penalty: Penalty | None) -> None:
    values = {"loss": loss, "task_loss": task_loss}
    if penalty is not None:
        values["penalty"] = penalty.term
        values.update(penalty.logs)
    for key, value in values.items():
        sums[key] = sums.get(key, 0.0) + float(value.detach())
    sums["micro_batches"] = sums.get("micro_batches", 0) + 1


def _log_row(accelerator, sums: dict, step: int, epoch: int, lr: float) -> dict:
    """One train_log.csv row: micro-batch means, averaged over processes."""
    keys = [k for k in ("loss", "task_loss", "penalty", "isoscore_star", "cosine_similarity") if k in sums]
    local = torch.tensor([sums[k] / sums["micro_batches"] for k in keys], device=accelerator.device)
    averaged = accelerator.reduce(local, reduction="mean").tolist() if accelerator.num_processes > 1 else local.tolist()
    row = {k: "" for k in LOG_COLUMNS}
    row.update(zip(keys, averaged))
    row.update(step=step, epoch=epoch, lr=lr)
    return row


def _append_log(path: Path, row: dict) -> None:
    new = not path.exists()
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=LOG_COLUMNS)
        if new:
            writer.writeheader()
        writer.writerow(row)


def _restore_log(log_path: Path, state: Path | None) -> None:
    """Make the live log match the saved state: rows logged after it are dropped."""
    saved = state / "train_log.csv" if state is not None else None
    if saved is not None and saved.exists():
        shutil.copy2(saved, log_path)
    else:
        log_path.unlink(missing_ok=True)


def _finish(cfg, accelerator, model, tokenizer, task, meta, progress, precision, out: Path, log_path: Path,
            model_path: str, seconds: float, total_steps: int) -> dict:
    """Write the final outputs atomically; metrics.json last, as the run's completion mark."""
    final = progress.history[-1] if progress.history else {}
    report = {
        "task": task.key, "model": cfg.model, "method": cfg.method, "lam": cfg.lam,
        "zeta": cfg.zeta if cfg.method == "istar" else None,
        "layers": cfg.layers if cfg.method == "istar" else None, "seed": cfg.seed,
        "standin": bool(meta.get("standin", False)), "standin_note": meta.get("standin_note"),
        "metric": task.metric, "final": final, "epochs": progress.history,
    }
    if accelerator.is_main_process:
        staging = out / ".model-staging"
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(staging, save_function=accelerator.save)
        tokenizer.save_pretrained(staging)
        artifacts.replace_directory(staging, out / "model")
        with artifacts.atomic_path(out / "train_log.csv") as tmp:
            shutil.copy2(log_path, tmp) if log_path.exists() else tmp.write_text(",".join(LOG_COLUMNS) + "\n")
        artifacts.write_json(out / "run_config.json", {
            **dataclasses.asdict(cfg), "model_path": model_path, "task": task.key,
            "precision": {"requested": cfg.mixed_precision, "effective": precision},
            "num_processes": accelerator.num_processes, "device": accelerator.device.type,
            "total_optimizer_steps": total_steps, "train_seconds": round(seconds, 2),
            "data_meta": meta, "istar_version": __version__, "torch_version": torch.__version__,
        })
        artifacts.write_json(out / "metrics.json", report)
        shutil.rmtree(out / "resume", ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.print(f"done: {task.metric} = {final.get(task.metric, float('nan')):.4f} -> {out}")
    return report


# ------------------------------------------------------------------------------------- CLI


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    d = TrainConfig(model="", data_dir="", output_dir="")
    parser.add_argument("--model", required=True, help="HF id, local folder or package:NAME/SUBFOLDER")
    parser.add_argument("--data", required=True, dest="data_dir", help="prepared task folder")
    parser.add_argument("--out", required=True, dest="output_dir", help="run folder")
    parser.add_argument("--method", choices=METHODS, default="base")
    parser.add_argument("--lam", type=float, default=None, help="λ (istar: required; cosreg: default 1)")
    parser.add_argument("--zeta", type=float, default=d.zeta, help="ζ ∈ [0, 1], weight of Σ_S (istar)")
    parser.add_argument("--layers", type=parse_layer_spec, default=d.layers, help="all | all+embeddings | 6 | 1,3,5 (istar)")
    parser.add_argument("--sigma-s", dest="sigma_s", default=None, help="initial Σ_S file from `istar shrinkage` (istar)")
    parser.add_argument("--shrinkage-rows", type=int, default=d.shrinkage_rows, help="rows for the per-epoch Σ_S")
    parser.add_argument("--no-recompute-shrinkage", dest="recompute_shrinkage", action="store_false",
                        help="keep the initial Σ_S for all epochs")
    parser.add_argument("--global-penalty", action="store_true",
                        help="penalise the IsoScore* of the global batch across processes")
    parser.add_argument("--learning-rate", type=float, default=d.learning_rate)
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="per process")
    parser.add_argument("--eval-batch-size", type=int, default=d.eval_batch_size)
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=d.gradient_accumulation_steps)
    parser.add_argument("--warmup-ratio", type=float, default=d.warmup_ratio)
    parser.add_argument("--scheduler", default=d.scheduler, help="linear, cosine, constant, constant_with_warmup, …")
    parser.add_argument("--weight-decay", type=float, default=d.weight_decay)
    parser.add_argument("--max-grad-norm", type=float, default=d.max_grad_norm)
    parser.add_argument("--max-length", type=int, default=d.max_length)
    parser.add_argument("--doc-stride", type=int, default=d.doc_stride)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--mixed-precision", choices=["no", "fp16", "bf16"], default=d.mixed_precision)
    parser.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                        help="also save a resumable state every K optimizer steps (0: epoch ends only)")
    parser.add_argument("--log-every", type=int, default=d.log_every)


def run_cli(args) -> int:
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    train(TrainConfig(**{k: v for k, v in vars(args).items() if k in fields}))
    return 0


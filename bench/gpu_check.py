"""The GPU path in one command: IsoScore* speed, training-step speed and memory, a real fp16
fine-tune through ``istar launch``, and the Σ_S step on the GPU.

    python -m bench.gpu_check --model PATH --rte-data PATH --out results.json [--cpu-smoke]

``--model``: a saved encoder (folder with config.json) or ``package:NAME/SUBFOLDER``, e.g.
the packaged MiniLM-L6; ``--rte-data``: an RTE folder prepared by ``istar prepare-data``
(train.parquet, validation.parquet, meta.json). Nothing is downloaded and Snakemake is not
needed. Four sections, each printed as a table and written to the JSON:

1. IsoScore* value + gradient at 24,576 × 768 and 12,288 × 384, in fp32 and under fp16
   autocast: the closed form vs the eigenvalue and SVD routes vs the XᵀX floor
   (:func:`bench.isoscore_star.time_methods`). Targets: SVD ≥ 20 × the closed form's time;
   closed form ≤ 1.10 × the floor.
2. One optimizer step of base / CosReg / I-STAR on a BERT-base-sized encoder (12 layers,
   d = 768, random weights from a config) and on ``--model``, batch 32 × 128, fp16 autocast
   with accelerate's gradient scaler, through the training code's penalty, optimizer and
   step (the adapter section below); median time and peak GPU memory of each. Target:
   I-STAR ≤ 1.10 × base.
3. The Σ_S step (``istar shrinkage``) over 250,000 rows of the RTE training data: time
   and peak GPU memory, in a child process.
4. ``istar launch --gpus 1 -- train --spec …`` (fp16, as the spec says): I-STAR (λ = −1, ζ = 0.2,
   the Σ_S of section 3) on the whole RTE training set for one epoch, with the options the
   workflow's ``train`` rule passes and the hyperparameters of config/gpu-study.yaml.
   Checked: ``run_config.json`` records fp16 as the effective precision, every logged loss
   is finite, and the gradient scaler did not skip every step.

Without CUDA (or with ``--cpu-smoke``) the same code runs a reduced form: bf16 autocast,
small shapes, a 2-layer encoder, a few steps, Σ_S over 1,000 rows and ``istar launch
--gpus 0`` (one CPU process: bf16 where the processor has it natively, else fp32). The test suite runs it so the script cannot rot; its
numbers say nothing about the targets.

Exit status 1 when a check fails (a section errors, a loss is not finite, the scaler skipped
every step, the precision is not the expected one); missed speed targets are reported only.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from istar.registry.precisions import run_precision
from istar.core.shrinkage import load_shrinkage

from .isoscore_star import time_methods
from .measure import REPO, child_env, make_batch, measured_istar, median_times

STUDY_CONFIG = REPO / "config" / "gpu-study.yaml"
METHODS = ("base", "cosreg", "istar")
LAM = {"base": 0.0, "cosreg": 1.0, "istar": -1.0}  # the paper's CosReg λ; I-STAR's winning sign
ZETA = 0.2
TARGETS = {"svd_over_closed_form": 20.0, "closed_form_over_floor": 1.10, "istar_over_base": 1.10}


@dataclass(frozen=True)
class Scale:
    """Sizes of one form of the check (GPU or the reduced CPU smoke form)."""

    mode: str
    autocast: torch.dtype
    shapes: tuple
    repeats: int
    encoder: dict  # BertConfig overrides of the randomly initialised encoder (empty: BERT-base)
    encoder_name: str
    batch: tuple  # (examples, tokens)
    shrinkage_rows: int
    gpus: int
    training: dict = field(default_factory=dict)  # overrides of the study's training options

    @property
    def precision(self) -> str:
        return {torch.float16: "fp16", torch.bfloat16: "bf16"}[self.autocast]


GPU = Scale("gpu", torch.float16, ((24_576, 768), (12_288, 384)), 10, {}, "BERT-base config, random weights",
            (32, 128), 250_000, 1)
CPU_SMOKE = Scale("cpu-smoke", torch.bfloat16, ((1_024, 64), (512, 32)), 1,
                  dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128),
                  "2-layer d = 64 config, random weights", (4, 32), 1_000, 0,
                  {"batch_size": 8, "eval_batch_size": 16, "max_length": 32})


# =============================================================================================
# ADAPTER — the only place that calls into istar's training internals (istar.steps.train): the run
# configuration, the optimizer, and one training step. Retarget these three functions when
# istar/steps/train.py changes; the rest of this script uses only them and istar's public library.
# =============================================================================================


def method_spec(method: str, **settings):
    """The training spec of one method, as the workflow builds it (istar.config.specs.TrainSpec)."""
    from istar.config.specs import TrainSpec

    return TrainSpec(**{"model": "", "data_dir": "", "output_dir": "", "method": method, "lam": LAM[method],
                        "zeta": ZETA, **settings})


def build_optimizer(model, spec):
    """The optimizer ``istar train`` builds (AdamW, weight decay off for biases and norms)."""
    from istar.steps.train_step import build_optimizer as istar_optimizer

    return istar_optimizer(model, spec)


def training_step(accelerator, model, optimizer, batch: dict, spec, sigma_s) -> torch.Tensor:
    """One optimizer step through the training loop's own step (istar.steps.train_step.optimization_step)."""
    from istar.steps.train_step import optimization_step

    constant = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)  # timing only: the schedule is irrelevant
    loss, _, _ = optimization_step(spec, accelerator, model, optimizer, constant, batch, sigma_s, distributed=False)
    return loss.detach()


# =============================================================================================
# 1. IsoScore*
# =============================================================================================


def isoscore_section(scale: Scale, device: torch.device) -> list[dict]:
    rows = []
    for n, d in scale.shapes:
        for label, dtype in (("fp32", None), (f"{scale.precision} autocast", scale.autocast)):
            medians, scores = time_methods(n, d, scale.repeats, device, autocast=dtype)
            floor = medians["floor XᵀX"]
            rows.append({
                "n": n, "d": d, "precision": label,
                "ms": {name: seconds * 1e3 for name, seconds in medians.items()},
                "ratio_to_floor": {name: seconds / floor for name, seconds in medians.items()},
                "svd_over_closed_form": medians["svd"] / medians["closed form"],
                "closed_form_over_floor": medians["closed form"] / floor,
                "scores": scores,
            })
    print_table(["n × d", "precision", "method", "median (ms)", "ratio to floor"],
                [[f"{r['n']:,} × {r['d']}", r["precision"], name, f"{ms:.2f}", f"{r['ratio_to_floor'][name]:.2f}"]
                 for r in rows for name, ms in r["ms"].items()])
    print_table(["n × d", "precision", "svd / closed form", "closed form / floor"],
                [[f"{r['n']:,} × {r['d']}", r["precision"], f"{r['svd_over_closed_form']:.1f}",
                  f"{r['closed_form_over_floor']:.2f}"] for r in rows])
    return rows


# =============================================================================================
# 2. Training step
# =============================================================================================


def random_encoder(scale: Scale, vocab_size: int):
    """A BERT classifier with random weights built from a config (no download): BERT-base sizes on GPU."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(vocab_size=vocab_size, num_labels=2, **scale.encoder))


def step_benchmark(accelerator, model, batch: dict, repeats: int) -> dict:
    """Median step time, peak GPU memory and scaler skips of each method on one encoder."""
    device = accelerator.device
    configs = {method: method_spec(method) for method in METHODS}
    model, optimizer = accelerator.prepare(model.train(), build_optimizer(model, configs["base"]))
    batch = {key: value.to(device) for key, value in batch.items()}
    d = accelerator.unwrap_model(model).config.hidden_size
    sigma_s = torch.cov(torch.randn(4 * d, d, generator=torch.Generator().manual_seed(1)).T).double().to(device)
    peaks = {method: 0.0 for method in METHODS}
    skipped = {method: 0 for method in METHODS}
    losses: dict[str, list[float]] = {method: [] for method in METHODS}

    def before(method):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def after(method):
        if device.type == "cuda":
            peaks[method] = max(peaks[method], torch.cuda.max_memory_allocated(device) / 2**20)
        skipped[method] += int(accelerator.optimizer_step_was_skipped)

    def step(method):
        losses[method].append(float(training_step(accelerator, model, optimizer, batch, configs[method], sigma_s)))

    medians = median_times({m: (lambda m=m: step(m)) for m in METHODS}, repeats, device, before, after)
    tokens = int(batch["attention_mask"].sum())
    result = {
        "layers": accelerator.unwrap_model(model).config.num_hidden_layers, "hidden_size": d, "real_tokens": tokens,
        "methods": {m: {"median_s": medians[m], "peak_memory_mb": peaks[m] if device.type == "cuda" else None,
                        "skipped_steps": skipped[m], "steps": repeats + 1, "losses": losses[m]} for m in METHODS},
        "istar_over_base": medians["istar"] / medians["base"],
        "cosreg_over_base": medians["cosreg"] / medians["base"],
    }
    return result


def release(accelerator) -> None:
    """Free the prepared model and optimizer (held by the accelerator and by reference cycles
    of its patched forward) so the next encoder's peak memory starts from an empty device."""
    accelerator.free_memory()
    gc.collect()
    if accelerator.device.type == "cuda":
        torch.cuda.empty_cache()


def train_step_section(scale: Scale, accelerator, model_source: str, rte_data: Path) -> list[dict]:
    from istar.data import read_split
    from istar.models.loading import load_model, load_tokenizer
    from istar.registry.tasks import get_task

    tokenizer = load_tokenizer(model_source)
    batch = make_batch(tokenizer, read_split(rte_data, "train"), *scale.batch)
    encoders = {scale.encoder_name: lambda: random_encoder(scale, len(tokenizer)),
                model_source: lambda: load_model(model_source, get_task("rte"))}
    rows = []
    for name, build in encoders.items():
        torch.manual_seed(0)
        result = step_benchmark(accelerator, build(), batch, scale.repeats)
        release(accelerator)
        rows.append({"encoder": name, "batch": list(scale.batch), "precision": f"{scale.precision} autocast", **result})
    print_table(["encoder", "method", "median step (ms)", "ratio to base", "peak GPU memory (MB)", "skipped"],
                [[r["encoder"], m, f"{v['median_s'] * 1e3:.1f}",
                  f"{v['median_s'] / r['methods']['base']['median_s']:.3f}",
                  "n/a" if v["peak_memory_mb"] is None else f"{v['peak_memory_mb']:,.0f}",
                  f"{v['skipped_steps']}/{v['steps']}"] for r in rows for m, v in r["methods"].items()])
    return rows


# =============================================================================================
# 3. Σ_S and 4. istar launch
# =============================================================================================


def study_training(scale: Scale) -> tuple[dict, dict]:
    """The training and shrinkage options of config/gpu-study.yaml (the schema's defaults filled in, without
    jsonschema, which a GPU machine may lack), with the scale's overrides."""
    from istar.config.schema import fill_defaults, load_schema, load_yaml

    study, schema = load_yaml(STUDY_CONFIG), load_schema()
    fill_defaults(study, schema, schema)
    # Σ_S is measured over the penalty's layers
    return {**study["training"], **scale.training}, {**study["shrinkage"], "layers": study["penalty"]["layers"]}


def shrinkage_section(scale: Scale, model_source: str, rte_data: Path, out: Path, cpu_only: bool) -> dict:
    training, shrinkage = study_training(scale)
    rows = min(scale.shrinkage_rows, shrinkage["rows"])
    from istar.config.specs import ShrinkageSpec

    spec = ShrinkageSpec(model=model_source, data_dir=str(rte_data), out=str(out), layers=shrinkage["layers"], rows=rows,
                         batch_size=training["eval_batch_size"], max_length=training["max_length"],
                         doc_stride=training["doc_stride"])  # fp32, as the `shrinkage` rule runs it
    measured = measured_istar(["shrinkage", "--spec", spec.to_json()], cpu_only=cpu_only)
    provenance = json.loads(out.with_suffix(".json").read_text())
    result = {"requested_rows": rows, "rows": provenance["rows"], "accumulation_seconds": provenance["seconds"],
              "process_seconds": measured["seconds"], "peak_gpu_memory_mb": measured["peak_cuda_mb"],
              "peak_rss_mb": measured["peak_rss_mb"],
              "hidden_size": int(load_shrinkage(out)[0].shape[0])}
    gpu = "n/a" if result["peak_gpu_memory_mb"] is None else f"{result['peak_gpu_memory_mb']:,.0f}"
    print_table(["rows", "accumulation (s)", "process (s)", "peak GPU memory (MB)", "peak RSS (MB)"],
                [[f"{result['rows']:,}", f"{result['accumulation_seconds']:.2f}", f"{result['process_seconds']:.1f}",
                  gpu, f"{result['peak_rss_mb']:,.0f}"]])
    return result


def launch_spec(training: dict, model_source: str, rte_data: Path, run: Path, rows: int, sigma_s: Path) -> str:
    """The spec the ``train`` rule would pass for I-STAR λ = −1, ζ = 0.2 on all layers, seed 0, one epoch."""
    from istar.config.specs import TrainSpec

    settings = {key: value for key, value in training.items() if key in TrainSpec.__dataclass_fields__}
    return method_spec("istar", **{**settings, "model": model_source, "data_dir": str(rte_data), "output_dir": str(run),
                                   "epochs": 1, "seed": 0, "layers": "all", "shrinkage_rows": rows,
                                   "sigma_s": str(sigma_s)}).to_json()


def steps_taken(lrs: list[float], initial_lr: float) -> int:
    """Optimizer steps that were applied, from the learning rate logged after each step.

    accelerate advances the scheduler only when the optimizer stepped, so a step the fp16
    gradient scaler skipped (inf/NaN gradients) logs the same learning rate as the step
    before; with a schedule that moves at every step (linear, cosine, …) every applied step
    changes it.
    """
    taken, previous = 0, initial_lr
    for lr in lrs:
        taken += lr != previous
        previous = lr
    return taken


def launch_section(scale: Scale, model_source: str, rte_data: Path, sigma_s: Path, run: Path, cpu_only: bool) -> dict:
    import pandas as pd

    training, shrinkage = study_training(scale)
    command = [sys.executable, "-m", "istar", "launch", "--gpus", str(scale.gpus), "--",
               "train", "--spec", launch_spec(training, model_source, rte_data, run,
                                             min(scale.shrinkage_rows, shrinkage["rows"]), sigma_s)]
    print("$ python", " ".join(command[1:]), flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=child_env(cpu_only), cwd=REPO)
    result = {"command": ["python", *command[1:]], "returncode": done.returncode, "wall_seconds": time.perf_counter() - start}
    if done.returncode != 0:
        raise RuntimeError(f"istar launch failed ({done.returncode}): {(done.stdout + done.stderr)[-3000:]}")
    config = json.loads((run / "run_config.json").read_text())
    metrics = json.loads((run / "metrics.json").read_text())
    log = pd.read_csv(run / "train_log.csv")
    steps = int(config["total_optimizer_steps"])
    schedule_moves = not training["scheduler"].startswith("constant")
    initial_lr = 0.0 if int(training["warmup_ratio"] * steps) > 0 else float(training["learning_rate"])
    taken = steps_taken(log["lr"].tolist(), initial_lr) if schedule_moves else None
    result.update({
        "precision": config["precision"], "expected_precision": "fp16" if scale.gpus else run_precision("fp16", "cpu").label,
        "device": config["device"], "num_processes": config["num_processes"], "train_seconds": config["train_seconds"],
        "optimizer_steps": steps, "logged_steps": len(log), "steps_taken": taken,
        "skipped_steps": None if taken is None else len(log) - taken,
        "losses_finite": bool(log["loss"].map(math.isfinite).all()), "final_loss": float(log["loss"].iloc[-1]),
        "final_isoscore_star": float(log["isoscore_star"].iloc[-1]),
        "metric": metrics["metric"], "score": metrics["final"].get(metrics["metric"]),
    })
    print_table(["precision (asked → effective)", "steps", "skipped", "final loss", metrics["metric"],
                 "train (s)", "wall (s)"],
                [[f"{config['precision']['requested']} → {config['precision']['effective']}", str(steps),
                  str(result["skipped_steps"]), f"{result['final_loss']:.4f}", f"{result['score']:.4f}",
                  f"{result['train_seconds']:.1f}", f"{result['wall_seconds']:.1f}"]])
    return result


# =============================================================================================
# checks, environment, output
# =============================================================================================


def check_failures(results: dict) -> list[str]:
    """What failed: section errors, non-finite numbers, every step skipped, a wrong precision."""
    failures = [f"{name}: {section['error']}" for name, section in results["sections"].items() if "error" in section]
    sections = results["sections"]
    for row in sections.get("isoscore_star", {}).get("rows", []):
        if not all(math.isfinite(v) for v in row["scores"].values()):
            failures.append(f"IsoScore* at {row['n']} × {row['d']} ({row['precision']}) is not finite")
    for row in sections.get("train_step", {}).get("rows", []):
        for method, values in row["methods"].items():
            if not all(math.isfinite(v) for v in values["losses"]):
                failures.append(f"{row['encoder']} {method}: a training-step loss is not finite")
            if values["skipped_steps"] == values["steps"]:
                failures.append(f"{row['encoder']} {method}: the gradient scaler skipped every step")
    launch = sections.get("launch", {})
    if "precision" in launch:
        if launch["precision"]["effective"] != launch["expected_precision"]:
            failures.append(f"launch: effective precision {launch['precision']['effective']}, "
                            f"expected {launch['expected_precision']}")
        if not launch["losses_finite"]:
            failures.append("launch: a logged loss is not finite")
        if launch["steps_taken"] == 0:
            failures.append("launch: the gradient scaler skipped every step")
    return failures


def target_report(results: dict) -> dict:
    """Each target with the worst measured value and whether it is met (meaningful on a GPU only)."""
    sections = results["sections"]
    rows = sections.get("isoscore_star", {}).get("rows", [])
    steps = sections.get("train_step", {}).get("rows", [])
    worst = {
        "svd_over_closed_form": min((r["svd_over_closed_form"] for r in rows), default=None),
        "closed_form_over_floor": max((r["closed_form_over_floor"] for r in rows), default=None),
        "istar_over_base": max((r["istar_over_base"] for r in steps), default=None),
    }
    report = {}
    for name, bound in TARGETS.items():
        value = worst[name]
        met = None if value is None else (value >= bound if name == "svd_over_closed_form" else value <= bound)
        report[name] = {"target": ("≥ " if name == "svd_over_closed_form" else "≤ ") + f"{bound:g}",
                        "worst": value, "met": met}
    return report


def environment(device: torch.device) -> dict:
    import accelerate
    import transformers

    import istar

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "accelerate": accelerate.__version__,
            "istar": istar.__version__, "cpu_threads": torch.get_num_threads(), "device": device.type}
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        info.update(gpu=properties.name, gpu_memory_gib=round(properties.total_memory / 2**30, 1),
                    cudnn=torch.backends.cudnn.version(), capability=f"{properties.major}.{properties.minor}")
    return info


def print_table(header: list[str], rows: list[list[str]]) -> None:
    print("\n| " + " | ".join(header) + " |")
    print("| " + " | ".join("---" for _ in header) + " |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(flush=True)


def check_inputs(model_source: str, rte_data: Path) -> None:
    """Fail early, naming the fix, when the model or the prepared RTE folder is not usable."""
    from istar.data import read_meta
    from istar.models.loading import resolve_model_source

    resolve_model_source(model_source)
    for name in ("train.parquet", "validation.parquet"):
        if not (rte_data / name).is_file():
            raise FileNotFoundError(f"--rte-data {rte_data} has no {name}: prepare it with "
                                    f"`istar prepare-data --task rte --out {rte_data}`")
    task = read_meta(rte_data).get("task")
    if task != "rte":
        raise ValueError(f"--rte-data {rte_data} holds task {task!r}, not rte: prepare RTE with "
                         f"`istar prepare-data --task rte --out DIR`")


def run(scale: Scale, model_source: str, rte_data: Path, workdir: Path, cpu_only: bool) -> dict:
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision=scale.precision, cpu=cpu_only)
    results = {"mode": scale.mode, "environment": environment(accelerator.device), "model": model_source,
               "rte_data": str(rte_data), "sections": {}}
    sigma_s = workdir / "sigma0.pt"
    sections = {
        "isoscore_star": lambda: {"rows": isoscore_section(scale, accelerator.device)},
        "train_step": lambda: {"rows": train_step_section(scale, accelerator, model_source, rte_data)},
        "shrinkage": lambda: shrinkage_section(scale, model_source, rte_data, sigma_s, cpu_only),
        "launch": lambda: launch_section(scale, model_source, rte_data, sigma_s, workdir / "run", cpu_only),
    }
    for name, section in sections.items():
        print(f"\n## {name} ({scale.mode})", flush=True)
        start = time.perf_counter()
        try:
            results["sections"][name] = section()
        except Exception as error:  # record and go on: one broken part must not hide the others' numbers
            print(f"{name} failed: {error}", file=sys.stderr, flush=True)
            results["sections"][name] = {"error": f"{type(error).__name__}: {error}"}
        results["sections"][name]["section_seconds"] = time.perf_counter() - start
        if accelerator.device.type == "cuda":
            torch.cuda.empty_cache()
    results["targets"] = target_report(results)
    results["failures"] = check_failures(results)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="saved encoder folder or package:NAME/SUBFOLDER")
    parser.add_argument("--rte-data", required=True, type=Path, help="RTE folder from `istar prepare-data --task rte`")
    parser.add_argument("--out", required=True, type=Path, help="results JSON")
    parser.add_argument("--cpu-smoke", action="store_true", help="the reduced CPU form, even where CUDA is present")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds per measurement (default: 10 on GPU, 1 on CPU)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep Σ_S and the launched run here (default: a temporary folder)")
    args = parser.parse_args(argv)
    from istar.io.artifacts import write_json

    cpu_only = args.cpu_smoke or not torch.cuda.is_available()
    scale = CPU_SMOKE if cpu_only else GPU
    if args.repeats is not None:
        if args.repeats < 1:
            parser.error(f"--repeats must be ≥ 1; got {args.repeats}")
        scale = replace(scale, repeats=args.repeats)
    try:
        check_inputs(args.model, args.rte_data)
    except (ValueError, FileNotFoundError) as error:
        print(f"gpu_check: error: {error}", file=sys.stderr)
        return 2
    if cpu_only and not args.cpu_smoke:
        print("no CUDA device: running the reduced CPU form (--cpu-smoke)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        results = run(scale, args.model, args.rte_data, workdir, cpu_only)
    write_json(args.out, results)
    print("targets:", json.dumps(results["targets"], ensure_ascii=False))
    for failure in results["failures"]:
        print(f"FAILED: {failure}", file=sys.stderr)
    print(f"results -> {args.out}")
    return 1 if results["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

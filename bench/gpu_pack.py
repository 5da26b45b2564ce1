"""Issue 46's GPU measurements in one command of a few minutes, for a one-GPU machine without network,
Snakemake, model files or data (random weights and a synthetic batch are enough for speed):

    python -m bench.gpu_pack --out results.json [--quick]

Three sections, each timed side by side against today's code, printed and written to one JSON file:

1. **product** — IsoScore* value + gradient at 24,576 × 768 and 12,288 × 384 under fp16 autocast: the
   closed form now (its product XᵀX in fp16), as before (float32 product) and the XᵀX floor
   (:func:`bench.isoscore_star.time_methods`); and the closed form's score and gradient error against
   float64 in float32, fp16 and bf16 on this device (:func:`bench.isoscore_star.accuracy_table`).
   Target: closed form ≤ 1.10 × floor.
2. **packing** — K = 1, 2, 4, 8 fine-tunes at once on the one GPU, one process each (as
   ``training.jobs_per_gpu`` packs them), each running the training loop's base step
   (:func:`istar.steps.train_step.optimization_step`, fp16 autocast, the gradient scaler) on a batch of
   32 × 128 for the same time window: aggregate steps and examples per second, for a MiniLM-L6-shaped
   and a BERT-base-shaped encoder (random weights).
3. **capture** — the same step eager and as ``training.compile: reduce-overhead`` runs it
   (:func:`istar.steps.train_step.step_forward`: torch.compile with CUDA graphs), for base, CosReg and
   I-STAR on both encoders, an encoder's six steps timed side by side (dropout off in this section, so
   that eager and captured see the same arithmetic): median step time, compile time, the losses of the
   first steps from the same weights (equal within fp16 rounding), every loss finite. Targets: I-STAR /
   base ≤ 1.05 (captured); and the base step's share of the card's peak (FLOP per step / time / the
   peak of :data:`PEAK_FP16_TFLOPS`).

Budget on an H100 (estimated from the sizes; not yet run on one): product ~0.5 min, packing ~2 min,
capture about 4–5 min (no encoder starts after ``CAPTURE_BUDGET_S``; one not started is recorded as
skipped), 7–8 minutes in all. The JSON is rewritten (atomically) after every section and after
every measured row of the packing and capture sections, so a command cut short keeps what it measured. ``--quick`` (automatic without CUDA) runs
the same code with tiny encoders, a 4 × 32 batch, K = 1, 2 and, on a CPU, dynamo with its eager
backend in place of CUDA graphs (which a CPU run refuses; the refusal is recorded): the test suite
runs it so the script cannot rot; its numbers say nothing about a GPU.

Exit status 1 when a section fails or a loss is not finite; missed targets are reported only.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .gpu_check import METHODS, environment, method_spec, print_table, release
from .isoscore_star import accuracy_table, time_methods
from .measure import REPO, child_env, median_times

VOCAB = 30_522
SHAPES = {  # BertConfig sizes: (layers, hidden, heads, feed-forward)
    "MiniLM-L6 shape": dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536),
    "BERT-base shape": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
}
TINY = {
    "tiny 2 × 32": dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64),
    "tiny 2 × 64": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128),
}
# Dense fp16 tensor-core peak (TFLOP/s, no sparsity) from NVIDIA's data sheets, by the name torch reports;
# the first key found in the name wins. A card not listed gets no share.
PEAK_FP16_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.4, "H200": 989.4}
TARGETS = {"istar_over_base": 1.05, "closed_form_over_floor": 1.10}
LOSS_TOLERANCE = 1e-2  # relative: eager and captured first steps from the same weights, fp16 rounding apart
CAPTURE_BUDGET_S = 150.0  # no encoder starts after this: a BERT-base block (three compiles) may take ~3 min


@dataclass(frozen=True)
class Form:
    """Sizes of one form of the script (the GPU's or the quick one)."""

    name: str
    encoders: dict
    batch: tuple  # (examples, positions)
    jobs: tuple
    window_s: float  # each K's timed window
    warmup: int  # steps before timing (and compared eager vs captured)
    repeats: int
    shapes: tuple
    capture_budget_s: float


GPU = Form("gpu", SHAPES, (32, 128), (1, 2, 4, 8), 6.0, 5, 20, ((24_576, 768), (12_288, 384)), CAPTURE_BUDGET_S)
QUICK = Form("quick", TINY, (4, 32), (1, 2), 1.0, 2, 2, ((512, 32),), 300.0)


def encoder(shape: dict, dropout: bool = True):
    """A BERT classifier of ``shape`` with random weights (seed 0); ``dropout=False`` sets its dropout to 0."""
    from transformers import BertConfig, BertForSequenceClassification

    off = {} if dropout else {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(vocab_size=VOCAB, num_labels=2, **shape, **off))


def synthetic_batch(examples: int, positions: int, device) -> dict:
    """Random token ids padded to ``positions``, with real lengths from a third of them to all (RTE-like: the
    bench's 32 × 128 RTE batch holds 2,212 real tokens), and random labels."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(positions // 3, positions + 1, (examples,), generator=g)
    mask = (torch.arange(positions) < lengths[:, None]).long()
    ids = torch.randint(1_000, VOCAB, (examples, positions), generator=g) * mask
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device),
            "labels": torch.randint(0, 2, (examples,), generator=g).to(device)}


def step_flops(shape: dict, examples: int, positions: int) -> float:
    """FLOP of one training step over every position: 6 × matrix parameters × tokens, and the attention's
    two (T × T) products per layer (forward 4·B·T²·h, × 3 with the backward)."""
    from istar.pipeline.bundle_plan import model_sizes_of

    layers, hidden = shape["num_hidden_layers"], shape["hidden_size"]
    return (6 * model_sizes_of(shape)["parameters"] * examples * positions
            + 12 * layers * examples * positions**2 * hidden)


def peak_tflops(device_name: str | None) -> float | None:
    return next((peak for key, peak in PEAK_FP16_TFLOPS.items() if device_name and key in device_name), None)


class Trainer:
    """One encoder, its optimizer and batch prepared by an Accelerator, stepping through the training loop's
    own step (:func:`istar.steps.train_step.optimization_step`) with a constant learning rate."""

    def __init__(self, accelerator, shape: dict, batch: dict, method: str = "base", dropout: bool = True,
                 forward=None):
        from istar.steps.train_step import build_optimizer, forward_and_loss

        self.accelerator, self.batch, self.spec = accelerator, batch, method_spec(method)
        model = encoder(shape, dropout).train()
        self.model, self.optimizer = accelerator.prepare(model, build_optimizer(model, self.spec))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)
        d = shape["hidden_size"]
        g = torch.Generator().manual_seed(1)
        self.sigma_s = torch.cov(torch.randn(4 * d, d, generator=g).T).double().to(accelerator.device)
        self.forward = forward or forward_and_loss

    def step(self) -> float:
        from istar.steps.train_step import optimization_step

        loss, _, _ = optimization_step(self.spec, self.accelerator, self.model, self.optimizer, self.scheduler,
                                       self.batch, self.sigma_s, False, self.forward)
        return float(loss.detach())


def make_accelerator(device: torch.device):
    from accelerate import Accelerator

    from istar.registry.precisions import run_precision

    return Accelerator(mixed_precision=run_precision("fp16", device.type).key, cpu=device.type == "cpu")


# =============================================================================================
# 1. The closed form's product
# =============================================================================================


def product_section(form: Form, device: torch.device) -> dict:
    low = torch.float16 if device.type == "cuda" else torch.bfloat16  # a CPU has no fp16 autocast
    names = ("closed form", "closed form, float32 product", "floor XᵀX")
    timings = []
    for n, d in form.shapes:
        medians, _ = time_methods(n, d, form.repeats, device, autocast=low, names=names)
        floor = medians["floor XᵀX"]
        timings.append({"n": n, "d": d, "autocast": str(low).removeprefix("torch."),
                        "ms": {name: s * 1e3 for name, s in medians.items()},
                        "closed_form_over_floor": medians["closed form"] / floor,
                        "before_over_floor": medians["closed form, float32 product"] / floor})
    dtypes = (None, torch.float16, torch.bfloat16) if device.type == "cuda" else (None, torch.bfloat16)
    accuracy = accuracy_table(form.shapes, device, dtypes)
    print_table(["n × d", "closed form (ms)", "float32 product, before (ms)", "floor (ms)", "now / floor", "before / floor"],
                [[f"{r['n']:,} × {r['d']}", *(f"{r['ms'][k]:.2f}" for k in names), f"{r['closed_form_over_floor']:.2f}",
                  f"{r['before_over_floor']:.2f}"] for r in timings])
    print_table(["n × d", "ζ", "product", "score error", "gradient relative error"],
                [[f"{r['n']:,} × {r['d']}", str(r["zeta"]), r["product"], f"{r['score_error']:.1e}",
                  f"{r['gradient_relative_error']:.1e}"] for r in accuracy])
    flags = {}
    if device.type == "cuda":
        matmul = torch.backends.cuda.matmul
        flags = {"allow_fp16_reduced_precision_reduction": matmul.allow_fp16_reduced_precision_reduction,
                 "allow_bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction}
    return {"timings": timings, "accuracy": accuracy, "cuda_matmul_flags": flags}


# =============================================================================================
# 2. Packing: K worker processes, each one fine-tune's step loop
# =============================================================================================

PREFIX = "GPU_PACK "


def worker(form: Form, device: torch.device) -> int:
    """One fine-tune of the sweep. Commands on stdin, one JSON line each: {"encoder": NAME} builds it (once)
    and warms it up; {"encoder": NAME, "start": T0, "seconds": S} steps from time T0 for S seconds.
    Answers on stdout, prefixed."""
    accelerator = make_accelerator(device)
    batch = synthetic_batch(*form.batch, accelerator.device)
    trainers: dict = {}
    for line in sys.stdin:
        command = json.loads(line)
        name = command["encoder"]
        if "start" not in command:
            if name not in trainers:  # built once; later rounds warm it up again
                trainers[name] = Trainer(accelerator, form.encoders[name], batch)
            losses = [trainers[name].step() for _ in range(form.warmup)]
            print(PREFIX + json.dumps({"ready": all(map(math.isfinite, losses))}), flush=True)
            continue
        trainer, steps, losses = trainers[name], 0, []
        while time.time() < command["start"]:
            time.sleep(0.001)
        start = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        while time.perf_counter() - start < command["seconds"]:
            losses.append(trainer.step())  # float(loss): the step has finished on the device
            steps += 1
        elapsed = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None
        print(PREFIX + json.dumps({"steps": steps, "seconds": elapsed, "finite": all(map(math.isfinite, losses)),
                                   "peak_memory_mb": peak}), flush=True)
    return 0


def _answer(process) -> dict:
    for line in process.stdout:
        if line.startswith(PREFIX):
            return json.loads(line[len(PREFIX):])
    raise RuntimeError(f"a packing worker stopped (exit status {process.wait()})")


def packing_section(form: Form, device: torch.device, quick: bool, save_rows=lambda rows: None) -> dict:
    command = [sys.executable, "-m", "bench.gpu_pack", "--worker", "--out", "-"] + (["--quick"] if quick else [])
    env = {**child_env(device.type == "cpu"), "OMP_NUM_THREADS": "1"}
    workers = [subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for _ in range(max(form.jobs))]
    rows = []
    try:
        for name in form.encoders:
            for jobs in form.jobs:
                team = workers[:jobs]
                for process in team:
                    process.stdin.write(json.dumps({"encoder": name}) + "\n")
                    process.stdin.flush()
                warm = [_answer(process)["ready"] for process in team]
                start = time.time() + 0.5
                for process in team:
                    process.stdin.write(json.dumps({"encoder": name, "start": start, "seconds": form.window_s}) + "\n")
                    process.stdin.flush()
                results = [_answer(process) for process in team]
                steps_per_s = sum(r["steps"] / r["seconds"] for r in results)
                peaks = [r["peak_memory_mb"] for r in results if r["peak_memory_mb"] is not None]
                rows.append({"encoder": name, "jobs": jobs, "steps": [r["steps"] for r in results],
                             "steps_per_s": steps_per_s, "examples_per_s": steps_per_s * form.batch[0],
                             "peak_memory_mb_per_job": max(peaks) if peaks else None,
                             "finite": all(warm) and all(r["finite"] for r in results)})
                save_rows(rows)
    finally:
        for process in workers:
            process.stdin.close()
        for process in workers:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
    for row in rows:
        alone = next(r for r in rows if r["encoder"] == row["encoder"] and r["jobs"] == form.jobs[0])
        row["throughput_over_one"] = row["steps_per_s"] / alone["steps_per_s"]
    print_table(["encoder", "K", "steps/s (all jobs)", "examples/s", "× K = 1", "peak MB per job", "finite"],
                [[r["encoder"], str(r["jobs"]), f"{r['steps_per_s']:.1f}", f"{r['examples_per_s']:.0f}",
                  f"{r['throughput_over_one']:.2f}",
                  "n/a" if r["peak_memory_mb_per_job"] is None else f"{r['peak_memory_mb_per_job']:,.0f}",
                  str(r["finite"])] for r in rows])
    return {"window_s": form.window_s, "batch": list(form.batch), "rows": rows}


# =============================================================================================
# 3. Step capture: eager against training.compile
# =============================================================================================


def capture_forward(device: torch.device) -> tuple[object, str, str | None]:
    """(forward, what it is, why training.compile refused here): reduce-overhead as training.compile runs it; where
    it is refused, the nearest capture that can run: on a GPU without a C compiler (Triton's), CUDA graphs of the
    eager kernels (backend "cudagraphs", no inductor); on a CPU, dynamo with its eager backend (no graphs)."""
    from istar.steps.train_step import forward_and_loss, step_forward

    try:
        return step_forward("reduce-overhead", device), "training.compile: reduce-overhead", None
    except ValueError as refusal:
        if device.type != "cuda":
            return torch.compile(forward_and_loss, backend="eager"), "torch.compile(backend='eager')", str(refusal)
        graphs = torch.compile(forward_and_loss, backend="cudagraphs")

        def captured(*args):
            torch.compiler.cudagraph_mark_step_begin()
            return graphs(*args)

        return captured, "torch.compile(backend='cudagraphs')", str(refusal)


def capture_section(form: Form, device: torch.device, save_rows=lambda rows: None) -> dict:
    accelerator = make_accelerator(device)
    batch = synthetic_batch(*form.batch, accelerator.device)
    start, rows, captured_as, refusal = time.perf_counter(), [], None, None
    for name, shape in form.encoders.items():  # per encoder, its six steps timed side by side
        if time.perf_counter() - start > form.capture_budget_s:
            rows += [{"encoder": name, "method": m, "skipped": "the section's time budget was spent"} for m in METHODS]
            continue
        scaler = accelerator.scaler.state_dict() if accelerator.scaler is not None else None
        trainers, losses, first_call = {}, {}, {}
        for method in METHODS:
            forward, captured_as, refusal = capture_forward(accelerator.device)
            for variant in ("eager", "captured"):
                trainer = Trainer(accelerator, shape, batch, method, dropout=False,
                                  forward=forward if variant == "captured" else None)
                if scaler is not None:  # every run's first steps from the same loss scale
                    accelerator.scaler.load_state_dict(scaler)
                call_start = time.perf_counter()
                losses[method, variant] = [trainer.step()]
                first_call[method, variant] = time.perf_counter() - call_start
                losses[method, variant] += [trainer.step() for _ in range(form.warmup - 1)]
                trainers[method, variant] = trainer
        medians = median_times({key: trainer.step for key, trainer in trainers.items()}, form.repeats,
                               accelerator.device)
        for method in METHODS:
            eager, captured = losses[method, "eager"], losses[method, "captured"]
            rows.append({"encoder": name, "method": method, "eager_ms": medians[method, "eager"] * 1e3,
                         "captured_ms": medians[method, "captured"] * 1e3,
                         "captured_over_eager": medians[method, "captured"] / medians[method, "eager"],
                         "first_call_s": first_call[method, "captured"], "losses": {"eager": eager, "captured": captured},
                         "largest_relative_loss_difference": max(abs(a - b) / max(abs(b), 1e-6)
                                                                 for a, b in zip(captured, eager)),
                         "finite": all(map(math.isfinite, eager + captured))})
        save_rows(rows)
        del trainers
        release(accelerator)
        torch._dynamo.reset()
    for row in rows:
        base = next((r for r in rows if r["encoder"] == row["encoder"] and r["method"] == "base" and "skipped" not in r),
                    None)
        if "skipped" not in row and base is not None:
            row["over_base"] = {v: row[f"{v}_ms"] / base[f"{v}_ms"] for v in ("eager", "captured")}
    done = [r for r in rows if "skipped" not in r]
    print_table(["encoder", "method", "eager (ms)", "captured (ms)", "captured / eager", "/ base: eager | captured",
                 "first call (s)", "largest relative Δloss"],
                [[r["encoder"], r["method"], f"{r['eager_ms']:.1f}", f"{r['captured_ms']:.1f}",
                  f"{r['captured_over_eager']:.2f}",
                  f"{r['over_base']['eager']:.3f} | {r['over_base']['captured']:.3f}" if "over_base" in r else "n/a",
                  f"{r['first_call_s']:.1f}", f"{r['largest_relative_loss_difference']:.1e}"] for r in done])
    return {"captured_as": captured_as, "refused_on_this_device": refusal, "dropout": 0.0, "batch": list(form.batch),
            "warmup_steps_compared": form.warmup, "rows": rows}


# =============================================================================================


def summary(form: Form, results: dict) -> dict:
    """The targets and the base step's share of the card's peak, from the sections that ran."""
    sections, device_name = results["sections"], results["environment"].get("gpu")
    peak = peak_tflops(device_name)
    out: dict = {"peak_fp16_tflops": peak, "peak_assumes": "dense fp16 tensor-core peak of NVIDIA's data sheet for "
                 f"the card's name ({device_name}), no sparsity; FLOP per step from the encoder's shape over every "
                 "padded position (bench.gpu_pack.step_flops)"}
    capture = [r for r in sections.get("capture", {}).get("rows", []) if "over_base" in r]
    out["istar_over_base"] = {r["encoder"]: r["over_base"] for r in capture if r["method"] == "istar"}
    out["closed_form_over_floor"] = [r["closed_form_over_floor"] for r in sections.get("product", {}).get("timings", [])]
    share = {}
    for r in capture:
        if r["method"] == "base":
            flops = step_flops(form.encoders[r["encoder"]], *form.batch)
            share[r["encoder"]] = {"flop_per_step": flops, **{
                v: (flops / (r[f"{v}_ms"] / 1e3) / 1e12 / peak if peak else None) for v in ("eager", "captured")}}
    out["base_share_of_peak"] = share
    out["targets"] = {
        "istar_over_base ≤ 1.05 (captured)": all(v["captured"] <= TARGETS["istar_over_base"]
                                                  for v in out["istar_over_base"].values()) if capture else None,
        "closed form ≤ 1.10 × floor": all(v <= TARGETS["closed_form_over_floor"] for v in out["closed_form_over_floor"])
        if out["closed_form_over_floor"] else None,
        f"captured losses within {LOSS_TOLERANCE:g} of eager (relative)": all(
            r["largest_relative_loss_difference"] <= LOSS_TOLERANCE for r in capture) if capture else None}
    return out


def failures(results: dict) -> list[str]:
    sections = results["sections"]
    found = [f"{name}: {section['error']}" for name, section in sections.items() if "error" in section]
    found += [f"packing {r['encoder']} K = {r['jobs']}: a loss is not finite"
              for r in sections.get("packing", {}).get("rows", []) if not r["finite"]]
    found += [f"capture {r['encoder']} {r['method']}: a loss is not finite"
              for r in sections.get("capture", {}).get("rows", []) if "skipped" not in r and not r["finite"]]
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="results JSON")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (automatic without CUDA)")
    parser.add_argument("--sections", default="product,packing,capture", help="comma-separated, of the three")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    form = QUICK if args.quick or not cuda else GPU
    device = torch.device("cuda" if cuda else "cpu")
    if args.worker:
        return worker(form, device)
    from istar.io.artifacts import write_json

    chosen = [name.strip() for name in args.sections.split(",")]
    results = {"form": form.name, "environment": environment(device), "sizes": asdict(form), "sections": {}}

    def saver(name: str):
        """Rows measured so far, written into the JSON as the section's (``partial``) before it ends."""
        def save_rows(rows: list) -> None:
            results["sections"][name] = {"rows": rows, "partial": True}
            write_json(Path(args.out), results)
        return save_rows

    sections = {"product": lambda: product_section(form, device),
                "packing": lambda: packing_section(form, device, args.quick or not cuda, saver("packing")),
                "capture": lambda: capture_section(form, device, saver("capture"))}
    for name in chosen:
        write_json(Path(args.out), results)  # what is done so far, should the command be cut short
        print(f"\n## {name} ({form.name} form, {device.type})", flush=True)
        start = time.perf_counter()
        try:
            results["sections"][name] = sections[name]()
        except Exception as error:  # record and go on: one broken section must not hide the others' numbers
            print(f"{name} failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
            # (the rows it saved before it failed stay)
            results["sections"][name] = {**results["sections"].get(name, {}), "error": f"{type(error).__name__}: {error}"}
        results["sections"][name]["seconds"] = time.perf_counter() - start
        if cuda:
            torch.cuda.empty_cache()
    results["summary"] = summary(form, results)
    results["failures"] = failures(results)
    write_json(Path(args.out), results)
    print("\nsummary:", json.dumps(results["summary"], ensure_ascii=False, indent=1))
    for failure in results["failures"]:
        print(f"FAILED: {failure}", file=sys.stderr)
    print(f"results -> {args.out}")
    return 1 if results["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

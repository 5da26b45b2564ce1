"""Benchmark: how long Snakemake takes to build the paper's DAG (a dry run), side by side with
the cost of starting Python and of importing torch, measured in one run.

    python -m bench.dag_build [--repeats 3] [--baseline DIR]

``--baseline DIR`` times the same dry run in another checkout (e.g. ``git worktree add DIR
<commit>``), interleaved with this one, and prints the ratio of the two medians.

Building the DAG imports ``istar.pipeline.validate``, ``istar.pipeline.plan`` (and the step specs, registries and
data-layout helpers they read) but never torch or transformers: each probe below runs in a
fresh process, and the dry run's own imports are checked for torch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")

DRY_RUN = [SNAKEMAKE, "-n", "--quiet", "all", "--cores", "2", "--configfile", "config/paper.yaml"]
DRY_RUN_PROBE = "snakemake -n (config/paper.yaml)"
PROBES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    DRY_RUN_PROBE: DRY_RUN,
    # the floor: the same DAG cut after the fine-tuning jobs (one job per run, which stay)
    "  … --until train train_search": [*DRY_RUN, "--until", "train", "train_search"],
}


def seconds(command: list[str], env: dict, cwd: Path = REPO) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-2000:]}")
    return time.perf_counter() - start


def heavy_imports_of_dry_run(env: dict) -> list[str]:
    """torch / transformers modules the dry run imported (from -X importtime), expected none."""
    done = subprocess.run(DRY_RUN, cwd=REPO, capture_output=True, text=True,
                          env={**env, "PYTHONPROFILEIMPORTTIME": "1"})
    names = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return sorted(name for name in names if name.split(".")[0] in ("torch", "transformers"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each probe (median reported)")
    parser.add_argument("--baseline", type=Path, help="another checkout whose dry run is timed beside this one's")
    args = parser.parse_args()
    if args.baseline is not None and not (args.baseline / "workflow" / "Snakefile").is_file():
        parser.error(f"--baseline {args.baseline}: not a checkout of this repository (no workflow/Snakefile)")
    # As on a machine with internet and an empty hub cache (the paper's models are hub ids; with
    # HF_HUB_OFFLINE set, config validation rightly refuses ids that are not cached). Building the
    # DAG never reaches the hub: the model pins are jobs.
    with tempfile.TemporaryDirectory(prefix="dag-build-hf-") as hub_cache:
        env = {**{k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}, "HF_HOME": hub_cache}
        measure(args.repeats, env, args.baseline)


BASELINE = "snakemake -n in --baseline"


def measure(repeats: int, env: dict, baseline: Path | None = None) -> None:
    """Time every probe REPEATS times, interleaved, and print the medians and the dry run's heavy imports."""
    probes = {name: (command, REPO) for name, command in PROBES.items()}
    if baseline is not None:
        probes[BASELINE] = (DRY_RUN, baseline.resolve())
    for cwd in {cwd for _, cwd in probes.values()}:
        seconds(DRY_RUN, env, cwd)  # warm the file cache and .snakemake/
    times = {name: [] for name in probes}
    for _ in range(repeats):  # interleaved, so a busy moment hits every probe alike
        for name, (command, cwd) in probes.items():
            times[name].append(seconds(command, env, cwd))
    base = statistics.median(times["python -c pass"])
    print(f"{'probe':36} {'median (s)':>10} {'vs python':>10}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:36} {median:10.2f} {median / base:10.1f}")
    if baseline is not None:
        ratio = statistics.median(times[DRY_RUN_PROBE]) / statistics.median(times[BASELINE])
        print(f"this checkout / {baseline}: {ratio:.2f}")
    heavy = heavy_imports_of_dry_run(env)
    print("torch/transformers imported while building the DAG:", ", ".join(heavy) if heavy else "none")


if __name__ == "__main__":
    main()

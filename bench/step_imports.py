"""Benchmark: what a job pays in imports before its work, against torch's own import.

    python -m bench.step_imports [--repeats 5] [--tree before=/path/to/an/older/checkout]

Each probe is a fresh interpreter importing one module (``python -c "import M"``), timed
from outside; the probes run in interleaved rounds, so a change in load hits all alike, and
the median is reported with its difference to ``import torch`` (the floor: every model step
needs torch). With ``--tree NAME=PATH`` the step modules are also imported from that checkout
(its ``istar`` first on PYTHONPATH), e.g. the tree before a change, side by side. A tree whose
layout has no such module is skipped for it. Also printed: which of pandas, matplotlib and
datasets each import loads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS = ("istar.steps.train", "istar.steps.measure", "istar.steps.shrinkage")
FLAT_NAMES = {"istar.steps.train": "istar.train", "istar.steps.measure": "istar.measure",
              "istar.steps.shrinkage": "istar.shrinkage"}  # the layout before the package layers
HEAVY = ("pandas", "matplotlib", "datasets")


def env_for(tree: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}


def probe(module: str, env: dict) -> tuple[float, list[str]]:
    """Wall time (s) of a fresh interpreter importing ``module``, and the heavy packages it loaded."""
    code = f"import {module}, sys, json; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd="/")
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"import {module} failed: {done.stderr[-1500:]}")
    return seconds, json.loads(done.stdout.splitlines()[-1])


def module_exists(module: str, env: dict) -> bool:
    code = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    return subprocess.run([sys.executable, "-c", code], env=env, cwd="/").returncode == 0


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH of another checkout to compare")
    args = parser.parse_args(argv)
    trees = {"this tree": REPO} | {name: Path(path) for name, path in (t.split("=", 1) for t in args.tree)}
    probes = {("", "torch"): ("torch", env_for(REPO))}
    for name, tree in trees.items():
        env = env_for(tree)
        for module in STEPS:
            found = next((m for m in (module, FLAT_NAMES[module]) if module_exists(m, env)), None)
            if found:
                probes[name, module] = (found, env)
    times = {key: [] for key in probes}
    loaded = {}
    for round_ in range(args.repeats + 1):  # round 0 warms the file cache and is dropped
        for key, (module, env) in probes.items():
            seconds, heavy = probe(module, env)
            loaded[key] = heavy
            if round_:
                times[key].append(seconds)
    torch_median = statistics.median(times["", "torch"])
    print(f"median of {args.repeats}, interleaved; load average {os.getloadavg()[0]:.1f} at the end\n")
    print("| tree | import | median (s) | minus torch (s) | loads |")
    print("| --- | --- | ---: | ---: | --- |")
    for key, (module, _env) in probes.items():
        median = statistics.median(times[key])
        print(f"| {key[0] or '-'} | {module} | {median:.2f} | {median - torch_median:+.2f} | "
              f"{', '.join(loaded[key]) or '-'} |")


if __name__ == "__main__":
    main()

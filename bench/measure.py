"""Measuring helpers shared by the benchmarks: side-by-side timing, a measured ``istar`` child
process, and the padded RTE batch the training-step benchmarks use."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

REPO = Path(__file__).resolve().parents[1]


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a wall-clock interval covers it (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_times(methods: dict[str, Callable[[], object]], repeats: int, device: torch.device,
                 before: Callable[[str], None] | None = None,
                 after: Callable[[str], None] | None = None) -> dict[str, float]:
    """Median wall time (s) of each callable, timed side by side.

    The methods run in interleaved rounds (one call each per round), so drifts in clock
    speed or load hit all of them alike; round 0 warms up (allocator, kernels, caches) and is
    dropped. ``before(name)`` / ``after(name)`` run around each timed call, outside the
    interval (e.g. to reset and read peak-memory counters).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be ≥ 1; got {repeats}")
    times: dict[str, list[float]] = {name: [] for name in methods}
    for round_ in range(repeats + 1):
        for name, method in methods.items():
            if before is not None:
                before(name)
            synchronize(device)
            start = time.perf_counter()
            method()
            synchronize(device)
            elapsed = time.perf_counter() - start
            if after is not None:
                after(name)
            if round_:
                times[name].append(elapsed)
    return {name: statistics.median(values) for name, values in times.items()}


def child_env(cpu_only: bool = False) -> dict[str, str]:
    """Environment of a child ``istar`` process: offline, this checkout's istar first, and no
    visible GPU when ``cpu_only``."""
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(REPO) + (os.pathsep + path if path else "")}
    if cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


_MEASURED_CHILD = """
import json, sys, time
import torch
from istar.cli import main
start = time.perf_counter()
code = main(sys.argv[1:])
seconds = time.perf_counter() - start
peak_rss = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')) / 1024
peak_cuda = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_initialized() else None
print('MEASURED ' + json.dumps({'code': code, 'seconds': seconds, 'peak_rss_mb': peak_rss, 'peak_cuda_mb': peak_cuda}))
sys.exit(code)
"""


def measured_istar(args: list[str], cpu_only: bool = False) -> dict:
    """Run ``istar ARGS…`` in a child process; its wall time (s) and peak memory (MB).

    Returns ``{"seconds", "peak_rss_mb", "peak_cuda_mb", "stdout"}``. Peak resident memory is
    the child's own VmHWM, which starts afresh at exec (``ru_maxrss`` would inherit the
    parent's high-water mark); peak CUDA memory is torch's allocator peak (None when the
    step never touched CUDA). Raises RuntimeError with the child's error output if it fails.
    """
    result = subprocess.run([sys.executable, "-c", _MEASURED_CHILD, *args], capture_output=True, text=True,
                            env=child_env(cpu_only), cwd=REPO)
    line = next((line for line in result.stdout.splitlines() if line.startswith("MEASURED ")), None)
    if result.returncode != 0 or line is None:
        raise RuntimeError(f"istar {' '.join(args[:1])} failed ({result.returncode}): {result.stderr[-2000:]}")
    return {**json.loads(line[len("MEASURED "):]), "stdout": result.stdout}


def make_batch(tokenizer, frame, batch_size: int = 32, length: int = 128) -> dict[str, torch.Tensor]:
    """The first ``batch_size`` sentence pairs of an RTE-style frame, padded to ``length`` tokens, with labels."""
    if len(frame) < batch_size:
        raise ValueError(f"the training split has {len(frame)} examples; a batch of {batch_size} needs more")
    batch = tokenizer(list(frame["text_a"][:batch_size]), list(frame["text_b"][:batch_size]), truncation=True,
                      max_length=length, padding="max_length", return_tensors="pt")
    batch["labels"] = torch.tensor(frame["label"][:batch_size].tolist())
    return dict(batch)

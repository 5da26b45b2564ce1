"""The training precisions: what ``training.mixed_precision`` asks for and what runs on a device.

    key    recorded as   on a GPU                         on a CPU
    no     fp32          fp32                             fp32
    fp16   fp16          fp16 autocast + loss scaling     bf16 autocast where the processor has
                                                          native bf16, else fp32
    bf16   bf16          bf16 autocast                    the same rule as fp16

Why: accelerate has no fp16 autocast on a CPU (it silently trains in fp32), and a CPU's fp16
matrix products are emulated, so fp16 cannot run there as asked. bf16 is what a CPU can do
in reduced precision: it has fp32's exponent range, so it needs no loss scaling, and on
processors with bf16 instructions (x86 AVX512-BF16 or AMX, Arm's BF16 extension) oneDNN runs
its matrix products natively — a MiniLM-L6 training step took 0.59–0.66 × its fp32 time here
(``bench/RESULTS.md``). Without those instructions bf16 has no hardware path and no
speed-up to offer for its lost precision, so such a CPU runs fp32 whatever was asked. The effective precision is
what ``run_config.json`` and the resume fingerprint record. The workflow's Σ_S and measure jobs
run in the fine-tuning precision (``istar.pipeline.plan``), and the survey's ``survey.dtype``
follows the same CPU rule (:func:`run_dtype`). Under any autocast, IsoScore*'s product XᵀX runs in
the autocast dtype with float32 accumulation, and its d × d reductions, Σ_S and every other d × d
reduction compute in float32 or float64 (``istar.core.isotropy``,
``istar.core.covariance``, ``istar.core.regularizers``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from istar.registry import lookup

__all__ = ["PRECISIONS", "Precision", "cpu_has_native_bf16", "run_dtype", "run_precision"]


@dataclass(frozen=True)
class Precision:
    """One value of ``training.mixed_precision``.

    key : the value in the config and accelerate's ``mixed_precision`` ("no", "fp16", "bf16").
    label : how runs record it (``no`` is recorded as ``fp32``).
    reduced_on_cpu : whether a CPU runs it as bf16 where bf16 is native (else fp32).
    dtype : the torch dtype of weights held in this precision (``survey.dtype`` names them so).
    """

    key: str
    label: str
    reduced_on_cpu: bool
    dtype: str


PRECISIONS: dict[str, Precision] = {p.key: p for p in (
    Precision("no", "fp32", reduced_on_cpu=False, dtype="float32"),
    Precision("fp16", "fp16", reduced_on_cpu=True, dtype="float16"),
    Precision("bf16", "bf16", reduced_on_cpu=True, dtype="bfloat16"),
)}

# CPU feature flags (Linux /proc/cpuinfo) that give native bf16 matrix products.
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The feature flags of the first processor in ``cpuinfo`` (x86 "flags", Arm "Features");
    empty where the file does not exist (not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this processor computes bf16 matrix products in hardware.

    Asked of torch's own processor detection (cpuinfo, the library oneDNN dispatches on)
    where it exposes it, else read from the Linux CPU flags. Cached: it cannot change within
    a process.
    """
    import torch

    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(probe is not None and probe() for probe in probes) or bool(cpu_flags() & BF16_CPU_FLAGS)


def run_precision(requested: str, device_type: str, native_bf16: bool | None = None) -> Precision:
    """The precision that runs when ``requested`` is asked for on a device of ``device_type``.

    On a GPU (or any accelerator) the request runs as it is. On a CPU a reduced precision
    runs as bf16 where ``native_bf16`` (default: :func:`cpu_has_native_bf16`), else fp32;
    see the module docstring for why.
    """
    asked = lookup(PRECISIONS, requested, "precision", "training.mixed_precision")
    if device_type != "cpu" or not asked.reduced_on_cpu:
        return asked
    native = cpu_has_native_bf16() if native_bf16 is None else native_bf16
    return PRECISIONS["bf16"] if native else PRECISIONS["no"]


def run_dtype(requested: str, device_type: str, native_bf16: bool | None = None) -> str:
    """The weights' dtype that runs when ``requested`` (a torch dtype name: float32, float16,
    bfloat16) is asked for on a device of ``device_type``: the rule of :func:`run_precision`
    (on a CPU, float16 and bfloat16 run as bfloat16 where it is native, else as float32)."""
    asked = lookup({entry.dtype: entry for entry in PRECISIONS.values()}, requested, "dtype", "survey.dtype")
    return run_precision(asked.key, device_type, native_bf16).dtype

"""Each of the ``training.jobs_per_gpu`` = K processes sharing a GPU (:mod:`istar.config.gpu_slots`) gets
1/K of its memory, and no more: before its first step a model step estimates what it needs, stops with
the setting to lower where that exceeds its share or the memory free now, and caps its allocator at the
share (``torch.cuda.set_per_process_memory_fraction``), so one process that outgrows its estimate fails
alone, with an out-of-memory error, instead of starving the others in the middle of their epochs."""

from __future__ import annotations

import os

from istar.config.gpu_slots import JOBS_PER_GPU_ENV

__all__ = ["CONTEXT_BYTES", "memory_bytes", "share_problem", "claim_gpu_share"]

GIB = 1 << 30
# The CUDA context, cuBLAS workspaces and the caching allocator's slack of one process (about 0.5 GiB
# on an H100 with torch 2.x); every job on a GPU pays it, outside its allocator's cap.
CONTEXT_BYTES = GIB // 2


def memory_bytes(parameters: int, hidden: int, layers: int, heads: int, batch: int, tokens: int,
                 activation_bytes: int = 2, trains: bool = True) -> int:
    """The GPU memory one process needs at most, estimated, in bytes.

    Training: 16 bytes per parameter (fp32 weights and gradients, AdamW's two moments), and the activations
    a transformer layer keeps for the backward pass, s·b·h·(34 + 5·a·s/h) bytes per layer in half
    precision (Korthikanti et al. 2022, *Reducing Activation Recomputation in Large Transformer Models*,
    eq. 1; s tokens, b sequences, h hidden size, a heads), scaled by ``activation_bytes``/2 (4 in fp32).
    A forward-only step (Σ_S, the measurements; ``trains`` False): 4 bytes per parameter and every
    layer's hidden states, s·b·h fp32 values per layer. Both add :data:`CONTEXT_BYTES`.
    """
    if trains:
        per_layer = tokens * batch * hidden * (34 + 5 * heads * tokens / hidden) * activation_bytes / 2
        return int(16 * parameters + layers * per_layer + CONTEXT_BYTES)
    return int(4 * parameters + layers * tokens * batch * hidden * 4 + CONTEXT_BYTES)


def share_problem(jobs: int, need: int, free: int, total: int, device: str) -> str | None:
    """Why one of ``jobs`` processes sharing ``device`` (``total`` bytes, ``free`` of them free now) cannot
    have the ``need`` bytes it is estimated to need (one line naming the setting and the fix), or None.

    Its share is ``total``/``jobs``; while every process keeps to its share the memory free when one
    starts is at least that share, so too little free memory means something else holds the GPU."""
    share = total // jobs
    if need > share:
        return (f"training.jobs_per_gpu = {jobs}: each job's share of {device} is {share / GIB:.1f} GiB of its "
                f"{total / GIB:.1f} GiB, and one needs about {need / GIB:.1f} GiB (estimated); set "
                f"training.jobs_per_gpu to {max(total // need, 1)} or less, or lower training.batch_size")
    if need > free:
        return (f"{device} has {free / GIB:.1f} GiB free of its {total / GIB:.1f} GiB, and this job, one of "
                f"training.jobs_per_gpu = {jobs}, needs about {need / GIB:.1f} GiB (estimated): other processes "
                "hold the rest; free the GPU, or lower training.jobs_per_gpu")
    return None


def claim_gpu_share(model, batch: int, tokens: int, precision, device, trains: bool = True) -> None:
    """Before the first step of a process that shares its GPU (``ISTAR_JOBS_PER_GPU`` = K > 1, set by
    ``istar launch``): refuse (MemoryError, :func:`share_problem`) where this model, batch of ``batch``
    sequences of ``tokens`` tokens and precision (:class:`istar.registry.precisions.Precision`) does not
    fit in 1/K of ``device``, else cap the process's allocator at that share less :data:`CONTEXT_BYTES`."""
    jobs = int(os.environ.get(JOBS_PER_GPU_ENV, "1"))
    if jobs == 1 or device.type != "cuda":
        return
    import torch

    config = model.config
    need = memory_bytes(sum(p.numel() for p in model.parameters()), config.hidden_size, config.num_hidden_layers,
                        config.num_attention_heads, batch, tokens, getattr(torch, precision.dtype).itemsize, trains)
    free, total = torch.cuda.mem_get_info(device)
    problem = share_problem(jobs, need, free, total, torch.cuda.get_device_name(device))
    if problem is not None:
        raise MemoryError(problem)
    torch.cuda.set_per_process_memory_fraction((total // jobs - CONTEXT_BYTES) / total, device)

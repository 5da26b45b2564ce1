"""Whether ``training.jobs_per_gpu`` fine-tunes fit in one GPU's memory, checked before the first step
(:mod:`istar.config.gpu_slots`): a GPU shared by too many runs stops each of them at its start with the
setting to lower, not with an out-of-memory error in the middle of an epoch."""

from __future__ import annotations

import os

from istar.config.gpu_slots import JOBS_PER_GPU_ENV

__all__ = ["CONTEXT_BYTES", "training_memory_bytes", "jobs_that_fit", "check_gpu_share", "check_shared_gpu"]

GIB = 1 << 30
# The CUDA context, cuBLAS workspaces and the caching allocator's slack of one process (about 0.5 GiB
# on an H100 with torch 2.x); every job on a GPU pays it.
CONTEXT_BYTES = GIB // 2


def training_memory_bytes(parameters: int, hidden: int, layers: int, heads: int, batch: int, tokens: int,
                          activation_bytes: int = 2) -> int:
    """The GPU memory one fine-tune needs at most, estimated, in bytes.

    16 bytes per parameter (fp32 weights and gradients, AdamW's two moments), the activations a
    transformer layer keeps for the backward pass, s·b·h·(34 + 5·a·s/h) bytes per layer in half
    precision (Korthikanti et al. 2022, *Reducing Activation Recomputation in Large Transformer
    Models*, eq. 1; s tokens, b sequences, h hidden size, a heads), scaled by ``activation_bytes``/2
    (4 in fp32), and :data:`CONTEXT_BYTES`.
    """
    per_layer = tokens * batch * hidden * (34 + 5 * heads * tokens / hidden) * activation_bytes / 2
    return int(16 * parameters + layers * per_layer + CONTEXT_BYTES)


def jobs_that_fit(need: int, total: int) -> int:
    """How many jobs of ``need`` bytes fit in a GPU of ``total`` bytes."""
    return total // need


def check_gpu_share(jobs: int, need: int, total: int, device: str) -> None:
    """Refuse, naming ``training.jobs_per_gpu``, when ``jobs`` fine-tunes of ``need`` bytes do not fit in ``total``."""
    if jobs > 1 and jobs * need > total:
        fit = jobs_that_fit(need, total)
        raise MemoryError(f"training.jobs_per_gpu = {jobs} fine-tunes of about {need / GIB:.1f} GiB each do not fit "
                          f"in {device}'s {total / GIB:.1f} GiB; set training.jobs_per_gpu to {max(fit, 1)} or less "
                          f"(or lower training.batch_size)")


def check_shared_gpu(model, batch: int, tokens: int, precision, device) -> None:
    """Before the first step of a run that shares its GPU (``ISTAR_JOBS_PER_GPU`` > 1, set by ``istar
    launch``): :func:`check_gpu_share` for this model, batch, sequence length and precision
    (:class:`istar.registry.precisions.Precision`) on ``device``."""
    jobs = int(os.environ.get(JOBS_PER_GPU_ENV, "1"))
    if jobs == 1 or device.type != "cuda":
        return
    import torch

    config = model.config
    need = training_memory_bytes(sum(p.numel() for p in model.parameters()), config.hidden_size,
                                 config.num_hidden_layers, config.num_attention_heads, batch, tokens,
                                 getattr(torch, precision.dtype).itemsize)
    check_gpu_share(jobs, need, torch.cuda.get_device_properties(device).total_memory, torch.cuda.get_device_name(device))

"""Several fine-tunes per GPU (``training.jobs_per_gpu`` = K): the arithmetic the workflow and the launcher share.

Snakemake counts resources in whole numbers. Where K > 1 and ``--resources gpu=N`` is given, the
workflow counts the ``gpu`` resource in slots of 1/K GPU (the budget becomes N·K): a one-GPU job asks
for one slot, a job of G ≥ 2 GPUs for G·K (whole GPUs, never shared). ``istar launch --gpus`` then
receives slots, and :data:`JOBS_PER_GPU_ENV`, set by the workflow for its jobs, tells it so
(:func:`granted_gpus_of`); its claim hands out the slots on each GPU (:func:`istar.steps.launch.try_claim`).
Where no such budget is given (a SLURM run: each job is its own allocation), every job asks for
whole GPUs as with K = 1.
"""

from __future__ import annotations

__all__ = ["JOBS_PER_GPU_ENV", "fine_tune_gpus", "micro_batches_per_step", "gpu_units", "gpu_budget",
           "packed_threads", "granted_gpus_of"]

# Set by the workflow (workflow/rules/common.smk) when its `gpu` resource counts slots; the launcher
# passes the number of jobs that share the step's GPU on to the step in the same variable (1: its own GPU).
JOBS_PER_GPU_ENV = "ISTAR_JOBS_PER_GPU"


def fine_tune_gpus(training: dict) -> int:
    """The GPUs a fine-tuning job asks for (the ``training`` section): ``gpus``, or at most one where
    ``replicas_as_micro_batches`` runs the ``gpus`` data-parallel replicas in turn in one process."""
    return min(training["gpus"], 1) if training["replicas_as_micro_batches"] else training["gpus"]


def micro_batches_per_step(training: dict) -> int:
    """Micro-batches one fine-tuning process accumulates per optimizer step: A = ``gradient_accumulation_steps``,
    or G·A where ``replicas_as_micro_batches`` runs the G = ``gpus`` replicas' batches as micro-batches.

    Why that is the same step: under DDP each of G processes draws every G-th batch of the shuffled order,
    penalises its own batch (``penalty.global_penalty: false``), divides its loss by A, and the G
    gradients are averaged: ∇ = (1/(G·A)) Σ over the step's G·A batches. One process accumulating G·A
    micro-batches reads the same G·A batches, in the same order, each penalised on its own, and divides
    each loss by G·A: the same ∇ (dropout aside, whose random stream differs)."""
    accumulation, gpus = training["gradient_accumulation_steps"], training["gpus"]
    return accumulation * gpus if training["replicas_as_micro_batches"] and gpus > 1 else accumulation


def gpu_units(gpus: int, jobs_per_gpu: int) -> int:
    """The ``gpu`` resource a job on ``gpus`` GPUs asks for: one slot for a one-GPU job that shares its
    GPU with up to ``jobs_per_gpu`` − 1 others, ``gpus · jobs_per_gpu`` slots (whole GPUs) for more."""
    return gpus * jobs_per_gpu if gpus > 1 else gpus


def gpu_budget(limit: int | None, jobs_per_gpu: int) -> int | None:
    """The ``gpu`` budget in slots for ``--resources gpu=limit`` (None: none given, nothing to scale)."""
    return None if limit is None else limit * jobs_per_gpu


def packed_threads(threads: int, cores: int, slots: int) -> int:
    """Threads per GPU job when ``slots`` (N·K) jobs share the GPUs on ``cores`` cores: ``training.threads``,
    lowered to ``cores // slots`` so that every slot can be busy at once (Snakemake keeps the jobs' threads
    within ``--cores``). Refused where there are fewer cores than slots."""
    if cores < slots:
        raise ValueError(f"--cores {cores} runs at most {cores} jobs at once, fewer than the {slots} GPU slots "
                         f"(--resources gpu × training.jobs_per_gpu); give --cores {slots} or more, or lower "
                         "training.jobs_per_gpu")
    return min(threads, cores // slots)


def granted_gpus_of(units: int, jobs_per_gpu: int) -> tuple[int, bool]:
    """(GPUs, shared) for a job granted ``units`` of the ``gpu`` resource, counted in slots of
    1/``jobs_per_gpu`` GPU (:func:`gpu_units` inverted): one slot is one shared GPU."""
    if jobs_per_gpu == 1 or units == 0:
        return units, False
    if units == 1:
        return 1, True
    if units % jobs_per_gpu:
        raise ValueError(f"a job granted {units} GPU slots of 1/{jobs_per_gpu} GPU holds no whole number of GPUs; "
                         f"ask for 1 slot (one shared GPU) or a multiple of training.jobs_per_gpu = {jobs_per_gpu}")
    return units // jobs_per_gpu, False

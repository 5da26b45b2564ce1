"""Run an ``istar`` step on the processes its granted GPUs allow.

    istar launch --gpus {resources.gpu} -- train --spec '{…, "mixed_precision": "fp16", …}'

The launcher is told the GPU count only. The precision is the step's own (its spec's
``mixed_precision``, or the step's ``--mixed-precision`` flag when it is given no spec), which the
launcher reads from the step's arguments to tell accelerate:

- ``--gpus 0``: one CPU process (no GPU visible to it), in the precision a CPU runs for the
  one asked (:func:`istar.registry.precisions.run_precision`: fp16 or bf16 → bf16 where the processor
  has it natively, else fp32; the step decides and records it).
- ``--gpus 1``: ``accelerate launch --num_processes 1 --mixed_precision P``.
- ``--gpus N > 1``: ``accelerate launch --multi_gpu --num_processes N --mixed_precision P``
  on a free port, so several multi-GPU jobs can share a machine.

On a site that takes GPUs as a SLURM generic resource only (``gres``, the rule's ``gpu`` set to 0
so that no ``--gpus`` is asked for), ``--gpus 0`` runs on the GPUs SLURM granted the job step
(``SLURM_STEP_GPUS``).

Several one-GPU jobs can share a GPU (``training.jobs_per_gpu`` = K under ``--resources gpu=N``): the
workflow then counts its ``gpu`` resource in slots of 1/K GPU and says so in ``ISTAR_JOBS_PER_GPU``
(:mod:`istar.config.gpu_slots`); a job granted one slot claims one of its GPU's K slots, a job of
two or more GPUs whole GPUs (:func:`try_claim`).

Snakemake does not assign GPUs to local jobs. The launcher claims N GPUs for the job's lifetime
with lock files in the system's temporary folder and sets ``CUDA_VISIBLE_DEVICES`` to them, so two
1-GPU jobs under ``--resources gpu=2`` do not both land on GPU 0. It claims among the machine's GPUs,
or among the entries of a ``CUDA_VISIBLE_DEVICES`` already set (``salloc``, the user's own export;
:func:`visible_devices`), so that each job sees its own entry; a preset list of exactly N entries for
a job that does not share (SLURM's allocation for that job) is taken as given. A claim takes all N
GPUs at once or none (:func:`claim_gpus`): a job that holds some GPUs while it waits for more could
wait forever on another job doing the same.

The launcher never leaves its child behind: SIGTERM, SIGINT and SIGHUP it receives are
forwarded to the child's process group (accelerate's process and, for one GPU, the ``istar``
step it starts; ``istar train`` then saves a state and exits 128 + signal), and after such a
signal the launcher also waits for the processes the child leaves behind (it is their
subreaper), so a state being saved is not cut short when a scheduler ends the job step with
the launcher. The child runs in its own session, so a terminal's Ctrl-C (sent to the whole
foreground group) reaches it once, through the launcher; and it is asked to stop (SIGTERM) by
the kernel should the launcher itself be killed (SIGKILL).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from istar.config.gpu_slots import JOBS_PER_GPU_ENV, granted_gpus_of

__all__ = ["launch_command", "step_precision", "claim_gpus", "try_claim", "Claim", "visible_devices",
           "child_environment", "run_child", "FORWARDED_SIGNALS", "SAVE_GRACE_SECONDS"]

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PR_SET_CHILD_SUBREAPER = 36
# torchrun (accelerate's multi-GPU launcher) SIGKILLs its workers 30 s after passing a stop signal
# on, by default. Saving a fine-tuning state (a BERT-base's weights and AdamW moments, 1.3 GB) on
# a shared file system can take longer; profiles/slurm asks SLURM for the stop signal this many
# seconds ahead of a job's time limit, and torchrun gets as long.
SAVE_GRACE_SECONDS = 120


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def step_precision(step_args: list[str]) -> str:
    """The precision the step is asked for: its ``--spec``'s ``mixed_precision``, else its
    ``--mixed-precision`` flag, else the specs' default."""
    from istar.config.specs import TrainSpec

    def value_of(flag: str) -> str | None:
        return step_args[step_args.index(flag) + 1] if flag in step_args[:-1] else None

    spec = value_of("--spec")
    if spec is not None:
        return json.loads(spec).get("mixed_precision", TrainSpec.mixed_precision)
    return value_of("--mixed-precision") or TrainSpec.mixed_precision


def launch_command(gpus: int, step_args: list[str]) -> list[str]:
    """The command line that runs ``istar STEP_ARGS…`` on ``gpus`` GPUs (0 = CPU)."""
    if gpus < 0:
        raise ValueError(f"gpus must be ≥ 0; got {gpus}")
    if gpus == 0:
        return [sys.executable, "-m", "istar", *step_args]
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(gpus),
                  "--num_machines", "1", "--mixed_precision", step_precision(step_args), "--dynamo_backend", "no"]
    if gpus > 1:
        accelerate += ["--multi_gpu", "--main_process_port", str(free_port())]
    return [*accelerate, "-m", "istar", *step_args]


def visible_devices(environ: dict) -> list[str]:
    """The GPUs a claim shares out, as ``CUDA_VISIBLE_DEVICES`` names them: the entries of a preset
    ``CUDA_VISIBLE_DEVICES``, else the indices of every GPU this machine shows."""
    preset = environ.get("CUDA_VISIBLE_DEVICES")
    if preset is not None:
        return [device.strip() for device in preset.split(",") if device.strip()]
    import torch

    return [str(index) for index in range(torch.cuda.device_count())]


@dataclass
class Claim:
    """GPUs held by one job: ``gpus`` (as ``CUDA_VISIBLE_DEVICES`` names them) and, for a job that shares its
    GPU, ``slot`` (which of the GPU's ``jobs_per_gpu`` slots it holds; None for whole GPUs). ``release()`` frees them."""

    gpus: list[str]
    slot: int | None
    handles: list[int]

    def release(self) -> None:
        for handle in self.handles:
            os.close(handle)
        self.handles = []


@contextlib.contextmanager
def claim_gpus(count: int, devices: list[str], lock_dir: Path | None = None, poll_seconds: float = 5.0,
               jobs_per_gpu: int = 1):
    """Hold ``count`` of ``devices`` (GPUs as ``CUDA_VISIBLE_DEVICES`` names them; file locks) while the
    block runs; yields the names held.

    All or nothing: each attempt, made under one machine-wide claim lock, takes what the job needs or,
    finding too little, takes nothing and waits ``poll_seconds`` before the next
    (:func:`try_claim`). No process holds some GPUs while it waits for others, so two that each
    want every GPU cannot deadlock. With ``jobs_per_gpu`` K > 1 a one-GPU job takes one of K slots
    on a GPU (``training.jobs_per_gpu``); a job of two or more GPUs still takes whole GPUs.
    """
    if count > len(devices):
        raise ValueError(f"the job asks for {count} GPU(s) but this machine shows {len(devices)}; lower training.gpus "
                         f"(or --resources gpu=N), or run it where {count} GPU(s) are visible")
    lock_dir = Path(lock_dir or tempfile.gettempdir())
    while (claim := try_claim(lock_dir, count, devices, jobs_per_gpu)) is None:
        time.sleep(poll_seconds)
    try:
        yield claim.gpus
    finally:
        claim.release()


def try_claim(lock_dir: Path, count: int, devices: list[str], jobs_per_gpu: int = 1) -> Claim | None:
    """One all-or-nothing attempt (under the machine-wide claim lock): the claim, or None if what the
    job needs is not free now.

    A GPU's lock file ``istar-gpu-{g}.lock`` is held exclusively by a job with the whole GPU and
    shared by the jobs with one of its slots, each of which also holds ``istar-gpu-{g}-slot-{s}.lock``
    exclusively (s < ``jobs_per_gpu``). So a whole-GPU job never meets a slot holder on its GPUs,
    and no GPU has more than ``jobs_per_gpu`` slot holders. A slot goes to the GPU with the fewest
    slots taken (then the first listed), so jobs spread over the GPUs: with fewer jobs than slots
    no GPU idles while another holds several.
    """
    claim_lock = _open_lock(lock_dir / "istar-gpu-claim.lock")
    try:
        fcntl.flock(claim_lock, fcntl.LOCK_EX)  # waits for another job's attempt to end
        if count == 1 and jobs_per_gpu > 1:
            return _take_slot(lock_dir, devices, jobs_per_gpu)
        return _take_whole(lock_dir, count, devices)
    finally:
        os.close(claim_lock)


def _gpu_lock(lock_dir: Path, gpu: str, slot: int | None = None) -> Path:
    """The lock file of GPU ``gpu`` (a ``CUDA_VISIBLE_DEVICES`` entry; an old-style MIG name holds '/'), or of one of its slots."""
    name = gpu.replace("/", "_")
    return lock_dir / (f"istar-gpu-{name}.lock" if slot is None else f"istar-gpu-{name}-slot-{slot}.lock")


def _take_whole(lock_dir: Path, count: int, devices: list[str]) -> Claim | None:
    """``count`` GPUs with no holder at all, locked exclusively now; None if fewer are free."""
    claim = Claim([], None, [])
    for gpu in devices:
        if len(claim.gpus) < count and (handle := _try_lock(_gpu_lock(lock_dir, gpu), fcntl.LOCK_EX)) is not None:
            claim.gpus.append(gpu)
            claim.handles.append(handle)
    if len(claim.gpus) == count:
        return claim
    claim.release()
    return None


def _take_slot(lock_dir: Path, devices: list[str], jobs_per_gpu: int) -> Claim | None:
    """A free slot on the least-loaded GPU that has one (no whole-GPU holder, fewer than ``jobs_per_gpu`` slot holders)."""
    options = []  # (slots taken, position in devices, gpu, a free slot)
    for position, gpu in enumerate(devices):
        free = [slot for slot in range(jobs_per_gpu) if _is_free(_gpu_lock(lock_dir, gpu, slot))]
        if free and _is_free(_gpu_lock(lock_dir, gpu), fcntl.LOCK_SH):
            options.append((jobs_per_gpu - len(free), position, gpu, free[0]))
    if not options:
        return None
    *_, gpu, slot = min(options)
    shared = _try_lock(_gpu_lock(lock_dir, gpu), fcntl.LOCK_SH)
    own = _try_lock(_gpu_lock(lock_dir, gpu, slot), fcntl.LOCK_EX)
    return Claim([gpu], slot, [shared, own])


def _try_lock(path: Path, kind: int) -> int | None:
    """The descriptor of ``path`` locked with ``kind`` (flock's LOCK_EX or LOCK_SH) now, or None if it is held."""
    handle = _open_lock(path)
    try:
        fcntl.flock(handle, kind | fcntl.LOCK_NB)
        return handle
    except BlockingIOError:
        os.close(handle)
        return None


def _is_free(path: Path, kind: int = fcntl.LOCK_EX) -> bool:
    handle = _try_lock(path, kind)
    if handle is not None:
        os.close(handle)
    return handle is not None


def _open_lock(path: Path) -> int:
    # Read-only, created world-readable: another user's job on the same machine can open (and
    # flock) the same file; opening it for writing would need write permission on it.
    return os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)


def child_environment(gpus: int, environ: dict) -> dict:
    """The environment of the step on ``gpus`` GPUs; a preset ``CUDA_VISIBLE_DEVICES`` must name enough of them."""
    env = dict(environ)
    if gpus == 0:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a job granted no GPU runs on the CPU even where GPUs exist
        return env
    preset = environ.get("CUDA_VISIBLE_DEVICES")
    if preset is not None and len(visible_devices(environ)) < gpus:
        raise ValueError(f"the job asks for {gpus} GPU(s) but CUDA_VISIBLE_DEVICES={preset!r} names fewer; "
                         f"ask the scheduler for {gpus} GPU(s), or unset CUDA_VISIBLE_DEVICES to let istar claim them")
    if gpus > 1:
        env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SAVE_GRACE_SECONDS))
    return env


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, required=True, help="GPUs granted to the job (Snakemake's resources.gpu)")
    parser.add_argument("step", nargs=argparse.REMAINDER, help="-- then the istar step and its arguments")


def run_cli(args) -> int:
    step = args.step[1:] if args.step[:1] == ["--"] else args.step
    if not step:
        raise ValueError("nothing to launch: give the step after --, e.g. istar launch --gpus 2 -- train …")
    jobs_per_gpu = int(os.environ.get(JOBS_PER_GPU_ENV, "1"))
    # --gpus (Snakemake's resources.gpu), or, where that is 0 and SLURM granted the job step GPUs as a generic
    # resource (gres on sites that reject --gpus, the rule's gpu set to 0 so the executor plugin does not ask
    # with --gpus), their number
    step_gpus = os.environ.get("SLURM_STEP_GPUS", "")
    granted = len(step_gpus.split(",")) if args.gpus == 0 and step_gpus else args.gpus
    count, shared = granted_gpus_of(granted, jobs_per_gpu)
    command = launch_command(count, step)
    env = child_environment(count, os.environ)
    slots = jobs_per_gpu if shared else 1  # the jobs on each GPU this job runs on
    env[JOBS_PER_GPU_ENV] = str(slots)  # for the step's memory check (istar.steps.gpu_memory)
    with contextlib.ExitStack() as held:
        if count == 0:
            where = "the CPU"
        elif "CUDA_VISIBLE_DEVICES" in os.environ and len(visible_devices(os.environ)) == count and not shared:
            given = "granted by SLURM as a generic resource" if granted != args.gpus else "CUDA_VISIBLE_DEVICES as given"
            where = f"GPU(s) {env['CUDA_VISIBLE_DEVICES']} ({given})"
        else:
            gpus = held.enter_context(claim_gpus(count, visible_devices(os.environ), jobs_per_gpu=slots))
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
            how = f"claimed, one of {jobs_per_gpu} jobs on it" if shared else "claimed"
            where = f"GPU(s) {env['CUDA_VISIBLE_DEVICES']} ({how})"
        print(f"launching on {where}:", " ".join(command), flush=True)
        return exit_status(run_child(command, env), step[0])


def _prctl(option: int, value: int) -> None:
    """Linux's prctl(option, value) for this process; elsewhere a no-op."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def run_child(command: list[str], env: dict) -> int:
    """Run ``command`` to its end, forwarding :data:`FORWARDED_SIGNALS`; returns its return code.

    The child gets its own session (a terminal's or a process group's signal reaches it through
    this forwarding only, once) and SIGTERM should this process die first. A forwarded signal
    goes to the child's whole process group: ``accelerate launch`` dies of it at once, while the
    step it started (in the same group) saves a state first. After a forwarded signal this
    process also waits for every descendant left behind, so it ends after them.
    """
    # Descendants whose parent dies are reparented here (this process is their subreaper), and the
    # child, before exec, asks for SIGTERM should the launcher die.
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    child = subprocess.Popen(command, env=env, start_new_session=True,
                             preexec_fn=lambda: _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM)))
    stopping = []

    def forward(signum, frame):
        stopping.append(signum)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signum)

    previous = {number: signal.signal(number, forward) for number in FORWARDED_SIGNALS}
    try:
        returncode = child.wait()  # (PEP 475: the wait goes on after each forwarded signal)
        if stopping:  # reap the descendants left behind until none is left
            with contextlib.suppress(ChildProcessError):
                while True:
                    os.wait()
        return returncode
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def exit_status(returncode: int, step: str) -> int:
    """The launcher's exit status for a child's ``returncode``; a child killed by a signal is explained.

    ``subprocess`` reports a signal as a negative code, which ``sys.exit`` would turn into
    256 − signal (SIGKILL: the bare "exit status 247"); the shell convention 128 + signal is
    returned instead, after one line on stderr saying what happened and that rerunning resumes.
    """
    if returncode >= 0:
        return returncode
    number = -returncode
    name = next((known.name for known in signal.Signals if known == number), f"signal {number}")
    resumes = ("run the same command again: it resumes from the last state saved under OUT/resume/ "
               "(every epoch end and every --checkpoint-every steps)") if step == "train" else \
        "run the same command again to redo it"
    print(f"istar launch: `istar {step}` was killed by {name} (out of memory, a time limit or a kill by hand); "
          f"{resumes}", file=sys.stderr, flush=True)
    return 128 + number

"""Run an ``istar`` step with the processes and precision its granted GPUs allow.

    istar launch --gpus {resources.gpu} --mixed-precision fp16 -- train --model … --out …

- ``--gpus 0``: one CPU process (no GPU visible to it), in the precision a CPU runs for the
  one asked (:func:`istar.registry.precisions.run_precision`: fp16 or bf16 → bf16 where the processor
  has it natively, else fp32; the step decides and records it).
- ``--gpus 1``: ``accelerate launch --num_processes 1 --mixed_precision fp16``.
- ``--gpus N > 1``: ``accelerate launch --multi_gpu --num_processes N --mixed_precision fp16``
  on a free port, so several multi-GPU jobs can share a machine.

Snakemake does not assign GPUs to local jobs. Unless ``CUDA_VISIBLE_DEVICES`` is already set
(as SLURM does), the launcher claims N GPUs for the job's lifetime with lock files in the
system's temporary folder and sets ``CUDA_VISIBLE_DEVICES`` to them, so two 1-GPU jobs under
``--resources gpu=2`` do not both land on GPU 0.

The launcher never leaves its child behind: SIGTERM, SIGINT and SIGHUP it receives are
forwarded to the child (``istar train`` then saves a state and exits 128 + signal), and the
launcher waits for it and returns its status. The child runs in its own session, so a
terminal's Ctrl-C (sent to the whole foreground group) reaches it once, through the launcher;
and it is asked to stop (SIGTERM) by the kernel should the launcher itself be killed (SIGKILL).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from istar.registry.precisions import PRECISIONS

__all__ = ["launch_command", "claim_gpus", "run_child", "FORWARDED_SIGNALS"]

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_command(gpus: int, mixed_precision: str, step_args: list[str]) -> list[str]:
    """The command line that runs ``istar STEP_ARGS…`` on ``gpus`` GPUs (0 = CPU)."""
    if gpus < 0:
        raise ValueError(f"gpus must be ≥ 0; got {gpus}")
    if gpus == 0:
        return [sys.executable, "-m", "istar", *step_args, "--mixed-precision", mixed_precision]
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(gpus),
                  "--num_machines", "1", "--mixed_precision", mixed_precision, "--dynamo_backend", "no"]
    if gpus > 1:
        accelerate += ["--multi_gpu", "--main_process_port", str(free_port())]
    return [*accelerate, "-m", "istar", *step_args, "--mixed-precision", mixed_precision]


def visible_gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


@contextlib.contextmanager
def claim_gpus(count: int, total: int, lock_dir: Path | None = None, poll_seconds: float = 5.0):
    """Hold ``count`` of the GPUs 0..total−1 (exclusive file locks) while the block runs; yields their ids."""
    if count > total:
        raise ValueError(f"the job asks for {count} GPU(s) but this machine shows {total}")
    lock_dir = Path(lock_dir or tempfile.gettempdir())
    held: list[tuple[int, object]] = []
    try:
        while len(held) < count:
            for gpu in range(total):
                if len(held) == count or any(g == gpu for g, _ in held):
                    continue
                handle = open(lock_dir / f"istar-gpu-{gpu}.lock", "w")
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held.append((gpu, handle))
                except BlockingIOError:
                    handle.close()
            if len(held) < count:
                time.sleep(poll_seconds)
        yield [gpu for gpu, _ in held]
    finally:
        for _, handle in held:
            handle.close()


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, required=True, help="GPUs granted to the job (Snakemake's resources.gpu)")
    parser.add_argument("--mixed-precision", choices=tuple(PRECISIONS), default="fp16",
                        help="the precision asked for (training.mixed_precision); on a CPU fp16 and bf16 run as bf16 "
                             "where the processor has it natively, else fp32")
    parser.add_argument("step", nargs=argparse.REMAINDER, help="-- then the istar step and its arguments")


def run_cli(args) -> int:
    step = args.step[1:] if args.step[:1] == ["--"] else args.step
    if not step:
        raise ValueError("nothing to launch: give the step after --, e.g. istar launch --gpus 2 -- train …")
    command = launch_command(args.gpus, args.mixed_precision, step)
    env = dict(os.environ)
    if args.gpus == 0:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a job granted no GPU runs on the CPU even where GPUs exist
    if args.gpus == 0 or "CUDA_VISIBLE_DEVICES" in os.environ:
        print("launching:", " ".join(command), flush=True)
        return exit_status(run_child(command, env), step[0])
    with claim_gpus(args.gpus, visible_gpu_count()) as gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        print(f"launching on GPU(s) {env['CUDA_VISIBLE_DEVICES']}:", " ".join(command), flush=True)
        return exit_status(run_child(command, env), step[0])


def _stop_with_parent() -> None:
    """In the child, before exec: SIGTERM when the launcher dies (Linux; elsewhere a no-op)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def run_child(command: list[str], env: dict) -> int:
    """Run ``command`` to its end, forwarding :data:`FORWARDED_SIGNALS`; returns its return code.

    The child gets its own session (a terminal's or a process group's signal reaches it through
    this forwarding only, once) and SIGTERM should this process die first.
    """
    child = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_stop_with_parent)

    def forward(signum, frame):
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {number: signal.signal(number, forward) for number in FORWARDED_SIGNALS}
    try:
        return child.wait()  # (PEP 475: the wait goes on after each forwarded signal)
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
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    resumes = ("run the same command again: it resumes from the last state saved under OUT/resume/ "
               "(every epoch end and every --checkpoint-every steps)") if step == "train" else \
        "run the same command again to redo it"
    print(f"istar launch: `istar {step}` was killed by {name} (out of memory, a time limit or a kill by hand); "
          f"{resumes}", file=sys.stderr, flush=True)
    return 128 + number

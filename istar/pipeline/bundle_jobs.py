"""The jobs of a bundle's unit as processes: needs first, a few at a time, stopped at a deadline.

:mod:`istar.pipeline.bundle_run` decides which units run and packs what they made; a
:class:`Runner` runs the jobs of one unit in the work folder, as the workflow's rules would run
them: a model step through ``istar launch`` with ``OMP_NUM_THREADS`` set to the plan's threads,
each job's output in its rule's log file, a job whose outputs exist skipped. At the deadline it
sends the running jobs SIGTERM (a fine-tuning run saves its state and exits) and SIGKILL
``KILL_WAIT_S`` seconds later. :func:`claimed_gpus` claims the GPUs once for the whole call and
hands them to the jobs in ``CUDA_VISIBLE_DEVICES``, as SLURM does.

Like :mod:`istar.pipeline.bundle_run`, it imports only the standard library and (for the GPUs)
:mod:`istar.steps.launch`.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["Runner", "claimed_gpus"]

POLL_S = 0.2
KILL_WAIT_S = 15.0


class Runner:
    """Runs units of a plan in a work folder, a few jobs at a time, against a deadline."""

    def __init__(self, plan: dict, workdir: Path, env: dict, gpus: int | None, parallel: int, kill_at: float):
        self.plan, self.workdir, self.env, self.gpus = plan, workdir, env, gpus
        self.parallel, self.kill_at = parallel, kill_at
        self.jobs = plan["jobs"]
        self.producer = {output: index for index, job in enumerate(self.jobs) for output in job["outputs"]}
        self.records: list[dict] = []

    def exist(self, paths) -> bool:
        return all((self.workdir / path).exists() for path in paths)

    def todo(self, unit: dict) -> list[int]:
        """The jobs of a unit and the jobs producing what they need, in plan order, less those whose outputs exist."""
        wanted, stack = set(), list(unit["jobs"])
        while stack:
            index = stack.pop()
            if index not in wanted:
                wanted.add(index)
                stack += [self.producer[path] for path in self.jobs[index]["needs"] if path in self.producer]
        return [index for index in sorted(wanted) if not self.exist(self.jobs[index]["outputs"])]

    def start(self, index: int) -> subprocess.Popen:
        """This interpreter's ``istar`` running the job's step, through ``istar launch`` on at most ``gpus``."""
        job = self.jobs[index]
        gpus = job["gpus"] if self.gpus is None else min(job["gpus"], self.gpus)
        launch = ["launch", "--gpus", str(gpus), "--"] if job["launch"] else []
        log = self.workdir / job["log"]
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**self.env, **({"OMP_NUM_THREADS": str(self.plan["threads"])} if job["launch"] else {})}
        with open(log, "w", encoding="utf-8") as handle:
            process = subprocess.Popen([sys.executable, "-m", "istar", *launch, *job["step"]], cwd=self.workdir,
                                       env=env, stdout=handle, stderr=subprocess.STDOUT)
        print(f"  started {job['rule']}: {job['label']}", flush=True)
        return process

    def run(self, indices: list[int]) -> str:
        """Run ``indices`` (needs first, up to ``parallel`` at once): "done", "failed" or "stopped".
        Interrupted (Ctrl-C, SIGTERM), it stops the running jobs first."""
        waiting, running, status = list(indices), {}, "done"
        try:
            while waiting or running:
                for index in list(waiting):
                    if len(running) >= self.parallel:
                        break
                    if self.exist(self.jobs[index]["needs"]):
                        waiting.remove(index)
                        running[index] = (self.start(index), time.monotonic())
                if not running and waiting:
                    missing = [p for i in waiting for p in self.jobs[i]["needs"] if not (self.workdir / p).exists()]
                    raise RuntimeError(f"nothing in the plan produces {missing[0]}: the bundle is inconsistent; "
                                       "build it again")
                time.sleep(POLL_S)
                for index, (process, started) in list(running.items()):
                    code = process.poll()
                    if code is None:
                        continue
                    del running[index]
                    self.record(index, code, time.monotonic() - started)
                    if code != 0:
                        status = "failed"
                if status == "failed" or time.monotonic() > self.kill_at:
                    self.stop(running)
                    running.clear()
                    return "failed" if status == "failed" else "stopped"
            return status
        except BaseException:
            self.stop(running)
            raise

    def record(self, index: int, code: int, seconds: float) -> None:
        job = self.jobs[index]
        self.records.append({"job": index, "rule": job["rule"], "label": job["label"], "returncode": code,
                             "seconds": round(seconds, 2), "estimate_s": job["estimate_s"], "log": job["log"]})
        state = "done" if code == 0 else f"FAILED (exit {code}); its log: {job['log']}"
        print(f"  {state}: {job['rule']} {job['label']} in {seconds:.1f} s (estimated {job['estimate_s']:.0f} s)",
              flush=True)
        if code != 0:
            tail = (self.workdir / job["log"]).read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
            print("\n".join("    | " + line for line in tail), flush=True)

    def stop(self, running: dict) -> None:
        """SIGTERM (istar launch forwards it; a fine-tuning run saves its state), then SIGKILL after a wait."""
        for index, (process, started) in running.items():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + KILL_WAIT_S
        for index, (process, started) in running.items():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()  # the launcher; its child gets SIGTERM from the kernel as it goes (istar launch)
                process.wait()
            self.record(index, process.returncode, time.monotonic() - started)


@contextlib.contextmanager
def claimed_gpus(count: int, env: dict):
    """``env`` with ``CUDA_VISIBLE_DEVICES`` set to ``count`` claimed GPUs (as ``istar launch`` claims them),
    unless it is set already or no GPU is asked for."""
    if count == 0 or "CUDA_VISIBLE_DEVICES" in env:
        yield env
        return
    from istar.steps.launch import claim_gpus, visible_devices

    devices = visible_devices(env)
    if len(devices) < count:
        raise ValueError(f"the bundle's jobs ask for {count} GPU(s) but this machine shows {len(devices)}: run on a "
                         "GPU machine, or on the CPU with --gpus 0")
    with claim_gpus(count, devices) as gpus:
        yield {**env, "CUDA_VISIBLE_DEVICES": ",".join(gpus)}

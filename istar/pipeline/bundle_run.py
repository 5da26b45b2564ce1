"""The device side of a study bundle: run its jobs where there is no Snakemake and no network.

    python -m istar run-bundle gpu-bundle --out $OUT/results.tar.gz [--budget 560] [--parallel 1]

A bundle (``istar bundle``, :mod:`istar.pipeline.bundle`) holds the prepared data, the model and
``jobs.json``: every job the workflow would run from Σ_S to the measurements, each with the
spec its rule would pass, the files it reads and writes, and an estimate of its time. Jobs are
grouped into *units*: the fine-tuning runs of a setting with the measurement job that reads
their models (the models never leave the machine, so a measurement runs where its models were
trained), or one ``select`` job. This command runs the units in order in a work folder beside the
bundle (``gpu-bundle-work/``), as the workflow would run their jobs (each unit's jobs as processes:
:mod:`istar.pipeline.bundle_jobs`):

- each model step through ``istar launch --gpus N -- STEP --spec …`` with
  ``OMP_NUM_THREADS`` set to the config's threads, its output in the rule's log file; the GPUs
  are claimed once for the whole run (:func:`istar.steps.launch.claim_gpus`) and handed to the
  jobs in ``CUDA_VISIBLE_DEVICES``, as SLURM does; ``--gpus N`` lowers every job's GPUs to at most
  N, as Snakemake's ``--resources gpu=N`` does (``--gpus 0``: the CPU);
- a job whose outputs exist is skipped; a unit that ``istar import-bundle`` recorded as brought
  back (the bundle's ``done.json``) is not run again; a Σ_S job runs before the first unit that
  needs it, once per work folder;
- a unit starts only when it is predicted to end within ``--budget`` seconds of the start: its
  estimate, scaled by how long the units run so far took against theirs (in this call and in the
  calls brought back before, ``done.json``); a later, smaller one may still fit. Jobs still running
  at the budget are stopped (SIGTERM: a fine-tuning run saves its state and exits; SIGKILL 15 s
  later), and their unit counts as not done;
- the first failing job stops the run.

At the end the files the workflow turns into tables and figures — each run's ``metrics.json``,
``run_config.json`` and ``train_log.csv``, the measurement files, the ``best.json`` files and the
Σ_S provenance JSONs, no model weights — of every unit done in the work folder and not yet
brought back, the logs of the jobs run, and ``bundle-summary.json`` (what ran, how long, on which
device, which units are left) go into one ``.tar.gz``. Run the same command again, after
importing, until no unit is left.

This module and :mod:`istar.pipeline.bundle_jobs` import only the standard library and
:mod:`istar.steps.launch` (which counts the GPUs with torch): never Snakemake, jsonschema, datasets
or pandas, which a GPU machine may lack.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from istar.io.provenance import package_sha256
from istar.pipeline.bundle_jobs import Runner, claimed_gpus

__all__ = ["run_bundle", "read_plan", "unit_range", "JOBS_FILE", "DONE_FILE", "SUMMARY_NAME", "MADE_HERE",
           "BUNDLE_FORMAT", "ARCHIVE_LIMIT"]

BUNDLE_FORMAT = 1
JOBS_FILE = "jobs.json"
DONE_FILE = "done.json"
SUMMARY_NAME = "bundle-summary.json"
WORK_MARK = ".bundle-id"
ARCHIVE_LIMIT = 16 * 2**20  # one file back from the device machine
MADE_HERE = ("done", "already-done")  # the statuses of a unit whose files the work folder holds
CALIBRATE_FROM_S = 30.0  # units estimated shorter than this (a select job) say little about the speed
REPO = Path(__file__).resolve().parents[2]


def checkout_env() -> dict:
    """This process's environment with this checkout first on PYTHONPATH: the steps run its istar."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}


def read_plan(bundle: Path) -> dict:
    """The bundle's ``jobs.json``; a clear error when the folder is not a bundle of this format."""
    path = Path(bundle) / JOBS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{bundle} is not a study bundle (no {JOBS_FILE}): build one with "
                                "`istar bundle --config CONFIG --out FOLDER`")
    plan = json.loads(path.read_text(encoding="utf-8"))
    if plan.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"{path} has bundle format {plan.get('format')!r}; this istar reads format {BUNDLE_FORMAT}: "
                         "build the bundle again with this checkout")
    return plan


def read_done(bundle: Path, plan: dict) -> dict:
    """What ``istar import-bundle`` recorded for this bundle: ``units`` brought back, and
    ``calibration`` (per number of parallel jobs: [seconds taken, seconds estimated] of the units run)."""
    path = Path(bundle) / DONE_FILE
    done = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if done.get("bundle_id") != plan["bundle_id"]:
        done = {}
    return {"units": set(done.get("units", [])), "calibration": done.get("calibration", {})}


def prepare_workdir(bundle: Path, plan: dict, workdir: Path) -> Path:
    """The work folder with the bundle's inputs linked in; emptied first when it holds another bundle's work."""
    workdir.mkdir(parents=True, exist_ok=True)
    mark = workdir / WORK_MARK
    if mark.is_file() and mark.read_text().strip() != plan["bundle_id"]:
        for name in ("results", "resources", "logs", "models"):
            _remove(workdir / name)
    elif not mark.is_file() and any(workdir.iterdir()):
        raise ValueError(f"work folder {workdir} holds files but no {WORK_MARK}: it is not a bundle's work folder; "
                         "name an empty or new one with --workdir")
    mark.write_text(plan["bundle_id"] + "\n")
    for relative in plan["inputs"]:
        link, target = workdir / relative, (Path(bundle) / relative).resolve()
        if not target.exists():
            raise FileNotFoundError(f"the bundle lacks {relative}: build it again")
        if not (link.is_symlink() and link.resolve() == target):
            _remove(link)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(target, target_is_directory=target.is_dir())
    return workdir


def _remove(path: Path) -> None:
    """Remove a file, a link (not what it points to) or a folder, if there is one."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.is_symlink() or path.exists():
        path.unlink()


def unit_range(text: str, count: int) -> range:
    """``A:B`` (Python slice bounds over the unit numbers the bundle lists), ``A`` one unit, ``A:`` from A."""
    try:
        start, sep, stop = text.partition(":")
        first = int(start) if start else 0
        last = (int(stop) if stop else count) if sep else first + 1
    except ValueError:
        raise ValueError(f"--units {text!r}: write A:B (units A to B−1), A: or A, as numbered by `istar bundle`") from None
    if not 0 <= first < last <= count:
        raise ValueError(f"--units {text!r}: the bundle has units 0 to {count - 1}")
    return range(first, last)


def _safetensors_digest(path: Path) -> str | None:
    """The content hash ``istar`` records in a safetensors file's metadata (read from its JSON header)."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        with open(path, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            return json.loads(handle.read(size))["__metadata__"]["sha256"]
    return None


def _device() -> dict:
    """The GPUs as nvidia-smi names them (none: the CPU), without importing torch."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"gpus": []}
    done = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=60)
    return {"gpus": [line.strip() for line in done.stdout.splitlines() if line.strip()]}


def run_bundle(bundle, out, *, workdir=None, budget: float = 560.0, gpus: int | None = None, parallel: int = 1,
               units: str | None = None) -> dict:
    """Run the bundle's pending units within the budget and pack what they produced into ``out`` (.tar.gz).

    Returns the summary written into the archive (``status`` per unit: done, already-done (found
    complete in the work folder), brought-back (in done.json), left (did not fit), too-large, failed,
    stopped, not-selected).
    """
    started_at, clock = datetime.now(timezone.utc), time.monotonic()
    if budget <= 0 or parallel < 1:
        raise ValueError("--budget must be > 0 and --parallel ≥ 1")
    bundle = Path(bundle)
    plan = read_plan(bundle)
    beside = bundle.resolve().with_name(f"{bundle.resolve().name}-work")  # the default: gpu-bundle-work
    workdir = prepare_workdir(bundle, plan, Path(workdir) if workdir else beside)
    done = read_done(bundle, plan)
    brought_back = done["units"]
    chosen = set(unit_range(units, len(plan["units"]))) if units else set(range(len(plan["units"])))
    env = {**checkout_env(), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    wanted_gpus = max((job["gpus"] for job in plan["jobs"] if job["launch"]), default=0)
    statuses: dict[str, dict] = {}
    spent, estimated = done["calibration"].get(str(parallel), (0.0, 0.0))  # earlier calls' units, as a prior
    new = [0.0, 0.0]  # this call's
    stopped, interrupted = False, None
    print(f"bundle {bundle} ({len(plan['units'])} units, {len(brought_back)} brought back already) in {workdir}; "
          f"budget {budget:.0f} s, {parallel} job(s) at a time", flush=True)
    with claimed_gpus(wanted_gpus if gpus is None else min(wanted_gpus, gpus), env) as env:
        runner = Runner(plan, workdir, env, gpus, parallel, clock + budget)
        for number, unit in enumerate(plan["units"]):
            name = unit["name"]
            skipped = "brought-back" if name in brought_back else None if number in chosen else "not-selected"
            todo = [] if skipped else runner.todo(unit)
            if not todo:
                statuses[name] = {"status": skipped or "already-done"}
                continue
            unit_estimate = sum(plan["jobs"][index]["estimate_s"] for index in todo)
            predicted = (spent / estimated if estimated else 1.0) * unit_estimate
            elapsed = time.monotonic() - clock
            if stopped or elapsed + predicted > budget:
                status = "too-large" if predicted > budget and not stopped else "left"
                statuses[name] = {"status": status, "predicted_s": round(predicted, 1)}
                continue
            print(f"unit {number} {name}: {len(todo)} job(s), predicted {predicted:.0f} s "
                  f"(at {elapsed:.0f} s of {budget:.0f})", flush=True)
            begin = time.monotonic()
            try:
                status = runner.run(todo)
            except BaseException as error:  # Ctrl-C, SIGTERM: the jobs are stopped; pack what is done
                interrupted, status = error, "stopped"
            seconds = time.monotonic() - begin
            statuses[name] = {"status": status, "seconds": round(seconds, 1), "predicted_s": round(predicted, 1)}
            if status == "done" and unit_estimate >= CALIBRATE_FROM_S:
                spent, estimated = spent + seconds, estimated + unit_estimate
                new = [new[0] + seconds, new[1] + unit_estimate]
            stopped = stopped or status != "done"
    summary = {
        "bundle_id": plan["bundle_id"], "started": started_at.isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - clock, 1), "budget_s": budget, "parallel": parallel,
        "gpus_cap": gpus, "device": _device(), "python": sys.version.split()[0],
        "code_sha256": {"built": plan["code_sha256"], "ran": package_sha256()},
        "speed_factor": round(new[0] / new[1], 3) if new[1] else None,
        "calibration": {str(parallel): [round(new[0], 1), round(new[1], 1)]} if new[1] else {},
        "units": statuses, "jobs": runner.records,
    }
    summary["sigma_sha256"] = {job["outputs"][0]: _safetensors_digest(workdir / job["outputs"][0])
                               for job in plan["jobs"] if job["step"][0] == "shrinkage"
                               and (workdir / job["outputs"][0]).is_file()}
    pack(plan, workdir, summary, Path(out))
    _report(summary, Path(out))
    if interrupted is not None:
        raise interrupted
    return summary


def pack(plan: dict, workdir: Path, summary: dict, out: Path) -> None:
    """The kept files of every unit done here and not yet brought back, the Σ_S provenance, the logs
    of this call's jobs and the summary, as one .tar.gz (logs left out if it would exceed the limit)."""
    kept = [path for unit in plan["units"] if summary["units"][unit["name"]]["status"] in MADE_HERE
            for index in unit["jobs"] for path in plan["jobs"][index]["keep"]]
    kept += [path for job in plan["jobs"] if job["step"][0] == "shrinkage" for path in job["keep"]
             if (workdir / path).is_file()]
    logs = [record["log"] for record in summary["jobs"] if (workdir / record["log"]).is_file()]
    if missing := [path for path in kept if not (workdir / path).is_file()]:
        raise RuntimeError(f"a unit marked done lacks {missing[0]}: its job did not write what the plan says")
    summary["packed"] = sorted(dict.fromkeys(kept))
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    for with_logs in (True, False):
        summary["logs_packed"] = with_logs
        with tarfile.open(partial, "w:gz") as archive:
            for name in dict.fromkeys(summary["packed"] + (logs if with_logs else [])):
                archive.add(workdir / name, arcname=name, recursive=False)
            data = json.dumps(summary, indent=1, ensure_ascii=False).encode()
            info = tarfile.TarInfo(SUMMARY_NAME)
            info.size, info.mtime = len(data), int(time.time())
            archive.addfile(info, io.BytesIO(data))
        partial.replace(out)
        if out.stat().st_size <= ARCHIVE_LIMIT:
            return
    raise RuntimeError(f"{out} holds {out.stat().st_size / 2**20:.1f} MiB even without logs, over the "
                       f"{ARCHIVE_LIMIT / 2**20:.0f} MiB a file may bring back; run fewer units per call (--units)")


def _report(summary: dict, out: Path) -> None:
    counts = Counter(entry["status"] for entry in summary["units"].values())
    print(f"\n{summary['seconds']:.0f} s; units: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    if summary["speed_factor"] is not None:
        print(f"the units took {summary['speed_factor']:.2f} × their estimated time")
    for name, entry in summary["units"].items():
        if entry["status"] == "too-large":
            print(f"unit {name} is predicted at {entry['predicted_s']:.0f} s, more than the budget of "
                  f"{summary['budget_s']:.0f} s: it never starts; raise --budget (a device command may run 600 s) "
                  "or give the study fewer seeds per setting")
    if summary["code_sha256"]["built"] != summary["code_sha256"]["ran"]:
        print("warning: the istar code here differs from the code the bundle was built with "
              "(summary: code_sha256); the runs record the code that ran")
    left = [name for name, entry in summary["units"].items() if entry["status"] in ("left", "stopped", "failed")]
    print(f"{len(summary['packed'])} file(s) -> {out} ({out.stat().st_size / 2**20:.2f} MiB)"
          + ("" if summary["logs_packed"] else ", logs left out to stay under the size limit"))
    if left:
        print(f"{len(left)} unit(s) left: bring {out.name} back, `istar import-bundle` it, then run this command again")


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", type=Path, help="the bundle folder (`istar bundle --out`)")
    parser.add_argument("--out", required=True, type=Path, help="the archive to write (.tar.gz), e.g. $OUT/results.tar.gz")
    parser.add_argument("--budget", type=float, default=560.0,
                        help="seconds from the start within which a unit must be predicted to end to start; jobs "
                             "still running then are stopped (default: %(default)s, inside a 600 s device call)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="jobs of a unit run at once on the claimed GPU(s) (default: %(default)s)")
    parser.add_argument("--gpus", type=int, default=None,
                        help="at most this many GPUs per job (0: the CPU), as snakemake --resources gpu=N")
    parser.add_argument("--units", default=None, metavar="A:B", help="only these units (numbers as `istar bundle` lists them)")
    parser.add_argument("--workdir", type=Path, default=None, help="work folder (default: BUNDLE-work beside the bundle)")


def run_cli(args) -> int:
    summary = run_bundle(args.bundle, args.out, workdir=args.workdir, budget=args.budget, gpus=args.gpus,
                         parallel=args.parallel, units=args.units)
    return 1 if any(entry["status"] in ("failed", "stopped") for entry in summary["units"].values()) else 0

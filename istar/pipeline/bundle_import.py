"""Bring a bundle's results home: unpack the archives ``istar run-bundle`` wrote, then aggregate,
tables and figures, as the workflow's rules make them (docs/gpu-bundle.md).

    istar import-bundle results.tar.gz [more.tar.gz …] --bundle gpu-bundle [--root .] [--partial] [--force]

Each archive must come from this bundle (its id). Its files land at their workflow paths under
``--root`` (results/runs/…, results/measures/…, results/selection/…, the Σ_S provenance under
resources/shrinkage/…, logs/…), each run and measurement checked against the content hash its
step recorded; a file already there with other contents stops the import (``--force`` replaces
it), except a Σ_S provenance file, which keeps the first machine's and notes whether the Σ_S
matched. The summary of the call goes to ``results/bundle/``, and the units brought back are
recorded in the bundle's ``done.json``, so the next ``run-bundle`` skips them.

Once every unit is back (or with ``--partial``, from what is back), it runs ``istar aggregate``,
``istar experiment`` (Table 1's cells as DVC metrics), ``istar stability`` where the config asks for
Fig. 2, ``istar table``, ``istar figure`` and ``istar summary`` (the landing page, results/summary.md)
with the arguments their rules pass, each logging to the rule's log file, and writes the validated
config to ``results/config.yaml``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
from pathlib import Path, PurePosixPath

from istar.config.layout import AGGREGATE, EXPERIMENT_METRICS, FIGURE, RESOLVED_CONFIG, SUMMARY_MD, TABLE
from istar.pipeline.bundle import CONFIG_NAME
from istar.pipeline.bundle_run import DONE_FILE, MADE_HERE, SUMMARY_NAME, checkout_env, read_done, read_plan

__all__ = ["import_bundle", "finish"]

ALLOWED = ("results/runs/", "results/measures/", "results/selection/", "resources/shrinkage/", "logs/")
SIGMA_PROVENANCE = "resources/shrinkage/"


def _members(archive: tarfile.TarFile, name: str) -> dict[str, tarfile.TarInfo]:
    """The archive's files by name, each a plain file at a relative path the bundle may write."""
    members = {}
    for info in archive.getmembers():
        path = PurePosixPath(info.name)
        if not info.isfile() or path.is_absolute() or ".." in path.parts or (
                info.name != SUMMARY_NAME and not info.name.startswith(ALLOWED)):
            raise ValueError(f"{name}: {info.name!r} is not a file a bundle brings back: this is not an archive "
                             "written by `istar run-bundle`")
        members[info.name] = info
    if SUMMARY_NAME not in members:
        raise ValueError(f"{name} has no {SUMMARY_NAME}: it was not written by `istar run-bundle`")
    return members


def import_archive(path: Path, bundle: Path, plan: dict, root: Path, force: bool) -> dict:
    """Unpack one archive under ``root``; returns its summary with ``sigma_notes``."""
    from istar.io import artifacts

    with tarfile.open(path, "r:gz") as archive:
        members = _members(archive, str(path))
        summary = json.load(archive.extractfile(members.pop(SUMMARY_NAME)))
        if summary.get("bundle_id") != plan["bundle_id"]:
            raise ValueError(f"{path} comes from bundle {summary.get('bundle_id')}, not from {bundle} "
                             f"({plan['bundle_id']}): import it with the bundle that ran it")
        contents = {name: archive.extractfile(info).read() for name, info in members.items()}
    calls = root / "results" / "bundle"
    first: dict = {}  # each Σ_S's digest as the first other call brought it back
    for record in sorted(calls.glob("call-*.json")):
        earlier = json.loads(record.read_text(encoding="utf-8"))
        if earlier.get("started") != summary.get("started"):
            for sigma, digest in earlier.get("sigma_sha256", {}).items():
                first.setdefault(sigma, digest)
    conflicts, writes, summary["sigma_notes"] = [], {}, []
    for name, data in contents.items():
        target, sigma = root / name, name.replace(".json", ".pt")
        # a Σ_S that another call already brought back was recomputed on this machine: its
        # provenance may equal the first byte for byte (its timing rounds alike), so the test
        # is where it came from, not whether it differs
        if name.startswith(SIGMA_PROVENANCE) and target.is_file() and sigma in first:
            mine = summary["sigma_sha256"].get(sigma)
            same = mine is not None and mine == first[sigma]
            summary["sigma_notes"].append(
                f"{sigma}: recomputed on this machine, {'identical to' if same else 'different from'} the first one "
                "(the first provenance file is kept; each run records the Σ_S it read)")
            continue
        if target.is_file() and target.read_bytes() != data and not name.startswith("logs/"):
            conflicts.append(name)
        writes[name] = data
    if conflicts and not force:
        raise ValueError(f"{len(conflicts)} file(s) of {path} differ from those already under {root}, e.g. "
                         f"{conflicts[0]}: another run wrote them; import into another --root, or replace them with --force")
    for name, data in writes.items():
        with artifacts.atomic_path(root / name) as tmp:
            tmp.write_bytes(data)
    summary["archive"] = str(path)
    record = calls / f"call-{summary['started'].replace(':', '')}.json"
    summary["imported_before"] = record.is_file()
    artifacts.write_json(record, summary)
    return summary


def _check_units(plan: dict, root: Path, names: set[str]) -> None:
    """Every run and measurement of the units brought back, read as the aggregate will read them (hashes checked)."""
    from istar.io import artifacts
    from istar.io.results import read_finished_run

    for job in (plan["jobs"][index] for unit in plan["units"] if unit["name"] in names for index in unit["jobs"]):
        if job["rule"] == "train":
            read_finished_run(root / Path(job["outputs"][0]).parent)
        else:
            for output in job["keep"]:
                artifacts.read_json(root / output)


def finish(plan: dict, bundle: Path, root: Path, partial: bool) -> list[str]:
    """Aggregate, (Fig. 2's simulation,) tables and figures, as their rules run them; returns the files made
    (every output of the jobs run)."""
    from istar.io import artifacts
    from istar.pipeline.jobs import aggregate_job, report_jobs
    from istar.pipeline.validate import load_config
    from istar.report.figures import STABILITY_CSV, enabled_figures
    from istar.report.table_specs import enabled_tables

    def back(path: str) -> bool:
        """Whether the aggregate reads ``path``: every input of the plan, or with ``partial`` those back."""
        return not partial or (root / path).is_file()

    aggregate = plan["aggregate"]
    runs = [(study, run) for study, run in aggregate["runs"] if back(f"{run}/metrics.json")]
    selections, measures = ([path for path in aggregate[key] if back(path)] for key in ("selections", "measures"))
    # the study's resolved config, first: the aggregate and the tables read what it declared (the rule for
    # collapsed runs, the paper's models, the primary endpoint), as their rules pass it
    config_file = root / RESOLVED_CONFIG
    artifacts.write_text(config_file, (bundle / CONFIG_NAME).read_text(encoding="utf-8"))
    config = load_config(config_file, check_paths=False)
    # what the workflow's `all` asks for of them: the tables, figures and Fig. 2's simulation the config has on
    wanted = {f"{TABLE.format(table=table)}.csv" for table in enabled_tables(config)}
    wanted |= {f"{FIGURE.format(figure=figure)}.png" for figure in enabled_figures(config)}
    wanted |= {EXPERIMENT_METRICS, SUMMARY_MD} | (
        {AGGREGATE.format(name=STABILITY_CSV)} if config["studies"]["stability"]["enabled"] else set())
    jobs = [aggregate_job(config, runs, selections, measures),
            *(job for job in report_jobs(config) if job.outputs[0] in wanted)]
    for job in jobs:
        (root / job.log).parent.mkdir(parents=True, exist_ok=True)
        with open(root / job.log, "w", encoding="utf-8") as handle:
            done = subprocess.run([sys.executable, "-m", "istar", *job.argv], cwd=root, env=checkout_env(),
                                  stdout=handle, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            tail = (root / job.log).read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
            raise RuntimeError(f"istar {job.label} failed (exit {done.returncode}); {root / job.log}:\n" + "\n".join(tail))
        print(f"istar {job.label} -> {job.log}", flush=True)
    return [path for job in jobs for path in job.outputs]


def import_bundle(archives, bundle, *, root=".", partial: bool = False, force: bool = False) -> dict:
    """Import ``archives`` (from ``istar run-bundle`` on this bundle) under ``root`` and, once every
    unit is back (or with ``partial``), make the aggregates, tables and figures. Returns
    {units_back, units_left, made, sigma_notes}."""
    from istar.io import artifacts

    bundle, root = Path(bundle), Path(root)
    plan = read_plan(bundle)
    done = read_done(bundle, plan)
    back, calibration = done["units"], done["calibration"]
    notes = []
    for path in archives:
        summary = import_archive(Path(path), bundle, plan, root, force)
        arrived = {name for name, entry in summary["units"].items() if entry["status"] in MADE_HERE}
        _check_units(plan, root, arrived)
        back |= arrived
        notes += summary["sigma_notes"]
        for parallel, (seconds, estimate) in ({} if summary["imported_before"] else summary["calibration"]).items():
            before = calibration.get(parallel, [0.0, 0.0])
            calibration[parallel] = [before[0] + seconds, before[1] + estimate]
        artifacts.write_json(bundle / DONE_FILE, {"bundle_id": plan["bundle_id"], "units": sorted(back),
                                                  "calibration": calibration})
        print(f"{path}: {len(arrived)} unit(s) back; {summary['seconds']:.0f} s on "
              f"{', '.join(summary['device']['gpus']) or 'the CPU'}", flush=True)
    left = [unit["name"] for unit in plan["units"] if unit["name"] not in back]
    for note in notes:
        print(note)
    made = finish(plan, bundle, root, partial) if partial or not left else []
    if left:
        print(f"{len(left)} of {len(plan['units'])} unit(s) still to run (e.g. {left[0]}): run "
              f"`python -m istar run-bundle {bundle} --out $OUT/results.tar.gz` on the device again"
              + ("" if partial else "; --partial makes the tables from what is back"))
    return {"units_back": sorted(back), "units_left": left, "made": made, "sigma_notes": notes}


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("archives", nargs="+", type=Path, help="archives written by `istar run-bundle`")
    parser.add_argument("--bundle", required=True, type=Path, help="the bundle they ran (`istar bundle --out`)")
    parser.add_argument("--root", type=Path, default=Path("."),
                        help="the workflow's working folder to import into (default: the current folder)")
    parser.add_argument("--partial", action="store_true", help="make the aggregates and tables before every unit is back")
    parser.add_argument("--force", action="store_true", help="replace files already there with other contents")


def run_cli(args) -> int:
    result = import_bundle(args.archives, args.bundle, root=args.root, partial=args.partial, force=args.force)
    for path in result["made"]:
        print(f"  {path}")
    return 0

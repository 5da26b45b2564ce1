"""``istar adopt-specs``: a results folder made before every job recorded its spec, brought up to date
without retraining what is already right.

Snakemake reruns a job whose recorded params changed. Since 0.3 every job of the table records its spec
(the Σ_S and measurement jobs did not before), so on the first run after upgrading Snakemake sees new
params for every Σ_S and measurement job, and through their files every fine-tune downstream. This
command checks each existing Σ_S file and measurement against the spec its job has now — from the spec
the file records, or for files written before that from the provenance keys that hold the same
settings — then has Snakemake record the specs (``snakemake --touch``) for every job except those whose
files differ, which it names: they and what reads them rerun on the next ``snakemake``.

Run it once after upgrading, with the config the results were made with, before editing it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from istar.core.shrinkage import LEGACY_SETTING_KEYS
from istar.io import artifacts
from istar.pipeline.jobs import decide, plan_cell

__all__ = ["stale_outputs", "recorded_settings"]

# Where a measurement written before it recorded its spec keeps the settings: MeasureSpec field → its key
# (its runs as the keys of a mapping)
LEGACY_MEASURE_KEYS = {"zeta": "zeta", "sigma_s": "sigma_s", "sigma_s_model": "sigma_s_model", "split": "split",
                       "evaluate": "evaluated", "runs": "runs"}


def recorded_settings(step: str, output: Path) -> dict:
    """The settings the file ``output`` of an ``istar {step}`` job was made with: the spec its JSON (a
    measurement, or a Σ_S file's provenance beside it) records, or for a file written before, the keys that
    held the same settings (by spec field name)."""
    recorded = artifacts.read_json(output.with_suffix(".json"))
    legacy = LEGACY_SETTING_KEYS if step == "shrinkage" else LEGACY_MEASURE_KEYS
    return recorded.get("spec") or {name: recorded[key] for name, key in legacy.items() if key in recorded}


def stale_outputs(config: dict, root: Path = Path(".")) -> tuple[list[str], dict[str, list[str]]]:
    """The existing Σ_S and measurement files of ``config``'s jobs under ``root``: those that match their job's
    spec, and those that do not (file → its differing settings, ``name: recorded → planned``)."""
    def read(checkpoint: str, path: str) -> dict | None:
        """A checkpoint's decision as the results under ``root`` hold it (None where it has not run)."""
        return artifacts.read_json(root / path) if (root / path).is_file() else None

    matching, stale = [], {}
    for model in config["models"]:
        for task in config["tasks"]:
            plan = plan_cell(config, model, task, decide(config, model, task, read))
            for job in plan.jobs:
                output = root / job.outputs[0]
                if job.step not in ("shrinkage", "measure") or not output.is_file():
                    continue
                recorded, planned = recorded_settings(job.step, output), json.loads(job.spec.to_json())
                if "runs" in recorded:  # a legacy measurement lists its runs as keys, in no order: compare them sorted
                    recorded["runs"], planned["runs"] = sorted(recorded["runs"]), sorted(planned["runs"])
                differ = [f"{name}: {recorded[name]!r} → {value!r}" for name, value in planned.items()
                          if name in recorded and recorded[name] != value]
                if differ:
                    stale[job.outputs[0]] = differ
                else:
                    matching.append(job.outputs[0])
    return matching, stale


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configfile", nargs="+", required=True, type=Path,
                        help="the workflow config(s) the results were made with, in Snakemake's order")
    parser.add_argument("--directory", type=Path, default=Path("."), help="the working directory (default: .)")
    parser.add_argument("--snakefile", type=Path, default=None, help="the workflow (default: Snakemake's own lookup)")
    parser.add_argument("--dry-run", action="store_true", help="name the files, record nothing")


def run_cli(args: argparse.Namespace) -> int:
    from istar.pipeline.validate import merge_config_files, validate_config

    config = validate_config(merge_config_files(args.configfile), check_paths=False)
    matching, stale = stale_outputs(config, args.directory)
    print(f"{len(matching)} Σ_S and measurement file(s) match the specs their jobs have now")
    for path, differ in stale.items():
        print(f"differs, reruns with what reads it: {path} ({'; '.join(differ)})")
    if args.dry_run:
        return 0
    command = [str(Path(sys.executable).parent / "snakemake"), "--touch", "--cores", "1",
               "--directory", str(args.directory), "--configfile", *map(str, args.configfile)]
    if args.snakefile is not None:
        command += ["--snakefile", str(args.snakefile)]
    if stale:
        command += ["--omit-from", *stale]
    print("recording the specs:", " ".join(command))
    return subprocess.run(command, check=False).returncode


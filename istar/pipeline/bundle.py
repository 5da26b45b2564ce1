"""A confirmatory study as a bundle for a GPU machine with no network and no Snakemake (docs/gpu-bundle.md).

    istar bundle --config config/gpu-study.yaml --mirror PATH/TO/GLUE --out gpu-bundle    # here
    python -m istar run-bundle gpu-bundle --out $OUT/results.tar.gz                        # there
    istar import-bundle results.tar.gz --bundle gpu-bundle                                 # here again

``istar bundle`` does here what needs the network, Snakemake or the mirror, and writes a folder
that travels with the working tree (``carry``)::

    jobs.json                      the plan (below)
    config.yaml                    the validated config, every default filled in (→ results/config.yaml)
    resources/data/{task}/         the prepared splits, as the prepare_data rule writes them
    resources/models/{model}.json  the model's pin file, naming the copy below
    models/{model}/                the model in float16 safetensors with its tokenizer and digests.json

``jobs.json`` is the plan of :mod:`istar.pipeline.bundle_plan`: every job the workflow's rules
would run from Σ_S to the measurements, grouped into units, each with its estimated seconds on an
H100, and the aggregate's inputs (``istar import-bundle`` makes the tables and figures that
``config.yaml`` asks for). A config that still searches, or whose padding study tunes its own
variant, is refused with the key to set.

The model is stored in float16 (a MiniLM-L6 in float32, 90 MB, would not fit the 64 MiB a device
call carries); the steps load it back as float32 master weights (:func:`istar.models.loading.load_model`),
so fine-tuning starts from the original weights rounded to float16 (relative error ≤ 2⁻¹¹),
the same start for every method. The build checks the rounding, and the whole size against
the device's limit: the working tree that travels (tracked and untracked, unignored files) plus
the bundle.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from istar.config.layout import DATA, MODEL_PIN
from istar.config.schema import ConfigError
from istar.pipeline.bundle_plan import (
    confirmatory_problem,
    data_sizes,
    estimate_jobs,
    model_sizes,
    plan_jobs,
    plan_units,
)
from istar.pipeline.bundle_run import BUNDLE_FORMAT, DONE_FILE, JOBS_FILE, REPO
from istar.pipeline.plan import prepare_data_spec

__all__ = ["build_bundle", "DEVICE_LIMIT", "save_float16_copy", "travelling_bytes"]

DEVICE_LIMIT = 64 * 2**20  # what a device call carries: the working tree, shared/ and the carried paths
CONFIG_NAME = "config.yaml"
FLOAT16_MAX = 65504.0


# ------------------------------------------------------------------------------------------ the model copy


def save_float16_copy(source: str, out: Path) -> dict:
    """The model ``source`` (a folder or package with safetensors weights) saved to ``out`` in float16,
    with its config, tokenizer and digests.json. Returns what the rounding did: the largest relative
    error of a tensor and how many nonzero values became zero; raises ValueError for a value beyond
    float16's range, or a folder without safetensors weights."""
    import torch
    from safetensors.torch import load_file, save_file

    from istar.io.artifacts import record_digests
    from istar.models.loading import load_tokenizer, resolve_model_source

    folder = Path(resolve_model_source(source))
    if not folder.is_dir():
        raise ValueError(f"model {source}: a bundle copies a local folder or package; download the hub model "
                         "(save_pretrained) and name its folder in the config")
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise ValueError(f"model {source}: {folder} has no *.safetensors weights to store in float16")
    out.mkdir(parents=True, exist_ok=True)
    worst, flushed = 0.0, 0
    for path in weights:
        half = {}
        for name, tensor in load_file(str(path)).items():
            if not tensor.is_floating_point():
                half[name] = tensor
                continue
            top = float(tensor.abs().max()) if tensor.numel() else 0.0
            if top > FLOAT16_MAX:
                raise ValueError(f"model {source}: {name} holds {top:.4g}, beyond float16's range (±65504); this "
                                 "model cannot be bundled in float16")
            half[name] = tensor.to(torch.float16)
            back = half[name].to(tensor.dtype)
            flushed += int(((back == 0) & (tensor != 0)).sum())
            if top > 0:
                worst = max(worst, float(((back - tensor).abs() / tensor.abs().clamp_min(2.0 ** -14)).max()))
        save_file(half, str(out / path.name), metadata={"format": "pt"})
    for name in ("config.json", "model.safetensors.index.json"):
        if (folder / name).is_file():
            shutil.copy2(folder / name, out / name)
    load_tokenizer(str(folder)).save_pretrained(out)
    record_digests(out)
    return {"max_relative_error": worst, "flushed_to_zero": flushed, "from": str(folder)}


# ------------------------------------------------------------------------------------------ size


def travelling_bytes(root: Path, exclude: Path) -> int:
    """Bytes of the working tree a device call copies: tracked files and untracked ones git does
    not ignore (as ``git ls-files`` lists them), and a ``shared/`` folder; ``exclude`` (the bundle) left out."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    exclude = exclude.resolve()
    paths = {root / name for name in listed if name}
    if (root / "shared").is_dir():
        paths |= {p for p in (root / "shared").rglob("*") if p.is_file()}
    return sum(p.stat().st_size for p in paths
               if p.is_file() and not p.is_symlink() and exclude not in p.resolve().parents)


# ------------------------------------------------------------------------------------------ build


def build_bundle(configfiles, out, *, mirror=None, with_data=()) -> dict:
    """Build the bundle of a confirmatory config in ``out`` (replacing an earlier bundle there); returns the plan.

    ``mirror`` replaces ``data.mirror`` (a GLUE-layout folder here; it is not part of the bundle).
    ``with_data``: more tasks to prepare into the bundle, that no job reads (``rte`` for
    ``python -m bench.gpu_check --rte-data BUNDLE/resources/data/rte``). Raises ConfigError for a
    config that needs a search, ValueError when the model or the size does not fit.
    """
    import yaml

    from istar.data.prepare import prepare_from_spec
    from istar.io import artifacts
    from istar.io.provenance import git_provenance, package_sha256
    from istar.pipeline.validate import merge_config_files, validate_config

    merged = merge_config_files(configfiles)
    if mirror is not None:
        merged.setdefault("data", {})["mirror"] = str(mirror)
    config = validate_config(merged)
    if (problem := confirmatory_problem(config)) is not None:
        raise ConfigError(problem)
    out = Path(out)
    if out.exists() and not (out / JOBS_FILE).is_file():
        raise ValueError(f"{out} exists and is not a bundle: name a new folder (or remove it)")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)

    models, rounding = {}, {}
    for model, source in config["models"].items():
        folder = staging / "models" / model
        rounding[model] = save_float16_copy(source, folder)
        pin = {"source": source, "kind": "local", "hub_id": None, "revision": None, "commit": None,
               "pinned": f"./models/{model}", "stored_as": "float16 safetensors (loaded as float32)"}
        artifacts.write_text(staging / MODEL_PIN.format(model=model), json.dumps(pin, indent=2) + "\n")
        models[model] = model_sizes(folder)
    data = {}
    extra = [task for task in dict.fromkeys(with_data) if task not in config["tasks"]]
    for task in [*config["tasks"], *extra]:
        spec = prepare_data_spec(config, task=task, out=str(staging / DATA.format(task=task)))
        prepare_from_spec(spec)  # as the workflow's prepare_data rule does
        if task in extra:
            continue
        first_model = staging / "models" / next(iter(config["models"]))
        data[task] = data_sizes(Path(spec.out), first_model, config["training"])

    jobs, aggregate = plan_jobs(config, {model: sizes["layers"] for model, sizes in models.items()})
    estimate_jobs(jobs, config, models, data)
    units = plan_units(jobs)
    for unit in units:
        unit["estimate_s"] = round(sum(jobs[index]["estimate_s"] for index in unit["jobs"]), 1)

    plan = {
        "format": BUNDLE_FORMAT,
        "threads": config["training"]["threads"],
        "inputs": [DATA.format(task=task) for task in config["tasks"]]
                  + [p for model in config["models"] for p in (MODEL_PIN.format(model=model), f"models/{model}")],
        "extra_data": [DATA.format(task=task) for task in extra],
        "jobs": jobs, "units": units, "aggregate": aggregate,
        "data": {task: json.loads((staging / DATA.format(task=task) / "meta.json").read_text())["split_sha256"]
                 for task in config["tasks"]},
        "models": {model: {"digests_sha256": artifacts.file_digest(staging / "models" / model / artifacts.DIGESTS),
                           "float16": rounding[model]} for model in config["models"]},
        "estimate": {"costs": "H100, istar.pipeline.bundle_plan.DeviceCosts", "data": data,
                     "total_s": round(sum(job["estimate_s"] for job in jobs), 1)},
        "code_sha256": package_sha256(), "git": git_provenance(REPO), "configfiles": [str(p) for p in configfiles],
    }
    plan["bundle_id"] = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()[:16]
    artifacts.write_text(staging / JOBS_FILE, json.dumps(plan, indent=1, ensure_ascii=False) + "\n")
    artifacts.write_text(staging / CONFIG_NAME, yaml.safe_dump(config, sort_keys=False))

    bundle_bytes = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file() and not p.is_symlink())
    tree = travelling_bytes(REPO, out)
    plan["size"] = {"bundle_bytes": bundle_bytes, "tree_bytes": tree, "limit_bytes": DEVICE_LIMIT}
    artifacts.write_text(staging / JOBS_FILE, json.dumps(plan, indent=1, ensure_ascii=False) + "\n")
    if bundle_bytes + tree > DEVICE_LIMIT:
        shutil.rmtree(staging)
        raise ValueError(f"the bundle ({bundle_bytes / 2**20:.1f} MiB) and the working tree that travels with it "
                         f"({tree / 2**20:.1f} MiB) come to {(bundle_bytes + tree) / 2**20:.1f} MiB, over the "
                         f"{DEVICE_LIMIT / 2**20:.0f} MiB a device call carries: subsample the training data "
                         "(data.max_train_samples), bundle fewer tasks, or remove large untracked files")
    done = out / DONE_FILE  # units brought back stay brought back when the same bundle is built again
    if done.is_file() and json.loads(done.read_text(encoding="utf-8")).get("bundle_id") == plan["bundle_id"]:
        shutil.copy2(done, staging / DONE_FILE)
    artifacts.replace_directory(staging, out)
    return plan


def describe(plan: dict, out: Path) -> str:
    """The units with their estimates, the total and the size, as ``istar bundle`` prints them."""
    lines = [f"{'unit':>4}  {'jobs':>4}  {'estimate (s)':>12}  name"]
    for number, unit in enumerate(plan["units"]):
        lines.append(f"{number:>4}  {len(unit['jobs']):>4}  {unit['estimate_s']:>12.0f}  {unit['name']}")
    sigma = sum(job["estimate_s"] for job in plan["jobs"] if job["step"][0] == "shrinkage")
    size = plan["size"]
    lines += [f"Σ_S jobs (run before the first unit that needs them, on each machine): {sigma:.0f} s",
              f"estimated total on one H100: {plan['estimate']['total_s'] / 60:.1f} min",
              f"bundle {size['bundle_bytes'] / 2**20:.1f} MiB + working tree {size['tree_bytes'] / 2**20:.1f} MiB = "
              f"{(size['bundle_bytes'] + size['tree_bytes']) / 2**20:.1f} MiB of {size['limit_bytes'] / 2**20:.0f} MiB "
              f"-> {out} (id {plan['bundle_id']})"]
    return "\n".join(lines)


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", dest="configfiles", nargs="+", required=True, type=Path,
                        help="config file(s), merged in order as snakemake --configfile merges them")
    parser.add_argument("--out", required=True, type=Path, help="the bundle folder to write (replaced if it is one)")
    parser.add_argument("--mirror", type=Path, default=None,
                        help="the GLUE-layout folder to read the data from (replaces data.mirror)")
    parser.add_argument("--with-data", nargs="+", default=[], metavar="TASK",
                        help="also prepare these tasks, which no job reads (rte: for bench/gpu_check.py)")


def run_cli(args) -> int:
    plan = build_bundle(args.configfiles, args.out, mirror=args.mirror, with_data=args.with_data)
    print(describe(plan, args.out))
    return 0

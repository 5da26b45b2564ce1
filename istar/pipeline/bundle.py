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

The plan is the workflow's own: for a config whose I-STAR λ | ζ is fixed in advance for every
model × task (``final.istar``, the confirmatory protocol) no job waits for a search, so every
job is known here. Each job is the one its rule would run — ``select --fixed``, ``shrinkage``,
``train`` and ``measure``, with the spec :mod:`istar.pipeline.plan` builds for that rule, the
GPUs and log file of the rule — and carries the files it reads and writes, the files the
archive brings back (``keep``) and its estimated seconds on an H100 (:class:`DeviceCosts`).
Jobs are grouped into *units* (:func:`plan_units`); the aggregate's inputs, the tables and the
figures the config asks for are listed for ``istar import-bundle``. A config that still
searches, or whose padding study tunes its own variant, is refused with the key to set.

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
import math
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from istar.config.layout import (
    DATA,
    DEFAULT_TOKENS,
    MEASURES,
    MODEL_PIN,
    RUN,
    SELECTION,
    Setting,
    seeds_token,
    sigma_template,
)
from istar.config.schema import STUDIES, ConfigError
from istar.core.tokens import TOKEN_SELECTION_NAMES, get_token_selection
from istar.registry.analysis import get_sigma_source
from istar.registry.methods import get_method
from istar.pipeline.bundle_run import BUNDLE_FORMAT, DONE_FILE, JOBS_FILE, REPO, code_digest
from istar.pipeline.plan import (
    final_settings,
    fixed_choice_args,
    fixed_setting,
    measure_spec,
    needs_sigma,
    prepare_data_spec,
    shrinkage_spec,
    study_runs,
    study_scope,
    study_seeds,
    train_spec,
    tuned_tokens,
)

__all__ = ["build_bundle", "plan_jobs", "plan_units", "confirmatory_problem", "planned_runs", "DeviceCosts",
           "DEVICE_LIMIT", "save_float16_copy", "travelling_bytes"]

DEVICE_LIMIT = 64 * 2**20  # what a device call carries: the working tree, shared/ and the carried paths
CONFIG_NAME = "config.yaml"
FLOAT16_MAX = 65504.0


# ------------------------------------------------------------------------------------------ planning


def confirmatory_problem(config: dict) -> str | None:
    """Why the validated config cannot be planned without a search (None when it can)."""
    for model in config["models"]:
        for task in config["tasks"]:
            if fixed_setting(config, model, task) is None:
                return (f"config key 'final.istar': {model} × {task} has no λ | ζ fixed in advance, so its I-STAR "
                        "setting would come from a search chosen on the device (a checkpoint this bundle cannot "
                        f"plan); add final.istar.{model}.{task}: {{lam: …, zeta: …}} (the confirmatory protocol)")
    padding = config["studies"]["padding"]
    if padding["enabled"] and tuned_tokens(config):
        return ("config key 'studies.padding.lam': tuned runs the padding study's own search first, which this "
                "bundle cannot plan; set lam and zeta to selected (the fixed λ | ζ) or to numbers")
    if config["survey"]["enabled"]:
        return "config key 'survey.enabled': the isotropy survey is not part of a bundle; set it to false"
    if config["data"]["source"] == "hub":
        return ("config key 'data.source': hub; a bundle carries its data from files: set data.source: mirror and "
                "give the mirror (the GLUE release layout) with data.mirror or --mirror")
    return None


def planned_runs(config: dict, model: str, task: str, depth: int) -> list[tuple[str, Setting, int]]:
    """(study, setting, seed) of the final stage and the figure studies of a model × task whose λ | ζ
    is fixed in advance: what the workflow's ``planned_runs`` gives once nothing waits for a checkpoint
    (``depth``: the model's L, for the one-layer study over every layer)."""
    chosen = fixed_setting(config, model, task)
    runs = [("final", setting, seed) for setting in final_settings(config, chosen, {})
            for seed in study_seeds(config, "final", task)]
    for study in STUDIES:
        found = study_runs(config, study, model, task, chosen, depth, None)
        runs += [(study, setting, seed) for setting, seed in found]
    return runs


def _job(rule: str, model: str, task: str, label: str, step: list[str], *, launch: bool, gpus: int,
         outputs: list[str], keep: list[str], needs: list[str], log: str) -> dict:
    return {"rule": rule, "model": model, "task": task, "label": label, "step": step, "launch": launch, "gpus": gpus,
            "outputs": outputs, "keep": keep, "needs": needs, "log": log, "estimate_s": 0.0}


def _shrinkage_rule(tokens: str) -> str:
    """The workflow's rule for Σ_S over ``tokens``: shrinkage (real tokens) or shrinkage_all_positions."""
    return "shrinkage" if tokens == DEFAULT_TOKENS else f"shrinkage_{tokens}"


def plan_jobs(config: dict, depths: dict[str, int]) -> tuple[list[dict], dict]:
    """Every job from Σ_S to the measurements, as the workflow's rules would run them, and the
    aggregate's inputs: ``(jobs, aggregate)`` with ``aggregate`` = {runs: [[study, run folder]],
    selections, measures} in the order the aggregate rule passes them."""
    problem = confirmatory_problem(config)
    if problem is not None:
        raise ConfigError(problem)
    gpus = config["training"]["gpus"]
    step_gpus = min(gpus, 1)  # the Σ_S and measure rules take one GPU at most
    selects, sigmas, trains, measures = [], [], [], []
    aggregate = {"runs": [], "selections": [], "measures": set()}
    for model in config["models"]:
        pin = MODEL_PIN.format(model=model)
        for task in config["tasks"]:
            data = DATA.format(task=task)
            selection = SELECTION.format(model=model, task=task)
            aggregate["selections"].append(selection)
            selects.append(_job("select", model, task, f"{model}/{task}", [
                "select", "--out", selection, "--fixed", json.dumps(fixed_choice_args(config, model, task))],
                launch=False, gpus=0, outputs=[selection], keep=[selection], needs=[], log=f"logs/select/{model}/{task}.log"))
            runs = planned_runs(config, model, task, depths[model])
            aggregate["runs"] += [[study, RUN.format(model=model, task=task, setting=setting.name, seed=seed)]
                                  for study, setting, seed in runs]
            # Σ_S of each token selection a penalty reads, and of the real tokens the measurements read
            wanted = {setting.tokens for _, setting, _ in runs if needs_sigma(setting)} | {DEFAULT_TOKENS}
            for tokens in (key for key in TOKEN_SELECTION_NAMES if key in wanted):
                sigma = sigma_template(tokens).format(model=model, task=task)
                spec = shrinkage_spec(config, model=pin, task=task, data_dir=data, out=sigma, tokens=tokens)
                provenance = sigma.replace(".pt", ".json")
                sigmas.append(_job(_shrinkage_rule(tokens), model, task, f"{model}/{task} ({tokens})",
                                   ["shrinkage", "--spec", spec.to_json()], launch=True, gpus=step_gpus,
                                   outputs=[sigma, provenance], keep=[provenance], needs=[],
                                   log=f"logs/shrinkage/{model}/{task}{get_token_selection(tokens).suffix}.log"))
            seen = set()
            for _, setting, seed in runs:
                if (setting, seed) in seen:
                    continue
                seen.add((setting, seed))
                run = RUN.format(model=model, task=task, setting=setting.name, seed=seed)
                sigma = sigma_template(setting.tokens).format(model=model, task=task)
                spec = train_spec(config, model=pin, task=task, setting=setting, seed=seed, data_dir=data,
                                  output_dir=run, sigma_s=sigma)
                trains.append(_job("train", model, task, f"{model}/{task}/{setting.name}/seed{seed}",
                                   ["train", "--spec", spec.to_json()], launch=True, gpus=gpus, outputs=[f"{run}/metrics.json", f"{run}/model"],
                                   keep=[f"{run}/metrics.json", f"{run}/run_config.json", f"{run}/train_log.csv"],
                                   needs=[sigma] if needs_sigma(setting) else [],
                                   log=f"logs/finetune/{model}/{task}/{setting.name}/seed{seed}.log"))
            measured = set()
            for study, setting, _ in runs:
                seeds = study_seeds(config, study, task)
                out = MEASURES.format(model=model, task=task, setting=setting.name, seeds=seeds_token(seeds))
                if out in measured:
                    continue
                measured.add(out)
                folders = [RUN.format(model=model, task=task, setting=setting.name, seed=seed) for seed in seeds]
                sigma = sigma_template(DEFAULT_TOKENS).format(model=model, task=task)
                spec = measure_spec(config, runs=folders, task=task, data_dir=data, sigma_s=sigma, out=out)
                measures.append(_job("measure", model, task, f"{model}/{task}/{setting.name}/seeds{seeds_token(seeds)}",
                                     ["measure", "--spec", spec.to_json()], launch=True, gpus=step_gpus,
                                     outputs=[out], keep=[out], needs=[f"{run}/model" for run in folders] + [sigma],
                                     log=f"logs/measure/{model}/{task}/{setting.name}/seeds{seeds_token(seeds)}.log"))
            aggregate["measures"] |= measured
    aggregate["measures"] = sorted(aggregate["measures"])
    return selects + sigmas + trains + measures, aggregate


def plan_units(jobs: list[dict]) -> list[dict]:
    """The jobs grouped into units, each run on one machine: one per ``select`` job, and for the
    rest the measurement jobs with the fine-tuning runs whose models they read (joined where two
    measurements share a run, e.g. the final stage's and a study's seeds of one setting). Σ_S
    jobs belong to no unit: the runner runs one before the first unit that needs it."""
    producer = {output: index for index, job in enumerate(jobs) for output in job["outputs"]}
    units = [{"name": f"select {job['label']}", "jobs": [index]} for index, job in enumerate(jobs) if job["rule"] == "select"]
    groups: list[tuple[set, list[int]]] = []  # (train jobs, measure jobs)
    for index, job in enumerate(jobs):
        if job["rule"] != "measure":
            continue
        runs = {producer[path] for path in job["needs"] if jobs[producer[path]]["rule"] == "train"}
        joined = [group for group in groups if group[0] & runs]
        for group in joined:
            groups.remove(group)
            runs |= group[0]
        groups.append((runs, sorted([index] + [m for group in joined for m in group[1]])))
    for runs, measurements in sorted(groups, key=lambda group: min(group[0] | set(group[1]))):
        units.append({"name": " + ".join(jobs[m]["label"] for m in measurements), "jobs": sorted(runs) + measurements})
    unplanned = {i for i, job in enumerate(jobs) if job["rule"] == "train"} - {i for u in units for i in u["jobs"]}
    if unplanned:
        raise ValueError(f"no measurement reads run {jobs[min(unplanned)]['label']}: the plan is inconsistent")
    return units


# ------------------------------------------------------------------------------------------ estimates


@dataclass(frozen=True)
class DeviceCosts:
    """Seconds on one H100 for a small encoder in fp16 autocast, estimated before any GPU ran this
    code (docs/gpu-bundle.md, "How the time was estimated"); the runner rescales them with the
    time the units actually take.

    A MiniLM-sized step is bound by the host, not by arithmetic: one training step of MiniLM-L6
    (batch 32, foreach AdamW) dispatches 1,476 aten calls (1,557 with the I-STAR penalty over every
    position), a forward pass 292 (counted on the CPU with a TorchDispatchMode), each about
    ``call_s`` of host time in eager PyTorch with autocast, the gradient scaler and accelerate's
    wrappers; the arithmetic, 6 × parameters × tokens, runs at ``flops_per_s``: the CPU step of
    bench/RESULTS.md (2.79 s for a 32 × 128 batch, 2.8e11 FLOP: 0.1 TFLOP/s on 2 cores) is about
    1,000 × slower than that, so on the GPU the arithmetic is ~1 ms of a ~15 ms step. Calls are per
    encoder layer (the counts over 6 layers) and scale with depth.
    """

    job_start_s: float = 12.0  # three interpreters (istar launch, accelerate's launcher, the step), CUDA context, model load
    call_s: float = 10e-6
    train_calls_per_layer: float = 1476 / 6
    penalty_calls_per_layer: float = (1557 - 1476) / 6
    forward_calls_per_layer: float = 292 / 6 + 10  # + the per-layer Σ_S / activation sums of a measuring pass
    flops_per_s: float = 100e12
    write_bytes_per_s: float = 500e6  # model files and resumable states on the machine's disk
    select_s: float = 3.0
    analysis_s: float = 2.0  # IsoScore*, TwoNN per layer of one measured run (CPU)

    def step_s(self, layers: int, parameters: float, tokens: float, penalised: bool) -> float:
        calls = layers * (self.train_calls_per_layer + (self.penalty_calls_per_layer if penalised else 0.0))
        return calls * self.call_s + 6 * parameters * tokens / self.flops_per_s

    def forward_s(self, layers: int, parameters: float, tokens: float) -> float:
        return layers * self.forward_calls_per_layer * self.call_s + 2 * parameters * tokens / self.flops_per_s


def _model_sizes(folder: Path) -> dict:
    """Layers, non-embedding and total parameter counts (for the estimates) from a BERT-style config.json."""
    settings = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    layers = next(settings[k] for k in ("num_hidden_layers", "n_layers", "num_layers") if k in settings)
    hidden = settings.get("hidden_size") or settings.get("dim")
    ffn = settings.get("intermediate_size") or settings.get("hidden_dim") or 4 * hidden
    body = layers * (4 * hidden * hidden + 2 * hidden * ffn)
    return {"layers": layers, "parameters": body, "total": body + (settings.get("vocab_size", 0) + 512) * hidden}


def _data_sizes(data_dir: Path, model_dir: Path, max_length: int, doc_stride: int, batch: int, eval_batch: int,
                pad_multiple: int | None) -> dict:
    """Token counts of a prepared task as the steps tokenise it: features, mean real tokens per
    feature, mean padded positions of a training batch (batches in a seeded random order)."""
    import numpy as np

    from istar.data.encoding import encode_split
    from istar.data.storage import read_columns, read_meta
    from istar.models.loading import load_tokenizer
    from istar.registry.tasks import get_task

    task = get_task(read_meta(data_dir)["task"])
    tokenizer = load_tokenizer(str(model_dir))
    sizes = {}
    for split, size in (("train", batch), ("validation", eval_batch)):
        features = encode_split(read_columns(data_dir, split), task, tokenizer, max_length, doc_stride,
                                with_labels=False)
        lengths = np.array([len(ids) for ids in features.columns["input_ids"]])
        order = np.random.default_rng(0).permutation(len(lengths))
        padded = [lengths[order[i:i + size]].max() for i in range(0, len(lengths), size)]
        if pad_multiple:
            padded = [math.ceil(p / pad_multiple) * pad_multiple for p in padded]
        sizes[split] = {"features": int(len(lengths)), "mean_tokens": float(lengths.mean()),
                        "mean_padded": float(np.mean(padded))}
    return sizes


def estimate_jobs(jobs: list[dict], config: dict, models: dict[str, dict], data: dict[str, dict],
                  costs: DeviceCosts = DeviceCosts()) -> None:
    """Fill each job's ``estimate_s`` (seconds on an H100, :class:`DeviceCosts`)."""
    training, rows = config["training"], config["shrinkage"]["rows"]

    def sigma_pass(model: dict, sizes: dict, tokens: str) -> float:
        """One Σ_S pass: ``rows`` token rows of the training split (all of it if it has fewer)."""
        uses_training = get_token_selection(tokens).sigma_uses_training_batches
        batch = training["batch_size"] if uses_training else training["eval_batch_size"]
        width = sizes["train"]["mean_padded"] if uses_training else sizes["train"]["mean_tokens"]
        batches = min(math.ceil(sizes["train"]["features"] / batch), math.ceil(rows / (batch * width)))
        return batches * costs.forward_s(model["layers"], model["parameters"], batch * sizes["train"]["mean_padded"])

    def evaluation(model: dict, sizes: dict) -> float:
        batches = math.ceil(sizes["validation"]["features"] / training["eval_batch_size"])
        return batches * costs.forward_s(model["layers"], model["parameters"],
                                         training["eval_batch_size"] * sizes["validation"]["mean_padded"])

    for job in jobs:
        model, sizes = models[job["model"]], data[job["task"]]
        spec = json.loads(job["step"][-1]) if job["launch"] else {}
        if job["rule"] == "select":
            seconds = costs.select_s
        elif job["rule"] == "train":
            micro = math.ceil(sizes["train"]["features"] / spec["batch_size"]) * spec["epochs"]
            step = costs.step_s(model["layers"], model["parameters"], spec["batch_size"] * sizes["train"]["mean_padded"],
                                penalised=get_method(spec["method"]).penalty is not None)
            # a Σ_S pass after each epoch, and before training unless the run was given one
            passes = spec["epochs"] + (0 if spec["sigma_s"] else 1)
            saves = (spec["epochs"] * 3 + 1) * 4 * model["total"] / costs.write_bytes_per_s  # states (weights + Adam), model
            seconds = (costs.job_start_s + micro * step + passes * sigma_pass(model, sizes, spec["tokens"])
                       + spec["epochs"] * evaluation(model, sizes) + saves)
        elif job["rule"] == "measure":
            per_run = 2 * evaluation(model, sizes) + costs.analysis_s + 4 * model["total"] / costs.write_bytes_per_s
            if not get_sigma_source(spec["sigma_s_model"]).reads_file:  # each run's own Σ_S (analysis.sigma_s_model)
                per_run += sigma_pass(model, sizes, DEFAULT_TOKENS)
            seconds = costs.job_start_s + len(spec["runs"]) * per_run
        else:  # Σ_S of the pretrained model
            seconds = costs.job_start_s + sigma_pass(model, sizes, spec["tokens"])
        job["estimate_s"] = round(seconds, 1)


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
        tensors = load_file(str(path))
        half = {}
        for name, tensor in tensors.items():
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


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


# ------------------------------------------------------------------------------------------ build


def build_bundle(configfiles, out, *, mirror=None, with_data=(), costs: DeviceCosts = DeviceCosts(),
                 limit: int = DEVICE_LIMIT) -> dict:
    """Build the bundle of a confirmatory config in ``out`` (replacing an earlier bundle there); returns the plan.

    ``mirror`` replaces ``data.mirror`` (a GLUE-layout folder here; it is not part of the bundle).
    ``with_data``: more tasks to prepare into the bundle, that no job reads (``rte`` for
    ``python -m bench.gpu_check --rte-data BUNDLE/resources/data/rte``). Raises ConfigError for a
    config that needs a search, ValueError when the model or the size does not fit.
    """
    import yaml

    from istar.data import prepare_task
    from istar.io import artifacts
    from istar.io.provenance import git_provenance
    from istar.pipeline.validate import merge_config_files, model_depth, validate_config
    from istar.registry.precisions import PRECISIONS

    merged = merge_config_files(configfiles)
    if mirror is not None:
        merged.setdefault("data", {})["mirror"] = str(mirror)
    config = validate_config(merged)
    problem = confirmatory_problem(config)
    if problem is not None:
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
        models[model] = {**_model_sizes(folder), "depth": model_depth(folder)}
    training = config["training"]
    data = {}
    extra = [task for task in dict.fromkeys(with_data) if task not in config["tasks"]]
    for task in [*config["tasks"], *extra]:
        spec = prepare_data_spec(config, task=task, out=str(staging / DATA.format(task=task)))
        prepare_task(spec.task, spec.out, source=spec.source, mirror=spec.mirror, allow_standin=spec.allow_standin,
                     max_train_samples=spec.max_train_samples, max_eval_samples=spec.max_eval_samples, seed=spec.seed,
                     standin_fraction=spec.standin_fraction, revision=spec.revision, subset=spec.subset)
        if task in extra:
            continue
        first = staging / "models" / next(iter(config["models"]))
        pad = 8 if PRECISIONS[training["mixed_precision"]].key != "no" else None
        data[task] = _data_sizes(Path(spec.out), first, training["max_length"], training["doc_stride"],
                                 training["batch_size"], training["eval_batch_size"], pad)

    jobs, aggregate = plan_jobs(config, {model: sizes["depth"] for model, sizes in models.items()})
    estimate_jobs(jobs, config, models, data, costs)
    units = plan_units(jobs)
    for unit in units:
        unit["estimate_s"] = round(sum(jobs[index]["estimate_s"] for index in unit["jobs"]), 1)
    from istar.report.figures import enabled_figures
    from istar.report.table_specs import enabled_tables

    plan = {
        "format": BUNDLE_FORMAT,
        "precision": training["mixed_precision"], "threads": training["threads"],
        "inputs": [DATA.format(task=task) for task in config["tasks"]]
                  + [p for model in config["models"] for p in (MODEL_PIN.format(model=model), f"models/{model}")],
        "extra_data": [DATA.format(task=task) for task in extra],
        "jobs": jobs, "units": units, "aggregate": aggregate,
        "tables": enabled_tables(config), "figures": enabled_figures(config),
        "stability": config["studies"]["stability"]["repeats"] if config["studies"]["stability"]["enabled"] else None,
        "analysis_zeta": config["analysis"]["zeta"],
        "data": {task: json.loads((staging / DATA.format(task=task) / "meta.json").read_text())["split_sha256"]
                 for task in config["tasks"]},
        "models": {model: {"digests_sha256": artifacts.file_digest(staging / "models" / model / artifacts.DIGESTS),
                           "float16": rounding[model]} for model in config["models"]},
        "estimate": {"costs": "H100, istar.pipeline.bundle.DeviceCosts", "data": data,
                     "total_s": round(sum(job["estimate_s"] for job in jobs), 1)},
        "code_sha256": code_digest(), "git": git_provenance(REPO), "configfiles": [str(p) for p in configfiles],
    }
    plan["bundle_id"] = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()[:16]
    artifacts.write_text(staging / JOBS_FILE, json.dumps(plan, indent=1, ensure_ascii=False) + "\n")
    artifacts.write_text(staging / CONFIG_NAME, yaml.safe_dump(config, sort_keys=False))

    bundle_bytes = _folder_bytes(staging)
    tree = travelling_bytes(REPO, out)
    plan["size"] = {"bundle_bytes": bundle_bytes, "tree_bytes": tree, "limit_bytes": limit}
    artifacts.write_text(staging / JOBS_FILE, json.dumps(plan, indent=1, ensure_ascii=False) + "\n")
    if bundle_bytes + tree > limit:
        shutil.rmtree(staging)
        raise ValueError(f"the bundle ({bundle_bytes / 2**20:.1f} MiB) and the working tree that travels with it "
                         f"({tree / 2**20:.1f} MiB) come to {(bundle_bytes + tree) / 2**20:.1f} MiB, over the "
                         f"{limit / 2**20:.0f} MiB a device call carries: subsample the training data "
                         "(data.max_train_samples), bundle fewer tasks, or remove large untracked files")
    done = out / DONE_FILE  # units brought back stay brought back when the same bundle is built again
    if done.is_file() and json.loads(done.read_text(encoding="utf-8")).get("bundle_id") == plan["bundle_id"]:
        shutil.copy2(done, staging / DONE_FILE)
    shutil.rmtree(out, ignore_errors=True)
    staging.replace(out)
    return plan


def describe(plan: dict, out: Path) -> str:
    """The units with their estimates, the total and the size, as ``istar bundle`` prints them."""
    lines = [f"{'unit':>4}  {'jobs':>4}  {'estimate (s)':>12}  name"]
    for number, unit in enumerate(plan["units"]):
        lines.append(f"{number:>4}  {len(unit['jobs']):>4}  {unit['estimate_s']:>12.0f}  {unit['name']}")
    sigma = sum(job["estimate_s"] for job in plan["jobs"] if job["rule"].startswith("shrinkage"))
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

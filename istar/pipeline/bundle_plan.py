"""The plan of a study bundle: the jobs, their units and their estimated time (docs/gpu-bundle.md).

The plan is the workflow's own: for a config whose I-STAR λ | ζ is fixed in advance for every
model × task (``final.istar``, the confirmatory protocol) no job waits for a search, so every
job is known before the bundle leaves (:func:`confirmatory_problem` says which key to set when
it is not). Each job is the one its rule would run — ``select --fixed``, ``shrinkage``,
``train`` and ``measure``, with the spec :mod:`istar.pipeline.plan` builds for that rule, the
GPUs and log file of the rule — and carries the files it reads and writes, the files the
archive brings back (``keep``) and its estimated seconds on an H100 (:class:`DeviceCosts`,
:func:`estimate_jobs`). Jobs are grouped into *units* (:func:`plan_units`); the aggregate's
inputs are listed for ``istar import-bundle``. :mod:`istar.pipeline.bundle` writes the plan
into the bundle, with the data and the model it reads.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from istar.config.layout import DEFAULT_TOKENS
from istar.config.schema import ConfigError
from istar.core.tokens import get_token_selection
from istar.pipeline.jobs import Decided, plan_cell
from istar.pipeline.plan import fixed_setting, replaces_collapsed, tuned_tokens
from istar.registry.analysis import get_sigma_source
from istar.registry.methods import get_method

__all__ = ["confirmatory_problem", "plan_jobs", "plan_units", "DeviceCosts", "model_sizes",
           "model_sizes_of", "data_sizes", "fine_tune_s", "estimate_jobs"]


# ------------------------------------------------------------------------------------------ planning


def confirmatory_problem(config: dict) -> str | None:
    """Why the validated config cannot be planned without a search (None when it can)."""
    for model in config["models"]:
        for task in config["tasks"]:
            if fixed_setting(config, model, task) is None:
                return (f"config key 'final.istar': {model} × {task} has no λ | ζ fixed in advance, so its I-STAR "
                        "setting would come from a search chosen on the device (a checkpoint this bundle cannot "
                        f"plan); add final.istar.{model}.{task}: {{lam: …, zeta: …}} (the confirmatory protocol)")
    if replaces_collapsed(config):
        return ("config key 'inference.collapsed_runs': rerun trains replacement seeds chosen on the device after the "
                "final runs (a checkpoint this bundle cannot plan); declare keep or exclude, or run the workflow")
    if config["search"]["tune_baselines"]:
        return ("config key 'search.tune_baselines': the baselines' training values would come from a search chosen "
                "on the device (a checkpoint this bundle cannot plan); set it to false, or run the workflow")
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


# what the archive brings back of each step's outputs: a run's records (not its model), the Σ_S provenance
KEEP = {
    "select": lambda job: list(job.outputs),
    "shrinkage": lambda job: [job.outputs[1]],
    "train": lambda job: [f"{folder}/{name}" for folder in [job.outputs[0].removesuffix("/metrics.json")]
                          for name in ("metrics.json", "run_config.json", "train_log.csv")],
    "measure": lambda job: list(job.outputs),
}


def plan_jobs(config: dict, depths: dict[str, int]) -> tuple[list[dict], dict]:
    """Every job from Σ_S to the measurements — the workflow's own (:func:`istar.pipeline.jobs.plan_cell`,
    with the λ | ζ fixed in advance and ``depths``, each model's L) — and the aggregate's inputs:
    ``(jobs, aggregate)`` with ``aggregate`` = {runs: [[study, run folder]], selections, measures} in
    the order the aggregate rule passes them."""
    if (problem := confirmatory_problem(config)) is not None:
        raise ConfigError(problem)
    order = ("select", "shrinkage", "train", "measure")
    jobs: dict[str, list[dict]] = {step: [] for step in order}
    aggregate = {"runs": [], "selections": [], "measures": set()}
    for model in config["models"]:
        for task in config["tasks"]:
            plan = plan_cell(config, model, task, Decided(selection=fixed_setting(config, model, task),
                                                          depth=depths[model]))
            aggregate["runs"] += [[study, run] for study, run in plan.runs]
            aggregate["measures"] |= set(plan.measures)
            needed = {path for job in plan.jobs for path in job.needs}
            for job in plan.jobs:
                if job.step == "shrinkage" and needed.isdisjoint(job.outputs):
                    continue  # a Σ_S no job of the bundle reads
                if job.step == "select":
                    aggregate["selections"].append(job.outputs[0])
                jobs[job.step].append({
                    "rule": job.rule, "model": model, "task": task, "label": job.label, "step": list(job.argv),
                    "launch": job.launched, "gpus": job.resources.gpus,
                    "outputs": list(job.outputs), "keep": KEEP[job.step](job), "needs": list(job.needs),
                    "log": job.log, "estimate_s": 0.0})
    aggregate["measures"] = sorted(aggregate["measures"])
    return [job for step in order for job in jobs[step]], aggregate


def plan_units(jobs: list[dict]) -> list[dict]:
    """The jobs grouped into units, each run on one machine: one per ``select`` job, and for the
    rest the measurement jobs with the fine-tuning runs whose models they read (joined where two
    measurements share a run, e.g. the final stage's and a study's seeds of one setting; every run of a
    bundle's plan is measured: a confirmatory config has no search or tuning runs). Σ_S jobs belong to
    no unit: the runner runs one before the first unit that needs it."""
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


def model_sizes(folder: Path) -> dict:
    """Layers, non-embedding and total parameter counts (for the estimates) from a BERT-style config.json."""
    return model_sizes_of(json.loads((folder / "config.json").read_text(encoding="utf-8")))


def model_sizes_of(settings: dict) -> dict:
    """:func:`model_sizes` of a config.json's content."""
    layers = next(settings[k] for k in ("num_hidden_layers", "n_layers", "num_layers") if k in settings)
    hidden = settings.get("hidden_size") or settings.get("dim")
    ffn = settings.get("intermediate_size") or settings.get("hidden_dim") or 4 * hidden
    body = layers * (4 * hidden * hidden + 2 * hidden * ffn)
    return {"layers": layers, "parameters": body, "total": body + (settings.get("vocab_size", 0) + 512) * hidden}


def data_sizes(data_dir: Path, model_dir: Path, training: dict) -> dict:
    """Token counts of a prepared task as the steps tokenise it with the config's ``training`` section:
    features, mean real tokens per feature, mean padded positions of a batch (batches in a seeded
    random order, padded to a multiple of 8 under mixed precision)."""
    import numpy as np

    from istar.data.encoding import encode_split
    from istar.data.storage import read_columns, read_meta
    from istar.models.loading import load_tokenizer
    from istar.registry.precisions import PRECISIONS
    from istar.registry.tasks import get_task

    task = get_task(read_meta(data_dir)["task"])
    tokenizer = load_tokenizer(str(model_dir))
    pad_multiple = 8 if PRECISIONS[training["mixed_precision"]].key != "no" else None
    sizes = {}
    for split, size in (("train", training["batch_size"]), ("validation", training["eval_batch_size"])):
        features = encode_split(read_columns(data_dir, split), task, tokenizer, training["max_length"],
                                training["doc_stride"], with_labels=False)
        lengths = np.array([len(ids) for ids in features.columns["input_ids"]])
        order = np.random.default_rng(0).permutation(len(lengths))
        padded = [lengths[order[i:i + size]].max() for i in range(0, len(lengths), size)]
        if pad_multiple:
            padded = [math.ceil(p / pad_multiple) * pad_multiple for p in padded]
        sizes[split] = {"features": int(len(lengths)), "mean_tokens": float(lengths.mean()),
                        "mean_padded": float(np.mean(padded))}
    return sizes


def _sigma_pass_s(config: dict, costs: DeviceCosts, model: dict, sizes: dict, tokens: str) -> float:
    """One Σ_S pass: ``shrinkage.rows`` token rows of the training split (all of it if it has fewer)."""
    uses_training = get_token_selection(tokens).sigma_uses_training_batches
    batch = config["training"]["batch_size" if uses_training else "eval_batch_size"]
    width = sizes["train"]["mean_padded" if uses_training else "mean_tokens"]
    batches = min(math.ceil(sizes["train"]["features"] / batch),
                  math.ceil(config["shrinkage"]["rows"] / (batch * width)))
    return batches * costs.forward_s(model["layers"], model["parameters"], batch * sizes["train"]["mean_padded"])


def _evaluation_s(config: dict, costs: DeviceCosts, model: dict, sizes: dict) -> float:
    """One pass over the validation split."""
    batch = config["training"]["eval_batch_size"]
    return math.ceil(sizes["validation"]["features"] / batch) * costs.forward_s(
        model["layers"], model["parameters"], batch * sizes["validation"]["mean_padded"])


def fine_tune_s(config: dict, costs: DeviceCosts, model: dict, sizes: dict, spec: dict) -> float:
    """Seconds of one fine-tune (its train spec ``spec``) alone on an H100: start, every micro-batch's step,
    a Σ_S pass after each epoch (and before training unless the run was given one), the evaluation after
    each epoch and the writes (a resumable state — weights and Adam's two moments — per epoch, and the model).

    ``model``: {layers, parameters, total} (:func:`model_sizes_of`); ``sizes``: {train, validation} token
    counts (:func:`data_sizes`)."""
    micro = math.ceil(sizes["train"]["features"] / spec["batch_size"]) * spec["epochs"]
    step = costs.step_s(model["layers"], model["parameters"], spec["batch_size"] * sizes["train"]["mean_padded"],
                        penalised=get_method(spec["method"]).penalises)
    passes = spec["epochs"] + (0 if spec["sigma_s"] else 1)
    saves = (spec["epochs"] * 3 + 1) * 4 * model["total"] / costs.write_bytes_per_s
    return (costs.job_start_s + micro * step + passes * _sigma_pass_s(config, costs, model, sizes, spec["tokens"])
            + spec["epochs"] * _evaluation_s(config, costs, model, sizes) + saves)


def _measure_s(config: dict, costs: DeviceCosts, model: dict, sizes: dict, spec: dict) -> float:
    """Each run evaluated twice, analysed and loaded, with its own Σ_S pass unless Σ_S is read from a file."""
    load_s = 4 * model["total"] / costs.write_bytes_per_s
    per_run = 2 * _evaluation_s(config, costs, model, sizes) + costs.analysis_s + load_s
    if not get_sigma_source(spec["sigma_s_model"]).reads_file:  # each run's own Σ_S (analysis.sigma_s_model)
        per_run += _sigma_pass_s(config, costs, model, sizes, DEFAULT_TOKENS)
    return costs.job_start_s + len(spec["runs"]) * per_run


# a job's seconds by its step (the first word of its command): (config, costs, model, sizes, spec) → seconds
STEP_SECONDS = {
    "select": lambda config, costs, model, sizes, spec: costs.select_s,
    "train": fine_tune_s,
    "measure": _measure_s,
    "shrinkage": lambda config, costs, model, sizes, spec: (
        costs.job_start_s + _sigma_pass_s(config, costs, model, sizes, spec["tokens"])),
}


def estimate_jobs(jobs: list[dict], config: dict, models: dict[str, dict], data: dict[str, dict]) -> None:
    """Fill each job's ``estimate_s`` (seconds on an H100, :class:`DeviceCosts`)."""
    for job in jobs:
        spec = json.loads(job["step"][-1]) if job["launch"] else {}
        seconds = STEP_SECONDS[job["step"][0]](config, DeviceCosts(), models[job["model"]], data[job["task"]], spec)
        job["estimate_s"] = round(seconds, 1)

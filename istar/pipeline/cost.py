"""What a config costs on GPUs before it runs: ``istar cost --config FILE --gpus N --kind h100``.

Every fine-tune the config asks for (the search, the final runs and the figure studies, counted as
:mod:`istar.pipeline.plan` plans them, with any setting standing in for the search's choice) gets
the bundle's estimate of its time alone on a GPU (:class:`istar.pipeline.bundle_plan.DeviceCosts`;
every sequence padded to the task's ``max_length``, so the arithmetic is an upper bound), and the
rates measured on the named kind of GPU turn the sum into GPU-hours (``device_rates.json``, rebuilt
from the GPU records by ``python -m bench.device_rates``):

- *one job per GPU*: the estimate × ``step_factor`` (a step alone on that GPU over its estimate,
  lowest to highest measured);
- *K jobs per GPU* (``training.jobs_per_gpu``, ``run-bundle --parallel K``): the estimate ×
  ``packed_ratio[K]`` (one job's GPU time when K share the GPU, over its estimate alone), for each K
  measured on that kind.

What the config as written runs (:func:`as_written`): a fine-tune of ``training.gpus`` G ≥ 2 holds G
whole GPUs (DDP) and shares none, unless ``training.replicas_as_micro_batches`` runs it as one process
on one GPU; a one-GPU fine-tune shares its GPU with ``training.jobs_per_gpu`` − 1 others. Its rate is
the measured one for that K, or, for a K not measured, the range from the best measured sharing to a
job alone; a packed rate measured on other models than the config's is marked extrapolated.

Wall time on N GPUs is the GPU time over N: a lower bound (the search must end before the final
runs start). Fine-tunes only: the Σ_S passes of the pretrained models and the measurements add a
job per setting (a few per cent of a study's fine-tunes' time in the GPU study).

``istar cost --bundle FOLDER --units A:B --parallel K --kind h100`` sizes one device call of a built
bundle instead (:func:`bundle_call_seconds`): the units' jobs as ``run-bundle`` runs them, each
job's estimate turned into seconds by the same measured rates (``job_factor`` for the jobs that are
not fine-tunes).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from istar.config.gpu_slots import fine_tune_gpus
from istar.config.layout import Setting
from istar.pipeline.bundle_plan import DeviceCosts, fine_tune_s, model_sizes, model_sizes_of
from istar.pipeline.jobs import Decided, plan_cell
from istar.pipeline.plan import fixed_setting, search_settings, task_max_length, tuned_tokens
from istar.pipeline.validate import merge_config_files, validate_config
from istar.registry.tasks import get_task

__all__ = ["RATES_FILE", "gpu_kind", "load_rates", "model_shape", "padded_task_sizes",
           "config_cost", "as_written", "describe_cost", "bundle_call_seconds"]

RATES_FILE = Path(__file__).with_name("device_rates.json")


def gpu_kind(name: str) -> str:
    """The kind of GPU a device name names (``NVIDIA H100 80GB HBM3`` → ``h100``)."""
    found = re.search(r"\b([A-Z]{1,2}\d{2,4})\b", name)
    if found is None:
        raise ValueError(f"no GPU model in the device name {name!r}")
    return found.group(1).lower()


def load_rates(path: Path = RATES_FILE) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def model_shape(source: str, rates: dict) -> dict:
    """Layers and parameter counts of a configured model: a local folder's (or package's) config.json,
    else the hub model's recorded shape (``model_shapes`` in the rates file)."""
    from istar.models.loading import parse_model_source

    parsed = parse_model_source(source)
    if parsed.kind != "hub":
        return model_sizes(Path(parsed.location))
    shapes = rates["model_shapes"]
    if parsed.location not in shapes:
        raise ValueError(f"no shape recorded for the hub model {parsed.location}; add its config.json's layer and "
                         f"size keys under model_shapes in {RATES_FILE.name}, or name a downloaded folder")
    return model_sizes_of(shapes[parsed.location])


def padded_task_sizes(config: dict, task: str) -> dict:
    """A task's token counts in :func:`istar.pipeline.bundle_plan.data_sizes`' form before its data is
    prepared: the task's rows (up to ``data.max_train_samples`` | ``max_eval_samples``), every sequence
    padded to the task's ``max_length``."""
    tokens, data = task_max_length(config, task), config["data"]
    rows = [min(count, limit) if limit else count
            for count, limit in zip(get_task(task).rows, (data["max_train_samples"], data["max_eval_samples"]))]
    return {split: {"features": count, "mean_tokens": tokens, "mean_padded": tokens}
            for split, count in zip(("train", "validation"), rows)}


def _measured(kind: str, rates: dict) -> dict:
    if kind not in rates["kinds"]:
        raise ValueError(f"no rates measured on {kind!r}; measured: {', '.join(sorted(rates['kinds']))} "
                         f"(a GPU record imported into docs/data adds its kind: python -m bench.device_rates)")
    return rates["kinds"][kind]


def bundle_call_seconds(plan: dict, numbers, kind: str, parallel: int) -> list[float]:
    """[low, high] seconds of one ``run-bundle --parallel K`` call on a fresh machine with one GPU of ``kind``
    that runs the bundle's units ``numbers`` (as ``istar bundle`` numbers them), from the measured rates:
    first each Σ_S job the units read, once; then unit by unit its fine-tunes in waves of K, a wave as long
    as its longest job at K × ``packed_ratio[K]`` × its estimate (K jobs share the GPU), then the unit's
    measurement. Every job but a fine-tune takes ``job_factor[rule]`` × its estimate, one after another
    (the runner overlaps some: an upper bound there). The machine's start is not included."""
    measured = _measured(kind, load_rates())
    if str(parallel) not in measured["packed_ratio"]:
        raise ValueError(f"no run-bundle call with --parallel {parallel} measured on {kind}; measured: "
                         f"{', '.join(measured['packed_ratio'])}")
    jobs, chosen = plan["jobs"], [plan["units"][number] for number in numbers]
    wanted = {path for unit in chosen for index in unit["jobs"] for path in jobs[index]["needs"]}
    sigmas = [job for job in jobs if job["step"][0] == "shrinkage" and wanted & set(job["outputs"])]
    bounds = []
    for side in (0, 1):
        def alone(job: dict) -> float:
            return measured["job_factor"][job["step"][0]][side] * job["estimate_s"]

        seconds = sum(alone(job) for job in sigmas)
        for unit in chosen:
            trains = [jobs[index]["estimate_s"] for index in unit["jobs"] if jobs[index]["rule"] == "train"]
            waves = [trains[start:start + parallel] for start in range(0, len(trains), parallel)]
            seconds += sum(parallel * measured["packed_ratio"][str(parallel)][side] * max(wave) for wave in waves)
            seconds += sum(alone(jobs[index]) for index in unit["jobs"] if jobs[index]["rule"] != "train")
        bounds.append(round(seconds, 1))
    return bounds


def config_cost(config: dict, kind: str, gpus: int) -> dict:
    """GPU-hours and wall hours of a validated config's fine-tunes on ``gpus`` GPUs of ``kind``, one job
    per GPU and K per GPU for each K measured there; each a [low, high] range from the measured rates.

    The fine-tunes are those the job table plans. The search's choice is not known before the search:
    where λ | ζ is not fixed in advance, the first setting of the search grid stands in for it (its λ and ζ
    change no run's length; under a searched training grid its batch size and epochs are the grid's first),
    and the tuned baselines train at its training values."""
    rates = load_rates()
    measured = _measured(kind, rates)
    if gpus < 1:
        raise ValueError(f"--gpus must be at least 1; got {gpus}")
    runs, estimate_s = [], 0.0
    for model, source in config["models"].items():
        shape = model_shape(source, rates)
        for task in config["tasks"]:
            selection = fixed_setting(config, model, task) or search_settings(config, model, task)[0]
            tuned = next((Setting("istar", lam=selection.lam, zeta=selection.zeta, tokens=tokens)
                          for tokens in tuned_tokens(config)), None)
            decided = Decided(selection=selection, baselines=(), tuned=tuned, depth=shape["layers"])
            trains = [job for job in plan_cell(config, model, task, decided).jobs if job.step == "train"]
            sizes = padded_task_sizes(config, task)
            estimate_s += sum(fine_tune_s(config, DeviceCosts(), shape, sizes, json.loads(job.spec.to_json()))
                              for job in trains)
            runs += trains
    estimate_h = estimate_s / 3600

    def hours(ratio: list[float], per_job: int) -> dict:
        low, high = (estimate_h * r for r in ratio)
        return {"jobs_per_gpu": per_job, "gpu_hours": [round(low, 1), round(high, 1)],
                "wall_hours": [round(low / gpus, 1), round(high / gpus, 1)]}

    return {"kind": kind, "gpus": gpus, "fine_tunes": len(runs),
            "search_fine_tunes": sum(job.rule == "train_search" for job in runs),
            "estimate_gpu_hours": round(estimate_h, 1),
            "as_written": as_written(config, measured, hours),
            "alone": hours(measured["step_factor"], 1),
            "packed": [hours(ratio, int(k)) for k, ratio in measured["packed_ratio"].items()],
            "sources": measured["sources"]}


def as_written(config: dict, measured: dict, hours) -> dict:
    """What the config's own settings run: fine-tunes per GPU, whether it packs and why not, its GPU-hours
    (``hours(ratio, per_gpu)``) and which of its rates are measured or extrapolated."""
    training = config["training"]
    gpus_per_job = fine_tune_gpus(training)
    per_gpu = training["jobs_per_gpu"] if gpus_per_job == 1 else 1
    why_not = (f"training.gpus = {gpus_per_job}: each fine-tune holds {gpus_per_job} whole GPUs (DDP); "
               "training.replicas_as_micro_batches: true runs it as one process on one GPU, which can be shared"
               if gpus_per_job > 1 else "training.jobs_per_gpu = 1" if per_gpu == 1 else None)
    packed = measured["packed_ratio"]
    if per_gpu == 1:
        ratio, rate = measured["step_factor"], "measured (a job alone)" + (
            "; DDP's all-reduce not included" if gpus_per_job > 1 else "")
    elif str(per_gpu) in packed:
        ratio, rate = packed[str(per_gpu)], f"measured at {per_gpu} jobs per GPU"
    else:
        ratio = [min(low for low, _ in packed.values()), measured["step_factor"][1]]
        rate = (f"{per_gpu} jobs per GPU not measured: from the best sharing measured "
                f"({', '.join(packed)} per GPU) to a job alone")
    others = sorted(set(config["models"]) - set(measured["packed_models"]))
    if per_gpu > 1 and others:
        rate += (f"; packing measured on {', '.join(measured['packed_models'])} fine-tunes, extrapolated to "
                 f"{', '.join(others)}")
    return {**hours(ratio, per_gpu), "gpus_per_fine_tune": gpus_per_job,
            "packs": per_gpu > 1, "why_not_packed": why_not, "rate": rate,
            "threads": "each job's threads are lowered to --cores / (--resources gpu × jobs_per_gpu)"
            if per_gpu > 1 else None}


def describe_cost(cost: dict) -> str:
    def span(pair):
        return f"{pair[0]:,.1f}–{pair[1]:,.1f}"

    lines = [f"{cost['fine_tunes']:,} fine-tunes ({cost['search_fine_tunes']:,} in the search), "
             f"estimated {cost['estimate_gpu_hours']:,.1f} GPU-hours alone before the {cost['kind']}'s rates",
             f"on {cost['gpus']} × {cost['kind']}:  GPU-hours  wall hours (at least)"]
    written = cost["as_written"]
    lines.append(f"  as written ({written['jobs_per_gpu']} per GPU) {span(written['gpu_hours']):>12}  "
                 f"{span(written['wall_hours']):>14}  ({written['rate']}"
                 + (f"; not packed: {written['why_not_packed']}" if written["why_not_packed"] else "") + ")")
    for row in [cost["alone"], *cost["packed"]]:
        label = "one job per GPU" if row["jobs_per_gpu"] == 1 else f"{row['jobs_per_gpu']} jobs per GPU"
        lines.append(f"  {label:<18} {span(row['gpu_hours']):>16}  {span(row['wall_hours']):>14}")
    lines.append("ranges: lowest to highest rate measured on this kind (" + "; ".join(cost["sources"]) + ")")
    return "\n".join(lines)


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", dest="configfiles", nargs="+", type=Path,
                        help="config file(s), merged in order as snakemake --configfile merges them")
    source.add_argument("--bundle", type=Path, help="a built bundle (istar bundle --out): the seconds of one device call")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs the config runs on (default: %(default)s)")
    parser.add_argument("--kind", required=True, help="the kind of GPU (h100, h200: those with measured rates)")
    parser.add_argument("--units", default=None, metavar="A:B", help="--bundle: the call's units, as run-bundle --units")
    parser.add_argument("--parallel", type=int, default=10, help="--bundle: as run-bundle --parallel (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")


def run_cli(args) -> int:
    if args.bundle is not None:
        from istar.pipeline.bundle_run import read_plan, unit_range

        plan = read_plan(args.bundle)
        numbers = unit_range(args.units, len(plan["units"])) if args.units else range(len(plan["units"]))
        low, high = bundle_call_seconds(plan, numbers, args.kind.lower(), args.parallel)
        print(json.dumps({"units": [plan["units"][n]["name"] for n in numbers], "seconds": [low, high]}, indent=2)
              if args.json else f"units {numbers.start}:{numbers.stop} of {args.bundle}, {args.parallel} at a time on one "
              f"{args.kind.lower()}: {low / 60:.1f}–{high / 60:.1f} min ({low:.0f}–{high:.0f} s; the machine's start not included)")
        return 0
    config = validate_config(merge_config_files(args.configfiles), check_paths=False)
    cost = config_cost(config, args.kind.lower(), args.gpus)
    print(json.dumps(cost, indent=2) if args.json else describe_cost(cost))
    return 0

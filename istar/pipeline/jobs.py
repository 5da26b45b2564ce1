"""The job table: every Σ_S, fine-tuning, selection and measurement job of one model × task, once.

A :class:`Job` is what its rule runs: the rule, the ``istar`` step and its spec (the step's settings,
:mod:`istar.config.specs`), the files it writes and its log (paths of :mod:`istar.config.layout`),
and the files of other jobs it reads. :func:`plan_cell` is the one plan of a model × task:

- the workflow's rules look their job up by output path (workflow/rules/common.smk), so a run's
  spec comes from the :class:`~istar.config.layout.Setting` the plan made, not from its folder name;
- a bundle runs the same jobs (:mod:`istar.pipeline.bundle_plan`).

What the workflow's checkpoints decide — the search's choice, the tuned baselines, the padding
study's tuned variant, the model's depth, the seeds that replace collapsed runs — comes in as
:class:`Decided`; a job that needs a decision not yet made is not in the plan.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from istar.config.layout import (
    AGGREGATE,
    AGGREGATE_DIR,
    AGGREGATE_LOG,
    COLLAPSE_CHECK,
    EXPERIMENT_LOG,
    EXPERIMENT_METRICS,
    FIGURE,
    FIGURE_LOG,
    RESOLVED_CONFIG,
    STABILITY_LOG,
    SUMMARY_LOG,
    SUMMARY_MD,
    SUMMARY_RST,
    TABLE,
    TABLE_LOG,
    DATA,
    DEFAULT_TOKENS,
    MEASURE_LOG,
    MEASURES,
    MODEL_PIN,
    RUN,
    SELECTION,
    SELECT_LOG,
    SELECT_TUNED_LOG,
    TRAIN_LOG,
    TUNED_SELECTION,
    Setting,
    search_log,
    search_templates,
    seeds_token,
    shrinkage_log,
    sigma_template,
)
from istar.config.gpu_slots import fine_tune_gpus
from istar.config.schema import STUDIES
from istar.config.specs import Spec
from istar.core.tokens import TOKEN_SELECTION_NAMES
from istar.io.artifacts import read_json
from istar.pipeline.engine import unless_pending
from istar.report.aggregate import AGGREGATE_NAMES, PROVENANCE_NAME
from istar.report.figures import FIGURE_NAMES, STABILITY_CSV, figure_csvs
from istar.report.table_specs import TABLE_NAMES, get_table
from istar.pipeline.plan import (
    aggregate_options,
    baseline_choices,
    final_settings,
    fixed_choice_args,
    fixed_setting,
    heldout_name,
    in_study,
    measure_spec,
    needs_sigma,
    replaces_collapsed,
    search_settings,
    selected_setting,
    shrinkage_spec,
    study_runs,
    study_seeds,
    train_spec,
    tuned_setting,
    tuning_settings,
)

__all__ = ["Job", "Resources", "Decided", "CellPlan", "plan_cell", "step_resources", "needs_depth", "before_decisions", "decide",
           "checkpoint_reader",
           "aggregate_job", "report_jobs"]


@dataclass(frozen=True)
class Resources:
    """What a job asks the scheduler for: whole GPUs, CPU threads, memory (MB) and wall time (minutes);
    None leaves Snakemake's (or the cluster profile's) default."""

    gpus: int = 0
    threads: int = 1
    mem_mb: int | None = None
    runtime: int | None = None


# a Σ_S job is one pass over at most shrinkage.rows rows: an hour bounds it for every model the config takes
SHRINKAGE_RUNTIME_MIN = 60


def step_resources(config: dict, step: str) -> Resources:
    """The resources a job of ``step`` asks for, from the config's ``training`` (and ``survey``) section: a
    fine-tune its processes' GPUs (:func:`~istar.config.gpu_slots.fine_tune_gpus`); a Σ_S or measurement job
    one where the fine-tunes get any (one process reads every batch); a survey ``survey.gpus``; every other
    step (selection, aggregate, tables, figures) one thread and the defaults."""
    training = config["training"]
    gpus, per_job = fine_tune_gpus(training), (training["threads"], training["mem_mb"])
    return {
        "train": Resources(gpus, *per_job, training["runtime"]),
        # a measurement holds every [CLS] vector of every layer for TwoNN (about 1.6 GB for QQP with BERT-base)
        # and runs an exact TwoNN per layer for each of its runs: a fine-tune's memory and time bound it
        "measure": Resources(min(gpus, 1), *per_job, training["runtime"]),
        "shrinkage": Resources(min(gpus, 1), *per_job, SHRINKAGE_RUNTIME_MIN),
        "survey": Resources(config["survey"]["gpus"], *per_job, training["runtime"]),
    }.get(step, Resources())


@dataclass(frozen=True)
class Job:
    """One job: ``rule`` runs ``istar {step}`` with ``spec`` on ``resources`` through ``istar launch`` (a
    job without a spec: with ``args``, in the rule's process), writes ``outputs`` and ``log`` and reads
    ``needs`` (outputs of other jobs). Its benchmark file is ``benchmark_of(log)``
    (:func:`istar.config.layout.benchmark_of`)."""

    rule: str
    step: str
    outputs: tuple[str, ...]
    log: str
    label: str
    needs: tuple[str, ...] = ()
    spec: Spec | None = None
    args: tuple[str, ...] = ()
    resources: Resources = Resources()

    @property
    def launched(self) -> bool:
        """Whether the step runs through ``istar launch`` on its granted GPUs (every step with a spec)."""
        return self.spec is not None

    @property
    def argv(self) -> tuple[str, ...]:
        """The step's command after ``python -m istar`` (a launched step's: after ``istar launch --gpus G --``,
        G its ``resources.gpus``)."""
        if self.launched:
            return self.step, "--spec", self.spec.to_json()
        return self.step, *self.args

    @property
    def recorded(self) -> str:
        """What Snakemake records of the job, so that an edit of any of it reruns the job: the spec without
        its result-neutral settings (:meth:`istar.config.specs.Spec.recorded_json`), or a selection's command."""
        return self.spec.recorded_json() if self.launched else shlex.join(self.argv)


@dataclass(frozen=True)
class Decided:
    """What the checkpoints of a model × task decided; None: not decided yet (jobs that need it wait)."""

    selection: Setting | None = None  # the I-STAR setting, fixed in advance (final.istar) or chosen
    baselines: tuple[tuple[str, Setting], ...] | None = None  # method → its tuned setting (search.tune_baselines)
    tuned: Setting | None = None  # the padding study's tuned variant (studies.padding.lam: tuned)
    depth: int | None = None  # the model's L, for the one-layer study over every layer
    replacements: tuple[int, ...] | None = ()  # final seeds replacing collapsed ones (inference.collapsed_runs: rerun)


@dataclass(frozen=True)
class CellPlan:
    """The jobs of a model × task, and what the aggregate reads of them: ``runs`` as (study, run
    folder) in the order the aggregate is given them, ``measures`` its measurement files."""

    jobs: tuple[Job, ...]
    runs: tuple[tuple[str, str], ...]
    measures: tuple[str, ...]
    by_output: dict = field(default_factory=dict, compare=False, repr=False)

    def job(self, path: str) -> Job | None:
        """The job that writes ``path``, or None."""
        return self.by_output.get(path)


def needs_depth(config: dict, model: str, task: str) -> bool:
    """Whether the one-layer study penalises every layer (1..L) of this model × task."""
    return in_study(config, "single_layer", model, task) and config["studies"]["single_layer"]["layers"] == "all"


def _padding_tuning(config: dict, model: str, task: str) -> tuple[list[Setting], list[int]]:
    """The padding study's tuning grid and seeds for this model × task (empty where it tunes nothing here)."""
    if not in_study(config, "padding", model, task):
        return [], []
    return tuning_settings(config), config["studies"]["padding"]["tuning"]["seeds"]


def before_decisions(config: dict, model: str, task: str) -> Decided:
    """What is known of a model × task before any checkpoint: a λ | ζ fixed in advance, nothing else."""
    return Decided(selection=fixed_setting(config, model, task), baselines=None,
                   replacements=None if replaces_collapsed(config) else ())


def decide(config: dict, model: str, task: str, read: Callable[[str, str], dict | None], *,
           replaced: bool = True) -> Decided:
    """What the checkpoints of ``model`` × ``task`` decided, from the files they write.

    ``read(checkpoint, path)`` gives the content of the decision file ``path`` once the checkpoint rule
    ``checkpoint`` has run, else None (the workflow: Snakemake's checkpoint lookup, which may instead raise to
    wait for it; a command outside Snakemake: the file if it exists). A decision it gives no content for stays
    None, and the jobs that need it stay out of the plan. ``replaced`` False: the final seeds before
    ``inference.collapsed_runs: rerun`` chose replacements.
    """
    names = {"model": model, "task": task}

    def decision(checkpoint: str, path: str, then: Callable[[dict], object]):
        content = read(checkpoint, path.format(**names))
        return None if content is None else then(content)

    selection = fixed_setting(config, model, task) or decision("select", SELECTION,
                                                                lambda chosen: selected_setting(chosen, config))
    baselines = (decision("select", SELECTION, lambda chosen: tuple(sorted(baseline_choices(chosen).items())))
                 if config["search"]["tune_baselines"] else ())
    tuned = decision("select_tuned", TUNED_SELECTION, tuned_setting) if all(_padding_tuning(config, model, task)) else None
    depth = None
    if selection is not None and needs_depth(config, model, task):
        # L from the Σ_S provenance; where λ | ζ is fixed, the `select` checkpoint is the job that reads that file
        sigma = sigma_template(config["penalty"]["tokens"]).replace(".pt", ".json")
        depth = decision("select", sigma, lambda provenance: provenance["num_layers"])
    replacements = ()
    if replaces_collapsed(config):
        replacements = decision("collapse_check", COLLAPSE_CHECK,
                                lambda check: tuple(sorted(check["replacements"].values()))) if replaced else None
    return Decided(selection, baselines, tuned, depth, replacements)


def checkpoint_reader(checkpoints, model: str, task: str, wait: bool) -> Callable[[str, str], dict | None]:
    """``read`` for :func:`decide` in the workflow: a decision file once its checkpoint (``checkpoints``,
    Snakemake's, for this model × task) has run; before that None, or with ``wait`` Snakemake's own exception,
    which makes the input function asking wait for the checkpoint."""

    def read(checkpoint: str, path: str) -> dict | None:
        def content() -> dict:
            getattr(checkpoints, checkpoint).get(model=model, task=task)
            stat = os.stat(path)  # every job planned after the checkpoint asks: read the file again once it changed
            return _decision(path, (stat.st_mtime_ns, stat.st_size))

        return unless_pending(content, wait)

    return read


@functools.lru_cache(maxsize=None)
def _decision(path: str, stamp: tuple[int, int]) -> dict:
    return read_json(path)  # its recorded content hash checked


def _train_job(config: dict, model: str, task: str, setting: Setting, seed: int, heldout: str | None,
               search: bool) -> Job:
    data, _, run_template = search_templates(heldout) if search else (DATA, None, RUN)
    names = {"model": model, "task": task, "setting": setting.name, "seed": seed}
    run = run_template.format(**names)
    sigma = sigma_template(setting.tokens, heldout if search else None).format(model=model, task=task)
    spec = train_spec(config, model=MODEL_PIN.format(model=model), task=task, setting=setting, seed=seed,
                      data_dir=data.format(task=task), output_dir=run, sigma_s=sigma)
    return Job("train_search" if search else "train", "train", (f"{run}/metrics.json", f"{run}/model"),
               (search_log(heldout) if search else TRAIN_LOG).format(**names),
               f"{model}/{task}/{setting.name}/seed{seed}", needs=(sigma,) if needs_sigma(setting) else (), spec=spec,
               resources=step_resources(config, "train"))


def _shrinkage_job(config: dict, model: str, task: str, tokens: str, heldout: str | None) -> Job:
    data, _, _ = search_templates(heldout)
    sigma = sigma_template(tokens, heldout).format(model=model, task=task)
    spec = shrinkage_spec(config, model=MODEL_PIN.format(model=model), task=task, data_dir=data.format(task=task),
                          out=sigma, tokens=tokens)
    rule = "shrinkage" + ("_search" if heldout else "") + ("" if tokens == DEFAULT_TOKENS else f"_{tokens}")
    return Job(rule, "shrinkage", (sigma, sigma.replace(".pt", ".json")),
               shrinkage_log(tokens, heldout).format(model=model, task=task), f"{model}/{task} ({tokens})", spec=spec,
               resources=step_resources(config, "shrinkage"))


def _folder(job: Job) -> str:
    return job.outputs[0].removesuffix("/metrics.json")


def plan_cell(config: dict, model: str, task: str, decided: Decided) -> CellPlan:
    """Every job of ``model`` × ``task`` that ``decided`` allows, each once: Σ_S of each token selection,
    the search's runs (and the padding study's tuning runs), the selections, the final and study
    runs, and one measurement per study's setting and seeds."""
    heldout, names = heldout_name(config), {"model": model, "task": task}

    def train_jobs(settings, seeds, search: bool) -> list[Job]:
        return [_train_job(config, model, task, s, seed, heldout, search) for s in settings for seed in seeds]

    search = train_jobs(search_settings(config, model, task), config["search"]["seeds"], search=True)
    tuning = train_jobs(*_padding_tuning(config, model, task), search=True)
    runs = [("search", _folder(job)) for job in search] + [("padding_tuning", _folder(job)) for job in tuning]

    # the selections (the workflow's checkpoints)
    fixed = fixed_setting(config, model, task)
    needs = tuple(job.outputs[0] for job in search)
    if fixed is None:
        # a λ grid holding 0 makes Base one of I-STAR's candidates: the search may choose no regularisation
        options = ("--lambda-zero",) if 0.0 in config["search"]["lambdas"] else ()
    else:
        options = ("--fixed", json.dumps(fixed_choice_args(config, model, task)))
        if needs_depth(config, model, task):  # the Σ_S provenance gives L
            needs = (sigma_template(config["penalty"]["tokens"]).format(**names).replace(".pt", ".json"), *needs)
    selects = [Job("select", "select", (SELECTION.format(**names),), SELECT_LOG.format(**names), f"{model}/{task}",
                   needs=needs, args=("--out", SELECTION.format(**names), *options, *map(_folder, search)))]
    if tuning:
        selects.append(Job("select_tuned", "select", (TUNED_SELECTION.format(**names),),
                           SELECT_TUNED_LOG.format(**names), f"{model}/{task} (padding)",
                           needs=tuple(job.outputs[0] for job in tuning),
                           args=("--out", TUNED_SELECTION.format(**names), *map(_folder, tuning))))

    # the final stage and the figure studies: (study, setting, seed); a run asked for twice is one job
    baselines = None if decided.baselines is None else dict(decided.baselines)
    planned = [("final", s, seed) for s in final_settings(config, decided.selection, baselines)
               for seed in study_seeds(config, "final", task) + list(decided.replacements or ())]
    for study in STUDIES:
        found = study_runs(config, study, model, task, decided.selection, decided.depth, decided.tuned)
        planned += [(study, s, seed) for s, seed in (found or [])]
    trains = {run: _train_job(config, model, task, *run, heldout, search=False)
              for run in dict.fromkeys((setting, seed) for _, setting, seed in planned)}
    runs += [(study, _folder(trains[setting, seed])) for study, setting, seed in planned]

    # one measurement per study's setting and seeds (the final stage's once its seeds are known)
    seeds_of: dict[tuple[str, str], list[int]] = {}
    for study, setting, seed in planned:
        if not (study == "final" and decided.replacements is None):
            seeds_of.setdefault((study, setting.name), []).append(seed)
    sigma = sigma_template(DEFAULT_TOKENS).format(**names)
    measures = {}
    for (_, name), seeds in seeds_of.items():
        token = seeds_token(seeds)
        out = MEASURES.format(**names, setting=name, seeds=token)
        folders = [RUN.format(**names, setting=name, seed=seed) for seed in token.split("_")]
        measures.setdefault(out, Job(
            "measure", "measure", (out,), MEASURE_LOG.format(**names, setting=name, seeds=token),
            f"{model}/{task}/{name}/seeds{token}", needs=(*(f"{folder}/model" for folder in folders), sigma),
            spec=measure_spec(config, runs=folders, task=task, data_dir=DATA.format(task=task), sigma_s=sigma, out=out),
            resources=step_resources(config, "measure")))

    # Σ_S of every token selection, whether or not a job of this plan reads it: its job waits for no
    # decision, so a cluster job's own Snakemake finds it before any checkpoint is known
    shrinkage = [_shrinkage_job(config, model, task, tokens, part) for part in dict.fromkeys([None, heldout])
                 for tokens in TOKEN_SELECTION_NAMES]
    table = (*shrinkage, *search, *tuning, *selects, *trains.values(), *measures.values())
    return CellPlan(jobs=table, runs=tuple(runs), measures=tuple(sorted(measures)),
                    by_output={path: job for job in table for path in job.outputs})


def aggregate_job(config: dict, runs, selections, measures) -> Job:
    """The aggregate of ``runs`` ((study, run folder), in the order the CSVs list them), ``selections`` and
    ``measures`` into results/aggregate/*.csv."""
    outputs = tuple(AGGREGATE.format(name=name) for name in (*AGGREGATE_NAMES, PROVENANCE_NAME))
    return Job("aggregate", "aggregate", outputs, AGGREGATE_LOG, "aggregate",
               needs=(*(f"{run}/metrics.json" for _, run in runs), *measures, *selections),
               args=("--out-dir", AGGREGATE_DIR, *aggregate_options(config), *(f"{study}={run}" for study, run in runs),
                     "--selection", *selections, "--measures", *measures))


def report_jobs(config: dict) -> tuple[Job, ...]:
    """The jobs after the aggregate, as their rules run them: the DVC experiment, Fig. 2's simulation, every
    table and figure, the summary (what `all` asks for of them is the config's: its studies and figures on)."""
    runs, selection = AGGREGATE.format(name="runs"), AGGREGATE.format(name="selection")
    stability = AGGREGATE.format(name=STABILITY_CSV)
    simulated = config["studies"]["stability"]["enabled"]
    jobs = [Job("experiment", "experiment", (EXPERIMENT_METRICS,), EXPERIMENT_LOG, "experiment",
                needs=tuple(AGGREGATE.format(name=name) for name in ("runs", "paired", "epochs")),
                args=("--aggregate-dir", AGGREGATE_DIR, "--out-dir", str(Path(EXPERIMENT_METRICS).parent)))]
    jobs.append(Job("stability", "stability", (stability,), STABILITY_LOG, "stability",
                    args=("--repeats", str(config["studies"]["stability"]["repeats"]), "--out", stability)))
    for table in TABLE_NAMES:
        reads = (stability,) if simulated and get_table(table).reads_stability else ()
        prefix = TABLE.format(table=table)
        jobs.append(Job("table", "table", tuple(f"{prefix}.{ext}" for ext in ("csv", "md", "tex")),
                        TABLE_LOG.format(table=table), f"table {table}", needs=(runs, selection, *reads, RESOLVED_CONFIG),
                        args=(table, "--runs", runs, "--selection", selection,
                              *(("--stability", *reads) if reads else ()), "--config", RESOLVED_CONFIG,
                              "--out-prefix", prefix)))
    for figure in FIGURE_NAMES:
        out = FIGURE.format(figure=figure)
        jobs.append(Job("figure", "figure", (f"{out}.png", f"{out}.pdf"), FIGURE_LOG.format(figure=figure),
                        f"figure {figure}", needs=tuple(map(str, figure_csvs(figure))),
                        args=(figure, "--aggregate-dir", AGGREGATE_DIR, "--out", f"{out}.png")))
    jobs.append(Job("summary", "summary", (SUMMARY_MD, SUMMARY_RST), SUMMARY_LOG, "summary",
                    needs=(runs, selection, RESOLVED_CONFIG, *((stability,) if simulated else ())),
                    args=("--config", RESOLVED_CONFIG, "--aggregate-dir", AGGREGATE_DIR, "--out", SUMMARY_MD,
                          "--rst", SUMMARY_RST)))
    return tuple(jobs)

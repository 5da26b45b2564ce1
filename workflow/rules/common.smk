# Helpers shared by the rules: the validated config, paths, and which runs the config asks for.
# The logic lives in istar.pipeline (validation, plan) and istar.config.layout (the paths); this
# file only maps it onto rules.

import os
import shlex

from snakemake.exceptions import WorkflowError

from istar.report.aggregate import AGGREGATE_NAMES, PROVENANCE_NAME
from istar.config.schema import STUDIES, ConfigError
from istar.config.gpu_slots import (
    JOBS_PER_GPU_ENV,
    fine_tune_gpus,
    gpu_budget,
    gpu_units,
    packed_threads,
)
from istar.pipeline.validate import validate_config
from istar.report.figures import (
    STABILITY_CSV,
    PROFILE_FIGURES,
    PROFILES_CSV,
    PROJECTIONS_CSV,
    enabled_figures,
)
from istar.report.table_specs import TABLE_NAMES, enabled_tables
from istar.config.layout import (
    AGGREGATE,
    AGGREGATE_LOG,
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
    COLLAPSE_CHECK,
    DATA,
    MEASURE_LOG,
    MEASURES,
    MODEL_PIN,
    PROFILE,
    RUN,
    SELECT_LOG,
    SELECT_TUNED_LOG,
    SELECTION,
    SIGMA,
    SIGMA_ALL_POSITIONS,
    TRAIN_LOG,
    TUNED_SELECTION,
    WILDCARD_CONSTRAINTS,
    benchmark_of,
    search_log,
    search_templates,
    shrinkage_log,
    sigma_template,
)
from istar.pipeline.jobs import (
    CellPlan,
    Decided,
    Job,
    aggregate_job,
    before_decisions,
    checkpoint_reader,
    decide,
    plan_cell,
    report_jobs,
    step_resources,
)
from istar.pipeline.plan import (
    heldout_name,
    holdout_spec,
    aggregate_options,
    prepare_data_inputs,
    prepare_data_spec,
    replaces_collapsed,
    survey_spec,
    survey_targets,
    survey_text_task,
)

try:
    _validated = validate_config(config)
except ConfigError as error:
    raise WorkflowError(f"invalid configuration: {error}") from None
config.clear()
config.update(_validated)

MODELS = list(config["models"])
TASKS = list(config["tasks"])
# the tasks whose data is prepared: the fine-tuning tasks and the survey's text sample
_survey_task = survey_text_task(config)
DATA_TASKS = TASKS + ([_survey_task] if _survey_task not in [None, *TASKS] else [])
TRAINING = config["training"]
# (one where training.replicas_as_micro_batches runs the data-parallel replicas in one process)
GPUS = fine_tune_gpus(TRAINING)
# Several fine-tunes per GPU (training.jobs_per_gpu = K, istar.config.gpu_slots): under
# `--resources gpu=N` the `gpu` budget becomes N·K slots, a one-GPU job asks for one and a job of
# G ≥ 2 GPUs for G·K; ISTAR_JOBS_PER_GPU tells `istar launch` that it is granted slots. Without a
# budget, on a cluster (one allocation per job) and in a cluster job's own Snakemake, every job asks
# for whole GPUs. (workflow.global_resources holds --resources.)
_GPU_LIMIT = workflow.global_resources.get("gpu")
_LOCAL = workflow.is_main_process and workflow.local_exec
JOBS_PER_GPU = (
    TRAINING["jobs_per_gpu"] if _LOCAL and _GPU_LIMIT and _GPU_LIMIT.value else 1
)
# (a value left in the caller's environment is not this run's)
os.environ.pop(JOBS_PER_GPU_ENV, None)
if JOBS_PER_GPU > 1:
    _SLOTS = gpu_budget(_GPU_LIMIT.value, JOBS_PER_GPU)
    workflow.global_resources["gpu"] = _SLOTS
    os.environ[JOBS_PER_GPU_ENV] = str(JOBS_PER_GPU)


def scheduled(step):
    """The threads and resources that the jobs of ``step`` ask for, as in the job table
    (istar.pipeline.jobs.step_resources), with the GPUs counted in slots of the `gpu` resource
    and the threads lowered so that all N·K slots can be busy within --cores."""
    asked = step_resources(config, step)
    threads = asked.threads
    if JOBS_PER_GPU > 1:
        try:
            threads = packed_threads(
                threads, workflow.global_resources["_cores"].value, _SLOTS
            )
        except ValueError as error:
            raise WorkflowError(str(error)) from None
    units = gpu_units(asked.gpus, JOBS_PER_GPU)
    return threads, dict(gpu=units, mem_mb=asked.mem_mb, runtime=asked.runtime)


THREADS, RESOURCES = {}, {}
for _step in ("train", "shrinkage", "measure", "survey"):
    THREADS[_step], RESOURCES[_step] = scheduled(_step)
# Each rule's environment under --sdm conda: conda-forge's CUDA build of PyTorch for the jobs that
# get GPUs, the CPU build elsewhere. Named, not detected: environments are created on the
# submitting host, which on a cluster often has no GPU.
CPU_ENV = "../../envs/istar-cpu.yaml"
GPU_ENV = "../../envs/istar.yaml"
TRAINING_ENV = GPU_ENV if GPUS else CPU_ENV

# The search reads the task's own splits (scored on the validation split, the paper's
# protocol) or, under search.selection_split: heldout, a held-out split of the training rows
# made by the holdout_data rule, with a Σ_S of its own; the final runs always read DATA.
HELDOUT = heldout_name(config)
SEARCH_DATA, SEARCH_SIGMA, SEARCH_RUN = search_templates(HELDOUT)
PROFILES = [
    PROFILE.format(pmodel=name, revision=revision)
    for name, revision in survey_targets(config)
]
PROFILES_TABLE = AGGREGATE.format(name=PROFILES_CSV)
PROJECTIONS_TABLE = AGGREGATE.format(name=PROJECTIONS_CSV)
AGGREGATES = expand(AGGREGATE, name=AGGREGATE_NAMES)
PROVENANCE_CSV = AGGREGATE.format(name=PROVENANCE_NAME)


wildcard_constraints:
    **WILDCARD_CONSTRAINTS,
    task="|".join(DATA_TASKS),


# A prepared task folder is an input through its meta.json alone: prepare_data (and holdout_data)
# write it last, with the sha256 of each split, which every step checks when it reads a split
# and the onstart check verifies before any job starts. One input per folder rather than three
# is part of what keeps the paper's DAG (about 2,200 jobs) quick to plan (bench/RESULTS.md).
DATA_MANIFEST = f"{DATA}/meta.json"
SEARCH_DATA_MANIFEST = f"{SEARCH_DATA}/meta.json"


def model_source(wildcards):
    """The pretrained model's pin file, written by pin_model, so every step loads the same commit."""
    return MODEL_PIN.format(model=wildcards.model)


def prepare_data_spec_json(wildcards):
    return prepare_data_spec(
        config, task=wildcards.task, out=DATA.format(task=wildcards.task)
    ).to_json()


def prepare_data_sources(wildcards):
    return prepare_data_inputs(config, wildcards.task)


def holdout_spec_json(wildcards):
    return holdout_spec(
        config,
        data_dir=DATA.format(task=wildcards.task),
        out=SEARCH_DATA.format(task=wildcards.task),
    ).to_json()


def survey_text_input(wildcards):
    """The prepared task folder's meta.json, or the text file (survey.text)."""
    task = survey_text_task(config)
    return DATA_MANIFEST.format(task=task) if task else config["survey"]["text"]


def survey_spec_json(wildcards):
    task = survey_text_task(config)
    return survey_spec(
        config,
        model=wildcards.pmodel,
        revision=wildcards.revision,
        text=DATA.format(task=task) if task else config["survey"]["text"],
        out=PROFILE.format(pmodel=wildcards.pmodel, revision=wildcards.revision),
    ).to_json()


# ----------------------------------------------------------------------------- the job table
# Every Σ_S, fine-tuning, selection and measurement job of a model × task is planned once, by
# istar.pipeline.jobs.plan_cell, with what the checkpoints have decided so far; a rule finds its job
# by output path and takes the job's spec, inputs and arguments from it.

REPLACES_COLLAPSED = replaces_collapsed(config)


def decided(model, task, wait: bool, replaced: bool = True) -> Decided:
    """What the checkpoints of a model × task decided (istar.pipeline.jobs.decide). A checkpoint not yet
    run raises with ``wait`` (an input function then waits for it), else leaves its decision unknown.
    """
    read = checkpoint_reader(checkpoints, model, task, wait)
    return decide(config, model, task, read, replaced=replaced)


_PLANS = {}


def cell_plan(model, task, known: Decided) -> CellPlan:
    if (model, task, known) not in _PLANS:
        _PLANS[model, task, known] = plan_cell(config, model, task, known)
    return _PLANS[model, task, known]


# the jobs known before any checkpoint: the search, the selections and every run that does not
# wait for a choice (all of them where λ | ζ is fixed in advance)
PLANNED = {
    (model, task): cell_plan(model, task, before_decisions(config, model, task))
    for model in MODELS
    for task in TASKS
}


def job_at(model, task, path) -> Job:
    """The job of the table that writes ``path``: among the jobs known before any checkpoint, else
    after what the checkpoints have decided so far, else waiting for them. (A cluster job's own
    Snakemake knows no checkpoint has run until it asks: the raised wait makes it look. The
    collapse check is asked for last, since the final runs it reads look themselves up here.)
    """
    job = PLANNED[model, task].job(path)
    for wait, replaced in ((False, True), (True, False), (True, True)):
        if job is not None:
            return job
        job = cell_plan(model, task, decided(model, task, wait, replaced)).job(path)
    if job is None:
        raise WorkflowError(
            f"{path}: no job of this configuration writes it; ask for the results the "
            "config plans (rule all), or add the setting to the config"
        )
    return job


def job_of(template):
    """The job of the rule whose first output is ``template``, from the rule's wildcards (a job of a
    model × task's table, or of the study; the aggregate once every checkpoint has decided).
    """
    return lambda wildcards: job_with_output(template.format(**wildcards), wildcards)


def job_with_output(path, wildcards) -> Job:
    if path == AGGREGATE_RUNS:
        plans = final_plans()
        return aggregate_job(
            config,
            [run for plan in plans for run in plan.runs],
            SELECTIONS,
            sorted({measure for plan in plans for measure in plan.measures}),
        )
    if path in STUDY_JOBS:
        return STUDY_JOBS[path]
    return job_at(wildcards.model, wildcards.task, path)


def needs_of(template):
    """Input function: the files the job reads that other jobs of the table write."""
    return lambda wildcards: list(job_of(template)(wildcards).needs)


# Snakemake reruns a job whose recorded params changed, and records a param only when its function
# takes the wildcards alone: every job of the table records its settings this way (Job.recorded: the
# spec without its result-neutral keys), so an edit of any setting reruns exactly the jobs whose specs it
# changes (Σ_S, fine-tuning, measurement, selection). The command a param taking the output gives is
# derived and not recorded.
def job_settings(template):
    return lambda wildcards: job_of(template)(wildcards).recorded


def job_argv(template):
    return lambda wildcards, output: shlex.join(job_of(template)(wildcards).argv)


def collapse_check_inputs(wildcards) -> list[str]:
    """The final runs of the config's seeds, every arm (after the search's choice)."""
    known = decided(wildcards.model, wildcards.task, wait=True, replaced=False)
    plan = cell_plan(wildcards.model, wildcards.task, known)
    return [run for study, run in plan.runs if study == "final"]


def final_plans() -> list[CellPlan]:
    """Every model × task's plan once every checkpoint has decided (waits for them)."""
    return [
        cell_plan(model, task, decided(model, task, wait=True))
        for model in MODELS
        for task in TASKS
    ]


SELECTIONS = [
    SELECTION.format(model=model, task=task) for model in MODELS for task in TASKS
]
COLLAPSE_CHECKS = (
    [
        COLLAPSE_CHECK.format(model=model, task=task)
        for model in MODELS
        for task in TASKS
    ]
    if REPLACES_COLLAPSED
    else []
)
TUNED_SELECTIONS = [
    path
    for (model, task), plan in PLANNED.items()
    if plan.job(path := TUNED_SELECTION.format(model=model, task=task))
]
# The measurements of the runs known before any checkpoint: each needs its runs' models, so these
# bring every such run into the DAG (and a dry run).
KNOWN_MEASURES = sorted({path for plan in PLANNED.values() for path in plan.measures})


# the study's jobs after the aggregate, by output path
STUDY_JOBS = {job.outputs[0]: job for job in report_jobs(config)}
AGGREGATE_RUNS = AGGREGATE.format(name="runs")
STABILITY = AGGREGATE.format(name=STABILITY_CSV)
TABLES = [
    path
    for table in enabled_tables(config)
    for path in STUDY_JOBS[f"{TABLE.format(table=table)}.csv"].outputs
]
FIGURES = [
    path
    for figure in enabled_figures(config)
    for path in STUDY_JOBS[f"{FIGURE.format(figure=figure)}.png"].outputs
]

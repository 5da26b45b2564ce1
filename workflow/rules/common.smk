# Helpers shared by the rules: the validated config, paths, and which runs the config asks for.
# The logic lives in istar.pipeline (validation, plan) and istar.config.layout (the paths); this
# file only maps it onto rules.

import json
import os

from snakemake.exceptions import WorkflowError

from istar.report.aggregate import AGGREGATE_NAMES, PROVENANCE_NAME
from istar.io.artifacts import read_json
from istar.config.schema import STUDIES, ConfigError
from istar.config.gpu_slots import JOBS_PER_GPU_ENV, gpu_budget, gpu_units
from istar.pipeline.validate import validate_config
from istar.report.figures import (
    STABILITY_CSV,
    PROFILE_FIGURES,
    PROFILES_CSV,
    PROJECTIONS_CSV,
    enabled_figures,
)
from istar.report.table_specs import TABLE_NAMES, enabled_tables, get_table
from istar.config.layout import (
    AGGREGATE,
    COLLAPSE_CHECK,
    DATA,
    MEASURES,
    MODEL_PIN,
    PROFILE,
    RUN,
    SELECTION,
    SIGMA,
    TUNED_SELECTION,
    SIGMA_ALL_POSITIONS,
    WILDCARD_CONSTRAINTS,
    Setting,
    search_templates,
    seeds_token,
    sigma_template,
)
from istar.pipeline.plan import (
    replaces_collapsed,
    study_scope,
    baseline_choices,
    final_settings,
    fixed_choice_args,
    fixed_setting,
    tuned_setting,
    tuning_settings,
    heldout_name,
    holdout_spec,
    measure_spec,
    needs_sigma,
    prepare_data_inputs,
    prepare_data_spec,
    survey_spec,
    survey_targets,
    survey_text_task,
    search_settings,
    searches_no_penalty,
    selected_setting,
    shrinkage_spec,
    study_runs,
    study_seeds,
    train_spec,
)

try:
    _validated = validate_config(config)
except ConfigError as error:
    raise WorkflowError(f"invalid configuration: {error}") from None
config.clear()
config.update(_validated)

MODELS = list(config["models"])
TASKS = list(config["tasks"])
# the tasks whose data is prepared: the fine-tuning tasks and the profiles' text sample
_profile_task = survey_text_task(config)
DATA_TASKS = TASKS + ([_profile_task] if _profile_task not in [None, *TASKS] else [])
TRAINING = config["training"]
GPUS = TRAINING["gpus"]
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
    workflow.global_resources["gpu"] = gpu_budget(_GPU_LIMIT.value, JOBS_PER_GPU)
    os.environ[JOBS_PER_GPU_ENV] = str(JOBS_PER_GPU)
GPU_UNITS = gpu_units(GPUS, JOBS_PER_GPU)
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
SEARCH_TAG, SEARCH_DATA, SEARCH_SIGMA, SEARCH_RUN = search_templates(HELDOUT)
PROFILES = [
    PROFILE.format(pmodel=name, revision=revision)
    for name, revision in survey_targets(config)
]
PROFILES_TABLE = AGGREGATE.format(name=PROFILES_CSV)
PROJECTIONS_TABLE = AGGREGATE.format(name=PROJECTIONS_CSV)
AGGREGATES = expand(AGGREGATE, name=AGGREGATE_NAMES)
EXPERIMENT_METRICS = "results/experiment/metrics.json"
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


def sigma_path(wildcards, setting: Setting, heldout=None) -> str:
    """The pretrained Σ_S over the rows the setting's penalty reads (of the search part under heldout)."""
    return sigma_template(setting.tokens, heldout).format(
        model=wildcards.model, task=wildcards.task
    )


def sigma_input_of(heldout=None):
    def sigma_input(wildcards):
        setting = Setting.parse(wildcards.setting)
        return sigma_path(wildcards, setting, heldout) if needs_sigma(setting) else []

    return sigma_input


# Each step gets its whole spec as one JSON argument (istar.pipeline.plan builds it from the config);
# a changed spec is a changed param, so Snakemake reruns exactly the jobs whose spec changed.


def train_spec_json(run_pattern, data_pattern=DATA, heldout=None):
    def spec(wildcards):
        setting = Setting.parse(wildcards.setting)
        return train_spec(
            config,
            model=model_source(wildcards),
            task=wildcards.task,
            setting=setting,
            seed=int(wildcards.seed),
            data_dir=data_pattern.format(task=wildcards.task),
            output_dir=run_pattern.format(**wildcards),
            sigma_s=sigma_path(wildcards, setting, heldout),
        ).to_json()

    return spec


def prepare_data_spec_json(wildcards):
    return prepare_data_spec(
        config, task=wildcards.task, out=DATA.format(task=wildcards.task)
    ).to_json()


def prepare_data_sources(wildcards):
    return prepare_data_inputs(config, wildcards.task)


def shrinkage_spec_json(tokens, data_pattern=DATA):
    def spec(wildcards, output):
        return shrinkage_spec(
            config,
            model=model_source(wildcards),
            task=wildcards.task,
            data_dir=data_pattern.format(task=wildcards.task),
            out=output.sigma,
            tokens=tokens,
        ).to_json()

    return spec


def holdout_spec_json(wildcards):
    return holdout_spec(
        config,
        data_dir=DATA.format(task=wildcards.task),
        out=SEARCH_DATA.format(task=wildcards.task),
    ).to_json()


def measures_files(model, task, runs, skip_final: bool = False) -> set[str]:
    """The measurement files of planned runs ((study, setting, seed) of one model × task): one per
    study and setting, over that study's seeds of it (``skip_final``: none for the final stage).
    """
    seeds = {}
    for study, setting, seed in runs:
        if not (skip_final and study == "final"):
            seeds.setdefault((study, setting.name), []).append(seed)
    return {
        MEASURES.format(model=model, task=task, setting=name, seeds=seeds_token(chosen))
        for (_, name), chosen in seeds.items()
    }


def measured_runs(wildcards) -> list[str]:
    """The run folders one measure job covers: the setting's runs of the seeds its path names."""
    return [
        RUN.format(
            model=wildcards.model,
            task=wildcards.task,
            setting=wildcards.setting,
            seed=seed,
        )
        for seed in wildcards.seeds.split("_")
    ]


def measured_models(wildcards):
    return [f"{run}/model" for run in measured_runs(wildcards)]


def measure_spec_json(wildcards, input, output):
    return measure_spec(
        config,
        runs=measured_runs(wildcards),
        task=wildcards.task,
        data_dir=DATA.format(task=wildcards.task),
        sigma_s=input.sigma,
        out=output[0],
    ).to_json()


def profile_text_input(wildcards):
    """The prepared task folder's meta.json, or the text file (survey.text)."""
    task = survey_text_task(config)
    return DATA_MANIFEST.format(task=task) if task else config["survey"]["text"]


def survey_spec_json(wildcards, output):
    task = survey_text_task(config)
    return survey_spec(
        config,
        model=wildcards.pmodel,
        revision=wildcards.revision,
        text=DATA.format(task=task) if task else config["survey"]["text"],
        out=output[0],
    ).to_json()


# ----------------------------------------------------------------------------- which runs

REPLACES_COLLAPSED = replaces_collapsed(config)


def final_seeds(model, task, replaced: bool) -> list[int]:
    """The final runs' seeds: the config's, and with ``replaced`` under inference.collapsed_runs:
    rerun the seeds that replace collapsed ones (waits for the collapse_check checkpoint).
    """
    seeds = study_seeds(config, "final", task)
    if not (replaced and REPLACES_COLLAPSED):
        return seeds
    check = read_json(checkpoints.collapse_check.get(model=model, task=task).output[0])
    return seeds + sorted(check["replacements"].values())


def collapse_check_inputs(wildcards) -> list[str]:
    """The final runs of the config's seeds, every arm (after the search's choice)."""
    model, task = wildcards.model, wildcards.task
    settings = final_settings(
        config, selection(model, task), baselines_chosen(model, task)
    )
    return [
        RUN.format(model=model, task=task, setting=s.name, seed=seed)
        for s in settings
        for seed in study_seeds(config, "final", task)
    ]


def selection(model, task) -> Setting:
    """The I-STAR setting fixed in advance (final.istar), or the one the search chose (waits
    for the `select` checkpoint)."""
    fixed = fixed_setting(config, model, task)
    if fixed is not None:
        return fixed
    # read_json checks the content hash `istar select` recorded: an edited choice is named
    return selected_setting(
        read_json(checkpoints.select.get(model=model, task=task).output[0]), config
    )


def baselines_chosen(model, task) -> dict:
    """Method → its own tuned baseline setting (search.tune_baselines), else {}."""
    if not config["search"]["tune_baselines"]:
        return {}
    return baseline_choices(
        read_json(checkpoints.select.get(model=model, task=task).output[0])
    )


def tuned_choice(model, task) -> Setting | None:
    """The padding study's tuned variant (waits for the `select_tuned` checkpoint); None
    when the study takes no tuning for this model × task."""
    if not tuning_runs(model, task):
        return None
    return tuned_setting(
        read_json(checkpoints.select_tuned.get(model=model, task=task).output[0])
    )


def depth_file(model, task) -> str:
    """The pretrained Σ_S provenance of the config's token selection: it records L."""
    sigma = sigma_template(config["penalty"]["tokens"])
    return sigma.format(model=model, task=task).replace(".pt", ".json")


def needs_depth(model, task) -> bool:
    """Whether the single-layer study penalises every layer (1..L) of this model × task."""
    study = config["studies"]["single_layer"]
    models, tasks = study_scope(config, "single_layer")
    return (
        study["enabled"]
        and study["layers"] == "all"
        and model in models
        and task in tasks
    )


def num_layers(model, task) -> int:
    """L of the model. Where λ | ζ is fixed in advance no search precedes it: the `select` job
    then takes the Σ_S provenance as its input, and this waits for that checkpoint."""
    if fixed_setting(config, model, task) is not None:
        checkpoints.select.get(model=model, task=task)
    with open(depth_file(model, task)) as handle:
        return json.load(handle)["num_layers"]


def select_inputs(wildcards) -> list[str]:
    """The search runs' metrics; where λ | ζ is fixed, the file that gives L when a study needs it
    (and the tuned baselines' search runs, if any)."""
    model, task = wildcards.model, wildcards.task
    depth = (
        [depth_file(model, task)]
        if fixed_setting(config, model, task) is not None and needs_depth(model, task)
        else []
    )
    return depth + [f"{run}/metrics.json" for run in search_runs(model, task)]


def planned_runs(
    model,
    task,
    chosen: Setting | None,
    tuned: Setting | None = None,
    before_checkpoints: bool = False,
) -> list[tuple[str, Setting, int]]:
    """(study, setting, seed) of the final stage and the figure studies for a model × task.

    With ``chosen`` None: only the runs that do not depend on the search's choice; with
    ``tuned`` None, none of the padding study's when it takes its own tuning;
    ``before_checkpoints``: none that wait for a checkpoint (the one-layer study's depth).
    """
    after = chosen is not None and not before_checkpoints
    runs = [
        ("final", s, seed)
        for s in final_settings(
            config, chosen, baselines_chosen(model, task) if after else None
        )
        for seed in final_seeds(model, task, replaced=after)
    ]
    for study in STUDIES:
        layers = (
            num_layers(model, task)
            if study == "single_layer"
            and chosen is not None
            and needs_depth(model, task)
            and not before_checkpoints
            else None
        )
        found = study_runs(config, study, model, task, chosen, layers, tuned)
        runs += [(study, s, seed) for s, seed in (found or [])]
    return runs


def search_runs(model, task) -> list[str]:
    """The search's runs of a model × task (beside a λ | ζ fixed in advance, only the tuned
    baselines')."""
    return [
        SEARCH_RUN.format(model=model, task=task, setting=s.name, seed=seed)
        for s in search_settings(config, model, task)
        for seed in config["search"]["seeds"]
    ]


def tuning_runs(model, task) -> list[str]:
    """The padding study's tuning runs of a model × task (search runs of its own grid)."""
    models, tasks = study_scope(config, "padding")
    if (
        not config["studies"]["padding"]["enabled"]
        or model not in models
        or task not in tasks
    ):
        return []
    return [
        SEARCH_RUN.format(model=model, task=task, setting=s.name, seed=seed)
        for s in tuning_settings(config)
        for seed in config["studies"]["padding"]["tuning"]["seeds"]
    ]


def select_args(wildcards) -> str:
    """`istar select`'s arguments: the search runs, after --fixed with the λ | ζ fixed in advance."""
    runs = " ".join(search_runs(wildcards.model, wildcards.task))
    if fixed_setting(config, wildcards.model, wildcards.task) is not None:
        fixed = json.dumps(fixed_choice_args(config, wildcards.model, wildcards.task))
        return f"--fixed '{fixed}' {runs}"
    return f"--lambda-zero {runs}" if searches_no_penalty(config) else runs


def known_measures() -> list[str]:
    """The measurement files of the runs known before the search finishes (all of them where
    λ | ζ is fixed in advance): each measure job needs its runs' models, so these bring every
    such run into the DAG (and a dry run).
    """
    # under rerun the final stage's seeds are known after its collapse_check checkpoint, which
    # brings the final runs into the DAG (COLLAPSE_CHECKS)
    return sorted(
        set().union(
            *(
                measures_files(
                    model,
                    task,
                    planned_runs(
                        model,
                        task,
                        fixed_setting(config, model, task),
                        before_checkpoints=True,
                    ),
                    skip_final=REPLACES_COLLAPSED,
                )
                for model in MODELS
                for task in TASKS
            )
        )
    )


def all_run_specs() -> list[tuple[str, str]]:
    """(study, run folder) of every run, final and studies after the search's choice."""
    specs = []
    for model in MODELS:
        for task in TASKS:
            specs += [("search", run) for run in search_runs(model, task)]
            specs += [("padding_tuning", run) for run in tuning_runs(model, task)]
            chosen = selection(model, task)
            specs += [
                (study, RUN.format(model=model, task=task, setting=s.name, seed=seed))
                for study, s, seed in planned_runs(
                    model, task, chosen, tuned_choice(model, task)
                )
            ]
    return specs


def all_measures() -> list[str]:
    """Every measurement file, after the search's choice."""
    return sorted(
        set().union(
            *(
                measures_files(
                    model,
                    task,
                    planned_runs(
                        model, task, selection(model, task), tuned_choice(model, task)
                    ),
                )
                for model in MODELS
                for task in TASKS
            )
        )
    )


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
    TUNED_SELECTION.format(model=model, task=task)
    for model in MODELS
    for task in TASKS
    if tuning_runs(model, task)
]


def aggregate_inputs(wildcards):
    runs = sorted({f"{run}/metrics.json" for _, run in all_run_specs()})
    return runs + all_measures() + SELECTIONS


TABLES = expand(
    "results/tables/{table}.{ext}",
    table=enabled_tables(config),
    ext=["csv", "md", "tex"],
)
FIGURES = expand(
    "results/figures/{figure}.{ext}", figure=enabled_figures(config), ext=["png", "pdf"]
)


def table_stability_input(wildcards) -> list[str]:
    """Fig. 2's simulation, for a table that reads it while that study is on."""
    wanted = get_table(wildcards.table).reads_stability
    enabled = config["studies"]["stability"]["enabled"]
    return [AGGREGATE.format(name=STABILITY_CSV)] if wanted and enabled else []

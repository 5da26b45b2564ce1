"""Validation of a workflow configuration: the schema (:mod:`istar.config.schema`), then pre-flight checks.

:func:`validate_config` fills in every default, checks the schema (JSON Schema 2020-12) and
then what a schema cannot say (studies naming unknown models, a mirror that does not exist,
tasks whose files the mirror lacks, hub datasets not in the cache offline, SQuAD strides,
layer indices beyond a local model's depth as read from its ``config.json``, weight files
cut short (:mod:`istar.models.files`), CosReg with λ = 0, NaN or infinite numbers, names that cannot
become file names on the common file systems: too long, or with characters they refuse). Every
problem raises :class:`ConfigError` naming the key and the allowed values, before any job runs (a
design whose seeds are too few for the signed-rank test to pass at the family's level is warned
about, :func:`istar.report.family.rank_test_warning`);
:func:`load_yaml` reports a YAML syntax error as ``FILE:LINE:COLUMN`` on one line, and refuses a
key written twice and bytes that are not UTF-8.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path, PurePosixPath

import yaml

from istar.config.gpu_slots import micro_batches_per_step
from istar.config.schema import STUDIES, ConfigError, check_schema, load_yaml
from istar.io.artifacts import name_problem
from istar.registry.compile_modes import compile_conflict
from istar.report.family import MULTIPLICITY_PLANS, rank_test_warning

__all__ = ["validate_config", "load_config", "merge_config_files", "model_depth"]


def validate_config(config: dict, check_paths: bool = True) -> dict:
    """A validated copy of ``config`` with every default filled in: the schema
    (:data:`istar.config.schema.SCHEMA_PATH`), then what it cannot say.

    Parameters
    ----------
    config : the configuration as loaded from YAML.
    check_paths : also check what lies on disk (the mirror, its files, local models).

    Raises
    ------
    ConfigError naming the first invalid key and the allowed values.
    """
    config = check_schema(config)
    models, tasks = config["models"], config["tasks"]
    # every name the config puts into a path can be a file name on the common file systems (length, characters),
    # so that no job dies writing it (`File name too long`)
    for key, what, name, fix in _path_names(config):
        if (problem := name_problem(name)) is not None:
            raise ConfigError(f"config key '{key}': {what} becomes the name {_shown(name)!r}, which {problem}; {fix}")
    for study in STUDIES:
        for model in config["studies"][study]["models"]:
            _configured(f"studies.{study}.models", model, config, "models")
        for task in config["studies"][study]["tasks"]:
            _configured(f"studies.{study}.tasks", task, config, "tasks")
    training = config["training"]
    if problem := compile_conflict(training["compile"], micro_batches_per_step(training), config["penalty"]["tokens"]):
        raise ConfigError(f"config key 'training.compile': {problem}")
    if training["replicas_as_micro_batches"] and training["gpus"] > 1 and config["penalty"]["global_penalty"]:
        raise ConfigError(f"config key 'training.replicas_as_micro_batches': one process accumulating the "
                          f"{training['gpus']} replicas' batches penalises each batch on its own, and "
                          "penalty.global_penalty penalises their union (all-reduced across processes); set "
                          "replicas_as_micro_batches to false, or global_penalty to false")
    if "squad" in tasks and training["doc_stride"] >= training["qa_max_length"] // 2:
        raise ConfigError(f"config key 'training.doc_stride': {training['doc_stride']} must be smaller than half of "
                          f"training.qa_max_length = {training['qa_max_length']}, so each window still holds the question")
    for model, tasks_fixed in config["final"]["istar"].items():
        _configured(f"final.istar.{model}", model, config, "models")
        for task, fixed in tasks_fixed.items():
            _configured(f"final.istar.{model}.{task}", task, config, "tasks")
            if fixed["lam"] == 0:
                raise ConfigError(f"config key 'final.istar.{model}.{task}.lam': λ = 0 is the baseline; fix a non-zero λ")
    search = config["search"]
    if search["tune_baselines"] and not (search["batch_sizes"] or search["epochs"] or search["learning_rates"]):
        raise ConfigError("config key 'search.tune_baselines': the baselines have nothing to be tuned on; give "
                          "search.batch_sizes, search.epochs and search.learning_rates (the training grid) or turn it off")
    for task in config["final"]["seeds_by_task"]:
        _configured(f"final.seeds_by_task.{task}", task, config, "tasks")
    padding = config["studies"]["padding"]
    if (padding["lam"] == "tuned") != (padding["zeta"] == "tuned"):
        raise ConfigError("config keys 'studies.padding.lam' and 'studies.padding.zeta': tuned goes with tuned (the "
                          "tuning grid chooses λ and ζ together); set both to tuned or neither")
    if 0.0 in padding["tuning"]["lambdas"]:
        raise ConfigError("config key 'studies.padding.tuning.lambdas': λ = 0 is the baseline, which the study runs "
                          "anyway; remove it")
    primary = config["inference"]["primary"]
    if primary is None and MULTIPLICITY_PLANS[config["inference"]["multiplicity"]].gates:
        raise ConfigError("config key 'inference.multiplicity': gatekeeping tests the declared primary first, but "
                          "inference.primary is null; declare the primary endpoint or use family")
    if primary is not None:
        _configured("inference.primary.model", primary["model"], config, "models")
        _configured("inference.primary.task", primary["task"], config, "tasks")
        if primary["contrast"] == "lambda_sweep" and not config["studies"]["lambda_sweep"]["enabled"]:
            raise ConfigError("config key 'inference.primary.contrast': lambda_sweep is the λ sweep's trend, but "
                              "studies.lambda_sweep is off; enable it or declare another contrast")
        if primary["contrast"] != "lambda_sweep" and primary["contrast"] not in config["final"]["methods"]:
            raise ConfigError(f"config key 'inference.primary.contrast': {primary['contrast']!r} has no final runs; add it "
                              "to final.methods or declare another contrast")
    if rank_warning := rank_test_warning(config):
        print(f"istar: warning: {rank_warning}", file=sys.stderr)
    if config["final"]["cosreg_lambda"] == 0:
        raise ConfigError("config key 'final.cosreg_lambda': λ = 0 turns CosReg off, so its runs would be a second baseline "
                          "labelled CosReg; give a non-zero λ (the paper's is 1.0)")
    if check_paths:
        _check_layers(config, _check_models(models))
        _check_data(config["data"], tasks)
        _check_survey(config)
    return config


def _configured(key: str, name: str, config: dict, section: str) -> None:
    """Refuse a model or task name (``section``: models | tasks) that the config does not declare."""
    if name not in config[section]:
        raise ConfigError(f"config key '{key}': {name!r} is not in '{section}' ({list(config[section])}); add it "
                          "there, or remove it here")


def _path_names(config: dict):
    """(config key, what it is, the file or folder name it becomes, the fix) for every value of the
    config that is spelled into a path (istar.config.layout), as the longest name it becomes there."""
    from istar.config.layout import MEASURES, MODEL_PIN, PROFILE, seeds_token
    from istar.pipeline.plan import study_seeds

    for name in config["models"]:
        yield f"models.{_shown(name)}", "the model's short name", PurePosixPath(MODEL_PIN.format(model=name)).name, \
            "choose a shorter name (it appears in every path of the model's results)"
    for name, entry in config["survey"]["models"].items():
        yield f"survey.models.{_shown(name)}", "the model's short name", name, "choose a shorter name"
        for revision in entry.get("revisions") or []:
            yield f"survey.models.{_shown(name)}.revisions", f"revision {_shown(revision)!r}", \
                PurePosixPath(PROFILE.format(pmodel=name, revision=revision)).name, \
                "name the revision by a shorter branch, tag or commit"
    for study in ("final", *STUDIES):
        for task in config["tasks"]:
            seeds = study_seeds(config, study, task)
            key = (f"studies.{study}.seeds" if study != "final" and config["studies"][study]["seeds"] else
                   f"final.seeds_by_task.{task}" if config["final"]["seeds_by_task"].get(task) else "final.seeds")
            yield key, f"the measurement file of these {len(seeds)} seeds", \
                PurePosixPath(MEASURES.format(model="m", task=task, setting="s", seeds=seeds_token(seeds))).name, \
                "use fewer seeds (one measurement file names every seed of a setting)"
    if "tensorboard" in config["tracking"]["trackers"]:
        yield "tracking.experiment", "the experiment (TensorBoard's folder under RUN/tracking/tensorboard)", \
            config["tracking"]["experiment"], "choose a short name of letters, digits, '.', '_' and '-'"


def _shown(name: str) -> str:
    """A name short enough to quote in a message."""
    return name if len(name) <= 40 else f"{name[:40]}…"


def model_depth(folder) -> int:
    """L, the number of transformer layers of a saved model, from ``folder/config.json``.

    Raises ValueError when the file is not a usable Hugging Face config (no ``model_type``
    or no layer count) or its architecture cannot give per-layer hidden states
    (:func:`istar.models.loading.hidden_states_problem`, remembered between processes: the reason is
    named), so a broken or unsuitable folder is caught before any job loads it.
    """
    path = Path(folder) / "config.json"
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not readable JSON ({error})") from None
    if not isinstance(settings, dict) or not settings.get("model_type"):
        raise ValueError(f"{path} names no model_type, so transformers cannot build the model: save the model "
                         "again with save_pretrained or point the key at a complete model folder")
    # BERT, ALBERT, RoBERTa: num_hidden_layers; DistilBERT: n_layers; T5-style encoders: num_layers.
    depth = next((settings[key] for key in ("num_hidden_layers", "n_layers", "num_layers") if key in settings), None)
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        raise ValueError(f"{path} gives no layer count (num_hidden_layers): not a usable encoder")
    from istar.models.loading import remembered_hidden_states_problem

    if (problem := remembered_hidden_states_problem(settings)) is not None:
        raise ValueError(f"{path}: {problem}")
    return depth


def _check_models(models: dict) -> dict[str, int]:
    """Resolve every model source; the depth L of each local one (model name → L).

    A hub id is judged only offline (``HF_HUB_OFFLINE``): then it must be in the local cache.
    """
    from istar.models.loading import check_model_available, resolve_model_source

    depths = {}
    for name, source in models.items():
        if (problem := check_model_available(source)) is not None:
            raise ConfigError(f"config key 'models.{name}': {problem}")
        try:
            resolved = Path(resolve_model_source(source))
            if resolved.is_dir():
                depths[name] = model_depth(resolved)
        except ValueError as error:
            raise ConfigError(f"config key 'models.{name}': {error}") from None
    return depths


def _check_layers(config: dict, depths: dict[str, int]) -> None:
    """Layer indices within the depth of every local model that uses them (hub models are checked in the job)."""
    chosen, single = config["penalty"]["layers"], config["studies"]["single_layer"]
    checks = []  # (config key, layer indices, the models using them, their first layer)
    if not isinstance(chosen, str):
        checks.append(("penalty.layers", [chosen] if isinstance(chosen, int) else chosen, depths, "0 (embeddings)"))
    if single["enabled"] and isinstance(single["layers"], list):
        checks.append(("studies.single_layer.layers", single["layers"], single["models"] or config["models"], "1"))
    for key, layers, models, first in checks:
        for name in models:
            too_deep = [i for i in layers if name in depths and i > depths[name]]
            if too_deep:
                raise ConfigError(f"config key '{key}': layer {too_deep[0]} does not exist in model {name!r}, "
                                  f"which has layers {first} to {depths[name]}")


def _check_data(data: dict, tasks: list[str]) -> None:
    from istar.data import missing_mirror_files

    mirror = None if data["mirror"] is None else Path(data["mirror"])
    if data["source"] == "mirror" and mirror is None:
        raise ConfigError("config key 'data.mirror': data.source is mirror but no mirror folder is named; set "
                          "data.mirror to a folder in the GLUE release layout (config/demo-data holds the demo's "
                          "rows) or use source: hub")
    if data["source"] == "mirror" and not mirror.is_dir():
        raise ConfigError(f"config key 'data.mirror': {mirror} does not exist (resolved from {Path.cwd()}) but "
                          "data.source is mirror; point it at a folder in the GLUE release layout or use source: hub")
    if data["source"] == "hub" or mirror is None or not mirror.is_dir():
        # offline (HF_HUB_OFFLINE), every task's hub dataset must be in the local cache at its revision:
        # otherwise each prepare_data job would fail, after the whole DAG was planned
        from istar.data.hub import hub_source
        from istar.io.revisions import DEFAULT_REVISION, OFFLINE_FIX, cached_commit, offline

        for task in tasks if offline() else ():
            hub_id = hub_source(task, data["hub_datasets"].get(task)).hub_id
            revision = data["hub_revisions"].get(task) or DEFAULT_REVISION
            if cached_commit(hub_id, revision, "dataset") is None:
                raise ConfigError(f"config key 'data.source': {task} comes from the hub (source {data['source']}"
                                  + (f", no mirror folder {data['mirror']}" if data["source"] == "auto" else "")
                                  + f"), but dataset {hub_id!r} at revision {revision!r} is not in the local Hugging "
                                  f"Face cache and HF_HUB_OFFLINE is set; {OFFLINE_FIX['dataset']}, or set "
                                  "data.source: mirror with data.mirror: a folder in the GLUE release layout "
                                  "(config/demo-data holds the demo's)")
        return
    if data["allow_standin"]:
        return
    for task in tasks:
        missing = missing_mirror_files(task, mirror)
        if len(missing) == 2:
            raise ConfigError(f"config key 'tasks': the mirror {mirror} has no file of {task} "
                              f"({', '.join(map(str, missing))}); remove it or use data.source: hub")
        if missing:
            raise ConfigError(f"config key 'tasks': the mirror {mirror} lacks {missing[0]} for {task}; put the file there, "
                              "use data.source: hub, or set data.allow_standin: true to split the available file into a "
                              "flagged stand-in train/validation pair")


def _check_survey(config: dict) -> None:
    """Every surveyed model × revision loadable here (the hub only judged offline), the text sample there."""
    from istar.models.loading import check_model_available, gguf_location
    from istar.registry.tasks import TASKS

    survey = config["survey"]
    for name, entry in survey["models"].items():
        key, source, revisions = f"survey.models.{name}", entry["source"], entry.get("revisions") or []
        try:
            gguf = gguf_location(source)
        except ValueError as error:
            raise ConfigError(f"config key '{key}.source': {error}") from None
        if gguf is not None or "@" in source:
            if revisions:
                raise ConfigError(f"config key '{key}.revisions': {source!r} has no hub revisions; "
                                  "list revisions only for a Hugging Face id")
            if "@" in source:
                raise ConfigError(f"config key '{key}.source': give revisions under '{key}.revisions', not as @REVISION")
            continue
        for revision in revisions or [None]:
            if (problem := check_model_available(f"{source}@{revision}" if revision else source)) is not None:
                raise ConfigError(f"config key '{key}': {problem}")
    text = survey["text"]
    if survey["models"] and text not in TASKS and not Path(text).is_file():
        raise ConfigError(f"config key 'survey.text': {text!r} is neither a task key ({', '.join(TASKS)}) nor an "
                          f"existing text file (resolved from {Path.cwd()})")
    if text in TASKS and survey["models"]:
        _check_data(config["data"], [text])


def load_config(path, check_paths: bool = True) -> dict:
    """Read a YAML config file and validate it."""
    return validate_config(load_yaml(path), check_paths=check_paths)


def add_cli_arguments(parser) -> None:
    parser.add_argument("configfiles", nargs="+", help="YAML config file(s); later ones update earlier ones")
    parser.add_argument("--out", help="write the validated configuration, every default filled in, to this YAML file")
    parser.add_argument("--no-path-checks", dest="check_paths", action="store_false",
                        help="skip the checks of the mirror, its files and local models")


def _merge(base: dict, update: dict) -> dict:
    for key, value in update.items():
        base[key] = _merge(base.get(key, {}), value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return base


def merge_config_files(paths) -> dict:
    """Config files merged in order, later ones updating earlier ones key by key, as Snakemake merges
    several ``--configfile`` (not yet validated)."""
    return functools.reduce(_merge, map(load_yaml, paths), {})


def run_cli(args) -> int:
    """``istar config``: validate config file(s) (merged in order, as Snakemake does) and print or write the result."""
    config = validate_config(merge_config_files(args.configfiles), check_paths=args.check_paths)
    text = yaml.safe_dump(config, sort_keys=False)
    if args.out:
        from istar.io import artifacts

        artifacts.write_text(args.out, text)
        print(f"valid: {', '.join(args.configfiles)} -> {args.out}")
    else:
        print(text, end="")
    return 0

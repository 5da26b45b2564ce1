"""The job table (istar.pipeline.jobs): every job of a model × task once, each path written in one place."""

import json
import shlex
import re

from istar.config.layout import Setting
from istar.config.schema import load_yaml
from istar.pipeline.jobs import Decided, plan_cell
from istar.pipeline.validate import validate_config
from mirrors import REPO



def _paper() -> dict:
    return validate_config(load_yaml(REPO / "config/paper.yaml"), check_paths=False)


def test_every_output_and_log_belongs_to_one_job():
    config = _paper()
    decided = Decided(selection=Setting("istar", lam=-1.0, zeta=0.2, tokens=config["penalty"]["tokens"]), depth=12)
    plan = plan_cell(config, "bert", "rte", decided)
    outputs = [path for job in plan.jobs for path in job.outputs]
    logs = [job.log for job in plan.jobs]
    assert len(outputs) == len(set(outputs)) and len(logs) == len(set(logs))
    assert all(plan.job(path) is job for job in plan.jobs for path in job.outputs)
    # every file a job needs is written by a job of the table, and every measured run is a run of the plan
    assert {path for job in plan.jobs for path in job.needs} <= set(outputs)
    assert {f"{run}/metrics.json" for _, run in plan.runs} <= set(outputs)
    assert {job.rule for job in plan.jobs} == {"shrinkage", "shrinkage_all_positions", "train_search", "select",
                                               "train", "measure"}


def test_the_spec_comes_from_the_plan_not_from_the_folder_name():
    config = _paper()
    chosen = Setting("istar", lam=-3.0, zeta=0.4, tokens=config["penalty"]["tokens"])
    plan = plan_cell(config, "bert", "rte", Decided(selection=chosen))
    job = plan.job(f"results/runs/bert/rte/{chosen.name}/seed0/metrics.json")
    assert (job.spec.lam, job.spec.zeta, job.spec.seed) == (-3.0, 0.4, 0)
    assert job.spec.sigma_s in job.needs and plan.job(job.spec.sigma_s).rule == "shrinkage_all_positions"


def test_jobs_that_wait_for_a_decision_are_not_planned_before_it():
    config = _paper()
    chosen = Setting("istar", lam=-3.0, zeta=0.4, tokens=config["penalty"]["tokens"])
    before = plan_cell(config, "bert", "rte", Decided(replacements=None))
    chosen_runs = plan_cell(config, "bert", "rte", Decided(selection=chosen, replacements=None))
    seeded = plan_cell(config, "bert", "rte", Decided(selection=chosen, replacements=()))
    outputs = [{path for job in plan.jobs for path in job.outputs} for plan in (before, chosen_runs, seeded)]
    assert outputs[0] < outputs[1] < outputs[2]
    # the search's choice brings its runs; the seeds (inference.collapsed_runs: rerun) bring the final stage's
    # measurements, and nothing else
    assert f"results/runs/bert/rte/{chosen.name}/seed0/metrics.json" in outputs[1] - outputs[0]
    assert not any(chosen.name in path for path in outputs[0] if path.startswith("results/runs/"))
    added = {seeded.job(path).rule for path in outputs[2] - outputs[1]}
    assert added == {"measure"}


def test_a_fixed_selection_is_recorded_as_its_command():
    config = validate_config(load_yaml(REPO / "config/paper.yaml") | {
        "final": {**load_yaml(REPO / "config/paper.yaml")["final"], "istar": {"bert": {"rte": {"lam": -1, "zeta": 0.2}}}}},
        check_paths=False)
    select = plan_cell(config, "bert", "rte", Decided()).job("results/selection/bert/rte/best.json")
    fixed = json.loads(select.args[3])
    assert select.argv == ("select", "--out", "results/selection/bert/rte/best.json", "--fixed", select.args[3])
    assert fixed["lam"] == -1.0 and select.recorded == shlex.join(select.argv) and not select.launched


def test_the_rules_spell_no_path_of_the_job_table():
    # logs and outputs of the table's jobs come from istar.config.layout; a literal in a rule file would be a
    # second copy
    literal = re.compile(r'"(logs|benchmarks)/(finetune|finetune_search|measure|shrinkage|select|select_tuned)/')
    rules = {path.name: path.read_text(encoding="utf-8") for path in (REPO / "workflow/rules").glob("*.smk")}
    assert {name: literal.findall(text) for name, text in rules.items() if literal.search(text)} == {}

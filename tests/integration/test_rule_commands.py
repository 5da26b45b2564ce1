"""Each rule runs its job's command: the commands a Snakemake dry run of the paper's config prints, job by job,
are those the job table (istar.pipeline.jobs) holds for the same outputs, with the GPUs the table gives."""

import re
import shlex

from istar.config.schema import load_yaml
from istar.pipeline.jobs import before_decisions, plan_cell, report_jobs, step_gpus
from istar.pipeline.validate import validate_config
from mirrors import REPO
from workflow_helpers import ENV, snakemake


def _printed_jobs(output: str) -> dict[str, str]:
    """First output → shell command, of every job a dry run (``-n -p``) prints."""
    jobs = {}
    for block in output.split("\n\n"):
        first = re.search(r"^    output: ([^,\n]+)", block, re.MULTILINE)
        shell = re.search(r"^Shell command: (.*)$", block, re.MULTILINE)
        if first and shell:
            jobs[first.group(1)] = shell.group(1)
    return jobs


def test_every_rule_runs_the_command_of_its_job(tmp_path):
    configfile = REPO / "config" / "paper.yaml"
    # as on a machine with internet and an empty cache: planning never reaches the hub
    online = {**{k: v for k, v in ENV.items() if k != "HF_HUB_OFFLINE"}, "HF_HOME": str(tmp_path / "hf")}
    result = snakemake(tmp_path, "-n", "-p", "--cores", "8", "--resources", "gpu=2", configfile=configfile, env=online)
    assert result.returncode == 0, result.stdout[-3000:]
    printed = _printed_jobs(result.stdout)
    config = validate_config(load_yaml(configfile), check_paths=False)
    table = [job for model in config["models"] for task in config["tasks"]
             for job in plan_cell(config, model, task, before_decisions(config, model, task)).jobs]
    compared = 0
    for job in [*table, *report_jobs(config)]:
        command = printed.get(job.outputs[0])
        if command is None:  # a job the targets do not ask for (a Σ_S no run reads, a table not enabled)
            continue
        argv = shlex.join(job.argv)
        if job.launched:
            assert f"python -m istar launch --gpus {step_gpus(config, job.step)} -- {argv} > {job.log} 2>&1" in command
        else:
            assert command == f"python -m istar {argv} > {job.log} 2>&1"
        compared += 1
    # every training, Σ_S, selection and report job the dry run plans before the search's choice
    rules = {job.rule for job in [*table, *report_jobs(config)] if job.outputs[0] in printed}
    assert {"train_search", "shrinkage", "select", "table", "figure", "summary", "experiment"} <= rules
    assert compared > 1000

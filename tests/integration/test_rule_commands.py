"""Each rule runs its job's command with its job's resources: the commands and resources a Snakemake dry run of the
paper's config prints, job by job, are those the job table (istar.pipeline.jobs) holds for the same outputs."""

import re
import shlex

from istar.config.schema import load_yaml
from istar.config.gpu_slots import gpu_units, packed_threads
from istar.pipeline.jobs import before_decisions, plan_cell, report_jobs
from istar.pipeline.validate import validate_config
from mirrors import REPO
from workflow_helpers import ENV, snakemake


def _printed_jobs(output: str) -> dict[str, tuple[str, dict]]:
    """First output → (shell command, resources), of every job a dry run (``-n -p``) prints."""
    jobs = {}
    for block in output.split("\n\n"):
        first = re.search(r"^    output: ([^,\n]+)", block, re.MULTILINE)
        shell = re.search(r"^Shell command: (.*)$", block, re.MULTILINE)
        resources = re.search(r"^    resources: (.*)$", block, re.MULTILINE)
        if first and shell:
            jobs[first.group(1)] = shell.group(1), dict(item.split("=", 1) for item in resources.group(1).split(", "))
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
    jobs_per_gpu = config["training"]["jobs_per_gpu"]
    threads = packed_threads(config["training"]["threads"], 8, 2 * jobs_per_gpu)  # --cores 8, gpu=2 → 2K slots
    compared = 0
    for job in [*table, *report_jobs(config)]:
        if job.outputs[0] not in printed:  # a job the targets do not ask for (a Σ_S no run reads, a table not enabled)
            continue
        command, resources = printed[job.outputs[0]]
        argv = shlex.join(job.argv)
        if job.launched:
            units = gpu_units(job.resources.gpus, jobs_per_gpu)
            assert command == f"OMP_NUM_THREADS={threads} python -m istar launch --gpus {units} -- {argv} > {job.log} 2>&1"
            assert (resources["gpu"], resources["mem_mb"], resources["runtime"]) == (
                str(units), str(job.resources.mem_mb), str(job.resources.runtime))
        else:
            assert command == f"python -m istar {argv} > {job.log} 2>&1"
        compared += 1
    # every training, Σ_S, selection and report job the dry run plans before the search's choice
    rules = {job.rule for job in [*table, *report_jobs(config)] if job.outputs[0] in printed}
    assert {"train_search", "shrinkage", "select", "table", "figure", "summary", "experiment"} <= rules
    assert compared > 1000

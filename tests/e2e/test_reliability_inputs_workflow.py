"""Damaged inputs and silent wrong results that only Snakemake shows (issue 24): a changed source
file of prepare_data, and hub data missing from the cache offline. The other cases are in
tests/fast/test_reliability_inputs.py and tests/integration/test_reliability_inputs.py."""

import shutil
import subprocess
import sys

from workflow_helpers import ENV, REPO, planned_jobs, snakemake, write_project

from istar.config.schema import load_yaml

DEMO_DATA = REPO / "config" / "demo-data"


def default_config() -> dict:
    config = load_yaml(REPO / "config" / "config.yaml")
    config["data"]["mirror"] = str(DEMO_DATA)
    return config


def test_a_changed_source_file_reruns_prepare_data(tmp_path):
    project = tmp_path / "project"
    shutil.copytree(DEMO_DATA, project / "demo-data")
    config = default_config()
    config["data"]["mirror"] = "demo-data"
    write_project(project, config)
    target = "resources/data/rte/meta.json"
    built = snakemake(project, "--cores", "1", target)
    assert built.returncode == 0, built.stderr[-3000:]
    assert planned_jobs(snakemake(project, "-n", target).stdout) == {}
    labels = project / "demo-data" / "glue" / "RTE" / "train.tsv"
    labels.write_text(labels.read_text().replace("\tentailment\n", "\tnot_entailment\n", 1))  # one label flipped
    assert planned_jobs(snakemake(project, "-n", target).stdout) == {"prepare_data": 1}


def test_hub_data_not_in_the_cache_offline_fails_before_any_job(tmp_path):
    config = default_config()
    config["data"]["source"] = "hub"
    project = tmp_path / "project"
    configfile = write_project(project, config)
    offline = {**ENV, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "empty-hf")}
    expected = ("config key 'data.source': rte comes from the hub (source hub), but dataset 'nyu-mll/glue' at "
                "revision 'main' is not in the local Hugging Face cache and HF_HUB_OFFLINE is set")
    result = subprocess.run([sys.executable, "-m", "istar", "config", configfile], env=offline, cwd=project,
                            capture_output=True, text=True, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and expected in lines[0], result.stderr[-2000:]
    planned = snakemake(project, "--cores", "1", env=offline)
    assert planned.returncode != 0 and expected in planned.stderr, planned.stderr[-3000:]
    assert planned_jobs(planned.stdout + planned.stderr) == {}  # nothing planned, nothing started
    assert "resumes from its last saved state" not in planned.stderr

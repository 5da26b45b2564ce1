"""The workflow deployed as a Snakemake module, as `snakedeploy deploy-workflow` writes it (issue 34):
a project folder of its own with config/config.yaml and a workflow/Snakefile that declares the
workflow as a module and uses all its rules. snakedeploy names the source with `github(…, tag=…)`;
here the same kind of source comes from this repository's git history (`gitfile`, its committed
HEAD), so the module's files are read from git, not from a folder, as from GitHub. istar is imported
from the environment that runs Snakemake (the Snakefile's error names the fix where it is not)."""

import json
import shutil
import subprocess

import pytest
import yaml
from workflow_helpers import ENV, REPO, SNAKEMAKE, load_test_config, planned_jobs, save_tiny_model

DEPLOYED_SNAKEFILE = """\
from snakemake.utils import min_version


min_version("6.10.0")


configfile: "config/config.yaml"


# declare istar as a module
module istar:
    snakefile:
        gitfile("{repo}", path="workflow/Snakefile", ref="HEAD")
    config:
        config


# use all rules from istar
use rule * from istar
"""


def deployed(folder, config):
    (folder / "workflow").mkdir(parents=True)
    (folder / "config").mkdir()
    (folder / "workflow" / "Snakefile").write_text(DEPLOYED_SNAKEFILE.format(repo=REPO))
    (folder / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


def run(folder, *args, timeout=900):
    # no --snakefile, no --configfile: as in a deployed project, workflow/Snakefile and its configfile
    return subprocess.run([SNAKEMAKE, *args], cwd=folder, env=ENV, capture_output=True, text=True, timeout=timeout)


def test_the_workflow_runs_as_a_module_from_another_folder(tmp_path):
    if shutil.which("git") is None:
        pytest.fail("git is needed to read the module from this repository's history")
    config = load_test_config("tiny", model_dir=save_tiny_model(tmp_path / "tiny-bert"))
    project = deployed(tmp_path / "deployment", config)

    dry = run(project, "-n")
    assert dry.returncode == 0, dry.stderr[-4000:]
    # the same jobs as the workflow run from its own checkout with the same config
    (tmp_path / "direct").mkdir()
    (tmp_path / "direct" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    direct = run(tmp_path / "direct", "-n", "--snakefile", str(REPO / "workflow" / "Snakefile"),
                 "--configfile", "config.yaml")
    assert direct.returncode == 0, direct.stderr[-4000:]
    jobs = planned_jobs(dry.stdout)
    assert jobs == planned_jobs(direct.stdout) and jobs["train"] > 0 and jobs["report"] == 1, (jobs, dry.stdout[-3000:])

    # one real job from the deployment: the task's data, through the module's rule and `python -m istar`
    real = run(project, "--cores", "1", "resources/data/rte/meta.json")
    assert real.returncode == 0, real.stderr[-4000:]
    meta = json.loads((project / "resources" / "data" / "rte" / "meta.json").read_text())
    assert meta["task"] == "rte" and meta["rows"] == {"train": 32, "validation": 24}
    assert (project / "logs" / "prepare_data" / "rte.log").is_file()

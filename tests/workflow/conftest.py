"""The finished tiny project the workflow tests share (tests/workflow/test_reliability_rebuild.py and
tests/workflow/test_workflow.py): built once per session, since a run of it takes minutes. A test that
changes it leaves it finished and up to date with its config.yaml again."""

import pytest
from workflow_helpers import save_tiny_model, snakemake, write_project


@pytest.fixture(scope="session")
def tiny_project(tmp_path_factory):
    """A tiny workflow project (.test/config/tiny.yaml) run to completion once (a few minutes on 2 cores)."""
    workdir = tmp_path_factory.mktemp("tiny-project")
    save_tiny_model(workdir / "tiny-bert")  # .test/config/tiny.yaml's model folder
    write_project(workdir)
    result = snakemake(workdir, "--cores", "2")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    return workdir

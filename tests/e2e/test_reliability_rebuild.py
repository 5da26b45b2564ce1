"""The workflow never reports a run it does not have (issue 33): a run folder deleted by hand, a
fine-tuning job interrupted by Ctrl-C (Snakemake then removes its outputs), and a lost Σ_S file,
selection or measurement are planned again by the next `snakemake` (a dry run shows exactly them
and what depends on them), rebuilt (the interrupted run resumes from its saved state), and the
workflow ends with every declared output present; where they cannot be rebuilt, it stops before
any job and names them.

Every test runs on the finished tiny project of tests/conftest.py and leaves it
finished and up to date.
"""

import os
import shutil
import signal
import subprocess
import time

import pytest
from workflow_helpers import ENV, REPO, SNAKEMAKE, missing_outputs, planned_jobs, planned_outputs, snakemake


BASE = "results/runs/tiny/rte/base/seed0"
COSREG = "results/runs/tiny/rte/cosreg_lam1/seed0"


def forced_plan(project, path: str) -> list[tuple[str, str]]:
    """What a dry run plans when ``path`` is forced: its job and everything that depends on it."""
    dry = snakemake(project, "-n", "--forcerun", path)
    assert dry.returncode == 0, dry.stderr[-3000:]
    return planned_outputs(dry.stdout)


def rebuilt(project) -> None:
    """The next plain `snakemake` finishes, every declared output is there, and nothing is left to do."""
    done = snakemake(project, "--cores", "2")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    assert missing_outputs(project) == []
    assert planned_jobs(snakemake(project, "-n").stdout) == {}


def test_a_deleted_run_folder_is_planned_again_and_rebuilt(tiny_project):
    expected = forced_plan(tiny_project, f"{BASE}/metrics.json")
    assert ("train", f"{BASE}/metrics.json, {BASE}/model") in expected
    shutil.rmtree(tiny_project / BASE)  # rm -r, by hand
    dry = snakemake(tiny_project, "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert planned_outputs(dry.stdout) == expected  # exactly that run and what depends on it
    assert (f"istar: planned again, with what was built from them, because they are missing (interrupted or "
            f"deleted): {BASE}/metrics.json, {BASE}/model; a fine-tuning job resumes from its saved state where one "
            "matches") in dry.stderr

    # a run that cannot be rebuilt here (its rule is not allowed) stops the workflow before any job
    refused = snakemake(tiny_project, "--cores", "2", "--allowed-rules", "aggregate", "table", "figure", "report")
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert (f"{BASE}/metrics.json, {BASE}/model: missing (interrupted or deleted) although later results were built "
            "from them, and their rule (train) is not among --allowed-rules, so the tables would report results that "
            "no longer exist: run without --allowed-rules, or allow train; no job was started") in text, text[-3000:]
    assert "Finished job" not in text and not (tiny_project / BASE).exists()

    rebuilt(tiny_project)


def test_an_interrupted_fine_tuning_job_is_planned_again_and_resumes(tiny_project):
    run = tiny_project / COSREG
    expected = forced_plan(tiny_project, f"{COSREG}/metrics.json")
    # Ctrl-C in the terminal: SIGINT to Snakemake's process group while `istar train` trains
    command = [SNAKEMAKE, "--snakefile", str(REPO / "workflow" / "Snakefile"), "--directory", str(tiny_project),
               "--configfile", str(tiny_project / "config.yaml"), "--cores", "1", "--forcerun", f"{COSREG}/metrics.json"]
    process = subprocess.Popen(command, cwd=tiny_project, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    deadline = time.monotonic() + 900
    while not (run / "resume" / "train_log.csv").is_file():  # the first optimizer step is logged
        assert process.poll() is None, process.stdout.read()[-5000:]
        assert time.monotonic() < deadline, "the fine-tuning job never trained"
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=600)
    assert process.returncode != 0, output[-5000:]
    states = sorted((run / "resume").glob("state-*/COMPLETE"))
    assert states, output[-5000:]
    assert not (run / "metrics.json").exists() and not (run / "model").exists()  # Snakemake removed them

    dry = snakemake(tiny_project, "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert planned_outputs(dry.stdout) == expected
    rebuilt(tiny_project)
    log = (tiny_project / "logs" / "finetune" / "tiny" / "rte" / "cosreg_lam1" / "seed0.log").read_text()
    assert f"resuming from {COSREG}/resume/{states[-1].parent.name}" in log
    assert not (run / "resume").exists()


@pytest.mark.parametrize("path", [
    "resources/shrinkage/tiny/rte/sigma0.pt",                      # Σ_S: the runs and measurements that read it
    "results/measures/tiny/rte/base/seeds0.json",                  # a measurement: the aggregates and all after
    "results/selection/tiny/rte/best.json",                        # the search's choice
    "results/runs/tiny/rte/istar_lam-1_zeta0.2/seed0/model",       # a run known only after the choice
], ids=["sigma", "measurement", "selection", "post-selection-model"])
def test_every_artifact_a_table_depends_on_is_planned_again(path, tiny_project, tmp_path):
    expected = forced_plan(tiny_project, path)
    kept = tmp_path / "kept"
    shutil.move(tiny_project / path, kept)
    try:
        dry = snakemake(tiny_project, "-n")
        assert dry.returncode == 0, dry.stderr[-3000:]
        assert planned_outputs(dry.stdout) == expected
    finally:
        shutil.move(kept, tiny_project / path)  # as it was: the project stays finished
    assert planned_jobs(snakemake(tiny_project, "-n").stdout) == {}

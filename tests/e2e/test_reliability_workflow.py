"""Reliability of the Snakemake workflow on a tiny project (issue 11, cases 3 and 5).

One slow test, one small project run once: an interrupted post-checkpoint job is not
accepted as finished, and a damaged input of the jobs to run stops the run before any job
starts, so the failed rerun deletes nothing.
"""

import os
import signal
import subprocess
import time
from base64 import urlsafe_b64decode
from pathlib import Path

from workflow_helpers import (
    ENV,
    REPO,
    SNAKEMAKE,
    load_test_config,
    planned_jobs,
    save_tiny_model,
    snakemake,
    write_project,
)


ISTAR_RUN = "results/runs/tiny/rte/istar_lam{lam}_zeta0.2/seed0"


def incomplete_marks(workdir: Path) -> set[str]:
    """Outputs Snakemake marked incomplete (file names: url-safe base64 of the path, '@'-chunked)."""
    marks = set()
    for folder, _, names in os.walk(workdir / ".snakemake" / "incomplete"):
        chunks = [part[1:] for part in Path(folder).relative_to(workdir / ".snakemake" / "incomplete").parts
                  if part.startswith("@")]
        marks.update(urlsafe_b64decode("".join(chunks) + name).decode() for name in names
                     if name != "migration_underway")
    return marks


def training(run: str) -> bool:
    """Whether a process of the fine-tuning job of ``run`` is running."""
    return bool(subprocess.run(["pgrep", "-f", f"output_dir.*{run}"], capture_output=True).stdout)


def snapshot(workdir: Path) -> dict[str, int]:
    return {str(p.relative_to(workdir)): p.stat().st_size for root in ("resources", "results")
            for p in (workdir / root).rglob("*") if p.is_file()}


def test_interrupted_post_checkpoint_run_and_damaged_input(tmp_path):
    # .test/config/reliability.yaml: the tiny config cut to one search setting and no study (about 15 jobs)
    save_tiny_model(tmp_path / "tiny-bert")
    write_project(tmp_path, load_test_config("reliability"))
    istar_run = ISTAR_RUN.format(lam=-1)

    # 1. Snakemake dies (SIGKILL: a closed session, a lost login node) while the post-checkpoint
    #    I-STAR run trains; the job runs on and finishes, its incomplete mark stays. (SIGINT is
    #    not used: in the full suite Snakemake sometimes carried on to the end of the workflow.)
    command = [SNAKEMAKE, "--snakefile", str(REPO / "workflow" / "Snakefile"), "--directory", str(tmp_path),
               "--configfile", str(tmp_path / "config.yaml"), "--cores", "1"]
    process = subprocess.Popen(command, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    deadline = time.monotonic() + 900
    while not (f"{istar_run}/metrics.json" in incomplete_marks(tmp_path) and training(istar_run)):
        assert process.poll() is None, process.stdout.read()[-5000:]
        assert time.monotonic() < deadline, "the post-checkpoint I-STAR run never started"
        time.sleep(0.5)
    process.send_signal(signal.SIGKILL)
    snakemake_output, _ = process.communicate(timeout=600)
    for _ in range(600):
        if not training(istar_run):
            break
        time.sleep(1)
    assert f"{istar_run}/metrics.json" in incomplete_marks(tmp_path), snakemake_output[-5000:]
    unlocked = snakemake(tmp_path, "--unlock")  # what Snakemake asks for after it was killed
    assert unlocked.returncode == 0, unlocked.stderr[-3000:]
    # Snakemake itself checks incomplete marks before the post-checkpoint jobs exist (so its dry
    # run still lists nothing for this run); the workflow's onstart repeats the check on the
    # whole DAG before any job starts. Without --rerun-incomplete: Snakemake's own refusal.
    metrics = tmp_path / istar_run / "metrics.json"
    interrupted = metrics.stat().st_mtime_ns if metrics.is_file() else None
    refused = snakemake(tmp_path, "--cores", "2", "--workflow-profile", "none")
    assert refused.returncode != 0
    assert "--rerun-incomplete" in refused.stderr and f"{istar_run}/metrics.json" in refused.stderr, \
        refused.stderr[-3000:]
    assert "Finished job" not in refused.stdout + refused.stderr
    # The default profile sets rerun-incomplete: the plain command trains that run again.
    finished = snakemake(tmp_path, "--cores", "2")
    assert finished.returncode == 0, finished.stdout[-5000:] + finished.stderr[-5000:]
    assert metrics.stat().st_mtime_ns != interrupted, "the interrupted run was not trained again"
    assert not incomplete_marks(tmp_path)
    assert planned_jobs(snakemake(tmp_path, "-n").stdout) == {}

    # 2. A truncated train.parquet (with a new timestamp). The rules take a prepared folder
    # through its meta.json, so its timestamp makes nothing look outdated; the jobs asked to run
    # again (here every fine-tuning run) have their inputs checked, the splits meta.json lists
    # included, before any of them starts.
    before = snapshot(tmp_path)
    parquet = tmp_path / "resources/data/rte/train.parquet"
    parquet.write_bytes(parquet.read_bytes()[:200])
    assert planned_jobs(snakemake(tmp_path, "-n").stdout) == {}
    failed = snakemake(tmp_path, "--cores", "2", "--forcerun", "train")
    assert failed.returncode != 0
    text = failed.stdout + failed.stderr
    assert "resources/data/rte/train.parquet is damaged" in text, text[-3000:]
    assert "snakemake --forcerun resources/data/rte/train.parquet" in text
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k != "resources/data/rte/train.parquet"} == \
        {k: v for k, v in before.items() if k != "resources/data/rte/train.parquet"}
    # The remedy the message names repairs the split: the data made again, and a job after it reads
    # it (Σ_S; the rest of the workflow would retrain as after any change of the data).
    sigma = "resources/shrinkage/tiny/rte/sigma0.pt"
    rebuilt = snakemake(tmp_path, "--cores", "2", sigma, "--forcerun", "resources/data/rte/train.parquet")
    assert rebuilt.returncode == 0, rebuilt.stdout[-5000:] + rebuilt.stderr[-5000:]
    assert planned_jobs(rebuilt.stdout + rebuilt.stderr) == {"prepare_data": 1, "shrinkage": 1}, rebuilt.stderr[-3000:]
    assert parquet.stat().st_size > 200 and (tmp_path / sigma).stat().st_mtime_ns > parquet.stat().st_mtime_ns

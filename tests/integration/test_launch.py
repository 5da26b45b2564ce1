"""`istar launch`: GPU claims that cannot deadlock, a scheduler's CUDA_VISIBLE_DEVICES taken as
given, a request for more GPUs than exist refused in one line, and a stop signal that reaches the
step behind accelerate's process (issue 34). The claims need no GPU: `claim_gpus` takes the
count, the GPUs' names and the lock folder, and the command line finds its lock folder through TMPDIR."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mirrors import REPO
from processes import processes_naming

from istar.steps.launch import SAVE_GRACE_SECONDS, child_environment, claim_gpus

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
ISTAR = (sys.executable, "-m", "istar")

CONTENDER = """\
import sys, time
from istar.steps.launch import claim_gpus
print("claiming", flush=True)
with claim_gpus(2, ["0", "1"], sys.argv[1], poll_seconds=float(sys.argv[2])) as gpus:
    print("claimed", gpus, flush=True)
    time.sleep(0.2)
"""


def contender(lock_dir: Path, poll_seconds: float) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", CONTENDER, str(lock_dir), str(poll_seconds)], env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "claiming\n"
    return process


def test_two_jobs_that_each_want_every_gpu_both_finish(tmp_path):
    """The interleaving that deadlocks a claim which keeps the GPUs it has while it waits for more:
    A (slow to retry) finds GPU 0 taken by a 1-GPU job and could keep GPU 1; B (quick to retry) takes
    GPU 0 the moment that job ends. All-or-nothing claims leave A nothing to keep."""
    with claim_gpus(1, ["0"], tmp_path):  # a 1-GPU job on GPU 0
        a = contender(tmp_path, poll_seconds=2.0)
        time.sleep(0.5)  # A's first attempt is made
        b = contender(tmp_path, poll_seconds=0.05)
        time.sleep(0.5)
        assert a.poll() is None and b.poll() is None, "a claim went through while GPU 0 was held"
    # B's next attempt comes within 0.05 s, long before A's
    try:
        outputs = [process.communicate(timeout=30) for process in (a, b)]
    except subprocess.TimeoutExpired:
        pytest.fail("the two claims deadlocked: each holds a GPU the other waits for")
    finally:
        for process in (a, b):
            if process.poll() is None:
                process.kill()
                process.wait()
    for process, (stdout, stderr) in zip((a, b), outputs):
        assert process.returncode == 0, stderr
        assert stdout == "claimed ['0', '1']\n"


def test_a_waiting_claim_holds_no_gpu(tmp_path):
    with claim_gpus(1, ["0"], tmp_path) as held:
        assert held == ["0"]
        waiting = contender(tmp_path, poll_seconds=0.05)
        time.sleep(0.5)
        assert waiting.poll() is None
        # GPU 1 is free for another job while the 2-GPU claim waits (a claim that keeps what it has would hold it)
        with claim_gpus(1, ["0", "1"], tmp_path, poll_seconds=0.01) as other:
            assert other == ["1"]
    stdout, _ = waiting.communicate(timeout=30)
    assert stdout == "claimed ['0', '1']\n"


def test_asking_for_more_gpus_than_exist_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^the job asks for 3 GPU\(s\) but this machine shows 2; "):
        with claim_gpus(3, ["0", "1"], tmp_path):
            pass
    shown = torch.cuda.device_count()
    env = {key: value for key, value in ENV.items() if key != "CUDA_VISIBLE_DEVICES"}
    result = subprocess.run([*ISTAR, "launch", "--gpus", str(shown + 1), "--", "train", "--spec", "{}"],
                            env={**env, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"istar launch: error: the job asks for {shown + 1} GPU(s) but this machine shows {shown}; lower "
        f"training.gpus (or --resources gpu=N), or run it where {shown + 1} GPU(s) are visible"]
    assert "launching" not in result.stdout


def test_a_preset_cuda_visible_devices_is_taken_as_given(tiny_model_dir, prepared, tmp_path):
    assert child_environment(2, {"CUDA_VISIBLE_DEVICES": "3,5"})["CUDA_VISIBLE_DEVICES"] == "3,5"
    assert child_environment(2, {"CUDA_VISIBLE_DEVICES": "3,5"})["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == str(
        SAVE_GRACE_SECONDS)
    assert child_environment(0, {"CUDA_VISIBLE_DEVICES": "3,5"})["CUDA_VISIBLE_DEVICES"] == ""
    # As SLURM sets it: no claim is made (every lock is held here, and this machine may show no GPU).
    out = tmp_path / "sigma.pt"
    with claim_gpus(1, ["0"], tmp_path):
        result = subprocess.run(
            [*ISTAR, "launch", "--gpus", "1", "--", "shrinkage", "--model", str(tiny_model_dir), "--data",
             str(prepared("rte")), "--rows", "1000", "--max-length", "32", "--out", str(out)],
            env={**ENV, "TMPDIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": "7", "OMP_NUM_THREADS": "1"},
            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("launching on GPU(s) 7 (CUDA_VISIBLE_DEVICES as given): ")
    assert out.is_file()
    # one naming fewer devices than the job asks for is refused, in one line
    refused = subprocess.run([*ISTAR, "launch", "--gpus", "2", "--", "train", "--spec", "{}"],
                             env={**ENV, "CUDA_VISIBLE_DEVICES": "0"}, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "istar launch: error: the job asks for 2 GPU(s) but CUDA_VISIBLE_DEVICES='0' names fewer; ask the scheduler "
        "for 2 GPU(s), or unset CUDA_VISIBLE_DEVICES to let istar claim them"]


def test_a_stop_signal_reaches_the_step_behind_accelerate_and_the_launcher_waits_for_its_save(
        tiny_model_dir, prepared, tmp_path):
    """On one GPU the step runs under `accelerate launch`, which dies of SIGTERM at once: the launcher
    signals the whole group, so the step saves a state, and ends only after it (SLURM ends a job step
    with its first process, and would cut the save short)."""
    out = tmp_path / "run"
    launcher = subprocess.Popen(
        [*ISTAR, "launch", "--gpus", "1", "--", "train", "--model", str(tiny_model_dir), "--data",
         str(prepared("rte", 96, 16)), "--out", str(out), "--epochs", "3", "--batch-size", "4", "--max-length", "32",
         "--shrinkage-rows", "1000", "--checkpoint-every", "0"],
        env={**ENV, "CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (out / "resume" / "train_log.csv").is_file():
        assert launcher.poll() is None, launcher.communicate()
        assert time.time() < deadline, "no optimizer step after 300 s"
        time.sleep(0.02)
    launcher.send_signal(signal.SIGTERM)  # to the launcher alone, not its group
    _, stderr = launcher.communicate(timeout=300)
    assert launcher.returncode == 143, stderr[-3000:]
    assert processes_naming(str(out)) == [], "the step outlived its launcher"
    assert "istar train: stopped by SIGTERM after optimizer step" in stderr
    assert not (out / "metrics.json").exists()
    assert list((out / "resume").glob("state-*/COMPLETE"))

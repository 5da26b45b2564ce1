"""Faults a cluster and a shared disk deliver (issue 24): signals, one writer per run folder,
full disks, read-only outputs and damaged resume states, each on a real tiny run.

Full disks are real: a small tmpfs mounted for the test (root only; skipped otherwise).
Read-only folders are a read-only bind mount as root (``chmod`` does not stop root), a
``chmod 0555`` folder otherwise.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from mirrors import REPO
from processes import processes_naming
from reliability_faults_helpers import _mount, small_disk

from istar.io import artifacts
from istar.io.runlock import LOCK_NAME, FolderLockedError, writer_lock

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
ISTAR = (sys.executable, "-m", "istar")


def train_args(model, data, out, *extra):
    """A tiny CosReg run: 96 rows in 12 optimizer steps per epoch, 2 epochs."""
    return ["train", "--model", model, "--data", data, "--out", out, "--method", "cosreg", "--lam", 1, "--epochs", 2,
            "--batch-size", 8, "--max-length", 48, "--shrinkage-rows", 1000, "--checkpoint-every", 0, *extra]


def istar(*args, timeout=600):
    return subprocess.run([*ISTAR, *map(str, args)], env=ENV, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def start(*args, launcher=ISTAR, output=subprocess.PIPE):
    return subprocess.Popen([*launcher, *map(str, args)], env=ENV, cwd=REPO, stdout=output, stderr=output, text=True)


def wait_for(condition, process, what, timeout=300):
    deadline = time.time() + timeout
    while not condition():
        assert process.poll() is None, f"the process ended before {what}: {process.communicate()}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def first_steps_logged(out):
    return lambda: (out / "resume" / "train_log.csv").is_file()


def last_line(text: str) -> str:
    """The last line of a step's stderr (progress bars come before it)."""
    return text.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def data(prepared):
    return prepared("rte", 96, 16)


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, data, tmp_path_factory):
    """The run of :func:`train_args`, trained without a stop: what a stopped and resumed run must equal."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    done = istar(*train_args(tiny_model_dir, data, out))
    assert done.returncode == 0, done.stderr
    return out


def train_log(run):
    return (run / "train_log.csv").read_text().splitlines()


# --------------------------------------------------------------------------------------- signals


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_a_state_at_the_next_step_and_the_same_command_resumes(signum, tiny_model_dir, data,
                                                                              uninterrupted, tmp_path):
    """Stopped by a signal mid-epoch (as SLURM's early SIGTERM before a time limit, or Ctrl-C), the run
    saves a state at its next optimizer step; the same command resumes from it and ends as the run that
    was never stopped: every optimizer step logged once, with the same losses, and the same scores."""
    out = tmp_path / "run"
    process = start(*train_args(tiny_model_dir, data, out))
    wait_for(first_steps_logged(out), process, "the first optimizer step")
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    states = list((out / "resume").glob("state-*"))
    assert len(states) == 1 and (states[0] / "COMPLETE").is_file()
    step = int(states[0].name.split("-")[1])
    assert 0 < step < 24, "--checkpoint-every 0: the only state is the one the signal asked for"
    assert last_line(stderr) == (f"istar train: stopped by {signal.Signals(signum).name} after optimizer step {step} (epoch "
                    f"{1 + (step - 1) // 12}); the state is saved in {states[0]}: run the same command again to "
                    "resume from it")

    resumed = istar(*train_args(tiny_model_dir, data, out))
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {states[0]}" in resumed.stdout
    assert json.loads((out / "metrics.json").read_text())["epochs"][-1]["step"] == 24
    assert train_log(out) == train_log(uninterrupted)
    assert (json.loads((out / "metrics.json").read_text())["epochs"]
            == json.loads((uninterrupted / "metrics.json").read_text())["epochs"])


def test_launch_forwards_sigterm_and_leaves_no_child_behind(tiny_model_dir, data, tmp_path):
    out = tmp_path / "run"
    launcher = start("launch", "--gpus", 0, "--", *train_args(tiny_model_dir, data, out))
    wait_for(first_steps_logged(out), launcher, "the first optimizer step")
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=300)
    assert launcher.returncode == 143, stderr
    assert "istar train: stopped by SIGTERM after optimizer step" in stderr
    assert processes_naming(str(out)) == [], "the training process outlived its launcher"
    assert list((out / "resume").glob("state-*/COMPLETE"))


def test_a_killed_launcher_stops_its_child(tiny_model_dir, data, tmp_path):
    """SIGKILL cannot be forwarded: the child is asked to stop by the kernel (and saves its state)."""
    out = tmp_path / "run"
    # (no pipes: nobody reads the child's output once the launcher is gone)
    launcher = start("launch", "--gpus", 0, "--", *train_args(tiny_model_dir, data, out), output=subprocess.DEVNULL)
    wait_for(first_steps_logged(out), launcher, "the first optimizer step")
    launcher.kill()
    launcher.wait()
    deadline = time.time() + 120
    while processes_naming(str(out)) and time.time() < deadline:
        time.sleep(0.1)
    assert processes_naming(str(out)) == [], "the training process outlived its launcher"
    assert list((out / "resume").glob("state-*/COMPLETE")), "the child saved no state when asked to stop"


# --------------------------------------------------------------------------------------- one writer


HOLD = "import sys, time; from istar.io.runlock import writer_lock\nwith writer_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)"


def test_a_second_writer_of_a_run_folder_stops_at_once_naming_the_first(tiny_model_dir, data, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], env={**ENV, "PYTHONPATH": str(REPO)},
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        second = istar(*train_args(tiny_model_dir, data, out))
        assert second.returncode == 1
        assert second.stderr.strip() == (
            f"istar train: error: {out} is being written by another run: PID {holder.pid} on host "
            f"{socket.gethostname()} (since {json.loads((out / LOCK_NAME).read_text())['started']}: -c {out}) holds "
            f"{out / LOCK_NAME}. Wait for it to finish, or stop that process; two writers in one run folder would "
            "mix their states")
        assert "Loading weights" not in second.stdout + second.stderr and not (out / "resume").exists()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # the holder died without releasing: its lock is stale and is taken over, with a line
    lines = []
    with writer_lock(out, print_fn=lines.append):
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
        with pytest.raises(FolderLockedError):  # held by this process now: another open of it is refused
            with writer_lock(out):
                pass
    assert len(lines) == 1
    assert lines[0].startswith(f"taking over the stale writer lock {out / LOCK_NAME} of PID {holder.pid} on host "
                               f"{socket.gethostname()} (since ")
    assert lines[0].endswith(f"-c {out}): that process is gone")
    assert not (out / LOCK_NAME).exists()  # released: the next writer has nothing to take over


def resize(folder, mebibytes):
    subprocess.run(["mount", "-o", f"remount,size={mebibytes}M", str(folder)], check=True)


@pytest.fixture
def read_only_folder(tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    if os.geteuid() == 0:
        _mount("--bind", "-o", "ro", str(folder), str(folder))
    else:
        folder.chmod(0o555)
    yield folder
    if os.geteuid() == 0:
        subprocess.run(["umount", "-l", str(folder)], check=False)
    else:
        folder.chmod(0o755)


def fill_during_training(command, out, leave):
    """Run ``istar train`` on a disk that something else fills once training has started (past the
    check of the free space it needs): at the first optimizer step the process is paused and a
    filler file leaves ``leave(states_saved)`` MiB free. Returns the finished process's result."""
    process = start(*command)
    wait_for(first_steps_logged(out), process, "the first optimizer step")
    process.send_signal(signal.SIGSTOP)
    try:
        saved = len(list((out / "resume").glob("state-*/COMPLETE")))
        stats = os.statvfs(out)
        filler = stats.f_bavail * stats.f_frsize - leave(saved) * 2**20
        with open(out.parent / "filler", "wb") as handle:
            handle.truncate(0)
            handle.write(b"\0" * filler)
    finally:
        process.send_signal(signal.SIGCONT)
    stdout, stderr = process.communicate(timeout=600)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def test_a_full_disk_while_saving_a_state_keeps_the_previous_one_and_the_same_command_resumes(
        tiny_model_dir, data, small_disk):
    # A state of the tiny model is about 11.6 MiB: the first fits in the 18 MiB left, a second beside it
    # does not (6 MiB are left where the first was saved before the disk was filled).
    out = small_disk(32) / "run"
    command = train_args(tiny_model_dir, data, out, "--checkpoint-every", 4)
    full = fill_during_training(command, out, lambda saved: 6 if saved else 18)
    assert full.returncode == 1, full.stderr
    first = out / "resume" / "state-00000004"
    message = last_line(full.stderr)
    assert message.startswith(f"istar train: error: no space left on the disk of {out / 'resume' / 'state-00000008'} "
                              "while writing it (") and "\n" not in message
    assert message.endswith(f"free now): the previous state {first} is kept, and the same command resumes from it. "
                            f"Free space there (`df -h {out / 'resume'}`) and run the same command again")
    assert (first / "COMPLETE").is_file() and not list((out / "resume").glob(".staging-*"))

    (out.parent / "filler").unlink()
    resumed = istar(*command)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {first}" in resumed.stdout and (out / "metrics.json").is_file()


def test_a_full_disk_while_saving_the_final_model_keeps_the_trained_state(tiny_model_dir, data, small_disk):
    # One epoch, no periodic states: the epoch-end state (11.6 MiB) fits in the 14 MiB left, the model beside it not.
    out = small_disk(32) / "run"
    command = train_args(tiny_model_dir, data, out, "--epochs", 1)  # (the later --epochs counts)
    full = fill_during_training(command, out, lambda saved: 14)
    assert full.returncode == 1, full.stderr
    state = out / "resume" / "state-00000012"
    assert last_line(full.stderr).startswith(f"istar train: error: no space left on the disk of {out / 'model'} "
                                             "while writing it (")
    assert (f"the trained state {state} is kept (metrics.json is written last, so the run is not marked done); the "
            "same command finishes the run from it") in full.stderr
    assert not (out / "metrics.json").exists() and not (out / ".model-staging").exists()

    (out.parent / "filler").unlink()
    resumed = istar(*command)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {state}" in resumed.stdout
    artifacts.verify_digests(out / "model")
    assert json.loads((out / "metrics.json").read_text())["epochs"][-1]["step"] == 12


def test_training_checks_the_free_space_it_needs_before_the_first_step(tiny_model_dir, data, small_disk):
    # Two states of about 12.6 MiB (estimated; 11.6 MiB written) and the model beside the last: 25.1 MiB.
    out = small_disk(20) / "run"
    command = train_args(tiny_model_dir, data, out, "--checkpoint-every", 4)
    refused = istar(*command)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert last_line(refused.stderr) == (
        f"istar train: error: not enough free space for {out}: training writes resume states of about 12.6 MiB each "
        "(2 at once while one replaces the other) and the final model (4.9 MiB) beside the last one: 25.1 MiB at most, "
        "about 25.1 MiB more than is there now, but the disk has 20.0 MiB free: free at least 5.2 MiB more "
        f"(`df -h {out}`) or choose an output folder on another disk, and run the same command again; no training "
        "step was taken")
    assert not list(out.glob("resume/*")) and not (out / "resume" / "train_log.csv").exists()
    resize(out.parent, 32)
    assert istar(*command).returncode == 0 and (out / "metrics.json").is_file()


def test_the_space_estimate_covers_a_saved_state_and_the_model(tiny_model_dir, data, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from istar.config.specs import TrainSpec
    from istar.steps.resume import space_needed

    out = tmp_path / "run"
    command, state = stopped_run(tiny_model_dir, data, out)
    written = sum(p.stat().st_size for p in state.rglob("*") if p.is_file())
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=2)
    need = space_needed(TrainSpec(model=str(tiny_model_dir), data_dir=str(data), output_dir=str(out), epochs=2,
                                  method="cosreg", lam=1.0), model)
    assert written <= need["state"] <= written + 2**20 + 0.05 * written, (written, need)
    assert istar(*command).returncode == 0
    final = sum(p.stat().st_size for p in (out / "model").rglob("*") if p.is_file())
    assert final <= need["model"] <= final + 2**20, (final, need)
    assert need["total"] == 2 * need["state"] and need["copies"] == 0


def test_prepare_data_on_a_full_disk_names_the_file(small_disk):
    from mirrors import TEST_DATA

    disk = small_disk(1)
    with open(disk / "filler", "wb", buffering=0) as handle:  # fill the disk to its last block
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass
    result = istar("prepare-data", "--task", "rte", "--out", disk / "rte", "--source", "mirror", "--mirror", TEST_DATA,
                   "--subset", "--max-train-samples", 200, "--max-eval-samples", 50)
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: no space left on the disk of {disk / 'rte' / 'train.parquet'} while "
                                    "writing it (0.0 MiB free now): train.parquet was not written")
    assert [p.name for p in (disk / "rte").iterdir()] == []  # no partial file


@pytest.mark.parametrize("step", ["train", "prepare-data"])
def test_a_read_only_output_folder_is_named_before_anything_is_loaded(step, tiny_model_dir, data, read_only_folder):
    from mirrors import TEST_DATA

    out = read_only_folder / "out"
    args = (train_args(tiny_model_dir, data, out) if step == "train" else
            ["prepare-data", "--task", "rte", "--out", out, "--source", "mirror", "--mirror", TEST_DATA, "--subset"])
    result = istar(*args)
    assert result.returncode == 1
    reason = "Read-only file system" if os.geteuid() == 0 else "Permission denied"
    assert result.stderr == (f"istar {step}: error: cannot write to {out} ({reason}): choose an output folder on a "
                             "writable disk, or make this one writable, and run the command again; nothing was "
                             "changed\n")
    assert result.stdout == ""


# --------------------------------------------------------------------------------------- damaged states


def stopped_run(tiny_model_dir, data, out):
    """A run stopped by SIGTERM after its first steps: (the train arguments, its one state)."""
    command = train_args(tiny_model_dir, data, out)
    process = start(*command)
    wait_for(first_steps_logged(out), process, "the first optimizer step")
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=300)
    assert process.returncode == 143
    return command, next((out / "resume").glob("state-*"))


def test_a_damaged_resume_state_is_discarded_with_one_line(tiny_model_dir, data, tmp_path):
    out = tmp_path / "run"
    command, state = stopped_run(tiny_model_dir, data, out)
    # an older complete state beside it (as a run keeps while it writes the next one); step 0 is
    # older than any state a stop can leave (the stop may land at step 1)
    older = state.with_name("state-00000000")
    subprocess.run(["cp", "-a", str(state), str(older)], check=True)
    optimizer = state / "optimizer.bin"
    optimizer.write_bytes(optimizer.read_bytes()[:1000])

    rerun = istar(*command)
    assert rerun.returncode == 0, rerun.stderr
    assert (f"discarding the damaged saved state {state} (optimizer.bin: sha256 ") in rerun.stdout
    assert (f"; falling back to state-00000000 (`--restart` starts afresh without reading saved states)\n"
            f"resuming from {older} (") in rerun.stdout
    assert (out / "metrics.json").is_file()


def test_a_state_that_cannot_be_loaded_names_itself_and_restart(tiny_model_dir, data, tmp_path):
    """A state without recorded hashes (saved before they were recorded) that fails to load."""
    out = tmp_path / "run"
    command, state = stopped_run(tiny_model_dir, data, out)
    (state / artifacts.DIGESTS).unlink()
    optimizer = state / "optimizer.bin"
    optimizer.write_bytes(optimizer.read_bytes()[:1000])
    for _ in range(2):  # the same clear line every time, not a traceback
        rerun = istar(*command)
        assert rerun.returncode == 2 and "Traceback" not in rerun.stderr
        assert last_line(rerun.stderr).startswith(f"istar train: error: the saved state {state} cannot be loaded (")
        assert last_line(rerun.stderr).endswith(f"run the same command with `--restart` to start this run afresh (or "
                                             f"remove {out / 'resume'})")
    restarted = istar(*command, "--restart")
    assert restarted.returncode == 0, restarted.stderr
    assert (out / "metrics.json").is_file()

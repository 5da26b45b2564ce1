"""The cluster profile against a real SLURM: a single-node cluster from Debian's packages
(slurm-wlm 22.05, munge; see /work/shared/docs/SLURM.md) started by the test, with four pretend
GPUs. Through `--profile profiles/slurm`:

- a tiny workflow with training.gpus: 1: training jobs ask SLURM for a GPU, run accelerate (fp16
  asked; on this CPU-only torch bf16 where the processor has it natively, else fp32) and give the
  same results as the same runs of the session's tiny study on the local CPU;
- a fine-tuning job with training.gpus: 2 is one task on two GPUs, asked for with --gpus and, as
  sites that reject --gpus do, with --gres;
- a fine-tuning job whose time limit is shorter than its training gets the profile's early
  SIGTERM, saves a state, is submitted again and resumes, and logs every optimizer step once
  (that a run resumed after a signal equals the run never stopped is checked on a shorter run,
  tests/integration/test_reliability_faults.py).

Nothing global is changed besides installing the packages when they are missing: the cluster's
configuration, state, logs, munge key and socket live in a temporary folder and SLURM finds
them through SLURM_CONF; the daemons listen on free ports and are stopped by the PIDs the test
started. Skips with the reason where SLURM cannot be installed or started."""

from __future__ import annotations

import csv
import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from services import Daemons, ensure_debian_packages, free_port, program
from workflow_helpers import ENV, REPO, SNAKEMAKE, load_test_config, save_tiny_model, write_project

from istar.config.layout import RUN
from istar.registry.precisions import run_precision

PROGRAMS = ["slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "srun", "scancel", "munged"]
PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
# Rules whose jobs go to SLURM (the others are localrules) and whether they ask for a GPU.
CLUSTER_RULES = {"shrinkage": True, "train_search": True, "train": True, "measure": True}
FAKE_GPUS = 4


class Cluster:
    def __init__(self, base: Path, env: dict, jobcomp: Path, daemons: Daemons):
        self.base, self.env, self.jobcomp, self.daemons = base, env, jobcomp, daemons

    def run(self, *command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)

    def jobs(self) -> dict[str, dict[str, str]]:
        """SLURM job id → its fields in `scontrol -d show job` (finished jobs stay MinJobAge seconds); with -d,
        JOB_GRES is what the job was allocated, e.g. gpu:2."""
        out = self.run("scontrol", "--details", "--oneliner", "show", "job").stdout
        jobs = {}
        for line in out.splitlines():
            fields = dict(re.findall(r"(\w+)=(\S*)", line))
            if "JobId" in fields:
                jobs[fields["JobId"]] = fields
        return jobs

    def completed(self) -> set[str]:
        """Ids of the jobs slurmctld logged as completed (jobcomp/filetxt)."""
        text = self.jobcomp.read_text() if self.jobcomp.exists() else ""
        return set(re.findall(r"JobId=(\d+) .*JobState=COMPLETED", text))

    def finished(self) -> dict[str, dict[str, str]]:
        """SLURM job id → its record in the jobcomp log (kept after slurmctld forgets the job):
        JobState, TimeLimit in minutes, StartTime, EndTime, ExitCode."""
        text = self.jobcomp.read_text() if self.jobcomp.exists() else ""
        return {fields["JobId"]: fields for fields in (dict(re.findall(r"(\w+)=(\S*)", line)) for line in text.splitlines())
                if "JobId" in fields}

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{self.daemons.output(name)[-2000:]}" for name, _ in self.daemons.processes)


def node_line() -> tuple[str, str]:
    """(node name, the NodeName=… line of `slurmd -C` without its UpTime)."""
    out = subprocess.run([program("slurmd"), "-C"], capture_output=True, text=True, timeout=30).stdout
    line = next(line for line in out.splitlines() if line.startswith("NodeName="))
    return line.split()[0].split("=", 1)[1], line


def write_configuration(base: Path, host: str, node: str, munge_socket: Path) -> Path:
    for name in ("ctld", "spool", "log"):
        (base / name).mkdir()
    # Pretend GPUs: character devices (a count-only gres.conf line drains the node, regular files
    # are rejected); all are the null device. Four, so that two 2-GPU jobs run at once.
    gpus = [base / f"fakegpu{i}" for i in range(FAKE_GPUS)]
    for gpu in gpus:
        os.mknod(gpu, 0o666 | 0o020000, os.makedev(1, 3))
    conf = base / "slurm.conf"
    # OverTimeLimit and KillWait as SLURM's defaults, written out: a job is ended at its time limit
    # with SIGTERM, then SIGKILL 30 s later (the time-limit test relies on the profile's earlier signal).
    conf.write_text(f"""\
ClusterName=istartest
SlurmctldHost={host}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={base / 'ctld'}
SlurmdSpoolDir={base / 'spool'}
SlurmctldPidFile={base / 'slurmctld.pid'}
SlurmdPidFile={base / 'slurmd.pid'}
SlurmctldLogFile={base / 'log' / 'slurmctld.log'}
SlurmdLogFile={base / 'log' / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={base / 'log' / 'jobcomp.txt'}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
MinJobAge=600
OverTimeLimit=0
KillWait=30
GresTypes=gpu
DefMemPerCPU=1000
{node} Gres=gpu:{FAKE_GPUS}
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
    (base / "gres.conf").write_text(f"NodeName={host} Name=gpu File={base}/fakegpu[0-{FAKE_GPUS - 1}]\n")
    return conf


@pytest.fixture(scope="module")
def slurm():
    if os.geteuid() != 0:
        pytest.skip("a private SLURM needs root (slurmd runs jobs as their users)")
    reason = ensure_debian_packages(PROGRAMS, PACKAGES)
    if reason:
        pytest.skip(f"SLURM cannot be installed: {reason}")
    try:
        munge_user = pwd.getpwnam("munge")
    except KeyError:
        pytest.skip("no munge user (the munge package creates it)")

    # Not pytest's tmp_path: the munge user must be able to reach its socket (0755 path).
    base = Path(tempfile.mkdtemp(prefix="istar-slurm-", dir="/tmp"))
    base.chmod(0o755)
    daemons = Daemons(base)
    env = None
    try:
        munge = base / "munge"
        munge.mkdir(mode=0o755)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        for path in (munge, key):
            os.chown(path, munge_user.pw_uid, munge_user.pw_gid)
        socket = munge / "munge.socket"
        daemons.start("munged", [program("munged"), "--foreground", f"--socket={socket}", f"--key-file={key}",
                                 f"--log-file={munge / 'munged.log'}", f"--pid-file={munge / 'munged.pid'}",
                                 f"--seed-file={munge / 'munged.seed'}"],
                      user=munge_user.pw_uid, group=munge_user.pw_gid, extra_groups=[])
        deadline = time.monotonic() + 15
        while not socket.exists() and time.monotonic() < deadline and daemons.check_running() is None:
            time.sleep(0.2)
        if not socket.exists():
            pytest.skip(f"munged did not start: {daemons.check_running() or 'no socket after 15 s'}")

        host, node = node_line()
        conf = write_configuration(base, host, node, socket)
        # The jobstep executor strips SLURM_* variables (SLURM_CONF too) before its `srun` inside
        # each job; on a real cluster srun finds /etc/slurm/slurm.conf. Here a two-line srun first
        # on PATH restores SLURM_CONF, so no file in /etc is written.
        bin_dir = base / "bin"
        bin_dir.mkdir()
        (bin_dir / "srun").write_text(f'#!/bin/sh\nexport SLURM_CONF="{conf}"\nexec "{program("srun")}" "$@"\n')
        (bin_dir / "srun").chmod(0o755)
        env = {**ENV, "SLURM_CONF": str(conf), "PATH": f"{bin_dir}:{ENV['PATH']}"}

        daemons.start("slurmctld", [program("slurmctld"), "-D", "-i"], env=env)
        time.sleep(1)
        daemons.start("slurmd", [program("slurmd"), "-D"], env=env)
        cluster = Cluster(base, env, base / "log" / "jobcomp.txt", daemons)
        state = ""
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and daemons.check_running() is None:
            state = cluster.run("sinfo", "-h", "-N", "-o", "%T").stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        if state != "idle":
            pytest.skip(f"the SLURM node did not come up (state {state!r}): "
                        f"{daemons.check_running() or ''}\n{cluster.logs()}")

        # The pretend GPUs can be granted: SLURM sets CUDA_VISIBLE_DEVICES for the job.
        probe = cluster.run("sbatch", "--wait", "--gpus=1", "--mem=100", "-o", str(base / "probe.out"),
                            "--wrap", "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES", timeout=90)
        probe_out = (base / "probe.out").read_text() if (base / "probe.out").exists() else ""
        if probe.returncode != 0 or "CUDA_VISIBLE_DEVICES=0" not in probe_out:
            pytest.skip(f"a 1-GPU probe job did not run: {probe.stderr} {probe_out}\n{cluster.logs()}")
        yield cluster
    finally:
        if env is not None and daemons.check_running() is None:
            subprocess.run(["scancel", "--user", "root"], env=env, capture_output=True, timeout=30)
        daemons.stop()
        shutil.rmtree(base, ignore_errors=True)


def run_files(workdir: Path) -> set[str]:
    return {str(p.relative_to(workdir)) for folder in ("results", "resources")
            for p in (workdir / folder).rglob("*") if p.is_file()}


def snakemake_command(workdir: Path, *targets: str) -> list[str]:
    """The command workflow_helpers.snakemake runs, for a run with its own environment."""
    return [SNAKEMAKE, *targets, "--snakefile", str(REPO / "workflow" / "Snakefile"), "--directory", str(workdir),
            "--configfile", str(workdir / "config.yaml")]


def submitted_jobs(output: str) -> list[tuple[str, str]]:
    """(SLURM job id, rule) of every job the profile submitted, in order."""
    return re.findall(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: \S+/slurm_logs/rule_(\w+)/", output)


def cluster_command(workdir: Path, *targets: str, set_resources: tuple[str, ...] = ()) -> list[str]:
    command = [*snakemake_command(workdir, *targets), "--profile", str(REPO / "profiles" / "slurm"),
               "--workflow-profile", "none", "--slurm-init-seconds-before-status-checks", "1",
               "--slurm-keep-successful-logs"]
    return command + (["--set-resources", *set_resources] if set_resources else [])


def run_folder(seed: int, setting: str = "base") -> str:
    return RUN.format(model="tiny", task="rte", setting=setting, seed=seed)


def training_log(workdir: Path, seed: int, setting: str = "base") -> str:
    return (workdir / "logs" / "finetune" / "tiny" / "rte" / setting / f"seed{seed}.log").read_text(errors="replace")


def test_a_two_gpu_fine_tuning_job_is_one_task_on_two_gpus(slurm, tmp_path):
    """training.gpus: 2 as the paper runs it: SLURM grants two GPUs to one job of one task, and the job
    launches one training with two processes on them. Seed 0 asks with --gpus (the profile), seed 1
    with --gres, as the profile's comment shows for sites that reject --gpus; the two run at once."""
    config = load_test_config("slurm", model_dir=save_tiny_model(tmp_path / "tiny-bert"))
    config["training"].update(gpus=2, runtime=60)  # (minutes: no early stop signal on a busy machine)
    config["final"]["seeds"] = [0, 1]
    workdir = tmp_path / "project"
    write_project(workdir, config)
    targets = [f"{run_folder(seed)}/metrics.json" for seed in (0, 1)]
    # This torch has no CUDA: the two processes on the two pretend GPUs are gloo ranks on the CPU.
    env = {**slurm.env, "ACCELERATE_USE_CPU": "true"}
    returncode, output = run_logged(
        cluster_command(workdir, *targets, set_resources=(
            "train:gpu=0 if wildcards.seed == '1' else 2", "train:gres='gpu:2' if wildcards.seed == '1' else ''")),
        workdir, env, tmp_path / "snakemake.log", timeout=1800)
    assert returncode == 0, output[-6000:] + slurm.logs()

    submitted = submitted_jobs(output)
    assert [rule for _, rule in submitted] == ["train", "train"], output[-6000:]
    jobs = slurm.jobs()
    for jobid, _ in submitted:
        assert jobs[jobid]["JobState"] == "COMPLETED" and jobs[jobid]["NumTasks"] == "1", jobs[jobid]
        assert jobs[jobid]["JOB_GRES"] == "gpu:2", jobs[jobid]
    asked = sorted((jobs[jobid].get("TresPerJob", ""), jobs[jobid].get("TresPerNode", "")) for jobid, _ in submitted)
    assert asked == [("", "gres:gpu:2"), ("gres:gpu:2", "")]  # --gres=gpu:2 and --gpus=2

    steps_per_epoch = -(-config["data"]["max_train_samples"] // (config["training"]["batch_size"] * 2))
    devices = {}
    for seed, given in ((0, "CUDA_VISIBLE_DEVICES as given"), (1, "granted by SLURM as a generic resource")):
        launches = [line for line in training_log(workdir, seed).splitlines() if line.startswith("launching")]
        assert len(launches) == 1, launches
        launch = re.match(rf"launching on GPU\(s\) (\d+),(\d+) \({given}\): ", launches[0])
        assert launch and launch.group(1) != launch.group(2), launches
        devices[seed] = {int(launch.group(1)), int(launch.group(2))}
        assert "--num_processes 2" in launches[0] and "--multi_gpu" in launches[0]
        run = workdir / run_folder(seed)
        assert json.loads((run / "run_config.json").read_text())["num_processes"] == 2
        steps = list(csv.DictReader((run / "train_log.csv").open()))
        assert [int(row["step"]) for row in steps] == list(range(1, steps_per_epoch * config["training"]["epochs"] + 1))
    # the two jobs ran at once, on different GPUs of the four
    assert jobs[submitted[0][0]]["StartTime"] == jobs[submitted[1][0]]["StartTime"]
    assert devices[0].isdisjoint(devices[1]), devices
    print("2-GPU jobs: " + ", ".join(f"{jobid} (JOB_GRES={jobs[jobid]['JOB_GRES']}, NumTasks={jobs[jobid]['NumTasks']}, "
                                     f"{jobs[jobid]['RunTime']})" for jobid, _ in submitted)
          + f"; GPUs seen by seed: {devices}")


def run_logged(command: list[str], cwd: Path, env: dict, log: Path, timeout: float) -> tuple[int | None, str]:
    """Run Snakemake with its output in ``log``: (return code, or None after ``timeout`` s, the output)."""
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            returncode = None
    return returncode, log.read_text(errors="replace")


def signal_lead_seconds() -> int:
    """How long before a fine-tuning job's time limit the profile asks SLURM for SIGTERM."""
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    return int(re.fullmatch(r"'--signal=TERM@(\d+)'", profile["set-resources"]["train"]["slurm_extra"]).group(1))


@pytest.mark.timeout(1800)  # a training of minutes, stopped and resumed, beside the rest of the suite
def test_a_job_past_its_time_limit_is_stopped_ahead_of_it_resubmitted_and_resumes(slurm, tmp_path):
    """A base run of 30 epochs × 250 optimizer steps (about two and a half minutes on a quiet 2-core
    machine, and longer beside the rest of the suite). Once it has logged its first optimizer step, its
    time limit is cut to the whole minutes it has run plus the profile's lead (`scontrol update`, as an
    administrator can): shorter than the training, and late enough that startup, which on a busy machine
    takes minutes, is over. SLURM sends the early SIGTERM up to 60 s before the lead (slurmctld checks
    time limits every 30 s), so it lands within about a minute of the cut; the job saves its state,
    fails, and the profile's retry submits it again with the rule's runtime. (No uninterrupted reference
    beside it: minutes more of CPU for what test_reliability_faults checks on 24 steps.)"""
    model = save_tiny_model(tmp_path / "tiny-bert")
    config = load_test_config("slurm", model_dir=model)
    config["data"]["max_train_samples"] = 500
    config["training"].update(epochs=30, batch_size=2, runtime=60)
    on_slurm = tmp_path / "slurm"
    write_project(on_slurm, config)
    target = f"{run_folder(0)}/metrics.json"
    run = on_slurm / run_folder(0)
    lead = signal_lead_seconds()

    start = time.perf_counter()
    log = tmp_path / "snakemake.log"
    with log.open("w") as out:
        cluster_run = subprocess.Popen(cluster_command(on_slurm, target), cwd=on_slurm, env=slurm.env, stdout=out,
                                       stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 1800
        while not (submitted := submitted_jobs(log.read_text())) or not (run / "resume" / "train_log.csv").is_file():
            assert cluster_run.poll() is None, log.read_text()[-6000:]
            assert time.monotonic() < deadline, "no optimizer step on SLURM in 30 minutes"
            time.sleep(1)
        first = submitted[0][0]
        elapsed = duration(slurm.jobs()[first]["RunTime"])
        cut = -(-elapsed // 60) + lead // 60  # minutes
        update = slurm.run("scontrol", "update", f"JobId={first}", f"TimeLimit={cut}")
        assert update.returncode == 0, update.stderr
        returncode = cluster_run.wait(timeout=1800)
    finally:
        if cluster_run.poll() is None:
            cluster_run.kill()
            cluster_run.wait()
    seconds = time.perf_counter() - start
    output = log.read_text(errors="replace")
    assert returncode == 0, output[-8000:] + slurm.logs()

    submitted = submitted_jobs(output)
    assert [rule for _, rule in submitted] == ["train", "train"], output[-6000:]
    second = submitted[1][0]
    jobs = slurm.finished()  # (the jobcomp log: slurmctld forgets a job MinJobAge after its end)
    ran = {jobid: (datetime.fromisoformat(jobs[jobid]["EndTime"]) - datetime.fromisoformat(jobs[jobid]["StartTime"]))
           .total_seconds() for jobid in (first, second)}
    # the first job stopped on the early signal, before its limit, and failed (no TIMEOUT, no SIGKILL)
    assert jobs[first]["TimeLimit"] == str(cut) and jobs[first]["JobState"] == "FAILED", jobs[first]
    assert ran[first] < 60 * cut, jobs[first]
    assert jobs[second]["JobState"] == "COMPLETED", jobs[second]
    assert jobs[second]["TimeLimit"] == str(config["training"]["runtime"]), jobs[second]

    # (the step prints the run folder as the workflow names it, relative to the working directory)
    folder = re.escape(run_folder(0))
    stopped = re.search(rf"istar train: stopped by SIGTERM after optimizer step (\d+) \(epoch \d+\); the state is saved "
                        rf"in {folder}/resume/(state-\d+)", output)
    assert stopped, output[-8000:]
    step, state = int(stopped.group(1)), stopped.group(2)
    resumed = re.search(rf"resuming from {folder}/resume/{state} \(epoch \d+, batch \d+, step (\d+)\)",
                        training_log(on_slurm, 0))
    assert resumed and int(resumed.group(1)) == step, training_log(on_slurm, 0)[-3000:]

    # the resumed run finished: every optimizer step logged once, the scores of the last epoch, no state left
    total = config["training"]["epochs"] * config["data"]["max_train_samples"] // config["training"]["batch_size"]
    assert 0 < step < total
    rows = list(csv.DictReader((run / "train_log.csv").open()))
    assert [int(row["step"]) for row in rows] == list(range(1, total + 1))
    epochs = json.loads((run / "metrics.json").read_text())["epochs"]
    assert [epoch["epoch"] for epoch in epochs] == list(range(1, config["training"]["epochs"] + 1))
    assert epochs[-1]["step"] == total
    assert not (run / "resume").exists()
    print(f"time-limit run: job {first} cut to {cut} min after {elapsed} s, stopped after optimizer step {step} of "
          f"{total} ({ran[first]:.0f} s of {cut} min), job {second} resumed and finished in {ran[second]:.0f} s; "
          f"{len(rows)} steps logged; {seconds:.0f} s in all")


def duration(text: str) -> int:
    """Seconds in SLURM's [D-]HH:MM:SS."""
    days, _, clock = text.rpartition("-")
    hours, minutes, seconds = map(int, clock.split(":"))
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def test_tiny_workflow_through_slurm_matches_a_local_run(slurm, tiny_study, tmp_path):
    """The reference is the session's tiny study (tests/conftest.py): a plain local CPU run of the tiny
    config, whose runs include every run of this one with the same settings, model folder and data. (Last
    in this module: by then another worker has built the study, so this one does not wait for it.)"""
    start = time.perf_counter()
    # .test/config/slurm.yaml: the tiny config cut to one search run and the three final runs (no
    # study), on 1 GPU, with the study's model folder
    config = load_test_config("slurm", model_dir=tiny_study / "tiny-bert")
    on_slurm = tmp_path / "slurm"
    write_project(on_slurm, config)
    cluster_run = subprocess.run(cluster_command(on_slurm), cwd=on_slurm, env=slurm.env, capture_output=True, text=True,
                                 timeout=600)
    seconds = time.perf_counter() - start
    output = cluster_run.stdout + cluster_run.stderr
    assert cluster_run.returncode == 0, output[-6000:] + slurm.logs()

    # Every cluster job went through sbatch, and slurmctld saw it complete in this folder.
    submitted = submitted_jobs(output)
    rules = sorted(rule for _, rule in submitted)
    assert rules == sorted(["shrinkage", "train_search"] + ["train"] * 3 + ["measure"] * 3), output[-6000:]
    jobs, completed = slurm.jobs(), slurm.completed()
    for jobid, rule in submitted:
        job = jobs.get(jobid)
        assert job is not None and jobid in completed, f"SLURM job {jobid} ({rule}) unknown or not completed"
        assert job["JobState"] == "COMPLETED" and job["WorkDir"] == str(on_slurm), job
        # what SLURM granted: --gpus=1 for the GPU rules, nothing for the others
        gpus = re.search(r"gres[:/]gpu[:=](\d+)", job.get("TresPerJob", ""))
        assert (gpus.group(1) if gpus else "0") == ("1" if CLUSTER_RULES[rule] else "0"), (rule, job)
        assert int(re.search(r"mem=(\d+)M", job["TRES"]).group(1)) == 1000, (rule, job)  # training.mem_mb
        log = on_slurm / ".snakemake" / "slurm_logs" / f"rule_{rule}"
        assert list(log.rglob(f"{jobid}.log")), f"no SLURM log of job {jobid} under {log}"
    # Local rules stayed on this host: nothing else was submitted (besides the GPU probe and the jobs
    # of the tests before this one).
    assert {jobid for jobid, fields in jobs.items() if fields["WorkDir"] == str(on_slurm)} == \
        {jobid for jobid, _ in submitted}

    # Same files, same scores as the local CPU run (training on CPU with one seed is deterministic).
    local = tiny_study
    assert run_files(on_slurm) <= run_files(local)
    # the runs' metrics (search and final), not results/experiment/metrics.json (Table 1's cells for DVC)
    metrics = sorted(p.relative_to(on_slurm) for folder in ("search", "runs")
                     for p in (on_slurm / "results" / folder).rglob("metrics.json"))
    assert len(metrics) == 4
    for name in metrics:
        assert json.loads((on_slurm / name).read_text()) == json.loads((local / name).read_text()), name
    measures = sorted(p.relative_to(on_slurm) for p in (on_slurm / "results" / "measures").rglob("*.json"))
    assert len(measures) == 3
    for name in measures:
        evaluations = [{run: entry["evaluation"] for run, entry in json.loads((root / name).read_text())["runs"].items()}
                       for root in (on_slurm, local)]
        assert evaluations[0] == evaluations[1], name
    assert json.loads((on_slurm / "results/selection/tiny/rte/best.json").read_text())["lam"] == -1  # the one searched
    # The cluster jobs took the GPU path (accelerate), the local run the CPU path; both asked for
    # fp16 and ran what this CPU-only torch runs for it (istar.registry.precisions).
    on_cpu = {"requested": "fp16", "effective": run_precision("fp16", "cpu").label}
    for run_config in (on_slurm / "results").rglob("run_config.json"):
        cluster_precision = json.loads(run_config.read_text())["precision"]
        local_precision = json.loads((local / run_config.relative_to(on_slurm)).read_text())["precision"]
        assert cluster_precision == local_precision == on_cpu, run_config
    print(f"SLURM run of {len(submitted)} cluster jobs: {seconds:.0f} s")

"""The cluster profile against a real SLURM: a single-node cluster from Debian's packages
(slurm-wlm 22.05, munge; see /work/shared/docs/SLURM.md) started by the test, with two pretend
GPUs. A tiny workflow with training.gpus: 1 goes through `--profile profiles/slurm`: training
jobs ask SLURM for a GPU, run accelerate (fp16 asked; on this CPU-only torch bf16 where the processor
has it natively, else fp32) and give
the same results as a plain local CPU run of the same config.

Nothing global is changed besides installing the packages when they are missing: the cluster's
configuration, state, logs, munge key and socket live in a temporary folder and SLURM finds
them through SLURM_CONF; the daemons listen on free ports and are stopped by the PIDs the test
started. Skips with the reason where SLURM cannot be installed or started."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from services import Daemons, ensure_debian_packages, free_port, program
from workflow_helpers import ENV, REPO, SNAKEMAKE, load_test_config, save_tiny_model, write_project

from istar.registry.precisions import run_precision

PROGRAMS = ["slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "srun", "scancel", "munged"]
PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
# Rules whose jobs go to SLURM (the others are localrules) and whether they ask for a GPU.
CLUSTER_RULES = {"shrinkage": True, "train_search": True, "train": True, "measure": True}


class Cluster:
    def __init__(self, base: Path, env: dict, jobcomp: Path, daemons: Daemons):
        self.base, self.env, self.jobcomp, self.daemons = base, env, jobcomp, daemons

    def run(self, *command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)

    def jobs(self) -> dict[str, dict[str, str]]:
        """SLURM job id → its fields in `scontrol show job` (finished jobs stay MinJobAge seconds)."""
        out = self.run("scontrol", "--oneliner", "show", "job").stdout
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
    # are rejected); both are the null device.
    gpus = [base / f"fakegpu{i}" for i in range(2)]
    for gpu in gpus:
        os.mknod(gpu, 0o666 | 0o020000, os.makedev(1, 3))
    conf = base / "slurm.conf"
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
GresTypes=gpu
DefMemPerCPU=1000
{node} Gres=gpu:2
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
    (base / "gres.conf").write_text(f"NodeName={host} Name=gpu File={base}/fakegpu[0-1]\n")
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


def test_tiny_workflow_through_slurm_matches_a_local_run(slurm, tmp_path):
    start = time.perf_counter()
    model = save_tiny_model(tmp_path / "tiny-bert")
    # .test/config/slurm.yaml: the tiny config cut to one search run and the three final runs (no
    # study), on 1 GPU; both projects load the one model folder by its absolute path
    config = load_test_config("slurm", model_dir=model)
    on_slurm = tmp_path / "slurm"
    local = tmp_path / "local"
    write_project(on_slurm, config)
    write_project(local, config)

    # The reference: a plain local run on the CPU (gpu capped at 0, as the workflow's default
    # profile does), side by side with the cluster run.
    local_run = subprocess.Popen([*snakemake_command(local), "--cores", "1", "--resources", "gpu=0"],
                                 cwd=local, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        cluster_run = subprocess.run(
            [*snakemake_command(on_slurm), "--profile", str(REPO / "profiles" / "slurm"), "--workflow-profile", "none",
             "--slurm-init-seconds-before-status-checks", "1", "--slurm-keep-successful-logs"],
            cwd=on_slurm, env=slurm.env, capture_output=True, text=True, timeout=600)
        local_output, _ = local_run.communicate(timeout=600)
    finally:
        if local_run.poll() is None:
            local_run.kill()
            local_run.wait()
    seconds = time.perf_counter() - start
    output = cluster_run.stdout + cluster_run.stderr
    assert cluster_run.returncode == 0, output[-6000:] + slurm.logs()
    assert local_run.returncode == 0, local_output[-5000:]

    # Every cluster job went through sbatch, and slurmctld saw it complete in this folder.
    submitted = re.findall(r"Job \d+ has been submitted with SLURM jobid (\d+) "
                           r"\(log: \S+/slurm_logs/rule_(\w+)/", output)
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
    # Local rules stayed on this host: nothing else was submitted.
    assert len(jobs) == len(submitted) + 1  # + the GPU probe

    # Same files, same scores as the local CPU run (training on CPU with one seed is deterministic).
    assert run_files(on_slurm) == run_files(local)
    metrics = sorted(p.relative_to(local) for p in (local / "results").rglob("metrics.json"))
    assert len(metrics) == 4
    for name in metrics:
        assert json.loads((on_slurm / name).read_text()) == json.loads((local / name).read_text()), name
    measures = sorted(p.relative_to(local) for p in (local / "results" / "measures").rglob("*.json"))
    assert len(measures) == 3
    for name in measures:
        evaluations = [{run: entry["evaluation"] for run, entry in json.loads((root / name).read_text())["runs"].items()}
                       for root in (on_slurm, local)]
        assert evaluations[0] == evaluations[1], name
    assert ((on_slurm / "results/selection/tiny/rte/best.json").read_text()
            == (local / "results/selection/tiny/rte/best.json").read_text())
    # The cluster jobs took the GPU path (accelerate), the local run the CPU path; both asked for
    # fp16 and ran what this CPU-only torch runs for it (istar.registry.precisions).
    on_cpu = {"requested": "fp16", "effective": run_precision("fp16", "cpu").label}
    for run_config in (on_slurm / "results").rglob("run_config.json"):
        cluster_precision = json.loads(run_config.read_text())["precision"]
        local_precision = json.loads((local / run_config.relative_to(on_slurm)).read_text())["precision"]
        assert cluster_precision == local_precision == on_cpu, run_config
    print(f"SLURM run of {len(submitted)} cluster jobs (and the local run beside it): {seconds:.0f} s")


def snakemake_command(workdir: Path) -> list[str]:
    """The command workflow_helpers.snakemake runs, for a run with its own environment."""
    return [SNAKEMAKE, "--snakefile", str(REPO / "workflow" / "Snakefile"), "--directory", str(workdir),
            "--configfile", str(workdir / "config.yaml")]

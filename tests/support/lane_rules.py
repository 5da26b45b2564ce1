"""The test lanes by cost (README "Tests"), as a pytest plugin (tests/conftest.py loads it).

Every test is in exactly one lane, the one its folder names: tests/fast (which mirrors the package:
tests/fast/<subpackage>/test_*.py, cross-cutting modules at its top), tests/integration, tests/e2e.
A lane marker that disagrees with the folder stops the collection, naming the test and the fix, so a
folder cannot say one lane while its tests run in another (full_release is a group, not a lane). A lane has
two limits. Its *hang guard* is a wall-clock limit (pytest-timeout) on the whole test, fixtures
included, long enough that a busy machine never reaches it. Its *cost limit* is the CPU time of the
test's call alone (this process and the processes it waited for), which load on the machine does not
inflate and a session fixture built on the test's behalf does not add to: a fast test over it is not
fast. Also here: a fast test may not start an interpreter, a full_release test is skipped where the
releases are missing, and any skip fails the run.
"""

import os
import resource
import subprocess
from pathlib import Path

import pytest
import torch
from mirrors import FULL_MIRROR, FULL_MIRROR_MISSING

LANES = {
    "fast": "pure and in-process: the mathematics, config and schema, data readers, tables and figures "
            "from fixture CSVs, the training step in-process on a tiny model",
    "integration": "steps as subprocesses (the istar CLI, accelerate, signals), the hub server, trackers",
    "e2e": "Snakemake runs, SLURM, DVC remotes, SSH, mounts",
}
FOLDER_LANES = {"fast": "fast", "integration": "integration", "e2e": "e2e"}  # tests/<folder> -> its lane
# The hang guard, per test in seconds of wall time: a test still running after it hangs.
HANG_SECONDS = {"fast": 300, "integration": 900, "e2e": 1200}
# The cost limit, per test in CPU seconds of its call on each core it may use (torch's threads): a fast
# test that needs more is not fast (the other lanes have none).
CALL_CPU_SECONDS = {"fast": 60}
# A fast test may not start these (a Python interpreter costs seconds: such a test is an integration test).
SLOW_PROGRAMS = ("python", "snakemake", "istar", "accelerate", "torchrun", "dvc", "sbatch", "srun", "mlflow", "olah")

LANE = pytest.StashKey[str]()


def lane_of(item) -> str:
    """The lane of the folder the test's module is in (tests/fast, tests/integration, tests/e2e)."""
    folder = Path(str(item.fspath)).relative_to(Path(__file__).parents[1]).parts[0]
    if folder not in FOLDER_LANES:
        raise pytest.UsageError(f"{item.nodeid}: no lane: a test module lives in the folder of its lane, "
                                f"{', '.join(f'tests/{name}' for name in FOLDER_LANES)} (tests/support/lane_rules.py)")
    lane = FOLDER_LANES[folder]
    # iter_markers goes from the test outwards: its own marker, then its module's
    other = next((mark.name for mark in item.iter_markers() if mark.name in LANES and mark.name != lane), None)
    if other:
        home = next(name for name, marked in FOLDER_LANES.items() if marked == other)
        raise pytest.UsageError(f"{item.nodeid} is marked {other} but its folder tests/{folder} is the {lane} lane: "
                                f"the folder decides the lane; move the test to a module of the same name in "
                                f"tests/{home} (helpers both use go to tests/support) and drop the marker")
    return lane


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the child processes it has waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_configure(config):
    for name, holds in LANES.items():
        config.addinivalue_line("markers", f"{name}: lane: {holds}")


def pytest_collection_modifyitems(config, items):
    """Give each test its lane's marker (so that -m selects lanes) and its lane's hang guard."""
    for item in items:
        lane = lane_of(item)
        item.stash[LANE] = lane
        if not item.get_closest_marker(lane):
            item.add_marker(getattr(pytest.mark, lane))
        if not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(HANG_SECONDS[lane]))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """The cost limit: the call's CPU seconds, measured around the test function only."""
    limit = CALL_CPU_SECONDS.get(item.stash.get(LANE, None))
    start = cpu_seconds()
    result = yield
    spent, cores = cpu_seconds() - start, max(1, min(os.cpu_count() or 1, torch.get_num_threads()))
    if limit is not None and spent > limit * cores:
        lane = item.stash[LANE]
        raise pytest.fail.Exception(f"{item.nodeid} took {spent:.0f} CPU seconds in its call, over the {lane} lane's "
                                    f"{limit} s on each of {cores} core(s): make it cheaper or move it to the "
                                    "integration lane (tests/integration)")
    return result


@pytest.fixture(autouse=True)
def _fast_lane_starts_no_interpreter(request, monkeypatch):
    """In the fast lane, starting a Python interpreter (the istar CLI, Snakemake, accelerate, …) fails
    the test: it belongs in the integration lane (tests/integration)."""
    if request.node.stash.get(LANE, None) != "fast":
        return
    popen_init = subprocess.Popen.__init__

    def guarded(self, args, *posargs, **kwargs):
        program = os.path.basename(str(args[0] if isinstance(args, (list, tuple)) else str(args).split()[0]))
        if any(program.startswith(name) for name in SLOW_PROGRAMS):
            raise RuntimeError(f"{request.node.nodeid} is in the fast lane but starts {program!r}: move it to "
                               "tests/integration (or tests/e2e), or test the step in-process")
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


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    """After pytest's own summary, the last lines before the counts: what was skipped, why, and the verdict."""
    result = yield
    if SKIPPED:
        terminalreporter.write_sep("=", f"{len(SKIPPED)} skipped: this run FAILS (every selected test must run)",
                                   red=True)
        for nodeid, reason in SKIPPED:
            terminalreporter.write_line(f"SKIPPED {nodeid}: {reason}")
    return result

"""The order test modules go out in, and each module's seconds on request, as a pytest plugin
(tests/conftest.py loads it).

pytest-xdist (--dist loadfile --no-loadscope-reorder) gives each free worker the next module in
collection order. A long module that starts last keeps one worker busy after the other is done, so
modules go out longest first, by tests/module_seconds.json (seconds per module, setup included, on
two workers). A module not in it counts as its lane's typical one. Only the order changes, never
what runs. `pytest --store-module-seconds` (the opt-in) measures each module's wall and CPU seconds
in the run, prints them and updates the file from the modules the run ran.
"""

import json
import os
import time
from pathlib import Path

import pytest
from lane_rules import LANE, cpu_seconds

MODULE_SECONDS = Path(__file__).parents[1] / "module_seconds.json"
UNTIMED_MODULE_SECONDS = {"fast": 10.0, "integration": 60.0, "e2e": 300.0}
RAN_SECONDS: dict[str, float] = {}  # module -> seconds in this run (setup, call and teardown of its tests)
RAN_CPU_SECONDS: dict[str, float] = {}  # module -> CPU seconds of the worker and the processes it waited for
CPU_MARK: list[float] = []  # the CPU seconds at the end of the last phase this process reported


def pytest_addoption(parser):
    parser.addoption("--store-module-seconds", action="store_true",
                     help=f"write each module's seconds in this run to {MODULE_SECONDS.name} (the order modules go "
                          "out in); run every lane with it: a module run in part is stored by its part")


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def timed_modules() -> dict[str, float]:
    return json.loads(MODULE_SECONDS.read_text(encoding="utf-8")) if MODULE_SECONDS.is_file() else {}


@pytest.hookimpl(trylast=True)  # after lane_rules has given each test its lane
def pytest_collection_modifyitems(config, items):
    """The longest modules first (stable: a module's tests keep their order)."""
    timed, seconds = timed_modules(), {}
    for item in items:
        module = module_of(item.nodeid)
        seconds[module] = timed.get(module, max(seconds.get(module, 0.0), UNTIMED_MODULE_SECONDS[item.stash[LANE]]))
    items.sort(key=lambda item: -seconds[module_of(item.nodeid)])


def _measuring(config) -> bool:
    return config.getoption("store_module_seconds")


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
    if _measuring(item.config):
        now = cpu_seconds()
        report.user_properties.append(("cpu_seconds", now - CPU_MARK[-1]))
        CPU_MARK[:] = [now]
    return report


def pytest_runtest_logreport(report):
    module = module_of(report.nodeid)
    RAN_SECONDS[module] = RAN_SECONDS.get(module, 0.0) + report.duration
    RAN_CPU_SECONDS[module] = RAN_CPU_SECONDS.get(module, 0.0) + dict(report.user_properties).get("cpu_seconds", 0.0)


def pytest_sessionfinish(session, exitstatus):
    if _measuring(session.config) and not hasattr(session.config, "workerinput"):
        timed = timed_modules()
        timed.update({module: round(seconds, 1) for module, seconds in RAN_SECONDS.items()})
        MODULE_SECONDS.write_text(json.dumps(dict(sorted(timed.items())), indent=1) + "\n", encoding="utf-8")


def pytest_terminal_summary(terminalreporter):
    if not (_measuring(terminalreporter.config) and RAN_SECONDS):
        return
    terminalreporter.write_sep("-", "seconds per module: wall, CPU (the worker and its waited-for processes)")
    for module in sorted(RAN_SECONDS, key=RAN_SECONDS.get, reverse=True):
        terminalreporter.write_line(f"{RAN_SECONDS[module]:8.1f} {RAN_CPU_SECONDS.get(module, 0.0):8.1f}  {module}")
    terminalreporter.write_line(f"{sum(RAN_SECONDS.values()):8.1f} {sum(RAN_CPU_SECONDS.values()):8.1f}  in all")
    if MACHINE_AT_START and (now := machine_cpu_seconds()):
        busy, seconds = now[0] - MACHINE_AT_START[0], now[1] - MACHINE_AT_START[1]
        terminalreporter.write_line(f"the machine: {busy:.0f} CPU seconds busy in {seconds:.0f} s, "
                                    f"{busy / seconds:.2f} of its {os.cpu_count()} cores (everything on it counts)")

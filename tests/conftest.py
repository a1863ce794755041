"""Registers the suite's helper modules ``tests/forked_cli.py``, ``tests/engine_fork.py`` and
``tests/step_cases.py`` under their names (the suite runs with ``--import-mode=importlib``: a test module imports them by those names) and stops the forked
CLI's server at the end; prints the costliest tests in CPU seconds beside pytest's ``--durations``; idle OpenMP
threads of every process of the suite sleep (as under the CLI)."""

from __future__ import annotations

import importlib.util
import pathlib
import resource
import sys

import pytest

from rlconform.harness.core.idle_threads import sleep_when_idle

# before a test module imports torch: the suite's processes (test workers, the forked CLI's server and what the
# CLI starts) run many small parallel regions side by side, and spinning idle OpenMP threads took ~40 % of the
# CPU of the in-process checks (harness/core/idle_threads.py); the numbers do not change
sleep_when_idle()


def _register(name: str):
    spec = importlib.util.spec_from_file_location(name, pathlib.Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


forked_cli = _register("forked_cli")
_register("engine_fork")
_register("step_cases")


def pytest_sessionfinish(session, exitstatus):
    forked_cli.stop()


# --- CPU seconds per test: printed beside pytest's --durations (wall time moves with the machine's load, CPU
# seconds do not). A test's figure is its process's user + system time while it ran, plus that of the
# processes it waited for (subprocesses, the forked CLI's children: forked_cli.cpu_seconds).
CPU_KEY = "cpu_s"


def _cpu_now() -> float:
    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime + forked_cli.cpu_seconds


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_START] = _cpu_now()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and _START in item.stash:
        outcome.get_result().user_properties.append((CPU_KEY, round(_cpu_now() - item.stash[_START], 2)))


_START = pytest.StashKey[float]()
_COSTS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    for name, value in report.user_properties:
        if name == CPU_KEY and report.when == "teardown":
            _COSTS[report.nodeid] = value


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    n = config.getoption("durations", None)
    if not n or not _COSTS:
        return
    terminalreporter.write_sep("=", f"slowest {n} CPU seconds (user + system of the test and what it waited for)")
    for nodeid, value in sorted(_COSTS.items(), key=lambda kv: -kv[1])[:n]:
        terminalreporter.write_line(f"{value:8.1f}s {nodeid}")
    terminalreporter.write_line(f"{sum(_COSTS.values()):8.1f}s in all {len(_COSTS)} tests")

"""Registers the suite's helper modules ``tests/forked_cli.py`` and ``tests/engine_fork.py`` under their names
(the suite runs with ``--import-mode=importlib``: a test module imports them by those names) and stops the forked
CLI's server at the end."""

from __future__ import annotations

import importlib.util
import pathlib
import sys


def _register(name: str):
    spec = importlib.util.spec_from_file_location(name, pathlib.Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


forked_cli = _register("forked_cli")
_register("engine_fork")


def pytest_sessionfinish(session, exitstatus):
    forked_cli.stop()

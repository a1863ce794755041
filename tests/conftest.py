"""Registers ``tests/forked_cli.py`` as the module ``forked_cli`` (the suite runs with
``--import-mode=importlib``: a test module imports it by that name) and stops its server at the end."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

_spec = importlib.util.spec_from_file_location("forked_cli", pathlib.Path(__file__).with_name("forked_cli.py"))
forked_cli = importlib.util.module_from_spec(_spec)
sys.modules["forked_cli"] = forked_cli
_spec.loader.exec_module(forked_cli)


def pytest_sessionfinish(session, exitstatus):
    forked_cli.stop()

"""The robustness mechanisms sit in the core layer (design.md: reference <- core <- properties /
distributed_tests <- runner): importing a core module must not import the layers above it."""

from __future__ import annotations

import json
import subprocess
import sys

CORE = ["rlconform.harness.torch_state", "rlconform.harness.interrupts", "rlconform.harness.isolated",
        "rlconform.harness.selection", "rlconform.harness.pool", "rlconform.harness.engines",
        "rlconform.harness.coverage"]
ABOVE = ("rlconform.properties", "rlconform.distributed_tests", "rlconform.harness.cli", "rlconform.harness.fuzz",
         "rlconform.harness.pytest_plugin", "rlconform.harness.report", "rlconform.harness.recorder",
         "rlconform.harness.inflight", "rlconform.harness.outdir", "rlconform.harness.coverage_md")

PROBE = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:   # one after the other: each import is charged with what it adds
    importlib.import_module(name)
    out[name] = sorted(m for m in sys.modules if m.startswith(%r))
print(json.dumps(out))
""" % (ABOVE,)


def test_core_modules_import_nothing_above_them():
    proc = subprocess.run([sys.executable, "-c", PROBE, *CORE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {m: [] for m in CORE}

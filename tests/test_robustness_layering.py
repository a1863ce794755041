"""The robustness mechanisms sit low (docs/architecture.md: torch state in core, interrupts, isolation and
the pool in workers, engine loading with the bindings, coverage in the catalog): importing one must not
import the properties, the report writers or the run layer above it."""

from __future__ import annotations

import json
import subprocess
import sys

CORE = ["rlconform.harness.core.torch_state", "rlconform.harness.workers.interrupts", "rlconform.harness.workers.isolated",
        "rlconform.harness.workers.pool", "rlconform.harness.bindings.load",
        "rlconform.harness.catalog.coverage"]
ABOVE = ("rlconform.properties", "rlconform.distributed_tests", "rlconform.harness.cli", "rlconform.harness.run.fuzz",
         "rlconform.harness.run.pytest_plugin", "rlconform.harness.report.writer", "rlconform.harness.run.recorder",
         "rlconform.harness.run.inflight", "rlconform.harness.run.outdir", "rlconform.harness.report.coverage_md")

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

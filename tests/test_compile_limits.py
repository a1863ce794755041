"""A process that runs engine code keeps compiling a ``torch.compile``'d engine function past dynamo's
default recompile limit, whatever ran before (verl's vocab-parallel entropy gave another answer
after 27 other findings had run in the same rank; :mod:`rlconform.harness.core.compile_limits`). The pool
ranks' side is ``tests/test_pool_idle.py``; this is the single-process check's."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import json
import numpy as np
import torch._dynamo.config as dynamo_config
dynamo_config.recompile_limit = 8
dynamo_config.accumulated_recompile_limit = 256
from rlconform.harness.bindings.load import load_engine
from rlconform.properties.case import Case
from rlconform.properties.checks import run_check
case = Case("entropy", "matches_reference", "float32", "moderate",
            {"logits": np.array([[0.5, -1.0, 2.0], [1.0, 1.0, 0.0]]), "grad_output": np.ones(2)})
outcome = run_check(load_engine("reference"), case)
print(json.dumps({"verdict": getattr(outcome, "verdict", None), "recompile_limit": dynamo_config.recompile_limit,
                  "accumulated_recompile_limit": dynamo_config.accumulated_recompile_limit}))
"""


def test_single_process_check_raises_dynamos_recompile_limits():
    from rlconform.harness.core.compile_limits import ACCUMULATED_RECOMPILE_LIMIT, RECOMPILE_LIMIT

    proc = subprocess.run([sys.executable, "-P", "-c", SCRIPT], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"verdict": "pass", "recompile_limit": RECOMPILE_LIMIT,
                   "accumulated_recompile_limit": ACCUMULATED_RECOMPILE_LIMIT}, got


def test_limits_are_never_lowered(monkeypatch):
    import types

    from rlconform.harness.core import compile_limits

    fake = types.SimpleNamespace(recompile_limit=1 << 20, accumulated_recompile_limit=8)
    monkeypatch.setitem(sys.modules, "torch._dynamo.config", fake)
    assert compile_limits.keep_compiling() is True
    assert fake.recompile_limit == 1 << 20 and fake.accumulated_recompile_limit == compile_limits.ACCUMULATED_RECOMPILE_LIMIT
    monkeypatch.delitem(sys.modules, "torch._dynamo.config")
    assert compile_limits.keep_compiling() is False

"""One verdict on every machine (issue 21): a narrowed check of verl's real entropy and ``agg_loss`` gives
the same status for every finding under torch's native kernels, ``ATEN_CPU_CAPABILITY=avx2`` and
``=default`` (other vector widths: other last bits), with 1 and 2 intra-op threads and with 1 and 2 engine
workers. The configurations cover every value of each factor (a pairwise design, not the full product:
three runs instead of twelve); ``../shared/tools/verdict-stability.sh`` runs the same comparison on any
selection. What makes it hold: the margin band of harness/core/tolerance.py (``verdict``) and examples
that never follow the engine's output (no ``target()`` in ``check``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("verl")
pytestmark = [pytest.mark.engines, pytest.mark.slow]

SELECTION = ["--engine", "verl", "--op", "entropy", "--op", "agg_loss", "--property", "matches_reference",
             "--profile", "ci", "--max-examples", "6", "-q"]
#: name -> (environment changes, engine workers)
CONFIGS = {
    "native, 2 threads, -n 2": ({"ATEN_CPU_CAPABILITY": None, "OMP_NUM_THREADS": "2"}, "2"),
    "avx2, 1 thread, -n 1": ({"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "1"}, "1"),
    "default, 2 threads, -n 1": ({"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "2"}, "1"),
}


def _statuses(tmp_path, name: str) -> dict[str, str]:
    changes, workers = CONFIGS[name]
    env = dict(os.environ)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    out = tmp_path / name.replace(",", "").replace(" ", "_")
    proc = subprocess.run([sys.executable, "-m", "rlconform.harness.cli", "check", *SELECTION, "-n", workers,
                           "--out", str(out)], capture_output=True, text=True, timeout=3000, env=env)
    assert proc.returncode in (0, 1), f"{name}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    doc = json.loads((out / "report.json").read_text())
    assert doc["run"]["complete"], name
    return {f["id"]: f["status"] for f in doc["findings"]}


def test_every_finding_has_one_status_on_every_kernel_thread_count_and_worker_count(tmp_path):
    runs = {name: _statuses(tmp_path, name) for name in CONFIGS}
    ids = set().union(*runs.values())
    assert len(ids) >= 30, sorted(ids)  # entropy and agg_loss, every dtype: nothing silently deselected
    assert all(set(r) == ids for r in runs.values()), {n: sorted(ids - set(r)) for n, r in runs.items()}
    differ = {i: {n: r[i] for n, r in runs.items()} for i in sorted(ids) if len({r[i] for r in runs.values()}) > 1}
    assert not differ, "verdicts that depend on the machine:\n" + "\n".join(f"{i}: {d}" for i, d in differ.items())
    first = next(iter(runs.values()))
    # not vacuous: the selection holds verl's known discrepancies (agg_loss seq-mean modes, NaN entropy on
    # -inf logits) and passing findings alike
    assert {"discrepancy", "pass"} <= set(first.values()), sorted(set(first.values()))

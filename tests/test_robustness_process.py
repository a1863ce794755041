"""An engine that ends or aborts its process never turns a run green.

``rlconform check`` runs the engine only in pytest-xdist workers. ``tests/bindings/faults.py`` breaks
its process in a different way in each op, on one input regime: ``os._exit(0)``, a segfault,
``KeyboardInterrupt``, ``SystemExit``, SIGKILL (the OOM killer), ``os._exit(3)`` and a ``MemoryError``
from exhausting a capped address space. Each must be a ``crash`` of that finding saying how the process
ended, the run must go on in a fresh worker, the exit code must be 1, and ``fuzz`` must not exit 0 either.
"""

from __future__ import annotations

import json
import os

import forked_cli
import pytest

BINDINGS = os.path.join(os.path.dirname(__file__), "bindings")
FAULTS = os.path.join(BINDINGS, "faults.py")

#: op -> (the regime that triggers its fault, words the crash message must contain)
EXPECTED = {
    "logsumexp": ("neg_inf_padded", "exited with code 0"),
    "token_logprobs": ("neg_inf_padded", "SIGSEGV"),
    "entropy": ("neg_inf_padded", "raised KeyboardInterrupt"),
    "sum_pi_squared": ("neg_inf_padded", "raised SystemExit"),
    "masked_sum": ("all_off", "SIGKILL"),
    "masked_mean": ("all_off", "exited with code 3"),
    "masked_max": ("all_on", "MemoryError"),  # (all_off: the max of nothing is undefined, any crash is fine)
}


def cli(*args, cwd=None, timeout=900):
    return forked_cli.run(args, cwd=cwd, timeout=timeout)


@pytest.mark.cli
@pytest.mark.slow
def test_every_way_an_engine_ends_its_process_is_that_findings_crash(tmp_path):
    out = tmp_path / "out"
    ops = [a for op in EXPECTED for a in ("--op", op)]
    proc = cli("check", "--engine", FAULTS, *ops, "--property", "matches_reference", "--dtype", "float64",
               "--max-examples", "3", "--out", str(out), "-q")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    assert doc["run"]["complete"] and not doc["run"]["not_run"]
    by_id = {f["id"]: f for f in doc["findings"]}
    for op, (regime, words) in EXPECTED.items():
        f = by_id[f"{op}.matches_reference.float64.{regime}"]
        assert f["status"] == "crash", (f["id"], f["status"], f["message"])
        assert words in f["message"] + (f["traceback"] or ""), (f["id"], f["message"])
        assert f["reproducer"] and os.path.exists(out / f["reproducer"]["case_file"]), f["id"]  # the case in flight
    # the run went on: every other finding was checked (random masks may be fully masked too)
    for f in doc["findings"]:
        if f["status"] != "pass":
            regime, words = EXPECTED[f["op"]]
            assert f["status"] == "crash" and words in f["message"] + (f["traceback"] or ""), f["id"]
    assert sum(f["status"] == "pass" for f in doc["findings"]) >= len(doc["findings"]) - 2 * len(EXPECTED)
    # a segfault comes with the Python stack faulthandler wrote
    seg = by_id["token_logprobs.matches_reference.float64.neg_inf_padded"]
    assert "faults.py" in seg["traceback"]


@pytest.mark.cli
def test_the_process_that_decides_the_exit_code_never_loads_a_users_binding(tmp_path):
    """A binding file whose import calls os._exit(0): a usage error (exit 2), never a green run."""
    f = tmp_path / "exit_on_import.py"
    f.write_text("import os\nos._exit(0)\n")
    proc = cli("check", "--engine", str(f), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "exited with code 0" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.cli
def test_fuzz_does_not_exit_0_when_the_engine_ends_its_process(tmp_path):
    proc = cli("fuzz", "--engine", FAULTS, "--op", "logsumexp", "--property", "matches_reference", "--dtype",
               "float64", "--max-examples", "4", "--stats", "s.json", cwd=tmp_path)  # an example budget: any load
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "crash logsumexp.matches_reference.float64.neg_inf_padded" in proc.stderr
    assert "exited with code 0" in proc.stderr
    stats = json.loads((tmp_path / "s.json").read_text())
    crashed = [t["id"] for t in stats["targets"] if t.get("status") == "crash"]
    assert crashed == ["logsumexp.matches_reference.float64.neg_inf_padded"]

"""A finding's status, message and reproducer describe one and the same failing case.

The binding tests/bindings/crash_when_small.py is 2× wrong on every input with more than one element and
raises on a one-element input: the first failing example is a discrepancy, shrinking reaches the crash.
The report must then say crash, quote the engine's error (not the earlier discrepancy's numbers) and point
at the one-element case, which replays as a crash."""

from __future__ import annotations

import json
import os

import pytest

BINDING = os.path.join(os.path.dirname(__file__), "bindings", "crash_when_small.py")
import forked_cli


def _cli(*args):
    return forked_cli.run(args, timeout=900)


@pytest.mark.cli
def test_a_crash_found_while_shrinking_a_discrepancy_is_reported_as_that_crash(tmp_path):
    out = tmp_path / "r"
    proc = _cli("check", "--engine", BINDING, "--op", "masked_sum", "--property", "matches_reference",
                "--dtype", "float64", "--regime", "padded", "--out", str(out), "-q")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    (f,) = json.loads((out / "report.json").read_text())["findings"]
    assert f["examples_to_first_failure"] == 1 and f["shrink_steps"] > 0  # found as a discrepancy, then shrunk
    assert f["status"] == "crash", f
    assert "one element: crash_when_small" in f["message"] and "vs reference" not in f["message"], f["message"]
    assert f["worst_input"].startswith("values[1, 1]"), f["worst_input"]
    replay = _cli("replay", str(out / f["reproducer"]["case_file"]), "--engine", BINDING)
    assert replay.returncode == 1 and "crash_when_small" in replay.stdout + replay.stderr, replay.stdout[-2000:]

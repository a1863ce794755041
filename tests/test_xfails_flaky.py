"""A ledger line marked ``# flaky: why`` is non-strict: its finding is ``xfail`` when it fails and ``pass``
(with a note) when it passes, never ``xpass``; an unmarked line stays strict (harness/report/xfails.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from rlconform.harness.report.xfails import is_flaky, parse_xfails

BINDING = os.path.join(os.path.dirname(__file__), "bindings", "crash_when_small.py")
FID = "masked_sum.matches_reference.float64.padded"


def _check(tmp_path, engine, ledger_line):
    ledger = tmp_path / "xfails.txt"
    ledger.write_text(ledger_line + "\n")
    out = tmp_path / "r"
    proc = subprocess.run([sys.executable, "-m", "rlconform.harness.cli", "check", "--engine", engine, "--op",
                           "masked_sum", "--property", "matches_reference", "--dtype", "float64", "--regime",
                           "padded", "--max-examples", "3", "--xfails", str(ledger), "--out", str(out), "-q"],
                          capture_output=True, text=True, timeout=900)
    (f,) = json.loads((out / "report.json").read_text())["findings"]
    return proc.returncode, f


def test_is_flaky_reads_the_comment(tmp_path):
    ledger = tmp_path / "x.txt"
    ledger.write_text(f"{FID}  # Flaky: borderline\nentropy.matches_reference.float32.moderate  # flakiness is another word\n")
    parsed = parse_xfails(str(ledger))
    assert is_flaky(parsed[FID]) and not is_flaky(parsed["entropy.matches_reference.float32.moderate"])
    assert not is_flaky("discrepancy: flaky in the middle") and not is_flaky(None)


def test_a_flaky_entry_that_passes_is_a_pass_with_a_note(tmp_path):
    rc, f = _check(tmp_path, "reference", f"{FID}  # flaky: seen both ways")
    assert rc == 0 and f["status"] == "pass", f
    assert "listed as flaky" in f["message"] and "seen both ways" in f["message"]


def test_a_flaky_entry_that_fails_is_an_xfail(tmp_path):
    rc, f = _check(tmp_path, BINDING, f"{FID}  # flaky: seen both ways")
    assert rc == 0 and f["status"] == "xfail", f


def test_an_unmarked_entry_that_passes_is_still_an_xpass(tmp_path):
    rc, f = _check(tmp_path, "reference", f"{FID}  # discrepancy: fixed since")
    assert rc == 1 and f["status"] == "xpass", f

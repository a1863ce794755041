"""The shrinking budget: a failing finding shrinks at most ``--max-shrinks`` steps (by profile: 50 in
``ci``), listed in the xfails ledger or not, and its status never depends on the budget."""

from __future__ import annotations

import json

import forked_cli
import pytest

from rlconform.harness.core.profiles import MAX_SHRINKS, shrink_budget

FINDING = "entropy.finite_where_reference_finite.float32.neg_inf_padded"


def check(tmp_path, name, *extra):
    out = tmp_path / name
    proc = forked_cli.run(["check", "--engine", "mutants.naive_entropy",
                           "--op", "entropy", "--property", "finite_where_reference_finite", "--dtype", "float32",
                           "--out", str(out), "-q", "--max-examples", "5", "-n", "0", *extra], timeout=900)
    doc = json.loads((out / "report.json").read_text())
    return proc, next(f for f in doc["findings"] if f["id"] == FINDING), doc


def test_budget_by_profile_and_ledger():
    assert shrink_budget("ci", listed=False) == MAX_SHRINKS["ci"] == 50
    assert shrink_budget("ci", listed=True) == 50  # a listed finding's report row is its shrunk input's
    assert shrink_budget("nightly", listed=False) is None
    assert shrink_budget("ci", listed=True, override=7) == 7 and shrink_budget("ci", False, override=-1) is None


@pytest.mark.cli
def test_max_shrinks_caps_shrinking_and_keeps_the_verdict(tmp_path):
    proc, full, _ = check(tmp_path, "full", "--max-shrinks", "-1")
    # unbounded, this finding's shrink takes a few steps (3 with hypothesis as pinned): the cap is set below it,
    # read from the run rather than written here, so a change of the draws does not turn the test vacuous
    steps = full["shrink_steps"]
    assert proc.returncode == 1 and full["status"] == "discrepancy" and steps >= 2, steps
    cap = steps - 1
    proc, capped, doc = check(tmp_path, "capped", "--max-shrinks", str(cap))
    assert proc.returncode == 1 and capped["status"] == "discrepancy"
    assert capped["shrink_steps"] <= cap and capped["reproducer"], (cap, capped)
    assert doc["run"]["max_shrinks"] == {"per_finding": cap, "ledger_listed": cap}


@pytest.mark.cli
def test_a_listed_finding_shrinks_as_an_unlisted_one_and_reads_the_same(tmp_path):
    # a listed finding that stopped at its first failing example was read from another input than the
    # committed report's (verl: 38 defects with the ledger, 34 without, the same findings)
    ledger = tmp_path / "xfails.txt"
    ledger.write_text(f"{FINDING}  # known\n")
    proc, listed, doc = check(tmp_path, "listed", "--xfails", str(ledger))
    assert proc.returncode == 0 and listed["status"] == "xfail", proc.stdout[-2000:]
    assert listed["xfail_of"] == "discrepancy" and listed["reproducer"], listed
    assert doc["run"]["max_shrinks"] == {"per_finding": 50, "ledger_listed": 50}
    _, unlisted, plain = check(tmp_path, "unlisted")
    assert unlisted["status"] == "discrepancy" and unlisted["shrink_steps"] >= 1, unlisted
    assert (listed["shrink_steps"], listed["worst_input"]) == (unlisted["shrink_steps"], unlisted["worst_input"])
    assert [d["id"] for d in doc["defects"]] == [d["id"] for d in plain["defects"]] != []

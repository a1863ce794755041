"""``check --shard K/N`` splits one selection into N deterministic, cost-balanced parts, and
``report --merge`` combines their reports into the report of a single run (findings, defects, ledger
verdicts, exit code)."""

from __future__ import annotations

import json

import forked_cli
import pytest

from rlconform.harness.run.selection import shard_of

# -n 0 --no-referee: a mutant is rlconform's own code, checked in the CLI's process; sharding and merging do
# not depend on where the findings run (the worker and referee paths are tests/test_robustness_*.py's and
# tests/test_referee_*.py's)
ARGS = ["--engine", "mutants.naive_entropy", "--op", "entropy", "--property", "matches_reference",
        "--property", "finite_where_reference_finite", "--dtype", "float32", "--dtype", "float64",
        "--max-examples", "3", "-q", "-n", "0", "--no-referee"]


def test_shards_are_a_partition_balanced_by_cost_and_deterministic():
    ids = [f"f{i}" for i in range(10)]
    costs = {"f0": 9.0, "f1": 1.0, "f2": 1.0, "f3": 1.0, "f4": 1.0, "f5": 1.0, "f6": 1.0, "f7": 1.0, "f8": 1.0}
    parts = [shard_of(ids, costs, k, 3) for k in (1, 2, 3)]
    assert sorted(x for p in parts for x in p) == sorted(ids)
    assert parts[0] == ["f0"]  # the expensive one alone; f9 (no cost) costs the median
    loads = [sum(costs.get(i, 1.0) for i in p) for p in parts]
    assert max(loads[1:]) - min(loads[1:]) <= 1.0
    assert parts == [shard_of(ids, costs, k, 3) for k in (1, 2, 3)]


def _statuses(doc):
    return {f["id"]: f["status"] for f in doc["findings"]}


@pytest.mark.cli
@pytest.mark.slow
def test_three_shards_merge_into_the_single_runs_report(tmp_path):
    single = tmp_path / "single"
    proc = forked_cli.run(["check", *ARGS, "--out", str(single)], timeout=900)
    assert proc.returncode == 1, proc.stderr[-2000:]
    ledger = tmp_path / "xfails.txt"
    wrote = forked_cli.run(["ledger", str(single)], timeout=300)
    ledger.write_text(wrote.stdout + "defect verl.x.never_fails | wrong value | entropy.matches_reference\n")
    # (a line whose key never fails: its verdict must come out of the merge as out of the single run)
    runs = {}
    for name, extra in [("whole", []), *((f"s{k}", ["--shard", f"{k}/3", "--shard-costs",
                                                   str(single / "report.json")]) for k in (1, 2, 3))]:
        out = tmp_path / name
        runs[name] = forked_cli.run(["check", *ARGS, "--xfails", str(ledger), "--out", str(out), *extra], timeout=900)
    whole = json.loads((tmp_path / "whole" / "report.json").read_text())
    shard_ids = [set(_statuses(json.loads((tmp_path / f"s{k}" / "report.json").read_text()))) for k in (1, 2, 3)]
    assert all(shard_ids) and sum(map(len, shard_ids)) == len(whole["findings"])
    merged_dir = tmp_path / "merged"
    merged_proc = forked_cli.run(["report", str(tmp_path / "s1"), "--merge", str(tmp_path / "s2"),
                                  str(tmp_path / "s3"), "--to", str(merged_dir)], timeout=300)
    merged = json.loads((merged_dir / "report.json").read_text())
    assert _statuses(merged) == _statuses(whole)
    assert [d["id"] for d in merged["defects"]] == [d["id"] for d in whole["defects"]]
    strip = lambda lines: [(d["key"], d["status"], sorted(d["findings"])) for d in lines]  # noqa: E731
    assert strip(merged["run"]["ledger_defects"]) == strip(whole["run"]["ledger_defects"])
    assert merged_proc.returncode == runs["whole"].returncode, merged_proc.stderr[-2000:]
    assert merged["run"]["complete"] is True
    bad = forked_cli.run(["report", str(tmp_path / "s1"), "--merge", str(tmp_path / "s2"), "--to",
                          str(tmp_path / "m2")], timeout=300)
    assert bad.returncode == 2 and "each of 1..N" in bad.stderr

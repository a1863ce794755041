"""Parts of the commands that run without an engine or a check, in the test's process: the files ``init``
writes, the ``--referee`` switch, which process of a check this is, the progress line, the audit's record
of an engine without coverage, and the coverage items a change touches."""

from __future__ import annotations

import argparse
import ast
import subprocess
import types

import pytest
import yaml

from rlconform.harness.bindings.load import load_engine
from rlconform.harness.core.code_changes import ChangeError
from rlconform.harness.report.coverage_changes import changed_items
from rlconform.harness.report.xfails import parse_ledger
from rlconform.harness.run import audit, init_cmd, referee_flag
from rlconform.harness.run.plugin_controller import progress_line
from rlconform.harness.run.plugin_state import is_controller, is_worker, state_of


def test_init_writes_a_workflow_a_ledger_and_a_binding_that_parse(tmp_path):
    workflow = yaml.safe_load(init_cmd.workflow_text("owner/rlconform@v1", "verl"))
    steps = [s.get("uses") or s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"]]
    assert any("owner/rlconform@v1" in s for s in steps) and any("coverage" in s and "--strict" in s for s in steps)
    (tmp_path / "xfails.txt").write_text(init_cmd.ledger_text("verl"))
    assert not parse_ledger(str(tmp_path / "xfails.txt")).findings  # empty, with a header that says how to fill it
    ast.parse(init_cmd.binding_text("verl"))


@pytest.mark.parametrize("value,on", [("", True), ("1", True), (" Off ", False), ("no", False), ("0", False)])
def test_the_referee_is_on_for_an_engine_unless_the_environment_says_off(monkeypatch, value, on):
    monkeypatch.setenv("RLCONFORM_REFEREE", value)
    assert referee_flag.default() is on
    parser = argparse.ArgumentParser()
    referee_flag.add_argument(parser)
    assert parser.parse_args([]).referee is None  # decided once the engine is known
    assert referee_flag.resolve(None, own_code=False) is on
    # rlconform's own code is judged in its process unless the environment asks for the referee
    assert referee_flag.resolve(None, own_code=True) is (value.strip() not in ("", "Off", "no", "0"))
    for own in (False, True):  # the command line wins
        assert referee_flag.resolve(False, own) is False and referee_flag.resolve(True, own) is True
    assert parser.parse_args(["--no-referee"]).referee is False and parser.parse_args(["--referee"]).referee is True


def test_which_process_of_a_check_this_is():
    single = types.SimpleNamespace(option=types.SimpleNamespace(dist="no"))
    controller = types.SimpleNamespace(option=types.SimpleNamespace(dist="load"))
    worker = types.SimpleNamespace(option=types.SimpleNamespace(dist="load"), workerinput={})
    assert (is_worker(single), is_controller(single)) == (False, False)
    assert (is_worker(controller), is_controller(controller)) == (False, True)
    assert (is_worker(worker), is_controller(worker)) == (True, False)
    assert state_of(single) is None


def test_the_progress_line_estimates_the_time_left():
    assert progress_line(0, 10, 3.0) == "rlconform: 0/10 findings · 3 s"
    assert progress_line(120, 236, 302.0) == "rlconform: 120/236 findings · 5 min 2 s · about 4 min 52 s left"
    assert progress_line(10, 10, 61.0) == "rlconform: 10/10 findings · 1 min 1 s"
    assert progress_line(5, 10, 60.0, left_s=200.0) == "rlconform: 5/10 findings · 1 min 0 s · about 3 min 20 s left"


def test_the_time_left_weighs_each_finding_by_its_ops_cost_so_far():
    """Four cheap findings took 40 s of wall for 2 cost-seconds: the two left of the same op are 20 s more; two of a
    costly op seen at 8 cost-seconds weigh 16 times as much; an op not seen yet costs the mean of all; nothing
    recorded yet gives no estimate (the line falls back to the count)."""
    from rlconform.harness.run.plugin_controller import time_left

    cheap = {f"masked_sum.p.float32.r{i}": 0.5 for i in range(4)}
    assert time_left(40.0, cheap, ["masked_sum.p.float32.r8", "masked_sum.p.float32.r9"]) == 20.0
    seen = dict(cheap, **{"policy_step.p.float32.a": 8.0})  # 10 cost-seconds in 100 s
    assert time_left(100.0, seen, ["policy_step.p.float32.b", "policy_step.p.float32.c"]) == 160.0
    assert time_left(100.0, seen, ["entropy.p.float32.a"]) == 20.0  # the mean of all five: 2 cost-seconds
    assert time_left(10.0, {}, ["a.p.float32.r"]) is None and time_left(10.0, {"a.p.f.r": 0.0}, ["a.p.f.s"]) is None


def test_the_audit_of_an_engine_without_coverage_has_no_hits():
    record = audit.audit_record(load_engine("reference"))
    assert record["engine"] == "reference" and record["hits"] == [] and record["coverage"] == {"items": []}
    parser = argparse.ArgumentParser()
    audit.add_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["audit", "--format", "json"]).format == "json"


def test_the_coverage_items_a_change_touches(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                       env={"GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})

    src = tmp_path / "losses.py"
    src.write_text("def agg_loss(x):\n    return x\n\n\ndef kl(x):\n    return x\n")
    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "empty")
    git("add", "losses.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
    src.write_text("def agg_loss(x):\n    return x.sum()\n\n\ndef kl(x):\n    return x\n")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-am", "head")
    record = {"items": [{"name": "agg_loss", "site": "losses.py:1", "status": "bound"},
                        {"name": "kl", "site": "losses.py:5", "status": "unbound"}]}
    got = changed_items(record, str(tmp_path), "HEAD~1")
    assert [i["name"] for i in got["items"]] == ["agg_loss"] and got["counts"] == {"bound": 1}
    assert changed_items(record, str(tmp_path), "HEAD")["items"] == []
    with pytest.raises(ChangeError):
        changed_items(record, str(tmp_path), "no-such-revision")

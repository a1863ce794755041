"""The smaller pieces of the pull-request flow: extending a stock binding, the lock
file of an output folder, an unavailable op's cause, and a console that speaks rlconform only."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap

import forked_cli
import pytest

from rlconform.harness.catalog.binding import Binding, BindingError, Coverage
from rlconform.harness.run.outdir import LOCK_NAME, OutDirError, claim


def _cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return forked_cli.run(args, cwd=cwd, env={**os.environ, "PYTHONSAFEPATH": "1"})


# --------------------------------------------------------------------------- Binding.extend
FORK = '''
import torch


def masked_mean(values, mask):
    m = mask.bool()
    return (torch.where(m, values, torch.zeros((), dtype=values.dtype)).double().sum() / m.sum()).to(values.dtype)


def fancy_norm(x):
    return x / x.norm()
'''


def _fork(tmp_path, extend: str) -> str:
    (tmp_path / "forknum.py").write_text(FORK)
    (tmp_path / "fork_binding.py").write_text(textwrap.dedent(f'''
        import forknum
        from rlconform.harness.catalog.binding import Binding, Coverage

        stock = Binding(name="stockish", ops={{}}, coverage=Coverage(modules=()))
        binding = stock.extend({extend})
    '''))
    return str(tmp_path / "fork_binding.py")


def test_extend_returns_a_new_binding_and_leaves_the_stock_one():
    stock = Binding(name="e", ops={"entropy": len}, coverage=Coverage(modules=("a",), not_bound={"a.x": "why"}))
    fork = stock.extend(ops={"masked_mean": min}, not_bound={"a.y": "a logging helper"}, modules=("b",))
    assert fork.provided_ops() == ["entropy", "masked_mean"] and stock.provided_ops() == ["entropy"]
    assert dict(fork.coverage.not_bound) == {"a.x": "why", "a.y": "a logging helper"}
    assert fork.coverage.modules == ("a", "b") and stock.coverage.modules == ("a",)
    with pytest.raises(BindingError, match="unknown op"):
        stock.extend(ops={"no_such_op": min})
    with pytest.raises(BindingError, match="need a binding that declares coverage"):
        Binding(name="n", ops={}).extend(not_bound={"a.y": "why"})


@pytest.mark.cli
@pytest.mark.slow
def test_a_forks_function_bound_and_justified_passes_coverage_strict(tmp_path):
    """The fork's module holds masked_mean (bound to the existing op) and fancy_norm: unbound until justified."""
    only_bound = _fork(tmp_path, 'ops={"masked_mean": forknum.masked_mean}, modules=("forknum",)')
    strict = _cli("coverage", "--engine", only_bound, "--engine-path", str(tmp_path), "--strict", "--format", "json")
    assert strict.returncode == 1 and "forknum.fancy_norm" in strict.stdout, strict.stdout + strict.stderr
    justified = _fork(tmp_path, 'ops={"masked_mean": forknum.masked_mean}, modules=("forknum",), '
                                'not_bound={"forknum.fancy_norm": "feature scaling of the reward model, not an op"}')
    ok = _cli("coverage", "--engine", justified, "--engine-path", str(tmp_path), "--strict", "--format", "md")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "feature scaling of the reward model" in ok.stdout


# --------------------------------------------------------------------------- the lock file
def test_lock_file_is_removed_when_the_folder_is_released(tmp_path):
    out = claim(str(tmp_path / "r"))
    assert (tmp_path / "r" / LOCK_NAME).exists()
    with pytest.raises(OutDirError, match="another rlconform run"):
        claim(str(tmp_path / "r"))
    out.release()
    assert not (tmp_path / "r" / LOCK_NAME).exists()
    claim(str(tmp_path / "r")).release()  # the folder is usable again
    assert os.listdir(tmp_path / "r") == []


# --------------------------------------------------------------------------- unavailable op, console
BROKEN = '''
from rlconform.harness.catalog.binding import Binding, Lazy

binding = Binding(name="broken", ops={"masked_mean": Lazy("no_such_module_rlconform_test:fn"),
                                      "masked_sum": Lazy("torch:sum")})
'''


@pytest.mark.cli
@pytest.mark.slow
def test_unavailable_op_is_one_line_with_its_cause_and_the_console_speaks_rlconform(tmp_path):
    (tmp_path / "broken.py").write_text(BROKEN)
    proc = _cli("check", "--engine", str(tmp_path / "broken.py"), "--op", "masked_mean", "--property",
                "matches_reference", "--max-examples", "2", "--out", str(tmp_path / "r"), cwd=tmp_path)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 1, console
    assert "Traceback (most recent call last)" not in console
    assert "ModuleNotFoundError: No module named 'no_such_module_rlconform_test'" in console
    lines = [x for x in console.splitlines() if x.startswith("unavailable op masked_mean")]
    assert len(lines) == 1, console  # one line for the op, not one per finding
    for noise in ("bringing up nodes", "warnings summary", "[100%]", "short test summary"):
        assert noise not in console, (noise, console)
    assert not re.search(r"\d+ (passed|failed|skipped)", console), console
    report = (tmp_path / "r" / "report.md").read_text()
    assert "ModuleNotFoundError: No module named 'no_such_module_rlconform_test'" in report
    assert not (tmp_path / "r" / LOCK_NAME).exists()


# --------------------------------------------------------------------------- report.md fits a comment
GITHUB_COMMENT_LIMIT = 65_536


def _committed_verl_report(tmp_path):
    import json
    import pathlib
    import shutil

    src = pathlib.Path(__file__).resolve().parents[1] / "reports" / "verl-0.9.1"
    shutil.copy(src / "report.json", tmp_path / "report.json")
    return json.loads((tmp_path / "report.json").read_text())


@pytest.mark.cli
def test_report_md_of_the_committed_verl_report_fits_a_github_comment(tmp_path):
    import json

    _committed_verl_report(tmp_path)
    proc = _cli("report", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert len((tmp_path / "report.md").read_text()) < GITHUB_COMMENT_LIMIT
    # a fork that declares ten times the conventions still fits: the section is summarised
    doc = json.loads((tmp_path / "report.json").read_text())
    declared = doc["engine"].get("declared") or []
    assert declared, "the committed verl report declares conventions"
    doc["engine"]["declared"] = [{**d, "name": f"{d['name']}_{k}"} for k in range(10) for d in declared]
    from rlconform.harness.report.writer import render_markdown

    md = render_markdown(doc)
    assert len(md) < GITHUB_COMMENT_LIMIT
    assert "more declared items: see report.html or report.json" in md


# --------------------------------------------------------------------------- pasteable reproducers
WRONG_COUNT = '''
import torch
from rlconform.harness.catalog.binding import Binding


def masked_mean(values, mask):
    m = mask.bool()
    return (torch.where(m, values, torch.zeros((), dtype=values.dtype)).double().sum() / m.numel()).to(values.dtype)


binding = Binding(name="wrongcount", ops={"masked_mean": masked_mean})
'''


@pytest.mark.cli
@pytest.mark.slow
def test_printed_reproducer_of_a_module_attr_engine_runs_when_pasted(tmp_path):
    """`--engine mod:attr` found through PYTHONPATH: the printed command names the folder it imports from."""
    (tmp_path / "wrongcount.py").write_text(WRONG_COUNT)
    env = {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONPATH": str(tmp_path)}
    proc = forked_cli.run(["check", "--engine", "wrongcount:binding",
                           "--property", "matches_reference", "--dtype", "float32", "--max-examples", "5",
                           "--out", "r", "-q"], cwd=tmp_path, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    printed = [x.split("reproduce: ", 1)[1] for x in proc.stdout.splitlines() if "reproduce: " in x]
    assert printed and f"--engine-path {tmp_path}" in printed[0], printed
    import shlex

    argv = shlex.split(printed[0])
    assert argv[0] == "rlconform"
    pasted = forked_cli.run([*argv[1:]], cwd=tmp_path, env={**os.environ, "PYTHONSAFEPATH": "1"})  # no PYTHONPATH
    assert pasted.returncode == 1 and "DISCREPANCY" in pasted.stdout, pasted.stdout + pasted.stderr


def test_a_log_gets_a_progress_line_with_the_time_left():
    """Under ``-q`` in CI (no terminal) the log shows progress every minute, with an estimate of the time left:
    minutes of silence read as a hung job."""
    from rlconform.harness.run.pytest_plugin import progress_line

    assert progress_line(120, 236, 302) == "rlconform: 120/236 findings · 5 min 2 s · about 4 min 52 s left"
    assert progress_line(0, 236, 5) == "rlconform: 0/236 findings · 5 s"
    assert "left" not in progress_line(236, 236, 600)


@pytest.mark.cli
@pytest.mark.slow
def test_a_quiet_check_in_a_log_prints_progress_lines(tmp_path):
    proc = forked_cli.run(["check", "--engine", "reference", "--op", "masked_sum", "--property", "matches_reference",
                           "--out", str(tmp_path / "o"), "-q", "-n", "1", "--max-examples", "2"],
                          env={**os.environ, "RLCONFORM_PROGRESS_EVERY_S": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [x for x in proc.stderr.splitlines() if re.match(r"rlconform: \d+/\d+ findings · ", x)]
    assert lines and "left" in lines[-1], proc.stderr[-2000:]

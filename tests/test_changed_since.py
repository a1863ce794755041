"""``rlconform check --changed-since REV``: the findings of the engine functions a change
touched, and of those that call them inside the package, plus the ledger's.

The fast tests read a tiny git repository built here (no engine imported); the slow one forks the
installed verl into a git repository, changes one function and runs the check on it."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import forked_cli
import pytest

from rlconform.harness.core.code_changes import ChangeError, changed_functions, changed_lines
from rlconform.harness.run.changed_since import read_selection, select_changed

_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}

MOD = '''import functools

from pkg import helpers
from pkg.helpers import scale as _scale


def leaf(x):
    return x + 1


def middle(x):
    return leaf(x) * 2


def top(x):
    return middle(x)


def uses_module(x):
    return helpers.shift(x)


def uses_alias(x):
    return _scale(x)


@functools.lru_cache
def decorated(x):
    return x


def untouched(x):
    return x


def two_lines(x):
    x = x + 1
    return x
'''
HELPERS = '''def shift(x):
    return x - 1


def scale(x):
    return x * 3
'''


def git(repo, *args):
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env={**os.environ, **_ENV})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "ops.py").write_text(MOD)
    (tmp_path / "pkg" / "helpers.py").write_text(HELPERS)
    git(tmp_path, "init", "-q", "-b", "main")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "base")
    return tmp_path


def commit_edit(repo, path, old, new):
    p = repo / path
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new, 1))
    git(repo, "commit", "-qam", "edit")


FNS = [("pkg/ops.py", q) for q in ("leaf", "middle", "top", "uses_module", "uses_alias", "decorated", "untouched",
                                         "two_lines")]


def test_own_lines_and_callers_within_the_package(repo):
    commit_edit(repo, "pkg/ops.py", "return x + 1", "return x + 2")
    got = changed_functions(str(repo), changed_lines(str(repo), "HEAD~1"), FNS, "pkg")
    assert got[("pkg/ops.py", "leaf")] == [("pkg/ops.py", "leaf")]
    assert got[("pkg/ops.py", "top")] == [("pkg/ops.py", "top"), ("pkg/ops.py", "middle"), ("pkg/ops.py", "leaf")]
    assert set(got) == {("pkg/ops.py", "leaf"), ("pkg/ops.py", "middle"), ("pkg/ops.py", "top")}
    one_level = changed_functions(str(repo), changed_lines(str(repo), "HEAD~1"), FNS, "pkg", transitive=False)
    assert set(one_level) == {("pkg/ops.py", "leaf"), ("pkg/ops.py", "middle")}


@pytest.mark.parametrize("old,new,caller", [("return x - 1", "return x - 2", "uses_module"),
                                            ("return x * 3", "return x * 4", "uses_alias")])
def test_calls_into_another_module_of_the_package(repo, old, new, caller):
    commit_edit(repo, "pkg/helpers.py", old, new)
    got = changed_functions(str(repo), changed_lines(str(repo), "HEAD~1"), FNS, "pkg")
    assert set(got) == {("pkg/ops.py", caller)}


def test_a_changed_decorator_and_a_deleted_line_change_their_function(repo):
    commit_edit(repo, "pkg/ops.py", "@functools.lru_cache\n", "@functools.lru_cache(maxsize=2)\n")
    assert set(changed_functions(str(repo), changed_lines(str(repo), "HEAD~1"), FNS, "pkg")) == {
        ("pkg/ops.py", "decorated")}
    commit_edit(repo, "pkg/ops.py", "    x = x + 1\n", "")
    assert set(changed_functions(str(repo), changed_lines(str(repo), "HEAD~1"), FNS, "pkg")) == {
        ("pkg/ops.py", "two_lines")}


def test_a_docstring_comment_or_line_break_edit_changes_no_function(repo):
    """An edit that leaves a function's syntax tree as it was (its docstring, a comment, a blank line, a line break)
    selects nothing; a code edit in the same function, or beside such an edit, still does."""
    commit_edit(repo, "pkg/ops.py", "def leaf(x):\n    return x + 1\n",
                'def leaf(x):\n    """One more."""\n    # the successor\n\n    return (x +\n            1)\n')
    assert changed_lines(str(repo), "HEAD~1") == {}
    assert changed_functions(str(repo), changed_lines(str(repo), "HEAD~1"), FNS, "pkg") == {}
    commit_edit(repo, "pkg/ops.py", '    """One more."""\n', '    """One more, reworded."""\n')
    assert changed_lines(str(repo), "HEAD~1") == {}
    commit_edit(repo, "pkg/ops.py", '    """One more, reworded."""\n    # the successor\n',
                '    """One more."""\n    # the successor, plus one\n    x = x + 0\n')
    assert set(changed_functions(str(repo), changed_lines(str(repo), "HEAD~1"), FNS, "pkg")) == {
        ("pkg/ops.py", "leaf"), ("pkg/ops.py", "middle"), ("pkg/ops.py", "top")}


def test_selection_rule_over_findings(repo):
    commit_edit(repo, "pkg/ops.py", "return x + 1", "return x + 2")
    site = lambda q: {"function": q, "module": "pkg.ops", "file": "pkg/ops.py", "line": 1, "top": "pkg"}  # noqa: E731
    meta = {"sites": {"a": {"": [site("top")]}, "b": {"": [site("untouched")]}, "c": {}}}
    findings = [("a", "p", "float32", "r"), ("b", "p", "float32", "r"), ("b", "q", "float32", "r"),
                ("c", "p", "float32", "r")]
    sel = select_changed(meta, str(repo), "HEAD~1", findings, ledger={"b.q.float32.r"})
    assert sel.ids == ["a.p.float32.r", "b.q.float32.r", "c.p.float32.r"]
    assert sel.why["a.p.float32.r"].startswith("calls pkg/ops.py:top -> pkg/ops.py:middle -> pkg/ops.py:leaf")
    assert sel.why["b.q.float32.r"] == "its ledger line changed"
    assert sel.paths["a.p.float32.r"][0] == "pkg/ops.py:top" and "c.p.float32.r" not in sel.paths
    assert "cannot be ruled out" in sel.why["c.p.float32.r"]


def test_bad_revision_and_not_a_repository_are_one_line_errors(repo, tmp_path_factory):
    with pytest.raises(ChangeError, match="no such commit"):
        changed_lines(str(repo), "no-such-rev")
    with pytest.raises(ChangeError, match="not in a git repository"):
        changed_lines(str(tmp_path_factory.mktemp("plain")), "HEAD")


def test_findings_file_refuses_what_is_not_a_finding_id(tmp_path):
    f = tmp_path / "sel.txt"
    f.write_text("# header\nentropy.matches_reference.float32.small  # why\n\nnot an id\n")
    with pytest.raises(ValueError, match=":4: not a finding id"):
        read_selection(str(f))


@pytest.mark.cli
@pytest.mark.engines
@pytest.mark.slow
def test_one_function_pr_of_a_verl_fork_selects_only_its_ops(tmp_path):
    """A git fork of the installed verl; one commit changes a line of code in ``kl_penalty_forward`` (a docstring edit would
    not count), which ``kl_penalty``
    (the kl_estimator binding's engine function) calls: only kl_estimator findings are selected."""
    verl = pytest.importorskip("verl")
    fork = tmp_path / "fork"
    shutil.copytree(os.path.dirname(verl.__file__), fork / "verl", ignore=shutil.ignore_patterns("__pycache__"))
    git(fork, "init", "-q", "-b", "main")
    git(fork, "add", "-A")
    git(fork, "commit", "-qm", "verl as installed")
    commit_edit(fork, "verl/trainer/ppo/core_algos.py", "kl = torch.clamp(kl, min=-20, max=20)",
                "kl = torch.clamp(kl, min=-30, max=30)")
    out = tmp_path / "out"
    proc = forked_cli.run(["check", "--engine", "verl",
                           "--engine-path", str(fork), "--changed-since", "HEAD~1", "--out", str(out), "-q",
                           "--property", "matches_reference", "--dtype", "float64", "--max-examples", "1"],
                          cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    ids = read_selection(str(out / "selection.txt"))
    assert ids and {i.split(".")[0] for i in ids} == {"kl_estimator"}, ids
    text = (out / "selection.txt").read_text()
    assert "core_algos.py:kl_penalty -> verl/trainer/ppo/core_algos.py:kl_penalty_forward (changed)" in text
    assert "Traceback" not in proc.stdout + proc.stderr
    # the report knows what changed: a defect row of kl_penalty prints it before the binding's cause
    import json

    changed = json.loads((out / "report.json").read_text())["engine"]["changed_since"]
    assert changed["rev"] == "HEAD~1" and changed["paths"]["verl/trainer/ppo/core_algos.py:kl_penalty"] == [
        "verl/trainer/ppo/core_algos.py:kl_penalty", "verl/trainer/ppo/core_algos.py:kl_penalty_forward"]


@pytest.mark.cli
@pytest.mark.slow
def test_a_ledger_never_widens_the_selection_but_a_line_the_change_edits_selects_its_scope(tmp_path):
    """A fork whose ledger lists a finding of an unchanged function: a change elsewhere selects nothing; a
    change that edits that ledger line selects the finding it lists, and only it."""
    import importlib.util

    from rlconform.harness.catalog.ops import OPS

    spec = importlib.util.spec_from_file_location("toyfork", pathlib.Path(__file__).with_name("toyfork.py"))
    T = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(T)
    fork = tmp_path / "fork"
    T.make_fork(fork, [("add masked_mean", T.RIGHT)])
    regime = next(r for r, dtypes in OPS["masked_mean"].regimes.items() if "float32" in dtypes)
    listed = f"masked_mean.matches_reference.float32.{regime}"
    ledger = fork / "rlconform-xfails.txt"
    ledger.write_text(f"{listed}  # accepted\n")
    T.commit(fork, "ledger")
    (fork / "NOTES.md").write_text("a change to no engine function\n")
    T.commit(fork, "notes")

    def check(out):
        return forked_cli.run(["check", "--engine", T.SPEC, "--engine-path", str(fork), "--changed-since", "HEAD~1",
                               "--xfails", str(ledger), "--out", str(out), "-q", "--max-examples", "2"], cwd=tmp_path)

    proc = check(tmp_path / "o1")
    assert proc.returncode == 0 and "nothing to check" in proc.stdout, proc.stdout + proc.stderr
    ledger.write_text(f"{listed}  # accepted, reason reworded\n")
    T.commit(fork, "reword the ledger line")
    proc = check(tmp_path / "o2")
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert read_selection(str(tmp_path / "o2" / "selection.txt")) == [listed]
    assert "its ledger line changed" in (tmp_path / "o2" / "selection.txt").read_text()


@pytest.mark.engines
def test_every_stage_of_verls_metric_pipeline_is_a_site_of_its_op_and_the_fold_stays_its_engine_function():
    """A fork's change to ``masked_mean`` (what the pipeline's emit stage calls) selects ``metric_pipeline``; the
    finding's engine function, where its report row points, is still the DP fold the binding names."""
    pytest.importorskip("verl")
    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.catalog.engine_site import finding_site, op_sites

    verl = load_engine("verl")
    sites = op_sites(verl)["metric_pipeline"]
    named = {f"{s['file']}:{s['function']}" for prefix in sites.values() for s in prefix}
    for expected in ("verl/utils/torch_functional.py:masked_mean", "verl/utils/py_functional.py:append_to_dict",
                     "verl/utils/metric/utils.py:reduce_metrics"):
        assert expected in named, sorted(named)
    assert len(named) == sum(len(prefix) for prefix in sites.values())  # each function once
    # the DP all-reduce runs the same pipeline's stages around verl's gather
    dp = {f"{s['file']}:{s['function']}" for prefix in op_sites(verl)["dp_metric_all_reduce"].values() for s in prefix}
    assert "verl/utils/torch_functional.py:masked_mean" in dp, sorted(dp)
    where, _ = finding_site(verl, "metric_pipeline", "partition_invariant", "moderate")
    assert where is not None and "masked_mean" not in where["function"], where

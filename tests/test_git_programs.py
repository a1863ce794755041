"""rlconform's git calls never run the programs a checkout's git config names: hooks, fsmonitor, clean /
smudge / process filters, textconv and external diff drivers (:mod:`rlconform.harness.core.safe_git`)."""

from __future__ import annotations

import os
import pathlib
import re
import stat
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _script(path: pathlib.Path, marker: pathlib.Path, tail: str = "") -> str:
    path.write_text(f"#!/bin/sh\ntouch '{marker}'\n{tail}")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture
def hostile_repo(tmp_path):
    """A repository of two commits whose config then names a program for every hook point, each touching
    its own marker file under ``tmp_path/markers``."""
    repo, markers, bin_ = tmp_path / "repo", tmp_path / "markers", tmp_path / "bin"
    for d in (repo, markers, bin_):
        d.mkdir()

    def g(*args):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)

    g("init", "-q")
    (repo / ".gitattributes").write_text("*.py filter=evil diff=evil\n")
    (repo / "mod.py").write_text("def f():\n    return 1\n")
    g("add", ".")
    g("commit", "-qm", "one")
    (repo / "mod.py").write_text("def f():\n    return 2\n")
    g("commit", "-qam", "two")
    hooks = repo / "my-hooks"
    hooks.mkdir()
    for hook in ("post-checkout", "reference-transaction", "post-index-change"):
        _script(hooks / hook, markers / f"hook-{hook}")
    config = {
        "core.hooksPath": str(hooks),
        "core.fsmonitor": _script(bin_ / "fsmonitor", markers / "fsmonitor"),
        "filter.evil.clean": _script(bin_ / "clean", markers / "filter-clean", "cat\n"),
        "filter.evil.smudge": _script(bin_ / "smudge", markers / "filter-smudge", "cat\n"),
        "diff.evil.textconv": _script(bin_ / "textconv", markers / "textconv", 'cat "$1"\n'),
        "diff.external": _script(bin_ / "extdiff", markers / "external-diff"),
    }
    for key, value in config.items():
        g("config", key, value)
    (repo / "mod.py").write_text("def f():\n    return 3\n")  # a dirty file: status / diff read it through filters
    return repo, markers


def _ran(markers: pathlib.Path) -> list[str]:
    return sorted(p.name for p in markers.iterdir())


def test_the_planted_programs_do_run_under_plain_git(hostile_repo, tmp_path):
    repo, markers = hostile_repo
    subprocess.run(["git", "-C", str(repo), "diff", "HEAD~1", "HEAD"], capture_output=True)
    subprocess.run(["git", "-C", str(repo), "diff", "--no-ext-diff", "HEAD~1", "HEAD"], capture_output=True)
    subprocess.run(["git", "-C", str(repo), "status"], capture_output=True)
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(tmp_path / "wt"), "HEAD~1"],
                   capture_output=True)
    ran = _ran(markers)
    assert {"textconv", "external-diff", "filter-clean", "filter-smudge", "fsmonitor", "hook-post-checkout"} <= set(ran), ran


def test_rlconforms_git_calls_run_none_of_them(hostile_repo, tmp_path):
    from rlconform.harness.bindings.load import _git_revision
    from rlconform.harness.core.code_changes import changed_lines
    from rlconform.harness.run import bisect, matrix

    repo, markers = hostile_repo
    assert "mod.py" in changed_lines(str(repo), "HEAD~1")  # --changed-since
    assert _git_revision(str(repo))
    two = bisect.git(str(repo), "rev-parse", "HEAD").stdout.strip()
    assert bisect.git(str(repo), "status", "--porcelain").returncode == 0
    bisect.git(str(repo), "stash", "-q")
    bisect.git(str(repo), "checkout", "-q", "--detach", "HEAD~1")  # bisect's checkouts
    wt = matrix.tag_worktree(str(repo), two, str(tmp_path / "cache"))  # matrix's worktrees
    assert (pathlib.Path(wt) / "mod.py").read_text() == "def f():\n    return 2\n"
    assert _ran(markers) == []


@pytest.mark.cli
def test_the_pr_scripts_git_calls_run_none_of_them(hostile_repo, tmp_path):
    repo, markers = hostile_repo
    script = (ROOT / "ci" / "rlconform-pr.sh").read_text()
    assert not re.search(r"(?<![\w_])git -C", script), "a bare git call in ci/rlconform-pr.sh"
    fn = re.search(r"^safe_git\(\) \{.*?^\}", script, re.S | re.M).group(0)
    proc = subprocess.run(["bash", "-c", f'{fn}\nsafe_git "$1" worktree add -q --detach "$2" HEAD~1 && '
                                         f'safe_git "$1" worktree remove --force "$2"', "x", str(repo),
                           str(tmp_path / "base")], capture_output=True, text=True, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert _ran(markers) == []

"""``rlconform init`` in a fresh git fork of the installed verl: the files it writes are a workflow that
validates against GitHub's workflow schema, a ledger rlconform reads, and a binding whose steps pass when
run locally (the pull-request check of an unchanged head, and ``coverage --strict``)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import engine_fork
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def _env(**extra) -> dict:
    env = dict(os.environ, **GIT_ENV, **extra)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def _rlconform(*args, cwd, timeout=900, **env):
    return subprocess.run([sys.executable, "-m", "rlconform.harness.cli", *args], cwd=cwd, env=_env(**env),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.cli
@pytest.mark.engines
@pytest.mark.slow
def test_init_in_a_verl_fork_writes_files_whose_steps_pass(tmp_path):
    jsonschema = pytest.importorskip("check_jsonschema")  # noqa: F841  (a test extra)
    fork = tmp_path / "fork"
    fork.mkdir()
    engine_fork.fork(fork, "verl", engine_fork.package_dir("verl", "make engines"), {})
    proc = _rlconform("init", "--engine", "verl", cwd=fork)
    assert proc.returncode == 0, proc.stderr
    for name in (".github/workflows/rlconform.yml", "rlconform-xfails.txt", "rlconform_binding.py"):
        assert (fork / name).is_file(), name
    again = _rlconform("init", cwd=fork)
    assert again.returncode == 2 and "nothing written" in again.stderr  # never overwrites

    lint = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                           str(fork / ".github/workflows/rlconform.yml")], capture_output=True, text=True, timeout=300)
    assert lint.returncode == 0, lint.stdout + lint.stderr

    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "fork with rlconform"]):
        subprocess.run(["git", *args], cwd=fork, env=_env(), check=True, capture_output=True, timeout=300)
    # the workflow's steps, locally: the pull-request check (head = base: nothing to check) ...
    pr = subprocess.run(["bash", str(ROOT / "ci" / "rlconform-pr.sh"), "--engine", "rlconform_binding.py",
                         "--base-ref", "HEAD", "--xfails", "rlconform-xfails.txt"], cwd=fork,
                        env=_env(RLCONFORM_SKIP_INSTALL="1"), capture_output=True, text=True, timeout=1800)
    assert pr.returncode == 0, pr.stdout[-3000:] + pr.stderr[-3000:]
    assert (fork / "rlconform-ci" / "comment.md").is_file()
    # ... and every numerics function of the fork bound or justified
    cov = _rlconform("coverage", "--engine", "rlconform_binding.py", "--engine-path", ".", "--strict", "--format", "md",
                     cwd=fork)
    assert cov.returncode == 0, cov.stdout[-3000:] + cov.stderr[-3000:]
    # the empty ledger is a ledger
    from rlconform.harness.report.xfails import parse_xfails

    parse_xfails(str(fork / "rlconform-xfails.txt"))


def test_the_action_validates_against_githubs_action_schema():
    pytest.importorskip("check_jsonschema")
    lint = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-actions",
                           str(ROOT / ".github" / "actions" / "rlconform" / "action.yml")],
                          capture_output=True, text=True, timeout=300)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.smoke
@pytest.mark.cli
def test_init_refuses_a_missing_folder(tmp_path):
    from rlconform.harness.cli import main

    assert main(["init", "--dir", str(tmp_path / "nope")]) == 2


def test_init_ignores_the_pr_checks_output_folder_once(tmp_path, capsys):
    """init adds rlconform-ci/ (where the pull-request recipe writes its reports) to the fork's .gitignore, keeping its lines, and a
    second init (--force) does not add it again."""
    import argparse

    from rlconform.harness.run.init_cmd import cmd_init

    def init(force: bool) -> int:
        return cmd_init(argparse.Namespace(dir=str(tmp_path), engine="verl", action="o/rlconform@main", force=force))

    (tmp_path / ".gitignore").write_text("*.pyc\nbuild")
    assert init(False) == 0
    assert (tmp_path / ".gitignore").read_text() == "*.pyc\nbuild\nrlconform-ci/\n"
    assert "added rlconform-ci/ to .gitignore" in capsys.readouterr().out
    assert init(True) == 0
    assert (tmp_path / ".gitignore").read_text().count("rlconform-ci") == 1


def _workflow_blocks() -> list[tuple[str, str]]:
    import re

    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [(p.name, block) for p in docs for block in re.findall(r"^```yaml\n(.*?)^```", p.read_text(), re.S | re.M)
            if re.search(r"^jobs:", block, re.M)]


def test_every_workflow_the_docs_show_validates_against_githubs_schema(tmp_path):
    """The README's and docs' workflows (the pull-request check, the sharded nightly check) are complete
    workflows that GitHub's schema accepts, not fragments."""
    pytest.importorskip("check_jsonschema")
    blocks = _workflow_blocks()
    assert len(blocks) >= 3, blocks  # README's, docs/pull-requests.md's two
    for n, (name, block) in enumerate(blocks):
        path = tmp_path / f"{n}.yml"
        path.write_text(block)
        lint = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                               str(path)], capture_output=True, text=True, timeout=300)
        assert lint.returncode == 0, (name, block, lint.stdout + lint.stderr)

"""The CI recipe's scripts, end to end on two checkouts of a small fork, without GitHub:
ci/rlconform-pr.sh checks base and head and writes the PR comment; ci/rlconform-comment.sh posts it with
`gh` (a stand-in here) or, locally, only says where it is. The action (.github/actions/rlconform) is
only the glue that calls them."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PR = ROOT / "ci" / "rlconform-pr.sh"
COMMENT = ROOT / "ci" / "rlconform-comment.sh"

_spec = importlib.util.spec_from_file_location("toyfork", pathlib.Path(__file__).with_name("toyfork.py"))
T = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(T)

#: one property, one dtype, few examples: enough to see the wrong count, a few seconds per check
CHECK_ARGS = ["--op", "masked_mean", "--property", "matches_reference", "--dtype", "float32", "--max-examples", "10"]
LEDGER = "rlconform-xfails.txt"


def env(**extra) -> dict:
    """This interpreter's rlconform on PATH, no install, no GitHub."""
    e = {k: v for k, v in os.environ.items() if k not in ("GH_TOKEN", "GITHUB_EVENT_PATH", "PR_NUMBER")}
    e.update(PATH=os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", ""), RLCONFORM_SKIP_INSTALL="1",
             **extra)
    return e


def run_pr(cwd, *args, ledger=LEDGER) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(PR), "--engine", T.SPEC, "--xfails", ledger, *args, "--", *CHECK_ARGS],
                          capture_output=True, text=True, cwd=cwd, env=env())


@pytest.fixture
def checkouts(tmp_path):
    """(base, head): the fork's main (right) cloned, and its PR branch (a new wrong count) checked out."""
    head = tmp_path / "fork"
    T.make_fork(head, [("add masked_mean", T.RIGHT)])
    (head / LEDGER).write_text("# the fork's known discrepancies\n")
    T.commit(head, "ledger")
    base = tmp_path / "base"
    T.git(tmp_path, "clone", "-q", str(head), str(base))
    T.git(head, "checkout", "-q", "-b", "pr")
    T.write_ops(head, T.WRONG_COUNT)
    T.commit(head, "speed up masked_mean")
    return base, head


@pytest.mark.slow
def test_new_bug_in_the_head_is_commented_and_fails(tmp_path, checkouts):
    base, head = checkouts
    proc = run_pr(head, "--base", str(base), "--out", str(tmp_path / "ci"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    comment = (tmp_path / "ci" / "comment.md").read_text()
    # the comment leads with the function the PR changed, its new defect and numbers
    assert "### Changed function `toypkg/ops.py:masked_mean`" in comment, comment
    lead = comment.split("### Changed function", 1)[1]
    assert "wrong value" in lead and "engine" in lead and "exact" in lead, comment
    assert len(comment.splitlines()) <= 70, comment
    assert "new **training** `masked_mean.matches_reference.float32." in comment, comment
    assert (tmp_path / "ci" / "head" / "report.html").is_file()
    import json

    sarif = json.loads((tmp_path / "ci" / "rlconform.sarif").read_text())  # annotations on the changed lines
    [result] = sarif["runs"][0]["results"]
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "toypkg/ops.py", result
    assert T.git(head, "status", "--porcelain") == "" and T.git(base, "status", "--porcelain") == ""
    # --changed-since by default: the head's selection is the changed function's, the base ran the same
    selected = (tmp_path / "ci" / "head" / "selection.txt").read_text()
    assert "changed: toypkg/ops.py:masked_mean" in selected, selected
    assert comment.startswith("<!-- rlconform -->")
    # a local run (no GitHub run to name): the footer points at the report beside the comment, not at an artifact
    assert f"The full report: `{tmp_path / 'ci'}/head/report.html`" in comment and "artifact" not in comment
    # every printed command works pasted in the fork's checkout
    commands = re.findall(r"`(rlconform replay [^`]+)`", comment)
    assert commands and all(str(head) not in c and str(base) not in c for c in commands), comment
    replay = subprocess.run(shlex.split(commands[0]), capture_output=True, text=True, cwd=head, env=env())
    assert replay.returncode == 1 and "DISCREPANCY" in replay.stdout, replay.stdout + replay.stderr


@pytest.mark.slow
def test_head_equal_to_base_passes(tmp_path, checkouts):
    """--base-ref: the base is a temporary worktree of the same commit, removed afterwards."""
    base, _ = checkouts
    proc = run_pr(base, "--base-ref", "HEAD", "--out", str(tmp_path / "ci"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    comment = (tmp_path / "ci" / "comment.md").read_text()
    assert "nothing to check" in comment
    assert comment.startswith("<!-- rlconform -->\n")  # the marker rlconform-comment.sh finds its own comment by
    full = run_pr(base, "--base-ref", "HEAD", "--out", str(tmp_path / "ci-all"), "--all",
                  ledger=str(base / LEDGER))  # an absolute ledger path
    assert full.returncode == 0, full.stdout + full.stderr
    assert "No change" in (tmp_path / "ci-all" / "comment.md").read_text()
    assert T.git(base, "worktree", "list").count("\n") == 0  # only the main worktree is left


def test_usage_errors_exit_2(tmp_path, checkouts):
    base, head = checkouts
    missing = subprocess.run(["bash", str(PR), "--engine", T.SPEC, "--xfails", "no-such-ledger.txt", "--base",
                              str(base)], capture_output=True, text=True, cwd=head, env=env())
    assert missing.returncode == 2 and "no-such-ledger.txt" in missing.stderr
    absolute = subprocess.run(["bash", str(PR), "--engine", T.SPEC, "--xfails", str(tmp_path / "nowhere.txt"),
                               "--base", str(base)], capture_output=True, text=True, cwd=head, env=env())
    assert absolute.returncode == 2 and f"{tmp_path / 'nowhere.txt'}: no such file\n" in absolute.stderr
    no_base = subprocess.run(["bash", str(PR), "--engine", T.SPEC], capture_output=True, text=True, cwd=head,
                             env=env())
    assert no_base.returncode == 2 and "--base" in no_base.stderr
    # a --base-ref that does not resolve: a one-line error, and no temporary folder left behind
    temp = tmp_path / "temp"
    temp.mkdir()
    bad_ref = subprocess.run(["bash", str(PR), "--engine", T.SPEC, "--base-ref", "origin/no-such-branch"],
                             capture_output=True, text=True, cwd=head, env=dict(env(), TMPDIR=str(temp)))
    assert bad_ref.returncode == 2 and "cannot check out --base-ref origin/no-such-branch" in bad_ref.stderr
    assert list(temp.iterdir()) == [], list(temp.iterdir())


@pytest.mark.slow
def test_binding_that_does_not_import_exits_2_with_a_comment(tmp_path, checkouts):
    base, head = checkouts
    T.write_ops(head, T.BROKEN_IMPORT)
    T.commit(head, "wip")
    proc = run_pr(head, "--base", str(base), "--out", str(tmp_path / "ci"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the head could not be checked" in (tmp_path / "ci" / "comment.md").read_text()


def _fake_gh(tmp_path, *, own: str = "", refuse: bool = False) -> dict:
    """A `gh` on PATH that logs its arguments; `gh api …/comments` lists ``own`` (a comment id holding the
    marker) and every posting call fails when ``refuse`` (a fork's read-only token)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "gh.log"
    (bin_dir / "gh").write_text(f"""#!/bin/sh
echo "$@" >> {log}
case "$*" in
  "api repos/o/r/issues/7/comments"*) [ -n "{own}" ] && echo "{own}"; exit 0 ;;
esac
[ "{int(refuse)}" = 1 ] && {{ echo "HTTP 403: Resource not accessible by integration" >&2; exit 1; }}
exit 0
""")
    (bin_dir / "gh").chmod(0o755)
    event = tmp_path / "event.json"
    event.write_text('{"pull_request": {"number": 7}}')
    e = env(GH_TOKEN="x", GITHUB_EVENT_PATH=str(event), GITHUB_REPOSITORY="o/r",
            GITHUB_STEP_SUMMARY=str(tmp_path / "summary.md"))
    e["PATH"] = f"{bin_dir}{os.pathsep}{e['PATH']}"
    return e


def test_comment_is_only_located_locally(tmp_path):
    comment = tmp_path / "comment.md"
    comment.write_text("## rlconform diff\n")
    local = subprocess.run(["bash", str(COMMENT), str(comment)], capture_output=True, text=True, env=env())
    assert local.returncode == 0 and "not posting" in local.stdout and str(comment) in local.stdout


@pytest.mark.parametrize("own", ["", "4242"])
def test_own_comment_is_found_by_its_marker(tmp_path, own):
    """Never `--edit-last` (the bot account's last comment may be another workflow's): the comment holding
    `<!-- rlconform -->` is edited, or a new one is added."""
    comment = tmp_path / "comment.md"
    comment.write_text("## rlconform diff\n")
    posted = subprocess.run(["bash", str(COMMENT), str(comment)], capture_output=True, text=True,
                            env=_fake_gh(tmp_path, own=own))
    assert posted.returncode == 0, posted.stderr
    calls = (tmp_path / "gh.log").read_text().splitlines()
    assert calls[0].startswith("api repos/o/r/issues/7/comments --paginate --jq")
    assert "<!-- rlconform -->" in calls[0]
    if own:
        assert calls[1] == f"api -X PATCH repos/o/r/issues/comments/{own} -F body=@{comment}"
    else:
        assert calls[1] == f"pr comment 7 --repo o/r --body-file {comment}"
    assert not any("--edit-last" in c for c in calls)
    assert comment.read_text().splitlines()[0] == "<!-- rlconform -->"
    assert not (tmp_path / "summary.md").exists()


def test_refused_comment_goes_to_the_job_summary_with_a_notice(tmp_path):
    comment = tmp_path / "comment.md"
    comment.write_text("## rlconform diff\n1 new defect\n")
    posted = subprocess.run(["bash", str(COMMENT), str(comment)], capture_output=True, text=True,
                            env=_fake_gh(tmp_path, refuse=True))
    assert posted.returncode == 0, posted.stderr  # the job's verdict is the diff's, not this step's
    assert "::notice title=rlconform::GitHub refused the pull-request comment" in posted.stdout
    assert "1 new defect" in (tmp_path / "summary.md").read_text()


@pytest.mark.cli
def test_action_calls_the_scripts():
    """The composite action's run steps are the tested scripts, and the fork's lines in its header are
    at most 10 and parse as a workflow that uses the action."""
    yaml = pytest.importorskip("yaml")  # PyYAML: not a dependency of rlconform
    text = (ROOT / ".github" / "actions" / "rlconform" / "action.yml").read_text()
    action = yaml.safe_load(text)
    runs = " ".join(s.get("run", "") for s in action["runs"]["steps"])
    assert "ci/rlconform-pr.sh" in runs and "ci/rlconform-comment.sh" in runs
    assert any(s.get("uses", "").startswith("actions/upload-artifact") for s in action["runs"]["steps"])
    header = text.split("A fork adds (needs the full history):\n#\n", 1)[1].split("\nname:", 1)[0]
    fork = "\n".join(line[4:] for line in header.splitlines())
    assert len(fork.strip().splitlines()) <= 10
    workflow = yaml.safe_load(fork)
    assert workflow["jobs"]["rlconform"]["steps"][1]["uses"].endswith("/.github/actions/rlconform@main")



INSTALL = ROOT / "ci" / "rlconform-install.sh"


@pytest.mark.engines
def test_install_script_installs_cpu_torch_rlconform_and_the_fork_without_its_dependencies(tmp_path):
    """The action's install step, dry-run here (the CPU-torch index is reachable only from GitHub's
    runners): CPU torch from its index when the pinned version is missing, rlconform under the
    constraints with the engine's CPU requirements, the fork editable with ``--no-deps``."""
    fork = tmp_path / "fork"
    fork.mkdir()
    (fork / "pyproject.toml").write_text("[project]\nname = 'fork'\nversion = '0'\n")
    no_torch = tmp_path / "bin" / "python3"  # an interpreter without torch: the torch step is printed
    no_torch.parent.mkdir()
    no_torch.write_text("#!/bin/sh\nexit 1\n")
    no_torch.chmod(0o755)
    proc = subprocess.run(["bash", str(INSTALL), "--engine", "verl", "--fork", str(fork), "--dry-run"],
                          env=dict(os.environ, PYTHON=str(no_torch)), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = [line[2:] for line in proc.stdout.splitlines() if line.startswith("+ ")]
    assert lines[0] == f"{no_torch} -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    assert lines[1] == (f"{no_torch} -m pip install -c {ROOT}/install/constraints.txt {ROOT} "
                        f"-r {ROOT}/install/verl.txt")
    assert lines[2] == f"{no_torch} -m pip install --no-deps -e {fork}"
    # with the pinned torch present (this interpreter) the torch step is skipped, and a spec that names no
    # stock engine installs no requirement file
    proc = subprocess.run(["bash", str(INSTALL), "--engine", "my_binding.py", "--fork", str(tmp_path), "--dry-run"],
                          env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "torch 2.13.0 already installed" in proc.stdout, proc.stdout + proc.stderr
    assert [line for line in proc.stdout.splitlines() if line.startswith("+ ")] == [
        f"+ {sys.executable} -m pip install -c {ROOT}/install/constraints.txt {ROOT}"]
    binding = subprocess.run(["bash", str(INSTALL), "--engine", "rlconform_binding.py", "--requirements", "verl",
                              "--fork", "none", "--dry-run"], env=dict(os.environ, PYTHON=sys.executable),
                             capture_output=True, text=True, timeout=120)
    assert binding.returncode == 0 and f"-r {ROOT}/install/verl.txt" in binding.stdout, binding.stdout  # a fork's file
    unknown = subprocess.run(["bash", str(INSTALL), "--requirements", "nope", "--dry-run"],
                             capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 2 and "no install/nope.txt" in unknown.stderr
    none = subprocess.run(["bash", str(INSTALL), "--fork", "none", "--dry-run"], env=dict(os.environ, PYTHON=sys.executable),
                          capture_output=True, text=True, timeout=120)
    assert none.returncode == 0 and "no fork installed" in none.stdout and "--no-deps" not in none.stdout
    bad = subprocess.run(["bash", str(INSTALL), "--bogus"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown argument" in bad.stderr


@pytest.mark.cli
def test_action_installs_with_the_script_and_checks_without_reinstalling():
    yaml = pytest.importorskip("yaml")
    action = yaml.safe_load((ROOT / ".github" / "actions" / "rlconform" / "action.yml").read_text())
    steps = action["runs"]["steps"]
    install = next(i for i, s in enumerate(steps) if "rlconform-install.sh" in s.get("run", ""))
    check = next(i for i, s in enumerate(steps) if "rlconform-pr.sh" in s.get("run", ""))
    assert install < check and steps[check]["env"]["RLCONFORM_SKIP_INSTALL"] == "1"
    assert action["inputs"]["torch-index"]["default"] == "https://download.pytorch.org/whl/cpu"

COVERED_BINDING = '''
from rlconform.harness.catalog.binding import Binding, Coverage

from toypkg.ops import masked_mean

binding = Binding(name="toypkg", ops={"masked_mean": masked_mean}, coverage=Coverage(modules=("toypkg.ops",)))
'''
NEW_UNBOUND = '''

def masked_token_sum(values, mask):
    """Σ values·mask: a new reduction no op checks."""
    return (values * mask).sum(dim=-1) / mask.sum(dim=-1)
'''


@pytest.mark.slow
def test_a_new_unbound_numerics_function_shows_in_the_comment(tmp_path):
    """A PR that adds a numerics function the binding neither binds nor justifies: nothing bound changed
    ("nothing to check"), and the comment still names the new function (coverage of what changed)."""
    head = tmp_path / "fork"
    T.make_fork(head, [("add masked_mean", T.RIGHT)])
    (head / "toypkg" / "rlconform_binding.py").write_text(COVERED_BINDING)
    T.commit(head, "declare coverage")
    base = tmp_path / "base"
    T.git(tmp_path, "clone", "-q", str(head), str(base))
    T.write_ops(head, T.RIGHT + NEW_UNBOUND)
    T.commit(head, "add masked_token_sum")
    proc = subprocess.run(["bash", str(PR), "--engine", T.SPEC, "--base", str(base), "--out", str(tmp_path / "ci"),
                           "--", *CHECK_ARGS], capture_output=True, text=True, cwd=head, env=env())
    comment = (tmp_path / "ci" / "comment.md").read_text()
    assert "Numerics this PR adds or edits that no op checks" in comment, proc.stdout + proc.stderr + comment
    note = comment.split("no op checks", 1)[1]
    assert "- `toypkg.ops.masked_token_sum` (function, " in note, comment
    assert "# Coverage of" not in note and "Transcribed" not in note  # its names, not the whole coverage page
    assert "toypkg.ops.masked_mean" not in note  # bound, and unchanged: not part of what the PR changed
    assert proc.returncode == 0, proc.stdout + proc.stderr  # shown, not failed on

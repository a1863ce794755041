"""``--engine-path`` checks a fork: a copy of the installed verl with a planted fault
(the forward writes into the caller's fp32 logits) is flagged, the installed verl is
not, and the report records the fork's path and git revision."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess

import forked_cli
import pytest

pytestmark = pytest.mark.engines

ORIGINAL = "    pd = torch.nn.functional.softmax(logits, dim=-1)\n"
PLANTED = ("    logits = logits.float()  # planted fault: aliases fp32 input\n"
           "    logits.sub_(logits.max(dim=-1, keepdim=True).values)\n" + ORIGINAL)


def _verl_dir() -> str:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (bash install/engines.sh .venv/bin/python verl)")
    return list(spec.submodule_search_locations)[0]


def _check(*extra, out):
    # one logits regime (with its chunked variant): the planted fault writes into the caller's fp32 logits
    # in any regime (the fork's run failed on the first example of each); no shrinking (it sizes the
    # reproducer, never a status)
    args = ["check", "--engine", "verl", "--op", "entropy",
            "--property", "non_destructive", "--dtype", "float32", "--regime", "moderate", "--max-examples", "5",
            "--max-shrinks", "0", "--out", str(out), *extra]
    return forked_cli.run(args, timeout=600)


@pytest.mark.cli
def test_planted_fault_in_a_fork_is_flagged(tmp_path):
    fork = tmp_path / "my-verl-fork"
    # with the installed byte code (untracked): the checks run with -B (nothing is written back), so
    # without it each process compiled verl from source; the edited file's is removed
    shutil.copytree(_verl_dir(), fork / "verl")
    (fork / ".gitignore").write_text("__pycache__/\n")
    tf = fork / "verl" / "utils" / "torch_functional.py"
    text = tf.read_text()
    assert text.count(ORIGINAL) == 1, "verl's entropy_from_logits changed; update the planted fault"
    tf.write_text(text.replace(ORIGINAL, PLANTED))
    for pyc in (tf.parent / "__pycache__").glob(tf.stem + ".*.pyc"):
        pyc.unlink()
    subprocess.run(["git", "init", "-q", str(fork)], check=True)
    subprocess.run(["git", "-C", str(fork), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(fork), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "fork"],
                   check=True)
    rev = subprocess.run(["git", "-C", str(fork), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()

    installed = _check(out=tmp_path / "installed")
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]

    forked = _check("--engine-path", str(fork), out=tmp_path / "fork")
    assert forked.returncode == 1, forked.stdout[-2000:] + forked.stderr[-2000:]
    doc = json.loads((tmp_path / "fork" / "report.json").read_text())
    assert doc["engine"]["path"] == os.path.abspath(fork)
    assert doc["engine"]["revision"] == rev
    bad = [f for f in doc["findings"] if f["status"] == "discrepancy"]
    assert bad and all(f["op"] == "entropy" and f["property"] == "non_destructive" for f in bad)
    assert "mutated during forward" in bad[0]["message"]

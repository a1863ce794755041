"""A tiny "fork" of an engine, built as a git repository in a test's tmp_path.

Not a test module: tests/test_bisect.py and tests/test_ci_recipe.py load it by path. The fork holds
a package ``toypkg`` whose ``toypkg.ops.masked_mean`` is one of the bodies below, and a binding
``toypkg.rlconform_binding:binding`` (run with ``--engine-path <the fork>``) that imports it eagerly,
so a commit whose ``toypkg.ops`` does not import is a binding error (replay exit code 2).
"""

from __future__ import annotations

import os
import pathlib
import subprocess

#: the engine spec of the fork's binding (with --engine-path <the fork>)
SPEC = "toypkg.rlconform_binding:binding"

#: Σ values·mask / nnz, the sum in float64: right
RIGHT = '''
def masked_mean(values, mask):
    """Σ values·mask / nnz."""
    m = mask.bool()
    kept = torch.where(m, values, torch.zeros((), dtype=values.dtype)).double()
    return (kept.sum() / m.sum()).to(values.dtype)
'''

#: divides by the number of all tokens, masked ones included (the "wrong count" defect): wrong on any mask
#: that is not all on
WRONG_COUNT = '''
def masked_mean(values, mask):
    """Σ values·mask / numel (wrong: counts the masked tokens)."""
    m = mask.bool()
    kept = torch.where(m, values, torch.zeros((), dtype=values.dtype)).double()
    return (kept.sum() / m.numel()).to(values.dtype)
'''

#: a commit in the middle of a refactoring: the module does not import
BROKEN_IMPORT = '''
from toypkg._not_yet_written import masked_mean  # noqa: F401
'''

BINDING = '''
from rlconform.harness.catalog.binding import Binding

from toypkg.ops import masked_mean

binding = Binding(name="toypkg", ops={"masked_mean": masked_mean})
'''

_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_AUTHOR_DATE": "2025-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2025-01-01T00:00:00Z", "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}


def git(repo, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                         env={**os.environ, **_ENV})
    assert out.returncode == 0, f"git {args}: {out.stderr}"
    return out.stdout.strip()


def write_ops(repo, body: str) -> None:
    (pathlib.Path(repo) / "toypkg" / "ops.py").write_text("import torch\n" + body)


def make_fork(repo, history: list[tuple[str, str]], branch: str = "main") -> list[str]:
    """Create the fork at ``repo`` with one commit per ``(subject, ops body)`` of ``history``; returns the
    commit hashes in order. The first commit also adds the package and the binding."""
    repo = pathlib.Path(repo)
    (repo / "toypkg").mkdir(parents=True)
    git(repo, "init", "-q", "-b", branch)
    (repo / "toypkg" / "__init__.py").write_text("")
    (repo / "toypkg" / "rlconform_binding.py").write_text(BINDING)
    (repo / ".gitignore").write_text("__pycache__/\n")
    hashes = []
    for subject, body in history:
        write_ops(repo, body)
        commit(repo, subject)
        hashes.append(git(repo, "rev-parse", "HEAD"))
    return hashes


def commit(repo, subject: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", subject)


def state(repo) -> tuple[str, str, str]:
    """(branch or 'DETACHED', HEAD hash, `git status --porcelain --ignored`): what bisect must leave as found."""
    branch = subprocess.run(["git", "-C", str(repo), "symbolic-ref", "-q", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "DETACHED"
    return branch, git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain", "--ignored")

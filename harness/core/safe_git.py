"""rlconform's git calls, with the checkout's own programs switched off.

A checkout's git config can name programs that git runs on its own: hooks (``post-checkout``,
``reference-transaction``, ...), ``core.fsmonitor``, clean / smudge / process filters of
``.gitattributes``, textconv and external diff drivers. A fork's checkout (or a pull request's) is not
rlconform's to trust: :func:`git` runs every call with hooks pointed at ``/dev/null``, fsmonitor off, every
filter driver the configuration defines emptied (an empty ``filter.<name>.*`` is no filter), and
``diff.external`` unset; callers that diff pass ``--no-textconv --no-ext-diff``. Reading the configuration
(``git config``) runs no program.
"""

from __future__ import annotations

import os
import subprocess

__all__ = ["SAFE_OPTIONS", "filter_overrides", "git", "git_argv"]

#: options that switch off what git would run from a checkout's configuration, whatever it holds
SAFE_OPTIONS = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "diff.external=",
                "-c", "core.pager=cat", "-c", "core.askPass=", "-c", "credential.helper=")
_ENV = {"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "GIT_PAGER": "cat", "GIT_EXTERNAL_DIFF": ""}


def filter_overrides(repo: str) -> list[str]:
    """``-c filter.<name>.<key>=`` for every filter driver ``repo``'s configuration defines (clean, smudge,
    process), and ``required=false`` so that an emptied driver is not an error."""
    proc = subprocess.run(["git", *SAFE_OPTIONS, "-C", repo, "config", "--name-only", "--get-regexp", r"^filter\."],
                          capture_output=True, text=True, env={**os.environ, **_ENV})
    drivers = set()
    for key in proc.stdout.splitlines():
        name, _, _ = key.strip()[len("filter."):].rpartition(".")
        if name:
            drivers.add(name)
    out: list[str] = []
    for name in sorted(drivers):
        for key in ("clean", "smudge", "process"):
            out += ["-c", f"filter.{name}.{key}="]
        out += ["-c", f"filter.{name}.required=false"]
    return out


def git_argv(repo: str, *args: str) -> list[str]:
    """The argv of ``git -C repo args`` with the checkout's programs switched off (module docstring)."""
    return ["git", *SAFE_OPTIONS, *filter_overrides(repo), "-C", repo, *args]


def git(repo: str, *args: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Run ``git -C repo args`` as :func:`git_argv` builds it; text output captured. ``env``: variables
    added to the process environment; other keyword arguments go to :func:`subprocess.run`."""
    return subprocess.run(git_argv(repo, *args), capture_output=True, text=True,
                          env={**os.environ, **_ENV, **(env or {})}, **kwargs)

"""Nothing an engine starts outlives the run.

An engine call may leave processes behind: a daemon, a double-forked child in a new session
(``os.setsid``) that is no longer anyone's child. The process that writes the report makes itself a
*child subreaper* (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): every orphan among its descendants is then
re-parented to it instead of to init, so it stays in the tree and can be found. :class:`Reaper` remembers
which processes existed when the run started, and :meth:`Reaper.end` SIGKILLs every descendant started
since (whatever its session or process group), repeating until none is left (a process may fork between
a scan and a kill), and waits for each one it killed. The report is written after that
(:func:`rlconform.harness.run.pytest_plugin.seal`).

Linux only (``/proc``, ``prctl``); elsewhere :meth:`Reaper.end` still kills the descendants it can see,
but a double-forked orphan escapes to init.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37

__all__ = ["Reaper", "descendants", "set_subreaper"]


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - not Linux
        return None


def set_subreaper(on: bool) -> bool | None:
    """Make this process a child subreaper (``on``) or not; return the previous setting (None when the
    platform has no subreapers)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "prctl"):
        return None
    prev = ctypes.c_int(0)
    if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(prev), 0, 0, 0) != 0:
        return None
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) != 0:
        return None
    return bool(prev.value)


def _table() -> dict[int, tuple[int, str]]:
    """``{pid: (ppid, state)}`` of every process in ``/proc``."""
    out = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        out[int(name)] = (int(fields[1]), fields[0])
    return out


def descendants(root: int | None = None, *, live_only: bool = True) -> set[int]:
    """The pids of every descendant of ``root`` (default: this process), zombies left out when ``live_only``."""
    root = os.getpid() if root is None else root
    table = _table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = set(), [root]
    while stack:
        for c in children.get(stack.pop(), ()):
            if c not in found:
                found.add(c)
                stack.append(c)
    if live_only:
        found = {p for p in found if table.get(p, (0, "X"))[1] not in ("Z", "X")}
    return found


class Reaper:
    """Track what this process starts from now on; :meth:`end` kills every descendant started since.

    ``Reaper()`` makes this process a child subreaper (the previous setting comes back with
    :meth:`close`), and remembers the descendants alive now (a test's own helpers, a pool started
    earlier): those are left alone."""

    def __init__(self):
        self.previous = set_subreaper(True)
        self.before = descendants()
        self.killed: list[int] = []

    def end(self, rounds: int = 50) -> list[int]:
        """SIGKILL every live descendant started since the reaper was made, until none is left (at most
        ``rounds`` scans); wait for each one that is our child. Returns every pid killed."""
        me = os.getpid()
        for _ in range(rounds):
            left = descendants() - self.before
            if not left:
                break
            for pid in sorted(left):
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.killed.append(pid)
                except OSError:
                    pass
            table = _table()
            for pid in sorted(left):
                if table.get(pid, (None,))[0] == me:
                    try:
                        os.waitpid(pid, 0)
                    except OSError:
                        pass
        return self.killed

    def alive(self) -> set[int]:
        """Descendants started since the reaper was made that are still running."""
        return descendants() - self.before

    def close(self) -> None:
        if self.previous is not None:
            set_subreaper(self.previous)
            self.previous = None

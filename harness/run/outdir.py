"""The report folder (``--out``) of one run: checked, locked, and cleared of another run's files.

Two runs writing one folder would report each other's findings (a clean reference run exited
1 showing another engine's summary). :func:`claim` therefore

1. refuses a path that is a file, or a folder that cannot be created or written (:class:`OutDirError`);
2. takes an exclusive ``fcntl`` lock on ``DIR/.rlconform.lock`` for as long as the returned
   :class:`OutDir` is open (held by the process that writes the report; the OS drops it when that
   process ends, however it ends); a second run gets :class:`OutDirError` naming the holder's pid;
   :meth:`OutDir.release` removes the file (a killed run leaves it, harmlessly);
3. removes what an earlier run left there and this run would not overwrite: ``report.json``,
   ``report.md``, ``report.html``, the reproducers ``cases/<finding id>.json`` and ``.tmp-*`` files of an
   interrupted atomic write. Nothing else in the folder is touched (``--out .`` is safe).
"""

from __future__ import annotations

import fcntl
import os
import re

from rlconform.harness.core.opinfo import FINDING_ID

__all__ = ["LOCK_NAME", "OutDir", "OutDirError", "claim"]

LOCK_NAME = ".rlconform.lock"
REPORT_FILES = ("report.json", "report.md", "report.html", "selection.txt", "selection.json")
_CASE_FILE = re.compile(rf"^{FINDING_ID}\.json$")
_TMP_FILE = re.compile(r"^\.tmp-.*(report\.(json|md|html)|\.json)$")


class OutDirError(Exception):
    """The report folder cannot be used; the message says why and what to do."""


class OutDir:
    """A claimed report folder; :meth:`release` (or the end of the process) drops the lock."""

    def __init__(self, path: str, fd: int):
        self.path = path
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            try:  # removed while still held: a run that opened it before sees another inode
                lock = os.path.join(self.path, LOCK_NAME)
                if os.stat(lock).st_ino == os.fstat(self._fd).st_ino:
                    os.unlink(lock)
            except OSError:
                pass
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> "OutDir":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def claim(path: str, *, clear: bool = True) -> OutDir:
    """Check, lock and (``clear``) empty the report folder ``path`` of a previous run's report."""
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutDirError(f"--out {path} is a file, not a folder; give a folder for the report")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise OutDirError(f"cannot create the report folder --out {path}: {exc.strerror or exc}") from None
    lock_path = os.path.join(path, LOCK_NAME)
    for _ in range(20):  # the lock file is removed at release: hold the file that is there now
        fd = _lock(path, lock_path)
        try:
            if os.stat(lock_path).st_ino == os.fstat(fd).st_ino:
                break
        except OSError:
            pass
        os.close(fd)
    else:
        raise OutDirError(f"cannot lock the report folder --out {path}: its lock file keeps being replaced")
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        if not os.access(path, os.W_OK | os.X_OK):
            raise OSError(13, "Permission denied")
        if clear:
            _clear(path)
    except OSError as exc:
        os.close(fd)
        raise OutDirError(f"cannot write in the report folder --out {path}: {exc.strerror or exc}") from None
    return OutDir(path, fd)


def _lock(path: str, lock_path: str) -> int:
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OutDirError(f"cannot write in the report folder --out {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _read_pid(fd)
        os.close(fd)
        raise OutDirError(f"another rlconform run{f' (pid {holder})' if holder else ''} is writing the report "
                          f"folder {path}; wait for it or give this run another --out") from None
    return fd


def _read_pid(fd: int) -> str | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return text if text.isdigit() else None


def _clear(path: str) -> None:
    for name in os.listdir(path):
        if name in REPORT_FILES or _TMP_FILE.match(name):
            _unlink(os.path.join(path, name))
    cases = os.path.join(path, "cases")
    if os.path.isdir(cases) and not os.path.islink(cases):
        for name in os.listdir(cases):
            if _CASE_FILE.match(name) or _TMP_FILE.match(name):
                _unlink(os.path.join(cases, name))
        try:
            os.rmdir(cases)  # only if now empty
        except OSError:
            pass


def _unlink(p: str) -> None:
    try:
        if os.path.isfile(p) or os.path.islink(p):
            os.unlink(p)
    except FileNotFoundError:
        pass

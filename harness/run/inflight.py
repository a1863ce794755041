"""What a process running engines is doing, readable by its supervisor after that process died.

A pytest-xdist worker runs one finding after another. Before every example it overwrites one small file
with the finding id, the example count and the case (:func:`rlconform.properties.case.encode_record`:
a JSON header and the raw array bytes, about 1 ms for the largest cases); between findings the file
says nothing is in flight. When the engine kills the worker (``os._exit``, a segfault, the OOM killer,
the per-finding deadline), the controller reads the file and names the finding, the example and the
case that killed it — the reproducer of the ``crash`` finding.

Layout of the run folder (a temporary folder of the controller, one pair of files per worker id)::

    <run dir>/<worker id>.case    the in-flight record (this module)
    <run dir>/<worker id>.fault   faulthandler's output: fatal-signal and deadline stacks
"""

from __future__ import annotations

import json
import os

from rlconform.properties.case import Case, CaseError, decode_record, encode_record

__all__ = ["InflightWriter", "Inflight", "read_inflight"]

_META_ONLY = b"RLCF0"


class InflightWriter:
    """Worker side: one file, rewritten in place (``pwrite`` + ``ftruncate``)."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)

    def _write(self, data: bytes) -> None:
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))

    def begin(self, finding_id: str) -> None:
        """A finding starts (no example yet)."""
        self._write(_META_ONLY + json.dumps({"id": finding_id}).encode())

    def example(self, case: Case, meta: dict) -> None:
        """An example starts: ``meta`` holds the finding id and counters."""
        self._write(encode_record(case, meta))

    def end(self) -> None:
        """The finding ended; nothing is in flight."""
        self._write(b"")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Inflight:
    """What :func:`read_inflight` found: ``finding_id`` (None: nothing in flight), ``case`` (None: no
    example had started, or the record was torn), ``meta`` and ``problem`` (why there is no case)."""

    def __init__(self, finding_id=None, case=None, meta=None, problem=None):
        self.finding_id = finding_id
        self.case = case
        self.meta = meta or {}
        self.problem = problem


def read_inflight(path: str) -> Inflight:
    """Controller side: read a dead worker's in-flight file."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return Inflight(problem=f"no in-flight record ({exc.strerror or exc})")
    if not data:
        return Inflight()
    if data.startswith(_META_ONLY):
        try:
            meta = json.loads(data[len(_META_ONLY):])
            return Inflight(meta.get("id"), None, meta, "no example had started")
        except (ValueError, AttributeError):
            return Inflight(problem="in-flight record torn")
    try:
        case, meta = decode_record(data)
    except CaseError as exc:
        return Inflight(problem=str(exc))
    return Inflight(meta.get("id") or case.finding_id, case, meta)

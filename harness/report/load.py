"""Reading a ``report.json`` that a user hands a report command (``diff``, ``ledger``, ``report``).

:func:`load_report` reads through :func:`rlconform.harness.core.safe_json.load_object` (no traceback on bytes
that are not UTF-8, text that is not JSON, or 200 000 nested ``[``) and checks the shape the commands rely on
before any of them walks it: one JSON object with ``findings``, a list of objects each with a string ``id``,
a ``status`` among :data:`rlconform.harness.report.writer.STATUSES`, string ``op`` and ``property``, string
(or absent) ``dtype`` / ``regime`` / ``message`` / ``worst_input``, numbers (or absent) for the errors and ``max_ratio``, an object
(or null) ``reproducer``; ``engine`` and ``run`` objects when
present. Anything else is a :class:`ReportError` (a ``ValueError``) whose message is one line naming the file
and the first bad finding, so that the command exits 2.

A report is data: nothing in it (``engine.spec``, ``engine.path``, a reproducer command) is ever imported or
run by a report command.
"""

from __future__ import annotations

import os

from rlconform.harness.core.safe_json import JsonFileError, load_object

_TEXT_FIELDS = ("dtype", "regime", "message", "worst_input", "severity", "traceback")
_NUMBER_FIELDS = ("max_abs_err", "max_rel_err", "tolerance", "max_ratio", "examples")


class ReportError(ValueError):
    """A report cannot be read or is not an rlconform report; the message is one line naming the file."""


def report_path(path: str) -> str:
    """``path`` itself, or ``path/report.json`` when ``path`` is a folder."""
    return os.path.join(path, "report.json") if os.path.isdir(path) else path


def validate(doc: dict, where: str) -> dict:
    """Check the shape of a report document (see the module docstring); returns it, raises :class:`ReportError`."""
    from rlconform.harness.report.writer import STATUSES

    if "findings" not in doc:
        raise ReportError(f"{where} is not an rlconform report (no findings)")
    findings = doc["findings"]
    if not isinstance(findings, list):
        raise ReportError(f"{where}: findings is a {type(findings).__name__}, not a list")
    for key in ("engine", "run"):
        if key in doc and not isinstance(doc[key], dict):
            raise ReportError(f"{where}: {key} is a {type(doc[key]).__name__}, not an object")
    seen = set()
    for n, f in enumerate(findings):
        if not isinstance(f, dict):
            raise ReportError(f"{where}: finding {n} is a {type(f).__name__}, not an object")
        fid = f.get("id")
        if not isinstance(fid, str) or not fid:
            raise ReportError(f"{where}: finding {n} has no id")
        if fid in seen:
            raise ReportError(f"{where}: finding {fid} is listed twice")
        seen.add(fid)
        status = f.get("status")
        if status is None:
            raise ReportError(f"{where}: finding {fid} has no status")
        if status not in STATUSES:
            raise ReportError(f"{where}: finding {fid} has status {status!r}, not one of {', '.join(STATUSES)}")
        for key in ("op", "property"):
            if not isinstance(f.get(key), str):
                raise ReportError(f"{where}: finding {fid} has no {key}")
        for key in _TEXT_FIELDS:
            if f.get(key) is not None and not isinstance(f[key], str):
                raise ReportError(f"{where}: finding {fid}: {key} is a {type(f[key]).__name__}, not a string")
        for key in _NUMBER_FIELDS:
            v = f.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ReportError(f"{where}: finding {fid}: {key} is a {type(v).__name__}, not a number")
        if f.get("reproducer") is not None and not isinstance(f["reproducer"], dict):
            raise ReportError(f"{where}: finding {fid}: reproducer is a {type(f['reproducer']).__name__}, "
                              f"not an object")
    return doc


def load_report(path: str) -> dict:
    """The report document at ``path`` (a report.json, or a folder holding one), validated, not triaged.
    Raises :class:`ReportError` (one line) when it cannot be read or is malformed."""
    p = report_path(path)
    try:
        doc = load_object(p)
    except JsonFileError as exc:
        raise ReportError(str(exc)) from None
    return validate(doc, p)

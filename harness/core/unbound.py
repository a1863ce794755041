"""What an op that did not bind lacks, as a field of its finding: ``unbound`` ``{"op", "status", "missing"}``.

An op of a binding that cannot be resolved in the installed release (its import or lookup fails, or the
binding's call does not fit it) is recorded where it is resolved (:mod:`rlconform.properties.runner`), with the
name the release lacks read from Python's own error text (:func:`missing_name`); the version matrix
(:mod:`rlconform.harness.report.matrix_md`) groups the releases by these fields.
"""

from __future__ import annotations

import re

#: Python's (and a binding's) error texts -> the name the release lacks (first match wins)
_MISSING = (
    (re.compile(r"cannot import name '([^']+)' from '([^']+)'"), lambda m: f"{m.group(2)}.{m.group(1)}"),
    (re.compile(r"No module named '([^']+)'"), lambda m: m.group(1)),
    (re.compile(r"module '([^']+)' has no attribute '([^']+)'"), lambda m: f"{m.group(1)}.{m.group(2)}"),
    (re.compile(r"'?([A-Za-z_][\w.]*)'? (?:object )?has no attribute '([^']+)'"), lambda m: f"{m.group(1)}.{m.group(2)}"),
    (re.compile(r"(\w[\w.]*)\(\) got an unexpected keyword argument '([^']+)'"),
     lambda m: f"keyword {m.group(2)} of {m.group(1)}"),
    (re.compile(r"(\w[\w.]*)\(\) missing \d+ required (?:positional |keyword-only )?arguments?: '([^']+)'"),
     lambda m: f"required argument {m.group(2)} of {m.group(1)}"),
    (re.compile(r"missing name: ([^;)\s]+)"), lambda m: m.group(1)),
    (re.compile(r"\(missing: ([^)]+)\)"), lambda m: m.group(1)),
    (re.compile(r"needs (CUDA)"), lambda m: "a CUDA device"),
)


def missing_name(message: str | None) -> str | None:
    """The module / function / keyword a release lacks, read from the error text of an op that did not bind
    (``cannot import name 'Metric' from 'verl.utils.metric'`` -> ``verl.utils.metric.Metric``; ``f() got an unexpected keyword argument 'dp_size'`` -> ``keyword dp_size of f``); None when no pattern
    matches."""
    for pattern, name in _MISSING:
        m = pattern.search(message or "")
        if m:
            return name(m)
    return None


def unbound(op: str, status: str, text: str) -> dict:
    """The ``unbound`` field of a finding whose ``op`` (``op`` or ``op@impl``) did not bind: ``status``
    (``unavailable`` / ``binding_error``) and the name the release lacks (None: none recognised)."""
    return {"op": op, "status": status, "missing": missing_name(text)}

"""The version matrix's document and page (issue 23 §3): which defect each release has, and what it cannot bind.

:func:`matrix_doc` folds one ``report.json`` document per release (oldest first) into a small document:

* ``defects``: one entry per root-cause key of the defect ledger (``<engine function> | <failure kind>``,
  :func:`rlconform.harness.report.triage.folded_keys`, the key an ``--xfails`` line matches), with, per
  version, ``present`` (a failing finding of that key), ``absent`` (the key's ops ran and none failed so) or
  ``not checked`` (none of its ops ran: not bound there); then ``first_seen`` (the oldest version it is
  present in) and ``fixed_in`` (the first version after its last presence in which its ops ran and it is
  absent; None when the newest release still has it).
* ``versions``: per version the engine version the report names, the status counts, and ``unbound``: every op
  that did not bind, with its status (``unavailable``: a missing module / function / name, ``binding_error``:
  the binding's own call does not fit the release, e.g. a keyword it lacks; ``error`` with an
  ``OpUnavailable`` cause: an alternative implementation the release lacks), the missing name read from the
  message (:func:`missing_name`) and the message's first line.

:func:`matrix_markdown` renders it as ``reports/matrix/<engine>.md``. Failing statuses are
:data:`rlconform.harness.report.xfails.FAILING`; the check runs without a ledger, so a defect fails.
"""

from __future__ import annotations

import re

#: statuses of a finding whose op ran (it bound and was called)
RAN = ("pass", "discrepancy", "crash", "xfail", "xpass", "marginal")
#: messages -> the name the release lacks (first match wins)
_MISSING = (
    (re.compile(r"cannot import name '([^']+)' from '([^']+)'"), lambda m: f"{m.group(2)}.{m.group(1)}"),
    (re.compile(r"No module named '([^']+)'"), lambda m: m.group(1)),
    (re.compile(r"module '([^']+)' has no attribute '([^']+)'"), lambda m: f"{m.group(1)}.{m.group(2)}"),
    (re.compile(r"'?([A-Za-z_][\w.]*)'? (?:object )?has no attribute '([^']+)'"), lambda m: f"{m.group(1)}.{m.group(2)}"),
    (re.compile(r"(\w[\w.]*)\(\) got an unexpected keyword argument '([^']+)'"),
     lambda m: f"keyword {m.group(2)} of {m.group(1)}"),
    (re.compile(r"missing name: ([^;)\s]+)"), lambda m: m.group(1)),
    (re.compile(r"needs (CUDA)"), lambda m: "a CUDA device"),
)


def missing_name(message: str | None) -> str | None:
    """The module / function / keyword a release lacks, read from an ``unavailable`` / ``binding_error``
    message (``cannot import name 'Metric' from 'verl.utils.metric'`` -> ``verl.utils.metric.Metric``;
    ``f() got an unexpected keyword argument 'dp_size'`` -> ``keyword dp_size of f``); None when no pattern
    matches."""
    for pattern, name in _MISSING:
        m = pattern.search(message or "")
        if m:
            return name(m)
    return None


def _first_line(text: str | None, limit: int = 160) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def unbound_ops(doc: dict) -> dict[str, dict]:
    """``{op: {"status", "missing", "message", "findings"}}`` for every op of report ``doc`` with a finding that
    did not bind (status ``unavailable`` / ``binding_error``, or ``error`` caused by ``OpUnavailable``); an op
    that bound for some findings and not for others (a variant or implementation the release lacks) is listed
    with the first cause."""
    out: dict[str, dict] = {}
    for f in doc.get("findings") or ():
        status, message = f.get("status"), f.get("message") or ""
        if status == "error" and "OpUnavailable" in message:
            status = "unavailable"
        elif status not in ("unavailable", "binding_error"):
            continue
        if f.get("needs") == "cuda":
            continue  # a CUDA-only kernel on a CPU run: a device gap, not a release gap
        entry = out.setdefault(f["op"], {"status": status, "missing": missing_name(message),
                                         "message": _first_line(message), "findings": 0, "causes": []})
        entry["findings"] += 1
        cause = missing_name(message) or _first_line(message, 80)
        if cause not in entry["causes"]:
            entry["causes"].append(cause)
        if status == "binding_error":
            entry["status"] = "binding_error"
    return out


def matrix_doc(engine: str, reports: dict[str, dict], *, source: str, options: dict) -> dict:
    """The matrix document of ``engine`` from ``{version: report.json document}`` (oldest first); see the
    module docstring. ``source`` and ``options`` (profile, ops, examples) are recorded in its header."""
    from rlconform.harness.report.triage import folded_keys
    from rlconform.harness.report.xfails import FAILING

    versions = list(reports)
    present: dict[str, dict[str, list[str]]] = {}  # key -> version -> finding ids
    key_ops: dict[str, set[str]] = {}
    ran: dict[str, set[str]] = {}
    per_version = {}
    for v, doc in reports.items():
        findings = doc.get("findings") or []
        ran[v] = {f["op"] for f in findings if f.get("status") in RAN}
        failing = {f["id"]: f for f in findings if f.get("status") in FAILING}
        for fid, (place, cls) in folded_keys(failing, findings).items():
            key = f"{place} | {cls}"
            present.setdefault(key, {}).setdefault(v, []).append(fid)
            key_ops.setdefault(key, set()).add(failing[fid]["op"])
        counts: dict[str, int] = {}
        for f in findings:
            counts[f["status"]] = counts.get(f["status"], 0) + 1
        eng = doc.get("engine") or {}
        per_version[v] = {"engine_version": eng.get("version"), "counts": counts, "unbound": unbound_ops(doc),
                          "ops_ran": sorted(ran[v]), "complete": (doc.get("run") or {}).get("complete")}
    defects = []
    for key in sorted(present, key=lambda k: (min(versions.index(v) for v in present[k]), k)):
        cells = {}
        for v in versions:
            if v in present[key]:
                cells[v] = "present"
            elif key_ops[key] & ran[v]:
                cells[v] = "absent"
            else:
                cells[v] = "not checked"
        seen = [v for v in versions if cells[v] == "present"]
        last = versions.index(seen[-1])
        fixed = next((v for v in versions[last + 1:] if cells[v] == "absent"), None)
        defects.append({"key": key, "ops": sorted(key_ops[key]), "versions": cells, "first_seen": seen[0],
                        "fixed_in": fixed, "findings": {v: len(ids) for v, ids in present[key].items()}})
    return {"schema": "rlconform-matrix/1", "engine": engine, "source": source, "versions": versions,
            "options": dict(options), "defects": defects, "releases": per_version}


_CELL = {"present": "✗", "absent": "·", "not checked": "n/b"}


def _esc(text: str) -> str:
    return str(text).replace("|", "\\|")


def matrix_markdown(doc: dict) -> str:
    """``reports/matrix/<engine>.md`` for matrix document ``doc``."""
    versions, opts = doc["versions"], doc.get("options") or {}
    ops = ", ".join(opts.get("ops") or ()) or "all"
    lines = [f"# Version matrix: {doc['engine']}", "",
             f"Releases from {doc['source']}: {', '.join(versions)}. Each is checked by `rlconform check` (no ledger) "
             f"at profile `{opts.get('profile')}`, ops: {ops}"
             + (f", max examples {opts['max_examples']}" if opts.get("max_examples") else "")
             + (f", shrinking steps {opts['max_shrinks']}" if opts.get("max_shrinks") is not None else "")
             + f", {opts.get('numprocesses', 1)} worker(s). Regenerate: `rlconform matrix --engine {doc['engine']} "
             f"--versions {','.join(versions)}" + "".join(f" --op {o}" for o in opts.get("ops") or ())
             + (f" --max-examples {opts['max_examples']}" if opts.get("max_examples") else "") + "`.", "",
             "A defect is a root-cause key of the defect ledger (`<engine function> | <failure kind>`, what an "
             "`--xfails` line matches). Cells: ✗ present (findings), · absent (its ops ran, none failed so), "
             "n/b not checked (none of its ops bound in that release).", ""]
    lines += ["## Releases", "", "| version | findings | pass | failing | unavailable | binding error | ops that "
              "cannot bind |", "|---|---|---|---|---|---|---|"]
    from rlconform.harness.report.xfails import FAILING

    for v in versions:
        r = doc["releases"][v]
        c = r["counts"]
        failing = sum(n for s, n in c.items() if s in FAILING)
        lines.append(f"| {v} | {sum(c.values())} | {c.get('pass', 0)} | {failing} | {c.get('unavailable', 0)} | "
                     f"{c.get('binding_error', 0)} | {len(r['unbound'])} |"
                     + ("" if r.get("complete", True) else " (run incomplete)"))
    lines += ["", "## Defects by release", "",
              "| defect | ops | " + " | ".join(versions) + " | first seen | fixed in |",
              "|---|---|" + "---|" * len(versions) + "---|---|"]
    for d in doc["defects"]:
        cells = [_CELL[d["versions"][v]] + (f" {d['findings'][v]}" if v in d["findings"] else "") for v in versions]
        lines.append(f"| `{_esc(d['key'])}` | {', '.join(d['ops'])} | " + " | ".join(cells)
                     + f" | {d['first_seen']} | {d['fixed_in'] or '—'} |")
    if not doc["defects"]:
        lines.append("| (none) | | " + " | ".join("" for _ in versions) + " | | |")
    lines += ["", "## Ops that cannot bind, by release", "",
              "unavailable: the release lacks a module / function / name the op needs (the family is not in that "
              "release, or not in that form); binding error: the binding's own call does not fit the release "
              "(a keyword or attribute it lacks) — a binding gap, never an engine defect.", ""]
    for v in versions:
        unbound = doc["releases"][v]["unbound"]
        lines.append(f"### {v}" + (f" ({doc['releases'][v]['engine_version']})"
                                   if doc["releases"][v].get("engine_version") not in (None, v) else ""))
        lines.append("")
        if not unbound:
            lines += ["Every op bound.", ""]
            continue
        lines += ["| op | status | findings | missing (why) |", "|---|---|---|---|"]
        for op in sorted(unbound):
            u = unbound[op]
            lines.append(f"| {op} | {u['status']} | {u['findings']} | {_esc('; '.join(u['causes']))} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"

"""The version matrix's document and page: which defect each release has, and what it cannot bind.

:func:`matrix_doc` folds one ``report.json`` document per release (oldest first) into a small document:

* ``defects``: one entry per root-cause key of the defect ledger (``<engine function> | <failure kind>``,
  :func:`rlconform.harness.report.triage.folded_keys`, the key an ``--xfails`` line matches), with, per
  version, ``present`` (a failing finding of that key), ``absent`` (one of the findings that have the key in
  some release ran there and none failed so) or ``not checked`` (none of those findings ran: the op, or the
  variant / implementation the findings are of, is not bound there); then ``first_seen`` (the oldest version
  it is present in), ``not_checked_before`` (the versions before it that could not check it: it may be older),
  ``fixed_in`` (the first version after its last presence in which it is absent; None when it is not absent
  after its last presence), ``not_checked_between`` (versions between its last presence and ``fixed_in`` that
  could not check it: it may have been fixed there already), ``moved_to`` (the keys its findings fail with in
  ``fixed_in``: the same findings still fail there, the failure now located in another engine function, e.g.
  after a refactor: not a fix) and ``state`` (``fixed``, ``present in the newest`` or ``not checked after
  <version>``).
* ``versions``: per version the engine version the report names, the status counts, and ``unbound``: every op
  that did not bind, with its status (``unavailable``: a missing module / function / name, ``binding_error``:
  the binding's own call does not fit the release, e.g. a keyword it lacks; ``error`` with an
  ``OpUnavailable`` cause: an alternative implementation the release lacks), the missing name read from the
  message (:func:`missing_name`) and the message's first line; ``variants_missing``: per op that ran, the
  variants / implementations another release of the matrix checks and this one does not provide.

:func:`matrix_markdown` renders it as ``reports/matrix/<engine>.md``. Failing statuses are
:data:`rlconform.harness.report.xfails.FAILING`; the check runs without a ledger, so a defect fails.
"""

from __future__ import annotations

import re

from rlconform.harness.core.unbound import missing_name

#: statuses of a finding whose op ran (it bound and was called)
RAN = ("pass", "discrepancy", "crash", "xfail", "xpass", "marginal")
_UNAVAILABLE_OP = re.compile(r"op '([^']+)' unavailable")


def _first_line(text: str | None, limit: int = 160) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def unbound_ops(doc: dict) -> dict[str, dict]:
    """``{op: {"status", "missing", "message", "findings"}}`` for every op of report ``doc`` with a finding that
    did not bind (status ``unavailable`` / ``binding_error``, or ``error`` caused by ``OpUnavailable``); an op
    that bound for some findings and not for others (a variant or implementation the release lacks) is listed
    with the first cause; an implementation the release lacks (``op 'X@impl' unavailable``) is listed as
    ``X@impl``, not as its op, which bound."""
    out: dict[str, dict] = {}
    for f in doc.get("findings") or ():
        status, message = f.get("status"), f.get("message") or ""
        if f.get("needs") == "cuda":
            continue  # a CUDA-only kernel on a CPU run: a device gap, not a release gap
        field = f.get("unbound")
        if isinstance(field, dict) and status in ("unavailable", "binding_error", "error"):
            op, status, missing = str(field.get("op") or f["op"]), str(field.get("status") or status), field.get("missing")
        else:  # a report written before findings recorded what did not bind: its message says
            if status == "error" and "OpUnavailable" in message:
                status = "unavailable"
            elif status not in ("unavailable", "binding_error"):
                continue
            named = _UNAVAILABLE_OP.match(message)
            op, missing = (named.group(1) if named else f["op"]), missing_name(message)
        entry = out.setdefault(op, {"status": status, "missing": missing, "message": _first_line(message),
                                    "findings": 0, "causes": []})
        entry["findings"] += 1
        cause = missing or _first_line(message, 80)
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
    key_ids: dict[str, set[str]] = {}  # key -> every finding id that has it in some release
    ran: dict[str, set[str]] = {}
    ran_ids: dict[str, set[str]] = {}
    fid_key: dict[str, dict[str, str]] = {}  # version -> failing finding id -> its key
    per_version = {}
    for v, doc in reports.items():
        findings = doc.get("findings") or []
        ran[v] = {f["op"] for f in findings if f.get("status") in RAN}
        ran_ids[v] = {f["id"] for f in findings if f.get("status") in RAN}
        failing = {f["id"]: f for f in findings if f.get("status") in FAILING}
        for fid, (place, cls) in folded_keys(failing, findings).items():
            key = f"{place} | {cls}"
            present.setdefault(key, {}).setdefault(v, []).append(fid)
            key_ops.setdefault(key, set()).add(failing[fid]["op"])
            key_ids.setdefault(key, set()).add(fid)
            fid_key.setdefault(v, {})[fid] = key
        counts: dict[str, int] = {}
        for f in findings:
            counts[f["status"]] = counts.get(f["status"], 0) + 1
        eng = doc.get("engine") or {}
        per_version[v] = {"engine_version": eng.get("version"), "counts": counts, "unbound": unbound_ops(doc),
                          "ops_ran": sorted(ran[v]), "complete": (doc.get("run") or {}).get("complete"),
                          "variants_missing": {}}
    _variants_missing(reports, per_version, ran)
    defects = []
    for key in sorted(present, key=lambda k: (min(versions.index(v) for v in present[k]), k)):
        cells = {}
        for v in versions:
            if v in present[key]:
                cells[v] = "present"
            elif key_ids[key] & ran_ids[v]:
                cells[v] = "absent"
            else:
                cells[v] = "not checked"
        seen = [v for v in versions if cells[v] == "present"]
        first, last = versions.index(seen[0]), versions.index(seen[-1])
        fixed = next((v for v in versions[last + 1:] if cells[v] == "absent"), None)
        after = versions[last + 1:versions.index(fixed)] if fixed else versions[last + 1:]
        state = ("fixed" if fixed else "present in the newest" if last == len(versions) - 1
                 else f"not checked after {seen[-1]}")
        moved = sorted({fid_key[fixed][fid] for fid in key_ids[key] if fid in fid_key.get(fixed, {})}) if fixed else []
        defects.append({"key": key, "ops": sorted(key_ops[key]), "versions": cells, "first_seen": seen[0],
                        "moved_to": moved,
                        "not_checked_before": [v for v in versions[:first] if cells[v] == "not checked"],
                        "fixed_in": fixed, "not_checked_between": after if fixed else [], "state": state,
                        "present_in": seen, "findings": {v: len(ids) for v, ids in present[key].items()}})
    return {"schema": "rlconform-matrix/1", "engine": engine, "source": source, "versions": versions,
            "options": dict(options), "defects": defects, "releases": per_version}


def _variants_missing(reports: dict[str, dict], per_version: dict, ran: dict[str, set[str]]) -> None:
    """Fill ``variants_missing`` of each release: for every op that ran there, the variants / implementations
    (``engine.variants[op].checked`` of the report) that another release of the matrix checks and this one
    does not."""
    checked = {v: {op: set(info.get("checked") or ()) for op, info in
                   ((doc.get("engine") or {}).get("variants") or {}).items()} for v, doc in reports.items()}
    every: dict[str, set[str]] = {}
    for ops in checked.values():
        for op, names in ops.items():
            every.setdefault(op, set()).update(names)
    for v in reports:
        per_version[v]["variants_missing"] = {
            op: sorted(names - checked[v].get(op, set())) for op, names in sorted(every.items())
            if op in ran[v] and names - checked[v].get(op, set())}


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
             "`--xfails` line matches). Cells: ✗ present (number of failing findings), · absent (the findings "
             "that show it elsewhere ran there and none failed so), n/b not checked (none of those findings ran: "
             "the op, or the variant / implementation, is not bound in that release; see the last section). "
             "*First seen* is the oldest release it is present in (\"n/b before\": older releases could not "
             "check it); *fixed in* the first release after its last presence where it is absent (\"still "
             "present\": the newest release has it).", ""]
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
                     + f" | {_first_seen(d)} | {_fixed_in(d)} |")
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
        missing = doc["releases"][v].get("variants_missing") or {}
        if not unbound:
            lines += ["Every op bound.", ""]
        else:
            lines += ["| op | status | findings | missing (why) |", "|---|---|---|---|"]
            for op in sorted(unbound):
                u = unbound[op]
                lines.append(f"| {op} | {u['status']} | {u['findings']} | {_esc('; '.join(u['causes']))} |")
            lines.append("")
        if missing:
            lines += ["Variants / implementations another release of the matrix checks and this one does not "
                      "provide (not checked here): "
                      + "; ".join(f"{op}: {', '.join(names)}" for op, names in missing.items()) + ".", ""]
    return "\n".join(lines).rstrip() + "\n"


def _first_seen(d: dict) -> str:
    before = d.get("not_checked_before") or []
    return d["first_seen"] + (f" (n/b before: {', '.join(before)})" if before else "")


def _fixed_in(d: dict) -> str:
    if d.get("fixed_in"):
        between = d.get("not_checked_between") or []
        moved = d.get("moved_to") or []
        return (d["fixed_in"] + (f" (or earlier: n/b in {', '.join(between)})" if between else "")
                + (" (its findings still fail there, as " + "; ".join(f"`{_esc(k)}`" for k in moved) + ")"
                   if moved else ""))
    state = d.get("state") or "present in the newest"
    return "— (still present)" if state == "present in the newest" else f"— ({state})"

"""``rlconform diff BASE HEAD``: what changed between two reports.

BASE and HEAD are ``report.json`` files or folders holding one (e.g. the report of a pull request's base
and of its head), read by :func:`rlconform.harness.report.load.load_report` (a malformed report, a finding
without a status, ``"findings": "nope"``, 200 000 nested ``[``: exit 2, one line). Reports of two different
engines (``engine.name``, else ``engine.spec``) are refused unless ``--cross-engine`` is given, reports of two
devices (``run.device``: cpu, or cuda and the GPU's name) unless ``--allow-device-mismatch``. Both are
triaged (:func:`rlconform.harness.report.triage.annotate`), then compared by id:

* findings: *new* (failing in HEAD, passing or absent in BASE), *fixed* (failing in BASE, passing in HEAD:
  a status of :data:`PASSING`), *changed* (failing in both, with another severity, status or signature
  ``kind · feature``), *unchecked* (``error`` or ``binding_error`` in HEAD: nobody could check it, never "fixed");
  failing findings of BASE absent from HEAD are *not checked* (a filter or an unavailable op), never "fixed";
* defects: *new*, *fixed* (every member finding passes in HEAD), *changed* (severity or members, or
  members that still fail in HEAD under another signature: listed with the defect(s) they fail in now).

A finding "fails" when it has a severity (``discrepancy``, ``crash``, ``xfail``, ``unavailable``): a
ledger hides a finding from the exit code of ``check``, not from a diff. Only ids, statuses,
severities, signatures and member lists are compared: numbers, messages, reproducer paths and the engine's
path are not (two runs of the same code from two folders give the same diff: none). An incomplete HEAD
(``run.complete`` false: interrupted, or selected findings not run) is named, with what was not run.

Exit code (:func:`exit_code`): 1 when something new — a new finding or defect, a changed one whose severity
rose or whose signature changed — is at or above ``--fail-on`` (default ``robustness``: every severity but ``precision``; the order is
:data:`rlconform.harness.report.severity.SEVERITIES`), or when HEAD left something unchecked (findings in
``error``, an incomplete run); else 0; 2 when a report cannot be read. :func:`render_markdown` is the
pull-request comment: only the change, and what was not checked.

A report is data: diff never imports or runs anything it names (``engine.spec``, reproducer commands).
"""

from __future__ import annotations

import json
import os

from rlconform.harness.report.case_paths import relativise
from rlconform.harness.report.load import ReportError, load_report
from rlconform.harness.report.severity import RANK, at_least
from rlconform.harness.report.triage import annotate
from rlconform.harness.report.triage_md import HEADER, defect_row
from rlconform.harness.report.worker_only import worker_only_line

DEFAULT_FAIL_ON = "robustness"
MARKDOWN_LIMIT = 60_000
#: HEAD statuses that make a failing BASE finding "fixed" (the engine does it right now)
PASSING = ("pass", "marginal", "xpass")
#: HEAD statuses of a finding nobody could check: rlconform's own code raised, or the binding does not fit
UNCHECKED = ("error", "binding_error")


def load(path: str) -> dict:
    """A report document from ``path`` (a report.json, or a folder holding one), validated and triaged.
    Raises :class:`rlconform.harness.report.load.ReportError` (a ValueError, one line) when it cannot be read."""
    from rlconform.harness.report.load import report_path

    return annotate(relativise(load_report(path), os.path.dirname(os.path.abspath(report_path(path)))))


def device_of(doc: dict) -> str:
    """The device a report's engine computed on, as diff compares it: ``cpu``, or ``cuda (GPU name)`` (the
    index is not compared: two GPUs of one model compute alike). A report without ``run.device`` (written
    before devices were recorded) is a CPU run."""
    dev = (doc.get("run") or {}).get("device")
    if not isinstance(dev, dict):
        return "cpu"
    kind = str(dev.get("device") or "cpu").split(":", 1)[0]
    return kind if kind == "cpu" else f"{kind} ({dev.get('name') or 'unknown GPU'})"


def engine_name(doc: dict) -> str | None:
    """The engine a report is of: ``engine.name``, else ``engine.spec`` (None when the report says neither)."""
    eng = doc.get("engine") or {}
    return eng.get("name") or eng.get("spec")


def _failing(doc: dict) -> dict[str, dict]:
    return {f["id"]: f for f in doc["findings"] if f.get("severity")}


def _signature(f: dict) -> str:
    from rlconform.harness.report.triage import feature, kind

    k = kind(f)
    return f"{k} · {feature(f, k)}"


def _incomplete(doc: dict) -> dict | None:
    """``{"not_run": [ids], "interrupted": bool}`` when the report says its run is incomplete, else None."""
    run = doc.get("run") or {}
    complete = run.get("complete", doc.get("complete"))
    if complete is not False:
        return None
    not_run = run.get("not_run") or []
    return {"not_run": [x for x in not_run if isinstance(x, str)] if isinstance(not_run, list) else [],
            "interrupted": bool(run.get("interrupted"))}


def compare(base: dict, head: dict) -> dict:
    """The change from ``base`` to ``head`` (triaged documents)::

        {"findings": {"new": [f], "fixed": [f], "changed": [{"id", "before", "after", "rose", "fails",
                      "severity"}], "not_checked": [id], "unchecked": [f]},
         "defects": {"new": [d], "fixed": [d], "changed": [{"id", "before", "after", "rose", "fails",
                     "severity", "defect"}]},
         "incomplete": {"not_run": [id], "interrupted": bool} | None}

    (``f``/``d``: the HEAD finding/defect, or BASE's for fixed ones; ``before``/``after``: severity,
    status, signature or member strings; ``fails``: whether the change counts against ``--fail-on``, i.e.
    the severity rose or the signature changed; ``unchecked``: HEAD findings in ``error``)."""
    bf, hf = _failing(base), _failing(head)
    head_by_id = {f["id"]: f for f in head["findings"]}
    out = {"findings": {"new": [], "fixed": [], "changed": [], "not_checked": [], "unchecked": []},
           "defects": {"new": [], "fixed": [], "changed": []}, "incomplete": _incomplete(head)}
    out["findings"]["unchecked"] = sorted((f for f in head["findings"] if f["status"] in UNCHECKED),
                                          key=lambda f: f["id"])
    for fid, f in sorted(hf.items()):
        if fid not in bf:
            out["findings"]["new"].append(f)
            continue
        b = bf[fid]
        bs, hs = _signature(b), _signature(f)
        if (b["severity"], b["status"], bs) != (f["severity"], f["status"], hs):
            rose = RANK[f["severity"]] < RANK[b["severity"]]
            out["findings"]["changed"].append({
                "id": fid, "before": f"{b['severity']} ({b['status']}; {bs})",
                "after": f"{f['severity']} ({f['status']}; {hs})", "rose": rose, "fails": rose or bs != hs,
                "severity": f["severity"]})
    for fid, b in sorted(bf.items()):
        if fid in hf:
            continue
        h = head_by_id.get(fid)
        if h is not None and h["status"] in PASSING:
            out["findings"]["fixed"].append(b)
        elif h is None:
            out["findings"]["not_checked"].append(fid)
        # an `error` in HEAD is in "unchecked" already: never fixed
    bd = {d["id"]: d for d in base.get("defects", [])}
    hd = {d["id"]: d for d in head.get("defects", [])}
    head_defect_of = {m: d for d in hd.values() for m in d["members"]}
    for did, d in hd.items():
        if did in bd:
            b = bd[did]
            if (b["severity"], b["members"]) != (d["severity"], d["members"]):
                rose = RANK[d["severity"]] < RANK[b["severity"]]
                gained = [m for m in d["members"] if m not in bf]  # failing in the head, not in the base
                out["defects"]["changed"].append({
                    "id": did, "before": f"{b['severity']}, {len(b['members'])} findings",
                    "after": f"{d['severity']}, {len(d['members'])} findings", "rose": rose,
                    "fails": rose or bool(gained), "severity": d["severity"], "defect": d,
                    "new_members": [head_by_id[m] for m in gained if m in head_by_id],
                    "lost_members": [m for m in b["members"] if m not in d["members"]]})
        elif not any(m in bf for m in d["members"]):
            out["defects"]["new"].append(d)
    for did, b in bd.items():
        if did in hd:
            continue
        now = [head_by_id.get(m) for m in b["members"]]
        if all(h is not None and h["status"] in PASSING for h in now):
            out["defects"]["fixed"].append(b)
            continue
        moved = sorted({head_defect_of[m]["id"] for m in b["members"] if m in head_defect_of})
        if not moved:  # its failing members are absent or unchecked in HEAD: not fixed, not changed
            continue
        after = [hd[x] for x in moved]
        sev = min((x["severity"] for x in after), key=RANK.__getitem__)
        out["defects"]["changed"].append({
            "id": did, "before": f"{b['severity']}, {b['signature']['kind']} · {b['signature']['feature']}, "
                                 f"{len(b['members'])} findings",
            "after": "; ".join(f"{x['severity']}, {x['signature']['kind']} · {x['signature']['feature']} "
                               f"(now {x['id']})" for x in after),
            "rose": RANK[sev] < RANK[b["severity"]], "fails": True, "severity": sev, "defect": after[0]})
    for k in ("new", "fixed"):
        out["defects"][k].sort(key=lambda d: (RANK[d["severity"]], d["id"]))
    return out


def exit_code(change: dict, fail_on: str = DEFAULT_FAIL_ON) -> int:
    """1 when a new finding or defect, or a changed one whose severity rose or signature changed, is at or
    above ``fail_on``, or when HEAD left findings unchecked (``error``) or is incomplete; else 0."""
    if change["findings"].get("unchecked") or change.get("incomplete"):
        return 1
    new = [f["severity"] for f in change["findings"]["new"]] + [d["severity"] for d in change["defects"]["new"]]
    changed = [c["severity"] for part in ("findings", "defects") for c in change[part]["changed"]
               if c.get("fails", c.get("rose"))]
    return 1 if any(at_least(s, fail_on) for s in new + changed) else 0


def _not_checked_lines(change: dict) -> list[str]:
    """What HEAD did not check: ``error`` findings and an incomplete run (these make the diff red)."""
    lines = []
    unchecked = change["findings"].get("unchecked") or []
    for status, why in (("error", "rlconform's own code raised"),
                        ("binding_error", "the binding does not fit this engine version")):
        these = [f for f in unchecked if f["status"] == status]
        if not these:
            continue
        shown = ", ".join(f"`{f['id']}`" for f in these[:10]) + (f", … {len(these) - 10} more"
                                                                   if len(these) > 10 else "")
        lines += [f"- {len(these)} finding(s) are `{status}` in the head: {why}, so nobody could check them "
                  f"(not the engine's fault; see their messages in the head report); they are neither passing "
                  f"nor fixed: {shown}"]
    inc = change.get("incomplete")
    if inc:
        why = "it was interrupted" if inc["interrupted"] else "it ended early"
        nr = inc["not_run"]
        shown = (": " + ", ".join(f"`{x}`" for x in nr[:10]) + (f", … {len(nr) - 10} more" if len(nr) > 10 else "")
                 if nr else "")
        lines += [f"- the head run is incomplete (`complete: false`, {why}): {len(nr) or 'some'} selected finding(s) "
                  f"were not run{shown}"]
    return lines


def _first_line(f: dict) -> str:
    msg = (f.get("message") or "").strip().splitlines()
    return msg[0][:240] if msg else f.get("status", "")


def _engine_dtypes(doc: dict, op: str) -> list[str]:
    return list(((doc.get("engine") or {}).get("engine_dtypes") or {}).get(op) or [])


def _dtype_words(doc: dict, d: dict) -> str:
    """The defect's dtypes, the ones the engine calls its op with first: ``float32, bfloat16 (the engine's);
    also float64``."""
    used = _engine_dtypes(doc, d.get("op"))
    dts = list(d.get("dtypes") or [])
    mine = [t for t in dts if t in used]
    rest = [t for t in dts if t not in used]
    if not used:
        return ", ".join(dts)
    return ", ".join(mine) + (" (the engine's)" if mine else "no dtype the engine uses") + (
        f"; also {', '.join(rest)}" if rest else "")


def _changed_lines(doc: dict, c: dict, limit: int = 3) -> list[str]:
    """What changed in a defect, in words and numbers: its new failing findings (with their numbers, the
    engine's dtypes first, and the first one's replay command), a severity that rose, members that no longer
    fail."""
    d = c.get("defect") or {}
    out = [f"- **{d.get('severity', c.get('severity'))}** `{c['id']}` changed: {c['before']} → {c['after']}"]
    gained = sorted(c.get("new_members") or (), key=lambda f: (f.get("dtype") not in _engine_dtypes(doc, f.get("op")),
                                                                 f.get("id", "")))
    for f in gained[:limit]:
        out.append(f"  - newly failing `{f['id']}`: {_first_line(f)}")
    replay = next(((f.get("reproducer") or {}).get("command") for f in gained[:limit]
                   if (f.get("reproducer") or {}).get("command")), None)
    if replay:  # the first one's, the engine's dtype first: what a reviewer pastes
        out.append(f"  - replay: `{replay}`")
    if len(gained) > limit:
        out.append(f"  - … {len(gained) - limit} more newly failing finding(s) (diff.json)")
    if c.get("lost_members"):
        out.append(f"  - {len(c['lost_members'])} member finding(s) no longer fail in it")
    return out


def render_attribution(head: dict, attributed: dict) -> list[str]:
    """The comment's lead: per changed function, its new and changed defects (numbers, the dtypes the engine
    uses first, a replay command), then its callers in one line; then the other new defects, each naming the
    changed function it reaches, if any."""
    lines: list[str] = []
    for e in attributed["functions"]:
        lines += [f"### Changed function `{e['function']}`", ""]
        if e["defects"]:
            lines += [*HEADER, *(defect_row(x) for x in e["defects"]), ""]
            for x in e["defects"]:
                lines.append(f"- `{x['id']}`: dtypes {_dtype_words(head, x)}")
        for c in e["changed"]:
            lines += _changed_lines(head, c)
        if e["callers"]:
            names = sorted({(x.get("engine_function") or {}).get("function") or x.get("op") for x in e["callers"]})
            n = sum(len(x["members"]) for x in e["callers"])
            lines.append(f"- its failure reaches {len(names)} caller(s) ({n} finding(s)): "
                         + ", ".join(f"`{x}`" for x in names))
        lines.append("")
    if attributed["others"]:
        lines += ["### Other new defects", "", *HEADER]
        for x in attributed["others"]:
            row = defect_row(x)
            lines.append(row if not x.get("via") else row[:-1] + f" calls `{x['via']}` (changed) |")
        lines.append("")
    return lines


def render_markdown(base: dict, head: dict, change: dict, fail_on: str = DEFAULT_FAIL_ON,
                    selection: dict | None = None, max_lines: int | None = None) -> str:
    """The pull-request comment: counts, then what the head did not check, then only what changed. With
    ``selection`` (the head's ``selection.json``) it leads with the changed functions' new and changed
    defects and folds their callers (:mod:`rlconform.harness.report.attribution`); otherwise new, fixed and
    changed defects. The new / fixed / changed findings follow in a collapsed list. Under
    :data:`MARKDOWN_LIMIT` characters, and ``max_lines`` lines when given (the rest: diff.json)."""
    def rev(doc):
        e = doc.get("engine") or {}
        return e.get("revision") or e.get("version") or "?"

    f, d = change["findings"], change["defects"]
    code = exit_code(change, fail_on)
    bn, hn = engine_name(base), engine_name(head)
    title = hn if bn == hn else f"{bn} → {hn}"
    lines = [f"## rlconform diff: {title} `{rev(base)}` → `{rev(head)}`", ""]
    unchecked = _not_checked_lines(change)
    if unchecked:
        lines += ["### ❌ Not checked in the head", "", *unchecked, ""]
    worker_only = worker_only_line(head)
    if worker_only:
        lines += [worker_only + " (in the head)", ""]
    if not any(f[k] for k in ("new", "fixed", "changed")) and not any(d.values()):
        n = len(head.get("defects", []))
        lines += [("Otherwise no" if unchecked else "No") + f" change: {n} known defect(s), as in the base." + (
            f" ({len(f['not_checked'])} finding(s) of the base not checked in the head.)" if f["not_checked"] else "")]
        return "\n".join(lines) + "\n"
    verdict = ("❌ the head is not fully checked" if unchecked and code else
               "❌ something new at or above" if code else "✅ nothing new at or above")
    lines += [f"{verdict} `{fail_on}` · defects: {len(d['new'])} new, {len(d['fixed'])} fixed, "
              f"{len(d['changed'])} changed · findings: {len(f['new'])} new, {len(f['fixed'])} fixed, "
              f"{len(f['changed'])} changed", ""]
    attributed = None
    if selection is not None:
        from rlconform.harness.report.attribution import attribute

        attributed = attribute(change, selection)
        if not attributed["functions"]:
            attributed = None
    if attributed is not None:
        lines += render_attribution(head, attributed)
    elif d["new"]:
        lines += ["### New defects", "", *HEADER, *(defect_row(x) for x in d["new"]), ""]
    if d["fixed"]:
        lines += ["### Fixed defects", "", *HEADER, *(defect_row(x) for x in d["fixed"]), ""]
    shown = {c["id"] for e in (attributed or {}).get("functions", ()) for c in e["changed"]}
    rest = [c for c in d["changed"] if c["id"] not in shown]
    if rest:
        lines += ["### Changed defects", ""]
        for c in rest:
            lines += _changed_lines(head, c, limit=1)
        lines.append("")
    detail = []
    for x in f["new"]:
        detail.append(f"- new **{x['severity']}** `{x['id']}`: {_first_line(x)}")
    for x in f["fixed"]:
        detail.append(f"- fixed `{x['id']}` (was {x['severity']})")
    for c in f["changed"]:
        detail.append(f"- changed `{c['id']}`: {c['before']} → {c['after']}")
    if f["not_checked"]:
        detail.append(f"- {len(f['not_checked'])} failing finding(s) of the base not checked in the head")
    if max_lines is not None and len(lines) > max_lines - 4:
        kept = lines[:max(max_lines - 4, 0)]
        return "\n".join(kept + ["", f"… {len(lines) - len(kept)} more line(s) and {len(detail)} finding line(s): "
                                      f"see diff.json and the head report in the artifact"]) + "\n"
    if detail:
        lines += ["<details><summary>findings</summary>", ""]
        budget = MARKDOWN_LIMIT - sum(len(x) + 1 for x in lines) - 200
        room = None if max_lines is None else max(max_lines - len(lines) - 3, 1)
        for n, line in enumerate(detail):
            if len(line) + 1 > budget or room is not None and n >= room - 1 and n < len(detail) - 1:
                lines.append(f"- … {len(detail) - n} more (diff.json, and the head report)")
                break
            budget -= len(line) + 1
            lines.append(line)
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def cmd_diff(args) -> int:
    """``rlconform diff BASE HEAD [--fail-on S] [--markdown FILE] [--json FILE] [--cross-engine]``."""
    import sys

    try:
        base, head = load(args.base), load(args.head)
    except ReportError as exc:
        print(f"rlconform: error: cannot read report: {exc}", file=sys.stderr)
        return 2
    bn, hn = engine_name(base), engine_name(head)
    if bn != hn and not getattr(args, "cross_engine", False):
        print(f"rlconform: error: the base is a report of engine {bn!r} and the head of {hn!r}; a diff compares "
              f"two runs of one engine (give --cross-engine to compare them anyway)", file=sys.stderr)
        return 2
    bd, hd = device_of(base), device_of(head)
    if bd != hd and not getattr(args, "allow_device_mismatch", False):
        print(f"rlconform: error: the base ran on {bd} and the head on {hd}; their kernels differ, so a diff would "
              f"show the device, not the change (give --allow-device-mismatch to compare them anyway)",
              file=sys.stderr)
        return 2
    change = compare(base, head)
    selection = None
    if getattr(args, "selection", None):
        from rlconform.harness.report.attribution import load_selection

        try:
            selection = load_selection(args.selection)
        except (OSError, ValueError) as exc:
            print(f"rlconform: error: cannot read --selection {args.selection}: {exc}", file=sys.stderr)
            return 2
    md = render_markdown(base, head, change, args.fail_on, selection, getattr(args, "max_lines", None))
    try:
        if args.markdown:
            with open(args.markdown, "w") as fh:
                fh.write(md)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(change, fh, indent=1, default=str)
        if getattr(args, "sarif", None):
            from rlconform.harness.report.sarif import write_sarif

            write_sarif(args.sarif, change, args.fail_on)
    except OSError as exc:
        print(f"rlconform: error: cannot write {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(md, end="")
    return exit_code(change, args.fail_on)


def add_parser(sub) -> None:
    from rlconform.harness.report.severity import FAIL_ON

    p = sub.add_parser("diff", help="new, fixed and changed findings and defects between two reports")
    p.add_argument("base", help="the base report (report.json or its folder)")
    p.add_argument("head", help="the head report (report.json or its folder)")
    p.add_argument("--fail-on", choices=FAIL_ON, default=DEFAULT_FAIL_ON,
                   help="exit 1 when something new is at least this severe (training = destructive > logging > "
                        "robustness > precision; default: %(default)s)")
    p.add_argument("--markdown", default=None, help="also write the Markdown comment here")
    p.add_argument("--selection", default=None,
                   help="the head's selection.json (check --changed-since): lead with the changed functions' "
                        "defects and fold their callers under them")
    p.add_argument("--max-lines", type=int, default=None,
                   help="cut the Markdown at this many lines (the rest: --json and the head report)")
    p.add_argument("--json", default=None, help="also write the change as JSON here")
    p.add_argument("--sarif", default=None,
                   help="also write the new and changed defects as SARIF 2.1.0 here (code-scanning annotations)")
    p.add_argument("--allow-device-mismatch", action="store_true",
                   help="compare reports run on different devices (cpu, cuda of another GPU; refused otherwise: exit 2)")
    p.add_argument("--cross-engine", action="store_true",
                   help="compare reports of two different engines (refused otherwise: exit 2)")

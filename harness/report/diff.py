"""``rlconform diff BASE HEAD``: what changed between two reports (issue 12).

BASE and HEAD are ``report.json`` files or folders holding one (e.g. the report of a pull request's base
and of its head). Both are triaged (:func:`rlconform.harness.report.triage.annotate`), then compared by id:

* findings: *new* (failing in HEAD, passing or absent in BASE), *fixed* (failing in BASE, passing in
  HEAD), *changed* (failing in both, with another severity or status); findings absent from HEAD are
  *not checked* (a filter or an unavailable op), never "fixed";
* defects: *new*, *fixed* (every member passes in HEAD), *changed* (severity or members).

A finding "fails" when it has a severity (``discrepancy``, ``crash``, ``xfail``, ``unavailable``): a
ledger hides a finding from the exit code of ``check``, not from a diff. Only ids, statuses,
severities and member lists are compared: numbers, messages, reproducer paths and the engine's path
are not (two runs of the same code from two folders give the same diff: none).

Exit code (:func:`exit_code`): 1 when something new — a new finding, a finding or defect whose severity
rose — is at or above ``--fail-on`` (default ``robustness``: every severity but ``precision``, :mod:`rlconform.harness.report.severity`), else 0; 2 when a
report cannot be read. :func:`render_markdown` is the pull-request comment: only the change.
"""

from __future__ import annotations

import json
import os

from rlconform.harness.report.case_paths import relativise
from rlconform.harness.report.severity import RANK, at_least
from rlconform.harness.report.triage import annotate
from rlconform.harness.report.triage_md import HEADER, defect_row

DEFAULT_FAIL_ON = "robustness"
MARKDOWN_LIMIT = 60_000


def load(path: str) -> dict:
    """A report document from ``path`` (a report.json, or a folder holding one), triaged. Raises OSError
    or ValueError when it cannot be read."""
    p = os.path.join(path, "report.json") if os.path.isdir(path) else path
    with open(p) as fh:
        doc = json.load(fh)
    if "findings" not in doc:
        raise ValueError(f"{p} is not an rlconform report (no findings)")
    return annotate(relativise(doc, os.path.dirname(os.path.abspath(p))))


def _failing(doc: dict) -> dict[str, dict]:
    return {f["id"]: f for f in doc["findings"] if f.get("severity")}


def compare(base: dict, head: dict) -> dict:
    """The change from ``base`` to ``head`` (triaged documents)::

        {"findings": {"new": [f], "fixed": [f], "changed": [{"id", "before", "after"}], "not_checked": [id]},
         "defects": {"new": [d], "fixed": [d], "changed": [{"id", "before", "after"}]}}

    (``f``/``d``: the HEAD finding/defect, or BASE's for fixed ones; ``before``/``after``: severity,
    status or member count strings)."""
    bf, hf = _failing(base), _failing(head)
    head_ids = {f["id"] for f in head["findings"]}
    out = {"findings": {"new": [], "fixed": [], "changed": [], "not_checked": []},
           "defects": {"new": [], "fixed": [], "changed": []}}
    for fid, f in sorted(hf.items()):
        if fid not in bf:
            out["findings"]["new"].append(f)
        else:
            b = bf[fid]
            if (b["severity"], b["status"]) != (f["severity"], f["status"]):
                out["findings"]["changed"].append({"id": fid, "before": f"{b['severity']} ({b['status']})",
                                                   "after": f"{f['severity']} ({f['status']})",
                                                   "rose": RANK[f["severity"]] < RANK[b["severity"]],
                                                   "severity": f["severity"]})
    for fid, b in sorted(bf.items()):
        if fid in hf:
            continue
        (out["findings"]["fixed"] if fid in head_ids else out["findings"]["not_checked"]).append(
            b if fid in head_ids else fid)
    bd = {d["id"]: d for d in base.get("defects", [])}
    hd = {d["id"]: d for d in head.get("defects", [])}
    for did, d in hd.items():
        if did not in bd:
            out["defects"]["new"].append(d)
        elif (bd[did]["severity"], bd[did]["members"]) != (d["severity"], d["members"]):
            b = bd[did]
            out["defects"]["changed"].append({"id": did, "before": f"{b['severity']}, {len(b['members'])} findings",
                                              "after": f"{d['severity']}, {len(d['members'])} findings",
                                              "rose": RANK[d["severity"]] < RANK[b["severity"]],
                                              "severity": d["severity"], "defect": d})
    for did, b in bd.items():
        if did not in hd and all(m in head_ids for m in b["members"]):
            out["defects"]["fixed"].append(b)
    for k in ("new", "fixed"):
        out["defects"][k].sort(key=lambda d: (RANK[d["severity"]], d["id"]))
    return out


def exit_code(change: dict, fail_on: str = DEFAULT_FAIL_ON) -> int:
    """1 when a new finding, or a finding / defect whose severity rose, is at or above ``fail_on``."""
    new = [f["severity"] for f in change["findings"]["new"]] + [d["severity"] for d in change["defects"]["new"]]
    rose = [c["severity"] for part in ("findings", "defects") for c in change[part]["changed"] if c["rose"]]
    return 1 if any(at_least(s, fail_on) for s in new + rose) else 0


def render_markdown(base: dict, head: dict, change: dict, fail_on: str = DEFAULT_FAIL_ON) -> str:
    """The pull-request comment: counts, then only what changed (new and fixed defects, changed ones, and
    the new / fixed / changed findings in a collapsed list). Under :data:`MARKDOWN_LIMIT` characters."""
    eng = head.get("engine", {})

    def rev(doc):
        e = doc.get("engine", {})
        return e.get("revision") or e.get("version") or "?"

    f, d = change["findings"], change["defects"]
    code = exit_code(change, fail_on)
    lines = [f"## rlconform diff: {eng.get('name')} `{rev(base)}` → `{rev(head)}`", ""]
    if not any(f[k] for k in ("new", "fixed", "changed")) and not any(d.values()):
        n = len(head.get("defects", []))
        lines += [f"No change: {n} known defect(s), as in the base." + (
            f" ({len(f['not_checked'])} finding(s) of the base not checked in the head.)" if f["not_checked"] else "")]
        return "\n".join(lines) + "\n"
    verdict = "❌ something new at or above" if code else "✅ nothing new at or above"
    lines += [f"{verdict} `{fail_on}` · defects: {len(d['new'])} new, {len(d['fixed'])} fixed, "
              f"{len(d['changed'])} changed · findings: {len(f['new'])} new, {len(f['fixed'])} fixed, "
              f"{len(f['changed'])} changed", ""]
    if d["new"]:
        lines += ["### New defects", "", *HEADER, *(defect_row(x) for x in d["new"]), ""]
    if d["fixed"]:
        lines += ["### Fixed defects", "", *HEADER, *(defect_row(x) for x in d["fixed"]), ""]
    if d["changed"]:
        lines += ["### Changed defects", "", "| defect | before | after |", "|---|---|---|",
                  *(f"| {c['id']} | {c['before']} | {c['after']} |" for c in d["changed"]), ""]
    detail = []
    for x in f["new"]:
        msg = (x.get("message") or "").strip().splitlines()
        detail.append(f"- new **{x['severity']}** `{x['id']}`: {msg[0][:240] if msg else x['status']}")
    for x in f["fixed"]:
        detail.append(f"- fixed `{x['id']}` (was {x['severity']})")
    for c in f["changed"]:
        detail.append(f"- changed `{c['id']}`: {c['before']} → {c['after']}")
    if f["not_checked"]:
        detail.append(f"- {len(f['not_checked'])} failing finding(s) of the base not checked in the head")
    if detail:
        lines += ["<details><summary>findings</summary>", ""]
        budget = MARKDOWN_LIMIT - sum(len(x) + 1 for x in lines) - 200
        for n, line in enumerate(detail):
            if len(line) + 1 > budget:
                lines.append(f"- … {len(detail) - n} more")
                break
            budget -= len(line) + 1
            lines.append(line)
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def cmd_diff(args) -> int:
    """``rlconform diff BASE HEAD [--fail-on S] [--markdown FILE] [--json FILE]``."""
    import sys

    try:
        base, head = load(args.base), load(args.head)
    except (OSError, ValueError, KeyError) as exc:
        print(f"rlconform: error: cannot read report: {exc}", file=sys.stderr)
        return 2
    change = compare(base, head)
    md = render_markdown(base, head, change, args.fail_on)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(md)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(change, fh, indent=1, default=str)
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
    p.add_argument("--json", default=None, help="also write the change as JSON here")

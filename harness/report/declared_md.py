"""The report section "Conventions and guards": what the engine's binding declares it does
on purpose, and how often the run met each.

Reads ``doc["engine"]["declared"]`` (the binding's :class:`~rlconform.harness.core.declared.Declared` rows)
and each finding's ``declared`` counts (examples a guard or precondition covered) and ``declared_write``
(a ``non_destructive`` finding that shows a declared write, :func:`rlconform.harness.core.declared.covering_write`). Never a defect, never
red: a declared item is checked as declared, and a finding it does not cover keeps its status. Report
layer: imports nothing of the project.
"""

from __future__ import annotations

import html


def rows(doc: dict) -> list[dict]:
    """The declared items with ``examples`` (examples of the run they covered) and ``findings`` (ids)."""
    out = []
    for d in (doc.get("engine") or {}).get("declared") or []:
        hits = {f["id"]: (f.get("declared") or {}).get(d["name"], 0) for f in doc.get("findings", [])}
        hits = {k: v for k, v in hits.items() if v}
        writes = sorted(f["id"] for f in doc.get("findings", []) if f.get("declared_write") == d["name"])
        out.append({**d, "examples": sum(hits.values()), "findings": sorted(hits), "write_findings": writes})
    return out


def _where(d: dict) -> str:
    return ", ".join(d["ops"]) + (f" [{', '.join(d['variants'])}]" if d.get("variants") else "")


def _what(d: dict) -> str:
    """What it does; for a declared write, with what a caller that does not keep it sees (its hazard)."""
    return d["what"] + (f"; hazard: {d['hazard']}" if d.get("hazard") else "")


def _source(d: dict) -> str:
    return f"`{d['source']}`" + (f"; caller `{d['caller']}`" if d.get("caller") else "")


def _met(d: dict) -> str:
    if d.get("writes"):  # a declared write: verified in the installed engine's source, then per finding
        if not d.get("holds"):
            return f"does NOT hold in the installed engine ({d.get('evidence')}): its findings stay defects"
        seen = len(d.get("write_findings") or ())
        return (f"checked as declared: {d.get('evidence')}; " +
                (f"{seen} finding(s) show only this write ({', '.join(d['writes'])}, {d['phase']}, by "
                 f"{d['writer']})" if seen else "not met in this run"))
    if d["kind"] == "convention":
        return "checked as declared (the reference follows it)"
    return f"{d['examples']} example(s) in {len(d['findings'])} finding(s)" if d["examples"] else "not met in this run"


def writes_line(doc: dict) -> str:
    """One line for the top of the defects section: the engine's declared writes into a caller's tensor (a
    hazard to every other caller, kept by the engine's own callers: not a defect while the evidence holds),
    so that a maintainer sees them first; '' when the binding declares none."""
    items = [d for d in rows(doc) if d.get("writes")]
    if not items:
        return ""
    parts = []
    for d in items:
        state = (f"holds ({len(d.get('write_findings') or ())} finding(s) show only this write)" if d.get("holds")
                 else "does NOT hold: its findings are defects")
        parts.append(f"`{d['name']}` ({_where(d)}; `{d['source']}`): {d['writer']} writes {', '.join(d['writes'])} "
                     f"in the {d['phase']}; hazard: {d.get('hazard') or d['what']}; {state}")
    return ("Declared writes into a caller's tensor (not defects while the engine's own callers keep them; checked "
            "as declared, see \"Conventions and guards\"): " + " · ".join(parts))


def markdown_section(doc: dict) -> list[str]:
    """Markdown lines of the section ([] when the binding declares nothing)."""
    items = rows(doc)
    if not items:
        return []
    lines = ["### Conventions and guards", "",
             "What the engine does on purpose, as its binding declares it, with the engine's source line. Each is "
             "checked as declared (a convention: the reference follows it; a precondition: the checks keep it; a "
             "guard: the declared error, raised only where declared, passes; a declared write: its evidence is "
             "found in the installed engine's source, and a finding that shows that write and nothing else is "
             "listed here) and is not a defect. An undeclared difference stays a defect.", "",
             "| kind | name | op | what | reason | source | met |", "|---|---|---|---|---|---|---|"]
    for d in items:
        cells = [d["kind"], f"`{d['name']}`", _where(d), _what(d), d["reason"], _source(d), _met(d)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines + [""]


def html_section(doc: dict) -> str:
    """The section as an HTML fragment ('' when the binding declares nothing)."""
    items = rows(doc)
    if not items:
        return ""
    e = html.escape
    body = "".join(
        f"<tr><td>{e(d['kind'])}</td><td><code>{e(d['name'])}</code></td><td>{e(_where(d))}</td><td>{e(_what(d))}</td>"
        f"<td>{e(d['reason'])}</td><td><code>{e(d['source'])}</code>"
        + (f"; caller <code>{e(d['caller'])}</code>" if d.get("caller") else "")
        + f"</td><td>{e(_met(d))}</td></tr>" for d in items)
    return ("<h2 id=\"conventions\">Conventions and guards</h2>\n<p class=\"muted\">What the engine does on purpose, as "
            "its binding declares it: checked as declared, never a defect; an undeclared difference stays one.</p>\n"
            "<table><thead><tr><th>kind</th><th>name</th><th>op</th><th>what</th><th>reason</th><th>source</th>"
            f"<th>met</th></tr></thead><tbody>{body}</tbody></table>\n")

"""The report section "Conventions and guards" (issue 20 §2): what the engine's binding declares it does
on purpose, and how often the run met each.

Reads ``doc["engine"]["declared"]`` (the binding's :class:`~rlconform.harness.core.declared.Declared` rows)
and each finding's ``declared`` counts (examples a guard or precondition covered). Never a defect, never
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
        out.append({**d, "examples": sum(hits.values()), "findings": sorted(hits)})
    return out


def _where(d: dict) -> str:
    return ", ".join(d["ops"]) + (f" [{', '.join(d['variants'])}]" if d.get("variants") else "")


def _met(d: dict) -> str:
    if d["kind"] == "convention":
        return "checked as declared (the reference follows it)"
    return f"{d['examples']} example(s) in {len(d['findings'])} finding(s)" if d["examples"] else "not met in this run"


def markdown_section(doc: dict) -> list[str]:
    """Markdown lines of the section ([] when the binding declares nothing)."""
    items = rows(doc)
    if not items:
        return []
    lines = ["### Conventions and guards", "",
             "What the engine does on purpose, as its binding declares it, with the engine's source line. Each is "
             "checked as declared (a convention: the reference follows it; a precondition: the checks keep it; a "
             "guard: the declared error, raised only where declared, passes) and is not a defect. An undeclared "
             "difference stays a defect.", "",
             "| kind | name | op | what | reason | source | met |", "|---|---|---|---|---|---|---|"]
    for d in items:
        cells = [d["kind"], f"`{d['name']}`", _where(d), d["what"], d["reason"], f"`{d['source']}`", _met(d)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines + [""]


def html_section(doc: dict) -> str:
    """The section as an HTML fragment ('' when the binding declares nothing)."""
    items = rows(doc)
    if not items:
        return ""
    e = html.escape
    body = "".join(
        f"<tr><td>{e(d['kind'])}</td><td><code>{e(d['name'])}</code></td><td>{e(_where(d))}</td><td>{e(d['what'])}</td>"
        f"<td>{e(d['reason'])}</td><td><code>{e(d['source'])}</code></td><td>{e(_met(d))}</td></tr>" for d in items)
    return ("<h2 id=\"conventions\">Conventions and guards</h2>\n<p class=\"muted\">What the engine does on purpose, as "
            "its binding declares it: checked as declared, never a defect; an undeclared difference stays one.</p>\n"
            "<table><thead><tr><th>kind</th><th>name</th><th>op</th><th>what</th><th>reason</th><th>source</th>"
            f"<th>met</th></tr></thead><tbody>{body}</tbody></table>\n")

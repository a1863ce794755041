"""Markdown of a report's defects (``report.md`` leads with it; ``rlconform diff`` reuses the row format).

One line of counts per severity, then one row per defect, most severe first: severity, op, property,
signature (kind of wrong value · input feature), members (how many findings, over which dtypes), and
the reproducer command of its smallest member.
"""

from __future__ import annotations

from rlconform.harness.report.severity import SEVERITIES

#: characters the defect table may take in report.md (the findings table and examples follow)
DEFECTS_BUDGET = 20_000


def counts_line(doc: dict) -> str:
    t = doc.get("triage") or {}
    d, f = t.get("defects") or {}, t.get("findings") or {}
    if not any(d.values()):
        return ""
    return "**" + str(sum(d.values())) + " defect(s)**: " + ", ".join(
        f"{d.get(s, 0)} {s} ({f.get(s, 0)} findings)" for s in SEVERITIES if d.get(s))


def defect_row(d: dict) -> str:
    sig = d["signature"]
    rep = d.get("reproducer") or {}
    cmd = f"`{rep['command']}`" if rep.get("command") else (rep.get("finding") or "")
    return (f"| **{d['severity']}** | {d['op']} | {d['property']} | {sig['kind']} · {sig['feature']} | "
            f"{len(d['members'])} ({', '.join(d.get('dtypes') or [])}) | {cmd} |")


HEADER = ["| severity | op | property | signature | findings (dtypes) | reproduce (smallest) |",
          "|---|---|---|---|---|---|"]


def render_defects(doc: dict, budget: int = DEFECTS_BUDGET) -> list[str]:
    """The defects section of report.md (empty when there is no defect)."""
    defects = doc.get("defects") or []
    if not defects:
        return []
    lines = ["### Defects (findings grouped by op, property and failure signature)", "", counts_line(doc), "",
             *HEADER]
    used = sum(len(x) + 1 for x in lines)
    for n, d in enumerate(defects):
        row = defect_row(d)
        if used + len(row) > budget:
            lines.append(f"| … | {len(defects) - n} more defects: see report.json | | | | |")
            break
        used += len(row) + 1
        lines.append(row)
    return lines + ["", "### All failing findings", ""]

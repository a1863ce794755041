"""Markdown of a report's defects (``report.md`` leads with it; ``rlconform diff`` reuses the row format).

One line of counts per severity, then one row per defect (a root cause, :mod:`rlconform.harness.report.triage`),
most severe first, then by size of effect: severity; the engine function (or crash frame) with
``file:line`` (the op when none was recorded); the kind of failure and its trigger; engine vs exact on
the smallest input; members (how many findings, over which ops · properties · dtypes); and the
reproducer command of its smallest member.
"""

from __future__ import annotations

from rlconform.harness.report.severity import SEVERITIES

#: characters the defect table may take in report.md (the findings table and examples follow)
DEFECTS_BUDGET = 20_000


def counts_line(doc: dict) -> str:
    """Defects per severity and the findings they hold (a defect's findings count under the defect's
    severity, its most severe member's, so that the line adds up to the table's rows)."""
    t = doc.get("triage") or {}
    d, f = t.get("defects") or {}, dict(t.get("findings") or {})
    if doc.get("defects"):
        f = {}
        for row in doc["defects"]:
            f[row.get("severity")] = f.get(row.get("severity"), 0) + len(row.get("members") or ())
    if not any(d.values()):
        return ""
    return "**" + str(sum(d.values())) + " defect(s)**: " + ", ".join(
        f"{d.get(s, 0)} {s} ({f.get(s, 0)} findings)" for s in SEVERITIES if d.get(s))


def _num(x) -> str:
    return f"{x:.6g}" if isinstance(x, (int, float)) else str(x)


def where_cell(d: dict) -> str:
    """``function`` (``file:line``), crash frame first; the op when no engine site was recorded."""
    from rlconform.harness.report.triage import site_text

    site = d.get("crash_frame") or d.get("engine_function")
    if site:
        text = f"`{site.get('function')}` ({site.get('file')}:{site.get('line')})"
        if d.get("crash_frame") and d.get("engine_function"):
            text += f" via `{d['engine_function'].get('function')}`"
        return text
    return f"op {d.get('op')}" + (f" ({site_text(site)})" if site else "")


def defect_row(d: dict) -> str:
    sig = d["signature"]
    rep = d.get("reproducer") or {}
    cmd = f"`{rep['command']}`" if rep.get("command") else (rep.get("finding") or "")
    n = d.get("numbers")
    nums = f"{_num(n['engine'])} vs {_num(n['exact'])}" if n else ""
    what = " · ".join(x for x in (", ".join(d.get("ops") or [d["op"]]),
                                   ", ".join(d.get("properties") or [d["property"]]),
                                   ", ".join(d.get("dtypes") or [])) if x)
    return (f"| **{d['severity']}** | {where_cell(d)} | {sig['kind']} · {d.get('trigger') or sig['feature']} | {nums} | "
            f"{len(d['members'])} ({what}) | {cmd} |")


HEADER = ["| severity | engine function (file:line) | failure · trigger | engine vs exact | findings (ops · properties · dtypes) | reproduce (smallest) |",
          "|---|---|---|---|---|---|"]


def render_defects(doc: dict, budget: int = DEFECTS_BUDGET) -> list[str]:
    """The defects section of report.md (empty when there is no defect)."""
    defects = doc.get("defects") or []
    if not defects:
        return []
    lines = ["### Defects (root causes: engine function or crash frame × class of failure)", "", counts_line(doc), "",
             *HEADER]
    used = sum(len(x) + 1 for x in lines)
    for n, d in enumerate(defects):
        row = defect_row(d)
        if used + len(row) > budget:
            lines.append(f"| … | {len(defects) - n} more defects: see report.json | | | | |")
            break
        used += len(row) + 1
        lines.append(row)
    return lines + [""]

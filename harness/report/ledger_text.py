"""The text of a defect ledger written from a report (``rlconform ledger REPORT``).

:func:`ledger_lines` turns a ``report.json`` document into the lines of an ``--xfails`` file
(:mod:`rlconform.harness.report.xfails`): a header, then one ``defect <where> | <kind> | <scope>`` line per
accepted root cause, its member finding ids indented under it (the findings it accepts:
:meth:`~rlconform.harness.report.xfails.DefectLine.accepts`) — the failing findings (``discrepancy``, ``crash``, ``xfail``) grouped by the keys of
the report's defects table (:func:`rlconform.harness.report.triage.folded_keys`: a finding folded into a
callee's, another op's backward or a partition dependence is on that row's line, and
:meth:`~rlconform.harness.report.xfails.Ledger.match` follows the same folds) — in the report's defect order (severity, then effect),
each with its reason: severity, triggers, and the message of its smallest reproducer (editable: the
maintainer's words replace it; the number of findings is the report's, not the ledger's: a finding marginal
on one CPU and a rounding-sized discrepancy on another would change it). Then one finding-id line per
``marginal`` finding above the band's centre (:data:`rlconform.harness.core.tolerance.LEDGER_ABOVE`) that no
defect line's scope holds: on a CPU with another vector width its last bits may take it past the band, and
the line keeps that run green; one in a defect line's scope is matched by that line already
(:meth:`~rlconform.harness.report.xfails.Ledger.match`), and which marginal findings sit above the centre
depends on the CPU, so listing them would make the ledger differ between machines.
"""

from __future__ import annotations

import math

from rlconform.harness.core.tolerance import LEDGER_ABOVE
from rlconform.harness.report.xfails import FAILING, defect_line

#: the header's account of the key, repeated in every ledger so that its reader knows what a line matches
KEY_RULE = ("# A defect line accepts the failures of the findings indented under it (its members: those failing\n"
            "# when it was written, and the marginal ones of its scope) whose engine function (for a crash: the\n"
            "# deepest engine frame) and failure kind are those listed; any other failure of that function is red.\n"
            "# The trigger is not part of the key (it is read from the shrunk input, and ledger-listed findings are\n"
            "# not shrunk), it is in the reason. A member failing with an error over tolerance more than ten times\n"
            "# its max_ratio is red (the defect grew). A defect line none of whose findings fails is `xpass`\n"
            "# (fixed: remove the line).")


#: the comment of a member that passed, within the margin band, when the ledger was written: it is listed because
#: another CPU's last bits may take it past the band, not because it fails here (a reader would take it for a failure)
MARGINAL_MEMBER = "  # marginal: green here, within the margin band; listed for CPUs whose last bits differ"


def _magnitude(ratio) -> str:
    """A member line's ``max_ratio`` field (its worst error over tolerance, three significant digits), or
    nothing when the report has none (a crash)."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio < 0:
        return ""
    return f"  max_ratio {ratio:.3g}"


def _first_line(text: str | None, limit: int = 140) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0][:limit] if lines else ""


def ledger_lines(doc: dict, source: str) -> list[str]:
    """The ledger's lines (without newlines) for report ``doc`` read from ``source`` (named in the header)."""
    from rlconform.harness.report.triage import trigger

    eng = doc.get("engine") or {}
    out = [f"# rlconform xfails ledger for {eng.get('name')} {eng.get('version') or ''}".rstrip()
           + ": accepted defects, one per line (defect <where> | <kind> | <op.property, ...>  # reason), "
             "each with its member findings indented under it",
           f"# generated from {source} by `rlconform ledger`", *KEY_RULE.splitlines()]
    from rlconform.harness.report.triage import folded_keys

    failing = {f["id"]: f for f in doc["findings"] if f.get("status") in FAILING}
    keys = folded_keys(failing, doc["findings"])  # the report table's keys: a row of the table is a line of the ledger
    groups: dict[str, list[dict]] = {}
    for fid, f in failing.items():
        place, cls = keys[fid]
        groups.setdefault(f"{place} | {cls}", []).append(f)
    by_id = {f["id"]: key for key, members in groups.items() for f in members}
    order = []
    for d in doc.get("defects") or ():  # the report's ranking: severity, effect, size
        for fid in d.get("members") or ():
            key = by_id.get(fid)
            if key is not None and key not in order:
                order.append(key)
    order += sorted(k for k in groups if k not in order)
    from rlconform.harness.report.severity import RANK

    scoped: set = set()  # (op, property) pairs a defect line's scope holds
    marginal = [f for f in doc["findings"] if f.get("status") == "marginal"]
    marginal_ids = {f["id"] for f in marginal}
    # each member line's magnitude; a crash has no error over tolerance that could grow
    ratios = {f["id"]: None if "crash" in (f.get("status"), f.get("xfail_of")) else f.get("max_ratio")
              for f in doc["findings"]}
    for key in order:
        members = sorted(groups[key], key=lambda f: (len(f.get("worst_input") or ""), f["id"]))
        triggers = sorted({trigger(f) for f in members})
        sevs = [f.get("severity") for f in members if f.get("severity")]
        sev = min(sevs, key=lambda s: RANK.get(s, 99)) if sevs else None
        reason = (f"{sev + '; ' if sev else ''}trigger(s): {'; '.join(triggers)} — "
                  f"{_first_line(members[0].get('message')) or members[0]['status']}")
        scope = {(f["op"], f["property"]) for f in members}
        # its members: the findings it is written for, and the marginal ones it matches by scope (the first
        # line holding their op.property): on another CPU their last bits may take them past the band
        ids = {f["id"] for f in members} | {f["id"] for f in marginal
                                            if (f.get("op"), f.get("property")) in scope - scoped}
        scoped |= scope
        out.append(defect_line(key, scope, reason))
        out += [f"    {fid}" + _magnitude(ratios.get(fid)) + (MARGINAL_MEMBER if fid in marginal_ids else "")
                for fid in sorted(ids)]
    for f in sorted(doc["findings"], key=lambda f: f["id"]):
        if (f.get("status") == "marginal" and (f.get("max_ratio") or 0) > LEDGER_ABOVE
                and (f.get("op"), f.get("property")) not in scoped):
            out.append(f"{f['id']}  # marginal: {_first_line(f.get('message'))}")
    return out

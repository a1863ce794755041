"""Markdown of a report's defects (``report.md`` leads with it; ``rlconform diff`` reuses the row format).

One line of counts per severity, then one row per defect of every severity but ``precision`` (those
follow in a compact table of their own) (a root cause, :mod:`rlconform.harness.report.triage`),
most severe first, then by reachability and size of effect (:data:`ORDER_NOTE`): severity; the engine function (or crash frame) with
``file:line`` (the op when none was recorded); the kind of failure and its trigger; engine vs exact on
the smallest input; members (how many findings, over which ops · properties · dtypes); and the
reproducer command of its smallest member.
"""

from __future__ import annotations

from rlconform.harness.report.config_reach import describe
from rlconform.harness.report.remedies import IDIOMS, changed_words
from rlconform.harness.report.severity import SEVERITIES

#: characters the defect table may take in report.md (the findings table and examples follow)
DEFECTS_BUDGET = 20_000


#: how the rows are ranked (:func:`rlconform.harness.report.triage.defects`; docs/triage.md)
ORDER_NOTE = ("Ranked by severity (training, destructive, logging, robustness, precision, in that order; "
              "`--fail-on` counts training and destructive as one level), then by reachability (every "
              "step of a configuration — a loss mode or estimator the engine offers (not necessarily its default), "
              "more than one micro-batch — then any input, then an edge "
              "input, each in a dtype the engine calls the op with and on a realistic regime; last, only in "
              "another dtype or on an extreme regime), then by the size of the effect of the most reachable "
              "member of that severity (its relative error; the absolute one where the exact value is 0; "
              "unbounded for a crash, a NaN / inf, a changed tensor or a value scaled by the number of "
              "micro-batches), then by the number of findings.")

#: how a row's file:line is chosen (docs/triage.md)
CITE_NOTE = ("file:line is the faulty line, relative to the engine's package: a crash's deepest engine frame; "
             "otherwise the line of the engine function that its failing (shrunk) example executes and its "
             "passing examples of the same finding do not, ranked by Ochiai suspiciousness over the traced "
             "runs, else the faulty line the binding declares as a pattern of the installed source, else "
             "the function's def line (\"no single line; the function\"); \"in f (file:line)\" names the "
             "function's def.")


#: the configuration alternatives a row's "Reached by" lists before "or …" (the longest list of the committed
#: reports has 8)
REACH_SHOWN = 12


def counts_line(doc: dict) -> str:
    """Defects per severity and the findings they hold: :func:`rlconform.harness.report.triage.severity_counts`,
    the computation of report.json's ``triage`` (a defect's findings count under the defect's severity, its
    most severe member's, so that the line adds up to the table's rows)."""
    from rlconform.harness.report.triage import severity_counts

    t = severity_counts(doc["defects"]) if doc.get("defects") else (doc.get("triage") or {})
    d, f = t.get("defects") or {}, t.get("findings") or {}
    if not any(d.values()):
        return ""
    return "**" + str(sum(d.values())) + " defect(s)**: " + ", ".join(
        f"{d.get(s, 0)} {s} ({f.get(s, 0)} findings)" for s in SEVERITIES if d.get(s))


def _num(x, other=None) -> str:
    """``x`` with 6 significant digits, more (up to 17) until it reads differently from ``other``."""
    if not isinstance(x, (int, float)):
        return str(x)
    for digits in range(6, 18):
        text = f"{x:.{digits}g}"
        if not isinstance(other, (int, float)) or text != f"{other:.{digits}g}":
            return text
    return text


def _what(n: dict) -> str:
    """The output a numbers cell is about, saying whether it is a gradient or a metric when its name does not."""
    comp = n.get("component") or ""
    quantity = n.get("quantity") or ""
    if quantity in ("gradient", "metric") and quantity not in comp:
        return f"{quantity} ({comp})" if comp else quantity
    return comp


def numbers_cell(d: dict) -> str:
    """Engine vs exact of the clause with the largest effect, each with the digits that tell them apart, and
    their relative error; for a changed tensor, what changed (``version 0 → 3``, elements changed and one of
    them) when the message records it."""
    n = d.get("numbers")
    if n and n.get("sides"):  # two runs of the engine compared (B): each labelled, the exact value apart
        (la, a), (lb, b) = n["sides"]
        comp = _what(n)
        r = n["exact"]
        return (f"{comp + ': ' if comp else ''}{la} {_num(a, b)} vs {lb} {_num(b, a)} (exact {_num(r, a)})")
    if n:
        e, r = n["engine"], n["exact"]
        text = f"engine {_num(e, r)} vs exact {_num(r, e)}"
        comp = _what(n) if "component" in n else None
        if comp is None and str(n.get("clause") or "").lower().lstrip("- ").startswith("gradient"):
            comp = "gradient"  # a report written before numbers named their component
        if comp:
            text = f"{comp}: " + text  # the component the message reports (value, gradient, which output)
        if isinstance(e, (int, float)) and isinstance(r, (int, float)) and r:
            text += f" (rel err {abs(e - r) / abs(r):.3g})"
        elif isinstance(e, (int, float)) and isinstance(r, (int, float)):
            text += f" (abs err {abs(e - r):.3g})"
        return text
    if str(d["signature"]["kind"]).startswith("crash:"):  # what it raises, as the engine's text says
        return crash_text(d)
    if d["signature"]["kind"] == "missing output" and d.get("lost"):  # what was lost, as the clause says
        return d["lost"]
    return d.get("change") or ""


def crash_text(d: dict) -> str:
    """``raises IndexError: too many indices for tensor of dimension 2``: the exception of a crash row's
    smallest member as its crash record (or contract clause) gives the engine's text (``raised``; the row's kind
    alone when none is recorded)."""
    kind = str(d["signature"]["kind"]).split(":", 1)[1]
    text = d.get("raised") or ""
    return f"raises {kind}" + (f": {text[:160]}" if text else "")


def where_cell(d: dict) -> str:
    """``function`` (``file:line``), crash frame first; the op when no engine site was recorded."""
    from rlconform.harness.report.triage import cited_text, site_text

    site = d.get("crash_frame") or d.get("engine_function")
    functions = d.get("functions") or []
    if site and d["signature"]["kind"] == "rounding" and len(functions) > 1 and site.get("module"):
        # one rounding row per engine module (triage.annotate's key): the module, not one of its functions
        shown = ", ".join(f.split(" (")[0] for f in functions[:4]) + (", …" if len(functions) > 4 else "")
        return f"module `{site['module']}`: {len(functions)} functions ({shown})"
    if site:
        text = f"`{site.get('function')}` ({site.get('file')}:{site.get('line')})" if d.get("crash_frame") \
            else cited_text(site, "`")
        via = (d.get("engine_function") or {}).get("via") if not d.get("crash_frame") else None
        if via:  # where a forward mutation happens, deeper down (another package's function)
            text += f" via `{via.get('function')}` ({via.get('file')}:{via.get('line')})"
        caller = (d.get("crash_frame") or {}).get("caller")
        if caller:  # the engine frame that called the crashing one (the traceback's own path)
            text += f" called from `{caller.get('function')}` ({caller.get('file')}:{caller.get('line')})"
        elif d.get("crash_frame") and d.get("engine_function") and \
                d["engine_function"].get("function") != site.get("function"):
            text += f" via `{d['engine_function'].get('function')}`"
        if d.get("upstream"):  # the deepest frame is another package's: the fix belongs there
            text += f" — upstream: {d['upstream']}"
        return text
    return f"op {d.get('op')}" + (f" ({site_text(site)})" if site else "")


def severity_cell(d: dict) -> str:
    """``**training**``, or, for a defect whose impact depends on a configuration key, the condition and what it
    is at the default (``**training** if `actor_rollout_ref.actor.entropy_coeff` ≠ 0 (default 0: logging)``)."""
    k = d.get("depends_on")
    if not k:
        return f"**{d['severity']}**"
    return (f"**{d['severity']}** if `{k['knob']}` ≠ {k['default']} (default {k['default']}: "
            f"{k.get('otherwise') or 'no training impact'})")


def defect_row(d: dict) -> str:
    sig = d["signature"]
    rep = d.get("reproducer") or {}
    cmd = f"`{rep['command']}`" if rep.get("command") else (rep.get("finding") or "")
    nums = numbers_cell(d)
    what = " · ".join(x for x in (", ".join(d.get("ops") or [d["op"]]),
                                   ", ".join(d.get("properties") or [d["property"]]),
                                   ", ".join(d.get("dtypes") or [])) if x)
    return (f"| {severity_cell(d)} | {where_cell(d)} | {sig['kind']} · {d.get('trigger') or sig['feature']}"
            f"{variant_text(d)} | {nums} | {len(d['members'])} ({what}) | {cmd} |")


def variant_text(d: dict) -> str:
    """`` (shown: `token_k1_asym`, token k1: kept for 0.5 ≤ r ≤ 1.5)``: the parameters of the variant of the row's
    example (:func:`rlconform.harness.report.triage.variant_of`), or nothing."""
    v = d.get("variant")
    if not isinstance(v, dict) or not v.get("parameters"):
        return ""
    return f" (shown: `{v.get('name')}`, {v['parameters']})"


HEADER = ["| severity | engine function (file:line) | failure · trigger | engine vs exact | findings (ops · properties · dtypes) | reproduce (smallest) |",
          "|---|---|---|---|---|---|"]


PRECISION_TITLE = ("#### Precision: rounding-level, or only in dtypes the engine does not call the op with; "
                   "not failing by default")
PRECISION_HEADER = ["| engine function (file:line) | failure · trigger | engine vs exact | findings (ops · dtypes) | reproduce (smallest) |",
                    "|---|---|---|---|---|"]


def precision_row(d: dict) -> str:
    """A compact row of the precision table: where, failure · trigger, numbers, members, reproducer."""
    rep = d.get("reproducer") or {}
    cmd = f"`{rep['command']}`" if rep.get("command") else (rep.get("finding") or "")
    what = " · ".join(x for x in (", ".join(d.get("ops") or [d["op"]]), ", ".join(d.get("dtypes") or [])) if x)
    sig = d["signature"]
    return (f"| {where_cell(d)} | {sig['kind']} · {d.get('trigger') or sig['feature']}{variant_text(d)} | "
            f"{numbers_cell(d)} | {len(d['members'])} ({what}) | {cmd} |")


#: rows sharing a failure and trigger from which the table gets a one-line summary above it
IDIOM_ROWS = 3


def idiom_lines(rows: list[dict]) -> list[str]:
    """One line per known idiom (:data:`IDIOMS`: a failure and trigger, or a failure whatever its trigger) that
    :data:`IDIOM_ROWS` or more rows share: how many, which functions, and the fix that applies to all of them."""
    groups: dict[tuple, list[dict]] = {}
    for d in rows:
        kind, trig = d["signature"]["kind"], d.get("trigger") or d["signature"]["feature"]
        key = (kind, trig) if (kind, trig) in IDIOMS else (kind, None)  # an idiom of the kind, whatever the trigger
        groups.setdefault(key, []).append(d)
    out = []
    for (kind, trig), members in groups.items():
        idiom = IDIOMS.get((kind, trig))
        if len(members) < IDIOM_ROWS or idiom is None:
            continue
        idiom = ": ".join(idiom)
        names = sorted({(m.get("engine_function") or m.get("crash_frame") or {}).get("function") or m.get("op")
                        for m in members})
        what = f"{kind} · {trig}" if trig else kind
        out.append(f"- **{len(members)} rows are {what}** ({', '.join(f'`{n}`' for n in names[:8])}"
                   f"{', …' if len(names) > 8 else ''}): {idiom}.")
    return out


#: characters the cause-and-fix list may take in report.md
REMEDY_BUDGET = 16_000


def remedy_lines(defects: list[dict], budget: int = REMEDY_BUDGET) -> list[str]:
    """Why each row happens and how to fix it, one line per row in the table's order (numbered as the rows are
    on the page, precision rows after the others): its cited line, the cause, the fix, (a training row) the
    impact (:mod:`rlconform.harness.report.remedies`) and the configurations that reach it
    (:mod:`rlconform.harness.report.config_reach`); a row its binding explains nowhere says so."""
    if not defects:
        return []
    order = [d for d in defects if d.get("severity") != "precision"] + \
        [d for d in defects if d.get("severity") == "precision"]
    out, used = ["", "Why and how to fix, row by row:", ""], 40
    for n, d in enumerate(order, 1):
        r = d.get("remedy") or {}
        site = d.get("crash_frame") or d.get("engine_function") or {}
        line = (site.get("fault") or {}).get("line") or site.get("line")
        where = (f"`{site.get('function')}` ({str(site.get('file') or '').rsplit('/', 1)[-1]}:{line})"
                 if site.get("function") else f"op `{d.get('op')}`")
        if r.get("cause"):
            warn = changed_words(r)
            text = f"{n}. {where} · {d['signature']['kind']}: " + (f"**{warn[0].upper()}{warn[1:]}.** " if warn else "") + \
                f"{r['cause']}. **Fix:** {r['fix']}." + (
                f" **Impact:** {r['impact']}." if r.get("impact") else "")
        else:
            text = f"{n}. {where} · {d['signature']['kind']}: no cause recorded by the binding."
        if d.get("reached_by") is not None:
            # every alternative (a maintainer checks their configuration against the list: a cut list hides one)
            text += f" **Reached by:** {describe(d['reached_by'], limit=REACH_SHOWN)}."
        if used + len(text) > budget:
            out.append(f"{n}–{len(order)}. … see report.json (defects[].remedy)")
            break
        used += len(text) + 1
        out.append(text)
    return out


def render_defects(doc: dict, budget: int = DEFECTS_BUDGET) -> list[str]:
    """The defects section of report.md (empty when there is no defect): the counts, the idioms several rows
    share, the defects table (every severity but ``precision``, which ``--fail-on``'s default does not fail
    on), then the ``precision`` defects in a compact table of their own (rows numbered across both, in the
    report's order), then the ranking rule and how file:line is cited; the declared writes come first."""
    defects = doc.get("defects") or []
    if not defects:
        return []
    from rlconform.harness.report.declared_md import writes_line

    writes = writes_line(doc)
    lines = ["### Defects (root causes: engine function or crash frame × class of failure)", "", counts_line(doc), "",
             *([writes, ""] if writes else [])]  # a declared write's hazard comes before the rows
    # how the rows are ranked and cited follows the tables (the rows first, as on the page); its length is reserved
    notes = ["", ORDER_NOTE, "", CITE_NOTE, ""]
    main = [d for d in defects if d.get("severity") != "precision"]
    fine = [d for d in defects if d.get("severity") == "precision"]
    idioms = idiom_lines(main)
    if idioms:
        lines += ["One idiom, several rows:", "", *idioms, ""]
    if main:
        lines += HEADER
    used = sum(len(x) + 1 for x in lines + notes)
    rows = [(d, defect_row) for d in main] + [(d, precision_row) for d in fine]
    # why and how to fix each row follows the tables, within a budget of its own
    notes = [*remedy_lines(defects, REMEDY_BUDGET), *notes]
    for n, (d, render) in enumerate(rows):
        if render is precision_row and (n == 0 or rows[n - 1][1] is not precision_row):
            lines += ["", PRECISION_TITLE, "", *PRECISION_HEADER]
        row = render(d)
        if used + len(row) > budget:
            lines.append(f"| … | {len(rows) - n} more defects: see report.json | | | |" + (" |" if render is defect_row else ""))
            break
        used += len(row) + 1
        lines.append(row)
    return lines + notes

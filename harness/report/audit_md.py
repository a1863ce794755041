"""The static audit's hits linked to a report's dynamic findings, and its Markdown.

Input: the audit record that ``rlconform audit`` builds in a child process (``hits``: each
:class:`rlconform.harness.catalog.audit.Hit` as JSON; ``coverage``: the coverage table's items, so that a
hit's function is known bound or not) and, with ``--report DIR``, that report's findings. Data only: no
engine code runs here.

A hit's *findings* are the report's findings of its function: those whose ``engine_function`` is that
function, and those of the ops it is bound to (``op`` / ``op[variant]`` / ``op@impl``; a variant or an
implementation is the finding's regime prefix, ``grpo@data``; a plain ``op`` label takes the op's findings
that no other label of the op claims), except a failing finding that the report locates in another engine
function (its ``engine_function``). Its *verdict*:

* ``confirmed``: one of them fails (a discrepancy or a crash): the dynamic check found a defect there, which
  may or may not be the shape the rule names (the finding ids say which property failed);
* ``contradicted``: the function is bound and all its findings pass (or are marginal): the shape is there,
  but the checks found no harm (a guard elsewhere, or inputs that never reach it);
* ``unverified``: the function is not bound (nothing checks it), or no report was given, or the report has
  no finding of it.

The audit never turns a run red: ``rlconform audit`` exits 0 whatever it finds.
"""

from __future__ import annotations

__all__ = ["VERDICTS", "link", "render_markdown", "summary_counts"]

VERDICTS = ("confirmed", "contradicted", "unverified")
_FAIL = ("discrepancy", "crash")


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _split(label: str) -> tuple[str, str | None]:
    """``op[v]`` -> (op, v); ``op@impl`` -> (op, impl); ``op`` -> (op, None)."""
    if "[" in label:
        op, rest = label.split("[", 1)
        return op, rest.rstrip("]")
    if "@" in label:
        op, impl = label.split("@", 1)
        return op, impl
    return label, None


def _prefix(regime: str | None) -> str | None:
    return regime.split("@", 1)[0] if regime and "@" in regime else None


def link(record: dict, doc: dict | None) -> dict:
    """``record`` with each hit given ``status`` (the coverage status of its function), ``bound_to``,
    ``verdict`` (:data:`VERDICTS`), ``findings`` (ids of its findings) and ``failing`` (ids of those that
    fail); ``record["report"]`` says whether findings were given. Returns a new dict."""
    items = {it["name"]: it for it in (record.get("coverage") or {}).get("items", [])}
    findings = list((doc or {}).get("findings") or [])
    claimed: dict[str, set] = {}
    for it in items.values():
        for label in it.get("bound_to") or []:
            op, sel = _split(label)
            if sel is not None:
                claimed.setdefault(op, set()).add(sel)
    hits = []
    for h in record.get("hits", []):
        it = items.get(h["name"]) or {}
        bound_to = list(it.get("bound_to") or [])
        mine = []
        for f in findings:
            ef = f.get("engine_function") or {}
            if ef.get("module") == h["module"] and ef.get("function") == h["qualname"]:
                mine.append(f)
                continue
            if ef and f.get("status") in _FAIL:
                continue  # a failure located in another engine function is not this function's
            for label in bound_to:
                op, sel = _split(label)
                if f.get("op") != op:
                    continue
                pre = _prefix(f.get("regime"))
                if sel is None and pre not in claimed.get(op, set()) or sel is not None and pre == sel:
                    mine.append(f)
                    break
        failing = [f["id"] for f in mine if f.get("status") in _FAIL]
        if doc is not None and failing:
            verdict = "confirmed"
        elif doc is not None and bound_to and mine:
            verdict = "contradicted"
        else:
            verdict = "unverified"
        hits.append({**h, "status": it.get("status", "not listed"), "bound_to": bound_to, "verdict": verdict,
                     "findings": [f["id"] for f in mine], "failing": failing})
    return {**record, "hits": hits, "report": doc is not None}


def summary_counts(record: dict) -> dict:
    """``{"hits": N, "confirmed": …, "contradicted": …, "unverified": …, "unchecked": hits in functions
    nothing binds, "by_rule": {rule: N}}``."""
    hits = record.get("hits", [])
    out = {"hits": len(hits), **{v: sum(1 for h in hits if h.get("verdict") == v) for v in VERDICTS}}
    out["unchecked"] = sum(1 for h in hits if not h.get("bound_to"))
    by_rule: dict[str, int] = {}
    for h in hits:
        by_rule[h["rule"]] = by_rule.get(h["rule"], 0) + 1
    out["by_rule"] = by_rule
    return out


def render_markdown(record: dict, *, command: str | None = None, rules: dict | None = None) -> str:
    """The audit as Markdown: counts per rule and verdict, then one table row per hit (confirmed first)."""
    title = f"{record.get('engine')} {record.get('version') or ''}".rstrip()
    c = summary_counts(record)
    lines = [f"# Static audit of fault shapes in the numerics of {title}", ""]
    if command:
        lines += [f"Generated by `{command}`: the places in the numerics functions that whole-package discovery "
                  "finds (docs/coverage.md) matching a known fault shape. A hit is where to look, not a verdict: "
                  "*confirmed* = a finding of that function fails in the report, *contradicted* = the function "
                  "is bound and its findings pass, *unverified* = nothing checks it (or no report).", ""]
    lines += [f"**{c['hits']} hits: confirmed {c['confirmed']} · contradicted {c['contradicted']} · unverified "
              f"{c['unverified']}; {c['unchecked']} in functions no op binds**", ""]
    if rules:
        lines += ["| rule | hits | what it flags |", "|---|---|---|"]
        lines += [f"| `{r}` | {c['by_rule'].get(r, 0)} | {_cell(text)} |" for r, text in rules.items()]
        lines.append("")
    order = {v: i for i, v in enumerate(VERDICTS)}
    hits = sorted(record.get("hits", []), key=lambda h: (order.get(h.get("verdict"), 9), h["file"], h["line"]))
    if hits:
        lines += ["| verdict | rule | where | function | code | coverage | findings |", "|---|---|---|---|---|---|---|"]
        for h in hits:
            cov = ", ".join(f"`{b}`" for b in h.get("bound_to") or []) or _cell(h.get("status", ""))
            if h.get("failing"):
                fnd = f"{len(h['failing'])} of {len(h['findings'])} fail, e.g. `{h['failing'][0]}`"
            elif h.get("findings"):
                fnd = f"{len(h['findings'])} pass"
            else:
                fnd = "none"
            lines.append(f"| {h.get('verdict', 'unverified')} | `{h['rule']}` | `{h['file']}:{h['line']}` | "
                         f"`{_cell(h['qualname'])}` | `{_cell(h['code'][:90])}` | {cov} | {fnd} |")
        lines.append("")
    for e in record.get("errors") or []:
        lines.append(f"- error: {_cell(e)}")
    return "\n".join(lines).rstrip() + "\n"

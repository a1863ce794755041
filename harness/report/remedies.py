"""Why a defect happens and how to fix it: one sentence of cause and one of fix per defect row (and one of
impact for a ``training`` row), from the binding's remedies, else from the idiom the row shares with others.

A binding declares its remedies (``Binding.remedies``) keyed as its fault anchors are: ``"module.qualname"`` (or
``"module.qualname[row]"`` for an output that is a row of its own, ``Binding.output_sites``; ``"module"`` for the
one rounding row of an engine module) ->
``{kinds: (cause, fix[, impact])}``, ``kinds`` a regular expression over the defect's class (``wrong value``,
``partition dependence``, ``NaN / inf``, ``crash:ZeroDivisionError``, ``changes a tensor``) or a pair
``(kinds, trigger)`` that also matches the defect's trigger. The cause names the operation on the cited line
(the report prints the line beside it); the fix says what to change; the impact what a wrong value does to
training. ``Binding.remedy_table`` writes them into ``report.json`` (``engine.remedies``) where the engine's
binding is loaded; :func:`remedy` reads them back for a defect row, in the process that writes the report.

Rows no binding explains get the idiom's sentences (:data:`IDIOMS`: a failure and trigger that several engines'
functions share, such as NaN · 0 at a masked position), the cause prefixed with the row's cited line; a row
neither explains says so (``source: "none"``).
"""

from __future__ import annotations

import re

__all__ = ["IDIOMS", "changed_path", "changed_words", "remedy"]

#: the idiom behind a failure and trigger that many rows share: (cause, fix); key ``(kind, trigger)`` or
#: ``(kind, None)`` for any trigger
IDIOMS = {
    ("NaN / inf", "a masked position holding NaN"): (
        "a mask applied by multiplication or a sum over every position keeps NaN · 0 = NaN",
        "select the unmasked positions (torch.where, masked_fill) before reducing; where only the gradient is NaN, "
        "zero the masked inputs themselves before the product (the backward of torch.where multiplies its 0 by "
        "the NaN factor)"),
    ("partition dependence", None): (
        "a normaliser per part (a mean per micro-batch or DP rank, then summed or averaged over the parts)",
        "emit sums and counts, divide once over the mini-batch"),
    ("NaN / inf", "a −inf logit"): (
        "Σ softmax · logits at a −inf logit is 0 · (−inf) = NaN",
        "take 0 where the probability is 0 (torch.where(p > 0, p · z, 0)) or mask the −inf positions before the "
        "product"),
    ("wrong value", "bf16 input"): (
        "the reduction over the vocabulary runs in bf16 (or cancels in float32 at a large offset)",
        "reduce the max-shifted logits in float32"),
}


def changed_words(r: dict) -> str:
    """The warning a report prints before a binding's cause whose function changed (``remedy(...)["changed"]``):
    ``changed since REV: `a.py:f` -> `b.py:g` (changed); the cause below is the binding's reading of the code before
    the change``; empty when nothing changed."""
    c = r.get("changed") or {}
    if not c.get("path"):
        return ""
    path = " -> ".join(f"`{p}`" for p in c["path"])
    return (f"changed since {c.get('rev') or 'the base'}: {path}{' (changed)' if len(c['path']) > 1 else ''}; the "
            "cause below is the binding's reading of the code before the change, read the change first")


def _places(d: dict) -> list[str]:
    """Where a defect's remedy is looked up: its crash frame, its engine function, the frame it writes through."""
    out = []
    if str((d.get("signature") or {}).get("kind") or "").startswith("rounding"):  # one row per engine module
        module = (d.get("engine_function") or {}).get("module")
        if module:
            out.append(str(module))
    for s in (d.get("crash_frame"), d.get("engine_function"), (d.get("engine_function") or {}).get("via")):
        if s and s.get("module") and s.get("function"):
            if s.get("output_row"):  # an output of its own row: ``module.qualname[row]``
                out.append(f"{s['module']}.{s['function']}[{s['output_row']}]")
            out.append(f"{s['module']}.{s['function']}")
    return out


def changed_path(d: dict, changed: dict | None) -> list[str] | None:
    """The call path (``file:qualname`` each, the changed function last) from defect row ``d``'s engine function
    or crash frame to a function ``--changed-since`` found changed (``changed``: ``engine.changed_since``,
    ``{"rev", "paths": {bound function: path}}``), or None."""
    paths = [list(p) for p in ((changed or {}).get("paths") or {}).values() if p]
    for s in (d.get("crash_frame"), d.get("engine_function")):
        if not (s and s.get("file") and s.get("function")):
            continue
        here = f"{s['file']}:{s['function']}"
        # the row's function on a call path to the change (a bound function, a caller between, the changed one)
        on = [p[p.index(here):] for p in paths if here in p]
        if on:
            return min(on, key=len)
    return None


def remedy(d: dict, table: dict | None, changed: dict | None = None) -> dict:
    """``{"cause", "fix", "impact", "source"}`` of defect row ``d`` (``triage.defects``) from ``table``
    (``engine.remedies``, ``Binding.remedy_table``): the first rule of its crash frame, engine function or writing frame whose
    kinds (and trigger) match; else the idiom of its class and trigger (``source: "idiom"``); else empty
    sentences, ``source: "none"``. A binding's rule (or an idiom's reading of a line) describes the engine's code as
    it was read: where the row's function is on a call path to a function changed since ``--changed-since``'s
    revision (``changed``: ``engine.changed_since``; the row's function itself, or one it calls), the sentences are
    kept with ``changed: {"rev", "path"}`` (the call path from the row's function to the changed one), which the
    report prints first: the change is the first suspect, the sentences may describe code the change removed."""
    out = _sentences(d, table)
    moved = changed_path(d, changed) if out["source"] != "none" else None
    if moved:
        out["changed"] = {"rev": str((changed or {}).get("rev") or ""), "path": moved}
    return out


def _sentences(d: dict, table: dict | None) -> dict:
    """The binding's rule of row ``d``, else its idiom's, else none (:func:`remedy` without the change)."""
    kind, trig = d["signature"]["kind"], d.get("trigger") or d["signature"].get("feature") or ""
    for place in _places(d):
        for r in (table or {}).get(place) or ():
            if re.search(r["kinds"], kind) and (r.get("trigger") is None or re.search(r["trigger"], trig)):
                return {"cause": r["cause"], "fix": r["fix"], "impact": r.get("impact") or "", "source": "binding"}
    idiom = IDIOMS.get((kind, trig)) or IDIOMS.get((kind, None))
    if idiom:  # the idiom, on the row's own line
        site = d.get("engine_function") or {}
        fault = site.get("fault") or {}
        on = (f"`{fault['text'].strip()}` in `{site.get('function')}`" if fault.get("text")
              else f"`{site.get('function')}`" if site.get("function") else f"op `{d.get('op')}`")
        return {"cause": f"{on}: {idiom[0]}", "fix": idiom[1], "impact": "", "source": "idiom"}
    return {"cause": "", "fix": "", "impact": "", "source": "none"}

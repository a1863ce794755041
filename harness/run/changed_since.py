"""``rlconform check --changed-since REV``: the findings a pull request can have changed.

The rule: a finding is selected when an engine function behind its op (or its variant / implementation:
:func:`rlconform.harness.catalog.engine_site.op_sites`), or a function of the engine's package that one
calls, directly or through others (:func:`rlconform.harness.core.code_changes.changed_functions`),
has a line that ``git diff -U0 REV HEAD`` in the engine's checkout (``--engine-path``) reports changed;
also every finding of an op whose engine function cannot be located (it cannot be ruled out). A ledger
never widens the selection: a listed finding is checked when its function or a callee changed, like any
other; only a ledger line the change itself edits selects what it lists (its id, or its defect's scope),
so that a line added, widened or removed is checked against the head. The other filters (``--op``, ``--dtype``, ...) still apply.
Engine functions outside the checkout (an installed dependency) did not change in it.
"""

from __future__ import annotations

import dataclasses
import os

from rlconform.harness.core.code_changes import ChangeError, changed_functions, changed_lines
from rlconform.harness.core.opinfo import split_regime

__all__ = ["ChangeError", "Selection", "selection_summary", "select_changed", "write_selection", "write_selection_json", "read_selection"]


@dataclasses.dataclass
class Selection:
    """``ids``: the selected finding ids, in catalog order; ``why``: finding id -> its reason (``changed:
    verl/…/core_algos.py:agg_loss``, ``calls … -> …``, ``its ledger line changed``, ``no engine site``);
    ``paths``: finding id -> the call path from its bound function to the changed one (``file:qualname``
    each; one entry when the bound function itself changed); ``changed``: the
    bound functions found changed, each with the call path to the changed one."""

    rev: str
    ids: list[str]
    why: dict[str, str]
    changed: dict[str, list[str]]
    paths: dict[str, list[str]] = dataclasses.field(default_factory=dict)


def _in_checkout(site: dict, checkout: str) -> str | None:
    file = site.get("file") or ""
    if os.path.isabs(file):
        root = os.path.abspath(checkout).rstrip(os.sep) + os.sep
        return os.path.relpath(file, checkout) if file.startswith(root) else None
    return file if os.path.isfile(os.path.join(checkout, file)) else None


def select_changed(meta: dict, checkout: str, rev: str, findings: list[tuple], ledger=(), *,
                   transitive: bool = True) -> Selection:
    """Apply the rule of this module to ``findings`` (``(op, property, dtype, regime)`` tuples, as
    :func:`~rlconform.harness.run.selection.selected_findings` returns) with the engine's ``meta["sites"]``;
    ``ledger``: the ids whose ledger line the change edited (selected for that reason alone); raises :class:`ChangeError` when the change cannot be read."""
    hunks = changed_lines(checkout, rev)
    sites = meta.get("sites") or {}
    cache: dict[tuple[str, str, str], list[str] | None] = {}

    def path_for(s: dict) -> list[str] | None:
        file = _in_checkout(s, checkout)
        if file is None:
            return None
        qual = s["function"]
        key = (file, qual, s.get("top") or file.split("/")[0])
        if key not in cache:
            found = changed_functions(checkout, hunks, [(file, qual)], key[2], transitive=transitive)
            cache[key] = [f"{f}:{q}" for f, q in found[(file, qual)]] if (file, qual) in found else None
        return cache[key]

    ledger = set(ledger)
    ids, why, changed, paths = [], {}, {}, {}
    for finding in findings:
        fid = ".".join(finding)
        op, regime = finding[0], finding[3]
        by_prefix = sites.get(op) or {}
        prefix = split_regime(regime)[0] or ""
        op_sites = by_prefix.get(prefix, by_prefix.get("")) if by_prefix else None
        reason = None
        if not op_sites:
            reason = "no engine site (cannot be ruled out)"
        else:
            for s in op_sites:
                path = path_for(s)
                if path:
                    changed[path[0]] = path
                    paths[fid] = list(path)
                    reason = f"changed: {path[0]}" if len(path) == 1 else f"calls {' -> '.join(path)} (changed)"
                    break
        if reason is None and fid in ledger:
            reason = "its ledger line changed"
        if reason is not None:
            ids.append(fid)
            why[fid] = reason
    return Selection(rev=rev, ids=ids, why=why, changed=changed, paths=paths)


def selection_summary(sel: Selection) -> str:
    """``changed functions: a.py:f; bound functions reaching them: 3 (a.py:f, b.py:g, c.py:h)``: what the change
    edited (each call path's last function), then the bound functions whose findings it selects."""
    edited = sorted({path[-1] for path in sel.changed.values() if path})
    return (f"changed functions: {', '.join(edited) or 'none'}; bound functions reaching them: {len(sel.changed)}"
            + (f" ({', '.join(sorted(sel.changed))})" if sel.changed else ""))


def write_selection(path: str, sel: Selection) -> None:
    """The selection as a findings file (``--findings``): one id a line, ``# reason`` after it."""
    lines = [f"# rlconform --changed-since {sel.rev}: findings whose engine functions (or what they call) changed, "
             f"and those of ledger lines it edits", f"# {len(sel.ids)} finding(s); {selection_summary(sel)}"]
    lines += [f"{fid}  # {sel.why[fid]}" if sel.why.get(fid) else fid for fid in sel.ids]
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


def write_selection_json(path: str, sel: Selection) -> None:
    """The selection as data (``selection.json``): ``rev``, ``ids``, ``why``, ``paths`` (finding id -> call path
    to the changed function) and ``changed``; what ``rlconform diff --selection`` reads to attribute a pull
    request's failures to the function it changed (:mod:`rlconform.harness.report.attribution`)."""
    import json

    doc = {"rev": sel.rev, "ids": list(sel.ids), "why": {k: sel.why[k] for k in sel.ids if k in sel.why},
           "paths": {k: sel.paths[k] for k in sel.ids if k in sel.paths}, "changed": sel.changed}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)


def read_selection(path: str) -> list[str]:
    """The finding ids of a findings file (one a line; ``#`` starts a comment); raises OSError, or
    ValueError naming the first line that is not a finding id."""
    import re

    from rlconform.harness.core.opinfo import FINDING_ID

    pattern = re.compile(rf"^{FINDING_ID}$")
    out = []
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            if not pattern.match(text):
                raise ValueError(f"--findings {path}:{n}: not a finding id: {text[:80]!r}")
            out.append(text)
    return out

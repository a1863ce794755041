"""Which function a pull request broke: its failures attributed to the changed function, not to each caller.

``rlconform check --changed-since REV`` selects a finding when its bound engine function, or one it calls,
changed; ``selection.json`` (written beside the head's report) records, per selected finding, the call path
from its bound function to the changed one (``file:qualname`` each). :func:`attribute` reads that path and
the diff of two reports (:func:`rlconform.harness.report.diff.compare`):

* a new or changed defect whose engine function is a changed function is *the changed function's*;
* a new defect of a caller (every member selected through a path ending in a changed function ``F``) is
  listed under ``F`` when ``F`` has a new or changed defect in one of the caller's dtypes — the callers only
  show that ``F``'s failure reaches them; otherwise it is its own row, which names ``F``.

Data in, data out: the selection's fields and the defects' fields, never their text.
"""

from __future__ import annotations

import json

__all__ = ["attribute", "load_selection", "function_key"]


def load_selection(path: str) -> dict:
    """``{"rev", "ids", "why", "paths", "changed"}`` from a ``selection.json``; raises OSError or ValueError
    (not JSON, or not an object with a ``paths`` mapping of lists of strings)."""
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    paths = doc.get("paths") if isinstance(doc, dict) else None
    if not isinstance(paths, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and v and all(isinstance(x, str) for x in v)
            for k, v in paths.items()):
        raise ValueError(f"{path}: not an rlconform selection (no 'paths' of call paths)")
    return doc


def function_key(defect: dict) -> str | None:
    """``file:qualname`` of a defect's engine function (the form of a selection's call paths), or None."""
    fn = defect.get("engine_function") or {}
    file, name = fn.get("file"), fn.get("function")
    return f"{file}:{name}" if isinstance(file, str) and isinstance(name, str) else None


def _changed_of(defect: dict, paths: dict[str, list[str]]) -> str | None:
    """The changed function every member of ``defect`` was selected through (the end of each member's call
    path), or None when the members were selected otherwise or through different ones."""
    ends = {tuple(paths[m])[-1] for m in defect.get("members") or () if m in paths}
    if len(ends) != 1 or any(m not in paths for m in defect.get("members") or ()):
        return None
    return next(iter(ends))


def attribute(change: dict, selection: dict) -> dict:
    """``{"functions": [{"function", "defects": [d], "changed": [c], "callers": [d]}], "others": [d]}`` for
    the new and changed defects of ``change`` and the call paths of ``selection``: per changed function (in
    the selection's order), its own new defects, its changed defects (the ``change`` entries), and the new
    defects of callers folded under it; ``others``: the new defects not attributed to a changed function
    (each gets ``"via"``: the changed function its members were selected through, when there is one)."""
    paths = selection.get("paths") or {}
    targets: list[str] = []
    for p in paths.values():
        if p[-1] not in targets:
            targets.append(p[-1])
    own: dict[str, dict] = {t: {"function": t, "defects": [], "changed": [], "callers": []} for t in targets}
    new = list(change["defects"]["new"])
    for d in new:
        key = function_key(d)
        if key in own:
            own[key]["defects"].append(d)
    for c in change["defects"]["changed"]:
        key = function_key(c.get("defect") or {})
        if key in own:
            own[key]["changed"].append(c)

    def dtypes_failing(entry: dict) -> set:
        return {t for d in entry["defects"] for t in d.get("dtypes") or ()} | {
            t for c in entry["changed"] for t in (c.get("defect") or {}).get("dtypes") or ()}

    others = []
    for d in new:
        if function_key(d) in own:
            continue
        via = _changed_of(d, paths)
        if via in own and set(d.get("dtypes") or ()) & dtypes_failing(own[via]):
            own[via]["callers"].append(d)
        else:
            others.append(dict(d, via=via) if via else d)
    functions = [e for e in own.values() if e["defects"] or e["changed"] or e["callers"]]
    return {"functions": functions, "others": others}

"""The new and changed defects of a diff as SARIF 2.1.0 (``rlconform diff --sarif FILE``): the format
GitHub's code scanning (``github/codeql-action/upload-sarif``) and other CI systems read to annotate the
pull request's changed lines.

One result per new or changed defect of the head: rule = its failure kind, level ``error`` at or above
``--fail-on`` (else ``warning``), location = the defect's faulty line when the binding anchors one, else the
engine function's ``def`` line (``file`` relative to the checkout), message = severity, trigger, engine vs
exact and the replay command. Built from the defects' fields only.
"""

from __future__ import annotations

import json

from rlconform.harness.report.severity import at_least

__all__ = ["sarif_document", "write_sarif"]

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _location(d: dict) -> dict | None:
    site = d.get("crash_frame") or d.get("engine_function") or {}
    file = site.get("file") if isinstance(site, dict) else None
    if not isinstance(file, str) or not file or file.startswith("/"):
        return None
    fault = site.get("fault") if isinstance(site.get("fault"), dict) else {}
    line = fault.get("line") or site.get("line")
    region = {"startLine": int(line)} if isinstance(line, int) and line > 0 else {}
    return {"physicalLocation": {"artifactLocation": {"uri": file}, **({"region": region} if region else {})}}


def _message(d: dict, what: str) -> str:
    from rlconform.harness.report.triage_md import numbers_cell

    sig = d.get("signature") or {}
    rep = d.get("reproducer") or {}
    parts = [f"{what} {d.get('severity')} defect: {sig.get('kind')} · {d.get('trigger') or sig.get('feature')}",
             numbers_cell(d) if d.get("numbers") else "",
             f"{len(d.get('members') or [])} finding(s), dtypes {', '.join(d.get('dtypes') or [])}",
             f"reproduce: {rep['command']}" if rep.get("command") else ""]
    return "; ".join(p for p in parts if p)


def sarif_document(change: dict, fail_on: str) -> dict:
    """The SARIF log of ``change`` (:func:`rlconform.harness.report.diff.compare`)."""
    entries = [(d, "new") for d in change["defects"]["new"]] + [
        (c["defect"], "changed") for c in change["defects"]["changed"] if c.get("defect") and c.get("fails")]
    rules: dict[str, dict] = {}
    results = []
    for d, what in entries:
        kind = (d.get("signature") or {}).get("kind") or "defect"
        rule = "rlconform/" + "-".join(kind.replace(":", " ").replace("/", " ").split())
        rules.setdefault(rule, {"id": rule, "name": kind, "shortDescription": {"text": f"rlconform: {kind}"}})
        loc = _location(d)
        results.append({"ruleId": rule, "level": "error" if at_least(d.get("severity") or "precision", fail_on)
                        else "warning", "message": {"text": _message(d, what)},
                        "locations": [loc] if loc else [],
                        "partialFingerprints": {"rlconformDefect": str(d.get("id"))}})
    return {"$schema": SCHEMA, "version": "2.1.0",
            "runs": [{"tool": {"driver": {"name": "rlconform", "rules": list(rules.values())}},
                      "results": results}]}


def write_sarif(path: str, change: dict, fail_on: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(sarif_document(change, fail_on), fh, indent=1, default=str)

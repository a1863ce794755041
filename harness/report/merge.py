"""``rlconform report --merge DIR... --to OUT``: the reports of the N shards of one check, as one report.

A check too long for one CI job runs as N jobs, ``rlconform check --shard K/N`` each (a deterministic part
of the same selection: :func:`rlconform.harness.run.selection.shard_of`). Each finding's verdict depends on
the finding alone (its examples come from its own seed), so the merged report's findings, defects, severities
and ledger verdicts are those of a single run of the whole selection:

* the shards must be of one run's configuration (rlconform version, engine and its revision, profile,
  seed, examples, shrinking, device) and be shards 1..N of one N, each once; their findings disjoint;
* findings are united (ordered by id); the run is complete when every shard is; ``not_run`` is united;
* a ledger line is ``xfail`` when it accepted a finding in any shard, ``xpass`` when no shard saw a finding
  of its scope fail and the shards together ran its whole scope (none narrowed by ``--dtype`` or
  ``--regime``), else ``not checked``;
* defects, severities, the summary and report.md / report.html are derived again from the united findings
  (:func:`rlconform.harness.report.writer.rerender`).
"""

from __future__ import annotations

import json
import os

from rlconform.harness.report.case_paths import copy_case_files

__all__ = ["MergeError", "merge_reports"]

#: run fields every shard of one check shares
SAME_RUN = ("profile", "seed", "max_examples", "max_shrinks", "narrowed", "device", "hypothesis", "torch")


class MergeError(ValueError):
    """The folders are not the shards of one check; the message says why."""


def _ledger_lines(docs: list[dict], recorded: set, not_run: set, narrowed: bool) -> list[dict]:
    """The ledger verdicts of the merged run (module docstring) from the shards' ``run.ledger_defects``."""
    lines: dict[str, dict] = {}
    ran = {".".join(fid.split(".")[:2]) for fid in recorded}
    missing = {".".join(fid.split(".")[:2]) for fid in not_run}
    for doc in docs:
        for d in (doc.get("run") or {}).get("ledger_defects") or ():
            if not isinstance(d, dict) or not isinstance(d.get("key"), str):
                continue
            merged = lines.setdefault(d["key"], {"key": d["key"], "line": d.get("line"), "status": "not checked",
                                                 "findings": [], "reason": d.get("reason"),
                                                 "scope": list(d.get("scope") or [])})
            if d.get("status") == "xfail":
                merged["status"] = "xfail"
                merged["findings"] = sorted(set(merged["findings"]) | set(d.get("findings") or ()))
    for merged in lines.values():
        scope = set(merged["scope"])
        if merged["status"] != "xfail" and scope and not narrowed and scope <= ran and not scope & missing:
            merged["status"] = "xpass"
    return sorted(lines.values(), key=lambda d: (d.get("line") or 0, d["key"]))


def merge_reports(dirs: list[str], out_dir: str) -> dict:
    """Write the merged report of the shard folders ``dirs`` in ``out_dir`` (report.json, cases/, report.md,
    report.html) and return its document. Raises :class:`MergeError` when they are not the shards of one
    check, ValueError / OSError when a folder holds no readable report."""
    from rlconform.harness.core.safe_json import load_object
    from rlconform.harness.report.writer import rerender

    docs = [load_object(os.path.join(d, "report.json")) for d in dirs]
    for d, doc in zip(dirs, docs):
        if not all(isinstance(doc.get(k), dict) for k in ("tool", "engine", "run")) or not isinstance(
                doc.get("findings"), list):
            raise MergeError(f"{d}: not a report written by `rlconform check`")
    first = docs[0]
    for d, doc in zip(dirs[1:], docs[1:]):
        if doc["tool"].get("version") != first["tool"].get("version"):
            raise MergeError(f"{d}: written by rlconform {doc['tool'].get('version')}, {dirs[0]} by "
                             f"{first['tool'].get('version')}")
        for k in ("spec", "version", "revision"):
            if doc["engine"].get(k) != first["engine"].get(k):
                raise MergeError(f"{d}: engine {k} {doc['engine'].get(k)!r}, {dirs[0]}: {first['engine'].get(k)!r}")
        for k in SAME_RUN:
            if doc["run"].get(k) != first["run"].get(k):
                raise MergeError(f"{d}: run {k} {doc['run'].get(k)!r}, {dirs[0]}: {first['run'].get(k)!r}")
    shards = [doc["run"].get("shard") for doc in docs]
    try:
        parsed = [tuple(int(x) for x in s.split("/")) for s in shards]
    except (AttributeError, ValueError):
        raise MergeError("every folder must hold a report of `rlconform check --shard K/N`") from None
    n = {b for _, b in parsed}
    if len(n) != 1 or sorted(a for a, _ in parsed) != list(range(1, next(iter(n)) + 1)):
        raise MergeError(f"the folders hold shards {', '.join(shards)}: need each of 1..N of one N once")
    findings: dict[str, dict] = {}
    for d, doc in zip(dirs, docs):
        for f in doc["findings"]:
            if f.get("id") in findings:
                raise MergeError(f"{d}: finding {f.get('id')} is in two shards")
            findings[f["id"]] = f
    not_run = {x for doc in docs for x in doc["run"].get("not_run") or () if isinstance(x, str)}
    narrowed = any(doc["run"].get("narrowed") for doc in docs)
    for d, doc in zip(dirs, docs):
        copy_case_files(d, doc["findings"], out_dir)
    run = {k: v for k, v in first["run"].items() if k not in ("shard", "ledger_defects", "command")}
    run.update(started=min(str(doc["run"].get("started")) for doc in docs),
               finished=max(str(doc["run"].get("finished")) for doc in docs),
               complete=all(doc["run"].get("complete") is True for doc in docs), not_run=sorted(not_run),
               interrupted=any(doc["run"].get("interrupted") for doc in docs),
               merged_from=[{"shard": doc["run"].get("shard"), "command": doc["run"].get("command")} for doc in docs])
    if any("ledger_defects" in doc["run"] for doc in docs):
        run["ledger_defects"] = _ledger_lines(docs, set(findings), not_run, narrowed)
    merged = dict(first, run=run, findings=[findings[k] for k in sorted(findings)], defects=[])
    with open(os.path.join(out_dir, "report.json"), "w", encoding="utf-8") as fh:
        json.dump(merged, fh, indent=1, default=str)
    rerender(out_dir)
    return load_object(os.path.join(out_dir, "report.json"))

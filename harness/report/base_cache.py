"""A pull request's base, read from the report of the fork's main workflow instead of checked again.

The fork's main workflow checks every commit of main (the full catalog, the fork's ledger) and keeps the
report folder as an artifact. A pull request's check needs, for its base commit, the verdicts of the
findings its head selects (``selection.json``): :func:`subset_report` takes them from that report when it
is of the same base commit, engine and rlconform version, complete, and holds every selected finding — a
full check's verdict of a finding does not depend on the other findings of its run (each draws its examples
from its own seed). Anything else is a cache miss (:class:`CacheMiss`, with the reason), and the caller
checks the base itself.

Trust: the report must come from the fork's own main workflow (an artifact of a run on main's commit),
never from the pull request: a pull request controls its own head's files, and a base it supplied could
hide what it breaks. ``ci/rlconform-pr.sh --base-report DIR`` says where it came from; this module only
checks that it describes the base.
"""

from __future__ import annotations

import json
import os

from rlconform.harness.report.case_paths import copy_case_files

__all__ = ["CacheMiss", "subset_report"]


class CacheMiss(Exception):
    """The cached report cannot stand for the base; the message says why."""


def subset_report(src_dir: str, ids: list[str], out_dir: str, *, revision: str, engine: str, version: str) -> int:
    """Write ``out_dir/report.json`` (and its case files, then report.md / report.html) holding the findings
    ``ids`` of the report in ``src_dir``; returns how many. Raises :class:`CacheMiss` when that report is
    not of commit ``revision`` (a full hash, or a prefix of at least 7 characters of the report's), engine
    ``engine`` (its spec or name), rlconform ``version``, when its run is incomplete, or when it lacks a
    selected finding; raises ValueError when it is not a report."""
    from rlconform.harness.core.safe_json import load_object
    from rlconform.harness.report.writer import rerender

    doc = load_object(os.path.join(src_dir, "report.json"))
    tool, eng, run = doc.get("tool"), doc.get("engine"), doc.get("run")
    if not all(isinstance(x, dict) for x in (tool, eng, run)) or not isinstance(doc.get("findings"), list):
        raise ValueError(f"{src_dir}/report.json is not a report written by `rlconform check`")
    if tool.get("version") != version:
        raise CacheMiss(f"written by rlconform {tool.get('version')!r}, this is {version!r}")
    if engine not in (eng.get("spec"), eng.get("name")):
        raise CacheMiss(f"a report of engine {eng.get('spec') or eng.get('name')!r}, not {engine!r}")
    have = eng.get("revision")
    if not isinstance(have, str) or len(revision) < 7 or not have.startswith(revision) and not revision.startswith(have):
        raise CacheMiss(f"a report of commit {have!r}, the base is {revision!r}")
    if run.get("complete") is not True:
        raise CacheMiss("its run is incomplete")
    by_id = {f.get("id"): f for f in doc["findings"] if isinstance(f, dict)}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise CacheMiss(f"{len(missing)} selected finding(s) are not in it, e.g. {missing[0]}")
    findings = [by_id[i] for i in ids]
    copy_case_files(src_dir, findings, out_dir)
    sub = dict(doc, findings=findings, defects=[],
               run=dict(run, not_run=[], base_from={"report": os.path.abspath(src_dir), "findings": len(findings)}))
    with open(os.path.join(out_dir, "report.json"), "w", encoding="utf-8") as fh:
        json.dump(sub, fh, indent=1, default=str)
    rerender(out_dir)
    return len(findings)

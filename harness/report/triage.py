"""Triage of a report: a severity per failing finding, and *defects* — findings that share op, property
and failure signature across dtypes and regimes (issue 12).

Operates on the ``report.json`` document (a dict), whatever produced its findings. :func:`annotate` adds

* to each failing finding: ``severity`` (``wrong`` | ``destructive`` | ``imprecise``) and
  ``severity_reason`` (:mod:`rlconform.harness.report.severity`);
* to the document: ``defects: [{"id", "severity", "op", "property", "signature": {"kind", "feature"},
  "members": [finding ids], "dtypes", "regimes", "reproducer": {"finding", "case_file", "command",
  "input"}}]`` ranked by severity, then by number of members; and ``triage: {"defects": {severity: n},
  "findings": {severity: n}}``.

A signature is the kind of wrong value and the input feature that brings it out:

==================  ============================================================================
kind                from
==================  ============================================================================
crash:<Type>        status ``crash`` (the exception type in the message), or an input rank the
                    implementation's docstring allows that raised (``contract: a rank-N input … raised``)
unavailable         status ``unavailable``
missing gradient    "no autograd graph" / "no gradient" in the message
missing output      a wrong shape, nothing to compare, a lost metric
mutation            ``non_destructive``: an input changed during forward or backward
in-place on saved   ``non_destructive``: a tensor saved for backward was modified in place
NaN / inf           a NaN / ±inf where the exact value is finite
partition dependence  ``partition_invariant`` / ``mask_invariant`` beyond the thresholds of ``wrong``
implementations disagree  ``implementations_agree`` (two implementations of one variant), severity ``wrong``
wrong value         ``matches_reference``, severity ``wrong``
inexact value       any other failure (severity ``imprecise``)
==================  ============================================================================

Input features (first that applies; from the regime, the worst input and the message): ``masked
garbage`` (``mask_invariant``: what the property writes at masked positions), ``-inf logits`` (regime
``*neg_inf*``, or ``-inf`` in an input that has logits), ``fp16 overflow`` (float16 and an inf where
the exact value is finite, or regime ``*fp16_extreme``), ``large logit offset`` (``near_uniform_offset``,
``bf16_coarse``), ``imbalanced shards``
(regime ``*imbalanced*``, or a DP rank / micro-batch with 0 tokens), ``all masked`` (``all_off``),
otherwise ``any input``. Only the kinds NaN, inf, wrong
value, partition dependence and implementations disagree are split by feature; a mutation, a crash or an imprecision is one defect
whatever the input. The defect's reproducer is its member with the smallest shrunk input (length of
``worst_input``, then id).
"""

from __future__ import annotations

import re

from rlconform.harness.report.severity import RANK, SEVERITIES, classify, contract_crash_type

#: kinds of failure whose input feature tells defects apart (a mutation or an imprecision does not
#: depend on it: one defect whatever the input)
VALUE_KINDS = ("NaN", "inf", "wrong value", "partition dependence", "implementations disagree")
_EMPTY_SHARD = re.compile(r"tokens per DP rank \[[^\]]*\b0\b|shards \(nnz\) [^:]*\[0\]|\(nnz\)[^:]*\b0 tokens")


def kind(finding: dict) -> str:
    """The kind of wrong value of a failing finding (see the table of the module docstring)."""
    from rlconform.harness.report.severity import crash_type, nonfinite_where_finite

    status, prop = finding.get("status"), finding.get("property")
    msg = finding.get("message") or ""
    low = msg.lower()
    if status == "crash":
        return f"crash:{crash_type(msg)}"
    contract = contract_crash_type(msg)
    if contract:  # a documented input rank raised: the crash is the defect, whatever else the finding shows
        return f"crash:{contract}"
    if status == "unavailable":
        return "unavailable"
    if "no autograd graph" in low or "no gradient" in low:
        return "missing gradient"
    if "the engine returned shape" in msg or "nothing to compare" in msg or prop == "metric_integrity":
        return "missing output"
    if prop == "non_destructive":
        return "mutation" if "mutated" in low else "in-place on saved"
    nf = nonfinite_where_finite(finding)
    if nf:
        return "NaN" if nf == "nan" else "inf"
    sev = finding.get("severity") or classify(finding)[0]
    if prop in ("partition_invariant", "mask_invariant") and sev == "wrong":
        return "partition dependence"
    if prop == "implementations_agree" and sev == "wrong":
        return "implementations disagree"
    return "wrong value" if sev == "wrong" else "inexact value"


def feature(finding: dict, kind_: str | None = None) -> str:
    """The input feature that brings the failure out (see the module docstring)."""
    regime = finding.get("regime") or ""
    inp = finding.get("worst_input") or ""
    msg = finding.get("message") or ""
    k = kind_ or kind(finding)
    if k not in VALUE_KINDS:
        return "any input"
    if finding.get("property") == "mask_invariant" or "garbage" in regime:  # what the property puts there
        return "masked garbage"
    if "neg_inf" in regime or ("-inf" in inp and "logits" in inp):
        return "-inf logits"
    if finding.get("dtype") == "float16" and (k == "inf" or "fp16_extreme" in regime):
        return "fp16 overflow"
    if "fp16_extreme" in regime:
        return "fp16 overflow"
    if "near_uniform_offset" in regime or "bf16_coarse" in regime:
        return "large logit offset"
    if "imbalanced" in regime or _EMPTY_SHARD.search(msg):
        return "imbalanced shards"
    if regime.endswith("all_off"):
        return "all masked"
    return "any input"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower().replace("-inf", "neg-inf")).strip("-")


def defect_id(op: str, prop: str, kind_: str, feature_: str) -> str:
    """A stable id, e.g. ``entropy.finite_where_reference_finite.nan.-inf-logits`` → slugged parts."""
    return f"{op}.{prop}.{_slug(kind_)}.{_slug(feature_)}"


def _size(finding: dict) -> tuple:
    return (len(finding.get("worst_input") or "") or 10**9, finding["id"])


def defects(findings: list[dict]) -> list[dict]:
    """Group the failing findings (those with a severity) into defects, most severe first."""
    groups: dict[tuple, list[dict]] = {}
    for f in findings:
        if not f.get("severity"):
            continue
        k = kind(f)
        groups.setdefault((f["op"], f["property"], k, feature(f, k)), []).append(f)
    out = []
    for (op, prop, k, feat), members in groups.items():
        best = min(members, key=_size)
        rep = best.get("reproducer") or {}
        out.append({
            "id": defect_id(op, prop, k, feat),
            "severity": min((m["severity"] for m in members), key=RANK.__getitem__),
            "op": op, "property": prop, "signature": {"kind": k, "feature": feat},
            "members": sorted(m["id"] for m in members),
            "dtypes": sorted({m.get("dtype") for m in members if m.get("dtype")}),
            "regimes": sorted({m.get("regime") for m in members if m.get("regime")}),
            "reproducer": {"finding": best["id"], "case_file": rep.get("case_file"), "command": rep.get("command"),
                           "input": best.get("worst_input")},
            "message": (best.get("message") or "").strip().splitlines()[0][:300] if best.get("message") else "",
        })
    out.sort(key=lambda d: (RANK[d["severity"]], -len(d["members"]), d["id"]))
    return out


def annotate(doc: dict) -> dict:
    """Add severities, ``defects`` and ``triage`` counts to a report document, in place; returns it.
    Idempotent (recomputed from the findings each time)."""
    for f in doc.get("findings", []):
        sev, reason = classify(f)
        if sev is None:
            f.pop("severity", None)
            f.pop("severity_reason", None)
        else:
            f["severity"], f["severity_reason"] = sev, reason
    doc["defects"] = defects(doc.get("findings", []))
    counts_d = {s: 0 for s in SEVERITIES}
    counts_f = {s: 0 for s in SEVERITIES}
    for d in doc["defects"]:
        counts_d[d["severity"]] += 1
    for f in doc.get("findings", []):
        if f.get("severity"):
            counts_f[f["severity"]] += 1
    doc["triage"] = {"defects": counts_d, "findings": counts_f}
    return doc

"""Triage of a report: a severity per failing finding, and *defects* — root causes in the engine.

Operates on the ``report.json`` document (a dict), whatever produced its findings. :func:`annotate` adds

* to each failing finding: ``severity`` (``training`` | ``destructive`` | ``logging`` | ``robustness`` |
  ``precision``) and ``severity_reason`` (:mod:`rlconform.harness.report.severity`, with the document's
  ``engine.engine_dtypes``) — or, for a ``non_destructive`` finding that shows exactly a write the engine
  declares and that still holds in the installed engine (``engine.declared``,
  :func:`rlconform.harness.core.declared.covering_write`), ``declared_write`` (its name) and no severity:
  it is listed under "Conventions and guards", not as a defect;
* to the document: ``defects: [{"id", "severity", "effect", "engine_function", "crash_frame", "trigger",
  "triggers", "functions", "op", "ops", "property", "properties", "signature": {"kind", "feature"},
  "members", "dtypes", "regimes", "reachable", "numbers": {"engine", "exact", "clause", "component", "sides"} | null, "reproducer":
  {"finding", "case_file", "command", "input"}, "message", "raised", "lost", "reach", "reach_text"}]``
  (``message``: the shown member's first line, for display; ``raised``: a crash row's exception text as the
  engine's crash record gives it, :func:`~rlconform.harness.report.failure_fields.raised`; ``lost``: a missing
  output row's problem sentence) (``signature.kind`` the
  class) ranked by severity (:data:`~rlconform.harness.report.severity.SEVERITIES` order: ``training`` before
  ``destructive``), then by reachability (``reach``, :func:`reach`: every step of a configuration — a
  configuration the binding names, more than one micro-batch — then any input, then an edge input, each in
  a dtype the engine calls the op with (``engine.engine_dtypes``) on a realistic regime; last what is
  contrived), then by the size of the effect at that reachability
  (:func:`rlconform.harness.report.severity.effect`: a value scaled by the number of micro-batches is
  unbounded), then by ``reachable`` (a member in an engine dtype) and the number of members; and ``triage:
  {"defects": {severity: n}, "findings": {severity: n}}`` (:func:`severity_counts`: a defect's findings
  count under the defect's severity, as report.md's header line counts them).

A defect is the failing findings that share a *root key* (``where``, ``class``):

* ``where``: for a crash, the finding's ``crash_frame`` (the deepest engine frame of the traceback: a
  ``ValueError`` raised in ``masked_var`` is one defect whichever estimator, property or trigger reached it);
  else its ``engine_function`` (the engine callable behind the op / variant / second implementation); both
  recorded by the worker that ran the engine (:mod:`rlconform.harness.run.root_cause`), as
  ``module.qualname``. A finding without either (the reference engine, a mutant, a binding that names no
  callable, a report written before these fields) falls back to ``op <op>``. A rounding-sized failure
  (class ``rounding``) is located at the engine *module* instead: it names no line to fix, only the
  precision a module computes in (bf16 log-probs in the policy losses, float64 inputs computed in
  float32), so one module's rounding is one defect (its dtypes listed).
* ``class``: the kind of failure (table below) folded where two kinds are one symptom: ``mutation`` and
  ``in-place on saved`` are ``changes a tensor``; ``NaN`` and ``inf`` are ``NaN / inf``; ``wrong value`` and
  ``implementations disagree`` are ``wrong value``; ``inexact value`` is ``rounding``; ``crash:<Type>``,
  ``partition dependence``, ``masked-value dependence``, ``missing output``, ``missing gradient`` and
  ``unavailable`` stay apart.

*Deepest failing function.* A finding whose engine function calls (names in its own code: the site's
``calls``, :func:`rlconform.harness.catalog.engine_site.callees`) an engine function that fails in the same
class under the same trigger joins that callee's defect, as a crash joins its deepest frame:
``compute_policy_loss_sapo`` turning a masked NaN into a NaN loss through ``agg_loss`` is ``agg_loss``'s
defect, seen from another op (applied until nothing moves; a report without ``calls`` is not folded). When
the binding declares the variant the function calls its callee in (the site's ``calls_variant``: verl's
policy losses pass ``token-mean``, SAPO forces ``seq-mean-token-mean``), the callee must fail in that
variant: GSPO's NaN, with ``agg_loss`` passing in token-mean, is GSPO's own.

The *trigger* is not part of the key. Each finding is shrunk on its own, so its trigger is a feature its
shrunk input could not lose; when one engine function fails the same way under two triggers ("any input"
and "a row with no valid token"), each member fails without the other's feature, so neither is necessary
for the failure. A trigger is necessary only when the members without it pass, which the key expresses
through the class: ``partition dependence`` needs its partition (more than one micro-batch, TP > 1: the
same input unpartitioned passes ``matches_reference``), and is its own class; a ``wrong value`` of the
same function under the same trigger (``matches_reference`` of a micro-batched check, the empty micro-batch
that also breaks ``partition_invariant``) is that partition's effect and joins it. The defect shows the trigger
of its reproducer (the smallest member of its most severe findings, one of an op whose metric keys the
engine emits before a probe's) and lists all of them (``triggers``).
So one root cause failing several properties, ops, dtypes, regimes and triggers is one defect, and two
engine functions (two crash frames) or two classes are two. The defect ``id`` is a function of the key only
(:func:`defect_id`), stable across runs.

The kind of failure:

==================  ============================================================================
kind                from
==================  ============================================================================
crash:<Type>        status ``crash`` (the crash record's exception type), or an input rank the
                    implementation's docstring allows that raised (a ``contract`` clause)
unavailable         status ``unavailable``
missing gradient    a ``problem`` clause of a missing gradient (no autograd graph, no gradient); a gradient where
                    the binding declares none (``unexpected gradient``) is a wrong value
missing output      a wrong shape, nothing to compare, a lost metric
mutation            ``non_destructive``: an input changed during forward or backward
in-place on saved   ``non_destructive``: a tensor saved for backward was modified in place
NaN / inf           a NaN / ±inf where the exact value is finite
partition dependence  ``partition_invariant`` beyond the thresholds of a wrong value
masked-value dependence  ``mask_invariant`` beyond them: what the loss mask hides (a NaN, a large value at
                    a masked position) changes a result at valid positions
implementations disagree  ``implementations_agree`` (two implementations of one variant) beyond them
wrong value         beyond the thresholds of a wrong value (the tolerance table)
inexact value       any other failure (rounding-sized), and a wrong value that rounding of an extreme
                    input in bf16 / fp16 explains (:func:`~rlconform.harness.report.severity.rounding_of_extreme_input`)
==================  ============================================================================

Input features of a report without triggers (first that applies; from the regime, the worst input and
the clauses' layouts): ``masked garbage`` (``mask_invariant``), ``-inf logits``, ``fp16 overflow``, ``large logit
offset``, ``imbalanced shards``, ``all masked``, otherwise ``any input``; only the kinds NaN, inf, wrong
value and partition dependence are split by it. The defect's reproducer is its member with the smallest
shrunk input (length of ``worst_input``, then id).
"""

from __future__ import annotations

import math
import re

from rlconform.harness.core import failure
from rlconform.harness.report import failure_fields as F
from rlconform.harness.report.severity import (
    RANK,
    SEVERITIES,
    _wrong_value,
    classify,
    contract_crash_type,
    effect,
    outcome,
    rounding_of_extreme_input,
    ulp_level,
)

#: kinds of failure whose input feature tells defects apart in a report without triggers
VALUE_KINDS = ("NaN", "inf", "wrong value", "partition dependence", "masked-value dependence",
               "implementations disagree")
#: kinds whose trigger (a partition, a masked value) is necessary: a wrong value of the same place under
#: the same trigger is their effect and joins them
DEPENDENCE_KINDS = ("partition dependence", "masked-value dependence")
def _empty_shard(finding: dict) -> bool:
    """Whether a numeric clause's ``layout`` counts a part with no token."""
    return any(0 in failure.counts(c.layout) for c in F.numeric(finding))


def kind(finding: dict) -> str:
    """The kind of failure of a failing finding (see the table of the module docstring)."""
    from rlconform.harness.report.severity import crash_type, nonfinite_where_finite

    status, prop = outcome(finding), finding.get("property")
    if status == "crash":
        return f"crash:{crash_type(finding)}"
    contract = contract_crash_type(finding)
    if contract:  # a documented input rank raised: the crash is the defect, whatever else the finding shows
        return f"crash:{contract}"
    if status == "unavailable":
        return "unavailable"
    absent = F.problems(finding)
    if "missing gradient" in absent:
        return "missing gradient"
    if "unexpected gradient" in absent:  # a gradient where the contract says none: the gradient is wrong
        return "wrong value"
    if "missing output" in absent or "lost metric" in absent or prop == "metric_integrity":
        # a metric lost on its way, whatever property saw it
        return "missing output"
    if prop == "non_destructive":
        return "mutation" if F.changed_input(finding) else "in-place on saved"
    nf = nonfinite_where_finite(finding)
    if nf:
        return "NaN" if nf == "nan" else "inf"
    wrong = _wrong_value(finding) is not None
    if prop == "partition_invariant" and wrong and wrong_unpartitioned(finding):
        return "wrong value"  # the unpartitioned value is as wrong: the layout is where it ran, not the cause
    if prop == "partition_invariant" and wrong:
        return "partition dependence"
    if prop == "mask_invariant" and wrong:
        return "masked-value dependence"
    if prop == "implementations_agree" and wrong:
        return "implementations disagree"
    if wrong and (rounding_of_extreme_input(finding) or ulp_level(finding)):  # rounding: its module's
        return "inexact value"
    return "wrong value" if wrong else "inexact value"


_LABELLED_WHOLE = re.compile(r"unsharded|unpartitioned|\((?:TP|CP|DP) = 1\)")


def wrong_unpartitioned(finding: dict) -> bool:
    """Whether a ``partition_invariant`` failure shows the *unpartitioned* value wrong too: some clause
    ``X vs Y (reference R, allowed difference D)`` whose side labelled unsharded / ``(TP = 1)`` is farther than
    D from R (and, when neither side is labelled, both are). Then the value is wrong at every layout tried
    and the partition is not what brings it out (verl's bf16 ``vocab_parallel_entropy``: unsharded 0.5 and
    TP = 2 0.0 where the exact entropy is 0.113)."""
    from rlconform.harness.core.tolerance import WRONG_REL

    for c in F.of_kind(finding, "difference"):
        x, y, r, d = c.engine, c.other, c.exact, c.tolerance
        if None in (x, y, r, d) or not all(math.isfinite(v) for v in (x, y, r)) or d <= 0:
            continue
        left_whole = bool(_LABELLED_WHOLE.search(c.label or ""))
        right_whole = bool(_LABELLED_WHOLE.search(c.other_label or ""))
        sides = [x] if left_whole else [y] if right_whole else [x, y]
        # wrong beyond the thresholds of a wrong value, not by rounding (Megatron's float64 smoothed
        # log-prob, unsharded 6e-11 off in float32 arithmetic, TP = 2 9e-4 off: the layout's)
        if all(abs(v - r) > d and abs(v - r) >= WRONG_REL * max(abs(r), 1.0 if abs(r) <= d else 0.0)
               for v in sides):
            return True
    return False


def feature(finding: dict, kind_: str | None = None) -> str:
    """The input feature of a report without triggers (see the module docstring)."""
    regime = finding.get("regime") or ""
    inp = finding.get("worst_input") or ""
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
    if "imbalanced" in regime or _empty_shard(finding):
        return "imbalanced shards"
    if regime.endswith("all_off"):
        return "all masked"
    return "any input"


def where(finding: dict, kind_: str | None = None) -> dict | None:
    """The engine site a finding's root key uses: its ``crash_frame`` for a crash, else its
    ``engine_function`` (None: neither was recorded)."""
    k = kind_ or kind(finding)
    if k.startswith("crash:") and finding.get("crash_frame"):
        return finding["crash_frame"]
    return finding.get("engine_function") or None


def trigger(finding: dict, kind_: str | None = None) -> str:
    """What the failure record itself shows (:func:`rlconform.harness.core.triggers.said_trigger`: a
    NumPy scalar type, a shard without a valid token), else the finding's recorded ``trigger``, else (an
    older report) its input :func:`feature`. A layout trigger (``TP > 1``) of a finding whose unpartitioned
    value is wrong too (:func:`wrong_unpartitioned`) reads ``any input``."""
    from rlconform.harness.core.triggers import said_trigger

    said = said_trigger(F.clauses(finding), F.crash_text(finding)) or finding.get("trigger") or \
        feature(finding, kind_)
    if _LAYOUT_TRIGGER.match(said) and finding.get("property") == "partition_invariant" and \
            wrong_unpartitioned(finding):
        return "any input"
    return said


_LAYOUT_TRIGGER = re.compile(r"^(?:TP|CP|DP) > 1$")


def read_layouts(failing: dict, everything: list[dict] | None = None) -> dict:
    """``failing`` with the layout trigger (``TP > 1``, ``CP > 1``, ``DP > 1``: the regime the check ran in)
    of each finding read as ``any input`` where the report shows the layout is not what brings the failure
    out: the ``partition_invariant`` finding of the same op, dtype and regime shows the unpartitioned value
    wrong too (:func:`wrong_unpartitioned`). A passing ``partition_invariant`` is no such evidence (its
    examples are not the failing one's), and without a failing one the layout trigger stands.
    ``everything``: every finding of the report; returns a new mapping (changed findings are copies)."""
    pool = list(everything) if everything is not None else list(failing.values())
    part = {(f.get("op"), f.get("dtype"), f.get("regime")): f for f in pool if f.get("property") == "partition_invariant"}
    out = {}
    for fid, f in failing.items():
        t = trigger(f)
        if _LAYOUT_TRIGGER.match(t):
            p = part.get((f.get("op"), f.get("dtype"), f.get("regime")))
            if p is not None and p.get("status") in FAILING_STATUSES and wrong_unpartitioned(p):
                f = dict(f, trigger="any input", trigger_recorded=t)
        out[fid] = f
    return out


FAILING_STATUSES = ("discrepancy", "crash", "xfail")


#: data regimes whose inputs are large logits (a logit offset of thousands; bf16's coarse grid)
LARGE_LOGIT_REGIMES = ("near_uniform_offset", "bf16_coarse")
_LOW = {"bfloat16": "bf16", "float16": "fp16"}


_SHORT = dict(_LOW, float32="fp32", float64="fp64")


def narrowest(trig: str, members: list[dict], checked: set | None = None) -> str:
    """The defect's trigger ``trig`` narrowed to what all ``members`` (those of its severity) share when it reads ``any input``
    ("any input" only for a failure seen on any input): the dtypes every member is in when the
    same ops and properties ran and passed in others (``checked``: the dtypes they ran in; ``fp32 input``
    for Megatron's in-place cross entropy, which copies bf16 / fp16 / fp64 logits and writes into fp32
    ones), or, without ``checked``, a low precision every member is in (``bf16 input``, ``bf16 or fp16
    input``); large logits every member's regime holds."""
    if trig != "any input" or not members:
        return trig
    from rlconform.harness.core.opinfo import split_regime

    parts = []
    dtypes = {m.get("dtype") for m in members}
    if dtypes and None not in dtypes and checked and dtypes < set(checked) and dtypes <= set(_SHORT):
        parts.append(" or ".join(_SHORT[d] for d in sorted(dtypes, key=list(_SHORT).index)) + " input")
    elif dtypes and dtypes <= set(_LOW):
        parts.append(" or ".join(_LOW[d] for d in sorted(dtypes)) + " input")
    data = [split_regime(m.get("regime") or "")[1] for m in members]
    if all(any(r in d for r in LARGE_LOGIT_REGIMES) for d in data):
        parts.append("large logits")
    elif all("fp16_extreme" in d for d in data):
        parts.append("fp16 overflow")
    return ", ".join(parts) or trig


def site_text(site: dict | None) -> str:
    """``function (file:line)``, or ``""``."""
    if not site:
        return ""
    return f"{site.get('function')} ({site.get('file')}:{site.get('line')})"


def cited_text(site: dict | None, mark: str = "") -> str:
    """Where a (non-crash) site is cited (a maintainer's A): its faulty line(s) when the worker
    located them (``site["fault"]``, :mod:`rlconform.harness.core.fault_lines`: the spectrum's
    discriminating line, else the binding's declared anchor), as ``file:2000 in fn (file:1929)``; ``fn
    (file:def) — no single line; the function`` when the examples ran the same lines and nothing is
    declared; ``fn (file:def)`` for a site recorded without one (a report written before, a crash frame).
    ``mark``: the code mark around names (`````` in Markdown)."""
    if not site:
        return ""
    fn, file, line = site.get("function"), site.get("file"), site.get("line")
    own = f"{mark}{fn}{mark} ({file}:{line})"
    f = site.get("fault") if isinstance(site.get("fault"), dict) else None
    if f is None:
        return own
    lines = [n for n in (f.get("lines") or [f.get("line")]) if isinstance(n, int)]
    if not lines or lines == [line]:
        return own + " — no single line; the function"
    at = f"{file}:{lines[0]}" + "".join(f", :{n}" for n in lines[1:])
    return f"{mark}{at}{mark} in {own}"


#: the class of each kind of failure (see the module docstring)
CLASSES = {"mutation": "changes a tensor", "in-place on saved": "changes a tensor", "NaN": "NaN / inf",
           "inf": "NaN / inf", "implementations disagree": "wrong value", "inexact value": "rounding"}


def failure_class(finding: dict, kind_: str | None = None) -> str:
    """The class of a failing finding's kind (see the module docstring)."""
    k = kind_ or kind(finding)
    c = CLASSES.get(k, k)
    return c


def root_key(finding: dict) -> tuple[str, str]:
    """(where: ``module.qualname``, the engine module for rounding, or ``op <op>``; class) of a failing
    finding (see the module docstring)."""
    k = kind(finding)
    c = failure_class(finding, k)
    s = where(finding, k)
    if not s:
        return f"op {finding.get('op')}", c
    if c.startswith("rounding"):
        return str(s.get("module")), c
    if s.get("output_row"):  # one output of a function that computes several, wrong on a line of its own
        return f"{s.get('module')}.{s.get('function')}[{s['output_row']}]", c
    return f"{s.get('module')}.{s.get('function')}", c


def _fold(keys: dict, findings: dict) -> dict:
    """Re-key each finding whose engine function calls one that fails in the same class under the same
    trigger (see the module docstring); ``keys``: finding id -> root key; returns the new mapping."""
    from rlconform.harness.core.opinfo import split_regime

    keys = dict(keys)
    # the calls of each engine function, from the findings it is the function of: a finding folded into a
    # callee moves on with that callee's own calls (gae's NaN joined masked_whiten, which joins masked_mean's)
    calls_of: dict[str, tuple] = {}
    for f in findings.values():
        s = f.get("engine_function") or {}
        if s.get("calls"):
            calls_of.setdefault(f"{s.get('module')}.{s.get('function')}", (s.get("calls"), s.get("calls_variant")))
    for _ in range(4):  # a call chain deeper than four engine functions is not followed further
        triggers: dict[tuple, set] = {}
        variants: dict[tuple, set] = {}  # (key, trigger) -> the variants (of the callee's own op) failing so
        for fid, key in keys.items():
            triggers.setdefault(key, set()).add(trigger(findings[fid]))
            if _place(where(findings[fid])) == key[0]:  # the callee's own findings say which variants it fails in
                variants.setdefault((key, trigger(findings[fid])), set()).add(
                    split_regime(findings[fid].get("regime") or "")[0])
        moved = False
        for fid, (place, cls) in list(keys.items()):
            f = findings[fid]
            site = f.get("engine_function") or {}
            if cls.startswith("crash:"):
                continue  # a crash has its frame
            own = f"{site.get('module')}.{site.get('function')}" == place
            calls, mode = (site.get("calls"), site.get("calls_variant")) if own else calls_of.get(place, ((), None))
            # mode: the callee runs in this variant: it must fail in it
            for callee in calls or ():
                if mode and mode not in variants.get(((callee, cls), trigger(f)), ()):
                    continue
                if callee != place and trigger(f) in triggers.get((callee, cls), ()):
                    keys[fid] = (callee, cls)
                    moved = True
                    break
        if not moved:
            break
    return keys


def _join_partition(keys: dict, findings: dict) -> dict:
    """A ``wrong value`` under the trigger of a ``partition dependence`` (or ``masked-value dependence``) of
    the same place joins it (a trigger of the same partition counts as the same: ``a micro-batch with no valid
    token`` is a case of ``more than one micro-batch``, :func:`~rlconform.harness.core.triggers.partition_of`),
    and so does a wrong logged metric of a place whose metric depends on the
    partition, whatever its trigger (the function that folds shards' metrics: a mean of shard means is wrong
    on every uneven partition), and a rounding-sized ``partition_invariant`` failure of that function's
    metric (the same mean of means on a partition whose shards differ little) (see the module docstring)."""
    from rlconform.harness.core.triggers import partition_of
    from rlconform.harness.report.severity import is_metric

    parted: dict[str, dict] = {}  # place -> trigger -> the dependence class it shows under that trigger
    metric_parted: set = set()
    for fid, (place, cls) in keys.items():
        if cls in DEPENDENCE_KINDS:
            parted.setdefault(place, {}).setdefault(trigger(findings[fid]), cls)
            if cls == "partition dependence" and is_metric(findings[fid]):
                metric_parted.add(place)

    def joined(fid, place, cls):
        f = findings[fid]
        if cls == "wrong value":
            dep = parted.get(place, {}).get(trigger(f))
            part = partition_of(trigger(f))
            if dep is None and part:  # an empty micro-batch is one of several: the same partition's effect
                dep = next((d for t, d in parted.get(place, {}).items() if partition_of(t) == part), None)
            if dep is not None:
                return place, dep
            if place in metric_parted and is_metric(f):
                return place, "partition dependence"
        own = _place(where(f))  # a rounding-sized partition effect of that aggregator's metric: the same fold
        if cls == "rounding" and f.get("property") == "partition_invariant" and is_metric(f) and own in metric_parted:
            return own, "partition dependence"
        return place, cls

    return {fid: joined(fid, place, cls) for fid, (place, cls) in keys.items()}




def _fold_after_op(keys: dict, findings: dict) -> dict:
    """A ``changes a tensor`` seen *after another op's backward* (``vocab_parallel_sum_pi_squared`` run on
    logits that ``vocab_parallel_entropy``'s backward wrote into: "after vocab_parallel_entropy backward")
    is that op's mutation: it joins the ``changes a tensor`` defect of that op's findings located at a
    ``backward`` (``_VocabParallelEntropy.backward``), when the report holds one."""
    backward: dict[str, tuple] = {}
    for fid, (place, cls) in keys.items():
        if cls == "changes a tensor" and place.endswith(".backward"):
            backward.setdefault(findings[fid].get("op"), (place, cls))
    out = dict(keys)
    for fid, (place, cls) in keys.items():
        if cls != "changes a tensor":
            continue
        # a producer's backward that failed after another op's backward ran on the same tensor
        after = [c.by_op for c in F.clauses(findings[fid]) if c.kind == "mutation" and c.evidence == "saved"
                 and c.by_op and c.by_op != findings[fid].get("op")]
        if after and after[0] in backward:
            out[fid] = backward[after[0]]
    return out


def _fold_inplace_crash(keys: dict, findings: dict) -> dict:
    """A crash that is autograd's version check ("one of the variables needed for gradient computation has
    been modified by an inplace operation") at a function whose own ``changes a tensor`` defect the report
    holds is that write's effect, not a second cause: it joins it (verl's chunked vocab-parallel entropy:
    the backward of one chunk writes into the logits every chunk's view shares, so the next chunk's
    backward finds its saved view at a newer version — ``_VocabParallelEntropy.backward`` is one defect)."""
    changed = {place for place, cls in keys.values() if cls == "changes a tensor"}
    out = dict(keys)
    for fid, (place, cls) in keys.items():
        if cls.startswith("crash:") and place in changed and F.version_check_crash(findings[fid]):
            out[fid] = (place, "changes a tensor")
    return out


_GENERIC_TRIGGER = re.compile(r"^(?:any input|(?:bf16|fp16|fp32|fp64)(?: or (?:bf16|fp16|fp32|fp64))* input.*|"
                              r"large logits|(?:TP|CP|DP) > 1)$")


def _join_rounding(keys: dict, findings: dict) -> dict:
    """A rounding-sized failure of a function under a *specific* trigger (not ``any input``, a dtype or a
    layout) that the same function's ``wrong value`` or ``partition dependence`` defect also shows is that
    defect at a small magnitude, not its module's rounding: it joins it (verl's Dr. GRPO through
    ``grpo_vectorized`` divides a singleton's score by 1 + 1e-6 in float64 — rel err 1e-6 — and by σ
    elsewhere; the ignored ``norm_adv_by_std_in_grpo`` is one cause)."""
    shown: dict[tuple, set] = {}
    for fid, (place, cls) in keys.items():
        if cls == "wrong value" or cls in DEPENDENCE_KINDS:
            shown.setdefault(place, set()).add((cls, trigger(findings[fid])))
    out = dict(keys)
    for fid, (place, cls) in keys.items():
        if cls != "rounding":
            continue
        t, own = trigger(findings[fid]), _place(where(findings[fid]))
        if _GENERIC_TRIGGER.match(t):
            continue
        for c in ("wrong value", *DEPENDENCE_KINDS):
            if (c, t) in shown.get(own, ()):
                out[fid] = (own, c)
                break
    return out


#: the class suffix of a variant's failure seen only in dtypes the engine never calls the op with, split from a
#: defect of the same function and class that other variants show where the engine runs (:func:`_split_other_dtype`)
OTHER_DTYPE = " (only in another dtype)"


def _split_other_dtype(keys: dict, findings: dict) -> dict:
    """A variant of the op (its configuration, :func:`~rlconform.harness.core.opinfo.split_regime`) whose failures
    of a defect are all ``precision`` (a dtype the engine never calls the op with) while other variants of that
    defect fail more severely is another cause: it gets its own key, its class suffixed :data:`OTHER_DTYPE`
    (verl's plain GRPO through ``grpo_vectorized`` is off in float64 only, group_mean_std's float32 statistics
    with eps=0; Dr. GRPO's ignored flag fails in float32: two causes
    never share a card)."""
    from rlconform.harness.core.opinfo import split_regime

    def variant(fid: str) -> str:
        return split_regime(findings[fid].get("regime") or "")[0]

    severe: dict[tuple, set] = {}  # key -> variants with a member above precision
    members: dict[tuple, dict] = {}  # key -> variant -> its members
    for fid, key in keys.items():
        if key[1].startswith("crash:") or key[1] == "rounding":
            continue
        v = variant(fid)
        if findings[fid].get("severity") != "precision":
            severe.setdefault(key, set()).add(v)
        members.setdefault(key, {}).setdefault(v, []).append(fid)
    out = dict(keys)
    for key, by_variant in members.items():
        if not severe.get(key):
            continue
        for v, fids in by_variant.items():
            if v not in severe[key]:
                for fid in fids:
                    out[fid] = (key[0], key[1] + OTHER_DTYPE)
    return out


def folded_keys(failing: dict, everything: list[dict] | None = None) -> dict:
    """finding id -> the root key of the defect it belongs to (the table's, and the ledger's): its
    :func:`root_key`, folded into a callee that fails the same way, into another op's backward that
    changed the tensor, an in-place version-check crash into the write that caused it, and a wrong value
    into its place's partition dependence (see the module docstring); triggers read as
    :func:`read_layouts` reads them. ``failing``: finding id -> failing finding; ``everything``: every
    finding of the report (passing ones included), when at hand."""
    failing = read_layouts(failing, everything)
    keys = _fold({fid: root_key(f) for fid, f in failing.items()}, failing)
    keys = _fold_inplace_crash(_fold_after_op(keys, failing), failing)
    return _split_other_dtype(_join_rounding(_join_partition(keys, failing), failing), failing)


def _slug(text: str) -> str:
    text = text.lower().replace("-inf", "neg-inf").replace("−inf", "neg-inf").replace("≤", "le").replace(">", "gt")
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def defect_id(place: str, class_: str) -> str:
    """A stable id from the root key alone, e.g. ``verl.utils.torch_functional.masked_var.crash-valueerror``
    (the place keeps its dots; an op fallback reads ``op-entropy``)."""
    place = place.replace("op ", "op-", 1) if place.startswith("op ") else place
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', place)}.{_slug(class_)}"


def _size(finding: dict) -> tuple:
    return (len(finding.get("worst_input") or "") or 10**9, finding["id"])


def _jsonable(x: float):
    return x if math.isfinite(x) else str(x)  # "nan", "inf": equal to themselves, and plain JSON


def numbers(finding: dict) -> dict | None:
    """Engine vs exact value of the failing clause with the largest effect on training: a value or gradient before
    a logged metric, then by :func:`rlconform.harness.report.severity.clause_effect` (a NaN first, then the
    largest relative error; the first in the record among equals): ``{"engine", "exact", "clause", "component", "sides", "quantity"}``
    (``quantity``: ``value``, ``gradient`` or ``metric``) (a non-finite value as the string ``"nan"`` /
    ``"inf"`` / ``"-inf"``; ``component`` the output the clause is about: ``value``, ``gradient``, ``metric
    ppo_kl``; ``""`` when it names none), or None when the message has no such clause. For a partition /
    mask / implementations clause ``X vs Y (reference R)`` (B: what is compared is two runs of the engine,
    not the engine and the exact value) ``sides`` is ``[[label of X, X], [label of Y, Y]]`` (``TP=1``,
    ``TP=2``, ``2 micro-batches``…) and ``engine`` the one of X, Y farther from R, ``exact`` R; else
    ``sides`` is None."""
    from rlconform.harness.report.severity import clause_effect

    agreement = finding.get("property") == "implementations_agree"
    # what the optimiser sees before a logged metric (a wrong pg_clipfrac beside a wrong loss); equal effects to
    # 3 digits (a loss and its gradient both 2× off): the first in the record
    ranked = sorted(enumerate(F.numeric(finding)), key=lambda ic: (
        ic[1].quantity == "metric", -float(f"{clause_effect(ic[1], agreement):.3g}"), ic[0]))
    for _, c in ranked:  # the clause with the largest effect (a gradient 132 % off before a loss 0.06 % off)
        if c.kind == "value" and None not in (c.engine, c.exact):
            e, r, comp, sides = c.engine, c.exact, _component(c.label + ":"), None
        elif c.kind == "difference" and None not in (c.engine, c.other, c.exact):
            x, y, r = c.engine, c.other, c.exact
            e = x if not math.isfinite(x) or (math.isfinite(y) and abs(x - r) >= abs(y - r)) else y
            comp, left, right = _sides(c.label + " = ", " vs " + (f"{c.other_label} = " if c.other_label else ""),
                                       finding.get("property"))
            sides = [[left, _jsonable(x)], [right, _jsonable(y)]]
        elif c.kind == "nonfinite" and None not in (c.engine, c.exact):
            e, r, comp, sides = c.engine, c.exact, _component(c.label + ":"), None
        else:
            continue
        line = c.text or failure.render_clause(c)  # an older report's clause keeps its own line
        return {"engine": _jsonable(e), "exact": _jsonable(r), "clause": line.strip()[:300],
                "component": comp, "sides": sides, "quantity": c.quantity or ""}
    return None


def _fnum(text: str) -> float:
    return float(text)


def _component(head: str) -> str:
    """The output a value clause is about, from the text before its ``engine …``: ``gradient: engine`` ->
    ``gradient``; ``""`` when none."""
    text = head.strip().lstrip("-• ").rstrip(": ,").strip()
    named = list(_OUTPUT.finditer(text))
    if named:  # the output the clause is about, after any layout words ("mode …, shards (nnz) [[1]] gradient")
        return named[-1].group(0)
    return _short(text) if text else ""


_OUTPUT = re.compile(r"\b(?:gradient(?: w\.r\.t\. (?!the\b)\w+)?|value(?: \(rank \d+\))?|loss|metric [\w/.]+|advantages|returns|"
                     r"kept mask|[\w]+(?:/[\w.]+)+(?: \(\w+\))?)")


_LAYOUT = re.compile(r"\((?P<k>TP|CP|DP) = (?P<n>\d+)\)|\b(?P<k2>tp|cp|dp)(?P<n2>\d+)(?:cp(?P<c>\d+))?\b")
_MICRO = re.compile(r"micro-batches \(nnz\) \[(?P<n>[^\]]*)\]")


def _short(label: str) -> str:
    """A side's label in a few words: ``TP=2`` for ``value on TP rank 0 of tp2``, ``TP=1`` for
    ``unsharded (TP = 1)``, ``2 micro-batches`` for ``micro-batches (nnz) [3, 1]``; else its own words."""
    m = _LAYOUT.search(label)
    if m:
        if m["k"]:
            return f"{m['k']}={m['n']}"
        return f"{m['k2'].upper()}={m['n2']}" + (f", CP={m['c']}" if m["c"] else "")
    m = _MICRO.search(label)
    if m:
        return f"{len(m['n'].split(','))} micro-batches"
    text = label.strip(" ,:")
    if len(text) <= LABEL_WIDTH:
        return text
    # whole clauses of the label, never a word cut in two
    kept = text[:LABEL_WIDTH].rsplit(", ", 1)[0] if ", " in text[:LABEL_WIDTH] else text[:LABEL_WIDTH].rsplit(" ", 1)[0]
    return kept.rstrip(" ,:") + " …"


#: the longest side label a numbers cell shows (whole clauses of it, then "…")
LABEL_WIDTH = 60


def _sides(head: str, mid: str, prop: str | None) -> tuple[str, str, str]:
    """``(component, label of X, label of Y)`` of a clause ``HEAD = X vs MID = Y``: the words both labels
    share (the output compared) and what tells them apart (the layout, the masking, the implementation)."""
    left = re.sub(r"\s*=\s*$", "", head.strip())
    right = re.sub(r"^\s*vs\s*", "", re.sub(r"\s*=\s*$", "", mid.strip()))
    lw, rw = left.replace(",", " ,").split(), right.replace(",", " ,").split()
    comp: list[str] = []
    for a, b in zip(lw, rw):  # a shared head: "gradient, unsharded" / "gradient w.r.t. the vocab shards"
        if a != b:
            break
        comp.append(a)
    if comp:
        lrest, rrest = " ".join(lw[len(comp):]), " ".join(rw[len(comp):])
    else:  # a shared tail: "micro-batches (nnz) [2, 2]: metric ppo_kl" / "metric ppo_kl"
        k = 0
        while k < min(len(lw), len(rw)) and lw[-1 - k] == rw[-1 - k]:
            k += 1
        comp = lw[len(lw) - k:] if k else []
        lrest, rrest = " ".join(lw[:len(lw) - k]), " ".join(rw[:len(rw) - k])
    component = " ".join(comp).strip(" ,:").replace(" ,", ",")
    if component and component.split()[0] not in ("value", "gradient", "loss", "metric", "advantages", "returns") \
            and _LAYOUT.search(component):
        component = ""
    whole = {"mask_invariant": "unmasked", "implementations_agree": "other implementation"}.get(prop or "", "unpartitioned")
    lab_l, lab_r = _short(lrest.replace(" ,", ",")), _short(rrest.replace(" ,", ","))
    if prop == "mask_invariant":  # the base run is the example as drawn: garbage only in the other
        lab_r = whole
    return (re.sub(r"\s*w\.r\.t\..*$", "", component) or "", lab_l or whole, lab_r or whole)


def _badness(e: float, r: float) -> float:
    if not math.isfinite(e) and math.isfinite(r):
        return math.inf
    if not (math.isfinite(e) and math.isfinite(r)):
        return 0.0
    return abs(e - r) / max(abs(r), 1e-300)


def _place(s: dict | None) -> str:
    return f"{s.get('module')}.{s.get('function')}" if s else ""


def _plain(s: dict | None) -> dict | None:
    """A site without its ``calls`` (the defect names where it is, the findings keep what it calls)."""
    return {k: v for k, v in s.items() if k != "calls"} if s else s


def _reachable(finding: dict, engine_dtypes: dict) -> bool:
    used = (engine_dtypes or {}).get(finding.get("op"))
    return not used or not finding.get("dtype") or finding["dtype"] in used


#: triggers of a trainer's ordinary run: every input (a dtype, a layout, the backward pass) — no edge input
_ANY_INPUT = re.compile(r"^(?:any input|a backward pass|(?:bf16|fp16|fp32|fp64)(?: or (?:bf16|fp16|fp32|fp64))* "
                        r"input|(?:TP|CP|DP) > 1)$")
#: triggers met on every step: the micro-batches and DP ranks a step runs with
_DEFAULT_PATH = re.compile(r"^more than one (?:micro-batch|DP rank)$")
#: a trigger that is a configuration (``norm_adv_by_std_in_grpo=False (Dr. GRPO), …``): how a report without
#: ``engine.variant_triggers`` (written before they were recorded) still knows a binding's configuration words
_CONFIG_TRIGGER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*=[^=\s]")
#: reachability levels, most reachable first (:func:`reach`)
REACH = {3: "every step of a configuration", 2: "any input", 1: "an edge input", 0: "contrived"}


def reach(finding: dict, engine_dtypes: dict | None = None, config_triggers=()) -> int:
    """How reachable a failing finding is from a trainer's run, for ranking within a severity:
    0 (``contrived``) in a dtype the engine never calls the op with (``engine_dtypes``) or on an extreme
    regime (:func:`rlconform.harness.core.regimes.extreme`); else 3 (``every step of a configuration``: not the trainer's defaults, but every step once the
    configuration is chosen) when its
    trigger is a configuration the binding names (``config_triggers``: ``Binding.variant_triggers``' words,
    verl's Dr. GRPO through ``grpo_vectorized``; in a report without them, a trigger that reads ``key=value``) or the micro-batches / DP ranks every step runs with (verl's
    geo_mean, scaled by the number of micro-batches); 2 (``any input``) when it fails on any input (in a
    dtype, a layout, the backward pass); 1 (``an edge input``) otherwise (a row with no valid token, a group
    of one sample, a −inf logit, a masked NaN)."""
    from rlconform.harness.core.regimes import realistic

    if not _reachable(finding, engine_dtypes) or not realistic(finding.get("regime") or ""):
        return 0
    t = trigger(finding)
    if t in set(config_triggers) or _DEFAULT_PATH.match(t) or _CONFIG_TRIGGER.match(t):
        return 3
    return 2 if _ANY_INPUT.match(t) else 1


def config_triggers(doc: dict) -> set:
    """The configuration triggers a report's binding names (``engine.variant_triggers``: op -> variant -> words)."""
    return {w for v in ((doc.get("engine") or {}).get("variant_triggers") or {}).values() for w in (v or {}).values()}




def change_text(finding: dict) -> str:
    """What a changed-tensor finding's first ``mutation`` clause records: ``version 0 → 3``, how many elements
    changed and one of them (``""``: neither)."""
    for c in F.clauses(finding):
        if c.kind != "mutation" or not (c.versions or c.changed):
            continue
        parts = [f"version {c.versions[0]} → {c.versions[1]}"] if c.versions else []
        if c.changed:
            parts.append(f"{c.changed} element(s) changed, e.g. {c.other!r} → {c.engine!r}")
        return "; ".join(parts)
    return ""


def defects(findings: list[dict], engine_dtypes: dict | None = None, configs=()) -> list[dict]:
    """Group the failing findings (those with a severity; an ``unavailable`` op's are not) into defects by root
    key, most severe first, then most reachable (:func:`reach`; ``engine_dtypes``: op -> the dtypes the engine
    calls it with; ``configs``: the binding's configuration triggers), then by the size of the effect."""
    # an unavailable op is one entry of the report's unavailable list (its cause), not a defect of the engine
    failing = {f["id"]: f for f in findings if f.get("severity") and f.get("status") != "unavailable"}
    keys = folded_keys(failing, findings)
    failing = read_layouts(failing, findings)
    ran: dict[tuple, set] = {}
    for f in findings:
        if f.get("status") not in ("unavailable", "skipped") and f.get("dtype"):
            ran.setdefault((f.get("op"), f.get("property")), set()).add(f["dtype"])
    groups: dict[tuple, list[dict]] = {}
    for fid, f in failing.items():
        groups.setdefault(keys[fid], []).append(f)
    out = []
    for (place, cls), members in groups.items():
        sev = min((m["severity"] for m in members), key=lambda s: (RANK.get(s, 9), SEVERITIES.index(s) if s in SEVERITIES else 9))
        top = [m for m in members if m["severity"] == sev]
        level = max(reach(m, engine_dtypes, configs) for m in top)
        # the effect where it is reached: a contrived member's larger error does not rank a defect
        size = max(effect(m) for m in top if reach(m, engine_dtypes, configs) == level)
        # the reproducer: a member of an op whose metric keys the engine emits (not a probe's keys named by the
        # binding: a verl maintainer does not log actor/response_length/mean through Metric.aggregate_dp), then
        # the smallest input among the most severe and most reachable members, one with numbers to show first
        # (a crash row shows the exception, not the numbers a member's other clauses report)
        shown = min(top, key=lambda m: (_probe_keys(m) and not _names_emitted_key(m), -reach(m, engine_dtypes, configs),
                                        not cls.startswith("crash:") and numbers(m) is None, _size(m)))
        k = kind(shown)
        rep = shown.get("reproducer") or {}
        crash = k.startswith("crash:")
        sites = [where(m) for m in members]
        native = [m for m in top if _place(where(m)) == place] or top  # the function the defect is located at
        # a crash is located at an entry point its non_destructive members do not relocate to a backward
        located = min(native, key=lambda m: (crash and m.get("property") == "non_destructive", _size(m)))
        trig = trigger(shown, k)
        if cls == "changes a tensor":  # the dtype decides a copy or an alias: those the check ran and passed in count
            nd = [m for m in members if m.get("property") == "non_destructive"]
            checked = set().union(*(ran.get((m["op"], m["property"]), set()) for m in nd))
            trig = _phase(narrowest(trig, nd or members, checked), nd)
        else:  # what the members of the row's severity share (an fp16 member gated to precision is not one)
            trig = narrowest(trig, top)
        site_ = _plain(located.get("engine_function") if crash else where(located, k))
        frame_ = shown.get("crash_frame") if crash else None
        out.append({
            "id": defect_id(place, cls),
            "severity": sev, "effect": size,
            "engine_function": site_,
            "crash_frame": frame_,
            "upstream": upstream(site_, frame_),
            "trigger": trig,
            "triggers": sorted({trigger(m) for m in members}),
            "functions": sorted({site_text(s) for s in sites if s}),
            "op": shown["op"], "ops": sorted({m["op"] for m in members}),
            "property": shown["property"], "properties": sorted({m["property"] for m in members}),
            "signature": {"kind": cls, "feature": trig},
            "members": sorted(m["id"] for m in members),
            "dtypes": sorted({m.get("dtype") for m in members if m.get("dtype")}),
            "regimes": sorted({m.get("regime") for m in members if m.get("regime")}),
            "reachable": any(_reachable(m, engine_dtypes) for m in top),
            "reach": level, "reach_text": REACH[level],
            "numbers": None if crash else numbers(shown),
            "reproducer": {"finding": shown["id"], "case_file": rep.get("case_file"), "command": rep.get("command"),
                           "input": shown.get("worst_input")},
            "variant": variant_of(shown),
            "message": F.quote(shown)[:300],
            "raised": F.raised(shown, cls.split(":", 1)[1])[:160] if crash else "",
            "lost": next(iter(F.texts(shown, "problem", "metric")), "")[:160] if cls == "missing output" else "",
            "change": change_text(shown) if cls == "changes a tensor" else "",
        })
    # severity in SEVERITIES order (training before destructive: --fail-on's RANK ties them, the table does not),
    # then reachability, then the size of the effect where reached, then the number of findings
    out.sort(key=lambda d: (SEVERITIES.index(d["severity"]), -d["reach"], -d["effect"], not d["reachable"],
                            -len(d["members"]), d["id"]))
    return out


def variant_of(finding: dict) -> dict | None:
    """``{"name", "parameters"}``: the variant of a finding and its parameters in words, as the catalog
    describes them (:attr:`~rlconform.harness.core.opinfo.OpInfo.variant_parameters`); None for a finding of
    an op without them."""
    from rlconform.harness.catalog.ops import OPS
    from rlconform.harness.core.opinfo import split_regime

    op = OPS.get(finding.get("op")) if isinstance(finding.get("op"), str) else None
    variant = split_regime(str(finding.get("regime") or ""))[0]
    words = op.variant_parameters.get(variant) if op is not None and variant else None
    return {"name": variant, "parameters": words} if words else None


def impact_knob(defect: dict, knobs: dict) -> dict | None:
    """The configuration key a ``training`` defect's impact depends on (the binding's ``impact_knobs`` of every
    op of its members, when they name one key), or None: ``{"knob", "default", "otherwise", "why"}``."""
    if defect.get("severity") != "training" or not isinstance(knobs, dict):
        return None
    found = [knobs.get(op) for op in defect.get("ops") or [defect.get("op")]]
    if not found or not all(isinstance(k, dict) and k.get("knob") for k in found):
        return None
    if len({k["knob"] for k in found}) != 1:
        return None
    return {f: str(found[0].get(f) or "") for f in ("knob", "default", "otherwise", "why")}


def _probe_keys(finding: dict) -> bool:
    """Whether the finding's op names its own metric keys (:attr:`~rlconform.harness.core.opinfo.OpInfo.probe_metric_keys`)."""
    from rlconform.harness.catalog.ops import OPS

    op = OPS.get(finding.get("op") or "")
    return bool(op is not None and op.probe_metric_keys)


def _names_emitted_key(finding: dict) -> bool:
    """Whether the finding's record names a key the engine's own code emitted and lost (a ``metric`` clause's
    ``key``: printed instead of logged, or never reaching the final dict): a probe's finding that shows the
    engine's key, not one the binding made up (SkyRL's reduce_metrics dropping
    ``minibatch_rollout_logprobs_abs_diff_max``, not ``policy/token_sum_loss (sum)``)."""
    return any(c.kind == "metric" and c.key for c in F.clauses(finding))


def _phase(trig: str, members: list[dict]) -> str:
    """A changed-tensor defect's trigger with the pass it happens in, when every ``non_destructive`` member
    shows the change in the backward only ("mutated during backward", "after the backward, a producer …
    could not backprop"): ``any input`` reads ``a backward pass``, another trigger gets ``, in the backward``."""
    phases = [[c.phase for c in F.clauses(m) if c.kind == "mutation"] for m in members]
    if not phases or any("forward" in p for p in phases) or not all(p and all(x == "backward" for x in p)
                                                                   for p in phases):
        return trig
    return "a backward pass" if trig == "any input" else f"{trig}, in the backward"


def _distribution(top: str) -> str:
    """The distribution that installs the top-level package ``top`` (``megatron`` -> ``megatron-core``),
    else ``top``."""
    try:
        from importlib.metadata import packages_distributions

        names = packages_distributions().get(top) or []
    except Exception:  # noqa: BLE001 - no metadata: the package name
        names = []
    return names[0] if names else top


def upstream(site: dict | None, frame: dict | None) -> str | None:
    """The distribution holding the deepest engine frame of a defect — its crash frame, or the ``via`` frame a
    mutation happens in — when that is another package than the engine function's (verl's
    ``vocab_parallel_log_probs_from_logits`` writing through Megatron-core's
    ``calculate_predicted_logits``: ``megatron-core``): the fix belongs upstream. None otherwise."""
    deep = frame or (site or {}).get("via")
    if not deep or not site:
        return None
    top, own = str(deep.get("module") or "").split(".")[0], str(site.get("module") or "").split(".")[0]
    return _distribution(top) if top and own and top != own else None


def annotate(doc: dict) -> dict:
    """Add severities, ``defects`` and ``triage`` counts to a report document, in place; returns it.
    Idempotent (recomputed from the findings each time); a report written before these fields (no
    ``engine_function`` / ``trigger`` / ``engine_dtypes``) is triaged with the fallbacks of the module
    docstring."""
    from rlconform.harness.core.declared import covering_write
    from rlconform.harness.report.config_reach import alternatives
    from rlconform.harness.report.remedies import remedy

    dtypes = (doc.get("engine") or {}).get("engine_dtypes") or {}
    declared = (doc.get("engine") or {}).get("declared") or []
    for f in doc.get("findings", []):
        sev, reason = classify(f, dtypes)
        write = covering_write(declared, f, F.clauses(f)) if sev is not None else None
        f.pop("declared_write", None)
        if write is not None:  # the engine's declared write, checked as declared: listed there, no defect
            sev, f["declared_write"] = None, write["name"]
        if sev is None:
            f.pop("severity", None)
            f.pop("severity_reason", None)
        else:
            f["severity"], f["severity_reason"] = sev, reason
    doc["defects"] = defects(doc.get("findings", []), dtypes, config_triggers(doc))
    knobs = (doc.get("engine") or {}).get("impact_knobs") or {}
    table = (doc.get("engine") or {}).get("remedies") or {}
    configs = (doc.get("engine") or {}).get("configs") or None
    by_id = {f["id"]: f for f in doc.get("findings", [])}
    changed = (doc.get("engine") or {}).get("changed_since") or None
    for d in doc["defects"]:
        d["remedy"] = remedy(d, table, changed)
        alts = alternatives(d, by_id, configs)
        d["reached_by"] = None if alts is None else [[list(c) for c in alt] for alt in alts]
        depends = impact_knob(d, knobs)
        if depends:
            d["depends_on"] = depends
    doc["triage"] = severity_counts(doc["defects"])
    return doc


def severity_counts(rows: list[dict]) -> dict:
    """``{"defects": {severity: n}, "findings": {severity: n}}`` of the defect ``rows``: a defect counts
    under its severity (its most severe member's) with all its member findings, as its table row shows
    them, so that report.json's ``triage`` and report.md's header are this one computation and add up to
    the table (an unavailable op's findings, no defect, are not counted)."""
    counts_d = {s: 0 for s in SEVERITIES}
    counts_f = {s: 0 for s in SEVERITIES}
    for d in rows:
        counts_d[d["severity"]] += 1
        counts_f[d["severity"]] += len(d.get("members") or ())
    return {"defects": counts_d, "findings": counts_f}

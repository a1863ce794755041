"""One finding's record: its examples, worst errors, failing (shrunk) case, status and report entry.

Used by the pytest plugin (:mod:`rlconform.harness.run.pytest_plugin`): a :class:`FindingRecorder` lives in
the process that runs the engine and is fed by :func:`rlconform.properties.runner.run_finding`;
:func:`classify` turns the test's exception into a status; :func:`finding_entry` builds the
``report.json`` finding (schema in :mod:`rlconform.harness.report.writer`); :func:`dead_process_entry` builds
the ``crash`` finding of a worker that died, from what the controller could learn about it.

Status of a failed test, by the exceptions in it (groups walked):

* ``discrepancy`` — a :class:`~rlconform.properties.checks.PropertyFailure` is among them;
* ``crash`` — the engine's doing: :class:`~rlconform.properties.checks.EngineCrash` (it raised, or left
  torch's global state changed), :class:`~rlconform.properties.runner.CheckRaised` (its output broke
  the check), :class:`~rlconform.properties.runner.EngineAbort` (it raised ``KeyboardInterrupt`` / ``SystemExit``),
  :class:`FindingStateChanged`;
* ``error`` — anything else: a harness-side problem (corrupt corpus file, strategy, hypothesis health
  check), never reported as the engine's crash.
"""

from __future__ import annotations

import math
import os
import traceback

from rlconform.harness.core.input_scale import leading_scale
from rlconform.harness.report.case_paths import relative
from rlconform.properties.corpus import write_atomic
from rlconform.properties.runner import EngineAbort, replay_command  # noqa: F401 (EngineAbort: re-exported)

#: exception class names that are the engine's doing (checked by name: no import of every module)
_CRASH_TYPES = ("EngineCrash", "CheckRaised", "EngineAbort", "FindingStateChanged", "RankFailure")


class FindingStateChanged(Exception):
    """Torch's global state changed during a finding outside any single engine call (the engine's
    backward, or its import); restored afterwards."""

    def __init__(self, changes: list[str]):
        self.changes = list(changes)
        super().__init__("torch's global state changed during this finding and was not restored by the "
                         "engine (in its backward or when its module was imported): " + "; ".join(changes)
                         + " (the harness restored it)")


def shard_imbalance(case) -> float | None:
    """max shard nnz / max(1, min shard nnz) over the leaf shards (micro-batches) of each partition of a
    pipeline case, worst partition of the example; None for ops without partitions."""
    inputs = case.inputs if isinstance(case.inputs, dict) else {}
    partitions, mask = inputs.get("partitions"), inputs.get("mask")
    if partitions is None or mask is None:
        return None
    from rlconform.harness.families.agg_loss import partition_rows

    worst = None
    for p in partitions:
        nnz = [int(mask[a:b].sum()) for a, b in partition_rows(p)]
        if nnz:
            r = max(nnz) / max(1, min(nnz))
            worst = r if worst is None else max(worst, r)
    return worst


class SampleReservoir:
    """A bounded sample of per-example points ``{"imbalance", "abs_err", "rel_err", "ratio", "ok"}`` of a
    partition op (``report.json`` finding field ``samples``; ``report.html`` plots error against shard
    imbalance). Failing examples are kept first (up to half the cap), passing ones by reservoir
    sampling with a fixed seed. ``ratio`` is error / tolerance, None where it is infinite."""

    CAP = 50

    def __init__(self, cap: int = CAP):
        import random

        self.cap = cap
        self.fails: list[dict] = []
        self.passes: list[dict] = []
        self.seen_passes = 0
        self._rng = random.Random(0)

    def offer(self, case, outcome) -> None:
        if case.property not in ("matches_reference", "partition_invariant"):  # no error to plot
            return
        imb = shard_imbalance(case)
        if imb is None:
            return
        ratio = float(outcome.ratio)
        point = {"imbalance": imb, "abs_err": float(outcome.max_abs_err), "rel_err": float(outcome.max_rel_err),
                 "ratio": ratio if math.isfinite(ratio) else None, "ok": outcome.verdict != "discrepancy"}
        if not point["ok"]:  # shrinking replays many near-identical failures: keep distinct ones
            if len(self.fails) < self.cap // 2 and point not in self.fails:
                self.fails.append(point)
            return
        self.seen_passes += 1
        room = self.cap - len(self.fails)
        if len(self.passes) < room:
            self.passes.append(point)
        else:
            j = self._rng.randrange(self.seen_passes)
            if j < room:
                self.passes[j] = point

    def as_list(self) -> list[dict] | None:
        return (self.fails + self.passes[: self.cap - len(self.fails)]) or None


class FindingRecorder:
    """Collects the examples of one finding: counts, worst errors, and the failing (shrunk) case.

    ``state`` needs ``binding`` (spec, path), ``out`` (the report folder) and ``inflight`` (an
    :class:`~rlconform.harness.run.inflight.InflightWriter` or None)."""

    def __init__(self, state, case_id: str):
        self.state = state
        self.id = case_id
        self.examples = 0
        self.max_abs_err = 0.0
        self.max_rel_err = 0.0
        self.tolerance = None
        self.current = None
        self.failing = None
        self.first_failure_at = None  # examples run until the first failing one (before shrinking)
        self.shrink_steps = 0
        self._best_ratio = -1.0
        self.message = ""
        self.clauses: list = []  # the failing example's failure, as data (core.failure); ``message`` renders it
        self.marginal_clauses: list = []
        self.crash: dict | None = None  # the engine's exception: {"type", "where"}
        self.note = ""  # shown with a passing finding (e.g. torch state an import changed, restored)
        self.unavailable_detail = None
        self.unbound = None  # {"op", "status", "missing"} of an op that did not bind (core.unbound)
        self.needs = None  # the device an unavailable op needs ("cuda" on a CPU run), else None
        self.binding_error = None
        self.adapter_error = None  # the binding's adapter raised (status binding_error)
        self.transcribed = None  # the op's part that is a transcription of the engine's code
        self.max_ratio = 0.0  # worst error / tolerance seen (see tolerance.verdict: the margin band)
        self.marginal_message = ""  # the worst marginal example's message (a finding that ends marginal)
        self._marginal_ratio = -1.0
        self.marginal_case = None  # the worst marginal example (its reproducer)
        self.samples = SampleReservoir()
        self.declared: dict[str, int] = {}  # declared guard / precondition name -> examples it covered

    def start(self, case) -> None:
        """A new call of the check: counted as an example until the first failure, after that as a
        shrinking step (hypothesis replays variants of the failing input). The case is written to the
        in-flight record first, so that a death of the process names it."""
        self.current = case
        if self.first_failure_at is None:
            self.examples += 1
        else:
            self.shrink_steps += 1
        inflight = getattr(self.state, "inflight", None)
        if inflight is not None:
            meta = {"id": self.id, "examples": self.examples, "shrink_steps": self.shrink_steps}
            try:
                inflight.example(case, meta)
            except (TypeError, ValueError, OverflowError):  # an input the record cannot hold: no reproducer then
                inflight.begin(self.id)

    def crashed(self) -> None:
        """The engine raised on the current case: it is now the failing case, and an earlier discrepancy's
        message no longer describes it (the report takes the crash's own message)."""
        self.failing = self.current
        self.message = ""
        self.clauses = []
        if self.first_failure_at is None:
            self.first_failure_at = self.examples

    def observe(self, outcome) -> None:
        name = getattr(outcome, "declared", None)
        if name:
            self.declared[name] = self.declared.get(name, 0) + 1
        self.max_abs_err = max(self.max_abs_err, outcome.max_abs_err)
        self.max_rel_err = max(self.max_rel_err, outcome.max_rel_err)
        self.max_ratio = max(self.max_ratio, outcome.ratio)
        if self.current is not None:
            self.samples.offer(self.current, outcome)
        verdict = outcome.verdict
        if verdict == "marginal" and outcome.ratio >= self._marginal_ratio:
            self._marginal_ratio = outcome.ratio
            self.marginal_case = self.current
            self.marginal_clauses = list(getattr(outcome, "clauses", ()) or ())
            self.marginal_message = outcome.message or (
                f"worst example at {outcome.ratio:.3g}× its tolerance {outcome.tolerance:.3g} "
                f"(abs err {outcome.max_abs_err:.3g}, rel err {outcome.max_rel_err:.3g})")
            if self.failing is None:
                self.tolerance = outcome.tolerance or self.tolerance
        if verdict == "discrepancy":  # the tolerance reported is the one the (last, shrunk) failure exceeded
            self.failing = self.current
            self.message = outcome.message
            self.clauses = list(getattr(outcome, "clauses", ()) or ())
            self.tolerance = outcome.tolerance or self.tolerance
            if self.first_failure_at is None:
                self.first_failure_at = self.examples
        elif self.failing is None and self._marginal_ratio < 0 and outcome.tolerance and outcome.ratio >= self._best_ratio:
            self._best_ratio, self.tolerance = outcome.ratio, outcome.tolerance

    def save_reproducer(self) -> dict | None:
        case = self.failing or self.marginal_case or self.current
        if case is None:
            return None
        return save_reproducer(self.state.out, self.id, case, self.state.binding.spec, self.state.binding.path)


def save_reproducer(out: str, fid: str, case, spec: str | None, engine_path: str | None) -> dict:
    """Write ``out/cases/<fid>.json`` (atomically) and return ``{"case_file", "command"}``: ``case_file``
    relative to the report folder ``out`` (``cases/<fid>.json``: a committed report carries no path of the
    machine that made it; readers resolve it with :func:`rlconform.harness.report.case_paths.resolve`),
    ``command`` the replay command from the current directory. The case's ``engine`` field is a note;
    ``replay`` takes the engine from its command line."""
    path = os.path.join(out, "cases", f"{fid}.json")
    doc = case.to_json()
    doc["engine"] = {"spec": spec, "path": engine_path}
    import json

    text = json.dumps(doc)
    write_atomic(path, text)
    # "_case_text": the controller keeps it and writes cases/ from it at the end of the run;
    # popped before the finding is recorded
    return {"case_file": relative(out, path), "command": replay_command(os.path.relpath(path), spec, engine_path),
            "_case_text": text}


def classify(exc: BaseException | None) -> str:
    """``discrepancy``, ``crash`` or ``error`` for the exception of a failed test (see module doc)."""
    from rlconform.properties.checks import PropertyFailure

    pending, found = [exc], set()
    while pending:
        e = pending.pop()
        if e is None:
            continue
        if isinstance(e, PropertyFailure):
            found.add("discrepancy")
        elif isinstance(e, BaseExceptionGroup):
            pending.extend(e.exceptions)
        elif type(e).__name__ in _CRASH_TYPES or any(c.__name__ in _CRASH_TYPES for c in type(e).__mro__):
            found.add("crash")
        else:
            found.add("error")
    for status in ("discrepancy", "crash", "error"):
        if status in found:
            return status
    return "error"


def crash_message(exc: BaseException) -> str:
    """The engine's own error when it is inside (possibly grouped, possibly flaky) hypothesis errors."""
    pending = [exc]
    while pending:
        e = pending.pop(0)
        if type(e).__name__ in _CRASH_TYPES:
            flaky = " (it did not fail again when hypothesis replayed the case)" if exc is not e and \
                type(exc).__name__ == "FlakyFailure" else ""
            return f"{e}{flaky}"[:4000]
        if isinstance(e, BaseExceptionGroup):
            pending.extend(e.exceptions)
    return f"{type(exc).__name__}: {exc}"[:4000]


def error_message(exc: BaseException) -> str:
    from rlconform.properties.referee import REFEREE_ERROR

    if str(exc).startswith(REFEREE_ERROR):  # already says whose error it is (the referee could not judge)
        return str(exc)[:4000]
    text = f"{type(exc).__name__}: {exc}".strip()
    return ("the harness could not check this finding (not the engine's fault): " + text)[:4000]


def finding_entry(rec: FindingRecorder, params: tuple, status: str, tb: str | None, reproducer: dict | None) -> dict:
    op, prop, dtype, regime = params
    failing = status in ("discrepancy", "crash", "xfail", "marginal")
    # a marginal finding (or a listed one: xfail) shows its worst example in the band
    case = rec.failing or (rec.marginal_case if status in ("marginal", "xfail") else None) or rec.current
    entry = _finding_entry(rec, params, status, tb, reproducer, failing, case)
    return _with_profiles(entry)


def _with_profiles(entry: dict) -> dict:
    """``entry`` with ``profiles`` (the profiles that add its regime) when its regime is profile-only."""
    from rlconform.harness.core.profiles import profile_only

    profiles = profile_only(entry["regime"])
    if profiles:
        entry["profiles"] = list(profiles)
    return entry


def _finding_entry(rec, params, status, tb, reproducer, failing, case) -> dict:
    op, prop, dtype, regime = params
    return {
        "id": rec.id, "op": op, "property": prop, "dtype": dtype, "regime": regime, "status": status,
        "examples": rec.examples,
        "examples_to_first_failure": rec.first_failure_at,
        "shrink_steps": rec.shrink_steps,
        "max_abs_err": rec.max_abs_err, "max_rel_err": rec.max_rel_err,
        "tolerance": rec.tolerance, "message": rec.unavailable_detail or rec.message or rec.note,
        "worst_input": case.summary() if failing and case else None,
        "input_scale": leading_scale(case.inputs) if failing and case else None,
        "reproducer": reproducer, "traceback": tb,
        "binding_error": rec.binding_error,
        "max_ratio": rec.max_ratio if math.isfinite(rec.max_ratio) else None,
        "samples": rec.samples.as_list(),
        **({"failure": _failure_fields(rec, status)} if failing else {}),
        **({"declared": dict(rec.declared)} if rec.declared else {}),
        **({"needs": rec.needs} if getattr(rec, "needs", None) else {}),
        **({"transcribed": rec.transcribed} if rec.transcribed else {}),
        **({"unbound": rec.unbound} if getattr(rec, "unbound", None) else {}),
    }


def _failure_fields(rec, status: str) -> dict:
    """The finding's ``failure`` record (:mod:`rlconform.harness.core.failure`): the clauses of the example its
    ``message`` describes, and the engine's exception of a crash."""
    from rlconform.harness.core import failure

    clauses = rec.marginal_clauses if status == "marginal" else rec.clauses
    out: dict = {"clauses": failure.clauses_to_json(clauses) if clauses else [], "version": failure.RECORD_VERSION}
    if status == "crash" and rec.crash:
        out["crash"] = dict(rec.crash)
    return out


def _first_line(exc: BaseException | None) -> str:
    text = str(exc) if exc is not None else ""
    return (text.strip().splitlines() or [""])[0][:500]


def crash_of(exc: BaseException | None) -> dict | None:
    """``{"type": the engine's exception type, "where": the engine call that raised, "text": the first line of
    the engine's own exception text}`` of a crash (inside hypothesis's exception groups, an EngineCrash's cause),
    or None when there is no engine exception."""
    pending = [exc]
    while pending:
        e = pending.pop(0)
        if e is None:
            continue
        if type(e).__name__ == "EngineCrash":
            cause = e.__cause__
            return {"type": type(cause).__name__ if cause is not None else "Exception",
                    "where": str(getattr(e, "where", "") or ""), "text": _first_line(cause)}
        if isinstance(e, BaseExceptionGroup):
            pending.extend(e.exceptions)
        elif type(e).__name__ in _CRASH_TYPES or any(c.__name__ in _CRASH_TYPES for c in type(e).__mro__):
            cause = e.__cause__
            return {"type": type(cause).__name__ if cause is not None else type(e).__name__, "where": "",
                    "text": _first_line(cause if cause is not None else e)}
    return None


def format_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))[-30000:]


def dead_process_entry(fid: str, description: str, fault_text: str, inflight, out: str,
                       spec: str | None, engine_path: str | None) -> dict:
    """The finding of a worker that died while running ``fid``: observed ``crash`` (the ledger is applied by
    :func:`rlconform.harness.run.status.decide`), with
    how the process ended, its Python stack (faulthandler) and, when the example in flight is known, a
    reproducer."""
    case = inflight.case if inflight is not None and inflight.finding_id == fid else None
    meta = inflight.meta if inflight is not None and inflight.finding_id == fid else {}
    examples = int(meta.get("examples") or 0)
    where = (f"at example {examples}" + (f" (shrink step {meta['shrink_steps']})" if meta.get("shrink_steps") else "")
             if case is not None else "before its first example (importing or resolving the op)")
    message = f"{description}, {where} of this finding"
    if case is None and inflight is not None and inflight.problem and inflight.finding_id == fid:
        message += f"; no reproducer: {inflight.problem}"
    reproducer = save_reproducer(out, fid, case, spec, engine_path) if case is not None else None
    return _crash_entry(fid, message, examples=examples, shrink_steps=int(meta.get("shrink_steps") or 0),
                        worst_input=case.summary() if case is not None else None, reproducer=reproducer,
                        stack=fault_text.strip() or None)


def missing_record_entry(fid: str, other_ids: list) -> dict:
    """The finding of a test whose engine process finished it without sending its record (none, or only
    records under other ids, ``other_ids``): observed ``crash``, since nothing of it reached the referee or
    the report. The status is decided by :func:`rlconform.harness.run.status.decide`."""
    told = (f"; it sent a record under another id instead ({', '.join(repr(str(x)[:120]) for x in other_ids[:3])})"
            if other_ids else "")
    return _crash_entry(fid, "the engine's process finished this finding's test without its record: it never "
                             f"reached the referee{told}")


def _crash_entry(fid: str, message: str, *, examples: int = 0, shrink_steps: int = 0, worst_input=None,
                 reproducer=None, stack=None) -> dict:
    """A finding the controller writes itself for ``fid``, observed ``crash`` (no worker record to take it from)."""
    from rlconform.harness.core.failure import crash_record

    op, prop, dtype, regime = fid.split(".")
    return _with_profiles({
        "failure": crash_record("exception", "the engine's process", message),
        "id": fid, "op": op, "property": prop, "dtype": dtype, "regime": regime, "observed": "crash",
        "examples": examples, "examples_to_first_failure": examples or None, "shrink_steps": shrink_steps,
        "max_abs_err": 0.0, "max_rel_err": 0.0, "tolerance": None, "message": message,
        "worst_input": worst_input, "reproducer": reproducer, "traceback": stack, "binding_error": None,
        "max_ratio": None, "samples": None,
    })

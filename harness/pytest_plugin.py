"""pytest plugin: parametrizes the generic property tests over a binding and writes the report.

Loaded by ``rlconform check`` (``-p rlconform.harness.pytest_plugin``); usable directly::

    pytest -p rlconform.harness.pytest_plugin --rlconform-engine verl --pyargs rlconform.properties

Every test id is a finding id (``op.property.dtype.regime``). After each test the finding is added to
``report.json`` (rewritten atomically), so an interrupted run keeps what it found. Works under
pytest-xdist (``-n``): workers send findings through ``user_properties``; the controller writes.
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback

import pytest

from rlconform.harness.binding import BindingError

STATE_KEY = "_rlconform_state"


def pytest_addoption(parser):
    g = parser.getgroup("rlconform")
    g.addoption("--rlconform-engine", default=None, help="engine spec (reference, verl, mutants.<f>, module:attr, file.py)")
    g.addoption("--rlconform-engine-path", default=None, help="a fork's checkout, put first on sys.path")
    g.addoption("--rlconform-out", default="rlconform-report", help="report directory")
    g.addoption("--rlconform-profile", default="ci", help="hypothesis profile: dev | ci | nightly")
    g.addoption("--rlconform-max-examples", type=int, default=None)
    g.addoption("--rlconform-seed", type=int, default=None)
    g.addoption("--rlconform-xfails", default=None, help="ledger of known discrepancies (finding ids)")
    g.addoption("--rlconform-op", action="append", default=[], help="only these ops (repeatable)")
    g.addoption("--rlconform-property", action="append", default=[], help="only these properties (repeatable)")
    g.addoption("--rlconform-dtype", action="append", default=[], help="only these dtypes (repeatable)")
    g.addoption("--rlconform-corpus", default=None, help="corpus folder of saved counterexamples, replayed first")
    g.addoption("--rlconform-database", default=None, help="persistent hypothesis example database folder")
    g.addoption("--rlconform-command", default=None, help=argparse_suppress())


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


class State:
    """Per-session state: the binding, selection filters, ledger, settings and (controller only) writer."""

    def __init__(self, config):
        from rlconform.harness.engines import load_engine
        from rlconform.harness.profiles import settings_for
        from rlconform.harness.xfails import parse_xfails

        opt = config.getoption
        self.binding = load_engine(opt("rlconform_engine"), opt("rlconform_engine_path"))
        self.ops = set(opt("rlconform_op"))
        self.properties = set(opt("rlconform_property"))
        self.dtypes = set(opt("rlconform_dtype"))
        self.xfails = parse_xfails(opt("rlconform_xfails")) if opt("rlconform_xfails") else {}
        self.out = os.path.abspath(opt("rlconform_out"))
        self.corpus = opt("rlconform_corpus")
        database = None
        if opt("rlconform_database"):
            from hypothesis.database import DirectoryBasedExampleDatabase

            database = DirectoryBasedExampleDatabase(opt("rlconform_database"))
        self.seed = opt("rlconform_seed")
        self.settings = settings_for(opt("rlconform_profile"), opt("rlconform_max_examples"), database)
        if self.seed is not None:
            from hypothesis import settings as hsettings

            self.settings = hsettings(self.settings, derandomize=False)
        self.writer = None
        self._variants: dict = {}
        if not hasattr(config, "workerinput"):
            from rlconform.harness.report import ReportWriter

            b = self.binding
            self.writer = ReportWriter(
                self.out,
                engine={"name": b.name, "spec": b.spec, "version": b.version, "path": b.path, "revision": b.revision,
                        "variants": self.variant_record()},
                run={"profile": opt("rlconform_profile"), "seed": self.seed,
                     "max_examples": self.settings.max_examples,
                     "command": opt("rlconform_command") or " ".join(sys.argv)},
            )
            self.writer.write()

    def provided_variants(self, op) -> set | None:
        """The variants of catalog op ``op`` (an OpInfo) the binding provides; None when the op has no
        variants or cannot be resolved (its findings then report it unavailable)."""
        from rlconform.harness.binding import BindingError, OpUnavailable

        if not op.variants:
            return None
        if op.name not in self._variants:
            try:
                got = self.binding.provided_variants(op.name)
                unchecked = self.binding.unchecked_variants(op.name)
            except (OpUnavailable, BindingError):
                got, unchecked = None, {}
            self._variants[op.name] = (None if got is None else set(got), unchecked)
        return self._variants[op.name][0]

    def variant_record(self) -> dict:
        """For the report: per op with variants, which the catalog checks, which the engine does not
        provide, and which the engine registers that the catalog cannot check (with why)."""
        from rlconform.harness.catalog import OPS

        record = {}
        for op in OPS.values():
            if not op.variants or op.name not in self.binding.provided_ops() or (self.ops and op.name not in self.ops):
                continue
            provided = self.provided_variants(op)
            unchecked = self._variants[op.name][1]
            record[op.name] = {
                "checked": [v for v in op.variants if provided is None or v in provided],
                "not_provided": [v for v in op.variants if provided is not None and v not in provided],
                "unchecked": dict(unchecked),
            }
        return record

    def selected(self, op: str, prop: str, dtype: str) -> bool:
        return ((not self.ops or op in self.ops) and (not self.properties or prop in self.properties)
                and (not self.dtypes or dtype in self.dtypes))


def pytest_configure(config):
    config.addinivalue_line("markers", "rlconform_distributed(flag): generic property test over the catalog ops "
                            "that are (True) or are not (False) checked on distributed ranks")
    if not config.getoption("rlconform_engine", None) and not os.environ.get("RLCONFORM_ENGINE"):
        return
    try:
        setattr(config, STATE_KEY, State(config))
    except BindingError as exc:
        raise pytest.UsageError(f"rlconform: {exc}") from None


def _state(config) -> State | None:
    return getattr(config, STATE_KEY, None)


def pytest_generate_tests(metafunc):
    if "rlconform_case" not in metafunc.fixturenames:
        return
    state = _state(metafunc.config)
    if state is None:
        metafunc.parametrize("rlconform_case", [pytest.param(None, marks=pytest.mark.skip(
            reason="no engine selected (--rlconform-engine)"))], ids=["no-engine"])
        return
    from rlconform.harness.catalog import OPS, split_regime

    marker = metafunc.definition.get_closest_marker("rlconform_distributed")
    distributed = marker.args[0] if marker else None
    provided = set(state.binding.provided_ops())
    params = []
    for op in OPS.values():
        if op.name not in provided or (distributed is not None and op.distributed != distributed):
            continue
        variants = state.provided_variants(op)
        for prop, dtype, regime in op.findings():
            if True:
                if variants is not None and split_regime(regime)[0] not in variants:
                    continue  # listed in the report's engine record as not provided
                if state.selected(op.name, prop, dtype):
                    fid = f"{op.name}.{prop}.{dtype}.{regime}"
                    marks = [pytest.mark.xfail(strict=True, reason=f"listed in xfails ledger: {state.xfails[fid]}")] \
                        if fid in state.xfails else []
                    params.append(pytest.param((op.name, prop, dtype, regime), id=fid, marks=marks))
    if not params:  # deselected in pytest_collection_modifyitems: no finding, no testcase
        params = [pytest.param(None, id="none")]
    metafunc.parametrize("rlconform_case", params)


def pytest_collection_modifyitems(config, items):
    """Drop the placeholder items of generic tests for which the binding provides no op."""
    if _state(config) is None:
        return
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "rlconform_case" in callspec.params and callspec.params["rlconform_case"] is None:
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture
def rlconform_state(request) -> State:
    state = _state(request.config)
    if state is None:
        pytest.skip("no engine selected (--rlconform-engine)")
    return state


@pytest.fixture
def rlconform_binding(rlconform_state):
    return rlconform_state.binding


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
                 "ratio": ratio if math.isfinite(ratio) else None, "ok": bool(outcome.ok)}
        if not outcome.ok:  # shrinking replays many near-identical failures: keep distinct ones
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
    """Collects the examples of one finding: counts, worst errors, and the failing (shrunk) case."""

    def __init__(self, state: State, case_id: str):
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
        self.unavailable_detail = None
        self.binding_error = None
        self.max_ratio = 0.0  # worst error / tolerance seen (> 1: a discrepancy)
        self.samples = SampleReservoir()

    def start(self, case) -> None:
        """A new call of the check: counted as an example until the first failure, after that as a
        shrinking step (hypothesis replays variants of the failing input)."""
        self.current = case
        if self.first_failure_at is None:
            self.examples += 1
        else:
            self.shrink_steps += 1

    def crashed(self) -> None:
        """The engine raised on the current case."""
        self.failing = self.current
        if self.first_failure_at is None:
            self.first_failure_at = self.examples

    def observe(self, outcome) -> None:
        self.max_abs_err = max(self.max_abs_err, outcome.max_abs_err)
        self.max_rel_err = max(self.max_rel_err, outcome.max_rel_err)
        self.max_ratio = max(self.max_ratio, outcome.ratio)
        if self.current is not None:
            self.samples.offer(self.current, outcome)
        if not outcome.ok:  # the tolerance reported is the one the (last, shrunk) failure exceeded
            self.failing = self.current
            self.message = outcome.message
            self.tolerance = outcome.tolerance or self.tolerance
            if self.first_failure_at is None:
                self.first_failure_at = self.examples
        elif self.failing is None and outcome.tolerance and outcome.ratio >= self._best_ratio:
            self._best_ratio, self.tolerance = outcome.ratio, outcome.tolerance

    def save_reproducer(self) -> dict | None:
        case = self.failing or self.current
        if case is None:
            return None
        folder = os.path.join(self.state.out, "cases")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{self.id}.json")
        doc = case.to_json()
        b = self.state.binding
        doc["engine"] = {"spec": b.spec, "path": b.path}
        with open(path, "w") as fh:
            json.dump(doc, fh)
        return {"case_file": path, "command": f"rlconform replay {os.path.relpath(path)}"}


@pytest.fixture
def rlconform_finding(request, rlconform_state):
    rec = FindingRecorder(rlconform_state, request.node.callspec.id if hasattr(request.node, "callspec") else request.node.name)
    request.node._rlconform_recorder = rec
    return rec


def _classify(excinfo) -> str:
    """discrepancy if any failure in the (possibly grouped) exception is a PropertyFailure, crash if
    the engine raised (EngineCrash) or anything else went wrong."""
    from rlconform.properties.checks import PropertyFailure

    exc = excinfo.value if excinfo is not None else None
    pending, found = [exc], set()
    while pending:
        e = pending.pop()
        if isinstance(e, PropertyFailure):
            found.add("discrepancy")
        elif isinstance(e, BaseExceptionGroup):
            pending.extend(e.exceptions)
        else:
            found.add("crash")
    return "discrepancy" if "discrepancy" in found else "crash"


def _crash_message(exc: BaseException) -> str:
    """The engine's own error when it is inside (possibly grouped, possibly flaky) hypothesis errors."""
    from rlconform.harness.evaluation import EngineCrash

    pending = [exc]
    while pending:
        e = pending.pop(0)
        if isinstance(e, EngineCrash):
            flaky = " (it did not fail again when hypothesis replayed the case)" if exc is not e and \
                type(exc).__name__ == "FlakyFailure" else ""
            return f"{e}{flaky}"[:4000]
        if isinstance(e, BaseExceptionGroup):
            pending.extend(e.exceptions)
    return f"{type(exc).__name__}: {exc}"[:4000]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    rec: FindingRecorder | None = getattr(item, "_rlconform_recorder", None)
    if rec is None or report.when != "call" and not (report.when == "setup" and report.failed):
        return
    op, prop, dtype, regime = item.callspec.params["rlconform_case"]
    listed = rec.id in rec.state.xfails
    tb = None
    if rec.unavailable_detail is not None:
        status = "xfail" if listed else "unavailable"
    elif hasattr(report, "wasxfail") and report.skipped:
        status = "xfail"
    elif report.passed and listed:
        status = "xpass"
    elif report.passed:
        status = "pass"
    elif report.failed and listed:  # strict xfail that passed shows as failed
        status = "xpass"
    else:
        status = _classify(call.excinfo)
        tb = "".join(traceback.format_exception(call.excinfo.value))[-30000:] if call.excinfo else None
    if status == "xpass":
        rec.message = "listed in the xfails ledger but now passes: remove it from the ledger"
    elif status == "crash" and call.excinfo is not None and not rec.message:
        rec.message = _crash_message(call.excinfo.value)
    if status == "xfail" and not rec.message:
        rec.message = str(getattr(report, "wasxfail", ""))
    reproducer = rec.save_reproducer() if status in ("discrepancy", "crash", "xfail") else None
    finding = {
        "id": rec.id, "op": op, "property": prop, "dtype": dtype, "regime": regime, "status": status,
        "examples": rec.examples,
        "examples_to_first_failure": rec.first_failure_at,
        "shrink_steps": rec.shrink_steps,
        "max_abs_err": rec.max_abs_err, "max_rel_err": rec.max_rel_err,
        "tolerance": rec.tolerance, "message": rec.unavailable_detail or rec.message,
        "worst_input": (rec.failing or rec.current).summary() if status in ("discrepancy", "crash", "xfail")
        and (rec.failing or rec.current) else None,
        "reproducer": reproducer, "traceback": tb, "xfail_listed": listed,
        "binding_error": rec.binding_error,
        "max_ratio": rec.max_ratio if math.isfinite(rec.max_ratio) else None,
        "samples": rec.samples.as_list(),
    }
    report.user_properties.append(("rlconform_finding", finding))
    # JUnit XML (--junitxml) writes the *teardown* report's user_properties, which are copied from the
    # item: give it scalar properties (the finding dict would be written as its str())
    for name, value in (("status", status), ("examples", rec.examples), ("max_abs_err", rec.max_abs_err),
                        ("max_rel_err", rec.max_rel_err), ("tolerance", rec.tolerance),
                        ("reproducer", reproducer["command"] if reproducer else None)):
        if value is not None:
            item.user_properties.append((f"rlconform_{name}", value))


def pytest_runtest_logreport(report):
    state = _CONTROLLER_STATE.get("state")
    if state is None or state.writer is None:
        return
    for name, value in report.user_properties:
        if name == "rlconform_finding":
            state.writer.add(value)


_CONTROLLER_STATE: dict = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    state = _state(session.config)
    if state is not None:
        _CONTROLLER_STATE["state"] = state


def pytest_sessionfinish(session, exitstatus):
    state = _state(session.config)
    if state is not None and state.writer is not None:
        interrupted = exitstatus in (2,)  # pytest.ExitCode.INTERRUPTED
        state.writer.write(complete=not interrupted)

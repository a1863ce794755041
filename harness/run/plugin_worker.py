"""The engine worker's half of the pytest plugin: one finding, run where the engine is imported.

Around each finding (:func:`pytest_runtest_call`) the worker restores torch's state, arms the per-finding
deadline and keeps the in-flight record; after it (:func:`pytest_runtest_makereport`) it records what it
*observed* (:func:`rlconform.harness.run.status.observe`), the failure record, the reproducer and the root
cause, and hands the finding to the process that writes the report, which decides its status
(:mod:`rlconform.harness.run.plugin_controller`). A single process without xdist runs both halves.
"""

from __future__ import annotations

import pytest

from rlconform.harness.core import torch_state
from rlconform.harness.run.plugin_state import state_of
from rlconform.harness.run.recorder import (
    EngineAbort,
    FindingRecorder,
    FindingStateChanged,
    classify,
    crash_message,
    crash_of,
    error_message,
    finding_entry,
    format_traceback,
)
from rlconform.harness.workers import interrupts


@pytest.fixture
def rlconform_state(request):
    state = state_of(request.config)
    if state is None:
        pytest.skip("no engine selected (--rlconform-engine)")
    return state


@pytest.fixture
def rlconform_binding(rlconform_state):
    return rlconform_state.binding


@pytest.fixture
def rlconform_finding(request, rlconform_state):
    rec = FindingRecorder(rlconform_state, request.node.callspec.id if hasattr(request.node, "callspec") else request.node.name)
    request.node._rlconform_recorder = rec
    return rec





@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Around one finding: known torch state in, deadline armed, in-flight record kept; an engine's
    ``KeyboardInterrupt``/``SystemExit`` becomes its crash; torch state it left changed, a crash."""
    rec: FindingRecorder | None = getattr(item, "_rlconform_recorder", None)
    if rec is None:
        return (yield)
    state = rec.state
    from rlconform.harness.workers.isolated import arm_deadline

    torch_state.restore(state.torch_baseline)
    if state.inflight is not None:
        state.inflight.begin(rec.id)
    if state.worker and state.fault_file is not None:
        arm_deadline(state.deadline, state.fault_file)
    try:
        result = yield
    except (KeyboardInterrupt, SystemExit) as exc:  # raised outside an example (import, corpus replay...)
        if not interrupts.engine_raised(exc):
            raise  # a real interrupt (or one this process cannot tell apart from the engine's)
        rec.crashed()
        raise EngineAbort(exc) from exc
    finally:
        if state.worker and state.fault_file is not None:
            arm_deadline(None, state.fault_file)
        changed = torch_state.changes(state.torch_baseline, torch_state.snapshot())
        torch_state.restore(state.torch_baseline)
        if state.inflight is not None:
            state.inflight.end()
    if changed:
        rec.crashed()
        raise FindingStateChanged(changed)
    return result


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    rec: FindingRecorder | None = getattr(item, "_rlconform_recorder", None)
    if rec is None or report.when != "call" and not (report.when == "setup" and report.failed):
        return
    params = item.callspec.params["rlconform_case"]
    from rlconform.harness.run import status as decider

    listed = rec.id in rec.state.xfails  # only to undo the ledger's xfail mark: the status is decided later
    tb = None
    exc = call.excinfo.value if call.excinfo is not None else None
    # pytest's outcome with the ledger's strict xfail mark undone: a listed failure reports "skipped"
    # (wasxfail), a listed pass reports "failed" without an exception
    passed = report.passed or (report.failed and listed and exc is None)
    failure = None if passed else classify(exc)
    status = decider.observe(passed=passed, unavailable=rec.unavailable_detail is not None,
                             binding_error=rec.adapter_error is not None, failure=failure, max_ratio=rec.max_ratio)
    if status == "binding_error":  # never an engine defect, never matched by the ledger
        rec.message = rec.adapter_error
        tb = format_traceback(exc) if exc is not None else None
    elif status == "marginal":  # within the margin band: never red (the decider may list it)
        rec.message = rec.marginal_message
    elif status == "error" and exc is not None:
        rec.message = error_message(exc)
        tb = format_traceback(exc)
    elif status == "crash" and exc is not None:
        if not rec.message:
            rec.message = crash_message(exc)
        rec.crash = crash_of(exc)
        tb = format_traceback(exc)
    elif status == "discrepancy" and exc is not None:
        tb = format_traceback(exc)
    reproducer = rec.save_reproducer() if status in ("discrepancy", "crash", "marginal") else None
    finding = finding_entry(rec, params, status, tb, reproducer)
    finding["cost_s"] = round(float(getattr(report, "duration", 0.0) or 0.0), 3)  # what --shard balances
    # --- root cause: the engine function, crash frame and trigger, read where the engine ran
    from rlconform.harness.run import root_cause

    try:
        finding.update(root_cause.fields(rec.state.binding, finding, exc, rec.failing or rec.current))
    except Exception as err:  # noqa: BLE001 - the finding stands without them; triage falls back to the op
        finding["root_cause_error"] = f"{type(err).__name__}: {err}"[:300]
    # what this process saw; the status is decided where the report is written (run.status.decide)
    finding["observed"] = finding.pop("status")
    report.user_properties.append(("rlconform_finding", finding))
    # JUnit XML (--junitxml) writes the *teardown* report's user_properties, which are copied from the
    # item: give it scalar properties (the finding dict would be written as its str())
    for name, value in (("status", status), ("examples", rec.examples), ("max_abs_err", rec.max_abs_err),
                        ("max_rel_err", rec.max_rel_err), ("tolerance", rec.tolerance),
                        ("reproducer", reproducer["command"] if reproducer else None)):
        if value is not None:
            item.user_properties.append((f"rlconform_{name}", value))



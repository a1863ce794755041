"""The controller's half of the pytest plugin: the process that writes the report.

It starts each engine worker's referee before the worker imports the engine, decides each finding's status
as it arrives (:func:`rlconform.harness.run.status.decide`: the worker's observation, the referee's verdicts,
the margin band, the ledger), keeps its reproducer's bytes, turns a worker's death into that finding's crash,
prints progress, and marks the report complete at the end. Under xdist it runs no engine code; a single
process without xdist runs both halves (:mod:`rlconform.harness.run.plugin_worker`).
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from rlconform.harness.core.opinfo import FINDING_ID
from rlconform.harness.report.case_paths import CASES, case_file_name
from rlconform.harness.run.plugin_state import CONTROLLER_STATE as _CONTROLLER_STATE
from rlconform.harness.run.plugin_state import state_of as _state
from rlconform.harness.run.recorder import dead_process_entry, missing_record_entry
from rlconform.harness.run.status import decide
from rlconform.harness.workers import interrupts

_FID = re.compile(rf"\[({FINDING_ID})\]$")


@pytest.hookimpl(optionalhook=True)  # an xdist hook
def pytest_configure_node(node):
    """xdist controller: tell each worker where its in-flight record and fault log go; track it from
    now on (an interrupt kills it, even while it is still loading the engine)."""
    state = _state(node.config)
    if state is not None:
        state.nodes[node.gateway.id] = node
        if state.rundir:
            node.workerinput["rlconform_rundir"] = state.rundir
        if state.use_referee:
            state.start_referee(node)



@pytest.hookimpl(optionalhook=True)  # an xdist hook
def pytest_xdist_node_collection_finished(node, ids):
    state = _state(node.config)
    if state is not None:
        state.collected |= {m.group(1) for m in map(_FID.search, ids) if m}





class _StopRun(KeyboardInterrupt):
    """Ends the run from a hook (pytest and xdist stop on a KeyboardInterrupt); ``State.error`` says why."""


def _controller_state():
    return _CONTROLLER_STATE.get("state")


def _silence_pytest(config) -> None:
    """``rlconform check`` without ``-v``: pytest's and xdist's own lines (progress letters,
    "bringing up nodes", "18 failed … 54 skipped") are not printed; rlconform's summary and the
    progress line of :func:`_progress` speak instead."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        from _pytest._io import TerminalWriter

        config._rlconform_devnull = open(os.devnull, "w")
        tr._tw = TerminalWriter(config._rlconform_devnull)
    config._rlconform_progress = sys.stderr.isatty()
    import time

    config._rlconform_started = config._rlconform_last_progress = time.monotonic()  # for the log's progress lines


#: seconds between two progress lines in a log (not a terminal): a CI job silent for minutes reads as hung
#: (``RLCONFORM_PROGRESS_EVERY_S`` overrides it)
PROGRESS_EVERY_S = 60.0


def progress_line(done: int, total: int, elapsed_s: float, left_s: float | None = None) -> str:
    """``rlconform: 120/236 findings · 5 min 2 s · about 4 min 55 s left``: ``left_s`` when given
    (:func:`time_left`), else the mean time per finding so far times the findings left; none before the first."""
    def span(s: float) -> str:
        s = int(round(s))
        return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"

    if left_s is None and 0 < done < total:
        left_s = elapsed_s / done * (total - done)
    left = f" · about {span(left_s)} left" if 0 < done < total and left_s is not None else ""
    return f"rlconform: {done}/{total} findings · {span(elapsed_s)}{left}"


def time_left(elapsed_s: float, costs: dict[str, float], remaining: list[str]) -> float | None:
    """Seconds left of a run that took ``elapsed_s`` for the findings of ``costs`` (finding id -> its ``cost_s``) with
    the findings ``remaining`` to run: each of those costs the mean of the recorded findings of its op (an op not yet
    seen: of all recorded), scaled by the wall time per recorded cost-second (the workers run in parallel). An op
    whose findings cost more (the policy step: its example runs the engine's whole step) weighs more; None before a
    finding with a cost is recorded."""
    by_op: dict[str, list[float]] = {}
    for fid, cost in costs.items():
        by_op.setdefault(fid.split(".", 1)[0], []).append(cost)
    spent = sum(costs.values())
    if not costs or spent <= 0:
        return None
    mean_all = spent / len(costs)
    ahead = sum((sum(c) / len(c)) if (c := by_op.get(fid.split(".", 1)[0])) else mean_all for fid in remaining)
    return elapsed_s * ahead / spent


def _progress(state, fid: str) -> None:
    """On a terminal, one rewritten line: findings recorded of those selected, and the latest. In a log
    (CI, ``-q`` included), a line with an estimate of the time left every :data:`PROGRESS_EVERY_S`."""
    import time

    expected = state.expected()
    total = len(expected) or 1
    done = len(state.writer.findings)
    if not getattr(state.config, "_rlconform_progress", False):
        now = time.monotonic()
        started = getattr(state.config, "_rlconform_started", None)
        if started is None:
            state.config._rlconform_started = state.config._rlconform_last_progress = now
            return
        every = float(os.environ.get("RLCONFORM_PROGRESS_EVERY_S") or PROGRESS_EVERY_S)
        if now - state.config._rlconform_last_progress >= every and done < total:
            state.config._rlconform_last_progress = now
            recorded = state.writer.findings
            costs = {fid: float(f["cost_s"]) for fid, f in recorded.items()
                     if isinstance(f.get("cost_s"), (int, float)) and not isinstance(f.get("cost_s"), bool)}
            left = time_left(now - started, costs, [fid for fid in expected if fid not in recorded])
            sys.stderr.write(progress_line(done, total, now - started, left) + "\n")
            sys.stderr.flush()
        return
    sys.stderr.write(f"\r\033[Krlconform: {done}/{total} findings · {fid[:90]}")
    if done >= total:
        sys.stderr.write("\r\033[K")
    sys.stderr.flush()


def pytest_runtest_logreport(report):
    state = _controller_state()
    if state is None or state.writer is None:
        return
    from rlconform.harness.report.writer import ReportWriteError

    m = _FID.search(report.nodeid or "")
    test_id = m.group(1) if m else None
    records = [v for name, v in report.user_properties if name == "rlconform_finding"]
    if test_id is not None and (report.when == "call" or report.when == "setup" and report.failed):
        # the record of this test's finding, and only it: a record under another id, or none, is this
        # finding's crash (it never reached the referee), never a missing row
        others = [v.get("id") if isinstance(v, dict) else type(v).__name__ for v in records
                  if not (isinstance(v, dict) and v.get("id") == test_id)]
        records = [v for v in records if isinstance(v, dict) and v.get("id") == test_id][:1]
        if not records and test_id not in state.writer.findings:
            records = [missing_record_entry(test_id, others)]
    for value in records:
        if not isinstance(value, dict):
            continue
        refereed = state.use_referee and state.referees
        if refereed:  # the referee's verdicts stand
            state.drain_referees()
        line = decide(value, listed=state.xfails, verdicts=state.verdicts if refereed else None,
                      ledger=state.ledger)
        if line is not None:
            state.ledger_matches.setdefault(line.key, []).append(value["id"])
        _keep_case(state, value)
        _progress(state, value.get("id", ""))
        try:
            state.writer.add(value)
        except ReportWriteError as exc:
            state.error = str(exc)
            raise _StopRun(state.error) from None
    interrupts.check()  # an interrupt swallowed anywhere in this process ends the run here


def _ledger_verdicts(state, recorded: set[str]) -> list[dict]:
    """One entry per defect line: ``xfail`` (a finding of it failed), ``xpass`` (the run checked its whole
    scope and none did: fixed, remove the line) or ``not checked`` (the run selected too little to tell:
    part of its scope, or narrowed by ``--dtype`` / ``--regime``)."""
    out = []
    expected = state.expected() | recorded
    for key, line in sorted(state.ledger.defects.items(), key=lambda kv: kv[1].line):
        matched = sorted(set(state.ledger_matches.get(key, ())))
        # fixed only when nothing of its scope fails: a finding of the scope may have matched another line
        # by key, its kind or site read from another example than the one the ledger was written from
        in_scope = sorted({fid for k, fids in state.ledger_matches.items() for fid in fids
                           if (fid.split(".")[0], fid.split(".")[1]) in line.scope})
        if matched or in_scope:
            status = "xfail"
            matched = matched or in_scope
        else:
            scope = {f"{op}.{prop}" for op, prop in line.scope}
            ran = {".".join(fid.split(".")[:2]) for fid in recorded}
            wanted = {fid for fid in expected if ".".join(fid.split(".")[:2]) in scope}
            full = scope <= ran and wanted <= recorded and not state.dtypes and not state.regimes
            status = "xpass" if full else "not checked"
        out.append({"key": key, "line": line.line, "status": status, "findings": matched, "reason": line.reason,
                    "scope": sorted(f"{op}.{prop}" for op, prop in line.scope)})
    return out


def _keep_case(state, finding: dict) -> None:
    """Keep the bytes of the finding's reproducer as they are when the finding arrives: the run's files are
    written from this record once every engine process is gone."""
    rep = finding.get("reproducer") if isinstance(finding, dict) else None
    if not isinstance(rep, dict):
        return
    text, path = rep.pop("_case_text", None), rep.get("case_file")
    if not path:
        return
    # the controller names the file itself, OUT/cases/<finding id>.json: a path the engine's process sends is
    # never written to (nor read)
    fid = finding.get("id")
    name = case_file_name(fid)
    if name is None:
        rep.pop("case_file", None)
        return
    rep["case_file"] = f"{CASES}/{name}"
    path = os.path.join(state.out, CASES, name)
    if isinstance(text, str):  # as the process that found it wrote it, not as the folder holds it now
        state.cases[path] = text.encode("utf-8")
        return
    try:
        with open(path, "rb") as fh:
            state.cases[path] = fh.read()
    except OSError:
        state.cases.pop(path, None)


@pytest.hookimpl(optionalhook=True)  # an xdist hook
def pytest_testnodeready(node):
    state = _controller_state()
    if state is not None:
        state.nodes[node.gateway.id] = node


@pytest.hookimpl(optionalhook=True)  # an xdist hook
def pytest_testnodedown(node, error):
    state = _controller_state()
    if state is not None:
        state.nodes.pop(node.gateway.id, None)


def _popen(node):
    return getattr(getattr(node.gateway, "_io", None), "popen", None)


def _exitcode(node) -> int | None:
    popen = _popen(node)
    if popen is None:
        return None
    try:
        return popen.wait(timeout=10)
    except Exception:  # noqa: BLE001 - still running or not ours to wait for
        return popen.poll()


@pytest.hookimpl(optionalhook=True)  # an xdist hook
def pytest_handlecrashitem(crashitem, report, sched):
    """xdist: the worker running ``crashitem`` died. Make that finding a ``crash`` with what is known."""
    state = _controller_state()
    m = _FID.search(crashitem)
    if state is None or m is None:
        return
    from rlconform.harness.run.inflight import read_inflight
    from rlconform.harness.workers.isolated import describe_exit, read_fault_log

    node = report.node
    wid = node.gateway.id
    code = _exitcode(node)
    fault, timed_out = read_fault_log(os.path.join(state.rundir, f"{wid}.fault")) if state.rundir else ("", False)
    inflight = read_inflight(os.path.join(state.rundir, f"{wid}.case")) if state.rundir else None
    description = describe_exit(code, timed_out=timed_out, deadline_s=state.deadline)
    fid = m.group(1)
    b = state.binding
    try:
        entry = dead_process_entry(fid, description, fault, inflight, state.out, b.spec, b.path)
    except Exception as exc:  # noqa: BLE001 - a crash finding without a reproducer is better than none
        entry = dead_process_entry(fid, description + f" (reproducer not saved: {exc})",
                                   fault, None, state.out, b.spec, b.path)
    report.user_properties.append(("rlconform_finding", entry))
    report.longrepr = f"{crashitem}: {description}"




@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    state = _state(session.config)
    if state is None:
        return
    if not state.worker:
        _CONTROLLER_STATE["state"] = state
        if session.config.getoption("rlconform_console", False):
            _silence_pytest(session.config)
    elif state.fault_file is not None:  # after pytest's own faulthandler set-up, which writes to stderr
        import faulthandler

        faulthandler.enable(file=state.fault_file, all_threads=True)


def _kill_workers(state) -> None:
    for node in list(state.nodes.values()):
        popen = _popen(node)
        if popen is not None and popen.poll() is None:
            try:
                popen.kill()
            except OSError:
                pass


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    state = _state(session.config)
    if state is None or state.writer is None:
        return
    interrupted = interrupts.received() is not None or (exitstatus == 2 and state.error is None)
    if interrupted or state.error:
        _kill_workers(state)  # before xdist's own teardown, which would wait for a busy worker
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None and hasattr(tr, "_report_keyboardinterrupt"):
            tr._report_keyboardinterrupt = lambda: None  # the summary says what happened, without a traceback
    recorded = set(state.writer.findings)
    not_run = sorted(state.expected() - recorded)
    state.writer.update_run(not_run=not_run, interrupted=interrupted)
    if state.ledger.defects:
        state.writer.update_run(ledger_defects=_ledger_verdicts(state, recorded))
    from rlconform.harness.report.writer import ReportWriteError

    sealed_later = bool(session.config.getoption("rlconform_seal", False))
    try:
        state.writer.write(complete=not interrupted and not not_run and state.error is None, html=not sealed_later)
    except ReportWriteError as exc:
        state.error = state.error or str(exc)
    _CONTROLLER_STATE["result"] = {"interrupted": interrupted, "not_run": not_run, "error": state.error}
    if sealed_later:  # `rlconform check` ends every engine process, then writes the files from this record
        _CONTROLLER_STATE["result"].update(writer=state.writer, cases=dict(state.cases))


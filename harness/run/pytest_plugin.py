"""pytest plugin: parametrizes the generic property tests over a binding and writes the report.

Loaded by ``rlconform check`` (``-p rlconform.harness.run.pytest_plugin``); usable directly::

    pytest -p rlconform.harness.run.pytest_plugin --rlconform-engine verl --pyargs rlconform.properties

Every test id is a finding id (``op.property.dtype.regime``). After each test the finding is added to
``report.json`` (rewritten atomically), so an interrupted run keeps what it found.

Process isolation (issue 14). Under pytest-xdist (``-n N``; ``rlconform check`` always uses it) the
engines run only in the workers; the controller collects nothing, runs nothing of the engine, and
writes the report:

* a worker that dies (``os._exit``, a signal, the OOM killer, the per-finding deadline) fails the finding
  it was running as a ``crash`` naming the exit code or signal, its Python stack (faulthandler) and the
  example in flight (its reproducer; see :mod:`rlconform.harness.run.inflight`); xdist starts a fresh
  worker for the rest (``--max-worker-restart``);
* workers ignore SIGINT, so a ``KeyboardInterrupt`` or ``SystemExit`` in a worker is the engine's: a
  crash of that finding (:class:`~rlconform.properties.runner.EngineAbort`), not an interrupt of the run;
* every finding starts from the torch state the worker had before loading the engine; a finding that
  leaves it changed is a crash naming what changed (:mod:`rlconform.harness.core.torch_state`), and the
  state is restored for the next;
* a per-finding deadline (``--rlconform-deadline``, default :data:`DEFAULT_DEADLINE_S` s) ends a hung
  worker with its stacks;
* the controller records real interrupts (:mod:`rlconform.harness.workers.interrupts`), also ones swallowed
  somewhere, kills the workers at once on Ctrl-C, and marks the report complete only when the run was
  not interrupted and every selected finding was recorded (``run.not_run`` lists the others);
* with ``--rlconform-seal`` (``rlconform check``) the controller keeps each reproducer's bytes as its
  finding arrives and leaves report.html to the caller, which ends every process the run started and then
  writes cases/, report.json, report.md and report.html from that record
  (:meth:`rlconform.harness.report.writer.ReportWriter.seal`, issue 22 §2).

Without xdist (``-n 0`` or none) the engine runs in the pytest process itself, as any pytest plugin's
tests do; ``rlconform check`` does that only for rlconform's own code (``-n 0`` with the reference engine
or a mutant), never for an engine package.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile

import pytest

from rlconform.harness.workers import interrupts

from rlconform.harness.core import torch_state
from rlconform.harness.catalog.binding import BindingError
from rlconform.harness.core.opinfo import FINDING_ID
from rlconform.harness.report.case_paths import CASES, case_file_name
from rlconform.harness.run.selection import selected_findings
from rlconform.harness.run.status import decide
from rlconform.harness.run.recorder import (
    EngineAbort, FindingRecorder, FindingStateChanged, classify, crash_message, crash_of, dead_process_entry,
    error_message, finding_entry, format_traceback,
)

STATE_KEY = "_rlconform_state"
#: seconds one finding may take in a worker before it is considered hung
DEFAULT_DEADLINE_S = 900.0
_FID = re.compile(rf"\[({FINDING_ID})\]$")


def pytest_addoption(parser):
    g = parser.getgroup("rlconform")
    g.addoption("--rlconform-engine", default=None, help="engine spec (reference, verl, mutants.<f>, module:attr, file.py)")
    g.addoption("--rlconform-engine-path", default=None, help="a fork's checkout, put first on sys.path")
    g.addoption("--rlconform-out", default="rlconform-report", help="report directory")
    g.addoption("--rlconform-profile", default="ci", help="hypothesis profile: dev | ci | nightly")
    g.addoption("--rlconform-max-examples", type=int, default=None)
    g.addoption("--rlconform-max-shrinks", type=int, default=None,
                help="shrinking steps per failing finding (negative: no limit; default: by profile, 0 if ledger-listed)")
    g.addoption("--rlconform-seed", type=int, default=None)
    g.addoption("--rlconform-xfails", default=None, help="ledger of known discrepancies (finding ids)")
    g.addoption("--rlconform-op", action="append", default=[], help="only these ops (repeatable)")
    g.addoption("--rlconform-property", action="append", default=[], help="only these properties (repeatable)")
    g.addoption("--rlconform-dtype", action="append", default=[], help="only these dtypes (repeatable)")
    g.addoption("--rlconform-regime", action="append", default=[], help="only these regimes (repeatable)")
    g.addoption("--rlconform-findings", default=None, help="only the finding ids this file lists (one a line)")
    g.addoption("--rlconform-shard", default=None, help="K/N: this run is shard K of N (recorded in report.json)")
    g.addoption("--rlconform-corpus", default=None, help="folder of saved counterexamples to replay first")
    g.addoption("--rlconform-database", default=None, help="persistent hypothesis example database folder")
    g.addoption("--rlconform-deadline", type=float, default=DEFAULT_DEADLINE_S,
                help="seconds one finding may take in an xdist worker before the worker is ended as hung "
                     "(0: no deadline)")
    g.addoption("--rlconform-command", default=None, help=argparse_suppress())
    g.addoption("--rlconform-engine-meta", default=None, help=argparse_suppress())
    g.addoption("--rlconform-out-claimed", action="store_true", default=False, help=argparse_suppress())
    g.addoption("--rlconform-seal", action="store_true", default=False, help=argparse_suppress())
    g.addoption("--rlconform-referee", action="store_true", dest="rlconform_referee", default=None,
                help="judge in a referee process that never imports the engine (issue 22 §1); the default, "
                     "unless RLCONFORM_REFEREE=0")
    g.addoption("--rlconform-no-referee", action="store_false", dest="rlconform_referee",
                help="judge in the engine's process: for debugging only, an engine can bend the verdict")
    g.addoption("--rlconform-console", action="store_true", default=False, help=argparse_suppress())


def use_referee(option: bool | None) -> bool:
    """Whether this session judges in referees: ``--rlconform-referee`` / ``--rlconform-no-referee``, else
    the referee is on (as in ``rlconform check``) unless ``RLCONFORM_REFEREE`` turns it off
    (:func:`rlconform.harness.run.referee_flag.default`)."""
    from rlconform.harness.run.referee_flag import default

    return default() if option is None else bool(option)


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def _is_controller(config) -> bool:
    """The xdist controller: it schedules findings on workers and runs none itself."""
    return not _is_worker(config) and getattr(config.option, "dist", "no") != "no"


class _EngineInfo:
    """The engine as the controller knows it (from ``--rlconform-engine-meta``): data, no code."""

    def __init__(self, meta: dict):
        self.name, self.spec, self.version = meta["name"], meta["spec"], meta.get("version")
        self.path, self.revision = meta.get("path"), meta.get("revision")
        self._ops = list(meta["ops"])
        self.variants = meta.get("variants") or {}
        self.variant_record = meta.get("variant_record") or {}
        self.engine_dtypes = meta.get("engine_dtypes") or {}  # issue 20 §3: op -> dtypes the trainer uses
        self.declared_rows = meta.get("declared") or []  # issue 20 §2: conventions, preconditions, guards (data)
        self.variant_triggers = meta.get("variant_triggers") or {}  # configurations as triggers (for reachability)
        self.coverage = meta.get("coverage")  # the coverage table (issue 11), built in the probe's child process

    def provided_ops(self) -> list[str]:
        return list(self._ops)


class State:
    """Per-session state: the binding, selection filters, ledger, settings; in the controller the
    report writer and the bookkeeping of findings; in a worker the in-flight record and deadline."""

    def __init__(self, config):
        from rlconform.harness.bindings.load import load_engine
        from rlconform.harness.core.profiles import settings_for
        from rlconform.harness.report.xfails import Ledger, parse_ledger

        opt = config.getoption
        self.config = config
        self.worker = _is_worker(config)
        if self.worker:  # before the engine loads: Ctrl-C is the controller's; a KeyboardInterrupt here the engine's
            interrupts.ignore_sigint()
        self.controller = _is_controller(config)
        self.referees: dict = {}  # controller: worker id -> its referee (issue 22 §1)
        from rlconform.harness.run.referee_verdicts import VerdictBook

        self.verdicts = VerdictBook()
        self.use_referee = use_referee(opt("rlconform_referee"))
        if self.use_referee and not self.worker and not self.controller:
            self._start_local_referee()  # a single process (no -n): before it imports the engine
        self.torch_baseline = torch_state.baseline()  # before the engine's modules are imported
        meta = opt("rlconform_engine_meta")
        if self.controller and meta:
            with open(meta) as fh:
                self.binding = _EngineInfo(json.load(fh))
        else:
            self.binding = load_engine(opt("rlconform_engine"), opt("rlconform_engine_path"))
            torch_state.restore(self.torch_baseline)
        self.from_cli = bool(meta)
        self.ops = set(opt("rlconform_op"))
        self.properties = set(opt("rlconform_property"))
        self.dtypes = set(opt("rlconform_dtype"))
        self.regimes = set(opt("rlconform_regime"))
        self.ledger = parse_ledger(opt("rlconform_xfails")) if opt("rlconform_xfails") else Ledger()
        self.xfails = self.ledger.findings  # finding-id lines; defect lines are matched in the controller
        self.ledger_matches: dict[str, list[str]] = {}  # controller: defect key -> finding ids it matched
        self.findings = None
        if opt("rlconform_findings"):
            from rlconform.harness.run.changed_since import read_selection

            try:
                self.findings = set(read_selection(opt("rlconform_findings")))
            except (OSError, ValueError) as exc:
                raise BindingError(f"cannot read --rlconform-findings: {exc}") from None
        self.out = os.path.abspath(opt("rlconform_out"))
        self.corpus = opt("rlconform_corpus")
        self.deadline = opt("rlconform_deadline") or None
        database = None
        if opt("rlconform_database"):
            from hypothesis.database import DirectoryBasedExampleDatabase

            database = DirectoryBasedExampleDatabase(opt("rlconform_database"))
        self.max_shrinks = opt("rlconform_max_shrinks")
        self.profile = opt("rlconform_profile")
        self.seed = opt("rlconform_seed")
        self.settings = settings_for(opt("rlconform_profile"), opt("rlconform_max_examples"), database)
        if self.seed is not None:
            from hypothesis import settings as hsettings

            self.settings = hsettings(self.settings, derandomize=False)
        self._variants = None
        self._variant_record = None
        self.inflight = None
        self.fault_file = None
        self.writer = None
        self.outdir = None
        self.rundir = None
        self.nodes: dict = {}  # controller: live xdist workers by id
        self.cases: dict[str, bytes] = {}  # controller: each reproducer as it was when its finding arrived
        self.collected: set[str] = set()
        self.error: str | None = None  # a harness error that ended the run (e.g. the report cannot be written)
        if self.worker:
            self._start_worker(config.workerinput)
        else:
            self._start_writer(opt)

    # -- worker ------------------------------------------------------------------------------------
    def _start_worker(self, workerinput) -> None:
        from rlconform.harness.run.inflight import InflightWriter

        rundir = workerinput.get("rlconform_rundir")
        if rundir:
            wid = workerinput.get("workerid", f"pid{os.getpid()}")
            self.inflight = InflightWriter(os.path.join(rundir, f"{wid}.case"))
            self.fault_file = open(os.path.join(rundir, f"{wid}.fault"), "w", buffering=1)
        referee = workerinput.get("rlconform_referee")
        if referee:  # the verdicts are the referee's (issue 22 §1)
            from rlconform.properties import referee as judge

            judge.connect(referee[0], bytes.fromhex(referee[1]))

    # -- controller (or a single process) ----------------------------------------------------------
    def _start_writer(self, opt) -> None:
        from rlconform.harness.run.outdir import OutDirError, claim
        from rlconform.harness.report.writer import ReportWriter

        if not opt("rlconform_out_claimed"):  # `rlconform check` claims the folder before starting pytest
            try:
                self.outdir = claim(self.out)
            except OutDirError as exc:
                raise pytest.UsageError(f"rlconform: {exc}") from None
        if self.controller:
            self.rundir = tempfile.mkdtemp(prefix="rlconform-run-")
        b = self.binding
        self.writer = ReportWriter(
            self.out,
            engine={"name": b.name, "spec": b.spec, "version": b.version, "path": b.path, "revision": b.revision,
                    "variants": self.variant_record(),
                    "engine_dtypes": {op: list(d) for op, d in (getattr(b, "engine_dtypes", None) or {}).items()},
                    "declared": getattr(b, "declared_rows", None)
                    or [d.row() for d in getattr(b, "declared", ())],
                    "variant_triggers": {op: dict(v) for op, v in (getattr(b, "variant_triggers", None) or {}).items()}},
            run={"profile": opt("rlconform_profile"), "seed": self.seed,
                 "max_examples": self.settings.max_examples,
                 "max_shrinks": {"per_finding": self.shrink_budget(""), "ledger_listed": self.shrink_budget_listed()},
                 "command": opt("rlconform_command") or " ".join(sys.argv),
                 "narrowed": bool(self.dtypes or self.regimes),
                 **({"shard": opt("rlconform_shard")} if opt("rlconform_shard") else {})},
            # the coverage table comes with `rlconform check` (built where the engine is imported); a bare
            # pytest run does not build it
            coverage=getattr(b, "coverage", None) if isinstance(b, _EngineInfo) else None,
        )
        from rlconform.harness.report.writer import ReportWriteError

        try:
            self.writer.write()
        except ReportWriteError as exc:
            raise pytest.UsageError(f"rlconform: {exc}") from None

    def shrink_budget(self, finding_id: str) -> int | None:
        """Shrinking steps this finding may take (:func:`rlconform.harness.core.profiles.shrink_budget`)."""
        from rlconform.harness.core.profiles import shrink_budget

        op, _, rest = finding_id.partition(".")
        listed = finding_id in self.xfails or self.ledger.in_scope(op, rest.partition(".")[0])
        return shrink_budget(self.profile, listed, self.max_shrinks)

    def shrink_budget_listed(self) -> int | None:
        from rlconform.harness.core.profiles import shrink_budget

        return shrink_budget(self.profile, True, self.max_shrinks)

    def variants(self) -> dict:
        """op -> the variants the engine provides (None: all, or the op cannot be resolved): from the
        engine's metadata in the controller, by resolving the op in a worker or a single process."""
        if isinstance(self.binding, _EngineInfo):
            return self.binding.variants
        if self._variants is None:
            from rlconform.harness.bindings.load import variant_info

            self._variants, self._variant_record = variant_info(self.binding)
        return self._variants

    def variant_record(self) -> dict:
        if isinstance(self.binding, _EngineInfo):
            return self.binding.variant_record
        self.variants()
        return self._variant_record

    def expected(self) -> set[str]:
        """Finding ids the run must record to be complete: those collected, and (``rlconform check``,
        which runs every test folder) every finding the filters select."""
        ids = set(self.collected)
        if self.from_cli:
            ids |= {".".join(f) for f in selected_findings(self.binding.provided_ops(), self.ops, self.properties,
                                                            self.dtypes, variants=self.variants(),
                                                            profile=self.profile, regimes=self.regimes,
                                                            findings=self.findings)}
        return ids

    def start_referee(self, node) -> None:
        """Controller: the referee of worker ``node``, started before the worker imports the engine."""
        from rlconform.harness.workers import referee
        from rlconform.properties import referee as judge
        from rlconform.harness.run.dispatch import referee_judge

        wid = node.gateway.id
        if wid not in self.referees:
            try:
                self.referees[wid] = referee.start(referee_judge, judge.check_clean)
            except referee.RefereeUnavailable as exc:
                raise pytest.UsageError(f"rlconform: {exc}") from None
        r = self.referees[wid]
        node.workerinput["rlconform_referee"] = [r.address, r.authkey.hex()]

    def _start_local_referee(self) -> None:
        """A single process (no xdist): its own referee, started before the engine is imported here. The
        evaluation and the judgment are the referee's as with workers, but the verdicts reach this process,
        which runs the engine: ``-n N`` (``rlconform check`` always) keeps them out of the engine's reach."""
        from rlconform.harness.workers import referee
        from rlconform.properties import referee as judge
        from rlconform.harness.run.dispatch import referee_judge

        try:
            r = referee.start(referee_judge, judge.check_clean)
        except referee.RefereeUnavailable as exc:
            raise pytest.UsageError(f"rlconform: {exc}") from None
        self.referees["local"] = r
        judge.connect(r.address, r.authkey)

    def drain_referees(self) -> None:
        for r in self.referees.values():
            self.verdicts.add(r.drain())

    def close(self) -> None:
        if "local" in self.referees:
            from rlconform.properties import referee as judge

            judge.disconnect()
        for r in self.referees.values():
            r.close()
        self.referees.clear()
        if self.inflight is not None:
            self.inflight.close()
        if self.outdir is not None:
            self.outdir.release()
        if self.rundir:
            import shutil

            shutil.rmtree(self.rundir, ignore_errors=True)


def pytest_configure(config):
    config.addinivalue_line("markers", "rlconform_distributed(flag): generic property test over the catalog ops "
                            "that are (True) or are not (False) checked on distributed ranks")
    if not config.getoption("rlconform_engine", None) and not os.environ.get("RLCONFORM_ENGINE") \
            and not config.getoption("rlconform_engine_meta", None):
        return
    if not _is_worker(config):
        config._rlconform_own_handlers = interrupts.install()
    try:
        setattr(config, STATE_KEY, State(config))
    except BindingError as exc:
        raise pytest.UsageError(f"rlconform: {exc}") from None


def pytest_unconfigure(config):
    state = _state(config)
    if state is not None:
        state.close()
        if _CONTROLLER_STATE.get("state") is state:
            del _CONTROLLER_STATE["state"]
    if getattr(config, "_rlconform_own_handlers", False):
        interrupts.uninstall()


def _state(config) -> State | None:
    return getattr(config, STATE_KEY, None)


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


def pytest_generate_tests(metafunc):
    if "rlconform_case" not in metafunc.fixturenames:
        return
    state = _state(metafunc.config)
    if state is None:
        metafunc.parametrize("rlconform_case", [pytest.param(None, marks=pytest.mark.skip(
            reason="no engine selected (--rlconform-engine)"))], ids=["no-engine"])
        return
    marker = metafunc.definition.get_closest_marker("rlconform_distributed")
    distributed = marker.args[0] if marker else None
    params = []
    for finding in selected_findings(state.binding.provided_ops(), state.ops, state.properties, state.dtypes,
                                     distributed=distributed, variants=state.variants(), profile=state.profile,
                                     regimes=state.regimes, findings=state.findings):
        fid = ".".join(finding)
        marks = [pytest.mark.xfail(strict=True, reason=f"listed in xfails ledger: {state.xfails[fid]}")] \
            if fid in state.xfails else []
        params.append(pytest.param(finding, id=fid, marks=marks))
    if not params:  # deselected in pytest_collection_modifyitems: no finding, no testcase
        params = [pytest.param(None, id="none")]
    metafunc.parametrize("rlconform_case", params)


def pytest_collection_modifyitems(config, items):
    """Drop the placeholder items of generic tests for which the binding provides no op."""
    state = _state(config)
    if state is None:
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
    state.collected |= {m.group(1) for m in map(_FID.search, (i.nodeid for i in keep)) if m}


@pytest.hookimpl(optionalhook=True)  # an xdist hook
def pytest_xdist_node_collection_finished(node, ids):
    state = _state(node.config)
    if state is not None:
        state.collected |= {m.group(1) for m in map(_FID.search, ids) if m}


@pytest.fixture
def rlconform_state(request) -> State:
    state = _state(request.config)
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


# ------------------------------------------------------------------------------------------------
# the process that runs the engine: one finding


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
    if status == "binding_error":  # issue 23 §2: never an engine defect, never matched by the ledger
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
    # --- root cause (issue 20 §1): the engine function, crash frame and trigger, read where the engine ran
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


# ------------------------------------------------------------------------------------------------
# the process that writes the report


class _StopRun(KeyboardInterrupt):
    """Ends the run from a hook (pytest and xdist stop on a KeyboardInterrupt); ``State.error`` says why."""


def _controller_state() -> State | None:
    return _CONTROLLER_STATE.get("state")


def _silence_pytest(config) -> None:
    """``rlconform check`` without ``-v`` (issue 26 §7): pytest's and xdist's own lines (progress letters,
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


def progress_line(done: int, total: int, elapsed_s: float) -> str:
    """``rlconform: 120/236 findings · 5 min 2 s · about 4 min 55 s left`` (the estimate from the mean time
    per finding so far; none before the first)."""
    def span(s: float) -> str:
        s = int(round(s))
        return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"

    left = f" · about {span(elapsed_s / done * (total - done))} left" if 0 < done < total else ""
    return f"rlconform: {done}/{total} findings · {span(elapsed_s)}{left}"


def _progress(state: State, fid: str) -> None:
    """On a terminal, one rewritten line: findings recorded of those selected, and the latest. In a log
    (CI, ``-q`` included), a line with an estimate of the time left every :data:`PROGRESS_EVERY_S`."""
    import time

    total = len(state.expected()) or 1
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
            sys.stderr.write(progress_line(done, total, now - started) + "\n")
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

    for name, value in report.user_properties:
        if name == "rlconform_finding":
            if not isinstance(value, dict):
                continue
            refereed = state.use_referee and state.referees
            if refereed:  # the referee's verdicts stand (issue 22 §1)
                state.drain_referees()
            line = decide(value, listed=state.xfails, verdicts=state.verdicts if refereed else None,
                          ledger=state.ledger)
            if line is not None:
                state.ledger_matches.setdefault(line.key, []).append(value["id"])
            _keep_case(state, value)
            _progress(state, value.get("id", "") if isinstance(value, dict) else "")
            try:
                state.writer.add(value)
            except ReportWriteError as exc:
                state.error = str(exc)
                raise _StopRun(state.error) from None
    interrupts.check()  # an interrupt swallowed anywhere in this process ends the run here


def _ledger_verdicts(state: State, recorded: set[str]) -> list[dict]:
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


def _keep_case(state: State, finding: dict) -> None:
    """Keep the bytes of the finding's reproducer as they are when the finding arrives: the run's files are
    written from this record once every engine process is gone (issue 22 §2)."""
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


_CONTROLLER_STATE: dict = {}


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


def _kill_workers(state: State) -> None:
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

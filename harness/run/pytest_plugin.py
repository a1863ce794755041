"""pytest plugin: parametrizes the generic property tests over a binding and writes the report.

Loaded by ``rlconform check`` (``-p rlconform.harness.run.pytest_plugin``); usable directly::

    pytest -p rlconform.harness.run.pytest_plugin --rlconform-engine verl --pyargs rlconform.properties

Every test id is a finding id (``op.property.dtype.regime``). After each test the finding is added to
``report.json`` (rewritten atomically), so an interrupted run keeps what it found.

Process isolation. Under pytest-xdist (``-n N``; ``rlconform check`` always uses it) the
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
  (:meth:`rlconform.harness.report.writer.ReportWriter.seal`).

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

from rlconform.harness.catalog.binding import BindingError
from rlconform.harness.core import torch_state
from rlconform.harness.core.opinfo import FINDING_ID
from rlconform.harness.run.plugin_controller import (  # noqa: F401
    PROGRESS_EVERY_S,
    _ledger_verdicts,
    progress_line,
    pytest_configure_node,
    pytest_handlecrashitem,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_sessionstart,
    pytest_testnodedown,
    pytest_testnodeready,
    pytest_xdist_node_collection_finished,
)
from rlconform.harness.run.plugin_state import (  # noqa: F401 - STATE_KEY: where the state hangs
    CONTROLLER_STATE as _CONTROLLER_STATE,
)
from rlconform.harness.run.plugin_state import (
    STATE_KEY,
    is_controller,
    is_worker,
    state_of,
)

# the two halves' hooks and fixtures: pytest registers what this module holds
from rlconform.harness.run.plugin_worker import (  # noqa: F401
    pytest_runtest_call,
    pytest_runtest_makereport,
    rlconform_binding,
    rlconform_finding,
    rlconform_state,
)
from rlconform.harness.run.selection import selected_findings
from rlconform.harness.workers import interrupts

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
                help="judge in a referee process that never imports the engine; the default, "
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


class _EngineInfo:
    """The engine as the controller knows it (from ``--rlconform-engine-meta``): data, no code."""

    def __init__(self, meta: dict):
        self.name, self.spec, self.version = meta["name"], meta["spec"], meta.get("version")
        self.path, self.revision = meta.get("path"), meta.get("revision")
        self._ops = list(meta["ops"])
        self.variants = meta.get("variants") or {}
        self.variant_record = meta.get("variant_record") or {}
        self.engine_dtypes = meta.get("engine_dtypes") or {}  # op -> dtypes the trainer uses
        self.declared_rows = meta.get("declared") or []  # conventions, preconditions, guards (data)
        self.variant_triggers = meta.get("variant_triggers") or {}  # configurations as triggers (for reachability)
        self.impact_knobs = meta.get("impact_knobs") or {}  # op -> the config key its training impact depends on
        self._remedies = meta.get("remedies") or {}  # function -> the cause and fix of its defects (data)
        self._configs = meta.get("configs") or {}  # which configuration reaches each op (data)
        self.changed_since = meta.get("changed_since")  # --changed-since: the revision and the changed call paths
        self.coverage = meta.get("coverage")  # the coverage table, built in the probe's child process

    def provided_ops(self) -> list[str]:
        return list(self._ops)

    def remedy_table(self) -> dict:
        return self._remedies

    def config_table(self) -> dict:
        return self._configs


class State:
    """Per-session state: the binding, selection filters, ledger, settings; in the controller the
    report writer and the bookkeeping of findings; in a worker the in-flight record and deadline."""

    def __init__(self, config):
        from rlconform.harness.bindings.load import load_engine
        from rlconform.harness.core.profiles import settings_for
        from rlconform.harness.report.xfails import Ledger, parse_ledger

        opt = config.getoption
        self.config = config
        self.worker = is_worker(config)
        if self.worker:  # before the engine loads: Ctrl-C is the controller's; a KeyboardInterrupt here the engine's
            interrupts.ignore_sigint()
        self.controller = is_controller(config)
        self.referees: dict = {}  # controller: worker id -> its referee
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
        self._selected: frozenset[str] | None = None  # what the filters select: fixed for the run
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
        if referee:  # the verdicts are the referee's
            from rlconform.properties import referee as judge

            judge.connect(referee[0], bytes.fromhex(referee[1]))

    # -- controller (or a single process) ----------------------------------------------------------
    def _start_writer(self, opt) -> None:
        from rlconform.harness.report.writer import ReportWriter
        from rlconform.harness.run.outdir import OutDirError, claim

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
                    "variant_triggers": {op: dict(v) for op, v in (getattr(b, "variant_triggers", None) or {}).items()},
                    "impact_knobs": {op: dict(v) for op, v in (getattr(b, "impact_knobs", None) or {}).items()},
                    "remedies": getattr(b, "remedy_table", dict)(),
                    "configs": getattr(b, "config_table", dict)(),
                    **({"changed_since": b.changed_since} if getattr(b, "changed_since", None) else {})},
            run={"profile": opt("rlconform_profile"), "seed": self.seed,
                 "max_examples": self.settings.max_examples,
                 "max_shrinks": {"per_finding": self.shrink_budget(""), "ledger_listed": self.shrink_budget_listed()},
                 "command": opt("rlconform_command") or " ".join(sys.argv),
                 "narrowed": bool(self.dtypes or self.regimes),
                 # who judged: the referee (a process that never imports the engine), or the engine's own process
                 # (--no-referee; rlconform's own reference and mutants by default)
                 "judged_by": "referee" if self.use_referee else "engine process",
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
            if self._selected is None:  # read once: the progress line asks after every finding
                self._selected = frozenset(".".join(f) for f in selected_findings(
                    self.binding.provided_ops(), self.ops, self.properties, self.dtypes, variants=self.variants(),
                    profile=self.profile, regimes=self.regimes, findings=self.findings))
            ids |= self._selected
        return ids

    def start_referee(self, node) -> None:
        """Controller: the referee of worker ``node``, started before the worker imports the engine."""
        from rlconform.harness.run.dispatch import referee_judge
        from rlconform.harness.workers import referee
        from rlconform.properties import referee as judge

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
        from rlconform.harness.run.dispatch import referee_judge
        from rlconform.harness.workers import referee
        from rlconform.properties import referee as judge

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
    if not is_worker(config):
        config._rlconform_own_handlers = interrupts.install()
    try:
        setattr(config, STATE_KEY, State(config))
    except BindingError as exc:
        raise pytest.UsageError(f"rlconform: {exc}") from None
    if config.getoption("rlconform_engine_meta", None):
        _without_forced_collection(config)


def _without_forced_collection(config) -> None:
    """A check's own pytest session (``rlconform check``: the controller and each engine worker) ends without
    the full garbage collections pytest forces to flush unraisable exceptions (two per process, about 0.1 s each
    with torch loaded; most of what ends a narrowed check), as pytest's own pytester does for inner runs. An
    unraisable exception still becomes pytest's warning when it is raised; one held in a reference cycle is
    reported by Python when the process ends. Nothing changes where pytest keeps the setting elsewhere."""
    try:
        from _pytest.unraisableexception import gc_collect_iterations_key
    except ImportError:
        return
    config.stash[gc_collect_iterations_key] = 0


def pytest_unconfigure(config):
    state = _state(config)
    if state is not None:
        state.close()
        if _CONTROLLER_STATE.get("state") is state:
            del _CONTROLLER_STATE["state"]
    if getattr(config, "_rlconform_own_handlers", False):
        interrupts.uninstall()


def _state(config) -> State | None:
    return state_of(config)



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



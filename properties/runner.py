"""Running one finding (``op.property.dtype.regime``) under hypothesis: shared by the generic property
tests and the distributed tests.

Resolves the op (an unavailable one — an import that fails, a kernel that needs CUDA on a CPU run — is
skipped and recorded ``unavailable``), replays the corpus of saved
counterexamples first, then draws examples, records each outcome in the finding recorder and raises
:class:`PropertyFailure` with a uniform message and a reproducer command when an example is a
``discrepancy`` (beyond the margin band of :func:`rlconform.harness.core.tolerance.verdict`; a
``marginal`` example is recorded and the search goes on). No ``target()``: the examples a check draws
never depend on the engine's output bits, so every machine draws the same ones (``rlconform fuzz``
climbs the error / tolerance ratio instead).

What a failure is, and what it costs:

* a discrepancy (:class:`PropertyFailure`) and an engine that raised (:class:`EngineCrash`) are shrunk
  by hypothesis, within the finding's shrinking budget (``state.shrink_budget(finding_id)``, see
  :func:`rlconform.harness.core.profiles.shrink_budget`, listed in the xfails ledger or not); past it
  the smallest failure found so far is the finding's failure and reproducer;
* a distributed case whose rank died, hung or raised (an ``EngineCrash`` caused by
  :class:`~rlconform.harness.workers.pool.RankFailure`) is *not* shrunk: every replay would respawn the worker
  pool (seconds each) or wait out a deadline (minutes). The finding fails at once with that case;
* an engine that raises ``KeyboardInterrupt`` / ``SystemExit`` (no interrupt received) is a crash
  (:class:`EngineAbort`), not shrunk either;
* an exception of the check itself while reading the engine's output (a returned object of the wrong
  type or shape) is an engine crash too (:class:`CheckRaised`); one raised by rlconform's yardstick
  (reference, faithful path, tolerance, comparison: :mod:`rlconform.harness.core.blame`) on whatever the
  engine returned is rlconform's (:class:`~rlconform.harness.core.blame.OwnCodeRaised`); an error anywhere
  else (strategy, corpus, the referee that could not judge: :class:`~rlconform.properties.referee.RefereeError`)
  is the harness's, reported
  as such by the plugin (status ``error``, exit 2), never as the engine's crash, and not shrunk.
"""

from __future__ import annotations

import hashlib
import os
import shlex

import pytest
from hypothesis import given, seed, settings

from rlconform.harness.catalog.binding import BindingError, OpUnavailable, VariantNotProvided
from rlconform.harness.catalog.ops import OPS
from rlconform.harness.core.blame import OwnCodeRaised, own_code_raised
from rlconform.harness.core.evaluation import EngineCrash
from rlconform.harness.core.profiles import capped_settings, example_cap
from rlconform.harness.core.unbound import unbound
from rlconform.harness.workers import interrupts
from rlconform.harness.workers.pool import PoolStartupError, RankFailure
from rlconform.properties.binding_errors import adapter_error
from rlconform.properties.case import Case, CaseError
from rlconform.properties.checks import PropertyFailure
from rlconform.properties.corpus import replay_corpus
from rlconform.properties.referee import RefereeError


class CheckRaised(Exception):
    """The check raised (not the engine's call itself) while handling what the engine returned."""

    def __init__(self, case: Case, exc: BaseException):
        super().__init__(f"checking {case.finding_id} raised {type(exc).__name__}: {exc} (on what the engine "
                         f"returned: an output of an unexpected type or shape is the likely cause)")


class EngineAbort(Exception):
    """The engine raised ``KeyboardInterrupt`` or ``SystemExit`` while no interrupt was received (see
    :func:`rlconform.harness.workers.interrupts.engine_raised`): the finding's crash, not an interrupt of the run."""

    def __init__(self, exc: BaseException):
        super().__init__(f"the engine raised {type(exc).__name__}({str(exc)!r}) (no Ctrl-C or SIGTERM was "
                         f"received: this is the engine's doing, not an interrupt of the run)")


class AdapterError(Exception):
    """The binding's own adapter raised (:mod:`rlconform.properties.binding_errors`): status
    ``binding_error``."""


class NoShrink(BaseException):
    """Carries a failure past hypothesis without shrinking it (hypothesis only catches ``Exception``,
    ``SystemExit`` and ``GeneratorExit``); :func:`run_finding` re-raises ``failure``."""

    def __init__(self, failure: BaseException):
        super().__init__(str(failure))
        self.failure = failure


#: what hypothesis' derandomized seed of a finding was made of (``hypothesis.internal.reflection.
#: function_digest`` of the ``run`` function below: its source as ``inspect.getsource`` read it, comments
#: stripped, and its signature), frozen here so that every finding keeps the examples it always drew while
#: the seed no longer depends on the file on disk (see :func:`finding_seed`)
_SEED_SOURCE = (b"    @hsettings\n    @given(inputs=strategy)\n    def run(inputs):\n"
                b"        check_one(Case(op, prop, dtype, regime, inputs))")
_SEED_SIGNATURE = b"<Signature (inputs)>"


def finding_seed(finding_id: str, run_seed: int | None = None) -> int:
    """The hypothesis seed of one finding: ``--seed`` when given, else a hash of the finding id and of
    constants, nothing else — the same on every machine, in every process, whatever ran before and
    whatever the runner's file on disk says. (Hypothesis' own derandomized seed hashes the test
    function's source as ``inspect.getsource`` reads it when the finding starts, and that re-reads the
    file whenever it changed: an edit, a checkout or a merge of this file during a run moved the examples
    of every later finding.) Equal to that seed for the source this file had, so the examples are the
    ones ``check`` always drew."""
    if run_seed is not None:
        return run_seed
    digest = hashlib.sha384(_SEED_SOURCE + _SEED_SIGNATURE + finding_id.encode()).digest()
    return int.from_bytes(digest, "big")


def replay_command(case_file: str, spec: str | None, engine_path: str | None = None) -> str:
    """The one command that re-runs a saved case on the engine it failed on (``replay`` never takes the
    engine from the case file)."""
    cmd = ["rlconform", "replay", case_file]
    if spec:
        cmd += ["--engine", spec]
    if engine_path:
        cmd += ["--engine-path", engine_path]
    return " ".join(shlex.quote(c) for c in cmd)


def failure_message(rec, case: Case, message: str) -> str:
    """The uniform failure text: finding id, engine, what failed, the input, the reproducer."""
    b = rec.state.binding
    case_path = os.path.join(rec.state.out, "cases", f"{case.finding_id}.json")
    return (f"{case.finding_id}: discrepancy (engine {b.spec})\n  {message.strip()}\n"
            f"  input: {case.summary()}\n"
            f"  reproduce: {replay_command(os.path.relpath(case_path), b.spec, b.path)}")


def run_finding(binding, finding, rec, state, strategy, *, check) -> None:
    """Check one finding ``(op, property, dtype, regime)`` of ``binding`` with inputs from ``strategy``;
    ``check(binding, case) -> Outcome`` judges one case (:func:`rlconform.properties.checks.run_check`,
    or :func:`rlconform.distributed_tests.checks.run_check` for the distributed families).
    An expensive regime's examples and shrinking steps are capped by the op's
    :meth:`~rlconform.harness.core.opinfo.OpInfo.example_cap` (real sizes: a few derandomized examples, never
    shrunk)."""
    op, prop, dtype, regime = finding
    try:
        # a stage transcribed from the engine instead of called is named on every finding
        rec.transcribed = getattr(binding.resolve(op), "transcribed", None)
    except OpUnavailable as exc:
        # the cause first ("op 'x' unavailable: ModuleNotFoundError: …"), then the traceback's tail
        rec.unavailable_detail = f"{exc}\n{exc.detail[-3000:]}"
        rec.unbound = unbound(exc.op, "unavailable", rec.unavailable_detail)
        pytest.skip(str(exc))
    except BindingError as exc:
        rec.unavailable_detail = f"binding error: {exc}"
        rec.binding_error = str(exc)
        rec.unbound = unbound(op, "binding_error", str(exc))
        pytest.skip(str(exc))

    provided = binding.provided_implementations(op) if hasattr(binding, "provided_implementations") else ()
    impl = regime.split("@", 1)[0] if "@" in regime and regime.split("@", 1)[0] in provided else None
    gap = binding.device_gap(op, regime) if hasattr(binding, "device_gap") else None
    if gap is not None:  # a CUDA-only kernel on a CPU run: unavailable with its reason, never skipped
        rec.unavailable_detail = f"op {op + '@' + impl if impl else op!r} unavailable: {gap}"
        rec.unbound = dict(unbound(op + "@" + impl if impl else op, "unavailable", ""), missing="a CUDA device")
        rec.needs = "cuda"
        pytest.skip(rec.unavailable_detail)
    if impl is not None:
        # an implementation this engine release lacks (its import or lookup fails) is unavailable for
        # that implementation, said here in the parent, as for the op itself (the referee's stand-in of the
        # binding holds only the implementations that resolve: it would answer VariantNotProvided)
        try:
            binding.resolve_implementation(op, impl)
        except OpUnavailable as exc:
            rec.unavailable_detail = f"{exc}\n{exc.detail[-3000:]}"
            rec.unbound = unbound(f"{op}@{impl}", "unavailable", rec.unavailable_detail)
            pytest.skip(str(exc))

    budget = getattr(state, "shrink_budget", None)
    max_shrinks = budget(rec.id) if callable(budget) else None
    profile = getattr(state, "profile", None)
    cap = OPS[op].example_cap(regime, profile) if op in OPS else example_cap(regime, profile=profile)
    if cap is not None and cap.max_shrinks is not None:
        max_shrinks = cap.max_shrinks if max_shrinks is None else min(max_shrinks, cap.max_shrinks)
    last: dict = {"failure": None}  # the latest (hence smallest) failure hypothesis accepted

    def check_one(case: Case):
        interrupts.check()  # an interrupt something swallowed (e.g. hypothesis' gc callback) stops here
        if last["failure"] is not None and max_shrinks is not None and rec.shrink_steps >= max_shrinks:
            raise NoShrink(last["failure"])  # shrinking budget spent: the smallest failure so far stands
        rec.start(case)
        try:
            outcome = check(binding, case)
        except EngineCrash as exc:
            adapter = adapter_error(binding, getattr(exc, "where", op), exc.__cause__) \
                if exc.__cause__ is not None else None
            if adapter is not None:  # the binding does not fit this engine version; no crash
                rec.adapter_error = rec.binding_error = adapter
                err = AdapterError(adapter)
                err.__cause__ = exc.__cause__
                raise NoShrink(err) from None
            rec.crashed()
            if isinstance(exc.__cause__, RankFailure):
                raise NoShrink(exc) from exc
            last["failure"] = exc
            raise
        except (BindingError, OpUnavailable, VariantNotProvided, CaseError, PoolStartupError):  # not the engine's fault
            raise
        except (RefereeError, OwnCodeRaised) as exc:  # rlconform's own: status `error`, exit 2; never shrunk
            raise NoShrink(exc) from exc
        except (KeyboardInterrupt, SystemExit) as exc:
            if not interrupts.engine_raised(exc):
                raise
            rec.crashed()
            raise NoShrink(EngineAbort(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - see CheckRaised
            where = own_code_raised(exc)
            if where is not None:  # rlconform's yardstick raised on the engine's data: its error, not a crash
                raise NoShrink(OwnCodeRaised(where, f"{type(exc).__name__}: {exc}")) from exc
            rec.crashed()
            last["failure"] = CheckRaised(case, exc)
            raise last["failure"] from exc
        rec.observe(outcome)
        if outcome.verdict == "discrepancy":  # a marginal example is recorded, never shrunk or failed
            last["failure"] = PropertyFailure(failure_message(rec, case, outcome.message))
            raise last["failure"]
        return outcome

    # one failure per finding: with several distinct ones hypothesis would raise a group, in which a failure
    # whose shrinking budget ran out is a bare NoShrink (the finding would read as a harness error)
    hsettings = settings(capped_settings(state.settings, cap, getattr(state, "seed", None) is not None),
                         report_multiple_bugs=False)

    @hsettings
    @given(inputs=strategy)
    def run(inputs):
        check_one(Case(op, prop, dtype, regime, inputs))
        # no target(): in `check` the examples never depend on the engine's output bits (which differ between
        # CPUs), so every machine draws the same ones; guided generation is `rlconform fuzz`'s

    # one example-database key per finding (one test function serves every finding)
    run.hypothesis.inner_test._hypothesis_internal_add_digest = rec.id.encode()
    if state.seed is not None or hsettings.derandomize:
        # the finding's seed (finding_seed), never hypothesis' digest of this function's source on disk
        run = seed(finding_seed(rec.id, state.seed))(run)
    try:
        replay_corpus(state.corpus, rec.id, check_one)
        run()
    except NoShrink as exc:
        raise exc.failure

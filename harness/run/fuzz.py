"""``rlconform fuzz``: the generic properties under a wall-clock or example budget, for new reduction code.

    rlconform fuzz --engine X [--op Y] [--property P] [--dtype D] [--minutes N] [--max-examples K]
                   [--corpus DIR] [--db DIR]

The same checks as ``rlconform check`` (:func:`rlconform.properties.checks.run_check` on cases drawn by
:func:`rlconform.harness.catalog.ops.strategy_for`), driven by hypothesis directly rather than
through pytest, over every selected finding (op × property × dtype × regime):

1. the corpus is replayed first: a finding whose saved case still fails is *known* and not fuzzed;
2. round 0 runs a few examples of every finding, ops interleaved, so each gets looked at early;
3. later rounds give each finding still without a counterexample a time slice that doubles every
   round, the findings whose error / tolerance came closest to 1 first, until the budget is spent.

With ``--max-examples K`` the budget is a number of examples instead: every finding gets up to ``K``
generated examples (round 0, then slices of 8, 16, 32 … examples, closest to failing first) and the run
ends when each has had its ``K`` or a counterexample; shrinking a counterexample is bounded by
hypothesis' own limits, not by a clock. ``--minutes`` / ``--seconds``, when also given, stay an upper
bound. What such a run finds depends on the examples drawn (``--seed`` fixes them), never on the speed
of the machine: that is what the tests use.

Hypothesis keeps a persistent example database (``--db``, default ``.rlconform-fuzz-db``; one key per
finding), so failing examples and the ``target()`` Pareto front (error / tolerance, climbed by
hypothesis' optimiser) carry over between slices and between runs. A counterexample is shrunk (for up
to ``--shrink-seconds``, possibly past the budget) and saved under ``<corpus>/<finding id>/`` (default
``rlconform-corpus/``), which ``rlconform check`` replays before drawing new examples.

Ctrl-C (or SIGTERM) stops at once and keeps what was found (a counterexample being shrunk is saved as
shrunk so far); an interrupt something swallowed (hypothesis' gc callback) is noticed at the next example.

The engine runs in a child process (:func:`rlconform.harness.workers.isolated.run_isolated`), never in the process
that decides the exit code: when the engine ends its process (``os._exit``, a signal, the OOM killer) or
hangs past ``--timeout`` seconds in one engine call, the finding being fuzzed is reported as a crash (with
how the process ended and its stack) and fuzzing goes on in a fresh child for the rest of the budget.
An engine that raises ``KeyboardInterrupt`` / ``SystemExit`` gets a counterexample like any crash.

Exit codes: 0 no counterexample, 1 counterexamples (new, or saved ones that still fail) or findings
whose engine crashed its process, 2 usage or binding error, 130 interrupted before anything was found.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import sys
import time

EXIT_CLEAN, EXIT_FOUND, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
DEFAULT_TIMEOUT_S = 900  # seconds one example may take before the engine is considered hung
DEFAULT_DB = ".rlconform-fuzz-db"
DEFAULT_CORPUS = "rlconform-corpus"
ROUND0_EXAMPLES = 4      # examples per finding in the first, breadth-first round
FIRST_SLICE_S = 0.25     # time slice per finding in round 1; doubles every round


class _Stop(KeyboardInterrupt):
    """Raised inside the hypothesis test to end a slice. Hypothesis lets a KeyboardInterrupt through
    without saving the interrupted example to the database (any other BaseException would be saved as
    a failure, and a later run would replay it as an already-shrunk counterexample)."""


@dataclasses.dataclass
class Target:
    """One finding being fuzzed and what fuzzing has learnt about it."""

    op: str
    prop: str
    dtype: str
    regime: str
    status: str = "live"          # live | found | known | unavailable | error
    examples: int = 0
    seconds: float = 0.0
    best_ratio: float = 0.0       # worst error / tolerance seen (inf: a failure without a numeric bound)
    message: str = ""
    error_of: str = ""            # whose error an ``error`` is: "binding", "referee" (could not judge), "harness"
    saved: str | None = None      # corpus file of the counterexample
    new: bool = False             # the counterexample was not in the corpus before this run
    shrunk: bool = True           # False when shrinking was cut short (budget or Ctrl-C)
    found_after_examples: int | None = None   # this finding's examples up to its first failure
    found_after_seconds: float | None = None  # wall time since the fuzz started
    found_after_total_examples: int | None = None
    granted: int = 0              # generated examples granted to its slices so far (the example budget)
    shrink_replays: int = 0       # examples hypothesis replayed while shrinking a counterexample (not generated)

    @property
    def id(self) -> str:
        return f"{self.op}.{self.prop}.{self.dtype}.{self.regime}"

    def per_example(self) -> float:
        return self.seconds / self.examples if self.examples else 0.005


def _interleave(lists: list[list]) -> list:
    out = []
    for i in range(max((len(x) for x in lists), default=0)):
        out.extend(x[i] for x in lists if i < len(x))
    return out


def select_targets(binding, ops=(), properties=(), dtypes=()) -> list[Target]:
    """The findings the binding provides, filtered, in breadth-first order: ops interleaved; within an
    op its properties, and within a property its regimes, so that round 0 looks at every op × property
    × regime early."""
    from rlconform.harness.catalog.ops import OPS
    from rlconform.harness.run.selection import selected_findings

    variants = None
    if hasattr(binding, "provided_variants"):  # a loaded binding: resolve its registries
        from rlconform.harness.bindings.load import variant_info

        variants = variant_info(binding)[0]
    chosen = selected_findings(binding.provided_ops(), ops, properties, dtypes, variants=variants)
    per_op = []
    for op in OPS.values():
        mine = [f for f in chosen if f[0] == op.name]
        per_prop = []
        for prop in op.properties:
            per_regime: dict[str, list[str]] = {}
            for _, p, dtype, regime in mine:
                if p == prop:
                    per_regime.setdefault(regime, []).append(dtype)
            cases = _interleave([[(d, r) for d in ds] for r, ds in per_regime.items()])
            per_prop.append([Target(op.name, prop, d, r) for d, r in cases])
        ts = _interleave(per_prop)
        if ts:
            per_op.append(ts)
    return _interleave(per_op)


class Fuzzer:
    """Round-robin fuzzing of ``targets`` against ``binding`` for ``seconds`` of wall time."""

    def __init__(self, binding, targets: list[Target], *, seconds: float, corpus: str, db: str | None,
                 seed: int | None = None, shrink_seconds: float | None = None, on_found=None, on_tick=None,
                 on_current=None, example_timeout: float | None = None, max_examples: int | None = None):
        self.binding = binding
        self.targets = targets
        self.budget = float(seconds)  # math.inf: no time limit (an example budget, ``max_examples``)
        self.max_examples = max_examples
        self.corpus = corpus
        self.db = db
        if shrink_seconds is None:
            shrink_seconds = math.inf if max_examples is not None else min(60.0, max(5.0, 0.25 * seconds))
        self.shrink_seconds = shrink_seconds
        self.rng = random.Random(seed)
        self.seeded = seed is not None
        self.on_found = on_found or (lambda t: None)
        self.on_tick = on_tick or (lambda: None)
        self.on_current = on_current or (lambda t: None)  # the finding now fuzzed (a crash is blamed on it)
        self.example_timeout = example_timeout  # seconds one engine call may take (set_engine_call_deadline)
        self.total_examples = 0
        self.total_shrink_replays = 0
        self.round = 0
        self.current: Target | None = None
        self.interrupted = False
        self.t0 = time.monotonic()
        self._settings = None

    # -- helpers ----------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def remaining(self) -> float:
        return self.budget - self.elapsed()

    def live(self) -> list[Target]:
        """Findings still without a counterexample (and, under an example budget, with examples left)."""
        return [t for t in self.targets if t.status == "live" and self.allowance(t) > 0]

    def allowance(self, t: Target) -> float:
        """Generated examples ``t`` may still have (inf: no example budget)."""
        return math.inf if self.max_examples is None else self.max_examples - t.granted

    def settings(self):
        if self._settings is None:
            from hypothesis import HealthCheck, Phase, Verbosity, settings
            from hypothesis.database import DirectoryBasedExampleDatabase

            db = DirectoryBasedExampleDatabase(self.db) if self.db else None
            self._settings = settings(deadline=None, database=db, derandomize=False, report_multiple_bugs=False,
                                      suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet,
                                      print_blob=False, max_examples=ROUND0_EXAMPLES,
                                      phases=[p for p in Phase if p != Phase.explain])
        return self._settings

    # -- the run ----------------------------------------------------------------------------------
    def run(self) -> None:
        from rlconform.harness.workers.isolated import set_engine_call_deadline

        set_engine_call_deadline(self.example_timeout)  # a hung engine call ends this process (module docstring)
        try:
            self._resolve_ops()
            self._replay_corpus()
            for t in self.live():  # round 0: breadth first
                if self.remaining() <= 0:
                    break
                self._slice(t, int(min(ROUND0_EXAMPLES, self.allowance(t))), self.t0 + self.budget)
            slice_s, slice_n = FIRST_SLICE_S, 2 * ROUND0_EXAMPLES
            while self.remaining() > 0 and self.live():
                self.round += 1
                order = sorted(self.live(), key=lambda t: (-t.best_ratio, t.examples))
                for t in order:
                    left = self.remaining()
                    if left <= 0:
                        break
                    if self.max_examples is not None:  # an example budget: slices by count, no clock
                        self._slice(t, int(min(slice_n, self.allowance(t))), self.t0 + self.budget)
                        continue
                    s = min(slice_s, left)
                    self._slice(t, max(5, int(s / t.per_example())), time.monotonic() + s)
                slice_s *= 2
                slice_n *= 2
        except KeyboardInterrupt:
            self.interrupted = True
        finally:
            set_engine_call_deadline(None)
            self.current = None

    def _resolve_ops(self) -> None:
        from rlconform.harness.catalog.binding import BindingError, OpUnavailable

        seen: dict[str, tuple[str, str] | None] = {}
        for t in self.targets:
            if t.op not in seen:
                try:
                    self.binding.resolve(t.op)
                    seen[t.op] = None
                except OpUnavailable as exc:
                    seen[t.op] = ("unavailable", str(exc), "")
                except BindingError as exc:
                    seen[t.op] = ("error", f"binding error: {exc}", "binding")
            if seen[t.op] is not None:
                t.status, t.message, t.error_of = seen[t.op]
                continue
            gap = self.binding.device_gap(t.op, t.regime) if hasattr(self.binding, "device_gap") else None  # a CUDA-only kernel on a CPU run
            if gap is not None:
                t.status, t.message = "unavailable", f"op {t.op!r} unavailable: {gap}"

    def _replay_corpus(self) -> None:
        from rlconform.harness.core.evaluation import EngineCrash
        from rlconform.harness.run.dispatch import run_check
        from rlconform.harness.workers import interrupts
        from rlconform.properties.case import load_case
        from rlconform.properties.corpus import corpus_files
        from rlconform.properties.runner import EngineAbort

        for t in self.live():
            for path in corpus_files(self.corpus, t.id):
                self.current = t
                self.on_current(t)
                try:
                    case = load_case(path)
                    outcome = run_check(self.binding, case)
                    bad, msg = outcome.verdict == "discrepancy", outcome.message
                except EngineCrash as exc:
                    bad, msg = True, str(exc)
                except (KeyboardInterrupt, SystemExit) as exc:
                    if not interrupts.engine_raised(exc):
                        raise
                    bad, msg = True, f"crash: {EngineAbort(exc)}"
                except (OSError, ValueError, KeyError) as exc:
                    print(f"rlconform fuzz: skipping unreadable corpus file {path}: {exc}", file=sys.stderr)
                    continue
                if bad:
                    t.status, t.saved, t.message, t.new = "known", path, msg, False
                    self.on_found(t)
                    break

    def _slice(self, t: Target, max_examples: int, deadline: float) -> None:
        """Run hypothesis on ``t`` for at most ``max_examples`` examples or until ``deadline``; shrink and
        save a counterexample if one turns up."""
        from hypothesis import given, seed, settings, target

        from rlconform.harness.catalog.ops import strategy_for
        from rlconform.harness.core.evaluation import EngineCrash
        from rlconform.harness.run.dispatch import run_check
        from rlconform.harness.workers import interrupts
        from rlconform.properties.case import Case
        from rlconform.properties.checks import PropertyFailure
        from rlconform.properties.referee import RefereeError
        from rlconform.properties.runner import EngineAbort

        state = {"fail": None, "message": "", "deadline": deadline}
        t.granted += max_examples
        self.current = t
        self.on_current(t)
        start = time.monotonic()

        def run(inputs):
            interrupts.check()  # an interrupt swallowed somewhere (hypothesis' gc callback) stops here
            now = time.monotonic()
            if now > state["deadline"]:
                raise _Stop()
            case = Case(t.op, t.prop, t.dtype, t.regime, inputs)
            if state["fail"] is None:  # a generated example (what --max-examples counts)
                t.examples += 1
                self.total_examples += 1
            else:  # a replay of the shrinker: counted apart
                t.shrink_replays += 1
                self.total_shrink_replays += 1
            # each engine call of the example may take example_timeout s (set_engine_call_deadline): a
            # hung engine ends this process, the supervisor reports it; the referee's judgment, generation
            # and shrinking are not the engine's time
            try:
                outcome = run_check(self.binding, case)
            except EngineCrash as exc:
                self._failed(t, state, case, f"crash: {exc}")
                raise
            except RefereeError as exc:  # rlconform's own: the finding is `error`, not shrunk (no counterexample)
                state["referee_error"] = exc
                raise _Stop() from exc
            except (KeyboardInterrupt, SystemExit) as exc:
                if not interrupts.engine_raised(exc):
                    raise
                abort = EngineAbort(exc)
                self._failed(t, state, case, f"crash: {abort}")
                raise EngineCrash(f"{t.op}", abort) from exc
            finally:
                self.on_tick()
            t.best_ratio = max(t.best_ratio, outcome.ratio)
            if outcome.verdict == "discrepancy":  # as in `check`: a marginal example is not a counterexample
                self._failed(t, state, case, outcome.message)
                raise PropertyFailure(outcome.message)
            target(min(outcome.ratio, 1e6), label="error / tolerance")

        # one database key per finding (the function's source is the same for all of them)
        run._hypothesis_internal_add_digest = t.id.encode()
        test = settings(self.settings(), max_examples=max_examples)(
            given(inputs=strategy_for(t.op, t.dtype, t.regime))(run))
        if self.seeded:
            test = seed(self.rng.getrandbits(64))(test)
        try:
            test()
        except _Stop:
            if state["fail"] is not None:
                t.shrunk = False
        except KeyboardInterrupt:
            if state["fail"] is not None:
                t.shrunk = False
                self._save(t, state)
            raise
        except Exception as exc:  # noqa: BLE001 - the property failed (shrunk), or the harness broke
            if state["fail"] is None:
                t.status, t.error_of = "error", "harness"
                t.message = f"{type(exc).__name__}: {exc}"[:2000]
        finally:
            t.seconds += time.monotonic() - start
        if state.get("referee_error") is not None and state["fail"] is None:
            t.status, t.message, t.error_of = "error", str(state["referee_error"])[:2000], "referee"
        if state["fail"] is not None:
            self._save(t, state)

    def _failed(self, t: Target, state: dict, case, message: str) -> None:
        if state["fail"] is None:  # first failure: now shrinking, on a budget of its own
            t.found_after_examples = t.examples
            t.found_after_seconds = self.elapsed()
            t.found_after_total_examples = self.total_examples
            state["deadline"] = time.monotonic() + self.shrink_seconds
        state["fail"], state["message"] = case, message  # the shrinker only accepts smaller failures

    def _save(self, t: Target, state: dict) -> None:
        from rlconform.properties.corpus import save_to_corpus

        case = state["fail"]
        path = save_to_corpus(self.corpus, case)
        t.status, t.message = "found", state["message"]
        if path is None:  # the same case is there already
            from rlconform.properties.corpus import corpus_path

            t.saved, t.new = corpus_path(self.corpus, case), False
        else:
            t.saved, t.new = path, True
        self.on_found(t)


# ------------------------------------------------------------------------------------------------
# the command


def add_parser(sub) -> None:
    import argparse

    f = sub.add_parser("fuzz", help="fuzz an engine's ops for a time budget; save counterexamples to a corpus")
    f.add_argument("--engine", default=None, help="reference | verl | skyrl | megatron | mutants.<family> | "
                                                 "module:attr | file.py (default: $RLCONFORM_ENGINE or reference)")
    f.add_argument("--engine-path", default=None, help="a fork's checkout, put first on sys.path")
    from rlconform.harness.core.device import add_argument as add_device_argument

    add_device_argument(f)
    f.add_argument("--op", action="append", default=[], help="only this op (repeatable)")
    f.add_argument("--property", action="append", default=[], help="only this property (repeatable)")
    f.add_argument("--dtype", action="append", default=[], help="only this dtype (repeatable)")
    f.add_argument("--minutes", type=float, default=None, help="wall-clock budget (default 5; fractions allowed)")
    f.add_argument("--seconds", type=float, default=None, help=argparse.SUPPRESS)
    f.add_argument("--max-examples", type=int, default=None,
                   help="an example budget: up to this many generated examples per finding, whatever the speed "
                        "of the machine (with --minutes: whichever ends first; without: no time limit)")
    f.add_argument("--corpus", default=DEFAULT_CORPUS, help="counterexamples are saved here, one folder per "
                                                           "finding; `check` replays them (default: %(default)s)")
    f.add_argument("--db", default=DEFAULT_DB, help="persistent hypothesis example database (default: %(default)s)")
    f.add_argument("--seed", type=int, default=None, help="random seed")
    f.add_argument("--shrink-seconds", type=float, default=None,
                   help="time to shrink one counterexample (default: a quarter of the budget, 5–60 s; with "
                        "--max-examples and no time budget, hypothesis' own limits only)")
    f.add_argument("--stats", default=None, help="also write per-finding statistics as JSON here")
    f.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help="seconds one engine call may take before the engine is considered hung (default %(default)s)")
    f.add_argument("-q", "--quiet", action="store_true", help="no live progress display")
    from rlconform.harness.run.referee_flag import add_argument as add_referee_argument

    add_referee_argument(f)


def _validate(args) -> str | None:
    from rlconform.harness.catalog.ops import FLOAT_DTYPES, OPS, PROPERTIES

    for kind, values, known in (("op", args.op, OPS), ("property", args.property, PROPERTIES),
                                ("dtype", args.dtype, FLOAT_DTYPES)):
        for v in values:
            if v not in known:
                return f"unknown {kind} {v!r}; choose from {', '.join(known)}"
    return None


def _progress(fz: Fuzzer, spec: str):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    ts = fz.targets
    found = [t for t in ts if t.status in ("found", "known")]
    live = fz.live()
    el = fz.elapsed()
    rate = fz.total_examples / el if el > 0 else 0.0
    head = Text.assemble(
        ("fuzzing ", "bold"), (spec, "bold cyan"),
        f" · {min(el, fz.budget):5.1f}" + (f"/{fz.budget:.0f}" if math.isfinite(fz.budget) else "") + f" s · round {fz.round} · {fz.total_examples} examples "
        f"({rate:.0f}/s) · findings: {len(live)} live, ", (f"{len(found)} with counterexamples",
                                                          "bold red" if found else "green"),
        f", {len(ts)} in all")
    cur = Text(f"  now: {fz.current.id if fz.current else '–'}", style="dim")
    table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
    table.add_column("closest to failing (error / tolerance)")
    table.add_column("examples", justify="right")
    table.add_column("err/tol", justify="right")
    for t in sorted(live, key=lambda t: -t.best_ratio)[:6]:
        table.add_row(t.id, str(t.examples), f"{t.best_ratio:.3g}")
    return Group(head, cur, table)


def _print_summary(console, fz: Fuzzer, spec: str) -> None:
    found = [t for t in fz.targets if t.status in ("found", "known")]
    el = fz.elapsed()
    ran = [t for t in fz.targets if t.examples]
    shrunk = f" (+{fz.total_shrink_replays} shrink replays)" if fz.total_shrink_replays else ""
    console.print(f"[bold]rlconform fuzz[/] {spec}: {fz.total_examples} examples{shrunk} in {el:.1f} s over {len(ran)} of "
                  f"{len(fz.targets)} findings, {fz.round + 1 if ran else 0} round(s)"
                  + (" [yellow](interrupted)[/]" if fz.interrupted else ""), highlight=False)
    for t in fz.targets:
        if t.status in ("unavailable", "error"):
            console.print(f"[yellow]{t.status}[/] {t.id}: {t.message.splitlines()[0] if t.message else ''}"[:300],
                          highlight=False)
    if not found:
        best = sorted(ran, key=lambda t: -t.best_ratio)[:3]
        console.print("[green]no counterexample[/]"
                      + ("; closest: " + ", ".join(f"{t.id} ({t.best_ratio:.3g})" for t in best) if best else ""),
                      highlight=False)
        return
    new = sum(t.new for t in found)
    console.print(f"[bold red]{len(found)} finding(s) with a counterexample[/] ({new} new) saved under "
                  f"{fz.corpus}/; `rlconform check --engine {spec}` replays them first", highlight=False)
    for t in found:
        n = t.found_after_examples
        when = (f"after {n} example{'s' if n != 1 else ''} of this finding, {t.found_after_seconds:.1f} s, "
                f"{t.found_after_total_examples} in all") if t.found_after_seconds is not None \
            else "saved earlier, still fails"
        first = (t.message or "").strip().splitlines()
        console.print(f"  [red]{'new' if t.new else 'known'}[/] {t.id} ({when})"
                      + ("" if t.shrunk else " [yellow]shrinking cut short[/]"), highlight=False)
        if first:
            console.print(f"      {first[0][:220]}", highlight=False)
        console.print(f"      rlconform replay {t.saved} --engine {spec}", highlight=False)


def _budget_text(params: dict) -> str:
    parts = []
    if params.get("max_examples") is not None:
        parts.append(f"{params['max_examples']} examples per finding")
    if math.isfinite(params["seconds"]):
        parts.append(f"{params['seconds']:.0f} s")
    return " or ".join(parts)


def _fuzz_child(params: dict, emit=None) -> dict:
    """In the child process: load the engine, fuzz the selected findings not in ``params["exclude"]``
    for ``params["seconds"]``, print as the command does; return the targets (as dicts) and counters."""
    from rich.console import Console
    from rich.live import Live

    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.catalog.binding import BindingError

    emit = emit or (lambda obj: None)
    if params.get("referee_at"):  # before the engine is imported: the verdicts are the referee's
        from rlconform.properties import referee

        referee.connect(params["referee_at"][0], bytes.fromhex(params["referee_at"][1]))
    try:
        binding = load_engine(params["engine"], params["engine_path"])
    except BindingError as exc:
        return {"usage": str(exc)}
    targets = [t for t in select_targets(binding, params["op"], params["property"], params["dtype"])
               if t.id not in params["exclude"]]
    if not targets:
        return {"usage": None if params["exclude"] else
                "the selection holds no finding of this engine (see `rlconform list-ops`)",
                "targets": [], "spec": binding.spec}
    console = Console(soft_wrap=True)  # long paths and commands stay on one line (copy-pasteable)
    spec = binding.spec

    def on_found(t: Target) -> None:
        tag = "new counterexample" if t.new else "counterexample (saved earlier, still fails)"
        console.print(f"[bold red]{tag}[/] {t.id}: {t.saved}", highlight=False)
        emit({"found": {**dataclasses.asdict(t), "id": t.id,
                        "best_ratio": t.best_ratio if math.isfinite(t.best_ratio) else None}})

    fz = Fuzzer(binding, targets, seconds=params["seconds"], corpus=params["corpus"], db=params["db"],
                seed=params["seed"], shrink_seconds=params["shrink_seconds"], on_found=on_found,
                on_current=lambda t: emit({"current": t.id}), example_timeout=params["timeout"],
                max_examples=params.get("max_examples"))
    if not params["exclude"]:
        console.print(f"rlconform fuzz {spec}: {len(targets)} findings, budget {_budget_text(params)}, corpus "
                      f"{params['corpus']}/, database {params['db']}/", highlight=False)
    if params["quiet"] or not console.is_terminal:
        fz.run()
    else:
        with Live(console=console, refresh_per_second=4, transient=True,
                  get_renderable=lambda: _progress(fz, spec)):
            fz.run()
    _print_summary(console, fz, spec)
    return {"spec": spec, "interrupted": fz.interrupted, "examples": fz.total_examples,
            "shrink_replays": fz.total_shrink_replays, "rounds": fz.round + 1,
            "seconds": fz.elapsed(),
            "targets": [{**dataclasses.asdict(t), "id": t.id,
                         "best_ratio": t.best_ratio if math.isfinite(t.best_ratio) else None} for t in fz.targets]}


_RANK = {"crash": 3, "found": 2, "known": 2, "error": 1, "unavailable": 1}


def _merge_runs(per_run: list[dict[str, dict]]) -> dict[str, dict]:
    """One entry per finding over the children that fuzzed it: examples and seconds added up; the
    status a crash, else a counterexample, else the last child's."""
    merged: dict[str, dict] = {}
    for run in per_run:
        for tid, t in run.items():
            old = merged.get(tid)
            if old is None:
                merged[tid] = dict(t)
                continue
            new = dict(t) if _RANK.get(t.get("status"), 0) >= _RANK.get(old.get("status"), 0) else dict(old)
            new["examples"] = (old.get("examples") or 0) + (t.get("examples") or 0)
            new["seconds"] = (old.get("seconds") or 0.0) + (t.get("seconds") or 0.0)
            merged[tid] = new
    return merged


def cmd_fuzz(args) -> int:
    """Supervise fuzzing children: each runs the engine; the verdict is decided here, from the referee's
    verdicts too."""
    err = _validate(args)
    if err:
        print(f"rlconform: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if args.seconds is not None:
        seconds = args.seconds
    elif args.minutes is not None:
        seconds = 60.0 * args.minutes
    else:
        seconds = math.inf if args.max_examples is not None else 300.0
    if not seconds > 0:
        print("rlconform: error: the budget must be positive", file=sys.stderr)
        return EXIT_USAGE
    if args.max_examples is not None and args.max_examples < 1:
        print("rlconform: error: --max-examples must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    if not args.timeout > 0:
        print("rlconform: error: --timeout must be positive", file=sys.stderr)
        return EXIT_USAGE
    t0 = time.monotonic()
    params = {"engine": args.engine, "engine_path": args.engine_path, "op": args.op, "property": args.property,
              "dtype": args.dtype, "corpus": args.corpus, "db": args.db, "seed": args.seed,
              "shrink_seconds": args.shrink_seconds, "timeout": args.timeout, "quiet": args.quiet, "exclude": [],
              "max_examples": args.max_examples}
    per_run: list[dict[str, dict]] = []  # what each child reported, finding id -> target (as a dict)
    ref = None
    from rlconform.harness.bindings.load import is_own_code
    from rlconform.harness.run.referee_flag import resolve

    own = is_own_code(args.engine or os.environ.get("RLCONFORM_ENGINE") or "reference", args.engine_path)
    args.referee = resolve(getattr(args, "referee", None), own)
    from rlconform.harness.run.dispatch import fork_helper_copy

    fork_helper_copy()  # the referee and every engine child fork from it
    if args.referee:  # started before any engine import
        from rlconform.harness.run.dispatch import referee_judge
        from rlconform.harness.workers import referee as referee_process
        from rlconform.properties import referee as judge

        try:
            ref = referee_process.start(referee_judge, judge.check_clean)
        except referee_process.RefereeUnavailable as exc:
            print(f"rlconform: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        params["referee_at"] = (ref.address, ref.authkey.hex())
    try:
        return _supervise(args, params, seconds, t0, per_run, ref)
    finally:
        if ref is not None:
            ref.close()


def _supervise(args, params: dict, seconds: float, t0: float, per_run: list, ref) -> int:
    from rlconform.harness.workers import interrupts
    from rlconform.harness.workers.isolated import ChildDied, run_isolated

    crashed: dict[str, str] = {}
    runs, interrupted = [], False
    while True:
        current: dict = {}
        seen: dict[str, dict] = {}
        per_run.append(seen)

        def on_event(ev: dict, seen=seen, current=current) -> None:
            if "found" in ev:  # kept even if this child dies later
                seen[ev["found"]["id"]] = ev["found"]
            if "current" in ev:
                current["current"] = ev["current"]

        params["seconds"] = seconds - (time.monotonic() - t0)
        try:
            res = run_isolated(_fuzz_child, (dict(params),), interruptible=True, on_event=on_event)
        except ChildDied as exc:
            from rlconform.harness.workers.isolated import brief_stack, describe_exit

            tid = current.get("current")
            name = tid or "(before the first finding)"
            exc.description = describe_exit(exc.exitcode, timed_out=exc.timed_out, deadline_s=args.timeout)
            print(f"rlconform fuzz: crash {name}: {exc.description}", file=sys.stderr)
            if exc.stack.strip():
                print("    " + brief_stack(exc.stack.strip())[:6000].replace("\n", "\n    "), file=sys.stderr)
            if tid is None:  # loading the engine killed its process: a binding error, nothing to go on with
                print("rlconform: error: loading the engine ended its process (see above)", file=sys.stderr)
                return EXIT_USAGE
            crashed[tid] = exc.description
            seen[tid] = {"id": tid, "status": "crash", "message": exc.description}
            done = {i for run in per_run for i, t in run.items() if t.get("status") in ("found", "known", "crash")}
            params["exclude"] = sorted(set(params["exclude"]) | done)
            if interrupts.received() is not None or seconds - (time.monotonic() - t0) <= 1.0:
                interrupted = interrupts.received() is not None
                break
            print(f"rlconform fuzz: going on without {tid} in a fresh process", file=sys.stderr)
            continue
        except RuntimeError as exc:
            print(f"rlconform: error: fuzzing failed in the harness (not the engine): "
                  f"{str(exc).strip().splitlines()[-1]}", file=sys.stderr)
            return EXIT_USAGE
        if res.get("usage"):
            print(f"rlconform: error: {res['usage']}", file=sys.stderr)
            return EXIT_USAGE
        runs.append(res)
        seen.update({t["id"]: t for t in res.get("targets", [])})  # the child's final word on each finding
        interrupted = bool(res.get("interrupted")) or interrupts.received() is not None
        break
    merged = _merge_runs(per_run)
    if ref is not None:  # what the referee judged failing fails, whatever the engine's process reported
        from rlconform.harness.run.referee_verdicts import VerdictBook

        book = VerdictBook()
        book.add(ref.drain())
        for fid, (status, message) in book.failing.items():
            if status == "error":  # rlconform's referee could not judge: a harness error (below), not a crash
                if (merged.get(fid) or {}).get("status") not in ("found", "known", "crash"):
                    merged[fid] = dict(merged.get(fid) or {"id": fid}, status="error", message=message,
                                       error_of="referee")
                continue
            if (merged.get(fid) or {}).get("status") not in ("found", "known", "crash"):
                merged[fid] = dict(merged.get(fid) or {"id": fid}, status="found" if status == "discrepancy" else "crash",
                                   message=f"{message} (the referee's verdict)")
                if status != "discrepancy":
                    crashed.setdefault(fid, message)
    if crashed:
        print(f"rlconform fuzz: {len(crashed)} finding(s) crashed the process running the engine: "
              + ", ".join(crashed), file=sys.stderr)
    if args.stats:
        doc = {"engine": runs[-1].get("spec") if runs else args.engine, "seconds": time.monotonic() - t0,
               "budget": seconds if math.isfinite(seconds) else None,
               "max_examples": args.max_examples, "examples": sum(r.get("examples", 0) for r in runs), "interrupted": interrupted,
               "rounds": sum(r.get("rounds", 0) for r in runs), "targets": list(merged.values())}
        with open(args.stats, "w") as fh:
            json.dump(doc, fh, indent=1)
    if any(t.get("status") == "error" and t.get("error_of") == "binding" for t in merged.values()):
        return EXIT_USAGE
    unjudged = [t["id"] for t in merged.values() if t.get("status") == "error" and t.get("error_of") == "referee"]
    if unjudged:  # rlconform's own failure, never the engine's: exit 2, as `check` does
        print(f"rlconform: error: the referee could not judge {len(unjudged)} finding(s) (rlconform's own error, "
              f"not the engine's): {', '.join(unjudged[:5])}", file=sys.stderr)
        return EXIT_USAGE
    if crashed or any(t.get("status") in ("found", "known") for t in merged.values()):
        return EXIT_FOUND
    return EXIT_INTERRUPTED if interrupted else EXIT_CLEAN

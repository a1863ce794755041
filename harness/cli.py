"""The ``rlconform`` command line.

    rlconform check --engine verl [--op entropy] [--profile ci] [--out DIR] [--xfails FILE] [-n 2] [--device cuda]
    rlconform replay DIR/cases/<finding id>.json
    rlconform fuzz --engine X [--op Y] --minutes N [--corpus DIR] [--db DIR]
    rlconform report DIR                       (re-render report.md and report.html from report.json)
    rlconform ledger DIR/report.json > xfails.txt
    rlconform diff BASE HEAD [--fail-on SEVERITY] [--markdown FILE]   (what a pull request changes)
    rlconform bisect --engine-path CHECKOUT --good REV --bad REV CASE_FILE [--engine SPEC]
    rlconform coverage --engine X [--format table|md|json] [--strict]   (the engine's numerics: bound or not)
    rlconform audit --engine X [--report DIR] [--format md|json]   (fault shapes in the numerics)
    rlconform init [--engine verl] [--dir .]   (a fork's workflow, empty ledger and binding skeleton)
    rlconform list-ops | list-engines | --version

Exit codes: 0 clean (every selected finding run and recorded, none failing), 1 discrepancies (or crashes,
unavailable ops, ledger entries that now pass, or findings that were not run; by default discrepancies
and crashes of severity ``training``, ``destructive``, ``logging`` or ``robustness`` count, not
``precision`` ones: ``--fail-on``), 2 usage, binding or
harness error (the message says which; never a traceback), 130 interrupted (Ctrl-C, SIGTERM) before
anything failed. A report already written is never removed; an interrupted run's report says it is
incomplete.

``check`` runs the engine only in pytest-xdist worker processes (``-n``, default 1); this process, which
decides the exit code, loads no engine code (a binding given as a file or ``module:attr`` is loaded in a
child process to learn its ops). ``replay`` runs the case in a child process too, with the engine named
on its command line, never the one a case file names. One exception: rlconform's own code (the reference
engine, ``mutants.*``), which has no engine package and patches nothing, runs in this process with
``check -n 0`` and with ``replay --no-referee`` (the self-tests use both: each saves a process start).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from rlconform.harness.workers import interrupts

EXIT_CLEAN, EXIT_DISCREPANCY, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
#: seconds one finding (check) or one case (replay) may take before its process is ended as hung
DEFAULT_TIMEOUT_S = 900
#: worker processes xdist may replace after they died (each death is that finding's crash)
DEFAULT_MAX_WORKER_RESTART = 50


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2 already; keep its wording, add the hint
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")




def _test_dirs() -> list[str]:
    """The generic property tests and the distributed tests, as installed."""
    import rlconform.distributed_tests as D
    import rlconform.properties as P

    return [os.path.dirname(P.__file__), os.path.dirname(D.__file__)]


def build_parser() -> argparse.ArgumentParser:
    from rlconform.harness.report.writer import tool_version

    p = _Parser(prog="rlconform", description="Conformance and fuzzing harness for the numerics of RL trainers.")
    p.add_argument("--version", action="version", version=f"rlconform {tool_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    c = sub.add_parser("check", help="check an engine against the exact references and write a report")
    _engine_args(c)
    _device_arg(c)
    c.add_argument("--out", default="rlconform-report", help="report directory (default: %(default)s)")
    c.add_argument("--op", action="append", default=[], help="only this op (repeatable)")
    c.add_argument("--property", action="append", default=[], help="only this property (repeatable)")
    c.add_argument("--dtype", action="append", default=[], help="only this dtype (repeatable)")
    c.add_argument("--regime", action="append", default=[],
                   help="only this regime (repeatable; a data regime such as real_shapes also selects "
                        "variant@real_shapes and tp2_real_shapes)")
    c.add_argument("--profile", default="ci", choices=["dev", "ci", "nightly"],
                   help="hypothesis profile (default: ci, derandomized: the same examples on every machine; "
                        "nightly adds the real_shapes regime)")
    c.add_argument("--max-examples", type=_positive_int, default=None,
                   help="examples per finding (overrides the profile)")
    c.add_argument("--max-shrinks", type=int, default=None,
                   help="shrinking steps per failing finding, listed in the --xfails ledger or not (default: 50 "
                        "in the ci profile, no limit in nightly; negative: no limit)")
    c.add_argument("--seed", type=int, default=None, help="random seed (disables derandomization)")
    c.add_argument("--xfails", default=None,
                   help="ledger of accepted defects (one per line) and known findings (ids): a file, or the name of "
                        "a ledger rlconform ships (verl-0.9.1, skyrl-0.4.0, megatron-core-0.19.2)")
    c.add_argument("--changed-since", default=None, metavar="REV",
                   help="only the findings whose engine functions, or the engine functions they call, changed "
                        "between REV and HEAD of the --engine-path checkout, and those of ledger lines the change edits (a "
                        "ledger never widens it otherwise); the selection is written to OUT/selection.txt (a --findings file)")
    c.add_argument("--shard", type=_shard, default=None, metavar="K/N",
                   help="only shard K of N of the selected findings (CI jobs of a matrix: the N reports combine "
                        "with `rlconform report --merge`); balanced by --shard-costs")
    c.add_argument("--shard-costs", default=None, metavar="REPORT",
                   help="a report.json of an earlier run whose per-finding cost (cost_s) balances --shard")
    c.add_argument("--findings", default=None, metavar="FILE",
                   help="only the finding ids this file lists, one a line (e.g. another run's selection.txt)")
    c.add_argument("--corpus", default=None, help="corpus of saved counterexamples to replay first "
                                                  "(default: ./rlconform-corpus if it exists)")
    c.add_argument("-n", "--numprocesses", type=_numprocesses, default=None,
                   help="worker processes that run the engine (pytest-xdist; a number or auto; default 1); 0 runs "
                        "it in this process, for rlconform's own code only (the reference engine, mutants.*: "
                        "no engine package, nothing patched at import), about 4 s less per run, and their default")
    c.add_argument("--timeout", type=_positive_float, default=DEFAULT_TIMEOUT_S,
                   help="seconds one finding may take before its worker is ended as hung (default %(default)s)")
    c.add_argument("--max-worker-restart", type=_nonnegative_int, default=DEFAULT_MAX_WORKER_RESTART,
                   help="worker processes that may die (each one a crash finding) before the run stops "
                        "(default %(default)s)")
    c.add_argument("--junitxml", default=None, help="also write JUnit XML here")
    c.add_argument("-q", "--quiet", action="store_true", help="only the summary")
    _referee_arg(c)
    c.add_argument("-v", "--verbose", action="store_true",
                   help="also pytest's and pytest-xdist's own output (progress, warnings summary, counts)")
    # --- triage ---
    from rlconform.harness.report.severity import DEFAULT_FAIL_ON, FAIL_ON

    c.add_argument("--fail-on", choices=FAIL_ON, default=DEFAULT_FAIL_ON,
                   help="the least severe failing finding that turns the exit code red, in the order training = "
                        "destructive > logging > robustness > precision (default: %(default)s: every severity but "
                        "precision; precision: any failing finding; the old names wrong / imprecise mean "
                        "robustness / precision; ledger entries that now pass and unavailable ops always do)")

    r = sub.add_parser("replay", help="re-run one saved case (a reproducer) and print the outcome")
    r.add_argument("case_file", help="a saved case file, or with --report a finding id (or defect id) of that report")
    r.add_argument("--report", default=None, metavar="DIR",
                   help="a report folder: replay the reproducer it records for the finding (or defect) named by "
                   "the positional argument, its case_file resolved against DIR")
    r.add_argument("--engine", default=None, help="the engine to run the case on (default: $RLCONFORM_ENGINE or "
                                                 "reference; never taken from the case file)")
    r.add_argument("--engine-path", default=None, help="a fork's checkout, put first on sys.path")
    _device_arg(r)
    r.add_argument("--timeout", type=_positive_float, default=DEFAULT_TIMEOUT_S,
                   help="seconds the case may take before it is ended as hung (default %(default)s)")
    _referee_arg(r)

    lg = sub.add_parser("ledger", help="print an xfails ledger listing the defects of a report, one line each")
    lg.add_argument("report", nargs="?", default=None, help="a report.json (or the folder holding it)")
    lg.add_argument("--stock", default=None, metavar="NAME",
                    help="print the ledger rlconform ships for a released engine instead (verl-0.9.1, skyrl-0.4.0, "
                         "megatron-core-0.19.2): a fork's starting point")

    from rlconform.harness.run.fuzz import add_parser as add_fuzz_parser

    add_fuzz_parser(sub)

    from rlconform.harness.report.diff import add_parser as add_diff_parser  # --- triage ---

    add_diff_parser(sub)

    from rlconform.harness.run.bisect import add_parser as add_bisect_parser  # --- bisect ---

    add_bisect_parser(sub)

    from rlconform.harness.report.explain_cmd import add_parser as add_explain_parser  # --- explain ---

    add_explain_parser(sub)

    from rlconform.harness.run.audit import add_parser as add_audit_parser  # --- static audit ---

    add_audit_parser(sub)

    from rlconform.harness.run.matrix import add_parser as add_matrix_parser  # --- version matrix ---

    add_matrix_parser(sub)

    from rlconform.harness.run.init_cmd import add_parser as add_init_parser  # --- adoption in a fork ---

    add_init_parser(sub)

    cv = sub.add_parser("coverage", help="inventory the engine's numerics: every public function bound to an op, "
                        "justified, or unbound")
    _engine_args(cv)
    cv.add_argument("--format", choices=["table", "md", "json"], default=None,
                    help="table (rich), md (Markdown, as reports/<engine>/coverage.md) or json "
                    "(default: table on a terminal, md otherwise)")
    cv.add_argument("--strict", action="store_true",
                    help="exit 1 when an item is unbound (neither bound nor justified): for a fork's CI")
    cv.add_argument("--changed-since", default=None, metavar="REV",
                    help="only the items whose function changed between REV and HEAD of the --engine-path checkout "
                         "(the pull-request check)")
    cv.add_argument("--timeout", type=_positive_float, default=DEFAULT_TIMEOUT_S,
                    help="seconds the engine's import may take (default: %(default)s)")

    rp = sub.add_parser("report", help="re-render report.md and report.html from a report.json")
    rp.add_argument("out", help="a report folder (holding report.json), or the report.json itself")
    rp.add_argument("--merge", nargs="+", default=None, metavar="SHARD_DIR",
                    help="with OUT the first shard's folder: merge the reports of `check --shard K/N` (all N "
                         "folders: OUT and these) into --to; exit code as check's")
    rp.add_argument("--fail-on", default="robustness", help="with --merge: as check's --fail-on")
    rp.add_argument("--subset", default=None, metavar="SELECTION",
                    help="write, in --to, the findings of a check --changed-since selection.json taken from this "
                         "report (a pull request's base read from main's report); exit 1 when the report cannot "
                         "stand for the base (another commit, engine or rlconform version, incomplete, or a "
                         "selected finding missing), saying why")
    rp.add_argument("--to", default=None, help="with --subset: the folder to write the subset report in")
    rp.add_argument("--expect-revision", default=None, help="with --subset: the base commit the report must be of")
    rp.add_argument("--expect-engine", default=None, help="with --subset: the engine spec the report must be of")
    rp.add_argument("--config", default=None, metavar="TRAINER_YAML",
                    help="print the defect rows that this trainer configuration reaches (the engine's own YAML: a "
                         "nested config, dotted keys or a list of key=value overrides; unset keys take the engine's "
                         "defaults), severities as it sets them, then the rows it does not reach and why; exit 1 "
                         "when a reached row is at least --fail-on")

    sub.add_parser("list-ops", help="list the op catalog")
    sub.add_parser("list-engines", help="list the built-in engines and mutants")
    return p


def _shard(text: str) -> tuple[int, int]:
    k, _, n = text.partition("/")
    try:
        k, n = int(k), int(n)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not K/N: {text!r}") from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"need 1 <= K <= N, got {text!r}")
    return k, n


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _numprocesses(text: str) -> str:
    if text in ("auto", "logical"):
        return text
    if text == "0":  # this process (rlconform's own code only: checked in _check_with)
        return text
    return str(_positive_int(text))


def _referee_arg(p) -> None:
    from rlconform.harness.run.referee_flag import add_argument

    add_argument(p)


def _device_arg(p) -> None:
    from rlconform.harness.core.device import add_argument

    add_argument(p)


def _apply_device(args) -> str | None:
    """Validate ``--device`` (or ``RLCONFORM_DEVICE``) and export it to every process the run starts; returns
    the one-line error for a malformed or absent device, else None."""
    from rlconform.harness.core import device

    text = getattr(args, "device", None) or os.environ.get(device.ENV) or device.DEFAULT
    try:
        args.device = device.check_available(text)
    except device.DeviceError as exc:
        return str(exc)
    os.environ[device.ENV] = args.device
    return None


def _engine_args(p) -> None:
    p.add_argument("--engine", default=None, help="reference | verl | skyrl | megatron | mutants.<family> | "
                                                 "module:attr | file.py (default: $RLCONFORM_ENGINE or reference)")
    p.add_argument("--engine-path", default=None, help="a fork's checkout, put first on sys.path")


def _usage_error(message: str) -> int:
    print(f"rlconform: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def cmd_list_ops() -> int:
    from rlconform.harness.catalog.ops import OPS, family_of

    for op in OPS.values():
        dtypes = sorted({d for d, _ in op.cases()})
        regimes = [r + (f" ({'/'.join(op.regime_profiles(r))} profile only)" if op.regime_profiles(r) else "")
                   for r in op.regimes]
        print(f"{op.name:24s} {op.kind:16s} properties: {', '.join(op.properties)}")
        if family_of(op.name).doc:  # the canonical call, as the family states it
            print(f"{'':24s} {'':16s} call: {family_of(op.name).doc}")
        print(f"{'':24s} {'':16s} regimes: {', '.join(regimes)}; dtypes: {', '.join(dtypes)}")
        for name, values in op.parameters.items():
            print(f"{'':24s} {'':16s} parameter {name}: {', '.join(map(str, values))}")
    return EXIT_CLEAN


def cmd_list_engines() -> int:
    from rlconform.harness.bindings.load import available_engines

    for name in available_engines():
        print(name)
    return EXIT_CLEAN


def _is_builtin(spec: str) -> bool:
    from rlconform.harness.bindings.load import BUILTIN

    return spec in BUILTIN or spec.startswith("mutants.")


def _engine_metadata(spec: str, engine_path: str | None, sites: bool = False) -> dict:
    """The engine's name, version, ops... A built-in binding (the harness's own code, every engine import
    lazy) is read here; a user's binding runs code when imported, so it is loaded in a child process
    (as is any binding whose engine ``sites`` are asked for). The variants and coverage table of the
    reference and of a mutant are read here too: resolving them imports only the harness's own code (the
    child, a fresh interpreter importing torch and the catalog again, cost each such run ~4 s of CPU)."""
    from rlconform.harness.bindings.load import engine_meta, load_engine, probe_engine
    from rlconform.harness.bindings.meta_cache import cached_probe

    if sites:
        return cached_probe(spec, engine_path, True, lambda: probe_engine(spec, engine_path, sites=True))
    if _is_builtin(spec) and engine_path is None:
        binding = load_engine(spec, None)
        from rlconform.harness.catalog.ops import OPS

        if binding.coverage is None and not binding.implementations and not any(
                OPS[op].variants for op in binding.provided_ops() if op in OPS):
            return engine_meta(binding)
        if _runs_in_process(spec, None):
            import warnings

            with warnings.catch_warnings():  # as the child does (bindings.load._probe)
                warnings.simplefilter("ignore")
                return engine_meta(binding, variants=True)
    # variants and the coverage table are known only by importing the engine: in a child process (or the
    # cache of an installed engine's metadata, keyed by its code and rlconform's)
    return cached_probe(spec, engine_path, False, lambda: probe_engine(spec, engine_path))


def _runs_in_process(spec: str, engine_path: str | None) -> bool:
    """Whether the engine may run in the CLI's own process (``check -n 0``, ``replay --no-referee``):
    rlconform's own code only, never an engine package or a checkout."""
    from rlconform.harness.bindings.load import is_own_code

    return is_own_code(spec, engine_path)


def cmd_check(args) -> int:
    import pytest

    from rlconform.harness.catalog.binding import BindingError
    from rlconform.harness.catalog.ops import FLOAT_DTYPES, OPS, PROPERTIES
    from rlconform.harness.report.xfails import parse_xfails
    from rlconform.properties.corpus import CorpusError, validate_corpus

    for flag, values, known in (("--op", args.op, OPS), ("--property", args.property, PROPERTIES),
                                ("--dtype", args.dtype, FLOAT_DTYPES)):
        unknown = [v for v in values if v not in known]
        if unknown:
            return _usage_error(f"unknown {flag} {', '.join(unknown)}; choose from {', '.join(known)}")
    if args.xfails:
        from rlconform.harness.report import stock_ledgers

        try:  # a path, or the name of a ledger rlconform ships (verl-0.9.1)
            args.xfails = stock_ledgers.resolve(args.xfails)
        except FileNotFoundError as exc:
            return _usage_error(str(exc))
        warnings: list[str] = []
        try:
            parse_xfails(args.xfails, warnings=warnings)
        except BindingError as exc:
            return _usage_error(str(exc))
        for w in warnings:
            print(f"rlconform: warning: {w}", file=sys.stderr)
    corpus = args.corpus
    if corpus is None and os.path.isdir("rlconform-corpus"):
        corpus = "rlconform-corpus"
    try:
        validate_corpus(corpus)
    except CorpusError as exc:
        return _usage_error(str(exc))
    spec = args.engine or os.environ.get("RLCONFORM_ENGINE") or "reference"
    _own_code_defaults(args, spec)
    from rlconform.harness.workers.reaper import Reaper

    reaper = Reaper()  # from here on, every process the engine starts is a descendant of this one
    if args.referee or not _runs_in_process(spec, args.engine_path):  # a referee or the probe will start
        from rlconform.harness.run.dispatch import fork_helper_copy

        fork_helper_copy()
    try:
        return _check_with(args, spec, corpus, reaper, pytest)
    finally:
        reaper.end()
        reaper.close()


def _own_code_defaults(args, spec: str) -> None:
    """The defaults a command line left open, now that the engine is known: rlconform's own code (the reference,
    ``mutants.*``) runs in this process (``-n 0``) and is judged here; an engine runs in one worker and is judged
    by the referee (:func:`rlconform.harness.run.referee_flag.resolve`)."""
    from rlconform.harness.run.referee_flag import resolve

    own = _runs_in_process(spec, getattr(args, "engine_path", None))
    if getattr(args, "numprocesses", "1") is None:
        args.numprocesses = "0" if own else "1"
    args.referee = resolve(getattr(args, "referee", None), own)


def _check_with(args, spec: str, corpus: str | None, reaper, pytest) -> int:
    from rlconform.harness.catalog.binding import BindingError
    from rlconform.harness.run.outdir import OutDirError, claim

    changed_since = getattr(args, "changed_since", None)
    if changed_since and not args.engine_path:
        return _usage_error("--changed-since REV needs --engine-path CHECKOUT (the engine's git checkout whose "
                            "HEAD is compared with REV)")
    only = None
    if getattr(args, "findings", None):
        from rlconform.harness.run.changed_since import read_selection

        try:
            only = set(read_selection(args.findings))
        except OSError as exc:
            return _usage_error(f"cannot read --findings {args.findings}: {exc.strerror or exc}")
        except ValueError as exc:
            return _usage_error(str(exc))
    if args.numprocesses == "0" and not _runs_in_process(spec, args.engine_path):
        return _usage_error(f"-n 0 runs the engine in this process, which decides the exit code: only rlconform's "
                            f"own code (the reference engine, mutants.*) may run there, not {spec!r}; use -n 1 or "
                            f"more")
    try:
        meta = _engine_metadata(spec, args.engine_path, sites=bool(changed_since))
    except BindingError as exc:
        return _usage_error(str(exc))
    provided = meta["ops"]
    missing = [op for op in args.op if op not in provided]
    if missing:
        return _usage_error(f"engine {meta['spec']!r} does not bind {', '.join(missing)}; it binds "
                            f"{', '.join(provided)}")
    from rlconform.harness.run.selection import selected_findings

    chosen = selected_findings(provided, args.op, args.property, args.dtype, variants=meta.get("variants"),
                               profile=args.profile, regimes=args.regime)
    selection = None
    if changed_since and chosen:
        from rlconform.harness.report.xfails import parse_ledger
        from rlconform.harness.run.changed_since import ChangeError, select_changed

        listed: set = set()
        if args.xfails:  # a ledger never widens the selection, but a line the change itself edits selects its scope
            from rlconform.harness.core.code_changes import changed_file_lines

            ledger = parse_ledger(args.xfails)
            edited = changed_file_lines(args.xfails, changed_since) or set()
            scopes = {pair for d in ledger.defects.values() if d.line in edited for pair in d.scope}
            listed = {fid for fid, n in ledger.finding_lines.items() if n in edited} | {
                ".".join(f) for f in chosen if (f[0], f[1]) in scopes}
        try:
            selection = select_changed(meta, args.engine_path, changed_since, chosen, listed)
        except ChangeError as exc:
            return _usage_error(str(exc))
        only = set(selection.ids) if only is None else only & set(selection.ids)
    meta.pop("sites", None)
    if selection is not None:  # what the report's remedies read: a cause written for the code before the change
        meta["changed_since"] = {"rev": changed_since, "paths": {k: list(v) for k, v in selection.changed.items()}}
    if only is not None and chosen:
        chosen = [f for f in chosen if ".".join(f) in only]
        if not chosen:
            return _nothing_changed(args, selection)
    if chosen and args.shard is not None:
        from rlconform.harness.run.selection import finding_costs, shard_of

        k, n = args.shard
        if len(chosen) < n:
            return _usage_error(f"--shard {k}/{n}: only {len(chosen)} finding(s) are selected")
        try:
            costs = finding_costs(args.shard_costs) if args.shard_costs else {}
        except (OSError, ValueError) as exc:
            return _usage_error(f"cannot read --shard-costs {args.shard_costs}: {exc}")
        mine = set(shard_of([".".join(f) for f in chosen], costs, k, n))
        chosen = [f for f in chosen if ".".join(f) in mine]
        only = mine
    if not chosen:
        return _usage_error("no finding matches the filters (a property may not apply to the op, or the op "
                            "not to the dtype, or the regime is added by another --profile); see "
                            "`rlconform list-ops`")
    try:
        out = claim(args.out)
    except OutDirError as exc:
        return _usage_error(str(exc))
    try:
        with tempfile.TemporaryDirectory(prefix="rlconform-check-") as tmp:
            if only is not None:
                from rlconform.harness.run.changed_since import Selection, write_selection

                sel = selection or Selection(rev="", ids=[".".join(f) for f in chosen], why={}, changed={})
                sel.ids = [".".join(f) for f in chosen]
                write_selection(os.path.join(tmp, "findings.txt"), sel)
                if selection is not None:
                    from rlconform.harness.run.changed_since import selection_summary, write_selection_json

                    write_selection(os.path.join(args.out, "selection.txt"), sel)
                    write_selection_json(os.path.join(args.out, "selection.json"), sel)
                    print(f"rlconform: --changed-since {changed_since}: {len(sel.ids)} finding(s) selected; "
                          f"{selection_summary(sel)}", flush=True)
            code = _run_pytest(args, meta, corpus, tmp, pytest, only is not None)
            return _verdict(args, code, reaper)
    finally:
        reaper.end()  # whatever happened: nothing the run started outlives it
        reaper.close()
        out.release()
        if interrupts.received() is not None:
            from rlconform.harness.workers.isolated import kill_children

            kill_children()


def _nothing_changed(args, selection) -> int:
    """``--changed-since`` / ``--findings`` left no finding: say why in one line and in OUT/selection.txt;
    exit 0 (nothing the change touched can have changed a verdict)."""
    if selection is not None:
        from rlconform.harness.run.changed_since import write_selection, write_selection_json

        try:
            os.makedirs(args.out, exist_ok=True)
            write_selection(os.path.join(args.out, "selection.txt"), selection)
            write_selection_json(os.path.join(args.out, "selection.json"), selection)
        except OSError as exc:
            return _usage_error(f"cannot write {args.out}/selection.txt: {exc.strerror or exc}")
        print(f"rlconform: nothing to check: no bound engine function (nor one it calls) changed since "
              f"{selection.rev}, and no ledger line the change edits lists one")
        return EXIT_CLEAN
    return _usage_error("no finding of --findings matches the engine and the filters")


def _run_pytest(args, meta: dict, corpus: str | None, tmp: str, pytest, only: bool = False) -> int:
    ini = os.path.join(tmp, "pytest.ini")
    with open(ini, "w") as fh:
        fh.write("[pytest]\naddopts =\n")
    meta_path = os.path.join(tmp, "engine.json")
    with open(meta_path, "w") as fh:
        json.dump(meta, fh)
    argv = [
        *_test_dirs(), "-c", ini, "--rootdir", tmp, "--import-mode=importlib", "-p", "no:cacheprovider",
        "-p", "rlconform.harness.run.pytest_plugin", "--rlconform-engine", meta["spec"],
        "--rlconform-engine-meta", meta_path, "--rlconform-out-claimed", "--rlconform-seal",
        "--rlconform-out", os.path.abspath(args.out), "--rlconform-profile", args.profile,
        "--rlconform-command", " ".join(["rlconform"] + sys.argv[1:]),
        "--rlconform-deadline", str(args.timeout),
        "-n", str(args.numprocesses), "--max-worker-restart", str(args.max_worker_restart),
        *(["-q"] if getattr(args, "verbose", False) else ["-qq", "--disable-warnings", "--rlconform-console"]),
        "--no-header", "-rN", "--tb=no",
        # no assertion rewriting: no check reads an assert (a finding's failure is an Outcome), and rewriting
        # parsed every rlconform module in every engine worker (~3 s of CPU per run with the bytecode unwritten)
        "--assert=plain",
    ]
    if args.engine_path:
        argv += ["--rlconform-engine-path", os.path.abspath(args.engine_path)]
    for flag, values in (("--rlconform-op", args.op), ("--rlconform-property", args.property),
                         ("--rlconform-dtype", args.dtype), ("--rlconform-regime", args.regime)):
        for v in values:
            argv += [flag, v]
    if args.max_examples is not None:
        argv += ["--rlconform-max-examples", str(args.max_examples)]
    if args.max_shrinks is not None:
        argv += ["--rlconform-max-shrinks", str(args.max_shrinks)]
    if args.seed is not None:
        argv += ["--rlconform-seed", str(args.seed)]
    if args.xfails:
        argv += ["--rlconform-xfails", os.path.abspath(args.xfails)]
    if getattr(args, "shard", None) is not None:
        argv += ["--rlconform-shard", "{}/{}".format(*args.shard)]
    if only:
        argv += ["--rlconform-findings", os.path.join(tmp, "findings.txt")]
    if corpus:
        argv += ["--rlconform-corpus", os.path.abspath(corpus)]
    if args.junitxml:
        argv += ["--junitxml", os.path.abspath(args.junitxml)]
    argv += ["--rlconform-referee" if getattr(args, "referee", True) else "--rlconform-no-referee"]
    env_engine = os.environ.pop("RLCONFORM_ENGINE", None)
    try:
        return int(pytest.main(argv))
    finally:
        if env_engine is not None:
            os.environ["RLCONFORM_ENGINE"] = env_engine


def _seal(result: dict, reaper) -> str | None:
    """End every process the run started, then write the run's files from what the controller recorded and
    read them back; returns a harness error, or None."""
    from rlconform.harness.report.writer import ReportWriteError

    reaper.end()
    left = reaper.alive()
    if left:
        return f"{len(left)} process(es) the run started could not be ended (pids {sorted(left)[:8]})"
    writer = result.get("writer")
    if writer is None or writer.last is None:
        return None
    try:
        differ = writer.seal(result.get("cases") or {})
    except ReportWriteError as exc:
        return str(exc)
    if differ:
        return (f"{', '.join(differ[:4])} changed after this run wrote them (something outside the run is "
                f"writing the report folder); the files are not what the run recorded")
    return None


def _verdict(args, code: int, reaper=None) -> int:
    """The exit code, from what the plugin recorded (never from anything an engine could set: the report
    is read from the controller's record, after every process the run started is gone)."""
    from rlconform.harness.report.severity import fails  # --- triage: --fail-on ---
    from rlconform.harness.report.summary import print_summary
    from rlconform.harness.run import pytest_plugin

    result = pytest_plugin._CONTROLLER_STATE.pop("result", None)
    if result is None:
        if interrupts.received() is not None:
            print("rlconform: interrupted while starting; no finding was run", file=sys.stderr)
            return EXIT_INTERRUPTED
        return _usage_error(f"the check could not run (pytest exit code {code}); see the messages above")
    report_path = os.path.join(args.out, "report.json")
    sealed = _seal(result, reaper) if reaper is not None else None
    writer = result.get("writer")
    if writer is not None and writer.last is not None:
        doc = writer.last[0]
    else:
        from rlconform.harness.core.safe_json import JsonFileError, load_object

        try:
            doc = load_object(report_path)
        except JsonFileError as exc:
            return _usage_error(result["error"] or f"cannot read back the report: {exc}")
    print_summary(doc)
    if sealed:
        return _usage_error(sealed)
    if result["error"]:
        return _usage_error(result["error"])
    statuses = {f["status"] for f in doc["findings"]}
    if any(f.get("binding_error") for f in doc["findings"]):
        return EXIT_USAGE
    if "error" in statuses:
        print("rlconform: error: the harness could not check some findings (status `error`, not the engine's "
              "fault); see their messages in the report", file=sys.stderr)
        return EXIT_USAGE
    fixed = [d for d in (doc.get("run") or {}).get("ledger_defects") or () if d.get("status") == "xpass"]
    for d in fixed:  # a listed defect none of whose findings failed
        print(f"rlconform: ledger line {d['line']}: defect {d['key']} is listed but none of its findings fails "
              f"now: it is fixed, remove the line", file=sys.stderr)
    if any(fails(f, args.fail_on) for f in doc["findings"]) or fixed:
        return EXIT_DISCREPANCY
    if result["interrupted"]:
        return EXIT_INTERRUPTED
    if result["not_run"]:
        print(f"rlconform: {len(result['not_run'])} selected finding(s) were not run (e.g. "
              f"{result['not_run'][0]}): the run is incomplete", file=sys.stderr)
        return EXIT_DISCREPANCY
    if code not in (0, 1):
        return _usage_error(f"the check ended abnormally (pytest exit code {code}); see the messages above")
    return EXIT_CLEAN


def _replay_child(spec: str | None, engine_path: str | None, case_doc: dict, referee_at=None, emit=None) -> dict:
    """In the child process: load the engine, check the case, return what happened (data only). With
    ``referee_at`` (address, authkey hex) the verdict is the referee's."""
    if referee_at:
        from rlconform.properties import referee

        referee.connect(referee_at[0], bytes.fromhex(referee_at[1]))
    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.catalog.binding import BindingError, OpUnavailable
    from rlconform.harness.core import torch_state
    from rlconform.harness.core.evaluation import EngineCrash
    from rlconform.harness.run.dispatch import run_check
    from rlconform.harness.workers.pool import PoolStartupError
    from rlconform.properties.case import Case
    from rlconform.properties.referee import RefereeError

    case = Case.from_json(case_doc)
    try:
        binding = load_engine(spec, engine_path)
    except BindingError as exc:
        return {"kind": "usage", "message": str(exc)}
    before = torch_state.snapshot()
    try:
        outcome = run_check(binding, case)
    except EngineCrash as exc:
        return {"kind": "crash", "message": str(exc), "traceback": exc.engine_traceback, "spec": binding.spec}
    except OpUnavailable as exc:
        return {"kind": "usage", "message": f"op {case.op} is unavailable in engine {binding.spec}: {exc}"}
    except BindingError as exc:
        return {"kind": "usage", "message": str(exc)}
    except PoolStartupError as exc:
        return {"kind": "usage", "message": f"the worker pool could not start (not the engine's fault): {exc}"}
    except RefereeError as exc:  # rlconform's own failure to judge: exit 2, never the engine's crash
        return {"kind": "usage", "message": str(exc)}
    except (KeyboardInterrupt, SystemExit) as exc:
        return {"kind": "crash", "message": f"the engine raised {type(exc).__name__}({str(exc)!r})",
                "traceback": "", "spec": binding.spec}
    except Exception as exc:  # noqa: BLE001 - the check raised on what the engine returned
        import traceback

        return {"kind": "crash", "spec": binding.spec, "traceback": traceback.format_exc(),
                "message": f"checking the case raised {type(exc).__name__}: {exc} (on what the engine returned)"}
    changed = torch_state.changes(before, torch_state.snapshot())
    if changed:
        return {"kind": "crash", "spec": binding.spec, "traceback": "",
                "message": "torch's global state changed while checking the case: " + "; ".join(changed)}
    return {"kind": outcome.verdict, "message": outcome.message, "spec": binding.spec,
            "max_abs_err": outcome.max_abs_err, "max_rel_err": outcome.max_rel_err, "ratio": outcome.ratio}


def _report_case_file(report_dir: str, name: str) -> str:
    """The case file a report folder records for finding (or defect) ``name``, resolved against the folder
    (:mod:`rlconform.harness.report.case_paths`); raises ValueError with the reason, also when the recorded
    path leads outside the folder's ``cases/`` (a report folder is data: it never points replay elsewhere)."""
    from rlconform.harness.report.case_paths import CASES, inside_cases, resolve

    path = os.path.join(report_dir, "report.json")
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    entries = [e for e in list(doc.get("findings") or []) + list(doc.get("defects") or [])
               if isinstance(e, dict) and e.get("id") == name]
    for e in entries:
        case_file = (e.get("reproducer") or {}).get("case_file")
        if case_file:
            found = resolve(report_dir, case_file) if isinstance(case_file, str) else None
            if found is None or not inside_cases(report_dir, found):
                raise ValueError(f"{path}: the reproducer of {name!r} ({case_file!r}) is not a file of "
                                 f"{os.path.join(report_dir, CASES)}; replay reads cases only there")
            return found
    raise ValueError(f"{path} records no reproducer for {name!r}" if entries else f"{path} has no finding {name!r}")


def cmd_replay(args) -> int:
    from rlconform.harness.core.safe_json import load_json
    from rlconform.properties.case import CaseError, load_case

    if getattr(args, "report", None):
        try:
            args.case_file = _report_case_file(args.report, args.case_file)
        except ValueError as exc:
            return _usage_error(str(exc))
    try:
        case = load_case(args.case_file)
        doc = load_json(args.case_file)
    except OSError as exc:
        return _usage_error(f"cannot read case file {args.case_file}: {exc.strerror or exc}")
    except CaseError as exc:
        return _usage_error(f"bad case file {args.case_file}: {exc}")
    recorded = doc.get("engine") if isinstance(doc.get("engine"), dict) else {}
    spec = args.engine or os.environ.get("RLCONFORM_ENGINE")
    if spec is None:
        named = recorded.get("spec")
        if named not in (None, "reference"):
            return _usage_error(
                f"case file {args.case_file} was recorded with engine {named!r}; replay never runs an engine "
                f"named by a case file. To run it on that engine, say so: rlconform replay {args.case_file} "
                f"--engine {named}" + (f" --engine-path {recorded['path']}" if recorded.get("path") else ""))
        spec = "reference"
    _own_code_defaults(args, spec)
    from rlconform.harness.workers.pool import in_torchrun

    if in_torchrun() and int(os.environ.get("RANK", "0")) != 0:
        # every rank runs the case (it holds its shard of the collectives); only rank 0 prints the verdict and
        # carries it in its exit code, so torchrun reports one failing rank, not one per rank
        result = _replay_child(spec, args.engine_path, case.to_json())
        return EXIT_USAGE if result["kind"] == "usage" else EXIT_CLEAN
    print(f"replaying {case.finding_id} on engine {spec}")
    from rlconform.harness.report.triage import variant_of

    variant = variant_of({"op": case.op, "regime": case.regime})
    if variant:
        print(f"  variant {variant['name']}: {variant['parameters']}")
    print(f"  input: {case.summary()}")
    if in_torchrun():  # each rank is already a process of torchrun's: run in place
        result = _replay_child(spec, args.engine_path, case.to_json())
        code = _print_replay_result(result)
        if code == EXIT_DISCREPANCY:
            print(f"rlconform: rank 0 exits {code} with this verdict (every other rank exits 0); torchrun reports "
                  f"that below as a ChildFailedError of rank 0 — the verdict above, not a crash of the harness",
                  flush=True)
        return code
    if _runs_in_process(spec, args.engine_path) and not args.referee:
        # rlconform's own code (the reference, a mutant) without the referee: in this process, which saves a
        # child's start (a fresh interpreter importing torch and the catalog, ~3 s of CPU); it patches nothing
        # at import, never ends its process, and its verdict is the same as in a child
        return _print_replay_result(_replay_child(spec, None, case.to_json()))
    from rlconform.harness.run.dispatch import fork_helper_copy
    from rlconform.harness.run.referee_verdicts import refereed
    from rlconform.harness.workers.isolated import ChildDied, run_isolated

    fork_helper_copy()  # the referee and the engine's child fork from it
    ref = None
    try:
        if refereed(case.op) and args.referee:  # started before the engine's child imports anything
            from rlconform.harness.run.dispatch import referee_judge
            from rlconform.harness.workers import referee as referee_process
            from rlconform.properties import referee as judge

            try:
                ref = referee_process.start(referee_judge, judge.check_clean)
            except referee_process.RefereeUnavailable as exc:
                return _usage_error(str(exc))
        at = (ref.address, ref.authkey.hex()) if ref is not None else None
        result = run_isolated(_replay_child, (spec, args.engine_path, case.to_json(), at), deadline_s=args.timeout)
        if ref is not None:
            result = _refereed_result(result, case, ref.drain())
    except ChildDied as exc:
        print(f"CRASH: {exc.description}" + (f"\n{exc.stack.strip()}" if exc.stack.strip() else ""))
        return EXIT_DISCREPANCY
    except RuntimeError as exc:
        return _usage_error(f"replay failed in the harness (not the engine): {str(exc).strip().splitlines()[-1]}")
    finally:
        if ref is not None:
            ref.close()
    return _print_replay_result(result)


def _refereed_result(result: dict, case, verdicts: list) -> dict:
    """The replay's result with the referee's verdicts applied (:func:`rlconform.harness.run.status.decide`)."""
    from rlconform.harness.run import status
    from rlconform.harness.run.referee_verdicts import VerdictBook

    if result.get("kind") not in ("pass", "marginal"):
        return result
    book = VerdictBook()
    book.add(verdicts)
    entry = {"id": case.finding_id, "op": case.op, "observed": result["kind"], "examples": 1}
    status.decide(entry, verdicts=book)
    if entry["status"] == result["kind"]:
        return result
    return dict(result, kind=entry["status"], message=entry["message"], traceback="")


def _print_replay_result(result: dict) -> int:
    """Print a replay's verdict (PASS / MARGINAL / DISCREPANCY / CRASH) and return its exit code (MARGINAL:
    within the margin band of the tolerance, exit 0 as in ``check``)."""
    kind = result["kind"]
    if kind == "usage":
        return _usage_error(result["message"])
    if kind == "crash":
        print(f"CRASH: {result['message']}\n{result.get('traceback') or ''}".rstrip())
        return EXIT_DISCREPANCY
    if kind == "pass":
        print(f"PASS: max abs err {result['max_abs_err']:.3g}, max rel err {result['max_rel_err']:.3g}")
        return EXIT_CLEAN
    if kind == "marginal":
        print(f"MARGINAL: {result.get('ratio', float('nan')):.3g}× the tolerance, inside the margin band (not a "
              f"verdict: CPUs' vector widths move an engine's last bits that much); max abs err "
              f"{result['max_abs_err']:.3g}, max rel err {result['max_rel_err']:.3g}")
        msg = (result.get("message") or "").strip()
        if msg:
            print("  " + msg.replace("\n", "\n  "))
        return EXIT_CLEAN
    print(f"DISCREPANCY:\n  {result['message'].strip()}".replace("\n", "\n  "))
    return EXIT_DISCREPANCY


def _coverage_child(spec: str | None, engine_path: str | None, emit=None) -> dict:
    """In a child process: load the engine and build its coverage table (data only), or ``{"error": ...}``."""
    from rlconform.harness.bindings.load import load_engine_with_coverage
    from rlconform.harness.catalog.coverage import coverage_record

    binding, error = load_engine_with_coverage(
        spec, engine_path, "its numerics modules, registries and NOT_BOUND justifications")
    if binding is None:
        return {"error": error}
    record = coverage_record(binding)
    record["spec"] = binding.spec
    return record


def cmd_coverage(args) -> int:
    """Print the engine's coverage table; exit 1 with ``--strict`` when an item is unbound."""
    from rlconform.harness.bindings.load import engine_record
    from rlconform.harness.report.coverage_md import print_table, render_markdown

    spec = args.engine or os.environ.get("RLCONFORM_ENGINE") or "reference"
    record, error = engine_record(_coverage_child, spec, args.engine_path, args.timeout, "the coverage table")
    if error is not None:
        return _usage_error(error)
    if args.changed_since:
        from rlconform.harness.core.code_changes import ChangeError
        from rlconform.harness.report.coverage_changes import changed_items

        if not args.engine_path:
            return _usage_error("--changed-since needs --engine-path (the checkout whose change is read)")
        try:
            record = changed_items(record, args.engine_path, args.changed_since)
        except ChangeError as exc:
            return _usage_error(str(exc))
    fmt = args.format or ("table" if sys.stdout.isatty() else "md")
    if fmt == "json":
        print(json.dumps(record, indent=1))
    elif fmt == "md":
        command = f"rlconform coverage --engine {spec} --format md"
        sys.stdout.write(render_markdown(record, command=command))
    else:
        print_table(record)
    for e in record.get("errors") or []:
        print(f"rlconform: warning: {e}", file=sys.stderr)
    for e in record.get("stale") or []:
        print(f"rlconform: warning: stale justification: {e}", file=sys.stderr)
    unbound = record["counts"].get("unbound", 0)
    if args.strict and unbound:
        print(f"rlconform: {unbound} item(s) of the engine's numerics are unbound (neither bound to an op nor "
              f"justified in the binding's NOT_BOUND table)", file=sys.stderr)
        return EXIT_DISCREPANCY
    return EXIT_CLEAN


def cmd_ledger(args) -> int:
    from rlconform.harness.report.ledger_text import ledger_lines
    from rlconform.harness.report.load import ReportError, load_report, report_path

    if args.stock:
        from rlconform.harness.report import stock_ledgers

        if args.report:
            return _usage_error("ledger takes a report or --stock NAME, not both")
        try:
            path = stock_ledgers.resolve(args.stock)
        except FileNotFoundError as exc:
            return _usage_error(str(exc))
        if path == args.stock:  # not a stock name
            return _usage_error(f"--stock takes a stock ledger's name ({', '.join(stock_ledgers.names())})")
        with open(path, encoding="utf-8") as fh:
            sys.stdout.write(fh.read())
        return EXIT_CLEAN
    if not args.report:
        return _usage_error("ledger needs a report (or --stock NAME)")
    path = report_path(args.report)
    try:
        doc = load_report(path)
    except ReportError as exc:
        return _usage_error(f"cannot read report: {exc}")
    for line in ledger_lines(doc, path):
        print(line)
    return EXIT_CLEAN


def _report_subset(args) -> int:
    """``report SRC --subset SELECTION --to DIR --expect-revision REV --expect-engine SPEC``
    (:mod:`rlconform.harness.report.base_cache`): 0 written, 1 cache miss (why on stderr), 2 bad input."""
    from rlconform.harness.report.attribution import load_selection
    from rlconform.harness.report.base_cache import CacheMiss, subset_report
    from rlconform.harness.report.writer import tool_version

    if not (args.to and args.expect_revision and args.expect_engine):
        return _usage_error("--subset needs --to, --expect-revision and --expect-engine")
    src = os.path.dirname(args.out) or "." if args.out.endswith(".json") else args.out
    try:
        ids = list(load_selection(args.subset).get("ids") or [])
        n = subset_report(src, ids, args.to, revision=args.expect_revision, engine=args.expect_engine,
                          version=tool_version())
    except CacheMiss as exc:
        print(f"rlconform: the report in {src} cannot stand for the base: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        return _usage_error(f"cannot read {src} or {args.subset}: {getattr(exc, 'strerror', None) or exc}")
    print(f"rlconform: the base's {n} selected finding(s) read from {src}")
    return EXIT_CLEAN


def _report_merge(args) -> int:
    """``report SHARD1 --merge SHARD2 ... --to DIR``: the merged report (:mod:`rlconform.harness.report.merge`)
    and check's exit code from it."""
    from rlconform.harness.report.merge import MergeError, merge_reports
    from rlconform.harness.report.severity import FAIL_ON
    from rlconform.harness.report.summary import print_summary

    if not args.to:
        return _usage_error("--merge needs --to DIR")
    if args.fail_on not in FAIL_ON:
        return _usage_error(f"--fail-on {args.fail_on!r}: one of {', '.join(FAIL_ON)}")
    dirs = [args.out, *args.merge]
    try:
        doc = merge_reports(dirs, args.to)
    except MergeError as exc:
        return _usage_error(f"cannot merge: {exc}")
    except (OSError, ValueError) as exc:
        return _usage_error(f"cannot read a shard's report: {getattr(exc, 'strerror', None) or exc}")
    print_summary(doc)
    print(f"rlconform: merged {len(dirs)} shard(s) into {args.to}")
    return report_exit_code(doc, args.fail_on)


def report_exit_code(doc: dict, fail_on: str) -> int:
    """check's exit code read from a finished report: 2 when a finding is ``error`` or a binding error, 1 when
    one fails at ``fail_on`` or above, a ledger line is ``xpass``, or the run is incomplete, else 0."""
    from rlconform.harness.report.severity import fails

    findings = doc.get("findings") or []
    if any(f.get("binding_error") for f in findings) or any(f.get("status") == "error" for f in findings):
        return EXIT_USAGE
    fixed = [d for d in (doc.get("run") or {}).get("ledger_defects") or () if d.get("status") == "xpass"]
    for d in fixed:
        print(f"rlconform: ledger line {d['line']}: defect {d['key']} is listed but none of its findings fails "
              f"now: it is fixed, remove the line", file=sys.stderr)
    run = doc.get("run") or {}
    if any(fails(f, fail_on) for f in findings) or fixed or run.get("complete") is not True:
        return EXIT_DISCREPANCY
    return EXIT_CLEAN


def _report_config(args) -> int:
    """``report DIR --config FILE``: the rows that configuration reaches (:mod:`rlconform.harness.report.config_reach`)."""
    from rlconform.harness.report.config_reach import ConfigError, load_config, render
    from rlconform.harness.report.load import load_report
    from rlconform.harness.report.severity import at_least, normalise

    out = os.path.dirname(args.out) or "." if args.out.endswith(".json") else args.out
    try:
        fail_on = normalise(args.fail_on)
        doc = load_report(out)
        user = load_config(args.config)
    except (ValueError, OSError) as exc:  # ReportError, JsonFileError, ConfigError
        return _usage_error(str(exc) if isinstance(exc, (ConfigError, ValueError)) else f"cannot read: {exc}")
    if not (doc.get("engine") or {}).get("configs"):
        print(f"rlconform: {out}'s report records no configurations (its binding declares none, or the report "
              "predates them): every row is listed as one that cannot be told", file=sys.stderr)
    from rlconform.harness.report.triage import annotate

    text, reached = render(annotate(doc), user, args.config)
    print(text)
    return EXIT_DISCREPANCY if any(at_least(e["severity"], fail_on) for e in reached) else EXIT_CLEAN


def cmd_report(args) -> int:
    from rlconform.harness.report.writer import rerender

    if args.merge is not None:
        return _report_merge(args)
    if args.subset is not None:
        return _report_subset(args)
    if args.config is not None:
        return _report_config(args)

    out = os.path.dirname(args.out) or "." if args.out.endswith(".json") else args.out
    from rlconform.harness.report.load import load_report

    try:
        load_report(out)  # every finding's shape, before anything is rewritten
        md, html = rerender(out)
    except ValueError as exc:  # ReportError, JsonFileError
        return _usage_error(f"cannot read report: {exc}")
    except OSError as exc:
        return _usage_error(f"cannot write the report in {out}: {exc.strerror or exc}")
    print(f"wrote {md} and {html}")
    return EXIT_CLEAN


def main(argv: list[str] | None = None) -> int:
    """Run one command; Ctrl-C or SIGTERM at any moment ends it with exit code 130 and no traceback."""
    installed = interrupts.install()
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("rlconform: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        from rlconform.harness.workers import zygote

        zygote.stop()  # the clean copy helpers forked from, if this command made one
        if installed:
            interrupts.uninstall()


def _main(argv: list[str] | None = None) -> int:
    from rlconform.harness.core.compile_cache import isolate_per_isa
    from rlconform.harness.core.idle_threads import sleep_when_idle

    isolate_per_isa()  # before anything compiles: a forced ISA gets torch.compile kernels of its own
    sleep_when_idle()  # before torch is imported: idle OpenMP threads of every process of the run sleep
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if args.command == "list-ops":
        return cmd_list_ops()
    if args.command == "list-engines":
        return cmd_list_engines()
    if args.command in ("check", "replay", "fuzz"):
        bad = _apply_device(args)
        if bad:
            return _usage_error(bad)
    if args.command == "check":
        return cmd_check(args)
    if args.command == "replay":
        return cmd_replay(args)
    if args.command == "fuzz":
        from rlconform.harness.run.fuzz import cmd_fuzz

        return cmd_fuzz(args)
    if args.command == "report":
        return cmd_report(args)
    if args.command == "diff":  # --- triage ---
        from rlconform.harness.report.diff import cmd_diff

        return cmd_diff(args)
    if args.command == "bisect":  # --- bisect ---
        from rlconform.harness.run.bisect import cmd_bisect

        return cmd_bisect(args)
    if args.command == "explain":  # --- explain ---
        from rlconform.harness.report.explain_cmd import cmd_explain

        return cmd_explain(args)
    if args.command == "ledger":
        return cmd_ledger(args)
    if args.command == "coverage":
        return cmd_coverage(args)
    if args.command == "audit":  # --- static audit ---
        from rlconform.harness.run.audit import cmd_audit

        return cmd_audit(args)
    if args.command == "init":  # --- adoption in a fork ---
        from rlconform.harness.run.init_cmd import cmd_init

        return cmd_init(args)
    if args.command == "matrix":  # --- version matrix ---
        from rlconform.harness.run.matrix import cmd_matrix

        return cmd_matrix(args)
    return _usage_error(f"unknown command {args.command!r}")  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The ``rlconform`` command line.

    rlconform check --engine verl [--op entropy] [--profile ci] [--out DIR] [--xfails FILE] [-n 2]
    rlconform replay DIR/cases/<finding id>.json
    rlconform fuzz --engine X [--op Y] --minutes N [--corpus DIR] [--db DIR]
    rlconform report DIR                       (re-render report.md and report.html from report.json)
    rlconform ledger DIR/report.json > xfails.txt
    rlconform diff BASE HEAD [--fail-on wrong|imprecise] [--markdown FILE]   (what a pull request changes)
    rlconform bisect --engine-path CHECKOUT --good REV --bad REV CASE_FILE [--engine SPEC]   (issue 12 §4)
    rlconform list-ops | list-engines | --version

Exit codes: 0 clean, 1 discrepancies (or crashes, unavailable ops, ledger entries that now pass; with
``--fail-on wrong`` only ``wrong``/``destructive`` discrepancies and crashes count), 2 usage
or binding error, 130 interrupted (Ctrl-C) before anything failed. A report already written is never
removed; an interrupted run's report says it is incomplete.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

EXIT_CLEAN, EXIT_DISCREPANCY, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


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
    from rlconform.harness.report import tool_version

    p = _Parser(prog="rlconform", description="Conformance and fuzzing harness for the numerics of RL trainers.")
    p.add_argument("--version", action="version", version=f"rlconform {tool_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    c = sub.add_parser("check", help="check an engine against the exact references and write a report")
    _engine_args(c)
    c.add_argument("--out", default="rlconform-report", help="report directory (default: %(default)s)")
    c.add_argument("--op", action="append", default=[], help="only this op (repeatable)")
    c.add_argument("--property", action="append", default=[], help="only this property (repeatable)")
    c.add_argument("--dtype", action="append", default=[], help="only this dtype (repeatable)")
    c.add_argument("--profile", default="ci", choices=["dev", "ci", "nightly"], help="hypothesis profile")
    c.add_argument("--max-examples", type=_positive_int, default=None,
                   help="examples per finding (overrides the profile)")
    c.add_argument("--seed", type=int, default=None, help="random seed (disables derandomization)")
    c.add_argument("--xfails", default=None, help="ledger of known discrepancies, one finding id per line")
    c.add_argument("--corpus", default=None, help="corpus of saved counterexamples to replay first "
                                                  "(default: ./rlconform-corpus if it exists)")
    c.add_argument("-n", "--numprocesses", default=None, help="pytest-xdist workers (e.g. 2 or auto)")
    c.add_argument("--junitxml", default=None, help="also write JUnit XML here")
    c.add_argument("-q", "--quiet", action="store_true", help="only the summary")
    # --- triage (issue 12) ---
    c.add_argument("--fail-on", choices=["wrong", "imprecise"], default="imprecise",
                   help="the least severe failing finding that turns the exit code red (default: %(default)s, "
                        "any failing finding; wrong: only wrong and destructive ones; ledger entries that now "
                        "pass and unavailable ops always do)")

    r = sub.add_parser("replay", help="re-run one saved case (a reproducer) and print the outcome")
    r.add_argument("case_file")
    r.add_argument("--engine", default=None, help="override the engine recorded in the case file")
    r.add_argument("--engine-path", default=None)

    lg = sub.add_parser("ledger", help="print an xfails ledger listing the failing findings of a report")
    lg.add_argument("report", help="a report.json (or the folder holding it)")

    from rlconform.harness.fuzz import add_parser as add_fuzz_parser

    add_fuzz_parser(sub)

    from rlconform.harness.diff import add_parser as add_diff_parser  # --- triage (issue 12) ---

    add_diff_parser(sub)

    from rlconform.harness.bisect import add_parser as add_bisect_parser  # --- bisect (issue 12 §4) ---

    add_bisect_parser(sub)

    rp = sub.add_parser("report", help="re-render report.md and report.html from a report.json")
    rp.add_argument("out", help="a report folder (holding report.json), or the report.json itself")

    sub.add_parser("list-ops", help="list the op catalog")
    sub.add_parser("list-engines", help="list the built-in engines and mutants")
    return p


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _engine_args(p) -> None:
    p.add_argument("--engine", default=None, help="reference | verl | skyrl | megatron | mutants.<family> | "
                                                 "module:attr | file.py (default: $RLCONFORM_ENGINE or reference)")
    p.add_argument("--engine-path", default=None, help="a fork's checkout, put first on sys.path")


def _usage_error(message: str) -> int:
    print(f"rlconform: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def cmd_list_ops() -> int:
    from rlconform.harness.catalog import OPS

    for op in OPS.values():
        dtypes = sorted({d for d, _ in op.cases()})
        print(f"{op.name:24s} {op.kind:16s} properties: {', '.join(op.properties)}")
        print(f"{'':24s} {'':16s} regimes: {', '.join(op.regimes)}; dtypes: {', '.join(dtypes)}")
    return EXIT_CLEAN


def cmd_list_engines() -> int:
    from rlconform.harness.engines import available_engines

    for name in available_engines():
        print(name)
    return EXIT_CLEAN


def cmd_check(args) -> int:
    import pytest

    from rlconform.harness.binding import BindingError
    from rlconform.harness.engines import load_engine
    from rlconform.harness.xfails import parse_xfails

    from rlconform.harness.catalog import FLOAT_DTYPES, OPS, PROPERTIES

    try:  # fail fast, with exit code 2, on a bad engine, filter or ledger
        binding = load_engine(args.engine, args.engine_path)
        if args.xfails:
            parse_xfails(args.xfails)
    except BindingError as exc:
        return _usage_error(str(exc))
    for flag, values, known in (("--op", args.op, OPS), ("--property", args.property, PROPERTIES),
                                ("--dtype", args.dtype, FLOAT_DTYPES)):
        unknown = [v for v in values if v not in known]
        if unknown:
            return _usage_error(f"unknown {flag} {', '.join(unknown)}; choose from {', '.join(known)}")
    missing = [op for op in args.op if op not in binding.provided_ops()]
    if missing:
        return _usage_error(f"engine {binding.spec!r} does not bind {', '.join(missing)}; it binds "
                            f"{', '.join(binding.provided_ops())}")
    selected = [(op.name, p, d) for op in OPS.values() if op.name in binding.provided_ops()
                for p, d, _ in op.findings()
                if (not args.op or op.name in args.op) and (not args.property or p in args.property)
                and (not args.dtype or d in args.dtype)]
    if not selected:
        return _usage_error("no finding matches the filters (a property may not apply to the op, or the op "
                            "not to the dtype); see `rlconform list-ops`")
    spec = binding.spec
    corpus = args.corpus
    if corpus is None and os.path.isdir("rlconform-corpus"):
        corpus = "rlconform-corpus"
    with tempfile.TemporaryDirectory() as tmp:
        ini = os.path.join(tmp, "pytest.ini")
        with open(ini, "w") as fh:
            fh.write("[pytest]\naddopts =\n")
        argv = [
            *_test_dirs(), "-c", ini, "--rootdir", tmp, "--import-mode=importlib", "-p", "no:cacheprovider",
            "-p", "rlconform.harness.pytest_plugin", "--rlconform-engine", spec,
            "--rlconform-out", args.out, "--rlconform-profile", args.profile,
            "--rlconform-command", " ".join(["rlconform"] + sys.argv[1:]),
            "-q" if not args.quiet else "-qq", "--no-header", "-rN", "--tb=no",
        ]
        if args.engine_path:
            argv += ["--rlconform-engine-path", args.engine_path]
        for flag, values in (("--rlconform-op", args.op), ("--rlconform-property", args.property),
                             ("--rlconform-dtype", args.dtype)):
            for v in values:
                argv += [flag, v]
        if args.max_examples is not None:
            argv += ["--rlconform-max-examples", str(args.max_examples)]
        if args.seed is not None:
            argv += ["--rlconform-seed", str(args.seed)]
        if args.xfails:
            argv += ["--rlconform-xfails", os.path.abspath(args.xfails)]
        if corpus:
            argv += ["--rlconform-corpus", os.path.abspath(corpus)]
        if args.numprocesses:
            argv += ["-n", str(args.numprocesses)]
        if args.junitxml:
            argv += ["--junitxml", os.path.abspath(args.junitxml)]
        env_engine = os.environ.pop("RLCONFORM_ENGINE", None)
        try:
            code = pytest.main(argv)
        finally:
            if env_engine is not None:
                os.environ["RLCONFORM_ENGINE"] = env_engine
    report_path = os.path.join(args.out, "report.json")
    if int(code) in (3, 4) or not os.path.exists(report_path):
        return _usage_error(f"the check could not run (pytest exit code {int(code)}); see the messages above")
    with open(report_path) as fh:
        doc = json.load(fh)
    from rlconform.harness.summary import print_summary

    print_summary(doc)
    from rlconform.harness.severity import fails  # --- triage (issue 12): --fail-on ---

    if any(f.get("binding_error") for f in doc["findings"]):
        return EXIT_USAGE
    if any(fails(f, args.fail_on) for f in doc["findings"]):
        return EXIT_DISCREPANCY
    if int(code) == 2:  # interrupted before anything failed
        return EXIT_INTERRUPTED
    return EXIT_CLEAN


def cmd_replay(args) -> int:
    from rlconform.harness.binding import BindingError
    from rlconform.harness.engines import load_engine
    from rlconform.properties.case import Case
    from rlconform.harness.dispatch import run_check
    from rlconform.harness.evaluation import EngineCrash

    try:
        with open(args.case_file) as fh:
            doc = json.load(fh)
        case = Case.from_json(doc)
    except (OSError, ValueError, KeyError) as exc:
        return _usage_error(f"cannot read case file {args.case_file}: {exc}")
    recorded = doc.get("engine") or {}
    try:
        binding = load_engine(args.engine or recorded.get("spec"), args.engine_path or recorded.get("path"))
    except BindingError as exc:
        return _usage_error(str(exc))
    print(f"replaying {case.finding_id} on engine {binding.spec}")
    print(f"  input: {case.summary()}")
    try:
        outcome = run_check(binding, case)
    except EngineCrash as exc:
        print(f"CRASH: {exc}\n{exc.engine_traceback}")
        return EXIT_DISCREPANCY
    except BindingError as exc:
        return _usage_error(str(exc))
    if outcome.ok:
        print(f"PASS: max abs err {outcome.max_abs_err:.3g}, max rel err {outcome.max_rel_err:.3g}")
        return EXIT_CLEAN
    print(f"DISCREPANCY:\n  {outcome.message.strip()}".replace("\n", "\n  "))
    return EXIT_DISCREPANCY


def cmd_ledger(args) -> int:
    path = os.path.join(args.report, "report.json") if os.path.isdir(args.report) else args.report
    try:
        with open(path) as fh:
            doc = json.load(fh)
        findings = doc["findings"]
    except (OSError, ValueError, KeyError) as exc:
        return _usage_error(f"cannot read report {path}: {exc}")
    eng = doc.get("engine", {})
    print(f"# rlconform xfails ledger for {eng.get('name')} {eng.get('version') or ''}: known discrepancies, "
          f"one finding id per line")
    print(f"# generated from {path} by `rlconform ledger`")
    for f in sorted(findings, key=lambda f: f["id"]):
        if f["status"] in ("discrepancy", "crash", "xfail"):
            first = (f.get("message") or "").strip().splitlines()
            note = first[0][:140] if first else f["status"]
            print(f"{f['id']}  # {f['status']}: {note}")
    return EXIT_CLEAN


def cmd_report(args) -> int:
    from rlconform.harness.report import rerender

    out = os.path.dirname(args.out) or "." if args.out.endswith(".json") else args.out
    try:
        md, html = rerender(out)
    except (OSError, ValueError, KeyError) as exc:
        return _usage_error(f"cannot read report {os.path.join(out, 'report.json')}: {exc}")
    print(f"wrote {md} and {html}")
    return EXIT_CLEAN


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if args.command == "list-ops":
        return cmd_list_ops()
    if args.command == "list-engines":
        return cmd_list_engines()
    if args.command == "check":
        return cmd_check(args)
    if args.command == "replay":
        return cmd_replay(args)
    if args.command == "fuzz":
        from rlconform.harness.fuzz import cmd_fuzz

        return cmd_fuzz(args)
    if args.command == "report":
        return cmd_report(args)
    if args.command == "ledger":
        return cmd_ledger(args)
    if args.command == "diff":  # --- triage (issue 12) ---
        from rlconform.harness.diff import cmd_diff

        return cmd_diff(args)
    if args.command == "bisect":  # --- bisect (issue 12 §4) ---
        from rlconform.harness.bisect import cmd_bisect

        return cmd_bisect(args)
    return _usage_error(f"unknown command {args.command!r}")  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

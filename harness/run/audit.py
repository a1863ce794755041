"""``rlconform audit --engine E [--report DIR]``: the static audit of fault shapes, with each hit
linked to the dynamic findings of its function.

The engine is loaded in a child process (as ``rlconform coverage`` does) to build its coverage table, which
says which functions are bound; the rules (:mod:`rlconform.harness.catalog.audit`) read the source of the
functions whole-package discovery finds; the link to findings (:mod:`rlconform.harness.report.audit_md`)
reads ``DIR/report.json``. Exit 0 whatever the audit finds (the audit never turns a run red); 2 for bad
input (an engine that cannot be loaded or declares no coverage, an unreadable report), with one line.
"""

from __future__ import annotations

import json
import os
import sys

__all__ = ["add_parser", "audit_record", "cmd_audit"]

EXIT_CLEAN, EXIT_USAGE = 0, 2


def add_parser(sub) -> None:
    """Add the ``audit`` subcommand to the CLI's subparsers."""
    a = sub.add_parser("audit", help="list the places in the engine's numerics that match known fault shapes, "
                       "linked to a report's findings (never fails a run)")
    a.add_argument("--engine", default=None, help="reference | verl | skyrl | megatron | module:attr | file.py "
                   "(default: $RLCONFORM_ENGINE or reference); the engine must declare coverage")
    a.add_argument("--engine-path", default=None, help="a fork's checkout, put first on sys.path")
    a.add_argument("--report", default=None, metavar="DIR",
                   help="a report folder (or its report.json): link each hit to that report's findings")
    a.add_argument("--format", choices=["md", "json"], default="md", help="md (default) or json")
    a.add_argument("--timeout", type=float, default=900.0, help="seconds the engine's import may take")


def audit_record(binding) -> dict:
    """The audit of ``binding``'s engine (which declares coverage): ``{"engine", "version", "hits",
    "coverage", "errors"}``. Runs in the child that loaded the engine; the rules only read source."""
    from rlconform.harness.catalog.audit import audit
    from rlconform.harness.catalog.coverage import coverage_record
    from rlconform.harness.catalog.discovery import discover

    coverage = coverage_record(binding) or {}
    packages = (coverage.get("discovery") or {}).get("packages") or []
    hits, errors = [], []
    for package in packages:
        try:
            found, unread = discover(package)
        except FileNotFoundError as exc:
            errors.append(str(exc))
            continue
        errors += unread  # a file the audit could not read is not a file without hits
        hits += [h.to_json() for h in audit(found)]
    return {"engine": binding.name, "version": binding.version, "hits": hits, "errors": errors,
            "coverage": {"items": [{k: it[k] for k in ("name", "status", "bound_to")}
                                   for it in coverage.get("items", [])]}}


def _audit_child(spec: str | None, engine_path: str | None, emit=None) -> dict:
    from rlconform.harness.bindings.load import load_engine_with_coverage

    binding, error = load_engine_with_coverage(spec, engine_path, "the audit reads the packages its coverage names")
    return {"error": error} if binding is None else audit_record(binding)


def cmd_audit(args) -> int:
    from rlconform.harness.catalog.audit import RULES
    from rlconform.harness.report.audit_md import link, render_markdown
    from rlconform.harness.report.load import ReportError, load_report, report_path

    def usage(message: str) -> int:
        print(f"rlconform: error: {message}", file=sys.stderr)
        return EXIT_USAGE

    doc = None
    if args.report is not None:
        try:
            doc = load_report(report_path(args.report))
        except (ReportError, OSError) as exc:
            return usage(f"cannot read report {args.report!r}: {exc}")
    spec = args.engine or os.environ.get("RLCONFORM_ENGINE") or "reference"
    from rlconform.harness.bindings.load import engine_record

    record, error = engine_record(_audit_child, spec, args.engine_path, args.timeout, "the audit")
    if error is not None:
        return usage(error)
    record = link(record, doc)
    if args.format == "json":
        print(json.dumps({k: v for k, v in record.items() if k != "coverage"}, indent=1))
    else:
        command = f"rlconform audit --engine {spec}" + (f" --report {args.report}" if args.report else "")
        sys.stdout.write(render_markdown(record, command=command, rules=RULES))
    if record.get("errors"):  # the audit is incomplete: what it could not read is listed above
        print(f"rlconform: error: the audit could not read {len(record['errors'])} file(s) or package(s): "
              f"{record['errors'][0]}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_CLEAN

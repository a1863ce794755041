"""The ``rlconform explain DEFECT_ID --report DIR [--script PATH]`` command: reads the report
folder (:func:`rlconform.harness.report.load.load_report`), finds the defect (its id or a unique prefix) and
prints :func:`rlconform.harness.report.explain.explain_markdown`, or writes the standalone script only. A bad
report, an unknown or ambiguous id, a case file outside the folder or a defect none of whose member findings
has a script template (with ``--script``: "no standalone script for this kind yet (none of its N member
findings is a case a template is written for; e.g. …)") is one line on stderr and exit 2; without
``--script`` such a defect is explained with that line in place of the script, exit 0. (A module of its own: ``explain`` is imported by the report
writer, which ``load`` imports.)
"""

from __future__ import annotations

import os
import sys

from rlconform.harness.report.explain import (
    NO_SCRIPT,
    ExplainError,
    declared_card,
    explain_markdown,
    find_defect,
    read_case,
    standalone_script,
)


# ------------------------------------------------------------------------------------------- command
def add_parser(sub) -> None:
    p = sub.add_parser("explain", help="a defect as Markdown ready to paste upstream, with a standalone script")
    p.add_argument("defect", help="a defect id of the report (or a prefix of exactly one)")
    p.add_argument("--report", required=True, help="the report folder (report.json and cases/)")
    p.add_argument("--script", default=None, metavar="PATH",
                   help="write only the standalone script, to PATH (exit 2 when the defect has none)")


def cmd_explain(args) -> int:
    from rlconform.harness.report.load import ReportError, load_report, report_path

    folder = args.report if os.path.isdir(args.report) else os.path.dirname(args.report) or "."
    try:
        doc = load_report(args.report)
        card = declared_card(doc, args.defect)  # a declared write: its hazard, no defect
        if card is not None and not args.script:
            sys.stdout.write(card)
            return 0
        d = find_defect(doc, args.defect, report_path(args.report))
        case = read_case(folder, d)
        if args.script:
            text, why = standalone_script(doc, d, folder)
            if text is None:
                raise ExplainError(f"defect {d['id']}: {NO_SCRIPT} ({why})")
            with open(args.script, "w", encoding="utf-8") as f:
                f.write(text)
            print(f"wrote {args.script}")
            return 0
        sys.stdout.write(explain_markdown(doc, d, case, folder))
    except (ExplainError, ReportError) as exc:
        print(f"rlconform: {exc}", file=sys.stderr)
        return 2
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:  # a report or case file of the wrong shape
        print(f"rlconform: cannot explain {args.defect!r}: malformed report or case file "
              f"({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"rlconform: cannot write {args.script}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0

"""One-screen terminal summary of a report: a table op × property × dtype (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from rlconform.harness.catalog.ops import FLOAT_DTYPES

_ORDER = ("crash", "discrepancy", "error", "binding_error", "xpass", "unavailable", "xfail", "marginal", "pass")
_STYLE = {"crash": "bold red", "discrepancy": "bold red", "error": "bold yellow", "binding_error": "bold yellow", "xpass": "bold magenta",
          "unavailable": "yellow", "xfail": "cyan", "marginal": "dim green", "pass": "green"}
_SHORT = {"crash": "CRASH", "discrepancy": "FAIL", "error": "ERROR", "binding_error": "BIND", "xpass": "XPASS", "unavailable": "n/a",
          "xfail": "xfail", "marginal": "~ok", "pass": "ok"}


def print_summary(doc: dict, console: Console | None = None) -> None:
    """Print the summary table: one row per op × property, one column per dtype; a cell shows the
    worst status over regimes and how many regimes have it."""
    console = console or Console(width=120)
    cells: dict[tuple[str, str], dict[str, list[str]]] = {}
    for f in doc["findings"]:
        cells.setdefault((f["op"], f["property"]), {}).setdefault(f["dtype"], []).append(f["status"])
    eng = doc["engine"]
    table = Table(title=f"rlconform · {eng.get('name')} {eng.get('version') or ''}".strip(), show_lines=False)
    table.add_column("op")
    table.add_column("property")
    for d in FLOAT_DTYPES:
        table.add_column(d, justify="center")
    for (op, prop), by_dtype in sorted(cells.items()):
        row = []
        for d in FLOAT_DTYPES:
            sts = by_dtype.get(d)
            if not sts:
                row.append("")
                continue
            worst = min(sts, key=_ORDER.index)
            n = sts.count(worst)
            text = _SHORT[worst] + (f" {n}/{len(sts)}" if worst != "pass" else "")
            row.append(f"[{_STYLE[worst]}]{text}[/]")
        table.add_row(op, prop, *row)
    console.print(table)
    s = doc["summary"]
    console.print("  ".join(f"{k}: {v}" for k, v in s.items() if v) or "no findings")
    from rlconform.harness.report.worker_only import worker_only_line

    worker_only = worker_only_line(doc, bold="")
    if worker_only:
        console.print(worker_only, highlight=False, soft_wrap=True)
    if not doc["run"].get("complete"):
        not_run = doc["run"].get("not_run") or []
        why = "interrupted" if doc["run"].get("interrupted") or not not_run else \
            f"{len(not_run)} selected finding(s) not run, e.g. {not_run[0]}"
        console.print(f"[bold yellow]INCOMPLETE RUN[/] ({why}): the report holds the findings made so far",
                      highlight=False)
    # an unavailable op is one line with its cause, not one line per finding
    unavailable: dict[str, list[dict]] = {}
    for f in doc["findings"]:
        if f["status"] == "unavailable":
            unavailable.setdefault(f["op"], []).append(f)
    for op, fs in unavailable.items():
        console.print(f"[{_STYLE['unavailable']}]unavailable op {op}[/] ({len(fs)} finding(s)): "
                      f"{unavailable_cause(fs[0])}"[:400], highlight=False, soft_wrap=True)
    binding_errors: dict[str, list[dict]] = {}  # the binding does not fit this engine version
    for f in doc["findings"]:
        if f["status"] == "binding_error":
            binding_errors.setdefault(f["op"], []).append(f)
    for op, fs in binding_errors.items():
        first = (fs[0].get("message") or "").strip().splitlines()[:1]
        console.print(f"[{_STYLE['binding_error']}]binding error, op {op}[/] ({len(fs)} finding(s), not an engine "
                      f"defect): {first[0] if first else ''}"[:400], highlight=False, soft_wrap=True)
    declared = [f for f in doc["findings"] if f.get("declared_write")]  # the engine's declared writes: not red
    if declared:
        console.print(f"{len(declared)} finding(s) show only a write the engine declares "
                      f"({', '.join(sorted({f['declared_write'] for f in declared}))}): see \"Conventions and guards\"",
                      highlight=False, soft_wrap=True)
    bad = [f for f in doc["findings"] if f["status"] in ("discrepancy", "crash", "error", "xpass")
           and not f.get("declared_write")]
    for f in bad[:12]:
        first = (f.get("message") or "").strip().splitlines()[:1]
        console.print(f"[{_STYLE[f['status']]}]{f['status']}[/] {f['id']}: {first[0] if first else ''}"[:400],
                      highlight=False, soft_wrap=True)
        if f.get("reproducer"):
            console.print(f"    reproduce: {f['reproducer']['command']}", highlight=False, soft_wrap=True)
    if len(bad) > 12:
        console.print(f"... and {len(bad) - 12} more (see report.md)")


def unavailable_cause(finding: dict) -> str:
    """The cause of an unavailable op in one line: the exception line of its message (``ModuleNotFoundError:
    No module named 'x'``), never the traceback's header."""
    lines = [x.strip() for x in (finding.get("message") or "").strip().splitlines() if x.strip()]
    for x in lines:
        if "unavailable:" in x:
            return x.split("unavailable:", 1)[1].strip()
    exc = [x for x in lines if not x.startswith(("Traceback", "File ", "^", "~")) and ":" in x]
    return exc[-1] if exc else (lines[-1] if lines else "unavailable")

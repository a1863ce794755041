"""Report writers: ``report.json`` (versioned schema), ``report.md`` (a pull-request comment) and, when
the run ends, ``report.html`` (self-contained, with plots; :mod:`rlconform.harness.report.html_report`).

The JSON report is rewritten atomically (temp file + rename) as findings arrive, so a run that is
interrupted, or whose later ops crash, keeps the findings already made: at once when the last write is
long enough ago, else by a timer within :data:`WRITE_INTERVAL_S` (or :data:`WRITE_COST_FACTOR` times the
last write's duration, whichever is longer), and always when the run ends. A write runs the whole triage
(about 1.6 s for verl's 1,777 findings), so a write per finding made the report writer the largest cost of a
check on a 2-core machine (it grew with the square of the findings). ``complete`` is false until the run
ends normally.

Schema ``rlconform.report/1``::

    {"schema": "rlconform.report/1", "tool": {"name", "version"},
     "engine": {"name", "spec", "version", "path", "revision"},
     "run": {"started", "finished", "complete", "profile", "seed", "command", "python", "torch", "hypothesis",
             "device": {"device": "cpu" | "cuda:N", "name": the CPU's or GPU's name, "torch", "cuda": the CUDA
                        version (CUDA runs; else null), "capability": "major.minor" | null, "cpu_capability": torch's CPU
                        kernel ISA, "AVX512" | "AVX2" | "DEFAULT" | …},
             "judged_by": "referee" (a process that never imports the engine) | "engine process" (--no-referee;
                          rlconform's own reference and mutants by default),
             "not_run": [finding ids selected but never run (a run that ended early), when known],
             "interrupted": true when Ctrl-C / SIGTERM ended it},
     "summary": {"pass": n, "marginal": n, "discrepancy": n, "crash": n, "error": n, "unavailable": n, "xfail": n,
                 "xpass": n},
     "findings": [{"id", "op", "property", "dtype", "regime", "status", "examples", "max_abs_err",
                   "max_rel_err", "tolerance", "message", "worst_input", "input_scale", "reproducer": {"case_file",
                   "command"} | null, "traceback", "xfail_listed",
                   "status" decided by :func:`rlconform.harness.run.status.decide` ("xfail_of": what a listed
                   failure is, "ledger_defect": the defect line that lists it, "ledger_grown": {"line",
                   "recorded", "max_ratio"} when a member's error grew past its line's max_ratio tenfold),
                   "failure": {"clauses": [clause records of rlconform.harness.core.failure], "crash": {"type",
                   "where", "text"}, "version"} (failing and marginal findings; ``message`` is their rendering; absent in a report
                   of an older rlconform: read from its message by rlconform.harness.report.legacy_failure),
                   "max_ratio": worst error / tolerance (null: unbounded, a failure without a numeric bound),
                   "samples": [{"imbalance", "abs_err", "rel_err", "ratio", "ok"}] | null,
                   "profiles": [the profiles that add this finding's regime] (profile-only regimes only,
                   e.g. ``real_shapes``: ["nightly"]; absent otherwise),
                   "severity": "training" | "destructive" | "logging" | "robustness" | "precision" (failing
                   findings only), "severity_reason",
                   "engine_function": {"function", "module", "file", "line"} | null (failing findings only:
                   the engine callable behind the op / variant / implementation, ``file`` relative to the
                   directory of the engine's top package, ``line`` its ``def``),
                   "crash_frame": {"function", "module", "file", "line"} | null (a crash: the deepest
                   traceback frame inside the engine's package, ``line`` the executing one),
                   "trigger": the shrunk input's feature that brings the failure out ("a row with no valid
                   token", "TP > 1", …),
                   "transcribed": the part of the op's engine path the binding transcribes instead of calling
                   (absent when every stage calls the engine's code)}],
     "defects": [{"id", "severity", "effect", "engine_function", "crash_frame", "upstream", "trigger", "op",
                  "ops", "property", "properties", "signature": {"kind", "feature"}, "members", "dtypes",
                  "regimes", "numbers": {"engine", "exact", "clause", "component", "sides", "quantity"} | null, "reproducer": {"finding",
                  "case_file", "command", "input"}, "message" (the shown member's first line, quoted), "raised"
                  (a crash row: the engine's text for its exception), "lost" (a missing-output row: what its
                  clause says was lost), "reach", "reach_text"}]  (ranked by
                  severity in SEVERITIES order — training before destructive —, then ``reach`` — 3
                  every step of a configuration, 2 any input, 1 an edge input, 0 contrived: another dtype or an
                  extreme regime —, then ``effect`` — the most reachable worst member's relative error,
                  the absolute one at an exact 0, inf for a crash, a NaN / inf, a changed tensor or a value
                  scaled by the number of micro-batches —, then the number of members; ``upstream``: the distribution holding the
                  deepest frame when another package than the engine function's, else null),
     "triage": {"defects": {severity: n}, "findings": {severity: n}},
     "coverage": {"engine", "version", "modules", "counts": {"unbound", "bound", "justified"},
                  "items": [{"name", "module", "short", "kind", "status", "bound_to", "reason"}],
                  "errors", "stale"}   (``rlconform check`` only, when the binding declares one)}

``coverage``: :mod:`rlconform.harness.catalog.coverage`: every public function of the engine's numerics
modules and every registry entry, bound to an op, justified, or unbound.

``severity``, ``defects`` and ``triage``: :mod:`rlconform.harness.report.triage` (added by :func:`document`).
``engine_function``, ``crash_frame``, ``trigger``: recorded by the worker that ran the engine
(:mod:`rlconform.harness.run.root_cause`); a report without them (written before) is triaged with fallbacks
(the op, the input feature), so ``rlconform report`` re-renders it. ``engine.engine_dtypes``: op -> the dtypes
the engine's trainer calls it with (the binding's ``engine_dtypes``; ``{}`` when it declares none).

``samples`` (partition ops ``agg_loss`` / ``metric_pipeline``, properties ``matches_reference`` and
``partition_invariant`` only): at most 50 examples of the finding, failing ones first, with the shard
imbalance of the example (max shard nnz / max(1, min shard nnz), worst partition) and its errors.

Status: ``pass``, ``discrepancy``, ``crash`` (the engine raised, killed or hung its process, or left
torch's global state changed), ``binding_error`` (the binding's own adapter raised a TypeError /
AttributeError / ImportError / NameError: it does not fit this engine version; the message names the
version and the missing name; no engine defect, listed in its own section; exit code 2), ``error`` (the harness could not check the finding — a corrupt corpus
file, a strategy or plugin error — never the engine's fault; exit code 2), ``unavailable`` (the op could
not be loaded), ``xfail`` (a discrepancy listed in the ``--xfails`` ledger), ``xpass`` (listed but now
passes: remove it from the ledger; counts as a failure), ``marginal`` (no example beyond the margin band,
one inside it: between 1/2 and 4 times the tolerance — too close to call, since CPUs' vector widths move
an engine's last bits that much; never a failure, listed or not; see
:func:`rlconform.harness.core.tolerance.verdict`).

``complete`` is true only when the run ended normally *and* every selected finding was recorded.
A report that cannot be written (disk full, unwritable folder, out of memory) raises
:class:`ReportWriteError`.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import time
from importlib import metadata

from rlconform.harness.report.atomic_write import atomic_write
from rlconform.harness.report.case_paths import relativise

SCHEMA = "rlconform.report/1"
STATUSES = ("discrepancy", "crash", "error", "binding_error", "xpass", "unavailable", "xfail", "marginal", "pass")
#: statuses that make a run red: an unavailable op too (a renamed or broken function must not pass CI)
FAILING = ("discrepancy", "crash", "error", "xpass", "unavailable")


class ReportWriteError(Exception):
    """The report could not be written; the message names the file and the reason."""


def tool_version() -> str:
    try:
        return metadata.version("rlconform")
    except metadata.PackageNotFoundError:
        return "0+unknown"


_atomic_write = atomic_write


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


#: the least time between two writes of the report while findings arrive, in seconds
WRITE_INTERVAL_S = 1.0
#: ... and the least multiple of the last write's own duration (the writer takes at most ~1/(1+k) of a core)
WRITE_COST_FACTOR = 4.0


class ReportWriter:
    """Accumulates findings and rewrites ``out_dir/report.json`` and ``report.md`` as they arrive (at most
    every :data:`WRITE_INTERVAL_S` s or :data:`WRITE_COST_FACTOR` write durations; a timer writes the last
    ones when no other finding follows; :meth:`write` writes at once).

    If ``out_dir/report.json`` exists from an earlier run of the *same engine* with ``resume=True``,
    its findings are kept and new ones replace those with the same id.
    """

    def __init__(self, out_dir: str, engine: dict, run: dict, *, resume: bool = False, coverage: dict | None = None):
        self.out_dir = out_dir
        self.json_path = os.path.join(out_dir, "report.json")
        self.md_path = os.path.join(out_dir, "report.md")
        self.html_path = os.path.join(out_dir, "report.html")
        self.engine = engine
        self.coverage = coverage
        self.run = {"started": _now(), "finished": None, "complete": False, "python": platform.python_version(),
                    **run}
        try:
            import torch

            self.run.setdefault("torch", torch.__version__)
        except ImportError:  # pragma: no cover
            pass
        try:  # the examples a finding draws are hypothesis' (pinned in install/constraints.txt)
            import hypothesis

            self.run.setdefault("hypothesis", hypothesis.__version__)
        except ImportError:  # pragma: no cover
            pass
        if "device" not in self.run:
            from rlconform.harness.core import device

            try:
                self.run["device"] = device.describe()
            except Exception as exc:  # noqa: BLE001 - a report is written whatever the device says of itself
                self.run["device"] = {"device": os.environ.get(device.ENV) or "cpu", "name": f"unknown ({exc})",
                                      "torch": self.run.get("torch"), "cuda": None, "capability": None}
        self.findings: dict[str, dict] = {}
        self.last: tuple[dict, str, str] | None = None  # (document, report.json text, report.md text) last written
        import threading

        self._lock = threading.RLock()  # the timer's write and the caller's add / write
        self._timer: threading.Timer | None = None  # a pending write of findings added since the last one
        self._written_at = -math.inf  # time.monotonic() when the last write ended
        self._write_s = 0.0  # how long it took
        self._timer_error: ReportWriteError | None = None  # the timer's write failed: raised by the next add / write
        if resume and os.path.exists(self.json_path):
            try:
                from rlconform.harness.core.safe_json import load_object

                old = load_object(self.json_path)
                if old.get("schema") == SCHEMA and old.get("engine", {}).get("spec") == engine.get("spec"):
                    self.findings = {f["id"]: f for f in old.get("findings", [])}
            except (OSError, ValueError):
                pass

    def add(self, finding: dict) -> None:
        """Record ``finding`` and write the report now, or by a timer soon (module docstring); raises
        :class:`ReportWriteError` when a write (this one, or a timer's since the last call) failed."""
        with self._lock:
            self.findings[finding["id"]] = finding
            self._raise_timer_error()
            wait = self._written_at + max(WRITE_INTERVAL_S, WRITE_COST_FACTOR * self._write_s) - time.monotonic()
            if wait <= 0:
                self.write()
            elif self._timer is None:
                import threading

                self._timer = threading.Timer(wait, self._flush)
                self._timer.daemon = True
                self._timer.start()

    def update_run(self, **fields) -> None:
        """Set ``run`` fields (not_run, interrupted, …) under the writer's lock: a timer's write in progress
        never reads the run record half changed."""
        with self._lock:
            self.run.update(fields)

    def _flush(self) -> None:
        with self._lock:
            if self._timer is None or self.run.get("finished"):  # a write came first, or the run's last one
                return
            self._timer = None
            try:
                self._write()
            except ReportWriteError as exc:
                self._timer_error = exc

    def _raise_timer_error(self) -> None:
        if self._timer_error is not None:
            exc, self._timer_error = self._timer_error, None
            raise exc

    def summary(self) -> dict:
        counts = {s: 0 for s in STATUSES}
        for f in self.findings.values():
            counts[f["status"]] = counts.get(f["status"], 0) + 1
        return counts

    def document(self) -> dict:
        order = {s: i for i, s in enumerate(STATUSES)}
        findings = sorted(self.findings.values(), key=lambda f: (order.get(f["status"], 99), f["id"]))
        doc = {"schema": SCHEMA, "tool": {"name": "rlconform", "version": tool_version()}, "engine": self.engine,
               "run": self.run, "summary": self.summary(), "findings": findings}
        relativise(doc, self.out_dir)  # findings resumed from an older report.json may hold absolute paths
        if self.coverage is not None:  # --- coverage table ---
            doc["coverage"] = self.coverage
        # --- triage: severities, defects --------------------------------------------------
        from rlconform.harness.report.triage import annotate

        return annotate(doc)

    def write(self, *, complete: bool | None = None, html: bool = True) -> None:
        """Rewrite report.json and report.md now (and, when the run ends, report.html unless ``html`` is false:
        :meth:`seal` writes it then); raise :class:`ReportWriteError` if they cannot be written."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._timer_error = None  # this write supersedes the failed one
            self._write(complete=complete, html=html)

    def _write(self, *, complete: bool | None = None, html: bool = True) -> None:
        started = time.monotonic()
        if complete is not None:
            self.run["complete"] = complete
            self.run["finished"] = _now()
        try:
            doc = self.document()
            text_json, text_md = json.dumps(doc, indent=1, default=str) + "\n", render_markdown(doc)
            _atomic_write(self.json_path, text_json)
            _atomic_write(self.md_path, text_md)
        except (OSError, MemoryError) as exc:
            what = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise ReportWriteError(f"cannot write the report in {self.out_dir}: {what}") from exc
        self.last = (doc, text_json, text_md)
        self._written_at = time.monotonic()
        self._write_s = self._written_at - started
        if complete is not None and html:  # the plots take ~1 s: render report.html once, when the run ends
            self.write_html(doc)

    def seal(self, cases: dict[str, bytes]) -> list[str]:
        """Write the run's files once more from what this process recorded, after the last engine process is
        gone: ``cases/`` holds exactly ``cases`` (``{path: bytes}``, read when each finding
        arrived; anything else there is removed), then report.json and report.md (the text of the last
        :meth:`write`) and report.html; each is read back. Returns the files that still differ from the
        record (empty: sealed). Raises :class:`ReportWriteError` when they cannot be written."""
        doc, text_json, text_md = self.last
        cases_dir = os.path.join(self.out_dir, "cases")
        wanted = {os.path.abspath(p): data for p, data in cases.items()}
        try:
            if wanted:
                os.makedirs(cases_dir, exist_ok=True)
            if os.path.isdir(cases_dir) and not os.path.islink(cases_dir):
                for name in os.listdir(cases_dir):
                    path = os.path.abspath(os.path.join(cases_dir, name))
                    if path not in wanted:
                        if os.path.isdir(path) and not os.path.islink(path):
                            import shutil

                            shutil.rmtree(path)
                        else:
                            os.unlink(path)
            for path, data in wanted.items():
                _atomic_write(path, data.decode("utf-8"))
            _atomic_write(self.json_path, text_json)
            _atomic_write(self.md_path, text_md)
        except (OSError, MemoryError, UnicodeDecodeError) as exc:
            what = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise ReportWriteError(f"cannot write the report in {self.out_dir}: {what}") from exc
        self.write_html(doc)
        differ = []
        for path, text in [(self.json_path, text_json), (self.md_path, text_md),
                           *((p, data.decode("utf-8")) for p, data in wanted.items())]:
            try:
                with open(path) as fh:  # the encoding atomic_write wrote it in
                    same = fh.read() == text
            except (OSError, UnicodeDecodeError):
                same = False
            if not same:
                differ.append(path)
        return differ

    def write_html(self, doc: dict | None = None) -> None:
        from rlconform.harness.report.html_report import write_html

        try:
            write_html(doc or self.document(), self.html_path)
        except Exception as exc:  # noqa: BLE001 - report.json and report.md are written already
            import sys

            print(f"rlconform: could not render {self.html_path}: {type(exc).__name__}: {exc}", file=sys.stderr)


#: GitHub refuses comments over 65,536 characters
MARKDOWN_LIMIT = 60_000


def _profile_lines(doc: dict) -> list[str]:
    """The run's profile, and the profile-only regimes (``real_shapes`` in ``nightly``) it added."""
    profile = doc.get("run", {}).get("profile")
    if not profile:
        return []
    added: dict[str, int] = {}
    for f in doc["findings"]:
        if f.get("profiles"):
            added[f["regime"]] = added.get(f["regime"], 0) + 1
    text = f"profile `{profile}`"
    if added:
        text += "; regimes only this profile adds: " + ", ".join(f"{r} ({n} findings)" for r, n in sorted(added.items()))
    return [text, ""]


def device_line(doc: dict) -> str:
    """``device `cuda:0` (NVIDIA H200, compute capability 9.0) · torch 2.x · CUDA 12.x`` from ``run.device``; "" for a report without it."""
    dev = (doc.get("run") or {}).get("device")
    if not isinstance(dev, dict):
        return ""
    extra = f", compute capability {dev['capability']}" if dev.get("capability") else ""
    if dev.get("cpu_capability"):  # the CPU kernels' vector ISA (ATEN_CPU_CAPABILITY): last bits depend on it
        extra += f", CPU kernels {dev['cpu_capability']}"
    return (f"device `{dev.get('device')}` ({dev.get('name')}{extra}) · torch {dev.get('torch')}"
            + (f" · CUDA {dev['cuda']}" if dev.get("cuda") else ""))


def render_markdown(doc: dict) -> str:
    """A summary fit for a pull-request comment: counts, then one row per status × op × property with the
    dtypes and regimes it covers (failing groups first), then one worst example per group. Stays under
    :data:`MARKDOWN_LIMIT` characters; report.json holds every finding."""
    eng = doc["engine"]
    s = doc["summary"]
    lines = [
        f"## rlconform: {eng.get('name')} {eng.get('version') or ''}".rstrip(),
        "",
        f"engine spec `{eng.get('spec')}`" + (f", path `{eng['path']}`" if eng.get("path") else "")
        + (f", revision `{eng['revision']}`" if eng.get("revision") else "")
        + f"; rlconform {doc['tool']['version']}; "
        + ("complete run" if doc["run"].get("complete") else "**incomplete run** (" + (
            "interrupted" if doc["run"].get("interrupted") else
            f"{len(doc['run']['not_run'])} selected finding(s) not run" if doc["run"].get("not_run") else
            "interrupted or still running") + ")"),
        "",
        " · ".join(f"{k}: **{v}**" for k, v in s.items() if v),
        "",
    ]
    from rlconform.harness.report.worker_only import worker_only_line

    worker_only = worker_only_line(doc)
    if worker_only:
        lines += [worker_only, ""]
    dev_line = device_line(doc)
    if dev_line:
        lines += [dev_line, ""]
    lines += _profile_lines(doc)
    # --- triage: the defects first, ranked by severity -------------------------------------
    from rlconform.harness.report.measures import error_text
    from rlconform.harness.report.triage_md import render_defects

    lines += render_defects(doc)
    from rlconform.harness.report.declared_md import markdown_section  # after the defects

    # at most a third of the comment: the defects and the failing groups come first
    lines += _fit_declared(markdown_section(doc), MARKDOWN_LIMIT // 3)
    from rlconform.harness.report.explain import markdown_lines  # one line per defect row

    lines += markdown_lines(doc)
    groups: dict[tuple, list] = {}
    lines += binding_error_lines(doc)
    for f in doc["findings"]:
        if f["status"] not in ("pass", "binding_error"):
            groups.setdefault((f["status"], f["op"], f["property"]), []).append(f)
    order = {st: i for i, st in enumerate(STATUSES)}
    keys = sorted(groups, key=lambda k: (order.get(k[0], 99), k[1], k[2]))

    def worst(fs):
        return max(fs, key=lambda f: (f.get("max_ratio") is None, f.get("max_ratio") or 0, f.get("max_abs_err") or 0))

    from rlconform.harness.report.coverage_md import render_section

    coverage = render_section(doc.get("coverage"), eng.get("spec"))  # the last section, inside the budget too
    tail_chars = sum(len(x) + 1 for x in coverage or []) + 80
    if keys:  # after the defects and the declared section, under its own heading
        lines += ["### All failing findings", "",
                  "| status | op | property | findings | dtypes | regimes | worst abs err | reproduce (worst) |",
                  "|---|---|---|---|---|---|---|---|"]
        room = MARKDOWN_LIMIT - sum(len(x) + 1 for x in lines) - tail_chars - 400  # the table fits too
        for n, k in enumerate(keys):
            fs = groups[k]
            w = worst(fs)
            rep = w.get("reproducer") or {}
            row = (f"| {k[0]} | {k[1]} | {k[2]} | {len(fs)} | {', '.join(sorted({f['dtype'] for f in fs}))} | "
                   f"{', '.join(sorted({f['regime'] for f in fs}))} | {error_text(w)} | "
                   + (f"`{rep['command']}`" if rep.get("command") else "") + " |")
            if len(row) + 1 > room - 80:
                lines.append(f"| … | {len(keys) - n} more rows: see report.json | | | | | | |")
                break
            room -= len(row) + 1
            lines.append(row)
        lines += ["", "<details><summary>one example per row</summary>\n"]
        budget = MARKDOWN_LIMIT - sum(len(x) + 1 for x in lines) - tail_chars - 400
        for n, k in enumerate(keys):
            w = worst(groups[k])
            msg = (w.get("message") or "").strip()[:700].replace("\n", "\n    ")
            entry = f"- **{w['id']}** ({w['status']}):\n\n    {msg}\n"
            if w.get("worst_input"):
                entry += f"\n    input: `{w['worst_input'][:300]}`\n"
            if w.get("transcribed"):
                entry += f"\n    transcribed, not run: {w['transcribed'][:400]}\n"
            if len(entry) > budget:
                lines.append(f"- … {len(keys) - n} more rows: see report.json")
                break
            budget -= len(entry)
            lines.append(entry)
        lines.append("</details>\n")
    lines.append(f"{s.get('pass', 0)} finding(s) pass.")
    # --- coverage table: counts and what is unbound ------------------------------------------
    if coverage:
        lines += [""] + coverage
    return "\n".join(lines) + "\n"


def binding_error_lines(doc: dict) -> list[str]:
    """The findings whose binding does not fit the engine version (status ``binding_error``):
    their own section, one line per op, never among the defects."""
    errors: dict[str, list] = {}
    for f in doc.get("findings", []):
        if f.get("status") == "binding_error":
            errors.setdefault(f["op"], []).append(f)
    if not errors:
        return []
    eng = doc.get("engine") or {}
    lines = ["### Binding errors (the binding does not fit this engine version; not engine defects)", "",
             f"{sum(map(len, errors.values()))} finding(s) of {len(errors)} op(s) could not be checked on "
             f"{eng.get('name')} {eng.get('version') or ''}".rstrip() + ":", ""]
    for op, fs in sorted(errors.items()):
        msg = (fs[0].get("message") or "").strip().splitlines()[0][:400] if fs[0].get("message") else ""
        lines.append(f"- `{op}` ({len(fs)} finding(s)): {msg}")
    return lines + [""]


def _fit_declared(section: list[str], room: int) -> list[str]:
    """The conventions-and-guards section within ``room`` characters (report.md is a
    pull-request comment, which GitHub refuses over 65,536 characters): its table rows as long as they fit,
    then one line counting the rest (report.html and report.json list them all)."""
    if sum(len(x) + 1 for x in section) <= room:
        return section
    rows = [i for i, x in enumerate(section) if x.startswith("| ") and not x.startswith("| ---")]
    head = section[: rows[1]] if len(rows) > 1 else section[:2]  # the title, the prose and the header row
    out, used = list(head), sum(len(x) + 1 for x in head) + 120
    body = rows[1:]
    for n, i in enumerate(body):
        if used + len(section[i]) + 1 > room:
            out += [f"| … {len(body) - n} more declared items: see report.html or report.json |", ""]
            return out
        out.append(section[i])
        used += len(section[i]) + 1
    return out + [""]


def rerender(out_dir: str) -> tuple[str, str]:
    """Re-render ``report.md`` and ``report.html`` of ``out_dir`` from its ``report.json``, whose summary,
    severities and defects are re-derived by this version's triage and written back (the three files agree).
    Raises ValueError (one line) when report.json is not a report written by ``rlconform check``; the
    ``report`` command validates every finding first (:func:`rlconform.harness.report.load.load_report`)."""
    from rlconform.harness.core.safe_json import load_object
    from rlconform.harness.report.html_report import write_html

    path = os.path.join(out_dir, "report.json")
    doc = load_object(path)  # JsonFileError (a ValueError, one line) when it is not one JSON object
    for key in ("tool", "engine", "run"):
        if not isinstance(doc.get(key), dict):
            raise ValueError(f"{path}: no {key} object; not a report written by `rlconform check`")
    if not isinstance(doc.get("findings"), list):
        raise ValueError(f"{path}: no findings list; not an rlconform report")
    counts = {s: 0 for s in STATUSES}  # re-derived from the findings, like the severities below
    for f in doc["findings"]:
        counts[f["status"]] = counts.get(f["status"], 0) + 1
    doc["summary"] = counts
    from rlconform.harness.report.triage import annotate

    relativise(doc, out_dir)  # an older report's absolute case_file paths -> relative to its folder
    annotate(doc)  # reports written before severities existed (or by an older triage) get this one's
    atomic_write(path, json.dumps(doc, indent=1, default=str) + "\n")
    md = os.path.join(out_dir, "report.md")
    atomic_write(md, render_markdown(doc))
    html = write_html(doc, os.path.join(out_dir, "report.html"))
    return md, html

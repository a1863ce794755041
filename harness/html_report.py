"""``report.html``: one self-contained page rendered from a ``report.json`` document.

No network and no external file: the CSS is inline and the plots are PNGs drawn with matplotlib's Agg
canvas (no pyplot, no global backend switch) and embedded as base64 ``data:`` URIs. The page holds

* the summary counts and the op × property × dtype table (worst status over regimes, as in the
  terminal summary);
* plots where a picture says more than the table: error against shard imbalance for the partition
  ops (``agg_loss``, ``metric_pipeline``; from each finding's bounded ``samples``), error / tolerance
  by dtype × logits regime for the softmax statistics (``matches_reference``), and examples run per op;
* first, the defects (``doc["defects"]``, :mod:`rlconform.harness.triage`) ranked by severity;
* every non-pass finding with its severity, message, worst input, reproducer command and (crashes
  only, its tail) traceback, then every finding in a collapsed table. The page stays under 500 KB
  for verl 0.9.1's 130 failing findings: 80-dpi plots on a 64-colour palette, no pytest tracebacks.

A small script checks that each plot decoded (``naturalWidth > 0``) and sets ``document.title`` to
``ok:N`` (``N`` plots) or ``error:...``; ``tests/test_html_report.py`` reads it in headless Chromium.

Rendering (matplotlib import and drawing) takes about a second, so ``ReportWriter`` writes the page
only when a run ends (``write(complete=...)``) and ``rlconform report DIR`` re-renders it.
"""

from __future__ import annotations

import base64
import io
import math
import os

import jinja2

from rlconform.harness.atomic_write import atomic_write
from rlconform.harness.catalog import FLOAT_DTYPES, LOGITS_REGIMES

STATUS_ORDER = ("crash", "discrepancy", "error", "xpass", "unavailable", "xfail", "pass")
STATUS_COLOR = {"crash": "#b3261e", "discrepancy": "#d93025", "error": "#5f6368", "xpass": "#a142f4",
                "unavailable": "#e37400", "xfail": "#1a73e8", "pass": "#188038"}
SHORT = {"crash": "CRASH", "discrepancy": "FAIL", "error": "ERROR", "xpass": "XPASS", "unavailable": "n/a",
         "xfail": "xfail", "pass": "ok"}
DTYPE_COLOR = {"float16": "#e8710a", "bfloat16": "#9334e6", "float32": "#1a73e8", "float64": "#188038"}
PARTITION_OPS = ("agg_loss", "metric_pipeline")
TOKEN_STATS = ("logsumexp", "token_logprobs", "entropy", "sum_pi_squared")
ERR_FLOOR = 1e-18  # exact results are drawn on this line of the log axis
PLOT_DPI = 80
#: tracebacks shown on the page: crashes only (a discrepancy's traceback is pytest's own frames), tail only
TRACEBACK_CHARS = 1200
#: a finding card shows at most this much of its message and worst input (the full text is in report.json):
#: keeps report.html of a real engine's ~1000 findings one page under 500 KB
MESSAGE_CHARS = 240
SEVERITY_COLOR = {"wrong": "#b3261e", "destructive": "#a142f4", "imprecise": "#e37400"}


def _fmt(x) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        if math.isinf(x):
            return "∞"
        return f"{x:.3g}"
    return str(x)


# ------------------------------------------------------------------------------------------------
# plots


def _png(fig) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PLOT_DPI, bbox_inches="tight")
    data = buf.getvalue()
    try:  # an adaptive 64-colour palette: the plots use a handful of colours; ~3× smaller (issue 12: < 500 KB)
        from PIL import Image

        img = Image.open(io.BytesIO(data)).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
        small = io.BytesIO()
        img.save(small, format="PNG", optimize=True)
        data = min(data, small.getvalue(), key=len)
    except Exception:  # noqa: BLE001 - Pillow missing or too old: keep the full-colour PNG
        pass
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), layout="constrained")


def plot_imbalance(findings: list[dict]) -> list[dict]:
    """One plot per partition op: per property a panel of max abs error against shard imbalance
    (max shard nnz / max(1, min shard nnz)), points by dtype, failing examples filled."""
    plots = []
    for op in PARTITION_OPS:
        by_prop: dict[str, list[dict]] = {}
        for f in findings:
            if f["op"] == op and f.get("samples") and f["property"] in ("matches_reference", "partition_invariant"):
                by_prop.setdefault(f["property"], []).append(f)
        props = [p for p in by_prop if any(s.get("imbalance") is not None for f in by_prop[p] for s in f["samples"])]
        if not props:
            continue
        fig = _figure(4.2 * len(props), 3.4)
        axes = fig.subplots(1, len(props), squeeze=False)[0]
        n_points = 0
        for ax, prop in zip(axes, props):
            for f in sorted(by_prop[prop], key=lambda f: FLOAT_DTYPES.index(f["dtype"])
                            if f["dtype"] in FLOAT_DTYPES else 9):
                color = DTYPE_COLOR.get(f["dtype"], "#5f6368")
                for ok, marker in ((True, "o"), (False, "X")):
                    pts = [s for s in f["samples"] if bool(s.get("ok")) is ok and s.get("imbalance") is not None]
                    if not pts:
                        continue
                    xs = [max(1.0, float(s["imbalance"])) for s in pts]
                    ys = [max(ERR_FLOOR, float(s.get("abs_err") or 0.0)) for s in pts]
                    n_points += len(pts)
                    ax.scatter(xs, ys, s=26 if ok else 44, marker=marker, alpha=0.75,
                               facecolors="none" if ok else color, edgecolors=color, linewidths=1.0,
                               label=f"{f['dtype']} {'pass' if ok else 'fail'}")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(prop, fontsize=10)
            ax.set_xlabel("shard imbalance (max nnz / max(1, min nnz))", fontsize=8)
            ax.set_ylabel("max abs error (exact: bottom)", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, which="major", alpha=0.3)
            ax.legend(fontsize=6, loc="best")
        fig.suptitle(f"{op}: error against shard imbalance (sampled examples; ○ pass, ✕ fail)", fontsize=10)
        plots.append({"title": f"{op}: error against shard imbalance", "src": _png(fig),
                      "caption": f"{n_points} sampled examples over {len(props)} properties: one point per example "
                                 "(its most imbalanced partition); failing examples are kept first, including "
                                 "those hypothesis tried while shrinking."})
    return plots


def _ratio_of(f: dict) -> float | None:
    """error / tolerance of a finding: ``max_ratio`` (inf for a failure without a numeric bound) or,
    for older reports, max_abs_err / tolerance."""
    if f.get("max_ratio") is not None:
        return float(f["max_ratio"])
    if f["status"] in ("discrepancy", "xfail", "crash") and f.get("max_ratio", 0) is None:
        return math.inf
    if f.get("tolerance"):
        return float(f.get("max_abs_err") or 0.0) / float(f["tolerance"])
    return None


def plot_softmax(findings: list[dict]) -> list[dict]:
    """Heatmaps (one panel per softmax statistic) of the worst error / tolerance per dtype × logits
    regime for ``matches_reference`` (values and gradients); ✕ marks a failing finding."""
    ops = [op for op in TOKEN_STATS if any(f["op"] == op and f["property"] == "matches_reference"
                                           and f["status"] != "unavailable" for f in findings)]
    if not ops:
        return []
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    regimes = list(LOGITS_REGIMES)
    dtypes = list(FLOAT_DTYPES)
    fig = _figure(3.3 * len(ops) + 0.8, 3.6)
    axes = fig.subplots(1, len(ops), squeeze=False)[0]
    norm = TwoSlopeNorm(vmin=-4.0, vcenter=0.0, vmax=4.0)
    im = None
    for ax, op in zip(axes, ops):
        grid = np.full((len(regimes), len(dtypes)), np.nan)
        for f in findings:
            if f["op"] != op or f["property"] != "matches_reference" or f["regime"] not in regimes \
                    or f["dtype"] not in dtypes or f["status"] == "unavailable":
                continue
            i, j = regimes.index(f["regime"]), dtypes.index(f["dtype"])
            r = _ratio_of(f)
            lr = 4.0 if r is not None and math.isinf(r) else (-4.0 if not r else max(-4.0, min(4.0, math.log10(r))))
            grid[i, j] = lr
            text = ("✕ " if f["status"] in ("discrepancy", "crash", "xfail") else "") + _fmt(r)
            ax.text(j, i, text, ha="center", va="center", fontsize=6.5,
                    color="white" if abs(lr) > 2.5 else "black")
        im = ax.imshow(np.ma.masked_invalid(grid), cmap="RdYlGn_r", norm=norm, aspect="auto")
        ax.set_facecolor("#e8eaed")
        ax.set_xticks(range(len(dtypes)), [d.replace("float", "f").replace("bf", "bf") for d in dtypes], fontsize=7)
        ax.set_yticks(range(len(regimes)), regimes if ax is axes[0] else [""] * len(regimes), fontsize=7)
        ax.set_title(op, fontsize=9)
    cb = fig.colorbar(im, ax=list(axes), shrink=0.85)
    cb.set_label("log10(error / tolerance); > 0 fails", fontsize=7)
    cb.ax.tick_params(labelsize=6)
    fig.suptitle("softmax statistics, matches_reference: worst error / tolerance (✕ fails; grey: not run)",
                 fontsize=9)
    return [{"title": "softmax statistics: error by dtype and logits regime", "src": _png(fig),
             "caption": "values and gradients against the float64 reference; colour: worst error over the "
                        "tolerance bound over all examples of the finding (green: far inside, red: outside)."}]


def plot_examples(findings: list[dict]) -> list[dict]:
    """Examples run per op, stacked by the status of the findings they belong to."""
    ops: list[str] = []
    for f in findings:
        if f["op"] not in ops:
            ops.append(f["op"])
    if not ops or not any(f.get("examples") for f in findings):
        return []
    fig = _figure(7.0, 0.32 * len(ops) + 1.1)
    ax = fig.subplots()
    left = [0.0] * len(ops)
    for status in reversed(STATUS_ORDER):
        vals = [float(sum(f.get("examples") or 0 for f in findings if f["op"] == op and f["status"] == status))
                for op in ops]
        if not any(vals):
            continue
        ax.barh(range(len(ops)), vals, left=left, color=STATUS_COLOR[status], label=status, height=0.7)
        left = [a + b for a, b in zip(left, vals)]
    for i, total in enumerate(left):
        ax.text(total, i, f" {int(total)}", va="center", fontsize=7)
    ax.set_yticks(range(len(ops)), ops, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("examples run (all properties, dtypes and regimes)", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=7, loc="lower right")
    ax.margins(x=0.12)
    return [{"title": "examples run per op", "src": _png(fig),
             "caption": "hypothesis examples (and replayed corpus cases) per op, coloured by finding status."}]


# ------------------------------------------------------------------------------------------------
# page

TEMPLATE = jinja2.Template("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rlconform: {{ eng.name }}</title>
<script>
window.onerror = function (msg, src, line) { document.title = "error:" + msg + " (line " + line + ")"; };
window.addEventListener("load", function () {
  if (document.title.indexOf("error:") === 0) return;
  var want = parseInt(document.body.getAttribute("data-expected-plots"), 10);
  var imgs = document.querySelectorAll("img.plot"), bad = [];
  for (var i = 0; i < imgs.length; i++) {
    if (!imgs[i].complete || imgs[i].naturalWidth === 0) bad.push(imgs[i].alt);
  }
  if (imgs.length !== want) document.title = "error:expected " + want + " plots, found " + imgs.length;
  else if (bad.length) document.title = "error:plot did not load: " + bad.join(", ");
  else document.title = "ok:" + imgs.length;
});
</script>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #202124; margin: 0;
       background: #f8f9fa; }
main { max-width: 1180px; margin: 0 auto; padding: 20px 28px 60px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 10px; border-bottom: 1px solid #dadce0;
     padding-bottom: 4px; } h3 { font-size: 14px; margin: 0 0 6px; }
.meta { color: #5f6368; font-size: 12.5px; } .meta code { font-size: 12px; }
.counts { display: flex; gap: 10px; flex-wrap: wrap; margin: 14px 0; }
.count { border-radius: 8px; padding: 8px 14px; color: #fff; font-weight: 600; min-width: 90px; }
.count span { display: block; font-size: 22px; }
.count.zero { opacity: .35; }
table { border-collapse: collapse; background: #fff; font-size: 12.5px; }
th, td { border: 1px solid #dadce0; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f1f3f4; }
td.cell { text-align: center; font-weight: 600; white-space: nowrap; }
.badge { display: inline-block; border-radius: 4px; padding: 0 6px; color: #fff; font-size: 11.5px; font-weight: 600; }
.finding { background: #fff; border: 1px solid #dadce0; border-left: 5px solid; border-radius: 6px;
           padding: 10px 14px; margin: 10px 0; }
.finding .nums { color: #3c4043; font-size: 12.5px; margin: 4px 0; }
pre { background: #f1f3f4; padding: 8px 10px; border-radius: 4px; overflow-x: auto; font-size: 12px; margin: 6px 0;
      white-space: pre-wrap; word-break: break-word; }
code { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
.cmd { background: #202124; color: #e8eaed; }
figure { background: #fff; border: 1px solid #dadce0; border-radius: 6px; margin: 12px 0; padding: 10px; }
figure img { max-width: 100%; height: auto; display: block; margin: 0 auto; }
figcaption { color: #5f6368; font-size: 12px; margin-top: 6px; }
details summary { cursor: pointer; color: #1a73e8; }
.muted { color: #80868b; }
</style></head>
<body data-expected-plots="{{ plots|length }}"><main>
<h1>rlconform · {{ eng.name }} {{ eng.version or "" }}</h1>
<div class="meta">engine spec <code>{{ eng.spec }}</code>{% if eng.path %}, path <code>{{ eng.path }}</code>{% endif %}
{% if eng.revision %}, revision <code>{{ eng.revision }}</code>{% endif %} · rlconform {{ doc.tool.version }} ·
{% if run.complete %}complete run{% else %}<b>incomplete run</b> (interrupted or still running){% endif %}
<br>started {{ run.started }}{% if run.finished %}, finished {{ run.finished }}{% endif %} · profile {{ run.profile }}
{% if run.seed is not none %} · seed {{ run.seed }}{% endif %}{% if run.max_examples %} · max {{ run.max_examples }}
examples per finding{% endif %} · python {{ run.python }} · torch {{ run.torch }}
{% if run.command %}<br><code>{{ run.command }}</code>{% endif %}</div>

<div class="counts">{% for s in statuses %}<div class="count{% if not summary.get(s) %} zero{% endif %}"
 style="background: {{ colors[s] }}">{{ s }}<span>{{ summary.get(s, 0) }}</span></div>{% endfor %}</div>

{% if coverage %}<p class="muted">coverage of the engine's numerics: {{ coverage }}</p>{% endif %}

{% if defects %}<h2>defects ({{ defects|length }})</h2>
<p class="muted">{{ triage_line }}. Findings that share op, property and failure signature (kind of wrong value ·
input feature) across dtypes and regimes; most severe first; the reproducer is the smallest member's.</p>
<table><tr><th>severity</th><th>op</th><th>property</th><th>signature</th><th>findings</th><th>reproduce (smallest)</th></tr>
{% for d in defects %}<tr><td><span class="badge" style="background: {{ sev_colors[d.severity] }}">{{ d.severity }}</span></td>
<td>{{ d.op }}</td><td>{{ d.property }}</td><td>{{ d.signature.kind }} · {{ d.signature.feature }}</td>
<td>{% for m in d.members %}<a href="#{{ m }}">{{ m.split(".")[2:]|join(".") }}</a>{% if not loop.last %}, {% endif %}{% endfor %}</td>
<td>{% if d.reproducer.command %}<code>{{ d.reproducer.command }}</code>{% endif %}</td></tr>{% endfor %}</table>{% endif %}

<h2>op × property × dtype</h2>
<p class="muted">Worst status over the regimes of each cell, with how many regimes have it.</p>
<table><tr><th>op</th><th>property</th>{% for d in dtypes %}<th>{{ d }}</th>{% endfor %}</tr>
{% for row in grid %}<tr><td>{{ row.op }}</td><td>{{ row.prop }}</td>{% for c in row.cells %}
<td class="cell" {% if c %}style="color: {{ colors[c.status] }}" title="{{ c.title }}"{% endif %}>{% if c %}{{ c.text }}{% endif %}</td>
{% endfor %}</tr>{% endfor %}</table>

{% if plots %}<h2>plots</h2>
{% for p in plots %}<figure><img class="plot" alt="{{ p.title }}" src="{{ p.src }}"><figcaption><b>{{ p.title }}</b>:
{{ p.caption }}</figcaption></figure>{% endfor %}{% endif %}

<h2>findings that do not pass ({{ bad|length }})</h2>
{% if not bad %}<p>None: every finding passes.</p>{% endif %}
{% for f in bad %}<div class="finding" id="{{ f.id }}" style="border-left-color: {{ colors[f.status] }}">
<h3><span class="badge" style="background: {{ colors[f.status] }}">{{ f.status }}</span>{% if f.severity %}
<span class="badge" style="background: {{ sev_colors[f.severity] }}" title="{{ f.severity_reason }}">{{ f.severity }}</span>{% endif %}
<code>{{ f.id }}</code></h3>
<div class="nums">{{ f.examples }} examples{% if f.examples_to_first_failure %} (first failure at example
{{ f.examples_to_first_failure }}){% endif %} · max abs err {{ fmt(f.max_abs_err) }} · max rel err
{{ fmt(f.max_rel_err) }} · tolerance {{ fmt(f.tolerance) }}{% if f.xfail_listed %} · listed in the ledger{% endif %}</div>
{% if f.message %}<pre>{{ f.message | truncate(msg_chars, True, " …(full text in report.json)") }}</pre>{% endif %}
{% if f.worst_input %}<div>worst input:</div><pre>{{ f.worst_input | truncate(msg_chars, True, " …") }}</pre>{% endif %}
{% if f.reproducer %}<div>reproduce:</div><pre class="cmd"><code>{{ f.reproducer.command }}</code></pre>{% endif %}
{% if f.traceback and f.status == "crash" %}<details><summary>traceback (tail)</summary><pre>{{ f.traceback[-tb_chars:] }}</pre></details>{% endif %}
</div>{% endfor %}

<h2>all findings ({{ findings|length }})</h2>
<details><summary>show the table</summary>
<table><tr><th>finding</th><th>status</th><th>examples</th><th>max abs err</th><th>max rel err</th>
<th>tolerance</th><th>error / tolerance</th></tr>
{% for f in findings %}<tr><td><code>{{ f.id }}</code></td><td style="color: {{ colors[f.status] }}">{{ f.status }}</td>
<td>{{ f.examples }}</td><td>{{ fmt(f.max_abs_err) }}</td><td>{{ fmt(f.max_rel_err) }}</td><td>{{ fmt(f.tolerance) }}</td>
<td>{{ fmt(ratio(f)) }}</td></tr>{% endfor %}</table></details>
</main></body></html>
""", autoescape=True)


def _grid(findings: list[dict]) -> list[dict]:
    cells: dict[tuple[str, str], dict[str, list[dict]]] = {}
    for f in findings:
        cells.setdefault((f["op"], f["property"]), {}).setdefault(f["dtype"], []).append(f)
    rows = []
    for (op, prop), by_dtype in sorted(cells.items()):
        row = {"op": op, "prop": prop, "cells": []}
        for d in FLOAT_DTYPES:
            fs = by_dtype.get(d)
            if not fs:
                row["cells"].append(None)
                continue
            sts = [f["status"] for f in fs]
            worst = min(sts, key=lambda s: STATUS_ORDER.index(s) if s in STATUS_ORDER else 99)
            n = sts.count(worst)
            row["cells"].append({"status": worst, "text": SHORT.get(worst, worst) + (f" {n}/{len(sts)}" if worst != "pass" else ""),
                                 "title": ", ".join(f"{f['regime']}: {f['status']}" for f in fs)})
        rows.append(row)
    return rows


def make_plots(doc: dict) -> list[dict]:
    findings = doc.get("findings", [])
    return plot_imbalance(findings) + plot_softmax(findings) + plot_examples(findings)


def render_html(doc: dict) -> str:
    """The page for a report document (the ``report.json`` dict)."""
    findings = doc.get("findings", [])
    statuses = [s for s in STATUS_ORDER]
    return TEMPLATE.render(
        doc=doc, eng=doc.get("engine", {}), run=doc.get("run", {}), summary=doc.get("summary", {}),
        statuses=statuses, colors=STATUS_COLOR, dtypes=FLOAT_DTYPES, grid=_grid(findings),
        plots=make_plots(doc), bad=[f for f in findings if f["status"] != "pass"], findings=findings,
        fmt=_fmt, ratio=_ratio_of, defects=doc.get("defects") or [], sev_colors=SEVERITY_COLOR,
        triage_line=_triage_line(doc), tb_chars=TRACEBACK_CHARS, msg_chars=MESSAGE_CHARS,
        coverage=_coverage_line(doc))


def _coverage_line(doc: dict) -> str | None:
    from rlconform.harness.coverage_md import counts_line

    return counts_line(doc["coverage"]) if doc.get("coverage") else None


def _triage_line(doc: dict) -> str:
    from rlconform.harness.triage_md import counts_line

    return counts_line(doc).replace("**", "")


def write_html(doc: dict, path: str) -> str:
    atomic_write(path, render_html(doc))
    return path

"""``report.html``: one self-contained page rendered from a ``report.json`` document.

No network and no external file: the CSS is inline and the plots are PNGs drawn with matplotlib's Agg
canvas (no pyplot, no global backend switch) and embedded as base64 ``data:`` URIs. The page holds

* first, within a 1400 × 900 window: the summary counts, a verdict line and the defect table
  (``doc["defects"]``, :mod:`rlconform.harness.report.triage`, ranked by severity), each row with what
  reaches it (:func:`reached_by`: the configuration its trigger names, or any configuration);
* one card per defect, collapsed (a link to ``#D3`` opens it): its members (dtypes and regimes, compactly),
  the reproducer command, message and input of its smallest member and, for a crash, the engine's frames
  of the traceback;
* the op × property × dtype table (worst status over regimes, as in the terminal summary);
* one plot, where a picture says more than the table: error / tolerance by dtype × logits regime for the
  softmax statistics (``matches_reference``), against the threshold 1;
* the failing findings in one table grouped by defect (numbers only; the reproducer command is one
  pattern, shown once, and a row shows its own only when it differs);
* every finding (message, worst input and crash traceback of the failing ones) as gzip'd JSON in the
  page, which a few lines of script expand into a filterable table (``DecompressionStream``: offline,
  in every current browser).

Nothing is wider than the window: table cells and code break anywhere rather than overflow.

Long texts appear once: per defect in its card, per finding in the compressed table. verl 0.9.1's page
(1135 findings, 346 failing, 61 defects) is ~300 KB, under 500 KB; the plots are 80-dpi PNGs
on a 64-colour palette.

A small script checks that each plot decoded (``naturalWidth > 0``), expands the table and sets
``document.title`` to ``ok:N`` (``N`` plots) or ``error:...``; on ``<body>`` it records ``data-rows`` (the
rows it expanded), ``data-scroll-width`` (the page's width), ``data-defects-top`` (where the defect table
starts) and ``data-open-cards``; ``tests/test_html_report.py`` reads them in headless Chromium.

Rendering (matplotlib import and drawing) takes about a second, so ``ReportWriter`` writes the page
only when a run ends (``write(complete=...)``) and ``rlconform report DIR`` re-renders it.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import math
import os
import re

import jinja2
import markupsafe

from rlconform.harness.core.opinfo import FLOAT_DTYPES  # torch-free: ``rlconform report`` imports no torch
from rlconform.harness.report.atomic_write import atomic_write
from rlconform.harness.report.measures import error_text, number_text
from rlconform.harness.report.remedies import changed_words

STATUS_ORDER = ("crash", "discrepancy", "error", "binding_error", "xpass", "unavailable", "xfail", "marginal", "pass")
STATUS_COLOR = {"crash": "#b3261e", "discrepancy": "#d93025", "error": "#5f6368", "binding_error": "#5f6368", "xpass": "#a142f4",
                "unavailable": "#e37400", "xfail": "#1a73e8", "marginal": "#81c995", "pass": "#188038"}
SHORT = {"crash": "CRASH", "discrepancy": "FAIL", "error": "ERROR", "binding_error": "BIND", "xpass": "XPASS", "unavailable": "n/a",
         "xfail": "xfail", "marginal": "~ok", "pass": "ok"}
DTYPE_COLOR = {"float16": "#e8710a", "bfloat16": "#9334e6", "float32": "#1a73e8", "float64": "#188038"}
PARTITION_OPS = ("agg_loss", "metric_pipeline")
TOKEN_STATS = ("logsumexp", "token_logprobs", "entropy", "sum_pi_squared")
ERR_FLOOR = 1e-18  # exact results are drawn on this line of the log axis
PLOT_DPI = 80
#: tracebacks shown on the page: crashes only (a discrepancy's traceback is pytest's own frames), the engine's
#: frames (:func:`engine_traceback`), at most this many characters
TRACEBACK_CHARS = 1200
#: a defect card shows at most this much of its message and input (the full text is in the all-findings
#: table and report.json)
MESSAGE_CHARS = 240
SEVERITY_COLOR = {"training": "#b3261e", "destructive": "#a142f4", "logging": "#c2185b", "robustness": "#e37400",
                  "precision": "#6b7280",
                  "wrong": "#b3261e", "imprecise": "#e37400"}  # the last two: a page of an older report


_fmt = number_text


# ------------------------------------------------------------------------------------------------
# plots


def _png(fig) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PLOT_DPI, bbox_inches="tight")
    data = buf.getvalue()
    try:  # an adaptive 64-colour palette: the plots use a handful of colours; ~3× smaller (< 500 KB)
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

    from rlconform.harness.families.token_stats import LOGITS_REGIMES  # imports torch: only when drawn

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


#: the script of the page: checks the plots decoded, expands the all-findings table from its gzip'd JSON
#: (``DecompressionStream``, in every current browser, offline) and reports the outcome in ``document.title``
SCRIPT = """
window.onerror = function (msg, src, line) { document.title = "error:" + msg + " (line " + line + ")"; };
function failed() { return document.title.indexOf("error:") === 0; }
function plotsBad() {
  var want = parseInt(document.body.getAttribute("data-expected-plots"), 10);
  var imgs = document.querySelectorAll("img.plot"), bad = [];
  for (var i = 0; i < imgs.length; i++) if (!imgs[i].complete || imgs[i].naturalWidth === 0) bad.push(imgs[i].alt);
  if (imgs.length !== want) return "expected " + want + " plots, found " + imgs.length;
  return bad.length ? "plot did not load: " + bad.join(", ") : null;
}
async function expandFindings() {
  var src = document.getElementById("findings-data"), body = document.getElementById("all-findings");
  if (!src) return;
  if (typeof DecompressionStream === "undefined") throw new Error("this browser lacks DecompressionStream");
  var bin = Uint8Array.from(atob(src.textContent.trim()), function (c) { return c.charCodeAt(0); });
  var rows = JSON.parse(await new Response(new Blob([bin]).stream()
      .pipeThrough(new DecompressionStream("gzip"))).text());
  var frag = document.createDocumentFragment();
  rows.forEach(function (r) {
    var tr = document.createElement("tr");
    tr.className = "s-" + r[1];
    r.forEach(function (v) { var td = document.createElement("td"); td.textContent = v; tr.appendChild(td); });
    frag.appendChild(tr);
  });
  body.appendChild(frag);
  document.body.setAttribute("data-rows", rows.length);
}
function filterFindings(q) {
  var words = q.toLowerCase().split(/\\s+/).filter(Boolean), trs = document.getElementById("all-findings").rows;
  for (var i = 0; i < trs.length; i++) {
    var t = trs[i].textContent.toLowerCase();
    trs[i].hidden = !words.every(function (w) { return t.indexOf(w) >= 0; });
  }
}
async function expandExplain() {  // the upstream-ready text of each defect card (rlconform explain)
  var src = document.getElementById("explain-data");
  if (!src) return;
  var bin = Uint8Array.from(atob(src.textContent.trim()), function (c) { return c.charCodeAt(0); });
  var texts = JSON.parse(await new Response(new Blob([bin]).stream()
      .pipeThrough(new DecompressionStream("gzip"))).text());
  Object.keys(texts).forEach(function (key) {
    var pre = document.getElementById("explain-" + key);
    if (pre) pre.textContent = texts[key];
  });
}
function openLinkedCard() {  // a link to a defect card (#D3) opens it
  var el = location.hash ? document.getElementById(location.hash.slice(1)) : null;
  if (el && el.tagName === "DETAILS") el.open = true;
  document.body.setAttribute("data-open-cards", document.querySelectorAll("details.finding[open]").length);
}
window.addEventListener("hashchange", openLinkedCard);
window.addEventListener("load", function () {
  openLinkedCard();
  var table = document.getElementById("defects-table");  // what a browser test reads: the page's width and
  document.body.setAttribute("data-scroll-width", document.documentElement.scrollWidth);  // the first screen
  if (table) document.body.setAttribute("data-defects-top", Math.round(table.getBoundingClientRect().top + window.scrollY));
  if (failed()) return;
  expandExplain().catch(function (e) { document.title = "error:explain texts: " + e; });
  var bad = plotsBad();
  if (bad) { document.title = "error:" + bad; return; }
  expandFindings().then(function () {
    if (!failed()) document.title = "ok:" + document.querySelectorAll("img.plot").length;
  }, function (e) {
    document.title = "error:findings table: " + e;
    var row = document.getElementById("all-findings").insertRow(), cell = row.insertCell();
    cell.colSpan = 9;
    cell.textContent = "This browser could not expand the table (" + e + "); report.json holds every finding.";
  });
});
"""

TEMPLATE = jinja2.Template("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rlconform: {{ eng.name }}</title>
<script>{{ script }}</script>
<style>
*, *::before, *::after { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #202124; margin: 0;
       background: #f8f9fa; }
main { max-width: 1180px; width: 100%; margin: 0 auto; padding: 20px 28px 60px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 10px; border-bottom: 1px solid #dadce0;
     padding-bottom: 4px; } h3 { font-size: 14px; margin: 0 0 6px; }
.meta { color: #5f6368; font-size: 12.5px; } .meta code { font-size: 12px; }
.counts { display: flex; gap: 10px; flex-wrap: wrap; margin: 14px 0; }
.count { border-radius: 8px; padding: 8px 14px; color: #fff; font-weight: 600; min-width: 90px; }
.count span { display: block; font-size: 22px; }
.count.zero { opacity: .35; }
table { border-collapse: collapse; background: #fff; font-size: 12.5px; max-width: 100%; }
th, td { border: 1px solid #dadce0; padding: 3px 7px; text-align: left; vertical-align: top; overflow-wrap: anywhere; }
#defects-table { width: 100%; }
#defects-table th, #defects-table td:nth-child(-n+2), #defects-table td:nth-child(4), #defects-table td:nth-child(7),
.badge { white-space: nowrap; }
.verdict { font-size: 15px; margin: 10px 0 4px; }
th { background: #f1f3f4; }
td.cell { text-align: center; font-weight: 600; white-space: nowrap; }
tr.grp th { background: #e8eaed; font-weight: 600; }
#all-findings td:last-child { white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, monospace;
                              font-size: 11.5px; max-width: 520px; }
.badge { display: inline-block; border-radius: 4px; padding: 0 6px; color: #fff; font-size: 11.5px; font-weight: 600; }
.finding { background: #fff; border: 1px solid #dadce0; border-left: 5px solid; border-radius: 6px;
           padding: 8px 14px; margin: 8px 0; }
.finding > summary h3 { display: inline; }
.finding .nums { color: #3c4043; font-size: 12.5px; margin: 4px 0; }
pre { background: #f1f3f4; padding: 8px 10px; border-radius: 4px; overflow-x: auto; font-size: 12px; margin: 6px 0;
      white-space: pre-wrap; word-break: break-word; }
code { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; overflow-wrap: anywhere; }
.cmd { background: #202124; color: #e8eaed; }
figure { background: #fff; border: 1px solid #dadce0; border-radius: 6px; margin: 12px 0; padding: 10px; }
figure img { max-width: 100%; height: auto; display: block; margin: 0 auto; }
figcaption { color: #5f6368; font-size: 12px; margin-top: 6px; }
details summary { cursor: pointer; color: #1a73e8; }
.muted { color: #80868b; }
{% for s, c in colors.items() %}.s-{{ s }} td:nth-child(2), td.s-{{ s }} { color: {{ c }}; }
{% endfor %}{% for s, c in sev_colors.items() %}.v-{{ s }} { background: {{ c }}; }
{% endfor %}</style></head>
<body data-expected-plots="{{ plots|length }}"><main>
<h1>rlconform · {{ eng.name }} {{ eng.version or "" }}</h1>
<div class="meta">engine spec <code>{{ eng.spec }}</code>{% if eng.revision %}, revision <code>{{ eng.revision }}</code>{% endif %}
· rlconform {{ doc.tool.version }} · profile {{ run.profile }} ·
{% if run.complete %}complete run{% else %}<b>incomplete run</b> (interrupted or still running){% endif %}
<details><summary>run details</summary>{% if eng.path %}path <code>{{ eng.path }}</code><br>{% endif %}
started {{ run.started }}{% if run.finished %}, finished {{ run.finished }}{% endif %}
{% if run.seed is not none %} · seed {{ run.seed }}{% endif %}{% if run.max_examples %} · max {{ run.max_examples }}
examples per finding{% endif %} · python {{ run.python }} · torch {{ run.torch }}
{% if run.device %}<br>device <code>{{ run.device.device }}</code> ({{ run.device.name }}{% if run.device.capability %}, compute
capability {{ run.device.capability }}{% endif %}{% if run.device.cpu_capability %}, CPU kernels
{{ run.device.cpu_capability }}{% endif %}){% if run.device.cuda %} · CUDA {{ run.device.cuda }}{% endif %}{% endif %}
{% if run.command %}<br><code>{{ run.command }}</code>{% endif %}</details></div>

<div class="counts">{% for s in statuses %}<div class="count{% if not summary.get(s) %} zero{% endif %}"
 style="background: {{ colors[s] }}">{{ s }}<span>{{ summary.get(s, 0) }}</span></div>{% endfor %}</div>

{% if defects %}<p class="verdict"><b>{{ triage_line }}</b>.</p>
{% if writes_line %}<details><summary>declared writes into a caller's tensor: not defects while the engine's own
callers keep them</summary><p>{{ writes_line }}</p></details>{% endif %}
<table id="defects-table"><tr><th>defect</th><th>severity</th><th>engine function (file:line)</th><th>failure</th><th>reached by</th><th>engine vs exact</th><th>findings</th></tr>
{% for d in defects %}<tr><td><a href="#{{ d.key }}">{{ d.key }}</a><td><span class="badge v-{{ d.severity }}">{{ d.severity }}</span><td>{{ d.where }}<td>{{ d.signature.kind }}<td>{{ d.reached_by }}<td>{{ d.nums }}<td>{{ d.members|length }}
{% endfor %}</table>
<details><summary>how to read the defects</summary><p class="muted">A defect is a root cause in the engine: the
findings that share the engine function (for a crash, the deepest engine frame), the kind of failure and its
trigger, across properties, dtypes and regimes; by severity, then reachability, then size of the effect.
"Reached by" names the configuration that reaches the defect (a trainer option, more than one micro-batch), or
says any configuration does. Each card shows the engine vs exact numbers and the reproducer of its smallest member,
its message and input; its members are listed in the table of failing findings below. {{ cite_note }}</p></details>
{% if coverage %}<p class="muted">coverage of the engine's numerics: {{ coverage }}</p>{% endif %}
<h2>defect cards</h2>
{% for d in defects %}<details class="finding" id="{{ d.key }}" style="border-left-color: {{ sev_colors.get(d.severity, "#888") }}">
<summary><h3>{{ d.key }} <span class="badge v-{{ d.severity }}">{{ d.severity }}</span> {{ d.where }} —
{{ d.signature.kind }} · {{ d.signature.feature }}</h3></summary>
<div class="nums">{{ (d.ops or [d.op])|join(", ") }} · {{ (d.properties or [d.property])|join(", ") }}{% if d.nums %}; engine vs exact on the smallest input: <b>{{ d.nums }}</b>{% endif %};
<a href="#{{ d.key }}-m">{{ d.members|length }} finding{{ "s" if d.members|length > 1 }}</a>:
{% for dt, regs in d.by_dtype %}<b>{{ dt }}</b>: {{ regs }}{% if not loop.last %}; {% endif %}{% endfor %}</div>
{% if d.remedy and d.remedy.cause %}<div class="why">{% if d.remedy_changed %}<b>{{ d.remedy_changed }}.</b> {% endif %}<b>cause</b>: {{ d.remedy.cause }}. <b>fix</b>: {{ d.remedy.fix }}.{% if d.remedy.impact %} <b>impact</b>: {{ d.remedy.impact }}.{% endif %}</div>{% endif %}
{% if d.reproducer.command %}<div>reproduce (its smallest member, <a href="#{{ d.reproducer.finding }}">{{ d.reproducer.finding.split(".")[2:]|join(".") }}</a>):</div>
<pre class="cmd"><code>{{ d.reproducer.command }}</code></pre>{% endif %}
{% if d.message %}<pre>{{ d.message | truncate(msg_chars, True, " …") }}</pre>{% endif %}
{% if d.reproducer.input %}<div>input:</div><pre>{{ d.reproducer.input | truncate(msg_chars, True, " …") }}</pre>{% endif %}
{% if d.traceback %}<details><summary>traceback (the engine's frames)</summary><pre>{{ d.traceback }}</pre></details>{% endif %}
{% if explain_blob %}<details><summary>upstream issue text{{ " and standalone script" if d.key in scripted }}</summary><pre id="explain-{{ d.key }}"></pre></details>{% endif %}
</details>{% endfor %}{% else %}{% if coverage %}<p class="muted">coverage of the engine's numerics: {{ coverage }}</p>{% endif %}{% endif %}
{{ declared_section }}
<h2>op × property × dtype</h2>
<p class="muted">Worst status over the regimes of each cell, with how many regimes have it (hover: the regimes that
do not pass).</p>
<table><tr><th>op</th><th>property</th>{% for d in dtypes %}<th>{{ d }}</th>{% endfor %}</tr>
{% for row in grid %}<tr><td>{{ row.op }}</td><td>{{ row.prop }}</td>{% for c in row.cells %}<td class="cell{% if c %} s-{{ c.status }}" title="{{ c.title }}{% endif %}">{% if c %}{{ c.text }}{% endif %}</td>{% endfor %}</tr>
{% endfor %}</table>

{% if plots %}<h2>plots</h2>
{% for p in plots %}<figure><img class="plot" alt="{{ p.title }}" src="{{ p.src }}"><figcaption><b>{{ p.title }}</b>:
{{ p.caption }}</figcaption></figure>{% endfor %}{% endif %}

<h2>findings that do not pass ({{ bad|length }})</h2>
{% if not bad %}<p>None: every finding passes.</p>{% else %}
<p class="muted">Grouped by defect. Reproduce a finding: {% if repro_pattern %}<code>{{ repro_pattern }}</code>
({% if repro_odd %}except where a command is shown{% else %}every finding{% endif %}){% else %}the command in its row{% endif %}.
Messages, worst inputs and crash tracebacks of every finding: the table of all findings (below) and report.json.</p>
<table><tr><th>dtype.regime</th><th>status</th><th>severity</th><th>examples</th><th>first failure</th><th>max abs err</th>
<th>max rel err</th><th>tolerance</th><th>error / tolerance</th></tr>
{% for g in bad_groups %}<tr class="grp"{% if g.key %} id="{{ g.key }}-m"{% endif %}><th colspan="9">{% if g.key %}<a href="#{{ g.key }}">{{ g.key }}</a> {% endif %}{{ g.title }}</th></tr>
{% for f in g.findings %}<tr id="{{ f.id }}" class="s-{{ f.status }}"><td>{{ f.short }}{% if f.odd_cmd %}<br><code>{{ f.odd_cmd }}</code>{% endif %}<td>{{ f.status }}<td>{{ f.severity or "" }}<td>{{ f.examples }}<td>{{ f.first or "" }}<td>{{ err(f) }}<td>{{ err(f, "max_rel_err") }}<td>{{ fmt(f.tolerance) }}<td>{{ fmt(ratio(f)) }}
{% endfor %}{% endfor %}</table>{% endif %}

<h2>all findings ({{ findings|length }})</h2>
<p class="muted">Every finding, with the message, worst input and (crashes) traceback tail of those that do not
pass; expanded by the page's script from a compressed copy. Filter (all words must match):
<input type="search" size="40" oninput="filterFindings(this.value)" placeholder="e.g. entropy float16 discrepancy"></p>
<details><summary>show the table</summary>
<table><thead><tr>{% for c in columns %}<th>{{ c }}</th>{% endfor %}</tr></thead><tbody id="all-findings"></tbody></table>
</details>
<script type="application/octet-stream" id="findings-data">{{ blob }}</script>
{% if explain_blob %}<script type="application/octet-stream" id="explain-data">{{ explain_blob }}</script>{% endif %}
</main></body></html>
""", autoescape=True)

#: the columns of the all-findings table (the rows of the compressed blob, in this order)
COLUMNS = ("finding", "status", "severity", "examples", "max abs err", "max rel err", "tolerance",
           "error / tolerance", "message · worst input · traceback")
#: characters of a message / worst input kept in the all-findings table (the full text is in report.json)
DETAIL_CHARS = 2000


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
            others = [f"{f['regime']}: {f['status']}" for f in fs if f["status"] != "pass"]
            title = (f"{len(fs) - len(others)} of {len(fs)} regimes pass" + (": not " if others else "")
                     + ", ".join(others))
            row["cells"].append({"status": worst, "title": title,
                                 "text": SHORT.get(worst, worst) + (f" {n}/{len(sts)}" if worst != "pass" else "")})
        rows.append(row)
    return rows


def make_plots(doc: dict) -> list[dict]:
    findings = doc.get("findings", [])
    return plot_softmax(findings)


def _regimes_text(regimes: list[str]) -> str:
    """``["grpo@a", "grpo@b", "rloo@a", "x"]`` → ``"grpo@{a, b}, rloo@a, x"`` (variants sharing a prefix)."""
    groups: dict[str, list[str]] = {}
    for r in regimes:
        head, sep, tail = r.partition("@")
        groups.setdefault(head + sep, []).append(tail if sep else "")
    parts = []
    for head, tails in groups.items():
        if not head.endswith("@"):
            parts.append(head)
        elif len(tails) == 1:
            parts.append(head + tails[0])
        else:
            parts.append(head + "{" + ", ".join(tails) + "}")
    return ", ".join(parts)


def _by_dtype(member_ids: list[str], by_id: dict[str, dict]) -> list[tuple[str, str]]:
    """A defect's members as (dtypes, regimes text) in dtype order, dtypes with the same regimes merged: the
    compact member list of its card."""
    groups: dict[str, list[str]] = {}
    for m in member_ids:
        f = by_id.get(m)
        if f is not None:
            groups.setdefault(f.get("dtype") or "", []).append(f.get("regime") or "")
    order = {d: i for i, d in enumerate(FLOAT_DTYPES)}
    merged: dict[str, list[str]] = {}
    for dt in sorted(groups, key=lambda d: order.get(d, 9)):
        merged.setdefault(_regimes_text(groups[dt]), []).append(dt)
    return [(", ".join(dts), text) for text, dts in merged.items()]


def _repro_pattern(bad: list[dict]) -> str | None:
    """The reproducer command with the finding id as ``<finding id>``, when the commands of most failing
    findings follow one pattern (``rlconform replay <out>/cases/<id>.json --engine E``)."""
    counts: dict[str, int] = {}
    for f in bad:
        cmd = (f.get("reproducer") or {}).get("command") or ""
        if f["id"] in cmd:
            pat = cmd.replace(f["id"], "<finding id>")
            counts[pat] = counts.get(pat, 0) + 1
    return max(counts, key=counts.get) if counts else None


_CAUSE = "The above exception was the direct cause of the following exception:"
_GROUP_MARGIN = re.compile(r"^[ ]*\| ?", re.M)  # the margin of an exception group's sub-traceback
_CARETS = re.compile(r"^[ ~^]*\^[ ~^]*\n", re.M)  # Python 3.11's position markers under a frame's line


def engine_traceback(tb: str | None) -> str | None:
    """The part of a crash's traceback a maintainer reads: the exception the engine raised (the frames
    above the harness's ``EngineCrash ... from exc``), without pytest's exception-group margin and the
    ``^^^`` markers, its last :data:`TRACEBACK_CHARS` characters (whole lines); the tail of the whole
    traceback when it has no such cause."""
    if not tb:
        return None
    cut = tb.find(_CAUSE)
    if cut < 0:
        return "traceback (tail):\n" + tb[-TRACEBACK_CHARS:]
    head = tb[:cut]
    start = head.rfind("Traceback (most recent call last):")
    text = _CARETS.sub("", _GROUP_MARGIN.sub("", head[max(start, 0):])).rstrip()
    if len(text) > TRACEBACK_CHARS:
        text = "…" + text[text.find("\n", len(text) - TRACEBACK_CHARS):]
    return "engine traceback:\n" + text


def _details(f: dict) -> str:
    if f["status"] == "pass":
        return ""
    parts = []
    if f.get("message"):
        m = f["message"].strip()
        parts.append(m if len(m) <= DETAIL_CHARS else m[:DETAIL_CHARS] + " …(full text in report.json)")
    if f.get("worst_input"):
        w = f["worst_input"]
        parts.append("worst input: " + (w if len(w) <= DETAIL_CHARS else w[:DETAIL_CHARS] + " …"))
    if f.get("traceback") and f["status"] == "crash":
        parts.append(engine_traceback(f["traceback"]))
    return "\n".join(parts)


def findings_blob(findings: list[dict]) -> str:
    """Every finding as one row of :data:`COLUMNS`, JSON, gzip'd (mtime 0: the same report gives the same
    page), base64: what the page's script expands into the all-findings table."""
    rows = []
    for f in findings:
        ex = f.get("examples")
        first = f.get("examples_to_first_failure")
        sev = f.get("severity") or ""
        if sev and f.get("severity_reason"):
            sev += ": " + f["severity_reason"]
        rows.append([f["id"], f["status"], sev, f"{ex} (first failure: {first})" if first else _fmt(ex),
                     error_text(f), error_text(f, "max_rel_err"), _fmt(f.get("tolerance")),
                     _fmt(_ratio_of(f)), _details(f)])
    raw = json.dumps(rows, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")


def read_blob(html: str) -> list[list[str]]:
    """The rows of the all-findings table of a rendered page (the inverse of :func:`findings_blob`; tests)."""
    m = re.search(r'<script type="application/octet-stream" id="findings-data">([^<]*)</script>', html)
    return json.loads(gzip.decompress(base64.b64decode(m.group(1))).decode("utf-8"))


def _where(d: dict) -> str:
    """The engine function of a defect card: ``function (file:line)``, the crash frame first (and the
    frame a mutation happens in, "via"); else its op — report.md's cell without its code marks."""
    from rlconform.harness.report.triage_md import where_cell

    return where_cell(d).replace("`", "")


def _nums(d: dict) -> str:
    """Engine vs exact with the digits that tell them apart and the relative error, or what changed
    (report.md's cell)."""
    from rlconform.harness.report.triage_md import numbers_cell

    return numbers_cell(d)


def reached_by(d: dict) -> str:
    """What reaches a defect, for its row: the configuration its trigger names (reach 3), any configuration
    (reach 2, with the input feature when there is one), an edge input under any configuration (reach 1), or
    only another dtype / an extreme input (reach 0). A defect without ``reach`` (an older report): its trigger."""
    trigger = (d.get("trigger") or (d.get("signature") or {}).get("feature") or "").strip()
    reach = d.get("reach")
    if reach is None:
        return trigger or "any configuration"
    if reach >= 3:
        return f"configuration: {trigger}" if trigger else "a configuration"
    if reach == 2:
        return "any configuration" + (f" ({trigger})" if trigger and trigger != "any input" else "")
    if reach == 1:
        return f"any configuration, on {trigger}" if trigger else "any configuration, on an edge input"
    if not trigger or trigger == "any input":
        return "another dtype or an extreme input only"
    return trigger if trigger.startswith("(only") else f"{trigger} (another dtype or an extreme input only)"


def _page_parts(doc: dict) -> dict:
    findings = doc.get("findings", [])
    by_id = {f["id"]: f for f in findings}
    bad = [f for f in findings if f["status"] != "pass"]
    pattern = _repro_pattern(bad)
    defects, owner = [], {}
    for n, d in enumerate(doc.get("defects") or [], 1):
        key = f"D{n}"
        rep = by_id.get((d.get("reproducer") or {}).get("finding") or "", {})
        tb = engine_traceback(rep.get("traceback")) if rep.get("status") == "crash" else None
        defects.append(dict(d, key=key, by_dtype=_by_dtype(d["members"], by_id), traceback=tb, where=_where(d),
                            nums=_nums(d), reached_by=reached_by(d), remedy_changed=changed_words(d.get("remedy") or {})))
        for m in d["members"]:
            owner.setdefault(m, (key, d))
    groups: dict[str, dict] = {}
    for f in bad:
        key, d = owner.get(f["id"], ("", None))
        title = (f"{_where(d)} — {d['signature']['kind']} · {d['signature']['feature']}" if d
                 else f"{f['op']} · {f['property']} (in no defect)")
        g = groups.setdefault(key + "|" + (title if not d else ""), {"key": key, "title": title, "findings": []})
        cmd = (f.get("reproducer") or {}).get("command")
        odd = cmd if cmd and (pattern is None or cmd != pattern.replace("<finding id>", f["id"])) else None
        g["findings"].append(dict(f, short=f"{f.get('dtype')}.{f.get('regime')}", odd_cmd=odd,
                                  first=f.get("examples_to_first_failure")))
    rank = {d["key"]: i for i, d in enumerate(defects)}
    bad_groups = sorted(groups.values(), key=lambda g: (rank.get(g["key"], len(rank)), g["title"]))
    return {"defects": defects, "bad": bad, "bad_groups": bad_groups, "repro_pattern": pattern,
            "repro_odd": any(f["odd_cmd"] for g in bad_groups for f in g["findings"])}


def render_html(doc: dict, folder: str | None = None) -> str:
    """The page for a report document (the ``report.json`` dict); with the report ``folder`` (its ``cases/``),
    each defect card gets its ``rlconform explain`` text and standalone script, collapsed."""
    from rlconform.harness.report.explain import explain_blob

    findings = doc.get("findings", [])
    parts = _page_parts(doc)
    explained, scripted = explain_blob(doc, folder, [d["key"] for d in parts["defects"]]) if folder else (None, ())
    return TEMPLATE.render(
        explain_blob=explained, scripted=set(scripted),
        doc=doc, eng=doc.get("engine", {}), run=doc.get("run", {}), summary=doc.get("summary", {}),
        statuses=list(STATUS_ORDER), colors=STATUS_COLOR, dtypes=FLOAT_DTYPES, grid=_grid(findings),
        plots=make_plots(doc), findings=findings, fmt=_fmt, err=error_text, ratio=_ratio_of,
        sev_colors=SEVERITY_COLOR,
        triage_line=_triage_line(doc), writes_line=_writes_line(doc), cite_note=_cite_note(), msg_chars=MESSAGE_CHARS, script=markupsafe.Markup(SCRIPT),
        columns=COLUMNS, blob=findings_blob(findings), coverage=_coverage_line(doc),
        declared_section=_declared_section(doc), **parts)


def _declared_section(doc: dict):
    from rlconform.harness.report.declared_md import html_section

    return markupsafe.Markup(html_section(doc))


def _coverage_line(doc: dict) -> str | None:
    from rlconform.harness.report.coverage_md import counts_line

    return counts_line(doc["coverage"]) if doc.get("coverage") else None


def _cite_note() -> str:
    """How a row's file:line is chosen (report.md's line: :data:`rlconform.harness.report.triage_md.CITE_NOTE`)."""
    from rlconform.harness.report.triage_md import CITE_NOTE

    return CITE_NOTE


def _writes_line(doc: dict) -> str:
    """The declared writes (:func:`rlconform.harness.report.declared_md.writes_line`), without markdown."""
    from rlconform.harness.report.declared_md import writes_line

    return writes_line(doc).replace("`", "")


def _triage_line(doc: dict) -> str:
    from rlconform.harness.report.triage_md import counts_line

    return counts_line(doc).replace("**", "")


def write_html(doc: dict, path: str) -> str:
    atomic_write(path, render_html(doc, os.path.dirname(os.path.abspath(path))))
    return path

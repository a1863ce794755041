"""report.html: rendered from a real check run, self-contained, and loaded in headless Chromium, which must
report no console error and every plot decoded (the page's script sets ``document.title`` to ``ok:N``).

Chromium is Debian's ``chromium`` (``make browser`` installs it when run as root with apt); without it
the browser tests skip and say so."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import forked_cli
import pytest

from rlconform.harness.report.html_report import engine_traceback, read_blob, render_html

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _browser() -> str | None:
    return next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)


def load_in_browser(html_path: str, dom: list | None = None, window: tuple[int, int] | None = None
                    ) -> tuple[str, list[str]]:
    """Load the page headless (``html_path`` may end in ``#anchor``); return (document.title after load,
    console messages); the DOM after the page's script ran is appended to ``dom`` when given."""
    exe = _browser()
    if exe is None:
        pytest.skip("headless Chromium not found (install it: `make browser`, or apt-get install -y chromium)")
    path, _, anchor = html_path.partition("#")
    size = [f"--window-size={window[0]},{window[1]}"] if window else []
    proc = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", *size, "--dump-dom",
         "file://" + os.path.abspath(path) + (f"#{anchor}" if anchor else "")],
        capture_output=True, text=True, timeout=120)
    m = re.search(r"<title>(.*?)</title>", proc.stdout, re.S)
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert m, f"chromium dumped no DOM (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    if dom is not None:
        dom.append(proc.stdout)
    return m.group(1), console


def cli(*args, cwd):
    return forked_cli.run(args, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def pipeline_report(tmp_path_factory):
    """A real run: the mean-of-shard-means mutant's metric pipeline, 5 examples per finding of every property,
    in float32 (one dtype draws the same page parts as three), not shrunk (shrinking sizes the reproducer
    only; the failing examples drawn are kept in the samples all the same)."""
    tmp = tmp_path_factory.mktemp("htmlrep")
    proc = cli("check", "--engine", "mutants.mean_of_shard_means", "--op", "metric_pipeline", "--dtype", "float32",
               "--max-examples", "5", "--max-shrinks", "0", "--out", "rep", "-q", "-n", "0", cwd=tmp)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return tmp / "rep"


def expected_plots(html: str) -> int:
    return int(re.search(r'data-expected-plots="(\d+)"', html).group(1))


@pytest.mark.cli
def test_check_writes_a_self_contained_html_report(pipeline_report):
    html = (pipeline_report / "report.html").read_text()
    doc = json.loads((pipeline_report / "report.json").read_text())
    # self-contained: no external resource of any kind
    assert not re.search(r'(src|href)="(?!data:|#)', html)
    assert "http://" not in html and "https://" not in html
    # no softmax statistic checked: no plot (the samples stay in report.json)
    assert expected_plots(html) == 0 and html.count('<img class="plot"') == 0
    # every non-pass finding has a row; its reproducer command is the page's pattern or shown in its row
    bad = [f for f in doc["findings"] if f["status"] != "pass"]
    assert bad
    pattern = re.search(r"Reproduce a finding: <code>(.*?)</code>", html).group(1).replace("&lt;", "<")
    pattern = pattern.replace("&gt;", ">")
    for f in bad:
        assert f'id="{f["id"]}"' in html
        cmd = f["reproducer"]["command"]
        assert cmd == pattern.replace("<finding id>", f["id"]) or cmd in html
    # every finding, with the message and worst input of the failing ones, in the compressed table
    rows = {r[0]: r for r in read_blob(html)}
    assert set(rows) == {f["id"] for f in doc["findings"]}
    for f in bad:
        assert rows[f["id"]][1] == f["status"]
        assert f["message"].strip()[:200] in rows[f["id"]][-1] and f["worst_input"][:200] in rows[f["id"]][-1]
    # every defect: its card with the smallest member's reproducer command
    assert doc["defects"]
    for n, d in enumerate(doc["defects"], 1):
        card = html[html.index(f'id="D{n}"'):]
        card = card[:card.index("</div>\n<")] if "</div>\n<" in card else card
        assert d["reproducer"]["command"] in html and f"{len(d['members'])} finding" in card
    # the samples behind the plot: bounded, with the imbalance of each example
    for f in doc["findings"]:
        if f["property"] in ("matches_reference", "partition_invariant"):
            assert f["samples"] and len(f["samples"]) <= 50
            assert all(s["imbalance"] >= 0 and s["abs_err"] >= 0 for s in f["samples"])
            if f["status"] == "discrepancy":  # the mutant fails there: its failing examples are kept
                assert any(not s["ok"] for s in f["samples"])


@pytest.mark.cli
def test_report_command_rerenders(pipeline_report):
    os.remove(pipeline_report / "report.html")
    os.remove(pipeline_report / "report.md")
    proc = cli("report", str(pipeline_report), cwd=pipeline_report)
    assert proc.returncode == 0, proc.stderr
    assert (pipeline_report / "report.html").exists() and (pipeline_report / "report.md").exists()
    assert cli("report", str(pipeline_report / "nope"), cwd=pipeline_report).returncode == 2


@pytest.mark.cli
def test_html_loads_in_chromium_without_errors(pipeline_report):
    html = (pipeline_report / "report.html").read_text()
    dom = []
    title, console = load_in_browser(str(pipeline_report / "report.html"), dom)
    assert console == [], console
    assert title == f"ok:{expected_plots(html)}", title
    # the script expanded every finding into the all-findings table
    n = len(json.loads((pipeline_report / "report.json").read_text())["findings"])
    assert f'data-rows="{n}"' in dom[0]
    assert dom[0].count('<tr class="s-') >= n


@pytest.mark.cli
def test_browser_check_catches_a_broken_findings_table(pipeline_report, tmp_path):
    """The browser check can fail: a findings table that does not decompress turns the title into an error."""
    html = (pipeline_report / "report.html").read_text()
    broken = re.sub(r'(id="findings-data">)[^<]+', r"\1H4sIAAAAAAAAA3N0cgYAAAD//w==", html, count=1)
    path = tmp_path / "broken.html"
    path.write_text(broken)
    title, _ = load_in_browser(str(path))
    assert title.startswith("error:findings table"), title


def test_crash_traceback_shows_the_engines_frames():
    """A crash's traceback on the page is the engine's exception (above the harness's ``raise ... from``),
    without the exception-group margin and the ``^^^`` markers; a traceback without a cause keeps its tail."""
    tb = ("Traceback (most recent call last):\n  File \"pytest.py\", line 1, in run\n"
          "  +-+---------------- 1 ----------------\n"
          "    | Traceback (most recent call last):\n"
          "    |   File \"/site-packages/verl/utils/torch_functional.py\", line 319, in masked_var\n"
          "    |     raise ValueError(\"At least one element in the mask has to be 1.\")\n"
          "    |     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
          "    | ValueError: At least one element in the mask has to be 1.\n    | \n"
          "    | The above exception was the direct cause of the following exception:\n    | \n"
          "    | Traceback (most recent call last):\n    |   File \"harness/core/evaluation.py\", line 43\n"
          "    | EngineCrash: engine raised\n")
    text = engine_traceback(tb)
    assert text.splitlines() == [
        "engine traceback:", "Traceback (most recent call last):",
        '  File "/site-packages/verl/utils/torch_functional.py", line 319, in masked_var',
        '    raise ValueError("At least one element in the mask has to be 1.")',
        "ValueError: At least one element in the mask has to be 1."]
    assert engine_traceback("x" * 5000 + "end").endswith("x" * 100 + "end")
    assert engine_traceback(None) is None


def test_browser_check_catches_a_broken_plot(tmp_path):
    """The browser check can fail: a plot that does not decode turns the title into an error."""
    html = render_html(_heatmap_doc())
    assert expected_plots(html) == 1
    broken = re.sub(r'src="data:image/png;base64,[^"]+"', 'src="data:image/png;base64,AAAA"', html, count=1)
    path = tmp_path / "broken.html"
    path.write_text(broken)
    title, _ = load_in_browser(str(path))
    assert title.startswith("error:plot did not load"), title


def _token_finding(op, prop, dtype, regime, status="pass", rel=1e-7, ratio=0.05):
    return {"id": f"{op}.{prop}.{dtype}.{regime}", "op": op, "property": prop, "dtype": dtype, "regime": regime,
            "status": status, "examples": 20, "max_abs_err": rel, "max_rel_err": rel, "tolerance": 1e-6,
            "max_ratio": ratio, "message": "value: engine nan vs reference 0.0" if status != "pass" else "",
            "worst_input": "logits[1, 2]=[0.0, -inf]" if status != "pass" else None,
            "reproducer": {"case_file": "x.json", "command": "rlconform replay x.json"} if status != "pass" else None,
            "traceback": None, "xfail_listed": False, "samples": None}


def _heatmap_doc() -> dict:
    from rlconform.harness.catalog.ops import LOGITS_REGIMES

    findings = [_token_finding(op, "matches_reference", d, r, ratio=10.0 ** (i % 5 - 3))
                for op in ("entropy", "sum_pi_squared") for r, ds in LOGITS_REGIMES.items() for i, d in enumerate(ds)]
    return {"schema": "rlconform.report/1", "tool": {"name": "rlconform", "version": "0"},
            "engine": {"name": "synthetic", "spec": "x.py", "version": None},
            "run": {"complete": True, "profile": "ci"}, "summary": {"pass": len(findings)}, "findings": findings}


def test_softmax_heatmap_and_escaping(tmp_path):
    """Token statistics get the dtype × regime heatmap; text from the report is escaped."""
    from rlconform.harness.catalog.ops import LOGITS_REGIMES

    findings = [_token_finding(op, "matches_reference", d, r, ratio=10.0 ** (i % 5 - 3))
                for op in ("entropy", "sum_pi_squared") for r, ds in LOGITS_REGIMES.items() for i, d in enumerate(ds)]
    findings.append(_token_finding("entropy", "finite_where_reference_finite", "float32", "neg_inf_padded",
                                   status="discrepancy", ratio=None))
    findings[-1]["message"] = "<script>alert(1)</script>"
    doc = {"schema": "rlconform.report/1", "tool": {"name": "rlconform", "version": "0"},
           "engine": {"name": "synthetic", "spec": "x.py", "version": None},
           "run": {"complete": True, "profile": "ci"}, "summary": {"pass": len(findings) - 1, "discrepancy": 1},
           "findings": findings}
    html = render_html(doc)
    assert "<script>alert(1)</script>" not in html
    assert expected_plots(html) == 1  # the heatmap, the page's only plot
    assert "softmax statistics: error by dtype and logits regime" in html
    path = tmp_path / "report.html"
    path.write_text(html)
    title, console = load_in_browser(str(path))
    assert console == [] and title == "ok:1", (title, console)


VERL_REPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reports", "verl-0.9.1")


def test_the_committed_verl_page_fits_a_1400px_window_and_leads_with_its_defects(tmp_path):
    """verl's page at 1400 × 900: nothing wider than the window, the defect table starts on the first screen,
    every card is collapsed, and a link to a card (``#D1``) opens it."""
    doc = json.loads(open(os.path.join(VERL_REPORT, "report.json")).read())
    assert doc["defects"], "the committed verl report has defects to show"
    path = tmp_path / "report.html"
    path.write_text(render_html(doc))
    for anchor, open_cards in (("", "0"), ("#D1", "1")):
        dom = []
        title, console = load_in_browser(str(path) + anchor, dom, window=(1400, 900))
        assert title.startswith("ok:"), title
        width = int(re.search(r'data-scroll-width="(\d+)"', dom[0]).group(1))
        top = int(re.search(r'data-defects-top="(\d+)"', dom[0]).group(1))
        assert width <= 1400, width
        assert 0 < top < 900 - 100, top  # the table's head and first rows on the first screen
        assert re.search(rf'data-open-cards="{open_cards}"', dom[0]), anchor
    html = path.read_text()
    assert html.count('<details class="finding"') == len(doc["defects"])
    assert '<details class="finding" open' not in html


def test_reached_by_names_the_configuration_or_says_any():
    from rlconform.harness.report.html_report import reached_by

    assert reached_by({"reach": 3, "trigger": "more than one micro-batch"}) == \
        "configuration: more than one micro-batch"
    assert reached_by({"reach": 2, "trigger": "any input"}) == "any configuration"
    assert reached_by({"reach": 2, "trigger": "bf16 input"}) == "any configuration (bf16 input)"
    assert reached_by({"reach": 1, "trigger": "a row with no valid token"}) == \
        "any configuration, on a row with no valid token"
    assert reached_by({"reach": 0, "trigger": "fp16 overflow"}) == "fp16 overflow (another dtype or an extreme input only)"
    assert reached_by({"reach": 0, "trigger": "any input"}) == "another dtype or an extreme input only"
    assert reached_by({"signature": {"feature": "TP > 1"}}) == "TP > 1"  # an older report: its trigger

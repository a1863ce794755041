"""report.md / report.html print a finding's worst error as what it is: ``NaN`` / ``inf`` where the engine
gave a non-finite value at a finite exact value, ``–`` where a failure has no numeric measure,
never the ``0`` that the finite-only maxima hold there."""

from __future__ import annotations

import math

from rlconform.harness.report.html_report import render_html
from rlconform.harness.report.measures import error_text, number_text
from rlconform.harness.report.writer import render_markdown


def _f(fid, status="discrepancy", abs_err=0.0, rel_err=0.0, message="", **kw):
    op, prop, dtype, regime = fid.split(".")
    return {"id": fid, "op": op, "property": prop, "dtype": dtype, "regime": regime, "status": status,
            "examples": 3, "max_abs_err": abs_err, "max_rel_err": rel_err, "tolerance": 1e-6, "max_ratio": None,
            "message": message, "worst_input": "x[1]=[0.0]", "traceback": None, "xfail_listed": False,
            "samples": None, "reproducer": {"case_file": f"cases/{fid}.json",
                                            "command": f"rlconform replay cases/{fid}.json --engine e"}, **kw}


NAN = _f("entropy.finite_where_reference_finite.float32.neg_inf_padded",
         message="value: engine nan where the reference is finite (0.0) at flat index 0")
INF = _f("masked_mean.finite_where_reference_finite.float16.padded",
         message="value: engine inf where the reference is finite (100.0) at flat index 0")
CRASH = _f("gae.non_destructive.float32.padded", status="crash", message="engine raised in gae: ValueError: no")
NUMERIC = _f("entropy.matches_reference.float32.moderate", abs_err=3.5e-6, rel_err=2.0e-6, max_ratio=3.5,
             message="value = 1.0000035 vs 1.0 at flat index 0 (reference 1.0, allowed difference 1e-06)")
PASSING = _f("entropy.matches_reference.float64.moderate", status="pass", abs_err=0.0)


def test_error_text():
    assert error_text(NAN) == "NaN" and error_text(NAN, "max_rel_err") == "NaN"
    assert error_text(INF) == "inf"
    assert error_text(CRASH) == "–"  # a crash has no error measure: not 0
    assert error_text(NUMERIC) == "3.5e-06" and error_text(NUMERIC, "max_rel_err") == "2e-06"
    assert error_text(PASSING) == "0"  # an exact pass is 0
    assert error_text(dict(NUMERIC, message="", max_abs_err=math.inf)) == "inf"
    assert [number_text(x) for x in (None, math.nan, -math.inf, 0.5, 7)] == ["–", "NaN", "-inf", "0.5", "7"]


def _doc(findings):
    from rlconform.harness.report.triage import annotate

    summary = {}
    for f in findings:
        summary[f["status"]] = summary.get(f["status"], 0) + 1
    return annotate({"schema": "rlconform.report/1", "tool": {"name": "rlconform", "version": "0"},
                     "engine": {"name": "e", "spec": "e", "version": None}, "run": {"complete": True},
                     "summary": summary, "findings": findings})


def _md_row(md, op, prop):
    (row,) = [line for line in md.splitlines() if line.startswith(f"| discrepancy | {op} | {prop} |")
              or line.startswith(f"| crash | {op} | {prop} |")]
    return row.split(" | ")


def test_report_md_worst_abs_err_column():
    md = render_markdown(_doc([NAN, INF, CRASH, NUMERIC, PASSING]))
    header = next(line for line in md.splitlines() if "worst abs err" in line).split(" | ")
    col = header.index("worst abs err")
    assert _md_row(md, "entropy", "finite_where_reference_finite")[col] == "NaN"
    assert _md_row(md, "masked_mean", "finite_where_reference_finite")[col] == "inf"
    assert _md_row(md, "gae", "non_destructive")[col] == "–"
    assert _md_row(md, "entropy", "matches_reference")[col] == "3.5e-06"


def test_report_html_rows_say_nan():
    html = render_html(_doc([NAN, NUMERIC, PASSING]))
    row = html[html.index(f'<tr id="{NAN["id"]}"'):]
    row = row[:row.index("\n")]
    cells = row.split("<td>")[1:]
    assert cells[5:7] == ["NaN", "NaN"], cells  # max abs err, max rel err

"""Why a defect happens and how to fix it: the binding's sentences reach the row, its explain text and the page,
keyed as fault anchors are; rows no binding explains get their idiom's."""

from __future__ import annotations

import pytest

from rlconform.harness.catalog.binding import Binding, BindingError
from rlconform.harness.report.remedies import IDIOMS, remedy

SITE = {"module": "eng.core", "function": "agg_loss", "file": "eng/core.py", "line": 10}


def _row(kind="wrong value", trigger="any input", site=SITE, frame=None):
    return {"signature": {"kind": kind, "feature": trigger}, "trigger": trigger, "engine_function": site,
            "crash_frame": frame, "severity": "training", "op": "agg_loss"}


def _table(**rules):
    return Binding(name="eng", ops={}, remedies={"eng.core.agg_loss": rules}).remedy_table()


def test_a_binding_remedy_is_found_by_function_kind_and_trigger():
    table = _table(**{"wrong value": ("divides by the rows", "divide by the kept rows", "scales the gradient")})
    table["eng.core.agg_loss"].append({"kinds": "NaN", "trigger": "masked", "cause": "NaN · 0", "fix": "where",
                                       "impact": ""})
    got = remedy(_row(), table)
    assert got == {"cause": "divides by the rows", "fix": "divide by the kept rows", "impact": "scales the gradient",
                   "source": "binding"}
    assert remedy(_row("NaN / inf", "a masked position holding NaN"), table)["cause"] == "NaN · 0"
    assert remedy(_row("NaN / inf", "a −inf logit"), table)["source"] == "idiom"  # the rule's trigger does not match
    crash = _row("crash:ZeroDivisionError", site=None, frame=dict(SITE, function="agg_loss"))
    assert remedy(crash, _table(**{"crash:ZeroDivisionError": ("1 / 0", "guard it")}))["fix"] == "guard it"


def test_a_row_no_binding_explains_gets_its_idioms_sentences_or_says_none():
    cause, fix = IDIOMS[("NaN / inf", "a masked position holding NaN")]
    nan = remedy(_row("NaN / inf", "a masked position holding NaN"), {})
    assert (nan["cause"], nan["fix"], nan["source"]) == (f"`agg_loss`: {cause}", fix, "idiom")
    cited = dict(SITE, fault={"line": 12, "text": "  s = (x * m).sum()"})
    assert remedy(_row("NaN / inf", "a masked position holding NaN", cited), {})["cause"] == \
        f"`s = (x * m).sum()` in `agg_loss`: {cause}"
    assert remedy(_row("partition dependence", "more than one micro-batch"), None)["source"] == "idiom"
    assert remedy(_row(), {}) == {"cause": "", "fix": "", "impact": "", "source": "none"}


def test_a_remedy_needs_a_cause_and_a_fix():
    for bad in (("only a cause",), ("", "a fix"), ("a", "b", "c", "d"), "a sentence"):
        with pytest.raises(BindingError, match="remedy"):
            Binding(name="eng", ops={}, remedies={"eng.core.agg_loss": {"wrong value": bad}})


def test_the_bundled_remedies_are_well_formed_and_never_repeat_a_cause():
    """verl's, SkyRL's and Megatron-core's remedies: (cause, fix[, impact]) sentences keyed by an engine function,
    without a cause sentence used twice. (That each key is a function of the installed engine is checked where the
    engines are: the committed reports' rows all find theirs.)"""
    import re

    from rlconform.harness.bindings import megatron_remedies, skyrl_remedies, verl_remedies

    for module in (verl_remedies, skyrl_remedies, megatron_remedies):
        table = Binding(name=module.__name__, ops={}, remedies=module.REMEDIES).remedy_table()
        assert all(re.fullmatch(r"[a-z_][\w.]*\.[A-Za-z_][\w.]*(\[\w+\])?", where) for where in table), list(table)
        causes = [r["cause"] for rows in table.values() for r in rows]
        assert len(causes) == len(set(causes)) and all(c[-1] != "." for c in causes)  # the renderer adds the stop


def test_the_cause_and_fix_reach_report_md_and_explain():
    from rlconform.harness.report.explain import explain_markdown
    from rlconform.harness.report.triage_md import remedy_lines

    d = dict(_row(), id="d1", members=["a"], remedy={"cause": "divides by the rows", "fix": "divide by the kept rows",
                                                     "impact": "scales the gradient", "source": "binding"})
    lines = remedy_lines([d, dict(d, severity="precision", remedy={"source": "none"})])
    assert "1. `agg_loss` (core.py:10) · wrong value: divides by the rows. **Fix:** divide by the kept rows. " \
           "**Impact:** scales the gradient." in lines
    assert "2. `agg_loss` (core.py:10) · wrong value: no cause recorded by the binding." in lines
    text = explain_markdown({"engine": {"name": "eng"}}, dict(d, reproducer={}), None)
    assert "**Why:** divides by the rows." in text and "**Fix:** divide by the kept rows." in text


@pytest.mark.parametrize("folder", ["verl-0.9.1", "skyrl-0.4.0", "megatron-core-0.19.2"])
def test_every_committed_defect_row_says_why_and_how_to_fix_it(folder):
    """Each row of a committed report carries its binding's (or its idiom's) cause and fix, each training row an
    impact, and no two rows of a report share a cause sentence (one root cause, one reading)."""
    import json
    import pathlib

    doc = json.loads((pathlib.Path(__file__).resolve().parents[1] / "reports" / folder / "report.json").read_text())
    rows = doc["defects"]
    assert rows and doc["engine"].get("remedies"), "the report records no remedies: regenerate it"
    missing = [d["id"] for d in rows if (d.get("remedy") or {}).get("source") not in ("binding", "idiom")]
    assert not missing, f"rows no binding or idiom explains: {missing}"
    assert not [d["id"] for d in rows if d["severity"] == "training" and not d["remedy"].get("impact")]
    causes = [d["remedy"]["cause"] for d in rows]
    assert len(set(causes)) == len(causes), [c for c in causes if causes.count(c) > 1]


def test_a_remedy_of_a_function_the_change_reached_says_so_first():
    """After ``--changed-since``, a row whose function (or one it calls) changed keeps the binding's sentences, marked
    as written for the code before the change; the report, explain text and page print that first."""
    from rlconform.harness.report.explain import explain_markdown
    from rlconform.harness.report.html_report import _page_parts
    from rlconform.harness.report.triage_md import remedy_lines

    table = _table(**{"wrong value": ("divides by the rows", "divide by the kept rows")})
    changed = {"rev": "base123", "paths": {"eng/core.py:agg_loss": ["eng/core.py:agg_loss", "eng/util.py:masked_mean"]}}
    got = remedy(_row(), table, changed)
    assert got["cause"] == "divides by the rows" and got["changed"] == {
        "rev": "base123", "path": ["eng/core.py:agg_loss", "eng/util.py:masked_mean"]}
    assert "changed" not in remedy(_row(), table, {"rev": "r", "paths": {"eng/other.py:f": ["eng/other.py:f"]}})
    # a caller between a bound function and the change, and an idiom's sentences, are marked too
    between = {"rev": "r", "paths": {"eng/top.py:step": ["eng/top.py:step", "eng/core.py:agg_loss", "eng/u.py:mm"]}}
    assert remedy(_row(), table, between)["changed"]["path"] == ["eng/core.py:agg_loss", "eng/u.py:mm"]
    nan = remedy(_row("NaN / inf", "a masked position holding NaN"), {}, between)
    assert nan["source"] == "idiom" and nan["changed"]["path"] == ["eng/core.py:agg_loss", "eng/u.py:mm"]
    assert "changed" not in remedy(_row(), table)
    d = dict(_row(), id="d1", members=["a"], remedy=got)
    line = remedy_lines([d])[-1]
    assert line.startswith("1. `agg_loss` (core.py:10) · wrong value: **Changed since base123: `eng/core.py:agg_loss` "
                           "-> `eng/util.py:masked_mean` (changed); the cause below is the binding's reading of the "
                           "code before the change, read the change first.** divides by the rows."), line
    text = explain_markdown({"engine": {"name": "eng"}}, dict(d, reproducer={}), None)
    assert text.index("**Changed since base123") < text.index("**Why:** divides by the rows.")
    card = _page_parts({"findings": [], "defects": [dict(d, reproducer={})]})["defects"][0]
    assert card["remedy_changed"].startswith("changed since base123: `eng/core.py:agg_loss`")

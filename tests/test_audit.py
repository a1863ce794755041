"""The static audit of fault shapes: every rule fires on its planted shape
(``tests/audit_fixtures/planted.py``) and not on the fixed form; the clean reference engine stays quiet; hits
are linked to a report's findings (confirmed / contradicted / unverified); the command never fails a run."""

from __future__ import annotations

import glob
import json
import os

import pytest

from rlconform.harness.catalog.audit import RULES, audit, audit_source
from rlconform.harness.catalog.discovery import discover
from rlconform.harness.report.audit_md import link, render_markdown, summary_counts

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PLANTED = os.path.join(HERE, "audit_fixtures", "planted.py")


@pytest.fixture(scope="module")
def planted():
    with open(PLANTED, encoding="utf-8") as fh:
        return audit_source(fh.read(), "planted", "planted.py")


def _rule_of(qualname: str) -> str:
    name = qualname.split(".")[0].lower()
    for rule in RULES:
        if rule.replace("-", "_") in name:
            return rule
    return {"badsavedforbackward": "in-place-write", "bad_in_place_slice": "in-place-write",
            "bad_in_place_augassign": "in-place-write", "bad_exp_unclamped_named": "exp-unclamped-log-ratio",
            "bad_no_upcast_entropy": "no-upcast-cancellation", "bad_no_upcast_variance": "no-upcast-cancellation",
            "bad_mean_of_means_ranks": "mean-of-means"}.get(name, "?")


def test_every_rule_fires_on_its_planted_shape_and_only_there(planted):
    import ast

    with open(PLANTED, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    bad = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name.lower().startswith("bad")}
    got = {(h.qualname.split(".")[0], h.rule) for h in planted}
    assert {q for q, _ in got} == bad  # no good_* function and no helper is a hit
    for q, rule in got:
        assert rule == _rule_of(q), (q, rule)
    assert {r for _, r in got} == set(RULES)  # every rule proven by a planted shape
    one = next(h for h in planted if h.qualname == "bad_in_place_write")
    assert one.line == 22 and one.code == "logits.sub_(m)" and one.file == "planted.py"


def test_the_reference_engine_is_quiet():
    """The reference engine as discovery reads it (its public numerics functions) has no hit. Audited whole
    (private helpers too), its only hits are legitimate: output buffers its helpers are documented to fill
    (``out=`` / in place into ``hi``, ``lo``, ``w``, ``o``) and ``exp`` of logits shifted by their argmax."""
    found, errors = discover("reference", os.path.join(ROOT, "reference"))
    assert errors == [] and found
    assert audit(found) == []
    legit = {("in-place-write", "_sum_nonneg"), ("in-place-write", "_grads_into"), ("in-place-write", "_tlp_grad"),
             ("in-place-write", "_entropy_grad"), ("in-place-write", "_s2_grad"),
             ("exp-unclamped-log-ratio", "_mean_logp"), ("exp-unclamped-log-ratio", "_Chunk.__init__")}
    hits = set()
    for path in sorted(glob.glob(os.path.join(ROOT, "reference", "*.py"))) + [
            os.path.join(ROOT, "harness", "bindings", "reference.py")]:
        with open(path, encoding="utf-8") as fh:
            hits |= {(h.rule, h.qualname) for h in audit_source(fh.read())}
    assert hits <= legit, hits - legit


def _record():
    hit = {"rule": "mask-multiply-reduce", "file": "eng/m.py", "line": 3, "code": "(x * mask).sum()", "detail": ""}
    return {"engine": "eng", "version": "1", "errors": [], "hits": [
        {**hit, "name": "eng.m.masked_sum", "module": "eng.m", "qualname": "masked_sum"},
        {**hit, "name": "eng.m.entropy", "module": "eng.m", "qualname": "entropy", "line": 9},
        {**hit, "name": "eng.m.chunked", "module": "eng.m", "qualname": "chunked", "line": 12},
        {**hit, "name": "eng.m.unbound", "module": "eng.m", "qualname": "unbound", "line": 20}],
        "coverage": {"items": [
            {"name": "eng.m.masked_sum", "status": "bound", "bound_to": ["masked_sum"]},
            {"name": "eng.m.entropy", "status": "bound", "bound_to": ["entropy"]},
            {"name": "eng.m.chunked", "status": "bound", "bound_to": ["entropy@chunked"]},
            {"name": "eng.m.unbound", "status": "justified", "bound_to": []}]}}


def test_hits_are_linked_to_the_findings_of_their_function():
    site = {"module": "eng.m", "function": "chunked"}
    doc = {"findings": [
        {"id": "masked_sum.a", "op": "masked_sum", "regime": "moderate", "status": "pass"},
        {"id": "entropy.a", "op": "entropy", "regime": "moderate", "status": "pass"},
        {"id": "entropy.b", "op": "entropy", "regime": "chunked@moderate", "status": "discrepancy",
         "engine_function": site},
        {"id": "entropy.c", "op": "entropy", "regime": "peaked", "status": "discrepancy",
         "engine_function": {"module": "eng.m", "function": "other"}}]}
    linked = {h["qualname"]: h for h in link(_record(), doc)["hits"]}
    assert linked["masked_sum"]["verdict"] == "contradicted" and linked["masked_sum"]["findings"] == ["masked_sum.a"]
    # entropy's own findings pass; entropy.c fails in another engine function, chunked@ is the other label's
    assert linked["entropy"]["verdict"] == "contradicted" and linked["entropy"]["findings"] == ["entropy.a"]
    assert linked["chunked"]["verdict"] == "confirmed" and linked["chunked"]["failing"] == ["entropy.b"]
    assert linked["unbound"]["verdict"] == "unverified"
    no_report = link(_record(), None)
    assert {h["verdict"] for h in no_report["hits"]} == {"unverified"}
    c = summary_counts(link(_record(), doc))
    assert (c["confirmed"], c["contradicted"], c["unverified"], c["unchecked"]) == (1, 2, 1, 1)
    md = render_markdown(link(_record(), doc), command="rlconform audit --engine eng", rules=RULES)
    assert "`eng/m.py:12`" in md and "1 of 1 fail, e.g. `entropy.b`" in md


@pytest.mark.cli
def test_cli_audit_exits_0_with_hits_and_2_on_bad_input(tmp_path, capsys, monkeypatch):
    """A binding file whose coverage names a planted package: its hits are listed, exit 0; an unreadable
    report or an engine without coverage is one line and exit 2."""
    from rlconform.harness.cli import main

    pkg = tmp_path / "planted_eng"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    with open(PLANTED, encoding="utf-8") as fh:
        (pkg / "losses.py").write_text(fh.read())
    (tmp_path / "bind.py").write_text(
        "from rlconform.harness.catalog.binding import Binding, Coverage, Lazy\n"
        "binding = Binding(name='planted', ops={'masked_mean': Lazy('planted_eng.losses:masked_mean')},\n"
        "                  coverage=Coverage(modules=('planted_eng.losses',)))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["audit", "--engine", str(tmp_path / "bind.py"), "--engine-path", str(tmp_path), "--format", "json"]
    assert main(args) == 0
    record = json.loads(capsys.readouterr().out)
    rules = {h["rule"] for h in record["hits"]}
    assert rules == set(RULES) and all(h["verdict"] == "unverified" for h in record["hits"])
    assert main([*args, "--report", str(tmp_path / "missing")]) == 2
    assert "cannot read report" in capsys.readouterr().err
    assert main(["audit", "--engine", "reference"]) == 2
    assert "declares no coverage" in capsys.readouterr().err


@pytest.mark.cli
@pytest.mark.parametrize("unreadable", ["recursion", "fifo"])
def test_cli_audit_reports_a_file_it_cannot_read_and_exits_2(unreadable, tmp_path, capsys, monkeypatch):
    """A file that makes Python's parser raise RecursionError, or a FIFO named ``*.py`` (opening it would
    block until ``--timeout``), is an error of the audit: listed, exit 2, never "0 hits"."""
    import os

    from rlconform.harness.cli import main

    pkg = tmp_path / "deep_eng"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    with open(PLANTED, encoding="utf-8") as fh:
        (pkg / "losses.py").write_text(fh.read())
    if unreadable == "recursion":
        (pkg / "deep.py").write_text("x = " + "-" * 200_000 + "1\n")
    else:
        os.mkfifo(pkg / "deep.py")
    (tmp_path / "bind.py").write_text(
        "from rlconform.harness.catalog.binding import Binding, Coverage, Lazy\n"
        "binding = Binding(name='deep', ops={'masked_mean': Lazy('deep_eng.losses:masked_mean')},\n"
        "                  coverage=Coverage(modules=('deep_eng',)))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["audit", "--engine", str(tmp_path / "bind.py"), "--engine-path", str(tmp_path), "--format", "json",
            "--timeout", "600"]
    assert main(args) == 2
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert any("deep.py" in e for e in record["errors"]), record["errors"]
    assert record["hits"]  # the readable file is still audited
    assert "could not read" in captured.err

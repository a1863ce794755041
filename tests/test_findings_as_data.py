"""Findings as data: a failure is a list of clause records (:mod:`rlconform.harness.core.failure`), its message is
rendered from them, severity reads the fields, and an older report (a message, no record) reads the same."""

from __future__ import annotations

import ast
import json
import math
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlconform.harness.cli import main
from rlconform.harness.core import failure
from rlconform.harness.report import failure_fields, legacy_failure
from rlconform.harness.report.severity import classify, effect
from rlconform.harness.report.triage import kind, numbers

ROOT = pathlib.Path(__file__).resolve().parents[1]

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
number = st.one_of(finite, st.sampled_from([math.nan, math.inf, -math.inf]))
positive = st.floats(min_value=1e-300, max_value=1e300)
label = st.sampled_from(["value", "gradient", "loss", "metric pg_clipfrac", "gradient w.r.t. log_prob"])


@st.composite
def clauses(draw):
    kind_ = draw(st.sampled_from(["value", "difference", "nonfinite"]))
    if kind_ == "value":
        return failure.value(draw(label), "value", engine=draw(number), exact=draw(finite), index=draw(st.integers(0, 99)),
                             abs_err=draw(positive), rel_err=draw(positive), ulp_err=draw(positive),
                             tolerance=draw(positive), ratio=draw(positive))
    if kind_ == "difference":  # two runs of one output: the same label, the layout before it
        name = draw(label)
        return failure.Clause("difference", "micro-batches (nnz) [1, 2]: " + name, "value", engine=draw(number),
                              other=draw(number), other_label=name, exact=draw(finite),
                              index=draw(st.integers(0, 99)), tolerance=draw(positive), ratio=draw(positive))
    return failure.Clause("nonfinite", draw(label), "value", engine=draw(st.sampled_from([math.nan, math.inf, -math.inf])),
                          exact=draw(finite), index=draw(st.integers(0, 99)))


def _same(x, y) -> bool:
    return (x is None and y is None) or (x is not None and y is not None and (x == y or math.isnan(x) and math.isnan(y)))


@settings(max_examples=300, deadline=None)
@given(st.lists(clauses(), min_size=1, max_size=3))
def test_an_older_reports_message_reads_back_as_the_clauses_it_was_rendered_from(cs):
    """What severity and triage read of a report written before findings carried records (its message)
    is what they read of the record itself."""
    back = legacy_failure.clauses_from_message(failure.render(cs))
    assert [c.kind for c in back] == [c.kind for c in cs]
    for mine, read in zip(cs, back):
        for field in ("engine", "exact", "other"):
            assert _same(getattr(mine, field), getattr(read, field)), (field, mine, read)
        if mine.kind != "nonfinite":  # a tolerance is printed with 3 digits
            assert float(f"{mine.tolerance:.3g}") == read.tolerance
        assert read.quantity == ("metric" if "metric" in mine.label else
                                 "gradient" if "gradient" in mine.label else "value")


@given(st.lists(clauses(), min_size=1, max_size=3))
@settings(max_examples=100, deadline=None)
def test_a_clause_survives_json(cs):
    doc = json.loads(json.dumps(failure.clauses_to_json(cs)))  # plain JSON: no NaN / inf literals
    back = failure.clauses_from_json(doc)
    assert failure.render(back) == failure.render(cs)


@pytest.mark.parametrize("bad", [{"kind": "vibes"}, {"kind": "value", "engine": "1.0"}, {"kind": "value", "colour": 1},
                                 "value", {"kind": "value", "engine": True}])
def test_a_malformed_clause_is_refused(bad):
    with pytest.raises(ValueError):
        failure.clauses_from_json([bad])


#: a micro-batch sum where a mean is due: the loss of 2 micro-batches is 2× the exact one
_SCALED = failure.Clause("difference", "micro-batches (nnz) [1, 1]: loss", "value", engine=-1.6660629212856293,
                         other=-0.8330314755439758, other_label="loss", exact=-0.8330314601438209, index=0,
                         tolerance=2.45e-05, ratio=3.4e4, layout={"parts": "micro-batches", "nnz": [1, 1]})


def _finding(clauses_, prop="partition_invariant", status="discrepancy", **extra):
    return {"id": f"policy_loss.{prop}.float32.geo_mean@moderate", "op": "policy_loss", "property": prop,
            "dtype": "float32", "regime": "geo_mean@moderate", "status": status, "max_ratio": 3.4e4,
            "max_rel_err": 1.0, "message": failure.render(clauses_), **extra,
            "failure": {"clauses": failure.clauses_to_json(clauses_)}}


def test_severity_reads_the_record_not_the_message():
    f = _finding([_SCALED])
    assert effect(f) == math.inf  # k× the exact value with k micro-batches: grows with the configuration
    assert kind(f) == "partition dependence" and classify(f)[0] == "training"
    reworded = dict(f, message="the loss doubled with two micro-batches")  # another wording: same verdict
    assert (kind(reworded), classify(reworded), effect(reworded)) == (kind(f), classify(f), effect(f))
    older = {k: v for k, v in f.items() if k != "failure"}  # an older report: read from its message
    assert (kind(older), classify(older), effect(older)) == (kind(f), classify(f), effect(f))
    assert numbers(f)["engine"] == numbers(older)["engine"] == _SCALED.engine
    # the layout is a field: without it (another run, one part) the same numbers are no k× scaling
    single = failure.Clause(**{**_SCALED.__dict__, "layout": {"parts": "micro-batches", "nnz": [2]}})
    assert effect(_finding([single])) < math.inf


def test_a_metric_quantity_is_logging_and_a_crash_type_is_a_field():
    metric = failure.value("metric pg_clipfrac", "metric", engine=0.75, exact=0.5, index=0, abs_err=0.25, rel_err=0.5,
                           ulp_err=1e6, tolerance=1e-6, ratio=2.5e5, dtype="float32")
    f = _finding([metric], prop="matches_reference")
    assert classify(f)[0] == "logging"
    as_value = failure.Clause(**{**metric.__dict__, "quantity": "value"})
    assert classify(_finding([as_value], prop="matches_reference"))[0] == "training"
    crash = _finding([], prop="matches_reference", status="crash",
                     message="engine raised in the op: something went wrong")
    crash["failure"]["crash"] = {"type": "ZeroDivisionError", "where": "the op"}
    assert kind(crash) == "crash:ZeroDivisionError" and failure_fields.crash_type(crash) == "ZeroDivisionError"


def test_a_contract_clause_is_a_crash_on_a_legal_input():
    c = failure.Clause("contract", rank=2, error_type="IndexError",
                       text="contract: a rank-2 input (3, 5) (its docstring allows ranks 2, 3) raised IndexError: oops")
    f = _finding([c], prop="matches_reference")
    assert kind(f) == "crash:IndexError"
    assert classify(f) == ("robustness", "the engine raised IndexError on a rank-2 input its docstring allows")


@pytest.mark.cli
def test_a_checked_finding_carries_its_record_and_its_message_is_the_rendering(tmp_path):
    out = tmp_path / "rep"
    code = main(["check", "--engine", "mutants.naive_entropy", "--op", "entropy", "--property",
                 "finite_where_reference_finite", "--dtype", "float32", "--max-examples", "5", "--out", str(out),
                 "-q", "-n", "0"])
    assert code == 1
    failing = [f for f in json.loads((out / "report.json").read_text())["findings"] if f["status"] == "discrepancy"]
    assert failing
    for f in failing:
        cs = failure.clauses_from_json(f["failure"]["clauses"])
        assert cs and {c.kind for c in cs} == {"nonfinite"} and {c.quantity for c in cs} <= {"value", "gradient"}
        assert f["message"] == failure.render(cs)


#: modules that still read a finding's ``message`` wording, each with what it reads there (the renderers, the
#: reader of older reports, and the readers not yet moved to the record's fields)
MESSAGE_READERS = {
    # the reader of older reports
    "harness/report/failure_fields.py": "hands an older finding's message to legacy_failure; quotes a finding's first "
                                        "line for display",
    # renderers: they print or quote the message, they decide nothing from it
    "harness/report/writer.py": "quotes the message in report.md",
    "harness/report/summary.py": "prints the message's first line",
    "harness/report/html_report.py": "renders the message",
    "harness/report/matrix_md.py": "quotes an unbound op's message; reads an older report's unbound op from it",
    "harness/report/ledger_text.py": "quotes the message's first line in a ledger line's comment",
    "harness/report/diff.py": "quotes the message of a changed finding",
    "harness/cli.py": "prints a replay's message",
    "harness/run/status.py": "appends the ledger's word to the message",
    "harness/run/fuzz.py": "carries a counterexample's message to the line it prints",
}


def _reads_message(path: pathlib.Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and \
                isinstance(node.slice, ast.Constant) and node.slice.value == "message":
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get" and node.args and \
                isinstance(node.args[0], ast.Constant) and node.args[0].value == "message":
            lines.append(node.lineno)
    return lines


def test_only_listed_modules_read_a_findings_message():
    readers = {}
    for folder in ("harness", "properties", "distributed_tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            found = _reads_message(path)
            if found:
                readers[rel] = found
    unlisted = {k: v for k, v in readers.items() if k not in MESSAGE_READERS}
    assert not unlisted, f"these modules read a finding's message wording: read failure_fields instead: {unlisted}"
    stale = sorted(set(MESSAGE_READERS) - set(readers))
    assert not stale, f"these modules no longer read a message: remove them from MESSAGE_READERS: {stale}"
    assert "harness/report/severity.py" not in readers  # severity reads fields only


def test_a_rows_numbers_show_the_largest_effect_and_say_what_it_is():
    """SkyRL's kl_cov row showed a loss 0.06 % off for a member whose gradient is 132 % off."""
    from rlconform.harness.report.triage_md import numbers_cell

    loss = failure.value("loss", "value", engine=1.0442662239074707, exact=1.0436470393317332, index=0,
                         abs_err=6.2e-4, rel_err=5.9e-4, ulp_err=5.2e3, tolerance=1.18e-5, ratio=52.0)
    grad = failure.value("gradient w.r.t. log_prob", "gradient", engine=1.3166166543960571, exact=0.5666166443229762,
                         index=0, abs_err=0.75, rel_err=1.32, ulp_err=1.26e7, tolerance=1.09e-5, ratio=6.9e4)
    clipfrac = failure.value("metric pg_clipfrac", "metric", engine=0.0, exact=0.0714, index=0, abs_err=0.0714,
                             rel_err=1.0, ulp_err=9.6e6, tolerance=1e-5, ratio=7e3)
    f = _finding([loss, grad], prop="matches_reference")
    n = numbers(f)
    assert (n["engine"], n["quantity"]) == (grad.engine, "gradient")
    assert numbers_cell({"numbers": n, "signature": {"kind": "wrong value"}}).startswith("gradient")
    # a logged metric 100 % off does not headline a training row whose loss is 4.7 % off
    loss2 = failure.Clause(**{**loss.__dict__, "engine": 1.0927, "rel_err": 0.047})
    assert numbers(_finding([clipfrac, loss2], prop="matches_reference"))["quantity"] == "value"
    # a metric-only finding shows its metric and says so
    only = numbers(_finding([clipfrac], prop="matches_reference"))
    assert only["quantity"] == "metric"
    assert numbers_cell({"numbers": dict(only, component="pg_clipfrac"),
                         "signature": {"kind": "wrong value"}}).startswith("metric (pg_clipfrac)")


def test_a_contract_clause_names_the_engines_exception_not_the_pools():
    """On gloo ranks an engine's exception reaches the family wrapped in the pool's RankFailure: the clause
    (and so the defect's kind, ``crash:IndexError``) names the engine's own type."""
    from rlconform.harness.core.evaluation import EngineCrash
    from rlconform.harness.core.impl_contract import rank_problem
    from rlconform.harness.workers.pool import RankFailure

    inner = RankFailure("raised", {0: "IndexError: too many indices"}, [0], 0.1)
    crash = EngineCrash("vocab_parallel_entropy@chunked", inner)
    crash.engine_traceback = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
                              "IndexError: too many indices for tensor of dimension 2\n")
    crash.__cause__ = inner
    impl = type("Impl", (), {"ranks": (2, 3)})()
    c = rank_problem(2, (1, 2), impl, crash)
    assert (c.kind, c.rank, c.error_type) == ("contract", 2, "IndexError")


@pytest.mark.engines
def test_a_training_row_names_the_configuration_key_its_impact_depends_on():
    """verl's bf16 entropy rows are training only with entropy_coeff ≠ 0 (default 0: the logged actor/entropy)."""
    from rlconform.harness.bindings.verl import IMPACT_KNOBS
    from rlconform.harness.report.triage import impact_knob
    from rlconform.harness.report.triage_md import severity_cell

    row = {"severity": "training", "ops": ["entropy"], "op": "entropy"}
    knob = impact_knob(row, IMPACT_KNOBS)
    assert knob["knob"] == "actor_rollout_ref.actor.entropy_coeff" and knob["default"] == "0"
    assert severity_cell(dict(row, depends_on=knob)) == (
        "**training** if `actor_rollout_ref.actor.entropy_coeff` ≠ 0 (default 0: logging, the logged actor/entropy)")
    # a row that also holds an op with no such key, or another severity, depends on nothing
    assert impact_knob(dict(row, ops=["entropy", "agg_loss"]), IMPACT_KNOBS) is None
    assert impact_knob(dict(row, severity="robustness"), IMPACT_KNOBS) is None
    assert severity_cell(row) == "**training**"


def test_rows_of_one_known_idiom_get_one_summary_line():
    from rlconform.harness.report.triage_md import idiom_lines

    def row(fn, kind, trig):
        return {"signature": {"kind": kind, "feature": trig}, "trigger": trig, "engine_function": {"function": fn}}

    masked = [row(f"f{i}", "NaN / inf", "a masked position holding NaN") for i in range(3)]
    [line] = idiom_lines(masked + [row("g", "wrong value", "any input")] * 4)  # "any input" is no idiom
    assert line.startswith("- **3 rows are NaN / inf · a masked position holding NaN** (`f0`, `f1`, `f2`)")
    assert "torch.where" in line
    assert idiom_lines(masked[:2]) == []  # two rows: no summary


def test_an_idiom_of_a_kind_groups_rows_whatever_their_trigger():
    from rlconform.harness.report.triage_md import idiom_lines

    rows = [{"signature": {"kind": "partition dependence", "feature": t}, "trigger": t,
             "engine_function": {"function": f}}
            for f, t in (("reduce_metrics", "more than one micro-batch"), ("aggregate_dp", "a DP rank with no valid token"),
                         ("compute_policy_loss_geo_mean", "more than one micro-batch"))]
    [line] = idiom_lines(rows)
    assert line.startswith("- **3 rows are partition dependence** (") and "sums and counts" in line


def test_what_is_absent_is_a_field():
    """A missing gradient, a missing output and a lost metric are named by the problem clause, whatever its
    sentence says; an older report's sentence is read for it."""
    gone = failure.problem("missing gradient", "the loss came back detached")  # no wording the old code matched
    f = _finding([gone], prop="matches_reference")
    assert kind(f) == "missing gradient" and classify(f) == ("training", "a gradient the contract requires is missing")
    shape = failure.problem("missing output", "value: 3 numbers where 1 is due")
    assert kind(_finding([shape], prop="matches_reference")) == "missing output"
    older = {k: v for k, v in _finding([], prop="matches_reference").items() if k != "failure"}
    older["message"] = "gradient: backward ran but no gradient reached log_prob"
    assert failure_fields.problems(older) == {"missing gradient"} and kind(older) == "missing gradient"
    with pytest.raises(ValueError):
        failure.problem("vibes", "x")


@pytest.mark.cli
def test_a_family_names_the_missing_gradient_in_its_record(tmp_path):
    out = tmp_path / "rep"
    assert main(["check", "--engine", "mutants.detached_entropy", "--op", "entropy", "--property", "matches_reference",
                 "--dtype", "float32", "--regime", "moderate", "--max-examples", "3", "--out", str(out), "-q",
                 "-n", "0"]) == 1
    [f] = [f for f in json.loads((out / "report.json").read_text())["findings"] if f["status"] == "discrepancy"]
    assert [(c["kind"], c.get("what")) for c in f["failure"]["clauses"]] == [("problem", "missing gradient")]
    assert f["severity"] == "training"


def test_a_structural_error_of_the_policy_step_is_a_wrong_value_not_rounding():
    """The step's float32 computation of a tiny model rounds to ~1e-6 relative: a gradient 1e-3 off (an entropy
    bonus that counts the padding) is a wrong value of the step, while the same error of another op stays within
    the catalog's 1 % rounding threshold."""
    grad = failure.value("gradient of head.weight, token-mean, T 1.0", "gradient", engine=1.001e-2, exact=1.0e-2,
                         index=0, abs_err=1e-5, rel_err=1e-3, ulp_err=1.7e4, tolerance=1e-8, ratio=1e3)
    step = dict(_finding([grad], prop="matches_reference"), op="policy_step",
                id="policy_step.matches_reference.float32.token-mean@trainer_batches", regime="token-mean@trainer_batches",
                worst_input="", max_ratio=1e3, max_rel_err=1e-3)
    assert kind(step) == "wrong value" and classify(step)[0] != "precision"
    other = dict(step, op="policy_loss", id="policy_loss.matches_reference.float32.vanilla@moderate",
                 regime="vanilla@moderate")
    assert kind(other) == "inexact value" and classify(other)[0] == "precision"


@pytest.mark.parametrize("label, other, layout, masked", [
    ("dp2: DP rank 0, tokens per DP rank [1, 0]", None, {"parts": "DP ranks", "nnz": [1, 0]}, None),
    ("unsharded (DP = 1)", "cp2: tokens per CP rank [0, 3]", {"parts": "CP ranks", "nnz": [0, 3]}, None),
    ("micro-batches (nnz) [2, 1]: value", None, {"parts": "micro-batches", "nnz": [2, 1]}, None),
    ("x (sum), shards (rows) [[[0, 2]], [[2, 3]]]", None, {"parts": "shards", "rows": [[[0, 2]], [[2, 3]]]}, None),
    ("masked = nan: loss", None, None, math.nan),
    ("policy/token_sum_loss (sum), masked = -inf", "policy/token_sum_loss (sum), shards (nnz) [[[0]]]",
     {"parts": "shards", "nnz": [[[0]]]}, -math.inf),
    ("loss", "loss", None, None),
])
def test_a_clause_reads_its_runs_layout_and_masked_value_from_its_label_once(label, other, layout, masked):
    """The families name a run in its label; the clause holds that as fields, so no reader parses a label."""
    c = failure.Clause("difference", label, "value", engine=1.0, other=2.0, other_label=other, exact=1.0, index=0,
                       tolerance=0.1, ratio=10.0)
    assert c.layout == layout
    assert _same(c.masked, masked)
    back = failure.clauses_from_json(json.loads(json.dumps(failure.clauses_to_json([c]))))[0]
    assert back.layout == layout and _same(back.masked, masked)
    given = failure.Clause("value", label, "value", engine=1.0, exact=2.0, layout={"parts": "shards", "nnz": [4]})
    assert given.layout == {"parts": "shards", "nnz": [4]}  # a family's own layout is kept


def test_triage_reads_a_crash_from_its_record_not_its_message():
    """A crash's exception text, whether it is autograd's version check, and the trigger its engine text shows
    come from the crash record (``failure.crash``); the message may say anything."""
    from rlconform.harness.report.triage import trigger

    crash = {"status": "crash", "op": "metric_statistics", "property": "matches_reference", "dtype": "float32",
             "regime": "numpy_values", "message": "modified by an inplace operation <class 'numpy.float32'>",
             "failure": {"clauses": [], "crash": {"type": "ValueError", "where": "Metric.append",
                                                  "text": "Unsupported value type: <class 'numpy.int64'>"}}}
    assert failure_fields.raised(crash, "ValueError") == "Unsupported value type: <class 'numpy.int64'>"
    assert not failure_fields.version_check_crash(crash)
    assert trigger(crash) == "numpy scalar values"
    plain = dict(crash, failure={"clauses": [], "crash": {"type": "ZeroDivisionError", "where": "",
                                                          "text": "float division by zero"}})
    assert failure_fields.raised(plain, "ZeroDivisionError") == "float division by zero"
    assert trigger(dict(plain, trigger="every weight 0")) == "every weight 0"
    inplace = dict(crash, message="", failure={"clauses": [], "crash": {
        "type": "RuntimeError", "where": "", "text": "one of the variables needed for gradient computation has been "
                                                    "modified by an inplace operation: [torch.FloatTensor [2]]"}})
    assert failure_fields.version_check_crash(inplace)
    # an older report's crash (no record): its message is what it has
    old = {"status": "crash", "message": "engine raised in f: ZeroDivisionError: float division by zero"}
    assert failure_fields.raised(old, "ZeroDivisionError") == "float division by zero"


def _sentence_args(path: pathlib.Path) -> list[int]:
    """Lines where a string (a literal or an f-string) is handed over as a failure: ``….problems.append(s)``,
    ``….mutations.append(s)``, ``….fail(s)``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        f = node.func
        target = f.attr == "fail" or f.attr == "append" and isinstance(f.value, ast.Attribute) and \
            f.value.attr in ("problems", "mutations")
        if target and isinstance(node.args[0], (ast.JoinedStr, ast.Constant)):
            lines.append(node.lineno)
    return lines


def test_every_failure_is_handed_over_as_a_record():
    """A family, a property or a rank names what failed as a clause (a ``problem`` with its ``what``, a
    ``mutation`` with its fields), never as a bare sentence: severity and triage read ``what`` and never match a
    sentence's words."""
    found = {}
    for folder in ("harness", "properties", "distributed_tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            lines = _sentence_args(path)
            if lines:
                found[path.relative_to(ROOT).as_posix()] = lines
    assert not found, f"hand these failures over as failure.problem(what, sentence) clauses: {found}"


def test_a_current_record_is_read_as_it_is_and_an_older_one_from_its_sentences():
    """A problem sentence that says "no gradient" is not a missing gradient unless its record says so; a record
    written before ``what`` existed (no ``version``) is read from its sentence, as before."""
    text = "gradient: the weight is declared detached (no gradient path) but backward gives 3 non-zero gradient(s)"
    base = {"status": "discrepancy", "op": "importance_ratio", "property": "matches_reference", "message": text}
    current = dict(base, failure={"clauses": [failure.problem("unexpected gradient", text).to_json()],
                                  "version": failure.RECORD_VERSION})
    assert failure_fields.problems(current) == {"unexpected gradient"}
    assert kind(current) == "wrong value" and classify(current)[0] == "training"
    older = dict(base, failure={"clauses": [{"kind": "problem", "text": text}]})
    assert failure_fields.problems(older) == {"missing gradient"}
    unnamed = dict(base, failure={"clauses": [{"kind": "problem", "text": text}], "version": failure.RECORD_VERSION})
    assert failure_fields.problems(unnamed) == set()

"""The cited line is the faulty line (spectrum-based fault localization over
traced examples, else a binding-declared anchor resolved in the installed source), and the numbers cell
labels what it compares and shows the component the message reports."""

from __future__ import annotations

import json
import os
import textwrap
import types

import pytest

from rlconform.harness.core import fault_lines
from rlconform.harness.report.triage import cited_text, numbers
from rlconform.harness.report.triage_md import numbers_cell

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERL = os.path.join(ROOT, "reports", "verl-0.9.1")

SYNTH = textwrap.dedent('''\
    def engine(xs, flag):
        total = 0
        for x in xs:
            total += x
        if flag:
            total = total * 2  # the faulty line: only the flagged examples run it
        else:
            total = total + 0
        return total
    ''')


@pytest.fixture
def synthetic(tmp_path):
    """A tiny engine with a known faulty line, in a real file (an anchor is resolved in the source)."""
    path = tmp_path / "engine.py"
    path.write_text(SYNTH)
    mod = types.ModuleType("synthetic_engine")
    exec(compile(SYNTH, str(path), "exec"), mod.__dict__)
    return mod.engine


def test_spectrum_cites_the_discriminating_line_of_a_synthetic_engine(synthetic):
    fn = synthetic
    name = fn.__code__.co_filename
    first = fn.__code__.co_firstlineno
    run = lambda xs, flag: fault_lines.trace_lines([fn], lambda: fn(xs, flag))[0]  # noqa: E731
    failing = [run([1, 2], True)]
    passing = [run([1], False), run([3, 4, 5], False)]
    scores = fault_lines.ochiai(failing, passing)
    faulty = (name, first + 5)
    assert scores[faulty] == 1.0 and scores[(name, first + 1)] < 1.0
    found = fault_lines.spectrum_line(failing, passing)
    assert found is not None and found[0] == faulty
    # the same lines everywhere: no discriminating line, and without an anchor the function is cited
    assert fault_lines.spectrum_line(failing, [run([1], True)]) is None
    out = fault_lines.localize(fn, failing, [run([1], True)])
    assert out["evidence"] == "function" and out["line"] is None


def test_a_passing_example_that_stopped_early_is_no_evidence(synthetic):
    fn = synthetic
    failing = [fault_lines.trace_lines([fn], lambda: fn([1], True))[0]]
    stopped = [fault_lines.trace_lines([fn], lambda: fn(None, False))[0]]  # raised in the loop: never got below
    assert fault_lines.spectrum_line(failing, stopped) is None


def test_anchor_resolves_in_the_installed_source_not_a_line_number(synthetic):
    fn = synthetic
    out = fault_lines.localize(fn, [], [], anchors=(r"total = total \* 2",))
    assert out["evidence"] == "anchor" and out["line"] == fn.__code__.co_firstlineno + 5
    assert fault_lines.localize(fn, [], [], anchors=(r"no such line",))["evidence"] == "function"


def test_cited_text_names_the_faulty_line_and_the_function():
    site = {"function": "f", "file": "pkg/m.py", "line": 10}
    assert cited_text(site) == "f (pkg/m.py:10)"
    assert cited_text(dict(site, fault={"line": 14, "lines": [14, 20]})) == "pkg/m.py:14, :20 in f (pkg/m.py:10)"
    assert cited_text(dict(site, fault={"line": None})).endswith("no single line; the function")


VERL_CASES = [  # (defect id, faulty lines of verl 0.9.1 the report must cite)
    ("verl.trainer.ppo.core_algos.compute_policy_loss_geo_mean.partition-dependence", [2000]),
    ("verl.trainer.ppo.rollout_corr_helper.compute_rollout_rejection_mask.wrong-value", [263, 316]),
    ("verl.trainer.ppo.core_algos.compute_rloo_vectorized_outcome_advantage.wrong-value", [864]),
]


@pytest.mark.engines
@pytest.mark.parametrize("defect,lines", VERL_CASES)
def test_committed_verl_case_cites_its_faulty_line(defect, lines):
    verl = pytest.importorskip("verl")
    if getattr(verl, "__version__", "") != "0.9.1":
        pytest.skip("the line numbers are verl 0.9.1's")
    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.report.triage import kind
    from rlconform.harness.run.root_cause import locate
    from rlconform.properties.case import load_case

    doc = json.load(open(os.path.join(VERL, "report.json")))
    row = next(d for d in doc["defects"] if d["id"] == defect)
    f = next(x for x in doc["findings"] if x["id"] == row["reproducer"]["finding"])
    case = load_case(os.path.join(VERL, row["reproducer"]["case_file"]))
    found = locate(load_engine("verl", None), case, f["engine_function"], kind(f))
    assert found is not None and (found.get("lines") or [found["line"]]) == lines, found
    assert cited_text(dict(f["engine_function"], fault=found)).startswith(f"{f['engine_function']['file']}:{lines[0]}")


def test_partition_numbers_label_both_layouts():
    # row 5 of the committed verl report: the TP = 1 value is not the exact one
    f = {"property": "partition_invariant", "message":
         "value, unsharded (TP = 1) = 0.5 vs value on TP rank 0 of tp2 = 0.0 at flat index 0 (reference "
         "0.1130894347342089, allowed difference 0.0427, 11.7×)\n"
         "gradient, unsharded (TP = 1) = 0.125 vs gradient w.r.t. the vocab shards of tp2 (concatenated) = 0.0 at "
         "flat index 3801 (reference 0.023063133997628896, allowed difference 0.0405, 3.08×)"}
    cell = numbers_cell({"numbers": numbers(f)})
    assert cell == "value: TP=1 0.5 vs TP=2 0 (exact 0.113089)", cell
    mb = {"property": "partition_invariant", "message":
          "micro-batches (nnz) [2, 2]: loss = -1.30482 vs loss = -0.652409 (reference -0.652409, allowed "
          "difference 0.001)"}
    assert numbers_cell({"numbers": numbers(mb)}).startswith("loss: 2 micro-batches -1.30482 vs unpartitioned")


def test_value_numbers_show_the_component_the_message_reports():
    # row 4 of the committed verl report: the message reports the value; the cell showed the gradient
    f = {"property": "matches_reference", "message":
         "value: engine 0.0 vs reference 0.6931471805599453 at flat index 0: abs err 0.693, rel err 1, 177 ulp, "
         "tolerance 0.0313\ngradient: engine -0.458984375 vs reference 0.0 at flat index 0: abs err 0.459, "
         "tolerance 0.02"}
    cell = numbers_cell({"numbers": numbers(f)})
    assert cell.startswith("value: engine 0 vs exact 0.693147"), cell


def test_every_committed_verl_cell_is_labelled():
    doc = json.load(open(os.path.join(VERL, "report.json")))
    for f in doc["findings"]:
        n = numbers(f)
        if n is None:
            continue
        cell = numbers_cell({"numbers": n})
        assert (" vs exact " in cell) if not n.get("sides") else ("(exact " in cell and "engine" not in cell), cell


def test_explain_names_the_faulty_line_and_its_evidence():
    from rlconform.harness.report.explain import explain_markdown

    site = {"function": "compute_policy_loss_geo_mean", "module": "verl.trainer.ppo.core_algos",
            "file": "verl/trainer/ppo/core_algos.py", "line": 1929,
            "fault": {"line": 2000, "lines": [2000], "evidence": "anchor", "text": "pg_loss = torch.mean(pg_losses)",
                      "runs": {"failing": 1, "passing": 2}}}
    d = {"id": "x", "severity": "training", "engine_function": site, "crash_frame": None, "op": "policy_loss",
         "ops": ["policy_loss"], "property": "partition_invariant", "properties": ["partition_invariant"],
         "signature": {"kind": "partition dependence", "feature": "more than one micro-batch"},
         "trigger": "more than one micro-batch", "members": ["a"], "dtypes": ["float32"], "numbers": None,
         "reproducer": {"finding": "a"}, "message": ""}
    text = explain_markdown({"engine": {"name": "verl", "version": "0.9.1"}}, d, None, None)
    where = next(line for line in text.splitlines() if line.startswith("**Where:**"))
    assert "core_algos.py:2000 in verl.trainer.ppo.core_algos.compute_policy_loss_geo_mean" in where, where
    assert "declares" in where and "pg_loss = torch.mean(pg_losses)" in where


@pytest.mark.engines
def test_an_anchor_in_the_function_an_entry_point_hands_its_work_to():
    """vocab_parallel_entropy's bf16 error comes from
    _VocabParallelEntropy.forward (Σ softmax · the unshifted logits, then logits_max added back), where the row
    cited the entry point's def. An anchor ``(qualname, pattern)`` resolves in that function of the module."""
    import inspect

    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.catalog import engine_site

    binding = load_engine("verl")  # verl is an engine of `make engines`, which `make test` installs
    binding.resolve("vocab_parallel_entropy")  # imports verl's Megatron module as a run does (triton stub)
    import sys

    tp = sys.modules["verl.utils.megatron.tensor_parallel"]

    site = engine_site.site(tp.vocab_parallel_entropy)
    out = engine_site.fault(binding, site, kind="wrong value")
    lines, first = inspect.getsourcelines(tp._VocabParallelEntropy.forward)
    assert out["evidence"] == "anchor" and len(out["lines"]) == 2, out
    assert all(first <= n < first + len(lines) for n in out["lines"]) and out["lines"][0] < out["lines"][1]
    assert "mul_reduce(softmax_logits, vocab_parallel_logits)" in out["text"]
    # a NaN at a −inf logit: softmax 0 times the logit −inf in that same product, its first line only
    nan = engine_site.fault(binding, site, kind="NaN")
    assert nan["evidence"] == "anchor" and nan["lines"] == out["lines"][:1]
    # a masked NaN is another failure: not cited at these lines
    assert engine_site.fault(binding, site, kind="masked-value dependence")["evidence"] != "anchor"


# ------------------------------------------------------------ every binding's anchors resolve in the installed engine
def _function_lines(module: str, qualname: str) -> list[str] | None:
    """The source lines of ``module.qualname`` in the installed engine, read without importing it (SkyRL's
    modules need the binding's compatibility shims on Python 3.11, Megatron-core's a Triton stand-in)."""
    import ast

    from rlconform.harness.core.declared import read_source

    text = read_source(module.replace(".", "/") + ".py")
    if text is None:
        return None
    body = ast.parse(text).body
    node = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return text.splitlines()[node.lineno - 1:node.end_lineno]


def _split(key: str) -> tuple[str, str]:
    """``module``, ``qualname`` of a fault-anchor key (``verl.utils.metric.utils.Metric.aggregate_dp``)."""
    from rlconform.harness.core.declared import read_source

    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if read_source("/".join(parts[:i]) + ".py") is not None:
            return ".".join(parts[:i]), ".".join(parts[i:])
    raise AssertionError(f"no installed module for {key}")


@pytest.mark.parametrize("engine", ["verl", "skyrl", "megatron"])
def test_every_declared_fault_anchor_names_a_line_of_the_installed_engine(engine):
    """A binding's fault anchors are patterns, never line numbers: each must match exactly one function's line
    in the installed engine, or the report would fall back to "no single line" without saying so. An engine
    release that rewrites the line fails here, and the anchor is re-read against the new source."""
    import importlib.util
    import re

    if importlib.util.find_spec(engine) is None:
        pytest.skip(f"{engine} not installed")
    from rlconform.harness.bindings.load import load_engine

    anchors = load_engine(engine).fault_anchors
    assert anchors, f"{engine} declares no fault anchors"
    missing = []
    for key, rules in anchors.items():
        module, qualname = _split(key)
        for kinds, patterns in rules.items():
            for regex in (kinds if isinstance(kinds, tuple) else (kinds,)):  # (kinds, triggers) or kinds
                re.compile(regex)
            for p in patterns:
                where, pattern = (p[0], p[1]) if isinstance(p, tuple) else (qualname, p)
                lines = _function_lines(module, where)
                if lines is None or not any(re.search(pattern, line) for line in lines):
                    missing.append(f"{module}.{where} [{kinds}]: {pattern}")
    for op, rules in (load_engine(engine).output_sites or {}).items():  # an output site's own line
        for _, name, _, *line in rules:
            module, qualname = name.split(":")
            if line and not any(re.search(line[0], x) for x in _function_lines(module, qualname) or ()):
                missing.append(f"{name} [output site of {op}]: {line[0]}")
    assert not missing, "anchors that match no line of the installed engine:\n" + "\n".join(missing)


def test_a_site_in_a_module_this_process_never_imported_is_resolved_with_the_bindings_importer():
    """A distributed op's engine code runs on gloo ranks, so the process that locates its finding may not have
    imported the module; one that plain ``importlib`` cannot import (SkyRL on Python 3.11 needs a pydantic shim)
    is imported with the binding's own importer, else its row would cite no line."""
    from types import SimpleNamespace

    from rlconform.harness.catalog.engine_site import engine_importer, site_callable

    def reduce_metrics():
        return None

    module = types.ModuleType("rlconform_absent_engine.worker_utils")
    module.reduce_metrics = reduce_metrics
    site = {"module": "rlconform_absent_engine.worker_utils", "function": "reduce_metrics"}
    binding = SimpleNamespace(coverage=SimpleNamespace(importer=lambda name: module))
    assert site_callable(site) is None  # importlib cannot import it
    assert site_callable(site, engine_importer(binding)) is reduce_metrics
    assert engine_importer(SimpleNamespace(coverage=None)) is None


def test_a_declared_anchor_wins_over_a_spectrum_of_a_few_examples(synthetic):
    """verl's optimal token baseline: the failing example took the zero-tail branch, the passing one did not, so
    the spectrum cited that branch; the masked product the binding declares is the leak, and is cited."""
    fn = synthetic
    name, first = fn.__code__.co_filename, fn.__code__.co_firstlineno
    run = lambda xs, flag: fault_lines.trace_lines([fn], lambda: fn(xs, flag))[0]  # noqa: E731
    failing, passing = [run([1, 2], True)], [run([1], False)]
    assert fault_lines.localize(fn, failing, passing)["line"] == first + 5  # the spectrum's line, when nothing is declared
    anchored = fault_lines.localize(fn, failing, passing, anchors=(r"total = 0",))
    assert anchored["evidence"] == "anchor" and anchored["line"] != first + 5, (anchored, name)


def test_an_anchor_keyed_by_a_trigger_cites_its_line_only_under_that_trigger():
    """One function, two wrong values (SkyRL's ``_forward_backward_micro``: the normaliser counted before the
    off-policy row mask, and the entropy bonus weighted per micro-batch): the rule keyed (kinds, triggers) names
    the line of the first only."""
    from types import SimpleNamespace

    from rlconform.harness.catalog.engine_site import fault_anchors

    binding = SimpleNamespace(fault_anchors={"m.f": {("wrong value", "^a row with no valid token"): ("rejected",),
                                                     "NaN": ("nan",)}})
    site = {"module": "m", "function": "f"}
    assert fault_anchors(binding, site, "wrong value", "a row with no valid token") == ("rejected",)
    assert fault_anchors(binding, site, "wrong value", "more than one micro-batch") == ()
    assert fault_anchors(binding, site, "NaN", "a masked position holding NaN") == ("nan",)


def test_an_output_sites_own_line_is_the_only_anchor_of_its_site():
    """A function that computes several outputs (SkyRL's compute_off_policy_correction: a sequence mask, then its
    metrics) is cited at the line of the output that failed when its output_sites rule names one, not at the
    fault anchors of its other failures."""
    from rlconform.harness.catalog.engine_site import fault_anchors, output_site

    def compute(x):
        return x

    binding = types.SimpleNamespace(
        output_sites={"op": ((r"^metric a$", f"{__name__}:_two_outputs", "", r"a = x \* 0"),
                             (r"^metric b$", f"{__name__}:_two_outputs", ""))},
        fault_anchors={f"{__name__}._two_outputs": {"wrong value": (r"b = x \+ 1",)}})
    failing = "metric {}: engine 0.0 vs reference 1.0 at flat index 0: abs err 1, rel err 1, tolerance 1e-06"
    from rlconform.harness.report.legacy_failure import clauses_from_message

    a = output_site(binding, "op", clauses_from_message(failing.format("a")))
    b = output_site(binding, "op", clauses_from_message(failing.format("b")))
    assert a["function"] == b["function"] == "_two_outputs"
    assert fault_anchors(binding, a, "wrong value") == (r"a = x \* 0",)
    assert fault_anchors(binding, b, "wrong value") == (r"b = x \+ 1",)


def _two_outputs(x):
    a = x * 0
    b = x + 1
    return a, b

"""Declared conventions, preconditions and guards: checked as declared, listed in their own
report section, never defects; an undeclared difference stays a defect."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest

from rlconform.harness.bindings.load import load_engine
from rlconform.harness.catalog.binding import Binding, Declared
from rlconform.harness.core.evaluation import EngineCrash
from rlconform.harness.report.declared_md import html_section, markdown_section
from rlconform.properties.case import Case
from rlconform.properties.checks import run_check

verl_only = pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl not installed")


def test_declared_items_are_validated():
    with pytest.raises(ValueError, match="kind"):
        Declared("x", "habit", ("masked_var",), "w", "r", "f.py:1")
    with pytest.raises(ValueError, match="when, raises and match"):
        Declared("x", "guard", ("masked_var",), "w", "r", "f.py:1")
    with pytest.raises(ValueError, match="inputs"):
        Declared("x", "precondition", ("outcome_advantage",), "w", "r", "f.py:1")
    with pytest.raises(ValueError, match="names the caller"):  # a declared write a caller keeps names it
        Declared("x", "precondition", ("entropy",), "w", "r", "f.py:1", inputs=("logits",), writes=("logits",),
                 phase="backward", writer="F.backward", evidence=("clone",))
    with pytest.raises(ValueError, match="phase"):
        Declared("x", "convention", ("entropy",), "w", "r", "f.py:1", writes=("logits",), phase="sideways",
                 writer="f", evidence=("x",))
    with pytest.raises(ValueError, match="only a precondition names a caller"):
        Declared("x", "convention", ("entropy",), "w", "r", "f.py:1", caller="g.py:2")
    d = Declared("x", "convention", ("policy_loss",), "w", "r", "f.py:1", variants=("sapo",))
    assert d.concerns("policy_loss", "sapo") and not d.concerns("policy_loss", "vanilla")
    assert d.row()["source"] == "f.py:1"


def _raising_whiten(message="The sum of the mask is one, which can cause a division by zero."):
    def masked_whiten(values, mask, shift_mean=True):
        raise ValueError(message)
    return masked_whiten


def _whiten_case(mask):
    mask = np.asarray(mask, bool)
    return Case("masked_whiten", "matches_reference", "float32", "random",
                {"values": np.arange(mask.size, dtype=np.float64).reshape(mask.shape), "mask": mask,
                 "shift_mean": True, "garbage": 0.0})


GUARD = Declared("one_token", "guard", ("masked_whiten",), "raises on <= 1 valid token", "Bessel", "e.py:9",
                 when=lambda case: int(np.asarray(case.inputs["mask"]).sum()) <= 1, raises="ValueError",
                 match="sum of the mask is one")


def test_a_guard_passes_only_where_declared_and_only_with_the_declared_error():
    engine = Binding("e", ops={"masked_whiten": _raising_whiten()}, declared=(GUARD,))
    out = run_check(engine, _whiten_case([[True, False, False]]))
    assert out.ok and out.declared == "one_token" and "declared guard one_token" in out.message
    with pytest.raises(EngineCrash):  # the same error where the trigger does not hold: a crash, a defect
        run_check(engine, _whiten_case([[True, True, False]]))
    other = Binding("e", ops={"masked_whiten": _raising_whiten("index out of range")}, declared=(GUARD,))
    with pytest.raises(EngineCrash):  # another error on the declared trigger: still a crash
        run_check(other, _whiten_case([[True, False, False]]))
    undeclared = Binding("e", ops={"masked_whiten": _raising_whiten()})
    with pytest.raises(EngineCrash):
        run_check(undeclared, _whiten_case([[True, False, False]]))


@pytest.mark.engines
@verl_only
def test_verl_declares_its_guards_and_they_hold():
    verl = load_engine("verl")
    names = {d.name for d in verl.declared}
    assert {"masked_var_le_one_token", "masked_whiten_le_one_token", "batch_whiten_le_one_token",
            "passk_one_sample_group", "rewards_zero_outside_mask", "sapo_seq_mean_token_mean"} <= names
    # verl's own lines, and Megatron-core's for the upstream write verl reaches
    assert all(":" in d.source and d.source.startswith(("verl/", "megatron/")) for d in verl.declared)
    out = run_check(verl, _whiten_case([[True, False, False]]))
    assert out.ok and out.declared == "masked_whiten_le_one_token"
    bare = dataclasses.replace(verl, declared=())
    with pytest.raises(EngineCrash, match="The sum of the mask is one"):  # undeclared: the crash stays
        run_check(bare, _whiten_case([[True, False, False]]))
    assert run_check(verl, _whiten_case([[True, True, False]])).declared is None  # two tokens: compared as usual
    passk = Case("outcome_advantage", "matches_reference", "float64", "grpo_passk@singleton_groups",
                 {"token_level_rewards": np.array([[0.0, 1.0], [0.0, 0.5]]), "response_mask": np.ones((2, 2), bool),
                  "index": np.array([0, 1]), "garbage": 0.0})
    assert run_check(verl, passk).declared == "passk_one_sample_group"


@pytest.mark.engines
@verl_only
def test_the_rewards_precondition_keeps_garbage_out_of_the_rewards_and_only_there():
    """Declared: verl's callers keep rewards zero outside the response mask, so mask_invariant writes no
    garbage there. Without the declaration the same check fails: verl sums the whole row."""
    verl = load_engine("verl")
    case = Case("outcome_advantage", "mask_invariant", "float64", "grpo@uneven_groups",
                {"token_level_rewards": np.array([[0.0, 1.0, 0.0], [0.0, 0.5, 0.0], [0.0, -1.0, 0.0]]),
                 "response_mask": np.array([[True, True, False]] * 3), "index": np.array([0, 0, 0]),
                 "garbage": float("nan")})
    out = run_check(verl, case)
    assert out.ok and out.declared == "rewards_zero_outside_mask"
    assert not run_check(dataclasses.replace(verl, declared=()), case).ok


def test_conventions_and_guards_section_lists_declared_items_never_as_defects():
    doc = {"engine": {"declared": [GUARD.row(), Declared("agg", "convention", ("policy_loss",), "seq-mean", "paper",
                                                         "e.py:3").row()]},
           "findings": [{"id": "masked_var.matches_reference.float32.random", "status": "pass",
                         "declared": {"one_token": 3}}]}
    md = "\n".join(markdown_section(doc))
    assert "## Conventions and guards" in md and "`one_token`" in md and "3 example(s) in 1 finding(s)" in md
    assert "`e.py:9`" in md and "checked as declared" in md
    page = html_section(doc)
    assert "Conventions and guards" in page and "e.py:9" in page and "&lt;= 1 valid token" in page
    assert markdown_section({"engine": {}, "findings": []}) == [] and html_section({"findings": []}) == ""


# ----------------------------------------------------------------- declared writes
import json  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from rlconform.harness.core.declared import covering_write, package_dir, read_source  # noqa: E402
from rlconform.harness.report.severity import fails  # noqa: E402
from rlconform.harness.report.triage import annotate  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
CALLER = "verl/workers/engine/megatron/transformer_impl.py"
BACKWARD = {"function": "_VocabParallelEntropy.backward", "module": "verl.utils.megatron.tensor_parallel",
            "file": "verl/utils/megatron/tensor_parallel.py", "line": 130}
SAVED = ("rank 0 (tp 0): after the backward, a producer that saved the logits for backward could not backprop: one "
         "of the variables needed for gradient computation has been modified by an inplace operation: [torch."
         "FloatTensor [3, 64]], which is output 0 of SavesOutputIdentity, is at version 2; expected version 0")


def _cw(rows, finding):
    """covering_write over the finding's failure clauses (an older finding's read from its message)."""
    from rlconform.harness.report import failure_fields

    return covering_write(rows, finding, failure_fields.clauses(finding))


def _nd(op, message, site, regime="tp2_moderate", dtype="float32"):
    return {"id": f"{op}.non_destructive.{dtype}.{regime}", "op": op, "property": "non_destructive", "dtype": dtype,
            "regime": regime, "status": "discrepancy", "message": message, "max_ratio": None, "max_rel_err": 0.0,
            "worst_input": "logits[1, 2]=[0.0, 1.0]", "engine_function": site}


def _verl_write(name):
    from rlconform.harness.bindings.verl import DECLARED

    return next(d for d in DECLARED if d.name == name)


def _fork(tmp_path, edit):
    """A fork's checkout holding the installed verl's caller with ``edit`` applied (only what verify reads)."""
    text = read_source(CALLER)
    fork = tmp_path / "fork"
    (fork / "verl").mkdir(parents=True)
    (fork / "verl" / "__init__.py").write_text("")
    target = fork / CALLER
    target.parent.mkdir(parents=True)
    new = edit(text)
    assert new != text
    target.write_text(new)
    return fork


@pytest.mark.engines
@verl_only
def test_the_backward_write_precondition_is_read_from_the_installed_caller_and_fails_without_the_clone(tmp_path):
    """verl's _VocabParallelEntropy.backward writes into the logits it saved: declared, because its caller
    clones them first (logits_bak = logits.clone()) and computes Σπ² before the entropy. The declaration is
    verified in the caller's source; a fork whose caller drops the clone, or computes Σπ² after the entropy,
    does not hold it, and its backward write is a destructive defect again."""
    d = _verl_write("entropy_backward_writes_logits")
    ok = d.verify()
    assert ok["holds"] and "logits_bak = logits.clone()" in ok["evidence"] and CALLER in ok["evidence"]
    no_clone = _fork(tmp_path / "a", lambda t: t.replace("logits_bak = logits.clone()", "logits_bak = logits", 1))
    broken = d.verify(roots={"verl": str(no_clone)})
    assert not broken["holds"] and "clone" in broken["evidence"]

    def late(t):  # Σπ² moved after the entropy (it would read the written logits)
        sp = '            ret["sum_pi_squared"] = vocab_parallel_sum_pi_squared(logits)\n'
        t = t.replace("        if calculate_sum_pi_squared:\n" + sp, "", 1)
        return t.replace('            ret["entropy"] = entropy\n', '            ret["entropy"] = entropy\n'
                         '        if calculate_sum_pi_squared:\n' + sp, 1)
    assert not d.verify(roots={"verl": str(_fork(tmp_path / "b", late))})["holds"]
    # at run time the package the process imports is read: a fork first on the path is what is verified
    out = subprocess.run([sys.executable, "-c", "from rlconform.harness.core.declared import package_dir; "
                          "print(package_dir('verl'))"], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(no_clone)})
    assert out.stdout.strip() == str(no_clone / "verl")
    assert package_dir("verl") != str(no_clone / "verl")

    # triage: the committed report's backward findings are declared with the installed caller, defects with the fork's
    doc = json.loads((ROOT / "reports/verl-0.9.1/report.json").read_text())
    others = [r for r in doc["engine"]["declared"] if r["name"] != d.name]
    held = annotate({**doc, "engine": {**doc["engine"], "declared": others + [d.row()]}})
    bwd = [f for f in held["findings"] if f.get("declared_write") == d.name]
    assert len(bwd) >= 20 and not any(fails(f, "precision") for f in bwd)
    assert not any(x["engine_function"] and x["engine_function"]["function"] == "_VocabParallelEntropy.backward"
                   and x["signature"]["kind"] == "changes a tensor" for x in held["defects"])
    row = dict(d.row(), **broken)
    doc = json.loads((ROOT / "reports/verl-0.9.1/report.json").read_text())
    stale = annotate({**doc, "engine": {**doc["engine"], "declared": others + [row]}})
    assert not any(f.get("declared_write") == d.name for f in stale["findings"])
    again = [x for x in stale["defects"] if x["signature"]["kind"] == "changes a tensor"
             and x["engine_function"]["function"] == "_VocabParallelEntropy.backward"]
    assert again and again[0]["severity"] == "destructive"


@pytest.mark.engines
@verl_only
def test_a_declared_write_covers_only_what_it_declares():
    """The write must be confined to what is declared: the declared tensor, in the declared pass, at the
    declared writer. The entropy's forward stays non-destructive; another tensor changed is a defect."""
    bwd = _verl_write("entropy_backward_writes_logits").row()
    meg = _verl_write("megatron_cross_entropy_inplace").row()
    assert bwd["holds"] and meg["holds"], (bwd["evidence"], meg["evidence"])
    rows = [bwd, meg]
    assert _cw(rows, _nd("vocab_parallel_entropy", SAVED, BACKWARD))["name"] == bwd["name"]
    after = SAVED.replace("after the backward", "after vocab_parallel_entropy backward") + \
        "\nrank 0 (tp 0): input 'logits' mutated during vocab_parallel_entropy backward: 3 element(s) changed"
    assert _cw(rows, _nd("vocab_parallel_sum_pi_squared", after, BACKWARD, "tp2_after_entropy"))
    fwd = "rank 0 (tp 0): input 'logits' mutated during forward: 4 element(s) changed, e.g. [0] 1.0 -> 0.5\n" + SAVED
    assert _cw(rows, _nd("vocab_parallel_entropy", fwd, BACKWARD)) is None  # the forward must not write
    other = SAVED + "\nrank 0 (tp 0): input 'grad_output' mutated during backward: 1 element(s) changed"
    assert _cw(rows, _nd("vocab_parallel_entropy", other, BACKWARD)) is None  # another tensor
    unknown = SAVED + "\nrank 0 (tp 0): the saved softmax was modified in place"
    assert _cw(rows, _nd("vocab_parallel_entropy", unknown, BACKWARD)) is None  # a change not read
    elsewhere = dict(BACKWARD, function="vocab_parallel_entropy", line=142)
    assert _cw(rows, _nd("vocab_parallel_entropy", SAVED, elsewhere)) is None  # another writer
    assert _cw(rows, _nd("entropy", SAVED, BACKWARD)) is None  # an op it does not concern
    via = {"function": "vocab_parallel_log_probs_from_logits", "module": "verl.utils.megatron.tensor_parallel",
           "via": {"function": "VocabParallelCrossEntropy.calculate_predicted_logits",
                   "module": "megatron.core.tensor_parallel.cross_entropy"}}
    assert _cw(rows, _nd("vocab_parallel_token_logprobs", fwd, via))["name"] == meg["name"]
    assert _cw(rows, _nd("vocab_parallel_token_logprobs", SAVED, via)) is None  # not the forward write
    assert _cw([dict(meg, holds=False)], _nd("vocab_parallel_token_logprobs", fwd, via)) is None


@pytest.mark.engines
@verl_only
def test_the_upstream_inplace_convention_is_read_from_the_installed_megatron(tmp_path):
    """Megatron-core's calculate_predicted_logits writes in place on purpose: declared as a convention, verified
    in Megatron's own source (read without importing it), so a Megatron that no longer does it is reported."""
    d = _verl_write("megatron_cross_entropy_inplace")
    assert d.verify()["holds"]
    path = "megatron/core/tensor_parallel/cross_entropy.py"
    fork = tmp_path / "megatron"
    (fork / path).parent.mkdir(parents=True)
    (fork / path).write_text(read_source(path).replace("vocab_parallel_logits -= logits_max",
                                                       "vocab_parallel_logits = vocab_parallel_logits - logits_max"))
    assert not d.verify(roots={"megatron": str(fork)})["holds"]


@pytest.mark.engines
@verl_only
def test_declared_writes_are_listed_with_their_hazard_and_source():
    doc = json.loads((ROOT / "reports/verl-0.9.1/report.json").read_text())
    from rlconform.harness.bindings.verl import DECLARED

    doc = annotate({**doc, "engine": {**doc["engine"], "declared": [x.row() for x in DECLARED]}})
    md = "\n".join(markdown_section(doc))
    line = next(ln for ln in md.splitlines() if "`entropy_backward_writes_logits`" in ln)
    assert "verl/utils/megatron/tensor_parallel.py:130" in line and CALLER + ":1215" in line
    assert "hazard: a caller that reads the logits after the entropy's backward" in line
    assert "checked as declared" in line and "finding(s) show only this write" in line
    assert "megatron/core/tensor_parallel/cross_entropy.py:42" in md
    assert "entropy_backward_writes_logits" in html_section(doc)
    # `rlconform explain <name>`: the declared write's card, with the hazard a fork's caller needs
    from rlconform.harness.report.explain import declared_card

    card = declared_card(doc, "entropy_backward_writes_logits")
    assert "not a defect" in card and "Hazard" in card and "logits_bak = logits.clone()" in card
    assert "Does NOT hold" in declared_card({**doc, "engine": {"declared": [
        dict(r, holds=False) for r in doc["engine"]["declared"]]}}, "entropy_backward_writes_logits")
    assert declared_card(doc, "masked_var_le_one_token") is None  # a guard: no card of this kind


def test_a_declared_write_is_named_above_the_first_defect_row_and_says_whether_it_holds():
    """A maintainer reads the defects section's first lines: the engine's declared writes into a caller's
    tensor (verl's _VocabParallelEntropy.backward) are named there, with their hazard, before the first row,
    and say "does NOT hold" once the evidence is gone (then their findings are defects again)."""
    import copy
    import json
    import os

    from rlconform.harness.report.declared_md import writes_line
    from rlconform.harness.report.triage_md import render_defects

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "reports", "verl-0.9.1", "report.json")) as fh:
        doc = json.load(fh)
    lines = render_defects(doc)
    first_row = next(i for i, ln in enumerate(lines) if ln.startswith("| **"))
    top = [i for i, ln in enumerate(lines) if ln.startswith("Declared writes")]
    assert top and top[0] < first_row
    assert "`entropy_backward_writes_logits`" in lines[top[0]] and "hazard:" in lines[top[0]]
    assert "holds (" in lines[top[0]]
    broken = copy.deepcopy(doc)
    for d in broken["engine"]["declared"]:
        if d["name"] == "entropy_backward_writes_logits":
            d["holds"] = False
    assert "entropy_backward_writes_logits" in writes_line(broken)
    assert "does NOT hold" in writes_line(broken).split("entropy_backward_writes_logits", 1)[1].split(" · ")[0]
    no_writes = copy.deepcopy(doc)
    no_writes["engine"]["declared"] = [d for d in doc["engine"]["declared"] if not d.get("writes")]
    assert writes_line(no_writes) == "" and not any(ln.startswith("Declared writes") for ln in render_defects(no_writes))


def test_a_mask_layout_is_a_preconditions_and_one_of_the_known_layouts():
    from rlconform.harness.core.declared import Declared, mask_layout

    base = dict(name="layout", ops=("gae",), what="w", reason="r", source="x.py:1")
    ok = Declared(kind="precondition", mask_layout="right_aligned", **base)
    assert mask_layout((ok,), "gae", "padded") == ("right_aligned", "layout")
    assert mask_layout((ok,), "masked_whiten", "padded") == ("", "")
    assert ok.row()["mask_layout"] == "right_aligned"
    with pytest.raises(ValueError, match="mask_layout"):
        Declared(kind="precondition", mask_layout="left_aligned", **base)
    with pytest.raises(ValueError, match="mask_layout"):
        Declared(kind="convention", mask_layout="right_aligned", **base)


def test_an_optimal_token_baseline_example_respects_the_declared_rewards_precondition():
    """verl declares its rewards zero outside the response mask (the reward manager writes into a zero tensor): the
    OTB examples hold no reward at a masked position, and mask_invariant writes its garbage only into the inputs
    no precondition keeps zero (old_log_probs, Σπ²). Without the declaration the rewards get garbage too."""
    import torch
    from hypothesis import HealthCheck, given, settings

    from rlconform.harness.catalog.ops import OPS
    from rlconform.harness.families import optimal_token_baseline as OTB

    @settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(OTB.strategy(OPS["optimal_token_baseline"], "float64", "groups"))
    def drawn(x):
        assert not np.asarray(x["rewards"])[~np.asarray(x["mask"], bool)].any()

    drawn()
    reference = load_engine("reference")
    seen = []

    def engine(rewards, mask, index, old_log_probs, sum_pi_squared):
        seen.append({"rewards": rewards.clone(), "old_log_probs": old_log_probs.clone(), "mask": mask.clone()})
        return reference.resolve("optimal_token_baseline")(rewards, mask, index, old_log_probs, sum_pi_squared)

    kept = Declared("rewards_zero_outside_mask", "precondition", ("optimal_token_baseline",), "rewards are zero where "
                    "masked", "the reward manager writes into a zero tensor", "x.py:1", inputs=("rewards",))
    mask = np.array([[True, True, False], [True, False, False]])
    inputs = {"rewards": np.array([[0.0, 1.0, 0.0], [0.5, 0.0, 0.0]]), "mask": mask, "index": np.array([0, 0]),
              "old_log_probs": np.log(np.full((2, 3), 0.5)), "sum_pi_squared": np.full((2, 3), 0.5),
              "garbage": float("nan")}
    for declared, rewards_dirty in (((kept,), False), ((), True)):
        seen.clear()
        run_check(Binding("b", ops={"optimal_token_baseline": engine}, declared=declared),
                  Case("optimal_token_baseline", "mask_invariant", "float64", "groups", dict(inputs)))
        dirty = seen[-1]  # the alternative run, garbage at masked positions
        masked = ~dirty["mask"].bool()
        assert torch.isnan(dirty["old_log_probs"][masked]).all()
        assert bool(torch.isnan(dirty["rewards"][masked]).all()) is rewards_dirty, declared


@pytest.mark.engines
@verl_only
def test_megatrons_inplace_cross_entropy_reads_one_way_in_every_binding_that_reaches_it():
    """One upstream line, one reading: verl's binding (through vocab_parallel_log_probs_from_logits) and
    Megatron-core's own declare the same convention, with the same writer, phase, source and evidence; only the
    ops and why their callers are safe differ. A Megatron-core finding whose backward could not run because its
    forward wrote the logits (the TP = 1 wording, without "after the backward") is that write."""
    from rlconform.harness.bindings.megatron import DECLARED as MEGATRON

    (own,) = [d for d in MEGATRON if d.name == "megatron_cross_entropy_inplace"]
    verl = _verl_write("megatron_cross_entropy_inplace")
    same = ("kind", "what", "source", "writes", "phase", "writer", "evidence", "hazard")
    assert {k: getattr(own, k) for k in same} == {k: getattr(verl, k) for k in same}
    assert set(verl.ops) <= set(own.ops) and own.reason != verl.reason
    row = dict(own.row(), holds=True)
    site = {"function": "_VocabParallelCrossEntropy.forward", "module": "megatron.core.tensor_parallel.cross_entropy",
            "via": {"function": "VocabParallelCrossEntropy.calculate_predicted_logits",
                    "module": "megatron.core.tensor_parallel.cross_entropy"}}
    tp1 = ("input 'logits' mutated during forward: 1 element(s) changed, e.g. [0] 0.1257 -> 1.0; _version 0 -> 3\n"
           "a producer that saved the logits for backward could not backprop: one of the variables needed for "
           "gradient computation has been modified by an inplace operation")
    assert _cw([row], _nd("token_logprobs", tp1, site, "moderate"))["name"] == own.name
    assert _cw([row], _nd("token_logprobs", tp1.splitlines()[1], site, "moderate")) is None


@pytest.mark.engines
@verl_only
def test_a_declared_write_is_read_from_the_mutation_fields_not_the_sentence():
    """A finding whose mutation clauses carry their fields is covered by what they say (tensor, phase), whatever
    their sentence; a sentence-only clause (no tensor) is not."""
    from rlconform.harness.core import failure

    meg = dict(_verl_write("megatron_cross_entropy_inplace").row(), holds=True)
    via = {"function": "vocab_parallel_log_probs_from_logits", "module": "verl.utils.megatron.tensor_parallel",
           "via": {"function": "VocabParallelCrossEntropy.calculate_predicted_logits",
                   "module": "megatron.core.tensor_parallel.cross_entropy"}}
    reworded = [failure.mutation("logits", "forward", "rank 0: the logits now hold exp(logits − max)"),
                failure.mutation("logits", "backward", "rank 0: the producer's backward failed", evidence="saved")]
    f = dict(_nd("vocab_parallel_token_logprobs", "", via), failure={"clauses": failure.clauses_to_json(reworded)})
    assert _cw([meg], f)["name"] == meg["name"]
    bare = dict(f, failure={"clauses": failure.clauses_to_json([failure.text("mutation", "something changed")])})
    assert _cw([meg], bare) is None

"""Declared conventions, preconditions and guards (issue 20 §2): checked as declared, listed in their own
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


@verl_only
def test_verl_declares_its_guards_and_they_hold():
    verl = load_engine("verl")
    names = {d.name for d in verl.declared}
    assert {"masked_var_le_one_token", "masked_whiten_le_one_token", "batch_whiten_le_one_token",
            "passk_one_sample_group", "rewards_zero_outside_mask", "sapo_seq_mean_token_mean"} <= names
    assert all(":" in d.source and d.source.startswith("verl/") for d in verl.declared)
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

"""Second implementations of one variant: a binding gives a variant of an op with variants
(``outcome_advantage[grpo]``) a second implementation in ``Variants.implementations``; the main job checks
it as its own findings under ``variant+impl@data`` with every property of the op, plus
``implementations_agree`` (the two implementations against each other, also where a convention applies).
An engine without it gets no such findings and lists them as not provided. Checked here on a toy binding
built from the reference engine, the bundled mutant ``vectorized_raw_singleton``, the ledger, case files
and ``--regime``; verl's ``grpo_vectorized`` / ``rloo_vectorized`` in tests/test_engine_advantages.py."""

from __future__ import annotations

import json

import forked_cli
import numpy as np
import pytest
import torch

from rlconform.harness.bindings.load import validate_binding, variant_info
from rlconform.harness.bindings.reference import binding as reference
from rlconform.harness.catalog.binding import Binding, BindingError, Variants
from rlconform.harness.catalog.ops import OPS
from rlconform.harness.core.opinfo import (
    IMPLEMENTATIONS_AGREE,
    MATCHES_REFERENCE,
    OpInfo,
    plain_regime,
    regime_implementation,
    split_variant,
)
from rlconform.harness.mutants._advantages import broadcast, scores
from rlconform.harness.report.xfails import XfailsError, parse_xfails
from rlconform.harness.run.selection import selected_findings
from rlconform.properties.case import Case, CaseError, load_case, save_case
from rlconform.properties.checks import run_check

OP = "outcome_advantage"
REF = reference.ops[OP]


def grpo_index_add(token_level_rewards, response_mask, index):
    """GRPO with every group's statistics at once (``index_add_``): the same numbers as the reference's loop
    to rounding, a group of one row 0 as the reference defines it."""
    s, keep = scores(token_level_rewards, response_mask)
    _, inverse = np.unique(np.asarray(index).reshape(-1), return_inverse=True)
    g = torch.from_numpy(inverse.reshape(-1))
    n = int(g.max()) + 1
    count = torch.zeros(n, dtype=s.dtype).index_add_(0, g, torch.ones_like(s))
    mean = torch.zeros(n, dtype=s.dtype).index_add_(0, g, s) / count
    dev = s - mean[g]
    var = torch.zeros(n, dtype=s.dtype).index_add_(0, g, dev * dev) / (count - 1).clamp(min=1)
    a = torch.where(count[g] > 1, dev / (var.sqrt()[g] + 1e-6), torch.zeros((), dtype=s.dtype))
    return broadcast(a, keep, token_level_rewards.dtype)


def toy(**implementations) -> Binding:
    return Binding("toy", ops={OP: Variants(dict(REF.impls), implementations=implementations)})


def group_case(prop: str, dtype: str = "float64", data: str = "singleton_groups", variant: str = "grpo+vectorized"):
    """Rows [0, 1, 2] in one group and row 3 alone under ``singleton_groups`` (its reference advantage is 0 by
    definition); rows [0, 1] and [2, 3] otherwise."""
    mask = np.ones((4, 2), bool)
    mask[1, 1] = False
    rewards = np.zeros((4, 2))
    rewards[[0, 2, 3], 1] = [1.0, 0.5, 0.95]
    rewards[1, 0] = 0.0
    return Case(OP, prop, dtype, f"{variant}@{data}", {"token_level_rewards": rewards, "response_mask": mask,
                                                        "index": np.array([7, 7, 7, 3] if data == "singleton_groups" else [7, 7, 3, 3]),
                                                        "garbage": np.nan})


# ------------------------------------------------------------------------------------------ catalog
def test_regime_names_keep_the_variant_and_name_the_implementation():
    assert split_variant("grpo+vectorized") == ("grpo", "vectorized")
    assert split_variant("k1+") == ("k1+", None)  # kl_estimator's straight-through modes keep their '+'
    assert split_variant("k1++vectorized") == ("k1+", "vectorized")
    assert plain_regime("grpo+vectorized@uneven_groups") == "grpo@uneven_groups"
    assert plain_regime("k1+@moderate") == "k1+@moderate"
    assert regime_implementation("rloo+vectorized@near_constant") == "vectorized"
    assert regime_implementation("k1+@moderate") is None and regime_implementation("chunked@peaked") is None
    with pytest.raises(ValueError, match="only at its end"):
        OpInfo("x", "k", None, (), {}, len, variants=("a+b",))


def test_outcome_advantage_has_a_twin_of_every_variant_regime_with_every_property():
    info = OPS[OP]
    plain = [r for r in info.regimes if regime_implementation(r) is None]
    twins = [r for r in info.regimes if regime_implementation(r) == "vectorized"]
    assert len(twins) == len(plain) == 33 and {plain_regime(t) for t in twins} == set(plain)
    assert IMPLEMENTATIONS_AGREE in info.properties
    assert set(info.property_regimes[IMPLEMENTATIONS_AGREE]) == set(twins)
    for prop in info.properties:  # every property of the op on the twins; the agreement only there
        regimes = {r for _, r in info.cases(prop)}
        assert set(twins) <= regimes
        assert (prop == IMPLEMENTATIONS_AGREE) == (not set(plain) & regimes)
    assert {"grpo+vectorized", "drgrpo+vectorized", "rloo+vectorized"} <= set(info.implemented_variants)


# ------------------------------------------------------------------------------- binding and selection
def test_findings_are_selected_only_for_provided_implementations_and_the_rest_is_listed():
    b = toy(vectorized={"grpo": grpo_index_add})
    provided, record = variant_info(b)
    chosen = selected_findings(b.provided_ops(), ops=(OP,), variants=provided)
    twins = {f[3] for f in chosen if regime_implementation(f[3])}
    assert twins == {f"grpo+vectorized@{d}" for d in ("uneven_groups", "singleton_groups", "near_constant")}
    assert {f[1] for f in chosen if f[3] in twins} == set(OPS[OP].properties)
    assert "grpo+vectorized" in record[OP]["checked"]
    assert "rloo+vectorized" in record[OP]["not_provided"] and "grpo+vectorized" not in record[OP]["not_provided"]
    bare = variant_info(reference)
    assert not any(regime_implementation(f[3]) for f in selected_findings(reference.provided_ops(), ops=(OP,),
                                                                           variants=bare[0]))
    assert "grpo+vectorized" in bare[1][OP]["not_provided"]  # listed, never silently skipped


@pytest.mark.parametrize("implementations, match", [
    ({"fast": {"grpo": grpo_index_add}}, "no implementation 'fast'"),
    ({"vectorized": {"grpo": 3}}, "must be callable"),
])
def test_malformed_second_implementations_are_binding_errors(implementations, match):
    with pytest.raises(BindingError, match=match):
        validate_binding(toy(**implementations), "test")


def test_a_second_implementation_needs_the_default_one():
    b = Binding("b", ops={OP: Variants({"rloo": REF.impls["rloo"]}, implementations={"vectorized": {"grpo": grpo_index_add}})})
    with pytest.raises(BindingError, match="default implementation"):
        validate_binding(b, "test")


# ------------------------------------------------------------------------------------------- checks
@pytest.mark.parametrize("prop", sorted(OPS[OP].properties))
@pytest.mark.parametrize("data", ["singleton_groups", "uneven_groups"])
def test_an_agreeing_second_implementation_passes_every_property(prop, data):
    outcome = run_check(toy(vectorized={"grpo": grpo_index_add}), group_case(prop, data=data))
    assert outcome.ok, outcome.message


def test_the_second_implementation_is_what_its_findings_call():
    calls = []

    def spy(*args, **kw):
        calls.append(1)
        return grpo_index_add(*args, **kw)

    assert run_check(toy(vectorized={"grpo": spy}), group_case(MATCHES_REFERENCE)).ok and calls == [1]


def test_a_disagreeing_second_implementation_fails_the_agreement_with_both_values():
    from rlconform.harness.mutants.vectorized_raw_singleton import binding as mutant

    outcome = run_check(mutant, group_case(IMPLEMENTATIONS_AGREE, "float32"))
    assert not outcome.ok
    assert "(vectorized) = 0.94999" in outcome.message and "(default) = 0.0" in outcome.message, outcome.message
    # where the groups have more than one row the two agree
    assert run_check(mutant, group_case(IMPLEMENTATIONS_AGREE, "float32", data="uneven_groups")).ok


def test_agreement_is_judged_where_the_reference_is_undefined():
    """A NaN reward in a group: the reference's advantage is NaN for that group (undefined), the
    implementations must still give the same NaN / numbers there."""
    case = group_case(IMPLEMENTATIONS_AGREE, data="uneven_groups")
    case.inputs["token_level_rewards"][0, 1] = np.nan

    def nan_to_zero(token_level_rewards, response_mask, index):
        adv, ret = grpo_index_add(token_level_rewards, response_mask, index)
        return torch.nan_to_num(adv), torch.nan_to_num(ret)

    assert run_check(toy(vectorized={"grpo": grpo_index_add}), case).ok
    outcome = run_check(toy(vectorized={"grpo": nan_to_zero}), case)
    assert not outcome.ok and "reference nan" in outcome.message, outcome.message


def test_an_engine_without_the_implementation_is_not_provided():
    from rlconform.harness.catalog.binding import VariantNotProvided

    with pytest.raises(VariantNotProvided):
        run_check(reference, group_case(MATCHES_REFERENCE))
    with pytest.raises(BindingError, match="only under the regimes of a second implementation"):
        run_check(reference, group_case(IMPLEMENTATIONS_AGREE, variant="grpo"))


# ------------------------------------------------------------------------------- ledger, cases, CLI
def test_ledger_lines_of_second_implementations_parse_and_misplaced_ones_are_errors(tmp_path):
    good = tmp_path / "x.txt"
    good.write_text(f"{OP}.implementations_agree.float64.drgrpo+vectorized@uneven_groups  # why\n"
                    f"{OP}.matches_reference.float32.rloo+vectorized@near_constant\n")
    assert len(parse_xfails(str(good))) == 2
    bad = tmp_path / "y.txt"
    bad.write_text(f"{OP}.implementations_agree.float64.drgrpo@uneven_groups\n")
    with pytest.raises(XfailsError, match="not checked under regime"):
        parse_xfails(str(bad))


def test_case_files_round_trip_and_misplaced_agreement_cases_are_refused(tmp_path):
    case = group_case(IMPLEMENTATIONS_AGREE)
    path = tmp_path / f"{case.finding_id}.json"
    save_case(case, str(path))
    back = load_case(str(path))
    assert back.regime == "grpo+vectorized@singleton_groups" and back.property == IMPLEMENTATIONS_AGREE
    doc = json.loads(path.read_text())
    doc["regime"] = "grpo@singleton_groups"
    path.write_text(json.dumps(doc))
    with pytest.raises(CaseError, match="not checked under regime"):
        load_case(str(path))


@pytest.mark.cli
def test_check_and_replay_of_the_mutant_on_one_regime(tmp_path):
    """The CLI end to end, narrowed with --regime to a second implementation's regime: the agreement fails,
    its reproducer replays to the same verdict."""
    proc = forked_cli.run(["check", "--engine", "mutants.vectorized_raw_singleton", "--op", OP,
                           "--regime", "grpo+vectorized@singleton_groups", "--dtype", "float64",
                           "--profile", "ci", "--max-examples", "20", "-q", "-n", "0", "--out", str(tmp_path)],
                          timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "report.json").read_text())
    by = {(f["property"], f["regime"]): f["status"] for f in doc["findings"]}
    assert set(r for _, r in by) == {"grpo+vectorized@singleton_groups"}
    assert by[(IMPLEMENTATIONS_AGREE, "grpo+vectorized@singleton_groups")] == "discrepancy"
    assert by[("non_destructive", "grpo+vectorized@singleton_groups")] == "pass"
    case = tmp_path / "cases" / f"{OP}.{IMPLEMENTATIONS_AGREE}.float64.grpo+vectorized@singleton_groups.json"
    replay = forked_cli.run(["replay", str(case), "--engine", "mutants.vectorized_raw_singleton"], timeout=600)
    assert replay.returncode == 1 and "DISCREPANCY" in replay.stdout, replay.stdout + replay.stderr


def test_a_disagreement_at_a_conventions_zero_reference_is_a_wrong_value():
    """rloo's loop gives a singleton group its raw score, rloo_vectorized 0 (the reference's 0): judged at the
    scale of the two values, not of the reference's 0."""
    from rlconform.harness.report.severity import classify

    msg = ("advantages (vectorized) = 0.0 vs advantages (default) = 0.5 at flat index 0 (reference 0.0, allowed "
           "difference 0.000201)")
    finding = {"status": "discrepancy", "property": IMPLEMENTATIONS_AGREE, "message": msg, "max_ratio": 2.5e3}
    severity, why = classify(finding)
    assert severity == "training" and "implementations differ by 1" in why, why  # an advantage: training
    assert classify(dict(finding, property="mask_invariant"))[0] == "precision"  # the reference's scale there


def test_a_wrong_disagreement_is_its_own_kind_of_defect():
    from rlconform.harness.report.triage import kind

    msg = ("advantages (vectorized) = -0.7071 vs advantages (default) = -1.0 at flat index 0 (reference -1.0, "
           "allowed difference 0.000202)")
    assert kind({"status": "discrepancy", "property": IMPLEMENTATIONS_AGREE, "message": msg,
                 "max_ratio": 1.4e3}) == "implementations disagree"

"""Severity, defects and ``rlconform diff`` on findings in the report's own wording."""

from __future__ import annotations

import copy
import json
import pathlib

import pytest

from rlconform.harness.cli import main
from rlconform.harness.report.severity import classify, fails
from rlconform.harness.report.triage import annotate

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _f(fid, status="discrepancy", message="", ratio=None, **kw):
    op, prop, dtype, regime = fid.split(".")
    return {"id": fid, "op": op, "property": prop, "dtype": dtype, "regime": regime, "status": status,
            "message": message, "max_ratio": ratio, "max_rel_err": 0.0, "worst_input": kw.pop("inp", "x"), **kw}


HALF = "value: engine 0.5 vs reference 1.0 at flat index 0: abs err 0.5, rel err 0.5, 64 ulp, tolerance 0.0256"


def test_severity_rules():
    assert classify(_f("a.matches_reference.float32.r", message=HALF, ratio=20.0))[0] == "training"
    # the same clause, but the worst example within 4x of its tolerance: never more than precision
    assert classify(_f("a.matches_reference.float32.r", message=HALF, ratio=3.9))[0] == "precision"
    zero = "advantages: engine 5.2e-09 vs reference 0.0 at flat index 0: abs err 5.2e-09, tolerance 1e-09"
    assert classify(_f("a.matches_reference.float64.r", message=zero, ratio=5e8))[0] == "precision"
    nan = "value: engine nan where the reference is finite (0.0) at flat index 0"
    assert classify(_f("a.finite_where_reference_finite.float32.r", message=nan))[0] == "robustness"
    assert classify(_f("a.non_destructive.float32.r", message="input 'logits' mutated during forward"))[0] == \
        "destructive"
    assert classify(_f("a.matches_reference.float32.r", message="value: no autograd graph on the output"))[0] == \
        "training"
    assert classify(_f("a.matches_reference.float32.r", status="crash",
                       message="engine raised in entropy: RuntimeError: boom"))[0] == "robustness"
    # a breach of a declared input rank is a crash, even next to a destructive or a rounding-sized failure
    # (impl_contract.rank_problem's wording)
    rank2 = ("contract: a rank-2 input (3, 32) (its docstring allows ranks 2, 3) raised IndexError: too many "
             "indices for tensor of dimension 2\nrank 0 (tp 0): input 'logits' mutated during forward")
    sev, why = classify(_f("a.non_destructive.float32.chunked@tp2_moderate", message=rank2))
    assert sev == "robustness" and "IndexError" in why and "rank-2" in why, why
    from rlconform.harness.report.triage import feature, kind
    # features: the garbage mask_invariant writes is the cause, whatever else the input has; -inf is a
    # logits feature only for an input with logits
    garbage = _f("m.mask_invariant.float32.imbalanced_partitions", message="value = nan vs value = 1.0 at flat index 0 (reference 1.0, allowed difference 2e-06)",
                 inp="values[2]=[1.0, -inf], mask[2]=[True, False]")
    assert feature(garbage) == "masked garbage"
    assert feature(_f("m.matches_reference.float64.r", message=HALF, ratio=20.0, inp="values[2]=[1.0, -inf]")) == "any input"
    assert feature(_f("e.matches_reference.float32.r", message=HALF, ratio=20.0, inp="logits[1, 2]=[0.0, -inf]")) == \
        "-inf logits"
    assert kind(_f("a.non_destructive.float32.chunked@tp2_moderate", message=rank2)) == "crash:IndexError"
    dtype_only = "contract: entropy is float32 for a float64 input; the implementation's docstring documents the input's dtype"
    assert classify(_f("a.matches_reference.float64.chunked@moderate", message=dtype_only, ratio=2.0))[0] == "precision"
    part = "unsharded (DP = 1) vs tokens per DP rank [1, 0]: 1.0 vs 0.5 at flat index 0 (reference 1.0, " \
           "allowed difference 0.0513)"
    assert classify(_f("a.partition_invariant.bfloat16.r", message=part, ratio=30.0))[0] == "training"


def test_fail_on():
    imprecise = annotate({"findings": [_f("a.matches_reference.float32.r", message=HALF, ratio=2.0)]})["findings"][0]
    assert imprecise["severity"] == "precision"
    assert fails(imprecise, "precision") and not fails(imprecise, "robustness") and not fails(imprecise)
    # the earlier names still work: imprecise = precision, wrong = robustness
    assert fails(imprecise, "imprecise") and not fails(imprecise, "wrong")
    assert fails(_f("a.matches_reference.float32.r", status="xpass"), "training")
    assert not fails(dict(imprecise, status="xfail"), "precision")
    training = annotate({"findings": [_f("a.matches_reference.float32.r", message=HALF, ratio=20.0)]})["findings"][0]
    assert fails(training) and fails(training, "training") and fails(training, "logging")
    nan = dict(training, message="value: engine nan where the reference is finite (0.0) at flat index 0")
    assert annotate({"findings": [nan]})["findings"][0]["severity"] == "robustness"
    assert fails(nan) and not fails(nan, "logging") and not fails(nan, "training")
    with pytest.raises(ValueError, match="choose from training"):
        fails(training, "fatal")


def test_verl_report_borderline_findings_are_precision_and_defects_group_dtypes():
    """An older report (no engine functions, triggers or engine dtypes recorded) still triages: defects fall
    back to the op and the input feature."""
    doc = json.loads((ROOT / "reports/verl-0.9.1/report.json").read_text())
    for f in doc["findings"]:  # as a report written before these fields holds them
        for key in ("engine_function", "crash_frame", "trigger", "severity", "severity_reason"):
            f.pop(key, None)
    doc["engine"].pop("engine_dtypes", None)
    doc = annotate(doc)
    by = {f["id"]: f for f in doc["findings"]}
    assert all(f.get("severity") for f in doc["findings"] if f["status"] not in ("pass", "marginal"))
    assert by["token_logprobs.matches_reference.float32.near_uniform_offset"]["severity"] == "precision"
    assert by["agg_loss.matches_reference.float32.seq-mean-token-sum@imbalanced_partitions"]["severity"] == "training"
    nan = [d for d in doc["defects"] if d["op"] == "entropy" and "matches_reference" in d["properties"]
           and d["signature"]["kind"] == "NaN / inf"]
    assert len(nan) == 1 and len(nan[0]["dtypes"]) == 4 and "-inf logits" in nan[0]["triggers"]
    top = [m for m in nan[0]["members"] if by[m]["severity"] == nan[0]["severity"]]
    sizes = {m: len(by[m]["worst_input"]) for m in top}  # the reproducer: the smallest of the most severe
    assert sizes[nan[0]["reproducer"]["finding"]] == min(sizes.values())
    from rlconform.harness.report.severity import RANK

    ranks = [RANK[d["severity"]] for d in doc["defects"]]
    assert ranks == sorted(ranks)
    assert annotate(copy.deepcopy(doc))["defects"] == doc["defects"]


def _write(path, findings):
    path.mkdir(parents=True, exist_ok=True)
    (path / "report.json").write_text(json.dumps({"engine": {"name": "e"}, "findings": findings}))
    return str(path)


@pytest.mark.cli
def test_diff_new_fixed_and_exit_codes(tmp_path, capsys):
    ok = _f("a.matches_reference.float32.r", status="pass")
    base = _write(tmp_path / "base", [ok, _f("b.matches_reference.float32.r", message=HALF, ratio=2.0)])
    assert main(["diff", base, base]) == 0
    assert "No change" in capsys.readouterr().out
    wrong = dict(ok, status="discrepancy", message=HALF, max_ratio=20.0)
    head = _write(tmp_path / "head", [wrong, _f("b.matches_reference.float32.r", status="pass")])
    assert main(["diff", base, head]) == 1
    out = capsys.readouterr().out
    assert "New defects" in out and "Fixed defects" in out and "a.matches_reference.float32.r" in out
    soft = _write(tmp_path / "soft", [dict(wrong, max_ratio=2.0), _f("b.matches_reference.float32.r", status="pass")])
    assert main(["diff", base, soft]) == 0
    assert main(["diff", base, soft, "--fail-on", "precision"]) == 1
    assert main(["diff", base, soft, "--fail-on", "imprecise"]) == 1  # the issue-12 name, read as precision


def test_html_of_verl_report_is_under_500_kb(tmp_path):
    """verl's page stays one self-contained page under 500 KB, and the size is not bought by
    leaving findings out: every defect's reproducer, a row per failing finding, every finding in the
    compressed table."""
    import json
    import shutil

    from rlconform.harness.report.html_report import read_blob
    from rlconform.harness.report.writer import rerender

    shutil.copy(ROOT / "reports/verl-0.9.1/report.json", tmp_path / "report.json")
    _, html = rerender(str(tmp_path))
    text = pathlib.Path(html).read_text()
    assert len(text.encode()) < 500_000 and "defect cards" in text and "id=\"defects-table\"" in text
    doc = json.loads((tmp_path / "report.json").read_text())
    assert all(d["reproducer"]["command"] in text for d in doc["defects"])
    assert all(f'id="{f["id"]}"' in text for f in doc["findings"] if f["status"] != "pass")
    assert [r[0] for r in read_blob(text)] == [f["id"] for f in doc["findings"]]


def test_a_wrong_value_at_an_exact_zero_is_not_rounding():
    """verl's vectorized GRPO gives 0.0119 where the exact advantage is 0: no relative error exists, and an
    absolute one of a percent at unit scale is a wrong value (its row, not its module's rounding row);
    5.9e-8 at 0 (float32 arithmetic in a float64 check) stays rounding."""
    from rlconform.harness.report.triage import kind

    big = "advantages: engine 0.011920928940766656 vs reference 0.0 at flat index 0: abs err 0.0119, tolerance 1e-09"
    small = "advantages: engine 5.929928925674233e-08 vs reference 0.0 at flat index 0: abs err 5.93e-08, tolerance 1e-09"
    wrong = _f("outcome_advantage.matches_reference.float32.grpo+vectorized@near_constant", message=big, ratio=1e7)
    assert classify(wrong)[0] == "training" and kind(wrong) == "wrong value"
    fine = _f("optimal_token_baseline.matches_reference.float32.groups", message=small, ratio=59.0)
    assert classify(fine)[0] == "precision" and kind(fine) == "inexact value"


def test_ulp_level_at_the_inputs_scale_is_precision():
    """verl's chunked entropy upcasts bf16 logits of 266 to float32 and gives 0 where the exact entropy is
    1.4e-5: below 4 float32 ulps at 266 (1.3e-4), what any float32 computation gives — precision, its
    module's rounding; the unchunked entropy computing in bf16 (0 where the exact value is 0.69 at logits
    of 256) is far beyond it and stays training."""
    from rlconform.harness.report.severity import input_scale
    from rlconform.harness.report.triage import kind

    inp = ("logits[2, 3]=[256.0, 229.0, 251.0, 252.0, 266.0, 250.0], grad_output[2]=[0.8196, -1000.0], "
           "labels[2]=[2, 2], chunk_size=1")
    assert input_scale({"worst_input": inp}) == 266.0  # ids, chunk sizes and the upstream gradient are no scale
    import numpy as np

    from rlconform.harness.core.input_scale import leading_scale

    inputs = {"logits": np.array([[256.0, 229.0, 251.0], [252.0, 266.0, 250.0]]), "grad_output": np.array([0.8, -1e3]),
              "labels": np.array([2, 2]), "chunk_size": 1}
    assert leading_scale(inputs) == 266.0  # what a check records as the finding's input_scale
    assert input_scale({"worst_input": "logits[1]=[1.0]", "input_scale": 266.0}) == 266.0  # the field, not the text
    tiny = ("value (rank 2): engine 0.0 vs reference 1.4386015621091178e-05 at flat index 1: abs err 1.44e-05, "
            "rel err 1, 1.58e+07 ulp, tolerance 2.31e-06")
    f = _f("entropy.matches_reference.bfloat16.chunked@bf16_coarse", message=tiny, ratio=14.3, inp=inp)
    sev, why = classify(f, {"entropy": ["float32", "bfloat16"]})
    assert sev == "precision" and why.startswith("ulp-level") and kind(f) == "inexact value"
    bf16 = ("value: engine 0.0 vs reference 0.6931471805599453 at flat index 0: abs err 0.693, rel err 1, 177 ulp, "
            "tolerance 0.0313")
    g = _f("entropy.matches_reference.bfloat16.bf16_coarse", message=bf16, ratio=1416.0, inp="logits[1, 2]=[256.0, 256.0]")
    # beyond float32's resolution: a wrong value, not ulp-level — but logits of 256 are an extreme regime, no
    # training input: precision; the same value on a realistic regime is training
    sev, why = classify(g, {"entropy": ["float32", "bfloat16"]})
    assert sev == "precision" and "extreme input" in why and kind(g) == "wrong value"
    g = dict(g, regime="moderate", id="entropy.matches_reference.bfloat16.moderate")
    assert classify(g, {"entropy": ["float32", "bfloat16"]})[0] == "training" and kind(g) == "wrong value"


def test_a_crash_is_robustness_in_every_dtype_and_a_value_is_gated_by_it():
    """The dtype gate (a dtype the engine never calls the op with: precision) reads values only: verl's
    compute_is_metrics raises ZeroDivisionError on fp16 weights that underflow to 0 — an uncontrolled
    exception loses the step of a caller in that dtype (verl trains in fp16 mixed precision too), so it is
    robustness; a NaN in that dtype stays precision."""
    used = {"importance_ratio": ["float32", "bfloat16"]}
    crash = _f("importance_ratio.matches_reference.float16.token_tis@extreme_log_ratios", status="crash",
               message="engine raised in compute_is_metrics: ZeroDivisionError: float division by zero")
    assert classify(crash, used)[0] == "robustness"
    nan = _f("importance_ratio.matches_reference.float16.token_tis@extreme_log_ratios",
             message="weights: engine nan where the reference is finite (0.5) at flat index 0")
    assert classify(nan, used)[0] == "precision"


# ------------------------------------------------- extreme regimes and reachability
def test_a_wrong_value_only_on_an_extreme_regime_is_not_training():
    """bf16 entropy of logits of 256 (bf16_coarse), ±1e4 (near_uniform_offset, also behind a TP layout) or
    fp16's ±65504 is a contrived input: a wrong value there is precision, a NaN robustness; the same value on a
    realistic regime stays training, and a defect with both members is training, shown by the realistic one."""
    from rlconform.harness.core.regimes import extreme, realistic

    assert extreme("chunked@tp2_near_uniform_offset") and extreme("bf16_coarse") and extreme("token_tis@extreme_log_ratios")
    assert realistic("moderate") and realistic("tp2cp2_moderate") and realistic("grpo@singleton_groups")
    for regime in ("bf16_coarse", "fp16_extreme", "tp2_near_uniform_offset", "seq_mean_k3@underflow"):
        sev, why = classify(_f(f"e.matches_reference.bfloat16.{regime}", message=HALF, ratio=20.0))
        assert sev == "precision" and "extreme input" in why, (regime, sev, why)
    assert classify(_f("e.matches_reference.bfloat16.moderate", message=HALF, ratio=20.0))[0] == "training"
    nan = "value: engine nan where the reference is finite (0.0) at flat index 0"
    assert classify(_f("e.matches_reference.bfloat16.bf16_coarse", message=nan))[0] == "robustness"
    site = {"function": "entropy_from_logits", "module": "m", "file": "m.py", "line": 3}
    coarse = _f("e.matches_reference.bfloat16.bf16_coarse", message=HALF, ratio=20.0, inp="logits[1, 2]=[256.0, 256.0]",
                engine_function=site)
    moderate = _f("e.matches_reference.bfloat16.moderate", message=HALF.replace("0.5 vs", "0.75 vs"), ratio=20.0,
                  inp="logits[1, 8]=[2.0, -2.1, 10.25, 1.6, -8.5, 5.7, 0.1, 0.2]", engine_function=site)
    d = annotate({"findings": [coarse, moderate]})["defects"]
    assert len(d) == 1 and d[0]["severity"] == "training" and d[0]["reproducer"]["finding"] == moderate["id"]
    assert [x["severity"] for x in annotate({"findings": [coarse]})["defects"]] == ["precision"]


def _site(fn):
    return {"function": fn, "module": "m", "file": "m.py", "line": 1}


def test_within_a_severity_every_step_of_a_configuration_ranks_first():
    """Reachability before the size of the effect: a configuration the binding names as a trigger (verl's Dr.
    GRPO through grpo_vectorized) and more than one micro-batch (geo_mean) rank above a larger error on any
    input, which ranks above one on an edge input (a row with no valid token); a member in a dtype the engine
    never calls the op with, or on an extreme regime, counts last. Training is listed before destructive."""
    big = "loss: engine 3.0 vs reference 1.0 at flat index 0: abs err 2, rel err 2, tolerance 1e-3"
    small = "advantages: engine -0.707 vs reference -1.0 at flat index 0: abs err 0.293, rel err 0.293, tolerance 1e-3"
    part = "micro-batches (nnz) [1, 1] vs unpartitioned: 2.0 vs 1.0 (reference 1.0, allowed difference 0.01)"  # ×2
    drgrpo = "norm_adv_by_std_in_grpo=False (Dr. GRPO): grpo_vectorized ignores it"
    fs = [_f("edge.matches_reference.float32.r", message=big, ratio=99.0, trigger="a row with no valid token",
             engine_function=_site("edge")),
          _f("anyin.matches_reference.float32.r", message=big.replace("3.0 vs", "2.0 vs"), ratio=99.0,
             trigger="any input", engine_function=_site("anyin")),
          _f("drgrpo.matches_reference.float32.drgrpo+vectorized@uneven_groups", message=small, ratio=99.0,
             trigger=drgrpo, engine_function=_site("grpo_vectorized")),
          _f("geo.partition_invariant.float32.geo_mean@moderate", message=part, ratio=99.0,
             trigger="more than one micro-batch", engine_function=_site("geo_mean")),
          _f("coarse.matches_reference.float32.bf16_coarse", message=big.replace("3.0 vs", "9.0 vs"), ratio=99.0,
             trigger="any input", engine_function=_site("coarse")),  # precision: extreme regime
          _f("wide.matches_reference.float64.r", message=big.replace("3.0 vs", "9.0 vs"), ratio=99.0,
             trigger="any input", engine_function=_site("wide")),  # precision: a dtype never used
          _f("write.non_destructive.float32.r", message="input 'logits' mutated during forward",
             engine_function=_site("write"))]
    doc = annotate({"engine": {"engine_dtypes": {"wide": ["float32"]},
                               "variant_triggers": {"drgrpo": {"drgrpo+vectorized": drgrpo}}}, "findings": fs})
    order = [(d["ops"][0], d["severity"], d["reach"]) for d in doc["defects"]]
    assert order == [("geo", "training", 3), ("drgrpo", "training", 3), ("anyin", "training", 2),
                     ("edge", "training", 1), ("write", "destructive", 2), ("coarse", "precision", 0),
                     ("wide", "precision", 0)], order
    # --fail-on still ties training and destructive
    write = next(f for f in doc["findings"] if f["op"] == "write")
    assert fails(write, "training") and fails(write)


def test_the_stated_ranking_rule_is_the_order():
    from rlconform.harness.report.triage_md import ORDER_NOTE

    assert "training, destructive, logging, robustness, precision, in that order" in ORDER_NOTE
    assert ORDER_NOTE.index("reachability") < ORDER_NOTE.index("size of the effect")
    triage_doc = (ROOT / "docs" / "triage.md").read_text()
    assert "ranked by severity (training, destructive, logging, robustness, precision, in that order), then by\n*reachability*" in triage_doc


def test_every_extreme_regime_is_a_catalog_regime_and_the_logits_strategy_agrees():
    """The realism of a regime lives with the regimes (core.regimes): each extreme one names a regime the
    catalog draws, and the logits strategy's regimes are realistic or extreme exactly as strategies says."""
    from rlconform.harness.catalog.ops import OPS
    from rlconform.harness.core.regimes import EXTREME_REGIMES, data_regime, realistic
    from rlconform.harness.core.strategies import REALISTIC_LOGITS
    from rlconform.harness.families.token_stats import LOGITS_REGIMES

    drawn = {data_regime(r) for op in OPS.values() for r in (op.regimes or {})}
    assert set(EXTREME_REGIMES) <= drawn
    assert {r for r in LOGITS_REGIMES if realistic(r)} == set(REALISTIC_LOGITS)


def test_a_side_label_keeps_whole_clauses_and_a_mask_invariant_base_reads_unmasked():
    """A numbers cell's side label is cut at a clause (never mid-word, "…" after it); the base run of a
    mask_invariant clause is the example as drawn, whatever its own label holds."""
    from rlconform.harness.report.triage import LABEL_WIDTH, _sides

    comp, left, right = _sides(
        "metric pg_loss, masked advantages and rollout log-probs = nan, padding ids changed = nan = ",
        " vs metric pg_loss, token-mean-with-tis, T 1.0, entropy_coeff 0.0, 2-row micro-batches, nnz [3] = ",
        "mask_invariant")
    assert (comp, left, right) == ("metric pg_loss", "masked advantages and rollout log-probs = nan …", "unmasked")
    assert len(left) <= LABEL_WIDTH + 2
    _, a, b = _sides("value, " + "word " * 20 + "= ", " vs value = ", "partition_invariant")
    assert a.endswith(" …") and "wor …" not in a and b == "unpartitioned"

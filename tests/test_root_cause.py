"""A defect is a root cause in the engine and severity is by impact: the engine site of a
finding (declared by the adapter or found in its closure, file:line relative to the engine's top package),
the deepest engine frame of a crash, the trigger read from the shrunk input, the grouping of findings into
defects, severities and their order, and the worker recording all of it in a real ``rlconform check``."""

from __future__ import annotations

import json
import math
import sys
import textwrap
import types

import forked_cli
import numpy as np
import pytest

from rlconform.harness.catalog.engine_site import calls, crash_frame, engine_callables, finding_site, site
from rlconform.harness.core import failure, triggers
from rlconform.harness.core.engine_frames import deepest_frame, frame_text
from rlconform.harness.report.legacy_failure import clauses_from_message as record
from rlconform.harness.report.severity import SEVERITIES, classify, fails
from rlconform.harness.report.triage import annotate, defects

ENGINE = textwrap.dedent('''
    import torch

    def _inner_divide(x, n):
        if n % 2 == 1:  # a planted bug: any odd number of valid tokens
            raise ZeroDivisionError("odd token count")
        return x / n

    def masked_mean(values, mask):
        return _inner_divide((values * mask).sum(), int(mask.sum()))

    def masked_sum(values, mask):
        return _inner_divide((values * mask).sum() * 2, int(mask.sum()))

    def entropy(logits):
        p = torch.softmax(logits, -1)
        return -(p * torch.log_softmax(logits, -1)).sum(-1) * 1.1
''')


@pytest.fixture()
def fake_engine(tmp_path, monkeypatch):
    """A package ``fakeeng`` (``fakeeng/algos.py``) on sys.path: an engine outside rlconform."""
    pkg = tmp_path / "src" / "fakeeng"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "algos.py").write_text(ENGINE)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    for name in [m for m in sys.modules if m.startswith("fakeeng")]:
        del sys.modules[name]
    import fakeeng.algos

    return fakeeng.algos


def test_site_of_a_declared_and_of_a_closure_adapter(fake_engine):
    @calls(fake_engine.masked_mean)
    def declared(values, mask):
        return fake_engine.masked_mean(values, mask)

    fn = fake_engine.masked_sum

    def closure(values, mask):
        return fn(values, mask)

    assert engine_callables(declared) == [fake_engine.masked_mean]
    assert engine_callables(closure) == [fake_engine.masked_sum]
    s = site(engine_callables(declared)[0])
    # relative to the directory holding the top package: a fork's checkout gives its own path and line
    assert s == {"function": "masked_mean", "module": "fakeeng.algos", "file": "fakeeng/algos.py", "line": 9}
    assert engine_callables(triggers.trigger) == []  # rlconform's own code (a mutant, the reference) is no site


@pytest.mark.engines
def test_verl_sites_name_the_engine_function():
    from rlconform.harness.bindings.load import load_engine

    b = load_engine("verl")
    s, pkgs = finding_site(b, "policy_loss", "partition_invariant", "geo_mean@moderate")
    assert s["function"] == "compute_policy_loss_geo_mean" and s["file"] == "verl/trainer/ppo/core_algos.py"
    assert pkgs == ["verl"]
    import inspect

    import verl.trainer.ppo.core_algos as ca

    src, first = inspect.getsourcelines(inspect.unwrap(ca.compute_policy_loss_geo_mean))
    assert src[0].lstrip().startswith("@")  # registered with a decorator: the site is the def line below it
    assert src[s["line"] - first].lstrip().startswith("def compute_policy_loss_geo_mean")
    # a logged metric of the loss is folded by Metric.aggregate_dp, not computed by the loss function
    m, _ = finding_site(b, "policy_loss", "partition_invariant", "vanilla@moderate", metric=True)
    assert m["function"] == "Metric.aggregate_dp"
    # a mutation after the backward of a thin wrapper of an autograd.Function: that Function's backward
    v, _ = finding_site(b, "vocab_parallel_entropy", "non_destructive", "tp2_moderate",
                        [failure.mutation("logits", "backward", "rank 0 (tp 0): after the backward, input 'logits' "
                                                                "mutated")])
    assert v["function"] == "_VocabParallelEntropy.backward"
    assert v["file"] == "verl/utils/megatron/tensor_parallel.py"
    e, _ = finding_site(b, "outcome_advantage", "matches_reference", "grpo@singleton_groups")
    assert e["function"] == "compute_grpo_outcome_advantage"
    # 's maintainer review: where each metric is folded, and where the mutations are
    assert finding_site(b, "value_loss", "partition_invariant", "token-mean@moderate", metric=True)[0][
        "function"] == "reduce_metrics"
    assert finding_site(b, "dp_metric_all_reduce", "partition_invariant", "dp2_imbalanced", metric=True)[0][
        "function"] == "Metric.aggregate_dp"
    # a policy loss's token fraction folded as a mean of micro-batch means: ppo_loss marks it MEAN (its line is
    # cited), the fold does what it is told; the critic's clip fraction is value_loss's plain float
    pg = [failure.Clause("difference", "micro-batches (nnz) [0, 1]: metric ppo_kl")]
    for op, regime in (("policy_loss", "vanilla@moderate"), ("policy_step_metrics", "token-mean@trainer_batches")):
        s, _ = finding_site(b, op, "partition_invariant", regime, pg, metric=True,
                            trigger="a micro-batch with no valid token")
        assert (s["function"], s["file"]) == ("ppo_loss", "verl/workers/utils/losses.py")
        assert "AggregationType" in s["output_anchor"]
    vf = [failure.Clause("difference", "micro-batches (nnz) [1, 3]: metric vf_clipfrac")]
    s, _ = finding_site(b, "value_loss", "partition_invariant", "token-mean@moderate", vf, metric=True,
                        trigger="more than one micro-batch")
    assert s["function"] == "value_loss" and "vf_clipfrac" in s["output_anchor"]
    # the DP gather and the metric chain of a metric marked MEAN (modelled on actor/pg_clipfrac) are the marking's
    dp = [failure.Clause("difference", "unsharded (DP = 1)")]
    for op, regime in (("dp_metric_all_reduce", "dp2_imbalanced"), ("metric_pipeline", "imbalanced_partitions")):
        assert finding_site(b, op, "partition_invariant", regime, dp, metric=True,
                            trigger="a DP rank with no valid token")[0]["function"] == "ppo_loss"
    # the fold is still the site where no output rule names the marking (metric_statistics' own emitters)
    assert finding_site(b, "metric_statistics", "partition_invariant", "python_values", dp, metric=True,
                        trigger="a micro-batch with no valid token")[0]["function"] == "Metric.aggregate_dp"
    after, _ = finding_site(b, "vocab_parallel_sum_pi_squared", "non_destructive", "tp2_after_entropy",
                            [failure.mutation("logits", "backward", "rank 0 (tp 0): after vocab_parallel_entropy "
                                              "backward, a producer that saved the logits for backward could not "
                                              "backprop", by_op="vocab_parallel_entropy", evidence="saved")])
    assert after == v
    lp, _ = finding_site(b, "vocab_parallel_token_logprobs", "non_destructive", "tp2_moderate",
                         [failure.mutation("logits", "forward", "rank 0 (tp 0): input 'logits' mutated during "
                                           "forward: 42 element(s) changed")])
    assert lp["function"] == "vocab_parallel_log_probs_from_logits"
    assert lp["via"]["function"] == "VocabParallelCrossEntropy.calculate_predicted_logits"
    assert lp["via"]["file"] == "megatron/core/tensor_parallel/cross_entropy.py"


@pytest.mark.engines
def test_skyrl_metric_sites_are_the_worker_fold():
    """SkyRL's policy and value losses log one mean per micro-batch and ``worker_utils.reduce_metrics`` averages
    them: a wrong logged metric is that fold's defect (one row), not five loss functions' (a SkyRL maintainer
    read the cispo row's line, the empty-micro-batch branch of its ratio min / max, as the fault)."""
    from rlconform.harness.bindings.load import load_engine

    b = load_engine("skyrl")
    for op, regime in (("policy_loss", "cispo@moderate"), ("policy_loss", "gspo@moderate"),
                       ("value_loss", "seq-mean-token-mean@moderate")):
        s, _ = finding_site(b, op, "partition_invariant", regime, metric=True)
        assert (s["module"], s["function"]) == ("skyrl.backends.skyrl_train.workers.worker_utils", "reduce_metrics")
        # a wrong loss (not a metric) stays the loss function's
        assert finding_site(b, op, "partition_invariant", regime)[0]["function"] != "reduce_metrics"


def _crash_text(fake_engine, fn):
    import traceback

    import torch

    try:
        fn(torch.ones(2), torch.tensor([1.0, 0.0]))
    except ZeroDivisionError as exc:
        return "".join(traceback.format_exception(exc)), exc
    raise AssertionError("no crash")


def test_deepest_engine_frame_of_a_crash(fake_engine):
    text, exc = _crash_text(fake_engine, fake_engine.masked_mean)
    f = crash_frame([text], ["fakeeng"])
    assert f["function"] == "_inner_divide" and f["file"] == "fakeeng/algos.py" and f["line"] == 6
    assert deepest_frame([text])["function"] == "_inner_divide"  # without packages: outside rlconform/torch
    assert frame_text(exc) == " (engine frame fakeeng/algos.py:6 in _inner_divide)"
    assert f["caller"] == {"function": "masked_mean", "module": "fakeeng.algos", "file": "fakeeng/algos.py",
                           "line": 10}  # the engine frame that called it
    # a contract clause carries the frame as a field; the compact form in its sentence is for the reader only
    from rlconform.harness.core.impl_contract import rank_problem
    from rlconform.harness.run.root_cause import _contract_frame

    clause = rank_problem(2, (2, 3), types.SimpleNamespace(ranks=(2, 3)), exc)
    assert clause.frame == f and _contract_frame([clause], ["fakeeng"]) == f
    assert _contract_frame([clause], ["otherengine"]) is None
    assert deepest_frame(["contract: … raised ZeroDivisionError: x" + frame_text(exc)], ["fakeeng"]) is None


def _finding(fid, *, status="discrepancy", message="", site_=None, frame=None, trig="any input", ratio=20.0, **kw):
    op, prop, dtype, regime = fid.split(".")
    return {"id": fid, "op": op, "property": prop, "dtype": dtype, "regime": regime, "status": status,
            "message": message, "max_ratio": ratio, "max_rel_err": 0.0, "worst_input": kw.pop("inp", "x"),
            "engine_function": site_, "crash_frame": frame, "trigger": trig, **kw}


GEO = {"function": "compute_policy_loss_geo_mean", "module": "verl.trainer.ppo.core_algos",
       "file": "verl/trainer/ppo/core_algos.py", "line": 1928}
VANILLA = dict(GEO, function="compute_policy_loss_vanilla", line=1285)
SCALED = ("micro-batches (nnz) [1, 1]: loss = -1.6660629212856293 vs loss = -0.8330314755439758 at flat index 0 "
          "(reference -0.8330314601438209, allowed difference 2.26e-05)")
HALF = "value: engine 0.5 vs reference 1.0 at flat index 0: abs err 0.5, rel err 0.5, 64 ulp, tolerance 0.0256"


def test_one_root_cause_over_properties_dtypes_is_one_defect_two_causes_two():
    fs = [_finding("policy_loss.partition_invariant.float32.geo_mean@moderate", message=SCALED, site_=GEO,
                   trig="more than one micro-batch"),
          _finding("policy_loss.partition_invariant.bfloat16.geo_mean@moderate", message=SCALED, site_=GEO,
                   trig="more than one micro-batch"),
          # a wrong value under the partition's trigger: that partition's effect, the same defect
          _finding("agg_loss.matches_reference.float32.geo_mean@moderate", message=HALF.replace("value:", "loss:"),
                   site_=GEO, trig="more than one micro-batch", inp="a larger input"),
          # the same kind and trigger in another engine function: another root cause
          _finding("policy_loss.partition_invariant.float32.vanilla@moderate", message=SCALED, site_=VANILLA,
                   trig="more than one micro-batch"),
          # the same function and class under another trigger: not necessary, the same defect
          _finding("policy_loss.partition_invariant.float64.geo_mean@moderate", message=SCALED, site_=GEO,
                   trig="a micro-batch with no valid token")]
    doc = annotate({"findings": fs})
    assert len(doc["defects"]) == 2, [d["id"] for d in doc["defects"]]
    pd = next(d for d in doc["defects"] if d["engine_function"] == GEO)
    assert pd["signature"]["kind"] == "partition dependence" and len(pd["members"]) == 4
    assert pd["dtypes"] == ["bfloat16", "float32", "float64"] and pd["ops"] == ["agg_loss", "policy_loss"]
    assert pd["triggers"] == ["a micro-batch with no valid token", "more than one micro-batch"]
    assert pd["severity"] == "training" and pd["numbers"]["engine"] == -1.6660629212856293
    assert pd["id"] == "verl.trainer.ppo.core_algos.compute_policy_loss_geo_mean.partition-dependence"
    assert math.isinf(pd["effect"])  # a value scaled by the number of micro-batches grows with the configuration


def test_crashes_group_by_their_deepest_engine_frame():
    frame = {"function": "_inner_divide", "module": "fakeeng.algos", "file": "fakeeng/algos.py", "line": 6}
    other = dict(frame, function="_other", line=40)
    msg = "engine raised in masked_mean: ZeroDivisionError: no valid token"
    fs = [_finding("masked_mean.matches_reference.float32.r", status="crash", message=msg, frame=frame,
                   site_=dict(frame, function="masked_mean", line=9), trig="no valid token in the batch"),
          _finding("masked_sum.finite_where_reference_finite.float32.r", status="crash", message=msg, frame=frame,
                   site_=dict(frame, function="masked_sum", line=12), trig="no valid token in the batch"),
          _finding("masked_sum.matches_reference.float64.r", status="crash", message=msg, frame=other,
                   site_=dict(frame, function="masked_sum", line=12), trig="no valid token in the batch")]
    ds = annotate({"findings": fs})["defects"]
    assert len(ds) == 2
    first = next(d for d in ds if d["crash_frame"] == frame)
    assert first["ops"] == ["masked_mean", "masked_sum"] and first["severity"] == "robustness"
    assert first["signature"]["kind"] == "crash:ZeroDivisionError"
    from rlconform.harness.report.triage_md import defect_row

    assert "`_inner_divide` (fakeeng/algos.py:6)" in defect_row(first)


def test_findings_without_an_engine_site_fall_back_to_the_op():
    fs = [_finding("entropy.matches_reference.float32.r", message=HALF, site_=None),
          _finding("entropy.finite_where_reference_finite.bfloat16.r", message=HALF, site_=None),
          _finding("masked_mean.matches_reference.float32.r", message=HALF, site_=None)]
    ds = defects(annotate({"findings": fs})["findings"])
    assert sorted(d["id"] for d in ds) == ["op-entropy.wrong-value", "op-masked_mean.wrong-value"]


def test_severity_by_impact_and_the_dtype_gate():
    metric = ("micro-batches (nnz) [0, 1]: metric ppo_kl = 0.000188 vs metric ppo_kl = 0.000376 at flat index 0 "
              "(reference 0.000376, allowed difference 2.16e-05)")
    assert classify(_finding("policy_loss.partition_invariant.float32.vanilla@moderate", message=metric))[0] == "logging"
    assert classify(_finding("policy_loss.partition_invariant.float32.geo_mean@moderate", message=SCALED))[0] == \
        "training"
    assert classify(_finding("metric_pipeline.matches_reference.float32.r", message=HALF))[0] == "logging"
    assert classify(_finding("entropy.non_destructive.float32.r", message="input 'logits' mutated"))[0] == \
        "destructive"
    crash = _finding("masked_var.matches_reference.float32.r", status="crash", message="engine raised in x: ValueError: y")
    assert classify(crash)[0] == "robustness"
    # only in a dtype the engine never calls the op with: precision (a mutation stays destructive)
    used = {"masked_var": ("float32",), "entropy": ("float32",)}
    sev, why = classify(_finding("masked_var.matches_reference.float64.r", message=HALF), used)
    assert sev == "precision" and "never calls masked_var" in why
    assert classify(_finding("masked_var.matches_reference.float32.r", message=HALF), used)[0] == "training"
    assert classify(_finding("entropy.non_destructive.float64.r", message="input 'logits' mutated"), used)[0] == \
        "destructive"
    doc = annotate({"engine": {"engine_dtypes": used},
                    "findings": [_finding("masked_var.matches_reference.float64.r", message=HALF),
                                 _finding("masked_var.matches_reference.float32.r", message=HALF)]})
    assert [d["severity"] for d in doc["defects"]] == ["training"]  # one cause: the used dtype decides
    assert not fails(_finding("x.matches_reference.float64.r", message=HALF, severity="precision"))


def test_defects_order_by_severity_then_effect():
    small = "loss: engine 1.02 vs reference 1.0 at flat index 0: abs err 0.02, rel err 0.02, tolerance 1e-3"
    big = "loss: engine 3.0 vs reference 1.0 at flat index 0: abs err 2, rel err 2, tolerance 1e-3"
    fs = [_finding("a.matches_reference.float32.r", message=small, site_=GEO),
          _finding("b.matches_reference.float32.r", message=big, site_=VANILLA),
          _finding("c.matches_reference.float32.r", message=HALF, ratio=2.0),  # precision
          _finding("d.finite_where_reference_finite.float32.r",
                   message="value: engine nan where the reference is finite (0.0) at flat index 0")]
    ds = annotate({"findings": fs})["defects"]
    assert [d["ops"][0] for d in ds] == ["b", "a", "d", "c"]
    assert [d["severity"] for d in ds] == ["training", "training", "robustness", "precision"]
    assert set(SEVERITIES) == {"training", "destructive", "logging", "robustness", "precision"}


class _Case:
    def __init__(self, op, prop, dtype, regime, inputs):
        self.op, self.property, self.dtype, self.regime, self.inputs = op, prop, dtype, regime, inputs


def _parted(label: str) -> list:
    """A failing difference clause of a run whose label names its partition."""
    return [failure.Clause("difference", label, "value", engine=1.0, other=2.0, other_label="x", exact=1.0,
                           index=0, tolerance=0.1, ratio=10.0)]


def test_triggers_in_a_maintainers_words():
    T = triggers.trigger
    m = np.array([[True, True], [False, False]])
    assert T("masked_mean", "matches_reference", "float32", "r", {"mask": m}) == "a row with no valid token"
    assert T("masked_var", "matches_reference", "float32", "r", {"mask": np.array([[True, False]])}) == \
        "≤ 1 valid token in the batch"
    assert T("entropy", "matches_reference", "float32", "r", {"logits": np.array([[0.0, -np.inf]])}, kind="NaN") == \
        "a −inf logit"
    assert T("agg_loss", "mask_invariant", "float32", "r", {"garbage": float("nan"), "mask": m}) == \
        "a masked position holding NaN"
    assert T("policy_loss", "partition_invariant", "float32", "r", {}, _parted("micro-batches (nnz) [0, 1]: x")) == \
        "a micro-batch with no valid token"
    assert T("policy_loss", "partition_invariant", "float32", "r", {}, _parted("micro-batches (nnz) [1, 1]: x")) == \
        "more than one micro-batch"
    assert T("policy_loss", "partition_invariant", "float32", "r", {}, _parted("shards (rows) [[[0, 1]], [[1, 2]]]: x")) \
        == "a different partition"  # row ranges are not token counts
    assert T("outcome_advantage", "matches_reference", "float32", "grpo@r", {"index": np.array([0, 0, 1])}) == \
        "a group of one sample"
    assert T("vocab_parallel_entropy", "matches_reference", "float32", "tp2_moderate",
             {"logits": np.ones((2, 4))}) == "TP > 1"
    assert T("entropy", "matches_reference", "bfloat16", "moderate", {"mask": m}, kind="inexact value") == "bf16 input"
    parts = {"mask": np.array([[True], [False], [True]]), "partitions": [[[[0, 1], [1, 2], [2, 3]]]]}
    assert T("agg_loss", "matches_reference", "float32", "r", parts) == "a micro-batch with no valid token"
    assert T("x", "matches_reference", "float32", "r", {"values": np.ones(3)}) == "any input"


def test_triggers_say_what_the_shrunk_input_shows():
    """A chunked implementation's crash or changed tensor needs more than one chunk (not the TP layout it ran
    in); a NaN from exp of a log-ratio past the dtype's range says so (88.7 in float32), an extreme one
    within it keeps > 20; a ``masked = X:`` clause is the garbage, whatever a family hook read."""
    T = triggers.trigger
    x = {"logits": np.ones((1, 3, 14)), "chunk_size": 1}
    assert T("vocab_parallel_entropy", "matches_reference", "bfloat16", "chunked@tp2_moderate", x,
             kind="crash:RuntimeError") == "more than one chunk (chunk_size 1 < 3 tokens)"
    one = {"logits": np.ones((1, 3, 14)), "chunk_size": 2048}
    assert T("vocab_parallel_entropy", "matches_reference", "bfloat16", "chunked@tp2_moderate", one,
             kind="crash:RuntimeError") == "TP > 1"
    lp = {"old_log_prob": np.array([[0.0, 0.0]]), "log_prob": np.array([[96.0, 0.0]]),
          "response_mask": np.ones((1, 2), bool)}
    assert T("policy_loss", "matches_reference", "float32", "kl_cov@extreme_log_ratios", lp, kind="NaN") == \
        "a log-ratio past exp's float32 range (|log π − log π_old| > 88.7: exp overflows)"
    assert T("policy_loss", "matches_reference", "float32", "kl_cov@extreme_log_ratios", lp, kind="wrong value") == \
        "an extreme log-ratio (|log π − log π_old| > 20)"
    assert triggers.said_trigger(record("masked = nan: kept mask = 1.0 vs kept mask = 0.0 at flat index 0 "
                                        "(reference 1.0, allowed difference 2e-09, 5e+08×)")) == \
        "a masked position holding NaN"


def test_family_trigger_hook_reads_its_own_inputs():
    from rlconform.harness.run.root_cause import trigger_of

    rewards = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.5]])
    mask = np.ones((4, 2), bool)
    equal = _Case("outcome_advantage", "matches_reference", "float32", "grpo@near_constant",
                  {"token_level_rewards": rewards, "response_mask": mask, "index": np.array([0, 0, 1, 1])})
    assert trigger_of(equal, [], "wrong value") == "a group with equal scores"
    single = _Case("outcome_advantage", "matches_reference", "float32", "grpo@singleton_groups",
                   {"token_level_rewards": rewards, "response_mask": mask, "index": np.array([0, 0, 1, 2])})
    assert trigger_of(single, [], "NaN") == "a group of one sample"
    # a family without a hook: the generic reading
    assert trigger_of(_Case("masked_mean", "matches_reference", "float32", "r", {"mask": np.zeros((1, 2), bool)}),
                      [], "NaN") == "no valid token in the batch"


@pytest.mark.cli
def test_check_records_engine_function_crash_frame_and_trigger(tmp_path, fake_engine):
    """End to end through the worker: a binding of the fake engine; its findings carry the engine function
    (file:line under the package), the crash's deepest engine frame and the trigger; report.md names them."""
    binding = tmp_path / "fake_binding.py"
    binding.write_text(textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {str(tmp_path / "src")!r})
        from rlconform.harness.catalog.binding import Binding
        from rlconform.harness.catalog.engine_site import calls
        import fakeeng.algos as A

        @calls(A.masked_mean)
        def masked_mean(values, mask):
            return A.masked_mean(values, mask)

        binding = Binding(name="fakeeng", ops={{"masked_mean": masked_mean, "entropy": A.entropy}},
                          engine_dtypes={{"entropy": ("float32",)}})
    '''))
    out = tmp_path / "out"
    proc = forked_cli.run(["check", "--engine", str(binding),
                           "--out", str(out), "--op", "masked_mean", "--op", "entropy", "--property",
                           "matches_reference", "--dtype", "float32", "--dtype", "float64", "--max-examples", "15",
                           "-q"], timeout=900, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    assert doc["engine"]["engine_dtypes"] == {"entropy": ["float32"]}
    failing = [f for f in doc["findings"] if f.get("severity")]
    crashes = [f for f in failing if f["op"] == "masked_mean" and f["status"] == "crash"]
    assert crashes, [(f["id"], f["status"]) for f in doc["findings"]]
    for f in crashes:
        assert f["engine_function"]["file"] == "fakeeng/algos.py" and f["engine_function"]["function"] == "masked_mean"
        assert f["crash_frame"] == {"function": "_inner_divide", "module": "fakeeng.algos", "file": "fakeeng/algos.py",
                                    "line": 6, "caller": {"function": "masked_mean", "module": "fakeeng.algos",
                                                          "file": "fakeeng/algos.py", "line": 10}}
        assert isinstance(f["trigger"], str) and f["trigger"]
    ent = [f for f in failing if f["op"] == "entropy"]
    assert ent and all(f["engine_function"]["function"] == "entropy" for f in ent)
    by_dtype = {f["dtype"]: f["severity"] for f in ent}
    assert by_dtype.get("float32") == "training" and by_dtype.get("float64", "precision") == "precision"
    crash_defects = [d for d in doc["defects"] if d["signature"]["kind"] == "crash:ZeroDivisionError"]
    assert len(crash_defects) >= 1 and all(d["crash_frame"]["function"] == "_inner_divide" for d in crash_defects)
    md = (out / "report.md").read_text()
    assert "`_inner_divide` (fakeeng/algos.py:6)" in md and "`entropy` (fakeeng/algos.py:" in md


def test_an_older_report_still_renders(tmp_path):
    """reports/skyrl-0.4.0/report.json predates engine functions, triggers and the new severities."""
    import pathlib
    import shutil

    from rlconform.harness.report.writer import rerender

    root = pathlib.Path(__file__).resolve().parents[1]
    shutil.copy(root / "reports/skyrl-0.4.0/report.json", tmp_path / "report.json")
    md, html = rerender(str(tmp_path))
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["defects"] and all(d["severity"] in SEVERITIES for d in doc["defects"])
    assert "| **" in pathlib.Path(md).read_text() and "id=\"defects-table\"" in pathlib.Path(html).read_text()
    assert all(not math.isnan(d["effect"]) for d in doc["defects"])


#: every severity has a mutant whose finding gets it (mutant, op, property, dtype)
SEVERITY_MUTANTS = {
    "training": ("local_denominator", "agg_loss", "matches_reference", "float32"),
    "destructive": ("forward_inplace", "token_logprobs", "non_destructive", "float32"),
    "logging": ("mean_of_shard_means", "metric_pipeline", "matches_reference", "float32"),
    "robustness": ("naive_entropy", "entropy", "finite_where_reference_finite", "float32"),
    "precision": ("chunk_fp32_entropy", "entropy", "matches_reference", "float64"),
}


def test_every_severity_has_a_mutant():
    assert set(SEVERITY_MUTANTS) == set(SEVERITIES)


@pytest.mark.cli
@pytest.mark.parametrize("severity", sorted(SEVERITY_MUTANTS))
def test_mutant_finding_gets_its_severity(severity, tmp_path):
    name, op, prop, dtype = SEVERITY_MUTANTS[severity]
    proc = forked_cli.run(["check", "--engine", f"mutants.{name}",
                           "--op", op, "--property", prop, "--dtype", dtype, "--max-examples", "20", "-q",
                           "-n", "0", "--out", str(tmp_path)], timeout=900)
    # the default --fail-on fails on every severity but precision
    assert proc.returncode == (0 if severity == "precision" else 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / "report.json").read_text())
    sevs = {f.get("severity") for f in doc["findings"] if f["op"] == op and f["property"] == prop}
    assert severity in sevs, sevs
    assert doc["defects"][0]["severity"] == severity


@pytest.mark.engines
def test_a_variants_configuration_is_its_trigger_where_the_binding_declares_it():
    """verl's grpo_vectorized reads only its own ``norm_adv_by_std_in_grpo`` keyword (default True), so Dr. GRPO
    through the trainer's AlgoConfig divides by σ on any input: the binding declares the variant's words, which
    replace ``any input`` (and nothing more specific)."""
    import types

    from rlconform.harness.bindings.verl import VARIANT_TRIGGERS
    from rlconform.harness.run.root_cause import declared_trigger

    b = types.SimpleNamespace(variant_triggers=VARIANT_TRIGGERS)
    words = declared_trigger(b, "outcome_advantage", "drgrpo+vectorized@uneven_groups", "any input")
    assert "norm_adv_by_std_in_grpo=False" in words and "ignores" in words
    assert declared_trigger(b, "outcome_advantage", "drgrpo+vectorized@singleton_groups", "a group of one sample") == \
        "a group of one sample"
    assert declared_trigger(b, "outcome_advantage", "grpo+vectorized@uneven_groups", "any input") == "any input"
    assert declared_trigger(types.SimpleNamespace(), "outcome_advantage", "drgrpo+vectorized@r", "any input") == \
        "any input"


@pytest.mark.engines
def test_an_edge_input_a_configuration_produces_reads_as_that_configuration_and_ranks_with_it():
    """verl's sequence-level rollout rejection zeroes the response mask of every rejected row, and the trainer
    still divides the seq-mean losses by ppo_mini_batch_size: 'a row with no valid token' is then what a
    configuration produces, not an edge input. The binding keys those words by the trigger; they replace it
    for every variant of the ops it names, and rank at the configuration level."""
    import types

    from rlconform.harness.bindings.verl import VARIANT_TRIGGERS
    from rlconform.harness.report.triage import REACH, reach
    from rlconform.harness.run.root_cause import declared_trigger

    b = types.SimpleNamespace(variant_triggers=VARIANT_TRIGGERS)
    words = declared_trigger(b, "agg_loss", "seq-mean-token-sum@imbalanced_partitions", "a row with no valid token")
    assert words.startswith("a row with no valid token, as sequence-level rollout rejection") and \
        "ppo_mini_batch_size" in words
    assert declared_trigger(b, "agg_loss", "seq-mean-token-sum@moderate", "any input") == "any input"
    assert declared_trigger(b, "agg_loss", "token-mean@moderate", "a masked position holding NaN") == \
        "a masked position holding NaN"
    assert declared_trigger(b, "outcome_advantage", "grpo@r", "a row with no valid token") == "a row with no valid token"
    finding = {"op": "agg_loss", "dtype": "float32", "regime": "seq-mean-token-sum@imbalanced_partitions",
               "trigger": words}
    configs = {w for v in VARIANT_TRIGGERS.values() for w in v.values()}
    assert REACH[reach(finding, {"agg_loss": ("float32",)}, configs)] == "every step of a configuration"
    assert REACH[reach(dict(finding, trigger="a row with no valid token"), {"agg_loss": ("float32",)}, configs)] == \
        "an edge input"


@pytest.mark.engines
def test_skyrl_metric_sites_name_the_reducer_that_folds_them():
    """SkyRL's logged metrics: a mean of micro-batch means is ``worker_utils.reduce_metrics``' (so is a value
    it prints and drops), a mean of DP-rank means ``all_reduce_metrics``', a min that sees masked zeros the
    emitter's (``compute_minibatch_rollout_logprob_diff_metrics``); read from value, partition and lost-metric
    clauses alike (:func:`output_labels`)."""
    from rlconform.harness.bindings.skyrl import WORKER_UTILS, _skyrl, binding
    from rlconform.harness.catalog.engine_site import output_labels, output_site

    _skyrl(WORKER_UTILS)  # as running the op does: SkyRL imports through the binding's shim

    part = ("policy/minibatch_rollout_logprobs_abs_diff_mean (mean), shards (nnz) [[[0, 1]]] = 2.06e-05 vs "
            "policy/minibatch_rollout_logprobs_abs_diff_mean (mean), shards (nnz) [[[1]]] = 4.13e-05 at flat index 0 "
            "(reference 4.13e-05, allowed difference 2e-05, 21×)")
    lost = ("emitted key 'minibatch_rollout_logprobs_abs_diff_max' was printed instead of logged ('Metrics for key "
            "minibatch_rollout_logprobs_abs_diff_max are not all numbers: [tensor(0.0409)]')")
    low = ("policy/minibatch_rollout_logprobs_abs_diff_min (min), shards (nnz) [[[1]]]: engine 0.0 vs reference 1.0 at "
           "flat index 0: abs err 1, rel err 1, 128 ulp, tolerance 0.0256")
    dp = ("dp2: DP rank 0, tokens per DP rank [1, 0]: engine 0.5 vs reference 1.0 at flat index 0: abs err 0.5, "
          "rel err 0.5, 64 ulp, tolerance 0.0256")
    assert output_labels(record(part))[0].startswith("policy/minibatch_rollout_logprobs_abs_diff_mean (mean)")
    assert output_labels(record(lost)) == ["lost: minibatch_rollout_logprobs_abs_diff_max"]
    # every key dropped (numpy values): the min / max among them are lost by the fold, not computed wrong by the
    # emitter (the row once led with the emitter's line and a binding-named key)
    dropped = "\n".join(f"policy/{k} ({s}) missing from the final dict [] (shards (nnz) [[[0]]])" for k, s in (
        ("token_sum_loss", "sum"), ("minibatch_rollout_logprobs_abs_diff_min", "min"), ("response_length_min", "len_min")))

    def fn(op, msg, trig):
        return (output_site(binding, op, record(msg), trig) or {}).get("function")

    assert fn("metric_statistics", part, "a micro-batch with no valid token") == "reduce_metrics"
    assert fn("metric_statistics", lost, "a micro-batch with no valid token") == "reduce_metrics"
    assert fn("metric_statistics", dropped, "a micro-batch with no valid token") == "reduce_metrics"
    lengths = low.replace("minibatch_rollout_logprobs_abs_diff_min (min)", "response_length_min (len_min)")
    assert fn("metric_statistics", lengths, "a row with no valid token") == "reduce_metrics"  # the binding's idiom
    assert fn("metric_statistics", low, "a row with no valid token") == "compute_minibatch_rollout_logprob_diff_metrics"
    assert fn("metric_statistics", part, "a DP rank with no valid token") == "all_reduce_metrics"
    assert fn("dp_metric_all_reduce", dp, "a DP rank with no valid token") == "all_reduce_metrics"


@pytest.mark.engines
def test_verl_policy_losses_record_the_mode_they_call_agg_loss_in():
    """verl's binding passes loss_agg_mode="token-mean" (SAPO forces seq-mean-token-mean): the engine site of
    a policy-loss finding records it (``calls_variant``), which the callee fold reads; value_loss declares none."""
    from rlconform.harness.bindings.verl import binding
    from rlconform.harness.catalog.engine_site import calls_variant, finding_site

    assert calls_variant(binding, "policy_loss", "gspo@moderate") == "token-mean"
    assert calls_variant(binding, "policy_loss", "sapo@moderate") == "seq-mean-token-mean"
    assert calls_variant(binding, "value_loss", "token-mean@moderate") is None
    s, _ = finding_site(binding, "policy_loss", "mask_invariant", "gspo@moderate",
                        record("masked = nan: loss = nan vs loss = 1.0 at flat index 0 (reference 1.0, allowed "
                               "difference 1e-05, inf×)"), trigger="a masked position holding NaN")
    assert s["function"] == "compute_policy_loss_gspo" and s["calls_variant"] == "token-mean"


MASKED_NAN = ("masked = nan: kept mask = 1.0 vs kept mask = 0.0 at flat index 0 (reference 1.0, allowed "
              "difference 2e-09, 5e+08×)")
OFF_POLICY = {"function": "compute_off_policy_correction", "file": "skyrl/off_policy_correction_utils.py",
              "module": "skyrl.backends.skyrl_train.utils.off_policy_correction_utils", "line": 40}


def test_a_masked_value_that_moves_a_valid_result_is_its_own_kind_not_a_partition_dependence(tmp_path):
    """``mask_invariant`` beyond a wrong value's thresholds is a *masked-value dependence* (what the loss mask
    hides reached a valid result), not a partition dependence (a SkyRL maintainer read "partition dependence ·
    a masked position holding NaN" as nonsense); a wrong value of the same function under the same trigger
    joins it; a ledger line written before, with the old kind, still matches it."""
    from rlconform.harness.report.triage import kind
    from rlconform.harness.report.xfails import parse_ledger

    masked = _finding("rollout_rejection_mask.mask_invariant.float32.token_k1@moderate", message=MASKED_NAN,
                      site_=OFF_POLICY, trig="a masked position holding NaN")
    wrong = _finding("rollout_rejection_mask.matches_reference.float32.token_k1@moderate",
                     message=HALF.replace("value:", "kept mask:"), site_=OFF_POLICY,
                     trig="a masked position holding NaN", inp="a larger input")
    assert kind(masked) == "masked-value dependence" and kind(wrong) == "wrong value"
    doc = annotate({"findings": [masked, wrong]})
    assert [d["signature"]["kind"] for d in doc["defects"]] == ["masked-value dependence"]
    assert len(doc["defects"][0]["members"]) == 2
    # partition_invariant keeps its kind
    assert kind(dict(masked, property="partition_invariant", message=SCALED)) == "partition dependence"
    where = f"{OFF_POLICY['module']}.{OFF_POLICY['function']}"
    ledgers = {}
    for name, k in (("old", "partition dependence"), ("new", "masked-value dependence")):
        (tmp_path / name).write_text(f"defect {where} | {k} | rollout_rejection_mask.matches_reference  # r\n")
        ledgers[name] = parse_ledger(str(tmp_path / name))
    assert ledgers["old"].match(masked) is not None and ledgers["new"].match(masked) is not None
    assert ledgers["new"].match(dict(masked, engine_function=VANILLA)) is None


@pytest.mark.engines
def test_a_wrong_metric_is_its_folds_a_nan_or_rounded_one_its_emitters():
    """A logged metric wrong by a mean of micro-batch means is located at the fold (SkyRL's
    ``worker_utils.reduce_metrics``); one that is NaN (SkyRL's ``importance_sampling_loss`` logs the mean of an
    empty selection: a fold of finite values is finite) or off by rounding on one partition (a bf16 ratio) at
    the loss that emits it."""
    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.run.root_cause import fields

    b = load_engine("skyrl")
    base = {"op": "policy_loss", "regime": "importance_sampling@moderate", "status": "discrepancy"}
    parted = dict(base, property="partition_invariant", message=(
        "micro-batches (nnz) [0, 1]: metric ratio_mean = 0.5 vs metric ratio_mean = 1.0 at flat index 0 "
        "(reference 1.0, allowed difference 2e-05, 2.5e+04×)"))
    nan = dict(base, property="partition_invariant", message=(
        "micro-batches (nnz) [0, 1]: metric ratio_mean = nan vs metric ratio_mean = 1.0 at flat index 0 "
        "(reference 1.0, allowed difference 2e-05, inf×)"))
    rounded = dict(base, property="matches_reference", dtype="bfloat16", max_ratio=3.0, message=(
        "metric ratio_mean: engine 1.0078125 vs reference 1.0 at flat index 0: abs err 0.0078, rel err 0.0078, "
        "1 ulp, tolerance 0.0026"))

    def fn(f):
        return fields(b, f, None, None)["engine_function"]["function"]

    assert fn(parted) == "reduce_metrics"
    assert fn(nan) == fn(rounded) == "importance_sampling_loss"

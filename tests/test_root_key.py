"""The root key of a defect: a crash is its deepest frame and exception type whatever the
trigger; a trigger that is not necessary does not split a function's defect; a finding joins the defect of a
callee that fails the same way; rounding is one defect per engine module; the id is a function of the key;
impact first (the committed verl report's geo_mean scaling and TP-entropy backward mutation lead); the
report.md sections come in order."""

from __future__ import annotations

import copy
import json
import pathlib

import pytest

from rlconform.harness.core import failure
from rlconform.harness.report.legacy_failure import clauses_from_message
from rlconform.harness.report.severity import RANK, SEVERITIES
from rlconform.harness.report.triage import annotate, defect_id

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE = "verl.trainer.ppo.core_algos"
AGG = {"function": "agg_loss", "module": CORE, "file": "verl/trainer/ppo/core_algos.py", "line": 1140}
GSPO = dict(AGG, function="compute_policy_loss_gspo", line=1545, calls=[f"{CORE}.agg_loss"])
VAR = {"function": "masked_var", "module": "verl.utils.torch_functional", "file": "verl/utils/torch_functional.py",
       "line": 323}
NAN = "loss: engine nan where the reference is finite (0.5) at flat index 0"
HALF = "loss: engine 0.5 vs reference 1.0 at flat index 0: abs err 0.5, rel err 0.5, tolerance 1e-05"
ROUND = "loss: engine 1.0000001 vs reference 1.0 at flat index 0: abs err 1e-07, rel err 1e-07, tolerance 1e-09"


def _f(fid, message, site=None, frame=None, trig="any input", status="discrepancy", inp="x", ratio=100.0):
    op, prop, dtype, regime = fid.split(".")
    return {"id": fid, "op": op, "property": prop, "dtype": dtype, "regime": regime, "status": status,
            "message": message, "max_ratio": ratio, "max_rel_err": 0.0, "worst_input": inp,
            "engine_function": site, "crash_frame": frame, "trigger": trig}


def test_a_crash_is_its_frame_and_type_whatever_the_trigger():
    msg = "engine raised in gae: ValueError: The sum of the mask is one"
    fs = [_f("gae.matches_reference.float32.padded", msg, site=AGG, frame=VAR, trig="≤ 1 valid token in the batch",
             status="crash", inp="xx"),
          _f("gae.mask_invariant.float32.padded", msg, site=AGG, frame=VAR, trig="a masked position holding NaN",
             status="crash", inp="x"),
          _f("masked_var.matches_reference.float32.padded", msg.replace("gae", "masked_var"), site=VAR, frame=VAR,
             status="crash", inp="xxx")]
    (d,) = annotate({"findings": fs})["defects"]
    assert d["id"] == "verl.utils.torch_functional.masked_var.crash-valueerror" == defect_id(
        "verl.utils.torch_functional.masked_var", "crash:ValueError")
    # the smallest of the most reachable members' (a crash on any input before one on an edge input), informative only
    assert d["trigger"] == "any input"
    assert d["reproducer"]["finding"] == "masked_var.matches_reference.float32.padded" and len(d["triggers"]) == 3
    edge = annotate({"findings": fs[:2]})["defects"][0]  # among edge inputs: the smallest
    assert edge["trigger"] == "a masked position holding NaN" and edge["reproducer"]["finding"] == fs[1]["id"]
    assert d["crash_frame"] == VAR and d["ops"] == ["gae", "masked_var"]


def test_a_finding_joins_the_callee_that_fails_the_same_way_and_only_that():
    fs = [_f("agg_loss.mask_invariant.float32.token-mean@r", NAN, site=AGG, trig="a masked position holding NaN"),
          _f("policy_loss.mask_invariant.float32.gspo@r", NAN, site=GSPO, trig="a masked position holding NaN"),
          # gspo wrong on any input: agg_loss is not wrong there, gspo's own defect
          _f("policy_loss.matches_reference.float32.gspo@r", HALF, site=GSPO)]
    ds = annotate({"findings": fs})["defects"]
    by = {d["id"]: d for d in ds}
    assert set(by) == {f"{CORE}.agg_loss.nan-inf", f"{CORE}.compute_policy_loss_gspo.wrong-value"}
    nan = by[f"{CORE}.agg_loss.nan-inf"]
    assert nan["ops"] == ["agg_loss", "policy_loss"] and nan["engine_function"] == AGG  # located at the callee
    assert "calls" not in nan["engine_function"]
    without_calls = copy.deepcopy(fs)
    without_calls[1]["engine_function"] = {k: v for k, v in GSPO.items() if k != "calls"}
    assert len(annotate({"findings": without_calls})["defects"]) == 3  # nothing known of the calls: not folded


def test_a_finding_follows_its_callee_down_the_chain_to_where_it_fails_first():
    """SkyRL 0.4.0: GAE calls masked_whiten, masked_whiten calls masked_mean; each turns a masked NaN into a NaN.
    GAE's finding joined masked_whiten's defect, then masked_whiten's own finding moved on to masked_mean, and
    a row keyed masked_whiten held GAE alone, shown at GAE's def: it follows masked_whiten to masked_mean."""
    tu = "skyrl.backends.skyrl_train.utils.torch_utils"
    pu = "skyrl.backends.skyrl_train.utils.ppo_utils"
    mean = {"function": "masked_mean", "module": tu, "file": "skyrl/backends/skyrl_train/utils/torch_utils.py",
            "line": 181}
    whiten = {"function": "masked_whiten", "module": pu, "file": "skyrl/backends/skyrl_train/utils/ppo_utils.py",
              "line": 145, "calls": [f"{tu}.masked_mean"]}
    gae = {"function": "compute_gae_advantage_return", "module": pu, "file": whiten["file"], "line": 1313,
           "calls": [f"{pu}.masked_whiten"]}
    trig = "a masked position holding NaN"
    fs = [_f("masked_mean.mask_invariant.float32.padded", NAN, site=mean, trig=trig),
          _f("masked_whiten.mask_invariant.float32.padded", NAN, site=whiten, trig=trig),
          _f("gae.mask_invariant.float32.padded", NAN, site=gae, trig=trig)]
    for order in (fs, fs[::-1]):
        (d,) = annotate({"findings": copy.deepcopy(order)})["defects"]
        assert d["id"] == f"{tu}.masked_mean.nan-inf" and d["engine_function"] == mean
        assert d["ops"] == ["gae", "masked_mean", "masked_whiten"]
    # masked_mean fails only under another trigger: GAE and masked_whiten stop at masked_whiten
    other = copy.deepcopy(fs)
    other[0]["trigger"] = "fp16 overflow"
    ids = {d["id"] for d in annotate({"findings": other})["defects"]}
    assert ids == {f"{tu}.masked_mean.nan-inf", f"{pu}.masked_whiten.nan-inf"}


def test_rounding_is_one_defect_per_engine_module_and_ids_depend_on_the_key_only():
    fs = [_f("policy_loss.matches_reference.bfloat16.gspo@r", ROUND, site=GSPO, ratio=5.0),
          _f("agg_loss.matches_reference.float64.token-mean@r", ROUND, site=AGG, ratio=5.0)]
    (d,) = annotate({"findings": fs})["defects"]
    assert d["id"] == f"{CORE}.rounding" and d["severity"] == "precision" and d["dtypes"] == ["bfloat16", "float64"]
    renamed = [dict(f, id=f["id"].replace("@r", "@other"), trigger="bf16 input") for f in fs]
    assert annotate({"findings": renamed})["defects"][0]["id"] == d["id"]


def test_impact_first_in_the_committed_verl_report():
    doc = annotate(json.loads((ROOT / "reports/verl-0.9.1/report.json").read_text()))
    first = [(d.get("crash_frame") or d["engine_function"] or {}).get("function") for d in doc["defects"][:5]]
    # every step of a configuration first (maintainers' readings): geo_mean scaled by the number of
    # micro-batches, agg_loss's seq-mean counting the rows sequence-level rollout rejection empties, Dr. GRPO
    # through grpo_vectorized ignoring norm_adv_by_std_in_grpo (a report written before engine.variant_triggers
    # were recorded: its key=value trigger)
    assert first[:3] == ["compute_policy_loss_geo_mean", "agg_loss", "compute_grpo_vectorized_outcome_advantage"], \
        first
    assert [d["reach"] for d in doc["defects"][:3]] == [3, 3, 3]
    geo = next(d for d in doc["defects"] if d["engine_function"]["function"] == "compute_policy_loss_geo_mean")
    assert geo["severity"] == "training" and geo["signature"]["kind"] == "partition dependence"
    ranks = [RANK[d["severity"]] for d in doc["defects"]]  # training & destructive, logging, robustness, precision
    assert ranks == sorted(ranks)
    order = [SEVERITIES.index(d["severity"]) for d in doc["defects"]]  # training listed before destructive
    assert order == sorted(order)
    # the TP entropy backward's write into the logits it saved is a declared precondition of verl's (its only
    # caller clones the logits and computes Σπ² first), checked as declared in the
    # installed source: its findings are under "Conventions and guards", never a defect row
    declared = {d["name"]: d for d in doc["engine"]["declared"]}
    write = declared["entropy_backward_writes_logits"]
    assert write["writer"] == "_VocabParallelEntropy.backward" and write["holds"] is True, write
    shown = [f for f in doc["findings"] if f.get("declared_write") == "entropy_backward_writes_logits"]
    assert shown and not any(f.get("severity") for f in shown)
    members = {m for d in doc["defects"] for m in d["members"]}
    assert not members & {f["id"] for f in shown}
    assert not any((d["engine_function"] or {}).get("function") == "_VocabParallelEntropy.backward"
                   for d in doc["defects"])
    assert all(d["engine_function"] or d["crash_frame"] for d in doc["defects"]
               if not d["id"].startswith("op-")), "every located defect names an engine function"


def test_report_md_sections_in_order(tmp_path):
    from rlconform.harness.report.writer import rerender

    doc = json.loads((ROOT / "reports/verl-0.9.1/report.json").read_text())
    (tmp_path / "report.json").write_text(json.dumps(doc))
    rerender(str(tmp_path))
    md = (tmp_path / "report.md").read_text()
    from rlconform.harness.report.writer import MARKDOWN_LIMIT

    assert len(md) <= MARKDOWN_LIMIT  # the coverage section at the end is inside the comment's budget too
    heads = [ln for ln in md.splitlines() if ln.startswith("#") and not ln.startswith("####")]
    names = [h.lstrip("# ").split(" (")[0] for h in heads]  # the sections; "####" are parts of one
    assert "#### Precision:" in md.split("### Conventions", 1)[0]
    assert [n for n in names[1:]] == [
        "Defects", "Conventions and guards", "All failing findings", "Coverage of the engine's numerics"]
    defects_part = md.split("### Defects", 1)[1].split("### Conventions", 1)[0]
    table = [ln for ln in defects_part.split("#### Precision")[0].splitlines() if ln.startswith("| **")]
    assert table and not any(ln.startswith("| **precision**") for ln in table)  # precision rows: their own table
    assert "Ranked by severity" in defects_part and "reachability" in defects_part  # the order, said where read
    body = md.split("### All failing findings", 1)[1].split("###", 1)[0]
    assert "| status | op | property |" in body  # the heading holds the findings table, never an empty section
    page = (tmp_path / "report.html").read_text()
    assert page.index("id=\"defects-table\"") < page.index("<h2 id=\"conventions\">") < page.index("findings that do not pass")


def test_an_unavailable_op_is_no_defect():
    """An op the engine does not provide (an import failure) is one entry of the report's
    unavailable list, never a defect per finding nor a row of the defects table."""
    gone = "op entropy unavailable: ModuleNotFoundError: No module named 'verl.utils.kernel'"
    fs = [_f(f"entropy.matches_reference.{d}.moderate", gone, status="unavailable") for d in ("float32", "bfloat16")]
    fs.append(_f("agg_loss.matches_reference.float32.token-mean@r", HALF, site=AGG))
    doc = annotate({"findings": fs})
    assert [d["id"] for d in doc["defects"]] == [f"{CORE}.agg_loss.wrong-value"]


def test_the_counts_line_adds_up_to_the_table():
    """The header counts each defect's findings under the defect's severity, as its row does (a row mixing a
    training member with precision ones is one training defect of all its findings)."""
    from rlconform.harness.report.triage_md import counts_line

    fs = [_f("agg_loss.matches_reference.float32.token-mean@r", HALF, site=AGG),
          _f("agg_loss.matches_reference.bfloat16.token-mean@r", HALF, site=AGG),
          _f("agg_loss.mask_invariant.float32.token-mean@r", NAN, site=AGG, trig="a masked position holding NaN")]
    doc = annotate({"findings": fs})
    rows = {d["severity"]: len(d["members"]) for d in doc["defects"]}
    line = counts_line(doc)
    for sev, n in rows.items():
        assert f"{sev} ({sum(len(d['members']) for d in doc['defects'] if d['severity'] == sev)} findings)" in line
    assert sum(rows.values()) == 3, (rows, line)


def test_the_header_and_report_json_counts_are_one_computation():
    """Maintainer's item 7: report.md's header said 95/30/49/102/79 findings per severity where report.json's
    triage said 59/30/23/65/190 (each finding's own severity): both are severity_counts of the defects now."""
    from rlconform.harness.report.triage_md import counts_line

    doc = annotate(json.loads((ROOT / "reports/verl-0.9.1/report.json").read_text()))
    t = doc["triage"]
    line = counts_line(doc)
    for sev, n in t["findings"].items():
        if t["defects"][sev]:
            assert f"{t['defects'][sev]} {sev} ({n} findings)" in line, (sev, n, line)
    assert sum(t["findings"].values()) == sum(len(d["members"]) for d in doc["defects"])
    assert sum(t["defects"].values()) == len(doc["defects"])


METRIC = {"function": "Metric.aggregate_dp", "module": "verl.utils.metric.utils", "file": "verl/utils/metric/utils.py",
          "line": 139}
BACKWARD = {"function": "_VocabParallelEntropy.backward", "module": "verl.utils.megatron.tensor_parallel",
            "file": "verl/utils/megatron/tensor_parallel.py", "line": 130}
SPS = {"function": "vocab_parallel_sum_pi_squared", "module": "verl.utils.megatron.tensor_parallel",
       "file": "verl/utils/megatron/tensor_parallel.py", "line": 174}
KL = ("micro-batches (nnz) [0, 1]: metric ppo_kl = -0.000435 vs metric ppo_kl = -0.00087 at flat index 0 "
      "(reference -0.00087, allowed difference 2.06e-05, 21.2×)")
GEO_SCALED = ("micro-batches (nnz) [1, 1]: loss = -1.666 vs loss = -0.833 at flat index 0 (reference -0.833, "
              "allowed difference 2.45e-05, 3.4e+04×)")


def test_a_metric_partition_dependence_is_its_aggregator_and_a_loss_one_stays_apart():
    """Maintainer's error 1: ppo_kl of seven policy-loss variants, verl's metric pipeline and the DP
    gather are one cause (a mean of shard means in Metric.aggregate_dp, where the worker records the metric's
    site), whatever the trigger of the wrong values; geo_mean's loss scaled by the micro-batches is its own."""
    geo = dict(AGG, function="compute_policy_loss_geo_mean", line=1929)
    fs = [_f(f"policy_loss.partition_invariant.float32.{v}@moderate", KL, site=METRIC,
             trig="a micro-batch with no valid token") for v in ("cispo", "vanilla", "gspo")]
    fs += [_f("dp_metric_all_reduce.matches_reference.float32.dp2_imbalanced",
              "dp2: DP rank 0, tokens per DP rank [1, 0]: engine -6.6e-05 vs reference -0.000132 at flat index 0: "
              "abs err 6.6e-05, rel err 0.5, tolerance 1e-05", site=METRIC, trig="a micro-batch with no valid token"),
           _f("metric_statistics.matches_reference.float32.large_counts",
              "actor/x/mean (len_mean), shards (rows) [[[[0, 2]], [[2, 3]]]], 3 tokens: engine 2.3e6 vs reference "
              "2.4e6 at flat index 0: abs err 1e5, rel err 0.04, tolerance 1", site=METRIC),
           _f("policy_loss.partition_invariant.float32.geo_mean@moderate", GEO_SCALED, site=geo,
              trig="more than one micro-batch")]
    ds = annotate({"findings": fs})["defects"]
    by = {d["id"]: d for d in ds}
    assert set(by) == {"verl.utils.metric.utils.Metric.aggregate_dp.partition-dependence",
                       f"{CORE}.compute_policy_loss_geo_mean.partition-dependence"}
    assert by["verl.utils.metric.utils.Metric.aggregate_dp.partition-dependence"]["severity"] == "logging"
    assert len(by["verl.utils.metric.utils.Metric.aggregate_dp.partition-dependence"]["members"]) == 5
    assert ds[0]["id"].endswith("geo_mean.partition-dependence") and ds[0]["severity"] == "training"
    # the DP finding's trigger is read from its message: a DP rank, not a micro-batch, holds no valid token
    assert "a DP rank with no valid token" in by["verl.utils.metric.utils.Metric.aggregate_dp.partition-dependence"][
        "triggers"]


def test_a_mutation_seen_after_another_ops_backward_is_that_backward():
    """Maintainer's error 2: sum_pi_squared run on logits that the entropy backward wrote into is the entropy
    backward's mutation, one row; the card says what changed."""
    after = ("rank 0 (tp 0): after vocab_parallel_entropy backward, a producer that saved the logits for backward "
             "could not backprop: ... is at version 2; expected version 0 instead.")
    own = ("rank 0 (tp 0): after the backward, a producer that saved the logits for backward could not backprop: "
           "... is at version 2; expected version 0 instead.")
    fs = [_f("vocab_parallel_entropy.non_destructive.float32.tp2_moderate", own, site=BACKWARD),
          _f("vocab_parallel_sum_pi_squared.non_destructive.float32.tp2_after_entropy", after, site=SPS)]
    (d,) = annotate({"findings": fs})["defects"]
    assert d["engine_function"]["function"] == "_VocabParallelEntropy.backward" and len(d["members"]) == 2
    from rlconform.harness.report.triage_md import defect_row

    assert "version 0 → 2" in defect_row(d)


def test_triggers_name_the_narrowest_shared_condition():
    """Maintainer's error 4: numpy scalars, not an empty micro-batch, crash Metric.append; a failure seen
    only in bf16 / fp16 does not read "any input"."""
    append = {"function": "Metric.append", "module": "verl.utils.metric.utils", "file": "f.py", "line": 103}
    crash = "engine raised in metric_statistics.wrap: ValueError: Unsupported value type: <class 'numpy.float32'>"
    ent = dict(AGG, function="entropy_from_logits")
    fs = [_f("metric_statistics.matches_reference.float32.numpy_values", crash, site=METRIC, frame=append,
             status="crash", trig="a micro-batch with no valid token"),
          _f("entropy.matches_reference.bfloat16.bf16_coarse", HALF, site=ent),
          _f("entropy.matches_reference.float16.bf16_coarse", HALF, site=ent)]
    by = {d["id"]: d for d in annotate({"findings": fs})["defects"]}
    assert by["verl.utils.metric.utils.Metric.append.crash-valueerror"]["trigger"] == "numpy scalar values"
    assert by[f"{CORE}.entropy_from_logits.wrong-value"]["trigger"] == "bf16 or fp16 input, large logits"


def test_bf16_rounding_of_an_extreme_input_is_precision_and_a_real_bf16_defect_stays_training():
    """Maintainer's error 5: exp of a ±20 log-ratio in bf16 (2.60e8 vs 2.46e8: 5.8 % ≤ 20·2⁻⁸) is rounding of
    the inputs, folded into the module's rounding row; entropy computed in bf16 (−0.459 where fp32 gives 0)
    and an error beyond the bound on the same regime stay wrong values, precision on these extreme regimes and
    training on a realistic one."""
    geo = dict(AGG, function="compute_policy_loss_geo_mean", line=1929)
    clip = dict(AGG, function="compute_policy_loss_clip_cov", line=1744)
    ext = ("loss: engine 259639184.0 vs reference 245821441.1 at flat index 0: abs err 1.38e+07, rel err 0.0562, "
           "tolerance 2.83e+03")
    far = "loss: engine 359639184.0 vs reference 245821441.1 at flat index 0: abs err 1.1e+08, rel err 0.46, tolerance 2.83e+03"
    ent = dict(AGG, function="entropy_from_logits")
    fs = [_f("policy_loss.matches_reference.bfloat16.geo_mean@extreme_log_ratios", ext, site=geo),
          _f("policy_loss.matches_reference.bfloat16.clip_cov@extreme_log_ratios", ext, site=clip),
          _f("policy_loss.matches_reference.bfloat16.kl_cov@extreme_log_ratios", far, site=dict(clip, function="k")),
          _f("entropy.matches_reference.bfloat16.bf16_coarse",
             "gradient: engine -0.458984375 vs reference 0.5 at flat index 0: abs err 0.959, rel err 1.9, tolerance 0.02",
             site=ent)]
    by = {d["id"]: d for d in annotate({"findings": fs})["defects"]}
    assert by[f"{CORE}.rounding"]["severity"] == "precision" and len(by[f"{CORE}.rounding"]["members"]) == 2
    # beyond the bound it stays a wrong value (its own row), and so does bf16 entropy on logits of 256 — but
    # both regimes are extreme, no training input: precision; on a realistic
    # regime the same values are training
    assert by[f"{CORE}.k.wrong-value"]["severity"] == "precision"
    assert by[f"{CORE}.entropy_from_logits.wrong-value"]["severity"] == "precision"
    real = [dict(f, id=f["id"].split(".")[0] + ".matches_reference.bfloat16.moderate", regime="moderate")
            for f in fs[2:]]
    by = {d["id"]: d for d in annotate({"findings": real})["defects"]}
    assert by[f"{CORE}.k.wrong-value"]["severity"] == "training"
    assert by[f"{CORE}.entropy_from_logits.wrong-value"]["severity"] == "training"


def test_numbers_show_the_digits_that_differ_and_the_relative_error():
    """Maintainer's error 6: "-0.0772241 vs -0.0772241" tells nothing."""
    from rlconform.harness.report.triage_md import numbers_cell

    cell = numbers_cell({"numbers": {"engine": -0.07722413, "exact": -0.077224142, "clause": ""}})
    assert cell.startswith("engine -0.07722413 vs exact -0.07722414") and "rel err 1.55e-07" in cell


def test_a_decorated_function_is_located_at_its_def_line(tmp_path, monkeypatch):
    """Maintainer's error 3: the line of a function is its ``def``, not its decorator's."""
    import importlib
    import sys

    from rlconform.harness.catalog.engine_site import site

    (tmp_path / "engine_mod_x.py").write_text("import functools\n\n\ndef reg(name):\n    return lambda f: f\n\n\n"
                                              "@reg(\n    'geo')\ndef loss(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("engine_mod_x")
    try:
        assert site(mod.loss)["line"] == 10
    finally:
        sys.modules.pop("engine_mod_x", None)


@pytest.mark.engines  # the upstream distribution's name is read from the installed megatron-core
def test_a_mutation_deeper_down_names_its_frame(tmp_path, monkeypatch):
    """Maintainer's error 2: verl's vocab_parallel_log_probs_from_logits mutates through Megatron-core's
    cross entropy (``vocab_parallel_logits -= logits_max``): the card names that statement's frame, the root
    key stays verl's function."""
    import importlib
    import sys

    from rlconform.harness.catalog.engine_site import mutation_frame
    from rlconform.harness.report.triage_md import where_cell

    (tmp_path / "engine_mod_y.py").write_text("def inner(y, m):\n    z = y\n    y -= m\n    return y\n\n\n"
                                              "def outer(x):\n    from engine_mod_y import inner\n"
                                              "    return inner(x, 1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("engine_mod_y")
    try:
        via = mutation_frame(mod.outer)
        assert via["function"] == "inner" and via["line"] == 3
    finally:
        sys.modules.pop("engine_mod_y", None)
    site = dict(SPS, function="vocab_parallel_log_probs_from_logits", line=201,
                via={"function": "VocabParallelCrossEntropy.calculate_predicted_logits",
                     "module": "megatron.core.tensor_parallel.cross_entropy",
                     "file": "megatron/core/tensor_parallel/cross_entropy.py", "line": 42})
    (d,) = annotate({"findings": [_f("vocab_parallel_token_logprobs.non_destructive.float32.tp2_moderate",
                                     "input 'logits' mutated during forward: 2 element(s) changed, e.g. [0] 1.0 -> 0.5; "
                                     "_version 0 -> 3", site=site)]})["defects"]
    assert d["id"] == "verl.utils.megatron.tensor_parallel.vocab_parallel_log_probs_from_logits.changes-a-tensor"
    assert where_cell(d).endswith("via `VocabParallelCrossEntropy.calculate_predicted_logits` "
                                  "(megatron/core/tensor_parallel/cross_entropy.py:42) — upstream: megatron-core")
    assert d["upstream"] == "megatron-core"  # the deepest frame is another package's: the fix belongs there


def test_one_entry_point_is_located_at_the_function_of_its_failing_output(tmp_path, monkeypatch):
    """Maintainer's item 1: verl's compute_rollout_correction_and_rejection_mask dispatches to four causes; the
    binding's output_sites locate each failing output (kept mask, per-row metrics, IS metrics) at the function
    computing it, the rule's trigger picks masked_mean's ε tie; removing the rules puts them back in one row."""
    import importlib
    import sys
    import types

    from rlconform.harness.catalog.engine_site import output_site

    (tmp_path / "engine_mod_z.py").write_text("def mask_fn(x):\n    return x\n\n\ndef metrics_fn(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("engine_mod_z")
    try:
        b = types.SimpleNamespace(output_sites={"op": (("^kept mask$", "engine_mod_z:metrics_fn", "ε"),
                                                       ("^kept mask$", "engine_mod_z:mask_fn", ""),
                                                       (r"^metric ", "engine_mod_z:metrics_fn", ""))})
        kept = ("kept mask: engine 1.0 vs reference 0.0 at flat index 0: abs err 1, tolerance 1e-09\n"
                "metric chi2_seq: engine 0.5 vs reference 1.0 at flat index 0: abs err 0.5, tolerance 1e-05")
        metric = "metric chi2_seq: engine 0.5 vs reference 1.0 at flat index 0: abs err 0.5, tolerance 1e-05"
        passing = "metric chi2_seq: engine 0.5 vs reference 0.5 at flat index 0: abs err 0, tolerance 1e-05"
        kept, metric, passing = (clauses_from_message(m) for m in (kept, metric, passing))
        assert output_site(b, "op", kept)["function"] == "mask_fn"
        assert output_site(b, "op", kept, "within ε of a bound")["function"] == "metrics_fn"
        assert output_site(b, "op", metric)["function"] == "metrics_fn"
        assert output_site(b, "op", passing) is None and output_site(b, "other", kept) is None
    finally:
        sys.modules.pop("engine_mod_z", None)


def test_the_rejection_family_names_each_cause():
    """The rejection family's trigger: asymmetric k1 bounds read on the inverse ratio, masked_mean's ε tie, an
    empty row in the per-row metrics, ESS's + 1e-8 on tiny weights; the per-row metrics are logging."""
    import numpy as np

    from rlconform.harness.families.rejection_mask import trigger
    from rlconform.harness.report.severity import classify

    def case(delta, mask, variant):
        d = np.asarray(delta, float)
        return types_case({"log_prob": d - 1.0, "old_log_prob": np.full_like(d, -1.0), "mask": np.asarray(mask),
                           "variant": variant})

    kept = "kept mask: engine 1.0 vs reference 0.0 at flat index 0: abs err 1, tolerance 1e-09"
    K = clauses_from_message(kept)
    far = trigger(case([[0.5596]], [[True]], "token_k1_asym"), K, "wrong value")  # r = 1.75, kept on 1 / r
    assert far.startswith("asymmetric k1") and "near a bound" not in far
    near = trigger(case([[0.4187]], [[True]], "token_k1_asym"), K, "wrong value")  # r = 1.52
    assert near.endswith("near a bound: r = 1.52 vs 1.5"), near
    tie = case([[-0.22314355131466446]], [[True]], "seq_mean_k1")
    assert "masked_mean" in trigger(tie, K, "wrong value")
    row = "metric chi2_seq: engine 0.5 vs reference 1.0 at flat index 0: abs err 0.5, rel err 0.5, tolerance 1e-05"
    assert trigger(case([[0.1, 0.2], [0.0, 0.0]], [[True, True], [False, False]], "token_k1"), clauses_from_message(row),
                   "wrong value").startswith("a row with no valid token")
    ess = "metric is_ess: engine 34.2 vs reference 1.0 at flat index 0: abs err 33.2, rel err 33.2, tolerance 1e-05"
    assert "ESS" in trigger(case([[-25.0, -24.0]], [[True, True]], "token_k3"), clauses_from_message(ess), "wrong value")
    f = {"status": "discrepancy", "op": "rollout_rejection_mask", "property": "matches_reference",
         "dtype": "float32", "message": row, "max_ratio": 1e4}
    assert classify(f)[0] == "logging" and classify(dict(f, message=kept + "\n" + row))[0] == "training"


def types_case(inputs):
    import types

    return types.SimpleNamespace(inputs=inputs, op="rollout_rejection_mask", property="matches_reference",
                                 dtype="float32", regime=f"{inputs['variant']}@moderate")


# ---------------------------------------------------------------- grouping rules
def test_an_inplace_version_crash_joins_the_write_that_caused_it():
    """verl's chunked vocab-parallel entropy: one chunk's backward writes into the logits every chunk's view
    shares, the next chunk's backward finds its saved view at a newer version and autograd raises. The
    crash at ``_VocabParallelEntropy.backward`` is the in-place write's effect: one destructive row, whose
    trigger says what the shrunk input shows (a backward pass). A crash there of another kind stays apart."""
    own = ("rank 0 (tp 0): after the backward, a producer that saved the logits for backward could not backprop: "
           "... is at version 2; expected version 0 instead.\nrank 0 (tp 0): input 'logits' mutated during "
           "backward: 20 element(s) changed, e.g. [33] -0.0287 -> -0.0286; _version 0 -> 2")
    crash = ("engine raised in every input rank its docstring allows: RuntimeError: rank-3 input (1, 3, 14): "
             "RuntimeError: one of the variables needed for gradient computation has been modified by an inplace "
             "operation: [CPUBFloat16Type [1, 1, 7]], which is output 0 of AsStrided, is at version 2")
    chunked = dict(BACKWARD, function="vocab_parallel_entropy_with_chunking", line=154)
    frame = dict(BACKWARD, line=131)
    other = "engine raised in vocab_parallel_entropy: RuntimeError: expected scalar type Float but found Half"
    fs = [_f("vocab_parallel_entropy.non_destructive.float32.tp2_moderate", own, site=BACKWARD),
          _f("vocab_parallel_entropy.matches_reference.bfloat16.chunked@tp2_moderate", crash, site=chunked,
             frame=frame, status="crash", trig="more than one chunk (chunk_size 1 < 3 tokens)"),
          _f("vocab_parallel_entropy.matches_reference.float16.tp2_moderate", other, site=BACKWARD, frame=frame,
             status="crash")]
    by = {d["id"]: d for d in annotate({"findings": fs})["defects"]}
    mut = by["verl.utils.megatron.tensor_parallel._VocabParallelEntropy.backward.changes-a-tensor"]
    assert mut["severity"] == "destructive" and len(mut["members"]) == 2
    assert mut["trigger"] == "a backward pass" and "more than one chunk (chunk_size 1 < 3 tokens)" in mut["triggers"]
    assert "verl.utils.megatron.tensor_parallel._VocabParallelEntropy.backward.crash-runtimeerror" in by


def test_a_layout_is_no_trigger_where_the_unpartitioned_value_is_wrong_too():
    """verl's bf16 vocab_parallel_entropy: unsharded (TP = 1) 0.5 and TP = 2 0.0 where the exact entropy is
    0.113: wrong at every layout, so a wrong value whose trigger is the dtype, and the matches_reference
    finding of that op, dtype and regime reads the same; a partition whose unsharded value is right (or
    off by float32 rounding only, Megatron's float64 smoothed log-prob) stays a partition dependence."""
    vpe = dict(BACKWARD, function="vocab_parallel_entropy", line=142)
    both = ("value, unsharded (TP = 1) = 0.5 vs value on TP rank 0 of tp2 = 0.0 at flat index 0 "
            "(reference 0.1130894347342089, allowed difference 0.0427, 11.7×)")
    value = ("value on TP rank 0 of tp2: engine 0.5 vs reference 0.3122007195407699 at flat index 1: abs err 0.188, "
             "rel err 0.602, 96.2 ulp, tolerance 0.0245")
    ce = dict(BACKWARD, function="vocab_parallel_cross_entropy", module="megatron.core.tensor_parallel.cross_entropy")
    layout = ("gradient, unsharded (TP = 1) = -0.00010046780516859144 vs gradient w.r.t. the vocab shards of tp2 "
              "(concatenated) = 0.0008073017816059291 at flat index 0 (reference -0.00010046774383567609, allowed "
              "difference 2e-12, 4.54e+08×)")
    fs = [_f("vocab_parallel_entropy.partition_invariant.bfloat16.tp2_moderate", both, site=vpe, trig="TP > 1"),
          _f("vocab_parallel_entropy.matches_reference.bfloat16.tp2_moderate", value, site=vpe, trig="TP > 1"),
          _f("vocab_parallel_smoothed_token_logprobs.partition_invariant.float64.tp2_near_uniform_offset", layout,
             site=ce, trig="TP > 1")]
    by = {d["id"]: d for d in annotate({"findings": fs})["defects"]}
    ent = by["verl.utils.megatron.tensor_parallel.vocab_parallel_entropy.wrong-value"]
    assert len(ent["members"]) == 2 and ent["trigger"] == "bf16 input" and ent["triggers"] == ["any input"]
    part = by["megatron.core.tensor_parallel.cross_entropy.vocab_parallel_cross_entropy.partition-dependence"]
    assert part["trigger"] == "TP > 1"


def test_a_changed_tensor_names_the_dtypes_it_happens_in():
    """Megatron's cross entropy writes into fp32 logits and copies the others (``.float()`` is a no-op on
    float32 only): the trigger is ``fp32 input`` when the same check passed in the other dtypes."""
    site = dict(SPS, function="vocab_parallel_log_probs_from_logits", line=201)
    msg = "input 'logits' mutated during forward: 2 element(s) changed, e.g. [0] 1.0 -> 0.5; _version 0 -> 3"
    ok = [dict(_f(f"vocab_parallel_token_logprobs.non_destructive.{dt}.tp2_moderate", "", site=site), status="pass")
          for dt in ("bfloat16", "float16", "float64")]
    (d,) = annotate({"findings": [_f("vocab_parallel_token_logprobs.non_destructive.float32.tp2_moderate", msg,
                                     site=site), *ok]})["defects"]
    assert d["trigger"] == "fp32 input"
    (d,) = annotate({"findings": [_f("vocab_parallel_token_logprobs.non_destructive.float32.tp2_moderate", msg,
                                     site=site)]})["defects"]
    assert d["trigger"] == "any input"  # nothing ran in another dtype: nothing to narrow to


def test_a_caller_joins_its_aggregation_only_where_that_fails_in_the_callers_mode():
    """verl's agg_loss turns a masked NaN into a NaN loss in the seq-mean modes only; GSPO calls it with
    token-mean (the binding's ``calls_agg_mode``, recorded as ``calls_variant``), so GSPO's NaN — its own
    sequence sum of the masked log-ratio — is GSPO's defect; SAPO, forced to seq-mean-token-mean, joins
    agg_loss's. A site that records no variant folds as before."""
    garbage = "a masked position holding NaN"
    sapo = dict(GSPO, function="compute_policy_loss_sapo", line=1650)
    fs = [_f("agg_loss.mask_invariant.float32.seq-mean-token-mean@r", NAN, site=AGG, trig=garbage),
          _f("policy_loss.mask_invariant.float32.gspo@r", NAN, site=dict(GSPO, calls_variant="token-mean"), trig=garbage),
          _f("policy_loss.mask_invariant.float32.sapo@r", NAN, site=dict(sapo, calls_variant="seq-mean-token-mean"),
             trig=garbage),
          _f("policy_loss.mask_invariant.float32.x@r", NAN, site=dict(GSPO, function="x"), trig=garbage)]
    by = {d["id"]: d for d in annotate({"findings": fs})["defects"]}
    assert sorted(by[f"{CORE}.agg_loss.nan-inf"]["members"]) == [
        "agg_loss.mask_invariant.float32.seq-mean-token-mean@r", "policy_loss.mask_invariant.float32.sapo@r",
        "policy_loss.mask_invariant.float32.x@r"]
    assert by[f"{CORE}.compute_policy_loss_gspo.nan-inf"]["members"] == ["policy_loss.mask_invariant.float32.gspo@r"]


def test_cells_say_gradient_and_upstream():
    """The numbers of a gradient clause read ``gradient: …`` (the value may be right)."""
    from rlconform.harness.report.triage_md import numbers_cell

    cell = numbers_cell({"numbers": {"engine": -0.459, "exact": 0.0,
                                     "clause": "gradient: engine -0.459 vs reference 0.0 at flat index 0"}})
    assert cell.startswith("gradient: engine -0.459 vs exact 0")
    assert not numbers_cell({"numbers": {"engine": 0.5, "exact": 1.0, "clause": "value: engine 0.5"}}).startswith("g")


def test_a_rounding_sized_failure_under_its_functions_specific_trigger_joins_that_defect():
    """verl's Dr. GRPO through grpo_vectorized divides by σ (rel err 0.29) and, on a singleton group in float64,
    by 1 + 1e-6 (rel err 1e-6): one cause under one declared trigger, so the small one joins the wrong value
    instead of sitting in the module's rounding row; a rounding failure under ``any input`` stays there."""
    vec = dict(AGG, function="compute_grpo_vectorized_outcome_advantage", line=335)
    words = "norm_adv_by_std_in_grpo=False (Dr. GRPO) … ignored"
    small = ("advantages: engine 0.49999952316329654 vs reference 0.5 at flat index 0: abs err 4.77e-07, rel err 9.54e-07, "
             "tolerance 1e-09")
    fs = [_f("outcome_advantage.matches_reference.float32.drgrpo+vectorized@uneven_groups", HALF, site=vec, trig=words),
          _f("outcome_advantage.matches_reference.float64.drgrpo+vectorized@singleton_groups", small, site=vec, trig=words),
          _f("outcome_advantage.matches_reference.float64.grpo+vectorized@singleton_groups", ROUND, site=vec)]
    by = {d["id"]: d for d in annotate({"findings": fs})["defects"]}
    assert len(by[f"{CORE}.compute_grpo_vectorized_outcome_advantage.wrong-value"]["members"]) == 2
    assert by[f"{CORE}.rounding"]["members"] == ["outcome_advantage.matches_reference.float64.grpo+vectorized@singleton_groups"]


def test_a_crash_row_shows_its_exception_and_a_module_rounding_row_its_module():
    """In verl's report the crash:IndexError row showed another clause's NaN numbers
    (its smallest member also failed on rank-3 −inf logits), and module-wide rounding rows were cited at one
    of their functions' lines."""
    from rlconform.harness.report.triage_md import defect_row, precision_row

    crash = ("contract: a rank-2 input (1, 2) (its docstring allows ranks 2, 3) raised IndexError: too many "
             "indices for tensor of dimension 2 "
             "(engine frame verl/utils/torch_functional.py:323 in masked_var)\n"
             "value (rank 3): engine nan vs reference 0.0 at flat index 0: tolerance 2e-06")
    (d,) = annotate({"findings": [_f("masked_var.matches_reference.float32.padded", crash, site=VAR, frame=VAR)]})[
        "defects"]
    assert d["signature"]["kind"] == "crash:IndexError" and d["numbers"] is None
    row = defect_row(d)
    assert "raises IndexError: too many indices for tensor of dimension 2 |" in row and "nan" not in row
    fs = [_f("policy_loss.matches_reference.bfloat16.gspo@r", ROUND, site=GSPO, ratio=5.0),
          _f("agg_loss.matches_reference.float64.token-mean@r", ROUND, site=AGG, ratio=5.0)]
    (r,) = annotate({"findings": fs})["defects"]
    assert precision_row(r).startswith(f"| module `{CORE}`: 2 functions (agg_loss, compute_policy_loss_gspo) |")
    (one,) = annotate({"findings": fs[:1]})["defects"]  # one function: its line, as before
    assert precision_row(one).startswith("| `compute_policy_loss_gspo`") or "compute_policy_loss_gspo" in \
        precision_row(one).split("|")[1]


def test_a_metric_missing_from_the_final_dict_is_a_missing_output_under_any_property():
    """SkyRL: metric_statistics' matches_reference / partition_invariant findings whose
    metric never reached the final dict were filed as the module's rounding, with no numbers."""
    site = {"function": "reduce_metrics", "module": "skyrl.backends.skyrl_train.workers.worker_utils",
            "file": "skyrl/backends/skyrl_train/workers/worker_utils.py", "line": 77}
    lost = "policy/token_sum_loss (sum) missing from the final dict [] (shards (nnz) [[[0]]])"
    fs = [_f(f"metric_statistics.{p}.float32.numpy_values", lost, site=site)
          for p in ("matches_reference", "partition_invariant", "metric_integrity")]
    (d,) = annotate({"findings": fs})["defects"]
    assert d["signature"]["kind"] == "missing output" and d["severity"] == "logging", d["signature"]


def test_a_defect_headline_shows_a_key_the_engine_emits_before_a_probes_key(monkeypatch):
    """verl's ``Metric.aggregate_dp`` row once led with ``actor/response_length/mean (len_mean)``, a key the
    binding's ``metric_statistics`` probe names (verl never folds response lengths there): a maintainer reads
    a key their trainer logs. Without the op's ``probe_metric_keys``
    the probe's member would be shown (it is the most reachable): the preference is what moves it."""
    from rlconform.harness.report import triage

    doc = json.loads((ROOT / "reports/verl-0.9.1/report.json").read_text())
    # the step's per-micro-batch metric means (an engine key, and more reachable than the probe) would lead the
    # row on reachability alone: without them the probe's member is the most reachable, as before the step op
    doc["findings"] = [f for f in doc["findings"] if not f["op"].startswith("policy_step")]
    # the metric chain's findings (actor/pg_clipfrac, an engine key) are ppo_loss's row now (the MEAN marking):
    # put them back on the fold's row, beside the probe's, as the row was when a maintainer read it
    fold = next(f["engine_function"] for f in doc["findings"] if f["op"] == "metric_statistics"
                and (f.get("engine_function") or {}).get("function") == "Metric.aggregate_dp")
    for f in doc["findings"]:
        if f["op"] == "metric_pipeline" and f["status"] == "discrepancy":
            f["engine_function"] = fold

    def row(d):
        return next(x for x in d["defects"] if (x["engine_function"] or {}).get("function") == "Metric.aggregate_dp")

    shown = row(annotate(json.loads(json.dumps(doc))))
    assert shown["op"] != "metric_statistics" and "(len_mean)" not in (shown["numbers"] or {}).get("clause", "")
    monkeypatch.setattr(triage, "_probe_keys", lambda f: False)
    assert row(annotate(json.loads(json.dumps(doc))))["op"] == "metric_statistics"


def test_a_probe_defects_headline_shows_the_engine_key_its_message_names(monkeypatch):
    """SkyRL's reduce_metrics row (every member a ``metric_statistics`` probe) once led with
    ``policy/token_sum_loss (sum) missing from the final dict``, a key the probe names; its metric_integrity
    members name the key SkyRL's emitter produced (``emitted key 'minibatch_rollout_logprobs_abs_diff_max' was
    printed instead of logged``), and the trigger is what the fold drops: NumPy scalars."""
    from rlconform.harness.report import triage

    doc = json.loads((ROOT / "reports/skyrl-0.4.0/report.json").read_text())

    def row(d):
        return next(x for x in d["defects"] if x["id"].endswith("reduce_metrics.missing-output"))

    shown = row(annotate(json.loads(json.dumps(doc))))
    assert shown["message"].startswith("emitted key 'minibatch_rollout_logprobs_abs_diff_"), shown["message"]
    assert shown["trigger"] in ("numpy scalar values", "tensor values"), shown["trigger"]
    monkeypatch.setattr(triage, "_names_emitted_key", lambda f: False)
    assert "missing from the final dict" in row(annotate(json.loads(json.dumps(doc))))["message"]


@pytest.mark.parametrize("clauses, crash_text, words", [
    ([failure.Clause("metric", text="emitted key 'k' was printed instead of logged", what="lost metric", key="k",
                     printed="Metrics for key k are not all numbers: [np.float32(0.0)]")], "", "numpy scalar values"),
    ([failure.Clause("metric", text="emitted key 'k' was printed instead of logged", what="lost metric", key="k",
                     printed="Metrics for key k are not all numbers: [tensor(0.)]")], "", "tensor values"),
    ([], "Unsupported value type: <class 'numpy.float32'>", "numpy scalar values"),
    # the engine's text decides, not rlconform's sentence: a sentence naming a NumPy type is not the trigger
    ([failure.Clause("metric", text="final 'k' is a numpy.float32 <class 'numpy.float32'>", what="lost metric")],
     "", None),
])
def test_a_fold_that_drops_non_numbers_names_the_value_type(clauses, crash_text, words):
    """What the engine printed instead of logging (a lost metric's ``printed``) or raised (its crash text) names
    the value type."""
    from rlconform.harness.core.triggers import said_trigger

    assert said_trigger(clauses, crash_text) == words


def test_a_crash_row_names_the_engine_frame_that_called_the_crashing_one(tmp_path, monkeypatch):
    """verl: Metric.append's ValueError was shown "via Metric.aggregate_dp" (the op's
    callable) though the traceback reaches it from Metric.__init__ (utils.py:101). The row names the caller the
    traceback shows; a frame with no engine caller keeps the op's function."""
    from rlconform.harness.core.engine_frames import deepest_frame
    from rlconform.harness.report.triage_md import where_cell

    metric = tmp_path / "eng_metric" / "utils" / "metric"  # verl 0.9.1's layout, another top name
    metric.mkdir(parents=True)
    for d in (metric, metric.parent, metric.parent.parent):
        (d / "__init__.py").write_text("")
    utils = metric / "utils.py"  # Metric.__init__ spans lines 100-110, Metric.append 111-113, as in verl 0.9.1
    utils.write_text("class Metric:\n" + "\n" * 98 + "    def __init__(self, value):\n" + "        pass\n" * 10
                     + "    def append(self, value):\n" + "        pass\n" * 3)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    importlib.import_module("eng_metric.utils.metric.utils")  # qualname reads the imported module's code
    binding = ROOT / "harness" / "bindings" / "verl.py"
    tb = ('Traceback (most recent call last):\n'
          f'  File "{binding}", line 535, in wrap\n'
          '    return Metric(aggregation=aggregation[key], value=value)\n'
          f'  File "{utils}", line 101, in __init__\n'
          '    self.append(value)\n'
          f'  File "{utils}", line 112, in append\n'
          '    raise ValueError(f"Unsupported value type: {type(value)}")\n'
          "ValueError: Unsupported value type: <class 'numpy.float32'>\n")
    frame = deepest_frame([tb], ["eng_metric"])
    assert frame["line"] == 112 and frame["caller"]["line"] == 101
    assert frame["caller"]["file"] == "eng_metric/utils/metric/utils.py"
    site = {"function": "Metric.aggregate_dp", "module": "eng_metric.utils.metric.utils",
            "file": "eng_metric/utils/metric/utils.py", "line": 139}
    d = {"crash_frame": frame, "engine_function": site, "signature": {"kind": "crash:ValueError"}}
    cell = where_cell(d)
    assert "called from `Metric.__init__` (eng_metric/utils/metric/utils.py:101)" in cell and "aggregate_dp" not in cell
    alone = deepest_frame([tb.replace(f'  File "{utils}", line 101, in __init__\n    self.append(value)\n', "")],
                          ["eng_metric"])
    assert "caller" not in alone
    assert "via `Metric.aggregate_dp`" in where_cell(dict(d, crash_frame=alone))


def test_a_variant_that_fails_only_in_another_dtype_is_its_own_precision_defect():
    """verl's grpo_vectorized: Dr. GRPO (its ignored norm_adv_by_std_in_grpo) is wrong in float32, the dtype verl
    computes advantages in; plain GRPO through it is off only in float64 (group_mean_std's float32 statistics).
    Two causes, two rows: the second one precision, its class marked; a variant that also fails where the
    engine runs stays in the first row."""
    grpov = dict(AGG, function="compute_grpo_vectorized_outcome_advantage", line=335)
    fs = [_f("outcome_advantage.matches_reference.float32.drgrpo+vectorized@uneven_groups", HALF, site=grpov),
          _f("outcome_advantage.matches_reference.float64.drgrpo+vectorized@uneven_groups", HALF, site=grpov),
          _f("outcome_advantage.matches_reference.float64.grpo+vectorized@near_constant", HALF, site=grpov,
             trig="a group with equal scores")]
    doc = annotate({"engine": {"engine_dtypes": {"outcome_advantage": ["float32"]}}, "findings": copy.deepcopy(fs)})
    rows = {d["id"]: d for d in doc["defects"]}
    flag = rows[f"{CORE}.compute_grpo_vectorized_outcome_advantage.wrong-value"]
    cast = rows[f"{CORE}.compute_grpo_vectorized_outcome_advantage.wrong-value-only-in-another-dtype"]
    assert flag["severity"] == "training" and len(flag["members"]) == 2
    assert cast["severity"] == "precision" and cast["members"] == [fs[2]["id"]]
    # the same variant also failing in float32 keeps it in one row
    joined = fs + [_f("outcome_advantage.matches_reference.float32.grpo+vectorized@near_constant", HALF, site=grpov,
                      trig="a group with equal scores")]
    doc = annotate({"engine": {"engine_dtypes": {"outcome_advantage": ["float32"]}}, "findings": joined})
    assert [d["id"] for d in doc["defects"]] == [f"{CORE}.compute_grpo_vectorized_outcome_advantage.wrong-value"]


def test_a_wrong_value_in_an_empty_micro_batch_joins_its_functions_micro_batch_dependence():
    """An empty micro-batch is one of several: a wrong value under it is the same partition's effect as the
    function's partition dependence under "more than one micro-batch"; another trigger stays its own row, and so
    does an empty DP rank (another partition)."""
    step = {"function": "Worker._forward_backward_micro", "module": "eng.worker", "file": "eng/worker.py", "line": 9}
    fs = [_f("policy_step.partition_invariant.float32.token-mean@b", HALF, site=step, trig="more than one micro-batch"),
          _f("policy_step.matches_reference.float32.seq-tis@b", HALF, site=step, trig="a micro-batch with no valid token"),
          _f("policy_step.matches_reference.float32.rejection@b", HALF, site=step, trig="a row the correction masks"),
          _f("policy_step.matches_reference.float32.dp@b", HALF, site=step, trig="a DP rank with no valid token")]
    doc = annotate({"findings": fs})
    by = {d["signature"]["kind"] + " | " + "; ".join(sorted(d["triggers"])): sorted(d["members"])
          for d in doc["defects"]}
    assert by["partition dependence | a micro-batch with no valid token; more than one micro-batch"] == sorted(
        f["id"] for f in fs[:2])
    assert by["wrong value | a DP rank with no valid token; a row the correction masks"] == sorted(
        f["id"] for f in fs[2:])

"""The root key of a defect (issue 20 §1): a crash is its deepest frame and exception type whatever the
trigger; a trigger that is not necessary does not split a function's defect; a finding joins the defect of a
callee that fails the same way; rounding is one defect per engine module; the id is a function of the key;
impact first (the committed verl report's geo_mean scaling and TP-entropy backward mutation lead); the
report.md sections come in order."""

from __future__ import annotations

import copy
import json
import pathlib

from rlconform.harness.report.severity import RANK
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
    assert d["trigger"] == "a masked position holding NaN"  # the smallest member's, informative only
    assert d["reproducer"]["finding"] == "gae.mask_invariant.float32.padded" and len(d["triggers"]) == 3
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
    assert "compute_policy_loss_geo_mean" in first and "_VocabParallelEntropy.backward" in first, first
    geo = next(d for d in doc["defects"] if d["engine_function"]["function"] == "compute_policy_loss_geo_mean")
    assert geo["severity"] == "training" and geo["signature"]["kind"] == "partition dependence"
    ranks = [RANK[d["severity"]] for d in doc["defects"]]  # training & destructive, logging, robustness, precision
    assert ranks == sorted(ranks)
    assert all(d["engine_function"] or d["crash_frame"] for d in doc["defects"]
               if not d["id"].startswith("op-")), "every located defect names an engine function"


def test_report_md_sections_in_order(tmp_path):
    from rlconform.harness.report.writer import rerender

    doc = json.loads((ROOT / "reports/verl-0.9.1/report.json").read_text())
    (tmp_path / "report.json").write_text(json.dumps(doc))
    rerender(str(tmp_path))
    md = (tmp_path / "report.md").read_text()
    heads = [ln for ln in md.splitlines() if ln.startswith("#")]
    names = [h.lstrip("# ").split(" (")[0] for h in heads]
    assert names[1:] == ["Defects", "Conventions and guards", "All failing findings", "Coverage of the engine's numerics"]
    body = md.split("### All failing findings", 1)[1].split("###", 1)[0]
    assert "| status | op | property |" in body  # the heading holds the findings table, never an empty section
    page = (tmp_path / "report.html").read_text()
    assert page.index("defects (") < page.index("Conventions and guards") < page.index("findings that do not pass")


def test_an_unavailable_op_is_no_defect():
    """An op the engine does not provide (an import failure: issue 26 §6) is one entry of the report's
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

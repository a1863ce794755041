"""A pull request's failures are attributed to the function it changed, not to each caller
(:mod:`rlconform.harness.report.attribution`, ``rlconform diff --selection``)."""

from __future__ import annotations

import json

import pytest

from rlconform.harness.report.attribution import attribute, load_selection
from rlconform.harness.report.diff import render_markdown

F = "verl/trainer/ppo/core_algos.py:agg_loss"


def _defect(did, function, members, dtypes, severity="training"):
    return {"id": did, "severity": severity, "op": "agg_loss", "property": "matches_reference",
            "engine_function": {"file": "verl/trainer/ppo/core_algos.py", "function": function, "line": 1},
            "members": members, "dtypes": dtypes, "signature": {"kind": "wrong value", "feature": "masked token"},
            "trigger": "a masked token", "reproducer": {"command": f"rlconform replay cases/{members[0]}.json"},
            "numbers": {"engine": 0.000745, "exact": 0.000105, "component": "value"}}


def _case():
    own = _defect("agg_loss.wrong-value", "agg_loss", ["agg_loss.m.float32.token-mean@x"], ["float32", "bfloat16"])
    gained = {"id": "agg_loss.m.float32.token-mean@x", "op": "agg_loss", "dtype": "float32", "status": "discrepancy",
              "message": "value: engine 0.000745 vs reference 0.000105 at flat index 0",
              "reproducer": {"command": "rlconform replay head/cases/agg_loss.m.float32.token-mean@x.json --engine verl "
                                        "--engine-path ."}}
    callers = [_defect(f"{n}.wrong-value", n, [f"policy_loss.m.float32.{n}"], ["float32"])
               for n in ("compute_policy_loss_vanilla", "compute_policy_loss_gspo")]
    elsewhere = _defect("kl.wrong-value", "kl_penalty", ["kl_estimator.m.float64.k1"], ["float64"])
    change = {"findings": {"new": [], "fixed": [], "changed": [], "not_checked": [], "unchecked": []},
              "defects": {"new": [*callers, elsewhere], "fixed": [],
                          "changed": [{"id": own["id"], "before": "training, 21 findings", "after": "training, 24 findings",
                                       "rose": False, "fails": True, "severity": "training", "defect": own,
                                       "new_members": [gained], "lost_members": []}]},
              "incomplete": None}
    paths = {own["members"][0]: [F]}
    for c in callers:
        paths[c["members"][0]] = [f"verl/trainer/ppo/core_algos.py:{c['engine_function']['function']}", F]
    paths["kl_estimator.m.float64.k1"] = ["verl/trainer/ppo/core_algos.py:kl_penalty", F]
    return change, {"rev": "main", "ids": list(paths), "why": {}, "paths": paths, "changed": {}}


def test_callers_fold_under_the_changed_function_that_fails_in_their_dtype():
    change, selection = _case()
    got = attribute(change, selection)
    [entry] = got["functions"]
    assert entry["function"] == F and [c["id"] for c in entry["changed"]] == ["agg_loss.wrong-value"]
    assert sorted(d["id"] for d in entry["callers"]) == ["compute_policy_loss_gspo.wrong-value",
                                                         "compute_policy_loss_vanilla.wrong-value"]
    # a caller failing only in a dtype the changed function does not fail in is its own row, naming it
    assert [(d["id"], d["via"]) for d in got["others"]] == [("kl.wrong-value", F)]


def test_the_comment_leads_with_the_changed_function_and_its_numbers():
    change, selection = _case()
    md = render_markdown({"engine": {"name": "verl"}}, {"engine": {"name": "verl", "engine_dtypes": {"agg_loss": ["float32"]}},
                                                         "defects": []}, change, selection=selection)
    lead = md.split("### Changed function", 1)
    assert len(lead) == 2, md
    body = lead[1].split("### Other new defects")[0]
    assert "newly failing `agg_loss.m.float32.token-mean@x`: value: engine 0.000745 vs reference 0.000105" in body
    # a pasteable replay of the newly failing finding, under its changed defect
    assert "  - replay: `rlconform replay head/cases/agg_loss.m.float32.token-mean@x.json --engine verl" in body
    assert "reaches 2 caller(s)" in body and "compute_policy_loss_vanilla" in body
    assert "### New defects" not in md


def test_a_selection_file_that_is_not_one_is_refused(tmp_path):
    bad = tmp_path / "selection.json"
    bad.write_text(json.dumps({"paths": {"a": "not a list"}}))
    with pytest.raises(ValueError, match="not an rlconform selection"):
        load_selection(str(bad))


def test_the_new_and_changed_defects_as_sarif_annotate_their_lines():
    from rlconform.harness.report.sarif import sarif_document

    change, _ = _case()
    for d in change["defects"]["new"]:
        d["engine_function"]["fault"] = {"line": 1176}
    doc = sarif_document(change, "robustness")
    assert doc["version"] == "2.1.0"
    [run] = doc["runs"]
    results = run["results"]
    assert len(results) == 4  # three new, one changed (it gained failing findings)
    assert {r["ruleId"] for r in results} == {"rlconform/wrong-value"} == {x["id"] for x in run["tool"]["driver"]["rules"]}
    loc = results[0]["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "verl/trainer/ppo/core_algos.py" and loc["region"]["startLine"] == 1176
    assert all(r["level"] == "error" and "engine 0.000745 vs exact 0.000105" in r["message"]["text"] for r in results)

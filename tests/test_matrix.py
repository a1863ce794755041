"""The version matrix: defects per release, first seen / fixed in, ops a release cannot bind."""

import pytest

from rlconform.harness.report.matrix_md import matrix_doc, matrix_markdown, missing_name
from rlconform.harness.run.matrix import MatrixError, parse_versions


def _finding(op, status, message="", fid=None):
    return {"id": fid or f"{op}.matches_reference.float32.moderate", "op": op, "property": "matches_reference",
            "dtype": "float32", "regime": "moderate", "status": status, "message": message,
            "engine_function": {"function": "masked_mean", "module": "fake.core", "file": "fake/core.py",
                                "line": 3} if status == "discrepancy" else None,
            "crash_frame": None}


def _reports():
    old = {"engine": {"version": "1"}, "run": {"complete": True}, "findings": [
        _finding("masked_mean", "discrepancy", "value: engine 0.5 vs reference 1.0"),
        _finding("masked_var", "unavailable", "op 'masked_var' unavailable: AttributeError: module 'fake.core' "
                 "has no attribute 'masked_var'")]}
    new = {"engine": {"version": "2"}, "run": {"complete": True}, "findings": [
        _finding("masked_mean", "pass"), _finding("masked_var", "pass")]}
    return {"1": old, "2": new}


def test_defect_fixed_and_missing_function_named():
    doc = matrix_doc("fake", _reports(), source="test", options={"profile": "ci", "ops": []})
    (d,) = doc["defects"]
    assert d["versions"] == {"1": "present", "2": "absent"}
    assert (d["first_seen"], d["fixed_in"]) == ("1", "2")
    unbound = doc["releases"]["1"]["unbound"]
    assert unbound["masked_var"]["missing"] == "fake.core.masked_var"
    assert doc["releases"]["2"]["unbound"] == {}
    md = matrix_markdown(doc)
    assert "fake.core.masked_var" in md and "| 1 | 2 |" in md


def test_defect_still_present_has_no_fix():
    reports = _reports()
    reports["2"]["findings"][0] = _finding("masked_mean", "discrepancy", "value")
    (d,) = matrix_doc("fake", reports, source="test", options={})["defects"]
    assert d["fixed_in"] is None


def test_missing_names():
    assert missing_name("cannot import name 'Metric' from 'verl.utils.metric' (x)") == "verl.utils.metric.Metric"
    assert missing_name("TypeError: compute_value_loss() got an unexpected keyword argument 'dp_size'") == \
        "keyword dp_size of compute_value_loss"
    assert missing_name("No module named 'verl.utils.metric'") == "verl.utils.metric"


def test_bad_versions():
    with pytest.raises(MatrixError):
        parse_versions(" , ")
    with pytest.raises(MatrixError):
        parse_versions("1,1")


def _variant_report(version, checked, findings):
    return {"engine": {"version": version, "variants": {"policy_loss": {"checked": checked, "not_provided": []}}},
            "run": {"complete": True}, "findings": findings}


def test_a_variant_the_release_lacks_is_not_checked_there_and_named():
    """A defect of a variant that an older release does not provide is n/b there (its op ran, the variant's
    findings did not), not absent; first seen says the older release could not check it."""
    new_fid = "policy_loss.matches_reference.float32.dppo@moderate"
    old_fid = "policy_loss.matches_reference.float32.vanilla@moderate"
    reports = {
        "1": _variant_report("1", ["vanilla"], [_finding("policy_loss", "pass", fid=old_fid)]),
        "2": _variant_report("2", ["vanilla", "dppo"], [_finding("policy_loss", "pass", fid=old_fid),
                                                       _finding("policy_loss", "discrepancy", "value", fid=new_fid)]),
    }
    doc = matrix_doc("fake", reports, source="test", options={})
    (d,) = doc["defects"]
    assert d["versions"] == {"1": "not checked", "2": "present"}
    assert (d["first_seen"], d["not_checked_before"], d["state"]) == ("2", ["1"], "present in the newest")
    assert doc["releases"]["1"]["variants_missing"] == {"policy_loss": ["dppo"]}
    assert doc["releases"]["2"]["variants_missing"] == {}
    md = matrix_markdown(doc)
    assert "| 2 (n/b before: 1) | — (still present) |" in md
    assert "policy_loss: dppo." in md


def test_fixed_in_says_when_a_release_between_could_not_check_it():
    fid = "masked_mean.matches_reference.float32.moderate"
    reports = {"1": {"engine": {"version": "1"}, "run": {"complete": True},
                     "findings": [_finding("masked_mean", "discrepancy", "value")]},
               "2": {"engine": {"version": "2"}, "run": {"complete": True},
                     "findings": [_finding("masked_mean", "unavailable", "No module named 'fake.core'")]},
               "3": {"engine": {"version": "3"}, "run": {"complete": True}, "findings": [_finding("masked_mean", "pass")]}}
    doc = matrix_doc("fake", reports, source="test", options={})
    (d,) = doc["defects"]
    assert (d["fixed_in"], d["not_checked_between"], d["state"], d["present_in"]) == ("3", ["2"], "fixed", ["1"])
    assert "| 3 (or earlier: n/b in 2) |" in matrix_markdown(doc)
    reports.pop("3")
    (d,) = matrix_doc("fake", reports, source="test", options={})["defects"]
    assert (d["fixed_in"], d["state"]) == (None, "not checked after 1")
    assert fid in {f["id"] for f in reports["1"]["findings"]}


def test_missing_required_argument_is_named():
    assert missing_name("binding error in x (skyrl 0.3.0): TypeError: Experience.__init__() missing 1 required "
                        "positional argument: 'action_mask' (missing name: action_mask; adapter frame skyrl.py)") \
        == "required argument action_mask of Experience.__init__"


def test_an_implementation_the_release_lacks_is_listed_as_itself():
    report = {"engine": {"version": "1"}, "run": {"complete": True}, "findings": [
        _finding("vocab_parallel_entropy", "pass", fid="vocab_parallel_entropy.matches_reference.float32.moderate"),
        _finding("vocab_parallel_entropy", "unavailable", "op 'vocab_parallel_entropy@chunked' unavailable: "
                 "AttributeError: module 'verl.utils.megatron.tensor_parallel' has no attribute "
                 "'vocab_parallel_entropy_with_chunking'", fid="vocab_parallel_entropy.matches_reference.float32.chunked@moderate"),
        _finding("dp_metric_all_reduce", "unavailable", "op 'dp_metric_all_reduce' unavailable: ImportError: verl 0.4.1 "
                 "has no DP metric all-reduce (missing: verl.utils.metric.Metric, x.allgather): its workers ...")]}
    unbound = matrix_doc("fake", {"1": report}, source="test", options={})["releases"]["1"]["unbound"]
    assert set(unbound) == {"vocab_parallel_entropy@chunked", "dp_metric_all_reduce"}
    assert unbound["vocab_parallel_entropy@chunked"]["missing"] == \
        "verl.utils.megatron.tensor_parallel.vocab_parallel_entropy_with_chunking"
    assert unbound["dp_metric_all_reduce"]["causes"] == ["verl.utils.metric.Metric, x.allgather"]


def test_a_defect_whose_findings_fail_elsewhere_in_the_fixed_release_says_so():
    """The same finding failing in the next release at another engine function (a refactor moved the code) is
    no fix: fixed in names the key it fails with there."""
    msg = "input 'x' mutated during forward: 1 element(s) changed, e.g. [0] 1.0 -> 2.0; _version 0 -> 1"

    def mutating(function):
        f = _finding("masked_mean", "discrepancy", msg)
        f["property"] = "non_destructive"
        f["engine_function"] = dict(f["engine_function"], function=function)
        return f

    reports = {"1": {"engine": {"version": "1"}, "run": {"complete": True}, "findings": [mutating("masked_mean")]},
               "2": {"engine": {"version": "2"}, "run": {"complete": True}, "findings": [mutating("masked_mean_v2")]}}
    doc = matrix_doc("fake", reports, source="test", options={})
    old = next(d for d in doc["defects"] if d["first_seen"] == "1")
    assert (old["fixed_in"], old["moved_to"]) == ("2", ["fake.core.masked_mean_v2 | changes a tensor"])
    assert "2 (its findings still fail there, as `fake.core.masked_mean_v2 \\| changes a tensor`)" in \
        matrix_markdown(doc)


def test_the_unbound_field_names_what_the_release_lacks():
    from rlconform.harness.core.unbound import unbound

    assert unbound("entropy@fused", "unavailable", "ImportError: cannot import name 'fused' from 'verl.utils'") == \
        {"op": "entropy@fused", "status": "unavailable", "missing": "verl.utils.fused"}
    assert unbound("agg_loss", "binding_error", "agg_loss() got an unexpected keyword argument 'dp_size'")[
        "missing"] == "keyword dp_size of agg_loss"
    assert unbound("x", "unavailable", "something else")["missing"] is None


@pytest.mark.cli
def test_a_check_records_what_an_unbound_op_lacks_and_the_matrix_reads_that_field(tmp_path):
    """The finding of an op that did not bind carries ``unbound`` (op, status, the name the release lacks), read
    from Python's own import error where the op was resolved; the matrix groups by that field, whatever the
    message says."""
    import json

    import forked_cli

    from rlconform.harness.report.matrix_md import unbound_ops

    (tmp_path / "lacking.py").write_text(
        "from rlconform.harness.catalog.binding import Binding, Lazy\n"
        "binding = Binding(name='lacking', ops={'entropy': Lazy('no_such_module_here:entropy')})\n")
    out = tmp_path / "out"
    proc = forked_cli.run(("check", "--engine", str(tmp_path / "lacking.py"), "--op", "entropy", "--dtype",
                           "float32", "--max-examples", "2", "--out", str(out), "-q"), timeout=600)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((out / "report.json").read_text())
    lost = [f for f in doc["findings"] if f["status"] == "unavailable"]
    assert lost and all(f["unbound"] == {"op": "entropy", "status": "unavailable", "missing": "no_such_module_here"}
                        for f in lost)
    for f in doc["findings"]:
        f["message"] = "reworded"
    assert unbound_ops(doc)["entropy"]["missing"] == "no_such_module_here"

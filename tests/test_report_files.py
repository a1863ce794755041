"""Reading and writing report files, on the committed reports, in the test's process: the JSON reader's
limits, the atomic writer, the report loader, the terminal summary, the merge's refusals, the base cache's
refusals and its subset, and the explain command's arguments."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil

import pytest
from rich.console import Console

from rlconform.harness.core.safe_json import MAX_DEPTH, JsonFileError, load_object, loads, nesting_depth
from rlconform.harness.report import explain_cmd
from rlconform.harness.report.atomic_write import atomic_write
from rlconform.harness.report.base_cache import CacheMiss, subset_report
from rlconform.harness.report.load import ReportError, load_report, report_path
from rlconform.harness.report.merge import MergeError, merge_reports
from rlconform.harness.report.summary import print_summary, unavailable_cause

ROOT = pathlib.Path(__file__).resolve().parents[1]
VERL = ROOT / "reports" / "verl-0.9.1"


def test_the_json_reader_refuses_deep_nesting_bad_bytes_and_non_objects(tmp_path):
    assert loads(b"\xef\xbb\xbf{\"a\": [1]}") == {"a": [1]}  # a byte-order mark is accepted
    assert nesting_depth([[[]]]) == 3
    with pytest.raises(JsonFileError, match="^case file"):
        loads("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "case file")
    with pytest.raises(JsonFileError):
        loads(b"\xff\xfe", "x")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(JsonFileError, match="list.json"):
        load_object(str(tmp_path / "list.json"))


def test_an_atomic_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "report.md"
    path.write_text("old")
    atomic_write(str(path), "new")
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["report.md"]
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    with pytest.raises(TypeError):
        atomic_write(str(path), None)  # a failed write keeps the old file and removes its temporary
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["report.md"]


def test_a_report_loads_from_its_folder_and_a_broken_one_is_one_line(tmp_path):
    assert report_path(str(VERL)) == str(VERL / "report.json")
    doc = load_report(str(VERL))
    assert doc["findings"] and doc["engine"]["name"] == "verl"
    (tmp_path / "report.json").write_text(json.dumps({"findings": "no"}))
    with pytest.raises(ReportError) as err:
        load_report(str(tmp_path))
    assert "\n" not in str(err.value) and "report.json" in str(err.value)


def test_the_summary_prints_a_row_per_op_and_property():
    doc = load_report(str(VERL))
    console = Console(record=True, width=200)
    print_summary(doc, console)
    text = console.export_text()
    assert "agg_loss" in text and "matches_reference" in text and "float32" in text
    unavailable = {"message": "op 'x' unavailable: ModuleNotFoundError: No module named 'flash_attn'\nTraceback …"}
    assert unavailable_cause(unavailable) == "ModuleNotFoundError: No module named 'flash_attn'"


def test_the_merge_refuses_reports_that_are_not_shards_of_one_check(tmp_path):
    with pytest.raises(MergeError):
        merge_reports([str(VERL), str(ROOT / "reports" / "skyrl-0.4.0")], str(tmp_path / "merged"))


def test_the_base_cache_takes_only_a_complete_report_of_the_base_commit_engine_and_version(tmp_path):
    src = tmp_path / "main"
    shutil.copytree(VERL, src)
    doc = json.loads((src / "report.json").read_text())
    doc["engine"]["revision"] = "0123456789abcdef"
    (src / "report.json").write_text(json.dumps(doc))
    version, ids = doc["tool"]["version"], [f["id"] for f in doc["findings"][:3]]
    ok = dict(revision="0123456", engine="verl", version=version)
    with pytest.raises(CacheMiss, match="written by rlconform"):
        subset_report(str(src), ids, str(tmp_path / "a"), **dict(ok, version="0.0.0"))
    with pytest.raises(CacheMiss, match="engine"):
        subset_report(str(src), ids, str(tmp_path / "a"), **dict(ok, engine="skyrl"))
    with pytest.raises(CacheMiss, match="commit"):
        subset_report(str(src), ids, str(tmp_path / "a"), **dict(ok, revision="fedcba9"))
    with pytest.raises(CacheMiss, match="not in it"):
        subset_report(str(src), ids + ["entropy.none.float32.x"], str(tmp_path / "a"), **ok)
    out = tmp_path / "base"
    out.mkdir()
    assert subset_report(str(src), ids, str(out), **ok) == 3
    assert [f["id"] for f in json.loads((out / "report.json").read_text())["findings"]] == ids


def test_explain_takes_a_defect_id_and_a_report_folder():
    parser = argparse.ArgumentParser()
    explain_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["explain", "D1", "--report", str(VERL)])
    assert args.command == "explain" and args.report == str(VERL)


@pytest.mark.cli
def test_report_subset_writes_the_base_or_says_why_not(tmp_path, capsys):
    from rlconform.harness.cli import main

    src = tmp_path / "main"
    shutil.copytree(VERL, src)
    doc = json.loads((src / "report.json").read_text())
    doc["engine"]["revision"] = "0123456789abcdef"
    (src / "report.json").write_text(json.dumps(doc))
    failing = [f for f in doc["findings"] if f["status"] in ("xfail", "discrepancy", "crash")][:2]
    ids = [f["id"] for f in failing] + [next(f["id"] for f in doc["findings"] if f["status"] == "pass")]
    selection = tmp_path / "selection.json"
    selection.write_text(json.dumps({"ids": ids, "paths": {}}))
    args = ["report", str(src), "--subset", str(selection), "--expect-revision", "0123456", "--expect-engine", "verl"]
    assert main([*args, "--to", str(tmp_path / "hit")]) == 0
    sub = json.loads((tmp_path / "hit" / "report.json").read_text())
    # each finding as the full report has it, its case file beside it: the base's verdicts, not re-checked
    assert [(f["id"], f["status"]) for f in sub["findings"]] == [(i, {f["id"]: f["status"] for f in doc["findings"]}[i])
                                                                   for i in ids]
    for f in sub["findings"]:
        if (f.get("reproducer") or {}).get("case_file"):
            assert (tmp_path / "hit" / f["reproducer"]["case_file"]).is_file()
    assert sub["run"]["base_from"]["findings"] == 3
    capsys.readouterr()
    # another commit: a cache miss (exit 1, the reason), nothing written
    assert main(["report", str(src), "--subset", str(selection), "--expect-revision", "fedcba9",
                 "--expect-engine", "verl", "--to", str(tmp_path / "miss")]) == 1
    assert "cannot stand for the base" in capsys.readouterr().err
    assert not (tmp_path / "miss" / "report.json").exists()
    # an incomplete run of main is never the base
    doc["run"]["complete"] = False
    (src / "report.json").write_text(json.dumps(doc))
    assert main([*args, "--to", str(tmp_path / "incomplete")]) == 1
    assert "incomplete" in capsys.readouterr().err
    # without the folder to write to: a usage error
    assert main(args) == 2


def test_the_first_screen_counts_what_only_the_engines_process_reported():
    from rlconform.harness.report.writer import render_markdown

    doc = load_report(str(VERL))
    n = sum(f["status"] == "unavailable" or f.get("xfail_of") == "unavailable" for f in doc["findings"])
    assert n > 0
    head = render_markdown(doc).splitlines()[:8]
    assert any(f"unavailable **{n}**" in line and "engine's process alone" in line for line in head), head
    # listed in a ledger, they still count as what they are
    for f in doc["findings"]:
        if f["status"] == "unavailable":
            f.update(status="xfail", xfail_of="unavailable")
    console = Console(record=True, width=200)
    print_summary(doc, console)
    assert f"unavailable {n}" in console.export_text()


def test_a_rows_variant_parameters_are_printed_with_it():
    """The bounds, ε, c or cap of the variant of a row's example are on the row and in explain (the catalog's
    ``OpInfo.variant_parameters``, whose keys are the op's variants)."""
    from rlconform.harness.catalog.ops import OPS
    from rlconform.harness.report.explain import explain_markdown
    from rlconform.harness.report.triage import annotate, variant_of
    from rlconform.harness.report.writer import render_markdown

    for op in OPS.values():
        assert set(op.variant_parameters) <= set(op.variants), op.name
    assert variant_of({"op": "rollout_rejection_mask", "regime": "token_k1_asym@moderate"}) == {
        "name": "token_k1_asym", "parameters": "token k1: kept for 0.5 ≤ r ≤ 1.5"}
    assert variant_of({"op": "entropy", "regime": "moderate"}) is None
    doc = annotate(load_report(str(VERL)))
    row = next(x for x in render_markdown(doc).splitlines() if "in `compute_rollout_rejection_mask`" in x)
    assert "(shown: `token_k1_asym`, token k1: kept for 0.5 ≤ r ≤ 1.5)" in row, row
    d = next(x for x in doc["defects"] if x["id"].endswith("compute_rollout_rejection_mask.wrong-value"))
    assert "**Variant** `token_k1_asym`: token k1: kept for 0.5 ≤ r ≤ 1.5" in explain_markdown(doc, d, None, None)

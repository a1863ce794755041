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

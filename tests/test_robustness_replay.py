"""``replay`` never runs code a case file names, and a crafted case file is a
clear error (exit 2, no traceback), never an engine's crash or a silent pass.

The engine of a replay comes from the command line (``--engine``, ``$RLCONFORM_ENGINE``, else the
reference); a case recorded with another engine is refused without ``--engine``. The case runs in a child
process, so an engine that ends its process is a CRASH (exit 1), not a silent exit 0.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from rlconform.harness.cli import main
from rlconform.properties.case import Case

BINDINGS = os.path.join(os.path.dirname(__file__), "bindings")


def _case(**over) -> dict:
    logits = np.array([[0.5, -1.0, 2.0], [1.0, 1.0, -np.inf]])
    doc = Case("logsumexp", "matches_reference", "float64", "neg_inf_padded",
               {"logits": logits, "grad_output": np.ones(2)}).to_json()
    doc.update(over)
    return doc


def _write(tmp_path, doc, name="case.json") -> str:
    p = tmp_path / name
    p.write_text(json.dumps(doc) if not isinstance(doc, bytes) else "")
    if isinstance(doc, bytes):
        p.write_bytes(doc)
    return str(p)


@pytest.mark.cli
def test_an_engine_named_by_the_case_file_is_never_run(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RLCONFORM_ENGINE", raising=False)
    marker = tmp_path / "imported"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').close()\nimport os\nos.abort()\n")
    for spec in ("os:abort", str(evil)):
        path = _write(tmp_path, _case(engine={"spec": spec, "path": str(tmp_path)}))
        assert main(["replay", path]) == 2
        err = capsys.readouterr().err
        assert "replay never runs an engine named by a case file" in err and f"--engine {spec}" in err
    assert not marker.exists()


@pytest.mark.cli
def test_the_engine_comes_from_the_command_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RLCONFORM_ENGINE", raising=False)
    path = _write(tmp_path, _case(engine={"spec": "os:abort", "path": None}))
    assert main(["replay", path, "--engine", "reference"]) == 0
    assert "PASS" in capsys.readouterr().out
    monkeypatch.setenv("RLCONFORM_ENGINE", "reference")
    assert main(["replay", path]) == 0


@pytest.mark.cli
def test_an_engine_that_ends_its_process_is_a_crash(tmp_path, capsys):
    path = _write(tmp_path, _case())
    assert main(["replay", path, "--engine", os.path.join(BINDINGS, "faults.py")]) == 1
    out = capsys.readouterr().out
    assert "CRASH" in out and "exited with code 0" in out


BAD = {
    "a top-level list": ([_case()], "one JSON object, not a list"),
    "a wrong property": (_case(property="partition_invariant"), "does not apply to 'logsumexp'"),
    "an unknown regime": (_case(regime="tp9_moderate"), "unknown regime 'tp9_moderate'"),
    "an unknown op": (_case(op="softmax"), "unknown op 'softmax'"),
    "a dtype the regime lacks": (_case(regime="bf16_coarse"), "not checked in float64"),
    "an empty shape": (_case(inputs={"logits": {"ndarray": "float64", "shape": [], "hex": ["0x1p0"]}}),
                       "empty shape"),
    "a zero-size shape": (_case(inputs={"logits": {"ndarray": "float64", "shape": [0, 3], "hex": []}}),
                          "empty shape"),
    "a negative shape": (_case(inputs={"logits": {"ndarray": "float64", "shape": [-1, 3], "hex": []}}),
                         "negative dimension"),
    "a shape that does not match the data": (
        _case(inputs={"logits": {"ndarray": "float64", "shape": [2, 3], "hex": ["0x1p0"]}}), "must list 6 values"),
    "a hex overflow": (_case(inputs={"logits": {"ndarray": "float64", "shape": [1, 1], "hex": ["0x1p99999"]}}),
                       "overflows a float64"),
    "labels outside the vocabulary": (
        dict(_case(op="token_logprobs"), inputs={"logits": {"ndarray": "float64", "shape": [1, 2], "hex": ["0x0p0"] * 2},
                                                 "labels": {"ndarray": "int64", "shape": [1], "data": [7]}}),
        "outside the vocabulary"),
    "invalid UTF-8": (b'{"schema": "\xff"}', "not UTF-8"),
    "not JSON": (b"{", "not JSON"),
}


@pytest.mark.cli
@pytest.mark.parametrize("what", sorted(BAD))
def test_a_crafted_case_file_is_a_clear_error(tmp_path, capsys, what):
    doc, words = BAD[what]
    path = _write(tmp_path, doc)
    assert main(["replay", path, "--engine", "reference"]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err

"""Bad input files and broken surroundings are clear errors (exit code 2, a message
naming the file and what is wrong, never a traceback), and harness-side errors are never reported as the
engine's crash.

Ledgers (invalid UTF-8; a byte-order mark is accepted; duplicate lines warn), ``-n abc``, a corrupt
corpus file (named, not blamed on the engine), a report that cannot be written mid-run; and the
classification of a failed test's exception into discrepancy / crash / error.
"""

from __future__ import annotations

import os

import forked_cli
import pytest

from rlconform.harness.cli import main
from rlconform.harness.report.xfails import XfailsError, parse_xfails

BINDINGS = os.path.join(os.path.dirname(__file__), "bindings")
FID = "entropy.finite_where_reference_finite.float32.neg_inf_padded"


@pytest.mark.cli
def test_a_ledger_that_is_not_utf8_names_the_line(tmp_path, capsys):
    ledger = tmp_path / "xfails.txt"
    ledger.write_bytes(b"# ok\n" + FID.encode() + b"  # caf\xe9\n")
    assert main(["check", "--xfails", str(ledger), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{ledger}:2: not UTF-8" in err and "Traceback" not in err


def test_a_ledger_with_a_byte_order_mark_is_read(tmp_path):
    ledger = tmp_path / "xfails.txt"
    ledger.write_bytes("\ufeff".encode() + FID.encode() + b"  # from an editor that writes a BOM\n")
    assert list(parse_xfails(str(ledger))) == [FID]


@pytest.mark.cli
def test_a_duplicate_ledger_line_is_a_warning(tmp_path, capsys):
    ledger = tmp_path / "xfails.txt"
    ledger.write_text(f"{FID}\n# again\n{FID}  # twice\n")
    warnings: list[str] = []
    assert list(parse_xfails(str(ledger), warnings=warnings)) == [FID]
    assert warnings == [f"{ledger}:3: {FID} is listed again (first on line 1); the duplicate line is ignored"]
    f = tmp_path / "a_file"
    f.write_text("")
    main(["check", "--xfails", str(ledger), "--out", str(f)])  # the CLI prints it (then stops on --out)
    assert f"warning: {ledger}:3" in capsys.readouterr().err


def test_a_ledger_that_is_a_folder(tmp_path):
    with pytest.raises(XfailsError, match="cannot read xfails file"):
        parse_xfails(str(tmp_path))


@pytest.mark.cli
@pytest.mark.parametrize("value", ["abc", "-2", "1.5"])  # 0 is valid for own code: tests/test_own_code_in_process.py
def test_bad_numbers_of_workers(tmp_path, value):
    proc = forked_cli.run(["check", "-n", value, "--out",
                           str(tmp_path)], timeout=300)
    assert proc.returncode == 2 and "-n" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.cli
def test_a_corrupt_corpus_file_is_named_and_not_blamed_on_the_engine(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    (corpus / FID).mkdir(parents=True)
    bad = corpus / FID / "0123456789abcdef.json"
    bad.write_text('{"schema": "rlconform.case/1", "op": "entropy"')
    assert main(["check", "--corpus", str(corpus), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"corrupt corpus file {bad}" in err and "not JSON" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "report.json").exists()  # nothing ran, nothing reported as a crash


@pytest.mark.cli
def test_a_corpus_case_in_the_wrong_folder(tmp_path, capsys):
    import json

    corpus = tmp_path / "corpus"
    (corpus / FID).mkdir(parents=True)
    other = _any_case()
    (corpus / FID / "x.json").write_text(json.dumps(other.to_json()))
    assert main(["check", "--corpus", str(corpus), "--out", str(tmp_path / "out")]) == 2
    assert f"holds a case of {other.finding_id}" in capsys.readouterr().err


@pytest.mark.cli
def test_a_report_that_cannot_be_written_ends_the_run_with_2(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, RLCONFORM_TEST_REPORT=str(out / "report.json"))
    proc = forked_cli.run(["check", "--engine",
                           os.path.join(BINDINGS, "report_breaker.py"), "--property", "matches_reference",
                           "--dtype", "float64", "--max-examples", "2", "--out", str(out), "-q"],
                          timeout=600, env=env)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "cannot write the report" in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
    assert "INTERNALERROR" not in proc.stdout + proc.stderr


def test_what_the_harness_breaks_is_an_error_not_the_engines_crash():
    from hypothesis.errors import FailedHealthCheck

    from rlconform.harness.core.torch_state import TorchStateChanged
    from rlconform.harness.run.recorder import classify
    from rlconform.properties.checks import EngineCrash, PropertyFailure
    from rlconform.properties.corpus import CorpusError
    from rlconform.properties.runner import CheckRaised, EngineAbort

    assert classify(PropertyFailure("x")) == "discrepancy"
    assert classify(EngineCrash("entropy", ValueError("boom"))) == "crash"
    assert classify(EngineCrash("entropy", TorchStateChanged(["grad mode: True -> False"]))) == "crash"
    assert classify(EngineAbort(KeyboardInterrupt())) == "crash"
    assert classify(CheckRaised(_any_case(), TypeError("not a tensor"))) == "crash"
    assert classify(BaseExceptionGroup("g", [EngineCrash("e", ValueError()), PropertyFailure("p")])) == "discrepancy"
    assert classify(CorpusError("corrupt corpus file x.json: not JSON")) == "error"
    assert classify(FailedHealthCheck("strategy too slow")) == "error"
    assert classify(KeyError("logits")) == "error"


def _any_case():
    import numpy as np

    from rlconform.properties.case import Case

    return Case("logsumexp", "matches_reference", "float64", "moderate", {"logits": np.zeros((1, 2))})

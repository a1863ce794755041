"""The command line: version, list commands, exit codes, and every bad input gets a clear error with exit
code 2 while a report already written is kept."""

from __future__ import annotations

import json
import os
import textwrap

import forked_cli
import pytest

from rlconform.harness.cli import main


def cli(*args, cwd=None, env=None):
    return forked_cli.run(args, cwd=cwd, env=env, timeout=600)


@pytest.mark.smoke
@pytest.mark.cli
def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert "rlconform" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0


@pytest.mark.smoke
@pytest.mark.cli
def test_list_ops_names_every_catalog_op(capsys):
    from rlconform.harness.catalog.ops import OPS

    assert main(["list-ops"]) == 0
    out = capsys.readouterr().out
    for name in OPS:
        assert name in out


@pytest.mark.smoke
@pytest.mark.cli
def test_list_engines(capsys):
    assert main(["list-engines"]) == 0
    out = capsys.readouterr().out
    assert "reference" in out and "mutants.naive_entropy" in out and "verl" in out


@pytest.mark.cli
@pytest.mark.parametrize("spec", ["reference", "mutants.chunk_fp32_entropy"])
def test_metadata_of_the_harness_own_bindings_is_read_here_as_the_child_reads_it(spec, monkeypatch):
    """``check`` reads the reference's and a mutant's variants and coverage in its own process (no child
    interpreter); what it gets is what the child process gets for any other engine (compared for the
    reference: a mutant is read by the same code)."""
    from rlconform.harness.bindings import load
    from rlconform.harness.cli import _engine_metadata

    def no_child(*a, **k):
        raise AssertionError("a child process was started")

    with monkeypatch.context() as m:
        m.setattr(load, "probe_engine", no_child)
        here = _engine_metadata(spec, None)
    assert "variants" in here and "coverage" in here and here["spec"] == spec
    if spec == "reference":
        assert here == load.probe_engine(spec, None)


@pytest.mark.smoke
@pytest.mark.cli
def test_bad_arguments_exit_2():
    proc = cli("check", "--profile", "nope")
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr
    assert cli("frobnicate").returncode == 2
    assert cli().returncode == 2


@pytest.mark.cli
def test_unknown_engine_names_the_engines_and_the_closest_name(tmp_path):
    proc = cli("check", "--engine", "nosuchengine", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "unknown engine 'nosuchengine'" in proc.stderr and "reference, verl, skyrl, megatron" in proc.stderr
    assert "rlconform list-engines" in proc.stderr and "mutants.naive_entropy" not in proc.stderr  # not 75 names
    typo = cli("check", "--engine", "verll", "--out", str(tmp_path))
    assert typo.returncode == 2 and "did you mean 'verl'?" in typo.stderr
    mutant = cli("check", "--engine", "mutants.naive_entropi", "--out", str(tmp_path))
    assert mutant.returncode == 2 and "did you mean 'mutants.naive_entropy'?" in mutant.stderr


@pytest.mark.cli
def test_unknown_mutant(tmp_path):
    proc = cli("check", "--engine", "mutants.nope", "--out", str(tmp_path))
    assert proc.returncode == 2 and "unknown mutant" in proc.stderr


@pytest.mark.cli
def test_binding_file_with_syntax_error_names_file_and_line(tmp_path):
    f = tmp_path / "broken_binding.py"
    f.write_text("from rlconform.harness.catalog.binding import Binding\nbinding = Binding(name='x', ops={\n  'entropy': lambda x: x\n  oops\n})\n")
    proc = cli("check", "--engine", str(f), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "broken_binding.py:" in proc.stderr and "syntax error" in proc.stderr


@pytest.mark.cli
def test_wrong_signature_names_the_op(tmp_path):
    f = tmp_path / "wrong_sig.py"
    f.write_text(textwrap.dedent("""
        from rlconform.harness.catalog.binding import Binding
        def entropy(logits, labels, extra):
            return logits.sum(-1)
        binding = Binding(name="wrong", ops={"entropy": entropy})
    """))
    proc = cli("check", "--engine", str(f), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "'entropy'" in proc.stderr and "wrong_sig.py" in proc.stderr


@pytest.mark.cli
def test_unknown_op_in_binding(tmp_path):
    f = tmp_path / "unknown_op.py"
    f.write_text("from rlconform.harness.catalog.binding import Binding\nbinding = Binding(name='u', ops={'entropyy': abs})\n")
    proc = cli("check", "--engine", str(f), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "entropyy" in proc.stderr


@pytest.mark.cli
def test_engine_function_that_raises_is_a_crash_and_the_run_goes_on(tmp_path):
    f = tmp_path / "raising.py"
    f.write_text(textwrap.dedent("""
        from rlconform.harness.catalog.binding import Binding, Lazy
        from rlconform.harness.core import faithful as F
        def entropy(logits):
            raise RuntimeError("boom from the engine")
        binding = Binding(name="raising", ops={
            "entropy": entropy,
            "logsumexp": F.logsumexp,
            "sum_pi_squared": Lazy("no_such_module_xyz:fn"),
        })
    """))
    out = tmp_path / "out"
    # one dtype and regime, two properties: more than one entropy finding crashes and the run still goes
    # through every finding; a crash is not shrunk here (shrinking sizes the reproducer, never a status)
    proc = cli("check", "--engine", str(f), "--out", str(out), "--max-examples", "3", "--dtype", "float32",
               "--regime", "moderate", "--property", "matches_reference", "--property", "non_destructive",
               "--max-shrinks", "0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads((out / "report.json").read_text())
    by_op = {}
    for finding in doc["findings"]:
        by_op.setdefault(finding["op"], set()).add(finding["status"])
    assert by_op["entropy"] == {"crash"}
    assert by_op["logsumexp"] == {"pass"}
    assert by_op["sum_pi_squared"] == {"unavailable"}
    assert sum(f["op"] == "entropy" for f in doc["findings"]) >= 2
    crash = next(f for f in doc["findings"] if f["op"] == "entropy")
    assert "boom from the engine" in crash["message"] and "boom from the engine" in crash["traceback"]
    unavailable = next(f for f in doc["findings"] if f["op"] == "sum_pi_squared")
    assert "no_such_module_xyz" in unavailable["message"]
    assert doc["run"]["complete"]


@pytest.mark.cli
def test_xfails_ledger(tmp_path):
    ledger = tmp_path / "xfails.txt"
    fid = "entropy.finite_where_reference_finite.float32.neg_inf_padded"
    ledger.write_text(f"# known\n{fid}  # NaN from 0*log 0\n")
    out = tmp_path / "out"
    base = ["check", "--engine", "mutants.naive_entropy", "--op", "entropy", "--property",
            "finite_where_reference_finite", "--dtype", "float32", "--out", str(out)]
    proc = cli(*base, "--xfails", str(ledger))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((out / "report.json").read_text())
    statuses = {f["id"]: f["status"] for f in doc["findings"]}
    assert statuses[fid] == "xfail"
    # the same ledger against the reference: the listed finding now passes -> xpass, exit 1
    proc = cli(*base[:2], "reference", *base[3:], "--xfails", str(ledger))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads((out / "report.json").read_text())
    assert {f["id"]: f["status"] for f in doc["findings"]}[fid] == "xpass"


@pytest.mark.smoke
@pytest.mark.cli
@pytest.mark.parametrize("line, words", [
    ("entropy.nonsense_property.float32.moderate", "unknown property"),
    ("entropy.matches_reference.float33.moderate", "unknown dtype"),
    ("not an id at all", "malformed"),
    ("entropyy.matches_reference.float32.moderate", "unknown op"),
    ("entropy.finite_where_reference_finite.float32.neg_inf_paded", "unknown regime"),
    ("entropy.partition_invariant.float32.moderate", "does not apply"),
    ("entropy.matches_reference.float32.fp16_extreme", "not checked in float32"),
])
def test_malformed_xfails_names_the_line(tmp_path, capsys, monkeypatch, line, words):
    # in this process (the ledger is read before any engine is loaded or process started; a subprocess per
    # line only repeated the interpreter's and torch's start-up): main's exit code and stderr
    monkeypatch.delenv("RLCONFORM_DEVICE", raising=False)  # main exports the device; undone after the test
    ledger = tmp_path / "xfails.txt"
    ledger.write_text(f"# header\n\n{line}\n")
    assert main(["check", "--engine", "reference", "--xfails", str(ledger), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{ledger}:3" in err and words in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.cli
def test_missing_xfails_file(tmp_path):
    proc = cli("check", "--engine", "reference", "--xfails", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "cannot read xfails" in proc.stderr


@pytest.mark.cli
def test_engine_path_that_does_not_exist(tmp_path):
    proc = cli("check", "--engine", "verl", "--engine-path", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr


@pytest.mark.cli
def test_engine_path_without_the_package(tmp_path):
    proc = cli("check", "--engine", "verl", "--engine-path", str(tmp_path), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "holds no package 'verl'" in proc.stderr


@pytest.mark.cli
def test_engine_not_installed_gives_install_command(tmp_path):
    # hide verl with a sitecustomize that blocks its import
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys
        class _Block:
            def find_spec(self, name, path=None, target=None):
                if name == "verl" or name.startswith("verl."):
                    raise ModuleNotFoundError("blocked for the test")
                return None
        sys.meta_path.insert(0, _Block())
    """))
    env = dict(os.environ, PYTHONPATH=str(block))
    proc = cli("check", "--engine", "verl", "--out", str(tmp_path / "o"), env=env)
    assert proc.returncode == 2
    assert "install/engines.sh" in proc.stderr


@pytest.mark.cli
def test_replay_of_missing_or_bad_case_file(tmp_path):
    assert cli("replay", str(tmp_path / "nope.json")).returncode == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "something else"}')
    proc = cli("replay", str(bad))
    assert proc.returncode == 2 and "not an rlconform case file" in proc.stderr


@pytest.mark.cli
def test_filters_that_select_nothing_are_usage_errors(tmp_path):
    proc = cli("check", "--op", "entropy", "--property", "partition_invariant", "--out", str(tmp_path))
    assert proc.returncode == 2 and "no finding matches" in proc.stderr
    # an engine that binds other ops (a binding file: megatron-core's import, a minute on a loaded machine,
    # would only prove the same code path)
    f = tmp_path / "lse_only.py"
    f.write_text("from rlconform.harness.catalog.binding import Binding\nfrom rlconform.harness.core import faithful as F\n"
                 "binding = Binding(name='lse', ops={'logsumexp': F.logsumexp})\n")
    proc = cli("check", "--engine", str(f), "--op", "entropy", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "does not bind entropy" in proc.stderr and "logsumexp" in proc.stderr


@pytest.mark.smoke
@pytest.mark.cli
@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_max_examples_must_be_positive(tmp_path, value):
    proc = cli("check", "--max-examples", value, "--out", str(tmp_path))
    assert proc.returncode == 2 and "--max-examples" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.cli
def test_wrong_output_shape_is_a_discrepancy_that_says_so(tmp_path):
    f = tmp_path / "identity_entropy.py"
    f.write_text("from rlconform.harness.catalog.binding import Binding\nbinding = Binding(name='id', ops={'entropy': lambda logits: logits * 1})\n")
    out = tmp_path / "out"
    proc = cli("check", "--engine", str(f), "--property", "matches_reference", "--dtype", "float32",
               "--max-examples", "3", "--out", str(out))
    assert proc.returncode == 1
    doc = json.loads((out / "report.json").read_text())
    statuses = {x["status"] for x in doc["findings"]}
    assert statuses == {"discrepancy"}, statuses
    assert all("the engine returned shape" in x["message"] for x in doc["findings"])


@pytest.mark.cli
def test_binding_that_is_not_a_binding(tmp_path):
    f = tmp_path / "notb.py"
    f.write_text("binding = {'entropy': abs}\n")
    proc = cli("check", "--engine", str(f), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "`binding` is a dict" in proc.stderr

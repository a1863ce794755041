"""The device as a dimension of the run, exercised without a GPU: ``--device cpu`` given
explicitly changes no status; an op a binding declares to need CUDA is ``unavailable: needs CUDA`` on a CPU
run (reported, not red); a device that is malformed or absent is exit 2 with one line; the report records
the device; ``diff`` refuses reports of two devices unless told. No test here needs (or skips for lack of)
a GPU: the absent-CUDA cases patch what torch says of the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import forked_cli
import pytest

from rlconform.harness.cli import main
from rlconform.harness.core import device

HERE = os.path.dirname(os.path.abspath(__file__))
NEEDS_CUDA = os.path.join(HERE, "bindings", "needs_cuda.py")
#: one failing finding (the nan_times_mask mutant), one passing, one of the op and one of the implementation
#: that need CUDA
FINDINGS = ("masked_mean.mask_invariant.float32.padded", "masked_mean.matches_reference.float32.padded",
            "entropy.matches_reference.float32.moderate", "token_logprobs.matches_reference.float32.naive@moderate")


def _check(tmp_path, name, *extra, env=None):
    sel = tmp_path / "findings.txt"
    sel.write_text("\n".join(FINDINGS) + "\n")
    out = tmp_path / name
    proc = forked_cli.run(["check", "--engine", NEEDS_CUDA,
                           "--op", "masked_mean", "--op", "entropy", "--op", "token_logprobs", "--findings", str(sel), "--max-examples", "5",
                           "--out", str(out), "-q", *extra], timeout=600,
                          env=env, cwd=tmp_path)
    doc = json.loads((out / "report.json").read_text())
    return proc, doc


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The narrowed check twice: with no device named (and none in the environment) and with --device cpu."""
    tmp = tmp_path_factory.mktemp("device")
    env = {k: v for k, v in os.environ.items() if k != device.ENV}
    return _check(tmp, "default", env=env), _check(tmp, "cpu", "--device", "cpu", env=env)


@pytest.mark.cli
def test_explicit_cpu_gives_the_default_statuses(runs):
    (p0, d0), (p1, d1) = runs
    s0 = {f["id"]: f["status"] for f in d0["findings"]}
    s1 = {f["id"]: f["status"] for f in d1["findings"]}
    assert s0 == s1
    assert s0 == {FINDINGS[0]: "discrepancy", FINDINGS[1]: "pass", FINDINGS[2]: "unavailable",
                  FINDINGS[3]: "unavailable"}
    assert p0.returncode == p1.returncode == 1  # the mutant's discrepancy; not the op that needs CUDA


@pytest.mark.cli
def test_an_op_that_needs_cuda_is_unavailable_needs_cuda_on_cpu(runs):
    (proc, doc), _ = runs
    f = next(f for f in doc["findings"] if f["op"] == "entropy")
    assert f["status"] == "unavailable" and f["needs"] == "cuda"
    assert "unavailable: needs CUDA" in f["message"]
    assert "unavailable op entropy (1 finding(s)): needs CUDA" in proc.stdout
    from rlconform.harness.report.severity import fails

    assert not fails(f)  # declared, on a run of another device: listed, not red
    assert fails(dict(f, needs=None))  # an op that cannot be loaded stays red
    impl = next(f for f in doc["findings"] if f["regime"] == "naive@moderate")
    assert impl["status"] == "unavailable" and impl["needs"] == "cuda"
    assert "op 'token_logprobs@naive' unavailable: needs CUDA" in impl["message"]


@pytest.mark.cli
def test_the_report_records_the_device(runs):
    (_, doc), (_, doc_cpu) = runs
    for d in (doc, doc_cpu):
        dev = d["run"]["device"]
        assert dev["device"] == "cpu" and dev["cuda"] is None and dev["name"]
        assert dev["torch"] == d["run"]["torch"]


@pytest.mark.cli
def test_the_report_records_the_cpu_kernels_isa_as_forced(runs, tmp_path):
    """Two CPU reports of one engine can differ by the vector ISA torch dispatches to: the report
    says which, and ``ATEN_CPU_CAPABILITY`` moves it."""

    (_, doc), _ = runs
    isa = doc["run"]["device"]["cpu_capability"]
    assert isa and isa.upper() == isa, isa
    code = "from rlconform.harness.core.device import describe; print(describe('cpu')['cpu_capability'])"
    forced = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, ATEN_CPU_CAPABILITY="default"))
    assert forced.returncode == 0 and forced.stdout.strip() == "DEFAULT", forced.stderr[-2000:]
    from rlconform.harness.report.writer import render_markdown

    assert f", CPU kernels {isa})" in render_markdown(doc)


@pytest.mark.cli
def test_report_md_and_html_name_the_device(tmp_path, runs):
    from rlconform.harness.report.html_report import render_html
    from rlconform.harness.report.writer import render_markdown

    _, (_, doc) = runs
    doc = dict(doc, run=dict(doc["run"], device={"device": "cuda:0", "name": "NVIDIA H200", "torch": "2.13.0",
                                                 "cuda": "12.8", "capability": "9.0"}))
    assert "device `cuda:0` (NVIDIA H200, compute capability 9.0) · torch 2.13.0 · CUDA 12.8" in render_markdown(doc)
    html = render_html(doc)
    assert "NVIDIA H200" in html and "CUDA 12.8" in html


@pytest.mark.cli
@pytest.mark.parametrize("argv, says", [
    (["check", "--device", "tpu"], "unknown device 'tpu': choose cpu, cuda or cuda:N"),
    (["check", "--device", "cuda:x"], "unknown device 'cuda:x'"),
    (["replay", "case.json", "--device", "gpu"], "unknown device 'gpu'"),
    (["fuzz", "--device", "tpu"], "unknown device 'tpu'"),
])
def test_a_malformed_device_is_exit_2_in_one_line(capsys, argv, says):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "Traceback" not in err[0]


@pytest.mark.cli
@pytest.mark.parametrize("argv, says", [
    (["check", "--device", "cuda"], "--device cuda: no CUDA device on this machine"),
    (["check", "--device", "cuda:7"], "--device cuda:7: no CUDA device on this machine"),
    (["fuzz", "--device", "cuda"], "no CUDA device"),
])
def test_cuda_on_a_machine_without_one_is_exit_2(monkeypatch, capsys, argv, says):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv(device.ENV, raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]


@pytest.mark.cli
def test_a_gpu_index_past_the_machine_is_exit_2(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(["check", "--device", "cuda:7"]) == 2
    assert "this machine has 1 CUDA device(s) (cuda:0..cuda:0)" in capsys.readouterr().err


@pytest.mark.cli
def test_the_environment_names_the_device(monkeypatch, capsys):
    monkeypatch.setenv(device.ENV, "tpu")
    assert main(["check"]) == 2
    assert "unknown device 'tpu'" in capsys.readouterr().err


def test_device_names_and_what_an_op_needs():
    assert device.parse("cpu") == "cpu" and device.parse("CUDA") == "cuda:0" and device.parse("cuda:3") == "cuda:3"
    assert device.missing("cuda", "cpu").startswith("needs CUDA")
    assert device.missing("cuda", "cuda:0") is None and device.missing(None, "cpu") is None


def test_pool_backend_selection(monkeypatch):
    import torch

    assert device.pool_backend(2, "cpu") == ("gloo", ["cpu", "cpu"])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device.pool_backend(2, "cuda:0") == ("nccl", ["cuda:0", "cuda:1"])  # one GPU per rank
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert device.pool_backend(2, "cuda:0") == ("gloo", ["cuda:0", "cuda:0"])  # TP=2 sharing one GPU


def test_engine_calls_are_not_wrapped_on_cpu(monkeypatch):
    monkeypatch.delenv(device.ENV, raising=False)

    def f(x):
        return x

    assert device.engine_call(f) is f  # the CPU path is today's, bit for bit


@pytest.mark.engines
def test_implementation_needs_cuda_is_declared_on_verl_triton():
    from rlconform.harness.bindings.verl import IMPLEMENTATIONS

    impl = IMPLEMENTATIONS["fused_linear_token_stats"]["triton"]
    assert impl.needs == "cuda"


def _report(path, device_doc, engine="verl"):
    path.mkdir()
    run = {"complete": True} if device_doc is None else {"complete": True, "device": device_doc}
    f = {"id": "entropy.matches_reference.float32.moderate", "op": "entropy", "property": "matches_reference",
         "dtype": "float32", "regime": "moderate", "status": "pass"}
    (path / "report.json").write_text(json.dumps({"engine": {"name": engine}, "run": run, "findings": [f]}))
    return str(path)


@pytest.mark.cli
def test_diff_refuses_reports_of_two_devices_unless_told(tmp_path, capsys):
    cpu = _report(tmp_path / "cpu", {"device": "cpu", "name": "x86", "torch": "2.13.0", "cuda": None})
    old = _report(tmp_path / "old", None)  # before devices were recorded: a CPU run
    gpu = _report(tmp_path / "gpu", {"device": "cuda:0", "name": "NVIDIA H200", "torch": "2.13.0", "cuda": "12.8"})
    other = _report(tmp_path / "other", {"device": "cuda:1", "name": "NVIDIA H200", "torch": "2.13.0", "cuda": "12.8"})
    assert main(["diff", cpu, gpu]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cpu" in err[0] and "cuda (NVIDIA H200)" in err[0] and "--allow-device-mismatch" in err[0]
    assert main(["diff", cpu, gpu, "--allow-device-mismatch"]) == 0
    capsys.readouterr()
    assert main(["diff", old, cpu]) == 0  # a report without run.device is a CPU run
    assert main(["diff", gpu, other]) == 0  # two GPUs of one model: the index is not compared


def test_coverage_reaches_the_forward_and_backward_of_an_applied_autograd_function():
    """verl's Triton kernel is bound through ``LinearCrossEntropy.apply``: the coverage walk must reach the
    Function's forward and backward from an adapter that holds the class (else they read as unbound)."""
    import torch

    from rlconform.harness.catalog.coverage import _walk

    class Kernel(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def make():
        kernel = Kernel

        def adapter(x):
            return kernel.apply(x)
        return adapter

    reach = _walk(make(), frozenset({"verl"}))
    assert reach.has(Kernel.forward) and reach.has(Kernel.backward)

"""Torch's global state does not leak from one finding into the next.

Unit: every mode of :data:`rlconform.harness.core.torch_state.MODES` that an engine call leaves changed is
named by :class:`TorchStateChanged` and restored. End to end (``tests/bindings/state_leak.py``): an
engine that turns autograd off is a crash naming ``grad mode``, and a later finding's real 2× gradient
bug is still found as a discrepancy; the crash's reproducer replays as a crash, not as PASS.
"""

from __future__ import annotations

import json
import os
import shlex

import forked_cli
import pytest
import torch

from rlconform.harness.core import torch_state

BINDING = os.path.join(os.path.dirname(__file__), "bindings", "state_leak.py")

_LEAKED: list = []  # context managers entered and never left, as a faulty engine would


def _leak(cm) -> None:
    _LEAKED.append(cm)
    cm.__enter__()


#: mode -> how an engine might leave it changed
CHANGES = {
    "grad mode": lambda: torch.set_grad_enabled(False),
    "inference mode": lambda: _leak(torch.inference_mode()),
    "default dtype": lambda: torch.set_default_dtype(torch.float64),
    "default device": lambda: torch.set_default_device("meta"),
    "deterministic algorithms (enabled, warn_only)": lambda: torch.use_deterministic_algorithms(True),
    "anomaly detection (enabled, check_nan)": lambda: torch.set_anomaly_enabled(True),
    "intra-op threads": lambda: torch.set_num_threads(torch.get_num_threads() + 1),
    "float32 matmul precision": lambda: torch.set_float32_matmul_precision("medium"),
    "flush denormals to zero": lambda: torch.set_flush_denormal(True),
    "CPU autocast (enabled, dtype)": lambda: torch.set_autocast_enabled("cpu", True),
    "cudnn (enabled, deterministic, benchmark)": lambda: setattr(torch.backends.cudnn, "deterministic", True),
}


def test_every_mode_has_a_change_to_test():
    assert set(CHANGES) == set(torch_state.MODES)


@pytest.mark.parametrize("mode", sorted(CHANGES))
def test_a_mode_left_changed_is_named_and_restored(mode):
    before = torch_state.snapshot()
    with pytest.raises(torch_state.TorchStateChanged) as exc:
        with torch_state.guard():
            CHANGES[mode]()
    assert any(c.startswith(mode + ":") for c in exc.value.changes), exc.value.changes
    assert torch_state.changes(before, torch_state.snapshot()) == []  # restored


def test_a_call_that_restores_what_it_changed_passes():
    with torch_state.guard() as g:
        with torch.no_grad():
            torch.ones(2).sum()
        torch.set_num_threads(torch.get_num_threads())
    assert g.changed == []


def test_an_exception_in_flight_wins_but_the_state_is_restored():
    with pytest.raises(ValueError):
        with torch_state.guard():
            torch.set_grad_enabled(False)
            raise ValueError("engine error")
    assert torch.is_grad_enabled()


def test_rng_is_restored_by_a_baseline_but_not_an_error():
    base = torch_state.baseline()
    torch.rand(3)  # consuming random numbers is not a fault ...
    assert torch_state.changes(base, torch_state.snapshot(rng=True)) == ["CPU RNG state"]
    torch_state.restore(base)  # ... but the next finding starts from the same RNG state
    assert torch_state.changes(base, torch_state.snapshot(rng=True)) == []


def cli(*args):
    return forked_cli.run(args, timeout=900)


@pytest.mark.cli
def test_a_leak_is_a_crash_and_does_not_hide_a_later_bug(tmp_path):
    out = tmp_path / "out"
    proc = cli("check", "--engine", BINDING, "--property", "matches_reference", "--dtype", "float64",
               "--max-examples", "3", "--out", str(out), "-q")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    lse = [f for f in doc["findings"] if f["op"] == "logsumexp"]
    tlp = [f for f in doc["findings"] if f["op"] == "token_logprobs"]
    assert lse and all(f["status"] == "crash" and "grad mode: True -> False" in f["message"] for f in lse), \
        [(f["id"], f["status"], f["message"][:200]) for f in lse]
    # the 2x gradient is found (a discrepancy on the gradient), not hidden behind crashes of the harness
    assert tlp and not [f for f in tlp if f["status"] == "crash"], [(f["id"], f["message"][:200]) for f in tlp]
    assert any(f["status"] == "discrepancy" and "gradient" in f["message"] for f in tlp)
    # the leak's reproducer replays as a crash in a fresh process, not as PASS
    command = shlex.split(lse[0]["reproducer"]["command"])
    rep = cli(*command[1:])
    assert rep.returncode == 1 and "CRASH" in rep.stdout and "grad mode" in rep.stdout, rep.stdout + rep.stderr

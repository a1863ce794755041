"""Engine calls made in the engine's worker for an evaluation in the referee (harness/core/tape.py) and the
referee's module check (properties/referee.py): in-process, tiny tensors."""

from __future__ import annotations

import pickle

import pytest
import torch

from rlconform.harness.core import tape as T
from rlconform.harness.core.evaluation import EngineCrash, call_engine


class Lying(torch.Tensor):
    def double(self):
        return torch.zeros(self.shape, dtype=torch.float64)

    def numpy(self):
        return torch.zeros(self.shape).numpy()


def _family(engine):
    """What a family does: a forward, an in-place write, a backward, then reads."""
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = call_engine("fwd", engine["fwd"], x)
    buf = torch.zeros(2)
    call_engine("write", engine["write"], buf)
    call_engine("bwd", engine["bwd"], y, x)
    return y, x.grad, buf, buf._version


ENGINE = {"fwd": lambda x: (2 * x).as_subclass(Lying), "write": lambda b: b.add_(5.0),
          "bwd": lambda y, x: y.sum().backward()}


def test_the_referee_refuses_engine_modules_and_their_pickles():
    import rlconform.harness.mutants.naive_entropy  # noqa: F401 - an engine, as far as the referee is concerned
    from rlconform.properties import referee

    assert "rlconform.harness.mutants.naive_entropy" in referee.touched_modules()
    with pytest.raises(pickle.UnpicklingError):
        referee.loads(pickle.dumps(rlconform.harness.mutants.naive_entropy.entropy))
    with pytest.raises(pickle.UnpicklingError):
        referee.loads(pickle.dumps(print))


def _remote(table):
    """A referee-side tape whose engine calls run in a :class:`~rlconform.harness.core.tape.Server` (here
    in-process; a Unix socket between the processes of a run)."""
    from rlconform.harness.core import torch_state
    from rlconform.properties import referee

    server = T.Server(list(table.values()), torch_state.guard)
    return T.Remote(server.handle, referee.loads), {k: referee.ReplayFn(k, i) for i, k in enumerate(table)}


def test_engine_calls_only_give_the_engine_bytes_effects_versions_and_gradients():
    tape, standin = _remote(ENGINE)
    with T.remote(tape):
        y, g, b, v = _family(standin)
    assert tape.calls == 3
    assert type(y) is torch.Tensor and y.tolist() == [2.0, 4.0, 6.0]  # the bytes, not Lying.double()'s zeros
    assert y.requires_grad and y.grad_fn is not None
    assert g.tolist() == [2.0, 2.0, 2.0] and b.tolist() == [5.0, 5.0] and v == 1


def test_an_engine_exception_is_raised_in_the_referee_as_the_same_crash():
    class EngineError(ValueError):
        pass

    def boom(x):
        raise EngineError("bad shard")

    tape, standin = _remote({"fwd": boom})
    with T.remote(tape), pytest.raises(EngineCrash) as exc:
        call_engine("fwd", standin["fwd"], torch.ones(1))
    cause = exc.value.__cause__
    assert type(cause).__name__ == "EngineError" and isinstance(cause, ValueError) and str(cause) == "bad shard"
    assert "bad shard" in exc.value.engine_traceback


def test_an_unknown_object_is_unreadable_in_the_referee():
    class Opaque:
        pass

    tape, standin = _remote({"fwd": lambda: Opaque(), "f8": lambda: torch.zeros(2).to(torch.float8_e4m3fn)})
    with T.remote(tape):
        out, f8 = call_engine("fwd", standin["fwd"]), call_engine("f8", standin["f8"])
    with pytest.raises(TypeError, match="Opaque"):
        float(out)
    with pytest.raises(TypeError, match="float8"):  # a dtype the tape does not read: unreadable, not a broken call
        len(f8)


def test_rlconforms_own_failures_are_replay_diverged_never_an_engine_crash():
    from rlconform.properties import referee

    tape, standin = _remote({"fwd": lambda x: x + 1})
    with T.remote(tape), pytest.raises(T.ReplayDiverged, match="outside call_engine"):
        standin["fwd"](torch.ones(2))  # family code calling the engine directly
    broken = T.Tape._effects
    try:
        T.Tape._effects = lambda self, entry: 1 / 0  # the worker cannot record what the call did
        tape, standin = _remote({"fwd": lambda x: x + 1})
        with T.remote(tape), pytest.raises(T.ReplayDiverged, match="could not be made: ZeroDivisionError"):
            call_engine("fwd", standin["fwd"], torch.ones(2))
    finally:
        T.Tape._effects = broken
    assert referee.RefereeError("x").args[0].startswith("rlconform's referee could not judge")


def test_spill_files_are_read_once_and_removed(monkeypatch, tmp_path):
    """Tensors above INLINE_MAX_BYTES cross in files (/dev/shm): the reader removes each once read, both
    ways (the referee's new tensors to the worker, the engine's results and gradients back)."""
    monkeypatch.setattr(T, "INLINE_MAX_BYTES", 16)
    monkeypatch.setattr(T, "SPILL_DIR", str(tmp_path))
    tape, standin = _remote(ENGINE)
    with T.remote(tape):
        y, g, b, v = _family(standin)
    assert y.tolist() == [2.0, 4.0, 6.0] and g.tolist() == [2.0, 2.0, 2.0] and b.tolist() == [5.0, 5.0]
    assert list(tmp_path.iterdir()) == []


def test_engine_calls_only_a_lambda_of_the_family_runs_in_the_referee_and_its_engine_calls_travel():
    tape, standin = _remote({"fwd": lambda x, k: x * k, "boom": lambda: 1 / 0})
    with T.remote(tape):
        x = torch.tensor([1.0, 2.0])
        out = call_engine("fwd", lambda t: standin["fwd"](t, 3.0), x)
        with pytest.raises(EngineCrash) as exc:
            call_engine("boom", standin["boom"])
    assert out.tolist() == [3.0, 6.0] and tape.calls == 2
    assert isinstance(exc.value.__cause__, ZeroDivisionError)


def test_engine_calls_only_the_referees_own_changes_reach_the_worker_and_a_producer_gradient_comes_back():
    from rlconform.harness.core.guards import produce

    seen = []
    tape, standin = _remote({"fwd": lambda x: x * 2, "bwd": lambda y: y.sum().backward(),
                             "look": lambda x: seen.append(x.tolist())})
    with T.remote(tape):
        leaf = torch.tensor([1.0, 2.0], requires_grad=True)
        x = produce(leaf)  # an interior node in the referee
        y = call_engine("fwd", standin["fwd"], x)
        call_engine("bwd", standin["bwd"], y)
        buf = torch.zeros(2)
        call_engine("look", standin["look"], buf)
        buf.add_(1.0)  # the referee's code writes between two calls
        call_engine("look", standin["look"], buf)
    assert leaf.grad.tolist() == [2.0, 2.0]  # through the worker's graph, then the referee's
    assert seen == [[0.0, 0.0], [1.0, 1.0]]


def test_an_example_interrupted_mid_call_leaves_the_next_one_its_own_verdict():
    """The worker is interrupted while the referee waits for an engine call: the connection is dropped,
    so the referee never takes the next example's request for that call's answer."""
    import numpy as np

    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.run.dispatch import referee_judge
    from rlconform.harness.workers import referee as referee_process
    from rlconform.properties import referee
    from rlconform.properties.case import Case
    from rlconform.properties.checks import run_check

    ref = referee_process.start(referee_judge, referee.check_clean)
    try:
        binding = load_engine("mutants.naive_entropy", None)
        logits = np.random.default_rng(0).standard_normal((4, 8))
        logits[0, 0] = -np.inf  # a masked vocabulary entry: 0 · (−inf) = NaN in the naive entropy
        case = Case("entropy", "finite_where_reference_finite", "float32", "moderate", {"logits": logits})
        referee.connect(ref.address, ref.authkey)
        client = referee._CLIENT[0]

        def interrupted(message):
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            client.ask(pickle.dumps({"case": case, "binding": referee.standin(binding, case, [])}), interrupted)
        assert run_check(binding, case).verdict == "discrepancy"
        verdicts = ref.drain()
        assert [v[1:3] for v in verdicts] == [("outcome", "discrepancy")]
    finally:
        referee.disconnect()
        ref.close()


def test_the_worker_runs_each_engine_call_on_the_runs_device(monkeypatch):
    """``--device cuda`` under the referee: the worker's Server moves each call to the device as
    call_engine does without a referee (device.engine_call; the identity on the CPU, so it is spied here)."""
    from rlconform.harness.core import device

    moved = []
    real = device.engine_call
    monkeypatch.setattr(device, "engine_call", lambda fn, *a: moved.append(fn) or real(fn, *a))
    tape, standin = _remote(ENGINE)
    with T.remote(tape):
        _family(standin)
    assert [getattr(f, "__name__", "") for f in moved] == ["<lambda>"] * 3


def test_a_released_input_holds_no_data_in_the_referee_and_still_gets_its_gradient(monkeypatch, tmp_path):
    """The referee releases a large input once the worker holds it (``tape.release``): its storage is one
    element, the engine's later write into it is not mirrored (and its spill file is removed), its gradient
    still lands; outside the referee ``release`` leaves the engine's own input alone."""
    monkeypatch.setattr(T, "INLINE_MAX_BYTES", 16)  # every tensor here travels as a spill file
    monkeypatch.setattr(T, "SPILL_DIR", str(tmp_path))

    def bwd_and_write(y, x):
        y.sum().backward()
        with torch.no_grad():
            x.mul_(0)  # the engine writes into its input after the backward (e.g. a backward that reuses it)

    tape, standin = _remote({"fwd": lambda x: (3 * x).sum(-1), "bwd": bwd_and_write})
    x = torch.arange(12.0).reshape(3, 4).requires_grad_(True)
    with T.remote(tape):
        y = call_engine("fwd", standin["fwd"], x)
        T.release(x)
        assert x.untyped_storage().nbytes() == 4 and x.shape == (3, 4) and x.stride() == (0, 0)
        call_engine("bwd", standin["bwd"], y, x)
    assert x.grad.tolist() == [[3.0] * 4] * 3
    assert list(tmp_path.iterdir()) == []  # the write's spill file was discarded, not left in shared memory
    mine = torch.ones(2, 2)
    T.release(mine)  # no referee: the engine's own input
    assert mine.untyped_storage().nbytes() == 16

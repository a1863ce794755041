"""The record and replay of engine calls (harness/core/tape.py) and the referee's module check
(properties/referee.py), issue 22 §1: in-process, tiny tensors."""

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


def _roundtrip(tape: T.Tape) -> T.Tape:
    return pickle.loads(pickle.dumps(tape))


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


def test_a_replay_gives_the_recorded_bytes_effects_and_versions_not_the_subclass_methods():
    tape = T.Tape()
    with T.recording(tape):
        y0, g0, b0, v0 = _family(ENGINE)
    replay = _roundtrip(tape)
    with T.replaying(replay):
        y, g, b, v = _family({k: lambda *a: pytest.fail("the engine ran in the replay") for k in ENGINE})
    replay.finish()
    assert type(y) is torch.Tensor and y.tolist() == [2.0, 4.0, 6.0]  # the bytes, not Lying.double()'s zeros
    assert y.requires_grad and y.grad_fn is not None
    assert g.tolist() == [2.0, 2.0, 2.0] and b.tolist() == [5.0, 5.0] and v == v0 == 1


def test_an_exception_is_replayed_as_the_same_crash():
    class EngineError(ValueError):
        pass

    def boom(x):
        raise EngineError("bad shard")

    tape = T.Tape()
    with T.recording(tape), pytest.raises(EngineCrash):
        call_engine("fwd", boom, torch.ones(1))
    with T.replaying(_roundtrip(tape)), pytest.raises(EngineCrash) as exc:
        call_engine("fwd", None, torch.ones(1))
    cause = exc.value.__cause__
    assert type(cause).__name__ == "EngineError" and isinstance(cause, ValueError) and str(cause) == "bad shard"
    assert "bad shard" in exc.value.engine_traceback


def test_a_diverging_replay_is_refused():
    tape = T.Tape()
    with T.recording(tape):
        call_engine("fwd", lambda x: x + 1, torch.ones(2))
    with T.replaying(_roundtrip(tape)), pytest.raises(T.ReplayDiverged):
        call_engine("fwd", None, torch.ones(3))  # another shape


def test_an_unknown_object_is_unreadable_in_the_replay():
    class Opaque:
        pass

    tape = T.Tape()
    with T.recording(tape):
        call_engine("fwd", lambda: Opaque())
    with T.replaying(_roundtrip(tape)):
        out = call_engine("fwd", None)
    with pytest.raises(TypeError, match="Opaque"):
        float(out)


def test_the_referee_refuses_engine_modules_and_their_pickles():
    from rlconform.properties import referee

    import rlconform.harness.mutants.naive_entropy  # noqa: F401 - an engine, as far as the referee is concerned

    assert "rlconform.harness.mutants.naive_entropy" in referee.touched_modules()
    with pytest.raises(pickle.UnpicklingError):
        referee.loads(pickle.dumps(rlconform.harness.mutants.naive_entropy.entropy))
    with pytest.raises(pickle.UnpicklingError):
        referee.loads(pickle.dumps(print))

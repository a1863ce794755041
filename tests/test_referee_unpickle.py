"""The worker → referee channel loads plain data only (:func:`rlconform.properties.referee.loads`): an exact
allow-list outside rlconform, rlconform's own data classes and computations defined where they are named, no
dotted names (pickle at protocol ≥ 4 follows them as attribute paths), nothing of an engine package."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from rlconform.properties import referee


def crafted(module: str, name: str, arg: str) -> bytes:
    """A protocol-4 pickle that calls ``module.name(arg)`` when loaded (STACK_GLOBAL, TUPLE1, REDUCE)."""
    def text(s: str) -> bytes:
        b = s.encode()
        return b"\x8c" + bytes([len(b)]) + b
    return b"\x80\x04" + text(module) + text(name) + b"\x93" + text(arg) + b"\x85R."


HOSTILE = [
    ("rlconform.harness.core.tape", "builtins.exec"),  # a dotted path out of an allowed module
    ("builtins", "exec"), ("builtins", "eval"), ("builtins", "getattr"), ("builtins", "__import__"),
    ("os", "system"), ("torch", "load"), ("numpy", "load"), ("torch.serialization", "load"),
    ("rlconform.harness.core.code_changes", "safe_git"),  # imported into a data module, defined elsewhere
    ("rlconform.harness.core.safe_git", "git"),  # a function of a module that is not a computation
    ("rlconform.harness.report.writer", "save_reproducer"), ("rlconform.harness.run.recorder", "save_reproducer"),
    ("rlconform.harness.mutants._base", "mutant"), ("rlconform.harness.bindings.reference", "binding"),
    ("rlconform.harness.core.faithful", "torch"),  # a module imported into an allowed one
]


@pytest.mark.parametrize("module,name", HOSTILE)
def test_a_hostile_global_is_refused_before_anything_runs(module, name, tmp_path):
    marker = tmp_path / "ran"
    payload = crafted(module, name, f"open({str(marker)!r}, 'w').close()")
    with pytest.raises(pickle.UnpicklingError, match="does not load"):
        referee.loads(payload)
    assert not marker.exists()


def test_the_dotted_path_runs_code_under_a_plain_unpickler(tmp_path):
    """What the allow-list stops: the plain unpickler follows ``tape.builtins.exec`` and runs the payload."""
    from rlconform.harness.core import tape  # noqa: F401 (the module the path starts from)

    marker = tmp_path / "ran"
    pickle.loads(crafted("rlconform.harness.core.tape", "builtins.exec", f"open({str(marker)!r}, 'w').close()"))
    assert marker.exists()


def test_plain_data_and_rlconforms_own_classes_still_load():
    from rlconform.harness.core import faithful
    from rlconform.harness.core.declared import Declared
    from rlconform.properties.case import Case

    case = Case("entropy", "matches_reference", "float32", "moderate", {"logits": np.ones((2, 3))})
    data = {"case": case, "fn": faithful.entropy, "dtype": torch.bfloat16, "shape": torch.Size([2, 3]),
            "x": np.float64(1.5), "a": np.arange(3.0), "t": (1, 2.0, "s", None, b"b"), "set": {1}}
    back = referee.loads(pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
    assert back["case"].finding_id == case.finding_id and back["fn"] is faithful.entropy
    assert back["dtype"] is torch.bfloat16 and back["shape"] == torch.Size([2, 3])
    assert back["x"] == 1.5 and back["a"].tolist() == [0.0, 1.0, 2.0] and back["t"] == (1, 2.0, "s", None, b"b")
    assert Declared.__module__.startswith(referee._DATA_MODULES)

"""The ``detached`` contract: an op a binding declares detached must give no gradient to
log_prob; a non-zero one fails, no graph or a zero gradient passes; detached and forward_only exclude each
other; verl and SkyRL declare their TIS weights detached (both call ``.detach()`` on them)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rlconform.harness.catalog.binding import Binding, BindingError, Variants
from rlconform.harness.families import importance_ratio as IR
from rlconform.harness.mutants.ir_attached_weight import binding as attached
from rlconform.properties.case import Case

X = {"log_prob": np.log([[0.5, 0.4, 0.3]]), "old_log_prob": np.log([[0.4, 0.4, 0.5]]),
     "mask": np.array([[True, True, False]]), "garbage": np.nan, "variant": "token_tis"}


def problems(binding):
    return IR.evaluate(binding, Case("importance_ratio", "matches_reference", "float32", "token_tis@moderate", X)).problems


def with_ratio(fn):
    return dataclasses.replace(attached, ops=dict(attached.ops, importance_ratio=Variants({v: fn(IR.faithful(v))
                                                                                        for v in IR.VARIANTS})))


def test_an_attached_weight_fails():
    (problem,) = problems(attached)
    assert problem.what == "unexpected gradient"  # what severity reads: a gradient where the binding declares none
    msg = problem.text
    assert "declared detached" in msg and "2 non-zero gradient(s)" in msg and "1.25" in msg  # r = 0.5/0.4


def test_a_detached_weight_passes():
    assert problems(with_ratio(lambda f: lambda lp, old, m: f(lp, old, m).detach())) == []


def test_a_zero_gradient_passes():
    assert problems(with_ratio(lambda f: lambda lp, old, m: f(lp.detach(), old, m) + 0 * lp)) == []


def test_detached_and_forward_only_exclude_each_other():
    with pytest.raises(BindingError, match="both forward_only"):
        Binding(name="x", ops={}, forward_only=frozenset({"importance_ratio"}), detached=frozenset({"importance_ratio"}))
    with pytest.raises(BindingError, match="only"):
        Binding(name="x", ops={}, detached=frozenset({"entropy"}))


@pytest.mark.engines
def test_engines_declare_their_tis_weights_detached():
    from rlconform.harness.bindings.skyrl import binding as skyrl
    from rlconform.harness.bindings.verl import binding as verl

    for b in (verl, skyrl):
        assert "importance_ratio" in b.detached and "importance_ratio" not in b.forward_only

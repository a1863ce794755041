"""``dp_masked_whiten`` on gloo DP ranks: the reference engine passes each property on the
small case of the mutant's docstring, each DP-whitening mutant fails the property it names with the
numbers it states, and the float64 reference of one DP rank's rows (merged exact moments) is the same
for every split. (tests/test_mutants.py runs the mutants through `rlconform check` under the CI profile.)"""

from __future__ import annotations

import numpy as np
import pytest

from rlconform.distributed_tests.checks import run_check
from rlconform.harness.bindings.load import load_engine
from rlconform.properties.case import Case
from rlconform.reference import masked_whiten
from rlconform.reference.whitening import exact_moments, merge_exact_moments

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module", autouse=True)
def _no_worker_outlives_the_module():
    """The session's gloo pool is closed after this module: its ranks must not outlive it into other
    tests of the same xdist worker (tests/test_robustness_interrupt.py counts this process's children)."""
    yield
    from rlconform.harness.workers.pool import close_all_pools

    close_all_pools()


def lone_row_case(prop: str, garbage: float = float("nan")) -> Case:
    """Three rows of rewards ≈ 1 on DP rank 0, one row ≈ 0 on DP rank 1 (4 tokens each, 2 padded)."""
    values = np.array([[1.0, 1.25, 0.0, 0.0], [0.75, 1.0, 0.0, 0.0], [1.0, 1.5, 0.0, 0.0], [0.0, 0.25, 0.0, 0.0]])
    mask = np.zeros((4, 4), bool)
    mask[:, :2] = True
    return Case("dp_masked_whiten", prop, "float32", "dp2_imbalanced",
                {"values": values, "mask": mask, "shift_mean": True, "garbage": garbage,
                 "partitions": [[[0, 3], [3, 4]], [[0, 1], [1, 4]]]})


@pytest.mark.parametrize("prop", ["matches_reference", "partition_invariant", "mask_invariant", "non_destructive"])
def test_reference_engine_passes(prop):
    outcome = run_check(load_engine("reference"), lone_row_case(prop))
    assert outcome.ok, outcome.message


def test_local_statistics_are_caught():
    m = load_engine("mutants.dp_local_whiten")
    outcome = run_check(m, lone_row_case("matches_reference"))
    assert not outcome.ok
    # the lone row whitened with its own statistics: ±0.707 instead of about −1.7 / −1.2
    exact = masked_whiten(lone_row_case("x").inputs["values"], lone_row_case("x").inputs["mask"])
    assert exact[3, 0] < -1.5 and "dp2 (rows per DP rank 0:3, 3:4" in outcome.message, outcome.message
    outcome = run_check(m, lone_row_case("partition_invariant"))
    assert not outcome.ok and ("unsharded (DP = 1)" in outcome.message or "second split" in outcome.message), \
        outcome.message
    assert run_check(m, lone_row_case("non_destructive")).ok  # the fault is in the values, not the inputs


def test_one_pass_variance_is_caught_at_an_offset():
    case = lone_row_case("matches_reference")
    case.inputs["values"] = 1e4 + case.inputs["values"] * 1e-2  # spread 1e-2 around 1e4: Σx² cancels in fp32
    outcome = run_check(load_engine("mutants.dp_one_pass_variance"), case)
    assert not outcome.ok, outcome.message
    assert run_check(load_engine("reference"), case).ok


def test_garbage_at_masked_positions_is_caught():
    engine = load_engine("mutants.dp_whiten_nan_times_mask")
    assert run_check(engine, lone_row_case("matches_reference")).ok  # right on clean inputs
    outcome = run_check(engine, lone_row_case("mask_invariant", garbage=float("inf")))
    assert not outcome.ok and "masked positions set to inf" in outcome.message, outcome.message


def test_whitening_in_place_is_caught():
    engine = load_engine("mutants.dp_whiten_inplace")
    assert run_check(engine, lone_row_case("matches_reference")).ok  # the returned values are right
    outcome = run_check(engine, lone_row_case("non_destructive"))
    assert not outcome.ok, outcome.message


def test_reference_of_a_rank_is_split_independent():
    case = lone_row_case("x")
    v, m = case.inputs["values"], case.inputs["mask"]
    whole = masked_whiten(v, m)
    for split in ([0, 3, 4], [0, 1, 4], [0, 2, 4]):
        parts = [exact_moments(v[a:b], m[a:b]) for a, b in zip(split, split[1:])]
        merged = merge_exact_moments(parts)
        rows = np.concatenate([masked_whiten(v[a:b], m[a:b], moments=merged) for a, b in zip(split, split[1:])])
        assert np.array_equal(rows, whole)


STATE_BINDING = '''
import torch

from rlconform.harness.bindings.reference import dp_masked_whiten as exact
from rlconform.harness.mutants._base import mutant


def dp_masked_whiten(local_values, local_mask, group, shift_mean=True):
    torch.set_grad_enabled(False)  # leaks into every later computation of the rank
    return exact(local_values, local_mask, group, shift_mean)


binding = mutant("grad_off_whiten", "turns grad mode off on the ranks", dp_masked_whiten=dp_masked_whiten)
'''


def test_a_rank_side_call_that_changes_torch_state_is_a_crash(tmp_path):
    """On the ranks, an engine call that flips global torch state fails its finding (with what
    changed), and the next case on the same pool starts from the restored state."""
    from rlconform.harness.core.evaluation import EngineCrash

    path = tmp_path / "grad_off_whiten.py"
    path.write_text(STATE_BINDING)
    with pytest.raises(EngineCrash) as info:
        run_check(load_engine(str(path)), lone_row_case("matches_reference"))
    assert "grad mode: True -> False" in info.value.engine_traceback, info.value.engine_traceback[-2000:]
    assert run_check(load_engine("reference"), lone_row_case("matches_reference")).ok

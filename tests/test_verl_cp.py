"""verl's ``distributed_masked_mean`` bound as ``cp_masked_mean``, on gloo CP ranks: it
reduces over the default group, so every rank takes part in every run (idle ranks of the unsharded run
pass an empty shard); it passes on a padded sequence whose second CP rank holds no valid token, its fp16
overflow and its NaN / inf leak from masked positions are pinned, the in-place-masking and NaN·0 mutants
fail ``non_destructive`` and ``mask_invariant``, and a layout with DP ranks is refused.
(tests/test_mutants.py runs ``mutants.cp_inplace_mask`` / ``cp_nan_times_mask`` through `rlconform check`.)"""

from __future__ import annotations

import numpy as np
import pytest

from rlconform.distributed_tests.checks import run_check
from rlconform.harness.bindings.load import load_engine
from rlconform.harness.catalog.binding import BindingError
from rlconform.properties.case import Case

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module", autouse=True)
def _no_worker_outlives_the_module():
    """The session's gloo pools are closed after this module (see tests/test_dp_whiten.py for why)."""
    yield
    from rlconform.harness.workers.pool import close_all_pools

    close_all_pools()


@pytest.fixture(scope="module")
def verl():
    return load_engine("verl")


def lopsided_case(prop: str, regime: str = "cp2_padded", dtype: str = "float32", garbage: float = np.nan) -> Case:
    """T = 8 in 2·cp = 4 chunks of 2: CP rank 0 holds positions 0, 1, 6, 7 (3 valid tokens), CP rank 1
    positions 2…5, all masked (5.0 there must not count). Token-mean 2.0 of {1, 2, 3}. ``mask_invariant``
    overwrites the masked positions with ``garbage``."""
    values = np.array([[1.0, 2.0, 5.0, 5.0, 5.0, 5.0, 3.0, 0.0]])
    mask = np.array([[True, True, False, False, False, False, True, False]])
    return Case("cp_masked_mean", prop, dtype, regime, {"values": values, "mask": mask, "garbage": garbage})


@pytest.mark.engines
@pytest.mark.parametrize("prop,regime", [("matches_reference", "cp2_padded"), ("partition_invariant", "cp2_padded"),
                                         ("partition_invariant", "tp2cp2_padded")])
def test_verl_passes_with_a_fully_masked_cp_rank(verl, prop, regime):
    outcome = run_check(verl, lopsided_case(prop, regime))
    assert outcome.ok, outcome.message


@pytest.mark.engines
def test_verl_fp16_masked_sum_overflows(verl):
    """Real defect: verl sums x·mask in fp16 (torch.sum keeps the dtype), so 4 tokens of 20000 per CP rank
    (local sum 80000 > 65504) give inf although the mean, 20000, is an fp16 number."""
    case = Case("cp_masked_mean", "matches_reference", "float16", "cp2_padded",
                {"values": np.full((1, 8), 20000.0), "mask": np.ones((1, 8), bool)})
    outcome = run_check(verl, case)
    assert not outcome.ok and "engine inf vs reference 20000.0" in outcome.message, outcome.message
    assert run_check(load_engine("reference"), case).ok  # fp32 accumulation: the same case passes


@pytest.mark.engines
@pytest.mark.parametrize("garbage", [np.nan, np.inf])
def test_verl_masked_garbage_poisons_the_mean(verl, garbage):
    """Real defect: distributed_masked_mean masks by multiplying (local_tensor * local_mask), so a NaN or
    inf at a masked position of CP rank 1 (which holds no valid token) makes the mean of every rank NaN."""
    outcome = run_check(verl, lopsided_case("mask_invariant", garbage=garbage))
    assert not outcome.ok, outcome.message
    assert f"masked positions set to {garbage!r} = nan vs cp2: CP rank 0 (global rank 0, 3 of 3 tokens) = 2.0" \
        in outcome.message, outcome.message


@pytest.mark.parametrize("engine,ok", [("reference", True), ("mutants.cp_nan_times_mask", False)])
def test_mask_invariant_tells_where_from_times(engine, ok):
    assert run_check(load_engine(engine), lopsided_case("mask_invariant", garbage=-np.inf)).ok is ok


def test_inplace_mask_mutant_is_caught():
    outcome = run_check(load_engine("mutants.cp_inplace_mask"), lopsided_case("non_destructive"))
    assert not outcome.ok
    assert "rank 1 (cp 1): input 'values' mutated during forward" in outcome.message, outcome.message
    assert "5.0 -> 0.0" in outcome.message, outcome.message


@pytest.mark.engines
def test_a_world_group_op_refuses_dp_ranks(verl):
    with pytest.raises(BindingError, match="DP > 1"):
        run_check(verl, lopsided_case("matches_reference", "cp2dp2_padded"))

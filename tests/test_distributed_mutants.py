"""The distributed checks (rlconform.distributed_tests): the reference engine passes them, each of the
distributed mutants is caught by its property on the small inputs of docs/bug-kinds.md, a rank failure becomes a
crash with every rank's traceback, a case runs unchanged under torchrun, and the harness's layout is
Megatron's. (tests/test_mutants.py runs the same mutants through `rlconform check` under the CI profile.)
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from rlconform.distributed_tests.checks import run_check
from rlconform.harness.bindings.load import load_engine
from rlconform.harness.catalog.ops import DISTRIBUTED_KINDS, OPS, strategy_for
from rlconform.harness.core.evaluation import EngineCrash
from rlconform.harness.core.layout import Layout, parse_regime, zigzag_index
from rlconform.harness.core.opinfo import split_regime
from rlconform.harness.workers.pool import _pid_alive, close_all_pools, get_pool
from rlconform.properties.case import Case, save_case

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module", autouse=True)
def _no_worker_outlives_the_module():
    yield
    from rlconform.harness.workers import pool as P

    pids = [pid for pool in list(P._POOLS.values()) for pid in pool.pids]
    close_all_pools()
    deadline = time.monotonic() + 60  # only catches workers that never end; a loaded machine may be slow
    while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
        time.sleep(0.05)
    assert not [p for p in pids if _pid_alive(p)]


@pytest.fixture(scope="module")
def reference():
    return load_engine("reference")


def mutant(name):
    return load_engine(f"mutants.{name}")


# ------------------------------------------------------------------------------------ the cases
def cp_case(prop: str) -> Case:
    """CP token count not reduced: one sequence, 8 tokens of loss 1.0, split 4/4 over CP = 2."""
    return Case("cp_masked_mean", prop, "float32", "cp2_all_on",
                {"values": np.ones((1, 8)), "mask": np.ones((1, 8), bool)})


def local_max_case(prop: str) -> Case:
    """Local max in a vocab-parallel softmax: TP = 2 shards [0, 0] | [5, 1]: local maxima 0 and 5 differ."""
    return Case("vocab_parallel_sum_pi_squared", prop, "float32", "tp2_moderate",
                {"logits": np.array([[0.0, 0.0, 5.0, 1.0]]), "grad_output": np.array([1.0]), "vocab": 4})


def order_case(prop: str = "non_destructive") -> Case:
    """Σπ² read after a destructive op: Σπ² before and after a vocab-parallel entropy forward + backward, TP = 2."""
    return Case("vocab_parallel_sum_pi_squared", prop, "float32", "tp2_after_entropy",
                {"logits": np.array([[2.0, 0.0, 1.0, -1.0], [0.5, 3.0, -2.0, 0.0]]),
                 "grad_output": np.array([1.0, -0.5]), "vocab": 4})


def dp_case(prop: str) -> Case:
    """Mean of per-shard means on two DP ranks: 1 token of 1.0 | 100 tokens of 2.0."""
    values = np.zeros((2, 100))
    values[0, 0], values[1, :] = 1.0, 2.0
    mask = np.zeros((2, 100), bool)
    mask[0, 0], mask[1, :] = True, True
    return Case("dp_metric_all_reduce", prop, "float64", "dp2_imbalanced",
                {"values": values, "mask": mask, "partitions": [[[0, 1], [1, 2]], [[0, 1], [1, 2]]]})


# ---------------------------------------------------------------------------------- the reference
@pytest.mark.parametrize("make,prop", [(cp_case, "matches_reference"), (cp_case, "partition_invariant"),
                                       (cp_case, "non_destructive"), (local_max_case, "matches_reference"),
                                       (local_max_case, "partition_invariant"), (order_case, "non_destructive"),
                                       (order_case, "matches_reference"), (dp_case, "matches_reference"),
                                       (dp_case, "partition_invariant")])
def test_reference_passes_the_cases_md_inputs(reference, make, prop):
    outcome = run_check(reference, make(prop))
    assert outcome.ok, outcome.message


def test_reference_passes_every_distributed_finding(reference):
    """Two drawn examples of every distributed finding (the CI run draws 10; tests/test_mutants.py runs it)."""
    findings = [(op.name, prop, dtype, regime) for op in OPS.values() if op.kind in DISTRIBUTED_KINDS
                for prop, dtype, regime in op.findings()]
    assert len(findings) > 150
    bad = []
    for op, prop, dtype, regime in findings:
        @settings(max_examples=2, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(inputs=strategy_for(op, dtype, regime))
        def run(inputs):
            outcome = run_check(reference, Case(op, prop, dtype, regime, inputs))
            if not outcome.ok:
                bad.append(f"{op}.{prop}.{dtype}.{regime}: {outcome.message[:300]}")

        run()
    assert not bad, "\n".join(bad[:10])


# ------------------------------------------------------------------------------------ the mutants
def test_cp_count_not_reduced_is_caught():
    m = mutant("cp_count_not_reduced")
    outcome = run_check(m, cp_case("matches_reference"))
    assert not outcome.ok and "engine 2.0 vs reference 1.0" in outcome.message, outcome.message
    outcome = run_check(m, cp_case("partition_invariant"))
    message = outcome.message
    assert not outcome.ok and "unsharded (CP = 1) = 1.0 vs cp2" in message and "= 2.0" in message, message
    assert "4 of 8 tokens" in message, message


def test_local_max_is_caught():
    m = mutant("local_max")
    for prop in ("matches_reference", "partition_invariant"):
        outcome = run_check(m, local_max_case(prop))
        assert not outcome.ok, prop
    outcome = run_check(m, local_max_case("matches_reference"))
    assert "value on TP rank 0 of tp2" in outcome.message and outcome.max_rel_err > 0.5, outcome.message
    # TP = 1 (every shard's max is the global max) stays right: the unsharded run of the same mutant agrees
    assert "unsharded (TP = 1)" in run_check(m, local_max_case("partition_invariant")).message


def test_destructive_order_is_caught():
    m = mutant("destructive_order")
    outcome = run_check(m, order_case("non_destructive"))
    assert not outcome.ok
    assert "Σπ² read after vocab_parallel_entropy forward+backward on the same logits differs" in outcome.message
    assert "mutated during vocab_parallel_entropy backward" in outcome.message
    assert not run_check(m, order_case("matches_reference")).ok
    # the entropy's own non-destructiveness finding
    ent = Case("vocab_parallel_entropy", "non_destructive", "float32", "tp2_moderate",
               {"logits": np.array([[2.0, 0.0, 1.0, -1.0]]), "grad_output": np.array([1.0]), "vocab": 4})
    assert "mutated during backward" in run_check(m, ent).message


# ------------------------------------------------------------------ DP properties can fail; crashes
BINDING_FILE = '''
import torch
import torch.distributed as dist

from rlconform.harness.mutants._base import mutant


def dp_metric_all_reduce(local_values, local_mask, group):
    """Mean of per-shard means: each DP rank emits its own masked mean; the all-reduce averages the means."""
    m = local_mask.to(torch.float64)
    t = ((local_values.double() * m).sum() / m.sum().clamp(min=1)).reshape(1)
    dist.all_reduce(t, group=group)
    return float(t / dist.get_world_size(group))


def vocab_parallel_entropy(local_logits, group):
    if dist.get_rank(group) == 1:
        raise ValueError("rank 1 gives up")
    t = torch.ones(1)
    dist.all_reduce(t, group=group)      # rank 0 waits for rank 1, which never comes
    return t


binding = mutant("test_file", "mean of rank means; an entropy that raises on TP rank 1",
                 dp_metric_all_reduce=dp_metric_all_reduce, vocab_parallel_entropy=vocab_parallel_entropy)
'''


@pytest.fixture(scope="module")
def file_binding(tmp_path_factory):
    path = tmp_path_factory.mktemp("binding") / "mean_of_means.py"
    path.write_text(BINDING_FILE)
    return load_engine(str(path))  # the ranks re-load it by this path


def test_dp_mean_of_rank_means_fails_both_properties(file_binding):
    outcome = run_check(file_binding, dp_case("matches_reference"))
    assert not outcome.ok and "engine 1.5 vs reference 1.99009900990099" in outcome.message, outcome.message
    outcome = run_check(file_binding, dp_case("partition_invariant"))
    assert not outcome.ok and "unsharded (DP = 1)" in outcome.message, outcome.message


def test_rank_failure_is_a_crash_with_every_rank(file_binding, reference):
    case = Case("vocab_parallel_entropy", "matches_reference", "float32", "tp2_moderate",
                {"logits": np.zeros((1, 4)), "grad_output": np.ones(1), "vocab": 4})
    pool = get_pool(2)
    started = pool.startups
    with pytest.raises(EngineCrash) as info:
        run_check(file_binding, case)
    text = info.value.engine_traceback
    assert "--- rank 0 ---" in text and "--- rank 1 ---" in text
    assert "ValueError: rank 1 gives up" in text
    assert "raised on rank(s) [1]" in str(info.value)
    assert run_check(reference, case).ok  # the pool was rebuilt
    assert pool.startups == started + 1


# ----------------------------------------------------------------------------------- torchrun
@pytest.mark.cli
@pytest.mark.slow
def test_a_case_runs_unchanged_under_torchrun(tmp_path):
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun is None:
        pytest.skip("torchrun not found next to the interpreter")
    path = tmp_path / "cp.json"
    save_case(cp_case("matches_reference"), path)
    import json

    doc = json.loads(path.read_text())
    doc["engine"] = {"spec": "mutants.cp_count_not_reduced", "path": None}
    path.write_text(json.dumps(doc))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "--module", "rlconform.harness.cli",
                           "replay", str(path), "--engine", "mutants.cp_count_not_reduced"],
                          capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert out.count("DISCREPANCY") == 1, out[-3000:]  # rank 0 prints the gathered results once
    assert "CP rank 0" in out and "CP rank 1" in out, out[-3000:]  # ... of every rank
    assert "engine 2.0 vs reference 1.0" in out
    assert "rank 0 exits 1 with this verdict" in out, out[-3000:]  # (torchrun may SIGTERM the other rank first)
    assert proc.returncode != 0


# ---------------------------------------------------------------------------------- the layout
def test_regimes_parse():
    assert parse_regime("tp2cp2_moderate") == (Layout(2, 2, 1), "moderate")
    assert parse_regime("dp4_imbalanced") == (Layout(1, 1, 4), "imbalanced")
    assert parse_regime("tp2_after_entropy") == (Layout(2), "after_entropy")
    assert Layout(2, 2).tp_groups() == [[0, 1], [2, 3]] and Layout(2, 2).cp_groups() == [[0, 2], [1, 3]]
    assert zigzag_index(8, 2, 0).tolist() == [0, 1, 6, 7] and zigzag_index(8, 2, 1).tolist() == [2, 3, 4, 5]
    for op in OPS.values():
        if op.kind in DISTRIBUTED_KINDS:
            for _, regime in op.cases():
                parse_regime(split_regime(regime)[1])  # an implementation's regime is impl@<layout>_<data>


@pytest.mark.engines
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_layout_is_megatrons():
    """Rank numbering, CP chunks and the per-layout parallel_state cache agree with megatron-core."""
    if importlib.util.find_spec("megatron") is None:
        pytest.skip("megatron-core is not installed: run `install/engines.sh .venv/bin/python megatron`")
    from rlconform.distributed_tests.ranks import megatron_layout_probe

    layouts = [Layout(2, 2), Layout(1, 1, 4), Layout(4), Layout(2, 2)]  # the last one comes from the cache
    results = get_pool(4).run(megatron_layout_probe, {"layouts": [lay.as_dict() for lay in layouts], "seq_len": 16})
    for rank, per_layout in enumerate(results):
        for layout, got in zip(layouts, per_layout):
            t, c, _ = layout.coords(rank)
            assert got["tp"] == next(g for g in layout.tp_groups() if rank in g), (rank, layout)
            assert got["cp"] == next(g for g in layout.cp_groups() if rank in g), (rank, layout)
            assert got["positions"] == zigzag_index(16, layout.cp, c).tolist(), (rank, layout)

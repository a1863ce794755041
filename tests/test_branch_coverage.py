"""Every listed branch of every variant's definition is taken by the CI profile's examples at ordinary
magnitudes: the families' ``BRANCHES`` (a predicate per branch over the inputs) counted over
the examples the CI profile draws from the ordinary regimes, in their first dtype (no engine runs:
strategies only). A branch no example takes fails, naming it. And every op with a loss / response mask
draws multi-turn rows: interior observation spans of one token and of several, runs at the start
and at the end, rows that are all observation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from rlconform.harness.catalog.ops import OPS, strategy_for
from rlconform.harness.core.branches import branch_counts
from rlconform.harness.core.opinfo import split_regime
from rlconform.harness.core.profiles import PROFILES, settings_for
from rlconform.harness.families import (
    advantages,
    importance_ratio,
    kl_estimator,
    policy_loss,
    rejection_mask,
    value_loss,
)

#: op -> (family module, the data regimes of ordinary magnitudes, the inputs' mask key)
FAMILIES = {
    "policy_loss": (policy_loss, ("moderate",), "mask"),
    "value_loss": (value_loss, ("moderate",), "mask"),
    "kl_estimator": (kl_estimator, ("moderate",), "mask"),
    "importance_ratio": (importance_ratio, ("moderate",), "mask"),
    "rollout_rejection_mask": (rejection_mask, ("moderate",), "mask"),
    "outcome_advantage": (advantages, ("uneven_groups", "singleton_groups", "near_constant"), "response_mask"),
}
CASES = [(op, v) for op, (mod, _, _) in FAMILIES.items() for v in OPS[op].variants]


def ci_examples(op: str, dtype: str, regime: str) -> list[dict]:
    """The CI profile's number of derandomized examples of one finding's strategy (as `check` draws them)."""
    drawn = []

    @settings(settings_for("ci"), database=None)
    @given(inputs=strategy_for(op, dtype, regime))
    def collect(inputs):
        drawn.append(inputs)

    collect.hypothesis.inner_test._hypothesis_internal_add_digest = f"{op}.{dtype}.{regime}".encode()
    collect()
    return drawn


def test_every_variant_lists_its_branches():
    for op, (mod, _, _) in FAMILIES.items():
        assert set(mod.BRANCHES) == set(OPS[op].variants), op


@pytest.mark.parametrize("op,variant", CASES, ids=[f"{o}[{v}]" for o, v in CASES])
def test_ci_examples_take_every_branch(op, variant):
    mod, ordinary, mask_key = FAMILIES[op]
    branches = mod.BRANCHES[variant]
    counts = {b.name: 0 for b in branches}
    regimes = [r for r in OPS[op].regimes if split_regime(r) in {(variant, d) for d in ordinary}]
    assert regimes, f"{op}[{variant}]: no ordinary regime"
    n = 0
    for regime in regimes:
        for dtype in OPS[op].regimes[regime][:1]:  # the predicates do not depend on the dtype: one is enough
            examples = ci_examples(op, dtype, regime)
            assert len(examples) <= PROFILES["ci"]
            n += len(examples)
            for x in examples:
                for name, k in branch_counts(branches, x, mask_key).items():
                    counts[name] += k
    missing = [name for name, k in counts.items() if k == 0]
    assert not missing, f"{op}[{variant}]: no CI-profile example of {regimes} takes {missing} ({n} examples; {counts})"


# ----------------------------------------------------------------------------- multi-turn masks
def mask_shapes(m) -> dict[str, int]:
    """Rows of a mask [B, T] by shape: interior masked spans of one token / of ≥ 2 tokens (a valid token on
    each side), a masked run at the start followed by a valid token, right padding, all observation."""
    import numpy as np

    m = np.asarray(m, bool)
    out = {"interior single token": 0, "interior run": 0, "start run": 0, "end run": 0, "all observation": 0}
    for row in m:
        if not row.any():
            out["all observation"] += 1
            continue
        valid = np.flatnonzero(row)
        first, last = valid[0], valid[-1]
        out["start run"] += first > 0
        out["end run"] += last < row.size - 1
        gaps = np.diff(valid) - 1
        out["interior single token"] += (gaps == 1).any()
        out["interior run"] += (gaps >= 2).any()
    return out


#: op -> (a regime and dtype of each op with a loss / response mask, the mask key)
MASKED = {"policy_loss": ("vanilla@moderate", "mask"), "value_loss": ("token-mean@moderate", "mask"),
          "kl_estimator": ("k3@moderate", "mask"), "importance_ratio": ("sequence_tis@moderate", "mask"),
          "rollout_rejection_mask": ("seq_sum_k1@moderate", "mask"),
          "outcome_advantage": ("grpo@uneven_groups", "response_mask"), "gae": ("padded", "response_mask"),
          "masked_whiten": ("padded", "mask"), "masked_mean": ("multi_turn", "mask"),
          "agg_loss": ("seq-mean-token-mean@imbalanced_partitions", "mask"),
          "metric_pipeline": ("imbalanced_partitions", "mask"), "dp_masked_whiten": ("dp2_imbalanced", "mask"),
          "cp_masked_mean": ("cp2_multi_turn", "mask")}


@pytest.mark.parametrize("op", sorted(MASKED))
def test_ci_examples_have_multi_turn_masks(op):
    regime, key = MASKED[op]
    seen = dict.fromkeys(mask_shapes([[True]]), 0)
    for x in ci_examples(op, OPS[op].regimes[regime][0], regime):
        for k, n in mask_shapes(x[key]).items():
            seen[k] += n
    assert all(seen.values()), f"{op}@{regime}: the CI examples have no row of {[k for k, n in seen.items() if not n]}"

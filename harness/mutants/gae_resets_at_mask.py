"""GAE that ends the episode at a masked token: the recurrence A_t = δ_t + γλ·A_{t'} and the
bootstrap V_{t'} restart from 0 after every masked position, instead of jumping over it to the next valid
token (verl 0.9.1 ``core_algos.compute_gae_advantage_return`` carries ``nextvalues`` and ``lastgaelam``
through masked columns, lines 250–256). With right padding the masked positions come after every valid
token, where a restart from 0 is the correct start: only a row with an interior observation span (a
multi-turn row) catches it — the tokens before the span lose the reward after it."""

import torch

from rlconform.harness.core.faithful import compute_dtype
from rlconform.harness.families.advantages import faithful_masked_whiten
from rlconform.harness.mutants._base import mutant


def gae(rewards, values, mask, gamma: float, lam: float):
    cd = compute_dtype(rewards.dtype)
    keep = mask != 0
    zero = torch.zeros((), dtype=cd)
    r = torch.where(keep, rewards.to(cd), zero)
    v = torch.where(keep, values.to(cd), zero)
    b, t = r.shape
    a_next = torch.zeros(b, dtype=cd)
    v_next = torch.zeros(b, dtype=cd)
    adv = torch.zeros_like(r)
    for i in range(t - 1, -1, -1):
        a_new = r[:, i] + gamma * v_next - v[:, i] + gamma * lam * a_next
        a_next = torch.where(keep[:, i], a_new, zero)  # the fault: a masked token resets the recurrence
        v_next = torch.where(keep[:, i], v[:, i], zero)
        adv[:, i] = torch.where(keep[:, i], a_next, zero)
    ret = torch.where(keep, adv + v, zero)
    return faithful_masked_whiten(adv, keep).to(rewards.dtype), ret.to(rewards.dtype)


EXPECTED = [("gae", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "gae.matches_reference.float32.padded",
    "gae.matches_reference.float64.padded",
]
binding = mutant("gae_resets_at_mask", __doc__, gae=gae)

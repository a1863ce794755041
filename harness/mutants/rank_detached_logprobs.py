"""Gradient check skipped without a graph under TP: a vocab-parallel log-prob whose output is detached on TP ranks ≥ 1
(e.g. a branch taken only where ``tp_rank != 0``). Values are exact on every rank; the vocab shards of
ranks ≥ 1 never receive a gradient. One rank's missing gradient must fail the gradient check, never drop
it for all ranks."""

import torch.distributed as dist

from rlconform.harness.bindings.reference import vocab_parallel_token_logprobs as _reference
from rlconform.harness.mutants._base import mutant


def vocab_parallel_token_logprobs(local_logits, labels, group):
    out = _reference(local_logits, labels, group)
    return out.detach() if dist.get_rank(group) > 0 else out


EXPECTED = [("vocab_parallel_token_logprobs", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "vocab_parallel_token_logprobs.matches_reference.float32.tp2_moderate",
    "vocab_parallel_token_logprobs.matches_reference.float64.tp2_moderate",
]
binding = mutant("rank_detached_logprobs", __doc__, vocab_parallel_token_logprobs=vocab_parallel_token_logprobs)

"""Label smoothing per vocab shard (the classic TP fault of label smoothing; Megatron-core 0.19.2
``_VocabParallelCrossEntropy.forward``): the smoothing term is computed per vocab shard — the mean of
log p over the *local* shard, with V the *partition's* size — and never reduced over the TP group. Each
TP rank then reports a different loss, none of them right; TP = 1 stays right. Logits [2, 0, 1, −1],
label 0, α = 0.5 over TP = 2: −1.1902 on the full vocab, −0.9402 on rank 0 and −1.4402 on rank 1."""

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_reduce as differentiable_all_reduce

from rlconform.harness.core import faithful as F
from rlconform.harness.mutants._base import mutant


def vocab_parallel_smoothed_token_logprobs(local_logits, labels, label_smoothing, group):
    x = local_logits.to(F.compute_dtype(local_logits.dtype))
    m = x.detach().max(-1, keepdim=True).values
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    s = differentiable_all_reduce((x - m).exp().sum(-1, keepdim=True), group=group)
    log_p = x - m - s.log()  # the local shard's log-probabilities (right)
    v_local = x.shape[-1]
    start = dist.get_rank(group) * v_local
    lab = labels.long()
    here = (lab >= start) & (lab < start + v_local)
    idx = torch.where(here, lab - start, torch.zeros_like(lab))
    picked = torch.where(here, log_p.gather(-1, idx.unsqueeze(-1)).squeeze(-1), torch.zeros((), dtype=x.dtype))
    picked = differentiable_all_reduce(picked, group=group)
    a = float(label_smoothing)
    out = (1.0 - a) * picked + a * log_p.mean(-1)  # the mean over this shard only: not reduced over TP
    return out.to(local_logits.dtype)


EXPECTED = [("vocab_parallel_smoothed_token_logprobs", "partition_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "vocab_parallel_smoothed_token_logprobs.partition_invariant.float32.tp2_moderate",
    "vocab_parallel_smoothed_token_logprobs.partition_invariant.float64.tp2_moderate",
]
binding = mutant("vp_smoothing_per_shard", __doc__,
                 vocab_parallel_smoothed_token_logprobs=vocab_parallel_smoothed_token_logprobs)

"""Σπ² read after a destructive op (verl PR #6153: Σπ² read from logits that a vocab-parallel
entropy backward already mutated. This entropy's forward is correct and non-destructive, but its
backward "saves memory" by computing the softmax inside the caller's logits shard (``sub_(max)``,
``exp_()``, ``div_(Σ exp)``) and never restores it. A Σπ² computed after the entropy's backward reads
softmax probabilities as if they were logits (a near-uniform distribution), and a producer that saved
the logits for its own backward can no longer backprop."""

import torch
import torch.distributed as dist

from rlconform.harness.bindings.reference import vocab_parallel_entropy as _correct_entropy
from rlconform.harness.core.faithful import compute_dtype
from rlconform.harness.mutants._base import mutant


class _DestructiveBackwardEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local_logits, group):
        with torch.enable_grad():  # the correct forward, detached from the caller's graph
            h = _correct_entropy(local_logits.detach(), group)
        ctx.save_for_backward(local_logits, h.detach().to(compute_dtype(local_logits.dtype)))
        ctx.group = group
        return h.detach()

    @staticmethod
    def backward(ctx, grad):
        logits, h = ctx.saved_tensors
        x = logits.detach()                       # the caller's storage
        m = x.amax(dim=-1, keepdim=True)
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=ctx.group)
        x.sub_(m).exp_()                          # softmax computed in place ...
        s = x.sum(-1, keepdim=True)
        dist.all_reduce(s, group=ctx.group)
        x.div_(s)                                 # ... and left there: x now holds p
        p = x.to(compute_dtype(x.dtype))
        logp = torch.where(p > 0, p.log(), torch.zeros_like(p))
        g = -p * (logp + h.unsqueeze(-1)) * grad.to(p.dtype).unsqueeze(-1)
        return g.to(logits.dtype), None


def vocab_parallel_entropy(local_logits, group):
    return _DestructiveBackwardEntropy.apply(local_logits, group)


EXPECTED = [("vocab_parallel_sum_pi_squared", "non_destructive")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "vocab_parallel_sum_pi_squared.non_destructive.float32.tp2_after_entropy",
    "vocab_parallel_sum_pi_squared.non_destructive.bfloat16.tp2_after_entropy",
]
binding = mutant("destructive_order", __doc__, vocab_parallel_entropy=vocab_parallel_entropy)

"""Backward subtract-then-add-back (verl PR #4711): the backward "subtracts then adds back" a constant on the
caller's logits (x.sub_(c) … x.add_(c)) to save memory. The bits do not come back: fp32 [1e4, 0.1]
returns 0.0996 for 0.1, and the version counter moves, so another op that saved x cannot backprop."""

import torch

from rlconform.harness.core.faithful import compute_dtype
from rlconform.harness.mutants._base import mutant


class _Entropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits):
        ctx.save_for_backward(logits)
        x = logits.to(compute_dtype(logits.dtype))
        logp = torch.log_softmax(x, -1)
        p = logp.exp()
        return (-(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)).to(logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        (logits,) = ctx.saved_tensors
        c = logits.detach().max(dim=-1, keepdim=True).values
        with torch.no_grad():
            logits.sub_(c)                        # "memory-saving" shift in place
            x = logits.to(compute_dtype(logits.dtype))
            logp = torch.log_softmax(x, -1)
            p = logp.exp()
            h = -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1, keepdim=True)
            g = -p * (torch.where(p > 0, logp, torch.zeros_like(logp)) + h)
            logits.add_(c)                        # "restore": not bit-exact
        return (g * grad.to(compute_dtype(logits.dtype)).unsqueeze(-1)).to(logits.dtype)


def entropy(logits):
    return _Entropy.apply(logits)


EXPECTED = [("entropy", "non_destructive")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "entropy.non_destructive.float32.moderate",
    "entropy.non_destructive.bfloat16.moderate",
]
binding = mutant("backward_sub_add", __doc__, entropy=entropy)

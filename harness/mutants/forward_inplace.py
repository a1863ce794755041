"""Forward overwrites fp32 logits in place (Megatron-core vocab_parallel_cross_entropy, verl PR #6153): the forward
subtracts the max, exponentiates and normalises inside the caller's tensor. ``.float()`` aliases an
fp32 input (mutated) but copies bf16/fp16 (untouched): fp32 logits [2, 0] become [0.8808, 0.1192]."""

import torch

from rlconform.harness.mutants._base import mutant


class _InplaceLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels):
        x = logits.float()                       # aliases fp32 input
        x.sub_(x.max(dim=-1, keepdim=True).values)
        shifted_label = x.gather(-1, labels.unsqueeze(-1)).squeeze(-1).clone()
        x.exp_()
        sum_exp = x.sum(dim=-1, keepdim=True)
        x.div_(sum_exp)                          # x now holds softmax probabilities
        ctx.save_for_backward(x.clone(), labels)
        return (shifted_label - sum_exp.squeeze(-1).log()).to(logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        p, labels = ctx.saved_tensors
        g = -p
        g.scatter_add_(-1, labels.unsqueeze(-1), torch.ones_like(labels, dtype=g.dtype).unsqueeze(-1))
        return (g * grad.float().unsqueeze(-1)).to(grad.dtype), None


def token_logprobs(logits, labels):
    return _InplaceLogProb.apply(logits, labels)


EXPECTED = [("token_logprobs", "non_destructive")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "token_logprobs.non_destructive.float32.moderate",
    "token_logprobs.non_destructive.float32.peaked",
]
binding = mutant("forward_inplace", __doc__, token_logprobs=token_logprobs)

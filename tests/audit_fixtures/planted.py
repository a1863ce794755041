"""Planted fault shapes for tests/test_audit.py: each ``bad_<rule>`` must be a hit of that rule, each
``good_<rule>`` (the fixed form) must not. Parsed only, never imported or run."""
import torch
import torch.distributed as dist


def bad_mask_multiply_reduce(x, mask):
    return (x * mask).sum() / mask.sum()


def bad_mask_multiply_reduce_via_name(x, mask):
    y = x * mask
    return torch.sum(y, dim=-1)


def good_mask_multiply_reduce(x, mask):
    return torch.where(mask.bool(), x, 0.0).sum() / mask.sum()


def bad_in_place_write(logits: torch.Tensor, m):
    logits = logits.float()  # a no-op on fp32: still the caller's tensor
    logits.sub_(m)
    return logits


def bad_in_place_slice(logits, mask):
    logits[mask] = 0.0
    return logits


def bad_in_place_augassign(logits: torch.Tensor, m):
    logits -= m
    return logits


class BadSavedForBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits):
        p = torch.softmax(logits, -1)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        p.mul_(grad)
        return p


def good_in_place_write(logits: torch.Tensor, m, out):
    logits = logits.clone()
    logits.sub_(m)
    torch.exp(logits, out=out)  # the caller's output buffer: written by contract
    return logits


def bad_log_of_softmax(x):
    return torch.log(torch.softmax(x, -1))


def bad_log_of_softmax_via_name(x):
    p = x.softmax(-1)
    return p.log()


def good_log_of_softmax(x):
    return torch.log_softmax(x, -1)


def bad_exp_unclamped_log_ratio(logp, old_logp):
    return torch.exp(logp - old_logp)


def bad_exp_unclamped_named(log_ratio):
    return log_ratio.exp()


def good_exp_clamped(logp, old_logp):
    return torch.exp(torch.clamp(logp - old_logp, -20.0, 20.0))


def good_exp_max_shift(x):
    m = x.amax(-1, keepdim=True)
    return torch.exp(x - m)


def bad_mean_of_means(micro_batches):
    means = []
    for x, mask in micro_batches:
        means.append(masked_mean(x, mask))
    return torch.stack(means).mean()


def bad_mean_of_means_comprehension(micro_batches):
    return sum([x.mean() for x in micro_batches]) / len(micro_batches)


def bad_mean_of_means_ranks(x, group):
    local = x.mean()
    dist.all_reduce(local, op=dist.ReduceOp.AVG, group=group)
    return local


def good_mean_over_tokens(micro_batches):
    total = sum(x.sum() for x in micro_batches)
    count = sum(x.numel() for x in micro_batches)
    return total / count


def bad_no_upcast_entropy(logits):
    p = torch.softmax(logits, -1)
    return torch.logsumexp(logits, -1) - (p * torch.where(torch.isinf(logits), 0.0, logits)).sum(-1)


def bad_no_upcast_variance(x):
    mu = x.mean()
    return (x ** 2).mean() - mu ** 2


def good_upcast_variance(x):
    x = x.float()
    mu = x.mean()
    return (x ** 2).mean() - mu ** 2


def bad_zero_times_neg_inf(logits):
    pd = torch.softmax(logits, -1)
    return -(pd * logits).sum(-1)


def bad_zero_times_neg_inf_logp(x):
    logp = torch.log_softmax(x, -1)
    return -(logp.exp() * logp).sum(-1)


def good_zero_times_neg_inf(logits):
    pd = torch.softmax(logits, -1)
    return -torch.special.xlogy(pd, pd).sum(-1)


def masked_mean(x, mask):
    return torch.where(mask.bool(), x, 0.0).sum() / mask.sum()

"""A binding whose ``logsumexp`` turns autograd off for the whole process (``torch.set_grad_enabled(False)``)
and whose ``token_logprobs`` has a real bug: its gradient is twice the true one (the value is right).
Without per-finding torch state, the first would turn every later finding into a crash of the harness's
own backward and hide the second."""

import torch

from rlconform.harness.catalog.binding import Binding
from rlconform.harness.core import faithful as F


def logsumexp(logits):
    out = F.logsumexp(logits)
    torch.set_grad_enabled(False)
    return out


def token_logprobs(logits, labels):
    logp = F.token_logprobs(logits, labels)
    return logp + (logp - logp.detach())  # same value, doubled gradient


binding = Binding(name="state_leak", ops={"logsumexp": logsumexp, "token_logprobs": token_logprobs})

"""Label smoothing from the log of the softmax (Megatron-core 0.19.2 ``_VocabParallelCrossEntropy.forward``, label_smoothing > 0): the
smoothing term takes ``log`` of the fp32 softmax probabilities. A vocab entry whose probability
underflows (logits more than ~104 below the max in fp32, ~17 in fp16) gives log 0 = −inf, so the mean
of log p — and the loss — is −inf where the exact value is finite (logits [0, −120], label 0, α = 0.1:
−6.0 exactly, −inf here). ``log_softmax`` never underflows this way."""

import torch

from rlconform.harness.core import faithful as F
from rlconform.harness.mutants._base import mutant


def smoothed_token_logprobs(logits, labels, label_smoothing):
    x = logits.to(F.compute_dtype(logits.dtype))
    p = torch.softmax(x, dim=-1)
    log_p = torch.log(p)  # −inf where p underflowed
    tlp = torch.log_softmax(x, dim=-1).gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    return ((1.0 - label_smoothing) * tlp + label_smoothing * log_p.mean(-1)).to(logits.dtype)


EXPECTED = [("smoothed_token_logprobs", "finite_where_reference_finite")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "smoothed_token_logprobs.finite_where_reference_finite.float32.moderate",
    "smoothed_token_logprobs.finite_where_reference_finite.bfloat16.moderate",
]
binding = mutant("smoothing_log_of_softmax", __doc__, smoothed_token_logprobs=smoothed_token_logprobs)

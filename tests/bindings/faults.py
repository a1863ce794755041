"""A binding whose ops end or abort their process in every way an engine can, on one input regime only
(``-inf``-padded logits, fully masked or fully unmasked values); correct (the reference) everywhere else. Used by
tests/test_robustness_process.py: each fault must be that finding's crash, and the run must go on."""

import ctypes
import os
import resource
import signal

import torch

from rlconform.harness.catalog.binding import Binding
from rlconform.harness.core import faithful as F


def _padded(logits) -> bool:
    return bool(torch.isinf(logits).any())


def logsumexp(logits):
    if _padded(logits):
        os._exit(0)  # "success" from inside the engine
    return F.logsumexp(logits)


def token_logprobs(logits, labels):
    if _padded(logits):
        ctypes.string_at(0)  # segmentation fault
    return F.token_logprobs(logits, labels)


def entropy(logits):
    if _padded(logits):
        raise KeyboardInterrupt("raised by the engine")
    return F.entropy(logits)


def sum_pi_squared(logits):
    if _padded(logits):
        raise SystemExit(0)
    return F.sum_pi_squared(logits)


def masked_sum(values, mask):
    if not mask.any():
        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
    return F.masked_sum(values, mask)


def masked_mean(values, mask):
    if not mask.any():
        os._exit(3)
    return F.masked_mean(values, mask)


def _vm_bytes() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))


def masked_max(values, mask):
    if mask.all():  # exhaust memory, bounded: the address space is capped 256 MiB above its size now
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + (256 << 20), hard))
        try:
            bytearray(16 << 30)
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    return F.masked_max(values, mask)


binding = Binding(name="faults", ops={
    "logsumexp": logsumexp, "token_logprobs": token_logprobs, "entropy": entropy, "sum_pi_squared": sum_pi_squared,
    "masked_sum": masked_sum, "masked_mean": masked_mean, "masked_max": masked_max,
})

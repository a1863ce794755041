"""Tamper vector "by accident": at import, this binding replaces ``torch.log_softmax``,
``torch.softmax`` and ``torch.exp`` (functions and ``Tensor`` methods) process-wide with a bf16
"memory-saving" version, the kind of patch a kernel library applies. Its ``entropy`` is verl-style
(``logsumexp − Σ softmax·logits``) and rounded to bf16: a real precision bug in float32.

Where the dtype-faithful path runs in the engine's process, it uses the patched functions, the tolerance
grows to match and the bug passes; the referee never imports this module, so the op must stay red."""

import torch

from rlconform.harness.catalog.binding import Binding

_ORIG = {"log_softmax": torch.log_softmax, "softmax": torch.softmax, "exp": torch.exp}
_ORIG_T = {"log_softmax": torch.Tensor.log_softmax, "softmax": torch.Tensor.softmax, "exp": torch.Tensor.exp}


def _bf16(fn):
    def patched(x, *args, **kwargs):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return fn(x.to(torch.bfloat16), *args, **kwargs).to(x.dtype)
        return fn(x, *args, **kwargs)

    return patched


for _name, _fn in _ORIG.items():
    setattr(torch, _name, _bf16(_fn))
for _name, _fn in _ORIG_T.items():
    setattr(torch.Tensor, _name, _bf16(_fn))


def entropy(logits):
    lse = torch.logsumexp(logits, dim=-1)
    return (lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)).to(torch.bfloat16).to(logits.dtype)


binding = Binding(name="tamper_global_softmax", ops={"entropy": entropy})

"""Tamper vector "lying tensor subclass" (what a wrapper library's tensor type may do): its
``entropy`` returns a ``torch.Tensor`` subclass whose data is half the true entropy, while ``.to()``,
``.double()``, ``.float()``, ``.numpy()``, ``.detach()``, ``.cpu()`` and ``.clone()`` answer with the true
value. A harness that reads the output through the returned object's own methods sees a correct entropy;
the referee reads the raw bytes of a plain tensor, so the op must stay red."""

import torch

from rlconform.harness.catalog.binding import Binding
from rlconform.harness.core import faithful as F


class LyingTensor(torch.Tensor):
    """Data: the buggy value; every reading method: the value it should have had (``_truth``)."""

    _truth: torch.Tensor

    def _lie(self):
        return self._truth

    def to(self, *args, **kwargs):
        return self._lie().to(*args, **kwargs)

    def double(self, *args, **kwargs):
        return self._lie().double()

    def float(self, *args, **kwargs):
        return self._lie().float()

    def numpy(self, *args, **kwargs):
        return self._lie().detach().numpy()

    def detach(self, *args, **kwargs):
        return self._lie().detach()

    def cpu(self, *args, **kwargs):
        return self._lie()

    def clone(self, *args, **kwargs):
        return self._lie().clone()


def entropy(logits):
    truth = F.entropy(logits)
    out = (0.5 * truth).as_subclass(LyingTensor)
    out._truth = truth
    return out


binding = Binding(name="tamper_subclass", ops={"entropy": entropy})

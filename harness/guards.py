"""The non-destructiveness guard: inputs must come back bit-identical, with unchanged version counters.

A trainer computes several statistics from one logits tensor (log-probs, entropy, Σπ²). If one of
them writes into the caller's tensor — in its forward (cases.md row 9: Megatron's vocab-parallel cross
entropy on fp32 logits) or in its backward (row 10: "subtract then add back") — every later reader sees
altered data and autograd may refuse to backprop through an op that saved the tensor (verl PR #6153).

:class:`InputGuard` snapshots tensors (``clone`` of the bits, ``_version``), and :meth:`check`
reports every tensor whose bits (``torch.equal`` on the raw bytes, so NaN positions and signed zeros
count) or version counter changed. No tolerance is ever applied.
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["InputGuard", "Mutation", "SavesOutputIdentity", "produce"]


@dataclasses.dataclass
class Mutation:
    """One input found altered: ``name``, ``stage`` ('forward'/'backward'), ``bits_changed``,
    ``version_before``/``version_after``, ``changed_elements``, a ``sample`` of (index, before, after)."""

    name: str
    stage: str
    bits_changed: bool
    version_before: int
    version_after: int
    changed_elements: int
    sample: list

    def describe(self) -> str:
        parts = []
        if self.bits_changed:
            parts.append(f"{self.changed_elements} element(s) changed, e.g. " + ", ".join(
                f"[{i}] {b!r} -> {a!r}" for i, b, a in self.sample))
        if self.version_after != self.version_before:
            parts.append(f"_version {self.version_before} -> {self.version_after}")
        return f"input {self.name!r} mutated during {self.stage}: " + "; ".join(parts)


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.is_floating_point() or t.is_complex():
        itemsize = t.element_size()
        int_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[itemsize]
        return t.contiguous().view(int_dtype)
    return t


class InputGuard:
    """Snapshot of named tensors; ``check(stage)`` lists :class:`Mutation` s since the snapshot."""

    def __init__(self, **tensors: torch.Tensor):
        self._tensors = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}
        self._bits = {k: _bits(v).clone() for k, v in self._tensors.items()}
        self._values = {k: v.detach().clone() for k, v in self._tensors.items()}
        self._versions = {k: v._version for k, v in self._tensors.items()}

    def check(self, stage: str) -> list[Mutation]:
        found = []
        for name, t in self._tensors.items():
            now_bits = _bits(t)
            same_shape = now_bits.shape == self._bits[name].shape
            bits_changed = (not same_shape) or not torch.equal(now_bits, self._bits[name])
            version = t._version
            if bits_changed or version != self._versions[name]:
                sample, n_changed = [], 0
                if bits_changed and same_shape:
                    diff = (now_bits != self._bits[name]).reshape(-1)
                    n_changed = int(diff.sum())
                    idx = torch.nonzero(diff).reshape(-1)[:3].tolist()
                    before = self._values[name].reshape(-1)
                    after = t.detach().reshape(-1)
                    sample = [(i, float(before[i]), float(after[i])) for i in idx]
                found.append(Mutation(name, stage, bits_changed, self._versions[name], version, n_changed, sample))
        return found


class SavesOutputIdentity(torch.autograd.Function):
    """Identity whose backward needs its saved *output*: a producer that saved its output for backward.

    If an engine writes into the tensor this returns, autograd raises "one of the variables needed for
    gradient computation has been modified by an inplace operation" on backward: exactly the failure
    seed 002 guards against.
    """

    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors  # raises if `out` was modified in place
        return grad * torch.ones_like(out)


def produce(leaf: torch.Tensor) -> torch.Tensor:
    """Return a non-leaf tensor equal to ``leaf`` that a producer op saved for its backward."""
    return SavesOutputIdentity.apply(leaf)

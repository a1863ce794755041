"""The non-destructiveness guard: inputs must come back bit-identical, with unchanged version counters.

A trainer computes several statistics from one logits tensor (log-probs, entropy, Σπ²). If one of
them writes into the caller's tensor — in its forward (“forward overwrites fp32 logits in place”: Megatron's vocab-parallel cross
entropy on fp32 logits) or in its backward (row 10: "subtract then add back") — every later reader sees
altered data and autograd may refuse to backprop through an op that saved the tensor (verl PR #6153).

:class:`InputGuard` snapshots tensors (``clone`` of the bits, ``_version``), and :meth:`check`
reports every tensor whose bits (``torch.equal`` on the raw bytes, so NaN positions and signed zeros
count) or version counter changed. No tolerance is ever applied.

Memory: one copy of the bits per tensor up to ``EXACT_MAX_BYTES`` (the values shown in a report are
read back from it). A larger tensor — logits at real shapes, ``[4096, 151936]`` fp32 is 2.5 GB — is
snapshotted as SHA-256 digests of its raw bytes in blocks of ``BLOCK_BYTES`` (32 bytes per MiB, hashed
on as many threads as torch has), so the guard never doubles memory; a change is
then located to its blocks, and the report gives the values found there now (the old ones are gone).
A change that keeps every digest would need a SHA-256 collision.
"""

from __future__ import annotations

import dataclasses
import hashlib
from concurrent.futures import ThreadPoolExecutor

import torch

__all__ = ["BLOCK_BYTES", "EXACT_MAX_BYTES", "InputGuard", "Mutation", "SavesOutputIdentity", "produce"]

#: Tensors up to this size (bytes) are snapshotted as an exact copy of their bits; larger ones as digests.
EXACT_MAX_BYTES = 64 << 20
#: Bytes per SHA-256 digest for large tensors.
BLOCK_BYTES = 1 << 20


@dataclasses.dataclass
class Mutation:
    """One input found altered: ``name``, ``stage`` ('forward'/'backward'), ``bits_changed``,
    ``version_before``/``version_after``, ``changed_elements``, a ``sample`` of (index, before, after).
    For a tensor guarded by digests (larger than ``EXACT_MAX_BYTES``): ``changed_blocks`` blocks of
    ``block_elements`` elements differ, ``changed_elements`` is −1 and ``sample`` holds (index, value now)
    at the start of the first changed block."""

    name: str
    stage: str
    bits_changed: bool
    version_before: int
    version_after: int
    changed_elements: int
    sample: list
    changed_blocks: int = 0
    block_elements: int = 0

    def clause(self):
        """This change as a ``mutation`` failure clause (:func:`rlconform.harness.core.failure.mutation`): the
        stage ``"forward"`` / ``"backward"``, or ``"<op> forward"`` for a pass of another op."""
        from rlconform.harness.core.failure import mutation

        return mutation(**self.record())

    def record(self) -> dict:
        """:meth:`clause`'s fields as a plain dict (what a rank sends back), the keywords of
        :func:`rlconform.harness.core.failure.mutation`."""
        by_op, _, phase = self.stage.rpartition(" ")
        out = {"tensor": self.name, "phase": phase, "sentence": self.describe(), "by_op": by_op,
               "versions": [self.version_before, self.version_after] if self.version_after != self.version_before
               else None}
        if self.bits_changed and not self.changed_blocks and self.sample:
            i, before, after = self.sample[0]
            out.update(changed=int(self.changed_elements), index=int(i), before=float(before), after=float(after))
        return out

    def describe(self) -> str:
        parts = []
        if self.bits_changed and self.changed_blocks:
            parts.append(f"the bits of {self.changed_blocks} block(s) of {self.block_elements} elements changed "
                         f"(SHA-256 digests of a large input), now e.g. " + ", ".join(
                             f"[{i}] {a!r}" for i, a in self.sample))
        elif self.bits_changed:
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


def _digests(t: torch.Tensor) -> tuple[list[bytes], int]:
    """(SHA-256 digest of each ``BLOCK_BYTES`` block of ``t``'s raw bytes in row-major order, elements
    per block). Works on a CPU copy one block at a time when ``t`` is not a contiguous CPU tensor."""
    flat = t.detach().reshape(-1)  # a view when t is contiguous
    per = max(1, BLOCK_BYTES // max(1, t.element_size()))
    starts = range(0, flat.numel(), per)

    def one(i):
        blk = _bits(flat[i:i + per]).cpu()
        return hashlib.sha256(memoryview(blk.numpy()).cast("B")).digest()  # hashlib releases the GIL

    workers = max(1, min(torch.get_num_threads(), len(starts)))
    if workers == 1:
        return [one(i) for i in starts], per
    with ThreadPoolExecutor(workers) as ex:
        return list(ex.map(one, starts)), per


class InputGuard:
    """Snapshot of named tensors; ``check(stage)`` lists :class:`Mutation` s since the snapshot.

    Extra memory: one copy of each tensor's bits up to ``EXACT_MAX_BYTES``, else 32 bytes per
    ``BLOCK_BYTES`` (digests). Raises nothing; non-tensor arguments are ignored.
    """

    def __init__(self, **tensors: torch.Tensor):
        self._tensors = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}
        self._bits, self._digests = {}, {}
        for k, v in self._tensors.items():
            if v.numel() * v.element_size() > EXACT_MAX_BYTES:
                self._digests[k] = _digests(v)
            else:
                self._bits[k] = _bits(v).clone()
        self._versions = {k: v._version for k, v in self._tensors.items()}

    def check(self, stage: str) -> list[Mutation]:
        from rlconform.harness.core import device

        device.sync_back()  # a CUDA run: what the engine wrote into its device copies, into these tensors first
        found = []
        for name, t in self._tensors.items():
            version = t._version
            if name in self._digests:
                m = self._check_digests(name, t, stage, version)
                if m is not None:
                    found.append(m)
                continue
            now_bits = _bits(t)
            same_shape = now_bits.shape == self._bits[name].shape
            bits_changed = (not same_shape) or not torch.equal(now_bits, self._bits[name])
            if bits_changed or version != self._versions[name]:
                sample, n_changed = [], 0
                if bits_changed and same_shape:
                    diff = (now_bits != self._bits[name]).reshape(-1)
                    n_changed = int(diff.sum())
                    idx = torch.nonzero(diff).reshape(-1)[:3].tolist()
                    before = self._bits[name].view(t.dtype).reshape(-1) if t.is_floating_point() or t.is_complex() \
                        else self._bits[name].reshape(-1)
                    after = t.detach().reshape(-1)
                    sample = [(i, float(before[i]), float(after[i])) for i in idx]
                found.append(Mutation(name, stage, bits_changed, self._versions[name], version, n_changed, sample))
        return found

    def _check_digests(self, name, t, stage, version):
        old, per = self._digests[name]
        new, _ = _digests(t) if t.numel() * t.element_size() > 0 else ([], per)
        changed = [i for i, (a, b) in enumerate(zip(old, new)) if a != b] + list(range(min(len(old), len(new)),
                                                                                      max(len(old), len(new))))
        if not changed and version == self._versions[name]:
            return None
        sample = []
        if changed:
            flat = t.detach().reshape(-1)
            i0 = changed[0] * per
            sample = [(i, float(flat[i])) for i in range(i0, min(i0 + 3, flat.numel()))]
        return Mutation(name, stage, bool(changed), self._versions[name], version, -1 if changed else 0, sample,
                        changed_blocks=len(changed), block_elements=per)


class SavesOutputIdentity(torch.autograd.Function):
    """Identity whose backward needs its saved *output*: a producer that saved its output for backward.

    If an engine writes into the tensor this returns, autograd raises "one of the variables needed for
    gradient computation has been modified by an inplace operation" on backward: exactly the failure
    verl PR #6153 guards against.
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

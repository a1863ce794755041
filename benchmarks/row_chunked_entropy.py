"""An engine for measuring the harness's memory at T = 4096 on a 24 GB machine: ``entropy`` of logits ``[T, V]``
computed and differentiated in row chunks, so the engine alone needs the logits, their gradient and a few
chunks (verl's ``entropy_from_logits`` needs about 7× the logits, 18 GB at ``[4096, 151936]`` fp32). What the
harness adds (the referee, the tape's spill files) does not depend on how the engine computes: it is the
logits' and the gradient's bytes, and the reference's chunks.

    python benchmarks/bench_real_shape_memory.py --engine benchmarks/row_chunked_entropy.py --rows 4096

The entropy is H = logsumexp(z) − Σ softmax(z)·z per row, computed in float32 for float32 logits; its
gradient is −p·(log p + H) times the upstream gradient. Shapes: logits ``[..., V]`` float32 or bfloat16,
result ``[...]`` of the logits' dtype.
"""

import torch

from rlconform.harness.catalog.binding import Binding

#: rows per chunk: 64 rows of a 151 936-token vocabulary are 39 MB of float32
ROWS_PER_CHUNK = 64


def _chunk_stats(z: torch.Tensor):
    """(log p, H) of float32 rows ``z``."""
    logp = torch.log_softmax(z, dim=-1)
    p = logp.exp()
    h = -torch.where(p > 0, p * logp, 0.0).sum(-1)  # a −inf logit has p = 0 and adds nothing
    return logp, h


class _RowChunkedEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits):
        ctx.save_for_backward(logits)
        out = torch.empty(logits.shape[:-1], dtype=logits.dtype)
        for r0 in range(0, logits.shape[0], ROWS_PER_CHUNK):
            _, h = _chunk_stats(logits[r0:r0 + ROWS_PER_CHUNK].float())
            out[r0:r0 + ROWS_PER_CHUNK] = h
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (logits,) = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for r0 in range(0, logits.shape[0], ROWS_PER_CHUNK):
            logp, h = _chunk_stats(logits[r0:r0 + ROWS_PER_CHUNK].float())
            g = grad_out[r0:r0 + ROWS_PER_CHUNK].float()[:, None]
            p = logp.exp()
            grad[r0:r0 + ROWS_PER_CHUNK] = torch.where(p > 0, -g * p * (logp + h[:, None]), 0.0)
        return grad


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of logits ``[..., V]`` per position: ``[...]`` of the logits' dtype."""
    return _RowChunkedEntropy.apply(logits.reshape(-1, logits.shape[-1])).reshape(logits.shape[:-1])


binding = Binding(name="row_chunked_entropy", ops={"entropy": entropy})

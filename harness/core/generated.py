"""Inputs described by a seed instead of stored: logits at real shapes (``real_shapes``).

A ``[T, V]`` logits tensor at V = 151 936 (Qwen) or 128 256 (Llama 3) and T up to 4096 is 0.6 G
entries: 5 GB as float64, ~25 GB as the hex floats of a case file. A :class:`LogitsGen` is what a case
holds instead: a seed, the shape and the parameters of the distribution. It is materialised when the
case runs, directly in the dtype under test (:meth:`LogitsGen.materialise`, built row block by row block
in float32, so no float64 copy of the logits ever exists), and any range of rows can be regenerated on
its own (:meth:`LogitsGen.rows`): the float64 reference and the faithful path read the logits in row
chunks, regenerated, instead of holding a second copy. The same description gives the same tensor on
every machine with the same torch version (torch's CPU generator, mt19937, seeded per row; NumPy's
``PCG64`` for the head tokens).

Distribution ``peaked_tail`` (realistic LM logits: a peaked head over a long tail): row ``i`` is

    x[i, v] = offset + tail_scale · z[i, v]                 z ~ N(0, 1) i.i.d. (torch.randn, row seed)
    x[i, head[i, k]] += peak · decay**k                      k = 0 … head_tokens − 1

with ``head[i, :]`` distinct-ish token ids drawn from NumPy's ``default_rng(seed)``. With peak 8–30
and tail_scale 1–4 the top token holds from a few percent to nearly all of the mass, the rest spread
over 10⁵ tail tokens: exactly where an fp32 or bf16 accumulation over V loses digits.

In a case file (:mod:`rlconform.properties.case`) it is the JSON object
``{"generated": "logits/peaked_tail", "seed", "shape", "peak", "tail_scale", "decay", "offset",
"head_tokens"}`` (floats as ``float.hex``); :meth:`LogitsGen.from_json` validates it.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

KIND = "logits/peaked_tail"
#: the largest description accepted (elements): 4096 × 151 936 is 6.2e8
MAX_ELEMENTS = 1 << 31

_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


class GeneratorError(ValueError):
    """A malformed generator description; the message says what is wrong."""


@dataclasses.dataclass(frozen=True)
class LogitsGen:
    """Logits ``[T, V]`` described by a seed (see the module doc). ``shape``: ``(T, V)``."""

    seed: int
    shape: tuple[int, int]
    peak: float = 20.0
    tail_scale: float = 2.0
    decay: float = 0.5
    offset: float = 0.0
    head_tokens: int = 2

    def __post_init__(self):
        if not (isinstance(self.seed, int) and 0 <= self.seed < 2**32):
            raise GeneratorError(f"seed must be an integer in [0, 2**32), not {self.seed!r}")
        if len(self.shape) != 2 or not all(isinstance(d, int) and d > 0 for d in self.shape):
            raise GeneratorError(f"shape must be [T, V] with positive integers, not {list(self.shape)}")
        if math.prod(self.shape) > MAX_ELEMENTS:
            raise GeneratorError(f"shape {list(self.shape)} holds more than {MAX_ELEMENTS} elements")
        for name in ("peak", "tail_scale", "decay", "offset"):
            v = getattr(self, name)
            if not (isinstance(v, float) and math.isfinite(v) and abs(v) <= 1e4):
                raise GeneratorError(f"{name} must be a finite float of magnitude ≤ 1e4, not {v!r}")
        if self.tail_scale < 0 or not 0 <= self.decay <= 1:
            raise GeneratorError("tail_scale must be ≥ 0 and decay in [0, 1]")
        if not (isinstance(self.head_tokens, int) and 0 <= self.head_tokens <= min(64, self.shape[1])):
            raise GeneratorError(f"head_tokens must be an integer in [0, min(64, V)], not {self.head_tokens!r}")

    @property
    def rows_count(self) -> int:
        return self.shape[0]

    @property
    def vocab(self) -> int:
        return self.shape[1]

    def head(self) -> np.ndarray:
        """The head token ids ``[T, head_tokens]`` (int64)."""
        return np.random.default_rng(self.seed).integers(0, self.vocab, size=(self.rows_count, self.head_tokens))

    def rows(self, dtype: str, r0: int = 0, r1: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``[r0, r1)`` as a ``dtype`` tensor ``[r1 − r0, V]`` (into ``out`` when given), the same values
        whatever the range: row i depends only on (seed, i)."""
        r1 = self.rows_count if r1 is None else r1
        if not 0 <= r0 <= r1 <= self.rows_count:
            raise GeneratorError(f"rows [{r0}, {r1}) outside [0, {self.rows_count})")
        t = _TORCH[dtype]
        n, v = r1 - r0, self.vocab
        if out is None:
            out = torch.empty(n, v, dtype=t)
        head = self.head()[r0:r1]
        bumps = torch.tensor([self.peak * self.decay**k for k in range(self.head_tokens)], dtype=torch.float32)
        g = torch.Generator()
        row = torch.empty(v, dtype=torch.float32)
        for i in range(n):
            g.manual_seed((self.seed << 24) + r0 + i + 1)
            torch.randn(v, generator=g, out=row)
            row.mul_(self.tail_scale).add_(self.offset)
            if self.head_tokens:
                idx = torch.from_numpy(head[i])
                row.index_add_(0, idx, bumps)
            out[i].copy_(row)  # rounded to the dtype under test (round-to-nearest-even)
        return out

    def materialise(self, dtype: str) -> torch.Tensor:
        """The whole ``[T, V]`` tensor in ``dtype`` (a fresh tensor; its memory is the only copy)."""
        return self.rows(dtype)

    def to_json(self) -> dict:
        return {"generated": KIND, "seed": self.seed, "shape": list(self.shape), "peak": self.peak.hex(),
                "tail_scale": self.tail_scale.hex(), "decay": self.decay.hex(), "offset": self.offset.hex(),
                "head_tokens": self.head_tokens}

    @classmethod
    def from_json(cls, obj) -> "LogitsGen":
        """Parse a description; :class:`GeneratorError` says what is wrong."""
        if not isinstance(obj, dict) or obj.get("generated") != KIND:
            raise GeneratorError(f"unknown generator {obj.get('generated') if isinstance(obj, dict) else obj!r:.60} "
                                 f"(known: {KIND})")
        extra = set(obj) - {"generated", "seed", "shape", "peak", "tail_scale", "decay", "offset", "head_tokens"}
        if extra:
            raise GeneratorError(f"unknown generator fields {sorted(extra)}")
        shape = obj.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise GeneratorError(f"'shape' must be a list of integers, not {shape!r:.60}")
        kw = {}
        for name in ("peak", "tail_scale", "decay", "offset"):
            raw = obj.get(name)
            try:
                kw[name] = float.fromhex(raw)
            except (TypeError, ValueError, OverflowError):
                raise GeneratorError(f"{name!r} must be a float.hex() string, not {raw!r:.40}") from None
        seed, heads = obj.get("seed"), obj.get("head_tokens")
        if isinstance(seed, bool) or isinstance(heads, bool):
            raise GeneratorError("'seed' and 'head_tokens' are integers")
        return cls(seed=seed, shape=tuple(shape), head_tokens=heads, **kw)

    def __repr__(self) -> str:
        return (f"LogitsGen({KIND}, seed={self.seed}, shape={list(self.shape)}, peak={self.peak:.3g}, "
                f"tail_scale={self.tail_scale:.3g}, decay={self.decay:.3g}, offset={self.offset:.3g}, "
                f"head_tokens={self.head_tokens})")


TOKENS_KIND = "tokens/padded_normal"
#: every row of a TokensGen is at most this long (a sequence), and the batch at most this many tokens
MAX_SEQUENCE = 1 << 16
MAX_TOKENS = 1 << 26


@dataclasses.dataclass(frozen=True)
class TokensGen:
    """Token values ``[B, T]`` and a right-padded mask described by a seed (``real_shapes`` of the
    reductions: sequences up to 32 768 tokens, more than 2^24 tokens in all).

    values = offset + scale · z, z ~ N(0, 1) (NumPy ``default_rng(seed)``, float32), rounded to the dtype
    under test; the mask keeps every row whole except ``short_rows`` rows (the last ones) of a random
    length in [0, T] (NumPy ``default_rng(seed + 1)``), so nnz is close to B·T."""

    seed: int
    shape: tuple[int, int]
    scale: float = 1.0
    offset: float = 0.0
    short_rows: int = 1

    def __post_init__(self):
        if not (isinstance(self.seed, int) and 0 <= self.seed < 2**32):
            raise GeneratorError(f"seed must be an integer in [0, 2**32), not {self.seed!r}")
        if len(self.shape) != 2 or not all(isinstance(d, int) and d > 0 for d in self.shape):
            raise GeneratorError(f"shape must be [B, T] with positive integers, not {list(self.shape)}")
        if self.shape[1] > MAX_SEQUENCE or math.prod(self.shape) > MAX_TOKENS:
            raise GeneratorError(f"shape {list(self.shape)}: at most {MAX_SEQUENCE} tokens a row and {MAX_TOKENS} "
                                 "in all")
        for name in ("scale", "offset"):
            v = getattr(self, name)
            if not (isinstance(v, float) and math.isfinite(v) and abs(v) <= 1e4):
                raise GeneratorError(f"{name} must be a finite float of magnitude ≤ 1e4, not {v!r}")
        if not (isinstance(self.short_rows, int) and 0 <= self.short_rows <= self.shape[0]):
            raise GeneratorError(f"short_rows must be an integer in [0, B], not {self.short_rows!r}")

    def lengths(self) -> np.ndarray:
        b, t = self.shape
        out = np.full(b, t, dtype=np.int64)
        if self.short_rows:
            out[b - self.short_rows:] = np.random.default_rng(self.seed + 1).integers(0, t + 1, size=self.short_rows)
        return out

    def nnz(self) -> int:
        return int(self.lengths().sum())

    def materialise(self, dtype: str) -> tuple[np.ndarray, np.ndarray]:
        """(values float64 ``[B, T]`` exactly representable in ``dtype``, mask bool ``[B, T]``)."""
        z = np.random.default_rng(self.seed).standard_normal(self.shape, dtype=np.float32)
        x = torch.from_numpy(z).mul_(self.scale).add_(self.offset)
        values = x.to(_TORCH[dtype]).to(torch.float64).numpy()
        del z, x
        mask = np.arange(self.shape[1])[None, :] < self.lengths()[:, None]
        return values, mask

    def to_json(self) -> dict:
        return {"generated": TOKENS_KIND, "seed": self.seed, "shape": list(self.shape), "scale": self.scale.hex(),
                "offset": self.offset.hex(), "short_rows": self.short_rows}

    @classmethod
    def from_json(cls, obj) -> "TokensGen":
        extra = set(obj) - {"generated", "seed", "shape", "scale", "offset", "short_rows"}
        if extra:
            raise GeneratorError(f"unknown generator fields {sorted(extra)}")
        shape = _int_list(obj.get("shape"))
        kw = {name: _hex(obj, name) for name in ("scale", "offset")}
        seed, short = obj.get("seed"), obj.get("short_rows")
        if isinstance(seed, bool) or isinstance(short, bool):
            raise GeneratorError("'seed' and 'short_rows' are integers")
        return cls(seed=seed, shape=tuple(shape), short_rows=short, **kw)

    def __repr__(self) -> str:
        return (f"TokensGen({TOKENS_KIND}, seed={self.seed}, shape={list(self.shape)}, scale={self.scale:.3g}, "
                f"offset={self.offset:.3g}, short_rows={self.short_rows}, nnz={self.nnz()})")


def _int_list(shape) -> list:
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise GeneratorError(f"'shape' must be a list of integers, not {shape!r:.60}")
    return shape


def _hex(obj: dict, name: str) -> float:
    raw = obj.get(name)
    try:
        return float.fromhex(raw)
    except (TypeError, ValueError, OverflowError):
        raise GeneratorError(f"{name!r} must be a float.hex() string, not {raw!r:.40}") from None


#: generator kind -> class (the ``generated`` field of a description)
KINDS = {KIND: LogitsGen, TOKENS_KIND: TokensGen}
GENERATED = (LogitsGen, TokensGen)


def from_json(obj):
    """A generator description (``{"generated": kind, ...}``) -> its object; :class:`GeneratorError`."""
    kind = obj.get("generated") if isinstance(obj, dict) else None
    if kind not in KINDS:
        raise GeneratorError(f"unknown generator {kind!r:.60} (known: {', '.join(KINDS)})")
    return KINDS[kind].from_json(obj)

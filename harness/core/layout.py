"""Parallel layouts of the distributed checks, and how a regime name encodes one.

A distributed regime is ``<layout>_<data regime>``: ``tp2_moderate``, ``tp4_neg_inf_padded``,
``tp2cp2_moderate``, ``cp2_padded``, ``dp4_imbalanced``, ``tp2_after_entropy``. The layout token is
``tp<N>``, ``cp<N>``, ``dp<N>`` or a concatenation in that order (``tp2cp2``); missing sizes are 1, and
the world is ``tp · cp · dp`` ranks.

Ranks are numbered as Megatron's ``parallel_state.initialize_model_parallel`` numbers them with its
default order ``tp-cp-ep-dp-pp``: TP fastest, then CP, then DP, so ``rank = t + tp·(c + cp·d)``; with
tp2cp2 the TP groups are {0, 1}, {2, 3} and the CP groups {0, 2}, {1, 3}
(``tests/test_distributed_mutants.py`` checks this against Megatron).

Context parallelism uses Megatron's load-balanced layout (``megatron.core.utils.get_batch_on_this_cp_rank``,
per-sequence zigzag): the sequence dimension T (a multiple of ``2·cp``) is cut into ``2·cp`` equal
chunks and CP rank ``c`` holds chunks ``c`` and ``2·cp − 1 − c``, in that order.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

_LAYOUT = re.compile(r"^(?:tp(\d+))?(?:cp(\d+))?(?:dp(\d+))?$")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Sizes of the TP, CP and DP dimensions (world = tp · cp · dp)."""

    tp: int = 1
    cp: int = 1
    dp: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp

    @property
    def name(self) -> str:
        parts = [f"{k}{v}" for k, v in (("tp", self.tp), ("cp", self.cp), ("dp", self.dp)) if v > 1]
        return "".join(parts) or "tp1"

    def rank(self, t: int = 0, c: int = 0, d: int = 0) -> int:
        return t + self.tp * (c + self.cp * d)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(tp rank, cp rank, dp rank) of a global rank."""
        return rank % self.tp, (rank // self.tp) % self.cp, rank // (self.tp * self.cp)

    def tp_groups(self) -> list[list[int]]:
        return [[self.rank(t, c, d) for t in range(self.tp)] for d in range(self.dp) for c in range(self.cp)]

    def cp_groups(self) -> list[list[int]]:
        return [[self.rank(t, c, d) for c in range(self.cp)] for d in range(self.dp) for t in range(self.tp)]

    def dp_groups(self) -> list[list[int]]:
        return [[self.rank(t, c, d) for d in range(self.dp)] for c in range(self.cp) for t in range(self.tp)]

    def as_dict(self) -> dict:
        return {"tp": self.tp, "cp": self.cp, "dp": self.dp}


def parse_regime(regime: str) -> tuple[Layout, str]:
    """``"tp2cp2_moderate"`` -> (Layout(tp=2, cp=2), "moderate")."""
    head, _, data = regime.partition("_")
    m = _LAYOUT.match(head)
    if not head or not m or not data:
        raise ValueError(f"distributed regime {regime!r} must look like <layout>_<data regime>, e.g. tp2_moderate")
    tp, cp, dp = (int(g) if g else 1 for g in m.groups())
    if min(tp, cp, dp) < 1:
        raise ValueError(f"bad layout in regime {regime!r}")
    return Layout(tp, cp, dp), data


def zigzag_index(seq_len: int, cp: int, cp_rank: int) -> np.ndarray:
    """Positions of the sequence held by CP rank ``cp_rank`` (Megatron's load-balanced 2·cp chunks)."""
    if cp == 1:
        return np.arange(seq_len)
    if seq_len % (2 * cp):
        raise ValueError(f"sequence length {seq_len} is not a multiple of 2·cp = {2 * cp}")
    chunk = seq_len // (2 * cp)
    first = np.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    second = np.arange((2 * cp - 1 - cp_rank) * chunk, (2 * cp - cp_rank) * chunk)
    return np.concatenate([first, second])


def row_chunks(n_rows: int, cp: int) -> list[np.ndarray]:
    """Rows of a flattened ``[N, V]`` token batch held by each CP rank (contiguous, as even as possible)."""
    return np.array_split(np.arange(n_rows), cp)

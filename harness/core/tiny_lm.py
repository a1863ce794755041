"""The model a step op trains: a causal LM as small as it gets, whose logits are an exact function of its
parameters (:func:`rlconform.reference.policy_step` computes its step in float64)."""

from __future__ import annotations

import torch

#: the parameters of :class:`TinyLM`, by name: ``[V, H]`` each
PARAMETERS = ("embed.weight", "head.weight")


class TinyLM(torch.nn.Module):
    """``logits = head(embed(input_ids))`` (``[..., V]``) with parameters ``embed.weight`` ``[V, H]`` and
    ``head.weight`` ``[V, H]`` (copied from ``params``, a dict of those names to tensors; their dtype is the
    model's). Called as a Hugging Face causal LM is (``input_ids``, ``attention_mask``, ``position_ids``,
    ``use_cache``; other keywords ignored); returns :class:`LMOutput` (``.logits`` / ``["logits"]``). The logits
    at a position depend on that position's token only (no attention), so the exact step needs none.

    Raises KeyError for a missing parameter, ValueError for shapes that differ."""

    def __init__(self, params: dict):
        super().__init__()
        embed, head = (params[name].detach() for name in PARAMETERS)
        if embed.shape != head.shape or embed.dim() != 2:
            raise ValueError(f"embed.weight {tuple(embed.shape)} and head.weight {tuple(head.shape)} must both be "
                             "[V, H]")
        vocab, hidden = embed.shape
        self.embed = torch.nn.Embedding(vocab, hidden, dtype=embed.dtype)
        self.head = torch.nn.Linear(hidden, vocab, bias=False, dtype=head.dtype)
        with torch.no_grad():
            self.embed.weight.copy_(embed)
            self.head.weight.copy_(head)

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, **kwargs):
        return LMOutput(logits=self.head(self.embed(input_ids)))


class LMOutput(dict):
    """What a Hugging Face model returns, as far as a trainer reads it: ``out.logits`` and ``out["logits"]``."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

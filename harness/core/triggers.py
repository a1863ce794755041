"""The *trigger* of a failing finding: the feature of its shrunk (worst) input that brings
the failure out, in a maintainer's words ("a row with no valid token", "a group of one sample", "a −inf
logit", "more than one micro-batch", "TP > 1", "bf16 input").

:func:`trigger` is the generic reading, over the input names the families share (``mask`` /
``response_mask`` ``[b, T]`` bool, ``index`` ``[b]`` group ids, ``logits`` ``[..., V]``, ``garbage`` (the
value ``mask_invariant`` writes at masked positions), ``partitions`` (mini-batch → DP rank → micro-batch
row ranges)) and the regime (``tp2_…``, ``cp2_…``, ``dp2_…``). A family may read its own inputs first:
:class:`rlconform.harness.families.OpFamily` ``trigger(case, clauses, kind) -> str | None`` (None: the
generic reading decides; ``clauses`` the failure record, :class:`rlconform.harness.core.failure.Clause`). Nothing
here reads rlconform's message: the record's fields, and the engine's own text (its exception, a line it
printed), decide. The first rule that applies wins:

==============================  =================================================================
trigger                         when
==============================  =================================================================
a rank-N input                  a ``contract`` clause: a documented input rank raised (its ``rank``)
numpy scalar values             the engine rejected a NumPy scalar type (its exception: ``Unsupported
                                value type: <class 'numpy.float32'>``) or printed one instead of
                                logging it (``not all numbers: [np.float32(0.0)]``)
tensor values                   the engine printed tensor-valued metrics instead of logging them
                                (``not all numbers: [tensor(0.)]``)
a masked position holding X     a numeric clause's ``masked`` (every family), or property
                                ``mask_invariant`` (X: the garbage it wrote: NaN, +inf, …)
a <shard> with no valid token   any property: a token count of 0 in a numeric clause's ``layout``
                                (``tokens per DP rank [1, 0]``, ``micro-batches (nnz) [0, 1]``)
more than one chunk             a crash or a changed tensor of a case whose ``chunk_size`` is below its
                                token count
more than one <shard>           property ``partition_invariant`` with a ``layout`` (else more than
                                one micro-batch in ``partitions``, else the TP / CP layout: ``TP > 1``)
bf16 input / fp16 input         kind ``inexact value`` (rounding-sized: the dtype is the trigger)
a −inf logit / a NaN input      a −inf in ``logits``, a NaN in any floating input
fp16 overflow                   float16 and kind ``inf``, or regime ``*fp16_extreme``
a row with no valid token       a finite wrong value (not NaN / inf) whose mask holds a row with no
                                True: the empty row, not the log-ratio's range, makes the mean wrong
                                (verl's SAPO, seq-mean-token-mean)
an extreme log-ratio            ``old_log_prob`` / ``log_prob`` more than 20 apart at a valid token;
                                for a NaN / inf beyond exp's range in the dtype (88.7 in float32 / bf16,
                                11.1 in fp16): ``a log-ratio past exp's <dtype> range``
a group of one sample           an ``index`` value held by one row only
a micro-batch with no valid     ``partitions`` (row ranges) with a partition of several shards, one
token / more than one           of them without a valid token / none empty: how the engine combines
micro-batch                     shards is what such a case tests
a row with no valid token       a mask row with no True (``no valid token in the batch``: none at
                                all; ``≤ 1 valid token in the batch``: one)
TP > 1 / CP > 1 / DP > 1        the regime's layout
any input                       otherwise
==============================  =================================================================

Kinds ``mutation`` and ``in-place on saved`` are ``any input`` unless a family says otherwise: an engine
that writes into its input does so whatever the values.
"""

from __future__ import annotations

import re

import numpy as np

from rlconform.harness.core import failure

_LAYOUT = re.compile(r"(?:^|[_@])(?P<axis>tp|cp|dp)(?P<n>\d+)")
MASK_NAMES = ("mask", "response_mask", "loss_mask", "attention_mask")
#: |log π − log π_old| beyond which exp() of the ratio leaves any dtype's comfortable range
EXTREME_LOG_RATIO = 20.0


def _array(value):
    if isinstance(value, np.ndarray):
        return value
    try:
        import torch

        if isinstance(value, torch.Tensor):
            return value.detach().cpu().float().numpy() if value.is_floating_point() else value.detach().cpu().numpy()
    except ImportError:  # pragma: no cover
        pass
    return None


def _garbage_words(g) -> str:
    try:
        x = float(g)
    except (TypeError, ValueError):
        return "garbage"
    if np.isnan(x):
        return "NaN"
    if np.isinf(x):
        return "+inf" if x > 0 else "−inf"
    return f"{x:g}"


def _shard_layout(clauses) -> dict | None:
    """The first token-counted ``layout`` of the numeric clauses (row ranges are not token counts)."""
    for c in clauses or ():
        lay = c.layout if c.kind in ("value", "nonfinite", "difference") else None
        if isinstance(lay, dict) and isinstance(lay.get("nnz"), list):
            return lay
    return None


_SHARD_WORDS = {"CP ranks": "CP rank", "DP ranks": "DP rank"}


def _partition_trigger(clauses, inputs: dict, regime: str = "") -> str:
    lay = _shard_layout(clauses)
    if lay:
        word = _SHARD_WORDS.get(lay.get("parts"), "micro-batch")
        if 0 in failure.counts(lay):
            return f"a {word} with no valid token"
        return f"more than one {word}"
    if _micro_batches(inputs) > 1:
        return "more than one micro-batch"
    return layout_trigger(regime) or "a different partition"


def partition_of(trigger: str) -> str | None:
    """The part a partition trigger names (``micro-batch``, ``DP rank``, ``CP rank``) — ``more than one
    micro-batch`` and ``a micro-batch with no valid token`` alike (an empty part is one of several: the latter
    is a case of the former) — or None for any other trigger."""
    import re

    m = re.fullmatch(r"more than one (micro-batch|DP rank|CP rank)|an? (micro-batch|DP rank|CP rank) with no valid "
                     r"token", trigger or "")
    return (m.group(1) or m.group(2)) if m else None


def _micro_batches(inputs: dict) -> int:
    """The most micro-batches one DP rank holds over ``inputs['partitions']`` (0: no partitions)."""
    parts = inputs.get("partitions")
    best = 0
    if isinstance(parts, (list, tuple)):
        for p in parts:
            for rank in p if isinstance(p, (list, tuple)) else ():
                if isinstance(rank, (list, tuple)) and rank and isinstance(rank[0], (list, tuple)):
                    best = max(best, len(rank))
    return best


def _leaves(partition) -> list[tuple[int, int]]:
    if isinstance(partition, (list, tuple)) and len(partition) == 2 and all(isinstance(x, int) for x in partition):
        return [tuple(partition)]
    out = []
    for p in partition if isinstance(partition, (list, tuple)) else ():
        out += _leaves(p)
    return out


def shard_trigger(inputs: dict) -> str | None:
    """For a case with ``partitions`` (row ranges of micro-batches) and a mask: ``a micro-batch with no
    valid token`` when some partition of more than one shard has an empty one, ``more than one
    micro-batch`` when some partition has several, else None."""
    parts, mask = inputs.get("partitions"), mask_of(inputs)
    if not isinstance(parts, (list, tuple)) or mask is None:
        return None
    several = False
    for p in parts:
        leaves = _leaves(p)
        if len(leaves) > 1:
            several = True
            if any(not mask[a:b].any() for a, b in leaves):
                return "a micro-batch with no valid token"
    return "more than one micro-batch" if several else None


def mask_of(inputs: dict):
    """The case's loss mask (``[b, T]`` bool) under one of :data:`MASK_NAMES`, or None."""
    for name in MASK_NAMES:
        a = _array(inputs.get(name))
        if a is not None and a.ndim >= 1:
            return a.astype(bool)
    return None


def mask_trigger(mask) -> str | None:
    """``a row with no valid token`` / ``no valid token in the batch`` / ``≤ 1 valid token in the batch``."""
    if mask is None:
        return None
    if mask.size == 0 or not mask.any():
        return "no valid token in the batch"
    if mask.ndim >= 2 and (~mask.reshape(mask.shape[0], -1).any(axis=1)).any():
        return "a row with no valid token"
    if int(mask.sum()) <= 1:
        return "≤ 1 valid token in the batch"
    return None


def group_trigger(index) -> str | None:
    """``a group of one sample`` when some group id is held by one row only."""
    a = _array(index) if not isinstance(index, (list, tuple)) else np.asarray(index, dtype=object)
    if a is None or a.size == 0:
        return None
    _, counts = np.unique(a.astype(str).ravel(), return_counts=True)
    return "a group of one sample" if (counts == 1).any() else None


def layout_trigger(regime: str) -> str | None:
    """``TP > 1`` (``CP > 1``, ``DP > 1``) from a regime like ``tp2_moderate`` / ``chunked@tp4_peaked``."""
    for m in _LAYOUT.finditer(regime or ""):
        if int(m["n"]) > 1:
            return f"{m['axis'].upper()} > 1"
    return None


def failing_labels(clauses) -> list[str]:
    """The labels of the ``value`` clauses beyond their tolerance, in order (a ``masked = G: `` prefix of a
    clause with garbage at the masked positions dropped)."""
    out = []
    for c in clauses or ():
        if c.kind != "value" or None in (c.engine, c.exact, c.tolerance) or abs(c.engine - c.exact) <= c.tolerance:
            continue
        label = c.label.strip()
        out.append(label.split(": ")[-1] if c.masked is not None and label.startswith("masked = ") else label)
    return out


#: the engine's words for a NumPy scalar it refused (an exception: ``Unsupported value type: <class
#: 'numpy.float32'>``) or printed instead of logging (SkyRL's reduce_metrics: "Metrics for key K are not all
#: numbers: [np.float32(0.0)]" / "[tensor(0.)]"): text the engine wrote, not rlconform's
_NUMPY_TYPE = re.compile(r"<class 'numpy\.[a-z0-9_]+'>")
_NOT_NUMBERS = re.compile(r"not all numbers: \[(?:(?P<np>np\.[a-z0-9_]+\()|(?P<t>tensor\())")


def said_trigger(clauses, crash_text: str = "") -> str | None:
    """The trigger the failure record alone shows (the first rows of the module table), else None, read from
    the clauses' fields (:mod:`rlconform.harness.core.failure`) and the engine's own text (its exception,
    ``crash_text``; a line it printed, a ``metric`` clause's ``printed``): ``a rank-N input`` (a ``contract``
    clause's ``rank``), ``numpy scalar values``, ``tensor values``, ``a masked position holding X`` (a numeric
    clause's ``masked``: the garbage is what the check changed, whatever else the input holds), ``a <shard>
    with no valid token`` (a token count of 0 in a numeric clause's ``layout``)."""
    clauses = list(clauses or ())
    for c in clauses:
        if c.kind == "contract" and c.rank is not None:
            return f"a rank-{c.rank} input"
    engine_text = [crash_text or ""] + [c.printed for c in clauses if c.kind == "metric" and c.printed]
    if any(_NUMPY_TYPE.search(t) for t in engine_text):
        return "numpy scalar values"
    for t in engine_text:
        m = _NOT_NUMBERS.search(t)
        if m:
            return "numpy scalar values" if m["np"] else "tensor values"
    for c in clauses:
        if c.kind in ("value", "nonfinite", "difference") and c.masked is not None:
            return f"a masked position holding {_garbage_words(c.masked)}"
    lay = _shard_layout(clauses)
    if lay and 0 in failure.counts(lay):
        return f"a {_SHARD_WORDS.get(lay.get('parts'), 'micro-batch')} with no valid token"
    return None


#: |Δ| beyond which exp(Δ) overflows the dtype (log of its largest finite value)
EXP_LIMIT = {"float16": 11.09, "bfloat16": 88.72, "float32": 88.72, "float64": 709.78}


def chunk_trigger(inputs: dict) -> str | None:
    """``more than one chunk (chunk_size C < N tokens)`` when the case holds a ``chunk_size`` smaller than
    its token count (the ``logits`` entries but the last, vocabulary, dimension), else None."""
    size, logits = inputs.get("chunk_size"), inputs.get("logits")
    shape = getattr(logits, "shape", None)
    try:
        c = int(size)
    except (TypeError, ValueError):
        return None
    if shape is None or len(shape) < 2 or c < 1:
        return None
    tokens = int(np.prod(shape[:-1]))
    return f"more than one chunk (chunk_size {c} < {tokens} tokens)" if tokens > c else None


def trigger(op: str, prop: str, dtype: str, regime: str, inputs: dict, clauses=(), kind: str = "",
            crash_text: str = "") -> str:
    """The generic trigger (module docstring table) of a failing finding's shrunk input; ``clauses`` its
    failure record (:class:`rlconform.harness.core.failure.Clause`), ``crash_text`` the engine's exception text."""
    inputs = inputs if isinstance(inputs, dict) else {}
    said = said_trigger(clauses, crash_text)
    if said:
        return said
    if prop == "mask_invariant":
        return f"a masked position holding {_garbage_words(inputs.get('garbage'))}"
    if prop == "partition_invariant":
        return _partition_trigger(clauses, inputs, regime)
    if kind == "inexact value":
        return {"bfloat16": "bf16 input", "float16": "fp16 input"}.get(dtype, "any input")
    chunks = chunk_trigger(inputs)
    if chunks and (kind.startswith("crash:") or kind in ("mutation", "in-place on saved")):
        return chunks  # a chunked implementation that breaks when one chunk's work meets another's
    if kind in ("mutation", "in-place on saved"):
        return "any input"
    logits = _array(inputs.get("logits"))
    if logits is not None and np.isneginf(logits).any():
        return "a −inf logit"
    for name, value in inputs.items():
        a = _array(value)
        if a is not None and a.dtype.kind == "f" and np.isnan(a).any() and name not in MASK_NAMES:
            return "a NaN input"
    if dtype == "float16" and (kind == "inf" or "fp16_extreme" in (regime or "")):
        return "fp16 overflow"
    if kind not in ("NaN", "inf") and shard_trigger(inputs) is None and \
            mask_trigger(mask_of(inputs)) == "a row with no valid token":
        return "a row with no valid token"  # a finite wrong value: the empty row, not exp's range (SAPO's row mean)
    old, new = _array(inputs.get("old_log_prob")), _array(inputs.get("log_prob"))
    if old is not None and new is not None and old.shape == new.shape:
        keep = mask_of(inputs)
        gap = np.abs(new - old) if keep is None or keep.shape != old.shape else np.abs(new - old)[keep]
        if gap.size and np.nanmax(gap) > EXTREME_LOG_RATIO:
            limit = EXP_LIMIT.get(dtype)
            if kind in ("NaN", "inf") and limit and np.nanmax(gap) > limit:  # exp itself overflows there
                return (f"a log-ratio past exp's {dtype} range (|log π − log π_old| > {limit:.3g}: "
                        f"exp overflows)")
            return f"an extreme log-ratio (|log π − log π_old| > {EXTREME_LOG_RATIO:g})"
    if "index" in inputs:
        g = group_trigger(inputs["index"])
        if g:
            return g
    return shard_trigger(inputs) or mask_trigger(mask_of(inputs)) or layout_trigger(regime) or "any input"

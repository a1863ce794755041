"""Rank side of the distributed checks: the module-level case functions every rank runs.

The pool (:mod:`rlconform.harness.workers.pool`) — or torchrun — calls ``fn(ctx, payload)`` on every rank. A
payload is a picklable description: the engine (its ``--engine`` spec and ``--engine-path``), the op,
the dtype, the mode, and a list of *runs* (a layout and this rank's shard of the data, or ``None`` when
the rank only takes part in the collective set-up of that layout). Results come back as float64 NumPy
arrays (exact for every float dtype) with the dtype name the engine returned.

Per worker process (cached for the life of the pool):

* the binding, re-loaded by its spec with :func:`rlconform.harness.bindings.load.load_engine`;
* the process groups of each layout (``ctx.new_group``; every rank creates every group, in order);
* for ops whose adapter declares ``rlconform_parallel_state = True`` (verl's vocab-parallel functions,
  which read Megatron's ``parallel_state`` groups instead of taking one), Megatron's ``parallel_state``
  initialised once per layout (``distributed_timeout_minutes=1``); switching layouts swaps the module's
  group globals between cached snapshots instead of re-creating groups. Such an op gets Megatron's
  group of that layout as its ``group`` argument, so the adapter sees the group its engine uses;
* for ops whose adapter declares ``rlconform_world_group = True`` (verl's ``distributed_masked_mean``,
  which all-reduces over the default group), the parent sends every rank a shard in every run (an
  empty one where the rank holds no token), so no rank sits out a collective.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlconform.harness.core import device, torch_state
from rlconform.harness.core.layout import Layout

_BINDINGS: dict = {}
_PS: dict = {"active": None, "snapshots": {}}

DTYPES = ("float16", "bfloat16", "float32", "float64")


def engine_desc(binding) -> dict:
    """What a rank needs to re-load ``binding``: its spec and engine path (or the binding itself when it
    was not loaded by spec; it must then pickle)."""
    if binding.spec:
        return {"spec": binding.spec, "path": binding.path}
    return {"binding": binding}


def load_binding(desc: dict):
    if "binding" in desc:
        return desc["binding"]
    key = (desc["spec"], desc.get("path"))
    b = _BINDINGS.get(key)
    if b is None:
        from rlconform.harness.bindings.load import load_engine

        b = load_engine(desc["spec"], desc.get("path"))
        _BINDINGS[key] = b
    return b


def uses_parallel_state(*impls) -> bool:
    return any(getattr(f, "rlconform_parallel_state", False) for f in impls if f is not None)


def uses_world_group(impl) -> bool:
    """The adapter reduces over the default (world) group, not the group it is given (verl's
    ``distributed_masked_mean``): every rank must call it in every run."""
    return bool(getattr(impl, "rlconform_world_group", False))


def _state_names(ps) -> list[str]:
    return [k for k in vars(ps) if k.startswith("_") and not k.startswith("__") and k.isupper()]


def activate_parallel_state(layout: Layout):
    """Megatron's parallel_state set to ``layout`` (initialised on first use; collective)."""
    from rlconform.harness.bindings._compat import import_megatron

    ps = import_megatron("megatron.core.parallel_state")
    key = (layout.tp, layout.cp)
    if _PS["active"] == key and ps.model_parallel_is_initialized():
        return ps
    snap = _PS["snapshots"].get(key)
    if snap is None:
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()  # only drops the module's references; snapshots keep the groups
        ps.initialize_model_parallel(tensor_model_parallel_size=layout.tp, context_parallel_size=layout.cp,
                                     distributed_timeout_minutes=1)
        snap = {k: getattr(ps, k) for k in _state_names(ps)}
        _PS["snapshots"][key] = snap
    else:
        for k, v in snap.items():
            setattr(ps, k, v)
    _PS["active"] = key
    return ps


def layout_groups(ctx, layout: Layout, parallel_state: bool = False) -> dict:
    """This rank's ``{"tp": group, "cp": group, "dp": group}`` for ``layout`` (collective: every rank
    calls it with the same layout)."""
    if layout.world != ctx.world_size:
        raise ValueError(f"layout {layout.name} needs {layout.world} ranks, the group has {ctx.world_size}")
    if parallel_state:
        ps = activate_parallel_state(layout)
        return {"tp": ps.get_tensor_model_parallel_group(), "cp": ps.get_context_parallel_group(),
                "dp": ps.get_data_parallel_group()}
    out = {}
    for kind, lists in (("tp", layout.tp_groups()), ("cp", layout.cp_groups()), ("dp", layout.dp_groups())):
        for ranks in lists:
            g = ctx.new_group(ranks)
            if ctx.rank in ranks:
                out[kind] = g
    return out


# ---------------------------------------------------------------------------------------- helpers
def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def to_numpy(x: Any) -> np.ndarray:
    """float64 NumPy copy (harness.tensors.as_numpy; imported lazily to keep the worker's import order)."""
    from rlconform.harness.core.tensors import as_numpy

    return as_numpy(x)


def dtype_name(x: Any, fallback: str) -> str:
    """dtype name of a float tensor, else ``fallback`` (harness.tensors.out_dtype)."""
    from rlconform.harness.core.tensors import out_dtype

    return out_dtype(x, fallback)


def _is_inplace_error(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("inplace" in text or "modified by an" in text)


def _backward(out, grad_output):
    """Backprop ``Σ grad_output · out`` (float64 weights, as the token-stat checks do)."""
    import torch

    if isinstance(out, torch.Tensor) and out.requires_grad:
        (out.to(torch.float64) * grad_output).sum().backward()
        return True
    return False


def _bits(t) -> np.ndarray:
    from rlconform.harness.core.guards import _bits as guard_bits

    return guard_bits(t).numpy().copy()


# ------------------------------------------------------------------------------- vocab parallel
def _vp_args(op: str, data: dict):
    import torch

    params = tuple(float(p) for p in data.get("params", ()))  # e.g. the label smoothing α, after the labels
    if op.endswith("token_logprobs"):
        return (torch.from_numpy(np.asarray(data["labels"], dtype=np.int64)),) + params
    return params


def _value_result(out, leaf, dtype: str) -> dict:
    import torch

    grad = leaf.grad if leaf is not None else None
    return {"out": to_numpy(out), "out_dtype": dtype_name(out, dtype),
            "graph": bool(isinstance(out, torch.Tensor) and out.requires_grad),
            "grad": None if grad is None else to_numpy(grad),
            "grad_dtype": None if grad is None else dtype_name(grad, dtype)}


def _vp_compute(mode: str, op: str, fn, entropy, group, data: dict, dtype: str, forward_only: bool = False) -> dict:
    import torch

    from rlconform.harness.core.guards import InputGuard, produce

    x = torch.from_numpy(np.asarray(data["logits"], dtype=np.float64)).to(_torch_dtype(dtype))
    g = torch.from_numpy(np.asarray(data["grad_output"], dtype=np.float64))
    extra = _vp_args(op, data)

    if mode == "value":
        leaf = x.clone().requires_grad_(True)
        out = fn(leaf, *extra, group)
        _backward(out, g)
        return _value_result(out, leaf, dtype)

    if mode == "after":  # the op read after a vocab-parallel entropy forward + backward on the same logits
        leaf = x.clone().requires_grad_(True)
        _backward(entropy(leaf, group), g)
        leaf.grad = None
        out = fn(leaf, *extra, group)
        _backward(out, g)
        return _value_result(out, leaf, dtype)

    messages: list = []  # records: a change of the logits (Mutation.record's fields) or a problem ({"problem", "sentence"})
    leaf = x.clone().requires_grad_(True)
    logits = produce(leaf)  # a producer that saved its output (the logits) for its own backward
    labels = {"labels": extra[0]} if extra else {}

    def backprop(out, what):
        try:
            _backward(out, g)
        except RuntimeError as exc:
            if not _is_inplace_error(exc):
                raise
            messages.append({"tensor": "logits", "phase": "backward", "evidence": "saved",
                             "by_op": what.removesuffix(" backward") if what != "the backward" else "",
                             "sentence": f"after {what}, a producer that saved the logits for backward could not "
                                        f"backprop: {str(exc).splitlines()[0]}"})

    if mode == "guard":
        guard = InputGuard(logits=logits, **labels)
        out = fn(logits, *extra, group)
        messages += [m.record() for m in guard.check("forward")]
        if not (isinstance(out, torch.Tensor) and out.requires_grad) and not forward_only:
            messages.append({"problem": "missing gradient", "sentence": "the output has no autograd graph "
                             "(requires_grad=False): the backward could not run, so its effect on the inputs is "
                             "unchecked (and no gradient reaches the logits)"})
        backprop(out, "the backward")
        messages += [m.record() for m in guard.check("backward")]
        return {"messages": messages}

    if mode == "order":  # verl PR #6153: Σπ² before and after a vocab-parallel entropy forward + backward
        guard = InputGuard(logits=logits)
        before = fn(logits, group).detach().clone()
        messages += [m.record() for m in guard.check("sum_pi_squared forward")]
        guard = InputGuard(logits=logits)
        ent = entropy(logits, group)
        messages += [m.record() for m in guard.check("vocab_parallel_entropy forward")]
        guard = InputGuard(logits=logits)
        backprop(ent, "vocab_parallel_entropy backward")
        messages += [m.record() for m in guard.check("vocab_parallel_entropy backward")]
        after = fn(logits, group).detach()
        b0, b1 = _bits(before), _bits(after)
        if b0.shape != b1.shape or not np.array_equal(b0, b1):
            diff = np.flatnonzero(b0.reshape(-1) != b1.reshape(-1)) if b0.shape == b1.shape else np.arange(1)
            i = int(diff[0])
            bv, av = to_numpy(before).reshape(-1), to_numpy(after).reshape(-1)
            messages.append({"tensor": "logits", "phase": "backward", "evidence": "read after",
                             "by_op": "vocab_parallel_entropy",
                             "sentence": f"Σπ² read after vocab_parallel_entropy forward+backward on the same logits "
                                     f"differs from Σπ² read before it in {diff.size} of {b0.size} element(s): "
                                     f"[{i}] {bv[i]!r} before, {av[i]!r} after"})
        return {"messages": messages, "before": to_numpy(before), "after": to_numpy(after)}
    raise ValueError(f"unknown mode {mode!r}")


def _with_chunk(impl, chunk_size):
    """``impl.fn`` with its chunk-size keyword set (the parallel_state marker kept)."""
    if impl.chunk_arg is None:
        return impl.fn

    def fn(*args):
        return impl.fn(*args, **{impl.chunk_arg: int(chunk_size)})

    fn.rlconform_parallel_state = getattr(impl.fn, "rlconform_parallel_state", False)
    return fn


def vocab_parallel_rank(ctx, payload: dict) -> list:
    """Case function of the vocab-parallel checks (one result per run; ``None`` where idle)."""
    binding = load_binding(payload["engine"])
    op, mode = payload["op"], payload["mode"]
    fn = binding.resolve(op)
    if payload.get("impl"):  # an alternative implementation, with its chunk size
        fn = _with_chunk(binding.resolve_implementation(op, payload["impl"]), payload.get("chunk_size"))
    entropy = None
    if mode in ("after", "order"):
        if "vocab_parallel_entropy" in binding.ops:
            entropy = binding.resolve("vocab_parallel_entropy")
        else:
            from rlconform.harness.bindings.reference import vocab_parallel_entropy as entropy
    ps = uses_parallel_state(fn, entropy)
    fn = device.engine_call(fn, ctx.device)  # the rank's device; the identity on the CPU
    if entropy is not None:
        entropy = device.engine_call(entropy, ctx.device)
    results = []
    for run in payload["runs"]:
        groups = layout_groups(ctx, Layout(**run["layout"]), ps)
        if run["data"] is None:
            results.append(None)
            continue
        with torch_state.guard():  # an engine call (forward or backward) that changes torch's global state fails
            results.append(_vp_compute(mode, op, fn, entropy, groups["tp"], run["data"], payload["dtype"],
                                       op in binding.forward_only))
    return results


# ----------------------------------------------------------------------- context parallel / DP
def _token_args(data: dict, dtype: str):
    import torch

    values = torch.from_numpy(np.asarray(data["values"], dtype=np.float64)).to(_torch_dtype(dtype))
    mask = torch.from_numpy(np.asarray(data["mask"], dtype=bool))
    return values, mask


def token_reduction_rank(ctx, payload: dict) -> list:
    """Case function of the CP and DP checks: ``fn(local_values, local_mask, group, *payload["args"])``
    where group is this rank's ``payload["group"]`` ("cp" or "dp") group of each run's layout. Each call
    runs under :func:`rlconform.harness.core.torch_state.guard` (a call that changes torch's global state fails
    on its rank)."""
    from rlconform.harness.core.guards import InputGuard

    binding = load_binding(payload["engine"])
    fn = binding.resolve(payload["op"])
    ps = uses_parallel_state(fn)
    fn = device.engine_call(fn, ctx.device)  # the rank's device; the identity on the CPU
    results = []
    for run in payload["runs"]:
        groups = layout_groups(ctx, Layout(**run["layout"]), ps)
        data = run["data"]
        if data is None:
            results.append(None)
            continue
        values, mask = _token_args(data, payload["dtype"])
        group = groups[run.get("group", payload["group"])]
        args = tuple(payload.get("args", ()))
        if payload["mode"] == "guard":
            guard = InputGuard(values=values, mask=mask)
            with torch_state.guard():
                fn(values, mask, group, *args)
            results.append({"messages": [m.record() for m in guard.check("forward")]})
        else:
            with torch_state.guard():
                out = fn(values, mask, group, *args)
            results.append({"out": to_numpy(out), "out_dtype": dtype_name(out, payload["dtype"]),
                            "out_type": type(out).__module__ + "." + type(out).__name__})
    return results


# ------------------------------------------------------------------------------------ self-tests
def megatron_layout_probe(ctx, payload: dict) -> list:
    """For each layout in ``payload["layouts"]``: this rank's TP / CP group members under Megatron's
    parallel_state (activated through the per-layout cache) and the sequence positions Megatron's
    ``get_batch_on_this_cp_rank`` gives this rank for ``arange(payload["seq_len"])``."""
    import torch
    import torch.distributed as dist

    from rlconform.harness.bindings._compat import import_megatron

    utils = import_megatron("megatron.core.utils")
    out = []
    for spec in payload["layouts"]:
        ps = activate_parallel_state(Layout(**spec))
        seq = payload["seq_len"]
        batch = {"tokens": torch.arange(seq).reshape(1, seq), "cu_seqlens": None}
        batch = utils.get_batch_on_this_cp_rank(batch, is_hybrid_cp=False, cp_group=ps.get_context_parallel_group())
        out.append({"tp": dist.get_process_group_ranks(ps.get_tensor_model_parallel_group()),
                    "cp": dist.get_process_group_ranks(ps.get_context_parallel_group()),
                    "positions": batch["tokens"].reshape(-1).tolist()})
    return out

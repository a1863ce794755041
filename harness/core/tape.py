"""Engine calls made in the engine's worker for an evaluation that runs in the referee.

The referee runs the family's ``evaluate`` itself; under :func:`remote`, each
:func:`~rlconform.harness.core.evaluation.call_engine` is sent to the engine's worker (:class:`Remote` in
the referee, :class:`Server` in the worker), which makes the call and records it (:meth:`Tape.record`) as
an :class:`Entry` — what the call returned, what it did to every tensor the evaluation has handed it or
got from it so far (data bytes, ``_version``, ``.grad``), what it printed, or what it raised — and the
referee applies the entry to its own tensors. The reference, the dtype-faithful path and the comparison
run once, in a torch no engine has touched.

Values are read as raw data, never through the returned object's methods: a tensor (any subclass) is
viewed as a plain ``torch.Tensor`` with ``torch.Tensor.as_subclass`` (which no ``__torch_function__``
override sees) and its bytes copied out with torch functions captured when this module was imported, i.e.
before the engine was. A tensor is recorded as dtype, shape, ``requires_grad``, whether it had a
``grad_fn``, and its bytes (above :data:`INLINE_MAX_BYTES`, in a file under :data:`SPILL_DIR` that the
reading side removes once it has read it); numpy arrays and scalars as dtype, shape and bytes; builtin
scalars, strings, ``None``, lists, tuples and dicts as themselves (a mapping becomes a ``dict``, a named tuple a ``tuple``). Anything else is recorded
as :class:`Unreadable` (its type's name): the referee gets a stand-in on which every use raises. An
exception is recorded as its type's name, its nearest builtin base, its message and its traceback text,
and re-raised in the referee as an :class:`~rlconform.harness.core.evaluation.EngineCrash` of an exception
of the same name and builtin base. A call that cannot be made or answered (rlconform's own failure, never
the engine's) raises :class:`ReplayDiverged`.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import hashlib
import io
import os
import pickle
import sys
import tempfile
import traceback
import uuid
from typing import Any

import numpy as np
import torch

from rlconform.harness.core import device
from rlconform.harness.workers.isolated import engine_call_deadline

# captured at import, before any engine module is imported in this process (an engine that patches them
# later does not change how its outputs are read)
_as_subclass = torch.Tensor.as_subclass
_TB = torch._C.TensorBase
_detach, _cpu, _contiguous, _reshape, _view = _TB.detach, _TB.cpu, _TB.contiguous, _TB.reshape, _TB.view
_numpy, _clone, _copy_, _requires_grad_ = _TB.numpy, _TB.clone, _TB.copy_, _TB.requires_grad_
_set_storage = _TB.set_
_frombuffer, _empty = torch.frombuffer, torch.empty
_set_version = torch._C._autograd._unsafe_set_version_counter
_no_grad = torch.no_grad
_Tensor = torch.Tensor

#: tensors larger than this travel in a file under :data:`SPILL_DIR`, not in the message
INLINE_MAX_BYTES = 4 << 20
#: where large tensors are spilled: ``RLCONFORM_SPILL_DIR`` if set (a benchmark measures its own), else shared
#: memory where there is one
SPILL_DIR = os.environ.get("RLCONFORM_SPILL_DIR") or (
    "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir())


class ReplayDiverged(Exception):
    """The referee's evaluation of the engine's calls went wrong on rlconform's side (an engine function
    called outside ``call_engine``, a call the worker could not make, record or answer). A harness error,
    never a verdict."""


class Replayed(Exception):
    """The engine's call (made in the worker) raised ``exc`` (rebuilt: same name and builtin base); ``traceback``: its text."""

    def __init__(self, exc: BaseException, traceback_text: str):
        super().__init__(str(exc))
        self.exc, self.traceback = exc, traceback_text


class Unreadable:
    """A value the engine returned that the referee cannot read (an object of a type of the engine's):
    every use raises ``TypeError`` naming the type."""

    def __init__(self, type_name: str, index: int | None = None):
        object.__setattr__(self, "_type_name", type_name)
        object.__setattr__(self, "_index", index)  # where the engine's worker keeps the object (or None)

    def _fail(self, *args, **kwargs):
        raise TypeError(f"the engine returned a {object.__getattribute__(self, '_type_name')} object, which the "
                        f"referee cannot read (a tensor, numpy value, number, string, list, tuple or dict is read)")

    def __getattr__(self, name):
        if name.startswith("__"):  # pickle, copy and repr look for optional dunders
            raise AttributeError(name)
        self._fail()

    __call__ = __iter__ = __len__ = __getitem__ = __float__ = __int__ = __bool__ = __index__ = _fail

    def __reduce__(self):
        return (Unreadable, (object.__getattribute__(self, "_type_name"), object.__getattribute__(self, "_index")))

    def __repr__(self):
        return f"<unreadable {object.__getattribute__(self, '_type_name')}>"


# -- encoding ------------------------------------------------------------------------------------------

_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool, torch.complex64, torch.complex128)}


def _plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a plain ``torch.Tensor`` (same storage), detached, on the CPU, contiguous."""
    p = _as_subclass(t, _Tensor) if type(t) is not _Tensor else t
    return _contiguous(_cpu(_detach(p)))


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of ``t`` (any subclass), read without calling its own methods."""
    p = _plain(t)
    if p.numel() == 0:
        return b""
    return _numpy(_view(_reshape(p, (-1,)), torch.uint8)).tobytes()


def digest(t: torch.Tensor) -> bytes:
    p = _plain(t)
    if p.numel() == 0:
        return b"" + str(tuple(p.shape)).encode()
    return hashlib.blake2b(memoryview(_numpy(_view(_reshape(p, (-1,)), torch.uint8))), digest_size=16).digest() \
        + str(tuple(p.shape)).encode()


@dataclasses.dataclass
class TensorData:
    dtype: str
    shape: tuple
    data: bytes | None  # None: in ``spill``
    spill: str | None = None
    requires_grad: bool = False
    has_grad_fn: bool = False

    @classmethod
    def of(cls, t: torch.Tensor, spill_dir: str | None = None) -> "TensorData":
        p = _plain(t)
        dtype = str(p.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise TypeError(f"a tensor of dtype {dtype} cannot be recorded")
        nbytes = p.numel() * p.element_size()
        q = _as_subclass(t, _Tensor) if type(t) is not _Tensor else t  # its flags, not its own properties
        rg, gf = bool(q.requires_grad), q.grad_fn is not None
        if nbytes > INLINE_MAX_BYTES:
            path = os.path.join(spill_dir or SPILL_DIR, f"rlconform-tape-{uuid.uuid4().hex}.bin")
            with open(path, "wb") as fh:
                fh.write(memoryview(_numpy(_view(_reshape(p, (-1,)), torch.uint8))))
            return cls(dtype, tuple(p.shape), None, path, rg, gf)
        return cls(dtype, tuple(p.shape), tensor_bytes(p), None, rg, gf)

    def raw(self) -> torch.Tensor:
        """A fresh plain tensor with the recorded data (no autograd flags). A spill file is read straight
        into the tensor's memory (no intermediate bytes: a ``[4096, 151936]`` fp32 gradient costs its own
        2.5 GB, not 3×), then removed: each record is read once, by the other side (a file
        left in ``/dev/shm`` would hold its bytes in memory for as long as the machine runs)."""
        dt = _DTYPES[self.dtype]
        if self.data is None:
            try:
                t = _empty(self.shape, dtype=dt)
                if t.numel():
                    with open(self.spill, "rb") as fh:
                        got = fh.readinto(memoryview(_numpy(_view(_reshape(t, (-1,)), torch.uint8))))
                    if got != t.numel() * t.element_size():
                        raise ReplayDiverged(f"the spilled tensor {self.spill} holds {got} bytes, expected "
                                             f"{t.numel() * t.element_size()}")
            finally:
                self.discard()
            return t
        if not self.data:
            return _empty(self.shape, dtype=dt)
        return _clone(_reshape(_frombuffer(bytearray(self.data), dtype=dt), self.shape))

    def discard(self) -> None:
        """Remove the spill file (unread, or read)."""
        if self.spill:
            try:
                os.unlink(self.spill)
            except OSError:
                pass

    def tensor(self) -> torch.Tensor:
        """The recorded tensor, with ``requires_grad`` and a graph node (a clone) where the engine's had them."""
        t = self.raw()
        if self.requires_grad and t.is_floating_point():
            _requires_grad_(t, True)
            if self.has_grad_fn:
                t = t.clone()
        return t


@dataclasses.dataclass
class NumpyData:
    dtype: str
    shape: tuple
    data: bytes
    scalar: bool  # a numpy scalar (np.float32(1.0)), not an array

    def value(self):
        a = np.frombuffer(self.data, dtype=np.dtype(self.dtype)).reshape(self.shape).copy()
        return a[()] if self.scalar else a


@dataclasses.dataclass
class TensorRef:
    """A tensor the evaluation already knows (an argument or an earlier result), by its registry index."""
    index: int


_SCALARS = (type(None), bool, int, float, complex, str, bytes)


def _encode(obj, tape: "Tape", depth: int = 0):
    if depth > 50:
        return Unreadable("deeply nested")
    if isinstance(obj, _SCALARS) and type(obj) in _SCALARS:
        return obj
    if isinstance(obj, torch.Tensor):
        idx = tape.index_of(obj)
        if idx is not None:
            return TensorRef(idx)
        dtype = str(_plain(obj).dtype).removeprefix("torch.")
        if dtype not in _DTYPES:  # the check cannot read it (an engine's output of an exotic dtype)
            return Unreadable(f"tensor of dtype {dtype}", tape.keep(obj))
        data = TensorData.of(obj, tape.spill_dir)
        tape.register(obj, data)
        return data
    if isinstance(obj, np.ndarray) or isinstance(obj, np.generic):
        a = np.asarray(obj)
        if a.dtype.kind in "OVU":
            return Unreadable(f"numpy {a.dtype}")
        return NumpyData(a.dtype.str, a.shape, a.tobytes(), isinstance(obj, np.generic))
    if isinstance(obj, (torch.dtype, torch.Size)):
        return obj if isinstance(obj, torch.dtype) else tuple(obj)
    if isinstance(obj, tuple):
        return ("__tuple__", [_encode(x, tape, depth + 1) for x in tuple.__iter__(obj)])
    if isinstance(obj, list):
        return ("__list__", [_encode(x, tape, depth + 1) for x in list.__iter__(obj)])
    if isinstance(obj, dict):
        return ("__dict__", [(_encode(k, tape, depth + 1), _encode(v, tape, depth + 1)) for k, v in dict.items(obj)])
    return Unreadable(type(obj).__qualname__, tape.keep(obj))


def _decode(obj, tape: "Tape"):
    if isinstance(obj, TensorData):
        t = obj.tensor()
        tape.register(t, None)
        return t
    if isinstance(obj, TensorRef):
        return tape.tensors[obj.index]
    if isinstance(obj, NumpyData):
        return obj.value()
    if isinstance(obj, tuple) and len(obj) == 2 and obj[0] in ("__tuple__", "__list__", "__dict__"):
        kind, items = obj
        if kind == "__tuple__":
            return tuple(_decode(x, tape) for x in items)
        if kind == "__list__":
            return [_decode(x, tape) for x in items]
        return {_decode(k, tape): _decode(v, tape) for k, v in items}
    return obj


def _tensors_in(obj, out: list, depth: int = 0) -> list:
    """Every tensor in ``obj`` (nested lists, tuples, dict values), in order."""
    if depth > 20:
        return out
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _tensors_in(x, out, depth + 1)
    elif isinstance(obj, dict):
        for x in dict.values(obj):
            _tensors_in(x, out, depth + 1)
    return out


# -- the tape -----------------------------------------------------------------------------------------

@dataclasses.dataclass
class Effect:
    """What a call did to a known tensor: new data, new ``_version``, new ``.grad`` (None: unchanged)."""
    index: int
    version: int
    data: TensorData | None = None
    grad: TensorData | None = None
    grad_cleared: bool = False


@dataclasses.dataclass
class Raised:
    type_name: str
    module: str
    builtin_base: str
    message: str
    traceback: str


@dataclasses.dataclass
class Entry:
    where: str
    arg_shapes: list  # (dtype, shape) of each tensor argument
    result: Any = None
    raised: Raised | None = None
    effects: list = dataclasses.field(default_factory=list)
    printed: tuple = ("", "")  # stdout, stderr


class Tape:
    """The engine calls of one evaluation, recorded in the engine's worker (:class:`Server`), and the
    registry of the tensors they were handed or returned, by index (shared with the referee's
    :class:`Remote`; see the module docstring)."""

    def __init__(self, spill_dir: str | None = None):
        self.entries: list[Entry] = []
        self.tensors: list[torch.Tensor] = []  # the registry: arguments and results, in first-seen order
        self._ids: dict[int, int] = {}
        self._state: list = []  # recording: last recorded (version, data digest, grad digest) per tensor
        self.objects: list = []  # recording: the unreadable objects the engine returned, by Unreadable._index
        self.spill_dir = spill_dir

    # registry
    def index_of(self, t) -> int | None:
        return self._ids.get(id(t))

    def register(self, t: torch.Tensor, data: TensorData | None) -> int:
        idx = self._ids.get(id(t))
        if idx is not None:
            return idx
        self._ids[id(t)] = len(self.tensors)
        self.tensors.append(t)
        self._state.append(None)
        return len(self.tensors) - 1

    def keep(self, obj) -> int:
        self.objects.append(obj)
        return len(self.objects) - 1

    def _snapshot(self, t):
        p = t if type(t) is _Tensor else _as_subclass(t, _Tensor)
        g = p.grad if p.is_leaf or p.retains_grad else None
        return (t._version, digest(t), None if g is None else digest(g))

    def record(self, where: str, fn, args, kwargs):
        """Call ``fn`` and append its :class:`Entry`; what it raises is recorded, then re-raised."""
        arg_tensors = _tensors_in((args, kwargs), [])
        for t in arg_tensors:
            idx = self.register(t, None)
            if self._state[idx] is None:
                self._state[idx] = self._snapshot(t)
        entry = Entry(where, [(str(t.dtype), tuple(t.shape)) for t in arg_tensors])
        self.entries.append(entry)
        out, err = io.StringIO(), io.StringIO()
        try:
            with _tee(out, err):
                result = fn(*args, **kwargs)
        except Exception as exc:
            entry.printed = (out.getvalue(), err.getvalue())
            entry.raised = _raised(exc)
            self._effects(entry)
            raise
        entry.printed = (out.getvalue(), err.getvalue())
        self._effects(entry)
        entry.result = _encode(result, self)
        for i, t in enumerate(self.tensors):
            if self._state[i] is None:
                self._state[i] = self._snapshot(t)
        return result

    def _effects(self, entry: Entry) -> None:
        for i, t in enumerate(self.tensors):
            before = self._state[i]
            if before is None:
                continue
            now = self._snapshot(t)
            if now == before:
                continue
            e = Effect(i, now[0])
            if now[1] != before[1]:
                e.data = TensorData.of(t, self.spill_dir)
            if now[2] != before[2]:
                p = t if type(t) is _Tensor else _as_subclass(t, _Tensor)
                g = p.grad if p.is_leaf or p.retains_grad else None
                if g is None:
                    e.grad_cleared = True
                else:
                    e.grad = TensorData.of(g, self.spill_dir)
            entry.effects.append(e)
            self._state[i] = now

    def _apply(self, entry: Entry) -> None:
        for e in entry.effects:
            if e.index >= len(self.tensors):
                raise ReplayDiverged(f"{entry.where!r}: an effect on tensor #{e.index}, which the referee does not know")
            t = self.tensors[e.index]
            if e.data is not None:
                with _no_grad():
                    new = e.data.raw()
                    if tuple(new.shape) == tuple(t.shape):
                        _copy_(_detach(t), new)
                    else:
                        t.data = new
            if e.grad is not None:
                t.grad = e.grad.raw()
            elif e.grad_cleared:
                t.grad = None
            _set_version((t,), (e.version,))

# -- engine calls only: the referee evaluates, the engine's worker answers each call ---------------------

class NotPortable(Exception):
    """What a call needs cannot travel to the engine's worker (a lambda or a closure of the family's code)."""


class Opaque:
    """An engine callable or object of the binding, as it travels: its index in the worker's table."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def _light(t) -> tuple:
    """What changes when the referee's own code changes ``t`` (the referee runs no engine: plain torch)."""
    g = t.grad if t.is_leaf or t.retains_grad else None
    return (t._version, t.data_ptr(), tuple(t.shape), None if g is None else (id(g), g._version))


class Remote(Tape):
    """The referee's tape of one evaluation whose engine calls run in the engine's worker, one by one.

    :func:`~rlconform.harness.core.evaluation.call_engine` under :func:`remote` hands ``(where, fn, args,
    kwargs)`` to :meth:`call`: ``fn`` and the arguments are pickled, every tensor as a reference to one
    both sides know (same registry indices as :class:`Tape`) or as new data with its ``_version``, every
    engine callable of the stand-in binding as :class:`Opaque`; ``exchange(bytes) -> bytes`` sends them
    to the worker (:class:`Server`), which runs the one call under :meth:`Tape.record` and answers with
    its :class:`Entry`; the entry's effects are applied to the referee's tensors, its result decoded
    against the registry, its exception raised (:class:`Replayed`). A ``fn`` that
    cannot travel (a lambda of the family's code) runs here, and each engine callable it calls is sent
    alone. What the referee's code changed on a known tensor since the last call (data, ``_version``,
    ``.grad``) travels with the next call. A gradient the worker put on a tensor that is an interior
    node here (a producer's output) is backpropagated here into the referee's own graph.

    ``loads(bytes)``: how entries are read (the referee's restricted unpickler)."""

    def __init__(self, exchange, loads, spill_dir: str | None = None):
        super().__init__(spill_dir)
        self._exchange, self._loads = exchange, loads
        self._light: list = []
        self._grads: dict = {}  # index -> the gradient last applied to an interior node
        self._hollow: set[int] = set()  # indices whose data the referee released (:meth:`hollow`)
        self.inside = 0  # depth of call_engine calls whose fn runs here
        self.calls = 0

    def hollow(self, t) -> None:
        """Release the referee's copy of the data of ``t``, an argument the engine's worker already holds its
        own copy of: ``t`` keeps its shape, dtype, autograd flags and registry index (later calls still name
        it, a gradient still lands on it) but its data becomes one element broadcast (stride 0), and what the
        engine later writes into it is not mirrored here. For an evaluation that never reads the input again
        (a ``[T, V]`` logits leaf whose reference is regenerated from the seed): the referee then holds the
        logits' bytes only while the call that sends them is made."""
        idx = self.index_of(t)
        if idx is None:
            return
        with _no_grad():
            _set_storage(t, _empty(1, dtype=t.dtype).untyped_storage(), 0, tuple(t.shape), (0,) * t.dim())
        self._hollow.add(idx)
        self._light[idx] = _light(t)

    def register(self, t, data) -> int:
        idx = super().register(t, data)
        while len(self._light) < len(self.tensors):
            self._light.append(None)
        return idx

    def call(self, where: str, fn, args, kwargs):
        try:
            packed = self._pack(fn, args, kwargs)
        except NotPortable:
            self.inside += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.inside -= 1
        return self._send(where, packed, args, kwargs)

    def call_opaque(self, where: str, index: int, args, kwargs):
        """An engine callable of the stand-in binding called by code that runs here."""
        return self._send(where, self._pack(Opaque(index), args, kwargs), args, kwargs)

    def _pack(self, fn, args, kwargs) -> bytes:
        pending: list = []

        def pid(obj):
            if isinstance(obj, _Tensor):
                idx = self.index_of(obj)
                if idx is not None:
                    return ("ref", idx)
                for j, q in enumerate(pending):
                    if q is obj:
                        return ("ref", len(self.tensors) + j)
                pending.append(obj)
                return ("new", len(self.tensors) + len(pending) - 1)
            if isinstance(obj, Opaque):
                return ("opaque", obj.index)
            if isinstance(obj, Unreadable):
                i = object.__getattribute__(obj, "_index")
                if i is None:
                    raise NotPortable("an unreadable value")
                return ("object", i)
            return None

        buf = io.BytesIO()
        p = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
        p.persistent_id = pid
        try:
            p.dump((fn, args, kwargs))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise NotPortable(str(exc)) from exc
        news = []
        for t in pending:
            news.append((TensorData.of(t, self.spill_dir), t._version))
            self.register(t, None)
        return pickle.dumps((self._sync(), news, buf.getvalue()), protocol=pickle.HIGHEST_PROTOCOL)

    def _sync(self) -> list:
        """Effects of the referee's own code on known tensors since the last call."""
        out = []
        for i, t in enumerate(self.tensors):
            before = self._light[i]
            now = _light(t)
            if before is None or now == before:
                self._light[i] = now
                continue
            e = Effect(i, t._version)
            if now[:3] != before[:3]:
                e.data = TensorData.of(t, self.spill_dir)
            if now[3] != before[3]:
                g = t.grad if t.is_leaf or t.retains_grad else None
                if g is None:
                    e.grad_cleared = True
                else:
                    e.grad = TensorData.of(g, self.spill_dir)
            out.append(e)
            self._light[i] = now
        return out

    def _send(self, where, packed: bytes, args, kwargs):
        self.calls += 1
        answer = self._loads(self._exchange(packed))
        if isinstance(answer, str):
            raise ReplayDiverged(f"{where!r}: the engine's worker could not make the call: {answer}")
        if not isinstance(answer, Entry):
            raise ReplayDiverged(f"{where!r}: the engine's worker answered a {type(answer).__name__}")
        try:  # the entry is not kept: its data lives on in the tensors it made
            return self._take(where, answer, args, kwargs)
        finally:
            _discard(answer)  # what a failure left unread
            for i, t in enumerate(self.tensors):
                self._light[i] = _light(t)

    def _take(self, where, entry: Entry, args, kwargs):
        for e in entry.effects:  # a released input's new data is not wanted here (nor is its spill file)
            if e.index in self._hollow and e.data is not None:
                e.data.discard()
                e.data = None
        with _no_grad():
            interior = {e.index: self.tensors[e.index] for e in entry.effects if e.grad is not None
                        and e.index < len(self.tensors) and self.tensors[e.index].grad_fn is not None}
        self._apply(entry)
        for i, t in interior.items():  # a producer's output got a gradient in the worker: on into our graph
            g = t.grad
            t.grad = None
            prev = self._grads.get(i)
            delta = g if prev is None else g - prev
            self._grads[i] = g
            try:
                torch.autograd.backward([t], [delta.to(t.dtype)])
            except RuntimeError as exc:  # e.g. the engine wrote into a producer's saved output: its backward fails
                raise Replayed(exc, "".join(traceback.format_exception(exc))) from exc
        return _finish(entry, self)


class _Produced(torch.autograd.Function):
    """Identity whose output (at ``_version`` ``version``) is saved for backward, like
    :class:`rlconform.harness.core.guards.SavesOutputIdentity`: written in place, it fails backward."""

    @staticmethod
    def forward(ctx, x, version):
        out = x.clone()
        _set_version((out,), (version,))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        ctx.saved_tensors  # noqa: B018 - raises when the output was modified in place
        return grad, None


class Server:
    """The engine's worker's end of a :class:`Remote` evaluation: ``handle(bytes) -> bytes`` runs one call.

    ``opaque``: the binding's engine callables and objects, by :class:`Opaque` index. A tensor that is an
    interior node in the referee (it has a ``grad_fn``) is rebuilt here as the output of a producer that
    saved it for backward (:func:`rlconform.harness.core.guards.produce`), which keeps its gradient:
    what the engine may do to it (write in place, backpropagate through it) is what it may do in the
    family's own evaluation. On a CUDA run each call runs on the device
    (:func:`rlconform.harness.core.device.engine_call`, as :func:`~rlconform.harness.core.evaluation.call_engine`
    does without a referee) and its record is of the CPU side. The answer is the pickled :class:`Entry`, or a string when the call could not
    be made (a harness error). ``raised`` keeps each exception the engine raised, by its recorded
    traceback text (the worker reports a crash with the engine's own exception)."""

    def __init__(self, opaque: list, guard, spill_dir: str | None = None):
        self.tape = Tape(spill_dir)
        self.opaque, self.guard = opaque, guard
        self.raised: dict = {}  # recorded traceback text -> the exception the engine raised

    def _new(self, data: TensorData, version: int):
        t = data.raw()
        if data.requires_grad and t.is_floating_point():
            if data.has_grad_fn:
                t = _Produced.apply(_requires_grad_(t, True), version)
                t.retain_grad()
                return t
            _requires_grad_(t, True)
        _set_version((t,), (version,))
        return t

    def handle(self, message: bytes) -> bytes:
        tape = self.tape
        sync = news = None
        try:
            sync, news, packed = pickle.loads(message)
            if sync:
                tape._apply(Entry("sync", [], effects=sync))
                for e in sync:
                    tape._state[e.index] = tape._snapshot(tape.tensors[e.index])
            base = len(tape.tensors)
            fresh = [self._new(d, v) for d, v in news]

            def load(pid):
                kind, i = pid
                if kind == "ref":
                    return tape.tensors[i] if i < base else fresh[i - base]
                if kind == "new":
                    return fresh[i - base]
                if kind == "opaque":
                    return self.opaque[i]
                return tape.objects[i]

            u = pickle.Unpickler(io.BytesIO(packed))
            u.persistent_load = load
            fn, args, kwargs = u.load()
            for t in fresh:
                i = tape.register(t, None)
                tape._state[i] = tape._snapshot(t)
        except Exception as exc:  # noqa: BLE001 - a harness error: the referee reports it
            return pickle.dumps(f"{type(exc).__name__}: {exc}")
        finally:
            _discard([sync, [d for d, _ in news or ()]])  # what a failure left unread
        guard = self.guard
        on_device = device.engine_call(fn)  # --device cuda: the engine runs there, the record is the CPU side

        def guarded(*a, **k):
            with engine_call_deadline(), guard():
                return on_device(*a, **k)

        n = len(tape.entries)
        try:
            tape.record("engine call", guarded, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - recorded in the entry; kept for the worker's crash report
            entry = tape.entries[n] if len(tape.entries) > n else None
            if entry is None or entry.raised is None:  # the recording failed, not the call: a harness error
                _discard(tape.entries[n:])
                del tape.entries[n:]
                return pickle.dumps(f"the call's record could not be made: {type(exc).__name__}: {exc}")
            self.raised[entry.raised.traceback] = exc
        entry = tape.entries.pop()
        try:
            return pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001
            _discard(entry)
            return pickle.dumps(f"the call's record could not be sent: {type(exc).__name__}: {exc}")


def _discard(obj, depth: int = 0) -> None:
    """Remove the spill files of every :class:`TensorData` in ``obj`` (an entry, an effect, a result)."""
    if depth > 60:
        return
    if isinstance(obj, TensorData):
        obj.discard()
    elif isinstance(obj, Entry):
        _discard(obj.result, depth + 1)
        _discard(obj.effects, depth + 1)
    elif isinstance(obj, Effect):
        _discard(obj.data, depth + 1)
        _discard(obj.grad, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _discard(x, depth + 1)


def _finish(entry: Entry, tape) -> object:
    """The end of applying a call made in the engine's worker: what it printed is printed, what it
    raised is raised (:class:`Replayed`), else its result decoded against ``tape``."""
    if entry.printed[0]:
        sys.stdout.write(entry.printed[0])
    if entry.printed[1]:
        sys.stderr.write(entry.printed[1])
    if entry.raised is not None:
        raise Replayed(_rebuilt(entry.raised), entry.raised.traceback)
    return _decode(entry.result, tape)


def _raised(exc: BaseException) -> Raised:
    import traceback

    base = next((k for k in type(exc).__mro__ if k.__module__ == "builtins"), Exception)
    cause = exc.__cause__ if type(exc).__name__ == "EngineCrash" and exc.__cause__ is not None else exc
    tb = getattr(exc, "engine_traceback", None) or "".join(traceback.format_exception(exc))
    return Raised(type(cause).__qualname__, type(cause).__module__,
                  next((k for k in type(cause).__mro__ if k.__module__ == "builtins"), base).__name__,
                  str(cause), tb)


def exception_fields(exc: BaseException) -> tuple[str, str, str]:
    """``(type name, module, nearest builtin base)`` of the engine's exception behind ``exc`` (an
    EngineCrash's cause): plain strings that travel where the exception cannot."""
    r = _raised(exc)
    return r.type_name, r.module, r.builtin_base


def exception_like(type_name: str, module: str, builtin_base: str, message: str) -> BaseException:
    """An exception of the name and builtin base :func:`exception_fields` gave (a class made here when it is
    not a builtin), with ``message``."""
    return _rebuilt(Raised(str(type_name), str(module), str(builtin_base), str(message), ""))


def _rebuilt(r: Raised) -> BaseException:
    base = getattr(builtins, r.builtin_base, Exception)
    if not (isinstance(base, type) and issubclass(base, BaseException)):
        base = Exception
    if r.module == "builtins" and r.type_name == base.__name__:
        cls = base
    else:
        cls = type(r.type_name.rsplit(".", 1)[-1], (base,), {"__module__": r.module, "__qualname__": r.type_name})
    try:
        return cls(r.message)
    except Exception:  # noqa: BLE001 - a builtin with another signature (UnicodeError...)
        return Exception(r.message)


class _Tee(io.TextIOBase):
    def __init__(self, target, copy):
        self._target, self._copy = target, copy

    def write(self, s):
        self._copy.write(s)
        return self._target.write(s)

    def flush(self):
        return self._target.flush()

    def __getattr__(self, name):
        return getattr(self._target, name)


@contextlib.contextmanager
def _tee(out, err):
    old_out, old_err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Tee(old_out, out), _Tee(old_err, err)
    try:
        yield
    finally:
        if isinstance(sys.stdout, _Tee):
            sys.stdout = old_out
        if isinstance(sys.stderr, _Tee):
            sys.stderr = old_err


# -- the mode of this process ---------------------------------------------------------------------------

_MODE: list = []  # [("remote", Remote)] while the referee evaluates


def release(t) -> None:
    """Under :func:`remote` (the referee), :meth:`Remote.hollow` ``t``; elsewhere nothing (there ``t`` is the
    engine's own input)."""
    mode = active()
    if mode is not None and isinstance(mode[1], Remote):
        mode[1].hollow(t)


def active():
    """``(mode, tape)`` of the active evaluation whose engine calls run in the engine's worker, or None."""
    return _MODE[-1] if _MODE else None


@contextlib.contextmanager
def remote(tape: Remote):
    _MODE.append(("remote", tape))
    try:
        yield tape
    finally:
        _MODE.pop()

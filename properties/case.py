"""A concrete check case: the unit hypothesis draws, the report stores and ``rlconform replay`` re-runs.

A :class:`Case` names the op, property, dtype and regime, and carries the concrete inputs as float64
NumPy arrays whose values are exactly representable in ``dtype`` (so the engine and the reference see
the same numbers), integer arrays, partitions (nested lists of ``[start, stop)`` row ranges) and
scalars. It serialises to JSON losslessly (floats via ``float.hex``). Logits at real shapes are not
stored but described (:class:`~rlconform.harness.core.generated.LogitsGen`, ``TokensGen``: seed, shape,
distribution parameters; the ``real_shapes`` regime): the case file holds the description, the check materialises it.

Case files travel in pull requests and corpora, so :meth:`Case.from_json` treats them as untrusted data:
anything but one JSON object of schema ``rlconform.case/1`` naming a catalog op, one of its properties,
regimes and the regime's dtypes, with well-formed inputs (non-empty arrays whose shape matches their
data, finite hex floats that fit a float64, labels inside the vocabulary, partitions inside the rows) is
a :class:`CaseError` naming what is wrong. A case file never names code to run: its ``engine`` field is a
note of where it came from, and ``rlconform replay`` takes the engine from its command line.

:func:`encode_record` / :func:`decode_record` are a fast binary form (a JSON header plus the raw array
bytes, with a CRC) that a process running engines writes before every example, so that the process
supervising it can still name the case in flight when the engine kills its process.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import zlib
from typing import Any

import numpy as np

from rlconform.harness.core.generated import GENERATED, GeneratorError, LogitsGen
from rlconform.harness.core.generated import from_json as generated_from_json

SCHEMA = "rlconform.case/1"

_DTYPES = {"float16", "bfloat16", "float32", "float64"}
_ARRAY_KINDS = {"float64": np.float64, "bool": np.bool_, "int64": np.int64}
_MAX_ELEMENTS = 50_000_000  # a case larger than 400 MB of float64 is not one hypothesis drew


class CaseError(ValueError):
    """A case file or record is malformed; the message says what is wrong."""


@dataclasses.dataclass
class Case:
    """One example: ``op``, ``property``, ``dtype`` (name), ``regime``, ``inputs`` (name -> value)."""

    op: str
    property: str
    dtype: str
    regime: str
    inputs: dict[str, Any]

    @property
    def finding_id(self) -> str:
        return finding_id(self.op, self.property, self.dtype, self.regime)

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "op": self.op, "property": self.property, "dtype": self.dtype,
                "regime": self.regime, "inputs": {k: _encode(v) for k, v in self.inputs.items()}}

    @classmethod
    def from_json(cls, obj: Any) -> "Case":
        """Parse and validate a case document; raise :class:`CaseError` saying what is wrong."""
        if not isinstance(obj, dict):
            raise CaseError(f"a case file holds one JSON object, not a {_json_type(obj)}")
        if obj.get("schema") != SCHEMA:
            raise CaseError(f"not an rlconform case file (schema {obj.get('schema')!r}, expected {SCHEMA!r})")
        fields = {}
        for key in ("op", "property", "dtype", "regime"):
            if not isinstance(obj.get(key), str):
                raise CaseError(f"field {key!r} must be a string, not {_json_type(obj.get(key))}")
            fields[key] = obj[key]
        _check_finding(**fields)
        raw = obj.get("inputs")
        if not isinstance(raw, dict) or not raw:
            raise CaseError(f"field 'inputs' must be a non-empty object, not {_json_type(raw)}")
        inputs = {}
        for k, v in raw.items():
            try:
                inputs[k] = _decode(v)
            except CaseError as exc:
                raise CaseError(f"input {k!r}: {exc}") from None
        case = cls(fields["op"], fields["property"], fields["dtype"], fields["regime"], inputs)
        validate_inputs(case)
        return case

    def summary(self, max_items: int = 6) -> str:
        """Short human-readable rendering of the inputs (shapes and leading values)."""
        parts = []
        for k, v in self.inputs.items():
            if isinstance(v, np.ndarray):
                flat = v.reshape(-1)[:max_items].tolist()
                more = "…" if v.size > max_items else ""
                parts.append(f"{k}{list(v.shape)}={flat}{more}")
            else:
                text = repr(v)
                parts.append(f"{k}={text if len(text) < 120 else text[:117] + '...'}")
        return ", ".join(parts)


def finding_id(op: str, prop: str, dtype: str, regime: str) -> str:
    """The stable id of a finding, as used by ``--xfails`` ledgers: ``op.property.dtype.regime``."""
    return f"{op}.{prop}.{dtype}.{regime}"


def _json_type(v: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number" if isinstance(v, (int, float)) else type(v).__name__)


def _check_finding(op: str, property: str, dtype: str, regime: str) -> None:
    from rlconform.harness.catalog.ops import OPS

    info = OPS.get(op)
    if info is None:
        raise CaseError(f"unknown op {op!r} (see `rlconform list-ops`)")
    if property not in info.properties:
        raise CaseError(f"property {property!r} does not apply to {op!r} (it has {', '.join(info.properties)})")
    if regime not in info.regimes:
        raise CaseError(f"unknown regime {regime!r} for {op!r} (one of {', '.join(info.regimes)})")
    if dtype not in _DTYPES:
        raise CaseError(f"unknown dtype {dtype!r} (one of {', '.join(sorted(_DTYPES))})")
    if dtype not in info.regimes[regime]:
        raise CaseError(f"regime {regime!r} of {op!r} is not checked in {dtype} "
                        f"(only {', '.join(info.regimes[regime])})")
    only = info.property_regimes.get(property)
    if only is not None and regime not in only:
        raise CaseError(f"property {property!r} of {op!r} is not checked under regime {regime!r} "
                        f"(only {', '.join(only)})")


def validate_inputs(case: Case) -> None:
    """Cross-input checks that hold for every op: arrays non-empty, the logits' batch shape shared by
    labels and grad_output, labels inside the vocabulary, values/mask shapes equal, partition row ranges
    inside the rows. Raise :class:`CaseError`."""
    inp = case.inputs
    for k, v in inp.items():
        if isinstance(v, np.ndarray) and (v.ndim == 0 or v.size == 0):
            raise CaseError(f"input {k!r} has the empty shape {list(v.shape)}: every array of a case has at "
                            "least one dimension and one element")
    logits = inp.get("logits")
    if isinstance(logits, (np.ndarray, LogitsGen)):
        for k in ("labels", "grad_output"):
            v = inp.get(k)
            if isinstance(v, np.ndarray) and v.shape != logits.shape[:-1]:
                raise CaseError(f"input {k!r} has shape {list(v.shape)}, expected the logits' batch shape "
                                f"{list(logits.shape[:-1])}")
        labels = inp.get("labels")
        vocab = inp.get("vocab", logits.shape[-1])
        if isinstance(labels, np.ndarray) and labels.size and (labels.min() < 0 or labels.max() >= vocab):
            raise CaseError(f"input 'labels' holds ids outside the vocabulary [0, {vocab})")
    rows = None
    for k in ("mask", "values", "loss_mat"):
        v = inp.get(k)
        if isinstance(v, np.ndarray):
            if rows is not None and v.shape != rows[1]:
                raise CaseError(f"input {k!r} has shape {list(v.shape)}, expected {list(rows[1])} like {rows[0]!r}")
            rows = rows or (k, v.shape)
    if "partitions" in inp:
        n = rows[1][0] if rows else None
        _check_partition(inp["partitions"], n, "partitions")


def _check_partition(p: Any, n_rows: int | None, where: str) -> None:
    if isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
        a, b = p
        if not 0 <= a <= b or (n_rows is not None and b > n_rows):
            raise CaseError(f"{where}: row range {p} is not inside the {n_rows} rows")
        return
    if not isinstance(p, list):
        raise CaseError(f"{where}: expected nested lists of [start, stop) row ranges, found {_json_type(p)}")
    for i, q in enumerate(p):
        _check_partition(q, n_rows, f"{where}[{i}]")


def _encode(v: Any) -> Any:
    if isinstance(v, GENERATED):
        return v.to_json()
    if isinstance(v, np.ndarray):
        if v.dtype.kind == "f":
            return {"ndarray": "float64", "shape": list(v.shape), "hex": [float(x).hex() for x in v.reshape(-1)]}
        if v.dtype.kind == "b":
            return {"ndarray": "bool", "shape": list(v.shape), "data": v.reshape(-1).astype(int).tolist()}
        return {"ndarray": "int64", "shape": list(v.shape), "data": v.reshape(-1).astype(np.int64).tolist()}
    if isinstance(v, float):
        return {"float": v.hex()}
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, tuple):
        return [_encode(x) for x in v]
    if isinstance(v, list):
        return [_encode(x) for x in v]
    return v


def _fromhex(x: Any) -> float:
    if not isinstance(x, str):
        raise CaseError(f"expected a float.hex() string, found {_json_type(x)}")
    try:
        return float.fromhex(x)
    except OverflowError:
        raise CaseError(f"hex float {x[:40]!r} overflows a float64") from None
    except ValueError:
        raise CaseError(f"{x[:40]!r} is not a float.hex() string") from None


def _shape(v: dict) -> tuple[int, ...]:
    shape = v.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise CaseError(f"'shape' must be a list of integers, not {shape!r:.60}")
    if any(d < 0 for d in shape):
        raise CaseError(f"negative dimension in shape {shape}")
    if math.prod(shape) > _MAX_ELEMENTS:
        raise CaseError(f"shape {shape} holds more than {_MAX_ELEMENTS} elements")
    return tuple(shape)


def _decode(v: Any) -> Any:
    if isinstance(v, dict) and "ndarray" in v:
        kind, shape = v["ndarray"], _shape(v)
        key = "hex" if kind == "float64" else "data"
        if kind not in _ARRAY_KINDS:
            raise CaseError(f"unknown array kind {kind!r} (one of {', '.join(_ARRAY_KINDS)})")
        data = v.get(key)
        if not isinstance(data, list) or len(data) != math.prod(shape):
            raise CaseError(f"{key!r} must list {math.prod(shape)} values for shape {list(shape)}")
        if kind == "float64":
            return np.array([_fromhex(x) for x in data], dtype=np.float64).reshape(shape)
        if not all(isinstance(x, int) for x in data):
            raise CaseError(f"{kind} array data must be integers")
        if kind == "bool":
            return np.array(data, dtype=bool).reshape(shape)
        try:
            return np.array(data, dtype=np.int64).reshape(shape)
        except OverflowError:
            raise CaseError("integer outside int64") from None
    if isinstance(v, dict) and "float" in v:
        return _fromhex(v["float"])
    if isinstance(v, dict) and "generated" in v:
        return _generated(v)
    if isinstance(v, dict):
        raise CaseError(f"unknown encoded value with keys {sorted(v)[:5]}")
    if isinstance(v, list):
        return [_decode(x) for x in v]
    return v


def _generated(v: dict):
    try:
        return generated_from_json(v)
    except GeneratorError as exc:
        raise CaseError(f"generator description: {exc}") from None


def save_case(case: Case, path) -> None:
    with open(path, "w") as fh:
        json.dump(case.to_json(), fh)


def load_case(path) -> Case:
    """Read and validate a case file; :class:`CaseError` (a ``ValueError``) names what is wrong, an
    ``OSError`` what could not be read."""
    from rlconform.harness.core.safe_json import JsonFileError, loads

    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        doc = loads(raw, "case file")
    except JsonFileError as exc:
        raise CaseError(str(exc).removeprefix("case file: ")) from None
    return Case.from_json(doc)


# ------------------------------------------------------------------------------------------------
# the in-flight record: fast to write before every example

_MAGIC = b"RLCF1"


def encode_record(case: Case, meta: dict) -> bytes:
    """``case`` and a small JSON-able ``meta`` dict as bytes: magic, header length, CRC32, JSON header,
    raw little-endian array bytes."""
    arrays: list[bytes] = []

    def enc(v):
        if isinstance(v, GENERATED):
            return v.to_json()
        if isinstance(v, np.ndarray):
            kind = "float64" if v.dtype.kind == "f" else "bool" if v.dtype.kind == "b" else "int64"
            arrays.append(np.ascontiguousarray(v, dtype=_ARRAY_KINDS[kind]).tobytes())
            return {"raw": len(arrays) - 1, "kind": kind, "shape": list(v.shape)}
        if isinstance(v, (list, tuple)):
            return [enc(x) for x in v]
        if isinstance(v, float):
            return {"float": v.hex()}
        if isinstance(v, np.integer):
            return int(v)
        if isinstance(v, np.floating):
            return {"float": float(v).hex()}
        return v

    head = {"meta": meta, "op": case.op, "property": case.property, "dtype": case.dtype, "regime": case.regime,
            "inputs": {k: enc(v) for k, v in case.inputs.items()}, "sizes": [len(a) for a in arrays]}
    h = json.dumps(head).encode()
    body = h + b"".join(arrays)
    return _MAGIC + struct.pack("<II", len(h), zlib.crc32(body)) + body


def decode_record(data: bytes) -> tuple[Case, dict]:
    """Inverse of :func:`encode_record`, validated like a case file; :class:`CaseError` if torn or bad."""
    if len(data) < 13 or not data.startswith(_MAGIC):
        raise CaseError("no in-flight record")
    hlen, crc = struct.unpack("<II", data[5:13])
    body = data[13:]
    if zlib.crc32(body) != crc or hlen > len(body):
        raise CaseError("in-flight record torn (the process died while writing it)")
    try:
        head = json.loads(body[:hlen])
    except ValueError as exc:
        raise CaseError(f"bad in-flight record header: {exc}") from None
    offsets, pos = [], hlen
    for n in head.get("sizes", []):
        offsets.append((pos, pos + n))
        pos += n

    def dec(v):
        if isinstance(v, dict) and "raw" in v:
            a, b = offsets[v["raw"]]
            shape = tuple(int(d) for d in v["shape"])
            return np.frombuffer(body[a:b], dtype=_ARRAY_KINDS[v["kind"]]).reshape(shape).copy()
        if isinstance(v, dict) and "float" in v:
            return _fromhex(v["float"])
        if isinstance(v, dict) and "generated" in v:
            return _generated(v)
        if isinstance(v, list):
            return [dec(x) for x in v]
        return v

    try:
        case = Case(head["op"], head["property"], head["dtype"], head["regime"],
                    {k: dec(v) for k, v in head["inputs"].items()})
        _check_finding(case.op, case.property, case.dtype, case.regime)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CaseError(f"bad in-flight record: {exc}") from None
    return case, head.get("meta") or {}

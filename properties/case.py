"""A concrete check case: the unit hypothesis draws, the report stores and ``rlconform replay`` re-runs.

A :class:`Case` names the op, property, dtype and regime, and carries the concrete inputs as float64
NumPy arrays whose values are exactly representable in ``dtype`` (so the engine and the reference see
the same numbers), integer arrays, partitions (nested lists of ``[start, stop)`` row ranges) and
scalars. It serialises to JSON losslessly (floats via ``float.hex``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

SCHEMA = "rlconform.case/1"

_DTYPES = {"float16", "bfloat16", "float32", "float64"}


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
    def from_json(cls, obj: dict) -> "Case":
        if obj.get("schema") != SCHEMA:
            raise ValueError(f"not an rlconform case file (schema {obj.get('schema')!r}, expected {SCHEMA!r})")
        if obj["dtype"] not in _DTYPES:
            raise ValueError(f"unknown dtype {obj['dtype']!r}")
        return cls(obj["op"], obj["property"], obj["dtype"], obj["regime"],
                   {k: _decode(v) for k, v in obj["inputs"].items()})

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


def _encode(v: Any) -> Any:
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


def _decode(v: Any) -> Any:
    if isinstance(v, dict) and "ndarray" in v:
        kind, shape = v["ndarray"], tuple(v["shape"])
        if kind == "float64":
            return np.array([float.fromhex(x) for x in v["hex"]], dtype=np.float64).reshape(shape)
        if kind == "bool":
            return np.array(v["data"], dtype=bool).reshape(shape)
        return np.array(v["data"], dtype=np.int64).reshape(shape)
    if isinstance(v, dict) and "float" in v:
        return float.fromhex(v["float"])
    if isinstance(v, list):
        return [_decode(x) for x in v]
    return v


def save_case(case: Case, path) -> None:
    with open(path, "w") as fh:
        json.dump(case.to_json(), fh)


def load_case(path) -> Case:
    with open(path) as fh:
        return Case.from_json(json.load(fh))

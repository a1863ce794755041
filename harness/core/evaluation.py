"""What an op family hands the generic properties: an :class:`Evaluation` of one case.

An op family (:mod:`rlconform.harness.families`) calls the engine through its binding, the float64
reference and its dtype-faithful fp32 path on one case, and records what came out as
:class:`Compared` triples (engine, reference, faithful), input mutations, alternative runs of the
same data (other partitions, garbage at masked positions) and metric flows. The generic properties
(:mod:`rlconform.properties.generic`) judge an Evaluation without knowing the family.

Anything an engine raises is wrapped by :func:`call_engine` into :class:`EngineCrash` (a ``crash``
finding). Anything *expected but absent* (no autograd graph where a gradient is part of the contract,
no gradient on an input, an empty output, a missing metric key) is a ``problem`` of the Evaluation:
every property fails on it, never passes in silence (“gradient check skipped without a graph”).
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any, Callable

import numpy as np

from rlconform.harness.core import device, tape, torch_state
from rlconform.harness.workers.isolated import engine_call_deadline


class EngineCrash(Exception):
    """The engine raised while computing a case. ``engine_traceback`` holds its traceback text."""

    def __init__(self, where: str, exc: BaseException):
        self.where = where
        self.engine_traceback = "".join(traceback.format_exception(exc))
        super().__init__(f"engine raised in {where}: {type(exc).__name__}: {exc}")


def call_engine(where: str, fn: Callable, *args, **kwargs):
    """Call an engine function; anything it raises becomes :class:`EngineCrash` naming ``where``. Torch's
    process-global state (grad mode, default dtype, deterministic / anomaly modes, threads, ...) is
    restored after the call, and a call that changed it is a crash naming what changed
    (:mod:`rlconform.harness.core.torch_state`).

    Under :func:`~rlconform.harness.core.tape.remote` (the referee) ``fn`` is not called here: the call is
    made in the engine's worker, and its record (the result, its effects on the arguments, what it printed
    or raised) is applied here.

    On a CUDA run (``--device cuda``) ``fn`` runs on the device: its tensor arguments are moved there, its
    tensor results brought back to the CPU and its writes into its inputs mirrored into the caller's tensors
    (:func:`rlconform.harness.core.device.engine_call`); under the referee the worker's
    :class:`~rlconform.harness.core.tape.Server` makes that move, and records the CPU side of the call."""
    mode = tape.active()
    if mode is not None:  # the referee: the call is the engine's worker's
        try:
            return mode[1].call(where, fn, args, kwargs)
        except tape.Replayed as replayed:
            crash = EngineCrash(where, replayed.exc)
            crash.engine_traceback = replayed.traceback
            raise crash from replayed.exc
    fn = device.engine_call(fn)
    try:
        with engine_call_deadline(), torch_state.guard():
            return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any engine error is a crash finding
        raise EngineCrash(where, exc) from exc


@dataclasses.dataclass
class Compared:
    """One engine output next to its float64 reference and its dtype-faithful value.

    ``engine``/``reference``/``faithful``: float64 arrays (``faithful`` already rounded to the engine's
    output dtype; ``None`` means the reference itself); ``dtype``: the engine's output dtype name;
    ``kind``: the tolerance kind (a key of :data:`rlconform.harness.core.tolerance.ATOL`); ``only_where``:
    the elements that are compared (e.g. unmasked tokens); ``label``: what it is, for messages;
    ``resolution``: a dtype coarser than ``dtype`` that the engine computes the value in (its tolerance is
    never finer than half an ulp of it at |reference|: :func:`rlconform.harness.core.tolerance.bound`), or None;
    ``quantity``: what the number is (``value``, ``gradient``, ``metric``; None: by the Evaluation list that holds
    it); ``layout``: the partition of the run it comes from (``{"parts": "micro-batches", "nnz": [3, 0]}``), or
    None (:mod:`rlconform.harness.core.failure`).
    """

    label: str
    engine: np.ndarray
    reference: np.ndarray
    faithful: np.ndarray | None
    dtype: str
    kind: str
    only_where: np.ndarray | None = None
    resolution: str | None = None
    quantity: str | None = None
    layout: dict | None = None


@dataclasses.dataclass
class MetricFlow:
    """A metric pipeline's run: ``emitted`` keys, the ``final`` dict, ``emitted_to_final`` key mapping;
    ``emitted_values``: key -> one value as it was handed to the reducer (its type is what the final value
    must not narrow); ``integral``: final keys whose statistic is an integer (a token count, a length);
    ``printed``: what the pipeline wrote to stdout / stderr (a value printed instead of logged)."""

    emitted: set
    final: dict
    emitted_to_final: dict
    emitted_values: dict = dataclasses.field(default_factory=dict)
    integral: frozenset = frozenset()
    printed: str = ""


@dataclasses.dataclass
class Evaluation:
    """Everything one case of one op produced (see the module docstring).

    ``values``/``gradients``: the base run against the reference; ``problems``: expected things that
    were absent or malformed (each fails every property); ``mutations``: input mutations found by the
    bitwise guards (``non_destructive``); ``alternatives``: (label, outputs) of the same data computed
    another way — other partitions (``partition_invariant``) or garbage at masked positions
    (``mask_invariant``) — each output aligned with ``values + gradients``; ``metrics``: a metric
    pipeline's key flow (``metric_integrity``); ``undefined``: the reference is undefined for this input
    (e.g. the mean of no tokens) and says why: there is nothing to compare, by definition;
    ``base_label``: how the base run is described next to an alternative; ``declared``: the name of a
    declared precondition the family honoured in this check, or None.
    """

    values: list[Compared] = dataclasses.field(default_factory=list)
    gradients: list[Compared] = dataclasses.field(default_factory=list)
    problems: list = dataclasses.field(default_factory=list)
    mutations: list[str] = dataclasses.field(default_factory=list)
    alternatives: list[tuple[str, list[Compared]]] = dataclasses.field(default_factory=list)
    metrics: MetricFlow | None = None
    undefined: str | None = None
    declared: str | None = None
    base_label: str = "base"

    @property
    def outputs(self) -> list[Compared]:
        return self.values + self.gradients


def shape_problem(label: str, got: Any, expected: tuple, context: str = ""):
    """A ``missing output`` problem clause (:func:`rlconform.harness.core.failure.problem`) when an engine
    output's shape differs from the reference's, else None."""
    from rlconform.harness.core.failure import problem

    shape = tuple(np.shape(got))
    if shape != tuple(expected):
        return problem("missing output", f"{label}: the engine returned shape {shape}, expected {tuple(expected)}" + (
            f" ({context})" if context else ""))
    return None


def logged_number(logged: dict, key: Any, name: str, where: str, label: str, problems: list) -> np.ndarray | None:
    """The logged metric ``logged[key]`` as a 0-d float64 array, or None after appending to ``problems`` what is
    wrong with it: a ``lost metric`` clause (``name`` missing from ``where``, whose keys are listed) or a ``missing
    output`` clause (not a number, not a scalar). ``label``: the run it comes from, for the messages."""
    from rlconform.harness.core.failure import problem
    from rlconform.harness.core.tensors import as_numpy

    if key not in logged:
        problems.append(problem("lost metric", f"{name} missing from {where} {sorted(logged)} ({label})", key=name))
        return None
    try:
        value = np.asarray(as_numpy(logged[key]), dtype=np.float64)
    except (TypeError, ValueError):
        problems.append(problem("missing output", f"{name} is not a number: {logged[key]!r} ({label})"))
        return None
    if value.size != 1:
        problems.append(problem("missing output", f"{name} is not a scalar: shape {value.shape} ({label})"))
        return None
    return value.reshape(())

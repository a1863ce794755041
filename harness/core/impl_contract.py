"""The contract of an alternative implementation of an op: chunk boundaries, input
ranks, output dtype.

An op family that has alternative implementations (:attr:`~rlconform.harness.core.opinfo.OpInfo.implementations`)
draws its cases for a chunked one with :func:`chunked_rows` (row counts where a chunk boundary falls),
presents the same data in every rank the implementation's docstring allows (:func:`rank_shape`) and
reports a breach of the declared contract (:class:`~rlconform.harness.core.contracts.Implementation`) as a
problem of the case with :func:`dtype_problem` / :func:`rank_problem`: it fails the property with that
message. Core layer: imports only the strategies' hypothesis and the contracts.
"""

from __future__ import annotations

from hypothesis import strategies as st

from rlconform.harness.core.engine_frames import frame_text

#: chunk sizes a chunked implementation is checked with: small ones (a boundary inside every small case;
#: 1 = one row per chunk) and 2048, the default chunk_size of every chunked function bound so far (verl
#: ``entropy_from_logits_with_chunking`` and ``vocab_parallel_entropy_with_chunking``; verl's callers never
#: pass another value). Other values are not checked: a boundary fault shows at any size.
CHUNK_SIZES = (1, 2, 3, 5, 2048)
#: vocabulary sizes drawn when a chunk is 2048 rows (4095..4097 rows: small V keeps a case in milliseconds)
LARGE_CHUNK_VOCAB = (1, 2, 3, 8, 13)


def rows_around(chunk: int) -> list[int]:
    """Row counts one short of, at and one past one and two chunks of ``chunk`` rows (≥ 1)."""
    return sorted({k * chunk + d for k in (1, 2) for d in (-1, 0, 1) if k * chunk + d >= 1})


@st.composite
def chunked_rows(draw, chunk_sizes=CHUNK_SIZES) -> tuple[int, int]:
    """Draw ``(chunk_size, rows)``: rows where the last chunk is short, full or one row long."""
    chunk = draw(st.sampled_from(chunk_sizes))
    return chunk, draw(st.sampled_from(rows_around(chunk)))


def rows_past_one_chunk(chunk: int) -> list[int]:
    """Row counts whose rank-3 presentation (:func:`rank_shape`: 2 sequences of ``rows / 2``) holds more than
    one chunk of ``chunk`` along the sequence: sequences one past one chunk, of two chunks, one past two."""
    return [2 * s for s in (chunk + 1, 2 * chunk, 2 * chunk + 1)]


@st.composite
def multi_chunk_rows(draw, chunk_sizes=CHUNK_SIZES) -> tuple[int, int]:
    """Draw ``(chunk_size, rows)`` with more than one chunk on every presentation, the rank-3 one (chunked
    along the sequence, as verl's vocab-parallel chunking does) included: a multi-chunk effect (one chunk's
    backward writing into what the next chunk's saved) survives shrinking."""
    chunk = draw(st.sampled_from(chunk_sizes))
    return chunk, draw(st.sampled_from(rows_past_one_chunk(chunk)))


def rank_shape(n: int, rank: int) -> tuple[int, ...]:
    """The batch shape of ``n`` rows presented as a rank-``rank`` input (its last dim excluded): ``(n,)``
    for rank 2, ``(b, n // b)`` for rank 3 with b the smallest of 2, 3 dividing n (else 1), leading 1s
    beyond."""
    if rank <= 1:
        return ()
    if rank == 2:
        return (n,)
    b = next((d for d in (2, 3) if n % d == 0 and n > d), 1)
    return (1,) * (rank - 3) + (b, n // b)


def dtype_problem(label: str, got_dtype: str, input_dtype: str, impl, output: str | None = None):
    """A ``wrong dtype`` problem clause when the output dtype breaks the
    implementation's dtype contract, else None (also when the docstring states no output dtype: an unstated
    contract is not checked)."""
    from rlconform.harness.core.failure import problem

    expected = impl.expected_dtype(input_dtype, output)
    if expected is None or got_dtype == expected:
        return None
    promise = "the input's dtype" if impl.promised(output) == "input" else expected
    return problem("wrong dtype", f"contract: {label} is {got_dtype} for a {input_dtype} input; the "
                   f"implementation's docstring documents {promise} ({expected})" + (f" [{impl.doc}]" if impl.doc else ""))


def rank_problem(rank: int, shape: tuple, impl, exc: BaseException):
    """The ``contract`` :class:`~rlconform.harness.core.failure.Clause` of a declared input rank the
    implementation cannot take: ``rank``, ``error_type`` (the engine's exception type) and its sentence."""
    from rlconform.harness.core import failure

    last = _last_line(exc)
    head = last.split(":", 1)[0].strip().rsplit(".", 1)[-1] if ":" in last else ""
    cause = getattr(exc, "__cause__", None)
    # the engine's own exception: the last ``SomeError: …`` line of its traceback (on gloo ranks the cause is
    # the pool's RankFailure, which holds every rank's), else the cause's type
    error_type = head if head.isidentifier() and head[:1].isupper() else (
        type(cause).__name__ if cause is not None else type(exc).__name__)
    import traceback

    from rlconform.harness.core.engine_frames import deepest_frame

    tb = getattr(exc, "engine_traceback", "") or "".join(traceback.format_exception(exc))
    found = deepest_frame([tb])
    frame = {k: found[k] for k in ("function", "module", "file", "line", "caller") if k in found} if found else None
    return failure.Clause("contract", rank=int(rank), error_type=error_type, frame=frame, text=(
        f"contract: a rank-{rank} input {tuple(shape)} (its docstring allows ranks "
        f"{', '.join(map(str, impl.ranks))}) raised {last}{frame_text(exc)}"))


def settle_crashes(crashes: list, impl, problems: list) -> None:
    """After trying every declared rank: ``crashes`` holds (rank, input shape, EngineCrash) of those that
    raised, in the order checked (the engine's own rank first: ``Implementation.checked_ranks``). If every
    rank raised, one crash naming each rank's error in that order is raised (a crash finding); otherwise each
    is a contract problem appended to ``problems`` (the ranks that ran are compared as usual)."""
    if not crashes:
        return
    if len(crashes) == len(impl.ranks):
        if len(crashes) == 1:
            raise crashes[0][2]
        from rlconform.harness.core.evaluation import EngineCrash

        parts = [f"rank-{rank} input {tuple(shape)}: {_last_line(exc)}" for rank, shape, exc in crashes]
        cause = RuntimeError("; ".join(parts))
        crash = EngineCrash("every input rank its docstring allows", cause)
        crash.engine_traceback = "\n".join(getattr(exc, "engine_traceback", "") for _, _, exc in crashes)
        raise crash from cause
    problems += [rank_problem(rank, shape, impl, exc) for rank, shape, exc in crashes]


def _last_line(exc: BaseException) -> str:
    """The engine's own error of an EngineCrash (the last ``SomeError: ...`` line of its traceback, which on
    gloo ranks holds every rank's), else the exception text."""
    tb = getattr(exc, "engine_traceback", "") or ""
    lines = [ln for ln in tb.strip().splitlines() if ln.strip() and not ln.startswith(" ")]
    errors = [ln for ln in lines if "Error" in ln.split(":")[0]]
    return (errors[-1] if errors else str(exc)).strip()[:300]

"""``assert_conforms``: check one function as a catalog op inside a fork's own test suite.

    from rlconform.harness.run.conforms import assert_conforms

    def test_my_masked_mean():
        assert_conforms(my_fork.numerics.masked_mean, op="masked_mean", dtypes=("float32",))

Runs in the test's process (no worker, no referee: the fork's own code, which its test suite already
trusts), with the ``ci`` profile's derandomized examples, and fails with one short block per failing
finding — its id, the uniform message of the smallest failing example and a ``rlconform replay`` command of
that example's saved case — never rlconform's own frames.
"""

from __future__ import annotations

import os
import tempfile
from typing import Callable, Iterable

from hypothesis import HealthCheck, Phase, given, seed, settings

from rlconform.harness.catalog.binding import Binding
from rlconform.harness.catalog.ops import strategy_for
from rlconform.harness.core.evaluation import EngineCrash
from rlconform.harness.run.selection import selected_findings
from rlconform.properties.case import Case, save_case
from rlconform.properties.checks import run_check_here
from rlconform.properties.runner import finding_seed, replay_command

#: lines of one finding's message kept in the failure (the whole message is in the saved case's replay)
MESSAGE_LINES = 6


class ConformanceError(AssertionError):
    """``fn`` failed findings of its op; ``failures`` holds ``(finding id, message, case file)`` each."""

    def __init__(self, text: str, failures: list[tuple[str, str, str]]):
        super().__init__(text)
        self.failures = failures


class _Failed(Exception):
    pass


def assert_conforms(fn: Callable, op: str, *, dtypes: Iterable[str] = (), properties: Iterable[str] = (),
                    regimes: Iterable[str] = (), max_examples: int = 20, engine: str | None = None,
                    case_dir: str | None = None) -> int:
    """Check ``fn`` as catalog op ``op`` (its canonical signature: ``rlconform list-ops``) on every finding
    the filters select (``dtypes``, ``properties``, ``regimes``: empty selects all), ``max_examples``
    derandomized examples each; returns the number of findings checked.

    Raises :class:`ConformanceError` (an ``AssertionError``) naming each failing finding, with its message
    and ``rlconform replay CASE --engine ENGINE`` (``engine``: the spec that loads a binding of ``fn``, e.g.
    ``my_fork.rlconform_binding:binding``; the cases are saved under ``case_dir``, default a new temporary
    folder). Raises ``ValueError`` when the filters select nothing (silence is not conformance), or when
    ``op`` is checked on distributed ranks (use ``rlconform check``)."""
    __tracebackhide__ = True  # pytest shows the caller's line, not this module
    binding = Binding(name="assert_conforms", ops={op: fn})
    selected = selected_findings({op}, ops=(op,), properties=tuple(properties), dtypes=tuple(dtypes),
                                 regimes=tuple(regimes), distributed=False)
    if not selected:
        raise ValueError(f"no finding of op {op!r} selected (dtypes={tuple(dtypes)}, properties={tuple(properties)}, "
                         f"regimes={tuple(regimes)}); a distributed op is checked by `rlconform check`")
    failures: list[tuple[str, str, str]] = []
    folder = case_dir
    for op_, prop, dtype, regime in selected:
        fid = ".".join((op_, prop, dtype, regime))
        smallest: dict = {}

        @settings(max_examples=max_examples, derandomize=False, database=None, deadline=None,
                  phases=(Phase.explicit, Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck))
        @seed(finding_seed(fid))
        @given(inputs=strategy_for(op_, dtype, regime))
        def run(inputs):
            case = Case(op_, prop, dtype, regime, inputs)
            try:
                outcome = run_check_here(binding, case)
            except EngineCrash as exc:
                smallest.update(case=case, shown=f"raises: {exc.engine_traceback.strip().splitlines()[-1]}")
                raise _Failed() from None
            if outcome.verdict == "discrepancy":
                smallest.update(case=case, shown=outcome.message)
                raise _Failed()

        try:
            run()
        except _Failed:
            pass
        if smallest:
            folder = folder or tempfile.mkdtemp(prefix="rlconform-cases-")
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"{fid}.json")
            save_case(smallest["case"], path)
            failures.append((fid, smallest["shown"], path))
    if failures:
        blocks = []
        for fid, message, path in failures:
            lines = message.strip().splitlines()
            shown = lines[:MESSAGE_LINES] + ([f"… ({len(lines) - MESSAGE_LINES} more lines)"]
                                             if len(lines) > MESSAGE_LINES else [])
            blocks.append(f"{fid}\n" + "\n".join(f"    {line}" for line in shown)
                          + f"\n    {replay_command(path, engine or '<module:binding>')}")
        if engine is None:
            blocks.append("(pass engine='module:binding', a binding of this function, for runnable replay commands)")
        raise ConformanceError(f"{getattr(fn, '__qualname__', fn)!s} does not conform to op {op!r}: "
                               f"{len(failures)} of {len(selected)} findings fail\n" + "\n".join(blocks), failures)
    return len(selected)

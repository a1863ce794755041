"""``assert_conforms``: a fork's own test checks one function as a catalog op, in process; a failure names
each failing finding with its message and a replay command, and rlconform's frames stay out of it."""

from __future__ import annotations

import pytest
import torch

from rlconform.harness.catalog.binding import Binding
from rlconform.harness.run.conforms import ConformanceError, assert_conforms
from rlconform.properties.case import load_case
from rlconform.properties.checks import run_check_here


def token_mean(values, mask):
    m = mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp(min=1)


def mean_ignoring_mask(values, mask):
    return values.mean()


def raises_on_padding(values, mask):
    if not mask.all():
        raise ZeroDivisionError("padding not supported")
    return token_mean(values, mask)


def test_a_right_function_conforms_and_says_how_much_was_checked():
    assert assert_conforms(token_mean, op="masked_mean", dtypes=("float32",), properties=("matches_reference",),
                           max_examples=10) == 5


def test_a_wrong_function_fails_with_each_finding_its_message_and_replay(tmp_path):
    with pytest.raises(ConformanceError) as ei:
        assert_conforms(mean_ignoring_mask, op="masked_mean", dtypes=("float32",), properties=("matches_reference",),
                        max_examples=10, engine="my_fork.binding:binding", case_dir=str(tmp_path))
    err = ei.value
    text = str(err)
    assert "mean_ignoring_mask does not conform to op 'masked_mean'" in text
    assert err.failures and all(fid.startswith("masked_mean.matches_reference.float32.") for fid, _, _ in err.failures)
    assert "value: engine" in text and "--engine my_fork.binding:binding" in text
    assert "harness/run/conforms.py" not in text and "Traceback" not in text
    for _, _, path in err.failures:  # the saved case is the failing example: it fails again when replayed
        case = load_case(path)
        again = Binding(name="again", ops={"masked_mean": mean_ignoring_mask})
        assert run_check_here(again, case).verdict == "discrepancy"


def test_a_function_that_raises_is_reported_with_its_exception():
    with pytest.raises(ConformanceError) as ei:
        assert_conforms(raises_on_padding, op="masked_mean", dtypes=("float32",),
                        properties=("matches_reference",), regimes=("padded",), max_examples=5)
    assert "raises: ZeroDivisionError: padding not supported" in str(ei.value)


def test_nothing_selected_or_a_distributed_op_is_an_error():
    with pytest.raises(ValueError, match="no finding"):
        assert_conforms(token_mean, op="masked_mean", dtypes=("float32",), regimes=("no_such_regime",))
    with pytest.raises(ValueError, match="distributed"):
        assert_conforms(token_mean, op="cp_masked_mean")


def test_the_tensors_are_torch():  # the canonical signature takes torch tensors
    assert token_mean(torch.ones(2, 3), torch.ones(2, 3)).item() == 1.0

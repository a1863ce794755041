"""Cases of the policy step shared by the engines' step tests: drawn by the family's own strategy (``find``),
with the exact float64 step beside them."""

from __future__ import annotations


def find(strategy, condition):
    """The simplest example of ``strategy`` meeting ``condition`` (``hypothesis.find``), searched the same way on
    every run and machine: a random search for a batch with several conditions at once may miss it within its
    example budget."""
    import hypothesis

    return hypothesis.find(strategy, condition, settings=hypothesis.settings(
        derandomize=True, database=None, max_examples=2000, deadline=None))


def exact(inp: dict, **variant) -> dict:
    """The exact step (:func:`rlconform.reference.policy_step`) of a drawn input, its float32 parameters."""
    import numpy as np

    import rlconform.reference as R
    from rlconform.harness.families import policy_step as S

    return R.policy_step(*(inp[k].astype(np.float32) for k in ("embed", "head", "old_embed", "old_head")),
                         inp["input_ids"], inp["response_mask"], inp["advantages"],
                         temperature=float(np.float32(inp["temperature"])), loss_agg_mode=inp["mode"],
                         **S.clip(inp), **variant)


def gspo_cases() -> tuple[dict, dict]:
    """``(full, empty)``: GSPO step inputs without the entropy bonus (it has its own micro-batch weighting), four
    rows with some clipped and some not, and three rows one of which has no valid token."""
    from rlconform.harness.families import policy_step as S

    gspo = S.inputs("seq-mean-token-mean-with-gspo")
    full = find(gspo, lambda i: len(i["input_ids"]) == 4
                and 0 < exact(i, policy_loss_variant="gspo")["metrics"]["pg_clipfrac"] < 1)
    empty = find(gspo, lambda i: len(i["input_ids"]) == 3 and not i["response_mask"].any(1).all())
    return dict(full, entropy_coeff=0.0), dict(empty, entropy_coeff=0.0)


def token_mask_case() -> dict:
    """A token-mask step input of four rows: one row keeps some tokens and loses others, one loses every token (the
    mask empties it), the entropy bonus on (0.01)."""
    from rlconform.harness.families import policy_step as S

    def mixed(i):
        kept, mask = S.kept_mask(i), i["response_mask"].astype(bool)
        return (len(i["input_ids"]) == 4 and len(S.rejected_rows(i)) >= 1
                and ((mask & ~kept).any(1) & kept.any(1)).any())

    return dict(find(S.inputs("token-mean-with-token-mask"), mixed), entropy_coeff=0.01)


def assert_exact_under_every_split(step, inp: dict, ref: dict) -> None:
    """The gradient of the LM head equals the exact step's whole, in 1-row micro-batches and on 2 DP ranks."""
    import numpy as np

    from rlconform.harness.families import policy_step as S

    for micro, dp in ((len(inp["input_ids"]), 1), (1, 1), (2, 2)):
        grad = S.run_step(step, inp, micro, dp_size=dp)["grads"]["head.weight"].double().numpy()
        np.testing.assert_allclose(grad, ref["grad_head"], rtol=1e-4, atol=1e-6, err_msg=f"micro {micro}, DP {dp}")


def assert_mini_batches_exact(out: dict, ref: dict, label: str) -> None:
    """A step run cut into mini-batches (``out``: :func:`rlconform.harness.families.policy_step.run_step`) gave one
    gradient per mini-batch, each the exact step's (``ref["steps"]``) of its own rows."""
    import numpy as np

    assert len(out["grads"]) == len(ref["steps"]), label
    for got, exact in zip(out["grads"], ref["steps"]):
        np.testing.assert_allclose(got["head.weight"].double().numpy(), exact["grad_head"], rtol=1e-4, atol=1e-6,
                                   err_msg=label)

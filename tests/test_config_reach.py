"""Does my configuration reach it? Each row's configuration alternatives come from its members' ops and variants
(the binding's data) and its trigger; a trainer's YAML is read in the engine's format, its silent keys at the
engine's defaults; the report read against it ranks and filters the rows."""

from __future__ import annotations

import json
import pathlib

import pytest

from rlconform.harness.report.config_reach import (
    ConfigError,
    alternatives,
    describe,
    holds,
    load_config,
    reaches,
    regraded,
    render,
)

A = "actor_rollout_ref.actor"
TABLE = {
    "defaults": {f"{A}.loss_agg_mode": "token-mean", f"{A}.policy_loss.loss_mode": "vanilla", f"{A}.entropy_coeff": 0,
                 "critic.loss_agg_mode": "token-mean", "algorithm.rollout_correction.rollout_rs": None,
                 "algorithm.rollout_correction.rollout_rs_threshold": None},
    "follows": {"critic.loss_agg_mode": f"{A}.loss_agg_mode"},
    "ops": {"agg_loss": {m: [[[f"{A}.loss_agg_mode", "==", m]]] for m in ("token-mean", "seq-mean-token-mean",
                                                                         "seq-mean-token-sum")},
            "policy_loss": {"geo_mean": [[[f"{A}.policy_loss.loss_mode", "==", "geo_mean"]]]},
            "value_loss": {"*": [[["critic.loss_agg_mode", "==", "seq-mean-token-mean"]]]},
            "rollout_rejection_mask": {"token_k1_asym": [[["algorithm.rollout_correction.rollout_rs", "==", "token_k1"],
                                                          ["algorithm.rollout_correction.rollout_rs_threshold", "~",
                                                           "_", "a lower_upper pair"]]]}},
    "triggers": [["rollout_rs", [["algorithm.rollout_correction.rollout_rs", "!=", None]]]],
}


def _row(members, trigger="any input", severity="training", **extra):
    return {"members": members, "trigger": trigger, "severity": severity, "signature": {"kind": "wrong value"},
            "engine_function": {"function": "agg_loss"}, "op": "agg_loss", **extra}


FINDINGS = {f"{op}.{v}": {"op": op, "regime": f"{v}@moderate" if v else "moderate"} for op, v in (
    ("agg_loss", "seq-mean-token-mean"), ("agg_loss", "seq-mean-token-sum"), ("policy_loss", "geo_mean"),
    ("masked_mean", ""), ("rollout_rejection_mask", "token_k1_asym"), ("value_loss", "token-mean"))}


def test_a_rows_alternatives_are_its_members_variants_and_its_triggers_conditions():
    both = alternatives(_row(["agg_loss.seq-mean-token-mean", "agg_loss.seq-mean-token-sum"], "rollout_rs on"),
                        FINDINGS, TABLE)
    assert both == [[(f"{A}.loss_agg_mode", "==", "seq-mean-token-mean"),
                     ("algorithm.rollout_correction.rollout_rs", "!=", None)],
                    [(f"{A}.loss_agg_mode", "==", "seq-mean-token-sum"),
                     ("algorithm.rollout_correction.rollout_rs", "!=", None)]]
    assert describe(both) == (f"`{A}.loss_agg_mode ∈ {{seq-mean-token-mean, seq-mean-token-sum}}` and "
                              "`algorithm.rollout_correction.rollout_rs≠null`")
    assert alternatives(_row(["masked_mean.", "policy_loss.geo_mean"]), FINDINGS, TABLE) == [[]]  # one runs always
    assert describe([[]]) == "any configuration"
    assert alternatives(_row(["agg_loss.seq-mean-token-sum"]), FINDINGS, None) is None
    assert describe(None) == "not declared by the binding"
    asym = alternatives(_row(["rollout_rejection_mask.token_k1_asym"], "rollout_rs"), FINDINGS, TABLE)
    assert len(asym[0]) == 2  # rollout_rs=token_k1 implies rollout_rs≠null
    assert "rollout_rs_threshold: a lower_upper pair" in describe(asym)


def test_a_configuration_is_read_as_the_engine_writes_it(tmp_path):
    nested = tmp_path / "nested.yaml"
    nested.write_text("actor_rollout_ref:\n  actor:\n    loss_agg_mode: seq-mean-token-sum\n"
                      "algorithm.rollout_correction.rollout_rs: token_k1\n")
    assert load_config(str(nested)) == {f"{A}.loss_agg_mode": "seq-mean-token-sum",
                                        "algorithm.rollout_correction.rollout_rs": "token_k1"}
    overrides = tmp_path / "overrides.yaml"  # Hydra's .hydra/overrides.yaml
    overrides.write_text(f"- {A}.entropy_coeff=0.01\n- +algorithm.rollout_correction.rollout_rs=null\n")
    assert load_config(str(overrides)) == {f"{A}.entropy_coeff": 0.01, "algorithm.rollout_correction.rollout_rs": None}
    for text in ("just a string\n", "- no equals sign\n", "a: [unclosed\n"):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ConfigError):
            load_config(str(bad))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path / "missing.yaml"))


def test_silent_keys_take_the_engines_defaults_and_a_following_default_follows():
    alts = [[(f"{A}.loss_agg_mode", "==", "seq-mean-token-mean")]]
    assert reaches(alts, {}, TABLE) == (False, f"needs `{A}.loss_agg_mode=seq-mean-token-mean`; this configuration "
                                               f"has {A}.loss_agg_mode=token-mean (default)")
    assert reaches(alts, {f"{A}.loss_agg_mode": "seq-mean-token-mean"}, TABLE)[0] is True
    critic = [[("critic.loss_agg_mode", "==", "seq-mean-token-mean")]]
    assert reaches(critic, {f"{A}.loss_agg_mode": "seq-mean-token-mean"}, TABLE)[0] is True  # follows the actor's
    assert reaches(critic, {f"{A}.loss_agg_mode": "seq-mean-token-mean", "critic.loss_agg_mode": "token-mean"},
                   TABLE)[0] is False
    assert holds(("algorithm.rollout_correction.rollout_rs_threshold", "~", "_"), {
        "algorithm.rollout_correction.rollout_rs_threshold": "0.5_1.5"}, TABLE)
    assert not holds(("algorithm.rollout_correction.rollout_rs_threshold", "~", "_"), {}, TABLE)  # default null
    assert reaches(None, {}, TABLE)[0] is None


def test_a_training_row_whose_impact_needs_a_knob_is_regraded_at_its_default():
    row = _row([], depends_on={"knob": f"{A}.entropy_coeff", "default": "0", "otherwise": "logging, the logged "
                               "actor/entropy"})
    assert regraded(row, {}, TABLE) == "logging"
    assert regraded(row, {f"{A}.entropy_coeff": 0.01}, TABLE) == "training"


def test_the_report_read_against_a_configuration_lists_what_it_reaches_first():
    doc = {"engine": {"name": "verl", "version": "0.9.1", "configs": TABLE},
           "defects": [dict(_row(["policy_loss.geo_mean"]), reached_by=[[[f"{A}.policy_loss.loss_mode", "==",
                                                                          "geo_mean"]]]),
                       dict(_row(["masked_mean."], severity="robustness"), reached_by=[[]])]}
    text, reached = render(doc, {}, "mine.yaml")
    assert [e["row"] for e in reached] == [2]
    assert "1 of 2 defect rows are reached" in text and "### Not reached" in text
    assert f"needs `{A}.policy_loss.loss_mode=geo_mean`" in text


@pytest.mark.cli
def test_report_config_ranks_the_committed_verl_report_by_a_trainer_yaml(tmp_path):
    """The committed verl report read against a Dr. GRPO configuration with grpo_vectorized: the row of
    grpo_vectorized ignoring norm_adv_by_std_in_grpo is reached, geo_mean's is not; exit 1 (a training row)."""
    import forked_cli

    doc = json.loads((pathlib.Path(__file__).resolve().parents[1] / "reports/verl-0.9.1/report.json").read_text())
    if not (doc.get("engine") or {}).get("configs"):
        pytest.fail("the committed verl report records no configurations: regenerate it")
    cfg = tmp_path / "trainer.yaml"
    cfg.write_text("algorithm:\n  adv_estimator: grpo_vectorized\n  norm_adv_by_std_in_grpo: false\n")
    done = forked_cli.run(["report", "reports/verl-0.9.1", "--config", str(cfg)], timeout=300)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    reached = done.stdout.split("### Not reached")[0]
    assert "compute_grpo_vectorized_outcome_advantage" in reached and "compute_policy_loss_geo_mean" not in reached
    bad = forked_cli.run(["report", "reports/verl-0.9.1", "--config", str(tmp_path / "none.yaml")], timeout=300)
    assert bad.returncode == 2 and "cannot read" in bad.stderr


def test_verls_configurations_name_catalog_ops_and_variants_and_keys_with_defaults():
    """Every op and variant verl's configurations name is one the catalog has (a renamed variant would silently
    read as "any configuration"), and every key they read has a default."""
    from rlconform.harness.bindings import verl_configs
    from rlconform.harness.catalog.binding import Binding
    from rlconform.harness.catalog.ops import OPS

    table = Binding(name="verl", ops={}, configs={
        "defaults": verl_configs.defaults, "follows": verl_configs.FOLLOWS,
        "ops": verl_configs.ops({"token_k1": ("token_k1", "2.0"), "token_k1_asym": ("token_k1", "0.5_1.5")}),
        "triggers": verl_configs.TRIGGERS}).config_table()
    keys = set()
    for op, by_variant in table["ops"].items():
        assert op in OPS, op
        known = set(OPS[op].variants or ()) | set(OPS[op].implementations or ()) | {"", "*"}
        unknown = {v for v in by_variant if v.split("+")[0] not in known}  # "grpo+vectorized": grpo's second
        assert not unknown, (op, unknown)
        keys |= {c[0] for alts in by_variant.values() for alt in alts for c in alt}
    keys |= {c[0] for _, conds in table["triggers"] for c in conds}
    assert keys <= set(table["defaults"]), keys - set(table["defaults"])
    assert table["defaults"]["algorithm.adv_estimator"] == "gae"
    json.dumps(table)  # report.json carries it
    # the step's token mask: rollout_rs token_k1, alone or chained, under any loss_agg_mode; not the row rejection
    token_mask = table["ops"]["policy_step"]["token-mean-with-token-mask"]
    rs = "algorithm.rollout_correction.rollout_rs"
    for value, reached in (("token_k1", True), ("seq_mean_k3, token_k1", True), ("token_k1,seq_mean_k1", True),
                           ("seq_mean_k1", False), ("token_k2", False), (None, False)):
        assert reaches(token_mask, {rs: value, f"{A}.loss_agg_mode": "seq-mean-token-mean"}, table)[0] is reached, value


def test_skyrls_configurations_name_catalog_ops_and_keys_with_defaults_and_corrections_hold_under_any_reduction():
    """SkyRL's configuration table: catalog ops and variants, every key with a default, and a step variant with a
    correction or a KL loss reached under any loss_reduction (it was drawn on one; that is not what it checks), except
    a correction drawn on two reductions (rejection), each of which keeps its own."""
    from rlconform.harness.bindings import skyrl_configs
    from rlconform.harness.catalog.binding import Binding
    from rlconform.harness.catalog.ops import OPS

    OPC = skyrl_configs.OPC
    table = Binding(name="skyrl", ops={}, configs={
        "defaults": skyrl_configs.DEFAULTS, "triggers": skyrl_configs.TRIGGERS,
        "ops": skyrl_configs.ops({"regular": [("ppo_clip", {})], "kl_cov": [("kl_cov", {})]},
                                 {"token-mean": "token_mean", "seq-mean-token-mean": "sequence_mean"},
                                 {"grpo": ("grpo", "drgrpo")})}).config_table()
    keys = set()
    for op, by_variant in table["ops"].items():
        assert op in OPS, op
        known = set(OPS[op].variants or ()) | set(OPS[op].implementations or ()) | {"", "*"}
        assert set(by_variant) <= known, (op, set(by_variant) - known)
        keys |= {c[0] for alts in by_variant.values() for alt in alts for c in alt}
    assert keys <= set(table["defaults"]), keys - set(table["defaults"])
    kl = table["ops"]["policy_step"]["token-mean-with-kl"]
    assert kl == [[["trainer.algorithm.use_kl_loss", "==", True]]]
    rejection = table["ops"]["policy_step"]["token-mean-with-rejection"]  # any mask, each as SkyRL enables it
    token_mean = ["trainer.algorithm.loss_reduction", "==", "token_mean"]
    assert len(rejection) == 4 and [token_mean, [f"{OPC}.token_mask_is_threshold_low", "!=", None],
                                    [f"{OPC}.token_mask_is_threshold_high", "!=", None]] in rejection
    assert all(["trainer.algorithm.loss_reduction", "==", "sequence_mean"] in alt
               for alt in table["ops"]["policy_step"]["seq-mean-token-mean-with-rejection"])
    # the token mask: both of its thresholds set (SkyRL enables it only then), under any loss reduction
    assert table["ops"]["policy_step"]["token-mean-with-token-mask"] == [
        [[f"{OPC}.token_mask_is_threshold_low", "!=", None], [f"{OPC}.token_mask_is_threshold_high", "!=", None]]]
    assert ["trainer.algorithm.grpo_norm_by_std", "==", False] in table["ops"]["outcome_advantage"]["drgrpo"][0]
    # reduce_metrics drops NumPy / tensor metric values, which only a policy loss of the user's own logs
    (own,) = skyrl_configs.SITES["skyrl.backends.skyrl_train.workers.worker_utils.reduce_metrics"]["missing output"]
    loss = "trainer.algorithm.policy_loss_type"
    assert not reaches([list(own)], {}, {"defaults": skyrl_configs.DEFAULTS})[0]
    assert all(not reaches([list(own)], {loss: name}, {})[0] for name in skyrl_configs.BUILT_IN_POLICY_LOSSES)
    assert reaches([list(own)], {loss: "my_loss"}, {})[0] and reaches([list(own)], {loss: "regular_v2"}, {})[0]


def test_a_correction_drawn_on_two_modes_reaches_a_row_only_under_the_mode_that_found_it():
    """verl's step draws rollout rejection on token-mean and on seq-mean-token-mean. A row only the seq-mean variant
    reaches (agg_loss's NaN through its per-row sum) holds under the seq-mean modes, which its agg_loss members
    already say: rejection alone is not listed. A row both variants reach holds under rejection with any mode; an
    alternative that implies another is dropped."""
    from rlconform.harness.bindings import verl_configs
    from rlconform.harness.catalog.binding import Binding

    table = Binding(name="verl", ops={}, configs={
        "defaults": verl_configs.defaults, "ops": verl_configs.ops({}), "triggers": verl_configs.TRIGGERS,
        "twins": verl_configs.TWINS}).config_table()
    step = {f"policy_step.{p}.{v}": {"op": "policy_step", "property": p, "dtype": "float32",
                                     "regime": f"{v}@trainer_batches"}
            for v in ("token-mean-with-rejection", "seq-mean-token-mean-with-rejection", "token-mean-with-tis")
            for p in ("matches_reference", "mask_invariant")}
    found = {**FINDINGS, **{f"agg_loss.{m}": {"op": "agg_loss", "regime": f"{m}@moderate"}
                            for m in ("seq-mean-token-mean", "seq-mean-token-sum")}, **step}
    mode, rs = f"{A}.loss_agg_mode", "algorithm.rollout_correction.rollout_rs"
    seq = "policy_step.mask_invariant.seq-mean-token-mean-with-rejection"
    seq_only = alternatives(_row(["agg_loss.seq-mean-token-mean", "agg_loss.seq-mean-token-sum", seq]), found, table)
    assert seq_only == [[(mode, "==", "seq-mean-token-mean")], [(mode, "==", "seq-mean-token-sum")]]
    alone = alternatives(_row([seq]), found, table)
    assert alone == [[(mode, "==", "seq-mean-token-mean"), (rs, "==", "seq_mean_k1")]]
    both = alternatives(_row([seq, "policy_step.mask_invariant.token-mean-with-rejection"]), found, table)
    assert both == [[(rs, "==", "seq_mean_k1")]]  # the pair: whatever the mode
    other_property = alternatives(_row([seq, "policy_step.matches_reference.token-mean-with-rejection"]), found, table)
    assert sorted(other_property) == [[(mode, "==", "seq-mean-token-mean"), (rs, "==", "seq_mean_k1")],
                                      [(mode, "==", "token-mean"), (rs, "==", "seq_mean_k1")]]
    tis = alternatives(_row(["policy_step.matches_reference.token-mean-with-tis"]), found, table)  # one mode: any
    assert tis == [[("algorithm.rollout_correction.rollout_is", "==", "token")]]
    implied = [[(mode, "in", ("seq-mean-token-mean", "seq-mean-token-sum"))], [(mode, "==", "seq-mean-token-mean"),
                                                                               (rs, "==", "seq_mean_k1")]]
    table2 = {"ops": {"x": {"a": [[list(c) for c in implied[0]]], "b": [[list(c) for c in implied[1]]]}}}
    two = {"x.a": {"op": "x", "regime": "a@m"}, "x.b": {"op": "x", "regime": "b@m"}}
    assert alternatives(_row(["x.a", "x.b"]), two, table2) == [[(mode, "in", ("seq-mean-token-mean",
                                                                              "seq-mean-token-sum"))]]
    assert alternatives(_row(["x.a", "x.a"]), two, table2) == alternatives(_row(["x.a"]), two, table2)


def test_a_function_that_runs_under_some_configuration_is_reached_only_there_whatever_op_found_it():
    """verl's compute_is_metrics runs only with rollout_is: its row's reach is the site's, not that of the
    rejection-mask findings that located it; a rounding row (one per module) keeps its members'."""
    table = dict(TABLE, sites={"m.compute_is_metrics": {"crash": [[["rollout_is", "in", ["token", "sequence"]],
                                                                     ["threshold", "~", "_", "a band"]]],
                                                         "": [[["rollout_is", "!=", None]]]}},
                 defaults=dict(TABLE["defaults"], rollout_is=None, threshold=2.0),
                 derived={"strategy": ["model_engine", {"megatron": "megatron"}]})
    site = {"module": "m", "function": "compute_is_metrics"}
    row = _row(["rollout_rejection_mask.token_k1_asym"], engine_function=site)
    assert alternatives(row, FINDINGS, table) == [[("rollout_is", "!=", None)]]
    crash = dict(row, signature={"kind": "crash:ZeroDivisionError"})
    assert describe(alternatives(crash, FINDINGS, table)) == "`rollout_is ∈ {token, sequence}` and `threshold: a band`"
    rounding = dict(row, signature={"kind": "rounding"})
    assert alternatives(rounding, FINDINGS, table)[0][0][0] == "algorithm.rollout_correction.rollout_rs"
    assert holds(("strategy", "==", "megatron"), {"model_engine": "megatron"}, table)  # set through another key
    assert holds(("t", "asym", None), {"t": "0.5_1.5"}, table) and not holds(("t", "asym", None), {"t": "0.5_2.0"},
                                                                              table)


def test_an_alternative_that_contradicts_the_trigger_is_dropped():
    """SkyRL's reference log-probs reach training through the KL loss or the KL in the reward, never both: a row
    whose trigger is the KL loss (use_kl_loss=True) is reached by the first alternative only."""
    table = dict(TABLE, sites={"m.ref": {"": [[["kl_loss", "==", True], ["t", "!=", 1.0]],
                                              [["kl_reward", "==", True], ["kl_loss", "==", False], ["t", "!=", 1.0]]]}},
                 triggers=[["^use_kl_loss", [["kl_loss", "==", True]]]])
    row = _row(["rollout_rejection_mask.token_k1_asym"], "use_kl_loss=True", engine_function={"module": "m",
                                                                                           "function": "ref"})
    assert alternatives(row, FINDINGS, table) == [[("kl_loss", "==", True), ("t", "!=", 1.0)]]
    assert len(alternatives(dict(row, trigger="a sampling temperature ≠ 1"), FINDINGS, table)) == 2
    for conds in ([["k", "in", ["a", "b"]]], [["k", "!=", "c"]]):  # key=c beside these: contradictions too
        table["sites"]["m.ref"][""] = [conds]
        table["triggers"] = [["^use_kl_loss", [["k", "==", "c"]]]]
        assert alternatives(row, FINDINGS, table) == [] and describe([]).startswith("no configuration")


def test_a_misspelt_key_is_warned_about():
    from rlconform.harness.report.config_reach import unknown_keys

    warned = unknown_keys({f"{A}.polcy_loss.loss_mode": "geo_mean", "trainer.total_epochs": 3}, TABLE)
    assert len(warned) == 1 and f"did you mean `{A}.policy_loss.loss_mode`" in warned[0]


@pytest.mark.engines
@pytest.mark.parametrize("engine", ["verl", "skyrl"])
def test_an_installed_engines_configuration_table_is_plain_json(engine):
    """The table goes into report.json and through the check's engine metadata: its defaults, read from the
    installed engine, are plain values (a config object there once broke SkyRL's check)."""
    import importlib.util

    if importlib.util.find_spec(engine) is None:
        pytest.skip(f"{engine} not installed")
    from rlconform.harness.bindings.load import load_engine

    table = load_engine(engine).config_table()
    assert json.loads(json.dumps(table)) == json.loads(json.dumps(table, default=str))
    assert table["defaults"] and all(isinstance(v, (str, int, float, bool, type(None)))
                                     for v in table["defaults"].values())


def test_a_default_that_is_no_plain_value_is_a_binding_error():
    from rlconform.harness.catalog.binding import Binding, BindingError

    with pytest.raises(BindingError, match="not plain values"):
        Binding(name="x", ops={}, configs={"defaults": lambda: {"k": object()}, "ops": {}}).config_table()


@pytest.mark.engines
def test_skyrls_built_in_policy_losses_are_those_the_installed_skyrl_registers():
    """The reach of reduce_metrics' NumPy row (a policy loss of the user's own) reads SkyRL's built-in losses from a
    list: it must be the installed registry's, or a new built-in loss would read as the user's own."""
    import ast
    import inspect

    ppo_utils = pytest.importorskip("skyrl.backends.skyrl_train.utils.ppo_utils")
    from rlconform.harness.bindings import skyrl_configs

    tree = ast.parse(inspect.getsource(ppo_utils.PolicyLossRegistry))
    (table,) = [n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "pl_types" for t in n.targets)]
    assert {k.value for k in table.keys} == set(skyrl_configs.BUILT_IN_POLICY_LOSSES)

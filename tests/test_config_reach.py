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
    correction or a KL loss reached under any loss_reduction (it was drawn on one; that is not what it checks)."""
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
    assert len(rejection) == 4 and [[f"{OPC}.token_mask_is_threshold_low", "!=", None],
                                    [f"{OPC}.token_mask_is_threshold_high", "!=", None]] in rejection
    # the token mask: both of its thresholds set (SkyRL enables it only then), under any loss reduction
    assert table["ops"]["policy_step"]["token-mean-with-token-mask"] == [
        [[f"{OPC}.token_mask_is_threshold_low", "!=", None], [f"{OPC}.token_mask_is_threshold_high", "!=", None]]]
    assert ["trainer.algorithm.grpo_norm_by_std", "==", False] in table["ops"]["outcome_advantage"]["drgrpo"][0]


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

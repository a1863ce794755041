"""verl's binding binds what an older release offers, exercised on the installed verl 0.9.1
with the older release's shape put in place (a monkeypatched signature, a module made unimportable, a
missing attribute), so CI needs no old release:

* policy_loss without ``verl.workers.config`` (verl 0.5): the losses get the OmegaConf actor config the
  legacy ``dp_actor`` hands them, "vanilla" is the unregistered ``compute_policy_loss(cliprange=...)``, the
  4-tuple result becomes the worker's metrics and the loss is divided by the micro-batch count
  (``gradient_accumulation``);
* value_loss / metric_pipeline without typed metrics (``Metric``, ``tensordict_utils``: verl < 0.8) fold the
  worker's floats with ``append_to_dict`` / ``DataProto.concat`` / ``reduce_metrics``;
* outcome_advantage without ``verl.trainer.config.AlgoConfig`` (verl 0.4) passes the algorithm DictConfig;
* dp_metric_all_reduce without an all-reduce is unavailable, naming the missing names;
* an alternative implementation a release lacks is ``unavailable`` for that implementation (not an error).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import forked_cli
import pytest
import torch

from rlconform.harness.catalog.binding import BatchInfo

pytestmark = [pytest.mark.engines]

BINDINGS = os.path.join(os.path.dirname(__file__), "bindings")


@pytest.fixture
def vb():
    if importlib.util.find_spec("verl") is None:
        pytest.skip("verl is not installed: run `install/engines.sh .venv/bin/python verl`")
    from rlconform.harness.bindings import verl as vb

    return vb


@pytest.fixture
def untyped_metrics(vb, monkeypatch):
    """verl < 0.8: no typed metrics and no tensordict_utils."""
    import verl.utils
    from verl.utils import metric as verl_metric

    monkeypatch.delattr(verl_metric, "Metric")
    monkeypatch.delattr(verl_metric, "AggregationType")
    monkeypatch.setitem(sys.modules, "verl.utils.tensordict_utils", None)
    if hasattr(verl.utils, "tensordict_utils"):
        monkeypatch.delattr(verl.utils, "tensordict_utils")


def _info(k=2):
    return BatchInfo(dp_size=1, global_nnz=8, global_batch_size=2, global_nonempty_seqs=2, num_micro_batches=k)


def _inputs():
    torch.manual_seed(0)
    old = torch.randn(2, 4, dtype=torch.float64) * 0.1
    lp = (old + 0.05 * torch.randn(2, 4, dtype=torch.float64)).requires_grad_()
    return old, lp, torch.randn(2, 4, dtype=torch.float64), torch.ones(2, 4, dtype=torch.bool)


def test_policy_loss_binds_a_release_without_worker_configs(vb, untyped_metrics, monkeypatch):
    from omegaconf import DictConfig
    from verl.trainer.ppo import core_algos

    seen = {}

    def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, cliprange=None, cliprange_low=None,
                            cliprange_high=None, clip_ratio_c=3.0, loss_agg_mode="token-mean"):
        seen["vanilla"] = dict(cliprange=cliprange, cliprange_low=cliprange_low, cliprange_high=cliprange_high,
                               clip_ratio_c=clip_ratio_c, loss_agg_mode=loss_agg_mode)
        return (log_prob * advantages).sum(), torch.tensor(0.25), torch.tensor(0.5), torch.tensor(0.125)

    def compute_policy_loss_kl_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                   config=None):
        seen["kl_cov"] = config
        assert config.policy_loss.kl_cov_ratio == 0.2 and config.clip_ratio == 0.2  # what 0.5's losses read
        return (log_prob * advantages).sum(), torch.tensor(0.0), torch.tensor(0.75), torch.tensor(0.0)

    monkeypatch.setitem(sys.modules, "verl.workers.config.actor", None)  # verl 0.5: no typed worker configs
    monkeypatch.setattr(core_algos, "POLICY_LOSS_REGISTRY", {"kl_cov": compute_policy_loss_kl_cov})
    monkeypatch.setattr(core_algos, "compute_policy_loss", compute_policy_loss)
    monkeypatch.setattr(vb, "_has_legacy_worker", lambda kind: True)

    variants = vb._policy_loss()
    assert set(variants.impls) == {"vanilla", "kl_cov"}
    old, lp, adv, mask = _inputs()
    loss, metrics = variants.impls["vanilla"](old, lp, adv, mask, _info(k=2))
    assert seen["vanilla"] == dict(cliprange=0.2, cliprange_low=0.2, cliprange_high=0.2, clip_ratio_c=3.0,
                                   loss_agg_mode="token-mean")
    assert metrics == {"pg_clipfrac": 0.25, "ppo_kl": 0.5, "pg_clipfrac_lower": 0.125}
    # dp_actor: loss = policy_loss / gradient_accumulation (this rank's micro-batches)
    assert torch.allclose(loss, (lp * adv).sum() / 2)
    _, metrics = variants.impls["kl_cov"](old, lp, adv, mask, _info())
    assert isinstance(seen["kl_cov"], DictConfig) and metrics["ppo_kl_abs"] == 0.75
    folded = variants.combine_metrics([({"pg_clipfrac": 0.25}, 4), ({"pg_clipfrac": 0.75}, 4)])
    assert folded == {"pg_clipfrac": 0.5}  # append_to_dict + reduce_metrics: the mean of micro-batch means


def test_policy_loss_on_this_release_is_unchanged(vb):
    """verl 0.9.1: registered "vanilla", ActorConfig with global_batch_info: no micro-batch division."""
    variants = vb._policy_loss()
    old, lp, adv, mask = _inputs()
    one = variants.impls["vanilla"](old, lp, adv, mask, _info(k=1))[0]
    two = variants.impls["vanilla"](old, lp, adv, mask, _info(k=2))[0]
    assert torch.equal(one, two)
    assert not vb._has_legacy_worker("actor") and not vb._has_legacy_worker("critic")


def test_value_loss_without_typed_metrics_or_global_batch_info(vb, untyped_metrics, monkeypatch):
    from verl.trainer.ppo import core_algos

    def compute_value_loss(vpreds, returns, values, response_mask, cliprange_value, loss_agg_mode="token-mean"):
        return ((vpreds - returns) ** 2).mean(), torch.tensor(0.5)  # verl 0.5's signature: no dp_size

    monkeypatch.setattr(core_algos, "compute_value_loss", compute_value_loss)
    monkeypatch.setattr(vb, "_has_legacy_worker", lambda kind: True)
    variants = vb._value_loss()
    old, lp, adv, mask = _inputs()
    loss, metrics = variants.impls["token-mean"](lp, old, adv, mask, _info(k=2))
    assert torch.allclose(loss, ((lp - adv) ** 2).mean() / 2)  # dp_critic: vf_loss / gradient_accumulation
    assert variants.combine_metrics([(metrics, 8), ({"vf_clipfrac": 0.0}, 8)]) == {"vf_clipfrac": 0.25}


def test_metric_pipeline_of_a_release_without_typed_metrics(vb, untyped_metrics, monkeypatch):
    import types

    class DataProto:  # verl 0.5's collect: "The meta_info is assumed to be identical and will use the first one"
        def __init__(self, meta_info=None):
            self.meta_info = meta_info or {}

        @staticmethod
        def concat(data):
            return DataProto(meta_info=data[0].meta_info)

    monkeypatch.setitem(sys.modules, "verl.protocol", types.SimpleNamespace(DataProto=DataProto))
    pipe = vb.binding.ops["metric_pipeline"].load()
    assert pipe.transcribed == vb.METRIC_PIPELINE_FLOATS_TRANSCRIBED
    values = torch.tensor([[1.0, 3.0]])
    mask = torch.tensor([[True, True]])
    rank0 = pipe.reduce_micro([pipe.emit(values, mask), pipe.emit(values * 2, mask)])
    rank1 = pipe.reduce_micro([pipe.emit(values * 10, mask)])
    assert rank0 == {vb.PG_KEY: [2.0, 4.0]}
    final = pipe.finalize(pipe.reduce_mini([pipe.reduce_dp([rank0, rank1]), pipe.reduce_dp([rank0, rank1])]))
    assert final == {vb.PG_KEY: 3.0}  # the first DP rank's micro-batches only, over both mini-batches


def test_metric_pipeline_of_a_release_that_merges_the_ranks_metrics(vb, untyped_metrics, monkeypatch):
    """verl 0.6 / 0.7's ``DataProto.concat`` merges the DP ranks' metrics into ``{key: [rank 0's list, ...]}``,
    once, after the last mini-batch; the ranks hold equal micro-batch counts (``same_micro_num_in_dp``), so an
    imbalanced partition is regularised and never reaches ``np.mean`` as a ragged list (the binding crashed
    there on verl 0.6.1)."""
    import types

    from rlconform.harness.families.metric_pipeline import run_metric_pipeline

    class DataProto:  # verl 0.6.1's concat: all_metrics -> list_of_dict_to_dict_of_list
        def __init__(self, meta_info=None):
            self.meta_info = meta_info or {}

        @staticmethod
        def concat(data):
            metrics = [d.meta_info["metrics"] for d in data]
            return DataProto(meta_info={"metrics": {k: [m[k] for m in metrics] for k in metrics[0]}})

    monkeypatch.setitem(sys.modules, "verl.protocol", types.SimpleNamespace(DataProto=DataProto))
    pipe = vb.binding.ops["metric_pipeline"].load()
    assert pipe.equal_micro_batches_per_rank
    values = torch.tensor([[1.0, 3.0]])
    mask = torch.tensor([[True, True]])
    rank0 = pipe.reduce_micro([pipe.emit(values, mask), pipe.emit(values * 2, mask)])
    rank1 = pipe.reduce_micro([pipe.emit(values * 10, mask), pipe.emit(values * 20, mask)])
    final = pipe.finalize(pipe.reduce_mini([pipe.reduce_dp([rank0, rank1]), pipe.reduce_dp([rank0, rank1])]))
    assert final == {vb.PG_KEY: 16.5}  # np.mean of [[2, 4, 2, 4], [20, 40, 20, 40]]
    rows = torch.tensor([[1.0], [2.0], [4.0]])
    _, final = run_metric_pipeline(pipe, rows, torch.ones_like(rows, dtype=torch.bool),
                                   [[[(0, 1), (1, 2)], [(2, 3)]]])  # rank 0: two micro-batches, rank 1: one
    assert final == {vb.PG_KEY: 2.75}  # rank 0 regrouped into one micro-batch: mean of 1.5 and 4.0


def test_dp_metric_all_reduce_unavailable_names_what_is_missing(vb, untyped_metrics):
    with pytest.raises(ImportError, match="verl.utils.metric.Metric") as exc:
        vb._dp_metric_all_reduce()
    assert "DataProto.concat" in str(exc.value)


def test_outcome_advantage_without_algo_config(vb, monkeypatch):
    from omegaconf import DictConfig
    from verl.trainer.ppo import core_algos

    expected = vb._outcome_advantage().impls["rloo"]
    seen = {}
    real = core_algos.get_adv_estimator_fn("rloo")

    def rloo(**kwargs):
        seen["config"] = kwargs["config"]
        return real(**kwargs)

    monkeypatch.setitem(sys.modules, "verl.trainer.config", None)  # verl 0.4: no AlgoConfig
    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, "rloo", rloo)
    variants = vb._outcome_advantage()
    rewards = torch.zeros(4, 3)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 2.0, 0.5])
    mask = torch.ones(4, 3, dtype=torch.bool)
    index = [0, 0, 1, 1]
    got = variants.impls["rloo"](rewards, mask, index)
    assert isinstance(seen["config"], DictConfig) and seen["config"].gamma == 1.0
    assert all(torch.equal(a, b) for a, b in zip(got, expected(rewards, mask, index)))


def test_agg_loss_micro_batches_averaged_by_the_legacy_actor(vb, monkeypatch):
    def agg_loss(loss_mat, loss_mask, loss_agg_mode):  # verl 0.5: no global batch info
        return (loss_mat * loss_mask).sum() / loss_mask.sum()

    from verl.trainer.ppo import core_algos

    assert vb._agg_loss(core_algos.agg_loss).micro_combine == "sum"  # 0.9.1: normalised by the global batch
    monkeypatch.setattr(vb, "_has_legacy_worker", lambda kind: True)
    assert vb._agg_loss(agg_loss).micro_combine == "mean"  # dp_actor: loss / gradient_accumulation, summed


@pytest.mark.cli
def test_an_implementation_the_release_lacks_is_unavailable_for_it(tmp_path):
    out = tmp_path / "r"
    proc = forked_cli.run(["check", "--engine",
         os.path.join(BINDINGS, "missing_implementation.py"), "--op", "entropy", "--property", "matches_reference",
         "--dtype", "float64", "--regime", "moderate", "--regime", "chunked@moderate", "--max-examples", "2",
         "-n", "1", "--out", str(out), "-q"], timeout=900)
    doc = json.loads((out / "report.json").read_text())
    by_regime = {f["regime"]: f for f in doc["findings"]}
    assert by_regime["moderate"]["status"] == "pass", proc.stdout[-2000:] + proc.stderr[-2000:]
    chunked = by_regime["chunked@moderate"]
    assert chunked["status"] == "unavailable", chunked
    assert "entropy@chunked" in chunked["message"] and "rlconform_no_such_engine" in chunked["message"], chunked


@pytest.mark.distributed
def test_stand_in_worker_feeds_verl_07_token_count_gather(vb, monkeypatch, tmp_path):
    """verl 0.7's train_mini_batch reads mini_batch_td["input_ids"].offsets() and all-gathers the counts over the
    DP group unconditionally (0.8+ checks '"input_ids" in mini_batch_td' first): the stand-in gives it one token
    per row and a one-rank group for the call only."""
    import torch.distributed as dist

    from rlconform.harness.bindings import source

    assert not vb._gathers_token_counts()  # the installed 0.9.1 guards the gather
    v07 = tmp_path / "engine_workers.py"
    v07.write_text('global_token_num = mini_batch_td["input_ids"].offsets().diff().tolist()\n'
                   'torch.distributed.all_gather_object(out, global_token_num, group)\n')
    monkeypatch.setattr(source, "module_file", lambda module: v07)
    assert vb._gathers_token_counts()
    _, data = vb._stand_in_training_worker([{}, {}, {}], gathers_token_counts=True)
    assert data["input_ids"].offsets().diff().tolist() == [1, 1, 1]
    with vb._one_rank_group(True):
        out = [None]
        dist.all_gather_object(out, [1], None)
        assert out == [[1]]
    assert not dist.is_initialized()
    assert vb._this_rank_group() is None  # no group: the stand-in engine's DP group is the default one


def test_rollout_rejection_mask_offers_only_the_options_the_release_accepts(vb, monkeypatch):
    """verl 0.6's rollout_rs is an aggregation level (no SUPPORTED_ROLLOUT_RS_OPTIONS): the op is unavailable
    there, naming the missing set, instead of a ValueError per variant read as an engine crash; a release with
    fewer options provides only those variants."""
    from verl.trainer.ppo import rollout_corr_helper as rc

    assert set(vb.binding.ops["rollout_rejection_mask"].load().impls) == set(vb.ROLLOUT_RS)
    monkeypatch.setattr(rc, "SUPPORTED_ROLLOUT_RS_OPTIONS", {"token_k1", "seq_mean_k1"})
    assert set(vb._rollout_rejection_mask().impls) == {"token_k1", "token_k1_asym", "seq_mean_k1"}
    monkeypatch.delattr(rc, "SUPPORTED_ROLLOUT_RS_OPTIONS")
    with pytest.raises(ImportError, match="SUPPORTED_ROLLOUT_RS_OPTIONS"):
        vb._rollout_rejection_mask()


@pytest.fixture
def chained_metrics(vb, monkeypatch, tmp_path):
    """A verl between releases (early 2026): ``Metric`` has ``chain`` (every rank's micro-batch values in one list)
    and no ``aggregate_dp``, and ``TrainingWorker.train_mini_batch`` calls ``Metric.chain`` on the gathered
    lists. Put in place on the installed 0.9.1: its worker source with the one call changed, ``aggregate_dp``
    removed from ``Metric``."""
    from verl.utils.metric import Metric

    from rlconform.harness.bindings import source

    installed = source.module_file(vb.ENGINE_WORKERS)
    text = installed.read_text()
    assert text.count("Metric.aggregate_dp(val)") == 1, "verl's worker changed: re-read this fixture"
    edited = tmp_path / "engine_workers.py"
    edited.write_text(text.replace("Metric.aggregate_dp(val)", "Metric.chain(val)"))
    real = source.module_file
    monkeypatch.setattr(source, "module_file",
                        lambda module: edited if module == vb.ENGINE_WORKERS else real(module))
    monkeypatch.setattr(source, "_CACHE", {})

    def chain(cls, metric_lists):
        chained = cls(aggregation=metric_lists[0].aggregation)
        for m in metric_lists:
            chained.extend(m)
        return chained

    monkeypatch.delattr(Metric, "aggregate_dp")
    monkeypatch.setattr(Metric, "chain", classmethod(chain), raising=False)
    return Metric


def test_the_dp_fold_is_the_method_the_worker_calls(vb):
    from verl.utils.metric import Metric

    assert vb._dp_fold(Metric) == Metric.aggregate_dp  # verl 0.9.1

    class WithoutIt:
        pass

    with pytest.raises(AttributeError, match="calls Metric.aggregate_dp, which verl.utils.metric.Metric lacks"):
        vb._dp_fold(WithoutIt)


def test_metric_pipeline_of_a_commit_whose_metric_chains_the_ranks(vb, chained_metrics):
    """The metric pipeline binds (it was ``unavailable``: the binding tested ``Metric.aggregate_dp``, a method this
    verl lacks and its worker does not call) and runs the worker's own fold: every rank's micro-batch means in one
    list, then their mean."""
    assert vb._dp_fold(chained_metrics) == chained_metrics.chain
    pipe = vb.binding.ops["metric_pipeline"].load()
    values = torch.tensor([[1.0, 3.0]])
    mask = torch.tensor([[True, True]])
    rank0 = pipe.reduce_micro([pipe.emit(values, mask), pipe.emit(values * 2, mask)])
    rank1 = pipe.reduce_micro([pipe.emit(values * 10, mask), pipe.emit(values * 20, mask)])
    final = pipe.finalize(pipe.reduce_mini([pipe.reduce_dp([rank0, rank1])]))
    assert final == {vb.PG_KEY: pytest.approx(16.5)}  # mean of [2, 4, 20, 40]

"""The shared pipeline and design registry (core/designs.py, core/pipeline.py): values, not shapes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from replay_theory.core.designs import BUFFER_DESIGNS, LOSSES, DesignConfig, GroupReplayParams, design_field_names
from replay_theory.core.pipeline import EnvBackend, Pipeline, UsageRecord
from replay_theory.core.rng import PerSeedGenerator
from replay_theory.simulate.config import SimConfig
from replay_theory.simulate.envs import make_env
from replay_theory.theory.group_replay import fresh_verifier_evaluations


def test_every_design_and_loss_parameter_is_a_design_config_field_with_help():
    fields = set(design_field_names())
    for name, design in {**BUFFER_DESIGNS, **LOSSES}.items():
        if design.params is not None:
            own = {f.name for f in dataclasses.fields(design.params)}
            assert own <= fields, name
    # SimConfig is a DesignConfig: the design fields and their defaults are the same objects, written once
    sim = {f.name: f.default for f in dataclasses.fields(SimConfig)}
    for f in dataclasses.fields(DesignConfig):
        assert sim[f.name] == f.default or (f.default != f.default and sim[f.name] != sim[f.name])


def test_every_name_has_its_help_once_at_its_registry_entry_and_the_cli_lists_it():
    from replay_theory.checks import range_of
    from replay_theory.cli.config_options import field_help
    from replay_theory.core.designs import choices

    fields = {f.name: f for f in dataclasses.fields(DesignConfig)}  # the one Range the CLI and the check read
    assert range_of(fields["buffer"]).named() == choices(BUFFER_DESIGNS)
    assert range_of(fields["loss"]).named() == choices(LOSSES)
    for registry in (BUFFER_DESIGNS, LOSSES):
        for name, entry in registry.items():
            assert entry.help and "\n" not in entry.help and ":" not in entry.help and len(entry.help) <= 90, name
    # what a trainer runs is the entries marked trainer=True, in registry order
    assert list(choices(BUFFER_DESIGNS, trainer=True)) == ["on-policy", "fifo", "positive-bias", "prioritized",
                                                          "stale-k", "epochs", "selective", "dynamic"]
    assert list(choices(LOSSES, trainer=True)) == ["grpo", "no-trust-region", "m2po", "m2po-reference", "tis"]
    loss = {f.name: f for f in dataclasses.fields(DesignConfig)}["loss"]
    text = field_help(loss, "Loss (off-policy correction).")
    assert text.startswith("Loss (off-policy correction). One of: reinforce: REINFORCE, no off-policy correction; ")
    assert text.endswith("; exgrpo: " + LOSSES["exgrpo"].help + ".")
    assert all(f"; {name}: {entry.help}" in text for name, entry in list(LOSSES.items())[1:])


def test_registry_losses_run_with_their_functions_defaults_and_trainer_losses_need_only_rows():
    import inspect

    from replay_theory.core import losses
    from replay_theory.core.designs import LossInputs, loss_output

    functions = {"reinforce": losses.reinforce, "grpo": losses.grpo, "no-trust-region": losses.no_trust_region,
                 "m2po": losses.m2po, "m2po-reference": losses.m2po, "rloo": losses.rloo, "tis": losses.rloo,
                 "asymre": losses.asymre, "exgrpo": losses.exgrpo_shaped}
    assert set(functions) == set(LOSSES)
    for name, entry in LOSSES.items():  # passing the entry's aggregation explicitly changes nothing
        assert entry.aggregation == inspect.signature(functions[name]).parameters["aggregation"].default, name
    rng = np.random.default_rng(0)
    lb = -rng.uniform(0.1, 2.0, (1, 4, 3))
    lp = lb + rng.normal(0, 0.3, (1, 4, 3))
    rows = LossInputs(lp, lb, rng.normal(size=(1, 4)), np.ones((1, 4, 3), bool))  # no is_fresh, no reward
    for name, entry in LOSSES.items():
        if entry.trainer:
            assert np.isfinite(loss_output(DesignConfig(loss=name), rows).loss).all(), name
    # tis = min(c, w) on every row, fresh or not; rloo leaves a fresh row's weight at 1
    c = 1.05
    seq_w = np.exp((lp - lb).sum(-1))  # (1, 4) sequence weights
    tis = loss_output(DesignConfig(loss="tis", clip_c=c), rows)
    expected = np.minimum(c, seq_w)[..., None] * rows.advantage[..., None] * np.ones((1, 4, 3))
    np.testing.assert_allclose(tis.grad_logp, -expected / 4, rtol=1e-13)  # seq-mean-token-sum: 1/B per row


def test_typed_params_view():
    config = DesignConfig(buffer="group-replay", loss="rloo", replay_ratio_groups=1.5, max_age=3)
    assert config.params(GroupReplayParams) == GroupReplayParams(replay_ratio_groups=1.5, max_age=3)


@pytest.mark.parametrize("loss,advantage", [("grpo", "grpo"), ("reinforce", "group-mean"), ("asymre", "group-mean"),
                                            ("rloo", "leave-one-out"), ("m2po", "grpo")])
def test_auto_advantage_is_the_losses_own(loss, advantage):
    buffer = "on-policy" if loss == "rloo" else "fifo"
    assert DesignConfig(buffer=buffer, loss=loss).validated_design().advantage == advantage


def _pipeline(config: SimConfig):
    config = config.validated()
    rng = PerSeedGenerator(config.seed, config.seeds)
    env = make_env("bandit", num_prompts=config.num_prompts, num_actions=config.num_actions, instance_seed=0)
    return Pipeline(config, EnvBackend(env, rng), rng, config.seeds, config.pipeline_settings()), env


def test_sync_fifo_accounting_and_staleness_law():
    """Sync FIFO, N = 3R: ages 0..2 each 1/3 of the samples once full; compute mu R + B per step (Sec. 3)."""
    R, B, mu, T = 16, 32, 2.5, 60
    config = SimConfig(seeds=4, capacity=3 * R, rollouts_per_step=R, batch_size=B, group_size=8, mu=mu)
    pipe, env = _pipeline(config)
    params = env.init_params(config.seeds)
    ages = []
    for step in range(T):
        data = pipe.next_batch(step, params)
        compute = pipe.account(data)
        assert data.generated == R and data.train.size == B
        if step >= 2:
            ages.append(data.staleness)
    np.testing.assert_array_equal(compute, np.full(config.seeds, T * (mu * R + B)))
    counts = pipe.counts()
    assert counts["K_training"] == T * B and counts["K_inference"] == T * R
    assert counts["compute_ratio"] == pytest.approx((mu * R + B) / ((mu + 1) * B))
    ages = np.concatenate([a.ravel() for a in ages])
    assert set(np.unique(ages)) == {0, 1, 2}
    assert ages.mean() == pytest.approx((3 - 1) / 2, abs=0.05)  # (N/R - 1)/2


def test_group_replay_counts_follow_the_rloo_budget():
    """B = 4 groups of 8, rho = 1: 2 fresh + 2 replayed after the first step; K (B + (T - 1) B_fresh) fresh."""
    K, groups, T = 8, 4, 12
    config = SimConfig(seeds=2, buffer="group-replay", loss="rloo", group_size=K, rollouts_per_step=K,
                       batch_size=groups * K, replay_ratio_groups=1.0, max_age=2)
    pipe, env = _pipeline(config)
    params = env.init_params(config.seeds)
    for step in range(T):
        data = pipe.next_batch(step, params)
        fresh_groups = int(data.is_fresh.sum(axis=1)[0]) // K
        assert fresh_groups == (groups if step == 0 else 2)
        assert np.all(data.staleness[~data.is_fresh] >= 1) and np.all(data.staleness[data.is_fresh] == 0)
        pipe.account(data)
        pipe.after_update(step, data)
    assert pipe.counts()["K_inference"] == fresh_verifier_evaluations(K, groups, T, 1.0)
    assert pipe.counts()["K_training"] == T * groups * K


def test_async_accounting_is_eq_2():
    config = SimConfig(seeds=2, pipeline="async", buffer="fifo", capacity=128, batch_size=32, workers=6,
                       trainers=2, mu=5.28)
    pipe, env = _pipeline(config)
    params = env.init_params(config.seeds)
    for step in range(10):
        pipe.account(pipe.next_batch(step, params))
    assert pipe.counts()["compute_ratio"] == pytest.approx((1 + 6 / 2) / (1 + 5.28))  # Eq. (2)
    # Eq. (1): C (1 + W/T) per update, plus the start-up batch of B responses charged once
    np.testing.assert_allclose(pipe.compute, 10 * 32 * (1 + 6 / 2) + 5.28 * 32)


@pytest.mark.parametrize("workers,trainers", [(1.0, 7.0), (7.0, 1.0), (3.0, 5.0), (2.0, 6.0)])
def test_async_runs_every_split_with_real_lag(workers, trainers):
    """Every (W, T) runs (fractional groups carry over); what workers make at step t is first used at t + 1."""
    B, G, mu, k = 64, 8, 5.28, 2
    config = SimConfig(seeds=2, pipeline="async", buffer="fifo", capacity=256, batch_size=B, group_size=G,
                       workers=workers, trainers=trainers, mu=mu, sync_interval=k)
    pipe, env = _pipeline(config)
    params = env.init_params(config.seeds)
    produced, first_use = 0.0, []
    for step in range(40):
        data = pipe.next_batch(step, params)
        assert data.train.size == B  # the trainers never wait once the start-up batch is in
        if data.fresh is not None and step > 0:
            # arrivals were generated with the weights of the last sync <= step - 1
            version = k * ((step - 1) // k)
            assert np.all(data.fresh.created == version)
            first_use.append(step - version)
            produced += data.fresh.size
        pipe.account(data)
    rate = B * workers / (trainers * mu)  # responses the workers deliver per update (Sec. 2)
    assert produced == pytest.approx(rate * 39, abs=2 * G)  # within the group carried over at both ends
    assert set(first_use) <= set(range(1, k + 1))  # lag 1 .. sync_interval at first use


def test_stale_k_prefills_k_distinct_base_batches():
    """M2PO stale-k: updates 0..k-1 train on k distinct base-policy batches, then on data exactly k updates old."""
    k, R = 3, 16
    config = SimConfig(seeds=2, buffer="stale-k", stale_k=k, rollouts_per_step=R, batch_size=R, group_size=8)
    pipe, env = _pipeline(config)
    params = env.init_params(config.seeds)
    seen = []
    for step in range(8):
        data = pipe.next_batch(step, params)
        seen.append(data.train.tokens.copy())
        expected_age = step if step < k else k  # base batches were generated by theta_0
        assert np.all(data.staleness == expected_age)
        assert data.generated == (k + 1) * R if step == 0 else data.generated == R
        pipe.account(data)
    for i in range(k):
        for j in range(i + 1, k):
            assert not np.array_equal(seen[i], seen[j])  # distinct batches, none repeated
    assert pipe.counts()["K_inference"] == (8 + k) * R  # the pre-fill is generated compute


def _batch_arrays(data) -> list[np.ndarray]:
    arrays = [data.weight, data.staleness, data.time_since_last_use, np.asarray(data.generated)]
    for batch in (data.train, data.fresh):
        arrays += [batch.prompt, batch.tokens, batch.mask, batch.logp_behav, batch.reward, batch.advantage,
                   batch.created, batch.group]
    return arrays


@pytest.mark.parametrize("k", [1, 3])
def test_stale_k_overlapped_makes_the_same_batches_and_draws_as_the_sequential_step(k):
    """Generation beside the update (core/designs.stale_k_overlapped) against stale_k_step then the update: every
    array of every step's batch equal, the update handed the batch it trains on, the random streams left equal."""
    config = SimConfig(seeds=2, buffer="stale-k", stale_k=k, rollouts_per_step=16, batch_size=16, group_size=8)
    (plain, env), (overlapped, _) = _pipeline(config), _pipeline(config)
    params = env.init_params(config.seeds)
    handed = []
    for step in range(6):
        params = params + 0.01 * (step + 1)  # a moving policy: each step generates from other weights
        data = plain.next_batch(step, params)
        other, result = overlapped.next_batch_overlapped(step, params, params.copy(),
                                                         lambda train, step=step: handed.append(train) or step)
        assert result == step and handed[-1].fresh is None  # the update sees the batch before this step's generation
        assert np.array_equal(handed[-1].train.tokens, data.train.tokens)
        for a, b in zip(_batch_arrays(data), _batch_arrays(other)):
            assert np.array_equal(a, b)
        assert other.generated == ((k + 1) * 16 if step == 0 else 16)  # the pre-fill counted at step 0, as before
        plain.account(data), overlapped.account(other)
    assert np.array_equal(plain.compute, overlapped.compute)
    assert np.array_equal(plain.rng.random((2, 4)), overlapped.rng.random((2, 4)))  # the same draws were taken


def test_stale_k_overlapped_refuses_what_it_cannot_overlap_and_waits_for_a_generation_when_the_update_fails():
    config = SimConfig(seeds=1, buffer="stale-k", stale_k=0, rollouts_per_step=16, batch_size=16, group_size=8)
    pipe, env = _pipeline(config)
    params = env.init_params(1)
    with pytest.raises(ValueError, match="needs stale_k >= 1"):
        pipe.next_batch_overlapped(0, params, params, lambda train: None)
    fifo, _ = _pipeline(SimConfig(seeds=1, buffer="fifo", rollouts_per_step=16, batch_size=16, capacity=32))
    with pytest.raises(ValueError, match="only in stale-k designs"):
        fifo.next_batch_overlapped(0, params, params, lambda train: None)
    pipe, _ = _pipeline(dataclasses.replace(config, stale_k=1))

    def failing(train):
        raise RuntimeError("update failed")

    with pytest.raises(RuntimeError, match="update failed"):
        pipe.next_batch_overlapped(0, params, params, failing)
    assert len(pipe.buffer) == 2  # the pre-fill and this step's batch: the generation finished and was pushed


def test_freshper_algorithm1_step_counts():
    """Alg. 1 with K = 2: every third update is on-policy on the R fresh responses, the other two replay B."""
    R, B, K, T = 16, 32, 2, 12
    config = SimConfig(seeds=2, buffer="prioritized", capacity=128, rollouts_per_step=R, batch_size=B,
                       group_size=8, per_replay_updates=K, per_tau=10.0, steps=T)
    pipe, env = _pipeline(config)
    params = env.init_params(config.seeds)
    betas = []
    for step in range(T):
        data = pipe.next_batch(step, params)
        betas.append(pipe.buffer.beta)
        if step % (K + 1) == 0:
            assert data.train.size == R and data.generated == R and np.all(data.staleness == 0)
            assert np.all(data.weight == 1.0)
        else:
            assert data.train.size == B and data.generated == 0 and data.staleness.max() >= 1
            assert np.all((data.weight > 0) & (data.weight <= 1.0))  # Eq. (15), normalised by the buffer max
        pipe.account(data)
    counts = pipe.counts()
    assert counts["K_inference"] == R * T / (K + 1) and counts["K_training"] == R * T / (K + 1) + B * T * K / (K + 1)
    np.testing.assert_allclose(betas, 0.4 + 0.6 * np.arange(T) / (T - 1))  # beta anneals 0.4 -> 1
    # p_base = |r| + eps (the paper's critic-free choice): failures get ~1e-6 of a success's priority
    assert pipe.buffer.base == "reward"


def test_usage_histograms_count_the_values_at_least_zero():
    def naive(values):
        kept = [int(v) for v in np.ravel(values) if v >= 0]
        return np.bincount(kept) if kept else np.zeros(1, np.int64)

    for values in ([[0, 2, 2], [5, 0, 1]], [[-1, 3, 0], [-1, -1, 1]], [[-1, -1]], [[-3, 2, -1, 0]], [[4, 4, 7]]):
        values = np.asarray(values, dtype=np.int64)
        got = UsageRecord.add_hist(np.zeros(1, np.int64), values.ravel())
        np.testing.assert_array_equal(got, np.pad(naive(values), (0, max(0, 1 - naive(values).size))))
    record = UsageRecord()
    record.add_uses(np.array([[0, 1], [1, 3]]), np.array([[-1, 2], [-1, -1]]))
    record.add_uses(np.array([[2, 0]]), np.array([[0, -1]]))
    assert record.staleness_counts.tolist() == [2, 2, 1, 1]
    assert record.time_since_last_use_counts.tolist() == [1, 0, 1]

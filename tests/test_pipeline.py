"""The shared pipeline and design registry (simulate/designs.py, simulate/pipeline.py): values, not shapes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from replay_theory.simulate.config import SimConfig
from replay_theory.simulate.designs import BUFFER_DESIGNS, LOSSES, DesignConfig, GroupReplayParams, design_field_names
from replay_theory.simulate.envs import make_env
from replay_theory.simulate.pipeline import EnvBackend, Pipeline, PipelineSettings
from replay_theory.simulate.rng import PerSeedGenerator
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
    np.testing.assert_allclose(pipe.compute, 10 * 32 * (1 + 6 / 2))  # Eq. (1): C (1 + W/T) per update


def test_settings_default_is_sync():
    assert PipelineSettings().pipeline == "sync"

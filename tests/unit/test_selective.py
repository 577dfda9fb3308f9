"""Selective replay (issue 40): frac_reward_zero_std (z) and the ``selective`` FIFO that admits only groups with
unequal rewards (docs/THEORY.md [E8]), against hand values, a naive loop over groups and the FIFO at z = 0."""

import json

import numpy as np
import pytest

from replay_theory.core.buffers import SelectiveFifoBuffer
from replay_theory.core.designs import BUFFER_DESIGNS, BufferSpec, DesignConfig, make_design_buffer, validate_design
from replay_theory.core.metrics import frac_reward_zero_std, step_metrics, zero_std_groups
from replay_theory.core.rng import PerSeedGenerator
from replay_theory.core.rollouts import RolloutBatch
from replay_theory.simulate import engine
from replay_theory.simulate.config import SimConfig
from replay_theory.simulate.envs import make_env

G = 4


def _batch(reward, step=0, group_offset=0):
    """A one-token RolloutBatch (S, n) with the given rewards, groups of G side by side; token = item index."""
    reward = np.asarray(reward, float)
    S, n = reward.shape
    items = np.broadcast_to(np.arange(n), (S, n))
    return RolloutBatch(prompt=items // G, tokens=items[:, :, None].astype(np.int64), mask=np.ones((S, n, 1), bool),
                        logp_behav=np.zeros((S, n, 1)), reward=reward, advantage=np.zeros((S, n)),
                        created=np.full((S, n), step, np.int64),
                        group=np.broadcast_to(group_offset + np.arange(n) // G, (S, n)).astype(np.int64))


# two seeds, three groups of 4: seed 0 [all 0 | mixed | all 1], seed 1 [mixed | all 0.1 | mixed]
REWARDS = [[0, 0, 0, 0, 1, 0, 0, 0.1, 1, 1, 1, 1],
           [1, 0, 0, 0, 0.1, 0.1, 0.1, 0.1, 0, 0, 0, 0.1]]


def test_zero_std_groups_by_hand():
    batch = _batch(REWARDS)
    per_response, share = zero_std_groups(batch.reward, batch.group)
    assert per_response.tolist() == [[True] * 4 + [False] * 4 + [True] * 4, [False] * 4 + [True] * 4 + [False] * 4]
    assert share.tolist() == [2 / 3, 1 / 3]
    assert frac_reward_zero_std(batch.reward, batch.group).tolist() == [2 / 3, 1 / 3]


def test_zero_std_share_against_a_naive_loop():
    rng = np.random.default_rng(0)
    for _ in range(20):
        S, n = 3, 24
        reward = rng.choice([0.0, 0.1, 1.0], size=(S, n), p=[0.7, 0.1, 0.2])
        sizes = rng.choice([2, 3, 4], size=n)  # groups of unequal sizes, laid side by side
        group = np.broadcast_to(np.repeat(np.arange(n), sizes)[:n], (S, n))
        naive = []
        for s in range(S):
            ids = list(dict.fromkeys(group[s].tolist()))
            naive.append(np.mean([np.std(reward[s, group[s] == g]) == 0 for g in ids]))
        assert np.allclose(frac_reward_zero_std(reward, group), naive)
        token_lr, mask, staleness = np.zeros((S, 2, 1)), np.ones((S, 2, 1), bool), np.zeros((S, 2))
        assert np.allclose(step_metrics(token_lr, mask, staleness, reward=reward, group=group)
                           ["frac_reward_zero_std"], naive)
    assert "frac_reward_zero_std" not in step_metrics(token_lr, mask, staleness)


def test_only_unequal_groups_enter_each_seed_its_own_ring():
    buf = SelectiveFifoBuffer(2, capacity=12, seq_len=1)
    buf.add(_batch(REWARDS), step=0)
    assert buf.admitted.tolist() == [4, 8] and buf.size.tolist() == [4, 8]
    assert buf.store.tokens[0, :4, 0].tolist() == [4, 5, 6, 7]  # seed 0: the mixed group only
    assert buf.store.tokens[1, :8, 0].tolist() == [0, 1, 2, 3, 8, 9, 10, 11]  # seed 1: groups 0 and 2
    buf.add(_batch(REWARDS, step=1, group_offset=3), step=1)  # seed 0: slots 4..7; seed 1: 8..11, then wraps
    assert buf.size.tolist() == [8, 12]
    assert buf.store.created[0, :8].tolist() == [0] * 4 + [1] * 4
    assert buf.store.created[1].tolist() == [1] * 4 + [0] * 4 + [1] * 4  # the oldest four left first
    assert buf.store.tokens[1, :, 0].tolist() == [8, 9, 10, 11, 8, 9, 10, 11, 0, 1, 2, 3]
    assert buf.evicted_use_counts().tolist() == [0] * 4  # seed 1's first four, never drawn


def test_empty_seed_skips_its_update():
    buf = SelectiveFifoBuffer(2, capacity=12, seq_len=1)
    rewards = np.array(REWARDS)
    rewards[0] = 0.0  # seed 0: every group all-zero, nothing enters
    buf.add(_batch(rewards), step=0)
    rng = PerSeedGenerator(5, 2)
    u = PerSeedGenerator(5, 2).random((2, 6))
    sample = buf.sample(6, step=0, rng=rng)
    assert sample.weight.tolist() == [[0.0] * 6, [1.0] * 6]
    assert sample.valid.tolist() == [[False] * 6, [True] * 6]
    assert np.all(sample.batch.reward[0] == 0.0)  # placeholder rows: the offered (zero-advantage) responses
    assert sample.batch.tokens[0, :, 0].tolist() == np.floor(u[0] * 12).astype(int).tolist()
    assert sample.batch.tokens[1, :, 0].tolist() == [[0, 1, 2, 3, 8, 9, 10, 11][j] for j in
                                                     np.floor(u[1] * 8).astype(int)]
    assert buf.use_count[0].sum() == 0 and buf.use_count[1].sum() == 6
    assert np.all(sample.time_since_last_use[0] == -1)


def test_registry_and_rules():
    assert BUFFER_DESIGNS["selective"].trainer is True  # trl-replay: tests/integration/test_integrations_trl.py
    buf = make_design_buffer(DesignConfig(buffer="selective", capacity=128), BufferSpec(num_seeds=3, seq_len=2))
    assert type(buf) is SelectiveFifoBuffer and buf.capacity == 128 and buf.num_seeds == 3
    with pytest.raises(ValueError, match="replacement must be true for buffer selective"):
        validate_design(DesignConfig(buffer="selective", replacement=False, batch_size=32))
    with pytest.raises(ValueError, match="capacity must be >= rollouts_per_step"):
        validate_design(DesignConfig(buffer="selective", capacity=32))
    with pytest.raises(ValueError, match="the sync pipeline supports|async pipeline supports"):
        validate_design(DesignConfig(buffer="selective"), pipeline="async")


SMALL = dict(seeds=3, steps=40, eval_every=20, measure_drift=False, num_prompts=16)


def test_simulator_runs_it_and_charges_every_generated_rollout(cli):
    R, B, N, T, mu = 32, 48, 96, 40, 5.28
    code, out, _ = cli("simulate", "--buffer", "selective", "--rollouts-per-step", str(R), "--batch", str(B),
                       "--capacity", str(N), "--steps", str(T), "--seeds", "3", "--eval-every", "20",
                       "--measure-drift", "false", "--num-prompts", "16", "--json", "--no-progress")
    assert code == 0
    payload = json.loads(out)
    assert payload["compute"] == pytest.approx(T * (mu * R + B))  # dropped groups cost generation too: c = mu R + B
    assert payload["replay_ratio"] == pytest.approx(B / R)  # K_training / K_inference, all R counted as generated
    result = engine.run(SimConfig(**SMALL, buffer="selective", rollouts_per_step=R, batch_size=B, capacity=N))
    z = result.curves["frac_reward_zero_std"]
    assert z.shape == (3, T) and np.all((z >= 0) & (z <= 1)) and 0 < z.mean() < 1
    assert result.counts["K_inference"] == T * R and result.counts["K_training"] == T * B


def test_equal_to_fifo_when_no_group_is_all_equal(monkeypatch):
    """Noisy rewards (the bandit through a Gaussian verifier): z = 0, so every seed admits all R and each step's
    draws, slots and batch are the FIFO's: every curve and evaluation equal, number for number."""
    monkeypatch.setattr(engine, "make_env", lambda name, **kw: make_env("noisy-bandit", **kw, reward_noise=0.5))
    runs = {b: engine.run(SimConfig(**SMALL, buffer=b, capacity=128)) for b in ("fifo", "selective")}
    fifo, sel = runs["fifo"], runs["selective"]
    assert np.all(sel.curves["frac_reward_zero_std"] == 0.0)
    assert fifo.curves.keys() == sel.curves.keys()
    for name in fifo.curves:
        np.testing.assert_array_equal(sel.curves[name], fifo.curves[name], err_msg=name)
    for name in fifo.evals:
        np.testing.assert_array_equal(sel.evals[name], fifo.evals[name], err_msg=name)
    np.testing.assert_array_equal(sel.replay_counts, fifo.replay_counts)


def test_engine_skips_the_update_before_any_unequal_group(monkeypatch):
    """Step 0's rewards all zero: every seed's buffer is empty, its update skipped (weight 0, no parameter move)."""
    class FirstStepBlank:
        def __init__(self, env):
            self.env, self.calls = env, 0

        def __getattr__(self, name):
            return getattr(self.env, name)

        def reward(self, prompts, tokens, mask=None):
            self.calls += 1
            r = self.env.reward(prompts, tokens, mask)
            return np.zeros_like(r) if self.calls == 1 else r

    monkeypatch.setattr(engine, "make_env", lambda name, **kw: FirstStepBlank(make_env(name, **kw)))
    seen = []
    engine.run(SimConfig(**{**SMALL, "steps": 3}, buffer="selective", optimizer="sgd"),
               on_step=lambda view: seen.append((view.data.weight.copy(), view.params.copy(), view.grad.copy())))
    assert np.all(seen[0][0] == 0.0) and np.all(seen[0][2] == 0.0)
    np.testing.assert_array_equal(seen[1][1], seen[0][1])  # SGD: no move at step 0
    assert np.all(seen[1][0] == 1.0)


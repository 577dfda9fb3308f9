"""The vectorised engine against the plain per-seed loop (experiments/naive.py) on a small FIFO bandit run."""

from __future__ import annotations

import numpy as np
import pytest

from replay_theory.experiments.naive import run_naive_fifo_bandit
from replay_theory.simulate import engine, optim
from replay_theory.simulate.config import SimConfig

SMALL = SimConfig(env="bandit", pipeline="sync", buffer="fifo", loss="grpo", advantage="grpo", seeds=3, steps=12,
                  rollouts_per_step=16, group_size=4, capacity=48, batch_size=24, num_prompts=16, eval_every=5)


def engine_run_with_params(config: SimConfig, monkeypatch) -> tuple[engine.RunResult, np.ndarray]:
    """engine.run(config) and its final parameters (S, d), caught from the optimiser's last step.

    RunResult does not carry the parameters, so the optimiser the engine builds is
    replaced by a subclass that remembers what its last ``step`` returned.
    """
    last: dict[str, np.ndarray] = {}
    base = optim.OPTIMIZERS[config.optimizer]

    class Recording(base):  # type: ignore[valid-type, misc]
        def step(self, params, grad):
            last["params"] = super().step(params, grad)
            return last["params"]

    monkeypatch.setitem(optim.OPTIMIZERS, config.optimizer, Recording)
    result = engine.run(config)
    return result, last["params"]


@pytest.mark.parametrize("changes", [
    {"replacement": True},  # R = 16, B = 24 > R: slots drawn with replacement, the ring wraps at step 3
    {"replacement": False, "batch_size": 16},  # random.sample needs B <= filled = R at step 0
    {"replacement": True, "group_size": 8, "seed": 3},
    {"replacement": False, "batch_size": 12, "eps_low": 0.05, "eps_high": 0.05, "lr": 0.2},  # the clip binds
], ids=["with-replacement", "without-replacement", "G8", "tight-clip"])
def test_engine_matches_naive_loop(changes, monkeypatch):
    config = SMALL.with_updates(**changes)
    result, params = engine_run_with_params(config, monkeypatch)
    naive = run_naive_fifo_bandit(config)
    np.testing.assert_array_equal(result.eval_steps, naive["eval_steps"])
    assert naive["params"].shape == params.shape == (3, 16)
    assert naive["reward"].shape == result.evals["reward"].shape == (3, 4)  # steps 0, 5, 10, 11
    assert np.abs(params).max() > 0.05  # the run moved the policy
    np.testing.assert_allclose(naive["params"], params, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(naive["reward"], result.evals["reward"], rtol=1e-9)
    np.testing.assert_allclose(naive["accuracy"], result.evals["accuracy"], rtol=1e-9)


def test_seeds_differ_and_prefix_is_stable():
    """Seed i depends on (base seed, i) only: a 2-seed run is the first 2 rows of a 3-seed run."""
    three = run_naive_fifo_bandit(SMALL)
    two = run_naive_fifo_bandit(SMALL.with_updates(seeds=2))
    np.testing.assert_array_equal(two["params"], three["params"][:2])
    assert not np.allclose(three["params"][0], three["params"][1])


@pytest.mark.parametrize("changes", [
    {"env": "token-mdp"},
    {"pipeline": "async"},
    {"buffer": "prioritized"},
    {"loss": "m2po"},
    {"advantage": "group-mean"},
])
def test_out_of_scope_configs_raise(changes):
    with pytest.raises(ValueError):
        run_naive_fifo_bandit(SMALL.with_updates(**changes))


def test_without_replacement_batch_larger_than_fill_raises_like_the_engine():
    config = SMALL.with_updates(replacement=False, batch_size=24)  # B = 24 > R = 16 filled at step 0
    with pytest.raises(ValueError, match="batch_size must be <= rollouts_per_step"):
        run_naive_fifo_bandit(config)
    with pytest.raises(ValueError, match="batch_size must be <= rollouts_per_step"):
        engine.run(config)

"""The validator's per-step log (validate/rl.py ``step_metrics``) carries z = frac_reward_zero_std of the step's
generated groups, as the simulator's curves and TRL's logs do (issue 40), worked out by hand."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")

from replay_theory.core.rollouts import RolloutBatch  # noqa: E402
from replay_theory.validate.rl import step_metrics  # noqa: E402


def _batch(reward, group):
    S, n = reward.shape
    ints = np.zeros((S, n), np.int64)
    return RolloutBatch(prompt=ints, tokens=np.zeros((S, n, 2), np.int64), mask=np.ones((S, n, 2), bool),
                        logp_behav=np.zeros((S, n, 2)), reward=reward, advantage=np.zeros((S, n)), created=ints,
                        group=group)


def test_the_validator_logs_the_zero_std_share_of_its_generated_groups():
    # seed 0: groups [1, 1] (zero std), [0, 1], [0, 0] (zero std) -> z = 2/3; seed 1: [0, 1], [1, 0], [1, 1] -> 1/3
    reward = np.array([[1.0, 1.0, 0.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]])
    group = np.array([[0, 0, 1, 1, 2, 2], [0, 0, 1, 1, 2, 2]])
    fresh = _batch(reward, group)
    train = _batch(reward, group)
    out = SimpleNamespace(loss=np.zeros(2), metrics={})
    data = SimpleNamespace(fresh=fresh, staleness=np.zeros((2, 6)))
    rows = step_metrics(3, [{}, {}], out, train, np.zeros((2, 6, 2)), data, 0)
    assert [r["frac_reward_zero_std"] for r in rows] == pytest.approx([2 / 3, 1 / 3])
    # a step that generated nothing (a replay-only update) logs no z rather than a made-up one
    rows = step_metrics(4, [{}, {}], out, train, np.zeros((2, 6, 2)), SimpleNamespace(fresh=None,
                                                                                       staleness=np.zeros((2, 6))), 0)
    assert all("frac_reward_zero_std" not in r for r in rows)

"""Smoke test of the validation path: tiny Qwen2, SFT warm start, RL with the simulator's buffer and loss."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from replay_theory.validate import countdown  # noqa: E402
from replay_theory.validate.model import ModelConfig, load_policy, sft_warm_start  # noqa: E402
from replay_theory.validate.rl import RLConfig, train  # noqa: E402


@pytest.fixture(scope="module")
def warm_policy():
    train_set, _ = countdown.make_splits(200, 20, seed=0)
    policy = load_policy(ModelConfig(), countdown.ALPHABET)
    examples = [(p.prompt_text(), countdown.solve(p)) for p in train_set]
    losses = sft_warm_start(policy, examples, steps=120, batch_size=32, lr=3e-3,
                            generator=torch.Generator().manual_seed(0))
    assert losses[-1] < 0.5 * losses[0]
    return policy, train_set


def test_rl_steps_with_the_simulators_fifo_buffer_and_grpo(warm_policy):
    policy, train_set = warm_policy
    before = [p.detach().clone() for p in policy.model.parameters()]
    config = RLConfig(steps=6, rollouts_per_step=16, group_size=4, batch_size=16, capacity=48, lr=1e-3,
                      max_new_tokens=20, logp_source="trainer")
    result = train(policy, train_set, config)
    first, later = result.metrics[0], result.metrics[1:]
    # step 0 trains only on fresh completions: log-ratios exactly 0 and ESS fraction exactly 1
    assert first["log_ratio_abs_max"] == 0.0 and first["ess_frac"] == 1.0 and first["staleness_mean"] == 0.0
    # later steps replay completions from earlier policies: stale data has ESS fraction below 1
    stale = [m for m in later if m["staleness_mean"] > 0]
    assert stale and all(m["ess_frac"] < 1.0 for m in stale)
    assert all(np.isfinite(m["loss"]) for m in result.metrics)
    moved = sum(float((a - b.detach()).abs().sum()) for a, b in zip(before, policy.model.parameters()))
    assert moved > 0.0
    assert result.k_inference == 6 * 16 and result.k_training == 6 * 16
    assert result.generation_seconds > 0 and result.update_seconds > 0 and np.isfinite(result.mu_timing())


def test_bad_rl_config_is_one_line():
    with pytest.raises(ValueError, match="capacity must be >= rollouts_per_step"):
        RLConfig(capacity=8, rollouts_per_step=16, group_size=4).validated()
    with pytest.raises(ValueError, match="loss must be one of"):
        RLConfig(loss="ppo").validated()

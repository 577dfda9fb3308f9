"""The simulator's pipelines against the theory's formulas: replay ratio, staleness, compute, mu."""

import math

import numpy as np
import pytest

from replay_theory.simulate.config import SimConfig, config_from_dict
from replay_theory.simulate.engine import run
from replay_theory.theory.compute import compute_ratio
from replay_theory.theory.group_replay import fresh_verifier_evaluations

FAST = dict(seeds=4, steps=60, eval_every=20, measure_drift=False, num_prompts=16)


def test_fifo_steady_state_replay_ratio_and_staleness():
    R, N, B, steps = 32, 128, 96, 200
    result = run(SimConfig(**{**FAST, "steps": steps}, buffer="fifo", capacity=N, rollouts_per_step=R, batch_size=B))
    s = result.summary()
    assert s["replay_ratio"] == B / R  # K_training / K_inference, exactly
    # uniform over ages 0..N/R - 1 once full: (N/R - 1)/2 = 1.5; the first N/R steps are younger
    assert s["mean_staleness"] == pytest.approx((N / R - 1) / 2, abs=0.05)
    assert s["max_staleness"] == N // R - 1
    # compute in rollout-cost units: mu R + B per step
    assert result.curves["compute"][0, -1] == pytest.approx(steps * (5.28 * R + B))
    assert s["compute_ratio"] == pytest.approx((5.28 * R + B) / ((5.28 + 1) * B))


def test_same_seed_same_result_and_seeds_are_independent_streams():
    config = SimConfig(**FAST, buffer="fifo", capacity=128)
    a, b = run(config), run(config)
    np.testing.assert_array_equal(a.evals["reward"], b.evals["reward"])
    np.testing.assert_array_equal(a.curves["loss"], b.curves["loss"])
    two = run(config.with_updates(seeds=2))
    np.testing.assert_allclose(two.evals["reward"], a.evals["reward"][:2], rtol=0, atol=1e-12)
    other = run(config.with_updates(seed=1))
    assert not np.array_equal(other.evals["reward"], a.evals["reward"])


def test_async_pipeline_recovers_mu_and_compute_ratio():
    W, T, mu, B = 6.0, 2.0, 5.28, 64
    result = run(SimConfig(**{**FAST, "steps": 120}, pipeline="async", buffer="fifo", capacity=256, batch_size=B,
                           workers=W, trainers=T, mu=mu))
    s = result.summary()
    assert s["compute_ratio"] == pytest.approx(compute_ratio(W, T, mu), rel=1e-12)  # Eq. (2)
    # App. E estimate from the run's counts: whole groups, the start-up batch and the last step's rollouts
    # still in flight make the counts differ from the rates by about one batch in 120 updates
    assert s["mu_estimate"] == pytest.approx(mu, rel=0.03)
    assert s["replay_ratio"] == pytest.approx(mu * T / W, rel=0.03)
    # Eq. (1) per update, plus the start-up batch the trainers wait for (B responses of the base policy)
    assert result.curves["compute"][0, -1] == pytest.approx(120 * B * (1 + W / T) + mu * B)


def test_on_policy_has_zero_log_ratios_and_full_ess():
    result = run(SimConfig(**FAST, buffer="on-policy"))
    assert np.all(result.curves["ess_frac"] == 1.0)
    assert np.all(result.curves["kl_k1"] == 0.0) and np.all(result.curves["m2"] == 0.0)
    assert result.summary()["mean_staleness"] == 0.0


def test_stale_k_trains_on_data_exactly_k_updates_old():
    k = 5
    result = run(SimConfig(**FAST, buffer="stale-k", stale_k=k))
    staleness = result.curves["staleness_mean"]  # (S, steps)
    assert np.all(staleness[:, k:] == k)
    assert np.all(result.curves["ess_frac"][:, k:] < 1.0)


def test_group_replay_fresh_evaluations_match_the_budget_formula():
    K, B, T, rho = 8, 12, 40, 1.0
    result = run(SimConfig(**{**FAST, "steps": T}, buffer="group-replay", loss="rloo", advantage="leave-one-out",
                           group_size=K, rollouts_per_step=K, batch_size=B * K, replay_ratio_groups=rho, max_age=2))
    assert result.counts["K_inference"] == fresh_verifier_evaluations(K, B, T, rho)  # K (B + (T-1) B_fresh)
    assert result.counts["K_training"] == K * B * T


@pytest.mark.parametrize("buffer,extra", [
    ("on-policy", {}), ("fifo", {}), ("positive-bias", {}), ("prioritized", {"per_tau": 50.0}),
    ("stale-k", {}), ("epochs", {"mini_batches": 2, "batch_size": 32}), ("selective", {}),
    ("group-replay", {"loss": "rloo", "advantage": "leave-one-out", "batch_size": 64}),
])
def test_every_buffer_learns(buffer, extra):
    result = run(SimConfig(**{**FAST, "steps": 80}, buffer=buffer, **extra))
    start, end = result.evals["reward"][:, 0], result.evals["reward"][:, -1]
    assert np.all(end > start + 0.05)


@pytest.mark.parametrize("loss,extra", [
    ("reinforce", {"advantage": "group-mean"}), ("no-trust-region", {}), ("m2po", {}), ("m2po-reference", {}),
    ("asymre", {"advantage": "group-mean"}),
])
def test_every_loss_learns(loss, extra):
    result = run(SimConfig(**{**FAST, "steps": 80}, buffer="fifo", loss=loss, **extra))
    assert np.all(result.evals["reward"][:, -1] > result.evals["reward"][:, 0] + 0.05)


def test_token_mdp_runs_with_sequence_ratios():
    result = run(SimConfig(env="token-mdp", seeds=3, steps=30, eval_every=15, measure_drift=False, buffer="stale-k",
                           stale_k=4, loss="m2po", lr=0.03))
    assert np.all(result.curves["ess_frac"][:, 4:] < 1.0)
    assert np.all(np.isfinite(result.curves["loss"]))


@pytest.mark.parametrize("changes,message", [
    ({"buffer": "lifo"}, "buffer must be one of"),
    ({"loss": "ppo"}, "loss must be one of"),
    ({"capacity": 16, "rollouts_per_step": 32}, "capacity must be >= rollouts_per_step"),
    ({"replacement": False, "batch_size": 100, "rollouts_per_step": 64}, "batch_size must be <= rollouts_per_step"),
    ({"buffer": "group-replay", "loss": "rloo", "replay_ratio_groups": 3.0, "max_age": 2}, "must be <= max_age"),
    ({"mu": -1.0}, "mu must be a finite number > 0"),
    ({"mu": math.nan}, "mu must be a finite number > 0"),
    ({"lr": math.inf}, "lr must be a finite number > 0"),
    ({"buffer": "group-replay", "loss": "rloo", "batch_size": 12}, "batch_size must be a multiple of group_size"),
    ({"loss": "asymre", "advantage": "grpo"}, "loss asymre uses the group-mean advantage"),
    ({"capcity": 3}, "unknown config field 'capcity'"),
    ({"steps": 2.5}, "steps must be an integer"),
])
def test_inconsistent_designs_fail_before_any_work(changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_dict(changes)


def test_token_statistics_reused_from_the_loss_equal_a_fresh_computation(monkeypatch):
    from replay_theory.simulate import engine

    config = SimConfig(**FAST, buffer="stale-k", stale_k=3, loss="m2po")
    reused = run(config)
    original = engine.step_metrics_by_age  # the recorder's call, given the loss's statistics: drop them
    monkeypatch.setattr(engine, "step_metrics_by_age", lambda lr, mask, stale, stats, *a, **k: original(
        lr, mask, stale, None, *a, **k))
    recomputed = run(config)
    for name in engine.Recorder.TOKEN_STATS:
        np.testing.assert_allclose(reused.curves[name], recomputed.curves[name], rtol=1e-12, atol=1e-15)
    assert np.all(reused.curves["m2"][:, 3:] > 0)


@pytest.mark.parametrize("changes", [
    {"buffer": "fifo", "loss": "grpo"},
    {"buffer": "stale-k", "stale_k": 2, "loss": "m2po", "env": "token-mdp"},
    {"buffer": "fifo", "loss": "no-trust-region", "pipeline": "async"},
    {"buffer": "group-replay", "loss": "rloo"},
])
def test_curves_computed_by_chunks_of_steps_equal_step_by_step(changes, monkeypatch):
    # the recorder stacks a chunk of steps' batches on the seed axis: every curve, ESS by age and the use
    # histograms must be the numbers (and the curve order) of a step-by-step run
    from replay_theory.simulate import engine

    config = SimConfig(**{**FAST, "steps": 23, "eval_every": 5, **changes})
    chunked = run(config)
    monkeypatch.setattr(engine, "CHUNK_CELLS", 1)
    alone = run(config)
    assert list(chunked.curves) == list(alone.curves)
    for name, curve in alone.curves.items():
        np.testing.assert_array_equal(chunked.curves[name], curve, err_msg=name)
    assert chunked.ess_by_age == alone.ess_by_age
    np.testing.assert_array_equal(chunked.staleness_counts, alone.staleness_counts)
    np.testing.assert_array_equal(chunked.time_since_last_use_counts, alone.time_since_last_use_counts)


def test_loss_metrics_read_inside_on_step_are_the_step_s_own():
    # on_step sees the step's LossOutput before the recorder stacks its metrics with later steps'
    config = SimConfig(**{**FAST, "steps": 12, "eval_every": 5})
    seen = {}
    result = run(config, on_step=lambda view: seen.__setitem__(view.step, dict(view.loss.metrics)))
    for step, metrics in seen.items():
        np.testing.assert_array_equal(metrics["pg_clipfrac"], result.curves["pg_clipfrac"][:, step])
        np.testing.assert_array_equal(metrics["is_ratio_max"], result.curves["is_ratio_max"][:, step])

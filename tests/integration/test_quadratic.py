"""The noisy quadratic (simulate/envs/quadratic.py): exact values, the FIFO it shares with the simulator, the law of
its replayed noise against theory/noise_scale.py, and the McCandlish relation measured on it.

``python tests/integration/test_quadratic.py`` prints the McCandlish and replay measurements the last two groups assert
on.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from replay_theory.core.buffers import FifoBuffer
from replay_theory.core.rng import PerSeedGenerator
from replay_theory.core.rollouts import RolloutBatch
from replay_theory.simulate.envs.quadratic import (
    QuadraticConfig,
    QuadraticEnv,
    QuadraticReplay,
    standard_normal,
    train_to_target,
)
from replay_theory.theory.noise_scale import fifo_autocovariance, noise_scale_from_samples

# --------------------------------------------------------------------------- exact values


def test_one_dimension_by_hand():
    """d = 1, h = 1: F(t) = exp(-2t), T = ln(20) / 2, |grad F(T/2)|^2 = 2 sqrt(0.05), tr Sigma = B_noise x that."""
    env = QuadraticEnv(QuadraticConfig(dim=1, noise_scale=100.0))
    assert env.curvature.tolist() == [1.0] and env.smoothness == 1.0
    assert env.j0 == pytest.approx(-1.0, abs=1e-15) and env.j_star == 0.0
    assert env.target == pytest.approx(-0.05, abs=1e-15)
    assert env.target_time == pytest.approx(math.log(20) / 2, rel=1e-12)
    assert env.trace_sigma == pytest.approx(100 * 2 * math.sqrt(0.05), rel=1e-10)
    theta0 = env.init_params(3)
    assert env.evaluate(theta0)["reward"] == pytest.approx([-1.0] * 3, abs=1e-15)
    assert env.b_noise(theta0) == pytest.approx([100 * math.sqrt(0.05)] * 3, rel=1e-10)  # |G0|^2 = 2 F0 = 2
    assert env.b_noise(env.optimum[None])[0] == math.inf  # no signal at theta*: said, not clamped


def test_spectrum_target_and_median_noise_scale():
    env = QuadraticEnv(QuadraticConfig(dim=16, condition=20.0, noise_scale=512.0, target_fraction=0.9))
    assert env.curvature[0] == 1.0 and env.curvature[-1] == pytest.approx(1 / 20, rel=1e-14)
    assert np.allclose(np.diff(np.log(env.curvature)), -math.log(20) / 15)  # log-spaced
    assert env.target == pytest.approx(-0.1, abs=1e-14)
    assert np.allclose(env.noise_var, env.noise_level * env.curvature) and env.trace_sigma == pytest.approx(
        env.noise_level * env.curvature.sum())  # Sigma = s^2 H
    # the flow reaches the target at T, and the median of B_noise over [0, T] (uniform time) is noise_scale
    flow = env.optimum + env.start_offset * np.exp(-env.curvature * env.target_time)
    assert env.evaluate(flow[None])["reward"][0] == pytest.approx(env.target, rel=1e-10)
    t = np.linspace(0, env.target_time, 200_001)
    assert np.median(env.flow_b_noise(t)) == pytest.approx(512.0, rel=1e-4)
    assert np.all(np.diff(env.flow_b_noise(t)) > 0)  # increasing: the median is B_noise(T / 2)
    mid = env.optimum + env.start_offset * np.exp(-env.curvature * env.target_time / 2)
    assert env.b_noise(mid[None])[0] == pytest.approx(512.0, rel=1e-12)


def test_instance_seed_sets_the_start_and_the_optimum():
    a, b, a2 = (QuadraticEnv(QuadraticConfig(instance_seed=s)) for s in (0, 1, 0))
    assert np.array_equal(a.optimum, a2.optimum) and np.array_equal(a.start_offset, a2.start_offset)
    assert not np.allclose(a.optimum, b.optimum) and not np.allclose(a.start_offset, b.start_offset)
    assert a.j0 == pytest.approx(b.j0, abs=1e-14)  # F(theta_0) = 1 for every instance


def test_exact_grad_matches_finite_differences():
    env = QuadraticEnv(QuadraticConfig(dim=6, condition=7.0))
    theta = np.random.default_rng(3).normal(size=(4, 6)) * 2  # (rows, d)
    h = 1e-5
    fd = np.stack([(env.evaluate(theta + h * e)["reward"] - env.evaluate(theta - h * e)["reward"]) / (2 * h)
                   for e in np.eye(6)], axis=1)  # (rows, d) dJ / dtheta
    assert np.allclose(env.exact_grad(theta), fd, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("where", ["start", "target"])
def test_exact_b_noise_matches_the_per_sample_estimator(where):
    """noise_scale_from_samples on M drawn per-sample gradients against the exact tr Sigma / |grad F|^2."""
    env = QuadraticEnv(QuadraticConfig(noise_scale=300.0))
    t = 0.0 if where == "start" else env.target_time
    theta = (env.optimum + env.start_offset * np.exp(-env.curvature * t))[None]  # (1, d) on the flow
    M = 200_000
    grads = env.sample_grads(theta, env.noise(np.random.default_rng(11), (1, M)))[0]  # (M, d)
    est = noise_scale_from_samples(grads)
    exact = env.b_noise(theta)[0]
    grad = -env.exact_grad(theta)[0]
    g_sq = grad @ grad
    # relative standard errors (Gaussian noise): tr Sigma-hat: sqrt(2 tr Sigma^2 / M) / tr Sigma;
    # |G|^2-hat: sqrt(4 G' Sigma G / M + 2 tr Sigma^2 / M^2) / |G|^2
    se_trace = math.sqrt(2 * np.sum(env.noise_var**2) / M) / env.trace_sigma
    se_grad = math.sqrt(4 * grad @ (env.noise_var * grad) / M + 2 * np.sum(env.noise_var**2) / M**2) / g_sq
    assert est.trace_sigma == pytest.approx(env.trace_sigma, rel=4 * se_trace)
    assert est.b_noise == pytest.approx(exact, rel=4 * math.hypot(se_trace, se_grad))
    assert (exact < 300.0) if where == "start" else (exact > 300.0)  # B_noise grows along the path


def test_config_and_sampler_reject_bad_values():
    for field, value, words in [("noise_scale", 0.0, "noise_scale must be a finite number > 0"),
                                ("condition", 0.5, "condition must be >= 1"),
                                ("target_fraction", 1.0, "target_fraction must be in (0, 1)"),
                                ("dim", 0, "dim must be an integer >= 1")]:
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            QuadraticConfig(**{field: value})
    env = QuadraticEnv()
    with pytest.raises(ValueError, match="on-policy needs capacity N = rollouts R = batch B"):
        QuadraticReplay(env, 64, 64, 256, 2, np.random.default_rng(0), on_policy=True)
    with pytest.raises(ValueError, match="capacity N must be >= rollouts R = 64"):
        QuadraticReplay(env, 32, 64, 256, 2, np.random.default_rng(0), on_policy=False)


def test_standard_normal_is_per_row_and_standard():
    """Row i depends only on its own stream (the first rows of a bigger run equal a smaller run); mean 0, var 1."""
    small = standard_normal(PerSeedGenerator(5, 3), 3, 1001)
    big = standard_normal(PerSeedGenerator(5, 8), 8, 1001)
    assert small.shape == (3, 1001) and np.array_equal(small, big[:3])
    z = standard_normal(np.random.default_rng(0), 100, 10_000).astype(float).ravel()  # 1e6 draws
    assert abs(z.mean()) < 4e-3 and abs(z.var() - 1) < 6e-3 and abs(np.mean(z**4) - 3) < 0.03  # ~4 SE each


# --------------------------------------------------------------------------- the FIFO it shares


def _twin_batch(rows: int, first: int, R: int, step: int) -> RolloutBatch:
    ids = np.broadcast_to(first + np.arange(R), (rows, R)).astype(np.int64)
    zi, zf = np.zeros((rows, R), np.int64), np.zeros((rows, R))
    return RolloutBatch(prompt=zi, tokens=np.zeros((rows, R, 1), np.int64), mask=np.ones((rows, R, 1), bool),
                        logp_behav=np.zeros((rows, R, 1)), reward=zf, advantage=zf,
                        created=np.full((rows, R), step, np.int64), group=ids)


@pytest.mark.parametrize("N, R, B", [(32, 8, 24), (8, 8, 24)])  # x = 4 (stored noise), x = 1 (exact shortcut)
def test_fifo_draws_are_fifo_buffers(N, R, B):
    """The ids drawn each step are those FifoBuffer.sample gives a twin fed the same rollouts and the same stream,
    including the steps before the buffer fills (drawn from what it holds)."""
    rows, d = 5, QuadraticEnv().param_dim
    env = QuadraticEnv()
    sampler = QuadraticReplay(env, N, R, B, rows, PerSeedGenerator(7, rows), on_policy=False)
    twin_rng, twin = PerSeedGenerator(7, rows), FifoBuffer(rows, N, 1)
    params = env.init_params(rows)
    for step in range(10):
        sampler.gradient(step, params)
        if N > R:
            twin_rng.random((rows, R * d))  # the stored noise is drawn first
        twin.add(_twin_batch(rows, step * R, R, step), step)
        drawn = twin.sample(B, step, twin_rng)
        if N == R:
            twin_rng.random((rows, d))  # the shortcut's one normal vector
        assert np.array_equal(sampler.last_ids, drawn.batch.group)
        oldest = max(0, (step + 1) * R - N)
        assert sampler.last_ids.min() >= oldest and sampler.last_ids.max() < (step + 1) * R


def test_replayed_noise_is_fixed_at_draw():
    """Every step's noise is sum over the drawn ids of the z recorded when that id was generated (naive loop),
    so a sample replayed at a later step brings back exactly its first noise."""
    rows, N, R, B = 3, 12, 4, 9
    env = QuadraticEnv(QuadraticConfig(dim=5))
    sampler = QuadraticReplay(env, N, R, B, rows, np.random.default_rng(2), on_policy=False)
    params = env.init_params(rows) + 0.3
    z_at_birth: dict[tuple[int, int], np.ndarray] = {}
    replayed = 0
    for step in range(12):
        noise = env.exact_grad(params) - sampler.gradient(step, params)  # (rows, d) mean noise of the step
        for r in range(rows):
            for i in range(step * R, (step + 1) * R):  # this step's samples: their z from now on
                z_at_birth[r, i] = sampler.noise_ring[r, i % N].astype(float) * env.noise_std
            naive = sum(z_at_birth[r, int(i)] for i in sampler.last_ids[r]) / B
            assert np.allclose(noise[r], naive, rtol=1e-6, atol=1e-6)  # float32 sum of O(1) terms
            replayed += int(np.sum(sampler.last_ids[r] < step * R))  # drawn at a later step than its birth
    assert replayed > 100  # the check covered many replays


def _noise_path(sampler: QuadraticReplay, env: QuadraticEnv, steps: int) -> np.ndarray:
    params = env.init_params(sampler.rows)
    return np.stack([env.exact_grad(params) - sampler.gradient(t, params) for t in range(steps)])  # (T, S, d)


@pytest.mark.parametrize("N, R, B, on_policy, materialise", [
    (16, 16, 16, True, False), (16, 16, 16, True, True),  # on-policy: C(0) = 1/B, C(1) = 0
    (8, 8, 24, False, False), (8, 8, 24, False, True),  # x = 1: shortcut and stored noise, the same law
    (16, 8, 24, False, False),  # x = 2: a sample lives two steps, C(1) = (N - R) / N^2
])
def test_noise_law_matches_the_fifo_autocovariance(N, R, B, on_policy, materialise):
    """E[eps_t . eps_t+k] / tr Sigma of the batch-mean noise against theory.noise_scale.fifo_autocovariance
    (on-policy: 1/B and 0), over 4000 rows once the buffer is full."""
    env = QuadraticEnv(QuadraticConfig(dim=4))
    rows, steps = 4000, 6
    sampler = QuadraticReplay(env, N, R, B, rows, PerSeedGenerator(1, rows), on_policy=on_policy,
                              materialise=materialise)
    eps = _noise_path(sampler, env, steps)[N // R - 1:]  # (T', S, d) full buffer from step N/R - 1 on
    for lag in (0, 1):
        prod = np.sum(eps[lag:] * eps[:len(eps) - lag], axis=2).ravel() / env.trace_sigma  # (T' S,)
        expected = (1 / B if lag == 0 else 0.0) if on_policy else float(fifo_autocovariance(lag, B, R, N))
        se = prod.std() / math.sqrt(prod.size / (1 if lag == 0 else 2))  # lag products overlap in time
        assert abs(prod.mean() - expected) < 4 * se, (lag, prod.mean(), expected, se)


def test_same_seed_same_numbers():
    env = QuadraticEnv(QuadraticConfig(noise_scale=256.0))
    runs = [train_to_target(env, [1.0, 0.5], 64, 64, 256, 8, 400, on_policy=False, seed=s) for s in (4, 4, 5)]
    assert np.array_equal(runs[0].first_passage, runs[1].first_passage) and runs[0].steps == runs[1].steps
    assert not np.array_equal(runs[0].first_passage, runs[2].first_passage)
    a, b = (_noise_path(QuadraticReplay(env, 32, 8, 16, 6, PerSeedGenerator(9, 6), on_policy=False), env, 5)
            for _ in range(2))
    assert np.array_equal(a, b)


# --------------------------------------------------------------------------- McCandlish and the replay rule, measured

LRS = 2.0 ** (np.arange(2, -17, -1) / 2)  # 2 .. 2^-8 (units of 1/L, L = 1), factor sqrt(2) apart
BATCHES = (64, 128, 256)
SEEDS = 32
BS = (0.1, 1.0, 10.0)  # b = B_noise / B at B = 256
Y = 4  # replay at x = 1, y = 4: N = R = B / 4


def _tuned_steps(env: QuadraticEnv, N: int, R: int, B: int, on_policy: bool) -> float:
    """Mean first passage over SEEDS at the best step size of LRS (an lr with a censored seed does not count)."""
    trace = train_to_target(env, LRS, N, R, B, SEEDS, 20_000, on_policy=on_policy, seed=0, stop_factor=4.0)
    mean = trace.first_passage.mean(axis=1).astype(float)
    mean[trace.censored.any(axis=1)] = np.inf
    return float(mean.min())


def measure(b: float) -> dict:
    """On-policy steps at B = 64, 128, 256, the fit S = S_min (1 + B_noise_fit / B), and replay (x 1, y 4) at 256."""
    env = QuadraticEnv(QuadraticConfig(noise_scale=256 * b))
    steps = np.array([_tuned_steps(env, B, B, B, True) for B in BATCHES])
    slope, s_min = np.polyfit(1 / np.array(BATCHES), steps, 1)  # S = S_min + S_min B_noise / B
    fitted = s_min + slope / np.array(BATCHES)
    replay = _tuned_steps(env, 256 // Y, 256 // Y, 256, False)
    b_fit = slope / s_min / 256
    return {"b": b, "steps": steps, "s_min": s_min, "b_noise_fit": slope / s_min, "exact": 256 * b,
            "residual": float(np.max(np.abs(fitted - steps) / steps)), "replay": replay,
            "measured_ratio": replay / steps[-1], "predicted_ratio": (1 + b * (1 + Y)) / (1 + b),
            "predicted_ratio_fit": (1 + b_fit * (1 + Y)) / (1 + b_fit)}


@pytest.fixture(scope="module")
def measured() -> list[dict]:
    return [measure(b) for b in BS]


def test_mccandlish_form_holds(measured):
    """On-policy steps are linear in 1/B (McCandlish Eq. 2.7) within 8%, S_min is the noise-free problem's
    (12-16 steps for every b), and the fitted B_noise grows with the set one (by 57x over a 100x range)."""
    for m in measured:
        assert m["residual"] < 0.08, m
        assert 12 <= m["s_min"] <= 16, m
    fits = [m["b_noise_fit"] for m in measured]
    assert fits[0] < fits[1] < fits[2] and fits[2] / fits[0] > 25


def test_the_gradient_noise_scale_overstates_the_one_that_sets_the_steps(measured):
    """Measured: the B_noise fitted to on-policy steps at B = 64 / 128 / 256 is 0.10-0.19 x the set median of the exact
    tr Sigma / |grad F|^2 over the path (4.9 / 24.6 / 277.5 vs 25.6 / 256 / 2560): with a spread spectrum the simple
    noise scale overstates the critical batch (McCandlish App. D), so the rule must be fed the steps' b."""
    for m in measured:
        assert 0.05 < m["b_noise_fit"] / m["exact"] < 0.3, m


def test_replay_costs_the_steps_the_rule_predicts_from_the_fitted_noise_scale(measured):
    """Replay (x 1, y 4) takes more steps than on-policy at B = 256, by (1 + b(1 + y)) / (1 + b) within 10% when b
    is the fitted B_noise / B."""
    for m in measured:
        assert m["measured_ratio"] > 1.03, m
        assert m["measured_ratio"] == pytest.approx(m["predicted_ratio_fit"], rel=0.10), m


def test_the_rule_fed_the_gradient_noise_scale_overpredicts_replay_steps(measured):
    """Measured 1.06 / 1.39 / 3.08 against the rule's 1.36 / 3.00 / 4.64 from the set b = 0.1 / 1 / 10: fed the
    gradients' b, the rule charges replay more steps than it costs (it errs towards on-policy)."""
    for m in measured:
        assert m["predicted_ratio"] > 1.2 * m["measured_ratio"], m


if __name__ == "__main__":
    print("b     S(64,128,256)          S_min  B_noise_fit  exact   fit/exact  resid | replay/on-policy  "
          "pred(set b)  pred(fit b)")
    for m in (measure(b) for b in (0.1, 0.3, 1.0, 3.0, 10.0)):
        print(f"{m['b']:<5} {np.array2string(m['steps'], precision=1):22} {m['s_min']:6.2f} {m['b_noise_fit']:10.1f} "
              f"{m['exact']:7.1f} {m['b_noise_fit'] / m['exact']:9.3f} {m['residual']:6.3f} | "
              f"{m['replay']:6.1f}/{m['steps'][-1]:5.1f} = {m['measured_ratio']:.2f}   {m['predicted_ratio']:9.2f}"
              f"   {m['predicted_ratio_fit']:9.2f}")

"""The noise-scale rule (theory/noise_scale.py): sympy against numpy, a FIFO simulation, the estimators, and the
counterexample to Assumption 3.2 of the experience-replay paper.

Papers: McCandlish et al. 2018, "An Empirical Model of Large-Batch Training" (arXiv 1812.06162), Eq. 2.7 and App. A;
"Efficient RL training for LLMs with experience replay", Sec. 3 and Assumption 3.2. Derivations:
``replay-theory derive fifo-long-run-variance | noise-scale-rule | assumption-3.2-counterexample``.

Monte Carlo checks use seeded generators and assert within 5 standard errors, the standard error either worked out
from the sample size (estimators) or taken from the spread of independent seeds (simulations).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy

from replay_theory.core.buffers import FifoBuffer
from replay_theory.core.rollouts import RolloutBatch
from replay_theory.theory import noise_scale as ns
from replay_theory.theory.symbolic import derive

RTOL = 1e-12
MU_QWEN = 5.28  # Table 1 of the experience-replay paper (Qwen2.5-7B)
BS = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 10.0)
MUS = (0.2, 0.5, 1.0, 2.0, 5.28, 20.0)


def _fn(expr, derivation, *names):
    return sympy.lambdify([derivation.symbols[n] for n in names], expr, modules="numpy")


def _grid(*axes):
    mesh = np.meshgrid(*[np.asarray(a, dtype=float) for a in axes], indexing="ij")
    return [m.ravel() for m in mesh]


# --------------------------------------------------------------------------- sympy against numpy


def test_fifo_autocovariance_and_long_run_variance_match_sympy():
    d = derive("fifo-long-run-variance")
    B, R, x = _grid((1, 2, 7, 16, 256), (1, 3, 8, 64), (1, 2, 5, 12))
    N = x * R
    c0 = _fn(d.parts["C0"], d, "B", "N", "sigma")
    ck = _fn(d.parts["Ck"], d, "N", "R", "k", "sigma")
    want = _fn(d.parts["long_run"], d, "B", "R", "N", "sigma")(B, R, N, 1.0)
    np.testing.assert_allclose(ns.fifo_long_run_variance(B, R, N), want, rtol=RTOL)
    lags = np.arange(-13, 14)  # (lags,): C vanishes beyond |k| = x - 1 <= 11
    for Bi, Ri, Ni, xi, wi in zip(B, R, N, x, want):  # fifo_autocovariance takes scalar B, R, N
        got = ns.fifo_autocovariance(lags, Bi, Ri, Ni)
        k = np.abs(lags)
        exact = np.where(k == 0, c0(Bi, Ni, 1.0), np.where(k < xi, ck(Ni, Ri, k, 1.0), 0.0))  # (N - kR)_+
        np.testing.assert_allclose(got, exact, rtol=RTOL, atol=0)
        assert got.sum() == pytest.approx(wi, rel=1e-12)  # the sum over lags is the closed form
    # hand values: x = 1, y = 4 (N = R = 4, B = 16) and x = 4, y = 2 (N = 16, R = 4, B = 8)
    assert ns.fifo_long_run_variance(16, 4, 4) == pytest.approx(1 / 16 + 1 / 4 - 1 / 64, rel=RTOL)
    assert ns.fifo_long_run_variance(8, 4, 16) == pytest.approx(1 / 8 + 1 / 4 - 1 / 128, rel=RTOL)
    assert isinstance(ns.fifo_long_run_variance(8, 4, 16), float)
    assert ns.fifo_long_run_variance([8, 16], 4, 16).shape == (2,)
    with pytest.raises(ValueError, match="rollouts must be a finite number > 0, got 0"):
        ns.fifo_long_run_variance(8, 0, 16)


def test_on_policy_variances_match_sympy():
    d = derive("fifo-long-run-variance")
    B = np.array([1.0, 2.0, 8.0, 256.0])
    on = _fn(d.parts["on_policy"], d, "B", "sigma")(B, 1.0)
    np.testing.assert_allclose(on, 1 / B, rtol=RTOL)
    with_replacement = _fn(d.parts["on_policy_with_replacement"], d, "B", "sigma")(B, 1.0)
    np.testing.assert_allclose(ns.fifo_long_run_variance(B, B, B), with_replacement, rtol=RTOL)
    np.testing.assert_allclose(with_replacement, 2 / B - 1 / B**2, rtol=RTOL)  # the double charge
    # the rule's B V: 1 + y for replay (the -1/(BN) term dropped), 1 on-policy
    y = np.array([0.5, 1.0, 4.0, 7.5])
    Bs, Rs = sympy.symbols("B R", positive=True)
    ys = sympy.Symbol("y", positive=True)
    bv = sympy.simplify((Bs * (1 / Bs + 1 / Rs)).subs(Rs, Bs / ys))
    assert sympy.simplify(bv - (1 + ys)) == 0
    np.testing.assert_allclose(ns.design_variance(y), 1 + y, rtol=RTOL)
    np.testing.assert_allclose(ns.design_variance(y, on_policy=True), np.ones_like(y), rtol=RTOL)
    assert ns.design_variance(3.0) == 4.0 and ns.design_variance(3.0, on_policy=True) == 1.0


def test_replay_cost_matches_sympy():
    d = derive("noise-scale-rule")
    b, y, mu = _grid(BS, (0.25, 1.0, 3.0, 7.6, 40.0), MUS)
    want = _fn(d.parts["cost_replay"], d, "b", "y", "mu")(b, y, mu)
    np.testing.assert_allclose(ns.replay_cost(b, y, mu), want, rtol=RTOL)
    on = _fn(d.parts["cost_on_policy"], d, "b", "mu")(b, mu)
    np.testing.assert_allclose(ns.replay_cost(b, 1.0, mu, on_policy=True), on, rtol=RTOL)
    # the full cost C = S_min (1 + B_noise V)(mu R + B) in units of S_min B, at B = 64, R = 64 / y
    full = _fn(d.parts["cost"], d, "S_min", "B_noise", "B", "R", "mu")(1.0, b * 64, 64.0, 64.0 / y, mu) / 64
    np.testing.assert_allclose(ns.replay_cost(b, y, mu), full, rtol=1e-12)
    assert ns.replay_cost(0.1, 7.6, 5.28) == pytest.approx((1 + 0.1 * 8.6) * (1 + 5.28 / 7.6), rel=RTOL)


def test_optimal_replay_ratio_matches_sympy_and_is_the_grid_argmin():
    d = derive("noise-scale-rule")
    b, mu = _grid(BS, MUS)
    want = _fn(d.parts["y_star"], d, "b", "mu")(b, mu)
    got = ns.optimal_replay_ratio(b, mu)
    np.testing.assert_allclose(got, want, rtol=RTOL)
    np.testing.assert_allclose(ns.replay_cost(b, got, mu), _fn(d.parts["min_cost"], d, "b", "mu")(b, mu),
                               rtol=1e-12)
    grid = np.geomspace(1e-2, 1e4, 400_001)  # ratio between neighbours 1 + 3.5e-5
    step = grid[1] / grid[0] - 1
    for bi, mi in zip(b, mu):
        y_grid = grid[np.argmin(ns.replay_cost(bi, grid, mi))]
        assert abs(y_grid / ns.optimal_replay_ratio(bi, mi) - 1) <= step, (bi, mi)
    # hand values at mu = 5.28 (the table of docs/THEORY.md)
    assert ns.optimal_replay_ratio(0.1, MU_QWEN) == pytest.approx(math.sqrt(5.28 * 11), rel=RTOL)
    assert [round(ns.optimal_replay_ratio(v, MU_QWEN), 3) for v in (0.1, 0.25, 0.5)] == [7.621, 5.138, 3.980]


def test_replay_threshold_and_replay_pays_match_sympy():
    d = derive("noise-scale-rule")
    mu = np.array(MUS)
    want = _fn(d.parts["threshold"], d, "mu")(mu)
    got = ns.replay_threshold(mu)
    np.testing.assert_allclose(got, want, rtol=RTOL)
    np.testing.assert_allclose(4 * got * (1 + got), mu, rtol=1e-12)  # the root of 4 b (1 + b) = mu
    # mu = 5.28: (sqrt(6.28) - 1)/2 = 0.752996..., printed 0.753 in the notes (0.7531 would be a rounding slip)
    assert ns.replay_threshold(MU_QWEN) == pytest.approx(0.7529964086, abs=1e-10)
    assert float(d.parts["threshold_mu_5_28"]) == pytest.approx(ns.replay_threshold(MU_QWEN), rel=RTOL)
    b, m = _grid(BS, MUS)
    gap = _fn(d.parts["gap"], d, "b", "mu")(b, m)  # on-policy cost - cost(y*)
    away = np.abs(4 * b * (1 + b) - m) > 1e-9
    np.testing.assert_array_equal(ns.replay_pays(b, m)[away], (gap > 0)[away])
    np.testing.assert_array_equal(ns.replay_pays(b, m), b < ns.replay_threshold(m))
    np.testing.assert_allclose(ns.replay_cost(b, 1.0, m, on_policy=True) - ns.replay_cost(
        b, ns.optimal_replay_ratio(b, m), m), gap, rtol=1e-9, atol=1e-12)
    assert ns.replay_pays(0.75, MU_QWEN) is True and ns.replay_pays(0.7531, MU_QWEN) is False


def test_best_saving_matches_sympy_and_hand_values():
    d = derive("noise-scale-rule")
    b, mu = _grid(BS, MUS)
    ratio = _fn(d.parts["saving"], d, "b", "mu")(b, mu)
    pays = ns.replay_pays(b, mu)
    np.testing.assert_allclose(ns.best_saving(b, mu), np.where(pays, ratio, 1.0), rtol=RTOL)
    on = ns.replay_cost(b, 1.0, mu, on_policy=True)
    np.testing.assert_allclose(ns.best_saving(b, mu)[pays], (on / ns.replay_cost(
        b, ns.optimal_replay_ratio(b, mu), mu))[pays], rtol=1e-12)
    assert ns.best_saving(1e-12, 5.28) == pytest.approx(6.28, rel=1e-5)  # sympy: saving -> 1 + mu as b -> 0
    assert ns.best_saving(ns.replay_threshold(5.28) * (1 - 1e-9), 5.28) == pytest.approx(1.0, abs=1e-6)
    # mu = 5.28: 2.19x at b = 0.1, 1.53x at 0.25, 1.16x at 0.5 (as in the notes), none from b = 0.753
    savings = [ns.best_saving(v, MU_QWEN) for v in (0.1, 0.25, 0.5, 0.76, 1.0)]
    np.testing.assert_allclose(savings, [2.1914820, 1.5275207, 1.1601057, 1.0, 1.0], atol=5e-8)
    table = d.parts["table_mu_5_28"]
    for bb, saving, y_star in table:
        assert float(saving) == pytest.approx(ns.best_saving(float(bb), MU_QWEN), abs=1e-5)
        assert float(y_star) == pytest.approx(ns.optimal_replay_ratio(float(bb), MU_QWEN), abs=1e-3)


def _brute_force_design(b_noise, B, mu):
    """(regime, R) from every integer R in 1..B against on-policy: the integer design by exhaustion."""
    b = b_noise / B
    R = np.arange(1, B + 1)
    cost = ns.replay_cost(b, B / R, mu)
    best = int(np.argmin(cost))  # the smallest R on a tie, as the rule's sorted candidates
    on = ns.replay_cost(b, 1.0, mu, on_policy=True)
    return ("replay", int(R[best]), float(cost[best])) if cost[best] < on else ("on-policy", B, on)


@pytest.mark.parametrize("B", [1, 2, 8, 64, 256, 1000])
def test_noise_scale_design_is_the_integer_optimum(B):
    for b in (0.01, 0.05, 0.1, 0.3, 0.7, 0.76, 2.0):
        for mu in (0.5, 2.0, 5.28, 20.0):
            design = ns.noise_scale_design(b * B, B, mu)
            regime, R, cost = _brute_force_design(b * B, B, mu)
            assert (design.regime, design.rollouts_per_step) == (regime, R), (b, mu)
            assert design.capacity == design.rollouts_per_step  # x = 1: the shortest horizon
            assert design.y == B / design.rollouts_per_step
            assert design.cost == pytest.approx(cost, rel=1e-12)
            assert design.on_policy_cost == pytest.approx((1 + b) * (1 + mu), rel=1e-12)
            assert design.saving == pytest.approx(design.on_policy_cost / design.cost, rel=1e-12)
            assert design.saving <= ns.best_saving(b, mu) * (1 + 1e-12)  # rounding only loses
            assert design.threshold_b == ns.replay_threshold(mu)
            if regime == "replay":
                assert design.y_continuous == pytest.approx(ns.optimal_replay_ratio(b, mu), rel=1e-12)
                assert R in (math.floor(B / design.y_continuous), math.ceil(B / design.y_continuous))
                assert design.steps_factor == pytest.approx(1 + b * (1 + design.y), rel=1e-12)
            else:
                assert (design.y, design.y_continuous, design.saving) == (1.0, 1.0, 1.0)
                assert design.steps_factor == pytest.approx(1 + b, rel=1e-12)


def test_noise_scale_design_hand_cases():
    # b = 0.1, mu = 5.28, B = 256: y* = 7.621, B/y* = 33.59; R = 34 costs 3.152316, R = 33 3.152445
    d = ns.noise_scale_design(25.6, 256, 5.28)
    assert (d.regime, d.rollouts_per_step, d.capacity) == ("replay", 34, 34)
    assert d.y == pytest.approx(256 / 34) and d.saving == pytest.approx(6.908 / 3.1523162, rel=1e-7)
    # b = 1 > 0.753: on-policy, cost (1 + 1)(1 + 5.28) = 12.56, steps twice S_min
    d = ns.noise_scale_design(256, 256, 5.28)
    assert (d.regime, d.rollouts_per_step, d.capacity, d.y, d.saving) == ("on-policy", 256, 256, 1.0, 1.0)
    assert d.cost == pytest.approx(12.56) and d.steps_factor == pytest.approx(2.0)
    # b = 0.1 pays in the continuum, but B = 1 leaves only R = 1 (y = 1): rounding lost the saving
    d = ns.noise_scale_design(0.1, 1, 5.28)
    assert ns.replay_pays(0.1, 5.28) and (d.regime, d.rollouts_per_step, d.saving) == ("on-policy", 1, 1.0)
    with pytest.raises(ValueError, match="noise scale B_noise must be a finite number > 0, got 0"):
        ns.noise_scale_design(0.0, 256, 5.28)
    with pytest.raises(ValueError, match="batch size B must be an integer >= 1, got 2.5"):
        ns.noise_scale_design(10.0, 2.5, 5.28)


# --------------------------------------------------------------------------- the FIFO's noise, simulated


def _id_batch(num_seeds: int, ids: np.ndarray, step: int) -> RolloutBatch:
    """R one-token rollouts whose ``prompt`` carries the item id (the same ids in every seed)."""
    n = ids.size
    shape = (num_seeds, n)
    return RolloutBatch(prompt=np.broadcast_to(ids, shape).astype(np.int64), tokens=np.zeros(shape + (1,), np.int64),
                        mask=np.ones(shape + (1,), bool), logp_behav=np.zeros(shape + (1,)),
                        reward=np.zeros(shape), advantage=np.zeros(shape),
                        created=np.full(shape, step, np.int64), group=np.broadcast_to(ids, shape).astype(np.int64))


def _fifo_batch_means(N, R, B, seeds, steps, rng, *, replacement=True):
    """Batch-mean noise e (seeds, steps) drawn through the project's FifoBuffer (add R, then sample B, as
    core.designs.uniform_buffer_step does). Each item's scalar noise z ~ N(0, 1) is fixed at draw and gathered
    by the id stored with it."""
    buffer = FifoBuffer(seeds, N, 1, replacement=replacement)
    noise = rng.standard_normal((seeds, steps * R))  # (seeds, items): z of item id
    e = np.empty((seeds, steps))
    for t in range(steps):
        buffer.add(_id_batch(seeds, t * R + np.arange(R), t), t)
        sample = buffer.sample(B, t, rng)
        e[:, t] = np.take_along_axis(noise, sample.batch.prompt, axis=1).mean(axis=1)  # (seeds, B) -> (seeds,)
    return e


def _per_seed_autocovariance(e, max_lag):
    """(seeds, max_lag + 1): time average of e_t e_{t+k} per seed (the noise mean is known to be 0)."""
    T = e.shape[1]
    return np.stack([(e[:, : T - k] * e[:, k:]).mean(axis=1) for k in range(max_lag + 1)], axis=1)


FIFO_CASES = [  # (N, R, B): x = N/R, y = B/R
    (4, 4, 16),  # x = 1, y = 4
    (16, 4, 8),  # x = 4, y = 2
    (8, 8, 8),  # x = 1, y = 1: on-policy drawn with replacement, 2/B - 1/B^2
    (12, 4, 2),  # x = 3, y = 1/2
]


@pytest.mark.parametrize("N,R,B", FIFO_CASES)
def test_fifo_autocovariance_and_long_run_variance_against_simulation(N, R, B):
    x = N // R
    seeds, steps, burn = 2000, 256, x  # the buffer is full from step x - 1 on
    rng = np.random.default_rng(1000 + 7 * N + R + B)
    e = _fifo_batch_means(N, R, B, seeds, steps + burn, rng)[:, burn:]  # (seeds, steps)
    max_lag = 2 * x + 1
    per_seed = _per_seed_autocovariance(e, max_lag)  # (seeds, lags)
    est, se = per_seed.mean(axis=0), per_seed.std(axis=0, ddof=1) / math.sqrt(seeds)
    exact = ns.fifo_autocovariance(np.arange(max_lag + 1), B, R, N)
    assert exact[0] == pytest.approx(1 / B + 1 / N - 1 / (B * N))
    for k in range(max_lag + 1):  # C(0), C(1), C(k) and the zeros beyond the horizon
        assert abs(est[k] - exact[k]) <= 5 * se[k], (k, est[k], exact[k], se[k])
    assert se[0] < 0.01 * exact[0]  # the check has teeth: 1% of C(0)
    # long-run variance, (a): sum over lags of the empirical autocovariance (lags beyond 2x + 1 are exactly 0)
    lag_sum = per_seed[:, 0] + 2 * per_seed[:, 1:].sum(axis=1)  # (seeds,)
    truth = ns.fifo_long_run_variance(B, R, N)
    assert abs(lag_sum.mean() - truth) <= 5 * lag_sum.std(ddof=1) / math.sqrt(seeds), (lag_sum.mean(), truth)
    # (b): W x variance of the mean over windows of W steps; its bias is -(2/W) sum_k k C(k), at most x/(R W)
    W = 32 * x
    window = W * (e[:, : steps // W * W].reshape(seeds, -1, W).mean(axis=2) ** 2).mean(axis=1)  # (seeds,)
    tol = 5 * window.std(ddof=1) / math.sqrt(seeds) + x / (R * W)
    assert abs(window.mean() - truth) <= tol, (window.mean(), truth, tol)


def test_on_policy_without_replacement_through_the_buffer_is_one_over_b():
    """N = R = B without replacement: the batch is the R fresh items, C(0) = 1/B and no correlation across steps."""
    B, seeds, steps = 8, 2000, 128
    e = _fifo_batch_means(B, B, B, seeds, steps, np.random.default_rng(5), replacement=False)
    per_seed = _per_seed_autocovariance(e, 2)
    est, se = per_seed.mean(axis=0), per_seed.std(axis=0, ddof=1) / math.sqrt(seeds)
    for k, want in enumerate((1 / B, 0.0, 0.0)):
        assert abs(est[k] - want) <= 5 * se[k], (k, est[k], want)
    # and half the with-replacement value 2/B - 1/B^2 (the double charge J gives on-policy)
    assert est[0] < 0.6 * ns.fifo_long_run_variance(B, B, B)


# --------------------------------------------------------------------------- the estimators


def _gaussian_grads(rng, M, g, sd):
    """M per-sample gradients (M, d): g + N(0, diag(sd^2))."""
    return g + sd * rng.standard_normal((M, g.size))


G_TRUE = np.array([0.5, -0.3, 0.2, 0.0, 0.4, -0.1, 0.25, 0.05])  # (d,)
SD_TRUE = np.array([1.0, 2.0, 0.5, 1.5, 1.0, 0.8, 1.2, 2.5])  # (d,)
TRACE = float((SD_TRUE**2).sum())  # tr Sigma
GRAD_SQ = float(G_TRUE @ G_TRUE)  # |G|^2


def _grad_sq_sd(M):
    """SD of the unbiased |G|^2 estimate from M Gaussian samples: ||G_bar||^2 has variance 4 g'Sigma g/M +
    2 tr(Sigma^2)/M^2, and tr Sigma_hat / M (independent of G_bar for Gaussians) adds 2 sum sd^4 / ((M-1) M^2)."""
    s4 = float((SD_TRUE**4).sum())
    return math.sqrt(4 * float(G_TRUE**2 @ SD_TRUE**2) / M + 2 * s4 / M**2 + 2 * s4 / ((M - 1) * M**2))


def test_noise_scale_from_samples_hand_values():
    grads = np.array([[1.0, 0.0], [3.0, 2.0]])  # mean (2, 1); deviations (-1, -1), (1, 1)
    est = ns.noise_scale_from_samples(grads)
    assert (est.trace_sigma, est.grad_sq, est.b_noise) == (4.0, 3.0, 4.0 / 3.0)  # tr = 4/1, |G|^2 = 5 - 4/2
    grouped = ns.noise_scale_from_samples(grads, unit_size=8)  # a unit is a group of 8 responses
    assert (grouped.trace_sigma, grouped.grad_sq, grouped.b_noise) == (32.0, 3.0, 32.0 / 3.0)
    no_signal = ns.noise_scale_from_samples(np.array([[1.0, 0.0], [-1.0, 0.0]]))  # |G_bar|^2 = 0 < tr / M
    assert (no_signal.trace_sigma, no_signal.grad_sq, no_signal.b_noise) == (2.0, -1.0, math.inf)
    with pytest.raises(ValueError, match=r"grads must be an \(M, d\) array with M >= 2 units, got shape \(1, 2\)"):
        ns.noise_scale_from_samples(np.ones((1, 2)))
    with pytest.raises(ValueError, match="unit_size must be an integer >= 1, got 0"):
        ns.noise_scale_from_samples(grads, unit_size=0)


def test_noise_scale_from_samples_is_unbiased_within_the_sample_size_tolerance():
    rng = np.random.default_rng(11)
    M, K = 64, 2000
    ests = [ns.noise_scale_from_samples(_gaussian_grads(rng, M, G_TRUE, SD_TRUE)) for _ in range(K)]
    trace = np.array([e.trace_sigma for e in ests])
    grad_sq = np.array([e.grad_sq for e in ests])
    trace_sd = math.sqrt(2 * float((SD_TRUE**4).sum()) / (M - 1))  # Var of sum_j s_j^2, Gaussian
    assert abs(trace.mean() - TRACE) <= 5 * trace_sd / math.sqrt(K)
    assert abs(grad_sq.mean() - GRAD_SQ) <= 5 * _grad_sq_sd(M) / math.sqrt(K)
    assert trace.std() == pytest.approx(trace_sd, rel=0.1) and grad_sq.std() == pytest.approx(_grad_sq_sd(M), rel=0.1)
    # one large sample: each part within 5 SD, B_noise within the delta-method 5 SD
    M = 20_000
    est = ns.noise_scale_from_samples(_gaussian_grads(rng, M, G_TRUE, SD_TRUE))
    t_sd, g_sd = math.sqrt(2 * float((SD_TRUE**4).sum()) / (M - 1)), _grad_sq_sd(M)
    assert abs(est.trace_sigma - TRACE) <= 5 * t_sd and abs(est.grad_sq - GRAD_SQ) <= 5 * g_sd
    b_true = TRACE / GRAD_SQ
    b_sd = b_true * math.hypot(t_sd / TRACE, g_sd / GRAD_SQ)
    assert abs(est.b_noise - b_true) <= 5 * b_sd, (est.b_noise, b_true, b_sd)


def test_unit_size_scales_a_grouped_estimate_to_samples():
    """Responses g + u_group + v_response: a batch of B responses is B/K groups, so its noise is
    (Sigma_u + Sigma_v/K)/(B/K) = (K tr Sigma_u + tr Sigma_v)/B per sample: the group gradients with unit_size = K
    give K tr Sigma_u + tr Sigma_v; treating the correlated responses as independent gives tr Sigma_u + tr Sigma_v."""
    rng = np.random.default_rng(3)
    K, M, d = 4, 4000, 6
    g = np.full(d, 0.3)
    sd_u, sd_v = 0.8, 1.5
    u = sd_u * rng.standard_normal((M, 1, d))  # (groups, 1, d): shared by the group (its baseline, its prompt)
    v = sd_v * rng.standard_normal((M, K, d))  # (groups, K, d)
    responses = g + u + v  # (groups, K, d)
    group_grads = responses.mean(axis=1)  # (groups, d): the gradient of one group
    grouped = ns.noise_scale_from_samples(group_grads, unit_size=K)
    var_unit = sd_u**2 + sd_v**2 / K  # per coordinate, of one group's gradient
    truth = K * d * sd_u**2 + d * sd_v**2
    tol = 5 * K * math.sqrt(2 * d * var_unit**2 / (M - 1))
    assert abs(grouped.trace_sigma - truth) <= tol, (grouped.trace_sigma, truth, tol)
    assert abs(grouped.b_noise - truth / (g @ g)) <= 0.05 * truth / (g @ g)
    naive = ns.noise_scale_from_samples(responses.reshape(M * K, d))
    assert naive.trace_sigma == pytest.approx(d * (sd_u**2 + sd_v**2), rel=0.03)
    assert grouped.trace_sigma / naive.trace_sigma == pytest.approx(truth / (d * (sd_u**2 + sd_v**2)), rel=0.04)


def test_noise_scale_two_batch_hand_values_and_no_signal():
    # |G|^2 = 1, tr Sigma = 8: E|g_B|^2 = 1 + 8/B, so 5 at B = 2 and 2 at B = 8
    est = ns.noise_scale_two_batch(5.0, 2.0, 2, 8)
    assert est.grad_sq == pytest.approx(1.0, rel=RTOL) and est.trace_sigma == pytest.approx(8.0, rel=RTOL)
    assert est.b_noise == pytest.approx(8.0, rel=RTOL)
    est = ns.noise_scale_two_batch([4.0, 6.0], [2.0, 2.0], 2, 8)  # arrays are averaged first
    assert est.b_noise == pytest.approx(8.0, rel=RTOL)
    flat = ns.noise_scale_two_batch(4.0, 1.0, 1, 4)  # |G|^2 = (4 - 4)/3 = 0: no signal
    assert (flat.grad_sq, flat.trace_sigma, flat.b_noise) == (0.0, 4.0, math.inf)
    with pytest.raises(ValueError, match="batch_big must exceed batch_small, got 4 <= 4"):
        ns.noise_scale_two_batch(1.0, 1.0, 4, 4)


def test_noise_scale_two_batch_recovers_the_truth():
    rng = np.random.default_rng(21)
    T, b_small, b_big = 4000, 8, 64
    small = np.array([(_gaussian_grads(rng, b_small, G_TRUE, SD_TRUE).mean(axis=0) ** 2).sum() for _ in range(T)])
    big = np.array([(_gaussian_grads(rng, b_big, G_TRUE, SD_TRUE).mean(axis=0) ** 2).sum() for _ in range(T)])
    est = ns.noise_scale_two_batch(small, big, b_small, b_big)

    def var_sq(B):  # Var |g_B|^2 for g_B ~ N(G, Sigma/B)
        return 4 * float(G_TRUE**2 @ SD_TRUE**2) / B + 2 * float((SD_TRUE**4).sum()) / B**2

    trace_se = math.sqrt((var_sq(b_small) + var_sq(b_big)) / T) / (1 / b_small - 1 / b_big)
    grad_se = math.sqrt((b_big**2 * var_sq(b_big) + b_small**2 * var_sq(b_small)) / T) / (b_big - b_small)
    assert abs(est.trace_sigma - TRACE) <= 5 * trace_se, (est.trace_sigma, TRACE, trace_se)
    assert abs(est.grad_sq - GRAD_SQ) <= 5 * grad_se, (est.grad_sq, GRAD_SQ, grad_se)


def test_two_micro_batches_and_their_sum_give_the_noise_scale():
    """No extra backward pass: micro-batches of b (their |g|^2 averaged) against their mean (B_big = 2 b)."""
    rng = np.random.default_rng(8)
    T, b = 4000, 16
    first = np.stack([_gaussian_grads(rng, b, G_TRUE, SD_TRUE).mean(axis=0) for _ in range(T)])  # (T, d)
    second = np.stack([_gaussian_grads(rng, b, G_TRUE, SD_TRUE).mean(axis=0) for _ in range(T)])  # (T, d)
    small = 0.5 * ((first**2).sum(axis=1) + (second**2).sum(axis=1))  # (T,)
    big = (((first + second) / 2) ** 2).sum(axis=1)  # (T,)
    est = ns.noise_scale_two_batch(small, big, b, 2 * b)
    per_trace = (small - big) / (1 / b - 1 / (2 * b))  # per-step estimates: their spread gives the SE
    per_grad = (2 * b * big - b * small) / b
    assert abs(est.trace_sigma - TRACE) <= 5 * per_trace.std(ddof=1) / math.sqrt(T)
    assert abs(est.grad_sq - GRAD_SQ) <= 5 * per_grad.std(ddof=1) / math.sqrt(T)


def test_pooled_noise_scale_takes_the_median_and_its_interval_holds_the_truth():
    rng = np.random.default_rng(2024)
    M = 512
    scales = (2.0, 1.5, 1.2, 1.0, 0.05)  # the last checkpoint has almost no signal (B_noise ~ 2e4)
    truths = [TRACE / (s**2 * GRAD_SQ) for s in scales]
    grads = [_gaussian_grads(rng, M, s * G_TRUE, SD_TRUE) for s in scales]
    pooled = ns.pooled_noise_scale(grads, np.random.default_rng(7), n_boot=400)
    per = [ns.noise_scale_from_samples(g).b_noise for g in grads]
    assert pooled.per_checkpoint == tuple(per) and pooled.checkpoints == 5 and pooled.method == "per-sample"
    assert pooled.b_noise == np.median(per)  # the median, not the mean over checkpoints
    assert np.isinf(per[-1]) or np.mean(per) > 10 * pooled.b_noise  # the mean is dominated by the weakest signal
    truth = float(np.median(truths))
    lo, hi = pooled.interval
    assert lo <= truth <= hi and lo <= pooled.b_noise <= hi, (lo, truth, hi)
    assert pooled.b_noise == pytest.approx(truth, rel=0.15)
    record = pooled.to_dict()
    assert record["b_noise"] == pooled.b_noise and record["b_noise_interval"] == [lo, hi]
    assert record["level"] == 0.9 and record["checkpoints"] == 5 and record["method"] == "per-sample"
    # a checkpoint without measurable signal is inf, written as null
    flat = [np.array([[1.0, 0.0], [-1.0, 0.0]]), np.array([[1.0, 0.0], [3.0, 2.0]])]
    pooled = ns.pooled_noise_scale(flat, np.random.default_rng(0), n_boot=50)
    assert pooled.per_checkpoint == (math.inf, 4.0 / 3.0) and pooled.b_noise == math.inf
    assert pooled.to_dict()["per_checkpoint"] == [None, 4.0 / 3.0] and pooled.to_dict()["b_noise"] is None
    with pytest.raises(ValueError, match="grads_by_checkpoint must hold at least one checkpoint"):
        ns.pooled_noise_scale([], rng)


def test_pooled_two_batch_interval_holds_the_truth():
    rng = np.random.default_rng(13)
    T, b_small, b_big = 3000, 4, 32
    small = np.array([(_gaussian_grads(rng, b_small, G_TRUE, SD_TRUE).mean(axis=0) ** 2).sum() for _ in range(T)])
    big = np.array([(_gaussian_grads(rng, b_big, G_TRUE, SD_TRUE).mean(axis=0) ** 2).sum() for _ in range(T)])
    pooled = ns.pooled_two_batch(small, big, b_small, b_big, np.random.default_rng(1), n_boot=400)
    assert pooled.b_noise == ns.noise_scale_two_batch(small, big, b_small, b_big).b_noise
    assert pooled.method == "two-batch" and pooled.checkpoints == T
    lo, hi = pooled.interval
    assert lo <= TRACE / GRAD_SQ <= hi, (lo, TRACE / GRAD_SQ, hi)


# --------------------------------------------------------------------------- Assumption 3.2, numerically


def _scalar_sgd_first_step(theta0, eta, sigma, seeds, B, rng):
    """F = theta^2/2, G = theta + z; R = 1, N = 4 (FifoBuffer). Step 0 adds z_0 and draws B from the buffer (only
    z_0 is there), theta_1 = theta_0 - eta g_0; step 1 adds z_1. Returns theta_1 and the noises at theta_1 of the
    two items in the buffer at step 1: eps of z_0 (position i = 2, t_i = 0) and of the fresh z_1 (i = 1, never used).
    """
    buffer = FifoBuffer(seeds, 4, 1, replacement=True)
    z = sigma * rng.standard_normal((seeds, 2))  # (seeds, items): z_0, z_1 by id
    theta = np.full(seeds, float(theta0))
    buffer.add(_id_batch(seeds, np.array([0]), 0), 0)
    drawn = buffer.sample(B, 0, rng).batch.prompt  # (seeds, B): all id 0
    assert np.all(drawn == 0)
    g0 = (theta[:, None] + np.take_along_axis(z, drawn, axis=1)).mean(axis=1)  # G(theta_0, z) averaged
    theta1 = theta - eta * g0  # SGD, Sec. 3
    buffer.add(_id_batch(seeds, np.array([1]), 1), 1)
    stored = buffer.stored(np.tile(np.arange(2), (seeds, 1))).prompt  # (seeds, 2): ids in the step-1 buffer
    eps = (theta1[:, None] + np.take_along_axis(z, stored, axis=1)) - theta1[:, None]  # G(theta_1, z) - F'(theta_1)
    return theta1, eps[:, 0], eps[:, 1], z


def test_assumption_3_2_conditional_bias_is_the_replayed_noise():
    theta0, eta, sigma, seeds = 1.0, 0.1, 1.0, 200_000
    theta1, eps_old, eps_fresh, z = _scalar_sgd_first_step(theta0, eta, sigma, seeds, 3, np.random.default_rng(4))
    # regress eps of z_0 on (1, theta_1): exact fit, E[eps | F_1] = theta_0 (1/eta - 1) - theta_1/eta = z_0
    X = np.stack([np.ones(seeds), theta1], axis=1)
    coef, *_ = np.linalg.lstsq(X, eps_old, rcond=None)
    np.testing.assert_allclose(coef, [theta0 * (1 / eta - 1), -1 / eta], rtol=1e-9)
    np.testing.assert_allclose(X @ coef, z[:, 0], atol=1e-9)
    d = derive("assumption-3.2-counterexample")
    recovered = _fn(d.parts["z0_recovered"], d, "theta_0", "theta_1", "eta")(theta0, theta1, eta)
    np.testing.assert_allclose(recovered, eps_old, atol=1e-12)
    # conditioning on 40 quantile bins of theta_1: the bin means of eps of z_0 follow z_0 over +-2 sigma, those of
    # the never-used z_1 stay at 0 (the paper's 'never sampled' case)
    edges = np.quantile(theta1, np.linspace(0, 1, 41))
    bins = np.clip(np.searchsorted(edges, theta1, side="right") - 1, 0, 39)
    count = np.bincount(bins, minlength=40)
    old_mean = np.bincount(bins, eps_old, 40) / count
    z0_mean = np.bincount(bins, (theta0 - theta1) / eta - theta0, 40) / count
    fresh_mean = np.bincount(bins, eps_fresh, 40) / count
    np.testing.assert_allclose(old_mean, z0_mean, atol=1e-9)
    assert old_mean.min() < -1.8 * sigma and old_mean.max() > 1.8 * sigma
    assert np.all(np.abs(fresh_mean) <= 5 * sigma / np.sqrt(count))


def test_assumption_3_2_needs_unbounded_kappa_near_minus_theta0():
    theta0, eta, sigma, seeds = 1.0, 0.1, 1.0, 400_000
    theta1, eps_old, _, z = _scalar_sgd_first_step(theta0, eta, sigma, seeds, 2, np.random.default_rng(9))
    kappa_req = np.abs(eps_old) / np.abs(theta1 - theta0)  # least kappa with ||E[eps|F_1]|| <= kappa ||drift||
    d = derive("assumption-3.2-counterexample")
    np.testing.assert_allclose(kappa_req, _fn(d.parts["kappa_required"], d, "z_0", "theta_0", "eta")(
        z[:, 0], theta0, eta), rtol=1e-6)  # theta_1 - theta_0 cancels near z_0 = -theta_0
    least = []
    for delta in (0.1, 0.01, 0.001):  # every draw within delta of -theta_0 needs kappa >= (theta_0 - delta)/(eta delta)
        near = np.abs(z[:, 0] + theta0) < delta
        assert near.sum() >= 50  # draws land there: the event has positive probability
        least.append(kappa_req[near].min())
        assert least[-1] >= (theta0 - delta) / (eta * delta) * (1 - 1e-9)
    assert least[1] > 9 * least[0] and least[2] > 9 * least[1]  # grows like 1/delta: no finite kappa
    assert kappa_req.max() > 1e4 / eta  # the closest of 400000 draws


def test_assumption_3_2_mean_square_kappa_scales_like_one_over_eta():
    theta0, sigma, seeds = 1.0, 1.0, 20_000
    etas = np.array([0.3, 0.1, 0.03, 0.01, 0.003])
    rng = np.random.default_rng(17)
    kappa_ms = []
    for eta in etas:  # independent draws at every step size
        theta1, eps_old, _, _ = _scalar_sgd_first_step(theta0, eta, sigma, seeds, 2, rng)
        kappa_ms.append(math.sqrt(np.mean(eps_old**2) / np.mean((theta1 - theta0) ** 2)))
    kappa_ms = np.array(kappa_ms)
    slope = np.polyfit(np.log(etas), np.log(kappa_ms), 1)[0]
    assert slope == pytest.approx(-1.0, abs=0.02)
    d = derive("assumption-3.2-counterexample")
    exact = _fn(d.parts["kappa_ms"], d, "sigma", "theta_0", "eta")(sigma, theta0, etas)  # sigma/(eta sqrt(th0^2+s^2))
    np.testing.assert_allclose(kappa_ms, exact, rtol=0.03)  # ~5 standard errors at 20000 draws
    np.testing.assert_allclose(etas * kappa_ms, sigma / math.hypot(theta0, sigma), rtol=0.03)
    # so the kappa^2 eta term of Thm 3.4 grows like 1/eta against L = 1 instead of vanishing
    ratio = 4 * kappa_ms**2 * etas  # H = 1
    assert np.all(np.diff(ratio) > 0) and ratio[-1] > 100

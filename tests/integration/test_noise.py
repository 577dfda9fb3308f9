"""theory/noise.py: rho, the within-group correlation and sigma^2(s) recovered on processes whose values are known."""

import math

import numpy as np
import pytest

from replay_theory.theory.noise import (
    fit_rho,
    fit_rho_group_bootstrap,
    noise_profile,
    pair_moments,
    reference_variance,
    staleness_moments,
)


def synthetic(units, rng, steps=9, groups_per_step=2, G=4, d=4, beta=0.005, within=0.0):
    """Gaussian noise vectors whose correlation is exactly ``beta * gap`` between different groups
    and ``within`` inside a group (unit variance per coordinate): (U, n, d), steps (n,), groups (n,)."""
    n_step = groups_per_step * G
    n = steps * n_step
    step = np.repeat(np.arange(steps), n_step)
    group = np.repeat(np.arange(steps * groups_per_step), G)
    gap = np.abs(step[:, None] - step[None, :])
    same_group = (group[:, None] == group[None, :]) & ~np.eye(n, dtype=bool)
    cov = beta * gap * ~(group[:, None] == group[None, :]) + within * same_group + np.eye(n)
    chol = np.linalg.cholesky(cov)  # raises if the process is not a valid covariance
    return np.einsum("ij,ujd->uid", chol, rng.standard_normal((units, n, d))), step, group


N = 72  # the capacity the fit divides the gap by: rho_true = beta * N


@pytest.mark.parametrize("beta,within", [(0.005, 0.0), (0.0, 0.0), (0.0, 0.3), (0.005, 0.3)])
def test_rho_and_within_group_correlation_recovered(beta, within):
    eps, step, group = synthetic(400, np.random.default_rng(1), beta=beta, within=within)
    fit = fit_rho(pair_moments(eps, step[None], group[None], max_gap=8), capacity=N)
    rho_true = beta * N  # 0.36 or 0
    assert fit.ci[0] <= rho_true <= fit.ci[1] and fit.value == pytest.approx(rho_true, abs=0.04)
    assert fit.within_group_ci[0] <= within <= fit.within_group_ci[1]  # reported apart, not in rho
    assert fit.within_group == pytest.approx(within, abs=0.01)
    np.testing.assert_allclose(fit.correlation, beta * np.arange(9), atol=0.008)  # corr(h) = beta h at every gap
    assert fit.in_range and fit.units == 400


def test_bootstrap_interval_covers_the_truth_at_about_the_nominal_rate():
    rng = np.random.default_rng(7)
    hits = 0
    for draw in range(200):
        eps, step, group = synthetic(16, rng)
        fit = fit_rho(pair_moments(eps, step[None], group[None], 8), capacity=N, draws=400, seed=draw)
        hits += fit.ci[0] <= 0.36 <= fit.ci[1]
    # nominal 0.90; the percentile bootstrap on 16 units runs a little short (measured 0.865)
    assert 0.80 <= hits / 200 <= 0.97


def test_out_of_range_fit_is_reported_not_clamped():
    eps, step, group = synthetic(200, np.random.default_rng(3), beta=0.005)
    fit = fit_rho(pair_moments(eps, step[None], group[None], 8), capacity=600)  # rho = 0.005 * 600 = 3
    assert fit.value == pytest.approx(3.0, abs=0.35) and fit.ci[0] > 1.0 and not fit.in_range
    record = fit.to_dict()
    assert record["in_range"] is False and record["value"] == fit.value and record["ci"] == list(fit.ci)


def test_pair_moments_match_a_brute_force_loop_over_pairs():
    rng = np.random.default_rng(0)
    n, d = 14, 3
    eps = rng.standard_normal((1, n, d))
    group = np.array([0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 4, 4, 5, 5])
    step = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 3, 3, 3, 4, 4])  # step 2 empty; gap 4 exists
    valid = np.ones(n, bool)
    valid[7] = False
    v = 0.05
    m = pair_moments(eps, step[None], group[None], max_gap=3, valid=valid[None], reference_variance=v)
    inner, sq, count = np.zeros(4), np.zeros(4), np.zeros(4)
    w = np.zeros(3)
    for i in range(n):
        for j in range(n):
            if i == j or not (valid[i] and valid[j]):
                continue
            dot = eps[0, i] @ eps[0, j] - v
            half = (eps[0, i] @ eps[0, i] + eps[0, j] @ eps[0, j]) / 2 - v
            if group[i] == group[j]:
                w += (dot, half, 1)
            elif abs(step[i] - step[j]) <= 3:
                h = abs(step[i] - step[j])
                inner[h] += dot
                sq[h] += half
                count[h] += 1
    np.testing.assert_allclose(m.between_inner[0], inner, atol=1e-12)
    np.testing.assert_allclose(m.between_sq[0], sq, atol=1e-12)
    np.testing.assert_array_equal(m.between_count[0], count)
    np.testing.assert_allclose([m.within_inner[0], m.within_sq[0], m.within_count[0]], w, atol=1e-12)


def test_zero_gradient_items_do_not_fake_correlation():
    """A fifth of the items have G = 0, so their noise is the same vector -grad F: a mean of cosines
    reads that as correlation; the norm-weighted ratio of sums does not (E eps = 0 for every item)."""
    rng = np.random.default_rng(5)
    U, n, d = 200, 64, 4
    g = np.array([0.6, 0.0, 0.0, 0.0])
    zero = rng.random((U, n)) < 0.2
    # nonzero items: G = g / 0.8 + noise, so E G = 0.8 * g / 0.8 + 0.2 * 0 = g and E eps = 0
    G = np.where(zero[..., None], 0.0, g / 0.8 + rng.standard_normal((U, n, d)))
    eps = G - g
    step = np.repeat(np.arange(8), 8)
    group = np.arange(n)  # every item its own group: all pairs are "different groups"
    fit = fit_rho(pair_moments(eps, step[None], group[None], 7), capacity=64)
    assert np.all(np.abs(fit.correlation) < 0.01)
    unit = eps / np.linalg.norm(eps, axis=-1, keepdims=True)
    cos = np.einsum("und,umd->unm", unit, unit)
    naive = (cos.sum(axis=(1, 2)) - n) / (n * (n - 1))  # the old estimator: mean cosine over pairs
    assert naive.mean() > 0.015  # 4% of pairs are two zero-gradient items with cosine 1


def test_reference_error_is_subtracted():
    """Noise measured against a Monte Carlo reference g_ref = grad F + delta: every pair gains ||delta||^2,
    a spurious correlation of about v / (sigma^2 + v); reference_variance removes it."""
    rng = np.random.default_rng(2)
    U, n, d, n_ref = 300, 40, 5, 20
    eps = rng.standard_normal((U, n, d))  # true noise: independent, sigma^2 = d
    ref_samples = rng.standard_normal((U, n_ref, d))  # the reference's own per-sample errors
    delta = ref_samples.mean(axis=1)  # (U, d)
    v = reference_variance(ref_samples)  # (U,), estimates d / n_ref = 0.25
    assert v.mean() == pytest.approx(d / n_ref, rel=0.05)
    measured = eps - delta[:, None, :]
    step, group = np.repeat(np.arange(5), 8), np.arange(n)
    raw = fit_rho(pair_moments(measured, step[None], group[None], 4), capacity=40)
    fixed = fit_rho(pair_moments(measured, step[None], group[None], 4, reference_variance=v), capacity=40)
    assert raw.correlation[1] == pytest.approx(0.25 / 5.25, abs=0.01)
    assert np.all(np.abs(fixed.correlation) < 0.01)


def test_signal_normalised_profile_hand_computed():
    g = np.array([[1.0, 0.0]])  # grad F
    grads = np.array([[[[2.0, 0.0], [0.0, 0.0]],  # s = 0: E G = (1, 0) = grad F
                       [[1.0, 1.0], [0.0, -1.0]]]])  # s = 4: E G = (0.5, 0): half the signal kept
    p = noise_profile(staleness_moments(grads, g), [0, 4])
    # plain: mean ||G - g||^2 = (1 + 1) / 2 = 1 at s = 0; (1 + 2) / 2 = 1.5 at s = 4
    assert p.plain == pytest.approx((1.0, 1.5))
    # r = <E G, g> / ||g||^2 = 1 and 0.5
    assert p.retained == pytest.approx((1.0, 0.5))
    # E||G / r - g||^2: s = 0 same as plain; s = 4: ||(2, 2) - (1, 0)||^2 = 5 and ||(0, -2) - (1, 0)||^2 = 5
    assert p.signal_normalised == pytest.approx((1.0, 5.0))
    assert p.true_grad_sq == 1.0 and math.isnan(p.plain_ci[0][0])  # one unit: no interval
    # an exactly known mean replaces the sample average in r(s)
    exact = noise_profile(staleness_moments(grads, g, sample_mean=np.array([[[1.0, 0.0], [0.25, 3.0]]])), [0, 4])
    assert exact.retained == pytest.approx((1.0, 0.25))


def test_no_signal_left_gives_an_infinite_normalised_noise():
    g = np.array([[1.0, 0.0]])
    grads = np.array([[[[0.0, 1.0], [0.0, -1.0]]]])  # orthogonal to grad F: r = 0
    p = noise_profile(staleness_moments(grads, g), [8])
    assert p.retained == (0.0,) and p.signal_normalised == (math.inf,) and p.plain == (2.0,)


def test_rho_for_design_uses_zero_only_when_the_interval_covers_it():
    from replay_theory.advise.profile_files import LoadedProfile
    from replay_theory.theory.profiles import PowerLawProfile

    base = dict(profile=PowerLawProfile(alpha=0.25), rho=None, description="d")
    below = LoadedProfile(**base, rho_fit={"value": -0.001, "ci": [-0.01, 0.01], "in_range": False})
    rho, note = below.rho_for_design()
    assert rho == 0.0 and note.startswith("rho = 0 used: the profile's rho fit -0.001")
    above = LoadedProfile(**base, rho_fit={"value": 3.0, "ci": [2.0, 4.0], "in_range": False})
    with pytest.raises(ValueError, match=r"rho fit 3 .* is outside \[0, 1\].*; give rho explicitly"):
        above.rho_for_design()
    inside = LoadedProfile(**{**base, "rho": 0.2}, rho_fit={"value": 0.2, "ci": [0.1, 0.3], "in_range": True})
    assert inside.rho_for_design() == (0.2, None)


def pooled(units, rng, **kwargs):
    """One buffer made of ``units`` independent synthetic processes, their steps 100 apart (so pairs of
    two processes lie beyond every max_gap and only pairs inside one process, correlated beta * gap, count):
    noise (n, d), steps (n,), groups (n,)."""
    eps, step, group = synthetic(units, rng, **kwargs)
    U, n, d = eps.shape
    shift = np.arange(U)[:, None]
    return eps.reshape(U * n, d), (step[None] + 100 * shift).reshape(-1), (group[None] + 1000 * shift).reshape(-1)


@pytest.mark.parametrize("reference", [0.0, 0.3])
def test_group_bootstrap_point_estimate_equals_fit_rho(reference):
    eps, step, group = pooled(3, np.random.default_rng(11), beta=0.005, within=0.2)
    group = group * 7 % 10007  # ids in no particular order: only their equality matters
    direct = fit_rho(pair_moments(eps[None], step[None], group[None], 8, reference_variance=reference), N)
    boot = fit_rho_group_bootstrap(eps, step, group, 8, N, reference_variance=reference, draws=200)
    assert boot.value == pytest.approx(direct.value, rel=1e-12)
    assert boot.within_group == pytest.approx(direct.within_group, rel=1e-12)
    np.testing.assert_allclose(boot.correlation, direct.correlation, rtol=1e-12)
    assert boot.pairs == direct.pairs and boot.units == 3 * 18 and direct.units == 1  # units: groups vs the buffer
    assert boot.ci[0] <= boot.value <= boot.ci[1] and math.isnan(direct.ci[0])  # one buffer: only groups give a CI
    assert boot.within_group_ci[0] <= boot.within_group <= boot.within_group_ci[1]
    with pytest.raises(ValueError, match="same creation step"):
        fit_rho_group_bootstrap(eps, step, np.zeros_like(group), 8, N)


def test_group_bootstrap_interval_covers_the_known_correlation():
    """One buffer of 144 groups per replicate, rho = beta N = 0.36, within-group 0.2: the 90% group-bootstrap
    intervals cover both at about the nominal rate (measured 0.93 for rho, a little conservative)."""
    rng = np.random.default_rng(5)
    hits = within_hits = 0
    for draw in range(100):
        eps, step, group = pooled(8, rng, d=16, within=0.2)
        fit = fit_rho_group_bootstrap(eps, step, group, 8, N, draws=400, seed=draw)
        hits += fit.ci[0] <= 0.36 <= fit.ci[1]
        within_hits += fit.within_group_ci[0] <= 0.2 <= fit.within_group_ci[1]
    assert 0.84 <= hits / 100 <= 0.99 and 0.80 <= within_hits / 100 <= 0.99

"""Thm 3.4 bound and Thm 3.5 optimum: closed form vs numerical minimisation, conventions, regimes."""

import math

import numpy as np
import pytest

from replay_theory.theory.design import (
    DesignQuery,
    mu_sec3_of,
    numeric_optimum,
    objective_j,
    objective_jrbn,
    optimal_design,
    power_law_k,
    power_law_optimum,
    printed_power_law_x_star,
    printed_power_law_y_star,
    reduced_objective,
    thm34_bound,
    y_star_given_x,
)
from replay_theory.theory.profiles import PowerLawProfile, TabulatedProfile, sigma_bar_sq

GRID = [(mu, alpha, rho) for mu in (0.05, 0.19, 1.0, 5.28) for alpha in (0.05, 0.2, 0.35, 0.45)
        for rho in (0.0, 0.1, 0.6)]


def test_hand_worked_closed_form():
    # mu = 1, alpha = 1/4, rho = 0: y* = (1 - 1/2) / (2 * 1/4 * 1) = 1, x* = (1/2)^2 / (4 * 1/16 * 1) = 1.
    x, y = power_law_optimum(1.0, 0.25, 0.0)
    assert (x, y) == pytest.approx((1.0, 1.0), rel=1e-15)
    # mu = 1, alpha = 1/4, rho = 1/2: rho mu y^2 + 2 alpha mu y + 2 alpha - 1 = y^2/2 + y/2 - 1/2 = 0
    # -> y* = (-1 + sqrt(5)) / 2; x* = mu y^2 / (2 alpha (1 + mu y)) = 2 y^2 / (1 + y).
    y_expected = (math.sqrt(5) - 1) / 2
    x, y = power_law_optimum(1.0, 0.25, 0.5)
    assert y == pytest.approx(y_expected, rel=1e-14)
    assert x == pytest.approx(2 * y_expected**2 / (1 + y_expected), rel=1e-14)


@pytest.mark.parametrize("mu,alpha,rho", GRID)
def test_closed_form_equals_numerical_minimum(mu, alpha, rho):
    x_closed, y_closed = power_law_optimum(mu, alpha, rho)
    found = numeric_optimum(PowerLawProfile(alpha), mu, rho, x_min=x_closed / 1e3, x_max=x_closed * 1e3)
    assert found.x_star == pytest.approx(x_closed, rel=1e-6)
    assert found.y_star == pytest.approx(y_closed, rel=1e-6)


@pytest.mark.parametrize("mu,alpha,rho", [g for g in GRID if g[2] > 0])
def test_closed_form_equals_printed_formula_where_defined(mu, alpha, rho):
    x, y = power_law_optimum(mu, alpha, rho)
    assert printed_power_law_x_star(mu, alpha, rho) == pytest.approx(x, rel=1e-8)
    assert printed_power_law_y_star(mu, alpha, rho) == pytest.approx(y, rel=1e-8)


@pytest.mark.parametrize("mu,alpha,rho", GRID)
def test_first_order_conditions(mu, alpha, rho):
    x, y = power_law_optimum(mu, alpha, rho)
    assert rho * mu * y**2 + 2 * alpha * mu * y + 2 * alpha - 1 == pytest.approx(0.0, abs=1e-12)  # y quadratic
    assert y == pytest.approx(y_star_given_x(x, mu, rho), rel=1e-12)  # dJ/dy = 0
    h = 1e-5 * x
    slope = (power_law_k(x + h, mu, alpha, rho) - power_law_k(x - h, mu, alpha, rho)) / (2 * h)
    assert abs(slope) < 1e-6 * power_law_k(x, mu, alpha, rho) / x  # dK/dx = 0


def test_removable_singularity_rho_zero():
    # ERRATUM "removable singularities": the printed x* and y* are 0/0 at rho = 0.
    mu, alpha = 0.5, 0.3
    with pytest.raises(ZeroDivisionError):
        printed_power_law_x_star(mu, alpha, 0.0)
    with pytest.raises(ZeroDivisionError):
        printed_power_law_y_star(mu, alpha, 0.0)
    x, y = power_law_optimum(mu, alpha, 0.0)
    assert x == pytest.approx((1 - 2 * alpha) ** 2 / (4 * alpha**2 * mu), rel=1e-14)
    assert y == pytest.approx((1 - 2 * alpha) / (2 * alpha * mu), rel=1e-14)
    # the stable form is continuous where the printed one loses all digits
    x_small, _ = power_law_optimum(mu, alpha, 1e-12)
    assert x_small == pytest.approx(x, rel=1e-9)
    assert abs(printed_power_law_x_star(mu, alpha, 1e-12) - x) / x > 1e-6  # cancellation


def test_removable_singularity_mu_equals_rho():
    mu = rho = 0.4
    alpha = 0.2
    with pytest.raises(ZeroDivisionError):
        printed_power_law_x_star(mu, alpha, rho)
    x, _ = power_law_optimum(mu, alpha, rho)
    near = [printed_power_law_x_star(mu * (1 + d), alpha, rho) for d in (1e-4, -1e-4)]
    assert x == pytest.approx(np.mean(near), rel=1e-6)
    assert np.isfinite(x) and x > 0


def test_spurious_root_for_alpha_above_half():
    # ERRATUM "spurious root": for alpha > 1/2 the printed formula returns a positive x
    # (a root of the squared condition) where K is increasing, i.e. no optimum.
    mu, alpha, rho = 2.0, 0.75, 0.5
    spurious = printed_power_law_x_star(mu, alpha, rho)
    assert spurious > 0
    k = [power_law_k(spurious * f, mu, alpha, rho) for f in (0.99, 1.0, 1.01)]
    assert k[0] < k[1] < k[2]
    assert power_law_optimum(mu, alpha, rho) == (0.0, 0.0)
    assert optimal_design(DesignQuery(mu=0.5, alpha=0.75, rho=0.5, convention="paper-sec3")).regime == "on-policy"


def test_regimes():
    assert optimal_design(DesignQuery(mu=5.28)).regime == "replay"
    assert optimal_design(DesignQuery(mu=5.28, alpha=0.5)).regime == "on-policy"
    unbounded = optimal_design(DesignQuery(mu=5.28, alpha=0.0, rho=0.1))
    assert unbounded.regime == "unbounded" and math.isinf(unbounded.x_star)
    assert unbounded.y_star == pytest.approx(math.sqrt(5.28 / 0.1), rel=1e-12)  # 1/sqrt(mu_sec3 rho)
    cheap = optimal_design(DesignQuery(mu=0.5))  # cheap rollouts: x* < 1
    assert cheap.regime == "on-policy" and cheap.x_star_unconstrained < 1
    assert (cheap.x_star, cheap.y_star, cheap.compute_ratio) == (1.0, 1.0, 1.0)


def test_mu_conventions_are_reciprocal_and_give_opposite_trends():
    assert mu_sec3_of(5.28, "rollout-cost") == pytest.approx(1 / 5.28)
    assert mu_sec3_of(5.28, "paper-sec3") == 5.28
    # J_rollout(x, y; mu) = (mu + y)(1/y + 1/x + rho) = mu J_sec3(x, y; 1/mu)
    x, y, rho, mu = 3.0, 2.0, 0.2, 5.28
    assert (mu + y) * (1 / y + 1 / x + rho) == pytest.approx(mu * objective_j(x, y, 1 / mu, rho), rel=1e-14)
    mus = [1.0, 2.0, 5.28, 10.0]
    rollout = [power_law_optimum(float(mu_sec3_of(m, "rollout-cost")), 0.25, 0.1) for m in mus]
    sec3 = [power_law_optimum(float(mu_sec3_of(m, "paper-sec3")), 0.25, 0.1) for m in mus]
    # Fig. 4 caption (x*, y* grow with mu) holds only for the rollout-cost reading
    assert all(np.diff([r[0] for r in rollout]) > 0) and all(np.diff([r[1] for r in rollout]) > 0)
    assert all(np.diff([s[0] for s in sec3]) < 0) and all(np.diff([s[1] for s in sec3]) < 0)


def test_mu_5_28_advice_in_both_conventions():
    d = optimal_design(DesignQuery(mu=5.28, rollouts_per_step=64))
    assert d.convention == "rollout-cost" and d.regime == "replay"
    assert (d.x_star, d.y_star) == pytest.approx(power_law_optimum(1 / 5.28, 0.25, 0.1), rel=1e-15)
    assert d.x_star == pytest.approx(2.4323, abs=1e-4) and d.y_star == pytest.approx(3.2140, abs=1e-4)
    assert (d.capacity, d.batch_size) == (156, 206)  # round(2.4323 * 64), round(3.2140 * 64)
    assert d.workers_per_trainer == pytest.approx(5.28 * 64 / 206, rel=1e-14)
    assert d.compute_ratio == pytest.approx((1 + 5.28 * 64 / 206) / 6.28, rel=1e-14)
    s = optimal_design(DesignQuery(mu=5.28, convention="paper-sec3", rollouts_per_step=64))
    assert s.regime == "on-policy" and s.x_star_unconstrained == pytest.approx(0.17944, abs=1e-5)
    assert (s.capacity, s.batch_size) == (64, 64)


def test_batch_size_gives_rollouts_per_step():
    d = optimal_design(DesignQuery(mu=5.28, batch_size=60))
    assert d.rollouts_per_step == round(60 / d.y_star) == 19
    assert d.capacity == round(d.x_star * 19) == 46


def test_y_star_minimises_j_and_reduction_holds():
    rng = np.random.default_rng(1)
    for _ in range(20):
        x, mu, rho, s = rng.uniform(0.5, 20), rng.uniform(0.05, 5), rng.uniform(0, 1), rng.uniform(0.1, 3)
        ys = np.exp(np.linspace(-6, 6, 20001))
        y_grid = ys[np.argmin(objective_j(x, ys, mu, rho, s))]
        y_star = y_star_given_x(x, mu, rho)
        assert y_star == pytest.approx(y_grid, rel=1e-3)
        assert reduced_objective(x, mu, rho, s) == pytest.approx(objective_j(x, y_star, mu, rho, s), rel=1e-12)


def test_objective_is_scale_invariant_in_n_r_b():
    profile = PowerLawProfile(0.3, tau=2.0, floor=1.0)
    N, R, B, mu, rho = 120.0, 40.0, 90.0, 0.2, 0.3
    base = objective_jrbn(N, R, B, mu, rho, profile)
    assert objective_jrbn(7 * N, 7 * R, 7 * B, mu, rho, profile) == pytest.approx(base, rel=1e-13)
    assert base == pytest.approx(objective_j(N / R, B / R, mu, rho, sigma_bar_sq(profile, N / R)), rel=1e-13)


def test_thm34_bound_hand_value_and_step_size_erratum():
    profile = PowerLawProfile(0.25)  # sigmabar^2(x) = x^0.5 / 1.5
    b = thm34_bound(eta=0.01, N=100, R=10, B=20, kappa=1.0, L=2.0, profile=profile, rho=0.1, F0=5.0, steps=1000)
    sbar = math.sqrt(10) / 1.5
    noise = 8 * 0.01 * (4 * 100**2 * 1 * 0.01 / 10**2 + 2.0) * sbar * (1 / 20 + 1 / 100 + 0.1 / 10)
    assert b.optimization_term == pytest.approx(12 * 5 / (0.01 * 1000), rel=1e-15)
    assert b.noise_term == pytest.approx(noise, rel=1e-14)
    assert b.value == pytest.approx(6.0 + noise, rel=1e-14)
    assert b.eta_max == pytest.approx(10 / (2 * math.sqrt(2) * 100), rel=1e-15) and b.step_size_valid
    # ERRATUM "Thm 3.4 step size": printed eta <= L/2, proof needs L eta < 1/2.
    stiff = thm34_bound(eta=0.2, N=10, R=10, B=20, kappa=0.0, L=10.0, profile=profile, rho=0.1, F0=5.0, steps=1000)
    assert stiff.eta_max_printed == 5.0 and stiff.eta_max == 0.05 and not stiff.step_size_valid


def test_any_profile_table_agrees_with_its_function():
    floor_profile = PowerLawProfile(0.5, tau=4.0, floor=1.0)  # sigma^2 = 1 + s/4: interior optimum at alpha = 1/2
    s = np.linspace(0, 400, 4001)
    table = TabulatedProfile(tuple(s), tuple(floor_profile.sigma_sq(s)))
    mu = 1 / 5.28
    from_function = numeric_optimum(floor_profile, mu, 0.1, x_max=400)
    from_table = numeric_optimum(table, mu, 0.1)
    assert not from_function.at_lower_edge and not from_function.at_upper_edge
    assert from_table.x_star == pytest.approx(from_function.x_star, rel=1e-6)
    # I(x) = (1 + x/8)(sqrt(mu) + sqrt(0.1 + 1/x))^2 -> check it is a minimum by brute force
    xs = np.linspace(1, 100, 200001)
    values = (1 + xs / 8) * (math.sqrt(mu) + np.sqrt(0.1 + 1 / xs)) ** 2
    assert from_function.x_star == pytest.approx(xs[np.argmin(values)], abs=1e-3)


def test_discrete_average_against_naive_loop_and_the_sigma0_pitfall():
    profile = PowerLawProfile(0.3, tau=2.0, floor=1.0)
    mu, rho = 0.2, 0.05
    best = numeric_optimum(profile, mu, rho, average="discrete", x_max=200)
    naive = []
    for horizon in range(1, 201):
        sbar = sum(float(profile.sigma_sq(s)) for s in range(horizon)) / horizon
        naive.append(sbar * (math.sqrt(mu) + math.sqrt(rho + 1 / horizon)) ** 2)
    assert best.x_star == 1 + int(np.argmin(naive))
    assert best.objective == pytest.approx(min(naive), rel=1e-12)
    # Pure power law: sigma(0) = 0 makes a one-step buffer noiseless, the exact average collapses to x = 1
    pure = numeric_optimum(PowerLawProfile(0.3), mu, rho, average="discrete", x_max=200)
    assert pure.x_star == 1 and pure.objective == 0.0
    assert power_law_optimum(mu, 0.3, rho)[0] > 1  # while the integral approximation says replay


def test_profile_regimes_in_optimal_design():
    mu = 5.28
    flat = TabulatedProfile((0.0, 50.0), (1.0, 1.0))  # no staleness penalty measured -> as large as measured
    d = optimal_design(DesignQuery(mu=mu, profile=flat, profile_rho=0.0))
    assert d.regime == "unbounded" and d.x_star_unconstrained == pytest.approx(50.0)
    steep = TabulatedProfile((0.0, 1.0, 2.0, 10.0), (1.0, 50.0, 100.0, 500.0))
    assert optimal_design(DesignQuery(mu=mu, profile=steep)).regime == "on-policy"
    d = optimal_design(DesignQuery(mu=mu, profile=PowerLawProfile(0.25), rho=0.1))
    assert d.regime == "replay" and d.x_star == pytest.approx(power_law_optimum(1 / mu, 0.25, 0.1)[0], rel=1e-6)


def test_json_uses_null_for_infinity():
    payload = optimal_design(DesignQuery(mu=5.28, alpha=0.0, rho=0.0)).to_json_dict()
    assert payload["x_star"] is None and payload["y_star"] is None and payload["regime"] == "unbounded"


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(mu=0.0), r"^mu must be a finite number > 0"),
        (dict(mu=1.0, alpha=-0.1), r"^alpha must be a finite number >= 0"),
        (dict(mu=1.0, rho=1.5), r"^rho must be in \[0, 1\]"),
        (dict(mu=1.0, rho=math.nan), r"^rho must be in \[0, 1\]"),
        (dict(mu=1.0, convention="sec3"), r"^convention must be one of rollout-cost, paper-sec3"),
        (dict(mu=1.0, rollouts_per_step=0), r"^rollouts-per-step must be an integer >= 1"),
    ],
)
def test_bad_queries(kwargs, message):
    with pytest.raises(ValueError, match=message):
        optimal_design(DesignQuery(**kwargs))


def test_default_alpha_reproduces_the_fig1_horizon():
    # Fig. 1 (Qwen2.5-7B): N = 84, batch 60, (W, T) = (6, 2), mu = 5.28.
    # Rollouts produced per update: R = B (W/T) / mu; horizon x = N / R.
    R = 60 * (6 / 2) / 5.28
    x_paper = 84 / R
    assert x_paper == pytest.approx(2.464, abs=1e-3)
    d = optimal_design(DesignQuery(mu=5.28))
    assert d.alpha == 0.25 and d.rho == 0.1
    assert abs(d.x_star - x_paper) / x_paper < 0.02  # 2.432 vs 2.464

"""The finite-budget objective: Thm 3.4 minimised over eta per design, its integer optimum and its two limits.

Every value is checked against an independent computation: bisection or sympy's polynomial roots for
eta*, a brute-force minimisation over a fine eta grid and every integer design for the optimum, and the
paper's J (Thm 3.5) for the large-budget limit.
"""

import math

import numpy as np
import pytest
import sympy

from replay_theory.theory.design import (
    DesignQuery,
    classify_regime,
    compute_to_target,
    describe_regime,
    eta_star,
    eta_star_numeric,
    eta_star_unconstrained,
    finite_budget_bound,
    finite_budget_design,
    objective_j,
    optimal_design,
    paper_objective,
    power_law_optimum,
)
from replay_theory.theory.profiles import PowerLawProfile, TabulatedProfile, sigma_bar_sq
from replay_theory.theory.symbolic import derive

POWER = PowerLawProfile(0.25)
FLOORED = PowerLawProfile(0.3, tau=2.0, floor=1.0)


def test_eta_star_closed_form_matches_bisection_over_twenty_decades():
    rng = np.random.default_rng(0)
    A = 10 ** rng.uniform(-12, 6, 20000)
    b1 = 10 ** rng.uniform(-6, 6, 20000)
    b2 = 10 ** rng.uniform(-8, 8, 20000)
    b2[:200] = 0.0  # kappa = 0: eta* = sqrt(A/b1)
    closed = eta_star_unconstrained(A, b1, b2)
    np.testing.assert_allclose(closed, eta_star_numeric(A, b1, b2), rtol=1e-12)
    np.testing.assert_allclose(closed[:200], np.sqrt(A[:200] / b1[:200]), rtol=1e-14)
    residual = np.abs(2 * b2 * closed**3 + b1 * closed**2 - A) / A
    assert residual.max() < 1e-12
    # the two branch limits: beta -> 0 gives sqrt(A/b1), beta -> inf gives (A/(2 b2))^(1/3)
    assert eta_star(1.0, 1.0, 1e-14) == pytest.approx(1.0, rel=1e-13)
    assert eta_star(1.0, 1e-6, 1e6) == pytest.approx((1 / 2e6) ** (1 / 3), rel=1e-5)


def test_eta_star_against_sympy_roots_and_series():
    d = derive("finite-budget")
    sym = d.symbols
    rng = np.random.default_rng(3)
    for _ in range(12):
        A, b1, b2 = (float(v) for v in 10 ** rng.uniform(-3, 3, 3))
        poly = sympy.Poly(d.parts["cubic"].subs({sym["A"]: A, sym["b1"]: b1, sym["b2"]: b2}), sym["eta"])
        positive = [complex(r).real for r in poly.nroots(n=30) if abs(complex(r).imag) < 1e-20 and complex(r).real > 0]
        assert len(positive) == 1  # Descartes: one sign change
        assert float(eta_star_unconstrained(A, b1, b2)) == pytest.approx(positive[0], rel=1e-12)
        beta = b2 * math.sqrt(A) / b1**1.5
        if 3 * math.sqrt(3) * beta <= 1:  # the trigonometric root, evaluated by sympy
            w = float(d.parts["w_root"].subs(sym["beta"], beta).evalf(30))
            assert math.sqrt(A / b1) / w == pytest.approx(positive[0], rel=1e-12)
    series = sympy.Poly(d.parts["w_series"], sym["beta"]).all_coeffs()[::-1]
    assert series == [1, 1, sympy.Rational(-3, 2), 4]
    assert d.parts["beta_limit"] == 0
    F0, L, S, c, s = (sym[k] for k in ("F0", "L", "S", "c", "s"))
    assert sympy.simplify(d.parts["large_budget_limit"] - 8 * sympy.sqrt(6) * sympy.sqrt(F0 * L * S * c * s)) == 0
    assert sympy.simplify(d.parts["step_limit"] - 12 * F0 * c / sym["eta_max"]) == 0


def test_finite_budget_bound_hand_values():
    # kappa = 0, uncapped: eta* = sqrt(A/b1), value 2 sqrt(A b1); sigmabar^2(2) = sqrt(2)/1.5
    N, R, B, mu, C, L, F0, rho = 20.0, 10.0, 30.0, 5.0, 80000.0, 1.0, 2.0, 0.1
    s = math.sqrt(2) / 1.5
    S = 1 / B + 1 / N + rho / R
    c = mu * R + B
    A, b1 = 12 * F0 * c / C, 8 * L * s * S
    r = finite_budget_bound(N, R, B, budget=C, mu=mu, profile=POWER, rho=rho, smoothness=L, bias=0.0, f0=F0)
    assert r.updates == pytest.approx(C / c, rel=1e-15)
    assert r.eta == pytest.approx(math.sqrt(A / b1), rel=1e-13) and r.eta < 1 / (2 * L)
    assert r.value == pytest.approx(2 * math.sqrt(A * b1), rel=1e-13)
    assert not r.terms["step_limited"]
    # small budget: eta* exceeds the proof's cap 1/(2L) (and the bias cap 1/(2 sqrt2 kappa x)), which binds
    small = finite_budget_bound(N, R, B, budget=200.0, mu=mu, profile=POWER, rho=rho, smoothness=L, bias=0.2, f0=F0)
    cap = min(1 / (2 * L), 1 / (2 * math.sqrt(2) * 0.2 * 2.0))
    A_small = 12 * F0 * c / 200.0
    b2 = 32 * 0.2**2 * 2.0**2 * s * S
    assert small.terms["step_limited"] and small.eta == cap == small.terms["eta_max"]
    assert small.value == pytest.approx(A_small / cap + b1 * cap + b2 * cap**2, rel=1e-14)
    assert small.terms["optimization"] == pytest.approx(A_small / cap, rel=1e-14)
    # sec3 convention: c = R + mu B
    sec3 = finite_budget_bound(N, R, B, budget=C, mu=mu, profile=POWER, rho=rho, smoothness=L, bias=0.0, f0=F0,
                               convention="paper-sec3")
    assert sec3.updates == pytest.approx(C / (R + mu * B), rel=1e-15)
    # less than one update: infeasible, never chosen
    assert math.isinf(finite_budget_bound(N, R, B, budget=50.0, mu=mu, profile=POWER, rho=rho, smoothness=L,
                                          bias=0.0, f0=F0).value)
    # vectorised: arrays broadcast and agree with scalar calls
    arr = finite_budget_bound(np.array([20.0, 40.0]), 10.0, np.array([[30.0], [60.0]]), budget=C, mu=mu,
                              profile=POWER, rho=rho, smoothness=L, bias=0.1, f0=F0)
    one = finite_budget_bound(40.0, 10.0, 60.0, budget=C, mu=mu, profile=POWER, rho=rho, smoothness=L, bias=0.1,
                              f0=F0)
    assert arr.value.shape == (2, 2) and arr.value[1, 1] == pytest.approx(one.value, rel=1e-14)


def _brute_force(budget, B_fixed=None, R_fixed=None, x_max=12, y_range=(0.25, 8.0), mu=2.0, rho=0.05, L=2.0,
                 kappa=0.3, F0=3.0):
    """Every integer design and 3000 log-spaced step sizes plus each design's cap: the Thm 3.4 bound by hand."""
    Ns, Rs, Bs = [], [], []
    if B_fixed is not None:
        pairs = [(R, B_fixed) for R in range(1, 10_000) if y_range[0] <= B_fixed / R <= y_range[1]]
    else:
        pairs = [(R_fixed, B) for B in range(1, 10_000) if y_range[0] <= B / R_fixed <= y_range[1]]
    for R, B in pairs:
        for N in range(R, x_max * R + 1):
            Ns.append(N), Rs.append(R), Bs.append(B)
    N, R, B = (np.asarray(v, dtype=float) for v in (Ns, Rs, Bs))
    x = N / R
    T = budget / (mu * R + B)
    sS = sigma_bar_sq(FLOORED, x) * (1 / B + 1 / N + rho / R)
    eta_max = np.minimum(1 / (2 * L), 1 / (2 * math.sqrt(2) * kappa * x))
    etas = np.concatenate([np.broadcast_to(np.geomspace(1e-6, 1, 3000), (x.size, 3000)), eta_max[:, None]], axis=1)
    V = 12 * F0 / (etas * T[:, None]) + 8 * etas * (4 * x[:, None] ** 2 * kappa**2 * etas + L) * sS[:, None]
    V = np.where((etas <= eta_max[:, None]) & (T[:, None] >= 1), V, np.inf)
    best = V.min(axis=1)
    k = int(np.argmin(best))
    return best[k], (int(N[k]), int(R[k]), int(B[k]))


@pytest.mark.parametrize("budget", [300.0, 3e3, 3e4, 3e6])
def test_design_matches_brute_force_with_batch_fixed(budget):
    kw = dict(mu=2.0, profile=FLOORED, rho=0.05, smoothness=2.0, bias=0.3, f0=3.0)
    d = finite_budget_design(budget=budget, batch_size=8, x_max=12, min_replay_ratio=0.25, max_replay_ratio=8,
                             **kw)
    brute, design = _brute_force(budget, B_fixed=8)
    assert d.bound <= brute * (1 + 1e-12)  # the closed form is at least as good as a 3000-point eta grid
    assert d.bound == pytest.approx(brute, rel=1e-4)
    exact_at_brute = finite_budget_bound(*design, budget=budget, **kw).value
    assert d.bound <= exact_at_brute * (1 + 1e-12)  # and no integer design beats it
    assert (d.capacity, d.rollouts_per_step, d.batch_size) == design


@pytest.mark.parametrize("budget", [200.0, 2e4, 2e6])
def test_design_matches_brute_force_with_rollouts_fixed(budget):
    kw = dict(mu=2.0, profile=FLOORED, rho=0.05, smoothness=2.0, bias=0.3, f0=3.0)
    d = finite_budget_design(budget=budget, rollouts_per_step=4, x_max=12, min_replay_ratio=0.25,
                             max_replay_ratio=8, **kw)
    brute, design = _brute_force(budget, R_fixed=4)
    assert d.bound <= brute * (1 + 1e-12) and d.bound == pytest.approx(brute, rel=1e-4)
    assert (d.capacity, d.rollouts_per_step, d.batch_size) == design


def test_paper_objective_is_j_in_both_conventions():
    x, y = np.array([1.5, 3.0, 10.0]), np.array([0.5, 2.0, 7.0])
    s = sigma_bar_sq(FLOORED, x)
    roll = paper_objective(x, y, mu=5.28, profile=FLOORED, rho=0.1)
    np.testing.assert_allclose(roll, s * (5.28 + y) * (1 / y + 1 / x + 0.1), rtol=1e-15)
    np.testing.assert_allclose(roll, 5.28 * objective_j(x, y, 1 / 5.28, 0.1, s), rtol=1e-14)  # ERRATA E3
    sec3 = paper_objective(x, y, mu=5.28, profile=FLOORED, rho=0.1, convention="paper-sec3")
    np.testing.assert_allclose(sec3, objective_j(x, y, 5.28, 0.1, s), rtol=1e-15)


def test_large_budget_limit_is_the_papers_j_argmin():
    kw = dict(mu=5.28, profile=POWER, rho=0.1, smoothness=1.0, bias=0.1, f0=1.0)
    d = finite_budget_design(budget=1e13, batch_size=256, x_max=20, min_replay_ratio=1.0, max_replay_ratio=256,
                             **kw)
    assert d.budget_regime == "noise-limited" and d.regime == "replay"
    # exhaustive integer argmin of J over the same designs (B = 256, R = 1..256, N = R..20R)
    R = np.repeat(np.arange(1, 257), [19 * r + 1 for r in range(1, 257)]).astype(float)
    N = np.concatenate([np.arange(r, 20 * r + 1) for r in range(1, 257)]).astype(float)
    J = paper_objective(N / R, 256 / R, mu=5.28, profile=POWER, rho=0.1)
    k = int(np.argmin(J))
    assert (d.capacity, d.rollouts_per_step) == (int(N[k]), int(R[k]))
    limit = d.large_budget_limit
    assert (limit["capacity"], limit["rollouts_per_step"], limit["batch_size"]) == (int(N[k]), int(R[k]), 256)
    x_star, y_star = power_law_optimum(1 / 5.28, 0.25, 0.1)  # the continuous Thm 3.5 optimum
    assert d.x_star == pytest.approx(x_star, rel=0.01) and d.y_star == pytest.approx(y_star, rel=0.01)


def test_step_limited_budget_favours_more_updates_per_compute():
    kw = dict(mu=5.28, profile=POWER, rho=0.1, smoothness=1.0, bias=0.1, f0=1.0, batch_size=256)
    designs = [finite_budget_design(budget=C, **kw) for C in (1e4, 1e5, 1e6, 1e8, 1e11)]
    assert [d.budget_regime for d in designs] == ["step-limited"] * 2 + ["noise-limited"] * 3
    j = designs[0].large_budget_limit
    small = designs[0]
    assert small.updates > j["updates_at_budget"] * 1.5  # cheaper updates: R = 14 instead of R = 80 at B = 256
    assert small.y_star > 5 * j["y"] and small.bound < j["bound_at_budget"] / 1.5
    ys = [d.y_star for d in designs]
    assert ys[0] > ys[1] > j["y"]  # step-limited: more replay, the less compute there is
    assert designs[-1].y_star == pytest.approx(j["y"], rel=1e-12)  # noise-limited: J's design


def test_compute_to_target_is_the_dual_of_the_budget_bound():
    kw = dict(mu=5.28, profile=FLOORED, rho=0.1, smoothness=1.0, bias=0.5, f0=2.0)
    N, R, B = np.array([100.0, 300.0, 40.0]), np.array([50.0, 30.0, 40.0]), np.array([200.0, 120.0, 40.0])
    for target in (5.0, 0.5, 1e-3):  # step-limited and noise-limited
        C = compute_to_target(N, R, B, target=target, **kw)
        np.testing.assert_allclose(finite_budget_bound(N, R, B, budget=C, **kw).value, target, rtol=1e-9)
    # kappa = 0: C = 384 F0 L c s S / eps^2 when uncapped (derivation compute-to-target)
    c = 5.28 * 50 + 200
    sS = float(sigma_bar_sq(FLOORED, 2.0)) * (1 / 200 + 1 / 100 + 0.1 / 50)
    C0 = compute_to_target(100, 50, 200, target=1e-3, **{**kw, "bias": 0.0})
    assert C0 == pytest.approx(384 * 2.0 * 1.0 * c * sS / 1e-6, rel=1e-3)


def test_regime_labels_never_call_gamma_above_one_replay():
    assert classify_regime(3.0, 2.0) == "replay"
    assert classify_regime(3.0, 0.5) == "over-generation"
    assert classify_regime(1.0, 1.0) == "on-policy"
    assert classify_regime(4.0, 1.0) == "stale-buffer"
    assert classify_regime(4.0, 2.0, unbounded=True) == "unbounded"
    text, advice = describe_regime("over-generation", x=2.0, y=0.5, mu_rollout=2.0)
    assert text.startswith("not replay: more generation than training can absorb")
    assert "gamma = 1.67 > 1" in text and "raise B to R" in advice  # (1 + 2/0.5)/(1 + 2)
    # the J answer: cheap rollouts and a flat profile gave y* < 1, once printed as "replay"
    d = optimal_design(DesignQuery(mu=0.2, alpha=0.1, rho=0.0))
    assert (d.x_star, d.y_star) == pytest.approx((3.2, 0.8), rel=1e-12)
    assert d.regime == "over-generation" and d.compute_ratio == pytest.approx((1 + 0.2 / 0.8) / 1.2, rel=1e-14)
    assert d.compute_ratio > 1 and d.regime_text.startswith("not replay")
    # the finite-budget answer at mu = 0.5
    f = finite_budget_design(budget=1e9, mu=0.5, profile=POWER, rho=0.1, smoothness=1.0, bias=0.1, f0=1.0,
                             batch_size=256)
    assert f.regime == "over-generation" and f.y_star < 1 and f.compute_ratio > 1
    # the clamp to the on-policy corner is reported, with the y the bound would pick at x = 1
    cheap = optimal_design(DesignQuery(mu=0.5))
    assert cheap.regime == "on-policy" and cheap.constraint.startswith("x* = 0.438 < 1 would mean N < R")
    assert "would pick y = 0.674" in cheap.constraint  # sqrt(mu / (rho + 1)) = sqrt(0.5 / 1.1)


def test_unbounded_when_the_bound_still_falls_at_the_last_measured_staleness():
    flat = TabulatedProfile((0.0, 30.0), (1.0, 1.0))
    d = finite_budget_design(budget=1e9, mu=5.28, profile=flat, rho=0.0, smoothness=1.0, bias=0.0, f0=1.0,
                             batch_size=64)
    assert d.regime == "unbounded" and d.x_star == pytest.approx(30.0, abs=1 / d.rollouts_per_step)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(budget=0.0), r"^budget must be a finite number > 0"),
        (dict(smoothness=-1.0), r"^smoothness must be a finite number > 0"),
        (dict(bias=math.nan), r"^bias must be a finite number"),
        (dict(f0=0.0), r"^f0 must be a finite number > 0"),
        (dict(batch_size=None), r"^a finite budget needs exactly one of batch-size and rollouts-per-step"),
        (dict(rollouts_per_step=4), r"^a finite budget needs exactly one of"),
        (dict(batch_size=0), r"^batch-size must be an integer >= 1"),
        (dict(budget=10.0), r"^budget must be >= 69.28, the cost of one update of the cheapest design"),
    ],
)
def test_bad_finite_budget_inputs(kwargs, message):
    base = dict(budget=1e6, mu=5.28, profile=POWER, rho=0.1, smoothness=1.0, bias=0.1, f0=1.0, batch_size=64)
    with pytest.raises(ValueError, match=message):
        finite_budget_design(**{**base, **kwargs})

"""sympy derivations (theory/symbolic.py) against the numeric modules (design, profiles, divergences, bounds).

Each derived result is lambdified and compared with the numpy implementation on a
grid of (mu, alpha, rho, x). mu is the Sec. 3 parameter (update cost / rollout
cost) unless a test says otherwise.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import sympy

from replay_theory.theory import design
from replay_theory.theory.profiles import PowerLawProfile, sigma_bar_sq
from replay_theory.theory.symbolic import DERIVATIONS, TITLES, Derivation, Step, derive, render

RTOL = 1e-10

MUS = (0.05, 1 / 6.84, 1 / 5.28, 0.5, 1.0, 2.0, 5.28)
ALPHAS = (0.05, 0.2, 0.25, 0.4, 0.49)
RHOS = (0.01, 0.1, 0.5, 1.0)
XS = (0.3, 1.0, 2.5, 10.0, 1e3)


def _fn(expr: sympy.Basic, derivation: Derivation, *names: str):
    """numpy function of the named symbols of ``derivation``."""
    return sympy.lambdify([derivation.symbols[n] for n in names], expr, modules="numpy")


def _grid(*axes):
    """Columns of the Cartesian product, as float arrays."""
    return [np.array(col, dtype=float) for col in zip(*itertools.product(*axes))]


# --------------------------------------------------------------------------- structure


@pytest.mark.parametrize("name", list(DERIVATIONS))
def test_every_derivation_builds_and_renders(name):
    d = derive(name)
    assert isinstance(d, Derivation) and d.name == name
    assert d.title and d.source and len(d.steps) >= 3
    assert TITLES[name] == d.title  # what `derive` with no name lists
    assert isinstance(d.result, sympy.Basic)
    for step in d.steps:
        assert isinstance(step, Step) and isinstance(step.expr, sympy.Basic)
        assert step.description and "\n" not in step.description
    assert derive(name) is d  # cached

    text = render(d)
    assert text.startswith(f"{name}: {d.title}")
    assert f"{len(d.steps)}. " in text and "Result:" in text
    tex = render(d, latex=True)
    assert "\\begin{enumerate}" in tex and tex.count("\\item") == len(d.steps)
    assert sympy.latex(d.result) in tex


def test_unknown_derivation_lists_the_choices():
    with pytest.raises(ValueError, match=r"unknown derivation 'nope'; choose one of: y-star, reduction, "):
        derive("nope")


IDENTITY_PHRASES = ("simplifies to 0", "simplify to 0", "expands to 0", "difference is 0")


@pytest.mark.parametrize("name", list(DERIVATIONS))
def test_identity_steps_reduce_to_zero(name):
    """Every step that claims an identity shows an equation whose right side sympy reduced to 0."""
    checked = 0
    for step in derive(name).steps:
        if any(phrase in step.description for phrase in IDENTITY_PHRASES):
            eqs = [e for e in sympy.preorder_traversal(step.expr) if isinstance(e, sympy.Equality)]
            assert eqs, step.description
            for eq in eqs:
                assert eq.rhs == 0, (step.description, eq)
                checked += 1
    if name not in ("eta-star", "thm51-chain"):
        assert checked >= 1


# --------------------------------------------------------------------------- y-star and reduction


def test_y_star_matches_y_star_given_x():
    d = derive("y-star")
    mu, rho, x = _grid(MUS, RHOS, XS)
    got = _fn(d.result.rhs, d, "mu", "rho", "x")(mu, rho, x)
    want = np.array([design.y_star_given_x(xi, mi, ri) for mi, ri, xi in zip(mu, rho, x)])
    np.testing.assert_allclose(got, want, rtol=RTOL)
    # it is the minimiser: J at y* is below J at y* (1 +- 1e-3)
    J = _fn(d.parts["J"], d, "s", "mu", "rho", "x", "y")
    for factor in (0.999, 1.001):
        assert np.all(J(1.0, mu, rho, x, got) < J(1.0, mu, rho, x, got * factor))
    assert np.all(_fn(d.parts["d2J_dy2"], d, "s", "y")(2.0, got) > 0)


def test_reduction_matches_reduced_objective_and_objective_j():
    d = derive("reduction")
    s, mu, rho, x = _grid((0.5, 3.0), MUS, RHOS, XS)
    for expr in (d.result.rhs, d.parts["J_at_y_star"], d.parts["simplified"]):
        got = _fn(expr, d, "s", "mu", "rho", "x")(s, mu, rho, x)
        want_i = np.array([design.reduced_objective(xi, mi, ri, si) for si, mi, ri, xi in zip(s, mu, rho, x)])
        want_j = np.array([
            design.objective_j(xi, design.y_star_given_x(xi, mi, ri), mi, ri, si)
            for si, mi, ri, xi in zip(s, mu, rho, x)
        ])
        np.testing.assert_allclose(got, want_i, rtol=RTOL)
        np.testing.assert_allclose(got, want_j, rtol=RTOL)


# --------------------------------------------------------------------------- power law


def test_quadratic_coefficients_equal_the_printed_ones():
    d = derive("power-law-quadratic")
    a, mu, rho = (d.symbols[k] for k in ("alpha", "mu", "rho"))
    A_printed = 4 * a**2 * rho * (mu - rho)
    B_printed = 4 * a * (a * mu + rho * (1 - 2 * a))
    C_printed = (1 - 2 * a) ** 2
    assert sympy.simplify(d.parts["A"] - A_printed) == 0
    assert sympy.simplify(d.parts["B"] - B_printed) == 0
    assert sympy.simplify(d.parts["C"] - C_printed) == 0
    disc_printed = 16 * a**2 * mu * (a**2 * mu + rho * (1 - 2 * a))
    assert sympy.simplify(d.parts["discriminant"] - disc_printed) == 0
    # ERRATA: the printed "Delta = B^2 - 4AC" is not the discriminant of A x^2 + B x - C with C = (1 - 2a)^2.
    assert sympy.simplify(B_printed**2 + 4 * A_printed * C_printed - disc_printed) == 0
    assert sympy.simplify(B_printed**2 - 4 * A_printed * C_printed - disc_printed) != 0
    # the '+' root is the printed x*
    assert sympy.simplify(d.parts["x_plus"] - d.parts["printed_x"]) == 0
    # the rearranged first-order condition
    x = d.symbols["x"]
    assert sympy.expand(d.parts["foc_rhs"] - (1 - 2 * a - 2 * a * rho * x)) == 0


def test_power_law_k_and_sigma_bar_match_numeric():
    d = derive("power-law-quadratic")
    mu, alpha, rho, x = _grid(MUS, ALPHAS + (0.0, 0.75), RHOS, XS)
    K = _fn(d.parts["K"], d, "x", "mu", "rho", "alpha")(x, mu, rho, alpha)
    want = np.array([design.power_law_k(xi, mi, ai, ri) for mi, ai, ri, xi in zip(mu, alpha, rho, x)])
    np.testing.assert_allclose(K, want, rtol=RTOL)

    tau = 3.0
    sbar = _fn(d.parts["sigma_bar_sq"], d, "x", "tau", "alpha")
    I_fn = _fn(d.parts["I"], d, "x", "tau", "alpha", "mu", "rho")
    for mi, ai, ri, xi in zip(mu[::7], alpha[::7], rho[::7], x[::7]):
        profile = PowerLawProfile(alpha=ai, tau=tau)
        s_num = float(sigma_bar_sq(profile, xi, "integral"))
        np.testing.assert_allclose(sbar(xi, tau, ai), s_num, rtol=RTOL)
        np.testing.assert_allclose(I_fn(xi, tau, ai, mi, ri), design.reduced_objective(xi, mi, ri, s_num), rtol=RTOL)


def test_first_order_condition_vanishes_at_power_law_optimum():
    d = derive("power-law-quadratic")
    foc = _fn(d.parts["foc_scaled"], d, "x", "mu", "rho", "alpha")
    dK = _fn(d.parts["dK"], d, "x", "mu", "rho", "alpha")
    for mu, alpha, rho in itertools.product(MUS, ALPHAS, RHOS):
        x_star, _ = design.power_law_optimum(mu, alpha, rho)
        assert abs(foc(x_star, mu, rho, alpha)) < 1e-12
        assert dK(0.9 * x_star, mu, rho, alpha) < 0 < dK(1.1 * x_star, mu, rho, alpha)  # a minimum


def test_power_law_roots_match_power_law_optimum():
    d = derive("power-law-roots")
    mu, alpha, rho = _grid(MUS, ALPHAS, RHOS)
    x_fn = _fn(d.result[0].rhs, d, "mu", "rho", "alpha")
    y_fn = _fn(d.result[1].rhs, d, "mu", "rho", "alpha")
    x_of_y = _fn(d.parts["x_of_y"], d, "y", "rho", "alpha")
    x_foc = _fn(d.parts["x_from_foc"], d, "y", "mu", "alpha")
    got_x, got_y = x_fn(mu, rho, alpha), y_fn(mu, rho, alpha)
    want = np.array([design.power_law_optimum(m, a, r) for m, a, r in zip(mu, alpha, rho)])  # (G, 2)
    np.testing.assert_allclose(got_x, want[:, 0], rtol=RTOL)
    np.testing.assert_allclose(got_y, want[:, 1], rtol=RTOL)
    np.testing.assert_allclose(x_of_y(got_y, rho, alpha), want[:, 0], rtol=RTOL)
    np.testing.assert_allclose(x_foc(got_y, mu, alpha), want[:, 0], rtol=RTOL)
    # y* is y*(x) at x*
    np.testing.assert_allclose([design.y_star_given_x(xs, m, r) for xs, m, r in zip(got_x, mu, rho)], got_y,
                               rtol=RTOL)


def test_printed_formulas_exact_arithmetic_equal_the_stable_forms():
    """The printed x*, y* are right where defined: evaluated exactly they equal power_law_optimum."""
    d = derive("power-law-roots")
    mu_s, rho_s, a_s = (d.symbols[k] for k in ("mu", "rho", "alpha"))
    for mu, alpha, rho in [("5.28", "0.25", "0.1"), ("0.19", "0.4", "0.5"), ("0.05", "0.05", "1"),
                           ("2", "0.49", "0.01"), ("0.5", "0.2", "0.49")]:
        values = {mu_s: sympy.Rational(mu), rho_s: sympy.Rational(rho), a_s: sympy.Rational(alpha)}
        x_exact = float(d.parts["printed_x"].subs(values).evalf(40))
        y_exact = float(d.parts["printed_y"].subs(values).evalf(40))
        x_star, y_star = design.power_law_optimum(float(mu), float(alpha), float(rho))
        np.testing.assert_allclose(x_exact, x_star, rtol=RTOL)
        np.testing.assert_allclose(y_exact, y_star, rtol=RTOL)


def test_printed_formulas_in_floats_where_well_conditioned():
    d = derive("power-law-roots")
    px = _fn(d.parts["printed_x"], d, "mu", "rho", "alpha")
    py = _fn(d.parts["printed_y"], d, "mu", "rho", "alpha")
    for mu, alpha, rho in itertools.product((0.5, 2.0, 5.28), (0.1, 0.25, 0.4), (0.05, 0.1)):
        x_star, y_star = design.power_law_optimum(mu, alpha, rho)
        np.testing.assert_allclose(design.printed_power_law_x_star(mu, alpha, rho), px(mu, rho, alpha), rtol=RTOL)
        np.testing.assert_allclose(design.printed_power_law_y_star(mu, alpha, rho), py(mu, rho, alpha), rtol=RTOL)
        np.testing.assert_allclose(design.printed_power_law_x_star(mu, alpha, rho), x_star, rtol=1e-8)
        np.testing.assert_allclose(design.printed_power_law_y_star(mu, alpha, rho), y_star, rtol=1e-8)


def test_printed_x_star_loses_digits_near_mu_equal_rho():
    """Removable 0/0 at mu = rho: in floats the printed form cancels catastrophically next to it."""
    errors = []
    for alpha, rho in itertools.product((0.1, 0.25, 0.4), (0.1, 0.3, 0.7)):
        mu = rho * (1 + 1e-11)
        x_star, _ = design.power_law_optimum(mu, alpha, rho)
        errors.append(abs(design.printed_power_law_x_star(mu, alpha, rho) / x_star - 1))
    assert max(errors) > 1e-6


def test_rho_zero_limits():
    d = derive("power-law-roots")
    a, mu = d.symbols["alpha"], d.symbols["mu"]
    assert sympy.simplify(d.parts["x_rho0"] - (1 - 2 * a) ** 2 / (4 * a**2 * mu)) == 0
    assert sympy.simplify(d.parts["y_rho0"] - (1 - 2 * a) / (2 * a * mu)) == 0
    x0 = _fn(d.parts["x_rho0"], d, "mu", "alpha")
    y0 = _fn(d.parts["y_rho0"], d, "mu", "alpha")
    for mu_v, alpha in itertools.product(MUS, ALPHAS):
        x_star, y_star = design.power_law_optimum(mu_v, alpha, 0.0)
        np.testing.assert_allclose(x0(mu_v, alpha), x_star, rtol=RTOL)
        np.testing.assert_allclose(y0(mu_v, alpha), y_star, rtol=RTOL)
        with pytest.raises(ZeroDivisionError):  # the printed forms are 0/0 there
            design.printed_power_law_x_star(mu_v, alpha, 0.0)
        with pytest.raises(ZeroDivisionError):
            design.printed_power_law_y_star(mu_v, alpha, 0.0)


def test_mu_equal_rho_limit():
    d = derive("power-law-roots")
    a, rho = d.symbols["alpha"], d.symbols["rho"]
    assert sympy.simplify(d.parts["x_mu_eq_rho"] - (1 - 2 * a) ** 2 / (4 * a * (1 - a) * rho)) == 0
    assert d.parts["numerator_mu_eq_rho"] == 0
    assert sympy.simplify(d.parts["stable_x_mu_eq_rho"] - d.parts["x_mu_eq_rho"]) == 0
    x_lim = _fn(d.parts["x_mu_eq_rho"], d, "rho", "alpha")
    for rho_v, alpha in itertools.product(RHOS, ALPHAS):
        x_star, _ = design.power_law_optimum(rho_v, alpha, rho_v)
        np.testing.assert_allclose(x_lim(rho_v, alpha), x_star, rtol=RTOL)
        with pytest.raises(ZeroDivisionError):
            design.printed_power_law_x_star(rho_v, alpha, rho_v)


# --------------------------------------------------------------------------- spurious root


def test_spurious_root_for_alpha_above_half():
    d = derive("spurious-root")
    mu, alpha, rho = 2.0, 0.75, 0.5
    root = design.printed_power_law_x_star(mu, alpha, rho)
    assert root > 0
    np.testing.assert_allclose(root, float(d.parts["x_plus"]), rtol=RTOL)
    np.testing.assert_allclose(root, (4 * math.sqrt(7) - 10) / 9, rtol=RTOL)
    k = lambda x: float(design.power_law_k(x, mu, alpha, rho))  # noqa: E731
    assert k(root * 1.01) > k(root) > k(root * 0.99)  # increasing through the "optimum": not a minimum
    assert design.power_law_optimum(mu, alpha, rho) == (0.0, 0.0)
    assert float(d.parts["lhs_at_root"]) > 0 > float(d.parts["rhs_at_root"])
    assert float(d.parts["dK_at_root"]) > 0
    # the printed y* there is negative
    y_printed = design.printed_power_law_y_star(mu, alpha, rho)
    np.testing.assert_allclose(y_printed, float(d.parts["printed_y_at_instance"]), rtol=RTOL)
    assert y_printed < 0


def test_infimum_on_the_border_for_alpha_above_half():
    """App. C.3.1 argues a minimiser exists because J -> oo on the border; for alpha > 1/2, K -> 0 as x -> 0+."""
    d = derive("spurious-root")
    assert d.parts["K_limit_at_0"] == 0 and d.parts["K_limit_at_0_alpha_half"] == 1
    ks = design.power_law_k(np.geomspace(1e-12, 1e-2, 6), 2.0, 0.75, 0.5)
    assert np.all(np.diff(ks) > 0) and ks[0] < 1e-2


def test_squared_quadratic_has_two_positive_roots_when_mu_below_rho():
    """alpha < 1/2, mu < rho: the printed root is the genuine optimum, the other positive root is spurious."""
    d = derive("spurious-root")
    quad = derive("power-law-quadratic")
    mu, alpha, rho = 0.2, 0.4, 0.5
    genuine = float(d.parts["genuine_root_mu_below_rho"])
    other = float(d.parts["other_root_mu_below_rho"])
    assert 0 < genuine < other
    np.testing.assert_allclose(genuine, design.power_law_optimum(mu, alpha, rho)[0], rtol=RTOL)
    np.testing.assert_allclose(genuine, design.printed_power_law_x_star(mu, alpha, rho), rtol=1e-12)
    rhs_genuine, rhs_other = (float(v) for v in d.parts["rhs_at_roots_mu_below_rho"])
    assert rhs_genuine > 0 > rhs_other
    dK = _fn(quad.parts["dK"], quad, "x", "mu", "rho", "alpha")
    assert abs(dK(genuine, mu, rho, alpha)) < 1e-12 and dK(other, mu, rho, alpha) > 0.01


def test_k_increasing_for_alpha_at_least_half():
    d = derive("spurious-root")
    scaled = _fn(d.parts["scaled_dK"], d, "x", "mu", "rho", "alpha")
    xs = np.geomspace(1e-4, 1e4, 200)
    for mu, alpha, rho in itertools.product(MUS, (0.5, 0.75, 1.0), RHOS):
        assert np.all(scaled(xs, mu, rho, alpha) > 0)
        assert np.all(np.diff(design.power_law_k(xs, mu, alpha, rho)) > 0)
        assert design.power_law_optimum(mu, alpha, rho) == (0.0, 0.0)


# --------------------------------------------------------------------------- mu conventions


def test_mu_conventions_match_mu_sec3_of():
    d = derive("mu-conventions")
    mu, rho, x = _grid((1.5, 5.28, 6.84), RHOS, XS)
    y_roll = _fn(d.result.rhs, d, "mu", "rho", "x")(mu, rho, x)
    want = np.array([
        design.y_star_given_x(xi, design.mu_sec3_of(mi, "rollout-cost"), ri) for mi, ri, xi in zip(mu, rho, x)
    ])
    np.testing.assert_allclose(y_roll, want, rtol=RTOL)
    assert design.mu_sec3_of(5.28, "paper-sec3") == 5.28
    # J_rollout(x, y; mu) = mu J_sec3(x, y; 1/mu)
    J_roll = _fn(d.parts["J_rollout"], d, "s", "mu", "rho", "x", "y")
    y = 0.7 * y_roll
    np.testing.assert_allclose(J_roll(2.0, mu, rho, x, y),
                               mu * design.objective_j(x, y, 1 / mu, rho, 2.0), rtol=RTOL)


def test_mu_derivatives_have_opposite_signs():
    d = derive("mu-conventions")
    mu, rho, x = _grid((0.2, 1.0, 5.28), RHOS, XS)
    dy_sec3 = _fn(d.parts["dy_dmu_sec3"], d, "mu", "rho", "x")(mu, rho, x)
    dy_roll = _fn(d.parts["dy_dmu_rollout"], d, "mu", "rho", "x")(mu, rho, x)
    assert np.all(dy_sec3 < 0) and np.all(dy_roll > 0)
    h = 1e-6
    for convention, deriv in (("paper-sec3", dy_sec3), ("rollout-cost", dy_roll)):
        fd = np.array([
            (design.y_star_given_x(xi, design.mu_sec3_of(mi + h, convention), ri)
             - design.y_star_given_x(xi, design.mu_sec3_of(mi - h, convention), ri)) / (2 * h)
            for mi, ri, xi in zip(mu, rho, x)
        ])
        np.testing.assert_allclose(fd, deriv, rtol=1e-6)


def test_power_law_optimum_moves_with_mu_in_opposite_directions():
    d = derive("mu-conventions")
    dy = _fn(d.parts["dy_dmu_power_law"], d, "mu", "rho", "alpha", "y")
    mus = np.array([1.0, 2.0, 4.0, 5.28, 6.84, 10.0])
    for alpha, rho in itertools.product((0.1, 0.25, 0.4), (0.01, 0.1, 0.5)):
        for convention, sign in (("rollout-cost", 1), ("paper-sec3", -1)):
            opt = np.array([design.power_law_optimum(design.mu_sec3_of(m, convention), alpha, rho) for m in mus])
            assert np.all(sign * np.diff(opt, axis=0) > 0)  # x*, y* both move with the same sign
        # implicit derivative dy*/dmu_sec3 against a finite difference
        m, h = 0.5, 1e-6
        y = design.power_law_optimum(m, alpha, rho)[1]
        fd = (design.power_law_optimum(m + h, alpha, rho)[1] - design.power_law_optimum(m - h, alpha, rho)[1]) / (2 * h)
        np.testing.assert_allclose(dy(m, rho, alpha, y), fd, rtol=1e-6)


# --------------------------------------------------------------------------- eta-star


def test_eta_star_numeric_minimum_is_twice_the_printed_value():
    from scipy.optimize import minimize_scalar

    d = derive("eta-star")
    F0, c, C, L, s, S = 2.0, 30.0, 1e4, 0.7, 1.3, 0.05
    a, b = 12 * F0 * c / C, 8 * L * s * S
    res = minimize_scalar(lambda eta: a / eta + b * eta, bounds=(1e-6, 1e3), method="bounded",
                          options={"xatol": 1e-12})
    np.testing.assert_allclose(res.fun, 2 * math.sqrt(a * b), rtol=1e-9)
    np.testing.assert_allclose(res.x, float(d.parts["eta_star"].subs({d.symbols["a"]: a, d.symbols["b"]: b})),
                               rtol=1e-5)
    derived = _fn(d.result.rhs, d, "F0", "c", "C", "L", "s", "S")(F0, c, C, L, s, S)
    printed = _fn(d.parts["printed"], d, "F0", "c", "C", "L", "s", "S")(F0, c, C, L, s, S)
    np.testing.assert_allclose(derived, res.fun, rtol=1e-9)
    np.testing.assert_allclose(derived, 8 * math.sqrt(6) * math.sqrt(L * F0 * c * s * S / C), rtol=RTOL)
    assert not np.isclose(printed, res.fun, rtol=1e-3)  # ERRATA: 4 sqrt(6) in App. C.3.1
    np.testing.assert_allclose(res.fun / printed, 2.0, rtol=1e-9)
    assert d.parts["ratio"] == 2


# --------------------------------------------------------------------------- divergences


def _categorical_pairs(n: int, k: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(k), size=n)  # (n, K)
    q = rng.dirichlet(np.ones(k), size=n)  # (n, K)
    return p, q


def test_var_r_equals_chi2_symbolic_vs_numeric():
    d = derive("var-r-chi2")
    assert d.parts["mean_r"] == 1
    p, q = _categorical_pairs(50)
    chi2_sym = _fn(d.result.rhs, d, "p1", "p2", "p3", "q1", "q2", "q3")(*p.T, *q.T)  # (n,)
    r = p / q
    var_r = (q * r**2).sum(-1) - (q * r).sum(-1) ** 2
    np.testing.assert_allclose(chi2_sym, var_r, rtol=RTOL)
    np.testing.assert_allclose(chi2_sym, (q * (r - 1) ** 2).sum(-1), rtol=RTOL)
    var_fn = _fn(d.parts["var_r"], d, "p1", "p2", "q1", "q2")
    np.testing.assert_allclose(var_fn(p[:, 0], p[:, 1], q[:, 0], q[:, 1]), var_r, rtol=1e-9)
    d2 = _fn(d.parts["d2"], d, "p1", "p2", "p3", "q1", "q2", "q3")(*p.T, *q.T)
    np.testing.assert_allclose(np.expm1(d2), chi2_sym, rtol=RTOL)


def test_var_r_chi2_against_divergences_module():
    divergences = pytest.importorskip("replay_theory.theory.divergences")
    d = derive("var-r-chi2")
    p, q = _categorical_pairs(50, seed=1)
    chi2_sym = _fn(d.result.rhs, d, "p1", "p2", "p3", "q1", "q2", "q3")(*p.T, *q.T)
    d2_sym = _fn(d.parts["d2"], d, "p1", "p2", "p3", "q1", "q2", "q3")(*p.T, *q.T)
    np.testing.assert_allclose(divergences.chi2_exact(np.log(p), np.log(q)), chi2_sym, rtol=RTOL)
    np.testing.assert_allclose(divergences.d2_exact(np.log(p), np.log(q)), d2_sym, rtol=RTOL)
    np.testing.assert_allclose(divergences.ess_fraction_exact(np.log(p), np.log(q)), np.exp(-d2_sym), rtol=RTOL)


def test_thm51_pointwise_chain():
    d = derive("thm51-chain")
    z = d.symbols["z"]
    zs = np.linspace(-6, 6, 2001)
    lhs = sympy.lambdify(z, d.parts["lhs"], "numpy")(zs)
    sharp = sympy.lambdify(z, d.parts["sharp"], modules=[{"Max": np.maximum}, "numpy"])(zs)
    paper = sympy.lambdify(z, d.parts["paper"], "numpy")(zs)
    assert np.all(lhs <= sharp * (1 + 1e-12)) and np.all(sharp <= paper * (1 + 1e-12))
    np.testing.assert_allclose(lhs, np.expm1(zs) ** 2, rtol=1e-9, atol=1e-300)
    # g >= 0 on z >= 0 and h >= 0 on u >= 0 (the two halves of the sharper bound)
    pos = zs[zs >= 0]
    g = sympy.lambdify(list(d.parts["g"].free_symbols), d.parts["g"], "numpy")(pos)
    h = sympy.lambdify(list(d.parts["h"].free_symbols), d.parts["h"], "numpy")(pos)
    k = sympy.lambdify(list(d.parts["k"].free_symbols), d.parts["k"], "numpy")(pos)
    assert np.all(g >= -1e-12) and np.all(h >= -1e-12) and np.all(k >= -1e-12)
    assert d.parts["ratio_limit"] == 1
    coeffs = [d.parts["series"].removeO().coeff(z, n) for n in (2, 3, 4)]
    assert coeffs == [1, 1, sympy.Rational(7, 12)]


def test_thm51_bound_on_categorical_pairs():
    p, q = _categorical_pairs(200, k=5, seed=2)
    log_r = np.log(p) - np.log(q)  # (n, K)
    chi2 = (q * np.expm1(log_r) ** 2).sum(-1)
    m2 = (q * log_r**2).sum(-1)
    R = np.exp(np.abs(log_r).max(-1))  # smallest R with 1/R <= r <= R
    sup_r = np.exp(log_r.max(-1))
    inf_r = np.exp(log_r.min(-1))
    assert np.all(chi2 <= np.maximum(1, sup_r) ** 2 * m2 * (1 + 1e-12))  # sharper
    assert np.all(np.maximum(1, sup_r) <= R)
    assert np.all(chi2 <= R**2 * m2 * (1 + 1e-12))  # Thm 5.1
    assert np.all(m2 <= np.maximum(1, 1 / inf_r) ** 2 * chi2 * (1 + 1e-12))  # converse
    divergences = pytest.importorskip("replay_theory.theory.divergences")
    bounds = pytest.importorskip("replay_theory.theory.bounds")
    np.testing.assert_allclose(divergences.chi2_exact(np.log(p), np.log(q)), chi2, rtol=1e-9)
    np.testing.assert_allclose(divergences.m2_exact(np.log(p), np.log(q)), m2, rtol=1e-9)
    assert bounds.m2po_thm51(log_r, q).ok
    assert bounds.m2po_sharp(log_r, q).ok
    assert bounds.m2_converse(log_r, q).ok
    np.testing.assert_allclose(bounds.m2po_sharp(log_r, q).rhs, np.maximum(1, sup_r) ** 2 * m2, rtol=1e-9)


# --------------------------------------------------------------------------- forgetting (theory/forgetting.py)


def test_forgetting_variance_closed_forms():
    """The sympy sums against direct evaluation: psi(x, a) at integer x equals the lag sum written out, the (1 - a^2)
    factor is the geometric sum of the unrolled pairs, and the printed limits and values hold."""
    d = derive("forgetting-variance")
    a, x, k = (d.symbols[n] for n in ("a", "x", "k"))
    half = sympy.Rational(1, 2)
    for xv in (1, 2, 3, 6):
        written_out = 1 / sympy.Integer(xv) + 2 * sum((xv - j) * a**j for j in range(1, xv)) / sympy.Integer(xv) ** 2
        assert sympy.simplify(d.parts["psi"].subs(x, xv) - written_out) == 0
    # sum_l a^(2l + k) = a^k / (1 - a^2): at a = 1/2, k = 3 against a long partial sum
    partial = sum(half ** (2 * j + 3) for j in range(200))
    assert float(d.parts["pair_sum"].subs({a: half, k: 3})) == pytest.approx(float(partial), rel=1e-15)
    assert d.parts["lag_sum_at_1"] == x * (x - 1) / 2
    assert d.parts["corr_sgd"] == -d.symbols["kappa"] / 2
    beta = d.symbols["beta1"]
    assert sympy.simplify(d.parts["tau_adam"].subs(beta, 0) - d.parts["tau_sgd"].subs(a, 1 - d.symbols["kappa"])) == 0
    assert sympy.simplify(d.parts["corr_adam"].subs(beta, 0) - d.parts["corr_sgd"]) == 0
    sgd = [(str(kv), str(v)) for kv, v in d.parts["psi16_sgd"]]  # 4 significant digits, as printed
    assert sgd == [("1", "0.06250"), ("1/2", "0.1719"), ("1/10", "0.6147"), ("1/100", "0.9487")]
    assert [str(v) for _, v in d.parts["psi16_adam"]] == ["0.1897", "0.4278", "0.8460", "0.9835"]


def test_forgetting_rule_reduces_to_the_noise_scale_rule_at_psi_one():
    rule, old = derive("forgetting-rule"), derive("noise-scale-rule")
    psi, b, mu = (rule.symbols[n] for n in ("psi", "b", "mu"))
    assert sympy.simplify(rule.parts["y_star"].subs(psi, 1) - old.parts["y_star"]) == 0
    assert sympy.simplify(rule.parts["min_cost"].subs(psi, 1) - old.parts["min_cost"]) == 0
    assert sympy.simplify(rule.parts["cost_replay"].subs(psi, 1) - old.parts["cost_replay"]) == 0
    # psi_c = 1 exactly at today's threshold b_c = (sympy.sqrt(1 + mu) - 1)/2
    at_bc = rule.parts["psi_threshold"].subs(b, old.parts["threshold"])
    assert sympy.simplify(sympy.radsimp(at_bc) - 1) == 0
    assert rule.parts["psi_threshold_large_b"] == mu / (1 + sympy.sqrt(1 + mu)) ** 2
    table = [(str(bb), str(v)) for bb, v in rule.parts["table_mu_5_28"]]
    assert table[3] == ("1", "0.8591") and table[5] == ("37", "0.4412")
    second = rule.steps[6].description
    assert second.startswith("Second derivative") and "is_positive = True" in second


def test_free_batch_values_at_mu_5_28():
    d = derive("free-batch")
    mu = sympy.Rational(132, 25)
    assert sympy.simplify(d.parts["y_loose_mu_5_28"] - (1 + sympy.sqrt(1 + mu))) == 0
    assert float(d.parts["loose_value_mu_5_28"]) == pytest.approx(0.42954817529, abs=1e-11)
    assert float(d.parts["horizon_mu_5_28"]) == pytest.approx(2.32802758, abs=1e-8)
    B, R, N, b_noise = (d.symbols[n] for n in ("B", "R", "N", "B_noise"))
    assert sympy.simplify(d.parts["more_steps"] - b_noise / B) == 0
    assert sympy.simplify(d.parts["more_steps_exact"] - b_noise * (N - 1) / (B * N)) == 0


@pytest.mark.parametrize("name,last", [
    ("forgetting-variance", "psi = "), ("forgetting-rule", "y_* = "), ("free-batch", "psi_eq = ")])
def test_derive_prints_the_forgetting_derivations(cli, name, last):
    code, out, err = cli("derive", name)
    assert code == 0 and not err
    assert out.startswith(f"{name}: {derive(name).title}")
    result = out.split("Result:")[1]
    assert last in result
    if name == "free-batch":
        assert "(y_l = 3.50599, psi_eq = 0.429548, x_min = 2.32803)" in out
    if name == "forgetting-variance":
        assert "corr_SGD = " in out and "-kappa" in out

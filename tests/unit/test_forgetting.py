"""The forgetting-aware rule (theory/forgetting.py): sympy against numpy, closed forms against naive loops and
simulations, the kappa estimators, the whole-design search, and the exact expected-loss recursion of the noisy
quadratic (simulate/envs/quadratic.py) against Monte Carlo and against the stationary variance built from psi.

Derivations: ``replay-theory derive forgetting-variance | forgetting-rule | free-batch``; docs/THEORY.md,
"Forgetting: the horizon and the free batch". Monte Carlo checks use seeded generators and assert within 4-5
standard errors, the standard error taken from the spread of independent chains or seeds.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import sympy

from replay_theory.simulate.envs.quadratic import QuadraticConfig, QuadraticEnv, QuadraticReplay, expected_loss
from replay_theory.theory import forgetting as fg
from replay_theory.theory import noise_scale as ns
from replay_theory.theory.symbolic import derive

RTOL = 1e-12
MU_QWEN = 5.28  # Table 1 of the experience-replay paper (Qwen2.5-7B)
XS = (1, 2, 3, 5, 16, 64)
KAPPAS_SGD = (0.003, 0.05, 0.3, 1.0, 1.5)  # 1.5: a = -0.5, the step overshoots (still stable)
KAPPAS_MOM = (0.01, 0.1, 0.5, 1.0, 3.0)  # none at the critical damping kappa = (1 - sqrt(beta1))^2/(1 - beta1)
BS = (0.05, 0.25, 1.0, 4.0, 37.0)
MUS = (0.5, 1.0, 5.28, 20.0)


def _fn(expr, derivation, *names):
    return sympy.lambdify([derivation.symbols[n] for n in names], expr, modules="numpy")


def _grid(*axes):
    mesh = np.meshgrid(*[np.asarray(a, dtype=float) for a in axes], indexing="ij")
    return [m.ravel() for m in mesh]


def _naive_psi(x: int, rho: np.ndarray) -> float:
    """1/x + (2/x^2) sum_{k=1}^{x-1} (x - k) rho(k), one lag at a time."""
    return 1 / x + 2 / x**2 * sum((x - k) * rho[k] for k in range(1, x))


def _response(kappa: np.ndarray, optimizer: str, beta: float, kicks: np.ndarray) -> np.ndarray:
    """e_1 .. e_T (cases, T) of the optimizer's literal update along one direction (h = 1), the gradient
    g_t = e_t + n_t with n_t = kicks[:, t]: SGD e <- e - eta g (eta = kappa); torch heavy ball v <- beta v + g,
    e <- e - eta v (eta = kappa (1 - beta)); Adam's first moment m <- beta m + (1 - beta) g, e <- e - eta m with the
    second moment frozen at 1 (eta = kappa). Written from the optimizers, not from forgetting's matrices."""
    cases, steps = kicks.shape
    e, v = np.zeros(cases), np.zeros(cases)
    eta = kappa * (1 - beta) if optimizer == "momentum" else kappa
    out = np.empty((cases, steps))
    for t in range(steps):
        g = e + kicks[:, t]
        if optimizer == "sgd":
            e = e - eta * g
        elif optimizer == "momentum":
            v = beta * v + g
            e = e - eta * v
        else:
            v = beta * v + (1 - beta) * g
            e = e - eta * v
        out[:, t] = e
    return out


# --------------------------------------------------------------------------- derive forgetting-variance


def test_phi_psi_and_effective_variance_match_sympy():
    d = derive("forgetting-variance")
    x, kappa = _grid(XS, KAPPAS_SGD)
    a = 1 - kappa
    phi = _fn(d.parts["phi"], d, "x", "a")(x, a)
    psi = _fn(d.parts["psi"], d, "x", "a")(x, a)
    np.testing.assert_allclose(fg.phi_sgd(x, kappa), phi, rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(fg.psi(x.astype(int), kappa), psi, rtol=1e-10)
    # B V_eff = 1 + y psi - 1/N at (B, R, N) = (y R, R, x R)
    bv = _fn(d.parts["B_v_eff"], d, "x", "a", "y", "R")
    for B, R in ((8, 8), (64, 16), (256, 4), (5, 2)):
        want = bv(x, a, B / R, float(R))
        got = [fg.effective_variance(B, R, int(xi) * R, ki) for xi, ki in zip(x, kappa)]
        np.testing.assert_allclose(got, want, rtol=1e-10)
    assert fg.effective_variance(64, 16, 64, 0.3, on_policy=True) == 1.0


def test_v_eff_is_the_forgetting_weighted_sum_of_the_fifo_autocovariance():
    """V_eff = C(0) + 2 sum_k a^k C(k), C from noise_scale.fifo_autocovariance, lag by lag; and the sympy form."""
    d = derive("forgetting-variance")
    v_eff = _fn(d.parts["v_eff"], d, "B", "R", "x", "a", "sigma")
    for B, R, x in ((8, 4, 1), (16, 4, 4), (64, 8, 16), (3, 5, 7)):
        lags = np.arange(0, x + 3)  # C vanishes from lag x on
        cov = ns.fifo_autocovariance(lags, B, R, x * R)
        for kappa in KAPPAS_SGD:
            a = 1 - kappa
            naive = cov[0] + 2 * np.sum(a ** lags[1:] * cov[1:])
            assert naive * B == pytest.approx(fg.effective_variance(B, R, x * R, kappa), rel=1e-12)
            assert v_eff(B, R, x, a, 1.0) == pytest.approx(naive, rel=1e-12)
    # a = 1 (no forgetting) leaves the plain long-run variance 1/B + 1/R - 1/(BN) of derive fifo-long-run-variance
    x = d.symbols["x"]
    at_1 = sympy.limit(d.parts["v_eff"], d.symbols["a"], 1)
    B, R, sigma = (d.symbols[n] for n in ("B", "R", "sigma"))
    assert sympy.simplify(at_1 - sigma**2 * (1 / B + 1 / R - 1 / (B * x * R))) == 0


def test_phi_sgd_matches_the_lag_sum_loop():
    for x in XS:
        for kappa in KAPPAS_SGD + (0.0, 1e-6):
            a = 1 - kappa
            naive = 2 / x**2 * sum((x - k) * a**k for k in range(1, x))
            assert fg.phi_sgd(x, kappa) == pytest.approx(naive, rel=1e-12, abs=1e-15), (x, kappa)
    # phi in [0, 1 - 1/x] for a in [0, 1], (x - 1)/x at a = 1 and 0 at a = 0
    x, kappa = _grid(XS, np.linspace(0, 1, 21))
    phi = fg.phi_sgd(x, kappa)
    assert np.all(phi >= 0) and np.all(phi <= 1 - 1 / x + 1e-15)
    np.testing.assert_allclose(fg.phi_sgd(np.array(XS), 0.0), (np.array(XS) - 1) / np.array(XS), rtol=RTOL)
    np.testing.assert_allclose(fg.phi_sgd(np.array(XS), 1.0), 0.0, atol=0)


def test_psi_hand_values_and_limits():
    for kappa in KAPPAS_SGD:
        a = 1 - kappa
        assert fg.psi(1, kappa) == 1.0  # one step of horizon: the buffer is on-policy with replacement
        assert fg.psi(2, kappa) == pytest.approx((1 + a) / 2, rel=RTOL)  # 1/2 + (2/4) a
        assert fg.psi(3, kappa) == pytest.approx(1 / 3 + 2 / 9 * (2 * a + a * a), rel=RTOL)
        for optimizer in ("momentum", "adam"):
            assert fg.psi(1, kappa, optimizer) == pytest.approx(1.0, rel=RTOL)
    d = derive("forgetting-variance")
    assert d.parts["limit_a_1"] == 1 and d.parts["limit_a_0"] == 1 / d.symbols["x"]
    # x -> oo: x psi -> (1 + a)/(1 - a) = (2 - kappa)/kappa; sympy's limit (a = e^-s) lambdified
    x_psi = _fn(d.parts["x_psi_limit"], d, "s")
    for kappa in (0.05, 0.3, 0.9):
        x, tau = 200_000, (2 - kappa) / kappa
        # x psi = tau - 2 a (1 - a^x) / (x kappa^2): the O(1/x) rest, bounded by 2 a / (x kappa^2)
        assert x * fg.psi(x, kappa) == pytest.approx(tau, rel=2 * (1 - kappa) / (x * kappa**2 * tau) * 1.001)
        assert x_psi(-math.log(1 - kappa)) == pytest.approx((2 - kappa) / kappa, rel=1e-12)
    # short horizon: psi = 1 - kappa (x^2 - 1)/(3x) + O(kappa^2) (sympy.series)
    slope = _fn(d.parts["small_kappa_slope"], d, "x")
    for x in (2, 16, 64):
        kappa = 1e-7
        assert (1 - fg.psi(x, kappa)) / kappa == pytest.approx(-slope(float(x)), rel=1e-4)
        assert -slope(float(x)) == pytest.approx((x * x - 1) / (3 * x), rel=RTOL)


def test_psi_near_kappa_zero_is_accurate():
    """Regression: the closed form lost every digit near kappa = 0 (x (1 - a) - 1 + a^x cancels to ~x^2 kappa^2/2):
    psi(2, 1e-9) was 0.5 and psi(16, 1e-7) 0.99994 against 1 - 5.3e-7; psi(16, 1e-7, adam) came out above 1. The
    binomial series near a = 1 (``_lag_sum``) keeps psi = 1 - kappa (x^2 - 1)/(3x) to rounding."""
    for kappa in (1e-4, 1e-6, 1e-7, 1e-9, 1e-12):
        for x in (2, 3, 16, 64, 1000):
            want = 1 - kappa * (x * x - 1) / (3 * x)  # the O(kappa^2) rest is below 1e-6 * kappa here
            assert fg.psi(x, kappa) == pytest.approx(want, abs=1e-15 + (kappa * x) ** 2), (x, kappa)
            assert 1 / x <= fg.psi(x, kappa) <= 1
        for optimizer in ("momentum", "adam"):
            rho = fg.impulse_autocorrelation(np.arange(16), kappa, optimizer)
            assert fg.psi(16, kappa, optimizer) == pytest.approx(_naive_psi(16, rho), abs=1e-12)
            assert fg.psi(16, kappa, optimizer) <= 1
    # both sides of the switch between the series and the closed form agree (|1 - a| x = 1/2)
    for x in (2, 16, 64):
        edge = fg.SERIES_BELOW / x
        for kappa in (edge * (1 - 1e-9), edge * (1 + 1e-9)):
            naive = 1 / x + 2 / x**2 * math.fsum((x - k) * (1 - kappa) ** k for k in range(1, x))
            assert fg.psi(x, kappa) == pytest.approx(naive, rel=1e-13)


def test_psi_is_the_variance_of_a_mean_of_x_ar1_values():
    """psi(x, a) = x^-2 sum_{j,l < x} a^|j - l| (the derivation checks x = 5 symbolically): in [0, 1] for every
    stable a, in [1/x, 1] for a >= 0, non-increasing in kappa on [0, 1]."""
    for x in XS:
        for kappa in KAPPAS_SGD + (1.9, 1.999):
            a = 1 - kappa
            j = np.arange(x)
            naive = np.sum(a ** np.abs(j[:, None] - j[None, :])) / x**2
            assert fg.psi(x, kappa) == pytest.approx(naive, rel=1e-10, abs=1e-15)
            assert 0 <= fg.psi(x, kappa) <= 1
        ks = np.linspace(1e-4, 1, 200)
        values = fg.psi(x, ks)
        assert np.all(np.diff(values) <= 1e-15) and np.all(values >= 1 / x - 1e-15)


def test_psi_16_table_matches_the_issue_and_the_derivation():
    d = derive("forgetting-variance")
    for kv, value in d.parts["psi16_sgd"]:
        assert fg.psi(16, float(kv)) == pytest.approx(float(value), abs=5e-5)
    for kv, value in d.parts["psi16_adam"]:
        assert fg.psi(16, float(kv), "adam", 0.9) == pytest.approx(float(value), abs=5e-5)
    # issue 30 quotes 0.06 / 0.17 / 0.62 / 0.95 at kappa = 1, 0.5, 0.1, 0.01; the 0.1 entry is 0.6147 (0.61)
    values = [fg.psi(16, k) for k in (1.0, 0.5, 0.1, 0.01)]
    np.testing.assert_allclose(values, [0.0625, 0.17187524, 0.61465, 0.94873], atol=5e-5)
    # Adam's momentum keeps more at a short horizon, whatever kappa: psi_adam(16) > psi_sgd(16) at every kappa
    assert all(fg.psi(16, k, "adam") > fg.psi(16, k) for k in (1.0, 0.5, 0.1, 0.01))


def test_psi_for_momentum_and_adam_matches_the_impulse_lag_sum():
    for optimizer in ("momentum", "adam"):
        for beta in (0.5, 0.9, 0.99):
            for kappa in KAPPAS_MOM:
                stable = kappa < 2 * (1 + beta) / (1 - beta)
                if not stable:
                    continue
                rho = fg.impulse_autocorrelation(np.arange(64), kappa, optimizer, beta)
                for x in (1, 2, 7, 16, 64):
                    got = fg.psi(x, kappa, optimizer, beta)
                    assert got == pytest.approx(_naive_psi(x, rho), rel=1e-9, abs=1e-12), (optimizer, beta, kappa, x)
                # broadcast over kappa: the (..., 2, 2) solve agrees with one kappa at a time
                ks = np.array([kappa, kappa * 0.7])
                np.testing.assert_allclose(fg.psi(16, ks, optimizer, beta),
                                           [fg.psi(16, float(k), optimizer, beta) for k in ks], rtol=1e-12)
    # heavy ball and Adam share A; b differs by a factor, so rho and psi are the same functions of kappa
    np.testing.assert_allclose(fg.psi(16, np.array(KAPPAS_MOM), "momentum"),
                               fg.psi(16, np.array(KAPPAS_MOM), "adam"), rtol=1e-10)


def test_impulse_autocorrelation_matches_the_simulated_impulse_response():
    steps = 6000  # |lambda|^steps < 1e-25 for every case below
    for optimizer, kappas in (("sgd", (0.05, 0.5, 1.5)), ("momentum", (0.05, 0.5, 3.0)), ("adam", (0.05, 0.5, 3.0))):
        kappa = np.array(kappas)
        kicks = np.zeros((kappa.size, steps))
        kicks[:, 0] = 1.0  # one noise kick at step 0
        r = _response(kappa, optimizer, 0.9, kicks)  # (cases, steps)
        lags = np.arange(40)
        for i, k in enumerate(kappas):
            naive = np.array([r[i, : steps - lag] @ r[i, lag:] for lag in lags]) / (r[i] @ r[i])
            got = fg.impulse_autocorrelation(lags, k, optimizer, 0.9)
            np.testing.assert_allclose(got, naive, rtol=1e-9, atol=1e-12, err_msg=f"{optimizer} {k}")
    assert np.array_equal(fg.impulse_autocorrelation([3, 0, 1], 0.2), 0.8 ** np.array([3.0, 0.0, 1.0]))


def test_integrated_autocorrelation_of_adam_matches_sympy():
    """x psi -> tau = 2/kappa - (1 - beta1)/(1 + beta1) (derive forgetting-variance): at long horizons Adam keeps what
    SGD keeps (2/kappa - 1 at beta1 = 0)."""
    d = derive("forgetting-variance")
    tau = _fn(d.parts["tau_adam"], d, "kappa", "beta1")
    for beta in (0.5, 0.9):
        for kappa in (0.05, 0.5, 2.0):
            want = 2 / kappa - (1 - beta) / (1 + beta)
            assert tau(kappa, beta) == pytest.approx(want, rel=1e-12)
            x = 400_000
            assert x * fg.psi(x, kappa, "adam", beta) == pytest.approx(want, rel=1e-3)
    assert d.parts["det_A"] == d.symbols["beta1"]


# --------------------------------------------------------------------------- the lag-1 gradient autocorrelation


def test_lag1_autocorrelation_matches_sympy():
    d = derive("forgetting-variance")
    assert d.parts["corr_sgd"] == -d.symbols["kappa"] / 2
    corr = _fn(d.parts["corr_adam"], d, "kappa", "beta1")
    for beta in (0.5, 0.8, 0.9, 0.99):
        for kappa in (0.001, 0.05, 0.5, 2.0):
            for optimizer in ("momentum", "adam"):
                got = fg.lag1_gradient_autocorrelation(kappa, optimizer, beta)
                assert got == pytest.approx(corr(kappa, beta), rel=1e-9, abs=1e-15), (optimizer, beta, kappa)
    for kappa in KAPPAS_SGD:
        assert fg.lag1_gradient_autocorrelation(kappa) == -kappa / 2
    # small kappa: corr / kappa -> beta1 - 1/2 (0.4 at 0.9; positive, where SGD's is -1/2)
    assert d.parts["corr_adam_slope"] == d.symbols["beta1"] - sympy.Rational(1, 2)
    assert fg.lag1_gradient_autocorrelation(1e-4, "adam") / 1e-4 == pytest.approx(0.4, rel=1e-3)


@pytest.mark.parametrize("optimizer,kappa", [("sgd", 0.1), ("sgd", 0.6), ("sgd", 1.5), ("momentum", 0.2),
                                             ("momentum", 1.0), ("adam", 0.2), ("adam", 1.0)])
def test_lag1_autocorrelation_matches_a_long_simulated_run(optimizer, kappa):
    """Fresh unit noise each step, 400 independent chains of 3000 steps after a burn-in of 30 memories: the pooled
    lag-1 autocorrelation of g = e + n within 5 standard errors (from the chains' spread) of the stationary value."""
    rng = np.random.default_rng([30, int(kappa * 100), len(optimizer)])
    chains, burn, steps = 400, int(30 / min(kappa, 1.0)) + 100, 3000
    kicks = rng.standard_normal((chains, burn + steps + 1))
    e = _response(np.full(chains, kappa), optimizer, 0.9, kicks)  # e_1 .. e_T
    g = e[:, burn:-1] + kicks[:, burn + 1:]  # g_t = e_t + n_t with e_t = e[:, t - 1]
    per_chain = np.sum(g[:, 1:] * g[:, :-1], axis=1) / np.sum(g[:, :-1] ** 2, axis=1)
    pooled = np.sum(g[:, 1:] * g[:, :-1]) / np.sum(g[:, :-1] ** 2)
    se = per_chain.std(ddof=1) / math.sqrt(chains)
    want = fg.lag1_gradient_autocorrelation(kappa, optimizer, 0.9)
    assert abs(pooled - want) <= 5 * se, (pooled, want, se)
    assert se < 0.1 * abs(want)  # the test resolves the value, not only its sign


def test_kappa_from_autocorrelation_inverts_the_lag1_autocorrelation():
    for optimizer, beta, kappas in (("sgd", 0.9, (1e-4, 0.05, 0.5, 1.5, 1.99)),
                                    ("momentum", 0.9, (1e-4, 0.01, 0.2, 1.0, 4.0)),
                                    ("adam", 0.9, (1e-4, 0.01, 0.2, 1.0, 4.0)),
                                    ("adam", 0.99, (1e-3, 0.1, 2.0))):
        for kappa in kappas:
            corr = fg.lag1_gradient_autocorrelation(kappa, optimizer, beta)
            got = fg.kappa_from_autocorrelation(corr, optimizer, beta)
            assert got == pytest.approx(kappa, rel=1e-8), (optimizer, beta, kappa)
    # Adam's lag-1 autocorrelation peaks (0.4222 near kappa = 4.2 at beta1 = 0.9): above it no stable kappa gives it
    with pytest.raises(ValueError, match=r"lag-1 autocorrelation 0\.5 is more than adam with beta1 = 0\.9"):
        fg.kappa_from_autocorrelation(0.5, "adam")
    with pytest.raises(ValueError, match=r"must be in \(-1, 0\) to give SGD's memory, got 0\.1"):
        fg.kappa_from_autocorrelation(0.1)
    with pytest.raises(ValueError, match=r"must be > 0 to give momentum's memory \(beta1 = 0\.9\), got -0\.1"):
        fg.kappa_from_autocorrelation(-0.1, "momentum")


def test_kappa_from_curvature_pairs_recovers_eta_lambda_eff():
    """Synthetic pairs at one theta: H = diag(h), Sigma = diag(s2), xi = difference of two minibatch means of b
    samples, so E xi xi^T = 2 Sigma / b; kappa = eta tr(H Sigma)/tr Sigma lies in the interval, and a 90% interval
    covers it in 80-97% of 300 independent data sets."""
    rng = np.random.default_rng(3030)
    d, b, eta = 12, 16, 0.3
    h = np.geomspace(1.0, 0.02, d)
    s2 = rng.uniform(0.2, 3.0, d)
    truth = eta * np.sum(h * s2) / np.sum(s2)

    def pairs(n):
        xi = rng.standard_normal((n, d)) * np.sqrt(2 * s2 / b)  # (n, d)
        return np.sum(xi * xi * h, axis=1), np.sum(xi * xi, axis=1)  # xi^T H xi, |xi|^2

    num, den = pairs(2000)
    est = fg.kappa_from_curvature_pairs(num, den, eta, rng, level=0.99, pilot_batch=64.0)
    assert est.interval[0] <= truth <= est.interval[1]
    assert est.kappa == pytest.approx(truth, rel=0.1)
    assert est.method == "curvature-pairs" and est.units == 2000 and est.pilot_batch == 64.0
    assert est.detail["lambda_eff"] == pytest.approx(est.kappa / eta, rel=RTOL)
    assert est.memory() == fg.Memory(est.kappa, "sgd", 0.9, 64.0)
    record = est.to_dict()
    assert record["kappa"] == est.kappa and record["kappa_interval"] == list(est.interval)
    covered = 0
    for _ in range(300):
        num, den = pairs(200)
        lo, hi = fg.kappa_from_curvature_pairs(num, den, eta, rng, n_boot=300, level=0.9).interval
        covered += lo <= truth <= hi
    assert 0.80 <= covered / 300 <= 0.97, covered


def test_kappa_from_gradient_series_recovers_kappa_of_a_simulated_sgd_run():
    """One on-policy SGD run, 16 directions of equal curvature, 6000 steps past the burn-in: the lag-1 estimator
    within 4 standard errors (the 99% bootstrap interval's half-width / 2.576) and inside that interval."""
    rng = np.random.default_rng(77)
    kappa, dims, burn, steps = 0.2, 16, 300, 6000
    kicks = rng.standard_normal((dims, burn + steps + 1))
    e = _response(np.full(dims, kappa), "sgd", 0.0, kicks)
    g = (e[:, burn:-1] + kicks[:, burn + 1:]).T  # (steps, dims): g_t = h e_t + n_t, h = 1
    dots = np.sum(g[1:] * g[:-1], axis=1)  # g_{t+1} . g_t
    sq = np.sum(g[:-1] ** 2, axis=1)
    est = fg.kappa_from_gradient_series(dots, sq, rng, level=0.99)
    lo, hi = est.interval
    se = (hi - lo) / (2 * 2.576)
    assert abs(est.kappa - kappa) <= 4 * se and lo <= kappa <= hi
    assert se < 0.1 * kappa
    assert est.detail["lag1_autocorrelation"] == pytest.approx(-est.kappa / 2, rel=RTOL)
    assert est.detail["replicates_without_signal"] == 0 and est.method == "lag-autocorrelation"
    # Adam's estimator on an Adam run (positive autocorrelation); 200 replicates: each inverts by root finding
    e = _response(np.full(dims, 0.3), "adam", 0.9, kicks)
    g = (e[:, burn:-1] + kicks[:, burn + 1:]).T
    est = fg.kappa_from_gradient_series(np.sum(g[1:] * g[:-1], axis=1), np.sum(g[:-1] ** 2, axis=1), rng,
                                        optimizer="adam", level=0.99, n_boot=200)
    assert est.interval[0] <= 0.3 <= est.interval[1] and est.kappa == pytest.approx(0.3, rel=0.25)


# --------------------------------------------------------------------------- derive forgetting-rule


def test_forgetting_cost_ratio_and_condition_match_sympy():
    d = derive("forgetting-rule")
    b, y, mu, p = _grid(BS, (0.5, 1.0, 3.0, 12.0), MUS, (0.02, 0.1, 0.43, 0.8, 1.0))
    np.testing.assert_allclose(fg.forgetting_cost(b, y, mu, p), _fn(d.parts["cost_replay"], d, "b", "y", "mu", "psi")(
        b, y, mu, p), rtol=RTOL)
    y_star = fg.forgetting_replay_ratio(b, mu, p)
    np.testing.assert_allclose(y_star, _fn(d.parts["y_star"], d, "b", "mu", "psi")(b, mu, p), rtol=RTOL)
    np.testing.assert_allclose(fg.forgetting_cost(b, y_star, mu, p),
                               _fn(d.parts["min_cost"], d, "b", "mu", "psi")(b, mu, p), rtol=1e-12)
    for factor in (0.99, 1.01):  # y* is the minimiser
        assert np.all(fg.forgetting_cost(b, y_star, mu, p) < fg.forgetting_cost(b, y_star * factor, mu, p))
    # replay pays iff the gap cost_on - cost(y*) > 0 iff psi < psi_c = (1 + 1/b) mu / (1 + sqrt(1 + mu))^2
    gap = _fn(d.parts["gap"], d, "b", "mu", "psi")(b, mu, p)
    psi_c = _fn(d.parts["psi_threshold"], d, "b", "mu")(b, mu)
    away = np.abs(p - psi_c) > 1e-9
    pays = fg.forgetting_replay_pays(b, mu, p)
    np.testing.assert_array_equal(pays[away], (gap > 0)[away])
    np.testing.assert_array_equal(pays[away], (p < psi_c)[away])
    on = (1 + b) * (1 + mu)
    np.testing.assert_allclose(on - fg.forgetting_cost(b, y_star, mu, p), gap, rtol=1e-9, atol=1e-12)
    # psi_c at mu = 5.28 (the derivation's table): 0.8591 at b = 1, 0.4412 at b = 37
    for bb, value in d.parts["table_mu_5_28"]:
        assert (1 + 1 / float(bb)) * fg.loosest_equal_steps(MU_QWEN)[1] == pytest.approx(float(value), abs=5e-5)


def test_forgetting_rule_at_psi_one_is_the_noise_scale_rule():
    b, mu = _grid((0.01, 0.1, 0.5, 0.75, 0.76, 1.0, 10.0), MUS)
    np.testing.assert_array_equal(fg.forgetting_replay_pays(b, mu, 1.0), ns.replay_pays(b, mu))
    np.testing.assert_allclose(fg.forgetting_replay_ratio(b, mu, 1.0), ns.optimal_replay_ratio(b, mu), rtol=RTOL)
    for y in (0.5, 2.0, 7.6):
        np.testing.assert_allclose(fg.forgetting_cost(b, y, mu, 1.0), ns.replay_cost(b, y, mu), rtol=RTOL)
    assert isinstance(fg.forgetting_replay_pays(0.1, 5.28, 1.0), bool)
    assert isinstance(fg.forgetting_cost(0.1, 2.0, 5.28, 0.5), float)
    # b psi >= 1 + b can never pay (the second root of the boundary lies there)
    assert fg.forgetting_replay_pays(0.1, 1e6, 11.5) is False


# --------------------------------------------------------------------------- derive free-batch


def test_equal_steps_threshold_and_its_loosest_point_match_sympy():
    d = derive("free-batch")
    y, mu = _grid((1.0, 1.5, 2.0, 3.506, 8.0, 64.0), MUS)
    thr = fg.equal_steps_threshold(y, mu)
    np.testing.assert_allclose(thr, _fn(d.parts["threshold"], d, "y", "mu")(y, mu), rtol=RTOL)
    assert fg.equal_steps_threshold(1.0, MU_QWEN) == 0.0
    assert np.all(thr < 1)  # never reached at psi = 1
    y_l, t_l = fg.loosest_equal_steps(np.array(MUS))
    np.testing.assert_allclose(y_l, _fn(d.parts["y_loose"], d, "mu")(np.array(MUS)), rtol=RTOL)
    np.testing.assert_allclose(t_l, _fn(d.parts["loose_value"], d, "mu")(np.array(MUS)), rtol=RTOL)
    np.testing.assert_allclose(fg.equal_steps_threshold(y_l, np.array(MUS)), t_l, rtol=1e-12)
    ys = np.linspace(1, 40, 100_001)
    for m, yl, tl in zip(MUS, y_l, t_l):
        grid = fg.equal_steps_threshold(ys, m)
        assert grid.max() <= tl * (1 + 1e-12) and abs(ys[grid.argmax()] - yl) < 1e-3
    y_q, t_q = fg.loosest_equal_steps(MU_QWEN)
    assert (round(y_q, 5), round(t_q, 6)) == (3.50599, 0.429548)
    assert float(d.parts["loose_value_mu_5_28"]) == pytest.approx(t_q, rel=1e-12)
    assert float(d.parts["horizon_mu_5_28"]) == pytest.approx(1 / t_q, rel=1e-12)  # x > 2.328: psi >= 1/x


def test_equal_steps_threshold_is_where_replay_and_the_matching_on_policy_batch_cost_the_same():
    """At psi = equal_steps_threshold(y, mu), replay at (R, y R) and on-policy at the batch with as many steps
    (B' = y R / (1 + y psi), sympy's solve) cost the same per step; below it replay is cheaper."""
    d = derive("free-batch")
    b_equal = _fn(d.parts["equal_steps_batch"], d, "R", "y", "psi")
    for mu in MUS:
        for y in (1.5, 3.0, 10.0):
            R, b_noise = 32.0, 500.0
            for p, replay_wins in ((fg.equal_steps_threshold(y, mu), None), (0.5 * fg.equal_steps_threshold(y, mu),
                                                                             True), (1.0, False)):
                bp = b_equal(R, y, p)
                steps_replay = 1 + b_noise * (1 + y * p) / (y * R)
                assert 1 + b_noise / bp == pytest.approx(steps_replay, rel=1e-12)
                replay, on = mu * R + y * R, (1 + mu) * bp
                if replay_wins is None:
                    assert replay == pytest.approx(on, rel=1e-12)
                else:
                    assert (replay < on) is replay_wins


def test_at_psi_one_a_smaller_on_policy_batch_dominates_replay():
    d = derive("free-batch")
    assert d.parts["more_cost"] == d.symbols["B"] - d.symbols["R"]
    for b_noise, mu in ((10.0, 5.28), (500.0, 1.0), (5000.0, 20.0)):
        for R in (4, 16, 64):
            for B in (R + 1, 2 * R, 8 * R):
                for x in (1, 4):
                    replay = fg.predict(fg.Design(B, R, x * R), b_noise, mu, None)
                    on = fg.predict(fg.Design.on_policy_at(R), b_noise, mu, None)
                    assert on.steps < replay.steps and on.cost_per_step < replay.cost_per_step
                    assert on.compute < replay.compute


# --------------------------------------------------------------------------- predictions and the whole design


def test_on_policy_prediction_is_mccandlish():
    memory = fg.Memory(0.05, "adam", 0.9, pilot_batch=64.0)
    for b_noise, B in ((100.0, 64), (1e4, 8), (3.0, 256)):
        p = fg.predict(fg.Design.on_policy_at(B), b_noise, 5.28, memory)
        assert p.steps == pytest.approx(1 + b_noise / B, rel=RTOL)
        assert p.cost_per_step == pytest.approx(6.28 * B, rel=RTOL) and p.compute == pytest.approx(
            p.steps * p.cost_per_step, rel=RTOL)
        assert p.psi == 1.0 and p.staleness == 1.0
        # Eq. 2.6: kappa_d = kappa_max / (1 + B_noise / B)^(1/2) for Adam; at the pilot it is the pilot's kappa
        assert p.kappa == pytest.approx(memory.kappa_max(b_noise) / math.sqrt(1 + b_noise / B), rel=1e-12)
    assert fg.predict(fg.Design.on_policy_at(64), 100.0, 5.28, memory).kappa == pytest.approx(0.05, rel=1e-12)


def test_replay_without_a_memory_is_the_noise_scale_cost_with_its_minus_one_over_n():
    """memory None: psi = 1. compute = B [replay_cost(b, y, mu) - (b/N)(1 + mu/y)]: the noise-scale rule's cost times
    B, less the -1/N of B V = 1 + y - 1/N that ``predict`` keeps and noise_scale drops (relative gap
    b / (N (1 + b (1 + y))))."""
    for b_noise, B, R in ((64.0, 64, 16), (1000.0, 256, 8), (5.0, 32, 32)):
        for x in (1, 4):
            d = fg.Design(B, R, x * R)
            p = fg.predict(d, b_noise, MU_QWEN, None)
            b, y, N = b_noise / B, B / R, x * R
            want = B * (ns.replay_cost(b, y, MU_QWEN) - b / N * (1 + MU_QWEN / y))
            assert p.compute == pytest.approx(want, rel=1e-12)
            assert 1 - p.compute / (B * ns.replay_cost(b, y, MU_QWEN)) == pytest.approx(b / (N * (1 + b * (1 + y))),
                                                                                         rel=1e-9)
            assert p.psi == 1.0 and math.isnan(p.kappa)


def test_the_tuned_step_fixed_point_holds():
    designs = [fg.Design(64, 16, 16 * x) for x in (2, 4, 16)] + [fg.Design(256, 8, 512), fg.Design(32, 32, 64)]
    for memory in (fg.Memory(0.1, "sgd", pilot_batch=64.0), fg.Memory(0.02, "adam", 0.9, pilot_batch=16.0),
                   fg.Memory(0.3, "momentum", 0.9, pilot_batch=128.0, step_exponent=0.7)):
        for b_noise in (10.0, 300.0):
            staleness = fg.Staleness((0.0, 10.0), (1.0, 1.5))
            preds = fg.predict_many(designs, b_noise, 2.0, memory, staleness)
            assert preds == [fg.predict(d, b_noise, 2.0, memory, staleness) for d in designs]
            for d, p in zip(designs, preds):
                # the staleness at the design's own step: ages stretched by kappa_d / kappa_pilot
                m = float(np.mean([staleness.at(s * p.kappa / memory.kappa) for s in range(d.x)]))
                noise = b_noise / d.batch_size * (1 + d.y * fg.psi(d.x, p.kappa, memory.optimizer, memory.beta1)
                                             - 1 / d.capacity) * m
                rhs = memory.kappa_max(b_noise) / (1 + noise) ** memory.alpha
                assert p.kappa == pytest.approx(rhs, rel=1e-9), (memory, d)
                assert p.psi == pytest.approx(fg.psi(d.x, p.kappa, memory.optimizer, memory.beta1), rel=1e-12)
                assert p.steps == pytest.approx(1 + noise, rel=1e-12) and p.staleness == pytest.approx(m, rel=RTOL)
                assert p.kappa < memory.kappa_max(b_noise)
    # no pilot batch: kappa is the same at every design (no feedback)
    p = fg.predict(fg.Design(64, 16, 256), 300.0, 2.0, fg.Memory(0.1))
    assert p.kappa == pytest.approx(0.1, rel=1e-12) and p.psi == pytest.approx(fg.psi(16, 0.1), rel=1e-9)


def test_the_tuned_step_is_capped_at_the_stability_limit():
    """Regression: kappa_max = kappa (1 + B_noise / B_pilot)^alpha passes SGD's kappa = 2 once B_noise / B_pilot is
    large (0.5 at b = 10 gives 5.5), and the fixed-point search then asked psi for kappa >= 2 and raised. The tuned
    step cannot pass the stability limit along the noise, so kappa_d is capped just inside it."""
    memory = fg.Memory(0.5, "sgd", pilot_batch=64.0)
    result = fg.whole_design(640.0, 64, MU_QWEN, memory)  # raised "kappa must be < 2 for SGD" before the cap
    for p in (result.at_batch, result.on_policy, result.replay):
        assert p is not None and 0 < p.kappa < 2
    for optimizer in ("sgd", "momentum", "adam"):
        memory = fg.Memory(0.2, optimizer, 0.9, pilot_batch=64.0)
        top = fg.tuned_kappa_limit(optimizer, 0.9, 0.2)  # SGD: the Newton step, 1 (fg.TUNED_KAPPA)
        preds = fg.predict_many([fg.Design(256, 8, 8 * x) for x in (1, 2, 16)] + [fg.Design.on_policy_at(512)],
                                1e6, MU_QWEN, memory)
        assert all(0 < p.kappa <= top for p in preds)
        assert all(0 <= p.psi <= 1 for p in preds)
    assert fg.stable_kappa("sgd") == pytest.approx(2.0, rel=1e-8)
    assert fg.stable_kappa("adam", 0.9) == pytest.approx(38.0, rel=1e-8)
    assert np.max(np.abs(np.linalg.eigvals(fg._linear_system(fg.stable_kappa("adam"), "adam", 0.9)[0]))) < 1


def test_a_tuned_sgd_step_stops_at_the_newton_step():
    """Regression (families-509, quadratic-noise3 / SGD / 523): priced at 16x and 256x the pilot's b, kappa_max =
    0.93 (1 + b / 256) passed 2 and the fixed point went to SGD's stability limit, where a = 1 - kappa -> -1 makes
    the four passes' noise cancel (psi_E(4, 1) -> 0): 4 epochs over one mini-batch of R >= 296 was priced noiseless,
    steps = S_min at B_noise = 10937, and the guard answered it (regret 1.46-2.16 against the grid's best). Capped at
    the Newton step (kappa = 1: a = 0, psi_E = 1 exactly), its noise is on-policy's at its batch: 1 + 10937 / 304."""
    memory = fg.Memory(0.9274, "sgd", 0.9, 256.0)
    p = fg.predict(fg.Design.epochs_of(304, 4, 1, 8), 10937.0, 1.0, memory)
    assert p.kappa == 1.0 and p.psi == 1.0 and p.steps == pytest.approx(1 + 10937 / 304, rel=1e-12)
    assert float(fg.psi_epochs(4, 1, 1.95)) == pytest.approx(0.049, abs=1e-3)  # what the old cap allowed
    # a measured kappa above the Newton step stands as measured; momentum and Adam keep the stability limit
    assert fg.tuned_kappa_limit("sgd", 0.9, 1.3) == 1.3 and fg.tuned_kappa_limit("sgd", 0.9, 0.5) == 1.0
    assert fg.tuned_kappa_limit("sgd", 0.9, 5.0) == fg.stable_kappa("sgd")
    for optimizer in ("momentum", "adam"):
        assert fg.tuned_kappa_limit(optimizer, 0.9, 0.5) == fg.stable_kappa(optimizer, 0.9)
    high = fg.predict(fg.Design.epochs_of(304, 4, 1, 8), 10937.0, 1.0, fg.Memory(1.3, "sgd", 0.9, 256.0))
    assert high.kappa == pytest.approx(1.3, rel=1e-9)


def test_step_cost_and_staleness_mean():
    assert fg.step_cost(8, 64, 5.28, floor=32) == pytest.approx(5.28 * 32 + 64, rel=RTOL)
    assert fg.step_cost(64, 64, 5.28, floor=32) == pytest.approx(6.28 * 64, rel=RTOL)
    np.testing.assert_allclose(fg.step_cost(np.array([8, 64]), 64, 1.0, floor=16.0), [16 + 64, 128], rtol=RTOL)
    p = fg.predict(fg.Design(64, 8, 32), 50.0, 5.28, None, floor=32.0)
    assert p.cost_per_step == pytest.approx(5.28 * 32 + 64, rel=RTOL)
    st = fg.Staleness((0.0, 4.0), (1.0, 2.0))  # r(s) = 1 + s/4, extrapolated by its slope past age 4
    assert [st.mean(x) for x in (1, 2, 4, 8)] == pytest.approx([1.0, 1.125, 1.375, 1.875], rel=RTOL)
    assert fg.NO_STALENESS.mean(16) == 1.0 and fg.NO_STALENESS.flat and not st.flat
    # staleness scales every term of the noise: steps - 1 is m(x) times the flat design's (no memory: psi = 1)
    flat = fg.predict(fg.Design(64, 8, 32), 50.0, 5.28, None)
    stale = fg.predict(fg.Design(64, 8, 32), 50.0, 5.28, None, st)
    assert stale.steps - 1 == pytest.approx(st.mean(4) * (flat.steps - 1), rel=RTOL)


def test_whole_design_at_psi_one_is_on_policy_and_respects_the_steps_cap():
    b_noise, B, mu = 1e5, 64, MU_QWEN  # b = 1560: noise everywhere
    strict = fg.whole_design(b_noise, B, mu, None, group_size=8, max_steps_ratio=1.0)
    assert strict.winner == "on-policy at B" and strict.best.design == fg.Design.on_policy_at(B)
    for ratio in (1.2, 2.0, 4.0):
        w = fg.whole_design(b_noise, B, mu, None, group_size=8, max_steps_ratio=ratio)
        assert w.winner == "on-policy (smaller batch)"  # free-batch: replay never beats on-policy at psi = 1
        assert w.replay is None or w.replay.compute > w.on_policy.compute
        cap = ratio * (1 + b_noise / B)
        # on-policy compute (1 + mu)(B' + B_noise) falls with B': the smallest whole group inside the steps cap
        smallest = min(g for g in range(8, 4 * B + 1, 8) if 1 + b_noise / g <= cap)
        assert w.on_policy.design.batch_size == smallest
        for p in (w.at_batch, w.on_policy, w.replay):
            assert p is None or p.steps <= cap * (1 + 1e-12)
        assert (w.threshold_y, w.threshold) == pytest.approx(fg.loosest_equal_steps(mu), rel=RTOL)


def test_whole_design_picks_replay_when_the_optimizer_forgets_within_a_long_horizon():
    """b = 1/64 at B = 1024 and kappa = 1 (SGD forgets within a step: psi = 1/x): replay at a long horizon beats
    every on-policy batch the steps cap allows, and its psi is below the equal-steps threshold at its y."""
    w = fg.whole_design(16.0, 1024, MU_QWEN, fg.Memory(1.0, "sgd"), group_size=8, max_horizon=64)
    assert w.winner == "replay" and w.best is w.replay
    d = w.replay.design
    assert d.x >= 8 and w.replay.compute < 0.6 * w.on_policy.compute
    b, y = 16.0 / d.batch_size, d.y  # steps 1 + b (1 + y/x - 1/N) at psi = 1/x, each step mu R + B
    assert w.replay.compute == pytest.approx((1 + b * (1 + y / d.x - 1 / d.capacity)) * (MU_QWEN * d.rollouts_per_step
                                                                                          + d.batch_size), rel=1e-9)
    assert w.replay.psi == pytest.approx(1 / d.x, rel=1e-9)
    assert w.replay.psi < fg.equal_steps_threshold(d.y, MU_QWEN)
    cap = w.max_steps_ratio * w.at_batch.steps
    assert w.replay.steps <= cap and w.on_policy.steps <= cap
    for v in (d.batch_size, d.rollouts_per_step):
        assert v % 8 == 0


def test_forgetting_pick_on_the_language_model_noise_scale():
    """docs/VALIDATION.md's LM: B_noise = 2383 at B = 64 (b = 37.2), groups of 8, mu = 5.28, Adam. With a long memory
    (kappa = 0.01) the rule stays on-policy at B; at kappa = 0.1 a long horizon brings psi under
    psi_c(37.2) = 0.441 (derive forgetting-rule) and replay wins by about 1%."""
    b = 2383 / 64
    on = fg.forgetting_pick(2383, 64, 8, MU_QWEN, 0.01, "adam")
    assert on["regime"] == "on-policy" and (on["rollouts_per_step"], on["capacity"], on["x"]) == (64, 64, 1)
    assert on["cost"] == pytest.approx((1 + b) * (1 + MU_QWEN), rel=RTOL) == on["on_policy_cost"]
    assert on["saving"] == 1.0 and on["b"] == pytest.approx(37.234375, rel=RTOL)
    replay = fg.forgetting_pick(2383, 64, 8, MU_QWEN, 0.1, "adam")
    psi_c = (1 + 1 / b) * fg.loosest_equal_steps(MU_QWEN)[1]
    assert replay["regime"] == "replay" and replay["psi"] < psi_c
    assert 1.0 < replay["saving"] < 1.05 and replay["rollouts_per_step"] % 8 == 0


@pytest.mark.parametrize("call,message", [
    (lambda: fg.psi(0, 0.1), r"^horizon x = N/R must be an integer >= 1, got 0$"),
    (lambda: fg.psi(2.5, 0.1), r"^horizon x = N/R must be an integer >= 1, got 2\.5$"),
    (lambda: fg.psi(4, 0.0), r"^kappa must be a finite number > 0, got 0\.0$"),
    (lambda: fg.psi(4, 2.0), r"^kappa must be < 2 for SGD \(beyond it the step diverges\)"),
    (lambda: fg.psi(4, 0.1, "rmsprop"), r"^optimizer must be one of sgd, momentum, adam, got 'rmsprop'$"),
    (lambda: fg.psi(4, 0.1, "adam", 1.5), r"^beta1 must be in \[0, 0\.999999\], got 1\.5$"),
    (lambda: fg.psi(4, 40.0, "adam"), r"^kappa up to 40 with beta1 = 0\.9 is unstable for adam"),
    (lambda: fg.impulse_autocorrelation([1], -1.0), r"^kappa must be a finite number > 0, got -1\.0$"),
    (lambda: fg.effective_variance(64, 16, 40, 0.1), r"^capacity N must be a multiple of rollouts R, got N=40, R=16$"),
    (lambda: fg.predict(fg.Design(64, 16, 40), 1.0, 1.0, None),
     r"^capacity N must be a multiple of rollouts R, got N=40, R=16$"),
    (lambda: fg.Design(64, 16, 8),
     r"^capacity N must be >= rollouts R \(a FIFO holds at least one step\), got N=8, R=16$"),
    (lambda: fg.Design(64, 16, 64, True), r"^on-policy needs N = R = B, got N=64, R=16, B=64$"),
    (lambda: fg.Design(0, 1, 1), r"^batch B must be an integer >= 1, got 0$"),
    (lambda: fg.Memory(-0.1), r"^kappa must be a finite number > 0, got -0\.1$"),
    (lambda: fg.Memory(0.1, pilot_batch=0.0), r"^pilot batch must be a finite number > 0, got 0\.0$"),
    (lambda: fg.Staleness((0.0, 1.0), (1.0,)), r"^staleness ages and ratios must be equal-length, non-empty$"),
    (lambda: fg.Staleness((2.0, 1.0), (1.0, 1.0)), r"^staleness ages must increase$"),
    (lambda: fg.predict(fg.Design(8, 8, 8), 0.0, 1.0, None), r"^noise scale B_noise must be a finite number > 0"),
    (lambda: fg.predict(fg.Design(8, 8, 8), 1.0, 1.0, None, floor=-1.0), r"^latency floor must be a finite number "),
    (lambda: fg.whole_design(100.0, 60, 1.0, None, group_size=8),
     r"^batch size B must be whole groups of 8, got 60$"),
    (lambda: fg.whole_design(100.0, 64, 1.0, None, max_steps_ratio=0.0), r"^max steps ratio must be a finite "),
    (lambda: fg.kappa_from_curvature_pairs([1.0], [1.0], 0.1, np.random.default_rng(0)),
     r"^numerators and denominators must be equal-length with >= 2 pairs, got 1, 1$"),
    (lambda: fg.kappa_from_gradient_series(np.zeros(4), np.ones(4), np.random.default_rng(0)),
     r"^dots and sq_norms must be equal-length with >= 16 steps, got 4, 4$"),
])
def test_bad_inputs_raise_one_line_value_errors(call, message):
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- the quadratic's exact expected loss


ENV = QuadraticEnv(QuadraticConfig(dim=4, condition=10.0, noise_scale=64.0))
DESIGNS = [  # (N, R, B, on_policy): on-policy; x = 1 with replacement; x = 4; x = 16 (16 steps of start-up)
    (8, 8, 8, True), (4, 4, 8, False), (16, 4, 8, False), (32, 2, 8, False)]


def test_expected_loss_matches_monte_carlo_of_the_replay_sampler():
    """600 seeds of ``QuadraticReplay`` per design at two step sizes: the mean loss at steps 3, 10, 20 and 60 within
    4.5 standard errors of ``expected_loss`` (32 comparisons: a |z| above 4.5 has probability ~2e-4)."""
    rows, checkpoints = 600, (3, 10, 20, 60)
    worst = 0.0
    for lr in (0.5, 1.2):
        for N, R, B, on in DESIGNS:
            exact = expected_loss(ENV, [lr], N, R, B, max(checkpoints), on_policy=on)[0]  # (steps + 1,)
            sampler = QuadraticReplay(ENV, N, R, B, rows, np.random.default_rng([N, R, B, int(lr * 10)]),
                                      on_policy=on)
            params = ENV.init_params(rows)
            for step in range(max(checkpoints)):
                params = params + lr * sampler.gradient(step, params)
                if step + 1 in checkpoints:
                    loss = ENV.evaluate(params)["loss"]
                    z = (loss.mean() - exact[step + 1]) / (loss.std(ddof=1) / math.sqrt(rows))
                    worst = max(worst, abs(z))
                    assert abs(z) < 4.5, (lr, N, R, B, step + 1, loss.mean(), exact[step + 1])
    assert worst > 0.1  # the comparison is live


def test_expected_loss_settles_at_the_stationary_variance_from_psi():
    """After the transient, E F = sum_i h_i eta^2 sigma_i^2 V_eff,i / (2 (1 - a_i^2)) with B V_eff = 1 + y psi(x,
    eta h_i) - 1/N (derive forgetting-variance), 1 on-policy; lr = 1.5 puts a = 1 - eta h below 0 on the stiff
    directions."""
    h, var = ENV.curvature, ENV.noise_var
    for lr in (0.3, 1.0, 1.5):
        a = 1 - lr * h
        steps = int(np.ceil(40 / np.min(1 - a * a))) + 64
        for N, R, B, on in DESIGNS + [(64, 4, 16, False), (12, 3, 2, False)]:
            level = expected_loss(ENV, [lr], N, R, B, steps, on_policy=on)[0, -1]
            if on:
                bv = np.ones_like(h)
            else:
                bv = np.array([fg.effective_variance(B, R, N, lr * hi) for hi in h])
            want = np.sum(h * lr**2 * var * (bv / B) / (2 * (1 - a * a)))
            assert level == pytest.approx(want, rel=1e-9), (lr, N, R, B)
    # the sympy form of the stationary variance, eta^2 V_eff / (1 - a^2), at one direction
    d = derive("forgetting-variance")
    var_fn = _fn(d.parts["variance"], d, "eta", "B", "R", "x", "a", "sigma")
    eta, hi, sig2 = 0.7, h[1], var[1]
    got = var_fn(eta, 8.0, 4.0, 4.0, 1 - eta * hi, math.sqrt(sig2))
    want = eta**2 * sig2 * fg.effective_variance(8, 4, 16, eta * hi) / 8 / (1 - (1 - eta * hi) ** 2)
    assert got == pytest.approx(want, rel=1e-12)


def test_expected_loss_start_up_and_shapes():
    """Step 0 is F(theta_0) = 1; x = 16 and x = 1 agree at step 1 (the buffer holds one generation); a larger
    horizon lowers the stationary loss (psi falls with x at fixed kappa)."""
    out = expected_loss(ENV, [0.2, 0.5], 32, 2, 8, 5, on_policy=False)
    assert out.shape == (2, 6) and np.allclose(out[:, 0], 1.0)
    np.testing.assert_allclose(out[:, 1], expected_loss(ENV, [0.2, 0.5], 2, 2, 8, 1, on_policy=False)[:, 1],
                               rtol=RTOL)
    levels = [expected_loss(ENV, [1.0], 4 * x, 4, 8, 1500, on_policy=False)[0, -1] for x in (1, 2, 4, 16)]
    assert all(b < a for a, b in zip(levels, levels[1:]))
    with pytest.raises(ValueError, match=r"^capacity N must be a multiple of rollouts R, got N=10, R=4$"):
        expected_loss(ENV, [0.5], 10, 4, 8, 5, on_policy=False)
    with pytest.raises(ValueError, match=r"^on-policy needs capacity N = rollouts R = batch B"):
        expected_loss(ENV, [0.5], 8, 4, 8, 5, on_policy=True)


def test_the_horizon_that_minimises_noise_times_staleness():
    """derive forgetting-rule: with r(s) = 1 + c s, m(x) = 1 + c (x - 1)/2 and, at horizons long against the memory
    (psi ~ tau/x), the noise (1 + y tau/x) m(x) is least at x* = sqrt(tau y (2 - c)/c). SGD at kappa = 1 forgets
    within a step (psi = 1/x exactly, tau = 1): ``predict``'s integer argmin is x* to rounding; at kappa = 0.5
    (tau = 3) the neglected O(1/x^2) of psi moves it by < 5%. Flat staleness: no interior minimum in x."""
    d = derive("forgetting-rule")
    x_star = _fn(d.parts["x_star"], d, "tau", "y", "c")
    m_x = _fn(d.parts["staleness_mean"], d, "c", "x")
    xs = np.arange(1, 400)
    for kappa, c, tol in ((1.0, 0.002, 0.5), (1.0, 0.02, 0.5), (0.5, 0.01, 0.05 * 49)):
        staleness = fg.Staleness((0.0, 1.0), (1.0, 1.0 + c))  # extrapolated by its slope: r(s) = 1 + c s
        assert [staleness.mean(int(x)) for x in (1, 7, 40)] == pytest.approx([m_x(c, x) for x in (1, 7, 40)],
                                                                              rel=RTOL)
        preds = fg.predict_many([fg.Design(64, 16, 16 * int(x)) for x in xs], 100.0, MU_QWEN, fg.Memory(kappa),
                                staleness)
        best = xs[np.argmin([p.steps for p in preds])]
        want = x_star((2 - kappa) / kappa, 4.0, c)
        assert abs(best - want) <= tol, (kappa, c, best, want)
    flat = fg.predict_many([fg.Design(64, 16, 16 * int(x)) for x in xs], 100.0, MU_QWEN, fg.Memory(0.5))
    assert np.all(np.diff([p.steps for p in flat]) < 0)  # psi falls with x: the longest horizon wins
    assert d.parts["x_star_flat"] == sympy.oo


def test_staleness_beyond_its_table_rises_along_a_rising_end_and_holds_a_falling_one():
    rising = fg.Staleness((0.0, 1.0, 2.0), (1.0, 1.5, 2.0))
    assert rising.at([4.0]) == pytest.approx([3.0])  # the last slope 0.5 per step, extended
    falling = fg.Staleness((0.0, 1.0), (1.0, 0.35))  # a noisy two-point table from a short log
    assert falling.at([1.0, 8.0, 100.0]) == pytest.approx([0.35, 0.35, 0.35])  # never below 0, never falling on
    assert falling.means(np.array([4]), 3.0)[0] == pytest.approx((1.0 + 0.35 * 3) / 4)


@pytest.mark.parametrize("floor, memory", [(0.0, None), (3000.0, None), (3000.0, fg.Memory(0.3, "sgd")),
                                           (700.0, fg.Memory(0.05, "adam", 0.9, 512.0))])
def test_the_bracketed_batch_search_finds_what_enumerating_every_batch_finds(monkeypatch, floor, memory):
    """Beyond DENSE_LIMIT whole groups the on-policy search brackets instead of scoring every batch (time and memory
    independent of B): with the limit lowered to 64, the bracketed pick equals the exhaustive one (limit left as is)
    at B = 512 in groups of 4 (512 candidate batches), with and without a floor (convex below it) and a memory."""
    exhaustive = fg.whole_design(2383.0, 512, 5.28, memory, group_size=4, floor=floor)
    monkeypatch.setattr(fg, "DENSE_LIMIT", 64)
    bracketed = fg.whole_design(2383.0, 512, 5.28, memory, group_size=4, floor=floor)
    assert bracketed.on_policy.design == exhaustive.on_policy.design
    assert bracketed.on_policy.compute == exhaustive.on_policy.compute


def test_whole_groups_between_matches_the_mask_over_every_group():
    """``_groups_between`` (arithmetic) against the boolean mask it replaces, at edges that land exactly on a group."""
    for group, top in ((1, 100), (8, 2048), (3, 999)):
        groups = np.arange(group, top + 1, group)
        for low, high in ((5.0, 37.5), (16.0, 16.0), (64 / 2 ** 0.25, 64 * 2 ** 0.25), (0.5, 1e9), (50.0, 10.0)):
            inside = groups[(groups >= low) & (groups <= high)]
            first, last = fg._groups_between(low, high, group, top)
            assert list(range(first, last + 1, group)) == [int(v) for v in inside]
            got = fg._log_groups(first, last, group, 4)
            assert got == (fg._log_subset(inside, 4) if inside.size else [])


def test_log_groups_without_the_array_picks_what_the_array_picks(monkeypatch):
    """Above DENSE_LIMIT values the log grid snaps to the nearest whole group by arithmetic; lowered to 8, it gives the
    argmin over the materialised array (one sample a group: no ties between two neighbours)."""
    cases = [(1, 5000, 1, 4), (1, 5000, 1, 16), (7, 123457, 1, 8)]
    dense = [fg._log_groups(*c) for c in cases]
    monkeypatch.setattr(fg, "DENSE_LIMIT", 8)
    assert [fg._log_groups(*c) for c in cases] == dense


@pytest.mark.parametrize("optimizer, kappa, pilot", [("sgd", 0.3, 256.0), ("adam", 3.0, 64.0), ("momentum", 0.1, None)])
def test_the_array_search_picks_what_a_loop_over_every_prediction_picks(optimizer, kappa, pilot):
    """``_Scorer.cheapest`` (the searches' argmin over the priced arrays, only the winner made a Prediction) against
    min over every ``predict_many`` prediction within the budget, ties to the first, a rival appended last; and the
    cached coarse replay grid against the list built afresh, at two noise scales each."""
    memory = fg.Memory(kappa, optimizer, 0.9, pilot)
    table = fg.Staleness((0, 1, 2, 4, 8, 16), (1.0, 1.02, 1.05, 1.1, 1.3, 1.9), "a table")
    for b_noise, floor in ((40.0, 0.0), (900.0, 64.0)):
        score = fg._Scorer(b_noise, 5.28, memory, table, floor, 0.0)
        grid, cols = fg._replay_grid(256, 8, 32, 0.0, math.inf)
        fresh = [fg.Design(bb, rr, rr * x) for bb in fg._log_groups(8, 256, 8, 4) for rr in fg._log_groups(8, bb, 8, 4)
                 for x in fg._horizons(32) if not (rr == bb and x == 1)]
        assert list(grid) == fresh
        every = score(fresh)
        ref = every[len(every) // 2]
        within = fg._Budget(1.5 * ref.steps, 1.2 * ref.work)
        allowed = [p for p in every if fg.within_budgets(p, within.cap, within.work_cap)]
        assert 0 < len(allowed) < len(every)  # the budget binds
        naive = min(allowed, key=lambda p: p.compute)
        assert score.cheapest(grid, within, cols) == naive  # bit for bit: Prediction's fields are floats
        rival = dataclasses.replace(naive, compute=naive.compute)  # a tie: the list's own design wins
        assert score.cheapest(fresh, within, rival=rival) is not rival
        cheaper = dataclasses.replace(naive, compute=naive.compute / 2)
        assert score.cheapest(fresh, within, rival=cheaper) is cheaper
        assert score.cheapest([], within, rival=cheaper) is cheaper


def test_staleness_means_at_fixed_horizons_equal_the_mean_over_each_fifos_ages():
    """``Staleness.means_of`` (the held ages found once, r evaluated only there) against the mean over s < x of
    r(s scale), one design at a time."""
    table = fg.Staleness((0, 1, 4, 16), (1.0, 1.1, 1.3, 2.5), "a table")
    rng = np.random.default_rng(3)
    x = rng.integers(1, 70, size=40)
    scale = rng.uniform(0.2, 3.0, size=40)
    means = table.means_of(x)
    for s in (scale, 1.0):
        got = means(s)
        want = [np.mean(table.at(np.arange(h) * sc)) for h, sc in zip(x, np.broadcast_to(s, x.shape))]
        np.testing.assert_allclose(got, want, rtol=1e-14)
    np.testing.assert_array_equal(fg.Staleness().means_of(x)(scale), np.ones(40))

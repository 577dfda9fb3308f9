"""The reuse families of issue 40 (theory/reuse_families.py): epochs over mini-batches, a delayed drift (bounded
staleness) and selective replay, each against a literal simulation of the linear model: the optimizer's own update
loop along one direction (h = 1) fed the schedule's noise, many seeded chains at once. Each asserts the closed form
within 5% and within 4.5 standard errors, the standard error from the spread of the chains' time averages. Closed
forms are also checked against the lag sums (``forgetting.impulse_autocorrelation``) and sympy.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy

from replay_theory.theory import forgetting as fg
from replay_theory.theory import reuse_families as rf
from replay_theory.theory.compute import refill_rounds

BETA = 0.9
Z_MAX = 4.5
REL_MAX = 0.05


class _Optimizer:
    """The literal update along one direction, h = 1: SGD e <- e - eta g (eta = kappa); Adam's first moment
    m <- beta m + (1 - beta) g, e <- e - eta m, second moment frozen at 1 (eta = kappa). ``drift`` is the error the
    gradient sees (e itself without a delay)."""

    def __init__(self, optimizer: str, kappa: float, chains: int):
        self.optimizer, self.eta = optimizer, kappa
        self.e, self.m = np.zeros(chains), np.zeros(chains)

    def step(self, drift: np.ndarray, noise: np.ndarray) -> np.ndarray:
        g = drift + noise
        if self.optimizer == "sgd":
            self.e = self.e - self.eta * g
        else:
            self.m = BETA * self.m + (1 - BETA) * g
            self.e = self.e - self.eta * self.m
        return self.e


def _fresh_variance(kappa: float, optimizer: str) -> float:
    """Var e of on-policy updates with unit-variance fresh noise: eta^2 P[0, 0] (the Lyapunov solution of
    ``forgetting``'s system, not the families' formulas)."""
    from scipy.linalg import solve_discrete_lyapunov

    a, b, c = fg._linear_system(kappa, optimizer, BETA)
    return kappa**2 * float(c @ solve_discrete_lyapunov(a, np.outer(b, b)) @ c)


def _burn(kappa: float) -> int:
    """Steps to forget the zero start: 12 memories of 1/kappa, plus Adam's 1/(1 - beta) ten times over."""
    return int(12 / kappa) + 100


def _summary(sums: np.ndarray, count: int, scale: float) -> tuple[float, float]:
    """(mean, standard error) over chains of each chain's time average, divided by ``scale``."""
    per_chain = sums / count / scale
    return float(per_chain.mean()), float(per_chain.std(ddof=1) / math.sqrt(per_chain.size))


def _assert_close(closed: float, mean: float, se: float, label: str) -> None:
    assert abs(mean - closed) <= REL_MAX * closed, (label, closed, mean, se)
    assert abs(mean - closed) <= Z_MAX * se, (label, closed, mean, se, (mean - closed) / se)


# --------------------------------------------------------------------------- epochs


def simulate_epochs(epochs: int, minibatches: int, kappa: float, optimizer: str, shuffle: bool,
                    rng: np.random.Generator, chains: int = 2000, generations: int = 0) -> tuple[float, float]:
    """psi_E measured: e passes over m one-sample mini-batches per generation (b = 1, R = m), a fresh permutation
    per pass when ``shuffle``; Var e averaged over whole generations after a burn-in, over the fresh-noise Var e."""
    e_, m = epochs, minibatches
    burn = -(-_burn(kappa) // (e_ * m))
    generations = generations or max(40, 3000 // (e_ * m))
    opt = _Optimizer(optimizer, kappa, chains)
    sums = np.zeros(chains)
    rows = np.arange(chains)[:, None]
    for gen in range(burn + generations):
        xi = rng.standard_normal((chains, m))
        for _ in range(e_):
            order = rng.permuted(np.broadcast_to(np.arange(m), (chains, m)), axis=1) if shuffle else None
            noise = xi[rows, order] if shuffle else xi
            for j in range(m):
                err = opt.step(opt.e, noise[:, j])
                if gen >= burn:
                    sums += err * err
    return _summary(sums, generations * e_ * m, _fresh_variance(kappa, optimizer))


EPOCH_POINTS = [  # (e, m, kappa, optimizer, shuffle)
    (2, 1, 0.05, "sgd", False), (4, 1, 0.2, "sgd", False), (4, 4, 0.05, "sgd", True), (2, 4, 0.5, "sgd", False),
    (4, 4, 0.2, "sgd", True), (2, 1, 0.2, "adam", False), (4, 4, 0.05, "adam", False), (4, 4, 0.2, "adam", True),
    (2, 4, 0.5, "adam", True)]


@pytest.mark.parametrize("point", EPOCH_POINTS, ids=lambda p: "e{}-m{}-k{}-{}-{}".format(*p))
def test_psi_epochs_matches_the_literal_schedule(point):
    e_, m, kappa, optimizer, shuffle = point
    rng = np.random.default_rng([40, e_, m, int(kappa * 100), optimizer == "adam", shuffle])
    closed = rf.psi_epochs(e_, m, kappa, optimizer, BETA, shuffle=shuffle)
    mean, se = simulate_epochs(e_, m, kappa, optimizer, shuffle, rng)
    _assert_close(closed, mean, se, point)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_psi_epochs_closed_form_is_the_lag_sum(optimizer, shuffle):
    """The modes' finite sums against sum_l W[l] rho(l) with rho from ``forgetting.impulse_autocorrelation``."""
    for e_, m, kappa in [(1, 3, 0.3), (2, 1, 0.2), (3, 2, 0.5), (4, 4, 0.05), (5, 3, 1.3), (8, 16, 0.01)]:
        got = rf.psi_epochs(e_, m, kappa, optimizer, BETA, shuffle=shuffle)
        want = rf.psi_epochs_from_lags(e_, m, kappa, optimizer, BETA, shuffle=shuffle)
        assert got == pytest.approx(want, rel=1e-10), (e_, m, kappa)
    grid = rf.psi_epochs(np.array([2, 4]), np.array([[1], [4]]), 0.1, optimizer, BETA, shuffle=shuffle)
    assert grid[1, 1] == pytest.approx(rf.psi_epochs(4, 4, 0.1, optimizer, BETA, shuffle=shuffle), rel=1e-14)


def test_psi_epochs_limits_and_the_fifo_identity():
    """e = 1: no reuse, 1. SGD in a fixed order: e psi(e, kappa_m), 1 - kappa_m = (1 - kappa)^m. kappa -> 0: e (the
    optimizer keeps every use); SGD at kappa = 1 forgets within an update: 1. Shuffling at m = 1 changes nothing."""
    for m in (1, 3):
        assert rf.psi_epochs(1, m, 0.3) == 1.0
    for e_, m, kappa in [(2, 1, 0.2), (4, 1, 0.05), (3, 4, 0.3), (6, 2, 0.7)]:
        kappa_m = 1 - (1 - kappa) ** m
        assert rf.psi_epochs(e_, m, kappa) == pytest.approx(e_ * fg.psi(e_, kappa_m), rel=1e-12)
        assert rf.psi_epochs(e_, 1, kappa, shuffle=True) == pytest.approx(rf.psi_epochs(e_, 1, kappa), rel=1e-14)
    for optimizer in ("sgd", "adam"):
        assert rf.psi_epochs(4, 4, 1e-7, optimizer, shuffle=True) == pytest.approx(4.0, rel=1e-5)
    assert rf.psi_epochs(4, 4, 1.0) == 1.0 and rf.psi_epochs(4, 4, 1.0, shuffle=True) == 1.0
    w = rf.epoch_lag_weights(3, 4, shuffle=True)
    assert w.sum() == pytest.approx(3.0) and w[0] == 1.0  # (1/e) e^2 ordered pairs


def test_psi_epochs_at_two_epochs_matches_sympy():
    """e = 2, SGD: psi_E = 1 + E a^{m + D} = 1 + a^m (fixed), 1 + a (1 - a^m)^2 / (m^2 (1 - a)^2) (shuffled), from
    the pair sum over the two uses with sympy's exact sum over the mini-batch positions."""
    a, mm = sympy.symbols("a m", positive=True)
    u, v = sympy.symbols("u v", integer=True, nonnegative=True)
    for m in (1, 2, 5):
        pair = sympy.Rational(1, m * m) * sympy.summation(sympy.summation(a ** (m + v - u), (u, 0, m - 1)),
                                                          (v, 0, m - 1))
        shuffled = sympy.simplify(1 + pair)
        closed = 1 + a * (1 - a**mm) ** 2 / (mm**2 * (1 - a) ** 2)
        assert sympy.simplify(shuffled - closed.subs(mm, m)) == 0
        f = sympy.lambdify(a, shuffled)
        for kappa in (0.05, 0.3, 1.2):
            assert rf.psi_epochs(2, m, kappa, shuffle=True) == pytest.approx(f(1 - kappa), rel=1e-12)
            assert rf.psi_epochs(2, m, kappa) == pytest.approx(1 + (1 - kappa) ** m, rel=1e-12)


# --------------------------------------------------------------------------- bounded staleness


def simulate_delay(delay: int, kappa: float, optimizer: str, spread: str, rng: np.random.Generator,
                   chains: int = 2000, steps: int = 3000) -> tuple[float, float]:
    """Var e of the delayed update (the drift seen at ages 0..k per ``spread``) over that of no delay."""
    opt = _Optimizer(optimizer, kappa, chains)
    history = np.zeros((chains, delay + 1))  # column s holds e_{t-s}
    weights = rf.delay_weights(delay, spread)
    rows = np.arange(chains)
    burn, sums = _burn(kappa), np.zeros(chains)
    for t in range(burn + steps):
        if spread == "random":
            drift = history[rows, rng.integers(0, delay + 1, chains)]
        else:
            drift = history @ weights
        err = opt.step(drift, rng.standard_normal(chains))
        history = np.concatenate([err[:, None], history[:, :-1]], axis=1)
        if t >= burn:
            sums += err * err
    return _summary(sums, steps, _fresh_variance(kappa, optimizer))


DELAY_POINTS = [  # (k, kappa, optimizer, spread)
    (1, 0.05, "sgd", "fixed"), (1, 0.5, "sgd", "fixed"), (3, 0.2, "sgd", "fixed"), (4, 0.2, "sgd", "mixed"),
    (2, 0.5, "sgd", "random"), (1, 0.2, "adam", "fixed"), (3, 0.05, "adam", "fixed"), (4, 0.2, "adam", "mixed"),
    (2, 0.2, "adam", "random")]


@pytest.mark.parametrize("point", DELAY_POINTS, ids=lambda p: "k{}-k{}-{}-{}".format(*p))
def test_delay_variance_ratio_matches_the_literal_recursion(point):
    k, kappa, optimizer, spread = point
    rng = np.random.default_rng([41, k, int(kappa * 100), optimizer == "adam", rf.SPREADS.index(spread)])
    closed = rf.delay_variance_ratio(kappa, k, spread, optimizer, BETA)
    mean, se = simulate_delay(k, kappa, optimizer, spread, rng)
    _assert_close(closed, mean, se, point)


def test_delay_closed_forms_and_stable_range():
    """w = [1] is forgetting's system; SGD k = 1: the AR(2) variance ratio (sympy's Lyapunov solution); the fixed
    delay's stable limit 2 sin(pi / (2 (2k + 1))) (the root of z^{k+1} - z^k + kappa on the unit circle)."""
    kap = sympy.symbols("kappa", positive=True)
    p00, p01, p11 = sympy.symbols("p00 p01 p11")
    a = sympy.Matrix([[1, -kap], [1, 0]])
    b = sympy.Matrix([-1, 0])
    p = sympy.Matrix([[p00, p01], [p01, p11]])
    sol = sympy.solve(list(a * p * a.T + b * b.T - p), [p00, p01, p11], dict=True)[0]
    ratio = sympy.simplify(sol[p00] * (1 - (1 - kap) ** 2))
    assert sympy.simplify(ratio - (1 + kap) * (2 - kap) / ((1 - kap) * (2 + kap))) == 0
    for kappa in (0.05, 0.3, 0.9):
        assert rf.delay_variance_ratio(kappa, 1) == pytest.approx(float(ratio.subs(kap, kappa)), rel=1e-10)
        for optimizer in ("sgd", "momentum", "adam"):
            assert rf.delay_variance_ratio(kappa, 0, "mixed", optimizer) == 1.0
            assert rf.delay_variance_ratio(kappa, 3, optimizer=optimizer, weights=[1, 0, 0, 0]) == pytest.approx(
                1.0, rel=1e-12)
            want = fg._linear_system(kappa, optimizer, BETA)[0]
            a, _ = rf.delayed_system(kappa, [1.0], optimizer, BETA)
            np.testing.assert_allclose(a, want, rtol=1e-14)
    for k in range(5):
        assert rf.delay_stable_kappa(k) == pytest.approx(2 * math.sin(math.pi / (2 * (2 * k + 1))), rel=1e-8)
    limit = rf.delay_stable_kappa(2, "fixed", "adam")
    assert math.isfinite(rf.delay_variance_ratio(0.99 * limit, 2, "fixed", "adam"))
    assert rf.delay_variance_ratio(1.01 * limit, 2, "fixed", "adam") == math.inf
    with pytest.raises(ValueError):
        rf.delayed_system(0.1, [0.5, 0.4])


# --------------------------------------------------------------------------- selective replay


def simulate_filtered(batch: int, rollouts: int, capacity: int, zero_share: float, kappa: float, optimizer: str,
                      selective: bool, rng: np.random.Generator, chains: int = 600,
                      steps: int = 2000) -> tuple[float, float]:
    """Var e of a FIFO fed R rollouts a step, (1 - z) R of them informative (the rest zero-advantage: no gradient),
    B drawn uniformly with replacement; ``selective`` keeps only the informative ones in the FIFO. Over the
    prediction kappa_eff^2 P00(kappa_eff) B V_eff / B of ``filtered_noise``."""
    kept = round((1 - zero_share) * rollouts)
    fresh = kept if selective else rollouts
    informative = (np.arange(capacity) % fresh) < kept if not selective else np.ones(capacity, bool)
    buffer = rng.standard_normal((chains, capacity))
    opt = _Optimizer(optimizer, kappa, chains)
    rows = np.arange(chains)[:, None]
    burn, sums = _burn(kappa), np.zeros(chains)
    for t in range(burn + steps):
        slots_in = (t * fresh + np.arange(fresh)) % capacity  # the FIFO's oldest fresh slots (N need not be x R')
        buffer[:, slots_in] = rng.standard_normal((chains, fresh))
        slots = rng.integers(0, capacity, (chains, batch))
        used = informative[slots]
        share = used.mean(axis=1)
        err = opt.step(share * opt.e, (buffer[rows, slots] * used).mean(axis=1))
        if t >= burn:
            sums += err * err
    pred = rf.filtered_noise(batch, rollouts, capacity, zero_share, kappa, optimizer, BETA, selective=selective)
    scale = _fresh_variance(pred.kappa, optimizer) * pred.bv / batch  # eta_eff = kappa_eff at h = 1
    return _summary(sums, steps, scale)


FILTER_POINTS = [  # (B, R, N, z, kappa, optimizer, selective)
    (16, 4, 16, 0.25, 0.05, "sgd", False), (16, 4, 16, 0.5, 0.5, "sgd", False), (16, 4, 12, 0.25, 0.2, "sgd", True),
    (16, 4, 16, 0.5, 0.2, "sgd", True), (16, 4, 16, 0.25, 0.2, "adam", False), (16, 4, 24, 0.5, 0.05, "adam", True),
    (16, 8, 24, 0.25, 0.5, "adam", True), (16, 8, 24, 0.25, 0.5, "adam", False),
    # between whole stays ([E10]): x = N / ((1 - z) R) = 16/6, 40/6, 18/4, 28/6, 20/6, 10/4
    (16, 8, 16, 0.25, 0.2, "sgd", True), (16, 8, 40, 0.25, 0.05, "sgd", True), (16, 8, 18, 0.5, 0.5, "sgd", True),
    (16, 8, 28, 0.25, 0.1, "adam", True), (16, 8, 20, 0.25, 0.3, "adam", True), (16, 8, 10, 0.5, 0.2, "sgd", True)]


@pytest.mark.parametrize("point", FILTER_POINTS, ids=lambda p: "B{}-R{}-N{}-z{}-k{}-{}-{}".format(*p))
def test_filtered_noise_matches_the_literal_fifo(point):
    *design, kappa, optimizer, selective = point
    rng = np.random.default_rng([42, *design[:3], int(design[3] * 100), int(kappa * 100), optimizer == "adam",
                                 selective])
    mean, se = simulate_filtered(*design, kappa, optimizer, selective, rng)
    _assert_close(1.0, mean, se, point)


def test_filtered_noise_hand_values():
    kept = rf.filtered_noise(32, 8, 32, 0.25, 0.2, selective=False)
    assert kept.kappa == pytest.approx(0.15) and kept.horizon == 4 and kept.reuse == 4
    assert kept.bv == pytest.approx(fg.effective_variance(32, 8, 32, 0.15) / 0.75, rel=1e-14)
    dropped = rf.filtered_noise(32, 8, 24, 0.25, 0.2, selective=True)
    assert dropped.kappa == 0.2 and dropped.horizon == 4 and dropped.reuse == pytest.approx(32 / 6)
    assert dropped.bv == pytest.approx(fg.effective_variance(32, 6, 24, 0.2), rel=1e-14)
    assert rf.filtered_noise(32, 32, 32, 0.5, 0.2, selective=False, on_policy=True).bv == 2.0
    assert rf.filtered_noise(32, 32, 32, 0.5, 0.2, selective=True, on_policy=True).bv == 1.0


def simulate_on_policy_filtered(batch: int, group: int, zero_share: float, kappa: float, optimizer: str,
                                dynamic: bool, rng: np.random.Generator, chains: int = 1000,
                                steps: int = 1000) -> tuple[float, float, float]:
    """Var e of on-policy updates over B = g G fresh rollouts in groups of G, each group of equal rewards (no
    gradient: neither drift nor noise) with probability z independently. Kept [E7]/[E9]: the mean over all B, so
    the informative share of drift and noise is binomial over the g groups. Dynamic sampling [E9]/[E11]: rounds of g
    groups until g informative ones are in hand (generation order), the update on those B alone. Over the
    prediction of ``filtered_noise(..., on_policy=True)``; third: the mean rounds an update took (kept: 1)."""
    need = batch // group
    opt = _Optimizer(optimizer, kappa, chains)
    burn, sums, rounds = _burn(kappa), np.zeros(chains), np.zeros(chains)
    for t in range(burn + steps):
        if dynamic:
            have, drawn = np.zeros(chains, int), np.zeros(chains, int)
            noise = np.zeros(chains)
            while (have < need).any():  # every chain draws a round until its batch is full
                open_ = have < need  # (chains,)
                informative = rng.random((chains, need)) >= zero_share  # (chains, g) this round's groups
                xi = rng.standard_normal((chains, need, group)).sum(axis=2)  # (chains, g) each group's noise sum
                take = informative & (np.cumsum(informative, axis=1) + have[:, None] <= need) & open_[:, None]
                noise += (xi * take).sum(axis=1)
                have += take.sum(axis=1)
                drawn += open_
            err = opt.step(opt.e, noise / batch)
        else:
            informative = rng.random((chains, need)) >= zero_share  # (chains, g)
            xi = rng.standard_normal((chains, need, group)).sum(axis=2)
            share = informative.mean(axis=1)
            err = opt.step(share * opt.e, (xi * informative).sum(axis=1) / batch)
            drawn = np.ones(chains)
        if t >= burn:
            sums += err * err
            rounds += drawn
    pred = rf.filtered_noise(batch, batch, batch, zero_share, kappa, optimizer, BETA, selective=dynamic,
                             on_policy=True)
    mean, se = _summary(sums, steps, _fresh_variance(pred.kappa, optimizer) * pred.bv / batch)
    return mean, se, float(rounds.mean() / steps)


ON_POLICY_POINTS = [  # (B, G, z, kappa, optimizer, dynamic)
    (16, 4, 0.25, 0.05, "sgd", False), (16, 4, 0.5, 0.2, "sgd", False), (32, 4, 0.5, 0.5, "sgd", False),
    (16, 4, 0.25, 0.2, "adam", False), (32, 8, 0.5, 0.05, "adam", False),
    (16, 4, 0.25, 0.05, "sgd", True), (16, 4, 0.5, 0.2, "sgd", True), (32, 4, 0.5, 0.5, "sgd", True),
    (16, 4, 0.25, 0.2, "adam", True), (32, 8, 0.5, 0.05, "adam", True)]


def _kept_spread(groups: int, zero_share: float, kappa: float) -> float:
    """SGD keeping the zero groups, exactly: the informative share s of an update is Bin(g, 1 - z) / g, so e' = (1 -
    kappa s) e - kappa n with Var(n | s) = s / B, and Var e = kappa^2 E s / B / (1 - E (1 - kappa s)^2). Over the
    model's fixed share s = 1 - z: (2 - kappa (1 - z)) / (2 - kappa (1 - z) - kappa Var(s) / E s), Var(s) / E s =
    z / g: the binomial spread the model leaves out, 1.3% at g = 4, z = 0.5, kappa = 0.2."""
    s_bar = 1 - zero_share
    return (2 - kappa * s_bar) / (2 - kappa * s_bar - kappa * zero_share / groups)


def _on_policy_rng(point) -> np.random.Generator:
    b, g, z, kappa, optimizer, dynamic = point
    return np.random.default_rng([44, b, g, int(z * 100), int(kappa * 100), optimizer == "adam", dynamic])


@pytest.mark.parametrize("point", ON_POLICY_POINTS, ids=lambda p: "B{}-G{}-z{}-k{}-{}-dyn{}".format(*p))
def test_on_policy_filtered_noise_matches_the_literal_loop(point):
    """[E9] in the linear model: keeping the zero groups is on-policy at (1 - z) kappa with 1 / (1 - z) the noise;
    dynamic sampling is on-policy at kappa with B informative samples (psi = 1, the refill selects groups by their
    rewards, not their noise), its rounds those of ``compute.refill_rounds``."""
    b, g, z, kappa, optimizer, dynamic = point
    mean, se, rounds = simulate_on_policy_filtered(b, g, z, kappa, optimizer, dynamic, _on_policy_rng(point))
    assert abs(mean - 1.0) <= REL_MAX, (point, mean, se)  # the model the rule prices, within 5%
    _assert_close(_kept_spread(b // g, z, kappa) if optimizer == "sgd" and not dynamic else 1.0, mean, se, point)
    if dynamic:  # the loop's rounds against the exact E[T] (the steps' average: well inside 2%)
        assert rounds == pytest.approx(float(refill_rounds(b // g, z)), rel=0.02)


def _print_filtered() -> None:
    """The literal FIFO's variance over ``filtered_noise``'s prediction at every FILTER_POINTS point, then the literal
    on-policy loop's at every ON_POLICY_POINTS point, each with its standard error (docs/THEORY.md [E8]-[E11] quote
    these): ``python tests/unit/test_reuse_families.py``."""
    for point in FILTER_POINTS:
        *design, kappa, optimizer, selective = point
        rng = np.random.default_rng([42, *design[:3], int(design[3] * 100), int(kappa * 100), optimizer == "adam",
                                     selective])
        mean, se = simulate_filtered(*design, kappa, optimizer, selective, rng)
        b, r, n, z = design
        horizon = n / ((1 - z) * r) if selective else n / r
        print(f"B={b} R={r} N={n} z={z} kappa={kappa} {optimizer} {'dropped' if selective else 'kept'}: "
              f"x = {horizon:.3g}, measured / predicted {mean:.3f} +- {se:.3f}")
    for point in ON_POLICY_POINTS:  # [E9] on-policy: kept (the SGD spread's exact value beside) and dynamic
        b, g, z, kappa, optimizer, dynamic = point
        mean, se, rounds = simulate_on_policy_filtered(*point[:5], dynamic, _on_policy_rng(point))
        extra = (f", rounds {rounds:.3f} (E[T] {float(refill_rounds(b // g, z)):.3f})" if dynamic else
                 f" (with the share's spread: {_kept_spread(b // g, z, kappa):.3f})" if optimizer == "sgd" else "")
        print(f"on-policy B={b} G={g} z={z} kappa={kappa} {optimizer} {'dynamic' if dynamic else 'kept'}: "
              f"measured / predicted {mean:.3f} +- {se:.3f}{extra}")


if __name__ == "__main__":
    _print_filtered()

"""Forgetting: how much of a replay buffer's batch noise the optimizer keeps, and the design rule built on it.

Sources: McCandlish et al. 2018 (arXiv 1812.06162), Eq. 2.7 (S = S_min (1 + B_noise V)) and Eq. 2.6 (the tuned step
falls as eta_max / (1 + B_noise / B)); the experience-replay paper's synchronous FIFO (Sec. 3); the FIFO
autocovariance C(k) = sigma^2 (N - kR)_+ / N^2 of ``theory/noise_scale.py`` (a stored sample's noise is fixed when
drawn).  Derivations: ``replay-theory derive forgetting-variance | forgetting-rule | free-batch``; docs/THEORY.md,
"Forgetting".  An optimizer that contracts the error along a direction by a = 1 - kappa per step keeps the noise
V_eff = C(0) + 2 sum_k rho(k) C(k), rho(k) the autocorrelation of its impulse response (a^k for SGD); with N = x R
and y = B / R:

    B V_eff = 1 + y psi(x, kappa) - 1/N,   psi = 1/x + (2 / x^2) sum_{k=1}^{x-1} (x - k) rho(k)   (in [1/x, 1], a >= 0)

psi -> 1 (``noise_scale``'s long-run variance) when x is short against the memory 1/kappa, psi ~ 2 / (kappa x) when
long.  On-policy without replacement has B V = 1.

An epoch design (e passes over m mini-batches of one generation, issue 40) keeps B V_eff = psi_E(e, m, kappa)
(``psi_epochs``; docs/THEORY.md "Reuse families", whose other families live in ``theory/reuse_families.py``).
An overlapped design (generation k updates ahead on its own share gamma of the GPUs, each rollout used once at age
k) keeps B V = r(k) and a step takes max(mu R_floor, mu R + B) of the whole pool's time (``overlapped_split``).
A selective design (a FIFO admitting only groups with unequal rewards, a share 1 - z of them, [E8]) is the FIFO over
informative samples: R' = (1 - z) R enter a step, x = N / R' (``psi_fractional`` [E10] between whole steps), y =
B / R', and its noise scale (1 - z) B_noise (the measured one counts the zero-advantage groups' missing signal); every
generated R is charged.

| code name          | symbol                          | meaning                                                   |
|--------------------|---------------------------------|-----------------------------------------------------------|
| ``kappa``          | kappa = eta lambda_eff          | per-step contraction along the noise; memory 1/kappa steps |
| ``lambda_eff``     | tr(H Sigma) / tr Sigma          | the curvature the noise sees                              |
| ``optimizer``      | --                              | sgd (rho = a^k), momentum (heavy ball), adam (linearised)  |
| ``beta1``          | beta_1                          | momentum / Adam's first-moment decay                      |
| ``psi``            | psi(x, kappa)                   | share of replay's extra noise the optimizer keeps         |
| ``b``              | B_noise / B                     | noise scale in units of the batch                         |
| ``staleness``      | r(s) = sigma^2(s) / sigma^2(0)  | noise growth with a sample's age (IS: 1 + chi^2(s))       |
| ``floor``          | R_floor                         | generation latency floor, in rollouts                     |
| ``step_exponent``  | alpha                           | tuned step ~ eta_max / (1 + B_noise V)^alpha              |
| ``zero_share``     | z                               | share of groups with equal rewards (TRL frac_reward_zero_std) |

Units: batches, rollouts and capacities in samples (responses); compute in units of one sample's update on the
whole GPU pool (so also its time: the floor is time the pool waits), a step costs mu max(R, R_floor) + B, an
overlapped step max(mu R_floor, mu R + B); steps relative to S_min. Work is the same count without the floor's
waiting, mu R / (e m) + B a step (mu R + B overlapped): the GPU time spent generating and training, which a pool
shared with other jobs, or priced by use, pays instead of the time it is held (``Prediction.work``, [W1]).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from ..checks import (
    require_finite,
    require_in_range,
    require_int,
    require_nonnegative,
    require_one_of,
    require_positive,
    require_unit_interval,
)
from .compute import refill_rounds
from .designs import Design

OPTIMIZERS = ("sgd", "momentum", "adam")
STEP_EXPONENT = {"sgd": 1.0, "momentum": 1.0, "adam": 0.5}
"""alpha of the tuned-step feedback: McCandlish Eq. 2.6 gives eta_opt = eta_max / (1 + B_noise / B) for SGD; for
Adam-style (sign-like) updates the tuned step falls more slowly with the noise, about as its square root
(McCandlish App. E; Li et al. 2024, arXiv 2405.14578). The benchmark reports the measured exponent beside it."""

# --------------------------------------------------------------------------- the optimizer's memory


def _check_optimizer(optimizer: str, beta1: float) -> None:
    require_one_of("optimizer", optimizer, OPTIMIZERS)
    if optimizer != "sgd":
        require_in_range("beta1", float(beta1), 0.0, 0.999999)


def stable_kappa(optimizer: str, beta1: float = 0.9) -> float:
    """The largest kappa ``psi`` accepts, just inside the stability limit along the noise: 2 for SGD (a = 1 - kappa >
    -1), 2 (1 + beta1) / (1 - beta1) for heavy ball and Adam (A's eigenvalue -1 at eta h = 2 (1 + beta1))."""
    _check_optimizer(optimizer, beta1)
    limit = 2.0 if optimizer == "sgd" else 2.0 * (1.0 + beta1) / (1.0 - beta1)
    return limit * (1.0 - 1e-9)


TUNED_KAPPA = {"sgd": 1.0}
"""The largest kappa a tuned step reaches without noise, where the linear model bounds it below the stability limit:
SGD's Newton step (a = 1 - kappa = 0: an error along the noise is gone in one update). Past it the step overshoots
and never converges faster, and the model's own noise turns unphysical there: at a -> -1 reused noise alternates in
sign and cancels (psi_E(4, 1) = 0.74 at kappa = 1.2, 0.05 at 1.95; the FIFO's psi(x) falls below 1 / x), so a design
whose extrapolated step reached the limit was priced as noiseless (steps = S_min at any B_noise). Every exact kappa
the benchmark measured under SGD was below 1 (0.043-0.976 over the 80 quadratic SGD units of the five --families
runs). Momentum and Adam contract no faster past critical damping and are tuned well beyond it: their bound stays
``stable_kappa``."""


def tuned_kappa_limit(optimizer: str, beta1: float, measured: float) -> float:
    """The largest kappa a design's tuned step may have (``predict_many``'s cap on kappa_d): ``TUNED_KAPPA`` where
    the optimizer has one, never below the ``measured`` kappa (a pilot's own step stands as measured), and within
    ``stable_kappa``."""
    limit = max(TUNED_KAPPA.get(optimizer, math.inf), measured)
    return min(limit, stable_kappa(optimizer, beta1))


def _linear_system(kappa: float, optimizer: str, beta1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, b, c) of the error's response e_t to the noise along one direction, per unit of eta n_t.

    kappa is the long-run contraction per step (the slow eigenvalue is about 1 - kappa) for every optimizer:
    SGD e' = (1 - kappa) e - n; heavy ball (torch SGD momentum) v' = beta v + g, e' = e - eta v', whose effective
    step is eta / (1 - beta), so kappa = eta h / (1 - beta); Adam's first moment m' = beta m + (1 - beta) g with
    e' = e - eta m' (preconditioned coordinates, v frozen: the linearisation near a stationary point), kappa = eta h.
    """
    if optimizer == "sgd":
        return np.array([[1.0 - kappa]]), np.array([-1.0]), np.array([1.0])
    beta = float(beta1)
    if optimizer == "momentum":
        k = kappa * (1.0 - beta)  # eta h
        # state (e, eta v): eta v' = beta eta v + eta h e + eta n;  e' = e - eta v'
        a = np.array([[1.0 - k, -beta], [k, beta]])
        return a, np.array([-1.0, 1.0]), np.array([1.0, 0.0])
    # adam: state (e, eta m): eta m' = beta eta m + (1 - beta)(eta h e + eta n);  e' = e - eta m'
    k = kappa * (1.0 - beta)
    a = np.array([[1.0 - k, -beta], [k, beta]])
    return a, np.array([-(1.0 - beta), 1.0 - beta]), np.array([1.0, 0.0])


def impulse_autocorrelation(lags: ArrayLike, kappa: float, optimizer: str = "sgd", beta1: float = 0.9) -> np.ndarray:
    """rho(k) = sum_j r_j r_{j+k} / sum_j r_j^2 of the error's impulse response r_j to a noise kick (lags >= 0).

    SGD: a^k with a = 1 - kappa (closed form). Momentum and Adam: c^T A^k P c / c^T P c with P = A P A^T + b b^T
    (the stationary response covariance, scipy's discrete Lyapunov solver).
    """
    _check_optimizer(optimizer, beta1)
    require_positive("kappa", kappa)
    lags = np.abs(np.asarray(lags, dtype=np.int64))
    if optimizer == "sgd":
        if not kappa < 2:
            raise ValueError(f"kappa must be < 2 for SGD (beyond it the step diverges), got {kappa!r}")
        return (1.0 - kappa) ** lags.astype(float)
    a, b, c = _linear_system(kappa, optimizer, beta1)
    if not np.max(np.abs(np.linalg.eigvals(a))) < 1:
        raise ValueError(f"kappa = {kappa:g} with beta1 = {beta1:g} is unstable for {optimizer} (spectral radius >= 1)")
    from scipy.linalg import solve_discrete_lyapunov  # scipy on demand: ``optimal`` starts with numpy alone

    p = solve_discrete_lyapunov(a, np.outer(b, b))  # sum_j A^j b b^T A^T^j
    pc = p @ c
    out = np.empty(lags.shape, dtype=float)
    flat = lags.ravel()
    order = np.argsort(flat)
    v, at = pc.copy(), 0
    for i in order:  # A^k P c by repeated products, lags in increasing order
        while at < flat[i]:
            v = a @ v
            at += 1
        out.flat[i] = c @ v
    return out / (c @ pc)


def phi_sgd(x: ArrayLike, kappa: ArrayLike) -> np.ndarray | float:
    """phi(x, a) = (2/x^2) sum_{k=1}^{x-1} (x - k) a^k = 2 a [x (1 - a) - 1 + a^x] / (x^2 (1 - a)^2), a = 1 - kappa.

    ``derive forgetting-variance`` sums it with sympy; at a = 1 it is (x - 1)/x, at a = 0 it is 0.
    """
    x, kappa = np.asarray(x, dtype=float), np.asarray(kappa, dtype=float)
    value = 2 * _lag_sum(x, kappa) / x**2  # q = 1 - a = kappa exactly (1 - (1 - kappa) loses kappa's low digits)
    return float(value) if value.ndim == 0 else value


SERIES_BELOW = 0.5
"""|1 - lam| x under which ``_lag_sum`` sums its binomial series instead of the closed form."""


def _lag_sum(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """S(x, lam) = sum_{k=1}^{x-1} (x - k) lam^k at lam = 1 - q (complex q allowed), ``derive forgetting-variance``.

    Closed form lam [x q - 1 + lam^x] / q^2 where |q| x > 1/2. Nearer lam = 1 it cancels: x q - 1 + lam^x is about
    x^2 q^2 / 2, so its rounding error (~1e-16 x) over q^2 ruins it (psi(2, 1e-9) came out 0.5 instead of 1). There the
    exact binomial expansion S = C(x + 1, 2) - x + sum_{m >= 1} (-q)^m C(x + 1, m + 2) (sum_k (x - k) C(k, m) =
    C(x + 1, m + 2)) is summed: each term is at most |q| x / (m + 2) <= 1/(2 (m + 2)) times the previous one, so 20
    terms leave < 1e-25 of the sum.
    """
    x, q = np.broadcast_arrays(np.asarray(x, dtype=float), np.asarray(q))
    lam = 1 - q
    near = np.abs(q) * x <= SERIES_BELOW
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = lam * (x * q - 1 + lam**x) / q**2
    if near.any():  # the series only where it is needed (it is 20 passes over the array)
        xn, qn = x[near], q[near]
        term = xn * (xn + 1) / 2 * np.ones_like(qn)  # C(x + 1, 2)
        series = term - xn
        for m in range(1, 21):
            term = term * (-qn) * (xn - m) / (m + 2)  # C(x + 1, m + 2) / C(x + 1, m + 1) = (x - m) / (m + 2)
            series = series + term
        out = np.array(out, dtype=np.result_type(out, series))
        out[near] = series
    return out


def _geometric_lag_sum(x: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """S(x, lam) = sum_{k=1}^{x-1} (x - k) lam^k = lam [x (1 - lam) - 1 + lam^x] / (1 - lam)^2 (complex lam allowed;
    ``derive forgetting-variance`` sums it; ``_lag_sum`` near lam = 1)."""
    return _lag_sum(x, 1 - lam)


def _momentum_modes(kappa: np.ndarray, optimizer: str, beta1: float) -> tuple[np.ndarray, np.ndarray]:
    """(alpha, lam) (..., 2) with rho(k) = sum_j alpha_j lam_j^k for momentum / Adam at every kappa (any shape).

    A = [[1 - k, -beta], [k, beta]] (k = kappa (1 - beta)), kick u: its eigenvalues lam = (tr +- sqrt(tr^2 - 4
    beta)) / 2, eigenvectors (-beta, lam - 1 + k); P = A P A^T + u u^T solved for (p11, p12, p22) by Cramer's rule;
    alpha_j = (c^T V)_j (V^-1 P c)_j / c^T P c with c = e_0. All elementwise: no per-kappa linear algebra call
    (``impulse_autocorrelation`` is the generic reference the tests compare with).
    """
    beta = float(beta1)
    k = np.asarray(kappa, dtype=float) * (1.0 - beta)
    a11, a12, a21, a22 = 1.0 - k, -beta, k, beta
    u1, u2 = (-1.0, 1.0) if optimizer == "momentum" else (-(1.0 - beta), 1.0 - beta)
    # the stationary covariance: [[1 - a11^2, -2 a11 a12, -a12^2], [-a11 a21, 1 - a11 a22 - a12 a21, -a12 a22],
    # [-a21^2, -2 a21 a22, 1 - a22^2]] (p11, p12, p22) = (u1^2, u1 u2, u2^2)
    m = [[1 - a11**2, -2 * a11 * a12, np.full_like(k, -a12**2)],
         [-a11 * a21, 1 - a11 * a22 - a12 * a21, np.full_like(k, -a12 * a22)],
         [-(a21**2), -2 * a21 * a22, np.full_like(k, 1 - a22**2)]]
    r = [u1 * u1, u1 * u2, u2 * u2]

    def det3(c0, c1, c2):  # the determinant of the columns c0, c1, c2
        return (c0[0] * (c1[1] * c2[2] - c2[1] * c1[2]) - c1[0] * (c0[1] * c2[2] - c2[1] * c0[2])
                + c2[0] * (c0[1] * c1[2] - c1[1] * c0[2]))

    cols = [[m[i][j] for i in range(3)] for j in range(3)]
    rhs = [np.full_like(k, v) for v in r]
    det = det3(*cols)
    p11 = det3(rhs, cols[1], cols[2]) / det
    p12 = det3(cols[0], rhs, cols[2]) / det
    disc = np.sqrt((a11 + a22) ** 2 - 4 * (a11 * a22 - a12 * a21) + 0j)
    lam = np.stack([(a11 + a22 + disc) / 2, (a11 + a22 - disc) / 2], axis=-1)  # (..., 2)
    det_v = a12 * (lam[..., 1] - lam[..., 0])
    w1 = ((lam[..., 1] - a11) * p11 - a12 * p12) / det_v  # (V^-1 P c)_1
    w2 = (-(lam[..., 0] - a11) * p11 + a12 * p12) / det_v
    alpha = a12 * np.stack([w1, w2], axis=-1) / p11[..., None]
    return alpha, lam


def psi(horizon: ArrayLike, kappa: ArrayLike, optimizer: str = "sgd", beta1: float = 0.9) -> np.ndarray | float:
    """psi(x) = 1/x + (2/x^2) sum_{k=1}^{x-1} (x - k) rho(k): the share of the FIFO's extra noise the optimizer keeps.

    B V_eff = 1 + y psi - 1/N (``effective_variance``). In [1/x, 1] (in [0, 1] for SGD's overshooting kappa in
    (1, 2)): 1/x when the optimizer forgets within a step, 1 when it remembers the whole horizon. ``horizon``
    x = N / R (positive integers) and ``kappa`` broadcast. Momentum
    and Adam: rho(k) = sum_j alpha_j lam_j^k over the eigenvalues of A, so the lag sum is ``_geometric_lag_sum`` per
    eigenvalue (``impulse_autocorrelation`` sums the lags one by one; the tests compare the two).
    """
    x = np.asarray(horizon)
    require_int("horizon x = N/R", x, 1)
    return _psi_of(x.astype(float), kappa, optimizer, beta1)


def psi_fractional(horizon: ArrayLike, kappa: ArrayLike, optimizer: str = "sgd",
                   beta1: float = 0.9) -> np.ndarray | float:
    """psi at a real horizon x >= 1: a FIFO of N fed R' samples a step with N / R' = x between the whole steps L and
    L + 1 (selective replay [E8]: R' = (1 - z) R admitted). Each sample stays L or L + 1 steps, a share p = x - L the
    longer, so the lag sum over one sample's stay mixes the two: x^2 psi(x) = (1 - p) L^2 psi(L) + p (L + 1)^2
    psi(L + 1) [E10] (exact for a constant inflow; whole x give ``psi``; a varying inflow spreads the stays wider)."""
    x = np.asarray(horizon, dtype=float)
    require_finite("horizon x = N/R'", x)
    if not np.all(x >= 1):
        raise ValueError(f"horizon x = N/R' must be >= 1, got {x.min()!r}")
    low = np.floor(x)
    share = x - low  # p: the samples that stay L + 1 steps
    at_low = _psi_of(low, kappa, optimizer, beta1)
    mixed = ((1 - share) * low**2 * at_low + share * (low + 1) ** 2 * _psi_of(low + 1, kappa, optimizer, beta1)) / x**2
    value = np.where(share == 0, at_low, mixed)  # [E10]; a whole x is psi itself, bit for bit (no x^2 round trip)
    return float(value) if np.ndim(value) == 0 else np.asarray(value, dtype=float)


def _psi_of(xf: np.ndarray, kappa: ArrayLike, optimizer: str, beta1: float) -> np.ndarray | float:
    """``psi`` at whole horizons ``xf`` (floats), unchecked."""
    _check_optimizer(optimizer, beta1)
    kappa = np.asarray(kappa, dtype=float)
    require_positive("kappa", kappa)
    return _psi_solved(*np.broadcast_arrays(xf, kappa), optimizer, beta1)


def _psi_solved(xf: np.ndarray, kappa: np.ndarray, optimizer: str, beta1: float) -> np.ndarray | float:
    """``_psi_of`` at kappa > 0 of xf's shape and a checked optimizer (a fixed-point solve's steps); the stability
    checks stay: they depend on kappa."""
    if optimizer == "sgd":
        if not np.all(kappa < 2):
            raise ValueError(f"kappa must be < 2 for SGD (beyond it the step diverges), got {kappa.max()!r}")
        value = np.asarray(1.0 / xf + phi_sgd(xf, kappa), dtype=float)
    else:
        alpha, lam = _momentum_modes(kappa, optimizer, beta1)
        if not np.all(np.abs(lam) < 1):
            raise ValueError(f"kappa up to {kappa.max():g} with beta1 = {beta1:g} is unstable for {optimizer} "
                             "(spectral radius >= 1)")
        if np.any(np.abs(lam[..., 0] - lam[..., 1]) < 1e-7):
            raise ValueError(f"kappa = {kappa.ravel()[0]:g} makes {optimizer}'s system critically damped (a repeated "
                             "eigenvalue); use impulse_autocorrelation's lag sum there")
        lag_sum = np.sum(alpha * _geometric_lag_sum(xf[..., None], lam), axis=-1)
        value = np.asarray(1.0 / xf + 2.0 * np.real(lag_sum) / xf**2, dtype=float)
    return float(value) if value.ndim == 0 else value


def _epoch_modes(kappa: np.ndarray, optimizer: str, beta1: float) -> tuple[np.ndarray, np.ndarray]:
    """(alpha, lam) (..., J): rho(l) = Re sum_j alpha_j lam_j^l. SGD: one mode, lam = 1 - kappa; momentum and Adam:
    ``forgetting._momentum_modes`` (two eigenvalues of the error system)."""
    if optimizer == "sgd":
        return np.ones(kappa.shape + (1,), dtype=complex), (1.0 - kappa)[..., None].astype(complex)
    alpha, lam = _momentum_modes(kappa, optimizer, beta1)
    return alpha.astype(complex), lam.astype(complex)


def psi_epochs(epochs: ArrayLike, minibatches: ArrayLike, kappa: ArrayLike, optimizer: str = "sgd",
               beta1: float = 0.9, *, shuffle: bool = False) -> np.ndarray | float:
    """psi_E(e, m, kappa): b V_eff / sigma^2 of e epochs over m mini-batches of b = R/m (on-policy at b: 1).

    Over the modes rho(l) = Re sum_j alpha_j lam_j^l [E3]:
        fixed order:  psi_E = 1 + (2/e) Re sum_j alpha_j lam_j^m T(e, lam_j^m)
        shuffled:     psi_E = 1 + (2/e) Re sum_j alpha_j lam_j (g_j / m)^2 T(e, lam_j^m),  g_j = sum_{u<m} lam_j^u
    with T(e, mu) = sum_{d=1}^{e-1} (e - d) mu^{d-1} (E lam^{d m + D} = lam^{(d-1) m + 1} g^2 / m^2). Both are finite
    sums, summed term by term (no cancellation near kappa = 0). It lies between 1 (a step that forgets within an
    update, SGD at kappa = 1) and e (an optimizer that remembers the whole generation: e uses of one noise).
    SGD in a fixed order is e psi(e, kappa_m) of the FIFO with 1 - kappa_m = (1 - kappa)^m (``forgetting.psi``).
    e, m and kappa broadcast.
    """
    e, m = np.asarray(epochs), np.asarray(minibatches)
    require_int("epochs e", e, 1)
    require_int("minibatches m", m, 1)
    _check_optimizer(optimizer, beta1)
    kappa = np.asarray(kappa, dtype=float)
    require_positive("kappa", kappa)
    if not np.all(kappa <= stable_kappa(optimizer, beta1)):  # what forgetting.psi accepts: the searches reach it
        raise ValueError(f"kappa up to {kappa.max():g} is unstable for {optimizer} (beta1 = {beta1:g})")
    e, m, kappa = np.broadcast_arrays(e.astype(np.int64), m.astype(np.int64), kappa)
    alpha, lam = _epoch_modes(kappa, optimizer, beta1)
    if optimizer != "sgd" and np.any(np.abs(lam[..., 0] - lam[..., 1]) < 1e-7):
        raise ValueError(f"kappa = {kappa.ravel()[0]:g} makes {optimizer}'s system critically damped (a repeated "
                         "eigenvalue); use psi_epochs_from_lags there")
    e_, m_ = e[..., None], m[..., None]
    mu = lam ** m_
    g = np.zeros_like(lam)
    power = np.ones_like(lam)
    for u in range(int(m.max())):  # g = sum_{u < m} lam^u, term by term
        g = g + np.where(u < m_, power, 0)
        power = power * lam
    t = np.zeros_like(lam)
    power = np.ones_like(lam)
    for d in range(1, int(e.max())):  # T(e, mu) = sum_{d=1}^{e-1} (e - d) mu^{d-1}
        t = t + np.where(d < e_, (e_ - d) * power, 0)
        power = power * mu
    per_mode = lam * (g / m_) ** 2 if shuffle else mu  # [E3]
    value = 1.0 + 2.0 / e * np.real(np.sum(alpha * per_mode * t, axis=-1))
    return float(value) if value.ndim == 0 else value


def psi_spectrum(horizon: int, kappas: ArrayLike, weights: ArrayLike, optimizer: str = "sgd",
                 beta1: float = 0.9) -> float:
    """sum_i w_i psi(x, kappa_i) / sum_i w_i: psi over a spectrum of directions, each weighted by its noise Sigma_ii.

    The exact counterpart of psi(x, kappa) at kappa = eta lambda_eff on a quadratic whose noise spreads over
    directions of different curvature (the weights are what the stationary loss charges each direction's noise).
    """
    kappas, weights = np.asarray(kappas, dtype=float).ravel(), np.asarray(weights, dtype=float).ravel()
    require_nonnegative("weights", weights)
    values = np.array([psi(horizon, float(k), optimizer, beta1) for k in kappas])
    return float(np.sum(weights * values) / np.sum(weights))


def effective_variance(batch_size: float, rollouts_per_step: float, capacity: float, kappa: float,
                       optimizer: str = "sgd", beta1: float = 0.9, *, on_policy: bool = False) -> float:
    """B V_eff (per sigma^2 / B): 1 for on-policy without replacement, 1 + y psi(x) - 1/N for a FIFO of N = x R
    sampled with replacement (``derive forgetting-variance``; exact for N a multiple of R)."""
    require_positive("batch B", batch_size)
    if on_policy:
        return 1.0
    require_positive("rollouts R", rollouts_per_step)
    require_positive("capacity N", capacity)
    x = capacity / rollouts_per_step
    if x != round(x):
        raise ValueError(f"capacity N must be a multiple of rollouts R, got N={capacity:g}, R={rollouts_per_step:g}")
    return 1.0 + (batch_size / rollouts_per_step) * psi(int(round(x)), kappa, optimizer, beta1) - 1.0 / capacity


# --------------------------------------------------------------------------- the rule at a fixed batch


def forgetting_cost(b: ArrayLike, y: ArrayLike, mu: ArrayLike, psi_value: ArrayLike) -> np.ndarray | float:
    """Compute to the target at fixed B in units of S_min B: (1 + b + b y psi)(1 + mu / y) (derive forgetting-rule)."""
    b, y, mu, p = (np.asarray(v, dtype=float) for v in (b, y, mu, psi_value))
    value = (1 + b + b * y * p) * (1 + mu / y)
    return float(value) if value.ndim == 0 else value


def forgetting_replay_ratio(b: ArrayLike, mu: ArrayLike, psi_value: ArrayLike) -> np.ndarray | float:
    """y* = sqrt(mu (1 + b) / (b psi)): the minimiser of (1 + b + b y psi)(1 + mu / y) over y > 0."""
    b, mu, p = (np.asarray(v, dtype=float) for v in (b, mu, psi_value))
    value = np.sqrt(mu * (1 + b) / (b * p))
    return float(value) if value.ndim == 0 else value


def forgetting_replay_pays(b: ArrayLike, mu: ArrayLike, psi_value: ArrayLike) -> np.ndarray | bool:
    """4 b psi (1 + b) < mu (1 + b - b psi)^2 with b psi < 1 + b: the optimum at fixed B beats on-policy's
    (1 + b)(1 + mu). At psi = 1 it is today's 4 b (1 + b) < mu (``noise_scale.replay_pays``)."""
    b, mu, p = (np.asarray(v, dtype=float) for v in (b, mu, psi_value))
    value = (b * p < 1 + b) & (4 * b * p * (1 + b) < mu * (1 + b - b * p) ** 2)
    return bool(value) if value.ndim == 0 else value


def equal_steps_threshold(y: ArrayLike, mu: ArrayLike) -> np.ndarray | float:
    """psi below which replay at (R, B = y R) beats on-policy at the batch that takes as many steps:
    psi < mu (y - 1) / (y (mu + y)) (``derive free-batch``). 0 at y = 1; never reached at psi = 1."""
    y, mu = np.asarray(y, dtype=float), np.asarray(mu, dtype=float)
    value = mu * (y - 1) / (y * (mu + y))
    return float(value) if value.ndim == 0 else value


def loosest_equal_steps(mu: ArrayLike) -> tuple[np.ndarray | float, np.ndarray | float]:
    """(y, threshold) where ``equal_steps_threshold`` peaks: y = 1 + sqrt(1 + mu), psi < mu / (1 + sqrt(1 + mu))^2
    (0.43 at mu = 5.28): no replay ratio beats a smaller on-policy batch unless psi is below this."""
    mu = np.asarray(mu, dtype=float)
    y = 1 + np.sqrt(1 + mu)
    threshold = mu / (1 + np.sqrt(1 + mu)) ** 2
    return (float(y), float(threshold)) if mu.ndim == 0 else (y, threshold)


# --------------------------------------------------------------------------- the whole design (B, R, N)


@dataclass(frozen=True)
class Memory:
    """The optimizer's memory, measured at a pilot design (on-policy at ``pilot_batch`` with its tuned step)."""

    kappa: float
    """kappa at the pilot: eta lambda_eff (curvature along the noise x step); 1/kappa is the memory in steps."""
    optimizer: str = "sgd"
    beta1: float = 0.9
    pilot_batch: float | None = None
    """The on-policy batch kappa was measured at (with its own tuned step). None: kappa is taken as the same at
    every design (no step feedback)."""
    step_exponent: float | None = None
    """alpha of eta_d = eta_max / (1 + B_noise V_d)^alpha; None: ``STEP_EXPONENT[optimizer]``."""

    def __post_init__(self) -> None:
        _check_optimizer(self.optimizer, self.beta1)
        require_positive("kappa", self.kappa)
        if self.pilot_batch is not None:
            require_positive("pilot batch", self.pilot_batch)
        if self.step_exponent is not None:
            require_nonnegative("step exponent", self.step_exponent)

    @property
    def alpha(self) -> float:
        return STEP_EXPONENT[self.optimizer] if self.step_exponent is None else float(self.step_exponent)

    def kappa_max(self, b_noise: float) -> float:
        """kappa of the noiseless tuned step, kappa_pilot (1 + B_noise / B_pilot)^alpha (McCandlish Eq. 2.6)."""
        if self.pilot_batch is None:
            return self.kappa
        return self.kappa * (1 + b_noise / self.pilot_batch) ** self.alpha


@dataclass(frozen=True)
class Staleness:
    """r(s) = sigma^2(s) / sigma^2(0) by age s (0, 1, 2, ...): how much noisier a stored sample gets as it ages
    (for an importance-weighted loss 1 + chi^2(s) of the weights; a clipped loss's retained-signal form also fits).
    Tabulated ages are interpolated linearly; beyond the table r follows the last slope if it rises, else its last
    value (``at``)."""

    ages: tuple[float, ...] = (0.0,)
    ratio: tuple[float, ...] = (1.0,)
    source: str = "none: a stored sample is as noisy at every age (no staleness cost)"
    measured_to: float | None = None
    """The oldest age the table vouches for (None: its last age; inf: exact at every age, e.g. an environment with
    no policy). ``theory.guarded`` offers no design that trains on a sample older than this."""

    def __post_init__(self) -> None:
        if len(self.ages) != len(self.ratio) or not self.ages:
            raise ValueError("staleness ages and ratios must be equal-length, non-empty")
        require_nonnegative("staleness age", self.ages)
        require_positive("staleness ratio sigma^2(s)/sigma^2(0)", self.ratio)
        if any(b <= a for a, b in zip(self.ages, self.ages[1:])):
            raise ValueError("staleness ages must increase")

    @property
    def flat(self) -> bool:
        return all(r == 1.0 for r in self.ratio)

    @property
    def oldest_measured(self) -> float:
        """The oldest age whose cost is known: ``measured_to``, else the table's last age (0 for ``NO_STALENESS``,
        which measured nothing)."""
        return float(self.ages[-1]) if self.measured_to is None else float(self.measured_to)

    def at(self, ages: ArrayLike) -> np.ndarray:
        """r at ``ages``: interpolated inside the table; beyond it extended along the last slope when that slope
        rises, and held at the last value when it falls (a ratio of variances cannot go below 0, and a falling end of
        a short, noisy table is no evidence that stale samples keep getting less noisy)."""
        s = np.asarray(ages, dtype=float)
        xs, ys = np.asarray(self.ages, float), np.asarray(self.ratio, float)
        if xs.size == 1:
            return np.full(s.shape, ys[0])
        inside = np.interp(s, xs, ys)
        beyond = s > xs[-1]
        if not beyond.any():
            return inside
        slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
        return np.where(beyond, ys[-1] + slope * (s - xs[-1]), inside)

    def mean(self, horizon: int) -> float:
        """m(x) = mean of r(s) over the ages 0 .. x - 1 a FIFO of x steps holds."""
        return float(np.mean(self.at(np.arange(int(horizon)))))

    def means(self, horizons: np.ndarray, scale: np.ndarray | float = 1.0) -> np.ndarray:
        """m(x) with every age stretched by ``scale`` (per design): mean over s < x of r(s scale). A stale sample's
        drift is set by how far the parameters moved, so a design whose tuned step is ``scale`` x the pilot's sees
        the pilot's r at scale x its age."""
        return self.means_of(horizons)(scale)

    def means_of(self, horizons: np.ndarray) -> Callable[[np.ndarray | float], np.ndarray]:
        """``means`` at fixed ``horizons`` as a function of ``scale`` alone: the ages each horizon holds found once
        (a fixed-point solve asks for the same horizons at every step size it tries)."""
        x = np.asarray(horizons, dtype=np.int64)
        if self.flat or x.size == 0:
            return lambda scale: np.ones(x.shape)
        xmax = int(x.max())
        held = np.arange(xmax) < x.reshape(-1, 1)  # (n, xmax): the ages s < x a FIFO of x steps holds
        rows, ages = np.nonzero(held)  # (held ages,) each: its design and its age, row by row
        at = np.flatnonzero(held)

        def means(scale: np.ndarray | float) -> np.ndarray:
            stretch = np.broadcast_to(np.asarray(scale, dtype=float), x.shape).reshape(-1)  # (n,)
            values = np.zeros(held.size)  # (n xmax): r(s scale) at the held ages, 0 beyond
            values[at] = self.at(stretch[rows] * ages)
            # every row summed over all xmax ages, zeros included: one summation order whatever the horizons
            return values.reshape(held.shape).sum(axis=-1).reshape(x.shape) / x

        return means


NO_STALENESS = Staleness()
NO_POLICY = Staleness(source="none at any age: no policy to drift (the noisy quadratic)", measured_to=math.inf)

DRIFT_AGES = (0, 1, 2, 4, 8, 16, 32, 64)
"""The ages s at which a run's drift M2(s) is read (``drift_ages``): doubling, so a quarter batch re-scored at each
age costs a forward pass over 64 rollouts per doubling of the horizon the table vouches for."""


def drift_ages(last_step: int, table: tuple[int, ...] = DRIFT_AGES) -> list[int]:
    """The ages of the drift table of a run whose last policy is step ``last_step`` (T): ``table``'s ages up to T and
    T itself (the run's first policy, the oldest it has). One definition for the benchmark's simulated run
    (``theory_bench.inputs.measure_drift``) and the TRL trainer's re-scoring (``integrations.trl_drift``)."""
    if last_step < 0:
        raise ValueError(f"a run's last step must be >= 0, got {last_step}")
    return sorted({s for s in table if s <= last_step} | {int(last_step)})


def staleness_of_drift(ages: Sequence[float], m2: Sequence[float], source: str) -> Staleness:
    """r(s) = 1 + M2(s) of a drift table (M2(s) = E[(log pi_T / pi_{T-s})^2], M2PO's statistic, by age s): the
    variance factor of an importance weight at age s (about 1 + chi^2(s) for a small drift, without chi^2's heavy
    tail), the staleness cost the benchmark's printed answer is priced and scored at. A table with no age > 0 has
    measured nothing beyond age 0 (``NO_STALENESS``)."""
    ages_t, m2_t = tuple(float(s) for s in ages), tuple(float(v) for v in m2)
    if len(ages_t) != len(m2_t) or not ages_t or ages_t[0] != 0:
        raise ValueError(f"a drift table needs equal-length ages and M2 starting at age 0, got ages {list(ages_t)}")
    if any(not (math.isfinite(v) and v >= 0) for v in m2_t):
        raise ValueError(f"drift M2(s) must be finite numbers >= 0, got {list(m2_t)}")
    if len(ages_t) < 2:
        return NO_STALENESS
    return Staleness(ages_t, tuple(1.0 + v for v in m2_t), source)  # r(s) = 1 + M2(s)


def staleness_of_table(ages: Sequence[float], sigma_sq: Sequence[float], form: str) -> Staleness:
    """r(s) = sigma^2(s) / sigma^2(0) of a measured sigma^2(s) table (a profile's), ``form`` naming its fit; no
    staleness cost (NO_STALENESS) when the table does not start at age 0 with sigma^2(0) > 0."""
    ages, values = tuple(float(s) for s in ages), tuple(float(v) for v in sigma_sq)
    if ages[0] != 0 or values[0] <= 0:
        return NO_STALENESS
    return Staleness(ages, tuple(v / values[0] for v in values), f"the profile's sigma^2(s) / sigma^2(0) ({form})")


@dataclass(frozen=True)
class Prediction:
    design: Design
    steps: float  # S / S_min
    cost_per_step: float  # mu max(R, R_floor) + B; overlapped: max(mu R_floor, mu R + B)
    compute: float  # steps x cost_per_step (units: S_min x one sample's update)
    kappa: float  # kappa at this design's own tuned step (nan without a memory)
    psi: float  # 1 for on-policy
    staleness: float  # m(x)
    work: float = math.nan  # steps x the step's cost at no floor: the GPU time spent, the floor's waiting not counted


def step_cost(rollouts_per_step: ArrayLike, batch_size: ArrayLike, mu: float, floor: float = 0.0,
              updates_per_generation: ArrayLike = 1, overlapped: ArrayLike = False,
              rounds: ArrayLike = 1.0) -> np.ndarray | float:
    """mu max(R, R_floor) / (e m) + B: generation cannot get cheaper than the floor's batch (decoding is
    latency-bound); an epoch design spreads one generation over its e m updates (e m = 1 otherwise). An
    ``overlapped`` design's step is ``overlapped_split``'s max(mu R_floor, mu R + B). Dynamic sampling generates
    ``rounds`` rounds of R per update (``compute.refill_rounds`` [E11]; 1 otherwise), each at least the floor's."""
    R, B = np.asarray(rollouts_per_step, dtype=float), np.asarray(batch_size, dtype=float)
    generation = mu * np.maximum(R, floor) * np.asarray(rounds, dtype=float)
    value = generation / np.asarray(updates_per_generation, dtype=float) + B
    value = np.where(overlapped, np.maximum(mu * floor, mu * R + B), value)
    return float(value) if value.ndim == 0 else value


def overlapped_split(rollouts_per_step: float, batch_size: float, mu: float, floor: float = 0.0
                     ) -> tuple[float, float, float]:
    """(time per step, least and largest generation share gamma that reach it) of generation overlapped with
    training: a share gamma of the pool generates the next R while the rest trains on B (one-step-off).

    Generating R on gamma of the pool takes mu max(R / gamma, R_floor) (the floor is the whole pool's: a smaller
    share reaches it with fewer rollouts), training B on 1 - gamma takes B / (1 - gamma), and a step takes the
    longer. Minimised over gamma in (0, 1): max(mu R_floor, mu R + B) [T1]. Below the floor the balance point
    gamma = mu R / (mu R + B) already generates at the floor (R / gamma <= R_floor) and every gamma in
    [R / R_floor, 1 - B / (mu R_floor)] takes mu R_floor; above it only the balance point reaches mu R + B, the
    colocated step's time (``step_cost``): overlap buys time only from the floor's idle share, never from work."""
    R, B = float(rollouts_per_step), float(batch_size)
    require_positive("rollouts R", R)
    require_positive("batch B", B)
    require_positive("mu", mu)
    require_nonnegative("latency floor", floor)
    balance = mu * R / (mu * R + B)
    if mu * floor <= mu * R + B:
        return mu * R + B, balance, balance  # [T1]: the balance point, R / gamma >= R_floor
    return mu * floor, R / floor, 1.0 - B / (mu * floor)  # [T1]: generation waits on the floor, training fits beside


class _Columns(NamedTuple):
    """A design list as arrays (one entry per design), built once per list: the searches score the same grids
    at many noise scales."""

    B: np.ndarray  # (n,) batch
    R: np.ndarray  # (n,) rollouts a step
    N: np.ndarray  # (n,) capacity
    on: np.ndarray  # (n,) on-policy
    dyn: np.ndarray  # (n,) dynamic sampling [E9]
    sel: np.ndarray  # (n,) selective replay [E8]
    x: np.ndarray  # (n,) N / R in whole steps
    late: np.ndarray  # (n,) an overlapped design's age at use (else 0)
    e: np.ndarray  # (n,) epochs
    mb: np.ndarray  # (n,) mini-batches
    groups: np.ndarray  # (dynamic designs,) B / G


def _columns(designs: Sequence[Design]) -> _Columns:
    """``designs`` as ``_Columns``; N a multiple of R checked (``predict_many``'s precondition)."""
    B = np.array([d.batch_size for d in designs], dtype=float)
    R = np.array([d.rollouts_per_step for d in designs], dtype=float)
    N = np.array([d.capacity for d in designs], dtype=float)
    if np.any(N % R):  # psi(x) sums over whole steps: the model's precondition, not every FIFO's (theory/designs.py)
        d = designs[int(np.argmax(N % R != 0))]
        raise ValueError(f"capacity N must be a multiple of rollouts R, got N={d.capacity}, R={d.rollouts_per_step}")
    on = np.array([d.on_policy for d in designs])
    dyn = np.array([d.dynamic for d in designs])  # dynamic sampling: on-policy over B informative samples [E9]
    sel = np.array([d.selective for d in designs]) & ~on  # selective replay: the FIFO admits (1 - z) R a step [E8]
    x = np.array([d.x for d in designs], dtype=np.int64)
    groups = np.array([d.batch_size // d.group_size for d, y in zip(designs, dyn) if y])  # g = B / G
    late = np.array([d.max_staleness for d in designs], dtype=float)
    e = np.array([d.epochs for d in designs], dtype=np.int64)
    mb = np.array([d.mini_batches for d in designs], dtype=np.int64)
    return _Columns(B, R, N, on, dyn, sel, x, late, e, mb, groups)


class _Priced(NamedTuple):
    """``predict_many``'s predictions as arrays (n,): ``Prediction``'s fields, entry by entry."""

    steps: np.ndarray
    cost: np.ndarray
    compute: np.ndarray
    kappa: np.ndarray
    psi: np.ndarray
    staleness: np.ndarray
    work: np.ndarray

    def prediction(self, design: Design, i: int) -> Prediction:
        """Entry ``i`` as the ``Prediction`` of ``design`` (the values ``predict_many`` gives, bit for bit)."""
        return Prediction(design, float(self.steps[i]), float(self.cost[i]), float(self.compute[i]),
                          float(self.kappa[i]), float(self.psi[i]), float(self.staleness[i]), float(self.work[i]))


def predict_many(designs: list[Design], b_noise: float, mu: float, memory: Memory | None,
                 staleness: Staleness = NO_STALENESS, floor: float = 0.0, *,
                 zero_share: float = 0.0) -> list[Prediction]:
    """``predict`` for many designs at once (one vectorised fixed-point solve). ``zero_share`` z prices the selective
    designs ([E8]: the FIFO over the (1 - z) R informative samples a step, noise scale (1 - z) B_noise; on-policy,
    dynamic sampling [E9], [E11]: B informative samples an update at that noise scale, ``compute.refill_rounds``
    rounds of R generated for them); the others keep the zero-advantage groups, which the measured B_noise and kappa
    already count."""
    _check_prices(b_noise, mu, floor, zero_share)
    if not designs:
        return []
    priced = _price(_columns(designs), b_noise, mu, memory, staleness, floor, zero_share)
    return [priced.prediction(d, i) for i, d in enumerate(designs)]


def _check_prices(b_noise: float, mu: float, floor: float, zero_share: float) -> None:
    require_positive("noise scale B_noise", b_noise)
    require_positive("mu", mu)
    require_nonnegative("latency floor", floor)
    require_unit_interval("zero share z", zero_share, closed=False)


def _price(cols: _Columns, b_noise: float, mu: float, memory: Memory | None, staleness: Staleness, floor: float,
           zero_share: float) -> _Priced:
    """``predict_many`` on checked inputs, as arrays."""
    B, R, N, on, dyn, sel, x, late, e, mb, groups = cols
    admitted = np.where(sel, (1 - zero_share) * R, R)  # R': the samples that enter the buffer per step
    x_sel = N / admitted  # a selective design's horizon N / R' (whole steps only at z = 0)
    rounds = np.ones_like(B)  # generation rounds of R per update: more only for dynamic sampling [E11]
    if dyn.any():
        rounds[dyn] = refill_rounds(groups, zero_share)
    ep = e * mb > 1  # epoch designs (theory/reuse_families.py): noise psi_E / B, ages 0 .. e m - 1 updates
    horizon = np.where(ep, e * mb, x)  # the ages a design's updates draw: a FIFO's x steps, a generation's e m
    y = B / admitted
    b_design = np.where(sel | dyn, (1 - zero_share) * b_noise, b_noise)  # [E8], [E9]: an informative sample's
    flat = staleness.flat
    overlapped = bool((late > 0).any())
    low_sel = np.floor(x_sel[sel])  # a selective design's stays: L or L + 1 steps [E10]
    fifo_means = staleness.means_of(horizon)
    sel_means = (staleness.means_of(low_sel), staleness.means_of(low_sel + 1)) if sel.any() else None
    never_forgets = np.where(ep, e, 1.0)  # psi at kappa -> 0: the FIFO keeps all its extra noise, e epochs e uses
    x_fifo = np.where(ep, 1, x).astype(float)  # psi's whole horizons (epoch designs: psi_epochs instead)

    def m_of(kappa: np.ndarray | float) -> np.ndarray:  # m(x) at each design's own step: ages scaled by kappa_d/kappa
        if flat:
            return np.ones_like(B)
        scale = 1.0 if memory is None or memory.pilot_batch is None else np.asarray(kappa) / memory.kappa
        stale = np.where(late > 0, staleness.at(late * scale), 1.0) if overlapped else 1.0  # one use at age k: r(k)
        m = np.where(on, stale, fifo_means(scale))
        if sel.any():  # a stay of L or L + 1 steps (share p the longer) draws ages 0 .. L - 1 or 0 .. L [E10]
            xs, sc = x_sel[sel], np.broadcast_to(np.asarray(scale, dtype=float), B.shape)[sel]
            low = low_sel
            share = xs - low
            m[sel] = ((1 - share) * low * sel_means[0](sc) + share * (low + 1) * sel_means[1](sc)) / xs
        return m

    def noise(p: np.ndarray, m: np.ndarray) -> np.ndarray:  # B_noise V_eff m(x); on-policy B_noise / B (r(k) / B)
        fifo = b_design / B * (1 + y * p - 1 / N) * m
        return np.where(on, b_design / B * m, np.where(ep, b_noise / B * p * m, fifo))  # epochs: B V_eff = psi_E [E1]

    def p_of(kappa: np.ndarray) -> np.ndarray:  # psi of every design at its kappa (1 on-policy)
        p = np.where(on, 1.0, _psi_solved(x_fifo, np.broadcast_to(kappa, B.shape), memory.optimizer, memory.beta1)
                     if isinstance(kappa, np.ndarray) and np.all(kappa > 0) else
                     _psi_of(x_fifo, kappa, memory.optimizer, memory.beta1))  # psi at whole x, each kappa > 0
        if ep.any():
            p[ep] = psi_epochs(e[ep], mb[ep], np.broadcast_to(kappa, B.shape)[ep], memory.optimizer, memory.beta1)
        if sel.any():  # [E10]: psi between the whole stays
            p[sel] = psi_fractional(x_sel[sel], np.broadcast_to(kappa, B.shape)[sel], memory.optimizer, memory.beta1)
        return p

    if memory is None:
        p, kappa = never_forgets.astype(float), np.full_like(B, math.nan)
        m = m_of(1.0)
    elif memory.pilot_batch is None:  # no step feedback: the measured kappa at every design (``Memory``)
        kappa = np.full_like(B, memory.kappa)
        p = p_of(kappa)
        m = m_of(kappa)
    else:
        k_max, alpha = memory.kappa_max(b_noise), memory.alpha
        # Eq. 2.6 extrapolated to no noise can pass the stability limit along the noise (kappa_pilot = 0.2 at
        # B_noise / B_pilot = 1e4 gives kappa_max = 2000); a tuned step stays below it and, under SGD, at or below the
        # Newton step, where the model's noise is still physical: kappa_d is capped there (TUNED_KAPPA)
        top = min(k_max, tuned_kappa_limit(memory.optimizer, memory.beta1, memory.kappa))  # TUNED_KAPPA
        # the never-forgetting psi and the staleness of the largest step: the most noise, so the smallest step any
        # design can have
        low = np.minimum(k_max / (1 + noise(never_forgets, m_of(np.full_like(B, top)))) ** alpha, top)
        lo, hi = np.log(low), np.full_like(B, math.log(top))
        solve = (~on) & ((x > 1) | ep | (sel & (x_sel > 1)))  # psi(1) = 1, m(1) = 1, on-policy: kappa = its own
        for _ in range(44 if solve.any() else 0):  # bisection in log kappa on kappa - kappa_max / (1 + noise)^alpha:
            # the bracket spans at most ln(1 + B_noise V) <= ~40 in log kappa, so 44 halvings leave < 3e-12
            mid = 0.5 * (lo + hi)
            k = np.exp(mid)
            gap = k - k_max / (1 + noise(p_of(k), m_of(k))) ** alpha
            above = gap >= 0
            hi, lo = np.where(above, mid, hi), np.where(above, lo, mid)
        own = np.minimum(k_max / (1 + noise(np.ones_like(B), np.ones_like(B))) ** alpha, top)  # x = 1, on-policy
        if (late > 0).any():  # overlapped: r(k) at the synchronous batch's own step, then the step it tunes to
            own = np.where(late > 0, np.minimum(k_max / (1 + noise(np.ones_like(B), m_of(own))) ** alpha, top), own)
        kappa = np.where(solve, np.exp(hi), own)
        p = np.where(solve, p_of(kappa), 1.0)
        m = m_of(kappa)
    steps = 1 + noise(p, m)
    cost = step_cost(R, B, mu, floor, e * mb, late > 0, rounds)
    spent = step_cost(R, B, mu, 0.0, e * mb, late > 0, rounds)  # [W1]: the same step without the floor's waiting
    return _Priced(steps, cost, steps * cost, kappa, np.where(on, 1.0, p), m, steps * spent)


@dataclass(frozen=True)
class _Budget:
    """``within_budgets`` at one steps cap and work cap, for one prediction or a whole priced grid."""

    cap: float
    work_cap: float

    def __call__(self, p: Prediction) -> bool:
        return within_budgets(p, self.cap, self.work_cap)

    def mask(self, priced: _Priced) -> np.ndarray:
        """(n,) ``within_budgets`` entry by entry (the same comparisons)."""
        return (priced.steps <= self.cap) & (priced.work <= self.work_cap * (1 + 1e-12))


@dataclass(frozen=True)
class _Scorer:
    """``predict_many`` at one set of prices (the searches' ``score``), and the cheapest design of a list within a
    budget, found over the arrays: only the winner becomes a ``Prediction``."""

    b_noise: float
    mu: float
    memory: Memory | None
    staleness: Staleness
    floor: float
    zero_share: float

    def __call__(self, designs: list[Design]) -> list[Prediction]:
        return predict_many(designs, self.b_noise, self.mu, self.memory, self.staleness, self.floor,
                            zero_share=self.zero_share)

    def cheapest(self, designs: Sequence[Design], within: _Budget, cols: _Columns | None = None,
                 rival: Prediction | None = None) -> Prediction | None:
        """``_cheapest(self(designs) + [rival], within)`` (ties: the first; ``rival`` last), ``cols`` the designs'
        ``_columns`` when already built."""
        best = None
        if designs:
            _check_prices(self.b_noise, self.mu, self.floor, self.zero_share)
            priced = _price(_columns(designs) if cols is None else cols, self.b_noise, self.mu, self.memory,
                            self.staleness, self.floor, self.zero_share)
            idx = np.flatnonzero(within.mask(priced))
            if idx.size and np.isnan(priced.compute[idx]).any():  # min's comparisons skip nan: its own loop
                return _cheapest([priced.prediction(d, i) for i, d in enumerate(designs)]
                                 + ([] if rival is None else [rival]), within)
            if idx.size:
                j = int(idx[np.argmin(priced.compute[idx])])  # the first of the least, as min's
                best = priced.prediction(designs[j], j)
        if rival is not None and within(rival) and (best is None or rival.compute < best.compute):
            return rival
        return best


def work_batch_limit(b_noise: float, batch_size: int, max_work_ratio: float) -> float:
    """The largest on-policy batch B' whose work to the target stays within ``max_work_ratio`` x on-policy's at B.

    On-policy work is (1 + B_noise / B') (mu + 1) B' = (mu + 1) (B' + B_noise) S_min, rising in B', so the bound is
    B' <= C (B + B_noise) - B_noise [W1] (mu and the floor drop out). ``b_noise`` 0 (not measured) gives C B, which
    holds whatever b is: (B' + B_noise) / (B + B_noise) <= B' / B for every B_noise >= 0 once B' >= B."""
    require_nonnegative("noise scale B_noise", b_noise)
    require_in_range("max work ratio", max_work_ratio, 1.0, math.inf)
    return max_work_ratio * (batch_size + b_noise) - b_noise  # [W1]


def work_top(top: int, b_noise: float, batch_size: int, group_size: int, max_work_ratio: float) -> int:
    """``top`` (a whole-group batch) lowered to the largest whole-group batch within the work budget ([W1]; at least
    B, which always is); ``max_work_ratio`` inf: ``top``. ``b_noise`` 0 (not measured): C B, whatever b is."""
    if math.isinf(max_work_ratio):
        return top
    limit = work_batch_limit(b_noise, batch_size, max_work_ratio) * (1 + 1e-12)  # the limit itself despite rounding
    return min(top, max(int(limit) // group_size * group_size, batch_size))


def predict(design: Design, b_noise: float, mu: float, memory: Memory | None, staleness: Staleness = NO_STALENESS,
            floor: float = 0.0) -> Prediction:
    """S / S_min = 1 + B_noise V_eff(design, kappa_d) m(x) with kappa_d = kappa_max / (1 + B_noise V_eff m)^alpha,
    solved as a fixed point (reuse adds noise, the tuned step shrinks, the memory lengthens, psi grows); on-policy
    1 + B_noise / B. ``memory`` None: psi = 1, today's noise-scale rule. Compute = steps x (mu max(R, R_floor) + B)."""
    return predict_many([design], b_noise, mu, memory, staleness, floor)[0]


@dataclass(frozen=True)
class WholeDesign:
    """``optimal``'s answer over (B, R, N): the cheapest on-policy batch and the best replay design, against
    on-policy at the user's B."""

    at_batch: Prediction  # on-policy at the user's B
    on_policy: Prediction  # the cheapest on-policy batch within the steps cap
    replay: Prediction | None  # the cheapest replay design within the steps cap (None: none allowed)
    winner: str  # "replay", "epochs", "overlapped", "selective", "dynamic" or "on-policy (smaller batch | larger
    # batch | at B)"
    max_steps_ratio: float
    threshold: float  # the loosest equal-steps psi threshold, mu / (1 + sqrt(1 + mu))^2
    threshold_y: float
    epochs: Prediction | None = None  # the cheapest epoch design within the cap (None: not asked, or none allowed)
    overlapped: Prediction | None = None  # the cheapest overlapped (one-step-off) batch (None: not asked or allowed)
    max_work_ratio: float = math.inf  # every answer's work within this x on-policy's at B (inf: no work budget)
    selective: Prediction | None = None  # the cheapest selective replay design (None: no zero share, or not allowed)
    dynamic: Prediction | None = None  # the cheapest dynamic sampling batch (None: no zero share)

    @property
    def best(self) -> Prediction:
        if self.winner == "dynamic":
            return self.dynamic
        if self.winner == "epochs":
            return self.epochs
        if self.winner == "overlapped":
            return self.overlapped
        if self.winner == "selective":
            return self.selective
        if self.replay is not None and self.replay.compute < self.on_policy.compute:
            return self.replay
        return self.on_policy


def whole_design(b_noise: float, batch_size: int, mu: float, memory: Memory | None, *, group_size: int = 1,
                 staleness: Staleness = NO_STALENESS, floor: float = 0.0, max_steps_ratio: float = 2.0,
                 max_horizon: int = 64, max_batch: int | None = None, max_epochs: int = 1,
                 max_age: float = math.inf, max_staleness: int = 0, max_work_ratio: float = math.inf,
                 zero_share: float = 0.0, pass_age: float = -1.0) -> WholeDesign:
    """Search on-policy batches and replay designs (B', R, N = x R) in whole groups of ``group_size`` for the least
    predicted compute whose steps stay within ``max_steps_ratio`` x on-policy's at the user's B (the wall-time
    budget: below the noise scale compute falls with the batch while steps rise).

    B' ranges over whole groups up to ``max_batch`` (default 4 B) and R over whole groups up to B', first 4 per
    factor 2 with x over 1, 2, 3, 4, 6, 8, 11, 16, ... up to ``max_horizon``, then around the best at 16 per factor
    2 (every whole group when they are fewer) with every x within a factor sqrt(2). ``max_epochs`` > 1 adds epoch
    designs (R up to that batch, e up to ``max_epochs`` passes over m mini-batches, ``_cheapest_epochs``).
    ``max_age``: no design trains on a sample older than this many updates (x - 1 for a FIFO, e m - 1 for epochs;
    ``Design.oldest_age``); below 0 no reuse at all (on-policy only). ``pass_age`` (with ``max_epochs`` > 1): one pass
    (e = 1) over m mini-batches trains each sample once, so it reuses nothing: such designs are searched up to
    m - 1 <= ``pass_age`` even where ``max_age`` closes reuse (the caller bounds it by the staleness measured).
    ``max_staleness`` >= 1 adds overlapped designs (``_cheapest_overlapped``), at k = 1: in this model a step's time
    is the same at every k >= 1 (``step_cost``) and r(k) does not fall with k, so a larger bound only adds
    staleness. Overlap reuses nothing, so ``max_age`` does not limit it; the caller bounds k by the ages its
    staleness cost was measured at. ``zero_share`` z > 0 adds selective replay designs (a FIFO admitting only the
    groups with unequal rewards, [E8]), searched as the FIFO's are, none whose admitted samples outlive ``max_age``
    (ceil(N / ((1 - z) R)) - 1 updates), and dynamic sampling at every whole-group batch (on-policy, zero-advantage
    groups dropped and regenerated in rounds of B, [E9], [E11]): it reuses nothing, so ``max_age`` does not limit
    it.

    ``max_work_ratio`` (time within a compute budget): no answer's work (``Prediction.work``, the floor's waiting not
    counted) exceeds that many times on-policy's at B, so with a latency floor the answer is the fastest design
    within the work budget. On-policy batches stop at ``work_batch_limit`` [W1] (at least B: the ratio is >= 1).
    """
    max_batch = _checked_max_batch(b_noise, batch_size, group_size, max_steps_ratio, max_horizon, max_batch)
    ref = predict(Design.on_policy_at(batch_size), b_noise, mu, memory, staleness, floor)
    work_cap = max_work_ratio * ref.work
    within = _Budget(max_steps_ratio * ref.steps, work_cap)
    score = _Scorer(b_noise, mu, memory, staleness, floor, zero_share)
    top = max_batch // group_size * group_size  # the largest whole-group batch searched
    top_on = work_top(top, b_noise, batch_size, group_size, max_work_ratio)
    best_on = _cheapest_on_policy(group_size, top_on, ref, within, score)
    reuse = max_age >= 0
    horizon = int(min(max_horizon, max_age + 1)) if reuse else 1
    best_replay = _cheapest_replay(top, group_size, horizon, within, score) if reuse else None
    require_int("max epochs", max_epochs, 1)
    best_epochs = (_cheapest_epochs(top, group_size, max_epochs, within, score, max_age)
                   if max_epochs > 1 and max_age >= 1 else None)
    if max_epochs > 1 and pass_age > max(max_age, 0):  # one pass reuses nothing: searched within its own age bound
        single = _cheapest_epochs(top, group_size, 1, within, score, pass_age)
        if single is not None and (best_epochs is None or single.compute < best_epochs.compute):
            best_epochs = single
    require_int("max staleness", max_staleness, 0)
    best_overlapped = _cheapest_overlapped(group_size, top, within, score) if max_staleness >= 1 else None
    best_selective = (_cheapest_replay(top, group_size, int(min(max_horizon, max_age + 1)), within, score,
                                       zero_share=zero_share, max_age=max_age)
                      if zero_share > 0 and max_age >= 1 else None)  # every selective design reuses: x' > 1
    best_dynamic = (_cheapest_on_policy(group_size, top_on, None, within, score,
                                        partial(Design.dynamic_at, group_size=group_size))
                    if zero_share > 0 else None)
    y_l, thr = loosest_equal_steps(mu)
    winner = _winner(best_replay, best_on, batch_size)
    rival = best_replay if winner == "replay" else best_on
    for name, family in (("epochs", best_epochs), ("overlapped", best_overlapped), ("selective", best_selective),
                         ("dynamic", best_dynamic)):
        if family is not None and family.compute < rival.compute:
            winner, rival = name, family
    return WholeDesign(ref, best_on, best_replay, winner, float(max_steps_ratio), float(thr), float(y_l), best_epochs,
                       best_overlapped, float(max_work_ratio), best_selective, best_dynamic)


def _checked_max_batch(b_noise: float, batch_size: int, group_size: int, max_steps_ratio: float, max_horizon: int,
                       max_batch: int | None) -> int:
    """``whole_design``'s inputs checked; the largest batch searched (default 4 B)."""
    require_positive("noise scale B_noise", b_noise)
    require_int("batch size B", batch_size, 1)
    require_int("group size", group_size, 1)
    if batch_size % group_size:
        raise ValueError(f"batch size B must be whole groups of {group_size}, got {batch_size}")
    require_positive("max steps ratio", max_steps_ratio)
    require_int("max horizon", max_horizon, 1)
    max_batch = int(4 * batch_size if max_batch is None else max_batch)
    require_int("max batch_size", max_batch, group_size)
    return max_batch


def _cheapest_on_policy(group: int, top: int, ref: Prediction | None, within: _Budget,
                        score: _Scorer,
                        make: Callable[[int], Design] = Design.on_policy_at) -> Prediction | None:
    """The cheapest on-policy batch (whole groups up to ``top``) within the steps cap; the user's B (``ref``) when
    none is cheaper. Up to ``DENSE_LIMIT`` batches are all scored; beyond, a bracket of 1024 evenly spaced batches
    narrows around the best until that many remain: exact, because on-policy compute (1 + B_noise/B')(mu max(B', floor)
    + B') is convex below the floor and rising above it, and the batches the cap allows are an interval (steps fall
    with B'), so the search costs log(B) scorings, whatever B's magnitude. ``top`` is within the work budget: on-policy
    work rises with B' ([W1]), so every batch up to it is too. ``make``: the design at a batch (dynamic sampling's,
    ``Design.dynamic_at``, with ``ref`` None: its cheapest batch, None if the cap allows none; its refill rounds
    [E11] move with B' / G, so beyond ``DENSE_LIMIT`` groups the bracket is a search, not a proof)."""
    low, high = 1, top // group  # whole groups k: the batch is k * group
    while high - low + 1 > DENSE_LIMIT:
        ks = np.unique(np.rint(np.linspace(low, high, 1025)).astype(np.int64))
        coarse = score([make(int(k) * group) for k in ks])
        allowed = [i for i, p in enumerate(coarse) if within(p)] or [ks.size - 1]  # on-policy: the largest allowed
        i = min(allowed, key=lambda j: coarse[j].compute)
        low, high = int(ks[max(i - 1, 0)]), int(ks[min(i + 1, ks.size - 1)])
    ons = score([make(k * group) for k in range(low, high + 1)])
    best_on = min((p for p in ons if within(p)), key=lambda p: p.compute, default=ref)
    return ref if ref is not None and ref.compute <= best_on.compute else best_on


def _cheapest_replay(top: int, group_size: int, max_horizon: int, within: _Budget,
                     score: _Scorer, *, zero_share: float = 0.0,
                     max_age: float = math.inf) -> Prediction | None:
    """The cheapest replay design within the steps cap, coarse to fine: (B', R) 4 per octave and the horizons, then
    every whole group within one coarse step of the best (B', R) with the horizons around its x. ``zero_share`` > 0:
    the selective designs instead ([E8]; N = R = B too, one generation's informative groups drawn with replacement),
    none whose admitted samples stay past ``max_age`` (ceil(x / (1 - z)) - 1 updates)."""
    selective = zero_share > 0
    allowed = partial(_replay_allowed, zero_share=zero_share, max_age=max_age)
    coarse, cols = _replay_grid(top, group_size, max_horizon, zero_share, max_age)
    best_replay = score.cheapest(coarse, within, cols)
    if best_replay is None:
        return None
    d = best_replay.design
    near_x = [x for x in range(1, max_horizon + 1) if d.x / 2 ** 0.5 <= x <= d.x * 2 ** 0.5]
    b_low, b_high = _groups_between(d.batch_size / 2 ** 0.25, d.batch_size * 2 ** 0.25, group_size, top)
    r_low, r_high = d.rollouts_per_step / 2 ** 0.25, d.rollouts_per_step * 2 ** 0.25
    fine = [Design(bb, rr, rr * x, selective=selective) for bb in _log_groups(b_low, b_high, group_size, 16)
            for rr in _log_groups(*_groups_between(r_low, min(r_high, bb), group_size, top), group_size, 16)
            for x in near_x if allowed(bb, rr, x)]
    return score.cheapest(fine, within, rival=best_replay)


def _replay_allowed(bb: int, rr: int, x: int, *, zero_share: float, max_age: float) -> bool:
    """Whether ``_cheapest_replay`` searches (B' = bb, R = rr, x): not on-policy's sizes (the on-policy search's);
    a selective design (``zero_share`` > 0) only if its admitted samples stay at most ``max_age`` updates."""
    if zero_share <= 0:
        return not (rr == bb and x == 1)
    return math.ceil(x / (1 - zero_share) - 1e-9) - 1 <= max_age


@lru_cache(maxsize=16)
def _replay_grid(top: int, group_size: int, max_horizon: int, zero_share: float, max_age: float
                 ) -> tuple[tuple[Design, ...], _Columns]:
    """``_cheapest_replay``'s coarse grid, (B', R) 4 per octave and the horizons, with its columns: the same at
    every noise scale the guard and the benchmark price it at, so built once (the arrays read-only)."""
    selective = zero_share > 0
    allowed = partial(_replay_allowed, zero_share=zero_share, max_age=max_age)
    coarse = tuple(Design(bb, rr, rr * x, selective=selective) for bb in _log_groups(group_size, top, group_size, 4)
                   for rr in _log_groups(group_size, bb, group_size, 4)
                   for x in _horizons(max_horizon) if allowed(bb, rr, x))
    cols = _columns(coarse)
    for column in cols:
        column.flags.writeable = False
    return coarse, cols


def epoch_designs(rollouts: list[int], group_size: int, max_epochs: int, max_age: float = math.inf) -> list[Design]:
    """Every epoch design over the generations ``rollouts`` (whole groups): e = 1 .. ``max_epochs`` passes over m = 1,
    2, 4, ... mini-batches of whole groups with e m > 1, none whose oldest sample is older than ``max_age`` updates
    (e m - 1)."""
    return [Design.epochs_of(rr, e, m, group_size) for rr in rollouts for e in range(1, max_epochs + 1)
            for m in (2 ** k for k in range(int(math.log2(rr // group_size)) + 1))
            if e * m > 1 and rr % (m * group_size) == 0 and e * m - 1 <= max_age]


def epoch_family(top: int, group_size: int, max_epochs: int, max_age: float = math.inf) -> list[Design]:
    """``epoch_designs`` over the generations R of whole groups up to ``top``, 4 per octave: the family the guard
    ranks by worst regret whole (theory/guarded.py), where one search per b keeps only that b's cheapest."""
    return epoch_designs(_log_groups(group_size, top, group_size, 4), group_size, max_epochs, max_age)


def _cheapest_epochs(top: int, group_size: int, max_epochs: int, within: _Budget,
                     score: _Scorer, max_age: float = math.inf
                     ) -> Prediction | None:
    """The cheapest epoch design within the steps cap: one generation of R (whole groups up to ``top``, 4 per
    octave, then 16 per octave within one coarse step of the best R), e = 2 .. ``max_epochs`` passes over m = 1, 2,
    4, ... mini-batches of whole groups (m e > 1: e = 1 with m > 1 is PPO's single pass, also an answer), none
    whose oldest sample is older than ``max_age`` updates (e m - 1)."""
    def designs(rollouts: list[int]) -> list[Design]:
        return epoch_designs(rollouts, group_size, max_epochs, max_age)

    best = score.cheapest(designs(_log_groups(group_size, top, group_size, 4)), within)
    if best is None:
        return None
    r = best.design.rollouts_per_step
    fine = _log_groups(*_groups_between(r / 2 ** 0.25, r * 2 ** 0.25, group_size, top), group_size, 16)
    return score.cheapest(designs(fine), within, rival=best)


def _cheapest_overlapped(group: int, top: int, within: _Budget,
                         score: _Scorer) -> Prediction | None:
    """The cheapest overlapped batch (k = 1, whole groups up to ``top``) within the steps cap: 16 per octave, then
    every whole group within one coarse step of the best."""
    best = score.cheapest([Design.overlapped_at(b) for b in _log_groups(group, top, group, 16)], within)
    if best is None:
        return None
    b = best.design.batch_size
    low, high = _groups_between(b / 2 ** (1 / 16), b * 2 ** (1 / 16), group, top)
    fine = [Design.overlapped_at(bb) for bb in range(low, high + 1, group)]
    return score.cheapest(fine, within, rival=best)


def _winner(best_replay: Prediction | None, best_on: Prediction, batch_size: int) -> str:
    """Which of ``WholeDesign``'s answers wins on compute, in words."""
    if best_replay is not None and best_replay.compute < best_on.compute:
        return "replay"
    return on_policy_winner(best_on.design.batch_size, batch_size)


def on_policy_winner(batch: int, batch_size: int) -> str:
    """An on-policy answer at ``batch`` against the user's B, in ``WholeDesign.winner``'s words."""
    if batch == batch_size:
        return "on-policy at B"
    return "on-policy (smaller batch)" if batch < batch_size else "on-policy (larger batch)"


def within_budgets(p: Prediction, cap: float, work_cap: float) -> bool:
    """Steps within the steps cap and work within the work budget (``work_cap`` inf: none)."""
    return p.steps <= cap and p.work <= work_cap * (1 + 1e-12)  # the budget's own batch passes despite rounding


def _cheapest(predictions: list[Prediction], within: Callable[[Prediction], bool]) -> Prediction | None:
    """The least compute among the predictions ``within`` allows (ties: the first)."""
    return min((p for p in predictions if within(p)), key=lambda p: p.compute, default=None)


def _log_subset(values: np.ndarray, per_octave: int = 8) -> list[int]:
    """Whole-group values thinned to about ``per_octave`` per factor 2 (plus both ends): the search stays fast at
    large B while resolving the optimum to within 2^(1/8) = 9%."""
    values = np.asarray(values, dtype=np.int64)
    if values.size <= 4 * per_octave:
        return [int(v) for v in values]
    grid = np.unique(np.round(np.exp(np.linspace(np.log(values[0]), np.log(values[-1]),
                                                 int(per_octave * np.log2(values[-1] / values[0])) + 1))))
    picked = {int(values[np.argmin(np.abs(values - g))]) for g in grid}
    return sorted(picked | {int(values[0]), int(values[-1])})


DENSE_LIMIT = 1 << 16
"""Whole-group ranges of up to this many values are enumerated (numpy arrays of that length); longer ones are thinned
without being materialised, so the searches take time and memory independent of the batch's magnitude."""


def _groups_between(low: float, high: float, group: int, top: int) -> tuple[int, int]:
    """(first, last): the whole groups g = k * group, group <= g <= top, with low <= g <= high (first > last when
    none), decided by the same float comparisons as a mask over every group would be."""
    first, last = max(1, math.ceil(low / group)), min(top // group, math.floor(high / group))
    while first > 1 and (first - 1) * group >= low:  # the division's rounding, undone by the comparison itself
        first -= 1
    while first * group < low:
        first += 1
    while last < top // group and (last + 1) * group <= high:
        last += 1
    while last >= 1 and last * group > high:
        last -= 1
    return first * group, last * group


def _log_groups(first: int, last: int, group: int, per_octave: int = 8) -> list[int]:
    """``_log_subset`` of the whole groups first, first + group, ..., last; beyond ``DENSE_LIMIT`` values the grid
    snaps to the nearest group arithmetically instead of over an array of every group."""
    count = (last - first) // group + 1
    if count <= 0:
        return []
    if count <= DENSE_LIMIT:
        return _log_subset(np.arange(first, last + 1, group), per_octave)
    grid = np.unique(np.round(np.exp(np.linspace(np.log(first), np.log(last),
                                                 int(per_octave * np.log2(last / first)) + 1))))
    picked = {first + int(np.clip(np.rint((g - first) / group), 0, count - 1)) * group for g in grid}
    return sorted(picked | {first, last})


def _horizons(max_horizon: int) -> list[int]:
    """Horizons 1, 2, 3, 4, 6, 8, 11, 16, ... (powers of sqrt 2, rounded) up to ``max_horizon``, which is included."""
    top = int(max_horizon)
    grid = {int(round(2 ** (k / 2))) for k in range(int(2 * math.log2(top)) + 1)}
    return sorted({v for v in grid if v <= top} | {top})


# --------------------------------------------------------------------------- measuring kappa in a pilot


def lag1_gradient_autocorrelation(kappa: float, optimizer: str = "sgd", beta1: float = 0.9) -> float:
    """corr(g_{t+1}, g_t) of successive minibatch gradients at stationarity along one direction, fresh noise each step.

    With g = h e + n (per unit eta: g~ = eta g = k e + eta n, k = eta h) and the state covariance P of the linear
    system: corr = (k^2 (A P)[0, 0] + k b[0]) / (k^2 P[0, 0] + 1). SGD: exactly -kappa / 2. Momentum and Adam (the
    same function of kappa): kappa [(2 beta1 - 1)(1 + beta1) - beta1 (1 - beta1) kappa] / (2 (1 + beta1 + beta1
    kappa)) (``derive forgetting-variance``), about (beta1 - 1/2) kappa: POSITIVE for beta1 > 1/2, the momentum
    carrying a kick on for ~1/(1 - beta1) steps.
    """
    _check_optimizer(optimizer, beta1)
    require_positive("kappa", kappa)
    if optimizer == "sgd":
        if not kappa < 2:
            raise ValueError(f"kappa must be < 2 for SGD (beyond it the step diverges), got {kappa!r}")
        return -kappa / 2  # derive forgetting-variance: (k^2 a - k (1 - a^2)) / (k^2 + 1 - a^2) = -k/2
    a, b, c = _linear_system(kappa, optimizer, beta1)
    if not np.max(np.abs(np.linalg.eigvals(a))) < 1:
        raise ValueError(f"kappa = {kappa:g} with beta1 = {beta1:g} is unstable for {optimizer}")
    # g~ = eta g = k e + eta n with k = eta h: kappa for Adam (unit DC gain), kappa (1 - beta1) for heavy ball
    k = kappa if optimizer == "adam" else kappa * (1.0 - beta1)
    from scipy.linalg import solve_discrete_lyapunov

    p = solve_discrete_lyapunov(a, np.outer(b, b))  # state covariance per unit (eta n)^2
    return float((k * k * (a @ p)[0, 0] + k * b[0]) / (k * k * p[0, 0] + 1.0))


def kappa_from_autocorrelation(corr: float, optimizer: str = "sgd", beta1: float = 0.9) -> float:
    """The kappa whose stationary lag-1 gradient autocorrelation is ``corr`` (``lag1_gradient_autocorrelation``
    inverted on its rising branch: for momentum and Adam corr peaks, 0.42 near kappa = 4.2 at beta1 = 0.9, and the
    smaller kappa is returned).

    SGD: kappa = -2 corr, so corr must be in (-1, 0). Momentum and Adam: corr is POSITIVE and grows with kappa (about
    0.4 kappa at beta1 = 0.9): the momentum carries a kick on for ~1/(1 - beta1) steps. Bias: early in a run and at
    low noise the drift of the mean gradient adds a positive term; for SGD that hides the signal (corr >= 0 raises),
    for momentum and Adam it adds to it and overstates kappa: prefer ``kappa_from_curvature_pairs`` there.
    """
    _check_optimizer(optimizer, beta1)
    corr = float(corr)
    if optimizer == "sgd":
        if not (math.isfinite(corr) and -1 < corr < 0):
            raise ValueError(f"the lag-1 gradient autocorrelation must be in (-1, 0) to give SGD's memory, got "
                             f"{corr:g}: the gradients' mean drift dominates their noise (early in a run or at low "
                             "noise)")
        return -2.0 * corr
    if not (math.isfinite(corr) and corr > 0):
        raise ValueError(f"the lag-1 gradient autocorrelation must be > 0 to give {optimizer}'s memory (beta1 = "
                         f"{beta1:g}), got {corr:g}")
    low, top = 1e-9, 1e-3
    while True:  # grow the bracket while the system stays stable
        try:
            if lag1_gradient_autocorrelation(top, optimizer, beta1) >= corr:
                break
        except ValueError:
            raise ValueError(f"lag-1 autocorrelation {corr:g} is more than {optimizer} with beta1 = {beta1:g} "
                             "produces at any stable step") from None
        low, top = top, top * 2.0
    from scipy.optimize import brentq

    return float(brentq(lambda k: lag1_gradient_autocorrelation(k, optimizer, beta1) - corr, low, top,
                        xtol=1e-14, rtol=1e-10))


@dataclass(frozen=True)
class KappaEstimate:
    """kappa with a bootstrap interval, and how it was measured (the profile record's ``memory`` field)."""

    kappa: float
    interval: tuple[float, float]
    level: float
    method: str  # "exact", "curvature-pairs" or "lag-autocorrelation"
    optimizer: str
    beta1: float
    pilot_batch: float | None
    units: int  # pairs or steps the estimate averages
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        def clean(v):
            return v if isinstance(v, (int, float)) and math.isfinite(v) else None

        return {"kappa": clean(self.kappa), "kappa_interval": [clean(v) for v in self.interval],
                "level": self.level, "method": self.method, "optimizer": self.optimizer, "beta1": self.beta1,
                "pilot_batch": self.pilot_batch, "units": self.units, **self.detail}

    def memory(self) -> Memory:
        return Memory(self.kappa, self.optimizer, self.beta1, self.pilot_batch)


def kappa_from_curvature_pairs(numerators: ArrayLike, denominators: ArrayLike, step: float,
                               rng: np.random.Generator, *, optimizer: str = "sgd", beta1: float = 0.9,
                               pilot_batch: float | None = None, n_boot: int = 1000,
                               level: float = 0.9) -> KappaEstimate:
    """kappa = eta sum_i xi_i^T H xi_i / sum_i |xi_i|^2 over pairs, xi = g_1 - g_2 the difference of two independent
    minibatch gradients at one theta (E xi xi^T = 2 Sigma / b, so the ratio of sums estimates tr(H Sigma) / tr Sigma;
    H xi is one Hessian-vector product). For Adam pass the preconditioned forms (D xi)^T H (D xi) and xi^T D xi
    (D = 1 / (sqrt(v) + eps) of the optimizer state) and eta = the learning rate. Ratio of sums: the ratio of means
    has a bias of order 1/pairs; the bootstrap over pairs gives the interval."""
    num, den = np.asarray(numerators, dtype=float).ravel(), np.asarray(denominators, dtype=float).ravel()
    if num.shape != den.shape or num.size < 2:
        raise ValueError(f"numerators and denominators must be equal-length with >= 2 pairs, got {num.size}, "
                         f"{den.size}")
    require_positive("step eta", step)
    require_positive("|xi|^2", den)
    from .resampling import central, quantile_interval, ratio_of_sums  # the measurements only, not optimal's rules

    value = float(step * num.sum() / den.sum())
    boots = ratio_of_sums(num, den, n_boot, rng, scale=step)
    lo, hi = quantile_interval(boots, central(level))
    return KappaEstimate(value, (lo, hi), level, "curvature-pairs", optimizer, float(beta1), pilot_batch,
                         int(num.size), {"step": float(step), "lambda_eff": float(num.sum() / den.sum())})


def kappa_from_gradient_series(dots: ArrayLike, sq_norms: ArrayLike, rng: np.random.Generator, *,
                               optimizer: str = "sgd", beta1: float = 0.9, pilot_batch: float | None = None,
                               block: int = 8, n_boot: int = 1000, level: float = 0.9) -> KappaEstimate:
    """kappa from successive gradients of one run: corr = sum_t g_{t+1} . g_t / sum_t |g_t|^2 (``dots`` (T,) the
    lag-1 dot products, ``sq_norms`` (T,) the squared norms, both through the same fixed projection), inverted by
    ``kappa_from_autocorrelation``. Needs fresh noise each step (on-policy; a replayed sample's noise adds C(1) > 0)
    and a near-stationary stretch: the mean gradient's drift biases corr upward early in a run and at low noise.
    Interval: a moving-block bootstrap over steps (blocks of ``block`` keep the series' short-range dependence);
    replicates whose corr has the wrong sign give no kappa and count as kappa = 0 (said in ``detail``)."""
    dots, sq = np.asarray(dots, dtype=float).ravel(), np.asarray(sq_norms, dtype=float).ravel()
    if dots.shape != sq.shape or dots.size < 2 * block:
        raise ValueError(f"dots and sq_norms must be equal-length with >= {2 * block} steps, got {dots.size}, "
                         f"{sq.size}")
    from .resampling import central, moving_block_indices, quantile_interval

    corr = float(dots.sum() / sq.sum())
    value = kappa_from_autocorrelation(corr, optimizer, beta1)
    rows = moving_block_indices(dots.size, block, n_boot, rng)
    corrs = dots[rows].sum(axis=1) / sq[rows].sum(axis=1)
    signal = corrs < 0 if optimizer == "sgd" else corrs > 0
    boots = np.array([kappa_from_autocorrelation(c, optimizer, beta1) if ok else 0.0 for c, ok in zip(corrs, signal)])
    lo, hi = quantile_interval(boots, central(level))
    return KappaEstimate(value, (lo, hi), level, "lag-autocorrelation", optimizer, float(beta1), pilot_batch,
                         int(dots.size), {"lag1_autocorrelation": corr,
                                          "replicates_without_signal": int((~signal).sum())})


def forgetting_pick(b_noise: float, batch_size: int, group_size: int, mu: float, kappa: float, optimizer: str = "adam",
                    beta1: float = 0.9, *, pilot_batch: float | None = None, staleness: Staleness = NO_STALENESS,
                    floor: float = 0.0, max_horizon: int = 64) -> dict:
    """The forgetting-aware rule's design at a fixed batch B (the fixed-B families of ``validate verify``): R over
    whole groups of ``group_size`` up to B, x = N/R over 1 .. ``max_horizon``, the least predicted compute
    (``predict``); on-policy (R = N = B) when nothing beats it. kappa was measured at ``pilot_batch`` (default:
    on-policy at B). Shaped like ``noise_scale.noise_scale_pick``."""
    require_int("group size", group_size, 1)
    if batch_size % group_size:
        raise ValueError(f"batch size B must be whole groups of {group_size}, got {batch_size}")
    memory = Memory(kappa, optimizer, beta1, float(batch_size) if pilot_batch is None else pilot_batch)
    on = predict(Design.on_policy_at(batch_size), b_noise, mu, memory, staleness, floor)
    candidates = [Design(batch_size, rr, rr * x) for rr in _log_groups(group_size, batch_size, group_size)
                  for x in _horizons(max_horizon) if not (rr == batch_size and x == 1)]
    best = min(predict_many(candidates, b_noise, mu, memory, staleness, floor) + [on], key=lambda p: p.compute)
    d = best.design
    return {"b_noise": b_noise, "batch_size": batch_size, "b": b_noise / batch_size, "mu": mu, "kappa": kappa,
            "optimizer": optimizer, "beta1": beta1, "regime": "on-policy" if d.on_policy else "replay",
            "rollouts_per_step": d.rollouts_per_step, "capacity": d.capacity, "x": d.x, "y": d.y, "psi": best.psi,
            "kappa_at_design": best.kappa, "steps": best.steps, "cost": best.compute / (batch_size * 1.0),
            "on_policy_cost": on.compute / batch_size, "saving": on.compute / best.compute}

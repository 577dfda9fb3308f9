"""Three more ways to reuse rollouts, in the linear model that gives ``forgetting.psi``: epochs over mini-batches,
bounded staleness (a delayed gradient), and selective replay (groups with a zero advantage dropped).

Sources: issue 40; the model of ``theory/forgetting.py`` (docs/THEORY.md, "Forgetting: the horizon and the free
batch"; ``replay-theory derive forgetting-variance``): along a direction of curvature h the error e follows a linear
system driven by the update's noise, and a stored sample's noise re-entering at lag l is weighted by the impulse
response's autocorrelation rho(l) (``forgetting.impulse_autocorrelation``). Derivations: docs/THEORY.md, "Reuse
families". Equation anchors [E1]..[E9] below are that section's.

| code name       | symbol             | meaning                                                                   |
|-----------------|--------------------|---------------------------------------------------------------------------|
| ``epochs``      | e                  | passes over one generation of R rollouts (PPO epochs, TRL num_iterations)  |
| ``minibatches`` | m                  | optimizer updates per pass; each uses b = R / m rollouts                  |
| ``shuffle``     | --                 | a fresh permutation each epoch (random lags) or one fixed order (lags d m)  |
| ``psi_epochs``  | psi_E(e, m, kappa) | b V_eff / sigma^2 of the epoch schedule: 1 without reuse (e = 1)           |
| ``delay``       | k                  | the oldest age of a rollout's policy when its gradient is applied          |
| ``weights``     | w_s                | share of the drift evaluated at the policy of age s (sum 1)                |
| ``variance_ratio`` | Var e(w) / Var e(w = [1]) | the delay's stationary error variance against no delay          |
| ``zero_share``  | z                  | share of groups with zero advantage (TRL's frac_reward_zero_std)           |

Epochs [E1]-[E3]: a sample used at updates l_1 < ... < l_e of its generation adds sum_{i,j} rho(|l_i - l_j|) to the
period-averaged noise, so b V_eff / sigma^2 = psi_E = (1/e) E sum_{i,j} rho(|l_i - l_j|) = 1 + (2/e) sum_{d=1}^{e-1}
(e - d) E rho(d m + D), D = 0 in a fixed order, D = u' - u (u, u' uniform on 0..m-1) when shuffled per epoch.
Staleness [E4]-[E6]: each rollout is used once, so its noise is fresh (psi = 1); the delay moves the drift:
theta_{t+1} = theta_t - kappa (sum_s w_s theta_{t-s} + n_t), a companion system whose stationary variance solves a
discrete Lyapunov equation. Selective replay [E7]-[E9]: a zero-advantage sample carries neither drift nor noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from ..checks import require_integer, require_positive, require_unit_interval
from .forgetting import (  # psi_epochs lives with psi, which predict_many prices epoch designs with
    _check_optimizer,
    effective_variance,
    impulse_autocorrelation,
    psi_epochs,
    psi_fractional,
    stable_kappa,
)

SPREADS = ("fixed", "mixed", "random")
"""How the ages of one update's rollouts spread over 0..k: all at age k; a fixed share 1/(k + 1) at each age (a
streaming pipeline's steady state); or one age per update drawn uniformly (the whole batch from one stale policy)."""

# --------------------------------------------------------------------------- epochs over mini-batches


def epoch_lag_weights(epochs: int, minibatches: int, *, shuffle: bool = False) -> np.ndarray:
    """W (e m,): psi_E = sum_l W[l] rho(l) [E2], W[0] = 1 and W[l] = (2/e) sum_d (e - d) P(d m + D = l).

    One sample per generation, e uses: a fixed order puts them at lags d m (W[d m] = 2 (e - d)/e); a permutation
    per epoch puts its use in epoch i in mini-batch u_i, uniform and independent across epochs, so the lag between
    epochs i < j is (j - i) m + u_j - u_i, the difference D triangular: P(D = delta) = (m - |delta|)/m^2.
    """
    e, m = require_integer("epochs e", epochs, 1), require_integer("minibatches m", minibatches, 1)
    w = np.zeros(e * m)
    w[0] = 1.0
    deltas = np.arange(-(m - 1), m) if shuffle else np.zeros(1, dtype=np.int64)
    p_delta = (m - np.abs(deltas)) / m**2 if shuffle else np.ones(1)
    for d in range(1, e):
        np.add.at(w, d * m + deltas, 2.0 * (e - d) / e * p_delta)  # [E2]
    return w


def psi_epochs_from_lags(epochs: int, minibatches: int, kappa: float, optimizer: str = "sgd", beta1: float = 0.9, *,
                         shuffle: bool = False) -> float:
    """psi_E as the lag sum sum_l W[l] rho(l) with ``forgetting.impulse_autocorrelation`` (the reference the closed
    form ``psi_epochs`` is tested against; it also serves momentum's critical damping, where the modes merge)."""
    w = epoch_lag_weights(epochs, minibatches, shuffle=shuffle)
    return float(w @ impulse_autocorrelation(np.arange(w.size), kappa, optimizer, beta1))  # [E2]


def epochs_effective_variance(rollouts: int, epochs: int, minibatches: int, kappa: float, optimizer: str = "sgd",
                              beta1: float = 0.9, *, shuffle: bool = False) -> tuple[float, float]:
    """(b, b V_eff / sigma^2) of the schedule: the mini-batch b = R/m and psi_E [E1]. Against the FIFO of
    ``forgetting.effective_variance`` (B V_eff = 1 + y psi - 1/N) at the same reuse y = e: psi_E tends to e where the
    FIFO's tends to 1 + e (no draw with replacement), and falls to 1 where the FIFO's falls to 1 + psi."""
    require_integer("rollouts R", rollouts, 1)
    if rollouts % minibatches:
        raise ValueError(f"rollouts R must be whole mini-batches, got R = {rollouts}, m = {minibatches}")
    return rollouts / minibatches, psi_epochs(epochs, minibatches, kappa, optimizer, beta1, shuffle=shuffle)


# --------------------------------------------------------------------------- bounded staleness: a delayed drift


def delay_weights(delay: int, spread: str = "fixed") -> np.ndarray:
    """w (k + 1,): the drift's share at each age s = 0..k: e_k for ``fixed``, 1/(k + 1) each for ``mixed`` and (in
    expectation) ``random``."""
    k = require_integer("delay k", delay, 0)
    if spread not in SPREADS:
        raise ValueError(f"spread must be one of {SPREADS}, got {spread!r}")
    if spread == "fixed":
        return np.eye(k + 1)[k]
    return np.full(k + 1, 1.0 / (k + 1))


def delayed_system(kappa: float, weights: ArrayLike, optimizer: str = "sgd",
                   beta1: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    """(A, b): the error's state s_t = (e_t, e_{t-1}, .., e_{t-k} [, eta m_t]) and its response to a unit eta n_t [E4].

    The drift sees d_t = sum_s w_s e_{t-s}. SGD: e_{t+1} = e_t - kappa d_t - eta n_t. Adam (v frozen, as
    ``forgetting`` linearises it): eta m' = beta eta m + (1 - beta)(kappa d + eta n), e' = e - eta m'. Heavy ball:
    eta v' = beta eta v + kappa (1 - beta) d + eta n, e' = e - eta v'. w = [1] is ``forgetting``'s system.
    """
    _check_optimizer(optimizer, beta1)
    require_positive("kappa", kappa)
    w = np.asarray(weights, dtype=float).ravel()
    if w.size < 1 or np.any(w < 0) or not math.isclose(w.sum(), 1.0, rel_tol=1e-12):
        raise ValueError(f"weights must be >= 0 and sum to 1, got {w}")
    k1 = w.size
    n = k1 + (optimizer != "sgd")
    a, b = np.zeros((n, n)), np.zeros(n)
    a[1:k1, :k1 - 1] = np.eye(k1 - 1)  # the history shifts by one
    if optimizer == "sgd":
        a[0, :k1] = -kappa * w
        a[0, 0] += 1.0
        b[0] = -1.0
        return a, b
    beta = float(beta1)
    gain, kick = (kappa * (1 - beta), 1.0) if optimizer == "momentum" else (kappa * (1 - beta), 1 - beta)
    a[-1, :k1] = gain * w  # the moment's row: beta M + gain d (+ kick eta n)
    a[-1, -1] = beta
    a[0] = -a[-1]  # e' = e - M'
    a[0, 0] += 1.0
    b[-1], b[0] = kick, -kick
    return a, b


def _second_moment_map(kappa: float, delay: int, spread: str, optimizer: str, beta1: float,
                       weights: ArrayLike | None) -> tuple[np.ndarray, np.ndarray]:
    """(M, q): vec P = M vec P + q for the stationary state covariance P [E5]. Deterministic weights: M = A (x) A; a
    random age per update (``random``): M = E[A_s (x) A_s] over s uniform on 0..k (the mean-square recursion of a
    system whose matrix is drawn afresh each step, independent of the state)."""
    if spread == "random":
        systems = [delayed_system(kappa, np.eye(delay + 1)[s], optimizer, beta1) for s in range(delay + 1)]
        m = sum(np.kron(a, a) for a, _ in systems) / (delay + 1)
        b = systems[0][1]
    else:
        a, b = delayed_system(kappa, delay_weights(delay, spread) if weights is None else weights, optimizer, beta1)
        m = np.kron(a, a)
    return m, np.outer(b, b).ravel()


def delay_spectral_radius(kappa: float, delay: int, spread: str = "fixed", optimizer: str = "sgd", beta1: float = 0.9,
                          *, weights: ArrayLike | None = None) -> float:
    """The spectral radius of the second-moment map [E6]: the stationary variance exists iff it is < 1 (for
    deterministic weights it is rho(A)^2)."""
    m, _ = _second_moment_map(kappa, delay, spread, optimizer, beta1, weights)
    return float(np.max(np.abs(np.linalg.eigvals(m))))


def delay_variance(kappa: float, delay: int, spread: str = "fixed", optimizer: str = "sgd", beta1: float = 0.9, *,
                   weights: ArrayLike | None = None) -> float:
    """Var e per unit variance of eta n_t: P[0, 0] with vec P = (I - M)^-1 vec(b b^T) [E5]; inf when unstable [E6]."""
    m, q = _second_moment_map(kappa, delay, spread, optimizer, beta1, weights)
    if not np.max(np.abs(np.linalg.eigvals(m))) < 1:
        return math.inf
    p = np.linalg.solve(np.eye(q.size) - m, q)
    return float(p[0])


def delay_variance_ratio(kappa: float, delay: int, spread: str = "fixed", optimizer: str = "sgd", beta1: float = 0.9,
                         *, weights: ArrayLike | None = None) -> float:
    """Var e with the delay / Var e without it, at the same kappa and noise [E5] (inf beyond the stable range).
    SGD, k = 1 fixed: (1 + kappa)(2 - kappa) / ((1 - kappa)(2 + kappa))."""
    return delay_variance(kappa, delay, spread, optimizer, beta1, weights=weights) / delay_variance(
        kappa, 0, "fixed", optimizer, beta1)


def delay_stable_kappa(delay: int, spread: str = "fixed", optimizer: str = "sgd", beta1: float = 0.9, *,
                       weights: ArrayLike | None = None, tol: float = 1e-10) -> float:
    """The smallest kappa at which the delayed system stops having a stationary variance [E6] (the first crossing of
    spectral radius 1, found on a grid and bisected). SGD with a fixed delay k: 2 sin(pi / (2 (2k + 1))) (2 at k = 0,
    1 at k = 1, 0.445 at k = 3)."""
    def unstable(kap: float) -> bool:
        return delay_spectral_radius(kap, delay, spread, optimizer, beta1, weights=weights) >= 1

    top = stable_kappa(optimizer, beta1)
    grid = np.geomspace(1e-4, top, 400)
    hit = next((i for i, kap in enumerate(grid) if unstable(float(kap))), None)
    if hit is None:
        return top
    if hit == 0:
        raise ValueError("the delayed system is unstable at every kappa on the grid")
    low, high = float(grid[hit - 1]), float(grid[hit])
    while high - low > tol * high:
        mid = 0.5 * (low + high)
        low, high = (low, mid) if unstable(mid) else (mid, high)
    return low


# --------------------------------------------------------------------------- selective replay


@dataclass(frozen=True)
class FilteredNoise:
    """What a share z of zero-advantage groups does to a design, per sigma^2 of an informative sample [E7]-[E9].

    The error variance is that of ``forgetting``'s model at contraction ``kappa`` with B V_eff / sigma^2 = ``bv``;
    ``horizon`` and ``reuse`` are the FIFO's x and y over informative samples (None on-policy)."""

    kappa: float
    bv: float
    horizon: float | None
    reuse: float | None


def filtered_noise(batch_size: int, rollouts_per_step: int, capacity: int, zero_share: float, kappa: float,
                   optimizer: str = "sgd", beta1: float = 0.9, *, selective: bool,
                   on_policy: bool = False) -> FilteredNoise:
    """Zero-advantage groups kept (``selective=False``) or dropped before the buffer (``selective=True``).

    Kept [E7]: a batch of B holds (1 - z) B informative samples; the mean over B scales their drift and noise by
    (1 - z), so the update is one at step (1 - z) eta over (1 - z) B samples: kappa -> (1 - z) kappa and B V_eff /
    sigma^2 -> B V_eff(B, R, N; (1 - z) kappa) / (1 - z) (the FIFO's autocovariance scales by 1 - z, the step's
    square by (1 - z)^2). Dropped [E8]: only (1 - z) R rollouts enter per step, so x = N / ((1 - z) R) and y = B /
    ((1 - z) R) grow by 1 / (1 - z) and kappa stays; x between whole steps is priced by ``psi_fractional`` [E10].
    On-policy [E9]: kept gives 1 / (1 - z) at (1 - z) kappa; dropped and refilled (dynamic sampling) gives 1 at kappa
    and costs R / (1 - z) rollouts per update. Drawn with
    replacement, the informative count of a batch is binomial; its spread, relative size z / ((1 - z) B), moves the
    drift at second order in kappa and is left out.
    """
    z = require_unit_interval("zero share z", zero_share, closed=False)
    require_positive("kappa", kappa)
    if on_policy:
        return FilteredNoise(kappa, 1.0, None, None) if selective else FilteredNoise((1 - z) * kappa, 1 / (1 - z),
                                                                                     None, None)
    if selective:
        kept = (1 - z) * rollouts_per_step
        horizon = capacity / kept  # whole steps or between them: psi_fractional [E10]
        bv = 1.0 + batch_size / kept * psi_fractional(horizon, kappa, optimizer, beta1) - 1.0 / capacity
        return FilteredNoise(kappa, bv, horizon, batch_size / kept)  # [E8]
    k_eff = (1 - z) * kappa
    bv = effective_variance(batch_size, rollouts_per_step, capacity, k_eff, optimizer, beta1) / (1 - z)  # [E7]
    return FilteredNoise(k_eff, bv, capacity / rollouts_per_step, batch_size / rollouts_per_step)

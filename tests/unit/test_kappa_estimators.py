"""The kappa estimators of theory/forgetting.py on synthetic data with a known H and Sigma (issue 30): curvature pairs
and the lag-1 autocorrelation recover kappa = eta tr(H Sigma) / tr Sigma within their 90% intervals."""

import numpy as np

from replay_theory.theory.forgetting import kappa_from_curvature_pairs, kappa_from_gradient_series


def test_curvature_pairs_recover_eta_tr_h_sigma_over_tr_sigma():
    rng = np.random.default_rng(0)
    d, pairs, b, eta = 6, 400, 8, 0.05
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    H = q @ np.diag([0.5, 1.0, 2.0, 3.0, 5.0, 8.0]) @ q.T  # known curvature
    L = rng.standard_normal((d, d)) * np.linspace(0.3, 1.5, d)
    sigma = L @ L.T  # known per-sample noise covariance
    truth = eta * np.trace(H @ sigma) / np.trace(sigma)
    noise = rng.multivariate_normal(np.zeros(d), sigma, size=(pairs, 2, b)).mean(axis=2)  # (pairs, 2, d) minibatch
    xi = noise[:, 0] - noise[:, 1]  # the mean gradient cancels in the difference
    est = kappa_from_curvature_pairs(np.einsum("pd,de,pe->p", xi, H, xi), np.einsum("pd,pd->p", xi, xi), eta,
                                     np.random.default_rng(1))
    assert est.interval[0] <= truth <= est.interval[1] and abs(est.kappa / truth - 1) < 0.1
    # Adam's preconditioned form: eta tr(D H D Sigma) / tr(D Sigma) from (D xi)^T H (D xi) and xi^T D xi
    D = np.linspace(0.5, 2.0, d)
    truth_d = eta * np.trace(np.diag(D) @ H @ np.diag(D) @ sigma) / np.trace(np.diag(D) @ sigma)
    w = xi * D
    est_d = kappa_from_curvature_pairs(np.einsum("pd,de,pe->p", w, H, w), np.einsum("pd,pd->p", xi, w), eta,
                                       np.random.default_rng(2), optimizer="adam")
    assert est_d.interval[0] <= truth_d <= est_d.interval[1]


def _series(kappa: float, optimizer: str, steps: int, seed: int, d: int = 8):
    """Stationary linear dynamics along d directions of curvature h = kappa / eta, fresh noise each step: SGD
    e' = e - eta g, or Adam's linearisation m' = beta m + (1 - beta) g, e' = e - eta m' (theory/forgetting.py);
    g = h e + n. Returns the lag-1 dot products and squared norms of successive gradients."""
    rng = np.random.default_rng(seed)
    eta, beta = 0.1, 0.9
    h = kappa / eta
    e, m = np.zeros(d), np.zeros(d)
    previous, dots, sq = None, [], []
    for t in range(steps + 2000):  # 2000 steps of burn-in to stationarity
        g = h * e + rng.standard_normal(d)
        if optimizer == "sgd":
            e = e - eta * g
        else:
            m = beta * m + (1 - beta) * g
            e = e - eta * m
        if previous is not None and t >= 2000:
            dots.append(g @ previous)
            sq.append(previous @ previous)
        previous = g
    return np.array(dots), np.array(sq)


def test_lag1_autocorrelation_recovers_kappa_at_stationarity():
    for optimizer, kappa in (("sgd", 0.2), ("adam", 0.2)):
        dots, sq = _series(kappa, optimizer, 20000, seed=3)
        est = kappa_from_gradient_series(dots, sq, np.random.default_rng(4), optimizer=optimizer, block=16,
                                         n_boot=300)
        assert est.interval[0] <= kappa <= est.interval[1], (optimizer, est)

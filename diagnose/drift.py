"""KL drift with sample age, and the FreshPER time constant it implies.

FreshPER (docs/REFERENCES.md) assumes KL(pi_t || pi_{t - Delta}) ~= c Delta (Eq. 12) and sets the age-decay time
constant tau = 1/c (Eq. 13).  The heuristic is not derived: locally KL ~= 0.5 dtheta^T F dtheta, so a steady drift
of the parameters gives KL growing like Delta^2 and a random walk gives KL growing like Delta.  We fit both shapes
to the per-age KL of the log,

    linear:     KL(a) = k0 + c a          quadratic:  KL(a) = k0 + q a^2

by least squares weighted by the tokens at each age (k0 absorbs a sampler / trainer mismatch floor at age 0), keep
the one with the smaller weighted residual, and report the log-log slope of KL against age (ages > 0) as the
exponent p (1 = linear, 2 = quadratic).  The KL per age is the k3 estimate of KL(pi_behav || pi_current), which
agrees with FreshPER's direction to second order in the drift.
"""

from __future__ import annotations

import math

import numpy as np

from ..theory.freshper import tau_from_kl_drift


def _weighted_fit(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float, float]:
    """Weighted least squares y = b0 + b1 x; returns (b0, b1, weighted SSE)."""
    design = np.stack([np.ones_like(x), x], axis=1)  # (k, 2)
    root = np.sqrt(w)
    coef, *_ = np.linalg.lstsq(design * root[:, None], y * root, rcond=None)
    resid = y - design @ coef
    return float(coef[0]), float(coef[1]), float(np.sum(w * resid**2))


def fit_kl_drift(ages: np.ndarray, kl: np.ndarray, counts: np.ndarray) -> dict:
    """Fit KL against age. ``ages``, ``kl``, ``counts``: (k,) one entry per age value.

    Returns ``rate_per_step`` (c), ``tau`` (= 1/c, inf when c <= 0), ``floor`` (k0),
    ``shape`` ("linear", "quadratic" or "undetermined" with fewer than three ages),
    ``exponent`` (log-log slope, None when undefined), both fits' coefficients and
    residuals, and the ages used.
    """
    ages, kl, w = (np.asarray(a, dtype=np.float64) for a in (ages, kl, counts))
    ok = np.isfinite(ages) & np.isfinite(kl) & (w > 0)
    ages, kl, w = ages[ok], kl[ok], w[ok]
    distinct = len(set(ages.tolist()))  # not np.unique: numpy 2 imports numpy.ma for it, on every diagnose
    if distinct < 2:
        return {"shape": "undetermined", "reason": "needs at least two distinct ages", "n_ages": distinct}
    k0, c, sse_linear = _weighted_fit(ages, kl, w)
    q0, q, sse_quadratic = _weighted_fit(ages**2, kl, w)
    shape = "undetermined" if distinct < 3 else "linear" if sse_linear <= sse_quadratic else "quadratic"
    exponent = None
    pos = (ages > 0) & (kl > 0)
    if len(set(ages[pos].tolist())) >= 2:
        _, exponent, _ = _weighted_fit(np.log(ages[pos]), np.log(kl[pos]), w[pos])
    rate = max(c, 0.0)
    return {
        "kl_estimator": "k3",
        "rate_per_step": rate,  # Eq. (12), FreshPER: KL ~= c Delta
        "tau": float(tau_from_kl_drift(rate)),  # Eq. (13), FreshPER: tau = 1/c
        "floor": k0,
        "shape": shape,
        "exponent": None if exponent is None or not math.isfinite(exponent) else float(exponent),
        "linear": {"floor": k0, "slope": c, "sse": sse_linear},
        "quadratic": {"floor": q0, "coef": q, "sse": sse_quadratic},
        "n_ages": distinct,
    }

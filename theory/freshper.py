"""FreshPER: freshness-aware prioritized experience replay.

Paper: "Freshness-Aware Prioritized Experience Replay for LLM/VLM Reinforcement
Learning" (FreshPER, docs/REFERENCES.md, arXiv:2604.16918),
Sec. 3.2-3.5 and App. C.

| code name              | paper symbol          | meaning                                              |
|------------------------|-----------------------|------------------------------------------------------|
| ``c``                  | c                     | KL drift per step, KL(pi_theta, pi_mu) ~= c Delta    |
| ``tau``                | tau = 1/c             | age-decay time constant (Eq. 13)                     |
| ``age``                | Delta_i = t - t_i     | steps since trajectory i was collected               |
| ``p_base``             | p_i^base              | base priority, e.g. abs(r_i) + eps (Sec. 3.4)        |
| ``priorities``         | p_i                   | p_base * exp(-Delta_i / tau) (Eq. 14)                |
| ``alpha``              | alpha                 | priority exponent, alpha = 0 is uniform (Eq. 2)      |
| ``probs``              | P(i)                  | sampling probability (Eq. 2)                         |
| ``beta``               | beta                  | IS-correction exponent (Eq. 3 / 15)                  |
| ``n``                  | n                     | number of importance-weighted samples (Eq. 12)       |

Axis convention: buffer items lie along the **last** axis; leading axes are a
batch (seeds, settings) and are carried through untouched.

Conventions (the order of decay and exponent, the signed crossover age, log space): ``sampling_probabilities``
and ``crossover_age``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ..checks import invalid, require_nonnegative, require_positive

__all__ = [
    "tau_from_kl_drift",
    "half_life",
    "effective_time_constant",
    "crossover_age",
    "is_below_fresh",
    "age_decay_weight",
    "priorities",
    "sampling_probabilities",
    "is_weights",
    "ess_age_bound",
]


def _require_unit_interval(name: str, value: np.ndarray) -> None:
    """0 <= value <= 1 elementwise, NaN rejected."""
    bad = ~((value >= 0.0) & (value <= 1.0))
    if np.any(bad):
        raise invalid(name, "in [0, 1]", float(value[bad].ravel()[0]), fmt="g")


def _require_last_axis(name: str, value: np.ndarray) -> None:
    if value.ndim == 0 or value.shape[-1] == 0:
        raise ValueError(
            f"{name} must have at least one item along the last axis, got shape {value.shape}"
        )


def _scalar_or_array(x: np.ndarray) -> np.ndarray | float:
    """0-d results come back as numpy scalars, everything else as arrays."""
    return x[()]


def tau_from_kl_drift(c: ArrayLike) -> np.ndarray | float:
    """Age-decay time constant tau = 1/c from a measured KL drift rate per step.

    ``c`` is the slope of KL(pi_theta || pi_mu) against age (Eq. 12's heuristic
    KL ~= c Delta). ``c = 0`` (no drift) gives tau = inf, i.e. standard PER.
    Raises ``ValueError`` unless c >= 0.
    """
    c_arr = np.asarray(c, dtype=float)
    require_nonnegative("c", c_arr, allow_inf=True)
    with np.errstate(divide="ignore"):
        tau = 1.0 / c_arr  # Eq. (13), FreshPER: tau = 1/c
    return _scalar_or_array(tau)


def half_life(tau: ArrayLike) -> np.ndarray | float:
    """Priority half-life t_1/2 = tau ln 2 (Sec. 3.4). Requires tau > 0 (inf allowed)."""
    tau_arr = np.asarray(tau, dtype=float)
    require_positive("tau", tau_arr, allow_inf=True)
    return _scalar_or_array(tau_arr * np.log(2.0))  # Sec. 3.4, FreshPER: t_1/2 = tau ln 2


def effective_time_constant(tau: ArrayLike, alpha: ArrayLike) -> np.ndarray | float:
    """Time constant of the *sampling* distribution when alpha follows the decay: tau / alpha.

    (p_base e^{-Delta/tau})^alpha = p_base^alpha e^{-Delta/(tau/alpha)}, so the
    released code (exponent after decay) forgets at tau/alpha, e.g. 833.33 steps
    for tau = 500, alpha = 0.6. alpha = 0 (uniform sampling) gives inf.
    Requires tau > 0 (inf allowed) and alpha in [0, 1].
    """
    tau_arr = np.asarray(tau, dtype=float)
    alpha_arr = np.asarray(alpha, dtype=float)
    require_positive("tau", tau_arr, allow_inf=True)
    _require_unit_interval("alpha", alpha_arr)
    with np.errstate(divide="ignore"):
        tau_eff = tau_arr / alpha_arr  # Eqs. (2)+(14), FreshPER: (p e^{-D/tau})^a = p^a e^{-D a/tau}
    return _scalar_or_array(tau_eff)


def crossover_age(tau: ArrayLike, p_old: ArrayLike, p_new: ArrayLike) -> np.ndarray | float:
    """Signed age tau ln(p_old / p_new) beyond which an old item falls below a fresh one.

    An item with base priority ``p_old`` and age Delta has p_old e^{-Delta/tau};
    it is below a fresh item (age 0) with ``p_new`` iff Delta > tau ln(p_old/p_new).
    The value is <= 0 when p_old <= p_new (already at or below at age 0), +inf
    when tau = inf and p_old > p_new (standard PER never crosses). Independent
    of alpha. Requires tau > 0 (inf allowed), p_old > 0, p_new > 0.

    :func:`crossover_age` returns the *signed* age ``tau ln(p_old / p_new)``; a
    value <= 0 means the old item is already at or below the fresh one at age 0.
    The crossover does not depend on alpha (x -> x**alpha is increasing).
    """
    tau_arr = np.asarray(tau, dtype=float)
    p_old_arr = np.asarray(p_old, dtype=float)
    p_new_arr = np.asarray(p_new, dtype=float)
    require_positive("tau", tau_arr, allow_inf=True)
    require_positive("p_old", p_old_arr)
    require_positive("p_new", p_new_arr)
    log_ratio = np.log(p_old_arr) - np.log(p_new_arr)
    with np.errstate(invalid="ignore"):
        age = np.where(log_ratio == 0.0, 0.0, tau_arr * log_ratio)  # Eq. (14), FreshPER, solved for Delta
    return _scalar_or_array(age)


def is_below_fresh(
    age: ArrayLike, tau: ArrayLike, p_old: ArrayLike, p_new: ArrayLike
) -> np.ndarray | bool:
    """True where p_old e^{-age/tau} < p_new, i.e. age > :func:`crossover_age`.

    Compared in log space, so it stays exact when e^{-age/tau} underflows.
    Requires age >= 0 (finite), tau > 0 (inf allowed), p_old > 0, p_new > 0.
    """
    age_arr = np.asarray(age, dtype=float)
    require_nonnegative("age", age_arr)
    tau_arr = np.asarray(tau, dtype=float)
    require_positive("tau", tau_arr, allow_inf=True)
    p_old_arr = np.asarray(p_old, dtype=float)
    p_new_arr = np.asarray(p_new, dtype=float)
    require_positive("p_old", p_old_arr)
    require_positive("p_new", p_new_arr)
    below = np.log(p_old_arr) - age_arr / tau_arr < np.log(p_new_arr)  # Eq. (14), FreshPER
    return _scalar_or_array(np.asarray(below))


def age_decay_weight(age: ArrayLike, tau: ArrayLike) -> np.ndarray | float:
    """Age-decay factor w_age = exp(-age / tau); tau = inf gives 1 (standard PER).

    Requires age >= 0 (finite) and tau > 0 (inf allowed).
    """
    age_arr = np.asarray(age, dtype=float)
    tau_arr = np.asarray(tau, dtype=float)
    require_nonnegative("age", age_arr)
    require_positive("tau", tau_arr, allow_inf=True)
    return _scalar_or_array(np.exp(-age_arr / tau_arr))  # Eq. (13), FreshPER


def priorities(p_base: ArrayLike, age: ArrayLike, tau: ArrayLike) -> np.ndarray | float:
    """Freshness-aware priority p_i = p_base_i * exp(-age_i / tau).

    Elementwise with broadcasting. May underflow to 0 for age/tau > ~745; pass
    ``p_base``, ``age`` and ``tau`` to :func:`sampling_probabilities` instead of
    these priorities when that matters. Requires p_base >= 0, age >= 0,
    tau > 0 (inf allowed).
    """
    p_arr = np.asarray(p_base, dtype=float)
    require_nonnegative("p_base", p_arr)
    return _scalar_or_array(p_arr * age_decay_weight(age, tau))  # Eq. (14), FreshPER


def sampling_probabilities(
    priorities: ArrayLike,
    alpha: ArrayLike,
    decay_then_exponent: bool = True,
    age: ArrayLike | None = None,
    tau: ArrayLike = np.inf,
) -> np.ndarray:
    """PER sampling probabilities P(i) = p_i^alpha / sum_k p_k^alpha over the last axis.

    With ``age=None`` the ``priorities`` are used as given (Eq. 2) and
    ``decay_then_exponent`` has no effect. With ``age`` given, ``priorities``
    are the *base* priorities and the age decay is folded in, in log space:

    * ``decay_then_exponent=True`` (released code):
      P ~ (p e^{-age/tau})^alpha = p^alpha e^{-age alpha/tau}
      (effective time constant tau/alpha);
    * ``decay_then_exponent=False``: P ~ p^alpha e^{-age/tau}
      (time constant tau on the sampling distribution).

    alpha = 0 is uniform (0**0 = 1, so zero priorities are sampled too); for
    alpha > 0 every row needs a positive priority. ``alpha`` broadcasts against
    ``priorities`` (a per-row alpha has shape (..., 1)). Requires priorities >= 0,
    alpha in [0, 1], age >= 0, tau > 0 (inf allowed).

    The released code raises the *decayed* priority to alpha,
    ``(p_base * exp(-Delta/tau))**alpha``, so the sampling distribution decays with
    time constant ``tau / alpha`` (833.3 steps for tau = 500, alpha = 0.6), not tau.
    :func:`sampling_probabilities` exposes both orders through
    ``decay_then_exponent``.
    Probabilities are computed in log space, so items whose decayed priority
    underflows (age/tau > ~745) still give a well-defined distribution.
    """
    p_arr = np.asarray(priorities, dtype=float)  # (..., N)
    alpha_arr = np.asarray(alpha, dtype=float)
    _require_last_axis("priorities", p_arr)
    require_nonnegative("priorities", p_arr)
    _require_unit_interval("alpha", alpha_arr)
    with np.errstate(divide="ignore", invalid="ignore"):
        logits = np.where(alpha_arr == 0.0, 0.0, alpha_arr * np.log(p_arr))  # Eq. (2): log p^alpha
    if age is not None:
        age_arr = np.asarray(age, dtype=float)
        tau_arr = np.asarray(tau, dtype=float)
        require_nonnegative("age", age_arr)
        require_positive("tau", tau_arr, allow_inf=True)
        rate = alpha_arr / tau_arr if decay_then_exponent else 1.0 / tau_arr
        logits = logits - rate * age_arr  # Eq. (14), FreshPER: decay in log space
    logits = np.broadcast_to(logits, np.broadcast_shapes(logits.shape, p_arr.shape))
    top = logits.max(axis=-1, keepdims=True)
    if np.any(np.isneginf(top)):
        raise ValueError(
            "priorities must have at least one entry > 0 along the last axis when alpha > 0"
        )
    weights = np.exp(logits - top)
    return weights / weights.sum(axis=-1, keepdims=True)  # Eq. (2), FreshPER


def is_weights(probs: ArrayLike, beta: ArrayLike) -> np.ndarray:
    """Importance-sampling weights w_i = (1/(N P(i)))^beta / max_j w_j over the last axis.

    N = number of items on the last axis; it cancels in the max-normalisation,
    so w_i = (min_j P(j) / P(i))^beta and max_i w_i = 1. The max runs over the
    items passed: give the buffer-wide P to normalise by the buffer (Schaul et
    al.'s implementation) or the batch's P to normalise within a batch. Items
    with P(i) = 0 are never sampled; they get weight 0 and are left out of the
    max. beta = 0 gives 1 for every sampled item. Requires probs >= 0 with a
    positive entry per row and beta in [0, 1].
    """
    p_arr = np.asarray(probs, dtype=float)  # (..., N)
    beta_arr = np.asarray(beta, dtype=float)
    _require_last_axis("probs", p_arr)
    require_nonnegative("probs", p_arr)
    _require_unit_interval("beta", beta_arr)
    positive = p_arr > 0.0
    if not np.all(positive.any(axis=-1)):
        raise ValueError("probs must have at least one entry > 0 along the last axis")
    with np.errstate(divide="ignore"):
        log_p = np.where(positive, np.log(p_arr), np.inf)
    log_p_min = log_p.min(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        log_w = beta_arr * (log_p_min - log_p)  # Eq. (3)/(15), FreshPER, after max-normalisation
    return np.where(positive, np.exp(log_w), 0.0)


def ess_age_bound(n: ArrayLike, c: ArrayLike, age: ArrayLike) -> np.ndarray | float:
    """Heuristic ESS upper bound n e^{-c age} (Eq. 12).

    Eq. (11) is ESS <= n e^{-KL}; Eq. (12) substitutes KL ~= c Delta, which the
    paper does not derive (steady drift gives KL ~ Delta^2, a random walk ~ Delta).
    Note the exact identity underneath is ESS = n e^{-D_2} with D_2 >= KL.
    Requires n > 0, c >= 0, age >= 0 (finite).
    """
    n_arr = np.asarray(n, dtype=float)
    c_arr = np.asarray(c, dtype=float)
    age_arr = np.asarray(age, dtype=float)
    require_positive("n", n_arr)
    require_nonnegative("c", c_arr)
    require_nonnegative("age", age_arr)
    return _scalar_or_array(n_arr * np.exp(-c_arr * age_arr))  # Eq. (12), FreshPER

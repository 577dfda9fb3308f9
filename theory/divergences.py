"""Divergences between a behaviour policy and a new policy, computed in log space.

Everything is a function of r = pi_new / pi_behav (``log_ratio = logp_new - logp_behav``) under samples from
``pi_behav``: EXACT values for categorical log-probabilities (..., K) and SAMPLE estimates from a ``log_ratio``
(..., n) with an optional 0/1 ``mask`` (the moment-based ones are ``theory/moments.py``'s).  The LAST axis is
reduced unless ``axis`` says otherwise; nothing forms exp(log r) where it could overflow (huge results are ``inf``,
never NaN); empty input, NaN or a bad mask raise.  Papers (docs/REFERENCES.md): FreshPER and M2PO.  ``kl_k1/k2/k3``
estimate KL(pi_behav || pi_new), the REVERSE of FreshPER's Eq. (11) bound (``bounds.py``, docs/ERRATA.md F2).

Code names and paper symbols::

    code                  FreshPER                           M2PO / frameworks
    --------------------  ---------------------------------  ---------------------------
    logp_new              log pi_theta                       log pi_new (= log pi_theta)
    logp_behav            log pi_mu                          log pi_behav
    log_ratio             log rho, rho from Eq. (4)          log r
    kl_exact(p, q)        D_KL(P || Q), Eq. (25)             -
    renyi_exact           D_alpha(P || Q), Eq. (22)          -
    d2_exact              D_2(P || Q), Eq. (23)              -
    chi2_exact            chi^2(P || Q), Eqs. (6), (24)      chi^2 of Thm 5.1
    ess_fraction_exact    ESS / n = e^{-D_2}, Eqs. (5), (9)  -
    m2_exact, m2          -                                  M_2, Eq. (4)
    kl_k1                 -                                  KL-hat, Eq. (3) (k1)
    kl_k2, kl_k3          -                                  k2 = M_2 / 2, k3 (Schulman)
    ess_kong              ESS = n / (1 + Var rho), Eq. (5)   -
    ess_kish_fraction     (sum w)^2 / (n sum w^2)            TRL/verl ess_frac, PipelineRL rl/ess
    chi2_estimate         E[rho^2] - 1, Eq. (21)             verl chi2_token
    ratio_stats           -                                  is_ratio_{min,mean,max,std}
"""

from __future__ import annotations

import math
from typing import Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .moments import (
    Moments,
    as_result,
    chi2_from_sums,
    d2_from_sums,
    ess_frac_from_sums,
    ess_from_sums,
    k3_terms,
    kl_k1_from_sums,
    kl_k2_from_sums,
    kl_k3_from_sums,
    m2_from_sums,
    weight_sums,
)

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
FloatOrArray = Union[np.float64, FloatArray]

__all__ = [
    # exact (categorical)
    "kl_exact",
    "renyi_exact",
    "d2_exact",
    "chi2_exact",
    "m2_exact",
    "ess_fraction_exact",
    # pre-processing
    "token_log_ratio",
    "sequence_log_ratio",
    # sample estimates
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "k3_terms",
    "m2",
    "chi2_estimate",
    "d2_estimate",
    "renyi_estimate",
    "ess_kish",
    "ess_kish_fraction",
    "ess_kong",
    "ratio_stats",
]

#: log-probabilities up to this much above 0 are treated as round-off (clipped to 0).
LOGP_POSITIVE_TOL = 1e-12
#: exact distributions must satisfy |log sum p| <= this; they are then renormalised.
NORMALIZATION_TOL = 1e-6


# --------------------------------------------------------------------------- #
# private helpers (also used by bounds.py)
# --------------------------------------------------------------------------- #
def as_last_axis(x: ArrayLike, name: str, axis: int) -> FloatArray:
    """float64 copy of ``x`` with the reduced ``axis`` moved last; rejects empty input."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
        raise ValueError(f"{name} must have at least one axis (the reduced axis); got a scalar")
    a = np.moveaxis(a, axis, -1)
    if a.size == 0:
        raise ValueError(f"{name} is empty (shape {a.shape}); need at least one element")
    return a


def _as_mask(mask: ArrayLike, shape: tuple[int, ...], axis: int, name: str = "mask") -> BoolArray:
    """Boolean mask broadcast to the data's (original) ``shape``, reduced axis moved last."""
    m = np.asarray(mask)
    if m.dtype != np.bool_:
        if not np.all((m == 0) | (m == 1)):
            raise ValueError(f"{name} must be boolean or contain only 0 and 1")
        m = m.astype(bool)
    try:
        m = np.broadcast_to(m, shape)
    except ValueError as exc:
        raise ValueError(f"{name} shape {m.shape} does not match data shape {shape}") from exc
    return np.moveaxis(m, axis, -1)


def logsumexp(a: FloatArray) -> FloatArray:
    """log(sum(exp(a))) over the last axis; no warnings; handles -inf and +inf entries.

    ``a`` must not contain NaN.  All -inf gives -inf; any +inf gives +inf.
    """
    mx = np.max(a, axis=-1, keepdims=True)  # (..., 1)
    finite = np.isfinite(mx)
    shift = np.where(finite, mx, 0.0)
    with np.errstate(all="ignore"):
        s = np.sum(np.exp(a - shift), axis=-1)  # (...,) >= 1 when the max is finite
        out = np.log(s) + shift[..., 0]
    mx0 = mx[..., 0]
    out = np.where(mx0 == np.inf, np.inf, out)
    return np.where(mx0 == -np.inf, -np.inf, out)


def log_abs_expm1(x: FloatArray) -> FloatArray:
    """log|e^x - 1| elementwise, stable for all x: 0 -> -inf, +inf -> +inf, -inf -> 0."""
    x = np.asarray(x, dtype=np.float64)
    pos = x > 0
    neg = x < 0
    xp = np.where(pos, x, 1.0)
    xn = np.where(neg, x, -1.0)
    # x > 0: log(e^x - 1) = x + log(1 - e^{-x});  x < 0: log(1 - e^x) = log(-expm1(x))
    out_pos = xp + np.log(-np.expm1(-xp))
    out_neg = np.log(-np.expm1(xn))
    return np.where(pos, out_pos, np.where(neg, out_neg, -np.inf))


def _bregman_g(d: FloatArray) -> FloatArray:
    """g(d) = d e^d - (e^d - 1) = r log r - r + 1 >= 0 at r = e^d, accurate for small |d|."""
    with np.errstate(all="ignore"):
        small = d * np.expm1(d) - k3_terms(d)  # no cancellation of the leading d^2/2
        big = d * np.exp(d) - np.expm1(d)
    return np.where(np.abs(d) <= 1.0, small, big)


def log_var_exp(lr: FloatArray, w: FloatArray, support: BoolArray) -> FloatArray:
    """log Var_w(e^lr) over the last axis (population variance under normalised weights ``w``).

    Two-pass variance of ``s = exp(lr - max lr)`` (all in [0, 1]) rescaled by
    ``exp(2 max lr)`` in log space.  Any +inf log-ratio gives +inf; all r = 0
    gives -inf (variance 0).
    """
    mx = np.max(np.where(support, lr, -np.inf), axis=-1, keepdims=True)  # (..., 1)
    shift = np.where(np.isfinite(mx), mx, 0.0)
    with np.errstate(all="ignore"):
        s = np.where(support, np.exp(np.where(support, lr, 0.0) - shift), 0.0)  # (..., n)
        mu = np.sum(w * s, axis=-1, keepdims=True)  # (..., 1)
        v = np.sum(np.where(support, w * (s - mu) ** 2, 0.0), axis=-1)  # (...,)
        out = 2.0 * shift[..., 0] + np.log(v)
    mx0 = mx[..., 0]
    out = np.where(mx0 == np.inf, np.inf, out)
    return np.where(mx0 == -np.inf, -np.inf, out)


def validated_logprobs(logp: ArrayLike, name: str, axis: int) -> FloatArray:
    """Check a categorical log-probability array (..., K) and renormalise it exactly.

    Raises ValueError on NaN, +inf, log-probs > LOGP_POSITIVE_TOL, or a total
    mass off by more than NORMALIZATION_TOL (in log space).  -inf (probability
    0) is allowed.
    """
    lp = as_last_axis(logp, name, axis)
    if np.isnan(lp).any():
        raise ValueError(f"{name} contains NaN")
    if np.isposinf(lp).any():
        raise ValueError(f"{name} contains +inf; log-probabilities must be <= 0")
    if (lp > LOGP_POSITIVE_TOL).any():
        raise ValueError(
            f"{name} contains positive log-probabilities (max {np.max(lp):.3g}); "
            "expected log-probabilities <= 0"
        )
    lse = logsumexp(lp)  # (...,)
    if np.any(np.abs(lse) > NORMALIZATION_TOL):
        worst = float(np.max(np.abs(lse)))
        raise ValueError(
            f"{name} is not a normalised distribution along the reduced axis "
            f"(|log sum p| up to {worst:.3g} > {NORMALIZATION_TOL})"
        )
    return np.minimum(lp, 0.0) - lse[..., None]


def _exact_pair(logp: ArrayLike, logq: ArrayLike, axis: int, names: tuple[str, str]) -> tuple[FloatArray, FloatArray]:
    lp = validated_logprobs(logp, names[0], axis)
    lq = validated_logprobs(logq, names[1], axis)
    if lp.shape[-1] != lq.shape[-1]:
        raise ValueError(
            f"{names[0]} and {names[1]} have different numbers of categories "
            f"({lp.shape[-1]} vs {lq.shape[-1]})"
        )
    try:
        lp, lq = np.broadcast_arrays(lp, lq)
    except ValueError as exc:
        raise ValueError(f"{names[0]} and {names[1]} batch shapes do not broadcast") from exc
    return lp, lq


def _prep_samples(
    log_ratio: ArrayLike, mask: ArrayLike | None, axis: int, name: str = "log_ratio"
) -> tuple[FloatArray, BoolArray, FloatArray]:
    """(lr (..., n) with masked entries set to 0, mask (..., n), count (...,)); validates."""
    lr = as_last_axis(log_ratio, name, axis)
    if mask is None:
        m = np.ones(lr.shape, dtype=bool)
    else:
        m = _as_mask(mask, np.shape(log_ratio), axis)
    count = np.sum(m, axis=-1).astype(np.float64)  # (...,)
    if np.any(count == 0):
        raise ValueError(f"{name} has a row with no unmasked entries along the reduced axis")
    lr = np.where(m, lr, 0.0)
    if np.isnan(lr).any():
        raise ValueError(f"{name} contains NaN at unmasked positions")
    return lr, m, count


def _check_alpha(alpha: float) -> float:
    a = float(alpha)
    if not math.isfinite(a) or a <= 0:
        raise ValueError(f"Renyi order alpha must be finite and > 0, got {alpha!r}")
    return a


# --------------------------------------------------------------------------- #
# exact values for categorical distributions
# --------------------------------------------------------------------------- #
def kl_exact(logp: ArrayLike, logq: ArrayLike, *, axis: int = -1) -> FloatOrArray:
    """KL(p || q) = sum_k p_k (log p_k - log q_k) for categorical log-probs ``(..., K)``.

    Terms with p_k = 0 are 0; p_k > 0 = q_k gives +inf.  Computed as the sum of
    the non-negative Bregman terms q g(d), g(d) = e^d (d - 1) + 1 with
    d = log p - log q (equal to the definition because both sum to 1), so tiny
    divergences keep full relative precision.  Returns shape ``(...)``.
    """
    lp, lq = _exact_pair(logp, logq, axis, ("logp", "logq"))  # (..., K)
    p_pos = lp > -np.inf
    q_pos = lq > -np.inf
    both = p_pos & q_pos
    d = np.where(both, lp - np.where(both, lq, 0.0), 0.0)  # (..., K) log r, finite
    with np.errstate(all="ignore"):
        p = np.exp(lp)
        q = np.exp(lq)
        big = p * (d - 1.0) + q  # q g(d) for |d| > 1, without forming e^d
        term = np.where(np.abs(d) <= 1.0, q * _bregman_g(d), big)  # (..., K)  # Eq. (25), FreshPER (KL)
    term = np.where(both, term, 0.0)
    term = np.where(p_pos & ~q_pos, np.inf, term)  # P not << Q
    term = np.where(~p_pos & q_pos, q, term)  # g(-inf) = 1
    return as_result(np.sum(term, axis=-1))


def renyi_exact(logp: ArrayLike, logq: ArrayLike, alpha: float, *, axis: int = -1) -> FloatOrArray:
    """Renyi divergence D_alpha(p || q) = log(sum p^alpha q^(1-alpha)) / (alpha - 1).

    FreshPER Eq. (22).  ``alpha == 1`` returns :func:`kl_exact` (Eq. (25));
    ``alpha <= 0`` raises ValueError.  Returns shape ``(...)``.

    For a large argument the log is a log-sum-exp.  For a small one it is
    ``log1p(S)`` with ``S = sum_k q_k h(d_k)``, d = log r and
    h(d) = r^alpha - 1 - alpha (r - 1) = e^d k3((alpha-1) d) + (alpha-1) g(d)
    (k3(x) = e^x - 1 - x, g(d) = d e^d - e^d + 1): S equals
    sum p^alpha q^(1-alpha) - 1, its terms share one sign, and it is
    insensitive to the round-off in the normalisation, so tiny divergences
    and alpha -> 1 (where D_alpha -> KL) keep their relative precision.
    """
    a = _check_alpha(alpha)
    if a == 1.0:
        return kl_exact(logp, logq, axis=axis)
    b = a - 1.0
    lp, lq = _exact_pair(logp, logq, axis, ("logp", "logq"))  # (..., K)
    p_pos = lp > -np.inf
    q_pos = lq > -np.inf
    both = p_pos & q_pos
    with np.errstate(all="ignore"):
        # large divergences: log sum_{p>0} p r^(a-1) (r = inf where q = 0 < p)
        d_all = np.where(p_pos, lp - np.where(p_pos, lq, 0.0), 0.0)  # (..., K)
        big = logsumexp(np.where(p_pos, lp + b * d_all, -np.inf))  # (...,)  # Eq. (22), FreshPER
        # small divergences: S = sum_k q_k h(d_k) (- a * p-mass outside supp q)
        d = np.where(both, d_all, 0.0)  # (..., K) finite log r
        p = np.exp(lp)
        q = np.exp(lq)
        k3 = k3_terms(b * d)
        qh_small = q * (np.exp(d) * k3 + b * _bregman_g(d))
        qh_big = p * k3 + b * (p * d - (p - q))  # the same, without forming e^d
        qh = np.where(np.abs(d) <= 1.0, qh_small, qh_big)  # (..., K)
        qh = np.where(both, qh, 0.0)
        qh = np.where(~p_pos & q_pos, b * q, qh)  # h(-inf) = a - 1
        mass_out = np.sum(np.where(p_pos & ~q_pos, p, 0.0), axis=-1)  # p-mass where q = 0
        S = np.sum(qh, axis=-1) - a * mass_out
        small = np.log1p(S)
        log_mean = np.where(np.abs(big) < 0.5, small, big)
    return as_result(log_mean / b)


def _log_chi2_exact(lp: FloatArray, lq: FloatArray) -> FloatArray:
    """log chi^2(p || q) = log sum_k q_k (r_k - 1)^2 in log space; +inf if p is not << q."""
    q_pos = lq > -np.inf
    p_pos = lp > -np.inf
    d = np.where(q_pos, lp - np.where(q_pos, lq, 0.0), 0.0)  # (..., K); -inf where p = 0
    log_terms = np.where(q_pos, lq + 2.0 * log_abs_expm1(d), -np.inf)  # log q (r-1)^2
    log_terms = np.where(p_pos & ~q_pos, np.inf, log_terms)
    return logsumexp(log_terms)  # (...,)  # Eq. (6), FreshPER


def d2_exact(logp: ArrayLike, logq: ArrayLike, *, axis: int = -1) -> FloatOrArray:
    """D_2(p || q) = log E_q[(p/q)^2] = log(1 + chi^2(p || q)).  FreshPER Eq. (23).

    Computed as ``logaddexp(0, log chi^2)`` so it is accurate both for tiny
    divergences and for astronomically large ones.  Returns shape ``(...)``.
    """
    lp, lq = _exact_pair(logp, logq, axis, ("logp", "logq"))
    return as_result(np.logaddexp(0.0, _log_chi2_exact(lp, lq)))  # Eq. (23), FreshPER


def chi2_exact(logp: ArrayLike, logq: ArrayLike, *, axis: int = -1) -> FloatOrArray:
    """chi^2(p || q) = E_q[(p/q)^2] - 1 = sum_k (p_k - q_k)^2 / q_k = expm1(D_2).

    FreshPER Eqs. (6), (21), (24).  +inf if p puts mass where q has none;
    may overflow to +inf (no warning).  Returns shape ``(...)``.
    """
    lp, lq = _exact_pair(logp, logq, axis, ("logp", "logq"))
    with np.errstate(over="ignore"):
        return as_result(np.exp(_log_chi2_exact(lp, lq)))  # Eq. (24), FreshPER


def m2_exact(logp_new: ArrayLike, logp_behav: ArrayLike, *, axis: int = -1) -> FloatOrArray:
    """M_2 = E_behav[(log r)^2], r = pi_new / pi_behav.  M2PO Eq. (4) (population version).

    Categories with pi_behav = 0 contribute 0; pi_new = 0 < pi_behav gives +inf.
    Returns shape ``(...)``.
    """
    ln, lb = _exact_pair(logp_new, logp_behav, axis, ("logp_new", "logp_behav"))
    b_pos = lb > -np.inf
    d = np.where(b_pos, ln - np.where(b_pos, lb, 0.0), 0.0)  # (..., K) log r
    with np.errstate(over="ignore"):
        term = np.where(b_pos, np.exp(lb) * d * d, 0.0)  # Eq. (4), M2PO
    return as_result(np.sum(term, axis=-1))


def ess_fraction_exact(logp_new: ArrayLike, logp_behav: ArrayLike, *, axis: int = -1) -> FloatOrArray:
    """Population ESS / n = 1 / E_behav[r^2] = exp(-D_2(new || behav)).

    FreshPER Eq. (5) with Var[rho] = chi^2 (Eq. (9)) and chi^2 = e^{D_2} - 1
    (Eq. (24)): ESS = n / (1 + chi^2) = n e^{-D_2}.  Returns shape ``(...)``.
    """
    return as_result(np.exp(-np.asarray(d2_exact(logp_new, logp_behav, axis=axis))))  # Eqs. (5), (24), FreshPER


# --------------------------------------------------------------------------- #
# pre-processing of recorded log-probs
# --------------------------------------------------------------------------- #
def token_log_ratio(
    logp_new: ArrayLike, logp_behav: ArrayLike, mask: ArrayLike | None = None
) -> FloatArray:
    """Per-token ``log r = logp_new - logp_behav`` after validating the log-probs.

    Both inputs (same or broadcastable shapes) must be finite and <= 0 at the
    unmasked positions; otherwise ValueError naming the array and the problem
    (NaN, +-inf, positive log-prob).  Masked positions (``mask`` false/0) are
    not validated and come back as 0 (ratio 1), so padding can hold anything.
    """
    a = np.asarray(logp_new, dtype=np.float64)
    b = np.asarray(logp_behav, dtype=np.float64)
    try:
        shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError as exc:
        raise ValueError(f"logp_new shape {a.shape} and logp_behav shape {b.shape} do not broadcast") from exc
    if math.prod(shape) == 0:
        raise ValueError("token_log_ratio got empty input")
    a = np.broadcast_to(a, shape)
    b = np.broadcast_to(b, shape)
    m = np.ones(shape, dtype=bool) if mask is None else _as_mask(mask, shape, -1)
    for name, x in (("logp_new", a), ("logp_behav", b)):
        xm = np.where(m, x, 0.0)
        if np.isnan(xm).any():
            raise ValueError(f"{name} contains NaN")
        if np.isinf(xm).any():
            raise ValueError(f"{name} contains +-inf (a sampled token must have finite log-prob)")
        if (xm > LOGP_POSITIVE_TOL).any():
            raise ValueError(f"{name} contains positive log-probabilities (max {np.max(xm):.3g})")
    return np.where(m, a - b, 0.0)


def sequence_log_ratio(
    token_log_ratio: ArrayLike, mask: ArrayLike | None = None, *, axis: int = -1
) -> FloatOrArray:
    """Sequence log-ratio: sum of token log-ratios, ``(..., n_seq, L) -> (..., n_seq)``.

    The sequence ratio is the product of token ratios, so it is summed in log
    space and never overflows (8192 tokens at log r = 0.5 give 4096).  Masked
    tokens are excluded; a fully masked sequence gives 0 (ratio 1).
    """
    x = as_last_axis(token_log_ratio, "token_log_ratio", axis)
    m = np.ones(x.shape, dtype=bool) if mask is None else _as_mask(mask, np.shape(token_log_ratio), axis)
    x = np.where(m, x, 0.0)
    if np.isnan(x).any():
        raise ValueError("token_log_ratio contains NaN at unmasked positions")
    with np.errstate(invalid="ignore"):
        return as_result(np.sum(x, axis=-1))


# --------------------------------------------------------------------------- #
# sample estimates from log-ratios of samples drawn under pi_behav
# --------------------------------------------------------------------------- #
def _moments(log_ratio: ArrayLike, mask: ArrayLike | None, axis: int) -> Moments:
    """The kernel's sums (``theory/moments.py``) over the reduced axis, after the checks of ``_prep_samples``."""
    lr, m, _ = _prep_samples(log_ratio, mask, axis)
    return Moments.from_rows(lr, m)


def kl_k1(log_ratio: ArrayLike, mask: ArrayLike | None = None, *, axis: int = -1) -> FloatOrArray:
    """k1 = mean(-log r): unbiased estimate of KL(pi_behav || pi_new).  M2PO Eq. (3)."""
    s = _moments(log_ratio, mask, axis)
    return as_result(kl_k1_from_sums(s.s1, s.n))  # Eq. (3), M2PO


def kl_k2(log_ratio: ArrayLike, mask: ArrayLike | None = None, *, axis: int = -1) -> FloatOrArray:
    """k2 = mean((log r)^2) / 2 = M_2 / 2: low-variance, biased estimate of KL(pi_behav || pi_new)."""
    s = _moments(log_ratio, mask, axis)
    return as_result(kl_k2_from_sums(s.s2, s.n))


def kl_k3(log_ratio: ArrayLike, mask: ArrayLike | None = None, *, axis: int = -1) -> FloatOrArray:
    """k3 = mean(r - 1 - log r): unbiased, non-negative estimate of KL(pi_behav || pi_new).

    Each term is ``expm1(lr) - lr`` (Taylor series for |lr| < 1e-2); huge
    log-ratios give +inf, without warnings.
    """
    s = _moments(log_ratio, mask, axis)
    return as_result(kl_k3_from_sums(s.sk3, s.n))


def m2(log_ratio: ArrayLike, mask: ArrayLike | None = None, *, axis: int = -1) -> FloatOrArray:
    """M_2 = mean((log r)^2) = 2 * k2.  M2PO Eq. (4)."""
    s = _moments(log_ratio, mask, axis)
    return as_result(m2_from_sums(s.s2, s.n))  # Eq. (4), M2PO


def _log_mean_exp(a: FloatArray, m: BoolArray, n: FloatArray) -> FloatArray:
    """log mean(exp(a)) over unmasked entries."""
    return logsumexp(np.where(m, a, -np.inf)) - np.log(n)


def d2_estimate(log_ratio: ArrayLike, mask: ArrayLike | None = None, *, axis: int = -1) -> FloatOrArray:
    """D_2-hat = log mean(r^2) (shifted sums; finite even for 8k-token sequence ratios).

    Estimates D_2(pi_new || pi_behav) (FreshPER Eq. (23)); consistent, biased
    (Jensen) for finite n.
    """
    s = _moments(log_ratio, mask, axis)
    return as_result(d2_from_sums(s.lmax, s.B, s.n))  # Eq. (23), FreshPER


def chi2_estimate(log_ratio: ArrayLike, mask: ArrayLike | None = None, *, axis: int = -1) -> FloatOrArray:
    """chi^2-hat = mean(r^2) - 1 = expm1(d2_estimate)  (verl ``chi2_token``; FreshPER Eq. (21)).

    Note: this is NOT the sample mean of (r - 1)^2 (the chi^2 in M2PO Thm 5.1);
    the two differ by 2 (mean(r) - 1) whenever the sample mean of r is not 1.
    May be +inf (no warning).
    """
    s = _moments(log_ratio, mask, axis)
    return as_result(chi2_from_sums(s.lmax, s.B, s.n))  # Eq. (24), FreshPER


def renyi_estimate(
    log_ratio: ArrayLike, alpha: float, mask: ArrayLike | None = None, *, axis: int = -1
) -> FloatOrArray:
    """Renyi-divergence estimate of D_alpha(pi_new || pi_behav) from behaviour samples.

    alpha != 1: ``log(mean r^alpha) / (alpha - 1)`` (FreshPER Eq. (22) with the
    sample mean).  alpha == 1: the SELF-NORMALISED estimate of KL(new || behav),
    ``sum(r log r) / sum(r)``, i.e. the weighted mean of log r with weights r.

    The alpha != 1 estimator is not self-normalised, so it is discontinuous at
    alpha = 1 on finite samples: as alpha -> 1 it diverges like
    log(mean r) / (alpha - 1) unless mean(r) = 1 exactly.  alpha <= 0 raises.
    """
    a = _check_alpha(alpha)
    lr, m, n = _prep_samples(log_ratio, mask, axis)
    if a != 1.0:
        return as_result(_log_mean_exp(a * lr, m, n) / (a - 1.0))  # Eq. (22), FreshPER
    mx = np.max(np.where(m, lr, -np.inf), axis=-1, keepdims=True)  # (..., 1)
    shift = np.where(np.isfinite(mx), mx, 0.0)
    with np.errstate(all="ignore"):
        w = np.where(m, np.exp(lr - shift), 0.0)  # (..., n) r / max r
        num = np.sum(np.where(w > 0, w * lr, 0.0), axis=-1)
        out = num / np.sum(w, axis=-1)
    mx0 = mx[..., 0]
    out = np.where(mx0 == np.inf, np.inf, out)  # weight concentrates on r = inf
    return as_result(np.where(mx0 == -np.inf, -np.inf, out))  # all r = 0


def ess_kish(log_ratio: ArrayLike, mask: ArrayLike | None = None, *, axis: int = -1) -> FloatOrArray:
    """Kish ESS = (sum w)^2 / sum w^2 with w = r.

    In [1, n] (clipped at n against round-off).  Limits: if some log-ratios
    are +inf the ESS is the number of them; if every r = 0 it is 0.
    Converges to n e^{-D_2(new || behav)} (FreshPER Eqs. (5), (24)).
    """
    lr, m, n = _prep_samples(log_ratio, mask, axis)
    A, B, _ = weight_sums(lr, m)  # the kernel's A, B alone
    return as_result(ess_from_sums(A, B, n))


def sample_statistics(log_ratio: ArrayLike, mask: ArrayLike | None = None, *,
                      axis: int = -1) -> dict[str, FloatOrArray]:
    """All sample estimators at once (one validation pass; the simulator logs them every step).

    Keys and meanings are those of the single functions: ``kl_k1``, ``kl_k2``, ``kl_k3``,
    ``m2``, ``d2``, ``chi2`` (mean r^2 - 1), ``ess_frac`` (Kish ESS / n).
    """
    stats = _moments(log_ratio, mask, axis).statistics()
    return {k: as_result(stats[k]) for k in ("kl_k1", "kl_k2", "kl_k3", "m2", "d2", "chi2", "ess_frac")}


def ess_kish_fraction(log_ratio: ArrayLike, mask: ArrayLike | None = None, *, axis: int = -1) -> FloatOrArray:
    """Kish ESS / n = (sum w)^2 / (n sum w^2): TRL/verl ``ess_frac``, PipelineRL ``rl/ess``."""
    lr, m, n = _prep_samples(log_ratio, mask, axis)
    A, B, _ = weight_sums(lr, m)  # the kernel's A, B alone
    return as_result(ess_frac_from_sums(A, B, n))


def ess_kong(log_ratio: ArrayLike, mask: ArrayLike | None = None, *, axis: int = -1) -> FloatOrArray:
    """Kong ESS = n / (1 + Var r), Var the population (ddof=0) sample variance of r.

    FreshPER Eq. (5).  Var r is computed in log space; an infinite variance
    gives ESS 0 (no warning).  Equals :func:`ess_kish` when mean(r) = 1; on raw
    samples (mean(r) != 1) the two differ.
    """
    lr, m, n = _prep_samples(log_ratio, mask, axis)
    w = np.where(m, 1.0 / n[..., None], 0.0)
    log_var = log_var_exp(lr, w, m)
    with np.errstate(over="ignore"):  # e^{-|v|} never overflows; 1 / (1 + e^v) written so neither branch does
        small = np.exp(-np.abs(log_var))
        inv_one_plus = np.where(log_var > 0, small / (1.0 + small), 1.0 / (1.0 + small))  # expit(-log_var)
    return as_result(n * inv_one_plus)  # n / (1 + e^{log Var}); Eq. (5), FreshPER; numpy: diagnose starts faster


def ratio_stats(
    log_ratio: ArrayLike, mask: ArrayLike | None = None, *, axis: int = -1
) -> dict[str, FloatOrArray]:
    """min / mean / max / std (ddof=0) of r, keyed ``is_ratio_{min,mean,max,std}``.

    From the statistics kernel's sums (mean and the centred sum shifted by max log r);
    only a genuinely huge value (e.g. exp(4096)) becomes +inf, without warnings.
    """
    stats = _moments(log_ratio, mask, axis).statistics()
    return {f"is_ratio_{k}": as_result(stats[f"ratio_{k}"]) for k in ("min", "mean", "max", "std")}

"""Identities and bounds between importance-weight quantities, each returning both sides.

Every function evaluates one relation from FreshPER
(FreshPER, docs/REFERENCES.md) or M2PO
(M2PO, docs/REFERENCES.md) and returns a frozen :class:`Relation`
holding both sides, so a caller can see by how much it holds (``slack``), not
only whether it does.

The generic interface is an expectation under the behaviour distribution:

* ``log_ratio`` ``(..., n)``: log r = log pi_new - log pi_behav;
* ``behav_prob`` ``(..., n)`` or None: non-negative weights (normalised here).
  Exact categorical case: ``behav_prob = pi_behav`` over the K categories and
  ``log_ratio = log pi_new - log pi_behav``.  Samples drawn from pi_behav:
  ``behav_prob=None`` means uniform 1/n weights (the empirical distribution);
  a 0/1 padding mask can be passed as ``behav_prob``.  Entries of weight 0
  are ignored entirely (their log-ratio may be anything, NaN included).

The reduced axis is last (``axis=-1``); leading axes are batch axes.

Which relations hold for which data (exactly, or with E_behav[r] = 1) and the tolerances of ``holds``:
:class:`Relation`.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .divergences import as_last_axis, d2_exact, kl_exact, log_abs_expm1, log_var_exp, logsumexp, validated_logprobs
from .moments import Moments, statistics

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
Value = Union[float, FloatArray]

__all__ = [
    "Relation",
    "make_relation",
    "var_ratio_equals_chi2",
    "chi2_equals_expm1_d2",
    "ess_bound_kl",
    "kl_le_d2",
    "m2po_thm51",
    "m2po_sharp",
    "m2_converse",
    "m2_decomposition",
    "mean_abs_log_ratio_le_sqrt_m2",
    "exact_relations",
    "sample_relations",
    "moments_relations",
]

RTOL = 1e-9
ATOL = 1e-12


@dataclass(frozen=True)
class Relation:
    """One evaluated identity (``relation == "=="``) or bound (``"<="``): lhs REL rhs.

    ``lhs``, ``rhs``, ``slack`` are floats for a single case and arrays of the
    batch shape otherwise; ``holds`` is a bool or a boolean array.  ``source``
    is the paper anchor.

    Which relations hold for which data:

    * The M2PO relations (:func:`m2po_thm51`, :func:`m2po_sharp`,
      :func:`m2_converse`, :func:`m2_decomposition`,
      :func:`mean_abs_log_ratio_le_sqrt_m2`) come from POINTWISE inequalities
      (or algebra), so they hold EXACTLY for any weights, samples included.  There
      chi^2 means E[(r - 1)^2] (M2PO's definition, and FreshPER Eq. (6)), which is
      not :func:`~replay_theory.theory.divergences.chi2_estimate`
      (mean r^2 - 1, verl's ``chi2_token``) when the mean of r is not 1.
    * The FreshPER relations (:func:`var_ratio_equals_chi2`,
      :func:`chi2_equals_expm1_d2`, :func:`kl_le_d2`, :func:`ess_bound_kl`) need
      E_behav[r] = 1 (FreshPER Eq. (8)), which holds for an exact pair with
      pi_new << pi_behav but not for raw samples.  ``self_normalize=True``
      rescales r so that its weighted mean is 1 (the self-normalised empirical
      pair); they then hold for any data.

    ``holds`` uses ``|lhs - rhs| <= atol + rtol * max(|lhs|, |rhs|)`` for "==" (an
    infinite side equals only the same infinity) and
    ``lhs <= rhs * (1 + rtol) + atol`` for "<="; ``slack = rhs - lhs`` (0 where
    both sides are the same infinity).
    """

    name: str
    lhs: Value
    rhs: Value
    relation: str  # "==" or "<="
    holds: Union[bool, BoolArray]
    slack: Value
    source: str = ""

    @property
    def ok(self) -> bool:
        """True when the relation holds for every batch element."""
        return bool(np.all(self.holds))


def _scalar_or_array(x: ArrayLike) -> Value:
    a = np.asarray(x, dtype=np.float64)
    return float(a) if a.ndim == 0 else a


def make_relation(
    name: str, lhs: ArrayLike, rhs: ArrayLike, relation: str, rtol: float, atol: float, source: str
) -> Relation:
    """Evaluate ``lhs relation rhs`` (``"=="`` or ``"<="``) with the tolerances of :class:`Relation`.

    Public so that callers holding both sides already build the same
    :class:`Relation` as the functions here.
    """
    lhs_a = np.asarray(lhs, dtype=np.float64)
    rhs_a = np.asarray(rhs, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        if relation == "==":
            scale = np.maximum(np.abs(lhs_a), np.abs(rhs_a))
            close = np.abs(lhs_a - rhs_a) <= atol + rtol * scale
            holds = (lhs_a == rhs_a) | (np.isfinite(lhs_a) & np.isfinite(rhs_a) & close)
        elif relation == "<=":
            holds = (lhs_a <= rhs_a) | (lhs_a <= rhs_a * (1.0 + rtol) + atol)
        else:  # pragma: no cover - internal misuse
            raise ValueError(f"relation must be '==' or '<=', got {relation!r}")
        slack = np.where(lhs_a == rhs_a, 0.0, rhs_a - lhs_a)
    holds_out: Union[bool, BoolArray] = bool(holds) if holds.ndim == 0 else holds
    return Relation(
        name=name,
        lhs=_scalar_or_array(lhs_a),
        rhs=_scalar_or_array(rhs_a),
        relation=relation,
        holds=holds_out,
        slack=_scalar_or_array(slack),
        source=source,
    )


def _exp(x: ArrayLike) -> FloatArray:
    """exp without an overflow warning (a genuinely huge value is +inf)."""
    with np.errstate(over="ignore"):
        return np.exp(x)


# --------------------------------------------------------------------------- #
# expectations under the (normalised) behaviour weights
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class _Weighted:
    lr: FloatArray  # (..., n) log r, 0 outside the support
    w: FloatArray  # (..., n) normalised weights, 0 outside the support
    logw: FloatArray  # (..., n) log w, -inf outside the support
    support: BoolArray  # (..., n) w > 0

    def mean(self, f: FloatArray) -> FloatArray:
        """E_w[f] over the last axis (f evaluated on ``lr``; entries off support ignored)."""
        with np.errstate(invalid="ignore", over="ignore"):
            return np.sum(np.where(self.support, self.w * f, 0.0), axis=-1)

    def log_mean_exp(self, a: FloatArray) -> FloatArray:
        """log E_w[exp(a)]."""
        return logsumexp(np.where(self.support, self.logw + a, -np.inf))

    # ---- the quantities the relations use ---------------------------------
    def log_chi2(self) -> FloatArray:
        """log E_w[(r - 1)^2] (chi^2 by definition, FreshPER Eq. (6) / M2PO Thm 5.1)."""
        return self.log_mean_exp(2.0 * log_abs_expm1(self.lr))

    def log_second_moment(self) -> FloatArray:
        """log E_w[r^2] = D_2 when E_w r = 1 (FreshPER Eq. (23))."""
        return self.log_mean_exp(2.0 * self.lr)

    def m2(self) -> FloatArray:
        """E_w[(log r)^2] (M2PO Eq. (4))."""
        with np.errstate(over="ignore"):
            return self.mean(self.lr * self.lr)

    def kl_new_behav(self) -> FloatArray:
        """E_w[r log r] = KL(pi_new || pi_behav) when E_w r = 1."""
        with np.errstate(over="ignore", invalid="ignore"):
            r_log_r = np.where(self.lr > -np.inf, np.exp(self.logw + self.lr) * self.lr, 0.0)
            return np.sum(np.where(self.support, r_log_r, 0.0), axis=-1)

    def var_log_ratio(self) -> FloatArray:
        """Var_w(log r), two-pass; +inf if any supported log-ratio is infinite."""
        mu = self.mean(self.lr)  # (...,)
        finite = np.isfinite(mu)
        dev = self.lr - np.where(finite, mu, 0.0)[..., None]
        with np.errstate(over="ignore"):
            v = self.mean(dev * dev)
        has_inf = np.any(self.support & np.isinf(self.lr), axis=-1)
        return np.where(has_inf, np.inf, v)

    def log_var_ratio(self) -> FloatArray:
        """log Var_w(r) (population variance of r, log space)."""
        return log_var_exp(self.lr, self.w, self.support)

    def max_lr(self) -> FloatArray:
        return np.max(np.where(self.support, self.lr, -np.inf), axis=-1)

    def min_lr(self) -> FloatArray:
        return np.min(np.where(self.support, self.lr, np.inf), axis=-1)


def _weighted(
    log_ratio: ArrayLike,
    behav_prob: ArrayLike | None,
    axis: int,
    self_normalize: bool,
    log_behav: FloatArray | None = None,
) -> _Weighted:
    lr = as_last_axis(log_ratio, "log_ratio", axis)
    if log_behav is not None:  # internal: normalised log weights already on the last axis
        logw = np.broadcast_to(log_behav, lr.shape)
        support = logw > -np.inf
        w = np.exp(logw)
    elif behav_prob is None:
        n = lr.shape[-1]
        support = np.ones(lr.shape, dtype=bool)
        w = np.full(lr.shape, 1.0 / n)
        logw = np.full(lr.shape, -math.log(n))
    else:
        b = np.asarray(behav_prob, dtype=np.float64)
        try:
            b = np.broadcast_to(b, np.shape(log_ratio))
        except ValueError as exc:
            raise ValueError(
                f"behav_prob shape {np.shape(behav_prob)} does not match log_ratio shape {np.shape(log_ratio)}"
            ) from exc
        b = np.moveaxis(b, axis, -1)
        if not np.all(np.isfinite(b)) or np.any(b < 0):
            raise ValueError("behav_prob must be finite and non-negative")
        total = np.sum(b, axis=-1, keepdims=True)
        if np.any(total <= 0):
            raise ValueError("behav_prob has a row with zero total weight")
        w = b / total
        support = w > 0
        with np.errstate(divide="ignore"):
            logw = np.log(w)
    lr = np.where(support, lr, 0.0)
    if np.isnan(lr).any():
        raise ValueError("log_ratio contains NaN where the behaviour weight is positive")
    if self_normalize:
        if np.any(support & np.isposinf(lr)):
            raise ValueError("self_normalize needs log_ratio < +inf on the support")
        log_mean_r = logsumexp(np.where(support, logw + lr, -np.inf))  # log E_w r
        if np.any(log_mean_r == -np.inf):
            raise ValueError("self_normalize needs some r > 0 in every row")
        lr = np.where(support, lr - log_mean_r[..., None], 0.0)
    return _Weighted(lr=lr, w=w, logw=logw, support=support)


# --------------------------------------------------------------------------- #
# the public form of a relation
# --------------------------------------------------------------------------- #
_P = inspect.Parameter
_SAMPLE_PARAMS = (
    _P("log_ratio", _P.POSITIONAL_OR_KEYWORD, annotation="ArrayLike"),
    _P("behav_prob", _P.POSITIONAL_OR_KEYWORD, default=None, annotation="ArrayLike | None"),
)
_KEYWORD_PARAMS = (
    _P("axis", _P.KEYWORD_ONLY, default=-1, annotation="int"),
    _P("self_normalize", _P.KEYWORD_ONLY, default=False, annotation="bool"),
    _P("rtol", _P.KEYWORD_ONLY, default=RTOL, annotation="float"),
    _P("atol", _P.KEYWORD_ONLY, default=ATOL, annotation="float"),
)


def _on_samples(on_weighted: Callable[..., Relation]) -> Callable[..., Relation]:
    """Public form of a relation written on a prepared expectation ``on_weighted(W, *extra, rtol, atol)``.

    The result is ``f(log_ratio, behav_prob=None, *extra, *, axis=-1, self_normalize=False, rtol=RTOL, atol=ATOL)``
    (``extra``: ``n`` or ``R``, as ``on_weighted`` declares them) with ``on_weighted``'s name and docstring; it
    builds the expectation (:func:`_weighted`) and evaluates.  ``f.on_weighted`` is the relation itself, which
    :func:`exact_relations` and :func:`sample_relations` call on one expectation shared by all relations.
    """
    extra = list(inspect.signature(on_weighted).parameters.values())[1:-2]
    signature = inspect.Signature([*_SAMPLE_PARAMS, *extra, *_KEYWORD_PARAMS], return_annotation="Relation")

    @functools.wraps(on_weighted)
    def relation(*args: Any, **kwargs: Any) -> Relation:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        W = _weighted(a.pop("log_ratio"), a.pop("behav_prob"), a.pop("axis"), a.pop("self_normalize"))
        return on_weighted(W, **a)

    relation.__signature__ = signature  # type: ignore[attr-defined]
    relation.on_weighted = on_weighted  # type: ignore[attr-defined]
    return relation


# --------------------------------------------------------------------------- #
# FreshPER relations (need E_behav r = 1)
# --------------------------------------------------------------------------- #
@_on_samples
def var_ratio_equals_chi2(W: _Weighted, rtol: float = RTOL, atol: float = ATOL) -> Relation:
    """Var_behav(r) == chi^2(new || behav) = E_behav[(r - 1)^2].  FreshPER Eq. (9) (Prop. 1, Eq. (17)).

    Exactly ``E[(r-1)^2] - Var(r) = (E r - 1)^2``, so it needs E_behav r = 1
    (Eq. (8)): true for an exact pair with pi_new << pi_behav, false for raw
    samples unless ``self_normalize``.  (Prop. 1 states the support condition
    the wrong way round: see docs/ERRATA.md.)
    """
    with np.errstate(over="ignore"):
        lhs = np.exp(W.log_var_ratio())  # Eq. (9), FreshPER
        rhs = np.exp(W.log_chi2())  # Eq. (6), FreshPER
    return make_relation("var_ratio_equals_chi2", lhs, rhs, "==", rtol, atol, "FreshPER Eq. (9) / Prop. 1")


@_on_samples
def chi2_equals_expm1_d2(W: _Weighted, rtol: float = RTOL, atol: float = ATOL) -> Relation:
    """chi^2 = E[(r - 1)^2] == e^{D_2} - 1, D_2 = log E[r^2].  FreshPER Eq. (24) (via Eqs. (21), (23)).

    The two sides differ by exactly 2 (1 - E r), so this too needs E_behav r = 1.
    """
    with np.errstate(over="ignore"):
        lhs = _exp(W.log_chi2())  # Eq. (6), FreshPER
        rhs = np.expm1(W.log_second_moment())  # Eq. (24), FreshPER
    return make_relation("chi2_equals_expm1_d2", lhs, rhs, "==", rtol, atol, "FreshPER Eq. (24)")


@_on_samples
def kl_le_d2(W: _Weighted, rtol: float = RTOL, atol: float = ATOL) -> Relation:
    """KL(new || behav) = E_behav[r log r] <= D_2(new || behav) = log E_behav[r^2].  FreshPER Eq. (26).

    Renyi monotonicity in the order (Eq. (25): KL = D_1).  Tight iff r is
    constant on the support of pi_new (pi_new = pi_behav conditioned on a set).
    Needs E_behav r = 1: on raw samples use ``self_normalize=True``.
    """
    return kl_le_d2_relation(W.kl_new_behav(), W.log_second_moment(), rtol, atol)  # Eqs. (25), (23), FreshPER


def kl_le_d2_relation(kl: ArrayLike, d2: ArrayLike, rtol: float = RTOL, atol: float = ATOL,
                      source: str = "FreshPER Eq. (26)") -> Relation:
    """KL(new || behav) <= D_2(new || behav) from the two values (arrays or streamed sums alike)."""
    return make_relation("kl_le_d2", kl, d2, "<=", rtol, atol, source)


@_on_samples
def ess_bound_kl(W: _Weighted, n: float = 1.0, rtol: float = RTOL, atol: float = ATOL) -> Relation:
    """ESS = n e^{-D_2} <= n e^{-KL(new || behav)}.  FreshPER Eqs. (10)-(11) (App. C, Eqs. (26)-(29)).

    lhs = n e^{-D_2} (the exact population ESS: Eq. (5) with Eqs. (9), (24));
    rhs = n e^{-KL(pi_new || pi_behav)}.  ``n = 1`` gives ESS fractions.  The
    KL is in the direction new || behav; the k1/k3 estimators (and M2PO
    Eq. (3)) measure KL(behav || new), for which the bound can FAIL.
    Tight iff r is constant on the support of pi_new.
    """
    lhs = n * _exp(-W.log_second_moment())  # Eqs. (5), (24), FreshPER: exact ESS = n e^{-D_2}
    return ess_bound_kl_relation(lhs, W.kl_new_behav(), n, rtol, atol)


def ess_bound_kl_relation(ess: ArrayLike, kl: ArrayLike, n: float = 1.0, rtol: float = RTOL, atol: float = ATOL,
                          source: str = "FreshPER Eqs. (10)-(11)") -> Relation:
    """ESS <= n e^{-KL(new || behav)} from the ESS (``n = 1``: its fraction) and the KL."""
    with np.errstate(over="ignore"):
        rhs = n * np.exp(-np.asarray(kl, dtype=np.float64))  # Eq. (11), FreshPER
    return make_relation("ess_bound_kl", ess, rhs, "<=", rtol, atol, source)


# --------------------------------------------------------------------------- #
# M2PO relations (hold for any weights, samples included)
# --------------------------------------------------------------------------- #
def _log_R(R: ArrayLike | None, default: FloatArray) -> FloatArray:
    if R is None:
        return default
    Ra = np.asarray(R, dtype=np.float64)
    if np.any(np.isnan(Ra)) or np.any(Ra < 1.0):
        raise ValueError(f"R must be >= 1, got {R!r}")
    return np.log(Ra)


def _times_R2(log_R: FloatArray, log_x: FloatArray) -> FloatArray:
    """R^2 * x computed as exp(2 log R + log x); x = 0 gives 0, overflow gives inf."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.exp(2.0 * log_R + log_x)
    return np.where(log_x == -np.inf, 0.0, out)


def _log_m2(W: _Weighted) -> FloatArray:
    with np.errstate(divide="ignore"):
        return np.log(W.m2())


@_on_samples
def m2po_thm51(W: _Weighted, R: ArrayLike | None = None, rtol: float = RTOL, atol: float = ATOL) -> Relation:
    """chi^2 = E[(r - 1)^2] <= R^2 M_2 when 1/R <= r <= R.  M2PO Thm 5.1 (proof in App. C).

    Default R = max(sup r, 1 / inf r) over the support (log R = max |log r|).
    A given R (>= 1) is used as is; the hypothesis is not checked.  Holds for
    any weights (pointwise (e^z - 1)^2 <= z^2 e^{2|z|}).
    """
    log_R = _log_R(R, np.maximum(W.max_lr(), -W.min_lr()))  # log max(sup r, 1/inf r)
    return m2po_thm51_relation(_exp(W.log_chi2()), _log_m2(W), log_R, rtol, atol)


def m2po_thm51_relation(chi2: ArrayLike, log_m2: ArrayLike, log_R: ArrayLike, rtol: float = RTOL,
                        atol: float = ATOL, source: str = "M2PO Thm 5.1 (App. C)") -> Relation:
    """chi^2 = E[(r - 1)^2] <= R^2 M_2 from chi^2, log M_2 and log R."""
    return make_relation("m2po_thm51", chi2, _times_R2(log_R, log_m2), "<=", rtol, atol, source)  # Thm 5.1, M2PO


@_on_samples
def m2po_sharp(W: _Weighted, rtol: float = RTOL, atol: float = ATOL) -> Relation:
    """chi^2 = E[(r - 1)^2] <= max(1, sup r)^2 M_2: sharper form of M2PO Thm 5.1.

    Pointwise (r - 1)^2 <= max(1, r)^2 (log r)^2: for r >= 1 it is the r >= 1
    half of the App. C proof; for r < 1, 1 - r <= -log r.  Only the UPPER
    bound on r matters, so this is never looser than Thm 5.1 and strictly
    tighter whenever 1 / inf r > max(1, sup r).  Holds for any weights.
    """
    return m2po_sharp_relation(_exp(W.log_chi2()), _log_m2(W), W.max_lr(), rtol, atol)


def m2po_sharp_relation(chi2: ArrayLike, log_m2: ArrayLike, log_sup_r: ArrayLike, rtol: float = RTOL,
                        atol: float = ATOL, source: str = "M2PO Thm 5.1, sharpened") -> Relation:
    """chi^2 <= max(1, sup r)^2 M_2 (the sharpened Thm 5.1) from chi^2, log M_2 and log sup r."""
    log_R = np.maximum(0.0, log_sup_r)  # log max(1, sup r)
    return make_relation("m2po_sharp", chi2, _times_R2(log_R, log_m2), "<=", rtol, atol, source)  # Thm 5.1, M2PO


@_on_samples
def m2_converse(W: _Weighted, R: ArrayLike | None = None, rtol: float = RTOL, atol: float = ATOL) -> Relation:
    """M_2 <= R^2 chi^2 (chi^2 = E[(r - 1)^2]) when r >= 1/R, R >= 1.  Converse of M2PO Thm 5.1.

    Pointwise (log r)^2 <= max(1, 1/r)^2 (r - 1)^2.  Default
    R = max(1, 1 / inf r).  With a given R the hypothesis r >= 1/R is NOT
    checked, and if it is false the bound can fail (M_2 grows without limit
    as r -> 0 while (r - 1)^2 <= 1).
    """
    log_R = _log_R(R, np.maximum(0.0, -W.min_lr()))  # log max(1, 1/inf r)
    lhs = W.m2()  # Eq. (4), M2PO
    rhs = _times_R2(log_R, W.log_chi2())
    return make_relation("m2_converse", lhs, rhs, "<=", rtol, atol, "converse of M2PO Thm 5.1")


@_on_samples
def m2_decomposition(W: _Weighted, rtol: float = RTOL, atol: float = ATOL) -> Relation:
    """M_2 == Var(log r) + (E[-log r])^2.  M2PO Eq. (4) with Eq. (3).

    In the exact case E_behav[-log r] = KL(pi_behav || pi_new) (checked by
    :func:`exact_relations`), so M_2 = Var(log r) + KL(pi_behav || pi_new)^2
    >= KL^2.  Algebraic: holds for any weights.
    """
    lhs = W.m2()  # Eq. (4), M2PO
    k1 = W.mean(-W.lr)  # Eq. (3), M2PO
    with np.errstate(over="ignore", invalid="ignore"):
        rhs = W.var_log_ratio() + k1 * k1
    rhs = np.where(np.isnan(rhs), np.inf, rhs)
    return make_relation("m2_decomposition", lhs, rhs, "==", rtol, atol, "M2PO Eqs. (3)-(4)")


@_on_samples
def mean_abs_log_ratio_le_sqrt_m2(W: _Weighted, rtol: float = RTOL, atol: float = ATOL) -> Relation:
    """E|log r| <= sqrt(M_2) (Cauchy-Schwarz): corrected M2PO footnote 1.

    The footnote justifies "M_2 bounds the absolute KL estimate mean|log r|"
    with "E[|r|] <= sqrt(E[r^2])", an inequality about r, not log r; this is
    the one it needs.  Tight iff |log r| is constant.  Holds for any weights.
    """
    lhs = W.mean(np.abs(W.lr))
    rhs = np.sqrt(W.m2())
    return make_relation("mean_abs_log_ratio_le_sqrt_m2", lhs, rhs, "<=", rtol, atol, "M2PO footnote 1 (corrected)")


# --------------------------------------------------------------------------- #
# convenience wrappers
# --------------------------------------------------------------------------- #
def exact_relations(
    logp_new: ArrayLike,
    logp_behav: ArrayLike,
    *,
    axis: int = -1,
    n: float = 1.0,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> list[Relation]:
    """Every relation for an exact categorical pair given as log-probs ``(..., K)``.

    The generic relations use behav_prob = pi_behav (as exact log weights).
    Three cross-checks against :mod:`~replay_theory.theory.divergences` are
    added: ``kl_exact_equals_mean_r_log_r`` (KL(new || behav) two ways),
    ``k1_mean_equals_kl_behav_new`` (M2PO Eq. (3): E_behav[-log r] =
    KL(behav || new)) and ``kong_ess_equals_exp_neg_d2`` (FreshPER Eq. (5):
    n / (1 + Var r) = n e^{-D_2}).  The FreshPER ones hold iff
    pi_new << pi_behav (the support condition Eq. (8) needs).
    """
    ln = validated_logprobs(logp_new, "logp_new", axis)  # (..., K)
    lb = validated_logprobs(logp_behav, "logp_behav", axis)  # (..., K)
    if ln.shape[-1] != lb.shape[-1]:
        raise ValueError(
            f"logp_new and logp_behav have different numbers of categories ({ln.shape[-1]} vs {lb.shape[-1]})"
        )
    ln, lb = np.broadcast_arrays(ln, lb)
    b_pos = lb > -np.inf
    lr = np.where(b_pos, ln - np.where(b_pos, lb, 0.0), 0.0)  # (..., K) log r on supp(pi_behav)
    W = _weighted(lr, None, -1, False, log_behav=lb)
    rels = [
        var_ratio_equals_chi2.on_weighted(W, rtol, atol),
        chi2_equals_expm1_d2.on_weighted(W, rtol, atol),
        kl_le_d2.on_weighted(W, rtol, atol),
        ess_bound_kl.on_weighted(W, n, rtol, atol),
        m2po_thm51.on_weighted(W, None, rtol, atol),
        m2po_sharp.on_weighted(W, rtol, atol),
        m2_converse.on_weighted(W, None, rtol, atol),
        m2_decomposition.on_weighted(W, rtol, atol),
        mean_abs_log_ratio_le_sqrt_m2.on_weighted(W, rtol, atol),
        make_relation(
            "kl_exact_equals_mean_r_log_r",
            kl_exact(ln, lb),
            W.kl_new_behav(),
            "==",
            rtol,
            atol,
            "FreshPER Eq. (25): KL(new || behav) = E_behav[r log r]",
        ),
        make_relation(
            "k1_mean_equals_kl_behav_new",
            W.mean(-W.lr),
            kl_exact(lb, ln),
            "==",
            rtol,
            atol,
            "M2PO Eq. (3): E_behav[-log r] = KL(behav || new)",
        ),
    ]
    with np.errstate(over="ignore"):
        kong = n / (1.0 + np.exp(W.log_var_ratio()))
    rels.append(
        make_relation(
            "kong_ess_equals_exp_neg_d2",
            kong,
            n * np.exp(-np.asarray(d2_exact(ln, lb))),
            "==",
            rtol,
            atol,
            "FreshPER Eqs. (5), (9), (24)",
        )
    )
    return rels


def sample_relations(
    log_ratio: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    axis: int = -1,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> list[Relation]:
    """The relations that hold for ANY sample of log-ratios (drawn under pi_behav).

    M2PO relations on the raw ratios; FreshPER relations on the
    self-normalised ratios, since a finite sample has mean(r) != 1.
    ``mask`` (0/1, same shape) drops padding.
    """
    behav = None if mask is None else np.asarray(mask, dtype=np.float64)
    raw = _weighted(log_ratio, behav, axis, False)
    sn = _weighted(log_ratio, behav, axis, True)
    return [
        m2po_thm51.on_weighted(raw, None, rtol, atol),
        m2po_sharp.on_weighted(raw, rtol, atol),
        m2_converse.on_weighted(raw, None, rtol, atol),
        m2_decomposition.on_weighted(raw, rtol, atol),
        mean_abs_log_ratio_le_sqrt_m2.on_weighted(raw, rtol, atol),
        var_ratio_equals_chi2.on_weighted(sn, rtol, atol),
        chi2_equals_expm1_d2.on_weighted(sn, rtol, atol),
        kl_le_d2.on_weighted(sn, rtol, atol),
        ess_bound_kl.on_weighted(sn, 1.0, rtol, atol),
    ]


def moments_relations(m: Moments, group: int = 0, rtol: float = 1e-9, atol: float = 1e-12) -> list[Relation]:
    """The sample relations of :func:`sample_relations` that follow from the kernel's sums (``theory/moments.py``)
    for one group: what ``diagnose`` reports of a streamed log, through the same relation builders.

    FreshPER relations use the self-normalised ratios (a finite sample has mean r != 1), so they hold for any data;
    M2PO's hold pointwise.
    """
    s = {k: np.float64(v[group]) for k, v in statistics(m).items()}
    # log E[r~^2] = D_2 - 2 log mean r = log(n B / A^2): the shifts e^{2M} cancel in the sums, not in floats of
    # size 2M (log(ratio_mean) was log(inf) past r = e^709, and -inf made the bound fail)
    with np.errstate(divide="ignore"):
        d2_sn = np.log(m.n[group] * m.B[group] / m.A[group] ** 2)
        log_m2 = np.log(s["m2"])
    kl = s["kl_new_behav"]
    top, low = np.float64(m.lmax[group]), np.float64(m.lmin[group])
    return [
        ess_bound_kl_relation(s["ess_frac"], kl, 1.0, rtol, atol,
                              "FreshPER Eqs. (10)-(11): ESS/n = e^{-D_2} <= e^{-KL(new||behav)}"),
        kl_le_d2_relation(kl, d2_sn, rtol, atol, "FreshPER Eq. (26)"),
        m2po_sharp_relation(s["chi2_pearson"], log_m2, top, rtol, atol,
                            "M2PO Thm 5.1, sharp form: chi^2 <= max(1, sup r)^2 M2"),
        m2po_thm51_relation(s["chi2_pearson"], log_m2, np.maximum(top, -low), rtol, atol,
                            "M2PO Thm 5.1: chi^2 <= R^2 M2, R = max(sup r, 1/inf r)"),
    ]

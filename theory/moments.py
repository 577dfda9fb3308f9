"""The statistics kernel: log-space sums of importance log-ratios, and every sample estimator as a function of them.

Every sample statistic the package reports of r = pi_new / pi_behav (divergences, loss metrics, the simulator's ESS
by age, diagnose, the trainers' metrics) is a function below of the sums of :class:`Moments`, taken once per group
(a row, a run of tokens, an age, a whole log) and merged exactly, so a group can be streamed in any order:

    n, s1 = sum log r, s2 = sum (log r)^2, sk3 = sum k3(log r), lmin / lmax = min / max log r,
    A = sum e^{log r - M},  B = sum e^{2 (log r - M)},  C = sum e^{log r - M} log r,
    P = sum ((r - 1) e^{-L})^2,  Q = sum (e^{log r - M} - A / n)^2,      M = lmax,  L = max(0, M).

Shifting by the group maximum M keeps every exponential in (0, 1] (log r = 4096 neither overflows nor loses the
rest); a merge rescales by e^{M_old - M_new} (Q by Chan et al.'s parallel update).  +inf log-ratios take the limit
(e^{log r - M} = 1 there, 0 elsewhere); all -inf gives A = B = 0.  ``k3_terms`` lives here too (the lowest floor).
Papers (docs/REFERENCES.md): FreshPER and M2PO.  Code names -> symbols (n samples, w = r):

    ess_frac_from_sums      (sum w)^2 / (n sum w^2) = A^2 / (n B)     Kish; -> e^{-D_2}, FreshPER Eqs. (5), (24)
    ess_from_sums           (sum w)^2 / sum w^2                       Kish ESS
    ess_frac_from_log_sums  the same from log sum w, log sum w^2     weighted groups (FreshPER's age decay)
    d2_from_sums            D_2-hat = log mean r^2 = 2 M + log(B / n)     FreshPER Eq. (23)
    chi2_from_sums          chi^2-hat = mean r^2 - 1 = expm1(D_2-hat)     FreshPER Eqs. (21), (24); verl chi2_token
    kl_k1_from_sums         k1 = -s1 / n                               M2PO Eq. (3)
    kl_k2_from_sums         k2 = s2 / (2 n) = M_2 / 2
    kl_k3_from_sums         k3 = mean(r - 1 - log r) = sk3 / n
    m2_from_sums            M_2 = s2 / n                               M2PO Eq. (4)
    kl_new_behav_from_sums  self-normalised E[r~ log r~] = C / A - log mean r     FreshPER Eq. (25)
    chi2_pearson_from_sums  E[(r - 1)^2] = e^{2L} P / n                M2PO Thm 5.1's chi^2
    ratio_std_from_sums     e^M sqrt(Q / n)  (one pass where Q was not taken)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import ParamSpec

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["Moments", "column_sums", "row_sums", "k3_terms", "statistics", "weight_sums", "ess_frac_from_sums",
           "ess_from_sums", "ess_frac_from_log_sums", "d2_from_sums", "chi2_from_sums", "kl_k1_from_sums",
           "kl_k2_from_sums", "kl_k3_from_sums", "m2_from_sums", "log_ratio_mean_from_sums", "kl_new_behav_from_sums",
           "chi2_pearson_from_sums", "ratio_std_from_sums", "EXPM1_MAX", "UNSHIFTED_MAX"]

_SUMS = ("n", "s1", "s2", "sk3", "A", "B", "C", "P")
#: expm1 overflows float64 above this log-ratio
EXPM1_MAX = 709.0
#: within +-this log-ratio, e^{2 log r} (and a sum of 2^30 of them) stays a normal float64: no shift needed
UNSHIFTED_MAX = 300.0
#: below this |log r| the k3 term uses its Taylor series instead of expm1(x) - x.
_K3_SERIES_CUTOFF = 1e-2


def k3_terms(lr: ArrayLike, expm1_lr: np.ndarray | None = None) -> np.ndarray:
    """r - 1 - log r = expm1(lr) - lr elementwise; Taylor series for small |lr|; +-inf -> inf.

    The per-sample term of the k3 KL estimator (:func:`kl_k3_from_sums` is its mean); ``expm1_lr``:
    ``np.expm1(lr)`` if the caller has it already.
    """
    lr = np.asarray(lr, dtype=np.float64)
    with np.errstate(all="ignore"):
        out = np.asarray((np.expm1(lr) if expm1_lr is None else expm1_lr) - lr)  # overflow -> inf is legitimate
    if lr.size and np.max(lr) == np.inf:
        out[np.isposinf(lr)] = np.inf  # expm1(inf) - inf would be NaN
    small = np.flatnonzero(np.abs(lr) < _K3_SERIES_CUTOFF)
    x = lr.reshape(-1)[small]
    # sum_{k>=2} x^k / k!, truncated after x^7 (relative error < 1e-13 for |x| < 1e-2):
    # x * x * (1/2 + x * (1/6 + x * (1/24 + x * (1/120 + x * (1/720 + x / 5040))))), Horner's steps in place
    # (the same operations, no temporary arrays)
    series = x / 5040
    for c in (1 / 720, 1 / 120, 1 / 24, 1 / 6):
        series += c
        series *= x
    series += 1 / 2
    square = x * x
    square *= series
    out.reshape(-1)[small] = square
    return out


def column_sums(cols: np.ndarray) -> np.ndarray:
    """``np.sum(x, axis=-1)`` of the rows x = cols.T, (m,) from ``cols`` (K, m) contiguous: the same additions in the
    same order as numpy's pairwise sum of a contiguous row (numpy/_core/src/umath/loops_utils.h.src: a running sum
    below 8 terms, 8 accumulators up to 128, halves above), each a vector addition over the m rows.

    numpy sums a short last axis row by row, one call per row; over (K, m) it is a few vector additions (the
    bandit's log-softmax over A actions, the group statistics of ``core.advantages`` over G responses).
    """
    n = cols.shape[0]
    if n < 8:
        total = cols[0] + 0.0 if n else np.zeros(cols.shape[1])
        for k in range(1, n):
            total = total + cols[k]
        return total
    if n <= 128:
        acc = cols[:8].copy()
        end = n - n % 8
        for k in range(8, end, 8):
            acc += cols[k:k + 8]
        total = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
        for k in range(end, n):
            total += cols[k]
        return total
    half = n // 2 - (n // 2) % 8
    return column_sums(cols[:half]) + column_sums(cols[half:])


def row_sums(x: np.ndarray) -> np.ndarray:
    """``np.sum(x, axis=-1)`` of ``x`` (m, K), bit for bit, (m,): ``column_sums`` of its transposed copy, plus 0.0.

    numpy adds each row's pairwise sum to the reduction's identity 0.0: that addition turns a sum of signed zeros,
    -0.0, into 0.0 and leaves every other value as it is; ``column_sums`` alone would keep the -0.0 (K >= 8). For many
    short rows (the bandit's (S n, A) entropy terms) a few vector additions replace one reduction call per row.
    """
    return column_sums(np.ascontiguousarray(x.T)) + 0.0  # (m,)


# --------------------------------------------------------------------------- #
# the estimators, one function each, on sums of any (broadcastable) shape
# --------------------------------------------------------------------------- #
P = ParamSpec("P")


def _quiet(estimator: Callable[P, np.ndarray]):  # returns functools.wraps' type: the signature and __wrapped__
    """The public estimator: ``n`` (the count argument) as :func:`_count` makes it, no floating-point warnings (log 0,
    0 / 0 and overflow are values here: an empty group is NaN, a huge ratio inf).  ``estimator.__wrapped__`` is the
    bare formula, for a caller that has counted n and holds one errstate for all (:func:`statistics`)."""
    bare: Callable[..., np.ndarray] = estimator  # called with its arguments as given, n replaced
    where = estimator.__code__.co_varnames[:estimator.__code__.co_argcount].index("n")

    @functools.wraps(estimator)
    def quiet(*args: P.args, **kwargs: P.kwargs) -> np.ndarray:
        counted: list = list(args)  # the estimators are called positionally: n is args[where]
        counted[where] = _count(counted[where])
        with np.errstate(all="ignore"):
            return bare(*counted, **kwargs)
    return quiet


def as_result(x: ArrayLike) -> np.float64 | np.ndarray:
    """The public estimators' output form: a 0-d result becomes ``np.float64``, an array a float64 array."""
    a = np.asarray(x, dtype=np.float64)
    return np.float64(a) if a.ndim == 0 else a


def _count(n: ArrayLike) -> np.ndarray:
    """n as float64 with NaN for an empty group (every estimator of an empty group is NaN)."""
    n = np.asarray(n, dtype=np.float64)
    if n.size and n.min() > 0:  # the usual case, no group empty: a cheap test, no np.where
        return n
    return np.where(n > 0, n, np.nan)


@_quiet
def ess_frac_from_sums(A: ArrayLike, B: ArrayLike, n: ArrayLike) -> np.ndarray:
    """Kish ESS / n = (sum w)^2 / (n sum w^2) from shifted sums A = sum w e^{-M}, B = sum w^2 e^{-2M} (the shift
    cancels); capped at 1 against round-off; 0 when every weight is 0 (A = 0).  FreshPER Eqs. (5), (24)."""
    A, B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
    frac = np.minimum(A**2 / (n * B), 1.0)  # equal weights give A = n, B = n: exactly 1
    return np.where(A > 0, frac, np.where(np.isnan(n), np.nan, 0.0))


@_quiet
def ess_from_sums(A: ArrayLike, B: ArrayLike, n: ArrayLike) -> np.ndarray:
    """Kish ESS = (sum w)^2 / sum w^2 in [0, n] (capped at n against round-off); see :func:`ess_frac_from_sums`."""
    A, B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
    ess = np.minimum(A**2 / B, n)
    return np.where(A > 0, ess, np.where(np.isnan(n), np.nan, 0.0))


@_quiet
def ess_frac_from_log_sums(log_A: ArrayLike, log_B: ArrayLike, n: ArrayLike) -> np.ndarray:
    """Kish ESS / n from log sum w and log sum w^2 (weights kept in log space, e.g. a ratio times an age decay):
    e^{2 log_A - log_B - log n}, capped at 1."""
    return np.minimum(np.exp(2.0 * np.asarray(log_A) - np.asarray(log_B) - np.log(n)), 1.0)


@_quiet
def d2_from_sums(top: ArrayLike, B: ArrayLike, n: ArrayLike) -> np.ndarray:
    """D_2-hat = log mean r^2 = 2 M + log(B / n).  FreshPER Eq. (23)."""
    return 2.0 * np.asarray(top, dtype=np.float64) + np.log(np.asarray(B) / n)  # Eq. (23), FreshPER


@_quiet
def chi2_from_sums(top: ArrayLike, B: ArrayLike, n: ArrayLike) -> np.ndarray:
    """chi^2-hat = mean r^2 - 1 = expm1(D_2-hat) (verl chi2_token without its +-20 clamp; FreshPER Eq. (21)).
    Not the mean of (r - 1)^2 (:func:`chi2_pearson_from_sums`) unless mean r = 1; may be +inf."""
    return np.expm1(d2_from_sums.__wrapped__(top, B, n))  # Eq. (24), FreshPER


@_quiet
def kl_k1_from_sums(s1: ArrayLike, n: ArrayLike) -> np.ndarray:
    """k1 = mean(-log r), unbiased for KL(pi_behav || pi_new).  M2PO Eq. (3)."""
    return -np.asarray(s1, dtype=np.float64) / n  # Eq. (3), M2PO


@_quiet
def kl_k2_from_sums(s2: ArrayLike, n: ArrayLike) -> np.ndarray:
    """k2 = mean((log r)^2) / 2 = M_2 / 2 (low-variance, biased estimate of KL(pi_behav || pi_new))."""
    return 0.5 * np.asarray(s2, dtype=np.float64) / n


@_quiet
def kl_k3_from_sums(sk3: ArrayLike, n: ArrayLike) -> np.ndarray:
    """k3 = mean(r - 1 - log r), unbiased and non-negative for KL(pi_behav || pi_new)."""
    return np.asarray(sk3, dtype=np.float64) / n


@_quiet
def m2_from_sums(s2: ArrayLike, n: ArrayLike) -> np.ndarray:
    """M_2 = mean((log r)^2).  M2PO Eq. (4)."""
    return np.asarray(s2, dtype=np.float64) / n  # Eq. (4), M2PO


@_quiet
def log_ratio_mean_from_sums(top: ArrayLike, A: ArrayLike, n: ArrayLike) -> np.ndarray:
    """log mean r = M + log(A / n)."""
    return np.asarray(top, dtype=np.float64) + np.log(np.asarray(A) / n)


@_quiet
def kl_new_behav_from_sums(top: ArrayLike, A: ArrayLike, C: ArrayLike, n: ArrayLike) -> np.ndarray:
    """Self-normalised KL(pi_new || pi_behav) = E[r~ log r~], r~ = r / mean r: C / A - log mean r.
    FreshPER Eq. (25) on the self-normalised sample."""
    return np.asarray(C) / np.asarray(A) - log_ratio_mean_from_sums.__wrapped__(top, A, n)


@_quiet
def chi2_pearson_from_sums(top: ArrayLike, P: ArrayLike, n: ArrayLike) -> np.ndarray:
    """E[(r - 1)^2] = e^{2L} P / n, L = max(0, M): M2PO Thm 5.1's chi^2."""
    return np.exp(2.0 * np.maximum(np.asarray(top, dtype=np.float64), 0.0)) * np.asarray(P) / n


@_quiet
def ratio_std_from_sums(top: ArrayLike, A: ArrayLike, B: ArrayLike, n: ArrayLike, Q: ArrayLike | None = None
                        ) -> np.ndarray:
    """Population std of r: e^M sqrt(Q / n) from the centred sum Q where the sums have it (arrays at hand,
    :meth:`Moments.from_rows`), else from one pass, e^M sqrt(B / n - (A / n)^2) (streamed data; its cancellation
    loses a std below ~1e-8 of mean r)."""
    scale = np.exp(2.0 * np.asarray(top, dtype=np.float64))
    one_pass = scale * np.maximum(np.asarray(B) / n - (np.asarray(A) / n) ** 2, 0.0)
    if Q is None:
        return np.sqrt(one_pass)
    Q = np.asarray(Q, dtype=np.float64)
    std = np.sqrt(np.where(np.isnan(Q), one_pass, scale * (Q / n)))
    return np.where(np.asarray(top) == np.inf, np.inf, std)  # a ratio of +inf: the spread is infinite


# --------------------------------------------------------------------------- #
# the sums
# --------------------------------------------------------------------------- #
def _shifted(log_w: np.ndarray, real: np.ndarray | None, axis: int = -1
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(M (..., 1) the row maxima, e^{log w - M} (..., n) in [0, 1] with 0 off ``real``, the counts (...,)), with
    the limits of the module docstring for +-inf rows. ``axis=0``: the groups are the COLUMNS of ``log_w`` (n, m)
    (``_by_columns``), M is (1, m)."""
    masked = log_w if real is None else np.where(real, log_w, -np.inf)
    top = np.maximum.reduce(masked, axis=axis, keepdims=True)  # (..., 1)
    finite = np.isfinite(top)
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = np.exp(log_w - np.where(finite, top, 0.0))  # (..., n)
    if real is not None or not finite.all():
        keep = finite if real is None else real & finite
        shifted = np.where(keep, shifted, 0.0)
    if np.any(top == np.inf):  # the +inf weights dominate: e^{log w - M} -> 1 there, 0 elsewhere
        plus = np.isposinf(log_w) if real is None else real & np.isposinf(log_w)
        shifted = np.where(top == np.inf, plus * 1.0, shifted)
    if real is None:
        count = np.full(tuple(d for i, d in enumerate(log_w.shape) if i != axis % log_w.ndim), float(log_w.shape[axis]))
    else:
        count = np.add.reduce(real, axis=axis).astype(np.float64)
    return top, shifted, count


#: rows of a (rows, n) array from which :func:`_by_columns` pays: a reduction along a short last axis is one inner-loop
#: call per row (max and min cost ~50 ns each), a transposed copy's columns reduce in a few vector operations
COLUMN_ROWS = 256


def _by_columns(shape: tuple[int, ...], real: np.ndarray | None) -> bool:
    """Whether the sums of rows of an array of ``shape`` are taken over its transposed copy (many short rows, every
    entry real): the same numbers (max and min are exact in any order, ``column_sums`` adds as numpy's pairwise sum
    of a row), a fraction of the calls."""
    return real is None and len(shape) == 2 and shape[0] >= COLUMN_ROWS and shape[0] >= 4 * shape[1] >= 4


def _row_sums(axis: int) -> Callable[[np.ndarray], np.ndarray]:
    """The sum of each group: along the last axis (rows), or ``column_sums`` of the columns (``axis=0``)."""
    if axis == 0:
        return column_sums
    return functools.partial(np.add.reduce, axis=axis)


def weight_sums(log_w: np.ndarray, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, B, n) of :class:`Moments` alone, over the last axis of ``log_w`` (..., n): all a Kish ESS needs, in one
    exp pass, the same numbers as :meth:`Moments.from_rows` (``mask`` (..., n) bool: the real entries; None: all)."""
    lw = np.asarray(log_w, dtype=np.float64)
    real = None if mask is None or mask.all() else mask
    axis = 0 if _by_columns(lw.shape, real) else -1
    if axis == 0:
        lw = np.ascontiguousarray(lw.T)  # (n, rows): each row's sums over a column
    _, shifted, count = _shifted(lw, real, axis)
    total = _row_sums(axis)
    return total(shifted), total(shifted * shifted), count


@dataclass
class Moments:
    """Sufficient statistics of log r for groups of samples (arrays of one shape: (G,) streamed groups, or the
    leading shape (...) of an array reduced over its last axis)."""

    n: np.ndarray  # (G,) sample counts
    s1: np.ndarray  # (G,) sum log r
    s2: np.ndarray  # (G,) sum (log r)^2
    sk3: np.ndarray  # (G,) sum (r - 1 - log r)
    lmin: np.ndarray  # (G,) min log r (+inf when empty)
    lmax: np.ndarray  # (G,) max log r = M (-inf when empty)
    A: np.ndarray  # (G,) sum e^{log r - M}
    B: np.ndarray  # (G,) sum e^{2 (log r - M)}
    C: np.ndarray  # (G,) sum e^{log r - M} log r
    P: np.ndarray  # (G,) sum ((r - 1) e^{-L})^2, L = max(0, M)
    Q: np.ndarray  # (G,) sum (e^{log r - M} - A / n)^2, the centred sum (NaN where not taken: streamed groups)

    @classmethod
    def empty(cls, size: int = 1) -> "Moments":
        return cls(**{f: np.zeros(size) for f in _SUMS}, lmin=np.full(size, np.inf), lmax=np.full(size, -np.inf),
                   Q=np.zeros(size))

    @property
    def size(self) -> int:
        return int(self.n.shape[0])

    # ------------------------------------------------------------------ building
    @classmethod
    def from_samples(cls, log_ratio: np.ndarray) -> "Moments":
        """Statistics of ``log_ratio`` (n,) as one group."""
        lr = np.asarray(log_ratio, dtype=np.float64)
        if lr.size == 0:
            return cls.empty(1)
        return cls.from_segments(lr, np.zeros(1, dtype=np.int64))

    @classmethod
    def from_rows(cls, log_ratio: np.ndarray, mask: np.ndarray | None = None, *, all_sums: bool = True
                  ) -> "Moments":
        """One group per row of ``log_ratio`` (..., n) over its real entries (``mask`` (..., n) bool, every row with
        at least one; None: all real); the sums have the leading shape (...).  Entries may be +-inf.

        Arrays at hand: every sum shifted by the row's maximum and reduced along the row (the centred sum ``Q``
        too: the spread of r without cancellation); :meth:`from_segments` is the streamed producer.
        ``all_sums=False``: ``C`` and ``P`` are left NaN (so are ``kl_new_behav`` and ``chi2_pearson``), for a caller
        that reports neither (the losses' IS metrics); the other sums are the same numbers.
        """
        lr = np.asarray(log_ratio, dtype=np.float64)
        real = None if mask is None or mask.all() else mask
        axis = 0 if _by_columns(lr.shape, real) else -1  # many short rows: their sums over a transposed copy
        if axis == 0:
            lr = np.ascontiguousarray(lr.T)  # (n, rows)
        total = _row_sums(axis)
        top, e, n = _shifted(lr, real, axis)  # (..., 1), (..., n) e^{log r - M}, (...,)
        x = lr if real is None else np.where(real, lr, 0.0)  # padding as log r = 0: every term below is 0 there
        with np.errstate(all="ignore"):  # +inf and -inf in one row give NaN sums (undefined means), without warnings
            r_minus_1 = np.expm1(x)
            A = total(e)
            centred = e - np.expand_dims(A / n, axis)
            if real is not None:
                centred = np.where(real, centred, 0.0)
            C = P = np.full(A.shape, np.nan)
            if all_sums:
                big = np.maximum(top, 0.0)  # (..., 1) L
                dev = r_minus_1 * np.exp(-big)  # (r - 1) e^{-L}
                if not np.isfinite(big).all():
                    dev = np.where(np.isposinf(big), np.isposinf(x) * 1.0, dev)
                if top.max() > EXPM1_MAX:  # expm1 overflowed: r e^{-L} = e^{log r - M} there (L = M)
                    far = np.isfinite(x) & (x > EXPM1_MAX)
                    dev = np.where(far, e - np.exp(-top), dev)
                C, P = total(np.where(e > 0, e * x, 0.0)), total(dev * dev)
            return cls(n=n, s1=total(x), s2=total(x * x),
                       sk3=total(k3_terms(x, r_minus_1)),
                       lmin=np.minimum.reduce(lr if real is None else np.where(real, lr, np.inf), axis=axis),
                       lmax=np.squeeze(top, axis), A=A, B=total(e * e), C=C, P=P,
                       Q=total(centred * centred))

    @classmethod
    def from_segments(cls, log_ratio: np.ndarray, starts: np.ndarray, ratio: np.ndarray | None = None,
                      centred: bool = False) -> "Moments":
        """One group per run ``log_ratio[starts[i]:starts[i + 1]]`` (``starts`` (S,) increasing from 0, runs not
        empty).

        The per-sample work is a few ``reduceat`` passes; groups of runs (an age, the whole log) follow from
        :meth:`reduce`, which costs O(runs), not O(samples).  ``ratio``: e^{log r} (n,) if the caller has it, given
        only where every |log r| <= ``UNSHIFTED_MAX``.  ``centred``: take the centred sum ``Q`` too (a second pass;
        NaN otherwise).
        """
        lr = np.asarray(log_ratio, dtype=np.float64)  # (n,)
        n_tok = np.diff(np.append(starts, lr.size))  # (S,)
        top = np.maximum.reduceat(lr, starts)  # (S,) M per run
        low = np.minimum.reduceat(lr, starts)

        def total(x: np.ndarray) -> np.ndarray:
            return np.add.reduceat(x, starts)

        with np.errstate(over="ignore", invalid="ignore"):
            r_minus_1 = np.expm1(lr)  # full precision for r near 1
            k3 = k3_terms(lr, r_minus_1)  # r - 1 - log r, series near 0 so fresh data gives exactly 0
        finite = bool(np.isfinite(top).all() and np.isfinite(low).all())
        unshifted = finite and max(float(top.max()), -float(low.min())) <= UNSHIFTED_MAX
        Q = np.full(starts.size, np.nan)
        if unshifted:
            # e^{log r} and (r - 1)^2 can neither overflow nor leave the normal range here: sum them as they are and
            # shift the run sums (S,), not the samples (n,) (a few ulps from shifting first; no repeat, no subtraction)
            r, down = np.exp(lr) if ratio is None else ratio, np.exp(-top)  # (n,), (S,) e^{-M}
            sum_r = total(r)
            A, B, C = sum_r * down, total(r * r) * (down * down), total(r * lr) * down
            P = total(r_minus_1 * r_minus_1) * np.exp(-2.0 * np.maximum(top, 0.0))  # e^{-2L}
            if centred:  # sum (r - mean r)^2 e^{-2M}: the run means first, then the deviations from them
                dev_r = r - np.repeat(sum_r / n_tok, n_tok)
                Q = total(dev_r * dev_r) * (down * down)
        else:
            top_tok = np.repeat(top, n_tok)  # (n,)
            with np.errstate(over="ignore", invalid="ignore"):
                if finite:
                    shifted = np.exp(lr - top_tok)  # in (0, 1]
                    # (r - 1) e^{-L}, L = max(0, M); expm1 overflows only past log r = 709, where r e^{-L} =
                    # e^{log r - M} is used instead (L = M there)
                    dev = r_minus_1 * np.repeat(np.exp(-np.maximum(top, 0.0)), n_tok)
                    weighted_lr = shifted * lr
                else:  # +-inf log-ratios (huge sequence ratios, r = 0): the limits of the shifted sums
                    shifted = np.where(np.isposinf(top_tok), np.isposinf(lr) * 1.0,
                                       np.where(np.isneginf(top_tok), 0.0, np.exp(lr - top_tok)))  # (n,) in [0, 1]
                    big = np.repeat(np.maximum(top, 0.0), n_tok)  # (n,) L
                    dev = np.where(np.isposinf(big), np.isposinf(lr) * 1.0, r_minus_1 * np.exp(-big))
                    weighted_lr = np.where(shifted > 0, shifted * lr, 0.0)
                far = np.isfinite(lr) & (lr > EXPM1_MAX) if top.max() > EXPM1_MAX else None
                if far is not None:
                    dev[far] = shifted[far] - np.exp(-top_tok[far])
            A, B, C, P = total(shifted), total(shifted * shifted), total(weighted_lr), total(dev * dev)
            if centred:
                dev_s = shifted - np.repeat(A / n_tok, n_tok)  # (n,) e^{log r - M} minus its run mean
                Q = total(dev_s * dev_s)
        with np.errstate(over="ignore", invalid="ignore"):  # +inf and -inf in one group: NaN (undefined mean)
            s1, s2 = total(lr), total(lr * lr)
        return cls(n=n_tok.astype(np.float64), s1=s1, s2=s2, sk3=total(k3), lmin=low, lmax=top, A=A, B=B, C=C, P=P,
                   Q=Q)

    def reduce(self, groups: np.ndarray, size: int) -> "Moments":
        """Groups merged: group i goes to new group ``groups[i]`` in [0, size) (exact, rescaled to the new maxima)."""
        g = np.asarray(groups, dtype=np.int64)  # (G,)
        top = np.full(size, -np.inf)
        np.maximum.at(top, g, self.lmax)
        low = np.full(size, np.inf)
        np.minimum.at(low, g, self.lmin)
        seen = self.n > 0
        with np.errstate(invalid="ignore"):
            scale = np.where(seen, np.exp(self.lmax - top[g]), 0.0)  # e^{M_i - M_new}
            scale_p = np.where(seen, np.exp(2.0 * (np.maximum(self.lmax, 0.0) - np.maximum(top[g], 0.0))), 0.0)

        def total(x: np.ndarray) -> np.ndarray:
            return np.bincount(g, weights=x, minlength=size)

        n, A = total(self.n), total(self.A * scale)
        if np.isnan(self.Q).any():  # some group was streamed without its centred sum: none for the merged ones
            Q = np.full(size, np.nan)
        else:  # Chan et al.'s merge: the groups' centred sums plus their means' spread about the merged mean
            with np.errstate(invalid="ignore", divide="ignore"):
                gap = np.where(seen, self.A * scale / np.where(seen, self.n, 1.0) - (A / n)[g], 0.0)  # (G,)
            Q = total(np.where(seen, self.Q * scale * scale, 0.0)) + total(self.n * gap * gap)
        return Moments(n=n, s1=total(self.s1), s2=total(self.s2), sk3=total(self.sk3), lmin=low, lmax=top, A=A,
                       B=total(self.B * scale * scale), C=total(self.C * scale), P=total(self.P * scale_p), Q=Q)

    def fold(self, other: "Moments") -> None:
        """Add ``other`` into ``self``, group i into group i (exact merge of the shifted sums); groups that only
        ``other`` has are added."""
        both = Moments(**{f.name: np.concatenate([getattr(self, f.name), getattr(other, f.name)])
                          for f in fields(self)})
        merged = both.reduce(np.concatenate([np.arange(self.size), np.arange(other.size)]), max(self.size, other.size))
        for f in fields(self):
            setattr(self, f.name, getattr(merged, f.name))

    # ------------------------------------------------------------------ results
    def statistics(self) -> dict[str, np.ndarray]:
        """:func:`statistics` of these sums."""
        return statistics(self)


def statistics(m: Moments) -> dict[str, np.ndarray]:
    """Every estimator of the module docstring from the sums ``m``, arrays of the groups' shape (NaN where empty)."""
    n = _count(m.n)  # once for all, as the public estimators count it
    with np.errstate(all="ignore"):  # once for all: the estimators' own errstate is skipped (__wrapped__)
        return {
            "n_tokens": m.n.copy(),
            "ess_frac": ess_frac_from_sums.__wrapped__(m.A, m.B, n),  # Kish of raw r, FreshPER Eq. (5)
            "chi2": chi2_from_sums.__wrapped__(m.lmax, m.B, n),  # Eq. (24), FreshPER; verl chi2_token unclamped
            "d2": d2_from_sums.__wrapped__(m.lmax, m.B, n),  # Eq. (23), FreshPER
            "kl_k1": kl_k1_from_sums.__wrapped__(m.s1, n),  # Eq. (3), M2PO
            "kl_k2": kl_k2_from_sums.__wrapped__(m.s2, n),
            "kl_k3": kl_k3_from_sums.__wrapped__(m.sk3, n),
            "m2": m2_from_sums.__wrapped__(m.s2, n),  # Eq. (4), M2PO
            "ratio_min": np.exp(m.lmin),
            "ratio_mean": np.exp(log_ratio_mean_from_sums.__wrapped__(m.lmax, m.A, n)),
            "ratio_max": np.exp(m.lmax),
            "ratio_std": ratio_std_from_sums.__wrapped__(m.lmax, m.A, m.B, n, m.Q),
            "kl_new_behav": kl_new_behav_from_sums.__wrapped__(m.lmax, m.A, m.C, n),
            "chi2_pearson": chi2_pearson_from_sums.__wrapped__(m.lmax, m.P, n),  # E[(r - 1)^2], M2PO Thm 5.1
        }

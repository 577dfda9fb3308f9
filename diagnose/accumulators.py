"""Streaming, mergeable accumulators of diagnose: the kernel's log-ratio sums, running summaries, weight sums,
a log-ratio histogram.

:class:`Moments` (the sums every sample estimator follows from, exactly and in log space: ESS, chi^2, D_2, KL
k1/k2/k3, M2, ratio min/mean/max) is the statistics kernel of ``theory/moments.py``, re-exported here: diagnose takes
it per run of tokens (:meth:`Moments.from_segments`, one ``reduceat`` per sum) and merges runs into ages, sequences
and the whole log (:meth:`Moments.reduce`, :meth:`Moments.fold`), so chunks can arrive in any order and age values
can be merged into buckets after the pass; the estimators and the sample bounds are the kernel's
(``theory.moments.statistics``, ``theory.bounds.moments_relations``).  The papers (FreshPER, M2PO) are listed in
docs/REFERENCES.md; the symbols are those of ``theory/moments.py``.

:class:`WeightSums` keeps the shifted sums of effective weights w >= 0 (the what-if corrections) and gives the Kish
ESS of the kernel (``ess_frac_from_sums``); :class:`Running` and :class:`LogRatioHistogram` summarise streams whose
whole arrays are never held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..theory.moments import UNSHIFTED_MAX, Moments, ess_frac_from_sums

__all__ = ["Moments", "UNSHIFTED_MAX", "Summary", "Running", "WeightSums", "LogRatioHistogram", "LOG_FLOAT_MAX"]

@dataclass(frozen=True)
class Summary:
    """One stream's count, sum, min, max and spread (a row of :class:`Running`)."""

    n: int
    total: float
    low: float
    high: float
    std: float  # unbiased (ddof 1, torch's .std()); 0 for fewer than two numbers
    log_mean_exp: float = math.nan  # log mean e^x, from shifted sums (NaN unless the row is one of ``exp_of``)

    @property
    def mean_exp(self) -> float:
        """mean e^x: inf where it leaves float64 (the number itself, past 1.8e308), never a warning."""
        return math.exp(self.log_mean_exp) if self.log_mean_exp < LOG_FLOAT_MAX else math.inf


#: math.exp overflows float64 above this
LOG_FLOAT_MAX = math.log(np.finfo(np.float64).max)


class Running:
    """count, sum, min, max and (Chan et al.'s merge of per-batch two-pass) mean and M2 of ``names`` streams of
    numbers that grow together, one row each: a batch is updated with a few numpy calls whatever the streams.

    For the rows in ``exp_of`` (streams of logs: log perplexities, log-ratios) the mean of e^x is kept too, in log
    space (a running maximum and the sum of e^{x - max}, as ``Moments`` keeps A), so a perplexity of e^{5e5} is
    never a number that overflowed inside a sum (the mean of inf - inf would be NaN, with a numpy warning).
    """

    def __init__(self, names: tuple[str, ...], exp_of: tuple[str, ...] = ()) -> None:
        self.names = names
        self.row = {name: i for i, name in enumerate(names)}
        self.n = 0
        k = len(names)
        self.total, self.mean, self.m2 = np.zeros(k), np.zeros(k), np.zeros(k)  # (k,) each
        self.low, self.high = np.full(k, math.inf), np.full(k, -math.inf)
        self.exp_rows = np.array([self.row[name] for name in exp_of], dtype=np.int64)  # (e,)
        self.exp_top, self.exp_sum = np.full(len(exp_of), -math.inf), np.zeros(len(exp_of))  # (e,) M, sum e^{x - M}

    def update(self, x: np.ndarray) -> None:
        """Add a batch ``x`` (k, m) of finite numbers or NaN; NaN entries count in n and the sums (as they would in
        a mean) but not in min / max."""
        if x.shape[1] == 0:
            return
        mean = x.mean(axis=1)  # (k,)
        m2 = np.sum((x - mean[:, None]) ** 2, axis=1)
        n = self.n + x.shape[1]
        delta = mean - self.mean
        self.m2 += m2 + delta * delta * self.n * x.shape[1] / n
        self.mean += delta * x.shape[1] / n
        self.n = n
        self.total += x.sum(axis=1)
        self.low = np.fmin(self.low, np.fmin.reduce(x, axis=1))  # fmin skips NaN; an all-NaN row leaves +inf
        self.high = np.fmax(self.high, np.fmax.reduce(x, axis=1))
        if self.exp_rows.size:
            logs = x[self.exp_rows]  # (e, m)
            top = np.fmax(self.exp_top, np.fmax.reduce(logs, axis=1))  # (e,) the new maxima
            # e^{x - M} <= 1 and e^{M_old - M} <= 1: nothing overflows; an unseen M_old = -inf scales 0 by 0
            self.exp_sum = self.exp_sum * np.exp(self.exp_top - top) + np.exp(logs - top[:, None]).sum(axis=1)
            self.exp_top = top

    def __getitem__(self, name: str) -> Summary:
        i = self.row[name]
        std = math.sqrt(self.m2[i] / (self.n - 1)) if self.n > 1 else 0.0
        at = np.flatnonzero(self.exp_rows == i)
        log_mean_exp = float(self.exp_top[at[0]] + math.log(self.exp_sum[at[0]] / self.n)) if at.size else math.nan
        return Summary(self.n, float(self.total[i]), float(self.low[i]), float(self.high[i]), std, log_mean_exp)


@dataclass
class WeightSums:
    """Streaming ESS of effective weights w >= 0 from shifted sums (see :meth:`add`), merged in log space."""

    n: float = 0.0
    flagged: float = 0.0  # tokens the correction touched (clipped, truncated, masked)
    removed: float = 0.0  # sum of (r - w): the IS mass the correction takes away
    top: float = -math.inf  # max log w seen
    A: float = 0.0  # sum e^{log w - top}
    B: float = 0.0  # sum e^{2 (log w - top)}

    def add(self, n: float, flagged: float, removed: float, top: float, A: float, B: float) -> None:
        """Merge sums taken elsewhere: ``A`` = sum e^{log w - top}, ``B`` = sum e^{2 (log w - top)}."""
        self.n += n
        self.flagged += float(flagged)
        self.removed += float(removed)
        if top == -math.inf:
            return
        new = max(self.top, top)
        self.A = self.A * math.exp(self.top - new) + A * math.exp(top - new)
        self.B = self.B * math.exp(2.0 * (self.top - new)) + B * math.exp(2.0 * (top - new))
        self.top = new

    def result(self) -> dict[str, float]:
        n = self.n if self.n else math.nan
        ess = float(ess_frac_from_sums(self.A, self.B, self.n))  # Kish (sum w)^2 / (n sum w^2); 0 if every w = 0
        return {"flagged_frac": self.flagged / n, "ess_frac": ess, "bias_proxy": self.removed / n}


@dataclass
class LogRatioHistogram:
    """Counts of log r in bins of ``width``, for quantiles of r in one pass (error < the bin width in log r).

    Inside [lo, hi) the bins are a dense array (a clip and a ``bincount`` per chunk); outside, where a healthy log
    has few tokens, they are sparse: sorted bin edges and counts (``tail_edges``, ``tail_counts``), so a log with
    log r = 20 or 1e6 gets its quantiles to the same width instead of being capped at e^{+-16}.  The tail holds at
    most ``max_tail_bins`` bins (16 bytes each): beyond, its width doubles until they fit, so memory stays flat, and
    :meth:`quantiles` returns the width each quantile came from, which the report prints when it is not ``width``.
    A tail value so large that its bin edge would overflow (|log r| > ``EXACT_ABOVE``) is its own bin, of width 0.
    """

    lo: float = -16.0
    hi: float = 16.0
    width: float = 1e-3
    max_tail_bins: int = 1 << 20
    counts: np.ndarray = field(default=None)  # type: ignore[assignment]
    tail_width: float = field(default=None)  # type: ignore[assignment]
    tail_edges: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (T,) sorted left edges, outside [lo, hi)
    tail_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # (T,)

    #: |log r| above which a tail value is kept as its own bin (its edge floor(v / w) w would leave float64)
    EXACT_ABOVE = 1e300

    def __post_init__(self) -> None:
        if self.counts is None:
            self.counts = np.zeros(int(round((self.hi - self.lo) / self.width)) + 2, dtype=np.int64)
        if self.tail_width is None:
            self.tail_width = self.width

    def update(self, lr: np.ndarray) -> None:
        # bin 0: below lo; last bin: at or above hi (their values go to the sparse tail)
        x = lr - self.lo  # (n,), then the bin number in place
        x /= self.width
        np.floor(x, out=x)
        np.clip(x, -1.0, self.counts.size - 2, out=x)  # before the cast: nothing out of int64's range
        idx = x.astype(np.int64)
        idx += 1
        counts = np.bincount(idx, minlength=self.counts.size)
        if counts[0] or counts[-1]:  # rare in a healthy log: only then is the chunk scanned again
            self._add_tail(lr[(lr < self.lo) | (lr >= self.hi)])
        self.counts += counts

    def _tail_keys(self, v: np.ndarray, w: float) -> np.ndarray:
        """Left edges of the bins of width ``w`` holding ``v`` (a value beyond ``EXACT_ABOVE`` is its own edge)."""
        exact = np.abs(v) > self.EXACT_ABOVE
        return np.where(exact, v, np.floor(np.where(exact, 0.0, v) / w) * w)

    def _add_tail(self, v: np.ndarray) -> None:
        keys = np.concatenate([self.tail_edges, self._tail_keys(v, self.tail_width)])
        weights = np.concatenate([self.tail_counts, np.ones(v.size, dtype=np.int64)])
        while True:
            self.tail_edges, inverse = np.unique(keys, return_inverse=True)
            self.tail_counts = np.bincount(inverse.reshape(-1), weights=weights,
                                           minlength=self.tail_edges.size).astype(np.int64)
            if self.tail_edges.size <= self.max_tail_bins:
                return
            self.tail_width *= 2.0  # a bin of width w lies inside one of width 2 w: the counts merge exactly
            keys, weights = self._tail_keys(self.tail_edges, self.tail_width), self.tail_counts

    def quantiles(self, qs, lmin: float, lmax: float) -> tuple[list[float], list[float]]:
        """log-ratio quantiles (linear inside a bin), clamped to the exact [min, max], and the width of the bin each
        came from (the most it can be off in log r: the true quantile lies in that bin too)."""
        inner = self.counts[1:-1]  # (K,)
        k = np.arange(inner.size)
        tail_w = np.where(np.abs(self.tail_edges) > self.EXACT_ABOVE, 0.0, self.tail_width)  # (T,)
        # every bin in order of its left edge: the tail below lo, the dense bins, the tail at or above hi
        low_tail = self.tail_edges < self.lo
        edges = np.concatenate([self.tail_edges[low_tail], self.lo + k * self.width, self.tail_edges[~low_tail]])
        widths = np.concatenate([tail_w[low_tail], np.full(inner.size, self.width), tail_w[~low_tail]])
        counts = np.concatenate([self.tail_counts[low_tail], inner, self.tail_counts[~low_tail]])
        total = counts.sum()
        if total == 0:
            return [math.nan for _ in qs], [math.nan for _ in qs]
        cdf = np.cumsum(counts)
        target = np.asarray(qs, dtype=np.float64) * total
        b = np.searchsorted(cdf, target, side="left")  # the bin of each quantile
        before = np.where(b > 0, cdf[b - 1], 0)
        inside = (target - before) / np.maximum(counts[b], 1)
        value = np.clip(edges[b] + inside * widths[b], lmin, lmax)
        return value.tolist(), widths[b].tolist()

"""Streaming, mergeable sufficient statistics of importance log-ratios.

The statistics of ``theory/divergences.py`` (ESS, chi^2, D_2, KL k1/k2/k3, M2, ratio min/mean/max) need whole
arrays; a rollout log may not fit in memory.  :class:`Moments` keeps, per group (overall, an age value, ...), sums
from which every statistic follows exactly, in log space:

    n, sum log r, sum (log r)^2, sum k3(log r), min / max log r,
    A = sum e^{log r - M},  B = sum e^{2 (log r - M)},  C = sum e^{log r - M} log r,
    P = sum ((r - 1) e^{-L})^2,        M = max log r,  L = max(0, M).

Shifting by the running maximum M keeps every exponential in (0, 1], so an 8k-token sequence with log r = 4096
neither overflows nor loses the rest of the sum; when a later chunk raises M the old sums are rescaled by
e^{M_old - M_new}.  Within a chunk the sums are taken per run of tokens (:meth:`Moments.from_segments`, one
``reduceat`` per sum); groups of runs and groups of groups merge exactly (:meth:`Moments.reduce`,
:meth:`Moments.fold`), so chunks can arrive in any order and age values can be merged into buckets after the pass.

From the sums (n tokens, r = e^{log r}; the papers FreshPER and M2PO are listed in docs/REFERENCES.md):

    ess_frac = A^2 / (n B)                       (sum r)^2 / (n sum r^2), Kish
    d2       = 2 M + log(B / n)                  log mean r^2, FreshPER Eq. (23)
    chi2     = expm1(d2)                         mean r^2 - 1 (verl chi2_token clamps log r to +-20 first)
    kl_k1    = -sum log r / n                    M2PO Eq. (3)
    kl_k2    = sum (log r)^2 / (2 n),  m2 = 2 kl_k2     M2PO Eq. (4)
    kl_k3    = mean(r - 1 - log r)
    kl_new_behav = C / A - log m,  m = e^M A / n       self-normalised E[r~ log r~]
    chi2_pearson = e^{2L} P / n                  E[(r - 1)^2], M2PO Thm 5.1's chi^2
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

from ..theory.bounds import Relation, make_relation
from ..theory.divergences import k3_terms

_SUMS = ("n", "s1", "s2", "sk3", "A", "B", "C", "P")
#: expm1 overflows float64 above this log-ratio
EXPM1_MAX = 709.0
#: within +-this log-ratio, e^{2 log r} (and a sum of 2^30 of them) stays a normal float64: no shift needed
UNSHIFTED_MAX = 300.0


@dataclass
class Moments:
    """Sufficient statistics of log r for ``size`` groups (arrays of shape (G,))."""

    n: np.ndarray  # (G,) token counts
    s1: np.ndarray  # (G,) sum log r
    s2: np.ndarray  # (G,) sum (log r)^2
    sk3: np.ndarray  # (G,) sum (r - 1 - log r)
    lmin: np.ndarray  # (G,) min log r (+inf when empty)
    lmax: np.ndarray  # (G,) max log r = M (-inf when empty)
    A: np.ndarray  # (G,) sum e^{log r - M}
    B: np.ndarray  # (G,) sum e^{2 (log r - M)}
    C: np.ndarray  # (G,) sum e^{log r - M} log r
    P: np.ndarray  # (G,) sum ((r - 1) e^{-L})^2, L = max(0, M)

    @classmethod
    def empty(cls, size: int = 1) -> "Moments":
        return cls(**{f: np.zeros(size) for f in _SUMS}, lmin=np.full(size, np.inf), lmax=np.full(size, -np.inf))

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
    def from_segments(cls, log_ratio: np.ndarray, starts: np.ndarray, ratio: np.ndarray | None = None) -> "Moments":
        """One group per run ``log_ratio[starts[i]:starts[i + 1]]`` (``starts`` (S,) increasing from 0).

        The per-token work is a few ``reduceat`` passes; groups of runs (an age, the whole log) follow from
        :meth:`reduce`, which costs O(runs), not O(tokens).  ``ratio``: e^{log r} (n,) if the caller has it, given
        only where every |log r| <= ``UNSHIFTED_MAX``.
        """
        lr = np.asarray(log_ratio, dtype=np.float64)  # (n,)
        n_tok = np.diff(np.append(starts, lr.size))  # (S,)
        top = np.maximum.reduceat(lr, starts)  # (S,) M per run

        def total(x: np.ndarray) -> np.ndarray:
            return np.add.reduceat(x, starts)

        with np.errstate(over="ignore", invalid="ignore"):
            r_minus_1 = np.expm1(lr)  # full precision for r near 1
            k3 = k3_terms(lr, r_minus_1)  # r - 1 - log r, series near 0 so fresh data gives exactly 0
        if lr.size and max(float(top.max()), -float(lr.min())) <= UNSHIFTED_MAX:
            # e^{log r} and (r - 1)^2 can neither overflow nor leave the normal range here: sum them as they are and
            # shift the run sums (S,), not the tokens (n,) (a few ulps from shifting first; no repeat, no subtraction)
            r, down = np.exp(lr) if ratio is None else ratio, np.exp(-top)  # (n,), (S,) e^{-M}
            A, B, C = total(r) * down, total(r * r) * (down * down), total(r * lr) * down
            P = total(r_minus_1 * r_minus_1) * np.exp(-2.0 * np.maximum(top, 0.0))  # e^{-2L}
        else:
            top_tok = np.repeat(top, n_tok)  # (n,)
            shifted = np.exp(lr - top_tok)  # in (0, 1]
            # (r - 1) e^{-L}, L = max(0, M); expm1 overflows only past log r = 709, where r e^{-L} = e^{log r - M}
            # is used instead (L = M there)
            with np.errstate(over="ignore", invalid="ignore"):
                dev = r_minus_1 * np.repeat(np.exp(-np.maximum(top, 0.0)), n_tok)
            if top.max() > EXPM1_MAX:
                far = lr > EXPM1_MAX
                dev[far] = shifted[far] - np.exp(-top_tok[far])
            A, B, C, P = total(shifted), total(shifted * shifted), total(shifted * lr), total(dev * dev)
        return cls(n=n_tok.astype(np.float64), s1=total(lr), s2=total(lr * lr), sk3=total(k3),
                   lmin=np.minimum.reduceat(lr, starts), lmax=top, A=A, B=B, C=C, P=P)

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

        return Moments(n=total(self.n), s1=total(self.s1), s2=total(self.s2), sk3=total(self.sk3), lmin=low,
                       lmax=top, A=total(self.A * scale), B=total(self.B * scale * scale), C=total(self.C * scale),
                       P=total(self.P * scale_p))

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
        """Every statistic of the module docstring, arrays of shape (G,) (NaN for empty groups)."""
        n = np.where(self.n > 0, self.n, np.nan)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            log_mean_r = self.lmax + np.log(self.A / n)
            d2 = 2.0 * self.lmax + np.log(self.B / n)  # Eq. (23), FreshPER
            var_r = np.exp(2.0 * self.lmax) * np.maximum(self.B / n - (self.A / n) ** 2, 0.0)
            # C / A = sum r log r / sum r; minus log mean r gives E[r~ log r~], r~ = r / mean r (self-normalised).
            kl_new_behav = self.C / self.A - log_mean_r
            big = np.maximum(self.lmax, 0.0)
            return {
                "n_tokens": self.n.copy(),
                "ess_frac": np.minimum(self.A**2 / (n * self.B), 1.0),  # Kish of raw r, FreshPER Eq. (5); not verl's
                "chi2": np.expm1(d2),  # Eq. (24), FreshPER; verl chi2_token without its +-20 clamp
                "d2": d2,
                "kl_k1": -self.s1 / n,  # Eq. (3), M2PO
                "kl_k2": 0.5 * self.s2 / n,
                "kl_k3": self.sk3 / n,
                "m2": self.s2 / n,  # Eq. (4), M2PO
                "ratio_min": np.exp(self.lmin),
                "ratio_mean": np.exp(log_mean_r),
                "ratio_max": np.exp(self.lmax),
                "ratio_std": np.sqrt(var_r),
                "kl_new_behav": kl_new_behav,
                "chi2_pearson": np.exp(2.0 * big) * self.P / n,  # E[(r - 1)^2], M2PO Thm 5.1
            }

    def relations(self, group: int = 0) -> list[Relation]:
        """The sample bounds of theory/bounds.py for one group, from the sums (each with its slack).

        FreshPER relations use the self-normalised ratios (a finite sample has mean r != 1), so they hold for any
        data; M2PO's hold pointwise.
        """
        s = {k: float(v[group]) for k, v in self.statistics().items()}
        # log E[r~^2] = D_2 - 2 log mean r = log(n B / A^2): the shifts e^{2M} cancel in the sums, not in floats of
        # size 2M (log(ratio_mean) was log(inf) past r = e^709, and -inf made the bound fail)
        with np.errstate(divide="ignore"):
            d2_sn = float(np.log(self.n[group] * self.B[group] / self.A[group] ** 2))
        kl = s["kl_new_behav"]
        sup_r = s["ratio_max"]
        # numpy floats: past r = e^354.9 a square is inf, where a Python float raises OverflowError
        R = np.float64(max(sup_r, 1.0 / s["ratio_min"]) if s["ratio_min"] > 0 else math.inf)
        sup_r = np.float64(sup_r)
        with np.errstate(over="ignore", invalid="ignore"):
            return [
                make_relation("ess_bound_kl", s["ess_frac"], math.exp(-kl), "<=", 1e-9, 1e-12,
                              "FreshPER Eqs. (10)-(11): ESS/n = e^{-D_2} <= e^{-KL(new||behav)}"),
                make_relation("kl_le_d2", kl, d2_sn, "<=", 1e-9, 1e-12, "FreshPER Eq. (26)"),
                make_relation("m2po_sharp", s["chi2_pearson"], np.maximum(1.0, sup_r) ** 2 * s["m2"], "<=", 1e-9, 1e-12,
                              "M2PO Thm 5.1, sharp form: chi^2 <= max(1, sup r)^2 M2"),
                make_relation("m2po_thm51", s["chi2_pearson"], R**2 * s["m2"], "<=", 1e-9, 1e-12,
                              "M2PO Thm 5.1: chi^2 <= R^2 M2, R = max(sup r, 1/inf r)"),
            ]


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
        ess = self.A**2 / (n * self.B) if self.B > 0 else 0.0
        return {"flagged_frac": self.flagged / n, "ess_frac": min(ess, 1.0), "bias_proxy": self.removed / n}


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

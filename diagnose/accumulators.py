"""Streaming, mergeable sufficient statistics of importance log-ratios.

The statistics of ``theory/divergences.py`` (ESS, chi^2, D_2, KL k1/k2/k3, M2,
ratio min/mean/max) need whole arrays; a rollout log may not fit in memory.
:class:`Moments` keeps, per group (overall, an age value, ...), sums from which
every statistic follows exactly, in log space:

    n, sum log r, sum (log r)^2, sum k3(log r), min / max log r,
    A = sum e^{log r - M},  B = sum e^{2 (log r - M)},  C = sum e^{log r - M} log r,
    P = sum ((r - 1) e^{-L})^2,        M = max log r,  L = max(0, M).

Shifting by the running maximum M keeps every exponential in (0, 1], so an
8k-token sequence with log r = 4096 neither overflows nor loses the rest of the
sum; when a later chunk raises M the old sums are rescaled by e^{M_old - M_new}.
Two accumulators of the same group combine exactly (:meth:`Moments.fold`), so
chunks can arrive in any order and age values can be merged into buckets after
the pass.

From the sums (n tokens, r = e^{log r}; the papers FreshPER and M2PO are
listed in docs/REFERENCES.md):

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

from replay_theory.theory.bounds import Relation, make_relation
from replay_theory.theory.divergences import k3_terms

_SUMS = ("n", "s1", "s2", "sk3", "A", "B", "C", "P")


def _zeros(size: int) -> np.ndarray:
    return np.zeros(size, dtype=np.float64)


def _full(size: int, value: float) -> np.ndarray:
    return np.full(size, value, dtype=np.float64)


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
        return cls(**{f: _zeros(size) for f in _SUMS}, lmin=_full(size, np.inf), lmax=_full(size, -np.inf))

    @property
    def size(self) -> int:
        return int(self.n.shape[0])

    # ------------------------------------------------------------------ building
    @classmethod
    def from_samples(cls, log_ratio: np.ndarray, groups: np.ndarray | None = None, size: int = 1) -> "Moments":
        """Statistics of ``log_ratio`` (n,), grouped by integer ``groups`` (n,) in [0, size)."""
        lr = np.asarray(log_ratio, dtype=np.float64)  # (n,)
        with np.errstate(over="ignore"):
            k3 = k3_terms(lr)  # r - 1 - log r, series near 0 so fresh data gives exactly 0
        if groups is None:  # one group: plain reductions, the common and fast case
            if lr.size == 0:
                return cls.empty(1)
            top = float(np.max(lr))
            shifted = np.exp(lr - top)  # in (0, 1]
            big = max(0.0, top)
            dev = np.expm1(lr) if big == 0.0 else shifted * math.exp(top - big) - math.exp(-big)
            sums = [lr.size, lr.sum(), (lr * lr).sum(), k3.sum(), shifted.sum(), (shifted * shifted).sum(),
                    (shifted * lr).sum(), (dev * dev).sum()]
            out = cls(**{f: np.array([v], dtype=np.float64) for f, v in zip(_SUMS, sums)},
                      lmin=np.array([lr.min()]), lmax=np.array([top]))
            return out
        g = np.asarray(groups, dtype=np.int64)  # (n,)
        top = _full(size, -np.inf)
        np.maximum.at(top, g, lr)
        low = _full(size, np.inf)
        np.minimum.at(low, g, lr)
        top_tok = top[g]  # (n,) each token's group maximum
        shifted = np.exp(lr - top_tok)
        big_tok = np.maximum(top_tok, 0.0)
        dev = np.where(big_tok == 0.0, np.expm1(lr), shifted * np.exp(top_tok - big_tok) - np.exp(-big_tok))

        def total(w: np.ndarray | None) -> np.ndarray:
            return np.bincount(g, weights=w, minlength=size).astype(np.float64)

        return cls(n=total(None), s1=total(lr), s2=total(lr * lr), sk3=total(k3), lmin=low, lmax=top,
                   A=total(shifted), B=total(shifted * shifted), C=total(shifted * lr), P=total(dev * dev))

    def grow(self, size: int) -> None:
        """Extend to ``size`` groups (new groups empty)."""
        extra = size - self.size
        if extra <= 0:
            return
        pad = Moments.empty(extra)
        for f in fields(self):
            setattr(self, f.name, np.concatenate([getattr(self, f.name), getattr(pad, f.name)]))

    def fold(self, other: "Moments") -> None:
        """Add ``other`` (same number of groups) into ``self``: exact merge of the shifted sums."""
        new_max = np.maximum(self.lmax, other.lmax)
        with np.errstate(invalid="ignore"):
            mine = np.where(self.n > 0, np.exp(self.lmax - new_max), 0.0)
            theirs = np.where(other.n > 0, np.exp(other.lmax - new_max), 0.0)
        big, big_self, big_other = (np.maximum(x, 0.0) for x in (new_max, self.lmax, other.lmax))
        mine_p = np.where(self.n > 0, np.exp(2.0 * (big_self - big)), 0.0)
        theirs_p = np.where(other.n > 0, np.exp(2.0 * (big_other - big)), 0.0)
        for f in ("n", "s1", "s2", "sk3"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.A = self.A * mine + other.A * theirs
        self.B = self.B * mine**2 + other.B * theirs**2
        self.C = self.C * mine + other.C * theirs
        self.P = self.P * mine_p + other.P * theirs_p
        self.lmax = new_max
        self.lmin = np.minimum(self.lmin, other.lmin)

    def take(self, index) -> "Moments":
        """The groups ``index`` (an int array) as a new accumulator."""
        return Moments(**{f.name: np.atleast_1d(getattr(self, f.name)[index]).copy() for f in fields(self)})

    def combined(self, labels: np.ndarray, size: int) -> "Moments":
        """Groups merged: old group i goes to new group ``labels[i]`` in [0, size)."""
        out = Moments.empty(size)
        for old, new in enumerate(np.asarray(labels, dtype=np.int64)):
            part = Moments.empty(size)
            one = self.take([old])
            for f in fields(self):
                getattr(part, f.name)[new] = getattr(one, f.name)[0]
            out.fold(part)
        return out

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

        FreshPER relations use the self-normalised ratios (a finite sample has
        mean r != 1), so they hold for any data; M2PO's hold pointwise.
        """
        s = {k: float(v[group]) for k, v in self.statistics().items()}
        log_mean_r = math.log(s["ratio_mean"]) if s["ratio_mean"] > 0 else -math.inf
        d2_sn = s["d2"] - 2.0 * log_mean_r  # log E[r~^2]
        kl = s["kl_new_behav"]
        sup_r = s["ratio_max"]
        R = max(sup_r, 1.0 / s["ratio_min"]) if s["ratio_min"] > 0 else math.inf
        with np.errstate(over="ignore", invalid="ignore"):
            return [
                make_relation("ess_bound_kl", s["ess_frac"], math.exp(-kl), "<=", 1e-9, 1e-12,
                              "FreshPER Eqs. (10)-(11): ESS/n = e^{-D_2} <= e^{-KL(new||behav)}"),
                make_relation("kl_le_d2", kl, d2_sn, "<=", 1e-9, 1e-12, "FreshPER Eq. (26)"),
                make_relation("m2po_sharp", s["chi2_pearson"], max(1.0, sup_r) ** 2 * s["m2"], "<=", 1e-9, 1e-12,
                              "M2PO Thm 5.1, sharp form: chi^2 <= max(1, sup r)^2 M2"),
                make_relation("m2po_thm51", s["chi2_pearson"], R**2 * s["m2"], "<=", 1e-9, 1e-12,
                              "M2PO Thm 5.1: chi^2 <= R^2 M2, R = max(sup r, 1/inf r)"),
            ]


@dataclass
class WeightSums:
    """Streaming ESS of effective weights w >= 0 given as log w (-inf = weight 0)."""

    n: float = 0.0
    flagged: float = 0.0  # tokens the correction touched (clipped, truncated, masked)
    removed: float = 0.0  # sum of (r - w): the IS mass the correction takes away
    top: float = -math.inf  # max log w seen
    A: float = 0.0  # sum e^{log w - top}
    B: float = 0.0  # sum e^{2 (log w - top)}

    def update(self, log_w: np.ndarray, flagged: np.ndarray, removed: np.ndarray) -> None:
        self.n += log_w.size
        self.flagged += float(np.count_nonzero(flagged))
        with np.errstate(over="ignore"):
            self.removed += float(np.sum(removed))
        if log_w.size == 0:
            return
        top = float(np.max(log_w))
        if top == -math.inf:
            return
        new = max(self.top, top)
        scale = math.exp(self.top - new) if self.top > -math.inf else 0.0
        w = np.exp(log_w - new)
        self.A = self.A * scale + float(w.sum())
        self.B = self.B * scale**2 + float((w * w).sum())
        self.top = new

    def result(self) -> dict[str, float]:
        n = self.n if self.n else math.nan
        ess = self.A**2 / (n * self.B) if self.B > 0 else 0.0
        return {"flagged_frac": self.flagged / n, "ess_frac": min(ess, 1.0), "bias_proxy": self.removed / n}


@dataclass
class LogRatioHistogram:
    """Counts of log r in fixed bins, for quantiles of r in one pass (error <= width / 2 in log r)."""

    lo: float = -16.0
    hi: float = 16.0
    width: float = 1e-3
    counts: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.counts is None:
            self.counts = np.zeros(int(round((self.hi - self.lo) / self.width)) + 2, dtype=np.int64)

    def update(self, lr: np.ndarray) -> None:
        # bin 0: below lo; last bin: at or above hi (the exact extremes are in Moments)
        idx = np.floor((lr - self.lo) / self.width).astype(np.int64) + 1
        np.clip(idx, 0, self.counts.size - 1, out=idx)
        self.counts += np.bincount(idx, minlength=self.counts.size)

    def quantiles(self, qs, lmin: float, lmax: float) -> list[float]:
        """log-ratio quantiles (linear inside a bin), clamped to the exact [min, max]."""
        total = self.counts.sum()
        if total == 0:
            return [math.nan for _ in qs]
        cdf = np.cumsum(self.counts)
        out = []
        for q in qs:
            target = q * total
            b = int(np.searchsorted(cdf, target, side="left"))
            before = cdf[b - 1] if b > 0 else 0
            inside = (target - before) / max(self.counts[b], 1)
            left = self.lo + (b - 1) * self.width
            value = left + inside * self.width
            out.append(float(min(max(value, lmin), lmax)))
        return out

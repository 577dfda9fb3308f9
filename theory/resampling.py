"""Resampling for every interval the package prints: bootstrap replicates, their intervals, and a rank correlation.

Paper: none of its own; the intervals of experience-replay's (docs/REFERENCES.md) measured inputs (rho, sigma^2(s),
B_noise, kappa, mu) and of the verdicts and the benchmark that check its Thm 3.5 all come from here.

Why scipy.stats: ``scipy.stats.bootstrap`` draws the resamples (a (draws, n) matrix of unit indices per sample,
from the caller's numpy Generator, ``rng`` or, before scipy 1.15, ``random_state``) and evaluates the statistic on
them, vectorized; ``scipy.stats.spearmanr`` ranks. What scipy does not offer stays here, written once:

* the moving-block bootstrap of a series (:func:`moving_block_indices`): scipy.stats has no block bootstrap;
* the interval of the replicates (:func:`percentile_interval`, :func:`quantile_interval`): numpy's quantiles,
  not scipy's. ``scipy.stats.bootstrap``'s own percentile interval (``scipy.stats.quantile``) differs from
  ``np.percentile`` in the last digit of many replicate sets, and scipy has no equivalent of numpy's
  ``lower`` / ``higher`` order statistics, which the noise scale needs (its replicates can be inf, where an
  interpolated quantile is nan); the printed intervals (tests/golden) stay bit-identical with numpy's.

The draws are scipy's own: ``rng.integers(0, n, (draws, n))`` for one sample, and with ``one_at_a_time`` one
replicate after another, each sample in turn (the order the per-replicate loops drew before this module), so the
replicates, and every printed interval, are what they were.

| function                 | what it returns                                                                  |
|--------------------------|----------------------------------------------------------------------------------|
| ``replicates``           | a statistic of resampled unit indices, (..., draws), via scipy.stats.bootstrap   |
| ``resample_indices``     | the (draws, n) unit indices themselves                                           |
| ``unit_weights``         | the same draws as multiplicities (draws, n), for statistics that are sums w @ x  |
| ``ratio_of_sums``        | scale * sum(num) / sum(den) over resampled units, (draws,)                       |
| ``moving_block_indices`` | (draws, n) step indices of a moving-block bootstrap of a series                  |
| ``percentile_interval``  | the central ``level`` interval, linear, non-finite replicates dropped            |
| ``quantile_interval``    | an interval at given tail probabilities, linear or by order statistics           |
| ``spearman``             | Spearman's rank correlation over the finite pairs, None where it is undefined    |
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np


def _rng_keyword() -> str:
    """The name scipy.stats.bootstrap gives the caller's Generator: ``rng`` from scipy 1.15, ``random_state``
    before (both use a numpy Generator as given, without reseeding it)."""
    from scipy.stats import bootstrap

    return "rng" if "rng" in inspect.signature(bootstrap).parameters else "random_state"


def replicates(statistic: Callable[..., np.ndarray], sizes: int | Sequence[int], draws: int,
               rng: np.random.Generator, *, one_at_a_time: bool = False) -> np.ndarray:
    """``statistic`` on ``draws`` bootstrap resamples of the units, (..., draws), drawn by scipy.stats.bootstrap.

    ``sizes``: the number of units (one sample) or of each sample's units (several samples, each resampled on its
    own). ``statistic(*index)`` gets one (batch, n_k) int array of unit indices per sample and returns
    (..., batch), the resample axis last. ``one_at_a_time``: batch = 1, so the samples' indices are drawn one
    replicate after another (for a statistic that is not vectorized over resamples, and for the draw order of a
    per-replicate loop over several samples). Every sample needs >= 2 units (scipy's rule).
    """
    from scipy.stats import bootstrap

    sizes = [sizes] if isinstance(sizes, (int, np.integer)) else list(sizes)
    data = tuple(np.arange(n) for n in sizes)
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        # scipy also computes its own interval of the replicates, unused here: nan where they hold inf or nan
        warnings.simplefilter("ignore")
        result = bootstrap(data, lambda *index, axis=-1: statistic(*index), n_resamples=draws,
                           batch=1 if one_at_a_time else None, vectorized=True, paired=False,
                           method="percentile", **{_rng_keyword(): rng})
    return np.asarray(result.bootstrap_distribution)


def resample_indices(units: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """(draws, units) unit indices drawn with replacement, as scipy.stats.bootstrap draws them; with one unit,
    zeros (its only resample; nothing is drawn)."""
    if units < 2:
        return np.zeros((draws, units), dtype=np.int64)
    # float through scipy (its unused interval wants floats), exact for any index below 2**53
    return replicates(lambda index: index.T.astype(float), units, draws, rng).T.astype(np.int64)


def unit_weights(units: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap multiplicities (draws, units): how often each unit appears in each resample. A statistic that is
    a weighted sum w @ x over units keeps its summation order (and its value, to the bit) in this form."""
    index = resample_indices(units, draws, rng)
    weights = np.zeros((draws, units))
    np.add.at(weights, (np.arange(draws)[:, None], index), 1.0)
    return weights


def ratio_of_sums(numerators: np.ndarray, denominators: np.ndarray, draws: int, rng: np.random.Generator, *,
                  scale: float = 1.0) -> np.ndarray:
    """(draws,) replicates of scale * sum_i num_i / sum_i den_i over resampled units i (the pairs of a ratio
    estimator, resampled together)."""
    num, den = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    return replicates(lambda index: scale * num[index].sum(axis=-1) / den[index].sum(axis=-1), num.size, draws, rng)


def moving_block_indices(steps: int, block: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """(draws, steps) indices of a moving-block bootstrap: ceil(steps / block) blocks of ``block`` consecutive
    steps, each starting anywhere in the series, laid end to end and cut to ``steps``. Blocks keep a series'
    short-range dependence, which resampling single steps would break; scipy.stats has no block bootstrap."""
    starts = np.arange(steps - block + 1)
    per = int(math.ceil(steps / block))
    picks = rng.choice(starts, size=(draws, per))
    return (picks[:, :, None] + np.arange(block)).reshape(draws, -1)[:, :steps]


def percentile_interval(values: np.ndarray, level: float, *, finite_only: bool = True) -> tuple[float, float]:
    """The central ``level`` percentile interval of bootstrap replicates, linear between order statistics.
    ``finite_only``: NaN and inf replicates dropped ((nan, nan) when fewer than 2 remain)."""
    values = np.asarray(values, dtype=float)
    if finite_only:
        values = values[np.isfinite(values)]
        if values.size < 2:
            return (math.nan, math.nan)
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return (float(lo), float(hi))


def central(level: float) -> tuple[float, float]:
    """The tail probabilities (alpha, 1 - alpha) of a central ``level`` interval, alpha = (1 - level) / 2."""
    alpha = (1 - level) / 2
    return (alpha, 1 - alpha)


QUANTILE_METHODS = {"linear": ("linear", "linear"), "order": ("lower", "higher"), "lower": ("lower", "lower")}
"""numpy's quantile method at each end: ``order`` takes the order statistics just outside the tails (defined when
replicates are inf: a rule without signal reads B_noise = inf); ``lower`` the one at or below at both ends."""


def quantile_interval(values: np.ndarray, tails: tuple[float, float], method: str = "linear") -> tuple[float, float]:
    """The quantiles of bootstrap replicates at the tail probabilities ``tails`` (``central(level)`` for a central
    interval), by ``method`` (``QUANTILE_METHODS``)."""
    values = np.asarray(values, dtype=float)
    low, high = QUANTILE_METHODS[method]
    return (float(np.quantile(values, tails[0], method=low)), float(np.quantile(values, tails[1], method=high)))


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman's rank correlation (average ranks for ties, scipy.stats.spearmanr) over the pairs where both are
    finite; None with fewer than 3 such pairs or when either side is constant there (undefined)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3 or np.ptp(a[ok]) == 0 or np.ptp(b[ok]) == 0:
        return None
    from scipy.stats import spearmanr

    # (b, a): scipy returns corrcoef's [1, 0] entry, so this divides by std(a), then std(b), as the benchmark's own
    # ranks did (in the order (a, b) the last digit differs in a third of random cases; this way it never did)
    return float(spearmanr(b[ok], a[ok]).statistic)

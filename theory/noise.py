"""Estimators of Assumption 3.3's noise inputs from per-sample gradients: rho, sigma^2(s), retained signal.

Paper: experience-replay (docs/REFERENCES.md), Assumption 3.3 and the proof of Thm 3.4:

    eps_{t,i} = G(theta_t, z_i) - grad F(theta_t),   E||eps_{t,i}||^2 <= sigma^2(t - t_i),
    corr(eps_{t,i}, eps_{t,j}) <= rho |t_i - t_j| / N.

Pure numpy, shared by the simulator (``simulate/calibrate.py``, exact grad F) and the language-model
validator (``validate/calibrate.py``, grad F from a large held-out reference batch).

| code name              | paper symbol        | meaning                                                         |
|------------------------|---------------------|-----------------------------------------------------------------|
| ``noise``              | eps_{t,i}           | G(theta_t, z_i) - grad F(theta_t), one row per buffer item      |
| ``step``               | t_i                 | creation step (policy version) of item i                        |
| ``gap``                | abs(t_i - t_j)      | creation-step gap of a pair, in steps                           |
| ``capacity``           | N                   | buffer size in responses (App. C.2: gap in steps, N in responses) |
| ``rho``                | rho                 | slope of corr(gap) in gap / N, pairs of DIFFERENT groups only   |
| ``within_group``       | (t_i = t_j term)    | correlation of two responses of one group (paper drops it)      |
| ``plain``              | sigma^2(s)          | E||G_s - grad F||^2 (Assumption 3.3 as printed)                 |
| ``retained``           | r(s)                | <E G_s, grad F> / ||grad F||^2: signal share a stale sample keeps |
| ``signal_normalised``  | sigma^2(s) / r(s)^2 | E||G_s / r(s) - grad F||^2: noise of the rescaled sample        |
| ``reference_variance`` | tr Cov(G_0) / n_ref | E||g_ref - grad F||^2 of a Monte Carlo reference of n_ref samples |

Axes. Every estimator works on UNITS, the independent replicates a bootstrap resamples: on the
simulator one unit is one training seed (its checkpoints are summed into it, since checkpoints of one
run are not independent); on the language model one unit is one checkpoint. Arrays are (U, ...) with
the unit axis first; the sample axis (responses of one unit) comes next.  The fitted rho is reported as measured,
with a bootstrap interval (``RhoFit.in_range``); why ratios of sums: ``correlation_by_gap``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checks import invalid
from .resampling import percentile_interval, unit_weights

DEFAULT_LEVEL = 0.9
DEFAULT_DRAWS = 2000


# --------------------------------------------------------------------------- pair moments


@dataclass(frozen=True)
class PairMoments:
    """Per-unit sums over ORDERED pairs of distinct items, by creation-step gap 0..max_gap.

    ``between_*`` (U, max_gap + 1): pairs from different groups; ``within_*`` (U,): pairs of
    distinct responses of the same group. ``inner`` sums <eps_i, eps_j>, ``sq`` sums
    (||eps_i||^2 + ||eps_j||^2) / 2, ``count`` counts pairs; all already corrected for the
    reference's Monte Carlo error.
    """

    between_inner: np.ndarray
    between_sq: np.ndarray
    between_count: np.ndarray
    within_inner: np.ndarray
    within_sq: np.ndarray
    within_count: np.ndarray

    @property
    def max_gap(self) -> int:
        return self.between_inner.shape[1] - 1

    def __add__(self, other: "PairMoments") -> "PairMoments":
        """Sum of two measurements of the same units (e.g. two checkpoints of each seed)."""
        return PairMoments(*(a + b for a, b in zip(self._arrays(), other._arrays())))

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return (self.between_inner, self.between_sq, self.between_count, self.within_inner, self.within_sq,
                self.within_count)


def _offset_sums(matrix: np.ndarray, max_gap: int) -> np.ndarray:
    """sum over ordered (a, b) with |a - b| = h of matrix[a, b], h = 0..max_gap: (max_gap + 1,)."""
    K = matrix.shape[0]
    out = np.zeros(max_gap + 1)
    for h in range(min(max_gap, K - 1) + 1):
        out[h] = np.trace(matrix, h) + (np.trace(matrix, -h) if h else 0.0)
    return out


def group_sums(eps: np.ndarray, sq: np.ndarray, step: np.ndarray, group: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per group (ids compacted in sorted order): U_g = sum of eps (G, d), q_g = sum of ||eps||^2 (G,), n_g (G,),
    and the group's creation step (G,); every item of a group must share its step."""
    _, gi = np.unique(group, return_inverse=True)  # compact group ids
    n_groups = int(gi.max()) + 1 if gi.size else 0
    g_sum = np.zeros((n_groups, eps.shape[1]))
    np.add.at(g_sum, gi, eps)  # (G, d) U_g
    g_sq = np.bincount(gi, weights=sq, minlength=n_groups)  # q_g
    g_n = np.bincount(gi, minlength=n_groups).astype(float)  # n_g
    g_step = np.zeros(n_groups, np.int64)
    g_step[gi] = step
    if np.any(np.bincount(gi, weights=step, minlength=n_groups) != g_n * g_step):
        raise ValueError("every item of a group must have the same creation step")
    return g_sum, g_sq, g_n, g_step


def pair_moments(noise: np.ndarray, step: np.ndarray, group: np.ndarray, max_gap: int,
                 valid: np.ndarray | None = None, reference_variance: np.ndarray | float = 0.0) -> PairMoments:
    """Pair sums of the noise vectors ``noise`` (U, n, d) by creation-step gap, per unit.

    ``step`` and ``group`` (U, n) are each item's creation step and group id; ``valid`` (U, n) masks
    empty slots. Cost O(n d + K^2 d) per unit (K distinct steps): items are summed per group and per
    step first, never over n^2 pairs. Pairs with a gap above ``max_gap`` are left out.
    """
    noise = np.asarray(noise, dtype=float)
    U, n, d = noise.shape
    step = np.broadcast_to(np.asarray(step), (U, n))
    group = np.broadcast_to(np.asarray(group), (U, n))
    valid = np.ones((U, n), bool) if valid is None else np.broadcast_to(np.asarray(valid, bool), (U, n))
    ref_var = np.broadcast_to(np.asarray(reference_variance, dtype=float), (U,))
    H = int(max_gap)
    out = [np.zeros((U, H + 1)), np.zeros((U, H + 1)), np.zeros((U, H + 1)), np.zeros(U), np.zeros(U), np.zeros(U)]
    for u in range(U):
        keep = valid[u]
        if not keep.any():
            continue
        eps, t, g = noise[u, keep], step[u, keep].astype(np.int64), group[u, keep]
        sq = np.einsum("nd,nd->n", eps, eps)  # (m,) ||eps_i||^2
        g_sum, g_sq, g_n, g_step = group_sums(eps, sq, t, g)
        k = g_step - g_step.min()
        K = int(k.max()) + 1
        s_sum = np.zeros((K, d))
        np.add.at(s_sum, k, g_sum)  # (K, d) E_a
        s_sq = np.bincount(k, weights=g_sq, minlength=K)  # Q_a
        s_n = np.bincount(k, weights=g_n, minlength=K)  # n_a
        g_norm = np.einsum("gd,gd->g", g_sum, g_sum)  # ||U_g||^2
        inner = _offset_sums(s_sum @ s_sum.T, H)
        half_sq = _offset_sums(np.outer(s_sq, s_n), H)  # ordered pairs: sum Q_a n_b = sum (q_i + q_j) / 2
        count = _offset_sums(np.outer(s_n, s_n), H)
        inner[0] -= g_norm.sum()  # gap 0: remove same-group pairs and i = j
        half_sq[0] -= (g_sq * g_n).sum()
        count[0] -= (g_n * g_n).sum()
        w_inner = g_norm.sum() - sq.sum()
        w_sq = (g_sq * (g_n - 1)).sum()
        w_count = (g_n * (g_n - 1)).sum()
        v = ref_var[u]  # each pair's inner product and each squared norm carry E||delta||^2 = v
        out[0][u], out[1][u], out[2][u] = inner - v * count, half_sq - v * count, count
        out[3][u], out[4][u], out[5][u] = w_inner - v * w_count, w_sq - v * w_count, w_count
    return PairMoments(*out)


# --------------------------------------------------------------------------- rho fit and bootstrap


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def correlation_by_gap(m: PairMoments, weights: np.ndarray | None = None) -> np.ndarray:
    """Norm-weighted correlation of pairs of different groups at each gap, (max_gap + 1,) (NaN: no pairs).

    Why ratios of sums ("norm-weighted") and not mean cosines. The correlation of gap h is

        corr(h) = sum_pairs <eps_i, eps_j> / sum_pairs (||eps_i||^2 + ||eps_j||^2) / 2,

    the sample version of E<eps_i, eps_j> / sqrt(E||eps_i||^2 E||eps_j||^2), which is the quantity the
    proof of Thm 3.4 bounds when it expands E||(1/B) sum eps_i||^2. It equals an average of cosines
    weighted by ||eps_i|| ||eps_j|| (up to the AM-GM gap between the two norms). A mean of plain cosines
    is wrong here: about a fifth of GRPO buffer items have an exactly zero gradient (A = 0 or the clip
    is active), so their noise vectors are all the same vector -grad F and every pair of them has cosine
    1 whatever the true correlation. In the ratio of sums those items enter with their (small) inner
    products, which average to the true covariance (zero for independent fresh samples, since
    E eps = 0), instead of each pair counting as a perfect correlation.
    """
    w = np.ones(m.between_inner.shape[0]) if weights is None else weights
    return _ratio(w @ m.between_inner, w @ m.between_sq)


def rho_slope(inner: np.ndarray, sq: np.ndarray, capacity: float) -> np.ndarray:
    """Weighted least squares of corr(h) on x = h / N through the origin, gaps h >= 1; (...,).

    With corr(h) = I_h / Q_h and weights Q_h (the pooled norm-weight of gap h, proportional to its
    pairs times their variance), the slope is sum_h x_h I_h / sum_h x_h^2 Q_h. ``inner`` and ``sq``
    are (..., max_gap + 1) pooled sums.
    """
    x = np.arange(inner.shape[-1], dtype=float) / capacity
    x[0] = 0.0  # gap 0 (different groups of one step) carries no information on a slope through 0
    return _ratio((inner * x).sum(axis=-1), (sq * x * x).sum(axis=-1))


@dataclass(frozen=True)
class RhoFit:
    """rho of Assumption 3.3 with its bootstrap interval, never clamped, and the within-group correlation."""

    value: float
    ci: tuple[float, float]
    level: float
    capacity: float
    max_gap: int
    correlation: tuple[float, ...]  # by gap 0..max_gap, different groups
    correlation_ci: tuple[tuple[float, float], ...]
    pairs: tuple[int, ...]  # ordered pairs per gap, summed over units
    within_group: float
    within_group_ci: tuple[float, float]
    units: int

    @property
    def in_range(self) -> bool:
        """Whether the fit lies in [0, 1], the range Assumption 3.3 allows (a NaN fit is not)."""
        return bool(0.0 <= self.value <= 1.0)

    def to_dict(self) -> dict:
        """JSON-ready: NaN as None."""
        def clean(x):
            return None if isinstance(x, float) and not math.isfinite(x) else x

        return {
            "value": clean(self.value), "ci": [clean(c) for c in self.ci], "level": self.level,
            "in_range": self.in_range, "capacity": self.capacity, "max_gap": self.max_gap, "units": self.units,
            "model": "corr(h) = rho h / N, pairs of different groups, least squares through 0 over gaps >= 1",
            "correlation_by_gap": {str(h): clean(float(c)) for h, c in enumerate(self.correlation)},
            "correlation_ci_by_gap": {str(h): [clean(a), clean(b)] for h, (a, b) in enumerate(self.correlation_ci)},
            "pairs_by_gap": {str(h): p for h, p in enumerate(self.pairs)},
            "within_group": {"value": clean(self.within_group), "ci": [clean(c) for c in self.within_group_ci],
                             "note": "t_i = t_j pairs of one group; not part of rho (the paper drops this term)"},
        }


def fit_rho(m: PairMoments, capacity: float, level: float = DEFAULT_LEVEL, draws: int = DEFAULT_DRAWS,
            seed: int = 0) -> RhoFit:
    """rho as the slope of corr(h) in h / N (``rho_slope``) with a unit-bootstrap ``level`` interval.

    The units (axis 0 of ``m``) are resampled with replacement; with one unit there is no interval
    (NaN). Nothing is clamped: a slope outside [0, 1] is returned as is (``RhoFit.in_range``).
    """
    if not capacity > 0:
        raise invalid("capacity", "> 0", capacity, fmt="")
    U = m.between_inner.shape[0]
    value = float(rho_slope(m.between_inner.sum(0), m.between_sq.sum(0), capacity))
    corr = correlation_by_gap(m)
    within = float(_ratio(m.within_inner.sum(), m.within_sq.sum()))
    nan2 = (math.nan, math.nan)
    if U >= 2:
        w = unit_weights(U, draws, np.random.default_rng(seed))
        boot_inner, boot_sq = w @ m.between_inner, w @ m.between_sq  # (draws, H + 1)
        ci = percentile_interval(rho_slope(boot_inner, boot_sq, capacity), level)
        corr_boot = _ratio(boot_inner, boot_sq)
        corr_ci = tuple(percentile_interval(corr_boot[:, h], level) for h in range(m.max_gap + 1))
        within_ci = percentile_interval(_ratio(w @ m.within_inner, w @ m.within_sq), level)
    else:
        ci, corr_ci, within_ci = nan2, tuple(nan2 for _ in range(m.max_gap + 1)), nan2
    return RhoFit(value, ci, level, float(capacity), m.max_gap, tuple(float(c) for c in corr), corr_ci,
                  tuple(int(c) for c in m.between_count.sum(0)), within, within_ci, U)


# --------------------------------------------------------------------------- sigma^2(s) in both forms


@dataclass(frozen=True)
class StalenessMoments:
    """Per-unit sums for sigma^2(s) at K staleness values.

    ``sq_norm`` (U, K): sum over measurements of mean_i ||G_i||^2; ``inner`` (U, K): of
    mean_i <G_i, grad F>; ``true_sq`` (U,): of ||grad F||^2 (reference-corrected);
    ``measurements`` (U,): how many checkpoints were summed into each unit.
    """

    sq_norm: np.ndarray
    inner: np.ndarray
    true_sq: np.ndarray
    measurements: np.ndarray

    def __add__(self, other: "StalenessMoments") -> "StalenessMoments":
        return StalenessMoments(self.sq_norm + other.sq_norm, self.inner + other.inner,
                                self.true_sq + other.true_sq, self.measurements + other.measurements)


def staleness_moments(grads: np.ndarray, true_grad: np.ndarray, reference_variance: np.ndarray | float = 0.0,
                      sample_mean: np.ndarray | None = None) -> StalenessMoments:
    """Moments of per-sample gradients ``grads`` (U, K, n, d) at K staleness values against ``true_grad`` (U, d).

    ``true_grad`` is exact (simulator) or a held-out reference mean whose E||delta||^2 is
    ``reference_variance`` (U,): <G, g_ref> is then still unbiased for <E G, grad F> (independent
    samples), and ||g_ref||^2 - reference_variance for ||grad F||^2. ``sample_mean`` (U, K, d), when
    known exactly (simulator), replaces the sample average of G in <E G_s, grad F>.
    """
    grads = np.asarray(grads, dtype=float)
    g = np.asarray(true_grad, dtype=float)
    ref_var = np.broadcast_to(np.asarray(reference_variance, dtype=float), (grads.shape[0],))
    sq_norm = np.einsum("uknd,uknd->ukn", grads, grads).mean(axis=-1)  # (U, K)
    if sample_mean is None:
        inner = np.einsum("uknd,ud->ukn", grads, g).mean(axis=-1)  # (U, K)
    else:
        inner = np.einsum("ukd,ud->uk", np.asarray(sample_mean, dtype=float), g)
    true_sq = np.einsum("ud,ud->u", g, g) - ref_var  # (U,)
    return StalenessMoments(sq_norm, inner, true_sq, np.ones(grads.shape[0]))


@dataclass(frozen=True)
class NoiseProfile:
    """sigma^2(s) in both forms, the retained signal r(s), each with a unit-bootstrap interval."""

    staleness: tuple[float, ...]
    plain: tuple[float, ...]
    plain_ci: tuple[tuple[float, float], ...]
    retained: tuple[float, ...]
    retained_ci: tuple[tuple[float, float], ...]
    signal_normalised: tuple[float, ...]  # inf where r(s) <= 0: a sample that keeps no signal
    signal_normalised_ci: tuple[tuple[float, float], ...]
    true_grad_sq: float  # mean ||grad F||^2 over the measurements
    level: float
    units: int


def _profile_values(sq_norm, inner, true_sq, meas):
    """(plain, retained, normalised) from pooled sums; trailing axis K."""
    n = meas[..., None]
    m2, m1, gg = sq_norm / n, inner / n, (true_sq / meas)[..., None]
    plain = m2 - 2 * m1 + gg  # E||G - g||^2
    retained = _ratio(m1, np.broadcast_to(gg, m1.shape))  # <E G, g> / ||g||^2
    with np.errstate(invalid="ignore", divide="ignore"):
        # E||G/r - g||^2 = E||G||^2 / r^2 - 2 <E G, g> / r + ||g||^2 = E||G||^2 / r^2 - ||g||^2 (r = m1 / gg)
        normalised = np.where(retained > 0, m2 / np.where(retained > 0, retained, 1.0) ** 2 - gg, np.inf)
    return plain, retained, normalised


def noise_profile(m: StalenessMoments, staleness, level: float = DEFAULT_LEVEL, draws: int = DEFAULT_DRAWS,
                  seed: int = 0) -> NoiseProfile:
    """Pool the units' moments into sigma^2(s) (plain and signal-normalised) and r(s), with intervals.

    plain(s) = E||G_s - grad F||^2; r(s) = <E G_s, grad F> / ||grad F||^2 (ratio of the pooled
    sums); signal_normalised(s) = E||G_s / r(s) - grad F||^2 = plain noise of the rescaled sample,
    which is unbiased along grad F; any bias orthogonal to grad F stays in it as error. Both forms
    agree at s = 0 when the reference is the fresh-sample mean (r(0) = 1).
    """
    U = m.sq_norm.shape[0]
    plain, retained, normalised = _profile_values(m.sq_norm.sum(0), m.inner.sum(0), m.true_sq.sum(0),
                                                  m.measurements.sum(0))
    nan2 = (math.nan, math.nan)
    K = len(plain)
    if U >= 2:
        w = unit_weights(U, draws, np.random.default_rng(seed))
        bp, br, bn = _profile_values(w @ m.sq_norm, w @ m.inner, w @ m.true_sq, w @ m.measurements)
        cis = [tuple(percentile_interval(b[:, k], level) for k in range(K)) for b in (bp, br, bn)]
    else:
        cis = [tuple(nan2 for _ in range(K))] * 3
    return NoiseProfile(tuple(float(s) for s in staleness), tuple(map(float, plain)), cis[0],
                        tuple(map(float, retained)), cis[1], tuple(map(float, normalised)), cis[2],
                        float(m.true_sq.sum() / m.measurements.sum()), level, U)


def reference_variance(reference_grads: np.ndarray) -> np.ndarray:
    """E||g_ref - grad F||^2 of the mean of n reference gradients (..., n, d): sum of sample variances / n.

    Monte Carlo reference (language model). With g_ref = grad F + delta, delta the mean of n_ref
    held-out fresh per-sample errors (independent of every measured sample, mean 0), every measured
    <eps_i, eps_j> gains E||delta||^2 in expectation, and so does every ||eps_i||^2; the cross terms
    vanish. ``reference_variance`` = (sum of the per-coordinate sample variances of the reference
    gradients) / n_ref estimates E||delta||^2 and is subtracted from every pair's inner product, every
    squared norm and ||g_ref||^2. Uncorrected, it is a positive correlation of order 1/n_ref at every gap.
    """
    r = np.asarray(reference_grads, dtype=float)
    n = r.shape[-2]
    if n < 2:
        raise ValueError(f"a reference batch needs >= 2 samples to estimate its own error, got {n}")
    return r.var(axis=-2, ddof=1).sum(axis=-1) / n


# --------------------------------------------------------------------------- rho with a group bootstrap (one buffer)


def fit_rho_group_bootstrap(noise: np.ndarray, step: np.ndarray, group: np.ndarray, max_gap: int, capacity: float,
                            reference_variance: float = 0.0, level: float = DEFAULT_LEVEL,
                            draws: int = DEFAULT_DRAWS, seed: int = 0) -> RhoFit:
    """rho of ONE buffer's noise ``noise`` (n, d), with a bootstrap over its GROUPS: a RhoFit whose units are groups.

    ``fit_rho`` resamples whole units (seeds, checkpoints); a language-model probe has one buffer,
    so there the responses' groups (one prompt each, sampled independently given the policy that
    made them) are the resampled units. Items are first summed per group g: U_g = sum eps_i,
    q_g = sum ||eps_i||^2, n_g, t_g; then, for the ordered pairs of two DIFFERENT groups g != g',

        M[g, g'] = <U_g, U_g'>,   Q[g, g'] = (n_g' q_g + n_g q_g') / 2,   C[g, g'] = n_g n_g',

    are the sums of <eps_i, eps_j>, (||eps_i||^2 + ||eps_j||^2) / 2 and the pair count, and
    gap[g, g'] = |t_g - t_g'|. A bootstrap draw gives group multiplicities w (G,); its between-group
    sums at gap h are w^T (X * [gap == h] * (1 - I)) w for X = M, Q, C (a group never pairs with its
    own copy: two copies of one group are the same responses, not two groups), minus
    ``reference_variance`` * count for M and Q, as in ``pair_moments``. The within-group sums are
    sum_g w_g (||U_g||^2 - q_g), w_g q_g (n_g - 1), w_g n_g (n_g - 1). With w = 1 every sum is
    ``pair_moments``'s, so the point estimate equals ``fit_rho(pair_moments(...))`` on the same data;
    slope by ``rho_slope``, interval by ``percentile_interval``. ``RhoFit.units`` is the number of groups.
    Cost O(n d + G^2 d) once, then O(draws G^2 (max_gap + 1)).
    """
    if not capacity > 0:
        raise invalid("capacity", "> 0", capacity, fmt="")
    eps = np.asarray(noise, dtype=float)
    t = np.asarray(step).astype(np.int64).reshape(-1)
    g = np.asarray(group).reshape(-1)
    if eps.ndim != 2 or eps.shape[0] != t.size or t.size != g.size:
        raise ValueError(f"noise must be (n, d) with step and group of length n, got {eps.shape}, {t.shape}, "
                         f"{g.shape}")
    H, v = int(max_gap), float(reference_variance)
    g_sum, g_sq, g_n, g_step = group_sums(eps, np.einsum("nd,nd->n", eps, eps), t, g)
    n_groups = g_n.size
    inner = g_sum @ g_sum.T  # (G, G) M
    half_sq = (np.outer(g_sq, g_n) + np.outer(g_n, g_sq)) / 2  # Q[g, g'] = (q_g n_g' + n_g q_g') / 2
    count = np.outer(g_n, g_n)  # C
    gap = np.abs(g_step[:, None] - g_step[None, :])
    off_diagonal = ~np.eye(n_groups, dtype=bool)
    masks = np.stack([(gap == h) & off_diagonal for h in range(H + 1)]).astype(float)  # (H + 1, G, G)
    stacked = np.stack([inner, half_sq, count])[:, None] * masks[None]  # (3, H + 1, G, G)
    within = np.stack([np.diag(inner) - g_sq, g_sq * (g_n - 1), g_n * (g_n - 1)])  # (3, G)

    def sums(w: np.ndarray) -> tuple[np.ndarray, ...]:
        """(draws, G) multiplicities -> between (3, draws, H + 1) and within (3, draws), reference-corrected."""
        left = np.tensordot(w, stacked, axes=([1], [2]))  # (draws, 3, H + 1, G): w^T X_h, by BLAS
        between = np.einsum("dxhk,dk->xdh", left, w)
        inside = np.einsum("dg,xg->xd", w, within)
        between[:2] -= v * between[2]  # each pair's inner product and half-squared norms carry E||delta||^2
        inside[:2] -= v * inside[2]
        return between, inside

    (b_inner, b_sq, b_count), (w_inner, w_sq, _) = sums(np.ones((1, n_groups)))
    value = float(rho_slope(b_inner[0], b_sq[0], capacity))
    corr = _ratio(b_inner[0], b_sq[0])
    within_value = float(_ratio(w_inner[0], w_sq[0]))
    nan2 = (math.nan, math.nan)
    if n_groups >= 2:
        w = unit_weights(n_groups, draws, np.random.default_rng(seed))
        (bi, bs, _), (wi, ws, _) = sums(w)
        ci = percentile_interval(rho_slope(bi, bs, capacity), level)
        corr_boot = _ratio(bi, bs)
        corr_ci = tuple(percentile_interval(corr_boot[:, h], level) for h in range(H + 1))
        within_ci = percentile_interval(_ratio(wi, ws), level)
    else:
        ci, corr_ci, within_ci = nan2, tuple(nan2 for _ in range(H + 1)), nan2
    return RhoFit(value, ci, level, float(capacity), H, tuple(float(c) for c in corr), corr_ci,
                  tuple(int(round(c)) for c in b_count[0]), within_value, within_ci, n_groups)

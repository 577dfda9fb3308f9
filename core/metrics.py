"""Per-step off-policy metrics of a training batch: the one function the simulator, the validator and the trainer log.

Papers (docs/REFERENCES.md): FreshPER (the Kish ESS, Eqs. (5), (24), and its fall with the age of a sample, Sec. 3),
M2PO (k1, M_2, Eqs. (3)-(4)), experience-replay (staleness, Sec. 2).  Every estimator is the statistics kernel's
(``theory/moments.py``); this module only decides which samples go in:

| key                 | symbol                 | over                                                          |
|---------------------|------------------------|---------------------------------------------------------------|
| ``ess_frac``        | ESS / n (Kish)         | the SEQUENCE log-ratios sum_t log r_t of the batch's responses |
| ``kl_k1`` .. ``chi2`` | k1, k2, k3, M_2, D_2, chi^2 | the real TOKENS' log r (verl / TRL style)                |
| ``log_ratio_abs_max`` | max abs(log r)       | the real tokens                                               |
| ``staleness_mean/max`` | t - t_i             | the batch's responses                                         |
| ``frac_reward_zero_std`` | z                 | the step's GENERATED groups: share whose rewards are all equal |

:func:`ess_by_age` is the Kish ESS per (seed, age bucket), buckets from :func:`age_buckets` (the one bucketing of
sample ages, kept here beside its users; ``core.pipeline`` re-exports it).
``frac_reward_zero_std`` is TRL's metric of the same name (zero-advantage groups, which buy no gradient; z of
docs/THEORY.md "Reuse families" [E7]-[E9]); :func:`zero_std_groups` is its kernel, which the selective buffer
(``core.buffers.SelectiveFifoBuffer``) admits by.
Shapes: seed axis first, ``token_lr`` = logp_new - logp_behav and ``mask`` (S, B, L), ``staleness`` (S, B);
results (S,).
Callers keep their logged names by a mapping (the engine and the validator log these keys as they are, the TRL
trainer under ``replay/``).
"""

from __future__ import annotations

import numpy as np

from ..theory.divergences import ess_kish_fraction, sample_statistics
from ..theory.moments import ess_frac_from_sums, weight_sums

__all__ = ["TOKEN_STATS", "AGE_BUCKETS", "age_buckets", "age_bucket", "step_metrics", "step_metrics_and_ratios",
           "step_metrics_by_age", "sequence_log_ratio", "ess_by_age", "zero_std_groups",
           "frac_reward_zero_std"]


def age_buckets(max_age: int) -> list[tuple[int, int, str]]:
    """Age buckets [lo, hi] covering 0 .. max_age: 0, 1, 2-3, 4-7, ... (powers of two), with their metric names.

    The one bucketing of sample ages (staleness t - t_i): the simulator's ESS by age, the validator's and the TRL
    trainer's ``replay/.../age_*`` metrics.
    """
    buckets = [(0, 0, "age_0")]
    lo = 1
    while lo <= max_age:
        hi = 2 * lo - 1
        buckets.append((lo, hi, f"age_{lo}" if lo == hi else f"age_{lo}-{hi}"))
        lo *= 2
    return buckets


AGE_BUCKETS = tuple(lo for lo, _, _ in age_buckets(1024))  # left edges 0, 1, 2, 4, ..., 1024 (log2-spaced)

# bucket of every staleness 0 .. 1024 (the last left edge): one table look-up instead of a binary search
AGE_TABLE = np.searchsorted(np.asarray(AGE_BUCKETS), np.arange(AGE_BUCKETS[-1] + 1), side="right") - 1


def age_bucket(staleness: np.ndarray) -> np.ndarray:
    """Index of the AGE_BUCKETS bin of each staleness value (>= 0)."""
    return np.take(AGE_TABLE, staleness, mode="clip")  # beyond 1024: the last bucket


#: the token-level estimators of :func:`step_metrics` (the losses report the same ones: they may be passed in)
TOKEN_STATS = ("kl_k1", "kl_k2", "kl_k3", "m2", "d2", "chi2")


def sequence_log_ratio(token_lr: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(token log-ratios (S, B, L) with 0 on padding, sequence log-ratios (S, B): their sums over tokens)."""
    token_lr = np.where(mask, token_lr, 0.0)  # (S, B, L): padding may hold anything
    return token_lr, token_lr.sum(axis=-1)  # the sequence ratio is the product of token ratios, summed in log space


def zero_std_groups(reward: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each response's group has all rewards equal (S, n) bool, share of such groups per seed (S,)).

    ``reward`` and ``group`` (S, n): rewards and group ids of responses as generated, a group's responses side by
    side (a group is a run of one id; ``core.pipeline.generate`` and ExGRPO's batch lay them out so). Zero std is
    max == min of the group's rewards: its group-relative advantage is then zero (TRL tests isclose(std, 0), atol
    1e-8: the same groups whenever distinct rewards differ by more than that). No responses: a share of NaN.
    """
    start, equal, share = _zero_std_runs(reward, group)
    if start is None:
        return np.zeros((share.size, 0), bool), share
    per_response = equal[np.cumsum(start.ravel()) - 1].reshape(start.shape)  # each response's group's flag
    return per_response, share


def _zero_std_runs(reward: np.ndarray, group: np.ndarray
                   ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """(start (S, n): where a group's run begins, equal (runs,): its rewards are all equal, share (S,)) of
    :func:`zero_std_groups`; start None when there are no responses."""
    reward = np.asarray(reward, dtype=float)
    group = np.asarray(group)
    S, n = reward.shape
    if n == 0:
        return None, np.zeros(0, bool), np.full(S, np.nan)
    start = np.ones((S, n), bool)
    start[:, 1:] = group[:, 1:] != group[:, :-1]  # a run starts at each row's first response and each new id
    first = np.flatnonzero(start)  # (runs,) flat index of each group's first response, row-major
    flat = reward.ravel()
    equal = _runs_equal(flat, first)  # (runs,) all rewards equal
    row = first // n  # (runs,) the seed of each group
    share = np.bincount(row, weights=equal, minlength=S) / np.bincount(row, minlength=S)
    return start, equal, share


def _runs_equal(flat: np.ndarray, first: np.ndarray) -> np.ndarray:
    """(runs,) whether each run ``flat[first[i]:first[i + 1]]`` holds one value: its max == its min. Runs of one
    length k (groups of G, as generated) are the columns of a transposed (k, runs) copy, each reduction k - 1
    vector operations (max and min are exact in any order: the same flags as ``reduceat``'s one call per run)."""
    k = flat.size // first.size
    if first.size * k == flat.size and np.array_equal(first, np.arange(0, flat.size, k)):
        cols = np.ascontiguousarray(flat.reshape(first.size, k).T)  # (k, runs)
        return np.maximum.reduce(cols, axis=0) == np.minimum.reduce(cols, axis=0)
    return np.maximum.reduceat(flat, first) == np.minimum.reduceat(flat, first)


def frac_reward_zero_std(reward: np.ndarray, group: np.ndarray) -> np.ndarray:
    """z per seed (S,): the share of the step's generated groups whose rewards are all equal (``zero_std_groups``)."""
    return _zero_std_runs(reward, group)[2]


def step_metrics(token_lr: np.ndarray, mask: np.ndarray, staleness: np.ndarray,
                 token_stats: dict[str, np.ndarray] | None = None, reward: np.ndarray | None = None,
                 group: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The off-policy metrics of one training batch, per seed (S,) (keys: the module docstring's table).

    ``token_lr`` (S, B, L) = logp_new - logp_behav of the trained tokens; ``token_stats``: the token-level
    estimators (``TOKEN_STATS``, each (S,)) when the loss already computed them on this batch (every loss with a
    behaviour policy does: the same kernel on the same tokens), else they are computed here. ``reward`` and
    ``group`` (S, n): the step's GENERATED responses (not the training batch, whose draws split groups); given,
    ``frac_reward_zero_std`` joins the keys.
    """
    return step_metrics_and_ratios(token_lr, mask, staleness, token_stats, reward, group)[0]


def step_metrics_and_ratios(token_lr: np.ndarray, mask: np.ndarray, staleness: np.ndarray,
                            token_stats: dict[str, np.ndarray] | None = None, reward: np.ndarray | None = None,
                            group: np.ndarray | None = None, *, seq_ess: np.ndarray | None = None,
                            abs_max: bool = True) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """:func:`step_metrics` and the sequence log-ratios (S, B) it summed, for a caller that also needs them
    (:func:`ess_by_age`): one pass over the tokens.

    ``seq_ess`` (S,): the Kish ESS fraction of the sequence ratios when the caller already has it from the same
    kernel on the same numbers (the engine: a loss's token-level ESS of one-token responses, every token real,
    ``core.losses.TOKEN_KISH_METRICS``); used where every sequence log-ratio is finite, as the kernel's sums are.
    ``abs_max=False`` leaves ``log_ratio_abs_max`` out, for a caller that does not log it (the engine).
    """
    S = mask.shape[0]
    token_lr, seq_lr = sequence_log_ratio(token_lr, mask)
    if token_stats is not None and all(k in token_stats for k in TOKEN_STATS):
        stats = token_stats
    else:
        stats = sample_statistics(token_lr.reshape(S, -1), mask=mask.reshape(S, -1))
    staleness = np.asarray(staleness).reshape(S, -1)
    if np.isfinite(seq_lr).all():  # the engine's every step: the kernel's sums without the checks' passes
        # (S,) the same numbers as ess_kish_fraction(seq_lr); finite rows give A, B >= 1 (the row maximum's term is
        # e^0), so no 0/0 can warn and the estimator runs without its errstate guard (a tenth of the step's metrics)
        ess = ess_frac_from_sums.__wrapped__(*weight_sums(seq_lr)) if seq_ess is None else seq_ess
    else:
        ess = ess_kish_fraction(seq_lr)
    out = {
        "ess_frac": np.asarray(ess),  # (S,) Kish of the sequence ratios, FreshPER Eq. (5)
        **{k: np.asarray(stats[k]).reshape(S) for k in TOKEN_STATS},
    }
    if abs_max:
        out["log_ratio_abs_max"] = np.abs(token_lr).reshape(S, -1).max(axis=1)  # padding is 0
    out["staleness_mean"] = np.sum(staleness, axis=1) / staleness.shape[1]
    out["staleness_max"] = staleness.max(axis=1)
    if reward is not None and group is not None:
        out["frac_reward_zero_std"] = frac_reward_zero_std(reward, group)
    return out, seq_lr


def step_metrics_by_age(token_lr: np.ndarray, mask: np.ndarray, staleness: np.ndarray,
                        token_stats: dict[str, np.ndarray] | None = None, reward: np.ndarray | None = None,
                        group: np.ndarray | None = None, *, seq_ess: np.ndarray | None = None,
                        abs_max: bool = True) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """:func:`step_metrics` and the Kish ESS of each (seed, ``AGE_BUCKETS`` bucket) of the batch: (metrics,
    fractions (S, K), sample counts (S, K)), :func:`ess_by_age` of the sequence log-ratios. ``seq_ess``,
    ``abs_max``: as :func:`step_metrics_and_ratios`."""
    metrics, seq_lr = step_metrics_and_ratios(token_lr, mask, staleness, token_stats, reward, group,
                                              seq_ess=seq_ess, abs_max=abs_max)
    frac, count = ess_by_age(seq_lr, age_bucket(staleness), len(AGE_BUCKETS))
    return metrics, frac, count


def ess_by_age(seq_lr: np.ndarray, bucket: np.ndarray, num_buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """Kish ESS fraction of each (seed, age bucket) cell: (fractions (S, K), sample counts (S, K)).

    ``seq_lr`` (S, B) sequence log-ratios, ``bucket`` (S, B) each response's age bucket in [0, K).  Each cell's
    weights are shifted by the cell's largest (in (0, 1]); an empty cell's fraction is NaN.
    """
    S, K = seq_lr.shape[0], num_buckets
    cell = (bucket + np.arange(0, S * K, K)[:, None]).ravel()  # (S*B,) flat (seed, bucket)
    lr = seq_lr.ravel()
    top = np.full(S * K, -np.inf)
    np.maximum.at(top, cell, lr)  # per-cell max: weights rescaled into (0, 1]
    w = np.exp(lr - np.take(top, cell))  # (S*B,)
    count = np.bincount(cell, minlength=S * K)
    sum_w = np.bincount(cell, weights=w, minlength=S * K)
    sum_w2 = np.bincount(cell, weights=w * w, minlength=S * K)
    return ess_frac_from_sums(sum_w, sum_w2, count).reshape(S, K), count.reshape(S, K)  # FreshPER Eq. (5) per cell

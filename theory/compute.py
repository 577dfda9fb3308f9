"""Compute accounting of an asynchronous RL pipeline with a replay buffer.

Paper: "Efficient RL training for LLMs with experience replay"
(experience-replay, docs/REFERENCES.md), Sec. 2.2 and App. E.

| code name            | paper symbol | meaning                                                        |
|----------------------|--------------|----------------------------------------------------------------|
| ``workers``          | W            | inference GPUs                                                 |
| ``trainers``         | T            | trainer GPUs                                                   |
| ``mu``               | mu           | rollout cost / per-sample update cost (Table 1: 5.28, 6.84)    |
| ``compute_ratio``    | gamma        | compute per update with a buffer / without (Eq. 2)             |
| ``k_training``       | K_training   | rollouts processed by backprop over a run (steps x batch)      |
| ``k_inference``      | K_inference  | unique rollouts generated over a run                           |
| ``replay_ratio``     | y = B/R      | mean number of updates a rollout contributes to                |
| ``refill_rounds``    | E[T]         | generation rounds per update of dynamic sampling ([E11])       |

Every ``mu`` in this module is in the *rollout-cost* meaning of Sec. 2 / App. E
(the meaning of Table 1); ``design.mu_in_convention`` converts the Sec. 3 reading.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike

from ..checks import require_integer, require_nonnegative, require_one_of, require_positive, require_unit_interval

REFILL_TAIL = 1e-15
"""``refill_rounds`` sums P(T > n) until every term is below this (the sum's remainder is then below it times the
rounds left at the geometric rate the terms already fall at)."""


def _split(workers: ArrayLike, trainers: ArrayLike, mu: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(W, T, mu) as float arrays, each checked to be a finite number > 0."""
    arrays = tuple(np.asarray(v, dtype=float) for v in (workers, trainers, mu))
    for name, arr in zip(("workers", "trainers", "mu"), arrays):
        require_positive(name, arr)
    return arrays


def compute_ratio(workers: ArrayLike, trainers: ArrayLike, mu: ArrayLike) -> np.ndarray | float:
    """gamma = (1 + W/T) / (1 + mu): compute per update with a buffer over without.

    Without a buffer the no-idle split is W/T = mu and an update costs C(1 + mu)
    (Eq. 1); with a buffer it costs C(1 + W/T) whatever the split.
    """
    workers_arr, trainers_arr, mu_arr = _split(workers, trainers, mu)
    gamma = (1.0 + workers_arr / trainers_arr) / (1.0 + mu_arr)  # Eq. (2)
    return gamma if gamma.ndim else float(gamma)


def compute_ratio_from_split_ratio(workers_per_trainer: ArrayLike, mu: ArrayLike) -> np.ndarray | float:
    """gamma for a split given as the ratio W/T itself (Eq. 2)."""
    ratio = np.asarray(workers_per_trainer, dtype=float)
    mu_arr = np.asarray(mu, dtype=float)
    require_positive("mu", mu_arr)
    require_nonnegative("workers_per_trainer", ratio, allow_inf=True)
    gamma = (1.0 + ratio) / (1.0 + mu_arr)  # Eq. (2)
    return gamma if gamma.ndim else float(gamma)


def estimate_mu(
    k_training: ArrayLike, k_inference: ArrayLike, workers: ArrayLike, trainers: ArrayLike
) -> np.ndarray | float:
    """mu ~= (K_training / T) / (K_inference / W), per run (App. E).

    With a buffer neither side idles, so per-GPU throughputs measure the
    relative cost of generating a rollout and of training on one.
    Inputs broadcast (one entry per seed / run); take ``median_mu`` over them.
    """
    k_train = np.asarray(k_training, dtype=float)
    k_inf = np.asarray(k_inference, dtype=float)
    require_positive("k_training", k_train)
    require_positive("k_inference", k_inf)
    require_positive("workers", np.asarray(workers, dtype=float))
    require_positive("trainers", np.asarray(trainers, dtype=float))
    mu = (k_train / np.asarray(trainers, dtype=float)) / (k_inf / np.asarray(workers, dtype=float))  # App. E
    return mu if mu.ndim else float(mu)


def median_mu(
    k_training: ArrayLike, k_inference: ArrayLike, workers: ArrayLike, trainers: ArrayLike
) -> tuple[float, float, float]:
    """(median, 25th, 75th percentile) of the per-run mu estimates, as Table 1 reports them."""
    per_run = np.atleast_1d(estimate_mu(k_training, k_inference, workers, trainers))
    q25, median, q75 = np.percentile(per_run, [25, 50, 75])
    return float(median), float(q25), float(q75)


def workers_per_trainer(mu: ArrayLike, replay_ratio: ArrayLike) -> np.ndarray | float:
    """W/T that produces rollouts exactly as fast as a replay ratio y consumes them.

    A trainer processes B samples per step at cost B; generating the R = B/y
    new rollouts of that step costs mu R, so W/T = mu R / B = mu / y.
    """
    mu_arr = np.asarray(mu, dtype=float)
    y = np.asarray(replay_ratio, dtype=float)
    require_positive("mu", mu_arr)
    require_positive("replay_ratio", y)
    ratio = mu_arr / y
    return ratio if ratio.ndim else float(ratio)


def replay_ratio_of_split(workers: ArrayLike, trainers: ArrayLike, mu: ArrayLike) -> np.ndarray | float:
    """Mean replay ratio implied by a (W, T) split: y = mu T / W (inverse of ``workers_per_trainer``)."""
    workers_arr, trainers_arr, mu_arr = _split(workers, trainers, mu)
    y = mu_arr * trainers_arr / workers_arr
    return y if y.ndim else float(y)


# --------------------------------------------------------------------------- the two meanings of mu

CONVENTIONS = ("rollout-cost", "paper-sec3")
"""rollout-cost: mu = rollout cost / update cost (Sec. 2, Table 1); paper-sec3: its inverse (Sec. 3)."""


def mu_sec3_of(mu: ArrayLike, convention: str) -> np.ndarray | float:
    """The Sec. 3 cost ratio (update cost / rollout cost) for a mu given in ``convention``."""
    require_one_of("convention", convention, CONVENTIONS)
    mu_arr = np.asarray(mu, dtype=float)
    require_positive("mu", mu_arr)
    converted = 1.0 / mu_arr if convention == "rollout-cost" else mu_arr
    return converted if converted.ndim else float(converted)


def rollout_cost_mu_of(mu: ArrayLike, convention: str) -> np.ndarray | float:
    """The Sec. 2 / Table 1 ratio (rollout cost / update cost) for a mu given in ``convention``."""
    converted = 1.0 / np.asarray(mu_sec3_of(mu, convention), dtype=float)
    return converted if converted.ndim else float(converted)


def rollout_mu_of_convention(mu: float, convention: str) -> float:
    """mu in the rollout-cost meaning (Table 1) for a mu given in ``convention``."""
    return float(rollout_cost_mu_of(mu, convention))


def refill_rounds(groups: ArrayLike, zero_share: float) -> np.ndarray | float:
    """E[T]: the mean number of generation rounds an update of dynamic sampling takes ([E11], docs/THEORY.md).

    Each round generates ``groups`` g prompt groups (R = B rollouts: the trainers' generation batch defaults to the
    training batch), each of equal rewards (zero advantage, dropped) with probability z = ``zero_share``
    independently; rounds repeat until g groups with unequal rewards have been kept, the surplus is dropped (DAPO's
    loop, verl recipe/dapo). T = min {n : Bin(n g, 1 - z) >= g}, so E[T] = sum_{n >= 0} P(T > n) = 1 + sum_{n >= 1}
    P(Bin(n g, 1 - z) <= g - 1) [E11]: 1 at z = 0, about 1 / (1 - z) plus the last round's surplus otherwise.
    ``groups`` (any shape) whole groups >= 1; z in [0, 1). Read off a table of every g up to the next power of two,
    computed once per z (the whole-design search prices every batch at every b factor: the rounds depend on neither)."""
    z = require_unit_interval("zero share z", zero_share, closed=False)
    g = np.asarray(groups)
    bad = ~(np.isfinite(g) & (g >= 1) & (g == np.floor(g))) if g.dtype.kind in "fiu" else np.ones(g.shape, bool)
    if bad.any():  # one vectorised check (the search prices thousands of batches), the first bad value named
        require_integer("groups per round", np.ravel(g)[np.argmax(np.ravel(bad))], 1, whole_floats=True)
    g = g.astype(np.int64)
    top = 1 << int(np.max(g, initial=1) - 1).bit_length()  # the next power of two at or above the largest g
    values = _refill_table(z, top)[g - 1]
    return float(values) if values.ndim == 0 else values


@lru_cache(maxsize=32)
def _refill_table(z: float, top: int) -> np.ndarray:
    """E[T] for g = 1 .. ``top`` at zero share z (``refill_rounds``), read-only."""
    from scipy.stats import binom  # scipy's exact binomial cdf (a core dependency; imported where used)

    g = np.arange(1, top + 1, dtype=float)
    total = np.ones_like(g)  # P(T > 0) = 1
    live = np.arange(top) if z > 0 else np.arange(0)  # the g whose terms are still above the tail
    n = 1
    while live.size:
        term = binom.cdf(g[live] - 1, n * g[live], 1 - z)  # P(T > n) [E11]
        total[live] += term
        live = live[term >= REFILL_TAIL]  # P(T > n) falls with n: a g below the tail stays below it
        n += 1
    total.flags.writeable = False
    return total

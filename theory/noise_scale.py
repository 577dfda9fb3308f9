"""The replay-aware design rule built on the gradient noise scale, and the estimators of its one input.

Source: McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training" (arXiv 1812.06162),
Eqs. (2.7)-(2.11) and App. D (the two-batch-size estimator), with the batch-noise variance sigma^2 / B replaced by
the long-run variance of the batch-mean noise that a synchronous FIFO buffer sampled with replacement injects
(experience-replay paper, Sec. 3: generate R, push into a FIFO of N, draw B uniformly). Derivations:
``replay-theory derive fifo-long-run-variance`` and ``derive noise-scale-rule``; docs/THEORY.md, "The noise-scale
rule", says which assumptions it makes and where it must fail.

| code name       | symbol                     | meaning                                                          |
|-----------------|----------------------------|------------------------------------------------------------------|
| ``b_noise``     | B_noise = tr Sigma / |G|^2 | the simple noise scale (McCandlish Eq. 2.11), in samples          |
| ``b``           | b = B_noise / B            | noise scale in units of the batch                                |
| ``y``           | y = B / R                  | replay ratio (updates each rollout contributes to)               |
| ``x``           | x = N / R                  | staleness horizon: not predicted (shortest the pipeline allows)  |
| ``mu``          | mu                         | rollout cost / per-sample update cost (Table 1); a step: mu R + B |
| ``variance``    | V                          | long-run variance of the batch-mean noise per unit sigma^2        |
| ``steps``       | S = S_min (1 + B_noise V)  | steps to a target (McCandlish Eq. 2.7 with V for 1/B)             |
| ``cost``        | S (mu R + B) / (S_min B)   | compute to the target, in units of S_min B                        |

The model. Steps to a target S = S_min (1 + B_noise V). On-policy without replacement has V = 1/B. FIFO sampled
with replacement has long-run variance V = 1/B + 1/R - 1/(B N) (``fifo_long_run_variance``); the rule uses
1/B + 1/R: the -1/(BN) term is below 1/B^2 and would otherwise reward an ever longer horizon for nothing. At fixed
B, with b = B_noise / B:

    replay:     cost(y) = (1 + b (1 + y)) (1 + mu / y)
    on-policy:  cost    = (1 + b) (1 + mu)
    y* = sqrt(mu (1 + 1/b)),  replay pays iff 4 b (1 + b) < mu,
    best saving (1 + b)(1 + mu) / (sqrt(1 + b) + sqrt(mu b))^2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from ..checks import require_int, require_positive
from .compute import compute_ratio_from_split_ratio
from .compute import workers_per_trainer as _workers_per_trainer
from .resampling import central, quantile_interval, replicates

# --------------------------------------------------------------------------- the noise a buffer injects


def fifo_autocovariance(lag: ArrayLike, batch: float, rollouts: float, capacity: float) -> np.ndarray:
    """C(k) / sigma^2 of the batch-mean noise of a full FIFO (N items, R new per step, B drawn with replacement).

    C(0) = 1/B + 1/N - 1/(BN): two draws hit the same item with probability 1/N. C(k >= 1) = (N - kR)_+ / N^2: the
    buffers k steps apart share N - kR items, and two independent draws hit the same one with probability
    (N - kR) / N^2. Symmetric in k.
    """
    k = np.abs(np.asarray(lag, dtype=float))
    B, R, N = float(batch), float(rollouts), float(capacity)
    shared = np.maximum(N - k * R, 0.0) / N**2  # (N - kR)_+ / N^2
    return np.where(k == 0, 1 / B + 1 / N - 1 / (B * N), shared)


def fifo_long_run_variance(batch: ArrayLike, rollouts: ArrayLike, capacity: ArrayLike) -> np.ndarray | float:
    """sum_k C(k) / sigma^2 = 1/B + 1/R - 1/(BN) for N a multiple of R (derive fifo-long-run-variance).

    Replay cannot average the noise below what the R fresh samples per step carry: V >= 1/R whatever B and N.
    """
    B, R, N = (np.asarray(v, dtype=float) for v in (batch, rollouts, capacity))
    for name, value in (("batch", B), ("rollouts", R), ("capacity", N)):
        require_positive(name, value)
    value = 1 / B + 1 / R - 1 / (B * N)  # derive fifo-long-run-variance, steps 6-7
    return float(value) if value.ndim == 0 else value


def design_variance(y: ArrayLike, *, on_policy: ArrayLike = False) -> np.ndarray | float:
    """B V of the rule: 1 + y for FIFO with replacement, 1 for on-policy without replacement (B V per unit 1/B)."""
    y = np.asarray(y, dtype=float)
    value = np.where(np.asarray(on_policy, dtype=bool), 1.0, 1.0 + y)
    return float(value) if value.ndim == 0 else value


# --------------------------------------------------------------------------- the rule


def replay_cost(b: ArrayLike, y: ArrayLike, mu: ArrayLike, *, on_policy: ArrayLike = False) -> np.ndarray | float:
    """Compute to the target in units of S_min B: (1 + b B V)(1 + mu / y); on-policy is y = 1 with B V = 1."""
    b, y, mu = (np.asarray(v, dtype=float) for v in (b, y, mu))
    value = (1 + b * design_variance(y, on_policy=on_policy)) * (1 + mu / y)  # S / S_min x (mu R + B) / B
    return float(value) if value.ndim == 0 else value


def optimal_replay_ratio(b: ArrayLike, mu: ArrayLike) -> np.ndarray | float:
    """y* = sqrt(mu (1 + 1/b)): the minimiser of (1 + b (1 + y))(1 + mu / y) over y > 0."""
    b, mu = np.asarray(b, dtype=float), np.asarray(mu, dtype=float)
    value = np.sqrt(mu * (1 + 1 / b))  # d/dy = 0: b (1 + mu/y) = (1 + b + b y) mu / y^2
    return float(value) if value.ndim == 0 else value


def replay_threshold(mu: ArrayLike) -> np.ndarray | float:
    """b below which replay beats on-policy: the root of 4 b (1 + b) = mu, b = (sqrt(1 + mu) - 1) / 2."""
    mu = np.asarray(mu, dtype=float)
    value = (np.sqrt(1 + mu) - 1) / 2
    return float(value) if value.ndim == 0 else value


def replay_pays(b: ArrayLike, mu: ArrayLike) -> np.ndarray | bool:
    """4 b (1 + b) < mu: the replay optimum costs less than on-policy without replacement."""
    b, mu = np.asarray(b, dtype=float), np.asarray(mu, dtype=float)
    value = 4 * b * (1 + b) < mu
    return bool(value) if value.ndim == 0 else value


def best_saving(b: ArrayLike, mu: ArrayLike) -> np.ndarray | float:
    """on-policy cost / cost at y*: (1 + b)(1 + mu) / (sqrt(1 + b) + sqrt(mu b))^2; 1 where replay does not pay."""
    b, mu = np.asarray(b, dtype=float), np.asarray(mu, dtype=float)
    ratio = (1 + b) * (1 + mu) / (np.sqrt(1 + b) + np.sqrt(mu * b)) ** 2
    value = np.where(replay_pays(b, mu), ratio, 1.0)
    return float(value) if value.ndim == 0 else value


@dataclass(frozen=True)
class NoiseScaleDesign:
    """The rule's design at a fixed batch B: integer R, N = R (the shortest horizon)."""

    b_noise: float
    batch_size: int  # B
    mu: float
    b: float  # B_noise / B
    regime: str  # "replay" or "on-policy"
    y_continuous: float  # y* = sqrt(mu (1 + 1/b)), or 1 on-policy
    rollouts_per_step: int  # R = round(B / y*), >= 1
    capacity: int  # N = R: x = 1
    y: float  # B / R, the integer design's replay ratio
    cost: float  # (1 + b B V)(1 + mu / y) of the integer design, units S_min B
    on_policy_cost: float  # (1 + b)(1 + mu)
    saving: float  # on_policy_cost / cost
    threshold_b: float  # replay pays iff b < this
    steps_factor: float  # S / S_min of the design: 1 + b (1 + y), or 1 + b on-policy

    @property
    def x(self) -> float:
        """x = N / R: 1, the shortest horizon (the rule does not predict one)."""
        return self.capacity / self.rollouts_per_step

    @property
    def workers_per_trainer(self) -> float:
        """W/T = mu / y: inference GPUs per trainer GPU, none idle (compute.workers_per_trainer)."""
        return _workers_per_trainer(self.mu, self.y)

    @property
    def compute_ratio(self) -> float:
        """gamma = (1 + W/T) / (1 + mu): compute per update vs on-policy (Eq. 2)."""
        return compute_ratio_from_split_ratio(self.workers_per_trainer, self.mu)

    @property
    def rounding_lost_replay(self) -> bool:
        """On-policy although b < threshold_b (replay pays at y*): R = B / y* rounds to B or loses the saving."""
        return self.regime == "on-policy" and self.b < self.threshold_b

    @property
    def steps_vs_on_policy(self) -> float:
        """S / S_on = S / (S_min (1 + b)): the design's steps to the target over on-policy's at the same B."""
        return self.steps_factor / (1 + self.b)


def steps_vs_on_policy(b: float, y: float) -> float:
    """S / S_on = (1 + b (1 + y)) / (1 + b): steps to the target at replay ratio y over on-policy's, b = B_noise / B."""
    return float((1 + b * design_variance(y)) / (1 + b))


def rule_at(b: float, mu: float) -> dict:
    """The rule's continuous answer at b = B_noise / B (a row of ``optimal --objective noise-scale`` without a noise
    scale): regime, y*, W/T = mu / y (compute.workers_per_trainer), gamma (Eq. 2), the compute saved and the steps
    vs on-policy; on-policy (y = 1) unless 4 b (1 + b) < mu strictly away from the threshold."""
    pays = replay_pays(b, mu) and not math.isclose(b, replay_threshold(mu))
    y = optimal_replay_ratio(b, mu) if pays else 1.0
    wpt = _workers_per_trainer(mu, y)
    return {"b": b, "regime": "replay" if pays else "on-policy", "y_star": y, "workers_per_trainer": wpt,
            "compute_ratio": compute_ratio_from_split_ratio(wpt, mu), "saving": best_saving(b, mu) if pays else 1.0,
            "steps_factor": steps_vs_on_policy(b, y) if pays else 1.0}


def noise_scale_design(b_noise: float, batch: int, mu: float) -> NoiseScaleDesign:
    """The noise-scale rule at fixed B: on-policy unless 4 b (1 + b) < mu, else R = B / y* rounded to the better
    neighbouring integer (N = R: the rule does not predict a horizon, so the shortest)."""
    require_positive("noise scale B_noise", b_noise)
    require_positive("mu", mu)
    B = int(require_int("batch size B", batch, 1))
    b = b_noise / B
    on_cost = (1 + b) * (1 + mu)
    threshold = replay_threshold(mu)
    if not replay_pays(b, mu):
        return NoiseScaleDesign(b_noise, B, mu, b, "on-policy", 1.0, B, B, 1.0, on_cost, on_cost, 1.0, threshold,
                                1 + b)
    y_cont = optimal_replay_ratio(b, mu)
    candidates = {max(1, math.floor(B / y_cont)), max(1, math.ceil(B / y_cont))}
    R = min(sorted(candidates), key=lambda r: replay_cost(b, B / r, mu))
    y = B / R
    cost = replay_cost(b, y, mu)
    if cost >= on_cost:  # rounding R lost the (small) saving: stay on-policy, said by the regime
        return NoiseScaleDesign(b_noise, B, mu, b, "on-policy", 1.0, B, B, 1.0, on_cost, on_cost, 1.0, threshold,
                                1 + b)
    return NoiseScaleDesign(b_noise, B, mu, b, "replay", y_cont, R, R, y, cost, on_cost, on_cost / cost, threshold,
                            1 + b * (1 + y))


# --------------------------------------------------------------------------- measuring B_noise


@dataclass(frozen=True)
class NoiseScaleEstimate:
    """B_noise from one set of gradients: its parts, so that estimates can be pooled or re-examined."""

    trace_sigma: float  # tr Sigma, per sample
    grad_sq: float  # |E G|^2, unbiased (may be <= 0 when the signal is below the Monte Carlo noise)
    b_noise: float  # tr Sigma / |E G|^2; inf when grad_sq <= 0 (no measurable signal: said, not clamped)


def noise_scale_from_samples(grads: ArrayLike, unit_size: int = 1) -> NoiseScaleEstimate:
    """B_noise from M per-unit gradients (M, d) at one theta (McCandlish App. A.1, unbiased parts).

    tr Sigma_unit = sum_j var_j (ddof 1); |E G|^2 = ||G_bar||^2 - tr Sigma_unit / M. A unit is one sample, or one
    prompt group of ``unit_size`` responses for GRPO-style losses whose samples are correlated through the group
    baseline: then tr Sigma per sample = unit_size x tr Sigma_unit (the group is the independent draw).
    """
    unit_size = int(require_int("unit_size", unit_size, 1))  # a negative or zero group would flip or zero tr Sigma
    g = np.asarray(grads, dtype=float)
    if g.ndim != 2 or g.shape[0] < 2:
        raise ValueError(f"grads must be an (M, d) array with M >= 2 units, got shape {g.shape}")
    M = g.shape[0]
    mean = g.mean(axis=0)
    trace_unit = float(((g - mean) ** 2).sum() / (M - 1))  # tr Sigma of one unit, unbiased
    grad_sq = float(mean @ mean - trace_unit / M)  # E||G_bar||^2 = |EG|^2 + tr Sigma / M
    trace = unit_size * trace_unit
    return NoiseScaleEstimate(trace, grad_sq, trace / grad_sq if grad_sq > 0 else math.inf)


def noise_scale_two_batch(sq_norm_small: ArrayLike, sq_norm_big: ArrayLike, batch_small: float,
                          batch_big: float) -> NoiseScaleEstimate:
    """B_noise from |g|^2 at two batch sizes at the same theta (McCandlish App. A.1, Eqs. A.2-A.3).

    |G|^2 = (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small);
    tr Sigma = (|g_small|^2 - |g_big|^2) / (1/B_small - 1/B_big). Arrays are averaged first (one estimate of the
    ratio of means over steps, as McCandlish does; the median over checkpoints is ``pooled_noise_scale``'s job).
    Two micro-batches of b and their sum (B_big = 2 b) give it with no extra backward pass.
    """
    require_positive("batch_small", batch_small)
    require_positive("batch_big", batch_big)
    if not batch_big > batch_small:
        raise ValueError(f"batch_big must exceed batch_small, got {batch_big!r} <= {batch_small!r}")
    small = float(np.mean(np.asarray(sq_norm_small, dtype=float)))
    big = float(np.mean(np.asarray(sq_norm_big, dtype=float)))
    grad_sq = (batch_big * big - batch_small * small) / (batch_big - batch_small)
    trace = (small - big) / (1 / batch_small - 1 / batch_big)
    return NoiseScaleEstimate(trace, grad_sq, trace / grad_sq if grad_sq > 0 else math.inf)


@dataclass(frozen=True)
class PooledNoiseScale:
    """The median of per-checkpoint B_noise with a bootstrap interval (units resampled within each checkpoint)."""

    b_noise: float  # median over checkpoints
    interval: tuple[float, float]  # bootstrap interval at ``level``
    level: float
    per_checkpoint: tuple[float, ...]
    checkpoints: int
    method: str  # "per-sample" or "two-batch"

    def to_dict(self) -> dict:
        finite = [v if math.isfinite(v) else None for v in self.per_checkpoint]
        return {"b_noise": self.b_noise if math.isfinite(self.b_noise) else None,
                "b_noise_interval": [v if math.isfinite(v) else None for v in self.interval],
                "level": self.level, "per_checkpoint": finite, "checkpoints": self.checkpoints,
                "method": self.method}


def pooled_noise_scale(grads_by_checkpoint: list[np.ndarray], rng: np.random.Generator, *, unit_size: int = 1,
                       n_boot: int = 1000, level: float = 0.9) -> PooledNoiseScale:
    """Median over checkpoints of B_noise (each from its (M, d) unit gradients) and a bootstrap interval.

    Why the median: B_noise drifts within a run (it grows as |grad F| shrinks) and the ratio of means is dominated
    by the checkpoints whose signal is smallest; the audit found the ratio of means misclassified the bandits.
    Checkpoints should lie before the reward plateau. A checkpoint without measurable signal counts as inf.
    """
    if not grads_by_checkpoint:
        raise ValueError("grads_by_checkpoint must hold at least one checkpoint")
    points = [noise_scale_from_samples(g, unit_size) for g in grads_by_checkpoint]
    per = [p.b_noise for p in points]
    # In the bootstrap world the true |E G|^2 is ||G_bar||^2 = grad_sq + tr Sigma_unit / M, which the replicates'
    # unbiased |E G|^2 centre on: shifted back by tr Sigma_unit / M, their spread is the estimator's around the
    # truth (without the shift the interval sat below the point, by B_noise / (unit_size M) relative)
    floors = [p.trace_sigma / (unit_size * np.shape(g)[0]) for p, g in zip(points, grads_by_checkpoint)]
    units = [np.asarray(g, dtype=float) for g in grads_by_checkpoint]

    def median_b_noise(*index: np.ndarray) -> np.ndarray:  # one replicate: (1, M_k) unit indices per checkpoint
        values = []
        for g, floor, i in zip(units, floors, index):
            replicate = noise_scale_from_samples(g[i[0]], unit_size)
            grad_sq = replicate.grad_sq - floor
            values.append(replicate.trace_sigma / grad_sq if grad_sq > 0 else math.inf)
        return np.array([np.median(values)])

    boots = replicates(median_b_noise, [g.shape[0] for g in units], n_boot, rng, one_at_a_time=True)
    lo, hi = quantile_interval(boots, central(level), "order")  # order statistics: defined with inf entries
    return PooledNoiseScale(float(np.median(per)), (lo, hi), level, tuple(float(v) for v in per), len(per),
                            "per-sample")


def pooled_two_batch(sq_small: ArrayLike, sq_big: ArrayLike, batch_small: float, batch_big: float,
                     rng: np.random.Generator, *, n_boot: int = 1000, level: float = 0.9) -> PooledNoiseScale:
    """B_noise from per-step squared norms at two batch sizes (steps, ): the ratio of the step-means (McCandlish
    pools |G|^2 and tr Sigma over steps before dividing: each step's estimate alone is too noisy), with a bootstrap
    interval over steps."""
    small, big = np.asarray(sq_small, dtype=float), np.asarray(sq_big, dtype=float)
    if small.shape != big.shape or small.ndim != 1 or small.size < 2:
        raise ValueError(f"sq_small and sq_big must be 1-d arrays of equal length >= 2, got {small.shape}, {big.shape}")
    point = noise_scale_two_batch(small, big, batch_small, batch_big).b_noise
    boots = replicates(lambda index: np.array([noise_scale_two_batch(small[i], big[i], batch_small, batch_big).b_noise
                                               for i in index]), small.size, n_boot, rng)
    lo, hi = quantile_interval(boots, central(level), "order")
    return PooledNoiseScale(point, (lo, hi), level, (), int(small.size), "two-batch")


def noise_scale_pick(b_noise: float, batch: int, group_size: int, mu: float) -> dict:
    """The noise-scale rule's design at fixed B (:func:`noise_scale_design`) with R whole prompt groups (a trainer
    stores and draws whole GRPO groups of ``group_size``): what validate verify trains and trl-replay --design reads.

    b = B_noise / B; replay pays iff 4 b (1 + b) < mu, then y* = sqrt(mu (1 + 1/b)) and R is whichever multiple of K
    next to B / y* costs less by ``replay_cost`` ((1 + b (1 + y))(1 + mu / y), units S_min B), N = R; on-policy
    (R = N = B) when it does not pay or the rounded design costs at least on-policy's (1 + b)(1 + mu).
    """
    rule = noise_scale_design(b_noise, batch, mu)
    pick = {"b_noise": b_noise, "batch_size": batch, "b": rule.b, "mu": mu, "y_star": rule.y_continuous,
            "threshold_b": rule.threshold_b, "on_policy_cost": rule.on_policy_cost}
    on_policy = {**pick, "regime": "on-policy", "rollouts_per_step": batch, "capacity": batch, "y": 1.0,
                 "cost": rule.on_policy_cost}
    if rule.regime == "on-policy":
        return on_policy
    exact = batch / rule.y_continuous  # R* = B / y*, between whole groups
    candidates = sorted({max(group_size, group_size * math.floor(exact / group_size)),
                         min(batch, group_size * math.ceil(exact / group_size))})
    R = min(candidates, key=lambda r: replay_cost(rule.b, batch / r, mu))
    cost = replay_cost(rule.b, batch / R, mu)
    if cost >= rule.on_policy_cost:  # the groups' rounding lost the saving
        return on_policy
    return {**pick, "regime": "replay", "rollouts_per_step": R, "capacity": R, "y": batch / R, "cost": cost}

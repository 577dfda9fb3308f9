"""Train one design to a target, every (step size, seed) row at once: the loop of ``experiment theory-test``.

Paper: experience-replay (docs/REFERENCES.md), Sec. 3: the synchronous FIFO (each step generate R, push into a FIFO of
N, draw B uniformly with replacement, one optimizer step); on-policy draws the R = B fresh samples once each. The
gradient of a step comes from the shared pipeline and loss (``core/pipeline.py``, ``core/designs.compute_loss``) on a
rollout environment, or from ``QuadraticReplay`` on the noisy quadratic (one FIFO implementation either way).

What a run measures is the seed-mean (expected) curve, never a single seed's luck: a step size reaches the target at
the first step t at which the mean over seeds of the exact reward, averaged over the centred window [t - w, t + w]
(w = max(``MIN_WINDOW``, ``WINDOW`` t)), is at or above it (a mean that touches the target by fluctuation around a
lower plateau is averaged away). The same test runs on ``boot_index``'s seed resamples (paired across the designs of a
setting), which gives every design a bootstrap distribution of its tuned steps.

| code name        | symbol      | meaning                                                                 |
|------------------|-------------|-------------------------------------------------------------------------|
| ``design``       | (B, R, N)   | ``theory.designs.Design``: batch_size, rollouts_per_step, capacity      |
| ``lrs``          | eta         | step sizes tried, one block of ``seeds`` rows each (lr-major rows)       |
| ``crossing``     | S           | (boots + 1, lrs) step the seed mean reaches the target; 0: not reached    |
| ``first_touch``  | --          | (lrs,) first step the raw seed mean touched it (before the smoothing)    |
| ``zero_std_share`` | z         | (lrs,) the buffer selective's share of equal-reward groups, per step size |
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..checks import require_int, require_positive
from ..core.designs import compute_loss
from ..core.pipeline import EnvBackend, Pipeline
from ..core.rng import PerSeedGenerator
from ..theory.designs import Design
from .config import SimConfig
from .envs.quadratic import QuadraticEnv, QuadraticReplay, expected_loss, stationary_loss_epochs
from .optim import OPTIMIZERS

WINDOW = 0.1
"""The seed mean is smoothed over the centred window [t - w, t + w], w = max(MIN_WINDOW, 0.1 t), before it is compared
with the target: unbiased for a locally linear expected curve, sqrt(2w + 1) times less noisy than the raw mean."""
MIN_WINDOW = 2
STOP_FACTOR = 1.3
"""The run goes on to 1.3 x the best step size's crossing (plus its window), so that bootstrap replicates whose best
step size differs can still see theirs cross."""
GROUP = 8
"""Responses per prompt group on the rollout environments (the benchmark's GRPO / leave-one-out groups)."""


def _window(t: int) -> int:
    """w = max(MIN_WINDOW, ceil(WINDOW t)) of one step: plain Python (the tracker asks every step; numpy's scalar
    calls cost more than the arithmetic), the same double product and ceiling as numpy's."""
    return max(MIN_WINDOW, math.ceil(WINDOW * t))


class CrossingTracker:
    """The first step at which the centred moving average of the seed-mean reward reaches the target, for the real
    seeds (row 0) and every seed resample, tested online as each window completes."""

    def __init__(self, target: float, lrs: int, seeds: int, boot_index: np.ndarray | None, max_steps: int):
        self.target, self.lrs, self.seeds = float(target), int(lrs), int(seeds)
        index = np.zeros((0, seeds), np.int64) if boot_index is None else np.asarray(boot_index, np.int64)
        # (boots + 1, seeds) seed weights: row 0 the real seeds, then each resample's counts
        self.weights = np.vstack([np.ones(seeds)] + [np.bincount(r, minlength=seeds) for r in index]) / seeds
        self.rows = self.weights.shape[0]
        self.cumsum = np.zeros((64, self.rows, lrs))  # (steps + 1, boots + 1, lrs) running sums of the means
        self.finite = np.ones(lrs, bool)  # a step size stays counted only while none of its rows has diverged
        self.crossing = np.zeros((self.rows, lrs), np.int64)  # 0: not reached
        self.first_touch = np.zeros(lrs, np.int64)
        self.last = 0  # the last step whose smoothed value has been tested
        self.max_steps = int(max_steps)

    def update(self, step: int, reward: np.ndarray) -> None:
        """``reward`` (lrs * seeds,) exact rewards after update ``step`` (1-based)."""
        r = np.asarray(reward, dtype=float).reshape(self.lrs, self.seeds)
        ok = np.isfinite(r)
        self.finite &= ok.all(axis=1)
        means = (np.where(ok, r, 0.0) @ self.weights.T).T  # (boots + 1, lrs); a diverged row's NaN or inf counts 0
        if step >= self.cumsum.shape[0]:
            grown = np.zeros((min(2 * self.cumsum.shape[0], self.max_steps + 1), self.rows, self.lrs))
            grown[: self.cumsum.shape[0]] = self.cumsum
            self.cumsum = grown
        self.cumsum[step] = self.cumsum[step - 1] + means
        self.first_touch[(self.first_touch == 0) & self.finite & (means[0] >= self.target)] = step
        t = self.last + 1
        while t + _window(t) <= step:  # every t whose window [t - w, t + w] is now complete
            w = _window(t)
            lo = max(t - w, 1)
            smooth = (self.cumsum[t + w] - self.cumsum[lo - 1]) / (t + w - lo + 1)  # (boots + 1, lrs)
            new = (self.crossing == 0) & (smooth >= self.target) & self.finite
            self.crossing[new] = t
            self.last = t
            t += 1

    def best(self) -> int:
        """The real seeds' best crossing over step sizes (0: none yet)."""
        found = self.crossing[0][(self.crossing[0] > 0) & self.finite]
        return int(found.min()) if found.size else 0

    def settled(self, step: int) -> bool:
        """Every step size crossed, or past STOP_FACTOR x the best crossing and its window."""
        if ((self.crossing[0] > 0) | ~self.finite).all():
            return True
        best = self.best()
        late = math.ceil(STOP_FACTOR * best)
        return best > 0 and step >= late + _window(late)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        crossing = np.where(self.finite[None], self.crossing, 0)
        return crossing, self.first_touch


@dataclass
class TargetTrace:
    crossing: np.ndarray  # (boots + 1, lrs) confirmed crossing step of the seed mean (0: not reached)
    first_touch: np.ndarray  # (lrs,) first step the real seed mean touched the target (0: never)
    steps: int  # steps run
    mean_reward: np.ndarray  # (lrs, K) seed-mean exact reward on a thinned step grid
    reward_steps: np.ndarray  # (K,)
    zero_std_share: np.ndarray | None = None  # (lrs,) z of the buffer selective ([E8]) or dynamic ([E11]), mean over
    # steps and seeds
    refill_rounds: np.ndarray | None = None  # (lrs,) dynamic sampling's generation rounds an update ([E11]), mean


class RolloutGradient:
    """Per step: the pipeline's batch (``Pipeline.next_batch``), the shared loss's gradient (``compute_loss``)."""

    def __init__(self, env, loss: tuple[str, str], design: Design, rows: int, rng, optimizer: str,
                 buffer: str = "fifo"):
        self.env = env
        sim_loss, advantage = loss
        self.config = SimConfig.from_design(dataclasses.replace(design, group_size=GROUP), pipeline="sync",
                                            loss=sim_loss, advantage=advantage, optimizer=optimizer,
                                            seeds=rows, buffer=buffer).validated()
        self.pipe = Pipeline(self.config, EnvBackend(env, rng), rng, rows, self.config.pipeline_settings())
        # the selective buffer's admitted count (S,) per step: z = 1 - admitted / R, summed over the steps; dynamic
        # sampling's z and generation rounds per step (its curves), summed likewise
        dynamic = buffer == "dynamic" or design.dynamic
        self.zero_std = np.zeros(rows) if hasattr(self.pipe.buffer, "admitted") or dynamic else None
        self.rounds = np.zeros(rows) if dynamic else None
        self.steps = 0

    def __call__(self, step: int, params: np.ndarray) -> np.ndarray:
        env = self.env
        self.data = self.pipe.next_batch(step, params)
        if self.rounds is not None:
            self.zero_std += self.data.curves["refill_zero_share"]
            self.rounds += self.data.curves["refill_rounds"]
            self.steps += 1
        elif self.zero_std is not None:
            self.zero_std += 1.0 - self.pipe.buffer.admitted / self.config.rollouts_per_step
            self.steps += 1
        batch = self.data.train
        logp_new = env.logp(params, batch.prompt, batch.tokens, batch.mask)
        out = compute_loss(self.config, batch, logp_new, self.data.is_fresh)
        return env.grad_logp_contract(params, batch.prompt, batch.tokens, batch.mask, out.grad_logp)

    def after_update(self, step: int) -> None:
        self.pipe.after_update(step, self.data)


class QuadraticGradient:
    """The gradient of F per step from ``QuadraticReplay`` (the same FIFO, each sample's noise fixed at draw)."""

    def __init__(self, env: QuadraticEnv, design: Design, rows: int, rng):
        self.sampler = QuadraticReplay(env, design.capacity, design.rollouts_per_step, design.batch_size, rows, rng,
                                       on_policy=design.on_policy, epochs=design.epochs,
                                       mini_batches=design.mini_batches)

    def __call__(self, step: int, params: np.ndarray) -> np.ndarray:
        return -self.sampler.gradient(step, params)  # the loss F is minimised

    def after_update(self, step: int) -> None:
        pass


Observer = Callable[[int, np.ndarray, np.ndarray, object], None]
"""observer(step, params before the update, loss gradient, optimizer) after each gradient, before the update."""


def run_to_target(env, loss: tuple[str, str] | None, design: Design, lrs, seeds: int, optimizer: str, target: float,
                  max_steps: int, *, seed: int = 0, boot_index: np.ndarray | None = None,
                  observer: Observer | None = None, on_step: Callable[[], None] | None = None,
                  thin_points: int = 400, buffer: str = "fifo") -> TargetTrace:
    """Train ``design`` at every step size of ``lrs`` with ``seeds`` seeds each until every step size's seed mean has
    crossed ``target`` (sustained), or STOP_FACTOR x the best crossing, or ``max_steps``.

    ``loss`` (simulator loss, advantage) on a rollout environment; None on the quadratic. The reward is exact
    (``env.evaluate``), so only the training noise is random. Diverging rows (a step size past stability) give
    non-finite rewards that never count. ``buffer``: the rollout environment's buffer for a FIFO design ("fifo", or
    "selective": [E8], whose trace then carries z per step size). A dynamic sampling design (``Design.dynamic_at``)
    trains in the dynamic buffer; its trace carries z and the generation rounds per update ([E11]).
    """
    lrs = np.asarray(lrs, dtype=float).ravel()
    require_positive("lr", lrs)
    seeds = int(require_int("seeds", seeds, 1))
    max_steps = int(require_int("max_steps", max_steps, 1))
    nl = lrs.size
    rows = nl * seeds
    rng = PerSeedGenerator(seed, rows)
    if hasattr(env, "with_noise_stream"):  # a verifier's own noise: keyed by the run, never by earlier runs' draws
        env = env.with_noise_stream(int(seed), rows, int(max_steps))
    if isinstance(env, QuadraticEnv):
        gradient = QuadraticGradient(env, design, rows, rng)
    else:
        if loss is None:
            raise ValueError("a rollout environment needs a loss (simulator loss, advantage)")
        gradient = RolloutGradient(env, loss, design, rows, rng, optimizer, buffer)
    lr = np.repeat(lrs, seeds)[:, None]  # (rows, 1), lr-major
    params = env.init_params(rows)
    step_rule = OPTIMIZERS[optimizer](params, lr)
    tracker = CrossingTracker(target, nl, seeds, boot_index, max_steps)
    thin = max(1, max_steps // thin_points)
    curve, curve_steps = [env.evaluate(params)["reward"].reshape(nl, seeds).mean(axis=1)], [0]
    step = 0
    with np.errstate(over="ignore", invalid="ignore"):
        for step in range(1, max_steps + 1):
            grad = gradient(step - 1, params)
            if observer is not None:
                observer(step - 1, params, grad, step_rule)
            params = step_rule.step(params, grad)
            gradient.after_update(step - 1)
            reward = env.evaluate(params)["reward"]
            tracker.update(step, reward)
            if step % thin == 0:
                curve.append(reward.reshape(nl, seeds).mean(axis=1))
                curve_steps.append(step)
            if on_step is not None:
                on_step()
            if tracker.settled(step):
                break
    crossing, first_touch = tracker.result()
    zero_std, rounds = getattr(gradient, "zero_std", None), getattr(gradient, "rounds", None)
    share = None if zero_std is None else zero_std.reshape(nl, seeds).mean(axis=1) / max(gradient.steps, 1)
    per_update = None if rounds is None else rounds.reshape(nl, seeds).mean(axis=1) / max(gradient.steps, 1)
    return TargetTrace(crossing, first_touch, step, np.stack(curve, axis=1), np.asarray(curve_steps), share,
                       per_update)


# --------------------------------------------------------------------------- the quadratic, exactly


@dataclass
class ExpectedTrace:
    crossing: np.ndarray  # (lrs,) first step E F_t <= F_target (0: not within the steps, or never: stationary above)
    stationary: np.ndarray  # (lrs,) the stationary E F (inf where the step diverges)
    steps: int


def stationary_loss(env: QuadraticEnv, design: Design, lrs) -> np.ndarray:
    """E F at stationarity (lrs,), exactly: sum_i h_i eta^2 sigma_i^2 V_eff,i / (2 (1 - a_i^2)), B V_eff = 1 (on-policy)
    or 1 + y psi(x, eta h_i) - 1/N (FIFO; ``derive forgetting-variance``); inf once a step diverges (eta h >= 2).
    An epoch design: its periodic stationary E F averaged over a generation (``stationary_loss_epochs``)."""
    from ..theory.forgetting import psi

    if design.updates_per_generation > 1:
        return stationary_loss_epochs(env, lrs, design.rollouts_per_step, design.epochs, design.mini_batches)
    lrs = np.asarray(lrs, dtype=float).ravel()
    kappa = lrs[:, None] * env.curvature  # (L, d)
    out = np.full(lrs.size, np.inf)
    ok = (kappa < 2).all(axis=1)
    if not ok.any():
        return out
    k = kappa[ok]
    bv = np.ones_like(k) if design.on_policy else 1 + design.y * psi(design.x, k) - 1 / design.capacity
    a = 1 - k
    var = (lrs[ok, None] ** 2) * env.noise_var * bv / design.batch_size / (1 - a * a)  # (L', d)
    out[ok] = 0.5 * var @ env.curvature
    return out


def expected_to_target(env: QuadraticEnv, design: Design, lrs, max_steps: int) -> ExpectedTrace:
    """SGD's exact expected-loss curve (``expected_loss``) per step size until it reaches F <= -env.target; a step
    size whose stationary E F is at or above the target never counts, even where its curve dips below on the way."""
    lrs = np.asarray(lrs, dtype=float).ravel()
    f_target = -env.target
    stationary = stationary_loss(env, design, lrs)
    crossing = np.zeros(lrs.size, np.int64)
    live = stationary < f_target
    if not live.any():
        return ExpectedTrace(crossing, stationary, 0)
    curve = expected_loss(env, lrs[live], design.capacity, design.rollouts_per_step, design.batch_size, max_steps,
                          on_policy=design.on_policy, stop_below=f_target, epochs=design.epochs,
                          mini_batches=design.mini_batches)  # (L', steps run + 1)
    below = curve[:, 1:] <= f_target
    hit = below.any(axis=1)
    first = np.where(hit, below.argmax(axis=1) + 1, 0)
    crossing[np.flatnonzero(live)] = first
    return ExpectedTrace(crossing, stationary, curve.shape[1] - 1)

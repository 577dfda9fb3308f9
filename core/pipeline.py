"""The training pipeline both loops share: where each step's batch comes from, what it cost, how stale it was.

Papers (docs/REFERENCES.md): experience-replay Sec. 2 (asynchronous pipeline, Eqs. 1-2) and
Sec. 3 (synchronous pipeline); the per-design batch steps are in ``core/designs.py``.

The simulator's engine (``simulate/engine.py``: every seed at once, a log-linear policy)
and the validator (``validate/rl.py``: one seed, a language model) drive the same
``Pipeline``; they differ only in the ``RolloutBackend`` that samples and scores responses.

| code name        | paper symbol   | meaning                                                              |
|------------------|----------------|----------------------------------------------------------------------|
| ``weights``      | theta_t        | the policy a backend samples from (params (S, d) or a torch model)   |
| ``workers/trainers`` | W / T      | async split; B W / (T mu) fresh responses per update                 |
| ``compute``      | c              | rollout-cost units (one sample's update = 1): mu R + B (sync),       |
|                  |                | B (1 + W/T) (async, Eq. 1 / text before Eq. 2)                       |
| ``k_inference``  | K_inference    | responses generated (App. E counts)                                  |
| ``k_training``   | K_training     | responses trained on                                                 |
| ``staleness``    | t - t_i        | step minus the policy version that generated the response            |

Pipelines. sync: each step generates R fresh responses from the current weights. async:
workers hold weights synced every ``sync_interval`` steps and produce B W / (T mu)
responses per update (fractions carried to the next step); on-policy async is the queue
at W/T = mu, each response used once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from ..theory.compute import compute_ratio_from_split_ratio, estimate_mu
from .buffers import ReplayBuffer
from .designs import (
    BUFFER_DESIGNS,
    BufferSpec,
    DesignConfig,
    StepBatch,
    UpdateT,
    make_advantage,
    make_design_buffer,
    stale_k_overlapped,
)
from .metrics import AGE_BUCKETS, AGE_TABLE, age_bucket, age_buckets  # noqa: F401 (their old home: re-exported)
from .rollouts import RolloutBatch


def fifo_max_age(capacity: int, rollouts_per_step: int) -> int:
    """Oldest age (in steps) a FIFO buffer of N rows fed R rows a step holds once full: ceil(N/R) - 1."""
    return math.ceil(capacity / rollouts_per_step) - 1  # experience-replay Sec. 3: staleness horizon x = N/R


class RolloutBackend(Protocol):
    """Samples and scores responses: the simulator's environment or the language model."""

    num_prompts: int
    seq_len: int

    def sample(self, weights, prompts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(tokens (S, n, L), logp_behav (S, n, L), mask (S, n, L), reward (S, n)) for prompts (S, n)."""
        ...

    def entropy(self, weights, prompts: np.ndarray, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Token entropies (S, n, L) under ``weights`` (ExGRPO's trajectory choice)."""
        ...

    def snapshot(self, weights):
        """A copy of ``weights`` that later updates do not change (async workers)."""
        ...


class EnvBackend:
    """The simulator's environment (``simulate/envs``) as a backend, all seeds at once."""

    def __init__(self, env, rng):
        self.env, self.rng = env, rng
        self.num_prompts, self.seq_len = env.num_prompts, env.seq_len

    def sample(self, weights: np.ndarray, prompts: np.ndarray):
        tokens, logp, mask = self.env.sample(weights, prompts, self.rng)  # (S, n, L) each
        return tokens, logp, mask, self.env.reward(prompts, tokens, mask)  # reward (S, n)

    def entropy(self, weights, prompts, tokens, mask) -> np.ndarray:
        return self.env.token_entropy(weights, prompts, tokens, mask)

    def snapshot(self, weights: np.ndarray) -> np.ndarray:
        return weights.copy()


def score(config: DesignConfig, prompts, tokens, mask, logp_behav, reward, created, group) -> RolloutBatch:
    """A RolloutBatch with the config's group-relative advantages over consecutive groups of G."""
    S, n = prompts.shape
    G = config.group_size
    advantage = make_advantage(config, reward.reshape(S, n // G, G)).reshape(S, n)
    return RolloutBatch(prompt=prompts, tokens=tokens, mask=mask, logp_behav=logp_behav, reward=reward,
                        advantage=advantage, created=created, group=group)


def generate(backend: RolloutBackend, config: DesignConfig, weights, num_groups: int, version, group_offset: int,
             rng) -> RolloutBatch:
    """num_groups uniformly drawn prompts x G responses from ``weights``, seeds first."""
    S = rng.num_seeds if hasattr(rng, "num_seeds") else 1
    G = config.group_size
    prompts = rng.integers(0, backend.num_prompts, size=(S, num_groups))  # (S, g)
    prompts = np.repeat(prompts, G, axis=1)  # (S, g*G)
    tokens, logp, mask, reward = backend.sample(weights, prompts)  # (S, n, L) x3, (S, n)
    n = num_groups * G
    created = np.empty((S, n), dtype=np.int64)  # filled by broadcasting: a version per seed (S,) or one for all
    created[...] = np.asarray(version).reshape(-1, 1) if np.ndim(version) else version
    group = np.empty((S, n), dtype=np.int64)
    group[...] = group_offset + np.repeat(np.arange(num_groups), G)
    return score(config, prompts, tokens, mask, logp, reward, created, group)


@dataclass(frozen=True)
class PipelineSettings:
    """How rollouts are produced and priced; the simulator's config has these fields, the validator uses sync."""

    pipeline: str = "sync"
    mu: float = 5.28
    workers: float = 6.0
    trainers: float = 2.0
    sync_interval: int = 1
    total_steps: int = 1  # updates in the run (FreshPER's beta schedule)


class Pipeline:
    """Owns the buffer, each step's training batch and the compute accounting, for S seeds (S = 1 for the LM)."""

    def __init__(self, config: DesignConfig, backend: RolloutBackend, rng, num_seeds: int,
                 settings: PipelineSettings = PipelineSettings(), token_dtype: type = np.int16):
        self.config, self.backend, self.rng, self.settings = config, backend, rng, settings
        self.num_seeds = num_seeds
        self.design = BUFFER_DESIGNS[config.buffer]
        spec = BufferSpec(num_seeds, backend.seq_len, backend.num_prompts, token_dtype)
        self.buffer: ReplayBuffer | None = make_design_buffer(config, spec)
        self.group_counter = 0
        self.worker_weights = None
        self.worker_version = 0
        self.carry = 0.0
        self.in_flight: RolloutBatch | None = None  # async: what the workers generated during the last step
        self.prefill_generated = 0  # async: responses generated before the first update
        self.state: dict[str, np.ndarray | float] = {}  # per-design running totals (ExGRPO's questions)
        self.compute = np.zeros(num_seeds)  # (S,) compute so far, rollout-cost units
        self.k_training = 0.0
        self.k_inference = 0.0

    # ----------------------------------------------------------------- what designs call

    def generate(self, weights, num_groups: int, version) -> RolloutBatch:
        batch = generate(self.backend, self.config, weights, num_groups, version, self.group_counter, self.rng)
        self.group_counter += num_groups
        return batch

    def fresh_rollouts(self, step: int, weights, *, on_policy: bool = False) -> RolloutBatch | None:
        """This step's fresh responses: R from the current weights (sync), or what the async workers delivered.

        Async (experience-replay Sec. 2), with real lag: the workers hold weights synced every
        ``sync_interval`` steps; what they generate during step t (with the weights of the last sync
        <= t) reaches the trainer at step t + 1, so a response is at least one update stale when first
        used. They produce B W / (T mu) responses per update (G per group; fractions of a group carry
        over, so every (W, T) split runs); the on-policy queue (W/T = mu) produces B per update and
        each is used once. Before the first update the workers fill one batch from theta_0 (the
        pipeline's start-up, counted as generated compute).
        """
        config, settings, G = self.config, self.settings, self.config.group_size
        if settings.pipeline == "sync":
            return self.generate(weights, config.rollouts_per_step // G, step)
        arrived = self.in_flight
        if step == 0:  # start-up: the trainer waits for one batch of the base policy
            arrived = self.generate(weights, math.ceil(config.batch_size / G), 0)
            self.prefill_generated = arrived.size
        if step % settings.sync_interval == 0:
            self.worker_weights, self.worker_version = self.backend.snapshot(weights), step  # weight sync
        if on_policy:
            num_groups = math.ceil(config.batch_size / G)  # queue at W/T = mu: each rollout used once
        else:
            self.carry += config.batch_size * settings.workers / (settings.trainers * settings.mu) / G
            num_groups = int(self.carry)
            self.carry -= num_groups
        self.in_flight = (self.generate(self.worker_weights, num_groups, self.worker_version) if num_groups
                          else None)
        return arrived

    def sample_responses(self, weights, prompts: np.ndarray):
        return self.backend.sample(weights, prompts)

    def score(self, prompts, tokens, mask, logp_behav, reward, created, group) -> RolloutBatch:
        return score(self.config, prompts, tokens, mask, logp_behav, reward, created, group)

    def entropy_fn(self, weights):
        """Mean token entropy (S, m) over real tokens under ``weights``: ExGRPOBuffer.sample's entropy_fn."""

        def entropy(prompts: np.ndarray, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
            h = self.backend.entropy(weights, prompts, tokens, mask)  # (S, m, L)
            return np.where(mask, h, 0.0).sum(axis=-1) / np.maximum(mask.sum(axis=-1), 1)

        return entropy

    # ----------------------------------------------------------------- what loops call

    def next_batch(self, step: int, weights) -> StepBatch:
        """The training batch of ``step`` (and the responses generated for it)."""
        return self.design.step(self, step, weights)

    def next_batch_overlapped(self, step: int, weights, generation_weights,
                              update: Callable[[StepBatch], UpdateT]) -> tuple[StepBatch, UpdateT]:
        """``next_batch`` and the update of ``step`` together, this step's generation (on ``generation_weights``, a
        copy of ``weights``) beside the update: a k-step-off trainer with generation overlapped
        (``core.designs.stale_k_overlapped``; the same numbers as ``next_batch`` then the update)."""
        if self.config.buffer != "stale-k" or self.settings.pipeline != "sync":
            raise ValueError(f"generation overlaps the update only in stale-k designs on the sync pipeline (each "
                             f"batch trained k >= 1 updates after it is generated), got buffer {self.config.buffer} "
                             f"on the {self.settings.pipeline} pipeline")
        return stale_k_overlapped(self, step, weights, generation_weights, update)

    def after_update(self, step: int, data: StepBatch) -> dict[str, np.ndarray]:
        """Buffer bookkeeping after the update (RLOO adds its fresh groups, ExGRPO records groups); extra curves."""
        if self.design.after_update is None:
            return {}
        return self.design.after_update(self, step, data) or {}

    def account(self, data: StepBatch) -> np.ndarray:
        """Charge this step's compute (Eqs. 1-2); returns the running total (S,)."""
        settings = self.settings
        trained = data.train.size
        self.k_training += trained
        generated = data.generated  # an int, or (S,) where seeds differ
        self.k_inference += float(generated) if isinstance(generated, int) else float(np.mean(generated))
        if settings.pipeline == "async":
            ratio = settings.mu if self.config.buffer == "on-policy" else settings.workers / settings.trainers
            self.compute += trained * (1.0 + ratio)  # Eq. (1) / text before Eq. (2): C(1 + W/T), C = B
            self.compute += settings.mu * self.prefill_generated  # the start-up batch, charged once
            self.prefill_generated = 0
        else:
            self.compute += settings.mu * data.generated + trained  # rollout-cost convention: c = mu R + B
        return self.compute

    def counts(self) -> dict[str, float]:
        """K_training, K_inference, the compute ratio against on-policy and (async) the App. E mu estimate."""
        settings, k_training, k_inference = self.settings, self.k_training, self.k_inference
        out = {"K_training": k_training, "K_inference": k_inference}
        if settings.pipeline == "async":
            on_policy = self.config.buffer == "on-policy"
            ratio = settings.mu if on_policy else settings.workers / settings.trainers
            out["compute_ratio"] = compute_ratio_from_split_ratio(ratio, settings.mu)  # Eq. (2)
            workers = settings.mu * settings.trainers if on_policy else settings.workers
            out["mu_estimate"] = estimate_mu(k_training, k_inference, workers, settings.trainers)  # App. E
        else:
            on_policy = (settings.mu + 1) * k_training  # same number of updates, each on fresh rollouts
            out["compute_ratio"] = float(self.compute.mean() / on_policy)
        if self.design.final_counts is not None:
            out.update(self.design.final_counts(self))
        return out

    def evicted_use_counts(self) -> np.ndarray:
        """Use count of every response that left the buffer (global diversity, experience-replay Sec. 2)."""
        if self.buffer is None:
            return np.zeros(0)
        return np.asarray(self.buffer.evicted_use_counts())


class UsageRecord:
    """Histograms of staleness and time since last use over every trained sample (experience-replay Fig. 2)."""

    def __init__(self):
        self.staleness_counts = np.zeros(1, np.int64)
        self.time_since_last_use_counts = np.zeros(1, np.int64)

    @staticmethod
    def add_hist(hist: np.ndarray, values: np.ndarray) -> np.ndarray:
        """``hist`` plus the counts of the values >= 0 (negative ones are 'none': a first use's -1)."""
        low = int(values.min()) if values.size and values.dtype.kind == "i" else None
        if low is not None and low >= -1:  # integers: no copy of the kept values (a first use's -1: bins offset by 1)
            counts = np.bincount(values) if low >= 0 else np.bincount(values + 1)[1:]
        else:
            values = values[values >= 0].astype(np.int64)
            if values.size == 0:
                return hist
            counts = np.bincount(values)
        if counts.size == 0:  # only -1s
            return hist
        if counts.size > hist.size:
            hist = np.pad(hist, (0, counts.size - hist.size))
        hist[: counts.size] += counts
        return hist

    def add(self, data: StepBatch) -> None:
        self.add_uses(data.staleness, data.time_since_last_use)

    def add_uses(self, staleness: np.ndarray, time_since_last_use: np.ndarray) -> None:
        """The uses of ``add`` as arrays of any shape (counts only: several steps' uses may come at once)."""
        self.staleness_counts = self.add_hist(self.staleness_counts, staleness.ravel())
        self.time_since_last_use_counts = self.add_hist(self.time_since_last_use_counts, time_since_last_use.ravel())

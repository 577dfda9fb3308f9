"""Schedules that reuse nothing across generations: M2PO's stale-k queue (Sec. 3) and epochs over mini-batches
(PPO epochs, TRL num_iterations, verl ppo_epochs; issue 40, docs/THEORY.md [E1]-[E3])."""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from ..rng import RandomSource
from ..rollouts import RolloutBatch
from .base import (
    ReplayBuffer,
    Sample,
    _int_param,
)

# --- M2PO stale-k --------------------------------------------------------------------------------------


class StaleKQueue(ReplayBuffer):
    """Stale-k FIFO of whole batches (M2PO, Sec. 3): update t trains on the batch generated at update t - k.

    ``push(batch, step)`` stores the batch generated at update ``step``;
    ``pop(step)`` returns the newest batch pushed at a step <= step - k, i.e.
    the one from exactly k pushes earlier when one batch is pushed per update.
    During the first k updates no such batch exists and the OLDEST available
    (the base model's batch) is returned, as in the paper ("the first k
    updates use base-model data"). The reference code instead fills a FIFO of
    k entries before training starts; push k base-model batches before the
    first update to get that (every pop is then exactly k stale, none repeats).
    Batches older than the one returned are dropped. k is in the units of
    ``step``: with one push per model update, k = s; the M2PO reference code
    pushes one batch per training step (= 4 model updates, one mini-batch each)
    into a FIFO of s/4 entries, i.e. k = s/4 training steps, so s = 256 means
    staleness 256-259 updates. As a ``ReplayBuffer``: ``add`` is ``push`` and
    ``sample`` is ``pop`` as a ``Sample`` (the whole stored batch, whatever
    ``batch_size``; weights one, never used before); nothing is replayed, so
    ``evicted_use_counts`` is empty.
    """

    def __init__(self, num_seeds: int, k: int) -> None:
        self.num_seeds = _int_param("num_seeds", num_seeds, 1)
        self.k = _int_param("k", k, 0)
        # the queued batches' push steps and fields, oldest first (at most k + 1): plain ints and arrays, so a
        # trainer's checkpoint saves and restores the queue without pickle (core/state.py builds no object)
        self._steps: list[int] = []
        self._batches: list[dict[str, np.ndarray]] = []
        self.last_step: int | None = None  # generation step of the batch the last pop returned

    def push(self, batch: RolloutBatch, step: int) -> None:
        if batch.num_seeds != self.num_seeds:
            raise ValueError(f"batch has {batch.num_seeds} seeds, queue has num_seeds={self.num_seeds}")
        if self._steps and step <= self._steps[-1]:
            raise ValueError(f"step must increase between pushes, got {step} after {self._steps[-1]}")
        self._steps.append(int(step))
        self._batches.append({f.name: getattr(batch, f.name) for f in fields(RolloutBatch)})

    def pop(self, step: int) -> RolloutBatch:
        if not self._steps:
            raise ValueError("cannot pop from an empty stale-k queue (push a batch first)")
        target = step - self.k
        pos = 0
        for i, s in enumerate(self._steps):  # at most k + 1 entries
            if s <= target:
                pos = i
        del self._steps[:pos], self._batches[:pos]
        self.last_step = self._steps[0]
        return RolloutBatch(**self._batches[0])

    def held_tokens(self, seed: int = 0) -> np.ndarray:
        """The tokens of every queued batch of one seed (items,): what a trainer's rows must still hold."""
        if not self._batches:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([b["tokens"][seed].reshape(-1) for b in self._batches])

    def add(self, batch: RolloutBatch, step: int) -> None:
        self.push(batch, step)

    def sample(self, batch_size: int, step: int, rng: RandomSource) -> Sample:
        batch = self.pop(step)
        shape = batch.prompt.shape  # (S, n)
        return Sample(index=np.broadcast_to(np.arange(shape[1]), shape), weight=np.ones(shape),
                      batch=batch, staleness=step - batch.created, time_since_last_use=np.full(shape, -1))

    def evicted_use_counts(self) -> np.ndarray:
        return np.zeros(0)

    def __len__(self) -> int:
        return len(self._steps)


# --- epochs over mini-batches (PPO epochs, TRL num_iterations, verl ppo_epochs) --------------------------------


class EpochSchedule(ReplayBuffer):
    """One generation of R rollouts trained in e epochs over m mini-batches of b = R / m: e m updates, then the next.

    PPO's epochs; TRL's ``num_iterations`` (e) x ``steps_per_generation`` (m); verl's ``actor.ppo_epochs`` (e) over
    ``data.train_batch_size / actor.ppo_mini_batch_size`` (m). The linear model's psi_E of this schedule is
    ``theory.reuse_families.psi_epochs``.

    Update j of a generation (j = 0 .. e m - 1, the ``sample`` calls since ``add``) trains on mini-batch j mod m of
    epoch j div m: the rollouts at positions ``order[(j mod m) b : (j mod m + 1) b]`` of that epoch's order.
    Fixed order (``shuffle=False``): one permutation per generation, drawn at its first update and kept for every
    epoch (TRL shuffles the generation batch once and replays the same slices; verl's FSDP actor splits it once), so
    a rollout's uses are exactly m updates apart. ``shuffle=True``: a new permutation at the start of every epoch
    (textbook PPO, verl's Megatron workers). A permutation is ``argsort`` of R uniforms per seed (``rng.random``).
    With m = 1 no permutation is drawn (the mini-batch is the whole generation, its order changes nothing): the
    rollouts stay in generation order and no random number is used, so e = m = 1 is the on-policy design, draw
    for draw. Every rollout is used exactly e times per generation; ``evicted_use_counts`` holds those counts for
    each generation ``add`` replaced. ``due()``: no generation yet, or its e m updates are done.
    """

    def __init__(self, num_seeds: int, epochs: int, mini_batches: int, shuffle: bool = False) -> None:
        self.num_seeds = _int_param("num_seeds", num_seeds, 1)
        self.epochs = _int_param("epochs", epochs, 1)
        self.mini_batches = _int_param("mini_batches", mini_batches, 1)
        self.shuffle = bool(shuffle)
        self.batch: RolloutBatch | None = None  # (S, R) the current generation
        self.position = 0  # updates of the current generation so far (j)
        self.order: np.ndarray | None = None  # (S, R) the current epoch's order of the generation's positions
        self.use_count = np.zeros((self.num_seeds, 0), dtype=np.int64)  # (S, R) uses in this generation
        self.last_used = np.zeros((self.num_seeds, 0), dtype=np.int64)  # (S, R) step of the last use, -1 = never
        self._evicted: list[np.ndarray] = []

    @property
    def updates_per_generation(self) -> int:
        """e m."""
        return self.epochs * self.mini_batches

    def due(self) -> bool:
        """True when the next update needs a new generation: none yet, or the current one's e m updates are done."""
        return self.batch is None or self.position >= self.updates_per_generation

    def add(self, batch: RolloutBatch, step: int) -> None:
        """Start a new generation (the previous one leaves, its use counts recorded)."""
        if batch.num_seeds != self.num_seeds:
            raise ValueError(f"batch has {batch.num_seeds} seeds, schedule has num_seeds={self.num_seeds}")
        if batch.size % self.mini_batches:
            raise ValueError(f"a generation of {batch.size} rollouts does not split into mini_batches = "
                             f"{self.mini_batches} equal mini-batches")
        if self.batch is not None:
            self._evicted.append(self.use_count.ravel().copy())
        self.batch, self.position, self.order = batch, 0, None
        self.use_count = np.zeros(batch.prompt.shape, dtype=np.int64)
        self.last_used = np.full(batch.prompt.shape, -1, dtype=np.int64)

    def _permutation(self, rng: RandomSource, size: int) -> np.ndarray:
        """(S, size): an order of the generation's positions per seed; the identity (no draw) when m = 1."""
        if self.mini_batches == 1:
            return np.broadcast_to(np.arange(size), (self.num_seeds, size))
        return np.argsort(rng.random((self.num_seeds, size)), axis=1, kind="stable")

    def sample(self, batch_size: int, step: int, rng: RandomSource) -> Sample:
        """The next update's mini-batch: positions (S, b) of the generation, staleness = step - generation step."""
        if self.batch is None:
            raise ValueError("cannot sample before a generation is added")
        if self.due():
            raise ValueError(f"the generation's {self.updates_per_generation} updates are done (add the next one)")
        R, m = self.batch.size, self.mini_batches
        b = R // m
        if batch_size != b:
            raise ValueError(f"batch_size must be rollouts / mini_batches = {R} / {m} = {b}, got {batch_size}")
        epoch, part = divmod(self.position, m)
        if self.order is None or (part == 0 and self.shuffle):  # a generation's first update; each epoch's if shuffled
            self.order = self._permutation(rng, R)
        index = self.order[:, part * b:(part + 1) * b]  # (S, b)
        batch = self.batch if m == 1 else self.batch.take(index)
        last = np.take_along_axis(self.last_used, index, axis=1)
        since = np.where(last >= 0, step - last, -1)
        rows = np.arange(self.num_seeds)[:, None]
        self.use_count[rows, index] += 1  # a position appears once per mini-batch
        self.last_used[rows, index] = step
        self.position += 1
        return Sample(index=np.asarray(index), weight=np.ones(index.shape), batch=batch,
                      staleness=step - batch.created, time_since_last_use=since)

    def __len__(self) -> int:
        return 0 if self.batch is None else self.batch.size

    def evicted_use_counts(self) -> np.ndarray:
        if not self._evicted:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate(self._evicted)

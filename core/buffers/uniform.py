"""The experience-replay paper's uniform buffers (Sec. 3, Sec. 4.3): FIFO, positive-bias; and the selective FIFO
that admits only groups with a non-zero advantage (issue 40, docs/THEORY.md [E8])."""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from ...checks import require_unit_interval
from ..metrics import zero_std_groups
from ..rng import RandomSource
from ..rollouts import RolloutBatch
from .base import (
    Sample,
    SlotBuffer,
    _int_param,
    _smallest_keys,
)

# --- uniform buffers (experience-replay paper) -----------------------------------------------------


class _UniformBuffer(SlotBuffer):
    """Uniform sampling among the valid items, with or without replacement.

    Random numbers, drawn up front in one call ``rng.random(uniform_shape(B))``:

    * with replacement: u (S, B); draw j picks the floor(u_j n)-th valid slot
      (valid slots in slot order), n = filled size;
    * without replacement (``random.sample``): u (S, capacity), one key per
      slot; the B valid slots with the smallest keys, in key order.
    """

    def __init__(self, num_seeds: int, capacity: int, seq_len: int, replacement: bool = True, *,
                 token_dtype: np.dtype | type = np.int16, logp_dtype: np.dtype | type = np.float64) -> None:
        super().__init__(num_seeds, capacity, seq_len, token_dtype=token_dtype, logp_dtype=logp_dtype)
        self.replacement = bool(replacement)
        self._order: np.ndarray | None = None
        self._prefix_valid = False  # True when the valid slots are always 0..size-1 (FIFO)

    def uniform_shape(self, batch_size: int) -> tuple[int, int]:
        """Shape of the uniforms one ``sample(batch_size, ...)`` call draws."""
        return (self.num_seeds, batch_size) if self.replacement else (self.num_seeds, self.capacity)

    def select(self, u: np.ndarray, batch_size: int) -> np.ndarray:
        """Slots (S, B) from uniforms ``u`` of shape ``uniform_shape(B)``; records nothing."""
        if self.replacement:
            n = self.size[:, None]  # (S, 1)
            j = np.minimum((u * n).astype(np.int64), n - 1)  # Sec. 3: uniform with replacement
            if self._prefix_valid:
                return j  # FIFO ring: the filled slots are 0..n-1
            if self._order is None:
                self._order = np.argsort(~self.valid, axis=1, kind="stable")  # valid slots first, in slot order
            return np.take_along_axis(self._order, j, axis=1)
        keys = np.where(self.valid, u, np.inf)  # (S, capacity)
        return _smallest_keys(keys, batch_size)  # App. B.5: random.sample(buffer, B)

    def sample(self, batch_size: int, step: int, rng: RandomSource) -> Sample:
        B = batch_size if type(batch_size) is int and batch_size >= 1 else _int_param("batch_size", batch_size, 1)
        self._require_nonempty()
        if not self.replacement and B > int(self.size.min()):
            raise ValueError(
                f"batch_size={B} exceeds the {int(self.size.min())} filled slots (capacity={self.capacity}); "
                f"sampling without replacement needs batch_size <= filled size <= capacity"
            )
        u = rng.random(self.uniform_shape(B))
        index = self.select(u, B)
        return self._finish_sample(index, np.ones(index.shape), step)


class FifoBuffer(_UniformBuffer):
    """FIFO buffer of the N freshest rollouts with uniform sampling (experience-replay paper).

    Sec. 3 (theory): each step R rollouts are pushed into a FIFO of capacity N
    and B are drawn uniformly WITH replacement; sampling does not remove.
    ``replacement=False`` is App. B.5's ``random.sample(buffer, B)`` (then
    B > filled size raises). Eviction is FIFO (App. B.5 ``buffer.pop(0)``).
    Steady state with N = kR (add, then sample, each step): mean staleness
    (N/R - 1)/2 and mean uses per rollout B/R (the replay ratio y = B/R).
    """

    def __init__(self, num_seeds: int, capacity: int, seq_len: int, replacement: bool = True, *,
                 token_dtype: np.dtype | type = np.int16, logp_dtype: np.dtype | type = np.float64) -> None:
        super().__init__(num_seeds, capacity, seq_len, replacement, token_dtype=token_dtype, logp_dtype=logp_dtype)
        self._ptr = 0
        self._prefix_valid = True  # the ring fills slots 0, 1, ... and never frees one
        self._filled = 0

    @property
    def size(self) -> np.ndarray:
        """Filled items per seed, (S,): the ring's fill, the same for every seed (= valid.sum(axis=1))."""
        return np.full(self.num_seeds, self._filled, dtype=np.int64)

    def add(self, batch: RolloutBatch, step: int) -> None:
        self._check_batch(batch)
        self._ring_write(batch)
        self._filled = min(self._filled + batch.size, self.capacity)
        self._order = None


class SelectiveFifoBuffer(FifoBuffer):
    """A FIFO of N that admits only the groups whose rewards are not all equal, B drawn uniformly with replacement.

    Selective replay, "dropped before the buffer" (docs/THEORY.md [E8]): a group of equal rewards has zero
    group-relative advantage and buys no gradient, so it never enters; (1 - z) R responses enter per step (z: the
    share of such groups, ``core.metrics.zero_std_groups``), the horizon is x = N / ((1 - z) R) and the mean sampled
    staleness about (x - 1) / 2. How many enter differs by seed, so each seed keeps its own ring pointer and fill
    (the FIFO's are shared); ``admitted`` (S,) is the last ``add``'s count. Groups are runs of one ``group`` id.

    Empty start: until a seed's first unequal group arrives its buffer is empty and its update is SKIPPED: ``sample``
    gives that seed B of the responses last offered to ``add`` (all in equal-reward groups, so zero advantage) with
    weight 0 and ``valid`` False (no use recorded). Weight 0 makes the skip exact for every loss (a shifted baseline,
    AsymRE's, would otherwise move it on them) while the seeds stay in step. One draw of ``rng.random((S, B))`` per
    call, as ``FifoBuffer``'s: with no equal-reward group (z = 0) every seed admits all R and the draws, slots and
    batches are the FIFO's, number for number.
    """

    def __init__(self, num_seeds: int, capacity: int, seq_len: int, *,
                 token_dtype: np.dtype | type = np.int16, logp_dtype: np.dtype | type = np.float64) -> None:
        super().__init__(num_seeds, capacity, seq_len, True, token_dtype=token_dtype, logp_dtype=logp_dtype)
        self._ptr = np.zeros(self.num_seeds, dtype=np.int64)  # (S,) next ring slot, per seed
        self._fill = np.zeros(self.num_seeds, dtype=np.int64)  # (S,) filled slots 0..fill-1 (the ring never frees)
        self.admitted = np.zeros(self.num_seeds, dtype=np.int64)  # (S,) responses the last add let in
        # the last batch offered, an empty seed's placeholder rows: its fields by name (a saved state restores a dict
        # of arrays into a fresh buffer, and never builds an object the file names: core/state.py)
        self._offered: dict[str, np.ndarray] | None = None

    @property
    def size(self) -> np.ndarray:
        return self._fill.copy()

    def add(self, batch: RolloutBatch, step: int) -> None:
        self._check_batch(batch)
        if batch.size > self.capacity:
            raise ValueError(f"a batch of {batch.size} rollouts exceeds capacity={self.capacity}; capacity must be "
                             f">= rollouts per step")
        equal, _ = zero_std_groups(batch.reward, batch.group)  # (S, n)
        keep = ~equal  # [E8]: only groups with a non-zero advantage enter
        rank = np.cumsum(keep, axis=1) - 1  # (S, n) order among the seed's admitted responses
        rows, items = np.nonzero(keep)
        slots = (self._ptr[rows] + rank[rows, items]) % self.capacity  # each seed's own ring, FIFO order
        self._evict(rows, slots)
        self.store.write(rows, slots, batch, items)
        self._reset(rows, slots)
        self.admitted = keep.sum(axis=1)
        self._ptr = (self._ptr + self.admitted) % self.capacity
        self._fill = np.minimum(self._fill + self.admitted, self.capacity)
        self._offered = {f.name: getattr(batch, f.name) for f in fields(RolloutBatch)}
        self._order = None

    def sample(self, batch_size: int, step: int, rng: RandomSource) -> Sample:
        B = _int_param("batch_size", batch_size, 1)
        if self._offered is None:
            raise ValueError("cannot sample before a batch is offered (add rollouts first)")
        u = rng.random((self.num_seeds, B))  # Sec. 3: uniform with replacement, as FifoBuffer draws
        n = self._fill[:, None]  # (S, 1)
        index = np.minimum((u * n).astype(np.int64), np.maximum(n - 1, 0))  # an empty seed: slot 0, a placeholder
        empty = self._fill == 0  # (S,)
        if not empty.any():
            return self._finish_sample(index, np.ones(index.shape), step)
        valid = np.broadcast_to(~empty[:, None], index.shape)
        out = self._finish_sample(index, valid.astype(float), step, valid)  # weight 0: the skipped update
        offered = RolloutBatch(**self._offered)
        pick = np.minimum((u * offered.size).astype(np.int64), offered.size - 1)  # (S, B) of the offered responses
        placeholder = offered.take(pick)
        out.batch = RolloutBatch(**{
            f.name: np.where(empty.reshape((-1,) + (1,) * (getattr(out.batch, f.name).ndim - 1)),
                             getattr(placeholder, f.name), getattr(out.batch, f.name))
            for f in fields(RolloutBatch)})
        out.staleness = step - out.batch.created
        out.time_since_last_use = np.where(empty[:, None], -1, out.time_since_last_use)
        return out


class PositiveBiasBuffer(_UniformBuffer):
    """Positive-bias buffer (experience-replay paper, Sec. 4.3), uniform sampling among the kept rollouts.

    Keeps the freshest (1 - delta) N rollouts plus the freshest delta N CORRECT
    (reward == 1) rollouts not among them. Layout: a FIFO ring of n_fresh =
    round_half_up((1 - delta) N) slots followed by a per-seed ring of n_pos =
    N - n_fresh slots. A rollout pushed out of the fresh ring moves to the
    positive ring if it is correct (displacing the oldest kept correct rollout),
    otherwise it is evicted; rollouts leave the fresh ring in creation order, so
    the positive ring holds exactly the freshest n_pos correct rollouts older
    than the fresh window. delta = 0 is the plain FIFO buffer. Use counts travel
    with a rollout that moves. Fewer than n_pos correct rollouts leave the
    positive ring partly empty (the buffer then holds fewer than N).
    """

    def __init__(self, num_seeds: int, capacity: int, seq_len: int, delta: float, replacement: bool = True, *,
                 correct_reward: float = 1.0, token_dtype: np.dtype | type = np.int16,
                 logp_dtype: np.dtype | type = np.float64) -> None:
        super().__init__(num_seeds, capacity, seq_len, replacement, token_dtype=token_dtype, logp_dtype=logp_dtype)
        self.delta = require_unit_interval("delta", delta, closed=False)
        self.n_fresh = int(np.floor((1.0 - self.delta) * self.capacity + 0.5))  # Sec. 4.3: (1 - delta) N
        if self.n_fresh < 1:
            raise ValueError(
                f"delta must leave at least one fresh slot ((1 - delta) * capacity >= 0.5), got delta={delta!r}"
            )
        self.n_pos = self.capacity - self.n_fresh  # Sec. 4.3: delta N correct rollouts
        self.correct_reward = float(correct_reward)
        self._ptr = 0  # fresh ring, shared by the seeds
        self._pos_ptr = np.zeros(self.num_seeds, dtype=np.int64)  # positive ring, per seed

    def add(self, batch: RolloutBatch, step: int) -> None:
        self._check_batch(batch)
        for start in range(0, batch.size, self.n_fresh):  # chunks no larger than the fresh ring
            self._add_chunk(batch, np.arange(start, min(batch.size, start + self.n_fresh)))
        self._order = None

    def _add_chunk(self, batch: RolloutBatch, items: np.ndarray) -> None:
        m = items.shape[0]
        slots = (self._ptr + np.arange(m)) % self.n_fresh  # (m,) oldest first once the ring is full
        if self.n_pos > 0:
            leaving = self.valid[:, slots]  # (S, m)
            correct = leaving & (self.store.reward[:, slots] == self.correct_reward)  # Sec. 4.3: correct = reward 1
            rank = np.cumsum(correct, axis=1) - 1  # creation order among the correct leavers
            n_correct = correct.sum(axis=1)  # (S,)
            skip = np.maximum(n_correct - self.n_pos, 0)[:, None]  # only the freshest n_pos can stay
            move = correct & (rank >= skip)
            dst = self.n_fresh + (self._pos_ptr[:, None] + rank - skip) % self.n_pos  # (S, m)
            s_idx, i_idx = np.nonzero(move)
            d, src = dst[s_idx, i_idx], slots[i_idx]
            self._evict(s_idx, d)  # the oldest kept correct rollouts make room
            self.store.move(s_idx, d, src)
            for arr in (self.use_count, self.last_used, self.valid):
                arr[s_idx, d] = arr[s_idx, src]
            self.valid[s_idx, src] = False  # moved, not evicted
            self._pos_ptr = (self._pos_ptr + np.minimum(n_correct, self.n_pos)) % self.n_pos
        cols = slots[None, :]
        self._evict(self._rows, cols)  # the wrong (or surplus) rollouts leave the buffer
        self.store.write(self._rows, cols, batch, items[None, :])
        self._reset(self._rows, cols)
        self._ptr = (self._ptr + m) % self.n_fresh

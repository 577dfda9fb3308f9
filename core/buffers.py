"""Replay buffers for S seeds at once: FIFO, selective FIFO, positive-bias, FreshPER, group replay, ExGRPO, stale-k,
epochs.

The simulator's one stateful part (the validator and trainers use it with S = 1): numpy, seed axis first, randomness
only from an explicit ``rng``.  Conventions (add, then sample; use records; dtypes): ``SlotBuffer``, ``RolloutStore``.

| class                 | paper (docs/REFERENCES.md)                            | section / equation                  |
|-----------------------|--------------------------------------------------------|-------------------------------------|
| ``FifoBuffer``        | experience-replay                                      | Sec. 3 (uniform, with replacement), |
|                       |                                                        | App. B.5 ``random.sample`` (without)|
| ``SelectiveFifoBuffer``| selective replay (groups with a non-zero advantage)   | docs/THEORY.md [E8], issue 40       |
| ``PositiveBiasBuffer``| experience-replay                                      | Sec. 4.3 positive-bias sampling     |
| ``PrioritizedBuffer`` | FreshPER (arXiv:2604.16918)                            | Eqs. (2), (14), (15), Alg. 1, 3.5   |
| ``GroupReplayBuffer`` | RLOO group replay                                      | Sec. 3.2, App. B                    |
| ``ExGRPOBuffer``      | ExGRPO                                                 | Sec. 4, Algs. 1-2                   |
| ``StaleKQueue``       | M2PO                                                   | Sec. 3 stale-k setup                |
| ``EpochSchedule``     | PPO epochs (TRL num_iterations, verl ppo_epochs)       | issue 40, docs/THEORY.md [E1]-[E3]  |

| code name               | paper symbol           | meaning                                                   |
|-------------------------|------------------------|-----------------------------------------------------------|
| ``capacity``            | N                      | rollouts kept (FIFO / positive bias / PER)                |
| ``batch_size``          | B                      | rollouts sampled per update                               |
| R (rollouts per add)    | R                      | rollouts generated per step                               |
| ``staleness``           | t - t_i                | off-policiness of a sampled rollout                       |
| ``use_count``           | replay count           | global diversity (exp.-replay Sec. 2)                     |
| ``time_since_last_use`` | time since last use    | local diversity (exp.-replay Sec. 2)                      |
| ``delta``               | delta                  | positive-bias fraction                                    |
| ``alpha, beta, tau``    | alpha, beta, tau       | FreshPER exponents and age-decay constant                 |
| ``max_age``             | L                      | group replay: eligible ages 1..L                          |
| ``group_size``          | K                      | responses per group                                       |
| ``rho``                 | rho                    | replay proportion (RLOO: per fresh group; ExGRPO: of B)   |
| ``k``                   | s (M2PO)               | stale-k delay, in the units of ``step``                   |
| ``epochs, mini_batches``| e, m                   | passes over a generation, updates per pass (b = R / m)    |
| ``admitted``            | (1 - z) R              | selective FIFO: responses of unequal-reward groups let in |
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, fields
from typing import Callable, Literal

import numpy as np

from ..checks import require_int, require_one_of, require_positive, require_unit_interval
from ..theory import exgrpo as _exgrpo
from ..theory import freshper as _freshper
from ..theory import group_replay as _group_replay
from .metrics import zero_std_groups
from .rng import PerSeedGenerator, RandomSource
from .rollouts import RolloutBatch
from .sumtree import SumTree

__all__ = [
    "Sample",
    "RolloutStore",
    "ReplayBuffer",
    "SlotBuffer",
    "FifoBuffer",
    "SelectiveFifoBuffer",
    "PositiveBiasBuffer",
    "PrioritizedBuffer",
    "PER_BASES",
    "GroupReplayBuffer",
    "ExGRPOBuffer",
    "UniformQuestionBuffer",
    "StaleKQueue",
    "EpochSchedule",
]

EntropyFn = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]

# dtypes of a RolloutBatch handed back to callers (see core.rollouts)
_BATCH_DTYPES = {
    "prompt": np.int64,
    "tokens": np.int64,
    "mask": np.bool_,
    "logp_behav": np.float64,
    "reward": np.float64,
    "advantage": np.float64,
    "created": np.int64,
    "group": np.int64,
}


def _int_param(name: str, value: object, minimum: int) -> int:
    return int(require_int(name, value, minimum))


def _smallest_keys(keys: np.ndarray, m: int) -> np.ndarray:
    """Column indices (S, m) of the m smallest keys per row, ordered by key (ties: lower index first)."""
    S, n = keys.shape
    if m == 0:
        return np.zeros((S, 0), dtype=np.int64)
    part = np.argpartition(keys, m - 1, axis=1)[:, :m] if m < n else np.tile(np.arange(n), (S, 1))
    order = np.argsort(np.take_along_axis(keys, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def _take_slots(arr: np.ndarray, cells: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """arr (S, C, ...) at flat (seed, slot) indices ``cells`` (k,), reshaped to ``shape + arr.shape[2:]``."""
    return np.take(arr.reshape((-1,) + arr.shape[2:]), cells, axis=0).reshape(shape + arr.shape[2:])


# --- samples and storage ---------------------------------------------------------------------------


@dataclass
class Sample:
    """What ``sample`` returns. All (S, B) arrays share the item axis of ``batch`` except for groups.

    ``index``: slots into the buffer's store; ``weight``: importance / bias-correction
    weights (ones unless the sampler defines them); ``batch``: the sampled rollouts
    (S, B, ...); ``staleness``: step - created; ``time_since_last_use``: steps since
    the slot was last sampled before this call, -1 on first use; ``valid``: None
    when every entry is real, else (S, B) bool (ExGRPO pads seeds that have fewer
    questions than asked with ``valid = False``). For ``GroupReplayBuffer`` the
    (S, B) arrays are per GROUP and ``batch`` holds the B*K responses.
    """

    index: np.ndarray
    weight: np.ndarray
    batch: RolloutBatch
    staleness: np.ndarray
    time_since_last_use: np.ndarray
    valid: np.ndarray | None = None


class RolloutStore:
    """Preallocated structure-of-arrays store: one (S, capacity, ...) array per RolloutBatch field.

    Tokens take a ``token_dtype`` (default int16; ``write`` raises if a token does not fit) and behaviour log-probs
    a ``logp_dtype``: float64 (default) or float32, whose relative error 2^-24 per token log-prob puts a summed
    sequence log-prob of L = 32 tokens with |log p| <= 10 off by at most ~2e-5 (a sequence ratio off by a factor
    exp(2e-5)). Sampled batches come back with the ``RolloutBatch`` dtypes (int64 tokens, float64 log-probs).
    """

    def __init__(self, num_seeds: int, capacity: int, seq_len: int,
                 token_dtype: np.dtype | type = np.int16, logp_dtype: np.dtype | type = np.float64) -> None:
        S, C, L = num_seeds, capacity, seq_len
        self.token_dtype = np.dtype(token_dtype)
        self.logp_dtype = np.dtype(logp_dtype)
        if not np.issubdtype(self.token_dtype, np.integer):
            raise ValueError(f"token_dtype must be an integer dtype (int8/int16/int32/int64), got {self.token_dtype}")
        if self.logp_dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"logp_dtype must be float32 or float64, got {self.logp_dtype}")
        self.prompt = np.zeros((S, C), dtype=np.int64)  # (seeds, slots)
        self.tokens = np.zeros((S, C, L), dtype=self.token_dtype)  # (seeds, slots, L)
        self.mask = np.zeros((S, C, L), dtype=bool)  # (seeds, slots, L)
        self.logp_behav = np.zeros((S, C, L), dtype=self.logp_dtype)  # (seeds, slots, L)
        self.reward = np.zeros((S, C))  # (seeds, slots)
        self.advantage = np.zeros((S, C))  # (seeds, slots)
        self.created = np.zeros((S, C), dtype=np.int64)  # (seeds, slots)
        self.group = np.zeros((S, C), dtype=np.int64)  # (seeds, slots)

    def write(self, rows: np.ndarray, slots: np.ndarray, batch: RolloutBatch, items: np.ndarray) -> None:
        """store[rows, slots] = batch[rows, items]; the three index arrays broadcast together."""
        tokens = batch.tokens[rows, items]
        if tokens.size:
            info = np.iinfo(self.token_dtype)
            lo, hi = int(tokens.min()), int(tokens.max())
            if lo < info.min or hi > info.max:
                raise ValueError(
                    f"tokens in [{lo}, {hi}] do not fit token_dtype={self.token_dtype} "
                    f"[{info.min}, {info.max}]; pass a wider token_dtype"
                )
        for f in fields(RolloutBatch):
            getattr(self, f.name)[rows, slots] = getattr(batch, f.name)[rows, items]

    def move(self, rows: np.ndarray, dst: np.ndarray, src: np.ndarray) -> None:
        """store[rows, dst] = store[rows, src] (dst and src disjoint)."""
        for f in fields(RolloutBatch):
            arr = getattr(self, f.name)
            arr[rows, dst] = arr[rows, src]

    def take(self, rows: np.ndarray, slots: np.ndarray) -> RolloutBatch:
        """RolloutBatch of store[rows, slots] with the standard RolloutBatch dtypes (rows and slots broadcast)."""
        cells = rows * self.prompt.shape[1] + slots  # (S, m) index into the flattened (S * capacity) slot axis
        return self.take_cells(cells.ravel(), cells.shape)

    def take_cells(self, cells: np.ndarray, shape: tuple[int, ...]) -> RolloutBatch:
        """``take`` by flat index ``cells`` (k,) into the (S * capacity) slot axis, shaped ``shape`` (S, m).

        One 1-D ``np.take`` per field, not indexing [rows, slots].
        """
        return RolloutBatch(**{
            f.name: _take_slots(getattr(self, f.name), cells, shape).astype(_BATCH_DTYPES[f.name], copy=False)
            for f in fields(RolloutBatch)
        })

    def arrays(self) -> list[np.ndarray]:
        return [getattr(self, f.name) for f in fields(RolloutBatch)]


# --- the interface every buffer implements ---------------------------------------------------------


class ReplayBuffer(ABC):
    """What every buffer does, whatever it stores: the type the registry's designs and the pipeline hold.

    ``add`` stores the fresh rollouts generated at ``step``; ``sample`` draws a training batch and records its
    use; ``len`` is the smallest per-seed fill; ``evicted_use_counts`` the replay counts of what has left
    (global diversity, experience-replay Sec. 2). Every class below implements it, ``StaleKQueue`` included.
    """

    num_seeds: int

    @abstractmethod
    def add(self, batch: RolloutBatch, step: int) -> None:
        """Store a batch of fresh rollouts generated at ``step``."""

    @abstractmethod
    def sample(self, batch_size: int, step: int, rng: RandomSource) -> Sample:
        """Draw a batch and record its use."""

    @abstractmethod
    def __len__(self) -> int:
        """Smallest per-seed fill."""

    @abstractmethod
    def evicted_use_counts(self) -> np.ndarray:
        """Replay counts of every item that has left the buffer (all seeds, flat, eviction order)."""


class SlotBuffer(ReplayBuffer):
    """Common state: a RolloutStore plus per-item ``use_count``, ``last_used`` (-1 = never), ``valid``.

    Items are rollouts, except in ``GroupReplayBuffer`` where they are groups of
    K responses (``store_capacity = capacity * K``).

    Within one step a caller ADDS the fresh rollouts, then SAMPLES. A rollout
    created at step t and sampled at step t has staleness 0, so with R rollouts
    per step and N = kR the buffer holds ages 0..k-1 and the mean sampled
    staleness is (N/R - 1)/2 (exp.-replay Sec. 3). Group replay is the
    exception: it samples replay groups BEFORE adding the fresh ones (RLOO App. B).
    ``sample`` records the use after the whole batch is drawn: a slot drawn twice
    in one batch (with replacement) reports the same ``time_since_last_use`` for
    both draws and gets ``use_count += 2``. Every buffer is vectorised over seeds
    except ExGRPO's question sampling (Alg. 2's per-bucket draws).
    """

    def __init__(self, num_seeds: int, capacity: int, seq_len: int, *,
                 token_dtype: np.dtype | type = np.int16, logp_dtype: np.dtype | type = np.float64,
                 store_capacity: int | None = None) -> None:
        self.num_seeds = _int_param("num_seeds", num_seeds, 1)
        self.capacity = _int_param("capacity", capacity, 1)
        self.seq_len = _int_param("seq_len", seq_len, 1)
        S, C = self.num_seeds, self.capacity
        self.store = RolloutStore(S, store_capacity or C, self.seq_len, token_dtype, logp_dtype)
        self.use_count = np.zeros((S, C), dtype=np.int64)  # (seeds, items)
        self.last_used = np.full((S, C), -1, dtype=np.int64)  # (seeds, items), -1 = never sampled
        self.valid = np.zeros((S, C), dtype=bool)  # (seeds, items)
        self._evicted: list[np.ndarray] = []
        self._rows = np.arange(S)[:, None]  # (S, 1)

    # --- interface ---------------------------------------------------------

    @property
    def size(self) -> np.ndarray:
        """Filled items per seed, (S,)."""
        return self.valid.sum(axis=1)

    def __len__(self) -> int:
        """Smallest per-seed fill: the fill itself for S = 1 and for FIFO / PER (all seeds alike)."""
        return int(self.size.min())

    def evicted_use_counts(self) -> np.ndarray:
        """Replay counts of every item that has left the buffer (all seeds, flat, eviction order)."""
        if not self._evicted:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate(self._evicted)

    @property
    def nbytes(self) -> int:
        """Bytes held by all preallocated arrays (store, bookkeeping, sampler state)."""
        return int(sum(a.nbytes for a in self._arrays()))

    # --- helpers -----------------------------------------------------------

    def _arrays(self) -> list[np.ndarray]:
        return self.store.arrays() + [self.use_count, self.last_used, self.valid]

    def _check_batch(self, batch: RolloutBatch) -> None:
        if batch.num_seeds != self.num_seeds:
            raise ValueError(f"batch has {batch.num_seeds} seeds, buffer has num_seeds={self.num_seeds}")
        if batch.seq_len != self.seq_len:
            raise ValueError(f"batch has seq_len {batch.seq_len}, buffer has seq_len={self.seq_len}")

    def _evict(self, rows: np.ndarray, slots: np.ndarray) -> None:
        """Mark items invalid, recording the use counts of those that were valid."""
        was = self.valid[rows, slots]
        if np.any(was):
            self._evicted.append(self.use_count[rows, slots][was].copy())
        self.valid[rows, slots] = False

    def _reset(self, rows: np.ndarray, slots: np.ndarray) -> None:
        self.use_count[rows, slots] = 0
        self.last_used[rows, slots] = -1
        self.valid[rows, slots] = True

    def _ring_write(self, batch: RolloutBatch) -> np.ndarray:
        """FIFO ring write shared by all seeds (every seed adds the same number of items). Returns slots (n,)."""
        n = batch.size
        if n > self.capacity:
            raise ValueError(
                f"a batch of {n} rollouts exceeds capacity={self.capacity}; capacity must be >= rollouts per step"
            )
        slots = (self._ptr + np.arange(n)) % self.capacity  # (n,), FIFO order
        if self._ptr + n <= self.capacity:  # one run of slots (always when R divides N): plain slicing
            rows, cols, items = slice(None), slice(self._ptr, self._ptr + n), slice(None)
        else:
            rows, cols, items = self._rows, slots[None, :], np.arange(n)[None, :]
        self._evict(rows, cols)  # App. B.5: FIFO eviction
        self.store.write(rows, cols, batch, items)
        self._reset(rows, cols)
        self._ptr = (self._ptr + n) % self.capacity
        return slots

    def _cells(self, index: np.ndarray) -> np.ndarray:
        """Flat (seed, item) indices (S*m,) of items ``index`` (S, m), into arrays raveled from (S, capacity)."""
        return (index + self._rows * self.use_count.shape[1]).ravel()

    def _created_of(self, index: np.ndarray, batch: RolloutBatch) -> np.ndarray:
        """Creation step of each sampled item (S, B): here the items are the sampled rollouts themselves."""
        return batch.created

    def stored(self, index: np.ndarray) -> RolloutBatch:
        """The stored responses at slots ``index`` (S, m), without recording a use (diagnostics, calibration)."""
        return self._take(index)

    def _take(self, index: np.ndarray, cells: np.ndarray | None = None) -> RolloutBatch:
        return self.store.take_cells(self._cells(index) if cells is None else cells, index.shape)

    def _finish_sample(self, index: np.ndarray, weight: np.ndarray, step: int,
                       valid: np.ndarray | None = None) -> Sample:
        """Staleness and time since last use (before this draw), then record the use."""
        cells = self._cells(index)  # (S*B,)
        batch = self._take(index, cells)
        staleness = step - self._created_of(index, batch)
        last = np.take(self.last_used, cells).reshape(index.shape)  # last_used[rows, index]
        since = np.where(last >= 0, step - last, -1)
        used = cells if valid is None else cells[valid.ravel()]  # a slot drawn twice counts twice
        self.use_count += np.bincount(used, minlength=self.use_count.size).reshape(self.use_count.shape)
        np.put(self.last_used, used, step)  # last_used[rows, index] = step
        return Sample(index=index, weight=weight, batch=batch, staleness=staleness, time_since_last_use=since,
                      valid=valid)

    def _require_nonempty(self) -> None:
        if np.any(self.size == 0):
            raise ValueError("cannot sample from an empty buffer (add rollouts first)")


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
        self._offered: RolloutBatch | None = None  # the last batch offered: an empty seed's placeholder rows

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
        self._offered = batch
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
        offered = self._offered
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


# --- FreshPER --------------------------------------------------------------------------------------


PerBase = Literal["reward", "advantage"]
PER_BASES: tuple[PerBase, ...] = ("reward", "advantage")
"""What a FreshPER base priority is read from (``PrioritizedBuffer(base=...)``)."""


class PrioritizedBuffer(SlotBuffer):
    """FreshPER: prioritized replay with exponential age decay (arXiv:2604.16918).

    * Priority (Eq. 14): p_i = p_base_i exp(-age_i / tau), age_i = step - created_i,
      p_base = |reward| + eps (``base="reward"``: the paper's choice for
      critic-free methods, Sec. 3.4) or |advantage| + eps (``base="advantage"``:
      the paper's actor-critic choice; group-relative advantages are also a
      natural fit here). tau = inf is standard PER.
    * Sampling (Eq. 2): P(i) ~ p_i^alpha, computed in log space. With
      ``decay_then_exponent=True`` (released code) the weight is
      (p_base e^{-age/tau})^alpha, so the sampling distribution decays with time
      constant tau/alpha; ``False`` gives p_base^alpha e^{-age/tau}. Same
      semantics as ``theory.freshper.sampling_probabilities``.
    * Sum tree (Sec. 3.5, ``core.sumtree``) with STRATIFIED sampling: the
      mass is split into B equal segments, one uniform draw u_j per segment
      (mass (j + u_j) S / B); ``stratified=False`` draws i.i.d. The uniforms
      are one ``rng.random((S, B))`` call. A slot can be drawn more than once.
    * IS weights (Eq. 15): w_i = (1/(N P(i)))^beta / max_j w_j through
      ``theory.freshper.is_weights``. ``is_normalization="buffer"`` (default)
      takes the max over every item in the buffer (Schaul et al.'s
      implementation; Eq. 3's N = |buffer|), so batch weights are <= 1 and equal
      1 only if the least likely item is drawn; ``"batch"`` takes it over the
      sampled batch (max weight exactly 1). beta = 0 gives ones.
    * Refresh (Alg. 1 line 5): ``refresh(step)`` recomputes every priority with
      the current ages, O(N) vectorised. ``refresh=True`` calls it automatically
      before the first ``sample`` of each step (and after any ``add``);
      ``refresh=False`` keeps each item's priority from its insertion (or the
      last manual ``refresh``): the stale-priority ablation.
    * Eviction: FIFO (Table 5 caption and the released code's default). App. A.1
      says the entry with the lowest effective priority is evicted; not
      implemented (see docs/ERRATA.md).

    Tree leaves hold exp(log w_i - anchor_s), anchor_s = the largest log-weight
    of seed s at the last refresh, so no weight overflows or underflows to an
    all-zero tree however old the items are.
    """

    def __init__(self, num_seeds: int, capacity: int, seq_len: int, alpha: float = 0.6, beta: float = 0.4,
                 tau: float = 500.0, eps: float = 1e-6, *, base: PerBase = "reward",
                 decay_then_exponent: bool = True, refresh: bool = True, stratified: bool = True,
                 is_normalization: Literal["buffer", "batch"] = "buffer",
                 token_dtype: np.dtype | type = np.int16, logp_dtype: np.dtype | type = np.float64) -> None:
        super().__init__(num_seeds, capacity, seq_len, token_dtype=token_dtype, logp_dtype=logp_dtype)
        self.alpha = require_unit_interval("alpha", alpha)
        self.beta = require_unit_interval("beta", beta)
        require_positive("tau", tau, allow_inf=True)
        self.tau = float(tau)
        require_positive("eps", eps)
        self.eps = float(eps)
        require_one_of("base", base, PER_BASES)
        if is_normalization not in ("buffer", "batch"):
            raise ValueError(f"is_normalization must be 'buffer' or 'batch', got {is_normalization!r}")
        self.base = base
        self.decay_then_exponent = bool(decay_then_exponent)
        self.auto_refresh = bool(refresh)
        self.stratified = bool(stratified)
        self.is_normalization = is_normalization
        self.p_base = np.zeros((self.num_seeds, self.capacity))  # (seeds, slots)
        self._log_p = np.zeros((self.num_seeds, self.capacity))  # (seeds, slots) alpha log p_base, cached
        self.tree = SumTree(self.num_seeds, self.capacity)
        self._anchor = np.zeros((self.num_seeds, 1))  # (S, 1) log-weight offset of the tree leaves
        self._ptr = 0
        self._refreshed_at: int | None = None
        self._dirty = False

    def _arrays(self) -> list[np.ndarray]:
        return super()._arrays() + [self.p_base, self._log_p, self.tree.tree]

    def _rate(self) -> float:
        """Decay rate of the log sampling weight per step: alpha/tau (released code) or 1/tau."""
        return (self.alpha if self.decay_then_exponent else 1.0) / self.tau  # Eq. (14); alpha after decay in the code

    def _log_base(self, p_base: np.ndarray) -> np.ndarray:
        """alpha log p_base: the log of p_base^alpha (Eq. 2); 0 when alpha = 0 (uniform)."""
        return self.alpha * np.log(p_base) if self.alpha > 0 else np.zeros_like(p_base)

    def log_weight(self, p_base: np.ndarray, age: np.ndarray) -> np.ndarray:
        """log of the unnormalised sampling weight: alpha log p_base - rate * age (Eqs. 2, 14)."""
        rate = self._rate()
        return self._log_base(p_base) - rate * age if rate > 0 else self._log_base(p_base)

    def add(self, batch: RolloutBatch, step: int) -> None:
        self._check_batch(batch)
        slots = self._ring_write(batch)  # FIFO eviction (Table 5)
        src = batch.reward if self.base == "reward" else batch.advantage
        p = np.abs(src) + self.eps  # Sec. 3.4: p_base = |r| + eps or |A| + eps
        self.p_base[:, slots] = p
        self._log_p[:, slots] = self._log_base(p)
        age = np.maximum(step - batch.created, 0)
        self.tree.update(slots, np.exp(self.log_weight(p, age) - self._anchor))
        self._dirty = True

    def refresh(self, step: int) -> None:
        """Recompute every priority with the current ages (Alg. 1 line 5), O(capacity) vectorised."""
        logw = self._log_p.copy()  # (S, N) alpha log p_base
        rate = self._rate()
        if rate > 0:
            logw -= rate * np.maximum(step - self.store.created, 0)  # Eq. (14): age decay, in log space
        logw[~self.valid] = -np.inf
        top = logw.max(axis=1, keepdims=True)
        anchor = np.where(np.isfinite(top), top, 0.0)
        logw -= anchor
        self.tree.set_all(np.exp(logw, out=logw))  # exp(-inf) = 0 on empty slots
        self._anchor = anchor
        self._refreshed_at = int(step)
        self._dirty = False

    def priorities(self, step: int) -> np.ndarray:
        """Current priorities p_i = p_base exp(-age/tau) (S, N), 0 on empty slots (theory.freshper.priorities)."""
        age = np.where(self.valid, np.maximum(step - self.store.created, 0), 0)
        return np.where(self.valid, _freshper.priorities(self.p_base, age, self.tau), 0.0)

    def probabilities(self) -> np.ndarray:
        """Sampling probabilities P(i) (S, N) held in the tree (after the last refresh / add)."""
        return self.tree.leaves() / self.tree.total()[:, None]

    def uniform_shape(self, batch_size: int) -> tuple[int, int]:
        return (self.num_seeds, batch_size)

    def select(self, u: np.ndarray) -> np.ndarray:
        """Slots (S, B) from uniforms u (S, B) through the sum tree; records nothing."""
        return self.tree.sample(u, stratified=self.stratified)

    def sample(self, batch_size: int, step: int, rng: RandomSource) -> Sample:
        B = _int_param("batch_size", batch_size, 1)
        self._require_nonempty()
        if self.auto_refresh and (self._dirty or self._refreshed_at != step):
            self.refresh(step)
        u = rng.random(self.uniform_shape(B))
        index = self.select(u)
        total = self.tree.total()[:, None]
        if self.beta == 0.0:
            weight = np.ones(index.shape)
        elif self.is_normalization == "buffer":
            # Eq. (15), max over the buffer: the largest weight is the least likely item's, so prepend
            # min_j P(j) to the batch's P and let theory.freshper.is_weights normalise by it
            leaves = self.tree.leaves()
            p_min = np.where(leaves > 0, leaves, np.inf).min(axis=1, keepdims=True) / total
            weight = _freshper.is_weights(np.concatenate([p_min, self.tree.get(index) / total], axis=1),
                                          self.beta)[:, 1:]
        else:
            weight = _freshper.is_weights(self.tree.get(index) / total, self.beta)  # Eq. (15), max over the batch
        return self._finish_sample(index, weight, step)


# --- RLOO whole-group replay -----------------------------------------------------------------------


class GroupReplayBuffer(SlotBuffer):
    """Bounded-age whole-group replay (RLOO on Countdown, Sec. 3.2 and App. B).

    Stores WHOLE groups: prompt, K responses, rewards, behaviour log-probs and
    the sampling step. Items are groups (``use_count`` etc. are (S, groups));
    responses of group slot g occupy store slots g*K .. g*K + K - 1.

    Order per step (App. B): sample fresh, ``sample_groups`` (replay), update,
    ``add`` the fresh groups, which then evicts the groups that are older than L
    from the next step on (age >= L now), so between steps the buffer holds
    ages 0..L-1, i.e. L cohorts, and (L + 1) cohorts during an add. Replay is
    uniform WITHOUT replacement among the eligible groups, 1 <= age <= L; a
    shortfall returns fewer groups (the caller fills them with fresh ones, see
    ``available`` and ``split``). Reused groups are not re-added: ``add`` accepts
    only responses with ``created == step``. Uniforms: one
    ``rng.random((S, capacity_groups))`` per call, one key per group slot.
    Capacity: ``capacity_groups``, else (L + 1) * ``groups_per_step`` (the peak
    during an add); with neither, it is set at the first add to (L + 1) times
    its number of groups (step 0 is all fresh, the most groups of any step) and
    grows (reallocating, groups kept in creation order) if a later add needs more.
    """

    def __init__(self, num_seeds: int, max_age: int, group_size: int, seq_len: int, *,
                 groups_per_step: int | None = None, capacity_groups: int | None = None,
                 token_dtype: np.dtype | type = np.int16, logp_dtype: np.dtype | type = np.float64) -> None:
        self.max_age = _int_param("max_age", max_age, 0)
        self.group_size = _int_param("group_size", group_size, 1)
        self._auto_capacity = capacity_groups is None and groups_per_step is None
        if capacity_groups is None:
            # without either: sized at the first add ((L + 1) * its groups) and grown if a later add needs more
            capacity_groups = 1 if self._auto_capacity else (
                (self.max_age + 1) * _int_param("groups_per_step", groups_per_step, 1))
        cap = _int_param("capacity_groups", capacity_groups, 1)
        super().__init__(num_seeds, cap, seq_len, token_dtype=token_dtype, logp_dtype=logp_dtype,
                         store_capacity=cap * self.group_size)
        self.group_created = np.full((self.num_seeds, cap), -1, dtype=np.int64)  # (seeds, groups) sampling step
        self._ptr = 0

    def _grow(self, new_cap: int) -> None:
        """Reallocate for ``new_cap`` groups, keeping the stored groups in creation order at slots 0..v-1."""
        S, K = self.num_seeds, self.group_size
        v = int(self.valid.sum(axis=1).max())
        key = np.where(self.valid, self.group_created, np.iinfo(np.int64).max)
        old = np.argsort(key, axis=1, kind="stable")[:, :v]  # (S, v) stored groups, oldest first
        store = RolloutStore(S, new_cap * K, self.seq_len, self.store.token_dtype, self.store.logp_dtype)
        for f in fields(RolloutBatch):
            getattr(store, f.name)[:, :v * K] = getattr(self.store, f.name)[self._rows, self._response_slots(old)]
        self.store = store
        for name, fill in (("use_count", 0), ("last_used", -1), ("valid", False), ("group_created", -1)):
            arr = getattr(self, name)
            new = np.full((S, new_cap), fill, dtype=arr.dtype)
            new[:, :v] = arr[self._rows, old]
            setattr(self, name, new)
        self.capacity = new_cap
        self._ptr = v % new_cap

    def _arrays(self) -> list[np.ndarray]:
        return super()._arrays() + [self.group_created]

    def _response_slots(self, gslots: np.ndarray) -> np.ndarray:
        K = self.group_size
        r = gslots[..., None] * K + np.arange(K)  # (..., m, K)
        return r.reshape(*gslots.shape[:-1], gslots.shape[-1] * K)

    def add(self, batch: RolloutBatch, step: int) -> None:
        self._check_batch(batch)
        S, K, n = self.num_seeds, self.group_size, batch.size
        if n % K:
            raise ValueError(f"batch of {n} responses is not a whole number of groups of group_size={K}")
        G = n // K
        gid = batch.group.reshape(S, G, K)
        prompt = batch.prompt.reshape(S, G, K)
        if np.any(gid != gid[:, :, :1]) or np.any(prompt != prompt[:, :, :1]):
            raise ValueError(f"responses must come as contiguous groups of group_size={K} sharing group id and prompt")
        if np.any(batch.created != step):
            raise ValueError(
                "GroupReplayBuffer.add takes fresh groups only (created == step); "
                "reused groups are not re-added (Sec. 3.2)"
            )
        self._drop_older_than(step, self.max_age)  # never eligible again (normally dropped by the last add)
        if self._auto_capacity:
            need = int(self.valid.sum(axis=1).max()) + G
            if need > self.capacity:
                self._grow(max(need, (self.max_age + 1) * G, 2 * self.capacity))
        if G > self.capacity:
            raise ValueError(f"{G} groups exceed capacity_groups={self.capacity}")
        gslots = (self._ptr + np.arange(G)) % self.capacity  # (G,)
        if np.any(self.valid[:, gslots]):
            raise ValueError(
                f"capacity_groups={self.capacity} is too small for ages 0..max_age={self.max_age}: "
                f"it must be >= (max_age + 1) * groups added per step"
            )
        self.store.write(self._rows, self._response_slots(gslots)[None, :], batch, np.arange(n)[None, :])
        self.group_created[:, gslots] = step
        self._reset(self._rows, gslots[None, :])
        self._ptr = (self._ptr + G) % self.capacity
        # App. B "evict older than L": a group of age >= L now is older than L at the next step
        self._drop_older_than(step, self.max_age - 1)

    def _drop_older_than(self, step: int, max_age: int) -> None:
        over = self.valid & (step - self.group_created > max_age)
        s_idx, g_idx = np.nonzero(over)
        self._evict(s_idx, g_idx)

    def eligible(self, step: int) -> np.ndarray:
        """(S, groups) True for stored groups with 1 <= age <= L (Sec. 3.2)."""
        age = step - self.group_created
        return self.valid & (age >= 1) & (age <= self.max_age)

    def available(self, step: int) -> np.ndarray:
        """Eligible groups per seed at ``step``, (S,)."""
        return self.eligible(step).sum(axis=1)

    def split(self, B: int, rho: float, step: int) -> tuple[int, int]:
        """(B_fresh, B_replay) this step: B_replay = min(B - round(B/(1+rho)), available); the shortfall is fresh."""
        want = int(_group_replay.replay_groups_per_step(B, rho))  # App. B: B - round(B / (1 + rho))
        n_replay = min(want, int(self.available(step).min()))
        return int(B) - n_replay, n_replay

    def sample_groups(self, num_replay: int, step: int, rng: RandomSource) -> Sample:
        """Up to ``num_replay`` eligible groups per seed, uniform without replacement.

        Returns m = min(num_replay, min over seeds of available) groups (all seeds
        add the same number of groups per step, so availability is the same in
        every seed); ``batch`` holds the m*K responses with their group ids.
        """
        want = _int_param("num_replay", num_replay, 0)
        u = rng.random((self.num_seeds, self.capacity))  # one key per group slot
        elig = self.eligible(step)
        m = min(want, int(elig.sum(axis=1).min()))
        index = _smallest_keys(np.where(elig, u, np.inf), m)  # Sec. 3.2: uniform without replacement
        return self._finish_sample(index, np.ones(index.shape), step)

    def sample(self, batch_size: int, step: int, rng: RandomSource) -> Sample:
        """Alias of ``sample_groups`` (``batch_size`` counts groups)."""
        return self.sample_groups(batch_size, step, rng)

    def _created_of(self, index: np.ndarray, batch: RolloutBatch) -> np.ndarray:
        return self.group_created[self._rows, index]  # per GROUP (the batch holds their responses)

    def _take(self, index: np.ndarray, cells: np.ndarray | None = None) -> RolloutBatch:
        return self.store.take(self._rows, self._response_slots(index))


# --- ExGRPO ----------------------------------------------------------------------------------------


class ExGRPOBuffer(SlotBuffer):
    """ExGRPO experience buffer: per-question success counts, stored successful trajectories (Sec. 4, Algs. 1-2).

    * Records (Alg. 1 lines 24-29): for each group of a question, k = number of
      correct (reward == 1) responses. k == K (all of the group's responses): the
      question is RETIRED (its trajectories removed, ``retired`` set so fresh
      sampling can skip it; later groups of it are ignored). Otherwise the
      latest success count becomes k and its correct responses are stored with
      their behaviour token log-probs, exact duplicates skipped (same mask and
      same tokens on it), at most ``max_trajectories`` per question (the oldest
      is overwritten). All-failed questions are never retired; with k = 0 a
      question keeps its stored trajectories but is in no bucket (buckets are
      0 < k < K) until a later success.
    * Buckets and question sampling (Alg. 2): bucket probabilities from
      ``theory.exgrpo.bucket_probabilities`` over the non-empty buckets (units
      "success-count" = reference code, "accuracy" = paper text); bucket counts
      ~ Multinomial(n, p) (numpy's sampler, same law as Alg. 2's sequential
      binomials), counts above a bucket's size clipped and the deficit redrawn
      over buckets with room; within a bucket uniform without replacement. Item
      probability of one draw p_k / |U_k| (``theory.exgrpo.item_probabilities``).
      This part loops over seeds in Python.
    * Trajectory selection: o* = the stored trajectory with the LOWEST entropy
      under the CURRENT policy (Sec. 4.1), through the callback
      ``entropy_fn(prompts (S, m), tokens (S, m, L), mask (S, m, L)) -> (S, m)``
      (full-vocabulary token entropy averaged over the trajectory's tokens);
      ``selection="highest"`` / ``"random"`` for the ablations.
    * Delayed start (Sec. 4.2): ``active`` switches on for good once a batch
      pass@1 > ``start_pass_rate`` (0.35) is observed (``observe_pass_rate``);
      records are collected only while active, and ``split`` gives no replay
      before. ``split(B)`` is ``theory.exgrpo.batch_split``.
    * Mixed groups: a replayed question's group is K - 1 fresh rollouts + o*.
      Pass whichever the caller counts to ``add`` (``group_size`` = responses
      per group; o* is an exact duplicate of a stored trajectory, so it is not
      stored twice).

    Store slots: trajectory j of question q is slot q * max_trajectories + j.
    """

    def __init__(self, num_seeds: int, num_prompts: int, group_size: int, seq_len: int, *,
                 max_trajectories: int = 16, rho: float = 0.5, mu: float | None = None, sigma: float = 1.0,
                 units: _exgrpo.Units = "success-count",
                 selection: Literal["lowest", "highest", "random"] = "lowest",
                 start_pass_rate: float = 0.35, delayed_start: bool = True,
                 token_dtype: np.dtype | type = np.int16, logp_dtype: np.dtype | type = np.float64) -> None:
        self.num_prompts = _int_param("num_prompts", num_prompts, 1)
        self.group_size = _int_param("group_size", group_size, 2)
        self.max_trajectories = _int_param("max_trajectories", max_trajectories, 1)
        super().__init__(num_seeds, self.num_prompts * self.max_trajectories, seq_len,
                         token_dtype=token_dtype, logp_dtype=logp_dtype)
        self.rho = require_unit_interval("rho", rho, closed=False)
        # validate mu / sigma / units once through the theory function
        _exgrpo.bucket_probabilities(self.group_size, mu, sigma, units)
        self.mu, self.sigma = mu, float(sigma)
        self.units: _exgrpo.Units = units
        require_one_of("selection", selection, ("lowest", "highest", "random"))
        self.selection = selection
        self.start_pass_rate = require_unit_interval("start_pass_rate", start_pass_rate)
        S, P = self.num_seeds, self.num_prompts
        self.success_count = np.full((S, P), -1, dtype=np.int64)  # (seeds, prompts) latest k, -1 = no record
        self.retired = np.zeros((S, P), dtype=bool)  # (seeds, prompts) the retired set
        self.active = np.zeros(S, dtype=bool) if delayed_start else np.ones(S, dtype=bool)
        self._traj_ptr = np.zeros((S, P), dtype=np.int64)  # per-question ring pointer
        self._traj_hash = np.zeros((S, self.capacity), dtype=np.uint64)  # (seeds, slots) hash of (mask, tokens)
        mix = np.random.default_rng(0x5EED).integers(1, 2**63, size=(2, self.seq_len), dtype=np.int64)
        self._mix = (mix | 1).astype(np.uint64)  # fixed odd multipliers: a hash, not a source of randomness

    def _arrays(self) -> list[np.ndarray]:
        return super()._arrays() + [self.success_count, self.retired, self.active, self._traj_ptr, self._traj_hash]

    def _hash(self, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """64-bit hash (...,) of a trajectory's mask and its tokens on the mask (padding ignored)."""
        x = tokens.astype(np.int64).astype(np.uint64)  # negative ids wrap, still distinct
        with np.errstate(over="ignore"):
            h = np.where(mask, x * self._mix[0] + self._mix[1], np.uint64(0))  # (..., L)
            return h.sum(axis=-1, dtype=np.uint64)

    @staticmethod
    def _same(tok_a: np.ndarray, msk_a: np.ndarray, tok_b: np.ndarray, msk_b: np.ndarray) -> np.ndarray:
        """Exact equality (k,) of k trajectory pairs (k, L): same mask, same tokens on it."""
        ta = np.where(msk_a, tok_a.astype(np.int64), 0)
        tb = np.where(msk_b, tok_b.astype(np.int64), 0)
        return np.all(msk_a == msk_b, axis=-1) & np.all(ta == tb, axis=-1)

    # --- delayed start ---------------------------------------------------

    def observe_pass_rate(self, rate: np.ndarray | float) -> None:
        """Switch replay on (one way) in seeds whose batch pass@1 exceeds start_pass_rate (Sec. 4.2)."""
        r = np.broadcast_to(np.asarray(rate, dtype=float), (self.num_seeds,))
        self.active |= r > self.start_pass_rate

    # --- records -----------------------------------------------------------

    def add(self, batch: RolloutBatch, step: int, group_size: int | None = None) -> None:
        """Update records from groups of ``group_size`` (default K) contiguous responses to one prompt."""
        self._check_batch(batch)
        S, n = self.num_seeds, batch.size
        Kp = self.group_size if group_size is None else _int_param("group_size", group_size, 1)
        if Kp > self.group_size:
            raise ValueError(f"group_size must be <= K={self.group_size}, got {Kp}")
        if n % Kp:
            raise ValueError(f"batch of {n} responses is not a whole number of groups of group_size={Kp}")
        G = n // Kp
        prompts = batch.prompt.reshape(S, G, Kp)
        if np.any(prompts != prompts[:, :, :1]):
            raise ValueError(f"responses must come as contiguous groups of group_size={Kp} sharing one prompt")
        q = prompts[:, :, 0]  # (S, G)
        if q.size and (q.min() < 0 or q.max() >= self.num_prompts):
            raise ValueError(f"prompt ids must be in [0, num_prompts={self.num_prompts})")
        correct = batch.reward.reshape(S, G, Kp) == 1.0  # Eq. (1): reward 1 iff correct
        k = correct.sum(axis=2)  # (S, G) success count
        occ = _occurrence_rank(q)  # repeated prompts in one seed are processed in order
        for r in range(int(occ.max(initial=-1)) + 1):
            sel = (occ == r) & self.active[:, None] & ~self.retired[self._rows, q]
            self._update_groups(sel, q, k, correct, batch, Kp)

    def _update_groups(self, sel: np.ndarray, q: np.ndarray, k: np.ndarray, correct: np.ndarray,
                       batch: RolloutBatch, Kp: int) -> None:
        M = self.max_trajectories
        s, g = np.nonzero(sel)
        if s.size == 0:
            return
        qq, kk = q[s, g], k[s, g]
        # Alg. 1 lines 25-26, 32: all correct -> retired set, removed from the buffer
        ret = kk == Kp
        rs, rq = s[ret], qq[ret]
        self.retired[rs, rq] = True
        self.success_count[rs, rq] = -1
        if rs.size:
            self._evict(np.repeat(rs, M), (rq[:, None] * M + np.arange(M)).ravel())
        # Alg. 1 lines 27-28: partial success -> latest k, store the correct responses
        keep = ~ret
        ps, pg, pq = s[keep], g[keep], qq[keep]
        self.success_count[ps, pq] = kk[keep]
        cand = correct[ps, pg]  # (n, Kp)
        items = pg[:, None] * Kp + np.arange(Kp)  # (n, Kp) response index in the batch
        # exact duplicates: compare 64-bit hashes, then confirm hash matches token by token
        tok = batch.tokens[ps[:, None], items]  # (n, Kp, L)
        msk = batch.mask[ps[:, None], items]
        h_new = self._hash(tok, msk)  # (n, Kp)
        stored = pq[:, None] * M + np.arange(M)  # (n, M)
        same_stored = (h_new[:, :, None] == self._traj_hash[ps[:, None], stored][:, None, :]) \
            & self.valid[ps[:, None], stored][:, None, :]  # (n, Kp, M)
        a, j, m = np.nonzero(same_stored)
        if a.size:
            same_stored[a, j, m] = self._same(tok[a, j], msk[a, j], self.store.tokens[ps[a], stored[a, m]],
                                              self.store.mask[ps[a], stored[a, m]])
        same_new = (h_new[:, :, None] == h_new[:, None, :]) & cand[:, None, :] \
            & np.tri(Kp, k=-1, dtype=bool)[None]  # (n, Kp, Kp): an earlier copy in the same group
        a, j, m = np.nonzero(same_new)
        if a.size:
            same_new[a, j, m] = self._same(tok[a, j], msk[a, j], tok[a, m], msk[a, m])
        new = cand & ~same_stored.any(axis=2) & ~same_new.any(axis=2)  # exact duplicates skipped
        rank = np.cumsum(new, axis=1) - 1
        cnt = new.sum(axis=1)
        skip = np.maximum(cnt - M, 0)[:, None]
        put = new & (rank >= skip)
        dst = pq[:, None] * M + (self._traj_ptr[ps, pq][:, None] + rank - skip) % M  # (n, Kp)
        a, j = np.nonzero(put)
        w_rows, w_dst, w_item = ps[a], dst[a, j], items[a, j]
        self._evict(w_rows, w_dst)
        self.store.write(w_rows, w_dst, batch, w_item)
        self._traj_hash[w_rows, w_dst] = h_new[a, j]
        self._reset(w_rows, w_dst)
        self._traj_ptr[ps, pq] = (self._traj_ptr[ps, pq] + np.minimum(cnt, M)) % M

    # --- buckets -------------------------------------------------------------

    def buckets(self) -> np.ndarray:
        """Bucket of each question (S, P): its latest k if 0 < k < K and it has a stored trajectory, else 0."""
        has = self.valid.reshape(self.num_seeds, self.num_prompts, self.max_trajectories).any(axis=2)
        k = self.success_count
        in_e = (k >= 1) & (k <= self.group_size - 1) & has & ~self.retired
        return np.where(in_e, k, 0)

    def bucket_sizes(self) -> np.ndarray:
        """|U_k| for k = 1..K-1, (S, K-1)."""
        b = self.buckets()
        return (b[:, :, None] == np.arange(1, self.group_size)).sum(axis=1)

    def n_experience(self) -> np.ndarray:
        """|E|: questions in a bucket, (S,)."""
        return (self.buckets() > 0).sum(axis=1)

    def bucket_probs(self) -> np.ndarray:
        """Bucket probabilities over the non-empty buckets (S, K-1); rows with no bucket are 0."""
        sizes = self.bucket_sizes()
        nonempty = sizes > 0
        out = np.zeros(sizes.shape)
        rows = nonempty.any(axis=1)
        if np.any(rows):
            out[rows] = _exgrpo.bucket_probabilities(self.group_size, self.mu, self.sigma, self.units,
                                                     nonempty=nonempty[rows])  # Alg. 1 line 6 / Alg. 2
        return out

    def question_probabilities(self) -> np.ndarray:
        """Probability of each question in one draw, p_k / |U_k| (S, P) (0 outside the buckets)."""
        per_item = _exgrpo.item_probabilities(self.bucket_sizes(), self.bucket_probs())  # (S, K-1)
        b = self.buckets()
        padded = np.concatenate([np.zeros((self.num_seeds, 1)), per_item], axis=1)  # bucket 0 -> 0
        return np.take_along_axis(padded, b, axis=1)

    def split(self, B: int) -> tuple[np.ndarray, np.ndarray]:
        """(|B_exp|, |B_on|) per seed, (S,) each: min(floor(rho B), |E|) once active, else (0, B)."""
        n_exp = np.where(self.active, self.n_experience(), 0)
        return _exgrpo.batch_split(B, self.rho, n_exp)  # Sec. 4.2 / Alg. 1 line 7

    # --- sampling ------------------------------------------------------------

    def _bucket_counts(self, n: int, p: np.ndarray, sizes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        c = rng.multinomial(n, p)  # Alg. 2 line 11
        while True:
            deficit = int(np.maximum(c - sizes, 0).sum())
            c = np.minimum(c, sizes)  # Alg. 2 note: clip to |U_k| and redistribute
            if deficit == 0:
                return c
            room = sizes - c
            q = np.where(room > 0, p, 0.0)
            q = q / q.sum() if q.sum() > 0 else room / room.sum()
            c = c + rng.multinomial(deficit, q)

    def sample(self, batch_size: int, step: int, rng: RandomSource,
               entropy_fn: EntropyFn | None = None) -> Sample:
        """Draw up to ``batch_size`` questions per seed and their o* trajectories.

        Seeds with fewer questions in the buckets than ``batch_size`` give all of
        them; the rest of their row is padding with ``valid = False``. ``index``
        is the store slot of o*; ``batch.prompt`` the question.
        """
        B = _int_param("batch_size", batch_size, 0)
        if self.selection != "random" and entropy_fn is None:
            raise ValueError(f"selection={self.selection!r} needs entropy_fn(prompts, tokens, mask) -> (S, m)")
        S, M = self.num_seeds, self.max_trajectories
        b = self.buckets()
        sizes = (b[:, :, None] == np.arange(1, self.group_size)).sum(axis=1)  # (S, K-1)
        probs = self.bucket_probs()
        q_sel = np.zeros((S, B), dtype=np.int64)
        valid = np.zeros((S, B), dtype=bool)
        for s in range(S):  # per-seed Python loop: Alg. 2 bucket counts and within-bucket draws
            n = min(B, int(sizes[s].sum()))
            if n == 0:
                continue
            g = rng.seed_generator(s) if isinstance(rng, PerSeedGenerator) else rng  # seed s: its own stream
            counts = self._bucket_counts(n, probs[s], sizes[s], g)
            chosen = [g.choice(np.flatnonzero(b[s] == kb + 1), size=c, replace=False)  # Alg. 2 line 14
                      for kb, c in enumerate(counts) if c > 0]
            q_sel[s, :n] = np.concatenate(chosen)
            valid[s, :n] = True
        cand = q_sel[:, :, None] * M + np.arange(M)  # (S, B, M)
        cand_valid = self.valid[self._rows[:, :, None], cand] & valid[:, :, None]
        if B == 0 or not valid.any():
            pick = np.zeros((S, B), dtype=np.int64)
        elif self.selection == "random":
            score = np.where(cand_valid, rng.random(cand.shape), -np.inf)
            pick = score.argmax(axis=2)
        else:
            assert entropy_fn is not None  # checked above: a selection other than random needs it
            flat = cand.reshape(S, B * M)
            ent = np.asarray(entropy_fn(np.repeat(q_sel, M, axis=1),
                                        self.store.tokens[self._rows, flat].astype(np.int64),
                                        self.store.mask[self._rows, flat])).reshape(S, B, M)
            if self.selection == "lowest":
                pick = np.where(cand_valid, ent, np.inf).argmin(axis=2)  # Sec. 4.1: o* = argmin H(o; pi_theta)
            else:
                pick = np.where(cand_valid, ent, -np.inf).argmax(axis=2)
        index = np.where(valid, np.take_along_axis(cand, pick[:, :, None], axis=2)[:, :, 0], 0)
        return self._finish_sample(index, np.ones(index.shape), step, valid)


class UniformQuestionBuffer(ExGRPOBuffer):
    """ExGRPOBuffer whose question draw is uniform over the questions in E ("w/o question selection" ablation).

    Bucket k gets probability |U_k| / |E| (so one draw is uniform over E); the counts
    then go through the same multinomial-and-clip sampler, within a bucket without
    replacement, so a batch is a uniform draw up to the clip-and-redraw of Alg. 2.
    """

    def bucket_probs(self) -> np.ndarray:
        sizes = self.bucket_sizes().astype(float)  # (S, K-1)
        total = sizes.sum(axis=1, keepdims=True)
        return np.divide(sizes, total, out=np.zeros_like(sizes), where=total > 0)


def _occurrence_rank(q: np.ndarray) -> np.ndarray:
    """For (S, G) ids, how many earlier entries of the same row share the id (0 for the first)."""
    S, G = q.shape
    if G == 0:
        return np.zeros((S, 0), dtype=np.int64)
    order = np.argsort(q, axis=1, kind="stable")
    qs = np.take_along_axis(q, order, axis=1)
    idx = np.broadcast_to(np.arange(G), (S, G))
    start = np.ones((S, G), dtype=bool)
    start[:, 1:] = qs[:, 1:] != qs[:, :-1]
    run_start = np.maximum.accumulate(np.where(start, idx, 0), axis=1)
    rank = np.empty((S, G), dtype=np.int64)
    np.put_along_axis(rank, order, idx - run_start, axis=1)
    return rank


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
        self._queue: deque[tuple[int, RolloutBatch]] = deque()
        self.last_step: int | None = None  # generation step of the batch the last pop returned

    def push(self, batch: RolloutBatch, step: int) -> None:
        if batch.num_seeds != self.num_seeds:
            raise ValueError(f"batch has {batch.num_seeds} seeds, queue has num_seeds={self.num_seeds}")
        if self._queue and step <= self._queue[-1][0]:
            raise ValueError(f"step must increase between pushes, got {step} after {self._queue[-1][0]}")
        self._queue.append((int(step), batch))

    def pop(self, step: int) -> RolloutBatch:
        if not self._queue:
            raise ValueError("cannot pop from an empty stale-k queue (push a batch first)")
        target = step - self.k
        pos = 0
        for i, (s, _) in enumerate(self._queue):  # at most k + 1 entries
            if s <= target:
                pos = i
        for _ in range(pos):
            self._queue.popleft()
        self.last_step = self._queue[0][0]
        return self._queue[0][1]

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
        return len(self._queue)


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

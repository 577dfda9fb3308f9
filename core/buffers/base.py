"""The buffers' shared parts: ``Sample`` (what ``sample`` returns), ``RolloutStore`` (the preallocated
structure-of-arrays store), ``ReplayBuffer`` (the interface) and ``SlotBuffer`` (add, then sample; use records;
dtypes). Symbols: the package docstring (core/buffers/__init__.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Callable

import numpy as np

from ...checks import require_int
from ..rng import RandomSource
from ..rollouts import RolloutBatch

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
#: RolloutBatch's field names, in its order (``dataclasses.fields`` rebuilds its tuple on every call)
_FIELDS = tuple(f.name for f in fields(RolloutBatch))


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
    return arr.reshape((-1,) + arr.shape[2:]).take(cells, axis=0).reshape(shape + arr.shape[2:])


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
        for name in _FIELDS:
            getattr(self, name)[rows, slots] = getattr(batch, name)[rows, items]

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
            name: _take_slots(getattr(self, name), cells, shape).astype(_BATCH_DTYPES[name], copy=False)
            for name in _FIELDS
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
        self.last_used.reshape(-1)[used] = step  # last_used[rows, index] = step (a view: np.put is slower)
        return Sample(index=index, weight=weight, batch=batch, staleness=staleness, time_since_last_use=since,
                      valid=valid)

    def _require_nonempty(self) -> None:
        if np.any(self.size == 0):
            raise ValueError("cannot sample from an empty buffer (add rollouts first)")

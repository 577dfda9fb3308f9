"""RLOO whole-group replay (Sec. 3.2, App. B): eligible groups of ages 1..L, clipped weights."""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from ...theory import group_replay as _group_replay
from ..rng import RandomSource
from ..rollouts import RolloutBatch
from .base import (
    RolloutStore,
    Sample,
    SlotBuffer,
    _int_param,
    _smallest_keys,
)

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

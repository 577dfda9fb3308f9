"""FreshPER (arXiv:2604.16918): prioritized replay with exponential age decay, Eqs. (2), (14), (15), Alg. 1."""

from __future__ import annotations

from typing import Literal

import numpy as np

from ...checks import require_one_of, require_positive, require_unit_interval
from ...theory import freshper as _freshper
from ..rng import RandomSource
from ..rollouts import RolloutBatch
from ..sumtree import SumTree
from .base import (
    Sample,
    SlotBuffer,
    _int_param,
)

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

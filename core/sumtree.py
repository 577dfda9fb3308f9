"""Sum segment tree vectorised over seeds, for prioritized replay (FreshPER Sec. 3.5).

Paper: "Freshness-Aware Prioritized Experience Replay for LLM/VLM Reinforcement
Learning" (FreshPER, docs/REFERENCES.md, arXiv:2604.16918),
Sec. 3.5 "Sampling from the priority distribution (Eq. 2) naively requires O(N)
time. We use a sum segment tree to achieve O(log N) per sample", after Schaul
et al. 2016 (PER), App. B.2.1.

| code name      | paper symbol          | meaning                                           |
|----------------|-----------------------|---------------------------------------------------|
| leaf value     | p_i^alpha             | sampling weight of slot i (unnormalised)          |
| ``total()``    | S = sum_i p_i^alpha   | total priority mass                               |
| ``find(m)``    |                       | slot i with cumsum_{<i} <= m < cumsum_{<=i}       |

Layout: one heap-ordered array per seed, shape (S, 2 * cap_pow2) with
cap_pow2 = the smallest power of two >= capacity. Node 1 is the root, node n
has children 2n and 2n+1, leaf of slot i is node cap_pow2 + i (node 0 unused).
Internal nodes are always *recomputed* from their children (never updated by
adding deltas), so no rounding drift builds up over millions of updates.

``find`` returns the smallest slot whose inclusive prefix sum exceeds the
requested mass, i.e. ``np.searchsorted(np.cumsum(leaves), mass, side="right")``,
and never returns a zero-weight slot: where rounding would step past the last
positive leaf (mass == total, or accumulated subtraction error) it stays on
the positive side of the tree.
"""

from __future__ import annotations

import numpy as np

from ..checks import require_int, require_nonnegative

__all__ = ["SumTree"]


class SumTree:
    """Sum segment trees for S seeds at once: (S, 2 * cap_pow2) float64."""

    def __init__(self, num_seeds: int, capacity: int) -> None:
        self.num_seeds = int(require_int("num_seeds", num_seeds, 1))
        self.capacity = int(require_int("capacity", capacity, 1))
        self.depth = max(0, (self.capacity - 1).bit_length())  # levels below the root
        self.cap_pow2 = 1 << self.depth
        self.tree = np.zeros((self.num_seeds, 2 * self.cap_pow2))  # (S, 2 cap_pow2)
        self._rows = np.arange(self.num_seeds)[:, None]  # (S, 1)

    # --- reading -----------------------------------------------------------

    def total(self) -> np.ndarray:
        """Total mass per seed, (S,)."""
        return self.tree[:, 1].copy()

    def leaves(self) -> np.ndarray:
        """Leaf values (S, capacity) (a copy)."""
        return self.tree[:, self.cap_pow2:self.cap_pow2 + self.capacity].copy()

    def get(self, slots: np.ndarray) -> np.ndarray:
        """Leaf values at ``slots`` (S, k)."""
        return self.tree[self._rows, np.asarray(slots) + self.cap_pow2]

    # --- writing -----------------------------------------------------------

    def update(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``slots`` (S, k) (or (k,), shared by all seeds) to ``values`` (S, k).

        Each level recomputes the touched parents from their two children:
        log2(cap_pow2) vectorised steps. Repeated slots in a row must carry the
        same value (the last write wins).
        """
        slots = np.asarray(slots, dtype=np.int64)
        values = np.asarray(values, dtype=float)
        if slots.ndim == 1:
            slots = np.broadcast_to(slots, (self.num_seeds, slots.shape[0]))
        values = np.broadcast_to(values, slots.shape)
        require_nonnegative("values", values, allow_inf=True, note=" (sum-tree leaves are sampling weights)")
        if slots.size and (slots.min() < 0 or slots.max() >= self.capacity):
            raise ValueError(f"slots must be in [0, {self.capacity - 1}]")
        node = slots + self.cap_pow2  # (S, k)
        self.tree[self._rows, node] = values
        for _ in range(self.depth):
            node = node // 2
            self.tree[self._rows, node] = self.tree[self._rows, 2 * node] + self.tree[self._rows, 2 * node + 1]

    def set_all(self, values: np.ndarray) -> None:
        """Replace every leaf with ``values`` (S, capacity) and rebuild: O(capacity), level by level."""
        values = np.asarray(values, dtype=float)
        if values.shape != (self.num_seeds, self.capacity):
            raise ValueError(f"values must have shape {(self.num_seeds, self.capacity)}, got {values.shape}")
        require_nonnegative("values", values, allow_inf=True, note=" (sum-tree leaves are sampling weights)")
        lo = self.cap_pow2
        self.tree[:, lo:lo + self.capacity] = values
        self.tree[:, lo + self.capacity:] = 0.0
        while lo > 1:
            hi, lo = lo, lo // 2
            self.tree[:, lo:hi] = self.tree[:, 2 * lo:2 * hi:2] + self.tree[:, 2 * lo + 1:2 * hi:2]  # (S, level)

    # --- sampling ----------------------------------------------------------

    def find(self, prefix_mass: np.ndarray) -> np.ndarray:
        """Slots (S, B) holding ``prefix_mass`` (S, B): descend the tree in log2(cap_pow2) steps.

        At each node go right iff mass >= left-subtree sum and the right subtree
        has positive mass (then subtract the left sum); otherwise go left with
        the mass clamped to the left sum. Requires total() > 0 in every row and
        0 <= prefix_mass; masses >= total land on the last positive leaf.
        """
        mass = np.array(prefix_mass, dtype=float)  # (S, B), a copy we consume
        if mass.ndim != 2 or mass.shape[0] != self.num_seeds:
            raise ValueError(f"prefix_mass must have shape (num_seeds={self.num_seeds}, B), got {mass.shape}")
        if np.any(self.tree[:, 1] <= 0):
            raise ValueError("find needs a positive total mass in every seed (add items with weight > 0 first)")
        node = np.ones(mass.shape, dtype=np.int64)  # (S, B) root
        for _ in range(self.depth):
            left = self.tree[self._rows, 2 * node]
            right = self.tree[self._rows, 2 * node + 1]
            go_right = (mass >= left) & (right > 0)
            mass = np.where(go_right, mass - left, np.minimum(mass, left))
            node = 2 * node + go_right
        return node - self.cap_pow2

    def sample(self, u: np.ndarray, stratified: bool = True) -> np.ndarray:
        """Slots (S, B) from uniforms ``u`` (S, B) in [0, 1).

        ``stratified=True`` (FreshPER Sec. 3.5): the total mass is split into B
        equal segments and draw j falls in segment j, mass = (j + u_j) S / B.
        ``stratified=False``: B i.i.d. draws, mass = u_j S.
        """
        u = np.asarray(u, dtype=float)
        total = self.tree[:, 1][:, None]  # (S, 1)
        if stratified:
            B = u.shape[1]
            mass = (np.arange(B)[None, :] + u) * (total / B)  # Sec. 3.5, FreshPER: B equal segments
        else:
            mass = u * total
        return self.find(mass)

    @property
    def nbytes(self) -> int:
        return int(self.tree.nbytes)

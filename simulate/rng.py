"""One random stream per seed, drawn as if it were one generator with a leading seed axis.

Seed i of a run uses ``np.random.default_rng([base_seed, i])`` whatever the
number of seeds, so the first 16 seeds of a 64-seed run equal a 16-seed run,
and a per-seed Python loop (simulate/naive.py) consumes exactly the same draws.
"""

from __future__ import annotations

import numpy as np


class PerSeedGenerator:
    """Stacks per-seed ``np.random.Generator`` draws along axis 0 (size[0] must equal the seed count)."""

    def __init__(self, base_seed: int, num_seeds: int):
        self.generators = [np.random.default_rng([base_seed, i]) for i in range(num_seeds)]

    @property
    def num_seeds(self) -> int:
        return len(self.generators)

    def _rest(self, size) -> tuple[int, ...]:
        size = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
        if not size or size[0] != self.num_seeds:
            raise ValueError(f"draws must have the seed axis first (size[0] = {self.num_seeds}), got size {size}")
        return size[1:]

    def random(self, size) -> np.ndarray:
        rest = self._rest(size)
        return np.stack([g.random(rest) for g in self.generators])

    def uniform(self, low=0.0, high=1.0, size=None) -> np.ndarray:
        return low + (high - low) * self.random(size)

    def integers(self, low, high=None, size=None) -> np.ndarray:
        rest = self._rest(size)
        return np.stack([g.integers(low, high, size=rest) for g in self.generators])

    def standard_normal(self, size) -> np.ndarray:
        rest = self._rest(size)
        return np.stack([g.standard_normal(rest) for g in self.generators])

    def normal(self, loc=0.0, scale=1.0, size=None) -> np.ndarray:
        return loc + scale * self.standard_normal(size)

    def seed_generator(self, index: int) -> np.random.Generator:
        return self.generators[index]

"""One random stream per seed, drawn as if it were one generator with a leading seed axis.

Seed i of a run uses ``np.random.default_rng([base_seed, i])`` whatever the
number of seeds, so the first 16 seeds of a 64-seed run equal a 16-seed run,
and a per-seed Python loop (experiments/naive.py) consumes exactly the same draws.

How ``random`` and ``integers`` are drawn for all seeds at once, bit for bit the per-seed generators' draws:
``PerSeedGenerator``.
"""

from __future__ import annotations

import math
import sys
from typing import Union, cast

import numpy as np

_BLOCK = 4096  # raw outputs fetched per seed at a time (32 KiB per seed)
_LITTLE_ENDIAN = sys.byteorder == "little"
_LOW32 = np.uint64(0xFFFFFFFF)
_DOUBLE_SCALE = 1.0 / 9007199254740992.0  # 2**-53, numpy's next_double


class PerSeedGenerator:
    """Stacks per-seed ``np.random.Generator`` draws along axis 0 (size[0] must equal the seed count).

    Asking 64 generators for a handful of numbers each, three times a step, costs
    more than the rest of a small simulator step. So ``random`` and ``integers``
    (the only draws of the training loop) are computed here, for all seeds at once,
    from blocks of raw 64-bit outputs that each seed's PCG64 bit generator hands out
    in one ``random_raw`` call, with numpy's own algorithms:

    * ``random``: ``(raw >> 11) * 2**-53``, numpy's ``next_double``;
    * ``integers(low, high)`` with ``high - low <= 2**32 - 1`` (int64 results):
      Lemire's multiply-and-reject on 32-bit draws, numpy's
      ``buffered_bounded_lemire_uint32``, where a 32-bit draw is the low half of a
      raw output and the high half is kept for the next 32-bit draw (PCG64's
      ``has_uint32`` / ``uinteger``), across calls. A call in which some draw is
      rejected (probability below (high - low) / 2**32 per draw; never when
      high - low is a power of two) is redone by numpy itself, seed by seed.

    The numbers are therefore those of the per-seed generators, bit for bit
    (``tests/unit/test_rng.py`` checks them against numpy on every path, rejections and
    half-used 32-bit words included). Anything else (another draw, another range,
    another bit generator, ``seed_generator``, ``generators``) first hands every
    seed's position back to its ``np.random.Generator`` (rewinding the outputs
    drawn ahead with ``PCG64.advance``) and then draws seed by seed, as before,
    for the rest of the object's life.
    """

    def __init__(self, base_seed: int, num_seeds: int):
        self._generators = [np.random.default_rng([base_seed, i]) for i in range(num_seeds)]
        # batched mode: raw PCG64 outputs drawn ahead, (S, K); seed s's next one is column _pos[s]
        # (all at column _p while _aligned); _has32 / _word32 (S,): the half-used 32-bit word
        # (PCG64's has_uint32 / uinteger)
        self._batched = all(type(g.bit_generator) is np.random.PCG64 for g in self._generators)
        self._raw = np.zeros((num_seeds, 0), dtype=np.uint64)
        self._store = self._raw  # the memory _raw views (refilled in place when wide enough)
        self._aligned, self._p = True, 0
        self._pos = np.zeros(num_seeds, dtype=np.int64)  # used while not _aligned
        self._has32 = np.zeros(num_seeds, dtype=bool)
        self._word32 = np.zeros(num_seeds, dtype=np.uint64)
        if self._batched:
            self._load_words()

    @property
    def num_seeds(self) -> int:
        return len(self._generators)

    @property
    def generators(self) -> list[np.random.Generator]:
        """The per-seed generators, positioned after every draw so far (ends batched mode)."""
        self._to_direct()
        return self._generators

    def _rest(self, size) -> tuple[int, ...]:
        size = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
        if not size or size[0] != self.num_seeds:
            raise ValueError(f"draws must have the seed axis first (size[0] = {self.num_seeds}), got size {size}")
        return size[1:]

    # --- draws ----------------------------------------------------------------------------------

    def random(self, size) -> np.ndarray:
        rest = self._rest(size)
        if not self._batched:
            return np.stack([g.random(rest) for g in self._generators])
        raw = self._take_raw(math.prod(rest))  # (S, n)
        return ((raw >> np.uint64(11)) * _DOUBLE_SCALE).reshape(size)  # next_double: 53 random bits / 2**53

    def uniform(self, low=0.0, high=1.0, size=None) -> np.ndarray:
        return low + (high - low) * self.random(size)

    def integers(self, low, high=None, size=None) -> np.ndarray:
        rest = self._rest(size)
        if high is None:
            low, high = 0, low
        span = None
        if (self._batched and isinstance(low, (int, np.integer)) and isinstance(high, (int, np.integer))
                and not isinstance(low, bool) and not isinstance(high, bool)):
            span = int(high) - 1 - int(low)  # numpy's closed-interval ``rng``
            if not (0 <= span < 0xFFFFFFFF and -2**63 <= int(low) and int(high) - 1 < 2**63):
                span = None
        if span is None:
            self._to_direct()
            return np.stack([g.integers(low, high, size=rest) for g in self._generators])
        n = math.prod(rest)
        if n == 0 or span == 0:  # numpy draws nothing for an empty array or a one-value range
            return np.full((self.num_seeds, *rest), int(low), dtype=np.int64)  # ``size``, as _rest read it
        out = self._lemire32(span, n)
        if low:
            out += np.int64(low)
        return out.reshape(size)

    def standard_normal(self, size) -> np.ndarray:
        rest = self._rest(size)
        self._to_direct()
        return np.stack([g.standard_normal(rest) for g in self._generators])

    def normal(self, loc=0.0, scale=1.0, size=None) -> np.ndarray:
        return loc + scale * self.standard_normal(size)

    def seed_generator(self, index: int) -> np.random.Generator:
        self._to_direct()
        return self._generators[index]

    # --- batched mode ---------------------------------------------------------------------------

    def _positions(self) -> np.ndarray:
        """(S,) column of each seed's next raw output."""
        return np.full(self.num_seeds, self._p, dtype=np.int64) if self._aligned else self._pos

    def _ensure(self, n: int) -> None:
        """At least ``n`` unconsumed raw outputs for every seed; re-aligns every seed at column 0."""
        width = self._raw.shape[1]
        if self._aligned:
            if width - self._p >= n:
                return
            left = np.full(self.num_seeds, width - self._p)
        else:
            left = width - self._pos  # (S,)
            if int(left.min()) >= n:
                return
        new_width = int(left.max()) + max(n, _BLOCK)
        # the block is refilled in place when it is wide enough: a fresh one of S x 4096 outputs is 2 MiB of new
        # pages to fault in at every refill (no caller holds a view of the outputs past its draw)
        store = self._store if self._store.shape[1] >= new_width else np.empty((self.num_seeds, new_width), np.uint64)
        pos = self._positions()
        for s, g in enumerate(self._generators):
            kept = width - int(pos[s])
            store[s, :kept] = self._raw[s, pos[s]:]  # the same memory when refilled in place: numpy copies safely
            store[s, kept:new_width] = g.bit_generator.random_raw(new_width - kept)
        self._store, self._raw = store, store[:, :new_width]
        self._aligned, self._p = True, 0

    def _take_raw(self, n: int) -> np.ndarray:
        """The next ``n`` raw outputs of every seed, (S, n) (a view while aligned); consumes them."""
        self._ensure(n)
        if self._aligned:
            p = self._p
            self._p = p + n
            return self._raw[:, p:p + n]
        raw = np.take_along_axis(self._raw, self._pos[:, None] + np.arange(n), axis=1)
        self._pos = self._pos + n
        return raw

    def _lemire32(self, span: int, n: int) -> np.ndarray:
        """numpy's ``random_bounded_uint64_fill`` for 0 < span < 2**32 - 1: n draws per seed in [0, span], (S, n)."""
        words = n // 2 + 1  # raw outputs that cover n 32-bit draws whatever the kept word
        self._ensure(words)
        has32 = self._has32
        uniform = bool(has32[0]) if (has32.all() or not has32.any()) else None
        if self._aligned and uniform is not None and _LITTLE_ENDIAN:
            # every seed at the same place of its 32-bit stream: kept word (if any), then lo, hi of each output,
            # which is the uint32 view of the outputs on a little-endian machine
            p, h = self._p, int(uniform)
            block = self._raw[:, p:p + words].view(np.uint32)  # (S, 2 * words): lo0, hi0, lo1, ...
            draws = np.concatenate([self._word32[:, None].astype(np.uint32), block[:, :n - 1]], axis=1) if h \
                else block[:, :n]
        else:
            pos = self._positions()
            raw = np.take_along_axis(self._raw, pos[:, None] + np.arange(words), axis=1)  # (S, words)
            stream = np.empty((self.num_seeds, 2 * words + 1), dtype=np.uint64)  # kept word, lo0, hi0, lo1, ...
            stream[:, 0] = self._word32
            stream[:, 1::2] = raw & _LOW32  # pcg64_next32: the low half first,
            stream[:, 2::2] = raw >> np.uint64(32)  # the high half on the next 32-bit call
            start = np.where(has32, 0, 1)  # (S,) index of each seed's first 32-bit draw
            draws = np.take_along_axis(stream, start[:, None] + np.arange(n), axis=1)
        m = np.multiply(draws, np.uint64(span + 1), dtype=np.uint64)  # (S, n) < 2**64: 32 bits times 32 bits
        threshold = (0xFFFFFFFF - span) % (span + 1)  # 2**32 mod (span + 1): leftovers below it are rejected
        if threshold and bool(((m & _LOW32) < np.uint64(threshold)).any()):
            return self._integers_per_seed(span, n)  # a rejection (probability < span / 2**32 per draw)
        if self._aligned and uniform is not None:
            from_raw = n - int(uniform)  # draws taken from new outputs (after the kept word), the same for all
            used = (from_raw + 1) // 2  # raw outputs consumed
            if used:  # PCG64 leaves ``uinteger`` at the high half of the last output split, used or not
                self._word32 = self._raw[:, self._p + used - 1] >> np.uint64(32)
            self._has32 = np.full(self.num_seeds, from_raw % 2 == 1)  # ended on a low half: its high half is kept
            self._p += used
        else:
            self._consume32(n)
        return (m >> np.uint64(32)).astype(np.int64)

    def _consume32(self, n: int) -> None:
        """Advance every seed's 32-bit stream by ``n`` draws (no rejections)."""
        from_raw = n - self._has32.astype(np.int64)  # (S,) draws taken from new outputs (after the kept word)
        used = (from_raw + 1) // 2  # (S,) raw outputs consumed
        pos = self._positions()
        last = pos + np.maximum(used - 1, 0)  # column of the last output used
        high = self._raw[np.arange(self.num_seeds), last] >> np.uint64(32)
        # PCG64 leaves ``uinteger`` at the high half of the last output split, used or not
        self._word32 = np.where(used > 0, high, self._word32)
        self._has32 = from_raw % 2 == 1  # ended on a low half: its high half is kept
        if self._aligned and bool(np.all(used == used[0])):
            self._p += int(used[0])
        else:
            self._aligned, self._pos = False, pos + used

    def _integers_per_seed(self, span: int, n: int) -> np.ndarray:
        """The same draws by numpy itself, seed by seed (after handing the positions back), then batch again."""
        self._sync()
        out = np.stack([g.integers(0, span + 1, size=n) for g in self._generators])
        self._load_words()
        return out

    def _load_words(self) -> None:
        """Each seed's half-used 32-bit word, from its bit generator's state."""
        for s, g in enumerate(self._generators):
            state = g.bit_generator.state
            self._has32[s] = bool(state["has_uint32"])
            self._word32[s] = state["uinteger"]

    def _sync(self) -> None:
        """Put every seed's generator where its draws so far left it; drop the outputs drawn ahead."""
        pos = self._positions()
        for s, g in enumerate(self._generators):
            bit_generator = cast(np.random.PCG64, g.bit_generator)  # batched mode runs on PCG64 only
            ahead = self._raw.shape[1] - int(pos[s])
            if ahead:
                bit_generator.advance(-ahead)  # PCG64 steps modulo 2**128: back over the unconsumed outputs
            state = bit_generator.state
            state["has_uint32"] = int(self._has32[s])
            state["uinteger"] = int(self._word32[s])
            bit_generator.state = state
        self._raw = np.zeros((self.num_seeds, 0), dtype=np.uint64)
        self._aligned, self._p = True, 0

    def _to_direct(self) -> None:
        """Hand every seed's position back to its np.random.Generator and stop batching."""
        if self._batched:
            self._sync()
            self._batched = False


RandomSource = Union[np.random.Generator, PerSeedGenerator]
"""What a buffer or a pipeline draws from: one generator, or ``PerSeedGenerator`` (the seed axis first)."""

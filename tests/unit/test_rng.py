"""core/rng.py: the batched draws are the per-seed numpy generators' draws, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from replay_theory.core.rng import PerSeedGenerator


def reference(base_seed: int, num_seeds: int) -> list[np.random.Generator]:
    return [np.random.default_rng([base_seed, i]) for i in range(num_seeds)]


def draw(gens, kind, *args):
    if kind == "random":
        return np.stack([g.random(args[0]) for g in gens])
    low, high, rest = args
    return np.stack([g.integers(low, high, size=rest) for g in gens])


# (kind, args) sequences: odd counts leave half a 32-bit word for the next integers call; spans that do
# not divide 2**32 reject a draw now and then (3 * 2**30: a quarter of them), which takes the per-seed path
SEQUENCES = {
    "engine-step": [("integers", 0, 64, (8,)), ("random", (64,)), ("random", (64,))] * 40,
    "odd-counts": [("integers", 0, 100, (3,)), ("random", (5,)), ("integers", 0, 7, (1,)),
                   ("integers", -5, 1000, (2, 3)), ("random", (2, 2))] * 60,
    "rejections": [("integers", 0, 3 * 2**30, (5,)), ("random", (3,)), ("integers", 0, 10, (3,))] * 30,
    "mixed-words": [("integers", 0, 3 * 2**30, (5,)), ("integers", 0, 10, (3,)), ("random", (4,)),
                    ("integers", 0, 10, (2,)), ("random", (3,))] * 20,  # seeds at different places of their streams
    "big-blocks": [("random", (3000,)), ("integers", 0, 2**32 - 2, (4001,)), ("random", (7,))] * 3,
    "empty-and-trivial": [("integers", 3, 4, (5,)), ("random", (0,)), ("integers", 0, 9, (0,)),
                          ("integers", 0, 9, (1,)), ("random", ())] * 10,
}


@pytest.mark.parametrize("name", sorted(SEQUENCES))
@pytest.mark.parametrize("num_seeds", [1, 5])
def test_batched_draws_equal_the_per_seed_generators(name, num_seeds):
    rng, gens = PerSeedGenerator(11, num_seeds), reference(11, num_seeds)
    for kind, *args in SEQUENCES[name]:
        if kind == "random":
            got, want = rng.random((num_seeds, *args[0])), draw(gens, "random", args[0])
        else:
            low, high, rest = args
            got, want = rng.integers(low, high, size=(num_seeds, *rest)), draw(gens, "integers", low, high, rest)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    # handing the positions back: every generator continues exactly where its reference is
    for g, ref in zip(rng.generators, gens):
        assert g.bit_generator.state == ref.bit_generator.state
        np.testing.assert_array_equal(g.integers(0, 1000, size=3), ref.integers(0, 1000, size=3))


@pytest.mark.parametrize("handover", ["wide-range", "standard-normal", "seed-generator", "generators"])
def test_unbatched_draws_hand_over_and_continue_per_seed(handover):
    rng, gens = PerSeedGenerator(3, 4), reference(3, 4)
    np.testing.assert_array_equal(rng.integers(0, 5, size=(4, 3)), draw(gens, "integers", 0, 5, (3,)))
    np.testing.assert_array_equal(rng.random((4, 6)), draw(gens, "random", (6,)))
    if handover == "wide-range":  # 64-bit Lemire: numpy's own per-seed draws
        np.testing.assert_array_equal(rng.integers(0, 2**40, size=(4, 2)), draw(gens, "integers", 0, 2**40, (2,)))
    elif handover == "standard-normal":
        want = 1.0 + 2.0 * np.stack([g.standard_normal(2) for g in gens])
        np.testing.assert_array_equal(rng.normal(1.0, 2.0, (4, 2)), want)
    elif handover == "seed-generator":
        np.testing.assert_array_equal(rng.seed_generator(2).choice(10, size=3), gens[2].choice(10, size=3))
    else:
        np.testing.assert_array_equal(rng.generators[1].random(2), gens[1].random(2))
    np.testing.assert_array_equal(rng.uniform(2.0, 3.0, (4, 6)), 2.0 + draw(gens, "random", (6,)))
    np.testing.assert_array_equal(rng.integers(9, size=(4, 5)), draw(gens, "integers", 0, 9, (5,)))


def test_seed_axis_first_is_required():
    with pytest.raises(ValueError, match="seed axis first"):
        PerSeedGenerator(0, 3).random((2, 4))

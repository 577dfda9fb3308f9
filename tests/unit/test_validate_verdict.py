"""validate/verdict.py: rank, regret and power of the predicted design, by hand and against a naive loop."""

import math

import numpy as np
import pytest

from replay_theory.validate.verdict import compare, pair_power

NAMES = ["on-policy", "predicted", "N x2", "RLOO"]


def test_rank_and_regret_by_hand():
    rewards = np.array([[0.20, 0.22, 0.21],   # mean 0.21
                        [0.24, 0.26, 0.25],   # mean 0.25: the predicted design
                        [0.27, 0.29, 0.28],   # mean 0.28: beats it
                        [0.40, 0.40, 0.40]])  # outside the family
    family = np.array([True, True, True, False])
    v = compare(rewards, NAMES, 1, family, np.random.default_rng(0), draws=500)
    assert v["family"]["rank"] == 2 and v["family"]["best"] == "N x2" and v["family"]["designs"] == 3
    assert v["family"]["regret"] == pytest.approx(0.03)
    assert v["all"]["rank"] == 3 and v["all"]["best"] == "RLOO" and v["all"]["regret"] == pytest.approx(0.15)
    # every paired difference is exactly -0.03 on every seed: zero spread, rank 2 in every replicate
    assert v["family"]["rank_ci"] == (2.0, 2.0) and v["family"]["probability_predicted_best"] == 0.0
    assert v["family"]["regret_ci"] == pytest.approx((0.03, 0.03))
    pairs = {p["design"]: p for p in v["pairs"]}
    assert set(pairs) == {"on-policy", "N x2"}  # the family only
    assert pairs["N x2"]["difference"] == pytest.approx(-0.03) and pairs["N x2"]["se"] == pytest.approx(0, abs=1e-12)
    assert pairs["N x2"]["separated"] and pairs["N x2"]["seeds_needed"] == 2


def test_pair_power_by_hand():
    # differences 0.01, 0.03, -0.01, 0.01: mean 0.01, var (0 + 4 + 4 + 0) / 3 * 1e-4, se = sqrt(var / 4)
    p = pair_power(np.array([0.31, 0.33, 0.29, 0.31]), np.full(4, 0.30), "other")
    var = 8e-4 / 3
    assert p["difference"] == pytest.approx(0.01) and p["se"] == pytest.approx(math.sqrt(var / 4))
    assert not p["separated"]  # 0.01 < 2 x 0.0082
    assert p["seeds_needed"] == math.ceil(4 * var / 0.01**2) == 11


def test_bootstrap_equals_a_naive_loop():
    rng = np.random.default_rng(3)
    rewards = rng.normal(0.25, 0.02, size=(5, 6))
    family = np.array([True, True, True, True, False])
    v = compare(rewards, [f"d{i}" for i in range(5)], 2, family, np.random.default_rng(11), draws=300)
    idx = np.random.default_rng(11).integers(0, 6, size=(300, 6))  # the same paired draws
    regrets, ranks = [], []
    for row in idx:
        means = [rewards[d, row].mean() for d in range(5)]
        fam = [means[d] for d in range(5) if family[d]]
        regrets.append(max(fam) - means[2])
        ranks.append(1 + sum(m > means[2] for m in fam))
    lo, hi = np.percentile(regrets, [5, 95])
    assert v["family"]["regret_ci"] == pytest.approx((lo, hi))
    assert v["family"]["probability_predicted_best"] == pytest.approx(np.mean(np.array(ranks) == 1))


def test_one_seed_or_a_predicted_design_outside_the_family_is_refused():
    with pytest.raises(ValueError, match=">= 2 seeds"):
        compare(np.zeros((2, 1)), ["a", "b"], 0, np.array([True, True]), np.random.default_rng(0))
    with pytest.raises(ValueError, match="must belong to the family"):
        compare(np.zeros((2, 3)), ["a", "b"], 1, np.array([True, False]), np.random.default_rng(0))

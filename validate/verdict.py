"""The verify verdict: does the predicted design win at equal compute, by how much, and could the run tell?

Paper: experience-replay (docs/REFERENCES.md), Thm 3.5: the predicted (x*, y*) should need the least
compute for a given progress, so at EQUAL compute it should end with the highest reward. Pure numpy
over the held-out rewards of every (design, seed) run, seed axis last:

| code name     | meaning                                                                                 |
|---------------|-----------------------------------------------------------------------------------------|
| ``rewards``   | (D, S) held-out reward of design d trained with seed s (seed s shares its evaluation    |
|               | seed and warm start across designs, so the seed axis is PAIRED)                         |
| ``rank``      | 1 + number of designs whose mean reward beats the predicted design's                     |
| ``regret``    | best design's mean reward - predicted design's, at equal compute (>= 0 by definition)   |
| ``se_diff``   | standard error of the paired difference predicted - other                               |
| ``seeds_needed`` | seeds at which |difference| = 2 se_diff (the difference as measured, same spread)   |

Intervals come from a paired seed bootstrap: each replicate draws S seed indices with replacement
and applies them to every design, then recomputes the best design, the regret and the rank. The
regret's point estimate is biased upward (the max of noisy means); its interval says how much.
"""

from __future__ import annotations

import math

import numpy as np

from ..theory.resampling import percentile_interval, replicates


def compare(rewards: np.ndarray, names: list[str], predicted: int, family: np.ndarray, rng: np.random.Generator,
            draws: int = 2000, level: float = 0.9) -> dict:
    """Rank, regret and power of design ``predicted`` among the designs in ``family`` (bool (D,)) and among all.

    ``rewards`` (D, S). Returns plain floats (JSON-ready).
    """
    rewards = np.asarray(rewards, dtype=float)
    D, S = rewards.shape
    if S < 2:
        raise ValueError(f"a verdict needs >= 2 seeds per design, got {S}")
    family = np.asarray(family, bool)
    if not family[predicted]:
        raise ValueError("the predicted design must belong to the family it is ranked in")
    means = rewards.mean(axis=1)  # (D,)
    # every design's mean over the same resampled seeds (paired): (draws, D)
    boot = replicates(lambda index: rewards[:, index].mean(axis=2), S, draws, rng).T
    out = {"level": level, "draws": draws, "seeds": S}
    for scope, members in (("family", family), ("all", np.ones(D, bool))):
        member_means = np.where(members, means, -np.inf)
        best = int(np.argmax(member_means))
        boot_members = np.where(members[None, :], boot, -np.inf)
        regret_boot = boot_members.max(axis=1) - boot[:, predicted]  # (draws,)
        rank_boot = 1 + (boot_members > boot[:, [predicted]]).sum(axis=1)  # (draws,)
        out[scope] = {
            "designs": int(members.sum()),
            "best": names[best],
            "rank": int(1 + (member_means > means[predicted]).sum()),
            "rank_ci": percentile_interval(rank_boot.astype(float), level, finite_only=False),
            "regret": float(member_means[best] - means[predicted]),
            "regret_ci": percentile_interval(regret_boot, level, finite_only=False),
            "probability_predicted_best": float((rank_boot == 1).mean()),
        }
    out["pairs"] = [pair_power(rewards[predicted], rewards[d], names[d]) for d in range(D)
                    if d != predicted and family[d]]
    return out


def pair_power(predicted: np.ndarray, other: np.ndarray, name: str) -> dict:
    """Paired difference predicted - other over seeds, its standard error, and the seeds a 2-se separation needs.

    seeds_needed = ceil(4 var(diff) / mean(diff)^2): the n at which the measured mean difference equals two
    standard errors sqrt(var / n) (about 50% power at a two-sided 5% test; 80% power needs 2x that).
    """
    diff = np.asarray(predicted, float) - np.asarray(other, float)  # (S,)
    S = diff.size
    mean, var = float(diff.mean()), float(diff.var(ddof=1))
    se = math.sqrt(var / S)
    separated = abs(mean) > 2 * se
    needed = math.inf if mean == 0 else math.ceil(4 * var / mean**2)
    return {"design": name, "difference": mean, "se": se, "separated": bool(separated),
            "seeds_needed": None if math.isinf(needed) else max(needed, 2)}

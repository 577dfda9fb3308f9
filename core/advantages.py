"""Group-relative advantages shared by the simulator and the validator.

Papers (docs/REFERENCES.md):

* GRPO advantage: Shao et al. 2024 (arXiv:2402.03300), as printed in M2PO
  Eq. (2), ExGRPO Eq. (2)/(5) and the experience-replay paper App. E.2, Eq. (6).
* Dr. GRPO (Liu et al. 2025, arXiv:2503.20783): no std normalisation; ExGRPO's
  implementation uses it (App. D.1).
* Leave-one-out (RLOO) advantage: RLOO group replay Eq. (1),
  implemented once in :func:`replay_theory.theory.group_replay.leave_one_out_advantage`.

Axis convention: ``reward`` is (S, g, G): seeds, groups (prompts), responses
per group. Every function returns the same shape; the group statistics are
taken over the LAST axis.

| code name        | paper symbol             | meaning                                          |
|------------------|--------------------------|--------------------------------------------------|
| ``reward``       | r_i (R_i in some papers) | verifier reward of response i of a group         |
| ``G``            | G (K in RLOO / ExGRPO)   | responses per group (last axis)                  |
| ``eps``          | 1e-6 in the codes        | added to the std (M2PO code, TRL 1e-4, verl 1e-6)|
| ``ddof``         | -                        | 1 = unbiased std (torch ``.std()``: TRL, verl)   |
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable

import numpy as np
from numpy.typing import ArrayLike

from ..checks import invalid, one_of, require_nonnegative
from ..theory.group_replay import leave_one_out_advantage
from ..theory.moments import column_sums

__all__ = [
    "group_advantage",
    "group_mean_baseline",
    "leave_one_out",
    "ADVANTAGES",
    "get_advantage",
]


def _rewards(reward: ArrayLike, minimum_group: int = 1) -> np.ndarray:
    r = np.asarray(reward, dtype=float)  # (S, g, G)
    if r.ndim != 3:
        raise ValueError(f"reward must have shape (S, g, G) = (seeds, groups, responses), got shape {r.shape}")
    if r.shape[-1] < minimum_group:
        raise ValueError(f"reward needs G >= {minimum_group} responses per group (last axis), got shape {r.shape}")
    if not np.all(np.isfinite(r)):
        raise ValueError("reward must be finite")
    return r


def group_advantage(reward: ArrayLike, normalize_std: bool = True, eps: float = 1e-6, ddof: int = 1) -> np.ndarray:
    """GRPO group-relative advantage A_i = (r_i - mean_G r) / (std_G r + eps).  GRPO Eq. (2) in M2PO.

    ``normalize_std=False`` returns r_i - mean_G r: Dr. GRPO's advantage, the one
    ExGRPO's implementation uses (App. D.1), and the group-mean baseline of
    REINFORCE (:func:`group_mean_baseline`).

    ``ddof=1`` (default) is the unbiased std of ``torch.Tensor.std``, which TRL and
    verl use; ``ddof=0`` the population std. A group with identical rewards gets
    A = 0 (0 / eps). Input and output (S, g, G); ddof=1 needs G >= 2.
    """
    # a float in [0, inf) (the default, every step) is what require_nonnegative accepts: only anything else goes
    # through it (NaN, negatives, inf and other types raise there as before), without its array round trip per call
    if not (type(eps) is float and 0.0 <= eps < math.inf):
        require_nonnegative("eps", eps)
    if ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 or 1, got {ddof!r}")
    r = _rewards(reward, minimum_group=1 + ddof if normalize_std else 1)
    G = r.shape[-1]
    # the group sums over a transposed copy (G, S g), one group a column: numpy's own pairwise sum of each group
    # (theory.moments.column_sums), in G - 1 vector additions instead of one reduction call per group
    centred = np.ascontiguousarray(r.reshape(-1, G).T)  # (G, S g)
    centred -= column_sums(centred) / G  # r - r.mean(axis=-1): numpy's mean is the sum over G, divided by G
    if not normalize_std:
        return np.ascontiguousarray(centred.T).reshape(r.shape)  # Dr. GRPO: no std normalisation (ExGRPO App. D.1)
    # r.std(axis=-1, ddof=ddof), computed as numpy computes it (sqrt of the summed squares of r - mean over
    # G - ddof) from the centred rewards already at hand: the same numbers (tests/unit/test_losses.py), without
    # np.std's second mean and Python overhead
    std = np.sqrt(column_sums(centred * centred) / (G - ddof))  # (S g,)
    with np.errstate(invalid="ignore", divide="ignore"):
        adv = centred / (std + eps)  # Eq. (2), M2PO: (r - mean) / std (+1e-6 in code)
    adv = np.where(std == 0.0, 0.0, adv)  # eps = 0 and a constant group: 0, not 0/0
    return np.ascontiguousarray(adv.T).reshape(r.shape)  # (S, g, G)


def group_mean_baseline(reward: ArrayLike) -> np.ndarray:
    """REINFORCE with the group-mean baseline: A_i = r_i - mean_G r.  (S, g, G) -> (S, g, G).

    The same as Dr. GRPO's advantage and as AsymRE's r - V-hat with delta V = 0
    (experience-replay paper, App. E).
    """
    r = _rewards(reward)
    return r - r.mean(axis=-1, keepdims=True)  # App. E, experience replay: V-hat = group mean


def leave_one_out(reward: ArrayLike) -> np.ndarray:
    """RLOO advantage A_i = r_i - mean_{j != i} r_j = G/(G-1) (r_i - mean r).  Replay-RLOO Eq. (1).

    Delegates to :func:`replay_theory.theory.group_replay.leave_one_out_advantage`.
    (S, g, G) -> (S, g, G), G >= 2.
    """
    r = _rewards(reward, minimum_group=2)
    return leave_one_out_advantage(r)  # Eq. (1), Replay-RLOO


#: name -> advantage function of ``reward (S, g, G)``. "dr-grpo" and "group-mean" are the same estimator.
ADVANTAGES: dict[str, Callable[..., np.ndarray]] = {
    "grpo": group_advantage,
    "dr-grpo": partial(group_advantage, normalize_std=False),
    "group-mean": group_mean_baseline,
    "leave-one-out": leave_one_out,
}


def get_advantage(name: str) -> Callable[..., np.ndarray]:
    """The advantage function registered under ``name``; ValueError listing the names otherwise."""
    try:
        return ADVANTAGES[name]
    except (KeyError, TypeError):
        raise invalid("advantage", one_of(ADVANTAGES), name) from None

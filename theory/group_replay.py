"""RLOO with bounded-age whole-group replay (Replay-RLOO on Countdown).

Paper: "RLOO with bounded-age group replay on Countdown"
(RLOO group replay, docs/REFERENCES.md), Sec. 3 and App. B (Table 6);
pass@k estimator from Chen et al. 2021 (arXiv:2107.03374).

| code name         | paper symbol               | meaning                                                |
|-------------------|----------------------------|--------------------------------------------------------|
| ``B``             | B                          | prompt groups per update (128)                         |
| ``K``             | K                          | responses per group (8)                                |
| ``T``             | T (= 100)                  | optimizer steps per run                                |
| ``rho``           | rho                        | reused groups per fresh group in a batch               |
| ``L``             | L                          | maximum replay age (eligible ages 1..L)                |
| ``c``             | c                          | clip ceiling of the importance weight (Eq. 2)          |
| ``rewards``       | r_i                        | verifier rewards of one group, last axis = K           |
| ``seq_log_ratio`` | log pi_theta(y|x) - log mu(y|x) | sequence-level log importance ratio                |
| ``n, c, k``       | n, c, k                    | samples, correct samples, budget of pass@k (Eq. 4)     |

Axis convention: a group's K responses lie along the **last** axis; leading
axes are a batch (seeds, prompts).

Rounding of B_fresh = round(B / (1 + rho)): the paper does not say which
rounding. Table 6 (B = 128, rho in {0, 0.5, 1, 1.5, 2}) never hits an exact .5
(128/1.5 = 85.33, 128/2.5 = 51.2, 128/3 = 42.67), so half-up and Python's
half-to-even both reproduce it. The default here is half-up (the usual
mathematical reading); ``rounding="half_even"`` gives Python's ``round`` /
``np.rint``. They differ only on exact ties, e.g. B = 5, rho = 1 (2.5 -> 3 vs 2).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from ..checks import require_int, require_nonnegative, require_positive

__all__ = [
    "fresh_groups_per_step",
    "replay_groups_per_step",
    "fresh_verifier_evaluations",
    "is_feasible",
    "replay_shortfall",
    "check_group_replay",
    "expected_pool_size",
    "leave_one_out_advantage",
    "clipped_sequence_weight",
    "clipping_bias_proxy",
    "pass_at_k",
]

Rounding = Literal["half_up", "half_even"]


def _require_rho(rho: object) -> np.ndarray:
    rho_arr = np.asarray(rho, dtype=float)
    require_nonnegative("rho", rho_arr)
    return rho_arr


def _scalar_or_array(x: np.ndarray) -> np.ndarray:
    """0-d results come back as numpy scalars, everything else as arrays."""
    return x[()]


def fresh_groups_per_step(B: ArrayLike, rho: ArrayLike, rounding: Rounding = "half_up") -> np.ndarray:
    """Fresh groups per step once the buffer is full: B_fresh = round(B / (1 + rho)).

    B = 128 gives 128, 85, 64, 51, 43 for rho = 0, 0.5, 1, 1.5, 2 (Table 6) under
    either rounding (see the module docstring). Requires B integer >= 1, rho >= 0.
    """
    B_arr = require_int("B", B, 1)
    rho_arr = _require_rho(rho)
    x = B_arr / (1.0 + rho_arr)
    if rounding == "half_up":
        fresh = np.floor(x + 0.5)  # App. B, Replay-RLOO: B_fresh = round(B / (1 + rho))
    elif rounding == "half_even":
        fresh = np.rint(x)  # App. B, Replay-RLOO, rounded like Python's round()
    else:
        raise ValueError(f"rounding must be 'half_up' or 'half_even', got {rounding!r}")
    return _scalar_or_array(fresh.astype(np.int64))


def replay_groups_per_step(B: ArrayLike, rho: ArrayLike, rounding: Rounding = "half_up") -> np.ndarray:
    """Reused groups per step: B_replay = B - B_fresh (Table 6). Same arguments as fresh."""
    B_arr = require_int("B", B, 1)
    return _scalar_or_array(B_arr - fresh_groups_per_step(B_arr, rho, rounding))  # App. B, Replay-RLOO


def fresh_verifier_evaluations(
    K: ArrayLike, B: ArrayLike, T: ArrayLike, rho: ArrayLike, rounding: Rounding = "half_up"
) -> np.ndarray:
    """Fresh verifier evaluations over a run: K (B + (T - 1) B_fresh).

    The first step is all fresh (empty buffer); later steps use B_fresh fresh
    groups, assuming the eligible pool always covers the replay demand (no
    shortfall, see :func:`replay_shortfall`). B = 128, K = 8, T = 100 gives
    102,400 / 68,344 / 51,712 / 41,416 / 35,080 for rho = 0 / 0.5 / 1 / 1.5 / 2.
    Requires K, B, T integers >= 1 and rho >= 0.
    """
    K_arr = require_int("K", K, 1)
    B_arr = require_int("B", B, 1)
    T_arr = require_int("T", T, 1)
    fresh = fresh_groups_per_step(B_arr, rho, rounding)
    return _scalar_or_array(K_arr * (B_arr + (T_arr - 1) * fresh))  # App. B, Replay-RLOO: K (B + 99 B_fresh)


def is_feasible(rho: ArrayLike, L: ArrayLike) -> np.ndarray:
    """rho <= L: the steady-state pool (~ L B_fresh) covers the demand (rho B_fresh).

    Requires rho >= 0 and L integer >= 0. See :func:`replay_shortfall` for the
    exact integer condition once B_fresh is rounded.
    """
    rho_arr = _require_rho(rho)
    L_arr = require_int("L", L, 0)
    return _scalar_or_array(np.asarray(rho_arr <= L_arr))  # Sec. 3.2 / App. B, Replay-RLOO


def replay_shortfall(B: ArrayLike, rho: ArrayLike, L: ArrayLike, rounding: Rounding = "half_up") -> np.ndarray:
    """Steady-state shortfall max(0, B_replay - L B_fresh), filled with fresh groups.

    Rounding can make this positive even when rho <= L: B = 100, rho = 2, L = 2
    gives B_fresh = 33, B_replay = 67 > 66, so one extra fresh group per step and
    :func:`fresh_verifier_evaluations` undercounts. Zero for every cell of the
    paper (B = 128, rho <= L). Requires B integer >= 1, rho >= 0, L integer >= 0.
    """
    B_arr = require_int("B", B, 1)
    L_arr = require_int("L", L, 0)
    fresh = fresh_groups_per_step(B_arr, rho, rounding)
    demand = B_arr - fresh
    return _scalar_or_array(np.maximum(0, demand - L_arr * fresh))  # pool ~ L B_fresh, App. B


def check_group_replay(rho: float, L: int, c: float, B: int, K: int) -> None:
    """Validate one Replay-RLOO configuration; raise ``ValueError`` naming the bad parameter.

    rho >= 0; L integer >= 0 (L = 0 only for the fresh-only baseline rho = 0);
    rho <= L; c > 0 (inf allowed: no clipping); B integer >= 1 with at least one
    fresh group per step; K integer >= 2 (the leave-one-out baseline needs a
    second response).
    """
    rho_arr = _require_rho(rho)
    L_arr = require_int("L", L, 0)
    require_positive("c", np.asarray(c, dtype=float), allow_inf=True)
    B_arr = require_int("B", B, 1)
    require_int("K", K, 2)
    if np.any(rho_arr > L_arr):
        raise ValueError(f"rho must be <= L (max age), got rho={float(rho):g}, L={int(L)}")
    if np.any(fresh_groups_per_step(B_arr, rho_arr) < 1):
        raise ValueError(
            f"rho must leave at least one fresh group per step (round(B / (1 + rho)) >= 1), "
            f"got rho={float(rho):g}, B={int(B)}"
        )


def expected_pool_size(L: ArrayLike, B_fresh: ArrayLike) -> np.ndarray:
    """Steady-state eligible pool ~ L B_fresh (groups of ages 1..L).

    The buffer briefly holds (L + 1) B_fresh groups right after adding the fresh
    ones, before over-age eviction (App. B). Requires L, B_fresh integers >= 0.
    """
    L_arr = require_int("L", L, 0)
    fresh = require_int("B_fresh", B_fresh, 0)
    return _scalar_or_array(L_arr * fresh)  # App. B, Replay-RLOO: pool ~ L B_fresh


def leave_one_out_advantage(rewards: ArrayLike) -> np.ndarray:
    """Leave-one-out advantage over the last axis (K responses): A_i = r_i - mean_{j != i} r_j.

    Equivalently A_i = K/(K-1) (r_i - mean_j r_j), so sum_i A_i = 0.
    Input (..., K) with K >= 2, output (..., K).
    """
    r = np.asarray(rewards, dtype=float)  # (..., K)
    if r.ndim == 0 or r.shape[-1] < 2:
        raise ValueError(f"rewards must have K >= 2 responses on the last axis, got shape {r.shape}")
    K = r.shape[-1]
    total = r.sum(axis=-1, keepdims=True)  # (..., 1)
    return r - (total - r) / (K - 1)  # Eq. (1), Replay-RLOO


def clipped_sequence_weight(
    seq_log_ratio: ArrayLike, c: ArrayLike, fresh_mask: ArrayLike | None = None
) -> np.ndarray:
    """One-sided clipped importance weight w = min(c, exp(log pi_theta - log mu)).

    Computed as exp(min(log c, log ratio)), so a log ratio of 1e4 gives c, not
    an overflow. Entries where ``fresh_mask`` is True get 1 (behaviour = current
    policy at age 0). c = inf leaves the ratio unclipped (and may then overflow
    to inf). Treat the result as a constant (detached) weight. Requires c > 0.
    """
    lr = np.asarray(seq_log_ratio, dtype=float)
    c_arr = np.asarray(c, dtype=float)
    require_positive("c", c_arr, allow_inf=True)
    with np.errstate(over="ignore"):
        w = np.exp(np.minimum(np.log(c_arr), lr))  # Eq. (2), Replay-RLOO
    if fresh_mask is not None:
        w = np.where(np.asarray(fresh_mask, dtype=bool), 1.0, w)  # Sec. 3.2: fresh groups w = 1
    return _scalar_or_array(np.asarray(w))


def clipping_bias_proxy(seq_log_ratio: ArrayLike, c: ArrayLike) -> np.ndarray:
    """E[(r - c)_+] over the last axis (samples), r = exp(seq_log_ratio).

    This is the mass the clip removes: E[min(c, r)] = E[r] - E[(r - c)_+], and
    E_mu[r] = 1. Each term is c * expm1(max(log r - log c, 0)), which is exact
    for r just above c and overflows only when the true value is inf.
    Requires c > 0 (finite) and at least one sample on the last axis.
    """
    lr = np.asarray(seq_log_ratio, dtype=float)  # (..., n)
    c_arr = np.asarray(c, dtype=float)
    require_positive("c", c_arr)
    if lr.ndim == 0 or lr.shape[-1] == 0:
        raise ValueError(f"seq_log_ratio must have at least one sample on the last axis, got shape {lr.shape}")
    with np.errstate(over="ignore"):
        excess = c_arr * np.expm1(np.maximum(lr - np.log(c_arr), 0.0))  # (r - c)_+ = c (r/c - 1)_+
    return _scalar_or_array(excess.mean(axis=-1))  # Sec. 3.2, Replay-RLOO: E[min(c,r)] = 1 - E[(r-c)_+]


def pass_at_k(n: ArrayLike, c: ArrayLike, k: ArrayLike) -> np.ndarray:
    """Unbiased pass@k = 1 - C(n - c, k) / C(n, k), vectorised over broadcast n, c, k.

    Product form of Chen et al. (2021): C(n-c,k)/C(n,k) = prod_{i=n-c+1}^{n} (1 - k/i)
    = prod_{j=0}^{k-1} (1 - c/(n-j)); per element the shorter product (min(c, k)
    factors) is summed in log1p form and 1 - exp(.) taken with expm1, so tiny
    and near-1 values keep full precision. Result is 1 where n - c < k.
    Requires integers n >= 1, 0 <= c <= n, 1 <= k <= n.
    """
    n_arr = require_int("n", n, 1)
    c_arr = require_int("c", c, 0)
    k_arr = require_int("k", k, 1)
    n_arr, c_arr, k_arr = np.broadcast_arrays(n_arr, c_arr, k_arr)
    if np.any(c_arr > n_arr):
        bad = c_arr > n_arr
        raise ValueError(f"c must be in [0, n], got c={c_arr[bad].ravel()[0]}, n={n_arr[bad].ravel()[0]}")
    if np.any(k_arr > n_arr):
        bad = k_arr > n_arr
        raise ValueError(f"k must be in [1, n], got k={k_arr[bad].ravel()[0]}, n={n_arr[bad].ravel()[0]}")
    certain = n_arr - c_arr < k_arr  # every k-subset holds a correct sample
    use_c_form = c_arr <= k_arr
    n_terms = np.where(certain, 0, np.minimum(c_arr, k_arr))  # factors in the shorter product
    other = np.where(use_c_form, k_arr, c_arr).astype(float)
    log_ratio = np.zeros(n_arr.shape)
    for t in range(int(n_terms.max(initial=0))):
        active = t < n_terms
        denom = np.where(active, n_arr - t, 1).astype(float)
        term = np.log1p(-np.where(active, other, 0.0) / denom)  # Eq. (4): factor 1 - k/(n-t) or 1 - c/(n-t)
        log_ratio += np.where(active, term, 0.0)
    p = -np.expm1(log_ratio)  # Eq. (4), Replay-RLOO: 1 - C(n-c,k)/C(n,k)
    return _scalar_or_array(np.where(certain, 1.0, p))

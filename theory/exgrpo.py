"""ExGRPO: experience replay for reasoning (question buckets, batch split, policy shaping).

Paper: "ExGRPO: Learning to Reason from Experience"
(ExGRPO, docs/REFERENCES.md), Sec. 4 and App. B (Algs. 1-2).

| code name        | paper symbol                  | meaning                                           |
|------------------|-------------------------------|---------------------------------------------------|
| ``w``            | w*(theta)                     | importance ratio of the replayed trajectory o*    |
| ``beta``         | beta (= 0.1)                  | policy-shaping constant, f(w) = w / (w + beta)    |
| ``K``            | K                             | rollouts per question (8)                         |
| ``k``            | k                             | bucket: latest success count, 0 < k < K           |
| ``mu, sigma``    | mu, sigma                     | Gaussian bucket weighting N(.; mu, sigma)         |
| ``B``            | B                             | mini-batch size (questions)                       |
| ``rho``          | rho in [0, 1)                 | experiential proportion of the batch              |
| ``n_experience`` | abs(E)                        | questions in the replay buffer                    |
| ``bucket_sizes`` | abs(U_k)                      | questions in bucket k                             |

Bucket weights in two unit conventions (success count, accuracy): ``bucket_probabilities``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from ..checks import invalid, require_finite, require_int, require_nonnegative, require_positive

__all__ = [
    "shaping",
    "shaping_gradient_weight",
    "bucket_probabilities",
    "batch_split",
    "item_probabilities",
]

Units = Literal["success-count", "accuracy"]


def _scalar_or_array(x: np.ndarray) -> np.ndarray:
    """0-d results come back as numpy scalars, everything else as arrays."""
    return x[()]


def shaping(w: ArrayLike, beta: ArrayLike = 0.1) -> np.ndarray:
    """Policy-shaping transform f(w) = w / (w + beta) for the replayed trajectory o*.

    Increasing, 0 <= f < 1, f(w) ~ w/beta for small w. Requires w >= 0 (inf
    allowed, f = 1) and beta > 0 (finite).
    """
    w_arr = np.asarray(w, dtype=float)
    beta_arr = np.asarray(beta, dtype=float)
    require_nonnegative("w", w_arr, allow_inf=True)
    require_positive("beta", beta_arr)
    with np.errstate(invalid="ignore"):
        f = np.where(np.isinf(w_arr), 1.0, w_arr / (w_arr + beta_arr))  # Sec. 4.2, ExGRPO: f(x) = x/(x+beta)
    return _scalar_or_array(f)


def shaping_gradient_weight(w: ArrayLike, beta: ArrayLike = 0.1) -> np.ndarray:
    """Factor multiplying A grad log pi under shaping: beta w / (w + beta)^2.

    d f(w)/d theta = f'(w) dw/d theta = beta/(w + beta)^2 * w grad log pi. It
    peaks at 1/4 at w = beta and is beta/(1 + beta)^2 ~= 0.0826 at w = 1 for
    beta = 0.1 (an unclipped on-policy term has factor w = 1). Requires w >= 0
    (inf allowed, factor 0) and beta > 0 (finite).
    """
    w_arr = np.asarray(w, dtype=float)
    beta_arr = np.asarray(beta, dtype=float)
    require_nonnegative("w", w_arr, allow_inf=True)
    require_positive("beta", beta_arr)
    with np.errstate(invalid="ignore", over="ignore"):
        g = np.where(np.isinf(w_arr), 0.0, beta_arr * w_arr / (w_arr + beta_arr) ** 2)  # d f(w)/d log w
    return _scalar_or_array(g)


def bucket_probabilities(
    K: int = 8,
    mu: ArrayLike | None = None,
    sigma: ArrayLike = 1.0,
    units: Units = "success-count",
    nonempty: ArrayLike | None = None,
) -> np.ndarray:
    """Gaussian bucket probabilities over k = 1..K-1, normalised over non-empty buckets.

    ``units="success-count"``: p_k ~ N(k; mu, sigma), default mu = K/2 (reference
    code). ``units="accuracy"``: p_k ~ N(k/K; mu, sigma), default mu = 0.5 (paper,
    Alg. 1 line 6). ``nonempty`` is a boolean mask (..., K-1); empty buckets get
    probability 0 and the rest are renormalised (Alg. 2). ``mu`` and ``sigma``
    may be arrays; they broadcast as leading (batch) axes. Returns (..., K-1).
    Computed in log space, so a narrow sigma cannot underflow to 0/0.
    Requires K integer >= 2, finite mu, sigma > 0 (finite), at least one
    non-empty bucket per row.

    Bucket weights, two unit conventions (``units``):

    * ``"success-count"``: p_k ~ N(k; mu, sigma), mu defaults to K/2. The reference
      code's mu = 4, sigma = 1 gives [.004, .054, .242, .399, .242, .054, .004]
      for K = 8.
    * ``"accuracy"``: p_k ~ N(k/K; mu, sigma), mu defaults to 0.5 (the paper read
      literally, Alg. 1 line 6). sigma = 1 is nearly uniform:
      [.137, .143, .146, .147, .146, .143, .137].

    Both lists are *normalised probabilities* over k = 1..K-1. In count units with
    sigma = 1 the unnormalised pdf values round to the same three decimals (the
    pdf summed over the integer grid is 0.99972), which is why 0.399 = N(0; 0, 1)
    appears; in accuracy units the pdf values (0.372 ... 0.399) differ from the
    probabilities. The conventions coincide when mu_acc = mu_count / K and
    sigma_acc = sigma_count / K (the reference code's sigma = 1 in counts is
    sigma = 0.125 in accuracy units).
    """
    K_int = int(require_int("K", K, 2))
    if units == "success-count":
        x = np.arange(1, K_int, dtype=float)  # bucket k = latest success count
        mu_arr = np.asarray(K_int / 2.0 if mu is None else mu, dtype=float)
    elif units == "accuracy":
        x = np.arange(1, K_int, dtype=float) / K_int  # Acc = k / K
        mu_arr = np.asarray(0.5 if mu is None else mu, dtype=float)
    else:
        raise invalid("units", "one of success-count, accuracy", units)
    sigma_arr = np.asarray(sigma, dtype=float)
    require_finite("mu", mu_arr)
    require_positive("sigma", sigma_arr)
    z = (x - mu_arr[..., None]) / sigma_arr[..., None]  # (..., K-1)
    logits = -0.5 * z**2  # Alg. 1 line 6, ExGRPO: p_k ~ N(k/K; mu, sigma), constant dropped
    if nonempty is not None:
        mask = np.asarray(nonempty)
        if mask.dtype != bool:
            raise ValueError(f"nonempty must be a boolean mask, got dtype {mask.dtype}")
        if mask.ndim == 0 or mask.shape[-1] != K_int - 1:
            raise ValueError(
                f"nonempty must have last-axis length K-1={K_int - 1}, got shape {mask.shape}"
            )
        if not np.all(mask.any(axis=-1)):
            raise ValueError("nonempty must mark at least one bucket True in every row")
        logits = np.where(mask, logits, -np.inf)
    top = logits.max(axis=-1, keepdims=True)
    weights = np.exp(logits - top)
    return weights / weights.sum(axis=-1, keepdims=True)  # Alg. 2, ExGRPO: renormalise over non-empty buckets


def batch_split(B: ArrayLike, rho: ArrayLike, n_experience: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(|B_exp|, |B_on|) with |B_exp| = min(floor(rho B), |E|) and |B_on| = B - |B_exp|.

    floor(rho B) is taken after rounding rho B to 9 decimals, so 0.29 * 100
    (= 28.999999999999996 in floating point) counts as 29. Requires B integer
    >= 1, rho in [0, 1), n_experience integer >= 0. Broadcasts.
    """
    B_arr = require_int("B", B, 1)
    rho_arr = np.asarray(rho, dtype=float)
    bad = ~((rho_arr >= 0.0) & (rho_arr < 1.0))
    if np.any(bad):
        raise invalid("rho", "in [0, 1)", float(rho_arr[bad].ravel()[0]), fmt="g")
    n_exp_pool = require_int("n_experience", n_experience, 0)
    n_exp = np.minimum(np.floor(np.round(rho_arr * B_arr, 9)).astype(np.int64), n_exp_pool)  # Sec. 4.2, ExGRPO
    n_on = B_arr - n_exp  # Sec. 4.2, ExGRPO: |B_on| = B - |B_exp|
    return _scalar_or_array(n_exp), _scalar_or_array(n_on)


def item_probabilities(bucket_sizes: ArrayLike, bucket_probs: ArrayLike) -> np.ndarray:
    """Per-item probability p_k / |U_k| of one question in bucket k (0 for empty buckets).

    With p from :func:`bucket_probabilities` (normalised over non-empty buckets),
    sum_k |U_k| * result_k = 1. Requires bucket_sizes integers >= 0,
    bucket_probs >= 0, and bucket_probs = 0 wherever the bucket is empty.
    """
    sizes = require_int("bucket_sizes", bucket_sizes, 0)
    probs = np.asarray(bucket_probs, dtype=float)
    require_nonnegative("bucket_probs", probs)
    sizes, probs = np.broadcast_arrays(sizes, probs)
    if np.any((sizes == 0) & (probs > 0)):
        raise ValueError("bucket_probs must be 0 for empty buckets (bucket_sizes == 0)")
    with np.errstate(divide="ignore", invalid="ignore"):
        per_item = np.where(sizes > 0, probs / np.maximum(sizes, 1), 0.0)  # Alg. 1, ExGRPO: p_k / |U_k|
    return _scalar_or_array(per_item)

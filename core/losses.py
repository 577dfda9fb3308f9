"""Policy-gradient losses on the SAMPLED tokens' log-probs: value and d loss / d logp_new.

One pure numpy function per loss, shared by the simulator, the validator and the trainers (``core/designs.py``):
the loss to MINIMISE per seed and its derivative in every entry of ``logp_new``.  What the references compute
without gradient (RLOO's w, M2PO's mask M, the reference cap tau) is constant here too.  Shapes, seed axis first:
``logp_new``, ``logp_behav``, ``mask`` (S, n, L); per response (S, n); losses and metrics (S,).  Ratios stay in log
space; an unbounded loss is +-inf; padding is never read.  Papers (docs/REFERENCES.md): M2PO, Replay-RLOO, ExGRPO,
experience-replay (GRPO, AsymRE); metrics as TRL / verl name them.  Aggregation (verl's ``loss_agg_mode``;
(*) Dr. GRPO up to a constant 1/L_max):

| name                    | loss                                        | used by                          |
|-------------------------|---------------------------------------------|----------------------------------|
| ``token-mean``          | sum_{i,t} l_it / (real tokens in the batch) | DAPO, verl default, M2PO Eq. (5) |
| ``seq-mean-token-sum``  | (1/n) sum_i sum_t l_it                      | RLOO Eq. (3), AsymRE, Dr. GRPO * |
| ``seq-mean-token-mean`` | (1/n) sum_i (1/abs(o_i)) sum_t l_it         | original GRPO                    |

| code name            | paper symbol                   | where                                          |
|----------------------|--------------------------------|------------------------------------------------|
| ``logp_new``         | log pi_theta(o_t or a_i)       | all                                            |
| ``logp_behav``       | log pi_behav / pi_old / mu     | M2PO Eq. (1); RLOO Eq. (2); ExGRPO pi_theta_past |
| ``log_ratio``        | log r, log w                   | M2PO Eq. (4); ExGRPO Eq. (6)                   |
| ``advantage``        | A_i, A_{i,t}                   | GRPO Eq. (2) in M2PO; RLOO Eq. (1)             |
| ``eps_low/high``     | eps_low, eps_high (0.2)        | experience-replay App. E.2                     |
| ``tau_m2``           | tau_M2 (0.04)                  | M2PO Sec. 5.2, Algorithm 1                     |
| ``c``                | c                              | RLOO Eq. (2)                                   |
| ``value_baseline``   | V-hat                          | AsymRE, experience-replay App. E               |
| ``delta_v``          | delta V                        | AsymRE, experience-replay App. E               |
| ``beta``             | beta (0.1)                     | ExGRPO Sec. 4.2, f(w) = w / (w + beta)         |
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal, overload

import numpy as np
from numpy.typing import ArrayLike

from ..checks import invalid, one_of, require_finite, require_nonnegative, require_positive
from ..theory.divergences import ess_kish_fraction, sequence_log_ratio
from ..theory.exgrpo import shaping, shaping_gradient_weight
from ..theory.group_replay import clipped_sequence_weight
from ..theory.moments import Moments, statistics

__all__ = [
    "LossOutput",
    "LazyMetrics",
    "AGGREGATIONS",
    "reinforce",
    "grpo",
    "no_trust_region",
    "m2po_mask",
    "m2po_masks",
    "clip_log_bounds",
    "ppo_clip_flags",
    "m2po_trust_set",
    "gspo_sequence_log_ratio",
    "m2po",
    "m2po_reference",
    "rloo",
    "asymre",
    "exgrpo_shaped",
]

Aggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
AGGREGATIONS: tuple[Aggregation, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
M2POVariant = Literal["algorithm1", "reference"]


@dataclass
class LossOutput:
    """A loss per seed, its derivative with respect to ``logp_new``, and diagnostics."""

    loss: np.ndarray  # (S,) value of the loss to MINIMISE
    grad_logp: np.ndarray  # (S, n, L) d loss / d logp_new (0 on masked/padding tokens)
    metrics: Mapping[str, np.ndarray] = field(default_factory=dict)  # each (S,); the losses' own: LazyMetrics
    # (S, n, L) the per-token objective, loss = -sum a_it * objective_it (read only where a_it > 0): what a trainer
    # that weights tokens after the loss (TRL's vLLM importance-sampling ratio, integrations/trl.py) needs for its
    # value; None where a loss does not set it
    objective: np.ndarray | None = None


class LazyMetrics(Mapping[str, np.ndarray]):
    """A loss's diagnostics, computed when first read and kept: a loop that reads only the gradient (the benchmark's
    ``simulate/to_target.py``) never pays for the importance-ratio statistics, and every reader sees the same values,
    in the order ``make`` writes them.

    ``LazyMetrics(make, *rows)``: ``make(*rows)``, where ``rows`` are arrays with the seed axis first and ``make`` is
    row-wise (row s of every value from row s of every argument alone, as every loss metric is). Such metrics can
    be computed for many steps at once (:meth:`stacked`, the engine's recorder); ``LazyMetrics(make)`` only alone.
    """

    __slots__ = ("_make", "_rows", "_values")

    def __init__(self, make: Callable[..., dict[str, np.ndarray]], *rows: np.ndarray) -> None:
        self._make: Callable[..., dict[str, np.ndarray]] | None = make
        self._rows: tuple[np.ndarray, ...] = rows
        self._values: dict[str, np.ndarray] | None = None

    def _computed(self) -> dict[str, np.ndarray]:
        if self._values is None:
            assert self._make is not None
            # the arguments are released once computed
            self._values, self._make, self._rows = self._make(*self._rows), None, ()
        return self._values

    def __getitem__(self, key: str) -> np.ndarray:
        return self._computed()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._computed())

    def __len__(self) -> int:
        return len(self._computed())

    def __repr__(self) -> str:
        return f"LazyMetrics({self._computed()!r})"

    @property
    def stack_key(self) -> Callable | None:
        """What metrics must share to be computed together by :meth:`stacked` (None: this one is computed alone)."""
        return self._make if self._rows else None

    @staticmethod
    def stacked(items: list[LazyMetrics]) -> dict[str, np.ndarray]:
        """The values of ``items`` (one ``stack_key``, arguments alike but for the seed axis) concatenated on the seed
        axis, from ONE call of ``make`` on their stacked arguments: the same numbers as each alone (``make`` is
        row-wise). Each item keeps its rows as its values; one already read (computed alone) gives its own."""
        make = items[0]._make
        if len(items) > 1 and all(item._values is None and item._rows and item._make is make for item in items):
            values = make(*(np.concatenate(parts) for parts in zip(*(item._rows for item in items))))
            start = 0
            for item in items:
                stop = start + len(item._rows[0])
                item._values, item._make, item._rows = {k: v[start:stop] for k, v in values.items()}, None, ()
                start = stop
            return values
        parts = [item._computed() for item in items]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


# --------------------------------------------------------------------------- #
# input handling
# --------------------------------------------------------------------------- #
def _mask(mask: ArrayLike, shape: tuple[int, ...] | None = None) -> np.ndarray:
    m = np.asarray(mask)
    if m.dtype != np.bool_:
        if not np.all((m == 0) | (m == 1)):
            raise ValueError("mask must be boolean or contain only 0 and 1")
        m = m.astype(bool)
    if m.ndim != 3:
        raise ValueError(f"mask must have shape (S, n, L), got shape {m.shape}")
    if shape is not None and m.shape != shape:
        raise ValueError(f"mask shape {m.shape} does not match logp_new shape {shape}")
    if not m.all() and np.any(m.sum(axis=(1, 2)) == 0):  # all real (the bandit's every batch): nothing to count
        raise ValueError("every seed needs at least one real (unmasked) token")
    return m


def _all_finite(a: np.ndarray) -> bool:
    """Every entry of ``a`` finite: a finite sum says so in one pass (NaN and +-inf reach the sum: inf - inf is NaN);
    only a sum that is not finite (such an entry, or finite entries that overflow it) looks at each entry."""
    with np.errstate(all="ignore"):  # inf - inf and an overflowing sum are answers here, not warnings
        total = np.add.reduce(a, axis=None)
    return bool(np.isfinite(total)) or bool(np.all(np.isfinite(a)))


def _logp(x: ArrayLike, name: str, m: np.ndarray, check: bool = True) -> np.ndarray:
    """float64 (S, n, L) with padding set to 0; real tokens must be finite (``check=False``: the caller checks)."""
    a = np.asarray(x, dtype=np.float64)
    if a.shape != m.shape:
        raise ValueError(f"{name} must have shape (S, n, L) = {m.shape}, got {a.shape}")
    a = np.where(m, a, 0.0)
    if check and not _all_finite(a):
        raise ValueError(f"{name} must be finite on real (unmasked) tokens")
    return a


@overload
def _inputs(logp_new: ArrayLike, mask: ArrayLike, logp_behav: None = None
            ) -> tuple[np.ndarray, np.ndarray, None, None]: ...
@overload
def _inputs(logp_new: ArrayLike, mask: ArrayLike, logp_behav: ArrayLike
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]: ...
@overload
def _inputs(logp_new: ArrayLike, mask: ArrayLike, logp_behav: ArrayLike | None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]: ...
def _inputs(logp_new: ArrayLike, mask: ArrayLike, logp_behav: ArrayLike | None = None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(logp_new, mask, logp_behav or None, log_ratio or None), all (S, n, L), padding zeroed."""
    shape = np.shape(logp_new)
    if len(shape) != 3:
        raise ValueError(f"logp_new must have shape (S, n, L), got shape {shape}")
    m = _mask(mask, shape)
    if logp_behav is None:
        return _logp(logp_new, "logp_new", m), m, None, None
    lp, lb = _logp(logp_new, "logp_new", m, check=False), _logp(logp_behav, "logp_behav", m, check=False)
    with np.errstate(invalid="ignore"):  # inf - inf (both non-finite: raised below) is NaN, quietly
        log_ratio = lp - lb  # log r, 0 on padding
    if not _all_finite(log_ratio):  # a finite difference has finite terms: one check for both; else find the culprit
        for a, name in ((lp, "logp_new"), (lb, "logp_behav")):
            if not np.all(np.isfinite(a)):
                raise ValueError(f"{name} must be finite on real (unmasked) tokens")
    return lp, m, lb, log_ratio


def _per_response(x: ArrayLike, name: str, shape: tuple[int, ...], dtype: type = np.float64) -> np.ndarray:
    a = np.asarray(x)
    if a.shape != shape[:2]:
        raise ValueError(f"{name} must have shape (S, n) = {shape[:2]}, got {a.shape}")
    if dtype is bool:
        if a.dtype != np.bool_:
            if not np.all((a == 0) | (a == 1)):
                raise ValueError(f"{name} must be boolean")
            a = a.astype(bool)
        return a
    a = a.astype(np.float64)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite")
    return a


def _token_advantage(advantage: ArrayLike, m: np.ndarray) -> np.ndarray:
    """Advantage per token (S, n, L), 0 on padding; accepts (S, n) (constant over a response) or (S, n, L)."""
    a = np.asarray(advantage, dtype=np.float64)
    if a.shape == m.shape[:2]:
        a = a[..., None]  # Eq. (2), M2PO: A constant over the tokens of o_i (broadcast over L by the where)
    elif a.shape != m.shape:
        raise ValueError(f"advantage must have shape (S, n) = {m.shape[:2]} or (S, n, L) = {m.shape}, got {a.shape}")
    a = np.where(m, a, 0.0)
    if not _all_finite(a):
        raise ValueError("advantage must be finite on real tokens")
    return a


def _token_weights(m: np.ndarray, aggregation: str) -> np.ndarray:
    """(S, n, L) weights a_it >= 0 (0 on padding) with loss = -sum a_it * objective_it."""
    mf = m.astype(np.float64)
    if aggregation == "token-mean":
        return mf / mf.sum(axis=(1, 2), keepdims=True)  # DAPO / verl token-mean; M2PO Eq. (5) denominator
    n = m.shape[1]
    if aggregation == "seq-mean-token-sum":
        return mf / n  # RLOO Eq. (3): (1/B) sum_i over responses, log pi(y|x) = sum_t
    if aggregation == "seq-mean-token-mean":
        length = mf.sum(axis=2, keepdims=True)  # (S, n, 1) |o_i|
        return np.where(length > 0, mf / (n * np.maximum(length, 1.0)), 0.0)  # GRPO: (1/G) sum_i (1/|o_i|) sum_t
    raise invalid("aggregation", one_of(AGGREGATIONS), aggregation)


def _output(objective: np.ndarray, d_objective: np.ndarray, weights: np.ndarray,
            metrics: Mapping[str, np.ndarray]) -> LossOutput:
    """loss = -sum weights * objective per seed; grad = -weights * d objective / d logp_new."""
    weighted = weights > 0
    with np.errstate(invalid="ignore"):
        loss = -np.sum(np.where(weighted, weights * objective, 0.0), axis=(1, 2))  # (S,)
        grad = np.where(weighted, -weights * d_objective, 0.0)  # (S, n, L)
    return LossOutput(loss=loss, grad_logp=grad, metrics=metrics, objective=objective)


def _flat(x: np.ndarray) -> np.ndarray:
    return x.reshape(x.shape[0], -1)  # (S, n*L)


def _token_mean(x: np.ndarray, m: np.ndarray, count: np.ndarray | None = None) -> np.ndarray:
    """Mean of x over the real tokens of each seed (S,); ``count``: ``m.sum(axis=(1, 2))`` if the caller has it."""
    n = m.sum(axis=(1, 2)) if count is None else count
    if x.dtype == np.bool_:  # a fraction of tokens: the same count, without a float copy
        return (x & m).sum(axis=(1, 2)) / n
    return np.sum(np.where(m, x, 0.0), axis=(1, 2)) / n


def _ratio_metrics(log_ratio: np.ndarray, m: np.ndarray) -> dict[str, np.ndarray]:
    """Token-level IS diagnostics over real tokens, each (S,), computed in log space: the statistics kernel's
    estimators (``theory/moments.py``) on the sums of each seed's real tokens (inputs validated by ``_inputs``)."""
    lr, mf = _flat(log_ratio), _flat(m)  # (S, n L)
    stats = statistics(Moments.from_rows(lr, None if mf.all() else mf, all_sums=False))  # C, P: not reported
    out = {f"is_ratio_{k}": stats[f"ratio_{k}"] for k in ("min", "mean", "max", "std")}
    out["ess_frac"] = stats["ess_frac"]  # Kish (sum r)^2 / (N sum r^2)
    out["kl_k3"] = stats["kl_k3"]  # KL(pi_behav || pi_new), k3 estimator
    out["m2"] = stats["m2"]  # Eq. (4), M2PO
    for name in ("kl_k1", "kl_k2", "d2", "chi2"):  # the rest of the set, so callers need not recompute it
        out[name] = stats[name]
    return out


def _require_eps(name: str, eps: float) -> None:
    require_nonnegative(name, eps, allow_inf=True)


@functools.lru_cache(maxsize=64)
def _log_bounds(eps_low: float, eps_high: float) -> tuple[float, float]:
    """Clip range [1 - eps_low, 1 + eps_high] as log-bounds; eps_low >= 1 means no lower bound.

    Cached: a run asks for the same two bounds every step (an invalid eps raises every time).
    """
    _require_eps("eps_low", eps_low)
    _require_eps("eps_high", eps_high)
    log_lo = float(np.log1p(-eps_low)) if eps_low < 1.0 else -np.inf
    log_hi = float(np.log1p(eps_high))  # inf for eps_high = inf
    return log_lo, log_hi


def clip_log_bounds(eps_low: float, eps_high: float) -> tuple[float, float]:
    """The PPO clip range [1 - eps_low, 1 + eps_high] as log-bounds (log_lo, log_hi); eps_low >= 1: no lower bound."""
    return _log_bounds(eps_low, eps_high)


def ppo_clip_flags(log_ratio: np.ndarray, log_lo: ArrayLike, log_hi: ArrayLike, positive: np.ndarray | None = None,
                   negative: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(low, high): where a PPO clip [e^log_lo, e^log_hi] zeroes a token's gradient (the clipped term is the min).

    high: A > 0 and r > e^log_hi; low: A < 0 and r < e^log_lo (M2PO Eq. (1); TRL's ``clip_ratio/{low,high}``).
    ``positive`` / ``negative``: where A > 0 / A < 0 (and the token is real); None (both): without advantages both
    sides count (the worst case, diagnose's what-if).  Compared in log space: no ratio is formed.
    """
    high = log_ratio > log_hi  # r > 1 + eps_high
    low = log_ratio < log_lo  # r < 1 - eps_low
    if positive is None and negative is None:
        return low, high
    if positive is None or negative is None:
        raise TypeError("give both positive and negative, or neither")
    return negative & low, positive & high


def m2po_trust_set(log_ratio: np.ndarray, advantage: np.ndarray, tol: float = 0.0) -> np.ndarray:
    """M2PO's trust-region tokens T: where a PPO clip could bind, (A > tol, r > 1 + tol) or (A < -tol, r < 1 - tol).

    M2PO Sec. 5.2: ``tol = 0`` is Algorithm 1 (the losses here); the reference code (core_algos.py
    ``_get_trust_region_tokens_delta_sq``) uses 1e-12, which ``diagnose``'s ``m2po/M2`` transcribes.
    Compared in log space (log1p(+-tol)); ``advantage`` broadcasts against ``log_ratio``.
    """
    if tol == 0.0:
        return ((advantage > 0) & (log_ratio > 0)) | ((advantage < 0) & (log_ratio < 0))  # (A>0, r>1) or (A<0, r<1)
    return (((advantage > tol) & (log_ratio > np.log1p(tol)))
            | ((advantage < -tol) & (log_ratio < np.log1p(-tol))))


def gspo_sequence_log_ratio(seq_lr: np.ndarray, seq_len: np.ndarray) -> np.ndarray:
    """GSPO's geometric-mean sequence log-ratio: sum log r / max(|y|, 1).

    TRL grpo_trainer.py compute_loss, importance_sampling_level="sequence": (log_ratio * mask).sum(-1) /
    mask.sum(-1).clamp(min=1.0); verl core_algos.py compute_policy_loss_gspo likewise (clamp(min=1)).
    """
    return np.asarray(seq_lr, dtype=np.float64) / np.maximum(np.asarray(seq_len, dtype=np.float64), 1.0)


def _clipped_surrogate(log_ratio: np.ndarray, adv: np.ndarray, m: np.ndarray,
                       log_lo: ArrayLike, log_hi: ArrayLike):
    """PPO surrogate min(r A, clip(r, e^log_lo, e^log_hi) A) per token, and its derivative in logp_new.

    For A > 0 it equals min(r, e^log_hi) A; for A < 0 it equals max(r, e^log_lo) A.
    The clipped branch is constant (zero gradient), the unclipped one has
    d(rA)/dlogp = rA. Returns (objective, d objective, clipped_low, clipped_high),
    where clipped_* mark the tokens whose gradient the clip zeroes.
    """
    pos = m & (adv > 0)
    neg = m & (adv < 0)
    low, high = ppo_clip_flags(log_ratio, log_lo, log_hi, pos, neg)  # A < 0, r < 1 - eps_low; A > 0, r > 1 + eps_high
    log_value = np.where(high, log_hi, np.where(low, log_lo, log_ratio))  # log of the ratio multiplying A
    with np.errstate(over="ignore"):
        ratio = np.exp(log_value)  # inf only where the surrogate itself is unbounded
    live = pos | neg  # A = 0 contributes 0 (also avoids 0 * inf)
    with np.errstate(invalid="ignore"):
        term = ratio * adv
        objective = np.where(live, term, 0.0)  # Eq. (1), M2PO: min(r A, clip(r, 1-eps, 1+eps) A)
        d_objective = np.where(live & ~(high | low), term, 0.0)  # d(r A)/d log pi = r A
    return objective, d_objective, low, high


# --------------------------------------------------------------------------- #
# losses
# --------------------------------------------------------------------------- #
def reinforce(logp_new: ArrayLike, advantage: ArrayLike, mask: ArrayLike, *,
              aggregation: Aggregation = "token-mean", logp_behav: ArrayLike | None = None) -> LossOutput:
    """REINFORCE: loss = -mean A log pi (Williams 1992), with the baseline inside the advantage.

    With ``advantage = group_mean_baseline(reward)`` this is REINFORCE with the
    group-mean baseline; with ``aggregation="seq-mean-token-sum"`` it equals
    AsymRE at delta V = 0 (experience-replay paper, App. E). No importance ratio:
    on replayed data it is the uncorrected (biased) gradient. ``logp_behav``, if
    given, only adds the IS diagnostics (it does not change the loss).
    d loss / d logp_it = -a_it A_it.
    """
    lp, m, _, lr = _inputs(logp_new, mask, logp_behav)
    adv = _token_advantage(advantage, m)
    weights = _token_weights(m, aggregation)
    objective = adv * lp  # REINFORCE: A log pi(o_t | .)
    metrics = LazyMetrics(_ratio_metrics, lr, m) if lr is not None else {}
    return _output(objective, adv, weights, metrics)


def grpo(logp_new: ArrayLike, logp_behav: ArrayLike, advantage: ArrayLike, mask: ArrayLike,
         eps_low: float = 0.2, eps_high: float = 0.2, *, aggregation: Aggregation = "token-mean") -> LossOutput:
    """GRPO / PPO clipped surrogate with TOKEN ratios r = pi_new / pi_behav.  M2PO Eq. (1).

    loss = -mean_t min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) (no KL term, as in
    the experience-replay paper App. E.2 and M2PO). ``eps_low = eps_high = inf``
    is plain importance-weighted PG (:func:`no_trust_region`, M2PO Sec. 4). The
    ratio divides by the behaviour policy directly (no separate proximal policy),
    as in M2PO's reference implementation.

    Gradient: d loss / d logp_it = -a_it r A on unclipped tokens, 0 where the clip
    binds (A > 0 and r > 1 + eps_high, or A < 0 and r < 1 - eps_low).

    Metrics (fractions of real tokens): ``clip_ratio/low_mean`` (A < 0, r < 1 - eps_low),
    ``clip_ratio/high_mean`` (A > 0, r > 1 + eps_high), ``clip_ratio/region_mean``
    (either; TRL's definitions), ``pg_clipfrac`` (verl: clipped loss > unclipped
    loss, i.e. gradient zeroed; equal to region_mean here), plus the IS metrics.
    """
    lp, m, lb, lr = _inputs(logp_new, mask, logp_behav)
    adv = _token_advantage(advantage, m)
    weights = _token_weights(m, aggregation)
    log_lo, log_hi = _log_bounds(eps_low, eps_high)
    objective, d_objective, low, high = _clipped_surrogate(lr, adv, m, log_lo, log_hi)
    return _output(objective, d_objective, weights, LazyMetrics(_clip_metrics, low, high, lr, m))


def _clip_metrics(low: np.ndarray, high: np.ndarray, log_ratio: np.ndarray, m: np.ndarray) -> dict[str, np.ndarray]:
    """:func:`grpo`'s metrics (row-wise: a ``LazyMetrics`` the recorder may stack over steps)."""
    count = m.sum(axis=(1, 2))  # real tokens per seed, counted once for the three fractions
    clipped = _token_mean(low | high, m, count)
    return {
        "clip_ratio/low_mean": _token_mean(low, m, count),
        "clip_ratio/high_mean": _token_mean(high, m, count),
        "clip_ratio/region_mean": clipped,
        "pg_clipfrac": clipped.copy(),
        **_ratio_metrics(log_ratio, m),
    }


#: the metrics makes whose ``ess_frac`` is :func:`_ratio_metrics`': the statistics kernel's Kish ESS fraction of the
#: ratios of their ``log_ratio`` rows (S, n, L) over the real tokens. With one token per response (L = 1) and every
#: token real those are the sequence ratios, so it is ``core.metrics.step_metrics``' sequence-level ``ess_frac``
#: number for number (the same sums of the same values): the engine's recorder passes it on instead of summing again
TOKEN_KISH_METRICS: frozenset[Callable[..., dict[str, np.ndarray]]] = frozenset({_ratio_metrics, _clip_metrics})


def no_trust_region(logp_new: ArrayLike, logp_behav: ArrayLike, advantage: ArrayLike, mask: ArrayLike, *,
                    aggregation: Aggregation = "token-mean") -> LossOutput:
    """Importance-weighted PG without a trust region: -mean r A (GRPO with eps = inf; M2PO Sec. 4).

    The "prosperity before collapse" baseline. The value is unbounded: a huge
    log-ratio gives +-inf (never NaN, never a warning).
    """
    return grpo(logp_new, logp_behav, advantage, mask, np.inf, np.inf, aggregation=aggregation)


def _m2po_candidates(log_ratio: np.ndarray, adv: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Trust-region tokens T: real tokens where a PPO clip could bind (M2PO Sec. 5.2)."""
    return m & m2po_trust_set(log_ratio, adv)


def m2po_may_bind(log_ratio: np.ndarray, adv: np.ndarray, tau_m2: float) -> np.ndarray:
    """(S,) False where M2PO masks nothing for sure: mean_T (log r)^2 <= tau_M2 over each row's T (Algorithm 1
    stops at once, the reference cap is inf), with a 1e-9 margin that leaves rounding-level ties to the exact sort.

    ``log_ratio``, ``adv``: (S, N) real tokens only (a padded batch goes through :func:`m2po_mask`).
    """
    # A log r > 0 is (A > 0, r > 1) or (A < 0, r < 1) except where the product underflows to 0: such a token leaves
    # out a square below 1e-300 and one from the count, which can only raise the mean (True where unsure)
    cand = adv * log_ratio > 0  # (S, N)
    sum_sq = np.einsum("sn,sn->s", log_ratio, log_ratio * cand)  # no (S, N) square, no BLAS
    return sum_sq > tau_m2 * (1.0 - 1e-9) * np.count_nonzero(cand, axis=1)


def _m2po_drop_and_cap(log_ratio: np.ndarray, adv: np.ndarray, m: np.ndarray, tau_m2: float,
                       variants: tuple[str, ...]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """variant -> (drop (S, n, L) bool: tokens the M2 constraint masks, cap (S,): log-ratio cap tau; inf if none
    binds); the variants share one sort."""
    require_nonnegative("tau_m2", tau_m2, allow_inf=True)
    for variant in variants:
        if variant not in ("algorithm1", "reference"):
            raise ValueError(f"variant must be 'algorithm1' or 'reference', got {variant!r}")
    S = m.shape[0]
    cand = _flat(_m2po_candidates(log_ratio, adv, m))  # (S, N) T
    lr = _flat(log_ratio)  # (S, N)
    m2_tok = lr * lr  # (S, N) M2_i = (log r_i)^2, Eq. (4)
    count = cand.sum(axis=1)  # (S,) |T|
    may_bind = np.sum(m2_tok * cand, axis=1) > tau_m2 * (1.0 - 1e-9) * count  # as m2po_may_bind
    if not may_bind.all():  # the O(N log N) sort runs only on the rows that may bind
        out = {v: (np.zeros(m.shape, dtype=bool), np.full(S, np.inf)) for v in variants}
        if may_bind.any():
            binding = _m2po_drop_and_cap(log_ratio[may_bind], adv[may_bind], m[may_bind], tau_m2, variants)
            for v, (drop, cap) in binding.items():
                out[v][0][may_bind], out[v][1][may_bind] = drop, cap
        return out
    # the candidates' M2_i, descending (S, N), non-candidates as 0 at the end; values only: which tokens
    # are dropped follows from the threshold below, ties by index (= argmax's first hit)
    v_sorted = -np.sort(-np.where(cand, m2_tok, 0.0), axis=1)
    N = lr.shape[1]
    suffix = np.concatenate([np.cumsum(v_sorted[:, ::-1], axis=1)[:, ::-1], np.zeros((S, 1))], axis=1)  # (S, N+1)
    # suffix[:, k] = sum of the |T| - k smallest candidates = what is left after masking the k largest
    out = {}
    if "algorithm1" in variants:
        k = np.arange(N + 1)[None, :]  # tokens masked so far
        remaining = count[:, None] - k  # (S, N+1)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_rest = suffix / remaining  # mean_{i in T} M2_i after k removals
        stop = (remaining <= 0) | (mean_rest <= tau_m2)  # Algorithm 1, line 3: while mean_T M2_i > tau_M2
        n_drop = np.argmax(stop, axis=1)  # first k at which the while loop exits (S,)
        # the n_drop largest M2_i (lines 4-5): every candidate above the n_drop-th value, then the tied ones at
        # it in index order until n_drop are dropped
        last = np.where(n_drop > 0, v_sorted[np.arange(S), np.maximum(n_drop - 1, 0)], np.inf)  # (S,)
        above = cand & (m2_tok > last[:, None])
        tied = cand & (m2_tok == last[:, None])
        drop = above | (tied & (np.cumsum(tied, axis=1) <= (n_drop - above.sum(axis=1))[:, None]))
        out["algorithm1"] = (drop.reshape(m.shape), np.full(S, np.inf))
    if "reference" in variants:
        # Winsorised mean with a fixed denominator: g(c) = (1/|T|) sum_T min(M2_i, c), c = tau^2.
        # g is piecewise linear and increasing; at the k-th largest value c_k,
        # g(c_k) |T| = k c_k + (sum of the smaller ones). Count K = #{k : g(c_k) > budget}
        # and solve K c + suffix_K = budget |T| on [c_{K+1}, c_K).
        kk = np.arange(1, N + 1)[None, :]  # (1, N)
        g_at_breaks = kk * v_sorted + suffix[:, 1:]  # (S, N) |T| g(c_k)
        total = tau_m2 * count  # (S,) budget |T|
        with np.errstate(invalid="ignore"):
            n_capped = np.sum((kk <= count[:, None]) & (g_at_breaks > total[:, None]), axis=1)  # (S,) K
        rest = suffix[np.arange(S), n_capped]  # (S,) sum of the |T| - K smallest
        with np.errstate(invalid="ignore", divide="ignore"):
            c_star = np.where(n_capped > 0, (total - rest) / np.maximum(n_capped, 1), np.inf)
        cap = np.sqrt(np.maximum(c_star, 0.0))  # (S,) tau: (1/|T|) sum_T min(delta_i^2, tau^2) = budget
        drop = cand & (np.abs(lr) > cap[:, None])  # tokens in T with |log r| > tau: zero gradient
        out["reference"] = (drop.reshape(m.shape), cap)
    return {v: out[v] for v in variants}


def m2po_mask(log_ratio: ArrayLike, advantage: ArrayLike, mask: ArrayLike, tau_m2: float = 0.04,
              variant: M2POVariant = "algorithm1") -> np.ndarray:
    """M2PO keep-mask (S, n, L): True on real tokens that stay in the loss (False on padding).

    ``variant="algorithm1"`` (M2PO paper, Algorithm 1): T = real tokens with
    (A > 0 and r > 1) or (A < 0 and r < 1); while mean_{i in T} (log r_i)^2 > tau_M2,
    mask the token of T with the largest (log r)^2 and remove it from T. Computed
    in the sorted-suffix form (sort T descending; the first k with
    (sum of the rest)/(|T| - k) <= tau_M2), O(N log N), vectorised over seeds;
    ties are broken as argmax does (lowest index first).

    ``variant="reference"`` (M2PO reference code, docs/REFERENCES.md):
    one cap tau with (1/|T|) sum_T min((log r_i)^2, tau^2) = tau_M2 (winsorised mean,
    fixed denominator; tau = inf if the plain mean over T is already <= tau_M2);
    tokens in T with |log r| > tau are masked. At the same budget it masks every
    token Algorithm 1 masks, and often more: while Algorithm 1 is still removing,
    the k-th largest value exceeds the mean of the values left, hence tau_M2, so
    capping at it keeps the winsorised mean above budget and the cap lies below
    it. Tied tokens above the cap are all masked (Algorithm 1 may take only the
    first). The reference code runs it
    per micro-batch (~30k tokens per GPU); here it runs over each seed's batch.

    ``advantage`` is (S, n) or (S, n, L).
    """
    return m2po_masks(log_ratio, advantage, mask, tau_m2, (variant,))[variant]


def m2po_masks(log_ratio: ArrayLike, advantage: ArrayLike, mask: ArrayLike, tau_m2: float = 0.04,
               variants: tuple[M2POVariant, ...] = ("algorithm1", "reference")) -> dict[str, np.ndarray]:
    """:func:`m2po_mask` of each variant (variant -> keep-mask), from one sort."""
    lr = np.asarray(log_ratio, dtype=np.float64)
    m = _mask(mask, lr.shape if lr.ndim == 3 else None)
    lr = _logp(lr, "log_ratio", m)
    adv = _token_advantage(advantage, m)
    return {v: m & ~drop for v, (drop, _) in _m2po_drop_and_cap(lr, adv, m, tau_m2, variants).items()}


def m2po(logp_new: ArrayLike, logp_behav: ArrayLike, advantage: ArrayLike, mask: ArrayLike,
         tau_m2: float = 0.04, variant: M2POVariant = "algorithm1", *,
         aggregation: Aggregation = "token-mean") -> LossOutput:
    """M2PO: second-moment trust region by token masking.  M2PO Eqs. (4)-(5), Algorithm 1.

    ``variant="algorithm1"`` (paper): mask M from :func:`m2po_mask`, then
    loss = -(1 / sum_i abs(o_i)) sum_{i,t} M_it r_it A_it (Eq. 5) with TOKEN ratios
    (the sequence ratio printed in Eq. 5 is a typo), no clip, and the denominator
    counting ALL real tokens, masked ones included (footnote 2). Masked tokens
    add 0 to the value and the gradient; d loss / d logp_it = -M_it r A / N.

    ``variant="reference"`` (reference code): the cap tau of :func:`m2po_mask`
    becomes a PPO clip eps_low = 1 - e^{-tau}, eps_high = e^{tau} - 1 (i.e. |log r| <= tau),
    and the GRPO surrogate is applied; tokens of T beyond the cap are clipped
    (zero gradient, but they keep the constant e^{+-tau} A in the VALUE). The cap
    is computed without gradient, so ``grad_logp`` is that of :func:`grpo` at
    these eps (the value's dependence on tau through the clipped constants is
    not differentiated, as in the reference code).

    Metrics: ``masked_frac`` (masked / real tokens), ``m2`` (Eq. 4, all real
    tokens, before masking), ``m2_after`` (over the real tokens kept; NaN if all
    are masked), ``m2_cap`` (reference: tau, inf if nothing binds; algorithm1:
    inf), plus the IS metrics.
    """
    lp, m, lb, lr = _inputs(logp_new, mask, logp_behav)
    adv = _token_advantage(advantage, m)
    weights = _token_weights(m, aggregation)
    drop, cap = _m2po_drop_and_cap(lr, adv, m, tau_m2, (variant,))[variant]
    keep = m & ~drop
    if variant == "algorithm1":
        live = keep & (adv != 0)
        with np.errstate(over="ignore"):
            ratio = np.exp(np.where(live, lr, 0.0))  # r; inf only where the loss is unbounded
        with np.errstate(invalid="ignore"):
            objective = np.where(live, ratio * adv, 0.0)  # Eq. (5), M2PO: M_it r_it A_it
        d_objective = objective  # d(r A)/d log pi = r A; masked tokens 0
    else:
        objective, d_objective, _, _ = _clipped_surrogate(lr, adv, m, -cap[:, None, None], cap[:, None, None])

    def metrics() -> dict[str, np.ndarray]:
        kept_count = keep.sum(axis=(1, 2))
        with np.errstate(invalid="ignore", divide="ignore"):
            m2_after = np.sum(np.where(keep, lr * lr, 0.0), axis=(1, 2)) / kept_count
        return {
            "masked_frac": _token_mean(drop, m),
            "m2_after": np.where(kept_count > 0, m2_after, np.nan),
            "m2_cap": cap,
            **_ratio_metrics(lr, m),
        }
    return _output(objective, d_objective, weights, LazyMetrics(metrics))


def m2po_reference(logp_new: ArrayLike, logp_behav: ArrayLike, advantage: ArrayLike, mask: ArrayLike,
                   tau_m2: float = 0.04, *, aggregation: Aggregation = "token-mean") -> LossOutput:
    """M2PO, reference-code variant (winsorised cap + PPO clip); see :func:`m2po`."""
    return m2po(logp_new, logp_behav, advantage, mask, tau_m2, "reference", aggregation=aggregation)


def rloo(logp_new: ArrayLike, logp_behav: ArrayLike, advantage: ArrayLike, mask: ArrayLike, c: float,
         is_fresh: ArrayLike, *, aggregation: Aggregation = "seq-mean-token-sum") -> LossOutput:
    """Replay-RLOO with a one-sided clipped SEQUENCE weight.  Replay-RLOO Eqs. (2)-(3).

    w_i = min(c, exp(sum_t (logp_new - logp_behav))) for replayed responses
    (``is_fresh`` False), w_i = 1 for fresh ones (Eq. 2); w is computed in log
    space (a log-ratio of 1e4 gives c) and DETACHED: ``grad_logp`` treats it as a
    constant, as the paper prescribes. With the default aggregation
    loss = -(1/n) sum_i w_i A_i log pi(y_i | x_i), log pi(y|x) = sum of token log-probs
    (Eq. 3 without the KL and entropy terms). The paper's 1/B is read as one
    over the number of RESPONSES in the batch (n per seed), not of groups: the
    two differ by the constant K (a learning-rate rescaling).
    d loss / d logp_it = -w_i A_i / n on real tokens.

    ``advantage`` (S, n), typically the leave-one-out advantage.
    Metrics: ``ess_frac`` = Kish (sum w)^2 / (m sum w^2) over the m replayed responses'
    clipped weights (1 if none), ``clip_frac`` (fraction of replayed responses
    with w = c; 0 if none), ``weight_mean`` (mean w over replayed responses; 1 if
    none), ``replay_frac``; the token-level IS metrics, with the token-level Kish
    ESS under ``ess_frac_token``.
    """
    lp, m, lb, lr = _inputs(logp_new, mask, logp_behav)
    adv = _per_response(advantage, "advantage", m.shape)  # (S, n)
    fresh = _per_response(is_fresh, "is_fresh", m.shape, dtype=bool)  # (S, n)
    require_positive("c", c, allow_inf=True)
    weights = _token_weights(m, aggregation)
    seq_lr = np.asarray(sequence_log_ratio(lr, m))  # (S, n) log pi_theta(y|x) - log mu(y|x)
    w = np.asarray(clipped_sequence_weight(seq_lr, c, fresh_mask=fresh))  # Eq. (2), Replay-RLOO (detached)
    with np.errstate(invalid="ignore"):
        coef = np.where(adv != 0, w * adv, 0.0)  # (S, n) w_i A_i; A = 0 and w = inf gives 0
    coef_tok = np.broadcast_to(coef[..., None], m.shape)
    objective = coef_tok * lp  # Eq. (3), Replay-RLOO: w_i A_i log pi(y_i|x_i), summed over tokens

    def metrics() -> dict[str, np.ndarray]:
        replayed = ~fresh  # (S, n)
        n_rep = replayed.sum(axis=1)  # (S,)
        has_rep = n_rep > 0
        log_w = np.minimum(np.log(c), seq_lr)  # (S, n) log of the clipped weight
        safe_mask = np.where(has_rep[:, None], replayed, True)  # rows without replay: any mask, result replaced
        ess_rep = np.asarray(ess_kish_fraction(log_w, safe_mask))
        with np.errstate(invalid="ignore", divide="ignore"):
            clip_frac = np.sum(replayed & (seq_lr >= np.log(c)), axis=1) / n_rep
            weight_mean = np.sum(np.where(replayed, w, 0.0), axis=1) / n_rep
        token_metrics = _ratio_metrics(lr, m)
        token_metrics["ess_frac_token"] = token_metrics.pop("ess_frac")
        return {
            "ess_frac": np.where(has_rep, ess_rep, 1.0),
            "clip_frac": np.where(has_rep, clip_frac, 0.0),
            "weight_mean": np.where(has_rep, weight_mean, 1.0),
            "replay_frac": n_rep / m.shape[1],
            **token_metrics,
        }
    return _output(objective, coef_tok, weights, LazyMetrics(metrics))


def asymre(logp_new: ArrayLike, reward: ArrayLike, value_baseline: ArrayLike, mask: ArrayLike,
           delta_v: float = 0.0, *, aggregation: Aggregation = "seq-mean-token-sum",
           logp_behav: ArrayLike | None = None) -> LossOutput:
    """AsymRE: loss = -(1/n) sum_i (r_i - (V + delta V)) log pi(z_i | q).  Experience-replay App. E.

    Arnal et al. (2025), as printed in the experience-replay paper (App. E, with
    V-hat = group-mean reward): no importance ratio, log pi(z|q) = sum of token
    log-probs, 1/G over the responses of a group read as 1/n over the responses
    of the batch. delta V < 0 makes it more optimistic. At delta V = 0 and
    V = group mean it equals :func:`reinforce` with the group-mean baseline and
    ``aggregation="seq-mean-token-sum"``.
    ``reward``, ``value_baseline`` (S, n); ``logp_behav`` only adds IS diagnostics.
    d loss / d logp_it = -(r_i - V_i - delta V) / n.
    """
    lp, m, _, lr = _inputs(logp_new, mask, logp_behav)
    r = _per_response(reward, "reward", m.shape)
    v = _per_response(value_baseline, "value_baseline", m.shape)
    require_finite("delta_v", delta_v)
    coef = np.broadcast_to((r - (v + delta_v))[..., None], m.shape)  # App. E: r(z_i, q) - (V-hat + delta V)
    weights = _token_weights(m, aggregation)
    objective = coef * lp  # App. E, experience replay: (r - (V + dV)) log pi(z_i|q)
    metrics = LazyMetrics(_ratio_metrics, lr, m) if lr is not None else {}
    return _output(objective, coef, weights, metrics)


def exgrpo_shaped(logp_new: ArrayLike, logp_behav: ArrayLike, advantage: ArrayLike, mask: ArrayLike,
                  is_replayed: ArrayLike, beta: float = 0.1, eps_low: float = 0.2, eps_high: float = 0.2, *,
                  aggregation: Aggregation = "token-mean") -> LossOutput:
    """ExGRPO mixed-policy objective with policy shaping.  ExGRPO Eq. (4), Sec. 4.2.

    Fresh (on-policy) responses: the GRPO clip term of :func:`grpo` with token
    ratios w = pi_theta / pi_old. Replayed trajectories o* (``is_replayed``): the
    clip is replaced by f(w_t) A with f(w) = w / (w + beta) per token, token ratios
    w_t = pi_theta / pi_past (Eq. 6), no clip. Its derivative in log pi is
    A f'(w) w = A beta w / (w + beta)^2 (1/4 of A at w = beta), computed by
    :mod:`replay_theory.theory.exgrpo`. The (1 - rho) / rho weights of Eq. (4) are
    realised by the batch composition; the mixed group's advantage is the
    caller's (ExGRPO's code uses Dr. GRPO, i.e. no std normalisation, and no
    length normalisation: ``aggregation="seq-mean-token-sum"`` up to a constant).

    Metrics: the clip metrics of :func:`grpo` (fresh tokens only can clip; as
    fractions of all real tokens), ``replay_frac`` (real tokens from replayed
    responses), ``shaping_weight_mean`` (mean beta w/(w+beta)^2 over replayed
    tokens; NaN if none), plus the IS metrics.
    """
    lp, m, lb, lr = _inputs(logp_new, mask, logp_behav)
    adv = _token_advantage(advantage, m)
    rep = np.broadcast_to(_per_response(is_replayed, "is_replayed", m.shape, dtype=bool)[..., None], m.shape)
    require_positive("beta", beta)
    weights = _token_weights(m, aggregation)
    log_lo, log_hi = _log_bounds(eps_low, eps_high)
    fresh_tok = m & ~rep
    rep_tok = m & rep
    clip_obj, clip_d, low, high = _clipped_surrogate(lr, adv, fresh_tok, log_lo, log_hi)
    with np.errstate(over="ignore"):
        w = np.exp(np.where(rep_tok, lr, 0.0))  # token ratio w_t of o*; inf handled by theory.exgrpo
    f_w = np.asarray(shaping(w, beta))  # Sec. 4.2, ExGRPO: f(w) = w / (w + beta)
    g_w = np.asarray(shaping_gradient_weight(w, beta))  # d f(w) / d log w = beta w / (w + beta)^2
    objective = np.where(rep_tok, f_w * adv, clip_obj)  # Eq. (4), ExGRPO, CLIP(w*, A) -> f(w*) A for o*
    d_objective = np.where(rep_tok, g_w * adv, clip_d)

    def metrics() -> dict[str, np.ndarray]:
        n_rep_tok = rep_tok.sum(axis=(1, 2))
        with np.errstate(invalid="ignore", divide="ignore"):
            shaping_mean = np.sum(np.where(rep_tok, g_w, 0.0), axis=(1, 2)) / n_rep_tok
        return {
            "clip_ratio/low_mean": _token_mean(low, m),
            "clip_ratio/high_mean": _token_mean(high, m),
            "clip_ratio/region_mean": _token_mean(low | high, m),
            "pg_clipfrac": _token_mean(low | high, m),
            "replay_frac": _token_mean(rep_tok, m),
            "shaping_weight_mean": np.where(n_rep_tok > 0, shaping_mean, np.nan),
            **_ratio_metrics(lr, m),
        }
    return _output(objective, d_objective, weights, LazyMetrics(metrics))


"""Contextual bandit with a log-linear policy in shared parameters: one-token "responses".

Each prompt ``p`` has one correct answer among ``A`` actions (one action = one whole response, ``seq_len = 1``),
``num_well_formed`` wrong actions earning 0.1 and the rest 0: the three Countdown reward levels of Replay-RLOO
(RLOO group replay (docs/REFERENCES.md), Sec. 3 and App. B).  Warm-start success spans ExGRPO's Hard / Medium /
Easy buckets (ExGRPO (docs/REFERENCES.md), Sec. 3.2).  theta is SHARED by all prompts, so a step on one prompt
moves every other prompt's policy: that is what makes replayed responses off-policy.  How the difficulty and the
features are set: docs/SIMULATION.md, 'Bandit'.

    logits[s, p, a] = b[p, a] + phi[p, a, :] @ theta[s]
    grad_theta log pi(a | p) = phi[p, a] - E_{a' ~ pi(.|p)}[phi[p, a']]

| code name        | symbol              | meaning                                                  |
|------------------|---------------------|----------------------------------------------------------|
| ``params``       | theta (S, d)        | policy parameters, one row per seed                      |
| ``features``     | phi (P, A, d)       | action features                                          |
| ``offsets``      | b (P, A)            | fixed logit offsets (the warm start)                     |
| ``answer``       | c_p (P,)            | correct action of each prompt                            |
| ``reward_table`` | R (P, A)            | 1.0 correct, 0.1 well-formed but wrong, 0 otherwise      |
| ``difficulty()`` | pi_0(c_p | p) (P,)  | warm-start success probability                           |
| ``prompts``      | (S, n)              | prompt of each response                                  |
| ``tokens``       | (S, n, 1)           | the chosen action (a one-token response)                 |

Divergences (``exact_divergences``) are those of the JOINT (uniform prompt, response) distribution, what pooled
behaviour samples estimate: chi2, KL and M2 are prompt averages, and ``d2 = log(1 + chi2) = log mean_p exp(D2_p)``
(NOT the mean of per-prompt D2), so ``chi2 = expm1(d2)`` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.special import logsumexp

from ...checks import require_in_range, require_int, require_nonnegative, require_unit_interval
from ...theory.divergences import chi2_exact, d2_exact, kl_exact, m2_exact
from ...theory.moments import column_sums as _column_sums
from ...theory.moments import row_sums as _row_sums

__all__ = ["BanditConfig", "BanditEnv", "NoisyBanditConfig", "NoisyRewardBandit"]


@dataclass(frozen=True)
class BanditConfig:
    """A contextual bandit instance; every random draw comes from ``instance_seed``."""

    num_prompts: int = 64
    """P: number of prompts (questions)."""
    num_actions: int = 16
    """A: number of actions (whole one-token responses) per prompt."""
    feature_dim: int = 16
    """d: dimension of the shared parameters theta and of the features phi[p, a]."""
    num_well_formed: int = 5
    """Besides the correct action, this many actions per prompt earn 0.1 (well-formed but wrong); the rest 0."""
    warm_success_min: float = 0.02
    """Lowest target warm-start success probability pi_0(correct | p) (the hardest prompt)."""
    warm_success_max: float = 0.95
    """Highest target warm-start success probability (the easiest prompt)."""
    base_logit_std: float = 1.0
    """Std of the warm-start logit offsets b[p, a] of the wrong actions."""
    well_formed_bonus: float = 1.0
    """Added to the offsets of the well-formed wrong actions (a warm start that mostly answers in format)."""
    skill_alignment: float = 0.5
    """alpha in [0, 1): weight of the shared skill direction u in the correct actions' features."""
    instance_seed: int = 0
    """Seed of the instance (features, offsets, answers); shared by all training seeds."""

    def __post_init__(self) -> None:
        require_int("num_prompts", self.num_prompts, 1)
        require_int("num_actions", self.num_actions, 2)
        require_int("feature_dim", self.feature_dim, 1)
        require_in_range("num_well_formed", self.num_well_formed, 0, self.num_actions - 1)
        if not 0.0 < self.warm_success_min <= self.warm_success_max < 1.0:
            raise ValueError("need 0 < warm_success_min <= warm_success_max < 1, got "
                             f"{self.warm_success_min}, {self.warm_success_max}")
        require_unit_interval("skill_alignment", self.skill_alignment, closed=False)
        require_nonnegative("base_logit_std", self.base_logit_std, allow_inf=True)


# --------------------------------------------------------------------------- #
# helpers shared with token_mdp.py
# --------------------------------------------------------------------------- #
def sample_categorical(logp: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draw from log-probs ``(..., K)`` with uniforms ``u`` ``(...)``: indices ``(...)``.

    The index is the number of CDF values below ``u`` (clipped to K - 1 against
    round-off), so a per-seed loop that reuses the same uniforms draws the
    same tokens.
    """
    cdf = np.cumsum(np.exp(logp), axis=-1)  # (..., K)
    idx = np.sum(cdf < u[..., None], axis=-1)
    return np.minimum(idx, logp.shape[-1] - 1).astype(np.int64)


def token_coef(coef: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``dL/dlogp`` per token (S, n, L), zero on padding.

    ``coef`` may be per token (S, n, L) or per sequence (S, n); a per-sequence
    coefficient applies to every token (d logp_seq / d logp_token = 1).
    """
    return np.where(mask, _coef_values(coef, mask), 0.0)  # (S, n, L): a per-sequence coef broadcasts over L


def _coef_values(coef: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``coef`` as float64 (S, n, L) or (S, n, 1), checked as :func:`token_coef` checks it, padding not zeroed: what
    ``token_coef`` returns when every token is real (a per-sequence coef keeps its length-1 token axis)."""
    coef = np.asarray(coef, dtype=np.float64)
    if coef.ndim == mask.ndim - 1:
        coef = coef[..., None]  # (S, n, 1)
    if coef.ndim != mask.ndim:
        raise ValueError(f"coef must have shape (S, n) or (S, n, L) = {mask.shape}, got {coef.shape}")
    return coef


def _run_starts(cells: np.ndarray) -> np.ndarray:
    """The first index of each run of equal values of ``cells`` (k,), (runs,) in order (empty for k = 0)."""
    first = np.empty(cells.size, dtype=bool)
    first[:1] = True
    np.not_equal(cells[1:], cells[:-1], out=first[1:])
    return np.flatnonzero(first)


def check_params(params: np.ndarray, param_dim: int) -> np.ndarray:
    """Validated float64 ``params`` (S, d)."""
    params = np.asarray(params, dtype=np.float64)
    if params.ndim != 2 or params.shape[1] != param_dim:
        raise ValueError(f"params must have shape (S, {param_dim}), got {params.shape}")
    return params


def check_batch(params: np.ndarray, prompts: np.ndarray, num_prompts: int, param_dim: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Validated float64 ``params`` (S, d) and int64 ``prompts`` (S, n)."""
    params = check_params(params, param_dim)
    prompts = np.asarray(prompts)
    if prompts.ndim != 2 or prompts.shape[0] != params.shape[0]:
        raise ValueError(f"prompts must have shape (S, n) with S = {params.shape[0]}, got {prompts.shape}")
    if prompts.dtype.kind not in "iu":  # np.issubdtype(prompts.dtype, np.integer)
        raise ValueError(f"prompts must be integers, got dtype {prompts.dtype}")
    # one pass: as unsigned integers of the same width, a negative index is larger than any valid one
    if prompts.size and prompts.view(prompts.dtype.str.replace("i", "u")).max() >= num_prompts:
        raise ValueError(f"prompt indices must lie in [0, {num_prompts})")
    return params, prompts.astype(np.int64, copy=False)


def check_mask(mask: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    """Boolean mask of ``shape`` (all True when ``None``)."""
    if mask is None:
        return np.ones(shape, dtype=bool)
    m = np.asarray(mask)
    if m.shape != shape:
        raise ValueError(f"mask shape {m.shape} does not match tokens shape {shape}")
    return m.astype(bool, copy=False)


def joint_d2(chi2: np.ndarray, d2_per_prompt: np.ndarray | None = None) -> np.ndarray:
    """D2 of the joint (uniform prompt, response) distribution from its chi2 (S,).

    ``log1p(chi2)`` keeps relative precision for tiny divergences; where chi2
    overflowed to inf, ``log mean_p exp(D2_p)`` from ``d2_per_prompt`` (S, P)
    recovers the finite value when it is given.
    """
    with np.errstate(over="ignore"):
        out = np.log1p(chi2)
    if d2_per_prompt is not None:
        lme = logsumexp(d2_per_prompt, axis=-1) - np.log(d2_per_prompt.shape[-1])
        out = np.where(np.isfinite(chi2), out, lme)
    return out


@lru_cache(maxsize=16)
def _instance(config: BanditConfig) -> dict[str, np.ndarray]:
    """The instance's arrays (answers, features, offsets, ...) drawn from ``config.instance_seed``, read-only.

    Cached: the instance is a pure function of the config, and every run of a sweep or a benchmark
    builds the same one (its per-prompt construction costs as much as a few training steps).
    Read-only because the environments built from one config share these arrays.
    """
    P, A, d = config.num_prompts, config.num_actions, config.feature_dim
    rng = np.random.default_rng(config.instance_seed)

    # answers and well-formed sets
    answer = rng.integers(A, size=P).astype(np.int64)  # (P,)
    well_formed = np.zeros((P, A), dtype=bool)  # (P, A), excludes the correct action
    for p in range(P):  # instance construction only (not on the training path)
        others = np.delete(np.arange(A), answer[p])
        well_formed[p, rng.choice(others, size=config.num_well_formed, replace=False)] = True
    correct = np.zeros((P, A), dtype=bool)
    correct[np.arange(P), answer] = True
    reward_table = np.where(correct, 1.0, np.where(well_formed, 0.1, 0.0))  # (P, A)

    # features: unit-scale random + shared skill direction on the correct actions
    g = rng.standard_normal((P, A, d)) / np.sqrt(d)  # (P, A, d)
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)  # (d,)
    alpha = config.skill_alignment
    g[np.arange(P), answer] = np.sqrt(1.0 - alpha**2) * g[np.arange(P), answer] + alpha * u

    # difficulty: stratified-uniform target success probabilities in logit space
    lo = np.log(config.warm_success_min / (1 - config.warm_success_min))
    hi = np.log(config.warm_success_max / (1 - config.warm_success_max))
    strata = (rng.permutation(P) + rng.random(P)) / P  # (P,) one point per stratum
    z = lo + (hi - lo) * strata  # (P,) target logit(pi_0(correct | p))
    target_success = 1.0 / (1.0 + np.exp(-z))  # (P,)

    b = config.base_logit_std * rng.standard_normal((P, A)) + config.well_formed_bonus * well_formed  # (P, A)
    b_wrong = np.where(correct, -np.inf, b)
    b[np.arange(P), answer] = z + logsumexp(b_wrong, axis=-1)  # => pi_0(c_p | p) = q_p exactly
    features_flat = np.ascontiguousarray(g.reshape(-1, d))  # (P*A, d)
    out = {"answer": answer, "well_formed": well_formed, "reward_table": reward_table, "features": g,
           "skill_direction": u, "target_success": target_success, "offsets": b, "features_flat": features_flat}
    for array in out.values():
        array.flags.writeable = False
    return out


# --------------------------------------------------------------------------- #
# the environment
# --------------------------------------------------------------------------- #
class BanditEnv:
    """Vectorised contextual bandit; see the module docstring.  Implements ``core.rollouts.Environment``."""

    seq_len = 1

    def __init__(self, config: BanditConfig = BanditConfig()) -> None:
        self.config = config
        self.num_prompts = config.num_prompts
        self.num_actions = config.num_actions
        self.param_dim = config.feature_dim
        instance = _instance(config)  # the arrays below are read-only (shared by every env of this config)
        self.answer = instance["answer"]  # (P,)
        self.well_formed = instance["well_formed"]  # (P, A), excludes the correct action
        self._reward_table = instance["reward_table"]  # (P, A)
        self.features = instance["features"]  # (P, A, d)
        self.skill_direction = instance["skill_direction"]  # (d,)
        self.target_success = instance["target_success"]  # (P,)
        self.offsets = instance["offsets"]  # (P, A)
        self._features_flat = instance["features_flat"]  # (P*A, d)
        self._policy_cache: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None  # params, log pi, pi
        # the cached log pi's rows not made yet: (logits (S P, A), (S P,) True where to do), None when all are made
        self._rows_todo: tuple[np.ndarray, np.ndarray] | None = None

    # ------------------------------------------------------------------ #
    # extra public API
    # ------------------------------------------------------------------ #
    @property
    def reward_table(self) -> np.ndarray:
        """R (P, A): 1.0 correct, 0.1 well-formed but wrong, 0 otherwise."""
        return self._reward_table

    def log_policy(self, params: np.ndarray) -> np.ndarray:
        """Full log-probs log pi(a | p) for every prompt, (S, P, A) (read-only; cached for the last params).

        A training step asks for the policy of the same parameters several times
        (sample, logp, gradient, entropy); the one-entry cache makes that one matmul.
        """
        return self._log_policy(params)

    def _policy(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """log pi and pi, (S, P, A) each, read-only, from the one-entry cache of the last params (``log_policy``)."""
        logpol = self._log_policy(params)
        return logpol, self._probs_table(logpol)

    def _probs_table(self, logpol: np.ndarray) -> np.ndarray:
        """pi = exp(log pi) of every prompt (S, P, A), read-only, made once per cached ``logpol`` (``_log_policy``'s
        last result): evaluations need all of it; a step's draws and gradient may need a few rows (``_row_probs``)."""
        if self._rows_todo is not None:
            self._make_rows(None)  # the whole table: every row of log pi first
        params, cached_logpol, probs = self._policy_cache
        if probs is None:
            probs = np.exp(cached_logpol)
            probs.flags.writeable = False
            self._policy_cache = (params, cached_logpol, probs)
        return probs

    def _log_policy(self, params: np.ndarray) -> np.ndarray:
        """log pi (S, P, A), read-only, from the one-entry cache of the last params (``log_policy``)."""
        return self._log_policy_rows(params, None)

    def _log_policy_rows(self, params: np.ndarray, cells: np.ndarray | None) -> np.ndarray:
        """``_log_policy`` with only the flat (seed, prompt) rows ``cells`` (k,) sure to be made (None: all of them).

        A step draws from and differentiates a few of the table's rows (its prompts), evaluations need all of them:
        each row is made when first asked for, in the same operations as the whole table's, so its numbers are the
        same. The other rows of the returned array are not set yet (they are filled in place when asked for).
        """
        params = check_params(params, self.param_dim)
        cached = self._policy_cache
        if cached is not None and cached[0].shape == params.shape and np.array_equal(cached[0], params):
            if self._rows_todo is not None:
                self._make_rows(cells)
            return cached[1]
        S, (P, A) = params.shape[0], self.offsets.shape
        logits = (params @ self._features_flat.T).reshape(S, P, A)  # (S, P, A)
        logits += self.offsets  # b + phi @ theta
        if cells is not None and 2 * cells.size < S * P:  # a few rows: each made when asked for, in place
            table = logits.view()  # a row holds its logits until made (no second (S, P, A) array to fill)
            table.flags.writeable = False
            self._policy_cache = (params.copy(), table, None)
            self._rows_todo = (logits.reshape(S * P, A), np.ones(S * P, dtype=bool))
            self._make_rows(cells)
            return table
        # log-softmax, the reductions over a transposed copy (A, S P): max reduces in any order, the sum of
        # exponentials is numpy's own pairwise sum of each row (_column_sums); the same numbers, fewer calls
        cols = np.ascontiguousarray(logits.reshape(S * P, A).T)
        top = np.maximum.reduce(cols, axis=0)  # (S P,) the row maxima
        cols -= top
        lse = np.log(_column_sums(np.exp(cols, out=cols)))  # (S P,) log sum exp(logits - max)
        logits -= top.reshape(S, P, 1)
        logits -= lse.reshape(S, P, 1)
        logits.flags.writeable = False
        self._policy_cache = (params.copy(), logits, None)
        self._rows_todo = None
        return logits

    def _make_rows(self, cells: np.ndarray | None) -> None:
        """Make the rows ``cells`` (k,) of the cached log pi that are not made yet (None: all the rest): the
        log-softmax of ``_log_policy_rows``'s whole table, on a transposed copy of those rows alone, written over
        their logits."""
        assert self._policy_cache is not None and self._rows_todo is not None
        logits, todo = self._rows_todo
        if cells is None:
            rows = np.flatnonzero(todo)
        else:
            want = np.zeros(todo.size, dtype=bool)
            want[cells] = True
            rows = np.flatnonzero(want & todo)
        if rows.size:
            cols = np.ascontiguousarray(np.take(logits, rows, axis=0).T)  # (A, k)
            top = np.maximum.reduce(cols, axis=0)  # (k,) the row maxima
            cols -= top  # logits - max, as the whole table's
            lse = np.log(_column_sums(np.exp(cols)))  # (k,)
            cols -= lse
            logits[rows] = cols.T  # the table's memory (the cached log pi is a read-only view of it)
            todo[rows] = False
        if cells is None or (rows.size and not todo.any()):
            self._rows_todo = None

    def _row_probs(self, logpol: np.ndarray, cells: np.ndarray) -> np.ndarray:
        """pi(. | p) of the flat (seed, prompt) rows ``cells`` (k,) of ``logpol`` (``_log_policy``'s last result),
        (k, A): the rows of ``exp(log_policy)`` (the same elementwise exp), from the whole table when it is made."""
        S, P, A = logpol.shape
        if self._policy_cache[2] is not None:
            return np.take(self._probs_table(logpol).reshape(S * P, A), cells, axis=0)
        return np.exp(np.take(logpol.reshape(S * P, A), cells, axis=0))

    def _probs(self, params: np.ndarray) -> np.ndarray:
        """pi(a | p), (S, P, A), from the same one-entry cache as ``log_policy``."""
        return self._policy(params)[1]

    def prompt_accuracy(self, params: np.ndarray) -> np.ndarray:
        """pi(correct | p) for every prompt, (S, P)."""
        return np.exp(self.log_policy(params)[:, np.arange(self.num_prompts), self.answer])

    def difficulty(self) -> np.ndarray:
        """Warm-start success probability pi_0(correct | p), (P,) (equals ``target_success``)."""
        return self.prompt_accuracy(self.init_params(1))[0]

    # ------------------------------------------------------------------ #
    # Environment protocol
    # ------------------------------------------------------------------ #
    def init_params(self, num_seeds: int) -> np.ndarray:
        """theta_0 = 0, (S, d): the warm start lives in the offsets b."""
        return np.zeros((num_seeds, self.param_dim))

    def sample(self, params: np.ndarray, prompts: np.ndarray, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Actions by inverse CDF of one uniform ``rng.random((S, n))`` each: tokens, logp, mask (S, n, 1)."""
        params, prompts = check_batch(params, prompts, self.num_prompts, self.param_dim)
        (S, n), (P, A) = prompts.shape, self.offsets.shape
        u = rng.random(prompts.shape)  # (S, n)
        if u.size == 0:
            return np.zeros((S, n, 1), dtype=np.int64), np.zeros((S, n, 1)), np.ones((S, n, 1), dtype=bool)
        cells = (np.arange(S)[:, None] * P + prompts).ravel()  # (S*n,) flat (seed, prompt) index
        # the inverse CDF of sample_categorical: the number of CDF values below u (at most A - 1).
        # Each run of equal cells (a group: G responses to one prompt) gets its CDF once, built one
        # COLUMN per run (or block of a run, below) so that the running sum cdf_k = cdf_{k-1} + pi_k (np.cumsum's
        # order) is A - 1 vector additions. The CDF never decreases, so "cdf < u" is True on a prefix of each column:
        # the number of values below u is that prefix's length, counted over the columns of each item.
        starts = _run_starts(cells)  # (runs,) each run's first item
        rows = cells[starts]  # (runs,)
        if 4 * rows.size >= S * P:  # a quarter of the table or more: make all of it, the gradient's rows come next
            full = self._log_policy(params)  # (S, P, A)
            self._probs_table(full)
        else:
            full = self._log_policy_rows(params, rows)  # (S, P, A), the rows drawn from made
        length = np.empty_like(starts)  # (runs,) items in each run
        np.subtract(starts[1:], starts[:-1], out=length[:-1])
        length[-1] = cells.size - starts[-1]
        # one column per block of m items, m the gcd of the run lengths (G, also when groups of a seed that share a
        # prompt meet): each block lies in one run, and a row's column is the same numbers whichever columns are built
        # beside it. m = 1 (runs of coprime lengths): one column per run, repeated once per item
        m = int(np.gcd.reduce(length))
        cdf = np.ascontiguousarray(self._row_probs(full, cells[::m] if m > 1 else rows).T)  # (A, blocks or runs)
        for k in range(1, A):
            cdf[k] += cdf[k - 1]  # (A, blocks or runs)
        counter = np.uint8 if A < 256 else np.int64
        if m > 1:  # item j of every block against the blocks' columns: (A, m, blocks), long inner loops, no copies
            below = cdf[:, None, :] < np.ascontiguousarray(u.reshape(-1, m).T)  # (A, m, S*n / m)
            count = np.add.reduce(below.view(np.uint8), axis=0, dtype=counter).T.ravel()  # (S*n,) item order
        else:
            below = np.repeat(cdf, length, axis=1) < u.reshape(-1)  # (A, S*n)
            count = np.add.reduce(below.view(np.uint8), axis=0, dtype=counter)  # (S*n,)
        action = np.minimum(count, A - 1).astype(np.int64)  # (S*n,)
        logp = full.reshape(-1)[cells * A + action].reshape(S, n, 1)  # log pi(a | p)
        return action.reshape(S, n, 1), logp, np.ones((S, n, 1), dtype=bool)

    def reward(self, prompts: np.ndarray, tokens: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """R[p, a] (S, n); a masked (absent) action earns 0."""
        prompts = np.asarray(prompts, dtype=np.int64)
        tokens = np.asarray(tokens, dtype=np.int64)
        mask = check_mask(mask, tokens.shape)
        if mask.all():
            return np.take(self._reward_table, prompts * self.num_actions + tokens[..., 0])  # (S, n) R[p, a]
        return np.where(mask[..., 0], self._reward_table[prompts, tokens[..., 0]], 0.0)  # (S, n)

    def logp(self, params: np.ndarray, prompts: np.ndarray, tokens: np.ndarray, mask: np.ndarray | None = None
             ) -> np.ndarray:
        """log pi(a | p) (S, n, 1), 0 on padding."""
        params, prompts = check_batch(params, prompts, self.num_prompts, self.param_dim)
        tokens = np.asarray(tokens, dtype=np.int64)
        mask = check_mask(mask, tokens.shape)
        if mask.all():  # flat (seed, prompt, action) indices: one 1-D take instead of three index arrays
            cells = np.arange(params.shape[0])[:, None] * self.num_prompts + prompts  # (S, n) flat (seed, prompt)
            logpol = self._log_policy_rows(params, cells.ravel())  # the batch's rows made
            return np.take(logpol, cells * self.num_actions + tokens[..., 0])[..., None]  # (S, n, 1) log pi(a | p)
        rows = np.arange(params.shape[0])[:, None]  # (S, 1)
        lp = self.log_policy(params)[rows, prompts, np.where(mask[..., 0], tokens[..., 0], 0)]  # (S, n)
        return np.where(mask, lp[..., None], 0.0)  # (S, n, 1)

    def grad_logp_contract(self, params: np.ndarray, prompts: np.ndarray, tokens: np.ndarray,
                           mask: np.ndarray | None, coef: np.ndarray) -> np.ndarray:
        """sum_n coef[s, n] (phi[p, a] - E_pi[phi[p, .]]), (S, d); ``coef`` (S, n) or (S, n, 1)."""
        params, prompts = check_batch(params, prompts, self.num_prompts, self.param_dim)
        tokens = np.asarray(tokens, dtype=np.int64)
        mask = check_mask(mask, tokens.shape)
        S, (P, A) = params.shape[0], self.offsets.shape
        values = _coef_values(coef, mask)  # (S, n, 1)
        if values.shape == mask.shape and mask.all():  # every action real (the engine's every batch): token_coef's
            c, act = values[..., 0], tokens[..., 0]  # np.where(mask, x, 0) would copy x unchanged; (S, n) each
        else:
            c = np.where(mask, values, 0.0)[..., 0]  # (S, n) token_coef(coef, mask)
            act = np.where(mask[..., 0], tokens[..., 0], 0)  # (S, n)
        cells = np.arange(S)[:, None] * P + prompts  # (S, n) flat (seed, prompt) index
        weights = c.ravel()
        # sum_n c_n phi[p_n, a_n]: scatter the coefficients onto (prompt, action) cells
        chosen = np.bincount((cells * A + act).ravel(), weights=weights, minlength=S * P * A).reshape(S * P, A)
        # sum_n c_n E_pi[phi[p_n, .]]: per-prompt coefficient mass times pi; a row without mass gives a product of 0,
        # and subtracting it changes nothing, so few rows are done alone
        per_prompt = np.bincount(cells.ravel(), weights=weights, minlength=S * P)  # (S P,)
        rows = np.flatnonzero(per_prompt != 0)  # the nonzero entries (NaN included), over a bool array: fewer passes
        if 2 * rows.size >= S * P:  # most of the table: one pass over all of it
            chosen -= per_prompt[:, None] * self._probs_table(self._log_policy(params)).reshape(S * P, A)
        else:
            chosen[rows] -= per_prompt[rows, None] * self._row_probs(self._log_policy_rows(params, rows), rows)
        return chosen.reshape(S, P * A) @ self._features_flat  # (S, d): sum_n c_n (phi - E_pi phi)

    def token_entropy(self, params: np.ndarray, prompts: np.ndarray, tokens: np.ndarray,
                      mask: np.ndarray | None = None) -> np.ndarray:
        """Entropy of pi(. | p) (S, n, 1), 0 on padding."""
        params, prompts = check_batch(params, prompts, self.num_prompts, self.param_dim)
        mask = check_mask(mask, np.shape(tokens))
        (S, n), (P, A) = prompts.shape, self.offsets.shape
        cells = (np.arange(S)[:, None] * P + prompts).ravel()  # (S*n,) flat (seed, prompt) rows
        table = self._log_policy_rows(params, cells)  # (S, P, A), the rows asked for made
        # responses side by side to one prompt (a group) have one row, so one entropy: each run's once, repeated
        starts = _run_starts(cells)  # (runs,)
        rows = cells[starts]  # (runs,)
        logpol = np.take(table.reshape(S * P, A), rows, axis=0)  # (runs, A)
        probs = self._row_probs(table, rows)  # exp(logpol), from the pi table when an evaluation made it
        h = -_row_sums(probs * logpol)  # (runs,): np.sum over the A actions, bit for bit
        h = np.repeat(h, np.diff(starts, append=cells.size)).reshape(S, n, 1)  # (S, n, 1)
        return np.where(mask, h, 0.0)

    def evaluate(self, params: np.ndarray) -> dict[str, np.ndarray]:
        """Exact expected reward and accuracy averaged over prompts, each (S,)."""
        pi = self._probs(params)  # (S, P, A) = exp(log_policy)
        reward = np.einsum("spa,pa->sp", pi, self._reward_table).mean(axis=-1)
        accuracy = pi[:, np.arange(self.num_prompts), self.answer].mean(axis=-1)
        return {"reward": reward, "accuracy": accuracy}

    def exact_grad(self, params: np.ndarray) -> np.ndarray:
        """grad J(theta) (S, d) of the exact expected reward J = mean_p sum_a pi(a|p) R[p, a] (the ascent direction):
        sum_a pi (R - J_p) phi[p, a], averaged over prompts."""
        pi = self._probs(params)  # (S, P, A)
        value = np.einsum("spa,pa->sp", pi, self._reward_table)[..., None]  # (S, P, 1) J_p
        w = pi * (self._reward_table - value)  # sum_a pi (R - J_p) phi = sum_a pi R (phi - E phi)
        S, P, A = pi.shape
        return w.reshape(S, P * A) @ self._features_flat / P

    def sup_reward(self, steps: int = 4000) -> tuple[float, np.ndarray]:
        """J* = sup J over the policy class, by noise-free Adam ascent on the exact gradient; and the argmax (1, d)."""
        theta = self.init_params(1)
        m, v = np.zeros_like(theta), np.zeros_like(theta)
        for t in range(1, steps + 1):
            g = -self.exact_grad(theta)
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            theta = theta - 0.05 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-12)
        return float(self.evaluate(theta)["reward"][0]), theta

    def exact_divergences(self, params_new: np.ndarray, params_behav: np.ndarray) -> dict[str, np.ndarray]:
        """Exact divergences of the joint (uniform prompt, action) distributions, each (S,).

        chi2, kl_new_behav = KL(new || behav), kl_behav_new = KL(behav || new) and
        m2 = E_behav[(log r)^2] are prompt averages; d2 = log(1 + chi2).
        """
        ln = self.log_policy(params_new)  # (S, P, A)
        lb = self.log_policy(params_behav)  # (S, P, A)
        chi2 = np.asarray(chi2_exact(ln, lb)).mean(axis=-1)  # (S,)
        return {
            "chi2": chi2,
            "d2": joint_d2(chi2, np.asarray(d2_exact(ln, lb))),
            "kl_new_behav": np.asarray(kl_exact(ln, lb)).mean(axis=-1),
            "kl_behav_new": np.asarray(kl_exact(lb, ln)).mean(axis=-1),
            "m2": np.asarray(m2_exact(ln, lb)).mean(axis=-1),
        }


@dataclass(frozen=True)
class NoisyBanditConfig(BanditConfig):
    """The bandit observed through a noisy verifier."""

    reward_noise: float = 2.0
    """Standard deviation of the Gaussian noise added to every observed reward (E reward, and J, unchanged)."""
    noise_seed: int = 0
    """Seed of the verifier's noise stream (its own generator: the training draws are untouched)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require_nonnegative("reward_noise", self.reward_noise)


class NoisyRewardBandit(BanditEnv):
    """The bandit with a noisy verifier: observed reward = R[p, a] + N(0, noise^2); E reward (and J) unchanged."""

    config: NoisyBanditConfig

    def __init__(self, config: NoisyBanditConfig = NoisyBanditConfig(), stream: tuple[int, ...] = ()):
        super().__init__(config)
        self.noise = float(config.reward_noise)
        self.noise_rng = np.random.default_rng([int(config.noise_seed), 7919, *stream])

    def with_noise_stream(self, *stream: int) -> "NoisyRewardBandit":
        """The same instance with its own verifier stream keyed by ``stream``: a run's noise then depends on the run
        alone, not on what the shared environment object drew before (a resumed benchmark trains some runs and not
        others in a process)."""
        return NoisyRewardBandit(self.config, tuple(int(v) for v in stream))

    def reward(self, prompts, tokens, mask=None) -> np.ndarray:
        clean = super().reward(prompts, tokens, mask)
        if self.noise == 0:
            return clean
        return clean + self.noise * self.noise_rng.standard_normal(clean.shape)

"""Countdown-like token MDP: a log-linear token policy, whole-sequence verifier, exact DP evaluation.

A response is ``L`` tokens with values ``0 .. V-1``; prompt ``p`` asks for a sequence whose SUM equals its target
``T_p``, scored with the three Countdown reward levels of Replay-RLOO (RLOO group replay (docs/REFERENCES.md),
Sec. 3 and App. B): 1.0 on the target, 0.1 within ``tolerance``, 0 otherwise.  The sequence importance ratio is the
product of token ratios, so replay's off-policy effects compound over positions as in an LLM.  Policy features,
warm start, difficulty and the exact forward/backward DPs (``evaluate``, ``exact_divergences``,
``state_distributions``, ``backward_values``): docs/SIMULATION.md, 'Token MDP'.  Divergences are those of the
joint (uniform prompt, response) distribution, prompt averages, with ``d2 = log(1 + chi2)``.

| code name          | symbol               | meaning                                                  |
|--------------------|----------------------|----------------------------------------------------------|
| ``params``         | theta (S, K V + 1)   | [:K V] reshaped (S, K, V), index k V + v; [-1] skill     |
| ``skill_feature``  | q (..., V)           | -((V - 1) x - v)^2, the feature of theta[-1]             |
| ``target``         | T_p (P,)             | target sum of each prompt                                |
| ``state_features`` | f(p, t, s) (..., K)  | [1, x, tau, x tau, z_p]                                  |
| ``offsets``        | b(p, t, s, v) (..., V)| warm-start logit offsets                                |
| ``sharpness``      | beta_p (P,)          | per-prompt warm-start sharpness (difficulty)             |
| ``prompt_bias``    | bias (P, V)          | per-prompt token preferences                             |
| ``prompt_embed``   | z_p (P, prompt_feature_dim) | random prompt features                            |
| ``tokens``         | (S, n, L)            | token values 0 .. V-1                                    |
| ``partial sums``   | s_t (S, n, L)        | sum of the (unmasked) tokens before position t          |
| ``tolerance``      | -                    | near-miss band earning 0.1                               |
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import log_softmax

from ...checks import require_int, require_nonnegative
from ...theory.divergences import chi2_exact, kl_exact
from .bandit import (
    check_batch,
    check_mask,
    check_params,
    joint_d2,
    sample_categorical,
    token_coef,
)

__all__ = ["TokenMDPConfig", "TokenMDPEnv"]

#: clip range of the normalised remaining amount x (infeasible states stay finite).
X_CLIP = (-0.5, 1.5)
#: number of state features besides the prompt embedding: [1, x, tau, x tau].
NUM_BASE_FEATURES = 4
#: positions per chunk in logp / grad_logp_contract / token_entropy: at most this many (S, n, chunk, V) entries.
CHUNK_ELEMENTS = 2**20


@dataclass(frozen=True)
class TokenMDPConfig:
    """A Countdown-like token MDP instance; every random draw comes from ``instance_seed``."""

    vocab_size: int = 6
    """V: token values 0 .. V-1."""
    seq_len: int = 8
    """L: tokens per response (fixed length)."""
    num_prompts: int = 32
    """P: number of prompts (targets)."""
    target_low: float = 0.25
    """Targets are drawn from [target_low, target_high] x the maximum sum L (V - 1)."""
    target_high: float = 0.75
    """Upper end of the target range, as a fraction of L (V - 1)."""
    tolerance: int = 2
    """A sequence with 0 < |sum - target| <= tolerance earns 0.1 ("well-formed but wrong")."""
    warm_sharpness_min: float = 0.05
    """Smallest per-prompt warm-start sharpness beta_p in the offsets -beta_p ((V - 1) x - v)^2 (hardest prompts)."""
    warm_sharpness_max: float = 1.6
    """Largest per-prompt warm-start sharpness beta_p (easiest prompts); beta_p is stratified log-uniform."""
    prompt_bias_std: float = 0.5
    """Std of the per-prompt token preferences bias[p, v] in the offsets (spreads difficulty)."""
    prompt_feature_dim: int = 1
    """Dimension of the random prompt embedding z_p in the state features (0 for none)."""
    instance_seed: int = 0
    """Seed of the instance (targets, biases, embeddings); shared by all training seeds."""

    def __post_init__(self) -> None:
        require_int("vocab_size", self.vocab_size, 2)
        require_int("seq_len", self.seq_len, 1)
        require_int("num_prompts", self.num_prompts, 1)
        if not 0.0 <= self.target_low <= self.target_high <= 1.0:
            raise ValueError(f"need 0 <= target_low <= target_high <= 1, got {self.target_low}, {self.target_high}")
        smax = self.seq_len * (self.vocab_size - 1)
        if math.ceil(self.target_low * smax) > math.floor(self.target_high * smax):
            raise ValueError("the target range contains no integer; widen target_low / target_high")
        require_int("tolerance", self.tolerance, 0)
        require_int("prompt_feature_dim", self.prompt_feature_dim, 0)
        if not 0.0 < self.warm_sharpness_min <= self.warm_sharpness_max:
            raise ValueError("need 0 < warm_sharpness_min <= warm_sharpness_max, got "
                             f"{self.warm_sharpness_min}, {self.warm_sharpness_max}")
        require_nonnegative("prompt_bias_std", self.prompt_bias_std, allow_inf=True)


class TokenMDPEnv:
    """Vectorised Countdown-like token MDP; see the module docstring.  Implements ``core.rollouts.Environment``."""

    def __init__(self, config: TokenMDPConfig = TokenMDPConfig()) -> None:
        self.config = config
        V, L, P = config.vocab_size, config.seq_len, config.num_prompts
        self.vocab_size = V
        self.seq_len = L
        self.num_prompts = P
        self.num_features = NUM_BASE_FEATURES + config.prompt_feature_dim  # K
        self.param_dim = self.num_features * V + 1  # d = K V + 1 (the skill coefficient)
        self.max_sum = L * (V - 1)
        rng = np.random.default_rng(config.instance_seed)
        lo = math.ceil(config.target_low * self.max_sum)
        hi = math.floor(config.target_high * self.max_sum)
        self.target = rng.integers(lo, hi + 1, size=P).astype(np.int64)  # (P,)
        self.prompt_bias = config.prompt_bias_std * rng.standard_normal((P, V))  # (P, V)
        self.prompt_embed = rng.standard_normal((P, config.prompt_feature_dim))  # (P, prompt_feature_dim)
        lo_b, hi_b = np.log(config.warm_sharpness_min), np.log(config.warm_sharpness_max)
        strata = (rng.permutation(P) + rng.random(P)) / P  # (P,) one point per stratum
        self.sharpness = np.exp(lo_b + (hi_b - lo_b) * strata)  # (P,) beta_p, stratified log-uniform
        self._dp_cache: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # t -> seed-independent DP terms

    # ------------------------------------------------------------------ #
    # state features and offsets
    # ------------------------------------------------------------------ #
    def _remaining(self, prompts: np.ndarray, t: np.ndarray, partial_sums: np.ndarray) -> np.ndarray:
        """x = clip((T_p - s) / ((L - t)(V - 1))), broadcast shape of the inputs."""
        rem = (self.target[prompts] - partial_sums) / ((self.seq_len - t) * (self.vocab_size - 1))
        return np.clip(rem, *X_CLIP)

    def state_features(self, prompts: np.ndarray, t: np.ndarray, partial_sums: np.ndarray) -> np.ndarray:
        """f(p, t, s) = [1, x, tau, x tau, z_p], shape (broadcast(prompts, t, partial_sums), K)."""
        prompts, t, partial_sums = np.broadcast_arrays(np.asarray(prompts), np.asarray(t), np.asarray(partial_sums))
        x = self._remaining(prompts, t, partial_sums)  # (...)
        tau = t / self.seq_len  # (...)
        base = np.stack([np.ones_like(x), x, tau, x * tau], axis=-1)  # (..., 4)
        return np.concatenate([base, self.prompt_embed[prompts]], axis=-1)  # (..., K)

    def skill_feature(self, prompts: np.ndarray, t: np.ndarray, partial_sums: np.ndarray) -> np.ndarray:
        """q(p, t, s, v) = -((V - 1) x - v)^2, shape (broadcast(prompts, t, partial_sums), V)."""
        prompts, t, partial_sums = np.broadcast_arrays(np.asarray(prompts), np.asarray(t), np.asarray(partial_sums))
        x = self._remaining(prompts, t, partial_sums)  # (...)
        return -(((self.vocab_size - 1) * x[..., None] - np.arange(self.vocab_size)) ** 2)  # (..., V)

    def offsets(self, prompts: np.ndarray, t: np.ndarray, partial_sums: np.ndarray) -> np.ndarray:
        """b(p, t, s, v) = -beta_p ((V - 1) x - v)^2 + bias[p, v], shape (..., V)."""
        prompts, t, partial_sums = np.broadcast_arrays(np.asarray(prompts), np.asarray(t), np.asarray(partial_sums))
        q = self.skill_feature(prompts, t, partial_sums)  # (..., V)
        return self.sharpness[prompts][..., None] * q + self.prompt_bias[prompts]

    def _split(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(theta block (S, K, V), skill coefficient (S,))."""
        S = params.shape[0]
        return params[:, :-1].reshape(S, self.num_features, self.vocab_size), params[:, -1]

    def _log_policy_items(self, params: np.ndarray, prompts: np.ndarray, t: np.ndarray, partial_sums: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """log pi(. | state) (S, ..., V), f (S, ..., K) and q (S, ..., V) for states broadcasting to (S, ...)."""
        theta, skill = self._split(params)  # (S, K, V), (S,)
        f = self.state_features(prompts, t, partial_sums)  # (S, ..., K)
        q = self.skill_feature(prompts, t, partial_sums)  # (S, ..., V)
        S, K = theta.shape[0], theta.shape[1]
        lin = (f.reshape(S, -1, K) @ theta).reshape(q.shape)  # (S, ..., V): batched (m, K) @ (K, V)
        skill = skill.reshape((S,) + (1,) * (q.ndim - 1))
        prompts = np.broadcast_to(prompts, q.shape[:-1])
        beta = self.sharpness[prompts][..., None] + skill  # (S, ..., 1): warm-start + learned sharpness
        logits = beta * q + self.prompt_bias[prompts] + lin  # (S, ..., V) = offsets + phi @ theta
        return log_softmax(logits, axis=-1), f, q

    # ------------------------------------------------------------------ #
    # Environment protocol
    # ------------------------------------------------------------------ #
    def init_params(self, num_seeds: int) -> np.ndarray:
        """theta_0 = 0, (S, d): the warm start lives in the offsets b."""
        return np.zeros((num_seeds, self.param_dim))

    def sample(self, params: np.ndarray, prompts: np.ndarray, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Autoregressive sampling: tokens (S, n, L), token log-probs (S, n, L), mask (S, n, L) all True.

        One ``rng.random((S, n, L))`` call supplies all uniforms; token t of item
        (s, i) is the inverse-CDF draw with ``u[s, i, t]``.
        """
        params, prompts = check_batch(params, prompts, self.num_prompts, self.param_dim)
        S, n = prompts.shape
        L = self.seq_len
        u = rng.random((S, n, L))  # (S, n, L)
        tokens = np.empty((S, n, L), dtype=np.int64)
        logp = np.empty((S, n, L))
        partial = np.zeros((S, n), dtype=np.int64)  # (S, n) s_t
        for t in range(L):
            lp, _, _ = self._log_policy_items(params, prompts, t, partial)  # (S, n, V)
            tok = sample_categorical(lp, u[..., t])  # (S, n)
            tokens[..., t] = tok
            logp[..., t] = np.take_along_axis(lp, tok[..., None], axis=-1)[..., 0]
            partial = partial + tok
        return tokens, logp, np.ones((S, n, L), dtype=bool)

    def reward(self, prompts: np.ndarray, tokens: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """1.0 if sum == T_p, 0.1 if 0 < |sum - T_p| <= tolerance, else 0; (S, n).  Padding is not summed."""
        prompts = np.asarray(prompts, dtype=np.int64)
        tokens = np.asarray(tokens, dtype=np.int64)
        mask = check_mask(mask, tokens.shape)
        miss = np.abs(np.sum(np.where(mask, tokens, 0), axis=-1) - self.target[prompts])  # (S, n)
        return np.where(miss == 0, 1.0, np.where(miss <= self.config.tolerance, 0.1, 0.0))

    def _prepare(self, params: np.ndarray, prompts: np.ndarray, tokens: np.ndarray, mask: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Validated params, prompts, tokens (padding -> 0), mask and exclusive prefix sums s_t (S, n, L)."""
        params, prompts = check_batch(params, prompts, self.num_prompts, self.param_dim)
        tokens = np.asarray(tokens)
        S, n = prompts.shape
        if tokens.shape != (S, n, self.seq_len):
            raise ValueError(f"tokens must have shape ({S}, {n}, {self.seq_len}), got {tokens.shape}")
        mask = check_mask(mask, tokens.shape)
        tok = np.where(mask, tokens, 0).astype(np.int64)  # (S, n, L)
        if tok.min(initial=0) < 0 or tok.max(initial=0) >= self.vocab_size:
            raise ValueError(f"tokens must lie in [0, {self.vocab_size}) at unmasked positions")
        partial = np.cumsum(tok, axis=-1) - tok  # (S, n, L) exclusive prefix sums (padding not summed)
        return params, prompts, tok, mask, partial

    def _position_chunks(self, shape: tuple[int, int, int]) -> list[slice]:
        """Slices of the L axis holding at most ``CHUNK_ELEMENTS`` (S, n, chunk, V) entries each."""
        S, n, L = shape
        step = max(1, CHUNK_ELEMENTS // max(1, S * n * self.vocab_size))
        return [slice(a, min(a + step, L)) for a in range(0, L, step)]

    def _chunk_log_policy(self, params: np.ndarray, prompts: np.ndarray, partial: np.ndarray, chunk: slice
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """log pi (S, n, c, V), f (S, n, c, K), q (S, n, c, V) at the positions of ``chunk``."""
        t = np.arange(partial.shape[2])[chunk]  # (c,)
        return self._log_policy_items(params, prompts[..., None], t, partial[..., chunk])

    def logp(self, params: np.ndarray, prompts: np.ndarray, tokens: np.ndarray, mask: np.ndarray | None = None
             ) -> np.ndarray:
        """Token log-probs log pi(token_t | p, t, s_t) (S, n, L), 0 on padding."""
        params, prompts, tok, mask, partial = self._prepare(params, prompts, tokens, mask)
        out = np.zeros(tok.shape)
        for ch in self._position_chunks(tok.shape):
            lp, _, _ = self._chunk_log_policy(params, prompts, partial, ch)  # (S, n, c, V)
            out[..., ch] = np.take_along_axis(lp, tok[..., ch, None], axis=-1)[..., 0]
        return np.where(mask, out, 0.0)

    def grad_logp_contract(self, params: np.ndarray, prompts: np.ndarray, tokens: np.ndarray,
                           mask: np.ndarray | None, coef: np.ndarray) -> np.ndarray:
        """sum_{n, t} coef grad log pi(token | state), (S, d); ``coef`` (S, n) or (S, n, L).

        grad log pi = [f (x) (e_token - pi), q(token) - E_pi[q]].  Never forms the
        (S, n, L, V, d) feature tensor: with separable features the block part
        is a batched matmul (S, K, n c) @ (S, n c, V) per chunk of c positions,
        and chunks hold at most ``CHUNK_ELEMENTS`` (S, n, c, V) entries, so
        the memory does not grow with L.
        """
        params, prompts, tok, mask, partial = self._prepare(params, prompts, tokens, mask)
        c_all = token_coef(coef, mask)  # (S, n, L), 0 on padding
        S, K, V = params.shape[0], self.num_features, self.vocab_size
        g_block = np.zeros((S, K, V))
        g_skill = np.zeros(S)
        for ch in self._position_chunks(tok.shape):
            lp, f, q = self._chunk_log_policy(params, prompts, partial, ch)  # (S, n, c, V), (S, n, c, K), (S, n, c, V)
            c = c_all[..., ch]  # (S, n, c)
            resid = -np.exp(lp)  # (S, n, c, V): e_token - pi
            idx = tok[..., ch, None]
            np.put_along_axis(resid, idx, np.take_along_axis(resid, idx, axis=-1) + 1.0, axis=-1)
            cf = (c[..., None] * f).reshape(S, -1, K)  # (S, n c, K)
            g_block += np.swapaxes(cf, 1, 2) @ resid.reshape(S, -1, V)  # (S, K, V)
            g_skill += np.einsum("snl,snlv,snlv->s", c, resid, q)  # (S,): sum c (q(token) - E_pi q)
        return np.concatenate([g_block.reshape(S, K * V), g_skill[:, None]], axis=1)

    def token_entropy(self, params: np.ndarray, prompts: np.ndarray, tokens: np.ndarray,
                      mask: np.ndarray | None = None) -> np.ndarray:
        """Entropy of pi(. | p, t, s_t) (S, n, L), 0 on padding."""
        params, prompts, tok, mask, partial = self._prepare(params, prompts, tokens, mask)
        out = np.zeros(tok.shape)
        for ch in self._position_chunks(tok.shape):
            lp, _, _ = self._chunk_log_policy(params, prompts, partial, ch)  # (S, n, c, V)
            out[..., ch] = -np.sum(np.exp(lp) * lp, axis=-1)
        return np.where(mask, out, 0.0)

    # ------------------------------------------------------------------ #
    # exact dynamic programmes over (t, partial sum)
    # ------------------------------------------------------------------ #
    def _dp_state_terms(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Seed-independent f (P, N_t, K), q (P, N_t, V), b (P, N_t, V) at every reachable sum of step t (cached)."""
        if t not in self._dp_cache:
            sums = np.arange(t * (self.vocab_size - 1) + 1)[None, :]  # (1, N_t)
            prompts = np.arange(self.num_prompts)[:, None]  # (P, 1)
            self._dp_cache[t] = (self.state_features(prompts, t, sums), self.skill_feature(prompts, t, sums),
                                 self.offsets(prompts, t, sums))
        return self._dp_cache[t]

    def _dp_log_policy(self, params: np.ndarray, t: int) -> np.ndarray:
        """log pi(. | p, t, s) for every prompt and reachable sum s = 0 .. t (V - 1): (S, P, t (V-1) + 1, V)."""
        f, q, b = self._dp_state_terms(t)  # (P, N_t, K), (P, N_t, V), (P, N_t, V)
        theta, skill = self._split(params)  # (S, K, V), (S,)
        P, N, K = f.shape
        lin = (f.reshape(P * N, K) @ theta).reshape(-1, P, N, self.vocab_size)  # (S, P, N_t, V)
        return log_softmax(b + lin + skill[:, None, None, None] * q, axis=-1)

    def _shift(self, w: np.ndarray) -> np.ndarray:
        """Push mass w (..., N_t, V) at (s, v) to sum s + v: (..., N_t + V - 1)."""
        N, V = w.shape[-2], w.shape[-1]
        out = np.zeros(w.shape[:-2] + (N + V - 1,))
        for v in range(V):
            out[..., v:v + N] += w[..., v]
        return out

    def final_sum_distribution(self, params: np.ndarray) -> np.ndarray:
        """P(sum of the L tokens = s | p) for s = 0 .. L (V - 1), exact: (S, P, L (V - 1) + 1)."""
        params = check_params(params, self.param_dim)
        dist = np.ones((params.shape[0], self.num_prompts, 1))  # (S, P, 1): s_0 = 0
        for t in range(self.seq_len):
            pi = np.exp(self._dp_log_policy(params, t))  # (S, P, N_t, V)
            dist = self._shift(dist[..., None] * pi)  # (S, P, N_{t+1})
        return dist

    def prompt_reward(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact per-prompt (expected reward, accuracy), each (S, P)."""
        dist = self.final_sum_distribution(params)  # (S, P, N_L)
        miss = np.abs(np.arange(self.max_sum + 1) - self.target[:, None])  # (P, N_L)
        table = np.where(miss == 0, 1.0, np.where(miss <= self.config.tolerance, 0.1, 0.0))  # (P, N_L)
        accuracy = np.take_along_axis(dist, np.broadcast_to(self.target[None, :, None], dist.shape[:2] + (1,)),
                                      axis=-1)[..., 0]
        return np.sum(dist * table, axis=-1), accuracy

    def prompt_accuracy(self, params: np.ndarray) -> np.ndarray:
        """Exact P(sum == T_p) per prompt, (S, P)."""
        return self.prompt_reward(params)[1]

    def difficulty(self) -> np.ndarray:
        """Warm-start success probability per prompt, (P,)."""
        return self.prompt_accuracy(self.init_params(1))[0]

    def evaluate(self, params: np.ndarray) -> dict[str, np.ndarray]:
        """Exact expected reward and accuracy averaged over prompts (DP over the final sum), each (S,)."""
        reward, accuracy = self.prompt_reward(params)
        return {"reward": reward.mean(axis=-1), "accuracy": accuracy.mean(axis=-1)}

    def exact_divergences(self, params_new: np.ndarray, params_behav: np.ndarray) -> dict[str, np.ndarray]:
        """Exact sequence-level divergences (forward DPs over (t, s)), joint over uniform prompts, each (S,).

        chi2, d2 = log(1 + chi2), kl_new_behav = KL(new || behav),
        kl_behav_new = KL(behav || new), m2 = E_behav[(sum_t log r_t)^2].

        Cost is dominated by the token-level ``chi2_exact`` / ``kl_exact`` calls on
        (S, P, N_t, V) arrays: about 0.7 s for S = 64, P = 32, L = 8 and 9 s for
        L = 32 (one CPU core); call it on a schedule, not every step, at long L.
        """
        tn = check_params(params_new, self.param_dim)
        tb = check_params(params_behav, self.param_dim)
        if tn.shape != tb.shape:
            raise ValueError(f"params_new {tn.shape} and params_behav {tb.shape} differ in shape")
        shape = (tn.shape[0], self.num_prompts, 1)
        p_b = np.ones(shape)  # (S, P, N_t) behaviour state distribution
        p_n = np.ones(shape)  # new-policy state distribution
        a = np.ones(shape)  # E_b[R_{<t}^2; s_t = s] (measure with weights pi_new^2 / pi_behav)
        m1 = np.zeros(shape)  # E_b[Lambda_t; s_t = s], Lambda_t = sum_{u<t} log r_u
        m2 = np.zeros(shape)  # E_b[Lambda_t^2; s_t = s]
        chi2 = np.zeros(shape[:2])  # (S, P)
        kl_nb = np.zeros(shape[:2])
        kl_bn = np.zeros(shape[:2])
        for t in range(self.seq_len):
            ln = self._dp_log_policy(tn, t)  # (S, P, N_t, V)
            lb = self._dp_log_policy(tb, t)
            with np.errstate(over="ignore"):  # chi^2 can legitimately be +inf for far-apart policies
                chi2 += np.sum(a * chi2_exact(ln, lb), axis=-1)  # E_b[R^2] - 1 = sum_t E_b[R_{<t}^2 chi2_t]
            kl_nb += np.sum(p_n * kl_exact(ln, lb), axis=-1)  # chain rule of KL
            kl_bn += np.sum(p_b * kl_exact(lb, ln), axis=-1)
            lr = ln - lb  # (S, P, N_t, V) token log-ratio
            pb = np.exp(lb)
            with np.errstate(over="ignore"):
                a_next = self._shift(a[..., None] * np.exp(2.0 * ln - lb))
            m2 = self._shift(pb * (m2[..., None] + 2.0 * m1[..., None] * lr + p_b[..., None] * lr**2))
            m1 = self._shift(pb * (m1[..., None] + p_b[..., None] * lr))
            p_b = self._shift(p_b[..., None] * pb)
            p_n = self._shift(p_n[..., None] * np.exp(ln))
            a = a_next
        chi2_mean = chi2.mean(axis=-1)  # (S,)
        return {
            "chi2": chi2_mean,
            "d2": joint_d2(chi2_mean),
            "kl_new_behav": kl_nb.mean(axis=-1),
            "kl_behav_new": kl_bn.mean(axis=-1),
            "m2": m2.sum(axis=-1).mean(axis=-1),
        }

    # ------------------------------------------------------------------ #
    # exact expectations of per-token quantities (the calibration's exact gradient)
    # ------------------------------------------------------------------ #
    def final_sum_reward(self) -> np.ndarray:
        """The verifier as a table over final sums: reward of sum s for prompt p, (P, L (V - 1) + 1)."""
        miss = np.abs(np.arange(self.max_sum + 1) - self.target[:, None])  # (P, N_L)
        return np.where(miss == 0, 1.0, np.where(miss <= self.config.tolerance, 0.1, 0.0))

    def token_log_policy(self, params: np.ndarray, t: int) -> np.ndarray:
        """log pi(v | p, t, s) at every prompt and reachable sum s = 0 .. t (V - 1): (S, P, t (V - 1) + 1, V)."""
        if not 0 <= t < self.seq_len:
            raise ValueError(f"t must lie in [0, {self.seq_len}), got {t}")
        return self._dp_log_policy(check_params(params, self.param_dim), t)

    def state_distributions(self, params: np.ndarray) -> list[np.ndarray]:
        """P(s_t = s | p) under pi_params for t = 0 .. L, exact forward DP: entry t is (S, P, t (V - 1) + 1).

        Entry L is the final-sum distribution (``final_sum_distribution``).
        """
        params = check_params(params, self.param_dim)
        dist = [np.ones((params.shape[0], self.num_prompts, 1))]  # s_0 = 0
        for t in range(self.seq_len):
            dist.append(self._shift(dist[-1][..., None] * np.exp(self._dp_log_policy(params, t))))
        return dist

    def next_state_values(self, values: np.ndarray, t: int) -> np.ndarray:
        """values (..., N_{t+1}) over the sums after step t, read at s + v for every (s, v) of step t: (..., N_t, V)."""
        n_t = t * (self.vocab_size - 1) + 1
        if values.shape[-1] != n_t + self.vocab_size - 1:
            raise ValueError(f"values must have {n_t + self.vocab_size - 1} sums on the last axis, "
                             f"got {values.shape[-1]}")
        index = np.arange(n_t)[:, None] + np.arange(self.vocab_size)[None, :]  # (N_t, V): s + v
        return values[..., index]

    def backward_values(self, params: np.ndarray, terminal: np.ndarray) -> list[np.ndarray]:
        """E_pi[terminal(p, s_L) | s_t = s] for t = 0 .. L (exact backward DP): entry t is (S, P, N_t).

        ``terminal`` (S, P, L (V - 1) + 1) is any function of the prompt and the final sum (e.g. the
        expected advantage of a response's reward level); entry L is ``terminal`` itself.
        """
        params = check_params(params, self.param_dim)
        terminal = np.asarray(terminal, dtype=float)
        want = (params.shape[0], self.num_prompts, self.max_sum + 1)
        if terminal.shape != want:
            raise ValueError(f"terminal must have shape {want}, got {terminal.shape}")
        values = [terminal]
        for t in reversed(range(self.seq_len)):
            pi = np.exp(self._dp_log_policy(params, t))  # (S, P, N_t, V)
            values.append(np.sum(pi * self.next_state_values(values[-1], t), axis=-1))
        return values[::-1]

    def state_token_contract(self, params: np.ndarray, t: int, weight: np.ndarray) -> np.ndarray:
        """sum over (p, s, v) of weight[:, p, s, v] grad_theta log pi(v | p, t, s): (S, d).

        ``weight`` (S, P, t (V - 1) + 1, V) holds one number per state of step t and token; with
        weight = P(state) pi_b(v | state) c(state, v) / P this is the expected contribution of step t
        to sum_t c_t grad log pi(token_t), the same contraction ``grad_logp_contract`` does on samples
        (grad log pi = [f (x) (e_v - pi), q(v) - E_pi q]).
        """
        params = check_params(params, self.param_dim)
        f, q, _ = self._dp_state_terms(t)  # (P, N_t, K), (P, N_t, V)
        pi = np.exp(self._dp_log_policy(params, t))  # (S, P, N_t, V)
        weight = np.asarray(weight, dtype=float)
        if weight.shape != pi.shape:
            raise ValueError(f"weight must have shape {pi.shape}, got {weight.shape}")
        total = weight.sum(axis=-1)  # (S, P, N_t)
        resid = weight - pi * total[..., None]  # sum_v w_v (e_v - pi)
        S = params.shape[0]
        g_block = np.einsum("pnk,spnv->skv", f, resid).reshape(S, -1)  # (S, K V)
        g_skill = np.einsum("spnv,pnv->s", resid, q)  # sum_v w_v (q(v) - E_pi q)
        return np.concatenate([g_block, g_skill[:, None]], axis=1)

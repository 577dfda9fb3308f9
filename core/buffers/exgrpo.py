"""ExGRPO (Sec. 4, Algs. 1-2): question buckets by success, the lowest-entropy trajectory, delayed start."""

from __future__ import annotations

from typing import Literal

import numpy as np

from ...checks import require_one_of, require_unit_interval
from ...theory import exgrpo as _exgrpo
from ..rng import PerSeedGenerator, RandomSource
from ..rollouts import RolloutBatch
from .base import (
    EntropyFn,
    Sample,
    SlotBuffer,
    _int_param,
)

# --- ExGRPO ----------------------------------------------------------------------------------------


class ExGRPOBuffer(SlotBuffer):
    """ExGRPO experience buffer: per-question success counts, stored successful trajectories (Sec. 4, Algs. 1-2).

    * Records (Alg. 1 lines 24-29): for each group of a question, k = number of
      correct (reward == 1) responses. k == K (all of the group's responses): the
      question is RETIRED (its trajectories removed, ``retired`` set so fresh
      sampling can skip it; later groups of it are ignored). Otherwise the
      latest success count becomes k and its correct responses are stored with
      their behaviour token log-probs, exact duplicates skipped (same mask and
      same tokens on it), at most ``max_trajectories`` per question (the oldest
      is overwritten). All-failed questions are never retired; with k = 0 a
      question keeps its stored trajectories but is in no bucket (buckets are
      0 < k < K) until a later success.
    * Buckets and question sampling (Alg. 2): bucket probabilities from
      ``theory.exgrpo.bucket_probabilities`` over the non-empty buckets (units
      "success-count" = reference code, "accuracy" = paper text); bucket counts
      ~ Multinomial(n, p) (numpy's sampler, same law as Alg. 2's sequential
      binomials), counts above a bucket's size clipped and the deficit redrawn
      over buckets with room; within a bucket uniform without replacement. Item
      probability of one draw p_k / |U_k| (``theory.exgrpo.item_probabilities``).
      This part loops over seeds in Python.
    * Trajectory selection: o* = the stored trajectory with the LOWEST entropy
      under the CURRENT policy (Sec. 4.1), through the callback
      ``entropy_fn(prompts (S, m), tokens (S, m, L), mask (S, m, L)) -> (S, m)``
      (full-vocabulary token entropy averaged over the trajectory's tokens);
      ``selection="highest"`` / ``"random"`` for the ablations.
    * Delayed start (Sec. 4.2): ``active`` switches on for good once a batch
      pass@1 > ``start_pass_rate`` (0.35) is observed (``observe_pass_rate``);
      records are collected only while active, and ``split`` gives no replay
      before. ``split(B)`` is ``theory.exgrpo.batch_split``.
    * Mixed groups: a replayed question's group is K - 1 fresh rollouts + o*.
      Pass whichever the caller counts to ``add`` (``group_size`` = responses
      per group; o* is an exact duplicate of a stored trajectory, so it is not
      stored twice).

    Store slots: trajectory j of question q is slot q * max_trajectories + j.
    """

    def __init__(self, num_seeds: int, num_prompts: int, group_size: int, seq_len: int, *,
                 max_trajectories: int = 16, rho: float = 0.5, mu: float | None = None, sigma: float = 1.0,
                 units: _exgrpo.Units = "success-count",
                 selection: Literal["lowest", "highest", "random"] = "lowest",
                 start_pass_rate: float = 0.35, delayed_start: bool = True,
                 token_dtype: np.dtype | type = np.int16, logp_dtype: np.dtype | type = np.float64) -> None:
        self.num_prompts = _int_param("num_prompts", num_prompts, 1)
        self.group_size = _int_param("group_size", group_size, 2)
        self.max_trajectories = _int_param("max_trajectories", max_trajectories, 1)
        super().__init__(num_seeds, self.num_prompts * self.max_trajectories, seq_len,
                         token_dtype=token_dtype, logp_dtype=logp_dtype)
        self.rho = require_unit_interval("rho", rho, closed=False)
        # validate mu / sigma / units once through the theory function
        _exgrpo.bucket_probabilities(self.group_size, mu, sigma, units)
        self.mu, self.sigma = mu, float(sigma)
        self.units: _exgrpo.Units = units
        require_one_of("selection", selection, ("lowest", "highest", "random"))
        self.selection = selection
        self.start_pass_rate = require_unit_interval("start_pass_rate", start_pass_rate)
        S, P = self.num_seeds, self.num_prompts
        self.success_count = np.full((S, P), -1, dtype=np.int64)  # (seeds, prompts) latest k, -1 = no record
        self.retired = np.zeros((S, P), dtype=bool)  # (seeds, prompts) the retired set
        self.active = np.zeros(S, dtype=bool) if delayed_start else np.ones(S, dtype=bool)
        self._traj_ptr = np.zeros((S, P), dtype=np.int64)  # per-question ring pointer
        self._traj_hash = np.zeros((S, self.capacity), dtype=np.uint64)  # (seeds, slots) hash of (mask, tokens)
        mix = np.random.default_rng(0x5EED).integers(1, 2**63, size=(2, self.seq_len), dtype=np.int64)
        self._mix = (mix | 1).astype(np.uint64)  # fixed odd multipliers: a hash, not a source of randomness

    def _arrays(self) -> list[np.ndarray]:
        return super()._arrays() + [self.success_count, self.retired, self.active, self._traj_ptr, self._traj_hash]

    def _hash(self, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """64-bit hash (...,) of a trajectory's mask and its tokens on the mask (padding ignored)."""
        x = tokens.astype(np.int64).astype(np.uint64)  # negative ids wrap, still distinct
        with np.errstate(over="ignore"):
            h = np.where(mask, x * self._mix[0] + self._mix[1], np.uint64(0))  # (..., L)
            return h.sum(axis=-1, dtype=np.uint64)

    @staticmethod
    def _same(tok_a: np.ndarray, msk_a: np.ndarray, tok_b: np.ndarray, msk_b: np.ndarray) -> np.ndarray:
        """Exact equality (k,) of k trajectory pairs (k, L): same mask, same tokens on it."""
        ta = np.where(msk_a, tok_a.astype(np.int64), 0)
        tb = np.where(msk_b, tok_b.astype(np.int64), 0)
        return np.all(msk_a == msk_b, axis=-1) & np.all(ta == tb, axis=-1)

    # --- delayed start ---------------------------------------------------

    def observe_pass_rate(self, rate: np.ndarray | float) -> None:
        """Switch replay on (one way) in seeds whose batch pass@1 exceeds start_pass_rate (Sec. 4.2)."""
        r = np.broadcast_to(np.asarray(rate, dtype=float), (self.num_seeds,))
        self.active |= r > self.start_pass_rate

    # --- records -----------------------------------------------------------

    def add(self, batch: RolloutBatch, step: int, group_size: int | None = None) -> None:
        """Update records from groups of ``group_size`` (default K) contiguous responses to one prompt."""
        self._check_batch(batch)
        S, n = self.num_seeds, batch.size
        Kp = self.group_size if group_size is None else _int_param("group_size", group_size, 1)
        if Kp > self.group_size:
            raise ValueError(f"group_size must be <= K={self.group_size}, got {Kp}")
        if n % Kp:
            raise ValueError(f"batch of {n} responses is not a whole number of groups of group_size={Kp}")
        G = n // Kp
        prompts = batch.prompt.reshape(S, G, Kp)
        if np.any(prompts != prompts[:, :, :1]):
            raise ValueError(f"responses must come as contiguous groups of group_size={Kp} sharing one prompt")
        q = prompts[:, :, 0]  # (S, G)
        if q.size and (q.min() < 0 or q.max() >= self.num_prompts):
            raise ValueError(f"prompt ids must be in [0, num_prompts={self.num_prompts})")
        correct = batch.reward.reshape(S, G, Kp) == 1.0  # Eq. (1): reward 1 iff correct
        k = correct.sum(axis=2)  # (S, G) success count
        occ = _occurrence_rank(q)  # repeated prompts in one seed are processed in order
        for r in range(int(occ.max(initial=-1)) + 1):
            sel = (occ == r) & self.active[:, None] & ~self.retired[self._rows, q]
            self._update_groups(sel, q, k, correct, batch, Kp)

    def _update_groups(self, sel: np.ndarray, q: np.ndarray, k: np.ndarray, correct: np.ndarray,
                       batch: RolloutBatch, Kp: int) -> None:
        M = self.max_trajectories
        s, g = np.nonzero(sel)
        if s.size == 0:
            return
        qq, kk = q[s, g], k[s, g]
        # Alg. 1 lines 25-26, 32: all correct -> retired set, removed from the buffer
        ret = kk == Kp
        rs, rq = s[ret], qq[ret]
        self.retired[rs, rq] = True
        self.success_count[rs, rq] = -1
        if rs.size:
            self._evict(np.repeat(rs, M), (rq[:, None] * M + np.arange(M)).ravel())
        # Alg. 1 lines 27-28: partial success -> latest k, store the correct responses
        keep = ~ret
        ps, pg, pq = s[keep], g[keep], qq[keep]
        self.success_count[ps, pq] = kk[keep]
        cand = correct[ps, pg]  # (n, Kp)
        items = pg[:, None] * Kp + np.arange(Kp)  # (n, Kp) response index in the batch
        # exact duplicates: compare 64-bit hashes, then confirm hash matches token by token
        tok = batch.tokens[ps[:, None], items]  # (n, Kp, L)
        msk = batch.mask[ps[:, None], items]
        h_new = self._hash(tok, msk)  # (n, Kp)
        stored = pq[:, None] * M + np.arange(M)  # (n, M)
        same_stored = (h_new[:, :, None] == self._traj_hash[ps[:, None], stored][:, None, :]) \
            & self.valid[ps[:, None], stored][:, None, :]  # (n, Kp, M)
        a, j, m = np.nonzero(same_stored)
        if a.size:
            same_stored[a, j, m] = self._same(tok[a, j], msk[a, j], self.store.tokens[ps[a], stored[a, m]],
                                              self.store.mask[ps[a], stored[a, m]])
        same_new = (h_new[:, :, None] == h_new[:, None, :]) & cand[:, None, :] \
            & np.tri(Kp, k=-1, dtype=bool)[None]  # (n, Kp, Kp): an earlier copy in the same group
        a, j, m = np.nonzero(same_new)
        if a.size:
            same_new[a, j, m] = self._same(tok[a, j], msk[a, j], tok[a, m], msk[a, m])
        new = cand & ~same_stored.any(axis=2) & ~same_new.any(axis=2)  # exact duplicates skipped
        rank = np.cumsum(new, axis=1) - 1
        cnt = new.sum(axis=1)
        skip = np.maximum(cnt - M, 0)[:, None]
        put = new & (rank >= skip)
        dst = pq[:, None] * M + (self._traj_ptr[ps, pq][:, None] + rank - skip) % M  # (n, Kp)
        a, j = np.nonzero(put)
        w_rows, w_dst, w_item = ps[a], dst[a, j], items[a, j]
        self._evict(w_rows, w_dst)
        self.store.write(w_rows, w_dst, batch, w_item)
        self._traj_hash[w_rows, w_dst] = h_new[a, j]
        self._reset(w_rows, w_dst)
        self._traj_ptr[ps, pq] = (self._traj_ptr[ps, pq] + np.minimum(cnt, M)) % M

    # --- buckets -------------------------------------------------------------

    def buckets(self) -> np.ndarray:
        """Bucket of each question (S, P): its latest k if 0 < k < K and it has a stored trajectory, else 0."""
        has = self.valid.reshape(self.num_seeds, self.num_prompts, self.max_trajectories).any(axis=2)
        k = self.success_count
        in_e = (k >= 1) & (k <= self.group_size - 1) & has & ~self.retired
        return np.where(in_e, k, 0)

    def bucket_sizes(self) -> np.ndarray:
        """|U_k| for k = 1..K-1, (S, K-1)."""
        b = self.buckets()
        return (b[:, :, None] == np.arange(1, self.group_size)).sum(axis=1)

    def n_experience(self) -> np.ndarray:
        """|E|: questions in a bucket, (S,)."""
        return (self.buckets() > 0).sum(axis=1)

    def bucket_probs(self) -> np.ndarray:
        """Bucket probabilities over the non-empty buckets (S, K-1); rows with no bucket are 0."""
        sizes = self.bucket_sizes()
        nonempty = sizes > 0
        out = np.zeros(sizes.shape)
        rows = nonempty.any(axis=1)
        if np.any(rows):
            out[rows] = _exgrpo.bucket_probabilities(self.group_size, self.mu, self.sigma, self.units,
                                                     nonempty=nonempty[rows])  # Alg. 1 line 6 / Alg. 2
        return out

    def question_probabilities(self) -> np.ndarray:
        """Probability of each question in one draw, p_k / |U_k| (S, P) (0 outside the buckets)."""
        per_item = _exgrpo.item_probabilities(self.bucket_sizes(), self.bucket_probs())  # (S, K-1)
        b = self.buckets()
        padded = np.concatenate([np.zeros((self.num_seeds, 1)), per_item], axis=1)  # bucket 0 -> 0
        return np.take_along_axis(padded, b, axis=1)

    def split(self, B: int) -> tuple[np.ndarray, np.ndarray]:
        """(|B_exp|, |B_on|) per seed, (S,) each: min(floor(rho B), |E|) once active, else (0, B)."""
        n_exp = np.where(self.active, self.n_experience(), 0)
        return _exgrpo.batch_split(B, self.rho, n_exp)  # Sec. 4.2 / Alg. 1 line 7

    # --- sampling ------------------------------------------------------------

    def _bucket_counts(self, n: int, p: np.ndarray, sizes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        c = rng.multinomial(n, p)  # Alg. 2 line 11
        while True:
            deficit = int(np.maximum(c - sizes, 0).sum())
            c = np.minimum(c, sizes)  # Alg. 2 note: clip to |U_k| and redistribute
            if deficit == 0:
                return c
            room = sizes - c
            q = np.where(room > 0, p, 0.0)
            q = q / q.sum() if q.sum() > 0 else room / room.sum()
            c = c + rng.multinomial(deficit, q)

    def sample(self, batch_size: int, step: int, rng: RandomSource,
               entropy_fn: EntropyFn | None = None) -> Sample:
        """Draw up to ``batch_size`` questions per seed and their o* trajectories.

        Seeds with fewer questions in the buckets than ``batch_size`` give all of
        them; the rest of their row is padding with ``valid = False``. ``index``
        is the store slot of o*; ``batch.prompt`` the question.
        """
        B = _int_param("batch_size", batch_size, 0)
        if self.selection != "random" and entropy_fn is None:
            raise ValueError(f"selection={self.selection!r} needs entropy_fn(prompts, tokens, mask) -> (S, m)")
        S, M = self.num_seeds, self.max_trajectories
        b = self.buckets()
        sizes = (b[:, :, None] == np.arange(1, self.group_size)).sum(axis=1)  # (S, K-1)
        probs = self.bucket_probs()
        q_sel = np.zeros((S, B), dtype=np.int64)
        valid = np.zeros((S, B), dtype=bool)
        for s in range(S):  # per-seed Python loop: Alg. 2 bucket counts and within-bucket draws
            n = min(B, int(sizes[s].sum()))
            if n == 0:
                continue
            g = rng.seed_generator(s) if isinstance(rng, PerSeedGenerator) else rng  # seed s: its own stream
            counts = self._bucket_counts(n, probs[s], sizes[s], g)
            chosen = [g.choice(np.flatnonzero(b[s] == kb + 1), size=c, replace=False)  # Alg. 2 line 14
                      for kb, c in enumerate(counts) if c > 0]
            q_sel[s, :n] = np.concatenate(chosen)
            valid[s, :n] = True
        cand = q_sel[:, :, None] * M + np.arange(M)  # (S, B, M)
        cand_valid = self.valid[self._rows[:, :, None], cand] & valid[:, :, None]
        if B == 0 or not valid.any():
            pick = np.zeros((S, B), dtype=np.int64)
        elif self.selection == "random":
            score = np.where(cand_valid, rng.random(cand.shape), -np.inf)
            pick = score.argmax(axis=2)
        else:
            assert entropy_fn is not None  # checked above: a selection other than random needs it
            flat = cand.reshape(S, B * M)
            ent = np.asarray(entropy_fn(np.repeat(q_sel, M, axis=1),
                                        self.store.tokens[self._rows, flat].astype(np.int64),
                                        self.store.mask[self._rows, flat])).reshape(S, B, M)
            if self.selection == "lowest":
                pick = np.where(cand_valid, ent, np.inf).argmin(axis=2)  # Sec. 4.1: o* = argmin H(o; pi_theta)
            else:
                pick = np.where(cand_valid, ent, -np.inf).argmax(axis=2)
        index = np.where(valid, np.take_along_axis(cand, pick[:, :, None], axis=2)[:, :, 0], 0)
        return self._finish_sample(index, np.ones(index.shape), step, valid)


class UniformQuestionBuffer(ExGRPOBuffer):
    """ExGRPOBuffer whose question draw is uniform over the questions in E ("w/o question selection" ablation).

    Bucket k gets probability |U_k| / |E| (so one draw is uniform over E); the counts
    then go through the same multinomial-and-clip sampler, within a bucket without
    replacement, so a batch is a uniform draw up to the clip-and-redraw of Alg. 2.
    """

    def bucket_probs(self) -> np.ndarray:
        sizes = self.bucket_sizes().astype(float)  # (S, K-1)
        total = sizes.sum(axis=1, keepdims=True)
        return np.divide(sizes, total, out=np.zeros_like(sizes), where=total > 0)


def _occurrence_rank(q: np.ndarray) -> np.ndarray:
    """For (S, G) ids, how many earlier entries of the same row share the id (0 for the first)."""
    S, G = q.shape
    if G == 0:
        return np.zeros((S, 0), dtype=np.int64)
    order = np.argsort(q, axis=1, kind="stable")
    qs = np.take_along_axis(q, order, axis=1)
    idx = np.broadcast_to(np.arange(G), (S, G))
    start = np.ones((S, G), dtype=bool)
    start[:, 1:] = qs[:, 1:] != qs[:, :-1]
    run_start = np.maximum.accumulate(np.where(start, idx, 0), axis=1)
    rank = np.empty((S, G), dtype=np.int64)
    np.put_along_axis(rank, order, idx - run_start, axis=1)
    return rank

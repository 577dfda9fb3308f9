"""Tests for replay_theory.core.buffers and core.sumtree (values, naive-loop references, designs)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from replay_theory.core.buffers import (
    EpochSchedule,
    ExGRPOBuffer,
    FifoBuffer,
    GroupReplayBuffer,
    PositiveBiasBuffer,
    PrioritizedBuffer,
    SelectiveFifoBuffer,
    StaleKQueue,
)
from replay_theory.core.rollouts import RolloutBatch
from replay_theory.core.sumtree import SumTree
from replay_theory.theory import exgrpo as ex
from replay_theory.theory import freshper as fp
from replay_theory.theory import group_replay as gr


def make_batch(S, n, L, step, *, ids=None, reward=None, advantage=None, prompt=None, group=None,
               tokens=None, mask=None, rng=None):
    """A RolloutBatch (S, n) created at ``step``; ``ids`` go into ``group`` so items can be traced."""
    rng = rng if rng is not None else np.random.default_rng(0)
    if tokens is None:
        tokens = rng.integers(0, 5, size=(S, n, L))
    if mask is None:
        mask = np.ones((S, n, L), dtype=bool)
    if ids is not None:
        group = np.broadcast_to(np.asarray(ids), (S, n)).copy()
    return RolloutBatch(
        prompt=np.zeros((S, n), dtype=np.int64) if prompt is None else np.broadcast_to(prompt, (S, n)).copy(),
        tokens=np.asarray(tokens),
        mask=np.asarray(mask),
        logp_behav=-rng.random((S, n, L)),
        reward=np.zeros((S, n)) if reward is None else np.broadcast_to(reward, (S, n)).astype(float),
        advantage=np.zeros((S, n)) if advantage is None else np.broadcast_to(advantage, (S, n)).astype(float),
        created=np.full((S, n), step, dtype=np.int64),
        group=np.zeros((S, n), dtype=np.int64) if group is None else np.asarray(group),
    )


# --- FIFO: steady-state formulas (experience-replay paper, Sec. 3) ------------------------------------------


def test_fifo_steady_state_staleness_and_use_count():
    S, R, k, B, T = 64, 4, 5, 8, 400
    N = k * R
    buf = FifoBuffer(S, N, 2)
    rng = np.random.default_rng(0)
    stale = []
    for t in range(T):
        buf.add(make_batch(S, R, 2, t, rng=rng), t)  # add, then sample (module convention)
        s = buf.sample(B, t, rng)
        if t >= k:
            stale.append(s.staleness)
    stale = np.concatenate(stale, axis=1)
    assert stale.min() == 0 and stale.max() == k - 1
    assert stale.mean() == pytest.approx((N / R - 1) / 2, abs=0.02)  # = 2.0
    uses = buf.evicted_use_counts()
    assert uses.size == (T - k) * R * S  # items created at steps 0..T-k-1 have left
    steady = uses[k * R * S:]  # drop the items created while the buffer was filling
    assert steady.mean() == pytest.approx(B / R, abs=0.03)  # = 2.0, the replay ratio y = B/R


def _mean_gap_exact(N, R, B):
    """Exact steady-state mean time since last use (uses with a previous use), with replacement.

    An item lives k = N/R steps and is drawn in a step with probability q = 1 - (1 - 1/N)^B,
    independently across steps; a gap of g steps fits k - g times in its life, so
    E = sum_g g (k - g) q^2 (1-q)^(g-1) / sum_g (k - g) q^2 (1-q)^(g-1), g = 1..k-1.
    """
    k = N // R
    q = 1 - (1 - 1 / N) ** B
    g = np.arange(1, k)
    w = (k - g) * (1 - q) ** (g - 1)
    return (g * w).sum() / w.sum(), q


def _measured_gap(S, N, R, B, T, seed):
    k = N // R
    buf = FifoBuffer(S, N, 1)
    rng = np.random.default_rng(seed)
    gaps = []
    for t in range(T):
        buf.add(make_batch(S, R, 1, t, rng=rng), t)
        s = buf.sample(B, t, rng)
        if t >= 2 * k:  # every sampled item was born into a full buffer
            gaps.append(s.time_since_last_use[s.time_since_last_use >= 0])
    return np.concatenate(gaps).mean()


def test_fifo_time_since_last_use_mean_is_about_n_over_b_only_for_large_replay_ratio():
    # replay ratio y = B/R = 8: lifetime k = N/R = 100 is only 8 N/B, short gaps are over-represented
    exact, q = _mean_gap_exact(400, 4, 32)
    assert 1 / q == pytest.approx(400 / 32 + 31 / 64, rel=1e-3)  # discrete steps: N/B + (B-1)/(2B) = 12.98
    assert exact == pytest.approx(11.206, abs=1e-3)  # 14% below 1/q: the finite-lifetime bias
    assert _measured_gap(64, 400, 4, 32, 320, seed=1) == pytest.approx(exact, rel=0.01)
    # y = 80: the mean approaches N/B = 12.5 (exactly: 12.84)
    exact, q = _mean_gap_exact(1000, 1, 80)
    assert exact == pytest.approx(12.842, abs=1e-3)
    measured = _measured_gap(8, 1000, 1, 80, 2400, seed=2)
    assert measured == pytest.approx(exact, rel=0.01)
    assert measured == pytest.approx(1000 / 80, rel=0.04)


def test_fifo_without_replacement_distinct_and_raises_above_filled_size():
    S, N = 3, 6
    buf = FifoBuffer(S, N, 1, replacement=False)
    rng = np.random.default_rng(2)
    buf.add(make_batch(S, 4, 1, 0, ids=np.arange(4)), 0)
    with pytest.raises(ValueError, match="batch_size=5.*capacity=6"):
        buf.sample(5, 0, rng)
    buf.add(make_batch(S, 4, 1, 1, ids=np.arange(4, 8)), 1)  # evicts ids 0, 1
    s = buf.sample(6, 1, rng)
    for row in s.batch.group:
        assert sorted(row.tolist()) == [2, 3, 4, 5, 6, 7]
    with pytest.raises(ValueError, match="batch_size=7.*capacity=6"):
        buf.sample(7, 1, rng)
    np.testing.assert_array_equal(buf.use_count.sum(axis=1), [6, 6, 6])
    np.testing.assert_array_equal(buf.size, [6, 6, 6])


def test_fifo_first_use_and_time_since_last_use_values():
    buf = FifoBuffer(1, 1, 1)
    rng = np.random.default_rng(0)
    buf.add(make_batch(1, 1, 1, 0), 0)
    s0 = buf.sample(2, 0, rng)
    np.testing.assert_array_equal(s0.time_since_last_use, [[-1, -1]])  # both draws see "never used"
    s1 = buf.sample(1, 3, rng)
    np.testing.assert_array_equal(s1.time_since_last_use, [[3]])
    np.testing.assert_array_equal(s1.staleness, [[3]])
    assert buf.use_count[0, 0] == 3 and buf.last_used[0, 0] == 3


# --- vectorised vs naive per-seed loops ------------------------------------------------------------------------


def _naive_fifo(S, N, R, B, T, replacement, seed):
    """Per-seed pure-Python FIFO ring consuming the same uniforms as FifoBuffer."""
    rng = np.random.default_rng(seed)
    slots = [[None] * N for _ in range(S)]
    ptr, out = 0, []
    counts = [dict() for _ in range(S)]
    for t in range(T):
        rng.integers(0, 5, size=(S, R, 1))  # make_batch's draws, in the same order
        rng.random((S, R, 1))
        for i in range(R):
            for s in range(S):
                slots[s][ptr] = t * R + i
            ptr = (ptr + 1) % N
        Bt = min(B, (t + 1) * R, N)  # without replacement B may not exceed the filled size
        u = rng.random((S, Bt) if replacement else (S, N))
        step_out = []
        for s in range(S):
            valid = [i for i in range(N) if slots[s][i] is not None]
            if replacement:
                picks = [valid[min(int(u[s, j] * len(valid)), len(valid) - 1)] for j in range(Bt)]
            else:
                picks = sorted(valid, key=lambda i: u[s, i])[:Bt]
            ids = [slots[s][i] for i in picks]
            for x in ids:
                counts[s][x] = counts[s].get(x, 0) + 1
            step_out.append(ids)
        out.append(step_out)
    return out, counts


@pytest.mark.parametrize("replacement", [True, False])
def test_fifo_matches_naive_loop(replacement):
    S, N, R, B, T = 3, 7, 3, 5, 12
    ref, ref_counts = _naive_fifo(S, N, R, B, T, replacement, seed=5)
    buf = FifoBuffer(S, N, 1, replacement=replacement)
    rng = np.random.default_rng(5)
    for t in range(T):
        buf.add(make_batch(S, R, 1, t, ids=t * R + np.arange(R), rng=rng), t)
        s = buf.sample(min(B, (t + 1) * R, N), t, rng)
        assert s.batch.group.tolist() == ref[t]
    for s_ in range(S):
        live = {int(i): int(c) for i, c, v in zip(buf.store.group[s_], buf.use_count[s_], buf.valid[s_]) if v}
        assert live == {i: ref_counts[s_].get(i, 0) for i in live}


def _naive_per(S, N, R, B, T, alpha, beta, tau, seed):
    """Per-seed pure-Python FreshPER: sequential cumsum and linear search, same uniforms."""
    rng = np.random.default_rng(seed)
    slots = [[None] * N for _ in range(S)]
    ptr, out = 0, []
    for t in range(T):
        rng.integers(0, 5, size=(S, R, 1))
        rng.random((S, R, 1))
        rewards = rng.random((S, R))
        for i in range(R):
            for s in range(S):
                slots[s][ptr] = (t * R + i, abs(rewards[s, i]) + 1e-6, t)
            ptr = (ptr + 1) % N
        u = rng.random((S, B))
        step_ids, step_w = [], []
        for s in range(S):
            w = [0.0 if it is None else math.exp(alpha * math.log(it[1]) - alpha / tau * (t - it[2]))
                 for it in slots[s]]
            cum, acc = [], 0.0
            for x in w:
                acc += x
                cum.append(acc)
            total = cum[-1]
            p_min = min(x for x in w if x > 0) / total
            ids, ws = [], []
            for j in range(B):
                mass = (j + u[s, j]) * total / B  # stratified: segment j
                i = next(i for i in range(N) if cum[i] > mass and w[i] > 0)
                ids.append(slots[s][i][0])
                ws.append((p_min / (w[i] / total)) ** beta)  # Eq. (15), max over the buffer
            step_ids.append(ids)
            step_w.append(ws)
        out.append((step_ids, step_w))
    return out


def test_prioritized_matches_naive_loop():
    S, N, R, B, T = 3, 10, 3, 4, 15
    alpha, beta, tau = 0.6, 0.4, 5.0
    ref = _naive_per(S, N, R, B, T, alpha, beta, tau, seed=7)
    buf = PrioritizedBuffer(S, N, 1, alpha=alpha, beta=beta, tau=tau)
    rng = np.random.default_rng(7)
    for t in range(T):
        batch = make_batch(S, R, 1, t, ids=t * R + np.arange(R), rng=rng)
        batch.reward = rng.random((S, R))
        buf.add(batch, t)
        s = buf.sample(B, t, rng)
        ids, ws = ref[t]
        assert s.batch.group.tolist() == ids
        np.testing.assert_allclose(s.weight, ws, rtol=1e-10)


# --- sum tree ------------------------------------------------------------------------------------------------


def test_sumtree_total_and_find_match_cumsum_searchsorted():
    rng = np.random.default_rng(3)
    S, C = 4, 37  # not a power of two
    tree = SumTree(S, C)
    vals = rng.random((S, C)) * (rng.random((S, C)) > 0.3)  # some zero leaves
    tree.update(np.tile(np.arange(C), (S, 1)), vals)
    np.testing.assert_allclose(tree.total(), vals.sum(axis=1), rtol=1e-12)
    for _ in range(2):
        mass = rng.random((S, 200)) * vals.sum(axis=1, keepdims=True)
        got = tree.find(mass)
        ref = np.stack([np.searchsorted(np.cumsum(vals[s]), mass[s], side="right") for s in range(S)])
        np.testing.assert_array_equal(got, ref)
        assert np.all(np.take_along_axis(vals, got, axis=1) > 0)  # zero leaves are never found
        # update a random subset and check again
        sl = rng.integers(0, C, size=(S, 5))
        new = rng.random((S, 5))
        for s in range(S):
            vals[s, sl[s]] = new[s]  # last write wins, as in the tree (same slot, last value)
        tree.update(sl, np.take_along_axis(vals, sl, axis=1))
        np.testing.assert_allclose(tree.total(), vals.sum(axis=1), rtol=1e-12)
    tree2 = SumTree(S, C)
    tree2.set_all(vals)
    np.testing.assert_allclose(tree2.tree, tree.tree, rtol=1e-12, atol=1e-15)
    # mass at (or rounded past) the total lands on the last positive leaf
    last = np.array([np.flatnonzero(vals[s] > 0).max() for s in range(S)])
    np.testing.assert_array_equal(tree.find(tree.total()[:, None] * (1 + 1e-12))[:, 0], last)


def test_sumtree_single_slot_and_bad_values():
    tree = SumTree(2, 1)
    tree.update(np.array([0]), np.array([[2.0], [3.0]]))
    np.testing.assert_array_equal(tree.total(), [2.0, 3.0])
    np.testing.assert_array_equal(tree.find(np.array([[1.9], [0.0]])), [[0], [0]])
    with pytest.raises(ValueError, match="values"):
        tree.update(np.array([0]), np.array([[-1.0], [1.0]]))


def test_stratified_frequencies_converge_and_have_lower_count_variance():
    rng = np.random.default_rng(4)
    p_base = np.array([1.0, 0.5, 0.25, 0.1, 2.0, 0.05, 0.7, 1.3])
    alpha, C, B, n_batches = 0.6, 8, 16, 4000
    target = p_base**alpha / (p_base**alpha).sum()
    np.testing.assert_allclose(target, fp.sampling_probabilities(p_base, alpha))
    tree = SumTree(n_batches, C)  # one "seed" per batch: all batches in one vectorised call
    tree.set_all(np.tile(p_base**alpha, (n_batches, 1)))
    counts = {}
    for strat in (True, False):
        slots = tree.sample(rng.random((n_batches, B)), stratified=strat)
        counts[strat] = (slots[:, :, None] == np.arange(C)).sum(axis=1)  # (batches, C)
    freq = counts[True].sum(axis=0) / (n_batches * B)
    np.testing.assert_allclose(freq, target, atol=0.004)
    np.testing.assert_allclose(counts[False].sum(axis=0) / (n_batches * B), target, atol=0.01)
    var_strat = counts[True].var(axis=0).mean()
    var_iid = counts[False].var(axis=0).mean()
    # iid counts are multinomial: mean variance B p (1 - p); stratified counts are floor/ceil of B p (or close)
    assert var_iid == pytest.approx((B * target * (1 - target)).mean(), rel=0.05)
    assert var_strat < 0.25 * var_iid


# --- FreshPER --------------------------------------------------------------------------------------------------


def _filled_per(tau, alpha=0.6, decay_then_exponent=True, S=2, N=12, T=6, R=2, seed=0):
    buf = PrioritizedBuffer(S, N, 1, alpha=alpha, tau=tau, decay_then_exponent=decay_then_exponent)
    rng = np.random.default_rng(seed)
    for t in range(T):
        batch = make_batch(S, R, 1, t, rng=rng)
        batch.reward = rng.random((S, R))
        buf.add(batch, t)
    buf.refresh(T)
    return buf


def test_freshper_probabilities_match_theory_and_tau_inf_is_no_decay():
    for dte in (True, False):
        buf = _filled_per(tau=3.0, decay_then_exponent=dte)
        age = 6 - buf.store.created
        ref = fp.sampling_probabilities(buf.p_base, 0.6, decay_then_exponent=dte, age=age, tau=3.0)
        np.testing.assert_allclose(buf.probabilities(), ref, rtol=1e-12)
    per = _filled_per(tau=np.inf)
    np.testing.assert_allclose(per.probabilities(), fp.sampling_probabilities(per.p_base, 0.6), rtol=1e-12)
    # priorities (Eq. 14) through theory.freshper.priorities
    np.testing.assert_allclose(_filled_per(tau=3.0).priorities(6),
                               _filled_per(tau=3.0).p_base * np.exp(-(6 - _filled_per(tau=3.0).store.created) / 3.0))


def test_freshper_effective_time_constant_tau_over_alpha():
    tau, alpha, S = 500.0, 0.6, 1
    for dte, tau_eff in ((True, tau / alpha), (False, tau)):
        buf = PrioritizedBuffer(S, 2, 1, alpha=alpha, tau=tau, decay_then_exponent=dte)
        buf.add(make_batch(S, 1, 1, 0, reward=[[1.0]]), 0)
        buf.add(make_batch(S, 1, 1, 300, reward=[[1.0]]), 300)  # equal base priority, 300 steps younger
        buf.refresh(400)
        p = buf.probabilities()[0]
        assert p[0] / p[1] == pytest.approx(math.exp(-300 / tau_eff), rel=1e-12)
        assert -300 / math.log(p[0] / p[1]) == pytest.approx(tau_eff)  # 833.33 steps for dte=True
    assert fp.effective_time_constant(tau, alpha) == pytest.approx(833.333, abs=1e-3)


def test_freshper_is_weights_max_one_and_values():
    rng = np.random.default_rng(8)
    for norm in ("batch", "buffer"):
        buf = PrioritizedBuffer(4, 16, 1, alpha=0.6, beta=0.4, tau=10.0, is_normalization=norm)
        for t in range(8):
            batch = make_batch(4, 2, 1, t, rng=rng)
            batch.reward = rng.random((4, 2))
            buf.add(batch, t)
        s = buf.sample(8, 8, rng)
        P = buf.probabilities()
        p_s = np.take_along_axis(P, s.index, axis=1)
        if norm == "batch":
            np.testing.assert_allclose(s.weight.max(axis=1), 1.0)
            ref = (p_s.min(axis=1, keepdims=True) / p_s) ** 0.4
        else:
            assert np.all(s.weight <= 1.0 + 1e-12)
            np.testing.assert_allclose(fp.is_weights(P, 0.4).max(axis=1), 1.0)
            ref = (np.where(P > 0, P, np.inf).min(axis=1, keepdims=True) / p_s) ** 0.4
        np.testing.assert_allclose(s.weight, ref, rtol=1e-12)
    buf0 = PrioritizedBuffer(1, 4, 1, beta=0.0)
    buf0.add(make_batch(1, 2, 1, 0, reward=[[1.0, 0.0]]), 0)
    np.testing.assert_array_equal(buf0.sample(3, 0, rng).weight, 1.0)


def test_freshper_binary_rewards_replay_almost_only_successes():
    buf = PrioritizedBuffer(1, 2, 1, alpha=0.6, tau=np.inf)
    buf.add(make_batch(1, 2, 1, 0, reward=[[1.0, 0.0]]), 0)
    buf.refresh(0)
    p = buf.probabilities()[0]
    assert p[1] / p[0] == pytest.approx((1e-6 / (1 + 1e-6)) ** 0.6)  # ~2.5e-4


def test_freshper_refresh_false_keeps_insertion_priorities():
    buf = PrioritizedBuffer(1, 2, 1, alpha=1.0, tau=1.0, refresh=False)
    buf.add(make_batch(1, 1, 1, 0, reward=[[1.0]]), 0)
    buf.add(make_batch(1, 1, 1, 5, reward=[[1.0]]), 5)
    rng = np.random.default_rng(0)
    buf.sample(1, 5, rng)  # no automatic refresh: both inserted at age 0
    np.testing.assert_allclose(buf.probabilities(), [[0.5, 0.5]])
    buf.refresh(5)
    np.testing.assert_allclose(buf.probabilities()[0, 0] / buf.probabilities()[0, 1], math.exp(-5))


# --- positive bias ---------------------------------------------------------------------------------------------


def test_positive_bias_hand_made_kept_set():
    S, N, delta = 2, 10, 0.3  # fresh window 7, positive slots 3
    buf = PositiveBiasBuffer(S, N, 1, delta=delta)
    assert (buf.n_fresh, buf.n_pos) == (7, 3)
    correct = [{1, 4, 5, 9, 11, 12, 15}, {2}]
    for t in range(20):
        r = np.array([[1.0 if t in correct[s] else 0.1] for s in range(S)])  # 0.1 = well-formed but wrong
        buf.add(make_batch(S, 1, 1, t, reward=r), t)
    kept = [set(buf.store.created[s][buf.valid[s]].tolist()) for s in range(S)]
    assert kept[0] == {9, 11, 12} | set(range(13, 20))
    assert kept[1] == {2} | set(range(13, 20))
    np.testing.assert_array_equal(buf.size, [10, 8])


def test_positive_bias_matches_rule_with_several_rollouts_per_step_and_keeps_use_counts():
    S, N, delta, R, T = 4, 12, 0.25, 5, 15
    buf = PositiveBiasBuffer(S, N, 1, delta=delta)
    rng = np.random.default_rng(9)
    rewards = (rng.random((T, S, R)) < 0.3).astype(float)
    ids = np.arange(T * R).reshape(T, R)
    uses = {}
    for t in range(T):
        buf.add(make_batch(S, R, 1, t, ids=ids[t], reward=rewards[t], rng=rng), t)
        s = buf.sample(3, t, rng)
        for si in range(S):
            for g in s.batch.group[si]:
                uses[(si, int(g))] = uses.get((si, int(g)), 0) + 1
    n_fresh, n_pos = buf.n_fresh, buf.n_pos
    assert (n_fresh, n_pos) == (9, 3)
    for si in range(S):
        order = ids.ravel()  # creation order
        flat_r = rewards[:, si, :].ravel()
        fresh = set(order[-n_fresh:].tolist())
        older_correct = [int(i) for i, r in zip(order[:-n_fresh], flat_r[:-n_fresh]) if r == 1.0]
        expect = fresh | set(older_correct[-n_pos:])
        live = buf.store.group[si][buf.valid[si]]
        assert set(live.tolist()) == expect
        for g, c in zip(buf.store.group[si][buf.valid[si]], buf.use_count[si][buf.valid[si]]):
            assert c == uses.get((si, int(g)), 0)  # use counts travel with a moved rollout
    total_uses = sum(uses.values())
    assert total_uses == buf.use_count[buf.valid].sum() + buf.evicted_use_counts().sum()


def test_positive_bias_delta_zero_is_fifo():
    buf = PositiveBiasBuffer(1, 4, 1, delta=0.0)
    for t in range(6):
        buf.add(make_batch(1, 1, 1, t, reward=[[1.0]]), t)
    assert set(buf.store.created[0][buf.valid[0]].tolist()) == {2, 3, 4, 5}


# --- RLOO group replay -------------------------------------------------------------------------------------------


def _groups(S, G, K, step, first_id, rng):
    ids = np.repeat(first_id + np.arange(G), K)
    return make_batch(S, G * K, 2, step, ids=ids, prompt=np.repeat(np.arange(G) % 7, K), rng=rng)


def test_group_replay_counts_match_theory_and_reuse_is_rho():
    S, K, B, rho, L, T = 3, 4, 8, 1.0, 2, 150
    gr.check_group_replay(rho, L, np.inf, B, K)
    buf = GroupReplayBuffer(S, L, K, 2, groups_per_step=B)
    rng = np.random.default_rng(10)
    next_id, fresh_total, ages = 0, 0, []
    for t in range(T):
        n_fresh, n_replay = buf.split(B, rho, t)  # sample fresh, sample replay
        if t == 0:
            assert (n_fresh, n_replay) == (B, 0)  # first step all fresh
        else:
            assert (n_fresh, n_replay) == (gr.fresh_groups_per_step(B, rho), gr.replay_groups_per_step(B, rho))
            assert (n_fresh, n_replay) == (4, 4)
        s = buf.sample_groups(n_replay, t, rng)
        assert s.index.shape == (S, n_replay) and s.batch.size == n_replay * K
        assert np.all((s.staleness >= 1) & (s.staleness <= L))  # eligible ages 1..L only
        for row in s.index:
            assert len(set(row.tolist())) == len(row)  # no replacement within a step
        g = s.batch.group.reshape(S, n_replay, K)
        assert np.all(g == g[:, :, :1])  # group ids intact
        np.testing.assert_array_equal(s.batch.created.reshape(S, n_replay, K)[:, :, 0], t - s.staleness)
        ages.append(s.staleness.ravel())
        buf.add(_groups(S, n_fresh, K, t, next_id, rng), t)  # update, add fresh, evict older than L
        next_id += n_fresh
        fresh_total += n_fresh
        assert np.all(t - buf.group_created[buf.valid] <= L - 1)  # between steps: ages 0..L-1
    assert K * fresh_total == gr.fresh_verifier_evaluations(K, B, T, rho)
    ages = np.concatenate(ages)
    assert ages.mean() == pytest.approx((1 + L) / 2, abs=0.05)  # reused ages uniform on 1..L
    uses = buf.evicted_use_counts()[(B + 4) * S:]  # drop the step-0 and step-1 cohorts
    assert uses.mean() == pytest.approx(rho, abs=0.03)  # expected reuse per group ~ rho


def test_group_replay_shortfall_no_readd_and_eviction():
    S, K, L = 2, 2, 1
    buf = GroupReplayBuffer(S, L, K, 2, groups_per_step=3)
    rng = np.random.default_rng(11)
    buf.add(_groups(S, 2, K, 0, 0, rng), 0)
    np.testing.assert_array_equal(buf.available(0), [0, 0])  # age 0 is not eligible
    np.testing.assert_array_equal(buf.available(1), [2, 2])
    s = buf.sample_groups(5, 1, rng)  # shortfall: only 2 eligible
    assert s.index.shape == (S, 2)
    assert buf.split(6, 2.0, 1) == (4, 2)  # want 4 replay groups, 2 available -> 2 extra fresh
    with pytest.raises(ValueError, match="reused groups are not re-added"):
        buf.add(s.batch, 1)
    buf.add(_groups(S, 3, K, 1, 10, rng), 1)  # the step-0 groups (age 1 = L) can never be replayed again
    assert set(buf.group_created[0][buf.valid[0]].tolist()) == {1}
    buf.add(_groups(S, 1, K, 2, 20, rng), 2)
    assert set(buf.group_created[0][buf.valid[0]].tolist()) == {2}
    np.testing.assert_array_equal(np.sort(buf.evicted_use_counts()), [0] * 6 + [1] * 4)
    np.testing.assert_array_equal(buf.available(3), [1, 1])  # only the step-2 group has age 1 <= L


def test_group_replay_default_capacity_is_tight():
    S, K, L, Bf = 1, 2, 3, 4
    buf = GroupReplayBuffer(S, L, K, 2, groups_per_step=Bf)
    assert buf.capacity == (L + 1) * Bf
    rng = np.random.default_rng(13)
    for t in range(12):
        if t > 0:
            s = buf.sample_groups(Bf, t, rng)
            assert s.index.shape[1] == min(Bf, Bf * min(t, L))
            assert np.all((s.staleness >= 1) & (s.staleness <= L))
        buf.add(_groups(S, Bf, K, t, 100 * t, rng), t)
        assert buf.size[0] == Bf * min(t + 1, L)  # L cohorts between steps
    # no capacity given: sized at the first add, grown when a later add needs more, order kept
    auto = GroupReplayBuffer(S, L, K, 2)
    auto.add(_groups(S, 2, K, 0, 0, rng), 0)
    assert auto.capacity == (L + 1) * 2
    for t in range(1, 4):
        auto.sample_groups(1, t, rng)
        auto.add(_groups(S, 3, K, t, 10 * t, rng), t)
    assert auto.size[0] == L * 3 and auto.capacity >= (L + 1) * 3
    assert sorted(auto.group_created[0][auto.valid[0]].tolist()) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    s = auto.sample_groups(10, 4, rng)
    assert sorted(s.batch.group[0, ::K].tolist()) == [10, 11, 12, 20, 21, 22, 30, 31, 32]
    assert auto.use_count[auto.valid].sum() + auto.evicted_use_counts().sum() == 3 + 9
    buf0 = GroupReplayBuffer(1, 0, K, 2, groups_per_step=Bf)  # L = 0: fresh only
    buf0.add(_groups(1, Bf, K, 0, 0, rng), 0)
    assert buf0.size[0] == 0 and buf0.available(1)[0] == 0


# --- ExGRPO ---------------------------------------------------------------------------------------------------


def _ex_batch(S, prompts, rewards, K, L=3, tokens=None, step=0, rng=None):
    """Groups of K responses for ``prompts`` (G,) with ``rewards`` (S, G, K)."""
    G = len(prompts)
    rng = rng if rng is not None else np.random.default_rng(0)
    if tokens is None:
        tokens = rng.integers(0, 50, size=(S, G * K, L))
    return make_batch(S, G * K, L, step, prompt=np.repeat(prompts, K), reward=np.asarray(rewards).reshape(S, G * K),
                      ids=np.repeat(np.arange(G), K), tokens=tokens, rng=rng)


def test_exgrpo_retirement_dedupe_and_records():
    S, K, P, L = 1, 4, 5, 3
    buf = ExGRPOBuffer(S, P, K, L, max_trajectories=4)
    buf.observe_pass_rate(np.array([0.5]))
    tok = np.zeros((S, 4 * K, L), dtype=np.int64)
    tok[0, 8:12] = [[1, 1, 1], [1, 1, 1], [2, 2, 2], [3, 3, 3]]  # question 3: two identical correct
    tok[0, 4:8] = [[4, 0, 0], [5, 0, 0], [6, 0, 0], [7, 0, 0]]
    rewards = np.array([[[1, 1, 1, 1],  # q0: all correct -> retired
                         [1, 0.1, 1, 0],  # q1: k = 2
                         [1, 1, 1, 0],  # q3: k = 3, responses 0 and 1 are duplicates
                         [0, 0, 0, 0.1]]])  # q2: all failed, never retired
    buf.add(_ex_batch(S, [0, 1, 3, 2], rewards, K, L, tokens=tok), 0)
    assert buf.retired[0].tolist() == [True, False, False, False, False]
    assert buf.success_count[0].tolist() == [-1, 2, 0, 3, -1]
    assert buf.buckets()[0].tolist() == [0, 2, 0, 3, 0]
    assert buf.bucket_sizes()[0].tolist() == [0, 1, 1]
    M = buf.max_trajectories
    stored_q3 = buf.store.tokens[0, 3 * M:4 * M][buf.valid[0, 3 * M:4 * M]]
    assert sorted(map(tuple, stored_q3.tolist())) == [(1, 1, 1), (2, 2, 2)]  # duplicate skipped
    stored_q1 = buf.store.tokens[0, 1 * M:2 * M][buf.valid[0, 1 * M:2 * M]]
    assert sorted(map(tuple, stored_q1.tolist())) == [(4, 0, 0), (6, 0, 0)]
    # the same trajectories again are not stored twice; q3 now all correct -> retired and removed
    rng = np.random.default_rng(0)
    buf.sample(1, 1, rng, entropy_fn=lambda p, t, m: t[..., 0].astype(float))
    tok2 = np.zeros((S, 2 * K, L), dtype=np.int64)
    tok2[0, :K] = [[4, 0, 0], [4, 0, 0], [9, 9, 9], [6, 0, 0]]
    buf.add(_ex_batch(S, [1, 3], np.array([[[1, 1, 0, 1], [1, 1, 1, 1]]]), K, L, tokens=tok2, step=1), 1)
    assert buf.retired[0, 3] and buf.success_count[0, 3] == -1 and not buf.valid[0, 3 * M:4 * M].any()
    assert buf.success_count[0, 1] == 3
    stored_q1 = buf.store.tokens[0, 1 * M:2 * M][buf.valid[0, 1 * M:2 * M]]
    assert sorted(map(tuple, stored_q1.tolist())) == [(4, 0, 0), (6, 0, 0)]
    assert buf.evicted_use_counts().size == 2  # q3's two trajectories left the buffer
    # a retired question stays retired
    buf.add(_ex_batch(S, [0], np.array([[[1, 0, 0, 0]]]), K, L, step=2), 2)
    assert buf.retired[0, 0] and buf.success_count[0, 0] == -1
    assert buf.n_experience().tolist() == [1]


def test_exgrpo_trajectory_selection_lowest_highest_random():
    S, K, P, L = 2, 4, 3, 2
    tok = np.zeros((S, K, L), dtype=np.int64)
    tok[:, :, 0] = [[5, 2, 9, 7], [3, 8, 1, 4]]  # fake entropy = first token
    rewards = np.array([[[1, 1, 1, 0]], [[1, 0, 1, 1]]])
    picks = {}
    for sel in ("lowest", "highest", "random"):
        buf = ExGRPOBuffer(S, P, K, L, selection=sel, delayed_start=False)
        buf.add(_ex_batch(S, [2], rewards, K, L, tokens=tok), 0)
        calls = []

        def entropy_fn(prompts, tokens, mask, calls=calls):
            calls.append(prompts.shape)
            assert np.all(prompts == 2)
            return tokens[..., 0].astype(float)

        s = buf.sample(1, 3, np.random.default_rng(0), entropy_fn=entropy_fn)
        picks[sel] = s.batch.tokens[:, 0, 0].tolist()
        assert s.valid.all() and s.batch.prompt.tolist() == [[2], [2]]
        np.testing.assert_array_equal(s.staleness, [[3], [3]])
        assert (len(calls) == 1) == (sel != "random")
    assert picks["lowest"] == [2, 1]  # correct ones: seed 0 {5, 2, 9}, seed 1 {3, 1, 4}
    assert picks["highest"] == [9, 4]
    assert picks["random"][0] in (5, 2, 9) and picks["random"][1] in (3, 1, 4)
    with pytest.raises(ValueError, match="entropy_fn"):
        ExGRPOBuffer(1, 2, 4, 2).sample(1, 0, np.random.default_rng(0))


def test_exgrpo_bucket_frequencies_match_bucket_probabilities():
    S, K, P, L = 64, 4, 12, 1
    buf = ExGRPOBuffer(S, P, K, L, selection="random", delayed_start=False)
    # buckets: k = 1 -> 2 questions, k = 2 -> 4 questions, k = 3 -> 1 question; k = 0 and retired ones excluded
    ks = [1, 1, 2, 2, 2, 2, 3, 0, 4, 4, 0, 0]
    rewards = np.array([[1.0] * k + [0.0] * (K - k) for k in ks])
    buf.add(_ex_batch(S, np.arange(P), np.broadcast_to(rewards, (S, P, K)), K, L), 0)
    assert buf.bucket_sizes()[0].tolist() == [2, 4, 1]
    p = ex.bucket_probabilities(K, units="success-count")
    np.testing.assert_allclose(buf.bucket_probs(), np.broadcast_to(p, (S, 3)))
    np.testing.assert_allclose(p, [0.274068619, 0.451862762, 0.274068619], rtol=1e-6)
    rng = np.random.default_rng(12)
    counts = np.zeros(P)
    n_calls = 100
    for _ in range(n_calls):
        s = buf.sample(1, 1, rng)
        counts += np.bincount(s.batch.prompt.ravel(), minlength=P)
    freq = counts / (S * n_calls)
    bucket_freq = [freq[:2].sum(), freq[2:6].sum(), freq[6]]
    np.testing.assert_allclose(bucket_freq, p, atol=0.015)
    np.testing.assert_allclose(freq, buf.question_probabilities()[0], atol=0.012)  # p_k / |U_k|
    assert freq[7:].sum() == 0
    # a batch larger than a bucket: counts are clipped and redistributed, questions distinct
    s = buf.sample(7, 2, rng)
    for row in s.batch.prompt:
        assert sorted(row.tolist()) == [0, 1, 2, 3, 4, 5, 6]
    s = buf.sample(9, 3, rng)
    assert s.valid.sum(axis=1).tolist() == [7] * S and np.all(s.batch.prompt[~s.valid] == 0)
    np.testing.assert_array_equal(buf.split(10)[0], np.minimum(5, 7))
    np.testing.assert_array_equal(buf.split(10), ex.batch_split(10, 0.5, np.full(S, 7)))


def test_exgrpo_accuracy_units_are_nearly_uniform():
    buf = ExGRPOBuffer(1, 8, 8, 1, units="accuracy", selection="random", delayed_start=False)
    rewards = np.array([[1.0] * k + [0.0] * (8 - k) for k in range(1, 8)] + [[0.0] * 8])
    buf.add(_ex_batch(1, np.arange(8), rewards[None], 8, 1), 0)
    np.testing.assert_allclose(buf.bucket_probs()[0], [.137, .143, .146, .147, .146, .143, .137], atol=6e-4)


def test_exgrpo_delayed_start_switch_is_one_way():
    S, K = 3, 4
    buf = ExGRPOBuffer(S, 2, K, 1, selection="random")
    rewards = np.broadcast_to(np.array([[1.0, 0, 0, 0]]), (S, 1, K))
    buf.add(_ex_batch(S, [0], rewards, K, 1), 0)
    assert buf.size.tolist() == [0, 0, 0]  # not collecting yet
    np.testing.assert_array_equal(buf.split(8), ([0, 0, 0], [8, 8, 8]))
    buf.observe_pass_rate(np.array([0.2, 0.35, 0.36]))  # strictly above 0.35
    assert buf.active.tolist() == [False, False, True]
    buf.observe_pass_rate(np.array([0.1, 0.5, 0.0]))
    assert buf.active.tolist() == [False, True, True]  # one way
    buf.add(_ex_batch(S, [0], rewards, K, 1, step=1), 1)
    assert buf.size.tolist() == [0, 1, 1]
    np.testing.assert_array_equal(buf.split(8), ([0, 1, 1], [8, 7, 7]))


# --- stale-k ----------------------------------------------------------------------------------------------


def test_stale_k_pop_returns_batch_from_k_pushes_earlier():
    k = 3
    q = StaleKQueue(2, k)
    for t in range(10):
        q.push(make_batch(2, 1, 1, t), t)
        b = q.pop(t)
        assert b.created[0, 0] == (0 if t < k else t - k)  # first k updates: the oldest (base model)
        assert q.last_step == b.created[0, 0]
        assert len(q) <= k + 1
    q0 = StaleKQueue(1, 0)
    q0.push(make_batch(1, 1, 1, 5), 5)
    assert q0.pop(5).created[0, 0] == 5
    # prefilled with k base-model batches (reference code): every pop exactly k stale
    qp = StaleKQueue(1, k)
    for t in range(-k, 0):
        qp.push(make_batch(1, 1, 1, t), t)
    for t in range(6):
        qp.push(make_batch(1, 1, 1, t), t)
        assert qp.pop(t).created[0, 0] == t - k
    with pytest.raises(ValueError, match="empty"):
        StaleKQueue(1, 2).pop(0)


def test_stale_k_queue_holds_plain_arrays_that_save_and_restore_without_pickle(tmp_path):
    # k = 1: after pushes at steps 0, 1, 2 and a pop at 2, the queue holds steps 1 and 2; their tokens (ids 10, 11 and
    # 20, 21) are what a trainer's rows must keep; the state is arrays and ints, restored into a fresh queue whose next
    # pops are the saved queue's
    from replay_theory.core.state import load_object_state, load_state, object_state, save_state

    q = StaleKQueue(1, 1)
    for t in range(3):
        q.push(make_batch(1, 2, 1, t, tokens=np.array([[[10 * t], [10 * t + 1]]])), t)
    assert q.pop(2).created.tolist() == [[1, 1]]
    assert q.held_tokens(0).tolist() == [10, 11, 20, 21]
    save_state(tmp_path / "queue", *object_state(q))
    fresh = StaleKQueue(1, 1)
    load_object_state(fresh, *load_state(tmp_path / "queue"))
    assert fresh.held_tokens(0).tolist() == [10, 11, 20, 21] and fresh.last_step == 1
    for queue in (q, fresh):
        queue.push(make_batch(1, 2, 1, 3, tokens=np.array([[[30], [31]]])), 3)
    a, b = q.pop(3), fresh.pop(3)
    assert a.tokens.tolist() == b.tokens.tolist() == [[[20], [21]]] and b.created.tolist() == [[2, 2]]
    assert StaleKQueue(1, 1).held_tokens(0).tolist() == []


# --- memory and dtypes -----------------------------------------------------------------------------------------


def test_fifo_memory_20k_rollouts_64_seeds_under_2gib():
    buf = FifoBuffer(64, 20_000, 32, token_dtype=np.int8, logp_dtype=np.float64)
    n = 64 * 20_000
    expected = n * 32 * (1 + 1 + 8) + n * 5 * 8 + n * (8 + 8 + 1)  # tokens, mask, logp; 5 per-rollout; bookkeeping
    assert buf.nbytes == expected == 482_560_000
    assert buf.nbytes < 2 * 2**30
    buf32 = FifoBuffer(64, 20_000, 32, token_dtype=np.int8, logp_dtype=np.float32)
    assert buf32.nbytes == expected - n * 32 * 4


def test_token_dtype_range_and_logp_precision():
    buf = FifoBuffer(1, 4, 2, token_dtype=np.int8, logp_dtype=np.float32)
    with pytest.raises(ValueError, match="token_dtype"):
        buf.add(make_batch(1, 1, 2, 0, tokens=np.full((1, 1, 2), 200)), 0)
    batch = make_batch(1, 2, 2, 0, tokens=np.array([[[1, -3], [127, 0]]]))
    buf.add(batch, 0)
    s = buf.sample(2, 0, np.random.default_rng(0))
    assert s.batch.tokens.dtype == np.int64 and s.batch.logp_behav.dtype == np.float64
    idx = s.index[0]
    np.testing.assert_array_equal(s.batch.tokens[0], batch.tokens[0, idx])
    np.testing.assert_allclose(s.batch.logp_behav[0], batch.logp_behav[0, idx], rtol=2**-24)


# --- registry and bad designs ---------------------------------------------------------------------------------


def test_design_registry_builds_every_buffer():
    from replay_theory.core.designs import BUFFER_DESIGNS, BufferSpec, DesignConfig, make_design_buffer

    expected = {"on-policy": type(None), "fifo": FifoBuffer, "positive-bias": PositiveBiasBuffer,
                "prioritized": PrioritizedBuffer, "group-replay": GroupReplayBuffer, "exgrpo": ExGRPOBuffer,
                "stale-k": StaleKQueue, "epochs": EpochSchedule, "selective": SelectiveFifoBuffer,
                "dynamic": type(None)}  # dynamic sampling keeps nothing: its batch step regenerates
    assert set(BUFFER_DESIGNS) == set(expected)
    for name, cls in expected.items():
        buffer = make_design_buffer(DesignConfig(buffer=name, exgrpo_rho=0.25, stale_k=3),
                                    BufferSpec(num_seeds=2, seq_len=1, num_prompts=4))
        assert type(buffer) is cls
    ex = make_design_buffer(DesignConfig(buffer="exgrpo", exgrpo_rho=0.25), BufferSpec(1, 1, 4))
    assert ex.rho == 0.25 and ex.num_prompts == 4
    assert make_design_buffer(DesignConfig(buffer="stale-k", stale_k=3), BufferSpec(1, 1)).k == 3


CLASSES = {"fifo": FifoBuffer, "positive_bias": PositiveBiasBuffer, "prioritized": PrioritizedBuffer,
           "group_replay": GroupReplayBuffer, "exgrpo": ExGRPOBuffer, "stale_k": StaleKQueue, "epochs": EpochSchedule,
           "selective": SelectiveFifoBuffer}


@pytest.mark.parametrize(
    "name, kwargs, param",
    [
        ("fifo", dict(num_seeds=1, capacity=0, seq_len=1), "capacity"),
        ("positive_bias", dict(num_seeds=1, capacity=8, seq_len=1, delta=1.0), "delta"),
        ("positive_bias", dict(num_seeds=1, capacity=8, seq_len=1, delta=-0.1), "delta"),
        ("prioritized", dict(num_seeds=1, capacity=8, seq_len=1, tau=-1.0), "tau"),
        ("prioritized", dict(num_seeds=1, capacity=8, seq_len=1, tau=float("nan")), "tau"),
        ("prioritized", dict(num_seeds=1, capacity=8, seq_len=1, alpha=float("nan")), "alpha"),
        ("prioritized", dict(num_seeds=1, capacity=8, seq_len=1, alpha=-0.5), "alpha"),
        ("prioritized", dict(num_seeds=1, capacity=8, seq_len=1, beta=2.0), "beta"),
        ("prioritized", dict(num_seeds=1, capacity=8, seq_len=1, eps=0.0), "eps"),
        ("prioritized", dict(num_seeds=1, capacity=8, seq_len=1, base="td"), "base"),
        ("group_replay", dict(num_seeds=1, max_age=2, group_size=4, seq_len=1, capacity_groups=0), "capacity_groups"),
        ("exgrpo", dict(num_seeds=1, num_prompts=4, group_size=8, seq_len=1, rho=1.0), "rho"),
        ("exgrpo", dict(num_seeds=1, num_prompts=4, group_size=8, seq_len=1, units="percent"), "units"),
        ("exgrpo", dict(num_seeds=1, num_prompts=4, group_size=8, seq_len=1, selection="best"), "selection"),
        ("stale_k", dict(num_seeds=1, k=-1), "k"),
        ("epochs", dict(num_seeds=1, epochs=0, mini_batches=1), "epochs"),
        ("epochs", dict(num_seeds=1, epochs=2, mini_batches=0), "mini_batches"),
        ("selective", dict(num_seeds=1, capacity=0, seq_len=1), "capacity"),
    ],
)
def test_bad_buffer_arguments_raise_value_error_naming_the_parameter(name, kwargs, param):
    with pytest.raises(ValueError, match=param) as info:
        CLASSES[name](**kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(capacity=3, rollouts_per_step=8, group_size=4), "capacity must be >= rollouts_per_step = 8"),
        (dict(capacity=8, rollouts_per_step=4, group_size=4, replacement=False, batch_size=8),
         "batch_size must be <= rollouts_per_step = 4"),
        (dict(buffer="group-replay", loss="rloo", max_age=1, replay_ratio_groups=2.0), "rho\\) must be <= max_age"),
        (dict(buffer="group-replay", loss="rloo", group_size=4, batch_size=6), "batch_size must be a multiple"),
        (dict(buffer="group-replay", loss="grpo"), "buffer group-replay trains with loss rloo"),
        (dict(buffer="fifo", loss="rloo"), "loss rloo needs buffer group-replay or on-policy"),
        (dict(buffer="exgrpo", loss="exgrpo", exgrpo_units="percent"), "exgrpo_units must be one of"),
        (dict(stale_k=-1), "stale_k must be an integer >= 0"),
        (dict(delta=1.0), "delta must be in \\[0, 1\\)"),
        (dict(buffer="lifo"), "buffer must be one of on-policy, fifo"),
    ],
)
def test_bad_designs_raise_one_line_naming_the_field(changes, message):
    from replay_theory.core.designs import DesignConfig

    with pytest.raises(ValueError, match=message) as info:
        DesignConfig(**changes).validated_design()
    assert "\n" not in str(info.value)


def test_sampling_an_empty_buffer_raises():
    with pytest.raises(ValueError, match="empty"):
        FifoBuffer(1, 4, 1).sample(1, 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="empty"):
        PrioritizedBuffer(1, 4, 1).sample(1, 0, np.random.default_rng(0))

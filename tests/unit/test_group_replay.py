"""Tests for replay_theory.theory.group_replay (Replay-RLOO on Countdown)."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest

from replay_theory.theory import group_replay as gr

# Table 6 of the paper (B = 128, K = 8, T = 100): rho, fresh/step, replay/step, printed fresh evals
TABLE_6 = [
    (0.0, 128, 0, "102.4K"),
    (0.5, 85, 43, "68.3K"),
    (1.0, 64, 64, "51.7K"),
    (1.5, 51, 77, "41.4K"),
    (2.0, 43, 85, "35.1K"),
]


# --- budget table -------------------------------------------------------------


@pytest.mark.parametrize("rho, fresh, replay, printed", TABLE_6)
@pytest.mark.parametrize("rounding", ["half_up", "half_even"])
def test_table6_groups_per_step(rho, fresh, replay, printed, rounding):
    assert gr.fresh_groups_per_step(128, rho, rounding) == fresh
    assert gr.replay_groups_per_step(128, rho, rounding) == replay


@pytest.mark.parametrize("rho, fresh, replay, printed", TABLE_6)
def test_table6_fresh_verifier_evaluations_to_printed_precision(rho, fresh, replay, printed):
    evals = gr.fresh_verifier_evaluations(K=8, B=128, T=100, rho=rho)
    assert evals == 8 * (128 + 99 * fresh)
    assert f"{evals / 1000:.1f}K" == printed


def test_table6_exact_counts_vectorised():
    rhos = np.array([row[0] for row in TABLE_6])
    np.testing.assert_array_equal(
        gr.fresh_verifier_evaluations(8, 128, 100, rhos), [102_400, 68_344, 51_712, 41_416, 35_080]
    )


def test_fresh_only_budget_is_T_B_K():
    assert gr.fresh_verifier_evaluations(8, 128, 100, 0.0) == 100 * 128 * 8
    assert gr.fresh_verifier_evaluations(8, 128, 1, 2.0) == 128 * 8  # first step is all fresh


def test_rounding_conventions_differ_only_on_ties():
    # 5 / 2 = 2.5 is an exact tie: half-up -> 3, Python's round -> 2
    assert gr.fresh_groups_per_step(5, 1.0, "half_up") == 3
    assert gr.fresh_groups_per_step(5, 1.0, "half_even") == round(5 / 2) == 2
    B = np.arange(1, 300)
    for rho in (0.5, 1.5, 2.0, 3.0):
        x = B / (1 + rho)
        no_tie = np.abs(x - np.floor(x) - 0.5) > 1e-9
        up = gr.fresh_groups_per_step(B, rho, "half_up")
        even = gr.fresh_groups_per_step(B, rho, "half_even")
        np.testing.assert_array_equal(up[no_tie], even[no_tie])
        np.testing.assert_array_equal(even, [round(b / (1 + rho)) for b in B])
    with pytest.raises(ValueError, match="rounding must be"):
        gr.fresh_groups_per_step(128, 1.0, "nearest")


# --- feasibility, pool, shortfall ----------------------------------------------


def test_is_feasible_vectorised():
    np.testing.assert_array_equal(gr.is_feasible([0.5, 1.0, 2.0, 3.0], 2), [True, True, True, False])
    assert gr.is_feasible(0.0, 0)


def test_check_group_replay_messages():
    gr.check_group_replay(rho=2, L=2, c=1, B=128, K=8)  # paper's (2, 2, 1) cell is fine
    gr.check_group_replay(rho=1, L=1, c=1000, B=128, K=8)  # stress probe
    with pytest.raises(ValueError, match=r"rho must be <= L \(max age\), got rho=3, L=2"):
        gr.check_group_replay(rho=3, L=2, c=1, B=128, K=8)
    with pytest.raises(ValueError, match="c must be > 0"):
        gr.check_group_replay(rho=1, L=2, c=0, B=128, K=8)
    with pytest.raises(ValueError, match="K must be an integer >= 2"):
        gr.check_group_replay(rho=1, L=2, c=1, B=128, K=1)
    with pytest.raises(ValueError, match="B must be an integer >= 1"):
        gr.check_group_replay(rho=1, L=2, c=1, B=12.5, K=8)
    with pytest.raises(ValueError, match="L must be an integer >= 0"):
        gr.check_group_replay(rho=1, L=-1, c=1, B=128, K=8)
    with pytest.raises(ValueError, match="rho must be"):
        gr.check_group_replay(rho=-0.5, L=2, c=1, B=128, K=8)
    with pytest.raises(ValueError, match="at least one fresh group"):
        gr.check_group_replay(rho=4, L=4, c=1, B=1, K=8)


def test_pool_covers_demand_for_every_paper_cell():
    for rho, fresh, replay, _ in TABLE_6:
        for L in (1, 2, 3):
            if rho <= L:
                assert gr.expected_pool_size(L, fresh) >= replay
                assert gr.replay_shortfall(128, rho, L) == 0
    assert gr.expected_pool_size(2, 43) == 86


def test_replay_shortfall_from_rounding_even_when_feasible():
    assert gr.is_feasible(2.0, 2)
    assert gr.fresh_groups_per_step(100, 2.0) == 33
    assert gr.replay_shortfall(100, 2.0, 2) == 1  # 67 demanded, 66 eligible
    assert gr.replay_shortfall(128, 3.0, 2) == 128 - 32 - 64  # infeasible rho


# --- leave-one-out advantage (Eq. 1) ------------------------------------------


def test_loo_advantage_hand_case():
    np.testing.assert_allclose(gr.leave_one_out_advantage([1, 0, 0, 1]), [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    # Countdown rewards 1 / 0.1 / 0: A_1 = 1 - (0.1 + 0)/2
    np.testing.assert_allclose(gr.leave_one_out_advantage([1.0, 0.1, 0.0]), [0.95, -0.4, -0.55])


def test_loo_advantage_is_scaled_centering_and_sums_to_zero():
    rng = np.random.default_rng(3)
    r = rng.choice([0.0, 0.1, 1.0], size=(5, 16, 8))  # (seeds, prompts, K)
    A = gr.leave_one_out_advantage(r)
    K = r.shape[-1]
    # A_i = K/(K-1) (r_i - mean r), so sum_i A_i = K/(K-1) sum_i (r_i - mean r) = 0
    np.testing.assert_allclose(A, K / (K - 1) * (r - r.mean(axis=-1, keepdims=True)), atol=1e-12)
    np.testing.assert_allclose(A.sum(axis=-1), 0.0, atol=1e-12)
    naive = np.empty_like(r)
    for i in range(K):
        others = np.delete(r, i, axis=-1)
        naive[..., i] = r[..., i] - others.mean(axis=-1)
    np.testing.assert_allclose(A, naive, atol=1e-12)


def test_loo_advantage_needs_two_responses():
    with pytest.raises(ValueError, match="K >= 2"):
        gr.leave_one_out_advantage([1.0])


# --- clipped weights (Eq. 2) and clipping bias --------------------------------


def test_clipped_weight_huge_log_ratios_do_not_overflow():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = gr.clipped_sequence_weight([1e4, -1e4, 0.0, math.log(2.0)], 3.0)
    np.testing.assert_allclose(w, [3.0, 0.0, 1.0, 2.0])
    assert np.all(np.isfinite(w))


def test_clipped_weight_fresh_mask_and_per_row_clip():
    lr = np.array([[2.0, -1.0], [2.0, -1.0]])
    w = gr.clipped_sequence_weight(lr, np.array([[1.0], [10.0]]), fresh_mask=[True, False])
    np.testing.assert_allclose(w, [[1.0, math.exp(-1)], [1.0, math.exp(-1)]])
    w = gr.clipped_sequence_weight(lr, np.array([[1.0], [10.0]]))
    np.testing.assert_allclose(w, [[1.0, math.exp(-1)], [math.exp(2), math.exp(-1)]])
    assert gr.clipped_sequence_weight(5.0, np.inf) == pytest.approx(math.exp(5.0))


def test_clipping_bias_proxy_hand_case_and_identity():
    lr = np.log([0.5, 2.0, 4.0])
    assert gr.clipping_bias_proxy(lr, 1.0) == pytest.approx(4 / 3)  # mean of (0, 1, 3)
    rng = np.random.default_rng(4)
    lr = rng.normal(-0.5, 1.0, size=(3, 200))
    c = 1.5
    r = np.exp(lr)
    lhs = gr.clipped_sequence_weight(lr, c).mean(axis=-1) + gr.clipping_bias_proxy(lr, c)
    np.testing.assert_allclose(lhs, r.mean(axis=-1))  # E[min(c, r)] + E[(r - c)_+] = E[r]


def test_clipping_bias_proxy_is_exact_just_above_c():
    eps = 1e-12
    assert gr.clipping_bias_proxy([eps], 1.0) == pytest.approx(eps, rel=1e-9)


def test_clipping_bias_proxy_huge_clip_is_zero():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gr.clipping_bias_proxy([-1e4, 0.0, 1.0], 1e300) == 0.0


# --- pass@k (Eq. 4) -----------------------------------------------------------


def test_pass_at_k_hand_cases():
    assert gr.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert gr.pass_at_k(5, 2, 5) == 1.0
    assert gr.pass_at_k(5, 1, 5) == 1.0
    assert gr.pass_at_k(5, 0, 5) == 0.0
    assert gr.pass_at_k(5, 0, 1) == 0.0
    assert gr.pass_at_k(16, 16, 1) == 1.0
    assert gr.pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)


def test_pass_at_k_against_math_comb_loop():
    n, c, k = [], [], []
    for nn in range(1, 13):
        for cc in range(0, nn + 1):
            for kk in range(1, nn + 1):
                n.append(nn)
                c.append(cc)
                k.append(kk)
    got = gr.pass_at_k(np.array(n), np.array(c), np.array(k))
    want = [float(1 - Fraction(math.comb(nn - cc, kk), math.comb(nn, kk))) for nn, cc, kk in zip(n, c, k)]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_pass_at_k_broadcasts_and_stays_precise():
    got = gr.pass_at_k(64, np.array([[0], [1], [32]]), np.array([1, 16, 64]))
    assert got.shape == (3, 3)
    np.testing.assert_allclose(got[1], [1 / 64, 16 / 64, 1.0])
    # tiny value: n = 10000, c = 1, k = 1 -> exactly 1e-4
    assert gr.pass_at_k(10_000, 1, 1) == pytest.approx(1e-4, rel=1e-13)
    # near-one value against exact rationals
    exact = 1 - Fraction(math.comb(900, 50), math.comb(1000, 50))
    assert gr.pass_at_k(1000, 100, 50) == pytest.approx(float(exact), rel=1e-13)


@pytest.mark.parametrize(
    "n, c, k, message",
    [
        (5, 6, 1, r"c must be in \[0, n\]"),
        (5, 2, 6, r"k must be in \[1, n\]"),
        (5, 2, 0, "k must be an integer >= 1"),
        (0, 0, 1, "n must be an integer >= 1"),
        (5, 1.5, 1, "c must be an integer >= 0"),
    ],
)
def test_pass_at_k_invalid(n, c, k, message):
    with pytest.raises(ValueError, match=message):
        gr.pass_at_k(n, c, k)

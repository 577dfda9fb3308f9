"""Values (not shapes) of theory/divergences.py: hand cases, limits, convergence, vectorisation."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy.special import log_softmax

from replay_theory.theory import divergences as D

# Any RuntimeWarning (overflow, invalid value, divide by zero) is a failure.
pytestmark = pytest.mark.filterwarnings("error")

P = np.log([0.5, 0.5])
Q = np.log([0.25, 0.75])


def approx(x: float, rel: float = 1e-12) -> object:
    return pytest.approx(x, rel=rel, abs=1e-15)


# --------------------------------------------------------------------------- #
# exact, by hand
# --------------------------------------------------------------------------- #
def test_exact_hand_case_p_half_q_quarter() -> None:
    # p = (1/2, 1/2), q = (1/4, 3/4)
    # KL(p||q) = 1/2 log(.5/.25) + 1/2 log(.5/.75) = 1/2 log 2 + 1/2 log(2/3) = 1/2 log(4/3)
    assert D.kl_exact(P, Q) == approx(0.5 * math.log(4 / 3))
    # KL(q||p) = 1/4 log(.25/.5) + 3/4 log(.75/.5) = -1/4 log 2 + 3/4 log(3/2)
    assert D.kl_exact(Q, P) == approx(-0.25 * math.log(2) + 0.75 * math.log(1.5))
    # E_q[(p/q)^2] = sum p^2/q = .25/.25 + .25/.75 = 1 + 1/3 = 4/3
    # chi^2 = 4/3 - 1 = 1/3 (also sum (p-q)^2/q = (1/16)/(1/4) + (1/16)/(3/4) = 1/4 + 1/12 = 1/3)
    assert D.chi2_exact(P, Q) == approx(1 / 3)
    # D_2 = log(4/3); ESS/n = 1/E_q[r^2] = 3/4
    assert D.d2_exact(P, Q) == approx(math.log(4 / 3))
    assert D.renyi_exact(P, Q, 2.0) == approx(math.log(4 / 3))
    assert D.ess_fraction_exact(P, Q) == approx(0.75)
    # D_{1/2}(p||q) = log(sum sqrt(p q)) / (1/2 - 1) = -2 log(sqrt(1/8) + sqrt(3/8))
    assert D.renyi_exact(P, Q, 0.5) == approx(-2 * math.log(math.sqrt(1 / 8) + math.sqrt(3 / 8)))
    # D_3 = log(sum p^3 q^-2) / 2 = log(.125/.0625 + .125/.5625) / 2 = log(2 + 2/9) / 2
    assert D.renyi_exact(P, Q, 3.0) == approx(0.5 * math.log(2 + 2 / 9))
    # M2 with new = p, behav = q: E_q[(log p/q)^2] = 1/4 (log 2)^2 + 3/4 (log 2/3)^2
    assert D.m2_exact(P, Q) == approx(0.25 * math.log(2) ** 2 + 0.75 * math.log(2 / 3) ** 2)
    # alpha = 1 is KL exactly
    assert D.renyi_exact(P, Q, 1.0) == D.kl_exact(P, Q)


def test_exact_zero_probabilities() -> None:
    p = np.log([0.5, 0.5])
    q = np.array([0.0, -np.inf])  # q = (1, 0): p is not absolutely continuous w.r.t. q
    assert D.kl_exact(p, q) == np.inf
    assert D.chi2_exact(p, q) == np.inf
    assert D.d2_exact(p, q) == np.inf
    assert D.ess_fraction_exact(p, q) == 0.0
    # alpha < 1 stays finite: D_{1/2} = -2 log(sqrt(1/2 * 1)) = log 2
    assert D.renyi_exact(p, q, 0.5) == approx(math.log(2))
    # reverse direction: KL(q||p) = 1 * log(1 / (1/2)) = log 2; chi2(q||p) = 1/(1/2) - 1 = 1
    assert D.kl_exact(q, p) == approx(math.log(2))
    assert D.chi2_exact(q, p) == approx(1.0)
    assert D.d2_exact(q, p) == approx(math.log(2))
    # m2 with new = (1, 0), behav = (1/2, 1/2): pi_new = 0 where pi_behav > 0 -> inf
    assert D.m2_exact(q, p) == np.inf
    # m2 with behav = (1, 0): only category 0 counts, log r = log(1/2 / 1)
    assert D.m2_exact(p, q) == approx(math.log(2) ** 2)


def test_identical_distributions_give_zero() -> None:
    lp = log_softmax(np.array([0.3, -1.0, 2.0, 0.0]))
    for f in (D.kl_exact, D.chi2_exact, D.d2_exact, D.m2_exact):
        assert f(lp, lp) == 0.0
    assert D.ess_fraction_exact(lp, lp) == 1.0
    assert D.renyi_exact(lp, lp, 0.3) == 0.0


def test_tiny_divergence_keeps_relative_precision() -> None:
    # q = (1/2, 1/2), p = (1/2 + e, 1/2 - e): chi2 = 4 e^2 exactly, KL = 2 e^2 + O(e^4)
    e = 1e-7
    q = np.log([0.5, 0.5])
    p = np.array([math.log1p(2 * e) - math.log(2), math.log1p(-2 * e) - math.log(2)])
    assert D.chi2_exact(p, q) == pytest.approx(4 * e * e, rel=1e-8)
    assert D.kl_exact(p, q) == pytest.approx(2 * e * e, rel=1e-8)
    assert D.d2_exact(p, q) == pytest.approx(4 * e * e, rel=1e-8)
    # D_alpha = log1p(((1+x)^alpha + (1-x)^alpha)/2 - 1) / (alpha - 1), x = 2e:
    #         = log1p(alpha (alpha-1) x^2 / 2 + O(x^4)) / (alpha - 1) = alpha x^2 / 2 (1 + O(alpha^2 x^2))
    for alpha in (0.01, 0.3, 0.999, 1.001, 3.0, 40.0):
        assert D.renyi_exact(p, q, alpha) == pytest.approx(alpha * 2 * e * e, rel=1e-7), alpha


def test_renyi_alpha_to_one_approaches_kl_and_is_monotone() -> None:
    rng = np.random.default_rng(0)
    for _ in range(5):
        k = int(rng.integers(2, 9))
        lp = log_softmax(rng.normal(scale=2.0, size=k))
        lq = log_softmax(rng.normal(scale=2.0, size=k))
        kl = D.kl_exact(lp, lq)
        for h in (1e-2, 1e-4, 1e-6):
            # D_alpha is smooth in alpha: |D_{1+-h} - KL| = O(h)
            assert abs(D.renyi_exact(lp, lq, 1 + h) - kl) < 50 * h * max(kl, 1.0)
            assert abs(D.renyi_exact(lp, lq, 1 - h) - kl) < 50 * h * max(kl, 1.0)
        alphas = [0.05, 0.5, 0.9, 0.999, 1.0, 1.001, 1.1, 2.0, 5.0, 50.0]
        vals = np.array([D.renyi_exact(lp, lq, a) for a in alphas])
        assert np.all(np.diff(vals) >= -1e-12), vals  # non-decreasing in alpha (FreshPER Eq. (26))
        assert D.renyi_exact(lp, lq, 2.0) == pytest.approx(D.d2_exact(lp, lq), rel=1e-12)
        assert D.chi2_exact(lp, lq) == pytest.approx(math.expm1(D.d2_exact(lp, lq)), rel=1e-12)
        assert D.ess_fraction_exact(lp, lq) == pytest.approx(1 / (1 + D.chi2_exact(lp, lq)), rel=1e-12)


def test_exact_batch_and_axis() -> None:
    rng = np.random.default_rng(1)
    lp = log_softmax(rng.normal(size=(3, 4, 6)), axis=-1)
    lq = log_softmax(rng.normal(size=(3, 4, 6)), axis=-1)
    for f in (D.kl_exact, D.chi2_exact, D.d2_exact, D.m2_exact, D.ess_fraction_exact):
        batch = f(lp, lq)
        loop = np.array([[f(lp[i, j], lq[i, j]) for j in range(4)] for i in range(3)])
        np.testing.assert_allclose(batch, loop, rtol=1e-14)
        np.testing.assert_allclose(f(np.moveaxis(lp, -1, 0), np.moveaxis(lq, -1, 0), axis=0), loop, rtol=1e-14)
    batch = D.renyi_exact(lp, lq, 0.7)
    loop = np.array([[D.renyi_exact(lp[i, j], lq[i, j], 0.7) for j in range(4)] for i in range(3)])
    np.testing.assert_allclose(batch, loop, rtol=1e-14)
    # broadcasting one behaviour distribution against a batch of new ones
    np.testing.assert_allclose(D.kl_exact(lp, lq[0, 0]),
                               [[D.kl_exact(lp[i, j], lq[0, 0]) for j in range(4)] for i in range(3)], rtol=1e-14)


# --------------------------------------------------------------------------- #
# sample estimates: hand cases and a naive reference
# --------------------------------------------------------------------------- #
def test_sample_estimates_hand_case() -> None:
    # r = (2, 1/2): log r = (+log 2, -log 2)
    lr = np.array([math.log(2), -math.log(2)])
    l2 = math.log(2)
    assert D.kl_k1(lr) == approx(0.0)  # mean(-log r) = 0
    assert D.kl_k2(lr) == approx(l2**2 / 2)
    assert D.m2(lr) == approx(l2**2)
    # k3 = mean(r - 1 - log r) = ((2 - 1 - l2) + (1/2 - 1 + l2)) / 2 = 1/4
    assert D.kl_k3(lr) == approx(0.25)
    # mean r^2 = (4 + 1/4)/2 = 17/8 -> chi2-hat = 9/8, D2-hat = log(17/8)
    assert D.chi2_estimate(lr) == approx(9 / 8)
    assert D.d2_estimate(lr) == approx(math.log(17 / 8))
    # Kish: (2 + 1/2)^2 / (4 + 1/4) = 6.25 / 4.25 = 25/17; fraction 25/34
    assert D.ess_kish(lr) == approx(25 / 17)
    assert D.ess_kish_fraction(lr) == approx(25 / 34)
    # Kong: mean r = 5/4, Var r = 17/8 - 25/16 = 9/16 -> 2 / (1 + 9/16) = 32/25
    assert D.ess_kong(lr) == approx(32 / 25)
    st = D.ratio_stats(lr)
    assert st["is_ratio_min"] == approx(0.5)
    assert st["is_ratio_max"] == approx(2.0)
    assert st["is_ratio_mean"] == approx(1.25)
    assert st["is_ratio_std"] == approx(0.75)
    # self-normalised KL(new||behav): sum r log r / sum r = (2 l2 - l2/2) / (5/2) = 3 l2 / 5
    assert D.renyi_estimate(lr, 1.0) == approx(0.6 * l2)
    # alpha = 2: log mean r^2 = D2-hat; alpha = 1/2: log mean sqrt(r) / (-1/2)
    assert D.renyi_estimate(lr, 2.0) == approx(math.log(17 / 8))
    assert D.renyi_estimate(lr, 0.5) == approx(-2 * math.log((math.sqrt(2) + math.sqrt(0.5)) / 2))


def test_sample_estimates_match_naive_formulas() -> None:
    rng = np.random.default_rng(2)
    lr = rng.normal(scale=0.7, size=(5, 300))
    r = np.exp(lr)
    n = lr.shape[-1]
    np.testing.assert_allclose(D.kl_k1(lr), np.mean(-lr, -1), rtol=1e-12)
    np.testing.assert_allclose(D.kl_k2(lr), np.mean(lr**2, -1) / 2, rtol=1e-12)
    np.testing.assert_allclose(D.kl_k3(lr), np.mean(r - 1 - lr, -1), rtol=1e-10)
    np.testing.assert_allclose(D.m2(lr), np.mean(lr**2, -1), rtol=1e-12)
    np.testing.assert_allclose(D.chi2_estimate(lr), np.mean(r**2, -1) - 1, rtol=1e-10)
    np.testing.assert_allclose(D.d2_estimate(lr), np.log(np.mean(r**2, -1)), rtol=1e-12)
    np.testing.assert_allclose(D.ess_kish(lr), r.sum(-1) ** 2 / (r**2).sum(-1), rtol=1e-12)
    np.testing.assert_allclose(D.ess_kong(lr), n / (1 + r.var(-1)), rtol=1e-12)
    np.testing.assert_allclose(D.renyi_estimate(lr, 1.0), (r * lr).sum(-1) / r.sum(-1), rtol=1e-12)
    np.testing.assert_allclose(D.renyi_estimate(lr, 3.0), np.log(np.mean(r**3, -1)) / 2, rtol=1e-12)
    st = D.ratio_stats(lr)
    np.testing.assert_allclose(st["is_ratio_min"], r.min(-1), rtol=1e-14)
    np.testing.assert_allclose(st["is_ratio_max"], r.max(-1), rtol=1e-14)
    np.testing.assert_allclose(st["is_ratio_mean"], r.mean(-1), rtol=1e-12)
    np.testing.assert_allclose(st["is_ratio_std"], r.std(-1), rtol=1e-10)


def test_kong_equals_kish_only_when_mean_ratio_is_one() -> None:
    rng = np.random.default_rng(3)
    lr = rng.normal(scale=1.5, size=50)
    assert abs(D.ess_kong(lr) - D.ess_kish(lr)) > 1e-3  # raw sample: mean r != 1
    lr_sn = lr - math.log(np.mean(np.exp(lr)))  # self-normalised: mean r = 1
    assert D.ess_kong(lr_sn) == pytest.approx(D.ess_kish(lr_sn), rel=1e-12)


def test_k3_small_log_ratio_precision() -> None:
    for x in (1e-3, -1e-3, 1e-6, -1e-6, 1e-9, 3e-12):
        # r - 1 - log r = x^2/2 + x^3/6 + x^4/24 + ... (terms past x^4 below 1e-16 relative)
        exact = x * x / 2 + x**3 / 6 + x**4 / 24 + x**5 / 120
        assert D.kl_k3(np.array([x])) == pytest.approx(exact, rel=1e-14)
    # both sides of the series cut-off agree with expm1(x) - x
    for x in (0.00999, 0.01001, -0.00999, -0.01001):
        assert D.kl_k3(np.array([x])) == pytest.approx(math.expm1(x) - x, rel=1e-12)


# --------------------------------------------------------------------------- #
# convergence to the exact values on large samples
# --------------------------------------------------------------------------- #
def _pair() -> tuple[np.ndarray, np.ndarray]:
    lq = log_softmax(np.array([0.0, 0.3, -0.2, 0.5, -0.4]))  # behaviour
    lp = log_softmax(np.array([0.3, 0.1, -0.1, 0.2, -0.2]))  # new
    return lp, lq


def test_estimates_converge_to_exact_values() -> None:
    lp, lq = _pair()
    n = 200_000
    rng = np.random.default_rng(12345)
    x = rng.choice(lp.size, size=n, p=np.exp(lq))  # samples from pi_behav
    lr = lp[x] - lq[x]
    r = np.exp(lr)

    def se(v: np.ndarray) -> float:
        return float(np.std(v) / math.sqrt(n))

    kl_bn = D.kl_exact(lq, lp)  # KL(behav || new): what k1, k3 estimate
    kl_nb = D.kl_exact(lp, lq)  # KL(new || behav)
    m2x = D.m2_exact(lp, lq)
    chi2x = D.chi2_exact(lp, lq)
    d2x = D.d2_exact(lp, lq)
    # unbiased estimators: within 4 standard errors
    assert abs(D.kl_k1(lr) - kl_bn) < 4 * se(-lr)
    assert abs(D.kl_k3(lr) - kl_bn) < 4 * se(r - 1 - lr)
    assert abs(D.m2(lr) - m2x) < 4 * se(lr**2)
    assert abs(D.kl_k2(lr) - m2x / 2) < 4 * se(lr**2 / 2)
    assert abs(D.chi2_estimate(lr) - chi2x) < 4 * se(r**2)
    # k2 is biased for KL(behav||new) but close for nearby policies (bias O(E|log r|^3))
    assert D.kl_k2(lr) == pytest.approx(kl_bn, rel=0.1)
    # delta method: sd(log mean r^2) ~ sd(r^2) / E r^2
    assert abs(D.d2_estimate(lr) - d2x) < 4 * se(r**2) / math.exp(d2x)
    # ESS fractions -> e^{-D_2} (population ESS / n)
    assert D.ess_kish_fraction(lr) == pytest.approx(math.exp(-d2x), rel=0.01)
    assert D.ess_kong(lr) / n == pytest.approx(math.exp(-d2x), rel=0.01)
    # self-normalised KL(new||behav) and Renyi of order 2
    assert D.renyi_estimate(lr, 1.0) == pytest.approx(kl_nb, rel=0.05)
    assert D.renyi_estimate(lr, 2.0) == pytest.approx(d2x, rel=0.05)
    assert D.ratio_stats(lr)["is_ratio_mean"] == pytest.approx(1.0, abs=4 * se(r))


# --------------------------------------------------------------------------- #
# vectorisation over a leading seed axis, masks
# --------------------------------------------------------------------------- #
SAMPLE_FUNCS = [D.kl_k1, D.kl_k2, D.kl_k3, D.m2, D.chi2_estimate, D.d2_estimate, D.ess_kish, D.ess_kish_fraction,
                D.ess_kong]


def test_vectorised_over_seeds_equals_loop() -> None:
    lp, lq = _pair()
    seeds = range(4)
    lr = np.stack(
        [lp[x] - lq[x] for x in (np.random.default_rng(s).choice(5, size=500, p=np.exp(lq)) for s in seeds)]
    )  # (seeds, n)
    rng = np.random.default_rng(99)
    mask = rng.random(lr.shape) < 0.8  # (seeds, n)
    mask[:, 0] = True
    lr_padded = np.where(mask, lr, np.nan)  # garbage in the padding must be ignored
    for f in SAMPLE_FUNCS:
        np.testing.assert_allclose(f(lr), [f(lr[s]) for s in seeds], rtol=1e-13, err_msg=f.__name__)
        np.testing.assert_allclose(
            f(lr_padded, mask), [f(lr[s][mask[s]]) for s in seeds], rtol=1e-12, err_msg=f.__name__
        )
    for a in (0.5, 1.0, 2.0):
        np.testing.assert_allclose(
            D.renyi_estimate(lr_padded, a, mask), [D.renyi_estimate(lr[s][mask[s]], a) for s in seeds], rtol=1e-12
        )
    st = D.ratio_stats(lr_padded, mask)
    for key, v in st.items():
        np.testing.assert_allclose(v, [D.ratio_stats(lr[s][mask[s]])[key] for s in seeds], rtol=1e-12)
    # a non-default reduced axis
    for f in SAMPLE_FUNCS:
        np.testing.assert_allclose(f(lr.T, axis=0), f(lr), rtol=1e-14)
    # 0/1 integer masks work like boolean ones
    np.testing.assert_allclose(D.m2(lr_padded, mask.astype(int)), D.m2(lr_padded, mask), rtol=0)


def test_sequence_log_ratio_sums_tokens_with_mask() -> None:
    tok = np.array([[[0.1, -0.2, 0.3], [1.0, 1.0, 9.0]], [[0.0, 0.0, 0.0], [-1.0, 2.0, np.nan]]])  # (2, 2, 3)
    mask = np.array([[[1, 1, 1], [1, 1, 0]], [[0, 0, 0], [1, 1, 0]]])
    np.testing.assert_allclose(D.sequence_log_ratio(tok, mask), [[0.2, 2.0], [0.0, 1.0]], rtol=1e-14)
    np.testing.assert_allclose(D.sequence_log_ratio(np.array([0.5, 0.25])), 0.75, rtol=0)


def test_token_log_ratio_validates_and_masks() -> None:
    new = np.array([[-0.1, -2.0, -0.5], [-1.0, 5.0, np.nan]])
    behav = np.array([[-0.3, -1.0, -0.5], [-1.5, -1.0, 0.0]])
    mask = np.array([[1, 1, 1], [1, 0, 0]])
    out = D.token_log_ratio(new, behav, mask)
    np.testing.assert_allclose(out, [[0.2, -1.0, 0.0], [0.5, 0.0, 0.0]], rtol=1e-14)
    with pytest.raises(ValueError, match="logp_new contains NaN"):
        D.token_log_ratio(np.array([np.nan]), np.array([-1.0]))
    with pytest.raises(ValueError, match="logp_behav contains"):
        D.token_log_ratio(np.array([-1.0]), np.array([-np.inf]))
    with pytest.raises(ValueError, match="logp_new contains positive"):
        D.token_log_ratio(np.array([0.1]), np.array([-1.0]))
    with pytest.raises(ValueError, match="empty"):
        D.token_log_ratio(np.array([]), np.array([]))


def test_8192_token_sequences_stay_finite_without_warnings() -> None:
    L = 8192
    tok = np.stack([np.full(L, 0.5), np.full(L, 0.5), np.zeros(L), np.full(L, -0.5)])  # (4, L)
    tok[1, -2:] = 0.0  # second sequence: 4095
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seq = D.sequence_log_ratio(tok)
        np.testing.assert_allclose(seq, [4096.0, 4095.0, 0.0, -4096.0], rtol=0)
        # log mean r^2 = log((e^8192 + e^8190 + 1 + e^-8192) / 4) = 8192 + log1p(e^-2) - log 4
        d2 = D.d2_estimate(seq)
        assert d2 == pytest.approx(8192 + math.log1p(math.exp(-2)) - math.log(4), rel=1e-14)
        assert math.isfinite(d2)
        assert D.chi2_estimate(seq) == np.inf  # e^8190: legitimately infinite
        # population ESS fraction in log space is -d2; exp(-d2) underflows to a tiny 0, not NaN
        assert math.exp(-d2) == 0.0
        # Kish: (e^4096 + e^4095)^2 / (e^8192 + e^8190) = (1 + e^-1)^2 / (1 + e^-2)
        assert D.ess_kish(seq) == pytest.approx((1 + math.exp(-1)) ** 2 / (1 + math.exp(-2)), rel=1e-12)
        assert D.ess_kish_fraction(seq) == pytest.approx((1 + math.exp(-1)) ** 2 / (1 + math.exp(-2)) / 4, rel=1e-12)
        kong = D.ess_kong(seq)  # Var r ~ e^8192: ESS is tiny (0.0), not NaN
        assert kong == 0.0
        st = D.ratio_stats(seq)
        assert st["is_ratio_max"] == np.inf and st["is_ratio_min"] == 0.0
        assert st["is_ratio_mean"] == np.inf and st["is_ratio_std"] == np.inf
        assert D.kl_k3(seq) == np.inf
        assert D.m2(seq) == pytest.approx((4096**2 + 4095**2 + 4096**2) / 4, rel=1e-14)
        assert D.kl_k1(seq) == pytest.approx(-4095 / 4, rel=1e-14)
        assert D.renyi_estimate(seq, 1.0) == pytest.approx((4096 + 4095 * math.exp(-1)) / (1 + math.exp(-1)), rel=1e-12)
        # all sequences identical: Kish and Kong both give n, chi2-hat still inf
        same = D.sequence_log_ratio(np.full((4, L), 0.5))
        assert D.ess_kish(same) == 4.0 and D.ess_kong(same) == 4.0
        assert D.d2_estimate(same) == 8192.0


def test_infinite_log_ratios_give_limits_not_nan() -> None:
    lr = np.array([np.inf, 0.0, -1.0])
    assert D.ess_kish(lr) == 1.0  # one infinite weight dominates
    assert D.ess_kong(lr) == 0.0
    assert D.chi2_estimate(lr) == np.inf
    assert D.kl_k3(lr) == np.inf
    assert D.renyi_estimate(lr, 1.0) == np.inf
    zero = np.array([-np.inf, -np.inf])  # all r = 0
    assert D.ess_kish(zero) == 0.0
    assert D.ess_kong(zero) == 2.0  # Var r = 0
    assert D.kl_k3(zero) == np.inf
    assert D.d2_estimate(zero) == -np.inf


# --------------------------------------------------------------------------- #
# invalid input
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("f", SAMPLE_FUNCS + [D.ratio_stats, D.sequence_log_ratio])
def test_sample_functions_reject_bad_input(f) -> None:
    with pytest.raises(ValueError, match="empty"):
        f(np.array([]))
    with pytest.raises(ValueError, match="empty"):
        f(np.zeros((3, 0)))
    with pytest.raises(ValueError, match="scalar"):
        f(1.0)
    with pytest.raises(ValueError, match="NaN"):
        f(np.array([0.1, np.nan]))
    with pytest.raises(ValueError, match="mask"):
        f(np.zeros((2, 3)), np.ones((2, 4), dtype=bool))
    with pytest.raises(ValueError, match="mask"):
        f(np.zeros(3), np.array([0, 1, 2]))


@pytest.mark.parametrize("f", SAMPLE_FUNCS + [D.ratio_stats])
def test_fully_masked_row_is_rejected(f) -> None:
    with pytest.raises(ValueError, match="no unmasked"):
        f(np.zeros((2, 3)), np.array([[1, 1, 0], [0, 0, 0]]))


def test_exact_functions_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="normalised"):
        D.kl_exact(np.log([0.5, 0.6]), Q)
    with pytest.raises(ValueError, match="positive"):
        D.chi2_exact(np.array([0.1, -5.0]), Q)
    with pytest.raises(ValueError, match="NaN"):
        D.d2_exact(np.array([np.nan, 0.0]), Q)
    with pytest.raises(ValueError, match=r"\+inf"):
        D.m2_exact(P, np.array([np.inf, 0.0]))
    with pytest.raises(ValueError, match="categories"):
        D.kl_exact(P, log_softmax(np.zeros(3)))
    with pytest.raises(ValueError, match="empty"):
        D.kl_exact(np.array([]), np.array([]))
    for alpha in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="alpha"):
            D.renyi_exact(P, Q, alpha)
        with pytest.raises(ValueError, match="alpha"):
            D.renyi_estimate(np.zeros(3), alpha)

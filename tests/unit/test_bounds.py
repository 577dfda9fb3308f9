"""Identities and bounds of theory/bounds.py: properties on random data, hand cases, paper errata."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.special import log_softmax

from replay_theory.theory import bounds as B
from replay_theory.theory import divergences as D

pytestmark = pytest.mark.filterwarnings("error")

SETTINGS = settings(max_examples=50, deadline=None)

logit = st.floats(-8.0, 8.0, allow_nan=False, allow_infinity=False)


@st.composite
def categorical_pairs(draw: st.DrawFn, batch: tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """(logp_new, logp_behav), each (*batch, K), K in 2..12, from logits in [-8, 8]."""
    k = draw(st.integers(2, 12))
    a = draw(hnp.arrays(np.float64, (*batch, k), elements=logit))
    b = draw(hnp.arrays(np.float64, (*batch, k), elements=logit))
    return log_softmax(a, axis=-1), log_softmax(b, axis=-1)


sample_log_ratios = hnp.arrays(
    np.float64,
    st.tuples(st.integers(1, 3), st.integers(1, 40)),
    elements=st.floats(-20.0, 20.0, allow_nan=False, allow_infinity=False),
)


def _fail_msg(rel: B.Relation) -> str:
    return f"{rel.name}: lhs={rel.lhs!r} {rel.relation} rhs={rel.rhs!r}"


# --------------------------------------------------------------------------- #
# properties
# --------------------------------------------------------------------------- #
@SETTINGS
@given(categorical_pairs())
def test_every_exact_relation_holds_for_random_categorical_pairs(pair) -> None:
    rels = B.exact_relations(*pair)
    assert len(rels) == 12
    for rel in rels:
        assert rel.ok, _fail_msg(rel)


@SETTINGS
@given(categorical_pairs(batch=(2, 3)))
def test_exact_relations_vectorised_equal_loop(pair) -> None:
    lp, lq = pair
    batch = B.exact_relations(lp, lq)
    for i in range(2):
        for j in range(3):
            single = B.exact_relations(lp[i, j], lq[i, j])
            for rb, rs in zip(batch, single):
                assert rb.name == rs.name
                assert rb.holds[i, j] and rs.holds
                np.testing.assert_allclose(rb.lhs[i, j], rs.lhs, rtol=1e-13, atol=1e-300)
                np.testing.assert_allclose(rb.rhs[i, j], rs.rhs, rtol=1e-13, atol=1e-300)


@SETTINGS
@given(categorical_pairs())
def test_generic_interface_with_behav_prob_matches_exact(pair) -> None:
    lp, lq = pair
    lr, b = lp - lq, np.exp(lq)
    fns = [B.var_ratio_equals_chi2, B.chi2_equals_expm1_d2, B.kl_le_d2, B.ess_bound_kl, B.m2po_thm51,
           B.m2po_sharp, B.m2_converse, B.m2_decomposition, B.mean_abs_log_ratio_le_sqrt_m2]
    exact = {r.name: r for r in B.exact_relations(lp, lq)}
    for f in fns:
        rel = f(lr, b)
        assert rel.ok, _fail_msg(rel)
        assert rel.lhs == pytest.approx(exact[rel.name].lhs, rel=1e-10, abs=1e-13)
        assert rel.rhs == pytest.approx(exact[rel.name].rhs, rel=1e-10, abs=1e-13)
    # the population quantities agree with divergences.py
    assert B.kl_le_d2(lr, b).rhs == pytest.approx(D.d2_exact(lp, lq), rel=1e-10, abs=1e-13)
    assert B.m2_decomposition(lr, b).lhs == pytest.approx(D.m2_exact(lp, lq), rel=1e-10, abs=1e-13)
    assert B.m2po_sharp(lr, b).lhs == pytest.approx(D.chi2_exact(lp, lq), rel=1e-10, abs=1e-13)


@SETTINGS
@given(sample_log_ratios)
def test_sample_relations_hold_for_any_data(lr) -> None:
    rels = B.sample_relations(lr)
    assert [r.name for r in rels] == [
        "m2po_thm51", "m2po_sharp", "m2_converse", "m2_decomposition", "mean_abs_log_ratio_le_sqrt_m2",
        "var_ratio_equals_chi2", "chi2_equals_expm1_d2", "kl_le_d2", "ess_bound_kl",
    ]
    for rel in rels:
        assert rel.ok, _fail_msg(rel)
    # the sharp bound is never looser than Thm 5.1
    thm, sharp = rels[0], rels[1]
    assert np.all(sharp.rhs <= thm.rhs * (1 + 1e-12))


@SETTINGS
@given(sample_log_ratios, st.data())
def test_weighted_samples_satisfy_m2po_bounds_and_normalised_freshper(lr, data) -> None:
    w = data.draw(hnp.arrays(np.float64, lr.shape, elements=st.floats(0.01, 1.0)))
    for f in (B.m2po_thm51, B.m2po_sharp, B.m2_converse, B.m2_decomposition, B.mean_abs_log_ratio_le_sqrt_m2):
        rel = f(lr, w)
        assert rel.ok, _fail_msg(rel)
    for f in (B.var_ratio_equals_chi2, B.chi2_equals_expm1_d2, B.kl_le_d2, B.ess_bound_kl):
        rel = f(lr, w, self_normalize=True)
        assert rel.ok, _fail_msg(rel)


# --------------------------------------------------------------------------- #
# hand cases: tight bounds and the Thm 5.1 vs sharp gap
# --------------------------------------------------------------------------- #
def test_ess_bound_and_kl_le_d2_tight_for_conditioned_distribution() -> None:
    # behav q = (1/4, 1/4, 1/2), new p = q conditioned on the first two = (1/2, 1/2, 0): r = (2, 2, 0).
    # KL(p||q) = log 2 and D_2 = log(sum p^2/q) = log(2 * .25/.25) = log 2: D_2 = KL, so
    # ESS/n = e^{-D_2} = 1/2 = e^{-KL}: FreshPER's bound (11) is attained with p != q.
    lq = np.log([0.25, 0.25, 0.5])
    lp = np.array([math.log(0.5), math.log(0.5), -np.inf])
    rels = {r.name: r for r in B.exact_relations(lp, lq, n=1000.0)}
    ess = rels["ess_bound_kl"]
    assert ess.lhs == pytest.approx(500.0, rel=1e-14)
    assert ess.rhs == pytest.approx(500.0, rel=1e-14)
    assert ess.holds and abs(ess.slack) < 1e-10
    kl = rels["kl_le_d2"]
    assert kl.lhs == pytest.approx(math.log(2), rel=1e-14) and kl.rhs == pytest.approx(math.log(2), rel=1e-14)
    assert kl.holds and abs(kl.slack) < 1e-14
    # every relation holds here, even with r = 0 on a category (M2 = inf)
    assert all(r.ok for r in rels.values())
    assert rels["m2_decomposition"].lhs == np.inf


def test_thm51_strictly_looser_than_sharp_bound() -> None:
    # behav (1/2, 1/2), new (0.9, 0.1): r = (1.8, 0.2).
    # chi2 = E[(r-1)^2] = (0.64 + 0.64)/2 = 0.64
    # M2 = ((log 1.8)^2 + (log 0.2)^2)/2 ~= (0.345493 + 2.590290)/2 = 1.467892
    # Thm 5.1: R = max(1.8, 1/0.2) = 5 -> 25 M2 ~= 36.697;  sharp: 1.8^2 M2 = 3.24 M2 ~= 4.756
    lr = np.log([1.8, 0.2])
    m2 = (math.log(1.8) ** 2 + math.log(0.2) ** 2) / 2
    thm = B.m2po_thm51(lr)  # uniform weights = the exact behaviour distribution here
    sharp = B.m2po_sharp(lr)
    assert thm.lhs == pytest.approx(0.64, rel=1e-13) and sharp.lhs == pytest.approx(0.64, rel=1e-13)
    assert thm.rhs == pytest.approx(25 * m2, rel=1e-13)
    assert sharp.rhs == pytest.approx(3.24 * m2, rel=1e-13)
    assert m2 == pytest.approx(1.467892, abs=1e-6)
    assert thm.rhs / sharp.rhs == pytest.approx((5 / 1.8) ** 2, rel=1e-13)
    assert thm.holds and sharp.holds and sharp.slack < thm.slack
    # the converse: R = max(1, 1/0.2) = 5: M2 <= 25 * 0.64 = 16
    conv = B.m2_converse(lr)
    assert conv.lhs == pytest.approx(m2, rel=1e-13) and conv.rhs == pytest.approx(16.0, rel=1e-13) and conv.holds
    # exact pair gives the same numbers
    rels = {r.name: r for r in B.exact_relations(np.log([0.9, 0.1]), np.log([0.5, 0.5]))}
    assert rels["m2po_thm51"].rhs == pytest.approx(25 * m2, rel=1e-13)
    assert rels["m2po_sharp"].rhs == pytest.approx(3.24 * m2, rel=1e-13)


def test_local_limit_m2_equals_chi2_equals_twice_kl() -> None:
    # r = 1 + e h with E_q h = 0: chi2 = e^2 E h^2, M2 ~ chi2, KL(new||behav) ~ chi2/2, up to O(e)
    q = np.array([0.2, 0.3, 0.5])
    h = np.array([1.0, 1.0, -1.0])
    h -= q @ h
    e = 1e-4
    lq, lp = np.log(q), np.log(q * (1 + e * h))
    chi2 = e * e * float(q @ h**2)
    assert D.chi2_exact(lp, lq) == pytest.approx(chi2, rel=1e-9)
    assert D.m2_exact(lp, lq) == pytest.approx(chi2, rel=10 * e)
    assert D.kl_exact(lp, lq) == pytest.approx(chi2 / 2, rel=10 * e)
    assert D.kl_exact(lq, lp) == pytest.approx(chi2 / 2, rel=10 * e)
    # sharp bound and converse both become equalities in the limit
    rels = {r.name: r for r in B.exact_relations(lp, lq)}
    for name in ("m2po_sharp", "m2_converse"):
        assert rels[name].lhs / rels[name].rhs == pytest.approx(1.0, rel=10 * e)


# --------------------------------------------------------------------------- #
# hypotheses matter: the converse without its lower bound on r
# --------------------------------------------------------------------------- #
def test_converse_fails_when_lower_bound_on_r_is_ignored() -> None:
    # r = (1e-6, 1): M2 = (log 1e-6)^2 / 2 ~= 95.4, chi2 = (1 - 1e-6)^2 / 2 ~= 0.5.
    lr = np.array([math.log(1e-6), 0.0])
    m2 = math.log(1e-6) ** 2 / 2
    chi2 = (1 - 1e-6) ** 2 / 2
    bad = B.m2_converse(lr, R=2.0)  # claims r >= 1/2, false for r = 1e-6
    assert bad.lhs == pytest.approx(m2, rel=1e-13) and bad.rhs == pytest.approx(4 * chi2, rel=1e-12)
    assert bad.holds is False and bad.slack < -90
    good = B.m2_converse(lr)  # default R = 1/inf r = 1e6
    assert good.rhs == pytest.approx(1e12 * chi2, rel=1e-9) and good.holds is True
    # same story for Thm 5.1's UPPER bound: r = (100, 1) with R = 2 < sup r fails
    up = B.m2po_thm51(np.log([100.0, 1.0]), R=2.0)
    assert up.lhs == pytest.approx(99**2 / 2, rel=1e-13) and up.holds is False


# --------------------------------------------------------------------------- #
# paper errata (see docs/ERRATA.md)
# --------------------------------------------------------------------------- #
def test_erratum_m2po_thm51_never_uses_the_lower_bound_on_r() -> None:
    # r = (1e-6, 1.5): the hypothesis 1/R <= r fails badly for R = sup r = 1.5, yet
    # chi2 <= R^2 M2 still holds: the proof's r < 1 branch uses (1 - r)^2 <= (log r)^2 only.
    lr = np.log([1e-6, 1.5])
    rel = B.m2po_thm51(lr, R=1.5)
    assert rel.holds is True
    assert rel.rhs == pytest.approx(2.25 * (math.log(1e-6) ** 2 + math.log(1.5) ** 2) / 2, rel=1e-12)
    assert rel.rhs / B.m2po_thm51(lr).rhs == pytest.approx((1.5 * 1e-6) ** 2, rel=1e-9)  # 4e12x tighter


def test_erratum_freshper_prop1_support_condition_is_reversed() -> None:
    # Prop. 1 assumes "Q absolutely continuous w.r.t. P". Take P = pi_new = (1/2, 1/2),
    # Q = pi_behav = (1, 0): Q << P holds, but E_Q[rho] = 1/2 (not 1, Eq. (19) fails),
    # Var_Q[rho] = 0, E_Q[(rho - 1)^2] = 1/4 and the true chi^2(P||Q) = inf. The identity needs P << Q.
    lp = np.log([0.5, 0.5])
    lq = np.array([0.0, -np.inf])
    rels = {r.name: r for r in B.exact_relations(lp, lq)}
    var = rels["var_ratio_equals_chi2"]
    assert var.lhs == 0.0 and var.rhs == pytest.approx(0.25, rel=1e-14) and var.holds is False
    assert D.chi2_exact(lp, lq) == np.inf
    assert rels["chi2_equals_expm1_d2"].holds is False  # 1/4 vs e^{log 1/4} - 1 = -3/4
    assert rels["chi2_equals_expm1_d2"].rhs == pytest.approx(-0.75, rel=1e-14)
    # with P << Q (swap the roles) the identity holds: Var = E[(rho-1)^2] = 1
    swapped = {r.name: r for r in B.exact_relations(lq, lp)}
    assert swapped["var_ratio_equals_chi2"].holds is True
    assert swapped["var_ratio_equals_chi2"].lhs == pytest.approx(1.0, rel=1e-14)


def test_erratum_freshper_ess_bound_needs_kl_new_behav_not_reverse() -> None:
    # FreshPER Eq. (11) writes D_KL without a direction; the derivation gives KL(pi_theta || pi_mu).
    # The usual estimators k1/k3 (and M2PO Eq. (3)) estimate KL(pi_mu || pi_theta), for which it FAILS:
    # behav (1/2, 1/2), new (0.01, 0.99):
    #   ESS/n = 1/E[r^2] = 1/(2 (0.01^2 + 0.99^2)) = 1/1.9604 ~= 0.5101
    #   e^{-KL(new||behav)} = e^{-(0.01 log 0.02 + 0.99 log 1.98)} ~= 0.5288 >= 0.5101   (holds)
    #   e^{-KL(behav||new)} = sqrt(0.5/0.01 * 0.5/0.99)^{-1} = sqrt(0.0396) ~= 0.1990 < 0.5101  (fails)
    lp, lq = np.log([0.01, 0.99]), np.log([0.5, 0.5])
    rel = B.ess_bound_kl(lp - lq, np.exp(lq))
    assert rel.lhs == pytest.approx(1 / 1.9604, rel=1e-13)
    assert rel.rhs == pytest.approx(math.exp(-(0.01 * math.log(0.02) + 0.99 * math.log(1.98))), rel=1e-13)
    assert rel.holds is True
    reverse_rhs = math.exp(-D.kl_exact(lq, lp))
    assert reverse_rhs == pytest.approx(math.sqrt(0.0396), rel=1e-13)
    assert rel.lhs > 2.5 * reverse_rhs


def test_erratum_sample_identities_need_mean_ratio_one() -> None:
    # FreshPER Eqs. (9), (21), (24) use E[rho] = 1 (Eq. (8)). On a sample r = (2, 1/2), mean r = 5/4:
    #   Var r = 17/8 - 25/16 = 9/16; mean (r-1)^2 = (1 + 1/4)/2 = 5/8; mean r^2 - 1 = 9/8 (verl chi2_token)
    lr = np.log([2.0, 0.5])
    var = B.var_ratio_equals_chi2(lr)
    assert var.lhs == pytest.approx(9 / 16, rel=1e-14) and var.rhs == pytest.approx(5 / 8, rel=1e-14)
    assert var.holds is False
    c = B.chi2_equals_expm1_d2(lr)
    assert c.lhs == pytest.approx(5 / 8, rel=1e-14) and c.rhs == pytest.approx(9 / 8, rel=1e-14)
    assert c.rhs == pytest.approx(D.chi2_estimate(lr), rel=1e-14) and c.holds is False
    # the M2PO bounds are about mean (r-1)^2 = 5/8, not chi2_estimate, and hold on raw samples
    assert B.m2po_sharp(lr).lhs == pytest.approx(5 / 8, rel=1e-14)
    # self-normalised (r / mean r = (8/5, 2/5)): Var = mean (r-1)^2 = 9/25 = e^{D_2} - 1
    for f in (B.var_ratio_equals_chi2, B.chi2_equals_expm1_d2):
        rel = f(lr, self_normalize=True)
        assert rel.holds is True and rel.lhs == pytest.approx(9 / 25, rel=1e-13)


def test_erratum_m2po_footnote1_bounds_mean_abs_log_ratio() -> None:
    # Footnote 1: "M2 provides an upper bound for this absolute KL estimate, as E[|r|] <= sqrt(E[r^2])".
    # The inequality about r is irrelevant: for r = 2 everywhere E|r| = 2 > sqrt(M2) = log 2.
    # What holds is E|log r| <= sqrt(M2) (Cauchy-Schwarz), tight here (|log r| constant).
    lr = np.full(3, math.log(2))
    rel = B.mean_abs_log_ratio_le_sqrt_m2(lr)
    assert rel.lhs == pytest.approx(math.log(2), rel=1e-14) and rel.rhs == pytest.approx(math.log(2), rel=1e-14)
    assert rel.holds is True and abs(rel.slack) < 1e-15
    assert 2.0 > math.sqrt(D.m2(lr))  # E|r| <= sqrt(M2) is false: the footnote's r must mean log r


def test_erratum_k1_estimates_reverse_kl() -> None:
    # M2PO Eq. (3) calls -mean log r "the batch-level KL" without a direction: under behaviour
    # samples it is KL(pi_behav || pi_theta). Asymmetric pair behav (1/2, 1/2), new (0.05, 0.95):
    #   KL(behav||new) = 1/2 log 10 + 1/2 log(10/19) ~= 0.8304;  KL(new||behav) = 0.05 log 0.1 + 0.95 log 1.9 ~= 0.4946
    lq, lp = np.log([0.5, 0.5]), np.log([0.05, 0.95])
    rels = {r.name: r for r in B.exact_relations(lp, lq)}
    k1 = rels["k1_mean_equals_kl_behav_new"]
    assert k1.holds
    assert k1.lhs == pytest.approx(0.5 * math.log(0.5 / 0.05) + 0.5 * math.log(0.5 / 0.95), rel=1e-13)
    assert D.kl_exact(lp, lq) == pytest.approx(0.05 * math.log(0.1) + 0.95 * math.log(1.9), rel=1e-13)
    assert k1.lhs - D.kl_exact(lp, lq) > 0.3


# --------------------------------------------------------------------------- #
# extreme values, the Relation object, invalid input
# --------------------------------------------------------------------------- #
def test_sample_relations_on_8192_token_sequences_without_warnings() -> None:
    seq = D.sequence_log_ratio(np.stack([np.full(8192, 0.5), np.full(8192, 0.49), np.zeros(8192), np.full(8192, -0.5)]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rels = B.sample_relations(seq)
    for rel in rels:
        assert rel.ok, _fail_msg(rel)
        assert not np.any(np.isnan(rel.slack)), rel.name
    names = {r.name: r for r in rels}
    assert names["m2po_thm51"].lhs == np.inf and names["m2po_thm51"].rhs == np.inf


def test_relation_object() -> None:
    rel = B.m2po_sharp(np.log([[2.0, 0.5], [1.0, 1.0]]))
    assert rel.relation == "<=" and rel.name == "m2po_sharp" and rel.source.startswith("M2PO")
    np.testing.assert_allclose(rel.slack, np.asarray(rel.rhs) - np.asarray(rel.lhs), rtol=0)
    np.testing.assert_array_equal(rel.holds, [True, True])
    assert rel.lhs[1] == 0.0 and rel.rhs[1] == 0.0  # r = 1: both sides vanish
    with pytest.raises(dataclasses.FrozenInstanceError):
        rel.lhs = 0.0  # type: ignore[misc]
    single = B.m2_decomposition(np.log([2.0, 0.5]))
    assert isinstance(single.lhs, float) and isinstance(single.holds, bool)


def test_weights_ignore_zero_probability_entries() -> None:
    lr = np.array([math.log(2), np.nan, -math.log(2)])
    w = np.array([1.0, 0.0, 1.0])
    rel = B.m2_decomposition(lr, w)
    assert rel.lhs == pytest.approx(math.log(2) ** 2, rel=1e-14) and rel.holds
    # a 0/1 padding mask in sample_relations is the same thing
    for r1, r2 in zip(B.sample_relations(lr, w), B.sample_relations(np.log([2.0, 0.5]))):
        assert r1.lhs == pytest.approx(r2.lhs, rel=1e-13) and r1.rhs == pytest.approx(r2.rhs, rel=1e-13)


def test_bounds_reject_bad_input() -> None:
    lr = np.array([0.1, -0.2])
    with pytest.raises(ValueError, match="R must be >= 1"):
        B.m2po_thm51(lr, R=0.5)
    with pytest.raises(ValueError, match="non-negative"):
        B.m2_converse(lr, np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="zero total"):
        B.kl_le_d2(lr, np.zeros(2))
    with pytest.raises(ValueError, match="NaN"):
        B.kl_le_d2(np.array([np.nan, 0.0]))
    with pytest.raises(ValueError, match="empty"):
        B.m2po_sharp(np.array([]))
    with pytest.raises(ValueError, match="does not match"):
        B.m2po_sharp(lr, np.ones(3))
    with pytest.raises(ValueError, match="normalised"):
        B.exact_relations(np.log([0.5, 0.6]), np.log([0.5, 0.5]))
    with pytest.raises(ValueError, match="self_normalize"):
        B.var_ratio_equals_chi2(np.array([np.inf, 0.0]), self_normalize=True)

"""Tests for replay_theory.core.losses and replay_theory.core.advantages.

Three levels (docs/REFERENCES.md): hand-worked values; the vectorised M2PO
mask against a literal per-seed loop of Algorithm 1; every ``grad_logp``
against a central finite difference of ``loss``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from replay_theory.core import advantages as adv_mod
from replay_theory.core import losses as L
from replay_theory.core.designs import LOSSES, DesignConfig, LossInputs, check_choice, loss_output

LOG_HI = math.log(1.2)  # GRPO clip bounds at eps = 0.2, in log space
LOG_LO = math.log(0.8)


# --------------------------------------------------------------------------- #
# fixtures: random batches with padding, away from every kink
# --------------------------------------------------------------------------- #
def _batch(seed: int = 0, S: int = 3, n: int = 4, T: int = 6, scale: float = 0.3):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, size=(S, n))  # (S, n) real tokens per response
    mask = np.arange(T)[None, None, :] < lengths[..., None]  # (S, n, T)
    logp_behav = -rng.uniform(0.05, 3.0, size=(S, n, T))
    log_ratio = rng.normal(0.0, scale, size=(S, n, T))
    logp_new = logp_behav + log_ratio
    advantage = rng.normal(size=(S, n))
    advantage[0, 0] = 0.0  # a zero advantage (no candidate, no gradient)
    flags = rng.random((S, n)) < 0.5  # is_fresh / is_replayed
    flags[:, 0], flags[:, 1] = True, False  # both kinds in every seed
    # garbage in the padding: must never be read
    logp_new = np.where(mask, logp_new, np.nan)
    logp_behav = np.where(mask, logp_behav, 1e6)
    return dict(logp_new=logp_new, logp_behav=logp_behav, mask=mask, advantage=advantage, flags=flags,
                reward=rng.integers(0, 2, size=(S, n)).astype(float))


def _fd(f, x, mask, h=1e-5):
    """Central difference of f: (S, n, L) -> (S,), one (n, L) position for all seeds at once."""
    g = np.zeros_like(x)
    x = np.where(mask, x, -1.0)  # finite padding so that x +- h stays finite
    for idx in np.ndindex(x.shape[1:]):
        sl = (slice(None),) + idx
        xp, xm = x.copy(), x.copy()
        xp[sl] += h
        xm[sl] -= h
        g[sl] = (f(xp) - f(xm)) / (2 * h)
    return g


def _call(name: str, b: dict, logp_new=None, logp_behav=None, **kw) -> L.LossOutput:
    """Call loss ``name`` on batch ``b`` (optionally with other log-probs)."""
    lp = b["logp_new"] if logp_new is None else logp_new
    lb = b["logp_behav"] if logp_behav is None else logp_behav
    m, a = b["mask"], b["advantage"]
    if name == "reinforce":
        return L.reinforce(lp, a, m, **kw)
    if name == "asymre":
        return L.asymre(lp, b["reward"], np.full_like(b["reward"], 0.5), m, delta_v=-0.1, **kw)
    if name == "rloo":
        return L.rloo(lp, lb, a, m, c=1.2, is_fresh=b["flags"], **kw)
    if name == "exgrpo":
        return L.exgrpo_shaped(lp, lb, a, m, is_replayed=b["flags"], **kw)
    # the rest through the registry (core/designs.py), as the simulator, the validator and the trainers call them
    aggregation = kw.pop("aggregation", None)
    return loss_output(DesignConfig(loss=name, clip_c=1.2, **kw), LossInputs(lp, lb, a, m), aggregation)


ALL = list(LOSSES)


def test_random_batch_is_away_from_the_kinks():
    """The finite-difference batch: no token within 1e-3 of a clip bound, no response at the RLOO cap."""
    b = _batch()
    lr = (b["logp_new"] - b["logp_behav"])[b["mask"]]
    assert np.min(np.abs(lr - LOG_HI)) > 1e-3 and np.min(np.abs(lr - LOG_LO)) > 1e-3
    seq = np.where(b["mask"], b["logp_new"] - b["logp_behav"], 0).sum(-1)
    assert np.min(np.abs(seq - math.log(1.2))) > 1e-3
    # and it exercises the branches: clipped tokens, RLOO-capped responses, M2PO masks
    assert _call("grpo", b).metrics["pg_clipfrac"].max() > 0
    assert _call("rloo", b).metrics["clip_frac"].max() > 0
    assert _call("m2po", b, tau_m2=0.04).metrics["masked_frac"].max() > 0


# --------------------------------------------------------------------------- #
# level 3: grad_logp == finite difference of loss
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("aggregation", L.AGGREGATIONS)
@pytest.mark.parametrize("name", [n for n in ALL if n not in ("rloo", "tis", "m2po-reference")])
def test_grad_logp_equals_finite_difference(name, aggregation):
    b = _batch()
    out = _call(name, b, aggregation=aggregation)
    if name == "m2po":  # the mask M is piecewise constant: check the FD never crosses a switch
        lr0 = b["logp_new"] - b["logp_behav"]
        keep0 = L.m2po_mask(np.where(b["mask"], lr0, 0), b["advantage"], b["mask"])

        def f(x):
            keep = L.m2po_mask(np.where(b["mask"], x - b["logp_behav"], 0), b["advantage"], b["mask"])
            assert np.array_equal(keep, keep0)
            return _call(name, b, logp_new=x, aggregation=aggregation).loss
    else:
        def f(x):
            return _call(name, b, logp_new=x, aggregation=aggregation).loss
    fd = _fd(f, b["logp_new"], b["mask"])
    np.testing.assert_allclose(out.grad_logp, fd, rtol=1e-6, atol=1e-11)
    assert np.all(out.grad_logp[~b["mask"]] == 0)


@pytest.mark.parametrize("aggregation", L.AGGREGATIONS)
@pytest.mark.parametrize("name", ["rloo", "tis"])
def test_rloo_grad_treats_the_weight_as_detached(name, aggregation):
    """w depends on logp_new - logp_behav only: moving both by h keeps w fixed, so the
    finite difference of that joint move is the derivative with w held constant."""
    b = _batch()
    out = _call(name, b, aggregation=aggregation)
    shift = b["logp_behav"] - b["logp_new"]
    fd = _fd(lambda x: _call(name, b, logp_new=x, logp_behav=x + shift, aggregation=aggregation).loss,
             b["logp_new"], b["mask"])
    np.testing.assert_allclose(out.grad_logp, fd, rtol=1e-6, atol=1e-11)


def test_m2po_reference_is_grpo_at_the_detached_cap():
    """Reference variant = PPO clip with eps_low = 1 - e^-tau, eps_high = e^tau - 1; tau without gradient."""
    b = _batch(seed=1, scale=0.4)
    out = _call("m2po-reference", b)
    tau = out.metrics["m2_cap"]
    assert np.all(np.isfinite(tau)) and np.all(out.metrics["masked_frac"] > 0)
    for s in range(tau.shape[0]):
        sl = slice(s, s + 1)
        g = L.grpo(b["logp_new"][sl], b["logp_behav"][sl], b["advantage"][sl], b["mask"][sl],
                   eps_low=-math.expm1(-tau[s]), eps_high=math.expm1(tau[s]))
        np.testing.assert_allclose(out.loss[s], g.loss[0], rtol=1e-12)
        np.testing.assert_allclose(out.grad_logp[sl], g.grad_logp, rtol=1e-12, atol=0)
        assert g.metrics["pg_clipfrac"][0] == out.metrics["masked_frac"][s]
        fd = _fd(lambda x, s=s, sl=sl: L.grpo(x, b["logp_behav"][sl], b["advantage"][sl], b["mask"][sl],
                                              eps_low=-math.expm1(-tau[s]), eps_high=math.expm1(tau[s])).loss,
                 b["logp_new"][sl], b["mask"][sl])
        np.testing.assert_allclose(out.grad_logp[sl], fd, rtol=1e-6, atol=1e-11)


# --------------------------------------------------------------------------- #
# GRPO / no trust region / REINFORCE
# --------------------------------------------------------------------------- #
def _three_tokens(r, seeds: bool):
    """r = (0.5, 1.0, 1.5) as three seeds of one token (seeds=True) or one response of three tokens."""
    lb = np.full(3, math.log(0.5))
    lp = lb + np.log(np.asarray(r))
    shape = (3, 1, 1) if seeds else (1, 1, 3)
    return lp.reshape(shape), lb.reshape(shape), np.ones(shape, bool), shape[:2]


def test_grpo_hand_case_positive_advantage():
    # A = +1: min(r, clip(r, 0.8, 1.2)) = (0.5, 1.0, 1.2); the clip binds (gradient 0) only at r = 1.5.
    lp, lb, m, ashape = _three_tokens([0.5, 1.0, 1.5], seeds=True)
    out = L.grpo(lp, lb, np.ones(ashape), m)
    np.testing.assert_allclose(out.loss, [-0.5, -1.0, -1.2], rtol=1e-15)  # loss = -term (one token per seed)
    np.testing.assert_allclose(out.grad_logp.ravel(), [-0.5, -1.0, 0.0], rtol=1e-15)
    np.testing.assert_array_equal(out.metrics["clip_ratio/high_mean"], [0, 0, 1])
    np.testing.assert_array_equal(out.metrics["clip_ratio/low_mean"], [0, 0, 0])
    # one response of the three tokens, token-mean: loss -(0.5 + 1 + 1.2)/3, clip fraction 1/3
    lp, lb, m, ashape = _three_tokens([0.5, 1.0, 1.5], seeds=False)
    out = L.grpo(lp, lb, np.ones(ashape), m)
    np.testing.assert_allclose(out.loss, [-2.7 / 3], rtol=1e-15)
    np.testing.assert_allclose(out.grad_logp.ravel(), [-0.5 / 3, -1.0 / 3, 0.0], rtol=1e-15)
    for key, value in [("clip_ratio/low_mean", 0), ("clip_ratio/high_mean", 1 / 3),
                       ("clip_ratio/region_mean", 1 / 3), ("pg_clipfrac", 1 / 3)]:
        assert out.metrics[key][0] == value, key


def test_grpo_hand_case_negative_advantage():
    # A = -1: min(-r, -clip(r)) = -max(r, clip(r)) = (-0.8, -1.0, -1.5); the clip binds only at r = 0.5.
    lp, lb, m, ashape = _three_tokens([0.5, 1.0, 1.5], seeds=True)
    out = L.grpo(lp, lb, -np.ones(ashape), m)
    np.testing.assert_allclose(out.loss, [0.8, 1.0, 1.5], rtol=1e-15)
    np.testing.assert_allclose(out.grad_logp.ravel(), [0.0, 1.0, 1.5], rtol=1e-15)
    np.testing.assert_array_equal(out.metrics["clip_ratio/low_mean"], [1, 0, 0])
    np.testing.assert_array_equal(out.metrics["clip_ratio/high_mean"], [0, 0, 0])
    np.testing.assert_array_equal(out.metrics["pg_clipfrac"], [1, 0, 0])
    lp, lb, m, ashape = _three_tokens([0.5, 1.0, 1.5], seeds=False)
    out = L.grpo(lp, lb, -np.ones(ashape), m)
    np.testing.assert_allclose(out.loss, [3.3 / 3], rtol=1e-15)
    assert out.metrics["clip_ratio/low_mean"][0] == 1 / 3
    assert out.metrics["clip_ratio/region_mean"][0] == 1 / 3
    assert out.metrics["pg_clipfrac"][0] == 1 / 3


def test_grpo_asymmetric_eps():
    # eps_low = 0.1, eps_high = 0.3: r = 1.25 is not clipped for A > 0, r = 0.85 is clipped for A < 0
    lp, lb, m, ashape = _three_tokens([0.85, 1.0, 1.25], seeds=True)
    pos = L.grpo(lp, lb, np.ones(ashape), m, eps_low=0.1, eps_high=0.3)
    np.testing.assert_allclose(pos.loss, [-0.85, -1.0, -1.25], rtol=1e-14)
    neg = L.grpo(lp, lb, -np.ones(ashape), m, eps_low=0.1, eps_high=0.3)
    np.testing.assert_allclose(neg.loss, [0.9, 1.0, 1.25], rtol=1e-14)
    np.testing.assert_allclose(neg.grad_logp.ravel(), [0.0, 1.0, 1.25], rtol=1e-14)


def test_eps_inf_is_plain_importance_weighted_pg():
    b = _batch(scale=1.0)
    lr = np.where(b["mask"], b["logp_new"] - b["logp_behav"], 0)
    a = np.broadcast_to(b["advantage"][..., None], lr.shape)
    expected = -np.sum(np.where(b["mask"], np.exp(lr) * a, 0), axis=(1, 2)) / b["mask"].sum(axis=(1, 2))
    g_inf = L.grpo(b["logp_new"], b["logp_behav"], b["advantage"], b["mask"], np.inf, np.inf)
    ntr = L.no_trust_region(b["logp_new"], b["logp_behav"], b["advantage"], b["mask"])
    np.testing.assert_allclose(g_inf.loss, expected, rtol=1e-13)
    np.testing.assert_array_equal(ntr.loss, g_inf.loss)
    np.testing.assert_array_equal(ntr.grad_logp, g_inf.grad_logp)
    assert np.all(ntr.metrics["pg_clipfrac"] == 0)
    # eps_high = inf alone removes only the upper clip; eps_low >= 1 removes the lower one
    half = L.grpo(b["logp_new"], b["logp_behav"], b["advantage"], b["mask"], 0.2, np.inf)
    assert np.all(half.metrics["clip_ratio/high_mean"] == 0) and half.metrics["clip_ratio/low_mean"].max() > 0
    low_off = L.grpo(b["logp_new"], b["logp_behav"], b["advantage"], b["mask"], 1.0, np.inf)
    np.testing.assert_array_equal(low_off.loss, g_inf.loss)


def test_on_policy_grpo_gradient_equals_reinforce():
    """At logp_new == logp_behav (r = 1) GRPO's gradient is REINFORCE's. The VALUES differ:
    GRPO gives -mean A (r = 1), REINFORCE -mean A log pi; only the gradients coincide."""
    b = _batch()
    for agg in L.AGGREGATIONS:
        g = L.grpo(b["logp_new"], b["logp_new"], b["advantage"], b["mask"], aggregation=agg)
        r = L.reinforce(b["logp_new"], b["advantage"], b["mask"], aggregation=agg)
        np.testing.assert_allclose(g.grad_logp, r.grad_logp, rtol=1e-15, atol=0)
        w = L._token_weights(b["mask"], agg)
        a = np.broadcast_to(b["advantage"][..., None], w.shape)
        np.testing.assert_allclose(g.loss, -np.sum(w * a, axis=(1, 2)), rtol=1e-13)
        assert np.all(g.metrics["pg_clipfrac"] == 0)
        np.testing.assert_allclose(g.metrics["ess_frac"], 1.0, rtol=1e-15)
        np.testing.assert_allclose(g.metrics["m2"], 0.0, atol=0)
        np.testing.assert_allclose(g.metrics["kl_k3"], 0.0, atol=0)


def test_reinforce_hand_value_and_aggregations():
    # one seed, two responses: (log pi) = (-1, -2 | -3, pad), A = (2, -1)
    lp = np.array([[[-1.0, -2.0], [-3.0, 0.0]]])
    m = np.array([[[True, True], [True, False]]])
    A = np.array([[2.0, -1.0]])
    tok = L.reinforce(lp, A, m)  # -(2*(-1) + 2*(-2) + (-1)(-3)) / 3 = 1
    np.testing.assert_allclose(tok.loss, [1.0], rtol=1e-15)
    np.testing.assert_allclose(tok.grad_logp, [[[-2 / 3, -2 / 3], [1 / 3, 0.0]]], rtol=1e-15)
    seq = L.reinforce(lp, A, m, aggregation="seq-mean-token-sum")  # -(2(-3) + (-1)(-3)) / 2 = 1.5
    np.testing.assert_allclose(seq.loss, [1.5], rtol=1e-15)
    mean = L.reinforce(lp, A, m, aggregation="seq-mean-token-mean")  # -(2(-1.5) + (-1)(-3)) / 2 = 0
    np.testing.assert_allclose(mean.loss, [0.0], atol=1e-15)
    np.testing.assert_allclose(mean.grad_logp, [[[-0.5, -0.5], [0.5, 0.0]]], rtol=1e-15)
    with pytest.raises(ValueError, match="aggregation must be one of token-mean"):
        L.reinforce(lp, A, m, aggregation="sum")


def test_per_token_advantage_equals_broadcast_per_response_advantage():
    b = _batch()
    a_tok = np.broadcast_to(b["advantage"][..., None], b["mask"].shape)
    for name in ("grpo", "m2po", "m2po-reference", "no-trust-region"):
        x = _call(name, b)
        y = _call(name, dict(b, advantage=a_tok))
        np.testing.assert_array_equal(x.loss, y.loss)
        np.testing.assert_array_equal(x.grad_logp, y.grad_logp)


# --------------------------------------------------------------------------- #
# M2PO
# --------------------------------------------------------------------------- #
# Hand-made set: log r = (0.5, -0.4, 0.3, 0.1, -0.05), one response, A = +1.
# Candidates T = (A > 0 and r > 1): tokens 0, 2, 3 (tokens 1, 4 have r < 1, where a
# PPO clip could never bind for A > 0). (log r)^2 over T = (0.25, 0.09, 0.01).
# Algorithm 1, tau = 0.04: mean_T = 0.35/3 = 0.1167 > 0.04 -> mask 0; (0.09 + 0.01)/2 = 0.05
# > 0.04 -> mask 2; 0.01 <= 0.04 -> stop. Mask = {0, 2}.
# Reference, tau = 0.04 (|T| = 3, budget * |T| = 0.12): capping k of the sorted values at the
# k-th one gives k c_k + rest = 0.35, 0.19, 0.03 for k = 1, 2, 3, so K = 2 values exceed the
# cap and 2 c + 0.01 = 0.12 -> c = tau^2 = 0.055, tau = 0.2345; masked {0, 2} (0.3 > 0.2345).
# At tau_M2 = 0.06 they differ: Algorithm 1 stops after token 0 (0.05 <= 0.06): {0};
# the reference solves 2 c + 0.01 = 0.18 -> c = 0.085, tau = 0.2915 < 0.3: {0, 2}.
HAND_LR = np.array([0.5, -0.4, 0.3, 0.1, -0.05])


def _hand_set(mixed_signs: bool):
    if not mixed_signs:
        lr = HAND_LR.reshape(1, 1, 5)
        A = np.array([[1.0]])
        m = np.ones((1, 1, 5), bool)
        return lr, A, m, [[[False, True, False, True, True]]]
    # The same T from two responses: (0.5, -0.4, 0.3 | A = +1) and (-0.1, 0.7, pad | A = -1).
    # Token (1, 1) has the largest (log r)^2 = 0.49 but A < 0 with r > 1: not in T, never masked.
    lr = np.array([[[0.5, -0.4, 0.3], [-0.1, 0.7, 0.0]]])
    A = np.array([[1.0, -1.0]])
    m = np.array([[[True, True, True], [True, True, False]]])
    return lr, A, m, [[[False, True, False], [True, True, False]]]


@pytest.mark.parametrize("mixed_signs", [False, True])
def test_m2po_algorithm1_hand_set(mixed_signs):
    lr, A, m, expected = _hand_set(mixed_signs)
    keep = L.m2po_mask(lr, A, m, tau_m2=0.04)
    np.testing.assert_array_equal(keep, expected)
    ref = L.m2po_mask(lr, A, m, tau_m2=0.04, variant="reference")
    np.testing.assert_array_equal(ref, expected)  # same set at tau = 0.04
    keep06 = L.m2po_mask(lr, A, m, tau_m2=0.06)
    ref06 = L.m2po_mask(lr, A, m, tau_m2=0.06, variant="reference")
    exp06 = np.array(expected) | (m & (lr == 0.3))  # Algorithm 1 keeps token 2 at 0.06
    np.testing.assert_array_equal(keep06, exp06)
    np.testing.assert_array_equal(ref06, expected)  # the reference still masks it


def test_m2po_hand_loss_and_metrics():
    lr, A, m, _ = _hand_set(False)
    lb = np.full(lr.shape, -2.0)
    out = L.m2po(lb + lr, lb, A, m, tau_m2=0.04)
    kept = np.exp([-0.4, 0.1, -0.05])
    np.testing.assert_allclose(out.loss, [-kept.sum() / 5], rtol=1e-14)  # Eq. (5): divide by ALL 5 tokens
    np.testing.assert_allclose(out.grad_logp.ravel(), [0, -kept[0] / 5, 0, -kept[1] / 5, -kept[2] / 5],
                               rtol=1e-14)
    np.testing.assert_allclose(out.metrics["masked_frac"], [0.4], rtol=1e-15)
    np.testing.assert_allclose(out.metrics["m2"], [(0.25 + 0.16 + 0.09 + 0.01 + 0.0025) / 5], rtol=1e-13)
    # M2 of what is left exceeds tau: Algorithm 1 bounds the mean over T only (0.01 here);
    # the non-candidate token with log r = -0.4 stays and is not counted.
    np.testing.assert_allclose(out.metrics["m2_after"], [(0.16 + 0.01 + 0.0025) / 3], rtol=1e-13)
    assert out.metrics["m2_cap"][0] == np.inf
    ref = L.m2po(lb + lr, lb, A, m, tau_m2=0.04, variant="reference")
    tau = math.sqrt(0.055)
    np.testing.assert_allclose(ref.metrics["m2_cap"], [tau], rtol=1e-12)
    # PPO surrogate with |log r| <= tau: masked tokens keep the constant e^tau A in the value
    np.testing.assert_allclose(ref.loss, [-(kept.sum() + 2 * math.exp(tau)) / 5], rtol=1e-12)
    np.testing.assert_array_equal(ref.grad_logp, out.grad_logp)
    ref06 = L.m2po(lb + lr, lb, A, m, tau_m2=0.06, variant="reference")
    np.testing.assert_allclose(ref06.metrics["m2_cap"], [math.sqrt(0.085)], rtol=1e-12)
    np.testing.assert_allclose(ref06.metrics["masked_frac"], [0.4], rtol=1e-15)
    alg06 = L.m2po(lb + lr, lb, A, m, tau_m2=0.06)
    np.testing.assert_allclose(alg06.metrics["masked_frac"], [0.2], rtol=1e-15)


def test_m2po_ties():
    # log r = (0.5, 0.5, 0.25, 0.25), A = +1, tau = 0.14 (all squares exact in binary):
    # Algorithm 1: mean 0.15625 > 0.14 -> mask ONE 0.5 (argmax: the first) -> 0.125 <= 0.14.
    # Reference: budget |T| = 0.56; k c_k + rest = 0.625, 0.625, 0.25 -> K = 2,
    # c = (0.56 - 0.125)/2 = 0.2175: both tied tokens are above the cap.
    lr = np.array([[[0.5, 0.5, 0.25, 0.25]]])
    A, m = np.ones((1, 1)), np.ones((1, 1, 4), bool)
    np.testing.assert_array_equal(L.m2po_mask(lr, A, m, 0.14), [[[False, True, True, True]]])
    np.testing.assert_array_equal(L.m2po_mask(lr, A, m, 0.14, "reference"), [[[False, False, True, True]]])
    out = L.m2po(lr - 1.0, np.full(lr.shape, -1.0), A, m, 0.14, "reference")
    np.testing.assert_allclose(out.metrics["m2_cap"], [math.sqrt(0.2175)], rtol=1e-14)
    # budget 0: every candidate is masked (cap 0); budget inf: none
    np.testing.assert_array_equal(L.m2po_mask(lr, A, m, 0.0), False)
    np.testing.assert_array_equal(L.m2po_mask(lr, A, m, 0.0, "reference"), False)
    np.testing.assert_array_equal(L.m2po_mask(lr, A, m, np.inf, "reference"), True)


def _naive_algorithm1(lr, A, m, tau):
    """Algorithm 1 literally, for one seed: while mean_T M2 > tau, remove argmax_T M2."""
    lr, A, m = lr.ravel(), np.broadcast_to(A[:, None], m.shape).ravel(), m.ravel()
    keep = m.copy()
    T = [i for i in range(lr.size) if m[i] and ((A[i] > 0 and lr[i] > 0) or (A[i] < 0 and lr[i] < 0))]
    while T and np.mean([lr[i] ** 2 for i in T]) > tau:
        j = T[int(np.argmax([lr[i] ** 2 for i in T]))]
        keep[j] = False
        T.remove(j)
    return keep


def _naive_reference(lr, A, m, tau):
    """Reference variant for one seed, cap by bisection on the winsorised mean."""
    lr, A, m = lr.ravel(), np.broadcast_to(A[:, None], m.shape).ravel(), m.ravel()
    T = m & (((A > 0) & (lr > 0)) | ((A < 0) & (lr < 0)))
    d2 = lr[T] ** 2
    if d2.size == 0 or d2.mean() <= tau:
        return m.copy(), np.inf
    lo, hi = 0.0, d2.max()
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if np.minimum(d2, mid).mean() <= tau else (lo, mid)
    cap = math.sqrt(lo)
    return m & ~(T & (np.abs(lr) > cap)), cap


@pytest.mark.parametrize("tau", [0.0, 0.01, 0.04, 0.1])
def test_m2po_vectorized_equals_naive_loop(tau):
    b = _batch(seed=3, S=5, n=8, T=16, scale=0.35)
    lr = np.where(b["mask"], b["logp_new"] - b["logp_behav"], 0.0)
    keep = L.m2po_mask(lr, b["advantage"], b["mask"], tau_m2=tau)
    ref = L.m2po_mask(lr, b["advantage"], b["mask"], tau_m2=tau, variant="reference")
    caps = L.m2po(b["logp_new"], b["logp_behav"], b["advantage"], b["mask"], tau, "reference").metrics["m2_cap"]
    for s in range(lr.shape[0]):
        naive = _naive_algorithm1(lr[s], b["advantage"][s], b["mask"][s], tau)
        np.testing.assert_array_equal(keep[s].ravel(), naive)
        naive_ref, cap = _naive_reference(lr[s], b["advantage"][s], b["mask"][s], tau)
        np.testing.assert_array_equal(ref[s].ravel(), naive_ref)
        np.testing.assert_allclose(caps[s], cap, rtol=1e-9, atol=1e-12)
    # Algorithm 1's stopping rule holds: the candidates left have mean M2 <= tau
    T = L._m2po_candidates(lr, np.broadcast_to(b["advantage"][..., None], lr.shape), b["mask"])
    left = T & keep
    for s in range(lr.shape[0]):
        if left[s].any():
            assert np.mean(lr[s][left[s]] ** 2) <= tau


def test_m2po_reference_masks_at_least_as_many_as_algorithm1():
    b = _batch(seed=4, S=8, n=16, T=32, scale=0.4)
    lr = np.where(b["mask"], b["logp_new"] - b["logp_behav"], 0.0)
    more = 0
    for tau in (0.01, 0.04, 0.1):
        alg = L.m2po_mask(lr, b["advantage"], b["mask"], tau)
        ref = L.m2po_mask(lr, b["advantage"], b["mask"], tau, "reference")
        assert np.all(ref <= alg)  # every token Algorithm 1 masks, the reference masks too
        more += int((alg & ~ref).sum())
    assert more > 0  # and strictly more on this data


def test_m2po_no_mask_when_m2_is_small_and_padding_is_never_kept():
    b = _batch(scale=0.01)
    out = L.m2po(b["logp_new"], b["logp_behav"], b["advantage"], b["mask"])
    ntr = L.no_trust_region(b["logp_new"], b["logp_behav"], b["advantage"], b["mask"])
    np.testing.assert_array_equal(out.metrics["masked_frac"], 0)
    np.testing.assert_allclose(out.loss, ntr.loss, rtol=1e-14)
    keep = L.m2po_mask(np.where(b["mask"], b["logp_new"] - b["logp_behav"], 0), b["advantage"], b["mask"])
    np.testing.assert_array_equal(keep, b["mask"])
    with pytest.raises(ValueError, match="variant must be 'algorithm1' or 'reference'"):
        L.m2po_mask(np.zeros((1, 1, 2)), np.ones((1, 1)), np.ones((1, 1, 2), bool), variant="paper")


# --------------------------------------------------------------------------- #
# RLOO, AsymRE, ExGRPO
# --------------------------------------------------------------------------- #
def test_rloo_weights_hand_case_and_no_overflow():
    # responses: 0 fresh (log ratio 10 but w = 1), 1 replayed log ratio 10 -> w = c = 3,
    # 2 replayed log ratio 1e4 -> w = 3 without overflow, 3 replayed log ratio log 2 -> w = 2.
    lb = np.full((1, 4, 2), -1.0)
    seq_lr = np.array([10.0, 10.0, 1e4, math.log(2.0)])
    lp = lb + np.stack([seq_lr / 2, seq_lr / 2], axis=-1)[None]  # two tokens per response
    m = np.ones((1, 4, 2), bool)
    A = np.array([[1.0, -1.0, 0.5, 2.0]])
    fresh = np.array([[True, False, False, False]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = L.rloo(lp, lb, A, m, c=3.0, is_fresh=fresh)
    w = np.array([1.0, 3.0, 3.0, 2.0])
    logpi = lp.sum(-1)[0]  # (4,) log pi(y|x) = sum of token log-probs
    np.testing.assert_allclose(out.loss, [-np.sum(w * A[0] * logpi) / 4], rtol=1e-13)  # Eq. (3), 1/n
    np.testing.assert_allclose(out.grad_logp[0], np.repeat((-w * A[0] / 4)[:, None], 2, axis=1), rtol=1e-15)
    np.testing.assert_allclose(out.metrics["clip_frac"], [2 / 3], rtol=1e-15)
    np.testing.assert_allclose(out.metrics["weight_mean"], [8 / 3], rtol=1e-15)
    np.testing.assert_allclose(out.metrics["ess_frac"], [64 / (3 * 22)], rtol=1e-14)  # (3+3+2)^2 / (3 * 22)
    np.testing.assert_allclose(out.metrics["replay_frac"], [0.75], rtol=1e-15)
    # all fresh: weights 1, ESS fraction 1, no clipping
    all_fresh = L.rloo(lp, lb, A, m, c=3.0, is_fresh=np.ones((1, 4), bool))
    np.testing.assert_allclose(all_fresh.grad_logp[0], np.repeat((-A[0] / 4)[:, None], 2, axis=1), rtol=1e-15)
    assert all_fresh.metrics["ess_frac"][0] == 1 and all_fresh.metrics["clip_frac"][0] == 0
    assert all_fresh.metrics["weight_mean"][0] == 1


def test_rloo_with_leave_one_out_advantage_hand_case():
    # rewards (1, 0, 0.1, 1): A_i = r_i - mean of the others
    reward = np.array([[[1.0, 0.0, 0.1, 1.0]]])  # (S, g, G)
    A = adv_mod.leave_one_out(reward)
    np.testing.assert_allclose(A[0, 0], [1 - 1.1 / 3, 0 - 2.1 / 3, 0.1 - 2.0 / 3, 1 - 1.1 / 3], rtol=1e-14)
    np.testing.assert_allclose(A, 4 / 3 * adv_mod.group_mean_baseline(reward), rtol=1e-14)
    lp = np.full((1, 4, 1), -0.5)
    out = L.rloo(lp, lp, A[:, 0], np.ones((1, 4, 1), bool), c=1.0, is_fresh=np.zeros((1, 4), bool))
    np.testing.assert_allclose(out.loss, [0.5 * A.sum() / 4], atol=1e-15)  # sum_i A_i = 0
    np.testing.assert_allclose(out.grad_logp.ravel(), -A.ravel() / 4, rtol=1e-14)
    assert out.metrics["clip_frac"][0] == 1  # r = 1 = c: at the cap


def test_asymre_hand_value():
    # rewards (1, 0), V = 0.5, delta V = -0.1: coefficients (0.6, -0.4);
    # log pi(z) = (-0.5 - 1.0, -2.0) = (-1.5, -2.0); loss = -(0.6 (-1.5) - 0.4 (-2.0)) / 2 = 0.05
    lp = np.array([[[-0.5, -1.0], [-2.0, 7.0]]])
    m = np.array([[[True, True], [True, False]]])
    out = L.asymre(lp, np.array([[1.0, 0.0]]), np.array([[0.5, 0.5]]), m, delta_v=-0.1)
    np.testing.assert_allclose(out.loss, [0.05], rtol=1e-13)
    np.testing.assert_allclose(out.grad_logp, [[[-0.3, -0.3], [0.2, 0.0]]], rtol=1e-14)
    assert out.metrics == {}


def test_asymre_at_delta_zero_is_reinforce_with_group_mean_baseline():
    b = _batch()
    reward = b["reward"]
    V = np.broadcast_to(reward.mean(axis=1, keepdims=True), reward.shape)  # one group per seed
    a = adv_mod.group_mean_baseline(reward[:, None, :])[:, 0, :]
    x = L.asymre(b["logp_new"], reward, V, b["mask"], logp_behav=b["logp_behav"])
    y = L.reinforce(b["logp_new"], a, b["mask"], aggregation="seq-mean-token-sum", logp_behav=b["logp_behav"])
    np.testing.assert_allclose(x.loss, y.loss, rtol=1e-13)
    np.testing.assert_allclose(x.grad_logp, y.grad_logp, rtol=1e-13)
    assert set(x.metrics) == {"is_ratio_min", "is_ratio_mean", "is_ratio_max", "is_ratio_std",
                              "ess_frac", "kl_k1", "kl_k2", "kl_k3", "m2", "d2", "chi2"}


def test_exgrpo_shaping_gradient_at_w_equal_beta_is_a_quarter():
    # replayed response, every token ratio w = beta = 0.1: f(w) = 1/2, d f(w) A / d log pi = A/4
    lb = np.full((1, 1, 3), -1.0)
    lp = lb + math.log(0.1)
    A = np.array([[2.0]])
    out = L.exgrpo_shaped(lp, lb, A, np.ones((1, 1, 3), bool), is_replayed=np.array([[True]]),
                          aggregation="seq-mean-token-sum")
    np.testing.assert_allclose(out.grad_logp.ravel(), [-0.5] * 3, rtol=1e-14)  # -A/4 per token
    np.testing.assert_allclose(out.loss, [-3 * 0.5 * 2.0], rtol=1e-14)
    np.testing.assert_allclose(out.metrics["shaping_weight_mean"], [0.25], rtol=1e-14)
    # at w = 1 the factor is beta / (1 + beta)^2 = 0.0826
    one = L.exgrpo_shaped(lb, lb, A, np.ones((1, 1, 3), bool), is_replayed=np.array([[True]]),
                          aggregation="seq-mean-token-sum")
    np.testing.assert_allclose(one.grad_logp.ravel(), [-2.0 * 0.1 / 1.1**2] * 3, rtol=1e-14)


def test_exgrpo_fresh_part_is_grpo_and_huge_ratios_saturate():
    b = _batch()
    none = L.exgrpo_shaped(b["logp_new"], b["logp_behav"], b["advantage"], b["mask"],
                           is_replayed=np.zeros(b["advantage"].shape, bool))
    g = _call("grpo", b)
    np.testing.assert_array_equal(none.loss, g.loss)
    np.testing.assert_array_equal(none.grad_logp, g.grad_logp)
    # a replayed token with log w = 1e4: f = 1, zero gradient, no overflow warning
    lb = np.full((1, 1, 2), -1.0)
    lp = lb + np.array([[[1e4, -1e4]]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = L.exgrpo_shaped(lp, lb, np.array([[1.0]]), np.ones((1, 1, 2), bool), np.array([[True]]))
    np.testing.assert_allclose(out.loss, [-0.5], rtol=1e-15)  # (f = 1) + (f = 0), token-mean
    np.testing.assert_array_equal(out.grad_logp, 0.0)


# --------------------------------------------------------------------------- #
# padding, overflow, registries
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("name", ALL)
def test_padding_gets_zero_gradient_and_does_not_change_the_loss(name):
    b = _batch()
    out = _call(name, b)
    pad = ~b["mask"]
    lp2 = np.where(pad, 5.0, b["logp_new"])  # other garbage (positive, huge)
    lb2 = np.where(pad, -1e300, b["logp_behav"])
    other = _call(name, b, logp_new=lp2, logp_behav=lb2)
    np.testing.assert_array_equal(other.loss, out.loss)
    np.testing.assert_array_equal(other.grad_logp, out.grad_logp)
    assert np.all(out.grad_logp[pad] == 0) and np.all(np.isfinite(out.grad_logp))
    for key, v in out.metrics.items():
        assert v.shape == (3,), key
        np.testing.assert_array_equal(other.metrics[key], v)


def test_huge_log_ratios_never_warn():
    lb = np.full((2, 2, 2), -1.0)
    lp = lb + np.array([[[1e4, 1e4], [-1e4, 0.5]], [[1e4, -1e4], [0.0, 0.0]]])
    m = np.ones((2, 2, 2), bool)
    A = np.array([[1.0, -1.0], [-1.0, 1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clipped = L.grpo(lp, lb, np.abs(A), m)  # A > 0: clip binds, finite
        assert np.all(np.isfinite(clipped.loss))
        neg = L.grpo(lp, lb, -np.ones((2, 2)), m)  # A < 0, r = e^1e4: PPO's min is unbounded -> +inf
        assert np.all(neg.loss == np.inf)
        ntr = L.no_trust_region(lp, lb, np.ones((2, 2)), m)
        assert np.all(ntr.loss == -np.inf)
        for variant in ("algorithm1", "reference"):
            out = L.m2po(lp, lb, np.abs(A), m, variant=variant)
            assert np.all(np.isfinite(out.loss)), variant  # the huge tokens are in T and get masked
        assert clipped.metrics["is_ratio_max"][0] == np.inf
        assert clipped.metrics["is_ratio_min"][0] == 0.0


def test_registries():
    assert list(LOSSES) == ["reinforce", "grpo", "no-trust-region", "m2po", "m2po-reference", "rloo", "tis",
                            "asymre", "exgrpo"]
    with pytest.raises(ValueError, match=r"^loss must be one of reinforce, grpo, .*, exgrpo, got 'ppo'$"):
        check_choice("loss", "ppo", LOSSES)
    b = _batch()  # the registry's m2po-reference is the reference function itself
    ref = L.m2po_reference(b["logp_new"], b["logp_behav"], b["advantage"], b["mask"])
    np.testing.assert_array_equal(_call("m2po-reference", b).grad_logp, ref.grad_logp)
    assert adv_mod.get_advantage("leave-one-out") is adv_mod.leave_one_out
    assert adv_mod.get_advantage("grpo") is adv_mod.group_advantage
    with pytest.raises(ValueError, match=r"advantage must be one of grpo, dr-grpo, group-mean, leave-one-out"):
        adv_mod.get_advantage("gae")


def test_input_validation():
    m = np.ones((1, 1, 2), bool)
    with pytest.raises(ValueError, match="at least one real"):
        L.reinforce(np.zeros((1, 1, 2)), np.ones((1, 1)), np.zeros((1, 1, 2), bool))
    with pytest.raises(ValueError, match="logp_new must be finite"):
        L.reinforce(np.array([[[np.nan, 0.0]]]), np.ones((1, 1)), m)
    with pytest.raises(ValueError, match="advantage must have shape"):
        L.reinforce(np.zeros((1, 1, 2)), np.ones((1, 2)), m)
    with pytest.raises(ValueError, match="eps_low must be >= 0"):
        L.grpo(np.zeros((1, 1, 2)), np.zeros((1, 1, 2)), np.ones((1, 1)), m, eps_low=-0.1)
    with pytest.raises(ValueError, match="c must be > 0"):
        L.rloo(np.zeros((1, 1, 2)), np.zeros((1, 1, 2)), np.ones((1, 1)), m, c=0.0, is_fresh=np.ones((1, 1), bool))


# --------------------------------------------------------------------------- #
# advantages
# --------------------------------------------------------------------------- #
def test_group_advantage_hand_values():
    reward = np.array([[[1.0, 0.0, 0.0, 1.0], [0.1, 0.1, 0.1, 0.1]]])  # (S=1, g=2, G=4)
    a = adv_mod.group_advantage(reward)
    std = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1), as torch .std() in TRL / verl
    np.testing.assert_allclose(a[0, 0], np.array([0.5, -0.5, -0.5, 0.5]) / (std + 1e-6), rtol=1e-14)
    np.testing.assert_array_equal(a[0, 1], 0.0)  # constant group: no signal
    a0 = adv_mod.group_advantage(reward, ddof=0, eps=0.0)
    np.testing.assert_allclose(a0[0, 0], [1, -1, -1, 1], rtol=1e-14)
    np.testing.assert_array_equal(a0[0, 1], 0.0)  # 0/0 guarded
    dr = adv_mod.group_advantage(reward, normalize_std=False)
    np.testing.assert_array_equal(dr, adv_mod.group_mean_baseline(reward))
    np.testing.assert_allclose(dr[0, 0], [0.5, -0.5, -0.5, 0.5], rtol=1e-15)
    np.testing.assert_allclose(adv_mod.get_advantage("dr-grpo")(reward), dr, rtol=0)
    with pytest.raises(ValueError, match=r"shape \(S, g, G\)"):
        adv_mod.group_advantage(np.ones((2, 4)))


@pytest.mark.parametrize("eps", [-1e-6, -1e300, math.nan, math.inf, -math.inf, np.float64(-1.0), np.nan, -1,
                                 np.array([0.1, -0.1])])
def test_group_advantage_refuses_the_eps_require_nonnegative_refuses(eps):
    # a plain float in [0, inf) skips the array check; every other value still meets it, with its message
    from replay_theory.checks import require_nonnegative

    with pytest.raises(ValueError) as want:
        require_nonnegative("eps", eps)
    with pytest.raises(ValueError) as got:
        adv_mod.group_advantage(np.ones((1, 1, 4)), eps=eps)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("eps", [0.0, -0.0, 1e-6, 5e-324, 1e300, 0, 2, np.float64(1e-6), np.float32(0.5), True])
def test_group_advantage_accepts_the_eps_require_nonnegative_accepts(eps):
    from replay_theory.checks import require_nonnegative

    require_nonnegative("eps", eps)
    r = np.array([[[1.0, 0.0, 0.0, 1.0]]])
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.where(r.std(axis=-1, ddof=1, keepdims=True) == 0, 0.0,
                        (r - r.mean(axis=-1, keepdims=True)) / (r.std(axis=-1, ddof=1, keepdims=True) + eps))
    np.testing.assert_array_equal(adv_mod.group_advantage(r, eps=eps), want)


@pytest.mark.parametrize("scale", [0.0, 0.3, 40.0])  # on-policy (Var r = 0), typical, huge ratios
def test_ratio_metrics_are_the_kernels_estimators_bit_for_bit(scale):
    """The losses' IS metrics and theory.divergences' sample functions are the statistics kernel's estimators on the
    same sums (theory/moments.py): equal bit for bit, with or without padding, in one key order."""
    from replay_theory.core.losses import _ratio_metrics
    from replay_theory.theory.divergences import ess_kish_fraction, ratio_stats, sample_statistics

    lr = scale * np.random.default_rng(5).standard_normal((4, 37, 1))  # (S, n, L)
    flat, every = lr.reshape(4, -1), np.ones((4, 37), dtype=bool)
    fast = _ratio_metrics(lr, np.ones(lr.shape, dtype=bool))
    slow = {**ratio_stats(flat, every), **sample_statistics(flat, every)}
    for name, value in fast.items():
        np.testing.assert_array_equal(value, slow[name], err_msg=name)
    np.testing.assert_array_equal(fast["ess_frac"], ess_kish_fraction(flat))
    padded = np.ones(lr.shape, dtype=bool)
    padded[0, -1] = False  # the masked path: same keys in the same order, the same numbers as dropping the token
    masked = _ratio_metrics(np.where(padded, lr, np.nan), padded)
    assert list(masked) == list(fast)
    for name, value in masked.items():
        np.testing.assert_array_equal(value[1:], fast[name][1:], err_msg=name)
        dropped = {**ratio_stats(flat[0, :-1]), **sample_statistics(flat[0, :-1])}[name]
        np.testing.assert_array_equal(value[0], dropped, err_msg=name)


@pytest.mark.parametrize("G", [2, 5, 8, 9, 16, 130])
@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize("kind", ["verifier", "continuous"])
def test_group_advantage_uses_numpys_std_bit_for_bit(G, ddof, kind):
    # the group sums run over a transposed copy (theory.moments.column_sums): numpy's mean and std all the same,
    # for groups below 8, of 8, between, and above numpy's pairwise block of 128
    rng = np.random.default_rng(9)
    shape = (5, 7, G)
    r = rng.choice([0.0, 0.1, 1.0], size=shape) if kind == "verifier" else rng.standard_normal(shape) * 3.0
    std = r.std(axis=-1, ddof=ddof, keepdims=True)
    centred = r - r.mean(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        want = np.where(std == 0.0, 0.0, centred / (std + 1e-6))
    got = adv_mod.group_advantage(r, ddof=ddof)
    assert got.flags.c_contiguous and got.shape == shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(adv_mod.group_advantage(r, normalize_std=False), centred)  # Dr. GRPO


def test_m2po_rows_that_cannot_bind_skip_the_sort_and_match_the_naive_loop():
    # rows whose mean_T M2 is already <= tau take the no-sort path (m2po_may_bind False); rows that bind take the
    # sort; a batch mixing both must equal Algorithm 1 and the reference code run literally on each row
    b = _batch(seed=5, S=6, n=8, T=16, scale=0.3)
    lr = np.where(b["mask"], b["logp_new"] - b["logp_behav"], 0.0)
    lr[::2] *= 0.1  # even rows: M2 ~ 1e-3, far below tau
    tau = 0.04
    adv_tok = np.broadcast_to(b["advantage"][..., None], lr.shape)
    binds = L.m2po_may_bind(lr.reshape(6, -1), np.where(b["mask"], adv_tok, 0.0).reshape(6, -1), tau)
    assert binds.tolist() == [False, True, False, True, False, True]
    for variant, naive in (("algorithm1", _naive_algorithm1), ("reference", _naive_reference)):
        keep = L.m2po_mask(lr, b["advantage"], b["mask"], tau, variant)
        for s in range(6):
            expected = naive(lr[s], b["advantage"][s], b["mask"][s], tau)
            np.testing.assert_array_equal(keep[s].ravel(), expected[0] if variant == "reference" else expected)
        assert (keep != b["mask"]).any(axis=(1, 2)).tolist() == binds.tolist()  # the binding rows do mask
        np.testing.assert_array_equal(L.m2po_masks(lr, b["advantage"], b["mask"], tau)[variant], keep)  # one sort


@pytest.mark.parametrize("name", ALL)
def test_metrics_are_computed_when_first_read_and_once(name, monkeypatch):
    # the benchmark's loop reads only grad_logp: the importance-ratio statistics must not run until a reader asks
    b = _batch()
    real, calls = L._ratio_metrics, []

    def counted(lr, m):
        calls.append(1)
        return real(lr, m)

    monkeypatch.setattr(L, "_ratio_metrics", counted)
    if name == "reinforce":  # the IS diagnostics only with a behaviour policy given
        out = L.reinforce(b["logp_new"], b["advantage"], b["mask"], logp_behav=b["logp_behav"])
    elif name == "asymre":
        out = L.asymre(b["logp_new"], b["reward"], np.full_like(b["reward"], 0.5), b["mask"],
                       logp_behav=b["logp_behav"])
    else:
        out = _call(name, b)
    assert calls == [] and isinstance(out.metrics, L.LazyMetrics)
    values = dict(out.metrics)
    assert len(calls) == 1 and dict(out.metrics) == values and len(calls) == 1  # computed once, then kept
    m = np.broadcast_to(b["mask"], b["logp_new"].shape)
    direct = real(np.where(m, b["logp_new"] - b["logp_behav"], 0.0), m)  # the statistics of the real tokens
    renamed = {"ess_frac": "ess_frac_token"} if name in ("rloo", "tis") else {}
    for key, value in direct.items():
        np.testing.assert_allclose(values[renamed.get(key, key)], value, rtol=1e-12)
    assert out.metrics == values  # a Mapping equals the dict of its items


@pytest.mark.parametrize("name", ["grpo", "no-trust-region", "reinforce", "asymre"])
def test_stacked_metrics_of_several_batches_are_each_batch_s_own(name):
    # the engine's recorder computes a chunk of steps' metrics in one call on the batches stacked on the seed axis:
    # every row must be the number the batch gives alone (padding and a fully real row mixed in)
    batches = [_batch(seed=s, S=3) for s in range(3)]
    batches[1]["mask"][:] = True  # a batch without padding next to padded ones
    batches[1]["logp_new"] = np.where(np.isnan(batches[1]["logp_new"]), -1.0, batches[1]["logp_new"])
    batches[1]["logp_behav"] = np.where(batches[1]["logp_behav"] > 0, -1.2, batches[1]["logp_behav"])

    def output(b):
        if name == "reinforce":
            return L.reinforce(b["logp_new"], b["advantage"], b["mask"], logp_behav=b["logp_behav"])
        if name == "asymre":
            return L.asymre(b["logp_new"], b["reward"], np.full_like(b["reward"], 0.5), b["mask"],
                            logp_behav=b["logp_behav"])
        return _call(name, b)

    lazy = [output(b).metrics for b in batches]
    alone = [dict(output(b).metrics) for b in batches]
    assert len({m.stack_key for m in lazy}) == 1 and lazy[0].stack_key is not None
    stacked = L.LazyMetrics.stacked(lazy)
    for key, value in stacked.items():
        np.testing.assert_array_equal(value, np.concatenate([a[key] for a in alone]))
        for item, a in zip(lazy, alone):
            np.testing.assert_array_equal(item[key], a[key])  # each keeps its own rows
    # one already read alone: the rest still stack, the values the same
    again = [output(b).metrics for b in batches]
    dict(again[1])
    for key, value in L.LazyMetrics.stacked(again).items():
        np.testing.assert_array_equal(value, stacked[key])


def test_all_finite_by_the_sum_agrees_with_each_entry():
    """losses._all_finite: a finite sum answers at once, a sum that is not finite (a NaN or an inf entry, or finite
    entries that overflow it) is answered entry by entry."""
    assert L._all_finite(np.array([[1.0, -2.0], [0.0, 3.5]]))
    assert L._all_finite(np.array([1e308, 1e308, -5.0]))  # the sum overflows, every entry is finite
    for bad in (np.nan, np.inf, -np.inf):
        assert not L._all_finite(np.array([1.0, bad, 2.0]))
    assert not L._all_finite(np.array([np.inf, -np.inf]))  # the sum is NaN
    assert L._all_finite(np.zeros((2, 0, 1)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # quiet: the overflow and inf - inf of the sum are not reported
        assert L._all_finite(np.array([1e308, 1e308])) and not L._all_finite(np.array([np.inf, -np.inf]))


def test_loss_inputs_name_the_non_finite_log_prob_without_a_warning():
    """_inputs checks logp_new and logp_behav through their difference, and still names the one that is not finite
    (logp_new first), without a floating-point warning; finite inputs whose difference overflows pass as before."""
    m = np.ones((1, 2, 1), bool)
    finite = np.array([[[-1.0], [-2.0]]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for new, behav, name in ((np.full((1, 2, 1), np.inf), finite, "logp_new"),
                                 (finite, np.full((1, 2, 1), np.nan), "logp_behav"),
                                 (np.full((1, 2, 1), np.inf), np.full((1, 2, 1), np.inf), "logp_new")):
            with pytest.raises(ValueError, match=name):
                L._inputs(new, m, behav)
        padded = np.array([[[np.nan], [-1.0]]])  # NaN on padding is never read
        lp, _, lb, lr = L._inputs(padded, np.array([[[False], [True]]]), finite)
        assert lr.tolist() == [[[0.0], [1.0]]]
    with np.errstate(over="ignore"):
        *_, lr = L._inputs(np.full((1, 2, 1), 1e308), m, np.full((1, 2, 1), -1e308))
    assert np.isposinf(lr).all()

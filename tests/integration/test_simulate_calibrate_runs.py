"""simulate/calibrate.py: exact gradients against Monte Carlo (bandit) and full enumeration (token MDP), the
profile file's forms and rho record, the fitted rho with a sampled reference against the one measured with
the exact gradient (bandit and token MDP), and the noise scale B_noise: a hand case through the code path, the
profile record's JSON round trip, and the per-sample estimator against the exact-|E G|^2 value on the bandit.

Integration tier: the slower tests of this module (calibration runs on the bandit and the token MDP); the fast ones
are in tests/unit/test_simulate_calibrate.py.
"""

import itertools
import math

import numpy as np
import pytest

from replay_theory.core.designs import make_advantage
from replay_theory.core.pipeline import EnvBackend, generate
from replay_theory.core.rng import PerSeedGenerator
from replay_theory.core.rollouts import RolloutBatch
from replay_theory.simulate.calibrate import (
    calibrate,
    check_probe,
    exact_loss_gradient,
    exact_sample_mean,
    per_sample_grads,
    supports_exact_gradient,
    token_coefficients,
)
from replay_theory.simulate.config import SimConfig
from replay_theory.simulate.envs import BanditConfig, BanditEnv, TokenMDPConfig, TokenMDPEnv


def test_fitted_rho_with_a_sampled_reference_agrees_with_the_exact_gradient():
    """The LM's method (grad F from a held-out batch, its error subtracted) on the simulator: its fitted rho
    lies within its own 90% bootstrap interval of the rho measured against the exact gradient (same run)."""
    config = SimConfig(seeds=8, steps=100)
    staleness = (0, 8, 32, 64)
    rho_only = {"kappa_pairs": 0, "noise_checkpoints": 2}  # B_noise and kappa draw on their own streams: rho unchanged
    exact = calibrate(config, staleness=staleness, reference="exact", **rho_only)
    sampled = calibrate(config, staleness=staleness, reference="sampled", reference_samples=16384, **rho_only)
    direct, fitted = exact.rho_fit_uncentred, sampled.rho_fit
    assert sampled.rho_noise == "uncentred" and exact.rho_noise == "centred"
    assert fitted.ci[0] <= direct.value <= fitted.ci[1]
    assert fitted.within_group == pytest.approx(direct.within_group, abs=0.01)
    # the theorem's (centred) rho on the default bandit probe is about 0 (either sign), never clamped
    assert abs(exact.rho_fit.value) < 0.1 and exact.rho_fit.in_range == (exact.rho_fit.value >= 0)
    # sigma^2(0) agrees between the two references; the retained signal starts at exactly 1 with exact grad F
    assert sampled.noise.plain[0] == pytest.approx(exact.noise.plain[0], rel=0.1)
    assert exact.noise.retained[0] == pytest.approx(1.0, abs=1e-12)


# --------------------------------------------------------------------------- token MDP: exact gradient


TINY_TOKEN = TokenMDPEnv(TokenMDPConfig(vocab_size=3, seq_len=3, num_prompts=2, tolerance=1, instance_seed=3))
TOKEN_LOSSES = ["grpo", "reinforce", "no-trust-region", "asymre", "exgrpo", "rloo"]  # every per-token loss


def _token_config(loss: str, **changes) -> SimConfig:
    buffer = {"buffer": "on-policy"} if loss == "rloo" else {}
    return SimConfig(env="token-mdp", seeds=2, loss=loss, **buffer, **changes).validated()


def _brute_force_sample_mean(env, config, params, behaviour):
    """E[G(theta, z)] by enumerating every group of G responses of pi_behaviour for every prompt.

    Nothing of the DP is used: sequence probabilities come from ``env.logp``, the advantage of each
    response from ``make_advantage`` on the enumerated group, and G(theta, z) from ``per_sample_grads``
    on the sequence with that advantage (one evaluation per distinct (sequence, advantage) pair).
    """
    S, L, V, G = params.shape[0], env.seq_len, env.vocab_size, config.group_size
    seqs = np.array(list(itertools.product(range(V), repeat=L)))  # (Q, L)
    groups = np.array(list(itertools.product(range(len(seqs)), repeat=G)))  # (Q^G, G) sequence indices
    out = np.zeros((S, env.param_dim))
    for p in range(env.num_prompts):
        prompts = np.full((S, len(seqs)), p)
        tokens = np.broadcast_to(seqs, (S,) + seqs.shape).copy()
        mask = np.ones(tokens.shape, bool)
        logp_b = env.logp(behaviour, prompts, tokens, mask)  # (S, Q, L)
        reward = env.reward(prompts, tokens, mask)[0]  # (Q,)
        advantage = make_advantage(config, reward[groups][None])[0]  # (Q^G, G)
        group_prob = np.prod(np.exp(logp_b.sum(-1))[:, groups], axis=-1)  # (S, Q^G)
        pairs, index = np.unique(np.stack([groups.ravel(), advantage.ravel()], 1), axis=0, return_inverse=True)
        weight = np.stack([np.bincount(index.ravel(), np.repeat(w, G) / G, len(pairs)) for w in group_prob])
        j, n = pairs[:, 0].astype(int), len(pairs)
        batch = RolloutBatch(prompt=np.full((S, n), p), tokens=tokens[:, j], mask=mask[:, j], logp_behav=logp_b[:, j],
                             reward=np.broadcast_to(reward[j], (S, n)).copy(),
                             advantage=np.broadcast_to(pairs[:, 1], (S, n)).copy(),
                             created=np.zeros((S, n), np.int64), group=np.broadcast_to(np.arange(n), (S, n)).copy())
        out += np.einsum("sn,snd->sd", weight, per_sample_grads(env, config, params, batch)) / env.num_prompts
    return out


@pytest.mark.parametrize("loss", TOKEN_LOSSES)
def test_token_mdp_exact_gradients_equal_full_enumeration(loss):
    """Tiny token MDP (3 tokens of 3 values, 2 prompts, groups of 3): grad F and a stale mean E_{pi_b}[G(theta, z)]
    equal the sums over all 27^3 groups per prompt, to rounding; at the stale policy the GRPO clip binds."""
    env = TINY_TOKEN
    config = _token_config(loss, group_size=3, rollouts_per_step=3, batch_size=3)
    rng = np.random.default_rng(0)
    theta = 0.5 * rng.standard_normal((2, env.param_dim))
    behaviour = theta + 0.5 * rng.standard_normal((2, env.param_dim))
    assert set(np.unique(env.final_sum_reward())) == {0.0, 0.1, 1.0}  # all three reward levels occur
    exact = exact_loss_gradient(env, config, theta)
    np.testing.assert_allclose(exact, _brute_force_sample_mean(env, config, theta, theta), rtol=0, atol=1e-12)
    stale = exact_sample_mean(env, config, theta, behaviour)
    np.testing.assert_allclose(stale, _brute_force_sample_mean(env, config, theta, behaviour), rtol=0, atol=1e-12)
    assert np.abs(exact).max() > 0.05 and np.abs(stale - exact).max() > 0.01  # non-trivial values
    if loss == "grpo":  # the clip binds at this behaviour policy: the unclipped IS loss gives another mean
        unclipped = exact_sample_mean(env, _token_config("no-trust-region", group_size=3, rollouts_per_step=3,
                                                         batch_size=3), theta, behaviour)
        assert np.abs(unclipped - stale).max() > 0.01


def test_token_mdp_exact_gradients_match_monte_carlo_at_the_default_size():
    """Default token MDP (8 tokens of 6 values, 32 prompts, groups of 8): grad F and a stale mean of the GRPO loss
    against 4000 sampled groups per seed; the 2 x 31 group-mean z-scores are N(0, 1)."""
    env = TokenMDPEnv()
    config = _token_config("grpo")
    rng = np.random.default_rng(1)
    theta = 0.3 * rng.standard_normal((2, env.param_dim))
    behaviour = theta + 0.2 * rng.standard_normal((2, env.param_dim))
    stream = PerSeedGenerator(3, 2)
    for behav, exact in ((theta, exact_loss_gradient(env, config, theta)),
                         (behaviour, exact_sample_mean(env, config, theta, behaviour))):
        batch = generate(EnvBackend(env, stream), config, behav, 4000, 0, 0, stream)
        group_means = per_sample_grads(env, config, theta, batch).reshape(2, 4000, 8, -1).mean(axis=2)
        z = (group_means.mean(axis=1) - exact) / (group_means.std(axis=1) / math.sqrt(4000))
        assert np.mean(z**2) < 1.6 and np.abs(z).max() < 4.0


def test_token_mdp_m2po_is_refused_not_approximated():
    """M2PO's mask ranks a response's tokens by their M2 jointly: no per-state factorisation, so no exact gradient
    (auto falls back to the sampled reference; exact is refused before any work), and the layout check of
    ``token_coefficients`` catches the coupling even when asked directly."""
    env = TINY_TOKEN
    assert supports_exact_gradient(env) and supports_exact_gradient(env, "grpo")
    assert not supports_exact_gradient(env, "m2po") and supports_exact_gradient(BanditEnv(BanditConfig()), "m2po")
    rng = np.random.default_rng(0)
    theta = rng.standard_normal((2, env.param_dim))
    behaviour = theta + 0.1 * rng.standard_normal((2, env.param_dim))
    for loss in ("m2po", "m2po-reference"):
        config = _token_config(loss, group_size=3, rollouts_per_step=3, batch_size=3)
        with pytest.raises(ValueError, match=rf"^no exact gradient: loss '{loss}' masks a token by the M2 of the "
                                             "whole response"):
            exact_sample_mean(env, config, theta, behaviour)
        logs = [[env.token_log_policy(x, t) for t in range(3)] for x in (theta, behaviour)]
        with pytest.raises(ValueError, match=rf"^loss {loss}: a token's d loss / d logp is not piecewise linear in "
                                             "the advantage or depends on the response's other tokens"):
            token_coefficients(config, logs[0], logs[1], 3)
        with pytest.raises(ValueError, match=rf"^reference exact needs an enumerable gradient \(env bandit, or env "
                                             rf"token-mdp with per-token gradients\): loss '{loss}' masks"):
            check_probe(config.with_updates(steps=200), (0, 8), 24, 8, "exact", 48)
    check_probe(_token_config("grpo", steps=200), (0, 8), 64, 8, "exact", 64)  # a per-token loss is accepted


@pytest.mark.slow
def test_token_mdp_centred_rho_with_interval_and_the_sampled_reference_agrees():
    """The token MDP now gets the theorem's rho (centred noise against the exact gradient, between groups) with its
    bootstrap interval, as on the bandit; the LM's method (sampled reference, uncentred) lies within its own 90%
    interval of the exact uncentred value measured on the same run."""
    config = SimConfig(env="token-mdp", seeds=8, steps=100)
    staleness = (0, 8, 32, 64)
    rho_only = {"kappa_pairs": 0, "noise_checkpoints": 2}  # B_noise and kappa draw on their own streams: rho unchanged
    exact = calibrate(config, staleness=staleness, max_gap=16, reference="auto", **rho_only)
    sampled = calibrate(config, staleness=staleness, max_gap=16, reference="sampled", reference_samples=16384,
                        **rho_only)
    assert exact.reference == "exact" and exact.rho_noise == "centred" and sampled.rho_noise == "uncentred"
    fit = exact.rho_fit
    assert fit.units == 8 and fit.ci[0] < fit.value < fit.ci[1] and fit.ci[1] - fit.ci[0] < 0.2
    assert abs(fit.value) < 0.05  # no correlation between groups of different steps once the bias is removed
    direct, fitted = exact.rho_fit_uncentred, sampled.rho_fit
    assert fitted.ci[0] <= direct.value <= fitted.ci[1]
    assert direct.value > 0.5  # the uncentred fit is the stale-bias products, not rho
    assert fitted.within_group == pytest.approx(direct.within_group, abs=0.01)
    assert 0.0 < fit.within_group < 0.2 and fit.within_group_ci[0] < fit.within_group < fit.within_group_ci[1]
    assert exact.noise.retained[0] == pytest.approx(1.0, abs=1e-12)
    assert sampled.noise.plain[0] == pytest.approx(exact.noise.plain[0], rel=0.1)
    data = exact.profile_dict("test")
    assert data["reference"] == "exact" and data["rho_fit"]["ci"] == list(fit.ci)
    assert data["rho_fit_uncentred"]["value"] == direct.value


# --------------------------------------------------------------------------- the noise scale B_noise


def test_noise_scale_per_sample_agrees_with_the_exact_grad_on_the_default_bandit():
    """Default bandit (GRPO): the per-sample B_noise's 90% interval holds the value with the exact |E G|^2 (same
    units, same checkpoints), and both intervals hold their own points."""
    cal = calibrate(SimConfig(), staleness=(0, 8), max_gap=8, checkpoints=1, samples=64, kappa_pairs=0)  # B_noise only
    noise = cal.noise_scale
    est, exact = noise.estimate, noise.exact_grad
    assert noise.unit_size == 8 and noise.batch == 64 and noise.plateau is not None
    assert len(noise.steps) >= 2 and max(noise.steps) < noise.plateau
    assert est.checkpoints == exact.checkpoints == 8 * len(noise.steps)  # one theta per (seed, checkpoint)
    assert est.interval[0] <= exact.b_noise <= est.interval[1]
    for pooled in (est, exact):
        assert math.isfinite(pooled.b_noise) and pooled.interval[0] <= pooled.b_noise <= pooled.interval[1]
    # the exact |E G|^2 removes the denominator's Monte Carlo error: a narrower interval
    assert exact.interval[1] - exact.interval[0] < est.interval[1] - est.interval[0]


def test_drift_record_is_the_exact_m2_a_monte_carlo_of_the_runs_policies_agrees_with(tmp_path):
    """calibrate-simulator's drift record: M2(s) of the probe's last policy T against T - s at the ages of
    ``drift_ages``, equal to a Monte Carlo mean of (log pi_T - log pi_T-s)^2 over actions drawn from pi_T-s on the
    same run (re-run, same seeds), within 4 standard errors; the profile it writes prices 1 + M2(s)."""
    import json

    from replay_theory.advise.optimal import _staleness_of
    from replay_theory.advise.profile_files import load_profile
    from replay_theory.simulate.calibrate import probe_config
    from replay_theory.simulate.engine import run
    from replay_theory.theory.forgetting import drift_ages

    config = SimConfig(steps=80)
    cal = calibrate(config, staleness=(0, 8), max_gap=8, checkpoints=1, samples=64, kappa_pairs=0)
    T = config.steps
    assert cal.drift["staleness"] == [float(a) for a in drift_ages(T)] == [0, 1, 2, 4, 8, 16, 32, 64, 80]
    seen = {}
    run(probe_config(config.validated(), 8), observer=lambda step, params, history, buffer, env: seen.update(
        history=list(history), env=env))
    history, env = seen["history"], seen["env"]
    rng = np.random.default_rng(0)
    n = 20000
    for s, m2 in zip(cal.drift["staleness"], cal.drift["m2"]):
        ln, lb = env.log_policy(history[-1]), env.log_policy(history[-1 - int(s)])  # (S, P, A)
        S, P, A = lb.shape
        prompts = rng.integers(P, size=(S, n))  # uniform prompts, as exact_divergences averages them
        probs = np.exp(lb[np.arange(S)[:, None], prompts])  # (S, n, A)
        actions = np.minimum((rng.random((S, n, 1)) > probs.cumsum(-1)).sum(-1), A - 1)  # a ~ pi_T-s
        at = np.arange(S)[:, None], prompts, actions
        squares = (ln[at] - lb[at]) ** 2  # (S, n)
        se = squares.std() / math.sqrt(squares.size)
        assert abs(squares.mean() - m2) <= 4 * se + 1e-12, (s, squares.mean(), m2)
    assert cal.drift["m2"][0] == 0 and cal.drift["m2"][-1] > cal.drift["m2"][1] > 0
    path = tmp_path / "p.json"
    path.write_text(json.dumps(cal.profile_dict("test")))
    priced = _staleness_of(load_profile(path))
    np.testing.assert_allclose(priced.ratio, 1 + np.asarray(cal.drift["m2"]), rtol=1e-15)

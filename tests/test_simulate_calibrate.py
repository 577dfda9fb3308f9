"""simulate/calibrate.py: exact gradients against Monte Carlo, the profile file's forms and rho record, and the
fitted rho with a sampled reference against the one measured with the exact gradient."""

import json
import math

import numpy as np
import pytest

from replay_theory.simulate.calibrate import (
    Calibration,
    calibrate,
    exact_loss_gradient,
    exact_sample_mean,
    expected_advantage_parts,
    loss_form,
    per_sample_grads,
    probe_config,
)
from replay_theory.simulate.config import SimConfig
from replay_theory.simulate.designs import make_advantage
from replay_theory.simulate.envs import BanditConfig, BanditEnv
from replay_theory.simulate.pipeline import EnvBackend, generate
from replay_theory.simulate.rng import PerSeedGenerator
from replay_theory.theory.noise import RhoFit, noise_profile, staleness_moments
from replay_theory.theory.profiles import load_profile, save_profile


def test_expected_advantage_matches_brute_force_over_all_groups():
    import itertools

    config = SimConfig(group_size=3, rollouts_per_step=63, batch_size=63).validated()
    levels = np.array([0.0, 0.1, 1.0])
    probs = np.array([[[0.5, 0.3, 0.2]]])
    pos, neg = expected_advantage_parts(config, levels, probs)
    want_pos, want_neg = np.zeros(3), np.zeros(3)
    for k in range(3):  # own level k; enumerate the two others' levels one by one
        for a, b in itertools.product(range(3), repeat=2):
            adv = make_advantage(config, levels[[k, a, b]].reshape(1, 1, 3))[0, 0, 0]
            want_pos[k] += probs[0, 0, a] * probs[0, 0, b] * max(adv, 0.0)
            want_neg[k] += probs[0, 0, a] * probs[0, 0, b] * max(-adv, 0.0)
    np.testing.assert_allclose(pos[0, 0], want_pos, rtol=1e-12)
    np.testing.assert_allclose(neg[0, 0], want_neg, rtol=1e-12)


@pytest.mark.parametrize("loss", ["grpo", "reinforce", "no-trust-region", "m2po", "asymre"])
def test_exact_gradients_match_monte_carlo(loss):
    """grad F (behaviour = current) and the stale mean E_{pi_b}[G(theta, z)] against 4000 sampled groups."""
    config = SimConfig(seeds=2, loss=loss).validated()
    env = BanditEnv(BanditConfig())
    rng = np.random.default_rng(1)
    theta = 0.5 * rng.standard_normal((2, 16))
    behaviour = theta + 0.4 * rng.standard_normal((2, 16))
    stream = PerSeedGenerator(3, 2)
    for behav, exact in ((theta, exact_loss_gradient(env, config, theta)),
                         (behaviour, exact_sample_mean(env, config, theta, behaviour))):
        batch = generate(EnvBackend(env, stream), config, behav, 4000, 0, 0, stream)
        group_means = per_sample_grads(env, config, theta, batch).reshape(2, 4000, 8, 16).mean(axis=2)
        z = (group_means.mean(axis=1) - exact) / (group_means.std(axis=1) / math.sqrt(4000))
        assert np.mean(z**2) < 1.6 and np.abs(z).max() < 4.0  # 32 coordinates of N(0, 1) z-scores


def test_loss_form_and_probe_capacity():
    assert loss_form("no-trust-region") == "plain"
    assert {loss_form(x) for x in ("grpo", "m2po", "reinforce", "asymre")} == {"signal-normalised"}
    config = SimConfig().validated()
    assert probe_config(config, 64).capacity == 65 * 64 and probe_config(config, 3).capacity == 256
    assert probe_config(SimConfig(buffer="on-policy").validated(), 64).capacity == 256


def _calibration(rho_value, ci, form="signal-normalised"):
    grads = np.array([[[[2.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [0.0, -1.0]], [[0.0, 1.0], [0.0, -1.0]]]])
    profile = noise_profile(staleness_moments(grads, np.array([[1.0, 0.0]])), [0, 4, 8])
    fit = RhoFit(rho_value, ci, 0.9, 256.0, 2, (0.0, 0.01, 0.02), ((0, 0),) * 3, (10, 10, 10), 0.2, (0.1, 0.3), 8)
    values = np.asarray(profile.signal_normalised if form == "signal-normalised" else profile.plain)
    return Calibration(np.array([0.0, 4.0, 8.0]), values, form, "grpo", profile, fit, fit, "centred", 0.0,
                       "exact", 256)


def test_profile_file_records_forms_and_an_out_of_range_rho(tmp_path, cli):
    data = _calibration(-0.4, (-0.6, -0.2)).profile_dict("test")
    # the matched (signal-normalised) table stops where no signal is left: 1, 5, then inf at s = 8
    assert data["staleness"] == [0.0, 4.0] and data["sigma_sq"] == [1.0, 5.0]
    assert data["sigma_sq_form"] == "signal-normalised" and data["loss"] == "grpo"
    assert data["forms"]["plain"]["value"] == [1.0, 1.5, 2.0]
    assert data["forms"]["signal_normalised"]["value"] == [1.0, 5.0, None]
    assert data["forms"]["retained_signal"]["value"] == [1.0, 0.5, 0.0]
    assert "rho" not in data and data["rho_fit"]["value"] == -0.4 and data["rho_fit"]["in_range"] is False
    path = tmp_path / "p.json"
    save_profile(path, data)
    loaded = load_profile(path)
    assert loaded.rho is None and loaded.sigma_sq_form == "signal-normalised"
    assert "signal-normalised sigma^2 (loss grpo)" in loaded.description
    assert loaded.rho_problem() == ("the profile's rho fit -0.4 (90% interval [-0.6, -0.2]) is outside [0, 1], "
                                    "the range Assumption 3.3 allows")
    code, out, err = cli("optimal", "--mu", "5.28", "--profile", str(path))
    assert code == 2 and out == "" and err == (f"replay-theory: error: --profile {path}: {loaded.rho_problem()}; "
                                               "pass --rho explicitly\n")
    code, out, err = cli("optimal", "--mu", "5.28", "--profile", str(path), "--rho", "0", "--json")
    assert code == 0 and json.loads(out)["rho"] == 0.0
    # an in-range fit is the profile's rho, and optimal uses it
    inside = _calibration(0.02, (0.01, 0.03), form="plain").profile_dict("test")
    assert inside["rho"] == 0.02 and inside["sigma_sq"] == [1.0, 1.5, 2.0] and inside["sigma_sq_form"] == "plain"


def test_fitted_rho_with_a_sampled_reference_agrees_with_the_exact_gradient():
    """The LM's method (grad F from a held-out batch, its error subtracted) on the simulator: its fitted rho
    lies within its own 90% bootstrap interval of the rho measured against the exact gradient (same run)."""
    config = SimConfig(seeds=8, steps=100)
    staleness = (0, 8, 32, 64)
    exact = calibrate(config, staleness=staleness, reference="exact")
    sampled = calibrate(config, staleness=staleness, reference="sampled", reference_samples=16384)
    direct, fitted = exact.rho_fit_uncentred, sampled.rho_fit
    assert sampled.rho_noise == "uncentred" and exact.rho_noise == "centred"
    assert fitted.ci[0] <= direct.value <= fitted.ci[1]
    assert fitted.within_group == pytest.approx(direct.within_group, abs=0.01)
    # the theorem's (centred) rho on the default bandit probe is about 0 (either sign), never clamped
    assert abs(exact.rho_fit.value) < 0.1 and exact.rho_fit.in_range == (exact.rho_fit.value >= 0)
    # sigma^2(0) agrees between the two references; the retained signal starts at exactly 1 with exact grad F
    assert sampled.noise.plain[0] == pytest.approx(exact.noise.plain[0], rel=0.1)
    assert exact.noise.retained[0] == pytest.approx(1.0, abs=1e-12)


def test_bandit_fast_per_sample_gradients_equal_the_generic_path():
    class Generic:  # the bandit seen through the generic Environment methods only
        def __init__(self, env):
            self.env, self.seq_len = env, env.seq_len

        def logp(self, *args):
            return self.env.logp(*args)

        def grad_logp_contract(self, *args):
            return self.env.grad_logp_contract(*args)

    config = SimConfig(seeds=2, loss="grpo").validated()
    env = BanditEnv(BanditConfig())
    rng = np.random.default_rng(4)
    theta, behaviour = rng.standard_normal((2, 16)), rng.standard_normal((2, 16))
    stream = PerSeedGenerator(5, 2)
    batch = generate(EnvBackend(env, stream), config, behaviour, 6, 0, 0, stream)  # stale: clipped items too
    fast = per_sample_grads(env, config, theta, batch)
    np.testing.assert_allclose(fast, per_sample_grads(Generic(env), config, theta, batch), rtol=1e-12, atol=1e-15)
    assert (np.abs(fast).sum(-1) == 0).any() and (np.abs(fast).sum(-1) > 0).any()

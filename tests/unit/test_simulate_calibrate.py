"""simulate/calibrate.py: exact gradients against Monte Carlo (bandit) and full enumeration (token MDP), the
profile file's forms and rho record, the fitted rho with a sampled reference against the one measured with
the exact gradient (bandit and token MDP), and the noise scale B_noise: a hand case through the code path, the
profile record's JSON round trip, and the per-sample estimator against the exact-|E G|^2 value on the bandit.

Fast tier; the slower tests of this module (calibration runs on the bandit and the token MDP) are in
tests/integration/test_simulate_calibrate_runs.py.
"""

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest

from replay_theory.advise.profile_files import load_profile, save_profile
from replay_theory.core.designs import loss_form, make_advantage
from replay_theory.core.pipeline import EnvBackend, generate
from replay_theory.core.rng import PerSeedGenerator
from replay_theory.simulate.calibrate import (
    Calibration,
    exact_loss_gradient,
    exact_sample_mean,
    expected_advantage_parts,
    group_units,
    measure_noise_scale,
    noise_scale_lines,
    per_sample_grads,
    probe_config,
)
from replay_theory.simulate.config import SimConfig
from replay_theory.simulate.envs import BanditConfig, BanditEnv
from replay_theory.theory.noise import RhoFit, noise_profile, staleness_moments


def test_expected_advantage_matches_brute_force_over_all_groups():

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
    code, out, err = cli("optimal", "--objective", "paper", "--mu", "5.28", "--profile", str(path))
    assert code == 2 and out == "" and err == (f"replay-theory: error: --profile {path}: {loaded.rho_problem()}; "
                                               "pass --rho explicitly\n")
    code, out, err = cli("optimal", "--objective", "paper", "--mu", "5.28", "--profile", str(path), "--rho", "0",
                         "--json")
    assert code == 0 and json.loads(out)["rho"] == 0.0
    # an in-range fit is the profile's rho, and optimal uses it
    inside = _calibration(0.02, (0.01, 0.03), form="plain").profile_dict("test")
    assert inside["rho"] == 0.02 and inside["sigma_sq"] == [1.0, 1.5, 2.0] and inside["sigma_sq_form"] == "plain"


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


# --------------------------------------------------------------------------- token MDP: exact gradient


# --------------------------------------------------------------------------- the noise scale B_noise


def _hand_noise_scale():
    """One seed, d = 1, groups of G = 2, three checkpoints (updates 1, 5, 9); the reward reaches its plateau
    J0 + 0.9 (J_end - J0) = 0.9 at step 9, so the third checkpoint is left out.

    Step 1: samples 1, 3, 5, 7 -> group means 2, 6: tr Sigma_unit = ((2-4)^2 + (6-4)^2) / 1 = 8,
    |E G|^2 = 4^2 - 8/2 = 12, tr Sigma per sample = G 8 = 16, B_noise = 16 / 12 = 4/3.
    Step 5: samples 0, 2, 4, 6 -> 1, 5: tr Sigma_unit = 8, |E G|^2 = 9 - 4 = 5, B_noise = 16 / 5.
    Median of two: (4/3 + 16/5) / 2 = 34/15. Exact |E G|^2 16 and 9: B_noise 1 and 16/9, median 25/18.
    """
    samples = {1: [1.0, 3.0, 5.0, 7.0], 5: [0.0, 2.0, 4.0, 6.0], 9: [0.0, 100.0, 0.0, -100.0]}
    units = {t: group_units(np.array(v).reshape(1, 4, 1), 2) for t, v in samples.items()}  # (1, 2, 1) each
    exact_sq = {1: np.array([16.0]), 5: np.array([9.0]), 9: np.array([1.0])}
    return measure_noise_scale(units, exact_sq, np.array([1, 5, 9]), np.array([[0.0, 0.1, 1.0]]), 64, 2, "hand",
                               seed=0)


def test_noise_scale_hand_case_through_the_code_path():
    noise = _hand_noise_scale()
    assert noise.steps == (1, 5) and noise.plateau == 9 and noise.unit_size == 2 and noise.batch == 64
    assert noise.estimate.per_checkpoint == pytest.approx((4 / 3, 16 / 5), rel=1e-12)
    assert noise.estimate.b_noise == pytest.approx(34 / 15, rel=1e-12)
    assert noise.exact_grad.per_checkpoint == pytest.approx((1.0, 16 / 9), rel=1e-12)
    assert noise.exact_grad.b_noise == pytest.approx(25 / 18, rel=1e-12)
    assert noise.estimate.method == "per-sample" and noise.exact_grad.method == "per-sample tr Sigma, exact |E G|^2"
    assert "steps 1, 5 (before the reward plateau at step 9)" in noise.source
    lines = noise_scale_lines(noise)
    assert lines[0].startswith(f"noise scale B_noise (per-sample) = {34 / 15:.4g}, 90% interval [")
    assert f"b = B_noise / B = {34 / 15 / 64:.4g} [" in lines[0] and lines[0].endswith("at B = 64")
    assert lines[1].startswith(f"noise scale B_noise (exact |E G|^2) = {25 / 18:.4g}")


def test_noise_scale_record_round_trips_through_the_profile_file(tmp_path, cli):
    calibration = _calibration(0.02, (0.01, 0.03), form="plain")
    calibration.noise_scale = _hand_noise_scale()
    path = tmp_path / "p.json"
    save_profile(path, calibration.profile_dict("test"))
    data = json.loads(path.read_text())
    record = data["noise_scale"]
    assert set(record) == {"b_noise", "b_noise_interval", "level", "per_checkpoint", "checkpoints", "method", "batch",
                           "unit_size", "source"}
    assert record["b_noise"] == pytest.approx(34 / 15, rel=1e-12) and record["method"] == "per-sample"
    assert record["per_checkpoint"] == pytest.approx([4 / 3, 16 / 5], rel=1e-12) and record["checkpoints"] == 2
    assert record["batch"] == 64 and record["unit_size"] == 2 and record["level"] == 0.9
    assert record["source"] == calibration.noise_scale.source
    # two groups: a replicate drawing one group twice has tr Sigma = 0 (B_noise 0), one whose shifted |E G|^2 is
    # <= 0 has no signal (inf, written null: JSON has no infinity)
    assert record["b_noise_interval"] == [0.0, None] == calibration.noise_scale.estimate.to_dict()["b_noise_interval"]
    exact = data["noise_scale_exact_grad"]
    assert exact["b_noise"] == pytest.approx(25 / 18, rel=1e-12) and set(exact) == set(record)
    assert load_profile(path).sigma_sq_form == "plain"  # the profile still loads
    code, out, err = cli("optimal", "--mu", "5.28", "--profile", str(path), "-B", "64", "--json")
    assert code == 0 and json.loads(out)["b_noise"] == pytest.approx(34 / 15, rel=1e-12)  # the rule reads it
    # no signal (b_noise null): the record is kept apart and the profile (its sigma^2 table) is still written
    unresolved = _calibration(0.02, (0.01, 0.03), form="plain")
    unresolved.noise_scale = dataclasses.replace(
        calibration.noise_scale, estimate=dataclasses.replace(calibration.noise_scale.estimate, b_noise=math.inf))
    data = unresolved.profile_dict("test")
    assert "noise_scale" not in data and data["noise_scale_unresolved"]["b_noise"] is None
    save_profile(tmp_path / "q.json", data)
    assert "noise_scale_unresolved" in noise_scale_lines(unresolved.noise_scale)[-1]

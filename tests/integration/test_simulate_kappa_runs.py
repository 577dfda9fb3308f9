"""kappa in calibrate-simulator (issue 30): the curvature pairs cover the exact value, the lag-1 estimator's bias
under Adam, the profile record, and the CLI's output and bad input."""

import json

import pytest

from replay_theory.advise.profile_files import load_profile, save_profile
from replay_theory.simulate.calibrate import calibrate, kappa_lines
from replay_theory.simulate.config import SimConfig

SGD_BANDIT = SimConfig(optimizer="sgd", lr=2.0, buffer="on-policy", seeds=4)


def test_sgd_curvature_pairs_cover_the_exact_kappa():
    cal = calibrate(SGD_BANDIT, staleness=(0, 1), checkpoints=1, samples=64)
    memory = cal.memory
    exact, pairs = memory.estimators["exact"], memory.pairs
    assert exact.method == "exact" and pairs.method == "curvature-pairs" and pairs.optimizer == "sgd"
    assert pairs.detail["hvp"].startswith("H xi by central differences of the enumerated grad F")
    assert pairs.interval[0] <= exact.kappa <= pairs.interval[1]
    assert exact.interval[0] <= exact.kappa <= exact.interval[1]
    # an independent minibatch's Hessian (what the LM and the TRL trainer use) covers it too; GRPO's std
    # normalisation adds a small cross-sample term, within the interval here
    independent = memory.estimators["independent"]
    assert independent.interval[0] <= exact.kappa <= independent.interval[1]
    # the pair's own minibatch: its Hessian shares samples with xi, a bias far outside the interval under SGD
    assert memory.estimators["same"].interval[0] > exact.interval[1]
    assert pairs.units == 4 * len(cal.noise_scale.steps) * 8  # seeds x checkpoints x pairs
    assert pairs.pilot_batch == 64 and pairs.detail["step"] == 2.0
    # the lag-1 estimator: the mean gradient's drift before the plateau hides SGD's negative correlation; said
    assert memory.estimators["lag"] is None and "must be in (-1, 0)" in memory.problems["lag"]


def test_adam_profile_record_and_the_lag_estimators_bias(tmp_path):
    cal = calibrate(SimConfig(seeds=4), staleness=(0, 8), max_gap=8, checkpoints=1, samples=64)
    memory = cal.memory
    exact, pairs, lag = memory.estimators["exact"], memory.pairs, memory.estimators["lag"]
    assert pairs.optimizer == "adam" and pairs.beta1 == 0.9
    assert pairs.interval[0] <= exact.kappa <= pairs.interval[1]
    # under Adam the lag-1 signal is positive, ~0.4 kappa, the drift's sign: it overstates kappa several times
    assert lag is not None and lag.detail["lag1_autocorrelation"] > 0 and lag.interval[0] > 2 * exact.kappa
    assert "on-policy twin" in lag.detail["series"]  # the probe replays (FIFO): the series comes from its twin
    data = cal.profile_dict(source="test")
    path = tmp_path / "profile.json"
    save_profile(path, data)
    loaded = load_profile(path)
    assert loaded.memory["kappa"] == pytest.approx(pairs.kappa) and loaded.memory["method"] == "curvature-pairs"
    assert set(loaded.memory_estimators) == {"exact", "curvature-pairs-independent-minibatch",
                                             "curvature-pairs-surrogate-hessian", "curvature-pairs-same-minibatch",
                                             "lag-autocorrelation"}
    assert loaded.memory_model().kappa == pytest.approx(pairs.kappa)
    lines = kappa_lines(memory)
    assert lines[0].startswith("optimizer memory kappa = eta tr(H Sigma) / tr Sigma (adam, beta1 0.9")
    assert any("[profile memory]" in line and f"{pairs.kappa:.4g}" in line for line in lines)


def test_calibrate_simulator_prints_and_writes_kappa(tmp_path, cli):
    profile = tmp_path / "profile.json"
    code, out, err = cli("calibrate-simulator", "--out", str(profile), "--seeds", "2", "--steps", "40",
                         "--eval-every", "20", "--num-prompts", "16", "--checkpoints", "1", "--samples", "64",
                         "--staleness", "0,2", "--max-gap", "8", "--kappa-pairs", "2")
    assert code == 0, err
    data = json.loads(profile.read_text())
    assert data["memory"]["method"] == "curvature-pairs" and data["memory"]["optimizer"] == "adam"
    assert "optimizer memory kappa" in out and "[profile memory]" in out and "lag-1 autocorrelation" in out
    # --kappa-pairs 0: no kappa, said, and the profile has no memory record
    other = tmp_path / "without.json"
    code, out, err = cli("calibrate-simulator", "--out", str(other), "--seeds", "2", "--steps", "40",
                         "--eval-every", "20", "--num-prompts", "16", "--checkpoints", "1", "--samples", "64",
                         "--staleness", "0,2", "--max-gap", "8", "--kappa-pairs", "0")
    assert code == 0, err
    assert "memory" not in json.loads(other.read_text()) and "kappa not measured (--kappa-pairs 0)" in out


@pytest.mark.parametrize("value", ["-1", "two"])
def test_bad_kappa_pairs_is_one_line_before_any_work(tmp_path, cli, value):
    code, out, err = cli("calibrate-simulator", "--out", str(tmp_path / "p.json"), "--kappa-pairs", value)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--kappa-pairs" in err and ">= 0" in err
    assert not (tmp_path / "p.json").exists()

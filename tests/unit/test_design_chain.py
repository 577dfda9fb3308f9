"""The end-to-end steps chain with the user's own numbers: optimal reads mu from a calibrate --from-log profile, and
trl-replay's --design reads the noise-scale rule's JSON with R in whole groups (docs/TRL.md, the README's workflow;
issue 25)."""

from __future__ import annotations

import json

import pytest

from replay_theory.integrations.replay_config import ReplayConfig
from replay_theory.theory.noise_scale import noise_scale_pick, replay_cost

MU = {"value": 0.6663, "ci": [0.637, 0.696], "source": "log", "convention": "rollout-cost"}


def _profile(tmp_path, b_noise, **extra):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"kind": "noise_scale", "mu": MU, **extra,
                                "noise_scale": {"b_noise": b_noise, "b_noise_interval": [494.0, None], "batch": 64,
                                                "method": "two-batch", "unit_size": 8}}))
    return path


def test_optimal_reads_mu_from_the_profile_and_says_so(cli, tmp_path):
    path = _profile(tmp_path, 1541.0)
    code, out, err = cli("optimal", "--profile", str(path), "-B", "64")
    same = cli("optimal", "--profile", str(path), "-B", "64", "--mu", "0.6663")
    assert code == 0 and (code, out) == same[:2]  # the profile's mu is exactly --mu 0.6663
    assert "inputs: mu = 0.6663; B = 64; B_noise = 1541 (b = 24.1)" in out
    assert err == f"mu = 0.6663 from --profile {path} (measured from the log, 90% CI [0.637, 0.696])\n"


@pytest.mark.parametrize("args, line", [
    ((), "--mu is required (or a --profile file that carries a measured mu, as calibrate --from-log writes)"),
    (("--convention", "paper-sec3"), "--convention paper-sec3 differs from the rollout-cost mu that --profile {p} "
                                     "carries: give --mu in that convention"),
])
def test_mu_missing_or_in_another_convention_is_one_line(error_line, tmp_path, args, line):
    path = _profile(tmp_path, 1541.0)
    with_profile = ("--profile", str(path), "-B", "64") if args else ()
    assert error_line("optimal", *with_profile, *args) == line.format(p=path)


def test_a_profile_without_mu_asks_for_it(error_line, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"kind": "noise_scale", "noise_scale": {"b_noise": 100.0, "batch": 64}}))
    assert error_line("optimal", "--profile", str(path), "-B", "64") == (
        f"--mu is required: --profile {path} carries no measured mu")


def test_an_unmeasurable_noise_scale_names_its_lower_bound(error_line, tmp_path):
    path = _profile(tmp_path, None)
    assert error_line("optimal", "--profile", str(path), "-B", "64") == (
        f"--profile {path} has no B_noise (its noise_scale record has b_noise: null); its interval's "
        "lower end is 494: --mu MU --noise-scale 494 -B B gives the most replay-friendly answer the data allow; or "
        "measure again over more steps or a larger batch")


def test_design_json_of_the_noise_scale_rule_feeds_the_trainer_in_whole_groups(cli, tmp_path):
    # b = 10 / 64: replay pays at mu = 5.28; y* = sqrt(5.28 (1 + 6.4)) = 6.25, R* = 64 / 6.25 = 10.24
    code, out, _ = cli("optimal", "--mu", "5.28", "--noise-scale", "10", "-B", "64", "--objective", "noise-scale",
                       "--json")
    design = json.loads(out)
    assert code == 0 and (design["rollouts_per_step"], design["batch_size"], design["capacity"]) == (10, 64, 10)
    replay = ReplayConfig.from_optimal_json(design, group_size=8)
    # whole groups of 8 next to 10.24: 8 or 16; the rule's cost (1 + b (1 + y))(1 + mu / y) picks the cheaper
    b = 10 / 64
    costs = {r: (1 + b * (1 + 64 / r)) * (1 + 5.28 / (64 / r)) for r in (8, 16)}
    best = min(costs, key=costs.get)
    assert costs[best] == pytest.approx(replay_cost(b, 64 / best, 5.28), rel=1e-12)
    assert (replay.capacity, replay.batch_size, replay.rollouts_per_step) == (best, 64, best) == (8, 64, 8)
    assert replay.notes == ("R = N = 10 of the rule rounded to 8, whole groups of 8 (the cheaper neighbour by the "
                            "rule's cost; regime replay)",)
    assert noise_scale_pick(10.0, 64, 8, 5.28)["rollouts_per_step"] == 8
    # on-policy (b = 1541 / 64 = 24 > 0.75): N = B = R = 64, nothing rounded
    code, out, _ = cli("optimal", "--mu", "5.28", "--noise-scale", "1541", "-B", "64", "--objective", "noise-scale",
                       "--json")
    replay = ReplayConfig.from_optimal_json(json.loads(out), group_size=8)
    assert (replay.capacity, replay.batch_size, replay.rollouts_per_step, replay.notes) == (64, 64, 64, ())


def test_design_json_of_the_forgetting_rule_feeds_the_trainer_its_winner(cli, optimal_profile):
    # replay is offered under SGD as far as the profile's staleness table reaches (theory/guarded.py, issue 38)
    code, out, _ = cli("optimal", "--mu", "5.28", "--profile", optimal_profile(100.0), "-B", "512", "--kappa", "0.5",
                       "--optimizer", "sgd", "--group-size", "8", "--latency-floor", "128", "--json")
    design = json.loads(out)
    replay = ReplayConfig.from_optimal_json(design, group_size=8)
    rep = design["designs"]["replay"]  # the winner here (test_cli_optimal): N = x R, B, R in whole groups
    assert design["winner"] == "replay" and (replay.capacity, replay.batch_size, replay.rollouts_per_step) == (
        rep["capacity"], rep["batch_size"], rep["rollouts_per_step"]) and replay.notes == ()
    code, out, _ = cli("optimal", "--mu", "5.28", "--json")
    with pytest.raises(ValueError, match="the optimal --json output has no design"):
        ReplayConfig.from_optimal_json(json.loads(out), group_size=8)


def test_design_json_without_a_noise_scale_is_refused():
    with pytest.raises(ValueError, match="has no design: run `replay-theory optimal` with the noise scale"):
        ReplayConfig.from_optimal_json({"objective": "noise-scale", "batch": None, "b_noise": None}, group_size=8)

"""`replay-theory simulate | sweep | calibrate-simulator`: JSON values, resume without repeats, one-line errors.

Integration tier: the slower tests of this module (a calibrate run); the fast ones are in
tests/unit/test_simulate_cli.py.
"""

import json

import pytest


def test_calibrate_writes_a_profile_that_optimal_reads(tmp_path, cli):
    profile = tmp_path / "profile.json"
    code, out, err = cli("calibrate-simulator", "--out", str(profile), "--seeds", "2", "--steps", "40",
                         "--eval-every", "20", "--num-prompts", "16", "--checkpoints", "2", "--samples", "64",
                         "--staleness", "0,2,8,16", "--max-gap", "8")
    assert code == 0, err
    data = json.loads(profile.read_text())
    assert data["kind"] == "table" and data["staleness"][0] == 0 and len(data["sigma_sq"]) == len(data["staleness"])
    assert data["sigma_sq_form"] == "signal-normalised" and data["loss"] == "grpo" and data["reference"] == "exact"
    assert data["probe_capacity"] == 9 * 64 and "probe capacity raised from 256 to 576" in out
    forms = data["forms"]
    assert forms["retained_signal"]["value"][0] == pytest.approx(1.0, abs=1e-12)  # exact grad F: r(0) = 1
    assert forms["plain"]["value"][0] == pytest.approx(forms["signal_normalised"]["value"][0], rel=1e-9)
    assert data["sigma_sq"] == forms["signal_normalised"]["value"][:len(data["sigma_sq"])]
    fit = data["rho_fit"]
    assert fit["max_gap"] == 8 and set(fit["correlation_by_gap"]) == {str(h) for h in range(9)}
    assert ("rho" in data) == fit["in_range"] and fit["ci"][0] <= fit["value"] <= fit["ci"][1]
    args = ["optimal", "--objective", "paper", "--mu", "5.28", "--profile", str(profile), "--json"]
    code, out, err = cli(*(args if fit["in_range"] else args + ["--rho", "0"]))
    assert code == 0 and json.loads(out)["rho"] == (data["rho"] if fit["in_range"] else 0.0)
    code, out, err = cli("calibrate-simulator", "--out", str(profile), "--seeds", "2")
    assert code == 2 and err == (f"replay-theory: error: --out {profile} exists; results are never overwritten: "
                                 "choose a new path\n")

"""The `replay-theory` CLI contract: JSON keys and values, human output, one-line errors with exit 2.

Fast tier; the slower tests of this module (subprocess runs and a sympy derivation) are in
tests/integration/test_cli_subprocess.py.
"""

import json

import pytest

from replay_theory.theory.compute import compute_ratio
from replay_theory.theory.design import power_law_optimum


def test_optimal_json_rollout_cost_default(cli):
    code, out, err = cli("optimal", "--objective", "paper", "--mu", "5.28", "--json")
    assert code == 0 and err == ""
    payload = json.loads(out)
    x, y = power_law_optimum(1 / 5.28, 0.25, 0.1)
    assert payload["convention"] == "rollout-cost" and payload["mu"] == 5.28
    assert payload["alpha"] == 0.25 and payload["rho"] == 0.1
    assert payload["x_star"] == pytest.approx(x, rel=1e-15) and payload["y_star"] == pytest.approx(y, rel=1e-15)
    assert payload["regime"] == "replay"
    assert payload["workers_per_trainer"] == pytest.approx(5.28 / y, rel=1e-14)
    assert payload["compute_ratio"] == pytest.approx((1 + 5.28 / y) / 6.28, rel=1e-14)


def test_optimal_json_paper_sec3_gives_opposite_advice(cli):
    code, out, _ = cli("optimal", "--objective", "paper", "--mu", "5.28", "--convention", "paper-sec3", "--json")
    payload = json.loads(out)
    assert code == 0 and payload["convention"] == "paper-sec3" and payload["regime"] == "on-policy"
    assert payload["x_star_unconstrained"] == pytest.approx(power_law_optimum(5.28, 0.25, 0.1)[0], rel=1e-15)
    assert payload["compute_ratio"] == 1.0


def test_optimal_json_unbounded_has_nulls(cli):
    code, out, _ = cli("optimal", "--objective", "paper", "--mu", "5.28", "--alpha", "0", "--rho", "0", "--json")
    payload = json.loads(out)
    assert code == 0 and payload["regime"] == "unbounded"
    assert payload["x_star"] is None and payload["y_star"] is None and payload["workers_per_trainer"] is None


def test_optimal_human_output_with_rollouts_per_step(cli):
    code, out, _ = cli("optimal", "--objective", "paper", "--mu", "5.28", "--rollouts-per-step", "64")
    assert code == 0
    assert "rollout-cost" in out and "replay" in out
    lines = {line.split()[0] + " " + line.split()[1]: line for line in out.splitlines() if len(line.split()) > 2}
    assert lines["buffer size"].split()[3] == "156" and lines["batch size"].split()[3] == "206"
    assert "2.432" in lines["staleness horizon"] and "3.214" in lines["replay ratio"]
    assert "alpha = 0.25, rho = 0.1" in out


def test_optimal_reads_a_profile(cli, tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"kind": "power_law", "alpha": 0.25, "rho": 0.1}))
    code, out, _ = cli("optimal", "--objective", "paper", "--mu", "5.28", "--profile", str(path), "--json")
    payload = json.loads(out)
    assert code == 0 and payload["alpha"] is None and payload["rho"] == 0.1
    assert payload["x_star"] == pytest.approx(power_law_optimum(1 / 5.28, 0.25, 0.1)[0], rel=1e-6)
    code, out, _ = cli("optimal", "--objective", "paper", "--mu", "5.28", "--profile", str(path), "--rho", "0.0",
                       "--json")
    assert json.loads(out)["rho"] == 0.0  # --rho overrides the profile's


def test_gamma_json_matches_eq2(cli):
    code, out, _ = cli("gamma", "--workers", "6", "--trainers", "2", "--mu", "6.84", "--json")
    payload = json.loads(out)
    assert code == 0 and payload["gamma"] == pytest.approx(compute_ratio(6, 2, 6.84)) == pytest.approx(0.5102, abs=1e-4)
    assert payload["replay_ratio"] == pytest.approx(6.84 * 2 / 6)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["optimal", "--mu", "0"], "--mu must be a number in [0.0001, 10000]"),
        (["optimal", "--mu", "-3"], "--mu must be a number in [0.0001, 10000]"),
        (["optimal", "--mu", "nan"], "--mu must be a number in [0.0001, 10000]"),
        (["optimal", "--mu", "abc"], "'--mu'"),
        (["optimal", "--objective", "paper", "--mu", "5", "--alpha", "-1"], "alpha must be a finite number >= 0"),
        (["optimal", "--objective", "paper", "--mu", "5", "--alpha", "nan"], "alpha must be a finite number"),
        (["optimal", "--objective", "paper", "--mu", "5", "--rho", "-0.1"], "rho must be in [0, 1]"),
        (["optimal", "--objective", "paper", "--mu", "5", "--rho", "nan"], "rho must be in [0, 1]"),
        (["optimal", "--objective", "paper", "--mu", "5", "--convention", "sec3"], "rollout-cost"),
        (["optimal", "--objective", "paper", "--mu", "5", "--profile", "/no/such/file.json"], "cannot be read"),
        (["optimal", "--objective", "paper", "--mu", "5", "-R", "8", "-B", "8"], "not both"),
        (["optimal"], "--mu"),
        (["gamma", "--workers", "0", "--trainers", "2", "--mu", "5"], "workers must be a finite number > 0"),
        (["nonsense"], "nonsense"),
    ],
)
def test_bad_input_is_one_line_exit_2(cli, args, needle):
    code, out, err = cli(*args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("replay-theory: error:")
    assert needle in err and "Traceback" not in err


def test_unreadable_profile_content(cli, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("[1, 2")
    code, out, err = cli("optimal", "--objective", "paper", "--mu", "5", "--profile", str(path))
    assert code == 2 and out == "" and "not valid JSON" in err


def test_derive_latex_of_eta_star_flags_the_factor_two(cli):
    code, out, _ = cli("derive", "eta-star", "--latex")
    assert code == 0 and r"8 \sqrt{6}" in out and r"\frac{derived}{printed} = 2" in out


def test_derive_unknown_name_is_one_line_exit_2(cli):
    code, out, err = cli("derive", "nope")
    assert code == 2 and out == "" and err.count("\n") == 1 and "y-star" in err

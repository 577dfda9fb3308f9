"""`replay-theory optimal --budget`, the large-budget label without it, and honest `gamma` verdicts.

Fast tier; the slower tests of this module (the sympy derivations) are in tests/integration/test_cli_budget_derive.py.
"""

import json

import pytest

from replay_theory.theory.design import finite_budget_design
from replay_theory.theory.profiles import PowerLawProfile

BUDGET = ["--smoothness", "1", "--bias", "0.1", "--f0", "1", "-B", "256"]


def test_optimal_budget_json_is_the_finite_budget_design(cli):
    code, out, err = cli("optimal", "--objective", "paper", "--mu", "5.28", "--budget", "1e4", *BUDGET, "--json")
    assert code == 0 and err == ""
    payload = json.loads(out)
    d = finite_budget_design(budget=1e4, mu=5.28, profile=PowerLawProfile(0.25), rho=0.1, smoothness=1.0,
                             bias=0.1, f0=1.0, batch_size=256)
    assert payload["objective"] == "finite-budget" and payload["budget_regime"] == "step-limited"
    assert (payload["capacity"], payload["rollouts_per_step"], payload["batch_size"]) == (35, 14, 256)
    assert (d.capacity, d.rollouts_per_step) == (35, 14)
    assert payload["bound"] == pytest.approx(d.bound, rel=1e-15) and payload["eta"] == 0.5
    assert payload["updates"] == pytest.approx(1e4 / (5.28 * 14 + 256), rel=1e-14)
    limit = payload["large_budget_limit"]
    assert (limit["fixed"], limit["capacity"], limit["rollouts_per_step"], limit["batch_size"]) == ("B", 194, 80, 256)
    assert payload["regime"] == "replay" and payload["bound_terms"]["step_limited"] is True


def test_optimal_budget_text_reports_both_regimes(cli):
    code, out, _ = cli("optimal", "--objective", "paper", "--mu", "5.28", "--budget", "1e9", *BUDGET)
    assert code == 0 and "noise-limited" in out
    assert "objective: the Thm 3.4 bound at the given compute budget" in out
    assert "large-budget limit (Thm 3.5's J at the same B): N = 194, R = 80, B = 256" in out
    code, out, _ = cli("optimal", "--objective", "paper", "--mu", "5.28", "--budget", "1e4", *BUDGET)
    assert "step-limited: the step size sits at its cap eta_max = 0.5" in out


def test_without_budget_the_output_is_labelled_the_large_budget_limit(cli):
    code, out, _ = cli("optimal", "--objective", "paper", "--mu", "5.28", "--json")
    payload = json.loads(out)
    assert payload["objective"] == "paper-J" and payload["budget"] is None
    assert payload["objective_label"].startswith("the large-budget limit (Thm 3.5)")
    code, out, _ = cli("optimal", "--objective", "paper", "--mu", "5.28")
    assert "objective: the large-budget limit (Thm 3.5)" in out


def test_optimal_never_calls_over_generation_replay(cli):
    code, out, _ = cli("optimal", "--objective", "paper", "--mu", "0.2", "--alpha", "0.1", "--rho", "0")
    assert code == 0
    assert "over-generation" in out and "NOT replay" in out and "what it is: not replay" in out
    assert "what to do: raise B to R" in out
    code, out, _ = cli("optimal", "--objective", "paper", "--mu", "0.5")
    assert "constraint: x* = 0.438 < 1 would mean N < R (infeasible); clamped to the on-policy corner" in out


def test_gamma_above_one_says_worse_than_on_policy(cli):
    code, out, _ = cli("gamma", "-W", "7", "-T", "1", "--mu", "5.28")
    assert code == 0 and "gamma > 1: this split is worse than on-policy" in out
    assert "more generation than training can absorb (W/T = 7 > mu = 5.28)" in out
    code, out, _ = cli("gamma", "-W", "7", "-T", "1", "--mu", "5.28", "--json")
    payload = json.loads(out)
    assert payload["regime"] == "over-generation" and payload["gamma"] == pytest.approx(8 / 6.28)
    code, out, _ = cli("gamma", "-W", "1", "-T", "7", "--mu", "5.28", "--json")
    assert json.loads(out)["regime"] == "replay"
    code, out, _ = cli("gamma", "-W", "4", "-T", "1", "--mu", "4", "--json")
    assert json.loads(out)["regime"] == "on-policy"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--budget", "1e4", "--bias", "0.1", "--f0", "1", "-B", "8"],
         "--budget needs --smoothness: a finite number > 0 (L of Assumption 3.1)"),
        (["--budget", "0", *BUDGET], "--budget must be a finite number > 0 (compute, in per-sample update costs), "
                                     "got 0"),
        (["--budget", "inf", *BUDGET], "--budget must be a finite number > 0"),
        (["--budget", "1e4", "--smoothness", "-1", "--bias", "0", "--f0", "1", "-B", "8"],
         "--smoothness must be a finite number > 0 (L of Assumption 3.1), got -1"),
        (["--budget", "1e4", "--smoothness", "1", "--bias", "-0.5", "--f0", "1", "-B", "8"],
         "--bias must be a finite number >= 0 (kappa of Assumption 3.2), got -0.5"),
        (["--budget", "1e4", "--smoothness", "1", "--bias", "0", "--f0", "nan", "-B", "8"],
         "--f0 must be a finite number > 0 (F(theta_0) - inf F), got nan"),
        (["--smoothness", "1"], "--smoothness only applies with --budget"),
        (["--budget", "1e4", "--smoothness", "1", "--bias", "0", "--f0", "1"],
         "--budget needs --batch-size or --rollouts-per-step"),
        (["--budget", "10", *BUDGET], "--budget must be >= 261.28, the cost of one update of the cheapest design"),
        (["--budget", "abc", *BUDGET], "'--budget'"),
    ],
)
def test_budget_bad_input_is_one_line_exit_2(cli, args, needle):
    code, out, err = cli("optimal", "--objective", "paper", "--mu", "5.28", *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("replay-theory: error:")
    assert needle in err and "Traceback" not in err

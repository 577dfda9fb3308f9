"""``replay-theory optimal`` with the noise-scale rule (the default objective): values by hand, bad input.

Fast tier; the slower tests of this module (the sympy derivations) are in tests/integration/test_cli_noise_scale.py.
"""

from __future__ import annotations

import json
import math

import pytest

from replay_theory.theory import evidence


def test_without_a_noise_scale_it_prints_the_decision_as_a_function_of_b(cli):
    code, out, err = cli("optimal", "--mu", "5.28", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["objective"] == "noise-scale"
    assert data["threshold_b"] == pytest.approx((math.sqrt(6.28) - 1) / 2)  # 4 b (1 + b) = mu: 0.75300
    rows = {round(r["b"], 6): r for r in data["rows"]}
    row = rows[0.1]  # y* = sqrt(5.28 x 11) = 7.621; saving 1.1 x 6.28 / (sqrt(1.1) + sqrt(0.528))^2 = 2.1915
    assert row["regime"] == "replay" and row["y_star"] == pytest.approx(math.sqrt(5.28 * 11))
    assert row["saving"] == pytest.approx(1.1 * 6.28 / (math.sqrt(1.1) + math.sqrt(0.528)) ** 2)
    assert row["saving"] == pytest.approx(2.1915, abs=1e-4)
    assert row["workers_per_trainer"] == pytest.approx(5.28 / math.sqrt(5.28 * 11))
    assert rows[1.0]["regime"] == rows[2.0]["regime"] == "on-policy" and rows[1.0]["saving"] == 1.0
    assert rows[round(data["threshold_b"], 6)]["regime"] == "on-policy"  # at the threshold the saving is exactly 1


def test_the_table_text_names_the_threshold_how_to_measure_b_and_the_papers_answer(cli):
    code, out, _ = cli("optimal", "--mu", "5.28")
    assert code == 0
    lines = out.splitlines()
    start = [i for i, line in enumerate(lines) if line.startswith("replay-theory optimal: mu = 5.28")][0]
    assert start in (0, 1)  # 1: the stored benchmark's verdict comes first (no rule passes)
    assert lines[start + 1].startswith("objective: the noise-scale rule")
    assert lines[start + 2].startswith("evidence: ")
    assert "b = B_noise / B < 0.753" in out
    assert "replay-theory calibrate --from-log LOG --grad-norms" in out and "validate calibrate-model" in out
    assert "--objective paper) answers x* = 2.43, y* = 3.21 (replay) whatever b" in out


def test_a_noise_scale_gives_one_design_rounded_to_the_cheaper_integer_R(cli):
    code, out, _ = cli("optimal", "--mu", "5.28", "--noise-scale", "64", "-B", "256", "--json")
    assert code == 0
    d = json.loads(out)
    b = 64 / 256  # y* = sqrt(5.28 x 5) = 5.138: R = 256 / 5.138 = 49.8, so 49 or 50
    cost = {R: (1 + b * (1 + 256 / R)) * (1 + 5.28 * R / 256) for R in (49, 50)}
    R = min(cost, key=cost.get)
    assert d["regime"] == "replay" and d["rollouts_per_step"] == d["capacity"] == R == 50 and d["batch_size"] == 256
    assert d["y"] == pytest.approx(256 / 50) and d["cost"] == pytest.approx(cost[50])
    assert d["saving"] == pytest.approx((1 + b) * 6.28 / cost[50])
    assert d["workers_per_trainer"] == pytest.approx(5.28 / d["y"])
    assert d["paper"]["x_star"] == pytest.approx(2.432, abs=1e-3)


def test_above_the_threshold_it_stays_on_policy(cli):
    code, out, _ = cli("optimal", "--mu", "5.28", "--noise-scale", "256", "-B", "256")  # b = 1 > 0.753
    assert code == 0
    assert "what to do: stay on-policy (b = 1 >= 0.753" in out
    assert [line.split()[-6] for line in out.splitlines() if line.startswith("  rollouts per step")] == ["256"]


def test_the_profile_carries_b(cli, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"kind": "noise_scale", "noise_scale": {
        "b_noise": 25.6, "b_noise_interval": [20.0, 30.0], "method": "two-batch", "batch": 256}}))
    code, out, _ = cli("optimal", "--mu", "5.28", "--profile", str(path), "-B", "256", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["b"] == pytest.approx(0.1) and d["regime"] == "replay"
    assert "two-batch, 90% interval [20, 30]" in d["noise_scale_source"]


@pytest.mark.parametrize("args, needle", [
    (["--noise-scale", "0", "-B", "256"], "--noise-scale must be a finite number > 0"),
    (["--noise-scale", "-5", "-B", "256"], "--noise-scale must be a finite number > 0"),
    (["--noise-scale", "nan", "-B", "256"], "--noise-scale must be a finite number > 0"),
    (["--noise-scale", "inf", "-B", "256"], "--noise-scale must be a finite number > 0"),
    (["--noise-scale", "100"], "--noise-scale needs -B"),
    (["--noise-scale", "100", "-R", "64"], "--rollouts-per-step applies to --objective paper"),
    (["--alpha", "0.3"], "--alpha applies to --objective paper"),
    (["--budget", "1e4"], "--budget applies to --objective paper"),
    (["--objective", "paper", "--noise-scale", "100"], "--noise-scale applies to the noise-scale rule"),
    (["--objective", "best"], "noise-scale or paper"),
])
def test_bad_noise_scale_input_is_one_line_exit_2(error_line, args, needle):
    assert needle in error_line("optimal", "--mu", "5.28", *args)


@pytest.mark.parametrize("mu", ["1e308", "1e-300", "inf"])
def test_extreme_mu_is_one_line_exit_2(error_line, mu):
    assert "--mu must be a finite number > 0, in [1e-100, 1e100]" in error_line("optimal", "--mu", mu)


def test_a_profile_without_b_is_refused_before_any_work(error_line, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"kind": "table", "staleness": [0, 1], "sigma_sq": [1.0, 1.2]}))
    assert "has no noise_scale record (b is missing)" in error_line("optimal", "--mu", "5", "--profile", str(path),
                                                                   "-B", "64")
    path.write_text(json.dumps({"kind": "noise_scale", "noise_scale": {"b_noise": None}}))
    assert error_line("optimal", "--mu", "5", "--profile", str(path), "-B", "64") == (
        f"--profile {path} has no B_noise (not measurable: no gradient signal where it was measured); or measure "
        "again over more steps or a larger batch")
    path.write_text(json.dumps({"kind": "noise_scale", "noise_scale": {"b_noise": -3}}))
    assert "b_noise' must be a finite number > 0" in error_line("optimal", "--mu", "5", "--profile", str(path))


def test_the_evidence_line_quotes_the_stored_benchmark():
    record = {"command": "replay-theory experiment theory-test --out R", "targets": {"cells": 40, "objectives": {
        "noise_scale": {"within_1.2": 35, "share_within_1.2": 0.875, "within_1.5": 40, "worst": 1.41}}},
        "targets_held_out": {"cells": 20, "objectives": {"noise_scale": {"within_1.2": 18}}}}
    line = evidence.evidence_line("noise-scale", record)
    assert line == ("evidence: within 1.2x of the best design in 35 of 40 benchmark cells (88%), within 1.5x in 40, "
                    "worst 1.41; on held-out instances 18 of 20 within 1.2x (replay-theory experiment theory-test "
                    "--out R, docs/SIMULATION.md)")
    assert evidence.evidence_line("paper", record).startswith("evidence: none stored for the paper objective")


def test_the_first_line_says_when_no_rule_passes_and_names_the_closest():
    record = {"protocol": {"grid": [[1, 1], [4, 2], [16, 2]]}, "targets": {"cells": 100, "objectives": {
        "noise_scale": {"share_within_1.2": 0.63, "worst": 3.2},
        "noise_scale_long": {"share_within_1.2": 0.75, "worst": 2.67},
        "paper_J": {"share_within_1.2": 0.33, "worst": 4.55},
        "on_policy": {"share_within_1.2": 0.61, "worst": 12.0}}},
        "targets_held_out": {"cells": 60, "objectives": {"noise_scale": {"share_within_1.2": 0.66},
                                                         "noise_scale_long": {"share_within_1.2": 0.81}}}}
    assert evidence.verdict_line(record) == (
        "no design rule passes the benchmark (regret <= 1.2 in 85% of cells and <= 1.5 in all): the best, the "
        "noise-scale rule at a long horizon, is within 1.2x in 75% of cells, worst 2.67; always on-policy 61%. Read "
        "the answer below as the best-tested guess, and check it against on-policy on your own run")
    assert evidence.horizon_line(record).startswith(
        "horizon: the rule does not predict one and uses N = R; at the same y a buffer of 16 steps (N = 16 R) was "
        "within 1.2x of the best in 75% of benchmark cells against 63% for N = R (81% vs 66% on held-out instances")
    record["targets"]["objectives"]["noise_scale"] = {"share_within_1.2": 0.9, "worst": 1.4}
    assert evidence.verdict_line(record) is None  # a rule that meets both regret targets passes: no warning
    record["targets"]["objectives"]["noise_scale"]["worst"] = 1.6
    assert evidence.verdict_line(record).startswith("no design rule passes")  # 90% is not enough with a 1.6

"""``replay-theory optimal --objective noise-scale`` and the evidence lines: values by hand, bad input.

Fast tier; the slower tests of this module (the sympy derivations) are in
tests/integration/test_cli_noise_scale_derive.py.
"""

from __future__ import annotations

import copy
import json
import math

import pytest

from replay_theory.advise import evidence


def test_without_a_noise_scale_it_prints_the_decision_as_a_function_of_b(cli):
    code, out, err = cli("optimal", "--mu", "5.28", "--objective", "noise-scale", "--json")
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
    code, out, _ = cli("optimal", "--mu", "5.28", "--objective", "noise-scale")
    assert code == 0
    lines = out.splitlines()
    start = [i for i, line in enumerate(lines) if line.startswith("replay-theory optimal: mu = 5.28")][0]
    assert lines[0].startswith("what to do: measure b = B_noise / B at your batch")  # what to do comes first
    assert start in (1, 2)  # 2: the stored benchmark's verdict follows it (no rule passes)
    assert lines[start + 1].startswith("objective: the noise-scale rule")
    assert lines[start + 2].startswith("evidence (")
    assert "b = B_noise / B < 0.753" in out
    assert "replay-theory calibrate --from-log LOG --grad-norms" in out and "validate calibrate-model" in out
    assert "--objective paper) answers x* = 2.43, y* = 3.21 (replay) whatever b" in out


def test_a_noise_scale_gives_one_design_rounded_to_the_cheaper_integer_R(cli):
    code, out, _ = cli("optimal", "--mu", "5.28", "--noise-scale", "64", "-B", "256", "--objective", "noise-scale",
                       "--json")
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


def test_below_the_threshold_at_a_batch_too_small_to_replay_it_says_so_truly(cli):
    code, out, _ = cli("optimal", "--mu", "5.28", "-B", "1", "--noise-scale", "0.01", "--objective", "noise-scale")
    assert code == 0  # b = 0.01 < 0.753 (replay would pay, y* = sqrt(5.28 x 101) = 23.1) but R = B / y* rounds to 1
    assert ("what to do: stay on-policy (b = 0.01 < 0.753, so replay would pay at y* = 23.1, "
            "but R = B / y* rounded") in out


def test_above_the_threshold_it_stays_on_policy(cli):
    code, out, _ = cli("optimal", "--mu", "5.28", "--noise-scale", "256", "-B", "256",  # b = 1 > 0.753
                       "--objective", "noise-scale")
    assert code == 0
    assert "what to do: stay on-policy (b = 1 >= 0.753" in out
    assert [line.split()[-6] for line in out.splitlines() if line.startswith("  rollouts per step")] == ["256"]


def test_the_profile_carries_b(cli, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"kind": "noise_scale", "noise_scale": {
        "b_noise": 25.6, "b_noise_interval": [20.0, 30.0], "method": "two-batch", "batch": 256}}))
    code, out, _ = cli("optimal", "--mu", "5.28", "--profile", str(path), "-B", "256", "--objective", "noise-scale",
                       "--json")
    assert code == 0
    d = json.loads(out)
    assert d["b"] == pytest.approx(0.1) and d["regime"] == "replay"
    assert "two-batch, 90% interval [20, 30]" in d["noise_scale_source"]


@pytest.mark.parametrize("args, needle", [
    (["--noise-scale", "0", "-B", "256"], "--noise-scale must be a number in [1e-06, 1e+12] (B_noise"),
    (["--noise-scale", "-5", "-B", "256"], "--noise-scale must be a number in [1e-06, 1e+12]"),
    (["--noise-scale", "nan", "-B", "256"], "--noise-scale must be a number in [1e-06, 1e+12]"),
    (["--noise-scale", "inf", "-B", "256"], "--noise-scale must be a number in [1e-06, 1e+12]"),
    (["--noise-scale", "1e-300", "-B", "64"], "--noise-scale must be a number in [1e-06, 1e+12]"),
    (["--noise-scale", "100"], "--noise-scale needs -B"),
    (["--noise-scale", "100", "-R", "64"], "--rollouts-per-step applies to --objective paper"),
    (["--alpha", "0.3"], "--alpha applies to --objective paper"),
    (["--budget", "1e4"], "--budget applies to --objective paper"),
    (["--objective", "paper", "--noise-scale", "100"], "--noise-scale applies to the forgetting-aware and "
                                                       "noise-scale rules, not --objective paper"),
    (["--objective", "best"], "--objective must be one of forgetting, noise-scale, paper, got 'best'"),
    (["--objective", "noise-scale", "--kappa", "0.1"], "--kappa applies to the forgetting-aware rule"),
])
def test_bad_noise_scale_input_is_one_line_exit_2(error_line, args, needle):
    assert needle in error_line("optimal", "--mu", "5.28", *args)


@pytest.mark.parametrize("mu", ["1e308", "1e-300", "inf", "1e100", "20000", "0.00005"])
def test_extreme_mu_is_one_line_exit_2(error_line, mu):
    assert "--mu must be a number in [0.0001, 10000] (a ratio of two costs)" in error_line("optimal", "--mu", mu)


def test_a_profile_without_b_is_refused_before_any_work(error_line, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"kind": "table", "staleness": [0, 1], "sigma_sq": [1.0, 1.2]}))
    assert "has no noise_scale record (b is missing)" in error_line("optimal", "--mu", "5", "--profile", str(path),
                                                                   "-B", "64")
    path.write_text(json.dumps({"kind": "noise_scale", "noise_scale": {"b_noise": None}}))
    assert error_line("optimal", "--mu", "5", "--profile", str(path), "-B", "64") == (
        f"--profile {path} has no B_noise (its noise_scale record has b_noise: null); or measure again over more "
        "steps or a larger batch")  # what the file says, no cause assumed
    path.write_text(json.dumps({"kind": "noise_scale", "noise_scale": {"b_noise": -3}}))
    assert "b_noise' must be a finite number > 0" in error_line("optimal", "--mu", "5", "--profile", str(path))


def _targets(share: float, worst: float, spearman: float | None = 0.8, cells: int = 40) -> dict:
    return {"cells": cells, "free": {"within_1.2": round(share * cells), "share_within_1.2": share,
                                     "within_1.5": cells, "worst": worst},
            "pinned": {"within_1.2": cells, "share_within_1.2": 1.0, "within_1.5": cells, "worst": 1.1},
            "min_setting_spearman": spearman}


def test_the_evidence_line_quotes_the_stored_benchmark():
    record = {"command": "replay-theory experiment theory-test --out R", "protocol": {"headline_floor": 64},
              "targets": {"64": {"cells": 60, "objectives": {"forgetting": _targets(0.7, 2.0, cells=60)}}},
              "targets_held_out": {"64": {"cells": 40, "objectives": {
                  "forgetting": _targets(0.875, 1.41), "on_policy": _targets(0.25, 4.0)}}}}
    line = evidence.evidence_line("forgetting", "forgetting", record)
    assert line == ("evidence (held-out instances, latency floor 64; b fitted to the scored runs' steps, an input no "
                    "user has, 40 test cases): within 1.2x of the cheapest design in 88% (worst 1.41) when the "
                    "batch is free, 100% (worst 1.10) at a pinned batch; lowest per-setting Spearman 0.80; always "
                    "on-policy at B 25%; meets the targets at floors 64 (replay-theory experiment theory-test --out R, "
                    "docs/SIMULATION.md)")
    assert evidence.evidence_line("paper", "paper_J", record).startswith(
        "evidence: none stored for the paper objective")
    record["targets_held_out"]["64"]["objectives"]["on_policy_floor"] = _targets(0.9, 1.78)  # the trivial rule
    assert ("always on-policy at B 25%; the trivial on-policy at max(floor, smallest batch) 90% (worst 1.78); "
            in evidence.evidence_line("forgetting", "forgetting", record))
    del record["targets_held_out"]["64"]  # a run with no held-out instance quotes every instance, and says so
    assert evidence.evidence_line("forgetting", "forgetting", record).startswith(
        "evidence (every instance (none held out), latency floor 64; b fitted to the scored runs' steps, an input no "
        "user has, 60 test cases): within 1.2x of the cheapest design in 70% (worst")
    record["targets"]["64"]["objectives"]["forgetting_b_simple"] = _targets(0.9, 1.3, cells=60)  # the pilot's route
    assert evidence.evidence_line("forgetting", "forgetting", record).startswith(
        "evidence (every instance (none held out), latency floor 64; b from a pilot's B_simple, 60 test cases): within "
        "1.2x of the cheapest design in 90% (worst 1.30)")
    # the printed answer, scored as printed (issue 38): quoted first, with the pilot's compute added beside it, no
    # pinned batch (it answers over every batch), and the floors where it met the targets (none here: 80% < 85%)
    record["targets"]["64"]["objectives"]["printed"] = _targets(0.8, 1.6, spearman=0.75, cells=60)
    record["targets"]["64"]["objectives"]["printed_with_pilot"] = _targets(0.5, 1.9, cells=60)
    assert evidence.evidence_line("forgetting", "forgetting", record) == (
        "evidence (every instance (none held out), latency floor 64; the answer as printed from a one-run pilot's "
        "B_simple, kappa and drift, 8% of the run, none in a run too short for one, 60 test cases): within 1.2x of "
        "the cheapest design in 80% (worst 1.60), 50% counting the pilot's compute; lowest per-setting Spearman 0.75; "
        "meets the targets at none of the floors 64 (replay-theory experiment theory-test --out R, docs/SIMULATION.md)")
    # a record whose protocol read b from the user's logged run (its pilot's b_from) names that route, and its
    # no-pilot cases' answer as on-policy from the log's b alone
    logged = copy.deepcopy(record)
    logged.setdefault("protocol", {}).setdefault("pilot", {})["b_from"] = "recipe log"
    logged["targets"]["64"]["objectives"]["printed"]["routes"] = {
        "piloted": {"cells": 30, **_targets(0.9, 1.2)["free"]}, "no_pilot": {"cells": 30, **_targets(0.7, 1.6)["free"]}}
    assert evidence.evidence_line("forgetting", "forgetting", logged).startswith(
        "evidence (every instance (none held out), latency floor 64; the answer as printed from B_simple over the "
        "user's logged run of their recipe, with a one-run pilot's kappa and drift, 8% of the run, none in a run too "
        "short for one, 60 test cases): within 1.2x of the cheapest design in 80% (worst 1.60), 50% counting the "
        "pilot's compute; with the pilot 90% (worst 1.20) in 30 cases, without one (a run too short for it: "
        "on-policy from the log's b alone) 70% (worst 1.60) in 30; lowest")
    # one that read the drift M2(s) off the log too (its pilot's drift_from) says so, and that its no-pilot cases
    # answer from the log's b and drift
    logged["protocol"]["pilot"]["drift_from"] = "recipe log"
    line = evidence.evidence_line("forgetting", "forgetting", logged)
    assert line.startswith("evidence (every instance (none held out), latency floor 64; the answer as printed from "
                           "B_simple and the drift M2(s) over the user's logged run of their recipe, with a one-run "
                           "pilot's kappa, 8% of the run, none in a run too short for one, 60 test cases)")
    assert "without one (a run too short for it: the log's b and drift, no kappa) 70% (worst 1.60) in 30;" in line
    record["targets"]["0"] = {"cells": 60, "objectives": {"printed": _targets(0.5, float("inf"), cells=60)}}
    record["targets"]["0"]["objectives"]["printed"]["free"]["worst"] = None  # strict JSON: a pick never reached
    line = evidence.evidence_line("forgetting", "forgetting", record)
    assert ("; at latency floor 0 50% (worst never reached) with the batch free; meets the targets at none of the "
            "floors 0, 64") in line


def test_the_verdict_weighs_the_printed_answer_not_the_grid_pick_of_the_same_pilot():
    objectives = {"printed": _targets(0.80, 1.9), "forgetting_b_simple": _targets(0.95, 1.2),
                  "paper_J": _targets(0.1, 9.0)}
    record = {"protocol": {"headline_floor": 64, "batch": 256},
              "targets_held_out": {"64": {"cells": 40, "objectives": objectives}}}
    assert evidence.verdict_line(record) == (  # the grid pick passing does not silence what the printed answer did
        "tested: at a latency floor of a quarter of the batch no rule passes the benchmark (the answer optimal prints "
        "is within 1.2x of the cheapest design in 80% of test cases, bar 85%, worst 1.90x, bar 1.5x)")
    objectives["printed"] = _targets(0.9, 1.4)
    assert evidence.verdict_line(record) is None


def test_the_first_line_says_when_no_rule_passes_and_names_the_closest():
    objectives = {"forgetting_b_simple": _targets(0.80, 1.9), "noise_scale": _targets(0.4, 3.0),
                  "paper_J": _targets(0.1, 9.0), "on_policy": _targets(0.2, 4.0)}
    record = {"protocol": {"headline_floor": 64}, "targets_held_out": {"64": {"cells": 40, "objectives": objectives}}}
    record["protocol"]["batch"] = 256
    assert evidence.verdict_line(record) == (
        "tested: at a latency floor of a quarter of the batch no rule passes the benchmark (the forgetting-aware rule "
        "is within 1.2x of the cheapest design in 80% of test cases, bar 85%, worst 1.90x, bar 1.5x)")
    objectives["forgetting_b_simple"] = _targets(0.9, 1.4)
    assert evidence.verdict_line(record) is None  # the rule meets every target: no warning
    objectives["forgetting_b_simple"] = _targets(0.9, 1.4, spearman=0.6)
    assert evidence.verdict_line(record) == (  # Spearman 0.6 < 0.7: the one bar it misses is named
        "tested: at a latency floor of a quarter of the batch no rule passes the benchmark (the forgetting-aware rule "
        "is within 1.2x of the cheapest design in 90% of test cases, bar 85%, worst 1.40x, bar 1.5x, ranks designs at "
        "Spearman 0.60 in one setting (bar 0.7))")
    record["targets_held_out"]["0"] = {"cells": 40, "objectives": {**objectives,
                                                                   "forgetting_b_simple": _targets(0.7, 3.0)}}
    record["protocol"]["floors"] = [0, 64]  # the user's floor is 0: quoted there, and where a rule passes said after
    objectives["forgetting_b_simple"] = _targets(0.9, 1.4)
    assert evidence.verdict_line(record, floor_ratio=0.0) == (
        "tested: without a latency floor no rule passes the benchmark (the forgetting-aware rule is within 1.2x of the "
        "cheapest design in 70% of test cases, bar 85%, worst 3.00x, bar 1.5x); at a floor of a quarter of the batch "
        "the forgetting-aware rule passes: give yours with --latency-floor")
    assert len(evidence.verdict_line(record, floor_ratio=0.0)) < 300  # one short sentence, not a paragraph
    # the rule fed b fitted to the scored runs is no rule a user can run: passing, it does not silence the verdict
    objectives["forgetting_b_simple"] = _targets(0.8, 1.9)
    objectives["forgetting"] = _targets(0.99, 1.1)
    assert evidence.verdict_line(record).startswith("tested: at a latency floor of a quarter of the batch no rule "
                                                    "passes the benchmark (the forgetting-aware rule is within 1.2x")
    assert evidence.verdict_line({}).startswith("tested: no stored benchmark")
    # no rule passes, and a baseline a user can take scored better: the verdict names it (issue 38)
    objectives["forgetting_b_simple"] = _targets(0.81, 2.13)
    objectives["on_policy_floor"] = _targets(0.806, 1.74)  # 81% as printed, with the lower worst regret
    assert evidence.verdict_line(record).endswith(
        "; the best-tested option here is on-policy at max(floor, smallest batch) (81%, worst 1.74x)")
    objectives["on_policy_floor"] = _targets(0.80, 1.2)  # a lower share: the rule is the best-tested, beside it
    assert evidence.verdict_line(record).endswith(
        "; it is the best-tested option here (on-policy at max(floor, smallest batch): 80%, worst 1.20x)")

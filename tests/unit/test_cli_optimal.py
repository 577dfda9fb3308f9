"""``replay-theory optimal`` (the forgetting-aware whole design, the default): values against theory/forgetting,
what it prints first, its inputs from options and profiles, and bad input."""

from __future__ import annotations

import json
import math

import pytest

from replay_theory.advise import advice
from replay_theory.theory import forgetting as fg


def test_without_measurements_it_says_measure_first_and_tabulates_the_memory(cli):
    code, out, err = cli("optimal", "--mu", "5.28", "--json")
    assert code == 0 and err == ""
    d = json.loads(out)
    assert d["objective"] == "forgetting" and d["measured"] is False
    y, thr = fg.loosest_equal_steps(5.28)
    assert d["loosest_threshold"] == {"psi": pytest.approx(thr), "y": pytest.approx(y)}  # 0.4295 at y = 3.506
    for row in d["memory_table"]:
        assert row["psi"]["16"] == pytest.approx(fg.psi(16, row["kappa"], "adam", 0.9))
        x = row["shortest_horizon"]  # the first horizon whose psi is below the threshold
        assert fg.psi(x, row["kappa"], "adam", 0.9) < thr <= fg.psi(x - 1, row["kappa"], "adam", 0.9)
    code, text, _ = cli("optimal", "--mu", "5.28")
    first = [line for line in text.splitlines() if not line.startswith("no ")][0]  # after a verdict line, if any
    assert first.startswith("what to do: stay on-policy at your batch until you have measured b = B_noise / B")


def test_the_whole_design_is_forgettings_answer(cli):
    code, out, _ = cli("optimal", "--mu", "5.28", "-B", "512", "--noise-scale", "100", "--kappa", "0.5",
                       "--optimizer", "sgd", "--group-size", "8", "--latency-floor", "128", "--json")
    assert code == 0
    d = json.loads(out)
    w = fg.whole_design(100, 512, 5.28, fg.Memory(0.5, "sgd", 0.9, 512.0), group_size=8, floor=128)
    assert d["winner"] == w.winner == "replay"
    rep, on = d["designs"]["replay"], d["designs"]["on_policy"]
    assert (rep["batch_size"], rep["rollouts_per_step"], rep["capacity"]) == (
        w.replay.design.batch_size, w.replay.design.rollouts_per_step, w.replay.design.capacity)
    assert rep["compute_vs_B"] == pytest.approx(w.replay.compute / w.at_batch.compute)
    assert rep["steps_vs_B"] == pytest.approx(w.replay.steps / w.at_batch.steps)
    assert on["batch_size"] == w.on_policy.design.batch_size
    assert rep["batch_size"] % 8 == rep["rollouts_per_step"] % 8 == 0
    assert d["condition"]["threshold_at_y"] == pytest.approx(fg.equal_steps_threshold(rep["y"], 5.28))
    assert d["what_to_do"].startswith(
        f"replay with B = {rep['batch_size']}, R = {rep['rollouts_per_step']}, N = {rep['capacity']}")
    assert "below the" in d["why"]  # the condition that decided it


def test_a_long_memory_keeps_it_on_policy_at_a_smaller_batch(cli):
    code, out, _ = cli("optimal", "--mu", "5.28", "-B", "512", "--noise-scale", "2383", "--kappa", "0.05",
                       "--group-size", "8")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("what to do: train on-policy at a smaller batch, B = R = N = ")  # always first
    # then the benchmark's one-sentence verdict (no rule passes without a latency floor), then why
    assert lines[1].startswith("tested: without a latency floor no rule passes the benchmark (")
    assert lines[2].startswith("why: ") and "above the" in lines[2]
    assert "a smaller on-policy batch allows" in lines[2]


def test_without_kappa_the_answer_assumes_no_forgetting_and_says_so():
    q = advice.Query(mu=5.28, batch_size=256, b_noise=25.6, b_noise_source="test")
    r = advice.advise(q)
    assert r["designs"]["replay"]["psi"] == 1.0  # psi = 1: the noise-scale rule's assumption
    assert any(n.startswith("no memory given") for n in r["notes"])


def test_the_profile_carries_b_kappa_and_the_staleness_table(cli, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({
        "kind": "table", "staleness": [0, 1, 2, 4], "sigma_sq": [1.0, 1.1, 1.3, 2.0], "sigma_sq_form": "plain",
        "noise_scale": {"b_noise": 100.0, "b_noise_interval": [80.0, 130.0], "method": "two-batch", "batch": 512},
        "memory": {"kappa": 0.5, "kappa_interval": [0.4, 0.6], "level": 0.9, "method": "curvature-pairs",
                   "optimizer": "sgd", "beta1": 0.9, "pilot_batch": 512, "units": 64}}))
    code, out, _ = cli("optimal", "--mu", "5.28", "--profile", str(path), "-B", "512", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["kappa"] == 0.5 and d["optimizer"] == "sgd" and "curvature-pairs" in d["kappa_source"]
    assert d["staleness"].startswith("the profile's sigma^2(s) / sigma^2(0)")
    staleness = fg.Staleness((0.0, 1.0, 2.0, 4.0), (1.0, 1.1, 1.3, 2.0))
    w = fg.whole_design(100, 512, 5.28, fg.Memory(0.5, "sgd", 0.9, 512.0), staleness=staleness)
    assert d["designs"]["replay"]["x"] == w.replay.design.x < 64  # a growing r(s) bounds the horizon


@pytest.mark.parametrize("args, message", [
    (["-B", "512", "--noise-scale", "100", "--kappa", "0"], "--kappa must be a finite number >= 1e-09 (the "
                                                            "optimizer's memory, 1/kappa steps), got 0"),
    (["-B", "512", "--noise-scale", "100", "--beta1", "1"], "--beta1 must be a number in [0, 1), got 1"),
    (["-B", "500", "--noise-scale", "100", "--group-size", "8"], "--group-size must be an integer in [1, 10000000] "
                                                                 "that divides -B, got 8"),
    (["-B", "512", "--noise-scale", "100", "--latency-floor", "-1"], "--latency-floor must be in [0, 1e+07] "
                                                                     "(rollouts), got -1"),
    (["-B", "512", "--noise-scale", "100", "--max-steps-ratio", "0.5"], "--max-steps-ratio must be in [1, 1000], "
                                                                        "got 0.5"),
    (["-B", "512", "--noise-scale", "100", "--max-horizon", "0"], "--max-horizon must be an integer in [1, 4096], "
                                                                  "got 0"),
])
def test_bad_forgetting_input_is_one_line_exit_2(error_line, args, message):
    assert error_line("optimal", "--mu", "5.28", *args) == message


SGD_KAPPA = "--kappa must be a finite number in [1e-09, 2) for sgd"
KAPPA_HELP = "(its steps diverge beyond; kappa is 1 / the memory in steps: a memory of 10 steps is --kappa 0.1)"


@pytest.mark.parametrize("args, message", [
    # the memory in steps typed for kappa: SGD's stability limit is kappa = eta h < 2
    (["--kappa", "10", "--optimizer", "sgd"], f"{SGD_KAPPA} {KAPPA_HELP}, got 10"),
    (["--kappa", "2", "--optimizer", "sgd"], f"{SGD_KAPPA} {KAPPA_HELP}, got 2"),
    # Adam's and momentum's: 2 (1 + beta1) / (1 - beta1) = 38 at beta1 = 0.9, 398 at 0.99
    (["--kappa", "1e308"], f"--kappa must be a finite number in [1e-09, 38) for adam at beta1 = 0.9 {KAPPA_HELP}, got "
                           "1e+308"),
    (["--kappa", "400", "--optimizer", "momentum", "--beta1", "0.99"],
     f"--kappa must be a finite number in [1e-09, 398) for momentum at beta1 = 0.99 {KAPPA_HELP}, got 400"),
    # sizes and floors beyond any run: refused before the search (which would allocate per batch)
    (["-B", "1000000000000"], "--batch-size must be an integer in [1, 10000000], got 1000000000000"),
    (["--latency-floor", "1e308"], "--latency-floor must be in [0, 1e+07] (rollouts), got 1e+308"),
    (["--max-steps-ratio", "1e308"], "--max-steps-ratio must be in [1, 1000], got 1e+308"),
    (["--pilot-batch", "100000000", "--kappa", "0.1"], "--pilot-batch must be an integer in [1, 10000000], got "
                                                       "100000000"),
])
def test_implausible_forgetting_input_is_one_line_exit_2(error_line, args, message):
    base = ["-B", "512"] if "-B" not in args else []
    assert error_line("optimal", "--mu", "5.28", *base, "--noise-scale", "2383", *args) == message


def test_a_profiles_kappa_beyond_its_optimizers_limit_is_refused(error_line, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"kind": "noise_scale", "noise_scale": {"b_noise": 100.0, "batch": 64},
                                "memory": {"kappa": 3.0, "optimizer": "sgd", "beta1": 0.9, "method": "test"}}))
    assert error_line("optimal", "--mu", "5.28", "--profile", str(path), "-B", "64").startswith(
        f"--profile {path} (test)'s kappa must be a finite number in [1e-09, 2) for sgd ")


def test_kappa_just_inside_the_limit_answers_and_the_search_is_bounded_in_b(cli):
    """kappa = 1.99 under SGD still answers; B = 10^7 (the largest -B) answers through the bracketed search, whose
    on-policy pick equals the closed form: compute (1 + B_noise/B')(mu + 1) B' rises with B' above any floor, so the
    cheapest on-policy batch is the smallest the steps cap allows, B' = B_noise / (2 (1 + B_noise/B) - 1)."""
    code, out, _ = cli("optimal", "--mu", "5.28", "-B", "512", "--noise-scale", "2383", "--kappa", "1.99",
                       "--optimizer", "sgd")
    assert code == 0 and out.startswith("what to do: ")
    code, out, _ = cli("optimal", "--mu", "5.28", "-B", "10000000", "--noise-scale", "2383", "--json")
    assert code == 0
    record = json.loads(out)
    cap = 2 * (1 + 2383 / 10_000_000)
    smallest = math.ceil(2383 / (cap - 1))  # the first whole batch with 1 + B_noise/B' <= cap
    assert record["designs"]["on_policy"]["batch_size"] == smallest


def test_kappa_given_twice_or_with_another_optimizer_is_refused(error_line, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"kind": "noise_scale", "noise_scale": {"b_noise": 100.0},
                                "memory": {"kappa": 0.5, "optimizer": "adam", "beta1": 0.9, "pilot_batch": 64,
                                           "method": "curvature-pairs"}}))
    assert error_line("optimal", "--mu", "5", "--profile", str(path), "-B", "64", "--kappa", "0.1") == (
        "give kappa once: --kappa or --profile's memory record, not both")
    assert error_line("optimal", "--mu", "5", "--profile", str(path), "-B", "64", "--optimizer", "sgd") == (
        f"--optimizer sgd differs from the adam that --profile {path}'s memory was measured with: leave --optimizer "
        "out")


def test_an_answer_outside_the_tested_range_says_so_in_its_evidence_line(cli):
    """Issue 38's example: replay at B = 442 (not the user's 256) with x = 64 (the grid stops at 16) borrowed the
    benchmark's 98%; now the evidence line says that nobody trained such a design. An on-policy batch inside the
    tested ratios (232 of 512: the benchmark ran 8 ... 256 of 256) is inside."""
    code, out, _ = cli("optimal", "--noise-scale", "1000", "--kappa", "0.2", "--optimizer", "adam", "-B", "256",
                       "--mu", "5.28", "--latency-floor", "64")
    evidence = next(line for line in out.splitlines() if line.startswith("evidence ("))
    assert code == 0 and evidence.endswith("; this answer lies outside the tested grid (replay at B = 442, not your "
                                           "B = 256, x = 64 beyond 16): the benchmark's grid holds replay only at its "
                                           "own batch, x <= 16, y <= 32; answers beyond it count in the shares above "
                                           "only as the printed answers they were.")
    code, out, _ = cli("optimal", "--mu", "5.28", "-B", "512", "--noise-scale", "2383", "--kappa", "0.05",
                       "--group-size", "8", "--latency-floor", "128")
    assert code == 0 and "outside the tested grid" not in out


def test_the_tested_range_by_hand():
    from replay_theory.advise.evidence import outside_tested_range

    record = {"protocol": {"batch": 256, "grid": [[1, 1], [16, 32]], "on_policy_batches": [8, 256]}}

    def design(b, r, n):
        return {"batch_size": b, "rollouts_per_step": r, "capacity": n, "on_policy": b == r == n}

    assert outside_tested_range(design(16, 16, 16), 512, record) is None  # 16 / 512 = 1/32: the lowest ratio run
    assert "0.0156x your batch, the benchmark's grid ran 0.03125x to 1x" in outside_tested_range(design(8, 8, 8), 512,
                                                                                                 record)
    assert outside_tested_range(design(600, 600, 600), 512, record).startswith(
        "this answer lies outside the tested grid: on-policy at B = 600")
    assert outside_tested_range(design(512, 16, 256), 512, record) is None  # x = 16, y = 32: the grid's corner
    assert "(x = 32 beyond 16, y = 64 beyond 32)" in outside_tested_range(design(512, 8, 256), 512, record)
    assert outside_tested_range(design(512, 16, 256), 512, {}) is None  # no stored benchmark: its line says so

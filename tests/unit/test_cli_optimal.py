"""``replay-theory optimal`` (the forgetting-aware whole design, the default): values against theory/forgetting,
what it prints first, its inputs from options and profiles, and bad input."""

from __future__ import annotations

import json
import math

import pytest
from optimal_profile import staleness

from replay_theory.advise import advice
from replay_theory.theory import forgetting as fg
from replay_theory.theory.guarded import guarded_design


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


def test_the_whole_design_is_forgettings_answer(cli, optimal_profile):
    """Replay is offered under SGD as far as the staleness table reaches (theory/guarded.py): a profile measured flat
    to age 63 (tests/helpers/optimal_profile.py). The answer is the guarded rule's: here it moves off the floor
    rule's design to replay, found by the search at a larger b (issue 38: the bare argmin at the measured b was
    replay at B = 264, now B = 1152 wins the worst regret over b x B_FACTORS)."""
    code, out, _ = cli("optimal", "--mu", "5.28", "-B", "512", "--profile", optimal_profile(100.0), "--kappa", "0.5",
                       "--optimizer", "sgd", "--group-size", "8", "--latency-floor", "128", "--json")
    assert code == 0
    d = json.loads(out)
    g = guarded_design(100, 512, 5.28, fg.Memory(0.5, "sgd", 0.9, 512.0), optimizer="sgd", group_size=8, floor=128,
                       staleness=staleness(), max_steps_ratio=advice.NO_BUDGET)  # optimal's default: least compute
    w = fg.whole_design(100, 512, 5.28, fg.Memory(0.5, "sgd", 0.9, 512.0), group_size=8, floor=128,
                        staleness=staleness(), max_steps_ratio=advice.NO_BUDGET, max_age=63)
    assert g.search.replay.design == w.replay.design and g.search.winner == w.winner == "replay"  # forgetting's search
    assert d["winner"] == "replay" and g.moved and not g.choice.design.on_policy
    rep, on = d["designs"]["replay"], d["designs"]["on_policy"]
    assert (rep["batch_size"], rep["rollouts_per_step"], rep["capacity"]) == (
        g.choice.design.batch_size, g.choice.design.rollouts_per_step, g.choice.design.capacity)
    assert rep["compute_vs_B"] == pytest.approx(g.choice.compute / w.at_batch.compute)
    assert rep["steps_vs_B"] == pytest.approx(g.choice.steps / w.at_batch.steps)
    assert on["batch_size"] == w.on_policy.design.batch_size
    assert rep["batch_size"] % 8 == rep["rollouts_per_step"] % 8 == 0
    assert rep["x"] - 1 <= 63  # no sample older than the table reaches
    guard = d["guard"]
    assert guard["moved"] is True and guard["default"]["batch_size"] == g.default.design.batch_size == 128
    assert guard["worst_regret"] == pytest.approx(g.worst_choice)
    assert guard["default_worst_regret"] == pytest.approx(g.worst_default)
    assert g.worst_default > guard["margin"] * g.worst_choice  # beaten by the margin: why it moved
    assert d["condition"]["threshold_at_y"] == pytest.approx(fg.equal_steps_threshold(rep["y"], 5.28))
    assert d["what_to_do"].startswith(
        f"replay with B = {rep['batch_size']}, R = {rep['rollouts_per_step']}, N = {rep['capacity']}")
    assert "below the" in d["why"]  # the condition that decided it


def test_a_long_memory_keeps_it_on_policy_at_a_smaller_batch(cli, optimal_profile):
    """Under SGD with the staleness measured, a memory of 100 steps (kappa 0.01) keeps psi near 1: replay does not
    pay and the answer is on-policy at a smaller batch, the why giving the psi condition. (kappa 0.05, the value this
    test used before the guarded rule, now moves to replay under SGD: its search at 256 b finds replay cheaper; under
    the default adam, below, no replay is offered at all.)"""
    code, out, _ = cli("optimal", "--mu", "5.28", "-B", "512", "--profile", optimal_profile(2383.0), "--kappa", "0.01",
                       "--optimizer", "sgd", "--group-size", "8")
    assert code == 0
    lines = out.splitlines()
    g = guarded_design(2383, 512, 5.28, fg.Memory(0.01, "sgd", 0.9, 512.0), optimizer="sgd", group_size=8,
                       staleness=staleness(), max_steps_ratio=advice.NO_BUDGET)
    assert not g.moved and g.choice.design.batch_size == 8  # the floor rule's: one group, no floor, no budget
    assert lines[0] == "what to do: train on-policy at a smaller batch, B = R = N = 8."  # always first
    # then the benchmark's one-sentence verdict (no rule passes without a latency floor), then why
    assert lines[1].startswith("tested: without a latency floor no rule passes the benchmark (")
    assert lines[2].startswith("why: ") and "above the" in lines[2]
    assert "a smaller on-policy batch allows" in lines[2]
    # under adam (the default optimizer) the answer is on-policy whatever the memory, and the why says so (issue 38:
    # the benchmark found the replay prediction right under SGD only; this line used to give the psi condition)
    code, out, _ = cli("optimal", "--mu", "5.28", "-B", "512", "--noise-scale", "2383", "--kappa", "0.05",
                       "--group-size", "8")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "what to do: train on-policy at a smaller batch, B = R = N = 8."
    assert lines[2].startswith("why: ") and lines[2].endswith("; no replay design offered (the notes say why).")
    assert ("note: no replay or epochs under adam: the benchmark found the replay prediction right under sgd only."
            in lines)


def test_without_kappa_the_answer_assumes_no_forgetting_and_says_so():
    q = advice.Query(mu=5.28, batch_size=256, b_noise=25.6, b_noise_source="test", optimizer="sgd",
                     staleness=staleness())  # replay is priced under SGD, as far as the table reaches
    r = advice.advise(q)
    assert r["designs"]["replay"]["psi"] == 1.0  # psi = 1: the noise-scale rule's assumption
    assert any(n.startswith("no memory given") for n in r["notes"])


def test_the_profile_carries_b_kappa_and_the_staleness_table(cli, tmp_path):
    """The profile's noise_scale, memory and sigma^2(s) table all feed the answer. The table as measured (to age 4)
    also bounds the horizon by its reach (no sample older than it, theory/guarded.py): the same cost measured to age
    63 (its last slope, 0.35 per age, carried on) shows the rising r(s) alone keeps it short."""
    memory = {"kappa": 0.5, "kappa_interval": [0.4, 0.6], "level": 0.9, "method": "curvature-pairs",
              "optimizer": "sgd", "beta1": 0.9, "pilot_batch": 512, "units": 64}
    for ages, sigma_sq in (([0, 1, 2, 4], [1.0, 1.1, 1.3, 2.0]), ([0, 1, 2, 4, 63], [1.0, 1.1, 1.3, 2.0, 22.65])):
        path = tmp_path / "p.json"
        path.write_text(json.dumps({
            "kind": "table", "staleness": ages, "sigma_sq": sigma_sq, "sigma_sq_form": "plain",
            "noise_scale": {"b_noise": 100.0, "b_noise_interval": [80.0, 130.0], "method": "two-batch", "batch": 512},
            "memory": memory}))
        # within 2x on-policy's steps (the default before issue 38): at least compute with no floor the answer is a
        # tiny on-policy batch and replay's best is x = 1
        code, out, _ = cli("optimal", "--mu", "5.28", "--profile", str(path), "-B", "512", "--max-steps-ratio", "2",
                           "--json")
        assert code == 0
        d = json.loads(out)
        assert d["kappa"] == 0.5 and d["optimizer"] == "sgd" and "curvature-pairs" in d["kappa_source"]
        assert d["staleness"].startswith("the profile's sigma^2(s) / sigma^2(0)")
        table = fg.Staleness(tuple(map(float, ages)), tuple(sigma_sq))
        g = guarded_design(100, 512, 5.28, fg.Memory(0.5, "sgd", 0.9, 512.0), optimizer="sgd", staleness=table,
                           max_steps_ratio=2.0)
        best = g.choice if d["regime"] == "replay" else g.search.replay
        w = fg.whole_design(100, 512, 5.28, fg.Memory(0.5, "sgd", 0.9, 512.0), staleness=table, max_age=ages[-1])
        assert d["designs"]["replay"]["x"] == best.design.x == w.replay.design.x
        assert best.design.x - 1 < ages[-1] or ages[-1] == 4  # measured to 63: the rise bounds it, not the reach
        assert best.design.x < 64  # a growing r(s) bounds the horizon


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
    cheapest on-policy batch is the smallest the steps cap r allows, B' = B_noise / (r (1 + B_noise/B) - 1)."""
    code, out, _ = cli("optimal", "--mu", "5.28", "-B", "512", "--noise-scale", "2383", "--kappa", "1.99",
                       "--optimizer", "sgd")
    assert code == 0 and out.startswith("what to do: ")
    # at the old default --max-steps-ratio 2 and at today's (1000: least compute, issue 38), both the guarded
    # rule's floor batch (theory/guarded.py) and the search's pick
    for ratio in (2.0, advice.NO_BUDGET):
        code, out, _ = cli("optimal", "--mu", "5.28", "-B", "10000000", "--noise-scale", "2383", "--max-steps-ratio",
                           f"{ratio:g}", "--json")
        assert code == 0
        record = json.loads(out)
        cap = ratio * (1 + 2383 / 10_000_000)
        smallest = math.ceil(2383 / (cap - 1))  # the first whole batch with 1 + B_noise/B' <= cap
        assert smallest == {2.0: 2382, advice.NO_BUDGET: 3}[ratio]
        assert record["designs"]["on_policy"]["batch_size"] == smallest == record["guard"]["default"]["batch_size"]


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


def test_an_answer_outside_the_tested_range_says_so_in_its_evidence_line(cli, optimal_profile):
    """Issue 38's example: replay at B = 442 (not the user's 256) with x = 64 (the grid stops at 16) borrowed the
    benchmark's 98%; now the evidence line says that nobody trained such a design. The guarded rule answers that
    input (adam) on-policy now; under SGD with the staleness measured to age 63 and b = 3000 its answer is replay at
    B = 595, x = 64, outside the grid too (at b = 1000 the guard, pricing b down to 1/16 of it, keeps the floor rule's
    batch). An on-policy batch inside the tested ratios (the floor rule's 128 of 512: the benchmark ran 8 ... 256 of
    256) is inside."""
    code, out, _ = cli("optimal", "--profile", optimal_profile(3000.0), "--kappa", "0.2", "--optimizer", "sgd", "-B",
                       "256", "--mu", "5.28", "--latency-floor", "64")
    g = guarded_design(3000, 256, 5.28, fg.Memory(0.2, "sgd", 0.9, 256.0), optimizer="sgd", floor=64,
                       staleness=staleness(), max_steps_ratio=advice.NO_BUDGET)
    best = g.choice.design
    assert (best.batch_size, best.x, best.rollouts_per_step, best.on_policy) == (595, 64, 84, False)
    evidence = next(line for line in out.splitlines() if line.startswith("evidence ("))
    assert code == 0 and evidence.endswith("; this answer lies outside the tested grid (replay at B = 595, not your "
                                           "B = 256, x = 64 beyond 16): the benchmark's grid holds replay only at its "
                                           "own batch, x <= 16, y <= 32; answers beyond it count in the shares above "
                                           "only as the printed answers they were.")
    code, out, _ = cli("optimal", "--mu", "5.28", "-B", "512", "--noise-scale", "2383", "--kappa", "0.05",
                       "--group-size", "8", "--latency-floor", "128")
    assert code == 0 and "B = R = N = 128." in out and "outside the tested grid" not in out


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

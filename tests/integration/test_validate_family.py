"""verify --family fixed-b (issue 23): the designs where replay can win, their equal-compute budgets, the noise-scale
rule's pick, both rules' rows in the report, and the options refused before any work."""

import dataclasses
import json
import math

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from replay_theory.figures.results import save_report_figure  # noqa: E402
from replay_theory.theory.noise_scale import noise_scale_pick, replay_cost  # noqa: E402
from replay_theory.validate.config import VerifyConfig  # noqa: E402
from replay_theory.validate.families import (  # noqa: E402
    design_cost,
    fixed_b_designs,
    horizon_designs,
    steps_at_budget,
)
from replay_theory.validate.loop import (  # noqa: E402
    ValidateConfig,
    _rl_config,
    load_predicted,
    run_verify,
    staleness_of_calibration,
    verify_settings,
)
from replay_theory.validate.report import prediction_rows, predictions_markdown  # noqa: E402
from replay_theory.validate.verdict import compare  # noqa: E402

B64 = ValidateConfig(rollouts_per_step=64, group_size=8)
PAPER_ON_POLICY = {"regime": "on-policy", "capacity": None, "batch_size": None, "rollouts_per_step": 64,
                   "x_star": math.inf, "y_star": 1.0}
PAPER_REPLAY = {"regime": "replay", "capacity": 128, "batch_size": 128, "rollouts_per_step": 64, "x_star": 2.0,
                "y_star": 2.0}


def sizes(design):
    """A verify design's buffer, N, B, R."""
    c = design.config
    return c.buffer, c.capacity, c.batch_size, c.rollouts_per_step


def test_the_rules_pick_by_hand():
    """mu = 5.28, B = 64: replay pays iff b < (sqrt(6.28) - 1) / 2 = 0.7530; y* = sqrt(mu (1 + 1/b))."""
    mu = 5.28
    # b = 0.25 (B_noise 16): y* = sqrt(26.4) = 5.138, B / y* = 12.46 between the groups R = 8 and 16:
    # (1 + 0.25 x 9)(1 + 5.28 / 8) = 5.395 > (1 + 0.25 x 5)(1 + 5.28 / 4) = 5.22: R = 16, y = 4
    pick = noise_scale_pick(16.0, 64, 8, mu)
    assert (pick["regime"], pick["rollouts_per_step"], pick["capacity"], pick["y"]) == ("replay", 16, 16, 4.0)
    assert pick["b"] == 0.25 and pick["y_star"] == pytest.approx(math.sqrt(26.4))
    assert pick["cost"] == pytest.approx(2.25 * 2.32) and pick["on_policy_cost"] == pytest.approx(1.25 * 6.28)
    assert pick["threshold_b"] == pytest.approx((math.sqrt(6.28) - 1) / 2)
    # b = 0.1: y* = sqrt(58.08) = 7.62, B / y* = 8.40: R = 8 (cost 1.9 x 1.66 = 3.154) beats R = 16 (3.48)
    pick = noise_scale_pick(6.4, 64, 8, mu)
    assert (pick["rollouts_per_step"], pick["y"]) == (8, 8.0) and pick["cost"] == pytest.approx(1.9 * 1.66)
    # groups of 2: R = 12 ((1 + 0.25 (1 + 16/3))(1 + 0.99) = 5.1408) beats R = 14 (5.157)
    pick = noise_scale_pick(16.0, 64, 2, mu)
    assert pick["rollouts_per_step"] == 12 and pick["cost"] == pytest.approx((1 + 0.25 * (1 + 16 / 3)) * 1.99)
    assert pick["cost"] < replay_cost(0.25, 64 / 14, mu)
    # b = 1: 4 b (1 + b) = 8 > 5.28: on-policy at B
    pick = noise_scale_pick(64.0, 64, 8, mu)
    assert (pick["regime"], pick["rollouts_per_step"], pick["capacity"], pick["y"]) == ("on-policy", 64, 64, 1.0)
    assert pick["cost"] == pick["on_policy_cost"] == pytest.approx(2 * 6.28)


def test_fixed_b_designs_and_their_equal_compute_budgets_by_hand():
    """mu = 0.5, B = 64, K = 8, budget = 24 on-policy updates = 24 (0.5 x 64 + 64) = 2304; a step costs mu R + B."""
    mu, budget = 0.5, 2304.0
    pick = noise_scale_pick(16.0, 64, 8, 5.28)  # R = 16: the family's replay y=4
    designs, centres = fixed_b_designs(B64, PAPER_REPLAY, pick)
    got = {d.name: sizes(d) for d in designs}
    assert got == {"on-policy": ("on-policy", 64, 64, 64), "replay y=2": ("fifo", 32, 64, 32),
                   "replay y=4": ("fifo", 16, 64, 16), "replay y=8": ("fifo", 8, 64, 8),
                   "on-policy B/2": ("on-policy", 32, 32, 32), "on-policy B/4": ("on-policy", 16, 16, 16),
                   "predicted": ("fifo", 128, 128, 64)}
    assert centres == {"noise-scale": "replay y=4", "paper": "predicted"} and all(d.family for d in designs)
    assert {d.config.group_size for d in designs} == {8} and {d.config.loss for d in designs} == {"grpo"}
    # updates: floor(2304 / (0.5 R + B)): 2304 / 96, / 80, / 72, / 68, / 48, / 24, / 160
    steps = {d.name: steps_at_budget(d.config, budget, mu) for d in designs}
    assert steps == {"on-policy": 24, "replay y=2": 28, "replay y=4": 32, "replay y=8": 33, "on-policy B/2": 48,
                     "on-policy B/4": 96, "predicted": 14}
    by_name = {d.name: d for d in designs}
    assert design_cost(by_name["replay y=2"].config, 28, mu) == {"fresh_rollouts": 896, "samples_trained": 1792,
                                                                "compute": 2240.0}
    assert design_cost(by_name["replay y=8"].config, 33, mu) == {"fresh_rollouts": 264, "samples_trained": 2112,
                                                                "compute": 2244.0}
    assert design_cost(by_name["on-policy B/4"].config, 96, mu)["compute"] == 2304.0
    # the run trains each design with its own R: buffer of N = R, B drawn per update
    rl = _rl_config(verify_settings(B64), by_name["replay y=8"], 33, B64.lr, seed=0)
    assert (rl.rollouts_per_step, rl.batch_size, rl.capacity, rl.buffer) == (8, 64, 8, "fifo")
    rl = _rl_config(verify_settings(B64), by_name["on-policy B/2"], 48, B64.lr, seed=0)
    assert (rl.rollouts_per_step, rl.batch_size, rl.capacity, rl.buffer) == (32, 32, 32, "on-policy")
    # a pick off the family's grid is added; the paper's on-policy is the family's on-policy; no B_noise: no pick
    designs, centres = fixed_b_designs(ValidateConfig(rollouts_per_step=64, group_size=2), PAPER_ON_POLICY,
                                       noise_scale_pick(16.0, 64, 2, 5.28))
    assert [d.name for d in designs][-1] == "noise-scale rule" and len(designs) == 7
    assert sizes(designs[-1]) == ("fifo", 12, 64, 12)
    assert centres == {"noise-scale": "noise-scale rule", "paper": "on-policy"}
    designs, centres = fixed_b_designs(B64, PAPER_ON_POLICY, None, group_replay=True)
    assert centres == {"paper": "on-policy"} and len(designs) == 6 + 3 and not designs[-1].family


def test_horizon_family_adds_long_buffers_at_equal_compute_by_hand():
    """horizon = fixed-b + replay y = 4 at x = 16 and 32: R = 16, N = 256 and 512, B = 64; at mu = 0.5 a step costs
    0.5 x 16 + 64 = 72 whatever N, so both train floor(2304 / 72) = 32 updates, like replay y=4 at x = 1."""
    designs, _ = fixed_b_designs(B64, PAPER_REPLAY, None)
    designs = horizon_designs(B64, designs)
    got = {d.name: sizes(d) for d in designs[-2:]}
    assert got == {"replay y=4 x=16": ("fifo", 256, 64, 16), "replay y=4 x=32": ("fifo", 512, 64, 16)}
    assert [steps_at_budget(d.config, 2304.0, 0.5) for d in designs[-2:]] == [32, 32]
    assert len({d.name for d in designs}) == len(designs) == 9
    rl = _rl_config(verify_settings(B64), designs[-1], 32, B64.lr, seed=0)
    assert (rl.rollouts_per_step, rl.batch_size, rl.capacity, rl.buffer) == (16, 64, 512, "fifo")


def test_verify_reads_an_old_predicted_json_as_the_new_shape(tmp_path):
    """predicted.json saved before the design kept DesignConfig's names (N, B, R) gives verify the same prediction and
    the same designs as one written now."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    (old / "predicted.json").write_text(json.dumps({"mu": 5.28, "N": 128, "B": 128, "R": 64, "regime": "replay",
                                                    "x_star": 2.0, "y_star": 2.0}))
    (new / "predicted.json").write_text(json.dumps({**PAPER_REPLAY, "mu": 5.28}))
    assert load_predicted(old) == load_predicted(new) == {**PAPER_REPLAY, "mu": 5.28}
    assert fixed_b_designs(B64, load_predicted(old), None) == fixed_b_designs(B64, PAPER_REPLAY, None)


def test_staleness_of_the_calibration_is_its_drift():
    st = staleness_of_calibration({"kl_by_lag": {"1": 0.01, "2": 0.04, "4": 0.16}})
    assert st.ages == (0.0, 1.0, 2.0, 4.0) and st.ratio == pytest.approx((1.0, 1.02, 1.08, 1.32))
    assert staleness_of_calibration({}).flat


def test_report_rows_of_both_rules_by_hand():
    """Three designs, 4 paired seeds; the rule picks replay y=4 (best), the paper on-policy (worst)."""
    rewards = {"on-policy": [0.1, 0.2, 0.3, 0.2], "replay y=2": [0.2, 0.25, 0.3, 0.25],
               "replay y=4": [0.3, 0.4, 0.35, 0.45]}
    rows = [{"name": n, "family": True, "final_rewards": r, "final_reward_mean": float(np.mean(r))}
            for n, r in rewards.items()]
    names = list(rewards)

    def verdict_of(name):
        return compare(np.array(list(rewards.values())), names, names.index(name), np.ones(3, bool),
                       np.random.default_rng(0), draws=200)

    pick = noise_scale_pick(16.0, 64, 8, 5.28)
    record = {"b_noise": 16.0, "b_noise_interval": [8.0, None], "level": 0.9, "method": "per-sample", "batch": 64,
              "unit_size": 8, "source": "test"}
    out = prediction_rows(rows, {"noise-scale": "replay y=4", "paper": "on-policy"}, pick, record,
                          PAPER_ON_POLICY, verdict_of, 8)
    rule, paper = out
    assert (rule["rule"], rule["design"], paper["rule"], paper["design"]) == (
        "noise-scale", "replay y=4", "paper", "on-policy")
    assert rule["input"]["b_noise"] == 16.0 and rule["pick"] == pick
    # at the interval's ends: b = 0.125 (y* = sqrt(5.28 x 9) = 6.89, B / y* = 9.29: R = 8) and b = inf (on-policy)
    assert rule["pick_at_interval"][0]["rollouts_per_step"] == 8 and rule["pick_at_interval"][1] is None
    assert rule["verdict"]["family"]["rank"] == 1 and rule["verdict"]["family"]["regret"] == 0.0
    # strongest rival of the best: replay y=2 (mean 0.25 > 0.2); differences 0.1, 0.15, 0.05, 0.2: mean 0.125,
    # var (ddof 1) 0.0125 / 3, seeds for 2 se = ceil(4 var / mean^2) = ceil(1.07) = 2
    sep = rule["separation"]
    assert sep["design"] == "replay y=2" and sep["difference"] == pytest.approx(0.125)
    assert sep["se"] == pytest.approx(math.sqrt(0.0125 / 3 / 4)) and sep["seeds_needed"] == 2
    # the paper's on-policy: rank 3, regret 0.375 - 0.2; rival replay y=4: differences -0.2, -0.2, -0.05, -0.25
    assert paper["verdict"]["family"]["rank"] == 3
    assert paper["verdict"]["family"]["regret"] == pytest.approx(0.175)
    assert paper["separation"]["design"] == "replay y=4" and paper["separation"]["difference"] == pytest.approx(-0.175)
    assert paper["separation"]["seeds_needed"] == max(2, math.ceil(4 * (0.0225 / 3) / 0.175**2))
    text = "\n".join(predictions_markdown({"predictions": out}))
    assert "B_noise = 16 (per-sample, 90% interval [8, -]" in text and "b = B_noise / B = 0.25 at B = 64" in text
    assert "pick replay R = N = 16 (y = 4)" in text
    assert "at the interval's ends: replay R = 8, on-policy (b = inf)" in text
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith("| noise-scale | replay y=4 |"))
    assert "| 1 of 3 [" in row and "| 0.0000 [" in row and row.endswith("| replay y=2 | +0.1250 +- 0.0323 | 2 |")
    row = next(line for line in lines if line.startswith("| paper | on-policy |"))
    assert "| 3 of 3 [" in row and "| 0.1750 [" in row and "| replay y=4 | -0.1750 +- " in row
    # issue 23's test, first or within one paired se of the best: the rule first (0.125 / 0.0323 = 3.9 se ahead);
    # the paper behind by 0.175, se sqrt(0.0225 / 3 / 4) = 0.0433: 4.0 se, not within one
    assert rule["criterion"] == {"first": True, "within_one_se": True, "rival": "replay y=2", "difference": sep[
        "difference"], "se": sep["se"], "in_se": pytest.approx(0.125 / math.sqrt(0.0125 / 12))}
    assert paper["criterion"]["within_one_se"] is False and paper["criterion"]["in_se"] == pytest.approx(
        -0.175 / math.sqrt(0.0075 / 4))
    assert "- noise-scale rule (replay y=4): ranks first, ahead of replay y=2 by 0.1250 (3.9 paired se)" in lines
    assert "- paper rule (on-policy): NOT within one paired se of the best (replay y=4): behind by 0.1750 (4.0 " \
           "paired se)" in lines
    # no measured B_noise: the rule's row says so, the paper's is still there
    out = prediction_rows(rows, {"paper": "on-policy"}, None, {}, PAPER_ON_POLICY, verdict_of, 8)
    assert out[0]["verdict"] is None and out[1]["verdict"]["family"]["rank"] == 3
    text = "\n".join(predictions_markdown({"predictions": out}))
    assert "no prediction" in text and "| noise-scale | - | - | - | - | - | - | - |" in text


def test_bad_family_options_one_line_before_any_work(error_line, tmp_path):
    assert error_line("validate", "verify", "--out", str(tmp_path), "--family", "wide") == (
        "--family must be one of neighbours, fixed-b, horizon, reuse, got 'wide'")
    assert error_line("validate", "all", "--out", str(tmp_path / "new"), "--family", "fixed-b",
                      "--rollouts-per-step", "16", "--group-size", "4") == (
        "--family fixed-b needs --rollouts-per-step (its B) a multiple of 8 x --group-size = 32 (R = B/8 whole "
        "groups), got 16")
    # verify reads B and K from the calibration: refused before the warm start is loaded
    (tmp_path / "predicted.json").write_text("{}")
    (tmp_path / "calibration_summary.json").write_text(json.dumps({"config": {"rollouts_per_step": 24,
                                                                              "group_size": 4}}))
    assert error_line("validate", "verify", "--out", str(tmp_path), "--family", "fixed-b", "--thorough") == (
        "--family fixed-b needs --rollouts-per-step (its B) a multiple of 8 x --group-size = 32 (R = B/8 whole "
        "groups), got 24")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calibration_summary.json", "predicted.json"]
    with pytest.raises(ValueError, match="--family must be one of"):
        VerifyConfig(family="").validated()


def test_thorough_keeps_the_neighbours_family_unless_fixed_b_is_asked(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import replay_theory.validate.loop as loop
    from replay_theory.cli.app import app

    plans = []
    monkeypatch.setattr(loop, "run_calibrate", lambda config, out, log, progress: {})
    monkeypatch.setattr(loop, "run_predict", lambda config, out, log, rho=None: None)
    monkeypatch.setattr(loop, "run_verify", lambda config, out, plan, log, progress, figure: plans.append(plan) or {
        "measured_best": {"name": "on-policy"}})
    runner = CliRunner()
    result = runner.invoke(app, ["validate", "all", "--out", str(tmp_path), "--thorough", "--family", "fixed-b"])
    assert result.exit_code == 0 and result.output.endswith(f"report: {tmp_path / 'report-fixed-b.md'}\n")
    assert runner.invoke(app, ["validate", "all", "--out", str(tmp_path), "--thorough"]).exit_code == 0
    assert plans == [VerifyConfig(16, 96, False, "auto", False, "fixed-b"), VerifyConfig(16, 96, False, "auto")]


TINY_FIXED_B = ValidateConfig(n_train=40, n_test=4, sft_steps=2, rollouts_per_step=16, group_size=2, probe_steps=9,
                              samples=4, max_new_tokens=4)


def _hand_made_run(out):
    """A run directory for TINY_FIXED_B: its warm start, and a hand-made calibration with B_noise = 4 and
    prediction (x* = y* = 2), so verify runs without the calibration's minutes."""
    from replay_theory.validate.loop import prepare_policy

    out.mkdir()
    prepare_policy(TINY_FIXED_B, out, TINY_FIXED_B.problems()[0])
    record = {"b_noise": 4.0, "b_noise_interval": [2.0, 40.0], "level": 0.9, "per_checkpoint": [4.0], "checkpoints": 1,
              "method": "per-sample", "batch": 16, "unit_size": 2, "source": "hand-made for the test"}
    (out / "calibration.json").write_text(json.dumps({"mu_timing": 1.0, "mu_count": 1.0, "count_window": {},
                                                      "staleness": [0.0, 1.0], "sigma_sq": [1.0, 1.0], "rho": 0.0,
                                                      "noise_scale": record}))
    (out / "profile.json").write_text(json.dumps({"fits": {}}))
    # a predicted.json of the shape saved before the design kept DesignConfig's names: verify reads N, B, R
    (out / "predicted.json").write_text(json.dumps({"mu": 5.28, "x_star": 2.0, "y_star": 2.0, "N": 32, "B": 32,
                                                    "R": 16, "regime": "replay"}))
    return out


@pytest.mark.slow
def test_fixed_b_verify_end_to_end_on_the_tiny_model(tmp_path):
    """B = 16, K = 2, 2 seeds, budget 2 on-policy updates at mu = 5.28, a hand-made calibration with B_noise = 4
    (b = 0.25: R = 4, the family's replay y=4); every design's records carry its own R and the equal budget."""
    config = TINY_FIXED_B
    out = _hand_made_run(tmp_path / "run")
    report = run_verify(config, out, VerifyConfig(seeds=2, budget_updates=2, family="fixed-b"), log=lambda *_: None,
                        figure=save_report_figure)  # the figure the CLI hands in
    mu, budget = 5.28, 2 * (5.28 * 16 + 16)
    assert [d["name"] for d in report["designs"]] == ["on-policy", "replay y=2", "replay y=4", "replay y=8",
                                                      "on-policy B/2", "on-policy B/4", "predicted"]
    for d in report["designs"]:
        R, B = d["rollouts_per_step"], d["batch_size"]
        assert d["steps"] == max(1, math.floor(budget * (1 + 1e-9) / (mu * R + B)))
        assert d["fresh_rollouts"] == d["steps"] * R and d["compute"] == pytest.approx(d["steps"] * (mu * R + B))
    steps = {d["name"]: d["steps"] for d in report["designs"]}
    # 200.96 / 100.48, / 58.24, / 37.12, / 26.56, / 50.24, / 25.12, / 116.48
    assert steps == {"on-policy": 2, "replay y=2": 3, "replay y=4": 5, "replay y=8": 7, "on-policy B/2": 4,
                     "on-policy B/4": 8, "predicted": 1}
    rule, paper = report["predictions"]
    assert (rule["design"], rule["pick"]["rollouts_per_step"], paper["design"]) == ("replay y=4", 4, "predicted")
    assert rule["verdict"]["family"]["designs"] == 7 and paper["verdict"] == report["verdict"]
    paper_input = paper["input"]  # the old predicted.json's N, B, R under DesignConfig's names
    assert (paper_input["capacity"], paper_input["batch_size"], paper_input["rollouts_per_step"]) == (32, 32, 16)
    saved = json.loads((out / "report-fixed-b.json").read_text())
    assert saved["budget"]["family"] == "fixed-b" and not (out / "report.json").exists()
    markdown = (out / "report-fixed-b.md").read_text()
    assert "## The rules' predictions in the fixed-b family" in markdown and "](report-fixed-b.png)" in markdown
    assert (out / "report-fixed-b.png").stat().st_size > 0
    # the records hold the run's own R: on-policy B/4 trained 8 updates of 4 fresh completions
    run = json.loads((out / "verify" / "on-policyBover4_seed0.json").read_text())
    assert (run["fresh_rollouts"], run["samples_trained"]) == (32, 32)


@pytest.mark.slow
def test_verify_in_two_worker_processes_writes_the_same_runs_as_one(tmp_path):
    """--jobs 2 trains the runs in two loky worker processes: every run record (weights' held-out evaluation, the
    training rewards, compute) and the report's rows equal the one-process run's, bit for bit; a run directory
    half trained by one process count is finished by another, and the log says how many runs were saved."""
    import shutil

    one = _hand_made_run(tmp_path / "one")
    two = tmp_path / "two"
    shutil.copytree(one, two)
    plan = VerifyConfig(seeds=2, budget_updates=2, family="fixed-b")
    report_one = run_verify(TINY_FIXED_B, one, plan, log=lambda *_: None)
    # the second directory starts with 5 of the 14 runs finished by the one-process run (a resumed run)
    finished = sorted((one / "verify").glob("*_seed*.json"))
    (two / "verify").mkdir()
    for path in finished[:5]:
        shutil.copy(path, two / "verify" / path.name)
    logged = []
    report_two = run_verify(TINY_FIXED_B, two, dataclasses.replace(plan, jobs=2), log=logged.append)
    assert logged[1] == "verify: 5 of 14 runs saved; training the other 9 in 2 processes"
    assert sum(" seed " in line and "held-out reward" in line for line in logged) == 9  # each trained run, once
    assert len(finished) == 14 and sorted(p.name for p in (two / "verify").glob("*_seed*.json")) == [
        p.name for p in finished]
    for path in finished:
        assert json.loads((two / "verify" / path.name).read_text()) == json.loads(path.read_text()), path.name
    assert report_two["designs"] == report_one["designs"] and report_two["verdict"] == report_one["verdict"]


def test_jobs_is_checked_before_any_work(error_line, tmp_path):
    assert error_line("validate", "verify", "--out", str(tmp_path / "x"), "--jobs", "0") == (
        "--jobs must be -1 (all cores) or an integer >= 1, got 0")
    assert error_line("validate", "all", "--out", str(tmp_path / "y"), "--jobs", "-2") == (
        "--jobs must be -1 (all cores) or an integer >= 1, got -2")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_a_worker_stops_when_its_verify_is_gone(monkeypatch):
    """A --jobs worker checks at every step that the verify that started it lives: once its parent process is
    gone (the worker is re-parented), the next step stops it, so no orphan trains beside a restarted verify."""
    import os

    from replay_theory.validate.loop import _WorkerBar

    monkeypatch.setattr(os, "getppid", lambda: 4242)
    bar = _WorkerBar()
    bar.tick()
    bar.advance()  # the parent lives: nothing happens
    monkeypatch.setattr(os, "getppid", lambda: 1)
    with pytest.raises(SystemExit, match="verify \\(process 4242\\) is gone; this worker stops"):
        bar.tick()

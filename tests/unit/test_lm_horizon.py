"""experiments/lm_horizon.py: the forgetting-aware model's reading of a horizon-family report, against hand values."""

from __future__ import annotations

import json

import numpy as np
import pytest

from replay_theory.experiments import lm_horizon
from replay_theory.theory import forgetting as fg

MU, B_NOISE, KAPPA = 5.28, 100.0, 0.1


def row(name, N, B, R, rewards):
    return {"name": name, "N": N, "B": B, "R": R, "x": N / R, "y": B / R, "family": True,
            "final_rewards": list(rewards), "final_reward_mean": float(np.mean(rewards))}


ROWS = [row("on-policy", 64, 64, 64, [0.25, 0.26, 0.24, 0.25]),
        row("on-policy B/2", 32, 32, 32, [0.27, 0.29, 0.26, 0.26]),
        row("replay y=4", 16, 64, 16, [0.20, 0.22, 0.21, 0.21]),
        row("replay y=4 x=16", 256, 64, 16, [0.19, 0.21, 0.20, 0.20]),
        row("predicted", 510, 403, 64, [0.19, 0.20, 0.18, 0.19])]


def test_model_rows_are_the_hand_computed_steps_times_cost():
    memory = fg.Memory(KAPPA, "adam", 0.9, 64.0)
    out = lm_horizon.model_rows(ROWS, B_NOISE, MU, memory)
    assert "predicted" not in out["rows"]  # N = 510 is not a whole number of R = 64 steps: not priced
    on_policy = (1 + B_NOISE / 64) * (MU * 64 + 64)  # S/S_min = 1 + B_noise / B; cost = mu R + B
    half = (1 + B_NOISE / 32) * (MU * 32 + 32)
    replay = (1 + B_NOISE / 64 * (1 + 4 * 1.0 - 1 / 16)) * (MU * 16 + 64)  # psi = 1 at x = 1; V_eff B = 1 + y - 1/N
    flat = out["rows"]
    assert flat["on-policy B/2"]["psi = 1"]["compute"] == pytest.approx(half / on_policy, rel=1e-12)
    assert flat["replay y=4"]["psi = 1"]["compute"] == pytest.approx(replay / on_policy, rel=1e-12)
    for label in ("feedback", "no feedback", "psi = 1"):  # x = 1 keeps psi = 1 in every model
        assert flat["replay y=4"][label]["psi"] == 1.0 and flat["on-policy"][label]["compute"] == 1.0
    # without the step feedback psi is the closed form at the measured kappa
    assert flat["replay y=4 x=16"]["no feedback"]["psi"] == pytest.approx(float(fg.psi(16, KAPPA, "adam", 0.9)),
                                                                         rel=1e-12)
    assert flat["replay y=4 x=16"]["psi = 1"]["psi"] == 1.0
    # at psi = 1 a longer buffer only drops the -1/N term: x = 16 costs a little more than x = 1; the rewards here
    # fall in that order, a perfect rank correlation
    order = sorted(flat, key=lambda n: flat[n]["psi = 1"]["compute"])
    assert order == ["on-policy B/2", "on-policy", "replay y=4", "replay y=4 x=16"]
    assert out["spearman"]["psi = 1"] == pytest.approx(1.0)


def test_the_best_design_against_every_other_is_the_paired_difference():
    verdict = lm_horizon.best_against_all(ROWS, seed=0)
    assert verdict["all"]["best"] == "on-policy B/2"
    pairs = {p["design"]: p for p in verdict["pairs"]}
    diff = np.array(ROWS[1]["final_rewards"]) - np.array(ROWS[0]["final_rewards"])  # 0.02, 0.03, 0.02, 0.01
    assert pairs["on-policy"]["difference"] == pytest.approx(0.02)
    assert pairs["on-policy"]["se"] == pytest.approx(diff.std(ddof=1) / 2)


def test_markdown_prints_both_tables_and_main_refuses_a_missing_run(tmp_path, capsys):
    report = {"mu": MU, "designs": ROWS, "config": {"seed": 0}}
    profile = {"noise_scale": {"b_noise": B_NOISE},
               "memory": {"kappa": KAPPA, "optimizer": "adam", "beta1": 0.9, "pilot_batch": 64.0}}
    text = lm_horizon.markdown(report, profile)
    assert "| predicted | 7.97 | 6.3 | 0.1900 | n/a (N not a multiple of R)" in text
    renamed = [{**{k: v for k, v in r.items() if k not in ("N", "B", "R")}, "capacity": r["N"], "batch_size": r["B"],
                "rollouts_per_step": r["R"]} for r in ROWS]  # the rows verify writes now
    assert lm_horizon.markdown({**report, "designs": renamed}, profile) == text
    assert "| on-policy B/2 minus | difference +- paired se | beyond 2 se | seeds for 2 se |" in text
    assert "| on-policy | +0.0200 +- 0.0041 | yes |" in text
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "report-horizon.json").write_text(json.dumps(report))
    (tmp_path / "run" / "profile.json").write_text(json.dumps(profile))
    assert lm_horizon.main([str(tmp_path / "run")]) == 0
    assert capsys.readouterr().out.strip() == text
    with pytest.raises(SystemExit) as exit_info:
        lm_horizon.main([str(tmp_path / "missing")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().endswith("not found: run `replay-theory validate verify --out "
                                                    f"{tmp_path / 'missing'} --family horizon` first")


def test_the_pilot_route_re_scores_the_same_rows_with_its_b_beside_the_runs(tmp_path, capsys):
    report = {"mu": MU, "designs": ROWS, "config": {"seed": 0}}
    profile = {"noise_scale": {"b_noise": B_NOISE},
               "memory": {"kappa": KAPPA, "optimizer": "adam", "beta1": 0.9, "pilot_batch": 64.0}}
    memory = fg.Memory(KAPPA, "adam", 0.9, 64.0)
    pilot = {"noise_scale": {"b_noise": 10.0}}  # a pilot without kappa: the run's kappa with the pilot's b
    line = lm_horizon.pilot_line(ROWS, MU, memory, B_NOISE, pilot)
    theirs = lm_horizon.model_rows(ROWS, 10.0, MU, memory)["spearman"]
    ours = lm_horizon.model_rows(ROWS, B_NOISE, MU, memory)["spearman"]
    assert line == ("pilot route: B_noise = 10 (the run's: 100), the run's kappa 0.1; Spearman(predicted compute, "
                    f"-reward): feedback {theirs['feedback']:.2f} (run's B_noise: {ours['feedback']:.2f}), no feedback "
                    f"{theirs['no feedback']:.2f} (run's B_noise: {ours['no feedback']:.2f}), psi = 1 "
                    f"{theirs['psi = 1']:.2f} (run's B_noise: {ours['psi = 1']:.2f})")
    # at psi = 1 a smaller b makes the smaller on-policy batch cheaper still than at b = 100: hand, on-policy B/2
    # against B: (1 + 10/32)(5.28 x 32 + 32) / ((1 + 10/64)(5.28 x 64 + 64)) = 0.567
    rows = lm_horizon.model_rows(ROWS, 10.0, MU, memory)["rows"]
    assert rows["on-policy B/2"]["psi = 1"]["compute"] == pytest.approx((1 + 10 / 32) * 6.28 * 32 / (
        (1 + 10 / 64) * 6.28 * 64), rel=1e-12)
    assert lm_horizon.pilot_line(ROWS, MU, memory, B_NOISE, {"noise_scale": {"b_noise": None}}).startswith(
        "pilot: no B_noise > 0 in its profile (None)")
    with_kappa = {"noise_scale": {"b_noise": 10.0}, "memory": {"kappa": 0.5, "optimizer": "adam", "beta1": 0.9,
                                                                "pilot_batch": 64.0}}
    assert ", the pilot's kappa 0.5;" in lm_horizon.pilot_line(ROWS, MU, memory, B_NOISE, with_kappa)
    run = tmp_path / "run"
    run.mkdir()
    (run / "report-horizon.json").write_text(json.dumps(report))
    (run / "profile.json").write_text(json.dumps(profile))
    (tmp_path / "pilot.json").write_text(json.dumps(pilot))
    assert lm_horizon.main([str(run), "--pilot", str(tmp_path / "pilot.json")]) == 0
    assert line in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        lm_horizon.main([str(run), "--pilot", str(tmp_path / "nope.json")])
    assert exit_info.value.code == 2 and "--pilot" in capsys.readouterr().err

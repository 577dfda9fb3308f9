"""verify --family reuse (issue 40): the fixed-b family plus the trainers' reuse knobs on the language model
(num_iterations 2 and 4, selective and uniform replay at N = 2B) and optimal's printed answer, at equal compute."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from replay_theory.theory.designs import Design  # noqa: E402
from replay_theory.validate.config import ValidateConfig, VerifyConfig  # noqa: E402
from replay_theory.validate.families import (  # noqa: E402
    design_cost,
    fixed_b_designs,
    reuse_designs,
    steps_at_budget,
)
from replay_theory.validate.loop import _rl_config, run_verify, verify_settings  # noqa: E402

from .test_validate_family import PAPER_ON_POLICY, TINY_FIXED_B, _hand_made_run  # noqa: E402

B64 = ValidateConfig(rollouts_per_step=64, group_size=8)


def test_reuse_designs_and_their_equal_compute_budgets_by_hand():
    """mu = 5.28, B = 64: budget 48 (5.28 x 64 + 64) = 19,292.16. num_iterations e: one generation of 64 (337.92)
    every e updates of 64, so e = 2 buys 41 generations = 82 updates (19,102.72; an 83rd update needs a 42nd
    generation: 19,504.64) and e = 4 buys 32 generations = 128 updates (19,005.44; 129 would cost 19,407.36).
    Selective and uniform replay at N = 128, R = B = 64 cost a step 401.92 like on-policy: 48 updates."""
    base, _ = fixed_b_designs(B64, PAPER_ON_POLICY, None)
    designs, name = reuse_designs(B64, base, Design.on_policy_at(8, 8))
    new = {d.name: d.config for d in designs[len(base):]}
    assert list(new) == ["num_iterations 2", "num_iterations 4", "1-step-off", "4-step-off", "selective replay x=2",
                         "replay x=2", "optimal's answer"] and name == "optimal's answer"
    assert [(c.buffer, c.epochs, c.mini_batches, c.rollouts_per_step, c.batch_size) for c in
            (new["num_iterations 2"], new["num_iterations 4"])] == [("epochs", 2, 1, 64, 64), ("epochs", 4, 1, 64, 64)]
    assert [(c.buffer, c.capacity, c.batch_size, c.rollouts_per_step) for c in
            (new["selective replay x=2"], new["replay x=2"], new["optimal's answer"])] == [
        ("selective", 128, 64, 64), ("fifo", 128, 64, 64), ("on-policy", 8, 8, 8)]
    budget, mu = 48 * (5.28 * 64 + 64), 5.28
    steps = {n: steps_at_budget(c, budget, mu) for n, c in new.items()}
    assert steps == {"num_iterations 2": 82, "num_iterations 4": 128, "1-step-off": 47, "4-step-off": 44,
                     "selective replay x=2": 48, "replay x=2": 48, "optimal's answer": 384}
    # k-step-off: each batch of 64 trained once, k updates late, the queue pre-filled with k base batches at step 0
    assert [(c.buffer, c.stale_k, c.batch_size, c.rollouts_per_step, c.loss) for c in
            (new["1-step-off"], new["4-step-off"])] == [("stale-k", 1, 64, 64, "grpo"), ("stale-k", 4, 64, 64, "grpo")]
    # k = 1: the first step generates 2 x 64 (739.84), every later one 401.92: 1 + floor(18,552.32 / 401.92) = 47;
    # k = 4: the first generates 5 x 64 (1,753.6): 1 + floor(17,538.56 / 401.92) = 44
    assert design_cost(new["1-step-off"], 47, mu) == pytest.approx(
        {"fresh_rollouts": 48 * 64, "samples_trained": 47 * 64, "compute": 48 * 337.92 + 47 * 64})
    assert design_cost(new["4-step-off"], 44, mu)["compute"] == pytest.approx(48 * 337.92 + 44 * 64)
    assert design_cost(new["4-step-off"], 45, mu)["compute"] == pytest.approx(19_438.08)  # > budget: 49 generations
    assert design_cost(new["num_iterations 2"], 82, mu) == pytest.approx(
        {"fresh_rollouts": 41 * 64, "samples_trained": 82 * 64, "compute": 41 * 337.92 + 82 * 64})
    over = {e: design_cost(new[f"num_iterations {e}"], steps, mu)["compute"] for e, steps in ((2, 83), (4, 129))}
    assert over == pytest.approx({2: 19504.64, 4: 19407.36}) and min(over.values()) > budget
    assert design_cost(new["num_iterations 4"], 128, mu)["fresh_rollouts"] == 32 * 64
    # a printed answer already in the family is named there, not added again
    again, name = reuse_designs(B64, base, Design.on_policy_at(16, 8))
    assert name == "on-policy B/4" and len(again) == len(designs) - 1
    assert reuse_designs(B64, base, None)[1] is None
    # the run trains the epochs design with the trainers' knob and the selective buffer as itself
    rl = _rl_config(verify_settings(B64), designs[len(base)], 82, B64.lr, seed=0)
    assert (rl.buffer, rl.epochs, rl.mini_batches, rl.batch_size, rl.rollouts_per_step) == ("epochs", 2, 1, 64, 64)
    rl = _rl_config(verify_settings(B64), designs[len(base) + 3], 44, B64.lr, seed=0)
    assert (rl.buffer, rl.stale_k, rl.batch_size, rl.rollouts_per_step) == ("stale-k", 4, 64, 64)
    rl = _rl_config(verify_settings(B64), designs[len(base) + 4], 48, B64.lr, seed=0)
    assert (rl.buffer, rl.capacity, rl.batch_size, rl.rollouts_per_step) == ("selective", 128, 64, 64)


def test_reuse_needs_a_budget_the_4_step_off_arm_fits_in():
    with pytest.raises(ValueError, match=r"^--budget-updates must be an integer >= 6 with --family reuse \(its "
                                         r"4-step-off arm pre-fills 4 batches at step 0\), got 5$"):
        VerifyConfig(budget_updates=5, family="reuse").validated()
    assert VerifyConfig(budget_updates=6, family="reuse").validated().budget_updates == 6
    assert VerifyConfig(budget_updates=2, family="fixed-b").validated().budget_updates == 2


@pytest.mark.slow
def test_reuse_verify_end_to_end_places_optimals_answer(tmp_path):
    """B = 16, K = 2, 2 seeds, budget 6 on-policy updates, the hand-made calibration (B_noise = 4) and --kappa 0.3:
    the family trains, every record keeps the equal budget, and optimal's printed answer is placed among them."""
    out = _hand_made_run(tmp_path / "run")
    report = run_verify(TINY_FIXED_B, out, VerifyConfig(seeds=2, budget_updates=6, family="reuse", kappa=0.3),
                        log=lambda *_: None, figure=None)
    assert [d["name"] for d in report["designs"]] == [
        "on-policy", "replay y=2", "replay y=4", "replay y=8", "on-policy B/2", "on-policy B/4",
        "forgetting-aware rule", "predicted", "num_iterations 2", "num_iterations 4", "1-step-off", "4-step-off",
        "selective replay x=2", "replay x=2", "optimal's answer"]
    budget = 6 * (5.28 * 16 + 16)  # 602.88
    for d in report["designs"]:
        assert d["compute"] <= budget * (1 + 1e-9)
    by_name = {d["name"]: d for d in report["designs"]}
    # num_iterations 2: a generation of 16 (84.48) every 2 updates of 16: 3 generations = 6 updates (445.44); a 7th
    # update needs a 4th generation: 4 x 84.48 + 7 x 16 = 449.92, an 8th 465.92, a 9th 5 x 84.48 + 144 = 566.4,
    # a 10th 582.4, an 11th 6 x 84.48 + 176 = 682.88 > 602.88: 10 updates, 5 generations
    assert by_name["num_iterations 2"]["steps"] == 10 and by_name["num_iterations 2"]["fresh_rollouts"] == 80
    # 4-step-off: the first update generates 5 x 16 (438.4), each later one 100.48: 1 + floor(164.48 / 100.48) = 2
    # updates, 6 generations; 1-step-off: 1 + floor((602.88 - 184.96) / 100.48) = 5 updates, 6 generations
    assert [(by_name[n]["steps"], by_name[n]["fresh_rollouts"]) for n in ("4-step-off", "1-step-off")] == [
        (2, 96), (5, 96)]
    optimal = next(p for p in report["predictions"] if p["rule"] == "optimal")
    assert optimal["input"]["regime"] == "on-policy" and optimal["design"] in by_name
    assert optimal["input"]["what_to_do"].startswith(("train on-policy", "stay on-policy"))
    assert optimal["verdict"]["family"]["designs"] == sum(d["family"] for d in report["designs"])
    markdown = (out / "report-reuse.md").read_text()
    assert "optimal (the guarded rule, what `replay-theory optimal` prints for these inputs" in markdown
    assert json.loads((out / "report-reuse.json").read_text())["budget"]["family"] == "reuse"
    assert math.isfinite(by_name["selective replay x=2"]["final_reward_mean"])

"""Time within a compute budget (issue 40): ``Prediction.work``, the on-policy work limit [W1], the searches and the
guard under ``max_work_ratio``, and ``optimal --max-work-ratio``.

Work is a design's steps times its step's cost without the latency floor's waiting (mu R / (e m) + B; overlapped
mu R + B): the GPU time spent, which the budget bounds relative to on-policy at the user's B.
"""

from __future__ import annotations

import json
import math

import pytest

from replay_theory.theory import forgetting as fg
from replay_theory.theory.designs import Design
from replay_theory.theory.guarded import guarded_design

MEMORY = fg.Memory(0.2, "adam", 0.9, 256.0)


def test_work_is_steps_times_the_floorless_step_by_hand():
    # on-policy B' = 100, B_noise = 1000, mu = 5: steps 1 + 10 = 11; work 11 (5 x 100 + 100) = 6600 at any floor,
    # compute 11 (5 x 2048 + 100) = 113,740 at a floor of 2048
    p = fg.predict(Design.on_policy_at(100), 1000.0, 5.0, None, floor=2048.0)
    assert (p.steps, p.work, p.compute) == (11.0, 6600.0, 113740.0)
    assert fg.predict(Design.on_policy_at(100), 1000.0, 5.0, None).work == p.work
    # overlapped at B = R = 100: steps 1 + 10 r(1) = 11 without staleness; work 11 (5 x 100 + 100), compute
    # 11 max(5 x 2048, 600)
    o = fg.predict(Design.overlapped_at(100), 1000.0, 5.0, None, floor=2048.0)
    assert (o.work, o.compute) == (6600.0, 11 * 5 * 2048.0)
    # epochs: one generation of R = 64 spread over e m = 2 x 2 updates of B = 32: a step costs 5 x 64 / 4 + 32 = 112
    e = fg.predict(Design.epochs_of(64, 2, 2, 8), 1000.0, 5.0, MEMORY, floor=512.0)
    assert e.design.batch_size == 32 and e.work == pytest.approx(e.steps * 112.0, rel=1e-15)
    assert e.compute == pytest.approx(e.steps * (5 * 512 / 4 + 32), rel=1e-15)


@pytest.mark.parametrize("b_noise, batch, ratio", [(1000.0, 256, 1.2), (10.0, 64, 2.0), (1e5, 8, 1.0),
                                                   (3.0, 1000, 7.5)])
def test_the_on_policy_work_limit_is_the_closed_form_and_tight(b_noise, batch, ratio):
    limit = fg.work_batch_limit(b_noise, batch, ratio)
    assert limit == pytest.approx(ratio * (batch + b_noise) - b_noise, rel=1e-15)  # [W1]
    ref = fg.predict(Design.on_policy_at(batch), b_noise, 5.28, MEMORY, floor=4096.0)
    inside = fg.predict(Design.on_policy_at(math.floor(limit)), b_noise, 5.28, MEMORY, floor=4096.0)
    outside = fg.predict(Design.on_policy_at(math.floor(limit) + 1), b_noise, 5.28, MEMORY, floor=4096.0)
    assert inside.work <= ratio * ref.work * (1 + 1e-12) < outside.work


def test_without_b_the_work_top_holds_whatever_b_is():
    assert fg.work_top(2048, 0.0, 256, 8, 1.5) == 384 and fg.work_top(2048, 0.0, 256, 8, math.inf) == 2048
    for b_noise in (1.0, 100.0, 1e4, 1e7):
        ref = fg.predict(Design.on_policy_at(256), b_noise, 5.28, None)
        assert fg.predict(Design.on_policy_at(384), b_noise, 5.28, None).work <= 1.5 * ref.work
    assert fg.work_top(2048, 1000.0, 256, 8, 1.2) == 504  # 1.2 x 1256 - 1000 = 507.2, in whole groups of 8
    assert fg.work_top(2048, 1000.0, 256, 8, 1.0) == 256  # B itself always qualifies
    with pytest.raises(ValueError, match=r"^max work ratio must be in \[1, inf\], got 0.5"):
        fg.work_batch_limit(1.0, 8, 0.5)


@pytest.mark.parametrize("floor, ratio", [(2048.0, 1.2), (2048.0, 2.0), (0.0, 1.0), (512.0, 1.05)])
def test_the_on_policy_search_under_a_work_budget_is_the_naive_loop(floor, ratio):
    b_noise, batch, g, mu = 1000.0, 256, 8, 5.28
    w = fg.whole_design(b_noise, batch, mu, MEMORY, group_size=g, floor=floor, max_steps_ratio=1000.0,
                        max_work_ratio=ratio, max_age=-1, max_staleness=1)
    ref = fg.predict(Design.on_policy_at(batch), b_noise, mu, MEMORY, floor=floor)
    naive = [fg.predict(Design.on_policy_at(k * g), b_noise, mu, MEMORY, floor=floor)
             for k in range(1, 4 * batch // g + 1)]
    allowed = [p for p in naive if p.work <= ratio * ref.work * (1 + 1e-12)]
    assert w.on_policy.design == min(allowed, key=lambda p: p.compute).design
    overlapped = [fg.predict(Design.overlapped_at(k * g), b_noise, mu, MEMORY, floor=floor)
                  for k in range(1, 4 * batch // g + 1)]
    fit = [p for p in overlapped if p.work <= ratio * ref.work * (1 + 1e-12)]
    assert w.overlapped.design == min(fit, key=lambda p: p.compute).design
    assert w.max_work_ratio == ratio


def test_every_answer_keeps_the_budget_and_no_budget_is_the_old_search():
    kwargs = dict(group_size=8, floor=1024.0, max_steps_ratio=1000.0, max_epochs=4, max_staleness=1)
    for memory in (fg.Memory(0.05, "sgd", 0.0, 256.0), MEMORY):
        free = fg.whole_design(200.0, 256, 5.28, memory, **kwargs)
        tight = fg.whole_design(200.0, 256, 5.28, memory, max_work_ratio=1.1, **kwargs)
        for p in (tight.on_policy, tight.replay, tight.epochs, tight.overlapped):
            assert p is None or p.work <= 1.1 * tight.at_batch.work * (1 + 1e-12)
        assert tight.best.compute >= free.best.compute  # a budget never buys time
        huge = fg.whole_design(200.0, 256, 5.28, memory, max_work_ratio=1e300, **kwargs)
        assert (huge.best, huge.winner) == (free.best, free.winner)
    # where it binds: adam at a floor of 1024 without reuse, the free answer is the floor's batch (1024 responses,
    # work (1024 + 200) / (256 + 200) = 2.68x); within 1.1x the largest batch is 1.1 x 456 - 200 = 301.6 -> 296
    free = fg.whole_design(200.0, 256, 5.28, MEMORY, group_size=8, floor=1024.0, max_steps_ratio=1000.0, max_age=-1)
    tight = fg.whole_design(200.0, 256, 5.28, MEMORY, group_size=8, floor=1024.0, max_steps_ratio=1000.0, max_age=-1,
                            max_work_ratio=1.1)
    assert free.best.design.batch_size == 1024 and tight.best.design.batch_size == 296
    assert free.best.work / free.at_batch.work == pytest.approx(1224 / 456, rel=1e-12)


def test_the_guard_keeps_the_floor_rule_within_the_budget():
    g = guarded_design(1000.0, 256, 5.28, MEMORY, optimizer="adam", group_size=8, floor=2048.0,
                       max_steps_ratio=1000.0, max_work_ratio=1.2)
    assert g.default.design.batch_size == 504 and g.choice.design.batch_size == 504
    assert g.choice.work / g.search.at_batch.work == pytest.approx(1504 / 1256, rel=1e-12)  # [W1] at B' = 504
    free = guarded_design(1000.0, 256, 5.28, MEMORY, optimizer="adam", group_size=8, floor=2048.0,
                          max_steps_ratio=1000.0)
    assert free.choice.design.batch_size == 1024  # 4 B, the largest searched: the floor is out of reach


def test_a_budget_the_free_answer_keeps_changes_nothing():
    # the case that showed it: SGD, kappa 0.5, B_noise 30, mu 2, floor 16. Without a budget the guard keeps the floor
    # rule's on-policy B' = 16, whose work is (16 + 30) / (256 + 30) = 0.16x on-policy at B's. Before, --max-work-ratio
    # 1 dropped over-budget candidates from the guard's worst-regret reference, and an epoch design (R = 1024, e = 4,
    # m = 128) then cleared the margin: a budget that binds nothing had traded the guard's robustness away
    memory = fg.Memory(0.5, "sgd", 0.9, 256.0)
    kwargs = dict(optimizer="sgd", group_size=8, floor=16.0, max_steps_ratio=1000.0, max_epochs=4, max_staleness=1)
    free = guarded_design(30.0, 256, 2.0, memory, **kwargs)
    assert free.choice.design == Design.on_policy_at(16)
    assert free.choice.work / free.search.at_batch.work == pytest.approx(46 / 286, rel=1e-12)
    for ratio in (1.0, 1.5, 2.0):
        tight = guarded_design(30.0, 256, 2.0, memory, max_work_ratio=ratio, **kwargs)
        assert (tight.choice, tight.default, tight.worst_choice) == (free.choice, free.default, free.worst_choice)
    # over a grid of inputs: the budgeted choice is the free one wherever that keeps the budget, and otherwise within it
    kept = broke = 0
    for b_noise in (30.0, 3000.0):
        for mu, floor, batch in ((2.0, 16.0, 256), (20.0, 64.0, 64), (5.28, 128.0, 32)):
            for mem in (fg.Memory(0.5, "sgd", 0.9, float(batch)), fg.Memory(0.05, "adam", 0.9, float(batch))):
                kw = dict(kwargs, optimizer=mem.optimizer, floor=floor)
                free = guarded_design(b_noise, batch, mu, mem, **kw)
                for ratio in (1.0, 2.0):
                    tight = guarded_design(b_noise, batch, mu, mem, max_work_ratio=ratio, **kw)
                    cap = ratio * tight.search.at_batch.work * (1 + 1e-12)
                    if free.choice.work <= cap:
                        kept += 1
                        assert tight.choice == free.choice
                    else:
                        broke += 1
                        assert tight.choice.work <= cap
    assert kept > 0 and broke > 0  # both branches exercised


def test_optimal_prints_the_fastest_design_within_the_budget(cli):
    def run(*a):
        code, out, err = cli(*a)
        assert code == 0, err
        return out

    args = ["optimal", "--mu", "5.28", "-B", "256", "--noise-scale", "1000", "--kappa", "0.2", "--group-size", "8",
            "--latency-floor", "2048"]
    out = run(*args, "--max-work-ratio", "1.2")
    assert out.splitlines()[0] == "what to do: train on-policy at a larger batch, B = R = N = 504."
    assert "work (GPU time spent, the floor's waiting not counted) at most 1.2x on-policy's at B" in out
    assert ("  on-policy answer          504     504      504     1      1       0.61x         0.62x    1.00       "
            "1.20x  <- best") in out
    record = json.loads(run(*args, "--max-work-ratio", "1.2", "--json"))
    assert record["max_work_ratio"] == 1.2 and record["designs"]["on_policy"]["work_vs_B"] == pytest.approx(
        (504 + 1000) / (256 + 1000), rel=1e-12)  # on-policy work is (mu + 1)(B' + B_noise) S_min [W1]
    plain = json.loads(run(*args, "--json"))
    assert "max_work_ratio" not in plain and "work_vs_B" not in plain["designs"]["on_policy"]  # as before
    assert plain["batch_size"] == 1024
    unmeasured = run("optimal", "--mu", "5.28", "-B", "256", "--latency-floor", "2048", "--group-size", "8",
                     "--max-work-ratio", "1.5")
    assert unmeasured.startswith("what to do: train on-policy at B = R = N = 384, the floor rule's batch (the smallest "
                                 "whole-group batch at or above the latency floor, at most 1.5x your batch for "
                                 "--max-work-ratio,")


@pytest.mark.parametrize("value", ["0.5", "nan", "1e9", "inf", "-1"])
def test_bad_work_ratio_is_one_line(error_line, value):
    assert error_line("optimal", "--mu", "5.28", "-B", "256", "--max-work-ratio", value).startswith(
        "--max-work-ratio must be in [1, 1000], got ")

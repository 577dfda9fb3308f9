"""theory-test's pilot (issue 38): the rule's inputs come from a pilot disjoint from every scored run, the answer
optimal prints is scored as printed, and the pilot's compute is counted, each against hand-computed values."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from replay_theory.advise import advice
from replay_theory.experiments import theory_bench as tt
from replay_theory.theory import forgetting as fg
from replay_theory.theory.guarded import guarded_design


def _unit(tmp_path, setting: str = "quadratic-noise10", optimizer: str = "sgd") -> tt.Unit:
    options = tt.Options(instances=(0,), settings=(setting,), optimizers=(optimizer,), mus=(1.0, 5.28),
                         floors=(0, 64), seeds=4, quick=True)
    store = tt.Store(tmp_path)
    env, inst = tt.instance_record(store, tt.SETTINGS[setting], 0)
    boot = np.random.default_rng(0).integers(0, options.seeds, size=(tt.BOOTS, options.seeds))
    return tt.Unit(tt.SETTINGS[setting], optimizer, 0, env, inst, store, options, boot,
                   exact=False)


@pytest.mark.parametrize("setting,optimizer", [("quadratic-noise10", "adam"), ("bandit-grpo", "sgd")])
def test_the_pilot_reads_no_scored_run(tmp_path, setting, optimizer):
    """The pilot measured with no scored run trained at all, and again after the scored runs are trained and then
    perturbed (every crossing doubled, the on-policy steps' fit changed): the same record, value for value."""
    alone = _unit(tmp_path / "alone", setting, optimizer)
    tt.tune_at_batch(alone, tt.RECIPE, tt.PILOT_SEED)
    assert set(alone.runs) == {tt.RECIPE}  # nothing scored exists
    pilot = tt.measure_pilot(alone)

    full = _unit(tmp_path / "full", setting, optimizer)
    tt.train_unit(full)
    for record in full.runs.values():  # the grid's outcomes perturbed
        record["crossing"] = (2 * np.asarray(record["crossing"])).tolist()
        record["lrs"] = (1.5 * np.asarray(record["lrs"])).tolist()
    tt.tune_at_batch(full, tt.RECIPE, tt.PILOT_SEED)
    again = tt.measure_pilot(full)
    assert again == pilot
    # the user's logged run of the recipe (b's source): its own seed and store key, the same under the perturbation
    log = tt.measure_recipe_log(alone)
    assert tt.measure_recipe_log(full) == log
    assert log["steps"] == max(2, math.ceil(pilot["recipe_steps"])) and log["runs"] == 1
    assert log["b_simple"]["b_noise"] is not None and len(log["b_simple"]["b_noise_interval"]) == 2
    assert pilot["runs"] == 1 and pilot["steps"] == tt.pilot_steps(pilot["recipe_steps"])
    # the recipe runs on the pilot's own seeds: not the scored on-policy B = 256's (seed = instance)
    scored = full.runs[f"on-policy B={tt.BATCH}"]
    assert full.runs[tt.RECIPE]["runs"] != scored["runs"]


def _pilot(b_noise=120.0, kappa=0.3, drift=None, steps=3, recipe_steps=1000.0) -> dict:
    return {"steps": steps, "hvps": 3, "runs": 1, "b_simple": {"b_noise": b_noise}, "kappa_pairs": {"kappa": kappa},
            "drift": drift, "recipe_steps": recipe_steps}


def test_the_printed_design_is_optimals_answer_from_the_pilots_numbers():
    pilot = _pilot()
    design = tt.printed_design(pilot, "sgd", 5.28, 64)
    # a quadratic's pilot has no drift record: no policy, so a stored sample's cost is known at every age (NO_POLICY,
    # issue 38); optimal's default --max-steps-ratio is 1000 (least compute), printed_design's too
    answer = advice.advise(advice.Query(mu=5.28, batch_size=256, b_noise=120.0, kappa=0.3, optimizer="sgd",
                                        pilot_batch=256, group_size=8, floor=64.0, staleness=fg.NO_POLICY))
    g = guarded_design(120.0, 256, 5.28, fg.Memory(0.3, "sgd", 0.9, 256.0), optimizer="sgd", group_size=8,
                       floor=64.0, staleness=fg.NO_POLICY, max_steps_ratio=advice.NO_BUDGET)
    assert (design.batch_size, design.rollouts_per_step, design.capacity) == (
        answer["batch_size"], answer["rollouts_per_step"], answer["capacity"]) == (
        g.choice.design.batch_size, g.choice.design.rollouts_per_step, g.choice.design.capacity) == (416, 64, 4096)
    assert tt.pilot_query(pilot, "sgd", 5.28, 64)[0].staleness == fg.NO_POLICY
    # under adam the guard offers no replay: the same pilot's answer is on-policy at the floor's batch
    assert tt.printed_design(pilot, "adam", 5.28, 64) == fg.Design.on_policy_at(64)
    # a B_simple not resolved > 0 and no interval: optimal has no --noise-scale to answer from; at its default (least
    # compute) it answers the floor rule's batch, which needs no b (64 at floor 64), under a steps budget B itself
    for missing in (None, -4.0, math.inf):
        assert tt.printed_design(_pilot(b_noise=missing), "sgd", 5.28, 64) == fg.Design.on_policy_at(64)
        assert tt.printed_design(_pilot(b_noise=missing), "sgd", 5.28, 64, 2.0) == fg.Design.on_policy_at(256)
    # with an interval whose lower end is > 0, the rule reads b as a lower bound: --noise-scale that end
    unresolved = {**_pilot(b_noise=None), "b_simple": {"b_noise": None, "b_noise_interval": [40.0, math.inf]}}
    query, notes = tt.pilot_query(unresolved, "sgd", 5.28, 64)
    assert query.b_noise == 40.0
    assert notes == ["B_simple None: not resolved > 0, --noise-scale its 90% interval's lower end 40"]
    query, notes = tt.pilot_query(_pilot(kappa=5.0), "sgd", 5.28, 64)  # kappa 5 >= SGD's limit 2: optimal refuses
    assert query.kappa is None and notes == ["kappa 5: outside optimal's range, no --kappa"]
    # a one-step pilot's drift (age 0 only) is no table: no staleness cost measured beyond age 0 (NO_STALENESS)
    one = {"staleness": [0], "m2": [0.0]}
    assert tt.pilot_query(_pilot(drift=one), "sgd", 5.28, 64)[0].staleness == fg.NO_STALENESS
    two = {"staleness": [0, 2], "m2": [0.0, 0.5]}
    assert tt.pilot_query(_pilot(drift=two), "sgd", 5.28, 64)[0].staleness.ratio == (1.0, 1.5)


def test_the_pilot_compute_by_hand():
    # 3 steps of on-policy 256 at mu 2, floor 64: 3 x (2 x 256 + 256) = 2304; 3 HVPs x 2 x 64 samples = 384
    assert tt.pilot_compute(_pilot(), 2.0, 64) == pytest.approx(2304 + 384)


def test_the_pilots_length_and_when_a_user_runs_none_by_hand():
    # 8% of the recipe: 100 steps give 8, of which 6 steps, their one curvature step and the re-scorings' one fit
    # (6 + 1 + 1 = 8); 113 give 9: 7 + 1 + 1
    assert (tt.PILOT_FRACTION, tt.PILOT_BUDGET, tt.RESCORE_STEPS) == (0.08, 0.1, 1)
    assert [tt.pilot_steps(s) for s in (100.0, 113.0, 24.0, 25.0, 10.0, 50.0)] == [6, 7, 1, 1, 1, 2]
    # the two re-scorings fit in one step: 2 tables x 8 ages x 64 forward passes x 1/3 = 341.3 < 0.5 x 256 + 256
    assert 2 * (len(fg.DRIFT_AGES) - 1 + 1) * tt.RESCORE_SAMPLES * tt.FORWARD_SAMPLE_UPDATES < fg.step_cost(
        256, 256, min(tt.MUS), 0)
    # one step and 3 HVPs: at mu 0.5 a step of B = 256 costs 0.5 x 256 + 256 = 384 and the HVPs 3 x 2 x 64 = 384, so
    # 768 against 8% of 25 steps x 384 = 768 (affordable, at the edge) and of 24 steps x 384 = 737.28 (not)
    assert tt.pilot_affordable(_pilot(steps=1, recipe_steps=25.0), 0.5, 0)
    assert not tt.pilot_affordable(_pilot(steps=1, recipe_steps=24.0), 0.5, 0)
    # at mu 20 a step costs 5376, the pilot 5760, against 0.08 x 24 x 5376 = 10321.92: run at mu 20, not at mu 0.5
    assert tt.pilot_affordable(_pilot(steps=1, recipe_steps=24.0), 20.0, 0)
    # no pilot: optimal is asked with no --noise-scale, --kappa or drift and answers the floor rule's batch (64 at
    # floor 64), where the same pilot at a longer recipe gives the guard's replay answer
    short, long = _pilot(steps=1, recipe_steps=10.0), _pilot(steps=1, recipe_steps=1000.0)
    query, notes = tt.pilot_query(short, "sgd", 5.28, 64)
    assert (query.b_noise, query.kappa, query.staleness, query.pilot_batch) == (None, None, fg.NO_STALENESS, None)
    assert notes == ["no pilot: one of 1 step(s) costs more than 8% of the recipe's 10 steps at mu 5.28, floor 64"]
    assert tt.printed_design(short, "sgd", 5.28, 64) == fg.Design.on_policy_at(64)
    d = tt.printed_design(long, "sgd", 5.28, 64)
    assert (d.batch_size, d.rollouts_per_step, d.capacity) == (416, 64, 4096)


def test_b_comes_from_the_users_logged_run_in_every_cell():
    # the log's B_simple (500) replaces the pilot's (120) where the pilot runs, with the pilot's kappa and drift
    logged = {**_pilot(), "recipe_log": {"b_simple": {"b_noise": 500.0}}}
    query, notes = tt.pilot_query(logged, "sgd", 5.28, 64)
    assert (query.b_noise, query.kappa, query.b_noise_source) == (
        500.0, 0.3, "B_simple over the user's logged run of the recipe")
    # a run too short for a pilot, a log without a drift table (a record from before it): the log's b alone, no
    # kappa, no staleness measured (on-policy answers only)
    short = {**_pilot(steps=1, recipe_steps=10.0, drift=ONE_STEP), "recipe_log": {"b_simple": {"b_noise": 500.0}}}
    query, notes = tt.pilot_query(short, "sgd", 1.0, 0, 2.0)
    assert (query.b_noise, query.kappa, query.staleness) == (500.0, None, fg.NO_STALENESS)
    assert notes[0].startswith("no pilot: one of 1 step(s) costs more than 8% of the recipe's 10 steps")
    # under a steps budget of 2x the b gives the floor rule its batch: 1 + 500 / B' <= 2 (1 + 500 / 256) at
    # B' >= 500 / 4.906 = 101.9, so 104 (13 groups of 8); without b optimal can only keep B (256)
    assert tt.printed_design(short, "sgd", 1.0, 0, 2.0) == fg.Design.on_policy_at(104)
    assert tt.printed_design(_pilot(steps=1, recipe_steps=10.0, drift=ONE_STEP), "sgd", 1.0, 0,
                             2.0) == fg.Design.on_policy_at(256)
    # at least compute (no budget) the on-policy compute (1 + b / B')(mu + 1) B' rises with B' at floor 0: one group
    assert tt.printed_design(short, "sgd", 1.0, 0) == fg.Design.on_policy_at(8)
    # a log whose B_simple is not resolved > 0 leaves the short run with nothing measured, as before the log
    unresolved = {**short, "recipe_log": {"b_simple": {"b_noise": -3.0}}}
    assert tt.pilot_query(unresolved, "sgd", 1.0, 0)[0].b_noise is None


ONE_STEP = {"staleness": [0], "m2": [0.0]}
"""A one-step pilot's drift record on a rollout setting: no age > 0 (``inputs.measure_drift``)."""
LOG_DRIFT = {"staleness": [0, 1, 2, 4, 8, 15], "m2": [0.0, 0.01, 0.02, 0.05, 0.1, 0.2]}
"""A 16-step logged run's drift M2(s) at its last policy (ages in STALENESS up to T = 15, and T)."""


def test_the_drift_comes_from_the_users_logged_run_the_pilots_where_larger():
    log = {"b_simple": {"b_noise": 500.0}, "drift": LOG_DRIFT}
    # no pilot run: the log's table alone, 1 + M2(s), vouching to age 15
    alone = tt.drift_staleness({**_pilot(drift=ONE_STEP), "recipe_log": log}, piloted=False)
    assert alone.ages == (0.0, 1.0, 2.0, 4.0, 8.0, 15.0) and alone.oldest_measured == 15.0
    assert alone.ratio == pytest.approx((1.0, 1.01, 1.02, 1.05, 1.1, 1.2))
    # a pilot of 3 steps measured ages 0, 1, 2 at M2 0, 0.03, 0.015: the larger of the two at ages <= 2, the log's
    # beyond
    early = {"staleness": [0, 1, 2], "m2": [0.0, 0.03, 0.015]}
    both = tt.drift_staleness({**_pilot(drift=early), "recipe_log": log}, piloted=True)
    assert both.ratio == pytest.approx((1.0, 1.03, 1.02, 1.05, 1.1, 1.2))
    assert both.source == "1 + M2(s) over the user's logged run, the pilot's where larger"
    # the same pilot where the user would not run it: not read
    assert tt.drift_staleness({**_pilot(drift=early), "recipe_log": log}, piloted=False) == alone
    # no log's table (a record from before it): the pilot's, or nothing beyond age 0
    assert tt.drift_staleness(_pilot(drift=early), piloted=True).ratio == pytest.approx((1.0, 1.03, 1.015))
    assert tt.drift_staleness(_pilot(drift=ONE_STEP), piloted=True) == fg.NO_STALENESS
    # the quadratic: no policy, no cost at any age, with or without a log
    assert tt.drift_staleness({**_pilot(), "recipe_log": {"b_simple": {"b_noise": 5.0}, "drift": None}},
                              piloted=False) == fg.NO_POLICY
    # the re-scoring counted: 5 ages > 0 x 64 samples x 1/3 of a sample-update, and none without a table
    assert tt.log_compute({"recipe_log": log}) == pytest.approx(5 * 64 / 3)
    assert tt.log_compute(_pilot()) == 0.0


def test_a_short_run_prices_reuse_from_the_logs_drift():
    # a 16-step recipe at mu 2: no pilot (one step costs 2 x 256 + 256 + 384 = 1152 > 0.08 x 16 x 768 = 983); the
    # query carries the log's b and drift, no kappa (psi = 1)
    log = {"b_simple": {"b_noise": 50000.0}, "drift": LOG_DRIFT}
    short = {**_pilot(steps=1, recipe_steps=16.0, drift=ONE_STEP), "recipe_log": log}
    query, notes = tt.pilot_query(short, "sgd", 2.0, 64)
    assert (query.b_noise, query.kappa, query.staleness.oldest_measured) == (50000.0, None, 15.0)
    assert notes[0].endswith("the log's B_simple and drift (no kappa: psi = 1, the optimizer taken never to forget)")
    # at mu 20 the one-step pilot is run (5376 + 384 <= 0.08 x 16 x 5376 = 6881): its kappa 0.3, but it measured no
    # age > 0. Without the log's drift optimal could only answer on-policy; with it, a FIFO of x = 16 (ages 0-15,
    # all measured), R = 184, B' = 1024, as the guard prices it from the same inputs
    query, _ = tt.pilot_query(short, "sgd", 20.0, 64)
    assert query.kappa == 0.3 and query.staleness.oldest_measured == 15.0
    guarded = guarded_design(50000.0, 256, 20.0, fg.Memory(0.3, "sgd", tt.BETA1, 256.0), optimizer="sgd",
                             group_size=8, staleness=query.staleness, floor=64, max_steps_ratio=1000.0)
    assert tt.printed_design(short, "sgd", 20.0, 64) == guarded.choice.design == fg.Design(1024, 184, 2944)
    no_drift = {**short, "recipe_log": {"b_simple": {"b_noise": 50000.0}}}
    assert tt.printed_design(no_drift, "sgd", 20.0, 64).on_policy
    # under Adam the guard offers no reuse, whatever the drift (theory/guarded.py, REUSE_OPTIMIZERS)
    assert tt.printed_design(short, "adam", 20.0, 64).on_policy
    # the quadratic's short run: no policy, so no staleness cost at any age (not a drift table), and its note says so
    quadratic = {**_pilot(steps=1, recipe_steps=16.0), "recipe_log": {"b_simple": {"b_noise": 50000.0}, "drift": None}}
    query, notes = tt.pilot_query(quadratic, "sgd", 2.0, 64)
    assert (query.b_noise, query.kappa, query.staleness) == (50000.0, None, fg.NO_POLICY)
    assert notes[0].endswith("the log's B_simple and no policy to drift (the quadratic) (no kappa: psi = 1, the "
                             "optimizer taken never to forget)")


def _record(pilot: dict, printed_steps: dict[float, list[float]]) -> dict:
    """A unit's record at mu = 1, floor 0 with one printed row per --max-steps-ratio in ``printed_steps`` (ratio ->
    steps by replicate), those ratios saved as the ones trained."""
    designs = {"on-policy B=64": [64, 64, 64, True], "on-policy B=256": [256, 256, 256, True],
               "x=1 y=4": [256, 64, 64, False], "x=16 y=4": [256, 64, 1024, False]}
    steps = {"on-policy B=64": [100.0, 110.0], "on-policy B=256": [40.0, 40.0], "x=1 y=4": [90.0, 80.0],
             "x=16 y=4": [50.0, 55.0]}
    record = {"setting": "s", "optimizer": "sgd", "instance": 0, "exact": False, "pilot": pilot,
              "designs": [{"label": k, "design": v, "steps": steps[k]} for k, v in designs.items()], "printed": []}
    for ratio, trained in printed_steps.items():
        d = tt.printed_design(pilot, "sgd", 1.0, 0, ratio)
        record["printed"].append({"label": tt.printed_label(d),
                                  "design": [d.batch_size, d.rollouts_per_step, d.capacity, d.on_policy],
                                  "steps": trained})
    record["printed_ratios"] = list(printed_steps)
    return record


def test_the_printed_answer_is_scored_as_printed_off_the_grid_with_and_without_the_pilot():
    # the default answer only (as --quick trains): no printed_steps2 row
    record = _record(_pilot(b_noise=500.0), {tt.PRINTED_STEPS_RATIOS[0]: [30.0, 33.0]})
    d = tt.printed_design(record["pilot"], "sgd", 1.0, 0)
    # at optimal's default (least compute), mu = 1 and no floor: the floor rule's one group, on-policy at B = 8 (before
    # issue 38 the default, --max-steps-ratio 2, answered replay at B' = 192, R = 72, x = 64; its row is below)
    assert d == fg.Design.on_policy_at(8)
    assert d not in [fg.Design(*v["design"]) for v in record["designs"]]  # off the grid
    compute = tt.measured_compute(record, 1.0, 0)
    out = tt.score_printed(record, 1.0, 0, compute, spearman=0.8)
    cost = d.rollouts_per_step + d.batch_size  # mu = 1, floor 0: mu R + B per step
    best = 12800.0  # on-policy B=64: 100 steps x 128 (the grid's best, replicate 0)
    assert out["printed"]["free_regret"] == pytest.approx(30 * cost / best)
    pilot = 3 * 512 + 3 * 2 * 64  # 3 steps at B = 256 (mu + 1) + 3 HVPs over 64 samples
    assert out["printed_with_pilot"]["free_regret"] == pytest.approx((30 * cost + pilot) / best)
    assert out["printed"]["pilot_share"] == pytest.approx(pilot / (40 * 512))
    assert out["printed"]["off_grid"] and out["printed"]["spearman"] == 0.8 and "printed_steps2" not in out
    # replicate 1: 33 steps against the replicate's best (on-policy B=64: 110 x 128 = 14080)
    assert out["printed"]["free_ci"] == pytest.approx([33 * cost / 14080] * 2)
    # the perturbation: the grid's outcomes change, the printed design (the rule's input) does not
    moved = copy.deepcopy(record)
    for row in moved["designs"]:
        row["steps"] = [3 * s for s in row["steps"]]
    moved["noise"] = {"b_noise": 1.0}
    assert tt.printed_design(moved["pilot"], "sgd", 1.0, 0) == d
    assert tt.score_printed(moved, 1.0, 0, tt.measured_compute(moved, 1.0, 0), None)["printed"]["free"] == \
        out["printed"]["free"]
    # both rows (the full run): within 2x on-policy's steps the answer is the floor rule's batch within that cap,
    # on-policy at B' = 104 (replay at B' = 560, R = 120, x = 64 beats it by less than the guard's margin of 2), off
    # the grid, scored as its own row; the default's rows are unchanged
    both = _record(_pilot(b_noise=500.0), {1000.0: [30.0, 33.0], 2.0: [20.0, 22.0]})
    steps2 = tt.printed_design(both["pilot"], "sgd", 1.0, 0, 2.0)
    assert steps2 == fg.Design.on_policy_at(104)
    assert steps2 not in [fg.Design(*v["design"]) for v in both["designs"]]
    out2 = tt.score_printed(both, 1.0, 0, tt.measured_compute(both, 1.0, 0), spearman=0.8)
    assert out2["printed"] == out["printed"] and out2["printed_with_pilot"] == out["printed_with_pilot"]
    row = out2["printed_steps2"]
    assert row["free"] == "printed: on-policy B=104" and row["off_grid"] and not row["free_is_replay"]
    assert row["free_regret"] == pytest.approx(20 * (104 + 104) / best)
    assert row["free_ci"] == pytest.approx([22 * (104 + 104) / 14080] * 2)


def test_a_run_too_short_for_a_pilot_is_scored_without_one():
    # recipe 20 steps at mu 1: the one-step pilot costs 512 + 384 = 896 > 0.08 x 20 x 512 = 819.2, so the user runs
    # none: the answer is optimal's without inputs (the floor rule's one group, B = 8 at floor 0), and nothing is added
    record = _record(_pilot(b_noise=500.0, steps=1, recipe_steps=20.0), {tt.PRINTED_STEPS_RATIOS[0]: [30.0, 33.0]})
    assert tt.printed_design(record["pilot"], "sgd", 1.0, 0) == fg.Design.on_policy_at(8)
    out = tt.score_printed(record, 1.0, 0, tt.measured_compute(record, 1.0, 0), spearman=None)
    assert out["printed"]["piloted"] is False and out["printed"]["pilot_share"] == 0.0
    assert out["printed_with_pilot"]["free_regret"] == out["printed"]["free_regret"] == pytest.approx(
        30 * 16 / 12800)
    # the same unit at a 25-step recipe runs its pilot (896 <= 1024) and counts it: 896 / (40 x 512)
    record["pilot"]["recipe_steps"] = 25.0
    out = tt.score_printed(record, 1.0, 0, tt.measured_compute(record, 1.0, 0), spearman=None)
    assert out["printed"]["piloted"] is True and out["printed"]["pilot_share"] == pytest.approx(896 / 20480)


def test_b_crit_from_hvps_is_unbiased_against_its_exact_value():
    """b_crit_record's estimator on Gaussian gradients with known G, H, Sigma: within 5% of tr(H Sigma) / G^T H G."""
    rng = np.random.default_rng(3)
    d, batch = 6, tt.BATCH
    h = np.diag(np.linspace(0.2, 3.0, d))
    sigma = np.diag(np.linspace(2.0, 0.5, d)) * 40.0
    g = np.linspace(1.0, -0.5, d)
    exact = np.trace(h @ sigma) / (g @ h @ g)
    num, ghg = [], []
    for _ in range(4000):
        samples = rng.multivariate_normal(g, sigma, size=batch)  # (256, d) per-sample gradients
        quarters = samples.reshape(4, batch // 4, d).mean(axis=1)
        for xi in (quarters[0] - quarters[1], quarters[2] - quarters[3]):
            num.append(float(xi @ h @ xi))
        whole = samples.mean(axis=0)
        ghg.append(float(whole @ h @ whole))
    record = tt.b_crit_record(num, ghg)
    assert record["b_noise"] == pytest.approx(exact, rel=0.05)
    assert record["trace_h_sigma"] == pytest.approx(np.trace(h @ sigma), rel=0.03)
    assert tt.b_crit_record([], [])["b_noise"] is None
    # the curvature along G swamped: said, never clamped
    assert tt.b_crit_record([80.0, 80.0], [5.0])["reason"].startswith("tr(H Sigma) or G^T H G estimated <= 0")


def test_time_within_a_work_budget_is_scored_by_hand():
    # at floor 64 the answer optimal prints with --max-work-ratio 2 is its answer without one here (on-policy at the
    # floor's B = 64, predicted well within 2x on-policy at B's work), on the grid; the trivial floor rule picks it too
    pilot = _pilot(b_noise=500.0)
    assert tt.printed_design(pilot, "sgd", 1.0, 64, 1000.0, 1, 0, tt.PRINTED_WORK_RATIO) == fg.Design.on_policy_at(64)
    record = _record(pilot, {})
    steps = {"on-policy B=64": [400.0, 100.0], "on-policy B=256": [40.0, 40.0], "x=1 y=4": [90.0, 80.0],
             "x=16 y=4": [50.0, 55.0]}
    for row in record["designs"]:
        row["steps"] = steps[row["label"]]
    assert tt.score_work_budget(record, 1.0, 64, "on-policy B=64") == {}  # a unit that did not train these answers
    record["printed_work_ratios"] = [tt.PRINTED_WORK_RATIO]
    assert tt.score_work_budget(record, 1.0, 0, "on-policy B=64") == {}  # at floor 0 time is work: nothing to score
    out = tt.score_work_budget(record, 1.0, 64, "on-policy B=64")
    # mu = 1, floor 64: time per step 64 + 64 = 128 (B = 64), 512 (B = 256), 64 + 256 = 320 (y = 4); work the same
    # (no design generates fewer than 64). Replicate 0: B = 64 takes 400 x 128 = 51,200, over the budget of
    # 2 x 40 x 512 = 40,960; the fastest within it is x = 16 y = 4 at 50 x 320 = 16,000
    for name in ("printed_work2", "floor_rule_work2"):
        row = out[name]
        assert row["free"] == "on-policy B=64" and not row["free_is_replay"] and row["over_budget"]
        assert row["free_regret"] == pytest.approx(51200 / 16000)
        # replicate 1: B = 64 at 100 x 128 = 12,800 is within budget and the fastest: regret 1
        assert row["free_ci"] == pytest.approx([1.0, 1.0])
    assert not out["printed_work2"]["off_grid"]
    # where the budget binds the menu: on-policy at B never arrives in a replicate (inf work), so there is no budget
    # in it; where it arrives, a design faster than it yet over 2x its work cannot exist while B >= the floor, since
    # time >= work for every design and on-policy at B's time is its work
    record["designs"][1]["steps"] = [40.0, None]
    out = tt.score_work_budget(record, 1.0, 64, "on-policy B=64")
    assert out["printed_work2"]["free_ci"] == pytest.approx([1.0, 1.0])


def test_a_work_budget_that_binds_is_scored_against_the_best_within_it():
    # a floor of 1024 above B = 256: on-policy at B waits for the floor, so a faster design may spend more work. At
    # mu = 1, B_noise 500 optimal answers on-policy B' = 1024 without a budget, whose predicted work (1024 + 500) /
    # (256 + 500) = 2.02x on-policy at B's breaks --max-work-ratio 2; within it the answer is B' = 1008 (1.99x)
    pilot = _pilot(b_noise=500.0)
    assert tt.printed_design(pilot, "sgd", 1.0, 1024) == fg.Design.on_policy_at(1024)
    budgeted = tt.printed_design(pilot, "sgd", 1.0, 1024, 1000.0, 1, 0, tt.PRINTED_WORK_RATIO)
    assert budgeted == fg.Design.on_policy_at(1008)
    record = _record(pilot, {})
    steps = {"on-policy B=64": [400.0, 100.0], "on-policy B=256": [40.0, 40.0], "x=1 y=4": [90.0, 80.0],
             "x=16 y=4": [50.0, 55.0]}
    for row in record["designs"]:
        row["steps"] = steps[row["label"]]
    record["designs"].append({"label": "on-policy B=1024", "design": [1024, 1024, 1024, True], "steps": [24.0, 24.0]})
    record["printed"] = [{"label": tt.printed_label(budgeted), "design": [1008, 1008, 1008, True],
                          "steps": [25.0, 25.0]}]
    record["printed_work_ratios"] = [tt.PRINTED_WORK_RATIO]
    out = tt.score_work_budget(record, 1.0, 1024, "on-policy B=1024")
    # time per step at floor 1024, mu = 1: 1024 + B for every design here (none generates more than 1024); work per
    # step mu R + B. Budget: 2 x 40 x 512 = 40,960. Within it the fastest is on-policy B = 256 at 40 x 1280 = 51,200
    # in both replicates (B = 64's 400 x 128 = 51,200 work breaks it in replicate 0; in replicate 1 it takes
    # 100 x 1088 = 108,800); B = 1024 is faster (24 x 2048 = 49,152) but its work, the same 49,152, breaks it
    floor_rule = out["floor_rule_work2"]
    assert floor_rule["free_regret"] == pytest.approx(49152 / 51200) and floor_rule["over_budget"]
    assert floor_rule["free_ci"] == pytest.approx([49152 / 51200] * 2)
    # the printed B' = 1008, predicted within the budget, measured at 25 steps: time 25 x (1024 + 1008) = 50,800,
    # work 25 x 2016 = 50,400 > 40,960: it broke the budget in the measurement, and the row says so
    printed = out["printed_work2"]
    assert printed["free"] == "printed: on-policy B=1008" and printed["off_grid"]
    assert printed["free_regret"] == pytest.approx(50800 / 51200) and printed["over_budget"]
    # within the budget by measurement at 20 steps (40,320 work): the same scoring, no flag
    record["printed"][0]["steps"] = [20.0, 20.0]
    printed = tt.score_work_budget(record, 1.0, 1024, "on-policy B=1024")["printed_work2"]
    assert printed["free_regret"] == pytest.approx(20 * 2032 / 51200) and not printed["over_budget"]


def test_the_rescoring_is_reserved_in_the_pilots_budget_by_hand():
    # a sampled log's table (``rescored``): 5 ages > 0 x 64 x 1/3 = 106.67 reserved. One step at mu 0.5 (384) and 3
    # HVPs (384): 768, against 8% of 26 steps x 384 = 798.72: affordable alone, not with the 106.67
    sampled = {"b_simple": {"b_noise": 500.0}, "drift": {**LOG_DRIFT, "rescored": 320}}
    exact = {"b_simple": {"b_noise": 500.0}, "drift": LOG_DRIFT}  # a table read exactly (records before it)
    assert tt.pilot_affordable({**_pilot(steps=1, recipe_steps=26.0), "recipe_log": exact}, 0.5, 0)
    assert not tt.pilot_affordable({**_pilot(steps=1, recipe_steps=26.0), "recipe_log": sampled}, 0.5, 0)
    # 29 steps: 0.08 x 29 x 384 = 890.88 >= 874.67
    assert tt.pilot_affordable({**_pilot(steps=1, recipe_steps=29.0), "recipe_log": sampled}, 0.5, 0)
    query, notes = tt.pilot_query({**_pilot(steps=1, recipe_steps=26.0), "recipe_log": sampled}, "sgd", 0.5, 0)
    assert notes[0].startswith("no pilot: one of 1 step(s) costs more than 8% of the recipe's 26 steps at mu 0.5, "
                               "floor 0 with the logged run's re-scoring (107 sample-updates)")
    # the pilot's own sampled table is counted in its compute: 3 ages x 64 forward passes = 192 x 1/3 = 64
    own = {"staleness": [0, 1, 2, 3], "m2": [0.0, 0.1, 0.2, 0.3], "rescored": 192}
    assert tt.pilot_compute(_pilot(drift=own), 2.0, 64) == pytest.approx(2304 + 384 + 64)
    assert tt.rescore_compute(own) == pytest.approx(64.0) and tt.rescore_compute(None) == 0.0


def test_the_drift_is_the_users_64_sample_estimate_with_the_exact_beside(tmp_path):
    """measure_drift's m2: RESCORE_SAMPLES rollouts of pi_{T-s} re-scored at pi_T, against a naive loop over the
    same draws, and (pooled over 400 runs of the same two policies) against the exact M2 within 4 standard errors."""
    unit = _unit(tmp_path, "bandit-grpo", "sgd")
    env = unit.env
    rng = np.random.default_rng(5)
    d = env.param_dim
    path = np.cumsum(rng.normal(0, 0.15, size=(4, 1, d)), axis=0)  # (T + 1 = 4, runs = 1, d): a drifting policy
    record = tt.measure_drift(env, path, np.random.default_rng(11))
    assert record["staleness"] == [0, 1, 2, 3] and record["rescored"] == 3 * tt.RESCORE_SAMPLES
    # the naive loop: the same generator's draws in the same order, one sample at a time
    again = np.random.default_rng(11)
    log_new = env.log_policy(path[3])[0]  # (P, A)
    for k, s in enumerate(record["staleness"]):
        log_old = env.log_policy(path[3 - s])[0]
        prompts = np.repeat(again.integers(0, env.num_prompts, size=(1, tt.RESCORE_SAMPLES // tt.GROUP)), tt.GROUP,
                            axis=1)
        tokens, _, _ = env.sample(path[3 - s], prompts, again)
        squares = [(log_new[p, a] - log_old[p, a]) ** 2 for p, a in zip(prompts[0], tokens[0, :, 0])]
        assert record["m2"][k] == pytest.approx(sum(squares) / len(squares), rel=1e-9, abs=1e-15)
        assert record["m2_exact"][k] == pytest.approx(  # exact: uniform prompts, behaviour pi_{T-s}
            float(np.mean(np.sum(np.exp(log_old) * (log_new - log_old) ** 2, axis=-1))), rel=1e-9, abs=1e-15)
    # many runs of the same two policies: the pooled estimate within 4 se of the exact M2 at every age
    many = np.repeat(path, 400, axis=1)  # (4, 400, d)
    pooled = tt.measure_drift(env, many, np.random.default_rng(12))
    for k in range(1, 4):
        log_old = env.log_policy(path[3 - k])[0]
        x2 = (log_new - log_old) ** 2  # (P, A)
        m_p = np.sum(np.exp(log_old) * x2, axis=-1)  # (P,) E[x^2 | prompt]
        v_p = np.sum(np.exp(log_old) * x2**2, axis=-1) - m_p**2  # (P,) Var[x^2 | prompt]
        # a group of GROUP shares its prompt: the group mean is the independent unit
        se = math.sqrt((np.var(m_p) + np.mean(v_p) / tt.GROUP) / (400 * tt.RESCORE_SAMPLES // tt.GROUP))
        assert abs(pooled["m2"][k] - pooled["m2_exact"][k]) < 4 * se
    # a one-step run: no age > 0, nothing re-scored
    assert tt.measure_drift(env, path[:1], np.random.default_rng(0))["rescored"] == 0

"""theory-test: the benchmark's loop, measurements, scores and CLI, against hand-computed and exact values."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import numpy as np
import pytest

from replay_theory import __version__
from replay_theory.experiments import theory_bench as tt
from replay_theory.outputs import strict
from replay_theory.simulate import to_target
from replay_theory.simulate.envs import make_env
from replay_theory.simulate.envs.bandit import NoisyBanditConfig, NoisyRewardBandit
from replay_theory.simulate.envs.quadratic import QuadraticConfig, QuadraticEnv
from replay_theory.theory import forgetting as fg

# --------------------------------------------------------------------------- the environments


def test_the_registry_builds_every_environment_from_its_config():
    assert isinstance(make_env("quadratic", dim=4, condition=10.0), QuadraticEnv)
    noisy = make_env("noisy-bandit", num_prompts=4, reward_noise=0.5)
    assert isinstance(noisy, NoisyRewardBandit) and noisy.noise == 0.5
    with pytest.raises(ValueError, match="reward_noise must be a finite number >= 0, got -1"):
        NoisyBanditConfig(reward_noise=-1.0)


def test_the_bandit_exact_gradient_is_the_derivative_of_the_exact_reward():
    env = make_env("bandit", num_prompts=8, num_actions=5, feature_dim=4, num_well_formed=2)
    theta = np.random.default_rng(1).normal(size=(2, 4))
    h = 1e-6
    numeric = np.stack([(env.evaluate(theta + h * e)["reward"] - env.evaluate(theta - h * e)["reward"]) / (2 * h)
                        for e in np.eye(4)], axis=1)
    assert np.allclose(env.exact_grad(theta), numeric, atol=1e-8)
    hess = tt.exact_hessian(env, theta[:1])
    v = np.array([0.3, -0.1, 0.2, 0.5])
    assert np.allclose(tt.loss_hvp(env, theta[:1], v), hess @ v, rtol=1e-4, atol=1e-9)


def test_the_noisy_verifier_keeps_the_expected_reward():
    clean = make_env("bandit", num_prompts=4, num_actions=3, feature_dim=2, num_well_formed=1)
    noisy = NoisyRewardBandit(NoisyBanditConfig(num_prompts=4, num_actions=3, feature_dim=2, num_well_formed=1,
                                                reward_noise=2.0))
    theta = np.zeros((1, 2))
    assert noisy.evaluate(theta)["reward"] == pytest.approx(clean.evaluate(theta)["reward"])
    prompts = np.zeros((1, 20000), np.int64)
    tokens = np.zeros((1, 20000, 1), np.int64)
    draws = noisy.reward(prompts, tokens)
    assert draws.std() == pytest.approx(2.0, rel=0.03)
    assert draws.mean() == pytest.approx(clean.reward(prompts, tokens).mean(), abs=0.05)


# --------------------------------------------------------------------------- the crossing


def test_the_crossing_is_the_smoothed_seed_mean_reaching_the_target():
    tracker = to_target.CrossingTracker(1.0, lrs=2, seeds=2, boot_index=np.array([[0, 0], [1, 1]]), max_steps=200)
    for t in range(1, 120):
        up = min(t / 50.0, 1.5)  # a linear rise through 1.0 at t = 50
        hover = 0.85 + 0.2 * (t % 2)  # a plateau at 0.95 whose fluctuations reach 1.05
        tracker.update(t, np.array([up, up, hover, hover]))
    crossing, touch = tracker.result()
    assert crossing[0, 0] == 50  # a linear curve: the centred mean crosses where the curve does
    assert crossing[0, 1] == 0 and touch[1] == 1  # the raw mean touches at once; its average never reaches 1
    assert list(crossing[:, 0]) == [50, 50, 50]  # every resample of identical seeds crosses alike


def test_a_diverged_step_size_never_counts():
    tracker = to_target.CrossingTracker(0.0, 2, 1, None, 50)
    for t in range(1, 40):
        tracker.update(t, np.array([1.0 if t < 5 else np.nan, 1.0]))
    crossing, _ = tracker.result()
    assert crossing[0, 0] == 0 and crossing[0, 1] == 1


def test_monte_carlo_steps_agree_with_the_exact_expected_curve_on_the_quadratic():
    env = QuadraticEnv(QuadraticConfig(condition=100, noise_scale=10 * 256, instance_seed=3, target_fraction=0.9))
    lrs = np.array([0.5, 0.25])
    boot = np.random.default_rng(0).integers(0, 16, size=(100, 16))
    for design in (fg.Design.on_policy_at(256), fg.Design(256, 64, 256), fg.Design(256, 64, 1024)):
        exact = to_target.expected_to_target(env, design, lrs, 3000)
        mc = to_target.run_to_target(env, None, design, lrs, 16, "sgd", env.target, 3000, boot_index=boot)
        # the tuned steps (what the benchmark scores): the exact curve's against the seed resamples' spread
        tuned = tt.design_steps({"crossing": mc.crossing.tolist()})
        exact_tuned = np.where(exact.crossing > 0, exact.crossing, np.inf).min()
        lo, hi = np.quantile(tuned[1:], [0.01, 0.99])
        assert lo - 3 <= exact_tuned <= hi + 3, (design, exact_tuned, lo, hi)


def test_the_exact_stationary_loss_decides_which_step_sizes_count():
    env = QuadraticEnv(QuadraticConfig(condition=100, noise_scale=100 * 256, instance_seed=0, target_fraction=0.9))
    design = fg.Design(256, 64, 64)
    lrs = np.array([1.0, 0.01])
    stationary = to_target.stationary_loss(env, design, lrs)
    assert stationary[0] > -env.target > stationary[1]  # the large step's floor sits above the target
    trace = to_target.expected_to_target(env, design, lrs, 20000)
    assert trace.crossing[0] == 0 and trace.crossing[1] > 0
    assert math.isinf(to_target.stationary_loss(env, design, [2.5])[0])  # eta h > 2: diverges


# --------------------------------------------------------------------------- the measurements


def test_b_from_steps_is_exact_on_mccandlish_law_and_its_kind_is_said():
    batches = np.array([8.0, 16, 32, 64, 128, 256])
    steps = 40 * (1 + 300 / batches)
    s_min, b_noise = tt.fit_noise_scale(steps, batches)
    assert s_min == pytest.approx(40) and b_noise == pytest.approx(300)
    s_min, b_noise = tt.fit_noise_scale(5000 / batches - 1, batches)  # steps fall faster than 1/B: S_min < 0
    assert math.isinf(b_noise) and tt.b_noise_kind(b_noise).startswith("infinite")
    assert math.isnan(tt.fit_noise_scale(np.array([np.inf, np.inf, np.inf, 9, 8, 7.0]), batches)[1])
    assert tt.read_b_noise({"b_noise": None, "b_noise_kind": tt.b_noise_kind(math.inf)}) == math.inf
    assert math.isnan(tt.read_b_noise({"b_noise": None, "b_noise_kind": tt.b_noise_kind(math.nan)}))


def test_the_design_steps_are_the_tuned_crossing_per_replicate():
    record = {"crossing": [[30, 0, 25], [28, 40, 0], [0, 0, 0]]}
    assert list(tt.design_steps(record)) == [25.0, 28.0, math.inf]


def test_the_step_cap_lets_a_design_cost_up_to_cap_factor_times_on_policy_under_its_kindest_cost():
    options = tt.Options(mus=(1.0, 5.0), floors=(0,))
    design = fg.Design.on_policy_at(64)
    # at mu = 1 on-policy at 256 costs 512 a step, at 64 it costs 128: a ratio of 4 (the same at mu = 5)
    assert tt._step_cap(options, design, 100.0) == math.ceil(tt.CAP_FACTOR * 100 * 4)


# --------------------------------------------------------------------------- scoring


def _record(steps: dict[str, list[float]], b_noise: float = 100.0, kappa: float = 0.5) -> dict:
    designs = {"on-policy B=64": [64, 64, 64, True], "on-policy B=256": [256, 256, 256, True],
               "x=1 y=4": [256, 64, 64, False], "x=16 y=4": [256, 64, 1024, False]}
    return {"setting": "s", "optimizer": "sgd", "instance": 0, "exact": False, "target": -0.1, "j0": -1.0,
            "j_star": 0.0,
            "designs": [{"label": k, "design": v, "steps": steps[k], "reached": True, "at_edge": False,
                         "hovered": False} for k, v in designs.items()],
            "noise": {"b_noise": b_noise, "b_noise_kind": "finite", "b": b_noise / 256, "b_interval": [0, 1]},
            "pilot": {"kappa_pairs": {"kappa": kappa}, "kappa_lag": {"kappa": kappa}, "kappa_exact": kappa},
            "calibration": {"smoothness": 1.0, "f0": 1.0, "rho": 0.0, "staleness": [0, 1, 2], "sigma_sq": [1, 1, 1],
                            "bias": 0.0, "form": "exact (flat)"}}


def test_regret_by_hand_free_batch_and_pinned():
    record = _record({"on-policy B=64": [100.0, 110.0], "on-policy B=256": [40.0, 40.0], "x=1 y=4": [90.0, 80.0],
                      "x=16 y=4": [50.0, 55.0]})
    cell = tt.score_cell(record, mu=1.0, floor=0)
    # compute = steps x (mu max(R, floor) + B): 64 -> 128/step, 256 -> 512, y=4 -> 64 + 256 = 320
    compute = {"on-policy B=64": 12800, "on-policy B=256": 20480, "x=1 y=4": 28800, "x=16 y=4": 16000}
    assert cell["best_free"] == "on-policy B=64" and cell["best_pinned"] == "x=16 y=4"
    on = cell["by_objective"]["on_policy"]
    assert on["free"] == "on-policy B=256" and on["free_regret"] == pytest.approx(20480 / 12800)
    assert on["pinned_regret"] == pytest.approx(20480 / 16000)
    # the replicate: 64 -> 14080, 256 -> 20480, y=4 x=1 -> 25600, x=16 -> 17600: on-policy's regret 20480 / 14080
    assert on["free_ci"] == pytest.approx([20480 / 14080] * 2)
    f = cell["by_objective"]["forgetting"]
    values = tt.rule_values(tt._designs_of(record), 100.0, 0.5, "sgd", 1.0, 0, fg.NO_STALENESS)
    labels = [d["label"] for d in record["designs"]]
    assert f["free"] == labels[int(np.argmin(values))]
    assert f["free_regret"] == pytest.approx(compute[f["free"]] / 12800)


def test_the_floor_prices_a_small_batch_at_the_floor():
    record = _record({"on-policy B=64": [100.0], "on-policy B=256": [40.0], "x=1 y=4": [90.0], "x=16 y=4": [50.0]})
    compute = tt.measured_compute(record, mu=1.0, floor=128)[0]
    assert list(compute) == [100 * (128 + 64), 40 * (256 + 256), 90 * (128 + 256), 50 * (128 + 256)]


def test_the_trivial_floor_rule_and_the_on_policy_oracle_by_hand():
    record = _record({"on-policy B=64": [100.0, 110.0], "on-policy B=256": [40.0, 40.0], "x=1 y=4": [90.0, 80.0],
                      "x=16 y=4": [50.0, 55.0]})
    # floor 0: the smallest batch (64); floor 100: the smallest batch at or above it (256); floor 300: none, so 256
    for floor, pick in ((0, "on-policy B=64"), (100, "on-policy B=256"), (300, "on-policy B=256")):
        assert tt.score_cell(record, mu=1.0, floor=floor)["by_objective"]["on_policy_floor"]["free"] == pick
    # the oracle picks the measured cheapest on-policy batch: at mu = 1, floor 0, B = 64 (12800 < 20480)
    cell = tt.score_cell(record, mu=1.0, floor=0)
    oracle = cell["by_objective"]["on_policy_oracle"]
    assert oracle["free"] == "on-policy B=64" and oracle["free_regret"] == 1.0
    assert oracle["pinned"] == "on-policy B=256"  # its only design at B = 256


def test_the_replay_branch_counts_hits_and_false_alarms():
    # mu = 1, floor 0: on-policy 64 -> 12800, 256 -> 20480; x=16 y=4 -> 50 x 320 = 16000 (on-policy cheapest)
    on_best = _record({"on-policy B=64": [100.0], "on-policy B=256": [40.0], "x=1 y=4": [90.0],
                       "x=16 y=4": [50.0]})
    # x=16 y=4 at 20 steps -> 6400: replay cheapest by 12800 / 6400 = 2x
    replay_best = _record({"on-policy B=64": [100.0], "on-policy B=256": [40.0], "x=1 y=4": [90.0],
                           "x=16 y=4": [20.0]})
    cells = [tt.score_cell(r, mu=1.0, floor=0) for r in (on_best, replay_best)]
    assert cells[0]["replay_gain"] == pytest.approx(12800 / 16000) and cells[1]["replay_gain"] == pytest.approx(2.0)
    for c in cells:  # a rule that always picks the long buffer
        c["by_objective"]["always_replay"] = {**c["by_objective"]["on_policy"], "free_is_replay": True,
                                              "free_regret": 16000 / 12800 if c is cells[0] else 1.0}
    branch = tt._replay_branch(cells, "always_replay")
    assert branch == {"replay_cheapest_by_20%": 1, "hits": 1, "false_alarms": 1, "false_alarm_share": 0.5,
                      "false_alarm_worst": pytest.approx(1.25)}
    never = tt._replay_branch(cells, "on_policy")  # never picks replay: misses the replay cell, no false alarm
    assert never["hits"] == 0 and never["false_alarms"] == 0 and never["false_alarm_worst"] is None


def test_the_rule_values_are_forgetting_predictions():
    record = _record({k: [1.0] for k in ("on-policy B=64", "on-policy B=256", "x=1 y=4", "x=16 y=4")})
    designs = tt._designs_of(record)
    values = tt.rule_values(designs, 300.0, 0.4, "adam", 5.28, 64, fg.NO_STALENESS)
    expected = fg.predict_many(designs, 300.0, 5.28, fg.Memory(0.4, "adam", tt.BETA1, 256.0), fg.NO_STALENESS, 64)
    assert list(values) == [p.compute for p in expected]
    # kappa <= 0 (a loss concave along the noise): the optimizer never forgets, psi = 1
    flat = tt.rule_values(designs, 300.0, -0.1, "adam", 5.28, 64, fg.NO_STALENESS)
    assert list(flat) == [p.compute for p in fg.predict_many(designs, 300.0, 5.28, None, fg.NO_STALENESS, 64)]
    assert tt.rule_values(designs, math.nan, 0.4, "adam", 5.28, 64, fg.NO_STALENESS) == tt.NoPick(
        "B_noise not measured", "not measurable: fewer than 4 on-policy batches reached the target")


def test_spearman_by_hand():
    assert tt.spearman(np.array([1.0, 2, 3, 4]), np.array([10.0, 20, 30, 40])) == pytest.approx(1.0)
    assert tt.spearman(np.array([1.0, 2, 3, np.inf]), np.array([3.0, 2, 1, 0])) == pytest.approx(-1.0)
    assert tt.spearman(np.array([1.0, 1, 1]), np.array([1.0, 2, 3])) is None


# --------------------------------------------------------------------------- the benchmark end to end


@pytest.fixture
def tiny():
    return tt.Options(instances=(0,), settings=("quadratic-noise10",), optimizers=("sgd",), mus=(1.0, 5.28),
                      floors=(64, 0), seeds=4, quick=True)


def test_a_quadratic_unit_measures_b_and_kappa_near_their_exact_values_and_resumes(tmp_path, tiny, monkeypatch):
    out = tmp_path / "bench"
    summary = tt.run_theory_test(out, tiny, progress=False)
    unit = summary["units"][0]
    assert unit["exact"] and {c["mu"] for c in summary["cells"]} == {1.0, 5.28}
    checks = unit["checks"]
    assert 1 / 1.5 <= checks["b_ratio"] <= 1.5
    # the pilot's two curvature pairs (one step's batch in quarters: what a one-run, 10% pilot buys) scatter around
    # the exact kappa by the ratio xi^T H xi / |xi|^2 of two 16-dim Gaussian draws: 1.29x here, within 2x
    assert 0.5 <= checks["kappa_pairs_ratio"] <= 2.0
    assert unit["pilot"]["kappa_pairs"]["units"] == 2 and unit["pilot"]["runs"] == 1
    assert checks["stationary_at_or_above_target"] == 0
    # the exact kappa of SGD on the quadratic: lr tr(H Sigma) / tr Sigma with Sigma = s^2 H
    env = QuadraticEnv(QuadraticConfig(condition=100.0, noise_scale=10 * 256, instance_seed=0, target_fraction=0.9))
    lam = np.sum(env.curvature**2) / np.sum(env.curvature)
    assert unit["pilot"]["kappa_exact"] == pytest.approx(unit["pilot"]["lr"] * lam)
    text = (out / "summary.json").read_text()

    def no_training(*args, **kwargs):
        raise AssertionError("a finished unit was trained again")

    monkeypatch.setattr(tt.score, "run_unit", no_training)
    again = tt.run_theory_test(out, tiny, progress=False)
    assert json.dumps(again["cells"]) == json.dumps(json.loads(text)["cells"])


def test_a_resume_scores_its_saved_units_on_two_workers_to_the_same_cells_with_a_progress_line(
        tmp_path, tiny, monkeypatch, capsys):
    options = tt.Options(**{**asdict(tiny), "optimizers": ("sgd", "adam")})
    out = tmp_path / "bench"
    first = tt.run_theory_test(out, options, progress=False)
    (out / "summary.json").unlink()  # as a run stopped after its last unit was saved, before its summary

    def no_training(*args, **kwargs):
        raise AssertionError("a finished unit was trained again")

    monkeypatch.setattr(tt.score, "run_unit", no_training)
    capsys.readouterr()
    again = tt.run_theory_test(out, options, progress=True, jobs=2)  # both saved units scored, one per worker
    assert json.dumps(again["cells"]) == json.dumps(first["cells"]) and len(again["cells"]) == 2 * 2 * 2
    assert again["targets"] == first["targets"]
    lines = capsys.readouterr().err.splitlines()  # stderr is no terminal here: plain lines, the last at the end
    assert lines[-1].startswith("theory-test scoring (2 units): 2/2 (100%), elapsed ")


def test_out_directory_is_checked_before_work(tmp_path, tiny):
    unrelated = tmp_path / "unrelated"
    unrelated.mkdir()
    (unrelated / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is a non-empty directory that holds no theory-test results"):
        tt.run_theory_test(unrelated, tiny, progress=False)
    assert sorted(p.name for p in unrelated.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("args, message", [
    (["--setting", "foo"], "--setting must be a comma-separated list of quadratic-noise1, quadratic-noise3, "
                           "quadratic-noise10, quadratic-noise30, quadratic-noise100, two-prompts, bandit-grpo, "
                           "noisy-reward, got foo"),
    (["--optimizer", "lion"], "--optimizer must be a comma-separated list of sgd, adam, got lion"),
    (["--mu", "0,1.5"], "--mu must be a comma-separated list of distinct finite numbers > 0, got 0,1.5"),
    (["--floor", "-1"], "--floor must be a comma-separated list of distinct integers >= 0 (rollouts), got -1"),
    (["--seeds", "1"], "--seeds must be an integer >= 2 (the bootstrap resamples seeds), got 1"),
    (["--instance", "0,0"], "--instance must be a comma-separated list of distinct integers >= 0, got 0,0"),
])
def test_bad_options_are_one_line_before_any_work(error_line, tmp_path, args, message):
    out = tmp_path / "new"
    assert error_line("experiment", "theory-test", "--out", str(out), *args) == message
    assert not out.exists()


def test_theory_test_options_are_refused_for_other_experiments(error_line, tmp_path):
    line = error_line("experiment", "sanity", "--out", str(tmp_path / "s"), "--seeds", "4", "--quick")
    assert line == "--seeds, --quick only apply to the theory-test experiment, not sanity"
    assert not (tmp_path / "s").exists()


def test_a_rollout_environment_trains_through_the_shared_pipeline_to_its_target():
    env = make_env("bandit", num_prompts=8, num_actions=5, feature_dim=4, num_well_formed=2)
    j0 = float(env.evaluate(env.init_params(1))["reward"][0])
    target = j0 + 0.2
    boot = np.random.default_rng(0).integers(0, 4, size=(20, 4))
    trace = to_target.run_to_target(env, ("no-trust-region", "leave-one-out"), fg.Design(64, 16, 64), [2.0, 0.5], 4,
                                    "sgd", target, 400, boot_index=boot)
    assert trace.crossing.shape == (21, 2) and trace.crossing[0, 0] > 0
    # the larger step gets there first; the run stops at 1.3x its crossing, before the smaller one may arrive
    assert trace.crossing[0, 1] == 0 or trace.crossing[0, 1] > trace.crossing[0, 0]
    assert trace.steps <= int(1.3 * trace.crossing[0, 0]) + 1 + to_target._window(int(1.3 * trace.crossing[0, 0]) + 1)
    assert trace.mean_reward[0, -1] >= target > j0  # the seed mean of the best step size did rise to the target
    assert trace.mean_reward[1, -1] > j0 + 0.05  # the smaller one rose too, more slowly
    again = to_target.run_to_target(env, ("no-trust-region", "leave-one-out"), fg.Design(64, 16, 64), [2.0, 0.5], 4,
                                    "sgd", target, 400, boot_index=boot)
    assert np.array_equal(again.crossing, trace.crossing)  # same seed, same numbers


def test_a_noisy_verifier_run_does_not_depend_on_what_ran_before_it():
    env = NoisyRewardBandit(NoisyBanditConfig(num_prompts=8, num_actions=5, feature_dim=4, num_well_formed=2))
    target = float(env.evaluate(env.init_params(1))["reward"][0]) + 0.2
    loss = ("no-trust-region", "leave-one-out")

    def run():
        return to_target.run_to_target(env, loss, fg.Design(64, 16, 64), [2.0], 4, "sgd", target, 60).mean_reward

    first = run()
    env.reward(np.zeros((1, 1000), np.int64), np.zeros((1, 1000, 1), np.int64))  # another run's draws in between
    assert np.array_equal(run(), first)  # the same run, the same numbers (resume trains some runs and not others)


# --------------------------------------------------------------------------- robustness on any instance (issue 38)


def _put_many(out: str, barrier, keys: int, results=None) -> list[str]:
    """One worker's puts of ``keys`` runs into ``out``'s store, started together with the other worker's (its keys
    also onto the ``results`` queue of a process)."""
    store = tt.Store(out)
    barrier.wait()
    stored = [store.put({"kind": "run", "i": i}, {"steps": [i, 2 * i], "value": i / 3})["key"] for i in range(keys)]
    if results is not None:
        results.put(stored)
    return stored


def _stored(out) -> dict[str, str]:
    runs = tt.Store(out).runs
    return {p.name: p.read_text() for p in sorted(runs.iterdir())}


def test_two_processes_storing_the_same_runs_leave_one_whole_file_each_and_no_error(tmp_path):
    import multiprocessing

    keys = 40
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_put_many, args=(str(tmp_path), barrier, keys, results)) for _ in range(2)]
    for w in workers:
        w.start()
    first, second = results.get(timeout=60), results.get(timeout=60)
    for w in workers:
        w.join(timeout=60)
    assert [w.exitcode for w in workers] == [0, 0]  # neither raised
    assert first == second and len(set(first)) == keys
    stored = _stored(tmp_path)
    assert sorted(stored) == sorted(f"{k}.json" for k in first)  # no temporary file left behind
    for i, key in enumerate(first):  # the same record as one worker alone writes
        record = json.loads(stored[f"{key}.json"])
        assert record["config"] == {"kind": "run", "i": i}
        assert record["steps"] == [i, 2 * i] and record["value"] == i / 3


def test_two_threads_storing_the_same_run_get_the_same_record(tmp_path):
    import threading
    from concurrent.futures import ThreadPoolExecutor

    barrier = threading.Barrier(2)
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda _: _put_many(str(tmp_path), barrier, 20), range(2))
    assert first == second and len(_stored(tmp_path)) == 20


def test_a_run_that_appears_while_it_is_written_is_accepted_when_equal_and_refused_when_not(tmp_path, monkeypatch):
    from replay_theory import outputs

    store = tt.Store(tmp_path)
    payload, result = {"kind": "run", "i": 1}, {"steps": [5]}
    text = json.dumps({"key": tt._key(payload), "replay_theory_version": __version__, "config": payload, **result})
    real_link = outputs.os.link

    def another_worker_first(other: str):
        def link(src, dst):  # the other worker's whole file lands between this one's write and its link
            (store.runs / f"{tt._key(payload)}.json").write_text(other)
            return real_link(src, dst)
        return link

    monkeypatch.setattr(outputs.os, "link", another_worker_first(text))
    assert store.put(payload, result) == json.loads(text)
    path = store.runs / f"{tt._key(payload)}.json"
    assert path.read_text() == text and sorted(p.name for p in store.runs.iterdir()) == [path.name]
    path.unlink()
    other = text.replace("[5]", "[6]")  # the same config, other results: never written over, one line
    monkeypatch.setattr(outputs.os, "link", another_worker_first(other))
    with pytest.raises(ValueError, match=r"holds the same config with other results than this run computed; results "
                                         r"are never overwritten: choose a new --out$"):
        store.put(payload, result)
    assert path.read_text() == other and sorted(p.name for p in store.runs.iterdir()) == [path.name]


def test_the_run_units_share_is_stored_once_before_any_unit_runs(tmp_path, monkeypatch):
    options = tt.Options(instances=(5, 6), settings=("two-prompts",), optimizers=("sgd", "adam"), mus=(1.0,),
                         floors=(0,), seeds=2, quick=True)
    seen = []

    class Stop(Exception):
        pass

    def first_unit(out, setting, optimizer, instance, options, **kwargs):
        store = tt.Store(out)  # every (setting, instance) record is there already: no worker computes one
        for i in (5, 6):
            payload = {"kind": "instance", "setting": asdict(tt.SETTINGS[setting]), "instance": i,
                       "target_fraction": tt.TARGET_FRACTION}
            seen.append(store.get(payload))
        raise Stop

    monkeypatch.setattr(tt.score, "run_unit", first_unit)
    with pytest.raises(Stop):
        tt.run_theory_test(tmp_path / "tt", options, progress=False, jobs=1)
    assert len(seen) == 2 and all(r is not None and r["j_star"] > r["target"] > r["j0"] for r in seen)
    assert len(list((tmp_path / "tt" / "runs").iterdir())) == 2  # one per instance, not one per optimizer's unit


def test_a_curvature_pair_without_noise_is_left_out_and_counted():
    # pairs (num, den): (2, 1), (0, 0) (xi = 0: equal minibatch gradients), (4, 3): kappa = 0.5 (2 + 4) / (1 + 3)
    pairs = tt.curvature_pairs_kappa([2.0, 0.0, 4.0], [1.0, 0.0, 3.0], 0.5, np.random.default_rng(0), "sgd")
    assert pairs["kappa"] == pytest.approx(0.75) and pairs["pairs_without_noise"] == 1 and pairs["units"] == 2
    assert pairs["lambda_eff"] == pytest.approx(1.5)
    # every bootstrap replicate lies between the two noisy pairs' own ratios, 0.5 x 4/3 and 0.5 x 2/1
    assert 0.5 * 4 / 3 - 1e-12 <= pairs["kappa_interval"][0] <= pairs["kappa_interval"][1] <= 0.5 * 2 / 1 + 1e-12
    same = tt.curvature_pairs_kappa([2.0, 4.0], [1.0, 3.0], 0.5, np.random.default_rng(0), "sgd")
    assert {**same, "pairs_without_noise": 1} == pairs  # the pair without noise changes nothing else
    none = tt.curvature_pairs_kappa([0.0, 0.0, 5.0], [0.0, 0.0, 2.0], 0.5, np.random.default_rng(0), "adam")
    assert none["kappa"] is None and none["pairs_without_noise"] == 2 and none["units"] == 1
    assert none["reason"].startswith("1 of 3 curvature pairs have a gradient difference xi != 0")
    # the rule then has no pick in the unit's cells, and says why
    record = _record({k: [1.0] for k in ("on-policy B=64", "on-policy B=256", "x=1 y=4", "x=16 y=4")})
    record["pilot"]["kappa_pairs"] = none
    cell = tt.score_cell(record, mu=1.0, floor=0)
    assert cell["by_objective"]["forgetting"] == {"no_pick": "kappa not measured", "detail": none["reason"]}
    assert "free" in cell["by_objective"]["noise_scale"]  # a rule that does not read kappa still picks


def test_a_b_noise_fitted_at_or_below_zero_gives_no_pick_and_says_so():
    batches = np.array([32.0, 64, 128, 256])
    s_min, b_noise = tt.fit_noise_scale(40 * (1 - 8 / batches), batches)  # steps RISE with B: B_noise = -8
    assert s_min == pytest.approx(40) and b_noise == pytest.approx(-8)
    assert tt.b_noise_kind(b_noise).startswith("not positive") and tt.b_noise_kind(0.0).startswith("not positive")
    _, flat = tt.fit_noise_scale(np.full(4, 100.0), batches)  # equal steps at every batch: B_noise 0 up to rounding
    assert abs(flat) < 1e-9
    designs = tt._designs_of(_record({k: [1.0] for k in ("on-policy B=64", "on-policy B=256", "x=1 y=4",
                                                           "x=16 y=4")}))
    for value in (-2.16e-14, 0.0, -8.0):  # -2.16e-14: the fit that once stopped a run
        assert tt.rule_values(designs, value, 0.4, "adam", 5.28, 64, fg.NO_STALENESS).reason == \
            "B_noise fitted at <= 0"
    record = _record({"on-policy B=64": [100.0], "on-policy B=256": [40.0], "x=1 y=4": [90.0], "x=16 y=4": [50.0]},
                     b_noise=-2.16e-14)
    cell = tt.score_cell(record, mu=1.0, floor=0)
    for name in ("forgetting", "noise_scale", "on_policy_small"):  # every objective that reads B_noise
        assert cell["by_objective"][name] == {"no_pick": "B_noise fitted at <= 0", "detail": (
            "B_noise = -2.16e-14: the on-policy steps do not fall with the batch, outside the rule's B_noise > 0")}
    for name in ("paper_J", "null", "on_policy"):
        assert "free" in cell["by_objective"][name]


def test_a_cell_without_a_pick_is_counted_as_a_miss_in_the_targets_and_said_in_the_tables():
    steps = {"on-policy B=64": [100.0], "on-policy B=256": [40.0], "x=1 y=4": [90.0], "x=16 y=4": [50.0]}
    good, zero = _record(steps), _record(steps, b_noise=-2.16e-14)
    zero["instance"] = 1
    cells = [tt.score_cell(r, 1.0, 64) for r in (good, zero)]
    units = [{**r, "checks": tt.unit_checks(r)} for r in (good, zero)]
    t = tt.targets(cells, units, 64)
    f = t["objectives"]["forgetting"]
    # 2 cells: the answered one's regret (hand: compute 64 -> 100 x 128, the best; the pick's)
    regret = cells[0]["by_objective"]["forgetting"]["free_regret"]
    assert t["cells"] == 2 and f["cells"] == 2
    assert f["free"]["no_pick"] == 1 and f["free"]["no_pick_reasons"] == {"B_noise fitted at <= 0": 1}
    assert f["free"]["within_1.5"] == int(regret <= 1.5) and f["free"]["share_within_1.2"] == int(regret <= 1.2) / 2
    assert f["free"]["worst"] == regret and f["pinned"]["no_pick"] == 1
    assert t["objectives"]["paper_J"]["free"]["no_pick"] == 0  # it read no B_noise: a pick in both
    summary = json.loads(json.dumps(strict({"cells": cells, "targets": {"64": t}})))
    text = tt.targets_text(summary["targets"]["64"])
    line = next(x for x in text.splitlines() if x.startswith("- reference: forgetting-aware, b fitted"))
    assert line.endswith("; no pick (counted as a miss): free batch in 1 of 2 (B_noise fitted at <= 0: 1), "
                         "at B = 256 in 1 of 2 (B_noise fitted at <= 0: 1)")
    assert line.startswith("- reference: forgetting-aware, b fitted to the grid's on-policy steps (reads scored "
                           "runs): free batch ")
    from replay_theory.advise import evidence

    assert not evidence.passes(f)  # "<= 1.5 in all": a cell without a pick fails it


def test_a_pick_that_never_reached_the_target_is_an_inf_regret_in_the_text():
    steps = {"on-policy B=64": [100.0], "on-policy B=256": [40.0], "x=1 y=4": [math.inf], "x=16 y=4": [50.0]}
    cell = tt.score_cell(_record(steps), 1.0, 64)
    cell["by_objective"]["paper_J"].update(free="x=1 y=4", free_regret=math.inf)  # as if J had picked the censored
    rec = tt._objective_target(json.loads(json.dumps(strict([cell]))), "paper_J")  # inf stored as null
    assert rec["free"]["worst"] == math.inf and rec["free"]["not_reached"] == 1 and rec["free"]["no_pick"] == 0
    assert tt._worst_text(strict(rec["free"])) == "inf (1 pick never reached the target)"


def test_a_baseline_with_nothing_at_the_pinned_batch_has_no_pinned_pick_not_the_first_design():
    steps = {"on-policy B=64": [100.0], "on-policy B=256": [40.0], "x=1 y=4": [90.0], "x=16 y=4": [50.0]}
    cell = tt.score_cell(_record(steps, b_noise=100.0), 1.0, 0)
    small = cell["by_objective"]["on_policy_small"]
    # b = 100: 1 + 100/64 = 2.56 <= 2 (1 + 100/256) = 2.78, so B = 64 is its pick; nothing of its at B = 256
    assert small["free"] == "on-policy B=64" and small["free_regret"] == 1.0
    assert small["pinned"] is None and small["pinned_regret"] is None
    assert small["pinned_no_pick"] == "nothing at B = 256 in its menu"
    t = tt._objective_target([cell], "on_policy_small")
    assert t["pinned"]["no_pick"] == 1 and t["pinned"]["share_within_1.2"] == 0.0 and t["free"]["no_pick"] == 0
    on = cell["by_objective"]["on_policy"]  # a baseline at B = 256 keeps its pinned pick
    assert on["pinned"] == "on-policy B=256" and on["pinned_regret"] == pytest.approx(40 * 512 / (50 * 320))


def test_a_unit_without_a_pilot_is_not_scored_and_its_cells_are_counted_and_said(tmp_path, tiny, monkeypatch):
    real = tt.train_unit

    def no_pilot_under_adam(unit):
        if unit.optimizer == "adam":
            raise tt.UnitNotScored("no step size of 1, 2 reached the target with on-policy B = 256 in 6000 steps")
        return real(unit)

    monkeypatch.setattr(tt.measure, "train_unit", no_pilot_under_adam)
    options = tt.Options(**{**asdict(tiny), "optimizers": ("sgd", "adam")})
    summary = tt.run_theory_test(tmp_path / "tt", options, progress=False)
    mus, floors = len(options.mus), len(options.floors)
    assert len(summary["cells"]) == 2 * mus * floors  # both units' cells, the one not scored included
    adam = [c for c in summary["cells"] if c["optimizer"] == "adam"]
    assert len(adam) == mus * floors and all(c["by_objective"] == {} and c["not_scored"].startswith(
        "no step size of 1, 2 reached the target") for c in adam)
    for floor in map(str, options.floors):
        t = summary["targets"][floor]
        assert t["cells"] == 2 * mus and t["cells_not_scored"] == mus
        assert t["units_not_scored"] == ["quadratic-noise10/adam/i0"]
        assert t["objectives"]["forgetting"]["cells"] == mus  # the scored unit's cells only: no rule missed there
    table = tt.summary_table(summary)
    assert "| quadratic-noise10 | adam | 0 |" + " n/a |" * 11 + " not scored: no step size of 1, 2" in table
    assert f"- cells not scored, in no objective's count (their unit's pilot reached the target at no step size; " \
           f"the units table says why): {mus} of {2 * mus}, units quadratic-noise10/adam/i0" in table
    assert (tmp_path / "tt" / "units" / "quadratic-noise10-adam-0.json").exists()  # kept: a resume reads it


def test_the_printed_answer_and_the_floor_rule_split_by_the_users_route_by_hand():
    def cell(printed, trivial, piloted):
        return {"by_objective": {"printed": {"free_regret": printed, "piloted": piloted},
                                 "on_policy_floor": {"free_regret": trivial}}}

    cells = [cell(1.0, 1.3, True), cell(1.6, 1.6, True), cell(None, 1.0, True),  # None: never reached (inf)
             cell(2.5, 2.5, False)]
    routes = tt._route_shares(cells, "printed")
    assert routes["piloted"]["cells"] == 3 and routes["piloted"]["within_1.2"] == 1
    assert routes["piloted"]["share_within_1.2"] == pytest.approx(1 / 3) and routes["piloted"]["worst"] == math.inf
    assert routes["no_pilot"] == {**routes["no_pilot"], "cells": 1, "within_1.2": 0, "worst": 2.5}
    floor_rule = tt._route_shares(cells, "on_policy_floor")  # the same cells, the route read off the printed answer
    assert floor_rule["piloted"]["within_1.2"] == 1 and floor_rule["piloted"]["worst"] == 1.6
    assert tt._route_shares([cell(1.0, 1.0, True)], "printed").keys() == {"piloted"}  # an empty route is left out
    from replay_theory.advise.evidence import _routes_text

    text = _routes_text({"routes": json.loads(json.dumps(strict(routes)))}, {"routes": floor_rule})
    assert text == ("; with the pilot 33% (worst never reached; the trivial rule 33%, worst 1.60) in 3 cases, without "
                    "one (a run too short for it: the floor rule's batch) 0% (worst 2.50) in 1")
    assert _routes_text({}, None) == ""  # a record from before the routes were kept


def test_the_printed_rules_ranking_is_the_geometric_mean_over_the_guards_b_range_by_a_loop():
    from replay_theory.experiments.theory_bench.objectives import b_range_values
    from replay_theory.theory.guarded import B_FACTORS

    record = _record({"on-policy B=64": [100.0], "on-policy B=256": [40.0], "x=1 y=4": [90.0], "x=16 y=4": [50.0]})
    record["pilot"]["b_simple"] = {"b_noise": 30.0}
    designs = tt._designs_of(record)
    ranked = b_range_values(record, 2.0, 64)
    for i, d in enumerate(designs):  # one design and one factor at a time, the log mean by hand
        logs = [math.log(tt.rule_values([d], 30.0 * f, 0.5, "sgd", 2.0, 64, fg.NO_STALENESS)[0]) for f in B_FACTORS]
        assert ranked[i] == pytest.approx(math.exp(sum(logs) / len(logs)), rel=1e-12)
    record["pilot"]["b_simple"] = {"b_noise": None}  # not resolved: no ranking, as the measured-b row
    assert isinstance(b_range_values(record, 2.0, 64), tt.NoPick)

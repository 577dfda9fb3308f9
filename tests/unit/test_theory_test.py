"""theory-test: the benchmark's measurements, scores and CLI, against hand-computed values."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from replay_theory.experiments import theory_test as tt
from replay_theory.figures import results as fig
from replay_theory.figures.style import print_problems
from replay_theory.simulate.envs.bandit import BanditConfig, BanditEnv
from replay_theory.theory.profiles import PowerLawProfile, TabulatedProfile

pytestmark = pytest.mark.usefixtures("close_figures")  # conftest: plt.close("all") after each test


def small_env(noise: float = 0.0) -> tt.NoisyRewardBandit:
    return tt.NoisyRewardBandit(BanditConfig(num_prompts=8, num_actions=5, feature_dim=4, num_well_formed=2),
                                noise, seed=0)


# --------------------------------------------------------------------------- exact quantities


def test_exact_gradient_is_the_derivative_of_the_exact_reward():
    env = small_env()
    theta = np.random.default_rng(1).normal(size=(2, 4))
    grad = tt.exact_grad(env, theta)
    h = 1e-6
    for k in range(4):
        step = np.zeros(4)
        step[k] = h
        numeric = (tt.exact_reward(env, theta + step) - tt.exact_reward(env, theta - step)) / (2 * h)
        np.testing.assert_allclose(grad[:, k], numeric, rtol=1e-6, atol=1e-9)


def test_hessian_norm_is_the_largest_curvature_of_the_reward():
    env = small_env()
    theta = np.random.default_rng(2).normal(size=(1, 4))
    h = 1e-4
    hess = np.zeros((4, 4))  # second differences of the reward itself, independent of exact_grad
    for i in range(4):
        for j in range(4):
            ei, ej = np.eye(4)[i] * h, np.eye(4)[j] * h
            f = [tt.exact_reward(env, theta + a + b)[0] for a, b in ((ei, ej), (ei, -ej), (-ei, ej), (-ei, -ej))]
            hess[i, j] = (f[0] - f[1] - f[2] + f[3]) / (4 * h * h)
    assert tt.hessian_norm(env, theta) == pytest.approx(np.max(np.abs(np.linalg.eigvalsh(hess))), rel=1e-3)


def test_noisy_reward_keeps_the_expected_reward():
    clean = BanditEnv(BanditConfig(num_prompts=8, num_actions=5, feature_dim=4, num_well_formed=2))
    prompts = np.zeros((1, 20000), np.int64)
    tokens = np.full((1, 20000, 1), clean.answer[0])
    np.testing.assert_array_equal(small_env(0.0).reward(prompts, tokens), clean.reward(prompts, tokens))
    noisy = small_env(2.0).reward(prompts, tokens)
    assert noisy.mean() == pytest.approx(1.0, abs=0.05) and noisy.std() == pytest.approx(2.0, rel=0.03)


def test_the_unbiased_loss_has_no_staleness_bias_and_its_noise_grows_with_staleness():
    # is = importance-weighted REINFORCE with a leave-one-out baseline: E G_s = grad J exactly, any s
    env = small_env()
    rng = np.random.default_rng(3)
    theta = np.array([[0.8, -0.5, 0.3, 0.1]])
    stale = np.zeros((1, 4))
    exact = tt.exact_grad(env, theta)[0]

    def within_noise(grads):  # responses of a group are correlated (shared baseline): groups are the units
        groups = grads.reshape(-1, tt.GROUP, grads.shape[1]).mean(axis=1)
        return np.all(np.abs(groups.mean(axis=0) - exact) < 4 * groups.std(axis=0) / math.sqrt(groups.shape[0]))

    grads = tt.per_sample_grads(env, "is", theta, stale, 20000, rng)  # 160000 responses
    fresh = tt.per_sample_grads(env, "is", theta, theta, 20000, rng)
    assert within_noise(grads) and within_noise(fresh)
    assert ((grads - exact) ** 2).sum(axis=1).mean() > ((fresh - exact) ** 2).sum(axis=1).mean()


# --------------------------------------------------------------------------- objectives and scores


def test_null_model_is_compute_per_update():
    assert tt.gamma(4, 1, 5.28) == pytest.approx(1.0)  # on-policy
    assert tt.gamma(4, 2, 1.0) == pytest.approx((0.5 + 1) / 2)  # (mu R + B) / ((mu + 1) B) with R = B/2


def test_paper_j_by_hand():
    flat = TabulatedProfile((0.0, 100.0), (3.0, 3.0))
    # rollout-cost mu = 2: J = sigma^2 (mu + y) (1/y + 1/x + rho) = 3 (2 + 2) (1/2 + 1/4) = 9 (cost per update
    # in units of R times the variance term in units of 1/R; only the ranking at one mu matters here)
    assert tt.paper_j(4, 2, mu=2.0, profile=flat, rho=0.0) == pytest.approx(9.0)


def test_finite_budget_is_the_thm34_minimum_over_eta():
    profile = PowerLawProfile(alpha=0.0, scale=2.0)  # sigmabar^2 = 2
    N, R, B, mu, L, f0, budget = 512.0, 64.0, 256.0, 5.28, 0.5, 0.3, 1e6
    steps = budget / (mu * R + B)
    a, b = 12 * f0 / steps, 8 * L * 2.0 * (1 / B + 1 / N)  # a / eta + b eta, kappa = 0
    eta = math.sqrt(a / b)
    assert eta < 1 / (2 * L)  # interior optimum: the bound is 2 sqrt(a b)
    value = tt.finite_budget(N, R, B, budget=budget, mu=mu, profile=profile, rho=0.0, smoothness=L, bias=0.0,
                               f0=f0)
    assert value == pytest.approx(2 * math.sqrt(a * b), rel=1e-3)
    cost = mu * R + B  # one update
    tiny = tt.finite_budget(N, R, B, budget=2 * cost, mu=mu, profile=profile, rho=0.0, smoothness=L, bias=0.0,
                            f0=f0)
    eta_max = 1 / (2 * L)  # two updates: the step-size limit binds
    assert tiny == pytest.approx(12 * f0 / (eta_max * 2) + b * eta_max, rel=1e-9)
    # a budget that cannot pay for one update has no bound
    assert tt.finite_budget(N, R, B, budget=0.5 * cost, mu=mu, profile=profile, rho=0.0, smoothness=L, bias=0.0,
                            f0=f0) == math.inf


def test_regret_tunes_the_step_size_and_its_interval_shrinks_to_a_point_without_seed_noise():
    # 2 designs x 2 step sizes x 4 seeds of first-passage steps
    passage = np.array([[[10, 10, 10, 10], [8, 8, 8, 8]],
                        [[5, 5, 5, 5], [20, 20, 20, 20]]], dtype=float)
    np.testing.assert_array_equal(tt.design_steps(passage), [8.0, 5.0])
    cost = np.array([1.0, 2.0])  # compute 8 and 10
    regret, ci = tt.regret_and_ci(passage, cost, predicted=1, rng=np.random.default_rng(0))
    assert regret == pytest.approx(10 / 8) and ci == pytest.approx([10 / 8, 10 / 8])


def test_regret_interval_covers_the_seed_spread():
    passage = np.array([[[10, 12, 8, 10]], [[9, 14, 7, 10]]], dtype=float)  # design 1 worse on average
    regret, (low, high) = tt.regret_and_ci(passage, np.ones(2), predicted=1, rng=np.random.default_rng(0))
    assert regret == pytest.approx(10 / 10) and low == pytest.approx(1.0) and 1.0 < high <= 14 / 12


def test_spearman_and_precondition_slope():
    assert tt.spearman(np.array([1.0, 2, 3]), np.array([10.0, 20, 30])) == pytest.approx(1.0)
    assert tt.spearman(np.array([1.0, 2, 3]), np.array([30.0, 20, 10])) == pytest.approx(-1.0)
    assert math.isnan(tt.spearman(np.array([1.0, 1, 1]), np.array([1.0, 2, 3])))  # a constant ranks nothing
    assert tt.precondition_slope((64, 128, 256), [400.0, 200.0, 100.0]) == pytest.approx(-1.0)
    assert tt.precondition_slope((64, 128, 256), [50.0, 50.0, 50.0]) == pytest.approx(0.0, abs=1e-12)
    assert [tt.regime_label(s) for s in (-1.0, -0.5, 0.0)] == ["noise-limited", "mixed", "step-limited"]


def test_regime_label_thresholds():
    """noise-limited at slope <= -0.7, step-limited in [-0.3, 0.3], mixed strictly between; above 0.3 the steps
    grow with B (two-prompts with grpo measured +0.59), which is neither limit."""
    slopes = (-1.3, -0.7, -0.6999, -0.5, -0.3001, -0.3, 0.0, 0.3, 0.3001, 0.6)
    assert [tt.regime_label(s) for s in slopes] == ["noise-limited", "noise-limited", "mixed", "mixed", "mixed",
                                                    "step-limited", "step-limited", "step-limited",
                                                    "steps grow with B", "steps grow with B"]


def test_regimes_and_their_step_size_grids():
    bandits = {name: (r.env, r.reward_noise, r.optimizer, r.losses) for name, r in tt.REGIMES.items()
               if r.quadratic_noise is None}
    assert bandits == {
        "bandit": ({}, 0.0, "sgd", ("is", "grpo")), "noisy-reward": ({}, 2.0, "sgd", ("is", "grpo")),
        "few-prompts": ({"num_prompts": 4, "warm_success_max": 0.1, "skill_alignment": 0.1}, 0.0, "sgd",
                        ("is", "grpo")),
        "two-prompts": ({"num_prompts": 2, "feature_dim": 4, "skill_alignment": 0.3}, 0.0, "sgd", ("is",)),
        "adam": ({}, 0.0, "adam", ("is", "grpo"))}
    quadratics = {name: r.quadratic_noise for name, r in tt.REGIMES.items() if r.quadratic_noise is not None}
    assert quadratics == {f"quadratic-noise{n:g}": n for n in (1, 10, 30, 100, 300)}
    assert all(tt.REGIMES[name].losses == ("quadratic",) for name in quadratics)
    assert "outside their assumptions" in tt.REGIMES["adam"].description  # the objectives assume SGD
    factors, unit = tt.REGIMES["bandit"].lr_grid(0.5)  # SGD: factors of 1/L
    assert factors.tolist() == [2.0, 1.0, 0.5, 0.25, 0.125] and unit == 0.5
    assert (factors / unit).tolist() == [4.0, 2.0, 1.0, 0.5, 0.25]
    factors, unit = tt.REGIMES["two-prompts"].lr_grid(0.5)  # shifted up 8x: its tuned step (4-8/L) > 2/L
    assert factors.tolist() == [16.0, 8.0, 4.0, 2.0, 1.0] and unit == 0.5
    factors, unit = tt.REGIMES["adam"].lr_grid(0.5)  # Adam: absolute, the measured L plays no part
    assert factors.tolist() == [2.0, 1.0, 0.5, 0.25, 0.125] and unit == 1.0
    assert len(tt.ADAM_LRS) == len(tt.LR_FACTORS)  # the same number of log-spaced values as SGD's grid
    assert np.allclose(np.diff(np.log2(tt.ADAM_LRS)), -1.0)
    # options.json records the optimizer only when it is not SGD: directories written before it existed resume
    assert tt.regime_record(tt.REGIMES["bandit"]) == {"name": "bandit", "env": {}, "reward_noise": 0.0,
                                                      "description": tt.REGIMES["bandit"].description,
                                                      "losses": ("is", "grpo"), "quadratic_noise": None}
    assert tt.regime_record(tt.REGIMES["adam"])["optimizer"] == "adam"
    assert tt.regime_record(tt.REGIMES["two-prompts"])["lr_factors"] == (16.0, 8.0, 4.0, 2.0, 1.0)


def test_adam_first_step_moves_every_coordinate_by_its_lr():
    """Adam's bias-corrected first step is lr g / (|g| + eps): each coordinate moves by lr (SGD's by lr |g|)."""
    env = small_env()
    lrs = np.array([0.5, 0.125])
    trace = tt.train(env, "is", lrs, 16, 16, 16, 3, target=2.0, max_steps=1, keep_history=True, optimizer="adam")
    moved = np.abs(trace.history[:, 1] - trace.history[:, 0])  # seed 0 of each lr, (lrs, d)
    np.testing.assert_allclose(moved, lrs[:, None] * np.ones((1, 4)), rtol=1e-6)
    sgd = tt.train(env, "is", lrs, 16, 16, 16, 3, target=2.0, max_steps=1, keep_history=True)
    assert not np.allclose(np.abs(sgd.history[:, 1] - sgd.history[:, 0]), lrs[:, None])  # SGD moves by lr |g|


def test_adam_runs_are_stored_under_their_own_key_and_sgd_keys_are_unchanged(tmp_path):
    env = small_env()
    store = tt.Store(tmp_path)
    options = tt.Options(seeds=2)
    lrs = np.array([0.5, 0.25])
    sgd = tt._run_design(store, env, "bandit", "is", 0, options, 16, 16, 16, lrs, 2.0, 3)
    adam = tt._run_design(store, env, "adam", "is", 0, options, 16, 16, 16, lrs, 2.0, 3, optimizer="adam")
    assert "optimizer" not in sgd["config"] and adam["config"]["optimizer"] == "adam"
    assert sgd["key"] == tt._key({"kind": "run", "regime": "bandit", "loss": "is", "instance": 0, "N": 16, "R": 16,
                                  "B": 16, "lrs": [0.5, 0.25], "seeds": 2, "target": 2.0, "max_steps": 3,
                                  "keep_history": False})
    assert sgd["steps"] == adam["steps"] == 3  # target 2 > max reward: censored at max_steps


def test_pluggable_objectives():
    calibration = None  # simple objectives ignore the measured inputs
    values = tt.objective_values([(1, 1), (4, 2), (16, 8)], 2.0, calibration, 1.0,
                                 {"paper_J": lambda x, y: x, "finite_budget": lambda x, y: -y,
                                  "null": lambda x, y: tt.gamma(x, y, 2.0)})
    np.testing.assert_array_equal(values["paper_J"], [1, 4, 16])
    np.testing.assert_array_equal(values["finite_budget"], [-1, -2, -8])
    np.testing.assert_allclose(values["null"], [1.0, 2 / 3, 1.25 / 3])


# --------------------------------------------------------------------------- training


def test_a_step_size_whose_seed_mean_never_reached_the_target_is_not_tuned():
    run = _fake_run([1.0, 0.5], [[5.0, 7.0], [9.0, 11.0]])
    run["mean_passage"] = [run["steps"] + 1, 10]  # lr 1's seeds crossed by fluctuation; its mean never did
    np.testing.assert_array_equal(tt._passage(run), [[np.inf, np.inf], [9.0, 11.0]])
    assert tt._tuned(run) == (10.0, pytest.approx(np.array([False, False])))
    run["mean_passage"] = [run["steps"] + 1] * 2  # none did: every step size kept, the design's steps a lower bound
    np.testing.assert_array_equal(tt._passage(run), [[5.0, 7.0], [9.0, 11.0]])


def test_train_first_passage_and_censoring():
    env = small_env()
    lrs = np.array([1.0, 0.5])
    reached = tt.train(env, "is", lrs, 32, 16, 16, 3, target=-1.0, max_steps=5)
    assert reached.steps == 1 and reached.first_passage.tolist() == [[1, 1, 1], [1, 1, 1]]
    assert reached.mean_passage.tolist() == [1, 1]
    never = tt.train(env, "grpo", lrs, 32, 16, 16, 3, target=2.0, max_steps=7)
    assert never.steps == 7 and never.censored.all() and (never.first_passage == 8).all()
    assert never.mean_passage.tolist() == [8, 8] and (never.mean_reward_max < 2.0).all()
    again = tt.train(env, "grpo", lrs, 32, 16, 16, 3, target=2.0, max_steps=7)
    np.testing.assert_array_equal(never.mean_reward, again.mean_reward)  # same seed, same run


# --------------------------------------------------------------------------- the whole benchmark, tiny


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(tt, "QUICK_X_GRID", (1, 4))
    monkeypatch.setattr(tt, "QUICK_Y_GRID", (1, 4))
    monkeypatch.setattr(tt, "PRECONDITION_BATCHES", (128, 256))
    monkeypatch.setattr(tt, "STALENESS", (0, 2, 8))
    monkeypatch.setattr(tt, "BOOTSTRAP", 50)
    return tt.Options(instances=(0,), losses=("is",), mus=(1.0, 20.0), seeds=2, quick=True, regimes=("bandit",))


def simple_objectives(mu, calibration, budget):
    return {"paper_J": lambda x, y: 1.0 / y, "finite_budget": lambda x, y: x + y,
            "null": lambda x, y: tt.gamma(x, y, mu)}


def test_benchmark_runs_resumes_and_never_overwrites(tmp_path, tiny, monkeypatch):
    out = tmp_path / "bench"
    summary = tt.run_theory_test(out, tiny, progress=False, objectives=simple_objectives)
    assert [(c["regime"], c["loss"], c["mu"]) for c in summary["cells"]] == [("bandit", "is", 1.0),
                                                                            ("bandit", "is", 20.0)]
    for cell in summary["cells"]:
        assert cell["predicted"] == {"x": 1, "y": 1, "objective": "finite_budget", "value": 2.0}  # argmin x + y
        assert cell["by_objective"]["paper_J"]["y"] == 4  # argmin 1/y
        compute = {(d["x"], d["y"]): d["compute"] for d in cell["designs"]}
        best = min(compute.values())
        assert cell["regret"] == pytest.approx(compute[(1, 1)] / best)
        assert compute[(cell["best"]["x"], cell["best"]["y"])] == best
        assert cell["regret_ci"][0] <= cell["regret"] * (1 + 1e-12) or cell["regret_ci"][0] >= 1.0
        # mu only prices the same runs: steps per design are identical across mu, compute = steps (mu R + B)
        for d in cell["designs"]:
            assert d["compute"] == pytest.approx(d["steps"] * (cell["mu"] * 256 / d["y"] + 256))
        assert cell["inputs"]["rho"] == 0.0 and cell["inputs"]["bias_kappa"] == 0.0  # is: unbiased
        assert cell["inputs"]["F0"] == pytest.approx(cell["inputs"]["J_star"] - cell["inputs"]["J0"])
    steps = [[d["steps"] for d in c["designs"]] for c in summary["cells"]]
    assert steps[0] == steps[1]
    text = (out / "summary.json").read_text()

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(tt, "train", no_training)
    again = tt.run_theory_test(out, tiny, progress=False, objectives=simple_objectives)  # resume: all saved
    assert again["cells"] == json.loads(text)["cells"] and (out / "summary.json").read_text() == text
    with pytest.raises(ValueError, match="holds a different summary; results are never overwritten"):
        tt.run_theory_test(out, tiny, progress=False,
                           objectives=lambda mu, c, b: {**simple_objectives(mu, c, b), "paper_J": lambda x, y: y})


def test_out_directory_is_checked_before_work(tmp_path, tiny):
    unrelated = tmp_path / "unrelated"
    unrelated.mkdir()
    (unrelated / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is a non-empty directory that holds no theory-test results"):
        tt.run_theory_test(unrelated, tiny, progress=False)
    assert sorted(p.name for p in unrelated.iterdir()) == ["notes.txt"]
    started = tmp_path / "started"
    started.mkdir()
    (started / "options.json").write_text(tt.options_text(tiny))
    other = tt.Options(instances=(0,), losses=("grpo",), mus=(1.0,), seeds=2, quick=True, regimes=("bandit",))
    with pytest.raises(ValueError, match="holds a theory-test run with other options or another code version"):
        tt.run_theory_test(started, other, progress=False)
    assert sorted(p.name for p in started.iterdir()) == ["options.json"]


# --------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("args, message", [
    (["--loss", "foo"], "--loss must be a comma-separated list of is, grpo, quadratic, got foo"),
    (["--loss", "grpo", "--regime", "two-prompts"], "--loss grpo selects no setting of --regime two-prompts "
                                                    "(two-prompts: is)"),
    (["--mu", "0,1"], "--mu must be a comma-separated list of finite numbers > 0, got 0,1"),
    (["--mu", "a"], "--mu must be a comma-separated list of finite numbers > 0, got 'a'"),
    (["--seeds", "1"], "--seeds must be an integer >= 2 (the bootstrap resamples seeds), got 1"),
    (["--instance", "-1"], "--instance must be a comma-separated list of distinct integers >= 0, got -1"),
    (["--instance", "0,0"], "--instance must be a comma-separated list of distinct integers >= 0, got 0,0"),
])
def test_bad_options_are_one_line_before_any_work(cli, tmp_path, args, message):
    out = tmp_path / "new"
    code, stdout, stderr = cli("experiment", "theory-test", "--out", str(out), *args)
    assert code == 2 and stderr.strip() == f"replay-theory: error: {message}" and not out.exists()


def test_theory_test_options_are_refused_for_other_experiments(cli, tmp_path):
    code, _, stderr = cli("experiment", "sanity", "--out", str(tmp_path / "s"), "--seeds", "4", "--quick")
    assert code == 2 and stderr.strip() == ("replay-theory: error: --seeds, --quick only apply to the theory-test "
                                            "experiment, not sanity")
    assert not (tmp_path / "s").exists()


# --------------------------------------------------------------------------- the figure and table


OBJECTIVE_SPEARMAN = (("noise_scale", 0.8), ("noise_scale_long", 0.75), ("noise_scale_grad", 0.7), ("paper_J", 0.5),
                      ("finite_budget", 0.6),
                      ("null", -0.2), ("on_policy", None))


def fake_summary() -> dict:
    cells = []
    for regime, measured in (("bandit", "noise-limited"), ("noisy-reward", "noise-limited")):
        for mu in (0.5, 5.28, 20.0):
            by = {name: {"x": 4, "y": 2, "value": 1.0, "regret": 1.0 + mu / 10, "regret_ci": [1.0, 1.5 + mu / 10],
                         "spearman": s} for name, s in OBJECTIVE_SPEARMAN}
            cells.append({"regime": regime, "loss": "is", "instance": 0, "mu": mu, "regime_measured": measured,
                          "b": 0.3,
                          "precondition_slope": -0.9, "predicted": {"x": 4, "y": 2, "objective": "noise_scale"},
                          "best": {"x": 8, "y": 4}, "regret": 1.0 + mu / 10, "regret_ci": [1.0, 1.5 + mu / 10],
                          "spearman": dict(OBJECTIVE_SPEARMAN), "by_objective": by,
                          "on_policy_batches": {"64": {"ratio_to_best": 0.8}, "256": {"ratio_to_best": 1.2}}})
    return {"cells": cells}


def test_figure_data_and_print_readiness(tmp_path):
    (tmp_path / "theory-test").mkdir()
    (tmp_path / "theory-test" / "summary.json").write_text(json.dumps(fake_summary()))
    data = fig.theory_test_data(tmp_path)
    assert set(data) == {("bandit", "is"), ("noisy-reward", "is")}
    d = data[("bandit", "is")]
    np.testing.assert_allclose(d["mu"], [0.5, 5.28, 20.0])
    np.testing.assert_allclose(d["regret"]["noise_scale"], [1.05, 1.528, 3.0])
    np.testing.assert_allclose(d["high"]["paper_J"], [1.55, 2.028, 3.5])
    np.testing.assert_allclose(d["spearman"]["null"], [-0.2] * 3)
    assert np.isnan(d["spearman"]["on_policy"]).all() and d["measured"] == "noise-limited"
    assert print_problems(fig.plot_theory_test(tmp_path)) == []


def test_missing_summary_names_the_command(tmp_path):
    with pytest.raises(fig.MissingResults, match="replay-theory experiment theory-test --out"):
        fig.check_results("theory-test", tmp_path)


def test_table_rows():
    table = tt.summary_table(fake_summary())
    rows = table.splitlines()
    assert rows[:2] == ["| setting | loss | inst | slope | b from steps [90% CI] | b from gradients | S_min | "
                        "lr edge / extended / censored / buffer filled / curve reaches target (of designs) |",
                        "|---" * 9 + "|"]
    assert len(rows) == 2 + 1 + 2 + 6 + 1  # no settings in the fake; a blank line, header, rule, 6 cells, blank
    assert rows[5] == ("| bandit | is | 0 | 0.5 | 8, 4 | 4, 2, 1.05 [1, 1.55] | 4, 2, 1.05 | 4, 2, 1.05 | 4, 2, 1.05 | "
                       "1.05 | 1.05 [1, 1.55] | 64: 0.8 | 0.8 / 0.7 / 0.5 / -0.2 |")


def test_jobs_is_refused_for_theory_test(cli, tmp_path):
    code, out, err = cli("experiment", "theory-test", "--out", str(tmp_path / "t"), "--jobs", "2")
    assert (code, out) == (2, "")
    assert err == ("replay-theory: error: --jobs does not apply to theory-test: it runs in one process (seeds and "
                   "step sizes vectorised); leave it out\n")
    assert not (tmp_path / "t").exists()


def test_regime_option_is_checked_before_any_work(cli, tmp_path):
    code, out, err = cli("experiment", "theory-test", "--out", str(tmp_path / "t"), "--regime", "bandit,lunar")
    assert (code, out) == (2, "")
    assert err.startswith("replay-theory: error: --regime must be a comma-separated list of bandit, noisy-reward, "
                          "few-prompts, two-prompts, adam, quadratic-noise1,") and err.endswith("got bandit,lunar\n")
    assert not (tmp_path / "t").exists()
    assert tt.Options().regimes == ("quadratic-noise1", "quadratic-noise10", "quadratic-noise30", "quadratic-noise100",
                                    "quadratic-noise300", "two-prompts", "bandit",
                                    "noisy-reward")  # few-prompts and adam are opt-in


def test_spearman_equals_scipys_with_ties():
    """The numpy rank correlation (no scipy.stats import at start-up) against scipy's, ties included."""
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for _ in range(50):
        a, b = rng.integers(0, 5, 20).astype(float), rng.normal(size=20)
        assert tt.spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)


# --------------------------------------------------------------------------- issue 22: the noise-scale rule's scoring


def _fake_run(lrs, passage, censored=None, key="k"):
    passage = np.asarray(passage, dtype=float)
    censored = np.zeros(passage.shape, bool) if censored is None else np.asarray(censored)
    return {"key": key, "config": {"lrs": list(lrs)}, "first_passage": passage.tolist(),
            "censored": censored.tolist(), "steps": int(passage.max()), "mean_reward_max": [0.0] * len(lrs),
            "mean_passage": passage.mean(axis=1).tolist()}


def test_b_from_steps_is_exact_on_the_mcCandlish_law():
    # S(B) = S_min (1 + B_noise / B) with S_min = 40, B_noise = 64: 50, 60, 80 steps at B = 256, 128, 64
    runs = [_fake_run([1.0, 0.5], [[40 * (1 + 64 / B)] * 4, [999.0] * 4]) for B in (64, 128, 256)]
    fit = tt._steps_fit(runs, (64, 128, 256), np.random.default_rng(0))
    assert fit["s_min"] == pytest.approx(40.0) and fit["b_noise"] == pytest.approx(64.0)
    assert fit["b_noise_interval"] == pytest.approx([64.0, 64.0])  # every seed alike: no spread
    flat = [_fake_run([1.0], [[100.0 * 256 / B] * 4]) for B in (64, 128, 256)]  # steps ~ 1/B: S_min = 0
    assert tt._steps_fit(flat, (64, 128, 256), np.random.default_rng(0))["b_noise"] == math.inf


def test_noise_scale_values_by_hand():
    grid = [(1, 1), (1, 4), (4, 4), (1, 8)]
    b, mu = 0.25, 5.28
    values = tt.noise_scale_values(grid, b, mu)
    expected = [(1 + b) * (1 + mu), (1 + 5 * b) * (1 + mu / 4), (1 + 5 * b) * (1 + mu / 4), (1 + 9 * b) * (1 + mu / 8)]
    np.testing.assert_allclose(values, expected)
    assert int(np.argmin(values)) == 1  # ties across x go to the shortest horizon, the grid's first
    limit = tt.noise_scale_values(grid, math.inf, mu)  # b -> inf: B V (1 + mu / y), the on-policy design first
    np.testing.assert_allclose(limit, [1 + mu, 5 * (1 + mu / 4), 5 * (1 + mu / 4), 9 * (1 + mu / 8)])
    longest = tt.noise_scale_values(grid, b, mu, horizon=4)  # the rule's y at x = 4; other replay designs last
    np.testing.assert_allclose(longest, [expected[0], np.inf, expected[2], np.inf])
    assert grid[int(np.argmin(longest))] == (4, 4)


def test_a_step_size_at_an_edge_is_extended_beyond_it(monkeypatch):
    calls = []

    def fake_run_design(store, env, regime, loss, instance, options, N, R, B, lrs, target, max_steps,
                        keep_history=False, tick=None, optimizer="sgd", replacement=False):
        lrs = np.asarray(lrs, dtype=float)
        calls.append(lrs.tolist())
        return _fake_run(lrs, [[10.0 / lr] * 3 for lr in lrs], key=str(len(calls)))  # the larger, the faster

    monkeypatch.setattr(tt, "_run_design", fake_run_design)
    merged = tt._tuned_run(None, None, tt.REGIMES["bandit"], "is", 0, tt.Options(seeds=3), 16, 16, 16,
                           np.array([1.0, 0.5]), 1.0, 10)
    assert calls == [[1.0, 0.5], [4.0, 2.0], [16.0, 8.0]]  # two rounds up, then EXTEND_ROUNDS stops it
    assert merged["lrs"] == [16.0, 8.0, 4.0, 2.0, 1.0, 0.5] and merged["extended"] == 2 and merged["at_edge"]
    assert merged["first_passage"][0] == [10 / 16] * 3


def test_targets_count_cells_and_the_falsifying_checks():
    def cell(regime, mu, ns, op, gain, b=2.0):
        by = {"noise_scale": {"regret": ns, "spearman": 0.9}, "on_policy": {"regret": op, "spearman": None}}
        return {"regime": regime, "loss": "is", "instance": 0, "mu": mu, "b": b, "by_objective": by,
                "best_replay_gain": gain, "replay_vs_on_policy_at_R": {"64": {"ratio": 1.05, "x": 1, "y": 4}}}

    t = tt.targets([cell("a", 1.0, 1.1, 2.0, 1.3), cell("a", 5.28, 1.3, 1.2, 0.9), cell("b", 20.0, 1.0, 1.6, 1.6)])
    o = t["objectives"]["noise_scale"]
    assert (o["within_1.2"], o["within_1.5"], o["worst"]) == (2, 3, 1.3)
    assert o["cells_on_policy_above_1.5"] == 2 and o["beats_on_policy_by_1.5x"] == 2  # 2.0/1.1 and 1.6/1.0
    assert t["high_b_replay_gain_max"] == 1.3 and t["high_b_cells_replay_wins_over_1.2"] == ["a/is/i0/mu1: 1.30"]
    assert t["fixed_R_ratio_max"] == 1.05 and t["fixed_R_cells_replay_wins_over_1.1"] == []


def test_the_quadratic_trains_through_the_benchmark_loop():
    env = tt.make_env(tt.REGIMES["quadratic-noise10"], instance=0)
    lrs = np.array([1.0, 0.5])
    on = tt.train(env, "quadratic", lrs, 64, 64, 64, 4, env.target, 2000)
    replay = tt.train(env, "quadratic", lrs, 16, 16, 64, 4, env.target, 2000)  # x = 1, y = 4: R = 16
    with_replacement = tt.train(env, "quadratic", lrs, 64, 64, 64, 4, env.target, 2000, replacement=True)
    assert not on.censored[0].any() and on.steps < 2000  # the larger step decides; the run stops at 1.25x it
    steps = [t.first_passage.mean(axis=1).min() for t in (on, replay, with_replacement)]
    assert steps[1] > steps[0] and steps[2] >= steps[0]  # replay's fixed noise costs steps; so does replacement
    again = tt.train(env, "quadratic", lrs, 16, 16, 64, 4, env.target, 2000)
    np.testing.assert_array_equal(replay.first_passage, again.first_passage)  # same seed, same numbers


def test_evidence_is_written_once_and_read_by_optimal(tmp_path):
    from replay_theory.theory import evidence

    summary = {"cells": [{"regime": "bandit", "loss": "is"}], "replay_theory_version": "0.1.0",
               "protocol": {"seeds": 16, "instances": [0, 1, 2], "grid": [[1, 1]], "mus": [1.0], "quick": False},
               "targets": {"cells": 10, "objectives": {"noise_scale": {"within_1.2": 9, "share_within_1.2": 0.9,
                                                                       "within_1.5": 10, "worst": 1.3}}},
               "targets_held_out": None}
    path = tt.write_evidence(tmp_path, summary, "replay-theory experiment theory-test --out theory-test")
    record = json.loads(path.read_text())
    assert record["settings"] == ["bandit/is"] and record["targets"] == summary["targets"]
    assert evidence.evidence_line("noise-scale", record) == (
        "evidence: within 1.2x of the best design in 9 of 10 benchmark cells (90%), within 1.5x in 10, worst 1.30 "
        "(replay-theory experiment theory-test --out theory-test, docs/SIMULATION.md)")
    assert tt.write_evidence(tmp_path, summary, "replay-theory experiment theory-test --out theory-test") == path
    with pytest.raises(ValueError, match="holds other evidence; results are never overwritten"):
        tt.write_evidence(tmp_path, summary, "another command")

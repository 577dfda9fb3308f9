"""validate calibrate-model -> predict on a tiny run: the files, and the prediction equals the theory on them."""

import dataclasses
import json
import math
import shlex

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from replay_theory.advise.profile_files import load_profile  # noqa: E402
from replay_theory.core.designs import DesignConfig  # noqa: E402
from replay_theory.theory.design import DesignQuery, optimal_design  # noqa: E402
from replay_theory.theory.group_replay import fresh_verifier_evaluations  # noqa: E402
from replay_theory.validate.families import design_cost, steps_at_budget  # noqa: E402
from replay_theory.validate.loop import (  # noqa: E402
    ValidateConfig,
    VerifyConfig,
    run_calibrate,
    run_predict,
    run_verify,
)

SMALL = ValidateConfig(n_train=120, n_test=16, sft_steps=40, rollouts_per_step=16, group_size=4, probe_steps=10,
                       samples=8, max_new_tokens=12, mu_window_seconds=2.0)


class RecordedBar:
    """Stands in for the progress bar: records each bar's label, total and how far it got."""

    bars: list = []

    def __init__(self, label, total, done=0, enabled=True):
        self.label, self.total, self.count, self.enabled = label, total, done, enabled
        RecordedBar.bars.append(self)

    def advance(self):
        self.count += 1

    def update(self, done):
        self.count = done

    def tick(self):
        pass

    def close(self):
        pass


@pytest.mark.slow
def test_calibrate_then_predict(tmp_path, monkeypatch, cli):
    import replay_theory.validate.loop as loop

    monkeypatch.setattr(loop, "ProgressBar", RecordedBar)
    RecordedBar.bars = []
    out = tmp_path / "run"
    printed: list[str] = []
    calibration = run_calibrate(SMALL, out, log=printed.append, progress=True)
    # its next: line runs as printed (issue 37): the profile, --price-mu as --mu (the profile carries no mu), the
    # probe's batch and groups; where the probe resolved no B_noise it says so instead of naming a command
    hint = loop.calibrate_next_line(SMALL, out)
    command = (f"next: replay-theory optimal --profile {out / 'profile.json'} --mu {SMALL.price_mu:g} "
               f"-B {SMALL.rollouts_per_step}")
    if "no B_noise was measured" not in hint:
        assert hint == command + (f" --group-size {SMALL.group_size}" if SMALL.group_size > 1 else "")
        code, answer, err = cli(*shlex.split(hint[len("next: replay-theory "):]))
        assert code == 0 and answer.startswith("what to do: "), (hint, err)
    # a bar per phase, each run to its end: warm start, probe, noise measurement (reference chunks, 5 staleness
    # values, the buffer, and the 2 earlier noise-scale checkpoints: the last reuses the reference)
    progress = {bar.label: (bar.count, bar.total) for bar in RecordedBar.bars}
    assert progress == {"warm start (SFT steps)": (40, 40), "probe (RL steps)": (10, 10),
                        "noise (gradient batches)": (1 + 5 + 1 + 2, 9),
                        "App. E count window (0.1 s)": (20, 20), "kappa (curvature pairs per checkpoint)": (2, 2)
                        } and all(b.enabled for b in RecordedBar.bars)
    assert calibration["staleness"] == [0.0, 1.0, 2.0, 4.0, 8.0]
    assert len(calibration["sigma_sq"]) == 5 and all(v >= 0 for v in calibration["sigma_sq"])
    assert calibration["mu_timing"] > 0 and calibration["rho"] == calibration["rho_fit"]["value"]  # never clamped
    assert calibration["rho_fit"]["in_range"] == (0.0 <= calibration["rho"] <= 1.0)
    assert calibration["sigma_sq_form"] == "signal-normalised" and len(calibration["retained_signal"]) == 5
    assert set(calibration["kl_by_lag"]) == {"1", "2", "4", "8"}
    summary = json.loads((out / "calibration_summary.json").read_text())
    assert summary["mu_measured"] == calibration["mu_timing"] and 0.0 <= summary["warm_start"]["pass@1"] <= 1.0
    # App. E count-based mu: whole generations of R and whole updates of B (= R in the probe) in a 2 s window
    # (long enough that one generation finishes inside it on a machine shared with other jobs)
    window = calibration["count_window"]
    R = SMALL.rollouts_per_step
    assert window["seconds"] == 2.0 and window["workers"] == window["trainers"] == 1
    assert window["k_inference"] % R == 0 and window["k_training"] % R == 0 and window["k_inference"] > 0
    assert calibration["mu_count"] == pytest.approx(window["k_training"] / window["k_inference"])
    assert summary["mu_count"] == calibration["mu_count"] and summary["engine"] == "hf"
    from replay_theory.validate.config import load_run_config

    assert load_run_config(out) == SMALL and load_run_config(out, device="cpu", engine=None).engine == "hf"
    # a second call resumes: nothing is measured or overwritten again
    stamp = (out / "calibration.json").stat().st_mtime_ns
    run_calibrate(SMALL, out, log=lambda *_: None)
    assert (out / "calibration.json").stat().st_mtime_ns == stamp

    predicted = run_predict(SMALL, out, log=lambda *_: None)
    loaded = load_profile(out / "profile.json")
    # the LM's one-checkpoint fit has no interval: an out-of-range value gives rho = 0, said, never clamped
    in_range = calibration["rho_fit"]["in_range"]
    assert predicted["rho_used"] == (loaded.rho if in_range else 0.0)
    assert (predicted["rho_note"] is None) == in_range
    design = optimal_design(DesignQuery(mu=SMALL.price_mu, profile=loaded.profile,
                                        profile_rho=predicted["rho_used"],
                                        rollouts_per_step=SMALL.rollouts_per_step))
    assert predicted["regime"] == design.regime and predicted["rollouts_per_step"] == SMALL.rollouts_per_step
    if math.isfinite(design.x_star):
        assert predicted["x_star"] == pytest.approx(design.x_star) and predicted["capacity"] == design.capacity
    saved = json.loads((out / "predicted.json").read_text())
    assert {"N", "B", "R"}.isdisjoint(saved) and saved["batch_size"] == design.batch_size  # DesignConfig's names
    # compute is priced at --price-mu; the timing mu is recorded next to it, not used
    assert saved["mu"] == SMALL.price_mu == 5.28 and saved["mu_timing"] == calibration["mu_timing"]

    RecordedBar.bars = []
    report = run_verify(SMALL, out, VerifyConfig(seeds=2, budget_updates=3, group_replay=True), log=lambda *_: None,
                        progress=True)
    assert [(b.label, b.count, b.total) for b in RecordedBar.bars] == [
        ("verify (design x seed runs)", 2 * len(report["designs"]), 2 * len(report["designs"]))]
    mu, R = SMALL.price_mu, SMALL.rollouts_per_step
    budget = 3 * (mu * R + R)
    names = [d["name"] for d in report["designs"]]
    centre = "predicted" if predicted["regime"] == "replay" else "on-policy"
    N0, B0 = (predicted["capacity"], predicted["batch_size"]) if centre == "predicted" else (R, R)
    fifo = {(d["capacity"], d["batch_size"]) for d in report["designs"] if d["family"]}
    assert names[0] == "on-policy" and (2 * N0, B0) in fifo and (N0, 2 * B0) in fifo  # the neighbours ran
    # the verdict: the centre's rank, regret (best family mean - centre mean) and one paired comparison per neighbour
    verdict = report["verdict"]
    family_rows = [d for d in report["designs"] if d["family"]]
    means = {d["name"]: d["final_reward_mean"] for d in family_rows}
    assert verdict["family"]["regret"] == pytest.approx(max(means.values()) - means[centre])
    assert verdict["family"]["rank"] == 1 + sum(m > means[centre] for m in means.values())
    assert verdict["family"]["regret_ci"][0] <= verdict["family"]["regret_ci"][1]
    assert len(verdict["pairs"]) == len(family_rows) - 1
    assert names[-3:] == ["RLOO rho=0", "RLOO rho=1, L=1, c=1", "RLOO rho=1, L=2, c=3"]  # FIFO first, then RLOO
    assert report["designs"][0]["steps"] == 3  # on-policy gets exactly the budget's 3 updates
    K = SMALL.group_size
    for d in report["designs"]:
        assert 0.0 <= d["final_reward_mean"] <= 1.0 and d["seeds"] == 2
        if d["buffer"] == "group-replay":
            continue
        # equal compute: as many updates of cost mu R + B as fit in the on-policy budget
        assert d["compute"] == pytest.approx(d["steps"] * (mu * R + d["batch_size"]))
        assert d["compute"] <= budget * (1 + 1e-9) < d["compute"] + mu * R + d["batch_size"] or d["steps"] == 1
        assert d["fresh_rollouts"] == d["steps"] * R
    groups = R // K  # B = R completions per update: 4 groups of K = 4, round(4 / (1 + rho)) of them fresh
    for d in (d for d in report["designs"] if d["buffer"] == "group-replay"):
        # the RLOO budget K (B + (T - 1) B_fresh) of fresh rollouts, counted by train(), charged at mu each
        b_fresh = {0.0: 4, 1.0: 2}[d["replay_ratio_groups"]]
        assert d["fresh_rollouts"] == fresh_verifier_evaluations(K, groups, d["steps"], d["replay_ratio_groups"])
        assert d["fresh_rollouts"] == K * (groups + (d["steps"] - 1) * b_fresh)
        assert d["compute"] == pytest.approx(mu * d["fresh_rollouts"] + d["steps"] * R)
        # equal compute: the most updates that fit (the first is all fresh, later ones mu K B_fresh + B)
        assert d["compute"] <= budget + 1e-9 < d["compute"] + mu * K * b_fresh + R
        assert d["loss"] == "rloo" and d["batch_size"] == R and d["rollouts_per_step"] == K * b_fresh
        assert d["capacity"] is None and d["x"] is None
    rloo = {d["name"]: d for d in report["designs"] if d["buffer"] == "group-replay"}
    assert rloo["RLOO rho=0"]["steps"] == report["designs"][0]["steps"]  # rho = 0 costs what on-policy does
    replayed = rloo["RLOO rho=1, L=2, c=3"]
    # fewer fresh rollouts per update: at least as many updates in the budget (more at larger budgets, see below)
    assert replayed["steps"] >= rloo["RLOO rho=0"]["steps"]
    fresh_only = rloo["RLOO rho=0"]
    assert replayed["fresh_rollouts"] / replayed["steps"] < fresh_only["fresh_rollouts"] / fresh_only["steps"] == R
    assert report["measured_best"]["final_reward_mean"] == max(d["final_reward_mean"] for d in report["designs"])
    written = json.loads((out / "report.json").read_text())
    for key in ("mu_measured", "mu_count", "profile", "predicted", "designs", "measured_best", "warm_start_reward",
                "learning_signal", "gap"):
        assert key in written
    for d in written["designs"]:
        knobs = (("replay_ratio_groups", "max_age", "clip_c") if d["buffer"] == "group-replay" else
                 ("capacity", "batch_size", "rollouts_per_step"))
        assert all(d[k] is not None for k in knobs)
        for key in ("seeds", "final_reward_mean", "final_reward_std", "compute"):
            assert key in d
    assert [(d["replay_ratio_groups"], d["max_age"], d["clip_c"]) for d in written["designs"][-2:]] == [
        (1.0, 1, 1.0), (1.0, 2, 3.0)]
    warm = written["warm_start_reward"]
    assert warm["seeds"] == 2 and warm["by_seed"][0] == written["warm_start"]["mean_reward"]
    best = written["measured_best"]
    assert written["learning_signal"]["gain"] == pytest.approx(best["final_reward_mean"] - warm["mean"])
    assert written["mu_count"] == calibration["mu_count"] and written["count_window"] == window
    assert (out / "report.md").read_text().startswith("# Validation report")
    assert f"K_inference = {window['k_inference']}" in (out / "report.md").read_text()
    from replay_theory.validate.steplog import read_log

    logs = sorted((out / "verify").glob("*.jsonl"))
    assert len(logs) == 2 * len(report["designs"])
    first = read_log(logs[0])
    assert [m["step"] for m in first] == list(range(len(first))) and all("loss" in m and "ess_frac" in m for m in first)


def test_equal_compute_of_fifo_and_group_replay_by_hand():
    """mu = 0.5, R = B = 64, K = 8; budget = 24 on-policy updates = 24 (0.5 x 64 + 64) = 2304."""
    mu, R, K, budget = 0.5, 64, 8, 2304.0
    on_policy = DesignConfig(buffer="on-policy", capacity=64, batch_size=64, rollouts_per_step=R, group_size=K)
    assert steps_at_budget(on_policy, budget, mu) == 24
    for updates in range(1, 100):  # the on-policy budget buys exactly its updates, whatever the rounding of mu
        assert steps_at_budget(on_policy, updates * (0.998 * R + R), 0.998) == updates
    assert design_cost(on_policy, 24, mu) == {"fresh_rollouts": 1536, "samples_trained": 1536, "compute": 2304.0}
    # rho = 1: 8 groups per update, 4 fresh after the first step. T = 10: 8 (8 + 9 x 4) = 352 fresh,
    # compute 0.5 x 352 + 640 = 816
    replay = DesignConfig(buffer="group-replay", loss="rloo", capacity=R, batch_size=64, rollouts_per_step=R,
                          group_size=K, replay_ratio_groups=1.0, max_age=2, clip_c=3.0)
    assert design_cost(replay, 10, mu) == {"fresh_rollouts": 352, "samples_trained": 640, "compute": 816.0}
    # first step 0.5 x 64 + 64 = 96, then 0.5 x 32 + 64 = 80: 1 + floor(2208 / 80) = 28 updates, compute
    # 0.5 x 8 (8 + 27 x 4) + 28 x 64 = 2256 <= 2304 < 2336 (29 updates)
    assert steps_at_budget(replay, budget, mu) == 28
    assert design_cost(replay, 28, mu)["compute"] == 2256.0
    assert design_cost(replay, 29, mu)["compute"] == 2336.0
    fresh_only = dataclasses.replace(replay, replay_ratio_groups=0.0, max_age=0)  # costs what on-policy GRPO does
    assert steps_at_budget(fresh_only, budget, mu) == 24
    assert design_cost(fresh_only, 24, mu) == design_cost(on_policy, 24, mu)


def test_predict_without_calibration_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no calibration.json"):
        run_predict(SMALL, tmp_path)


def test_truncate_log_drops_steps_a_resumed_run_logs_again(tmp_path):
    from replay_theory.validate.steplog import StepLog, read_log, truncate_log

    log = StepLog(tmp_path / "run.jsonl")
    for step in range(5):
        log(step, {"step": step, "loss": float(step)})
    truncate_log(tmp_path / "run.jsonl", 3)
    assert [m["step"] for m in read_log(tmp_path / "run.jsonl")] == [0, 1, 2]


def test_validate_calibrate_and_all_build_the_same_config_with_the_configs_defaults(monkeypatch, tmp_path):
    """Both commands build their config from ValidateConfig's fields; a CLI default can't drift from the config's."""
    from typer.testing import CliRunner

    import replay_theory.validate.loop as loop
    from replay_theory.cli.app import app

    seen, plans = [], []
    monkeypatch.setattr(loop, "run_calibrate", lambda config, out, log, progress: seen.append(config) or {})
    monkeypatch.setattr(loop, "calibrate_next_line", lambda config, out: "next: (no profile: calibration stubbed)")
    monkeypatch.setattr(loop, "run_predict", lambda config, out, log, rho=None: None)
    monkeypatch.setattr(loop, "run_verify", lambda config, out, plan, log, progress, figure: plans.append(plan) or {
        "measured_best": {"name": "on-policy"}})
    runner = CliRunner()
    for command in ("calibrate-model", "all"):
        assert runner.invoke(app, ["validate", command, "--out", str(tmp_path)]).exit_code == 0
        assert runner.invoke(app, ["validate", command, "--out", str(tmp_path), "--full", "--lr", "1e-6",
                                   "--engine", "auto", "--seed", "3", "--threads", "2", "--samples", "128"]
                             ).exit_code == 0
    default = ValidateConfig()
    full = ValidateConfig(n_train=1657, probe_steps=64, samples=128, lr=1e-6, engine="auto", seed=3, threads=2)
    assert runner.invoke(app, ["validate", "calibrate-model", "--out", str(tmp_path), "--full"]).exit_code == 0
    assert seen.pop() == ValidateConfig(n_train=1657, probe_steps=64, samples=4096)
    assert seen == [default, full, default, full]  # --full keeps a size the user gave (--samples 128)
    assert plans == [VerifyConfig(), VerifyConfig()]
    assert runner.invoke(app, ["validate", "all", "--out", str(tmp_path), "--thorough"]).exit_code == 0
    assert plans[-1] == VerifyConfig(seeds=16, budget_updates=96, group_replay=False, lr_grid="auto")
    refused = runner.invoke(app, ["validate", "all", "--out", str(tmp_path), "--thorough", "--group-replay", "true"])
    assert str(refused.exception) == ("--thorough sets --seeds 16 --budget-updates 96 --group-replay false; give "
                                      "--thorough or those options, not both")
    assert len(plans) == 3  # refused before any work (the CLI's handler turns it into exit code 2)

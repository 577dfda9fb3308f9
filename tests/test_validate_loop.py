"""validate calibrate -> predict on a tiny run: the files, and the prediction equals the theory on them."""

import json
import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from replay_theory.theory.design import DesignQuery, optimal_design  # noqa: E402
from replay_theory.theory.profiles import load_profile  # noqa: E402
from replay_theory.validate.loop import ValidateConfig, run_calibrate, run_predict, run_verify  # noqa: E402

SMALL = ValidateConfig(n_train=120, n_test=16, sft_steps=40, rollouts_per_step=16, group_size=4, probe_steps=10,
                       samples=8, max_new_tokens=12, mu_window_seconds=0.5)


def test_calibrate_then_predict(tmp_path):
    out = tmp_path / "run"
    calibration = run_calibrate(SMALL, out, log=lambda *_: None)
    assert calibration["staleness"] == [0.0, 1.0, 2.0, 4.0, 8.0]
    assert len(calibration["sigma_sq"]) == 5 and all(v >= 0 for v in calibration["sigma_sq"])
    assert calibration["mu_timing"] > 0 and 0.0 <= calibration["rho"] <= 1.0
    assert set(calibration["kl_by_lag"]) == {"1", "2", "4", "8"}
    summary = json.loads((out / "calibration_summary.json").read_text())
    assert summary["mu_measured"] == calibration["mu_timing"] and 0.0 <= summary["warm_start"]["pass@1"] <= 1.0
    # App. E count-based mu: whole generations of R and whole updates of B (= R in the probe) in a 0.5 s window
    window = calibration["count_window"]
    R = SMALL.rollouts_per_step
    assert window["seconds"] == 0.5 and window["workers"] == window["trainers"] == 1
    assert window["k_inference"] % R == 0 and window["k_training"] % R == 0 and window["k_inference"] > 0
    assert calibration["mu_count"] == pytest.approx(window["k_training"] / window["k_inference"])
    assert summary["mu_count"] == calibration["mu_count"] and summary["engine"] == "hf"
    from replay_theory.validate.loop import load_run_config

    assert load_run_config(out) == SMALL and load_run_config(out, device="cpu", engine=None).engine == "hf"
    # a second call resumes: nothing is measured or overwritten again
    stamp = (out / "calibration.json").stat().st_mtime_ns
    run_calibrate(SMALL, out, log=lambda *_: None)
    assert (out / "calibration.json").stat().st_mtime_ns == stamp

    predicted = run_predict(SMALL, out, log=lambda *_: None)
    loaded = load_profile(out / "profile.json")
    design = optimal_design(DesignQuery(mu=calibration["mu_timing"], profile=loaded.profile, profile_rho=loaded.rho,
                                        rollouts_per_step=SMALL.rollouts_per_step))
    assert predicted["regime"] == design.regime and predicted["R"] == SMALL.rollouts_per_step
    if math.isfinite(design.x_star):
        assert predicted["x_star"] == pytest.approx(design.x_star) and predicted["N"] == design.buffer_size
    assert json.loads((out / "predicted.json").read_text())["mu_measured"] == calibration["mu_timing"]

    report = run_verify(SMALL, out, seeds=1, budget_updates=3, log=lambda *_: None)
    mu, R = calibration["mu_timing"], SMALL.rollouts_per_step
    budget = 3 * (mu * R + R)
    names = [d["name"] for d in report["designs"]]
    assert names[0] == "on-policy" and "N=2R, B=R" in names
    for d in report["designs"]:
        # equal compute: as many updates of cost mu R + B as fit in the on-policy budget
        assert d["steps"] == max(1, int(budget // (mu * R + d["B"])))
        assert d["compute"] == pytest.approx(d["steps"] * (mu * R + d["B"]))
        assert 0.0 <= d["final_reward_mean"] <= 1.0 and d["seeds"] == 1
    assert report["measured_best"]["final_reward_mean"] == max(d["final_reward_mean"] for d in report["designs"])
    written = json.loads((out / "report.json").read_text())
    for key in ("mu_measured", "mu_count", "profile", "predicted", "designs", "measured_best"):
        assert key in written
    assert written["mu_count"] == calibration["mu_count"] and written["count_window"] == window
    assert (out / "report.md").read_text().startswith("# Validation report")
    assert f"K_inference = {window['k_inference']}" in (out / "report.md").read_text()
    from replay_theory.validate.steplog import read_log

    logs = sorted((out / "verify").glob("*.jsonl"))
    assert len(logs) == len(report["designs"])
    first = read_log(logs[0])
    assert [m["step"] for m in first] == list(range(len(first))) and all("loss" in m and "ess_frac" in m for m in first)


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

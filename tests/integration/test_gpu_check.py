"""bench/gpu_check.py runs once, blind, on a borrowed GPU: its smoke mode exercises every code path here on the CPU.

The smoke run is launched the way the GPU machine launches the real one (the checkout reached through a symlinked
``replay_theory`` on PYTHONPATH, ``python3 bench/gpu_check.py``), and its results are checked by value: every section
ok or skipped with a reason, mu finite and positive per case, the fp32 sampler-vs-fp32 trainer control at float32
rounding (< 1e-5) while bf16 differs by more, and the JSON and markdown files holding those same numbers.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path("bench") / "gpu_check.py"  # run with cwd = the repo_root fixture (conftest)


def _load(root: Path):
    spec = importlib.util.spec_from_file_location("gpu_check", root / SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, repo_root):
    """One smoke run (a few minutes on 2 cores): (result JSON, markdown file text, stdout). It trains the tiny
    model, so it needs the validate extra (torch, transformers); the README's `pip install -e ".[test]"` skips it."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    base = tmp_path_factory.mktemp("gpu_check")
    (base / "path").mkdir()
    (base / "path" / "replay_theory").symlink_to(repo_root, target_is_directory=True)
    out = base / "out"
    env = {**os.environ, "PYTHONPATH": str(base / "path")}
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out), "--threads", "1"],
                          capture_output=True, text=True, env=env, cwd=repo_root, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text(), done.stdout


@pytest.mark.slow
def test_every_section_ok_or_skipped_with_a_reason(smoke):
    data, _, _ = smoke
    assert list(data["sections"]) == ["environment", "validate_all", "batched_verify", "verdict", "mu",
                                      "logprob_mismatch", "decode"]  # the run order: the compile section last
    for name, record in data["sections"].items():
        status = record["status"]
        assert status == "ok" or (status.startswith("skipped: ") and len(status) > len("skipped: ")), (name, status)
    assert data["sections"]["validate_all"]["status"].startswith("skipped: smoke")
    assert "all present" in data["sections"]["validate_all"]["status"]  # its options were checked against --help
    env = data["sections"]["environment"]
    assert env["device"] == "cpu" and env["torch"] and env["transformers"]
    assert data["wall_s"] < data["deadline_s"]


@pytest.mark.slow
def test_mu_per_case_is_generation_over_update_and_finite(smoke):
    data, markdown, _ = smoke
    cases = data["sections"]["mu"]["cases"]
    assert [(c["shape"], c["length"]) for c in cases] == [("smoke-64", 4), ("smoke-64", 8)]
    for c in cases:
        assert c["status"] == "ok"
        assert math.isfinite(c["mu"]) and c["mu"] > 0
        assert c["mu"] == pytest.approx(c["generation_s"] / c["update_s"], rel=1e-12)  # RLResult.mu_timing
        assert 0 < c["sampling_s"] < c["generation_s"]  # sampling is part of the generation side
        assert c["fixed_length"] and c["completion_tokens"] == 8 * c["length"]  # R = 8, no early stop
        assert f"| {c['length']} | {c['micro_batch']} | " in markdown
        assert f"{c['mu']:.3g}" in markdown
    assert [c["micro_batch"] for c in cases] == [4, 2]  # 16 tokens per chunk: 16 // 4, 16 // 8 completions


@pytest.mark.slow
def test_logprob_mismatch_fp32_control_is_float32_rounding(smoke):
    data, markdown, _ = smoke
    record = data["sections"]["logprob_mismatch"]
    pairs = {c["pair"]: c for c in record["cases"]}
    control = pairs["sampler fp32 vs trainer fp32 (control)"]
    assert control["max_abs"] < 1e-5 and control["seq_max_abs"] < 1e-5  # cached decode vs full forward, fp32
    bf16 = pairs["trainer bf16 vs trainer fp32"]
    assert bf16["max_abs"] > 10 * control["max_abs"]  # the smoke run really went through bf16 arithmetic
    for c in pairs.values():
        assert c["tokens"] == 8 * 8 and 0 <= c["mean_abs"] <= c["max_abs"]
        assert f"| {c['pair']} | {c['max_abs']:.3g} | {c['mean_abs']:.3g} |" in markdown
    assert "bfloat16 autocast over float32 weights" in record["autocast_bf16"]


@pytest.mark.slow
def test_decode_and_batched_numbers_reach_both_files(smoke):
    data, markdown, stdout = smoke
    assert stdout.strip() == markdown.strip()  # the summary printed is the file
    decode = {c["variant"]: c for c in data["sections"]["decode"]["cases"]}
    loop = decode["validator's loop before issue 31 (eager, CPU generator)"]
    assert loop["speedup_vs_old_loop"] == 1.0 and loop["tokens_per_s"] == pytest.approx(8 * 8 / loop["seconds"])
    compiled = next(c for name, c in decode.items() if "torch.compile" in name)
    assert compiled["status"] == "ok" and compiled["compiled"] is True
    assert compiled["compile_s"] == pytest.approx(compiled["first_call_s"] - compiled["seconds"])
    assert decode["validator's loop, eager, CUDA generator"]["status"].startswith("skipped: CPU run")
    for c in decode.values():
        if c["status"] == "ok":
            assert f"| {c['seconds']:.3g} |" in markdown
    batched = data["sections"]["batched_verify"]
    runs = batched["runs"]
    assert batched["ratio_sequential_over_batched"] == pytest.approx(runs["sequential"]["seconds"]
                                                                     / runs["batched"]["seconds"])
    assert batched["held_out_equal"] is True and batched["held_out_max_abs_diff"] == 0.0  # bit-identical on a CPU
    assert runs["batched"]["gpu_busy_fraction"] == "unavailable"  # no nvidia-smi, no CUDA here
    assert f"ratio sequential / batched {batched['ratio_sequential_over_batched']:.3g}x" in markdown


def test_bad_options_are_one_line_exit_2_before_any_work(tmp_path, repo_root):
    for args, option in ((["--deadline-s", "0"], "--deadline-s"), (["--threads", "0"], "--threads"),
                         (["--rollouts", "12"], "--rollouts"), (["--sections", "mu,nope"], "--sections"),
                         (["--budget", "mu=0"], "--budget"), (["--budget", "nope=10"], "--budget"),
                         (["--budget", "mu=600"], "--budget"), (["--budget", "mu=ten"], "--budget")):
        out = tmp_path / "never"
        done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *args], capture_output=True, text=True,
                              cwd=repo_root, timeout=120)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"gpu_check: error: {option} ")
        assert not out.exists()
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "gpu_check.json").write_text("{}")  # an earlier run's result: never overwritten
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "done")], capture_output=True,
                          text=True, cwd=repo_root, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("gpu_check: error: --out ") and done.stderr.count("\n") == 1
    assert (tmp_path / "done" / "gpu_check.json").read_text() == "{}"


def test_budget_pairs_replace_the_plans_caps(repo_root):
    gpu_check = _load(repo_root)
    assert gpu_check.parse_budgets("mu=240, decode=250.5", 575.0) == (("mu", 240.0), ("decode", 250.5))
    assert gpu_check.parse_budgets("", 575.0) == ()
    assert gpu_check.parse_budgets("mu=576", 575.0).startswith("--budget must be SECTION=SECONDS pairs")
    config = gpu_check.CheckConfig(out=Path("x"), budgets=(("mu", 240.0), ("decode", 250.5)))
    plan = gpu_check.with_budgets(gpu_check.make_plan(config), config)
    default = gpu_check.make_plan(config).budgets
    assert plan.budgets == {**default, "mu": 240.0, "decode": 250.5} and default["mu"] == 70


def test_gpu_monitor_summary_and_micro_batch_rule(repo_root):
    gpu_check = _load(repo_root)
    monitor = gpu_check.GpuMonitor()
    monitor.source, monitor.util, monitor.memory = "nvidia-smi", [0.0, 50.0, 100.0, 30.0], [100.0, 200.0, 300.0, 50.0]
    summary = monitor.summary()
    assert summary["gpu_busy_fraction"] == pytest.approx(0.45) and summary["gpu_memory_used_max_mib"] == 300.0
    monitor.source = "unavailable"
    assert monitor.summary()["gpu_busy_fraction"] == "unavailable"
    plan = gpu_check.make_plan(gpu_check.CheckConfig(out=Path("x")))
    # <= 4096 completion tokens per chunk at R = 64: L = 16 fits whole (0), 128 -> 32, 512 -> 8 completions
    assert [gpu_check.micro_batch_for(plan, length) for length in plan.lengths] == [0, 32, 8]
    assert plan.device == "cuda" and plan.rollouts == 64 and plan.shapes[0].vocab_size == 151936


def test_validate_all_section_records_a_failed_run_and_the_sampled_gpu(tmp_path, monkeypatch, repo_root):
    """The non-smoke path of section 2 on the CPU: a fake nvidia-smi reporting 37 % busy, and a validate all that
    refuses its options (exit 2), recorded as one error line with the GPU numbers still there."""
    gpu_check = _load(repo_root)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho '37, 1234'\n")
    (fake / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    plan = gpu_check.make_plan(gpu_check.CheckConfig(out=tmp_path, smoke=True))
    plan = dataclasses.replace(plan, smoke=False, validate_args=("--seeds", "0", "--no-progress"))
    record = gpu_check.section_validate_all(plan, gpu_check.Clock(60.0), 60.0)
    assert record["exit_code"] == 2
    assert record["status"].startswith("error: exit code 2: ") and "--seeds" in record["status"]
    assert record["gpu_source"] == "nvidia-smi" and record["gpu_samples"] >= 1
    assert record["gpu_busy_fraction"] == pytest.approx(0.37) and record["gpu_memory_used_max_mib"] == 1234.0
    assert record["command"].endswith("--seeds 0 --no-progress --device cpu")
    assert (tmp_path / "validate_all.log").read_text().strip().endswith(record["status"].split(": ", 2)[2])


@pytest.mark.slow
def test_the_new_loop_runs_in_every_model_section(smoke):
    """Issue 31: sections 4-6 run the loop validate runs on CUDA (static cache, compiled step, race draw, torch loss);
    the compile is timed apart from mu; the loop's tokens/s and its ratio to the compiled reference are reported."""
    data, markdown, _ = smoke
    mu = data["sections"]["mu"]
    assert "static_cache=True" in mu["loop"] and "compile=True" in mu["loop"] and "torch losses" in mu["loop"]
    for c in mu["cases"]:
        assert c["compile_s"] >= 0 and c["mu"] == pytest.approx(c["generation_s"] / c["update_s"], rel=1e-12)
    decode = data["sections"]["decode"]
    loop = next(c for c in decode["cases"] if c["variant"].startswith("validator's loop as validate runs it"))
    assert loop["status"] == "ok" and loop["compiled"] is True and loop["first_call_s"] > loop["seconds"]
    assert decode["loop_tokens_per_s"] == loop["tokens_per_s"]
    reference = next(c for c in decode["cases"] if "torch.compile" in c["variant"])
    assert decode["loop_over_compiled_reference"] == pytest.approx(loop["tokens_per_s"] / reference["tokens_per_s"])
    assert f"{decode['loop_over_compiled_reference']:.3g} of the compiled reference (target >= 0.7)" in markdown
    assert "compile=True" in data["sections"]["logprob_mismatch"]["decode"]
    runs = data["sections"]["batched_verify"]["runs"]
    assert all(r["compile_s"] == 0.0 for r in runs.values())  # the CPU loop compiles nothing


@pytest.mark.slow
def test_verdict_section_places_every_rule(smoke):
    """Section 7 at smoke sizes: validate all of the fixed-b family with 2 seeds batched and --kappa; the report's
    rules (noise-scale, forgetting-aware, paper) each placed with rank, P(best) and regret, in both files."""
    data, markdown, _ = smoke
    record = data["sections"]["verdict"]
    assert record["status"] == "ok" and record["kappa_given"] == 0.1
    (case,) = record["cases"]  # the smoke plan has no larger batch
    assert case["status"] == "ok" and case["exit_code"] == 0 and case["batch_size"] == 32 and case["seeds"] == 2
    assert case["batched"] is True and (case["b_noise"] is None or case["b_noise"] > 0)
    rules = {r["rule"]: r for r in case["rules"]}
    assert "paper" in rules and set(rules) <= {"noise-scale", "forgetting", "paper"}
    if case["b_noise"] is not None:  # a measured B_noise: both rules that read it made a pick
        assert {"noise-scale", "forgetting"} <= set(rules)
        assert rules["forgetting"]["kappa"] == 0.1 and rules["forgetting"]["kappa_source"] == "--kappa"
    else:
        assert "no measured B_noise" in case["forgetting_note"]
    for r in case["rules"]:
        assert 1 <= r["rank"] <= r["designs"] == len(case["designs"]) and 0.0 <= r["p_best"] <= 1.0
        assert r["regret"] >= 0.0
        assert f"| {r['rule']} | {r['design']} |" in markdown
    assert case["wall_s"] > 0 and "--kappa 0.1" in case["command"]


def test_verdict_summary_reads_a_fixed_b_report_by_hand(repo_root):
    gpu_check = _load(repo_root)
    family = {"rank": 2, "designs": 7, "rank_ci": [1, 4], "probability_predicted_best": 0.32, "regret": 0.0024,
              "regret_ci": [0.0, 0.0149]}
    rival = {"design": "on-policy B/4", "difference": -0.0024, "se": 0.0077, "seeds_needed": 685}
    report = {"config": {"rollouts_per_step": 4096}, "budget": {"seeds": 16, "updates": 6, "batched": True},
              "mu": 5.28, "mu_measured": 1.5, "measured_best": {"name": "on-policy B/4"}, "seconds": 100.0,
              "designs": [{"name": "on-policy", "R": 4096, "N": 4096, "B": 4096, "steps": 6,
                           "final_reward_mean": 0.25, "final_reward_std": 0.01}],
              "predictions": [
                  {"rule": "noise-scale", "design": "replay y=2", "input": {"b_noise": 2383.0,
                                                                            "b_noise_interval": [1764.0, 3250.0]},
                   "pick": {"regime": "replay", "b": 0.58, "threshold_b": 0.753}, "verdict": {"family": family},
                   "separation": rival, "criterion": {"within_one_se": True}},
                  {"rule": "paper", "design": "predicted", "input": {"regime": "replay"}, "verdict": None,
                   "separation": None}],
              "forgetting_input": {"kappa": None, "reason": "no kappa: profile.json has no memory record"}}
    out = gpu_check.verdict_summary(report)
    assert (out["batch_size"], out["seeds"], out["b_noise"], out["measured_best"]) == (
        4096, 16, 2383.0, "on-policy B/4")
    row = {"name": "on-policy", "rollouts_per_step": 4096, "capacity": 4096, "batch_size": 4096, "steps": 6,
           "reward_mean": 0.25, "reward_sd": 0.01}
    assert out["designs"] == [row]  # a row saved before the design kept DesignConfig's names: N, B, R
    renamed = {"name": "on-policy", "rollouts_per_step": 4096, "capacity": 4096, "batch_size": 4096, "steps": 6,
               "final_reward_mean": 0.25, "final_reward_std": 0.01}
    assert gpu_check.verdict_summary({**report, "designs": [renamed]})["designs"] == [row]
    noise, paper = out["rules"]
    assert (noise["regime"], noise["b"], noise["rank"], noise["p_best"], noise["seeds_for_2se"]) == (
        "replay", 0.58, 2, 0.32, 685)
    assert noise["first_or_within_one_se"] is True and paper["regime"] == "replay" and paper["rank"] is None
    assert out["forgetting_note"].startswith("no kappa")


def test_kappa_option_is_checked_before_any_work(tmp_path, repo_root):
    out = tmp_path / "never"
    for value in ("0", "-1", "nan", "inf"):
        done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--kappa", value],
                              capture_output=True, text=True, cwd=repo_root, timeout=120)
        assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
        assert done.stderr.startswith("gpu_check: error: --kappa must be a finite number > 0")
        assert not out.exists()


def test_gpu_plan_fits_one_device_command(repo_root):
    """The blind run's budget: the deadline under the device machine's 10 minutes per command; every section of the
    run order has a cap and a minimum start; section 7 runs the preset and then its 4x batch."""
    gpu_check = _load(repo_root)
    plan = gpu_check.make_plan(gpu_check.CheckConfig(out=Path("x")))
    assert gpu_check.CheckConfig.deadline_s <= 580 and set(plan.budgets) == set(gpu_check.SECTIONS)
    assert set(plan.min_start) == set(gpu_check.SECTIONS) - {"environment"}
    assert plan.verdict_args[:2] == ("--preset", "gpu-fixed-b")
    assert plan.verdict_large_args == ("--rollouts-per-step", "16384", "--budget-updates", "3")
    assert plan.validate_args == ("--no-progress",)  # validate all with its defaults: the 2-minute target
    assert plan.kappa is None and plan.compile_backend == "inductor"

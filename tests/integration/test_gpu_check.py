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
    """One smoke run (about a minute on 2 cores): (result JSON, markdown file text, stdout). It trains the tiny
    model, so it needs the validate extra (torch, transformers); the README's `pip install -e ".[test]"` skips it."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    base = tmp_path_factory.mktemp("gpu_check")
    (base / "path").mkdir()
    (base / "path" / "replay_theory").symlink_to(repo_root, target_is_directory=True)
    out = base / "out"
    env = {**os.environ, "PYTHONPATH": str(base / "path")}
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out), "--threads", "1"],
                          capture_output=True, text=True, env=env, cwd=repo_root, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text(), done.stdout


@pytest.mark.slow
def test_every_section_ok_or_skipped_with_a_reason(smoke):
    data, _, _ = smoke
    assert list(data["sections"]) == ["environment", "validate_all", "batched_verify", "mu", "logprob_mismatch",
                                      "decode"]  # the run order: the compile section last
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
    loop = decode["project loop, CPU generator (as validate runs it)"]
    assert loop["speedup_vs_project_loop"] == 1.0 and loop["tokens_per_s"] == pytest.approx(8 * 8 / loop["seconds"])
    compiled = next(c for name, c in decode.items() if "torch.compile" in name)
    assert compiled["status"] == "ok" and compiled["compiled"] is True
    assert compiled["compile_s"] == pytest.approx(compiled["first_call_s"] - compiled["seconds"])
    assert decode["project loop, CUDA generator"]["status"].startswith("skipped: CPU run")
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
                         (["--rollouts", "12"], "--rollouts"), (["--sections", "mu,nope"], "--sections")):
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

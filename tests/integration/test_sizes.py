"""Every size option bounded before any work (issue 37, core/memory.py): huge, zero or negative, overflowing and
physically implausible sizes of simulate, sweep, calibrate-simulator, experiment theory-test, trl-replay, validate and
diagnose are one line naming the option and its valid range, exit 2, nothing written; a refusal costs a child process
well under 2 GB; and the simulator's estimate is measured against a real run.

(calibrate --from-log has no size option; validate predict trains nothing, so it has none of its own.)
"""

import json
import os
import subprocess
import sys
import tempfile
import tracemalloc
from dataclasses import asdict
from pathlib import Path

import pytest

from replay_theory.core.memory import MAX_SIZE, memory_limit
from replay_theory.simulate.config import SimConfig, peak_bytes

RSS_LIMIT = 2 * 2**30  # what a refusal may cost a child process, bytes
HUGE = 10**9  # the user's --batch-size of issue 37
BEYOND = 2**63  # overflows int64
PREFIX = "replay-theory: error: "


def _child(args: list[str], cwd: Path) -> tuple[int, str, str, int]:
    """`replay-theory ARGS` in a child process: (exit code, stdout, stderr, the child's peak RSS in bytes)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", "replay_theory", *args], stdout=out, stderr=err, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (RUSAGE_CHILDREN mixes in earlier ones)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        rss = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB on Linux
        return proc.returncode, out.read().decode(), err.read().decode(), rss


def _one_line(code: int, out: str, err: str) -> str:
    assert code == 2 and out == "", (code, out, err)
    assert err.count("\n") == 1 and err.startswith(PREFIX) and "Traceback" not in err, err
    return err[len(PREFIX):-1]


def _needs_more_than_this_machine(message: str) -> None:
    assert "needs about" in message and "more than the" in message and "of memory this machine has" in message


@pytest.fixture
def log_file(tmp_path) -> Path:
    """A three-token diagnose log (the default columns)."""
    path = tmp_path / "log.csv"
    path.write_text("seq_id,logp_behav,logp_current,age,advantage\n0,-1.0,-1.1,0,0.5\n0,-0.5,-0.4,0,0.5\n"
                    "1,-2.0,-2.0,1,-0.5\n")
    return path


@pytest.fixture
def verify_dir(tmp_path) -> Path:
    """What verify needs to start: a calibration's summary and a prediction (their contents are read later)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "calibration_summary.json").write_text(json.dumps({"config": {}}))
    (run / "predicted.json").write_text("{}")
    return run


# --- huge: refused in a child process, which stays small; the one line names the option, the need and the range


HUGE_CASES = {  # command: (its arguments, OUT standing for the output path, the option the line names)
    "simulate": (["simulate", "--batch-size", str(HUGE), "--out", "OUT"], "--batch-size"),
    "sweep": (["sweep", "SPEC", "--out", "OUT"], "batch_size"),
    "calibrate-simulator": (["calibrate-simulator", "--samples", str(HUGE), "--out", "OUT.json"], "--samples"),
    "theory-test": (["experiment", "theory-test", "--seeds", str(HUGE), "--out", "OUT"], "--seeds"),
    "trl-replay": (["trl-replay", "--capacity", "256", "--batch-size", str(HUGE), "--rollouts-per-step", "64",
                    "--out", "OUT", "--cache-dir", "OUT-cache"], "--batch-size"),
    "validate calibrate-model": (["validate", "calibrate-model", "--samples", str(HUGE), "--out", "OUT"], "--samples"),
    "validate all": (["validate", "all", "--rollouts-per-step", str(HUGE), "--out", "OUT"], "--rollouts-per-step"),
    "validate verify": (["validate", "verify", "--jobs", str(HUGE), "--out", "RUN"], "--jobs"),
    "diagnose": (["diagnose", "LOG", "--chunk-rows", str(HUGE), "--save", "OUT"], "--chunk-rows"),
}


@pytest.mark.parametrize("command", list(HUGE_CASES))
def test_huge_sizes_are_refused_in_one_line_before_any_work_by_a_small_process(tmp_path, log_file, verify_dir,
                                                                                command):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"base": {"batch_size": HUGE}, "configs": [{}]}))
    out, before = tmp_path / "out", sorted(p.name for p in verify_dir.iterdir())
    paths = {"OUT": str(out), "RUN": str(verify_dir), "LOG": str(log_file), "SPEC": str(spec)}
    template, option = HUGE_CASES[command]
    args = [paths.get(a, a.replace("OUT", str(out))) for a in template]
    code, stdout, stderr, rss = _child(args, tmp_path)
    line = _one_line(code, stdout, stderr)
    assert line.startswith(f"{option} {HUGE} needs about "), line
    _needs_more_than_this_machine(line)
    assert " valid: an integer in [" in line and line.endswith("] with the other options as given"), line
    assert rss < RSS_LIMIT, rss  # measured 55-120 MB: the check runs before torch, the engine or any array
    assert not any(Path(f"{out}{end}").exists() for end in ("", ".json", "-cache"))  # no output, no cache
    assert sorted(p.name for p in verify_dir.iterdir()) == before  # nothing written into verify's run either


def test_the_issue_s_simulate_line_names_the_arrays_and_the_largest_batch_that_fits(error_line):
    line = error_line("simulate", "--batch-size", str(HUGE))
    need = peak_bytes({**asdict(SimConfig()), "batch_size": HUGE}).total
    assert need > memory_limit()  # 8 seeds x 1e9 responses: terabytes on any machine
    largest = int(line.split("valid: an integer in [1, ")[1].split("]")[0])
    assert peak_bytes({**asdict(SimConfig()), "batch_size": largest}).total <= memory_limit()
    assert peak_bytes({**asdict(SimConfig()), "batch_size": largest + 1}).total > memory_limit()
    assert "(mostly the step's responses: seeds x max(B, fresh) x (per response + per token) = 8 x 1000000000 x 1 " \
           "token(s))" in line


# --- overflowing, zero and negative: the ceiling and the options' own ranges, in-process


@pytest.mark.parametrize("args, line", [
    (["simulate", "--batch-size", str(BEYOND)], f"--batch-size must be an integer in [1, {MAX_SIZE}], got {BEYOND}"),
    (["simulate", "--steps", str(MAX_SIZE + 1)], f"--steps must be an integer in [1, {MAX_SIZE}], got {MAX_SIZE + 1}"),
    (["simulate", "--seeds", "0"], "--seeds must be an integer >= 1, got 0"),
    (["simulate", "--capacity", "-1"], "--capacity must be an integer >= 1, got -1"),
    (["simulate", "--seed", "-1"], "--seed must be an integer >= 0, got -1"),
    (["calibrate-simulator", "--out", "p.json", "--reference-samples", str(BEYOND)],
     f"--reference-samples must be an integer in [1, {MAX_SIZE}], got {BEYOND}"),
    (["experiment", "theory-test", "--out", "o", "--seeds", str(BEYOND)],
     f"--seeds must be an integer in [2, {MAX_SIZE}], got {BEYOND}"),
    (["experiment", "theory-test", "--out", "o", "--floor", str(BEYOND)],
     f"--floor must be a comma-separated list of distinct integers in [0, {MAX_SIZE}], got {BEYOND}"),
    (["trl-replay", "--out", "o", "--capacity", "256", "--batch-size", str(BEYOND), "--rollouts-per-step", "64"],
     f"--batch-size must be an integer in [1, {MAX_SIZE}], got {BEYOND}"),
    (["trl-replay", "--out", "o", "--capacity", "256", "--batch-size", "64", "--rollouts-per-step", "64",
      "--seed", str(BEYOND)], f"--seed must be an integer in [0, {MAX_SIZE}], got {BEYOND}"),
    (["trl-replay", "--out", "o", "--capacity", "256", "--batch-size", "0", "--rollouts-per-step", "64"],
     "--batch-size must be an integer >= 1, got 0"),
    (["validate", "calibrate-model", "--out", "o", "--max-new-tokens", str(BEYOND)],
     f"--max-new-tokens must be an integer in [1, {MAX_SIZE}], got {BEYOND}"),
    (["validate", "all", "--out", "o", "--seeds", str(BEYOND)],
     f"--seeds must be an integer in [1, {MAX_SIZE}], got {BEYOND}"),
    (["validate", "calibrate-model", "--out", "o", "--samples", "-8"], "--samples must be an integer >= 16, got -8"),
    (["diagnose", "log.csv", "--m2po-batch-tokens", str(BEYOND)],
     f"--m2po-batch-tokens must be an integer in [1, {MAX_SIZE}], got {BEYOND}"),
    (["diagnose", "log.csv", "--chunk-rows", "0"], "--chunk-rows must be an integer >= 1, got 0"),
])
def test_overflowing_zero_and_negative_sizes_name_the_option_and_its_range(error_line, tmp_path, monkeypatch, args,
                                                                           line):
    monkeypatch.chdir(tmp_path)
    assert error_line(*args) == line
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["simulate"], ["calibrate-simulator", "--out", "p.json"],
                                     ["experiment", "theory-test", "--out", "o"],
                                     ["validate", "calibrate-model", "--out", "o"], ["diagnose", "log.csv"]])
def test_a_size_typed_as_1e30_is_refused_by_the_parser_with_the_ceiling(error_line, tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    option = {"simulate": "--batch-size", "calibrate-simulator": "--noise-groups", "experiment": "--seeds",
              "validate": "--samples", "diagnose": "--chunk-rows"}[command[0]]
    line = error_line(*command, option, "1e30")
    assert line.startswith(f"Invalid value for '{option}'") and "valid integer" in line
    assert line.endswith(")") and "(valid: an integer" in line
    assert sorted(tmp_path.iterdir()) == []


def test_a_sweep_spec_s_1e30_and_its_grid_product_are_refused(error_line, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"base": {"batch_size": 1e30}, "configs": [{}]}))
    assert error_line("sweep", str(spec), "--out", str(tmp_path / "o")) == (
        f"batch_size must be an integer in [1, {MAX_SIZE}], got {int(1e30)}")
    values = list(range(2000))
    spec.write_text(json.dumps({"grid": {"seed": values, "instance_seed": values, "steps": values[1:]}}))
    line = error_line("sweep", str(spec), "--out", str(tmp_path / "o"))
    assert line.startswith("sweep spec lists 7996000000 configurations (grid product 7996000000 + configs 0), which "
                           "need about ") and "; valid: at most " in line
    assert not (tmp_path / "o").exists()


# --- physically implausible: each size moderate, together beyond the machine; thread counts beyond its CPUs


def test_sizes_moderate_alone_but_too_large_together_name_the_least_usual(error_line):
    seeds = batch = 10**6  # 10^12 responses of the bandit
    line = error_line("simulate", "--seeds", str(seeds), "--batch-size", str(batch), "--rollouts-per-step", "64")
    _needs_more_than_this_machine(line)
    assert line.startswith(("--seeds 1000000 needs about", "--batch-size 1000000 needs about")), line


def test_async_workers_beyond_any_machine_are_bounded_by_the_estimate(error_line):
    line = error_line("simulate", "--pipeline", "async", "--workers", "1e300")
    assert line.startswith("--workers 1e+300 needs about ") and " valid: a number in (0, " in line


@pytest.mark.parametrize("args", [["trl-replay", "--out", "o", "--capacity", "256", "--batch-size", "64",
                                   "--rollouts-per-step", "64"], ["validate", "calibrate-model", "--out", "o"]])
def test_more_threads_than_cpus_are_refused(error_line, tmp_path, monkeypatch, args):
    from replay_theory.core.memory import usable_cpus

    monkeypatch.chdir(tmp_path)
    line = error_line(*args, "--threads", str(usable_cpus() + 1))
    assert line == (f"--threads must be an integer in [1, {usable_cpus()}] (the CPUs this process may use), got "
                    f"{usable_cpus() + 1}")


def test_trl_replay_names_the_design_file_when_it_gives_the_sizes(error_line, tmp_path):
    design = tmp_path / "design.json"
    design.write_text(json.dumps({"capacity": 1024, "batch_size": HUGE, "rollouts_per_step": 512}))
    line = error_line("trl-replay", "--design", str(design), "--out", str(tmp_path / "o"))
    assert line.startswith(f"--batch-size {HUGE} needs about ") and line.endswith(f"(N, B, R from --design {design})")


# --- the estimate against a real run


def test_the_simulator_estimate_is_within_a_factor_of_two_of_a_measured_run():
    from replay_theory.simulate.engine import run

    config = SimConfig(seeds=8, batch_size=50_000, steps=3).validated()
    estimate = peak_bytes(asdict(config)).total
    tracemalloc.start()
    try:
        run(config)
        peak = tracemalloc.get_traced_memory()[1]  # numpy reports its arrays to tracemalloc
    finally:
        tracemalloc.stop()
    assert 0.5 < estimate / peak < 2, (estimate, peak)  # measured 1.3 (122 MiB estimated, 93 MiB traced)

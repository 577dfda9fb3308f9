"""Same command and seed, same numbers: a short calibration at 1 and at 2 threads (torch and numpy's BLAS), in
separate processes.

Issue 13: three identical `validate calibrate` runs gave three sets of numbers. Everything a calibration
writes must be equal bit for bit across processes and thread counts, except the wall-clock timings
(mu_timing: generation / update seconds; mu_count: App. E counts in a wall-clock window, skipped here).
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

TIMINGS = {"mu_timing", "mu_count", "count_window"}
# R = 32 (four groups of 8): every measurement a calibration makes (kappa's B/2 micro-batches two whole groups), on
# half the default R's rollouts
ARGS = ["--sft-steps", "10", "--probe-steps", "10", "--samples", "16", "--n-train", "100", "--n-test", "16",
        "--rollouts-per-step", "32", "--mu-window-seconds", "0", "--no-progress"]


def _calibrate(out, threads: int) -> dict:
    # numpy's BLAS threads too (OMP_NUM_THREADS): a threaded dot sums in an order set by the thread count
    env = {**{k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
           "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, "-c", "import sys; from replay_theory.cli.app import main; main(sys.argv[1:])",
               "validate", "calibrate-model", "--out", str(out), *ARGS, "--threads", str(threads)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    calibration = json.loads((out / "calibration.json").read_text())
    profile = json.loads((out / "profile.json").read_text())
    assert f"'threads': {threads}" in profile.pop("source")  # the command is recorded, with its thread count
    return {"calibration": {k: v for k, v in calibration.items() if k not in TIMINGS}, "profile": profile,
            "warm_start": json.loads((out / "calibration_summary.json").read_text())["warm_start"],
            "weights": (out / "warm_start" / "model.safetensors").read_bytes()}


@pytest.mark.slow
def test_calibration_is_identical_across_processes_and_thread_counts(tmp_path):
    one = _calibrate(tmp_path / "one", threads=1)
    two = _calibrate(tmp_path / "two", threads=2)
    assert one["weights"] == two["weights"]  # the SFT warm start, bit for bit
    assert one["warm_start"] == two["warm_start"]
    assert one["calibration"] == two["calibration"]  # sigma^2(s), rho, KL by lag, probe metrics, fits
    assert json.dumps(one["profile"], sort_keys=True) == json.dumps(two["profile"], sort_keys=True)
    # and the numbers are real measurements, not empty tables
    assert len(one["calibration"]["sigma_sq"]) == 5 and len(one["calibration"]["probe_metrics"]) == 10
    assert one["profile"]["memory"]["kappa"] > 0  # kappa's curvature pairs measured too, bit for bit

"""`replay-theory simulate | sweep | calibrate-simulator`: JSON values, resume without repeats, one-line errors.

Fast tier; the slower tests of this module (a calibrate run) are in tests/integration/test_simulate_cli_calibrate.py.
"""

import json

import numpy as np
import pytest

from replay_theory.simulate.sweep import expand_spec, load_runs, run_sweep

SMALL = ["--seeds", "2", "--steps", "40", "--eval-every", "20", "--measure-drift", "false", "--num-prompts", "16"]


def test_simulate_json_fifo_formulas(cli):
    code, out, _ = cli("simulate", "--buffer", "fifo", "--capacity", "128", "--rollouts-per-step", "32",
                           "--batch", "64", "--steps", "60", "--seed", "3", "--json", "--no-progress", *SMALL[:2],
                           "--eval-every", "20", "--measure-drift", "false", "--num-prompts", "16")
    payload = json.loads(out)
    assert code == 0
    for key in ("mean_staleness", "max_staleness", "replay_ratio", "mean_time_since_last_use", "compute_ratio",
                "final_reward", "ess_frac"):
        assert key in payload
    assert payload["replay_ratio"] == 2.0 and payload["max_staleness"] == 3
    assert payload["mean_staleness"] == pytest.approx(1.5, abs=0.1)
    assert payload["config"]["seed"] == 3 and payload["config"]["batch_size"] == 64


@pytest.mark.parametrize("args,needle", [
    (["--buffer", "lifo"], "buffer must be one of"),
    (["--capacity", "8"], "capacity must be >= rollouts_per_step"),
    (["--mu", "nan"], "mu must be a finite number > 0"),
    (["--capcity", "8"], "No such option: --capcity (Possible options: --capacity)"),
])
def test_simulate_bad_input_one_line(cli, args, needle):
    code, out, err = cli("simulate", *args, "--json")
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err


def test_sweep_resumes_without_repeating_and_refuses_other_specs(tmp_path, cli):
    spec = {"name": "t", "base": {"seeds": 2, "steps": 30, "eval_every": 15, "measure_drift": False,
                                  "num_prompts": 16},
            "grid": {"capacity": [64, 128]}, "configs": [{"buffer": "on-policy"}]}
    configs = expand_spec(spec)
    assert len(configs) == 3
    out = tmp_path / "sweep"
    # simulate an interruption: only the first configuration finished
    run_sweep({**spec, "grid": {"capacity": [64]}, "configs": []}, tmp_path / "partial", n_jobs=1, show_progress=False)
    first = load_runs(tmp_path / "partial")[0]
    (out / "runs").mkdir(parents=True)
    stored = json.loads((tmp_path / "partial" / "spec.json").read_text())  # carries the code version
    stored.update(grid=spec["grid"], configs=spec["configs"])
    (out / "spec.json").write_text(json.dumps(stored))
    for suffix in (".json", ".npz"):
        (out / "runs" / f"{first['key']}{suffix}").write_bytes(
            (tmp_path / "partial" / "runs" / f"{first['key']}{suffix}").read_bytes())
    marker = (out / "runs" / f"{first['key']}.json").stat().st_mtime_ns
    (out / "runs" / "deadbeef.tmp.npz").write_bytes(b"half-written")
    table = run_sweep(spec, out, n_jobs=1, show_progress=False)
    assert (out / "runs" / f"{first['key']}.json").stat().st_mtime_ns == marker  # not rerun, not overwritten
    assert not (out / "runs" / "deadbeef.tmp.npz").exists()
    runs = load_runs(out)
    assert sorted(r["key"] for r in runs) == sorted(c.key() for c in configs)
    rows = table.read_text().strip().splitlines()
    assert len(rows) == 1 + 3 * 2  # header + (config, seed) rows
    curves = np.load(out / "runs" / f"{first['key']}.npz")
    assert curves["curve__compute"].shape == (2, 30)
    with pytest.raises(ValueError, match="different sweep spec"):
        run_sweep({**spec, "grid": {"capacity": [256]}}, out, n_jobs=1, show_progress=False)


def test_sweep_spec_typo_stops_before_work(tmp_path, cli):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"base": {"capcity": 4}, "configs": [{}]}))
    code, out, err = cli("sweep", str(spec), "--out", str(tmp_path / "o"), "--no-progress")
    assert code == 2 and "unknown config field 'capcity'" in err and not (tmp_path / "o").exists()
    spec.write_text(json.dumps({"bsae": {}}))
    code, out, err = cli("sweep", str(spec), "--out", str(tmp_path / "o"), "--no-progress")
    assert code == 2 and "unknown sweep spec key(s): bsae" in err

"""Every ``next:`` hint runs as printed on the path that prints it (issue 37): the command a calibrating run prints
after writing its profile is run as it stands, and answers with what to do, in the run's batch and prompt groups.
(validate calibrate-model's hint is run in tests/integration/test_validate_loop.py, beside its tiny calibration.)"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

PREFIX = "next: replay-theory "


def run_hint(cli, out: str, expect_groups: int | None = None) -> str:
    """Run the last ``next:`` line of ``out`` as printed (what follows it in parentheses is a remark); its output."""
    hints = [line for line in out.splitlines() if line.startswith(PREFIX)]
    assert hints, out
    command = shlex.split(hints[-1][len(PREFIX):].split("   (")[0])
    code, answer, err = cli(*command)
    assert code == 0, (hints[-1], err)
    assert answer.splitlines()[0].startswith("what to do: ")
    if expect_groups is not None:
        assert f"whole groups of {expect_groups}" in answer and "--group-size" in hints[-1]
    return answer


def test_calibrate_from_log_hint_keeps_the_runs_groups(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    subprocess.run([sys.executable, "-m", "replay_theory.experiments.example_log", "diagnose.jsonl", "--shape", "verl"],
                   check=True, capture_output=True)
    # two steps of two-batch gradient norms in groups of 8 (as the TRL trainer writes them) with a curvature pair each
    rows = [{"step": s, "grad_sq_small": small, "grad_sq_big": big, "batch_small": 128, "batch_big": 256,
             "unit_size": 8, "curvature_num": num, "curvature_den": 1.0, "curvature_lr": 1e-4, "curvature_beta1": 0.9}
            for s, small, big, num in ((1, 9.0, 5.0, 1500), (2, 8.0, 4.5, 500))]
    (tmp_path / "noise.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = cli("calibrate", "--from-log", "diagnose.jsonl", "--preset", "verl", "--mu", "5.28",
                         "--grad-norms", "noise.jsonl", "--out", "profile.json")
    assert code == 0, err
    assert "next: replay-theory optimal --profile profile.json --mu 5.28 -B 256 --group-size 8" in out
    run_hint(cli, out, expect_groups=8)


def test_calibrate_simulator_hint_names_mu_batch_and_groups(cli, tmp_path, monkeypatch):
    """The simulator's profile carries no mu: its hint gives the simulation's own --mu, so it runs as printed."""
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("calibrate-simulator", "--out", "profile.json", "--steps", "30", "--seeds", "2",
                         "--checkpoints", "2", "--samples", "64", "--staleness", "0,1,2,4", "--max-gap", "4",
                         "--noise-checkpoints", "2", "--noise-groups", "8")
    assert code == 0, err
    assert out.splitlines()[-1] == "next: replay-theory optimal --profile profile.json --mu 5.28 -B 64 --group-size 8"
    answer = run_hint(cli, out, expect_groups=8)
    assert "kappa = " in answer and "--profile profile.json" in answer  # b and kappa both read from the profile

"""Issue 32: Ctrl-C in a long command is one line on stderr saying what is kept and how to go on, exit code 130 (the
shell's for SIGINT), no traceback and nothing on stdout. The work each command does is replaced by a function that
raises KeyboardInterrupt where the user's Ctrl-C would land; trl-replay's own interruption (a real run, checkpoint
and resume) is tested in tests/integration/test_trl_run_cli.py.
"""

from __future__ import annotations

import pytest

from replay_theory.experiments.example_log import write_example


def _ctrl_c(*args, **kwargs):
    raise KeyboardInterrupt


def _interrupted(cli, *args) -> str:
    code, out, err = cli(*args)
    assert (code, out) == (130, ""), (code, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err
    return err.rstrip("\n")


def test_simulate_without_out(cli, monkeypatch):
    import replay_theory.cli.simulate_cmds as simulate_cmds

    monkeypatch.setattr(simulate_cmds, "run", _ctrl_c)
    assert _interrupted(cli, "simulate", "--steps", "20", "--no-progress") == (
        "interrupted: simulate without --out keeps nothing; run the same command to start again (with --out DIR the "
        "run is saved, and the same command reuses it)")


def test_calibrate_simulator(cli, monkeypatch, tmp_path):
    import replay_theory.cli.simulate_cmds as simulate_cmds

    monkeypatch.setattr(simulate_cmds, "measure_profile", _ctrl_c)
    out = tmp_path / "p.json"
    assert _interrupted(cli, "calibrate-simulator", "--out", str(out)) == (
        f"interrupted during the probe: nothing was written (--out {out} is written when it ends); run the same "
        "command to start again")
    assert list(tmp_path.iterdir()) == []


def test_diagnose_and_calibrate(cli, monkeypatch, tmp_path):
    import replay_theory.cli.diagnose_cmds as diagnose_cmds
    import replay_theory.diagnose.calibrate_log as calibrate_log

    log = tmp_path / "log.parquet"
    write_example(log)
    monkeypatch.setattr(diagnose_cmds, "_run", _ctrl_c)
    assert _interrupted(cli, "diagnose", str(log), "--save", str(tmp_path / "r.json"), "--no-progress") == (
        "interrupted: diagnose writes --save and --figure only after its pass over the log, so nothing was written; "
        "run the same command to start again")
    monkeypatch.setattr(calibrate_log, "plan", _ctrl_c)
    out = tmp_path / "p.json"
    assert _interrupted(cli, "calibrate", "--from-log", str(log), "--mu", "5", "--out", str(out)) == (
        f"interrupted: calibrate writes --out {out} only after its passes over the log, so nothing was written; run "
        "the same command to start again")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.parquet"]


def test_figures(cli, monkeypatch, tmp_path):
    import replay_theory.figures.style as style

    monkeypatch.setattr(style, "render", _ctrl_c)
    out = tmp_path / "figs"
    assert _interrupted(cli, "figures", "gamma-table", "--out", str(out)) == (
        f"interrupted: the figures are written together once all are drawn, so nothing was written to {out}; run "
        "the same command to start again")
    assert not out.exists()


@pytest.mark.parametrize("command", [["validate", "calibrate-model"], ["validate", "all"]])
def test_validate(cli, monkeypatch, tmp_path, command):
    import replay_theory.cli.validate_cmds as validate_cmds

    class Loop:  # validate/loop.py's entry points, interrupted in the first step
        run_calibrate = run_predict = run_verify = staticmethod(_ctrl_c)

    monkeypatch.setattr(validate_cmds, "_loop", lambda: Loop)
    out = tmp_path / "run"
    assert _interrupted(cli, *command, "--out", str(out), "--no-progress") == (
        f"interrupted: what finished is kept in {out} (the warm start, calibration.json, predicted.json, verify's "
        "runs and their checkpoints every 5 steps); run the same command to continue from there")

"""The command line as a new user met it (issue 25): a missing --results folder, Ctrl-C during a sweep, help at 80
columns with flags shown as flags. Each test asserts the exact new message and what is (not) written."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from replay_theory.cli.app import app
from replay_theory.simulate import sweep as sweep_module
from replay_theory.simulate.store import RunStore

SPEC = {"name": "t", "base": {"seeds": 1, "steps": 30, "eval_every": 15, "measure_drift": False, "num_prompts": 16},
        "grid": {"capacity": [64, 96, 128, 160]}, "configs": []}


def test_figures_with_a_missing_results_folder_is_one_line_and_writes_nothing(tmp_path, error_line):
    out = tmp_path / "figs"
    missing = tmp_path / "missing_folder"
    assert error_line("figures", "all", "--results", str(missing), "--out", str(out)) == (
        f"--results {missing}: no such folder; give the folder `replay-theory experiment` or `replay-theory "
        "validate all` wrote into (RESULTS/<experiment>/, RESULTS/validation/)")
    (tmp_path / "afile").write_text("x")
    assert error_line("figures", "all", "--results", str(tmp_path / "afile"), "--out", str(out)) == (
        f"--results {tmp_path / 'afile'} is a file; give the results folder")
    assert not out.exists()


def test_figures_without_results_still_builds_the_theory_figures(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no results/ here: the default may be absent, only a named folder must exist
    code, out, err = cli("figures", "gamma-table", "--out", "o")
    assert (code, err, out) == (0, "", os.path.join("o", "gamma-table.png") + "\n")


def _interrupt_at(monkeypatch, call: int) -> None:
    """Ctrl-C as the sweep is about to save its ``call``-th configuration (1-based)."""
    real, calls = sweep_module.write_run, []

    def write_run(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep_module, "write_run", write_run)


def test_ctrl_c_during_a_sweep_says_what_is_saved_and_the_same_command_resumes(cli, tmp_path, monkeypatch):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    out = tmp_path / "sweep"
    args = ("sweep", str(spec), "--out", str(out), "--jobs", "1", "--backend", "threading")
    _interrupt_at(monkeypatch, 3)
    code, stdout, err = cli(*args, "--no-progress")
    assert (code, stdout) == (130, "")  # 128 + SIGINT, as a shell reports Ctrl-C
    assert err == (f"interrupted: 2 of 4 configurations are saved in {out / 'runs'} (2 finished now, 0 reused from "
                   "before); run the same command to resume: it runs only the other 2\n")
    assert len(list((out / "runs").glob("*.json"))) == 2 and not (out / "results.csv").exists()
    _interrupt_at(monkeypatch, 2)
    code, stdout, err = cli(*args, "--no-progress")
    assert (code, stdout) == (130, "")
    assert err == (f"interrupted: 3 of 4 configurations are saved in {out / 'runs'} (1 finished now, 2 reused from "
                   "before); run the same command to resume: it runs only the other 1\n")
    monkeypatch.undo()
    code, stdout, err = cli(*args)  # with progress: stderr is no terminal here, so its plain last line
    assert code == 0 and stdout.startswith(f"results: {out / 'results.csv'}")
    assert re.fullmatch(r"configurations \(3 reused\): 4/4 \(100%\), elapsed 0:00:\d\d, ETA 0:00:00\n", err)
    assert len(list((out / "runs").glob("*.json"))) == 4


def test_ctrl_c_right_after_a_run_is_saved_counts_it(cli, tmp_path, monkeypatch):
    # the race a real SIGINT hit in CI: the run file is on disk, the loop has not yet counted it
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    out = tmp_path / "sweep"
    real = sweep_module.write_run

    def write_then_interrupt(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_module, "write_run", write_then_interrupt)
    code, stdout, err = cli("sweep", str(spec), "--out", str(out), "--jobs", "1", "--backend", "threading",
                            "--no-progress")
    assert (code, stdout) == (130, "")
    assert len(list((out / "runs").glob("*.json"))) == 1
    assert err == (f"interrupted: 1 of 4 configurations are saved in {out / 'runs'} (1 finished now, 0 reused from "
                   "before); run the same command to resume: it runs only the other 3\n")


def test_ctrl_c_before_any_configuration_finished_keeps_nothing(cli, tmp_path, monkeypatch):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    _interrupt_at(monkeypatch, 1)
    code, stdout, err = cli("sweep", str(spec), "--out", str(tmp_path / "new" / "sweep"), "--jobs", "1",
                            "--backend", "threading", "--no-progress")
    assert (code, stdout) == (130, "")
    assert err == (f"interrupted: none of the 4 configurations had finished, so nothing was kept in "
                   f"{tmp_path / 'new' / 'sweep'}; run the same command to start again\n")
    assert not (tmp_path / "new").exists()  # the folders this run created are gone again


def test_a_real_sigint_during_a_sweep(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**SPEC, "base": {**SPEC["base"], "steps": 2000},
                                "grid": {"capacity": [64, 96, 128, 160, 192, 224, 256, 288]}}))
    out = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-c", "from replay_theory.cli.app import main; main()", "sweep",
                             str(spec), "--out", str(out), "--jobs", "1", "--backend", "threading", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # a shell's background job (CI run with `&`) starts with SIGINT ignored, and Python keeps
                            # an ignored SIGINT ignored: give the child the default, as a terminal's process has
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    # a saved run, not the hidden temporary (.KEY.PID-HEX.json, which pathlib's glob also matches) that a write in
    # progress holds: a SIGINT then removes the temporary and saves nothing
    while not RunStore(out).files():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    saved = len(RunStore(out).files())
    assert proc.returncode == 130 and stdout == "" and 1 <= saved < 8
    assert stderr.splitlines()[-1] == (
        f"interrupted: {saved} of 8 configurations are saved in {out / 'runs'} ({saved} finished now, 0 reused from "
        f"before); run the same command to resume: it runs only the other {8 - saved}")


def _commands(group, prefix=()):
    for name, command in sorted(getattr(group, "commands", {}).items()):
        yield (*prefix, name), command
        yield from _commands(command, (*prefix, name))


def test_help_uses_the_width_of_an_80_column_terminal_and_shows_flags_as_flags(cli, monkeypatch):
    import typer

    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = cli("optimal", "--help")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert max(map(len, lines)) <= 80
    # click's layout: the option and its metavar, then the text from column 33 on (47 columns of text, not 22;
    # the widest option, "-R, --rollouts-per-step <int>", sets the column)
    mu = next(line for line in lines if line.startswith("  --mu <float>"))
    assert mu.index("Rollout cost ratio") == 33 and len(mu) > 70  # the text fills the line beside the option
    assert re.search(r"^  --json {25}Print one JSON object", out, re.M)  # a flag: no <bool>, no value
    # every command: no flag shows a <bool> value it would refuse (`--json true` is an error)
    for path, _ in _commands(typer.main.get_command(app)):
        code, out, err = cli(*path, "--help")
        assert code == 0 and "<bool>" not in out and max(map(len, out.splitlines())) <= 80, path
    assert cli("optimal", "--mu", "5", "--json", "true")[2] == (
        "replay-theory: error: Got unexpected extra argument(s) (true)\n")


@pytest.mark.parametrize("flag", ["--json", "--no-progress"])
def test_flags_take_no_value_in_their_help_line(cli, monkeypatch, flag):
    monkeypatch.setenv("COLUMNS", "80")
    out = cli("diagnose", "--help")[1]
    line = next(line for line in out.splitlines() if line.strip().startswith(flag))
    assert line.split()[0] == flag and not line.split()[1].startswith("<")

"""Issue 11's bad-input / bad-output rows: each is one line naming the option, exit 2, checked before any
work, nothing half-written, and results are never overwritten.

Fast tier; the slower tests of this module (sweep runs and the validate extra's commands) are in
tests/integration/test_cli_bad_output_runs.py.
"""

import json
import stat

import pytest

from replay_theory import __version__
from replay_theory.experiments.paper_tables import write_table
from replay_theory.simulate import sweep as sweep_module
from replay_theory.simulate.config import SimConfig
from replay_theory.simulate.sweep import run_sweep

TINY = {"seeds": 2, "steps": 20, "eval_every": 10, "measure_drift": False, "num_prompts": 16}
SPEC = {"name": "t", "configs": [TINY]}  # conftest's spec_file writes it


@pytest.mark.parametrize("command", [
    ["simulate", "--steps", "20"],
    ["sweep", "SPEC"],
    ["experiment", "sanity"],
])
def test_out_is_an_existing_file_simulator(cli, tmp_path, spec_file, command, error_line):
    target = tmp_path / "afile"
    target.write_text("mine")
    args = [str(spec_file) if a == "SPEC" else a for a in command]
    message = error_line(*args, "--out", str(target))
    assert message == f"--out {target} is an existing file; give a directory (created if absent)"
    assert target.read_text() == "mine"


@pytest.mark.parametrize("command", [["validate", "calibrate-model"], ["validate", "predict"],
                                     ["validate", "verify"], ["validate", "all"]])
def test_out_is_an_existing_file_validate(cli, tmp_path, command, error_line):
    target = tmp_path / "afile"
    target.write_text("mine")
    assert error_line(*command, "--out", str(target)) == (
        f"--out {target} is an existing file; give a directory (created if absent)")


def test_out_below_a_file(cli, tmp_path, spec_file, error_line):
    (tmp_path / "afile").write_text("mine")
    target = tmp_path / "afile" / "sub"
    assert error_line("sweep", str(spec_file), "--out", str(target)) == (
        f"--out {target}: {tmp_path / 'afile'} is a file, not a folder")


def test_calibrate_simulator_checks_its_output_before_the_probe(cli, tmp_path, monkeypatch, error_line):
    import replay_theory.cli.simulate_cmds as simulate_cmds

    def probe_must_not_run(*args, **kwargs):
        raise AssertionError("the probe ran before the output path was checked")

    monkeypatch.setattr(simulate_cmds, "measure_profile", probe_must_not_run)
    target = tmp_path / "nodir" / "p.json"
    assert error_line("calibrate-simulator", "--out", str(target)) == (
        f"--out {target}: the folder {tmp_path / 'nodir'} does not exist; create it first or choose another path")
    existing = tmp_path / "p.json"
    existing.write_text("{}")
    assert error_line("calibrate-simulator", "--out", str(existing)) == (
        f"--out {existing} exists; results are never overwritten: choose a new path")
    assert not (tmp_path / "nodir").exists() and existing.read_text() == "{}"


def test_sweep_empty_spec_is_refused(cli, tmp_path, error_line):
    spec = tmp_path / "empty.json"
    spec.write_text("{}")
    message = error_line("sweep", str(spec), "--out", str(tmp_path / "o"))
    assert message.startswith("sweep spec has no configuration to run: it needs a non-empty 'grid'")
    assert "'configs'" in message and not (tmp_path / "o").exists()


@pytest.mark.parametrize("command,jobs", [(["sweep", "SPEC"], "0"), (["sweep", "SPEC"], "-2"),
                                          (["experiment", "sanity"], "-5")])
def test_jobs_range(cli, tmp_path, spec_file, command, jobs, error_line):
    args = [str(spec_file) if a == "SPEC" else a for a in command]
    assert error_line(*args, "--out", str(tmp_path / "o"), "--jobs", jobs) == (
        f"--jobs must be -1 (all cores) or an integer >= 1, got {jobs}")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("backend,package", [("dask", "distributed"), ("ray", "ray")])
def test_sweep_backend_checked_before_writing(cli, tmp_path, spec_file, backend, package, monkeypatch, error_line):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))
    message = error_line("sweep", str(spec_file), "--out", str(tmp_path / "o"), "--backend", backend)
    assert message.startswith(f"--backend {backend} needs the {package} package, which is not installed: pip install")
    assert not (tmp_path / "o").exists()


def test_sweep_refuses_a_non_empty_unrelated_directory(cli, tmp_path, spec_file, error_line):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert error_line("sweep", str(spec_file), "--out", str(mine)) == (
        f"--out {mine} is a non-empty directory that holds no sweep (no spec.json); results go into a new or "
        f"empty directory, so they never mix with other files")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_a_failing_sweep_leaves_no_directory_behind(tmp_path, monkeypatch):
    def crash(config):
        raise RuntimeError("engine crashed")

    monkeypatch.setattr(sweep_module, "run_config", crash)
    out = tmp_path / "new" / "deeper"
    with pytest.raises(RuntimeError, match="engine crashed"):
        run_sweep({"configs": [TINY]}, out, n_jobs=1, backend="threading", show_progress=False)
    assert list(tmp_path.iterdir()) == []  # new/, deeper/, runs/ and spec.json all removed
    empty = tmp_path / "empty"
    empty.mkdir()  # the user's own empty folder stays, empty
    with pytest.raises(RuntimeError):
        run_sweep({"configs": [TINY]}, empty, n_jobs=1, backend="threading", show_progress=False)
    assert empty.is_dir() and list(empty.iterdir()) == []


def test_simulate_json_is_strict_with_null_for_infinity(cli):
    code, out, _ = cli("simulate", *[f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()], "--json",
                       "--no-progress")
    assert code == 0 and "Infinity" not in out and "NaN" not in out

    def refuse(constant):
        raise AssertionError(f"non-strict JSON constant {constant}")

    payload = json.loads(out, parse_constant=refuse)
    assert payload["config"]["per_tau"] is None  # SimConfig's default per_tau = inf
    assert SimConfig().per_tau == float("inf")


def test_plain_command_prints_help_only(cli):
    code, out, err = cli()
    assert code == 2 and err == ""  # typer's no_args_is_help exit code, and no empty error line
    assert "Usage: replay-theory [OPTIONS] COMMAND [ARGS]..." in out and "calibrate-simulator" in out
    code, out, err = cli("validate")
    assert code == 2 and err == "" and "Usage: replay-theory validate [OPTIONS] COMMAND" in out
    assert "calibrate-model" in out


def test_version(cli):
    assert cli("--version") == (0, f"replay-theory {__version__}\n", "")


def test_simulate_lr_inf_one_line_no_numpy_warning(cli, error_line):
    message = error_line("simulate", "--lr", "inf", "--no-progress", "--steps", "20", "--seeds", "2")
    assert message == "--lr must be a finite number > 0, got inf"


def test_experiment_table_written_once(tmp_path, umask):
    path = write_table(tmp_path, "| a |\n|---|\n| 1 |")
    assert path.read_text() == "| a |\n|---|\n| 1 |\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    mtime = path.stat().st_mtime_ns
    assert write_table(tmp_path, "| a |\n|---|\n| 1 |") == path and path.stat().st_mtime_ns == mtime
    with pytest.raises(ValueError, match=r"table.md exists and holds a different table .* never overwritten"):
        write_table(tmp_path, "| a |\n|---|\n| 2 |")
    assert path.read_text() == "| a |\n|---|\n| 1 |\n"


def test_validate_steps_name_the_missing_step(cli, tmp_path, error_line):
    assert error_line("validate", "predict", "--out", str(tmp_path)) == (
        f"'{tmp_path}' has no calibration.json: run `replay-theory validate calibrate-model --out {tmp_path}` first")
    assert error_line("validate", "verify", "--out", str(tmp_path)) == (
        f"'{tmp_path}' has no predicted.json: run `replay-theory validate predict --out {tmp_path}` first")


def test_validate_rho_out_of_range_is_refused_before_any_work(cli, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = cli("validate", "all", "--out", str(out), "--rho", "2")
    assert (code, stdout) == (2, "") and err == "replay-theory: error: --rho must be in [0, 1], got 2.0\n"
    assert not out.exists()  # nothing written: no warm start was trained

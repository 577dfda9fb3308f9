"""Issue 11's bad-input / bad-output rows: each is one line naming the option, exit 2, checked before any
work, nothing half-written, and results are never overwritten."""

import json
import os
import stat

import pytest

from replay_theory import __version__
from replay_theory.experiments.paper_tables import write_table
from replay_theory.simulate import sweep as sweep_module
from replay_theory.simulate.config import SimConfig
from replay_theory.simulate.sweep import VERSION_KEY, load_runs, run_sweep

TINY = {"seeds": 2, "steps": 20, "eval_every": 10, "measure_drift": False, "num_prompts": 16}




@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"name": "t", "configs": [TINY]}))
    return path


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


@pytest.mark.parametrize("args,message", [
    (["--checkpoints", "0"], "Invalid value for '--checkpoints': Input should be greater than or equal to 1 "
                             "(valid: an integer >= 1)"),
    (["--samples", "nan"], "Invalid value for '--samples': Input should be a valid integer, unable to parse string "
                           "as an integer (valid: an integer >= 1, a multiple of --group-size)"),
    (["--samples", "12"], "--samples must be a multiple of --group-size = 8, got 12"),
    (["--steps", "5"], "--steps must exceed max(largest --staleness probed, --max-gap) + 1 = 161, got 5"),
    (["--staleness", "0,x"], "--staleness must be comma-separated integers >= 0, got '0,x'"),
    (["--staleness", "4,2"], "--staleness must be increasing integers >= 0, got 4,2"),
    (["--max-gap", "0"], "--max-gap must be an integer >= 1, got 0"),
    (["--reference", "nope"], "--reference must be one of auto, exact, sampled, got 'nope'"),
    (["--reference", "exact", "--env", "token-mdp", "--loss", "m2po"],
     "--reference exact needs an enumerable gradient (--env bandit, or --env token-mdp with per-token gradients): "
     "loss 'm2po' masks a token by the M2 of the whole response, so its token gradients do not factor over "
     "(step, partial sum) states"),
    (["--reference-samples", "12"], "--reference-samples must be a multiple of --group-size = 8 and >= 16, got 12"),
])
def test_calibrate_simulator_names_the_option_and_range(cli, tmp_path, monkeypatch, args, message, error_line):
    import replay_theory.cli.simulate_cmds as simulate_cmds

    monkeypatch.setattr(simulate_cmds, "measure_profile", lambda *a, **k: pytest.fail("the probe ran before the check"))
    assert error_line("calibrate-simulator", "--out", str(tmp_path / "p.json"), *args) == message
    assert list(tmp_path.iterdir()) == []


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


def test_sweep_resume_names_a_corrupt_run_file_and_the_fix(cli, tmp_path, spec_file, error_line):
    out = tmp_path / "o"
    assert cli("sweep", str(spec_file), "--out", str(out), "--no-progress")[0] == 0
    (run_file,) = (out / "runs").glob("*.json")
    run_file.write_text("{'key': 1}")
    assert error_line("sweep", str(spec_file), "--out", str(out), "--no-progress") == (
        f"{run_file} is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2): a run "
        f"file damaged after it was written; delete it and its .npz, then run the sweep again to recompute that "
        f"configuration")


def test_sweep_records_the_code_version_and_refuses_to_mix_versions(cli, tmp_path, spec_file, error_line):
    out = tmp_path / "o"
    assert cli("sweep", str(spec_file), "--out", str(out), "--no-progress")[0] == 0
    spec_json = json.loads((out / "spec.json").read_text())
    (payload,) = load_runs(out)
    assert spec_json[VERSION_KEY] == __version__ == payload[VERSION_KEY]
    # the same sweep resumes (nothing to do) ...
    code, stdout, _ = cli("sweep", str(spec_file), "--out", str(out), "--no-progress")
    assert code == 0 and stdout == f"results: {out / 'results.csv'}, {out / 'results.parquet'}\n"  # pyarrow: [test]
    # ... but not over results of another version
    (out / "spec.json").write_text(json.dumps({**spec_json, VERSION_KEY: "0.0.1"}))
    assert error_line("sweep", str(spec_file), "--out", str(out)) == (
        f"--out {out} holds results of replay-theory 0.0.1, this is {__version__}; versions are never mixed in "
        f"one sweep: choose a new --out")
    (out / "spec.json").write_text(json.dumps(spec_json))
    (run_file,) = (out / "runs").glob("*.json")
    run_file.write_text(json.dumps({**payload, VERSION_KEY: "0.0.1"}))
    assert error_line("sweep", str(spec_file), "--out", str(out)) == (
        f"{run_file} was written by replay-theory 0.0.1, this is {__version__}; versions are never mixed in one "
        f"sweep: choose a new --out")


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


def test_experiment_table_written_once(tmp_path):
    path = write_table(tmp_path, "| a |\n|---|\n| 1 |")
    assert path.read_text() == "| a |\n|---|\n| 1 |\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask()
    mtime = path.stat().st_mtime_ns
    assert write_table(tmp_path, "| a |\n|---|\n| 1 |") == path and path.stat().st_mtime_ns == mtime
    with pytest.raises(ValueError, match=r"table.md exists and holds a different table .* never overwritten"):
        write_table(tmp_path, "| a |\n|---|\n| 2 |")
    assert path.read_text() == "| a |\n|---|\n| 1 |\n"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fake_run_dir(tmp_path, mu=2.0):
    (tmp_path / "calibration.json").write_text(json.dumps({"mu_timing": mu}))
    (tmp_path / "profile.json").write_text(json.dumps({"kind": "power_law", "alpha": 0.25, "rho": 0.1}))
    return tmp_path


def test_validate_predict_never_overwrites_a_different_prediction(tmp_path):
    loop = pytest.importorskip("replay_theory.validate.loop")  # needs the validate extra (torch)
    from replay_theory.theory.design import DesignQuery, optimal_design
    from replay_theory.theory.profiles import load_profile

    out = _fake_run_dir(tmp_path)
    config = loop.ValidateConfig(price_mu=2.0)
    first = loop.run_predict(config, out, log=lambda *_: None)
    loaded = load_profile(out / "profile.json")
    design = optimal_design(DesignQuery(mu=2.0, profile=loaded.profile, profile_rho=loaded.rho,
                                        rollouts_per_step=64))
    assert (first["N"], first["B"], first["R"]) == (design.buffer_size, design.batch_size, 64)
    saved = (out / "predicted.json").read_text()
    assert stat.S_IMODE((out / "predicted.json").stat().st_mode) == 0o666 & ~_umask()
    assert loop.run_predict(config, out, log=lambda *_: None) == json.loads(saved)  # same request: kept
    with pytest.raises(ValueError, match=r"predicted.json exists with mu = 2, .* never overwritten"):
        loop.run_predict(loop.ValidateConfig(price_mu=7.0), out, log=lambda *_: None)
    assert (out / "predicted.json").read_text() == saved


def test_validate_verify_never_overwrites_a_report(tmp_path):
    loop = pytest.importorskip("replay_theory.validate.loop")  # needs the validate extra (torch)
    out = _fake_run_dir(tmp_path)
    (out / "predicted.json").write_text("{}")
    report = {"budget": {"updates": 48, "seeds": 4, "compute": 1.0}, "measured_best": {"name": "on-policy"}}
    (out / "report.json").write_text(json.dumps(report))
    logged = []
    assert loop.run_verify(loop.ValidateConfig(), out, log=logged.append) == report  # nothing trained
    assert logged == [f"report exists in {out}; not trained again (a new --out runs verify afresh)"]
    with pytest.raises(ValueError) as info:
        loop.run_verify(loop.ValidateConfig(), out, loop.VerifyConfig(seeds=2), log=logged.append)
    assert str(info.value) == (f"{out / 'report.json'} exists for --seeds 4 --budget-updates 48; reports are "
                               f"never overwritten: use another --out")
    assert json.loads((out / "report.json").read_text()) == report


def test_validate_verify_cli_prints_the_saved_report(cli, tmp_path):
    pytest.importorskip("transformers")  # validate's commands need the validate extra
    out = _fake_run_dir(tmp_path)
    (out / "predicted.json").write_text("{}")
    (out / "report.json").write_text(json.dumps({"budget": {"updates": 48, "seeds": 4},
                                                 "measured_best": {"name": "N=2R, B=R"}}))
    code, stdout, err = cli("validate", "verify", "--out", str(out))
    assert code == 0 and err == ""
    assert stdout.splitlines() == [f"report exists in {out}; not trained again (a new --out runs verify afresh)",
                                   f"measured best: N=2R, B=R; report: {out / 'report.md'}"]


def test_validate_without_its_extra_is_one_line(cli, tmp_path, monkeypatch, error_line):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("torch", "transformers")
                        else real(name, *a))
    out = _fake_run_dir(tmp_path)
    (out / "predicted.json").write_text("{}")
    assert error_line("validate", "verify", "--out", str(out)) == (
        "validate needs torch and transformers: pip install torch==2.13.0 && pip install 'replay-theory[validate]'")


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

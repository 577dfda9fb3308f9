"""Issue 11's bad-input / bad-output rows: each is one line naming the option, exit 2, checked before any
work, nothing half-written, and results are never overwritten.

Integration tier: the slower tests of this module (sweep runs and the validate extra's commands); the fast ones are in
tests/unit/test_cli_bad_output.py.
"""

import json
import stat

import pytest

from replay_theory import __version__
from replay_theory.simulate.sweep import VERSION_KEY, load_runs

TINY = {"seeds": 2, "steps": 20, "eval_every": 10, "measure_drift": False, "num_prompts": 16}
SPEC = {"name": "t", "configs": [TINY]}  # conftest's spec_file writes it


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


def _fake_run_dir(tmp_path, mu=2.0):
    (tmp_path / "calibration.json").write_text(json.dumps({"mu_timing": mu}))
    (tmp_path / "profile.json").write_text(json.dumps({"kind": "power_law", "alpha": 0.25, "rho": 0.1}))
    return tmp_path


def test_validate_predict_never_overwrites_a_different_prediction(tmp_path, umask):
    loop = pytest.importorskip("replay_theory.validate.loop")  # needs the validate extra (torch)
    from replay_theory.advise.profile_files import load_profile
    from replay_theory.theory.design import DesignQuery, optimal_design

    out = _fake_run_dir(tmp_path)
    config = loop.ValidateConfig(price_mu=2.0)
    first = loop.run_predict(config, out, log=lambda *_: None)
    loaded = load_profile(out / "profile.json")
    design = optimal_design(DesignQuery(mu=2.0, profile=loaded.profile, profile_rho=loaded.rho,
                                        rollouts_per_step=64))
    assert (first["capacity"], first["batch_size"], first["rollouts_per_step"]) == (
        design.capacity, design.batch_size, 64)
    saved = (out / "predicted.json").read_text()
    assert stat.S_IMODE((out / "predicted.json").stat().st_mode) == 0o666 & ~umask
    assert loop.run_predict(config, out, log=lambda *_: None) == json.loads(saved)  # same request: kept
    old_names = {"capacity": "N", "batch_size": "B", "rollouts_per_step": "R"}  # a file saved before: kept too
    (out / "predicted.json").write_text(json.dumps({old_names.get(k, k): v for k, v in json.loads(saved).items()}))
    assert loop.run_predict(config, out, log=lambda *_: None) == json.loads(saved)
    (out / "predicted.json").write_text(saved)
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
        "validate needs torch and transformers: pip install 'replay-theory[validate]' (without a CUDA GPU, first "
        "pip install torch --index-url https://download.pytorch.org/whl/cpu)")

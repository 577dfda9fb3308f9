"""``replay-theory calibrate --from-log``: mu and the sigma^2(s) proxy from a run's exported log.

Hand-computed mu and proxy on a tiny TRL-shaped log (``integrations/export.py``'s columns plus the step time
columns); the proxy against the simulator's exact plain sigma^2(s); the profile through ``optimal --profile``;
the bad-input rows (one line naming the option, exit 2, nothing written).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from replay_theory.cli.app import app  # noqa: E402
from replay_theory.integrations.export import TRL_LOG_COLUMNS  # noqa: E402

L5, L25, L4, L8 = math.log(0.5), math.log(0.25), math.log(0.4), math.log(0.8)
# (step, age, advantage, per_token_logps (current), sampling_per_token_logps (behaviour), completion_mask)
ROWS = [
    (0, 0, 1.0, [L5], [L5], [1]),  # w = 1: q = 1 * 1 * (1 - .5)^2 = 0.25
    (0, 0, -2.0, [L5], [L25], [1]),  # w = 2: q = 4 * 4 * 0.25 = 4
    (0, 1, 1.0, [L8], [L4], [1]),  # w = 2: q = 4 * 1 * (1 - .8)^2 = 0.16
    (1, 1, 1.0, [L5, L5], [L5, L25], [1, 1]),  # w = 1, 2: q = 0.25 + 4 * 0.25 = 1.25
    (1, 0, 0.0, [L5], [L25], [1]),  # A = 0: q = 0
    (1, 2, 1.0, [L5], [L5], [1]),  # the only age-2 sequence: left out of the table
    (1, 1, 0.5, [L5, 0.0], [L5, 0.0], [1, 0]),  # padding dropped: q = 0.25 * 0.25 = 0.0625
]
# per step: generation seconds, generated rows, update seconds (repeated on every row of the step)
TIMES = {0: (3.0, 2, 1.0), 1: (5.0, 2, 2.0)}
# mu = (8 s / 4 generated rows) / (3 s / 7 trained rows) = 14/3
MU = (8.0 / 4) / (3.0 / 7)
# age 0: (0.25 + 4 + 0) / 3; age 1: (0.16 + 1.25 + 0.0625) / 3
RATIO_LOGIT = ((0.16 + 1.25 + 0.0625) / 3) / ((0.25 + 4.0) / 3)
# score constant (k_t = 1): age 0: (1 + 16 + 0) / 3; age 1: (4 + (1 + 4) + 0.25) / 3
RATIO_CONSTANT = ((4.0 + 5.0 + 0.25) / 3) / (17.0 / 3)


def write_log(path: Path, rows=ROWS, times=TIMES, drop: tuple[str, ...] = ()) -> Path:
    """The TRL export's columns (``TRL_LOG_COLUMNS``) plus the step time columns, one Parquet row per row."""
    cols: dict[str, list] = {name: [] for name in TRL_LOG_COLUMNS}
    cols.update(step_generation_seconds=[], step_update_seconds=[], step_generated_rows=[])
    for i, (step, age, adv, cur, behav, mask) in enumerate(rows):
        gen_s, gen_rows, upd_s = times[step]
        cols["step"].append(step)
        cols["sample_id"].append(i)
        cols["group_id"].append(i // 2)
        cols["policy_version"].append(step - age)
        cols["age"].append(age)
        cols["advantages"].append(adv)
        cols["rewards"].append(adv)
        cols["per_token_logps"].append(cur)
        cols["old_per_token_logps"].append(behav)
        cols["sampling_per_token_logps"].append(behav)
        cols["completion_mask"].append(mask)
        cols["tool_mask"].append([1] * len(mask))
        cols["step_generation_seconds"].append(gen_s)
        cols["step_update_seconds"].append(upd_s)
        cols["step_generated_rows"].append(gen_rows)
    pq.write_table(pa.table({k: v for k, v in cols.items() if k not in drop}), path)
    return path


def test_mu_and_the_proxy_by_hand(tmp_path, cli):
    log = write_log(tmp_path / "run.parquet")
    out = tmp_path / "profile.json"
    code, stdout, err = cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(out))
    assert code == 0 and err == ""
    data = json.loads(out.read_text())
    assert data["mu"]["value"] == pytest.approx(MU, rel=1e-12)
    assert data["mu"]["generation_seconds_per_row"] == 2.0 and data["mu"]["update_seconds_per_row"] == 3.0 / 7
    assert data["mu"]["steps"] == 2 and data["mu"]["trained_rows"] == 7 and data["mu"]["convention"] == "rollout-cost"
    assert data["kind"] == "table" and data["sigma_sq_form"] == "plain"
    assert data["staleness"] == [0.0, 1.0]
    assert data["sigma_sq"] == pytest.approx([1.0, RATIO_LOGIT], rel=1e-12)
    assert data["proxy"]["sequences_by_age"] == [3, 3] and data["proxy"]["ages_left_out"] == {"2": 1}
    # rho is never defaulted: no "rho", a fit marked not measurable, so optimal asks for --rho
    assert "rho" not in data and data["rho_fit"]["in_range"] is False and data["rho_fit"]["measurable"] is False
    prov = data["provenance"]
    assert prov["log"] == str(log.resolve()) and prov["preset"] == "trl" and len(prov["sha256"]) == 64
    assert prov["code_version"] and data["assumptions"] and data["not_measured"]
    assert f"next: replay-theory optimal --profile {out} --mu {MU:.4g} --rho RHO" in stdout
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~_umask())

    # --score constant (k_t = 1), --mu and --rho recorded as given
    out2 = tmp_path / "constant.json"
    code, stdout, _ = cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(out2), "--score",
                          "constant", "--mu", "5.28", "--rho", "0.1")
    data = json.loads(out2.read_text())
    assert code == 0 and data["sigma_sq"] == pytest.approx([1.0, RATIO_CONSTANT], rel=1e-12)
    assert data["mu"] == {"value": 5.28, "ci": [None, None], "source": "--mu (given by the user)",
                          "convention": "rollout-cost"}
    assert data["rho"] == 0.1 and data["rho_record"]["source"].startswith("--rho")
    assert f"next: replay-theory optimal --profile {out2} --mu 5.28 --rho 0.1" in stdout


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_sequence_weights_and_seq_mean_aggregation_by_hand(tmp_path, cli):
    log = write_log(tmp_path / "run.parquet")
    out = tmp_path / "p.json"
    code, _, _ = cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(out), "--weight",
                     "sequence", "--aggregation", "seq-mean-token-mean")
    # sequence weight W = prod w_t: the two-token row has W = 2, q = W^2 (0.25 + 0.25) / 2^2 = 0.5;
    # the padded row has one token: q = 0.0625; the rest have one token as before
    expected = ((0.16 + 0.5 + 0.0625) / 3) / ((0.25 + 4.0) / 3)
    assert code == 0 and json.loads(out.read_text())["sigma_sq"] == pytest.approx([1.0, expected], rel=1e-12)


def test_proxy_against_the_exact_simulator_profile():
    """Bandit, unbiased IS loss: the logit-score proxy is within 5% of the exact plain sigma^2(s)/sigma^2(0) at
    s = 0..32 (measured: at most 3.0%); the constant score is off by more than 30% at s = 32 (measured: +52%)."""
    from replay_theory.diagnose.proxy_check import compare

    result = compare("bandit")
    exact, logit, constant = (np.asarray(result[k], float) for k in ("exact", "logit", "constant"))
    assert result["staleness"] == [0, 2, 4, 8, 16, 32]
    assert np.max(np.abs(logit / exact - 1)) < 0.05
    assert constant[-1] / exact[-1] - 1 > 0.3
    assert result["signal_share"] < 0.02  # assumption (i): the per-sample signal is small against its noise


def test_profile_round_trips_through_optimal(tmp_path, cli):
    # a second age-2 sequence: the table reaches age 2 (optimal needs a horizon beyond 1)
    log = write_log(tmp_path / "run.parquet", rows=ROWS + [(1, 2, -1.0, [L25], [L5], [1])])
    out = tmp_path / "profile.json"
    assert cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(out))[0] == 0
    data = json.loads(out.read_text())
    assert data["staleness"] == [0.0, 1.0, 2.0]
    by_hand = tmp_path / "by_hand.json"
    by_hand.write_text(json.dumps({"kind": "table", "staleness": data["staleness"], "sigma_sq": data["sigma_sq"]}))
    runner = CliRunner()
    mu = f"{data['mu']['value']:.4g}"
    results = [runner.invoke(app, ["optimal", "--profile", str(p), "--mu", mu, "--rho", "0.1", "-B", "64", "--json"])
               for p in (out, by_hand)]
    assert [r.exit_code for r in results] == [0, 0], [(r.output, repr(r.exception)) for r in results]
    ours, hand = (json.loads(r.stdout) for r in results)
    assert ours.pop("profile").startswith("measured table of plain sigma^2, 3 points")
    hand.pop("profile")
    assert ours == hand and ours["batch_size"] == 64 and ours["rho"] == 0.1
    # without --rho, optimal refuses the profile (its rho is not measured): no silent default
    code, stdout, err = cli("optimal", "--profile", str(out), "--mu", mu)
    assert code == 2 and stdout == "" and err.startswith(f"replay-theory: error: --profile {out}: ")
    assert err.endswith("pass --rho explicitly\n")


@pytest.mark.parametrize("args, message", [
    (["--mu", "0"], "--mu must be a finite number > 0 (rollout cost / per-sample update cost), got 0"),
    (["--mu", "-1"], "--mu must be a finite number > 0 (rollout cost / per-sample update cost), got -1"),
    (["--rho", "1.5"], "--rho must be in [0, 1] (the range Assumption 3.3 and optimal allow), got 1.5"),
    (["--rho", "-0.1"], "--rho must be in [0, 1] (the range Assumption 3.3 and optimal allow), got -0.1"),
    (["--weight", "tokens"], "--weight must be one of token, sequence, got 'tokens'"),
    (["--score", "x"], "--score must be one of logit, constant, got 'x'"),
    (["--preset", "nope"], "--preset must be one of default, trl, verl, got 'nope'"),
    (["--columns", "age=version_gap"], "--columns must map age: the log has no age column 'version_gap' (columns: "
     "step, sample_id, group_id, policy_version, age, advantages, rewards, per_token_logps, old_per_token_logps, "
     "sampling_per_token_logps, completion_mask, tool_mask, step_generation_seconds, step_update_seconds); "
     "give --columns age=NAME"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, cli, args, message):
    log = write_log(tmp_path / "run.parquet")
    out = tmp_path / "p.json"
    code, stdout, err = cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(out), *args)
    assert (code, stdout, err) == (2, "", f"replay-theory: error: {message}\n")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["run.parquet"]


def test_bad_paths_and_missing_time_columns(tmp_path, cli):
    log = write_log(tmp_path / "run.parquet")
    out = tmp_path / "p.json"
    code, _, err = cli("calibrate", "--from-log", str(tmp_path / "nope.parquet"), "--out", str(out))
    assert code == 2 and err == f"replay-theory: error: --from-log {tmp_path / 'nope.parquet'} is not a file " \
                                "(not found, or a directory)\n"
    out.write_text("{}")
    code, _, err = cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(out))
    assert code == 2 and err == f"replay-theory: error: --out {out} exists; results are never overwritten: " \
                                "choose a new path\n"
    assert out.read_text() == "{}"
    out.unlink()
    bare = write_log(tmp_path / "bare.parquet", drop=("step_update_seconds", "step_generated_rows"))
    code, _, err = cli("calibrate", "--from-log", str(bare), "--preset", "trl", "--out", str(out))
    assert code == 2 and err == ("replay-theory: error: --mu is needed: bare.parquet has no step_update_seconds, "
                                 "step_generated_rows columns to measure it; give --mu MU (> 0, rollout cost / "
                                 "per-sample update cost)\n")
    assert not out.exists()
    # with --mu the same log calibrates, and the log's missing time columns are not needed
    code, _, _ = cli("calibrate", "--from-log", str(bare), "--preset", "trl", "--out", str(out), "--mu", "4")
    assert code == 0 and json.loads(out.read_text())["mu"]["value"] == 4.0
    code, _, err = cli("calibrate", "--out", str(tmp_path / "q.json"))
    assert code == 2 and err == ("replay-theory: error: --from-log LOG is required: the diagnose log a run exported "
                                 "(Parquet, CSV or JSON lines)\n")


def test_long_layout_csv_gives_the_same_mu_and_table(tmp_path, cli):
    """The default preset's one-row-per-token CSV (time columns repeated on every token row): rows trained at a
    step are the step's distinct sequences, so mu and the table equal the wide log's."""
    lines = ["seq_id,step,age,advantage,logp_behav,logp_current,mask,step_generation_seconds,step_update_seconds,"
             "step_generated_rows"]
    for i, (step, age, adv, cur, behav, mask) in enumerate(ROWS):
        gen_s, gen_rows, upd_s = TIMES[step]
        for c, b, m in zip(cur, behav, mask):
            lines.append(f"s{i},{step},{age},{adv!r},{b!r},{c!r},{m},{gen_s},{upd_s},{gen_rows}")
    log = tmp_path / "long.csv"
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "p.json"
    code, _, err = cli("calibrate", "--from-log", str(log), "--columns", "mask=mask", "--out", str(out))
    data = json.loads(out.read_text())
    assert code == 0 and err == "" and data["provenance"]["layout"] == "long"
    assert data["mu"]["value"] == pytest.approx(MU, rel=1e-12) and data["mu"]["trained_rows"] == 7
    assert data["sigma_sq"] == pytest.approx([1.0, RATIO_LOGIT], rel=1e-12)


def test_a_token_with_p_one_weighs_zero_without_a_warning(tmp_path):
    # log (1 - p)^2 is -inf at p = 1 (logp 0): the token carries no gradient through the softmax and adds 0 to q;
    # numpy's divide-by-zero warning must not reach the user
    import warnings

    from replay_theory.diagnose.calibrate_log import CalibrateLogConfig, calibrate_from_log

    log = write_log(tmp_path / "run.parquet", rows=[*ROWS, (1, 1, 1.0, [L5, 0.0], [L5, 0.0], [1, 1])])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = calibrate_from_log(CalibrateLogConfig(path=str(log), preset="trl"))
    # age 1 gains a sequence with q = 1 * 1 * 0.25 + 0 (its p = 1 token)
    assert data["sigma_sq"] == pytest.approx([1.0, ((0.16 + 1.25 + 0.0625 + 0.25) / 4) / (4.25 / 3)], rel=1e-12)

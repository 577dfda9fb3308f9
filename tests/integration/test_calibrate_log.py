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
from replay_theory.diagnose.calibrate_log import zero_share_record  # noqa: E402
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


def test_mu_and_the_proxy_by_hand(tmp_path, cli, umask):
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
    # optimal reads the measured mu from the profile: no --mu on the line (the steps chain with the user's numbers)
    assert f"next: replay-theory optimal --objective paper --profile {out} --rho RHO" in stdout
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~umask)

    # --score constant (k_t = 1), --mu and --rho recorded as given
    out2 = tmp_path / "constant.json"
    code, stdout, _ = cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(out2), "--score",
                          "constant", "--mu", "5.28", "--rho", "0.1")
    data = json.loads(out2.read_text())
    assert code == 0 and data["sigma_sq"] == pytest.approx([1.0, RATIO_CONSTANT], rel=1e-12)
    assert data["mu"] == {"value": 5.28, "ci": [None, None], "source": "--mu (given by the user)",
                          "convention": "rollout-cost"}
    assert data["rho"] == 0.1 and data["rho_record"]["source"].startswith("--rho")
    assert f"next: replay-theory optimal --objective paper --profile {out2} --mu 5.28 --rho 0.1" in stdout  # given


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
    from replay_theory.experiments.proxy_check import compare

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
    results = [runner.invoke(app, ["optimal", "--objective", "paper", "--profile", str(p), "--mu", mu, "--rho",
                                   "0.1", "-B", "64", "--json"])
               for p in (out, by_hand)]
    assert [r.exit_code for r in results] == [0, 0], [(r.output, repr(r.exception)) for r in results]
    ours, hand = (json.loads(r.stdout) for r in results)
    assert ours.pop("profile").startswith("measured table of plain sigma^2, 3 points")
    hand.pop("profile")
    assert ours == hand and ours["batch_size"] == 64 and ours["rho"] == 0.1
    # without --rho, optimal refuses the profile (its rho is not measured): no silent default
    code, stdout, err = cli("optimal", "--objective", "paper", "--profile", str(out), "--mu", mu)
    assert code == 2 and stdout == "" and err.startswith(f"replay-theory: error: --profile {out}: ")
    assert err.endswith("pass --rho explicitly\n")


@pytest.mark.parametrize("args, message", [
    (["--mu", "0"], "--mu must be a finite number > 0 (rollout cost / per-sample update cost), got 0"),
    (["--mu", "-1"], "--mu must be a finite number > 0 (rollout cost / per-sample update cost), got -1"),
    (["--rho", "1.5"], "--rho must be in [0, 1] (the range Assumption 3.3 and optimal allow), got 1.5"),
    (["--rho", "-0.1"], "--rho must be in [0, 1] (the range Assumption 3.3 and optimal allow), got -0.1"),
    (["--weight", "tokens"], "--weight must be one of token, sequence, got 'tokens'"),
    (["--score", "x"], "--score must be one of logit, constant, got 'x'"),
    (["--preset", "nope"], "--preset must be one of default, trl, verl, nemo-rl, skyrl, slime, got 'nope'"),
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


# --------------------------------------------------------------------------- B_noise from --grad-norms

# per step: (step, |g_small|^2, |g_big|^2), B_small = 4, B_big = 8 (McCandlish App. A.1):
# means: small = (10 + 8 + 9) / 3 = 9, big = (6 + 5 + 4) / 3 = 5
# |G|^2 = (8 * 5 - 4 * 9) / (8 - 4) = 1; tr Sigma = (9 - 5) / (1/4 - 1/8) = 32; B_noise = 32
NORMS = [(0, 10.0, 6.0), (1, 8.0, 5.0), (2, 9.0, 4.0)]


def write_norms(path: Path, rows=NORMS, b_small=4, b_big=8, unit_size=2, drop: tuple[str, ...] = ()) -> Path:
    records = [{"step": s, "grad_sq_small": a, "grad_sq_big": b, "batch_small": b_small, "batch_big": b_big,
                "unit_size": unit_size} for s, a, b in rows]
    records = [{k: v for k, v in r.items() if k not in drop} for r in records]
    if path.suffix == ".csv":
        columns = list(records[0])
        path.write_text("\n".join([",".join(columns)] + [",".join(str(r[c]) for c in columns) for r in records]))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("name", ["noise_scale.jsonl", "norms.csv"])
def test_grad_norms_give_b_noise_by_hand(tmp_path, cli, name):
    log = write_log(tmp_path / "run.parquet")
    norms = write_norms(tmp_path / name)
    out = tmp_path / "p.json"
    code, stdout, err = cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(out),
                            "--grad-norms", str(norms))
    assert code == 0 and err == ""
    data = json.loads(out.read_text())
    record = data["noise_scale"]
    assert record["b_noise"] == pytest.approx(32.0, rel=1e-12)
    assert (record["method"], record["batch"], record["unit_size"], record["checkpoints"]) == ("two-batch", 8, 2, 3)
    assert record["level"] == 0.9 and record["per_checkpoint"] == []
    # the bootstrap resamples the 3 steps: of the 27 equally likely resamples, one (steps 1, 1, 1) gives 12 (3.7%),
    # three give 40/3 (steps 0, 1, 1), and seven have |G|^2 <= 0 (26%: e.g. 2, 2, 1) and count as inf. The 5% and
    # 95% order statistics of 2000 draws: 40/3 and inf (written null)
    assert record["b_noise_interval"] == [pytest.approx(40 / 3, rel=1e-12), None]
    assert record["source"].startswith(f"replay-theory calibrate --grad-norms {norms}: two-batch")
    assert data["provenance"]["grad_norms"]["path"] == str(norms.resolve())
    assert not any("B_noise" in s for s in data["not_measured"])
    assert "B_noise = 32 samples (90% interval" in stdout and "b = B_noise / B = 4 at B = 8" in stdout
    assert f"next: replay-theory optimal --profile {out} -B 8" in stdout
    # the profile drives optimal's noise-scale rule: the same answer as --noise-scale 32 -B 8
    results = [cli("optimal", "--mu", "5.28", "-B", "8", "--objective", "noise-scale", "--json", *args)
               for args in (["--profile", str(out)], ["--noise-scale", "32"])]
    assert [r[0] for r in results] == [0, 0], results
    ours, direct = (json.loads(r[1]) for r in results)
    assert {k: v for k, v in ours.items() if "source" not in k and "noise_scale_from" not in k} == \
        {k: v for k, v in direct.items() if "source" not in k and "noise_scale_from" not in k}
    # the other parts of the profile do not change
    assert data["mu"]["value"] == pytest.approx(MU, rel=1e-12)
    assert data["sigma_sq"] == pytest.approx([1.0, RATIO_LOGIT], rel=1e-12)


def test_bootstrap_interval_by_hand():
    # two steps: resamples {0, 0}, {1, 1}, {0, 1}; with B_small 1, B_big 2: |G|^2 = 2 big - small,
    # tr Sigma = 2 (small - big). Step 0 (3, 2): |G|^2 1, tr 2 -> 2; step 1 (5, 3): 1, 4 -> 4;
    # both: small 4, big 2.5: |G|^2 1, tr 3 -> 3. The 90% order-statistic interval over many draws: [2, 4]
    from replay_theory.diagnose.calibrate_log import noise_scale_record

    norms = {"step": np.array([0.0, 1.0]), "grad_sq_small": np.array([3.0, 5.0]),
             "grad_sq_big": np.array([2.0, 3.0]), "batch_small": np.array([1.0, 1.0]),
             "batch_big": np.array([2.0, 2.0])}
    record = noise_scale_record(norms, unit_size=1, source="by hand", draws=400, seed=3)
    assert record["b_noise"] == pytest.approx(3.0, rel=1e-12)
    assert record["b_noise_interval"] == pytest.approx([2.0, 4.0], rel=1e-12)


def test_unequal_batch_sizes_pool_the_unbiased_parts():
    # step 0 at (B_s, B_b) = (2, 6), step 1 at (3, 6): B_noise = mean tr Sigma_t / mean |G|^2_t (Eqs. A.2-A.3 per
    # step). Step 0: small 7, big 3 -> |G|^2 = (6*3 - 2*7)/4 = 1, tr = 4 / (1/2 - 1/6) = 12.
    # Step 1: small 5, big 3 -> |G|^2 = (18 - 15)/3 = 1, tr = 2 / (1/3 - 1/6) = 12. B_noise = 12 / 1 = 12.
    from replay_theory.diagnose.calibrate_log import noise_scale_record

    norms = {"step": np.array([0.0, 1.0]), "grad_sq_small": np.array([7.0, 5.0]),
             "grad_sq_big": np.array([3.0, 3.0]), "batch_small": np.array([2.0, 3.0]),
             "batch_big": np.array([6.0, 6.0])}
    record = noise_scale_record(norms, unit_size=4, source="by hand", draws=50)
    assert record["b_noise"] == pytest.approx(12.0, rel=1e-12)
    assert record["batch"] == 6 and record["unit_size"] == 4
    norms["batch_big"] = np.array([6.0, 7.0])  # B differs between steps: no single batch to record
    assert noise_scale_record(norms, unit_size=4, source="by hand", draws=50)["batch"] is None


def test_without_grad_norms_the_output_says_b_needs_gradients(tmp_path, cli):
    log = write_log(tmp_path / "run.parquet")
    out = tmp_path / "p.json"
    code, stdout, _ = cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(out))
    line = ("b = B_noise / B cannot be measured from log-probs alone (it needs gradients): pass --grad-norms "
            "DIR/noise_scale.jsonl from `replay-theory trl-replay` (the TRL trainer's two-batch measurement) or the "
            "noise log of a verl run (+trainer.noise_log with integrations.verl.VerlGradNoiseMixin on its engine), "
            "or run `replay-theory validate calibrate-model`")
    assert code == 0 and line in stdout.splitlines()
    data = json.loads(out.read_text())
    assert "noise_scale" not in data and data["not_measured"][-1] == line


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "none.jsonl", "{path} is not a file (not found, or a directory)"),
    (lambda d: write_norms(d / "n.txt"), "{path} must be JSON lines (.jsonl) or CSV (.csv) with the columns step, "
     "grad_sq_small, grad_sq_big, batch_small, batch_big"),
    (lambda d: write_norms(d / "n.jsonl", drop=("batch_big",)), "{path} has no batch_big column on every step "
     "(needs step, grad_sq_small, grad_sq_big, batch_small, batch_big)"),
    (lambda d: write_norms(d / "n.csv", drop=("grad_sq_small", "step")), "{path} has no step, grad_sq_small columns "
     "on every step (needs step, grad_sq_small, grad_sq_big, batch_small, batch_big)"),
    (lambda d: write_norms(d / "n.jsonl", rows=NORMS[:1]), "{path} holds 1 step: the two-batch estimate needs >= 2 "
     "(its interval resamples steps)"),
    (lambda d: write_norms(d / "n.jsonl", b_small=0), "{path}: batch_small must be > 0 (samples) at every step, got "
     "0 at step 0"),
    (lambda d: write_norms(d / "n.csv", b_big=-8), "{path}: batch_big must be > 0 (samples) at every step, got -8 "
     "at step 0"),
    (lambda d: write_norms(d / "n.jsonl", b_small=8), "{path}: batch_big must exceed batch_small at every step, got "
     "8 <= 8 at step 0"),
    (lambda d: write_norms(d / "n.jsonl", rows=[(0, 1.0, 1.0), (1, -1.0, 1.0)]), "{path}: grad_sq_small must be a "
     "finite number >= 0 at every step, got -1 at step 1"),
    (lambda d: write_norms(d / "n.jsonl", unit_size=0), "{path}: unit_size must be one integer >= 1 on every step, "
     "got 0"),
])
def test_bad_grad_norms_are_one_line_exit_2_nothing_written(tmp_path, cli, make, message):
    log = write_log(tmp_path / "run.parquet")
    folder = tmp_path / "norms"
    folder.mkdir()
    path = make(folder)
    out = tmp_path / "p.json"
    code, stdout, err = cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(out),
                            "--grad-norms", str(path))
    assert (code, stdout) == (2, "")
    assert err == f"replay-theory: error: --grad-norms {message.format(path=path)}\n"
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["norms", "run.parquet"]


def test_bad_grad_norms_are_refused_before_the_log_is_read(tmp_path, cli):
    # a broken log AND a broken --grad-norms: the norms file is named (checked first, nothing read from the log)
    log = tmp_path / "run.parquet"
    log.write_text("not parquet")
    bad = write_norms(tmp_path / "n.jsonl", rows=NORMS[:1])
    code, _, err = cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(tmp_path / "p.json"),
                       "--grad-norms", str(bad))
    assert code == 2 and err.startswith("replay-theory: error: --grad-norms ") and "holds 1 step" in err


def test_on_policy_log_with_grad_norms_writes_a_noise_scale_profile(tmp_path, cli):
    # an on-policy pilot has one age: no sigma^2(s) table, but with --grad-norms the profile is {"kind":
    # "noise_scale"} with mu and B_noise, which optimal's noise-scale rule reads (same answer as --noise-scale 32)
    fresh = [(step, 0, adv, cur, behav, mask) for step, _, adv, cur, behav, mask in ROWS]
    log = write_log(tmp_path / "run.parquet", rows=fresh)
    out = tmp_path / "p.json"
    code, _, err = cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(out))
    assert code == 2 and "a profile needs >= 2 ages" in err and not out.exists()
    norms = write_norms(tmp_path / "n.jsonl")
    code, stdout, err = cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(out),
                            "--grad-norms", str(norms))
    assert code == 0 and err == ""
    data = json.loads(out.read_text())
    assert data["kind"] == "noise_scale" and data["noise_scale"]["b_noise"] == pytest.approx(32.0, rel=1e-12)
    assert data["mu"]["value"] == pytest.approx(MU, rel=1e-12) and "staleness" not in data
    assert data["not_measured"][0].startswith("sigma^2(s): the log has usable sequences")
    assert f"next: replay-theory optimal --profile {out} -B 8" in stdout
    results = [cli("optimal", "--mu", "5.28", "-B", "8", "--objective", "noise-scale", "--json", *args)
               for args in (["--profile", str(out)], ["--noise-scale", "32"])]
    assert [r[0] for r in results] == [0, 0], results
    ours, direct = (json.loads(r[1]) for r in results)
    assert ours["y"] == direct["y"] and ours["regime"] == direct["regime"]


def test_the_zero_share_by_hand_and_through_optimal(tmp_path, cli):
    """One of ROWS' 7 sequences has a zero advantage on every token (a group of equal rewards): z = 1/7, written into
    the profile and printed; optimal --profile reads it as --zero-share (and refuses both at once); sequences whose
    every advantage is zero give no zero share (a z of 1 prices nothing)."""
    log = write_log(tmp_path / "run.parquet")
    out = tmp_path / "profile.json"
    code, stdout, _ = cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(out))
    data = json.loads(out.read_text())
    assert code == 0 and data["zero_share"]["value"] == pytest.approx(1 / 7, rel=1e-15)
    assert data["zero_share"]["sequences"] == 7
    assert ("zero share z = 0.143 (1 of 7 sequences with |A| <= 0.001 x the log's largest on every token): optimal "
            "--profile prices selective replay with it") in stdout
    assert zero_share_record(np.zeros(3), log) == {}  # every advantage zero: no z to price with
    # float32 rounding of equal rewards over GRPO's std + 1e-4 (TRL logs 7.4e-05): zero, against the log's largest
    rounded = zero_share_record(np.array([7.45e-5, 2.47, 0.35, 7.45e-5]), log)["zero_share"]
    assert rounded["value"] == 0.5 and rounded["cut"] == pytest.approx(2.47e-3)

    profile = json.loads(out.read_text())
    profile.update(noise_scale={"b_noise": 1000.0, "batch": 256}, staleness=[0, 63], sigma_sq=[1.0, 1.0])
    path = tmp_path / "with_z.json"
    path.write_text(json.dumps(profile))
    args = ("optimal", "--mu", "5.28", "-B", "256", "--profile", str(path), "--kappa", "0.2", "--optimizer", "sgd",
            "--group-size", "8", "--latency-floor", "64", "--json")
    code, stdout, _ = cli(*args)
    d = json.loads(stdout)
    assert code == 0 and d["zero_share"] == pytest.approx(1 / 7, rel=1e-15)
    assert d["zero_share_source"] == f"--profile {path}: {data['zero_share']['source']}"
    code, stdout, err = cli(*args, "--zero-share", "0.2")
    assert code == 2 and stdout == "" and "give the zero share once" in err
    path.write_text(json.dumps({**profile, "zero_share": {"value": 1.0}}))
    code, _, err = cli(*args)
    assert code == 2 and "profile 'zero_share.value' must be a number in [0, 1), got 1.0" in err


def test_drift_record_by_hand_and_a_file_of_too_many_ages_is_refused(tmp_path, cli):
    # M2(s) = the token mean of (logp_current - logp_behav)^2 at each age s > 0, age 0's rows left out (the long
    # layout, by hand); a file of more distinct ages than diagnose keeps apart is refused, not silently pooled
    import pyarrow as pa
    import pyarrow.parquet as pq

    from replay_theory.diagnose.calibrate_log import DRIFT_MAX_AGES, drift_record

    rows = {"seq_id": [0, 0, 1, 2, 2, 3], "age": [0, 0, 1, 1, 1, 4],
            "logp_behav": [-1.0, -2.0, -1.0, -0.5, -0.25, -3.0], "logp_current": [-1.5, -2.0, -1.2, -0.5, -0.75, -2.0]}
    pq.write_table(pa.table(rows), tmp_path / "drift.parquet")
    record = drift_record(tmp_path / "drift.parquet")
    assert record["staleness"] == [0, 1, 4] and record["tokens"] == [0, 3, 1]
    assert record["m2"] == pytest.approx([0, (0.2**2 + 0 + 0.5**2) / 3, 1.0], rel=1e-12)
    many = DRIFT_MAX_AGES + 1
    pq.write_table(pa.table({"seq_id": list(range(many)), "age": list(range(many)), "logp_behav": [-1.0] * many,
                             "logp_current": [-1.1] * many}), tmp_path / "many.parquet")
    pq.write_table(pa.table({"seq_id": list(range(8)), "age": [0] * 4 + [1] * 4, "advantage": [1.0, -1.0] * 4,
                             "logp_behav": [-1.0, -0.5, -2.0, -0.7] * 2,
                             "logp_current": [-1.0, -0.5, -2.0, -0.7, -0.9, -0.6, -1.8, -0.8]}),
                   tmp_path / "log.parquet")
    code, _, err = cli("calibrate", "--from-log", str(tmp_path / "log.parquet"), "--mu", "5",
                       "--drift", str(tmp_path / "many.parquet"), "--out", str(tmp_path / "p.json"))
    assert code == 2 and err.strip().splitlines() == [
        f"replay-theory: error: --drift many.parquet holds more than {DRIFT_MAX_AGES} distinct ages; a drift table "
        "needs a few (trl-replay's: 1, 2, 4, ..., 64 and the run's first)"]
    assert not (tmp_path / "p.json").exists()

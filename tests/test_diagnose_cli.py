"""`replay-theory diagnose` on files shaped like TRL's and verl's logged tensors, and the CLI contract."""

from __future__ import annotations

import json

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from replay_theory.figures.diagnose import ess_by_age_data  # noqa: E402
from replay_theory.theory import divergences as dv  # noqa: E402

REQUIRED_KEYS = ("n_tokens", "ess_frac", "chi2", "d2", "kl_k1", "kl_k2", "kl_k3", "m2", "ratio_max")


def _padded_batch(rng, n_seq: int, max_len: int):
    """Right-padded (n_seq, max_len) log-probs as a trainer holds them, and the 0/1 completion mask."""
    lengths = rng.integers(3, max_len + 1, size=n_seq)
    mask = (np.arange(max_len)[None, :] < lengths[:, None]).astype(np.int64)  # (n_seq, max_len)
    behav = -rng.exponential(1.0, size=(n_seq, max_len))
    current = np.minimum(behav + rng.normal(scale=0.2, size=(n_seq, max_len)), 0.0)
    behav, current = behav * mask, current * mask  # padding holds 0.0, as in TRL / verl
    return behav, current, mask, lengths


def _expected(behav, current, mask):
    lr = (current - behav)[mask.astype(bool)]
    seq = np.sum((current - behav) * mask, axis=1)
    return dv.sample_statistics(lr), dv.sample_statistics(seq)


def test_trl_preset_reads_grpo_trainer_shaped_parquet(tmp_path, cli):
    rng = np.random.default_rng(0)
    behav, current, mask, _ = _padded_batch(rng, 64, 20)
    old = np.minimum(behav + rng.normal(scale=0.05, size=behav.shape), 0.0) * mask
    table = pa.table({
        "prompt_ids": [list(rng.integers(0, 100, 5)) for _ in range(64)],
        "completion_ids": [list(rng.integers(0, 100, 20)) for _ in range(64)],
        "completion_mask": [list(m) for m in mask],
        "sampling_per_token_logps": [list(b) for b in behav],
        "old_per_token_logps": [list(o) for o in old],
        "per_token_logps": [list(c) for c in current],
        "advantages": rng.normal(size=64),
    })
    path = tmp_path / "trl_batch.parquet"
    pq.write_table(table, path)
    code, out, err = cli("diagnose", str(path), "--preset", "trl", "--json", "--no-progress", "--chunk-rows", "10")
    assert code == 0, err
    report = json.loads(out)
    tok, seq = _expected(behav, current, mask)
    assert report["layout"] == "wide" and report["n_tokens"] == int(mask.sum())
    for key in ("kl_k1", "kl_k2", "kl_k3", "m2", "d2", "chi2", "ess_frac"):
        assert report[key] == pytest.approx(float(tok[key]), rel=1e-10, abs=1e-14), key
    assert report["sequence"]["ess_frac"] == pytest.approx(float(seq["ess_frac"]), rel=1e-10)
    assert report["sequence"]["chi2"] == pytest.approx(float(seq["chi2"]), rel=1e-10)
    # TRL's own vLLM IS-correction pair: sampler vs old_per_token_logps
    code, out, _ = cli("diagnose", str(path), "--preset", "trl", "--columns", "logp_current=old_per_token_logps",
                       "--json", "--no-progress")
    tok_old, _ = _expected(behav, old, mask)
    assert json.loads(out)["m2"] == pytest.approx(float(tok_old["m2"]), rel=1e-10)
    # advantages present: the M2PO what-if ran (no "needs an advantage column" note)
    assert all(r.get("note") is None for r in report["what_if"] if r["correction"].startswith("m2po"))


def test_verl_preset_reads_dataproto_shaped_jsonl_with_an_age_column(tmp_path, cli):
    rng = np.random.default_rng(1)
    behav, current, mask, _ = _padded_batch(rng, 48, 16)
    ages = rng.integers(0, 4, size=48)
    path = tmp_path / "verl_batch.jsonl"
    with open(path, "w") as fh:
        for i in range(48):
            fh.write(json.dumps({
                "uid": f"prompt-{i // 8}", "responses": [int(t) for t in rng.integers(0, 100, 16)],
                "response_mask": [int(m) for m in mask[i]], "rollout_log_probs": list(map(float, behav[i])),
                "old_log_probs": list(map(float, current[i])),
                "advantages": [float(a) for a in rng.normal(size=16) * mask[i]], "version_gap": int(ages[i]),
            }) + "\n")
    code, out, err = cli("diagnose", str(path), "--preset", "verl", "--columns", "age=version_gap", "--json",
                         "--no-progress")
    assert code == 0, err
    report = json.loads(out)
    tok, seq = _expected(behav, current, mask)
    assert report["ess_frac"] == pytest.approx(float(tok["ess_frac"]), rel=1e-10)
    assert report["sequence"]["ess_frac"] == pytest.approx(float(seq["ess_frac"]), rel=1e-10)
    token_age = np.repeat(ages, mask.sum(axis=1))
    lr = (current - behav)[mask.astype(bool)]
    assert [b["age"] for b in report["by_age"]] == sorted(set(ages.astype(float).tolist()))
    for bucket in report["by_age"]:
        sub = lr[token_age == bucket["age"]]
        assert bucket["n_tokens"] == sub.size
        assert bucket["m2"] == pytest.approx(float(dv.m2(sub)), rel=1e-10)
    assert report["drift"]["n_ages"] == len(set(ages.tolist()))


def test_json_keys_and_sequence_block(tmp_path, cli):
    rng = np.random.default_rng(2)
    n = 300
    table = pa.table({"seq_id": np.repeat(np.arange(60), 5), "logp_behav": -rng.exponential(size=n),
                      "age": np.repeat(rng.integers(0, 3, 60), 5).astype(float)})
    table = table.append_column("logp_current", pa.array(np.minimum(
        table["logp_behav"].to_numpy() + rng.normal(scale=0.1, size=n), 0.0)))
    path = tmp_path / "log.parquet"
    pq.write_table(table, path)
    code, out, _ = cli("diagnose", str(path), "--json", "--no-progress")
    assert code == 0
    report = json.loads(out)
    lr = table["logp_current"].to_numpy() - table["logp_behav"].to_numpy()
    assert report["n_tokens"] == n
    assert report["ratio_max"] == pytest.approx(float(np.exp(lr.max())))
    for key in REQUIRED_KEYS[1:]:
        assert isinstance(report[key], float), key
    assert set(report["sequence"]) >= {"ess_frac", "chi2", "n_sequences"}
    assert len(report["by_age"]) == 3 and all(set(REQUIRED_KEYS) <= set(b) for b in report["by_age"])
    assert sum(b["n_tokens"] for b in report["by_age"]) == n


def test_figure_and_saved_report_rebuild(tmp_path, cli):
    rng = np.random.default_rng(3)
    n = 200
    behav = -rng.exponential(size=n)
    age = np.repeat(np.arange(4.0), n // 4)
    table = pa.table({"seq_id": np.arange(n) // 4, "logp_behav": behav,
                      "logp_current": np.minimum(behav + rng.normal(scale=0.05 * (1 + age)), 0.0), "age": age})
    path = tmp_path / "log.parquet"
    pq.write_table(table, path)
    saved, fig = tmp_path / "out" / "report.json", tmp_path / "out" / "ess.png"
    code, out, err = cli("diagnose", str(path), "--save", str(saved), "--figure", str(fig), "--no-progress")
    assert code == 0, err
    assert "by sample age:" in out and "what if" in out and "KL drift:" in out
    report = json.loads(saved.read_text())
    assert report["config"]["path"] == str(path)  # saved with its full config
    data = ess_by_age_data(report)
    np.testing.assert_allclose(data["age"], [0, 1, 2, 3])
    assert np.all(data["ess_frac"] <= data["ess_bound"] + 1e-12)  # FreshPER Eq. (11) holds per bucket
    assert fig.stat().st_size > 1000
    # results are never overwritten
    code, _, err = cli("diagnose", str(path), "--save", str(saved), "--no-progress")
    assert code == 2 and "never overwritten" in err and len(err.strip().splitlines()) == 1
    # the figure is rebuilt from the saved report without the log
    fig2 = tmp_path / "again.png"
    code, out, _ = cli("diagnose", "--from-report", str(saved), "--figure", str(fig2))
    assert code == 0 and fig2.stat().st_size > 1000


@pytest.mark.parametrize("args, message", [
    (["missing.parquet"], "log file not found"),
    (["{csv}", "--preset", "nemo"], "preset must be one of default, trl, verl"),
    (["{csv}", "--clip", "0.2,x"], "clip must be comma-separated numbers"),
    (["{csv}", "--tis", "0.5"], "tis values must be finite numbers > 1"),
    (["{csv}", "--columns", "logp_behav"], "columns must be field=name pairs"),
    (["{nan}"], "NaN, null or infinite log-probs"),
    (["{wide}"], "different lengths"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, cli, args, message):
    csv = tmp_path / "ok.csv"
    csv.write_text("seq_id,logp_behav,logp_current\n0,-1.0,-1.1\n0,-0.5,-0.4\n")
    nan = tmp_path / "nan.csv"
    nan.write_text("seq_id,logp_behav,logp_current\n0,-1.0,nan\n")
    wide = tmp_path / "wide.jsonl"
    wide.write_text(json.dumps({"logp_behav": [-1.0, -2.0], "logp_current": [-1.0], "seq_id": 0}) + "\n")
    args = [a.format(csv=csv, nan=nan, wide=wide) for a in args]
    code, out, err = cli("diagnose", *args, "--no-progress")
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_skip_invalid_counts_mismatched_wide_rows(tmp_path, cli):
    path = tmp_path / "wide.jsonl"
    rows = [{"seq_id": 0, "logp_behav": [-1.0, -2.0], "logp_current": [-1.0, -1.5]},
            {"seq_id": 1, "logp_behav": [-1.0, -2.0], "logp_current": [-1.0]},
            {"seq_id": 2, "logp_behav": [-0.5], "logp_current": [-0.7]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, _ = cli("diagnose", str(path), "--skip-invalid", "--json", "--no-progress")
    report = json.loads(out)
    assert code == 0 and report["skipped"]["mismatched_rows"] == 1
    lr = np.array([0.0, 0.5, -0.2])
    assert report["n_tokens"] == 3 and report["n_sequences"] == 2
    assert report["m2"] == pytest.approx(float(np.mean(lr**2)))


@pytest.mark.parametrize("body, message", [
    ("seq_id,logp_behav\n0,-1.0\n", "column 'logp_current' (logp_current) not in"),
    ("seq_id,logp_behav,logp_current\n0,-1.0,0.5\n", "1 tokens with positive log-probs"),
    ("seq_id,logp_behav,logp_current\n0,-1.0,inf\n", "NaN, null or infinite log-probs"),
])
def test_bad_input_with_the_progress_bar_on_is_still_one_line(tmp_path, cli, body, message):
    # without --no-progress: a stderr that is not a terminal gets no bar and no stray blank line
    path = tmp_path / "bad.csv"
    path.write_text(body)
    code, out, err = cli("diagnose", str(path))
    assert code == 2 and out == ""
    assert err.startswith("replay-theory: error: ") and err.count("\n") == 1 and message in err


def test_missing_pyarrow_is_one_line_exit_2(tmp_path, cli, monkeypatch):
    path = tmp_path / "ok.csv"
    path.write_text("seq_id,logp_behav,logp_current\n0,-1.0,-1.1\n")
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)  # import pyarrow -> ImportError
    code, out, err = cli("diagnose", str(path))
    assert code == 2 and out == ""
    assert err == "replay-theory: error: diagnose needs pyarrow to read logs: pip install 'replay-theory[diagnose]'\n"


def test_success_leaves_a_redirected_stderr_empty(tmp_path, cli):
    path = tmp_path / "ok.csv"
    path.write_text("seq_id,logp_behav,logp_current\n0,-1.0,-1.1\n0,-0.5,-0.4\n")
    code, out, err = cli("diagnose", str(path), "--json")
    assert code == 0 and err == ""
    assert json.loads(out)["m2"] == pytest.approx((0.1**2 + 0.1**2) / 2)


def test_example_log_shapes_agree_and_recover_the_known_drift(tmp_path, cli):
    from replay_theory.diagnose.example import example_log, write_example

    reports = {}
    for shape, name, extra in (("default", "log.parquet", []), ("default", "log.csv", []),
                               ("trl", "trl.parquet", ["--preset", "trl", "--columns", "age=version_gap"]),
                               ("verl", "verl.jsonl", ["--preset", "verl", "--columns", "age=version_gap"])):
        write_example(tmp_path / name, shape, seed=3)
        code, out, err = cli("diagnose", str(tmp_path / name), *extra, "--json", "--no-progress")
        assert code == 0, err
        reports[name] = json.loads(out)
    columns, truth = example_log(np.random.default_rng(3))
    lr = columns["logp_current"] - columns["logp_behav"]
    tok = dv.sample_statistics(lr)
    seq_lr = np.bincount(columns["seq_id"], weights=lr)
    for name, report in reports.items():
        assert report["n_tokens"] == lr.size and report["n_sequences"] == seq_lr.size, name
        for key in ("ess_frac", "chi2", "m2", "kl_k3"):
            assert report[key] == pytest.approx(float(tok[key]), rel=1e-9), (name, key)
        assert report["sequence"]["ess_frac"] == pytest.approx(float(dv.ess_kish_fraction(seq_lr)), rel=1e-9)
        assert [b["age"] for b in report["by_age"]] == truth["age"].tolist()
        assert report["drift"]["shape"] == "linear"  # a random walk in the logits
    for bucket, kl in zip(reports["log.parquet"]["by_age"], truth["kl"]):
        sub = lr[columns["age"] == bucket["age"]]
        k3 = np.expm1(sub) - sub
        assert abs(bucket["kl_k3"] - kl) < 5 * k3.std() / np.sqrt(sub.size)  # the sampled KL, within 5 s.e.
    with pytest.raises(ValueError, match="exists"):  # never overwrites
        write_example(tmp_path / "log.parquet")

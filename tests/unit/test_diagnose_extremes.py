"""diagnose on extreme logs (issue 25's new-user rows): exact ratio quantiles past e^+-16, log-ratios of +-1e6 without
a numpy warning, JSON-lines errors on the file's 1-based line, and the --preset a log of another framework needs.

Every expected number is worked out by hand in the comment next to it.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from replay_theory.diagnose import DiagnoseConfig, diagnose, pipeline, reader  # noqa: E402
from replay_theory.diagnose.accumulators import LogRatioHistogram, Running  # noqa: E402
from replay_theory.diagnose.report import render  # noqa: E402

QS = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
NAMES = ("p01", "p05", "p25", "p50", "p75", "p95", "p99")


def _csv(path, behav, cur, per_seq: int = 10) -> str:
    rows = [f"{i // per_seq},{float(b)!r},{float(c)!r}" for i, (b, c) in enumerate(zip(behav, cur))]
    path.write_text("seq_id,logp_behav,logp_current\n" + "\n".join(rows) + "\n")
    return str(path)


def test_half_the_tokens_at_log_r_20_give_quantiles_of_e20_not_the_e16_cap(tmp_path):
    # 500 tokens with log r = -5 - (-25) = 20 exactly, 500 with log r = 0: the inverse empirical CDF is 0 up to
    # p50 and 20 from p75 on; the old histogram stopped at +-16 and printed e^16 = 8.886e6 for p75..p99
    behav = np.full(1000, -25.0)
    cur = np.where(np.arange(1000) < 500, -5.0, -25.0)
    report = diagnose(DiagnoseConfig(path=_csv(tmp_path / "half.csv", behav, cur), run_what_if=False))
    for name in ("p75", "p95", "p99"):
        assert report["log_ratio_quantiles"][name] == 20.0  # the bin [20, 20.001) clamped to the exact max
        assert report["ratio_quantiles"][name] == math.exp(20.0)  # 4.852e8
    for name in ("p01", "p05", "p25", "p50"):
        assert 0.0 <= report["log_ratio_quantiles"][name] <= 1e-3  # the bin [0, 0.001): within one bin width
    assert report["ratio_quantiles_log_error"] == 1e-3
    text = render(report)
    assert "p75 4.85e+08  p95 4.85e+08  p99 4.85e+08" in text and "8.89e+06" not in text
    assert "ratio quantiles: p01 1  p05 1  p25 1  p50 1  p75 4.85e+08" in text  # 1e-3 bins: no error shown


def test_tail_quantiles_are_within_one_bin_of_numpy(tmp_path):
    rng = np.random.default_rng(5)
    lr = rng.normal(scale=30.0, size=6000)  # 59% of the tokens beyond +-16
    behav = -np.maximum(lr, 0.0) - rng.exponential(size=lr.size)
    report = diagnose(DiagnoseConfig(path=_csv(tmp_path / "wide.csv", behav, behav + lr), chunk_rows=777,
                                     run_what_if=False))
    for name, q in zip(NAMES, QS):
        exact = float(np.quantile(behav + lr - behav, q, method="inverted_cdf"))
        assert report["log_ratio_quantiles"][name] == pytest.approx(exact, abs=1.01e-3)
    assert report["ratio_quantiles_log_error"] == 1e-3


def test_the_tail_coarsens_to_its_bin_cap_and_the_report_says_by_how_much(tmp_path, monkeypatch):
    rng = np.random.default_rng(8)
    lr = rng.uniform(20.0, 60.0, size=5000)  # 40 units of log r: 40,000 bins of 1e-3, more than a cap of 64
    hist = LogRatioHistogram(max_tail_bins=64)
    for part in np.array_split(lr, 7):
        hist.update(part.copy())
    assert hist.tail_edges.size <= 64 and hist.tail_counts.sum() == 5000
    # 40 / 64 = 0.625 per bin at least: 1e-3 doubled 10 times (1.024) is the first width that fits
    assert hist.tail_width == 1e-3 * 2**10
    values, widths = hist.quantiles(QS, float(lr.min()), float(lr.max()))
    for v, w, q in zip(values, widths, QS):
        assert w == 1e-3 * 2**10
        assert abs(v - float(np.quantile(lr, q, method="inverted_cdf"))) <= w  # within its bin's width
    # through the pipeline with the same cap: the table says how far each quantile can be off
    monkeypatch.setattr(pipeline, "LogRatioHistogram", lambda: LogRatioHistogram(max_tail_bins=64))
    behav = np.full(lr.size, -70.0)
    report = diagnose(DiagnoseConfig(path=_csv(tmp_path / "tail.csv", behav, behav + lr), run_what_if=False))
    assert report["ratio_quantiles_log_error"] == 1e-3 * 2**10
    assert "ratio quantiles (each within a factor e^1.02 = 2.784):" in render(report)


@pytest.mark.filterwarnings("error")  # a numpy RuntimeWarning fails the test
def test_log_ratios_of_a_million_compute_in_log_space_without_a_warning(tmp_path, cli):
    # tokens alternate log r = -1 - (-1e6) = 999999 and -999999 (log-probs -1 and -1e6), 10 a sequence
    n = 1000
    behav = np.where(np.arange(n) % 2 == 0, -1e6, -1.0)
    cur = np.where(np.arange(n) % 2 == 0, -1.0, -1e6)
    path = _csv(tmp_path / "big.csv", behav, cur)
    report = diagnose(DiagnoseConfig(path=path))
    # r~ = r / mean r is 2 on half the tokens and 0 on the other: KL(new || behav) = E[r~ log r~] = log 2 and
    # D_2 of r~ = log E[r~^2] = log 2; the old log(ratio_mean) = log(inf) made the right side -inf and "NO"
    rel = {r["name"]: r for r in report["bounds"]["token"]}["kl_le_d2"]
    # the KL is C / A - log mean r with both terms near 1e6: 1e-10 is one ulp of them; D_2 of r~ is log(n B / A^2)
    assert rel["lhs"] == pytest.approx(math.log(2), abs=1e-9) and rel["rhs"] == pytest.approx(math.log(2), rel=1e-15)
    assert rel["holds"] is True
    assert report["log_ratio_quantiles"]["p01"] == pytest.approx(-999999.0, abs=1e-3)  # in the bin of -999999
    assert report["log_ratio_quantiles"]["p99"] == 999999.0  # clamped to the exact max
    assert report["ratio_quantiles"]["p99"] is None  # e^999999 is past float64: null in the JSON
    assert report["ratio_quantiles"]["p01"] == 0.0  # and e^-999999 below it
    fw = report["framework"]
    # each sequence: mean log p = -(5 * 1 + 5 * 1e6) / (10 + 1e-8) on both sides; verl's perplexity e^{500000.5}
    # overflows float64 (null), its log and ppl_ratio = e^0 = 1 do not
    assert fw["rollout_corr/training_log_ppl"] == pytest.approx(5_000_005 / (10 + 1e-8), rel=1e-12)
    assert fw["rollout_corr/training_ppl"] is None and fw["rollout_corr/rollout_ppl"] is None
    assert fw["rollout_corr/ppl_ratio"] == 1.0
    code, out, err = cli("diagnose", path, "--no-progress")
    assert (code, err) == (0, "")  # nothing on stderr: no RuntimeWarning reaches the user
    assert "ratio quantiles: p01 e^-1e+06  p05 e^-1e+06  p25 e^-1e+06  p50 e^-1e+06  p75 e^1e+06  p95 e^1e+06  " \
           "p99 e^1e+06" in out


def test_running_means_of_exponentials_in_log_space():
    x = np.array([[1.0, 2.0, -3.0, 800.0], [0.5, -0.5, 0.25, 0.0]])  # (2, 4): e^800 overflows float64
    run = Running(("logs", "plain"), exp_of=("logs",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run.update(x[:, :2])
        run.update(x[:, 2:])
    logs = run["logs"]
    # log mean e^x = 800 + log((e^{-799} + e^{-798} + e^{-803} + 1) / 4)
    expected = 800.0 + math.log((math.exp(-799) + math.exp(-798) + math.exp(-803) + 1.0) / 4)
    assert logs.log_mean_exp == pytest.approx(expected, rel=1e-15) and logs.mean_exp == math.inf
    assert logs.total == 800.0 and logs.std == pytest.approx(float(np.std(x[0], ddof=1)), rel=1e-12)
    small = Running(("logs",), exp_of=("logs",))
    small.update(x[1:])
    assert small["logs"].mean_exp == pytest.approx(float(np.mean(np.exp(x[1]))), rel=1e-14)
    assert math.isnan(run["plain"].log_mean_exp)  # not asked for


def _jsonl(path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _rows(n: int) -> list[str]:
    return [json.dumps({"seq_id": i // 10, "logp_behav": -1.0, "logp_current": -1.25}) for i in range(n)]


def test_a_malformed_json_line_is_named_by_its_1_based_line(tmp_path, error_line):
    lines = _rows(100) + ['{"seq_id": 10, "logp_behav": -1.0, "logp_current": '] + _rows(5)
    path = _jsonl(tmp_path / "bad.jsonl", lines)
    # the 101st line is cut off after "logp_current": ; pyarrow called it row 100 (0-based, and read it as one with
    # the next line); Python's parser names the column where the value is missing
    assert error_line("diagnose", path) == "cannot read bad.jsonl as jsonl: line 101 is not JSON (Expecting value, " \
                                           "column 52)"


def test_a_bad_line_past_the_head_is_named_by_its_line_across_blocks_and_blank_lines(tmp_path, monkeypatch,
                                                                                     error_line):
    monkeypatch.setattr(reader, "BLOCK_BYTES", 1 << 16)  # many pyarrow blocks before the error: its row restarts at 0
    lines = _rows(30000)
    lines.insert(7, "")  # pyarrow skips blank lines in its row count; the file's line number does not
    lines.insert(25000, "   ")
    lines[28000] = json.dumps({"seq_id": 2799, "logp_behav": "oops", "logp_current": -1.0})
    path = _jsonl(tmp_path / "late.jsonl", lines)  # 1.7 MB: line 28001 is past the 1 MiB head read for the schema
    assert error_line("diagnose", path, "--no-progress") == (
        "cannot read late.jsonl: JSON parse error: Column(/logp_behav) changed from number to string on line 28001")


def _trl_log(path) -> str:
    """Two rows with the TRL preset's columns (what DiagnoseLogCallback writes), not the default preset's."""
    pq.write_table(pa.table({"sampling_per_token_logps": [[-1.0, -2.0], [-0.5]], "per_token_logps": [[-1.1, -2.0],
                                                                                                     [-0.4]],
                             "completion_mask": [[1, 1], [1]], "age": [0, 1], "advantages": [1.0, -1.0]}), path)
    return str(path)


@pytest.mark.parametrize("command", [["diagnose"], ["calibrate", "--from-log"]])
def test_a_trl_log_without_preset_is_told_to_pass_preset_trl(tmp_path, error_line, command):
    log = _trl_log(tmp_path / "run.parquet")
    extra = ["--out", str(tmp_path / "p.json")] if command[0] == "calibrate" else []
    assert error_line(*command, log, *extra) == (
        "column 'logp_behav' (logp_behav) not in run.parquet (columns: sampling_per_token_logps, per_token_logps, "
        "completion_mask, age, advantages); this log has the trl preset's columns: pass --preset trl")
    assert not (tmp_path / "p.json").exists()

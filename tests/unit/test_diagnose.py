"""replay-theory diagnose: streamed statistics against the theory module, what-if, drift, bad input.

Fast tier; the slower tests of this module (a multi-row-group Parquet read) are in
tests/integration/test_diagnose_parquet.py.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.csv as pa_csv  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from replay_theory.checks import require_integer, require_one_of  # noqa: E402
from replay_theory.core.losses import m2po_mask  # noqa: E402
from replay_theory.diagnose import DiagnoseConfig, WhatIfConfig, diagnose  # noqa: E402
from replay_theory.diagnose.accumulators import Moments  # noqa: E402
from replay_theory.diagnose.drift import fit_kl_drift  # noqa: E402
from replay_theory.diagnose.errors import ConfigError, check_field  # noqa: E402
from replay_theory.diagnose.schema import resolve_columns  # noqa: E402
from replay_theory.theory import divergences as dv  # noqa: E402
from replay_theory.theory.bounds import sample_relations  # noqa: E402

TOKEN_KEYS = ("kl_k1", "kl_k2", "kl_k3", "m2", "d2", "chi2", "ess_frac")


def _policy_pair(rng: np.random.Generator, vocab: int = 12, shift: float = 0.3):
    """log pi_behav and log pi_current over a small vocabulary (a known pair)."""
    logits_b = rng.normal(size=vocab)
    logits_c = logits_b + shift * rng.normal(size=vocab)
    log_b = logits_b - np.logaddexp.reduce(logits_b)
    log_c = logits_c - np.logaddexp.reduce(logits_c)
    return log_b, log_c


def _sample_log(rng, n_seq: int, length: int, log_b, log_c, ages=None):
    """Long-layout columns: tokens drawn from pi_behav, both log-probs recorded."""
    tok = rng.choice(log_b.size, size=(n_seq, length), p=np.exp(log_b))  # (n_seq, L)
    cols = {
        "seq_id": np.repeat(np.arange(n_seq), length),
        "logp_behav": log_b[tok].ravel(),
        "logp_current": log_c[tok].ravel(),
    }
    if ages is not None:
        cols["age"] = np.repeat(np.asarray(ages, dtype=np.float64), length)
    return cols


def _write(path, cols: dict, fmt: str) -> str:
    table = pa.Table.from_pydict({k: pa.array(v) for k, v in cols.items()})
    if fmt == "parquet":
        pq.write_table(table, path, row_group_size=997)
    elif fmt == "csv":
        pa_csv.write_csv(table, path)
    else:
        with open(path, "w") as fh:
            for row in table.to_pylist():
                fh.write(json.dumps(row) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def pair():
    return _policy_pair(np.random.default_rng(0))


# --------------------------------------------------------------------------- exact agreement with the theory module
@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
@pytest.mark.parametrize("chunk_rows", [7, 1000, 1 << 20])
def test_streamed_statistics_equal_theory_sample_statistics(tmp_path, pair, fmt, chunk_rows):
    rng = np.random.default_rng(1)
    cols = _sample_log(rng, 300, 9, *pair)
    path = _write(tmp_path / f"log.{fmt}", cols, fmt)
    report = diagnose(DiagnoseConfig(path=path, chunk_rows=chunk_rows, run_what_if=False))
    lr = cols["logp_current"] - cols["logp_behav"]
    expected = dv.sample_statistics(lr)
    assert report["n_tokens"] == lr.size == 2700
    for key in TOKEN_KEYS:
        assert report[key] == pytest.approx(float(expected[key]), rel=1e-10, abs=1e-13), key
    ratio = dv.ratio_stats(lr)
    for key in ("min", "mean", "max", "std"):
        assert report[f"ratio_{key}"] == pytest.approx(float(ratio[f"is_ratio_{key}"]), rel=1e-9), key
    # the sequence level: sum of token log-ratios per sequence, then the same estimators
    seq_lr = lr.reshape(300, 9).sum(axis=1)
    seq_expected = dv.sample_statistics(seq_lr)
    assert report["n_sequences"] == report["sequence"]["n_sequences"] == 300
    for key in TOKEN_KEYS:
        assert report["sequence"][key] == pytest.approx(float(seq_expected[key]), rel=1e-10, abs=1e-13), key


def test_statistics_converge_to_the_exact_values_of_the_policy_pair(tmp_path, pair):
    """Tokens drawn from pi_behav: the sample estimators approach the exact categorical values."""
    log_b, log_c = pair
    cols = _sample_log(np.random.default_rng(2), 20000, 10, log_b, log_c)
    report = diagnose(DiagnoseConfig(path=_write(tmp_path / "log.parquet", cols, "parquet"), run_what_if=False))
    kl = float(dv.kl_exact(log_b, log_c))  # KL(behav || current), what k1/k2/k3 estimate
    assert report["kl_k1"] == pytest.approx(kl, rel=0.05)
    assert report["kl_k3"] == pytest.approx(kl, rel=0.05)
    assert report["m2"] == pytest.approx(float(dv.m2_exact(log_c, log_b)), rel=0.03)
    assert report["chi2"] == pytest.approx(float(dv.chi2_exact(log_c, log_b)), rel=0.05)
    assert report["d2"] == pytest.approx(float(dv.d2_exact(log_c, log_b)), rel=0.05)
    assert report["ess_frac"] == pytest.approx(float(dv.ess_fraction_exact(log_c, log_b)), abs=0.01)
    # i.i.d. tokens: the sequence of L = 10 has D_2 = 10 D_2(token), ESS fraction e^{-10 D_2}
    d2_seq = 10 * float(dv.d2_exact(log_c, log_b))
    assert report["sequence"]["d2"] == pytest.approx(d2_seq, rel=0.15)
    assert report["sequence"]["ess_frac"] == pytest.approx(math.exp(-d2_seq), abs=0.05)
    assert report["kl_new_behav"] == pytest.approx(float(dv.kl_exact(log_c, log_b)), rel=0.05)


def test_bounds_equal_theory_sample_relations(tmp_path, pair):
    cols = _sample_log(np.random.default_rng(3), 200, 6, *pair)
    report = diagnose(DiagnoseConfig(path=_write(tmp_path / "log.parquet", cols, "parquet"), chunk_rows=50,
                                     run_what_if=False))
    lr = cols["logp_current"] - cols["logp_behav"]
    theory = {r.name: r for r in sample_relations(lr)}
    mine = {r["name"]: r for r in report["bounds"]["token"]}
    for name in ("ess_bound_kl", "kl_le_d2", "m2po_sharp", "m2po_thm51"):
        assert mine[name]["holds"] and theory[name].ok, name
        assert mine[name]["lhs"] == pytest.approx(float(theory[name].lhs), rel=1e-9), name
        assert mine[name]["rhs"] == pytest.approx(float(theory[name].rhs), rel=1e-9), name
        assert mine[name]["slack"] == pytest.approx(float(theory[name].slack), rel=1e-6, abs=1e-12), name


def test_fresh_data_gives_exact_zeros_and_full_ess(tmp_path, pair):
    log_b, _ = pair
    cols = _sample_log(np.random.default_rng(4), 50, 5, log_b, log_b)
    report = diagnose(DiagnoseConfig(path=_write(tmp_path / "log.parquet", cols, "parquet"), chunk_rows=13))
    assert report["ess_frac"] == 1.0 and report["sequence"]["ess_frac"] == 1.0
    for key in ("kl_k1", "kl_k2", "kl_k3", "m2", "d2", "chi2"):
        assert report[key] == 0.0, key
    assert report["ratio_min"] == report["ratio_max"] == 1.0


def test_long_sequences_never_overflow(tmp_path):
    """8192 tokens at log r = +0.5: sequence log-ratio 4096, far beyond float range as a ratio."""
    n_seq, length = 4, 8192
    behav = np.full(n_seq * length, -1.0)
    current = behav + np.repeat([0.5, 0.5, 0.0, -0.5], length)
    cols = {"seq_id": np.repeat(np.arange(n_seq), length), "logp_behav": behav, "logp_current": current}
    with np.errstate(over="raise", invalid="raise"):  # an overflow or NaN warning would raise here
        report = diagnose(DiagnoseConfig(path=_write(tmp_path / "long.parquet", cols, "parquet"), chunk_rows=3000,
                                         run_what_if=False))
    seq = report["sequence"]
    seq_lr = np.array([4096.0, 4096.0, 0.0, -4096.0])
    assert seq["d2"] == pytest.approx(float(dv.d2_estimate(seq_lr)), rel=1e-12)  # 8192 - log 2, finite
    assert seq["d2"] == pytest.approx(8192 + math.log(2 / 4), rel=1e-12)
    assert seq["ess_frac"] == pytest.approx(float(dv.ess_kish_fraction(seq_lr)), rel=1e-12)  # = 1/2
    assert seq["chi2"] is None and seq["ratio_max"] is None  # e^{4096}: reported as null (inf), no crash
    assert seq["kl_k1"] == pytest.approx(-1024.0)


# --------------------------------------------------------------------------- age buckets, drift
def test_by_age_matches_subsets_and_buckets_merge_exactly(tmp_path, pair):
    rng = np.random.default_rng(5)
    ages = rng.integers(0, 40, size=400)
    cols = _sample_log(rng, 400, 5, *pair, ages=ages)
    path = _write(tmp_path / "log.parquet", cols, "parquet")
    lr = cols["logp_current"] - cols["logp_behav"]
    few = diagnose(DiagnoseConfig(path=path, chunk_rows=333, max_age_buckets=64, run_what_if=False))
    assert [b["age"] for b in few["by_age"]] == sorted(set(ages.astype(float).tolist()))
    for bucket in few["by_age"]:
        sub = lr[cols["age"] == bucket["age"]]
        assert bucket["n_tokens"] == sub.size
        assert bucket["ess_frac"] == pytest.approx(float(dv.ess_kish_fraction(sub)), rel=1e-10)
        assert bucket["kl_k3"] == pytest.approx(float(dv.kl_k3(sub)), rel=1e-10, abs=1e-15)
    merged = diagnose(DiagnoseConfig(path=path, chunk_rows=333, max_age_buckets=4, run_what_if=False))
    assert 1 < len(merged["by_age"]) <= 4
    assert sum(b["n_tokens"] for b in merged["by_age"]) == lr.size
    for bucket in merged["by_age"]:
        inside = (cols["age"] >= bucket["age_min"]) & (cols["age"] <= bucket["age_max"])
        expected = dv.sample_statistics(lr[inside])
        for key in TOKEN_KEYS:
            assert bucket[key] == pytest.approx(float(expected[key]), rel=1e-10, abs=1e-14), key


def test_moments_fold_is_order_free():
    rng = np.random.default_rng(6)
    lr = rng.normal(scale=3.0, size=1000)
    whole = Moments.from_samples(lr).statistics()
    parts = Moments.empty(1)
    for piece in np.array_split(lr[::-1], 7):
        parts.fold(Moments.from_samples(piece))
    for key, value in parts.statistics().items():
        assert value[0] == pytest.approx(whole[key][0], rel=1e-12), key


def test_drift_fit_recovers_linear_and_quadratic_laws():
    ages = np.arange(8.0)
    counts = np.full(8, 100.0)
    linear = fit_kl_drift(ages, 0.002 + 0.01 * ages, counts)
    assert linear["shape"] == "linear"
    assert linear["rate_per_step"] == pytest.approx(0.01)
    assert linear["tau"] == pytest.approx(100.0)  # FreshPER Eq. (13): tau = 1 / c
    assert linear["floor"] == pytest.approx(0.002)
    quad = fit_kl_drift(ages, 0.003 * ages**2, counts)
    assert quad["shape"] == "quadratic"
    assert quad["quadratic"]["coef"] == pytest.approx(0.003)
    assert quad["exponent"] == pytest.approx(2.0)
    assert fit_kl_drift(np.array([1.0]), np.array([0.1]), np.array([5.0]))["shape"] == "undetermined"
    assert fit_kl_drift(ages, np.zeros(8), counts)["tau"] == math.inf  # no drift: standard PER


def test_drift_shape_end_to_end(tmp_path):
    """Steady parameter drift (tilt proportional to age) gives KL ~ age^2; a random walk gives KL ~ age."""
    rng = np.random.default_rng(7)
    vocab, n_seq, length = 10, 1600, 8
    base = rng.normal(size=vocab)
    direction = rng.normal(size=vocab)
    ages = np.repeat(np.arange(8), n_seq // 8)

    def make(scale_of_age):
        log_b = base - np.logaddexp.reduce(base)
        tok = rng.choice(vocab, size=(n_seq, length), p=np.exp(log_b))
        cur_logits = base[None, :] + scale_of_age(ages)[:, None] * direction[None, :]  # (n_seq, vocab)
        log_c = cur_logits - np.logaddexp.reduce(cur_logits, axis=1, keepdims=True)
        return {"seq_id": np.repeat(np.arange(n_seq), length), "logp_behav": log_b[tok].ravel(),
                "logp_current": np.take_along_axis(log_c, tok, axis=1).ravel(),
                "age": np.repeat(ages.astype(float), length)}

    steady = diagnose(DiagnoseConfig(path=_write(tmp_path / "s.parquet", make(lambda a: 0.05 * a), "parquet"),
                                     run_what_if=False))
    walk = diagnose(DiagnoseConfig(path=_write(tmp_path / "w.parquet", make(lambda a: 0.1 * np.sqrt(a)),
                                               "parquet"), run_what_if=False))
    assert steady["drift"]["shape"] == "quadratic" and steady["drift"]["exponent"] > 1.6
    assert walk["drift"]["shape"] == "linear" and 0.7 < walk["drift"]["exponent"] < 1.3
    assert walk["drift"]["tau"] == pytest.approx(1.0 / walk["drift"]["rate_per_step"])


# --------------------------------------------------------------------------- what-if
def _what_if(report, correction, level, param):
    rows = [r for r in report["what_if"] if r["correction"] == correction and r["level"] == level
            and (r["param"] == param or (param is not None and r["param"] is not None
                                         and abs(r["param"] - param) < 1e-12))]
    assert len(rows) == 1, (correction, level, param)
    return rows[0]


def test_what_if_hand_computed(tmp_path):
    r = np.array([0.6, 1.0, 1.5, 3.0])
    cols = {"seq_id": np.arange(4), "logp_behav": np.full(4, -2.0), "logp_current": -2.0 + np.log(r),
            "advantage": np.array([1.0, -1.0, 1.0, 1.0])}
    report = diagnose(DiagnoseConfig(path=_write(tmp_path / "h.parquet", cols, "parquet"),
                                     what_if=WhatIfConfig(ppo_clip=(0.2,), tis=(2.0,), mask=(2.0,), m2po=(0.04,),
                                                          freshper_tau=())))
    clip = _what_if(report, "ppo_clip", "token", 0.2)  # r = 1.5 and 3 with A > 0 lose their gradient
    assert clip["flagged_frac"] == pytest.approx(0.5)
    assert clip["ess_frac"] == pytest.approx(1.6**2 / (4 * (0.36 + 1.0)))
    assert clip["bias_proxy"] == pytest.approx((1.5 + 3.0) / 4)
    tis = _what_if(report, "tis", "token", 2.0)  # w = min(r, 2)
    assert tis["flagged_frac"] == pytest.approx(0.25)
    assert tis["ess_frac"] == pytest.approx(5.1**2 / (4 * (0.36 + 1 + 2.25 + 4)))
    assert tis["bias_proxy"] == pytest.approx((3.0 - 2.0) / 4)  # E[(r - c)_+]
    mask = _what_if(report, "mask", "token", 2.0)  # r outside [1/2, 2]: only 3
    assert mask["flagged_frac"] == pytest.approx(0.25)
    assert mask["ess_frac"] == pytest.approx(3.1**2 / (4 * (0.36 + 1 + 2.25)))
    # one token per sequence: sequence truncation equals token truncation
    seq_tis = _what_if(report, "tis", "sequence", 2.0)
    assert seq_tis["ess_frac"] == pytest.approx(tis["ess_frac"]) and seq_tis["bias_proxy"] == pytest.approx(0.25)
    none = _what_if(report, "none", "token", None)
    assert none["ess_frac"] == pytest.approx(float(dv.ess_kish_fraction(np.log(r))))


@pytest.mark.parametrize("variant", ["algorithm1", "reference"])
def test_what_if_m2po_equals_the_loss_mask_per_block(tmp_path, variant):
    rng = np.random.default_rng(8)
    n = 600
    lr = rng.normal(scale=0.4, size=n)
    adv = np.repeat(rng.normal(size=n // 6), 6)
    cols = {"seq_id": np.repeat(np.arange(n // 6), 6), "logp_behav": np.full(n, -3.0), "logp_current": -3.0 + lr,
            "advantage": adv}
    block = 250
    report = diagnose(DiagnoseConfig(path=_write(tmp_path / "m.parquet", cols, "parquet"), chunk_rows=77,
                                     what_if=WhatIfConfig(m2po=(0.04,), m2po_batch_tokens=block)))
    keep = np.concatenate([m2po_mask(lr[None, None, s:s + block], adv[None, None, s:s + block],
                                     np.ones((1, 1, min(block, n - s)), dtype=bool), 0.04, variant)[0, 0]
                           for s in range(0, n, block)])
    row = _what_if(report, f"m2po_{variant}", "token", 0.04)
    assert 0 < row["flagged_frac"] == pytest.approx(np.mean(~keep))
    assert row["ess_frac"] == pytest.approx(float(dv.ess_kish(np.where(keep, lr, -np.inf))) / n, rel=1e-10)


def test_what_if_freshper_from_age_sums(tmp_path, pair):
    rng = np.random.default_rng(9)
    ages = rng.integers(0, 6, size=300)
    cols = _sample_log(rng, 300, 4, *pair, ages=ages)
    report = diagnose(DiagnoseConfig(path=_write(tmp_path / "f.parquet", cols, "parquet"),
                                     what_if=WhatIfConfig(freshper_tau=(3.0,))))
    lr = cols["logp_current"] - cols["logp_behav"]
    row = _what_if(report, "freshper", "token", 3.0)
    assert row["ess_frac"] == pytest.approx(float(dv.ess_kish_fraction(lr - cols["age"] / 3.0)), rel=1e-10)
    assert row["mean_age_weight"] == pytest.approx(float(np.mean(np.exp(-cols["age"] / 3.0))))
    # the fitted tau joins the table when the drift is positive (tau finite; null = inf = no decay)
    fitted = report["drift"]["tau"]
    taus = [r["param"] for r in report["what_if"] if r["correction"] == "freshper"]
    assert taus == ([3.0] if fitted is None else [3.0, pytest.approx(fitted)])


def test_what_if_without_advantages_or_ages_says_so(tmp_path, pair):
    cols = _sample_log(np.random.default_rng(10), 20, 3, *pair)
    report = diagnose(DiagnoseConfig(path=_write(tmp_path / "n.parquet", cols, "parquet")))
    notes = {r["correction"]: r.get("note") for r in report["what_if"] if r.get("note")}
    assert notes == {"m2po": "needs an advantage column", "freshper": "needs an age column"}
    assert report["by_age"] == [] and report["drift"] is None


# --------------------------------------------------------------------------- bad input
def test_invalid_values_raise_or_are_counted(tmp_path, pair):
    cols = _sample_log(np.random.default_rng(11), 10, 4, *pair)
    cols["logp_current"] = cols["logp_current"].copy()
    cols["logp_current"][5] = np.nan  # sequence 1
    cols["logp_behav"] = cols["logp_behav"].copy()
    cols["logp_behav"][9] = 0.3  # sequence 2: a positive log-prob
    cols["logp_behav"][13] = 5e-7  # round-off: read as 0, not an error
    path = _write(tmp_path / "bad.parquet", cols, "parquet")
    with pytest.raises(ValueError, match=r"1 tokens with NaN, null or infinite log-probs.*--skip-invalid"):
        diagnose(DiagnoseConfig(path=path))
    report = diagnose(DiagnoseConfig(path=path, skip_invalid=True, run_what_if=False))
    assert report["skipped"]["nan_or_inf_logp"] == 1 and report["skipped"]["positive_logp"] == 1
    assert report["skipped"]["sequences_excluded"] == 2
    assert report["n_tokens"] == 38 and report["sequence"]["n_sequences"] == 8
    keep = np.ones(40, dtype=bool)
    keep[[5, 9]] = False
    lr = np.minimum(cols["logp_current"][keep], 0) - np.minimum(cols["logp_behav"][keep], 0)
    assert report["ess_frac"] == pytest.approx(float(dv.ess_kish_fraction(lr)), rel=1e-12)


def test_missing_columns_and_bad_options(tmp_path, pair):
    cols = _sample_log(np.random.default_rng(12), 5, 2, *pair)
    cols["old_logp"] = cols.pop("logp_behav")
    path = _write(tmp_path / "c.csv", cols, "csv")
    with pytest.raises(ValueError, match=r"column 'logp_behav' \(logp_behav\) not in c.csv.*--columns logp_behav="):
        diagnose(DiagnoseConfig(path=path))
    report = diagnose(DiagnoseConfig(path=path, columns="logp_behav=old_logp", run_what_if=False))
    assert report["n_tokens"] == 10 and report["columns"]["logp_behav"] == "old_logp"
    with pytest.raises(ValueError, match="unknown field 'logp_old'"):
        resolve_columns("default", "logp_old=x")
    with pytest.raises(ValueError, match="preset must be one of default, trl, verl"):
        resolve_columns("openrlhf")
    with pytest.raises(ValueError, match=r"^ppo_clip values must be finite numbers in \(0, 1\), got 1.5$"):
        WhatIfConfig(ppo_clip=(1.5,))
    with pytest.raises(ValueError, match="not found"):
        diagnose(DiagnoseConfig(path=str(tmp_path / "nope.parquet")))
    (tmp_path / "x.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="cannot read x.parquet as parquet"):
        diagnose(DiagnoseConfig(path=str(tmp_path / "x.parquet")))


def test_ratio_quantiles_within_one_bin_of_numpy(tmp_path, pair):
    rng = np.random.default_rng(13)
    behav = -rng.exponential(size=4000)
    lr = rng.normal(scale=0.3, size=4000)  # continuous, so every quantile is well defined
    cols = {"seq_id": np.arange(4000) // 8, "logp_behav": behav - np.maximum(lr, 0), "logp_current": behav}
    cols["logp_current"] = cols["logp_behav"] + lr
    report = diagnose(DiagnoseConfig(path=_write(tmp_path / "q.parquet", cols, "parquet"), chunk_rows=999,
                                     run_what_if=False))
    for name, q in (("p01", 0.01), ("p25", 0.25), ("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        # 1e-3-wide log r bins: within one bin of the order statistic (the inverse empirical CDF)
        assert math.log(report["ratio_quantiles"][name]) == pytest.approx(
            float(np.quantile(lr, q, method="inverted_cdf")), abs=1.01e-3)
    log_b, log_c = pair
    exact = diagnose(DiagnoseConfig(path=_write(tmp_path / "p.parquet", _sample_log(rng, 2000, 8, log_b, log_c),
                                                "parquet"), run_what_if=False))
    assert exact["ratio_mean"] == pytest.approx(1.0, abs=0.03)  # E_behav[r] = 1 for an exact pair


# --------------------------------------------------------------------------- TRL's tool_mask
def _multi_turn_batch():
    """Three TRL-shaped rows (wide): model tokens, tool-result tokens (sampling log-prob 0, tool_mask 0), padding.

    The model's log-prob of a tool-result token is far below 0 (it did not write it), so counting it would give a
    ratio near exp(-8) = 3.4e-4: the 489,877-token / min-ratio-0.0004 report of issue 14.
    """
    behav = [[-0.5, -1.0, 0.0, 0.0, -0.2, 0.0],  # tokens 2-3 a tool result, token 5 padding
             [-0.3, -0.7, -0.9, 0.0, 0.0, 0.0],  # tokens 3-5 padding
             [-1.2, 0.0, -0.4, -0.6, 0.0, 0.0]]  # token 1 a tool result, tokens 4-5 padding
    current = [[-0.6, -0.8, -8.0, -7.5, -0.1, -3.0],
               [-0.1, -0.9, -1.1, -2.0, -2.0, -2.0],
               [-1.5, -9.0, -0.4, -0.5, -2.0, -2.0]]
    completion = [[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]]
    tool = [[1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1], [1, 0, 1, 1, 1, 1]]  # TRL pads tool_mask with 1
    return (np.array(behav), np.array(current), np.array(completion), np.array(tool))


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_trl_preset_multiplies_in_the_tool_mask(tmp_path, fmt):
    behav, current, completion, tool = _multi_turn_batch()
    cols = {"sampling_per_token_logps": list(behav), "per_token_logps": list(current),
            "completion_mask": list(completion), "tool_mask": list(tool), "advantages": [0.5, -1.0, 1.5]}
    report = diagnose(DiagnoseConfig(path=_write(tmp_path / f"t.{fmt}", cols, fmt), preset="trl"))
    # model tokens only: row 0 -> (0, 1, 4), row 1 -> (0, 1, 2), row 2 -> (0, 2, 3)
    lr = np.array([-0.1, 0.2, 0.1, 0.2, -0.2, -0.2, -0.3, 0.0, 0.1])
    assert report["n_tokens"] == int((completion * tool).sum()) == 9
    assert report["ratio_min"] == pytest.approx(math.exp(-0.3), rel=1e-12)  # row 2 token 0, not exp(-9)
    assert report["ratio_max"] == pytest.approx(math.exp(0.2), rel=1e-12)
    assert report["ess_frac"] == pytest.approx(float(dv.ess_kish_fraction(lr)), rel=1e-12)
    assert report["kl_k3"] == pytest.approx(float(np.mean(np.expm1(lr) - lr)), rel=1e-12)
    seq_lr = np.array([-0.1 + 0.2 + 0.1, 0.2 - 0.2 - 0.2, -0.3 + 0.0 + 0.1])
    assert report["sequence"]["ess_frac"] == pytest.approx(float(dv.ess_kish_fraction(seq_lr)), rel=1e-12)
    assert report["columns"]["tool_mask"] == "tool_mask"

    # without the tool_mask column: exactly what the completion mask alone gives (tool tokens counted)
    del cols["tool_mask"]
    plain = diagnose(DiagnoseConfig(path=_write(tmp_path / f"p.{fmt}", cols, fmt), preset="trl"))
    lr_all = (current - behav)[completion.astype(bool)]
    assert "tool_mask" not in plain["columns"]
    assert plain["n_tokens"] == int(completion.sum()) == 12
    assert plain["ratio_min"] == pytest.approx(math.exp(-9.0), rel=1e-12)  # the tool token the mask would drop
    assert plain["ess_frac"] == pytest.approx(float(dv.ess_kish_fraction(lr_all)), rel=1e-12)
    # ... and dropping the preset's tool_mask by hand on the first file gives the same as the file without it
    dropped = diagnose(DiagnoseConfig(path=str(tmp_path / f"t.{fmt}"), preset="trl", columns="tool_mask="))
    for key in ("n_tokens", "ratio_min", "ess_frac", "kl_k3", "m2"):
        assert dropped[key] == plain[key], key


def test_tool_mask_also_acts_in_the_long_layout(tmp_path):
    behav, current, completion, tool = _multi_turn_batch()
    rows, cols = completion.astype(bool), {}
    cols["seq_id"] = np.nonzero(rows)[0]
    cols["logp_behav"], cols["logp_current"] = behav[rows], current[rows]
    cols["tool"] = tool[rows]
    path = _write(tmp_path / "long.csv", cols, "csv")
    masked = diagnose(DiagnoseConfig(path=path, columns="tool_mask=tool", run_what_if=False))
    assert masked["n_tokens"] == 9 and masked["ratio_min"] == pytest.approx(math.exp(-0.3), rel=1e-12)
    default = diagnose(DiagnoseConfig(path=path, run_what_if=False))  # the default preset maps no tool_mask
    assert default["n_tokens"] == 12 and default["ratio_min"] == pytest.approx(math.exp(-9.0), rel=1e-12)


def test_sequence_ids_spread_over_chunks_keep_one_code_each(tmp_path):
    # String seq_ids that come back in later chunks, and later chunks with longer ids (a wider numpy string dtype):
    # every sequence keeps one code, so its token log-ratios add up to the right sequence ratio at any chunk size.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from replay_theory.diagnose import DiagnoseConfig, diagnose

    rng = np.random.default_rng(3)
    n = 600
    ids = np.array([f"s{int(k)}" for k in rng.integers(0, 40, size=n)] , dtype=object)
    ids[400:] = [f"sequence-with-a-long-name-{int(k)}" for k in rng.integers(0, 7, size=n - 400)]
    behav = -rng.exponential(1.0, size=n)
    current = behav + 0.2 * rng.normal(size=n)
    path = tmp_path / "log.parquet"
    pq.write_table(pa.table({"seq_id": ids.tolist(), "logp_behav": behav, "logp_current": np.minimum(current, 0)}),
                   path)
    lr = np.minimum(current, 0) - behav
    by_seq = {}
    for k, v in zip(ids, lr):
        by_seq[k] = by_seq.get(k, 0.0) + v
    seq_lr = np.array(list(by_seq.values()))
    for chunk_rows in (7, 64, 100_000):
        report = diagnose(DiagnoseConfig(path=str(path), chunk_rows=chunk_rows, run_what_if=False))
        assert report["sequence"]["n_sequences"] == len(by_seq)
        assert report["sequence"]["kl_k1"] == pytest.approx(float(-seq_lr.mean()), rel=1e-12)
        assert report["sequence"]["m2"] == pytest.approx(float((seq_lr ** 2).mean()), rel=1e-12)


def test_check_field_raises_the_checks_message_as_a_config_error_on_the_field():
    assert check_field(require_integer, "draws", 3, 2) == 3
    with pytest.raises(ConfigError) as err:
        check_field(require_integer, "draws", 1, 2)
    assert (err.value.field, err.value.detail) == ("draws", "must be an integer >= 2, got 1")
    assert str(err.value) == "draws must be an integer >= 2, got 1"
    assert err.value.named("--draws") == "--draws must be an integer >= 2, got 1"
    with pytest.raises(ConfigError) as err:
        check_field(require_one_of, "score", "x", ("logit", "constant"))
    assert err.value.named("--score") == "--score must be one of logit, constant, got 'x'"

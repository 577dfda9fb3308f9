"""TRL / verl / M2PO logged metrics (diagnose/framework_stats.py): hand-computed cases, naive-loop
transcriptions of the frameworks' code, streamed == batch, extreme log-ratios, and the new what-if rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from replay_theory.diagnose import DiagnoseConfig, diagnose  # noqa: E402
from replay_theory.diagnose.framework_stats import framework_statistics  # noqa: E402

EPS = 1e-8  # verl masked_mean


def _naive(behav, cur, mask, adv, lo=0.2, hi=0.28, c=3.0, cap=3.0, C=2.0):
    """Loop transcription of verl compute_offpolicy_metrics / compute_is_metrics (token) / vanilla loss,
    TRL _generate_and_score_completions + compute_loss, M2PO _get_trust_region_tokens_delta_sq."""
    B, T = behav.shape
    out = {}
    rows = []
    for b in range(B):
        idx = [t for t in range(T) if mask[b, t]]
        n = len(idx)
        rows.append((idx, sum(cur[b, t] for t in idx) / (n + EPS), sum(behav[b, t] for t in idx) / (n + EPS)))
    N = sum(len(r[0]) for r in rows)
    out["rollout_corr/training_ppl"] = sum(math.exp(-mc) for _, mc, _ in rows) / B
    out["rollout_corr/rollout_ppl"] = sum(math.exp(-mb) for _, _, mb in rows) / B
    diffs = [mb - mc for _, mc, mb in rows]
    out["rollout_corr/log_ppl_diff"] = sum(diffs) / B
    out["rollout_corr/log_ppl_abs_diff"] = sum(abs(d) for d in diffs) / B
    out["rollout_corr/ppl_ratio"] = sum(math.exp(d) for d in diffs) / B
    out["rollout_corr/kl"] = sum(behav[b, t] - cur[b, t] for b in range(B) for t in rows[b][0]) / (N + EPS)
    w = {(b, t): math.exp(min(max(cur[b, t] - behav[b, t], -20), 20)) for b in range(B) for t in rows[b][0]}
    out["rollout_corr/chi2_token"] = sum(v * v for v in w.values()) / (N + EPS) - 1
    out["rollout_corr/rollout_is_mean"] = sum(w.values()) / (N + EPS)
    out["rollout_corr/rollout_is_ratio_fraction_high"] = sum(v > C for v in w.values()) / (N + EPS)
    wc = {k: min(max(v, 1 / C), C) for k, v in w.items()}
    mean_wc = sum(wc.values()) / (N + EPS)
    out["rollout_corr/rollout_is_std"] = math.sqrt(max(sum(v * v for v in wc.values()) / (N + EPS) - mean_wc**2, 0))
    out["rollout_corr/rollout_is_eff_sample_size"] = 1 / (sum((v / (mean_wc + EPS)) ** 2 for v in wc.values())
                                                          / (N + EPS))
    seqw = [sum(w[(b, t)] for t in rows[b][0]) / (len(rows[b][0]) + EPS) for b in range(B)]
    out["rollout_corr/rollout_is_seq_mean"] = sum(seqw) / B
    out["rollout_corr/rollout_is_seq_std"] = math.sqrt(sum((s - sum(seqw) / B) ** 2 for s in seqw) / (B - 1))
    out["rollout_corr/rollout_is_seq_max_deviation"] = max(abs(s - 1) for s in seqw)
    clip = lower = 0
    for (b, _t), r in w.items():
        a = adv[b]
        l1, l2 = -a * r, -a * min(max(r, 1 - lo), 1 + hi)
        clip += l2 > l1
        lower += (max(l1, l2) > -a * c) and a < 0
    out["actor/pg_clipfrac"] = clip / (N + EPS)
    out["actor/pg_clipfrac_lower"] = lower / (N + EPS)
    d = [abs(cur[b, t] - behav[b, t]) for b in range(B) for t in rows[b][0]]
    out["sampling/sampling_logp_difference/mean"] = sum(d) / len(d)
    out["sampling/sampling_logp_difference/max"] = max(d)
    R = []
    for b in range(B):
        ratio = math.exp(sum(cur[b, t] - behav[b, t] for t in rows[b][0]))
        R.append(0.0 if ratio > cap else ratio)
    out["sampling/importance_sampling_ratio/mean"] = sum(R) / B
    out["sampling/importance_sampling_ratio/max"] = max(R)
    low_seq, high_seq = [], []
    lows = highs = 0
    for b in range(B):
        lo_b = sum(math.exp(cur[b, t] - behav[b, t]) < 1 - lo and adv[b] < 0 for t in rows[b][0])
        hi_b = sum(math.exp(cur[b, t] - behav[b, t]) > 1 + hi and adv[b] > 0 for t in rows[b][0])
        lows, highs = lows + lo_b, highs + hi_b
        low_seq.append(lo_b / len(rows[b][0]))
        high_seq.append(hi_b / len(rows[b][0]))
    out["clip_ratio/low_mean"] = lows / N
    out["clip_ratio/high_mean"] = highs / N
    out["clip_ratio/low_min"] = min(low_seq)
    out["clip_ratio/high_max"] = max(high_seq)
    tr = [(behav[b, t] - cur[b, t]) ** 2 for b in range(B) for t in rows[b][0]
          if (adv[b] > 1e-12 and math.exp(cur[b, t] - behav[b, t]) > 1 + 1e-12)
          or (adv[b] < -1e-12 and math.exp(cur[b, t] - behav[b, t]) < 1 - 1e-12)]
    out["m2po/M2"] = sum(tr) / len(tr) if tr else 0.0
    return out


def _batch(rng, B=12, T=20, scale=0.4):
    behav = -rng.exponential(1.0, (B, T))
    cur = np.minimum(behav + rng.normal(0, scale, (B, T)), 0.0)
    lengths = rng.integers(3, T + 1, B)
    mask = np.arange(T)[None, :] < lengths[:, None]
    adv = rng.normal(0, 1, B)
    return behav, cur, mask, adv


def test_matches_a_naive_transcription_of_the_frameworks_code():
    for seed in range(3):
        behav, cur, mask, adv = _batch(np.random.default_rng(seed))
        got = framework_statistics(behav, cur, mask, adv)
        want = _naive(behav, cur, mask, adv)
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-14), key


def test_hand_computed_case():
    # one row, two tokens: r = 2 and r = 0.5, advantage -1; a second row r = 1.5, advantage +1
    behav = np.full((2, 2), -1.0)
    cur = behav + np.log(np.array([[2.0, 0.5], [1.5, 1.0]]))
    mask = np.array([[1, 1], [1, 0]])
    out = framework_statistics(behav, cur, mask, np.array([-1.0, 1.0]))
    # verl: per-row mean log r = (log 2 + log .5)/2 = 0 and log 1.5; log_ppl_diff = -(mean log r)
    assert out["rollout_corr/log_ppl_diff"] == pytest.approx(-math.log(1.5) / (1 + EPS) / 2, rel=1e-12)
    assert out["rollout_corr/ppl_ratio"] == pytest.approx((1 + 1 / 1.5 ** (1 / (1 + EPS))) / 2, rel=1e-12)
    # tokens r = 2, .5, 1.5; C = 2: clamp to [.5, 2] changes nothing; Kish of (2, .5, 1.5) = 16/(3*6.5)
    ess = out["rollout_corr/rollout_is_eff_sample_size"]
    assert ess == pytest.approx(16 / (3 * 6.5), rel=1e-7)
    # dual clip c = 3: no A < 0 token with r > 3 -> 0; PPO clip [.8, 1.28]: r = .5 with A < 0 and r = 1.5 with A > 0
    assert out["actor/pg_clipfrac_lower"] == 0.0
    assert out["actor/pg_clipfrac"] == pytest.approx(2 / (3 + EPS), rel=1e-12)
    assert out["clip_ratio/low_mean"] == pytest.approx(1 / 3) and out["clip_ratio/high_mean"] == pytest.approx(1 / 3)
    assert out["clip_ratio/low_min"] == 0.0 and out["clip_ratio/high_max"] == 1.0
    # TRL sequence_mask, cap 3: R = 1 and 1.5, both kept
    assert out["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.25, rel=1e-12)
    assert out["sampling/sampling_logp_difference/max"] == pytest.approx(math.log(2))
    # M2PO T: (A < 0, r = .5) and (A > 0, r = 1.5): M2 = (log^2 2 + log^2 1.5) / 2
    assert out["m2po/M2"] == pytest.approx((math.log(2) ** 2 + math.log(1.5) ** 2) / 2, rel=1e-12)
    # dual clip fires for A < 0 and r > c
    out = framework_statistics(np.array([[-5.0]]), np.array([[-5.0 + math.log(4.0)]]), np.array([[1]]),
                               np.array([-1.0]))
    assert out["actor/pg_clipfrac_lower"] == pytest.approx(1 / (1 + EPS))


def _write_token_log(path, behav, cur, mask, adv):
    seq, b, c, a = [], [], [], []
    for i in range(behav.shape[0]):
        m = mask[i].astype(bool)
        seq += [i] * int(m.sum())
        b += behav[i][m].tolist()
        c += cur[i][m].tolist()
        a += [adv[i]] * int(m.sum())
    pq.write_table(pa.table({"seq_id": seq, "logp_behav": b, "logp_current": c, "advantage": a}), path)
    return str(path)


def test_streamed_equals_batch(tmp_path):
    behav, cur, mask, adv = _batch(np.random.default_rng(5), B=40, T=30)
    path = _write_token_log(tmp_path / "log.parquet", behav, cur, mask, adv)
    report = diagnose(DiagnoseConfig(path=path, chunk_rows=37))
    batch = framework_statistics(behav, cur, mask, adv)
    assert set(report["framework"]) == set(batch)
    for key, value in batch.items():
        assert report["framework"][key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
    seq = framework_statistics(behav, cur, mask, adv, rollout_is="sequence")
    for key, value in report["framework_rollout_is_sequence"].items():
        assert value == pytest.approx(seq[key], rel=1e-12, abs=1e-15), key


def test_extreme_log_ratios_stay_finite(tmp_path):
    T = 8192
    behav = np.full((2, T), -1.0)
    cur = behav.copy()
    cur[0] += 0.5  # sequence log-ratio +4096
    cur[1] -= 0.5  # -4096
    cur = np.minimum(cur, 0.0)
    behav[0] = cur[0] - 0.5
    mask = np.ones((2, T))
    out = framework_statistics(behav, cur, mask, np.array([1.0, -1.0]))
    assert all(math.isfinite(v) for v in out.values()), {k: v for k, v in out.items() if not math.isfinite(v)}
    assert out["sampling/importance_sampling_ratio/max"] == pytest.approx(math.exp(-4096) or 0.0, abs=1e-300)
    seq = framework_statistics(behav, cur, mask, rollout_is="sequence")
    assert seq["rollout_corr/rollout_is_max"] == pytest.approx(math.exp(20.0))
    assert all(math.isfinite(v) for v in seq.values())
    path = _write_token_log(tmp_path / "x.parquet", behav, cur, mask, np.array([1.0, -1.0]))
    report = diagnose(DiagnoseConfig(path=path))
    assert all(v is not None for v in report["framework"].values())
    rows = {(r["correction"], r["level"]): r for r in report["what_if"]}
    assert rows[("trl_is_mask", "sequence")]["flagged_frac"] == 0.5
    assert rows[("gspo", "sequence")]["ess_frac"] is not None


def test_what_if_new_rows_hand_computed(tmp_path):
    # four one-token sequences: r = .7 (A -1), 1.25 (A +1), 1.3 (A +1), 4 (A +1)
    r = np.array([0.7, 1.25, 1.3, 4.0])
    adv = np.array([-1.0, 1.0, 1.0, 1.0])
    behav = np.full((4, 1), -2.0)
    cur = behav + np.log(r)[:, None]
    path = _write_token_log(tmp_path / "w.parquet", behav, cur, np.ones((4, 1)), adv)
    report = diagnose(DiagnoseConfig(path=path))
    rows = {(x["correction"], x["level"]): x for x in report["what_if"]}
    # asymmetric clip .2/.28: .7 < .8 with A < 0 dropped; 1.3 and 4 > 1.28 with A > 0 dropped; 1.25 kept
    asym = rows[("ppo_clip_asym", "token")]
    assert asym["param"] == [0.2, 0.28] and asym["flagged_frac"] == 0.75
    assert asym["bias_proxy"] == pytest.approx((0.7 + 1.3 + 4.0) / 4) and asym["ess_frac"] == pytest.approx(0.25)
    # TRL sequence_mask at 3: only R = 4 masked (one-sided: .7 kept)
    trl = rows[("trl_is_mask", "sequence")]
    kept = np.array([0.7, 1.25, 1.3])
    assert trl["flagged_frac"] == 0.25 and trl["bias_proxy"] == pytest.approx(1.0)
    assert trl["ess_frac"] == pytest.approx(kept.sum() ** 2 / (4 * np.sum(kept**2)))
    # GSPO 3e-4/4e-4 on one-token sequences: s = r; every ratio is outside [1 - 3e-4, 1 + 4e-4] on its side
    gspo = rows[("gspo", "sequence")]
    assert gspo["flagged_frac"] == 1.0 and gspo["ess_frac"] == 0.0
    # M2 over T = all four tokens (each on the harmful side)
    m2 = rows[("m2_trust_region", "token")]
    assert m2["flagged_frac"] == 1.0 and m2["m2"] == pytest.approx(np.mean(np.log(r) ** 2))
    # the existing rows keep their values: a symmetric clip at .2 drops .7, 1.25, 1.3, 4
    clip = {x["param"]: x["flagged_frac"] for x in report["what_if"] if x["correction"] == "ppo_clip"}
    assert clip == {0.2: 1.0, 0.28: 0.75}


def test_gspo_uses_the_geometric_mean():
    # a 2-token sequence with token ratios 1.0002 and 1.0004: s = sqrt(1.0002 * 1.0004) ~ 1.0003 < 1 + 4e-4
    from replay_theory.diagnose.whatif import WhatIfConfig, sequence_rows
    lr = np.array([math.log(1.0002) + math.log(1.0004), math.log(1.001)])
    rows = sequence_rows(lr, WhatIfConfig(), np.array([2, 1]), np.array([1.0, 1.0]))
    gspo = next(x for x in rows if x["correction"] == "gspo")
    assert gspo["flagged_frac"] == 0.5  # only the second (s = 1.001 > 1.0004)

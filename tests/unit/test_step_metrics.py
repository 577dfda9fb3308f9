"""core/metrics.py: the step metrics, the sequence log-ratios they sum and the Kish ESS by age (one pass for all)."""

from __future__ import annotations

import numpy as np

from replay_theory.core.metrics import (
    AGE_BUCKETS,
    age_bucket,
    ess_by_age,
    step_metrics,
    step_metrics_and_ratios,
    step_metrics_by_age,
)
from replay_theory.core.pipeline import age_bucket as pipeline_age_bucket


def _batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    token_lr = 0.3 * rng.standard_normal((3, 10, 4))  # (S, B, L)
    mask = rng.random((3, 10, 4)) < 0.8
    mask[:, :, 0] = True  # every response has a token
    staleness = rng.integers(0, 6, size=(3, 10))
    return token_lr, mask, staleness


def test_step_metrics_and_ratios_is_step_metrics_plus_the_sequence_sums() -> None:
    token_lr, mask, staleness = _batch()
    metrics, seq_lr = step_metrics_and_ratios(token_lr, mask, staleness)
    alone = step_metrics(token_lr, mask, staleness)
    assert metrics.keys() == alone.keys()
    for key in alone:
        np.testing.assert_array_equal(metrics[key], alone[key])
    np.testing.assert_array_equal(seq_lr, np.where(mask, token_lr, 0.0).sum(axis=-1))


def test_step_metrics_by_age_gives_ess_by_age_of_the_sequence_ratios() -> None:
    token_lr, mask, staleness = _batch(1)
    metrics, frac, count = step_metrics_by_age(token_lr, mask, staleness)
    _, seq_lr = step_metrics_and_ratios(token_lr, mask, staleness)
    want_frac, want_count = ess_by_age(seq_lr, age_bucket(staleness), len(AGE_BUCKETS))
    np.testing.assert_array_equal(frac, want_frac)
    np.testing.assert_array_equal(count, want_count)
    # buckets 0, 1, 2-3, 4-7: staleness 0..5 falls in the first four, every response counted once
    np.testing.assert_array_equal(count.sum(axis=1), [10, 10, 10])
    assert not count[:, 4:].any()
    np.testing.assert_array_equal(metrics["staleness_max"], staleness.max(axis=1))


def test_equal_ratios_in_a_bucket_give_ess_one() -> None:
    token_lr = np.full((1, 4, 1), 0.25)
    staleness = np.array([[0, 0, 2, 3]])
    _, frac, count = step_metrics_by_age(token_lr, np.ones_like(token_lr, bool), staleness)
    np.testing.assert_array_equal(count[0, :3], [2, 0, 2])
    np.testing.assert_array_equal(frac[0, [0, 2]], [1.0, 1.0])
    assert np.isnan(frac[0, 1])  # an empty bucket


def test_age_buckets_are_one_table_for_pipeline_and_metrics() -> None:
    ages = np.array([0, 1, 2, 3, 4, 7, 8, 1024, 5000])
    np.testing.assert_array_equal(age_bucket(ages), [0, 1, 2, 2, 3, 3, 4, 11, 11])
    np.testing.assert_array_equal(pipeline_age_bucket(ages), age_bucket(ages))


def test_equal_reward_runs_by_columns_equal_reduceat():
    """core.metrics._runs_equal's fast path (runs of one length: a transposed copy) gives reduceat's flags exactly,
    and runs of unequal lengths go through reduceat itself; a hand case first."""
    from replay_theory.core.metrics import _runs_equal

    flat = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.5])
    assert _runs_equal(flat, np.array([0, 3, 6])).tolist() == [False, False, True]  # groups of 3
    assert _runs_equal(flat, np.array([0, 2, 4])).tolist() == [True, False, False]  # lengths 2, 2, 5
    rng = np.random.default_rng(0)
    for k, runs in ((2, 1), (4, 50), (8, 333)):
        flat = rng.integers(0, 2, size=k * runs).astype(float)  # many all-equal runs at k = 2
        first = np.arange(0, flat.size, k)
        expected = np.maximum.reduceat(flat, first) == np.minimum.reduceat(flat, first)
        assert np.array_equal(_runs_equal(flat, first), expected)


def test_moments_from_rows_without_c_and_p_keeps_every_other_sum():
    """Moments.from_rows(all_sums=False), which the losses' IS metrics use, leaves C and P NaN and every other sum the
    same number, bit for bit, with and without a mask and with +-inf entries."""
    from dataclasses import fields

    from replay_theory.theory.moments import Moments

    rng = np.random.default_rng(1)
    lr = rng.normal(scale=0.7, size=(3, 40))
    lr[1, 5], lr[2, 7] = np.inf, -np.inf
    mask = rng.random((3, 40)) < 0.8
    mask[:, 0] = True
    for m in (None, mask):
        full, lean = Moments.from_rows(lr, m), Moments.from_rows(lr, m, all_sums=False)
        for f in fields(Moments):
            a, b = np.asarray(getattr(full, f.name)), np.asarray(getattr(lean, f.name))
            if f.name in ("C", "P"):
                assert np.isnan(b).all()
            else:
                assert np.array_equal(a, b, equal_nan=True), f.name


def test_moments_of_many_short_rows_by_columns_equal_row_by_row():
    """Moments.from_rows and weight_sums over many short rows (at least COLUMN_ROWS, the recorder's stacked steps)
    reduce a transposed copy's columns; every sum is the number the row-by-row path gives (blocks of fewer rows
    than COLUMN_ROWS take it), bit for bit, for row lengths around numpy's pairwise blocks (1, 7, 8, 64, 130) and
    rows holding +-inf, NaN, all -inf and signed zeros."""
    from dataclasses import fields

    from replay_theory.theory.moments import COLUMN_ROWS, Moments, _by_columns, weight_sums

    rng = np.random.default_rng(7)
    rows = 4 * COLUMN_ROWS
    block = COLUMN_ROWS // 2  # row path: below COLUMN_ROWS rows
    for n in (1, 7, 8, 64, 130):
        for scale in (1e-3, 0.5, 40.0):
            lr = rng.normal(scale=scale, size=(max(rows, 4 * n), n))
            lr[3, 0], lr[5, :], lr[7, 0], lr[9, 0], lr[11, 0] = np.inf, -np.inf, np.nan, -np.inf, -0.0
            assert _by_columns(lr.shape, None) and not _by_columns((block, n), None)
            for all_sums in (True, False):
                whole = Moments.from_rows(lr, all_sums=all_sums)
                parts = [Moments.from_rows(lr[i:i + block], all_sums=all_sums) for i in range(0, len(lr), block)]
                for f in fields(Moments):
                    got = np.asarray(getattr(whole, f.name))
                    want = np.concatenate([np.asarray(getattr(p, f.name)) for p in parts])
                    assert got.shape == want.shape and np.array_equal(got, want, equal_nan=True), (n, f.name)
                    assert np.array_equal(np.signbit(got), np.signbit(want)), (n, f.name)
            got_ws = weight_sums(lr)
            blocks = [weight_sums(lr[i:i + block]) for i in range(0, len(lr), block)]
            want_ws = [np.concatenate(p) for p in zip(*blocks)]
            for g, w in zip(got_ws, want_ws):
                assert np.array_equal(g, w, equal_nan=True), n
    assert not _by_columns((rows, 8), np.ones((rows, 8), bool))  # a mask: rows as they are
    assert not _by_columns((rows, 2, 4), None)


def test_a_one_token_loss_s_kish_ess_is_the_sequence_level_one_bit_for_bit() -> None:
    # the recorder passes a TOKEN_KISH_METRICS loss's ess_frac on as the sequence-level ESS of one-token responses
    # (every token real): the same sums of the same numbers, signed zeros and the engine's many-row shapes included
    from replay_theory.core.losses import TOKEN_KISH_METRICS, _clip_metrics, _ratio_metrics

    assert TOKEN_KISH_METRICS == {_ratio_metrics, _clip_metrics}
    rng = np.random.default_rng(7)
    for shape in ((3, 10, 1), (1024, 64, 1), (300, 7, 1)):
        token_lr = 0.2 * rng.standard_normal(shape)
        token_lr[0, :3, 0] = (0.0, -0.0, 0.0)
        token_lr[1] = -0.0  # an on-policy row
        mask = np.ones(shape, bool)
        staleness = rng.integers(0, 6, size=shape[:2])
        want = step_metrics(token_lr, mask, staleness)
        flags = np.zeros(shape, bool)
        for metrics in (_ratio_metrics(token_lr, mask), _clip_metrics(flags, flags, token_lr, mask)):
            ess = metrics["ess_frac"]
            np.testing.assert_array_equal(ess.view(np.uint64), want["ess_frac"].view(np.uint64))
            got = step_metrics_and_ratios(token_lr, mask, staleness, seq_ess=ess)[0]
            assert got.keys() == want.keys()
            for key in want:
                np.testing.assert_array_equal(got[key], want[key])


def test_a_given_sequence_ess_is_not_used_where_a_sequence_log_ratio_is_not_finite() -> None:
    token_lr, mask, staleness = _batch(2)
    token_lr[0, 0, 0] = np.inf
    want = step_metrics(token_lr, mask, staleness)
    got, _ = step_metrics_and_ratios(token_lr, mask, staleness, seq_ess=np.full(3, -1.0))
    np.testing.assert_array_equal(got["ess_frac"], want["ess_frac"])
    finite, fmask, fstale = _batch(3)
    given = np.array([0.25, 0.5, 0.75])
    np.testing.assert_array_equal(step_metrics_by_age(finite, fmask, fstale, seq_ess=given)[0]["ess_frac"], given)


def test_abs_max_false_leaves_only_log_ratio_abs_max_out() -> None:
    token_lr, mask, staleness = _batch(4)
    full, seq_lr = step_metrics_and_ratios(token_lr, mask, staleness)
    lean, lean_seq = step_metrics_and_ratios(token_lr, mask, staleness, abs_max=False)
    assert list(lean) == [k for k in full if k != "log_ratio_abs_max"]
    for key in lean:
        np.testing.assert_array_equal(lean[key], full[key])
    np.testing.assert_array_equal(lean_seq, seq_lr)
    np.testing.assert_array_equal(full["log_ratio_abs_max"], np.abs(np.where(mask, token_lr, 0.0)).max(axis=(1, 2)))
    by_age, frac, count = step_metrics_by_age(token_lr, mask, staleness, abs_max=False)
    assert list(by_age) == list(lean)
    np.testing.assert_array_equal(frac, step_metrics_by_age(token_lr, mask, staleness)[1])

"""Tests for replay_theory.theory.exgrpo (ExGRPO)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from replay_theory.theory import exgrpo as ex


def _normal_pdf(x, mu, sigma):
    x = np.asarray(x, dtype=float)
    return np.exp(-0.5 * ((x - mu) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))


# --- policy shaping -----------------------------------------------------------


def test_shaping_hand_values():
    assert ex.shaping(0.1, 0.1) == pytest.approx(0.5)
    assert ex.shaping(1.0) == pytest.approx(1 / 1.1)
    np.testing.assert_allclose(ex.shaping([0.0, np.inf]), [0.0, 1.0])


def test_shaping_gradient_weight_peak_and_value_at_one():
    assert ex.shaping_gradient_weight(0.1, 0.1) == pytest.approx(0.25)
    assert ex.shaping_gradient_weight(0.3, 0.3) == pytest.approx(0.25)
    assert ex.shaping_gradient_weight(1.0, 0.1) == pytest.approx(0.1 / 1.21)
    assert round(float(ex.shaping_gradient_weight(1.0, 0.1)), 4) == 0.0826
    assert round(float(ex.shaping_gradient_weight(1.0, 0.1)), 3) == 0.083  # the note's "about 0.083"
    grid = np.geomspace(1e-3, 10.0, 2001)
    g = ex.shaping_gradient_weight(grid, 0.1)
    assert grid[np.argmax(g)] == pytest.approx(0.1, rel=1e-2)
    assert g.max() <= 0.25 + 1e-15
    assert ex.shaping_gradient_weight(np.inf) == 0.0


def test_shaping_gradient_weight_is_derivative_in_log_ratio():
    """w = exp(s), s = log pi_theta - log pi_old: d f(w)/ds = f'(w) w."""
    s = np.linspace(-5.0, 3.0, 17)
    h = 1e-6
    fd = (ex.shaping(np.exp(s + h)) - ex.shaping(np.exp(s - h))) / (2 * h)
    np.testing.assert_allclose(ex.shaping_gradient_weight(np.exp(s)), fd, rtol=1e-6, atol=1e-12)


# --- bucket probabilities -----------------------------------------------------


def test_bucket_probabilities_success_count_units():
    p = ex.bucket_probabilities(8, mu=4.0, sigma=1.0, units="success-count")
    np.testing.assert_array_equal(np.round(p, 3), [0.004, 0.054, 0.242, 0.399, 0.242, 0.054, 0.004])
    assert p.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(p, ex.bucket_probabilities())  # defaults: K = 8, mu = K/2, sigma = 1


def test_printed_count_list_is_both_pdf_and_probability_to_three_decimals():
    """With sigma = 1 the pdf summed over k = 1..7 is 0.99973, so pdf and probability agree to 3 dp."""
    k = np.arange(1, 8)
    pdf = _normal_pdf(k, 4.0, 1.0)
    assert pdf.sum() == pytest.approx(0.99973, abs=1e-5)
    np.testing.assert_array_equal(np.round(pdf, 3), np.round(ex.bucket_probabilities(), 3))
    assert abs(pdf[3] - ex.bucket_probabilities()[3]) > 1e-4  # but they are not the same numbers


def test_bucket_probabilities_accuracy_units_nearly_uniform():
    p = ex.bucket_probabilities(8, mu=0.5, sigma=1.0, units="accuracy")
    np.testing.assert_array_equal(np.round(p, 3), [0.137, 0.143, 0.146, 0.147, 0.146, 0.143, 0.137])
    np.testing.assert_allclose(p, ex.bucket_probabilities(units="accuracy"))  # default mu = 0.5
    # the printed [.137 ... .147] are normalised probabilities, not pdf values (.372 ... .399)
    pdf = _normal_pdf(np.arange(1, 8) / 8, 0.5, 1.0)
    np.testing.assert_array_equal(np.round(pdf, 3), [0.372, 0.387, 0.396, 0.399, 0.396, 0.387, 0.372])


@pytest.mark.parametrize("K", [4, 8, 16])
def test_unit_conventions_agree_when_scaled_by_K(K):
    rng = np.random.default_rng(K)
    mu_count = rng.uniform(0, K, size=5)
    sigma_count = rng.uniform(0.3, 4.0, size=5)
    count = ex.bucket_probabilities(K, mu=mu_count, sigma=sigma_count, units="success-count")
    acc = ex.bucket_probabilities(K, mu=mu_count / K, sigma=sigma_count / K, units="accuracy")
    assert count.shape == (5, K - 1)
    np.testing.assert_allclose(count, acc, rtol=1e-12)
    # the reference code's sigma = 1 in counts is sigma = 0.125 in accuracy units
    np.testing.assert_allclose(
        ex.bucket_probabilities(8, mu=0.5, sigma=0.125, units="accuracy"), ex.bucket_probabilities(8)
    )


def test_bucket_probabilities_match_pdf_normalisation_by_hand():
    p = ex.bucket_probabilities(8, mu=0.25, sigma=0.5, units="accuracy")
    pdf = _normal_pdf(np.arange(1, 8) / 8, 0.25, 0.5)
    np.testing.assert_allclose(p, pdf / pdf.sum())


def test_normalisation_over_nonempty_buckets():
    nonempty = np.array([True, False, True, True, False, False, True])
    p = ex.bucket_probabilities(nonempty=nonempty)
    full = ex.bucket_probabilities()
    assert p.sum() == pytest.approx(1.0)
    np.testing.assert_array_equal(p[~nonempty], 0.0)
    np.testing.assert_allclose(p[nonempty], full[nonempty] / full[nonempty].sum())
    # a batch of masks, and a narrow sigma where the only nonempty bucket is far from mu
    masks = np.eye(7, dtype=bool)
    np.testing.assert_allclose(ex.bucket_probabilities(nonempty=masks, sigma=0.01), np.eye(7))


def test_bucket_probabilities_invalid():
    with pytest.raises(ValueError, match="nonempty must mark at least one bucket"):
        ex.bucket_probabilities(nonempty=np.zeros(7, dtype=bool))
    with pytest.raises(ValueError, match="nonempty must have last-axis length K-1=7"):
        ex.bucket_probabilities(nonempty=np.ones(8, dtype=bool))
    with pytest.raises(ValueError, match="sigma must be"):
        ex.bucket_probabilities(sigma=0.0)
    with pytest.raises(ValueError, match="units must be"):
        ex.bucket_probabilities(units="percent")
    with pytest.raises(ValueError, match="K must be an integer >= 2"):
        ex.bucket_probabilities(K=1)


# --- batch split and item probabilities ---------------------------------------


def test_batch_split_hand_values():
    assert ex.batch_split(128, 0.5, 10_000) == (64, 64)
    assert ex.batch_split(128, 0.5, 10) == (10, 118)  # buffer depleted: lower bound on B_on
    assert ex.batch_split(64, 0.0, 500) == (0, 64)
    assert ex.batch_split(100, 0.29, 1000) == (29, 71)  # floor(0.29 * 100) despite 28.999... in floats
    assert ex.batch_split(10, 0.25, 100) == (2, 8)
    n_exp, n_on = ex.batch_split(128, np.array([0.25, 0.5, 0.75]), 1000)
    np.testing.assert_array_equal(n_exp, [32, 64, 96])
    np.testing.assert_array_equal(n_exp + n_on, 128)


@pytest.mark.parametrize(
    "args, message",
    [
        ((128, 1.0, 10), r"rho must be in \[0, 1\)"),
        ((128, -0.1, 10), r"rho must be in \[0, 1\)"),
        ((0, 0.5, 10), "B must be an integer >= 1"),
        ((128, 0.5, -1), "n_experience must be an integer >= 0"),
    ],
)
def test_batch_split_invalid(args, message):
    with pytest.raises(ValueError, match=message):
        ex.batch_split(*args)


def test_item_probabilities():
    np.testing.assert_allclose(ex.item_probabilities([2, 0, 5], [0.5, 0.0, 0.5]), [0.25, 0.0, 0.1])
    sizes = np.array([3, 0, 7, 12, 1, 0, 4])
    p = ex.bucket_probabilities(nonempty=sizes > 0)
    per_item = ex.item_probabilities(sizes, p)
    assert float((sizes * per_item).sum()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="bucket_probs must be 0 for empty buckets"):
        ex.item_probabilities([2, 0], [0.5, 0.5])

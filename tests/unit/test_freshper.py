"""Tests for replay_theory.theory.freshper (FreshPER, arXiv:2604.16918)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from replay_theory.theory import freshper as fp

# --- hand values -------------------------------------------------------------


def test_tau_from_kl_drift_is_reciprocal():
    assert fp.tau_from_kl_drift(0.002) == pytest.approx(500.0)
    np.testing.assert_allclose(fp.tau_from_kl_drift([0.001, 0.01]), [1000.0, 100.0])
    assert fp.tau_from_kl_drift(0.0) == np.inf  # no drift: standard PER


def test_effective_time_constant_tau500_alpha06():
    assert fp.effective_time_constant(500, 0.6) == pytest.approx(833.33, abs=0.005)
    assert fp.effective_time_constant(500, 1.0) == 500.0
    assert fp.effective_time_constant(500, 0.0) == np.inf


def test_half_life_halves_the_weight():
    assert fp.half_life(500) == pytest.approx(500 * math.log(2))
    assert fp.half_life(500) == pytest.approx(346.574, abs=1e-3)
    assert fp.age_decay_weight(fp.half_life(500), 500) == pytest.approx(0.5)


def test_crossover_age_is_tau_when_p_old_is_e_times_p_new():
    assert fp.crossover_age(500, math.e * 0.3, 0.3) == pytest.approx(500.0)
    # signed: an old item that starts below the fresh one has a negative crossover
    assert fp.crossover_age(500, 0.3, math.e * 0.3) == pytest.approx(-500.0)
    assert fp.crossover_age(500, 0.3, 0.3) == 0.0
    assert fp.crossover_age(np.inf, 2.0, 1.0) == np.inf  # standard PER never crosses
    assert fp.crossover_age(np.inf, 1.0, 1.0) == 0.0


def test_crossover_matches_decayed_priorities_and_is_below_fresh():
    tau, p_old, p_new = 500.0, 1.0, 0.2
    age_x = fp.crossover_age(tau, p_old, p_new)
    assert fp.priorities(p_old, age_x, tau) == pytest.approx(p_new)
    assert not fp.is_below_fresh(age_x - 1.0, tau, p_old, p_new)
    assert fp.is_below_fresh(age_x + 1.0, tau, p_old, p_new)
    # crossing does not depend on alpha: compare sampling weights at alpha = 0.6
    probs = fp.sampling_probabilities([p_old, p_new], 0.6, age=[age_x + 1.0, 0.0], tau=tau)
    assert probs[0] < probs[1]
    # log-space comparison survives an age where exp(-age/tau) underflows
    assert fp.is_below_fresh(1e6, 1.0, 1e300, 1e-300)


def test_age_decay_weight_and_standard_per_limit():
    np.testing.assert_allclose(fp.age_decay_weight([0.0, 500.0, 1000.0], 500.0), [1.0, math.exp(-1), math.exp(-2)])
    np.testing.assert_array_equal(fp.age_decay_weight([0.0, 1e9], np.inf), [1.0, 1.0])


def test_priorities_eq14_broadcasts():
    p = fp.priorities([[1.0], [2.0]], [0.0, 500.0], 500.0)  # (2, 1) x (2,) -> (2, 2)
    np.testing.assert_allclose(p, [[1.0, math.exp(-1)], [2.0, 2 * math.exp(-1)]])


# --- sampling probabilities (Eq. 2) ------------------------------------------


def test_probabilities_sum_to_one_over_last_axis_with_batch():
    rng = np.random.default_rng(0)
    p = rng.uniform(0.0, 3.0, size=(3, 4, 10))
    probs = fp.sampling_probabilities(p, 0.6)
    assert probs.shape == (3, 4, 10)
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0)
    naive = p**0.6 / (p**0.6).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(probs, naive)


def test_alpha_zero_is_uniform_even_with_zero_priorities():
    probs = fp.sampling_probabilities([0.0, 1.0, 5.0, 100.0], 0.0)
    np.testing.assert_allclose(probs, 0.25)
    probs = fp.sampling_probabilities([0.0, 1.0, 5.0], 0.0, age=[0, 10, 1000], tau=1.0)
    np.testing.assert_allclose(probs, 1 / 3)  # (p e^{-D/tau})^0 = 1


def test_per_row_alpha_broadcasts():
    p = np.array([[1.0, 4.0], [1.0, 4.0]])
    probs = fp.sampling_probabilities(p, np.array([[0.0], [1.0]]))
    np.testing.assert_allclose(probs, [[0.5, 0.5], [0.2, 0.8]])


def test_effective_decay_identity():
    """(p e^{-D/tau})^alpha sampling == p^alpha sampling with time constant tau/alpha."""
    rng = np.random.default_rng(1)
    p_base = rng.uniform(0.01, 2.0, size=(2, 50))
    age = rng.integers(0, 3000, size=(2, 50)).astype(float)
    tau, alpha = 500.0, 0.6
    released = fp.sampling_probabilities(p_base, alpha, decay_then_exponent=True, age=age, tau=tau)
    via_eq14 = fp.sampling_probabilities(fp.priorities(p_base, age, tau), alpha)
    exponent_first = fp.sampling_probabilities(
        p_base, alpha, decay_then_exponent=False, age=age, tau=fp.effective_time_constant(tau, alpha)
    )
    np.testing.assert_allclose(released, via_eq14, rtol=1e-12)
    np.testing.assert_allclose(released, exponent_first, rtol=1e-12)
    # and by hand: P ~ p^alpha * exp(-age / (tau/alpha))
    hand = p_base**alpha * np.exp(-age / 833.3333333333334)
    np.testing.assert_allclose(released, hand / hand.sum(axis=-1, keepdims=True), rtol=1e-12)


def test_sampling_survives_underflowing_decay():
    """All items so old that p e^{-D/tau} underflows: log space still gives a distribution."""
    age = np.array([2000.0, 2001.0])
    assert np.all(fp.priorities([1.0, 1.0], age, 1.0) == 0.0)
    probs = fp.sampling_probabilities([1.0, 1.0], 1.0, age=age, tau=1.0)
    np.testing.assert_allclose(probs, [1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))])


def test_binary_reward_failure_weight_note_observation():
    """p = |r| + 1e-6: a failure gets (1e-6/(1+1e-6))^0.6 ~= 2.5e-4 of a success's weight."""
    eps = 1e-6
    probs = fp.sampling_probabilities([1.0 + eps, 0.0 + eps], 0.6)
    ratio = probs[1] / probs[0]
    assert ratio == pytest.approx((eps / (1 + eps)) ** 0.6, rel=1e-12)
    assert ratio == pytest.approx(2.5119e-4, rel=1e-4)
    assert f"{ratio:.1e}" == "2.5e-04"


# --- IS weights (Eq. 3 / 15) --------------------------------------------------


def test_is_weights_max_one_and_naive_formula():
    rng = np.random.default_rng(2)
    probs = fp.sampling_probabilities(rng.uniform(0.1, 2.0, size=(3, 20)), 0.6)
    w = fp.is_weights(probs, 0.4)
    np.testing.assert_allclose(w.max(axis=-1), 1.0)
    assert np.all(w > 0) and np.all(w <= 1.0)
    N = probs.shape[-1]
    raw = (1.0 / (N * probs)) ** 0.4
    np.testing.assert_allclose(w, raw / raw.max(axis=-1, keepdims=True))


def test_is_weights_uniform_and_beta_zero_are_one():
    np.testing.assert_allclose(fp.is_weights(np.full(8, 1 / 8), 0.4), 1.0)
    np.testing.assert_allclose(fp.is_weights([0.7, 0.2, 0.1], 0.0), 1.0)


def test_is_weights_zero_probability_items():
    w = fp.is_weights([0.5, 0.5, 0.0], 1.0)
    np.testing.assert_allclose(w, [1.0, 1.0, 0.0])


# --- ESS bound (Eq. 12) -------------------------------------------------------


def test_ess_age_bound_matches_decay_weight():
    assert fp.ess_age_bound(128, 1 / 500, 500) == pytest.approx(128 / math.e)
    ages = np.array([0.0, 10.0, 250.0])
    np.testing.assert_allclose(fp.ess_age_bound(64, 0.002, ages), 64 * fp.age_decay_weight(ages, 500.0))


# --- argument validation ------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: fp.half_life(-1), "tau must be > 0"),
        (lambda: fp.age_decay_weight(1.0, 0.0), "tau must be > 0"),
        (lambda: fp.age_decay_weight(-1.0, 5.0), "age must be"),
        (lambda: fp.tau_from_kl_drift(-0.1), "c must be >= 0"),
        (lambda: fp.effective_time_constant(500, 1.5), r"alpha must be in \[0, 1\]"),
        (lambda: fp.sampling_probabilities([1.0, 2.0], -0.1), r"alpha must be in \[0, 1\]"),
        (lambda: fp.sampling_probabilities([0.0, 0.0], 0.6), "priorities must have at least one entry > 0"),
        (lambda: fp.sampling_probabilities([-1.0, 2.0], 0.6), "priorities must be"),
        (lambda: fp.sampling_probabilities([], 0.6), "priorities must have at least one item"),
        (lambda: fp.is_weights([0.5, 0.5], 2.0), r"beta must be in \[0, 1\]"),
        (lambda: fp.crossover_age(500, 0.0, 1.0), "p_old must be"),
        (lambda: fp.ess_age_bound(0, 0.1, 1.0), "n must be"),
        (lambda: fp.half_life(float("nan")), "tau must be"),
    ],
)
def test_invalid_arguments_raise_value_error_naming_parameter(call, message):
    with pytest.raises(ValueError, match=message):
        call()

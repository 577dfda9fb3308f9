"""Compute ratio (Eq. 2) and the App. E mu estimate, against the paper's printed numbers."""

import math

import numpy as np
import pytest

from replay_theory.theory.compute import (
    compute_ratio,
    estimate_mu,
    median_mu,
    replay_ratio_of_split,
    workers_per_trainer,
)

# Table 2 of the experience-replay paper: mu = 6.84 (Qwen3-0.6B).
TABLE2_SPLITS = [(7, 1), (6, 2), (5, 3), (4, 4), (2, 6), (1, 7)]
TABLE2_PRINTED = [1.02, 0.41, 0.34, 0.26, 0.17, 0.15]


def test_gamma_hand_values():
    # (1 + 6/2) / (1 + 6.84) = 4 / 7.84
    assert compute_ratio(6, 2, 6.84) == pytest.approx(4 / 7.84, rel=1e-15)
    # on-policy split W/T = mu costs exactly the on-policy compute
    assert compute_ratio(5.28, 1, 5.28) == pytest.approx(1.0, rel=1e-15)


def test_table2_reproduced_except_the_printed_6_2_entry():
    computed = np.array([compute_ratio(w, t, 6.84) for w, t in TABLE2_SPLITS])
    np.testing.assert_allclose(computed, [8 / 7.84, 4 / 7.84, (1 + 5 / 3) / 7.84, 2 / 7.84, (1 + 1 / 3) / 7.84,
                                          (1 + 1 / 7) / 7.84], rtol=1e-12)
    rounded = np.round(computed, 2)
    matches = rounded == np.array(TABLE2_PRINTED)
    # ERRATUM (docs/ERRATA.md, "Table 2"): (6, 2) prints 0.41, Eq. (2) gives 0.51.
    assert matches.tolist() == [True, False, True, True, True, True]
    assert rounded[1] == 0.51


def test_section2_examples_at_mu_5_28():
    # Sec. 2 prints gamma = 0.65 for (6, 2) and 0.18 for (1, 7) at mu = 5.28.
    assert compute_ratio(1, 7, 5.28) == pytest.approx(0.18, abs=0.005)
    g62 = compute_ratio(6, 2, 5.28)
    assert g62 == pytest.approx(4 / 6.28, rel=1e-12)  # 0.637
    # ERRATUM (docs/ERRATA.md, "Sec. 2 gamma"): 0.637 does not round to the printed 0.65.
    assert round(g62, 2) == 0.64 != 0.65


def test_replay_ratios_printed_in_sec4_are_not_mu_T_over_W():
    # Sec. 4.2 prints mean replay ratios 2.2 / 5.6 / 17.6 for (6,2) / (5,3) / (4,4).
    implied = [replay_ratio_of_split(w, t, 6.84) for w, t in [(6, 2), (5, 3), (4, 4)]]
    np.testing.assert_allclose(implied, [2.28, 4.104, 6.84], rtol=1e-12)
    # Only the first is close; the others are measured values, not the steady-state formula.
    assert abs(implied[0] - 2.2) < 0.1 and abs(implied[1] - 5.6) > 1 and abs(implied[2] - 17.6) > 10


def test_estimate_mu_hand_case():
    # 100 steps x batch 60 on T = 2 trainers: 3000 rollouts per trainer GPU;
    # 1704 unique rollouts from W = 6 workers: 284 per worker GPU -> mu = 3000 / 284.
    assert estimate_mu(6000, 1704, 6, 2) == pytest.approx(3000 / 284, rel=1e-15)


def test_estimate_mu_recovers_mu_from_a_consistent_split():
    rng = np.random.default_rng(0)
    mu_true = rng.uniform(1, 10, size=50)  # (runs,)
    y = rng.uniform(1, 5, size=50)  # replay ratio
    trainers = rng.integers(1, 8, size=50).astype(float)
    workers = trainers * workers_per_trainer(mu_true, y)  # no idle GPU
    k_inference = rng.integers(1_000, 100_000, size=50).astype(float)
    k_training = k_inference * y  # each rollout used y times
    np.testing.assert_allclose(estimate_mu(k_training, k_inference, workers, trainers), mu_true, rtol=1e-12)


def test_median_mu_reports_median_and_iqr():
    # per-run estimates: (k_train/T) / (k_inf/W) with W = T = 1 -> k_train / k_inf
    k_train = np.array([5.0, 6.0, 7.0, 8.0, 100.0])
    median, q25, q75 = median_mu(k_train, np.ones(5), 1, 1)
    assert (median, q25, q75) == (7.0, 6.0, 8.0)


def test_workers_per_trainer_inverts_replay_ratio():
    assert workers_per_trainer(5.28, 2.0) == pytest.approx(2.64)
    assert replay_ratio_of_split(workers_per_trainer(5.28, 2.0), 1.0, 5.28) == pytest.approx(2.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_bad_mu_names_the_parameter(bad):
    with pytest.raises(ValueError, match=r"^mu must be a finite number > 0"):
        compute_ratio(6, 2, bad)

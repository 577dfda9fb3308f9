"""The noisy quadratic's epoch designs (issue 40): ``QuadraticReplay`` on core's ``EpochSchedule`` against the exact
fixed-order recursion ``expected_loss_epochs``; e = m = 1 is on-policy's recursion."""

from __future__ import annotations

import numpy as np
import pytest

from replay_theory.simulate import to_target
from replay_theory.simulate.envs.quadratic import (
    QuadraticConfig,
    QuadraticEnv,
    QuadraticReplay,
    expected_loss,
    expected_loss_epochs,
    stationary_loss_epochs,
)
from replay_theory.theory.designs import Design

ENV = QuadraticEnv(QuadraticConfig(dim=4, condition=10.0, noise_scale=64.0))


@pytest.mark.parametrize("epochs, mini_batches", [(2, 4), (3, 1), (1, 4)])
def test_monte_carlo_matches_the_exact_epoch_recursion(epochs, mini_batches):
    R, rows, steps, lr = 16, 4000, 24, 0.6
    sampler = QuadraticReplay(ENV, R, R, R // mini_batches, rows, np.random.default_rng(7), on_policy=False,
                              epochs=epochs, mini_batches=mini_batches)
    params = ENV.init_params(rows)
    losses = []
    for step in range(steps):
        params = params + lr * sampler.gradient(step, params)
        losses.append(ENV.evaluate(params)["loss"])
    losses = np.array(losses)  # (steps, rows)
    exact = expected_loss(ENV, [lr], R, R, R // mini_batches, steps, on_policy=False, epochs=epochs,
                          mini_batches=mini_batches)[0, 1:]
    se = losses.std(axis=1) / np.sqrt(rows)
    z = (losses.mean(axis=1) - exact) / se
    assert np.abs(z).max() < 4.5, z
    # generations were drawn only when due: one every e m updates
    assert sampler.generated == R * -(-steps // (epochs * mini_batches))
    # the fixed order's extra noise is real: E F above on-policy's at B = R / m late in the run
    if epochs > 1:
        plain = expected_loss(ENV, [lr], R // mini_batches, R // mini_batches, R // mini_batches, steps,
                              on_policy=True)[0, 1:]
        assert exact[-1] > plain[-1]


def test_one_epoch_of_one_mini_batch_is_on_policy_exactly():
    lrs = [0.1, 0.5, 1.2]
    epochs = expected_loss_epochs(ENV, lrs, 32, 1, 1, 200)
    on_policy = expected_loss(ENV, lrs, 32, 32, 32, 200, on_policy=True)
    np.testing.assert_array_equal(epochs, on_policy)


def test_stationary_loss_is_the_recursions_limit():
    lrs = np.array([0.2, 0.9])
    curve = expected_loss_epochs(ENV, lrs, 16, 2, 4, 8 * 400)
    cycle_mean = curve[:, -8:].mean(axis=1)  # the last generation's 8 updates
    np.testing.assert_allclose(stationary_loss_epochs(ENV, lrs, 16, 2, 4), cycle_mean, rtol=1e-9)
    design = Design.epochs_of(16, 2, 4)
    np.testing.assert_allclose(to_target.stationary_loss(ENV, design, lrs), cycle_mean, rtol=1e-9)
    assert np.isinf(stationary_loss_epochs(ENV, [2.5], 16, 2, 4)).all()  # eta h >= 2: diverges


def test_run_to_target_trains_an_epoch_design():
    env = QuadraticEnv(QuadraticConfig(dim=4, condition=10.0, noise_scale=2.0))
    design = Design.epochs_of(16, 2, 4)
    trace = to_target.run_to_target(env, None, design, [0.5, 0.25], 8, "sgd", env.target, 2000)
    exact = to_target.expected_to_target(env, design, [0.5, 0.25], 2000)
    assert (exact.stationary < -env.target).all()
    assert exact.crossing.tolist() == [4, 8]  # the exact curve's first step at or below the target
    assert abs(trace.crossing[0, 0] - exact.crossing[0]) <= 2  # the MC seed mean's (the run stops once it is best)

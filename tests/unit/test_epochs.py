"""The epochs design (issue 40): e epochs over m mini-batches of each generation of R (core/buffers/'s
``EpochSchedule``, the registry's "epochs"). Its schedule and its compute worked out by hand, e = m = 1 against the
on-policy design, the noisy quadratic under SGD against ``theory.reuse_families.psi_epochs``, and the refusals.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from replay_theory.core.buffers import EpochSchedule
from replay_theory.core.designs import BUFFER_DESIGNS, BufferSpec, DesignConfig, make_design_buffer
from replay_theory.core.rng import PerSeedGenerator
from replay_theory.core.rollouts import RolloutBatch
from replay_theory.simulate.config import SimConfig
from replay_theory.simulate.engine import run
from replay_theory.simulate.envs.quadratic import QuadraticConfig, QuadraticEnv
from replay_theory.theory.reuse_families import psi_epochs

FAST = dict(seeds=3, steps=24, eval_every=6, measure_drift=False, num_prompts=16)


def _generation(num_seeds: int, size: int, step: int) -> RolloutBatch:
    """R rollouts generated at ``step`` whose ``group`` is the position 0..R-1 (what the schedule reads back)."""
    ids = np.broadcast_to(np.arange(size), (num_seeds, size)).copy()
    zeros = np.zeros((num_seeds, size))
    return RolloutBatch(prompt=ids, tokens=ids[:, :, None], mask=np.ones((num_seeds, size, 1), bool),
                        logp_behav=zeros[:, :, None], reward=zeros, advantage=zeros,
                        created=np.full((num_seeds, size), step), group=ids)


def _run_schedule(schedule: EpochSchedule, rng, steps: int, size: int, b: int):
    """(positions, staleness, time since last use) of each update (steps, S, b), a generation whenever due."""
    seen, stale, since = [], [], []
    for step in range(steps):
        if schedule.due():
            schedule.add(_generation(schedule.num_seeds, size, step), step)
        drawn = schedule.sample(b, step, rng)
        np.testing.assert_array_equal(drawn.batch.group, drawn.index)  # the batch is the rollouts at those positions
        seen.append(drawn.index.copy())
        stale.append(drawn.staleness)
        since.append(drawn.time_since_last_use)
    return np.array(seen), np.array(stale), np.array(since)


# --------------------------------------------------------------------------- the schedule by hand


def test_fixed_order_e2_m2_r8_by_hand():
    """One permutation per generation (argsort of 8 uniforms of the seeded generator), the same slices each epoch."""
    rng = np.random.default_rng(0)
    perm = np.argsort(np.random.default_rng(0).random((1, 8)), axis=1)[0]
    np.testing.assert_array_equal(perm, [3, 2, 1, 6, 0, 7, 4, 5])  # the permutation, written out
    seen, stale, since = _run_schedule(EpochSchedule(1, epochs=2, mini_batches=2), rng, 8, 8, 4)
    first, second = [3, 2, 1, 6], [0, 7, 4, 5]
    np.testing.assert_array_equal(seen[:4, 0], [first, second, first, second])  # update j: slice j mod 2
    assert sorted(np.concatenate(seen[:4, 0])) == sorted(2 * list(range(8)))  # each rollout exactly e = 2 times
    np.testing.assert_array_equal(stale[:, 0, 0], [0, 1, 2, 3, 0, 1, 2, 3])  # updates since the generation
    np.testing.assert_array_equal(since[:4, 0, 0], [-1, -1, 2, 2])  # fixed order: m = 2 updates between uses
    # the second generation (step 4) draws its own permutation: the next 8 uniforms
    assert not np.array_equal(seen[4:, 0], seen[:4, 0])
    assert sorted(np.concatenate(seen[4:, 0])) == sorted(2 * list(range(8)))


def test_shuffled_e2_m2_r8_by_hand():
    """A permutation at the start of every epoch: two draws per generation, in order."""
    g = np.random.default_rng(0)
    p1, p2 = (np.argsort(g.random((1, 8)), axis=1)[0] for _ in range(2))
    np.testing.assert_array_equal(p1, [3, 2, 1, 6, 0, 7, 4, 5])
    np.testing.assert_array_equal(p2, [3, 5, 7, 0, 6, 2, 4, 1])
    seen, _, since = _run_schedule(EpochSchedule(1, epochs=2, mini_batches=2, shuffle=True),
                                   np.random.default_rng(0), 4, 8, 4)
    np.testing.assert_array_equal(seen[:, 0], [[3, 2, 1, 6], [0, 7, 4, 5], [3, 5, 7, 0], [6, 2, 4, 1]])
    assert sorted(np.concatenate(seen[:, 0])) == sorted(2 * list(range(8)))
    # epoch 2's lags are the update of the second use minus that of the first: random, 1 .. 3
    np.testing.assert_array_equal(since[2, 0], [2, 1, 1, 1])  # positions 3, 5, 7, 0: first used at 0, 1, 1, 1
    np.testing.assert_array_equal(since[3, 0], [3, 3, 2, 3])  # positions 6, 2, 4, 1: first used at 0, 0, 1, 0


def test_seeds_draw_their_own_streams_and_every_rollout_is_used_e_times():
    """With a PerSeedGenerator each seed's permutation is its own generator's argsort; e = 3, m = 4, R = 8."""
    S, R, e, m = 3, 8, 3, 4
    schedule = EpochSchedule(S, e, m, shuffle=True)
    seen, _, _ = _run_schedule(schedule, PerSeedGenerator(7, S), 2 * e * m, R, R // m)
    for s in range(S):
        g = np.random.default_rng([7, s])
        want = np.concatenate([np.argsort(g.random(R)) for _ in range(2 * e)])  # one per epoch, two generations
        np.testing.assert_array_equal(seen[:, s].ravel(), want)
        for gen in range(2):
            counts = np.bincount(seen[gen * e * m:(gen + 1) * e * m, s].ravel(), minlength=R)
            np.testing.assert_array_equal(counts, np.full(R, e))
    np.testing.assert_array_equal(schedule.evicted_use_counts(), np.full(S * R, e))  # the first generation's


def test_one_mini_batch_keeps_generation_order_and_draws_nothing():
    rng = PerSeedGenerator(0, 2)
    before = rng.random((2, 4))
    rng = PerSeedGenerator(0, 2)
    seen, stale, since = _run_schedule(EpochSchedule(2, epochs=3, mini_batches=1), rng, 6, 5, 5)
    np.testing.assert_array_equal(seen, np.broadcast_to(np.arange(5), (6, 2, 5)))
    np.testing.assert_array_equal(stale[:, 0, 0], [0, 1, 2, 0, 1, 2])
    np.testing.assert_array_equal(since[:, 0, 0], [-1, 1, 1, -1, 1, 1])
    np.testing.assert_array_equal(rng.random((2, 4)), before)  # no random number was used


# --------------------------------------------------------------------------- through the simulator


def test_compute_accounting_by_hand():
    """e = 2, m = 4, R = 64, b = 16, mu = 5.28: each generation is charged mu R once; every update b."""
    e, m, R, mu = 2, 4, 64, 5.28
    b = R // m
    result = run(SimConfig(**FAST, buffer="epochs", epochs=e, mini_batches=m, rollouts_per_step=R, batch_size=b))
    steps = FAST["steps"]
    t = np.arange(steps)
    generations = t // (e * m) + 1  # generations made by update t
    want = mu * R * generations + (t + 1) * b
    np.testing.assert_allclose(result.curves["compute"], np.broadcast_to(want, (3, steps)), rtol=1e-12)
    assert result.curves["compute"][0, e * m - 1] == pytest.approx(mu * R + e * m * (R / m))  # 401.92
    s = result.summary()
    assert s["compute_ratio"] == pytest.approx((mu * R * 3 + steps * b) / ((mu + 1) * steps * b))
    assert s["replay_ratio"] == e  # K_training / K_inference
    assert s["mean_staleness"] == pytest.approx((e * m - 1) / 2)  # update j of a generation: staleness j
    assert s["max_staleness"] == e * m - 1
    assert s["mean_time_since_last_use"] == m  # fixed order: every reuse m updates later
    assert s["mean_replay_count_evicted"] == e
    np.testing.assert_array_equal(result.curves["staleness_mean"][0], t % (e * m))
    # the clip and importance ratio apply: on-policy at j = 0, off-policy after the first update
    ess = result.curves["ess_frac"]
    assert np.all(ess[:, t % (e * m) == 0] == 1.0) and np.all(ess[:, t % (e * m) > 0] < 1.0)
    # the step's fresh rewards only where it generated
    assert np.all(np.isfinite(result.curves["reward"][:, ::e * m]))
    assert np.all(np.isnan(result.curves["reward"][:, t % (e * m) > 0]))


def test_one_epoch_one_mini_batch_is_the_on_policy_design():
    """Same seed, B = R: every curve, every evaluation and every count equal to --buffer on-policy's."""
    a = run(SimConfig(**FAST, buffer="epochs", epochs=1, mini_batches=1))
    b = run(SimConfig(**FAST, buffer="on-policy"))
    assert set(a.curves) == set(b.curves)
    for name in a.curves:
        np.testing.assert_array_equal(a.curves[name], b.curves[name], err_msg=name)
    for name in a.evals:
        np.testing.assert_array_equal(a.evals[name], b.evals[name], err_msg=name)
    sa, sb = a.summary(), b.summary()
    for key in sb:
        if key != "mean_replay_count_evicted":  # on-policy has no buffer; epochs' evicted rollouts were used once
            assert sa[key] == sb[key] or (sa[key] != sa[key] and sb[key] != sb[key]), key
    assert sa["mean_replay_count_evicted"] == 1.0


def test_epochs_learns_with_the_clip():
    result = run(SimConfig(**{**FAST, "steps": 60}, buffer="epochs", epochs=2, mini_batches=2, batch_size=32,
                           epoch_shuffle=True))
    assert np.all(result.evals["reward"][:, -1] > result.evals["reward"][:, 0] + 0.05)
    assert np.nanmax(result.curves["pg_clipfrac"]) > 0  # reused rollouts leave the trust region sometimes


# --------------------------------------------------------------------------- the noisy quadratic against psi_E


def _quadratic_epochs(epochs: int, mini_batches: int, shuffle: bool, lr: float, seeds: int, generations: int,
                      burn: int) -> tuple[float, float, float]:
    """(measured E F, its standard error, psi_E's E F): SGD on the noisy quadratic, each update's noise the mean of
    its mini-batch's stored noise vectors (positions from ``EpochSchedule``), started at theta*."""
    env = QuadraticEnv(QuadraticConfig(dim=8, condition=20.0, noise_scale=64.0))
    R, e, m = 8, epochs, mini_batches
    b = R // m
    rng = np.random.default_rng([40, e, m, shuffle])
    schedule = EpochSchedule(seeds, e, m, shuffle=shuffle)
    params = np.tile(env.optimum, (seeds, 1))
    total, count, step = np.zeros(seeds), 0, 0
    xi = np.zeros((seeds, R, env.param_dim))
    for gen in range(burn + generations):
        xi = rng.standard_normal((seeds, R, env.param_dim)) * env.noise_std  # fixed at draw
        schedule.add(_generation(seeds, R, step), step)
        for _ in range(e * m):
            index = schedule.sample(b, step, rng).index  # (S, b)
            noise = np.take_along_axis(xi, index[:, :, None], axis=1).mean(axis=1)  # (S, d)
            params = params + lr * (env.exact_grad(params) - noise)
            if gen >= burn:
                total += env.evaluate(params)["loss"]
                count += 1
            step += 1
    per_seed = total / count
    kappa = lr * env.curvature
    fresh = lr**2 * env.noise_var / (b * kappa * (2 - kappa))  # Var e of fresh mini-batches of b (SGD)
    theory = float(0.5 * np.sum(env.curvature * psi_epochs(e, m, kappa, shuffle=shuffle) * fresh))
    return float(per_seed.mean()), float(per_seed.std(ddof=1) / math.sqrt(seeds)), theory


@pytest.mark.parametrize("epochs, mini_batches, shuffle", [(2, 2, False), (3, 4, True)])
def test_noisy_quadratic_matches_psi_epochs(epochs, mini_batches, shuffle):
    """E F against 1/2 sum_i h_i psi_E(kappa_i) eta^2 sigma_i^2 / (b kappa_i (2 - kappa_i)), kappa_i = eta h_i in
    0.025 .. 0.5: within 4 standard errors and 3%; reuse raises it well above on-policy's (psi_E = 1)."""
    lr = 0.5
    burn = -(-int(12 / (lr / 20)) // (epochs * mini_batches))  # 12 memories of the slowest direction
    mean, se, theory = _quadratic_epochs(epochs, mini_batches, shuffle, lr, seeds=400,
                                         generations=3000 // (epochs * mini_batches), burn=burn)
    assert abs(mean - theory) <= 4 * se and abs(mean - theory) <= 0.03 * theory, (mean, se, theory)
    env = QuadraticEnv(QuadraticConfig(dim=8, condition=20.0, noise_scale=64.0))
    kappa, b = lr * env.curvature, 8 // mini_batches
    on_policy = float(0.5 * np.sum(env.curvature * lr**2 * env.noise_var / (b * kappa * (2 - kappa))))
    assert mean > 1.3 * on_policy


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("changes, message", [
    (dict(mini_batches=4), "batch_size must be rollouts_per_step / mini_batches = 64 / 4 = 16 (each update trains "
                           "one mini-batch of the generation), got 64"),
    (dict(mini_batches=3, batch_size=21), "rollouts_per_step must be a multiple of mini_batches = 3 (equal "
                                          "mini-batches of one generation), got 64"),
    (dict(epochs=0), "epochs must be an integer >= 1, got 0"),
    (dict(mini_batches=0), "mini_batches must be an integer >= 1, got 0"),
    (dict(epochs=1.5), "epochs must be an integer >= 1, got 1.5"),
])
def test_bad_epoch_designs_are_refused_in_one_line(changes, message):
    with pytest.raises(ValueError) as info:
        DesignConfig(buffer="epochs", **changes).validated_design()
    assert str(info.value) == message


def test_async_is_refused_and_the_simulator_config_checks_too():
    with pytest.raises(ValueError) as info:
        DesignConfig(buffer="epochs").validated_design("async")
    assert str(info.value) == "the async pipeline supports buffer on-policy, fifo, got 'epochs'"
    assert BUFFER_DESIGNS["epochs"].pipelines == ("sync",) and BUFFER_DESIGNS["epochs"].trainer  # TRL runs it
    with pytest.raises(ValueError, match="batch_size must be rollouts_per_step / mini_batches = 64 / 2 = 32"):
        SimConfig(buffer="epochs", mini_batches=2).validated()


def test_schedule_refusals():
    for kwargs, name in ((dict(epochs=0, mini_batches=1), "epochs"), (dict(epochs=1, mini_batches=0), "mini_batches")):
        with pytest.raises(ValueError, match=name):
            EpochSchedule(1, **kwargs)
    schedule = EpochSchedule(1, epochs=1, mini_batches=2)
    with pytest.raises(ValueError, match="cannot sample before a generation is added"):
        schedule.sample(4, 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="does not split into mini_batches = 2 equal mini-batches"):
        schedule.add(_generation(1, 7, 0), 0)
    schedule.add(_generation(1, 8, 0), 0)
    with pytest.raises(ValueError, match="batch_size must be rollouts / mini_batches = 8 / 2 = 4, got 8"):
        schedule.sample(8, 0, np.random.default_rng(0))
    for step in range(2):
        schedule.sample(4, step, np.random.default_rng(0))
    assert schedule.due()
    with pytest.raises(ValueError, match="the generation's 2 updates are done"):
        schedule.sample(4, 2, np.random.default_rng(0))


def test_registry_builds_the_schedule_from_the_config():
    buffer = make_design_buffer(DesignConfig(buffer="epochs", epochs=3, mini_batches=2, epoch_shuffle=True),
                                BufferSpec(num_seeds=2, seq_len=1))
    assert isinstance(buffer, EpochSchedule)
    assert (buffer.num_seeds, buffer.epochs, buffer.mini_batches, buffer.shuffle) == (2, 3, 2, True)
    assert buffer.updates_per_generation == 6 and len(buffer) == 0

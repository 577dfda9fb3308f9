"""App. E count-based mu (count_window), the micro-batched update and the gradient sketch of calibrate.

Levels: hand-computed counts with a fake clock; the micro-batched update against the
whole-batch update; sketched per-sample gradients against the full ones.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from replay_theory.theory.compute import estimate_mu  # noqa: E402
from replay_theory.validate import countdown  # noqa: E402
from replay_theory.validate import model as M  # noqa: E402
from replay_theory.validate.calibrate import (  # noqa: E402
    count_window,
    gradient_coordinates,
    measure_mu_count,
    per_sample_grads,
)
from replay_theory.validate.rl import RLConfig, generate_batch, update_step  # noqa: E402


class FakeClock:
    """Time advances only when a side works: generation costs ``gen`` s per call, an update ``upd`` s."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _sides(clock: FakeClock, gen_s: float, upd_s: float, rollouts: int, samples: int):
    log = []

    def generate_once():
        clock.now += gen_s
        log.append("g")
        return rollouts

    def update_once():
        clock.now += upd_s
        log.append("u")
        return samples

    return generate_once, update_once, log


@pytest.mark.parametrize("window,k_inference,k_training", [
    # 0.5 s per 16 rollouts, 0.125 s per update on 8 samples, binary-exact times.
    (4.0, 8 * 16, 32 * 8),  # 8 generations end at 0.5..4.0, 32 updates at 0.125..4.0: all inside
    (4.1, 8 * 16, 32 * 8),  # the 9th generation (4.5) and the 33rd update (4.125) end outside: not counted
    (3.9, 7 * 16, 31 * 8),  # the 8th generation and the 32nd update end at 4.0 > 3.9
])
def test_count_window_counts_work_finished_inside_the_window(window, k_inference, k_training):
    clock = FakeClock()
    generate_once, update_once, log = _sides(clock, 0.5, 0.125, 16, 8)
    out = count_window(generate_once, update_once, window, clock=clock)
    assert (out["k_inference"], out["k_training"]) == (k_inference, k_training)
    # App. E with W = T = 1: mu = (K_training / T) / (K_inference / W)
    assert out["mu"] == pytest.approx(k_training / k_inference) == estimate_mu(k_training, k_inference, 1, 1)
    assert (out["workers"], out["trainers"], out["seconds"]) == (1, 1, window)
    assert log[0] == "g"  # generation first: the buffer needs data before the first update
    if window == 4.0:
        # per-unit costs: rollout 0.5 / 16, sample 0.125 / 8 -> mu = (1/32) / (1/64) = 2 exactly
        assert out["mu"] == 2.0 and out["generation_busy_s"] == 4.0 and out["training_busy_s"] == 4.0
        assert log[:6] == ["g", "u", "u", "u", "u", "g"]  # the side that is behind works next
    if window == 3.9:
        assert out["mu"] == pytest.approx(248 / 112)  # edge effects of a short window: 2.214, not 2


def test_count_window_rejects_bad_windows_and_stuck_clocks():
    clock = FakeClock()
    generate_once, update_once, _ = _sides(clock, 0.0, 0.0, 1, 1)
    with pytest.raises(ValueError, match="count window must be > 0 seconds"):
        count_window(generate_once, update_once, 0.0, clock=clock)
    with pytest.raises(RuntimeError, match="clock did not advance"):
        count_window(generate_once, update_once, 1.0, clock=clock)


@pytest.fixture(scope="module")
def tiny():
    train_set, _ = countdown.make_splits(40, 4, seed=2)
    return M.load_policy(M.ModelConfig(), countdown.ALPHABET), train_set


@pytest.mark.slow
def test_measure_mu_count_on_the_tiny_pipeline(tiny):
    policy, train_set = tiny
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    config = RLConfig(steps=2, rollouts_per_step=8, group_size=4, batch_size=4, capacity=16, max_new_tokens=6)
    out = measure_mu_count(policy, train_set, config, window_seconds=1.0)
    assert out["k_inference"] % 8 == 0 and out["k_training"] % 4 == 0  # whole generations of R, updates of B
    assert out["k_inference"] > 0 and out["k_training"] > 0
    assert out["mu"] == pytest.approx(out["k_training"] / out["k_inference"])
    assert out["generation_busy_s"] >= 1.0 and out["training_busy_s"] >= 1.0
    assert all(torch.equal(before[k], v) for k, v in policy.model.state_dict().items())  # ran on a copy


def test_micro_batched_update_equals_the_whole_batch_update(tiny):
    policy, train_set = tiny
    config = RLConfig(steps=1, rollouts_per_step=8, group_size=4, batch_size=8, capacity=8, max_new_tokens=8,
                      loss="asymre", lr=1e-2)
    batch, _ = generate_batch(policy, train_set, np.array([0, 1]), config, 0, 0, torch.Generator().manual_seed(0))
    results = {}
    for micro in (0, 3):  # 3: chunks of 3, 3 and 2 completions
        copy_ = copy.deepcopy(policy)
        optimizer = torch.optim.SGD(copy_.model.parameters(), lr=config.lr)
        logp, out = update_step(copy_, optimizer, train_set, RLConfig(**{**config.__dict__, "micro_batch_size": micro}),
                                batch)
        results[micro] = (logp, out, [p.grad.detach().clone() for p in copy_.model.parameters()])
    (logp0, out0, grads0), (logp3, out3, grads3) = results[0], results[3]
    assert logp0.shape == logp3.shape == (8, batch.tokens.shape[-1])
    torch.testing.assert_close(logp3, logp0, rtol=0, atol=1e-5)
    assert float(out3.loss[0]) == pytest.approx(float(out0.loss[0]), abs=1e-6)
    assert max(float(g.abs().max()) for g in grads0) > 1e-3  # a real gradient...
    for a, b in zip(grads0, grads3):  # ...and the same one, accumulated over chunks
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="micro_batch_size must be >= 0"):
        RLConfig(micro_batch_size=-1).validated()


def test_gradient_sketch_keeps_the_chosen_coordinates(tiny):
    policy, train_set = tiny
    assert gradient_coordinates(1000, 1000, 0) is None and gradient_coordinates(1000, None, 0) is None
    coords = gradient_coordinates(1000, 50, 7)
    assert coords.shape == (50,) and bool((coords[1:] >= coords[:-1]).all()) and 0 <= int(coords.min())
    assert int(coords.max()) < 1000 and torch.equal(coords, gradient_coordinates(1000, 50, 7))  # seeded
    config = RLConfig(steps=1, rollouts_per_step=4, group_size=4, batch_size=4, capacity=4, max_new_tokens=6,
                      loss="asymre")
    batch, _ = generate_batch(policy, train_set, np.array([3]), config, 0, 0, torch.Generator().manual_seed(1))
    num_params = sum(p.numel() for p in policy.model.parameters())
    coords = gradient_coordinates(num_params, 2048, 3)
    full = per_sample_grads(policy, train_set, batch, config)  # (4, P)
    sketched = per_sample_grads(policy, train_set, batch, config, coords)  # (4, 2048)
    assert full.shape == (4, num_params) and sketched.shape == (4, 2048)
    assert torch.equal(sketched, full[:, coords])

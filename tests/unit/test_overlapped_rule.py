"""Overlapped generation (bounded staleness, issue 40) in the forgetting-aware rule: the GPU split's time per step
by hand and against a brute-force search over the split, an overlapped design's steps and cost in
theory/forgetting.predict_many by hand, the whole-design search against a naive loop over every batch, the guard
(no staleness table, no overlap), and ``optimal --max-staleness`` (the answer, the framework lines, bad input)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from optimal_profile import staleness

from replay_theory.advise.advice import NO_BUDGET
from replay_theory.theory import forgetting as fg
from replay_theory.theory.designs import Design
from replay_theory.theory.guarded import guarded_design

ONE_STEP = ((0.0, 1.0, 2.0, 4.0), (1.0, 1.05, 1.15, 1.4))
"""A measured sigma^2(s) table reaching age 4: r(1) = 1.05."""


def brute_split(R: float, B: float, mu: float, floor: float) -> float:
    """The least step time over a fine grid of generation shares gamma: generation of R on gamma of the pool takes
    mu max(R / gamma, floor), training B on the rest B / (1 - gamma), a step the longer of the two."""
    gamma = np.linspace(1e-5, 1 - 1e-5, 400_001)
    return float(np.min(np.maximum(mu * np.maximum(R / gamma, floor), B / (1 - gamma))))


@pytest.mark.parametrize("R, B, mu, floor", [(32, 32, 5.28, 64), (256, 256, 5.28, 64), (8, 64, 1.0, 128),
                                             (64, 8, 20.0, 128), (16, 16, 0.5, 128), (100, 300, 2.0, 0)])
def test_the_split_is_the_brute_force_minimum(R, B, mu, floor):
    time, low, high = fg.overlapped_split(R, B, mu, floor)
    assert time == pytest.approx(brute_split(R, B, mu, floor), rel=1e-4)
    assert time == pytest.approx(max(mu * floor, mu * R + B))  # [T1]
    for gamma in (low, high, 0.5 * (low + high)):  # every share the answer names reaches that time
        assert max(mu * max(R / gamma, floor), B / (1 - gamma)) == pytest.approx(time, rel=1e-12)


def test_the_split_by_hand():
    # below the floor: generation of 32 waits on the floor of 64 (5.28 x 64 = 337.92), training 32 fits beside it
    # on any share up to 1 - 32 / 337.92; the synchronous step takes 337.92 + 32
    time, low, high = fg.overlapped_split(32, 32, 5.28, 64)
    assert (time, low, high) == pytest.approx((337.92, 0.5, 1 - 32 / 337.92))
    assert fg.step_cost(32, 32, 5.28, 64) == pytest.approx(369.92)
    # above the floor overlap saves nothing: the balance point gamma = mu R / (mu R + B) takes mu R + B
    time, low, high = fg.overlapped_split(256, 256, 5.28, 64)
    assert time == pytest.approx(6.28 * 256) == pytest.approx(fg.step_cost(256, 256, 5.28, 64))
    assert low == high == pytest.approx(5.28 / 6.28)


def test_an_overlapped_design_is_priced_by_hand():
    table = fg.Staleness(*ONE_STEP, "test")
    d = Design.overlapped_at(32)
    assert (d.batch_size, d.rollouts_per_step, d.capacity, d.on_policy, d.oldest_age) == (32, 32, 32, True, 1)
    # no memory: one use at age 1, B V = r(1) = 1.05; a step is the split's time
    p = fg.predict(d, 100.0, 5.28, None, table, floor=64)
    assert p.steps == pytest.approx(1 + 100 * 1.05 / 32)
    assert p.cost_per_step == pytest.approx(337.92)
    assert p.compute == pytest.approx(p.steps * 337.92)
    sync = fg.predict(Design.on_policy_at(32), 100.0, 5.28, None, table, floor=64)
    assert sync.steps == pytest.approx(1 + 100 / 32) and sync.cost_per_step == pytest.approx(369.92)
    # no policy to drift (the quadratic): the same steps as synchronous, in less time a step
    free = fg.predict(d, 100.0, 5.28, None, fg.NO_POLICY, floor=64)
    assert free.steps == pytest.approx(sync.steps) and free.compute < sync.compute


def test_the_tuned_step_of_an_overlapped_design():
    # step feedback: r(1) at the synchronous batch's own tuned step, then the step that noise tunes to
    memory, table = fg.Memory(0.2, "sgd", 0.9, 256.0), fg.Staleness(*ONE_STEP, "test")
    p = fg.predict(Design.overlapped_at(64), 500.0, 2.0, memory, table, floor=128)
    k_max, alpha = memory.kappa_max(500.0), memory.alpha
    own = k_max / (1 + 500.0 / 64) ** alpha  # the synchronous batch's step
    r_own = float(table.at(own / memory.kappa))
    kappa = k_max / (1 + 500.0 / 64 * r_own) ** alpha
    assert p.kappa == pytest.approx(kappa, rel=1e-12)
    assert p.steps == pytest.approx(1 + 500.0 / 64 * float(table.at(kappa / memory.kappa)), rel=1e-12)


def test_the_search_finds_the_cheapest_overlapped_batch_a_naive_loop_finds():
    memory, table, b_noise, mu, floor = fg.Memory(0.2, "adam", 0.9, 256.0), fg.Staleness(*ONE_STEP, "t"), 600., 1., 512
    w = fg.whole_design(b_noise, 256, mu, memory, group_size=8, staleness=table, floor=floor, max_staleness=3)
    cap = 2.0 * w.at_batch.steps
    every = [fg.predict(Design.overlapped_at(b), b_noise, mu, memory, table, floor) for b in range(8, 1025, 8)]
    best = min((p for p in every if p.steps <= cap), key=lambda p: p.compute)
    assert w.overlapped.design == best.design and w.overlapped.compute == pytest.approx(best.compute)
    assert w.overlapped.design.max_staleness == 1  # a larger bound only adds staleness in the model
    assert w.winner == "overlapped" and w.best is w.overlapped  # below the floor, training hides beside generation
    assert fg.whole_design(b_noise, 256, mu, memory, group_size=8, staleness=table, floor=floor).overlapped is None


def test_the_guard_offers_overlap_only_where_age_one_was_measured():
    memory = fg.Memory(0.2, "adam", 0.9, 256.0)
    kwargs = dict(optimizer="adam", group_size=8, floor=2048, max_steps_ratio=NO_BUDGET, max_staleness=1)
    bare = guarded_design(1024.0, 256, 1.0, memory, **kwargs)  # no table: nothing measured beyond age 0
    assert all(not d.max_staleness for d in bare.candidates)
    assert any("no overlapped generation" in limit for limit in bare.limits)
    g = guarded_design(1024.0, 256, 1.0, memory, staleness=staleness(ONE_STEP), **kwargs)
    assert g.moved and g.choice.design == Design.overlapped_at(1024, 1) and not g.limits[1:]
    assert g.worst_choice * 1.2 < g.worst_default  # it beat the floor rule's batch by the margin


def test_optimal_answers_with_overlap_only_when_asked(cli, optimal_profile):
    args = ("optimal", "--mu", "1", "-B", "256", "--profile", optimal_profile(1024.0, ONE_STEP), "--kappa", "0.2",
            "--optimizer", "adam", "--group-size", "8", "--latency-floor", "2048")
    code, out, _ = cli(*args, "--json")
    assert code == 0 and "overlapped" not in json.loads(out)["designs"]  # the default prices none
    code, out, _ = cli(*args, "--max-staleness", "4", "--framework", "trl", "--json")
    d = json.loads(out)
    assert code == 0 and d["regime"] == d["winner"] == "overlapped"
    assert (d["batch_size"], d["rollouts_per_step"], d["capacity"], d["max_staleness"]) == (1024, 1024, 1024, 1)
    assert d["generation_share"] == pytest.approx([0.5, 0.5])  # mu R = B: the balance point reaches mu floor
    assert d["what_to_do"] == ("overlap generation with training, one step off (max_staleness = 1), at B = R = 1024 "
                               "with a share 0.50 of the GPUs generating")
    assert d["evidence"].endswith("overlapped generation: the default protocol trains none (experiment theory-test "
                                  "--families overlap does, docs/SIMULATION.md), so no share above speaks for it")
    assert d["framework"]["target"] == "AsyncGRPOConfig" and "max_staleness=1" in d["framework"]["lines"]
    # priced with the families, the answer's record is the run that trains them: its share at this floor (a floor of
    # 2048 at B = 256: the nearest of the benchmark's, 128 of 256), in the tested: line and the second evidence line
    from replay_theory.advise import evidence

    fam = json.loads(evidence.FAMILIES_EVIDENCE_FILE.read_text())["targets_held_out"]["128"]["objectives"]["printed"]
    share = f"{100 * fam['free']['share_within_1.2']:.0f}%"
    assert d["verdict"].startswith("tested: at a latency floor of half of the batch no rule passes the benchmark with "
                                   "the reuse families in the grid (the answer optimal prints is within 1.2x of the "
                                   f"cheapest design in {share} of test cases")
    assert d["families_evidence"].startswith("evidence with the reuse families in the grid (epochs, overlap, "
                                             "selective trained and scored beside it; held-out instances, latency "
                                             "floor 128;")
    assert f"within 1.2x of the cheapest design in {share} (worst" in d["families_evidence"]
    assert "families_evidence" not in json.loads(cli(*args, "--json")[1])  # not priced, not quoted
    code, out, _ = cli(*args, "--max-staleness", "1", "--framework", "skyrl", "--json")
    assert "trainer.fully_async.max_staleness_steps=1" in json.loads(out)["framework"]["lines"]


@pytest.mark.parametrize("value", ["-1", "65", "1.5"])
def test_max_staleness_out_of_range_is_one_line(cli, value):
    code, out, err = cli("optimal", "--mu", "5.28", f"--max-staleness={value}")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--max-staleness" in err and "[0, 64]" in err


def test_an_overlapped_design_uses_each_rollout_once():
    with pytest.raises(ValueError, match="needs on-policy sizes N = R = B"):
        Design(64, 32, 64, False, max_staleness=1)
    from replay_theory.core.designs import DesignConfig

    d = Design.overlapped_at(64, 2, 8)
    config = DesignConfig.from_design(d)
    assert (config.buffer, config.stale_k, config.batch_size, config.rollouts_per_step) == ("stale-k", 2, 64, 64)
    assert config.design == d  # the simulator's stale-k queue trains it: each batch once, k updates late


def test_the_replay_trainer_refuses_an_overlapped_answer_in_one_line(cli, optimal_profile):
    from replay_theory.integrations.replay_config import ReplayConfig

    code, out, _ = cli("optimal", "--mu", "1", "-B", "256", "--profile", optimal_profile(1024.0, ONE_STEP), "--kappa",
                       "0.2", "--optimizer", "adam", "--group-size", "8", "--latency-floor", "2048",
                       "--max-staleness", "1", "--json")
    assert code == 0 and json.loads(out)["regime"] == "overlapped"
    with pytest.raises(ValueError, match=r"answers overlapped generation \(max_staleness = 1\).*--framework.*"
                                         r"buffer stale-k with stale_k = 1, N = B = R$"):
        ReplayConfig.from_optimal_json(out)
    # asked for buffer stale-k, the trainer runs the answer's staleness without the overlap, and says so
    replay = ReplayConfig.from_optimal_json(out, group_size=8, buffer="stale-k", design={"stale_k": 4})
    assert (replay.capacity, replay.batch_size, replay.rollouts_per_step, replay.buffer) == (1024, 1024, 1024,
                                                                                              "stale-k")
    assert replay.shared.stale_k == 1 and replay.notes == (
        "overlapped generation (max_staleness = 1) run as buffer stale-k, k = 1: the same staleness, generated in "
        "the update's own step (no overlap, so none of its wall-time gain)",)


@pytest.mark.parametrize("mu", [0.1, 0.5, 1.0, 5.28, 20.0])
def test_overlap_saves_at_most_a_share_one_over_two_plus_mu_of_a_step(mu):
    # R = B below the floor: the saving min(B, mu (F - B)) over the synchronous mu F + B peaks at (1 + mu) B = mu F
    floor = 1000.0
    batches = np.linspace(1.0, floor, 20001)
    sync = fg.step_cost(batches, batches, mu, floor)
    overlap = fg.step_cost(batches, batches, mu, floor, overlapped=True)
    share = 1 - overlap / sync
    assert share.max() == pytest.approx(1 / (2 + mu), rel=1e-3)
    assert batches[np.argmax(share)] == pytest.approx(mu * floor / (1 + mu), rel=1e-3)
    assert np.all(share >= 0)


def test_an_epochs_answer_runs_as_buffer_epochs_in_the_replay_trainer(cli, optimal_profile):
    # optimal's epochs answer (e passes over m mini-batches of one generation of R) is TRL's own buffering, e and m
    # from the answer; before, it was read as a FIFO of N = R = B, one pass a generation
    from replay_theory.integrations.replay_config import ReplayConfig

    code, out, _ = cli("optimal", "--mu", "5", "-B", "256", "--profile", optimal_profile(1000.0), "--kappa", "0.9",
                       "--optimizer", "sgd", "--group-size", "8", "--max-epochs", "4", "--json")
    d = json.loads(out)
    assert code == 0 and d["regime"] == "epochs"
    e, m, r = d["epochs"], d["mini_batches"], d["rollouts_per_step"]
    replay = ReplayConfig.from_optimal_json(out, group_size=8, buffer="fifo")  # the trainer's default buffer
    assert (replay.buffer, replay.shared.epochs, replay.shared.mini_batches) == ("epochs", e, m)
    assert (replay.capacity, replay.batch_size, replay.rollouts_per_step) == (r, r // m, r)
    assert replay.notes == (f"epochs over mini-batches run as buffer epochs: e = {e} passes over m = {m} mini-batches "
                            f"of each generation of R = {r} (TRL num_iterations = {e}, steps_per_generation = {m})",)
    with pytest.raises(ValueError) as info:
        ReplayConfig.from_optimal_json(out, group_size=8, buffer="prioritized")
    assert str(info.value) == (f"the optimal --json output answers epochs over mini-batches (epochs = {e}, "
                               f"mini_batches = {m}), which buffer prioritized does not run: leave the buffer at its "
                               "default or give buffer epochs")

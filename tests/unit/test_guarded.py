"""theory/guarded.py: the floor rule's design unless the model beats it by the margin at every b it cannot rule out."""

from __future__ import annotations

import math

import numpy as np
import pytest

from replay_theory.theory import forgetting as fg
from replay_theory.theory.designs import Design
from replay_theory.theory.guarded import B_FACTORS, MARGIN, floor_batch, guarded_design, reuse_limits


def test_floor_batch_by_hand():
    # steps cap 2: 1 + 256/B' <= 2 (1 + 256/256) = 4 -> B' >= 85.3 -> whole groups of 8: 88
    assert floor_batch(256.0, 256, 8, 64.0, 2.0, 1024) == 88
    # no binding cap: the floor, in whole groups (64), or one group (8) at floor 0
    assert floor_batch(256.0, 256, 8, 64.0, 1000.0, 1024) == 64
    assert floor_batch(256.0, 256, 8, 0.0, 1000.0, 1024) == 8
    assert floor_batch(256.0, 256, 8, 60.0, 1000.0, 1024) == 64  # 60 rounded up to whole groups
    assert floor_batch(256.0, 256, 8, 5000.0, 1000.0, 1024) == 1024  # never above the largest batch searched
    assert floor_batch(1e9, 256, 8, 0.0, 1.0, 1024) == 256  # a cap of 1: only the user's B keeps its steps


def test_reuse_limits():
    assert reuse_limits("adam", fg.NO_POLICY)[0] == -1.0
    assert reuse_limits("sgd", fg.NO_STALENESS)[0] == 0.0  # nothing measured beyond age 0
    assert math.isinf(reuse_limits("sgd", fg.NO_POLICY)[0]) and reuse_limits("sgd", fg.NO_POLICY)[1] == ()
    table = fg.Staleness((0.0, 1.0, 2.0, 4.0), (1.0, 1.1, 1.3, 1.8), "a table")
    assert reuse_limits("sgd", table)[0] == 4.0


def test_small_b_moves_below_the_floor_and_large_b_keeps_the_floor():
    # mu = 1, floor 64, psi = 1 (no memory), no reuse measured: on-policy only. B_noise = 0.01: at every b up to
    # 256 x, steps ~ 1 and compute ~ mu 64 + B' per step: one group (8) costs 72 against the floor's 128, a worst
    # regret of 128/72 = 1.78 for the default against ~1 for B' = 8: a margin of 1.2 moves the answer to 8, the
    # default MARGIN of 2 keeps the floor's 64
    g = guarded_design(0.01, 256, 1.0, None, optimizer="sgd", group_size=8, floor=64.0, max_steps_ratio=1000.0,
                       margin=1.2)
    assert g.default.design == Design.on_policy_at(64)
    assert g.choice.design == Design.on_policy_at(8) and g.moved
    assert g.worst_default == pytest.approx(128 / 72, rel=0.01)
    assert MARGIN == 2.0 and not guarded_design(0.01, 256, 1.0, None, optimizer="sgd", group_size=8, floor=64.0,
                                                max_steps_ratio=1000.0).moved
    # mu = 4: the floor's step costs 4 x 64 + 64 = 320 against 4 x 64 + 8 = 264 for one group, 1.21x: even 1.2 stays
    # close; at floor 256 and mu = 0.25: 64 + 256 = 320 against 64 + 8 = 72, 4.4x > 2: moved at the default
    g = guarded_design(0.01, 256, 0.25, None, optimizer="sgd", group_size=8, floor=256.0, max_steps_ratio=1000.0)
    assert g.moved and g.choice.design == Design.on_policy_at(8)
    assert g.worst_default == pytest.approx(320 / 72, rel=0.01)
    # B_noise = 1e4: below the floor the steps grow as 1/B' at the same generation cost: the floor's 64 stays
    g = guarded_design(1e4, 256, 1.0, None, optimizer="sgd", group_size=8, floor=64.0, max_steps_ratio=1000.0)
    assert g.choice.design == Design.on_policy_at(64) and not g.moved


def test_the_worst_regret_is_the_naive_loop_over_factors():
    mem = fg.Memory(0.3, "sgd", 0.9, 256.0)
    g = guarded_design(300.0, 256, 5.28, mem, optimizer="sgd", group_size=8, staleness=fg.NO_POLICY, floor=16.0,
                       max_steps_ratio=1000.0)
    assert g.candidates[0] == g.default.design and len(set(g.candidates)) == len(g.candidates) > 3
    least = [min(fg.predict(d, 300.0 * f, 5.28, mem, fg.NO_POLICY, 16.0).compute for d in g.candidates)
             for f in B_FACTORS]
    for d, w in zip(g.candidates, g.worst):  # one prediction at a time against the vectorised matrix
        naive = max(fg.predict(d, 300.0 * f, 5.28, mem, fg.NO_POLICY, 16.0).compute / low
                    for f, low in zip(B_FACTORS, least))
        assert w == pytest.approx(naive, rel=1e-12)
    best = int(np.argmin(g.worst))  # no overlapped candidate here: one margin for all
    expected = g.candidates[best] if g.worst[0] > MARGIN * g.worst[best] else g.candidates[0]
    assert g.choice.design == expected and g.worst_choice == g.worst[g.candidates.index(expected)]


def test_no_reuse_under_adam_and_none_past_the_measured_age():
    mem = fg.Memory(0.3, "adam", 0.9, 256.0)
    g = guarded_design(3000.0, 256, 20.0, mem, optimizer="adam", group_size=8, staleness=fg.NO_POLICY,
                       max_steps_ratio=1000.0)
    assert g.choice.design.on_policy and g.search.replay is None
    assert g.limits and "adam" in g.limits[0]
    table = fg.Staleness((0.0, 1.0, 2.0, 3.0), (1.0, 1.01, 1.02, 1.03), "a table")
    mem = fg.Memory(0.3, "sgd", 0.9, 256.0)
    g = guarded_design(3000.0, 256, 20.0, mem, optimizer="sgd", group_size=8, staleness=table,
                       max_steps_ratio=1000.0, max_epochs=4)
    for p in (g.search.replay, g.search.epochs, g.choice):
        assert p is None or p.design.oldest_age <= 3
    free = fg.whole_design(3000.0, 256, 20.0, mem, group_size=8, staleness=table, max_steps_ratio=1000.0)
    assert free.replay.design.x > 4  # without the cap the search reaches past the measured ages


def test_oldest_age():
    assert Design.on_policy_at(64).oldest_age == 0
    assert Design(64, 16, 64).oldest_age == 3  # a FIFO of x = 4 steps
    assert Design.epochs_of(64, 2, 4).oldest_age == 7  # e m = 8 updates from one generation
    assert np.isinf(fg.NO_POLICY.oldest_measured) and fg.NO_STALENESS.oldest_measured == 0.0


def test_the_age_note_only_where_it_limits_the_search():
    table = fg.Staleness((0.0, 1.0, 63.0), (1.0, 1.0, 1.0), "a flat table")
    assert reuse_limits("sgd", table, reach=63.0) == (63.0, ())  # x up to 64 holds ages up to 63: nothing limited
    assert reuse_limits("sgd", table, reach=127.0)[1]  # a horizon of 128 would reach past it: said
    mem = fg.Memory(0.3, "sgd", 0.9, 256.0)
    assert guarded_design(3000.0, 256, 20.0, mem, optimizer="sgd", staleness=table, max_horizon=64).limits == ()
    assert guarded_design(3000.0, 256, 20.0, mem, optimizer="sgd", staleness=table, max_horizon=65).limits


def test_the_factors_start_at_the_measured_b():
    with pytest.raises(ValueError, match="b_factors must start at 1"):
        guarded_design(100.0, 256, 5.28, None, optimizer="sgd", b_factors=(4.0, 16.0))
    # a single factor of 1 and a margin of 1 is the bare argmin over the candidates at the measured b
    g = guarded_design(0.01, 256, 1.0, None, optimizer="sgd", group_size=8, floor=64.0, max_steps_ratio=1000.0,
                       b_factors=(1.0,), margin=1.0)
    assert g.choice.design == Design.on_policy_at(8) and g.worst_choice == 1.0


def test_a_b_read_too_high_keeps_the_floor_batch():
    # SGD, kappa 0.2, mu 5.28, floor 64, staleness flat to age 63, measured b = 1000. Priced only upwards (b ... 256 b)
    # the replay design B = 1024, R = 111, N = 7104 is within 1.03x of the least compute at every factor and beats
    # the floor rule's on-policy 64 (worst 2.99) by more than MARGIN. At b / 16 it costs 2.29x the floor design
    # (buffer and batch sized for noise that is not there), so over B_FACTORS its worst is 2.36: 2.99 / 2.36 < 2 and
    # the floor rule's batch stays.
    table = fg.Staleness(tuple(float(a) for a in range(64)), (1.0,) * 64, "flat to 63")
    mem = fg.Memory(0.2, "sgd", 0.9, 256.0)
    kw = dict(optimizer="sgd", floor=64.0, staleness=table, max_steps_ratio=1000.0)
    up = guarded_design(1000.0, 256, 5.28, mem, b_factors=(1.0, 4.0, 16.0, 64.0, 256.0), **kw)
    replay = Design(1024, 111, 7104)
    assert up.choice.design == replay and up.worst_choice == pytest.approx(1.023, abs=1e-3)
    assert up.worst_default == pytest.approx(2.992, abs=1e-3) and up.moved
    both = guarded_design(1000.0, 256, 5.28, mem, **kw)
    assert min(B_FACTORS) == 1 / 16 and both.choice.design == Design.on_policy_at(64) and not both.moved
    low = fg.predict_many([replay, Design.on_policy_at(64)], 1000.0 / 16, 5.28, mem, table, 64.0)
    assert low[0].compute / low[1].compute == pytest.approx(2.285, abs=1e-3)
    assert both.worst[both.candidates.index(replay)] == pytest.approx(2.357, abs=1e-3)
    assert both.worst_default == pytest.approx(2.992, abs=1e-3) and both.worst_default < MARGIN * 2.357


def test_one_pass_over_mini_batches_reuses_nothing_so_adam_gets_it_within_the_measured_ages():
    # e = 1 over m mini-batches trains each rollout once (psi_E = 1): offered under Adam too (where replay and
    # second epochs stay closed), never past the staleness table's ages (m - 1), at the first margin (OVERLAP_MARGIN)
    from replay_theory.theory.guarded import OVERLAP_MARGIN, _reuses_nothing

    table = fg.Staleness((0.0, 1.0, 2.0, 3.0, 7.0, 15.0), (1.0, 1.01, 1.02, 1.04, 1.08, 1.2), "a table")
    mem = fg.Memory(0.2, "adam", 0.9, 256.0)
    g = guarded_design(1000.0, 256, 20.0, mem, optimizer="adam", group_size=8, staleness=table, floor=128.0,
                       max_steps_ratio=1000.0, max_epochs=4)
    d = g.choice.design
    assert (d.epochs, d.mini_batches, d.batch_size, d.rollouts_per_step) == (1, 16, 8, 128)  # one floor's generation
    assert d.oldest_age == 15 and g.worst_default > OVERLAP_MARGIN * g.worst_choice
    assert g.search.replay is None and all(c.epochs == 1 for c in g.candidates)  # nothing reused under Adam
    assert "one pass over mini-batches, which reuses nothing, is priced" in g.limits[0]
    # the search at one b is the cheapest of a naive loop over every one-pass design within the ages
    ref = fg.whole_design(1000.0, 256, 20.0, mem, group_size=8, staleness=table, floor=128.0, max_steps_ratio=1000.0,
                          max_epochs=4, max_age=-1.0, pass_age=15.0)
    loop = fg.predict_many(fg.epoch_designs([8 * k for k in range(1, 129)], 8, 1, 15.0), 1000.0, 20.0, mem, table,
                           128.0)
    assert ref.epochs.compute == pytest.approx(min(p.compute for p in loop), rel=1e-12)
    assert all(p.design.oldest_age <= 15 for p in loop) and len(loop) > 100
    # a table that stops at age 0 offers none; without --max-epochs > 1 none is searched
    short = fg.Staleness((0.0,), (1.0,), "age 0 only")
    assert guarded_design(1000.0, 256, 20.0, mem, optimizer="adam", group_size=8, staleness=short, floor=128.0,
                          max_steps_ratio=1000.0, max_epochs=4).choice.design.on_policy
    assert guarded_design(1000.0, 256, 20.0, mem, optimizer="adam", group_size=8, staleness=table, floor=128.0,
                          max_steps_ratio=1000.0).choice.design.on_policy
    assert _reuses_nothing(Design.epochs_of(64, 1, 4)) and not _reuses_nothing(Design.epochs_of(64, 2, 4))
    assert _reuses_nothing(Design.overlapped_at(64)) and not _reuses_nothing(Design(64, 16, 64))


def test_a_one_pass_answer_says_so():
    from replay_theory.advise import advice

    table = fg.Staleness((0.0, 1.0, 2.0, 3.0, 7.0, 15.0), (1.0, 1.01, 1.02, 1.04, 1.08, 1.2), "a table")
    q = advice.Query(mu=5.28, batch_size=256, b_noise=1000.0, b_noise_source="--noise-scale", kappa=0.2,
                     kappa_source="--kappa", optimizer="adam", group_size=8, floor=64.0, max_epochs=4, staleness=table,
                     max_steps_ratio=1000.0)
    r = advice.advise(q)
    assert (r["regime"], r["epochs"], r["mini_batches"], r["batch_size"], r["rollouts_per_step"]) == (
        "epochs", 1, 8, 8, 64)
    assert r["what_to_do"] == "generate R = 64 per generation and train it once, in 8 mini-batches of B = 8"
    assert r["why"].endswith("each rollout is trained once (no noise reused), and the 8 updates share one "
                             "generation, the last on rollouts 7 updates old")

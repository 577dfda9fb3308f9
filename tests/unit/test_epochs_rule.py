"""The epoch family in the forgetting-aware rule (issue 40): an epoch design's steps and compute in
theory/forgetting.predict_many by hand, the whole-design search against a naive loop over every epoch design, and
``optimal --max-epochs`` (the answer, the framework lines, the evidence clause, bad input)."""

from __future__ import annotations

import json
import math

import pytest
from optimal_profile import staleness

from replay_theory.advise.advice import NO_BUDGET
from replay_theory.theory import forgetting as fg
from replay_theory.theory.designs import Design
from replay_theory.theory.guarded import guarded_design
from replay_theory.theory.reuse_families import psi_epochs, psi_epochs_from_lags


def test_an_epoch_design_is_priced_by_hand():
    # no memory: the optimizer never forgets, so every one of e uses keeps its noise: B V_eff = psi_E = e
    d = Design.epochs_of(64, 2, 2)  # R = 64, e = 2 passes over m = 2 mini-batches of B = 32
    assert (d.batch_size, d.capacity, d.updates_per_generation) == (32, 64, 4)
    p = fg.predict(d, 100.0, 5.0, None)
    assert p.steps == pytest.approx(1 + 100 * 2 / 32)  # 7.25
    assert p.cost_per_step == pytest.approx(5 * 64 / 4 + 32)  # one generation over e m = 4 updates: 112
    assert p.compute == pytest.approx(7.25 * 112)
    # a measured kappa, no step feedback: SGD's rho(l) = (1 - kappa)^l, e = 2, m = 1: psi_E = 1 + rho(1) = 1.7
    memory = fg.Memory(0.3, "sgd", 0.9, None)
    p = fg.predict(Design.epochs_of(64, 2, 1), 100.0, 5.0, memory)
    assert p.psi == pytest.approx(1.7) == pytest.approx(psi_epochs_from_lags(2, 1, 0.3))
    assert p.steps == pytest.approx(1 + 100 * 1.7 / 64)
    # the floor prices the generation, spread over its updates
    assert fg.predict(d, 100.0, 5.0, None, floor=256).cost_per_step == pytest.approx(5 * 256 / 4 + 32)


def test_the_tuned_step_fixed_point_holds_for_an_epoch_design():
    memory = fg.Memory(0.2, "adam", 0.9, 256.0)
    p = fg.predict(Design.epochs_of(512, 3, 4), 1000.0, 5.28, memory)
    k_max = memory.kappa_max(1000.0)
    noise = 1000.0 / 128 * psi_epochs(3, 4, p.kappa, "adam", 0.9)  # B_noise psi_E / B
    assert p.kappa == pytest.approx(k_max / (1 + noise) ** memory.alpha, rel=1e-9)
    assert p.steps == pytest.approx(1 + noise, rel=1e-9)


def test_the_search_finds_the_cheapest_epoch_design_a_naive_loop_finds():
    memory, b_noise, mu = fg.Memory(0.5, "sgd", 0.9, 256.0), 300.0, 20.0
    w = fg.whole_design(b_noise, 64, mu, memory, group_size=8, max_epochs=3)
    cap = 2.0 * w.at_batch.steps
    best = None  # every epoch design the search may name: R whole groups up to 4 B, e <= 3, m a power of 2
    for r in range(8, 257, 8):
        for e in range(1, 4):
            for m in (1, 2, 4, 8, 16, 32):
                if e * m > 1 and r % (8 * m) == 0:
                    p = fg.predict(Design.epochs_of(r, e, m, 8), b_noise, mu, memory)
                    if p.steps <= cap and (best is None or p.compute < best.compute):
                        best = p
    assert w.epochs.compute == pytest.approx(best.compute)
    assert w.epochs.design == best.design
    assert w.winner == ("epochs" if best.compute < min(w.on_policy.compute, w.replay.compute) else w.winner)


def test_optimal_answers_with_epochs_only_when_asked(cli, optimal_profile):
    # epochs are offered under SGD, with no sample older than the staleness table reaches (theory/guarded.py): the
    # profile's is measured flat to age 63, beyond e m - 1 = 63 here
    args = ("optimal", "--mu", "20", "-B", "256", "--profile", optimal_profile(2000.0), "--kappa", "0.9",
            "--optimizer", "sgd", "--group-size", "8", "--max-horizon", "1")
    code, out, _ = cli(*args, "--json")
    assert code == 0 and "epochs" not in json.loads(out)["designs"]  # the default prices no epoch design
    code, out, _ = cli(*args, "--max-epochs", "4", "--framework", "verl", "--json")
    d = json.loads(out)
    memory = fg.Memory(0.9, "sgd", 0.9, 256.0)
    w = fg.whole_design(2000, 256, 20, memory, group_size=8, max_horizon=1, max_epochs=4, staleness=staleness(),
                        max_steps_ratio=NO_BUDGET, max_age=63)
    g = guarded_design(2000, 256, 20, memory, optimizer="sgd", group_size=8, max_horizon=1, max_epochs=4,
                       staleness=staleness(), max_steps_ratio=NO_BUDGET)  # optimal's default: least compute
    assert g.search.epochs.design == w.epochs.design
    # the guard's answer is the design least in worst regret over b x B_FACTORS among every search's answers and the
    # whole epoch family (forgetting.epoch_family): 4 epochs over 16 mini-batches of R = 896, not the search's at the
    # measured b
    assert d["winner"] == w.winner == "epochs" and d["regime"] == "epochs" and g.moved
    e = g.choice.design
    assert (e.epochs, e.mini_batches, e.rollouts_per_step) == (4, 16, 896)
    assert e != w.epochs.design
    family = set(fg.epoch_family(1024, 8, 4, 63))
    assert len(family & set(g.candidates)) > 100  # the family's designs within the steps cap are candidates
    # the worst regret by a loop over (b factor, candidate) against the vectorised guard's; the prices of every 8th
    # candidate, the default and the pick by predict, one design at a time, against the vectorised predict_many
    from replay_theory.theory.guarded import B_FACTORS
    priced = [[p.compute for p in fg.predict_many(list(g.candidates), 2000 * f, 20, memory, staleness())]
              for f in B_FACTORS]
    for i in sorted({0, g.candidates.index(e), *range(0, len(g.candidates), 8)}):
        for row, f in zip(priced, B_FACTORS):
            # rel 1e-9, as the worst regrets below: numpy's reductions over arrays of another length may round
            # differently on another CPU family
            assert fg.predict(g.candidates[i], 2000 * f, 20, memory, staleness()).compute == pytest.approx(row[i],
                                                                                                        rel=1e-9)
    worst = [max(row[i] / min(row) for row in priced) for i in range(len(g.candidates))]
    assert worst == pytest.approx(list(g.worst), rel=1e-9)
    assert g.worst_choice == pytest.approx(min(worst), rel=1e-9)
    assert (d["epochs"], d["mini_batches"], d["rollouts_per_step"], d["batch_size"]) == (
        e.epochs, e.mini_batches, e.rollouts_per_step, e.batch_size)
    assert d["what_to_do"] == "generate R = 896 per generation and train 4 epochs over 16 mini-batches of B = 56"
    assert d["evidence"].endswith("an epoch design: the default protocol trains none (experiment theory-test "
                                  "--families epochs does, docs/SIMULATION.md), so no share above speaks for it")
    lines = d["framework"]["lines"]  # verl counts prompts: R / G per step, B / G per mini-batch
    assert f"data.train_batch_size={e.rollouts_per_step // 8}" in lines
    assert f"actor_rollout_ref.actor.ppo_mini_batch_size={e.batch_size // 8}" in lines
    assert f"actor_rollout_ref.actor.ppo_epochs={e.epochs}" in lines


@pytest.mark.parametrize("value", ["0", "65", "2.5"])
def test_max_epochs_out_of_range_is_one_line(cli, value):
    code, out, err = cli("optimal", "--mu", "5.28", "--max-epochs", value)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--max-epochs" in err and "1" in err and "64" in err


def test_an_epoch_design_refuses_what_is_no_generation():
    with pytest.raises(ValueError, match="an epoch design needs N = R and B m = R"):
        Design(32, 64, 128, False, 1, 2, 2)  # N > R: a FIFO, not one generation
    with pytest.raises(ValueError, match="whole mini-batches"):
        Design.epochs_of(60, 2, 8)
    assert math.isclose(Design.epochs_of(64, 1, 1).y, 1.0)


def test_the_epochs_buffer_and_the_design_type_name_one_design():
    from replay_theory.core.designs import DesignConfig

    d = Design.epochs_of(64, 3, 4, 8)
    config = DesignConfig.from_design(d)
    assert (config.buffer, config.epochs, config.mini_batches, config.batch_size, config.rollouts_per_step) == (
        "epochs", 3, 4, 16, 64)
    assert config.design == d  # the round trip the simulator and the benchmark rely on
    on = Design.on_policy_at(64, 8)
    assert DesignConfig.from_design(on).buffer == "on-policy" and DesignConfig.from_design(on).design == on


def test_an_epoch_design_at_the_stability_limit_is_priced_not_refused():
    # the tuned-step search can end at its upper bracket, stable_kappa itself (a measured run's benchmark cell did):
    # psi_E is finite there, as forgetting.psi is, so the design is priced, not refused
    top = fg.stable_kappa("sgd")
    assert psi_epochs(2, 1, top) == pytest.approx(1 + (1 - top))  # rho(1) = 1 - kappa = -1 + 2e-9
    memory = fg.Memory(1.9, "sgd", 0.9, 256.0)  # a pilot step this close to the limit leaves kappa_max above it
    p = fg.predict(Design.epochs_of(256, 2, 1), 5.0, 5.28, memory)
    assert 0 < p.kappa <= top and math.isfinite(p.steps)

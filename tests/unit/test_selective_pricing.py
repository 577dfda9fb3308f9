"""Selective replay priced in optimal's answer (issue 40, docs/THEORY.md [E8], [E10]): a FIFO that admits only the
groups whose rewards are not all equal, a share 1 - z of each generation. Hand values for psi between whole horizons,
the selective design against its uniform FIFO twin (number for number where the model says they are the same
system), the whole-design search's limits (z -> 0, the age bound, the optimizers), and the answer through optimal,
the frameworks, the TRL replay config and the benchmark's pilot. The literal simulations are in test_reuse_families.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from replay_theory.advise import advice
from replay_theory.advise.frameworks import config_lines
from replay_theory.core.designs import DesignConfig
from replay_theory.experiments import theory_bench as tt
from replay_theory.experiments.theory_bench.measure import design_of, design_spec
from replay_theory.integrations.replay_config import ReplayConfig
from replay_theory.theory import forgetting as fg
from replay_theory.theory.designs import Design


def test_psi_fractional_hand_values_and_whole_horizons():
    # SGD, kappa = 0.2: psi(2) = 1/2 + 2 (0.8) / 4 = 0.9, psi(3) = 1/3 + (2/9)(2 (0.8) + 0.64) = 0.831111...
    assert fg.psi(2, 0.2) == pytest.approx(0.9, rel=1e-14)
    assert fg.psi(3, 0.2) == pytest.approx(1 / 3 + 2 / 9 * (2 * 0.8 + 0.64), rel=1e-14)
    # x = 2.5: half the samples stay 2 steps, half 3: (0.5 * 4 * 0.9 + 0.5 * 9 * 0.831111) / 6.25 = 0.8864
    assert fg.psi_fractional(2.5, 0.2) == pytest.approx((0.5 * 4 * 0.9 + 0.5 * 9 * (1 / 3 + 2 / 9 * 2.24)) / 6.25,
                                                        rel=1e-14)
    xs = np.arange(1, 40)
    for optimizer in ("sgd", "momentum", "adam"):
        np.testing.assert_array_equal(fg.psi_fractional(xs.astype(float), 0.07, optimizer),
                                      fg.psi(xs, 0.07, optimizer))  # a whole x is psi, bit for bit
        # continuous in x: at x = L + eps it is psi(L) to first order
        assert fg.psi_fractional(5 + 1e-9, 0.07, optimizer) == pytest.approx(fg.psi(5, 0.07, optimizer), rel=1e-7)
    for bad in (0.5, math.nan, math.inf):
        with pytest.raises(ValueError, match="horizon"):
            fg.psi_fractional(bad, 0.2)


@pytest.mark.parametrize("memory", [None, fg.Memory(0.2, "sgd", 0.9, None), fg.Memory(0.05, "adam", 0.9, None)])
def test_a_selective_design_is_its_fifo_twin_over_informative_samples(memory):
    """With the measured kappa at every design (no step feedback) or none, a selective (B, R, N) at z is the FIFO
    (B, (1 - z) R, N) at noise scale (1 - z) B_noise, step for step; its step costs the generated R's."""
    z, b_noise, mu, floor = 0.5, 800.0, 5.28, 16.0
    sel = fg.predict_many([Design(64, 32, 128, selective=True)], b_noise, mu, memory, floor=floor, zero_share=z)[0]
    twin = fg.predict_many([Design(64, 16, 128)], (1 - z) * b_noise, mu, memory, floor=floor)[0]
    assert sel.steps == pytest.approx(twin.steps, rel=1e-13)
    assert sel.psi == pytest.approx(twin.psi, rel=1e-13)
    assert sel.cost_per_step == pytest.approx(mu * 32 + 64) and twin.cost_per_step == pytest.approx(mu * 16 + 64)
    assert sel.compute == pytest.approx(sel.steps * (mu * 32 + 64), rel=1e-13)
    # at z = 0 a selective design is the uniform FIFO, number for number
    plain = fg.predict_many([Design(64, 32, 128)], b_noise, mu, memory, floor=floor)[0]
    same = fg.predict_many([Design(64, 32, 128, selective=True)], b_noise, mu, memory, floor=floor)[0]
    assert (same.steps, same.compute, same.psi) == (plain.steps, plain.compute, plain.psi)


def test_selective_with_step_feedback_is_the_fixed_point_by_hand():
    """Under the tuned-step feedback, kappa_d = kappa_max / (1 + noise)^alpha with kappa_max from the measured b
    (the zero-noise step is the same system's), noise = (1 - z) B_noise / B (1 + y' psi(x', kappa_d) - 1/N) at
    x' = N / ((1 - z) R) = 128 / 24 (between whole stays), y' = B / ((1 - z) R)."""
    z, b_noise, memory = 0.25, 600.0, fg.Memory(0.2, "sgd", 0.9, 256.0)
    B, R, N = 64, 32, 128
    p = fg.predict_many([Design(B, R, N, selective=True)], b_noise, 5.28, memory, zero_share=z)[0]
    kept = (1 - z) * R
    noise = (1 - z) * b_noise / B * (1 + B / kept * fg.psi_fractional(N / kept, p.kappa) - 1 / N)
    assert p.kappa == pytest.approx(memory.kappa_max(b_noise) / (1 + noise) ** memory.alpha, rel=1e-9)
    assert p.steps == pytest.approx(1 + noise, rel=1e-9)
    assert p.psi == pytest.approx(fg.psi_fractional(N / kept, p.kappa), rel=1e-12)


def test_whole_design_prices_selective_only_with_a_zero_share():
    memory = fg.Memory(0.2, "sgd", 0.9, 256.0)
    kw = dict(group_size=8, staleness=fg.NO_POLICY, floor=64.0)
    assert fg.whole_design(1000.0, 256, 5.28, memory, **kw).selective is None
    # z -> 0: the selective search is the replay search over the same sizes (and N = R = B, worse than on-policy)
    tiny = fg.whole_design(1000.0, 256, 5.28, memory, zero_share=1e-9, **kw)
    assert tiny.selective.compute == pytest.approx(tiny.replay.compute, rel=1e-6)
    half = fg.whole_design(1000.0, 256, 5.28, memory, zero_share=0.5, **kw)
    assert half.winner == "selective" and half.best is half.selective
    again = fg.predict_many([half.selective.design], 1000.0, 5.28, memory, fg.NO_POLICY, 64.0, zero_share=0.5)[0]
    assert again.compute == half.selective.compute
    # half the groups carry no gradient: a buffer of informative ones beats the uniform one that trains on them
    assert half.selective.compute < half.replay.compute
    # the age bound holds for the admitted samples: ceil(N / ((1 - z) R)) - 1 <= max_age
    bounded = fg.whole_design(1000.0, 256, 5.28, memory, zero_share=0.5, max_age=3, **kw).selective
    d = bounded.design
    assert math.ceil(d.capacity / (0.5 * d.rollouts_per_step)) - 1 <= 3
    with pytest.raises(ValueError, match="zero share"):
        fg.predict_many([d], 1000.0, 5.28, memory, zero_share=1.0)


def _query(**kw) -> advice.Query:
    base = dict(mu=5.28, batch_size=256, b_noise=1000.0, b_noise_source="--noise-scale", kappa=0.2,
                kappa_source="--kappa", optimizer="sgd", group_size=8, floor=64.0, zero_share=0.5,
                zero_share_source="--zero-share", staleness=fg.NO_POLICY)
    return advice.Query(**{**base, **kw})


def test_the_answer_names_the_selective_design_and_its_admitted_horizon():
    r = advice.advise(_query())
    assert r["regime"] == "selective" and r["winner"] == "selective"
    sel = r["designs"]["selective"]
    assert (r["batch_size"], r["rollouts_per_step"], r["capacity"]) == (sel["batch_size"], sel["rollouts_per_step"],
                                                                       sel["capacity"])
    assert sel["admitted_horizon"] == sel["capacity"] / (0.5 * sel["rollouts_per_step"])
    assert sel["selective"] is True and r["zero_share"] == 0.5
    assert r["what_to_do"].startswith("replay only the groups whose rewards are not all equal: B = "
                                      f"{sel['batch_size']}, R = {sel['rollouts_per_step']}")
    assert "best selective replay" in advice.render(r, [])
    assert "; zero share z = 0.5, --zero-share" in advice.render(r, [])
    # Adam: no reuse offered (REUSE_OPTIMIZERS), so no selective design either; without z the record has no row
    adam = advice.advise(_query(optimizer="adam", kappa=0.05))
    assert adam["regime"] != "selective" and adam["designs"]["selective"] is None
    assert "selective" not in advice.advise(_query(zero_share=0.0))["designs"]


def test_the_selective_answer_runs_as_buffer_selective_and_no_framework_key_has_it():
    r = advice.advise(_query())
    config = ReplayConfig.from_optimal_json(json.dumps(r))
    assert config.buffer == "selective"
    assert (config.capacity, config.batch_size, config.rollouts_per_step) == (r["capacity"], r["batch_size"],
                                                                              r["rollouts_per_step"])
    assert any(n.startswith("selective replay run as buffer selective") for n in config.notes)
    with pytest.raises(ValueError, match="buffer prioritized does not run"):
        ReplayConfig.from_optimal_json(json.dumps(r), buffer="prioritized")
    design = Design(r["batch_size"], r["rollouts_per_step"], r["capacity"], group_size=8, selective=True)
    # no trainer's filter is this design: theirs drop and regenerate, once each (even at N = R = B)
    for d in (design, Design(64, 64, 64, group_size=8, selective=True)):
        for framework in ("verl", "trl", "skyrl", "nemo-rl"):
            answer = config_lines(framework, d)
            assert answer.refused.startswith(f"selective replay stores the groups with unequal rewards in a FIFO of "
                                             f"N = {d.capacity} and draws B = {d.batch_size} of them with replacement")
            assert answer.refused.endswith("--group-size 8 --buffer selective")
    cfg = DesignConfig.from_design(design)
    assert cfg.buffer == "selective" and cfg.design == design
    # on-policy and selective is dynamic sampling ([E11]): the trainers' filter, its own buffer in the simulator
    dynamic = Design(64, 64, 64, True, selective=True)
    assert dynamic == Design.dynamic_at(64) and dynamic.dynamic and not design.dynamic
    assert DesignConfig.from_design(dynamic).buffer == "dynamic"
    with pytest.raises(ValueError, match="selective design is a FIFO"):
        Design(64, 64, 64, False, 8, 2, 1, selective=True)  # e = 2 epochs: not selective


def test_the_benchmark_pilot_feeds_its_zero_share_only_with_the_selective_family():
    pilot = {"steps": 3, "hvps": 3, "runs": 1, "b_simple": {"b_noise": 1000.0}, "kappa_pairs": {"kappa": 0.2},
             "drift": {"staleness": [0, 64], "m2": [0.0, 0.0]}, "recipe_steps": 1000.0, "zero_share": 0.5}
    assert tt.pilot_query(pilot, "sgd", 5.28, 64)[0].zero_share == 0.0
    query, notes = tt.pilot_query(pilot, "sgd", 5.28, 64, selective=True)
    assert query.zero_share == 0.5 and not notes
    for z, said in ((None, "no zero share: the pilot drew no groups"), (0.0, "zero share 0: no group")):
        query, notes = tt.pilot_query({**pilot, "zero_share": z}, "sgd", 5.28, 64, selective=True)
        assert query.zero_share == 0.0 and any(n.startswith(said) for n in notes)
    # the printed design of a selective answer is trained by the buffer selective (the grid's selective type)
    answer = advice.advise(tt.pilot_query(pilot, "sgd", 5.28, 64, selective=True)[0])
    printed = tt.printed_design(pilot, "sgd", 5.28, 64, selective=True)
    assert answer["regime"] == "selective"
    assert printed == tt.SelectiveDesign(answer["batch_size"], answer["rollouts_per_step"], answer["capacity"])
    assert tt.is_selective(printed) and tt.printed_label(printed).startswith("printed: selective B=")
    assert tt.printed_design(pilot, "sgd", 5.28, 64) != printed  # without the family: the uniform menu's answer
    assert design_of(design_spec(printed)) == printed  # the records name it as the grid's selective designs


def test_optimal_zero_share_end_to_end(cli, optimal_profile):
    """optimal --zero-share on a profile measured flat to age 63: the selective answer, its lines and record, the
    evidence saying the default protocol trains none; a z outside [0, 1) is one line, exit 2."""
    args = ("optimal", "--mu", "5.28", "-B", "256", "--profile", optimal_profile(1000.0), "--kappa", "0.2",
            "--optimizer", "sgd", "--group-size", "8", "--latency-floor", "64")
    code, out, _ = cli(*args, "--zero-share", "0.5", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["regime"] == "selective" and d["zero_share"] == 0.5 and d["zero_share_source"] == "--zero-share"
    assert "selective replay: the default protocol trains none" in d["evidence"]
    sel = d["designs"]["selective"]
    assert math.ceil(sel["admitted_horizon"]) - 1 <= 63  # no admitted sample older than the table reaches
    code, text, _ = cli(*args, "--zero-share", "0.5", "--framework", "verl")
    assert code == 0 and text.startswith("what to do: replay only the groups whose rewards are not all equal")
    assert "--buffer selective" in text
    for bad in ("1", "-0.1", "nan"):
        code, out, err = cli(*args, "--zero-share", bad)
        assert code == 2 and out == "" and err.strip().splitlines() == [
            f"replay-theory: error: --zero-share must be in [0, 1), got {bad}"]


def test_the_pilots_zero_share_is_the_share_of_groups_with_equal_rewards(tmp_path):
    """The pilot's z criterion (all of a group's per-sample gradients exactly 0) against the rewards themselves: the
    same draws (a cloned generator) give the groups, and the share of groups whose 8 rewards are all equal is z."""
    from replay_theory.experiments.theory_bench.inputs import sample_grads, zero_share_of_grads

    # by hand: groups of 2 rows; the second group is all zero
    assert zero_share_of_grads(np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]), 2) == 0.5
    setting = tt.SETTINGS["bandit-grpo"]
    env, _ = tt.instance_record(tt.Store(tmp_path), setting, 0)
    theta = np.zeros((1, env.features.shape[-1]))
    draws, again = np.random.default_rng(7), np.random.default_rng(7)
    groups = tt.BATCH // tt.GROUP
    grads = sample_grads(env, setting, theta, theta, groups, draws)  # (256, d)
    prompts = np.repeat(again.integers(0, env.num_prompts, size=(1, groups)), tt.GROUP, axis=1)
    tokens, _, mask = env.sample(theta, prompts, again)
    rewards = env.reward(prompts, tokens, mask)[0].reshape(groups, tt.GROUP)  # (32, 8)
    equal = np.all(rewards == rewards[:, :1], axis=1)
    assert 0 < equal.sum() < groups  # both kinds present at the base policy
    assert zero_share_of_grads(grads) == equal.mean()
    zero_rows = np.all(grads.reshape(groups, -1) == 0, axis=1)
    np.testing.assert_array_equal(zero_rows, equal)

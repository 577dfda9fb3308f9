"""Dynamic sampling (issue 40; docs/THEORY.md [E9], [E11]): drop the groups whose rewards are all equal and generate
again until B rollouts have a non-zero advantage. Its refill rounds exact against a Monte Carlo loop and hand values,
its price against the on-policy batch that keeps the zero groups, the simulator's batch step against a naive loop
over groups, the answer and the trainers' keys."""

import json

import numpy as np
import pytest

from replay_theory.advise import advice
from replay_theory.advise.frameworks import config_lines
from replay_theory.core.designs import DesignConfig, dynamic_step
from replay_theory.core.rollouts import RolloutBatch
from replay_theory.integrations.replay_config import ReplayConfig
from replay_theory.theory import forgetting as fg
from replay_theory.theory.compute import refill_rounds
from replay_theory.theory.designs import Design
from replay_theory.theory.guarded import OVERLAP_MARGIN, guarded_design

G = 4


def test_refill_rounds_by_hand():
    assert refill_rounds(8, 0.0) == 1.0  # nothing dropped: one round
    # one group a round: T is geometric, E[T] = 1 / (1 - z) exactly
    assert refill_rounds(1, 0.25) == pytest.approx(4 / 3, rel=1e-12)
    # two groups a round at z = 1/2: P(T > 1) = P(Bin(2, .5) <= 1) = 3/4, P(T > 2) = P(Bin(4, .5) <= 1) = 5/16, ...
    tail = [1.0, 0.75, 5 / 16] + [(1 + 2 * n) / 4 ** n for n in range(3, 60)]  # P(Bin(2n, .5) <= 1)
    assert refill_rounds(2, 0.5) == pytest.approx(sum(tail), rel=1e-12)
    values = refill_rounds(np.array([1, 2, 64]), 0.3)
    assert values.shape == (3,) and values[0] == pytest.approx(1 / 0.7, rel=1e-12)
    assert values[2] == pytest.approx(2.0, abs=1e-5)  # 64 x 0.7 = 44.8 a round: two rounds all but always


def test_refill_rounds_against_a_monte_carlo_loop():
    rng = np.random.default_rng(7)
    for g, z in ((8, 0.5), (3, 0.7), (16, 0.2)):
        rounds = []
        for _ in range(20_000):  # the procedure itself: rounds of g groups until g are kept
            kept, n = 0, 0
            while kept < g:
                kept += int((rng.random(g) >= z).sum())
                n += 1
            rounds.append(n)
        mean, se = np.mean(rounds), np.std(rounds) / np.sqrt(len(rounds))
        assert abs(mean - refill_rounds(g, z)) < 4 * se, (g, z)


@pytest.mark.parametrize("g, z, match", [(0, 0.5, "groups per round must be an integer >= 1"),
                                         (2.5, 0.5, "groups per round must be an integer >= 1"),
                                         (4, 1.0, r"zero share z must be in \[0, 1\)")])
def test_refill_rounds_refuses_bad_input_in_one_line(g, z, match):
    with pytest.raises(ValueError, match=match):
        refill_rounds(g, z)


def test_dynamic_sampling_is_priced_as_the_batch_that_keeps_the_zero_groups():
    b_noise, z, mu, floor = 640.0, 0.5, 2.0, 0.0
    dyn, wide, same = fg.predict_many([Design.dynamic_at(64, G), Design.on_policy_at(128, G),
                                       Design.on_policy_at(64, G)], b_noise, mu, None, floor=floor, zero_share=z)
    # [E9]: B = 64 informative rollouts are on-policy at B / (1 - z) = 128 that keeps them, in steps
    assert dyn.steps == pytest.approx(1 + (1 - z) * b_noise / 64) == pytest.approx(wide.steps)
    assert same.steps == pytest.approx(1 + b_noise / 64)
    # [E11]: rounds of 64 (16 groups) until 16 groups are kept; only the 64 kept are trained
    rounds = refill_rounds(16, z)
    assert dyn.compute == pytest.approx(dyn.steps * (mu * rounds * 64 + 64))
    assert wide.compute == pytest.approx(wide.steps * (mu + 1) * 128)
    # a latency floor prices every round at least at the floor's batch
    (floored,) = fg.predict_many([Design.dynamic_at(64, G)], b_noise, mu, None, floor=100.0, zero_share=z)
    assert floored.compute == pytest.approx(dyn.steps * (mu * rounds * 100 + 64))
    # at z = 0 dynamic sampling is on-policy, number for number
    (plain,) = fg.predict_many([Design.dynamic_at(64, G)], b_noise, mu, None, zero_share=0.0)
    assert (plain.steps, plain.compute) == pytest.approx((same.steps, same.compute))


def test_the_whole_design_search_and_the_guard_answer_dynamic_sampling_only_where_it_pays():
    memory = fg.Memory(0.3, "adam", 0.9, 256.0)
    # no reuse allowed (max_age < 0, as the guard sets under Adam): selective replay is out, dynamic sampling is not
    cheap = fg.whole_design(2000.0, 256, 0.5, memory, group_size=8, max_steps_ratio=1000.0, max_age=-1.0,
                            zero_share=0.5)
    assert cheap.winner == "dynamic" and cheap.best is cheap.dynamic and cheap.dynamic.design == Design.dynamic_at(8, 8)
    assert cheap.selective is None and cheap.replay is None
    # a loop over every whole-group batch the search covers (up to 4 B) agrees with its answer
    assert cheap.dynamic.compute == pytest.approx(min(
        fg.predict_many([Design.dynamic_at(k * 8, 8)], 2000.0, 0.5, memory, zero_share=0.5)[0].compute
        for k in range(1, 129)))
    assert fg.whole_design(2000.0, 256, 0.5, memory, group_size=8, max_steps_ratio=1000.0).dynamic is None  # no z
    # the guard: no reuse, so offered under Adam, at the first margin; at mu = 5.28 it saves too little to clear it
    moved = guarded_design(2000.0, 256, 0.5, memory, optimizer="adam", group_size=8, max_steps_ratio=1000.0,
                           zero_share=0.5)
    assert moved.choice.design.dynamic and moved.worst_default > OVERLAP_MARGIN * moved.worst_choice
    kept = guarded_design(2000.0, 256, 5.28, memory, optimizer="adam", group_size=8, max_steps_ratio=1000.0,
                          zero_share=0.5)
    assert not kept.moved and kept.search.dynamic is not None


def test_the_answer_says_dynamic_sampling_and_the_trainers_keys():
    q = advice.Query(mu=0.5, batch_size=256, b_noise=2000.0, b_noise_source="--noise-scale", kappa=0.3,
                     kappa_source="--kappa", optimizer="adam", group_size=8, zero_share=0.5,
                     zero_share_source="--zero-share")
    r = advice.advise(q)
    assert (r["regime"], r["winner"], r["batch_size"], r["rollouts_per_step"]) == ("dynamic", "dynamic", 8, 8)
    assert r["refill_rounds"] == pytest.approx(2.0) == r["designs"]["dynamic"]["refill_rounds"]  # one group: 1/(1-z)
    assert r["what_to_do"].startswith("train on-policy at B = 8 with dynamic sampling: drop the groups whose rewards")
    table = advice.render(r, []).splitlines()
    assert [line for line in table if "<- best" in line][0].lstrip().startswith("dynamic sampling")
    replay = ReplayConfig.from_optimal_json(json.dumps(r))  # our TRL trainer runs it (integrations/buffer.py)
    assert (replay.buffer, replay.capacity, replay.batch_size, replay.rollouts_per_step) == ("dynamic", 8, 8, 8)
    assert replay.notes[0].startswith("dynamic sampling run as buffer dynamic: generation batches of R = B = 8")
    with pytest.raises(ValueError, match=r"answers dynamic sampling at B = 8 .* which buffer fifo-x does not run"):
        ReplayConfig.from_optimal_json(json.dumps(r), buffer="fifo-x")
    design = Design.dynamic_at(64, 8)
    assert config_lines("trl", design).refused == (
        "it has no key for dropping zero-advantage groups; our replay_theory.integrations.trl.ReplayGRPOTrainer "
        "(replay-theory trl-replay) runs it: replay-theory trl-replay --buffer dynamic --rollouts-per-step 64 "
        "--group-size 8")
    assert "algorithm.filter_groups.enable=true" in config_lines("verl", design).lines
    assert "grpo.use_dynamic_sampling=true" in config_lines("nemo-rl", design).lines
    assert "trainer.algorithm.dynamic_sampling.type=filter" in config_lines("skyrl", design).lines
    for framework in ("trl", "openrlhf", "slime", "areal", "prime-rl"):
        assert "dropping zero-advantage groups" in config_lines(framework, design).refused


def test_the_cli_answers_dynamic_sampling_with_verl_keys(cli):
    code, out, err = cli("optimal", "--mu", "0.5", "-B", "256", "--noise-scale", "2000", "--kappa", "0.3",
                         "--optimizer", "adam", "--zero-share", "0.5", "--group-size", "8", "--framework", "verl")
    assert code == 0, err
    assert out.startswith("what to do: train on-policy at B = 8 with dynamic sampling")
    assert "  algorithm.filter_groups.enable=true" in out.splitlines()


class _ScriptedPipe:
    """What ``dynamic_step`` reads of a pipeline: its config and ``generate``, which hands out scripted rounds."""

    def __init__(self, rounds: list[np.ndarray], batch_size: int):
        self.config = DesignConfig(buffer="dynamic", batch_size=batch_size, rollouts_per_step=batch_size,
                                   capacity=batch_size, group_size=G)
        self.rounds, self.offset = list(rounds), 0

    def generate(self, weights, num_groups: int, version) -> RolloutBatch:
        reward = self.rounds.pop(0)  # (S, n)
        S, n = reward.shape
        assert n == num_groups * G
        items = self.offset + np.broadcast_to(np.arange(n), (S, n))
        self.offset += n
        return RolloutBatch(prompt=items // G, tokens=items[:, :, None].astype(np.int64),
                            mask=np.ones((S, n, 1), bool), logp_behav=np.zeros((S, n, 1)), reward=reward,
                            advantage=np.zeros((S, n)), created=np.full((S, n), version, np.int64),
                            group=(items // G).astype(np.int64))


def _groups(*flags: str) -> list[float]:
    """Rewards of groups of G by flag: "0" / "1" all equal, "m" mixed."""
    out = []
    for f in flags:
        out += {"0": [0.0] * G, "1": [1.0] * G, "m": [1.0, 0.0, 0.0, 1.0]}[f]
    return out


def test_dynamic_step_by_hand():
    # B = 8: two groups a round, two informative groups an update; seed 0 is full after round 2, seed 1 after 3
    rounds = [np.array([_groups("0", "m"), _groups("1", "0")]), np.array([_groups("m", "m"), _groups("m", "1")]),
              np.array([_groups("0", "0"), _groups("m", "m")])]
    data = dynamic_step(_ScriptedPipe(rounds, 8), 5, None)
    assert data.train.prompt[:, ::G].tolist() == [[1, 2], [2, 4]]  # the first two informative groups
    assert np.asarray(data.generated).tolist() == [16, 24]  # rounds of R = 8 up to the one that filled the seed
    assert data.curves["refill_rounds"].tolist() == [2.0, 3.0]
    assert data.curves["refill_zero_share"].tolist() == [0.25, 0.5]  # z over the groups of the rounds each needed
    assert data.curves["refill_short"].tolist() == [0.0, 0.0]
    assert (data.staleness == 0).all() and (data.time_since_last_use == -1).all() and (data.weight == 1).all()


def test_dynamic_step_against_a_naive_loop_over_groups():
    rng = np.random.default_rng(3)
    S, B, per_round = 5, 12, 3  # three informative groups an update, rounds of three groups
    p_one = rng.choice([0.05, 0.5, 0.95], size=(40, S, per_round)).repeat(G, axis=2)  # some groups nearly all 0 or 1
    rounds = [(rng.random((S, per_round * G)) < p).astype(float) for p in p_one]
    data = dynamic_step(_ScriptedPipe(rounds, B), 0, None)
    for s in range(S):  # one seed at a time: walk the groups in generation order, keep the informative ones
        chosen, filled = [], None
        for r, reward in enumerate(rounds):
            for j in range(per_round):
                group = reward[s, j * G:(j + 1) * G]
                if group.min() != group.max() and len(chosen) < B // G:
                    chosen.append(r * per_round + j)
                    if len(chosen) == B // G:
                        filled = r + 1
            if filled:
                break
        assert data.train.prompt[s, ::G].tolist() == chosen
        assert np.asarray(data.generated)[s] == filled * B
        assert data.curves["refill_rounds"][s] == filled


def test_the_simulated_dynamic_sampling_takes_the_steps_of_the_batch_that_keeps_the_zero_groups(tmp_path):
    from replay_theory.experiments.dynamic_check import check_unit

    # bandit-grpo under SGD, instance 1, B = 64: each design tuned to the benchmark's target as theory-test tunes it
    row = check_unit(tmp_path, "bandit-grpo", "sgd", 1, 64)
    assert 0.3 < row["z"] < 0.5 and row["wide_batch"] == 8 * round(64 / (1 - row["z"]) / 8)
    # the run's z moves as the policy improves, so its rounds sit above refill_rounds at the mean z (convex in z)
    assert row["rounds_predicted"] <= row["rounds"] <= 1.1 * row["rounds_predicted"]
    ratio, (low, high) = row["vs_wide"]
    assert low <= 1.0 <= high and 0.9 < ratio < 1.2  # [E9]: the model's 1 inside the 90% paired-bootstrap interval
    assert row["vs_batch"][1][1] < 1.0  # and fewer steps than on-policy at B, which trains the zero groups


def test_the_benchmark_trains_and_scores_a_printed_dynamic_answer_with_its_rounds():
    from replay_theory.experiments.theory_bench import measure, score
    from replay_theory.experiments.theory_bench.objectives import measured_compute
    from replay_theory.experiments.theory_bench.options import PRINTED_STEPS_RATIOS

    pilot = {"steps": 3, "hvps": 3, "runs": 1, "b_simple": {"b_noise": 2000.0}, "kappa_pairs": {"kappa": 0.3},
             "drift": {"staleness": [0, 64], "m2": [0.0, 0.0]}, "recipe_steps": 1000.0, "zero_share": 0.5}
    design = measure.printed_design(pilot, "adam", 0.5, 0.0, selective=True)
    assert design.dynamic and measure.printed_label(design) == f"printed: dynamic B={design.batch_size}"
    spec = measure.design_spec(design)
    assert spec[3] is True and spec[-1] == "selective" and measure.design_of(spec) == design
    B = design.batch_size
    record = {"setting": "two-prompts", "optimizer": "adam", "instance": 0, "pilot": pilot, "prices_zero_share": True,
              "printed_ratios": [PRINTED_STEPS_RATIOS[0]],
              "designs": [{"label": "on-policy B=256", "design": [256, 256, 256, True], "steps": [10.0] * 3}],
              "printed": [{"label": measure.printed_label(design), "design": spec, "steps": [20.0] * 3,
                           "refill_rounds": 2.5}]}
    out = score.score_printed(record, 0.5, 0.0, measured_compute(record, 0.5, 0.0), None)
    # compute = steps x (mu x rounds x R + B): the rounds it drew, against on-policy at 256's 10 x (0.5 + 1) x 256
    assert out["printed"]["free_regret"] == pytest.approx(20 * (0.5 * 2.5 * B + B) / (10 * 1.5 * 256))
    assert out["printed"]["free"] == f"printed: dynamic B={B}" and out["printed"]["free_is_replay"] is False

"""The TRL replay trainer (replay_theory.integrations): FIFO law, whole groups, TRL #6804, shared losses, real TRL.

The buffer tests need torch only; the trainer tests need TRL (``pytest.importorskip("trl")``) and train a tiny
Qwen2 built from config, with an offline character tokenizer, through TRL's real GRPOTrainer for a few steps on CPU.
"""

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tiny_lm import char_tokenizer, tiny_qwen2  # noqa: E402 (tests/helpers; needs torch)

from replay_theory.core import losses  # noqa: E402
from replay_theory.core.buffers import FifoBuffer, PositiveBiasBuffer, PrioritizedBuffer  # noqa: E402
from replay_theory.integrations.buffer import (  # noqa: E402 (after the importorskip)
    ReplayConfig,
    RowReplayBuffer,
    age_buckets,
    fifo_max_age,
)
from replay_theory.integrations.loss import shared_loss, shared_loss_tensor  # noqa: E402


def fifo(capacity: int, group_size: int, seed: int = 0, **design) -> RowReplayBuffer:
    """The trainer's buffer over the shared FIFO design, R = group_size (pushes of any whole groups by hand)."""
    config = ReplayConfig(capacity, 1, group_size, design=design).design_config(group_size)
    return RowReplayBuffer(config, seed=seed)


def fill(buffer: RowReplayBuffer, rows: dict, version: int) -> None:
    """Push rows and add their ids to the design's buffer (what the design step does)."""
    buffer.buffer.add(buffer.push(rows, version), version)
    buffer._drop_evicted()


def _rows(n: int, start: int = 0, prompt_len: int = 3, completion_len: int = 4) -> dict:
    """n rows whose every per-row field encodes the row number start + i (so misalignment is visible)."""
    k = torch.arange(start, start + n)
    return {
        "prompt_ids": k[:, None].repeat(1, prompt_len),
        "prompt_mask": torch.ones(n, prompt_len, dtype=torch.long),
        "completion_ids": k[:, None].repeat(1, completion_len),
        "completion_mask": torch.ones(n, completion_len, dtype=torch.long),
        "tool_mask": torch.ones(n, completion_len, dtype=torch.long),
        "old_per_token_logps": -k[:, None].repeat(1, completion_len).double(),
        "advantages": k.double(),
        "rewards": 10.0 * k.double(),
    }


# --------------------------------------------------------------------------- buffer: FIFO law, groups, #6804


def test_fifo_law_ages_and_whole_groups():
    # N = 10, R = 4, G = 2: ceil(10/4) - 1 = 2; the buffer keeps 4 rows of age 0, 4 of age 1 and ONE group of age 2
    buffer = fifo(capacity=10, group_size=2)
    assert fifo_max_age(10, 4) == 2
    expected_versions = {1: [0] * 4, 2: [0] * 4 + [1] * 4, 3: [0, 0] + [1] * 4 + [2] * 4, 4: [1, 1] + [2] * 4 + [3] * 4}
    for step in range(4):
        fill(buffer, _rows(4, start=4 * step), version=step)
        assert buffer.data["version"].tolist() == expected_versions[step + 1]
        assert int(buffer.ages(step).max()) == min(step, 2)
        groups, counts = torch.unique(buffer.data["group_id"], return_counts=True)
        assert counts.tolist() == [2] * len(groups)  # whole groups only
    # after 4 pushes of rows 0..15 the FIFO holds rows 6..15, group ids 3..7
    assert buffer.data["completion_ids"][:, 0].tolist() == list(range(6, 16))
    assert buffer.data["group_id"].tolist() == [3, 3, 4, 4, 5, 5, 6, 6, 7, 7]


def test_age_buckets_cover_zero_to_max_age():
    assert [name for _, _, name in age_buckets(0)] == ["age_0"]
    assert [name for _, _, name in age_buckets(2)] == ["age_0", "age_1", "age_2-3"]
    assert age_buckets(9)[-1] == (8, 15, "age_8-15")


def test_trl_6804_every_group_is_buffered_and_rows_stay_aligned():
    # TRL #6804: flat (B,) advantages met code written for (groups, generations); a whole-batch reduction kept
    # only group 0. Here a push of 4 groups of 3 keeps all 4, and each drawn row's fields belong to that row.
    buffer = fifo(capacity=24, group_size=3, seed=1)
    fill(buffer, _rows(12), version=0)
    assert buffer.num_groups == 4
    assert buffer.data["group_id"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    drawn = buffer.sample(4000)
    row = drawn["completion_ids"][:, 0]
    assert torch.equal(drawn["advantages"], row.double())
    assert torch.equal(drawn["rewards"], 10.0 * row.double())
    assert torch.equal(drawn["old_per_token_logps"][:, 0], -row.double())
    assert torch.equal(drawn["prompt_ids"][:, 0], row)
    assert torch.equal(drawn["group_id"], row // 3)
    assert torch.equal(drawn["buffer_index"], row)
    assert sorted(set(drawn["group_id"].tolist())) == [0, 1, 2, 3]  # every group is drawn, not only group 0
    for name, value in drawn.items():
        assert value.shape[0] == 4000, name


def test_per_group_shaped_field_is_refused():
    rows = _rows(6)
    rows["advantages"] = rows["advantages"].view(3, 2)  # (groups, generations): the #6804 layout
    buffer = fifo(capacity=6, group_size=2)
    with pytest.raises(ValueError) as info:
        buffer.push(rows, version=0)
    assert str(info.value) == ("every buffered field must have one entry per row (6 rows), got shapes "
                               "{'advantages': (3, 2)}")
    rows["advantages"] = rows["advantages"].view(6, 1)  # per row, but not one value per row
    with pytest.raises(ValueError, match=r"^advantages must be one value per row, shape \(6,\), got \(6, 1\)$"):
        buffer.push(rows, version=0)
    rows = _rows(6)
    rows["rewards"] = rows["rewards"][:3]  # one value per group
    with pytest.raises(ValueError, match=r"one entry per row \(6 rows\), got shapes \{'rewards': \(3,\)\}"):
        buffer.push(rows, version=0)
    with pytest.raises(ValueError, match="a push must hold whole groups: 5 rows is not a multiple of "
                                         "num_generations = 2"):
        buffer.push(_rows(5), version=0)
    assert len(buffer) == 0  # nothing half-pushed


def test_uniform_draw_with_replacement():
    buffer = fifo(capacity=10, group_size=2, seed=3)
    fill(buffer, _rows(10), version=0)
    counts = torch.bincount(buffer.sample(50_000)["buffer_index"], minlength=10).double() / 50_000
    # each row 1/10; binomial sd sqrt(0.1 * 0.9 / 5e4) = 0.00134, so 0.006 is 4.5 sd
    assert torch.all((counts - 0.1).abs() < 0.006), counts


def test_pushes_of_different_widths_are_repadded_on_their_side():
    buffer = fifo(capacity=8, group_size=2)
    buffer.push(_rows(4, start=0, prompt_len=2, completion_len=3), version=0)
    buffer.push(_rows(4, start=4, prompt_len=4, completion_len=1), version=1)
    d = buffer.data
    assert d["prompt_ids"].shape == (8, 4) and d["completion_ids"].shape == (8, 3)
    assert d["prompt_mask"][0].tolist() == [0, 0, 1, 1]  # prompts left-padded
    assert d["completion_mask"][4].tolist() == [1, 0, 0]  # completions right-padded
    assert d["tool_mask"][4].tolist() == [1, 1, 1]  # TRL's pad value for tool_mask
    assert d["old_per_token_logps"][4].tolist() == [-4.0, 0.0, 0.0]


def test_replay_config_from_optimal_json(cli):
    code, out, _ = cli("optimal", "--objective", "paper", "--mu", "5.28", "-R", "8", "--json")
    assert code == 0
    design = json.loads(out)
    replay = ReplayConfig.from_optimal_json(design)
    assert (replay.capacity, replay.batch_size, replay.rollouts_per_step) == (19, 26, 8)
    assert replay.replay_ratio == 26 / 8 and replay.max_age == 2
    grouped = ReplayConfig.from_optimal_json(out, group_size=4, loss="m2po")  # the JSON text works too
    assert (grouped.capacity, grouped.batch_size, grouped.loss) == (20, 26, "m2po")
    assert grouped.notes == ("capacity 19 rounded to 20, a whole number of groups of 4",)
    code, out, _ = cli("optimal", "--objective", "paper", "--mu", "5.28", "--json")
    with pytest.raises(ValueError, match=r"^the optimal --json output has no capacity, batch_size, "
                                         r"rollouts_per_step: run `replay-theory optimal` with -R"):
        ReplayConfig.from_optimal_json(json.loads(out))
    with pytest.raises(ValueError, match="^rollouts_per_step = 8 from the design is not a multiple of group_size = 3"):
        ReplayConfig.from_optimal_json(design, group_size=3)


def test_replay_config_from_an_unbounded_design_says_what_to_do():
    unbounded = {"capacity": None, "batch_size": 292, "rollouts_per_step": 32, "regime": "unbounded"}
    with pytest.raises(ValueError) as info:
        ReplayConfig.from_optimal_json(unbounded)
    assert str(info.value) == (
        "the design is unbounded (the objective still falls at the largest staleness the profile measured): there "
        "is no capacity to read; choose N = x R by hand with x at most the profile's last staleness + 1, B = 292, "
        "or measure sigma^2(s) further out")


def test_replay_config_from_optimal_json_file(tmp_path):
    path = tmp_path / "design.json"
    path.write_text(json.dumps({"capacity": 12, "batch_size": 6, "rollouts_per_step": 4}))
    assert ReplayConfig.from_optimal_json(path) == ReplayConfig(12, 6, 4)
    # the key optimal --json wrote for N before capacity was its name
    path.write_text(json.dumps({"buffer_size": 12, "batch_size": 6, "rollouts_per_step": 4}))
    assert ReplayConfig.from_optimal_json(str(path)) == ReplayConfig(12, 6, 4)


@pytest.mark.parametrize("kwargs, message", [
    (dict(capacity=0, batch_size=1, rollouts_per_step=1), "capacity must be an integer >= 1, got 0"),
    (dict(capacity=4, batch_size=2.5, rollouts_per_step=4), "batch_size must be an integer >= 1, got 2.5"),
    (dict(capacity=2, batch_size=2, rollouts_per_step=4),
     "capacity must be >= rollouts_per_step = 4 (a FIFO holds at least one step), got 2"),
    (dict(capacity=4, batch_size=2, rollouts_per_step=4, loss="ppo"),  # the registry's trainer losses, in its order
     "loss must be one of grpo, no-trust-region, m2po, m2po-reference, tis, got 'ppo'"),
    (dict(capacity=4, batch_size=2, rollouts_per_step=4, loss="rloo"),  # needs is_fresh: simulator and validator
     "loss must be one of grpo, no-trust-region, m2po, m2po-reference, tis, got 'rloo'"),
    (dict(capacity=4, batch_size=2, rollouts_per_step=4, clip_c=0), "clip_c must be > 0, got 0"),
    (dict(capacity=4, batch_size=2, rollouts_per_step=4, eps_high=-0.1), "eps_high must be >= 0, got -0.1"),
])
def test_replay_config_bad_values(kwargs, message):
    with pytest.raises(ValueError) as info:
        ReplayConfig(**kwargs)
    assert str(info.value) == message


def test_buffer_capacity_must_be_whole_groups():
    with pytest.raises(ValueError) as info:
        fifo(capacity=19, group_size=4)
    assert str(info.value) == "capacity must be a multiple of num_generations = 4 (whole groups are stored), got 19"


def test_row_buffer_draws_are_the_simulators_fifo_draws():
    # One buffer implementation: the trainer's rows are selected by core.buffers.FifoBuffer itself, so with the
    # same generator the ids it draws are exactly those the simulator's FIFO draws over the same pushes.
    buffer = RowReplayBuffer(ReplayConfig(12, 6, 4).design_config(2), seed=7)
    assert type(buffer.buffer) is FifoBuffer
    reference, rng = FifoBuffer(1, 12, 1, token_dtype=np.int64), np.random.default_rng(7)
    for step in range(5):
        drawn, data = buffer.step(step, lambda step=step: _rows(4, start=4 * step))
        reference.add(data.fresh, step)
        expected = reference.sample(6, step, rng).batch.tokens[0, :, 0]
        assert drawn["sample_id"].tolist() == expected.tolist()
        assert torch.equal(drawn["completion_ids"][:, 0], drawn["sample_id"])  # row i's fields are row i's
        assert data.staleness[0].tolist() == (step - drawn["version"]).tolist()
    assert buffer.data["sample_id"].tolist() == list(range(8, 20))  # rows 0..7 evicted by the design: forgotten


def test_row_buffer_prioritized_algorithm1_generates_only_on_cycle_steps():
    # FreshPER Algorithm 1 with K = 2: the design generates (and trains on-policy) at steps 0, 3, 6 and runs two
    # prioritised replay updates in between, which generate nothing and carry Eq. (15) importance weights.
    config = ReplayConfig(8, 4, 4, buffer="prioritized", design={"per_replay_updates": 2, "per_alpha": 1.0})
    buffer = RowReplayBuffer(config.design_config(2), seed=0, total_steps=6)
    assert type(buffer.buffer) is PrioritizedBuffer
    generated = []

    def generate(step):
        generated.append(step)
        rows = _rows(4, start=4 * len(generated))
        rows["rewards"] = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
        return rows

    weights = []
    for step in range(6):
        drawn, data = buffer.step(step, lambda step=step: generate(step))
        assert drawn["sample_id"].shape == (4,)
        weights.append(drawn["sampler_weight"])
        assert data.generated == (4 if step % 3 == 0 else 0)
    assert generated == [0, 3]
    assert all(torch.equal(weights[t], torch.ones(4, dtype=torch.float64)) for t in (0, 3))  # on-policy updates
    assert not torch.equal(weights[1], torch.ones(4, dtype=torch.float64))  # priorities |r| + eps: IS weights


def test_row_buffer_positive_bias_keeps_correct_rows_past_the_fifo_age():
    # experience-replay Sec. 4.3: delta N slots keep the freshest correct (reward 1) rollouts after FIFO eviction.
    config = ReplayConfig(4, 2, 2, buffer="positive-bias", design={"delta": 0.5})
    buffer = RowReplayBuffer(config.design_config(2), seed=0)
    assert type(buffer.buffer) is PositiveBiasBuffer

    def rows(step):
        r = _rows(2, start=2 * step)
        r["rewards"] = torch.tensor([1.0 if step == 0 else 0.0, 0.0], dtype=torch.float64)
        return r

    for step in range(4):
        buffer.step(step, lambda step=step: rows(step))
    # a FIFO of 4 would hold rows 4..7 (ages 0, 1); the correct row 0 of step 0 is still there, age 3
    assert 0 in buffer.data["sample_id"].tolist()
    assert int(buffer.ages(3).max()) == 3


def test_row_buffer_selective_keeps_only_groups_of_unequal_rewards():
    # Selective replay (docs/THEORY.md [E8]): a group whose rewards are all equal has zero advantage and never enters.
    buffer = RowReplayBuffer(ReplayConfig(8, 4, 4, buffer="selective").design_config(2), seed=0)

    def rows(step, rewards):
        r = _rows(4, start=4 * step)
        r["rewards"] = torch.tensor(rewards, dtype=torch.float64)
        return r

    # step 0: both groups equal (rows 0-1 at 0, rows 2-3 at 1): nothing enters, the update is skipped (weight 0)
    drawn, data = buffer.step(0, lambda: rows(0, [0.0, 0.0, 1.0, 1.0]))
    assert data.weight.tolist() == [[0.0] * 4] and drawn["sampler_weight"].tolist() == [0.0] * 4
    # step 1: group (4, 5) unequal, group (6, 7) equal: only rows 4 and 5 are kept and drawn, at weight 1
    drawn, data = buffer.step(1, lambda: rows(1, [1.0, 0.0, 0.5, 0.5]))
    assert set(drawn["sample_id"].tolist()) <= {4, 5} and drawn["sampler_weight"].tolist() == [1.0] * 4
    assert sorted(buffer.data["sample_id"].tolist()) == [4, 5]  # the rows no design slot holds are dropped
    with pytest.raises(ValueError, match=r"^buffer selective admits a group by its rewards .* got none$"):
        buffer.push({k: v for k, v in _rows(4, start=8).items() if k != "rewards"}, version=2)
    with pytest.raises(ValueError, match=r"got a non-finite one$"):
        buffer.push(rows(2, [1.0, float("nan"), 0.0, 0.0]), version=2)


@pytest.mark.parametrize("buffer, design", [("fifo", {}), ("positive-bias", {"delta": 0.5}),
                                            ("prioritized", {"per_replay_updates": 2}), ("on-policy", {}),
                                            ("selective", {}), ("stale-k", {"stale_k": 2})])
def test_row_buffer_state_restores_the_next_draws(tmp_path, buffer, design):
    # resume (trl-replay): a buffer built afresh (another seed) and given a saved state draws exactly what the saved
    # buffer draws next, rows, weights and all; the files are JSON and an .npz read without pickle
    capacity, batch = (4, 4) if buffer in ("on-policy", "stale-k") else (8, 4 if buffer == "prioritized" else 6)
    config = ReplayConfig(capacity, batch, 4, buffer=buffer, design=design).design_config(2)

    def rows(step):
        r = _rows(4, start=4 * step)
        r["rewards"] = torch.tensor([1.0, 0.0, 0.5, 0.0], dtype=torch.float64) * (step % 3)
        return r

    saved = RowReplayBuffer(config, seed=3, total_steps=10)
    for step in range(4):
        saved.step(step, lambda step=step: rows(step))
    files = saved.save_state(tmp_path / "buffer")
    assert sorted(f.name for f in files) == ["buffer.json", "buffer.npz"]
    with np.load(tmp_path / "buffer.npz", allow_pickle=False) as arrays:  # arrays only (on-policy keeps none)
        assert bool(arrays.files) == (buffer != "on-policy")
    restored = RowReplayBuffer(config, seed=99, total_steps=10)
    restored.load_state(tmp_path / "buffer")
    for step in range(4, 9):
        a, _ = saved.step(step, lambda step=step: rows(step))
        b, _ = restored.step(step, lambda step=step: rows(step))
        assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a), step


def test_row_buffer_state_of_another_design_is_refused(tmp_path):
    fifo_buffer = RowReplayBuffer(ReplayConfig(8, 6, 4).design_config(2), seed=0)
    fifo_buffer.step(0, lambda: _rows(4))
    fifo_buffer.save_state(tmp_path / "buffer")
    other = RowReplayBuffer(ReplayConfig(8, 4, 4, buffer="prioritized").design_config(2), seed=0)
    with pytest.raises(ValueError) as info:
        other.load_state(tmp_path / "buffer")
    assert str(info.value).startswith("state config: saved with DesignConfig(") and "\n" not in str(info.value)


def test_row_buffer_stale_k_trains_each_generation_once_k_updates_late():
    # k = 2, R = 4 (M2PO Sec. 3, core.buffers.StaleKQueue): step 0 generates the base model's 2 generations (ids 0-7)
    # and its own (8-11) and trains ids 0-3; update t >= 2 trains the generation of update t - 2, at age 2. The
    # rows held are the queue's k + 1 generations.
    buffer = RowReplayBuffer(ReplayConfig(4, 4, 4, buffer="stale-k", design={"stale_k": 2}).design_config(2), seed=0)
    trained, ages, generated, held = [], [], [], []
    for step in range(5):
        drawn, data = buffer.step(step, lambda step=step: _rows(4, start=4 * step))
        trained.append(drawn["sample_id"].tolist())
        ages.append(data.staleness[0].tolist())
        generated.append(int(np.sum(data.generated)))
        held.append(sorted(buffer.data["sample_id"].tolist()))
    assert trained == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]]
    assert ages == [[0] * 4, [1] * 4, [2] * 4, [2] * 4, [2] * 4]  # base generations are version 0
    assert generated == [12, 4, 4, 4, 4]
    assert held == [list(range(0, 12)), list(range(4, 16)), list(range(8, 20)), list(range(12, 24)),
                    list(range(16, 28))]
    # the rows trained at step 4 are step 2's generation (_rows(4, start=8): log-probs -8 .. -11), carrying the
    # behaviour log-probs they were generated with, for the loss's ratio
    assert drawn["old_per_token_logps"][:, 0].tolist() == [-8.0, -9.0, -10.0, -11.0]


def test_row_buffer_dynamic_refills_until_every_trained_group_is_informative():
    # Dynamic sampling (docs/THEORY.md [E11], core.designs.dynamic_step): generation batches of R = B = 4 rows (two
    # groups of 2) until two groups have unequal rewards; those two are trained once, the rest dropped
    buffer = RowReplayBuffer(ReplayConfig(4, 4, 4, buffer="dynamic").design_config(2), seed=0)
    calls: list[int] = []
    rewards = iter([[1.0, 1.0, 0.0, 1.0],  # round 0: group (0, 1) equal, (2, 3) informative
                    [0.0, 0.0, 0.5, 0.5],  # round 1: both equal
                    [1.0, 0.0, 0.0, 1.0]])  # round 2: both informative, only (8, 9) is needed

    def generate():
        r = _rows(4, start=4 * len(calls))
        r["rewards"] = torch.tensor(next(rewards), dtype=torch.float64)
        calls.append(len(calls))
        return r

    drawn, data = buffer.step(3, generate)
    assert calls == [0, 1, 2]  # three rounds, each one whole generation batch
    assert drawn["sample_id"].tolist() == [2, 3, 8, 9]  # the first two informative groups, in generation order
    assert drawn["advantages"].tolist() == [2.0, 3.0, 8.0, 9.0]  # every field gathered with the same rows
    assert drawn["sampler_weight"].tolist() == [1.0] * 4 and data.staleness[0].tolist() == [0] * 4
    assert data.generated.tolist() == [12]  # every round charged
    assert data.curves["refill_rounds"].tolist() == [3.0]
    assert data.curves["refill_zero_share"].tolist() == [0.5]  # 3 of the 6 groups drawn
    assert len(buffer) == 0  # nothing kept past the step
    # one round enough: no refill asked
    drawn, data = buffer.step(4, lambda: {**_rows(4, start=100), "rewards": torch.tensor([0.0, 1.0, 1.0, 0.0])})
    assert drawn["sample_id"].tolist() == [12, 13, 14, 15] and data.curves["refill_rounds"].tolist() == [1.0]
    with pytest.raises(ValueError, match=r"^buffer dynamic admits a group by its rewards .* got none$"):
        buffer.push({k: v for k, v in _rows(4).items() if k != "rewards"}, version=5)


def test_row_buffer_on_policy_trains_each_fresh_row_once():
    buffer = RowReplayBuffer(ReplayConfig(4, 4, 4, buffer="on-policy").design_config(2), seed=0)
    for step in range(3):
        drawn, data = buffer.step(step, lambda step=step: _rows(4, start=4 * step))
        assert drawn["sample_id"].tolist() == list(range(4 * step, 4 * step + 4))
        assert data.staleness[0].tolist() == [0, 0, 0, 0]
        assert len(buffer) == 0  # nothing kept


@pytest.mark.parametrize("kwargs, message", [
    (dict(buffer="group-replay"), "buffer must be one of on-policy, fifo, positive-bias, prioritized, stale-k, "
                                  "epochs, selective, dynamic, got 'group-replay'"),
    (dict(buffer="on-policy"), "batch_size must equal rollouts_per_step = 4 on-policy (every rollout trained once), "
                               "got 6"),
    (dict(design={"capacity": 9}), "design sets capacity, which ReplayConfig sets itself: leave it out of design"),
])
def test_replay_config_design_errors(kwargs, message):
    with pytest.raises(ValueError) as info:
        ReplayConfig(8, 6, 4, **kwargs)
    assert str(info.value) == message
    with pytest.raises(ValueError, match=r"^design has unknown field\(s\) deltaa; DesignConfig's fields are "):
        ReplayConfig(8, 6, 4, design={"deltaa": 0.2})
    with pytest.raises(ValueError, match=r"^delta must be in \[0, 1\), got 1.5$"):  # the registry's own rule
        RowReplayBuffer(ReplayConfig(8, 6, 4, buffer="positive-bias", design={"delta": 1.5}).design_config(2))


# --------------------------------------------------------------------------- shared losses in the autograd graph


def _loss_case(seed: int = 0, B: int = 6, L: int = 5):
    g = torch.Generator().manual_seed(seed)
    logp_behav = -torch.rand(B, L, generator=g, dtype=torch.float64) * 2 - 0.1
    logp_new = (logp_behav + 0.4 * torch.randn(B, L, generator=g, dtype=torch.float64)).requires_grad_(True)
    advantages = torch.randn(B, generator=g, dtype=torch.float64)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[0, 3:] = False
    mask[2, 1:] = False
    return logp_new, logp_behav, advantages, mask


def test_ppo_clip_equals_trl_token_mean_formula():
    # TRL's clipped surrogate (grpo_trainer._compute_loss, token ratios, loss_type="bnpo": sum over real tokens /
    # real tokens) against the shared numpy grpo loss in the graph: value and gradient to 1e-12.
    logp_new, logp_behav, adv, mask = _loss_case()
    replay = ReplayConfig(8, 6, 4, loss="grpo", eps_low=0.2, eps_high=0.28)
    ours, out = shared_loss_tensor(replay, logp_new, logp_behav, adv, mask)
    (grad_ours,) = torch.autograd.grad(ours, logp_new)

    coef_1 = torch.exp(logp_new - logp_behav)
    coef_2 = torch.clamp(coef_1, 1 - 0.2, 1 + 0.28)
    per_token = -torch.min(coef_1 * adv[:, None], coef_2 * adv[:, None])
    m = mask.double()
    theirs = (per_token * m).sum() / m.sum()
    (grad_theirs,) = torch.autograd.grad(theirs, logp_new)
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), abs=1e-12)
    assert torch.allclose(grad_ours, grad_theirs, atol=1e-12)
    assert float(ours.detach()) == pytest.approx(float(out.loss[0]), abs=1e-15)
    assert out.metrics["clip_ratio/region_mean"][0] > 0  # the case exercises the clip


@pytest.mark.parametrize("name", ["tis", "m2po", "no-trust-region"])
def test_autograd_gradient_is_the_shared_numpy_gradient(name):
    logp_new, logp_behav, adv, mask = _loss_case(seed=1)
    replay = ReplayConfig(8, 6, 4, loss=name, clip_c=1.5, tau_m2=0.02)
    loss, out = shared_loss_tensor(replay, logp_new, logp_behav, adv, mask)
    (grad,) = torch.autograd.grad(loss, logp_new)
    args = (logp_new.detach().numpy()[None], logp_behav.numpy()[None], adv.numpy()[None], mask.numpy()[None])
    direct = {"tis": lambda: losses.rloo(*args, c=1.5, is_fresh=np.zeros((1, 6), bool)),
              "m2po": lambda: losses.m2po(*args, tau_m2=0.02),
              "no-trust-region": lambda: losses.no_trust_region(*args)}[name]()
    assert float(loss.detach()) == pytest.approx(float(direct.loss[0]), abs=1e-12)
    assert np.allclose(grad.numpy(), direct.grad_logp[0], atol=1e-12, rtol=0)
    assert np.all(grad.numpy()[~mask.numpy()] == 0)  # padding never gets gradient
    if name == "tis":
        # truncated IS by hand: w_i = min(c, exp(sum_t log r)), loss = -(1/B) sum_i w_i A_i sum_t logp_it
        seq = ((logp_new - logp_behav) * mask).sum(1).detach()
        w = torch.clamp(seq.exp(), max=1.5)
        by_hand = -(w * adv * (logp_new * mask).sum(1)).sum() / 6
        assert float(loss.detach()) == pytest.approx(float(by_hand.detach()), abs=1e-12)
    if name == "m2po":
        assert out.metrics["masked_frac"][0] > 0  # tau_M2 = 0.02 binds


# --------------------------------------------------------------------------- TRL's real trainer on a tiny Qwen2

STEPS, N, B, R, G = 5, 10, 6, 4, 2




def _reward(completions, **kwargs):
    return [c.count("a") / max(len(c), 1) for c in completions]


def _train(output_dir, replay: ReplayConfig, steps: int, trainer_cls=None, dtype=torch.float32, **trainer_kwargs):
    """TRL's real GRPOTrainer loop, through ReplayGRPOTrainer, on a tiny Qwen2 (2 layers, hidden 32) on CPU."""
    from datasets import Dataset

    from replay_theory.integrations.trl import ReplayGRPOTrainer, replay_grpo_args

    trainer_cls = trainer_cls or ReplayGRPOTrainer

    tokenizer = char_tokenizer()
    model = tiny_qwen2(tokenizer, dtype)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    dataset = Dataset.from_dict({"prompt": ["abc", "bcd", "cde", "def", "efg", "fgh", "ab", "gh"] * 4})
    args = replay_grpo_args(replay, G, output_dir=str(output_dir), max_completion_length=6, max_steps=steps,
                            learning_rate=1e-2, logging_steps=1, report_to="none", use_cpu=True, save_strategy="no",
                            seed=0)
    trainer = trainer_cls(model=model, reward_funcs=_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, replay=replay, **trainer_kwargs)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "replay/replay_ratio" in h]
    return trainer, logs, before, tokenizer


@pytest.mark.parametrize("kwargs, message", [
    (dict(design={"epochs": 2, "mini_batches": 2, "epoch_shuffle": True}),
     "epoch_shuffle must be False in a trainer: TRL keeps one order per generation for its num_iterations passes "
     "(GRPOTrainer._prepare_inputs); run a reshuffled design in the simulator"),
    (dict(batch_size=8, design={"mini_batches": 2}),
     "batch_size must be rollouts_per_step / mini_batches = 8 / 2 = 4 (each update trains one mini-batch of the "
     "generation), got 8"),
    (dict(capacity=16, design={"mini_batches": 2}),
     "capacity must equal rollouts_per_step = 8 (an epoch design holds one generation), got 16"),
    (dict(buffer="stale-k"), "batch_size must equal rollouts_per_step = 8 with buffer stale-k (each update trains "
                             "one whole generation, once, k updates late), got 4"),
])
def test_replay_config_epochs_refusals(kwargs, message):
    args = {"capacity": 8, "batch_size": 4, "rollouts_per_step": 8, "buffer": "epochs"} | kwargs
    with pytest.raises(ValueError) as info:
        ReplayConfig(**args)
    assert str(info.value) == message


def test_row_replay_buffer_refuses_epochs_in_one_line():
    from replay_theory.core.designs import DesignConfig

    config = DesignConfig(buffer="epochs", capacity=8, batch_size=4, rollouts_per_step=8, group_size=2,
                          epochs=2, mini_batches=2)
    with pytest.raises(ValueError) as info:
        RowReplayBuffer(config)
    assert str(info.value) == ("buffer epochs keeps no slots a trainer's rows can be found in: ReplayGRPOTrainer runs "
                               "it through TRL's own generation buffer (num_iterations, steps_per_generation), not "
                               "through RowReplayBuffer")


@pytest.mark.slow
def test_trl_epochs_is_trls_own_buffering(tmp_path):
    # e = 2 epochs over m = 2 mini-batches of R = 8 (B = 4), 8 updates: TRL generates twice (steps 0 and 4), and
    # each rollout is trained e = 2 times, m = 2 updates apart (TRL's one order per generation), at ages 0..3.
    pytest.importorskip("trl")
    import pyarrow.parquet as pq

    from replay_theory.integrations.trl import replay_grpo_args

    e, m, r, steps = 2, 2, 8, 8
    replay = ReplayConfig(r, r // m, r, buffer="epochs", design={"epochs": e, "mini_batches": m})
    args = replay_grpo_args(replay, G, output_dir=str(tmp_path), use_cpu=True)
    assert (args.per_device_train_batch_size, args.steps_per_generation, args.num_iterations,
            args.generation_batch_size) == (4, 2, 2, 8)
    trainer, logs, before, _ = _train(tmp_path / "out", replay, steps, diagnose_log=tmp_path / "log.parquet")
    assert trainer.replay_buffer is None  # no buffer of ours: TRL's _buffered_inputs
    assert trainer.state.global_step == steps and len(logs) == steps  # optimizer updates
    assert trainer.replay_generated == 2 * r and trainer.replay_trained == steps * r // m  # two generations
    assert [h["replay/replay_ratio"] for h in logs] == [0.5, 1.0, 1.5, 2.0, 1.25, 1.5, 1.75, 2.0]
    assert [h["replay/staleness_max"] for h in logs] == [0, 1, 2, 3] * 2
    assert [h["replay/buffer_rows"] for h in logs] == [r] * steps
    t = pq.read_table(tmp_path / "log.parquet").to_pydict()
    step, sample, age = (np.asarray(t[k]) for k in ("step", "sample_id", "age"))
    assert step.tolist() == [s for s in range(steps) for _ in range(r // m)]
    assert np.asarray(t["step_generated_rows"]).reshape(steps, -1)[:, 0].tolist() == [r, 0, 0, 0] * 2
    assert age.tolist() == [s % (e * m) for s in step]  # staleness of each use: 0 .. e m - 1
    assert np.array_equal(np.asarray(t["policy_version"]), step - step % (e * m))
    ids, uses = np.unique(sample, return_counts=True)
    assert ids.tolist() == list(range(2 * r)) and uses.tolist() == [e] * (2 * r)  # each rollout used e times
    by_step = sample.reshape(steps, -1)
    for j in range(steps):  # the same slice one epoch later: one order per generation (no per-epoch shuffle)
        if j % (e * m) >= m:
            assert by_step[j].tolist() == by_step[j - m].tolist()
    assert np.array_equal(np.asarray(t["group_id"]), sample // G)
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.named_parameters())


@pytest.mark.slow
def test_trl_stale_k_trains_each_generation_once_k_updates_late(tmp_path):
    # k = 1 (one-step-off) over 4 updates of R = 4: step 0 generates the base generation and its own (2R rows) and
    # trains the base one; update t >= 1 trains update t - 1's generation, once, at age 1, against the behaviour
    # log-probs stored with it (the loss's ratio is not 1: the policy moved one update since).
    pytest.importorskip("trl")
    import pyarrow.parquet as pq

    k, r, steps = 1, 4, 4
    replay = ReplayConfig(r, r, r, buffer="stale-k", design={"stale_k": k})
    trainer, logs, before, _ = _train(tmp_path / "out", replay, steps, diagnose_log=tmp_path / "log.parquet")
    assert (trainer.replay_generated, trainer.replay_trained) == ((k + 1) * r + (steps - 1) * r, steps * r)
    assert [h["replay/staleness_max"] for h in logs] == [0, 1, 1, 1]
    assert [h["replay/buffer_rows"] for h in logs] == [(k + 1) * r] * steps  # the queue's k + 1 generations
    t = pq.read_table(tmp_path / "log.parquet").to_pydict()
    step, sample, age = (np.asarray(t[key]) for key in ("step", "sample_id", "age"))
    assert step.tolist() == [s for s in range(steps) for _ in range(r)]
    # step 0 pushes the base generation (ids 0-3), then its own (ids 4-7); update t trains ids 4t .. 4t + 3
    assert sample.tolist() == list(range(steps * r))
    assert age.tolist() == [0] * r + [1] * (steps - 1) * r
    # the ratio pi_theta / pi_behav is exactly 1 at update 0 (nothing has moved) and not after (one update stale)
    new, old = (np.asarray(t[key], dtype=object) for key in ("per_token_logps", "old_per_token_logps"))
    moved = [max(abs(a - b) for a, b in zip(n, o)) for n, o in zip(new, old)]
    assert max(moved[:r]) < 1e-5 and min(moved[r:]) > 1e-5
    assert np.asarray(t["step_generated_rows"]).reshape(steps, -1)[:, 0].tolist() == [2 * r, r, r, r]
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.named_parameters())


def test_trl_dynamic_sampling_trains_informative_groups_once_every_round_counted(tmp_path):
    # Dynamic sampling (DAPO; core.designs.dynamic_step, the simulator's step) through TRL's real loop: each update
    # trains B = 4 rows (two groups of G = 2) whose rewards differ, once, generated at this update; a generation
    # batch whose groups fall short is followed by refill rounds of new prompts, every one charged
    pytest.importorskip("trl")
    import pyarrow.parquet as pq

    r, steps = 4, 4
    trainer, logs, before, _ = _train(tmp_path / "out", ReplayConfig(r, r, r, buffer="dynamic"), steps,
                                      diagnose_log=tmp_path / "log.parquet")
    rounds = [h["replay/refill_rounds"] for h in logs]
    t = pq.read_table(tmp_path / "log.parquet").to_pydict()
    step, age, generated = (np.asarray(t[key]) for key in ("step", "age", "step_generated_rows"))
    rewards, group = np.asarray(t["rewards"]).reshape(-1, G), np.asarray(t["group_id"]).reshape(-1, G)
    assert step.tolist() == [s for s in range(steps) for _ in range(r)] and age.tolist() == [0] * steps * r
    assert (group == group[:, :1]).all() and (rewards.max(axis=1) > rewards.min(axis=1)).all()  # whole, informative
    assert generated.reshape(steps, r)[:, 0].tolist() == [int(n * r) for n in rounds]  # every round charged
    assert (trainer.replay_generated, trainer.replay_trained) == (int(sum(rounds)) * r, steps * r)
    assert max(rounds) > 1  # the run refilled: short completions without an 'a' score 0 in both of a group
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.named_parameters())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    pytest.importorskip("trl")
    return _train(tmp_path_factory.mktemp("trl"), ReplayConfig(capacity=N, batch_size=B, rollouts_per_step=R),
                  STEPS)


@pytest.mark.slow
def test_trl_replay_ratio_is_b_over_r(trained):
    trainer, logs, _, _ = trained
    assert len(logs) == STEPS
    assert [h["replay/replay_ratio"] for h in logs] == [B / R] * STEPS
    assert (trainer.replay_trained, trainer.replay_generated) == (STEPS * B, STEPS * R)


@pytest.mark.slow
def test_trl_staleness_follows_the_fifo_law(trained):
    trainer, logs, _, _ = trained
    max_age = math.ceil(N / R) - 1  # 2
    assert [h["replay/buffer_max_age"] for h in logs] == [min(t, max_age) for t in range(STEPS)]
    assert [h["replay/buffer_rows"] for h in logs] == [min(R * (t + 1), N) for t in range(STEPS)]
    for t, h in enumerate(logs):
        assert 0 <= h["replay/staleness_max"] <= min(t, max_age)
        fracs = [h[f"replay/staleness_frac/{name}"] for _, _, name in age_buckets(max_age)]
        assert sum(fracs) == pytest.approx(1.0)
        assert h["replay/staleness_mean"] <= h["replay/staleness_max"]
        assert h["replay/ess/age_0"] == pytest.approx(1.0)  # fresh rows: pi_theta = pi_behav, every weight 1
        assert 0 < h["replay/ess"] <= 1
    # the buffer after the last push: versions of the FIFO of N = 10, R = 4
    assert trainer.replay_buffer.data["version"].tolist() == [2, 2, 3, 3, 3, 3, 4, 4, 4, 4]


@pytest.mark.slow
def test_trl_whatif_flags_are_diagnose_s_on_the_step(trained):
    # The PPO clip the loss applies (eps 0.2 both sides) flags exactly the tokens diagnose's what-if ppo_clip 0.2
    # flags: the loss's clip_ratio/region_mean and the what-if flagged fraction are one number, every step.
    _, logs, _, _ = trained
    for h in logs:
        assert h["replay/whatif/ppo_clip_0.2/flagged_frac"] == pytest.approx(h["clip_ratio/region_mean"], abs=1e-12)
        # a higher truncation level touches a subset of the tokens a lower one touches
        assert h["replay/whatif/tis_5/flagged_frac"] <= h["replay/whatif/tis_2/flagged_frac"]
        assert h["replay/whatif/seq_mask_5/flagged_frac"] <= h["replay/whatif/seq_mask_2/flagged_frac"]
    # verl's / TRL's / M2PO's own keys, computed by diagnose's framework_statistics on the same pair
    for h in logs:
        assert h["rollout_corr/ppl_ratio"] > 0 and h["rollout_corr/rollout_ppl"] >= 1
        assert 0 < h["rollout_corr/rollout_is_eff_sample_size"] <= 1 + 1e-6  # verl divides by mean + 1e-8
        assert h["m2po/M2"] >= 0
    assert logs[0]["sampling/sampling_logp_difference/mean"] == pytest.approx(0, abs=1e-6)  # step 0: same policy
    assert logs[0]["rollout_corr/log_ppl_diff"] == pytest.approx(0, abs=1e-6)
    for key in ("ppo_clip_0.2", "tis_2", "mask_2", "m2po_algorithm1_0.04", "seq_tis_2"):
        assert logs[0][f"replay/whatif/{key}/flagged_frac"] == 0  # step 0: fresh rows, every ratio exactly 1
        assert logs[0][f"replay/whatif/{key}/ess_frac"] == pytest.approx(1.0)


@pytest.mark.slow
def test_trl_buffered_groups_keep_their_shapes_and_rows(trained):
    # #6804 through TRL's real call path: every group of every push is buffered, and each row's reward and
    # advantage are the ones TRL computed for THAT completion and ITS group.
    trainer, _, _, tokenizer = trained
    data = trainer.replay_buffer.data
    assert trainer.replay_buffer.num_groups == N // G
    for name, value in data.items():
        assert value.shape[0] == N, name
    assert data["group_id"].tolist() == [g for g in range(STEPS * R // G - N // G, STEPS * R // G) for _ in range(G)]
    completions = tokenizer.batch_decode(data["completion_ids"] * data["completion_mask"], skip_special_tokens=True)
    assert data["rewards"].tolist() == pytest.approx(_reward(completions), abs=1e-6)
    rewards = data["rewards"].view(-1, G)  # TRL's GRPO advantage, per group: (r - mean) / (std + 1e-4)
    advantage = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)
    assert data["advantages"].tolist() == pytest.approx(advantage.reshape(-1).tolist(), abs=1e-5)


@pytest.mark.slow
def test_trl_loss_finite_and_parameters_move(trained):
    trainer, logs, before, _ = trained
    assert all(math.isfinite(h["loss"]) for h in logs)
    assert all(h["loss"] == pytest.approx(h["replay/loss"], abs=1e-6) for h in logs)
    moved = [k for k, v in trainer.model.named_parameters() if not torch.equal(v.detach(), before[k])]
    assert len(moved) == len(before)


@pytest.mark.slow
def test_trl_tool_mask_is_multiplied_in(trained):
    # TRL's tool_mask (0 on tool-result tokens) must leave those tokens out of the loss, as completion_mask does.
    trainer, _, _, _ = trained
    batch = trainer.replay_buffer.sample(B)
    batch["tool_mask"] = torch.ones_like(batch["tool_mask"])
    batch["tool_mask"][:, 1:3] = 0
    batch["completion_mask"][:, 0] = 1  # at least one real token per row
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, batch)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        logp = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention,
                                                         batch["completion_ids"].size(1))[0]
    mask = (batch["completion_mask"] * batch["tool_mask"]).bool().numpy()
    expected = shared_loss(trainer.replay, logp.double().numpy(), batch["old_per_token_logps"].double().numpy(),
                           batch["advantages"].double().numpy(), mask)
    assert float(loss.detach()) == pytest.approx(float(expected.loss[0]), abs=1e-6)


# --------------------------------------------------------------------------- the noise scale, two batch sizes


@pytest.mark.slow  # imports TRL
def test_noise_halves_keep_groups_whole_by_hand():
    pytest.importorskip("trl")
    from replay_theory.integrations.trl import noise_halves

    # counts 5: 3, 2: 2, 7: 2, 9: 1 -> largest first: 5 -> half 1 (3), 2 -> half 2 (2), 7 -> half 2 (4), 9 -> half 1
    first, second = noise_halves(torch.tensor([5, 5, 5, 2, 7, 7, 2, 9]))
    assert first.tolist() == [0, 1, 2, 7] and second.tolist() == [3, 4, 5, 6]
    # on-policy: 4 whole groups of 2 in order -> groups 0, 2 and 1, 3: B/2 each
    first, second = noise_halves(torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
    assert first.tolist() == [0, 1, 4, 5] and second.tolist() == [2, 3, 6, 7]
    # three groups of 2: 4 rows and 2 (no split keeps groups whole and equal)
    first, second = noise_halves(torch.tensor([0, 0, 1, 1, 2, 2]))
    assert first.tolist() == [0, 1, 4, 5] and second.tolist() == [2, 3]
    assert noise_halves(torch.tensor([3, 3, 3])) is None  # one group: not splittable


def _grad_sq(loss, params) -> float:
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return sum(float((g.double() ** 2).sum()) for g in grads if g is not None)


def _float64_trainer_cls(seen: dict | None = None):
    """ReplayGRPOTrainer with log-probs by a plain log_softmax of the logits (float64 with a float64 model), that
    records each step's parameters and rows in ``seen``.

    Why: TRL 1.16's fused log-prob kernel works in float32, and the tiny model's backward amplifies float32 round-off
    to 0.02-1% of |g|^2 (measured: |grad (s f)|^2 / s^2 moves by 0.7% between s = 1 and 2.5 in float32, by 1e-8 in
    float64): more than a test of the noise bookkeeping should allow, and enough to fork two float32 runs.
    """
    from replay_theory.integrations.trl import ReplayGRPOTrainer

    class Float64(ReplayGRPOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if seen is not None and model.training and "version" in inputs:  # theta and rows, before the update
                seen[self.state.global_step] = ({k: v.detach().clone() for k, v in model.state_dict().items()},
                                                {k: v.clone() for k, v in inputs.items()})
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                               batch_size=None, compute_entropy=False, **_):
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -logits_to_keep - 1:-1]
            logp_all = torch.log_softmax(logits, dim=-1)  # (rows, L, V)
            logp = logp_all.gather(-1, input_ids[:, -logits_to_keep:, None])[..., 0]  # (rows, L)
            entropy = -(logp_all.exp() * logp_all).sum(-1) if compute_entropy else None
            return logp, entropy, None

    return Float64


@pytest.mark.slow
def test_trl_noise_norms_equal_autograd_on_each_half(tmp_path):
    """|g_small|^2, |g_big|^2 logged by the trainer at each step = autograd by hand at that step's parameters: the
    shared loss on each half ALONE (its own token-mean) and on the whole batch, float64 (``_float64_trainer_cls``).
    Tolerance rel 1e-7 (Qwen2's RMSNorm still rounds through float32; measured 9e-9). Batch sizes: the harmonic mean
    of the halves' rows and B. The jsonl file and TRL's logged metrics carry the same numbers."""
    pytest.importorskip("trl")
    from replay_theory.integrations.trl import noise_halves

    seen: dict = {}
    trainer_cls = _float64_trainer_cls(seen)
    replay = ReplayConfig(N, B, R)
    noise_log = tmp_path / "noise" / "noise_scale.jsonl"
    trainer, logs, _, _ = _train(tmp_path / "out", replay, steps=3, trainer_cls=trainer_cls, dtype=torch.float64,
                                 noise_log=noise_log)
    records = trainer.noise_records
    assert len(records) >= 2 and [r["step"] for r in records] == sorted(r["step"] for r in records)
    lines = [json.loads(line) for line in noise_log.read_text().splitlines()]
    assert lines == [{**r, "unit_size": G} for r in records]
    by_step = {h["step"] - 1: h for h in logs}  # TRL logs step t + 1 after update t
    model = trainer.model
    params = [p for p in model.parameters() if p.requires_grad]

    def loss_on(batch, rows):
        """The shared loss of ``rows`` of ``batch`` alone, in the model's graph."""
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)[rows]
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)[rows]
        logp = trainer_cls._get_per_token_logps_and_entropies(trainer, model, ids, attention,
                                                              batch["completion_ids"].size(1))[0]
        mask = (batch["completion_mask"][rows] * batch["tool_mask"][rows]).bool()
        return shared_loss_tensor(replay, logp, batch["old_per_token_logps"][rows], batch["advantages"][rows],
                                  mask)[0]

    for record in records:
        state, batch = seen[record["step"]]
        model.load_state_dict(state)
        model.train()
        halves = noise_halves(batch["group_id"])
        full = loss_on(batch, torch.arange(B))
        small = [_grad_sq(loss_on(batch, h), params) for h in halves]
        b1, b2 = (len(h) for h in halves)
        assert record["grad_sq_big"] == pytest.approx(_grad_sq(full, params), rel=1e-7)
        assert record["grad_sq_small"] == pytest.approx(sum(small) / 2, rel=1e-7)
        assert (record["batch_small"], record["batch_big"]) == (2 * b1 * b2 / (b1 + b2), B)
        assert record["grad_sq_small"] > record["grad_sq_big"]  # the halves are noisier than their mean
        logged = by_step[record["step"]]
        for key in ("grad_sq_small", "grad_sq_big", "batch_small", "batch_big"):
            assert logged[f"noise/{key}"] == pytest.approx(record[key], rel=1e-12)
        assert logged["loss"] == pytest.approx(float(full.detach()), rel=1e-7)  # trained on the full loss
    with pytest.raises(ValueError, match="exists: a log is never overwritten"):
        _train(tmp_path / "again", replay, 1, noise_log=noise_log)


@pytest.mark.slow
def test_trl_measuring_the_noise_does_not_change_training(tmp_path):
    # the split into halves backpropagates the same full-batch gradient: the same losses and parameters (float64)
    pytest.importorskip("trl")
    runs = [_train(tmp_path / str(measure), ReplayConfig(N, B, R), 4, trainer_cls=_float64_trainer_cls(),
                   dtype=torch.float64, measure_noise=measure) for measure in (True, False)]
    (measured, logs, _, _), (plain, plain_logs, _, _) = runs
    assert plain.noise_records == [] and not any(k.startswith("noise/") for h in plain_logs for k in h)
    assert sum("noise/grad_sq_big" in h for h in logs) == len(measured.noise_records) >= 3
    assert [h["loss"] for h in plain_logs] == pytest.approx([h["loss"] for h in logs], rel=1e-7)
    for (name, p), q in zip(measured.model.named_parameters(), plain.model.parameters()):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-9), name


@pytest.mark.slow
@pytest.mark.parametrize("name, metric", [("tis", "replay/weight_mean"), ("m2po", "replay/masked_frac")])
def test_trl_other_corrections_train(tmp_path, name, metric):
    pytest.importorskip("trl")
    trainer, logs, before, _ = _train(tmp_path, ReplayConfig(N, B, R, loss=name), steps=3)
    assert len(logs) == 3 and all(math.isfinite(h["loss"]) and metric in h for h in logs)
    assert any(not torch.equal(v.detach(), before[k]) for k, v in trainer.model.named_parameters())


@pytest.mark.slow
def test_trl_selective_replay_trains_on_groups_of_unequal_rewards_only(tmp_path):
    # issue 40: selective replay through TRL's real loop; the buffer holds only groups whose rewards differ
    pytest.importorskip("trl")
    trainer, logs, before, _ = _train(tmp_path, ReplayConfig(16, 4, 4, buffer="selective"), steps=4)
    assert (trainer.replay_generated, trainer.replay_trained) == (4 * 4, 4 * 4)
    held = trainer.replay_buffer.data
    rewards = held["rewards"].reshape(-1, G)  # whole groups, in push order
    assert len(held["rewards"]) > 0 and bool((rewards.amax(dim=1) > rewards.amin(dim=1)).all())
    assert all(math.isfinite(h["loss"]) for h in logs)
    assert any(not torch.equal(v.detach(), before[k]) for k, v in trainer.model.named_parameters())


@pytest.mark.slow
def test_trl_prioritized_design_runs_algorithm1(tmp_path):
    # FreshPER Algorithm 1 (K = 2) through TRL's real loop: generation only at steps 0 and 3, replay in between.
    pytest.importorskip("trl")
    replay = ReplayConfig(8, 4, 4, buffer="prioritized", design={"per_replay_updates": 2})
    trainer, logs, before, _ = _train(tmp_path, replay, steps=5)
    assert (trainer.replay_generated, trainer.replay_trained) == (2 * 4, 5 * 4)
    assert [h["replay/replay_ratio"] for h in logs] == pytest.approx([1, 2, 3, 2, 2.5])  # trained / generated
    assert [h["replay/staleness_max"] for h in logs][:3] == [0, 1, 2]  # the cycle's rows age by one a step
    assert all(math.isfinite(h["loss"]) for h in logs)
    assert any(not torch.equal(v.detach(), before[k]) for k, v in trainer.model.named_parameters())


@pytest.mark.slow  # the first TRL import alone takes about 5 s
def test_trl_args_the_design_sets_are_refused():
    pytest.importorskip("trl")
    from replay_theory.integrations.trl import replay_grpo_args

    with pytest.raises(ValueError) as info:
        replay_grpo_args(ReplayConfig(N, B, R), G, output_dir="unused", per_device_train_batch_size=8)
    assert str(info.value) == "the replay design sets per_device_train_batch_size (R = 4, G = 2): leave it out"


@pytest.mark.slow  # TRL's import
def test_trl_resume_loads_the_tied_model_exactly_without_a_missing_keys_warning(tmp_path):
    """trl-replay's resume goes through Trainer._load_from_checkpoint, which warned "missing keys ...
    ['lm_head.weight']" of every checkpoint of the tied tiny model (safetensors keeps the shared tensor once): the
    round trip gives the saved parameters, bit for bit, with no such warning; another missing key is still said."""
    pytest.importorskip("trl")
    import logging
    import warnings

    from datasets import Dataset
    from torch.nn.modules.module import _IncompatibleKeys
    from transformers import Trainer

    from replay_theory.integrations.trl import ReplayGRPOTrainer, loaded_through_a_tie, replay_grpo_args

    tokenizer = char_tokenizer()
    replay = ReplayConfig(N, B, R)

    def trainer(name: str) -> ReplayGRPOTrainer:
        args = replay_grpo_args(replay, G, output_dir=str(tmp_path / name), max_completion_length=4, max_steps=1,
                                report_to="none", use_cpu=True, save_strategy="no", seed=0)
        return ReplayGRPOTrainer(model=tiny_qwen2(tokenizer), reward_funcs=_reward, args=args,
                                 processing_class=tokenizer, replay=replay, measure_noise=False,
                                 train_dataset=Dataset.from_dict({"prompt": ["abc", "bcd"] * 4}))

    saved = trainer("saved")
    with torch.no_grad():
        for param in saved.model.parameters():
            param.add_(torch.linspace(-0.5, 0.5, param.numel()).view_as(param))  # away from the fresh model's
    saved._save(str(tmp_path / "checkpoint"))  # Trainer's own model save (as in a checkpoint)
    loaded = trainer("loaded")
    assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight  # tied

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("transformers")  # transformers' loggers do not propagate to the root's
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaded._load_from_checkpoint(str(tmp_path / "checkpoint"))  # trl-replay's resume loads the model here
        said = [r.getMessage() for r in records] + [str(w.message) for w in caught]
        assert not [m for m in said if "missing keys" in m], said
        state, expected = loaded.model.state_dict(), saved.model.state_dict()
        assert state.keys() == expected.keys() and all(torch.equal(state[k], expected[k]) for k in expected)
        assert not torch.equal(state["model.norm.weight"], trainer("fresh").model.state_dict()["model.norm.weight"])

        tied = _IncompatibleKeys(["lm_head.weight"], [])
        assert loaded_through_a_tie(loaded.model, tied.missing_keys) == {"lm_head.weight"}
        assert loaded_through_a_tie(loaded.model, ["lm_head.weight", "model.embed_tokens.weight"]) == set()
        records.clear()
        Trainer._issue_warnings_after_load(loaded, tied)  # transformers' own: the warning this test looks for
        loaded._issue_warnings_after_load(_IncompatibleKeys(["lm_head.weight", "model.norm.weight"], []))
        assert [r.getMessage() for r in records] == [
            "There were missing keys in the checkpoint model loaded: ['lm_head.weight'].",
            "There were missing keys in the checkpoint model loaded: ['model.norm.weight']."]
    finally:
        logger.removeHandler(handler)


# --------------------------------------------------------------------------- the diagnose log export


def _tool_trainer_cls():
    """ReplayGRPOTrainer fed TRL's multi-turn output shape: token 1 of every completion is a tool result.

    As in TRL's tool loop (grpo_trainer._tool_call_loop): tool_mask 0 there, and the sampling log-prob 0 there,
    while the model's own log-prob of that token (old_per_token_logps, per_token_logps) is whatever the model says.
    """
    from replay_theory.integrations.trl import ReplayGRPOTrainer

    class ToolReplayGRPOTrainer(ReplayGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            tool = torch.ones_like(out["completion_mask"])
            tool[:, 1:2] = 0  # (rows, L); a width-1 batch has no token 1
            out["tool_mask"] = tool
            out["old_per_token_logps"] = self._behaviour_logps(out)
            out["sampling_per_token_logps"] = out["old_per_token_logps"] * tool
            return out

    return ToolReplayGRPOTrainer


def _lists(table, name):
    return [np.asarray(v, dtype=np.float64) for v in table.column(name).to_pylist()]


@pytest.mark.slow
def test_trl_diagnose_log_export_is_what_preset_trl_reads(tmp_path, cli, capsys):
    pytest.importorskip("trl")
    import pyarrow.parquet as pq

    from replay_theory.diagnose import DiagnoseConfig, diagnose
    from replay_theory.integrations.export import STEP_TIME_COLUMNS, TRL_LOG_COLUMNS
    from replay_theory.integrations.trl import DiagnoseLogCallback
    from replay_theory.theory import divergences as dv

    steps, path = 3, tmp_path / "logs" / "run.parquet"
    trainer, logs, _, _ = _train(tmp_path / "out", ReplayConfig(N, B, R), steps, trainer_cls=_tool_trainer_cls(),
                                 diagnose_log=path)
    assert len(logs) == steps
    table = pq.read_table(path)
    assert table.column_names == list(TRL_LOG_COLUMNS) + list(STEP_TIME_COLUMNS)
    generated = np.asarray(table.column("step_generated_rows").to_pylist())
    assert generated.tolist() == [R] * (steps * B)  # the FIFO design generates R fresh rows every step
    for name in ("step_generation_seconds", "step_update_seconds"):
        seconds = np.asarray(table.column(name).to_pylist())
        assert np.all(seconds > 0) and np.all(np.isfinite(seconds)), name
        per_step = seconds.reshape(steps, B)
        assert np.all(per_step == per_step[:, :1]), name  # one value per step, repeated on its rows
    assert pq.ParquetFile(path).metadata.num_row_groups == steps  # appended once per step
    step = np.asarray(table.column("step").to_pylist())
    age = np.asarray(table.column("age").to_pylist())
    assert step.tolist() == [t for t in range(steps) for _ in range(B)]  # B rows trained per step
    assert np.array_equal(age, step - np.asarray(table.column("policy_version").to_pylist()))
    assert np.all((age >= 0) & (age <= np.minimum(step, math.ceil(N / R) - 1)))  # the FIFO law
    assert np.array_equal(np.asarray(table.column("group_id").to_pylist()),
                          np.asarray(table.column("sample_id").to_pylist()) // G)

    new, behav, old = (_lists(table, n) for n in ("per_token_logps", "sampling_per_token_logps",
                                                   "old_per_token_logps"))
    completion, tool = _lists(table, "completion_mask"), _lists(table, "tool_mask")
    keep = [(c * t).astype(bool) for c, t in zip(completion, tool)]
    lr = np.concatenate([(n - b)[k] for n, b, k in zip(new, behav, keep)])
    n_tokens = int(sum(k.sum() for k in keep))
    tool_tokens = int(sum(((c == 1) & (t == 0)).sum() for c, t in zip(completion, tool)))
    assert tool_tokens > 0 and all(np.all(b[t == 0] == 0) for b, t in zip(behav, tool))
    # step 0 trains only fresh rows before the optimizer moved: per_token_logps is the behaviour policy's
    for i in np.flatnonzero(step == 0):
        assert np.allclose(new[i][keep[i]], old[i][keep[i]], atol=1e-5)

    report = diagnose(DiagnoseConfig(path=str(path), preset="trl"))
    assert report["n_tokens"] == n_tokens == len(lr)
    assert report["n_sequences"] == steps * B
    assert report["kl_k3"] == pytest.approx(float(np.mean(np.expm1(lr) - lr)), rel=1e-9, abs=1e-15)
    assert report["ess_frac"] == pytest.approx(float(dv.ess_kish_fraction(lr)), rel=1e-12)
    assert report["ratio_min"] == pytest.approx(math.exp(lr.min()), rel=1e-12)
    token_age = np.concatenate([np.full(int(k.sum()), a) for k, a in zip(keep, age)])
    assert [b["age"] for b in report["by_age"]] == sorted(set(token_age.tolist()))
    assert [b["n_tokens"] for b in report["by_age"]] == [int((token_age == a).sum()) for a in sorted(set(token_age))]
    rewards = np.asarray(table.column("rewards").to_pylist())
    assert report["mean_reward"] == pytest.approx(float(np.repeat(rewards, [k.sum() for k in keep]).mean()))

    # the CLI reads it the same way; dropping the tool_mask brings back the tool tokens and their tiny ratios
    capsys.readouterr()  # TRL's training logs
    code, out, err = cli("diagnose", str(path), "--preset", "trl", "--json", "--no-progress")
    assert code == 0, err
    assert json.loads(out)["n_tokens"] == n_tokens
    with_tools = diagnose(DiagnoseConfig(path=str(path), preset="trl", columns="tool_mask="))
    assert with_tools["n_tokens"] == n_tokens + tool_tokens
    lr_all = np.concatenate([(n - b)[c.astype(bool)] for n, b, c in zip(new, behav, completion)])
    assert with_tools["ratio_min"] == pytest.approx(math.exp(lr_all.min()), rel=1e-12)
    assert with_tools["ratio_min"] < report["ratio_min"]

    # never overwritten: refused when the trainer (or the callback) is made, before any training
    size = path.stat().st_size
    with pytest.raises(ValueError) as info:
        _train(tmp_path / "again", ReplayConfig(N, B, R), 1, diagnose_log=path)
    assert str(info.value) == f"diagnose log {path} exists: a log is never overwritten, give a new path"
    with pytest.raises(ValueError, match="exists: a log is never overwritten"):
        DiagnoseLogCallback(path)
    assert path.stat().st_size == size


def test_diagnose_log_writer_appends_new_files_only(tmp_path):
    pytest.importorskip("pyarrow")
    import os

    import pyarrow.parquet as pq

    from replay_theory.integrations.export import DiagnoseLogWriter

    path = tmp_path / "sub" / "log.parquet"
    writer = DiagnoseLogWriter(path)
    writer.close()
    assert not path.exists() and not path.parent.exists()  # nothing trained, nothing left behind
    old = os.umask(0o027)
    try:
        writer = DiagnoseLogWriter(path)
        writer.write({"step": torch.tensor([0, 0]), "per_token_logps": torch.tensor([[-1.0, -0.5], [-0.25, 0.0]])})
        writer.write({"step": np.array([1]), "per_token_logps": np.array([[-2.0, -3.0]])})
        with pytest.raises(ValueError) as info:
            writer.write({"step": np.array([1]), "per_token_logps": np.array([[-2.0, -3.0]]), "x": np.array([1])})
        assert str(info.value) == (f"diagnose log {path}: a batch's columns ['step', 'per_token_logps', 'x'] differ "
                                   "from the first batch's ['step', 'per_token_logps']")
        with pytest.raises(ValueError, match=r"^column x has 2 rows, the others 1$"):
            writer.write({"step": np.array([1]), "x": np.array([1, 2])})
        writer.close()
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o640
    table = pq.read_table(path)
    assert table.to_pydict() == {"step": [0, 0, 1], "per_token_logps": [[-1.0, -0.5], [-0.25, 0.0], [-2.0, -3.0]]}
    assert writer.rows_written == 3
    with pytest.raises(ValueError, match="is closed"):
        writer.write({"step": np.array([2])})


# --------------------------------------------------------------------------- replay-theory trl-replay


@pytest.mark.parametrize("args, message", [
    (["--capacity", "16"], "give --design FILE (replay-theory optimal ... -B B --json > FILE) or all of "
                              "--capacity, --batch-size, --rollouts-per-step (--buffer epochs, stale-k or dynamic: "
                              "--rollouts-per-step)"),
    (["--capacity", "8", "--batch-size", "8", "--rollouts-per-step", "16"],
     "--capacity must be >= --rollouts-per-step = 16 (a FIFO holds at least one step), got 8"),
    (["--capacity", "16", "--batch-size", "8", "--rollouts-per-step", "8", "--buffer", "exgrpo"],
     "--buffer must be one of on-policy, fifo, positive-bias, prioritized, stale-k, epochs, selective, dynamic, got "
     "'exgrpo'"),
    (["--rollouts-per-step", "8", "--buffer", "epochs", "--mini-batches", "2", "--epoch-shuffle", "true"],
     "--epoch-shuffle must be False in a trainer: TRL keeps one order per generation for its num_iterations passes "
     "(GRPOTrainer._prepare_inputs); run a reshuffled design in the simulator"),
    (["--rollouts-per-step", "8", "--batch-size", "8", "--buffer", "epochs", "--mini-batches", "2",
      "--save-every", "4"],
     "--batch-size must be --rollouts-per-step / --mini-batches = 8 / 2 = 4 (each update trains one mini-batch of "
     "the generation), got 8"),
    (["--rollouts-per-step", "8", "--capacity", "16", "--buffer", "epochs", "--save-every", "4"],
     "--capacity must equal --rollouts-per-step = 8 (an epoch design holds one generation), got 16"),
    (["--rollouts-per-step", "8", "--buffer", "epochs", "--mini-batches", "2", "--save-every", "6"],
     "--save-every must be a multiple of --epochs x --mini-batches = 4 with --buffer epochs (a checkpoint is saved "
     "at a generation's start: TRL keeps the generation in memory only), got 6"),
    (["--capacity", "16", "--batch-size", "8", "--rollouts-per-step", "8", "--buffer", "stale-k"],
     "--capacity must equal --rollouts-per-step = 8 with buffer stale-k (each update trains one whole generation, "
     "once, k updates late), got 16"),
    (["--rollouts-per-step", "8", "--buffer", "stale-k", "--stale-k", "41"],
     "--stale-k must be in [0, 40] (--steps = 40: the first k updates train the base model's generations), got 41"),
    (["--capacity", "16", "--batch-size", "8", "--rollouts-per-step", "8", "--steps", "0"],
     "--steps must be an integer >= 1, got 0"),
    (["--capacity", "16", "--batch-size", "8", "--rollouts-per-step", "8", "--model", "Qwen/Qwen2.5-0.5B"],
     "--model must be tiny or a local checkpoint directory, got 'Qwen/Qwen2.5-0.5B' (this machine reaches no "
     "model hub)"),
])
def test_trl_replay_bad_input_is_one_line_before_any_work(cli, tmp_path, args, message):
    out = tmp_path / "run"
    code, stdout, stderr = cli("trl-replay", "--out", str(out), *args)
    assert code == 2 and stdout == ""
    assert stderr.strip() == f"replay-theory: error: {message}"
    assert not out.exists()


def test_trl_replay_refuses_a_used_directory(cli, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "rollouts.parquet").write_text("x")
    code, _, stderr = cli("trl-replay", "--out", str(tmp_path / "run"), "--capacity", "16", "--batch-size", "8",
                          "--rollouts-per-step", "8")
    assert code == 2
    assert stderr == (f"replay-theory: error: --out {tmp_path / 'run'} is a non-empty directory that holds no "
                      "unfinished trl-replay run (no checkpoints/command.json); results go into a new or empty "
                      "directory, so they never mix with other files\n")
    assert (tmp_path / "run" / "rollouts.parquet").read_text() == "x"


@pytest.mark.slow
def test_trl_replay_command_runs_the_design_and_leaves_a_log(cli, tmp_path):
    # optimal --json -> trl-replay: N, B, R from the design file (N rounded to whole groups), TRL's real loop on the
    # warm-started tiny Qwen2, a diagnose log of B rows a step with the step times, run.json with the config.
    pytest.importorskip("trl")
    import pyarrow.parquet as pq

    code, design, _ = cli("optimal", "--objective", "paper", "--mu", "5.28", "-R", "8", "--json")
    assert code == 0
    (tmp_path / "design.json").write_text(design)
    out = tmp_path / "run"
    code, stdout, stderr = cli("trl-replay", "--design", str(tmp_path / "design.json"), "--out", str(out),
                               "--group-size", "4", "--steps", "4", "--sft-steps", "20", "--n-train", "64",
                               "--no-progress")
    assert code == 0, stderr
    summary = json.loads((out / "run.json").read_text())
    assert (summary["replay"]["capacity"], summary["replay"]["batch_size"],
            summary["replay"]["rollouts_per_step"]) == (20, 26, 8)  # N 19 -> 20, whole groups of 4
    assert summary["replay"]["notes"] == ["capacity 19 rounded to 20, a whole number of groups of 4"]
    assert (summary["generated"], summary["trained"]) == (4 * 8, 4 * 26)
    assert all(math.isfinite(h["loss"]) for h in summary["history"])
    assert 0 <= summary["reward_first_quarter"] <= 1 and summary["config"]["steps"] == 4
    table = pq.read_table(out / "rollouts.parquet")
    assert table.num_rows == 4 * 26
    assert set(np.asarray(table.column("step_generated_rows").to_pylist()).tolist()) == {8}
    assert f"next: replay-theory diagnose {out / 'rollouts.parquet'} --preset trl" in stdout
    hint = next(line for line in stdout.splitlines() if line.startswith("next: replay-theory diagnose"))
    code, report, err = cli(*hint[len("next: replay-theory "):].split(), "--no-progress")  # the hint, run as printed
    assert code == 0 and f" in {4 * 26} sequences;" in report, err  # it reads the run's 104 rows

    # the noise scale: per-step norms in noise_scale.jsonl, pooled into run.json and noise_profile.json; calibrate
    # --from-log --grad-norms reads the same file back to the same B_noise
    from replay_theory.diagnose.calibrate_log import noise_scale_record, read_grad_norms
    from replay_theory.theory.noise_scale import noise_scale_two_batch

    norms = read_grad_norms(out / "noise_scale.jsonl")
    assert norms["unit_size"] == 4 and set(norms["batch_big"]) == {26.0} and norms["step"].size >= 2
    record = summary["noise_scale"]
    assert record == noise_scale_record(norms, unit_size=4, seed=0, source=record["source"])
    # TRL's frac_reward_zero_std, averaged over the steps that logged it, is the profile's zero share
    logged = [h["frac_reward_zero_std"] for h in summary["history"] if "frac_reward_zero_std" in h]
    zero = summary["zero_share"]
    assert zero is None or zero["value"] == pytest.approx(sum(logged) / len(logged), rel=1e-12)
    # the drift: rollouts of steps 3, 2 and 0 re-scored at the last policy (T = 4: ages 1, 2 and 4), in the profile too
    from replay_theory.diagnose.calibrate_log import drift_record

    drift = summary["drift"]
    assert drift == {**drift_record(out / "drift.parquet", "trl"), "ages_without_rollouts": []}
    assert drift["staleness"] == [0, 1, 2, 4] and drift["m2"][0] == 0 and min(drift["m2"][1:]) > 0
    assert json.loads((out / "noise_profile.json").read_text()) == {"kind": "noise_scale", "noise_scale": record,
                                                                    **({"zero_share": zero} if zero else {}),
                                                                    "drift": drift}
    assert record["method"] == "two-batch" and record["batch"] == 26 and record["unit_size"] == 4
    if np.all(norms["batch_small"] == norms["batch_small"][0]):  # equal halves every step: the plain formula
        direct = noise_scale_two_batch(norms["grad_sq_small"], norms["grad_sq_big"], norms["batch_small"][0], 26)
        assert record["b_noise"] == (direct.b_noise if direct.grad_sq > 0 else None)
    assert "B_noise" in stdout and str(out / "noise_profile.json") in stdout or record["b_noise"] is None
    code, calibrated, err = cli("calibrate", "--from-log", str(out / "rollouts.parquet"), "--preset", "trl",
                                "--grad-norms", str(out / "noise_scale.jsonl"), "--mu", "5",
                                "--drift", str(out / "drift.parquet"), "--out", str(tmp_path / "profile.json"))
    assert code == 0, err
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["noise_scale"]["b_noise"] == record["b_noise"]
    assert (profile["drift"]["staleness"], profile["drift"]["m2"]) == (drift["staleness"], drift["m2"])
    assert f"drift M2(s) at ages 1, 2, 4: {', '.join(f'{m:.3g}' for m in drift['m2'][1:])}" in calibrated
    # without --drift the profile says how to measure it
    code, calibrated, err = cli("calibrate", "--from-log", str(out / "rollouts.parquet"), "--preset", "trl",
                                "--mu", "5", "--out", str(tmp_path / "bare.json"))
    assert code == 0, err
    assert "not measured: the drift M2(s) of older rollouts (--drift FILE: rollouts of steps T - 1" in calibrated
    # --drift naming a file that is not there: one line, exit 2, no profile written
    code, _, err = cli("calibrate", "--from-log", str(out / "rollouts.parquet"), "--preset", "trl", "--mu", "5",
                       "--drift", str(tmp_path / "none.parquet"), "--out", str(tmp_path / "x.json"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "none.parquet" in err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_trl_replay_same_seed_same_log(cli, tmp_path):
    # Same seed, same numbers: two runs write the same log, row for row, apart from the wall-clock columns.
    pytest.importorskip("trl")
    import pyarrow.parquet as pq

    tables = []
    for name in ("a", "b"):
        code, _, stderr = cli("trl-replay", "--capacity", "16", "--batch-size", "12", "--rollouts-per-step", "8",
                              "--group-size", "4", "--steps", "3", "--sft-steps", "10", "--n-train", "32",
                              "--out", str(tmp_path / name), "--no-progress")
        assert code == 0, stderr
        table = pq.read_table(tmp_path / name / "rollouts.parquet")
        tables.append(table.select([c for c in table.column_names if not c.endswith("_seconds")]))
    assert tables[0].num_rows == 3 * 12
    assert tables[0].equals(tables[1])

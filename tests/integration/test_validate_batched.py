"""Seeds as a batch axis (validate/batched.py) against the sequential loop, seed by seed; verify's --lr-grid.

Measured tolerance: 0. The seed-stacked model runs each seed's matmuls as one batch of a ``torch.bmm`` with the
shapes of the sequential ``F.linear``, every other op on rows that do not mix seeds, and every batch pads prompts
to the problem set's longest prompt (so a seed's arithmetic does not depend on the other seeds' prompts); the
parameters, log-probs, tokens, losses and held-out results below are equal bit for bit (``torch.equal``, ``==``).
"""

import copy
import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from replay_theory.validate import countdown  # noqa: E402
from replay_theory.validate.batched import SeedStreams, num_seeds, seed_state_dict, stack_policy  # noqa: E402
from replay_theory.validate.config import VerifyConfig, protocol  # noqa: E402
from replay_theory.validate.logprobs import encode_prompts, sequence_logprobs  # noqa: E402
from replay_theory.validate.policy import ModelConfig, load_policy  # noqa: E402
from replay_theory.validate.rl import RLConfig, evaluate_policies, evaluate_policy, train, train_loop  # noqa: E402

SMALL_MODEL = dict(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
SEEDS = [3, 104, 205]


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    train_set, test_set = countdown.make_splits(200, 12, seed=0, num_numbers=(3,), number_range=(1, 9),
                                                target_range=(1, 40))
    return load_policy(ModelConfig(seed=0, **SMALL_MODEL), countdown.ALPHABET), train_set, test_set


def _copy(policy):
    return dataclasses.replace(policy, model=copy.deepcopy(policy.model))


def test_seed_streams_draw_what_each_seeds_own_generator_draws():
    streams = SeedStreams(SEEDS)
    got = [streams.integers(0, 200, size=(3, 5)), streams.random((3, 4)), streams.integers(0, 7, size=(3, 3))]
    for s, seed in enumerate(SEEDS):
        rng = np.random.default_rng(seed)  # the sequential run's generator
        expected = [rng.integers(0, 200, size=(1, 5)), rng.random((1, 4)), rng.integers(0, 7, size=(1, 3))]
        assert all(np.array_equal(g[s], e[0]) for g, e in zip(got, expected))


def test_stacked_forward_and_gradient_equal_each_seeds_own_model(setup):
    base, train_set, _ = setup
    stacked = stack_policy(base, 3)
    assert num_seeds(stacked) == 3 and num_seeds(base) == 1
    with torch.no_grad():  # give every seed its own weights
        for i, p in enumerate(stacked.model.parameters()):
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(i)))
    plain = []
    for s in range(3):
        policy = _copy(base)
        policy.model.load_state_dict(seed_state_dict(stacked, s))
        plain.append(policy)
    g = torch.Generator().manual_seed(0)
    pieces = []
    for s in range(3):
        prompt_ids, prompt_mask = encode_prompts(base, [p.prompt_text() for p in train_set[4 * s:4 * s + 4]], 23)
        ids = torch.randint(3, 20, (4, 6), generator=g)
        mask = (torch.arange(6) < torch.randint(1, 7, (4, 1), generator=g)).long()  # (4, 6) right-padded
        ids = torch.where(mask.bool(), ids, base.tokenizer.pad_token_id)
        pieces.append((prompt_ids, prompt_mask, ids, mask, torch.randn(4, 6, generator=g)))
    cat = [torch.cat([piece[k] for piece in pieces]) for k in range(5)]
    logp = sequence_logprobs(stacked, *cat[:4])  # (3 x 4, 6), seed-major rows
    (cat[4] * logp).sum().backward()
    grads = {name: p.grad for name, p in stacked.model.named_parameters()}
    for s, (policy, piece) in enumerate(zip(plain, pieces)):
        own = sequence_logprobs(policy, *piece[:4])
        (piece[4] * own).sum().backward()
        assert torch.equal(own, logp[4 * s:4 * s + 4])
        for name, p in policy.model.named_parameters():
            assert torch.equal(p.grad, grads[name][s]), name  # padding rows pass no gradient, as nn.Embedding's


@pytest.mark.parametrize("design", [
    dict(buffer="fifo", batch_size=8, capacity=32),
    dict(buffer="fifo", batch_size=16, capacity=16, micro_batch_size=4),
    dict(buffer="group-replay", loss="rloo", batch_size=8, replay_ratio_groups=1.0, max_age=2, clip_c=3.0),
])
def test_batched_training_equals_the_sequential_loop_seed_by_seed(setup, design):
    base, train_set, test_set = setup
    config = RLConfig(steps=4, rollouts_per_step=8, group_size=4, lr=1e-3, max_new_tokens=8, **design)
    sequential = []
    for seed in SEEDS:
        policy = _copy(base)
        sequential.append((policy, train(policy, train_set, dataclasses.replace(config, seed=seed), mu=2.0)))
    stacked = stack_policy(base, len(SEEDS))
    results = train_loop(stacked, train_set, config, SEEDS, mu=2.0)
    evaluations = evaluate_policies(stacked, test_set, 4, 1.0, 8, [11, 12, 13])
    for s, (policy, result) in enumerate(sequential):
        weights = seed_state_dict(stacked, s)
        assert all(torch.equal(v, weights[k]) for k, v in policy.model.state_dict().items())
        assert results[s].metrics == result.metrics  # rewards, losses, ESS, log-ratios: every logged number
        assert (results[s].compute, results[s].k_inference) == (result.compute, result.k_inference)
        assert evaluations[s] == evaluate_policy(policy, test_set, 4, 1.0, 8, seed=11 + s)
    assert results[0].metrics != results[1].metrics  # the seeds are different runs


def test_an_interrupted_batched_run_resumes_exactly(setup, tmp_path):
    base, train_set, _ = setup
    config = RLConfig(steps=4, rollouts_per_step=8, group_size=4, batch_size=8, capacity=16, lr=1e-3,
                      max_new_tokens=8)
    whole = stack_policy(base, 2)
    expected = train_loop(whole, train_set, config, SEEDS[:2], mu=2.0)

    def stop(step, metrics):
        if step == 2:
            raise KeyboardInterrupt  # after the checkpoint of step 2

    checkpoint = tmp_path / "run.ckpt"
    with pytest.raises(KeyboardInterrupt):
        train_loop(stack_policy(base, 2), train_set, config, SEEDS[:2], progress=stop, checkpoint=checkpoint,
                   checkpoint_every=2, mu=2.0)
    resumed = stack_policy(base, 2)
    got = train_loop(resumed, train_set, config, SEEDS[:2], checkpoint=checkpoint, checkpoint_every=2, mu=2.0)
    assert [r.metrics for r in got] == [r.metrics for r in expected]
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.state_dict().values(),
                                                  whole.model.state_dict().values()))
    with pytest.raises(ValueError, match="different run configuration"):
        train_loop(stack_policy(base, 2), train_set, config, [SEEDS[0], 7], checkpoint=checkpoint, mu=2.0)


def test_lr_grid_values_and_checks():
    assert VerifyConfig(lr_grid="auto").learning_rates(3e-4) == (1.5e-4, 3e-4, 6e-4)
    assert VerifyConfig(lr_grid="6e-4, 1.5e-4,3e-4").learning_rates(1.0) == (1.5e-4, 3e-4, 6e-4)  # sorted
    assert VerifyConfig().learning_rates(3e-4) == (3e-4,)
    assert protocol(4, 48, True).lr_grid == "auto" and protocol(4, 48, True, lr_grid="1,2,4").lr_grid == "1,2,4"
    for bad in ("1e-3,1e-3,2e-3", "0,1e-3,2e-3", "-1e-3,1e-3,2e-3", "1e-3,2e-3", "a,b,c", "nan,1,2"):
        with pytest.raises(ValueError, match="--lr-grid must be"):
            VerifyConfig(lr_grid=bad).validated()


@pytest.mark.parametrize("grid", ["1e-3,1e-3,2e-3", "0,1e-3,2e-3", "1e-3,2e-3"])
def test_bad_lr_grid_is_one_line_before_any_work(error_line, tmp_path, grid):
    out = tmp_path / "run"
    line = error_line("validate", "verify", "--out", str(out), "--lr-grid", grid)
    assert line.startswith("--lr-grid must be >= 3 distinct finite numbers > 0") and not out.exists()
    line = error_line("validate", "all", "--out", str(out), "--thorough", "--lr-grid", grid)
    assert line.startswith("--lr-grid must be") and not out.exists()


def test_each_design_is_reported_at_its_best_learning_rate():
    from replay_theory.core.designs import DesignConfig
    from replay_theory.validate.families import NamedDesign
    from replay_theory.validate.report import best_lr_row

    design = NamedDesign("on-policy", True, DesignConfig(buffer="on-policy", capacity=8, batch_size=8,
                                                         rollouts_per_step=8, group_size=4))

    def records(rewards):
        return [{"held_out": {"mean_reward": r, "pass@1": r}, "steps": 3, "compute": 1.0} for r in rewards]

    lrs = (1e-4, 2e-4, 4e-4)
    table = {("on-policy", 1e-4): records([0.1, 0.3]), ("on-policy", 2e-4): records([0.4, 0.6]),
             ("on-policy", 4e-4): records([0.5, 0.3])}
    row = best_lr_row(design, lrs, table, 2, 0.2, 0.0)
    assert row["lr"] == 2e-4 and row["lr_edge"] is False and row["final_reward_mean"] == pytest.approx(0.5)
    assert [c["final_reward_mean"] for c in row["lr_sweep"]] == pytest.approx([0.2, 0.5, 0.4])
    table[("on-policy", 4e-4)] = records([0.9, 0.7])
    row = best_lr_row(design, lrs, table, 2, 0.2, 0.0)
    assert row["lr"] == 4e-4 and row["lr_edge"] is True  # the best is the grid's end

"""Generation in a worker process beside the update (validate/overlap.py, train(..., generation_threads=1)): the
same numbers as the sequential one-step-off run, bit for bit, through an interruption and a resume."""

import copy
import multiprocessing

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from replay_theory.validate import countdown  # noqa: E402
from replay_theory.validate.config import TINY_MODEL, ValidateConfig  # noqa: E402
from replay_theory.validate.policy import ModelConfig, load_policy  # noqa: E402
from replay_theory.validate.rl import RLConfig, train  # noqa: E402

# R = B = 64: an update long enough for the worker to generate while the trainer writes its weights (a worker that
# read the trainer's live parameters instead of its own copy differed from the sequential run here, not at R = 16)
DESIGN = dict(rollouts_per_step=64, batch_size=64, group_size=8, loss="grpo", lr=3e-4, max_new_tokens=16,
              buffer="stale-k", stale_k=1)


@pytest.fixture(scope="module")
def setting():
    train_set, _ = ValidateConfig().problems()
    return load_policy(ModelConfig(device="cpu", seed=0, **TINY_MODEL), countdown.ALPHABET), train_set


def _same_metrics(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(x[k] == y[k] or (x[k] != x[k] and y[k] != y[k]) for k in x)  # NaN == NaN
        for x, y in zip(a, b))


def test_the_worker_gives_the_sequential_runs_numbers_bit_for_bit(setting):
    policy, train_set = setting
    config = RLConfig(steps=3, **DESIGN)
    plain, overlapped = copy.deepcopy(policy), copy.deepcopy(policy)
    a = train(plain, train_set, config, mu=2.0)
    b = train(overlapped, train_set, config, mu=2.0, generation_threads=1)
    assert _same_metrics(a.metrics, b.metrics)
    assert any(m["log_ratio_abs_max"] > 0 for m in a.metrics[1:])  # a moving policy: stale log-ratios to reproduce
    assert all(torch.equal(x, y) for x, y in zip(plain.model.parameters(), overlapped.model.parameters()))
    # 3 updates of 64 plus the pre-filled batch: 4 x 64 generated, compute mu x 256 + 3 x 64
    assert (b.k_inference, b.k_training, b.compute) == (a.k_inference, a.k_training, a.compute) == (256, 192, 704.0)
    assert b.wall_seconds >= b.update_seconds > 0 and b.generation_seconds > 0


def test_an_interrupted_overlapped_run_resumes_to_the_same_numbers(setting, tmp_path):
    policy, train_set = setting
    config = RLConfig(steps=4, **DESIGN)
    straight = train(copy.deepcopy(policy), train_set, config, mu=2.0)
    resumed = copy.deepcopy(policy)

    def stop_after_step_1(step, metrics):
        if step == 1:
            raise KeyboardInterrupt

    checkpoint = tmp_path / "state.pt"
    with pytest.raises(KeyboardInterrupt):  # step 0's checkpoint is written; step 1 is interrupted before its own
        train(resumed, train_set, config, progress=stop_after_step_1, checkpoint=checkpoint, checkpoint_every=1,
              mu=2.0, generation_threads=1)
    result = train(resumed, train_set, config, checkpoint=checkpoint, checkpoint_every=1, mu=2.0,
                   generation_threads=1)
    assert _same_metrics(straight.metrics, result.metrics)  # step 0 from the checkpoint, steps 1-3 in a new worker
    assert result.compute == straight.compute


@pytest.mark.parametrize("change,message", [
    (dict(buffer="fifo", capacity=128), "needs a stale-k design with stale_k >= 1"),
    (dict(stale_k=0), "needs a stale-k design with stale_k >= 1"),
    (dict(sync_every=2), "sync_every = 2"),
])
def test_what_cannot_overlap_is_one_line_before_any_work(setting, change, message):
    policy, train_set = setting
    with pytest.raises(ValueError, match=message):
        train(policy, train_set, RLConfig(steps=2, **{**DESIGN, **change}), generation_threads=1)
    with pytest.raises(ValueError, match=r"generation_threads must be an integer >= 0"):
        train(policy, train_set, RLConfig(steps=2, **DESIGN), generation_threads=-1)
    # refused before a worker process was started (other tests' process pools may still be alive: not ours)
    assert [p for p in multiprocessing.active_children() if p.name == "generation"] == []

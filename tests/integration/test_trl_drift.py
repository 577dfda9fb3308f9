"""The TRL trainer's drift log: rollouts of past steps re-scored at the last policy, and the profile it makes.

Checks, on a tiny Qwen2 trained through TRL's real GRPOTrainer on CPU: each kept rollout's log-probs at generation are
those of the policy of its step (a snapshot taken when the step began), its re-scored log-probs are one independent
forward pass at the last policy, its age is T - v at the ages ``theory.forgetting.drift_ages`` names; ``calibrate
--from-log --drift`` reads M2(s) as the token mean of the squared log-ratio, computed here by hand; ``optimal
--profile`` prices staleness at 1 + M2(s), the benchmark's own function (``theory_bench.inputs.drift_staleness``).
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from tiny_lm import char_tokenizer, tiny_qwen2  # noqa: E402 (tests/helpers; needs torch)

from replay_theory.integrations.buffer import ReplayConfig  # noqa: E402
from replay_theory.integrations.trl_drift import DriftProbe  # noqa: E402
from replay_theory.theory.forgetting import drift_ages, staleness_of_drift  # noqa: E402

STEPS, R, G = 6, 4, 2


def _reward(completions, **kwargs):
    return [c.count("a") / max(len(c), 1) for c in completions]


def _logps(model, rows, trainer=None):
    """Per-token log-probs of the rows' completions: by hand (one forward pass, log-softmax of the logits), or with
    ``trainer`` through TRL's own scoring (its fused LM head, which agrees with the hand's to within 1% here)."""
    ids = torch.cat([rows["prompt_ids"], rows["completion_ids"]], dim=1)
    attention = torch.cat([rows["prompt_mask"], rows["completion_mask"]], dim=1)
    width = rows["completion_ids"].shape[1]
    with torch.no_grad():
        if trainer is not None:
            return trainer._get_per_token_logps_and_entropies(model, ids, attention, width)[0].double()
        logits = model(input_ids=ids, attention_mask=attention).logits[:, -width - 1:-1]  # (n, L, V)
    return torch.log_softmax(logits.double(), dim=-1).gather(-1, rows["completion_ids"][..., None])[..., 0]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from datasets import Dataset
    from transformers import TrainerCallback

    from replay_theory.integrations.trl import ReplayGRPOTrainer, replay_grpo_args

    tmp = tmp_path_factory.mktemp("drift")
    snapshots = {}

    class Snapshot(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            snapshots[state.global_step] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    tokenizer = char_tokenizer()
    model = tiny_qwen2(tokenizer, torch.float32)
    replay = ReplayConfig(capacity=R, batch_size=R, rollouts_per_step=R)  # on-policy: every row trained at age 0
    args = replay_grpo_args(replay, G, output_dir=str(tmp / "out"), max_completion_length=6, max_steps=STEPS,
                            learning_rate=5e-2, logging_steps=1, report_to="none", use_cpu=True, save_strategy="no",
                            seed=0)
    dataset = Dataset.from_dict({"prompt": ["abc", "bcd", "cde", "def", "efg", "fgh", "ab", "gh"] * 4})
    trainer = ReplayGRPOTrainer(model=model, reward_funcs=_reward, args=args, train_dataset=dataset,
                                processing_class=tokenizer, replay=replay, drift_log=tmp / "drift.parquet",
                                drift_samples=3, callbacks=[Snapshot()])
    trainer.train()
    return trainer, snapshots, tmp / "drift.parquet", tokenizer


@pytest.mark.slow
def test_drift_log_rows_are_the_step_policies_rescored_at_the_last(run):
    import pyarrow.parquet as pq

    trainer, snapshots, path, tokenizer = run
    assert drift_ages(STEPS) == [0, 1, 2, 4, 6]  # 6 = T: the first generation's rollouts
    assert trainer.drift_report == {"ages": [1, 2, 4, 6], "missing": [], "rows": 4 * 3}
    t = pq.read_table(path).to_pydict()
    age, version = np.asarray(t["age"]), np.asarray(t["policy_version"])
    assert age.tolist() == [1] * 3 + [2] * 3 + [4] * 3 + [6] * 3 and (version == STEPS - age).all()
    assert np.asarray(t["step"]).tolist() == [STEPS] * 12
    last = tiny_qwen2(tokenizer, torch.float32)
    last.load_state_dict(trainer.model.state_dict())
    final = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    k = 0
    for s in (1, 2, 4, 6):
        rows = trainer.drift_probe.rows[STEPS - s]
        mask = rows["completion_mask"].bool()
        now = _logps(trainer.model, rows, trainer)
        trainer.model.load_state_dict(snapshots[STEPS - s])  # the policy that generated them (TRL's patched model)
        then = _logps(trainer.model, rows, trainer)
        trainer.model.load_state_dict(final)
        by_hand = _logps(last, rows)
        for i in range(3):
            n = int(mask[i].sum())
            logged_old = np.asarray(t["old_per_token_logps"][k])[:n]
            logged_new = np.asarray(t["per_token_logps"][k])[:n]
            np.testing.assert_allclose(logged_old, then[i, :n].numpy(), atol=1e-6)  # step T - s's policy: age s
            np.testing.assert_allclose(logged_new, now[i, :n].numpy(), atol=1e-6)  # the last policy's
            np.testing.assert_allclose(logged_new, by_hand[i, :n].numpy(), rtol=1e-2, atol=1e-2)
            assert t["sampling_per_token_logps"][k] == t["old_per_token_logps"][k]
            k += 1
    # the policy moved: a rollout of the first step is priced at a cost above 1
    assert not np.allclose(t["old_per_token_logps"][-1], t["per_token_logps"][-1])


@pytest.mark.slow
def test_calibrate_drift_is_the_token_mean_squared_log_ratio_and_optimal_prices_it(run, tmp_path):
    import pyarrow.parquet as pq

    from replay_theory.advise.optimal import _staleness_of
    from replay_theory.advise.profile_files import load_profile
    from replay_theory.diagnose.calibrate_log import drift_record
    from replay_theory.experiments.theory_bench.inputs import drift_staleness

    _, _, path, _ = run
    t = pq.read_table(path).to_pydict()
    by_age = {}
    for a, new, old, mask in zip(t["age"], t["per_token_logps"], t["old_per_token_logps"], t["completion_mask"]):
        keep = np.asarray(mask, dtype=bool)
        by_age.setdefault(a, []).extend(((np.asarray(new) - np.asarray(old))[keep] ** 2).tolist())
    record = drift_record(path, "trl")
    assert record["staleness"] == [0, 1, 2, 4, 6]
    np.testing.assert_allclose(record["m2"], [0.0] + [np.mean(by_age[a]) for a in (1, 2, 4, 6)], rtol=1e-12)
    assert record["tokens"] == [0] + [len(by_age[a]) for a in (1, 2, 4, 6)]
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"kind": "noise_scale", "noise_scale": {"b_noise": 100.0, "batch": 4},
                                   "drift": record}))
    priced = _staleness_of(load_profile(profile))
    np.testing.assert_allclose(priced.ratio, 1 + np.asarray(record["m2"]), rtol=1e-15)
    # the benchmark's printed answer reads the same table the same way (a run too short for a pilot: the log's)
    bench = drift_staleness({"recipe_log": {"drift": {"staleness": record["staleness"], "m2": record["m2"]}}},
                            piloted=False)
    assert (bench.ages, bench.ratio) == (priced.ages, priced.ratio)


def test_probe_keeps_the_tables_steps_and_the_first(tmp_path):
    probe = DriftProbe(tmp_path / "d.parquet", samples=2)
    for v in range(101):
        probe.keep(v, {"completion_ids": torch.full((4, 3), v), "completion_mask": torch.ones(4, 3),
                       "advantages": torch.arange(4.0)})
    assert sorted(probe.rows) == [0, *range(36, 101)]  # 64 back from the last generation, and the first
    assert probe.rows[50]["completion_ids"].shape == (2, 3) and (probe.rows[50]["completion_ids"] == 50).all()
    assert probe.plan(100) == ([1, 2, 4, 8, 16, 32, 64, 100], [])
    del probe.rows[96]  # a step that only replayed
    assert probe.plan(100) == ([1, 2, 8, 16, 32, 64, 100], [4])
    probe.save_state(tmp_path / "state.npz")
    again = DriftProbe(tmp_path / "d.parquet", samples=2)
    again.load_state(tmp_path / "state.npz")
    assert sorted(again.rows) == sorted(probe.rows)
    assert all(torch.equal(again.rows[v][k], probe.rows[v][k]) for v in probe.rows for k in probe.rows[v])


@pytest.mark.parametrize("kwargs, message", [
    (dict(samples=0), "drift_samples must be an integer >= 1, got 0"),
    (dict(samples=2.5), "drift_samples must be an integer >= 1, got 2.5"),
])
def test_probe_bad_input(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        DriftProbe(tmp_path / "d.parquet", **kwargs)


def test_probe_never_overwrites(tmp_path):
    (tmp_path / "d.parquet").write_text("x")
    with pytest.raises(ValueError, match="exists: a log is never overwritten"):
        DriftProbe(tmp_path / "d.parquet")


def test_staleness_of_drift_by_hand():
    cost = staleness_of_drift([0, 1, 2, 4], [0.0, 0.01, 0.03, 0.1], "hand")
    assert cost.ratio == (1.0, 1.01, 1.03, 1.1)
    assert cost.mean(4) == pytest.approx((1.0 + 1.01 + 1.03 + (1.03 + 1.1) / 2) / 4)  # age 3 interpolated
    assert staleness_of_drift([0], [0.0], "one age").flat
    with pytest.raises(ValueError, match="starting at age 0"):
        staleness_of_drift([1, 2], [0.1, 0.2], "x")
    with pytest.raises(ValueError, match="finite numbers >= 0"):
        staleness_of_drift([0, 1], [0.0, -0.1], "x")

"""kappa in the TRL replay trainer (issue 30): the logged curvature pairs and lag-1 products against a recomputation
from the saved parameters, rows and AdamW state, and training unchanged by the measurement.

TRL's real GRPOTrainer loop on a tiny Qwen2 in float64 (tests/helpers/tiny_lm.py, as the TRL integration tests;
float64 because TRL's fused float32 log-prob kernel would leave 1e-3 of round-off in a central difference).
Slow: TRL."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from tiny_lm import char_tokenizer, tiny_qwen2  # noqa: E402 (tests/helpers; needs torch)

from replay_theory.integrations.buffer import ReplayConfig  # noqa: E402

STEPS, N, B, R, G = 4, 8, 8, 4, 2  # R < B: every step trains on rows of earlier steps too (replay)




def _reward(completions, **kwargs):
    return [c.count("a") / max(len(c), 1) for c in completions]


def _trainer_cls(seen: dict | None):
    """ReplayGRPOTrainer with float64 log-probs (a plain log_softmax) that records, per step, the parameters, the
    drawn rows and AdamW's state before the update (compute_loss) and the step's fresh rows (fresh_rows)."""
    from replay_theory.integrations.trl import ReplayGRPOTrainer

    class Recording(ReplayGRPOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if seen is not None and model.training and "version" in inputs:
                optimizer = getattr(self.optimizer, "optimizer", self.optimizer)
                state = {id(p): {k: (v.clone() if torch.is_tensor(v) else v) for k, v in optimizer.state[p].items()}
                         for p in model.parameters() if p in optimizer.state}
                seen.setdefault(self.state.global_step, {}).update(
                    params={k: v.detach().clone() for k, v in model.named_parameters()},
                    inputs={k: v.clone() for k, v in inputs.items()}, adam=state,
                    lr=float(optimizer.param_groups[0]["lr"]))
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

        def fresh_rows(self, output):
            rows = super().fresh_rows(output)
            if seen is not None:
                seen.setdefault(self.state.global_step, {})["fresh"] = {k: v.clone() for k, v in rows.items()}
            return rows

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                               batch_size=None, compute_entropy=False, **_):
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -logits_to_keep - 1:-1]
            logp_all = torch.log_softmax(logits, dim=-1)
            logp = logp_all.gather(-1, input_ids[:, -logits_to_keep:, None])[..., 0]
            entropy = -(logp_all.exp() * logp_all).sum(-1) if compute_entropy else None
            return logp, entropy, None

    return Recording


def _train(output_dir, steps: int, seen: dict | None = None, **trainer_kwargs):
    from datasets import Dataset

    from replay_theory.integrations.trl import replay_grpo_args

    tokenizer = char_tokenizer()
    model = tiny_qwen2(tokenizer, torch.float64)
    dataset = Dataset.from_dict({"prompt": ["abc", "bcd", "cde", "def", "efg", "fgh", "ab", "gh"] * 4})
    replay = ReplayConfig(capacity=N, batch_size=B, rollouts_per_step=R)
    args = replay_grpo_args(replay, G, output_dir=str(output_dir), max_completion_length=6, max_steps=steps,
                            learning_rate=1e-2, logging_steps=1, report_to="none", use_cpu=True, save_strategy="no",
                            seed=0)
    trainer = _trainer_cls(seen)(model=model, reward_funcs=_reward, args=args, train_dataset=dataset,
                                 processing_class=tokenizer, replay=replay, **trainer_kwargs)
    trainer.train()
    return trainer, replay


def _grad(trainer, replay, params: dict, rows: dict, which=None, reweighted: bool = False) -> list:
    """The gradient of the shared loss of ``rows`` (``which`` of them) with the model's parameters set to ``params``,
    the log-probs as the trainer forms them; with ``reweighted`` the on-policy loss (behaviour = current log-probs)
    times each row's ratio to its old log-probs. One tensor per trainable parameter."""
    from replay_theory.integrations.loss import shared_loss_tensor

    model = trainer.model
    model.load_state_dict(params, strict=False)
    model.train()
    which = torch.arange(rows["completion_ids"].shape[0]) if which is None else which
    ids = torch.cat([rows["prompt_ids"], rows["completion_ids"]], dim=1)[which]
    attention = torch.cat([rows["prompt_mask"], rows["completion_mask"]], dim=1)[which]
    logp = trainer._get_per_token_logps_and_entropies(model, ids, attention, rows["completion_ids"].size(1))[0]
    mask = (rows["completion_mask"][which] * rows["tool_mask"][which]).bool()
    if reweighted:
        current = logp.detach()
        rho = torch.exp(torch.where(mask, current - rows["old_per_token_logps"][which], 0.0).sum(dim=1))
        loss = shared_loss_tensor(replay, logp, current, rows["advantages"][which], mask, row_weight=rho)[0]
    else:
        loss = shared_loss_tensor(replay, logp, rows["old_per_token_logps"][which], rows["advantages"][which],
                                  mask)[0]
    return list(torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad], allow_unused=True))


@pytest.mark.slow
def test_trl_curvature_pairs_and_lag_products_equal_a_recomputation(tmp_path):
    """Each logged pair by hand from the saved state: xi = g_hat_1 - g_hat_2 (the halves' own losses), D of the step's
    AdamW update (beta2 exp_avg_sq + (1 - beta2) g^2, g clipped to norm 1 as Trainer clips it, bias-corrected, eps),
    den = xi^T D xi (relative 1e-6: the trainer keeps xi in float32); the numerator's central difference of the next
    step's fresh rows' score-reweighted gradient at that step's parameters (1e-3, below); eta the step's lr. The
    lag-1 products: the full-batch gradients through the trainer's subset (1e-9)."""
    pytest.importorskip("trl")
    from replay_theory.integrations.trl import CURVATURE_FD_STEP, noise_halves

    seen: dict = {}
    noise_log = tmp_path / "noise_scale.jsonl"
    trainer, replay = _train(tmp_path / "out", STEPS, seen, noise_log=noise_log, curvature_every=1, lag_coords=64)
    records = {r["step"]: r for r in trainer.noise_records}
    pairs = [r for r in records.values() if "curvature_num" in r]
    assert [r["step"] for r in pairs] == [0, 1, 2] and trainer.curvature_skipped == {}  # step 3: no next step
    lines = [json.loads(line) for line in noise_log.read_text().splitlines()]
    assert [line.get("curvature_num") for line in lines] == [r.get("curvature_num") for r in trainer.noise_records]
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    full = {t: _grad(trainer, replay, seen[t]["params"], seen[t]["inputs"]) for t in range(STEPS)}
    assert any(float(g.abs().sum()) > 0 for g in full[0] if g is not None)
    for record in pairs:
        t = record["step"]
        halves = noise_halves(seen[t]["inputs"]["group_id"])
        g1, g2 = (_grad(trainer, replay, seen[t]["params"], seen[t]["inputs"], h) for h in halves)
        w, den = [], 0.0
        norm = float(torch.sqrt(sum((g ** 2).sum() for g in full[t] if g is not None)))
        clip = min(1.0, 1.0 / (norm + 1e-6))  # Trainer's max_grad_norm = 1.0 clips before AdamW's v
        for p, a, b, g in zip(params, g1, g2, full[t]):
            state = seen[t]["adam"].get(id(p), {})
            count = float(state.get("step", 0.0)) + 1  # this step's update: AdamW's v with this step's gradient
            v = 0.999 * state.get("exp_avg_sq", torch.zeros_like(g)) + 0.001 * (clip * g) ** 2
            d = 1.0 / ((v / (1 - 0.999 ** count)).sqrt() + 1e-8)
            w.append((d * (a - b)).float().double())  # the trainer keeps w in float32
            den += float(((a - b) * d * (a - b)).sum())
        assert record["curvature_den"] == pytest.approx(den, rel=1e-6)  # float32 xi in the trainer
        assert record["curvature_lr"] == seen[t]["lr"] and record["curvature_beta1"] == 0.9
        assert record["curvature_hvp_step"] == t + 1 and record["curvature_hvp_rows"] == R
        theta = seen[t + 1]["params"]
        theta_norm = float(torch.sqrt(sum((theta[n] ** 2).sum() for n in names)))
        h = CURVATURE_FD_STEP * theta_norm / float(torch.sqrt(sum((x ** 2).sum() for x in w)))
        sides = []
        for sign in (1.0, -1.0):
            shifted = {**theta, **{n: theta[n] + sign * h * x for n, x in zip(names, w)}}
            grads = _grad(trainer, replay, shifted, seen[t + 1]["fresh"], reweighted=True)
            sides.append(sum(float((g * x).sum()) for g, x in zip(grads, w) if g is not None))
        # 1e-3: w = D xi is ill-conditioned where this step's gradient nearly vanishes (D ~ 1 / (|g| + eps), up to 1e8
        # here): the halves' gradients formed in another order (each half's own loss, not g_1 and g - g_1) move such a
        # coordinate of w by up to 1e-3, the numerator by ~1e-4 (with the trainer's own w it agrees to 1e-15)
        assert record["curvature_num"] == pytest.approx((sides[0] - sides[1]) / (2 * h), rel=1e-3, abs=1e-12)
    assert any(abs(r["curvature_num"]) > 0 for r in pairs)  # a step whose fresh rows had a reward to climb
    # the lag-1 products: full-batch gradients (the loss on all B rows) through the fixed subset, scaled by P / k
    with_lag = [r for r in records.values() if "lag1_dot_raw" in r]
    assert [r["step"] for r in with_lag] == [1, 2, 3] and all(r["lag1_coords"] == 64 for r in with_lag)
    total = sum(p.numel() for p in params)
    vectors = {t: torch.cat([full[t][i].reshape(-1)[idx] for i, idx in trainer._lag_index]) for t in range(STEPS)}
    for record in with_lag:
        t = record["step"]
        assert record["lag1_dot_raw"] == pytest.approx(total / 64 * float(vectors[t] @ vectors[t - 1]), rel=1e-9)
        assert record["lag1_sq_raw"] == pytest.approx(total / 64 * float(vectors[t - 1] @ vectors[t - 1]), rel=1e-9)


@pytest.mark.slow
def test_trl_curvature_pairs_do_not_change_training(tmp_path):
    """The extra passes touch neither the parameters the update sees (restored bit for bit), nor .grad, nor the
    optimizer, nor the random streams: the same parameters, bit for bit, with and without them."""
    pytest.importorskip("trl")
    measured, _ = _train(tmp_path / "on", STEPS, curvature_every=1, lag_coords=64)
    plain, _ = _train(tmp_path / "off", STEPS, curvature_every=0, lag_coords=0)
    assert sum("curvature_num" in r for r in measured.noise_records) == STEPS - 1  # the last has no next step
    assert not any("curvature_num" in r or "lag1_dot_raw" in r for r in plain.noise_records)
    for (name, p), q in zip(measured.model.named_parameters(), plain.model.parameters()):
        assert torch.equal(p, q), name
    assert [r["grad_sq_big"] for r in measured.noise_records] == [r["grad_sq_big"] for r in plain.noise_records]


@pytest.mark.slow  # imports TRL
@pytest.mark.parametrize("kwargs, message", [
    ({"curvature_every": -1}, r"^curvature_every must be an integer >= 0 \(0: off\), got -1$"),
    ({"curvature_every": 2.5}, r"^curvature_every must be an integer >= 0"),
    ({"lag_coords": -3}, r"^lag_coords must be an integer >= 0 \(0: off\), got -3$"),
    ({"curvature_every": 5, "measure_noise": False}, r"^curvature_every > 0 needs measure_noise=True"),
    ({"curvature_step": 0.0}, r"^curvature_step must be in \(0, 1\)"),
])
def test_bad_curvature_options_are_one_line_before_any_work(kwargs, message):
    pytest.importorskip("trl")
    from replay_theory.integrations.trl import ReplayGRPOTrainer

    with pytest.raises(ValueError, match=message) as info:
        ReplayGRPOTrainer(replay=ReplayConfig(capacity=N, batch_size=B, rollouts_per_step=R), **kwargs)
    assert "\n" not in str(info.value)


def test_trl_replay_curvature_every_is_checked_first(error_line, tmp_path):
    by_hand = ["--capacity", "16", "--batch-size", "12", "--rollouts-per-step", "8", "--group-size", "4"]
    out = tmp_path / "run"
    assert error_line("trl-replay", "--out", str(out), "--cache-dir", str(tmp_path / "cache"), *by_hand,
                      "--curvature-every", "-1") == "--curvature-every must be an integer >= 0, got -1"
    assert not out.exists() and not (tmp_path / "cache").exists()


@pytest.mark.slow  # imports TRL
def test_trl_replay_default_is_the_trainers():
    pytest.importorskip("trl")
    from replay_theory.integrations.trl import DEFAULT_CURVATURE_EVERY
    from replay_theory.validate.trl_run import TrlRunConfig

    assert TrlRunConfig().curvature_every == DEFAULT_CURVATURE_EVERY


@pytest.mark.slow
def test_trl_replay_prints_and_writes_kappa(cli, tmp_path):
    """A 6-step run (200 warm-start steps, so that rewards vary) with a pair due every step: kappa on the summary's
    B_noise line and in run.json, pooled as calibrate --from-log pools the pairs of noise_scale.jsonl; a due pair
    whose halves' gradients are equal (no reward variation) is skipped and counted."""
    pytest.importorskip("trl")
    from replay_theory.diagnose.calibrate_log import memory_record, read_grad_norms

    out = tmp_path / "run"
    code, stdout, err = cli("trl-replay", "--out", str(out), "--capacity", "16", "--batch-size", "12",
                            "--rollouts-per-step", "8", "--group-size", "4", "--steps", "6", "--sft-steps", "200",
                            "--n-train", "64", "--no-progress", "--cache-dir", str(tmp_path / "cache"),
                            "--curvature-every", "1")
    assert code == 0, err
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["curvature_every"] == 1  # the run's config records it
    lines = [json.loads(line) for line in (out / "noise_scale.jsonl").read_text().splitlines()]
    pairs = sum("curvature_num" in line for line in lines)
    assert pairs >= 2 and pairs + sum(run["curvature_skipped"].values()) == 5  # step 5 has no next step
    memory = run["memory"]
    assert memory["units"] + memory["pairs_without_noise"] == pairs
    b_line = next(line for line in stdout.splitlines() if line.startswith("B_noise"))
    assert (f"kappa = {memory['kappa']:.3g} (90% interval" in b_line if memory["kappa"] is not None
            else "kappa not measured: " in b_line)
    again = memory_record(read_grad_norms(out / "noise_scale.jsonl"), seed=0, source=memory["source"])
    assert json.loads(json.dumps(again)) == memory

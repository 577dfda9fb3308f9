"""ReplayGRPOTrainer with ``use_vllm=True`` and TRL's vLLM importance-sampling correction, on TRL's real trainer.

No vLLM can run on this CPU machine: TRL's ``VLLMGeneration`` (trl/generation/vllm_generation.py) is replaced by a
fake with the same ``generate`` / ``sync_weights`` interface. It samples completions with a seeded torch.Generator
and returns as the "sampler's" log-probs the trainer model's own log-probs of those tokens plus seeded Gaussian noise
(sd ``NOISE``): a known engine mismatch. Everything else is TRL 1.16's code: it computes pi_old
(``old_per_token_logps``) and the ratio pi_old / pi_vllm with its mode and cap (grpo_trainer.py:2660-2707).

Checked against numpy by hand, for each of TRL's four modes with a cap (and a lower bound):
- the stored engine ratio rho of every row = the mode's formula on the row's pi_old and pi_vllm;
- the composed gradient of every trained row (fresh and replayed) d loss / d logp_it =
  -(1/T) rho_it r_it A_i [not clipped], r = pi_theta / pi_old, and the loss value -(1/T) sum rho min(rA, clip(r)A);
- TRL's own ``_compute_loss`` (loss_type bnpo = token mean, the same eps) on the same rows at the same parameters
  gives the same value and parameter gradient (a fresh row's result is TRL's; a replayed row's is TRL's formula
  with the row's stored pi_old and rho);
and that training runs (finite loss, parameters moved). The tiny-model builder repeats
tests/integration/test_integrations_trl.py's (pytest's importlib mode does not let test modules import each other).
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from tiny_lm import char_tokenizer, tiny_qwen2  # noqa: E402 (tests/helpers; needs torch)

from replay_theory.integrations.buffer import ReplayConfig  # noqa: E402 (after the importorskip)

STEPS, N, B, R, G = 3, 8, 8, 4, 2
NOISE = 0.6  # sd of the fake engine's log-prob error per token




def _logps(model, input_ids, attention_mask, width):
    """log pi(y_t) by a plain float64 log_softmax (TRL 1.16's fused kernel rounds in float32)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -width - 1:-1]
    logp_all = torch.log_softmax(logits.double(), dim=-1)  # (rows, L, V)
    return logp_all.gather(-1, input_ids[:, -width:, None])[..., 0], logp_all  # (rows, L), (rows, L, V)


class FakeVLLM:
    """TRL's VLLMGeneration interface; completions sampled by a seeded generator, log-probs = model's + noise."""

    def __init__(self, model, max_completion_length, **_):
        self.model, self.max_len = model, max_completion_length
        self.gen = torch.Generator().manual_seed(1234)

    def sync_weights(self):  # the fake reads the trainer's model itself: always in sync
        pass

    @torch.no_grad()
    def generate(self, prompts, images, num_generations, profiler=None):
        prompt_ids = [list(p) for p in prompts]  # TRL's sampler has repeated each prompt G times already
        completion_ids, logprobs = [], []
        for p in prompt_ids:
            length = int(torch.randint(2, self.max_len + 1, (1,), generator=self.gen))
            c = torch.randint(2, 11, (length,), generator=self.gen).tolist()  # characters, no EOS: all real
            ids = torch.tensor([p + c])
            logp, _ = _logps(self.model, ids, torch.ones_like(ids), length)
            noisy = logp[0] + NOISE * torch.randn(length, generator=self.gen, dtype=torch.float64)
            completion_ids.append(c)
            logprobs.append([[float(v)] for v in noisy])
        return prompt_ids, completion_ids, logprobs, None


def _recording_cls(seen: dict):
    from replay_theory.integrations.trl import ReplayGRPOTrainer

    class Recording(ReplayGRPOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if model.training and "version" in inputs:  # theta and rows before the update
                seen[self.state.global_step] = ({k: v.detach().clone() for k, v in model.state_dict().items()},
                                                {k: v.clone() for k, v in inputs.items()})
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                               batch_size=None, compute_entropy=False, **_):
            logp, logp_all = _logps(model, input_ids, attention_mask, logits_to_keep)
            entropy = -(logp_all.exp() * logp_all).sum(-1) if compute_entropy else None
            return logp, entropy, None

    return Recording


def _train(tmp_path, monkeypatch, mode: str, clip_max, clip_min):
    import trl.trainer.grpo_trainer as grpo_module
    from datasets import Dataset

    from replay_theory.integrations.trl import replay_grpo_args

    monkeypatch.setattr(grpo_module, "VLLMGeneration", FakeVLLM)
    tokenizer = char_tokenizer()
    model = tiny_qwen2(tokenizer, torch.float64)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    replay = ReplayConfig(capacity=N, batch_size=B, rollouts_per_step=R, loss="grpo", eps_low=0.2, eps_high=0.28)
    args = replay_grpo_args(replay, G, output_dir=str(tmp_path), max_completion_length=6, max_steps=STEPS,
                            learning_rate=3e-2, logging_steps=1, report_to="none", use_cpu=True, save_strategy="no",
                            seed=0, use_vllm=True, vllm_mode="colocate", vllm_importance_sampling_mode=mode,
                            vllm_importance_sampling_clip_max=clip_max, vllm_importance_sampling_clip_min=clip_min,
                            loss_type="bnpo", epsilon=0.2, epsilon_high=0.28)
    dataset = Dataset.from_dict({"prompt": ["abc", "bcd", "cde", "def", "efg", "fgh", "ab", "gh"] * 4})
    seen: dict = {}
    trainer = _recording_cls(seen)(model=model, reward_funcs=lambda completions, **_: [c.count("a") / len(c)
                                                                                       for c in completions],
                                   args=args, train_dataset=dataset, processing_class=tokenizer, replay=replay,
                                   measure_noise=False)
    trainer.train()
    return trainer, seen, before, replay


def hand_engine_ratio(old: np.ndarray, sampling: np.ndarray, mask: np.ndarray, mode: str, clip_max, clip_min):
    """TRL's rho = pi_old / pi_vllm by the mode's formula, (B, L), written from the docs' formulas."""
    d = np.nan_to_num((old - sampling) * mask)  # (B, L) log pi_old - log pi_vllm on real tokens
    if mode.startswith("sequence"):
        d = np.broadcast_to(d.sum(axis=1, keepdims=True), d.shape)  # sum_t: one value a row
    rho = np.exp(d)
    lo = -np.inf if clip_min is None else clip_min
    hi = np.inf if clip_max is None else clip_max
    if mode.endswith("truncate"):
        return np.clip(rho, lo, hi)
    return np.where((rho >= lo) & (rho <= hi), rho, 0.0)


def hand_composed(logp_new, old, adv, mask, rho, eps_low=0.2, eps_high=0.28):
    """Token-mean PPO clip with rho multiplied in: value and d loss / d logp_new, (B, L)."""
    m = mask.astype(bool)
    T = m.sum()
    r = np.exp(logp_new - old)  # pi_theta / pi_old
    a = adv[:, None]
    surr = np.minimum(r * a, np.clip(r, 1 - eps_low, 1 + eps_high) * a)
    value = -np.sum(np.where(m, rho * surr, 0.0)) / T
    clipped = ((a > 0) & (r > 1 + eps_high)) | ((a < 0) & (r < 1 - eps_low))
    grad = np.where(m & ~clipped, -rho * r * a / T, 0.0)
    return value, grad


@pytest.mark.slow
@pytest.mark.parametrize("mode, clip_max, clip_min", [
    ("sequence_mask", 3.0, None),  # TRL's default
    ("sequence_truncate", 2.0, 0.5),
    ("token_mask", 1.5, 0.6),
    ("token_truncate", 1.5, 0.6),
])
def test_vllm_is_ratio_composes_with_the_replay_correction(tmp_path, monkeypatch, mode, clip_max, clip_min):
    from trl import GRPOTrainer

    from replay_theory.integrations.trl import engine_corrected_loss

    trainer, seen, before, replay = _train(tmp_path, monkeypatch, mode, clip_max, clip_min)
    logs = [h for h in trainer.state.log_history if "replay/replay_ratio" in h]
    assert len(logs) == STEPS and all(math.isfinite(h["loss"]) for h in logs)
    assert any(not torch.equal(v.detach(), before[k]) for k, v in trainer.model.named_parameters())
    assert all("replay/vllm_is_ratio_mean" in h for h in logs)
    model = trainer.model
    params = [p for p in model.parameters() if p.requires_grad]
    ages, binding = set(), 0
    for step, (state, rows) in seen.items():
        mask = (rows["completion_mask"] * rows["tool_mask"]).bool()
        m = mask.numpy()
        old, samp = rows["old_per_token_logps"].numpy(), rows["sampling_per_token_logps"].numpy()
        rho_hand = hand_engine_ratio(old, samp, m, mode, clip_max, clip_min)
        rho = rows["importance_sampling_ratio"].numpy()
        np.testing.assert_allclose(rho[m], rho_hand[m], rtol=1e-12, atol=0)
        binding += int(np.sum(m & ((rho_hand == 0) | (rho_hand == clip_max) | (rho_hand == clip_min))))
        ages |= set((step - rows["version"]).tolist())

        model.load_state_dict(state)
        model.train()
        ids = torch.cat([rows["prompt_ids"], rows["completion_ids"]], dim=1)
        att = torch.cat([rows["prompt_mask"], rows["completion_mask"]], dim=1)
        logp = trainer._get_per_token_logps_and_entropies(model, ids, att, rows["completion_ids"].size(1))[0]
        leaf = logp.detach().requires_grad_(True)
        ours, _ = engine_corrected_loss(replay, leaf, rows["old_per_token_logps"], rows["advantages"], mask,
                                        is_ratio=rows["importance_sampling_ratio"])
        (coef,) = torch.autograd.grad(ours, leaf)
        value_hand, grad_hand = hand_composed(leaf.detach().numpy(), old, rows["advantages"].numpy(), m, rho)
        assert float(ours.detach()) == pytest.approx(value_hand, rel=1e-12, abs=1e-15)
        np.testing.assert_allclose(coef.numpy(), grad_hand, rtol=1e-10, atol=1e-15)
        if step == max(seen):
            print(f"\n{mode} C=[{clip_min}, {clip_max}] step {step}: rho[0,:4] trainer {rho[0, :4]} hand "
                  f"{rho_hand[0, :4]}; loss trainer {float(ours.detach()):.10g} hand {value_hand:.10g}")

        # TRL's own loss on the same rows, at the same parameters: value and parameter gradient
        ours_model, _ = engine_corrected_loss(replay, logp, rows["old_per_token_logps"], rows["advantages"], mask,
                                              is_ratio=rows["importance_sampling_ratio"])
        g_ours = torch.autograd.grad(ours_model, params)
        trl_rows = {k: v for k, v in rows.items() if k not in ("version", "sample_id", "group_id", "buffer_index",
                                                                "sampler_weight", "rewards")}
        theirs = GRPOTrainer._compute_loss(trainer, model, trl_rows)
        g_theirs = torch.autograd.grad(theirs, params)
        assert float(ours_model.detach()) == pytest.approx(float(theirs.detach()), rel=1e-9)
        diff = sum(float(((a - b) ** 2).sum()) for a, b in zip(g_ours, g_theirs)) ** 0.5
        norm = sum(float((b**2).sum()) for b in g_theirs) ** 0.5
        assert norm > 0 and diff <= 1e-9 * norm, (diff, norm)
    assert ages >= {0, 1}  # fresh and replayed rows were both checked
    assert binding > 0  # the mode's cap or mask acted on some tokens

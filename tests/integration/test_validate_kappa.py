"""kappa on the tiny language model (validate calibrate-model, issue 30): the finite-difference Hessian-vector
products against autograd's, AdamW's preconditioner against its own step, and the profile's memory record.

Autograd's reference is forward-over-reverse (``torch.func.jvp`` of the gradient) with eager attention: the SDPA
kernel the model runs by default has no double backward on the CPU, and reverse-over-reverse (double backward) with
eager attention differs by 0.4% from both the forward-over-reverse product and the central difference of its own
first-order gradient, at every step from 1e-4 to 1e-5 (neither truncation nor rounding: measured), while those two
agree to 4e-4 in float32. The finite differences are the library's (``central_hvp``).
"""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch.func import functional_call, grad, jvp  # noqa: E402

from replay_theory.advise.profile_files import load_profile, save_profile  # noqa: E402
from replay_theory.validate import countdown  # noqa: E402
from replay_theory.validate.calibrate import (  # noqa: E402
    adamw_preconditioner,
    adamw_snapshot,
    batch_gradient,
    calibrate_lm,
    central_hvp,
    flat_parameters,
    kappa_line,
)
from replay_theory.validate.logprobs import encode_prompts  # noqa: E402
from replay_theory.validate.policy import ModelConfig, load_policy  # noqa: E402
from replay_theory.validate.rl import RLConfig, generate_batch  # noqa: E402

CONFIG = RLConfig(steps=3, rollouts_per_step=8, group_size=4, batch_size=8, capacity=16, max_new_tokens=6,
                  loss="grpo", lr=1e-2)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    train_set, _ = countdown.make_splits(40, 4, seed=2)
    policy = load_policy(ModelConfig(), countdown.ALPHABET)
    policy.model.config._attn_implementation = "eager"  # autograd's double backward (module docstring)
    for layer in policy.model.model.layers:
        layer.self_attn.config._attn_implementation = "eager"
    batch, _ = generate_batch(policy, train_set, np.arange(2), CONFIG, 0, 0, torch.Generator().manual_seed(1))
    # a fresh model scores 0 everywhere: advantages of both signs give the loss a curvature to measure
    batch = dataclasses.replace(batch, advantage=np.random.default_rng(0).standard_normal(batch.advantage.shape))
    return policy, train_set, batch


def _inputs(policy, train_set, batch):
    prompt_ids, prompt_mask = encode_prompts(policy, [train_set[i].prompt_text() for i in batch.prompt[0]])
    ids = torch.as_tensor(batch.tokens[0])
    mask = torch.as_tensor(batch.mask[0].astype(np.int64))
    attention = torch.cat([prompt_mask, mask], dim=1).long()
    kwargs = dict(input_ids=torch.cat([prompt_ids, ids], dim=1), attention_mask=attention,
                  position_ids=(attention.cumsum(1) - 1).clamp(min=0), use_cache=False, logits_to_keep=ids.shape[1] + 1)

    def logp_at(params: dict) -> torch.Tensor:  # sequence_logprobs through functional_call: (n, L)
        logits = functional_call(policy.model, params, (), kwargs).logits[:, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1).masked_fill(mask == 0, 0.0)

    behav = torch.as_tensor(batch.logp_behav[0], dtype=torch.float32)
    advantage = torch.as_tensor(batch.advantage[0], dtype=torch.float32)[:, None]
    return logp_at, mask.to(torch.float32), behav, advantage


def _as_dict(policy, vector: torch.Tensor) -> dict:
    named = list(policy.model.named_parameters())
    parts = torch.split(vector, [p.numel() for _, p in named])
    return {name: part.view_as(p) for (name, p), part in zip(named, parts)}


def _flat(tensors: dict, policy) -> torch.Tensor:
    return torch.cat([tensors[name].reshape(-1) for name, _ in policy.model.named_parameters()])


def _direction(policy, train_set, batch) -> torch.Tensor:
    v = batch_gradient(policy, train_set, batch, CONFIG)  # a direction with curvature well above float32 rounding
    return v / v.norm()


def test_finite_difference_hvp_matches_autograd_for_the_loss(tiny):
    """The loss's own Hessian (GRPO at ratio 1: the clip inactive, so -mean_tokens A pi_theta / pi_behav) along v:
    central differences of the shared numpy loss's gradient against autograd's, relative 1e-3 (float32)."""
    policy, train_set, batch = tiny
    theta = flat_parameters(policy.model)
    v = _direction(policy, train_set, batch)
    logp_at, mask, behav, advantage = _inputs(policy, train_set, batch)

    def loss(params: dict) -> torch.Tensor:
        return -(advantage * torch.exp(logp_at(params) - behav) * mask).sum() / mask.sum()

    _, hv = jvp(grad(loss), (_as_dict(policy, theta),), (_as_dict(policy, v),))
    reference = _flat(hv, policy)
    scratch = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
    fd = central_hvp(scratch, train_set, batch, CONFIG, theta, v, reweighted=False)
    assert float((fd - reference).norm() / reference.norm()) < 1e-3
    assert float(v @ fd) == pytest.approx(float(v @ reference), rel=1e-3)
    assert torch.equal(flat_parameters(policy.model), theta)  # the scratch copy moved, never the policy


def test_reweighted_finite_difference_matches_autograd(tiny):
    """G(theta') = sum_i rho_i(theta') grad l_i(theta'): rho_i the completion's ratio to the behaviour policy, l_i the
    on-policy loss (ratio 1, token-mean) of completion i. Its Jacobian along v by central differences (what kappa's
    independent micro-batch measures) against autograd's forward-over-reverse product, relative 1e-3."""
    policy, train_set, batch = tiny
    theta = flat_parameters(policy.model)
    v = _direction(policy, train_set, batch)
    logp_at, mask, behav, advantage = _inputs(policy, train_set, batch)
    coef = -advantage * mask / mask.sum()  # d loss / d logp at ratio 1

    def score_weighted(params: dict) -> dict:
        rho = torch.exp(((logp_at(params) - behav) * mask).sum(dim=1))  # (n,), carries the outer tangent
        return grad(lambda inner: (rho[:, None] * coef * logp_at(inner)).sum())(params)  # sum_i rho_i grad l_i

    _, hv = jvp(score_weighted, (_as_dict(policy, theta),), (_as_dict(policy, v),))
    reference = _flat(hv, policy)
    scratch = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
    fd = central_hvp(scratch, train_set, batch, CONFIG, theta, v, reweighted=True)
    assert float((fd - reference).norm() / reference.norm()) < 1e-3
    # and the reweighting matters here: the loss's own Hessian differs from it by more than 10%
    plain = central_hvp(scratch, train_set, batch, CONFIG, theta, v, reweighted=False)
    assert float((plain - reference).norm() / reference.norm()) > 0.1


def test_adamw_preconditioner_is_its_step():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.0)
    before = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    model(torch.ones(4, 3)).square().sum().backward()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    optimizer.step()
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    snapshot = adamw_snapshot(optimizer, model)
    assert snapshot["step"] == 1 and snapshot["lr"] == 0.1 and snapshot["betas"] == (0.9, 0.999)
    D = adamw_preconditioner(snapshot, "cpu")  # after one step m_hat = g, v_hat = g^2: the step is lr D g
    torch.testing.assert_close(before - after, 0.1 * D * grad, rtol=1e-5, atol=1e-7)
    # with a gradient: the diagonal of the next update, were its gradient that one
    optimizer.zero_grad()
    model(torch.full((4, 3), 0.5)).sum().backward()
    grad2 = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    D2 = adamw_preconditioner(snapshot, "cpu", grad2)
    optimizer.step()
    after2 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    m_hat = (0.9 * 0.1 * grad + 0.1 * grad2) / (1 - 0.9**2)
    torch.testing.assert_close(after - after2, 0.1 * D2 * m_hat, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="no exp_avg_sq"):
        adamw_snapshot(torch.optim.AdamW(torch.nn.Linear(3, 2).parameters()), model)


@pytest.mark.slow
def test_calibrate_lm_writes_kappa_beside_b(tmp_path):
    """AsymRE (its shifted baseline gives a gradient even where every reward is 0, as on a fresh model): kappa from
    2 pairs at each checkpoint after an update, with the other estimators, written into the profile."""
    train_set, _ = countdown.make_splits(40, 4, seed=2)
    policy = load_policy(ModelConfig(), countdown.ALPHABET)
    config = dataclasses.replace(CONFIG, loss="asymre")
    cal = calibrate_lm(policy, train_set, config, staleness=(0, 1), samples=8, reference_samples=16, kappa_pairs=2)
    memory = cal.memory
    assert memory["method"] == "curvature-pairs" and memory["optimizer"] == "adam" and memory["beta1"] == 0.9
    assert memory["units"] == 2 * 2 and memory["pairs_without_noise"] == 0  # checkpoints after 2 and 3 updates
    assert "after 2, 3 updates" in memory["source"] and "AdamW lr 0.01" in memory["source"]
    assert memory["hvp"].startswith("H xi by central differences of a third, independent micro-batch")
    assert (memory["kappa"] is not None and memory["kappa"] > 0) or "not positive" in memory["reason"]
    assert set(cal.memory_estimators) == {"curvature-pairs-surrogate-hessian", "curvature-pairs-same-micro-batch"}
    path = tmp_path / "profile.json"
    save_profile(path, json.loads(json.dumps(cal.profile_dict("test"))))
    loaded = load_profile(path)
    assert loaded.memory == json.loads(json.dumps(memory)) and loaded.noise_scale is not None
    assert kappa_line(memory).startswith("optimizer memory kappa")


@pytest.mark.slow
def test_calibrate_lm_without_reward_variation_says_why(tmp_path):
    """GRPO on a fresh model: every reward is 0, so every advantage and every micro-batch gradient: kappa is null with
    the reason, and kappa_pairs = 0 measures nothing."""
    train_set, _ = countdown.make_splits(40, 4, seed=2)
    policy = load_policy(ModelConfig(), countdown.ALPHABET)
    cal = calibrate_lm(copy.deepcopy(policy), train_set, CONFIG, staleness=(0, 1), samples=8, reference_samples=16,
                       kappa_pairs=2)
    assert cal.memory["kappa"] is None and cal.memory["pairs_without_noise"] >= 3  # 4 pairs, at most 1 with a reward
    assert "of 4 curvature pairs have a gradient difference xi != 0" in cal.memory["reason"]
    save_profile(tmp_path / "p.json", json.loads(json.dumps(cal.profile_dict("test"))))  # a null kappa loads
    none = calibrate_lm(copy.deepcopy(policy), train_set, CONFIG, staleness=(0, 1), samples=8, reference_samples=16,
                        kappa_pairs=0)
    assert none.memory == {} and "memory" not in none.profile_dict("test")
    with pytest.raises(ValueError, match="kappa_pairs must be an integer >= 0"):
        calibrate_lm(policy, train_set, CONFIG, staleness=(0, 1), samples=8, kappa_pairs=-1)


def test_kappa_line_prints_the_interval_and_the_memory():
    record = {"kappa": 0.02, "kappa_interval": [0.01, 0.04], "level": 0.9, "optimizer": "adam", "beta1": 0.9,
              "units": 16}
    assert kappa_line(record) == ("optimizer memory kappa = lr tr(D H D Sigma) / tr(D Sigma) (adam, beta1 0.9, "
                                  "curvature pairs) = 0.02, 90% interval [0.01, 0.04] (16 pairs); memory 1/kappa = "
                                  "50 steps")
    assert kappa_line({"kappa": None, "reason": "no pairs"}) == "optimizer memory kappa: not measured: no pairs"


def test_calibration_summary_prints_each_measurement_or_why_it_is_missing():
    from replay_theory.validate.calibrate import calibration_summary

    memory = {"kappa": None, "reason": "no pairs", "source": "the probe"}
    assert calibration_summary({"memory": memory}, "run/calibration.json") == [
        "no noise scale in run/calibration.json (measured before B_noise was; delete it to measure again)",
        "optimizer memory kappa: not measured: no pairs", "  measured on the probe"]
    assert calibration_summary({}, "c.json")[1] == ("no optimizer memory kappa in c.json (measured before kappa was; "
                                                    "delete it to measure again)")

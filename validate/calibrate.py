"""Calibrate the theory's inputs on the language model: mu, sigma^2(s), rho and the KL drift.

Paper: experience-replay (shared/papers/experience-replay-optimal-buffer.txt), Assumption 3.3,
Thm 3.5 and App. E; the same measurements as ``simulate/calibrate.py`` (whose fits are reused),
but with per-sample gradients of the transformer instead of analytic scores.

| code name          | paper symbol     | how it is measured on the LM                                           |
|--------------------|------------------|------------------------------------------------------------------------|
| ``mu_timing``      | mu (Table 1)     | generation seconds per completion / update seconds per completion      |
| ``sigma_sq[s]``    | sigma^2(s)       | mean ||G(theta_t, z) - grad F||^2 over completions z ~ pi_{t-s}         |
| ``reference``      | grad F(theta_t)  | mean per-sample gradient over fresh completions of pi_t                |
| ``rho``            | rho              | pairwise noise correlation of FIFO items vs |t_i - t_j| / N (fit_rho)   |
| ``kl_by_lag``      | KL drift         | k1 estimate of KL(pi_t || pi_{t-lag}) from completions of pi_t          |

The probe is an ordinary RL run (``validate.rl.train``, FIFO buffer, GRPO) whose
per-step weights are kept, so completions of the stale policies pi_{t-s} can be
regenerated after it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from replay_theory.simulate.calibrate import fit_profiles, fit_rho
from replay_theory.validate import countdown
from replay_theory.validate.model import Policy, encode_prompts, sequence_logprobs
from replay_theory.validate.rl import RLConfig, _loss, generate_batch, train


@dataclass
class LMCalibration:
    mu_timing: float
    staleness: list[float]
    sigma_sq: list[float]
    rho: float
    correlation_by_gap: dict[int, float]
    kl_by_lag: dict[int, float]
    kl_drift_per_step: float
    probe_metrics: list[dict]
    fits: dict

    def profile_dict(self, source: str) -> dict:
        """The file `replay-theory optimal --profile` reads."""
        return {"kind": "table", "staleness": self.staleness, "sigma_sq": self.sigma_sq, "rho": self.rho,
                "fits": self.fits, "kl_drift_per_step": self.kl_drift_per_step, "source": source}


def _flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in model.parameters()])


def per_sample_grads(policy: Policy, problems, batch, config: RLConfig) -> torch.Tensor:
    """G(theta, z_i) for each completion of a one-seed RolloutBatch: (n, num_params), the loss on a batch of one."""
    model = policy.model
    model.train()
    grads = []
    for i in range(batch.size):
        prompt_ids, prompt_mask = encode_prompts(policy, [problems[batch.prompt[0, i]].prompt_text()])
        ids = torch.as_tensor(batch.tokens[0, i : i + 1], device=policy.device)
        mask = torch.as_tensor(batch.mask[0, i : i + 1].astype(np.int64), device=policy.device)
        logp = sequence_logprobs(policy, prompt_ids, prompt_mask, ids, mask, temperature=config.temperature)  # (1, L)
        out = _loss(config, logp.detach().cpu().double().numpy()[None], batch.take(np.array([[i]])))
        model.zero_grad(set_to_none=True)
        (torch.as_tensor(out.grad_logp[0], dtype=logp.dtype) * logp).sum().backward()
        grads.append(_flat_grad(model).detach().clone())
    model.zero_grad(set_to_none=True)
    return torch.stack(grads)  # (n, num_params)


def calibrate_lm(policy: Policy, problems: list[countdown.Problem], config: RLConfig,
                 staleness: tuple[int, ...] = (0, 1, 2, 4, 8), samples: int = 32, seed: int = 0) -> LMCalibration:
    """Probe run of ``config`` on ``problems``, then sigma^2(s), rho and KL(pi_t || pi_t-lag) at its last step."""
    if config.steps <= max(staleness):
        raise ValueError(f"steps must exceed the largest staleness probed = {max(staleness)}, got {config.steps}")
    snapshots = [copy.deepcopy(policy.model.state_dict())]  # theta before each update
    result = train(policy, problems, config, progress=lambda step, m: snapshots.append(
        copy.deepcopy(policy.model.state_dict())))
    generator = torch.Generator(device="cpu").manual_seed(seed + 7919)
    rng = np.random.default_rng(seed + 7919)
    behaviour = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
    prompts_per_batch = samples // config.group_size
    t = len(snapshots) - 1

    def completions_of(version: int):
        behaviour.model.load_state_dict(snapshots[version])
        index = rng.integers(0, len(problems), size=prompts_per_batch)
        batch, _ = generate_batch(behaviour, problems, index, config, version, 0, generator)
        return batch

    fresh = completions_of(t)
    reference = per_sample_grads(policy, problems, fresh, config).mean(dim=0)  # ~ grad F(theta_t)
    sigma_sq = []
    for s in staleness:
        batch = fresh if s == 0 else completions_of(t - s)
        noise = per_sample_grads(policy, problems, batch, config) - reference  # (n, params)
        sigma_sq.append(float((noise**2).sum(dim=1).mean()))  # Assumption 3.3: E||eps||^2
    kl_by_lag = _kl_by_lag(policy, behaviour, problems, fresh, snapshots, config)
    by_gap = _buffer_correlations(policy, problems, result.buffer, reference, config)
    staleness_f = [float(s) for s in staleness]
    return LMCalibration(
        mu_timing=result.mu_timing(), staleness=staleness_f, sigma_sq=sigma_sq,
        rho=fit_rho(by_gap, config.capacity), correlation_by_gap=by_gap, kl_by_lag=kl_by_lag,
        kl_drift_per_step=kl_by_lag.get(1, math.nan), probe_metrics=result.metrics,
        fits=fit_profiles(np.asarray(staleness_f), np.asarray(sigma_sq)),
    )


def _kl_by_lag(policy, behaviour, problems, fresh, snapshots, config) -> dict[int, float]:
    """k1 estimate of KL(pi_t || pi_t-lag) = E_{pi_t}[log pi_t - log pi_t-lag] over fresh completions of pi_t."""
    prompt_ids, prompt_mask = encode_prompts(policy, [problems[i].prompt_text() for i in fresh.prompt[0]])
    ids = torch.as_tensor(fresh.tokens[0])
    mask = torch.as_tensor(fresh.mask[0].astype(np.int64))
    with torch.no_grad():
        current = sequence_logprobs(policy, prompt_ids, prompt_mask, ids, mask, temperature=config.temperature).sum(1)
        out = {}
        for lag in (1, 2, 4, 8):
            if lag < len(snapshots):
                behaviour.model.load_state_dict(snapshots[-1 - lag])
                old = sequence_logprobs(behaviour, prompt_ids, prompt_mask, ids, mask,
                                        temperature=config.temperature).sum(1)
                out[lag] = float((current - old).mean())
    return out


def _buffer_correlations(policy, problems, buffer, reference, config) -> dict[int, float]:
    """Mean cosine between noise vectors of FIFO items, by the gap between their creation steps."""
    if buffer is None:
        return {}
    valid = np.nonzero(buffer.valid[0])[0]
    batch = buffer._take(valid[None, :])  # (1, n, ...)
    noise = per_sample_grads(policy, problems, batch, config) - reference
    unit = noise / noise.norm(dim=1, keepdim=True).clamp_min(1e-30)
    cos = (unit @ unit.T).numpy()  # (n, n)
    created = batch.created[0]
    gap = np.abs(created[:, None] - created[None, :])
    off_diagonal = ~np.eye(len(created), dtype=bool)
    return {int(g): float(cos[(gap == g) & off_diagonal].mean()) for g in np.unique(gap[off_diagonal])}


def write_calibration(calibration: LMCalibration, out_dir: Path, source: str) -> None:
    """calibration.json (everything) and profile.json (what `optimal --profile` reads); never overwrites."""
    from replay_theory.theory.profiles import save_profile

    out_dir.mkdir(parents=True, exist_ok=True)
    save_profile(out_dir / "profile.json", calibration.profile_dict(source))
    with (out_dir / "calibration.json").open("x") as handle:
        json.dump(dataclasses.asdict(calibration), handle, indent=1, default=float)

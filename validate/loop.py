"""The calibrate -> predict steps of the validation loop (verify is still to come, see issue 4).

``replay-theory validate calibrate --tiny --out DIR`` builds (or loads) the policy, warm-starts it by
SFT on solver solutions, measures mu, sigma^2(s), rho and the KL drift on a probe RL run, and writes
``DIR/calibration.json`` and ``DIR/profile.json``. ``replay-theory validate predict --out DIR``
turns them into the Thm 3.5 design (x*, y*) and integer N, B, R in ``DIR/predicted.json``.
Files are never overwritten: a step whose output exists is skipped (resume).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from replay_theory.validate import countdown


@dataclass(frozen=True)
class ValidateConfig:
    """The validation run. Field docs are the CLI help."""

    model: str = "tiny"
    """'tiny' (a small Qwen2 built from its config) or a local checkpoint path / hub id."""
    device: str = "cpu"
    """cpu or cuda."""
    seed: int = 0
    n_train: int = 1000
    """Training problems (Countdown, seeded)."""
    n_test: int = 64
    """Held-out problems."""
    sft_steps: int = 600
    """SFT warm-start steps on solver solutions (tiny model only)."""
    rollouts_per_step: int = 64
    """R of the probe run and of the concrete advice."""
    group_size: int = 8
    probe_steps: int = 24
    """RL steps of the calibration probe (FIFO buffer, GRPO)."""
    samples: int = 64
    """Completions per staleness value when measuring sigma^2(s)."""
    max_new_tokens: int = 16
    lr: float = 3e-4

    def problems(self) -> tuple[list[countdown.Problem], list[countdown.Problem]]:
        """Three-number problems with small numbers: learnable by the tiny model (pass@1 ~ 0.2 after SFT)."""
        return countdown.make_splits(self.n_train, self.n_test, seed=self.seed, num_numbers=(3,),
                                     number_range=(1, 9), target_range=(1, 40))


TINY_MODEL = dict(hidden_size=96, num_layers=3, num_heads=4, num_kv_heads=2, intermediate_size=192)


def prepare_policy(config: ValidateConfig, out_dir: Path, train_set):
    """The warm-started policy: loaded from DIR/warm_start if present, else built (+ SFT for tiny) and saved."""
    from replay_theory.validate.model import ModelConfig, load_checkpoint, load_policy, save_checkpoint, sft_warm_start

    checkpoint = out_dir / "warm_start"  # created only once the policy loaded: bad input leaves nothing behind
    if checkpoint.exists():
        return load_checkpoint(checkpoint, device=config.device), None
    if config.model == "tiny":
        policy = load_policy(ModelConfig(device=config.device, seed=config.seed, **TINY_MODEL), countdown.ALPHABET)
        examples = [(p.prompt_text(), countdown.solve(p)) for p in train_set]
        losses = sft_warm_start(policy, examples, steps=config.sft_steps, batch_size=64, lr=3e-3,
                                generator=torch.Generator().manual_seed(config.seed))
    else:
        policy, losses = load_policy(ModelConfig(source=config.model, device=config.device, seed=config.seed)), None
    save_checkpoint(policy, checkpoint)
    return policy, losses


def run_calibrate(config: ValidateConfig, out_dir: Path, log=print) -> dict:
    """Warm start, evaluate, probe, measure; writes calibration.json + profile.json (skipped if present)."""
    from replay_theory.validate.calibrate import calibrate_lm, write_calibration
    from replay_theory.validate.rl import RLConfig, evaluate_policy

    if (out_dir / "calibration.json").exists():
        log(f"calibration exists in {out_dir}; skipping (delete it to measure again)")
        return json.loads((out_dir / "calibration.json").read_text())
    started = time.perf_counter()
    train_set, test_set = config.problems()
    policy, sft_losses = prepare_policy(config, out_dir, train_set)
    warm = evaluate_policy(policy, test_set, 8, 1.0, config.max_new_tokens, seed=config.seed + 1)
    log(f"warm start: held-out pass@1 {warm['pass@1']:.3f}, mean reward {warm['mean_reward']:.3f}")
    probe = RLConfig(steps=config.probe_steps, rollouts_per_step=config.rollouts_per_step,
                     group_size=config.group_size, batch_size=config.rollouts_per_step,
                     capacity=2 * config.rollouts_per_step, lr=config.lr, max_new_tokens=config.max_new_tokens,
                     seed=config.seed)
    calibration = calibrate_lm(policy, train_set, probe, samples=config.samples, seed=config.seed)
    write_calibration(calibration, out_dir, source=f"replay-theory validate calibrate {dataclasses.asdict(config)}")
    summary = {"mu_measured": calibration.mu_timing, "warm_start": warm, "sft_final_loss": sft_losses[-1] if sft_losses else None,
               "seconds": time.perf_counter() - started, "config": dataclasses.asdict(config)}
    with (out_dir / "calibration_summary.json").open("x") as handle:
        json.dump(summary, handle, indent=1, default=float)
    log(f"mu (generation / update time per completion) = {calibration.mu_timing:.3g}; "
        f"KL drift per step = {calibration.kl_drift_per_step:.3g}; rho = {calibration.rho:.3g}")
    return json.loads((out_dir / "calibration.json").read_text())


def run_predict(config: ValidateConfig, out_dir: Path, mu: float | None = None, log=print) -> dict:
    """Thm 3.5 from the measured profile and mu: predicted.json with x*, y*, N, B, R."""
    from replay_theory.theory.design import DesignQuery, optimal_design
    from replay_theory.theory.profiles import load_profile

    calibration_file = out_dir / "calibration.json"
    if not calibration_file.exists():
        raise ValueError(f"{str(out_dir)!r} has no calibration.json: run `replay-theory validate calibrate --out {out_dir}` first")
    calibration = json.loads(calibration_file.read_text())
    mu_value = calibration["mu_timing"] if mu is None else mu
    loaded = load_profile(out_dir / "profile.json")
    design = optimal_design(DesignQuery(mu=mu_value, profile=loaded.profile, profile_rho=loaded.rho,
                                        profile_description=loaded.description,
                                        rollouts_per_step=config.rollouts_per_step))
    predicted = {"mu_measured": mu_value, "x_star": design.x_star, "y_star": design.y_star, "regime": design.regime,
                 "N": design.buffer_size, "B": design.batch_size, "R": design.rollouts_per_step,
                 "workers_per_trainer": design.workers_per_trainer, "design": design.to_json_dict()}
    path = out_dir / "predicted.json"
    if not path.exists():
        path.write_text(json.dumps(predicted, indent=1, default=lambda v: None))
    log(f"predicted: regime {design.regime}, x* = {design.x_star:.3g}, y* = {design.y_star:.3g}, "
        f"N = {design.buffer_size}, B = {design.batch_size}, R = {design.rollouts_per_step}")
    return predicted

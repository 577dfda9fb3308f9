"""Tiny-model throughput on this CPU: generation and training tokens/s, and the tiny setting's mu.

Paper: experience-replay (docs/REFERENCES.md), Sec. 2 / Table 1:
mu = cost of generating one rollout / cost of processing it in a gradient update. Here:

* sampling alone: ``validate.sampling.generate`` (the HF engine), tokens/s of sampled tokens;
* the RL generation step: ``validate.rl.generate_batch`` = sampling + the trainer's behaviour
  log-prob pass + rewards, i.e. what ``RLResult.mu_timing`` charges to generation;
* the RL training step: ``validate.rl.update_step`` (GRPO, the same code as ``train``), on
  full-length completions (the update's worst case), tokens/s of completion tokens;
* mu (timing) = generation-step seconds per completion / training-step seconds per completion;
* mu (App. E counts) = K_training / K_inference over ``--window`` seconds of the emulated
  W = T = 1 pipeline (``validate.calibrate.measure_mu_count``).

Run: ``python bench/bench_validate.py [--batch 64] [--new-tokens 16] [--window 3] [--threads 1]``. Needs the validate
extra. Timings are medians over ``--repeats``; they depend on what else runs on the machine.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable, TypeVar

import numpy as np
import torch

from replay_theory.checks import require_integer
from replay_theory.validate import countdown
from replay_theory.validate.calibrate import measure_mu_count
from replay_theory.validate.config import TINY_MODEL
from replay_theory.validate.policy import ModelConfig, load_policy
from replay_theory.validate.rl import RLConfig, generate_batch, update_step
from replay_theory.validate.sampling import generate

T = TypeVar("T")


def _median_seconds(fn: Callable[[], T], repeats: int) -> tuple[float, T]:
    """The median wall seconds of ``repeats`` calls of ``fn`` (one at least) and the last call's result."""
    times: list[float] = []
    while True:
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
        if len(times) >= repeats:
            return float(np.median(times)), out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--batch", type=int, default=64, help="completions per generation and per update")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--window", type=float, default=3.0, help="seconds of the App. E count window (0: skip)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (validate's --threads default)")
    args = parser.parse_args()
    try:
        require_integer("--repeats", args.repeats, 1)
    except ValueError as err:
        parser.error(str(err))
    torch.set_num_threads(args.threads)
    if args.batch % 8:
        parser.error("--batch must be a multiple of the group size 8")
    problems, _ = countdown.make_splits(max(args.batch, 64), 1, seed=0, num_numbers=(3,), number_range=(1, 9),
                                       target_range=(1, 40))
    policy = load_policy(ModelConfig(**TINY_MODEL), countdown.ALPHABET)
    prompts = [p.prompt_text() for p in problems[: args.batch]]
    generator = torch.Generator().manual_seed(0)
    config = RLConfig(steps=1, rollouts_per_step=args.batch, group_size=8, batch_size=args.batch,
                      capacity=args.batch, max_new_tokens=args.new_tokens, lr=1e-4)

    # sampling alone: one completion per prompt
    generate(policy, prompts, 1, args.new_tokens, 1.0, generator)  # warm-up
    sample_s, rollouts = _median_seconds(lambda: generate(policy, prompts, 1, args.new_tokens, 1.0, generator),
                                         args.repeats)
    sampled_tokens = int(rollouts.completion_mask.sum())

    # the RL generation step: batch / 8 prompts x 8 samples, scored, behaviour log-probs from the trainer
    index = np.arange(args.batch // 8)
    step_s, (batch, _) = _median_seconds(
        lambda: generate_batch(policy, problems, index, config, 0, 0, generator), args.repeats)
    batch.mask[:] = True  # train on full-length completions: the update's worst case
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=config.lr)
    policy.model.train()
    update_step(policy, optimizer, problems, config, batch)  # warm-up
    train_s, _ = _median_seconds(lambda: update_step(policy, optimizer, problems, config, batch), args.repeats)
    policy.model.eval()
    train_tokens = int(batch.mask.sum())

    print(f"tiny Qwen2 ({sum(p.numel() for p in policy.model.parameters()):,} parameters), batch {args.batch}, "
          f"{args.new_tokens} new tokens, {torch.get_num_threads()} torch threads")
    print(f"generation (sampling only): {sample_s * 1e3:.1f} ms per batch, "
          f"{sampled_tokens / sample_s:,.0f} sampled tokens/s")
    print(f"generation (RL step: sampling + behaviour log-probs + rewards): {step_s * 1e3:.1f} ms per batch, "
          f"{step_s / args.batch * 1e3:.2f} ms per completion")
    print(f"training (RL step: GRPO forward + backward + AdamW): {train_s * 1e3:.1f} ms per update, "
          f"{train_tokens / train_s:,.0f} completion tokens/s, {train_s / args.batch * 1e3:.2f} ms per completion")
    print(f"HF generation cost relative to a training step (per completion) = tiny mu (timing): "
          f"{step_s / train_s:.2f} (sampling only: {sample_s / train_s:.2f})")
    if args.window > 0:
        count = measure_mu_count(policy, problems, config, args.window)
        print(f"mu (App. E counts, {args.window:g} s window, W = T = 1): K_inference = {count['k_inference']}, "
              f"K_training = {count['k_training']}, mu = {count['mu']:.2f}")


if __name__ == "__main__":
    main()

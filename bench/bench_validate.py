"""Tiny-model throughput on this CPU: generation and training tokens per second, and the measured mu.

mu here = seconds to generate one completion / seconds to train on one completion (the Table 1
meaning), from HF-style sampling (validate.model.generate) and one GRPO update (validate.rl).
Run: `python bench/bench_validate.py [--batch 64] [--new-tokens 16]`. Needs the validate extra.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from replay_theory.validate import countdown
from replay_theory.validate.loop import TINY_MODEL
from replay_theory.validate.model import ModelConfig, encode_prompts, generate, load_policy, sequence_logprobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    problems, _ = countdown.make_splits(args.batch, 1, seed=0, num_numbers=(3,), number_range=(1, 9),
                                       target_range=(1, 40))
    policy = load_policy(ModelConfig(**TINY_MODEL), countdown.ALPHABET)
    prompts = [p.prompt_text() for p in problems]
    generator = torch.Generator().manual_seed(0)
    generate(policy, prompts, 1, args.new_tokens, 1.0, generator)  # warm up

    gen_times, gen_tokens = [], 0
    for _ in range(args.repeats):
        start = time.perf_counter()
        rollouts = generate(policy, prompts, 1, args.new_tokens, 1.0, generator)
        gen_times.append(time.perf_counter() - start)
        gen_tokens += int(rollouts.completion_mask.sum())
    ids = torch.nn.functional.pad(rollouts.completion_ids, (0, args.new_tokens - rollouts.completion_ids.shape[1]))
    mask = torch.ones_like(ids)  # train on full-length completions: the update's worst case
    prompt_ids, prompt_mask = encode_prompts(policy, prompts)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-4)
    train_times = []
    policy.model.train()
    for _ in range(args.repeats):
        start = time.perf_counter()
        logp = sequence_logprobs(policy, prompt_ids, prompt_mask, ids, mask)
        loss = -(logp * torch.randn(logp.shape[0], 1, generator=generator)).sum() / logp.numel()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        train_times.append(time.perf_counter() - start)
    gen_s, train_s = float(np.median(gen_times)), float(np.median(train_times))
    gen_tps = gen_tokens / args.repeats / gen_s
    train_tps = ids.numel() / train_s
    print(f"tiny Qwen2 ({sum(p.numel() for p in policy.model.parameters()):,} parameters), batch {args.batch}, "
          f"{args.new_tokens} new tokens, {torch.get_num_threads()} torch threads")
    print(f"generation: {gen_s * 1e3:.1f} ms per batch, {gen_tps:,.0f} sampled tokens/s")
    print(f"training:   {train_s * 1e3:.1f} ms per update, {train_tps:,.0f} completion tokens/s (forward + backward + AdamW)")
    print(f"mu (generation / update time per completion) = {gen_s / train_s:.2f}")


if __name__ == "__main__":
    main()

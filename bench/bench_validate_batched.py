"""Seeds as a batch axis in `validate verify`: sequential vs batched wall time and peak RSS, measured in one run.

Issue 23's targets: `validate verify --thorough` (16 seeds) at least 5x faster batched than one seed after another
on the 2-core CPU, and the batched run's peak RSS under 4 GiB. This script times verify's per-design work, each
mode in a fresh process (peak RSS is per process): for each of two designs (on-policy R = B = 64, and a replay
design N = 2R, B = 2R), S seeds of `steps` RL updates from one tiny-model start, then the held-out evaluation
(64 problems x 8 samples) of every seed. Sequential: `validate.rl.train` + `evaluate_policy` per seed (the
reference loop); batched: `validate.batched.stack_policy` + `train_loop` + `evaluate_policies` (what verify runs).
The two must give the same held-out numbers seed by seed (printed: "equal").

The model is the tiny Qwen2 of `validate --tiny` at random initialisation (no SFT: completions then run to
max_new_tokens, the longest case). Printed: seconds per mode, their ratio, peak RSS per mode.

Run: ``python bench/bench_validate_batched.py [--seeds 16] [--steps 96] [--threads 1]`` (--thorough-like; about
an hour sequential on a loaded 2-core machine) or ``--seeds 4 --steps 3`` for a quick check. Needs the validate extra.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

WORK = r"""
import copy, dataclasses, json, resource, sys, time, torch
mode, seeds, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
torch.use_deterministic_algorithms(True)
from replay_theory.validate import countdown
from replay_theory.validate.batched import stack_policy
from replay_theory.validate.config import TINY_MODEL, ValidateConfig
from replay_theory.validate.model import ModelConfig, load_policy
from replay_theory.validate.rl import RLConfig, evaluate_policies, evaluate_policy, train, train_loop
config = ValidateConfig()
train_set, test_set = config.problems()
warm = load_policy(ModelConfig(device="cpu", seed=0, **TINY_MODEL), countdown.ALPHABET)
R = config.rollouts_per_step
designs = [dict(buffer="on-policy", batch_size=R, capacity=R), dict(buffer="fifo", batch_size=2 * R, capacity=2 * R)]
run_seeds = [config.seed + 101 * s for s in range(seeds)]
eval_seeds = [config.seed + 1 + s for s in range(seeds)]
held_out = []
start = time.perf_counter()
for design in designs:
    rl = RLConfig(steps=steps, rollouts_per_step=R, group_size=config.group_size, lr=config.lr,
                  max_new_tokens=config.max_new_tokens, seed=config.seed, **design)
    if mode == "sequential":
        for seed, eval_seed in zip(run_seeds, eval_seeds):
            policy = dataclasses.replace(warm, model=copy.deepcopy(warm.model))
            train(policy, train_set, dataclasses.replace(rl, seed=seed), mu=config.price_mu)
            held_out.append(evaluate_policy(policy, test_set, 8, 1.0, config.max_new_tokens, seed=eval_seed))
    else:
        policy = stack_policy(warm, seeds)
        train_loop(policy, train_set, rl, run_seeds, mu=config.price_mu)
        held_out += evaluate_policies(policy, test_set, 8, 1.0, config.max_new_tokens, eval_seeds)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
print(json.dumps({"seconds": seconds, "peak_rss_mib": peak, "held_out": held_out}))
"""


def run(mode: str, seeds: int, steps: int, threads: int) -> dict:
    done = subprocess.run([sys.executable, "-c", WORK, mode, str(seeds), str(steps), str(threads)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{mode} run failed: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=16, help="seeds per design (--thorough: 16)")
    parser.add_argument("--steps", type=int, default=96, help="RL updates per run (--thorough's budget: 96)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both processes")
    args = parser.parse_args()
    for name in ("seeds", "steps", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    batched = run("batched", args.seeds, args.steps, args.threads)
    sequential = run("sequential", args.seeds, args.steps, args.threads)
    print(f"{args.seeds} seeds x 2 designs x {args.steps} updates + held-out evaluation, tiny model, "
          f"{args.threads} thread(s):")
    for name, r in (("sequential", sequential), ("batched", batched)):
        print(f"  {name:<10} {r['seconds']:8.1f} s   peak RSS {r['peak_rss_mib']:7.0f} MiB")
    print(f"  ratio sequential / batched: {sequential['seconds'] / batched['seconds']:.2f}x; held-out results "
          f"{'equal' if sequential['held_out'] == batched['held_out'] else 'DIFFERENT'} seed by seed")


if __name__ == "__main__":
    main()

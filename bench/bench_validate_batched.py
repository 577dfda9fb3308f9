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
``--device cuda`` runs both modes on the GPU (bf16 autocast, as ``validate --device cuda``) and adds each mode's peak
GPU memory; there the two modes may differ in the last bits (different kernels for a batched matmul), so the line
gives the largest held-out difference instead of asserting equality. ``bench/gpu_check.py`` calls ``run`` per mode.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

WORK = r"""
import copy, dataclasses, json, resource, sys, time, torch
mode, seeds, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
device = sys.argv[5] if len(sys.argv) > 5 else "cpu"
torch.set_num_threads(threads)
# CUDA: warn_only, since some CUDA kernels have no deterministic version (the CPU run stays strict)
torch.use_deterministic_algorithms(True, warn_only=device != "cpu")
from replay_theory.validate import countdown
from replay_theory.validate.batched import stack_policy
from replay_theory.validate.config import TINY_MODEL, ValidateConfig
from replay_theory.validate.policy import ModelConfig, load_policy
from replay_theory.validate.rl import RLConfig, evaluate_policies, evaluate_policy, train, train_loop
config = ValidateConfig()
train_set, test_set = config.problems()
warm = load_policy(ModelConfig(device=device, seed=0, **TINY_MODEL), countdown.ALPHABET)
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
gpu_peak = torch.cuda.max_memory_allocated() / 2**20 if device != "cpu" else None  # bytes -> MiB
print(json.dumps({"seconds": seconds, "peak_rss_mib": peak, "peak_gpu_mib": gpu_peak, "held_out": held_out}))
"""


def run(mode: str, seeds: int, steps: int, threads: int, device: str = "cpu", timeout: float | None = None) -> dict:
    """One mode in a fresh process: {"seconds", "peak_rss_mib", "peak_gpu_mib" (None on CPU), "held_out": [...]}."""
    env = dict(os.environ)
    if device != "cpu":  # cuBLAS needs this set before CUDA starts to run deterministically
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    done = subprocess.run([sys.executable, "-c", WORK, mode, str(seeds), str(steps), str(threads), device],
                          capture_output=True, text=True, check=False, env=env, timeout=timeout)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}, no stderr"]
        raise SystemExit(f"{mode} run failed: {lines[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def held_out_max_abs_diff(a: list[dict], b: list[dict]) -> float:
    """Largest |difference| of any held-out number (reward, pass@k, ...) between two runs, seed by seed."""
    if len(a) != len(b) or any(x.keys() != y.keys() for x, y in zip(a, b)):
        raise ValueError("the two runs hold different seeds or metrics")
    return max((abs(float(x[k]) - float(y[k])) for x, y in zip(a, b) for k in x), default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=16, help="seeds per design (--thorough: 16)")
    parser.add_argument("--steps", type=int, default=96, help="RL updates per run (--thorough's budget: 96)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both processes")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N): where both modes run")
    args = parser.parse_args()
    for name in ("seeds", "steps", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    if args.device != "cpu" and not args.device.startswith("cuda"):
        parser.error(f"--device must be cpu or cuda (cuda:N), got {args.device!r}")
    batched = run("batched", args.seeds, args.steps, args.threads, args.device)
    sequential = run("sequential", args.seeds, args.steps, args.threads, args.device)
    print(f"{args.seeds} seeds x 2 designs x {args.steps} updates + held-out evaluation, tiny model, "
          f"{args.threads} thread(s){'' if args.device == 'cpu' else ', ' + args.device}:")
    for name, r in (("sequential", sequential), ("batched", batched)):
        gpu = "" if r.get("peak_gpu_mib") is None else f"   peak GPU {r['peak_gpu_mib']:7.0f} MiB"
        print(f"  {name:<10} {r['seconds']:8.1f} s   peak RSS {r['peak_rss_mib']:7.0f} MiB{gpu}")
    equal = sequential["held_out"] == batched["held_out"]
    gap = held_out_max_abs_diff(sequential["held_out"], batched["held_out"])
    differ = "" if equal else f" (max |difference| {gap:.3g})"
    print(f"  ratio sequential / batched: {sequential['seconds'] / batched['seconds']:.2f}x; held-out results "
          f"{'equal' if equal else 'DIFFERENT'} seed by seed{differ}")


if __name__ == "__main__":
    main()

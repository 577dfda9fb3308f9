"""What overlapping generation with the update buys on the language model: wall time per update of a one-step-off
trainer (stale-k, k = 1) with its generation in a worker process beside the update, against the synchronous runs a
user would run instead, all measured in one run.

Issue 40 ("bounded staleness buys time, not compute"); docs/THEORY.md [T1] prices it: with the pool's work perfectly
divisible between generation and training, an overlapped step takes as long as a synchronous one (mu R + B), and
overlap gains only where one side cannot use its whole share (the latency floor). On a CPU, the "pool" is the cores:
the overlapped run gives generation one core (a worker process with one torch thread) and the update the other; the
synchronous runs use one thread (the validator's default, ``--threads 1``) or both.

Cells, each in a fresh process on the same SFT warm start, each after a two-step warm-up run:

1. on-policy, 2 threads   2. on-policy, 1 thread   3. 1-step-off, 2 threads   4. 1-step-off, 1 thread
5. 1-step-off overlapped: 1 trainer thread + a generation worker with 1 thread (``train(..., generation_threads=1)``)

Cells 3-5 must give the same rewards and metrics bit for bit (checked: a digest of every step's metrics), so the
only difference is time. Printed: each cell's seconds per update (end to end, generation, update, weight copies),
the speed-up of 5 over 1-4, and what the measured one-thread parts would give with a perfect overlap
(max(generation, update + copy) per step). Timings are minima over --repeats runs; ratios are between numbers of this
one run.

Run: ``python bench/bench_overlap.py [--steps 12] [--repeats 2]``. Needs the validate extra.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

WARM = r"""
import sys, torch
from replay_theory.validate import countdown
from replay_theory.validate.config import TINY_MODEL, ValidateConfig
from replay_theory.validate.policy import ModelConfig, load_policy
from replay_theory.validate.sft import sft_warm_start
torch.set_num_threads(2)
train_set, _ = ValidateConfig().problems()
policy = load_policy(ModelConfig(device="cpu", seed=0, **TINY_MODEL), countdown.ALPHABET)
sft_warm_start(policy, [(p.prompt_text(), countdown.solve(p)) for p in train_set], steps=int(sys.argv[2]),
               batch_size=64, lr=3e-3, generator=torch.Generator().manual_seed(0))
torch.save(policy.model.state_dict(), sys.argv[1])
"""

CELL = r"""
import copy, hashlib, json, sys, torch
from replay_theory.validate import countdown
from replay_theory.validate.config import TINY_MODEL, ValidateConfig
from replay_theory.validate.policy import ModelConfig, load_policy
from replay_theory.validate.rl import RLConfig, train

if __name__ == "__main__":
    weights, buffer, threads, workers, steps, repeats = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    train_set, _ = ValidateConfig().problems()
    policy = load_policy(ModelConfig(device="cpu", seed=0, **TINY_MODEL), countdown.ALPHABET)
    policy.model.load_state_dict(torch.load(weights, weights_only=True))
    design = dict(rollouts_per_step=64, batch_size=64, group_size=8, loss="grpo", lr=3e-4, max_new_tokens=24)
    if buffer == "stale-k":
        design.update(buffer="stale-k", stale_k=1)
    train(copy.deepcopy(policy), train_set, RLConfig(steps=2, **design), mu=1.0, generation_threads=workers)
    best = None
    for _ in range(repeats):
        result = train(copy.deepcopy(policy), train_set, RLConfig(steps=steps, **design), mu=1.0,
                       generation_threads=workers)
        cell = {"wall": result.wall_seconds, "generation": result.generation_seconds,
                "update": result.update_seconds, "sync": result.sync_seconds,
                "reward": sum(m["reward"] for m in result.metrics) / steps,
                "digest": hashlib.sha256(json.dumps(result.metrics, sort_keys=True).encode()).hexdigest()[:16]}
        best = cell if best is None or cell["wall"] < best["wall"] else best
    print(json.dumps(best))
"""

CELLS = (("on-policy, 2 threads", "on-policy", 2, 0), ("on-policy, 1 thread", "on-policy", 1, 0),
         ("1-step-off, 2 threads", "stale-k", 2, 0), ("1-step-off, 1 thread", "stale-k", 1, 0),
         ("1-step-off overlapped, 1 + 1", "stale-k", 1, 1))


def run(script: str, *args) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    with tempfile.TemporaryDirectory() as scratch:  # the cell's script as a file: the worker process re-imports it
        path = Path(scratch) / "cell.py"
        path.write_text(script)
        done = subprocess.run([sys.executable, str(path), *map(str, args)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"a cell failed:\n{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="measured updates per cell (1 to 200)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per cell, the fastest kept (1 to 10)")
    parser.add_argument("--sft-steps", type=int, default=150, help="SFT warm-start steps (1 to 2000)")
    args = parser.parse_args()
    for name, value, high in (("--steps", args.steps, 200), ("--repeats", args.repeats, 10),
                              ("--sft-steps", args.sft_steps, 2000)):
        if not 1 <= value <= high:
            parser.exit(2, f"{name} must be an integer in [1, {high}], got {value}\n")
    print(f"{os.cpu_count()} cores; tiny Qwen2, R = B = 64 (8 groups of 8), 24 new tokens, {args.steps} updates a "
          f"cell, fastest of {args.repeats}")
    with tempfile.TemporaryDirectory() as scratch:
        weights = Path(scratch) / "warm.pt"
        run(WARM, weights, args.sft_steps)
        cells = {name: json.loads(run(CELL, weights, buffer, threads, workers, args.steps, args.repeats))
                 for name, buffer, threads, workers in CELLS}
    print(f"{'cell':<30} {'s / update':>10} {'generation':>10} {'update':>8} {'copy':>7} {'reward':>7}  digest")
    for name, c in cells.items():
        per = {k: c[k] / args.steps for k in ("wall", "generation", "update", "sync")}
        print(f"{name:<30} {per['wall']:10.4f} {per['generation']:10.4f} {per['update']:8.4f} {per['sync']:7.4f} "
              f"{c['reward']:7.4f}  {c['digest']}")
    stale = [cells[n]["digest"] for n, b, _, _ in CELLS if b == "stale-k"]
    print(f"1-step-off cells give the same metrics bit for bit: {'yes' if len(set(stale)) == 1 else 'NO'}")
    overlapped = cells[CELLS[-1][0]]["wall"]
    for name in list(cells)[:-1]:
        print(f"overlapped speed-up over {name}: {cells[name]['wall'] / overlapped:.2f}x")
    one = cells["1-step-off, 1 thread"]
    ideal = max(one["generation"], one["update"] + cells[CELLS[-1][0]]["sync"])
    print(f"a perfect overlap of the 1-thread parts, max(generation, update + copy): {ideal / args.steps:.4f} s / "
          f"update, {cells['1-step-off, 2 threads']['wall'] / ideal:.2f}x over 2 threads synchronous "
          f"(docs/THEORY.md [T1] prices 1.00x without a latency floor: the pool's work is divisible)")


if __name__ == "__main__":
    main()

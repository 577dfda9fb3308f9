"""Which --threads default for `replay-theory validate`: tiny-model SFT + RL steps at 1 and 2 torch threads,
on an idle machine and with one other CPU-bound process running, measured in one run.

Issue 13: torch's default (one thread per core) stalled `validate calibrate` on a 2-core machine with other work
running (the measurements: docs/VALIDATION.md, 'Speed on a shared machine').
This script reproduces the comparison so the default (`ValidateConfig.threads = 1`) rests on a measurement:
each cell runs in a fresh process (a thread count is fixed per process), the busy cells next to a
`python -c "while True: pass"` process, and the ratio 2-thread / 1-thread seconds is printed per load.

Run: ``python bench/bench_validate_threads.py [--sft-steps 20] [--rl-steps 5]``. Needs the validate extra.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

WORK = r"""
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
from replay_theory.validate import countdown
from replay_theory.validate.config import TINY_MODEL, ValidateConfig
from replay_theory.validate.policy import ModelConfig, load_policy
from replay_theory.validate.rl import RLConfig, train
from replay_theory.validate.sft import sft_warm_start
config = ValidateConfig()
train_set, _ = config.problems()
policy = load_policy(ModelConfig(device="cpu", seed=0, **TINY_MODEL), countdown.ALPHABET)
examples = [(p.prompt_text(), countdown.solve(p)) for p in train_set]
start = time.perf_counter()
sft_warm_start(policy, examples, steps=int(sys.argv[2]), batch_size=64, lr=3e-3,
               generator=torch.Generator().manual_seed(0))
sft = time.perf_counter() - start
start = time.perf_counter()
train(policy, train_set, RLConfig(steps=int(sys.argv[3]), rollouts_per_step=64, batch_size=64, capacity=64))
rl = time.perf_counter() - start
print(json.dumps({"sft_s": sft, "rl_s": rl}))
"""


def measure(threads: int, sft_steps: int, rl_steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", WORK, str(threads), str(sft_steps), str(rl_steps)], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sft-steps", type=int, default=20)
    parser.add_argument("--rl-steps", type=int, default=5)
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; {args.sft_steps} SFT steps + {args.rl_steps} RL steps (R = B = 64) per cell")
    for load in ("idle", "one busy process"):
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load != "idle" else None
        try:
            time.sleep(0.5 if busy else 0)
            cells = {threads: measure(threads, args.sft_steps, args.rl_steps) for threads in (1, 2)}
        finally:
            if busy:
                busy.kill()
                busy.wait()
        for threads, cell in cells.items():
            print(f"{load:<17} {threads} thread(s): SFT {cell['sft_s']:6.2f} s, RL {cell['rl_s']:6.2f} s")
        total = {t: c["sft_s"] + c["rl_s"] for t, c in cells.items()}
        print(f"{load:<17} 2 threads / 1 thread = {total[2] / total[1]:.2f}x")


if __name__ == "__main__":
    main()

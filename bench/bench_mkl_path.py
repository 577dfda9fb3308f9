"""What pinning MKL to its AVX2 code path costs: a matrix-product pair and RL steps of the tiny model, per code path.

The package sets ``MKL_CBWR=AVX2,STRICT`` before torch loads MKL (``replay_theory/__init__.py``): results then do not
depend on the thread count, and are the same on any AVX2 machine. This script measures what that costs against
MKL's AVX-512 path (``AVX512,STRICT``: also thread-count independent, but only on AVX-512 machines) and MKL's own
choice (unset, which is not reproducible across thread counts). Each measurement runs in a fresh process (MKL reads
the variable once), the code paths interleaved over ``--rounds``; printed: the best time per path and its ratio to
AVX2,STRICT.

- product pair: (2304 x 96) @ (96 x 192) then @ (192 x 96), the shapes of one update's MLP on the tiny model
  (64 completions x 36 tokens, hidden 96, intermediate 192);
- RL steps: ``--steps`` on-policy GRPO updates (R = B = 64) of the tiny model from its random initialisation, one
  thread, as verify trains them.

Run: ``python bench/bench_mkl_path.py [--rounds 3] [--steps 3]`` (about a minute). Needs the validate extra.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from replay_theory.checks import require_integer

PATHS = ("AVX2,STRICT", "AVX512,STRICT", "")  # "": unset, MKL picks
HERE = Path(__file__).resolve().parent


def _batched_bench():
    """``bench/bench_validate_batched.py`` as a module (bench/ is not a package): its tiny on-policy run's lines."""
    path = HERE / "bench_validate_batched.py"
    spec = importlib.util.spec_from_file_location("bench_validate_batched", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no Python module loader for {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WORK = r"""
import json, sys, time
import replay_theory  # sets MKL_CBWR's default (AVX2,STRICT) only when the variable is absent
import torch
torch.set_num_threads(1)
steps = int(sys.argv[1])
gen = torch.Generator().manual_seed(0)
x, w1, w2 = (torch.randn(*s, generator=gen) for s in ((2304, 96), (192, 96), (96, 192)))
def pair():
    return torch.nn.functional.linear(torch.nn.functional.linear(x, w1), w2)
for _ in range(20):
    pair()
best = float("inf")
for _ in range(5):
    start = time.perf_counter()
    for _ in range(200):
        pair()
    best = min(best, (time.perf_counter() - start) / 200)
""" + _batched_bench().TINY_ON_POLICY + r"""
start = time.perf_counter()
train(warm, train_set, rl, mu=config.price_mu)
print(json.dumps({"pair_ms": 1e3 * best, "steps_s": time.perf_counter() - start}))
"""


def run(path: str, steps: int) -> dict:
    """One fresh process with ``MKL_CBWR=path`` ("" removes the variable): {"pair_ms", "steps_s"}."""
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    if path:
        env["MKL_CBWR"] = path
    done = subprocess.run([sys.executable, "-c", WORK, str(steps)], capture_output=True, text=True, check=False,
                          env=env)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}, no stderr"]
        raise SystemExit(f"MKL_CBWR={path or '(unset)'} run failed: {lines[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per code path (best is kept)")
    parser.add_argument("--steps", type=int, default=3, help="RL updates per measurement")
    args = parser.parse_args()
    for name in ("rounds", "steps"):
        try:
            require_integer(f"--{name}", getattr(args, name), 1)
        except ValueError as err:
            parser.error(str(err))
    best = {path: {"pair_ms": float("inf"), "steps_s": float("inf")} for path in PATHS}
    for _ in range(args.rounds):
        for path in PATHS:
            result = run(path, args.steps)
            best[path] = {k: min(best[path][k], result[k]) for k in best[path]}
    base = best[PATHS[0]]
    print(f"MKL code path, best of {args.rounds} interleaved rounds, 1 thread, {os.cpu_count()} cores:")
    for path in PATHS:
        b = best[path]
        print(f"  {path or '(unset)':<14} product pair {b['pair_ms']:6.3f} ms ({base['pair_ms'] / b['pair_ms']:.2f}x)"
              f"   {args.steps} RL steps {b['steps_s']:6.2f} s ({base['steps_s'] / b['steps_s']:.2f}x)")
    print("  (x: AVX2,STRICT's time / the path's; above 1 is faster than the package's pinned path)")


if __name__ == "__main__":
    main()

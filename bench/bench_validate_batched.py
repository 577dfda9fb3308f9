"""Speeding up `validate verify`: sequential vs batched vs worker processes, wall time and peak RSS, in one run.

Issue 23's targets: `validate verify --thorough` (16 seeds) at least 5x faster than one seed after another
on the 2-core CPU, and the batched run's peak RSS under 4 GiB. This script times verify's per-design work, each
mode in a fresh process (peak RSS is per process): for each of two designs (on-policy R = B = 64, and a replay
design N = 2R, B = 2R), S seeds of `steps` RL updates from one tiny-model start, then the held-out evaluation
(64 problems x 8 samples) of every seed. Sequential: `validate.rl.train` + `evaluate_policy` per seed (the
reference loop); batched: `validate.batched.stack_policy` + `train_loop` + `evaluate_policies` (what verify runs).
The two must give the same held-out numbers seed by seed (printed: "equal").

The model is the tiny Qwen2 of `validate --tiny` at random initialisation (no SFT: completions then run to
max_new_tokens, the longest case). Printed: seconds per mode, their ratio, peak RSS per mode.

A third mode, ``--jobs J`` (default 2), runs the sequential loop's runs in J worker processes
(``core/jobs.py``), as ``validate verify --jobs J`` does.

``--profile`` instead prints where a step's time goes, sequential and batched (cProfile, CPU, one thread): ms per
seed-step, in matrix products, in the backward pass, and the share inside built-in (C) calls.

Run: ``python bench/bench_validate_batched.py [--seeds 16] [--steps 96] [--threads 1] [--jobs 2]``
(--thorough-like; about an hour sequential on a loaded 2-core machine) or ``--seeds 4 --steps 3`` for a quick
check. Needs the validate extra. ``--device cuda`` runs every mode on the GPU (bf16 autocast, as ``validate
--device cuda``) and adds each mode's peak GPU memory; there the modes may differ in the last bits (different kernels
for a batched matmul), so the line gives the largest held-out difference instead of asserting equality.
On CUDA each mode first compiles the decode step (``validate/sampling.py``: once per process, as a verify does) on a
held-out warm-up, outside the clock; ``compile_s`` is what new shapes cost inside it, ``window`` the clock's epoch
span (gpu_check reads the GPU's busy fraction over it). ``bench/gpu_check.py`` calls ``run`` per mode.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from replay_theory.checks import require_integer

WORK = r"""
import copy, dataclasses, json, resource, sys, time, torch
mode, seeds, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
device = sys.argv[5] if len(sys.argv) > 5 else "cpu"
jobs = int(sys.argv[6]) if len(sys.argv) > 6 else 1


def setup():
    torch.set_num_threads(threads)
    # CUDA: warn_only, since some CUDA kernels have no deterministic version (the CPU run stays strict)
    torch.use_deterministic_algorithms(True, warn_only=device != "cpu")
    from replay_theory.validate import countdown
    from replay_theory.validate.config import TINY_MODEL, ValidateConfig
    from replay_theory.validate.policy import ModelConfig, load_policy
    config = ValidateConfig()
    warm = load_policy(ModelConfig(device=device, seed=0, **TINY_MODEL), countdown.ALPHABET)
    return config, config.problems(), warm


def rl_config(config, design):
    from replay_theory.validate.rl import RLConfig
    return RLConfig(steps=steps, rollouts_per_step=config.rollouts_per_step, group_size=config.group_size,
                    lr=config.lr, max_new_tokens=config.max_new_tokens, seed=config.seed, **design)


def one_seed(design, seed, eval_seed):
    # what verify's one-seed-at-a-time loop does per run (validate.loop._train_one), in whichever process runs it
    from replay_theory.validate.rl import evaluate_policy, train
    config, (train_set, test_set), warm = setup()
    policy = dataclasses.replace(warm, model=copy.deepcopy(warm.model))
    train(policy, train_set, dataclasses.replace(rl_config(config, design), seed=seed), mu=config.price_mu)
    return evaluate_policy(policy, test_set, 8, 1.0, config.max_new_tokens, seed=eval_seed)


config, (train_set, test_set), warm = setup()
R = config.rollouts_per_step
designs = [dict(buffer="on-policy", batch_size=R, capacity=R), dict(buffer="fifo", batch_size=2 * R, capacity=2 * R)]
run_seeds = [config.seed + 101 * s for s in range(seeds)]
eval_seeds = [config.seed + 1 + s for s in range(seeds)]
runs = [(design, seed, eval_seed) for design in designs for seed, eval_seed in zip(run_seeds, eval_seeds)]
held_out = []
from replay_theory.validate.sampling import compile_seconds
if device != "cpu" and mode != "jobs":  # compile the decode step before the clock: once per process, as in a verify
    from replay_theory.validate.batched import stack_policy
    from replay_theory.validate.rl import evaluate_policies, evaluate_policy
    if mode == "sequential":
        evaluate_policy(warm, test_set[:8], 8, 1.0, config.max_new_tokens, seed=0)  # (64 rows: a training batch)
    else:
        evaluate_policies(stack_policy(warm, seeds), test_set[:8], 8, 1.0, config.max_new_tokens, eval_seeds)
    torch.cuda.synchronize()
compiled_before = compile_seconds()
window_start = time.time()
start = time.perf_counter()
if mode == "sequential":
    held_out = [one_seed(*run) for run in runs]
elif mode == "jobs":  # verify --jobs: the same loop, its runs spread over worker processes (core/jobs.py)
    from replay_theory.core.jobs import run_unordered
    indexed = [(i, *run) for i, run in enumerate(runs)]
    done = dict(run_unordered(lambda i, *run: (i, one_seed(*run)), indexed, jobs))
    held_out = [done[i] for i in range(len(runs))]
else:
    from replay_theory.validate.batched import stack_policy
    from replay_theory.validate.rl import evaluate_policies, train_loop
    for design in designs:
        policy = stack_policy(warm, seeds)
        train_loop(policy, train_set, rl_config(config, design), run_seeds, mu=config.price_mu)
        held_out += evaluate_policies(policy, test_set, 8, 1.0, config.max_new_tokens, eval_seeds)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux); the main process only
gpu_peak = torch.cuda.max_memory_allocated() / 2**20 if device != "cpu" else None  # bytes -> MiB
compiling = compile_seconds() - compiled_before  # new shapes met inside the clock (graphs recorded, compiles)
print(json.dumps({"seconds": seconds, "compile_s": compiling, "window": [window_start, time.time()],
                  "peak_rss_mib": peak, "peak_gpu_mib": gpu_peak, "held_out": held_out}))
"""


TINY_ON_POLICY = r"""
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
from replay_theory.validate import countdown
from replay_theory.validate.config import TINY_MODEL, ValidateConfig
from replay_theory.validate.policy import ModelConfig, load_policy
from replay_theory.validate.rl import RLConfig, train
config = ValidateConfig()
train_set, _ = config.problems()
warm = load_policy(ModelConfig(device="cpu", seed=0, **TINY_MODEL), countdown.ALPHABET)
R = config.rollouts_per_step
rl = RLConfig(steps=steps, rollouts_per_step=R, group_size=config.group_size, lr=config.lr, buffer="on-policy",
              batch_size=R, capacity=R, max_new_tokens=config.max_new_tokens, seed=config.seed)
"""
"""Script lines (``torch`` and ``steps`` defined before them): the tiny model at its random initialisation
(``warm``), one thread, and ``rl``: ``steps`` on-policy GRPO updates at R = B = 64 (also ``bench_mkl_path.py``'s)."""

PROFILE = r"""
import copy, cProfile, dataclasses, json, pstats, sys, time, torch
mode, seeds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
""" + TINY_ON_POLICY + r"""
from replay_theory.validate.batched import stack_policy
from replay_theory.validate.rl import train_loop
run_seeds = [config.seed + 101 * s for s in range(seeds)]
profile = cProfile.Profile()
start = time.perf_counter()
profile.enable()
if mode == "sequential":
    for seed in run_seeds:
        policy = dataclasses.replace(warm, model=copy.deepcopy(warm.model))
        train(policy, train_set, dataclasses.replace(rl, seed=seed), mu=config.price_mu)
else:
    train_loop(stack_policy(warm, seeds), train_set, rl, run_seeds, mu=config.price_mu)
profile.disable()
seconds = time.perf_counter() - start
stats = pstats.Stats(profile).stats  # (file, line, name) -> (calls, primitive calls, tottime, cumtime, callers)
inside_c = sum(v[2] for k, v in stats.items() if k[0] == "~")  # built-ins: torch's C calls, numpy's, Python's own
total = sum(v[2] for v in stats.values())
def named(*names):
    return sum(v[2] for k, v in stats.items() if k[0] == "~" and any(n in k[2] for n in names))
per = 1e3 / (seeds * steps)  # seconds -> ms per seed-step
print(json.dumps({"ms_per_seed_step": per * seconds, "products_ms": per * named("_nn.linear", "torch.bmm",
                  "torch.baddbmm"), "backward_ms": per * named("run_backward"), "inside_c": inside_c / total}))
"""


def profile(mode: str, seeds: int, steps: int) -> dict:
    """``mode`` (sequential or batched) of on-policy GRPO under cProfile in a fresh process, one thread:
    {"ms_per_seed_step", "products_ms" (matrix products), "backward_ms", "inside_c" (share of the profiled time in
    built-in calls)}."""
    done = subprocess.run([sys.executable, "-c", PROFILE, mode, str(seeds), str(steps)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}, no stderr"]
        raise SystemExit(f"{mode} profile failed: {lines[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])

def run(mode: str, seeds: int, steps: int, threads: int, device: str = "cpu", timeout: float | None = None,
        jobs: int = 1) -> dict:
    """One mode in a fresh process: {"seconds", "peak_rss_mib", "peak_gpu_mib" (None on CPU), "held_out": [...]}."""
    env = dict(os.environ)
    if device != "cpu":  # cuBLAS needs this set before CUDA starts to run deterministically
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    done = subprocess.run([sys.executable, "-c", WORK, mode, str(seeds), str(steps), str(threads), device, str(jobs)],
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
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seeds", type=int, default=16, help="seeds per design (--thorough: 16)")
    parser.add_argument("--steps", type=int, default=96, help="RL updates per run (--thorough's budget: 96)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every process")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes of the --jobs mode (verify --jobs)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N): where every mode runs")
    parser.add_argument("--profile", action="store_true", help="instead: where a step's time goes (cProfile, CPU, "
                        "on-policy GRPO, --seeds seeds x --steps updates, sequential and batched)")
    args = parser.parse_args()
    for name in ("seeds", "steps", "threads", "jobs"):
        try:
            require_integer(f"--{name}", getattr(args, name), 1)
        except ValueError as err:
            parser.error(str(err))
    if args.device != "cpu" and not args.device.startswith("cuda"):
        parser.error(f"--device must be cpu or cuda (cuda:N), got {args.device!r}")
    if args.profile:
        print(f"cProfile, on-policy GRPO (R = B = 64), {args.seeds} seeds x {args.steps} updates, 1 thread, "
              f"per seed-step:")
        for mode in ("sequential", "batched"):
            r = profile(mode, args.seeds, args.steps)
            print(f"  {mode:<10} {r['ms_per_seed_step']:6.0f} ms   matrix products {r['products_ms']:5.0f} ms   "
                  f"backward {r['backward_ms']:5.0f} ms   inside built-in (C) calls {100 * r['inside_c']:3.0f}%")
        return
    results = {"sequential": run("sequential", args.seeds, args.steps, args.threads, args.device),
               "batched": run("batched", args.seeds, args.steps, args.threads, args.device),
               f"--jobs {args.jobs}": run("jobs", args.seeds, args.steps, args.threads, args.device, jobs=args.jobs)}
    print(f"{args.seeds} seeds x 2 designs x {args.steps} updates + held-out evaluation, tiny model, "
          f"{args.threads} thread(s) per process{'' if args.device == 'cpu' else ', ' + args.device}, "
          f"{os.cpu_count()} cores:")
    sequential = results["sequential"]
    for name, r in results.items():
        gpu = "" if r.get("peak_gpu_mib") is None else f"   peak GPU {r['peak_gpu_mib']:7.0f} MiB"
        gap = held_out_max_abs_diff(sequential["held_out"], r["held_out"])
        same = "equal seed by seed" if sequential["held_out"] == r["held_out"] else f"max |difference| {gap:.3g}"
        print(f"  {name:<10} {r['seconds']:8.1f} s   {sequential['seconds'] / r['seconds']:5.2f}x   peak RSS "
              f"{r['peak_rss_mib']:7.0f} MiB{gpu}   held-out results: {same}")
    print("  (x: sequential seconds / the mode's; --jobs' peak RSS is its main process, each worker holds one "
          "sequential run)")


if __name__ == "__main__":
    main()

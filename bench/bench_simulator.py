"""Simulator speed and memory against the issue-3 targets, all measured in one run.

1. Speed-up of the vectorised engine (``simulate.engine.run``) over the plain
   per-seed Python loop (``experiments.naive.run_naive_fifo_bandit``) on the same
   64-seed synchronous FIFO bandit run (target >= 50x), after checking on a
   small case that both give the same parameters and evaluation curves.
2. A 27-configuration x 16-seed x 500-step bandit sweep through
   ``simulate.sweep.run_sweep`` (n_jobs=-1): wall time (target <= 60 s), the
   fraction of the machine's peak throughput it reaches (peak = the same 27
   configurations run in-process pinned to one core, same steps, times the
   core count) and the CPU utilisation (CPU time / (wall * cores)).
3. Memory of a FIFO buffer of 20,000 token-MDP rollouts (L = 32) for 64 seeds
   (target <= 2 GiB), and the peak RSS of a fresh process that fills it.

Timings are minima over repeats (these machines are shared and noisy); every
ratio is taken between numbers measured in this one run.
Run: ``python bench/bench_simulator.py [--quick]`` (``--quick``: a < 30 s smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

from replay_theory.experiments.naive import run_naive_fifo_bandit
from replay_theory.simulate import engine, optim
from replay_theory.simulate.config import SimConfig

SPEEDUP_TARGET = 50.0
SWEEP_TARGET_S = 60.0
MEMORY_TARGET = 2 * 1024**3
GiB = 1024**3


def verdict(ok: bool) -> str:
    return "OK" if ok else "OVER TARGET"


def timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def cores() -> int:
    return os.cpu_count() or 1


# --------------------------------------------------------------------------- 1. engine vs naive


def engine_params(config: SimConfig) -> tuple[engine.RunResult, np.ndarray]:
    """engine.run(config) and its final params (RunResult has none: caught from the optimiser's last step)."""
    last = {}
    base = optim.OPTIMIZERS[config.optimizer]

    class Recording(base):  # type: ignore[valid-type, misc]
        def step(self, params, grad):
            last["params"] = super().step(params, grad)
            return last["params"]

    optim.OPTIMIZERS[config.optimizer] = Recording
    try:
        result = engine.run(config)
    finally:
        optim.OPTIMIZERS[config.optimizer] = base
    return result, last["params"]


def check_agreement() -> tuple[bool, str]:
    small = SimConfig(env="bandit", pipeline="sync", buffer="fifo", loss="grpo", advantage="grpo", seeds=3, steps=12,
                      rollouts_per_step=16, group_size=4, capacity=48, batch_size=24, num_prompts=16, eval_every=5)
    worst = 0.0
    ok = True
    for changes in ({"replacement": True}, {"replacement": False, "batch_size": 16}):
        config = small.with_updates(**changes)
        result, params = engine_params(config)
        naive = run_naive_fifo_bandit(config)
        for got, want in ((naive["params"], params), (naive["reward"], result.evals["reward"])):
            ok &= bool(np.allclose(got, want, rtol=1e-9, atol=1e-12))
            worst = max(worst, float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-12))))
    return ok, f"max relative difference {worst:.1e} (rtol 1e-9)"


def section_engine_vs_naive(quick: bool) -> None:
    # The naive loop is a loop over seeds: its time is exactly linear in the seed count, so it runs
    # every step (the same share of evaluation steps as the engine) on a few seeds, scaled up.
    seeds, steps, naive_seeds = (16, 20, 2) if quick else (64, 100, 4)
    repeats = 1 if quick else 2
    engine_repeats = 1 if quick else 7  # a run is ~0.2-0.5 s: more repeats find the quiet moments of a noisy machine
    ok, text = check_agreement()
    print(f"1. engine vs naive loop: FIFO bandit, {seeds} seeds, {steps} steps, G = 8, N = 4R, B = R")
    print(f"   agreement on a small case (3 seeds, 12 steps, with and without replacement): {text}: "
          f"{'OK' if ok else 'OVER TARGET (results differ)'}")
    for R in ((64,) if quick else (64, 256)):
        config = SimConfig(env="bandit", pipeline="sync", buffer="fifo", loss="grpo", advantage="grpo", seeds=seeds,
                           steps=steps, rollouts_per_step=R, group_size=8, capacity=4 * R, batch_size=R)
        engine.run(config.with_updates(steps=2))  # warm imports and caches
        t_engine = timed(lambda config=config: engine.run(config), engine_repeats)
        t_engine_drift = timed(lambda config=config: engine.run(config.with_updates(measure_drift=True)),
                               engine_repeats)
        t_naive_part = timed(lambda config=config: run_naive_fifo_bandit(config.with_updates(seeds=naive_seeds)),
                             repeats)
        t_naive = t_naive_part * seeds / naive_seeds
        print(f"   R = B = {R}: naive loop {t_naive_part:.2f} s for {naive_seeds} seeds x {steps} steps, scaled "
              f"linearly to {seeds} seeds: {t_naive:.2f} s")
        ratio = t_naive / t_engine
        print(f"     engine (default config: the same work as the naive loop, plus its metrics): {t_engine:.2f} s; "
              f"speed-up {ratio:.1f}x (target >= {SPEEDUP_TARGET:.0f}x): {verdict(ratio >= SPEEDUP_TARGET)}")
        print(f"     engine with measure_drift=True (opt-in exact KL(pi_t || pi_t-lag) at 6 lags every evaluation, "
              f"work the naive loop does not do; no target): {t_engine_drift:.2f} s; "
              f"{t_naive / t_engine_drift:.1f}x the naive loop's speed")


# --------------------------------------------------------------------------- 2. the sweep


def sweep_spec(quick: bool, steps: int) -> dict:
    # Three losses whose summaries have the same keys: sweep.write_results_table takes the CSV columns from
    # the first row, so mixing in m2po (masked_frac, no pg_clipfrac) can fail at the end of the sweep.
    losses = ["grpo", "no-trust-region", "exgrpo"]
    if quick:
        grid = {"capacity": [64, 256], "batch_size": [32, 64], "loss": losses[:2]}
        seeds = 4
    else:
        grid = {"capacity": [64, 256, 1024], "batch_size": [32, 64, 128], "loss": losses}
        seeds = 16
    return {"name": "bench-simulator", "base": {"env": "bandit", "buffer": "fifo", "steps": steps, "seeds": seeds},
            "grid": grid}


def sample_updates(spec: dict) -> int:
    from replay_theory.simulate.sweep import expand_spec

    return sum(c.seeds * c.steps * c.batch_size for c in expand_spec(spec))


def cpu_seconds() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def machine_busy_jiffies() -> tuple[int, int] | None:
    """(busy, total) CPU jiffies of the whole machine since boot from /proc/stat (None off Linux)."""
    try:
        with open("/proc/stat") as handle:
            values = [int(x) for x in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


def single_core_peak(spec: dict) -> tuple[float, float, float, str]:
    """The spec's configurations run in-process on one core: (sample-updates per CPU second, CPU s, wall s, note).

    Throughput per CPU second, not per wall second: the kernel's cost on one core
    without the time other tenants of a shared machine take from it.
    """
    from replay_theory.simulate.sweep import expand_spec

    configs = expand_spec(spec)
    before = os.sched_getaffinity(0) if hasattr(os, "sched_setaffinity") else None  # None: no pinning on this OS
    if before is not None:
        os.sched_setaffinity(0, {min(before)})
    try:
        engine.run(configs[0].with_updates(steps=2))  # warm-up
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for config in configs:
            engine.run(config)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    finally:
        if before is not None:
            os.sched_setaffinity(0, before)
    note = "pinned to one core" if before is not None else "one process (no CPU pinning on this OS)"
    return sample_updates(spec) / cpu, cpu, wall, note


def section_sweep(quick: bool) -> None:
    from joblib.externals.loky import get_reusable_executor

    from replay_theory.simulate.sweep import expand_spec, run_sweep

    steps = 50 if quick else 500
    peak_steps = steps  # per-step cost grows while buffers fill: the peak must run the same steps
    spec = sweep_spec(quick, steps)
    configs = expand_spec(spec)
    n_cores = cores()
    work = sample_updates(spec)
    print(f"2. sweep: {len(configs)} configurations x {configs[0].seeds} seeds x {steps} steps "
          f"(capacity x batch size x loss grid), run_sweep n_jobs=-1 on {n_cores} cores")
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as out:
        get_reusable_executor().shutdown(wait=True)  # no leftover workers: children CPU time below is this sweep's
        self0, kids0 = cpu_seconds()
        busy0 = machine_busy_jiffies()
        start = time.perf_counter()
        run_sweep(spec, out, n_jobs=-1, show_progress=False)
        wall = time.perf_counter() - start
        busy1 = machine_busy_jiffies()
        get_reusable_executor().shutdown(wait=True)  # reap the loky workers so RUSAGE_CHILDREN counts them
        self1, kids1 = cpu_seconds()
    print(f"   wall time {wall:.1f} s (target <= {SWEEP_TARGET_S:.0f} s"
          f"{', full-size target; quick grid is smaller' if quick else ''}): {verdict(wall <= SWEEP_TARGET_S)}")
    achieved = work / wall
    peak_spec = dict(spec, base=dict(spec["base"], steps=peak_steps))
    one_core, peak_cpu, peak_wall, note = single_core_peak(peak_spec)
    peak = one_core * n_cores
    fraction = achieved / peak
    print(f"   achieved {achieved:,.0f} sample-updates/s (configs x seeds x steps x B = {work:,} in {wall:.1f} s wall)")
    print(f"   peak: the same {len(configs)} configurations at {peak_steps} steps in-process, {note}: "
          f"{peak_cpu:.1f} CPU s ({peak_wall:.1f} s wall) = {one_core:,.0f} sample-updates per CPU s "
          f"x {n_cores} cores = {peak:,.0f}/s")
    print(f"   fraction of machine peak {fraction:.0%} (achieved / peak; 100% = all cores busy with the kernel, "
          f"no overhead): {verdict(fraction >= 0.5)} (no target given; OK at >= 50%)")
    cpu = (self1 - self0) + (kids1 - kids0)
    utilisation = cpu / (wall * n_cores)
    print(f"   CPU utilisation {utilisation:.0%} = CPU {cpu:.1f} s (self {self1 - self0:.1f} s + workers "
          f"{kids1 - kids0:.1f} s) / (wall {wall:.1f} s x {n_cores} cores): {verdict(utilisation >= 0.5)} "
          f"(no target given; OK at >= 50%)")
    if busy0 and busy1 and busy1[1] > busy0[1]:
        busy = (busy1[0] - busy0[0]) / (busy1[1] - busy0[1])  # whole machine, all processes
        others = max(busy - utilisation, 0.0)
        print(f"   context: the machine was {busy:.0%} busy during the sweep (/proc/stat, all processes); "
              f"other processes took ~{others:.0%} of it")


# --------------------------------------------------------------------------- 3. memory


def memory_child(capacity: int, seeds: int, seq_len: int, chunk: int) -> dict:
    """Build and fill a FifoBuffer with token-MDP-shaped rollouts in this (fresh) process; nbytes and RSS."""
    from replay_theory.core.buffers import FifoBuffer
    from replay_theory.core.rollouts import RolloutBatch

    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    buffer = FifoBuffer(seeds, capacity, seq_len)  # the engine's dtypes
    rng = np.random.default_rng(0)
    filled = 0
    while filled < capacity:
        n = min(chunk, capacity - filled)
        batch = RolloutBatch(
            prompt=rng.integers(0, 64, size=(seeds, n)),
            tokens=rng.integers(0, 6, size=(seeds, n, seq_len)),  # token-MDP vocabulary of 6
            mask=rng.random((seeds, n, seq_len)) < 0.9,
            logp_behav=-rng.random((seeds, n, seq_len)),
            reward=rng.choice([0.0, 0.1, 1.0], size=(seeds, n)),
            advantage=rng.standard_normal((seeds, n)),
            created=np.full((seeds, n), filled // chunk, dtype=np.int64),
            group=np.broadcast_to(np.arange(filled, filled + n), (seeds, n)).copy(),
        )
        buffer.add(batch, filled // chunk)
        filled += n
    return {"nbytes": buffer.nbytes, "size": int(buffer.size.min()),
            "tokens": str(buffer.store.tokens.dtype), "logp": str(buffer.store.logp_behav.dtype),
            "rss_start": rss_start, "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def section_memory(quick: bool) -> None:
    full, seeds, seq_len = 20_000, 64, 32
    capacity = 2_000 if quick else full
    child = subprocess.run([sys.executable, __file__, "--memory-child", str(capacity), str(seeds), str(seq_len)],
                           check=True, capture_output=True, text=True)
    m = json.loads(child.stdout.strip().splitlines()[-1])
    scale = full / capacity
    nbytes_full = m["nbytes"] * scale
    print(f"3. memory: FifoBuffer of {capacity:,} token-MDP rollouts (L = {seq_len}) x {seeds} seeds, "
          f"{m['tokens']} tokens, {m['logp']} log-probs (the engine's defaults), filled in a fresh process")
    extra = f", x{scale:.0f} = {nbytes_full:,.0f} bytes for {full:,}" if quick else ""
    print(f"   buffer.nbytes {m['nbytes']:,} bytes ({m['nbytes'] / GiB:.2f} GiB){extra} "
          f"(target <= 2 GiB): {verdict(nbytes_full <= MEMORY_TARGET)}")
    rss_full = m["rss_start"] + (m["rss_peak"] - m["rss_start"]) * scale  # quick: the fill's growth scaled up
    extra = f", extrapolated to {full:,}: {rss_full / GiB:.2f} GiB" if quick else ""
    print(f"   peak RSS after filling {m['rss_peak'] / GiB:.2f} GiB (process after imports: "
          f"{m['rss_start'] / GiB:.2f} GiB{extra}; target <= 2 GiB): {verdict(rss_full <= MEMORY_TARGET)}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--memory-child":
        capacity, seeds, seq_len = (int(x) for x in sys.argv[2:5])
        print(json.dumps(memory_child(capacity, seeds, seq_len, chunk=1000)))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shrink everything for a smoke run (< 30 s)")
    args = parser.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"bench_simulator{' --quick' if args.quick else ''}: {cores()} cores, load average {load:.2f} at start")
    start = time.perf_counter()
    section_engine_vs_naive(args.quick)
    section_sweep(args.quick)
    section_memory(args.quick)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

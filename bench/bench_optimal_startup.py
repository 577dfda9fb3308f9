"""Whole-process time of `replay-theory optimal` and of the root `--help` against their import floor.

Target (issue 24): `replay-theory optimal --mu 5.28` and `replay-theory --help` each take at most 0.6x the time of
`python -c "import typer, numpy, scipy.optimize"`. Both stay under the floor because the commands are registered
lazily (cli/app.py: the root help comes from a static table, a command's module is imported when it runs),
`optimal`'s own path imports no scipy.optimize, scipy.special, sympy, matplotlib, torch or joblib (the default
noise-scale rule needs numpy only; `--objective paper` with a sigma^2 table imports scipy.optimize when it searches)
and no pydantic (typer 0.29 converts option values through it; cli/plain_values.py converts plain values itself).
Its history: docs/CONTRIBUTING.md, 'Adding to the code'.

The commands are run interleaved in one session (these machines are noisy) and the ratio of medians is printed. The
warm-up runs may write bytecode caches even under PYTHONDONTWRITEBYTECODE, as an installed package has them: else
every timed run would recompile the package's modules and the floor's (already cached) would not.
Run: `python bench/bench_optimal_startup.py [--repeats 15]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

BASELINE = [sys.executable, "-c", "import typer, numpy, scipy.optimize"]
COMMANDS = {
    "replay-theory optimal --mu 5.28": [sys.executable, "-m", "replay_theory", "optimal", "--mu", "5.28"],
    "replay-theory --help": [sys.executable, "-m", "replay_theory", "--help"],
}
TARGET_RATIO = 0.6


def wall_time(command: list[str], env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    cache_bytecode = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for command in (BASELINE, *COMMANDS.values()):  # warm the file cache and write the bytecode caches
        wall_time(command, cache_bytecode)
    times: dict[str, list[float]] = {"import typer, numpy, scipy.optimize": [], **{name: [] for name in COMMANDS}}
    for _ in range(args.repeats):
        times["import typer, numpy, scipy.optimize"].append(wall_time(BASELINE))
        for name, command in COMMANDS.items():
            times[name].append(wall_time(command))
    medians = {name: statistics.median(values) for name, values in times.items()}
    base = medians["import typer, numpy, scipy.optimize"]
    width = max(map(len, medians))
    for name, median in medians.items():
        print(f"{name:<{width}} : median {median * 1e3:7.1f} ms over {args.repeats} runs")
    for name in COMMANDS:
        ratio = medians[name] / base
        print(f"{name:<{width}} : ratio {ratio:.2f}x (target <= {TARGET_RATIO}x): "
              f"{'OK' if ratio <= TARGET_RATIO else 'OVER TARGET'}")


if __name__ == "__main__":
    main()

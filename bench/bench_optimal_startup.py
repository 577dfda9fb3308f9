"""Whole-process time of `replay-theory optimal` against its import floor.

Target (issue 2): `replay-theory optimal --mu 5.28` stays within 1.5x of
`python -c "import typer, numpy, scipy.optimize"`, i.e. it imports nothing heavy
(no sympy, matplotlib or torch) and computes in negligible time.

Both commands are run interleaved in one session (these machines are noisy) and
the ratio of medians is printed. Run: `python bench/bench_optimal_startup.py [--repeats 15]`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

BASELINE = [sys.executable, "-c", "import typer, numpy, scipy.optimize"]
OPTIMAL = [sys.executable, "-m", "replay_theory", "optimal", "--mu", "5.28"]
TARGET_RATIO = 1.5


def wall_time(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    wall_time(BASELINE), wall_time(OPTIMAL)  # warm the file cache
    baseline, optimal = [], []
    for _ in range(args.repeats):
        baseline.append(wall_time(BASELINE))
        optimal.append(wall_time(OPTIMAL))
    base_med, opt_med = statistics.median(baseline), statistics.median(optimal)
    ratio = opt_med / base_med
    print(f"import typer, numpy, scipy.optimize : median {base_med * 1e3:7.1f} ms over {args.repeats} runs")
    print(f"replay-theory optimal --mu 5.28     : median {opt_med * 1e3:7.1f} ms over {args.repeats} runs")
    print(f"ratio {ratio:.2f}x (target <= {TARGET_RATIO}x): {'OK' if ratio <= TARGET_RATIO else 'OVER TARGET'}")


if __name__ == "__main__":
    main()

"""Peak resident memory of `replay-theory validate calibrate-model` against the 2 GB target (issue 37).

Target (issue 37): an 8 GB laptop runs calibrate-model at its defaults, so its peak RSS stays within 2 GB
(2 x 10^9 bytes). The script runs the command in a child process with a new run directory and reads the child's
peak RSS from the kernel (``getrusage(RUSAGE_CHILDREN).ru_maxrss``, what ``/usr/bin/time -v`` prints as "Maximum
resident set size"), then prints it and its ratio to the target. Extra options go to calibrate-model (e.g.
``--samples 256`` to see how the peak scales: the B_noise units it holds grow with --samples, docs/VALIDATION.md,
'Memory').

Run: ``python bench/bench_calibrate_memory.py --out runs/bench-memory [extra calibrate-model options]``
(from a checkout that is not installed: ``p=$(mktemp -d) && ln -s "$PWD" $p/replay_theory && PYTHONPATH=$p python
bench/bench_calibrate_memory.py ...``).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

TARGET_BYTES = 2e9


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="New run directory.")
    args, extra = parser.parse_known_args()
    if args.out.exists():
        sys.exit(f"--out {args.out} exists; give a new directory")
    command = [sys.executable, "-m", "replay_theory", "validate", "calibrate-model", "--out", str(args.out),
               "--no-progress", *extra]
    start = time.perf_counter()
    subprocess.run(command, check=True)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux: kilobytes
    print(f"validate calibrate-model {' '.join(command[5:])}\npeak RSS {peak / 2**30:.2f} GiB = {peak / 1e9:.2f} GB "
          f"({seconds:.0f} s); {peak / TARGET_BYTES:.2f}x the 2 GB target")


if __name__ == "__main__":
    main()

"""`replay-theory validate all --tiny` end to end, with one other CPU-bound process running: the issue-13 target.

Target (issue 13): under 10 minutes on the 2-core machine with one other CPU-bound process. The script
starts a `python -c "while True: pass"` process, times the documented command into a fresh temporary
run directory (default options: --threads 1, 4 seeds, budget 48, --price-mu 5.28), stops the busy
process and prints the wall time and its ratio to the 600 s target. The run's report is kept under
``--out`` (a new directory) for inspection.

Run: ``python bench/bench_validate_all.py --out runs/bench-all [extra validate-all options]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

TARGET_SECONDS = 600.0


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="New run directory.")
    parser.add_argument("--no-busy", action="store_true", help="Start no busy process: the other CPU-bound job is "
                                                                  "already running (or measure idle).")
    args, extra = parser.parse_known_args()
    if args.out.exists():
        sys.exit(f"--out {args.out} exists; give a new directory")
    cli = shutil.which("replay-theory")
    command = [cli, "validate", "all", "--tiny", "--out", str(args.out), "--no-progress", *extra]
    busy = None if args.no_busy else subprocess.Popen([sys.executable, "-c", "while True: pass"])
    load_before = os.getloadavg()[0]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    try:
        start = time.perf_counter()
        subprocess.run(command, check=True, env=env)
        seconds = time.perf_counter() - start
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    load = "no busy process started" if args.no_busy else "one busy process started"
    print(f"{' '.join(command[1:])}\n{os.cpu_count()} cores, {load} (1-min load average {load_before:.2f} at the "
          f"start, {os.getloadavg()[0]:.2f} at the end): {seconds:.0f} s = {seconds / 60:.1f} min; "
          f"{seconds / TARGET_SECONDS:.2f}x the 10-minute target")


if __name__ == "__main__":
    main()

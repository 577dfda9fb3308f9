"""`replay-theory experiment theory-test --quick --instance K` on instances it was not developed on: the issue-38
"runs anywhere" check.

For K in 0..30 (``--first``/``--last``) the script runs the documented command at the default --jobs (every core),
each into its own new directory under ``--out``, one at a time, and prints one line per instance as it finishes
(``K exit wall-seconds``), then ``N of M exited 0``; ``OUT/times.tsv`` adds each run's CPU seconds (its workers
included), which, unlike the wall time, do not grow with other work on the machine. Exit 0 is the target for every
instance: a zero curvature pair, a B_noise fitted at 0 or a rule without a pick is said in the table and counted,
never fatal. A run that did not exit 0 keeps its output in ``OUT/K.log``; every run's table and summary.json stay in
``OUT/K/`` for inspection.

Run: ``python bench/theory_test_instances.py --out runs/theory-test-instances [--first 0 --last 30]
[extra theory-test options]``. The target for one --quick run is at most two minutes; 31 of them take a while, so
start it under nohup.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path


def _children_cpu() -> float:
    """User + system CPU seconds of the finished child processes (the run and its workers), so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="New directory: one run directory per instance.")
    parser.add_argument("--first", type=int, default=0, help="First instance (default 0).")
    parser.add_argument("--last", type=int, default=30, help="Last instance, included (default 30).")
    args, extra = parser.parse_known_args()
    if args.out.exists():
        sys.exit(f"--out {args.out} exists; give a new directory")
    if not 0 <= args.first <= args.last:
        sys.exit(f"--first and --last must satisfy 0 <= first <= last, got {args.first}, {args.last}")
    args.out.mkdir(parents=True)
    instances = range(args.first, args.last + 1)
    passed = 0
    for k in instances:
        # the package this interpreter imports (an editable install or PYTHONPATH), not whichever replay-theory is
        # first on PATH
        command = [sys.executable, "-m", "replay_theory", "experiment", "theory-test", "--quick", "--instance",
                   str(k), "--out", str(args.out / str(k)), "--no-progress", *extra]
        start, cpu_start = time.perf_counter(), _children_cpu()
        done = subprocess.run(command, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - start, _children_cpu() - cpu_start
        if done.returncode == 0:
            passed += 1
        else:
            (args.out / f"{k}.log").write_text(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}")
        print(f"{k} {done.returncode} {wall:.0f}", flush=True)
        with open(args.out / "times.tsv", "a") as times:  # CPU seconds beside wall: wall alone moves with the load
            times.write(f"{k}\t{done.returncode}\t{wall:.1f}\t{cpu:.1f}\n")
    print(f"{passed} of {len(instances)} exited 0", flush=True)


if __name__ == "__main__":
    main()

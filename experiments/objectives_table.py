"""Every objective's share within 1.2x and worst regret by latency floor, from finished benchmark runs (issue 38): the
tables of docs/SIMULATION.md's "Does a design rule predict?", with the printed answer's and the trivial floor rule's
geometric-mean regret per floor under each.

    python -m replay_theory.experiments.objectives_table RUN_DIR [RUN_DIR ...] [--every-instance]

Reads ``RUN_DIR/summary.json`` (``replay-theory experiment theory-test --out RUN_DIR``); held-out instances only unless
``--every-instance``. Symbols: regret = measured compute / the whole grid's least (``theory_bench/score.py``).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from .theory_bench.tables import floors_table, geometric_mean_regret, load_summary


def _means_line(summary: dict, held_out: bool) -> str:
    parts = []
    for name, label in (("printed", "the printed answer"), ("on_policy_floor", "the trivial floor rule")):
        means = geometric_mean_regret(summary, name, held_out)
        parts.append(f"{label} " + ", ".join(f"{m:.3f}" if math.isfinite(m) else str(m) for m in means.values()))
    floors = ", ".join(str(f) for f in geometric_mean_regret(summary, "printed", held_out))
    return f"geometric-mean regret at floors {floors}: " + "; ".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m replay_theory.experiments.objectives_table",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="finished experiment theory-test result folders")
    parser.add_argument("--every-instance", action="store_true", help="every instance, not only the held-out ones")
    args = parser.parse_args(argv)
    for run in args.runs:  # every folder checked before any is printed
        if not (Path(run) / "summary.json").is_file():
            print(f"{parser.prog}: RUN_DIR {run} holds no summary.json (give a finished experiment theory-test "
                  "run's folder)", file=sys.stderr)
            raise SystemExit(2)
    for run in args.runs:
        summary = load_summary(run)
        held_out = not args.every_instance
        print(f"{run} ({'held-out instances' if held_out else 'every instance'})\n")
        print(floors_table(summary, held_out))
        print(f"\n{_means_line(summary, held_out)}\n")


if __name__ == "__main__":
    main()

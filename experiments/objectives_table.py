"""Every objective's share within 1.2x and worst regret by latency floor, from finished benchmark runs (issue 38): the
tables of docs/SIMULATION.md's "Does a design rule predict?", with the printed answer's and the trivial floor rule's
geometric-mean regret per floor under each, and per floor how often the printed design is the floor rule's, how many
cells ran no pilot, the printed answer's worst cell and how often each design family is the grid's best, the same
scores over the cells whose best took 10 steps or more (``tables.RESOLVED_STEPS``); with
``--families selective``, per floor where selective replay or dynamic sampling is the grid's cheapest and by how much.

    python -m replay_theory.experiments.objectives_table RUN_DIR [RUN_DIR ...] [--every-instance] [--against BASE_RUN]

Reads ``RUN_DIR/summary.json`` (``replay-theory experiment theory-test --out RUN_DIR``); held-out instances only unless
``--every-instance``. Symbols: regret = measured compute / the whole grid's least (``theory_bench/score.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from .theory_bench.tables import (
    floors_table,
    geometric_mean_regret,
    load_summary,
    printed_against_floor_rule,
    resolution_lines,
    route_lines,
    selective_floor_lines,
)


def _means_line(summary: dict, held_out: bool) -> str:
    parts = []
    for name, label in (("printed", "the printed answer"), ("on_policy_floor", "the trivial floor rule")):
        means = geometric_mean_regret(summary, name, held_out)
        parts.append(f"{label} " + ", ".join(f"{m:.3f}" if math.isfinite(m) else str(m) for m in means.values()))
    floors = ", ".join(str(f) for f in geometric_mean_regret(summary, "printed", held_out))
    return f"geometric-mean regret at floors {floors}: " + "; ".join(parts)


def _printed_lines(summary: dict, held_out: bool) -> list[str]:
    lines = []
    for floor, row in printed_against_floor_rule(summary, held_out).items():
        cell = row["worst"]
        printed = cell["by_objective"]["printed"]
        regret = "never reached" if printed["free_regret"] is None else f"{printed['free_regret']:.2f}"
        lines.append(f"floor {floor}: the printed design is the trivial floor rule's in {row['same_pick']} of "
                     f"{row['cells']} cells, no pilot in {row['no_pilot']}; its worst cell {regret}: "
                     f"{cell.get('setting')} / {cell.get('optimizer')} / {cell['instance']} at mu {cell.get('mu')} "
                     f"(printed {str(printed.get('free')).removeprefix('printed: ')}, the grid's best "
                     f"{cell.get('best_free')}); the grid's best is "
                     + ", ".join(f"{family} in {n}" for family, n in row["best_family"].items())
                     + f" of {row['cells']}")  # an off-grid answer's label starts "printed: " (printed_label)
    return lines


def moved_cells(summary: dict, base: dict, held_out: bool = True) -> dict:
    """The cells (floor, setting, optimizer, instance, mu) whose printed design differs between ``summary`` and
    ``base`` (two runs of one protocol, e.g. a rule change rescored on the same stored runs): how many, how many of
    each are within 1.2x of the grid's best, and the median printed regret of each (a pick that never reached: inf)."""
    dev = set(summary["protocol"]["dev_instances"]) if held_out else set()

    def key(c: dict) -> tuple:
        return c["floor"], c["setting"], c["optimizer"], c["instance"], c["mu"]

    def printed(c: dict) -> dict:
        return c["by_objective"].get("printed") or {}

    before = {key(c): printed(c) for c in base["cells"]}
    pairs = [(printed(c), before[key(c)]) for c in summary["cells"] if c["instance"] not in dev
             and key(c) in before and printed(c).get("free") != before[key(c)].get("free")]

    def regret(p: dict) -> float:
        return math.inf if p.get("free_regret") is None else p["free_regret"]

    def median(values: list[float]) -> float:
        ordered = sorted(values)
        n = len(ordered)
        return math.nan if not n else (ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2)

    return {"moved": len(pairs), "within_here": sum(regret(a) <= 1.2 for a, _ in pairs),
            "within_base": sum(regret(b) <= 1.2 for _, b in pairs),
            "median_here": median([regret(a) for a, _ in pairs]), "median_base": median([regret(b) for _, b in pairs])}


def _summary_or_exit(prog: str, run: str, held_out: bool, option: str = "RUN_DIR") -> dict:
    """RUN_DIR's summary.json, or one line on stderr and exit 2 when it is not a finished theory-test run's."""
    path = Path(run) / "summary.json"
    try:
        summary = load_summary(path) if path.is_file() else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        summary = None
    need = {"protocol", "cells", "targets_held_out" if held_out else "targets"}
    if not (isinstance(summary, dict) and need <= summary.keys()):
        what = "holds no summary.json" if not path.is_file() else "has a summary.json that is not a theory-test run's"
        print(f"{prog}: {option} {run} {what} (give a finished experiment theory-test run's folder)", file=sys.stderr)
        raise SystemExit(2)
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m replay_theory.experiments.objectives_table",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="finished experiment theory-test result folders")
    parser.add_argument("--every-instance", action="store_true", help="every instance, not only the held-out ones")
    parser.add_argument("--against", metavar="BASE_RUN", help="a run of the same cells (e.g. before a rule change): "
                        "also print the cells whose printed design differs from it and how both score there")
    args = parser.parse_args(argv)
    held_out = not args.every_instance
    summaries = [_summary_or_exit(parser.prog, run, held_out) for run in args.runs]  # all read before any is printed
    base = None if args.against is None else _summary_or_exit(parser.prog, args.against, held_out, "--against")
    for run, summary in zip(args.runs, summaries):
        print(f"{run} ({'held-out instances' if held_out else 'every instance'})\n")
        print(floors_table(summary, held_out))
        print(f"\n{_means_line(summary, held_out)}")
        print("\n".join(_printed_lines(summary, held_out)) + "\n")
        routes = route_lines(summary, held_out)
        if routes:  # the pilot's route and the no-pilot one (on-policy from the log's b alone) scored apart
            print("by the user's route:\n" + "\n".join(routes) + "\n")
        resolved = resolution_lines(summary, held_out)
        if resolved:  # the same scores where the grid's best took enough steps to resolve 1.2x (RESOLVED_STEPS)
            print("where one step resolves 1.2x:\n" + "\n".join(resolved) + "\n")
        family = selective_floor_lines(summary, held_out)
        if family:  # --families selective: where selective replay or dynamic sampling is the grid's cheapest
            print("the selective family (--families selective):\n" + "\n".join(family) + "\n")
        if base is not None:
            m = moved_cells(summary, base, held_out)
            print(f"against {args.against}: the printed design differs in {m['moved']} cells (every floor); within "
                  f"1.2x of the grid's best there: {m['within_here']} here, {m['within_base']} in {args.against}; "
                  f"median regret {m['median_here']:.2f} here, {m['median_base']:.2f} there\n")


if __name__ == "__main__":
    main()

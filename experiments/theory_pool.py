"""Several readings of one benchmark protocol pooled into one record (issue 38: "honest evidence"): the held-out cells
of every run, scored together by the benchmark's own ``targets``, written as OUT/summary.json and OUT/evidence.json
(what ``optimal`` quotes once copied to advise/evidence.json). One reading is three held-out instances (240 cells a
floor); which of several readings a line quotes should not be a choice, so it quotes them all.

    python -m replay_theory.experiments.theory_pool --out OUT RUN_DIR RUN_DIR [RUN_DIR ...]

Each RUN_DIR is a finished ``replay-theory experiment theory-test --out RUN_DIR`` run (its summary.json and
evidence.json). The runs must share every protocol field but the instances (the same grid, seeds, pilot, rule inputs,
settings, floors and mus); a unit (setting, optimizer, instance) in two runs must hold the same cells there (the
development instance 0, which every reading trains, counts once); anything else is refused before OUT is written.
OUT is new or empty and never overwritten. ``objectives_table OUT`` prints the pooled tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..outputs import check_out_dir, strict
from .theory_bench.options import DEV_INSTANCES
from .theory_bench.score import _write_summary, targets, write_evidence
from .theory_bench.tables import load_summary

PROG = "python -m replay_theory.experiments.theory_pool"


class PoolError(ValueError):
    """A run that cannot be pooled with the others, in one line naming it."""


def _read_run(run: str) -> tuple[dict, str]:
    """RUN_DIR's summary and the command that produced it (its evidence.json's), or PoolError."""
    path = Path(run)
    try:
        summary = load_summary(path / "summary.json")
        command = json.loads((path / "evidence.json").read_text())["command"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        raise PoolError(f"RUN_DIR {run} holds no finished experiment theory-test run (its summary.json and "
                        f"evidence.json)") from None
    if not (isinstance(summary, dict) and {"protocol", "cells", "units"} <= summary.keys()):
        raise PoolError(f"RUN_DIR {run} has a summary.json that is not a theory-test run's")
    return summary, command


def _shared(protocol: dict) -> dict:
    """The protocol without its instance list: what every pooled run must share."""
    return {k: v for k, v in protocol.items() if k != "instances"}


def pool(summaries: list[dict], names: list[str]) -> dict:
    """The pooled summary of ``summaries`` (runs named ``names``): their cells and units, each unit once, and the
    targets over every instance and over the held-out ones, recomputed by ``score.targets`` on the pooled cells.
    PoolError when the protocols differ or a unit two runs share holds different cells."""
    if len(summaries) < 2:
        raise PoolError("RUN_DIR: give two or more runs to pool")
    first = _shared(summaries[0]["protocol"])
    for summary, name in zip(summaries[1:], names[1:]):
        other = _shared(summary["protocol"])
        if other != first:
            keys = sorted(k for k in first.keys() | other.keys() if first.get(k) != other.get(k))
            raise PoolError(f"RUN_DIR {name} was run by another protocol than {names[0]} (it differs in "
                            f"{', '.join(keys)}); only readings of one protocol pool")
    cells: dict[tuple, list[dict]] = {}
    units: dict[tuple, dict] = {}
    for summary, name in zip(summaries, names):
        by_unit: dict[tuple, list[dict]] = {}
        for c in summary["cells"]:
            by_unit.setdefault((c["setting"], c["optimizer"], c["instance"]), []).append(c)
        for key, unit_cells in by_unit.items():
            if key in cells and cells[key] != unit_cells:
                raise PoolError(f"RUN_DIR {name}: {'/'.join(map(str, key))} holds other cells than in an earlier "
                                f"run (another code version?); a unit two runs share must be the same")
            cells.setdefault(key, unit_cells)
        for u in summary["units"]:
            units.setdefault((u["setting"], u["optimizer"], u["instance"]), u)
    every = [c for unit_cells in cells.values() for c in unit_cells]
    held = [c for c in every if c["instance"] not in DEV_INSTANCES]
    scored = [u for u in units.values() if not u.get("not_scored")]
    held_units = [u for u in scored if u["instance"] not in DEV_INSTANCES]
    instances = sorted({i for s in summaries for i in s["protocol"]["instances"]},
                       key=lambda i: (i not in DEV_INSTANCES, i))  # the development instance first, as a run's
    floors = summaries[0]["protocol"]["floors"]
    return strict({"cells": every, "units": list(units.values()),
            "targets": {str(f): targets(every, scored, f) for f in floors},
            "targets_held_out": {str(f): targets(held, held_units, f) for f in floors},
            "protocol": {**summaries[0]["protocol"], "instances": instances},
            "replay_theory_version": summaries[0].get("replay_theory_version"),
            "pooled_from": [{"run": name, "instances": s["protocol"]["instances"]}
                            for s, name in zip(summaries, names)]})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="finished experiment theory-test result folders "
                        "of one protocol, two or more")
    parser.add_argument("--out", required=True, help="a new or empty folder for the pooled summary.json and "
                        "evidence.json")
    args = parser.parse_args(argv)
    try:
        out = check_out_dir(Path(args.out), ours=lambda p: False)
        read = [_read_run(run) for run in args.runs]  # every run read and checked before OUT is written
        summary = pool([s for s, _ in read], args.runs)
    except ValueError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    summary["pooled_from"] = [{**p, "command": command} for p, (_, command) in zip(summary["pooled_from"], read)]
    command = f"{PROG} --out {args.out} {' '.join(args.runs)}"
    out.mkdir(parents=True, exist_ok=True)
    _write_summary(out, summary)
    write_evidence(out, summary, command)
    held = summary["targets_held_out"]
    print(f"{out}: {len(summary['pooled_from'])} runs pooled, "
          f"{sum(1 for i in summary['protocol']['instances'] if i not in DEV_INSTANCES)} held-out instances, "
          f"{held[str(summary['protocol']['floors'][0])]['cells']} held-out cells a floor; the tables: "
          f"python -m replay_theory.experiments.objectives_table {out}")


if __name__ == "__main__":
    main()

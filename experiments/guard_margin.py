"""The guard's margin rescored on finished benchmark runs: the moved cells each margin keeps within 1.2x (issue 38).

    python -m replay_theory.experiments.guard_margin RUN_DIR [RUN_DIR ...] [--margins 1.2,1.5,2,3]

``theory/guarded.py`` replaces the floor rule's design by the model's only when the floor rule's worst predicted regret
(over b x B_FACTORS) exceeds the candidate's by MARGIN. A run scored the printed answer at the margin it was made
with. The guard is recomputed from each cell's pilot at margin 1 (``guarded_design``: the least worst candidate and
its ratio r = worst(default) / worst(candidate)); a cell counts where the run printed that candidate and it is not
the floor rule's design ("moved"). For a margin M >= the run's, the cell keeps the printed regret where r > M and
takes the floor rule's regret otherwise. Both regrets are the run's own (``summary.json``: ``printed`` and
``on_policy_floor``), so nothing is trained. Cells that did not move at the run's margin do not move at a larger
one and are left out; so are cells whose printed answer is another rule's (a run made before the guard took its
current form), which are counted apart.

Symbols: r is ``Guarded.worst_default / Guarded.worst_choice`` at margin 1; regret = measured compute / the whole
grid's least (``experiments/theory_bench/score.py``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from ..advise.advice import NO_BUDGET
from ..theory import forgetting as fg
from ..theory.guarded import guarded_design
from .theory_bench.measure import pilot_query, printed_label
from .theory_bench.options import DEV_INSTANCES

WITHIN = 1.2  # the benchmark's "within 1.2x"


def margin_counts(rows: np.ndarray, margins) -> list[tuple[float, int, int, float]]:
    """rows (cells, 3): the guard's ratio r, the printed regret, the floor rule's regret, of the moved cells. Per
    margin M: (M, cells still moved (r > M), cells within WITHIN, worst regret)."""
    rows = np.asarray(rows, dtype=float).reshape(-1, 3)
    out = []
    for m in margins:
        moved = rows[:, 0] > m
        regret = np.where(moved, rows[:, 1], rows[:, 2])  # (cells,)
        out.append((float(m), int(moved.sum()), int(np.sum(regret <= WITHIN)),
                    float(regret.max()) if regret.size else float("nan")))
    return out


def guard_move(pilot: dict, optimizer: str, mu: float, floor: float) -> tuple[float, str, str] | None:
    """(r, the least worst candidate's label, the default's label) of the guarded answer ``optimal`` gives for this
    pilot and cell at no steps budget (``printed_label``'s words); None without a b (no guard: the floor rule)."""
    q, _ = pilot_query(pilot, optimizer, mu, floor)
    if q.b_noise is None:
        return None
    memory = None if q.kappa is None else fg.Memory(q.kappa, q.optimizer, q.beta1, float(q.pilot_batch))
    g = guarded_design(q.b_noise, q.batch_size, q.mu, memory, optimizer=q.optimizer, group_size=q.group_size,
                       staleness=q.staleness, floor=q.floor, max_steps_ratio=NO_BUDGET, max_horizon=q.max_horizon,
                       margin=1.0)
    return (g.worst_default / g.worst_choice, printed_label(g.choice.design).removeprefix("printed: "),
            printed_label(g.default.design).removeprefix("printed: "))


def moved_rows(run: Path, held_out_only: bool = False) -> tuple[np.ndarray, int]:
    """(``margin_counts``' rows (cells, 3) of a finished run's moved cells, how many cells printed another rule's
    answer)."""
    summary = json.loads((run / "summary.json").read_text())
    units = {}
    for path in sorted((run / "units").glob("*.json")):
        unit = json.loads(path.read_text())
        units[(unit["setting"], unit["optimizer"], unit["instance"])] = unit
    rows, other = [], 0
    for cell in summary["cells"]:
        if held_out_only and cell["instance"] in DEV_INSTANCES:
            continue
        printed, floor_rule = cell["by_objective"]["printed"], cell["by_objective"]["on_policy_floor"]
        unit = units.get((cell["setting"], cell["optimizer"], cell["instance"]))
        if unit is None or "pilot" not in unit or printed["free_regret"] is None:
            continue
        move = guard_move(unit["pilot"], cell["optimizer"], cell["mu"], cell["floor"])
        shown = printed["free"].removeprefix("printed: ")
        if move is None or shown == move[2]:
            continue  # the floor rule's design: not moved at the run's margin
        if shown != move[1]:
            other += 1  # printed by another rule
            continue
        rows.append((move[0], printed["free_regret"], floor_rule["free_regret"]))
    return np.asarray(rows, dtype=float).reshape(-1, 3), other


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="Finished experiment theory-test folders, pooled.")
    parser.add_argument("--margins", default="1.2,1.5,1.75,2,2.5,3,5",
                        help="Comma-separated margins, each a finite number >= 1.")
    parser.add_argument("--held-out-only", action="store_true", help="Leave out the development instances.")
    args = parser.parse_args(argv)
    try:
        margins = [float(v) for v in args.margins.split(",")]
    except ValueError:
        margins = [math.nan]
    if not all(math.isfinite(m) and m >= 1 for m in margins):
        parser.exit(2, f"{parser.prog}: error: --margins must be comma-separated finite numbers >= 1, got "
                       f"{args.margins!r}\n")
    for run in args.runs:
        if not (run / "summary.json").is_file() or not (run / "units").is_dir():
            parser.exit(2, f"{parser.prog}: error: {run} is not a finished experiment theory-test folder (it needs "
                           f"summary.json and units/)\n")
    parts = [moved_rows(run, args.held_out_only) for run in args.runs]
    rows, other = np.concatenate([p[0] for p in parts]), sum(p[1] for p in parts)
    print(f"{len(rows)} cells moved off the floor rule's design at the runs' margin ({other} left out: their printed "
          f"answer is another rule's)")
    print("  margin  still moved  within 1.2x  worst")
    for m, moved, within, worst in margin_counts(rows, [*margins, np.inf]):
        print(f"  {m:>6g}  {moved:>11}  {within:>6} of {len(rows)}  {worst:.2f}")


if __name__ == "__main__":
    main()

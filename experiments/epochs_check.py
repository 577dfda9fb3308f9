"""Where the epoch model stops holding (issue 40): the forgetting model's steps of each epoch design against on-policy
at B = 256, predicted from the exact inputs of the noisy quadratic (its exact B_noise, fitted to SGD's exact expected
curves, and the exact kappa at the pilot), against the measured ratio of the exact expected curves, per optimizer and
design, from finished ``--families epochs`` benchmark runs.

    python -m replay_theory.experiments.epochs_check RUN_DIR [RUN_DIR ...]

Reads ``RUN_DIR/units/quadratic-*.json`` (``replay-theory experiment theory-test --families epochs --out RUN_DIR``);
a unit run by several folders counts once. Symbols: ratio = steps(epochs e, m; R = 256, B' = 256 / m) / steps(on-policy
B = 256), steps in updates (``theory/forgetting.py`` ``predict_many``, ``psi_epochs`` [E1]-[E3]).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from ..theory import forgetting as fg
from .theory_bench.options import BATCH, BETA1
from .theory_bench.score import horizon_check

WITHIN = 1.25
"""A prediction is within when predicted / measured lies in [1 / WITHIN, WITHIN] (the horizon check's 25%)."""


def epoch_pairs(record: dict) -> list[dict]:
    """Per epoch design of a quadratic unit record: e, m, the measured and the predicted steps ratio to on-policy at
    B = 256 (exact inputs); none without an exact B_noise > 0 or a finite on-policy reference."""
    steps = {d["label"]: d["steps"][0] for d in record["designs"]}
    b_noise, kappa = record["noise"].get("exact_b_noise"), record["pilot"].get("kappa_exact")
    ref = steps.get(f"on-policy B={BATCH}", math.inf)
    if not (b_noise and b_noise > 0 and kappa and kappa > 0 and math.isfinite(ref)):
        return []
    memory = fg.Memory(float(kappa), record["optimizer"], BETA1, float(BATCH))
    out = []
    for d in record["designs"]:
        e, m = (d["design"][4:6] if len(d["design"]) == 6 else (1, 1))
        if e * m == 1 or not math.isfinite(d["steps"][0]):
            continue
        try:
            p, q = fg.predict_many([fg.Design.epochs_of(BATCH, int(e), int(m)), fg.Design.on_policy_at(BATCH)],
                                   float(b_noise), 1.0, memory)
        except ValueError:  # a kappa beyond the optimizer's stable range: no prediction
            continue
        out.append({"optimizer": record["optimizer"], "e": int(e), "m": int(m), "measured": d["steps"][0] / ref,
                    "predicted": p.steps / q.steps, "b": b_noise / (BATCH / int(m)), "kappa": float(kappa)})
    return out


def horizon_pairs(record: dict) -> list[dict]:
    """``score.horizon_check``'s rows of a quadratic unit with an exact prediction, shaped as ``epoch_pairs``'s."""
    kappa = record["pilot"].get("kappa_exact")
    return [{"optimizer": record["optimizer"], "predicted": h["predicted_exact"], "measured": h["measured"],
             "kappa": float(kappa)} for h in horizon_check(record)
            if kappa and h.get("predicted_exact") and h.get("measured")]


def table(pairs: list[dict]) -> list[str]:
    """Per optimizer and (e, m): pairs, within 25%, the median and range of predicted / measured."""
    lines = ["| optimizer | design | pairs | within 25% | median predicted / measured | range |",
             "|---|---|---|---|---|---|"]
    for key in sorted({(p["optimizer"], p["e"], p["m"]) for p in pairs}):
        ratio = np.array([p["predicted"] / p["measured"] for p in pairs if (p["optimizer"], p["e"], p["m"]) == key])
        within = int(np.sum(np.abs(np.log(ratio)) <= math.log(WITHIN)))
        lines.append(f"| {key[0]} | e={key[1]} m={key[2]} | {ratio.size} | {within} | {np.median(ratio):.2f} | "
                     f"{ratio.min():.2f}-{ratio.max():.2f} |")
    return lines


def regime_table(pairs: list[dict]) -> list[str]:
    """Per optimizer, the pairs whose exact kappa at the pilot is below 1 (a kick decays over more than one step: the
    linear model's regime) and at or above it, every epoch design together: pairs, within 25%, median and range."""
    lines = ["| optimizer | kappa at the pilot | pairs | within 25% | median predicted / measured | range |",
             "|---|---|---|---|---|---|"]
    for opt in sorted({p["optimizer"] for p in pairs}):
        for name, low in (("< 1", True), (">= 1", False)):
            ratio = np.array([p["predicted"] / p["measured"] for p in pairs
                              if p["optimizer"] == opt and (p["kappa"] < 1) == low])
            if ratio.size:
                within = int(np.sum(np.abs(np.log(ratio)) <= math.log(WITHIN)))
                lines.append(f"| {opt} | {name} | {ratio.size} | {within} | {np.median(ratio):.2f} | "
                             f"{ratio.min():.2f}-{ratio.max():.2f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m replay_theory.experiments.epochs_check",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="Finished --families epochs benchmark folders.")
    args = parser.parse_args(argv)
    records: dict[str, dict] = {}
    for run in args.runs:
        units = sorted(Path(run).glob("units/quadratic-*.json"))
        if not units:
            print(f"RUN_DIR {run}: no quadratic unit records (units/quadratic-*.json); give a finished "
                  "--families epochs run", file=sys.stderr)
            raise SystemExit(2)
        for path in units:
            try:
                record = json.loads(path.read_text())
                if not record.get("not_scored"):  # a scored unit: the keys epoch_pairs reads
                    record["designs"], record["noise"], record["pilot"], record["optimizer"]  # noqa: B018
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
                print(f"RUN_DIR {run}: {path.name} is not a unit record ({type(err).__name__}: {err}); give a "
                      "finished --families epochs run", file=sys.stderr)
                raise SystemExit(2) from None
            if not record.get("not_scored"):
                records.setdefault(path.name, record)  # one unit (setting, optimizer, instance) once
    pairs = [p for r in records.values() for p in epoch_pairs(r)]
    if not pairs:  # the horizon rows alone answer another question (score.unit_checks prints them per run)
        print("RUN_DIR: no epoch designs in the quadratic units (run with --families epochs)", file=sys.stderr)
        raise SystemExit(2)
    print(f"{len(records)} quadratic units, {len(pairs)} (unit, epoch design) pairs; exact inputs")
    print("\n".join(table(pairs)))
    print("\nby the exact kappa at the pilot:")
    print("\n".join(regime_table(pairs)))
    horizon = [p for r in records.values() for p in horizon_pairs(r)]
    print(f"\nthe FIFO's horizon ratio steps(x = 16) / steps(x = 1) by the same split ({len(horizon)} (unit, y) "
          "pairs, score.horizon_check's exact-input prediction):")
    print("\n".join(regime_table(horizon)))


if __name__ == "__main__":
    main()

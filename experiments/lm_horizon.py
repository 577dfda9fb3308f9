"""The horizon family on the language model, read against the forgetting-aware model (issue 30, docs/VALIDATION.md).

    python -m replay_theory.experiments.lm_horizon runs/horizon [--pilot PILOT/noise_profile.json]

Reads a finished ``validate verify --family horizon`` run (``report-horizon.json`` and the calibration's
``profile.json``: B_noise and the optimizer's memory kappa) and prints what the report does not:

* each design's psi(x, kappa_d) and predicted compute to a target relative to on-policy at B
  (``theory.forgetting.predict_many``, kappa at each design's own tuned step), with the Spearman correlation of the
  predicted compute with the measured reward order, also without the step feedback and with psi = 1 (the
  noise-scale model);
* the measured best design against every other (paired difference, se, seeds for 2 se; ``validate.verdict.compare``
  with the report's seed), and each design's rank and P(best) when it is the one placed.

Symbols: B_noise (the gradient noise scale), b = B_noise / B, kappa (the optimizer's memory, eta lambda_eff),
x = N/R (horizon), y = B/R (replay ratio), psi (the share of a FIFO's extra noise the optimizer keeps).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from ..core.designs import DesignConfig
from ..theory import forgetting as fg
from ..theory.resampling import spearman
from ..validate.verdict import compare

BOOTSTRAP_DRAWS = 2000  # as verify's report
LEVEL = 0.9
REPORT = "report-horizon.json"


def _design(row: dict) -> fg.Design | None:
    """The report row as the model's design; None where N is not a whole number of steps of R (the paper's pick).
    A row saved before the design kept DesignConfig's names says N, B, R (``DesignConfig.from_record`` reads both)."""
    sizes = DesignConfig.from_record(row)
    N, B, R = sizes.capacity, sizes.batch_size, sizes.rollouts_per_step
    if N % R:
        return None
    return fg.Design(B, R, N, N == R == B)


def model_rows(rows: list[dict], b_noise: float, mu: float, memory: fg.Memory, base: str = "on-policy") -> dict:
    """Predicted psi and compute (relative to design ``base``) per row under three models, and each model's Spearman
    correlation of predicted compute with minus the measured reward (rows the model cannot price are left out)."""
    priced = [(row, design) for row in rows if (design := _design(row)) is not None]
    models = {"feedback": memory, "no feedback": fg.Memory(memory.kappa, memory.optimizer, memory.beta1, None),
              "psi = 1": None}
    out: dict = {"rows": {row["name"]: {} for row, _ in priced}, "spearman": {}}
    for label, model in models.items():
        predictions = fg.predict_many([d for _, d in priced], b_noise, mu, model)
        reference = predictions[[row["name"] for row, _ in priced].index(base)].compute
        compute = [p.compute / reference for p in predictions]
        for (row, _), p, c in zip(priced, predictions, compute):
            out["rows"][row["name"]][label] = {"psi": p.psi, "kappa": p.kappa, "compute": c}
        # None where undefined (fewer than 3 designs, or a constant side): the tree's one rank correlation
        out["spearman"][label] = spearman(np.array(compute), np.array([-row["final_reward_mean"] for row, _ in priced]))
    return out


def best_against_all(rows: list[dict], seed: int) -> dict:
    """``compare`` centred on the measured best design (highest mean held-out reward)."""
    names = [row["name"] for row in rows]
    rewards = np.array([row["final_rewards"] for row in rows])  # (D, S)
    best = max(range(len(rows)), key=lambda i: rows[i]["final_reward_mean"])
    families = np.array([row["family"] for row in rows])
    return compare(rewards, names, best, families, np.random.default_rng(seed), draws=BOOTSTRAP_DRAWS, level=LEVEL)


def pilot_line(rows: list[dict], mu: float, memory: fg.Memory, run_b_noise: float, pilot: dict) -> str:
    """The model's order of the designs with b from a pilot's profile (issue 38's route: a short on-policy run's
    two-batch B_simple, e.g. ``trl-replay --steps 10``'s noise_profile.json) beside the run's own B_noise, each model's
    Spearman with the measured reward order; the pilot's kappa where it has one, else the run's."""
    b_noise = (pilot.get("noise_scale") or {}).get("b_noise")
    if b_noise is None or not (math.isfinite(b_noise) and b_noise > 0):
        return f"pilot: no B_noise > 0 in its profile ({b_noise}): the model cannot be re-scored with it"
    record = pilot.get("memory") or {}
    kappa = record.get("kappa")
    pilot_memory = memory
    if kappa is not None and kappa > 0:
        batch = record.get("pilot_batch") or memory.pilot_batch
        pilot_memory = fg.Memory(float(kappa), record.get("optimizer", memory.optimizer),
                                 float(record.get("beta1", memory.beta1)), None if batch is None else float(batch))
    ours, theirs = model_rows(rows, run_b_noise, mu, memory), model_rows(rows, float(b_noise), mu, pilot_memory)
    text = ", ".join(f"{k} {theirs['spearman'][k]:.2f} (run's B_noise: {ours['spearman'][k]:.2f})"
                     for k in theirs["spearman"])
    source = "the pilot's kappa" if pilot_memory is not memory else "the run's kappa"
    return (f"pilot route: B_noise = {b_noise:.4g} (the run's: {run_b_noise:.4g}), {source} "
            f"{pilot_memory.kappa:.4g}; Spearman(predicted compute, -reward): {text}")


def markdown(report: dict, profile: dict, pilot: dict | None = None) -> str:
    """The two tables, as printed; with ``pilot`` (a pilot's profile) the model's Spearman with its b beside."""
    noise, memory_record = profile["noise_scale"], profile["memory"]
    memory = fg.Memory(float(memory_record["kappa"]), memory_record["optimizer"], float(memory_record["beta1"]),
                       float(memory_record["pilot_batch"]))
    rows, mu = report["designs"], float(report["mu"])
    model = model_rows(rows, float(noise["b_noise"]), mu, memory)
    lines = [f"B_noise = {noise['b_noise']:.4g}, kappa = {memory.kappa:.4g} ({memory.optimizer}), mu = {mu:g}", "",
             "| design | x | y | held-out reward | psi, compute (feedback) | psi, compute (no feedback) "
             "| compute (psi = 1) |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        m = model["rows"].get(row["name"])
        cells = (["n/a (N not a multiple of R)"] * 3 if m is None else
                 [f"{m['feedback']['psi']:.3f}, {m['feedback']['compute']:.2f}",
                  f"{m['no feedback']['psi']:.3f}, {m['no feedback']['compute']:.2f}",
                  f"{m['psi = 1']['compute']:.2f}"])
        lines.append(f"| {row['name']} | {row['x']:.3g} | {row['y']:.3g} | {row['final_reward_mean']:.4f} | "
                     + " | ".join(cells) + " |")
    lines += ["", "Spearman(predicted compute, -reward): " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                                        model["spearman"].items()), ""]
    if pilot is not None:
        lines += [pilot_line(rows, mu, memory, float(noise["b_noise"]), pilot), ""]
    seed = int((report.get("config") or {}).get("seed", 0))
    verdict = best_against_all(rows, seed)
    family = verdict["all"]
    lines += [f"measured best: {family['best']}, rank {family['rank']} [{family['rank_ci'][0]:g}, "
              f"{family['rank_ci'][1]:g}], P(best) {family['probability_predicted_best']:.2f} ({verdict['seeds']} "
              f"paired seeds, {BOOTSTRAP_DRAWS} bootstrap draws, seed {seed})", "",
              f"| {family['best']} minus | difference +- paired se | beyond 2 se | seeds for 2 se |",
              "|---|---|---|---|"]
    for pair in verdict["pairs"]:
        seeds = pair["seeds_needed"]
        seeds_text = "-" if seeds is None or not math.isfinite(seeds) else str(seeds)
        lines.append(f"| {pair['design']} | {pair['difference']:+.4f} +- {pair['se']:.4f} | "
                     f"{'yes' if pair['separated'] else 'no'} | {seeds_text} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished `validate verify --family horizon` run directory")
    parser.add_argument("--pilot", type=Path, default=None,
                        help="a pilot's profile (e.g. trl-replay --steps 10 ...'s noise_profile.json): the model "
                             "re-scored with its B_noise (and kappa) beside the run's")
    args = parser.parse_args(argv)
    report_path, profile_path = args.run / REPORT, args.run / "profile.json"
    if args.pilot is not None and not args.pilot.is_file():
        parser.exit(2, f"{parser.prog}: error: --pilot {args.pilot} not found: a pilot's profile, e.g. "
                       "`replay-theory trl-replay --buffer on-policy --steps 10 ... --out P` writes "
                       "P/noise_profile.json\n")
    for path in (report_path, profile_path):
        if not path.is_file():
            parser.exit(2, f"{parser.prog}: error: {path} not found: run `replay-theory validate verify --out "
                           f"{args.run} --family horizon` first\n")
    pilot = json.loads(args.pilot.read_text()) if args.pilot else None
    print(markdown(json.loads(report_path.read_text()), json.loads(profile_path.read_text()), pilot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

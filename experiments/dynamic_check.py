"""Dynamic sampling against the batch that keeps the zero groups (issue 40; docs/THEORY.md [E9], [E11]): on the
bandit, does an update over B informative rollouts take the steps of on-policy at B / (1 - z), as the model prices it,
and does it generate the rounds ``theory.compute.refill_rounds`` says?

    python -m replay_theory.experiments.dynamic_check [--out DIR] [--instances 0,1,2] [--batch 64]

Per (setting, optimizer, instance), each design tuned to the benchmark's target as ``experiment theory-test`` tunes
its grid (``theory_bench.measure.Unit.tune``, 16 seeds, paired bootstrap replicates): dynamic sampling at B (rounds of
R = B until B rollouts are in groups with unequal rewards, ``core.designs.dynamic_step``), then on-policy at B' = the
whole-group batch nearest B / (1 - z), z the share of equal-reward groups dynamic sampling drew over its run at its
tuned step size, and on-policy at B. Columns: z; the rounds an update drew against ``refill_rounds(B / G, z)`` at that
z (a run's z moves as the policy improves, so the two differ by the spread of z over the run); steps(dynamic at B) /
steps(on-policy at B') with its 90% bootstrap interval (the model: 1); the same against on-policy at B (the model:
(1 + (1 - z) b) / (1 + b) with b = B_noise / B, below 1). Runs are stored under --out and resumed; nothing here is
scored by the benchmark.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from ..theory import forgetting
from ..theory.compute import refill_rounds
from ..theory.resampling import quantile_interval, resample_indices
from .theory_bench.measure import Unit, _best_lr, _step_cap, design_steps, tune_at_batch
from .theory_bench.options import BATCH, BOOTS, OPTIMIZERS, SETTINGS, Options
from .theory_bench.store import Store, instance_record

SETTING_NAMES = ("bandit-grpo", "two-prompts")
"""The rollout settings whose groups can have equal rewards (0 / 1 rewards); noisy-reward's never do (z = 0)."""
GROUP = 8  # responses per prompt group (simulate.to_target.GROUP)


def _nearest_groups(value: float) -> int:
    return max(GROUP, int(round(value / GROUP)) * GROUP)


def check_unit(out: Path, setting: str, optimizer: str, instance: int, batch: int) -> dict:
    """One unit's row: z, the rounds, and the steps ratios with their intervals."""
    options = Options()
    store = Store(out)
    s = SETTINGS[setting]
    boot_index = resample_indices(options.seeds, BOOTS, np.random.default_rng(
        [instance, 8191, len(setting), OPTIMIZERS.index(optimizer), batch]))
    env, inst = instance_record(store, s, instance)
    unit = Unit(s, optimizer, instance, env, inst, store, options, boot_index)
    s_ref = tune_at_batch(unit, f"on-policy B={BATCH}", 0)
    alpha = 1.0 if optimizer == "sgd" else 0.5
    scale = (batch / BATCH) ** (alpha / 2)  # the benchmark's start for a smaller batch (train_unit)
    dynamic = forgetting.Design.dynamic_at(batch)
    rec_dyn = unit.tune("dynamic", dynamic, unit.start_from((f"on-policy B={BATCH}", scale)),
                        _step_cap(options, dynamic, s_ref))
    best = _best_lr(np.asarray(rec_dyn["crossing"])[0])
    if best is None:
        return {"setting": setting, "optimizer": optimizer, "instance": instance, "reason": "dynamic never reached"}
    z = float(rec_dyn["zero_std_share"][best])
    rounds = float(rec_dyn["refill_rounds"][best])
    wide = _nearest_groups(batch / (1 - z))
    rows = {}
    for b in sorted({wide, batch}):
        design = forgetting.Design.on_policy_at(b)
        start = unit.start_from((f"on-policy B={BATCH}", (b / BATCH) ** (alpha / 2)))
        rows[b] = design_steps(unit.tune(f"on-policy B={b}", design, start, _step_cap(options, design, s_ref)))
    dyn = design_steps(rec_dyn)

    def ratio(other: np.ndarray) -> tuple[float, list[float]]:
        with np.errstate(invalid="ignore"):
            r = dyn / other
        return float(r[0]), [float(v) for v in quantile_interval(r[1:], (0.05, 0.95), "lower")]

    return {"setting": setting, "optimizer": optimizer, "instance": instance, "z": z, "rounds": rounds,
            "rounds_predicted": refill_rounds(batch // GROUP, z), "wide_batch": wide, "steps_dynamic": float(dyn[0]),
            "vs_wide": ratio(rows[wide]), "vs_batch": ratio(rows[batch])}


def render(rows: list[dict], batch: int) -> str:
    lines = [f"dynamic sampling at B = {batch} (G = {GROUP}) against on-policy at B' ~ B / (1 - z) and at B; steps "
             "ratios with 90% paired-bootstrap intervals (the model: 1 against B')", "",
             "| setting | opt | inst | z | rounds / update (predicted) | steps dynamic | B' | dynamic / on-policy B' "
             "| dynamic / on-policy B |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "reason" in r:
            lines.append(f"| {r['setting']} | {r['optimizer']} | {r['instance']} | {r['reason']} |||||| ")
            continue
        (w, (wl, wh)), (b, (bl, bh)) = r["vs_wide"], r["vs_batch"]
        lines.append(f"| {r['setting']} | {r['optimizer']} | {r['instance']} | {r['z']:.3f} | {r['rounds']:.2f} "
                     f"({r['rounds_predicted']:.2f}) | {r['steps_dynamic']:g} | {r['wide_batch']} | {w:.2f} "
                     f"[{wl:.2f}, {wh:.2f}] | {b:.2f} [{bl:.2f}, {bh:.2f}] |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replay_theory.experiments.dynamic_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/dynamic-check", help="folder the runs are stored in and resumed from")
    parser.add_argument("--instances", default="0,1,2", help="comma-separated instance seeds (integers >= 0)")
    parser.add_argument("--batch", type=int, default=64, help=f"B: whole groups of {GROUP}, 16 to 256")
    args = parser.parse_args(argv)
    try:
        instances = [int(v) for v in args.instances.split(",")]
        if any(i < 0 for i in instances):
            raise ValueError
    except ValueError:
        print(f"--instances must be comma-separated integers >= 0, got {args.instances!r}", file=sys.stderr)
        return 2
    if not (16 <= args.batch <= BATCH and args.batch % GROUP == 0):
        print(f"--batch must be a multiple of {GROUP} in [16, {BATCH}], got {args.batch}", file=sys.stderr)
        return 2
    rows = []
    with threadpool_limits(limits=1, user_api="blas"):
        for setting in SETTING_NAMES:
            for optimizer in OPTIMIZERS:
                for instance in instances:
                    rows.append(check_unit(Path(args.out), setting, optimizer, instance, args.batch))
                    print(f"{setting}/{optimizer}/{instance} done", file=sys.stderr)
    print(render(rows, args.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())

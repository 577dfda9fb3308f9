"""Scoring the benchmark: each cell (unit, mu, floor), the targets, the run and its summary and evidence.

Papers: experience-replay (docs/REFERENCES.md), Sec. 3, Thm 3.4, Thm 3.5 / App. C.3; McCandlish et al. 2018
(arXiv 1812.06162), Eq. 2.7; the forgetting-aware rule of ``theory/forgetting.py`` (docs/THEORY.md, "Forgetting").
Protocol: docs/SIMULATION.md, 'Does a design rule predict?'.

| code name | symbol | meaning |
|---|---|---|
| ``regret`` | -- | compute of a rule's pick / the best design's |
| ``spearman`` | rho | rank correlation, predicted vs measured compute |
| ``floor`` | R_floor | generation latency floor |
| ``mu`` | mu | rollout cost / per-sample update cost |
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from ... import __version__
from ...core.progress import ProgressBar
from ...outputs import check_out_dir, strict, write_new
from ...simulate import to_target
from ...theory import forgetting
from ...theory.resampling import quantile_interval, spearman
from .inputs import log_compute, pilot_affordable, pilot_compute, read_b_noise
from .measure import _designs_of, design_spec, printed_design, run_unit, staleness_of
from .objectives import (
    OBJECTIVES,
    PRINTED,
    WORK_BUDGET,
    NoPick,
    b_range_values,
    design_steps_row,
    measured_compute,
    objective_values,
)
from .options import (
    BATCH,
    BETA1,
    BOOTS,
    CAP_FACTOR,
    CURVATURE_EVERY,
    DEV_INSTANCES,
    EXACT_LR_RATIO,
    FORWARD_SAMPLE_UPDATES,
    GROUP,
    HEADLINE_FLOOR,
    HVP_SAMPLE_UPDATES,
    HVP_SAMPLES,
    LR_RATIO,
    MAX_EXTEND,
    PILOT_BUDGET,
    PILOT_FRACTION,
    PILOT_RUNS,
    PILOT_SEED,
    PRINTED_STEPS_RATIOS,
    PRINTED_WORK_RATIO,
    RESCORE_SAMPLES,
    RESCORE_STEPS,
    SETTINGS,
    TARGET_FRACTION,
    Options,
    check_options,
    is_selective,
)
from .store import Store, instance_record

REGRET_TAILS = (0.05, 0.95)
"""The regret's 90% interval: these quantiles of the seed-bootstrap replicates."""


def _regret(compute: np.ndarray, pick: int, menu: np.ndarray) -> tuple[float, list[float]]:
    """compute[0, pick] / min over ``menu`` (bool, designs) and its bootstrap 90% interval over the replicates."""
    best = compute[:, menu].min(axis=1)
    with np.errstate(invalid="ignore"):  # a replicate where the pick never arrives: inf / finite = inf, kept
        ratios = compute[:, pick] / best
    point = float(ratios[0])
    if compute.shape[0] == 1:
        return point, [point, point]
    return point, list(quantile_interval(ratios[1:], REGRET_TAILS, "lower"))  # order statistics: defined with inf


def score_cell(record: dict, mu: float, floor: float) -> dict:
    """One cell: each objective's free-batch and pinned-B picks with regret, interval and Spearman."""
    designs = _designs_of(record)
    labels = [d["label"] for d in record["designs"]]
    compute = measured_compute(record, mu, floor)
    pinned = np.array([d.batch_size == BATCH for d in designs])
    everything = np.ones(len(designs), bool)
    best_free, best_pinned = int(np.argmin(compute[0])), int(np.argmin(np.where(pinned, compute[0], np.inf)))
    by_objective = {}
    for name, values in objective_values(record, mu, floor).items():
        if isinstance(values, NoPick):
            by_objective[name] = {"no_pick": values.reason, "detail": values.detail}
            continue
        menu = np.isfinite(values)  # inf: not in the objective's menu; nan (never expected): not a prediction
        if not menu.any():
            by_objective[name] = {"no_pick": "no finite prediction", "detail": "no design has a finite value"}
            continue
        free = int(np.argmin(np.where(menu, values, np.inf)))
        r_free, ci_free = _regret(compute, free, everything)
        entry = {"free": labels[free], "free_regret": r_free, "free_ci": ci_free}
        if (menu & pinned).any():
            pin = int(np.argmin(np.where(menu & pinned, values, np.inf)))
            r_pin, ci_pin = _regret(compute, pin, pinned)
            entry.update(pinned=labels[pin], pinned_regret=r_pin, pinned_ci=ci_pin)
        else:  # a free-batch objective (the smallest on-policy batch) has no design at B = 256: said, not design 0
            entry.update(pinned=None, pinned_regret=None, pinned_ci=None,
                         pinned_no_pick=f"nothing at B = {BATCH} in its menu")
        by_objective[name] = {**entry, "spearman": spearman(np.where(menu, values, np.inf), compute[0]),
                              "free_is_replay": not designs[free].on_policy}
    # the printed answer ranks the grid as its rule does from the same pilot over the b range the guard prices
    ranked = b_range_values(record, mu, floor)
    rank = None if isinstance(ranked, NoPick) else spearman(ranked, compute[0])
    by_objective.update(score_printed(record, mu, floor, compute, rank))
    by_objective.update(score_work_budget(record, mu, floor, by_objective.get("on_policy_floor", {}).get("free")))
    on = np.array([d.on_policy for d in designs])
    # the replay branch: how much cheaper the best replay design is than the best on-policy batch (> 1: replay wins)
    replay_gain = float(compute[0][on].min() / compute[0][~on].min()) if (~on).any() else None
    selective = np.array([is_selective(d) for d in designs])
    # --families selective: the best design without the family / the whole grid's best (> 1: a selective design is
    # the cheapest, by that much); only in a cell that has the family, so the default protocol's cells stay as they were
    with np.errstate(invalid="ignore"):  # nothing reached at all: inf / inf, said as None
        gain = float(compute[0][~selective].min() / compute[0].min()) if selective.any() else None
    family = {"selective_gain": gain if gain is not None and math.isfinite(gain) else None} if selective.any() else {}
    return {"setting": record["setting"], "optimizer": record["optimizer"], "instance": record["instance"],
            "mu": mu, "floor": floor, "exact": record["exact"], "b": record["noise"]["b"],
            "replay_gain": replay_gain, **family,
            "best_free": labels[best_free], "best_pinned": labels[best_pinned],
            "best_free_at_edge": _grid_edge(designs, best_free),
            "best_pinned_at_edge": _grid_edge(designs, best_pinned),
            "by_objective": by_objective}



def _printed_run(record: dict, mu: float, floor: float, steps_ratio: float,
                 work_ratio: float = 1000.0) -> tuple[forgetting.Design, dict, np.ndarray]:
    """The design optimal prints for this cell at --max-steps-ratio ``steps_ratio`` and --max-work-ratio
    ``work_ratio``, its trained row (the grid's or a printed one) and its steps by replicate (inf: not reached)."""
    design = printed_design(record["pilot"], record["optimizer"], mu, floor, steps_ratio, record.get("max_epochs", 1),
                            record.get("max_staleness", 0), work_ratio, record.get("prices_zero_share", False))
    key = design_spec(design)
    row = next((d for d in record["designs"] + record["printed"] if d["design"] == key), None)
    if row is None:
        raise ValueError(f"{record['setting']}/{record['optimizer']}/i{record['instance']}: the printed design {key} "
                         f"(--max-steps-ratio {steps_ratio:g}, --max-work-ratio {work_ratio:g}) was not trained (its "
                         f"unit was saved by other code)")
    return design, row, np.array([math.inf if v is None else v for v in row["steps"]], dtype=float)


def score_printed(record: dict, mu: float, floor: float, compute: np.ndarray, spearman: float | None) -> dict:
    """The printed answer's regret against the whole grid's best (compute (replicates, designs)), without and with the
    pilot's compute; the pilot's share of on-policy at B's compute beside it; ``spearman``: the rank correlation of its
    rule's ranking of the grid from the same pilot over the b range the guard prices (``objectives.b_range_values``;
    the printed answer is one design: it ranks nothing itself). Empty for a unit saved before the printed answer was
    trained."""
    if "printed" not in record:
        return {}
    best = compute.min(axis=1)
    reference = design_steps_row(record, f"on-policy B={BATCH}") * forgetting.step_cost(BATCH, BATCH, mu, floor)
    piloted = pilot_affordable(record["pilot"], mu, floor)  # else the user ran no pilot and asked without its numbers
    # the pilot where run, and the forward passes that read the drift off the logged run in every cell
    extra = (pilot_compute(record["pilot"], mu, floor) if piloted else 0.0) + log_compute(record["pilot"])
    out = {}
    trained = record.get("printed_ratios", PRINTED_STEPS_RATIOS)  # --quick trains the default answer alone
    for name, ratio, added in (("printed", PRINTED_STEPS_RATIOS[0], 0.0),
                               ("printed_with_pilot", PRINTED_STEPS_RATIOS[0], extra),
                               ("printed_steps2", PRINTED_STEPS_RATIOS[1], 0.0)):
        if ratio not in trained:
            continue
        design, row, steps = _printed_run(record, mu, floor, ratio)
        pick = steps * forgetting.step_cost(design.rollouts_per_step, design.batch_size, mu, floor,
                                            design.updates_per_generation, design.max_staleness > 0,
                                            row.get("refill_rounds", 1.0))  # (replicates,); dynamic: its rounds
        regret, interval = _ratio_entry(pick + added, best)
        out[name] = {"free": row["label"], "free_regret": regret, "free_ci": interval,
                     "pinned": None, "pinned_regret": None, "pinned_ci": None,
                     "pinned_no_pick": "answers over every batch", "spearman": spearman,
                     "free_is_replay": not design.on_policy, "off_grid": row["label"].startswith("printed"),
                     "pilot_share": extra / reference if reference > 0 else None, "piloted": piloted}
    return out


def _ratio_entry(pick: np.ndarray, best: np.ndarray) -> tuple[float, list[float]]:
    """pick / best per replicate (replicate 0 the point) and the 90% interval of the bootstrap replicates."""
    with np.errstate(invalid="ignore"):
        ratios = pick / best
    interval = (list(quantile_interval(ratios[1:], REGRET_TAILS, "lower")) if ratios.size > 1
                else [float(ratios[0])] * 2)
    return float(ratios[0]), interval


def score_work_budget(record: dict, mu: float, floor: float, floor_rule: str | None) -> dict:
    """Time within a compute budget (issue 40, ``optimal --max-work-ratio``): at a latency floor, the answer optimal
    prints with ``--max-work-ratio PRINTED_WORK_RATIO`` and the trivial floor rule's pick (``floor_rule``, a grid
    label), each scored by its time (the floor's cost) against the fastest grid design whose work (its compute at
    floor 0: the floor's waiting not counted) is within that ratio of on-policy at B's, per replicate [W1]. Each
    says whether its own measured work broke the budget. Empty at floor 0, for a unit that did not train these
    answers (--quick, or saved before), or where a printed design is missing."""
    if floor <= 0 or PRINTED_WORK_RATIO not in record.get("printed_work_ratios", []):
        return {}
    time_ = measured_compute(record, mu, floor)  # (replicates, designs)
    work = measured_compute(record, mu, 0.0)
    labels = [d["label"] for d in record["designs"]]
    ref = labels.index(f"on-policy B={BATCH}")
    budget = PRINTED_WORK_RATIO * work[:, ref]  # (replicates,); inf where on-policy at B never arrives: no budget
    best = np.where(work <= budget[:, None], time_, np.inf).min(axis=1)
    design, row, steps = _printed_run(record, mu, floor, PRINTED_STEPS_RATIOS[0], PRINTED_WORK_RATIO)
    cost = partial(forgetting.step_cost, design.rollouts_per_step, design.batch_size, mu,
                   updates_per_generation=design.updates_per_generation, overlapped=design.max_staleness > 0,
                   rounds=row.get("refill_rounds", 1.0))
    picks = {"printed_work2": (row["label"], steps * cost(floor), steps * cost(0.0), design.on_policy)}
    if floor_rule is not None:
        i = labels.index(floor_rule)
        picks["floor_rule_work2"] = (floor_rule, time_[:, i], work[:, i], _designs_of(record)[i].on_policy)
    out = {}
    for name, (label, pick_time, pick_work, on_policy) in picks.items():
        regret, interval = _ratio_entry(pick_time, best)
        out[name] = {"free": label, "free_regret": regret, "free_ci": interval, "pinned": None,
                     "pinned_regret": None, "pinned_ci": None, "pinned_no_pick": "answers over every batch",
                     "free_is_replay": not on_policy, "off_grid": label.startswith("printed"),
                     "over_budget": bool(pick_work[0] > budget[0])}
    return out


def not_scored_cell(record: dict, mu: float, floor: float) -> dict:
    """A cell of a unit the protocol could not score (``UnitNotScored``): kept in the cells, with the reason, no best
    design and no objective scored (no rule missed: nothing was measured to compare a pick with)."""
    return {"setting": record["setting"], "optimizer": record["optimizer"], "instance": record["instance"],
            "mu": mu, "floor": floor, "exact": record["exact"], "not_scored": record["not_scored"], "b": None,
            "best_free": None, "best_pinned": None, "best_free_at_edge": None, "best_pinned_at_edge": None,
            "by_objective": {}}


def _grid_edge(designs: list[forgetting.Design], i: int) -> str | None:
    """Which edge of the design grid design i sits on (the smallest on-policy batch, the longest horizon, the largest
    replay ratio), or None: a best design there may be beaten by one beyond the grid."""
    d = designs[i]
    if d.on_policy and d.batch_size == min(e.batch_size for e in designs if e.on_policy) and d.batch_size < BATCH:
        return "smallest batch"
    if d.updates_per_generation > 1:
        return "most epochs" if d.epochs == max(e.epochs for e in designs) else None
    return None if d.on_policy else _replay_edge(d, [e for e in designs if not e.on_policy and
                                                     e.updates_per_generation == 1])


def _replay_edge(d: forgetting.Design, replay: list[forgetting.Design]) -> str | None:
    """The FIFO grid's edge replay design ``d`` sits on (the longest horizon, the largest replay ratio), or None."""
    if d.x == max(e.x for e in replay) and d.x > 1:
        return "longest horizon"
    return "largest replay ratio" if d.y == max(e.y for e in replay) else None


def horizon_check(record: dict) -> list[dict]:
    """Measured steps(x = longest) / steps(x = 1) at every y of the grid against the rule's prediction, with the
    measured inputs and, on the quadratic, the exact ones."""
    designs = _designs_of(record)
    steps = {d["label"]: d["steps"][0] for d in record["designs"]}
    fifo = [d for d in designs if d.batch_size == BATCH and not d.on_policy and d.updates_per_generation == 1
            and not is_selective(d)]
    xs = sorted({d.x for d in fifo})
    if len(xs) < 2:
        return []
    noise, pilot = record["noise"], record["pilot"]
    out = []
    for y in sorted({int(d.y) for d in fifo}):
        short, long_ = f"x={xs[0]} y={y}", f"x={xs[-1]} y={y}"
        if steps.get(short) is None or steps.get(long_) is None:
            continue
        measured = steps[long_] / steps[short] if math.isfinite(steps[short]) and math.isfinite(steps[long_]) else None
        row = {"y": y, "measured": measured}
        for name, b_noise, kappa in (("predicted", read_b_noise(noise), (pilot["kappa_pairs"] or {}).get("kappa")),
                                     ("predicted_exact", read_b_noise(noise, True), pilot["kappa_exact"])):
            st = partial(staleness_of, record) if name == "predicted" else lambda: forgetting.NO_STALENESS
            row[name] = _horizon_prediction(record["optimizer"], b_noise, kappa, st, (xs[0], xs[-1]), y)
        out.append(row)
    return out


def _horizon_prediction(optimizer: str, b_noise: float, kappa: float | None,
                        staleness: Callable[[], forgetting.Staleness], xs: tuple[int, int], y: int) -> float | None:
    """The rule's steps(x = xs[1]) / steps(x = xs[0]) at ``y``; None without a finite B_noise > 0 and a kappa > 0
    (no prediction, not counted in ``unit_checks``). ``staleness`` is read only for a prediction."""
    if kappa is None or not math.isfinite(b_noise) or not b_noise > 0 or not kappa > 0:
        return None
    memory = forgetting.Memory(float(kappa), optimizer, BETA1, float(BATCH))
    a, b = forgetting.predict_many([forgetting.Design(BATCH, BATCH // y, x * BATCH // y) for x in xs],
                                   float(b_noise), 1.0, memory, staleness())
    return b.steps / a.steps


def unit_checks(record: dict) -> dict:
    """Per unit: b measured against exact, kappa's estimators against exact, designs at an edge or not reached,
    and the seed-mean curves that hovered at the target."""
    noise, pilot = record["noise"], record["pilot"]
    rows = record["designs"]
    at_edge, not_reached = sum(d["at_edge"] for d in rows), sum(not d["reached"] for d in rows)
    out: dict[str, object] = {"designs": len(rows), "at_edge": at_edge, "not_reached": not_reached,
                              "hovered": sum(d.get("hovered", False) for d in rows),
                              "edge_or_censored_share": (at_edge + not_reached) / len(rows)}
    measured, exact = read_b_noise(noise), read_b_noise(noise, True)
    if math.isfinite(measured) and math.isfinite(exact) and exact > 0:
        out["b_ratio"] = measured / exact
    k_exact = pilot["kappa_exact"]
    for name in ("kappa_pairs", "kappa_lag"):
        k = (pilot.get(name) or {}).get("kappa")
        out[f"{name}_ratio"] = k / k_exact if (k is not None and k_exact) else None
    if record["exact"]:
        out["stationary_at_or_above_target"] = sum(
            1 for d in rows if d["reached"] and d["stationary_at_lr"] is not None
            and d["stationary_at_lr"] >= -record["target"])
    horizon = horizon_check(record)
    out["horizon"] = horizon
    errs = [abs(math.log(h["predicted"] / h["measured"])) for h in horizon if h["predicted"] and h["measured"]]
    out["horizon_within_25"] = (sum(e <= math.log(1.25) for e in errs), len(errs))
    return out


# --------------------------------------------------------------------------- the benchmark


def _regret_shares(regrets: list[float | None], reasons: list[str]) -> dict:
    """Over every cell (``regrets``, None: no pick, ``reasons`` saying why, one per None): how many regrets are within
    1.2x and 1.5x of the best, the share within 1.2x of ALL the cells (a cell without a pick is a miss: it stays in
    the count and is never within), the worst of the picks (inf: a pick never reached the target, counted in
    ``not_reached``; None: no cell had a pick), and the cells without a pick, by reason."""
    picked = np.array([r for r in regrets if r is not None], dtype=float)  # strict JSON keeps inf as None: none here
    return {"within_1.2": int((picked <= 1.2).sum()), "share_within_1.2": float((picked <= 1.2).sum() / len(regrets)),
            "within_1.5": int((picked <= 1.5).sum()), "worst": float(picked.max()) if picked.size else None,
            "not_reached": int(np.isinf(picked).sum()), "no_pick": len(regrets) - int(picked.size),
            "no_pick_reasons": {r: reasons.count(r) for r in sorted(set(reasons))}}


def _spearman_by_setting(cells: list[dict], name: str) -> dict:
    """Mean Spearman of an objective per setting/optimizer over its cells (None where no cell has one: a cell
    without a pick has none)."""
    per_setting: dict[str, list[float]] = {}
    for c in cells:
        v = c["by_objective"][name].get("spearman")
        per_setting.setdefault(f"{c['setting']}/{c['optimizer']}", []).append(np.nan if v is None else v)
    return {k: (float(np.nanmean(v)) if np.isfinite(v).any() else None) for k, v in per_setting.items()}


def _mode_shares(entries: list[dict], mode: str) -> dict:
    """``_regret_shares`` of one objective's ``mode`` ("free" or "pinned") picks over its cells' ``entries``."""
    regrets = [None if "no_pick" in e else e[f"{mode}_regret"] for e in entries]
    # a pick whose regret is inf is stored as None (strict JSON): it had a pick, so it counts as inf, not as none
    regrets = [math.inf if r is None and "no_pick" not in e and e.get(f"{mode}_no_pick") is None else r
               for r, e in zip(regrets, entries)]
    reasons = [e.get("no_pick") or e.get(f"{mode}_no_pick") for e in entries]
    return _regret_shares(regrets, [r for r in reasons if r])


def _objective_target(cells: list[dict], name: str) -> dict:
    """One objective's record over every cell it is scored in (a cell where it gives no pick included, as a miss):
    regret shares (free, pinned), Spearman per setting, and its replay branch apart (``_replay_branch``)."""
    rec: dict = {"cells": len(cells)}
    entries = [c["by_objective"][name] for c in cells]
    for mode in ("free", "pinned"):
        rec[mode] = _mode_shares(entries, mode)
    means = _spearman_by_setting(cells, name)
    rec["spearman_by_setting"] = means
    rec["min_setting_spearman"] = min((v for v in means.values() if v is not None), default=None)
    rec["replay_branch"] = _replay_branch(cells, name)
    shares = [c["by_objective"][name]["pilot_share"] for c in cells
              if c["by_objective"][name].get("pilot_share") is not None]
    if shares:  # the printed answer's rows: the pilot's compute / on-policy at B's to the target
        rec["pilot_share"] = {"median": float(np.median(shares)), "max": float(np.max(shares)),
                              "over_10%": int(sum(v > PILOT_BUDGET for v in shares)), "cells": len(shares),
                              "no_pilot": sum(1 for c in cells if c["by_objective"][name].get("piloted") is False)}
        rec["off_grid"] = sum(1 for c in cells if c["by_objective"][name].get("off_grid"))
    if name in ROUTED:
        rec["routes"] = _route_shares(cells, name)
    if name in WORK_BUDGET:  # measured work above the budget: the answer broke the constraint it was asked to keep
        rec["over_budget"] = sum(1 for c in cells if c["by_objective"][name].get("over_budget"))
    return rec


ROUTED = ("printed", "on_policy_floor")
"""The objectives whose record also splits by the user's route (``_route_shares``): the answer as printed and the
trivial floor rule, the baseline it must beat on each route."""


def _route_shares(cells: list[dict], name: str) -> dict:
    """``name``'s free-batch regret shares over the cells whose user ran the pilot (``piloted``) and over those whose
    run was too short for one (``no_pilot``: the printed answer is on-policy from the log's b alone there, the floor
    rule's batch in records from before the log), a route by the
    printed answer's record of the cell; a route with no cell is left out."""
    out = {}
    for route, piloted in (("piloted", True), ("no_pilot", False)):
        entries = [c["by_objective"][name] for c in cells
                   if c["by_objective"].get("printed", {}).get("piloted") is piloted]
        if entries:
            out[route] = {"cells": len(entries), **_mode_shares(entries, "free")}
    return out


REPLAY_MARGIN = 1.2
"""A cell counts as one where replay is cheapest when the best replay design needs 1.2x less compute than the best
on-policy batch (measured): there a rule that never picks replay loses at least that much."""


def _replay_branch(scored: list[dict], name: str) -> dict:
    """The replay branch of an objective's free-batch picks, apart from the share over all cells (which hides a
    branch that is never right): cells where replay is cheapest by more than ``REPLAY_MARGIN`` and how many of them
    it picked replay in (hits), and its replay picks where an on-policy batch was cheapest and that lost to it (false
    alarms) with their worst regret."""
    wins = [c for c in scored if c.get("replay_gain") is not None and c["replay_gain"] > REPLAY_MARGIN]
    # a replay pick off the grid (the printed answer) can beat every grid design where an on-policy batch was the
    # grid's best: an alarm only when it lost to that batch (regret > 1; on the grid any replay pick there does)
    alarms = [c for c in scored if c.get("replay_gain") is not None and c["replay_gain"] < 1.0
              and c["by_objective"][name].get("free_is_replay")
              and not (c["by_objective"][name].get("free_regret") or math.inf) <= 1.0]
    return {"replay_cheapest_by_20%": len(wins),
            "hits": sum(1 for c in wins if c["by_objective"][name].get("free_is_replay")),
            "false_alarms": len(alarms), "false_alarm_share": len(alarms) / len(scored) if scored else None,
            "false_alarm_worst": max((_regret_or_inf(c["by_objective"][name]) for c in alarms), default=None)}


def _regret_or_inf(entry: dict) -> float:
    """A pick's free-batch regret, inf where a saved record (strict JSON) keeps a pick that never reached as None:
    targets read the same from a run in memory and from its summary.json (experiments/theory_pool)."""
    regret = entry.get("free_regret")
    return math.inf if regret is None else regret


def _grid_edge_counts(cells: list[dict]) -> dict:
    """Per mode (free, pinned), how many cells' best design sits at each kind of grid edge."""
    out = {}
    for mode in ("free", "pinned"):
        edges = [c[f"best_{mode}_at_edge"] for c in cells if c[f"best_{mode}_at_edge"]]
        out[f"best_{mode}_at_grid_edge"] = {kind: edges.count(kind) for kind in sorted(set(edges))}
    return out


def _within(ratios: list, lo: float, hi: float) -> list[int]:
    """[how many ratios are set and within [lo, hi], how many ratios]."""
    return [sum(1 for r in ratios if r and lo <= r <= hi), len(ratios)]


def _estimate_checks(units: list[dict]) -> dict:
    """B_noise within 1.5x of exact (exact units) and kappa within 25% (quadratic units), as [hits, units]."""
    out = {"b_within_1.5x_of_exact": _within([u["checks"].get("b_ratio") for u in units if u["exact"]],
                                             1 / 1.5, 1.5)}
    quad = [u for u in units if "exact_b_noise" in u["noise"]]
    for name in ("kappa_pairs", "kappa_lag"):
        out[f"{name}_within_25%"] = _within([u["checks"].get(f"{name}_ratio") for u in quad], 0.75, 1.25)
    return out


def _horizon_checks(units: list[dict]) -> dict:
    """Horizon ratio within 25%, over all units and per kind (quadratic SGD, quadratic Adam, rollout)."""
    hz = [u["checks"]["horizon_within_25"] for u in units]
    out = {"horizon_ratio_within_25%": [sum(h[0] for h in hz), sum(h[1] for h in hz)]}
    for kind, pick in (("quadratic_sgd", lambda u: u["exact"]),
                       ("quadratic_adam", lambda u: "exact_b_noise" in u["noise"] and not u["exact"]),
                       ("rollout", lambda u: "exact_b_noise" not in u["noise"])):
        part = [u["checks"]["horizon_within_25"] for u in units if pick(u)]
        out[f"horizon_ratio_within_25%_{kind}"] = [sum(h[0] for h in part), sum(h[1] for h in part)]
    return out


def _unit_flags(units: list[dict]) -> dict:
    """Stationary-above-target and hovered counts, the largest edge-or-censored share, the units over 10%."""
    return {"stationary_at_or_above_target": sum(u["checks"].get("stationary_at_or_above_target", 0) for u in units),
            "hovered": sum(u["checks"]["hovered"] for u in units),
            "edge_or_censored_share_max": max((u["checks"]["edge_or_censored_share"] for u in units), default=None),
            "units_over_10%_at_edge_or_censored": [f"{u['setting']}/{u['optimizer']}/i{u['instance']}"
                                                   for u in units if u["checks"]["edge_or_censored_share"] > 0.1]}


def targets(cells: list[dict], units: list[dict], floor: int = HEADLINE_FLOOR) -> dict:
    """Per objective, over the cells at ``floor``: share of cells within 1.2x of the best (free batch and pinned B),
    within 1.5x, the worst, the lowest per-setting mean Spearman; the checks on the inputs over ``units``."""
    cells = [c for c in cells if c["floor"] == floor]
    out: dict = {"cells": len(cells), "floor": floor, "objectives": {}}
    unscored = [f"{c['setting']}/{c['optimizer']}/i{c['instance']}" for c in cells if c.get("not_scored")]
    # cells of a unit the protocol could not score: in "cells", in no objective's count, said with the unit
    out["cells_not_scored"] = len(unscored)
    out["units_not_scored"] = sorted(set(unscored))
    cells = [c for c in cells if not c.get("not_scored")]
    for name in [*OBJECTIVES, *PRINTED, *WORK_BUDGET]:
        scored = [c for c in cells if name in c["by_objective"]]  # every cell it applies to, a pick or not
        if scored:
            out["objectives"][name] = _objective_target(scored, name)
    out.update(_grid_edge_counts(cells))
    out.update(_estimate_checks(units))
    out.update(_horizon_checks(units))
    out.update(_unit_flags(units))
    return out


def options_text(options: Options) -> str:
    return json.dumps({**_protocol(options), "replay_theory_version": __version__}, indent=1, sort_keys=True)


def _protocol(options: Options) -> dict:
    return {"batch": BATCH, "group": GROUP, "grid": [list(d) for d in options.grid],
            "on_policy_batches": list(options.on_policy_batches), "seeds": options.seeds, "boots": BOOTS,
            "target_fraction": TARGET_FRACTION, "mus": list(options.mus), "floors": list(options.floors),
            "headline_floor": HEADLINE_FLOOR, "instances": list(options.instances),
            "dev_instances": list(DEV_INSTANCES), "settings": {s: asdict(SETTINGS[s]) for s in options.settings},
            "optimizers": list(options.optimizers), "quick": options.quick, "lr_ratio": LR_RATIO,
            "exact_lr_ratio": EXACT_LR_RATIO, "max_extend": MAX_EXTEND, "cap_factor": CAP_FACTOR,
            "window": to_target.WINDOW, "beta1": BETA1,
            "pilot": {"fraction": PILOT_FRACTION, "budget": PILOT_BUDGET, "skipped_when_unaffordable": True,
                      "seed": PILOT_SEED, "runs": PILOT_RUNS,
                      "curvature_every": CURVATURE_EVERY, "hvp_sample_updates": HVP_SAMPLE_UPDATES,
                      "hvp_samples": HVP_SAMPLES, "route": "B_simple", "b_from": "recipe log",
                      "drift_from": "recipe log", "rescore_samples": RESCORE_SAMPLES,
                      "forward_sample_updates": FORWARD_SAMPLE_UPDATES, "drift_m2": "sampled",
                      "rescore_reserved_steps": RESCORE_STEPS},
            "objectives": [*OBJECTIVES, *PRINTED],
            # only when some are on: the default protocol (advise/evidence.json's) stays as it was
            **({"families": list(options.families)} if options.families else {})}


def check_out(out: Path, options: Options) -> Path:
    """``out`` can take this benchmark: absent, empty, or holding this very benchmark (resume). Reads only."""
    out = check_out_dir(out)
    if not out.is_dir() or not any(out.iterdir()):
        return out
    stored = out / "options.json"
    if not stored.is_file():
        raise ValueError(f"--out {out} is a non-empty directory that holds no theory-test results (no "
                         f"options.json); results go into a new or empty directory")
    if stored.read_text() != options_text(options):
        raise ValueError(f"--out {out} holds a theory-test run with other options or another code version; "
                         f"choose a new --out")
    return out


def _unit_job(out: str, setting: str, optimizer: str, instance: int, options: Options) -> tuple[dict, list[dict]]:
    """A worker's unit: its record and its cells, scored there (``score_unit``, the function ``summarise`` runs on a
    record: the printed answers the unit trained are still in this process's memo, and no scoring is left for the
    end, when a single process would do all of it)."""
    record = run_unit(out, setting, optimizer, instance, options)
    return record, score_unit(record, options)


def run_theory_test(out: str | Path, options: Options = Options(), progress: bool = True, jobs: int = 1) -> dict:
    """Run (or resume) the benchmark into ``out``; write OUT/units/*.json, OUT/summary.json; return the summary."""
    from ...core.jobs import check_jobs, local_workers, run_unordered

    check_options(options)
    jobs = check_jobs(jobs)
    out = check_out(Path(out), options)
    started = time.time()
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "options.json").exists():
        write_new(out / "options.json", lambda tmp: tmp.write_text(options_text(options)))
    units_dir = out / "units"
    units_dir.mkdir(exist_ok=True)
    plan = options.units
    records: dict[tuple, dict] = {}
    scored: dict[tuple, list[dict]] = {}  # the cells of the units scored by their workers
    todo = []
    for s, o, i in plan:
        path = units_dir / f"{s}-{o}-{i}.json"
        if path.exists():
            records[(s, o, i)] = json.loads(path.read_text())
        else:
            todo.append((s, o, i))
    # The one stored run several units share, the instance's record (each optimizer's unit of a setting reads it):
    # computed here, once per (setting, instance), before any worker starts, so that no two workers compute it
    store = Store(out)
    with threadpool_limits(limits=1, user_api="blas"):  # as in run_unit: one record whatever --jobs is
        for s, i in dict.fromkeys((s, i) for s, _, i in todo):
            instance_record(store, SETTINGS[s], i)
    workers = local_workers(jobs, len(todo)) if todo else 1
    if workers > 1:  # longest first, so that no long unit starts last while the other workers idle: the rollout
        # settings (each step samples responses; a quadratic unit follows closed-form curves) before the quadratic,
        # each group from its noisiest setting (SETTINGS lists them by rising noise; more noise, more steps)
        order = {name: k for k, name in enumerate(SETTINGS)}
        todo.sort(key=lambda unit: (SETTINGS[unit[0]].loss is None, -order[unit[0]]))
    label = f"theory-test units ({len(plan) - len(todo)} of {len(plan)} saved)"
    ticks = sum(len(options.designs(s)) for s, _, _ in todo) if workers == 1 else len(todo)  # a unit's designs
    bar = ProgressBar(label, ticks, enabled=progress)
    try:
        if workers == 1:
            for s, o, i in todo:
                record = run_unit(str(out), s, o, i, options, tick=bar.tick, advance=bar.advance)
                _save_unit(units_dir, record)
                records[(s, o, i)] = record
        else:
            for record, cells in run_unordered(
                    _unit_job, [(str(out), s, o, i, options) for s, o, i in todo], workers, batch_size=1):
                _save_unit(units_dir, record)
                key = (record["setting"], record["optimizer"], record["instance"])
                records[key], scored[key] = record, cells
                bar.advance()
    finally:
        bar.close()
    _score_saved(records, scored, [k for k in plan if k not in scored], options, jobs, progress)
    units = [records[k] for k in plan]
    summary = summarise(units, options, [scored[k] for k in plan])
    summary["elapsed_s"] = round(time.time() - started, 1)
    _write_summary(out, summary)
    return summary


def _score_job(key: tuple, record: dict, options: Options) -> tuple[tuple, list[dict]]:
    return key, score_unit(record, options)


def _score_saved(records: dict, scored: dict, keys: list[tuple], options: Options, jobs: int,
                 progress: bool) -> None:
    """Score into ``scored`` the units ``keys`` that no worker scored (saved before a resume, or trained in this
    process): on up to ``jobs`` workers, with a progress line, as a resumed run can spend long minutes here."""
    from ...core.jobs import local_workers, run_unordered

    if not keys:
        return
    workers = local_workers(jobs, len(keys))
    bar = ProgressBar(f"theory-test scoring ({len(keys)} units)", len(keys), enabled=progress)
    try:
        if workers == 1:
            for key in keys:
                scored[key] = score_unit(records[key], options)
                bar.advance()
        else:
            for key, cells in run_unordered(_score_job, [(k, records[k], options) for k in keys], workers,
                                            batch_size=1):
                scored[tuple(key)] = cells
                bar.advance()
    finally:
        bar.close()


def _save_unit(units_dir: Path, record: dict) -> None:
    path = units_dir / f"{record['setting']}-{record['optimizer']}-{record['instance']}.json"
    if not path.exists():
        write_new(path, lambda tmp: tmp.write_text(json.dumps(strict(record))))


def score_unit(record: dict, options: Options) -> list[dict]:
    """The unit's cells, mu-major then floor (``score_cell``, or ``not_scored_cell`` for a unit not scored)."""
    score = not_scored_cell if record.get("not_scored") else score_cell
    with threadpool_limits(limits=1, user_api="blas"):  # as run_unit: the same cells in a worker or in one process
        return [score(record, mu, floor) for mu in options.mus for floor in options.floors]


def summarise(units: list[dict], options: Options, unit_cells: list[list[dict] | None] | None = None) -> dict:
    """Cells (unit x mu x floor), per-unit checks, and the targets over all instances and over the held-out ones.
    ``unit_cells``: each unit's cells where a worker already scored it (``score_unit``), else None."""
    scored = [u for u in units if not u.get("not_scored")]
    for u in scored:
        u["checks"] = unit_checks(u)
    given = unit_cells or [None] * len(units)
    cells = [c for u, done in zip(units, given) for c in (score_unit(u, options) if done is None else done)]
    held = [c for c in cells if c["instance"] not in DEV_INSTANCES]
    held_units = [u for u in scored if u["instance"] not in DEV_INSTANCES]
    slim = [{k: v for k, v in u.items() if k != "designs"} | {"designs": [
        {k: v for k, v in d.items() if k not in ("curve", "curve_steps")} | {"steps": d["steps"][0]}
        for d in u["designs"]]} for u in units]
    return strict({"cells": cells, "units": slim,
                   "targets": {str(f): targets(cells, scored, f) for f in options.floors},
                   "targets_held_out": {str(f): targets(held, held_units, f) for f in options.floors},
                   "protocol": _protocol(options), "replay_theory_version": __version__})


def _write_summary(out: Path, summary: dict) -> Path:
    """OUT/summary.json, never overwritten: a rerun with identical results keeps it; different ones are refused."""
    path = out / "summary.json"
    text = json.dumps(summary, indent=1, allow_nan=False)
    if path.exists():
        old = json.loads(path.read_text())
        if {**old, "elapsed_s": None} == json.loads(json.dumps({**summary, "elapsed_s": None})):
            return path
        raise ValueError(f"{path} exists and holds a different summary; results are never overwritten: "
                         f"move it away or choose a new --out")
    return write_new(path, lambda tmp: tmp.write_text(text))



def write_evidence(out: Path, summary: dict, command: str) -> Path:
    """OUT/evidence.json: the targets per objective and the command, what ``optimal``'s evidence line quotes once
    copied to advise/evidence.json (advise.evidence). Never overwritten: an identical one is kept, another refused."""
    from ...advise.evidence import evidence_record

    path = Path(out) / "evidence.json"
    text = json.dumps(evidence_record(summary, command), indent=1, sort_keys=True) + "\n"
    if path.exists():
        if path.read_text() == text:
            return path
        raise ValueError(f"{path} exists and holds other evidence; results are never overwritten: move it away")
    return write_new(path, lambda tmp: tmp.write_text(text))

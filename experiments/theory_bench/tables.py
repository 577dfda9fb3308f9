"""The benchmark's tables: units, cells and targets as text (``replay-theory experiment theory-test``).

Papers and protocol: those of ``score.py``, whose table also maps ``regret``, ``spearman``, ``floor`` and ``mu``.

| code name | symbol | meaning |
|---|---|---|
| ``b`` | B_noise / 256 | the noise scale at the pinned batch |
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .inputs import read_b_noise
from .objectives import OBJECTIVES, PRINTED
from .options import BATCH, DEV_INSTANCES, HEADLINE_FLOOR, PILOT_BUDGET

# --------------------------------------------------------------------------- the tables


SPEC = {"name": "theory-test", "description": "prediction benchmark (not a sweep: run by run_theory_test)"}


def _num(value, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}g}"


def _regret_text(value) -> str:
    """A regret of a pick: inf (stored as None in strict JSON) when the pick never reached the target."""
    return "inf" if value is None or value == math.inf else _num(value)


def _ci(point, ci) -> str:
    return (f"{_regret_text(point)} [{_regret_text(ci[0])}, {_regret_text(ci[1])}]" if ci[0] != ci[1]
            else _regret_text(point))


def _pilot_columns(p: dict) -> tuple[str, str, str]:
    """The units table's pilot B_simple / B [90% CI], pilot B_crit / B and pilot steps columns of a pilot record."""
    simple = p.get("b_simple") or {}  # the pilot's two-batch B_simple (absent from older records)
    lo_hi = [None if v is None else v / BATCH for v in (simple.get("b_noise_interval") or [None, None])]
    pilot_b = (f"{_num(None if simple.get('b_noise') is None else simple['b_noise'] / BATCH)} "
               f"[{_num(lo_hi[0])}, {_num(lo_hi[1])}]" if simple else "n/a")
    crit_value = (p.get("b_crit") or {}).get("b_noise")
    crit = _num(crit_value / BATCH) if crit_value is not None else "none" if p.get("b_crit") else "n/a"
    steps = f"{p['steps']} ({_num(p.get('recipe_steps'))})" if "recipe_steps" in p else "n/a"
    return pilot_b, crit, steps


def _kappa_columns(p: dict) -> tuple[str, str]:
    """The units table's kappa pairs [90% CI] and kappa lag-1 columns of a pilot record."""
    kp, kl = p["kappa_pairs"] or {}, p["kappa_lag"] or {}
    lag = (f"{_num(kl.get('kappa'))}" if kl.get("kappa") is not None
           else f"none (corr {_num(kl.get('lag1_autocorrelation'), 2)})")
    pairs = (f"{_num(kp.get('kappa'))} [{_num((kp.get('kappa_interval') or [None])[0])}, "
             f"{_num((kp.get('kappa_interval') or [None, None])[1])}]")
    if kp.get("kappa") is None and kp.get("pairs_without_noise"):  # said, as the lag-1 column says its none
        pairs = f"none ({kp['pairs_without_noise']} of {kp['pairs_without_noise'] + kp['units']} pairs xi = 0)"
    return pairs, lag


def units_table(summary: dict) -> str:
    """One row per unit: the measured inputs against the exact ones, and the protocol's own checks."""
    lines = ["| setting | opt | inst | b from steps [90% CI] | b exact (SGD) | pilot B_simple / B [90% CI] | "
             "pilot B_crit / B | pilot steps (of the recipe's) | B_simple / B (flow) | B_crit / B (exact) | "
             "kappa exact | kappa pairs [90% CI] | kappa lag-1 | alpha | edge / not reached / hovered (of designs) |",
             "|---" * 15 + "|"]
    for u in summary["units"]:
        if u.get("not_scored"):  # no pilot: nothing measured, the reason in the last column
            lines.append(f"| {u['setting']} | {u['optimizer']} | {u['instance']} |" + " n/a |" * 11
                         + f" not scored: {u['not_scored']} |")
            continue
        n, p, c = u["noise"], u["pilot"], u["checks"]
        b = read_b_noise(n) / BATCH
        exact_b = read_b_noise(n, True) / BATCH if "exact_b_noise" in n else None
        pilot_b, crit, steps = _pilot_columns(p)
        pairs, lag = _kappa_columns(p)
        lines.append(
            f"| {u['setting']} | {u['optimizer']} | {u['instance']} | {_num(b)} [{_num(n['b_interval'][0])}, "
            f"{_num(n['b_interval'][1])}] | {_num(exact_b)} | {pilot_b} | {crit} | {steps} | "
            f"{_num(n.get('b_simple'))} | "
            f"{_num(n.get('b_crit'))} | {_num(p['kappa_exact'])} | {pairs} | {lag} | "
            f"{_num(u.get('alpha_measured'), 2)} | "
            f"{c['at_edge']} / {c['not_reached']} / {c['hovered']} (of {c['designs']}) |")
    return "\n".join(lines)


def cells_table(summary: dict, floor: int = HEADLINE_FLOOR) -> str:
    """One row per cell at ``floor``: the best design, the answer ``optimal`` prints from the pilot (at its default,
    least compute; within 2x on-policy's steps; and with the pilot's compute added), the forgetting-aware rule's grid
    picks fed the pilot's B_simple and their regrets, then the other rules' and the baselines' regrets."""
    rule = "forgetting_b_simple"
    header = ["setting", "opt", "inst", "mu", "best (free)", "best (B = 256)",
              "optimal as printed: pick, regret [90% CI]", "within 2x steps: pick, regret", "with the pilot",
              "forgetting (pilot B_simple): free pick, regret [90% CI]", "its B = 256 pick, regret",
              "forgetting (b fitted to the grid)", "noise-scale rule: regret at B = 256", "paper J: regret at B = 256",
              "on-policy at B", "on-policy small", "trivial (floor)", "Spearman forgetting / J"]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for c in summary["cells"]:
        if c["floor"] != floor:
            continue
        if c.get("not_scored"):
            lines.append("| " + " | ".join([c["setting"], c["optimizer"], str(c["instance"]), f"{c['mu']:g}",
                                             "not scored (no pilot: see the units table)"] + ["n/a"] * 11) + " |")
            continue
        o = c["by_objective"]

        def get(name, mode="free", o=o):
            v = o.get(name)
            if not v:
                return "n/a"
            why = v.get("no_pick") or v.get(f"{mode}_no_pick")
            return f"no pick: {why}" if why else _regret_text(v[f"{mode}_regret"])

        f = o.get(rule) or {}

        def printed(name, o=o):
            v = o.get(name)
            return f"{v['free']}, {_ci(v['free_regret'], v['free_ci'])}" if v else "n/a"

        row = [c["setting"], c["optimizer"], str(c["instance"]), f"{c['mu']:g}", c["best_free"], c["best_pinned"],
               printed("printed"), printed("printed_steps2"), get("printed_with_pilot"),
               f"{f['free']}, {_ci(f['free_regret'], f['free_ci'])}" if "free" in f else get(rule),
               f"{f['pinned']}, {_regret_text(f['pinned_regret'])}" if f.get("pinned") else get(rule, "pinned"),
               get("forgetting"), get("noise_scale", "pinned"), get("paper_J", "pinned"), get("on_policy"),
               get("on_policy_small"), get("on_policy_floor"),
               " / ".join(_num((o.get(n) or {}).get("spearman"), 2) for n in (rule, "paper_J"))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _worst_text(shares: dict) -> str:
    """The worst regret of a mode's picks: inf when a pick never reached the target (how many say so), n/a when no
    cell had a pick."""
    if shares.get("no_pick") and shares["worst"] is None and not shares.get("not_reached"):
        return "n/a"
    if shares["worst"] is None or shares["worst"] == math.inf:
        n = shares.get("not_reached")
        return f"inf ({n} pick{'s' if n != 1 else ''} never reached the target)" if n else "inf"
    return f"{shares['worst']:.2f}"


def _no_pick_text(free: dict, pinned: dict, cells: int) -> str:
    """The cells where the objective gave no pick (counted above as misses), and why; empty when there are none."""
    parts = [f"{what} in {mode['no_pick']} of {cells} ("
             + ", ".join(f"{why}: {n}" for why, n in (mode.get("no_pick_reasons") or {}).items()) + ")"
             for what, mode in (("free batch", free), (f"at B = {BATCH}", pinned)) if mode.get("no_pick")]
    return "; no pick (counted as a miss): " + ", ".join(parts) if parts else ""


def targets_text(t: dict) -> str:
    """The targets block: per objective, free-batch and pinned-B regret shares, worst, Spearman; then the checks."""
    if not t:
        return ""
    lines = [f"targets over {t['cells']} cells at a latency floor of {t['floor']} rollouts (regret <= 1.2 in >= 85% "
             f"of cells and <= 1.5 in all; Spearman >= 0.7 in every setting):"]
    if t.get("cells_not_scored"):
        lines.append(f"- cells not scored, in no objective's count (their unit's pilot reached the target at no step "
                     f"size; the units table says why): {t['cells_not_scored']} of {t['cells']}, units "
                     f"{', '.join(t['units_not_scored'])}")
    for name, o in t["objectives"].items():
        fr, pn = o["free"], o["pinned"]
        label = OBJECTIVES[name].label if name in OBJECTIVES else PRINTED.get(name, name)  # else a stored name
        if name in PRINTED:  # one design per cell over every batch: no pinned pick; the pilot's cost beside it
            share = o.get("pilot_share") or {}
            lines.append(f"- {label}: {fr['within_1.2']} of {o['cells']} within 1.2x of the whole grid's best "
                         f"({100 * fr['share_within_1.2']:.0f}%), {fr['within_1.5']} within 1.5x, worst "
                         f"{_worst_text(fr)}; off the grid in {o.get('off_grid', 0)} cells; pilot compute / on-policy "
                         f"at B's: median {100 * share.get('median', math.nan):.1f}%, max "
                         f"{100 * share.get('max', math.nan):.1f}%, over {100 * PILOT_BUDGET:g}% in "
                         f"{share.get('over_10%', 0)} cells, no pilot (too short a run) in {share.get('no_pilot', 0)}; "
                         f"Spearman (its rule on the same pilot over the b range the guard prices) "
                         f"{_num(o['min_setting_spearman'], 2)}" + _branch_text(o.get("replay_branch")))
            continue
        lines.append(f"- {label}: free batch {fr['within_1.2']} of {o['cells']} within 1.2x "
                     f"({100 * fr['share_within_1.2']:.0f}%), {fr['within_1.5']} within 1.5x, worst "
                     f"{_worst_text(fr)}; at B = 256 {100 * pn['share_within_1.2']:.0f}% within 1.2x, worst "
                     f"{_worst_text(pn)}; lowest per-setting mean Spearman {_num(o['min_setting_spearman'], 2)}"
                     + _branch_text(o.get("replay_branch")) + _no_pick_text(fr, pn, o["cells"]))
    lines.append(f"- b from steps within 1.5x of the exact b: {t['b_within_1.5x_of_exact'][0]} of "
                 f"{t['b_within_1.5x_of_exact'][1]} quadratic SGD units")
    lines.append(f"- kappa within 25% of exact: curvature pairs {t['kappa_pairs_within_25%'][0]} of "
                 f"{t['kappa_pairs_within_25%'][1]}, lag-1 autocorrelation {t['kappa_lag_within_25%'][0]} of "
                 f"{t['kappa_lag_within_25%'][1]} quadratic units")
    parts = ", ".join(f"{label} {t[f'horizon_ratio_within_25%_{k}'][0]} of {t[f'horizon_ratio_within_25%_{k}'][1]}"
                      for k, label in (("quadratic_sgd", "quadratic SGD"), ("quadratic_adam", "quadratic Adam"),
                                       ("rollout", "bandits")) if f"horizon_ratio_within_25%_{k}" in t)
    lines.append(f"- predicted steps(x = 16) / steps(x = 1) within 25% of measured: {t['horizon_ratio_within_25%'][0]} "
                 f"of {t['horizon_ratio_within_25%'][1]} (unit, y) pairs ({parts})")
    lines.append(f"- counted designs whose exact stationary loss is at or above the target: "
                 f"{t['stationary_at_or_above_target']}; seed-mean curves that touched the target well before they "
                 f"crossed it (hovered): {t['hovered']}")
    for mode, label in (("free", "the whole grid"), ("pinned", "B = 256")):
        edges = t.get(f"best_{mode}_at_grid_edge") or {}
        lines.append(f"- cells whose best design ({label}) sits at an edge of the grid: "
                     + (", ".join(f"{n} at the {k}" for k, n in edges.items()) or "none"))
    lines.append(f"- designs at a step-size edge or not reached, largest share in a unit: "
                 f"{100 * (t['edge_or_censored_share_max'] or 0):.0f}% (units over 10%: "
                 f"{', '.join(t['units_over_10%_at_edge_or_censored']) or 'none'})")
    return "\n".join(lines)


def _branch_text(branch: dict | None) -> str:
    """An objective's replay branch in words (empty for a summary saved before it was recorded)."""
    if not branch:
        return ""
    worst = "" if branch["false_alarm_worst"] is None else f", worst {branch['false_alarm_worst']:.2f}"
    return (f"; replay branch: picked replay in {branch['hits']} of the {branch['replay_cheapest_by_20%']} cells "
            f"where replay is cheapest by > 20%, {branch['false_alarms']} false alarms (replay picked, on-policy "
            f"cheapest){worst}")


def _is_selective_row(d: dict) -> bool:
    """A selective replay FIFO's row ([E8]); dynamic sampling's ([E11], on-policy) is ``_is_dynamic_row``."""
    return d["design"][7:] == ["selective"] and not d["design"][3]


def _is_dynamic_row(d: dict) -> bool:
    return d["design"][7:] == ["selective"] and bool(d["design"][3])


def _median_range(values: list[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    n = len(ordered)
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return f"median {median:.3g}, range {ordered[0]:.3g}-{ordered[-1]:.3g} ({n})"


def _free_regret(cell: dict, name: str) -> float | None:
    """An objective's free-batch regret in a cell (inf: its pick never reached the target; None: no pick)."""
    v = cell["by_objective"].get(name) or {}
    if not v or "no_pick" in v:
        return None
    return math.inf if v.get("free_regret") is None else v["free_regret"]


def _within_text(regrets: list[float | None], cells: list[dict]) -> str:
    """'n of N (worst w) / m of N (worst v)': within 1.2x of the whole grid's best, and of the best without the
    selective family (the regret over the cell's ``selective_gain``)."""
    parts = []
    for scale in ([1.0] * len(cells), [c["selective_gain"] for c in cells]):
        picked = [r / g for r, g in zip(regrets, scale) if r is not None]
        worst = f"{max(picked):.2f}" if picked else "n/a"
        parts.append(f"{sum(r <= 1.2 for r in picked)} of {len(cells)} (worst {worst})")
    return " / ".join(parts)


def _steps_ratio(s: float | None, t: float | None) -> float | None:
    return s / t if s is not None and t is not None and math.isfinite(s) and math.isfinite(t) else None


def _selective_rows(units: list[dict]) -> tuple[list[str], list[float], list[float], list[str]]:
    """The table rows of every selective design (setting, optimizer, instance, its twin's (x, y), z, steps over the
    twin's), the ratios and z's, and the settings of the units without one."""
    lines, ratios, zs, skipped = [], [], [], []
    for u in units:
        steps = {d["label"]: d["steps"] for d in u["designs"]}
        rows = [d for d in u["designs"] if _is_selective_row(d)]
        if not rows:
            skipped.append(u["setting"])
        for d in rows:
            twin = d["label"].removeprefix("selective ")
            ratio = _steps_ratio(d["steps"], steps.get(twin))
            ratios += [] if ratio is None else [ratio]
            zs += [] if d.get("zero_std_share") is None else [d["zero_std_share"]]
            lines.append(f"| {u['setting']} | {u['optimizer']} | {u['instance']} | {twin} | "
                         f"{_num(d.get('zero_std_share'))} | {_num(ratio)} |")
    return lines, ratios, zs, skipped


def _dynamic_rows(units: list[dict]) -> tuple[list[str], list[float], list[float]]:
    """The table rows of every dynamic sampling design (setting, optimizer, instance, B, z, its generation rounds an
    update, its steps over on-policy at the same B's), the steps ratios and the rounds."""
    lines, ratios, rounds = [], [], []
    for u in units:
        steps = {d["label"]: d["steps"] for d in u["designs"]}
        for d in (d for d in u["designs"] if _is_dynamic_row(d)):
            batch = d["design"][0]
            ratio = _steps_ratio(d["steps"], steps.get(f"on-policy B={batch}"))
            ratios += [] if ratio is None else [ratio]
            rounds += [] if d.get("refill_rounds") is None else [d["refill_rounds"]]
            lines.append(f"| {u['setting']} | {u['optimizer']} | {u['instance']} | {batch} | "
                         f"{_num(d.get('zero_std_share'))} | {_num(d.get('refill_rounds'))} | {_num(ratio)} |")
    return lines, ratios, rounds


def _selective_floor_line(cells: list[dict], floor: int) -> str:
    """At one floor, over the cells that have the family: where a selective design (replay or dynamic sampling) is
    the whole grid's cheapest (by how much), and the printed answer and the trivial rule within 1.2x with the family
    and without it."""
    best = [c for c in cells if (c["best_free"] or "").startswith(("selective", "dynamic"))]
    dynamic = sum((c["best_free"] or "").startswith("dynamic") for c in best)
    gains = [c["selective_gain"] for c in best]
    # a run too short for a pilot: optimal is asked without a zero share, so it cannot name the family there
    unpiloted = sum(not (c["by_objective"].get("printed") or {}).get("piloted", True) for c in best)
    printed = [_free_regret(c, "printed") for c in cells]
    trivial = [_free_regret(c, "on_policy_floor") for c in cells]
    return (f"- floor {floor}: a selective design is the whole grid's cheapest in {len(best)} of {len(cells)} cells"
            + (f", dynamic sampling in {dynamic} of them" if dynamic else "")
            + (f" (the best without the family costs {_median_range(gains)} x it; {unpiloted} of them in runs too "
               f"short for a pilot, where optimal has no zero share)" if best else "")
            + f"; within 1.2x of the grid's best with the family / without it: optimal's printed answer "
            f"{_within_text(printed, cells)}, the trivial rule {_within_text(trivial, cells)}")


def selective_text(summary: dict) -> str:
    """--families selective: per rollout unit, each selective design's z (measured on its runs) and its steps over
    its uniform twin's at the same (x, y) (= their compute ratio at every mu and floor: one step costs the same);
    per floor, the cells where a selective design is the whole grid's cheapest, and the printed answer (which never
    names one) within 1.2x of the best with the family and of the best without it. Empty without the family."""
    if "selective" not in summary["protocol"].get("families", []):
        return ""
    rows, ratios, zs, skipped = _selective_rows([u for u in summary["units"] if not u.get("not_scored")])
    out = ["| setting | opt | inst | (x, y) | z (equal-reward groups, measured) | steps selective / uniform |",
           "|---" * 6 + "|", *rows, "",
           f"- steps (= compute) selective / uniform at the same (x, y): {_median_range(ratios)}; z "
           f"{_median_range(zs)}"]
    units = [u for u in summary["units"] if not u.get("not_scored")]
    dyn_rows, dyn_ratios, dyn_rounds = _dynamic_rows(units)
    if dyn_rows:  # dynamic sampling ([E11]) beside on-policy at the same B: a run saved before it has none
        out += ["", "| setting | opt | inst | B | z (equal-reward groups, measured) | rounds an update "
                "| steps dynamic / on-policy at B |", "|---" * 7 + "|", *dyn_rows, "",
                f"- steps dynamic / on-policy at the same B: {_median_range(dyn_ratios)}; generation rounds an update "
                f"{_median_range(dyn_rounds)}"]
    if skipped:
        out.append(f"- no selective design in {len(skipped)} unit{'s' if len(skipped) != 1 else ''}, those of "
                   f"{', '.join(sorted(set(skipped)))} (the quadratic has no groups of rewards, so no zero-advantage "
                   f"group: selective replay would be uniform replay)")
    out += selective_floor_lines(summary, held_out=False)
    return "\n".join(out)


def selective_floor_lines(summary: dict, held_out: bool = True) -> list[str]:
    """Per floor, ``_selective_floor_line`` over the cells that have the selective family (the held-out instances'
    only with ``held_out``); none without the family."""
    dev = set(summary["protocol"]["dev_instances"]) if held_out else set()
    lines = []
    for f in summary["protocol"]["floors"]:
        cells = [c for c in summary["cells"] if c["floor"] == f and c.get("selective_gain") is not None
                 and c["instance"] not in dev]
        if cells:
            lines.append(_selective_floor_line(cells, f))
    return lines


def summary_table(summary: dict) -> str:
    floors = summary["protocol"]["floors"]
    head = summary["protocol"]["headline_floor"] if summary["protocol"]["headline_floor"] in floors else floors[0]
    parts = ["## Inputs, measured against exact", "", units_table(summary), "",
             f"## Cells at a latency floor of {head} rollouts", "", cells_table(summary, head), ""]
    family = selective_text(summary)
    if family:
        parts += ["## Selective replay (--families selective; no objective prices it but the printed answer, from "
                  "the pilot's zero share)", "", family, ""]
    for f in floors:
        held = summary["targets_held_out"].get(str(f)) or {}
        if held.get("cells"):  # a run on the development instance alone has none to read
            parts += [f"## Targets, held-out instances (not {', '.join(map(str, DEV_INSTANCES))}), floor {f}", "",
                      targets_text(held), ""]
        parts += [f"## Targets, every instance, floor {f}", "", targets_text(summary["targets"].get(str(f)) or {}), ""]
    return "\n".join(parts)


def theory_test_table(out_dir: Path) -> str:
    return summary_table(load_summary(out_dir))



def load_summary(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    return json.loads(path.read_text())


# --------------------------------------------------------------------------- docs/SIMULATION.md's table by floor


FLOOR_ROWS = {
    "printed": "**optimal's answer as printed** (least compute, its default)",
    "printed_with_pilot": "the same, pilot's compute added",
    "printed_steps2": "optimal's answer, --max-steps-ratio 2",
    "forgetting_b_simple": "the rule's pick over the grid, pilot B_simple",
    "forgetting_b_crit": "the rule's pick over the grid, pilot B_crit",
    "forgetting": "reference: b fitted to the scored runs",
    "forgetting_exact": "exact inputs (quadratic)",
    "noise_scale": "noise-scale rule (psi = 1, x = 1)",
    "paper_J": "the paper's J",
    "finite_budget": "finite-budget bound",
    "null": "null gamma(y)",
    "on_policy": "always on-policy at B",
    "on_policy_small": "on-policy, smallest batch within 2x steps",
    "on_policy_floor": "**trivial: on-policy at max(floor, smallest batch)**",
    "on_policy_oracle": "oracle: cheapest on-policy batch, measured",
    "printed_work2": "time within 2x on-policy's work: optimal's answer, --max-work-ratio 2",
    "floor_rule_work2": "time within 2x on-policy's work: the trivial floor rule",
}
"""The rows of ``floors_table``, in its order, with docs/SIMULATION.md's short labels."""


def _share_worst(free: dict) -> str:
    """'86% / 1.59': the share within 1.2x and the worst regret (inf where a pick never reached the target)."""
    worst = free["worst"]
    finite = worst is not None and math.isfinite(worst) and not free.get("not_reached")
    return f"{100 * free['share_within_1.2']:.0f}% / {f'{worst:.2f}' if finite else 'inf'}"


def floors_table(summary: dict, held_out: bool = True) -> str:
    """Every objective's share within 1.2x / worst regret at each floor, the lowest per-setting Spearman and the
    replay branch at the headline floor: docs/SIMULATION.md's tables, from a run's ``summary.json``
    (``targets_held_out``, or ``targets`` with ``held_out=False``)."""
    targets = summary["targets_held_out" if held_out else "targets"]
    floors = [str(f) for f in summary["protocol"]["floors"] if (targets.get(str(f)) or {}).get("cells")]
    head = str(summary["protocol"]["headline_floor"])
    if head not in floors:
        return "no cells"
    lines = ["| objective | " + " | ".join(f"floor {f}" for f in floors)
             + f" | Spearman ({head}) | replay branch ({head}) |", "|---" * (len(floors) + 3) + "|"]
    for name, label in FLOOR_ROWS.items():
        if name not in targets[head]["objectives"]:
            continue
        cols = [_share_worst(targets[f]["objectives"][name]["free"]) if name in targets[f]["objectives"] else "n/a"
                for f in floors]  # the work-budget rows: floors > 0 only
        o = targets[head]["objectives"][name]
        spearman = o.get("min_setting_spearman")
        branch = o["replay_branch"]
        worst = branch.get("false_alarm_worst")
        cols += ["n/a" if spearman is None else f"{spearman:.2f}",
                 f"over budget in {o['over_budget']} of {o['cells']}" if "over_budget" in o else
                 f"{branch['hits']} of {branch['replay_cheapest_by_20%']}, {branch['false_alarms']} false"
                 + ("" if worst is None else f" ({worst:.2f})")]
        lines.append(f"| {label} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


def geometric_mean_regret(summary: dict, name: str, held_out: bool = True) -> dict[int, float]:
    """Per floor, the geometric mean of objective ``name``'s free-batch regret over the scored cells (held-out
    instances only by default): inf if any pick never reached the target, nan if a cell has no pick."""
    out = {}
    for floor in summary["protocol"]["floors"]:
        regrets = [_free_regret(c, name) for c in summary["cells"]  # a saved never-reached pick (None): inf
                   if c["floor"] == floor and not c.get("not_scored")  # an unscored unit: nothing to compare
                   and not (held_out and c["instance"] in summary["protocol"]["dev_instances"])]
        if not regrets:
            continue
        if any(r is None for r in regrets):
            out[floor] = math.nan
        else:
            out[floor] = math.exp(math.fsum(math.log(r) for r in regrets) / len(regrets)) \
                if all(math.isfinite(r) for r in regrets) else math.inf
    return out


def printed_against_floor_rule(summary: dict, held_out: bool = True) -> dict[int, dict]:
    """Per floor, over the scored cells with a printed answer (held-out instances only by default): how many cells the
    printed design is the trivial floor rule's pick (``same_pick``), how many ran no pilot (``no_pilot``: a run too
    short for one), the printed answer's worst cell (``worst``, the cell itself; a pick that never reached the
    target counts as inf, the first such cell kept) and in how many cells each design family is the grid's best
    (``best_family``: on-policy, replay, epochs, overlapped, selective, by ``best_family``)."""
    out = {}
    for floor in summary["protocol"]["floors"]:
        cells = [c for c in summary["cells"] if c["floor"] == floor and not c.get("not_scored")
                 and "printed" in c["by_objective"]
                 and not (held_out and c["instance"] in summary["protocol"]["dev_instances"])]
        if not cells:
            continue

        def regret(cell: dict) -> float:
            value = cell["by_objective"]["printed"]["free_regret"]
            return math.inf if value is None else value

        out[floor] = {"cells": len(cells),
                      "same_pick": sum(1 for c in cells if c["by_objective"]["printed"].get("free") is not None
                                       and c["by_objective"]["printed"]["free"]
                                       == c["by_objective"].get("on_policy_floor", {}).get("free")),
                      "no_pilot": sum(1 for c in cells if c["by_objective"]["printed"].get("piloted") is False),
                      "worst": max(cells, key=regret),
                      "best_family": {family: n for family in FAMILIES_ORDER
                                      if (n := sum(1 for c in cells if best_family(c.get("best_free")) == family))}}
    return out


def by_route(summary: dict, held_out: bool = True) -> dict[int, dict]:
    """Per floor, the printed answer's and the trivial floor rule's regret shares split by the user's route
    (``score._route_shares``, the benchmark record's own ``routes``): {"printed": routes, "floor_rule": routes} with
    routes {"piloted": ..., "no_pilot": ...}, recomputed from the summary's cells, so that a summary written before
    the record kept them splits too. Cells scored before the printed answer recorded its route are left out."""
    from .score import _route_shares  # the one split, as the record's (score imports no table)

    out: dict[int, dict] = {}
    for floor in summary["protocol"]["floors"]:
        cells = [c for c in summary["cells"] if c["floor"] == floor and not c.get("not_scored")
                 and "piloted" in c.get("by_objective", {}).get("printed", {})
                 and not (held_out and c["instance"] in summary["protocol"]["dev_instances"])]
        if cells:
            out[floor] = {"printed": _route_shares(cells, "printed"),
                          "floor_rule": _route_shares(cells, "on_policy_floor")}
    return out


def route_lines(summary: dict, held_out: bool = True) -> list[str]:
    """``by_route`` in words, one line per floor and route (a worst of inf: a pick that never reached the target)."""
    lines = []
    for floor, split in by_route(summary, held_out).items():
        for route, words in (("piloted", "piloted"), ("no_pilot", "no pilot")):
            if route not in split["printed"]:
                continue
            p, t = split["printed"][route], split["floor_rule"][route]
            lines.append(f"floor {floor}, {words} ({p['cells']} cells): the printed answer "
                         f"{100 * p['share_within_1.2']:.0f}% within 1.2x, worst {_worst_num(p)}; the trivial floor "
                         f"rule {100 * t['share_within_1.2']:.0f}%, worst {_worst_num(t)}")
    return lines


RESOLVED_STEPS = 10
"""A cell resolves 1.2x when the grid's best design took at least this many steps to the target: below it one step
more or less is more than a tenth of that design's compute, so a regret near 1.2 (or 2, for a best reached in a step
or two) says as much about where the target fell between two steps as about the rule."""


def best_steps(summary: dict) -> dict[tuple, float]:
    """Per (setting, optimizer, instance, design label), the measured steps to the target of the unit's designs (grid
    and printed, as the summary keeps them: a grid design's steps, a printed one's first entry)."""
    out = {}
    for u in summary.get("units", ()):  # a summary without units (none kept): no steps, no line
        for d in [*u.get("designs", ()), *u.get("printed", ())]:
            steps = d["steps"][0] if isinstance(d["steps"], list) else d["steps"]
            out[(u["setting"], u["optimizer"], u["instance"], d["label"])] = steps
    return out


def resolution_lines(summary: dict, held_out: bool = True, min_steps: int = RESOLVED_STEPS) -> list[str]:
    """Per floor, the cells whose grid best took fewer than ``min_steps`` steps (``RESOLVED_STEPS``), and the printed
    answer's and the trivial floor rule's share within 1.2x and worst over the others: the same scores, split by
    what the measurement can resolve (the targets stay over every cell)."""
    steps = best_steps(summary)
    lines = []
    for floor in summary["protocol"]["floors"] if steps else ():
        cells = [c for c in summary["cells"] if c["floor"] == floor and not c.get("not_scored")
                 and "printed" in c["by_objective"]
                 and not (held_out and c["instance"] in summary["protocol"]["dev_instances"])]
        best = [steps.get((c["setting"], c["optimizer"], c["instance"], c["best_free"])) for c in cells]
        fine = [c for c, n in zip(cells, best) if n is not None and n >= min_steps]
        unknown = sum(n is None for n in best)  # a best whose steps the summary does not keep: said, not guessed
        if not fine:
            continue
        parts = []
        for name, label in (("printed", "the printed answer"), ("on_policy_floor", "the trivial floor rule")):
            picks = [r for r in (_free_regret(c, name) for c in fine) if r is not None]  # no pick: a miss
            worst = f"{max(picks):.2f}" if picks else "n/a (no pick)"
            parts.append(f"{label} {100 * sum(r <= 1.2 for r in picks) / len(fine):.0f}% within 1.2x, worst {worst}")
        lines.append(f"floor {floor}: {len(cells) - len(fine) - unknown} of {len(cells)} cells' best took under "
                     f"{min_steps} steps" + (f", {unknown} its steps not kept" if unknown else "")
                     + f"; over the other {len(fine)}: " + "; ".join(parts))
    return lines


def _worst_num(shares: dict) -> str:
    """A route's worst regret as the lines print it: inf where a pick never reached the target, n/a with no pick."""
    return "n/a" if shares["worst"] is None else f"{shares['worst']:.2f}"


FAMILIES_ORDER = ("on-policy", "replay", "epochs", "overlapped", "selective")


def best_family(label: str | None) -> str | None:
    """The design family of a grid label (``Options.designs``' labels: "on-policy B=8", "x=4 y=2", "epochs e=4 m=4",
    "overlapped B=32", "selective x=16 y=8"; a printed answer's "printed: ..." the same), None for none."""
    if label is None:
        return None
    label = label.removeprefix("printed: ")
    for family in ("on-policy", "epochs", "overlapped", "selective"):
        if label.startswith(family):
            return family
    return "replay"  # a FIFO buffer: "x=.. y=.." on the grid, "B=.. R=.. N=.." printed

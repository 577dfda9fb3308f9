"""What the prediction benchmark found for each design objective: the ``evidence:`` lines ``optimal`` prints.

The numbers live in ``advise/evidence.json``, written from a saved benchmark by
``replay-theory experiment theory-test --out DIR`` (DIR/evidence.json, copied here with the command, the code version
and the date it ran); nothing in it is typed by hand. ``advise/evidence_families.json`` is the same record of the run
with the reuse families in the grid (``--families epochs,overlap,selective``: epoch designs, overlapped generation and
selective replay trained and scored beside the default grid), quoted in a second line when ``optimal`` prices them.
Kept out of numpy and scipy so that ``optimal`` starts fast.
The targets a rule must meet to be called one that passes (issue 30): on the held-out instances, at the headline
latency floor, against the best design of the whole grid (free batch), regret <= 1.2 in at least 85% of the cells,
<= 1.5 in all, and a per-setting mean Spearman of at least 0.7 in every setting.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

EVIDENCE_FILE = Path(__file__).with_name("evidence.json")
FAMILIES_EVIDENCE_FILE = Path(__file__).with_name("evidence_families.json")
NAMES = {"forgetting": "the forgetting-aware rule (b fitted to the scored runs)",
         "printed": "the answer optimal prints", "printed_with_pilot": "the answer optimal prints, pilot counted",
         "forgetting_b_simple": "the forgetting-aware rule",
         "forgetting_b_crit": "the forgetting-aware rule fed B_crit", "noise_scale": "the noise-scale rule",
         "paper_J": "the paper's J",
         "finite_budget": "the finite-budget bound", "on_policy": "always on-policy at B",
         "on_policy_small": "on-policy at the smallest batch within 2x steps", "null": "the null model",
         "on_policy_floor": "on-policy at max(floor, smallest batch)",
         "on_policy_oracle": "the cheapest on-policy batch (oracle)"}
RULES = ("printed", "forgetting_b_simple", "paper_J", "finite_budget")
"""The design rules a verdict weighs: those fed only what a user can measure (issue 38), the answer optimal prints
standing for the forgetting-aware rule (scored as printed, off the grid where it falls; in records from before it was
scored, the rule's pick over the grid). The forgetting-aware and noise-scale rows fed b fitted to the scored on-policy
runs are not among them (that fit is a smoothing of the answer); nor are the baselines."""
PASS_WITHIN_1_2 = 0.85
PASS_WORST = 1.5
PASS_SPEARMAN = 0.7


@cache
def load_evidence(path: Path = EVIDENCE_FILE) -> dict | None:
    """The stored benchmark record, or None when there is none (never a made-up line)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def evidence_record(summary: dict, command: str) -> dict:
    """The evidence.json record of a theory-test summary: per objective, the targets at every floor, over every
    instance and over the held-out ones, with the command that produced it."""
    protocol = summary["protocol"]
    return {"command": command, "replay_theory_version": summary.get("replay_theory_version"),
            "protocol": {k: protocol.get(k) for k in ("batch", "seeds", "instances", "dev_instances", "grid", "mus",
                                                      "floors", "headline_floor", "on_policy_batches", "optimizers",
                                                      "quick", *SHARED_PROTOCOL)}
            | ({"families": protocol["families"]} if protocol.get("families") else {}),  # not the default protocol
            "settings": sorted(protocol.get("settings", {})),
            "targets": summary.get("targets"), "targets_held_out": summary.get("targets_held_out")} \
        | ({"pooled_from": summary["pooled_from"]} if summary.get("pooled_from") else {})  # experiments/theory_pool


SHARED_PROTOCOL = ("pilot", "objectives", "target_fraction", "cap_factor", "lr_ratio", "exact_lr_ratio", "window",
                   "beta1", "max_extend", "boots")
"""The protocol a quick run shares with the full one (the pilot, the objectives, the target, the caps, the step-size
search): CI runs a quick benchmark and checks these against advise/evidence.json, so that evidence written by an
older protocol or rule cannot stand behind the current code (tests/unit/test_evidence_current.py)."""


def floor_ratio_of(latency_floor: float, batch: int | None) -> float | None:
    """The user's latency floor as a share of the batch (floor / B), to find the benchmark's nearest cost model;
    without a batch only the floor's sign is known: 0 for no floor, else None (the headline floor)."""
    return latency_floor / batch if batch else (0.0 if latency_floor == 0 else None)


def benchmark_floor(record: dict, floor_ratio: float | None) -> str:
    """The benchmark's latency floor nearest the user's, compared as a share of the batch (the benchmark's floors
    are rollouts at its B): None, the headline floor."""
    protocol = record.get("protocol", {})
    floors, batch = protocol.get("floors") or [], protocol.get("batch") or 256
    if floor_ratio is None or not floors:
        return str(protocol.get("headline_floor"))
    return str(min(floors, key=lambda f: (abs(f / batch - floor_ratio), -f)))  # a tie: the floor the user has


def _headline(record: dict, floor_ratio: float | None = None) -> tuple[dict | None, str]:
    """(targets, which) at the floor nearest the user's (``benchmark_floor``): the held-out instances when the run
    had any, else every instance."""
    floor = benchmark_floor(record, floor_ratio)
    held = (record.get("targets_held_out") or {}).get(floor) or {}
    if held.get("cells"):
        readings = len(record.get("pooled_from") or ())  # experiments/theory_pool: every reading, not one of them
        pooled = f" ({held_out_count(record)} in {readings} readings, pooled)" if readings else ""
        return held, f"held-out instances{pooled}, latency floor {floor}"
    every = (record.get("targets") or {}).get(floor) or {}
    return (every or None), f"every instance (none held out), latency floor {floor}"


def held_out_count(record: dict) -> int:
    """How many held-out instances the record's run (or pooled runs) read."""
    protocol = record.get("protocol") or {}
    dev = set(protocol.get("dev_instances") or ())
    return sum(1 for i in protocol.get("instances") or () if i not in dev)


def passes(o: dict) -> bool:
    """The targets: a cell without a pick is a miss (in the share's count, and not "<= 1.5 in all"); a worst stored
    as None is a pick that never reached the target (inf in strict JSON)."""
    free = o["free"]
    spearman = o.get("min_setting_spearman")
    return (free["share_within_1.2"] >= PASS_WITHIN_1_2 and free["worst"] is not None and free["worst"] <= PASS_WORST
            and not free.get("no_pick") and spearman is not None and spearman >= PASS_SPEARMAN)


def verdict_line(record: dict | None = None, floor_ratio: float | None = None,
                 benchmark: str = "the benchmark") -> str | None:
    """None when a rule passes the targets at the benchmark's cost model nearest the user's (``floor_ratio``: the
    user's latency floor / batch); else one short sentence, in the README's words, that ``optimal`` prints right after
    what to do: that no rule passes there, how close the best one came against which bar, and the floor at which one
    passes (never an untested design presented as tested). The details are the ``evidence:`` line's and docs'.
    ``benchmark`` names the run the record is of."""
    record = load_evidence() if record is None else record
    targets, _ = _headline(record, floor_ratio) if record else (None, "")
    if not record or not targets:
        return "tested: no stored benchmark, so no design rule has been tested here (run replay-theory experiment " \
               "theory-test)"
    objectives = targets["objectives"]
    # the printed answer stands for the forgetting-aware rule where it was scored (both read the same pilot)
    rules = {k: v for k, v in objectives.items() if k in RULES
             and not (k == "forgetting_b_simple" and "printed" in objectives)}
    if any(passes(v) for v in rules.values()):
        return None
    best = max(rules, key=lambda k: (rules[k]["free"]["share_within_1.2"], -_worst(rules[k]["free"])))
    o = rules[best]["free"]
    batch = record.get("protocol", {}).get("batch") or 256
    spearman = rules[best].get("min_setting_spearman")
    ranks = ("" if spearman is None or spearman >= PASS_SPEARMAN else
             f", ranks designs at Spearman {spearman:.2f} in one setting (bar {PASS_SPEARMAN:g})")
    elsewhere = ""
    for floor, t in _other_floors(record, floor_ratio):
        passing = [k for k, v in (t.get("objectives") or {}).items() if k in rules and passes(v)]
        if passing:
            elsewhere = (f"; at a floor of {_share(int(floor) / batch)} of the batch {NAMES[passing[0]]} passes: "
                         f"give yours with --latency-floor")
            break
    return (f"tested: {_at_floor(benchmark_floor(record, floor_ratio), batch)} no rule passes {benchmark} "
            f"({NAMES[best]} is within 1.2x of the cheapest design in {100 * o['share_within_1.2']:.0f}% of test "
            f"cases, bar {100 * PASS_WITHIN_1_2:.0f}%, worst {_worst_x(o, explain=True)}, bar {PASS_WORST:g}x{ranks})"
            f"{_best_tested(objectives, best)}{elsewhere}")


BASELINES = ("on_policy_floor", "on_policy_small", "on_policy")
"""The options a user can take without any rule, which the verdict names where one scored better than the best rule
(the oracle and the rows fed b fitted to the scored runs are not options: no user has their inputs)."""


def _best_tested(objectives: dict, rule: str) -> str:
    """Where no rule passes: the best-tested option of the rule and the baselines, ranked by the share within 1.2x
    (in whole percent, as printed) and then the worst regret; when it is the rule itself, that, beside the trivial
    floor rule it had to beat (empty without that row to quote)."""
    options = {k: objectives[k] for k in (rule, *BASELINES) if k in objectives}
    best = max(options, key=lambda k: (round(100 * options[k]["free"]["share_within_1.2"]),
                                       -_worst(options[k]["free"])))
    if best == rule:
        floor = (options.get("on_policy_floor") or {}).get("free")
        return ("" if floor is None else f"; it is the best-tested option here ({NAMES['on_policy_floor']}: "
                                         f"{100 * floor['share_within_1.2']:.0f}%, worst {_worst_x(floor)})")
    o = options[best]["free"]
    return (f"; the best-tested option here is {NAMES[best]} ({100 * o['share_within_1.2']:.0f}%, worst "
            f"{_worst_x(o)})")


def _share(ratio: float) -> str:
    """A latency floor's share of the batch in words: a quarter, a half, or the fraction."""
    words = {0.0625: "a sixteenth", 0.125: "an eighth", 0.25: "a quarter", 0.5: "half", 1.0: "all"}
    return words.get(ratio, f"{ratio:g}")


def _at_floor(floor: str, batch: int) -> str:
    """Where the verdict holds: without a latency floor, or at the floor's share of the batch."""
    return "without a latency floor" if float(floor) == 0 else f"at a latency floor of {_share(int(floor) / batch)} " \
                                                             f"of the batch"


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.2f}"


INPUT_ROUTES = {"forgetting": ("printed", "forgetting_b_simple", "forgetting")}
"""The benchmark rows an objective's evidence quotes, first found first: optimal's answer as printed from an 8% pilot's
inputs (B_simple, curvature-pair kappa, drift; none in a run too short for one), then the rule's pick over the grid
from the same pilot, then the rule fed b fitted to the scored on-policy runs (records from before the pilot). The line
names the route."""
ROUTE_TEXT = {"printed": "the answer as printed from a one-run pilot's B_simple, kappa and drift, 8% of the run, none "
                         "in a run too short for one",
              "forgetting_b_simple": "b from a pilot's B_simple",
              "forgetting": "b fitted to the scored runs' steps, an input no user has"}
LOGGED_ROUTE_TEXT = ("the answer as printed from B_simple over the user's logged run of their recipe, with a one-run "
                     "pilot's kappa and drift, 8% of the run, none in a run too short for one")
"""The printed route's words for a record whose protocol read b from the user's logged run (its pilot's ``b_from``,
experiments/theory_bench/measure.py ``measure_recipe_log``); ``ROUTE_TEXT`` for a record from before it."""
LOGGED_DRIFT_ROUTE_TEXT = ("the answer as printed from B_simple and the drift M2(s) over the user's logged run of "
                           "their recipe, with a one-run pilot's kappa, 8% of the run, none in a run too short for one")
"""The same for a record whose protocol read the drift off the logged run too (its pilot's ``drift_from``)."""


def _logged(record: dict) -> bool:
    """Whether the record's protocol read b from the user's logged run of the recipe."""
    return (record.get("protocol") or {}).get("pilot", {}).get("b_from") == "recipe log"


def _logged_drift(record: dict) -> bool:
    """Whether the record's protocol read the drift M2(s) off the user's logged run as well."""
    return (record.get("protocol") or {}).get("pilot", {}).get("drift_from") == "recipe log"


def route_text(key: str, record: dict) -> str:
    """The input route's words for the benchmark row ``key`` of ``record`` ('' for a row with none)."""
    if key == "printed" and _logged(record):
        return LOGGED_DRIFT_ROUTE_TEXT if _logged_drift(record) else LOGGED_ROUTE_TEXT
    return ROUTE_TEXT.get(key, "")


def _worst(mode: dict) -> float:
    """A mode's worst regret: None in strict JSON is a pick that never reached the target (inf), or no pick at all."""
    return float("inf") if mode.get("worst") is None else mode["worst"]


def _worst_x(mode: dict, unit: str = "x", explain: bool = False) -> str:
    """The worst regret as the lines print it (``unit`` after a number; a pick that never reached the target in words,
    shorter without ``explain``), and the cells without a pick (misses)."""
    value = _worst(mode)
    text = (f"{value:.2f}{unit}" if value != float("inf") else
            "a pick that never reached the target" if explain else "never reached")
    return text + (f", no pick in {mode['no_pick']} cells" if mode.get("no_pick") else "")


def evidence_line(objective: str, key: str, record: dict | None = None, floor_ratio: float | None = None) -> str:
    """One line: how ``objective``'s picks (the benchmark's objective ``key``, or the first of ``INPUT_ROUTES[key]``
    stored; advise/optimal.py's ``OBJECTIVES``) scored in the benchmark at the cost model nearest the user's (and at
    the other), or that none are stored."""
    record = load_evidence() if record is None else record
    targets, which = _headline(record, floor_ratio) if record else (None, "")
    stored = (targets or {}).get("objectives", {})
    key = next((k for k in INPUT_ROUTES.get(key, (key,)) if k in stored), key)
    if not record or not targets or key not in stored:
        return f"evidence: none stored for the {objective} objective (run replay-theory experiment theory-test)"
    which += f"; {route_text(key, record)}" if route_text(key, record) else ""
    o = targets["objectives"][key]
    fr, pn = o["free"], o["pinned"]
    if key == "printed":  # one design per cell, over every batch: no pinned pick; the pilot's compute apart
        line = (f"evidence ({which}, {o['cells']} test cases): within 1.2x of the cheapest design in "
                f"{100 * fr['share_within_1.2']:.0f}% (worst {_worst_x(fr, '')})")
        with_pilot = targets["objectives"].get("printed_with_pilot")
        if with_pilot:
            line += f", {100 * with_pilot['free']['share_within_1.2']:.0f}% counting the pilot's compute"
        line += _routes_text(o, targets["objectives"].get("on_policy_floor"), _logged(record), _logged_drift(record))
        line += f"; lowest per-setting Spearman {_fmt(o.get('min_setting_spearman'))}"
    else:
        line = (f"evidence ({which}, {o['cells']} test cases): within 1.2x of the cheapest design in "
                f"{100 * fr['share_within_1.2']:.0f}% (worst {_worst_x(fr, '')}) when the batch is free, "
                f"{100 * pn['share_within_1.2']:.0f}% (worst {_worst_x(pn, '')}) at a pinned batch; lowest "
                f"per-setting Spearman {_fmt(o.get('min_setting_spearman'))}")
    line += _baselines(targets["objectives"], key) + _other_floors_text(record, key, floor_ratio)
    line += "; " + passing_floors_text(record, key)
    return line + f" ({record['command']}, docs/SIMULATION.md)"


def _routes_text(printed: dict, floor_rule: dict | None, logged: bool = False, drift: bool = False) -> str:
    """The printed answer's shares by the user's route (the benchmark's ``routes``, records since they were kept):
    where the pilot ran, beside the trivial floor rule on the same cells, and where the run was too short for one
    (the answer is then the floor rule's batch, with ``logged`` the on-policy answer from the log's b alone, with
    ``drift`` too the answer from the log's b and drift); nothing for an older record."""
    routes, trivial = printed.get("routes") or {}, (floor_rule or {}).get("routes") or {}
    parts = []
    if "piloted" in routes:
        r, t = routes["piloted"], trivial.get("piloted")
        beside = (f"; the trivial rule {100 * t['share_within_1.2']:.0f}%, worst {_worst_x(t, '')}" if t else "")
        parts.append(f"with the pilot {100 * r['share_within_1.2']:.0f}% (worst {_worst_x(r, '')}{beside}) in "
                     f"{r['cells']} cases")
    if "no_pilot" in routes:
        r = routes["no_pilot"]
        answer = ("the log's b and drift, no kappa" if drift else "on-policy from the log's b alone" if logged
                  else "the floor rule's batch")
        parts.append(f"without one (a run too short for it: {answer}) {100 * r['share_within_1.2']:.0f}% "
                     f"(worst {_worst_x(r, '')}) in {r['cells']}")
    return "; " + ", ".join(parts) if parts else ""


def families_evidence_line(floor_ratio: float | None = None, record: dict | None = None) -> str:
    """The evidence line of the answer as printed when the menu holds epochs and overlapped generation
    (``--max-epochs`` > 1 or ``--max-staleness`` >= 1), scored against a grid that trains them (the families run's
    record, ``FAMILIES_EVIDENCE_FILE``), or that none is stored."""
    record = load_evidence(FAMILIES_EVIDENCE_FILE) if record is None else record
    if not record:
        return ("evidence with the reuse families in the grid: none stored (run replay-theory experiment theory-test "
                "--families epochs,overlap,selective)")
    families = ", ".join((record.get("protocol") or {}).get("families") or ())
    line = evidence_line("forgetting", "printed", record, floor_ratio)
    line = line.replace("evidence (", f"evidence with the reuse families in the grid ({families} trained and "
                                      "scored beside it; ", 1)
    return line


def _baselines(objectives: dict, key: str) -> str:
    """The evidence line's clauses for the baselines beside ``key``: always on-policy at B, and the trivial rule to
    beat (on-policy at max(floor, smallest batch))."""
    text = ""
    if key != "on_policy" and "on_policy" in objectives:
        op = objectives["on_policy"]["free"]
        text += f"; always on-policy at B {100 * op['share_within_1.2']:.0f}%"
    if key != "on_policy_floor" and "on_policy_floor" in objectives:
        tf = objectives["on_policy_floor"]["free"]
        text += (f"; the trivial on-policy at max(floor, smallest batch) {100 * tf['share_within_1.2']:.0f}% "
                 f"(worst {_worst_x(tf, '')})")
    return text


def _other_floors_text(record: dict, key: str, floor_ratio: float | None) -> str:
    """The evidence line's clause for the same route at the other latency floors (batch free), or nothing."""
    others = [(f, t["objectives"][key]["free"]) for f, t in _other_floors(record, floor_ratio)
              if (t.get("objectives") or {}).get(key)]
    if not others:
        return ""
    return "; at latency floor " + ", ".join(f"{f} {100 * o2['share_within_1.2']:.0f}% (worst {_worst_x(o2, '')})"
                                             for f, o2 in others) + " with the batch free"


def passing_floors_text(record: dict, key: str) -> str:
    """The latency floors at which ``key`` met the targets (held-out instances where the run had any), in words."""
    held = record.get("targets_held_out") or {}
    source = held if any((t or {}).get("cells") for t in held.values()) else (record.get("targets") or {})
    floors = sorted(source, key=float)
    passed = [f for f in floors if ((source[f] or {}).get("objectives") or {}).get(key)
              and passes(source[f]["objectives"][key])]
    return (f"meets the targets at floors {', '.join(passed)}" if passed else
            f"meets the targets at none of the floors {', '.join(floors)}")


def _other_floors(record: dict, floor_ratio: float | None = None) -> list[tuple[str, dict]]:
    """(floor, targets) of the floors besides the quoted one, from the same instances it quotes."""
    head = benchmark_floor(record, floor_ratio)
    held = record.get("targets_held_out") or {}
    source = held if (held.get(head) or {}).get("cells") else (record.get("targets") or {})
    return sorted(((f, t) for f, t in source.items() if f != head and t), key=lambda item: float(item[0]))


def outside_tested_range(design: dict, batch: int, record: dict | None = None) -> str | None:
    """Where ``design`` (``batch_size``, ``rollouts_per_step``, ``capacity``, ``on_policy`` as ``optimal --json``
    names them) lies outside the designs the stored benchmark trained, relative to the user's ``batch`` B (the
    benchmark's B = 256 is its user's batch): on-policy batches B' / B within the tested on-policy ratios, replay at
    B' = B with x and y within the grid's. None inside (or with no stored benchmark: the evidence line says so);
    else the clause the evidence line ends with, so that no answer borrows evidence from designs nobody ran."""
    record = load_evidence() if record is None else record
    protocol = (record or {}).get("protocol") or {}
    tested_batch, grid, batches = protocol.get("batch"), protocol.get("grid"), protocol.get("on_policy_batches")
    if not (tested_batch and grid and batches):
        return None
    b, r, n = design["batch_size"], design["rollouts_per_step"], design["capacity"]
    if design.get("on_policy", b == r == n):
        low, high = min(batches) / tested_batch, max(batches) / tested_batch
        if low * batch <= b <= high * batch:
            return None
        return (f"this answer lies outside the tested grid: on-policy at B = {b} is {b / batch:.3g}x your batch, the "
                f"benchmark's grid ran {low:g}x to {high:g}x")
    x, y = n // r, b / r
    max_x, max_y = max(g[0] for g in grid), max(g[1] for g in grid)
    why = [f"replay at B = {b}, not your B = {batch}"] if b != batch else []
    why += [f"x = {x} beyond {max_x}"] if x > max_x else []
    why += [f"y = {y:.3g} beyond {max_y}"] if y > max_y else []
    return None if not why else ("this answer lies outside the tested grid (" + ", ".join(why) + "): the benchmark's "
                                 f"grid holds replay only at its own batch, x <= {max_x}, y <= {max_y}; answers "
                                 "beyond it count in the shares above only as the printed answers they were")

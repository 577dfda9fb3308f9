"""What the prediction benchmark found for each design objective: the ``evidence:`` line ``optimal`` prints.

The numbers live in ``theory/evidence.json``, written from a saved benchmark by
``replay-theory experiment theory-test --out DIR`` (DIR/evidence.json, copied here with the command, the code version
and the date it ran); nothing in it is typed by hand. Kept out of numpy and scipy so that ``optimal`` starts fast.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

EVIDENCE_FILE = Path(__file__).with_name("evidence.json")
OBJECTIVE_KEYS = {"noise-scale": "noise_scale", "paper": "paper_J", "finite-budget": "finite_budget",
                  "on-policy": "on_policy", "null": "null"}


@cache
def load_evidence(path: Path = EVIDENCE_FILE) -> dict | None:
    """The stored benchmark record, or None when there is none (never a made-up line)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def evidence_record(summary: dict, command: str) -> dict:
    """The evidence.json record of a theory-test summary: per objective, the targets over every cell and over the
    held-out instances, with the command that produced it."""
    return {"command": command, "replay_theory_version": summary.get("replay_theory_version"),
            "protocol": {k: summary["protocol"].get(k) for k in ("seeds", "instances", "grid", "mus", "quick")},
            "settings": sorted({f"{c['regime']}/{c['loss']}" for c in summary["cells"]}),
            "targets": summary.get("targets"), "targets_held_out": summary.get("targets_held_out")}


PASS_WITHIN_1_2 = 0.85
"""The issue-22 regret targets a rule must meet to be called one that passes: regret <= 1.2 in at least 85% of the
cells and <= 1.5 in all of them."""


def verdict_line(record: dict | None = None) -> str | None:
    """None when some rule passes the regret targets; else the first line ``optimal`` prints: that none does, and how
    close the best-scoring one came (never an untested design presented as the answer)."""
    record = load_evidence() if record is None else record
    if not record or not record.get("targets"):
        return "no stored benchmark: no design rule has been tested here (run replay-theory experiment theory-test)"
    objectives = record["targets"]["objectives"]
    rules = {k: v for k, v in objectives.items() if k not in ("on_policy", "null")}
    passing = [k for k, o in rules.items() if o["share_within_1.2"] >= PASS_WITHIN_1_2 and o["worst"] <= 1.5]
    if passing:
        return None
    best = max(rules, key=lambda k: rules[k]["share_within_1.2"])
    o = rules[best]
    names = {v: k for k, v in OBJECTIVE_KEYS.items()} | {"noise_scale_long": "noise-scale rule at a long horizon",
                                                         "noise_scale_grad": "noise-scale rule fed B_simple"}
    return (f"no design rule passes the benchmark (regret <= 1.2 in 85% of cells and <= 1.5 in all): the best, the "
            f"{names.get(best, best)}, is within 1.2x in {100 * o['share_within_1.2']:.0f}% of cells, worst "
            f"{o['worst']:.2f}; always on-policy {100 * objectives['on_policy']['share_within_1.2']:.0f}%. Read the "
            f"answer below as the best-tested guess, and check it against on-policy on your own run")


def horizon_line(record: dict | None = None) -> str | None:
    """What the benchmark found about the horizon the rule leaves open (the shortest vs the longest tested)."""
    record = load_evidence() if record is None else record
    objectives = (record or {}).get("targets", {}).get("objectives", {})
    if "noise_scale" not in objectives or "noise_scale_long" not in objectives:
        return None
    short, long_ = objectives["noise_scale"], objectives["noise_scale_long"]
    held = (record.get("targets_held_out") or {}).get("objectives", {})
    grid = record.get("protocol", {}).get("grid") or [[16, 1]]
    longest = max(x for x, _ in grid)
    text = (f"horizon: the rule does not predict one and uses N = R; at the same y a buffer of {longest} steps "
            f"(N = {longest} R) was within 1.2x of the best in {100 * long_['share_within_1.2']:.0f}% of benchmark "
            f"cells against {100 * short['share_within_1.2']:.0f}% for N = R")
    if "noise_scale_long" in held and "noise_scale" in held:
        text += (f" ({100 * held['noise_scale_long']['share_within_1.2']:.0f}% vs "
                 f"{100 * held['noise_scale']['share_within_1.2']:.0f}% on held-out instances; the horizon was chosen "
                 f"on instance 0)")
    return text + ("; where stale samples stay cheap (ESS by age near 1 in replay-theory diagnose) the longer buffer "
                   "is the better-tested choice")


def evidence_line(objective: str, record: dict | None = None) -> str:
    """One line: how the objective's picks scored in the benchmark (or that there is no stored benchmark)."""
    record = load_evidence() if record is None else record
    key = OBJECTIVE_KEYS[objective]
    if not record or not record.get("targets") or key not in record["targets"].get("objectives", {}):
        return f"evidence: none stored for the {objective} objective (run replay-theory experiment theory-test)"
    t = record["targets"]
    o = t["objectives"][key]
    line = (f"evidence: within 1.2x of the best design in {o['within_1.2']} of {t['cells']} benchmark cells "
            f"({100 * o['share_within_1.2']:.0f}%), within 1.5x in {o['within_1.5']}, worst {o['worst']:.2f}")
    held = (record.get("targets_held_out") or {}).get("objectives", {}).get(key)
    if held:
        line += (f"; on held-out instances {held['within_1.2']} of {record['targets_held_out']['cells']} within "
                 f"1.2x")
    return line + f" ({record['command']}, docs/SIMULATION.md)"

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

"""advise/evidence.json (what `optimal`'s tested: and evidence: lines quote) was written by the current benchmark:
every held-out reading of the protocol `experiment theory-test` runs by default, pooled (experiments/theory_pool),
and a quick run of the current code shares its pilot, objectives, target and step-size search (issue 38: "checked
against a quick run in CI")."""

from __future__ import annotations

import json
import re
from dataclasses import replace

from replay_theory.advise import evidence
from replay_theory.experiments import theory_bench as tt

STORED = json.loads(evidence.EVIDENCE_FILE.read_text())


def test_the_stored_evidence_pools_every_reading_of_the_default_full_benchmark():
    # every held-out reading of the current rule and protocol (tt.READINGS), pooled by experiments/theory_pool: the
    # default protocol over their instances, each run the default command on its set (HELD_OUT's with no option but
    # the results folder, whose name changes no number), in the order they were read
    readings = [[0, *reading] for reading in tt.READINGS]
    assert readings[0] == [0, *tt.HELD_OUT]
    full = tt._protocol(replace(tt.Options(), instances=tuple(sorted({i for r in readings for i in r}))))
    record = evidence.evidence_record({"protocol": full}, STORED["command"])
    assert STORED["protocol"] == json.loads(json.dumps(record["protocol"]))
    assert STORED["settings"] == sorted(tt.SETTINGS)
    # one reading (a new protocol's first) is that run's own record; two or more, their pool
    runs = STORED.get("pooled_from") or [{"command": STORED["command"], "instances": STORED["protocol"]["instances"]}]
    if len(readings) > 1:
        assert re.fullmatch(r"python -m replay_theory\.experiments\.theory_pool --out [\w.-]+( [\w.-]+)+",
                            STORED["command"])
    assert [p["instances"] for p in runs] == readings
    for p, instances in zip(runs, readings):
        default = instances == [0, *tt.HELD_OUT]
        instance_option = "" if default else rf" --instance {','.join(map(str, instances))}"
        assert re.fullmatch(rf"replay-theory experiment theory-test --out [\w.-]+{instance_option}", p["command"])
    # 16 units x 5 mu held out per instance: every reading's cells, each once
    assert all(STORED["targets_held_out"][str(f)]["cells"] == 16 * 5 * 3 * len(readings) for f in tt.FLOORS)
    # every objective the current code scores has its row at every floor (the evidence lines read them by name)
    # (time within a work budget: scored at floors > 0 only, where time is not work)
    for floor in tt.FLOORS:
        budget = set(tt.WORK_BUDGET) if floor > 0 else set()
        assert set(STORED["targets_held_out"][str(floor)]["objectives"]) == {*tt.OBJECTIVES, *tt.PRINTED, *budget}


def test_a_quick_run_of_the_current_code_shares_the_stored_protocol(tmp_path):
    options = tt.Options(instances=(0,), settings=("quadratic-noise10",), optimizers=("sgd",), mus=(5.28,),
                         floors=(64,), seeds=4, quick=True)
    summary = tt.run_theory_test(tmp_path / "quick", options, progress=False)
    quick = json.loads(json.dumps(evidence.evidence_record(summary, "quick")))
    for key in evidence.SHARED_PROTOCOL:
        assert quick["protocol"][key] == STORED["protocol"][key], key
    # and it scores what the stored evidence quotes: the printed answer with and without the pilot
    objectives = quick["targets"]["64"]["objectives"]
    assert {"printed", "printed_with_pilot", "forgetting_b_simple", "on_policy_floor"} <= set(objectives)


def test_the_stored_families_evidence_is_a_families_run_of_the_same_protocol():
    # advise/evidence_families.json (the second evidence line when optimal prices epochs or overlap): the default
    # protocol with every reuse family in the grid, on held-out instances, and the same pilot, objectives, target and
    # step-size search as the default record
    families = json.loads(evidence.FAMILIES_EVIDENCE_FILE.read_text())
    assert families["protocol"]["families"] == ["epochs", "overlap", "selective"]
    for key in evidence.SHARED_PROTOCOL:
        assert families["protocol"][key] == STORED["protocol"][key], key
    assert re.fullmatch(r"replay-theory experiment theory-test --out [\w.-]+ --instance 0(,\d+)+ --families "
                        r"epochs,overlap,selective", families["command"])
    held_out = families["protocol"]["instances"][1:]
    assert families["protocol"]["dev_instances"] == [0] and not set(held_out) & {i for r in tt.READINGS for i in r}
    for floor in tt.FLOORS:
        assert {"printed", "printed_with_pilot", "on_policy_floor"} <= set(
            families["targets_held_out"][str(floor)]["objectives"])

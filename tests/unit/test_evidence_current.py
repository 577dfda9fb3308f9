"""advise/evidence.json (what `optimal`'s tested: and evidence: lines quote) was written by the current benchmark:
its protocol is the one `experiment theory-test` runs by default, and a quick run of the current code shares its
pilot, objectives, target and step-size search (issue 38: "checked against a quick run in CI")."""

from __future__ import annotations

import json
import re

from replay_theory.advise import evidence
from replay_theory.experiments import theory_bench as tt

STORED = json.loads(evidence.EVIDENCE_FILE.read_text())


def test_the_stored_evidence_is_the_default_full_benchmarks():
    full = tt._protocol(tt.Options())
    record = evidence.evidence_record({"protocol": full}, STORED["command"])
    assert STORED["protocol"] == json.loads(json.dumps(record["protocol"]))
    assert STORED["settings"] == sorted(tt.SETTINGS)
    # the default command, with no option but the results folder (whose name changes no number)
    assert re.fullmatch(r"replay-theory experiment theory-test --out [\w.-]+", STORED["command"])
    # every objective the current code scores has its row at every floor (the evidence lines read them by name)
    # (time within a work budget: scored at floors > 0 only, where time is not work)
    for floor in tt.FLOORS:
        budget = set(tt.WORK_BUDGET) if floor > 0 else set()
        assert set(STORED["targets_held_out"][str(floor)]["objectives"]) == {*tt.OBJECTIVES, *tt.PRINTED, *budget}
    assert STORED["protocol"]["instances"] == [0, *tt.HELD_OUT]


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
    assert families["protocol"]["dev_instances"] == [0] and not set(held_out) & set(tt.HELD_OUT)
    for floor in tt.FLOORS:
        assert {"printed", "printed_with_pilot", "on_policy_floor"} <= set(
            families["targets_held_out"][str(floor)]["objectives"])

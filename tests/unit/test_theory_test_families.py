"""theory-test --families epochs (issue 40): epoch designs trained and scored beside the grid, opt-in, the default
protocol untouched; a unit saved with 4-element design lists still loads."""

from __future__ import annotations

import json

import pytest

from replay_theory.advise import evidence
from replay_theory.experiments import theory_bench as tt
from replay_theory.experiments.theory_bench.measure import design_spec
from replay_theory.theory import forgetting as fg


def test_families_are_off_by_default_and_epochs_adds_the_epoch_designs():
    assert tt.Options().families == () and "families" not in tt._protocol(tt.Options())
    assert [label for label, _ in tt.Options().designs()] == [label for label, _ in tt.Options(families=()).designs()]
    full = dict(tt.Options(families=("epochs",)).designs())
    assert full["epochs e=4 m=4"] == fg.Design(64, 256, 256, epochs=4, mini_batches=4)
    assert {k for k in full if k.startswith("epochs")} == {"epochs e=2 m=1", "epochs e=2 m=4", "epochs e=4 m=1",
                                                           "epochs e=4 m=4"}
    quick = tt.Options(quick=True, families=("epochs",))
    assert [k for k, _ in quick.designs() if k.startswith("epochs")] == ["epochs e=2 m=4"] and quick.max_epochs == 2
    with pytest.raises(ValueError, match=r"^--families must be a comma-separated list of distinct names from "
                                         r"epochs, overlap, got epoch$"):
        tt.options_from({"families": "epoch"})


def test_an_old_unit_record_with_four_element_designs_still_loads():
    record = {"designs": [{"design": [256, 256, 256, True]}, {"design": [256, 64, 1024, False]},
                          {"design": [64, 256, 256, False, 2, 4]}]}
    assert tt._designs_of(record) == [fg.Design.on_policy_at(256), fg.Design(256, 64, 1024),
                                      fg.Design.epochs_of(256, 2, 4)]


def test_a_quick_run_with_epochs_trains_and_prices_them(tmp_path):
    options = tt.Options(instances=(0,), settings=("quadratic-noise10",), optimizers=("sgd",), mus=(5.28,),
                         floors=(64,), seeds=4, quick=True, families=("epochs",))
    summary = tt.run_theory_test(tmp_path / "q", options, progress=False)
    unit = json.loads((tmp_path / "q" / "units" / "quadratic-noise10-sgd-0.json").read_text())
    row = next(d for d in unit["designs"] if d["label"] == "epochs e=2 m=4")
    assert row["design"] == [64, 256, 256, False, 2, 4] and row["reached"]
    assert unit["max_epochs"] == 2
    # every FIFO / on-policy row keeps its 4-element list (the default protocol's keys)
    assert all(len(d["design"]) == 4 for d in unit["designs"] if not d["label"].startswith("epochs"))
    # measured compute: steps x (mu max(R, floor) / (e m) + B) = steps x (5.28 x 256 / 8 + 64), by hand
    i = [d["label"] for d in unit["designs"]].index("epochs e=2 m=4")
    assert tt.measured_compute(unit, 5.28, 64)[0, i] == pytest.approx(row["steps"][0] * (5.28 * 256 / 8 + 64))
    # the paper's J and the null model name no epoch design; the forgetting rule prices it
    values = tt.objective_values(unit, 5.28, 64)
    assert values["paper_J"][i] == values["null"][i] == values["noise_scale"][i] == float("inf")
    assert 0 < values["forgetting_exact"][i] < float("inf")
    # the families are in the protocol, so this run cannot stand for advise/evidence.json's default one
    assert summary["protocol"]["families"] == ["epochs"]
    record = evidence.evidence_record(summary, "quick")
    assert record["protocol"]["families"] == ["epochs"] and "families" not in evidence.load_evidence()["protocol"]
    table = tt.summary_table(summary)
    cell = summary["cells"][0]
    assert f"| {cell['best_free']} |" in table and "epochs" in cell["best_free"] + cell["by_objective"]["printed"][
        "free"]


def test_overlap_adds_an_overlapped_design_at_every_on_policy_batch():
    full = dict(tt.Options(families=("overlap",)).designs())
    assert {k: v for k, v in full.items() if k.startswith("overlapped")} == {
        f"overlapped B={b}": fg.Design.overlapped_at(b) for b in tt.ON_POLICY_BATCHES}
    assert tt.Options(families=("overlap",)).max_staleness == 1 and tt.Options().max_staleness == 0
    # a record's seven-element list names one, and the four- and six-element lists still read as before
    record = {"designs": [{"design": [64, 64, 64, True, 1, 1, 1]}, {"design": [64, 64, 64, True]}]}
    assert tt._designs_of(record) == [fg.Design.overlapped_at(64), fg.Design.on_policy_at(64)]
    assert design_spec(fg.Design.overlapped_at(64)) == [64, 64, 64, True, 1, 1, 1]


def test_a_quick_run_with_overlap_trains_and_prices_them(tmp_path):
    options = tt.Options(instances=(0,), settings=("quadratic-noise10",), optimizers=("sgd",), mus=(1.0,),
                         floors=(64,), seeds=4, quick=True, families=("overlap",))
    summary = tt.run_theory_test(tmp_path / "q", options, progress=False)
    unit = json.loads((tmp_path / "q" / "units" / "quadratic-noise10-sgd-0.json").read_text())
    labels = [d["label"] for d in unit["designs"]]
    assert unit["max_staleness"] == 1 and summary["protocol"]["families"] == ["overlap"]
    for b in tt.QUICK_ON_POLICY_BATCHES:
        row, sync = (unit["designs"][labels.index(f"{kind} B={b}")] for kind in ("overlapped", "on-policy"))
        assert row["design"] == [b, b, b, True, 1, 1, 1] and row["reached"]
        # the quadratic has no policy to drift: one-step-old noise is fresh noise, so the exact steps are equal
        assert row["steps"] == sync["steps"]
        i, j = labels.index(f"overlapped B={b}"), labels.index(f"on-policy B={b}")
        compute = tt.measured_compute(unit, 1.0, 64)[0]
        assert compute[i] == pytest.approx(row["steps"][0] * max(1.0 * 64, 2.0 * b))  # max(mu floor, mu R + B)
        assert compute[j] == pytest.approx(sync["steps"][0] * (1.0 * max(b, 64) + b))
    # the baselines are synchronous: none of them names an overlapped design
    values = tt.objective_values(unit, 1.0, 64)
    for name in ("on_policy", "on_policy_small", "on_policy_floor", "on_policy_oracle", "paper_J", "null",
                 "noise_scale"):
        if isinstance(values[name], tt.NoPick):
            continue
        assert all(values[name][labels.index(f"overlapped B={b}")] == float("inf") for b in tt.QUICK_ON_POLICY_BATCHES)
    assert 0 < values["forgetting_exact"][labels.index("overlapped B=32")] < float("inf")

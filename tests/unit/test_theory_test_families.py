"""theory-test --families epochs, overlap and selective (issue 40): each family's designs trained and scored beside the
grid, opt-in, the default protocol untouched; a unit saved with 4-element design lists still loads."""

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
                                         r"epochs, overlap, selective, got epoch$"):
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


def test_selective_adds_the_selective_designs_beside_their_uniform_twins():
    full = tt.Options(families=("selective",))
    selective = {k: v for k, v in full.designs() if k.startswith("selective")}
    # (x, y) in {4, 16} x {2, 8} at B = 256: R = 256 / y, N = x R, by hand
    assert selective == {"selective x=4 y=2": tt.SelectiveDesign(256, 128, 512),
                         "selective x=16 y=2": tt.SelectiveDesign(256, 128, 2048),
                         "selective x=4 y=8": tt.SelectiveDesign(256, 32, 128),
                         "selective x=16 y=8": tt.SelectiveDesign(256, 32, 512)}
    assert all(tt.is_selective(d) and not tt.is_selective(fg.Design(d.batch_size, d.rollouts_per_step, d.capacity))
               for d in selective.values())
    # each has its uniform twin in the grid, a distinct record key, and the buffer selective
    grid = dict(full.designs())
    assert grid["x=16 y=8"] == fg.Design(256, 32, 512) != selective["selective x=16 y=8"]
    assert design_spec(selective["selective x=16 y=8"]) == [256, 32, 512, False, 1, 1, 0, "selective"]
    assert tt.SelectiveDesign.buffer == "selective"
    assert tt._designs_of({"designs": [{"design": [256, 32, 512, False, 1, 1, 0, "selective"]}]}) == [
        tt.SelectiveDesign(256, 32, 512)]
    # the quadratic has no groups of rewards: no selective design there; --quick: one, at x = 16, y = 4
    assert not any(k.startswith("selective") for k, _ in full.designs("quadratic-noise10"))
    assert [k for k, _ in full.designs("bandit-grpo") if k.startswith("selective")] == list(selective)
    quick = tt.Options(quick=True, families=("selective",))
    assert [(k, d) for k, d in quick.designs() if tt.is_selective(d) and not d.dynamic] == [
        ("selective x=16 y=4", tt.SelectiveDesign(256, 64, 1024))]
    # and dynamic sampling at every on-policy batch ([E11]), records apart from on-policy's by their "selective"
    dynamic = {k: d for k, d in full.designs("bandit-grpo") if d.dynamic}
    assert dynamic == {f"dynamic B={b}": tt.SelectiveDesign(b, b, b, True) for b in full.on_policy_batches}
    assert design_spec(dynamic["dynamic B=64"]) == [64, 64, 64, True, 1, 1, 0, "selective"]
    assert tt._designs_of({"designs": [{"design": [64, 64, 64, True, 1, 1, 0, "selective"]}]})[0].dynamic
    assert [k for k, d in quick.designs("two-prompts") if d.dynamic] == [
        f"dynamic B={b}" for b in sorted(quick.on_policy_batches)]
    assert not any(d.dynamic for _, d in full.designs("quadratic-noise10")) and not tt.Options().dynamic_batches
    # optimal does not price them: the printed answer's searches stay those of the default protocol
    assert full.max_epochs == 1 and full.max_staleness == 0
    assert tt.options_from({"families": "selective,overlap"}).families == ("selective", "overlap")
    with pytest.raises(ValueError, match=r"^--families must be a comma-separated list of distinct names from "
                                         r"epochs, overlap, selective, got selectiv$"):
        tt.options_from({"families": "selectiv"})
    with pytest.raises(ValueError, match=r"^--families .* got selective,selective$"):
        tt.options_from({"families": "selective,selective"})


def test_a_quick_run_with_selective_trains_them_and_puts_them_in_the_table(tmp_path):
    options = tt.Options(instances=(0,), settings=("bandit-grpo",), optimizers=("sgd",), mus=(5.28,),
                         floors=(0,), seeds=4, quick=True, families=("selective",))
    summary = tt.run_theory_test(tmp_path / "q", options, progress=False)
    unit = json.loads((tmp_path / "q" / "units" / "bandit-grpo-sgd-0.json").read_text())
    labels = [d["label"] for d in unit["designs"]]
    row, twin = (unit["designs"][labels.index(k)] for k in ("selective x=16 y=4", "x=16 y=4"))
    assert row["design"] == [256, 64, 1024, False, 1, 1, 0, "selective"] and row["reached"]
    assert twin["design"] == [256, 64, 1024, False] and "zero_std_share" not in twin
    # z measured on its runs: the bandit's rewards (1, 0.1, 0) leave some groups all equal, never all of them
    assert 0 < row["zero_std_share"] < 1
    # one step costs what its twin's does: mu R + B = 5.28 x 64 + 256
    i, j = labels.index("selective x=16 y=4"), labels.index("x=16 y=4")
    compute = tt.measured_compute(unit, 5.28, 0)[0]
    assert compute[i] == pytest.approx(row["steps"][0] * (5.28 * 64 + 256))
    assert compute[i] / compute[j] == pytest.approx(row["steps"][0] / twin["steps"][0])
    # no rule prices it (each objective gives it inf), the printed answer is never it, the grid's best counts it
    for name, values in tt.objective_values(unit, 5.28, 0).items():
        assert isinstance(values, tt.NoPick) or values[i] == float("inf"), name
    cell = summary["cells"][0]
    assert not cell["by_objective"]["printed"]["free"].startswith("selective")
    assert cell["selective_gain"] == pytest.approx(
        min(c for k, c in enumerate(compute) if k != i) / compute.min())
    assert summary["protocol"]["families"] == ["selective"]
    table = tt.summary_table(summary)
    assert "## Selective replay" in table
    assert (f"| bandit-grpo | sgd | 0 | x=16 y=4 | {row['zero_std_share']:.3g} | "
            f"{row['steps'][0] / twin['steps'][0]:.3g} |") in table
    best = int(cell["best_free"].startswith("selective"))
    assert f"- floor 0: a selective design is the whole grid's cheapest in {best} of 1 cells" in table


def test_selective_at_z_zero_is_its_uniform_twin_number_for_number(tmp_path):
    # noisy-reward's rewards carry continuous noise: no group is ever of equal rewards (z = 0), every response enters,
    # and the search, started from the twin's first step sizes in the same rows, repeats the twin's runs exactly
    options = tt.Options(instances=(0,), settings=("noisy-reward",), optimizers=("adam",), mus=(1.0,), floors=(0,),
                         seeds=2, quick=True, families=("selective",))
    tt.run_theory_test(tmp_path / "q", options, progress=False)
    unit = json.loads((tmp_path / "q" / "units" / "noisy-reward-adam-0.json").read_text())
    rows = {d["label"]: d for d in unit["designs"]}
    row, twin = rows["selective x=16 y=4"], rows["x=16 y=4"]
    assert row["zero_std_share"] == 0.0
    assert (row["steps"], row["lr"], row["curve"]) == (twin["steps"], twin["lr"], twin["curve"])


def test_an_overlapped_search_starts_from_on_policy_at_b_where_its_own_batch_never_reached():
    """famheld12-881 ended on two-prompts/sgd/907, where on-policy B = 16 reached the target at no step size and the
    overlapped B = 16 search had no other start. A unit whose runs are a synthetic table (every design reaches the
    target in 10 + 4 |log2(lr / lr*)| steps, lr* = 1, except on-policy B = 16, which never does): training it starts
    the overlapped B = 16 search from on-policy B = 256's tuned step size scaled by (16 / 256)^(1/2), as the smaller
    batches' searches are under SGD, and every other search where its own neighbour puts it."""
    from dataclasses import dataclass

    import numpy as np

    from replay_theory.experiments.theory_bench import measure

    options = tt.Options(instances=(907,), settings=("two-prompts",), optimizers=("sgd",), seeds=2,
                         families=("overlap",))
    first_lrs: dict[tuple, float] = {}

    @dataclass
    class TableUnit(measure.Unit):
        def run(self, design, lrs, max_steps, seed_offset=0):
            lrs = np.asarray(lrs, dtype=float)
            spec = tuple(design_spec(design))
            first_lrs.setdefault(spec, float(lrs[0]))
            never = design == fg.Design.on_policy_at(16)
            steps = np.zeros(lrs.size) if never else 10 + np.round(4 * np.abs(np.log2(lrs)))
            return {"key": str(spec), "lrs": lrs.tolist(), "crossing": np.tile(steps, (3, 1)).tolist(),
                    "first_touch": [0] * lrs.size, "steps": max_steps, "curve": [], "curve_steps": []}

    unit = TableUnit(setting=tt.SETTINGS["two-prompts"], optimizer="sgd", instance=907, env=None,
                     inst={"smoothness": 1.0, "target": 1.0}, store=None, options=options,
                     boot_index=np.zeros((2, 2), dtype=int))
    measure.train_unit(unit)
    assert unit.tuned_lr("on-policy B=16") is None
    lr_256 = unit.tuned_lr(f"on-policy B={tt.BATCH}")
    assert lr_256 == 1.0  # the table's optimum, found by the search
    overlapped_16 = tuple(design_spec(fg.Design.overlapped_at(16)))
    # the search's first step sizes are start x sqrt(2)^(1, 0, -1, -2): the start is the second
    assert first_lrs[overlapped_16] / tt.LR_RATIO == pytest.approx(lr_256 * (16 / tt.BATCH) ** 0.5, rel=1e-12)
    # where its own batch reached, an overlapped search starts at that batch's tuned step size, as before
    for b in (64, 256):
        spec = tuple(design_spec(fg.Design.overlapped_at(b)))
        assert first_lrs[spec] / tt.LR_RATIO == pytest.approx(unit.tuned_lr(f"on-policy B={b}"), rel=1e-12)
    assert unit.tuned_lr("overlapped B=16") == pytest.approx(1.0)

"""The SIMULATION.md tables are rebuilt from saved runs; check one end to end on a shrunken spec."""

import copy

from replay_theory.experiments import paper_tables as experiments
from replay_theory.simulate.sweep import expand_spec, run_sweep


def test_sanity_table_reports_the_fifo_formulas(tmp_path):
    spec = copy.deepcopy(experiments.SANITY)
    spec["base"].update(steps=40, seeds=2, num_prompts=16)
    spec["grid"] = {"capacity": [64, 256], "batch_size": [32]}
    spec["configs"] = [{**spec["configs"][1], "steps": 30, "seeds": 2}]  # stale-4
    run_sweep(spec, tmp_path, n_jobs=1, show_progress=False)
    table = experiments.sanity_table(tmp_path)
    lines = table.splitlines()
    row_256 = next(line for line in lines if line.startswith("| 256 | 64 | 32 |"))
    cells = [c.strip() for c in row_256.strip("|").split("|")]
    assert cells[3] == "0.5" and cells[4] == "0.5"  # measured replay ratio == B/R
    assert abs(float(cells[5]) - 1.5) < 0.1 and cells[6] == "1.5"  # staleness vs (N/R - 1)/2
    assert cells[7] == "3" and cells[8] == "3"
    ess_row = next(line for line in lines if "ESS/n vs e^{-D_2}" in line)
    exact, estimate = (float(c) for c in ess_row.strip("|").split("|")[2:4])
    assert abs(exact - estimate) < 0.01


def test_every_experiment_spec_is_valid():
    for name, experiment in experiments.EXPERIMENTS.items():
        if name != "theory-test":  # its own runner (experiments/theory_bench/), not a sweep spec
            assert expand_spec(experiment.spec), name
    assert set(experiments.EXPERIMENTS) == {"sanity", "experience-replay", "freshper", "m2po", "rloo", "exgrpo",
                                            "theory-test"}


def test_equal_compute_budget_of_the_experience_replay_runs():
    # steps x (1 + W/T) = 300 x (1 + mu): every buffered run gets the on-policy compute
    assert experiments._equal_compute(5.28, 4, 4) == round(300 * 6.28 / 2)
    assert experiments._equal_compute(0.5, 1, 7) == round(300 * 1.5 / (1 + 1 / 7))

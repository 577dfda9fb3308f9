"""experiments/theory_pool: readings of one protocol pooled into one record. Pooling two runs gives the targets one
run over the union of their instances gives (the same cells, scored by the same ``targets``), the development instance
counted once; runs of another protocol, or a unit that differs between runs, are refused in one line before anything
is written."""

from __future__ import annotations

import json
import math

import pytest

from replay_theory.advise import evidence
from replay_theory.experiments import theory_bench as tt
from replay_theory.experiments import theory_pool

TINY = dict(settings=("quadratic-noise10",), optimizers=("sgd",), mus=(0.5, 5.28), floors=(0, 64), seeds=4,
            quick=True)


def _run(path, instances, **changes):
    options = tt.Options(instances=instances, **{**TINY, **changes})
    summary = tt.run_theory_test(path, options, progress=False)
    tt.write_evidence(path, summary, f"replay-theory experiment theory-test --out {path.name}")
    return summary


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pool")
    return root, {name: _run(root / name, instances) for name, instances in
                  (("a", (0, 3)), ("b", (0, 4)), ("joint", (0, 3, 4)))}


def _comparable(targets: dict) -> dict:
    return json.loads(json.dumps(targets))


def test_two_readings_pooled_score_as_one_run_over_both(runs):
    root, summaries = runs
    theory_pool.main(["--out", str(root / "pooled"), str(root / "a"), str(root / "b")])
    pooled = json.loads((root / "pooled" / "summary.json").read_text())
    joint = summaries["joint"]
    assert pooled["protocol"]["instances"] == [0, 3, 4]
    # the dev instance's unit once: 2 floors x 2 mus cells per unit, 3 units
    assert len(pooled["cells"]) == len(joint["cells"]) == 12
    for key in ("targets", "targets_held_out"):
        assert _comparable(pooled[key]) == _comparable(joint[key]), key
    # by hand: the held-out share within 1.2x is the two runs' counts over their cells
    for floor in ("0", "64"):
        a, b = (summaries[n]["targets_held_out"][floor]["objectives"]["printed"]["free"] for n in ("a", "b"))
        p = pooled["targets_held_out"][floor]["objectives"]["printed"]["free"]
        assert p["within_1.2"] == a["within_1.2"] + b["within_1.2"]
        assert math.isclose(p["share_within_1.2"], (a["within_1.2"] + b["within_1.2"]) / 4, rel_tol=1e-12)
        assert p["worst"] == max(a["worst"], b["worst"])
    record = json.loads((root / "pooled" / "evidence.json").read_text())
    assert record["targets_held_out"] == pooled["targets_held_out"]
    assert [p["run"] for p in record["pooled_from"]] == [str(root / "a"), str(root / "b")]
    assert record["pooled_from"][0]["command"] == "replay-theory experiment theory-test --out a"
    assert record["command"].startswith("python -m replay_theory.experiments.theory_pool --out ")
    # the evidence lines read a pooled record as they read a run's
    line = evidence.evidence_line("forgetting", "printed", record, 0.0)
    assert line.startswith("evidence (held-out instances (2 in 2 readings, pooled), latency floor 0")
    assert "4 test cases" in line and record["command"] in line


def test_runs_of_another_protocol_or_another_unit_are_refused_in_one_line(runs, tmp_path, capsys):
    root, _ = runs

    def altered(name: str, change) -> str:  # run b's record with one change, as another run would hold it
        folder = tmp_path / name
        folder.mkdir()
        summary = json.loads((root / "b" / "summary.json").read_text())
        change(summary)
        (folder / "summary.json").write_text(json.dumps(summary))
        (folder / "evidence.json").write_text((root / "b" / "evidence.json").read_text())
        return str(folder)

    with pytest.raises(SystemExit) as exit_:  # a run with more seeds: another protocol
        theory_pool.main(["--out", str(tmp_path / "p1"), str(root / "a"),
                          altered("more_seeds", lambda s: s["protocol"].update(seeds=5))])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "differs in seeds" in err
    assert not (tmp_path / "p1").exists()

    def other_cell(summary: dict) -> None:  # instance 0's first cell scored otherwise (another code version)
        assert summary["cells"][0]["instance"] == 0
        summary["cells"][0]["by_objective"]["printed"]["free_regret"] = 9.0

    with pytest.raises(SystemExit) as exit_:
        theory_pool.main(["--out", str(tmp_path / "p2"), str(root / "a"), altered("changed", other_cell)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "quadratic-noise10/sgd/0 holds other cells" in err
    assert not (tmp_path / "p2").exists()
    # one run, or a folder without a finished run
    for args in ([str(root / "a")], [str(root / "a"), str(tmp_path)]):
        with pytest.raises(SystemExit) as exit_:
            theory_pool.main(["--out", str(tmp_path / "p3"), *args])
        assert exit_.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    assert not (tmp_path / "p3").exists()

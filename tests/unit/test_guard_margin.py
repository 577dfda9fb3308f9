"""experiments/guard_margin.py: the guard's margin rescored on a run's moved cells (by hand), the ratio it reads
against the guard itself, and bad input."""

from __future__ import annotations

import json

import pytest

from replay_theory.experiments import guard_margin as gm
from replay_theory.theory import forgetting as fg
from replay_theory.theory.guarded import guarded_design


def test_margin_counts_by_hand():
    # (r, printed regret, floor rule's regret): a cell keeps its printed regret only while r > M
    rows = [(3.0, 0.5, 1.0), (1.5, 2.0, 1.1), (2.5, 1.3, 1.0)]
    got = gm.margin_counts(rows, [1.2, 2.0, 3.0, float("inf")])
    assert got[0] == (1.2, 3, 1, 2.0)  # regrets 0.5, 2.0, 1.3
    assert got[1] == (2.0, 2, 2, 1.3)  # 0.5, 1.1, 1.3
    assert got[2] == (3.0, 0, 3, 1.1)  # r = 3 does not clear 3: 1.0, 1.1, 1.0
    assert got[3] == (float("inf"), 0, 3, 1.1)


def test_the_ratio_is_the_guards():
    pilot = {"b_simple": {"b_noise": 120.0}, "kappa_pairs": {"kappa": 0.3}, "drift": None,  # a quadratic's pilot
             "steps": 3, "hvps": 3, "recipe_steps": 1000.0}  # of a long run: affordable (pilot_affordable)
    r, choice, default = gm.guard_move(pilot, "sgd", 5.28, 64)
    g = guarded_design(120.0, 256, 5.28, fg.Memory(0.3, "sgd", 0.9, 256.0), optimizer="sgd", group_size=8,
                       staleness=fg.NO_POLICY, floor=64.0, max_steps_ratio=1000.0, margin=1.0)
    assert r == pytest.approx(g.worst_default / g.worst_choice, rel=1e-12) and r > 1
    assert (choice, default) == ("B=416 R=64 N=4096", "on-policy B=64")  # test_theory_test_pilot's printed answer
    for margin in (1.2, 2.0, 5.0):  # the guard moves exactly when the ratio clears its margin
        moved = guarded_design(120.0, 256, 5.28, fg.Memory(0.3, "sgd", 0.9, 256.0), optimizer="sgd", group_size=8,
                               staleness=fg.NO_POLICY, floor=64.0, max_steps_ratio=1000.0, margin=margin).moved
        assert moved == (r > margin)
    assert gm.guard_move({**pilot, "b_simple": {"b_noise": None}}, "sgd", 5.28, 64) is None  # no b: no guard


@pytest.mark.parametrize("margins", ["0.5", "nan", "two", "1.2,inf"])
def test_bad_margins_are_one_line(tmp_path, capsys, margins):
    (tmp_path / "units").mkdir()
    (tmp_path / "summary.json").write_text(json.dumps({"cells": []}))
    with pytest.raises(SystemExit) as exit_:
        gm.main([str(tmp_path), "--margins", margins])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1 and "--margins" in err


def test_a_folder_that_is_no_run_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        gm.main([str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "is not a finished experiment theory-test folder" in err


def test_an_empty_run_counts_nothing(tmp_path, capsys):
    (tmp_path / "units").mkdir()
    (tmp_path / "summary.json").write_text(json.dumps({"cells": []}))
    gm.main([str(tmp_path), "--margins", "2"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("0 cells moved off the floor rule's design at the runs' margin (0 left out: their printed "
                      "answer is another rule's)")

"""experiments.theory_bench.tables.floors_table and geometric_mean_regret on a hand-made summary (issue 38)."""

from __future__ import annotations

import math

from replay_theory.experiments.objectives_table import main
from replay_theory.experiments.theory_bench.tables import floors_table, geometric_mean_regret


def _objective(share, worst, not_reached=0, spearman=None, hits=0, cheapest=0, false=0, false_worst=None):
    return {"free": {"share_within_1.2": share, "worst": worst, "not_reached": not_reached},
            "min_setting_spearman": spearman,
            "replay_branch": {"hits": hits, "replay_cheapest_by_20%": cheapest, "false_alarms": false,
                              "false_alarm_worst": false_worst}}


def _cell(instance, floor, printed, trivial):
    return {"instance": instance, "floor": floor,
            "by_objective": {"printed": {"free_regret": printed}, "on_policy_floor": {"free_regret": trivial}}}


SUMMARY = {
    "protocol": {"floors": [0, 64], "headline_floor": 64, "dev_instances": [0]},
    "targets_held_out": {
        "0": {"cells": 4, "objectives": {"printed": _objective(0.75, 1.6),
                                         "on_policy_floor": _objective(0.5, math.inf, not_reached=1)}},
        "64": {"cells": 4, "objectives": {"printed": _objective(1.0, 1.04, spearman=0.47, hits=2, cheapest=3, false=1,
                                                                false_worst=1.04),
                                          "on_policy_floor": _objective(0.25, 1.5)}}},
    "cells": [_cell(0, 0, 9.0, 9.0),  # the development instance: left out of the held-out means
              _cell(1, 0, 1.0, 2.0), _cell(2, 0, 4.0, 0.5), _cell(1, 64, 1.0, 1.0),
              {"instance": 2, "floor": 64, "not_scored": "no pilot", "by_objective": {}}],
}


def test_floors_table_by_hand():
    lines = floors_table(SUMMARY).splitlines()
    assert lines[0] == "| objective | floor 0 | floor 64 | Spearman (64) | replay branch (64) |"
    assert lines[1] == "|---|---|---|---|---|"
    assert lines[2] == ("| **optimal's answer as printed** (least compute, its default) | 75% / 1.60 | 100% / 1.04 | "
                        "0.47 | 2 of 3, 1 false (1.04) |")
    # a pick that never reached the target makes the worst inf; no Spearman is n/a; objectives absent are left out
    assert lines[3] == ("| **trivial: on-policy at max(floor, smallest batch)** | 50% / inf | 25% / 1.50 | n/a | "
                        "0 of 0, 0 false |")
    assert len(lines) == 4


def test_geometric_mean_regret_by_hand():
    # floor 0, held out: sqrt(1 * 4) = 2 and sqrt(2 * 0.5) = 1; instance 0's 9 counts only with held_out=False
    assert geometric_mean_regret(SUMMARY, "printed") == {0: 2.0, 64: 1.0}
    assert geometric_mean_regret(SUMMARY, "on_policy_floor") == {0: 1.0, 64: 1.0}
    assert math.isclose(geometric_mean_regret(SUMMARY, "printed", held_out=False)[0], 36 ** (1 / 3))
    missing = {**SUMMARY, "cells": [_cell(1, 0, None, 1.0)]}
    missing["cells"][0]["by_objective"]["printed"]["no_pick"] = "no b"  # no pick: a miss, no mean
    assert math.isnan(geometric_mean_regret(missing, "printed")[0])
    # a pick that never reached the target, which a saved record keeps as None (strict JSON): inf, not nan
    never = {**SUMMARY, "cells": [_cell(1, 0, None, 1.0), _cell(2, 0, 1.5, 1.0)]}
    assert geometric_mean_regret(never, "printed") == {0: math.inf}


def test_the_command_prints_both(tmp_path, capsys):
    import json

    (tmp_path / "summary.json").write_text(json.dumps(SUMMARY))
    main([str(tmp_path)])
    out = capsys.readouterr().out
    assert floors_table(SUMMARY) in out
    assert ("geometric-mean regret at floors 0, 64: the printed answer 2.000, 1.000; the trivial floor rule 1.000, "
            "1.000") in out


def test_a_folder_without_a_summary_is_one_line_and_exit_2(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path)])
    assert exit_.value.code == 2 and capsys.readouterr().err == (
        f"python -m replay_theory.experiments.objectives_table: RUN_DIR {tmp_path} holds no summary.json (give a "
        "finished experiment theory-test run's folder)\n")


def test_a_summary_that_is_not_a_benchmarks_is_one_line_and_exit_2(tmp_path, capsys):
    import pytest

    for text in ("{not json", '{"cells": []}', "[1, 2]"):
        (tmp_path / "summary.json").write_text(text)
        with pytest.raises(SystemExit) as exit_:
            main([str(tmp_path)])
        assert exit_.value.code == 2 and capsys.readouterr().err == (
            f"python -m replay_theory.experiments.objectives_table: RUN_DIR {tmp_path} has a summary.json that is not "
            "a theory-test run's (give a finished experiment theory-test run's folder)\n")


def test_the_printed_answer_against_the_floor_rule_by_hand(tmp_path, capsys):
    import json

    from replay_theory.experiments.theory_bench.tables import printed_against_floor_rule

    def cell(instance, mu, printed, regret, piloted, trivial="on-policy B=8"):
        return {"setting": "two-prompts", "optimizer": "adam", "instance": instance, "mu": mu, "floor": 0,
                "best_free": "on-policy B=64",
                "by_objective": {"printed": {"free": printed, "free_regret": regret, "piloted": piloted},
                                 "on_policy_floor": {"free": trivial, "free_regret": 1.0}}}

    summary = {**SUMMARY, "protocol": {**SUMMARY["protocol"], "floors": [0]},
               "cells": [cell(0, 1.0, "on-policy B=8", 9.0, True),  # the development instance: left out
                         cell(1, 0.5, "on-policy B=8", 1.5, False), cell(1, 20.0, "x=4 y=2", 1.9, True),
                         cell(2, 0.5, "on-policy B=8", 1.2, True)]}
    row = printed_against_floor_rule(summary)[0]
    assert (row["cells"], row["same_pick"], row["no_pilot"]) == (3, 2, 1)
    assert row["best_family"] == {"on-policy": 3}  # every cell's best is on-policy B=64
    assert (row["worst"]["instance"], row["worst"]["mu"]) == (1, 20.0)
    assert printed_against_floor_rule(summary, held_out=False)[0]["worst"]["instance"] == 0
    summary["cells"][1]["by_objective"]["printed"]["free_regret"] = None  # never reached: the worst, said in words
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    main([str(tmp_path)])
    assert ("floor 0: the printed design is the trivial floor rule's in 2 of 3 cells, no pilot in 1; its worst cell "
            "never reached: two-prompts / adam / 1 at mu 0.5 (printed on-policy B=8, the grid's best on-policy B=64)"
            ) in capsys.readouterr().out
    summary["cells"][1]["by_objective"]["printed"]["free"] = "printed: epochs R=400 e=4 m=1"  # an off-grid answer
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    main([str(tmp_path)])
    assert ("(printed epochs R=400 e=4 m=1, the grid's best on-policy B=64); the grid's best is on-policy in 3 of 3"
            in capsys.readouterr().out)


def test_best_family_of_every_grid_and_printed_label():
    from replay_theory.experiments.theory_bench.tables import best_family

    labels = {"on-policy B=8": "on-policy", "x=16 y=8": "replay", "epochs e=4 m=4": "epochs",
              "overlapped B=32": "overlapped", "selective x=16 y=8": "selective",
              "printed: B=1024 R=64 N=4096": "replay", "printed: epochs R=400 e=4 m=1": "epochs",
              "printed: overlapped B=24": "overlapped", "printed: on-policy B=8": "on-policy", None: None}
    assert {label: best_family(label) for label in labels} == labels


def test_moved_cells_against_a_base_run_by_hand(tmp_path, capsys):
    import json

    import pytest

    from replay_theory.experiments.objectives_table import moved_cells

    def cell(instance, mu, printed, regret):
        return {"setting": "two-prompts", "optimizer": "adam", "instance": instance, "mu": mu, "floor": 0,
                "best_free": "on-policy B=8",
                "by_objective": {"printed": {"free": printed, "free_regret": regret},
                                 "on_policy_floor": {"free": "on-policy B=8", "free_regret": 1.0}}}

    protocol = {**SUMMARY["protocol"], "floors": [0]}
    base = {**SUMMARY, "protocol": protocol, "cells": [cell(0, 1.0, "on-policy B=8", 1.0),
                                                       cell(1, 0.5, "on-policy B=8", 1.1),
                                                       cell(1, 2.0, "on-policy B=8", 1.3),
                                                       cell(2, 0.5, "on-policy B=8", 1.0)]}
    here = {**base, "cells": [cell(0, 1.0, "epochs e=4 m=4", 3.0),  # the development instance: left out
                              cell(1, 0.5, "epochs e=4 m=4", 2.0), cell(1, 2.0, "epochs e=4 m=4", 1.15),
                              cell(2, 0.5, "on-policy B=8", 1.0)]}  # unchanged: not counted
    m = moved_cells(here, base)  # moved: (2.0 vs 1.1) and (1.15 vs 1.3); medians of two: their means
    assert (m["moved"], m["within_here"], m["within_base"]) == (2, 1, 1)
    assert (m["median_here"], m["median_base"]) == (pytest.approx(1.575, rel=1e-12), pytest.approx(1.2, rel=1e-12))
    for name, summary in (("here", here), ("base", base)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    main([str(tmp_path / "here"), "--against", str(tmp_path / "base")])
    assert ("the printed design differs in 2 cells (every floor); within 1.2x of the grid's best there: 1 here, 1 in "
            f"{tmp_path / 'base'}; median regret 1.57 here, 1.20 there") in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path / "here"), "--against", str(tmp_path / "nowhere")])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"python -m replay_theory.experiments.objectives_table: --against {tmp_path / 'nowhere'} holds no "
        "summary.json (give a finished experiment theory-test run's folder)")


def test_the_two_routes_scored_apart_by_hand(tmp_path, capsys):
    import json

    from replay_theory.experiments.theory_bench.tables import by_route

    def cell(instance, floor, printed, trivial, piloted):
        return {"instance": instance, "floor": floor,
                "by_objective": {"printed": {"free_regret": printed, "piloted": piloted},
                                 "on_policy_floor": {"free_regret": trivial}}}

    summary = {"protocol": {"floors": [0, 64], "headline_floor": 64, "dev_instances": [0]},
               "cells": [cell(0, 0, 9.0, 9.0, True),  # the development instance: left out
                         cell(1, 0, 1.1, 1.3, True), cell(2, 0, 1.4, 1.4, True), cell(3, 0, 2.5, 2.5, False),
                         cell(1, 64, None, 1.0, True),  # never reached: inf, not within
                         cell(2, 64, 1.0, 1.0, None)]}  # a record from before the route was kept: left out
    del summary["cells"][-1]["by_objective"]["printed"]["piloted"]
    routes = by_route(summary)

    def brief(r):  # cells, within 1.2x, worst of one route
        return r["cells"], r["within_1.2"], r["worst"]

    assert {k: brief(v) for k, v in routes[0]["printed"].items()} == {"piloted": (2, 1, 1.4), "no_pilot": (1, 0, 2.5)}
    assert {k: brief(v) for k, v in routes[0]["floor_rule"].items()} == {"piloted": (2, 0, 1.4),
                                                                        "no_pilot": (1, 0, 2.5)}
    assert brief(routes[64]["printed"]["piloted"]) == (1, 0, math.inf)  # never reached: inf, not within
    assert routes[64]["printed"].keys() == {"piloted"} and brief(routes[64]["floor_rule"]["piloted"]) == (1, 1, 1.0)
    assert brief(by_route(summary, held_out=False)[0]["printed"]["piloted"]) == (3, 1, 9.0)
    (tmp_path / "summary.json").write_text(json.dumps({**summary, "targets_held_out": {}}))
    main([str(tmp_path)])
    out = capsys.readouterr().out
    assert ("floor 0, piloted (2 cells): the printed answer 50% within 1.2x, worst 1.40; the trivial floor rule 0%, "
            "worst 1.40\nfloor 0, no pilot (1 cells): the printed answer 0% within 1.2x, worst 2.50; the trivial floor "
            "rule 0%, worst 2.50\nfloor 64, piloted (1 cells): the printed answer 0% within 1.2x, worst inf; the "
            "trivial floor rule 100%, worst 1.00") in out


def test_the_selective_family_lines_by_hand():
    # --families selective: where a selective design (replay or dynamic sampling) is the grid's cheapest, by how much
    # (the best without the family over it: selective_gain), how many of those ran no pilot, and both rules within
    # 1.2x of the best with and without the family (regret / selective_gain)
    from replay_theory.experiments.theory_bench.tables import selective_floor_lines

    def cell(instance, best, gain, printed, trivial, piloted=True):
        return {"instance": instance, "floor": 0, "best_free": best, "selective_gain": gain,
                "by_objective": {"printed": {"free_regret": printed, "piloted": piloted},
                                 "on_policy_floor": {"free_regret": trivial}}}

    summary = {"protocol": {"floors": [0], "dev_instances": [0]},
               "cells": [cell(0, "dynamic B=8", 3.0, 9.0, 9.0),  # the development instance: left out
                         cell(1, "dynamic B=8", 1.1, 1.1, 1.1, piloted=False),
                         cell(2, "selective x=4 y=2", 1.3, 1.3, 1.5),
                         cell(3, "on-policy B=8", 1.0, 1.0, 1.25),
                         {"instance": 4, "floor": 0, "best_free": "on-policy B=8", "by_objective": {}}]}  # no family
    assert selective_floor_lines(summary) == [
        "- floor 0: a selective design is the whole grid's cheapest in 2 of 3 cells, dynamic sampling in 1 of them "
        "(the best without the family costs median 1.2, range 1.1-1.3 (2) x it; 1 of them in runs too short for a "
        "pilot, where optimal has no zero share); within 1.2x of the grid's best with the family / without it: "
        "optimal's printed answer 2 of 3 (worst 1.30) / 3 of 3 (worst 1.00), the trivial rule 1 of 3 (worst 1.50) / "
        "2 of 3 (worst 1.25)"]
    assert selective_floor_lines(summary, held_out=False)[0].startswith(
        "- floor 0: a selective design is the whole grid's cheapest in 3 of 4 cells, dynamic sampling in 2 of them")
    assert selective_floor_lines({**summary, "cells": summary["cells"][4:]}) == []  # no cell with the family


def test_the_cells_one_step_resolves_scored_apart_by_hand():
    from replay_theory.experiments.theory_bench.tables import RESOLVED_STEPS, resolution_lines

    def cell(instance, floor, best, printed, trivial):
        return {"setting": "s", "optimizer": "sgd", "instance": instance, "floor": floor, "best_free": best,
                "by_objective": {"printed": {"free_regret": printed}, "on_policy_floor": {"free_regret": trivial}}}

    def unit(instance, steps):  # grid designs keep one number of steps, a printed answer a list
        return {"setting": "s", "optimizer": "sgd", "instance": instance,
                "designs": [{"label": "on-policy B=8", "steps": steps[0]}, {"label": "x=4 y=2", "steps": steps[1]}],
                "printed": [{"label": "printed: B=24 R=8 N=32", "steps": [steps[2]]}]}

    summary = {"protocol": {"floors": [0, 64], "dev_instances": [0]},
               "units": [unit(0, (3, 3, 3)), unit(1, (RESOLVED_STEPS - 1, 40, 12)), unit(2, (RESOLVED_STEPS, 5, 5))],
               "cells": [cell(0, 0, "on-policy B=8", 9.0, 9.0),  # the development instance: left out
                         cell(1, 0, "on-policy B=8", 3.0, 3.0),  # best under 10 steps: apart
                         cell(1, 0, "x=4 y=2", 1.1, 1.3), cell(2, 0, "on-policy B=8", 1.5, 1.0),
                         cell(1, 64, "printed: B=24 R=8 N=32", None, 1.0),  # a printed best of 12 steps; no pick
                         cell(2, 64, "x=4 y=2", 1.0, 1.0)]}  # best in 5 steps
    summary["cells"][4]["by_objective"]["printed"]["no_pick"] = "no b"
    assert resolution_lines(summary) == [
        "floor 0: 1 of 3 cells' best took under 10 steps; over the other 2: the printed answer 50% within 1.2x, worst "
        "1.50; the trivial floor rule 50% within 1.2x, worst 1.30",
        "floor 64: 1 of 2 cells' best took under 10 steps; over the other 1: the printed answer 0% within 1.2x, worst "
        "n/a (no pick); the trivial floor rule 100% within 1.2x, worst 1.00"]
    # a best design whose steps the summary does not keep is counted apart, never taken for a short one
    unknown = {**summary, "cells": [*summary["cells"], cell(2, 0, "x=64 y=64", 1.0, 1.0)]}
    assert resolution_lines(unknown)[0].startswith(
        "floor 0: 1 of 4 cells' best took under 10 steps, 1 its steps not kept; over the other 2: the printed answer "
        "50% within 1.2x")
    assert resolution_lines({**summary, "units": []}) == []  # no steps kept: nothing resolved, no line

"""experiments/epochs_check.py: the epoch model's steps ratio against a unit record's measured one, by hand."""

from __future__ import annotations

import json
import math

import pytest

from replay_theory.experiments import epochs_check as ec
from replay_theory.theory import forgetting as fg


def _record(optimizer: str = "sgd") -> dict:
    row = {"label": "on-policy B=256", "design": [256, 256, 256, True], "steps": [10.0]}
    ep = {"label": "epochs e=4 m=4", "design": [64, 256, 256, False, 4, 4], "steps": [12.0]}
    fifo = {"label": "x=4 y=1", "design": [256, 256, 1024, False], "steps": [11.0]}
    return {"optimizer": optimizer, "designs": [row, ep, fifo], "noise": {"exact_b_noise": 300.0},
            "pilot": {"kappa_exact": 0.3}}


def test_a_pair_is_the_models_ratio_against_the_measured_one():
    pairs = ec.epoch_pairs(_record())
    assert len(pairs) == 1  # the FIFO and the on-policy rows are no epoch design
    p = pairs[0]
    memory = fg.Memory(0.3, "sgd", 0.9, 256.0)
    ep, on = fg.predict_many([fg.Design.epochs_of(256, 4, 4), fg.Design.on_policy_at(256)], 300.0, 1.0, memory)
    assert (p["e"], p["m"], p["measured"], p["kappa"]) == (4, 4, 1.2, 0.3)
    assert p["predicted"] == pytest.approx(ep.steps / on.steps, rel=1e-14)
    assert p["b"] == pytest.approx(300.0 / 64)
    # psi_E at the design's own kappa: 1 + B_noise psi_E / B' over 1 + B_noise / 256 (no staleness on the quadratic)
    assert p["predicted"] == pytest.approx((1 + 300.0 * ep.psi / 64) / (1 + 300.0 / 256), rel=1e-12)
    # no exact B_noise, or an on-policy reference that never reached: no pair
    assert ec.epoch_pairs({**_record(), "noise": {"exact_b_noise": None}}) == []
    broken = _record()
    broken["designs"][0]["steps"] = [math.inf]
    assert ec.epoch_pairs(broken) == []


def test_the_table_counts_within_25_percent_and_the_cli_refuses_an_empty_folder(tmp_path, capsys):
    pairs = [{"optimizer": "sgd", "e": 2, "m": 1, "predicted": v, "measured": 1.0, "kappa": k}
             for v, k in ((1.0, 0.5), (1.3, 2.0), (0.5, 3.0))]
    assert ec.table(pairs)[2] == "| sgd | e=2 m=1 | 3 | 1 | 1.00 | 0.50-1.30 |"
    assert ec.regime_table(pairs)[2:] == ["| sgd | < 1 | 1 | 1 | 1.00 | 1.00-1.00 |",
                                          "| sgd | >= 1 | 2 | 0 | 0.90 | 0.50-1.30 |"]
    with pytest.raises(SystemExit) as info:
        ec.main([str(tmp_path)])
    assert info.value.code == 2
    assert capsys.readouterr().err.startswith(f"RUN_DIR {tmp_path}: no quadratic unit records")
    (tmp_path / "units").mkdir()
    bad = tmp_path / "units" / "quadratic-noise10-sgd-7.json"
    bad.write_text("[1, 2]")  # not a unit record: one line, exit 2
    with pytest.raises(SystemExit) as info:
        ec.main([str(tmp_path)])
    assert info.value.code == 2
    assert capsys.readouterr().err.startswith(f"RUN_DIR {tmp_path}: quadratic-noise10-sgd-7.json is not a unit record")
    (tmp_path / "units" / "quadratic-noise10-sgd-7.json").write_text(json.dumps({**_record(), "setting": "q"}))
    ec.main([str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "1 quadratic units, 1 (unit, epoch design) pairs; exact inputs"
    assert out[3].startswith("| sgd | e=4 m=4 | 1 | ")


def test_horizon_pairs_are_score_horizon_checks_exact_rows():
    record = _record()
    record["designs"] += [{"label": "x=1 y=2", "design": [256, 128, 128, False], "steps": [10.0]},
                          {"label": "x=16 y=2", "design": [256, 128, 2048, False], "steps": [8.0]}]
    record["pilot"]["kappa_pairs"] = {"kappa": 0.3}
    record["noise"]["b_noise"] = 300.0
    pairs = ec.horizon_pairs(record)
    from replay_theory.experiments.theory_bench.score import horizon_check

    rows = [h for h in horizon_check(record) if h["predicted_exact"] and h["measured"]]
    assert len(pairs) == len(rows) == 1  # y = 2 only: y = 1 has no x = 1 row
    assert (pairs[0]["predicted"], pairs[0]["measured"], pairs[0]["kappa"]) == (rows[0]["predicted_exact"], 0.8, 0.3)

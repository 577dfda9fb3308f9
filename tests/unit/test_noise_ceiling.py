"""experiments/noise_ceiling.py: the resampled oracle's share within 1.2x, against hand values."""

import json
import math

import numpy as np
import pytest

from replay_theory.experiments import noise_ceiling as nc

INF = math.inf


def test_share_by_hand():
    # replicate 0 is the point estimate (best 10); the oracle picks on replicates 1 and 2 and is judged on replicate 0
    assert nc.resampled_oracle_share(np.array([[10.0, 11, 20], [12, 10, 20], [9, 13, 30]])) == 1.0  # 1.1, then 1.0
    assert nc.resampled_oracle_share(np.array([[10.0, 13, 20], [12, 10, 20], [9, 13, 30]])) == 0.5  # 1.3, then 1.0
    assert nc.resampled_oracle_share(np.array([[10.0, INF], [INF, 5]])) == 0.0  # its pick never reached the target
    assert nc.resampled_oracle_share(np.array([[10.0, 30]])) == 1.0  # one replicate: exact curves, no seed noise


def test_ceiling_averages_unit_by_mu_cells_and_skips_instances(monkeypatch):
    tables = {("a", 1.0, 0): [[10.0, 13], [12, 10]], ("a", 2.0, 0): [[10.0, 11], [12, 10]],
              ("b", 1.0, 0): [[10.0, 30], [12, 10]], ("b", 2.0, 0): [[10.0, 30], [12, 10]]}
    monkeypatch.setattr(nc, "measured_compute", lambda u, mu, floor: np.array(tables[(u["name"], mu, floor)]))
    units = [{"name": "a", "instance": 7, "designs": [1]}, {"name": "b", "instance": 0, "designs": [1]},
             {"name": "c", "instance": 7, "designs": [], "not_scored": "no pilot"}]
    assert nc.ceiling(units, (1.0, 2.0), (0,)) == {0: (0.25, 4)}  # a: 0 and 1; b: 0 and 0
    assert nc.ceiling(units, (1.0, 2.0), (0,), skip_instances=(0,)) == {0: (0.5, 2)}


def test_a_folder_that_is_not_a_run_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "units").mkdir()  # no options.json: not a finished run
    with pytest.raises(SystemExit) as stop:
        nc.main([str(tmp_path)])
    assert stop.value.code == 2
    assert capsys.readouterr().err == (f"{tmp_path} is not a finished experiment theory-test folder (it needs units/ "
                                       "and options.json)\n")


def test_resampled_regrets_and_spearman_by_hand():
    compute = np.array([[10.0, 13, 20], [12, 10, 20], [9, 13, 30], [30, 20, 10]])
    # picks on resamples 1, 2, 3: designs 1, 0, 2, judged on replicate 0 (best 10): 1.3, 1.0, 2.0
    np.testing.assert_array_equal(nc.resampled_oracle_regrets(compute), [1.3, 1.0, 2.0])
    assert nc.resampled_oracle_regrets(np.array([[10.0, 30]])).tolist() == [1.0]  # no seed noise
    assert nc.resampled_oracle_regrets(np.array([[10.0, INF], [INF, 5]])).tolist() == [INF]  # never reached
    # Spearman with replicate 0 (order 0 < 1 < 2): the same order 1, the reverse -1, and [9, 13, 30] 1: mean 1/3
    rows = np.array([[10.0, 13, 20], [1, 2, 3], [3, 2, 1], [9, 13, 30]])
    assert nc.resampled_spearman(rows) == pytest.approx(1 / 3)
    assert nc.resampled_spearman(np.array([[10.0, 13, 20]])) == 1.0
    assert nc.resampled_spearman(np.array([[10.0, 13, 20], [5, 5, 5]])) is None  # constant: undefined


def test_worst_and_spearman_ceilings_over_cells(monkeypatch):
    tables = {("a", 1.0, 0): [[10.0, 13, 40], [12, 10, 40], [20, 10, 40]],  # medians: 1.3
              ("a", 2.0, 0): [[10.0, 40, 13], [40, 12, 10], [40, 50, 10]],  # 1.3
              ("b", 1.0, 0): [[10.0, 30, 40], [12, 10, 40], [20, 10, 40]],  # 3.0 (both resamples pick design 1)
              ("b", 2.0, 0): [[10.0, 20, 30], [10, 20, 30], [30, 20, 10]]}  # median of 1.0 and 3.0: 2.0
    monkeypatch.setattr(nc, "measured_compute", lambda u, mu, floor: np.array(tables[(u["name"], mu, floor)]))
    units = [{"name": "a", "instance": 7, "designs": [1], "setting": "s", "optimizer": "sgd"},
             {"name": "b", "instance": 0, "designs": [1], "setting": "t", "optimizer": "adam"}]
    assert nc.worst_ceiling(units, (1.0, 2.0), (0,)) == {0: (2, 3.0, 4)}
    assert nc.worst_ceiling(units, (1.0, 2.0), (0,), skip_instances=(0,)) == {0: (0, 1.3, 2)}
    rho = nc.spearman_ceiling(units, (1.0, 2.0), (0,))
    # a: mu 1 ranks [12 10 40] and [20 10 40] against [10 13 40]: 0.5 each; mu 2 [40 12 10], [40 50 10] against
    # [10 40 13]: -0.5 and 0.5; mean 0.25. b: mu 1 0.5, 0.5; mu 2 1, -1; mean 0.25
    assert rho == {"s/sgd": pytest.approx(0.25), "t/adam": pytest.approx(0.25)}


def test_several_readings_pool_each_unit_once(tmp_path, monkeypatch, capsys):
    # two runs that share the development unit (instance 0): it counts once, each reading's own unit once
    tables = {7: [[10.0, 13], [12, 10]], 9: [[10.0, 11], [12, 10]], 0: [[10.0, 30], [12, 10]]}
    monkeypatch.setattr(nc, "measured_compute", lambda u, mu, floor: np.array(tables[u["instance"]]))
    for run, instance in (("r1", 7), ("r2", 9)):
        (tmp_path / run / "units").mkdir(parents=True)
        (tmp_path / run / "options.json").write_text(json.dumps({"mus": [1.0], "floors": [0], "dev_instances": [0]}))
        for i in (0, instance):
            unit = {"setting": "s", "optimizer": "sgd", "instance": i, "designs": [1]}
            (tmp_path / run / "units" / f"s-sgd-{i}.json").write_text(json.dumps(unit))
    nc.main([str(tmp_path / "r1"), str(tmp_path / "r2")])
    # 7: the resample's pick (design 1) is 1.3x, not within; 9: 1.1x, within; 0: 3x, not within -> 1 of 3
    assert capsys.readouterr().out.splitlines()[0].startswith(
        "floor 0: the grid's best picked on a seed resample is within 1.2x in 33.3% of 3 cells")
    nc.main([str(tmp_path / "r1"), str(tmp_path / "r2"), "--held-out-only"])
    assert "within 1.2x in 50.0% of 2 cells" in capsys.readouterr().out
    shared = tmp_path / "r2" / "units" / "s-sgd-0.json"  # the shared unit trained otherwise: refused in one line
    shared.write_text(json.dumps({"setting": "s", "optimizer": "sgd", "instance": 0, "designs": [2]}))
    with pytest.raises(SystemExit) as stop:
        nc.main([str(tmp_path / "r1"), str(tmp_path / "r2")])
    assert stop.value.code == 2 and "s/sgd/0 holds other designs' runs" in capsys.readouterr().err
    shared.write_text(json.dumps({"setting": "s", "optimizer": "sgd", "instance": 0, "designs": [1]}))
    (tmp_path / "r2" / "options.json").write_text(json.dumps({"mus": [2.0], "floors": [0]}))
    with pytest.raises(SystemExit) as stop:  # another protocol's mus: refused in one line
        nc.main([str(tmp_path / "r1"), str(tmp_path / "r2")])
    assert stop.value.code == 2 and capsys.readouterr().err.count("\n") == 1

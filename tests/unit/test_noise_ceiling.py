"""experiments/noise_ceiling.py: the resampled oracle's share within 1.2x, against hand values."""

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

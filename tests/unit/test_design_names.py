"""The one adapter for saved design records (core.designs.in_design_names, DesignConfig.from_record): a file of the
old shape (N, B, R; optimal's buffer_size) reads as the new one (capacity, batch_size, rollouts_per_step)."""

from __future__ import annotations

import pytest

from replay_theory.core.designs import DesignConfig, in_design_names
from replay_theory.experiments import lm_horizon
from replay_theory.theory import forgetting as fg

FIELDS = {"mu": 5.28, "x_star": 7.97, "y_star": 6.29, "regime": "replay"}
OLD_PREDICTED = {**FIELDS, "N": 510, "B": 403, "R": 64}  # validate predict before the design kept one name
NEW_PREDICTED = {**FIELDS, "capacity": 510, "batch_size": 403, "rollouts_per_step": 64}
ROW = {"name": "replay y=4 x=16", "buffer": "fifo", "loss": "grpo", "family": True, "x": 16.0, "y": 4.0}
OLD_ROW = {**ROW, "N": 256, "B": 64, "R": 16}  # a verify report row saved before
NEW_ROW = {**ROW, "capacity": 256, "batch_size": 64, "rollouts_per_step": 16}


def test_an_old_predicted_json_and_an_old_report_row_load_to_the_new_shapes_design():
    predicted = DesignConfig(capacity=510, batch_size=403, rollouts_per_step=64)
    assert DesignConfig.from_record(OLD_PREDICTED) == DesignConfig.from_record(NEW_PREDICTED) == predicted
    assert in_design_names(OLD_PREDICTED) == in_design_names(NEW_PREDICTED) == NEW_PREDICTED
    row = DesignConfig(capacity=256, batch_size=64, rollouts_per_step=16, group_size=4)
    assert DesignConfig.from_record(OLD_ROW, group_size=4) == DesignConfig.from_record(NEW_ROW, group_size=4) == row
    assert in_design_names(OLD_ROW) == in_design_names(NEW_ROW) == NEW_ROW
    # experiments/lm_horizon prices either row as the same design: N = 256, B = 64, R = 16
    assert lm_horizon._design(OLD_ROW) == lm_horizon._design(NEW_ROW) == fg.Design(64, 16, 256, False)


def test_a_size_the_record_lacks_is_none_and_optimal_json_before_capacity_says_buffer_size():
    on_policy = {"regime": "on-policy", "N": None, "B": None, "R": 64}  # the paper's on-policy has no N, B
    assert in_design_names(on_policy) == {"regime": "on-policy", "capacity": None, "batch_size": None,
                                          "rollouts_per_step": 64}
    rloo = {"name": "RLOO rho=0", "buffer": "group-replay", "capacity": None, "batch_size": 16, "rollouts_per_step": 16}
    assert in_design_names(rloo) == rloo  # group replay has no N: left None
    old_optimal = {"buffer_size": 512.0, "batch_size": 256, "rollouts_per_step": 64, "rho": 0.1}
    assert in_design_names(old_optimal) == {"batch_size": 256, "rollouts_per_step": 64, "rho": 0.1, "capacity": 512.0}
    with pytest.raises(ValueError, match=r"^the record has no capacity \(one of capacity, buffer_size, N\)$"):
        DesignConfig.from_record(on_policy)

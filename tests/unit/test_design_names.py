"""The one adapter for saved design records (core.designs.in_design_names, DesignConfig.from_record): a file of the
old shape (N, B, R; optimal's buffer_size) reads as the new one (capacity, batch_size, rollouts_per_step)."""

from __future__ import annotations

import json

import pytest

from replay_theory.core.designs import DesignConfig, in_design_names
from replay_theory.experiments import lm_horizon
from replay_theory.integrations.replay_config import ReplayConfig
from replay_theory.theory import forgetting as fg
from replay_theory.theory.design import finite_budget_design
from replay_theory.theory.noise_scale import noise_scale_pick
from replay_theory.theory.profiles import PowerLawProfile

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


def _old_shape(record: dict) -> dict:
    """``record`` as it was saved before the theory's design records said capacity, batch_size, rollouts_per_step."""
    old = {"capacity": "N", "batch_size": "B", "rollouts_per_step": "R"}
    return {old.get(k, k): v for k, v in record.items()}


def test_the_theorys_records_saved_with_n_b_r_read_as_todays(cli, tmp_path, optimal_profile):
    """optimal --json's design rows (designs.at_batch / on_policy / replay), the rules' picks in a verify report and
    the finite-budget large-budget limit said B, R, N before: a file saved then still feeds the trainer the same
    design, and each record reads through the adapter as today's."""
    # a replay answer needs --optimizer sgd and a staleness table reaching age 63 since the guarded rule (issue 38);
    # it answers replay at B = 297 (the bare argmin under adam was B = 144, with the same R = 64, N = 4096)
    code, out, _ = cli("optimal", "--mu", "5.28", "-B", "256", "--profile", optimal_profile(64.0), "--kappa", "0.5",
                       "--optimizer", "sgd", "--latency-floor", "64", "--json")
    new = json.loads(out)
    rows = new["designs"]
    assert code == 0 and new["winner"] == "replay"
    assert (rows["replay"]["capacity"], rows["replay"]["batch_size"], rows["replay"]["rollouts_per_step"]) == (
        new["capacity"], new["batch_size"], new["rollouts_per_step"]) == (4096, 297, 64)
    saved = tmp_path / "design.json"
    saved.write_text(json.dumps({**new, "designs": {k: _old_shape(v) for k, v in rows.items()}}))
    assert ReplayConfig.from_optimal_json(saved) == ReplayConfig.from_optimal_json(new) == ReplayConfig(
        capacity=4096, batch_size=297, rollouts_per_step=64)
    for name, row in rows.items():
        assert _old_shape(row)["N"] == row["capacity"] and in_design_names(_old_shape(row)) == row, name
    for pick in (noise_scale_pick(16.0, 64, 8, 5.28), fg.forgetting_pick(2383, 64, 8, 5.28, 0.1, "adam")):
        assert pick["regime"] == "replay" and in_design_names(_old_shape(pick)) == pick
    limit = finite_budget_design(budget=1e4, mu=5.28, profile=PowerLawProfile(0.25), rho=0.1, smoothness=1.0,
                                 bias=0.1, f0=1.0, batch_size=256).large_budget_limit
    assert limit is not None and (limit["fixed"], limit["capacity"], limit["rollouts_per_step"]) == ("B", 194, 80)
    assert in_design_names(_old_shape(limit)) == limit  # "fixed" names the size held fixed: its value stays "B"


def test_one_design_type_from_the_record_to_the_config_and_back():
    """theory.designs.Design is what DesignConfig reads and builds (``.design``, ``from_design``): an old
    predicted.json, the new one and the forgetting model's design are one design, under one set of names."""
    design = fg.Design(batch_size=403, rollouts_per_step=64, capacity=510, group_size=1)
    assert DesignConfig.from_record(OLD_PREDICTED, group_size=1).design == design
    config = DesignConfig.from_design(design, loss="rloo")
    assert (config.buffer, config.loss, config.capacity, config.batch_size, config.rollouts_per_step,
            config.group_size) == ("fifo", "rloo", 510, 403, 64, 1)
    assert config.design == design and (design.x, design.y) == (7, 403 / 64)
    on = DesignConfig.from_design(fg.Design.on_policy_at(64, group_size=8))
    assert (on.buffer, on.capacity, on.batch_size, on.rollouts_per_step, on.group_size) == ("on-policy", 64, 64, 64, 8)
    assert on.design == fg.Design(64, 64, 64, True, 8)
    with pytest.raises(ValueError, match=r"^on-policy needs N = R = B, got N=256, R=64, B=64$"):
        _ = DesignConfig(buffer="on-policy", capacity=256, batch_size=64, rollouts_per_step=64).design

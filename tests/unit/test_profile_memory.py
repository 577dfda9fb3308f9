"""The profile record's ``memory`` field (the optimizer's memory kappa, issue 30): round trip and checks."""

import json

import numpy as np
import pytest

from replay_theory.advise.profile_files import load_profile, save_profile
from replay_theory.theory.forgetting import KappaEstimate, Memory, kappa_from_curvature_pairs
from replay_theory.theory.profiles import memory_record, unmeasured_memory

TABLE = {"kind": "table", "staleness": [0, 1, 2], "sigma_sq": [1.0, 1.2, 1.5]}


def _estimate() -> KappaEstimate:
    rng = np.random.default_rng(0)
    num, den = rng.uniform(0.5, 1.5, 32), rng.uniform(1.0, 2.0, 32)
    return kappa_from_curvature_pairs(num, den, 0.01, np.random.default_rng(1), optimizer="adam", beta1=0.9,
                                      pilot_batch=64.0)


def test_memory_round_trips_beside_the_noise_scale(tmp_path):
    estimate = _estimate()
    exact = memory_record(KappaEstimate(0.0071, (0.0069, 0.0073), 0.9, "exact", "adam", 0.9, 64.0, 100))
    data = {**TABLE, "noise_scale": {"b_noise": 150.0, "b_noise_interval": [140.0, 160.0], "batch": 64},
            "memory": memory_record(estimate), "memory_estimators": {"exact": exact}}
    path = tmp_path / "p.json"
    save_profile(path, data)
    loaded = load_profile(path)
    assert loaded.memory == json.loads(json.dumps(estimate.to_dict()))  # the record as written, nothing dropped
    assert loaded.memory["kappa"] == pytest.approx(estimate.kappa, rel=1e-15)
    assert loaded.memory_estimators["exact"]["method"] == "exact"
    assert loaded.noise_scale["b_noise"] == 150.0
    assert loaded.memory_model() == Memory(estimate.kappa, "adam", 0.9, 64.0)
    # kind noise_scale (calibrate --from-log without a table) and power_law carry it too
    for kind in ({"kind": "noise_scale", "noise_scale": data["noise_scale"]}, {"kind": "power_law", "alpha": 0.3}):
        other = tmp_path / f"{kind['kind']}.json"
        save_profile(other, {**kind, "memory": memory_record(estimate)})
        assert load_profile(other).memory["kappa"] == pytest.approx(estimate.kappa)


def test_files_without_memory_still_load(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(TABLE))
    loaded = load_profile(path)
    assert loaded.memory is None and loaded.memory_estimators is None
    with pytest.raises(ValueError, match="no memory record"):
        loaded.memory_model()


def test_an_unmeasured_kappa_is_null_with_its_reason(tmp_path):
    negative = KappaEstimate(-0.02, (-0.05, 0.01), 0.9, "curvature-pairs", "sgd", 0.9, 8.0, 10)
    record = memory_record(negative)
    assert record["kappa"] is None and record["kappa_measured"] == -0.02 and "not positive" in record["reason"]
    path = tmp_path / "p.json"
    save_profile(path, {**TABLE, "memory": record})
    with pytest.raises(ValueError, match="not measured: kappa measured -0.02"):
        load_profile(path).memory_model()
    none = unmeasured_memory("no curvature pairs logged", method="curvature-pairs", optimizer="adam", beta1=0.9)
    save_profile(tmp_path / "q.json", {**TABLE, "memory": none})
    assert load_profile(tmp_path / "q.json").memory["reason"] == "no curvature pairs logged"


GOOD = {"kappa": 0.01, "kappa_interval": [0.008, 0.012], "level": 0.9, "method": "curvature-pairs",
        "optimizer": "adam", "beta1": 0.9, "pilot_batch": 64, "units": 10}


@pytest.mark.parametrize("change,message", [
    ({"kappa": 0.0}, r"memory.kappa' must be a finite number > 0 or null with a reason"),
    ({"kappa": -1.0}, r"memory.kappa' must be a finite number > 0"),
    ({"kappa": "0.1"}, r"memory.kappa' must be a finite number > 0"),
    ({"kappa": True}, r"memory.kappa' must be a finite number > 0"),
    ({"kappa": None}, r"memory.kappa' is null without a 'reason'"),
    ({"kappa": None, "reason": " "}, r"memory.kappa' is null without a 'reason'"),
    ({"optimizer": "rmsprop"}, r"memory.optimizer' must be one of sgd, momentum, adam"),
    ({"beta1": 1.0}, r"memory.beta1' must be a number in \[0, 1\)"),
    ({"beta1": -0.1}, r"memory.beta1' must be a number in \[0, 1\)"),
    ({"beta1": None}, r"memory.beta1' must be a number in \[0, 1\)"),
    ({"kappa_interval": [0.1]}, r"memory.kappa_interval' must be \[low, high\]"),
    ({"pilot_batch": 0}, r"memory.pilot_batch' must be null or a finite number > 0"),
])
def test_bad_memory_records_are_one_line_errors(tmp_path, change, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**TABLE, "memory": {**GOOD, **change}}))
    with pytest.raises(ValueError, match=message) as info:
        load_profile(path)
    assert "\n" not in str(info.value)


def test_bad_memory_estimators_name_their_entry(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**TABLE, "memory_estimators": {"lag": {**GOOD, "optimizer": "x"}}}))
    with pytest.raises(ValueError, match=r"memory_estimators.lag.optimizer"):
        load_profile(path)
    path.write_text(json.dumps({**TABLE, "memory_estimators": [GOOD]}))
    with pytest.raises(ValueError, match="must be a JSON object"):
        load_profile(path)
    path.write_text(json.dumps({**TABLE, "memory": [GOOD]}))
    with pytest.raises(ValueError, match="profile 'memory' must be a JSON object"):
        load_profile(path)


def test_curvature_pairs_record_leaves_out_pairs_without_noise_and_takes_a_schedule():
    from replay_theory.theory.profiles import curvature_pairs_record

    num, den = np.array([1.0, 2.0, 0.0, 3.0]), np.array([2.0, 2.0, 0.0, 4.0])
    record = curvature_pairs_record(num, den, 0.1, np.random.default_rng(0), optimizer="adam", beta1=0.9,
                                    pilot_batch=8.0, detail={"source": "test"})
    assert record["kappa"] == pytest.approx(0.1 * 6.0 / 8.0) and record["units"] == 3  # the xi = 0 pair adds 0 / 0
    assert record["pairs_without_noise"] == 1 and record["source"] == "test" and record["step"] == 0.1
    # a learning-rate schedule: kappa = sum eta_i num_i / sum den_i
    eta = np.array([0.1, 0.2, 0.3, 0.4])
    scheduled = curvature_pairs_record(num, den, eta, np.random.default_rng(0), optimizer="sgd", beta1=0.0)
    assert scheduled["kappa"] == pytest.approx((0.1 * 1 + 0.2 * 2 + 0.4 * 3) / 8.0)
    assert scheduled["step_range"] == [0.1, 0.4] and scheduled["step"] == pytest.approx(0.7 / 3)
    empty = curvature_pairs_record(num * 0, den * 0, 0.1, np.random.default_rng(0), optimizer="adam", beta1=0.9)
    assert empty["kappa"] is None and "0 of 4 curvature pairs have a gradient difference xi != 0" in empty["reason"]
    negative = curvature_pairs_record(-num, den, 0.1, np.random.default_rng(0), optimizer="adam", beta1=0.9)
    assert negative["kappa"] is None and negative["kappa_measured"] < 0 and "not positive" in negative["reason"]

"""simulate/store.py: the one run store of the sweep and the benchmark."""

from __future__ import annotations

import json

import numpy as np
import pytest

from replay_theory import __version__
from replay_theory.simulate.store import VERSION_KEY, RunStore, run_key


def test_put_get_and_layout(tmp_path):
    store = RunStore(tmp_path)
    config = {"env": "bandit", "lr": 0.1}
    record = store.put(config, {"steps": [3, float("nan")]})
    key = run_key(config)
    path = tmp_path / "runs" / f"{key}.json"
    assert json.loads(path.read_text()) == {"key": key, VERSION_KEY: __version__, "config": config, "steps": [3, None]}
    assert store.get(config) == record and store.has(key) and store.files() == [path]
    assert store.get({"env": "bandit", "lr": 0.2}) is None


def test_never_overwritten(tmp_path):
    store = RunStore(tmp_path)
    config = {"a": 1}
    first = store.put(config, {"x": 1.0})
    assert store.put(config, {"x": 1.0}) == first  # a second worker with the same record: accepted
    with pytest.raises(ValueError, match="same config with other results than this run computed; results are never"):
        store.put(config, {"x": 2.0})
    assert store.get(config)["x"] == 1.0


def test_arrays_first_and_temps(tmp_path):
    store = RunStore(tmp_path, indent=1)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "k1.npz").write_bytes(b"orphan of an interrupted write")
    (tmp_path / "runs" / "k0.tmp.npz").write_bytes(b"half-written, older name")
    store.save({"key": "k1", VERSION_KEY: __version__, "config": {}}, {"curve": np.arange(3.0)})
    assert np.load(tmp_path / "runs" / "k1.npz")["curve"].tolist() == [0.0, 1.0, 2.0]
    assert (tmp_path / "runs" / "k1.json").read_text().startswith('{\n "key": "k1"')
    store.clear_temps()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["k1.json", "k1.npz"]
    assert [p.name for p in store.files()] == ["k1.json"]

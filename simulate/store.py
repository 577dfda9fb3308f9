"""The run store of the sweep (``simulate/sweep.py``) and of the benchmark (``experiments/theory_bench``).

Paper: none of its own; it keeps the runs that check experience-replay's (docs/REFERENCES.md) rules.

OUT/runs/KEY.json holds one run: its ``key``, the code version (``replay_theory_version``), its ``config`` and its
results; a run with arrays has them beside it in OUT/runs/KEY.npz, written first, so the JSON marks a finished run.
KEY hashes the config with the code version (``run_key``), so results of other code never share a key.

| code name     | meaning                                                                           |
|---------------|-----------------------------------------------------------------------------------|
| ``run_key``   | 16 hex digits of sha256(config + code version): the run's file name               |
| ``RunStore``  | get / put of OUT/runs/KEY.json (+ .npz), never overwritten, safe under workers    |
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..outputs import NEVER, strict, write_once

VERSION_KEY = "replay_theory_version"
"""Key of the code version in every runs/KEY.json (and in a sweep's spec.json)."""


def run_key(config: dict) -> str:
    """A stable short hash of ``config`` and the package version (the run's file name)."""
    text = json.dumps({**config, "code_version": __version__}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _json_default(value: Any) -> Any:
    """numpy scalars and arrays as JSON numbers and lists."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(type(value).__name__)


class RunStore:
    """OUT/runs/KEY.json (+ KEY.npz): one file per run, with its config and the code version; written whole (a
    temporary file hard-linked into place, ``outputs.write_once``), never overwritten; an existing one is reused
    (an interrupted run resumes).

    Safe under parallel workers: when two compute one run, the first whole file wins and the second is accepted if
    it holds the same record (the runs are deterministic); a different record under the same key is refused (one
    line), never written over. ``indent``: the JSON's indent (the sweep's files are indented, the benchmark's not).
    """

    def __init__(self, out: str | Path, *, indent: int | None = None):
        self.runs = Path(out) / "runs"
        self.indent = indent

    def path(self, key: str, suffix: str = ".json") -> Path:
        return self.runs / f"{key}{suffix}"

    def has(self, key: str) -> bool:
        """Whether the run ``key`` is finished (its JSON is saved)."""
        return self.path(key).exists()

    def get(self, config: dict) -> dict | None:
        """The saved record of ``config`` (run under this code version), or None."""
        path = self.path(run_key(config))
        return json.loads(path.read_text()) if path.exists() else None

    def put(self, config: dict, result: dict) -> dict:
        """Save ``result`` of ``config`` (``strict``: nan and inf as null) under its key; returns the record."""
        key = run_key(config)
        return self.save({"key": key, VERSION_KEY: __version__, "config": config, **strict(result)})

    def save(self, record: dict, arrays: dict[str, np.ndarray] | None = None) -> dict:
        """Save ``record`` (its ``key`` names the files) and, first, its ``arrays`` (KEY.npz); returns the record
        as stored. An npz without its JSON is what an interrupted write left, and is replaced; a saved JSON is
        never written over."""
        self.runs.mkdir(parents=True, exist_ok=True)
        key = record["key"]
        path = self.path(key)
        text = json.dumps(record, indent=self.indent, default=_json_default, allow_nan=True)
        if arrays is not None and not path.exists():
            tmp = self.runs / f".{key}.{os.getpid()}-{secrets.token_hex(4)}.tmp.npz"
            try:
                np.savez_compressed(tmp, **arrays)
                os.replace(tmp, self.path(key, ".npz"))
            finally:
                tmp.unlink(missing_ok=True)
        found = write_once(path, text)
        if found is None or found == text:
            return record
        stored, ours = json.loads(found), json.loads(text)
        if stored == ours:  # the same record, written by another worker (key order, spacing aside)
            return stored
        what = "the same config with other results" if stored.get("config") == ours["config"] else "another config"
        raise ValueError(f"--out {path} holds {what} than this run computed; {NEVER}: choose a new --out")

    def files(self) -> list[Path]:
        """Every saved run's JSON, sorted by key (temporary files of a write in progress left out)."""
        return sorted(p for p in self.runs.glob("*.json")
                      if not p.name.startswith(".") and not p.name.endswith(".tmp.json"))

    def clear_temps(self) -> None:
        """Remove what interrupted writes left: hidden temporaries and the older KEY.tmp.* names. Only for a
        single writer (a sweep clears before it writes): a parallel worker's write in progress would go too."""
        if self.runs.is_dir():
            for stale in [*self.runs.glob("*.tmp.*"), *self.runs.glob(".*")]:
                stale.unlink(missing_ok=True)

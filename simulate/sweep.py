"""Sweeps as data: a JSON spec of a grid over SimConfig fields, run in parallel, resumable.

Spec (JSON)::

    {
      "name": "fifo-sizes",
      "base": {"env": "bandit", "steps": 300, "seeds": 16},
      "grid": {"capacity": [64, 256, 1024], "batch_size": [32, 64]},
      "configs": [{"buffer": "on-policy"}]
    }

The configurations are the Cartesian product of ``grid`` over ``base`` plus each
entry of ``configs`` (merged over ``base``). Each configuration runs all its seeds
in one vectorised process; configurations run in parallel through joblib (the
``loky`` process backend locally; ``dask`` or ``ray`` for a cluster through
joblib's backend registry). No home-made process pool.

Output directory::

    spec.json            the spec and the code version, written once; a different spec in the same
                         directory, or one written by another version, is refused
    runs/KEY.npz         per-step curves of one configuration (S x steps arrays), written first
    runs/KEY.json        its full config, summary and code version, written last and atomically: the
                         completion marker
    results.csv          tidy table, one row per (configuration, seed), rebuilt from runs/*.json

A finished configuration is never run again or overwritten, so an interrupted
sweep resumes where it stopped and a crash mid-sweep loses only the
configurations in flight. A resumed sweep never mixes code versions. Every
argument (spec, --jobs, --backend, --out) is checked before anything is
written, and a sweep that fails before its first configuration finishes
removes what it created.
"""

from __future__ import annotations

import csv
import importlib.util
import itertools
import json
import os
from pathlib import Path

import joblib
import numpy as np

from replay_theory import __version__
from replay_theory.outputs import check_out_dir as check_out_path
from replay_theory.simulate.config import SimConfig, config_from_dict
from replay_theory.simulate.engine import run
from replay_theory.simulate.progress import ProgressBar

SPEC_KEYS = {"name", "base", "grid", "configs", "description"}
BACKENDS = ("loky", "threading", "dask", "ray")
# The package each joblib backend beyond joblib's own needs, and how to install it.
BACKEND_PACKAGES = {"dask": ("distributed", "pip install 'dask[distributed]'"),
                    "ray": ("ray", "pip install 'ray[default]'")}
VERSION_KEY = "replay_theory_version"
"""Key of the code version in spec.json and in every runs/KEY.json."""


def load_spec(path: str | Path) -> dict:
    path = Path(path)
    try:
        spec = json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"sweep spec {str(path)!r} cannot be read: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"sweep spec {str(path)!r} is not valid JSON: {err.msg} (line {err.lineno})") from None
    return validate_spec(spec)


def validate_spec(spec: dict) -> dict:
    if not isinstance(spec, dict):
        raise ValueError("sweep spec must be a JSON object")
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        raise ValueError(f"unknown sweep spec key(s): {', '.join(sorted(unknown))}; "
                         f"valid: {', '.join(sorted(SPEC_KEYS))}")
    if not isinstance(spec.get("base", {}), dict):
        raise ValueError("sweep spec 'base' must be an object of config fields")
    grid = spec.get("grid", {})
    if not isinstance(grid, dict) or any(not isinstance(v, list) or not v for v in grid.values()):
        raise ValueError("sweep spec 'grid' must map config fields to non-empty lists")
    if not isinstance(spec.get("configs", []), list):
        raise ValueError("sweep spec 'configs' must be a list of objects")
    if not grid and not spec.get("configs"):
        raise ValueError("sweep spec has no configuration to run: it needs a non-empty 'grid' (field -> list of "
                         "values) or 'configs' (a list of field objects); for one configuration write "
                         "\"configs\": [{}] next to 'base'")
    expand_spec(spec)  # every configuration validated before any work
    return spec


def expand_spec(spec: dict) -> list[SimConfig]:
    """All configurations of a spec, each validated; duplicates removed (first kept)."""
    base = spec.get("base", {})
    grid = spec.get("grid", {})
    rows = []
    if grid:
        names = list(grid)
        for values in itertools.product(*(grid[n] for n in names)):
            rows.append({**base, **dict(zip(names, values))})
    for extra in spec.get("configs", []):
        if not isinstance(extra, dict):
            raise ValueError("sweep spec 'configs' entries must be objects")
        rows.append({**base, **extra})
    configs, seen = [], set()
    for row in rows:
        config = config_from_dict(row)
        if config.key() not in seen:
            seen.add(config.key())
            configs.append(config)
    return configs


def _run_one(config: SimConfig, runs_dir: str) -> str:
    """Run a configuration and write its files (curves first, then the JSON marker atomically)."""
    result = run(config)
    key = config.key()
    base = Path(runs_dir) / key
    arrays = {f"curve__{k}": v for k, v in result.curves.items()}
    arrays.update({f"eval__{k}": v for k, v in result.evals.items()})
    arrays.update(eval_steps=result.eval_steps, staleness_counts=result.staleness_counts,
                  replay_counts=result.replay_counts, time_since_last_use_counts=result.time_since_last_use_counts,
                  drift_lags=result.drift["lags"], drift_kl=result.drift["kl_new_behav"])
    tmp_npz = base.with_suffix(".tmp.npz")
    np.savez_compressed(tmp_npz, **arrays)
    os.replace(tmp_npz, base.with_suffix(".npz"))
    tail = max(1, result.eval_steps.size // 10)
    payload = {
        "key": key,
        VERSION_KEY: __version__,
        "config": config.to_dict(),
        "summary": result.summary(),
        "per_seed": {
            "final_reward": result.evals["reward"][:, -tail:].mean(axis=1).tolist(),
            "final_accuracy": result.evals["accuracy"][:, -tail:].mean(axis=1).tolist(),
            "compute": result.curves["compute"][:, -1].tolist(),
        },
        "ess_by_age": {str(k): v for k, v in result.ess_by_age.items()},
        "counts": result.counts,
    }
    tmp_json = base.with_suffix(".tmp.json")
    tmp_json.write_text(json.dumps(payload, indent=1, default=_json_default, allow_nan=True))
    os.replace(tmp_json, base.with_suffix(".json"))
    return key


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(type(value).__name__)


def pending_configs(configs: list[SimConfig], out_dir: Path) -> list[SimConfig]:
    runs = out_dir / "runs"
    return [c for c in configs if not (runs / f"{c.key()}.json").exists()]


def check_jobs(n_jobs: int) -> int:
    """joblib's n_jobs as this package allows it: -1 (all cores) or a count >= 1."""
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or (n_jobs != -1 and n_jobs < 1):
        raise ValueError(f"--jobs must be -1 (all cores) or an integer >= 1, got {n_jobs!r}")
    return n_jobs


def check_backend(backend: str) -> str:
    """A joblib backend that can run here: the name is known and its package is installed."""
    if backend not in BACKENDS:
        raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend in BACKEND_PACKAGES:
        package, install = BACKEND_PACKAGES[backend]
        if importlib.util.find_spec(package) is None:
            raise ValueError(f"--backend {backend} needs the {package} package, which is not installed: {install}")
    return backend


def read_run(path: Path) -> dict:
    """One runs/KEY.json; a corrupt file is a one-line error naming it and the fix."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err.msg}: line {err.lineno} column {err.colno}): a run file "
                         f"damaged after it was written; delete it and its .npz, then run the sweep again to "
                         f"recompute that configuration") from None


def _run_files(out_dir: Path) -> list[Path]:
    return sorted(p for p in (out_dir / "runs").glob("*.json") if not p.name.endswith(".tmp.json"))


def _canonical(spec: dict) -> str:
    return json.dumps({**spec, VERSION_KEY: __version__}, indent=1, sort_keys=True)


def check_out_dir(spec: dict, out_dir: str | Path) -> None:
    """``out_dir`` can take this sweep: new, empty, or holding this very spec from this code version (resume).

    Raises a one-line ValueError naming --out otherwise: a file, a folder of unrelated files, another
    spec, another code version, or a corrupt run file. Reads only; writes nothing.
    """
    out_dir = check_out_path(out_dir)
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    spec_file = out_dir / "spec.json"
    if not spec_file.is_file():
        raise ValueError(f"--out {out_dir} is a non-empty directory that holds no sweep (no spec.json); results go "
                         f"into a new or empty directory, so they never mix with other files")
    try:
        stored = json.loads(spec_file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{spec_file} is not valid JSON ({err.msg}: line {err.lineno}); choose a new --out") from None
    version = stored.pop(VERSION_KEY, None) if isinstance(stored, dict) else None
    if version != __version__:
        raise ValueError(f"--out {out_dir} holds results of replay-theory {version or 'before 0.1.0'}, this is "
                         f"{__version__}; versions are never mixed in one sweep: choose a new --out")
    if stored != json.loads(json.dumps(spec)):
        raise ValueError(f"{str(out_dir)!r} holds the results of a different sweep spec; choose a new --out")
    for path in _run_files(out_dir):
        run_version = read_run(path).get(VERSION_KEY)
        if run_version != __version__:
            raise ValueError(f"{path} was written by replay-theory {run_version or 'before 0.1.0'}, this is "
                             f"{__version__}; versions are never mixed in one sweep: choose a new --out")


def prepare_out_dir(spec: dict, out_dir: str | Path) -> Path:
    """Check ``out_dir`` (:func:`check_out_dir`), then create it and write spec.json if new; clear stale temps."""
    out_dir = Path(out_dir)
    check_out_dir(spec, out_dir)
    (out_dir / "runs").mkdir(parents=True, exist_ok=True)
    spec_file = out_dir / "spec.json"
    if not spec_file.exists():
        spec_file.write_text(_canonical(spec))
    for stale in (out_dir / "runs").glob("*.tmp.*"):
        stale.unlink()  # files of a configuration interrupted mid-write
    return out_dir


def _created_by_us(out_dir: Path) -> list[Path]:
    """The folders (deepest first) that creating ``out_dir/runs`` will make: removed again if nothing finishes."""
    missing = [p for p in [out_dir / "runs", out_dir, *out_dir.parents] if not p.exists()]
    return missing


def _remove_unfinished(out_dir: Path, created: list[Path], wrote_spec: bool) -> None:
    """Undo a sweep that failed before any configuration finished: no empty or half-written folder is left."""
    runs = out_dir / "runs"
    if runs.is_dir() and _run_files(out_dir):
        return  # finished configurations are results: kept, and the sweep resumes from them
    if runs.is_dir():
        for stale in runs.glob("*.tmp.*"):
            stale.unlink()
    if wrote_spec:
        (out_dir / "spec.json").unlink(missing_ok=True)
    for folder in created:  # deepest first
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def run_sweep(spec: dict, out_dir: str | Path, n_jobs: int = -1, backend: str = "loky", show_progress: bool = True
              ) -> Path:
    """Run every pending configuration of ``spec`` into ``out_dir``; returns results.csv.

    Everything is checked (spec, n_jobs, backend, out_dir) before the first file is written.
    """
    configs = expand_spec(validate_spec(spec))
    check_jobs(n_jobs)
    check_backend(backend)
    out_dir = Path(out_dir)
    check_out_dir(spec, out_dir)
    created = _created_by_us(out_dir)
    wrote_spec = not (out_dir / "spec.json").exists()
    try:
        prepare_out_dir(spec, out_dir)
        todo = pending_configs(configs, out_dir)
        runs_dir = str(out_dir / "runs")
        if backend == "ray":
            from ray.util.joblib import register_ray  # optional cluster engine, checked installed above

            register_ray()
        progress = ProgressBar("configurations", len(configs), len(configs) - len(todo), enabled=show_progress)
        if todo:
            with joblib.parallel_config(backend=backend, n_jobs=n_jobs):
                tasks = (joblib.delayed(_run_one)(c, runs_dir) for c in todo)
                for _ in joblib.Parallel(return_as="generator_unordered")(tasks):
                    progress.advance()
        progress.close()
    except BaseException:
        _remove_unfinished(out_dir, created, wrote_spec)
        raise
    return write_results_table(out_dir)


def load_runs(out_dir: str | Path) -> list[dict]:
    """Every finished configuration's JSON payload, sorted by key (a corrupt file is named, with the fix)."""
    return [read_run(p) for p in _run_files(Path(out_dir))]


def write_results_table(out_dir: str | Path) -> Path:
    """results.csv: one row per (configuration, seed) with the full config and its measurements."""
    out_dir = Path(out_dir)
    rows = []
    for payload in load_runs(out_dir):
        summary = payload["summary"]
        for seed_index, reward in enumerate(payload["per_seed"]["final_reward"]):
            row = {"key": payload["key"], "seed_index": seed_index, **payload["config"]}
            row.update({f"run_{k}": v for k, v in summary.items()})
            row.update(final_reward=reward, final_accuracy=payload["per_seed"]["final_accuracy"][seed_index],
                       compute=payload["per_seed"]["compute"][seed_index])
            rows.append(row)
    path = out_dir / "results.csv"
    tmp = out_dir / "results.tmp.csv"
    columns = list(dict.fromkeys(key for row in rows for key in row))  # union: losses log different metrics
    with tmp.open("w", newline="") as handle:
        if rows:
            writer = csv.DictWriter(handle, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows(rows)
    os.replace(tmp, path)  # derived index, rebuilt from the immutable runs/ files
    return path

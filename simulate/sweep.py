"""Sweeps as data: a JSON spec of a grid over SimConfig fields, run in parallel, resumable.

Paper: experience-replay (docs/REFERENCES.md), Sec. 3's synchronous FIFO model. A sweep is a set of
designs (``capacity`` = buffer size N, ``rollouts_per_step`` = R, ``batch_size`` = B, so the staleness
horizon is x = N/R and the replay ratio y = B/R) run on the simulator; each row of the results is one
design and one seed.  Spec (JSON; the configurations are the Cartesian product of ``grid`` over ``base`` plus each
entry of ``configs`` merged over ``base``)::

    {
      "name": "fifo-sizes",
      "base": {"env": "bandit", "steps": 300, "seeds": 16},
      "grid": {"capacity": [64, 256, 1024], "batch_size": [32, 64]},
      "configs": [{"buffer": "on-policy"}]
    }

Each configuration runs all its seeds in one vectorised process (:func:`run_config`) with its seeds fixed in its
config, so its results do not depend on where it runs; the engines (``backend``: loky, threading, dask, ray) only
compute and this process writes every file.  A finished configuration (its ``runs/KEY.json``, written last) is
never run again, so a sweep resumes on any backend; ``spec.json`` refuses a different spec or code version.
Engines, the output directory and its tables: docs/SIMULATION.md, 'Sweeps: engines, clusters and result tables'.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import importlib.util
import itertools
import json
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .. import __version__
from ..checks import Range, require_one_of
from ..core.jobs import check_jobs, local_workers, run_unordered
from ..core.memory import MAX_SIZE, memory_limit, show_bytes
from ..core.progress import ProgressBar
from ..outputs import check_out_dir as check_out_path
from .config import SimConfig, config_from_dict
from .engine import run
from .store import VERSION_KEY, RunStore

SPEC_KEYS = {"name", "base", "grid", "configs", "description"}
BACKENDS = ("loky", "threading", "dask", "ray")
# The package each engine beyond joblib's own needs, and the extra that installs it (with pyarrow).
BACKEND_PACKAGES = {"dask": ("distributed", "pip install 'replay-theory[dask]'"),
                    "ray": ("ray", "pip install 'replay-theory[ray]'")}
CLUSTER_BACKENDS = ("dask", "ray")
"""Backends that take a ``scheduler`` address (a running cluster) or start a local cluster."""
CONNECT_TIMEOUT_S = 10
"""Seconds to wait for a cluster at ``scheduler`` before the sweep is refused (nothing written)."""
_HOST_PORT = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(?P<port>\d{1,5})"
SCHEDULER_FORMATS = {
    "dask": (re.compile(rf"(?:tcp|tls|ucx)://{_HOST_PORT}"), "tcp://HOST:PORT (or tls://, ucx://)"),
    "ray": (re.compile(rf"auto|(?:ray://)?{_HOST_PORT}"), "auto, HOST:PORT or ray://HOST:PORT"),
}
"""What ``--scheduler`` accepts per backend, and how the error message spells it."""



@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """How ``replay-theory sweep`` and ``experiment`` run their configurations: their options."""

    out: Path
    """Results directory: created if absent, resumed if it holds this very sweep; any other content is refused."""
    jobs: int = dataclasses.field(default=-1, metadata=Range(1, integer=True, special={-1: "all cores"}).field())
    """Parallel configurations: -1 (all cores) or >= 1; with dask or ray and no --scheduler, the local cluster's
    workers."""
    backend: str = "loky"
    """Engine: loky (processes here), threading, dask (pip install 'replay-theory[dask]') or ray (pip install
    'replay-theory[ray]'). Results are bit-identical across loky, dask and ray."""
    scheduler: str | None = None
    """dask or ray only: a running cluster, tcp://HOST:PORT (dask) or auto, HOST:PORT, ray://HOST:PORT (ray); default:
    a local cluster of --jobs workers, closed after."""
    no_progress: bool = False
    """Hide the progress bar."""


def load_spec(path: str | Path) -> dict:
    path = Path(path)
    try:
        spec = json.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark is no reason to refuse
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


SPEC_CONFIG_BYTES = 4096
"""Bytes a sweep holds per configuration while it lists and checks them (the grid's row, its SimConfig, its key:
about 2 KiB measured) and writes their results table, twice that to be safe."""


def check_spec_size(grid: int, configs: int) -> None:
    """The number of configurations a spec lists (the grid's product plus its configs) within ``MAX_SIZE`` and the
    memory listing them takes; one line before any is built."""
    total = grid + configs
    need = total * SPEC_CONFIG_BYTES
    limit = memory_limit()
    if total > MAX_SIZE or need > limit:
        most = min(MAX_SIZE, limit // SPEC_CONFIG_BYTES)
        raise ValueError(f"sweep spec lists {total} configurations (grid product {grid} + configs {configs}), which "
                         f"need about {show_bytes(need)} to list, more than the {show_bytes(limit)} of memory this "
                         f"machine has; valid: at most {most} configurations")


def expand_spec(spec: dict) -> list[SimConfig]:
    """All configurations of a spec, each validated; duplicates removed (first kept)."""
    base = spec.get("base", {})
    grid = spec.get("grid", {})
    check_spec_size(math.prod(len(values) for values in grid.values()) if grid else 0, len(spec.get("configs", [])))
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


def run_config(config: SimConfig) -> dict[str, Any]:
    """Run one configuration (all its seeds) and return its files' contents; writes nothing.

    Runs in a worker (a loky process, a dask worker, a Ray task): the caller writes the files with
    :func:`write_run`, so workers need no access to the output directory.
    """
    result = run(config)
    arrays = {f"curve__{k}": v for k, v in result.curves.items()}
    arrays.update({f"eval__{k}": v for k, v in result.evals.items()})
    arrays.update(eval_steps=result.eval_steps, staleness_counts=result.staleness_counts,
                  replay_counts=result.replay_counts, time_since_last_use_counts=result.time_since_last_use_counts,
                  drift_lags=result.drift["lags"], drift_kl=result.drift["kl_new_behav"])
    tail = max(1, result.eval_steps.size // 10)
    payload = {
        "key": config.key(),
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
    return {"arrays": arrays, "payload": payload}


def write_run(runs_dir: str | Path, output: dict[str, Any], where: str = "") -> str:
    """Write one :func:`run_config` output: curves first, then the JSON marker, each atomically.

    A worker of another replay-theory version (a remote cluster) is refused before anything is written;
    ``where`` names the cluster in that message.
    """
    payload = output["payload"]
    version = payload.get(VERSION_KEY)
    if version != __version__:
        raise ValueError(f"a worker{where} runs replay-theory {version}, this is {__version__}; versions are "
                         f"never mixed in one sweep: install this version on the cluster's workers")
    RunStore(Path(runs_dir).parent, indent=1).save(payload, output["arrays"])  # the arrays, then the JSON
    return payload["key"]


def pending_configs(configs: list[SimConfig], out_dir: Path) -> list[SimConfig]:
    store = RunStore(out_dir)
    return [c for c in configs if not store.has(c.key())]


def check_backend(backend: str) -> str:
    """A backend that can run here: the name is known and its package is installed."""
    require_one_of("--backend", backend, BACKENDS)
    if backend in BACKEND_PACKAGES:
        package, install = BACKEND_PACKAGES[backend]
        if importlib.util.find_spec(package) is None:
            raise ValueError(f"--backend {backend} needs the {package} package, which is not installed: {install}")
    return backend


def check_scheduler(backend: str, scheduler: str | None, n_jobs: int = -1) -> str | None:
    """``scheduler`` fits ``backend``: only dask and ray take one, in their address format; with one,
    the cluster's workers set the parallelism, so ``n_jobs`` must be left at -1. Reads nothing."""
    if scheduler is None:
        return None
    if backend not in CLUSTER_BACKENDS:
        raise ValueError(f"--scheduler applies only to --backend dask or ray, not {backend}")
    pattern, spelled = SCHEDULER_FORMATS[backend]
    match = pattern.fullmatch(scheduler)
    port = match.groupdict().get("port") if match else None
    if match is None or (port is not None and not 1 <= int(port) <= 65535):
        raise ValueError(f"--scheduler for --backend {backend} must be {spelled} with a port in 1-65535, "
                         f"got {scheduler!r}")
    if n_jobs != -1:
        raise ValueError("--jobs does not apply with --scheduler: the cluster's workers run the configurations; "
                         "leave --jobs out")
    return scheduler


Results = Callable[[list[SimConfig]], Iterator[dict[str, Any]]]
"""An open engine: runs configurations, yields :func:`run_config` outputs as they finish (any order)."""


@contextlib.contextmanager
def open_engine(backend: str, n_jobs: int, scheduler: str | None, n_configs: int) -> Iterator[Results]:
    """Start (or connect to) ``backend``'s engine; closes what it started on exit, whatever happened.

    Called before the first file is written, so a cluster that does not answer is a one-line ValueError
    naming ``--scheduler`` and the output directory stays untouched.
    """
    if backend == "dask":
        with _dask_engine(scheduler, local_workers(n_jobs, n_configs)) as results:
            yield results
    elif backend == "ray":
        with _ray_engine(scheduler, local_workers(n_jobs, n_configs)) as results:
            yield results
    else:
        def run_locally(todo: list[SimConfig]) -> Iterator[dict[str, Any]]:
            # run_config looked up at call time, so a test can replace it (threading backend)
            yield from run_unordered(run_config, ((c,) for c in todo), n_jobs, backend)

        yield run_locally


@contextlib.contextmanager
def _dask_engine(scheduler: str | None, workers: int) -> Iterator[Results]:
    from distributed import Client, LocalCluster, as_completed  # optional engine, checked installed

    cluster = None
    if scheduler is None:
        # one single-threaded process per worker: the same isolation as loky's workers, no dashboard port
        # (dashboard_address=None disables it, as distributed's docstring says; its annotation says str only)
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               dashboard_address=None)  # pyright: ignore[reportArgumentType]
    try:
        try:
            client = Client(cluster if cluster is not None else scheduler, timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as err:
            raise ValueError(f"--scheduler {scheduler}: no dask scheduler answered within {CONNECT_TIMEOUT_S} s "
                             f"({type(err).__name__}); start one with `dask scheduler` or leave --scheduler out "
                             f"for a local cluster") from None
        futures: list = []
        try:
            def results(todo: list[SimConfig]) -> Iterator[dict[str, Any]]:
                # pure=False: a configuration is computed once per sweep, never deduplicated across sweeps
                futures.extend(client.map(run_config, todo, pure=False))
                for future in as_completed(futures):
                    yield future.result()

            yield results
        finally:
            client.cancel(futures)  # an interrupted sweep leaves nothing running on the cluster
            client.close()
    finally:
        if cluster is not None:
            cluster.close()


@contextlib.contextmanager
def _ray_engine(scheduler: str | None, workers: int) -> Iterator[Results]:
    import ray  # optional engine, checked installed

    started = not ray.is_initialized()  # a Ray the caller already runs is used, and left running
    if started:
        try:
            if scheduler is None:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
            else:
                ray.init(address=scheduler, log_to_driver=False, configure_logging=False)
        except ConnectionError as err:
            raise ValueError(f"--scheduler {scheduler}: no Ray cluster answered ({str(err).splitlines()[0]}); "
                             f"start one with `ray start --head` or leave --scheduler out for a local Ray") from None
    pending: list = []
    try:
        remote = ray.remote(num_cpus=1)(run_config)  # one CPU per configuration, like a loky worker

        def results(todo: list[SimConfig]) -> Iterator[dict[str, Any]]:
            pending.extend(remote.remote(c) for c in todo)
            while pending:
                done, rest = ray.wait(pending, num_returns=1)
                pending[:] = rest
                yield ray.get(done[0])

        yield results
    finally:
        for ref in pending:  # an interrupted sweep leaves nothing running on the cluster
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()


def read_run(path: Path) -> dict:
    """One runs/KEY.json; a corrupt file is a one-line error naming it and the fix."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err.msg}: line {err.lineno} column {err.colno}): a run file "
                         f"damaged after it was written; delete it and its .npz, then run the sweep again to "
                         f"recompute that configuration") from None


def _run_files(out_dir: Path) -> list[Path]:
    return RunStore(out_dir).files()


def _canonical(spec: dict) -> str:
    return json.dumps({**spec, VERSION_KEY: __version__}, indent=1, sort_keys=True)


def check_out_dir(spec: dict, out_dir: str | Path) -> None:
    """``out_dir`` can take this sweep: new, empty, or holding this very spec from this code version (resume).

    Raises a one-line ValueError naming --out otherwise: a file, a folder of unrelated files, a folder this process
    cannot write in, another spec, another code version, or a corrupt run file. Writes nothing (the write check's
    probe file is removed at once).
    """
    out_dir = check_out_path(Path(out_dir), ours=lambda folder: (folder / "spec.json").is_file(),
                             holds="holds no sweep (no spec.json)")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    spec_file = out_dir / "spec.json"
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
    RunStore(out_dir).clear_temps()  # files of a configuration interrupted mid-write
    for stale in out_dir.glob("results.tmp.*"):
        stale.unlink()  # a table interrupted mid-write
    return out_dir


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_sweep`: what is saved in ``out_dir`` and how to go on (:meth:`message`)."""

    def __init__(self, out_dir: Path, total: int, reused: int, new: int) -> None:
        super().__init__(out_dir, total, reused, new)
        self.out_dir, self.total, self.reused, self.new = out_dir, total, reused, new

    def message(self) -> str:
        saved = self.reused + self.new
        if not saved:
            return (f"interrupted: none of the {self.total} configurations had finished, so nothing was kept in "
                    f"{self.out_dir}; run the same command to start again")
        return (f"interrupted: {saved} of {self.total} configurations are saved in {self.out_dir / 'runs'} "
                f"({self.new} finished now, {self.reused} reused from before); run the same command to resume: it "
                f"runs only the other {self.total - saved}")


def _created_by_us(out_dir: Path) -> list[Path]:
    """The folders (deepest first) that creating ``out_dir/runs`` will make: removed again if nothing finishes."""
    missing = [p for p in [out_dir / "runs", out_dir, *out_dir.parents] if not p.exists()]
    return missing


def _remove_unfinished(out_dir: Path, created: list[Path], wrote_spec: bool) -> None:
    """Undo a sweep that failed before any configuration finished: no empty or half-written folder is left."""
    runs = out_dir / "runs"
    if runs.is_dir() and _run_files(out_dir):
        return  # finished configurations are results: kept, and the sweep resumes from them
    RunStore(out_dir).clear_temps()
    if wrote_spec:
        (out_dir / "spec.json").unlink(missing_ok=True)
    for folder in created:  # deepest first
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def run_sweep(spec: dict, out_dir: str | Path, n_jobs: int = -1, backend: str = "loky", show_progress: bool = True,
              scheduler: str | None = None) -> Path:
    """Run every pending configuration of ``spec`` into ``out_dir``; returns results.csv.

    Everything is checked (spec, n_jobs, backend and its package, scheduler's format, out_dir) before the
    first file is written; the engine is started (or the cluster at ``scheduler`` reached) before it too.
    dask's local cluster spawns its worker processes, so a script calling this with ``backend="dask"`` and no
    ``scheduler`` runs it under ``if __name__ == "__main__":`` (as for any spawned pool).
    """
    configs = expand_spec(validate_spec(spec))
    check_jobs(n_jobs)
    check_backend(backend)
    check_scheduler(backend, scheduler, n_jobs)
    out_dir = Path(out_dir)
    check_out_dir(spec, out_dir)
    todo = pending_configs(configs, out_dir)  # reads only: out_dir may not exist yet
    created = _created_by_us(out_dir)
    wrote_spec = not (out_dir / "spec.json").exists()
    where = f" of --scheduler {scheduler}" if scheduler else ""
    engine = open_engine(backend, n_jobs, scheduler, len(todo)) if todo else contextlib.nullcontext(None)
    reused = len(configs) - len(todo)
    new = 0
    progress = None
    try:
        with engine as results:
            try:
                prepare_out_dir(spec, out_dir)
                # the count starts at the configurations found finished; the label says so, or 3/12 would read as 3
                # run just now
                label = f"configurations ({reused} reused)" if reused else "configurations"
                progress = ProgressBar(label, len(configs), reused, enabled=show_progress)
                if results is not None:  # an engine opened: there is something to run
                    runs_dir = out_dir / "runs"
                    for output in results(todo):
                        write_run(runs_dir, output, where)
                        new += 1
                        progress.advance()
            except BaseException:
                _remove_unfinished(out_dir, created, wrote_spec)
                raise
            finally:
                if progress is not None:
                    progress.close()
    except KeyboardInterrupt as err:  # Ctrl-C, here or while the engine shuts down: say what is kept
        # the files on disk, not the loop's tally: a Ctrl-C between write_run and new += 1 leaves one more saved
        # than counted (a real SIGINT test caught "none had finished" beside a saved run)
        on_disk = len(_run_files(out_dir)) if (out_dir / "runs").is_dir() else 0
        raise SweepInterrupted(out_dir, len(configs), reused, on_disk - reused) from err
    return write_results_table(out_dir)


def load_runs(out_dir: str | Path) -> list[dict]:
    """Every finished configuration's JSON payload, sorted by key (a corrupt file is named, with the fix)."""
    return [read_run(p) for p in _run_files(Path(out_dir))]


def parquet_available() -> bool:
    """Whether results.parquet can be written (pyarrow installed; it is not a core dependency)."""
    return importlib.util.find_spec("pyarrow") is not None


def results_rows(out_dir: str | Path) -> tuple[list[str], list[dict]]:
    """The tidy table: its columns (union over runs, in first-seen order) and one row per (configuration, seed)."""
    rows = []
    for payload in load_runs(out_dir):
        summary = payload["summary"]
        for seed_index, reward in enumerate(payload["per_seed"]["final_reward"]):
            row = {"key": payload["key"], "seed_index": seed_index, **payload["config"]}
            row.update({f"run_{k}": v for k, v in summary.items()})
            row.update(final_reward=reward, final_accuracy=payload["per_seed"]["final_accuracy"][seed_index],
                       compute=payload["per_seed"]["compute"][seed_index])
            rows.append(row)
    columns = list(dict.fromkeys(key for row in rows for key in row))  # union: losses log different metrics
    return columns, rows


def write_results_table(out_dir: str | Path) -> Path:
    """results.csv (and results.parquet with pyarrow): one row per (configuration, seed), full config and
    measurements, rebuilt from runs/*.json; each written to a temporary name and renamed."""
    out_dir = Path(out_dir)
    columns, rows = results_rows(out_dir)
    path = out_dir / "results.csv"
    tmp = out_dir / "results.tmp.csv"
    with tmp.open("w", newline="") as handle:
        if rows:
            writer = csv.DictWriter(handle, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows(rows)
    os.replace(tmp, path)  # derived index, rebuilt from the immutable runs/ files
    if parquet_available():
        write_parquet(out_dir / "results.parquet", columns, rows)
    return path


def write_parquet(path: Path, columns: list[str], rows: list[dict]) -> Path:
    """``rows`` as a Parquet file with one typed column per name (see :func:`arrow_column`), atomically."""
    import pyarrow as pa  # optional: only with the dask/ray/test extras
    import pyarrow.parquet as pq

    table = pa.table({name: arrow_column([row.get(name) for row in rows]) for name in columns})
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def arrow_column(values: list):
    """One typed column: bool, int64, float64 (ints and floats mixed), string; a missing value is null.

    Types come from the values, not from a schema, since runs of different losses log different metrics;
    anything else (a list-valued field) is its text, as results.csv writes it.
    """
    import pyarrow as pa

    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        kind = pa.bool_()
    elif present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        kind = pa.int64()
    elif present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        kind = pa.float64()
        values = [None if v is None else float(v) for v in values]
    else:
        kind = pa.string()
        values = [None if v is None else v if isinstance(v, str) else str(v) for v in values]
    return pa.array(values, type=kind)

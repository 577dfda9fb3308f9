"""`sweep --backend dask|ray` and results.parquet: a cluster gives the loky backend's files bit for bit, resumes
after an interruption, is checked before anything is written; results.parquet holds results.csv's values, typed.

The dask tests start a real ``distributed.LocalCluster`` (2 single-threaded worker processes) on this machine;
the Ray test runs when ray is installed (not in CI)."""

import csv
import importlib.util
import math
import socket

import pytest

from replay_theory.simulate import sweep as sweep_module
from replay_theory.simulate.sweep import arrow_column, expand_spec, load_runs, run_sweep

SPEC = {"name": "backends", "base": {"seeds": 2, "steps": 30, "eval_every": 15, "measure_drift": False,
                                     "num_prompts": 16},
        "grid": {"capacity": [64, 128]}, "configs": [{"buffer": "on-policy"}]}
KEYS = sorted(c.key() for c in expand_spec(SPEC))  # 3 configurations x 2 seeds


def result_files(out_dir):
    """Every file of a finished sweep, by relative path, as bytes."""
    return {str(p.relative_to(out_dir)): p.read_bytes() for p in sorted(out_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def loky_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("loky") / "sweep"
    run_sweep(SPEC, out, n_jobs=2, backend="loky", show_progress=False)
    files = result_files(out)
    assert sorted(files) == sorted(["spec.json", "results.csv", "results.parquet",
                                    *(f"runs/{k}{s}" for k in KEYS for s in (".json", ".npz"))])
    return files


def assert_same_as_loky(out_dir, loky_files):
    files = result_files(out_dir)
    assert sorted(files) == sorted(loky_files)
    different = [name for name in files if files[name] != loky_files[name]]
    assert different == []  # curves (.npz), summaries (.json), both tables: byte for byte


def test_dask_local_cluster_equals_loky_bit_for_bit(tmp_path, loky_files):
    pytest.importorskip("distributed")
    out = tmp_path / "dask"
    table = run_sweep(SPEC, out, n_jobs=2, backend="dask", show_progress=False)
    assert table == out / "results.csv"
    assert_same_as_loky(out, loky_files)
    runs = {r["key"]: r for r in load_runs(out)}
    assert sorted(runs) == KEYS
    fifo = next(r for r in runs.values() if r["config"]["buffer"] == "fifo" and r["config"]["capacity"] == 64)
    assert len(fifo["per_seed"]["final_reward"]) == 2 and fifo["config"]["seed"] == 0


def test_dask_running_scheduler_equals_loky(tmp_path, loky_files):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        run_sweep(SPEC, tmp_path / "remote", backend="dask", scheduler=c.scheduler_address, show_progress=False)
        assert len(c.scheduler.workers) == 2  # the sweep closed its client, not the user's cluster
    assert_same_as_loky(tmp_path / "remote", loky_files)


def test_resume_after_an_interrupted_dask_run(tmp_path, loky_files, monkeypatch):
    pytest.importorskip("distributed")
    out = tmp_path / "dask"
    real_write = sweep_module.write_run

    def write_then_interrupt(runs_dir, output, where=""):
        real_write(runs_dir, output, where)
        raise KeyboardInterrupt  # Ctrl-C right after the first configuration finished

    monkeypatch.setattr(sweep_module, "write_run", write_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(SPEC, out, n_jobs=2, backend="dask", show_progress=False)
    done = sorted(p.name for p in (out / "runs").iterdir())
    assert len(done) == 2 and done[0].endswith(".json") and done[1].endswith(".npz")  # one configuration, whole
    assert sorted(p.name for p in out.iterdir()) == ["runs", "spec.json"]  # no table of a partial sweep
    first = out / "runs" / done[0]
    marker = first.stat().st_mtime_ns

    written = []
    monkeypatch.setattr(sweep_module, "write_run", lambda d, o, w="": written.append(real_write(d, o, w)))
    run_sweep(SPEC, out, n_jobs=2, backend="dask", show_progress=False)
    assert sorted(written) == sorted(k for k in KEYS if f"{k}.json" != done[0])  # only the two missing ones
    assert first.stat().st_mtime_ns == marker  # the finished configuration was not rerun or rewritten
    assert_same_as_loky(out, loky_files)


def test_finished_sweep_starts_no_cluster(tmp_path, loky_files, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr(sweep_module, "open_engine", lambda *a, **k: pytest.fail("the engine was started"))
    out = tmp_path / "done"
    out.mkdir()
    for name, data in loky_files.items():
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_bytes(data)
    run_sweep(SPEC, out, n_jobs=2, backend="dask", show_progress=False)
    assert_same_as_loky(out, loky_files)


@pytest.mark.parametrize("backend,package", [("dask", "distributed"), ("ray", "ray")])
def test_backend_not_installed_is_one_line_and_writes_nothing(cli, tmp_path, spec_file, backend, package,
                                                              monkeypatch, error_line):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))
    monkeypatch.setattr(sweep_module, "open_engine", lambda *a, **k: pytest.fail("the engine was started"))
    assert error_line("sweep", str(spec_file), "--out", str(tmp_path / "o"), "--backend", backend) == (
        f"--backend {backend} needs the {package} package, which is not installed: "
        f"pip install 'replay-theory[{backend}]'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.json"]  # no --out folder


@pytest.mark.parametrize("args,message", [
    (["--backend", "dask", "--scheduler", "127.0.0.1:8786"],
     "--scheduler for --backend dask must be tcp://HOST:PORT (or tls://, ucx://) with a port in 1-65535, "
     "got '127.0.0.1:8786'"),
    (["--backend", "dask", "--scheduler", "tcp://127.0.0.1:70000"],
     "--scheduler for --backend dask must be tcp://HOST:PORT (or tls://, ucx://) with a port in 1-65535, "
     "got 'tcp://127.0.0.1:70000'"),
    (["--backend", "ray", "--scheduler", "tcp://head:6379"],
     "--scheduler for --backend ray must be auto, HOST:PORT or ray://HOST:PORT with a port in 1-65535, "
     "got 'tcp://head:6379'"),
    (["--scheduler", "tcp://127.0.0.1:8786"], "--scheduler applies only to --backend dask or ray, not loky"),
    (["--backend", "dask", "--scheduler", "tcp://127.0.0.1:8786", "--jobs", "4"],
     "--jobs does not apply with --scheduler: the cluster's workers run the configurations; leave --jobs out"),
])
def test_scheduler_checked_before_anything_runs(cli, tmp_path, spec_file, monkeypatch, args, message, error_line):
    monkeypatch.setattr(sweep_module, "check_backend", lambda backend: backend)  # dask/ray need not be installed
    monkeypatch.setattr(sweep_module, "open_engine", lambda *a, **k: pytest.fail("the engine was started"))
    assert error_line("sweep", str(spec_file), "--out", str(tmp_path / "o"), *args) == message
    assert not (tmp_path / "o").exists()


def test_unreachable_scheduler_is_one_line_and_writes_nothing(cli, tmp_path, spec_file, monkeypatch, error_line):
    pytest.importorskip("distributed")
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(sweep_module, "CONNECT_TIMEOUT_S", 1)
    message = error_line("sweep", str(spec_file), "--out", str(tmp_path / "o"), "--backend", "dask",
                             "--scheduler", f"tcp://127.0.0.1:{port}")
    assert message.startswith(f"--scheduler tcp://127.0.0.1:{port}: no dask scheduler answered within 1 s (")
    assert message.endswith("start one with `dask scheduler` or leave --scheduler out for a local cluster")
    assert not (tmp_path / "o").exists()


def test_a_worker_of_another_version_is_refused(tmp_path, monkeypatch):
    real = sweep_module.run_config

    def old_worker(config):
        output = real(config)
        output["payload"][sweep_module.VERSION_KEY] = "0.0.1"
        return output

    monkeypatch.setattr(sweep_module, "run_config", old_worker)
    with pytest.raises(ValueError, match=r"^a worker runs replay-theory 0\.0\.1, this is .*versions are never mixed"):
        run_sweep({"configs": [SPEC["base"]]}, tmp_path / "o", n_jobs=1, backend="threading", show_progress=False)
    assert not (tmp_path / "o").exists()  # nothing finished: everything created is removed


def csv_rows(path):
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        return reader.fieldnames, list(reader)


def test_results_parquet_equals_results_csv(tmp_path, loky_files):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    (tmp_path / "results.csv").write_bytes(loky_files["results.csv"])
    (tmp_path / "results.parquet").write_bytes(loky_files["results.parquet"])
    columns, rows = csv_rows(tmp_path / "results.csv")
    table = pq.read_table(tmp_path / "results.parquet")
    assert table.column_names == columns and table.num_rows == len(rows) == 6
    types = dict(zip(table.column_names, table.schema.types))
    assert (types["key"], types["seed_index"], types["capacity"], types["lr"], types["measure_drift"],
            types["final_reward"], types["run_max_staleness"]) == (
        pa.string(), pa.int64(), pa.int64(), pa.float64(), pa.bool_(), pa.float64(), pa.int64())
    compared = 0
    for name in columns:
        for value, cell in zip(table.column(name).to_pylist(), (row[name] for row in rows)):
            if value is None:
                assert cell == "", (name, cell)
            elif isinstance(value, float) and math.isnan(value):
                assert cell == "nan", (name, cell)
            else:
                assert str(value) == cell, (name, value, cell)  # floats: repr round-trips, so exact
            compared += 1
    assert compared == 6 * len(columns)
    assert sorted(table.column("seed_index").to_pylist()) == [0, 0, 0, 1, 1, 1]
    assert sorted(set(table.column("key").to_pylist())) == KEYS


def test_arrow_column_types():
    pa = pytest.importorskip("pyarrow")
    assert arrow_column([1, 2, None]).type == pa.int64() and arrow_column([1, 2, None]).to_pylist() == [1, 2, None]
    mixed = arrow_column([1, 0.5])  # a float field written as 1 in one spec entry
    assert mixed.type == pa.float64() and mixed.to_pylist() == [1.0, 0.5]
    assert arrow_column([True, False]).type == pa.bool_()
    assert arrow_column([True, 2]).to_pylist() == ["True", "2"]  # never silently a number
    assert arrow_column([["a", "b"], None]).to_pylist() == ["['a', 'b']", None]  # as csv writes it
    assert arrow_column([None, None]).type == pa.string()


def test_without_pyarrow_only_csv_and_a_note(cli, tmp_path, spec_file, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a))
    spec_file.write_text('{"configs": [{"seeds": 2, "steps": 20, "eval_every": 10, "measure_drift": false, '
                         '"num_prompts": 16}]}')
    code, out, err = cli("sweep", str(spec_file), "--out", str(tmp_path / "o"), "--jobs", "1", "--no-progress")
    assert code == 0, err
    assert out == (f"results: {tmp_path / 'o' / 'results.csv'} (results.parquet not written: pyarrow is not "
                   f"installed; pip install 'replay-theory[dask]' or pip install pyarrow)\n")
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["results.csv", "runs", "spec.json"]
    assert len(csv_rows(tmp_path / "o" / "results.csv")[1]) == 2


def test_ray_equals_loky_bit_for_bit(tmp_path, loky_files):
    pytest.importorskip("ray")
    out = tmp_path / "ray"
    run_sweep(SPEC, out, n_jobs=2, backend="ray", show_progress=False)
    assert_same_as_loky(out, loky_files)
    import ray

    assert not ray.is_initialized()  # the local Ray the sweep started is shut down


def test_local_cluster_size():
    import joblib

    assert sweep_module.local_workers(2, 3) == 2  # --jobs 2: two workers
    assert sweep_module.local_workers(8, 3) == 3  # never an idle worker process
    assert sweep_module.local_workers(-1, 1000) == joblib.cpu_count()  # -1: every core, counted as loky does

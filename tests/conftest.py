"""Fixtures shared by both tiers: ``tests/unit`` (fast: hand values, pure functions) and ``tests/integration``
(engine and sweep runs, CLI end-to-end runs, memory probes, subprocesses, TRL and tiny-LM training).

Heavy libraries (matplotlib, torch) are imported inside the fixtures that need them, so that collecting the fast
tier does not pay for them.
"""

import os
import sys
from pathlib import Path

import pytest

from replay_theory.cli.app import main

#: the repository root (this file is tests/conftest.py at any test-folder depth below it)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))  # shared test helpers (tiny_lm), importable under importlib mode


@pytest.fixture
def cli(capsys):
    """Run the CLI in-process: returns (exit code, stdout, stderr)."""

    def run(*args):
        with pytest.raises(SystemExit) as info:
            main(list(args))
        out, err = capsys.readouterr()
        return info.value.code, out, err

    return run


@pytest.fixture
def error_line(cli):
    """Run a command that must fail: assert exit 2, nothing on stdout, one stderr line, no traceback; return the
    line without the ``replay-theory: error: `` prefix."""

    def run(*args):
        code, out, err = cli(*args)
        assert code == 2 and out == "", (code, out, err)
        assert err.count("\n") == 1 and err.startswith("replay-theory: error: ") and "Traceback" not in err
        return err[len("replay-theory: error: "):-1]

    return run


@pytest.fixture(autouse=True)
def _private_warm_start_cache(tmp_path_factory, monkeypatch):
    """trl-replay caches its warm start under $REPLAY_THEORY_CACHE (else the user's cache folder): each test gets its
    own, so the suite never writes into the home directory nor reuses a checkpoint another test made."""
    monkeypatch.setenv("REPLAY_THEORY_CACHE", str(tmp_path_factory.mktemp("warm-start-cache")))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (pyproject.toml, bench/, the package's own files): tests run scripts from there."""
    return ROOT


@pytest.fixture
def close_figures():
    """Close every matplotlib figure after the test (use with ``pytestmark = pytest.mark.usefixtures(...)``)."""
    yield
    plt = sys.modules.get("matplotlib.pyplot")  # imported by the test, if it drew anything
    if plt is not None:
        plt.close("all")


@pytest.fixture
def umask() -> int:
    """The process's file-creation mask (os.umask can only be read by setting it: set it back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.fixture
def spec_file(request, tmp_path) -> Path:
    """The test module's ``SPEC`` (a sweep spec dict) written to ``tmp_path/spec.json``."""
    import json

    path = tmp_path / "spec.json"
    path.write_text(json.dumps(request.module.SPEC))
    return path


@pytest.fixture
def optimal_profile(tmp_path):
    """``write(b_noise, table=FLAT_TO_63, memory=None)``: an ``optimal --profile`` file in ``tmp_path`` carrying a
    measured B_noise and a sigma^2(s) table (tests/helpers/optimal_profile.py); returns its path as a string."""
    from optimal_profile import FLAT_TO_63, write_profile

    def write(b_noise: float, table: tuple = FLAT_TO_63, memory: dict | None = None,
              name: str = "profile.json") -> str:
        return write_profile(tmp_path / name, b_noise, table, memory)

    return write


@pytest.fixture(scope="module")
def policy():
    """A freshly initialised tiny policy (``ModelConfig()``, the Countdown alphabet), one per test module; tests must
    not train it."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from replay_theory.validate import countdown
    from replay_theory.validate.policy import ModelConfig, load_policy

    return load_policy(ModelConfig(), countdown.ALPHABET)


@pytest.fixture(scope="module")
def gloo():
    """A one-process gloo group, as verl's workers run under torch.distributed (the verl engine tests)."""
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def on_cpu(monkeypatch):
    """verl has no CPU platform: its engine's device id is "cpu" here (the verl engine tests)."""
    transformer_impl = pytest.importorskip("verl.workers.engine.fsdp.transformer_impl")
    monkeypatch.setattr(transformer_impl, "get_device_id", lambda: "cpu")


def _log_skip(report) -> None:
    """With $REPLAY_THEORY_SKIPPED_LOG set (CI's part 1, .ci/run), append the node id of a test or module that skipped
    (an extra not installed, most of them) to that file: part 2 reruns those files with every extra installed instead
    of the whole suite a second time."""
    log = os.environ.get("REPLAY_THEORY_SKIPPED_LOG")
    if log and report.skipped:
        with open(log, "a", encoding="utf-8") as f:
            f.write(report.nodeid + "\n")


def pytest_runtest_logreport(report):
    _log_skip(report)


def pytest_collectreport(report):
    _log_skip(report)  # a module-level importorskip skips the whole file at collection

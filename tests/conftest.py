"""Shared test helpers."""

import pytest

from replay_theory.cli.app import main


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

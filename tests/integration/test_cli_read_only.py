"""Issue 32: every command that writes (``--out``, ``--save``, ``--figure``), given a folder this process cannot
write in, says so in one line naming the option, exits 2, writes nothing, and does so before any work; a command
that must not mix its results with other files refuses a non-empty folder it did not write.

How the folder is made unwritable for real. Run as a normal user, ``chmod 555`` does it. The suite runs as root
here, and root passes every permission bit, so a 0555 folder would be written; switching to an unprivileged user is
no way out either (this machine's Python lives under /root, which such a user cannot read, so its lazy imports
fail). As root the folder gets the immutable attribute instead (``chattr +i``, the FS_IOC_SETFLAGS ioctl): no entry
can be created in it, by root either; the fixture removes it again. The fixture checks that the folder really
refuses a file before any test relies on it, records the system's reason (Permission denied, Operation not
permitted) for the expected line, and skips where neither works (a file system without the attribute).
"""

from __future__ import annotations

import array
import os
from pathlib import Path

import pytest

from replay_theory.experiments.example_log import write_example

FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10  # linux/fs.h


def _tree(root: Path) -> list[tuple[str, int]]:
    """Every path under ``root`` with its size: what "nothing was written" is checked against."""
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*"))


def _immutable(path: Path, on: bool) -> None:
    import fcntl

    fd = os.open(path, os.O_RDONLY)
    try:
        flags = array.array("l", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
        flags[0] = flags[0] | FS_IMMUTABLE_FL if on else flags[0] & ~FS_IMMUTABLE_FL
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags)
    finally:
        os.close(fd)


@pytest.fixture
def read_only(tmp_path):
    """(base, ro, why): ``base`` a folder the test may fill, ``ro = base/ro`` an empty folder this process cannot
    write in, ``why`` the system's reason when it tries."""
    ro = tmp_path / "ro"
    ro.mkdir()
    root = os.geteuid() == 0
    try:
        _immutable(ro, True) if root else ro.chmod(0o555)
    except OSError as err:
        pytest.skip(f"cannot make a folder unwritable to root here: {err.strerror}")
    try:
        try:
            os.close(os.open(ro / "probe", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError as err:
            why = err.strerror
        else:
            pytest.skip(f"{ro} is writable to this process")
        yield tmp_path, ro, why
    finally:
        _immutable(ro, False) if root else ro.chmod(0o755)


BY_HAND = ["--capacity", "16", "--batch-size", "12", "--rollouts-per-step", "8", "--group-size", "4"]


@pytest.mark.parametrize("command, option, target", [
    (["simulate", "--steps", "20", "--no-progress"], "--out", "ro/run"),
    (["simulate", "--steps", "20", "--no-progress"], "--out", "ro"),  # the existing, empty, read-only folder itself
    (["sweep", "SPEC", "--no-progress"], "--out", "ro/run"),
    (["experiment", "sanity", "--no-progress"], "--out", "ro/run"),
    (["calibrate-simulator"], "--out", "ro/profile.json"),
    (["trl-replay", *BY_HAND, "--cache-dir", "CACHE"], "--out", "ro/run"),
    (["calibrate", "--from-log", "LOG", "--mu", "5"], "--out", "ro/profile.json"),
    (["diagnose", "LOG", "--no-progress"], "--save", "ro/report.json"),
    (["diagnose", "LOG", "--no-progress"], "--figure", "ro/report.png"),
    (["figures", "gamma-table"], "--out", "ro/figures"),
    (["figures", "gamma-table"], "--out", "ro/a/b"),  # folders that do not exist yet, below the read-only one
    (["validate", "calibrate-model", "--no-progress"], "--out", "ro/run"),
    (["validate", "all", "--no-progress"], "--out", "ro/run"),
])
def test_an_unwritable_output_is_one_line_before_any_work(read_only, error_line, monkeypatch, command, option,
                                                          target):
    base, ro, why = read_only
    write_example(base / "log.parquet")
    (base / "spec.json").write_text('{"configs": [{"seeds": 2, "steps": 20, "eval_every": 10}]}')
    (base / "cache").mkdir()
    import replay_theory.cli.simulate_cmds as simulate_cmds

    # the work that must not start: the probe, the simulator's engine
    monkeypatch.setattr(simulate_cmds, "measure_profile", lambda *a, **k: pytest.fail("the probe ran"))
    monkeypatch.setattr(simulate_cmds, "run", lambda *a, **k: pytest.fail("the simulation ran"))
    where = {"SPEC": base / "spec.json", "LOG": base / "log.parquet", "CACHE": base / "cache"}
    args = [str(where.get(a, a)) for a in command]
    path = base / target
    before = _tree(base)
    assert error_line(*args, option, str(path)) == f"{option} {path}: cannot write in {ro} ({why})"
    assert _tree(base) == before


def test_trl_replay_checks_its_cache_folder_before_the_warm_start(read_only, error_line):
    # the warm start is cached in --cache-dir: an unwritable one is refused before the SFT, not after it
    base, ro, why = read_only
    before = _tree(base)
    line = error_line("trl-replay", *BY_HAND, "--out", str(base / "run"), "--cache-dir", str(ro / "cache"))
    if line.startswith("trl-replay needs"):  # without the trl extra the command stops there, before any cache
        pytest.skip("the trl extra is not installed")
    assert line == f"--cache-dir {ro / 'cache'}: cannot write in {ro} ({why})"
    assert _tree(base) == before


@pytest.mark.parametrize("command", [["validate", "calibrate-model"], ["validate", "all"]])
def test_validate_refuses_a_non_empty_folder_that_is_no_run_of_its_own(tmp_path, error_line, command):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert error_line(*command, "--out", str(mine), "--no-progress") == (
        f"--out {mine} is a non-empty directory that holds no validate run (none of warm_start, calibration.json, "
        "profile.json, calibration_summary.json, predicted.json); results go into a new or empty directory, so "
        "they never mix with other files")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]

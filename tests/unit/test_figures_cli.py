"""``replay-theory figures`` output rules: default directory, never overwrite, bad input one line, exit 2.

Every bad-input row of issue 11 for this command: the exact message, exit code 2, and that nothing
was created or changed.

Fast tier; the slower tests of this module (a figures run over saved results) are in
tests/integration/test_figures_cli_run.py.
"""

from __future__ import annotations

import os

import pytest
from PIL import Image

from replay_theory.figures.files import write_all

PREFIX = "replay-theory: error: "


def test_default_out_is_figures_out_not_the_gallery_at_200_dpi(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("figures", "gamma-table")
    assert (code, err) == (0, "")
    assert out == os.path.join("figures-out", "gamma-table.png") + "\n"
    assert sorted(os.listdir(tmp_path)) == ["figures-out"]
    with Image.open(tmp_path / "figures-out" / "gamma-table.png") as image:
        assert image.info["dpi"][0] == pytest.approx(200, abs=0.01)


@pytest.mark.parametrize("dpi", ["100000", "0", "49", "1201"])
def test_dpi_outside_50_to_1200_is_refused_before_any_work(cli, tmp_path, dpi):
    code, out, err = cli("figures", "gamma-table", "--dpi", dpi, "--out", str(tmp_path / "o"))
    assert (code, out) == (2, "")
    assert err == f"{PREFIX}--dpi must be an integer in 50..1200, got {dpi}\n"
    assert not (tmp_path / "o").exists()  # no empty directory left behind


def test_out_pointing_at_a_file_names_out(cli, tmp_path):
    (tmp_path / "f").write_text("mine")
    code, out, err = cli("figures", "gamma-table", "--out", str(tmp_path / "f"))
    assert (code, out) == (2, "")
    assert err == f"{PREFIX}--out {tmp_path / 'f'} is an existing file; give a directory (created if absent)\n"
    code, out, err = cli("figures", "gamma-table", "--out", str(tmp_path / "f" / "sub"))
    assert (code, out) == (2, "")
    assert err == f"{PREFIX}--out {tmp_path / 'f' / 'sub'}: {tmp_path / 'f'} is a file, not a folder\n"
    assert (tmp_path / "f").read_text() == "mine"


def test_a_non_empty_out_is_refused_before_any_work(cli, tmp_path):
    # issue 32: figures go into a new or empty folder only, so they never mix with (or overwrite) other files
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    (out_dir / "notes.txt").write_bytes(b"old")
    code, out, err = cli("figures", "gamma-table", "k-curve", "--format", "png,pdf", "--out", str(out_dir))
    assert (code, out) == (2, "")
    assert err == (f"{PREFIX}--out {out_dir} is a non-empty directory; results go into a new or empty directory, "
                   "so they never mix with other files\n")
    assert sorted(os.listdir(out_dir)) == ["notes.txt"]  # gamma-table.png was not written either
    assert (out_dir / "notes.txt").read_bytes() == b"old"
    # a second run into the same directory is refused the same way
    code, _, _ = cli("figures", "gamma-table", "--out", str(tmp_path / "p"))
    assert code == 0
    code, _, err = cli("figures", "gamma-table", "--out", str(tmp_path / "p"))
    assert code == 2 and err.startswith(f"{PREFIX}--out {tmp_path / 'p'} is a non-empty directory; ")
    assert sorted(os.listdir(tmp_path / "p")) == ["gamma-table.png"]


def test_bad_format_and_unknown_figure_name_the_option(cli, tmp_path):
    code, out, err = cli("figures", "--format", "png,jpg", "--out", str(tmp_path / "o"))
    assert (code, out) == (2, "")
    assert err == f"{PREFIX}--format must be a comma-separated subset of png, pdf, svg, got 'png,jpg'\n"
    assert not (tmp_path / "o").exists()


def test_missing_results_for_a_named_figure_is_one_line(cli, tmp_path):
    code, out, err = cli("figures", "m2po-collapse", "--results", str(tmp_path / "r"), "--out", str(tmp_path / "o"))
    assert (code, out) == (2, "")
    path = tmp_path / "r" / "m2po"
    assert err == f"{PREFIX}{path / 'runs'} not found: run `replay-theory experiment m2po --out {path}`\n"
    assert not (tmp_path / "o").exists()


def test_write_all_removes_what_it_wrote_when_a_write_fails(tmp_path):
    out_dir = tmp_path / "new" / "figs"
    with pytest.raises(ValueError) as info:  # the second name's folder does not exist: open fails
        write_all(out_dir, [("a.png", b"1"), ("missing/b.png", b"2")])
    assert str(info.value) == f"--out {out_dir}: cannot write b.png (No such file or directory); nothing was written"
    assert os.listdir(tmp_path) == []  # a.png, figs/ and new/ are all gone


def test_written_files_honour_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        paths = write_all(tmp_path / "o", [("a.png", b"1")])
    finally:
        os.umask(old)
    assert paths == [tmp_path / "o" / "a.png"]
    assert (tmp_path / "o" / "a.png").stat().st_mode & 0o777 == 0o644

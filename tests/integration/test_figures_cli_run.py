"""``replay-theory figures`` output rules: default directory, never overwrite, bad input one line, exit 2.

Every bad-input row of issue 11 for this command: the exact message, exit code 2, and that nothing
was created or changed.

Integration tier: the slower tests of this module (a figures run over saved results); the fast ones are in
tests/unit/test_figures_cli.py.
"""

from __future__ import annotations

PREFIX = "replay-theory: error: "


def test_corrupt_run_json_names_the_file_and_writes_nothing(cli, tmp_path):
    runs = tmp_path / "results" / "rloo" / "runs"
    runs.mkdir(parents=True)
    bad = runs / "0123abcd.json"
    bad.write_text("{'key': 1}")  # single quotes: not JSON
    for names in (["rloo-heatmap"], ["all"]):
        code, out, err = cli("figures", *names, "--results", str(tmp_path / "results"), "--out", str(tmp_path / "o"))
        assert (code, out) == (2, "")
        assert err == (f"{PREFIX}{bad} is not valid JSON (Expecting property name enclosed in double quotes: "
                       f"line 1 column 2 (char 1)): delete it and rerun the command that wrote it\n")
        assert not (tmp_path / "o").exists()  # the theory figures of `all` were not written either

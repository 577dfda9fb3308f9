"""`replay-theory diagnose` on files shaped like TRL's and verl's logged tensors, and the CLI contract."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from replay_theory.figures.diagnose import ess_by_age_data  # noqa: E402
from replay_theory.theory import divergences as dv  # noqa: E402

REQUIRED_KEYS = ("n_tokens", "ess_frac", "chi2", "d2", "kl_k1", "kl_k2", "kl_k3", "m2", "ratio_max")


def _padded_batch(rng, n_seq: int, max_len: int):
    """Right-padded (n_seq, max_len) log-probs as a trainer holds them, and the 0/1 completion mask."""
    lengths = rng.integers(3, max_len + 1, size=n_seq)
    mask = (np.arange(max_len)[None, :] < lengths[:, None]).astype(np.int64)  # (n_seq, max_len)
    behav = -rng.exponential(1.0, size=(n_seq, max_len))
    current = np.minimum(behav + rng.normal(scale=0.2, size=(n_seq, max_len)), 0.0)
    behav, current = behav * mask, current * mask  # padding holds 0.0, as in TRL / verl
    return behav, current, mask, lengths


def _expected(behav, current, mask):
    lr = (current - behav)[mask.astype(bool)]
    seq = np.sum((current - behav) * mask, axis=1)
    return dv.sample_statistics(lr), dv.sample_statistics(seq)


def test_trl_preset_reads_grpo_trainer_shaped_parquet(tmp_path, cli):
    rng = np.random.default_rng(0)
    behav, current, mask, _ = _padded_batch(rng, 64, 20)
    old = np.minimum(behav + rng.normal(scale=0.05, size=behav.shape), 0.0) * mask
    table = pa.table({
        "prompt_ids": [list(rng.integers(0, 100, 5)) for _ in range(64)],
        "completion_ids": [list(rng.integers(0, 100, 20)) for _ in range(64)],
        "completion_mask": [list(m) for m in mask],
        "sampling_per_token_logps": [list(b) for b in behav],
        "old_per_token_logps": [list(o) for o in old],
        "per_token_logps": [list(c) for c in current],
        "advantages": rng.normal(size=64),
    })
    path = tmp_path / "trl_batch.parquet"
    pq.write_table(table, path)
    code, out, err = cli("diagnose", str(path), "--preset", "trl", "--json", "--no-progress", "--chunk-rows", "10")
    assert code == 0, err
    report = json.loads(out)
    tok, seq = _expected(behav, current, mask)
    assert report["layout"] == "wide" and report["n_tokens"] == int(mask.sum())
    for key in ("kl_k1", "kl_k2", "kl_k3", "m2", "d2", "chi2", "ess_frac"):
        assert report[key] == pytest.approx(float(tok[key]), rel=1e-10, abs=1e-14), key
    assert report["sequence"]["ess_frac"] == pytest.approx(float(seq["ess_frac"]), rel=1e-10)
    assert report["sequence"]["chi2"] == pytest.approx(float(seq["chi2"]), rel=1e-10)
    # TRL's own vLLM IS-correction pair: sampler vs old_per_token_logps
    code, out, _ = cli("diagnose", str(path), "--preset", "trl", "--columns", "logp_current=old_per_token_logps",
                       "--json", "--no-progress")
    tok_old, _ = _expected(behav, old, mask)
    assert json.loads(out)["m2"] == pytest.approx(float(tok_old["m2"]), rel=1e-10)
    # advantages present: the M2PO what-if ran (no "needs an advantage column" note)
    assert all(r.get("note") is None for r in report["what_if"] if r["correction"].startswith("m2po"))


def test_verl_preset_reads_dataproto_shaped_jsonl_with_an_age_column(tmp_path, cli):
    rng = np.random.default_rng(1)
    behav, current, mask, _ = _padded_batch(rng, 48, 16)
    ages = rng.integers(0, 4, size=48)
    path = tmp_path / "verl_batch.jsonl"
    with open(path, "w") as fh:
        for i in range(48):
            fh.write(json.dumps({
                "uid": f"prompt-{i // 8}", "responses": [int(t) for t in rng.integers(0, 100, 16)],
                "response_mask": [int(m) for m in mask[i]], "rollout_log_probs": list(map(float, behav[i])),
                "old_log_probs": list(map(float, current[i])),
                "advantages": [float(a) for a in rng.normal(size=16) * mask[i]], "version_gap": int(ages[i]),
            }) + "\n")
    code, out, err = cli("diagnose", str(path), "--preset", "verl", "--columns", "age=version_gap", "--json",
                         "--no-progress")
    assert code == 0, err
    report = json.loads(out)
    tok, seq = _expected(behav, current, mask)
    assert report["ess_frac"] == pytest.approx(float(tok["ess_frac"]), rel=1e-10)
    assert report["sequence"]["ess_frac"] == pytest.approx(float(seq["ess_frac"]), rel=1e-10)
    token_age = np.repeat(ages, mask.sum(axis=1))
    lr = (current - behav)[mask.astype(bool)]
    assert [b["age"] for b in report["by_age"]] == sorted(set(ages.astype(float).tolist()))
    for bucket in report["by_age"]:
        sub = lr[token_age == bucket["age"]]
        assert bucket["n_tokens"] == sub.size
        assert bucket["m2"] == pytest.approx(float(dv.m2(sub)), rel=1e-10)
    assert report["drift"]["n_ages"] == len(set(ages.tolist()))


def test_json_keys_and_sequence_block(tmp_path, cli):
    rng = np.random.default_rng(2)
    n = 300
    table = pa.table({"seq_id": np.repeat(np.arange(60), 5), "logp_behav": -rng.exponential(size=n),
                      "age": np.repeat(rng.integers(0, 3, 60), 5).astype(float)})
    table = table.append_column("logp_current", pa.array(np.minimum(
        table["logp_behav"].to_numpy() + rng.normal(scale=0.1, size=n), 0.0)))
    path = tmp_path / "log.parquet"
    pq.write_table(table, path)
    code, out, _ = cli("diagnose", str(path), "--json", "--no-progress")
    assert code == 0
    report = json.loads(out)
    lr = table["logp_current"].to_numpy() - table["logp_behav"].to_numpy()
    assert report["n_tokens"] == n
    assert report["ratio_max"] == pytest.approx(float(np.exp(lr.max())))
    for key in REQUIRED_KEYS[1:]:
        assert isinstance(report[key], float), key
    assert set(report["sequence"]) >= {"ess_frac", "chi2", "n_sequences"}
    assert len(report["by_age"]) == 3 and all(set(REQUIRED_KEYS) <= set(b) for b in report["by_age"])
    assert sum(b["n_tokens"] for b in report["by_age"]) == n


def test_figure_and_saved_report_rebuild(tmp_path, cli):
    rng = np.random.default_rng(3)
    n = 200
    behav = -rng.exponential(size=n)
    age = np.repeat(np.arange(4.0), n // 4)
    table = pa.table({"seq_id": np.arange(n) // 4, "logp_behav": behav,
                      "logp_current": np.minimum(behav + rng.normal(scale=0.05 * (1 + age)), 0.0), "age": age})
    path = tmp_path / "log.parquet"
    pq.write_table(table, path)
    (tmp_path / "out").mkdir()  # outputs go into an existing folder (a missing one is refused before work)
    saved, fig = tmp_path / "out" / "report.json", tmp_path / "out" / "ess.png"
    code, out, err = cli("diagnose", str(path), "--save", str(saved), "--figure", str(fig), "--no-progress")
    assert code == 0, err
    assert "by sample age:" in out and "what if" in out and "KL drift:" in out
    report = json.loads(saved.read_text())
    assert report["config"]["path"] == str(path)  # saved with its full config
    data = ess_by_age_data(report)
    np.testing.assert_allclose(data["age"], [0, 1, 2, 3])
    assert np.all(data["ess_frac"] <= data["ess_bound"] + 1e-12)  # FreshPER Eq. (11) holds per bucket
    # results are never overwritten
    code, _, err = cli("diagnose", str(path), "--save", str(saved), "--no-progress")
    assert code == 2 and err == (f"replay-theory: error: --save {saved} exists; results are never overwritten: "
                                 "choose a new path\n")
    # the figure is rebuilt from the saved report without the log: the same pixels as after the pass
    fig2 = tmp_path / "again.png"
    code, out, _ = cli("diagnose", "--from-report", str(saved), "--figure", str(fig2))
    assert code == 0 and out == f"wrote {fig2}\n"
    assert fig2.read_bytes() == fig.read_bytes()


_VALID_FIELDS = "advantage, age, layout, logp_behav, logp_current, mask, position, reward, seq_id, tool_mask"
_FORMATS = "valid: auto, parquet, csv, jsonl"


@pytest.mark.parametrize("args, message", [
    (["missing.parquet"], "LOG missing.parquet is not a file (not found, or a directory)"),
    (["{csv}", "--preset", "nemo"], "--preset must be one of default, trl, verl, nemo-rl, skyrl, slime, got 'nemo'"),
    (["{csv}", "--clip", "0.2,x"], "--clip must be comma-separated numbers, got '0.2,x'"),
    (["{csv}", "--clip", "1.5"], "--clip values must be finite numbers in (0, 1), got 1.5"),
    (["{csv}", "--tis", "0.5"], "--tis values must be finite numbers > 1, got 0.5"),
    (["{csv}", "--mask", "1"], "--mask values must be finite numbers > 1, got 1.0"),
    (["{csv}", "--m2po", "0"], "--m2po values must be finite numbers > 0, got 0.0"),
    (["{csv}", "--tau", "2,inf"], "--tau values must be finite numbers > 0, got inf"),
    (["{csv}", "--m2po-batch-tokens", "0"], "--m2po-batch-tokens must be an integer >= 1, got 0"),
    (["{csv}", "--max-age-buckets", "0"], "--max-age-buckets must be an integer >= 1, got 0"),
    (["{csv}", "--chunk-rows", "0"], "--chunk-rows must be an integer >= 1, got 0"),
    (["{csv}", "--threads", "0"], "--threads must be an integer >= 1, got 0"),
    (["{csv}", "--format", "xml"], "--format must be one of auto, parquet, csv, jsonl, got 'xml'"),
    (["{csv}", "--columns", "logp_behav"], "--columns must be field=name pairs separated by commas, got 'logp_behav'"),
    (["{csv}", "--columns", "foo=bar"], f"--columns names an unknown field 'foo' (valid: {_VALID_FIELDS})"),
    (["{csv}", "--columns", "logp_behav="], "--columns cannot drop logp_behav: it is required"),
    (["{csv}", "--columns", "layout=tall"], "--columns sets layout to 'tall' (valid: auto, long, wide)"),
    (["{nan}"], "nan.csv: 1 tokens with NaN, null or infinite log-probs in the rows from 0; fix the log or pass "
                "--skip-invalid to drop and count them"),
    (["{wide}"], "row 0 of wide.jsonl: the per-token lists have different lengths (or are null); fix the log or "
                 "pass --skip-invalid to drop and count such rows"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, cli, args, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    csv = tmp_path / "ok.csv"
    csv.write_text("seq_id,logp_behav,logp_current\n0,-1.0,-1.1\n0,-0.5,-0.4\n")
    nan = tmp_path / "nan.csv"
    nan.write_text("seq_id,logp_behav,logp_current\n0,-1.0,nan\n")
    wide = tmp_path / "wide.jsonl"
    wide.write_text(json.dumps({"logp_behav": [-1.0, -2.0], "logp_current": [-1.0], "seq_id": 0}) + "\n")
    args = [a.format(csv=csv, nan=nan, wide=wide) for a in args]
    code, out, err = cli("diagnose", *args, "--no-progress")
    assert code == 2 and out == ""
    assert err == f"replay-theory: error: {message}\n"
    # the options as typed, never the config fields behind them
    assert not any(name in err for name in ("ppo_clip", "freshper_tau", "m2po_batch_tokens", "max_age_buckets",
                                            "chunk_rows"))


def _age_log(tmp_path, name: str = "log.parquet"):
    """A long-layout Parquet log with ages 0-3; returns its path and its token log-ratios."""
    rng = np.random.default_rng(7)
    n = 80
    behav = -rng.exponential(size=n)
    current = np.minimum(behav + rng.normal(scale=0.1, size=n), 0.0)
    table = pa.table({"seq_id": np.arange(n) // 4, "logp_behav": behav, "logp_current": current,
                      "age": np.repeat(np.arange(4.0), n // 4)})
    path = tmp_path / name
    pq.write_table(table, path)
    return path, current - behav


def test_format_that_contradicts_the_file_is_one_printable_line(tmp_path, cli):
    path, lr = _age_log(tmp_path)
    renamed = tmp_path / "log.csv"
    renamed.write_bytes(path.read_bytes())
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text(json.dumps({"seq_id": 0, "logp_behav": -1.0, "logp_current": -1.1}) + "\n")
    gz = tmp_path / "packed.csv"
    gz.write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(40)))
    cases = [
        ([str(path), "--format", "csv"], f"--format csv does not match log.parquet: it looks like a Parquet file "
                                         f"({_FORMATS})"),
        ([str(path), "--format", "jsonl"], f"--format jsonl does not match log.parquet: it looks like a Parquet "
                                           f"file ({_FORMATS})"),
        ([str(renamed)], f"--format auto does not match log.csv (auto took csv from the suffix): it looks like a "
                         f"Parquet file ({_FORMATS})"),
        ([str(jsonl), "--format", "csv"], f"--format csv does not match rows.jsonl: it looks like a JSON-lines file "
                                          f"({_FORMATS})"),
        ([str(gz)], f"--format auto does not match packed.csv (auto took csv from the suffix): it looks like a "
                    f"binary file that is not Parquet ({_FORMATS})"),
    ]
    for args, message in cases:
        code, out, err = cli("diagnose", *args, "--no-progress")
        assert (code, out, err) == (2, "", f"replay-theory: error: {message}\n"), args
        assert err[:-1].isprintable()  # no raw control bytes from the file
    # the right format still reads the same file
    code, out, _ = cli("diagnose", str(renamed), "--format", "parquet", "--json", "--no-progress")
    assert code == 0 and json.loads(out)["m2"] == pytest.approx(float(np.mean(lr**2)), rel=1e-12)


def test_from_report_refuses_what_is_not_a_report(tmp_path, cli):
    other = tmp_path / "other.json"
    other.write_text('{"n_tokens": 3, "mu": 5.28}')
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    broken = tmp_path / "broken.json"
    broken.write_text("{'n_tokens': 3}")
    csv = tmp_path / "no_age.csv"
    csv.write_text("seq_id,logp_behav,logp_current\n0,-1.0,-1.1\n0,-0.5,-0.4\n")
    no_age = tmp_path / "no_age.json"
    assert cli("diagnose", str(csv), "--save", str(no_age), "--no-progress")[0] == 0
    hint = "save one with replay-theory diagnose LOG --save REPORT.json"
    cases = [
        (other, f"--from-report {other} is not a diagnose report (no ess_frac, by_age, config); {hint}"),
        (listed, f"--from-report {listed} is not a diagnose report (no n_tokens, ess_frac, by_age, config); {hint}"),
        (broken, f"--from-report {broken} is not a diagnose report: not JSON (Expecting property name enclosed in "
                 "double quotes, line 1 column 2)"),
        (tmp_path / "gone.json", f"--from-report {tmp_path / 'gone.json'} cannot be read: No such file or directory"),
        (no_age, f"--from-report {no_age} has no by-age table (its log had no age column): there is no figure to "
                 "draw"),
    ]
    figure = tmp_path / "fig.png"
    for report, message in cases:
        code, out, err = cli("diagnose", "--from-report", str(report), "--figure", str(figure))
        assert (code, out, err) == (2, "", f"replay-theory: error: {message}\n"), report
        assert not figure.exists()


def test_from_report_refuses_a_log_or_save_beside_it(tmp_path, cli):
    path, _ = _age_log(tmp_path)
    report, figure = tmp_path / "r.json", tmp_path / "f.png"
    assert cli("diagnose", str(path), "--save", str(report), "--no-progress")[0] == 0
    code, out, err = cli("diagnose", str(path), "--from-report", str(report), "--figure", str(figure))
    assert (code, out) == (2, "")
    assert err == f"replay-theory: error: give a LOG or --from-report, not both (got {path} and --from-report " \
                  f"{report})\n"
    code, out, err = cli("diagnose", "--from-report", str(report), "--figure", str(figure), "--save",
                         str(tmp_path / "r2.json"))
    assert (code, out) == (2, "")
    assert err == "replay-theory: error: --save needs a LOG: --from-report only rebuilds --figure from a saved report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.parquet", "r.json"]


def test_running_out_of_memory_is_one_line_naming_the_options_that_bound_it(tmp_path, cli, monkeypatch):
    path, _ = _age_log(tmp_path)

    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 2.00 MiB for an array with shape (262144,) and data type float64")

    monkeypatch.setattr("replay_theory.diagnose.pipeline.diagnose", no_memory)
    code, out, err = cli("diagnose", str(path), "--chunk-rows", "1000", "--no-progress", "--save",
                         str(tmp_path / "r.json"))
    assert code == 2 and out == ""
    assert err == (f"replay-theory: error: out of memory while diagnosing {path}: lower --chunk-rows (now 1000) or "
                   "--threads (now 2); with unsorted sequence ids every sequence is held\n")
    assert not (tmp_path / "r.json").exists()


def test_output_paths_are_checked_before_any_work(tmp_path, cli, monkeypatch):
    path, _ = _age_log(tmp_path)
    taken = tmp_path / "taken.png"
    taken.write_bytes(b"the user's own figure")
    a_file = tmp_path / "plain.txt"
    a_file.write_text("not a folder")

    def no_work(*args, **kwargs):
        raise AssertionError("the log was read before the output paths were checked")

    monkeypatch.setattr("replay_theory.diagnose.pipeline.diagnose", no_work)  # the command loads it when run
    never = "results are never overwritten: choose a new path"
    cases = [
        (["--figure", str(taken)], f"--figure {taken} exists; {never}"),
        (["--save", str(taken)], f"--save {taken} exists; {never}"),
        (["--save", str(tmp_path / "nodir" / "r.json")],
         f"--save {tmp_path / 'nodir' / 'r.json'}: the folder {tmp_path / 'nodir'} does not exist; create it first "
         "or choose another path"),
        (["--figure", str(tmp_path / "nodir" / "f.png")],
         f"--figure {tmp_path / 'nodir' / 'f.png'}: the folder {tmp_path / 'nodir'} does not exist; create it "
         "first or choose another path"),
        (["--figure", str(a_file / "f.png")],
         f"--figure {a_file / 'f.png'}: the folder {a_file} is not a folder; create it first or choose another "
         "path"),
        (["--figure", str(tmp_path / "f.txt")], f"--figure {tmp_path / 'f.txt'} must end in one of .png, .pdf, .svg"),
        (["--figure", str(tmp_path / "same.svg"), "--save", str(tmp_path / "same.svg")],
         f"--save and --figure both name {tmp_path / 'same.svg'}: choose two paths"),
    ]
    for extra, message in cases:
        code, out, err = cli("diagnose", str(path), *extra, "--no-progress")
        assert (code, out, err) == (2, "", f"replay-theory: error: {message}\n"), extra
    # nothing written, nothing created, the user's file untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.parquet", "plain.txt", "taken.png"]
    assert taken.read_bytes() == b"the user's own figure"
    # --from-report checks --figure the same way before reading the report
    code, _, err = cli("diagnose", "--from-report", str(tmp_path / "none.json"), "--figure", str(taken))
    assert code == 2 and err == f"replay-theory: error: --figure {taken} exists; {never}\n"
    assert taken.read_bytes() == b"the user's own figure"


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_written_files_honour_the_umask(tmp_path, cli, umask, mode):
    path, _ = _age_log(tmp_path)
    report, figure = tmp_path / "r.json", tmp_path / "f.svg"
    old = os.umask(umask)
    try:
        code, _, err = cli("diagnose", str(path), "--save", str(report), "--figure", str(figure), "--no-progress")
    finally:
        os.umask(old)
    assert code == 0, err
    assert stat.S_IMODE(report.stat().st_mode) == mode and stat.S_IMODE(figure.stat().st_mode) == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.svg", "log.parquet", "r.json"]  # no temporary left
    assert figure.read_text().lstrip().startswith("<?xml")


def test_a_file_that_appears_during_the_write_is_not_replaced(tmp_path):
    from replay_theory.outputs import write_new

    target = tmp_path / "r.json"

    def write(tmp: str) -> None:
        Path(tmp).write_text("ours")
        target.write_text("theirs")  # another process wins the race

    with pytest.raises(ValueError, match=r"^--save .*r\.json appeared while this command ran; results are never "
                                         r"overwritten: choose a new path$"):
        write_new(target, write, "--save")
    assert target.read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_the_command_runs_on_its_own_typer_app(tmp_path, capsys):
    import typer
    from typer.testing import CliRunner

    from replay_theory.cli.diagnose_cmds import diagnose_command, register

    path = tmp_path / "ok.csv"
    path.write_text("seq_id,logp_behav,logp_current\n0,-1.0,-1.1\n0,-0.5,-0.4\n1,-2.0,-1.0\n")
    m2 = (0.1**2 + 0.1**2 + 1.0**2) / 3  # mean (log r)^2 by hand
    app = typer.Typer()
    register(app)

    @app.callback()
    def root() -> None:
        """A second command slot so typer keeps 'diagnose' as a sub-command."""

    result = CliRunner().invoke(app, ["diagnose", str(path), "--json", "--no-what-if"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["m2"] == pytest.approx(m2)
    # and as a plain function
    diagnose_command(log=path, as_json=True, no_what_if=True, no_progress=True)
    assert json.loads(capsys.readouterr().out)["m2"] == pytest.approx(m2)


def test_figure_is_print_ready(tmp_path):
    import matplotlib.image
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    from replay_theory.diagnose import DiagnoseConfig, diagnose
    from replay_theory.figures.diagnose import FIGURE_DPI, plot_ess_by_age, save_figure

    path, _ = _age_log(tmp_path)
    report = diagnose(DiagnoseConfig(path=str(path)))
    figure = plot_ess_by_age(report)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    texts = [t for t in figure.findobj(Text) if t.get_visible() and t.get_text()]
    assert min(t.get_fontsize() for t in texts) >= 8  # legend, ticks, labels at the figure's own size
    labels = [t.get_text() for t in texts]
    assert not any("^{" in t and "$" not in t for t in labels)  # braces only inside mathtext
    assert any(r"\exp(-\mathrm{KL}" in t for t in labels)
    for ax in figure.axes:  # each legend sits outside its panel's data area
        legend_box = ax.get_legend().get_window_extent(renderer)
        assert not legend_box.overlaps(ax.get_window_extent(renderer))
    plt.close(figure)
    png = tmp_path / "f.png"
    save_figure(report, png)
    # the PNG's pHYs chunk records the resolution: pixels per metre = dpi / 0.0254
    data = png.read_bytes()
    phys = data.index(b"pHYs") + 4
    per_metre = int.from_bytes(data[phys:phys + 4], "big")
    assert round(per_metre * 0.0254) == FIGURE_DPI == 200
    width_in = figure.get_size_inches()[0]
    assert matplotlib.image.imread(png).shape[1] == pytest.approx(width_in * FIGURE_DPI, rel=0.1)  # drawn at 200


def test_diagnose_needs_no_torch_and_nothing_from_validate():
    code = ("import sys\nimport replay_theory.diagnose, replay_theory.cli.diagnose_cmds\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('replay_theory.validate')))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_skip_invalid_counts_mismatched_wide_rows(tmp_path, cli):
    path = tmp_path / "wide.jsonl"
    rows = [{"seq_id": 0, "logp_behav": [-1.0, -2.0], "logp_current": [-1.0, -1.5]},
            {"seq_id": 1, "logp_behav": [-1.0, -2.0], "logp_current": [-1.0]},
            {"seq_id": 2, "logp_behav": [-0.5], "logp_current": [-0.7]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, _ = cli("diagnose", str(path), "--skip-invalid", "--json", "--no-progress")
    report = json.loads(out)
    assert code == 0 and report["skipped"]["mismatched_rows"] == 1
    lr = np.array([0.0, 0.5, -0.2])
    assert report["n_tokens"] == 3 and report["n_sequences"] == 2
    assert report["m2"] == pytest.approx(float(np.mean(lr**2)))


@pytest.mark.parametrize("body, message", [
    ("seq_id,logp_behav\n0,-1.0\n", "column 'logp_current' (logp_current) not in"),
    ("seq_id,logp_behav,logp_current\n0,-1.0,0.5\n", "1 tokens with positive log-probs"),
    ("seq_id,logp_behav,logp_current\n0,-1.0,inf\n", "NaN, null or infinite log-probs"),
])
def test_bad_input_with_the_progress_bar_on_is_still_one_line(tmp_path, cli, body, message):
    # without --no-progress: a stderr that is not a terminal gets no bar and no stray blank line
    path = tmp_path / "bad.csv"
    path.write_text(body)
    code, out, err = cli("diagnose", str(path))
    assert code == 2 and out == ""
    assert err.startswith("replay-theory: error: ") and err.count("\n") == 1 and message in err


def test_missing_pyarrow_is_one_line_exit_2(tmp_path, cli, monkeypatch):
    path = tmp_path / "ok.csv"
    path.write_text("seq_id,logp_behav,logp_current\n0,-1.0,-1.1\n")
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)  # import pyarrow -> ImportError
    code, out, err = cli("diagnose", str(path))
    assert code == 2 and out == ""
    assert err == "replay-theory: error: diagnose needs pyarrow to read logs: pip install 'replay-theory[diagnose]'\n"


def test_success_leaves_a_redirected_stderr_empty(tmp_path, cli):
    path = tmp_path / "ok.csv"
    path.write_text("seq_id,logp_behav,logp_current\n0,-1.0,-1.1\n0,-0.5,-0.4\n")
    code, out, err = cli("diagnose", str(path), "--json")
    assert code == 0 and err == ""
    assert json.loads(out)["m2"] == pytest.approx((0.1**2 + 0.1**2) / 2)


def test_example_log_shapes_agree_and_recover_the_known_drift(tmp_path, cli):
    from replay_theory.experiments.example_log import example_log, write_example

    reports = {}
    for shape, name, extra in (("default", "log.parquet", []), ("default", "log.csv", []),
                               ("trl", "trl.parquet", ["--preset", "trl", "--columns", "age=version_gap"]),
                               ("verl", "verl.jsonl", ["--preset", "verl", "--columns", "age=version_gap"])):
        write_example(tmp_path / name, shape, seed=3)
        code, out, err = cli("diagnose", str(tmp_path / name), *extra, "--json", "--no-progress")
        assert code == 0, err
        reports[name] = json.loads(out)
    columns, truth = example_log(np.random.default_rng(3))
    lr = columns["logp_current"] - columns["logp_behav"]
    tok = dv.sample_statistics(lr)
    seq_lr = np.bincount(columns["seq_id"], weights=lr)
    for name, report in reports.items():
        assert report["n_tokens"] == lr.size and report["n_sequences"] == seq_lr.size, name
        for key in ("ess_frac", "chi2", "m2", "kl_k3"):
            assert report[key] == pytest.approx(float(tok[key]), rel=1e-9), (name, key)
        assert report["sequence"]["ess_frac"] == pytest.approx(float(dv.ess_kish_fraction(seq_lr)), rel=1e-9)
        assert [b["age"] for b in report["by_age"]] == truth["age"].tolist()
        assert report["drift"]["shape"] == "linear"  # a random walk in the logits
    for bucket, kl in zip(reports["log.parquet"]["by_age"], truth["kl"]):
        sub = lr[columns["age"] == bucket["age"]]
        k3 = np.expm1(sub) - sub
        assert abs(bucket["kl_k3"] - kl) < 5 * k3.std() / np.sqrt(sub.size)  # the sampled KL, within 5 s.e.
    with pytest.raises(ValueError, match="exists"):  # never overwrites
        write_example(tmp_path / "log.parquet")

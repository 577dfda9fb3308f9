"""Issue 32, "inputs accepted that should not be": each is refused in one line naming the option (or the file's
field), exit 2, before any work, nothing written; or, where the input was right, read as it was meant (a
byte-order mark before JSON or CSV), and a log too small to estimate anything says so first.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402 (after the importorskip)

from replay_theory.experiments.example_log import write_example  # noqa: E402

BOM = "\ufeff"


def test_a_decimal_comma_mu_is_ambiguous_and_refused(error_line, tmp_path):
    # --mu 5,28 ran mu in {5, 28}: in a decimal-comma locale it is the paper's 5.28
    out = tmp_path / "bench"
    assert error_line("experiment", "theory-test", "--out", str(out), "--mu", "5,28") == (
        "--mu 5,28 is ambiguous: the two values 5 and 28, or 5.28 with a decimal comma? Write 5.28 for one value "
        "(the decimal separator is a point), or 5.0,28 for two")
    assert not out.exists()


def test_a_list_that_cannot_be_one_decimal_comma_number_is_read_as_a_list():
    from replay_theory.experiments.theory_bench import number_list as _number_list

    assert _number_list("5.0,28", "--mu", "") == (5.0, 28.0)
    assert _number_list("0.5,1,2", "--mu", "") == (0.5, 1.0, 2.0)  # two commas: a list, whatever the locale
    assert _number_list("0,1", "--instance", "", int) == (0, 1)  # integers: a decimal comma cannot be meant


def _frac_age_log(tmp_path):
    """The example log (long layout, a float age column) with every age-1 token's age set to 1.5."""
    write_example(tmp_path / "log.parquet")
    table = pq.read_table(tmp_path / "log.parquet")
    age = table.column("age").to_numpy().copy()
    first = int(np.argmax(age == 1))
    age[age == 1] = 1.5
    table = table.set_column(table.schema.get_field_index("age"), "age", pa.array(age))
    pq.write_table(table, tmp_path / "frac.parquet")
    return tmp_path / "frac.parquet", first


@pytest.mark.parametrize("command", [["diagnose", "LOG", "--no-progress", "--save", "SAVE"],
                                     ["calibrate", "--from-log", "LOG", "--mu", "5", "--out", "SAVE"]])
def test_a_fractional_age_is_refused_with_its_column_and_row(tmp_path, error_line, command):
    # diagnose made a by-age bucket "1.5" of it, calibrate dropped it from the table without a word
    log, row = _frac_age_log(tmp_path)
    save = tmp_path / "out.json"
    args = [str(log) if a == "LOG" else str(save) if a == "SAVE" else a for a in command]
    assert error_line(*args) == (
        f"row {row} of frac.parquet: column 'age' (the age) holds 1.5, not a whole number of steps; ages count "
        "optimizer steps (s = t - v): convert the column, or map another with --columns age=NAME")
    assert not save.exists()


def test_a_fractional_age_in_a_wide_log_names_its_row(tmp_path, error_line):
    # the wide layout (a row per sequence, per-token lists): the row is the sequence's
    table = pa.table({"logp_behav": [[-1.0, -2.0], [-1.0], [-0.5, -0.5]], "logp_current": [[-1.1, -2.0], [-1.0],
                                                                                          [-0.4, -0.6]],
                      "age": [0.0, 2.0, 2.5]})
    pq.write_table(table, tmp_path / "wide.parquet")
    assert error_line("diagnose", str(tmp_path / "wide.parquet"), "--no-progress") == (
        "row 2 of wide.parquet: column 'age' (the age) holds 2.5, not a whole number of steps; ages count optimizer "
        "steps (s = t - v): convert the column, or map another with --columns age=NAME")


@pytest.mark.parametrize("field, value, message", [
    ("rollouts_per_step", -50, "rollouts_per_step must be an integer >= 1 (or null), got -50"),
    ("batch_size", 64.5, "batch_size must be an integer >= 1 (or null), got 64.5"),
    ("capacity", "64", "capacity must be an integer >= 1 (or null), got '64'"),
    ("b_noise", -3.0, "b_noise must be a finite number > 0 (or null), got -3.0"),
    ("mu", 0, "mu must be a finite number > 0 (or null), got 0"),
    ("convention", "mine", "convention must be one of rollout-cost, paper-sec3, got 'mine'"),
])
def test_a_design_file_is_checked_field_by_field_before_any_work(cli, error_line, tmp_path, field, value, message):
    # a design with rollouts_per_step -50 started trl-replay ("R = N = -50 of the rule rounded to 48")
    code, design, _ = cli("optimal", "--mu", "5.28", "--noise-scale", "1000", "-B", "64", "--json")
    assert code == 0
    path = tmp_path / "design.json"
    path.write_text(json.dumps({**json.loads(design), field: value}))
    out = tmp_path / "run"
    assert error_line("trl-replay", "--design", str(path), "--out", str(out), "--group-size", "4") == (
        f"--design {path}: {message}")
    assert not out.exists()


def test_a_one_sequence_log_says_its_statistics_estimate_nothing(tmp_path, cli):
    log = tmp_path / "one.csv"
    log.write_text("seq_id,logp_behav,logp_current,age,advantage\n0,-1.0,-0.9,0,1.0\n")
    note = ("one sequence (1 token): every statistic below describes this sequence alone, not the run (nothing varies "
            "between sequences to estimate a spread from); log more rollouts")
    code, out, err = cli("diagnose", str(log), "--no-progress")
    assert code == 0 and err == ""
    assert out.splitlines()[1:3] == ["  1 tokens in 1 sequences; r = pi_current / pi_behav", f"  WARNING: {note}"]
    code, out, _ = cli("diagnose", str(log), "--no-progress", "--json")
    assert json.loads(out)["sample_note"] == note
    write_example(tmp_path / "many.parquet")  # many sequences: no note
    code, out, _ = cli("diagnose", str(tmp_path / "many.parquet"), "--no-progress", "--json")
    assert code == 0 and json.loads(out)["sample_note"] is None


def test_grad_norms_csv_with_a_byte_order_mark_reads_as_without(tmp_path, cli):
    # Excel writes UTF-8 CSV with a BOM: the first column was read as "\ufeffstep" and refused as "no step column".
    # Hand value as tests/integration/test_calibrate_log.py: means 9 and 5 at B 4 and 8, B_noise = 32
    from replay_theory.diagnose.calibrate_log import read_grad_norms

    rows = "step,grad_sq_small,grad_sq_big,batch_small,batch_big\n0,10,6,4,8\n1,8,5,4,8\n2,9,4,4,8\n"
    (tmp_path / "plain.csv").write_text(rows, encoding="utf-8")
    (tmp_path / "bom.csv").write_text(BOM + rows, encoding="utf-8")
    plain, bom = read_grad_norms(tmp_path / "plain.csv"), read_grad_norms(tmp_path / "bom.csv")
    assert sorted(bom) == sorted(plain) and all(np.array_equal(bom[k], plain[k]) for k in plain if k != "unit_size")
    from replay_theory.diagnose.calibrate_log import noise_scale_record

    record = noise_scale_record(bom, unit_size=1, source="bom")
    assert record["b_noise"] == pytest.approx(32.0, rel=1e-12)


def test_json_files_with_a_byte_order_mark_are_read(tmp_path, cli):
    # the design file, a sweep spec, a saved diagnose report and a profile: each read as if it had no mark
    from replay_theory.advise.profile_files import load_profile
    from replay_theory.integrations.replay_config import ReplayConfig
    from replay_theory.simulate.sweep import load_spec

    code, design, _ = cli("optimal", "--mu", "5.28", "--noise-scale", "1000", "-B", "64", "--objective", "noise-scale",
                          "--json")
    (tmp_path / "design.json").write_text(BOM + design, encoding="utf-8")
    config = ReplayConfig.from_optimal_json(tmp_path / "design.json", group_size=4)
    assert (config.capacity, config.batch_size, config.rollouts_per_step) == \
        (lambda d: (d.capacity, d.batch_size, d.rollouts_per_step))(ReplayConfig.from_optimal_json(design,
                                                                                                   group_size=4))
    spec = {"configs": [{"seeds": 2, "steps": 20}]}
    (tmp_path / "spec.json").write_text(BOM + json.dumps(spec), encoding="utf-8")
    assert load_spec(tmp_path / "spec.json")["configs"] == spec["configs"]
    write_example(tmp_path / "log.parquet")
    assert cli("diagnose", str(tmp_path / "log.parquet"), "--no-progress", "--save", str(tmp_path / "r.json"))[0] == 0
    text = (tmp_path / "r.json").read_text(encoding="utf-8")
    (tmp_path / "bom-report.json").write_text(BOM + text, encoding="utf-8")
    code, out, err = cli("diagnose", "--from-report", str(tmp_path / "bom-report.json"), "--figure",
                         str(tmp_path / "f.svg"))
    assert (code, err) == (0, "") and out == f"wrote {tmp_path / 'f.svg'}\n"
    profile = {"kind": "noise_scale", "noise_scale": {"b_noise": 500.0, "b_noise_interval": [400.0, 700.0],
                                                      "method": "two-batch", "batch": 64, "checkpoints": 5}}
    (tmp_path / "profile.json").write_text(BOM + json.dumps(profile), encoding="utf-8")
    assert math.isclose(load_profile(tmp_path / "profile.json").noise_scale["b_noise"], 500.0)

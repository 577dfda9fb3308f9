"""``calibrate --from-log LOG --grad-norms FILE``: kappa from the file's curvature pairs (issue 30), by hand, beside
B_noise, with optimal's kappa flags on the next: line; a file without pairs says so; bad pairs are one line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")

_spec = importlib.util.spec_from_file_location("calibrate_log_helpers",
                                               Path(__file__).with_name("test_calibrate_log.py"))
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)  # write_log, write_norms: the same log and norms as test_calibrate_log.py

#: (step, curvature_num, curvature_den, curvature_lr) on three of the norms' steps; the last pair has xi = 0
PAIRS = [(0, 2.0, 4.0, 0.01), (1, 3.0, 2.0, 0.02), (2, 0.0, 0.0, 0.01)]


def _norms_with_pairs(path: Path, pairs=PAIRS, beta1=0.9, drop: tuple[str, ...] = ()) -> Path:
    helpers.write_norms(path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    by_step = {s: (n, d, lr) for s, n, d, lr in pairs}
    for line in lines:
        if line["step"] in by_step:
            n, d, lr = by_step[line["step"]]
            line.update({"curvature_num": n, "curvature_den": d, "curvature_lr": lr, "curvature_beta1": beta1,
                         "curvature_hvp_step": line["step"] + 1, "curvature_hvp_rows": 4})
            for key in drop:
                line.pop(key)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_kappa_from_curvature_pairs_by_hand(tmp_path, cli):
    from replay_theory.advise.profile_files import load_profile

    log = helpers.write_log(tmp_path / "run.parquet")
    norms = _norms_with_pairs(tmp_path / "noise_scale.jsonl")
    out = tmp_path / "p.json"
    code, stdout, err = cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(out),
                            "--grad-norms", str(norms))
    assert code == 0 and err == ""
    memory = json.loads(out.read_text())["memory"]
    kappa = (0.01 * 2.0 + 0.02 * 3.0) / (4.0 + 2.0)  # sum eta_i num_i / sum den_i; the xi = 0 pair adds 0 / 0
    assert memory["kappa"] == pytest.approx(kappa, rel=1e-12)
    assert (memory["units"], memory["pairs_without_noise"], memory["step_range"]) == (2, 1, [0.01, 0.02])
    assert (memory["optimizer"], memory["beta1"], memory["pilot_batch"]) == ("adam", 0.9, 8.0)
    assert memory["kappa_interval"][0] <= kappa <= memory["kappa_interval"][1]
    assert memory["source"].startswith(f"replay-theory calibrate --grad-norms {norms}: curvature pairs")
    assert load_profile(out).memory_model().kappa == pytest.approx(kappa)
    lines = stdout.splitlines()
    b_line = next(i for i, line in enumerate(lines) if line.startswith("B_noise = "))
    assert lines[b_line + 1].startswith(f"kappa = {kappa:.4g} (90% interval ")  # beside B_noise
    assert f"memory 1/kappa = {1 / kappa:.3g} steps" in lines[b_line + 1]
    nxt = next(line for line in lines if line.startswith("next: replay-theory optimal --profile"))
    assert nxt.startswith(f"next: replay-theory optimal --profile {out}") and nxt.endswith(" -B 8 --group-size 2")
    assert "--kappa" not in nxt  # the profile carries the memory: optimal reads it, and refuses kappa given twice
    code, _, err = cli(*nxt.removeprefix("next: replay-theory ").split())  # the printed next step runs as written
    assert code == 0, err


def test_a_file_without_pairs_says_kappa_is_not_measured(tmp_path, cli):
    log = helpers.write_log(tmp_path / "run.parquet")
    norms = helpers.write_norms(tmp_path / "noise_scale.jsonl")
    out = tmp_path / "p.json"
    code, stdout, _ = cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(out),
                          "--grad-norms", str(norms))
    assert code == 0 and "kappa: no curvature pairs logged in noise_scale.jsonl" in stdout.splitlines()
    data = json.loads(out.read_text())
    assert "memory" not in data and any(s.startswith("kappa: no curvature pairs") for s in data["not_measured"])
    assert "--kappa" not in stdout


@pytest.mark.parametrize("change, message", [
    (dict(drop=("curvature_den",)), "a step with curvature_num has no curvature_den"),
    (dict(beta1=1.0), "curvature_beta1 must be in [0, 1) on every curvature pair, got 1 at step 0"),
    (dict(pairs=[(0, 1.0, 1.0, 0.0)]), "curvature_lr must be a finite number > 0 on every curvature pair, got 0"),
    (dict(pairs=[(0, 1.0, -1.0, 0.1)]), "curvature_den must be a finite number >= 0 on every curvature pair"),
])
def test_bad_curvature_pairs_are_one_line_before_any_work(tmp_path, cli, change, message):
    log = helpers.write_log(tmp_path / "run.parquet")
    norms = _norms_with_pairs(tmp_path / "noise_scale.jsonl", **change)
    out = tmp_path / "p.json"
    code, stdout, err = cli("calibrate", "--from-log", str(log), "--preset", "trl", "--out", str(out),
                            "--grad-norms", str(norms))
    assert code == 2 and stdout == "" and err.count("\n") == 1
    assert "--grad-norms" in err and message in err
    assert not out.exists()

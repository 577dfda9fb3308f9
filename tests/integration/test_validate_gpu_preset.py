"""validate all --preset gpu-fixed-b and the forgetting-aware rule in the fixed-B family (issue 31).

The preset's options (applied where an option is left at its default), its one-line refusals before any work, the
kappa the forgetting-aware rule reads (--kappa, else profile.json's measured memory record, else no prediction, said
in the report), and a fixed-b verify on the tiny model with that rule's pick placed among the family.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from replay_theory.theory.forgetting import forgetting_pick  # noqa: E402
from replay_theory.validate.config import (  # noqa: E402
    FULL_SIZES,
    PRESETS,
    AllConfig,
    ValidateConfig,
    VerifyConfig,
    apply_preset,
)
from replay_theory.validate.loop import forgetting_memory, run_verify  # noqa: E402

from .test_validate_family import TINY_FIXED_B, _hand_made_run  # noqa: E402


def test_preset_fills_defaults_and_keeps_given_options():
    defaults = AllConfig()
    fields = {f: getattr(defaults, f) for f in AllConfig.__dataclass_fields__}
    applied = apply_preset(fields, "gpu-fixed-b", defaults)
    config = AllConfig(**applied)
    assert (config.device, config.rollouts_per_step, config.family, config.seeds, config.batched) == (
        "cuda", 4096, "fixed-b", 16, True)
    assert config.micro_batch_size == 1024 and config.samples == 256 and config.budget_updates == 6
    given = apply_preset({**fields, "rollouts_per_step": 16384, "budget_updates": 3}, "gpu-fixed-b", defaults)
    assert (given["rollouts_per_step"], given["budget_updates"], given["seeds"]) == (16384, 3, 16)
    assert apply_preset(fields, None, defaults) == fields
    # b = B_noise / B on the tiny model (2383 per group of 8) is below the replay threshold at both preset batches
    for B in (PRESETS["gpu-fixed-b"]["rollouts_per_step"], 16384):
        assert 2383 / B < 0.753
    # the preset's and --full's problems can be drawn (n-train 5000 could not: the family holds 1721; issue 31's GPU
    # run of the preset stopped there)
    for n_train in (config.n_train, FULL_SIZES["n_train"]):
        train, test = ValidateConfig(n_train=n_train, n_test=config.n_test).problems()
        assert (len(train), len(test)) == (1657, 64)
    VerifyConfig(seeds=16, budget_updates=6, batched=True, family="fixed-b").check_sizes(4096, 8)
    VerifyConfig(seeds=16, budget_updates=3, batched=True, family="fixed-b").check_sizes(16384, 8)


def test_bad_preset_kappa_and_decode_are_one_line_before_any_work(error_line, tmp_path):
    out = tmp_path / "never"
    assert error_line("validate", "all", "--preset", "gpu", "--out", str(out)) == (
        "--preset must be one of gpu-fixed-b, got 'gpu'")
    assert error_line("validate", "all", "--kappa", "0", "--out", str(out)) == (
        "--kappa must be a finite number > 0, got 0.0")
    assert error_line("validate", "all", "--kappa", "nan", "--out", str(out)).startswith("--kappa must be a finite")
    assert error_line("validate", "calibrate-model", "--decode", "fast", "--out", str(out)) == (
        "--decode must be one of auto, eager, static, compiled, got 'fast'")
    for args, line in ((["--n-train", "1658"], "--n-train must be an integer in [8, 1657]"),
                       (["--n-test", "65", "--n-train", "1657"], "--n-train must be an integer in [8, 1656]"),
                       (["--n-test", "1714"], "--n-test must be an integer in [1, 1713]"),
                       (["--n-train", "10" * 20], "--n-train must be an integer in [8, 1657]")):
        assert error_line("validate", "all", *args, "--out", str(out)) == (
            f"{line} (--n-train + --n-test <= the 1721 distinct problems of the family), got {args[-1]}")
    if not __import__("torch").cuda.is_available():  # the preset asks for the GPU: refused on a CPU, nothing written
        assert error_line("validate", "all", "--preset", "gpu-fixed-b", "--out", str(out)).startswith(
            "CUDA requested but")
    assert not out.exists()


def test_kappa_comes_from_the_option_else_the_profile_else_nowhere(tmp_path):
    (tmp_path / "profile.json").write_text(json.dumps({"kind": "table", "staleness": [0, 1], "sigma_sq": [1.0, 1.0]}))
    none = forgetting_memory(tmp_path, None)
    assert none["kappa"] is None and "no memory record" in none["reason"] and "--kappa" in none["reason"]
    given = forgetting_memory(tmp_path, 0.02)
    assert (given["kappa"], given["optimizer"], given["beta1"], given["source"]) == (0.02, "adam", 0.9, "--kappa")
    record = {"kappa": 0.05, "kappa_interval": [0.04, 0.06], "level": 0.9, "method": "curvature-pairs",
              "optimizer": "adam", "beta1": 0.9, "pilot_batch": 64.0, "units": 32}
    (tmp_path / "profile.json").write_text(json.dumps({"kind": "table", "staleness": [0, 1], "sigma_sq": [1.0, 1.0],
                                                       "memory": record}))
    measured = forgetting_memory(tmp_path, None)
    assert measured["kappa"] == 0.05 and measured["source"] == "profile.json memory record"
    logged = []
    both = forgetting_memory(tmp_path, 0.02, log=logged.append)
    assert both["kappa"] == 0.02 and both["profile_memory"]["kappa"] == 0.05 and "0.05" in logged[0]


@pytest.mark.slow
def test_fixed_b_verify_places_the_forgetting_rule(tmp_path):
    """The hand-made tiny run (B = 16, K = 2, B_noise = 4) with --kappa: three rules placed; without: two, and the
    report says why the forgetting-aware rule made no prediction."""
    out = _hand_made_run(tmp_path / "run")
    kappa = 0.3
    report = run_verify(TINY_FIXED_B, out, VerifyConfig(seeds=2, budget_updates=2, family="fixed-b", kappa=kappa),
                        log=lambda *_: None)
    rules = {p["rule"]: p for p in report["predictions"]}
    assert list(rules) == ["noise-scale", "forgetting", "paper"]
    expected = forgetting_pick(4.0, 16, 2, 5.28, kappa, "adam", 0.9)
    forgetting = rules["forgetting"]
    assert forgetting["pick"] == expected and forgetting["input"]["source"] == "--kappa"
    names = [d["name"] for d in report["designs"]]
    assert forgetting["design"] in names
    placed = next(d for d in report["designs"] if d["name"] == forgetting["design"])
    assert (placed["rollouts_per_step"], placed["capacity"]) == (
        (expected["rollouts_per_step"], expected["capacity"]) if expected["regime"] == "replay" else (16, 16))
    f = forgetting["verdict"]["family"]
    assert 1 <= f["rank"] <= f["designs"] == len(names) and 0.0 <= f["probability_predicted_best"] <= 1.0
    assert forgetting["separation"]["seeds_needed"] is None or forgetting["separation"]["seeds_needed"] >= 2
    markdown = (out / "report-fixed-b.md").read_text()
    assert f"Forgetting-aware rule: kappa = {kappa:.4g} (--kappa" in markdown
    assert f"| forgetting | {forgetting['design']} | {f['rank']} of {f['designs']}" in markdown
    out2 = _hand_made_run(tmp_path / "run2")
    report2 = run_verify(TINY_FIXED_B, out2, VerifyConfig(seeds=2, budget_updates=2, family="fixed-b"),
                         log=lambda *_: None)
    assert [p["rule"] for p in report2["predictions"]] == ["noise-scale", "paper"]
    assert "no memory record" in report2["forgetting_input"]["reason"]
    assert "Forgetting-aware rule: no prediction (no kappa" in (out2 / "report-fixed-b.md").read_text()

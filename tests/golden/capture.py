"""Golden outputs: what a fixed list of commands prints, recorded once, so a restructuring can show that no printed
number changed (issue 33).

    python tests/golden/capture.py           # record every case into tests/golden/expected/ (refuses to overwrite)
    python tests/golden/capture.py --check   # run them again; print the first difference, exit 1 if any
    python tests/golden/capture.py --check --only optimal-paper --fast   # some cases; --fast skips the validator's

A case is a few steps run in one fresh temporary folder, in order: a `replay-theory` command, a `python -m` module or
a file written by hand. What is recorded is each step's command, its stdout and exit code, then the files the case
names (JSON without the keys that hold wall-clock timings, text as written, anything else as its SHA-256). The
validator's two tiny runs (`slow`: they train) print a timing mu and an App. E count mu, which change from run to run:
in their records those numbers are masked. Everything else must be equal bit for bit. Run it with the package you mean
to test importable as ``replay_theory`` (an editable install, or PYTHONPATH); `tests/integration/test_golden_outputs.py`
runs every case.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

EXPECTED = Path(__file__).resolve().parent / "expected"

# the noise log of docs/VERL.md: two steps of two-batch gradient norms with a curvature pair each
NOISE_LOG = "".join(json.dumps({"step": step, "grad_sq_small": small, "grad_sq_big": big, "batch_small": 128,
                                "batch_big": 256, "unit_size": 1, "curvature_num": num, "curvature_den": 1.0,
                                "curvature_lr": 0.0001, "curvature_beta1": 0.9}) + "\n"
                    for step, small, big, num in ((1, 9.0, 5.0, 1500), (2, 8.0, 4.5, 500)))
FLOOR = ["--mu", "5.28", "-B", "512", "--noise-scale", "2383", "--group-size", "8"]
TINY_LM = ["--n-train", "120", "--n-test", "16", "--sft-steps", "40", "--rollouts-per-step", "16", "--probe-steps",
           "10", "--samples", "8", "--max-new-tokens", "12", "--mu-window", "0.5", "--no-progress"]
SIMULATOR_PROBE = ["--steps", "30", "--seeds", "2", "--checkpoints", "2", "--samples", "64", "--staleness", "0,1,2,4",
                   "--max-gap", "4", "--noise-checkpoints", "2", "--noise-groups", "8"]


def cli(*args):
    return ("cli", list(args))


def module(name, *args):
    return ("module", [name, *args])


# name -> (steps, files to record, slow)
CASES: dict[str, tuple[list, list[str], bool]] = {
    "optimal-default": ([cli("optimal", "--mu", "5.28")], [], False),
    "optimal-floor-128": ([cli("optimal", *FLOOR, "--kappa", "0.05", "--latency-floor", "128")], [], False),
    "optimal-floor-64": ([cli("optimal", *FLOOR, "--kappa", "0.2", "--latency-floor", "64")], [], False),
    "optimal-noise-scale": ([cli("optimal", "--objective", "noise-scale", "--mu", "5.28", "-B", "256",
                                 "--noise-scale", "64")], [], False),
    "optimal-paper": ([cli("optimal", "--objective", "paper", "--mu", "5.28", "-R", "64")], [], False),
    "optimal-floor-128-json": ([cli("optimal", *FLOOR, "--kappa", "0.05", "--latency-floor", "128", "--json")], [],
                               False),
    "optimal-paper-json": ([cli("optimal", "--objective", "paper", "--mu", "5.28", "-R", "64", "--json")], [], False),
    "gamma": ([cli("gamma", "--workers", "6", "--trainers", "2", "--mu", "6.84")], [], False),
    "simulate-json": ([cli("simulate", "--steps", "40", "--seeds", "4", "--no-progress", "--json")], [], False),
    "simulate-token-mdp-async": ([cli("simulate", "--env", "token-mdp", "--pipeline", "async", "--steps", "30",
                                      "--seeds", "3", "--no-progress")], [], False),
    "calibrate-simulator": ([cli("calibrate-simulator", "--out", "profile.json", *SIMULATOR_PROBE)], ["profile.json"],
                            False),
    "diagnose-verl": ([module("replay_theory.experiments.example_log", "log.jsonl", "--shape", "verl"),
                       cli("diagnose", "log.jsonl", "--preset", "verl", "--no-progress"),
                       cli("diagnose", "log.jsonl", "--preset", "verl", "--no-progress", "--json")], [], False),
    "diagnose-trl": ([module("replay_theory.experiments.example_log", "log.jsonl", "--shape", "trl"),
                      cli("diagnose", "log.jsonl", "--preset", "trl", "--no-progress"),
                      cli("diagnose", "log.jsonl", "--preset", "trl", "--no-progress", "--json")], [], False),
    "diagnose-default-save": ([module("replay_theory.experiments.example_log", "log.csv"),
                               cli("diagnose", "log.csv", "--no-progress", "--save", "report.json")], ["report.json"],
                              False),
    "calibrate-from-log-verl": ([module("replay_theory.experiments.example_log", "diagnose.jsonl", "--shape", "verl"),
                                 ("write", ["noise_scale.jsonl", NOISE_LOG]),
                                 cli("calibrate", "--from-log", "diagnose.jsonl", "--preset", "verl", "--mu", "5.28",
                                     "--grad-norms", "noise_scale.jsonl", "--out", "profile.json"),
                                 cli("optimal", "--profile", "profile.json", "--mu", "5.28", "-B", "256",
                                     "--group-size", "8")], ["profile.json"], False),
    "theory-test-quick": ([cli("experiment", "theory-test", "--out", "tt", "--quick", "--setting",
                               "quadratic-noise10,bandit-grpo", "--seeds", "2", "-j", "1", "--no-progress")],
                          ["tt/options.json", "tt/summary.json", "tt/evidence.json", "tt/table.md"], False),
    "validate-tiny": ([cli("validate", "all", "--out", "run", *TINY_LM, "--group-size", "4", "--seeds", "2",
                           "--budget-updates", "3", "--group-replay", "true")],
                      ["run/", "run/calibration.json", "run/profile.json", "run/predicted.json", "run/report.json",
                       "run/report.md", "run/report.png"], True),
    "validate-fixed-b": ([cli("validate", "calibrate-model", "--out", "run", *TINY_LM, "--group-size", "2"),
                          cli("validate", "predict", "--out", "run"),
                          cli("validate", "verify", "--out", "run", "--seeds", "2", "--budget-updates", "2", "--family",
                              "fixed-b", "--kappa", "0.3", "--no-progress")],
                         ["run/", "run/calibration.json", "run/profile.json", "run/report-fixed-b.json",
                          "run/report-fixed-b.md", "run/report-fixed-b.png"], True),
}

# the JSON keys that hold wall-clock timings (left out of every record), and the validator's printed timing numbers
TIMING_KEYS = {"mu_timing", "mu_measured", "mu_count", "count_window", "seconds", "compile_seconds", "elapsed_s"}
TIMING_TEXT = [
    (re.compile(r"(timing mu = |time per completion\) = |time per completion\): )(nan|inf|[0-9.e+-]+)"), r"\1<timing>"),
    (re.compile(r"(window\) = |s window: )(nan|inf|[0-9.e+-]+)"), r"\1<timing>"),  # nan: no completion in the window
    (re.compile(r"(K_inference = |K_training = )\d+"), r"\1<timing>"),
]


def _without_timings(value):
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def _mask(text: str) -> str:
    for pattern, replacement in TIMING_TEXT:
        text = pattern.sub(replacement, text)
    return text


def _file_record(folder: Path, name: str, timed: bool) -> str:
    path = folder / name
    if name.endswith("/"):  # a folder: the names of everything in it
        return "\n".join(sorted(str(p.relative_to(path)) for p in path.rglob("*"))) + "\n"
    if not path.exists():
        return "(missing)\n"
    if path.suffix == ".json":
        saved = json.loads(path.read_text())
        return json.dumps(_without_timings(saved), indent=1) + "\n"
    if path.suffix in (".md", ".txt", ".jsonl", ".csv"):
        return _mask(path.read_text()) if timed else path.read_text()
    return f"sha256 {hashlib.sha256(path.read_bytes()).hexdigest()}\n"


def run_case(name: str) -> str:
    """Run case ``name`` in a fresh temporary folder; its record as one text."""
    steps, files, timed = CASES[name]  # the slow cases are the validator's: their timings are masked
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        parts = [_run_step(folder, kind, args, timed) for kind, args in steps]
        parts += [f"# file {file}\n{_file_record(folder, file, timed)}" for file in files]
        # some outputs name the absolute path of their input: the temporary folder differs from run to run
        return "".join(parts).replace(str(folder.resolve()), "<tmp>").replace(str(folder), "<tmp>")


def _run_step(folder: Path, kind: str, args: list[str], timed: bool) -> str:
    if kind == "write":
        (folder / args[0]).write_text(args[1])
        return f"# wrote {args[0]}\n"
    command = ["-m", "replay_theory", *args] if kind == "cli" else ["-m", *args]
    env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1"}
    done = subprocess.run([sys.executable, *command], cwd=folder, env=env, capture_output=True, text=True)
    shown = "replay-theory " + " ".join(args) if kind == "cli" else "python -m " + " ".join(args)
    return f"$ {shown}\n{_mask(done.stdout) if timed else done.stdout}# exit {done.returncode}\n"


def first_difference(expected: str, got: str) -> str | None:
    """The first line where ``got`` differs from ``expected``, with its number; None when they are equal."""
    if expected == got:
        return None
    old, new = expected.splitlines(), got.splitlines()
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            return f"line {i + 1}:\n  expected: {a}\n  got:      {b}"
    i = min(len(old), len(new))
    return f"line {i + 1}: expected {len(old)} lines, got {len(new)}" if len(old) != len(new) else "line endings differ"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="Compare with the recorded outputs instead of recording.")
    parser.add_argument("--only", nargs="+", choices=sorted(CASES), help="These cases only.")
    parser.add_argument("--fast", action="store_true", help="Skip the validator's tiny runs (they need torch).")
    args = parser.parse_args(argv)
    names = [n for n in (args.only or CASES) if not (args.fast and CASES[n][2])]
    failed = 0
    for name in names:
        path = EXPECTED / f"{name}.txt"
        if not args.check and path.exists():
            print(f"{name}: {path} exists; delete it to record again")
            continue
        got = run_case(name)
        if not args.check:
            EXPECTED.mkdir(exist_ok=True)
            path.write_text(got)
            print(f"{name}: recorded")
            continue
        difference = first_difference(path.read_text(), got) if path.exists() else "not recorded"
        print(f"{name}: {'identical' if difference is None else 'DIFFERS at ' + difference}")
        failed += difference is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

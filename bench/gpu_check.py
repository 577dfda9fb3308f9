"""The GPU path measured (issues 23, 31): one script, run once on a borrowed H100/H200, that records what the card does.

Paper: experience-replay (docs/REFERENCES.md), Sec. 2 and Table 1: mu = cost of generating one rollout / cost of
processing it in a gradient update, measured here on one GPU with the validator's loop as it runs on CUDA
(``validate/sampling.py``, ``validate/rl.py``).  Sections, numbered as in the report and run in the order 1, 2, 3,
7, 4, 6, 5 (5 compiles two 0.5B decoders, the least predictable step, so it takes what is left): 1 environment;
2 ``validate all --device cuda`` with its defaults; 3 batched vs sequential verify-style training; 4 mu of the
loop at the Qwen2.5-0.5B / -1.5B shapes (random weights; a new decode shape's compile timed apart, as ``RLResult``
leaves it out); 5 decode tokens/s against transformers' compiled ``generate``; 6 the bf16 sampler-vs-trainer
log-prob mismatch (control: fp32 against fp32); 7 the fixed-B verdict (``--preset gpu-fixed-b``, ``--kappa``).
Targets and what each section reports: docs/VALIDATION.md, 'GPU path'.

| code name        | paper symbol / meaning                                                     |
|------------------|----------------------------------------------------------------------------|
| ``R``            | completions per generation call and per update (B = R, on-policy)          |
| ``G``            | completions per prompt (GRPO group)                                        |
| ``L``            | completion length in tokens (fixed: no stop token can end a completion)    |
| ``mu``           | mu (Table 1): generation s per completion / update s per completion         |
| ``busy_fraction``| mean of nvidia-smi's utilization.gpu / 100 over 0.5 s samples               |
| ``b``            | B_noise / B (section 7; replay pays iff b < the threshold at mu)            |
| ``kappa``        | the optimizer's memory, what the forgetting-aware rule reads (section 7)    |

It runs once and blind: each section has its own try/except and time budget, the model sections (4, 5, 6) run in
worker subprocesses that keep each finished case, a global deadline turns later sections into "skipped: <why>",
and ``gpu_check.json`` is rewritten after every section (``gpu_check.md``, also on stdout, at the end).
This file is the driver; the model sections live in ``gpu_check_workers.py``, the markdown summary in
``gpu_check_report.py``, and what they share (section names, shapes, the plan) in ``gpu_check_plan.py``.
``--smoke`` runs every section on the CPU at tiny shapes (``tests/integration/test_gpu_check.py``).  Run (no
network; the checkout need not be installed)::

    p=$(mktemp -d) && ln -s "$PWD" $p/replay_theory && PYTHONPATH=$p python3 bench/gpu_check.py --out $OUT/gpu_check
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
# bench/ is not a package: its sibling modules import by name, as when this file runs as a script (also when a test
# loads it from its path)
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from gpu_check_plan import (  # noqa: E402
    QWEN25_05B,
    QWEN25_15B,
    RUN_ORDER,
    SECTIONS,
    SMOKE_SHAPE,
    WORKER_SECTIONS,
    Plan,
    one_line,
    write_json,
)
from gpu_check_report import markdown  # noqa: E402
from gpu_check_workers import micro_batch_for, worker_main  # noqa: E402,F401 - micro_batch_for: tests read it here

# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class CheckConfig:
    """The command line (``parse_args`` builds it; its --help texts say what these field docs say)."""

    out: Path
    """Directory for gpu_check.json, gpu_check.md and the logs (created; one that holds a result is refused)."""
    smoke: bool = False
    """Run every section on the CPU at tiny shapes (about a minute): the code paths, not the numbers."""
    deadline_s: float = 575.0
    """Global wall-clock deadline in seconds (575: one device command may run 10 minutes): later sections skip."""
    threads: int = 1
    """torch CPU threads of every process (validate's --threads default: the loop as validate runs it)."""
    rollouts: int = 0
    """R, completions per generation call and per update (0: 64 on the GPU, 8 with --smoke); a multiple of 8."""
    sections: tuple[str, ...] = SECTIONS
    """Sections to run (the others are recorded as skipped)."""
    kappa: float | None = None
    """Section 7: the optimizer's memory kappa for the forgetting-aware rule (validate --kappa); not given: the
    calibration's measured memory record if it has one, else that rule makes no prediction and the section says so."""
    budgets: tuple[tuple[str, float], ...] = ()
    """(section, seconds) pairs replacing the plan's caps (--budget mu=240,decode=240): the 2026-11-30 H200 run
    showed the compiled decode step's first call outlasting the default caps of sections 4-6."""


# Section 2 on the GPU: validate all with its defaults (issue 31's target is <= 2 minutes for them).
GPU_VALIDATE_ARGS = ("--no-progress",)
# The smoke run checks these options against --help only (validate all at small settings; minutes on a CPU).
SMOKE_VALIDATE_ARGS = ("--seeds", "2", "--budget-updates", "8", "--sft-steps", "100", "--samples", "64",
                       "--probe-steps", "10", "--n-train", "200", "--n-test", "32", "--mu-window", "1", "--no-progress")
GPU_VERDICT_ARGS = ("--preset", "gpu-fixed-b", "--no-progress")
GPU_VERDICT_LARGE = ("--rollouts-per-step", "16384", "--budget-updates", "3")
# smoke: the preset's fixed-b family on the CPU (a preset fills only options at their defaults, and cpu is one) at
# B = 32 (8 groups of 4: replay y = 8 still generates a whole group), 2 seeds batched, one on-policy update of budget
SMOKE_VERDICT_ARGS = ("--family", "fixed-b", "--batched", "true", "--rollouts-per-step", "32", "--group-size", "4",
                      "--seeds", "2", "--budget-updates", "1", "--sft-steps", "5", "--samples", "16",
                      "--probe-steps", "9", "--n-train", "64", "--n-test", "4", "--mu-window", "0", "--no-progress")


def make_plan(config: CheckConfig) -> Plan:
    """GPU sizes (about 7 minutes on one H100/H200 in all) or tiny CPU sizes for ``--smoke``."""
    if config.smoke:
        return Plan(out=str(config.out), smoke=True, device="cpu", threads=config.threads,
                    rollouts=config.rollouts or 8, group_size=4, shapes=(SMOKE_SHAPE,), lengths=(4, 8),
                    tokens_per_micro_batch=16, decode_tokens=8, mismatch_tokens=8, batched_seeds=2,
                    batched_steps=1, validate_args=SMOKE_VALIDATE_ARGS, verdict_args=SMOKE_VERDICT_ARGS,
                    verdict_large_args=(), compile_backend="eager",
                    kappa=config.kappa if config.kappa is not None else 0.1,
                    budgets={"environment": 30, "validate_all": 30, "batched_verify": 120, "verdict": 400, "mu": 90,
                             "logprob_mismatch": 60, "decode": 120},
                    min_start={"validate_all": 5, "batched_verify": 5, "verdict": 5, "mu": 5, "logprob_mismatch": 5,
                               "decode": 5},
                    min_case_s=1.0)
    # GPU: R = 64 as the verify family; lengths as issue 23 asks; micro-batches of <= 4096 completion tokens keep
    # the full-vocabulary fp32 log-softmax of one chunk near 4096 x 151936 x 4 B = 2.5 GB per copy. Budgets are caps
    # (run_check also leaves the later sections their minimum starts, 115 s after section 7): 15 + 125 + 60 + 300 + 70
    # + 20 + 100 > 575 s, so the verdict (target <= 360 s) gets what sections 1-3 leave, less those 115 s.
    return Plan(out=str(config.out), smoke=False, device="cuda", threads=config.threads,
                rollouts=config.rollouts or 64, group_size=8, shapes=(QWEN25_05B, QWEN25_15B), lengths=(16, 128, 512),
                tokens_per_micro_batch=4096, decode_tokens=128, mismatch_tokens=128, batched_seeds=16,
                batched_steps=3, validate_args=GPU_VALIDATE_ARGS, verdict_args=GPU_VERDICT_ARGS,
                verdict_large_args=GPU_VERDICT_LARGE, compile_backend="inductor", kappa=config.kappa,
                budgets={"environment": 15, "validate_all": 125, "batched_verify": 60, "verdict": 300, "mu": 70,
                         "logprob_mismatch": 20, "decode": 100},
                min_start={"validate_all": 60, "batched_verify": 30, "verdict": 90, "mu": 40, "logprob_mismatch": 15,
                           "decode": 60},
                min_case_s=10.0)


def with_budgets(plan: Plan, config: CheckConfig) -> Plan:
    """``plan`` with ``config.budgets``' caps in place of its own."""
    return dataclasses.replace(plan, budgets={**plan.budgets, **dict(config.budgets)})


def parse_budgets(text: str, deadline_s: float) -> tuple[tuple[str, float], ...] | str:
    """``"mu=240,decode=240"`` -> ((mu, 240.0), (decode, 240.0)); a one-line reason (str) where it is not that."""
    pairs = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        name, _, seconds = item.partition("=")
        try:
            value = float(seconds)
        except ValueError:
            value = math.nan
        if name.strip() not in SECTIONS or not 0 < value <= deadline_s:
            return (f"--budget must be SECTION=SECONDS pairs, each SECTION one of {', '.join(SECTIONS)} and SECONDS "
                    f"in (0, --deadline-s = {deadline_s:g}], got {text!r}")
        pairs.append((name.strip(), value))
    return tuple(pairs)


def parse_args(argv: list[str]) -> CheckConfig:
    """argparse over ``CheckConfig``; a bad value is one line on stderr naming the option, exit 2, before any work."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for gpu_check.json / .md and the logs")
    parser.add_argument("--smoke", action="store_true", help="every section on the CPU at tiny shapes (~1 min)")
    parser.add_argument("--deadline-s", type=float, default=CheckConfig.deadline_s,
                        help="global deadline in seconds (default 575); later sections skip")
    parser.add_argument("--threads", type=int, default=CheckConfig.threads, help="torch CPU threads (default 1)")
    parser.add_argument("--rollouts", type=int, default=0, help="R (0: 64 on the GPU, 8 with --smoke)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--kappa", type=float, default=None, help="section 7: the optimizer's memory kappa for the "
                        "forgetting-aware rule (not given: the calibration's measured one, else no prediction)")
    parser.add_argument("--budget", default="", help="SECTION=SECONDS[,...]: replace the plan's cap of these sections "
                        "(each in (0, --deadline-s])")
    args = parser.parse_args(argv)

    def fail(message: str) -> None:
        print(f"gpu_check: error: {message}", file=sys.stderr)
        raise SystemExit(2)

    if not 0 < args.deadline_s < math.inf:
        fail(f"--deadline-s must be a finite number of seconds > 0, got {args.deadline_s}")
    if args.threads < 1:
        fail(f"--threads must be an integer >= 1, got {args.threads}")
    if args.rollouts < 0 or args.rollouts % 8:
        fail(f"--rollouts must be 0 (default) or a positive multiple of 8, got {args.rollouts}")
    sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown or not sections:
        fail(f"--sections must name some of {', '.join(SECTIONS)}, got {args.sections!r}")
    if args.kappa is not None and not (math.isfinite(args.kappa) and args.kappa > 0):
        fail(f"--kappa must be a finite number > 0, got {args.kappa}")
    budgets = parse_budgets(args.budget, args.deadline_s)
    if isinstance(budgets, str):
        fail(budgets)
    if Path(args.out).exists() and not Path(args.out).is_dir():
        fail(f"--out must be a directory, got the file {args.out!r}")
    if (Path(args.out) / "gpu_check.json").exists():  # results are never overwritten
        fail(f"--out {args.out!r} already holds gpu_check.json; pass a new directory")
    return CheckConfig(out=Path(args.out), smoke=args.smoke, deadline_s=args.deadline_s, threads=args.threads,
                       rollouts=args.rollouts, sections=sections, kappa=args.kappa, budgets=budgets)


class Clock:
    """Wall time since start and seconds left to the global deadline; progress lines on stderr."""

    def __init__(self, deadline_s: float, start: float | None = None):
        self.start = time.time() if start is None else start
        self.deadline = self.start + deadline_s

    def left(self) -> float:
        return self.deadline - time.time()

    def log(self, message: str) -> None:
        print(f"[gpu_check {time.time() - self.start:6.1f} s, {self.left():6.1f} s to deadline] {message}",
              file=sys.stderr, flush=True)


class GpuMonitor:
    """Samples GPU utilisation (%) and memory used (MiB) every ``period`` s in a background thread.

    Source: ``nvidia-smi`` when it is on PATH, else ``torch.cuda.utilization()`` (needs pynvml) when it works, else
    "unavailable". utilization.gpu is the share of the last sample period in which a kernel ran, so its mean over
    a section is the share of the section's wall time the GPU was busy.
    """

    def __init__(self, period: float = 0.5):
        self.period = period
        self.util: list[float] = []
        self.memory: list[float] = []
        self.times: list[float] = []  # epoch seconds of each sample
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.source = self._pick_source()

    @staticmethod
    def _pick_source() -> str:
        if shutil.which("nvidia-smi"):
            return "nvidia-smi"
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.utilization()
                return "torch.cuda.utilization"
        except Exception:  # noqa: BLE001 - pynvml missing or no GPU: no utilisation source
            pass
        return "unavailable"

    def _sample(self) -> None:
        if self.source == "nvidia-smi":
            done = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                                   "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5)
            util, mem = (float(v) for v in done.stdout.strip().splitlines()[0].split(","))  # first GPU
        else:
            import torch

            util, mem = float(torch.cuda.utilization()), math.nan
        self.util.append(util)
        self.memory.append(mem)
        self.times.append(time.time())

    def _loop(self) -> None:
        next_at = time.time()
        while not self._stop.is_set():
            try:
                self._sample()
            except Exception:  # noqa: BLE001 - one failed sample must not end the section
                pass
            next_at += self.period
            self._stop.wait(max(0.0, next_at - time.time()))

    def __enter__(self) -> "GpuMonitor":
        if self.source != "unavailable":
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def busy_between(self, start: float, end: float) -> float | str:
        """Mean utilisation / 100 of the samples taken in [start, end] (epoch seconds): a clock inside a process
        (bench_validate_batched's ``window``) without its start-up and compile; "unavailable" without samples there."""
        inside = [u for u, t in zip(self.util, self.times) if start <= t <= end]
        return statistics.fmean(inside) / 100.0 if inside else "unavailable"

    def summary(self) -> dict:
        if self.source == "unavailable" or not self.util:
            return {"gpu_busy_fraction": "unavailable", "gpu_source": self.source, "gpu_samples": len(self.util)}
        memory = [m for m in self.memory if not math.isnan(m)]
        return {"gpu_busy_fraction": statistics.fmean(self.util) / 100.0, "gpu_util_max": max(self.util),
                "gpu_memory_used_max_mib": max(memory) if memory else None, "gpu_source": self.source,
                "gpu_samples": len(self.util)}


def run_process(cmd: list[str], timeout: float, log_path: Path, env: dict | None = None,
                echo: bool = False) -> tuple[int | None, list[str], float]:
    """Run ``cmd`` in its own process group with stdout+stderr to ``log_path`` (and to stderr with ``echo``).

    Returns (exit code or None when killed at ``timeout``, the output lines, wall seconds). A timeout kills the
    whole group this call started (a worker's own children included), by its process-group id.
    """
    lines: list[str] = []
    start = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True, bufsize=1)

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                log.write(line)
                log.flush()
                if echo:
                    print(f"    {line.rstrip()}", file=sys.stderr, flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code: int | None = proc.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            code = None
        try:  # the group this call created (start_new_session above): on a timeout, or helpers the child left
            os.killpg(proc.pid, signal.SIGKILL)  # behind (compile workers) that would hold the output pipe open
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        reader.join(timeout=10)
    return code, lines, time.time() - start


def child_env(threads: int) -> dict:
    """The environment of every child: same PYTHONPATH (the package need not be installed), explicit threads."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), COLUMNS="200",
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    return env


# --------------------------------------------------------------------------- sections run by the parent


def section_environment(plan: Plan, clock: Clock, budget: float) -> dict:
    """Versions and the device; the GPU fields are None on a CPU-only machine (smoke)."""
    import platform

    import torch
    import transformers

    import replay_theory

    result: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(), "cpu_count": os.cpu_count(),
        "replay_theory_path": str(Path(replay_theory.__file__).resolve().parent), "device": plan.device,
        "device_name": None, "total_memory_gib": None, "capability": None, "driver": None,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "nvidia_smi": shutil.which("nvidia-smi") is not None,
        "c_compiler": shutil.which("cc") or shutil.which("gcc"),  # Triton builds its launcher with it (section 5)
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        result.update(device_name=props.name, total_memory_gib=props.total_memory / 2**30,
                      capability=f"{props.major}.{props.minor}")
    if result["nvidia_smi"]:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10)
        result["driver"] = done.stdout.strip().splitlines()[0] if done.stdout.strip() else None
    if plan.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device visible (torch.cuda.is_available() is False); use --smoke on a CPU")
    return result


def _help_options(plan: Plan) -> set[str]:
    """The option names ``validate all --help`` lists (so a renamed option fails here, not after minutes)."""
    done = subprocess.run([sys.executable, "-m", "replay_theory", "validate", "all", "--help"], capture_output=True,
                          text=True, timeout=120, env=child_env(plan.threads))
    if done.returncode != 0:
        raise RuntimeError(f"validate all --help failed: {one_line((done.stderr or done.stdout).strip()[-300:])}")
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", done.stdout))


# The summary lines validate all prints (the per-seed lines are in the report it writes, copied below).
VALIDATE_LINE = re.compile(r"^(warm start|mu \(|predicted \(|what it is|what to do|measured best|note:|constraint)")


def section_validate_all(plan: Plan, clock: Clock, budget: float) -> dict:
    """``python3 -m replay_theory validate all --device cuda`` at small settings, timed, with the GPU sampled."""
    ends_at = time.time() + budget
    options = _help_options(plan)
    wanted = [a for a in plan.validate_args if a.startswith("--")] + ["--out", "--device"]
    missing = [a for a in wanted if a not in options]
    if missing:
        raise RuntimeError(f"validate all has no option {', '.join(missing)} (checked against --help)")
    if plan.smoke:
        return {"status": "skipped: smoke (validate all needs minutes on a CPU; its options "
                          f"{' '.join(wanted)} were checked against --help: all present)"}
    run_dir = Path(tempfile.mkdtemp(prefix="gpu_check_validate_"))  # checkpoints stay out of --out
    cmd = [sys.executable, "-m", "replay_theory", "validate", "all", "--out", str(run_dir / "run"),
           *plan.validate_args, "--device", plan.device]
    clock.log(f"validate all: {' '.join(cmd[2:])} (up to {ends_at - time.time():.0f} s)")
    with GpuMonitor() as monitor:
        code, lines, wall = run_process(cmd, ends_at - time.time(), Path(plan.out) / "validate_all.log",
                                        child_env(plan.threads), echo=True)
    result: dict[str, Any] = {"command": " ".join(["python3", *cmd[1:]]), "wall_s": wall, "exit_code": code,
                              "lines": [ln for ln in lines if VALIDATE_LINE.search(ln)][:30], **monitor.summary()}
    reports = Path(plan.out) / "validate_all_reports"
    for path in sorted((run_dir / "run").glob("*")):  # the reports only: the checkpoints are tens of MB
        if path.is_file() and path.suffix in (".md", ".json") and path.stat().st_size < 2**20:
            reports.mkdir(exist_ok=True)
            shutil.copy(path, reports / path.name)
    report = reports / "report.md"
    if report.is_file():  # the verdict as verify wrote it: the measured best and the prediction's rank
        result["verdict_lines"] = [ln for ln in report.read_text().splitlines()
                                   if ln.startswith(("Measured best", "Predicted design", "- among"))]
    shutil.rmtree(run_dir, ignore_errors=True)
    if code is None:
        result["status"] = f"error: killed at its {budget:.0f} s budget (log: validate_all.log)"
    elif code != 0:
        last = next((ln for ln in reversed(lines) if ln.strip()), "no output")
        result["status"] = f"error: exit code {code}: {one_line(last)}"
    return result


def _load_bench_batched():
    """``bench/bench_validate_batched.py`` as a module (bench/ is not a package)."""
    path = HERE / "bench_validate_batched.py"
    spec = importlib.util.spec_from_file_location("bench_validate_batched", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no Python module loader for {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def section_batched_verify(plan: Plan, clock: Clock, budget: float) -> dict:
    """Both modes of ``bench_validate_batched`` on ``plan.device``, each in a fresh process, batched first."""
    bench = _load_bench_batched()
    ends_at = time.time() + budget
    result: dict[str, Any] = {"seeds": plan.batched_seeds, "steps": plan.batched_steps, "designs": 2,
                              "device": plan.device, "threads": plan.threads}
    runs: dict[str, dict] = {}
    for mode in ("batched", "sequential"):
        left = ends_at - time.time()
        clock.log(f"batched verify: {mode}, {plan.batched_seeds} seeds x {plan.batched_steps} steps x 2 designs "
                  f"(up to {left:.0f} s)")
        with GpuMonitor() as monitor:
            try:
                run = bench.run(mode, plan.batched_seeds, plan.batched_steps, plan.threads, plan.device,
                                timeout=max(left, 1.0))
            except subprocess.TimeoutExpired:
                result["status"] = f"error: the {mode} run passed the section's {budget:.0f} s budget"
                break
            except SystemExit as exit_:  # bench.run reports a failed child as SystemExit(message)
                result["status"] = f"error: {one_line(str(exit_))}"
                break
        run.update(monitor.summary())
        window = run.pop("window", None)
        if window is not None:  # the mode's own clock, without its start-up and the compile before it
            run["gpu_busy_fraction_in_clock"] = monitor.busy_between(*window)
        held_out = run.pop("held_out")
        run["held_out_mean_reward"] = [h.get("mean_reward") for h in held_out]
        runs[mode] = {**run, "_held_out": held_out}
        clock.log(f"batched verify: {mode} {run['seconds']:.1f} s")
    if len(runs) == 2:
        seq, bat = runs["sequential"], runs["batched"]
        result["ratio_sequential_over_batched"] = seq["seconds"] / bat["seconds"]
        result["held_out_equal"] = seq["_held_out"] == bat["_held_out"]
        result["held_out_max_abs_diff"] = bench.held_out_max_abs_diff(seq["_held_out"], bat["_held_out"])
    result["runs"] = {mode: {k: v for k, v in run.items() if k != "_held_out"} for mode, run in runs.items()}
    return result


def _rule_summary(prediction: dict) -> dict:
    """One rule of a ``report-fixed-b.json``: its pick (b, kappa) and its placement among the designs (rank, P(best),
    regret, strongest rival, seeds for 2 se)."""
    pick, given = prediction.get("pick"), prediction.get("input") or {}
    chosen = pick or {}
    family = (prediction.get("verdict") or {}).get("family") or {}
    sep = prediction.get("separation") or {}
    return {"rule": prediction["rule"], "design": prediction.get("design"), "regime": (pick or given).get("regime"),
            "b": None if pick is None else pick.get("b"), "threshold_b": chosen.get("threshold_b"),
            "kappa": chosen.get("kappa"), "kappa_source": given.get("source"),
            "rank": family.get("rank"), "designs": family.get("designs"), "rank_ci": family.get("rank_ci"),
            "p_best": family.get("probability_predicted_best"), "regret": family.get("regret"),
            "regret_ci": family.get("regret_ci"), "rival": sep.get("design"),
            "difference": sep.get("difference"), "se": sep.get("se"), "seeds_for_2se": sep.get("seeds_needed"),
            "first_or_within_one_se": (prediction.get("criterion") or {}).get("within_one_se")}


def verdict_summary(report: dict) -> dict:
    """What section 7 reports of a ``report-fixed-b.json``: the batch, b, each rule's pick and its placement
    (``_rule_summary``), the designs' rewards, and why a rule made no pick."""
    from replay_theory.core.designs import in_design_names

    sizes = ("rollouts_per_step", "capacity", "batch_size")
    rows = [{"name": d["name"], **{k: d[k] for k in sizes}, "steps": d.get("steps"),
             "reward_mean": d.get("final_reward_mean"), "reward_sd": d.get("final_reward_std")}
            for d in map(in_design_names, report.get("designs", []))]  # rows saved before say N, B, R
    predictions = report.get("predictions") or []
    rules = [_rule_summary(p) for p in predictions]
    noise = next((p for p in predictions if p["rule"] == "noise-scale"), {}).get("input") or {}
    budget = report.get("budget", {})
    return {"batch_size": report.get("config", {}).get("rollouts_per_step"), "seeds": budget.get("seeds"),
            "budget_updates": budget.get("updates"), "batched": budget.get("batched"), "mu_priced": report.get("mu"),
            "mu_measured": report.get("mu_measured"), "b_noise": noise.get("b_noise"),
            "b_noise_interval": noise.get("b_noise_interval"),
            "measured_best": (report.get("measured_best") or {}).get("name"), "rules": rules, "designs": rows,
            "forgetting_note": None if any(r["rule"] == "forgetting" for r in rules) else
            (report.get("forgetting_input") or {}).get("reason"), "verify_seconds": report.get("seconds")}


def _verdict_cases(plan: Plan) -> list[tuple[str, list[str]]]:
    """(label, arguments) of section 7's cases, their options checked against ``validate all --help`` first."""
    options = _help_options(plan)
    wanted = sorted({a for a in plan.verdict_args + plan.verdict_large_args if a.startswith("--")} | {"--out",
                                                                                                       "--kappa"})
    missing = [a for a in wanted if a not in options]
    if missing:
        raise RuntimeError(f"validate all has no option {', '.join(missing)} (checked against --help)")
    kappa = [] if plan.kappa is None else ["--kappa", repr(plan.kappa)]
    cases = [("preset", [*plan.verdict_args, *kappa])]
    if plan.verdict_large_args:
        cases.append(("preset, " + " ".join(plan.verdict_large_args),
                      [*plan.verdict_args, *plan.verdict_large_args, *kappa]))
    return cases


def _keep_verdict_reports(run: Path, reports: Path) -> dict:
    """Copy the run's reports (each under 4 MiB) to ``reports``; what the case records of them (``verdict_summary``
    of report-fixed-b.json, the calibration's seconds)."""
    for name in ("report-fixed-b.json", "report-fixed-b.md", "calibration_summary.json", "predicted.json",
                 "profile.json", "calibration.json"):
        path = run / name
        if path.is_file() and path.stat().st_size < 2**22:
            reports.mkdir(exist_ok=True)
            shutil.copy(path, reports / name)
    found: dict[str, Any] = {}
    if (run / "report-fixed-b.json").is_file():
        found.update(verdict_summary(json.loads((run / "report-fixed-b.json").read_text())))
    if (run / "calibration_summary.json").is_file():
        found["calibration_seconds"] = json.loads((run / "calibration_summary.json").read_text()).get("seconds")
    return found


def _process_status(code: int | None, lines: list[str], killed: str) -> str:
    """ok, ``killed`` (no exit code: run_process killed it), or the exit code with the last line printed."""
    if code is None:
        return killed
    if code != 0:
        last = next((ln for ln in reversed(lines) if ln.strip()), "no output")
        return f"error: exit code {code}: {one_line(last)}"
    return "ok"


def _run_verdict_case(plan: Plan, clock: Clock, index: int, label: str, args: list[str], left: float,
                      budget: float) -> dict:
    """One ``validate all`` case in a subprocess with the GPU sampled; its reports kept under the output folder."""
    case: dict[str, Any] = {"label": label}
    run_dir = Path(tempfile.mkdtemp(prefix="gpu_check_verdict_"))
    cmd = [sys.executable, "-m", "replay_theory", "validate", "all", "--out", str(run_dir / "run"), *args]
    clock.log(f"verdict: {' '.join(cmd[2:])} (up to {left:.0f} s)")
    with GpuMonitor() as monitor:
        code, lines, wall = run_process(cmd, left, Path(plan.out) / f"verdict_{index}.log",
                                        child_env(plan.threads), echo=True)
    case.update(command=" ".join(["python3", *cmd[1:]]), wall_s=wall, exit_code=code, **monitor.summary())
    case.update(_keep_verdict_reports(run_dir / "run", Path(plan.out) / f"verdict_reports_{index}"))
    shutil.rmtree(run_dir, ignore_errors=True)
    case["status"] = _process_status(code, lines, f"error: killed at the section's {budget:.0f} s budget "
                                                  f"(log: verdict_{index}.log)")
    return case


def section_verdict(plan: Plan, clock: Clock, budget: float) -> dict:
    """``validate all --preset gpu-fixed-b`` (section 7): each case a subprocess with the GPU sampled, its
    report-fixed-b.json summarised (``verdict_summary``) and copied; the larger batch only when 3x the first case's
    wall is left."""
    ends_at = time.time() + budget
    cases = _verdict_cases(plan)
    result: dict[str, Any] = {"kappa_given": plan.kappa, "cases": []}
    first_wall = None
    for index, (label, args) in enumerate(cases):
        left = ends_at - time.time()
        if first_wall is not None and left < 3 * first_wall:
            result["cases"].append({"label": label, "status": f"skipped: {left:.0f} s left, under 3x the first "
                                                              f"case's {first_wall:.0f} s (the batch is 4x larger)"})
            continue
        case = _run_verdict_case(plan, clock, index, label, args, left, budget)
        first_wall = case["wall_s"] if first_wall is None else first_wall
        result["cases"].append(case)
    failed = [c for c in result["cases"] if c["status"].startswith("error")]
    if failed:
        result["status"] = failed[0]["status"]
    return result


def section_worker(name: str) -> Callable[[Plan, Clock, float], dict]:
    """A section run by ``gpu_check.py --worker NAME`` in a subprocess (a CUDA crash or a hung compile cannot take
    the rest down); its finished cases survive a kill because the worker rewrites its result file after each."""

    def run(plan: Plan, clock: Clock, budget: float) -> dict:
        out = Path(plan.out)
        plan_path, result_path = out / "plan.json", out / f"{name}.worker.json"
        write_json(plan_path, dataclasses.asdict(plan))
        result_path.unlink(missing_ok=True)
        grace = 3.0 if plan.smoke else 8.0  # the worker's own deadline comes first; the kill is the backstop
        worker_deadline = time.time() + budget - grace
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--plan", str(plan_path),
               "--result", str(result_path), "--deadline-at", f"{worker_deadline:.3f}"]
        with GpuMonitor() as monitor:
            code, lines, wall = run_process(cmd, budget, out / f"{name}.log", child_env(plan.threads), echo=True)
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError):
            result = {}
        result.update(monitor.summary())
        result["worker_wall_s"] = wall
        last = next((ln for ln in reversed(lines) if ln.strip()), "no output")
        if code is None:
            done = sum(1 for c in result.get("cases", []) if c.get("status") == "ok")
            result["status"] = f"error: worker killed at its {budget:.0f} s budget ({done} cases finished)"
        elif code != 0:  # a crash below Python (CUDA, out of host memory): its last line says what
            result["status"] = f"error: worker exit code {code}: {one_line(last)}"
        elif "status" not in result:
            result["status"] = f"error: the worker wrote no result: {one_line(last)}"
        return result

    return run


SECTION_FUNCTIONS: dict[str, Callable[[Plan, Clock, float], dict]] = {
    "environment": section_environment,
    "validate_all": section_validate_all,
    "batched_verify": section_batched_verify,
    "verdict": section_verdict,
    **{name: section_worker(name) for name in WORKER_SECTIONS},
}



# --------------------------------------------------------------------------- main


def run_check(config: CheckConfig) -> dict:
    """Every section under the global deadline; gpu_check.json after each, gpu_check.md at the end."""
    clock = Clock(config.deadline_s)
    plan = with_budgets(make_plan(config), config)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(plan.threads)
    data: dict[str, Any] = {"smoke": plan.smoke, "device": plan.device, "deadline_s": config.deadline_s,
                            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "plan": dataclasses.asdict(plan),
                            "sections": {}}
    json_path = out / "gpu_check.json"
    for index, name in enumerate(RUN_ORDER):
        left = clock.left()
        if name not in config.sections:
            record: dict[str, Any] = {"status": "skipped: not in --sections"}
        elif left < plan.min_start.get(name, 0.0):
            record = {"status": f"skipped: deadline ({left:.0f} s left, the section needs "
                                f"{plan.min_start[name]:.0f} s to start)"}
        else:
            later = [n for n in RUN_ORDER[index + 1:] if n in config.sections]
            reserve = sum(plan.min_start.get(n, 0.0) for n in later)  # the later sections can still start
            budget = min(plan.budgets.get(name, left), max(left - reserve, plan.min_start.get(name, 0.0)), left)
            clock.log(f"section {index + 1}/{len(RUN_ORDER)} {name}: budget {budget:.0f} s, done by "
                      f"{time.time() - clock.start + budget:.0f} s at the latest")
            start = time.time()
            try:
                record = SECTION_FUNCTIONS[name](plan, clock, budget)
                record.setdefault("status", "ok")
            except Exception as err:  # noqa: BLE001 - one section's failure is recorded; the rest still run
                record = {"status": f"error: {one_line(err)}"}
            record["seconds"] = time.time() - start
            record["budget_s"] = budget
        clock.log(f"{name}: {record['status']}")
        data["sections"][name] = record
        data["wall_s"] = time.time() - clock.start
        write_json(json_path, data)
    data["wall_s"] = time.time() - clock.start
    write_json(json_path, data)
    summary = markdown(data)
    (out / "gpu_check.md").write_text(summary)
    print(summary)
    return data


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker_main(argv[1:])
    run_check(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())

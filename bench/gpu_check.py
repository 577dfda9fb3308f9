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
``--smoke`` runs every section on the CPU at tiny shapes (``tests/integration/test_gpu_check.py``).  Run (no
network; the checkout need not be installed)::

    p=$(mktemp -d) && ln -s "$PWD" $p/replay_theory && PYTHONPATH=$p python3 bench/gpu_check.py --out $OUT/gpu_check
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
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
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

HERE = Path(__file__).resolve().parent

# Section names in report order, and the order they run in (5 compiles: last, it takes what is left).
SECTIONS = ("environment", "validate_all", "batched_verify", "mu", "decode", "logprob_mismatch", "verdict")
RUN_ORDER = ("environment", "validate_all", "batched_verify", "verdict", "mu", "logprob_mismatch", "decode")
TITLES = {
    "environment": "1. Environment",
    "validate_all": "2. validate all --device cuda (defaults), end to end",
    "batched_verify": "3. Batched vs sequential verify-style training",
    "mu": "4. mu of the validator's loop at real shapes (random weights)",
    "decode": "5. Decode speed: the validator's loop against transformers' compiled generate",
    "logprob_mismatch": "6. bf16 sampler-vs-trainer log-prob mismatch",
    "verdict": "7. The fixed-B verdict where replay should win (validate all --preset gpu-fixed-b)",
}
WORKER_SECTIONS = ("mu", "decode", "logprob_mismatch")  # sections that run in a worker subprocess


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Shape:
    """A Qwen2 architecture: what ``transformers.Qwen2Config`` needs for timing (weights are random)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int


QWEN25_05B = Shape("Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151936)  # config.json of Qwen/Qwen2.5-0.5B
QWEN25_15B = Shape("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936)  # config.json of Qwen/Qwen2.5-1.5B
SMOKE_SHAPE = Shape("smoke-64", 64, 2, 4, 2, 128, 1000)


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


@dataclass(frozen=True)
class Plan:
    """Everything a section needs, derived from the config (GPU or smoke sizes); sent to the workers as JSON."""

    out: str
    smoke: bool
    device: str
    threads: int
    rollouts: int  # R
    group_size: int  # G
    shapes: tuple[Shape, ...]  # section 4: each shape at each length
    lengths: tuple[int, ...]  # section 4: completion lengths L
    tokens_per_micro_batch: int  # section 4: update chunk = max(1, this // L) completions (<= R)
    decode_tokens: int  # section 5: L
    mismatch_tokens: int  # section 6: L
    batched_seeds: int  # section 3
    batched_steps: int  # section 3
    validate_args: tuple[str, ...]  # section 2: arguments after `validate all --out DIR`
    verdict_args: tuple[str, ...]  # section 7: arguments after `validate all --out DIR` (the preset and its sizes)
    verdict_large_args: tuple[str, ...]  # section 7's second case (B = 16384 on the GPU), appended to verdict_args
    compile_backend: str  # torch.compile backend of the validator's decoder in sections 4-6 (smoke: eager)
    kappa: float | None = None  # section 7: --kappa (None: not given)
    budgets: dict[str, float] = field(default_factory=dict)  # section -> at most this many seconds
    min_start: dict[str, float] = field(default_factory=dict)  # section -> skip when fewer seconds are left
    min_case_s: float = 10.0  # a worker starts no case with fewer seconds left


# Section 2 on the GPU: validate all with its defaults (issue 31's target is <= 2 minutes for them).
GPU_VALIDATE_ARGS = ("--no-progress",)
# The smoke run checks these options against --help only (validate all at small settings; minutes on a CPU).
SMOKE_VALIDATE_ARGS = ("--seeds", "2", "--budget-updates", "8", "--sft-steps", "100", "--samples", "64",
                       "--probe-steps", "10", "--n-train", "200", "--n-test", "32", "--mu-window", "1", "--no-progress")
GPU_VERDICT_ARGS = ("--preset", "gpu-fixed-b", "--no-progress")
GPU_VERDICT_LARGE = ("--rollouts-per-step", "16384", "--budget-updates", "3")
# smoke: the preset's fixed-b family on the CPU (a preset fills only options at their defaults, and cpu is one) at
# B = 64 (8 groups of 8), 2 seeds batched, one on-policy update of budget
SMOKE_VERDICT_ARGS = ("--family", "fixed-b", "--batched", "true", "--rollouts-per-step", "64", "--seeds", "2",
                      "--budget-updates", "1", "--sft-steps", "5", "--samples", "16", "--probe-steps", "9",
                      "--n-train", "64", "--n-test", "4", "--mu-window", "0", "--no-progress")


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


def parse_args(argv: list[str]) -> CheckConfig:
    """argparse over ``CheckConfig``; a bad value is one line on stderr naming the option, exit 2, before any work."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for gpu_check.json / .md and the logs")
    parser.add_argument("--smoke", action="store_true", help="every section on the CPU at tiny shapes (~1 min)")
    parser.add_argument("--deadline-s", type=float, default=CheckConfig.deadline_s,
                        help="global deadline in seconds (default 450 = 7.5 min); later sections skip")
    parser.add_argument("--threads", type=int, default=CheckConfig.threads, help="torch CPU threads (default 1)")
    parser.add_argument("--rollouts", type=int, default=0, help="R (0: 64 on the GPU, 8 with --smoke)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--kappa", type=float, default=None, help="section 7: the optimizer's memory kappa for the "
                        "forgetting-aware rule (not given: the calibration's measured one, else no prediction)")
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
    if Path(args.out).exists() and not Path(args.out).is_dir():
        fail(f"--out must be a directory, got the file {args.out!r}")
    if (Path(args.out) / "gpu_check.json").exists():  # results are never overwritten
        fail(f"--out {args.out!r} already holds gpu_check.json; pass a new directory")
    return CheckConfig(out=Path(args.out), smoke=args.smoke, deadline_s=args.deadline_s, threads=args.threads,
                       rollouts=args.rollouts, sections=sections, kappa=args.kappa)


# --------------------------------------------------------------------------- small helpers


def one_line(err: BaseException | str, limit: int = 300) -> str:
    """An exception as one line: its type and message, whitespace collapsed, cut at ``limit`` characters."""
    text = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def write_json(path: Path, data: Any) -> None:
    """Atomic: a reader (or a kill mid-write) never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


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


# --------------------------------------------------------------------------- workers (subprocesses)


def _sync(device) -> None:
    """Wait for queued CUDA work, so a timer around it measures the work and not its launch."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _peak_gib(device) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.device(device).type == "cuda" else None


def _reset_peak(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _free(device) -> None:
    import torch

    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _full_vocab_tokenizer(alphabet: str, vocab_size: int):
    """Countdown's character tokenizer for the prompts, with a model vocabulary of ``vocab_size`` ids.

    A random-weight model samples any of the ``vocab_size`` ids; decoding folds an id past the alphabet onto it
    (the texts, and so the rewards, are noise either way: only the shapes and the timings matter here).
    """
    import torch

    from replay_theory.validate.tokenizer import CharTokenizer

    class FullVocabTokenizer(CharTokenizer):
        def __init__(self):
            super().__init__(alphabet)
            self.num_special = super().vocab_size - len(alphabet)
            if vocab_size < super().vocab_size:
                raise ValueError(f"vocab_size {vocab_size} is below the alphabet's {super().vocab_size} ids")
            self._vocab = vocab_size

        @property
        def vocab_size(self) -> int:
            return self._vocab

        def decode(self, ids: Sequence[int] | torch.Tensor, skip_special: bool = True) -> str:
            values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
            n, k = len(self.alphabet), self.num_special
            return super().decode([i if i < k else k + (i - k) % n for i in values], skip_special)

    return FullVocabTokenizer()


def build_policy(shape: Shape, device: str, *, dtype: str | None = None, compute_dtype: str | None = None,
                 seed: int = 0):
    """A ``validate.policy.Policy`` around a random-weight Qwen2 of ``shape`` that never stops early.

    ``stop_token_ids=(-1,)``: no sampled id is -1, so every completion runs to max_new_tokens (fixed length).
    Precision as ``ModelConfig``: ``dtype`` None = fp32 master weights, ``compute_dtype`` None = bf16 autocast on
    CUDA. On the CPU (smoke) ``Policy.autocast`` is a no-op by design; a subclass turns CPU bf16 autocast on when a
    compute dtype below the weights' is asked, so the smoke run goes through the same bf16 arithmetic paths.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from replay_theory.validate import countdown
    from replay_theory.validate.policy import ModelConfig, Policy, resolve_compute_dtype, resolve_dtype

    tokenizer = _full_vocab_tokenizer(countdown.ALPHABET, shape.vocab_size)
    hf_config = Qwen2Config(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
        intermediate_size=shape.intermediate_size, max_position_embeddings=4096, tie_word_embeddings=True,
        use_sliding_window=False, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id)
    config = ModelConfig(source="tiny", hidden_size=shape.hidden_size, num_layers=shape.num_layers,
                         num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads,
                         intermediate_size=shape.intermediate_size, max_position_embeddings=4096, device=device,
                         dtype=dtype, compute_dtype=compute_dtype, seed=seed)
    torch_device = torch.device(device)
    with torch.random.fork_rng(devices=[torch_device] if torch_device.type == "cuda" else []):
        torch.manual_seed(seed)  # random weights, reproducible, without touching anyone's global stream
        try:
            with torch_device:  # initialise on the GPU: a 1.5B model's init on the CPU takes tens of seconds
                model = Qwen2ForCausalLM(hf_config)
        except Exception:  # noqa: BLE001 - some transformers versions initialise on the CPU only
            # transformers' to() is @wraps(torch.nn.Module.to): its stub is the unbound function, which wants self
            model = Qwen2ForCausalLM(hf_config).to(torch_device)  # pyright: ignore[reportArgumentType]
    model = model.to(dtype=resolve_dtype(config)).eval()  # pyright: ignore[reportCallIssue]  - to()'s stub, above

    cls = Policy
    if torch_device.type == "cpu":

        @dataclasses.dataclass
        class CpuAutocastPolicy(Policy):
            def autocast(self):
                compute = resolve_compute_dtype(self.config)
                enabled = compute != next(self.model.parameters()).dtype
                return torch.autocast(device_type="cpu", dtype=compute, enabled=enabled)

        cls = CpuAutocastPolicy
    return cls(model=model, tokenizer=tokenizer, device=torch_device, config=config, stop_token_ids=(-1,))


def _problems(plan: Plan):
    from replay_theory.validate import countdown

    train, _ = countdown.make_splits(max(plan.rollouts, 64), 1, seed=0)
    return train


def decode_options(plan: Plan):
    """How sections 4-6 decode: what validate runs on CUDA (``default_decode("cuda")``: static cache, compiled step,
    all-finished read every 8 tokens, the exponential-race draw), with the plan's compile backend (smoke: eager)."""
    from replay_theory.validate.sampling import CUDA_CHECK_EVERY, DecodeOptions

    return DecodeOptions(static_cache=True, compile=True, check_every=CUDA_CHECK_EVERY, race=True,
                         compile_backend=plan.compile_backend)


def _timed_sampler(plan: Plan):
    """``HFSampler`` decoding with ``decode_options(plan)`` that also times its ``generate`` calls (the sampling-only
    part of the generation side, less the compiling of new shapes, which ``compile_s`` holds)."""
    from replay_theory.validate import sampling
    from replay_theory.validate.engines import HFSampler

    options = decode_options(plan)

    class TimedSampler(HFSampler):
        seconds = 0.0
        compile_s = 0.0

        def generate(self, policy, prompts, num_samples, max_new_tokens, temperature, generator, *,
                     prompt_width=None):
            _sync(plan.device)
            start, compiled = time.perf_counter(), sampling.compile_seconds()
            rollouts = sampling.generate(policy, prompts, num_samples, max_new_tokens, temperature, generator,
                                         prompt_width=prompt_width, decode=options)
            _sync(plan.device)
            compiling = sampling.compile_seconds() - compiled
            self.compile_s += compiling
            self.seconds += time.perf_counter() - start - compiling
            return rollouts

    return TimedSampler()


def micro_batch_for(plan: Plan, length: int) -> int:
    """Completions per forward/backward chunk of the update: <= tokens_per_micro_batch completion tokens, 0 (the
    whole batch) when R of them fit."""
    chunk = max(1, plan.tokens_per_micro_batch // length)
    return 0 if chunk >= plan.rollouts else chunk


def worker_mu(plan: Plan, deadline: float, emit: Callable[[dict], None]) -> dict:
    """Section 4: per shape and length, one generation step and one update step of the validator's own code."""
    import numpy as np
    import torch

    from replay_theory.validate import sampling
    from replay_theory.validate.rl import RLConfig, generate_batch, make_generator, update_step

    problems = _problems(plan)
    R, G = plan.rollouts, plan.group_size
    index = np.arange(R // G)  # R / G prompts x G samples
    result: dict[str, Any] = {"rollouts": R, "group_size": G, "precision": "fp32 weights, bf16 autocast on CUDA "
                              "(validate's default; the decoder a bf16 copy); fp32 on the CPU",
                              "loop": f"{decode_options(plan)}; generators on the device; torch losses", "cases": []}

    def rl_config(length: int) -> RLConfig:
        return RLConfig(steps=1, rollouts_per_step=R, group_size=G, batch_size=R, capacity=R, buffer="on-policy",
                        max_new_tokens=length, micro_batch_size=micro_batch_for(plan, length), lr=1e-6).validated()

    def one_case(policy, optimizer, length: int) -> dict:
        config = rl_config(length)
        sampler = _timed_sampler(plan)
        generator = make_generator(plan.device, length)  # on the device on CUDA, as validate's loop now samples
        _reset_peak(plan.device)
        policy.model.eval()
        _sync(plan.device)
        start, compiled = time.perf_counter(), sampling.compile_seconds()
        batch, _ = generate_batch(policy, problems, index, config, 0, 0, generator, sampler)
        _sync(plan.device)
        compile_s = sampling.compile_seconds() - compiled  # a new decode shape: compiled or its graph recorded
        generation_s = time.perf_counter() - start - compile_s  # as RLResult.mu_timing charges it
        policy.model.train()
        start = time.perf_counter()
        update_step(policy, optimizer, problems, config, batch, library="torch")  # the loss on the device
        _sync(plan.device)
        update_s = time.perf_counter() - start
        policy.model.eval()
        tokens = int(batch.mask.sum())
        return {"generation_s": generation_s, "sampling_s": sampler.seconds, "update_s": update_s,
                "compile_s": compile_s, "mu": generation_s / update_s,  # (gen s / R) / (update s / R)
                "mu_sampling_only": sampler.seconds / update_s, "completion_tokens": tokens,
                "fixed_length": tokens == R * length, "micro_batch": config.micro_batch_size,
                "sampled_tokens_per_s": tokens / sampler.seconds, "peak_memory_gib": _peak_gib(plan.device)}

    # Short lengths of every shape first, then the longest of every shape (rebuilding the model): when the deadline
    # cuts the section, what is lost is the longest case of the largest shape, not a whole shape.
    passes = [(shape, plan.lengths[:-1]) for shape in plan.shapes] + [(shape, plan.lengths[-1:])
                                                                        for shape in plan.shapes]
    seconds_per_token: dict[str, float] = {}  # per shape, from its last finished case: predicts the next one

    def too_late(shape: Shape, length: int, extra_s: float = 0.0) -> str | None:
        """Why a case cannot finish before the deadline (None if it can): a case killed halfway gives nothing."""
        left = deadline - time.time()
        predicted = 1.15 * seconds_per_token.get(shape.name, 0.0) * length + extra_s
        if left < max(plan.min_case_s, predicted):
            return f"skipped: deadline ({left:.0f} s left, about {max(plan.min_case_s, predicted):.0f} s needed)"
        return None

    for shape, lengths in passes:
        if not lengths:
            continue
        why = too_late(shape, min(lengths), extra_s=plan.min_case_s)  # + building the model and its warm-up
        if why:
            for length in lengths:
                result["cases"].append({"shape": shape.name, "length": length, "status": why})
            emit(result)
            continue
        start = time.perf_counter()
        policy = build_policy(shape, plan.device)
        optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-6)
        build_s = time.perf_counter() - start
        params = sum(p.numel() for p in policy.model.parameters())
        print(f"[mu] {shape.name}: {params / 1e6:.0f} M parameters, built in {build_s:.1f} s", file=sys.stderr,
              flush=True)
        try:  # warm-up outside the clock: first calls pay for allocator, cuBLAS and AdamW-state setup
            one_case(policy, optimizer, min(4, min(plan.lengths)))  # 4 tokens: the setup, not the length
        except Exception as err:  # noqa: BLE001 - recorded; the timed cases below say whether it persists
            print(f"[mu] warm-up failed: {one_line(err)}", file=sys.stderr, flush=True)
        _free(plan.device)
        for length in lengths:
            case: dict[str, Any] = {"shape": shape.name, "parameters": params, "length": length, "rollouts": R}
            why = too_late(shape, length)
            if why:
                case["status"] = why
            else:
                try:
                    case.update(one_case(policy, optimizer, length), status="ok")
                    seconds_per_token[shape.name] = (case["generation_s"] + case["update_s"]) / length
                    print(f"[mu] {shape.name} L={length}: generation {case['generation_s']:.2f} s (sampling "
                          f"{case['sampling_s']:.2f} s), update {case['update_s']:.2f} s, mu {case['mu']:.2f}, "
                          f"peak {case['peak_memory_gib'] or 0:.1f} GiB", file=sys.stderr, flush=True)
                except Exception as err:  # noqa: BLE001 - e.g. out of memory at 512: the other cases still run
                    case["status"] = f"error: {one_line(err)}"
                    print(f"[mu] {shape.name} L={length}: {case['status']}", file=sys.stderr, flush=True)
                _free(plan.device)
            result["cases"].append(case)
            emit(result)
        del policy, optimizer
        sampling.release_decoders()  # the shape's decoder (its weights, caches and graphs) goes with it
        _free(plan.device)
    return result


def _token_stats(a, b, mask) -> dict:
    """max and mean |a - b| over the completion tokens (mask 1), and the max |difference| of their sums per row."""
    diff = (a.float() - b.float()).abs() * mask  # (N, L)
    seq = ((a.float() - b.float()) * mask).sum(1).abs()  # (N,): sequence log-ratio error (RLOO Eq. (2))
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.sum() / mask.sum()), "seq_max_abs": float(seq.max()),
            "tokens": int(mask.sum())}


def worker_logprob_mismatch(plan: Plan, deadline: float, emit: Callable[[dict], None]) -> dict:
    """Section 6: the sampler's logp_behav against ``sequence_logprobs`` in bf16 and in fp32, same tokens."""
    import torch

    from replay_theory.validate.logprobs import sequence_logprobs
    from replay_theory.validate.sampling import generate

    shape, length = plan.shapes[0], plan.mismatch_tokens
    R, G = plan.rollouts, plan.group_size
    policy_bf16 = build_policy(shape, plan.device, compute_dtype="bfloat16")  # fp32 weights, bf16 autocast
    policy_fp32 = dataclasses.replace(policy_bf16, config=dataclasses.replace(policy_bf16.config,
                                                                               compute_dtype="float32"))
    prompts = [p.prompt_text() for p in _problems(plan)[: R // G]]
    chunk = max(1, plan.tokens_per_micro_batch // length)  # rows per trainer pass: bounds the (rows, L, V) logits

    @torch.no_grad()
    def trainer(policy, rollouts) -> torch.Tensor:  # (N, L) float32
        parts = []
        for a in range(0, rollouts.completion_ids.shape[0], chunk):
            rows = slice(a, a + chunk)
            parts.append(sequence_logprobs(policy, rollouts.prompt_ids[rows], rollouts.prompt_mask[rows],
                                           rollouts.completion_ids[rows], rollouts.completion_mask[rows]))
        return torch.cat(parts)

    result: dict[str, Any] = {"shape": shape.name, "length": length, "rollouts": R, "cases": []}

    def generator():  # on the device: how tokens are drawn does not matter here, and a CPU draw of 151,936 ids
        return torch.Generator(device=policy_bf16.device).manual_seed(1)  # per row and step costs seconds

    decode = decode_options(plan)  # the sampler as validate runs it on CUDA: a bf16 (compute dtype) decoder copy
    result["decode"] = str(decode)
    sampled_bf16 = generate(policy_bf16, prompts, G, length, 1.0, generator(), decode=decode)
    mask = sampled_bf16.completion_mask.float()
    trainer_bf16, trainer_fp32 = trainer(policy_bf16, sampled_bf16), trainer(policy_fp32, sampled_bf16)
    pairs = [("sampler bf16 vs trainer bf16", sampled_bf16.logp_behav, trainer_bf16),
             ("sampler bf16 vs trainer fp32", sampled_bf16.logp_behav, trainer_fp32),
             ("trainer bf16 vs trainer fp32", trainer_bf16, trainer_fp32)]
    for name, a, b in pairs:
        result["cases"].append({"pair": name, "status": "ok", **_token_stats(a, b, mask)})
    emit(result)
    # The control: sampler and trainer both fp32. Only the KV-cached vs full forward's float32 rounding remains.
    sampled_fp32 = generate(policy_fp32, prompts, G, length, 1.0, generator(), decode=decode)
    result["cases"].append({"pair": "sampler fp32 vs trainer fp32 (control)", "status": "ok",
                            **_token_stats(sampled_fp32.logp_behav, trainer(policy_fp32, sampled_fp32),
                                           sampled_fp32.completion_mask.float())})
    result["autocast_bf16"] = _autocast_state(policy_bf16)
    result["autocast_fp32"] = _autocast_state(policy_fp32)
    return result


def _autocast_state(policy) -> str:
    """What ``policy.autocast()`` does, in words: the rule of ``Policy.autocast`` (and of the CPU subclass)."""
    from replay_theory.validate.policy import resolve_compute_dtype

    compute, weights = resolve_compute_dtype(policy.config), next(policy.model.parameters()).dtype
    if compute == weights:
        return f"{str(weights).removeprefix('torch.')} throughout (no autocast)"
    return f"{str(compute).removeprefix('torch.')} autocast over {str(weights).removeprefix('torch.')} weights"


def worker_decode(plan: Plan, deadline: float, emit: Callable[[dict], None]) -> dict:
    """Section 5: tokens/s of the validator's loop as it runs on CUDA (compiled), of its eager forms (the loop before
    issue 31 with a CPU generator, and with a CUDA one), and of transformers' generate (dynamic cache, static cache,
    static cache + torch.compile: the compiled reference); the loop's ratio to the reference."""
    import torch
    from transformers import GenerationConfig

    from replay_theory.validate import sampling
    from replay_theory.validate.logprobs import encode_prompts
    from replay_theory.validate.sampling import DecodeOptions, generate

    shape, length = plan.shapes[0], plan.decode_tokens
    R, G = plan.rollouts, plan.group_size
    # bf16 weights: a static cache takes the model's dtype, and the project's loop then runs the same arithmetic
    # (ModelConfig(dtype="bfloat16"): compute dtype = weights' dtype, no autocast).
    policy = build_policy(shape, plan.device, dtype="bfloat16")
    model, device = policy.model, policy.device
    prompts = [p.prompt_text() for p in _problems(plan)[: R // G]]
    prompt_ids, prompt_mask = encode_prompts(policy, prompts)  # (R / G, P) left-padded
    prompt_ids = prompt_ids.repeat_interleave(G, dim=0)  # (R, P): the rows the project's loop samples
    prompt_mask = prompt_mask.repeat_interleave(G, dim=0)
    old_length = min(length, 16)  # the loop before issue 31 draws on the host: ~140 tokens/s at 0.5B on an H200
    result: dict[str, Any] = {"shape": shape.name, "length": length, "rollouts": R, "weights": "bfloat16",
                              "old_loop_length": old_length, "cases": []}

    def timed(fn, *args, **kwargs) -> float:
        _sync(device)
        start = time.perf_counter()
        fn(*args, **kwargs)
        _sync(device)
        return time.perf_counter() - start

    def hf_config(new_tokens: int, **extra) -> GenerationConfig:
        # min_new_tokens = max_new_tokens: fixed length, as in the project's loop with no stop token
        return GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, pad_token_id=policy.tokenizer.pad_token_id,
                                eos_token_id=policy.tokenizer.eos_token_id, **extra)

    def hf_generate(new_tokens: int, **extra):
        out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask,
                             generation_config=hf_config(new_tokens, **extra))
        if out.shape[1] - prompt_ids.shape[1] != new_tokens:
            raise RuntimeError(f"generate returned {out.shape[1] - prompt_ids.shape[1]} new tokens, not {new_tokens}")
        return out

    def project(generator_device: str, decode: DecodeOptions):
        def run(new_tokens: int):
            generator = torch.Generator(device=generator_device).manual_seed(0)
            rollouts = generate(policy, prompts, G, new_tokens, 1.0, generator, decode=decode)
            if rollouts.completion_ids.shape[1] != new_tokens:
                raise RuntimeError(f"the loop returned {rollouts.completion_ids.shape[1]} tokens, not {new_tokens}")
        return run

    cuda = torch.device(device).type == "cuda"
    compile_config = _reference_compile_config(cuda)
    compile_name = f"torch.compile(backend={compile_config.backend}, mode={compile_config.mode})"
    ours = decode_options(plan)
    eager_device = DecodeOptions(check_every=ours.check_every, race=True)
    LOOP = "validator's loop as validate runs it on CUDA (static cache, compiled step, device generator)"
    REFERENCE = f"transformers generate, static cache + {compile_name}"
    variants = [  # (name, run(new_tokens), tokens per call, compiles?, skip reason)
        ("validator's loop before issue 31 (eager, CPU generator)", project("cpu", DecodeOptions()), old_length,
         False, None),
        ("validator's loop, eager, CUDA generator", project(str(device), eager_device), length, False,
         None if cuda else "skipped: CPU run (the generator already lives on the device)"),
        ("transformers generate, dynamic cache", lambda n: hf_generate(n, disable_compile=True), length, False, None),
        ("transformers generate, static cache", lambda n: hf_generate(n, cache_implementation="static",
                                                                      disable_compile=True), length, False, None),
        (LOOP, project(str(device) if cuda else "cpu", ours), length, True, None),
        (REFERENCE, lambda n: hf_generate(n, cache_implementation="static", compile_config=compile_config), length,
         True, None),
    ]
    rates: dict[str, float] = {}
    for name, fn, new_tokens, compiles, skip in variants:
        case: dict[str, Any] = {"variant": name, "tokens_per_call": R * new_tokens}
        result["cases"].append(case)  # updated in place: a kill mid-case keeps what finished
        left = deadline - time.time()
        need = plan.min_case_s * (3 if compiles else 1)  # a compile needs far more than one plain case
        if skip or left < need:
            case["status"] = skip or f"skipped: deadline ({left:.0f} s left, about {need:.0f} s needed)"
        else:
            try:
                seconds = _time_decode_case(case, fn, new_tokens, compiles, timed, partial(emit, result))
                if compiles:  # transformers keeps its compiled forward as model._compiled_call (5.x)
                    case["compiled"] = hasattr(model, "_compiled_call") if name == REFERENCE else _loop_compiled()
                case.update(status="ok", seconds=seconds, tokens_per_s=R * new_tokens / seconds)
                rates[name] = case["tokens_per_s"]
            except Exception as err:  # noqa: BLE001 - one variant's failure leaves the others
                case["status"] = f"error: {one_line(err)}"
            _free(device)
        print(f"[decode] {name}: {case.get('status')} {case.get('tokens_per_s', 0):,.0f} tokens/s", file=sys.stderr,
              flush=True)
        emit(result)
    _add_decode_ratios(result, rates, variants[0][0], LOOP, REFERENCE)
    sampling.release_decoders()
    return result


def _reference_compile_config(cuda: bool):
    """transformers' CompileConfig of the compiled reference: inductor + CUDA graphs on a GPU; on the CPU (smoke) the
    eager backend, which still goes through dynamo (inductor on a 2-core CPU takes minutes)."""
    from transformers import CompileConfig

    if cuda:
        return CompileConfig(mode="reduce-overhead")
    # the stubs are narrower than the code: torch.compile takes mode=None (its default), and generate() reads
    # _compile_all_devices (declared `= None`, so typed None) as a bool
    compile_config = CompileConfig(backend="eager", mode=None)  # pyright: ignore[reportArgumentType]
    compile_config._compile_all_devices = True  # pyright: ignore[reportAttributeAccessIssue]  - compile off-GPU
    return compile_config


def _time_decode_case(case: dict, fn: Callable[[int], Any], new_tokens: int, compiles: bool,
                      timed: Callable[..., float], checkpoint: Callable[[], None]) -> float:
    """Seconds of one call of ``fn(new_tokens)``: after a short warm-up call, or for a compiling variant the faster of
    two steady calls after the first (compiling) one, whose time ``case`` records apart."""
    if not compiles:
        timed(fn, min(4, new_tokens))  # warm-up: kernels, allocator
        return timed(fn, new_tokens)
    case["status"] = "error: killed during the first (compiling) call"
    checkpoint()
    case["first_call_s"] = timed(fn, new_tokens)  # compiles (and records the CUDA graphs)
    case["status"] = "error: killed during the steady calls"
    checkpoint()
    steady = [timed(fn, new_tokens) for _ in range(2)]
    seconds = min(steady)
    case.update(steady_calls_s=steady, compile_s=case["first_call_s"] - seconds)
    return seconds


def _loop_compiled() -> bool:
    """Whether the validator's compiled decoder (``sampling._DECODERS``) exists and compiled its step."""
    from replay_theory.validate import sampling

    decoder = next((d for d in sampling._DECODERS.values() if d.options.compile), None)
    return decoder is not None and decoder.compiled


def _add_decode_ratios(result: dict, rates: dict[str, float], old_loop: str, loop: str, reference: str) -> None:
    """Each case's speed-up over the old loop, and the loop's tokens/s and its ratio to the compiled reference."""
    old = rates.get(old_loop)
    for case in result["cases"]:
        if old and "tokens_per_s" in case:
            case["speedup_vs_old_loop"] = case["tokens_per_s"] / old
    if loop in rates and reference in rates:
        result["loop_over_compiled_reference"] = rates[loop] / rates[reference]  # target >= 0.7
    if loop in rates:
        result["loop_tokens_per_s"] = rates[loop]  # target >= 10,000 at the 0.5B shape, R = 64, L = 128


WORKERS: dict[str, Callable[[Plan, float, Callable[[dict], None]], dict]] = {
    "mu": worker_mu, "decode": worker_decode, "logprob_mismatch": worker_logprob_mismatch}


def worker_main(argv: list[str]) -> int:
    """``gpu_check.py --worker NAME --plan FILE --result FILE --deadline-at EPOCH_S``: one model section."""
    parser = argparse.ArgumentParser(prog="gpu_check.py --worker")
    parser.add_argument("name", choices=WORKER_SECTIONS)
    parser.add_argument("--plan", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--deadline-at", type=float, required=True)
    args = parser.parse_args(argv)
    raw = json.loads(Path(args.plan).read_text())
    raw["shapes"] = tuple(Shape(**s) for s in raw["shapes"])
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}  # JSON values
    plan = Plan(**fields)
    import torch

    torch.set_num_threads(plan.threads)
    result_path = Path(args.result)
    result: dict[str, Any] = {}

    def emit(partial: dict) -> None:  # after every case: a later crash or kill keeps what finished
        write_json(result_path, {**partial, "status": "partial: running"})

    try:
        result = WORKERS[args.name](plan, args.deadline_at, emit)
        failed = [c for c in result.get("cases", []) if str(c.get("status", "")).startswith("error")]
        result["status"] = (f"error: {len(failed)} of {len(result['cases'])} cases failed: {failed[0]['status'][7:]}"
                            if failed else "ok")
    except Exception as err:  # noqa: BLE001 - the section's one-line error, with what finished before it
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError):
            result = {}
        result["status"] = f"error: {one_line(err)}"
    write_json(result_path, result)
    return 0


# --------------------------------------------------------------------------- report


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"  # tokens/s: 12,345 not 1.23e+04
    return str(value)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows)]


def _busy(record: dict) -> str:
    busy = record.get("gpu_busy_fraction", "unavailable")
    if not isinstance(busy, float):
        return f"GPU busy: {busy}"
    return f"GPU busy {busy:.2f} of the time ({record.get('gpu_source')}, {record.get('gpu_samples')} samples)"


def _environment_lines(record: dict) -> list[str]:
    if "torch" not in record:
        return []
    keys = ["python", "torch", "torch_cuda", "transformers", "device_name", "total_memory_gib", "capability",
            "driver", "cpu_count", "matmul_allow_tf32", "nvidia_smi", "c_compiler"]
    return _table(["key", "value"], [[k, record.get(k)] for k in keys])


def _validate_all_lines(record: dict) -> list[str]:
    if "wall_s" not in record:
        return []
    return [f"`{record['command']}`", "",
            f"wall {record['wall_s']:.1f} s, exit code {record['exit_code']}; {_busy(record)}; peak GPU "
            f"memory used {_fmt(record.get('gpu_memory_used_max_mib'))} MiB", "", "```",
            *record.get("lines", []), *record.get("verdict_lines", []), "```"]


def _batched_verify_lines(record: dict) -> list[str]:
    if not record.get("runs"):
        return []
    lines = _table(["mode", "seconds", "compile s inside", "peak RSS MiB", "peak GPU MiB",
                    "GPU busy (its clock)", "GPU busy (process)"],
                   [[m, r.get("seconds"), r.get("compile_s"), r.get("peak_rss_mib"), r.get("peak_gpu_mib"),
                     r.get("gpu_busy_fraction_in_clock"), r.get("gpu_busy_fraction")]
                    for m, r in record["runs"].items()])
    return lines + ["", f"{record['seeds']} seeds x 2 designs x {record['steps']} updates + held-out evaluation, "
                    f"tiny model on {record['device']}: ratio sequential / batched "
                    f"{_fmt(record.get('ratio_sequential_over_batched'))}x; held-out results equal seed by seed: "
                    f"{_fmt(record.get('held_out_equal'))} (max |difference| "
                    f"{_fmt(record.get('held_out_max_abs_diff'))})"]


def _mu_lines(record: dict) -> list[str]:
    if not record.get("cases"):
        return []
    return [f"R = {record['rollouts']} completions (G = {record['group_size']}), fixed length; "
            f"{record['precision']}; loop: {record.get('loop', '-')}; {_busy(record)}", "",
            *_table(["shape", "L", "micro-batch", "generation s", "sampling s", "update s", "compile s (apart)",
                     "mu", "mu (sampling only)", "peak GiB", "status"],
                    [[c["shape"], c["length"], c.get("micro_batch"), c.get("generation_s"),
                      c.get("sampling_s"), c.get("update_s"), c.get("compile_s"), c.get("mu"),
                      c.get("mu_sampling_only"), c.get("peak_memory_gib"), c["status"]]
                     for c in record["cases"]])]


def _decode_lines(record: dict) -> list[str]:
    if not record.get("cases"):
        return []
    lines = [f"{record['shape']}, R = {record['rollouts']}, L = {record['length']} (fixed), "
             f"{record['weights']} weights; {_busy(record)}", ""]
    lines += _table(["variant", "tokens per call", "seconds", "tokens/s", "speed-up vs the old loop", "status"],
                    [[c["variant"], c.get("tokens_per_call"), c.get("seconds"), c.get("tokens_per_s"),
                      c.get("speedup_vs_old_loop"), c.get("status")] for c in record["cases"]])
    for c in (c for c in record["cases"] if "first_call_s" in c):
        lines += ["", f"{c['variant']}: first call {_fmt(c['first_call_s'])} s, steady "
                  f"{_fmt(c.get('seconds'))} s, compile ~ {_fmt(c.get('compile_s'))} s; compiled: "
                  f"{_fmt(c.get('compiled'))}"]
    return lines + ["", f"the validator's loop: {_fmt(record.get('loop_tokens_per_s'))} tokens/s (target >= "
                    f"10,000), {_fmt(record.get('loop_over_compiled_reference'))} of the compiled reference "
                    f"(target >= 0.7)"]


def _verdict_rules_lines(c: dict) -> list[str]:
    """A verdict case's batch, budget and B_noise, each rule's placement, and the designs' held-out rewards."""
    lines = [f"B = {c['batch_size']}, {c['seeds']} seeds (batched: {_fmt(c['batched'])}), budget "
             f"{c['budget_updates']} on-policy updates at mu = {_fmt(c['mu_priced'])} (measured "
             f"{_fmt(c['mu_measured'])}); B_noise = {_fmt(c['b_noise'])} (interval "
             f"{', '.join(_fmt(v) for v in c.get('b_noise_interval') or [])}); measured best: "
             f"{c['measured_best']}", ""]
    lines += _table(["rule", "design", "regime", "b", "kappa", "rank", "P(best)", "regret", "strongest rival",
                     "difference", "se", "seeds for 2 se", "first or within 1 se"],
                    [[r["rule"], r["design"], r["regime"], r["b"], r["kappa"],
                      None if r["rank"] is None else f"{r['rank']} of {r['designs']}", r["p_best"],
                      r["regret"], r["rival"], r["difference"], r["se"], r["seeds_for_2se"],
                      r["first_or_within_one_se"]] for r in c["rules"]])
    if c.get("forgetting_note"):
        lines += ["", f"forgetting-aware rule: no prediction ({c['forgetting_note']})"]
    return lines + [""] + _table(["design", "R", "N", "B", "updates", "held-out reward", "sd"],
                                 [[d["name"], d["rollouts_per_step"], d["capacity"], d["batch_size"], d["steps"],
                                   d["reward_mean"], d["reward_sd"]] for d in c["designs"]])


def _verdict_case_lines(c: dict) -> list[str]:
    lines = [f"### {c['label']}: {c['status']}", ""]
    if "wall_s" not in c:
        return lines
    lines += [f"`{c['command']}`", "", f"wall {c['wall_s']:.1f} s (target <= 360 s; calibration "
              f"{_fmt(c.get('calibration_seconds'))} s, verify {_fmt(c.get('verify_seconds'))} s), "
              f"exit code {c['exit_code']}; {_busy(c)}; peak GPU memory used "
              f"{_fmt(c.get('gpu_memory_used_max_mib'))} MiB", ""]
    if c.get("rules"):
        lines += _verdict_rules_lines(c)
    return lines + [""]


def _verdict_lines(record: dict) -> list[str]:
    if not record.get("cases"):
        return []
    lines = [f"--kappa: {_fmt(record.get('kappa_given'))}", ""]
    for c in record["cases"]:
        lines += _verdict_case_lines(c)
    return lines


def _logprob_mismatch_lines(record: dict) -> list[str]:
    if not record.get("cases"):
        return []
    return [f"{record['shape']}, R = {record['rollouts']}, L = {record['length']}; bf16 rows: "
            f"{record.get('autocast_bf16', '-')}, fp32 rows: {record.get('autocast_fp32', '-')}", "",
            *_table(["pair", "max abs per token", "mean abs per token", "max abs per sequence", "tokens"],
                    [[c["pair"], c.get("max_abs"), c.get("mean_abs"), c.get("seq_max_abs"), c.get("tokens")]
                     for c in record["cases"]])]


# each section's block under its heading (no lines where the section has no numbers)
SECTION_MARKDOWN: dict[str, Callable[[dict], list[str]]] = {
    "environment": _environment_lines, "validate_all": _validate_all_lines, "batched_verify": _batched_verify_lines,
    "mu": _mu_lines, "decode": _decode_lines, "verdict": _verdict_lines, "logprob_mismatch": _logprob_mismatch_lines}


def markdown(data: dict) -> str:
    """The summary: one block per section in report order, the numbers of gpu_check.json in tables."""
    sections = data["sections"]
    env = sections.get("environment", {})
    lines = ["# GPU check (bench/gpu_check.py)", "",
             f"{'SMOKE (CPU, tiny shapes: code paths, not numbers); ' if data['smoke'] else ''}device "
             f"{env.get('device_name') or data['device']} ({_fmt(env.get('total_memory_gib'))} GiB, capability "
             f"{env.get('capability') or '-'}), torch {env.get('torch', '-')}, transformers "
             f"{env.get('transformers', '-')}; wall {data.get('wall_s', 0):.1f} s of the {data['deadline_s']:.0f} s "
             f"deadline", ""]
    for name in SECTIONS:
        record = sections.get(name, {"status": "skipped: not reached"})
        lines += [f"## {TITLES[name]}: {record['status']} ({_fmt(record.get('seconds'))} s)", ""]
        lines += SECTION_MARKDOWN[name](record)
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def run_check(config: CheckConfig) -> dict:
    """Every section under the global deadline; gpu_check.json after each, gpu_check.md at the end."""
    clock = Clock(config.deadline_s)
    plan = make_plan(config)
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

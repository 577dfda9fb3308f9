"""Does a design rule predict? The prediction benchmark of ``replay-theory experiment theory-test``.

Papers: experience-replay (docs/REFERENCES.md), Sec. 3 (the synchronous FIFO), Thm 3.4 and Thm 3.5 / App. C.3 (the
paper's bound and its design objective J); McCandlish et al. 2018 (arXiv 1812.06162), Eq. 2.7 (steps S = S_min (1 +
B_noise / B)); the forgetting-aware rule of ``theory/forgetting.py`` (docs/THEORY.md, "Forgetting"). The benchmark is
an experiment on the library: the environments come from ``simulate/envs`` (registry), the training loop from
``simulate/to_target.py``, the rules from ``theory/``; this module holds the protocol and the scoring.

A unit is (setting, optimizer, instance); a design's steps are the earliest step at which the smoothed SEED-MEAN
exact reward reaches the target (never a lucky seed); a step costs mu max(R, R_floor) + B sample-updates
(``FLOORS``: generation latency floors; 0 is the paper's accounting); each cell (unit, mu, floor) scores every rule
over the whole grid (free batch) and at the pinned B = 256.  The inputs (b, kappa, r(s)) are measured, never fitted
to the grid.  Protocol, settings and scoring in full: docs/SIMULATION.md, 'Does a design rule predict?'.

| code name          | symbol                | meaning                                                            |
|--------------------|-----------------------|--------------------------------------------------------------------|
| ``x``, ``y``       | N/R, B/R              | staleness horizon, replay ratio                                    |
| ``mu``             | mu                    | rollout cost / per-sample update cost                              |
| ``floor``          | R_floor               | generation latency floor, rollouts per step                        |
| ``b``              | B_noise / 256         | the noise scale at the pinned batch                                |
| ``kappa``          | eta lambda_eff        | the optimizer's memory at the pilot (1/kappa steps)                |
| ``steps``          | S                     | steps to the target at the tuned step size (replicates x designs)  |
| ``regret``         | --                    | compute of a rule's pick / the best design's                       |
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

import numpy as np
from threadpoolctl import threadpool_limits

from .. import __version__
from ..core.designs import CHOICES, compute_loss
from ..core.memory import MAX_SIZE, Estimate, Size, check_sizes
from ..core.pipeline import score
from ..core.progress import ProgressBar
from ..outputs import NEVER, check_out_dir, strict, write_new, write_once
from ..simulate import to_target
from ..simulate.config import SimConfig, config_from_dict
from ..simulate.config import peak_bytes as sim_peak_bytes
from ..simulate.envs import ENVIRONMENTS, BanditEnv, NoisyRewardBandit, make_env
from ..simulate.envs.quadratic import QuadraticConfig, QuadraticEnv
from ..theory import advice, forgetting
from ..theory import design as theory_design
from ..theory import noise_scale as noise_scale_lib
from ..theory.checks import invalid, require_integer
from ..theory.profiles import TabulatedProfile

BATCH = 256
GROUP = 8
X_GRID = (1, 4, 16)
Y_GRID = (1, 2, 4, 8, 16, 32)
ON_POLICY_BATCHES = (8, 16, 32, 64, 128, 256)
QUICK_X_GRID = (1, 16)
QUICK_Y_GRID = (1, 4, 16)
QUICK_ON_POLICY_BATCHES = (32, 64, 128, 256)
QUICK_FLOORS = (0, 64)
"""--quick's latency floors unless --floor: each floor's printed answers are trained, so fewer floors keep it short."""
HELD_OUT = (61, 67, 71)
"""The held-out instances the targets read: named at commit a46489a (as NEXT_HELD_OUT), before their first run, and
first run by the protocol whose rule reads only the pilot and whose printed answer is scored at --max-steps-ratio 2
and 1000 (issue 38). Nothing was tuned on them."""
INSTANCES = (0, *HELD_OUT)
DEV_INSTANCES = (0,)
"""Instance 0 is the one the benchmark and the rule were developed on (with 1 and 2, which the earlier benchmark and
the audits looked at). 3 and 4, the first held-out pair, were scored at commit cc02c48 and read again since; 47, 53
and 59, the second, were first run at commit a46489a by the first pilot-only protocol (docs/SIMULATION.md keeps that
result) and read before the protocol changed (the pilot's length counting its curvature steps, the least-compute
printed row): all are development instances now. 17 and 23 were run at full size by the review of issue 38, 0-30 with
--quick by the robustness check (bench/), 112 and 127 by the tests; the next held-out set is ``NEXT_HELD_OUT``."""
NEXT_HELD_OUT = (73, 79, 83)
"""Named here, before their first run: the instances the next evidence is read on once a rule or the protocol changes
after HELD_OUT is scored (which makes HELD_OUT development instances). Nothing may be tuned on them."""
SEEDS = 16
BOOTS = 200
MUS = (0.5, 1.0, 2.0, 5.28, 20.0)
FLOORS = (0, 16, 64, 128)
"""Latency floors in rollouts per step: 0 (the paper's cost), 16, 64 = B/4 (the headline: a small batch is not free),
128 = B/2."""
HEADLINE_FLOOR = 64
TARGET_FRACTION = 0.9
LR_RATIO = math.sqrt(2.0)
MAX_EXTEND = 4
"""Rounds of two more step sizes beyond an edge where the best one sits (factor sqrt(2) apart)."""
EXACT_LR_RATIO = 2 ** 0.25
CAP_FACTOR = 4.0
"""A design runs until its compute is CAP_FACTOR x on-policy's at B = 256 under the cost model kindest to it; beyond
that it is not reached (censored, counted)."""
PILOT_MAX_STEPS = 6000
STALENESS = (0, 1, 2, 4, 8, 16, 32, 64)
PILOT_FRACTION = 0.1
"""The pilot a user can afford: 10% of on-policy at B's steps to the target (issue 38's budget), read off the user's
recipe (``RECIPE``), never off a scored run; one step at least."""
PILOT_SEED = 10_000
"""The pilot's seeds (its run, the recipe's search) start at PILOT_SEED + instance; every scored run's at instance."""
PILOT_RUNS = 1
"""The pilot is one run, as one user has: its estimates carry one run's noise (pooling seeds would claim a pilot
PILOT_RUNS times the compute counted)."""
CURVATURE_EVERY = 8
"""Curvature pairs and B_crit's HVPs on every 8th pilot step (counted from the last, so the last step has them): three
HVPs each, counted in the pilot's compute (``HVP_SAMPLE_UPDATES``, ``HVP_SAMPLES``)."""
HVP_SAMPLE_UPDATES = 2.0
"""An HVP counted as 2 sample-updates per sample it runs over (Pearlmutter's R-op: a forward and a backward pass over
the gradient's graph, about twice a gradient), in the cost model's unit (a step costs mu max(R, floor) + B)."""
HVP_SAMPLES = BATCH // 4
"""The samples an HVP is counted over: a quarter of the step's batch (the pairs' quarters). The simulator applies the
expected loss's Hessian (exact, or central differences of the exact gradient); a trainer's HVP over 64 samples
estimates it with noise this benchmark does not add."""
BETA1 = 0.9
QUADRATIC_CONDITION = 100.0
QUADRATIC_NOISE = (1.0, 3.0, 10.0, 30.0, 100.0)
"""The noisy quadratic's noise levels: B_simple / 256 at the median of its noise-free path."""


@dataclass(frozen=True)
class Setting:
    """An environment, its loss and where each optimizer's step-size search starts."""

    name: str
    env: str  # simulate.envs registry name
    env_config: dict
    loss: tuple[str, str] | None  # (simulator loss, advantage) on a rollout environment; None: the quadratic's F
    description: str
    sgd_lr0: float  # the pilot's first step sizes centre on this, in units of 1/L
    adam_lr0: float  # absolute


SETTINGS = {
    **{f"quadratic-noise{n:g}": Setting(f"quadratic-noise{n:g}", "quadratic",
                                        {"condition": QUADRATIC_CONDITION, "noise_scale": n * BATCH,
                                         "target_fraction": TARGET_FRACTION}, None,
                                        f"noisy quadratic, d = 16, condition {QUADRATIC_CONDITION:g}, Sigma = s^2 H, "
                                        f"B_simple / 256 = {n:g}", 0.25, 0.05)
       for n in QUADRATIC_NOISE},
    "two-prompts": Setting("two-prompts", "bandit", {"num_prompts": 2, "feature_dim": 4, "skill_alignment": 0.3},
                           ("no-trust-region", "leave-one-out"),
                           "bandit, 2 prompts, 4 features: steps nearly independent of B (b << 1); IS loss", 4.0, 0.5),
    "bandit-grpo": Setting("bandit-grpo", "bandit", {}, ("grpo", "grpo"),
                           "bandit, 64 prompts, 16 actions; the clipped GRPO loss", 0.5, 0.25),
    "noisy-reward": Setting("noisy-reward", "noisy-bandit", {"reward_noise": 2.0}, ("no-trust-region", "leave-one-out"),
                            "the bandit observed through N(0, 2^2) reward noise (b >> 1); IS loss", 0.5, 0.25),
}
DEFAULT_SETTINGS = tuple(SETTINGS)
OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class Options:
    """The benchmark's options: ``experiment theory-test``'s options are these fields (``options_from``)."""

    instances: tuple[int, ...] = INSTANCES
    """Comma-separated instance seeds (the quadratic's start, the bandit's features): 0 is the development instance,
    61, 67 and 71 held out (HELD_OUT); 0 with --quick."""
    settings: tuple[str, ...] = field(default=DEFAULT_SETTINGS, metadata={CHOICES: lambda: {
        name: setting.description for name, setting in SETTINGS.items()}})
    """Comma-separated settings."""
    optimizers: tuple[str, ...] = OPTIMIZERS
    """sgd, adam or both (comma-separated)."""
    mus: tuple[float, ...] = MUS
    """Comma-separated rollout-cost ratios at which the same runs are re-priced."""
    floors: tuple[int, ...] = FLOORS
    """Comma-separated generation latency floors in rollouts per step (a step costs mu max(R, floor) + B)."""
    seeds: int = SEEDS
    """Seeds for each design and step size, an integer >= 2; 8 with --quick."""
    quick: bool = False
    """A 2 x 3 grid, on-policy at 4 batches, 8 seeds unless --seeds, instance 0 unless --instance, floors 0 and 64
    unless --floor (a smoke run)."""

    @property
    def grid(self) -> list[tuple[int, int]]:
        xs, ys = (QUICK_X_GRID, QUICK_Y_GRID) if self.quick else (X_GRID, Y_GRID)
        return [(x, y) for y in ys for x in xs]

    @property
    def on_policy_batches(self) -> tuple[int, ...]:
        return QUICK_ON_POLICY_BATCHES if self.quick else ON_POLICY_BATCHES

    @property
    def units(self) -> list[tuple[str, str, int]]:
        return [(s, o, i) for i in self.instances for s in self.settings for o in self.optimizers]

    def designs(self) -> list[tuple[str, forgetting.Design]]:
        """(label, design): on-policy at each batch, then the pinned-B FIFO grid."""
        out = [(f"on-policy B={b}", forgetting.Design.on_policy_at(b)) for b in sorted(self.on_policy_batches)]
        out += [(f"x={x} y={y}", forgetting.Design(BATCH, BATCH // y, x * BATCH // y)) for x, y in self.grid]
        return out


MAX_STEP_SIZES = 8
"""The most step sizes a design trains at once (the pilot's coarse grid and its refinement: 6 + 2), each with --seeds
rows."""


def peak_bytes(values: dict) -> Estimate:
    """Peak bytes of the benchmark at ``values["--seeds"]``: its largest run at once, the FIFO at x = 16, y = 1 (N = 16
    B, R = B = 256) on the largest rollout environment (bandit-grpo's 64 prompts x 16 actions) at MAX_STEP_SIZES x
    seeds rows (``simulate.config.peak_bytes`` for one step: the runs stop at their target, so the step count is not
    known before), and the noisy quadratic's stored noise vectors (rows x N x d)."""
    rows = MAX_STEP_SIZES * values["--seeds"]
    largest = forgetting.Design(BATCH, BATCH // min(Y_GRID), max(X_GRID) * BATCH // min(Y_GRID))
    run = {**asdict(SimConfig()), "seeds": rows, "batch_size": largest.batch, "rollouts_per_step": largest.rollouts,
           "capacity": largest.capacity, "group_size": to_target.GROUP, "steps": 1}
    dim = QuadraticConfig().dim
    return Estimate({**sim_peak_bytes(run).terms,
                     f"the quadratic's stored noise: rows x N x d = {rows} x {largest.capacity} x {dim}":
                         rows * largest.capacity * dim * 8})


def _bad_choices(values, allowed) -> bool:
    """Whether a list option is empty or names a value outside ``allowed``."""
    return not values or any(v not in allowed for v in values)


def _bad_mus(mus) -> bool:
    """Whether --mu is empty, holds a value not finite and > 0, or repeats one."""
    return not mus or any(not (0 < mu < math.inf) for mu in mus) or len(set(mus)) != len(mus)


def _is_count(value) -> bool:
    """Whether a value is an integer (not a bool)."""
    return not isinstance(value, bool) and isinstance(value, int)


def _bad_counts(values) -> bool:
    """Whether a list option is empty, repeats a value, or holds one that is not an integer >= 0."""
    return not values or len(set(values)) != len(values) or any(not _is_count(v) or v < 0 for v in values)


def check_options(options: Options) -> None:
    """One-line ValueErrors naming the option and its valid values, before any work."""
    if _bad_choices(options.settings, SETTINGS):
        raise ValueError(f"--setting must be a comma-separated list of {', '.join(SETTINGS)}, got "
                         f"{','.join(options.settings) or 'nothing'}")
    if _bad_choices(options.optimizers, OPTIMIZERS):
        raise ValueError(f"--optimizer must be a comma-separated list of {', '.join(OPTIMIZERS)}, got "
                         f"{','.join(options.optimizers) or 'nothing'}")
    if _bad_mus(options.mus):
        raise ValueError(f"--mu must be a comma-separated list of distinct finite numbers > 0, got "
                         f"{','.join(f'{m:g}' for m in options.mus) or 'nothing'}")
    if _bad_counts(options.floors):
        raise ValueError(f"--floor must be a comma-separated list of distinct integers >= 0 (rollouts), got "
                         f"{','.join(map(str, options.floors)) or 'nothing'}")
    require_integer("--seeds", options.seeds, 2, note=" (the bootstrap resamples seeds)")
    if any(floor > MAX_SIZE for floor in options.floors):
        raise invalid("--floor", f"a comma-separated list of distinct integers in [0, {MAX_SIZE}]",
                      ",".join(map(str, options.floors)), fmt="s")
    check_sizes((Size("--seeds", 2),), {"--seeds": options.seeds}, peak_bytes)
    if _bad_counts(options.instances):
        raise ValueError(f"--instance must be a comma-separated list of distinct integers >= 0, got "
                         f"{','.join(map(str, options.instances)) or 'nothing'}")


def number_list(text: str, flag: str, valid: str, kind=float) -> tuple:
    """A comma-separated list of numbers. For a list of reals, two bare integers (``5,28``) are refused: in a
    decimal-comma locale that is one number (5.28, the paper's mu), and reading it as two would run other settings
    than the user meant without a word; the line says how to write either."""
    parts = text.split(",")
    if kind is float and len(parts) == 2 and all(re.fullmatch(r"\d+", part.strip()) for part in parts):
        a, b = (part.strip() for part in parts)
        raise ValueError(f"{flag} {text} is ambiguous: the two values {a} and {b}, or {a}.{b} with a decimal comma? "
                         f"Write {a}.{b} for one value (the decimal separator is a point), or {a}.0,{b} for two")
    try:
        return tuple(kind(part) for part in parts)
    except ValueError:
        raise invalid(flag, valid, text) from None


def options_from(typed: dict) -> Options:
    """The options from the values typed on the command line (text for the lists), --quick's smaller defaults where
    one was not typed, checked before any work (one line naming the option)."""
    quick = bool(typed.get("quick"))
    counts = "a comma-separated list of distinct integers >= 0"
    numbers = {"mus": ("--mu", "a comma-separated list of finite numbers > 0", float),
               "floors": ("--floor", counts, int), "instances": ("--instance", counts, int)}
    given = {name: number_list(typed[name], *how) for name, how in numbers.items() if name in typed}
    given.update({name: tuple(part.strip() for part in typed[name].split(","))
                  for name in ("settings", "optimizers") if name in typed})
    quick_defaults = {"instances": (0,), "seeds": 8, "floors": QUICK_FLOORS} if quick else {}
    options = Options(**{**quick_defaults, **given, "seeds": typed.get("seeds", quick_defaults.get("seeds", SEEDS)),
                         "quick": quick})
    check_options(options)
    return options


def command_line(out, given: list[tuple[str, object]]) -> str:
    """The command line that produced a benchmark, as evidence.json records it: the (flag, typed value) pairs."""
    parts = ["replay-theory experiment theory-test --out", Path(out).name]
    parts += [f"{flag} {value}" for flag, value in given if flag != "--quick"]
    return " ".join(parts + (["--quick"] if any(flag == "--quick" for flag, _ in given) else []))


# --------------------------------------------------------------------------- saved runs (resume)


def _key(payload: dict) -> str:
    text = json.dumps({**payload, "code_version": __version__}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Store:
    """OUT/runs/KEY.json: one file per training run or measurement, with its config and the code version; written
    whole (a temporary file hard-linked into place, ``outputs.write_once``), never overwritten; an existing one is
    reused (an interrupted run resumes).

    Safe under parallel workers: when two compute one run, the first whole file wins and the second is accepted if
    it holds the same record (the runs are deterministic); a different record under the same key is refused (one
    line), never written over. ``run_theory_test`` computes the runs units share before it dispatches them, so
    this is a safety net, not the plan."""

    def __init__(self, out: Path):
        self.runs = Path(out) / "runs"

    def get(self, payload: dict) -> dict | None:
        path = self.runs / f"{_key(payload)}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def put(self, payload: dict, result: dict) -> dict:
        self.runs.mkdir(parents=True, exist_ok=True)
        key = _key(payload)
        record = {"key": key, "replay_theory_version": __version__, "config": payload, **strict(result)}
        text = json.dumps(record)
        path = self.runs / f"{key}.json"
        found = write_once(path, text)
        if found is None or found == text:
            return record
        stored, ours = json.loads(found), json.loads(text)
        if stored == ours:  # the same record, written by another worker (key order aside)
            return stored
        what = "the same config with other results" if stored.get("config") == ours["config"] else "another config"
        raise ValueError(f"--out {path} holds {what} than this run computed; {NEVER}: choose a new --out")


# --------------------------------------------------------------------------- one unit: (setting, optimizer, instance)


Env = BanditEnv | QuadraticEnv
"""The settings' environments (the noisy-reward bandit is a BanditEnv)."""


def build_env(setting: Setting, instance: int) -> Env:
    """The setting's environment at ``instance`` (the quadratic's noise and the bandit's features from it; a noisy
    verifier's stream too, where its config has a ``noise_seed``)."""
    config = dict(setting.env_config, instance_seed=instance)
    if any(f.name == "noise_seed" for f in fields(ENVIRONMENTS[setting.env].config)):
        config["noise_seed"] = instance
    return make_env(setting.env, **config)


def exact_hessian(env, theta: np.ndarray, h: float = 1e-4) -> np.ndarray:
    """H of the loss F = -J at theta (1, d), by central differences of the exact gradient, symmetrised."""
    d = theta.shape[1]
    g = env.exact_grad(np.concatenate([theta + h * np.eye(d), theta - h * np.eye(d)]))  # (2d, d) ascent
    hess = -(g[:d] - g[d:]) / (2 * h)
    return (hess + hess.T) / 2


def instance_record(store: Store, setting: Setting, instance: int) -> tuple[Env, dict]:
    """J*, J0, target and smoothness L of the instance (exact; the bandit's J* by noise-free ascent)."""
    env = build_env(setting, instance)
    payload = {"kind": "instance", "setting": asdict(setting), "instance": instance,
               "target_fraction": TARGET_FRACTION}
    found = store.get(payload)
    if found is not None:
        return env, found
    if isinstance(env, QuadraticEnv):
        result = {"j0": env.j0, "j_star": env.j_star, "target": env.target, "smoothness": env.smoothness}
    else:
        j_star, theta_star = env.sup_reward()
        j0 = float(env.evaluate(env.init_params(1))["reward"][0])
        points = [env.init_params(1)] + [theta_star * f for f in (0.25, 0.5, 0.75, 1.0)]
        smoothness = max(float(np.max(np.abs(np.linalg.eigvalsh(exact_hessian(env, p))))) for p in points)
        result = {"j0": j0, "j_star": j_star, "target": j0 + TARGET_FRACTION * (j_star - j0), "smoothness": smoothness}
    return env, store.put(payload, result)


@dataclass
class Unit:
    """Everything one unit trains and measures, before scoring."""

    setting: Setting
    optimizer: str
    instance: int
    env: Env
    inst: dict
    store: Store
    options: Options
    boot_index: np.ndarray  # (BOOTS, seeds) the paired seed resamples of every design of the unit
    tick: Callable[[], None] | None = None  # called every training step (keeps a progress bar's clock live)
    advance: Callable[[], None] | None = None  # called after every design
    exact: bool = False  # the quadratic under SGD: every design's expected curve exactly
    runs: dict = field(default_factory=dict)  # label -> merged MC record
    exact_runs: dict = field(default_factory=dict)  # label -> exact record

    @property
    def lr_unit(self) -> float:
        return 1.0 / self.inst["smoothness"] if self.optimizer == "sgd" else 1.0

    def payload(self, design: forgetting.Design, lrs: np.ndarray, max_steps: int, seed_offset: int = 0) -> dict:
        stream = {"noise_stream": "per run"} if isinstance(self.env, NoisyRewardBandit) else {}
        seeds = {"seed_offset": seed_offset} if seed_offset else {}  # the scored runs' keys stay as they were
        return {"kind": "run", "setting": self.setting.name, "optimizer": self.optimizer, "instance": self.instance,
                **stream, **seeds,
                "design": [design.batch, design.rollouts, design.capacity, design.on_policy],
                "lrs": [float(v) for v in lrs], "seeds": self.options.seeds, "boots": int(self.boot_index.shape[0]),
                "target": self.inst["target"], "max_steps": int(max_steps)}

    def run(self, design: forgetting.Design, lrs: np.ndarray, max_steps: int, seed_offset: int = 0) -> dict:
        """One design at the step sizes ``lrs`` with --seeds seeds from seed ``instance + seed_offset`` (0: the scored
        runs; PILOT_SEED: the user's recipe, disjoint from them), stored."""
        payload = self.payload(design, lrs, max_steps, seed_offset)
        found = self.store.get(payload)
        if found is not None:
            return found
        trace = to_target.run_to_target(self.env, self.setting.loss, design, lrs, self.options.seeds, self.optimizer,
                                        self.inst["target"], max_steps, seed=self.instance + seed_offset,
                                        boot_index=self.boot_index, on_step=self.tick)
        best = _best_lr(trace.crossing[0])
        return self.store.put(payload, {
            "lrs": [float(v) for v in lrs], "crossing": trace.crossing.tolist(),
            "first_touch": trace.first_touch.tolist(), "steps": trace.steps,
            "curve": trace.mean_reward[best].tolist() if best is not None else [],
            "curve_steps": trace.reward_steps.tolist()})

    def tune(self, label: str, design: forgetting.Design, start: float, max_steps: int,
             first: np.ndarray | None = None, seed_offset: int = 0) -> dict:
        """Step sizes start x sqrt(2)^(1, 0, -1, -2) (or ``first``), extended by two beyond an edge where the best
        sits (up to MAX_EXTEND rounds), then the best's two neighbours 2^(1/4) away; the merged record."""
        lrs = np.asarray(first if first is not None else start * LR_RATIO ** np.array([1.0, 0.0, -1.0, -2.0]))
        runs = [self.run(design, lrs, max_steps, seed_offset)]
        extended = 0
        while True:
            merged = _merge(runs)
            tried = np.asarray(merged["lrs"])
            best = _best_lr(np.asarray(merged["crossing"])[0])
            top = best == 0
            bottom = best is None or best == tried.size - 1
            if not (top or bottom) or extended == MAX_EXTEND:
                if best is not None and not (top or bottom) and not np.any(np.isclose(
                        tried, tried[best] * LR_RATIO ** 0.5)):  # the best's quarter-octave neighbours, once
                    runs.append(self.run(design, tried[best] * LR_RATIO ** np.array([0.5, -0.5]), max_steps,
                                         seed_offset))
                    continue
                merged.update(extended=extended, at_edge=bool(best is not None and (top or bottom)),
                              reached=best is not None, max_steps=max_steps)
                self.runs[label] = merged
                return merged
            more = tried.max() * LR_RATIO ** np.array([2.0, 1.0]) if top else tried.min() * LR_RATIO ** np.array(
                [-1.0, -2.0])
            runs.append(self.run(design, more, max_steps, seed_offset))
            extended += 1

    def tuned_lr(self, label: str) -> float | None:
        """The design's best step size; None when no step size it tried reached the target."""
        record = self.runs[label]
        best = _best_lr(np.asarray(record["crossing"])[0])
        return None if best is None else float(record["lrs"][best])

    def start_from(self, *neighbours: tuple[str, float]) -> float:
        """The first reached neighbour's tuned step size times its factor: where a design's search starts."""
        for label, factor in neighbours:
            lr = self.tuned_lr(label) if label in self.runs else None
            if lr is not None:
                return lr * factor
        raise RuntimeError(f"{self.setting.name}/{self.optimizer}/instance {self.instance}: none of "
                           f"{', '.join(n for n, _ in neighbours)} reached the target to start a search from")

    def exact_run(self, label: str, design: forgetting.Design, max_steps: int) -> dict:
        """The design's exact expected curve at every step size of a 2^(1/4) grid from 2 / L down (SGD only)."""
        L = self.inst["smoothness"]
        lrs = 2.0 / L * EXACT_LR_RATIO ** -np.arange(0, 61)
        payload = {"kind": "exact", **self.payload(design, lrs, max_steps)}
        found = self.store.get(payload)
        if found is None:
            if not isinstance(self.env, QuadraticEnv):
                raise ValueError(f"{self.setting.name}: exact expected curves need the quadratic environment")
            trace = to_target.expected_to_target(self.env, design, lrs, max_steps)
            found = self.store.put(payload, {"lrs": lrs.tolist(), "crossing": trace.crossing.tolist(),
                                             "stationary": trace.stationary.tolist(), "steps": trace.steps})
        crossing = np.asarray(found["crossing"])
        best = _best_lr(crossing)
        record = {**found, "best": best, "reached": best is not None,
                  "at_edge": bool(best is not None and best in (0, crossing.size - 1)),
                  "steps_tuned": float(crossing[best]) if best is not None else math.inf,
                  "lr_tuned": float(lrs[best]) if best is not None else None, "max_steps": max_steps}
        self.exact_runs[label] = record
        return record


class UnitNotScored(Exception):
    """A unit the protocol cannot score: its pilot, on-policy at B = 256, reaches the target at none of its step sizes,
    so no design has a reference (e.g. a two-prompts instance whose base policy is within 0.3% of J*: the seed mean
    must resolve J0 + 0.9 (J* - J0) through the noise). ``run_unit`` records it with the reason; its cells are
    counted as not scored, never dropped."""


def _best_lr(crossing: np.ndarray) -> int | None:
    """The step size whose crossing is earliest (0 = not reached); None when none reached."""
    c = np.where(np.asarray(crossing) > 0, np.asarray(crossing, dtype=float), np.inf)
    return None if not np.isfinite(c).any() else int(np.argmin(c))


def _merge(runs: list[dict]) -> dict:
    """Runs of one design at different step sizes as one record, step sizes descending."""
    lrs = np.concatenate([r["lrs"] for r in runs])
    order = np.argsort(-lrs, kind="stable")
    crossing = np.concatenate([np.asarray(r["crossing"]) for r in runs], axis=1)[:, order]
    first_touch = np.concatenate([r["first_touch"] for r in runs])[order]
    best = _best_lr(crossing[0])
    source = [(i, j) for i, r in enumerate(runs) for j in range(len(r["lrs"]))]
    curve = runs[source[order[best]][0]]["curve"] if best is not None else []
    curve_steps = runs[source[order[best]][0]]["curve_steps"] if best is not None else []
    return {"lrs": lrs[order].tolist(), "crossing": crossing.tolist(), "first_touch": first_touch.tolist(),
            "steps": max(r["steps"] for r in runs), "runs": [r["key"] for r in runs], "curve": curve,
            "curve_steps": curve_steps}


def design_steps(record: dict) -> np.ndarray:
    """(BOOTS + 1,) steps to the target at the tuned step size, per replicate (row 0: the real seeds); inf: not
    reached within the design's cap."""
    c = np.asarray(record["crossing"], dtype=float)
    return np.where(c > 0, c, np.inf).min(axis=1)


def _step_cap(options: Options, design: forgetting.Design, s_ref: float) -> int:
    """CAP_FACTOR x on-policy B = 256's steps x the largest ratio of its step cost to this design's over the cost
    models: beyond it the design costs more than CAP_FACTOR x on-policy at every mu and floor."""
    ratio = max(forgetting.step_cost(BATCH, BATCH, mu, f) / forgetting.step_cost(design.rollouts, design.batch, mu, f)
                for mu in options.mus for f in options.floors)
    return max(50, int(math.ceil(CAP_FACTOR * s_ref * ratio)))


RECIPE = f"the user's recipe: on-policy B={BATCH}"
"""The unit's runs label of the user's own step size at B: on-policy at B tuned to the target on the pilot's seeds
(PILOT_SEED + instance), disjoint from the scored on-policy B = 256. A user arrives with a step size for their batch
(a recipe, or their own earlier runs); this stands for it without reading a scored run. Its search is not counted
in the pilot's compute: the user had it before asking."""


def tune_at_batch(unit: Unit, label: str, seed_offset: int) -> float:
    """On-policy at B = 256 tuned from a coarse grid around the setting's first step size (x 2^(2 .. -3)), refined
    around its best: its seed-mean steps to the target. ``UnitNotScored`` when no step size reaches the target."""
    setting = unit.setting
    lr0 = (setting.sgd_lr0 if unit.optimizer == "sgd" else setting.adam_lr0) * unit.lr_unit
    design = forgetting.Design.on_policy_at(BATCH)
    coarse = lr0 * 2.0 ** np.array([2.0, 1.0, 0.0, -1.0, -2.0, -3.0])
    first = unit.run(design, coarse, PILOT_MAX_STEPS, seed_offset)
    best = _best_lr(np.asarray(first["crossing"])[0])
    if best is None:
        raise UnitNotScored(f"no step size of {', '.join(f'{v:.3g}' for v in coarse)} reached the target with "
                            f"on-policy B = {BATCH} in {PILOT_MAX_STEPS} steps ({label}; J* - J0 = "
                            f"{unit.inst['j_star'] - unit.inst['j0']:.3g})")
    refine = coarse[best] * LR_RATIO ** np.array([1.0, -1.0])
    merged = unit.tune(label, design, 0.0, PILOT_MAX_STEPS, first=np.concatenate([coarse, refine]),
                       seed_offset=seed_offset)
    return float(design_steps(merged)[0])


def train_unit(unit: Unit) -> None:
    """On-policy at 256 (the reference), at every smaller batch, the pinned grid; MC, and exact where exact. The
    pilot's runs (``RECIPE``, ``measure_pilot``) are apart, on their own seeds."""
    options = unit.options
    pilot = forgetting.Design.on_policy_at(BATCH)
    s_ref = tune_at_batch(unit, f"on-policy B={BATCH}", 0)
    # the exact pilot's steps, which cap every exact run below (read only when the unit is exact)
    s_ref_exact = (unit.exact_run(f"on-policy B={BATCH}", pilot, PILOT_MAX_STEPS)["steps_tuned"] if unit.exact
                   else math.nan)
    alpha = 1.0 if unit.optimizer == "sgd" else 0.5
    previous = BATCH
    for b in sorted(options.on_policy_batches, reverse=True):
        if b == BATCH:
            continue
        design = forgetting.Design.on_policy_at(b)
        start = unit.start_from((f"on-policy B={previous}", (b / previous) ** (alpha / 2)),
                                (f"on-policy B={BATCH}", (b / BATCH) ** (alpha / 2)))
        cap = _step_cap(options, design, s_ref)
        unit.tune(f"on-policy B={b}", design, start, cap)
        if unit.exact:
            unit.exact_run(f"on-policy B={b}", design, _step_cap(options, design, s_ref_exact))
        if unit.advance:
            unit.advance()
        previous = b
    xs = sorted({x for x, _ in options.grid})
    ys = sorted({y for _, y in options.grid})
    for x in xs:
        for y in ys:
            design = forgetting.Design(BATCH, BATCH // y, x * BATCH // y)
            label = f"x={x} y={y}"
            if unit.exact:  # the expected curve exactly: no seeds, no step-size search to seed
                unit.exact_run(label, design, _step_cap(options, design, s_ref_exact))
            else:
                # start next to the nearest design already tuned: the shorter horizon at this y, else the smaller y
                # at this horizon, else on-policy at B scaled down by sqrt(y) (a design none of whose neighbours
                # reached the target)
                neighbours = [(f"x={xs[xs.index(x) - 1]} y={y}", 1.0)] if x != xs[0] else []
                if y != ys[0]:
                    neighbours.append((f"x={x} y={ys[ys.index(y) - 1]}", LR_RATIO ** -1))
                neighbours.append((f"on-policy B={BATCH}", y ** -0.5))
                start = unit.start_from(*neighbours)
                unit.tune(label, design, start, _step_cap(options, design, s_ref))
            if unit.advance:
                unit.advance()


# --------------------------------------------------------------------------- the inputs, measured


def sample_grads(env, setting: Setting, theta: np.ndarray, behaviour: np.ndarray, groups: int,
                 rng: np.random.Generator) -> np.ndarray:
    """Per-sample LOSS gradients (M, d) at ``theta`` (1, d) on M = groups x 8 fresh responses of ``behaviour``
    (rollout settings: the trained loss's per-sample terms, whose batch mean is a step's gradient), or M noisy
    quadratic samples (behaviour ignored: a sample's noise does not depend on who drew it)."""
    if isinstance(env, QuadraticEnv):
        return env.sample_grads(theta, env.noise(rng, (1, groups * GROUP)))[0]
    assert setting.loss is not None  # only the quadratic's settings have no loss, and it returned above
    config = config_from_dict({"buffer": "on-policy", "pipeline": "sync", "capacity": BATCH,
                               "rollouts_per_step": BATCH, "batch_size": BATCH, "group_size": GROUP,
                               "loss": setting.loss[0], "advantage": setting.loss[1], "optimizer": "sgd", "seeds": 1})
    prompts = np.repeat(rng.integers(0, env.num_prompts, size=(1, groups)), GROUP, axis=1)  # (1, M)
    tokens, logp, mask = env.sample(behaviour, prompts, rng)
    reward = env.reward(prompts, tokens, mask)
    M = prompts.shape[1]
    batch = score(config, prompts, tokens, mask, logp, reward, np.zeros((1, M), np.int64),
                  np.repeat(np.arange(groups), GROUP)[None])
    logp_new = env.logp(theta, prompts, tokens, mask)
    coef = compute_loss(config, batch, logp_new).grad_logp[0, :, 0] * M  # (M,) undo the 1/M token mean
    pi = np.exp(env.log_policy(theta))[0, prompts[0]]  # (M, A)
    feats = env.features[prompts[0]]  # (M, A, d)
    centred = feats[np.arange(M), tokens[0, :, 0]] - np.einsum("ma,mad->md", pi, feats)
    return coef[:, None] * centred  # (M, d) d loss / d theta per sample


def pilot_steps(recipe_steps: float) -> int:
    """The pilot's length in steps: the most P whose steps and curvature steps (each counted as one more step: its
    three HVPs over 64 samples cost 384 sample-updates, one step of B = 256 at mu = 0.5 and less than one at any
    larger mu) fit in PILOT_FRACTION of the recipe's steps to the target; one step when not even that fits (a run
    that reaches the target in under 20 steps: the pilot then costs more than the fraction, and the tables say so)."""
    budget = int(PILOT_FRACTION * recipe_steps)
    fits = [p for p in range(1, budget + 1) if p + -(-p // CURVATURE_EVERY) <= budget]
    return max(fits, default=1)


def measure_pilot(unit: Unit) -> dict:
    """The rule's inputs from a pilot a user can afford: ONE run (seed PILOT_SEED + instance, disjoint from every scored
    run) of on-policy at B = 256 at the user's recipe step size (``RECIPE``), for PILOT_FRACTION of the recipe's own
    steps to the target with its curvature steps (``pilot_steps``). Every step's batch gives the two-batch B_simple
    (its halves and the whole: no extra rollouts); every CURVATURE_EVERY-th step, counted from the last, gives two
    curvature pairs (the batch's quarters) and the B_crit terms (three HVPs, counted in the pilot's compute); the drift
    M2(s) is read on the run's own trajectory at ages up to its length. Nothing here reads a scored run
    (``tests/unit/test_theory_test_pilot`` perturbs them and checks)."""
    lr = unit.tuned_lr(RECIPE)
    if lr is None:
        raise UnitNotScored(f"{RECIPE} reached the target at no step size: the user has no step size to run a pilot at")
    s_user = float(design_steps(unit.runs[RECIPE])[0])
    steps = pilot_steps(s_user)
    payload = {"kind": "pilot", "setting": unit.setting.name, "optimizer": unit.optimizer,
               "instance": unit.instance, "lr": lr, "steps": steps, "runs": PILOT_RUNS, "seed": PILOT_SEED,
               "curvature_every": CURVATURE_EVERY, "version": 2,
               **({"noise_stream": "per pilot"} if isinstance(unit.env, NoisyRewardBandit) else {})}
    found = unit.store.get(payload)
    if found is not None:
        return found
    env = unit.env
    if isinstance(env, NoisyRewardBandit):  # the measurements' verifier noise keyed by the pilot alone
        env = env.with_noise_stream(271828, unit.instance)
    curvature_steps = {t for t in range(steps) if (steps - 1 - t) % CURVATURE_EVERY == 0}
    rng = np.random.default_rng([unit.instance, PILOT_SEED, len(unit.setting.name)])
    history, small, big, num, den, ghg, exact_num, exact_den, dots, sq = ([] for _ in range(10))
    previous = {}

    def precondition(optimizer, grad: np.ndarray) -> np.ndarray:  # (runs, d) the D of this step's update (SGD: 1)
        if unit.optimizer == "sgd":
            return np.ones_like(grad)
        # the second moment this step's update divides by: the state after it folds in this gradient (before the
        # first update the state is empty and 1 / eps would stand for D)
        second = optimizer.beta2 * optimizer.second + (1 - optimizer.beta2) * grad**2
        return 1.0 / (np.sqrt(second / (1 - optimizer.beta2 ** (optimizer.count + 1))) + optimizer.eps)

    def observer(step: int, params: np.ndarray, grad: np.ndarray, optimizer) -> None:
        history.append(params.copy())  # (runs, d): the parameters before update ``step`` (0-based)
        precond = precondition(optimizer, grad)
        # Adam's update is lr D m: in z = D^(-1/2) theta it is momentum SGD on D^(1/2) g (theory.forgetting)
        g = grad * np.sqrt(precond)  # (runs, d)
        if "g" in previous:
            dots.append(float(np.einsum("sd,sd->", g, previous["g"])))
            sq.append(float(np.einsum("sd,sd->", previous["g"], previous["g"])))
        previous["g"] = g
        for run in range(PILOT_RUNS):
            theta, d_vec = params[run][None], precond[run]
            # the step's batch: B = 256 fresh samples of the current policy, distributed as the training batch (a
            # trainer reads its own batch; the simulator's loop does not hand it out)
            grads = sample_grads(env, unit.setting, theta, theta, BATCH // GROUP, rng)  # (256, d)
            halves = grads.reshape(2, BATCH // 2, -1).mean(axis=1)  # (2, d) whole groups: 16 of 8 each
            whole = grads.mean(axis=0)
            for h in halves:  # McCandlish's two-batch pair: each half against the whole batch
                small.append(float(h @ h))
                big.append(float(whole @ whole))
            if step not in curvature_steps:
                continue
            quarters = grads.reshape(4, BATCH // 4, -1).mean(axis=1)  # (4, d)
            for xi in (quarters[0] - quarters[1], quarters[2] - quarters[3]):  # E xi xi^T = 8 Sigma / B
                v = d_vec * xi  # D xi
                num.append(float(v @ _hvp(env, theta, v)))
                den.append(float(xi @ (d_vec * xi)))
            u = d_vec * whole  # D g: E[g^T D H D g] = G^T D H D G + tr(D H D Sigma) / B
            ghg.append(float(u @ _hvp(env, theta, u)))
            a, b = _kappa_parts(env, unit.setting, theta, d_vec, rng)
            exact_num.append(a)
            exact_den.append(b)

    to_target.run_to_target(env, unit.setting.loss, forgetting.Design.on_policy_at(BATCH), [lr], PILOT_RUNS,
                            unit.optimizer, math.inf, steps, seed=PILOT_SEED + unit.instance, observer=observer)
    pairs = curvature_pairs_kappa(num, den, lr, np.random.default_rng([unit.instance, 31]), unit.optimizer)
    try:
        lag = forgetting.kappa_from_gradient_series(dots, sq, np.random.default_rng([unit.instance, 37]),
                                                    optimizer=unit.optimizer, beta1=BETA1,
                                                    pilot_batch=BATCH).to_dict()
    except ValueError as err:
        lag = {"kappa": None, "reason": str(err),
               "lag1_autocorrelation": float(np.sum(dots) / np.sum(sq)) if sq and np.sum(sq) > 0 else None}
    kappa_exact = lr * float(np.sum(exact_num) / np.sum(exact_den))  # weighted by noise power, as the pairs are
    b_simple = noise_scale_lib.pooled_two_batch(small, big, BATCH // 2, BATCH, rng, n_boot=BOOTS)
    trajectory = np.asarray(history)  # (steps, runs, d)
    profile = (measure_staleness(env, unit.setting, trajectory[:, 0], unit.instance)
               if not isinstance(env, QuadraticEnv) else None)
    drift = None if isinstance(env, QuadraticEnv) else measure_drift(env, trajectory)
    hvps = 3 * len(curvature_steps) * PILOT_RUNS
    result = {"lr": lr, "steps": steps, "runs": PILOT_RUNS, "recipe_steps": s_user,
              "curvature_steps": sorted(curvature_steps), "hvps": hvps,
              "what": f"one run of on-policy B = {BATCH} (seed {PILOT_SEED} + instance, disjoint from the scored runs) "
                      f"at the recipe's step size for {steps} step(s) = {100 * steps / s_user:.1f}% of the recipe's "
                      f"steps to the target",
              "kappa_exact": kappa_exact,
              "kappa_exact_what": ("exact: lr sum tr(D H D Sigma) / sum tr(D Sigma) over the curvature steps"
                                   if isinstance(env, QuadraticEnv) else "reference: lr sum tr(D H D Sigma) / sum "
                                   "tr(D Sigma), H exact, Sigma from 4,096 samples per point"),
              "kappa_pairs": pairs, "kappa_lag": lag, "staleness": profile, "drift": drift,
              "b_simple": {**b_simple.to_dict(),
                           "what": "two-batch B_simple of every pilot step's batch (each half of 128 against the whole "
                                   "256, whole groups), pooled over the steps"},
              "b_crit": b_crit_record(num, ghg)}
    return unit.store.put(payload, result)


def b_crit_record(num: list[float], ghg: list[float]) -> dict:
    """McCandlish's B_crit = tr(D H D Sigma) / (G^T D H D G) from the pilot's HVPs (App. D: the noise scale that
    counts curvature; D = 1 for SGD, Adam's preconditioner otherwise). Per curvature step, two quarter-batch pairs give
    E[(D xi)^T H (D xi)] = 8 tr(D H D Sigma) / B and the whole batch's gradient E[(D g)^T H (D g)] = G^T D H D G +
    tr(D H D Sigma) / B, so tr(D H D Sigma) = B/8 mean(num) and G^T D H D G = mean(ghg) - mean(num) / 8 (unbiased;
    pooled over the steps before dividing). None with the reason when the curvature along G is not resolved > 0."""
    if not num or not ghg:
        return {"b_noise": None, "reason": "no curvature step"}
    trace = BATCH / 8 * float(np.mean(num))
    signal = float(np.mean(ghg)) - float(np.mean(num)) / 8
    if not (trace > 0 and signal > 0):
        return {"b_noise": None, "trace_h_sigma": trace, "g_h_g": signal,
                "reason": "tr(H Sigma) or G^T H G estimated <= 0 (the noise swamps the curvature along G)"}
    return {"b_noise": trace / signal, "trace_h_sigma": trace, "g_h_g": signal, "pairs": len(num)}


def curvature_pairs_kappa(num: list[float], den: list[float], lr: float, rng: np.random.Generator,
                          optimizer: str) -> dict:
    """kappa from the curvature pairs (``forgetting.kappa_from_curvature_pairs``) as the pilot records it, with
    ``pairs_without_noise``: a pair whose two minibatch gradients are equal (xi = 0: every prompt group's rewards
    equal, so no advantage; a policy that has converged on an easy instance) adds 0 to both of the estimate's sums,
    so it is left out and counted, the estimate unchanged (as ``theory.profiles.curvature_pairs_record`` and
    calibrate-simulator do). Fewer than 2 pairs with noise: no kappa, and the reason (the rule then gives no pick)."""
    num_a, den_a = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    keep = den_a > 0
    without = int((~keep).sum())
    if keep.sum() < 2:
        return {"kappa": None, "kappa_interval": [None, None], "method": "curvature-pairs", "optimizer": optimizer,
                "units": int(keep.sum()), "pairs_without_noise": without,
                "reason": f"{int(keep.sum())} of {den_a.size} curvature pairs have a gradient difference xi != 0 (the "
                          f"minibatch gradients were equal: no reward variation within their prompt groups); need >= 2"}
    estimate = forgetting.kappa_from_curvature_pairs(num_a[keep], den_a[keep], lr, rng, optimizer=optimizer,
                                                     beta1=BETA1, pilot_batch=BATCH)
    return {**estimate.to_dict(), "pairs_without_noise": without}


def _hvp(env, theta: np.ndarray, v: np.ndarray) -> np.ndarray:
    """H v of the loss F = -J at theta: exact on the quadratic (H diagonal), central differences of the exact
    gradient on a rollout environment (the expected loss's Hessian, what a minibatch HVP estimates)."""
    if isinstance(env, QuadraticEnv):
        return env.curvature * v
    eps = 1e-4 / max(float(np.linalg.norm(v)), 1e-300)
    g = env.exact_grad(np.concatenate([theta + eps * v, theta - eps * v]))  # (2, d) ascent
    return -(g[0] - g[1]) / (2 * eps)


def _kappa_parts(env, setting: Setting, theta: np.ndarray, d_vec: np.ndarray,
                 rng: np.random.Generator) -> tuple[float, float]:
    """(tr(D H D Sigma), tr(D Sigma)) at theta: exact on the quadratic (Sigma = diag(noise_var)); on a rollout
    environment H exact and Sigma from 512 groups (the group mean is the independent unit, scaled to one sample)."""
    if isinstance(env, QuadraticEnv):
        h, var = env.curvature, env.noise_var
        return float(np.sum(d_vec * h * d_vec * var)), float(np.sum(d_vec * var))
    grads = sample_grads(env, setting, theta, theta, 512, rng).reshape(512, GROUP, -1).mean(axis=1)
    sigma = GROUP * np.cov(grads, rowvar=False)  # (d, d) per sample, as the pairs' xi (B = 256 samples) scale
    hess = exact_hessian(env, theta)
    dm = np.diag(d_vec)
    return float(np.trace(dm @ hess @ dm @ sigma)), float(np.trace(dm @ sigma))


def measure_drift(env, trajectory: np.ndarray) -> dict:
    """The exact drift of the policy at the pilot's last step T from itself s steps earlier, on its trajectory
    (T + 1, runs, d), at the ages s in STALENESS up to T and T itself (a pilot sees no older policy: the rule's
    ``Staleness`` extends the table beyond along its last slope, and says so): M2(s) = E_behav[(log pi_T / pi_{T-s})^2]
    (M2PO's statistic; about chi^2 and 2 KL for a small drift, without chi^2's heavy tail). 1 + M2(s) is the variance
    factor of an importance weight at age s that the forgetting rule's staleness cost reads (on a real run:
    diagnose's m2 by age). chi^2 and KL beside it. A one-step pilot has no age > 0: no table, and the reason."""
    T, runs = trajectory.shape[0] - 1, trajectory.shape[1]
    ages = sorted({s for s in STALENESS if s <= T} | {T})
    if len(ages) < 2:
        return {"staleness": ages, "m2": [0.0], "chi2": [0.0], "kl_new_behav": [0.0], "checkpoints": [T],
                "runs": runs, "reason": "the pilot is one step long: no older policy to measure the drift from"}
    rows = {"m2": [], "chi2": [], "kl_new_behav": []}
    for s in ages:
        div = env.exact_divergences(trajectory[T], trajectory[T - s])  # each (runs,)
        for key in rows:
            rows[key].append(float(np.mean(div[key])))
    return {"staleness": ages, **rows, "checkpoints": [T], "runs": runs}


def measure_staleness(env, setting: Setting, history: np.ndarray, instance: int) -> dict:
    """sigma^2(s) on the pilot's trajectory (T + 1, d) with behaviour theta_{t-s}, in both forms (plain E||G -
    grad F||^2 for the unbiased IS loss; signal-normalised Var / c(s)^2 for the clipped loss, c(s) the share of the
    fresh signal a stale sample keeps), and the stale gradients' bias (the paper's kappa, Assumption 3.2)."""
    rng = np.random.default_rng([instance, 104729])
    T = history.shape[0] - 1
    checkpoints = sorted({T // 3, 2 * T // 3, T})  # ages beyond a checkpoint read the pilot's start (said below)
    plain, normalised, retained, biases = [], [], [], []
    for t in checkpoints:
        theta = history[t][None]
        exact = -env.exact_grad(theta)[0]  # loss gradient
        fresh = sample_grads(env, setting, theta, theta, 512, rng)
        g0, var0 = fresh.mean(axis=0), float(((fresh - fresh.mean(axis=0)) ** 2).sum(axis=1).mean())
        if not g0 @ g0 > 0:
            continue
        row_p, row_n, row_c = [], [], []
        for s in STALENESS:
            behaviour = history[max(t - s, 0)][None]
            grads = fresh if s == 0 else sample_grads(env, setting, theta, behaviour, 512, rng)
            mean = grads.mean(axis=0)
            var = float(((grads - mean) ** 2).sum(axis=1).mean())
            row_p.append(float(((grads - exact) ** 2).sum(axis=1).mean()))
            c = float(mean @ g0 / (g0 @ g0))
            row_c.append(c)
            row_n.append(var / max(c, 0.05) ** 2)  # c -> 0: a stale sample carries nothing; capped at 1/0.05^2
            gap = float(np.linalg.norm(history[t] - behaviour[0]))
            if s >= 4 and gap > 0:
                bias_sq = float(((mean - g0) ** 2).sum()) - (var + var0) / grads.shape[0]
                biases.append(math.sqrt(max(bias_sq, 0.0)) / gap)
        plain.append(row_p)
        normalised.append(row_n)
        retained.append(row_c)
    if not plain:
        return {"staleness": list(STALENESS), "plain": None, "reason": "no checkpoint with a fresh signal"}
    return {"staleness": list(STALENESS), "plain": np.mean(plain, axis=0).tolist(),
            "normalised": np.mean(normalised, axis=0).tolist(), "retained": np.mean(retained, axis=0).tolist(),
            "bias": float(np.max(biases)) if biases else 0.0, "checkpoints": checkpoints,
            "ages_measured_up_to": T, "older": "an age beyond a checkpoint's step reads the pilot's first policy"}


def fit_noise_scale(steps: np.ndarray, batches: np.ndarray) -> tuple[float, float]:
    """(S_min, B_noise) of S(B) = S_min (1 + B_noise / B) over the finite entries (McCandlish Eq. 2.7): least squares
    in 1/B with weights 1/S (a step count's error grows with it, so the small batches' long runs would otherwise
    decide the fit); B_noise = inf when S_min <= 0 (steps fall at least as fast as 1/B); nan with fewer than 4
    finite batches."""
    ok = np.isfinite(steps)
    if ok.sum() < 4:
        return math.nan, math.nan
    slope, intercept = np.polyfit(1.0 / batches[ok], steps[ok], 1, w=1.0 / steps[ok])
    return float(intercept), float(slope / intercept) if intercept > 0 else math.inf


def b_noise_kind(value: float) -> str:
    """How a fitted B_noise is to be read (the JSON keeps inf and nan as null; this says which)."""
    if math.isnan(value):
        return "not measurable: fewer than 4 on-policy batches reached the target"
    if math.isinf(value):
        return "infinite: S_min <= 0, steps fall at least as fast as 1/B (every sample counts)"
    if not value > 0:
        return "not positive: the steps do not fall with the batch; the rules that read B_noise give no pick"
    return "finite"


def measure_noise_scale(unit: Unit) -> dict:
    """b from the seed-mean on-policy steps at every batch (seed-bootstrap interval, the step size re-tuned in each
    replicate), and on the quadratic from the exact expected curves."""
    batches = np.array(sorted(unit.options.on_policy_batches), dtype=float)
    steps = np.stack([design_steps(unit.runs[f"on-policy B={int(b)}"]) for b in batches], axis=1)  # (BOOTS+1, nB)
    fits = [fit_noise_scale(row, batches) for row in steps]
    s_min, b_noise = fits[0]
    boots = np.array([f[1] for f in fits[1:]])
    ranked = np.where(np.isnan(boots), np.inf, boots)
    lo, hi = float(np.quantile(ranked, 0.05, method="lower")), float(np.quantile(ranked, 0.95, method="higher"))
    out = {"batches": batches.tolist(), "steps": steps[0].tolist(), "s_min": s_min, "b_noise": b_noise,
           "b_noise_kind": b_noise_kind(b_noise), "b": b_noise / BATCH, "b_interval": [lo / BATCH, hi / BATCH],
           "censored_batches": [int(b) for b, s in zip(batches, steps[0]) if not np.isfinite(s)]}
    lrs = [unit.tuned_lr(f"on-policy B={int(b)}") for b in batches]
    out["tuned_lr"] = lrs
    if isinstance(unit.env, QuadraticEnv):
        exact_steps = []
        pilot = unit.exact_runs.get(f"on-policy B={BATCH}") or unit.exact_run(
            f"on-policy B={BATCH}", forgetting.Design.on_policy_at(BATCH), PILOT_MAX_STEPS)
        for b in batches:
            design = forgetting.Design.on_policy_at(int(b))
            record = unit.exact_runs.get(f"on-policy B={int(b)}") or unit.exact_run(
                f"on-policy B={int(b)}", design, _step_cap(unit.options, design, pilot["steps_tuned"]))
            exact_steps.append(record["steps_tuned"])
        es_min, eb_noise = fit_noise_scale(np.array(exact_steps), batches)
        out.update(exact_steps=exact_steps, exact_s_min=es_min, exact_b_noise=eb_noise, b_exact=eb_noise / BATCH,
                   exact_b_noise_kind=b_noise_kind(eb_noise),
                   exact_what="SGD's exact expected curves (under Adam: SGD's, for reference)")
        env = unit.env
        flow = env.flow_b_noise(env.target_time / 2)
        grad = env.curvature * env.start_offset * np.exp(-env.curvature * env.target_time / 2)
        out["b_simple"] = float(flow) / BATCH
        out["b_crit"] = float(np.sum(env.curvature * env.noise_var) / np.sum(env.curvature * grad**2)) / BATCH
    return out


def read_b_noise(noise: dict, exact: bool = False) -> float:
    """B_noise from a saved record: its value, inf or nan as its ``*_kind`` says (JSON keeps both as null)."""
    key = "exact_b_noise" if exact else "b_noise"
    if key not in noise:
        return math.nan
    kind = noise.get(f"{key}_kind", "finite")
    if kind.startswith("infinite"):
        return math.inf
    return math.nan if noise[key] is None else float(noise[key])


def measured_alpha(noise: dict) -> float | None:
    """The exponent of the tuned step's fall with the noise: eta_B ~ (1 + B_noise / B)^-alpha over the on-policy
    batches (least squares in logs); None when B_noise is not finite."""
    b_noise = read_b_noise(noise)
    if not math.isfinite(b_noise) or b_noise <= 0:
        return None
    batches = np.asarray(noise["batches"])
    lrs = np.array([math.nan if v is None else v for v in noise["tuned_lr"]], dtype=float)  # None: not reached
    ok = np.isfinite(np.asarray(noise["steps"]))
    if ok.sum() < 3:
        return None
    return float(-np.polyfit(np.log1p(b_noise / batches[ok]), np.log(lrs[ok]), 1)[0])


def calibration_record(unit: Unit, pilot: dict) -> dict:
    """The paper's inputs (J and the Thm 3.4 bound): sigma^2(s), its bias kappa, L, F0; rho = 0 (independent draws
    up to the group, whose correlation scales the 1/B and 1/N terms alike)."""
    inst = unit.inst
    base = {"smoothness": inst["smoothness"], "f0": inst["j_star"] - inst["j0"], "rho": 0.0,
            "staleness": list(STALENESS)}
    prof = pilot.get("staleness")
    if prof is None or prof.get("plain") is None:  # the quadratic: tr Sigma at every staleness, no bias
        trace = float(getattr(unit.env, "trace_sigma", 1.0))
        return {**base, "sigma_sq": [trace] * len(STALENESS), "bias": 0.0, "form": "exact (flat)"}
    assert unit.setting.loss is not None  # a measured profile: a rollout environment, whose setting has its loss
    unbiased = unit.setting.loss[0] == "no-trust-region"
    return {**base, "sigma_sq": prof["plain"] if unbiased else prof["normalised"],
            "bias": 0.0 if unbiased else prof["bias"], "form": "plain" if unbiased else "signal-normalised"}


def design_row(unit: Unit, label: str, design: forgetting.Design) -> dict:
    """A trained design's row of the unit record: its steps per replicate (exact: the one exact value), step size,
    and flags."""
    spec = [design.batch, design.rollouts, design.capacity, design.on_policy]
    if unit.exact:
        ex = unit.exact_runs[label]
        return {"label": label, "design": spec, "steps": [ex["steps_tuned"]], "reached": ex["reached"],
                "at_edge": ex["at_edge"], "lr": ex["lr_tuned"],
                "stationary_at_lr": ex["stationary"][ex["best"]] if ex["reached"] else None, "extended": 0,
                "hovered": False}
    record = unit.runs[label]
    steps = design_steps(record)
    best = _best_lr(np.asarray(record["crossing"])[0])
    touch = record["first_touch"][best] if best is not None else 0
    return {"label": label, "design": spec, "steps": steps.tolist(), "reached": record["reached"],
            "at_edge": record["at_edge"], "lr": record["lrs"][best] if best is not None else None,
            "extended": record["extended"], "hovered": bool(best is not None and 0 < touch < 0.8 * steps[0]),
            "curve": record["curve"], "curve_steps": record["curve_steps"]}


def pilot_query(pilot: dict, optimizer: str, mu: float, floor: float,
                max_steps_ratio: float = 2.0) -> tuple[advice.Query, list[str]]:
    """The query ``replay-theory optimal`` gets from this pilot's numbers (``-B 256 --noise-scale B_simple --kappa
    kappa --optimizer OPT --group-size 8 --latency-floor FLOOR`` and the drift table a profile carries), and what was
    left out and why: a B_simple not resolved > 0 (optimal then says to stay at B), a kappa optimal refuses (outside
    [KAPPA_MIN, the optimizer's stability limit): the user asks again without it)."""
    from ..theory.optimal import KAPPA_MIN

    notes = []
    b_noise = (pilot.get("b_simple") or {}).get("b_noise")
    if b_noise is None or not (math.isfinite(b_noise) and b_noise > 0):
        notes.append(f"B_simple {b_noise}: not resolved > 0, no --noise-scale")
        b_noise = None
    kappa = (pilot.get("kappa_pairs") or {}).get("kappa")
    if kappa is not None and not KAPPA_MIN <= kappa < forgetting.stable_kappa(optimizer, BETA1):
        notes.append(f"kappa {kappa:.3g}: outside optimal's range, no --kappa")
        kappa = None
    elif kappa is None:
        notes.append("no kappa from the pilot")
    drift = pilot.get("drift")
    staleness = (forgetting.Staleness(tuple(float(s) for s in drift["staleness"]),
                                      tuple(1.0 + float(c) for c in drift["m2"]), "1 + M2(s) on the pilot")
                 if drift and len(drift["staleness"]) >= 2 else forgetting.NO_STALENESS)
    query = advice.Query(mu=float(mu), batch=BATCH, b_noise=b_noise, b_noise_source="the pilot's B_simple",
                         kappa=kappa, kappa_source="the pilot's curvature pairs", optimizer=optimizer, beta1=BETA1,
                         pilot_batch=BATCH, group_size=GROUP, floor=float(floor), staleness=staleness,
                         max_steps_ratio=float(max_steps_ratio))
    return query, notes


def printed_design(pilot: dict, optimizer: str, mu: float, floor: float,
                   max_steps_ratio: float = 2.0) -> forgetting.Design:
    """The design ``optimal`` answers with for this pilot and cell (``theory.advice.advise``: the steps cap
    ``--max-steps-ratio``, the horizon cap, whole groups; on-policy at B when it has no B_noise to answer from)."""
    query, _ = pilot_query(pilot, optimizer, mu, floor, max_steps_ratio)
    key = repr(query)  # every input of the answer (a frozen dataclass's repr): the cells of a unit share answers
    if key not in _PRINTED:
        answer = advice.advise(query)
        _PRINTED[key] = (forgetting.Design.on_policy_at(BATCH) if not answer.get("measured") else forgetting.Design(
            int(answer["batch_size"]), int(answer["rollouts_per_step"]), int(answer["capacity"]),
            answer["regime"] == "on-policy"))
    return _PRINTED[key]


_PRINTED: dict[str, forgetting.Design] = {}
"""printed_design's answers by query (advise searches thousands of designs; scoring asks the same query per row)."""


def _nearest_label(unit: Unit, design: forgetting.Design) -> tuple[str, float]:
    """The tuned grid design nearest to ``design`` (log distance in B, x and y; on-policy to on-policy) and the factor
    that scales its step size to ``design``'s batch (the on-policy batches' sqrt rule: B^(alpha / 2))."""
    alpha = 1.0 if unit.optimizer == "sgd" else 0.5
    grid = unit.options.designs()
    same = [(label, d) for label, d in grid if d.on_policy == design.on_policy] or grid

    def distance(d: forgetting.Design) -> float:
        return (math.log(d.batch / design.batch) ** 2 + math.log(d.x / design.x) ** 2
                + math.log(d.y / design.y) ** 2)

    label, near = min(same, key=lambda item: distance(item[1]))
    return label, (design.batch / near.batch) ** (alpha / 2)


def train_printed(unit: Unit, pilot: dict) -> list[tuple[str, forgetting.Design]]:
    """Train every design ``optimal`` prints for this unit's pilot over the cells (mu, floor) at each
    ``PRINTED_STEPS_RATIOS`` that is not in the grid:
    the printed answer is scored as printed, off the grid where it falls. Its step size is searched as the grid's
    are (from the nearest tuned design), to the same caps."""
    options = unit.options
    on_grid = {(d.batch, d.rollouts, d.capacity) for _, d in options.designs()}
    s_ref = float(design_steps(unit.runs[f"on-policy B={BATCH}"])[0])
    s_ref_exact = unit.exact_runs[f"on-policy B={BATCH}"]["steps_tuned"] if unit.exact else math.nan
    out: list[tuple[str, forgetting.Design]] = []
    cells = [(mu, floor, ratio) for ratio in printed_ratios(options) for mu in options.mus for floor in options.floors]
    for mu, floor, ratio in cells:
        design = printed_design(pilot, unit.optimizer, mu, floor, ratio)
        key = (design.batch, design.rollouts, design.capacity)
        if key in on_grid or any(key == (d.batch, d.rollouts, d.capacity) for _, d in out):
            continue
        label = printed_label(design)
        if unit.exact:
            unit.exact_run(label, design, _step_cap(options, design, s_ref_exact))
        else:
            near, factor = _nearest_label(unit, design)
            start = unit.start_from((near, factor), (f"on-policy B={BATCH}", (design.batch / BATCH) ** 0.5))
            unit.tune(label, design, start, _step_cap(options, design, s_ref))
        out.append((label, design))
    return out


def printed_ratios(options: Options) -> tuple[float, ...]:
    """The --max-steps-ratio values whose printed answers a unit trains: both, or with --quick the default alone."""
    return PRINTED_STEPS_RATIOS[:1] if options.quick else PRINTED_STEPS_RATIOS


def printed_label(design: forgetting.Design) -> str:
    if design.on_policy:
        return f"printed: on-policy B={design.batch}"
    return f"printed: B={design.batch} R={design.rollouts} N={design.capacity}"


def run_unit(out: str, setting_name: str, optimizer: str, instance: int, options: Options,
             tick: Callable[[], None] | None = None, advance: Callable[[], None] | None = None) -> dict:
    """Train and measure one unit (resuming from OUT/runs), and return its record: every design's steps per seed
    replicate and every measured input. What scoring reads; nothing in it depends on mu or the floor."""
    started = time.time()
    store = Store(Path(out))
    setting = SETTINGS[setting_name]
    boot_index = np.random.default_rng([instance, 8191, len(setting_name), OPTIMIZERS.index(optimizer)]).integers(
        0, options.seeds, size=(BOOTS, options.seeds))
    with threadpool_limits(limits=1, user_api="blas"):
        env, inst = instance_record(store, setting, instance)  # run_theory_test stored it before dispatch
        unit = Unit(setting, optimizer, instance, env, inst, store, options, boot_index, tick, advance,
                    exact=isinstance(env, QuadraticEnv) and optimizer == "sgd")
        try:
            train_unit(unit)
            noise = measure_noise_scale(unit)
            tune_at_batch(unit, RECIPE, PILOT_SEED)
            pilot = measure_pilot(unit)
            printed = train_printed(unit, pilot)
        except UnitNotScored as why:
            return strict({"setting": setting_name, "optimizer": optimizer, "instance": instance, "exact": unit.exact,
                           "target": inst["target"], "j0": inst["j0"], "j_star": inst["j_star"], "designs": [],
                           "not_scored": str(why), "elapsed_s": round(time.time() - started, 1)})
    rows = [design_row(unit, label, design) for label, design in options.designs()]
    printed_rows = [design_row(unit, label, design) for label, design in printed]
    return strict({"setting": setting_name, "optimizer": optimizer, "instance": instance, "exact": unit.exact,
                   "target": inst["target"], "j0": inst["j0"], "j_star": inst["j_star"], "designs": rows,
                   "printed": printed_rows, "printed_ratios": list(printed_ratios(options)), "noise": noise,
                   "alpha_measured": measured_alpha(noise), "pilot": pilot,
                   "calibration": calibration_record(unit, pilot), "elapsed_s": round(time.time() - started, 1)})


# --------------------------------------------------------------------------- the objectives


def _designs_of(record: dict) -> list[forgetting.Design]:
    return [forgetting.Design(int(b), int(r), int(n), bool(op)) for b, r, n, op in (d["design"] for d in
                                                                                    record["designs"])]


def staleness_of(record: dict) -> forgetting.Staleness:
    """r(s) = 1 + M2(s), the exact drift of the pilot's policy over s steps (rollout settings), or none (the
    quadratic: a stored sample's gradient is exact at the current theta but for its fixed noise; a one-step pilot,
    which saw no older policy)."""
    drift = record["pilot"].get("drift")
    if not drift or len(drift["staleness"]) < 2:  # the quadratic, or a one-step pilot (its record says so)
        return forgetting.NO_STALENESS
    return forgetting.Staleness(tuple(float(s) for s in drift["staleness"]),
                                tuple(1.0 + float(c) for c in drift["m2"]), "1 + M2(s) on the pilot, exact")


@dataclass(frozen=True)
class NoPick:
    """An objective that gives no pick in a cell: why, in a few words (what the tables and the counts name), and the
    detail. Scored as a miss (``_objective_target``): it stays in the cells counted, never within 1.2x or 1.5x."""

    reason: str
    detail: str


def b_noise_no_pick(b_noise: float) -> NoPick | None:
    """Why a rule that reads B_noise has no pick at this B_noise (None: it has one). B_noise must be > 0 (McCandlish's
    S = S_min (1 + B_noise / B); ``theory.noise_scale`` and ``theory.forgetting`` refuse anything else): a fit at or
    below 0 (steps that do not fall with the batch, e.g. -2e-14 from steps equal at every batch) is said, never
    clamped to a small positive value. inf is an answer (steps fall as fast as 1/B)."""
    if math.isnan(b_noise):
        return NoPick("B_noise not measured", b_noise_kind(b_noise))
    if not b_noise > 0:
        return NoPick("B_noise fitted at <= 0", f"B_noise = {b_noise:.3g}: the on-policy steps do not fall with the "
                                                "batch, outside the rule's B_noise > 0")
    return None


def rule_values(designs: list[forgetting.Design], b_noise: float, kappa: float | None, optimizer: str,
                mu: float, floor: float, staleness: forgetting.Staleness,
                kappa_reason: str | None = None) -> np.ndarray | NoPick:
    """The forgetting-aware rule's predicted compute of every design (units S_min x one sample-update); NoPick without
    its inputs (B_noise not measurable or not > 0, no kappa: ``kappa_reason`` says why). B_noise = inf (steps fall as
    fast as 1/B): the noise-limited limit, V_eff m(x) x cost."""
    no_pick = b_noise_no_pick(b_noise)
    if no_pick is not None:
        return no_pick
    if kappa is None or math.isnan(kappa):
        return NoPick("kappa not measured", kappa_reason or "no kappa from the pilot")
    # curvature along the noise <= 0: the optimizer does not contract the noise there, it never forgets (psi = 1)
    memory = forgetting.Memory(float(kappa), optimizer, BETA1, float(BATCH)) if kappa > 0 else None
    if math.isinf(b_noise):  # kappa_d -> 0 with the noise: psi -> 1, steps ~ B_noise V m
        preds = forgetting.predict_many(designs, 1.0, mu, None, staleness, floor)
        return np.array([(p.steps - 1) * p.cost_per_step for p in preds])
    preds = forgetting.predict_many(designs, float(b_noise), mu, memory, staleness, floor)
    return np.array([p.compute for p in preds])


Designs = list[forgetting.Design]


def _forgetting_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray | NoPick:
    """The forgetting-aware rule from the pilot's estimates: B_noise, kappa from curvature pairs, r(s) = 1 + M2(s)."""
    pairs = record["pilot"].get("kappa_pairs") or {}
    return rule_values(designs, read_b_noise(record["noise"]), pairs.get("kappa"), record["optimizer"], mu, floor,
                       staleness_of(record), pairs.get("reason"))


def _forgetting_b_simple_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray | NoPick:
    """The forgetting-aware rule fed what a user measures for b: the two-batch B_simple of the pilot's first 10%
    (nothing from the grid's on-policy runs), kappa from curvature pairs and r(s) = 1 + M2(s) as the rule's row."""
    simple = record["pilot"].get("b_simple")
    if simple is None:  # a unit saved before the pilot measured it
        return NoPick("B_simple not measured", "the unit was saved before the pilot measured B_simple")
    measured = simple.get("b_noise")  # null: |G|^2 estimated <= 0 (no signal over the noise: inf), or not finite
    if measured is None or not measured > 0:
        return NoPick("B_simple not resolved", f"the pilot's two-batch B_simple is {measured}: its |G|^2 or tr Sigma "
                                               "estimate is not > 0 (the pilot's noise swamps the difference)")
    pairs = record["pilot"].get("kappa_pairs") or {}
    return rule_values(designs, float(measured), pairs.get("kappa"), record["optimizer"], mu, floor,
                       staleness_of(record), pairs.get("reason"))


def _forgetting_b_crit_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray | NoPick:
    """The forgetting-aware rule fed the pilot's B_crit = tr(H Sigma) / G^T H G from HVPs (``b_crit_record``), kappa
    and r(s) as the B_simple row: whether the curvature-weighted noise scale is the b that sets the steps."""
    crit = record["pilot"].get("b_crit") or {}
    if crit.get("b_noise") is None:
        return NoPick("B_crit not resolved", crit.get("reason", "the unit was saved before the pilot measured it"))
    pairs = record["pilot"].get("kappa_pairs") or {}
    return rule_values(designs, float(crit["b_noise"]), pairs.get("kappa"), record["optimizer"], mu, floor,
                       staleness_of(record), pairs.get("reason"))


def _forgetting_exact_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray | NoPick:
    """The forgetting-aware rule from the exact B_noise and kappa (the noisy quadratic's), no staleness cost."""
    return rule_values(designs, read_b_noise(record["noise"], True), record["pilot"]["kappa_exact"],
                       record["optimizer"], mu, floor, forgetting.NO_STALENESS, "the exact kappa is not a number")


def _noise_scale_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray | NoPick:
    """The noise-scale rule's compute: on-policy at B and the x = 1 replay designs at B (others inf); NoPick without
    a B_noise > 0."""
    no_pick = b_noise_no_pick(read_b_noise(record["noise"]))
    if no_pick is not None:
        return no_pick
    b = read_b_noise(record["noise"]) / BATCH
    ns = np.full(len(designs), np.inf)
    for i, d in enumerate(designs):
        if d.on_policy and d.batch == BATCH:
            ns[i] = (1 + b) * (1 + mu) if math.isfinite(b) else 1 + mu
        elif d.batch == BATCH and d.x == 1:
            y = d.y
            ns[i] = (float(noise_scale_lib.replay_cost(b, y, mu)) if math.isfinite(b)
                     else (1 + y) * (1 + mu / y))
    return ns


def _calibrated_profile(record: dict) -> TabulatedProfile:
    """The unit's calibrated sigma^2(s) table (floored at 1e-12), the paper's bounds' noise profile."""
    cal = record["calibration"]
    return TabulatedProfile(tuple(float(s) for s in cal["staleness"]),
                            tuple(max(float(v), 1e-12) for v in cal["sigma_sq"]))


def _paper_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray:
    """The paper's J (Thm 3.5) on the designs at B (others inf), from the calibrated profile."""
    cal, profile = record["calibration"], _calibrated_profile(record)
    paper = np.full(len(designs), np.inf)
    for i, d in enumerate(designs):
        if d.batch == BATCH:
            paper[i] = float(theory_design.paper_objective(d.x, d.y, mu=mu, profile=profile, rho=cal["rho"],
                                                           convention="rollout-cost"))
    return paper


def _finite_budget_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray:
    """The finite-budget Thm 3.4 bound at the pilot's compute on the designs at B (others inf)."""
    cal, profile = record["calibration"], _calibrated_profile(record)
    budget = design_steps_row(record, f"on-policy B={BATCH}") * (mu + 1) * BATCH
    finite = np.full(len(designs), np.inf)
    for i, d in enumerate(designs):
        if d.batch == BATCH:
            x, y = d.x, d.y
            finite[i] = float(theory_design.finite_budget_bound(
                x * BATCH / y, BATCH / y, BATCH, budget=budget, mu=mu, profile=profile, rho=cal["rho"],
                smoothness=cal["smoothness"], bias=cal["bias"], f0=cal["f0"], convention="rollout-cost").value)
    return finite


def _null_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray:
    """The null model on the designs at B (others inf): compute per update alone."""
    null = np.full(len(designs), np.inf)
    for i, d in enumerate(designs):
        if d.batch == BATCH:
            null[i] = (mu / d.y + 1.0) / (mu + 1.0)  # Eq. (2): compute per update only
    return null


def _on_policy_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray:
    """0 at on-policy at B, the batch the user has (others inf)."""
    return np.array([0.0 if (d.on_policy and d.batch == BATCH) else np.inf for d in designs])


def _on_policy_small_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray | NoPick:
    """0 at the smallest on-policy batch whose steps stay within twice on-policy's at B (others inf); NoPick without
    a B_noise > 0 (S_min (1 + B_noise / B) is its step model)."""
    b_noise = read_b_noise(record["noise"])
    no_pick = b_noise_no_pick(b_noise)
    if no_pick is not None:
        return no_pick
    small = np.full(len(designs), np.inf)
    allowed = [i for i, d in enumerate(designs) if d.on_policy and (
        math.isinf(b_noise) and d.batch == BATCH
        or math.isfinite(b_noise) and 1 + b_noise / d.batch <= 2 * (1 + b_noise / BATCH))]
    small[min(allowed, key=lambda i: designs[i].batch)] = 0.0
    return small


def _on_policy_floor_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray:
    """The trivial rule that exploits the cost model: 0 at on-policy at the smallest grid batch >= max(floor,
    smallest batch) (B = 256 when the floor is above it; others inf). It reads nothing measured: below the floor a
    smaller batch costs as much generation and more steps, above it compute falls with the batch."""
    on = [i for i, d in enumerate(designs) if d.on_policy]
    above = [i for i in on if designs[i].batch >= floor]
    pick = min(above, key=lambda i: designs[i].batch) if above else max(on, key=lambda i: designs[i].batch)
    values = np.full(len(designs), np.inf)
    values[pick] = 0.0
    return values


def _on_policy_oracle_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray:
    """The oracle of the on-policy family: every on-policy batch at its measured compute (others inf). It reads the
    scored runs by design: the best any rule that only moves the batch can do."""
    compute = measured_compute(record, mu, floor)[0]
    return np.array([compute[i] if d.on_policy else np.inf for i, d in enumerate(designs)])


@dataclass(frozen=True)
class Objective:
    """One objective the benchmark scores: its name in the tables, and its value on every design of a unit
    ``values(record, designs, mu, floor)`` (lower = predicted cheaper; inf = not in its menu; a ``NoPick``: no pick in
    the unit, and why, e.g. without a B_noise > 0)."""

    label: str
    values: Callable[[dict, Designs, float, float], np.ndarray | NoPick]
    exact_inputs: bool = False
    """Scored only in the units that have exact inputs (the noisy quadratic's exact B_noise and kappa)."""


OBJECTIVES = {
    "forgetting": Objective("reference: forgetting-aware, b fitted to the grid's on-policy steps (reads scored runs)",
                            _forgetting_values),
    "forgetting_b_simple": Objective("forgetting-aware, b = the pilot's two-batch B_simple / B",
                                     _forgetting_b_simple_values),
    "forgetting_b_crit": Objective("forgetting-aware, b = the pilot's B_crit / B (HVPs)", _forgetting_b_crit_values),
    "forgetting_exact": Objective("forgetting-aware, exact inputs", _forgetting_exact_values, exact_inputs=True),
    "noise_scale": Objective("noise-scale rule (psi = 1, x = 1)", _noise_scale_values),
    "paper_J": Objective("the paper's J", _paper_values),
    "finite_budget": Objective("finite-budget bound", _finite_budget_values),
    "null": Objective("null gamma(y)", _null_values),
    "on_policy": Objective("always on-policy at B", _on_policy_values),
    "on_policy_small": Objective("on-policy, smallest batch within 2x steps", _on_policy_small_values),
    "on_policy_floor": Objective("on-policy at max(floor, smallest batch) (trivial)", _on_policy_floor_values),
    "on_policy_oracle": Objective("oracle: the cheapest on-policy batch, measured", _on_policy_oracle_values),
}
"""The objectives the benchmark scores, in the order of its tables (theory/optimal.py's ``OBJECTIVES`` name their
``evidence`` among these)."""


def objective_values(record: dict, mu: float, floor: float) -> dict[str, np.ndarray | NoPick]:
    """Every objective's value on every design of the unit (lower = predicted cheaper; inf = not in its menu)."""
    designs = _designs_of(record)
    exact = "exact_b_noise" in record["noise"]
    return {name: objective.values(record, designs, mu, floor) for name, objective in OBJECTIVES.items()
            if exact or not objective.exact_inputs}


def design_steps_row(record: dict, label: str) -> float:
    return float(next(d for d in record["designs"] if d["label"] == label)["steps"][0])


def measured_compute(record: dict, mu: float, floor: float) -> np.ndarray:
    """(replicates, designs) measured compute: steps x (mu max(R, floor) + B); inf where not reached."""
    steps = np.array([[np.inf if v is None else v for v in d["steps"]] for d in record["designs"]]).T
    cost = np.array([forgetting.step_cost(r, b, mu, floor) for b, r, _, _ in (d["design"] for d in
                                                                                record["designs"])])
    return steps * cost


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(values.size)
    ranks[order] = np.arange(1, values.size + 1)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    return np.bincount(inverse, weights=ranks)[inverse] / counts[inverse]


def spearman(predicted: np.ndarray, measured: np.ndarray) -> float | None:
    """Rank correlation of predicted with measured compute over the designs where both are finite."""
    ok = np.isfinite(predicted) & np.isfinite(measured)
    if ok.sum() < 3 or np.ptp(predicted[ok]) == 0 or np.ptp(measured[ok]) == 0:
        return None
    return float(np.corrcoef(_ranks(predicted[ok]), _ranks(measured[ok]))[0, 1])


def _regret(compute: np.ndarray, pick: int, menu: np.ndarray) -> tuple[float, list[float]]:
    """compute[0, pick] / min over ``menu`` (bool, designs) and its bootstrap 90% interval over the replicates."""
    best = compute[:, menu].min(axis=1)
    with np.errstate(invalid="ignore"):  # a replicate where the pick never arrives: inf / finite = inf, kept
        ratios = compute[:, pick] / best
    point = float(ratios[0])
    if compute.shape[0] == 1:
        return point, [point, point]
    lo, hi = np.quantile(ratios[1:], [0.05, 0.95], method="lower")  # order statistics: defined with inf entries
    return point, [float(lo), float(hi)]


def score_cell(record: dict, mu: float, floor: float) -> dict:
    """One cell: each objective's free-batch and pinned-B picks with regret, interval and Spearman."""
    designs = _designs_of(record)
    labels = [d["label"] for d in record["designs"]]
    compute = measured_compute(record, mu, floor)
    pinned = np.array([d.batch == BATCH for d in designs])
    everything = np.ones(len(designs), bool)
    best_free, best_pinned = int(np.argmin(compute[0])), int(np.argmin(np.where(pinned, compute[0], np.inf)))
    by_objective = {}
    for name, values in objective_values(record, mu, floor).items():
        if isinstance(values, NoPick):
            by_objective[name] = {"no_pick": values.reason, "detail": values.detail}
            continue
        menu = np.isfinite(values)  # inf: not in the objective's menu; nan (never expected): not a prediction
        if not menu.any():
            by_objective[name] = {"no_pick": "no finite prediction", "detail": "no design has a finite value"}
            continue
        free = int(np.argmin(np.where(menu, values, np.inf)))
        r_free, ci_free = _regret(compute, free, everything)
        entry = {"free": labels[free], "free_regret": r_free, "free_ci": ci_free}
        if (menu & pinned).any():
            pin = int(np.argmin(np.where(menu & pinned, values, np.inf)))
            r_pin, ci_pin = _regret(compute, pin, pinned)
            entry.update(pinned=labels[pin], pinned_regret=r_pin, pinned_ci=ci_pin)
        else:  # a free-batch objective (the smallest on-policy batch) has no design at B = 256: said, not design 0
            entry.update(pinned=None, pinned_regret=None, pinned_ci=None,
                         pinned_no_pick=f"nothing at B = {BATCH} in its menu")
        by_objective[name] = {**entry, "spearman": spearman(np.where(menu, values, np.inf), compute[0]),
                              "free_is_replay": not designs[free].on_policy}
    # the printed answer ranks the grid as the rule fed the same pilot does: its Spearman is that row's
    by_objective.update(score_printed(record, mu, floor, compute,
                                      by_objective.get("forgetting_b_simple", {}).get("spearman")))
    on = np.array([d.on_policy for d in designs])
    # the replay branch: how much cheaper the best replay design is than the best on-policy batch (> 1: replay wins)
    replay_gain = float(compute[0][on].min() / compute[0][~on].min()) if (~on).any() else None
    return {"setting": record["setting"], "optimizer": record["optimizer"], "instance": record["instance"],
            "mu": mu, "floor": floor, "exact": record["exact"], "b": record["noise"]["b"],
            "replay_gain": replay_gain,
            "best_free": labels[best_free], "best_pinned": labels[best_pinned],
            "best_free_at_edge": _grid_edge(designs, best_free),
            "best_pinned_at_edge": _grid_edge(designs, best_pinned),
            "by_objective": by_objective}


PRINTED = {"printed": "the answer optimal prints from the pilot, as printed",
           "printed_with_pilot": "the answer optimal prints, the pilot's compute added",
           "printed_compute": "the answer optimal prints with --max-steps-ratio 1000 (least compute, no time budget)"}
"""The printed answer's two rows: scored against the whole grid's best (the grid's best is the menu: a printed design
off the grid can beat it, a regret below 1)."""


PRINTED_STEPS_RATIOS = (2.0, 1000.0)
"""``optimal``'s --max-steps-ratio for the printed rows: its default (a design may take up to 2x on-policy at B's steps,
the wall-time budget) and its largest (least compute whatever the steps: the question the grid's best answers)."""


def pilot_compute(pilot: dict, mu: float, floor: float) -> float:
    """The pilot's compute in the cost model's unit: its steps of on-policy at B = 256 plus its HVPs
    (``HVP_SAMPLE_UPDATES`` x ``HVP_SAMPLES`` each), for its one run."""
    return (pilot["steps"] * forgetting.step_cost(BATCH, BATCH, mu, floor)
            + pilot["hvps"] * HVP_SAMPLE_UPDATES * HVP_SAMPLES) * pilot.get("runs", 1)


def score_printed(record: dict, mu: float, floor: float, compute: np.ndarray, spearman: float | None) -> dict:
    """The printed answer's regret against the whole grid's best (compute (replicates, designs)), without and with the
    pilot's compute; the pilot's share of on-policy at B's compute beside it; ``spearman``: the rank correlation of the
    rule fed the same pilot over the grid (the printed answer is one design: it ranks nothing itself). Empty for a
    unit saved before the printed answer was trained."""
    if "printed" not in record:
        return {}
    best = compute.min(axis=1)
    reference = design_steps_row(record, f"on-policy B={BATCH}") * forgetting.step_cost(BATCH, BATCH, mu, floor)
    extra = pilot_compute(record["pilot"], mu, floor)
    out = {}
    trained = record.get("printed_ratios", PRINTED_STEPS_RATIOS)  # --quick trains the default answer alone
    for name, ratio, added in (("printed", PRINTED_STEPS_RATIOS[0], 0.0),
                               ("printed_with_pilot", PRINTED_STEPS_RATIOS[0], extra),
                               ("printed_compute", PRINTED_STEPS_RATIOS[1], 0.0)):
        if ratio not in trained:
            continue
        design = printed_design(record["pilot"], record["optimizer"], mu, floor, ratio)
        key = [design.batch, design.rollouts, design.capacity, design.on_policy]
        row = next((d for d in record["designs"] + record["printed"] if d["design"] == key), None)
        if row is None:
            raise ValueError(f"{record['setting']}/{record['optimizer']}/i{record['instance']}: the printed design "
                             f"{key} was not trained (its unit was saved by other code)")
        steps = np.array([math.inf if v is None else v for v in row["steps"]], dtype=float)
        pick = steps * forgetting.step_cost(design.rollouts, design.batch, mu, floor)  # (replicates,)
        with np.errstate(invalid="ignore"):
            ratios = (pick + added) / best
        interval = ([float(v) for v in np.quantile(ratios[1:], [0.05, 0.95], method="lower")] if ratios.size > 1
                    else [float(ratios[0])] * 2)
        out[name] = {"free": row["label"], "free_regret": float(ratios[0]), "free_ci": interval,
                     "pinned": None, "pinned_regret": None, "pinned_ci": None,
                     "pinned_no_pick": "answers over every batch", "spearman": spearman,
                     "free_is_replay": not design.on_policy, "off_grid": row["label"].startswith("printed"),
                     "pilot_share": extra / reference if reference > 0 else None}
    return out


def not_scored_cell(record: dict, mu: float, floor: float) -> dict:
    """A cell of a unit the protocol could not score (``UnitNotScored``): kept in the cells, with the reason, no best
    design and no objective scored (no rule missed: nothing was measured to compare a pick with)."""
    return {"setting": record["setting"], "optimizer": record["optimizer"], "instance": record["instance"],
            "mu": mu, "floor": floor, "exact": record["exact"], "not_scored": record["not_scored"], "b": None,
            "best_free": None, "best_pinned": None, "best_free_at_edge": None, "best_pinned_at_edge": None,
            "by_objective": {}}


def _grid_edge(designs: list[forgetting.Design], i: int) -> str | None:
    """Which edge of the design grid design i sits on (the smallest on-policy batch, the longest horizon, the largest
    replay ratio), or None: a best design there may be beaten by one beyond the grid."""
    d = designs[i]
    if d.on_policy and d.batch == min(e.batch for e in designs if e.on_policy) and d.batch < BATCH:
        return "smallest batch"
    replay = [e for e in designs if not e.on_policy]
    if not d.on_policy and replay and d.x == max(e.x for e in replay) and d.x > 1:
        return "longest horizon"
    if not d.on_policy and replay and d.y == max(e.y for e in replay):
        return "largest replay ratio"
    return None


def horizon_check(record: dict) -> list[dict]:
    """Measured steps(x = longest) / steps(x = 1) at every y of the grid against the rule's prediction, with the
    measured inputs and, on the quadratic, the exact ones."""
    designs = _designs_of(record)
    steps = {d["label"]: d["steps"][0] for d in record["designs"]}
    xs = sorted({d.x for d in designs if d.batch == BATCH and not d.on_policy})
    if len(xs) < 2:
        return []
    noise, pilot = record["noise"], record["pilot"]
    out = []
    for y in sorted({int(d.y) for d in designs if d.batch == BATCH and not d.on_policy}):
        short, long_ = f"x={xs[0]} y={y}", f"x={xs[-1]} y={y}"
        if steps.get(short) is None or steps.get(long_) is None:
            continue
        measured = steps[long_] / steps[short] if math.isfinite(steps[short]) and math.isfinite(steps[long_]) else None
        row = {"y": y, "measured": measured}
        for name, b_noise, kappa in (("predicted", read_b_noise(noise), (pilot["kappa_pairs"] or {}).get("kappa")),
                                     ("predicted_exact", read_b_noise(noise, True), pilot["kappa_exact"])):
            if kappa is None or not math.isfinite(b_noise) or not b_noise > 0 or not kappa > 0:
                row[name] = None  # no prediction without a finite B_noise > 0 and a kappa > 0 (not counted below)
                continue
            memory = forgetting.Memory(float(kappa), record["optimizer"], BETA1, float(BATCH))
            st = staleness_of(record) if name == "predicted" else forgetting.NO_STALENESS
            a, b = forgetting.predict_many([forgetting.Design(BATCH, BATCH // y, xs[0] * BATCH // y),
                                            forgetting.Design(BATCH, BATCH // y, xs[-1] * BATCH // y)],
                                           float(b_noise), 1.0, memory, st)
            row[name] = b.steps / a.steps
        out.append(row)
    return out


def unit_checks(record: dict) -> dict:
    """Per unit: b measured against exact, kappa's estimators against exact, designs at an edge or not reached,
    and the seed-mean curves that hovered at the target."""
    noise, pilot = record["noise"], record["pilot"]
    rows = record["designs"]
    at_edge, not_reached = sum(d["at_edge"] for d in rows), sum(not d["reached"] for d in rows)
    out: dict[str, object] = {"designs": len(rows), "at_edge": at_edge, "not_reached": not_reached,
                              "hovered": sum(d.get("hovered", False) for d in rows),
                              "edge_or_censored_share": (at_edge + not_reached) / len(rows)}
    measured, exact = read_b_noise(noise), read_b_noise(noise, True)
    if math.isfinite(measured) and math.isfinite(exact) and exact > 0:
        out["b_ratio"] = measured / exact
    k_exact = pilot["kappa_exact"]
    for name in ("kappa_pairs", "kappa_lag"):
        k = (pilot.get(name) or {}).get("kappa")
        out[f"{name}_ratio"] = k / k_exact if (k is not None and k_exact) else None
    if record["exact"]:
        out["stationary_at_or_above_target"] = sum(
            1 for d in rows if d["reached"] and d["stationary_at_lr"] is not None
            and d["stationary_at_lr"] >= -record["target"])
    horizon = horizon_check(record)
    out["horizon"] = horizon
    errs = [abs(math.log(h["predicted"] / h["measured"])) for h in horizon if h["predicted"] and h["measured"]]
    out["horizon_within_25"] = (sum(e <= math.log(1.25) for e in errs), len(errs))
    return out


# --------------------------------------------------------------------------- the benchmark


def _regret_shares(regrets: list[float | None], reasons: list[str]) -> dict:
    """Over every cell (``regrets``, None: no pick, ``reasons`` saying why, one per None): how many regrets are within
    1.2x and 1.5x of the best, the share within 1.2x of ALL the cells (a cell without a pick is a miss: it stays in
    the count and is never within), the worst of the picks (inf: a pick never reached the target, counted in
    ``not_reached``; None: no cell had a pick), and the cells without a pick, by reason."""
    picked = np.array([r for r in regrets if r is not None], dtype=float)  # strict JSON keeps inf as None: none here
    return {"within_1.2": int((picked <= 1.2).sum()), "share_within_1.2": float((picked <= 1.2).sum() / len(regrets)),
            "within_1.5": int((picked <= 1.5).sum()), "worst": float(picked.max()) if picked.size else None,
            "not_reached": int(np.isinf(picked).sum()), "no_pick": len(regrets) - int(picked.size),
            "no_pick_reasons": {r: reasons.count(r) for r in sorted(set(reasons))}}


def _spearman_by_setting(cells: list[dict], name: str) -> dict:
    """Mean Spearman of an objective per setting/optimizer over its cells (None where no cell has one: a cell
    without a pick has none)."""
    per_setting: dict[str, list[float]] = {}
    for c in cells:
        v = c["by_objective"][name].get("spearman")
        per_setting.setdefault(f"{c['setting']}/{c['optimizer']}", []).append(np.nan if v is None else v)
    return {k: (float(np.nanmean(v)) if np.isfinite(v).any() else None) for k, v in per_setting.items()}


def _objective_target(cells: list[dict], name: str) -> dict:
    """One objective's record over every cell it is scored in (a cell where it gives no pick included, as a miss):
    regret shares (free, pinned), Spearman per setting, and its replay branch apart (``_replay_branch``)."""
    rec: dict = {"cells": len(cells)}
    for mode in ("free", "pinned"):
        entries = [c["by_objective"][name] for c in cells]
        regrets = [None if "no_pick" in e else e[f"{mode}_regret"] for e in entries]
        # a pick whose regret is inf is stored as None (strict JSON): it had a pick, so it counts as inf, not as none
        regrets = [math.inf if r is None and "no_pick" not in e and e.get(f"{mode}_no_pick") is None else r
                   for r, e in zip(regrets, entries)]
        reasons = [e.get("no_pick") or e.get(f"{mode}_no_pick") for e in entries]
        rec[mode] = _regret_shares(regrets, [r for r in reasons if r])
    means = _spearman_by_setting(cells, name)
    rec["spearman_by_setting"] = means
    rec["min_setting_spearman"] = min((v for v in means.values() if v is not None), default=None)
    rec["replay_branch"] = _replay_branch(cells, name)
    shares = [c["by_objective"][name]["pilot_share"] for c in cells
              if c["by_objective"][name].get("pilot_share") is not None]
    if shares:  # the printed answer's rows: the pilot's compute / on-policy at B's to the target
        rec["pilot_share"] = {"median": float(np.median(shares)), "max": float(np.max(shares)),
                              "over_10%": int(sum(v > PILOT_FRACTION for v in shares)), "cells": len(shares)}
        rec["off_grid"] = sum(1 for c in cells if c["by_objective"][name].get("off_grid"))
    return rec


REPLAY_MARGIN = 1.2
"""A cell counts as one where replay is cheapest when the best replay design needs 1.2x less compute than the best
on-policy batch (measured): there a rule that never picks replay loses at least that much."""


def _replay_branch(scored: list[dict], name: str) -> dict:
    """The replay branch of an objective's free-batch picks, apart from the share over all cells (which hides a
    branch that is never right): cells where replay is cheapest by more than ``REPLAY_MARGIN`` and how many of them
    it picked replay in (hits), and its replay picks where an on-policy batch was cheapest and that lost to it (false
    alarms) with their worst regret."""
    wins = [c for c in scored if c.get("replay_gain") is not None and c["replay_gain"] > REPLAY_MARGIN]
    # a replay pick off the grid (the printed answer) can beat every grid design where an on-policy batch was the
    # grid's best: an alarm only when it lost to that batch (regret > 1; on the grid any replay pick there does)
    alarms = [c for c in scored if c.get("replay_gain") is not None and c["replay_gain"] < 1.0
              and c["by_objective"][name].get("free_is_replay")
              and not (c["by_objective"][name].get("free_regret") or math.inf) <= 1.0]
    return {"replay_cheapest_by_20%": len(wins),
            "hits": sum(1 for c in wins if c["by_objective"][name].get("free_is_replay")),
            "false_alarms": len(alarms), "false_alarm_share": len(alarms) / len(scored) if scored else None,
            "false_alarm_worst": max((c["by_objective"][name]["free_regret"] for c in alarms), default=None)}


def _grid_edge_counts(cells: list[dict]) -> dict:
    """Per mode (free, pinned), how many cells' best design sits at each kind of grid edge."""
    out = {}
    for mode in ("free", "pinned"):
        edges = [c[f"best_{mode}_at_edge"] for c in cells if c[f"best_{mode}_at_edge"]]
        out[f"best_{mode}_at_grid_edge"] = {kind: edges.count(kind) for kind in sorted(set(edges))}
    return out


def _within(ratios: list, lo: float, hi: float) -> list[int]:
    """[how many ratios are set and within [lo, hi], how many ratios]."""
    return [sum(1 for r in ratios if r and lo <= r <= hi), len(ratios)]


def _estimate_checks(units: list[dict]) -> dict:
    """B_noise within 1.5x of exact (exact units) and kappa within 25% (quadratic units), as [hits, units]."""
    out = {"b_within_1.5x_of_exact": _within([u["checks"].get("b_ratio") for u in units if u["exact"]],
                                             1 / 1.5, 1.5)}
    quad = [u for u in units if "exact_b_noise" in u["noise"]]
    for name in ("kappa_pairs", "kappa_lag"):
        out[f"{name}_within_25%"] = _within([u["checks"].get(f"{name}_ratio") for u in quad], 0.75, 1.25)
    return out


def _horizon_checks(units: list[dict]) -> dict:
    """Horizon ratio within 25%, over all units and per kind (quadratic SGD, quadratic Adam, rollout)."""
    hz = [u["checks"]["horizon_within_25"] for u in units]
    out = {"horizon_ratio_within_25%": [sum(h[0] for h in hz), sum(h[1] for h in hz)]}
    for kind, pick in (("quadratic_sgd", lambda u: u["exact"]),
                       ("quadratic_adam", lambda u: "exact_b_noise" in u["noise"] and not u["exact"]),
                       ("rollout", lambda u: "exact_b_noise" not in u["noise"])):
        part = [u["checks"]["horizon_within_25"] for u in units if pick(u)]
        out[f"horizon_ratio_within_25%_{kind}"] = [sum(h[0] for h in part), sum(h[1] for h in part)]
    return out


def _unit_flags(units: list[dict]) -> dict:
    """Stationary-above-target and hovered counts, the largest edge-or-censored share, the units over 10%."""
    return {"stationary_at_or_above_target": sum(u["checks"].get("stationary_at_or_above_target", 0) for u in units),
            "hovered": sum(u["checks"]["hovered"] for u in units),
            "edge_or_censored_share_max": max((u["checks"]["edge_or_censored_share"] for u in units), default=None),
            "units_over_10%_at_edge_or_censored": [f"{u['setting']}/{u['optimizer']}/i{u['instance']}"
                                                   for u in units if u["checks"]["edge_or_censored_share"] > 0.1]}


def targets(cells: list[dict], units: list[dict], floor: int = HEADLINE_FLOOR) -> dict:
    """Per objective, over the cells at ``floor``: share of cells within 1.2x of the best (free batch and pinned B),
    within 1.5x, the worst, the lowest per-setting mean Spearman; the checks on the inputs over ``units``."""
    cells = [c for c in cells if c["floor"] == floor]
    out: dict = {"cells": len(cells), "floor": floor, "objectives": {}}
    unscored = [f"{c['setting']}/{c['optimizer']}/i{c['instance']}" for c in cells if c.get("not_scored")]
    # cells of a unit the protocol could not score: in "cells", in no objective's count, said with the unit
    out["cells_not_scored"] = len(unscored)
    out["units_not_scored"] = sorted(set(unscored))
    cells = [c for c in cells if not c.get("not_scored")]
    for name in [*OBJECTIVES, *PRINTED]:
        scored = [c for c in cells if name in c["by_objective"]]  # every cell it applies to, a pick or not
        if scored:
            out["objectives"][name] = _objective_target(scored, name)
    out.update(_grid_edge_counts(cells))
    out.update(_estimate_checks(units))
    out.update(_horizon_checks(units))
    out.update(_unit_flags(units))
    return out


def options_text(options: Options) -> str:
    return json.dumps({**_protocol(options), "replay_theory_version": __version__}, indent=1, sort_keys=True)


def _protocol(options: Options) -> dict:
    return {"batch": BATCH, "group": GROUP, "grid": [list(d) for d in options.grid],
            "on_policy_batches": list(options.on_policy_batches), "seeds": options.seeds, "boots": BOOTS,
            "target_fraction": TARGET_FRACTION, "mus": list(options.mus), "floors": list(options.floors),
            "headline_floor": HEADLINE_FLOOR, "instances": list(options.instances),
            "dev_instances": list(DEV_INSTANCES), "settings": {s: asdict(SETTINGS[s]) for s in options.settings},
            "optimizers": list(options.optimizers), "quick": options.quick, "lr_ratio": LR_RATIO,
            "exact_lr_ratio": EXACT_LR_RATIO, "max_extend": MAX_EXTEND, "cap_factor": CAP_FACTOR,
            "window": to_target.WINDOW, "beta1": BETA1,
            "pilot": {"fraction": PILOT_FRACTION, "seed": PILOT_SEED, "runs": PILOT_RUNS,
                      "curvature_every": CURVATURE_EVERY, "hvp_sample_updates": HVP_SAMPLE_UPDATES,
                      "hvp_samples": HVP_SAMPLES, "route": "B_simple"},
            "objectives": [*OBJECTIVES, *PRINTED]}


def check_out(out: Path, options: Options) -> Path:
    """``out`` can take this benchmark: absent, empty, or holding this very benchmark (resume). Reads only."""
    out = check_out_dir(out)
    if not out.is_dir() or not any(out.iterdir()):
        return out
    stored = out / "options.json"
    if not stored.is_file():
        raise ValueError(f"--out {out} is a non-empty directory that holds no theory-test results (no "
                         f"options.json); results go into a new or empty directory")
    if stored.read_text() != options_text(options):
        raise ValueError(f"--out {out} holds a theory-test run with other options or another code version; "
                         f"choose a new --out")
    return out


def _unit_job(out: str, setting: str, optimizer: str, instance: int, options: Options) -> dict:
    return run_unit(out, setting, optimizer, instance, options)


def run_theory_test(out: str | Path, options: Options = Options(), progress: bool = True, jobs: int = 1) -> dict:
    """Run (or resume) the benchmark into ``out``; write OUT/units/*.json, OUT/summary.json; return the summary."""
    from ..core.jobs import check_jobs, local_workers, run_unordered

    check_options(options)
    jobs = check_jobs(jobs)
    out = check_out(Path(out), options)
    started = time.time()
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "options.json").exists():
        write_new(out / "options.json", lambda tmp: tmp.write_text(options_text(options)))
    units_dir = out / "units"
    units_dir.mkdir(exist_ok=True)
    plan = options.units
    records: dict[tuple, dict] = {}
    todo = []
    for s, o, i in plan:
        path = units_dir / f"{s}-{o}-{i}.json"
        if path.exists():
            records[(s, o, i)] = json.loads(path.read_text())
        else:
            todo.append((s, o, i))
    # The one stored run several units share, the instance's record (each optimizer's unit of a setting reads it):
    # computed here, once per (setting, instance), before any worker starts, so that no two workers compute it
    store = Store(out)
    with threadpool_limits(limits=1, user_api="blas"):  # as in run_unit: one record whatever --jobs is
        for s, i in dict.fromkeys((s, i) for s, _, i in todo):
            instance_record(store, SETTINGS[s], i)
    per_unit = len(options.designs())
    workers = local_workers(jobs, len(todo)) if todo else 1
    label = f"theory-test units ({len(plan) - len(todo)} of {len(plan)} saved)"
    bar = ProgressBar(label, len(todo) * (per_unit if workers == 1 else 1), enabled=progress)
    try:
        if workers == 1:
            for s, o, i in todo:
                record = run_unit(str(out), s, o, i, options, tick=bar.tick, advance=bar.advance)
                _save_unit(units_dir, record)
                records[(s, o, i)] = record
        else:
            for record in run_unordered(_unit_job, [(str(out), s, o, i, options) for s, o, i in todo], workers,
                                        batch_size=1):
                _save_unit(units_dir, record)
                records[(record["setting"], record["optimizer"], record["instance"])] = record
                bar.advance()
    finally:
        bar.close()
    units = [records[k] for k in plan]
    summary = summarise(units, options)
    summary["elapsed_s"] = round(time.time() - started, 1)
    _write_summary(out, summary)
    return summary


def _save_unit(units_dir: Path, record: dict) -> None:
    path = units_dir / f"{record['setting']}-{record['optimizer']}-{record['instance']}.json"
    if not path.exists():
        write_new(path, lambda tmp: tmp.write_text(json.dumps(strict(record))))


def summarise(units: list[dict], options: Options) -> dict:
    """Cells (unit x mu x floor), per-unit checks, and the targets over all instances and over the held-out ones."""
    scored = [u for u in units if not u.get("not_scored")]
    for u in scored:
        u["checks"] = unit_checks(u)
    cells = [score_cell(u, mu, floor) if not u.get("not_scored") else not_scored_cell(u, mu, floor)
             for u in units for mu in options.mus for floor in options.floors]
    held = [c for c in cells if c["instance"] not in DEV_INSTANCES]
    held_units = [u for u in scored if u["instance"] not in DEV_INSTANCES]
    slim = [{k: v for k, v in u.items() if k != "designs"} | {"designs": [
        {k: v for k, v in d.items() if k not in ("curve", "curve_steps")} | {"steps": d["steps"][0]}
        for d in u["designs"]]} for u in units]
    return strict({"cells": cells, "units": slim,
                   "targets": {str(f): targets(cells, scored, f) for f in options.floors},
                   "targets_held_out": {str(f): targets(held, held_units, f) for f in options.floors},
                   "protocol": _protocol(options), "replay_theory_version": __version__})


def _write_summary(out: Path, summary: dict) -> Path:
    """OUT/summary.json, never overwritten: a rerun with identical results keeps it; different ones are refused."""
    path = out / "summary.json"
    text = json.dumps(summary, indent=1, allow_nan=False)
    if path.exists():
        old = json.loads(path.read_text())
        if {**old, "elapsed_s": None} == json.loads(json.dumps({**summary, "elapsed_s": None})):
            return path
        raise ValueError(f"{path} exists and holds a different summary; results are never overwritten: "
                         f"move it away or choose a new --out")
    return write_new(path, lambda tmp: tmp.write_text(text))


def load_summary(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    return json.loads(path.read_text())


# --------------------------------------------------------------------------- the tables


SPEC = {"name": "theory-test", "description": "prediction benchmark (not a sweep: run by run_theory_test)"}


def _num(value, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}g}"


def _regret_text(value) -> str:
    """A regret of a pick: inf (stored as None in strict JSON) when the pick never reached the target."""
    return "inf" if value is None or value == math.inf else _num(value)


def _ci(point, ci) -> str:
    return (f"{_regret_text(point)} [{_regret_text(ci[0])}, {_regret_text(ci[1])}]" if ci[0] != ci[1]
            else _regret_text(point))


def units_table(summary: dict) -> str:
    """One row per unit: the measured inputs against the exact ones, and the protocol's own checks."""
    lines = ["| setting | opt | inst | b from steps [90% CI] | b exact (SGD) | pilot B_simple / B [90% CI] | "
             "pilot B_crit / B | pilot steps (of the recipe's) | B_simple / B (flow) | B_crit / B (exact) | "
             "kappa exact | kappa pairs [90% CI] | kappa lag-1 | alpha | edge / not reached / hovered (of designs) |",
             "|---" * 15 + "|"]
    for u in summary["units"]:
        if u.get("not_scored"):  # no pilot: nothing measured, the reason in the last column
            lines.append(f"| {u['setting']} | {u['optimizer']} | {u['instance']} |" + " n/a |" * 11
                         + f" not scored: {u['not_scored']} |")
            continue
        n, p, c = u["noise"], u["pilot"], u["checks"]
        b = read_b_noise(n) / BATCH
        kp, kl = p["kappa_pairs"] or {}, p["kappa_lag"] or {}
        lag = (f"{_num(kl.get('kappa'))}" if kl.get("kappa") is not None
               else f"none (corr {_num(kl.get('lag1_autocorrelation'), 2)})")
        exact_b = read_b_noise(n, True) / BATCH if "exact_b_noise" in n else None
        simple = p.get("b_simple") or {}  # the pilot's two-batch B_simple (absent from older records)
        lo_hi = [None if v is None else v / BATCH for v in (simple.get("b_noise_interval") or [None, None])]
        pilot_b = (f"{_num(None if simple.get('b_noise') is None else simple['b_noise'] / BATCH)} "
                   f"[{_num(lo_hi[0])}, {_num(lo_hi[1])}]" if simple else "n/a")
        pairs = (f"{_num(kp.get('kappa'))} [{_num((kp.get('kappa_interval') or [None])[0])}, "
                 f"{_num((kp.get('kappa_interval') or [None, None])[1])}]")
        crit_value = (p.get("b_crit") or {}).get("b_noise")
        crit = _num(crit_value / BATCH) if crit_value is not None else "none" if p.get("b_crit") else "n/a"
        steps = f"{p['steps']} ({_num(p.get('recipe_steps'))})" if "recipe_steps" in p else "n/a"
        if kp.get("kappa") is None and kp.get("pairs_without_noise"):  # said, as the lag-1 column says its none
            pairs = f"none ({kp['pairs_without_noise']} of {kp['pairs_without_noise'] + kp['units']} pairs xi = 0)"
        lines.append(
            f"| {u['setting']} | {u['optimizer']} | {u['instance']} | {_num(b)} [{_num(n['b_interval'][0])}, "
            f"{_num(n['b_interval'][1])}] | {_num(exact_b)} | {pilot_b} | {crit} | {steps} | "
            f"{_num(n.get('b_simple'))} | "
            f"{_num(n.get('b_crit'))} | {_num(p['kappa_exact'])} | {pairs} | {lag} | "
            f"{_num(u.get('alpha_measured'), 2)} | "
            f"{c['at_edge']} / {c['not_reached']} / {c['hovered']} (of {c['designs']}) |")
    return "\n".join(lines)


def cells_table(summary: dict, floor: int = HEADLINE_FLOOR) -> str:
    """One row per cell at ``floor``: the best design, the answer ``optimal`` prints from the pilot (at its default
    steps budget, for least compute, and with the pilot's compute added), the forgetting-aware rule's grid picks fed
    the pilot's B_simple and their regrets, then the other rules' and the baselines' regrets."""
    rule = "forgetting_b_simple"
    header = ["setting", "opt", "inst", "mu", "best (free)", "best (B = 256)",
              "optimal as printed: pick, regret [90% CI]", "least compute: pick, regret", "with the pilot",
              "forgetting (pilot B_simple): free pick, regret [90% CI]", "its B = 256 pick, regret",
              "forgetting (b fitted to the grid)", "noise-scale rule: regret at B = 256", "paper J: regret at B = 256",
              "on-policy at B", "on-policy small", "trivial (floor)", "Spearman forgetting / J"]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for c in summary["cells"]:
        if c["floor"] != floor:
            continue
        if c.get("not_scored"):
            lines.append("| " + " | ".join([c["setting"], c["optimizer"], str(c["instance"]), f"{c['mu']:g}",
                                             "not scored (no pilot: see the units table)"] + ["n/a"] * 11) + " |")
            continue
        o = c["by_objective"]

        def get(name, mode="free", o=o):
            v = o.get(name)
            if not v:
                return "n/a"
            why = v.get("no_pick") or v.get(f"{mode}_no_pick")
            return f"no pick: {why}" if why else _regret_text(v[f"{mode}_regret"])

        f = o.get(rule) or {}

        def printed(name, o=o):
            v = o.get(name)
            return f"{v['free']}, {_ci(v['free_regret'], v['free_ci'])}" if v else "n/a"

        row = [c["setting"], c["optimizer"], str(c["instance"]), f"{c['mu']:g}", c["best_free"], c["best_pinned"],
               printed("printed"), printed("printed_compute"), get("printed_with_pilot"),
               f"{f['free']}, {_ci(f['free_regret'], f['free_ci'])}" if "free" in f else get(rule),
               f"{f['pinned']}, {_regret_text(f['pinned_regret'])}" if f.get("pinned") else get(rule, "pinned"),
               get("forgetting"), get("noise_scale", "pinned"), get("paper_J", "pinned"), get("on_policy"),
               get("on_policy_small"), get("on_policy_floor"),
               " / ".join(_num((o.get(n) or {}).get("spearman"), 2) for n in (rule, "paper_J"))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _worst_text(shares: dict) -> str:
    """The worst regret of a mode's picks: inf when a pick never reached the target (how many say so), n/a when no
    cell had a pick."""
    if shares.get("no_pick") and shares["worst"] is None and not shares.get("not_reached"):
        return "n/a"
    if shares["worst"] is None or shares["worst"] == math.inf:
        n = shares.get("not_reached")
        return f"inf ({n} pick{'s' if n != 1 else ''} never reached the target)" if n else "inf"
    return f"{shares['worst']:.2f}"


def _no_pick_text(free: dict, pinned: dict, cells: int) -> str:
    """The cells where the objective gave no pick (counted above as misses), and why; empty when there are none."""
    parts = [f"{what} in {mode['no_pick']} of {cells} ("
             + ", ".join(f"{why}: {n}" for why, n in (mode.get("no_pick_reasons") or {}).items()) + ")"
             for what, mode in (("free batch", free), (f"at B = {BATCH}", pinned)) if mode.get("no_pick")]
    return "; no pick (counted as a miss): " + ", ".join(parts) if parts else ""


def targets_text(t: dict) -> str:
    """The targets block: per objective, free-batch and pinned-B regret shares, worst, Spearman; then the checks."""
    if not t:
        return ""
    lines = [f"targets over {t['cells']} cells at a latency floor of {t['floor']} rollouts (regret <= 1.2 in >= 85% "
             f"of cells and <= 1.5 in all; Spearman >= 0.7 in every setting):"]
    if t.get("cells_not_scored"):
        lines.append(f"- cells not scored, in no objective's count (their unit's pilot reached the target at no step "
                     f"size; the units table says why): {t['cells_not_scored']} of {t['cells']}, units "
                     f"{', '.join(t['units_not_scored'])}")
    for name, o in t["objectives"].items():
        fr, pn = o["free"], o["pinned"]
        label = OBJECTIVES[name].label if name in OBJECTIVES else PRINTED.get(name, name)  # else a stored name
        if name in PRINTED:  # one design per cell over every batch: no pinned pick; the pilot's cost beside it
            share = o.get("pilot_share") or {}
            lines.append(f"- {label}: {fr['within_1.2']} of {o['cells']} within 1.2x of the whole grid's best "
                         f"({100 * fr['share_within_1.2']:.0f}%), {fr['within_1.5']} within 1.5x, worst "
                         f"{_worst_text(fr)}; off the grid in {o.get('off_grid', 0)} cells; pilot compute / on-policy "
                         f"at B's: median {100 * share.get('median', math.nan):.1f}%, max "
                         f"{100 * share.get('max', math.nan):.1f}%, over {100 * PILOT_FRACTION:g}% in "
                         f"{share.get('over_10%', 0)} cells; Spearman (the rule on the same pilot) "
                         f"{_num(o['min_setting_spearman'], 2)}" + _branch_text(o.get("replay_branch")))
            continue
        lines.append(f"- {label}: free batch {fr['within_1.2']} of {o['cells']} within 1.2x "
                     f"({100 * fr['share_within_1.2']:.0f}%), {fr['within_1.5']} within 1.5x, worst "
                     f"{_worst_text(fr)}; at B = 256 {100 * pn['share_within_1.2']:.0f}% within 1.2x, worst "
                     f"{_worst_text(pn)}; lowest per-setting mean Spearman {_num(o['min_setting_spearman'], 2)}"
                     + _branch_text(o.get("replay_branch")) + _no_pick_text(fr, pn, o["cells"]))
    lines.append(f"- b from steps within 1.5x of the exact b: {t['b_within_1.5x_of_exact'][0]} of "
                 f"{t['b_within_1.5x_of_exact'][1]} quadratic SGD units")
    lines.append(f"- kappa within 25% of exact: curvature pairs {t['kappa_pairs_within_25%'][0]} of "
                 f"{t['kappa_pairs_within_25%'][1]}, lag-1 autocorrelation {t['kappa_lag_within_25%'][0]} of "
                 f"{t['kappa_lag_within_25%'][1]} quadratic units")
    parts = ", ".join(f"{label} {t[f'horizon_ratio_within_25%_{k}'][0]} of {t[f'horizon_ratio_within_25%_{k}'][1]}"
                      for k, label in (("quadratic_sgd", "quadratic SGD"), ("quadratic_adam", "quadratic Adam"),
                                       ("rollout", "bandits")) if f"horizon_ratio_within_25%_{k}" in t)
    lines.append(f"- predicted steps(x = 16) / steps(x = 1) within 25% of measured: {t['horizon_ratio_within_25%'][0]} "
                 f"of {t['horizon_ratio_within_25%'][1]} (unit, y) pairs ({parts})")
    lines.append(f"- counted designs whose exact stationary loss is at or above the target: "
                 f"{t['stationary_at_or_above_target']}; seed-mean curves that touched the target well before they "
                 f"crossed it (hovered): {t['hovered']}")
    for mode, label in (("free", "the whole grid"), ("pinned", "B = 256")):
        edges = t.get(f"best_{mode}_at_grid_edge") or {}
        lines.append(f"- cells whose best design ({label}) sits at an edge of the grid: "
                     + (", ".join(f"{n} at the {k}" for k, n in edges.items()) or "none"))
    lines.append(f"- designs at a step-size edge or not reached, largest share in a unit: "
                 f"{100 * (t['edge_or_censored_share_max'] or 0):.0f}% (units over 10%: "
                 f"{', '.join(t['units_over_10%_at_edge_or_censored']) or 'none'})")
    return "\n".join(lines)


def _branch_text(branch: dict | None) -> str:
    """An objective's replay branch in words (empty for a summary saved before it was recorded)."""
    if not branch:
        return ""
    worst = "" if branch["false_alarm_worst"] is None else f", worst {branch['false_alarm_worst']:.2f}"
    return (f"; replay branch: picked replay in {branch['hits']} of the {branch['replay_cheapest_by_20%']} cells "
            f"where replay is cheapest by > 20%, {branch['false_alarms']} false alarms (replay picked, on-policy "
            f"cheapest){worst}")


def summary_table(summary: dict) -> str:
    floors = summary["protocol"]["floors"]
    head = summary["protocol"]["headline_floor"] if summary["protocol"]["headline_floor"] in floors else floors[0]
    parts = ["## Inputs, measured against exact", "", units_table(summary), "",
             f"## Cells at a latency floor of {head} rollouts", "", cells_table(summary, head), ""]
    for f in floors:
        held = summary["targets_held_out"].get(str(f)) or {}
        if held.get("cells"):  # a run on the development instance alone has none to read
            parts += [f"## Targets, held-out instances (not {', '.join(map(str, DEV_INSTANCES))}), floor {f}", "",
                      targets_text(held), ""]
        parts += [f"## Targets, every instance, floor {f}", "", targets_text(summary["targets"].get(str(f)) or {}), ""]
    return "\n".join(parts)


def theory_test_table(out_dir: Path) -> str:
    return summary_table(load_summary(out_dir))


def write_evidence(out: Path, summary: dict, command: str) -> Path:
    """OUT/evidence.json: the targets per objective and the command, what ``optimal``'s evidence line quotes once
    copied to theory/evidence.json (theory.evidence). Never overwritten: an identical one is kept, another refused."""
    from ..theory.evidence import evidence_record

    path = Path(out) / "evidence.json"
    text = json.dumps(evidence_record(summary, command), indent=1, sort_keys=True) + "\n"
    if path.exists():
        if path.read_text() == text:
            return path
        raise ValueError(f"{path} exists and holds other evidence; results are never overwritten: move it away")
    return write_new(path, lambda tmp: tmp.write_text(text))

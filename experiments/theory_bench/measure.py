"""Training and measurement of one unit (setting, optimizer, instance): the step-size search, the pilot, the grid.

Papers: experience-replay (docs/REFERENCES.md), Sec. 3, Thm 3.4, Thm 3.5 / App. C.3; McCandlish et al. 2018
(arXiv 1812.06162), Eq. 2.7; the forgetting-aware rule of ``theory/forgetting.py`` (docs/THEORY.md, "Forgetting").
Protocol: docs/SIMULATION.md, 'Does a design rule predict?'.

| code name | symbol | meaning |
|---|---|---|
| ``b`` | B_noise / 256 | the noise scale at the pinned batch |
| ``kappa`` | eta lambda_eff | the optimizer's memory at the pilot (1/kappa steps) |
| ``b_simple``, ``b_crit`` | B_simple, B_crit | the pilot's noise scales (McCandlish Eq. 2.8, 2.7) |
| ``m2`` | M2(s) | the staleness cost at age s |
| ``steps`` | S | steps to the target at the tuned step size |
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from threadpoolctl import threadpool_limits

from ...advise import advice
from ...outputs import strict
from ...simulate import to_target
from ...simulate.envs import NoisyRewardBandit
from ...simulate.envs.quadratic import QuadraticEnv
from ...theory import forgetting
from ...theory import noise_scale as noise_scale_lib
from ...theory.resampling import quantile_interval, resample_indices
from .inputs import (
    b_crit_record,
    b_noise_kind,
    curvature_pairs_kappa,
    drift_staleness,
    fit_noise_scale,
    kappa_parts,
    log_compute,
    loss_hvp,
    measure_drift,
    measure_staleness,
    measured_alpha,
    pilot_affordable,
    pilot_steps,
    sample_grads,
    zero_share_of_grads,
)
from .options import (
    BATCH,
    BETA1,
    BOOTS,
    CAP_FACTOR,
    CURVATURE_EVERY,
    EXACT_LR_RATIO,
    GROUP,
    LR_RATIO,
    MAX_EXTEND,
    OPTIMIZERS,
    PILOT_FRACTION,
    PILOT_MAX_STEPS,
    PILOT_RUNS,
    PILOT_SEED,
    PRINTED_STEPS_RATIOS,
    PRINTED_WORK_RATIO,
    RESCORE_SAMPLES,
    SETTINGS,
    STALENESS,
    Options,
    SelectiveDesign,
    Setting,
    is_selective,
)
from .store import Env, Store, instance_record


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
                "design": design_spec(design), "lrs": [float(v) for v in lrs], "seeds": self.options.seeds,
                "boots": int(self.boot_index.shape[0]), "target": self.inst["target"], "max_steps": int(max_steps)}

    def run(self, design: forgetting.Design, lrs: np.ndarray, max_steps: int, seed_offset: int = 0) -> dict:
        """One design at the step sizes ``lrs`` with --seeds seeds from seed ``instance + seed_offset`` (0: the scored
        runs; PILOT_SEED: the user's recipe, disjoint from them), stored."""
        payload = self.payload(design, lrs, max_steps, seed_offset)
        found = self.store.get(payload)
        if found is not None:
            return found
        trace = to_target.run_to_target(self.env, self.setting.loss, design, lrs, self.options.seeds, self.optimizer,
                                        self.inst["target"], max_steps, seed=self.instance + seed_offset,
                                        boot_index=self.boot_index, on_step=self.tick,
                                        buffer="selective" if is_selective(design) else "fifo")
        best = _best_lr(trace.crossing[0])
        z = {} if trace.zero_std_share is None else {"zero_std_share": trace.zero_std_share.tolist()}
        if trace.refill_rounds is not None:  # dynamic sampling: its generation rounds an update, per step size
            z["refill_rounds"] = trace.refill_rounds.tolist()
        return self.store.put(payload, {
            "lrs": [float(v) for v in lrs], "crossing": trace.crossing.tolist(),
            "first_touch": trace.first_touch.tolist(), "steps": trace.steps,
            "curve": trace.mean_reward[best].tolist() if best is not None else [],
            "curve_steps": trace.reward_steps.tolist(), **z})

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


def design_spec(design: forgetting.Design) -> list:
    """A design as the records and run keys name it: [B, R, N, on_policy], [.., e, m] for an epoch design,
    [.., e, m, k] for an overlapped one and [.., e, m, k, "selective"] for a selective one only (the FIFO and on-policy
    designs keep the keys and records they had before the families were trained)."""
    spec = [design.batch_size, design.rollouts_per_step, design.capacity, design.on_policy]
    if is_selective(design):
        return spec + [design.epochs, design.mini_batches, design.max_staleness, "selective"]
    if design.max_staleness:
        return spec + [design.epochs, design.mini_batches, design.max_staleness]
    return spec + [design.epochs, design.mini_batches] if design.updates_per_generation > 1 else spec


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
    z = {key: np.concatenate([r[key] for r in runs])[order].tolist()  # a selective design's z per step size; a
         for key in ("zero_std_share", "refill_rounds") if all(key in r for r in runs)}  # dynamic one's rounds too
    return {"lrs": lrs[order].tolist(), "crossing": crossing.tolist(), "first_touch": first_touch.tolist(),
            "steps": max(r["steps"] for r in runs), "runs": [r["key"] for r in runs],
            "run_lrs": [list(r["lrs"]) for r in runs], "curve": curve,
            "curve_steps": curve_steps, **z}


def design_steps(record: dict) -> np.ndarray:
    """(BOOTS + 1,) steps to the target at the tuned step size, per replicate (row 0: the real seeds); inf: not
    reached within the design's cap."""
    c = np.asarray(record["crossing"], dtype=float)
    return np.where(c > 0, c, np.inf).min(axis=1)


def _step_cap(options: Options, design: forgetting.Design, s_ref: float) -> int:
    """CAP_FACTOR x on-policy B = 256's steps x the largest ratio of its step cost to this design's over the cost
    models: beyond it the design costs more than CAP_FACTOR x on-policy at every mu and floor."""
    ratio = max(forgetting.step_cost(BATCH, BATCH, mu, f)
                / forgetting.step_cost(design.rollouts_per_step, design.batch_size, mu, f,
                                       design.updates_per_generation)
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
    starts: dict[str, float] = {}  # each grid design's first step size, which its selective twin's search reuses
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
                starts[label] = start = unit.start_from(*neighbours)
                unit.tune(label, design, start, _step_cap(options, design, s_ref))
            if unit.advance:
                unit.advance()
    for e, m in options.epochs_grid:
        _train_epochs(unit, e, m, s_ref, s_ref_exact)
    for b in options.overlap_batches:  # --families overlap: each from its synchronous batch's step size
        design, label = forgetting.Design.overlapped_at(b), f"overlapped B={b}"
        if unit.exact:
            unit.exact_run(label, design, _step_cap(options, design, s_ref_exact))
        else:
            # where on-policy at b reached the target at no step size (two-prompts/sgd on 907: B = 16 never did),
            # from on-policy at B scaled as the smaller batches' searches are, which always reached (else the unit
            # is not scored): a start, not a result, so no reached search moves
            start = unit.start_from((f"on-policy B={b}", 1.0), (f"on-policy B={BATCH}", (b / BATCH) ** (alpha / 2)))
            unit.tune(label, design, start, _step_cap(options, design, s_ref))
        if unit.advance:
            unit.advance()
    _train_selective(unit, starts, s_ref)


def _train_selective(unit: Unit, starts: dict[str, float], s_ref: float) -> None:
    """--families selective, on a rollout setting only: each design searched as its uniform twin (same B, R, N) was,
    from the same first step size (``starts``, by the twin's label): the same rows draw the same seeds' streams
    (paired), so at z = 0 the two are the same run and a difference is the admission's. Dynamic sampling at B likewise
    from on-policy at B's first step sizes, to its cap (the rounds are not in ``_step_cap``'s cost)."""
    for label, design in unit.options.designs(unit.setting.name):
        if design.dynamic:  # as on-policy at B was searched, from its first runs' step sizes and to its cap: the
            # same rows draw the same streams, so at z = 0 the search takes the same path to the same numbers
            twin = unit.runs[f"on-policy B={design.batch_size}"]
            unit.tune(label, design, 0.0, int(twin["max_steps"]), first=np.asarray(twin["run_lrs"][0]))
            if unit.advance:
                unit.advance()
        elif is_selective(design):
            start = starts[f"x={design.x} y={int(design.y)}"]
            unit.tune(label, design, start, _step_cap(unit.options, design, s_ref))
            if unit.advance:
                unit.advance()


def _train_epochs(unit: Unit, epochs: int, mini_batches: int, s_ref: float, s_ref_exact: float) -> None:
    """One epoch design of --families epochs (R = B = 256, e passes over m mini-batches of R / m), exact where exact,
    else searched from on-policy at its mini-batch (each sample used e times: its step size scaled by e^-1/2)."""
    design = forgetting.Design.epochs_of(BATCH, epochs, mini_batches)
    label = f"epochs e={epochs} m={mini_batches}"
    if unit.exact:
        unit.exact_run(label, design, _step_cap(unit.options, design, s_ref_exact))
    else:
        alpha = 1.0 if unit.optimizer == "sgd" else 0.5
        b = design.batch_size
        start = unit.start_from((f"on-policy B={b}", epochs ** -0.5),
                                (f"on-policy B={BATCH}", (b / BATCH) ** (alpha / 2) * epochs ** -0.5))
        unit.tune(label, design, start, _step_cap(unit.options, design, s_ref))
    if unit.advance:
        unit.advance()


# --------------------------------------------------------------------------- the inputs, measured (helpers: inputs.py)


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
               "curvature_every": CURVATURE_EVERY, "version": 4,
               **({"noise_stream": "per pilot"} if isinstance(unit.env, NoisyRewardBandit) else {})}
    found = unit.store.get(payload)
    if found is not None:
        return found
    env = unit.env
    if isinstance(env, NoisyRewardBandit):  # the measurements' verifier noise keyed by the pilot alone
        env = env.with_noise_stream(271828, unit.instance)
    curvature_steps = {t for t in range(steps) if (steps - 1 - t) % CURVATURE_EVERY == 0}
    rng = np.random.default_rng([unit.instance, PILOT_SEED, len(unit.setting.name)])
    history, small, big, num, den, ghg, exact_num, exact_den, dots, sq, zero = ([] for _ in range(11))
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
            if unit.setting.loss is not None:  # a group of equal rewards has zero advantage: its rows are exactly 0
                zero.append(zero_share_of_grads(grads))
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
                num.append(float(v @ loss_hvp(env, theta, v)))
                den.append(float(xi @ (d_vec * xi)))
            u = d_vec * whole  # D g: E[g^T D H D g] = G^T D H D G + tr(D H D Sigma) / B
            ghg.append(float(u @ loss_hvp(env, theta, u)))
            a, b = kappa_parts(env, unit.setting, theta, d_vec, rng)
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
    drift = None if isinstance(env, QuadraticEnv) else measure_drift(
        env, trajectory, np.random.default_rng([unit.instance, PILOT_SEED, len(unit.setting.name), 2]))
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
              "b_crit": b_crit_record(num, ghg),
              # z [E8]: TRL's frac_reward_zero_std over the pilot's batches (no groups on the quadratic: None)
              "zero_share": float(np.mean(zero)) if zero else None}
    return unit.store.put(payload, result)


def measure_recipe_log(unit: Unit) -> dict:
    """B_simple as the user's own run of their recipe logs it: ONE run of on-policy at B = 256 at the recipe's step
    size (``RECIPE``) on the pilot's seed (PILOT_SEED + instance: the pilot's steps are this run's first), for the
    recipe's steps to the target, each step's batch giving McCandlish's two-batch pair (its halves against the whole,
    as the TRL trainer and the verl hook log them: no extra rollouts, no extra backward), pooled over the whole run.
    The noise scale drifts within a run (|G| falls toward the target, docs/SIMULATION.md); a pilot of the first 8%
    reads it where |G| is largest. The run is the user's own, done before asking, so its steps add nothing to the
    pilot's compute. Its drift M2(s) (``measure_drift``: the last policy T against the policy at T - s, at the ages in
    STALENESS up to the run's length) is the staleness cost a pilot of one or two steps cannot reach: on a trainer, the
    logged rollouts of step T - s re-scored at the last checkpoint, RESCORE_SAMPLES of them per age, whose forward
    passes are counted (``inputs.log_compute``). It reads no scored run (``tests/unit/test_theory_test_pilot``)."""
    lr = unit.tuned_lr(RECIPE)
    if lr is None:
        raise UnitNotScored(f"{RECIPE} reached the target at no step size: the user has no run to log")
    steps = max(2, int(math.ceil(float(design_steps(unit.runs[RECIPE])[0]))))
    payload = {"kind": "recipe-log", "setting": unit.setting.name, "optimizer": unit.optimizer,
               "instance": unit.instance, "lr": lr, "steps": steps, "runs": PILOT_RUNS, "seed": PILOT_SEED,
               "version": 3, **({"noise_stream": "per pilot"} if isinstance(unit.env, NoisyRewardBandit) else {})}
    found = unit.store.get(payload)
    if found is not None:
        return found
    env = unit.env
    if isinstance(env, NoisyRewardBandit):  # the measurements' verifier noise keyed by the pilot alone, as the pilot's
        env = env.with_noise_stream(271828, unit.instance)
    rng = np.random.default_rng([unit.instance, PILOT_SEED, len(unit.setting.name), 1])
    small, big, history = [], [], []

    def observer(step: int, params: np.ndarray, grad: np.ndarray, optimizer) -> None:
        history.append(params.copy())  # (runs, d): the parameters before update ``step``
        theta = params[0][None]  # (1, d): the one run's parameters before update ``step``
        grads = sample_grads(env, unit.setting, theta, theta, BATCH // GROUP, rng)  # (256, d) the step's batch
        halves = grads.reshape(2, BATCH // 2, -1).mean(axis=1)  # (2, d) whole groups: 16 of 8 each
        whole = grads.mean(axis=0)
        for h in halves:
            small.append(float(h @ h))
            big.append(float(whole @ whole))

    to_target.run_to_target(env, unit.setting.loss, forgetting.Design.on_policy_at(BATCH), [lr], PILOT_RUNS,
                            unit.optimizer, math.inf, steps, seed=PILOT_SEED + unit.instance, observer=observer)
    b_simple = noise_scale_lib.pooled_two_batch(small, big, BATCH // 2, BATCH, rng, n_boot=BOOTS)
    drift = None if isinstance(env, QuadraticEnv) else measure_drift(  # history: (steps, runs, d)
        env, np.asarray(history), np.random.default_rng([unit.instance, PILOT_SEED, len(unit.setting.name), 3]))
    return unit.store.put(payload, {
        "lr": lr, "steps": steps, "runs": PILOT_RUNS, "drift": drift,
        "rescore_samples": RESCORE_SAMPLES if drift is not None else 0,
        "b_simple": {**b_simple.to_dict(),
                     "what": f"two-batch B_simple of every step's batch of the user's run of the recipe ({steps} steps "
                             f"of on-policy B = {BATCH}, seed {PILOT_SEED} + instance), pooled over the run"}})


def measure_noise_scale(unit: Unit) -> dict:
    """b from the seed-mean on-policy steps at every batch (seed-bootstrap interval, the step size re-tuned in each
    replicate), and on the quadratic from the exact expected curves."""
    batches = np.array(sorted(unit.options.on_policy_batches), dtype=float)
    steps = np.stack([design_steps(unit.runs[f"on-policy B={int(b)}"]) for b in batches], axis=1)  # (BOOTS+1, nB)
    fits = [fit_noise_scale(row, batches) for row in steps]
    s_min, b_noise = fits[0]
    boots = np.array([f[1] for f in fits[1:]])
    ranked = np.where(np.isnan(boots), np.inf, boots)
    lo, hi = quantile_interval(ranked, (0.05, 0.95), "order")
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
    spec = design_spec(design)
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
    # a selective design's z ([E8]) at its tuned step size (the best one tried when none reached); dynamic sampling's
    # generation rounds an update there too ([E11]), which its compute counts
    at = best if best is not None else 0
    z = record["zero_std_share"][at] if "zero_std_share" in record else None
    rounds = {"refill_rounds": record["refill_rounds"][at]} if "refill_rounds" in record else {}
    return {"label": label, "design": spec, "steps": steps.tolist(), "reached": record["reached"],
            "at_edge": record["at_edge"], "lr": record["lrs"][best] if best is not None else None,
            "extended": record["extended"], "hovered": bool(best is not None and 0 < touch < 0.8 * steps[0]),
            "curve": record["curve"], "curve_steps": record["curve_steps"],
            **({"zero_std_share": z} if z is not None else {}), **rounds}


def pilot_query(pilot: dict, optimizer: str, mu: float, floor: float, max_steps_ratio: float = 1000.0,
                max_epochs: int = 1, max_staleness: int = 0, max_work_ratio: float = 1000.0,
                selective: bool = False) -> tuple[advice.Query, list[str]]:
    """The query ``replay-theory optimal`` gets from this pilot's numbers (``-B 256 --noise-scale B_simple --kappa kappa
    --optimizer OPT --group-size 8 --latency-floor FLOOR`` and the drift table a profile carries), and what was left out
    and why. B_simple is the user's logged run's (``pilot["recipe_log"]``, ``measure_recipe_log``: what ``calibrate
    --from-log --grad-norms`` pools from the TRL trainer's noise_scale.jsonl) in every cell; a record from before it
    has the pilot's own. Left out: the pilot's kappa and drift where the user would not run it (``pilot_affordable``:
    one step and its curvature pairs cost more than PILOT_FRACTION of the recipe at this mu and floor; without a log's
    b, nothing is measured), a B_simple not resolved > 0 (optimal then says to stay at B), a kappa optimal refuses
    (outside [KAPPA_MIN, the optimizer's stability limit): the user asks again without it). ``max_epochs`` > 1
    (--families epochs): optimal searches epoch designs too (``--max-epochs``);
    ``max_staleness`` 1 (--families overlap), overlapped ones (``--max-staleness``); ``max_work_ratio``
    (``--max-work-ratio``, 1000: none): the fastest design within that work budget. ``selective`` (--families
    selective): the pilot's share of groups with equal rewards as ``--zero-share`` (optimal then prices selective
    replay, [E8]); none on the quadratic (no groups) or where the pilot saw none."""
    from ...advise.optimal import KAPPA_MIN

    common = {"mu": float(mu), "batch_size": BATCH, "optimizer": optimizer, "beta1": BETA1, "group_size": GROUP,
              "floor": float(floor), "max_steps_ratio": float(max_steps_ratio), "max_epochs": int(max_epochs),
              "max_staleness": int(max_staleness), "max_work_ratio": float(max_work_ratio)}
    logged = "recipe_log" in pilot  # B_simple from the user's logged run (records before it: the pilot's)
    simple = (pilot["recipe_log"] if logged else pilot).get("b_simple") or {}
    b_source = "B_simple over the user's logged run of the recipe" if logged else "the pilot's B_simple"
    b_noise = simple.get("b_noise")
    if not pilot_affordable(pilot, mu, floor):  # the user runs no pilot: optimal -B 256 with the log's b at most
        rescoring = log_compute(pilot) if "rescored" in ((pilot.get("recipe_log") or {}).get("drift") or {}) else 0
        why = (f"no pilot: one of {pilot['steps']} step(s) costs more than {100 * PILOT_FRACTION:g}% of the recipe's "
               f"{pilot['recipe_steps']:g} steps at mu {mu:g}, floor {floor:g}"
               + (f" with the logged run's re-scoring ({rescoring:.0f} sample-updates)" if rescoring else ""))
        if not logged or b_noise is None or not (math.isfinite(b_noise) and b_noise > 0):
            return advice.Query(**common), [why]
        staleness = drift_staleness(pilot, piloted=False)
        if staleness.oldest_measured < 1:  # a record from before the log's drift, or a one-step log
            return advice.Query(**common, b_noise=b_noise, b_noise_source=b_source), [
                why + "; the log's B_simple alone (no kappa, no staleness cost measured: on-policy answers only)"]
        drift = "no policy to drift (the quadratic)" if staleness is forgetting.NO_POLICY else "drift"
        return advice.Query(**common, b_noise=b_noise, b_noise_source=b_source, staleness=staleness), [
            why + f"; the log's B_simple and {drift} (no kappa: psi = 1, the optimizer taken never to forget)"]
    notes = []
    if b_noise is None or not (math.isfinite(b_noise) and b_noise > 0):
        low = (simple.get("b_noise_interval") or [None])[0]
        if low is not None and math.isfinite(low) and low > 0:  # the least b the data allow (the guard prices 256x it)
            notes.append(f"B_simple {b_noise}: not resolved > 0, --noise-scale its 90% interval's lower end {low:.3g}")
            b_noise = low
        else:
            notes.append(f"B_simple {b_noise}: not resolved > 0, no --noise-scale")
            b_noise = None
    kappa = (pilot.get("kappa_pairs") or {}).get("kappa")
    if kappa is not None and not KAPPA_MIN <= kappa < forgetting.stable_kappa(optimizer, BETA1):
        notes.append(f"kappa {kappa:.3g}: outside optimal's range, no --kappa")
        kappa = None
    elif kappa is None:
        notes.append("no kappa from the pilot")
    staleness = drift_staleness(pilot, piloted=True)  # the log's drift, the pilot's where larger
    zero_share = pilot.get("zero_share") if selective else None
    if selective and zero_share is None:
        notes.append("no zero share: the pilot drew no groups (the quadratic), no --zero-share")
    elif zero_share is not None and not 0 < zero_share < 1:
        notes.append(f"zero share {zero_share:.3g}: no group of equal rewards (0) or no informative one (1), "
                     f"no --zero-share")
        zero_share = None
    query = advice.Query(**common, b_noise=b_noise, b_noise_source=b_source, kappa=kappa,
                         kappa_source="the pilot's curvature pairs", pilot_batch=BATCH, staleness=staleness,
                         **({"zero_share": zero_share, "zero_share_source": "the pilot's share of groups with equal "
                             "rewards"} if zero_share is not None else {}))
    return query, notes


def printed_design(pilot: dict, optimizer: str, mu: float, floor: float, max_steps_ratio: float = 1000.0,
                   max_epochs: int = 1, max_staleness: int = 0, max_work_ratio: float = 1000.0,
                   selective: bool = False) -> forgetting.Design:
    """The design ``optimal`` answers with for this pilot and cell (``advise.advice.advise``: the steps cap
    ``--max-steps-ratio``, the horizon cap, whole groups; without a B_noise, the floor rule's batch at no steps budget
    and on-policy at B under one)."""
    query, _ = pilot_query(pilot, optimizer, mu, floor, max_steps_ratio, max_epochs, max_staleness, max_work_ratio,
                           selective)
    key = repr(query)  # every input of the answer (a frozen dataclass's repr): the cells of a unit share answers
    if key not in _PRINTED:
        answer = advice.advise(query)
        if not answer.get("measured"):  # the floor rule's batch (advice.unmeasured_batch), or B without one
            _PRINTED[key] = forgetting.Design.on_policy_at(int(answer.get("batch_size") or BATCH))
        elif answer["regime"] == "overlapped":
            _PRINTED[key] = forgetting.Design.overlapped_at(int(answer["batch_size"]), int(answer["max_staleness"]))
        elif answer["regime"] == "dynamic":  # dynamic sampling ([E11]): trained by the buffer dynamic
            _PRINTED[key] = SelectiveDesign(int(answer["batch_size"]), int(answer["batch_size"]),
                                            int(answer["batch_size"]), True)
        elif answer["regime"] == "selective":  # trained by the buffer selective, as the grid's selective designs
            _PRINTED[key] = SelectiveDesign(int(answer["batch_size"]), int(answer["rollouts_per_step"]),
                                            int(answer["capacity"]))
        elif answer["regime"] == "epochs":
            _PRINTED[key] = forgetting.Design.epochs_of(int(answer["rollouts_per_step"]), int(answer["epochs"]),
                                                        int(answer["mini_batches"]))
        else:
            _PRINTED[key] = forgetting.Design(int(answer["batch_size"]), int(answer["rollouts_per_step"]),
                                              int(answer["capacity"]), answer["regime"] == "on-policy")
    return _PRINTED[key]


_PRINTED: dict[str, forgetting.Design] = {}
"""printed_design's answers by query (advise searches thousands of designs; scoring asks the same query per row)."""


def _nearest_label(unit: Unit, design: forgetting.Design) -> tuple[str, float]:
    """The tuned grid design nearest to ``design`` (log distance in B, x and y; on-policy to on-policy; an epoch
    design to the epoch designs, in B, R, e and m) and the factor that scales its step size to ``design``'s batch
    (the on-policy batches' sqrt rule: B^(alpha / 2))."""
    alpha = 1.0 if unit.optimizer == "sgd" else 0.5
    grid = [(label, d) for label, d in unit.options.designs(unit.setting.name) if not is_selective(d)]

    def family(d: forgetting.Design) -> tuple[bool, bool, bool]:
        return d.on_policy, d.updates_per_generation > 1, d.max_staleness > 0

    same = [(label, d) for label, d in grid if family(d) == family(design)] or grid

    def distance(d: forgetting.Design) -> float:
        if design.updates_per_generation > 1:
            return sum(math.log(a / b) ** 2 for a, b in (
                (d.batch_size, design.batch_size), (d.rollouts_per_step, design.rollouts_per_step),
                (d.epochs, design.epochs), (d.mini_batches, design.mini_batches)))
        return (math.log(d.batch_size / design.batch_size) ** 2 + math.log(d.x / design.x) ** 2
                + math.log(d.y / design.y) ** 2)

    label, near = min(same, key=lambda item: distance(item[1]))
    return label, (design.batch_size / near.batch_size) ** (alpha / 2)


def train_printed(unit: Unit, pilot: dict) -> list[tuple[str, forgetting.Design]]:
    """Train every design ``optimal`` prints for this unit's pilot over the cells (mu, floor) at each
    ``PRINTED_STEPS_RATIOS`` that is not in the grid:
    the printed answer is scored as printed, off the grid where it falls. Its step size is searched as the grid's
    are (from the nearest tuned design), to the same caps."""
    options = unit.options
    on_grid = {tuple(design_spec(d)) for _, d in options.designs()}
    s_ref = float(design_steps(unit.runs[f"on-policy B={BATCH}"])[0])
    s_ref_exact = unit.exact_runs[f"on-policy B={BATCH}"]["steps_tuned"] if unit.exact else math.nan
    out: list[tuple[str, forgetting.Design]] = []
    cells = [(mu, floor, ratio, NO_WORK_BUDGET) for ratio in printed_ratios(options) for mu in options.mus
             for floor in options.floors]
    cells += [(mu, floor, PRINTED_STEPS_RATIOS[0], work) for work in printed_work_ratios(options) for mu in options.mus
              for floor in options.floors if floor > 0]  # at floor 0 time is work: no budget to answer within
    for mu, floor, ratio, work in cells:
        design = printed_design(pilot, unit.optimizer, mu, floor, ratio, options.max_epochs, options.max_staleness,
                                work, options.prices_zero_share)
        key = tuple(design_spec(design))
        if key in on_grid or any(key == tuple(design_spec(d)) for _, d in out):
            continue
        label = printed_label(design)
        if unit.exact:
            unit.exact_run(label, design, _step_cap(options, design, s_ref_exact))
        else:
            near, factor = _nearest_label(unit, design)
            start = unit.start_from((near, factor), (f"on-policy B={BATCH}", (design.batch_size / BATCH) ** 0.5))
            unit.tune(label, design, start, _step_cap(options, design, s_ref))
        out.append((label, design))
    return out


def printed_ratios(options: Options) -> tuple[float, ...]:
    """The --max-steps-ratio values whose printed answers a unit trains: both, or with --quick the default alone."""
    return PRINTED_STEPS_RATIOS[:1] if options.quick else PRINTED_STEPS_RATIOS


NO_WORK_BUDGET = 1000.0
"""``optimal``'s --max-work-ratio default: no work budget."""


def printed_work_ratios(options: Options) -> tuple[float, ...]:
    """The --max-work-ratio values whose printed answers a unit trains at floors > 0: ``PRINTED_WORK_RATIO``, none
    with --quick."""
    return () if options.quick else (PRINTED_WORK_RATIO,)


def printed_label(design: forgetting.Design) -> str:
    if design.dynamic:
        return f"printed: dynamic B={design.batch_size}"
    if design.selective:
        return f"printed: selective B={design.batch_size} R={design.rollouts_per_step} N={design.capacity}"
    if design.max_staleness:
        return f"printed: overlapped B={design.batch_size}"
    if design.on_policy:
        return f"printed: on-policy B={design.batch_size}"
    if design.updates_per_generation > 1:
        return f"printed: epochs R={design.rollouts_per_step} e={design.epochs} m={design.mini_batches}"
    return f"printed: B={design.batch_size} R={design.rollouts_per_step} N={design.capacity}"


def run_unit(out: str, setting_name: str, optimizer: str, instance: int, options: Options,
             tick: Callable[[], None] | None = None, advance: Callable[[], None] | None = None) -> dict:
    """Train and measure one unit (resuming from OUT/runs), and return its record: every design's steps per seed
    replicate and every measured input. What scoring reads; nothing in it depends on mu or the floor."""
    started = time.time()
    store = Store(Path(out))
    setting = SETTINGS[setting_name]
    boot_index = resample_indices(options.seeds, BOOTS, np.random.default_rng(
        [instance, 8191, len(setting_name), OPTIMIZERS.index(optimizer)]))
    with threadpool_limits(limits=1, user_api="blas"):
        env, inst = instance_record(store, setting, instance)  # run_theory_test stored it before dispatch
        unit = Unit(setting, optimizer, instance, env, inst, store, options, boot_index, tick, advance,
                    exact=isinstance(env, QuadraticEnv) and optimizer == "sgd")
        try:
            train_unit(unit)
            noise = measure_noise_scale(unit)
            tune_at_batch(unit, RECIPE, PILOT_SEED)
            pilot = {**measure_pilot(unit), "recipe_log": measure_recipe_log(unit)}
            printed = train_printed(unit, pilot)
        except UnitNotScored as why:
            return strict({"setting": setting_name, "optimizer": optimizer, "instance": instance, "exact": unit.exact,
                           "target": inst["target"], "j0": inst["j0"], "j_star": inst["j_star"], "designs": [],
                           "not_scored": str(why), "elapsed_s": round(time.time() - started, 1)})
    rows = [design_row(unit, label, design) for label, design in options.designs(setting_name)]
    printed_rows = [design_row(unit, label, design) for label, design in printed]
    return strict({"setting": setting_name, "optimizer": optimizer, "instance": instance, "exact": unit.exact,
                   "target": inst["target"], "j0": inst["j0"], "j_star": inst["j_star"], "designs": rows,
                   "printed": printed_rows, "printed_ratios": list(printed_ratios(options)),
                   **({"printed_work_ratios": list(work)} if (work := printed_work_ratios(options)) else {}),
                   "noise": noise,
                   **({"max_epochs": options.max_epochs} if options.max_epochs > 1 else {}),
                   **({"max_staleness": options.max_staleness} if options.max_staleness else {}),
                   **({"prices_zero_share": True} if options.prices_zero_share else {}),
                   "alpha_measured": measured_alpha(noise), "pilot": pilot,
                   "calibration": calibration_record(unit, pilot), "elapsed_s": round(time.time() - started, 1)})


# --------------------------------------------------------------------------- a unit record, read


def design_of(spec: list) -> forgetting.Design:
    """The design a record's [B, R, N, on_policy], [.., e, m], [.., e, m, k] or [.., e, m, k, "selective"] names."""
    b, r, n, on = spec[:4]
    e, m = spec[4:6] if len(spec) >= 6 else (1, 1)
    k = spec[6] if len(spec) >= 7 else 0
    kind = SelectiveDesign if spec[7:] == ["selective"] else forgetting.Design
    return kind(int(b), int(r), int(n), bool(on), epochs=int(e), mini_batches=int(m), max_staleness=int(k))


def _designs_of(record: dict) -> list[forgetting.Design]:
    return [design_of(d["design"]) for d in record["designs"]]


def staleness_of(record: dict) -> forgetting.Staleness:
    """r(s) = 1 + M2(s), the exact drift of the policy over s steps on the user's logged run (the pilot's where larger;
    ``inputs.drift_staleness``), or none (the quadratic, or a record with no age > 0 measured: it says so)."""
    return drift_staleness(record["pilot"], piloted=True)

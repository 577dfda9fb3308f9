"""The benchmark's objectives: each rule's predicted cost of every design in a unit, from measured inputs.

Papers: experience-replay (docs/REFERENCES.md), Sec. 3, Thm 3.4, Thm 3.5 / App. C.3; McCandlish et al. 2018
(arXiv 1812.06162), Eq. 2.7; the forgetting-aware rule of ``theory/forgetting.py`` (docs/THEORY.md, "Forgetting").
Protocol: docs/SIMULATION.md, 'Does a design rule predict?'.

| code name | symbol | meaning |
|---|---|---|
| ``_paper_values`` | J (Thm 3.5) | the paper's design objective |
| ``_noise_scale_values`` | S_min (1 + B_noise/B) | McCandlish Eq. 2.7 steps times step cost |
| ``_forgetting_*_values`` | -- | the forgetting-aware rule's compute |
| ``measured_compute`` | S (mu max(R, R_floor) + B) | a design's measured compute |
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...theory import design as theory_design
from ...theory import forgetting
from ...theory import noise_scale as noise_scale_lib
from ...theory.guarded import B_FACTORS
from ...theory.profiles import TabulatedProfile
from .inputs import b_noise_kind, read_b_noise
from .measure import _designs_of, staleness_of
from .options import BATCH, BETA1, is_selective


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


def _synchronous_on_policy(d: forgetting.Design) -> bool:
    """On-policy, generated and trained in turn: the baselines' family (an overlapped design, on-policy in its sizes,
    is a --families overlap design, not a baseline's)."""
    return d.on_policy and not d.max_staleness


def _forgetting_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray | NoPick:
    """The forgetting-aware rule from the pilot's estimates: B_noise, kappa from curvature pairs, r(s) = 1 + M2(s)."""
    pairs = record["pilot"].get("kappa_pairs") or {}
    return rule_values(designs, read_b_noise(record["noise"]), pairs.get("kappa"), record["optimizer"], mu, floor,
                       staleness_of(record), pairs.get("reason"))


def _forgetting_b_simple_values(record: dict, designs: Designs, mu: float, floor: float,
                                factor: float = 1.0) -> np.ndarray | NoPick:
    """The forgetting-aware rule fed what a user measures for b: the two-batch B_simple of the pilot's first 10%
    (nothing from the grid's on-policy runs), kappa from curvature pairs and r(s) = 1 + M2(s) as the rule's row;
    ``factor``: priced at that multiple of the measured B_simple."""
    simple = record["pilot"].get("b_simple")
    if simple is None:  # a unit saved before the pilot measured it
        return NoPick("B_simple not measured", "the unit was saved before the pilot measured B_simple")
    measured = simple.get("b_noise")  # null: |G|^2 estimated <= 0 (no signal over the noise: inf), or not finite
    if measured is None or not measured > 0:
        return NoPick("B_simple not resolved", f"the pilot's two-batch B_simple is {measured}: its |G|^2 or tr Sigma "
                                               "estimate is not > 0 (the pilot's noise swamps the difference)")
    pairs = record["pilot"].get("kappa_pairs") or {}
    return rule_values(designs, float(measured) * factor, pairs.get("kappa"), record["optimizer"], mu, floor,
                       staleness_of(record), pairs.get("reason"))


def b_range_values(record: dict, mu: float, floor: float) -> np.ndarray | NoPick:
    """The ranking the printed answer's rule gives the grid: each design's predicted compute from the pilot's inputs
    (``_forgetting_b_simple_values``) averaged in log over the b range the guard prices (b_noise x
    ``guarded.B_FACTORS``, each factor alike): the guard knows b only within decades and picks by the worst case over
    that range (theory/guarded.py); a ranking by the mean over it (the geometric mean of compute) is its expected log
    cost. Chosen on the development readings' units (lowest per-setting mean Spearman at floors 0 / 64:
    heldout-fcb3a90 0.72 / 0.70, heldout2-457 0.53 / 0.61, heldout3-467 0.63 / 0.57, against the measured-b ranking's
    0.58 / 0.52, 0.44 / 0.49, 0.38 / 0.48; ranking by the worst regret over the range: 0.18-0.61). inf where any
    factor's is; a selective design is in no objective's menu (``objective_values``)."""
    designs = _designs_of(record)
    rows = []
    for f in B_FACTORS:
        values = _forgetting_b_simple_values(record, designs, mu, floor, f)
        if isinstance(values, NoPick):
            return values
        rows.append(values)
    with np.errstate(divide="ignore"):
        mean = np.exp(np.log(np.array(rows)).mean(axis=0))  # (designs,) the geometric mean over the factors
    mean[np.array([is_selective(d) for d in designs])] = np.inf
    return mean


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
        if _synchronous_on_policy(d) and d.batch_size == BATCH:
            ns[i] = (1 + b) * (1 + mu) if math.isfinite(b) else 1 + mu
        elif d.batch_size == BATCH and d.x == 1 and d.updates_per_generation == 1 and not d.on_policy:  # a FIFO
            y = d.y
            ns[i] = (float(noise_scale_lib.replay_cost(b, y, mu)) if math.isfinite(b)
                     else (1 + y) * (1 + mu / y))
    return ns


def _calibrated_profile(record: dict) -> TabulatedProfile:
    """The unit's calibrated sigma^2(s) table (floored at 1e-12), the paper's bounds' noise profile."""
    cal = record["calibration"]
    return TabulatedProfile(tuple(float(s) for s in cal["staleness"]),
                            tuple(max(float(v), 1e-12) for v in cal["sigma_sq"]))


def _fifo_at_batch(d: forgetting.Design) -> bool:
    """A design at B = 256 the paper's objectives name: on-policy or a FIFO (x, y), never an epoch or overlapped
    design."""
    return d.batch_size == BATCH and d.updates_per_generation == 1 and not d.max_staleness


def _paper_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray:
    """The paper's J (Thm 3.5) on the FIFO designs at B (others inf: it names no epoch design), from the calibrated
    profile."""
    cal, profile = record["calibration"], _calibrated_profile(record)
    paper = np.full(len(designs), np.inf)
    for i, d in enumerate(designs):
        if _fifo_at_batch(d):
            paper[i] = float(theory_design.paper_objective(d.x, d.y, mu=mu, profile=profile, rho=cal["rho"],
                                                           convention="rollout-cost"))
    return paper


def _finite_budget_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray:
    """The finite-budget Thm 3.4 bound at the pilot's compute on the FIFO designs at B (others inf)."""
    cal, profile = record["calibration"], _calibrated_profile(record)
    budget = design_steps_row(record, f"on-policy B={BATCH}") * (mu + 1) * BATCH
    finite = np.full(len(designs), np.inf)
    for i, d in enumerate(designs):
        if _fifo_at_batch(d):
            x, y = d.x, d.y
            finite[i] = float(theory_design.finite_budget_bound(
                x * BATCH / y, BATCH / y, BATCH, budget=budget, mu=mu, profile=profile, rho=cal["rho"],
                smoothness=cal["smoothness"], bias=cal["bias"], f0=cal["f0"], convention="rollout-cost").value)
    return finite


def _null_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray:
    """The null model on the FIFO designs at B (others inf): compute per update alone."""
    null = np.full(len(designs), np.inf)
    for i, d in enumerate(designs):
        if _fifo_at_batch(d):
            null[i] = (mu / d.y + 1.0) / (mu + 1.0)  # Eq. (2): compute per update only
    return null


def _on_policy_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray:
    """0 at on-policy at B, the batch the user has (others inf)."""
    return np.array([0.0 if (_synchronous_on_policy(d) and d.batch_size == BATCH) else np.inf for d in designs])


def _on_policy_small_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray | NoPick:
    """0 at the smallest on-policy batch whose steps stay within twice on-policy's at B (others inf); NoPick without
    a B_noise > 0 (S_min (1 + B_noise / B) is its step model)."""
    b_noise = read_b_noise(record["noise"])
    no_pick = b_noise_no_pick(b_noise)
    if no_pick is not None:
        return no_pick
    small = np.full(len(designs), np.inf)
    allowed = [i for i, d in enumerate(designs) if _synchronous_on_policy(d) and (
        math.isinf(b_noise) and d.batch_size == BATCH
        or math.isfinite(b_noise) and 1 + b_noise / d.batch_size <= 2 * (1 + b_noise / BATCH))]
    small[min(allowed, key=lambda i: designs[i].batch_size)] = 0.0
    return small


def _on_policy_floor_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray:
    """The trivial rule that exploits the cost model: 0 at on-policy at the smallest grid batch >= max(floor,
    smallest batch) (B = 256 when the floor is above it; others inf). It reads nothing measured: below the floor a
    smaller batch costs as much generation and more steps, above it compute falls with the batch."""
    on = [i for i, d in enumerate(designs) if _synchronous_on_policy(d)]
    above = [i for i in on if designs[i].batch_size >= floor]
    pick = min(above, key=lambda i: designs[i].batch_size) if above else max(on, key=lambda i: designs[i].batch_size)
    values = np.full(len(designs), np.inf)
    values[pick] = 0.0
    return values


def _on_policy_oracle_values(record: dict, designs: Designs, mu: float, floor: float) -> np.ndarray:
    """The oracle of the on-policy family: every on-policy batch at its measured compute (others inf). It reads the
    scored runs by design: the best any rule that only moves the batch can do."""
    compute = measured_compute(record, mu, floor)[0]
    return np.array([compute[i] if _synchronous_on_policy(d) else np.inf for i, d in enumerate(designs)])


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
"""The objectives the benchmark scores, in the order of its tables (advise/optimal.py's ``OBJECTIVES`` name their
``evidence`` among these)."""


def objective_values(record: dict, mu: float, floor: float) -> dict[str, np.ndarray | NoPick]:
    """Every objective's value on every design of the unit (lower = predicted cheaper; inf = not in its menu). A
    selective design (--families selective) is in no objective's menu: they read no zero share (the forgetting rule
    would price it as its uniform twin), so each gives it inf; it counts in the whole grid's best, and in the printed
    answer's menu (optimal --zero-share from the pilot's z, ``Options.prices_zero_share``)."""
    designs = _designs_of(record)
    exact = "exact_b_noise" in record["noise"]
    values = {name: objective.values(record, designs, mu, floor) for name, objective in OBJECTIVES.items()
              if exact or not objective.exact_inputs}
    selective = np.array([is_selective(d) for d in designs])
    if selective.any():
        for v in values.values():
            if isinstance(v, np.ndarray):
                v[selective] = np.inf
    return values


def design_steps_row(record: dict, label: str) -> float:
    return float(next(d for d in record["designs"] if d["label"] == label)["steps"][0])


def measured_compute(record: dict, mu: float, floor: float) -> np.ndarray:
    """(replicates, designs) measured compute: steps x (mu max(R, floor) / (e m) + B), an overlapped design's
    max(mu floor, mu R + B), dynamic sampling's mu max(R, floor) per round it drew ([E11]); inf where not reached."""
    steps = np.array([[np.inf if v is None else v for v in d["steps"]] for d in record["designs"]]).T
    cost = np.array([forgetting.step_cost(d.rollouts_per_step, d.batch_size, mu, floor, d.updates_per_generation,
                                          d.max_staleness > 0, row.get("refill_rounds", 1.0))
                     for d, row in zip(_designs_of(record), record["designs"])])
    return steps * cost


PRINTED = {"printed": "the answer optimal prints from the pilot, as printed (least compute: its default)",
           "printed_with_pilot": "the answer optimal prints, the pilot's compute added",
           "printed_steps2": "the answer optimal prints with --max-steps-ratio 2 (within twice on-policy's steps)"}
"""The printed answer's two rows: scored against the whole grid's best (the grid's best is the menu: a printed design
off the grid can beat it, a regret below 1)."""

WORK_BUDGET = {"printed_work2": "the answer optimal prints with --max-work-ratio 2, its time against the fastest grid "
                                "design within 2x on-policy at B's work (floors > 0)",
               "floor_rule_work2": "the trivial floor rule's pick, its time against the same budgeted best"}
"""Time within a compute budget (``score.score_work_budget``): two rows at floors > 0, each cell saying whether the
pick's measured work broke the budget."""


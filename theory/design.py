"""Optimal replay-buffer design: the Thm 3.4 bound and the Thm 3.5 optimum (x*, y*).

Paper: "Efficient RL training for LLMs with experience replay"
(experience-replay, docs/REFERENCES.md), Sec. 3 and App. C.

| code name            | paper symbol   | meaning                                                            |
|----------------------|----------------|--------------------------------------------------------------------|
| ``x``, ``horizon``   | x = N/R        | staleness horizon: a rollout stays x steps in the FIFO buffer      |
| ``y``                | y = r = B/R    | replay ratio: mean number of updates a rollout contributes to      |
| ``mu_sec3``          | mu (Sec. 3)    | cost of a per-sample update / cost of a rollout: c = R + mu B      |
| ``mu`` (rollout-cost)| mu (Sec. 2)    | cost of a rollout / cost of a per-sample update (Table 1: 5.28)    |
| ``rho``              | rho            | sample-correlation coefficient, Assumption 3.3                     |
| ``sigma_bar_sq``     | sigmabar^2(x)  | buffer-averaged gradient-noise bound (profiles.py)                 |
| ``objective_j``      | J(x, y)        | sigmabar^2(x)(1 + mu y)(1/y + 1/x + rho), App. C.3.1               |
| ``reduced_objective``| I(x)           | sigmabar^2(x)(sqrt(mu) + sqrt(rho + 1/x))^2, App. C.3.1            |
| ``power_law_k``      | K(x)           | x^alpha (sqrt(mu) + sqrt(rho + 1/x)), Eq. (5)                      |

The convention clash. Sec. 3 writes the cost of an update as c = R + mu B and
calls mu "the cost ratio between a forward-backward pass and one rollout
generation, matching the definition above" -- but the definition above (Sec. 2,
App. E, Table 1) is rollout cost / update cost. With that mu the cost is
c = mu R + B, which is the Sec. 3 model with mu -> 1/mu. Every formula below is
written in the Sec. 3 parametrisation (``mu_sec3``); ``mu_sec3_of`` converts.
``"rollout-cost"`` is the default everywhere: it is what 5.28 in Table 1 means,
and it is the reading under which Fig. 4's caption (x*, y* grow with mu) holds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import cast

import numpy as np
from numpy.typing import ArrayLike

from ..checks import (
    invalid,
    one_of,
    require_finite,
    require_in_range,
    require_int,
    require_nonnegative,
    require_one_of,
    require_positive,
)
from .compute import (  # noqa: F401  (the mu conventions live with the other cost formulas; re-exported here)
    CONVENTIONS,
    compute_ratio,
    compute_ratio_from_split_ratio,
    mu_sec3_of,
    replay_ratio_of_split,
    rollout_cost_mu_of,
    rollout_mu_of_convention,
)
from .profiles import AVERAGES, Profile, sigma_bar_sq

# "replay" only when rollouts are reused (y = B/R > 1, so gamma < 1); "over-generation" is y < 1 (gamma > 1:
# more generation than training absorbs); "stale-buffer" is y = 1 with x > 1 (gamma = 1, staler samples).
REGIMES = ("replay", "on-policy", "over-generation", "stale-buffer", "unbounded")

OBJECTIVE_LABELS = {
    "paper-J": "the large-budget limit (Thm 3.5): J = c sigmabar^2(x) (1/B + 1/N + rho/R)",
    "finite-budget": "the Thm 3.4 bound at the given compute budget, step size optimised per design",
}

# Defaults of `replay-theory optimal --objective paper`, justified in docs/OPTIMAL.md ("Its defaults").
DEFAULT_ALPHA = 0.25
DEFAULT_RHO = 0.1


# --------------------------------------------------------------------------- objectives


def objective_j(x: ArrayLike, y: ArrayLike, mu_sec3: float, rho: float, sigma_bar_sq_x: ArrayLike = 1.0) -> np.ndarray:
    """J(x, y) = sigmabar^2(x) (1 + mu y) (1/y + 1/x + rho), App. C.3.1 (cost per R times noise)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    return np.asarray(sigma_bar_sq_x) * (1.0 + mu_sec3 * y) * (1.0 / y + 1.0 / x + rho)  # App. C.3.1


def objective_jrbn(N: ArrayLike, R: ArrayLike, B: ArrayLike, mu_sec3: float, rho: float, profile: Profile,
                   average: str = "integral") -> np.ndarray:
    """J(R, B, N) = (R + mu B) sigmabar^2(N/R) (1/B + 1/N + rho/R), App. C.3.1 before the change of variables."""
    N = np.asarray(N, dtype=float)
    R = np.asarray(R, dtype=float)
    B = np.asarray(B, dtype=float)
    return (R + mu_sec3 * B) * sigma_bar_sq(profile, N / R, average) * (1.0 / B + 1.0 / N + rho / R)


def y_star_given_x(x: ArrayLike, mu_sec3: float, rho: float) -> np.ndarray | float:
    """y*(x) = 1 / sqrt(mu (rho + 1/x)), from dJ/dy = 0 (Thm 3.5). x = inf gives 1/sqrt(mu rho)."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore"):
        y = 1.0 / np.sqrt(mu_sec3 * (rho + 1.0 / x))  # Thm 3.5
    return y if y.ndim else float(y)


def reduced_objective(x: ArrayLike, mu_sec3: float, rho: float, sigma_bar_sq_x: ArrayLike = 1.0) -> np.ndarray:
    """I(x) = J(x, y*(x)) = sigmabar^2(x) (sqrt(mu) + sqrt(rho + 1/x))^2 (Thm 3.5, App. C.3.1)."""
    x = np.asarray(x, dtype=float)
    return np.asarray(sigma_bar_sq_x) * (math.sqrt(mu_sec3) + np.sqrt(rho + 1.0 / x)) ** 2  # Thm 3.5


def power_law_k(x: ArrayLike, mu_sec3: float, alpha: float, rho: float) -> np.ndarray:
    """K(x) = x^alpha (sqrt(mu) + sqrt(rho + 1/x)), Eq. (5): sqrt(I(x)) up to a constant for sigma = (s/tau)^alpha."""
    x = np.asarray(x, dtype=float)
    return x**alpha * (math.sqrt(mu_sec3) + np.sqrt(rho + 1.0 / x))  # Eq. (5)


# --------------------------------------------------------------------------- closed form (power law)


def power_law_optimum(mu_sec3: float, alpha: float, rho: float) -> tuple[float, float]:
    """Unconstrained minimiser (x*, y*) of K(x) for sigma(s) = (s/tau)^alpha, App. C.3.2.

    Stable forms of the printed roots. y* solves rho mu y^2 + 2 alpha mu y + (2 alpha - 1) = 0;
    multiplying the printed root by its conjugate removes the 0/0 at rho = 0:

        y* = (1 - 2 alpha) / (alpha mu + sqrt(alpha^2 mu^2 + mu rho (1 - 2 alpha)))

    and the first-order condition gives x* = mu y*^2 / (2 alpha (1 + mu y*)), which has
    no singularity at mu = rho (the printed x* is 0/0 there).

    alpha >= 1/2: K is increasing, the infimum is at x -> 0 (returns (0, 0)); the printed
    formula's positive root there is spurious (it solves the squared condition only).
    alpha = 0: K is decreasing, x* = inf and y* = 1/sqrt(mu rho) (inf when rho = 0).
    """
    require_positive("mu", mu_sec3)
    require_nonnegative("alpha", alpha)
    require_nonnegative("rho", rho)
    if alpha >= 0.5:
        return 0.0, 0.0
    if alpha == 0.0:
        return math.inf, (math.inf if rho == 0 else 1.0 / math.sqrt(mu_sec3 * rho))
    one_minus = 1.0 - 2.0 * alpha
    y_star = one_minus / (alpha * mu_sec3 + math.sqrt(alpha**2 * mu_sec3**2 + mu_sec3 * rho * one_minus))  # App. C.3.2
    x_star = mu_sec3 * y_star**2 / (2.0 * alpha * (1.0 + mu_sec3 * y_star))  # App. C.3.2
    return x_star, y_star


def printed_power_law_x_star(mu_sec3: float, alpha: float, rho: float) -> float:
    """x* exactly as printed in App. C.3.2 (unstable; kept to document the errata)."""
    num = (-(alpha * mu_sec3 + rho * (1 - 2 * alpha))
           + math.sqrt(alpha**2 * mu_sec3**2 + mu_sec3 * rho * (1 - 2 * alpha)))
    den = 2 * alpha * rho * (mu_sec3 - rho)
    return num / den


def printed_power_law_y_star(mu_sec3: float, alpha: float, rho: float) -> float:
    """y* exactly as printed in App. C.3.2 (0/0 at rho = 0)."""
    return (-alpha * mu_sec3 + math.sqrt(alpha**2 * mu_sec3**2 + mu_sec3 * rho * (1 - 2 * alpha))) / (rho * mu_sec3)


# --------------------------------------------------------------------------- numerical (any profile)


@dataclass(frozen=True)
class NumericOptimum:
    x_star: float
    y_star: float
    objective: float
    at_lower_edge: bool
    at_upper_edge: bool


def numeric_optimum(
    profile: Profile,
    mu_sec3: float,
    rho: float,
    *,
    x_min: float = 1.0,
    x_max: float | None = None,
    average: str = "integral",
    grid_points: int = 512,
) -> NumericOptimum:
    """argmin over x in [x_min, x_max] of I(x) = sigmabar^2(x)(sqrt(mu) + sqrt(rho + 1/x))^2 for ANY profile.

    A log-spaced grid finds the basin (measured tables need not give a convex I),
    then a bounded Brent search in log x refines it. With ``average="discrete"`` the
    horizon is an integer number of steps and the search is exhaustive.
    ``x_max`` defaults to the profile's last measured staleness (tables) or 1e6.
    """
    require_positive("mu", mu_sec3)
    require_nonnegative("rho", rho)
    require_positive("x_min", x_min)
    upper = profile.max_staleness if x_max is None else x_max
    if not math.isfinite(upper):
        upper = 1e6
    if upper <= x_min:
        raise ValueError(f"x_max must be > x_min = {x_min:g}, got {upper:g} (the profile covers too few steps)")

    def objective(x: np.ndarray) -> np.ndarray:
        return reduced_objective(x, mu_sec3, rho, sigma_bar_sq(profile, x, average))

    if average == "discrete":
        grid = np.arange(max(1, math.ceil(x_min)), math.floor(upper) + 1, dtype=float)  # (H,)
        values = objective(grid)
        best = int(np.argmin(values))
        x_star = float(grid[best])
        return NumericOptimum(x_star, float(y_star_given_x(x_star, mu_sec3, rho)), float(values[best]),
                              bool(best == 0), bool(best == grid.size - 1))

    from scipy.optimize import OptimizeResult, minimize_scalar  # lazy: keeps `optimal` startup light

    log_grid = np.linspace(math.log(x_min), math.log(upper), grid_points)  # (G,)
    values = objective(np.exp(log_grid))
    best = int(np.argmin(values))
    lo = log_grid[max(best - 1, 0)]
    hi = log_grid[min(best + 1, grid_points - 1)]
    # scipy's source returns an OptimizeResult through an untyped dispatch that pyright reads as `object`
    refined = cast(OptimizeResult, minimize_scalar(lambda u: float(objective(np.exp(u))), bounds=(lo, hi),
                                                   method="bounded", options={"xatol": 1e-10}))
    log_x = refined.x if refined.fun <= values[best] else log_grid[best]
    x_star = float(math.exp(log_x))
    edge_tol = 1e-6
    return NumericOptimum(
        x_star=x_star,
        y_star=float(y_star_given_x(x_star, mu_sec3, rho)),
        objective=float(objective(np.asarray(x_star))),
        at_lower_edge=bool(log_x - math.log(x_min) < edge_tol),
        at_upper_edge=bool(math.log(upper) - log_x < edge_tol),
    )


# --------------------------------------------------------------------------- Thm 3.4


@dataclass(frozen=True)
class Thm34Bound:
    value: float
    optimization_term: float
    noise_term: float
    eta_max: float
    eta_max_printed: float
    step_size_valid: bool


def thm34_bound(
    *,
    eta: float,
    N: float,
    R: float,
    B: float,
    kappa: float,
    L: float,
    profile: Profile,
    rho: float,
    F0: float,
    steps: int,
    average: str = "integral",
) -> Thm34Bound:
    """Right-hand side of Thm 3.4 on (1/T) sum ||grad F(theta_t)||^2.

        12 F0 / (eta T) + 8 eta (4 N^2 kappa^2 eta / R^2 + L) sigmabar^2(N/R) (1/B + 1/N + rho/R)

    The step-size condition printed in Thm 3.4 is eta <= min(R / (2 sqrt2 kappa N), L/2); the proof
    (App. C.2, Eq. (3)) needs L eta < 1/2, i.e. eta < 1/(2L). ``eta_max`` is the proof's condition,
    ``eta_max_printed`` the printed one (see docs/ERRATA.md).
    """
    for name, value in (("eta", eta), ("N", N), ("R", R), ("B", B), ("L", L), ("steps", steps)):
        require_positive(name, value)
    require_nonnegative("kappa", kappa)
    require_nonnegative("F0", F0)
    require_in_range("rho", rho, 0.0, 1.0)
    if N < R:
        raise ValueError(f"N must be >= R (the buffer holds at least one step of rollouts), got N={N:g}, R={R:g}")
    bias_limit = math.inf if kappa == 0 else R / (2.0 * math.sqrt(2.0) * kappa * N)  # App. C.2, Eq. (4)
    eta_max = min(bias_limit, 1.0 / (2.0 * L))  # App. C.2, Eq. (3): L eta < 1/2
    eta_max_printed = min(bias_limit, L / 2.0)  # Thm 3.4 as printed
    sbar = float(sigma_bar_sq(profile, N / R, average))
    optimization_term = 12.0 * F0 / (eta * steps)  # Thm 3.4
    noise_term = 8.0 * eta * (4.0 * N**2 * kappa**2 * eta / R**2 + L) * sbar * (1.0 / B + 1.0 / N + rho / R)  # Thm 3.4
    return Thm34Bound(optimization_term + noise_term, optimization_term, noise_term, eta_max, eta_max_printed,
                      bool(eta < eta_max))


# --------------------------------------------------------------------------- the user-facing answer


@dataclass(frozen=True)
class DesignQuery:
    """The paper's design question (Thm 3.4/3.5 inputs); ``optimal``'s options are the fields of
    :class:`~replay_theory.advise.optimal.OptimalQuery`, which builds this one."""

    mu: float
    """Rollout cost ratio; meaning set by ``convention`` (default: rollout cost / per-sample update cost, Table 1)."""
    alpha: float | None = None
    """Power-law exponent of sigma(s) = (s/tau)^alpha (ignored with a profile). Default 0.25."""
    rho: float | None = None
    """Sample correlation coefficient of Assumption 3.3, in [0, 1]. Default 0.1 (or the profile's)."""
    convention: str = "rollout-cost"
    """'rollout-cost' (Sec. 2 / Table 1, default) or 'paper-sec3' (literal c = R + mu B)."""
    rollouts_per_step: int | None = None
    """R: fresh rollouts generated per training step; turns (x*, y*) into integer N and B."""
    batch_size: int | None = None
    """B: samples per training step; the alternative to R for concrete advice."""
    profile: Profile | None = None
    """A measured or assumed sigma^2(s); replaces the power law and is optimised numerically."""
    profile_description: str | None = None
    profile_rho: float | None = None
    average: str = "integral"
    """How sigma^2 is averaged over the buffer: 'integral' (paper) or 'discrete' (exact, integer x)."""

    def validated(self) -> "DesignQuery":
        require_positive("mu", self.mu)
        require_one_of("convention", self.convention, CONVENTIONS)
        if self.alpha is not None:
            require_finite("alpha", self.alpha)
            require_nonnegative("alpha", self.alpha)
        if self.rho is not None:
            require_in_range("rho", self.rho, 0.0, 1.0)
        if self.rollouts_per_step is not None:
            require_int("rollouts-per-step", self.rollouts_per_step, 1)
        if self.batch_size is not None:
            require_int("batch-size", self.batch_size, 1)
        if self.rollouts_per_step is not None and self.batch_size is not None:
            raise ValueError("give either rollouts-per-step or batch-size, not both")
        require_one_of("average", self.average, AVERAGES)
        return self


@dataclass(frozen=True)
class PaperAnswer:
    """The paper rule's answer (Thm 3.5's J, or the Thm 3.4 bound at a budget): optimal ratios, regime, and (if R or
    B was given) integer N, B and the GPU split. Its integer design is ``design`` (theory/designs.py's one type)."""

    mu: float
    convention: str
    mu_rollout_cost: float
    mu_sec3: float
    alpha: float | None
    rho: float
    profile: str
    method: str
    x_star: float
    y_star: float
    x_star_unconstrained: float
    y_star_unconstrained: float
    regime: str
    rollouts_per_step: int | None
    capacity: int | None
    batch_size: int | None
    workers_per_trainer: float | None
    compute_ratio: float | None
    notes: list[str] = field(default_factory=list)
    regime_text: str = ""
    """What the design is, in words (never "replay" when gamma > 1 or y < 1)."""
    advice: str = ""
    """What to do about it."""
    constraint: str | None = None
    """Set when the reported design is not the objective's unconstrained optimum (a clamp), saying why."""
    objective: str = "paper-J"
    """'paper-J': Thm 3.5's J, the large-budget limit; 'finite-budget': the Thm 3.4 bound at ``budget``."""
    budget: float | None = None
    budget_regime: str | None = None
    """'step-limited' (the step-size cap binds: more updates per compute win) or 'noise-limited'."""
    smoothness: float | None = None
    bias: float | None = None
    f0: float | None = None
    eta: float | None = None
    eta_max: float | None = None
    updates: float | None = None
    bound: float | None = None
    bound_terms: dict | None = None
    large_budget_limit: dict | None = None
    """For a finite-budget design: the paper-J design at the same fixed B or R (``fixed``: "B" or "R"; its
    ``capacity``, ``rollouts_per_step``, ``batch_size``, x, y and regime), and its bound at this budget."""

    @property
    def large_budget_bound_ratio(self) -> float | None:
        """Thm 3.4's bound at ``budget`` of the large-budget limit (Thm 3.5's J design) over this design's bound."""
        if self.large_budget_limit is None or self.bound is None:
            return None
        return self.large_budget_limit["bound_at_budget"] / self.bound

    def to_json_dict(self) -> dict:
        """Plain JSON types; infinities and NaN become null."""

        def clean(value):
            if isinstance(value, (float, np.floating)):
                return float(value) if math.isfinite(value) else None
            if isinstance(value, (bool, np.bool_)):
                return bool(value)
            if isinstance(value, (list, tuple)):
                return [clean(v) for v in value]
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            return value

        data = {key: clean(value) for key, value in asdict(self).items()}
        data["objective_label"] = OBJECTIVE_LABELS[self.objective]
        return data


_ONE = 1e-12  # y = B/R within this of 1 counts as one use per rollout


def classify_regime(x: float, y: float, *, unbounded: bool = False) -> str:
    """The honest name of a design (x = N/R, y = B/R): "replay" only when rollouts are reused (y > 1).

    gamma = (1 + mu/y) / (1 + mu) (Eq. 2 with W/T = mu/y) exceeds 1 exactly when y < 1, whatever mu:
    such a design generates more than its updates train on, so it is never called replay.
    """
    if unbounded:
        return "unbounded"
    if y < 1.0 - _ONE:
        return "over-generation"
    if y <= 1.0 + _ONE:
        return "on-policy" if x <= 1.0 + _ONE else "stale-buffer"
    return "replay"


@dataclass(frozen=True)
class Split:
    """A (W, T) GPU split with a buffer (Eq. 2; ``replay-theory gamma``)."""

    workers: float
    """W: inference GPUs."""
    trainers: float
    """T: trainer GPUs."""
    mu: float
    """Rollout cost / per-sample update cost (Table 1 meaning)."""
    workers_per_trainer: float
    """W/T."""
    compute_ratio: float
    """gamma = (1 + W/T) / (1 + mu): compute per update vs on-policy (Eq. 2)."""
    replay_ratio: float
    """y = mu T / W: updates each rollout contributes to on average."""
    regime: str
    """classify_regime at x = 1: "replay" (y > 1, gamma < 1), "on-policy" (y = 1) or "over-generation" (y < 1)."""


def split_design(workers: float, trainers: float, mu: float) -> Split:
    """gamma, y and the regime of a (W, T) split: compute.compute_ratio, compute.replay_ratio_of_split and
    classify_regime (gamma > 1 exactly when y < 1). Raises ValueError naming workers, trainers or mu."""
    gamma = float(compute_ratio(workers, trainers, mu))
    y = float(replay_ratio_of_split(workers, trainers, mu))
    return Split(workers, trainers, mu, workers / trainers, gamma, y, classify_regime(1.0, y))


def describe_regime(regime: str, *, x: float, y: float, mu_rollout: float,
                    gamma: float | None = None) -> tuple[str, str]:
    """(what the design is, what to do), in words shared by `optimal`, `validate predict` and the docs."""
    if gamma is None and math.isfinite(y) and y > 0:
        gamma = float(compute_ratio_from_split_ratio(mu_rollout / y, mu_rollout))
    g = "-" if gamma is None else f"{gamma:.3g}"
    if regime == "replay":
        return (f"replay: each rollout is used y = {y:.3g} times while it ages up to x = {x:.3g} steps; "
                f"an update costs gamma = {g} of its on-policy compute",
                f"run it with W/T = mu/y = {mu_rollout / y:.3g} inference GPUs per trainer GPU (none idle)")
    if regime == "on-policy":
        return ("on-policy: every rollout is used once, in the step that generated it (N = B = R, gamma = 1)",
                f"no buffer: reuse does not pay under this model; split W/T = mu = {mu_rollout:.3g}")
    if regime == "over-generation":
        return (f"not replay: more generation than training can absorb (y = B/R = {y:.3g} < 1: a rollout is "
                f"trained on {y:.3g} times on average and some never are); gamma = {g} > 1, i.e. each update "
                f"costs more compute than on-policy",
                f"raise B to R (or cut R to B) to train on-policy, or move GPUs from inference to training "
                f"(W/T <= mu = {mu_rollout:.3g}); the model picks it only because rollouts are cheap here and "
                f"extra fresh rollouts shrink its 1/N and rho/R noise terms")
    if regime == "stale-buffer":
        return (f"a buffer without reuse: y = 1 (gamma = 1, on-policy compute per update) but samples up to "
                f"x = {x:.3g} steps stale",
                "compare with on-policy: the compute per update is the same and only the 1/N noise term differs")
    if regime == "unbounded":
        return ("unbounded: the objective still falls at the largest horizon considered (staleness costs "
                "little in this model)",
                "use the largest buffer you can afford, and measure sigma^2(s) further out before trusting it")
    raise invalid("regime", one_of(REGIMES), regime)


@dataclass(frozen=True)
class _FreeOptimum:
    """The bound's minimiser (x, y) before the feasibility clamp, how it was found, and the regime it implies."""

    alpha: float | None
    rho: float
    x: float
    y: float
    method: str
    profile_text: str
    regime: str
    constraint: str | None
    note: str | None


def _power_law_free_optimum(query: DesignQuery, mu_sec3: float) -> _FreeOptimum:
    """App. C.3.2's closed form for sigma(s) = (s/tau)^alpha; alpha >= 1/2 or x* < 1 fall to the on-policy corner."""
    alpha = DEFAULT_ALPHA if query.alpha is None else query.alpha
    rho = DEFAULT_RHO if query.rho is None else query.rho
    x_free, y_free = power_law_optimum(mu_sec3, alpha, rho)
    constraint = note = None
    if alpha >= 0.5:
        regime = "on-policy"
        constraint = ("alpha >= 1/2: the bound grows with the horizon and its infimum is at x -> 0 (N < R, "
                      "infeasible); clamped to the on-policy corner x = y = 1")
    elif alpha == 0.0:
        regime = "unbounded"
        note = "alpha = 0: staleness costs nothing in this model, so the buffer should be as large as possible"
    elif x_free < 1.0:
        regime = "on-policy"
        constraint = (f"x* = {x_free:.3g} < 1 would mean N < R (infeasible); clamped to the on-policy corner "
                      f"x = y = 1 (at x = 1 the bound alone would pick y = "
                      f"{float(y_star_given_x(1.0, mu_sec3, rho)):.3g})")
    else:
        regime = classify_regime(x_free, y_free)
    return _FreeOptimum(alpha, rho, x_free, y_free, "closed form (power law, App. C.3.2)",
                        f"power law sigma(s) = (s/tau)^{alpha:g}", regime, constraint, note)


def _profile_free_optimum(query: DesignQuery, profile: Profile, mu_sec3: float) -> _FreeOptimum:
    """I(x) minimised numerically over the measured profile; an optimum at either edge of its horizons is a corner."""
    rho_source = query.rho if query.rho is not None else query.profile_rho
    rho = DEFAULT_RHO if rho_source is None else rho_source
    optimum = numeric_optimum(profile, mu_sec3, rho, average=query.average)
    x_free, y_free = optimum.x_star, optimum.y_star
    constraint = note = None
    if optimum.at_lower_edge:
        regime = "on-policy"
        constraint = (f"I(x) is smallest at the shortest horizon x = N/R = 1; clamped to the on-policy corner "
                      f"x = y = 1 (at x = 1 the bound alone would pick y = {y_free:.3g})")
    elif optimum.at_upper_edge:
        regime = "unbounded"
        note = (f"I(x) still falls at the largest horizon considered (x = {x_free:.4g}): "
                "the buffer should be as large as the profile allows; measure further out")
    else:
        regime = classify_regime(x_free, y_free)
    return _FreeOptimum(None, rho, x_free, y_free,
                        f"numerical minimisation of I(x) ({query.average} average of sigma^2)",
                        query.profile_description or type(query.profile).__name__, regime, constraint, note)


def _clamped_optimum(free: _FreeOptimum, query: DesignQuery, mu_sec3: float) -> tuple[float, float]:
    """(x*, y*): the on-policy corner x = y = 1, an infinite horizon (Eq. (5)'s y* at x -> inf), or the free optimum."""
    if free.regime == "on-policy":
        return 1.0, 1.0
    if free.regime == "unbounded":
        return math.inf, (free.y if query.profile is None else float(y_star_given_x(math.inf, mu_sec3, free.rho)))
    return free.x, free.y


def _integer_sizes(query: DesignQuery, x_star: float, y_star: float) -> tuple[int | None, int | None, int | None]:
    """(R, N, B) rounded from (x*, y*) at the user's R or B; None where neither fixes the scale."""
    R = query.rollouts_per_step
    N = B = None
    if query.batch_size is not None and math.isfinite(y_star):
        R = max(1, round(query.batch_size / y_star))
    if R is not None:
        B = (query.batch_size if query.batch_size is not None
             else (max(1, round(y_star * R)) if math.isfinite(y_star) else None))
        N = max(R, round(x_star * R)) if math.isfinite(x_star) else None
    return R, N, B


def _worker_split(mu_rollout: float, y: float) -> tuple[float | None, float | None]:
    """(W/T, gamma) at replay ratio y; None for both where y is not a positive number."""
    if not (math.isfinite(y) and y > 0):
        return None, None
    wpt = mu_rollout / y  # W/T = mu / y, rollout-cost meaning
    return wpt, float(compute_ratio_from_split_ratio(wpt, mu_rollout))  # Eq. (2)


def optimal_design(query: DesignQuery) -> PaperAnswer:
    """Thm 3.5 turned into advice: (x*, y*), the regime, integer N and B, W/T and gamma."""
    query = query.validated()
    mu_sec3 = float(mu_sec3_of(query.mu, query.convention))
    mu_rollout = query.mu if query.convention == "rollout-cost" else 1.0 / query.mu
    free = (_power_law_free_optimum(query, mu_sec3) if query.profile is None
            else _profile_free_optimum(query, query.profile, mu_sec3))
    notes = [] if free.note is None else [free.note]
    regime = free.regime
    x_star, y_star = _clamped_optimum(free, query, mu_sec3)
    if regime == "on-policy":
        notes.append("on-policy: each rollout used once, N = B = R, W/T = rollout-cost mu, gamma = 1")
    R, N, B = _integer_sizes(query, x_star, y_star)
    wpt, gamma = _worker_split(mu_rollout, (B / R) if (B is not None and R is not None) else y_star)
    text, advice = describe_regime(regime, x=x_star, y=y_star, mu_rollout=mu_rollout, gamma=gamma)
    if query.convention == "paper-sec3":
        notes.append(f"paper-sec3 reads mu = {query.mu:g} as update cost / rollout cost, "
                     f"i.e. rollouts cost {mu_rollout:.3g}x an update")

    return PaperAnswer(
        mu=query.mu,
        convention=query.convention,
        mu_rollout_cost=mu_rollout,
        mu_sec3=mu_sec3,
        alpha=free.alpha,
        rho=free.rho,
        profile=free.profile_text,
        method=free.method,
        x_star=x_star,
        y_star=y_star,
        x_star_unconstrained=free.x,
        y_star_unconstrained=free.y,
        regime=regime,
        rollouts_per_step=R,
        capacity=N,
        batch_size=B,
        workers_per_trainer=wpt,
        compute_ratio=gamma,
        notes=notes,
        regime_text=text,
        advice=advice,
        constraint=free.constraint,
        objective="paper-J",
    )


# --------------------------------------------------------------------------- finite budget (Thm 3.4 itself)
#
# Thm 3.4 at a compute budget C, with T = C / c updates of cost c each:
#
#     V(eta) = A / eta + b1 eta + b2 eta^2,
#     A  = 12 F0 c / C                          (optimisation term, 12 F0 / (eta T))
#     b1 = 8 L s S                              (noise through smoothness)
#     b2 = 32 kappa^2 x^2 s S,  x = N/R         (noise through the bias of stale samples)
#     s  = sigmabar^2(x),  S = 1/B + 1/N + rho/R
#
# on 0 < eta <= eta_max = min(1/(2L), 1/(2 sqrt2 kappa x)) (App. C.2 Eqs. (3)-(4); docs/ERRATA.md E6).
# V is convex in eta; the stationary point solves 2 b2 eta^3 + b1 eta^2 - A = 0. With eta = sqrt(A/b1)/w
# and beta = b2 sqrt(A) / b1^(3/2) the cubic is w^3 - w - 2 beta = 0, whose positive root is
#     w = (2/sqrt3) cos(arccos(3 sqrt3 beta)/3)   (3 sqrt3 beta <= 1)
#     w = (2/sqrt3) cosh(arccosh(3 sqrt3 beta)/3) (3 sqrt3 beta >  1)
# (derivation `finite-budget`, theory/symbolic.py; docs/THEORY.md). Both forms are free of cancellation.

BUDGET_REGIMES = ("step-limited", "noise-limited")


def _cost_per_update(N: np.ndarray | None, R: np.ndarray, B: np.ndarray, mu: float, convention: str) -> np.ndarray:
    """c: rollout-cost c = mu R + B (per-sample update units); paper-sec3 c = R + mu B (rollout units)."""
    del N
    if convention == "rollout-cost":
        return mu * R + B  # Sec. 2 mu: R rollouts at mu each, B per-sample updates at 1 each
    return R + mu * B  # Sec. 3 as printed


def eta_star_unconstrained(A: ArrayLike, b1: ArrayLike, b2: ArrayLike) -> np.ndarray:
    """Positive root of 2 b2 eta^3 + b1 eta^2 - A = 0 (closed form), the minimiser of A/eta + b1 eta + b2 eta^2.

    Requires A >= 0, b1 > 0, b2 >= 0. Uses the substitution eta = sqrt(A/b1)/w, w^3 - w - 2 beta = 0,
    beta = b2 sqrt(A)/b1^(3/2), and the trigonometric / hyperbolic root, which has no cancellation at
    beta -> 0 (the large-budget limit, eta -> sqrt(A/b1)) nor at beta -> inf (eta -> (A/(2 b2))^(1/3)).
    """
    A = np.asarray(A, dtype=float)
    b1 = np.asarray(b1, dtype=float)
    b2 = np.asarray(b2, dtype=float)
    beta = b2 * np.sqrt(A) / b1**1.5
    z = 3.0 * math.sqrt(3.0) * beta  # cos(3 phi) or cosh(3 phi)
    with np.errstate(invalid="ignore", over="ignore"):
        w_trig = (2.0 / math.sqrt(3.0)) * np.cos(np.arccos(np.minimum(z, 1.0)) / 3.0)
        # cosh(arccosh(z)/3) for huge z overflows nothing: arccosh(z) ~ log(2z)
        w_hyp = (2.0 / math.sqrt(3.0)) * np.cosh(np.arccosh(np.maximum(z, 1.0)) / 3.0)
    w = np.where(z <= 1.0, w_trig, w_hyp)
    return np.sqrt(A / b1) / w


def eta_star_numeric(A: ArrayLike, b1: ArrayLike, b2: ArrayLike, iterations: int = 200) -> np.ndarray:
    """The same root by bisection in log eta on a bracket that always holds it (the robust fallback).

    With f(eta) = 2 b2 eta^3 + b1 eta^2 - A: each positive term alone reaching A bounds the root above,
    eta <= min(sqrt(A/b1), (A/(2 b2))^(1/3)); both terms at most A/2 bound it below.
    """
    A, b1, b2 = (np.asarray(v, dtype=float) for v in (A, b1, b2))
    A, b1, b2 = np.broadcast_arrays(A, b1, b2)
    with np.errstate(divide="ignore"):
        hi = np.minimum(np.sqrt(A / b1), np.where(b2 > 0, np.cbrt(A / (2.0 * np.where(b2 > 0, b2, 1.0))), np.inf))
        lo = np.minimum(np.sqrt(A / (2.0 * b1)), np.where(b2 > 0, np.cbrt(A / (4.0 * np.where(b2 > 0, b2, 1.0))),
                                                           np.inf))
    lo_log, hi_log = np.log(lo), np.log(hi)
    for _ in range(iterations):
        mid = 0.5 * (lo_log + hi_log)
        eta = np.exp(mid)
        positive = 2.0 * b2 * eta**3 + b1 * eta**2 - A > 0
        hi_log = np.where(positive, mid, hi_log)
        lo_log = np.where(positive, lo_log, mid)
    return np.exp(0.5 * (lo_log + hi_log))


def eta_star(A: ArrayLike, b1: ArrayLike, b2: ArrayLike) -> np.ndarray:
    """Closed-form eta*, checked by its cubic's relative residual; bisection wherever the check fails."""
    A, b1, b2 = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (A, b1, b2)))
    eta = eta_star_unconstrained(A, b1, b2)
    residual = np.abs(2.0 * b2 * eta**3 + b1 * eta**2 - A) / np.where(A > 0, A, 1.0)
    bad = ~np.isfinite(eta) | (residual > 1e-9)
    if np.any(bad):
        eta = np.where(bad, eta_star_numeric(A, b1, b2), eta)
    return eta


@dataclass(frozen=True)
class FiniteBudgetBound:
    """Thm 3.4's right-hand side at a compute budget, minimised over the step size (arrays broadcast)."""

    value: np.ndarray | float
    """min over 0 < eta <= eta_max of the bound; inf where the budget buys less than one update."""
    eta: np.ndarray | float
    """the minimising step size (NaN where infeasible)."""
    updates: np.ndarray | float
    """T = budget / cost per update (real: integer constraints on T are relaxed)."""
    terms: dict
    """optimization = 12 F0/(eta T), noise_smoothness = 8 eta L s S, noise_bias = 32 eta^2 x^2 kappa^2 s S,
    eta_max, eta_unconstrained, step_limited (eta* at the cap), cost_per_update, sigma_bar_sq, noise_factor S."""


def _as_float(value: np.ndarray) -> np.ndarray | float:
    return value if np.ndim(value) else float(value)


def _check_budget_inputs(budget, mu, rho, smoothness, bias, f0, convention) -> None:
    require_positive("budget", budget)
    require_positive("mu", mu)
    require_in_range("rho", rho, 0.0, 1.0)
    require_positive("smoothness", smoothness)
    require_finite("bias", bias)
    require_nonnegative("bias", bias)
    require_positive("f0", f0)
    require_one_of("convention", convention, CONVENTIONS)


def _bound_coefficients(N: np.ndarray, R: np.ndarray, B: np.ndarray, mu: float, profile: Profile, rho: float,
                        smoothness: float, bias: float, convention: str, average: str):
    """Thm 3.4's per-design coefficients, shared by the bound at a budget and its dual, the compute to a target:
    c (cost per update), s = sigmabar^2(x), S = 1/B + 1/N + rho/R, b1, b2 and eta_max (arrays, broadcast)."""
    x = N / R
    cost = _cost_per_update(N, R, B, mu, convention)
    s = np.asarray(sigma_bar_sq(profile, x, average), dtype=float)
    S = 1.0 / B + 1.0 / N + rho / R  # App. C.2.3
    b1 = 8.0 * smoothness * s * S  # Thm 3.4: 8 eta L sigmabar^2 S
    b2 = 32.0 * bias**2 * x**2 * s * S  # Thm 3.4: 8 eta (4 N^2 kappa^2 eta / R^2) sigmabar^2 S
    with np.errstate(divide="ignore"):
        bias_cap = np.where(bias > 0, 1.0 / (2.0 * math.sqrt(2.0) * max(bias, 1e-300) * x), np.inf)  # Eq. (4)
    eta_max = np.minimum(1.0 / (2.0 * smoothness), bias_cap)  # Eq. (3): L eta <= 1/2 (docs/THEORY.md)
    return cost, s, S, b1, b2, eta_max


def finite_budget_bound(N: ArrayLike, R: ArrayLike, B: ArrayLike, *, budget: float, mu: float, profile: Profile,
                        rho: float, smoothness: float, bias: float, f0: float, convention: str = "rollout-cost",
                        average: str = "integral") -> FiniteBudgetBound:
    """min over eta of the Thm 3.4 bound for designs (N, R, B) at compute ``budget`` (vectorised, broadcast).

    ``budget`` is in the convention's cost unit: per-sample update costs for "rollout-cost" (c = mu R + B),
    rollout costs for "paper-sec3" (c = R + mu B). ``smoothness`` = L (Assumption 3.1), ``bias`` = kappa
    (Assumption 3.2), ``f0`` = F(theta_0) - inf F (Thm 3.4's F(theta_0) with F shifted to inf F = 0).
    Designs need N >= R >= 1, B >= 1 (real values accepted: the bound does not need integers).
    """
    _check_budget_inputs(budget, mu, rho, smoothness, bias, f0, convention)
    N, R, B = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (N, R, B)))
    for name, arr in (("N", N), ("R", R), ("B", B)):
        require_positive(name, arr)
    if np.any(N < R):
        raise ValueError("N must be >= R (the buffer holds at least one step of rollouts)")
    cost, s, S, b1, b2, eta_max = _bound_coefficients(N, R, B, mu, profile, rho, smoothness, bias, convention, average)
    updates = budget / cost
    A = 12.0 * f0 / updates  # Thm 3.4: 12 F(theta_0) / (eta T)
    eta_free = eta_star(A, b1, b2)
    eta = np.minimum(eta_free, eta_max)
    optimization = A / eta
    noise_smoothness = b1 * eta
    noise_bias = b2 * eta**2
    value = optimization + noise_smoothness + noise_bias
    feasible = updates >= 1.0  # a budget below one update's cost buys no update at all
    value = np.where(feasible, value, np.inf)
    eta = np.where(feasible, eta, np.nan)
    terms = {
        "optimization": _as_float(np.where(feasible, optimization, np.inf)),
        "noise_smoothness": _as_float(noise_smoothness),
        "noise_bias": _as_float(noise_bias),
        "eta_max": _as_float(eta_max),
        "eta_unconstrained": _as_float(eta_free),
        "step_limited": (eta_free >= eta_max) if np.ndim(eta_free) else bool(eta_free >= eta_max),
        "cost_per_update": _as_float(cost),
        "sigma_bar_sq": _as_float(s),
        "noise_factor": _as_float(S),
    }
    return FiniteBudgetBound(_as_float(value), _as_float(eta), _as_float(updates), terms)


def compute_to_target(N: ArrayLike, R: ArrayLike, B: ArrayLike, *, target: float, mu: float, profile: Profile,
                      rho: float, smoothness: float, bias: float, f0: float, convention: str = "rollout-cost",
                      average: str = "integral") -> np.ndarray | float:
    """The least budget C at which the eta-optimised Thm 3.4 bound reaches ``target`` (the dual of the above).

    T >= 12 F0 / p(eta) with p(eta) = eta (target - b1 eta - b2 eta^2), maximised at
    eta = target / (b1 + sqrt(b1^2 + 3 b2 target)) (concave p), capped at eta_max; C = c T. Every
    target > 0 is reachable (p > 0 for small eta), at a cost that grows like 1/target^2 (derivation
    `compute-to-target`). Use it to rank designs by predicted compute-to-target.
    """
    require_positive("target", target)
    _check_budget_inputs(1.0, mu, rho, smoothness, bias, f0, convention)
    N, R, B = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (N, R, B)))
    cost, _, _, b1, b2, eta_max = _bound_coefficients(N, R, B, mu, profile, rho, smoothness, bias, convention, average)
    eta = np.minimum(target / (b1 + np.sqrt(b1**2 + 3.0 * b2 * target)), eta_max)
    p = eta * (target - b1 * eta - b2 * eta**2)
    return _as_float(cost * 12.0 * f0 / p)


def paper_objective(
    x: ArrayLike,
    y: ArrayLike,
    *,
    mu: float,
    profile: Profile,
    rho: float,
    convention: str = "rollout-cost",
    average: str = "integral",
) -> np.ndarray | float:
    """J = c sigmabar^2(N/R) (1/B + 1/N + rho/R) per R: the large-budget limit of the bound (Thm 3.5, App. C.3.1).

    rollout-cost: J = sigmabar^2(x) (mu + y)(1/y + 1/x + rho); paper-sec3: sigmabar^2(x)(1 + mu y)(1/y + 1/x + rho).
    The two are mu J_sec3(1/mu) apart (docs/ERRATA.md E3): the same argmin for reciprocal mu.
    """
    require_positive("mu", mu)
    require_in_range("rho", rho, 0.0, 1.0)
    require_one_of("convention", convention, CONVENTIONS)
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    cost = (mu + y) if convention == "rollout-cost" else (1.0 + mu * y)  # c / R
    value = np.asarray(sigma_bar_sq(profile, x, average), dtype=float) * cost * (1.0 / y + 1.0 / x + rho)
    return _as_float(value)


# --------------------------------------------------------------------------- finite-budget design


def _integers(lo: int, hi: int, cap: int) -> np.ndarray:
    """All integers in [lo, hi], or ``cap`` log-spaced ones (ends included) when there are more."""
    if hi - lo + 1 <= cap:
        return np.arange(lo, hi + 1)
    return np.unique(np.round(np.geomspace(lo, hi, cap)).astype(np.int64))


def _search_integer_design(score, fixed: int, free_lo: int, free_hi: int, x_max: float, *, batch_fixed: bool,
                           discrete: bool, free_points: int = 300, x_points: int = 240) -> tuple[int, int, int]:
    """argmin of score(N, R, B) over integers N >= R, with B (``batch_fixed``) or R fixed at ``fixed``.

    A coarse product grid (the free one of R or B, times log-spaced horizons x = N/R) finds the basin;
    every integer design between the best cell's neighbours is then scored (twice, recentred). With
    ``discrete`` N is a multiple of R (the exact buffer average needs an integer horizon).
    """
    free = _integers(free_lo, free_hi, free_points)  # (m,)
    if discrete:
        xs = _integers(1, max(1, int(math.floor(x_max))), x_points).astype(float)
    else:
        xs = np.geomspace(1.0, x_max, x_points) if x_max > 1 else np.array([1.0])  # (g,)

    def designs(free_values: np.ndarray, n_lists: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        counts = [len(n) for n in n_lists]
        other = np.repeat(free_values, counts).astype(float)
        N = np.concatenate(n_lists).astype(float)
        if batch_fixed:
            return N, other, np.full_like(N, float(fixed))
        return N, np.full_like(N, float(fixed)), other

    def r_of(value: float) -> float:
        return value if batch_fixed else float(fixed)

    # coarse grid
    n_lists = [np.unique(np.maximum(np.round(xs * r_of(v)), r_of(v))) for v in free]
    if discrete:
        n_lists = [np.unique(xs * r_of(v)) for v in free]
    N, R, B = designs(free, n_lists)
    values = np.asarray(score(N, R, B), dtype=float)
    best = int(np.nanargmin(values))
    best_design = (N[best], R[best], B[best])
    for _ in range(2):  # refine around the best cell, then once more around the refined one
        centre_free = best_design[1] if batch_fixed else best_design[2]
        idx = int(np.searchsorted(free, centre_free))
        lo_f = int(free[max(idx - 1, 0)])
        hi_f = int(free[min(idx + 1, free.size - 1)])
        lo_f, hi_f = min(lo_f, int(centre_free)), max(hi_f, int(centre_free))
        local_free = _integers(max(lo_f, free_lo), min(hi_f, free_hi), 64)
        x0 = best_design[0] / best_design[1]
        j = int(np.searchsorted(xs, x0))
        x_lo, x_hi = xs[max(j - 1, 0)], xs[min(j + 1, xs.size - 1)]
        x_lo, x_hi = min(x_lo, x0), max(x_hi, x0)
        n_lists = []
        for v in local_free:
            r = r_of(float(v))
            if discrete:
                ks = np.arange(max(1, math.floor(x_lo)), max(1, math.floor(min(x_hi, x_max))) + 1)
                n_lists.append(ks * r)
            else:
                lo_n = max(int(math.floor(x_lo * r)), int(r))
                hi_n = max(int(math.ceil(min(x_hi, x_max) * r)), lo_n)
                n_lists.append(_integers(lo_n, min(hi_n, int(math.floor(x_max * r))) if hi_n > lo_n else lo_n,
                                         256).astype(float))
        N2, R2, B2 = designs(local_free, n_lists)
        v2 = np.asarray(score(N2, R2, B2), dtype=float)
        k = int(np.nanargmin(v2))
        if v2[k] <= values[best]:
            best_design = (N2[k], R2[k], B2[k])
            values = np.append(values, v2[k])
            best = values.size - 1
    return int(round(best_design[0])), int(round(best_design[1])), int(round(best_design[2]))


def _fixed_scale(batch_size: int | None, rollouts_per_step: int | None) -> tuple[int, bool]:
    """(the fixed one of B and R, whether it is B): a finite budget needs exactly one of them."""
    if (batch_size is None) == (rollouts_per_step is None):
        raise ValueError("a finite budget needs exactly one of batch-size and rollouts-per-step: the bound "
                         "prefers the smallest batch at any budget, so the scale must be fixed")
    batch_fixed = batch_size is not None
    fixed = batch_size if batch_fixed else rollouts_per_step
    return int(require_int("batch-size" if batch_fixed else "rollouts-per-step", fixed, 1)), batch_fixed


def _horizon_limit(profile: Profile, x_max: float | None) -> float:
    """The largest horizon x = N/R searched: ``x_max``, else the profile's last measured staleness, else 1e4."""
    upper = profile.max_staleness if x_max is None else x_max
    if not math.isfinite(upper):
        upper = 1e4
    require_in_range("x_max", upper, 1.0, math.inf)
    return upper


def _free_range(fixed: int, batch_fixed: bool, min_replay_ratio: float, max_replay_ratio: float) -> tuple[int, int]:
    """The range of the free one of R and B that keeps y = B/R in [min_replay_ratio, max_replay_ratio]."""
    if batch_fixed:  # y = B/R: R in [B / max_y, B / min_y]
        return max(1, math.ceil(fixed / max_replay_ratio)), max(1, math.floor(fixed / min_replay_ratio))
    return max(1, math.ceil(fixed * min_replay_ratio)), max(1, math.floor(fixed * max_replay_ratio))  # B in R y


def _require_affordable(budget: float, fixed: int, free_lo: int, batch_fixed: bool, mu: float,
                        convention: str) -> None:
    """The budget pays for at least one update of the cheapest design searched."""
    cheapest = (_cost_per_update(None, np.asarray(1.0), np.asarray(float(fixed)), mu, convention) if batch_fixed
                else _cost_per_update(None, np.asarray(float(fixed)), np.asarray(float(free_lo)), mu, convention))
    if budget < float(cheapest):
        raise ValueError(f"budget must be >= {float(cheapest):g}, the cost of one update of the cheapest design "
                         f"in the search, got {budget:g}")


def _search_edge_notes(y: float, upper: float, at_upper: bool, y_lo: float, y_hi: float) -> list[str]:
    """Notes for a design at the edge of the horizons or replay ratios searched (the optimum may lie beyond)."""
    notes = []
    if at_upper:
        notes.append(f"the bound still falls at the largest horizon searched (x = {upper:g}); "
                     "measure sigma^2(s) further out")
    if y <= y_lo * (1 + 1e-12) or y >= y_hi * (1 - 1e-12):
        notes.append(f"y = {y:.4g} is at the edge of the replay ratios searched [{y_lo:.4g}, {y_hi:.4g}]")
    return notes


def _budget_regime_note(result: FiniteBudgetBound, terms: dict) -> str:
    """Step-limited (eta* at its cap eta_max, 12 F0/(eta T) dominates) or noise-limited, in words."""
    if terms["step_limited"]:
        share = terms["optimization"] / float(result.value)
        return (f"step-limited: the step size sits at its cap eta_max = {terms['eta_max']:.3g} "
                f"(unconstrained eta* = {terms['eta_unconstrained']:.3g}); 12 F0/(eta T) is {share:.0%} of "
                "the bound, which falls like 1/T, so cheaper updates (more per unit compute) win")
    return (f"noise-limited: eta* = {float(result.eta):.3g} is below its cap "
            f"{terms['eta_max']:.3g}; as the budget grows the design tends to the paper's J optimum")


def finite_budget_design(
    *,
    budget: float,
    mu: float,
    profile: Profile,
    rho: float,
    smoothness: float,
    bias: float,
    f0: float,
    batch_size: int | None = None,
    rollouts_per_step: int | None = None,
    convention: str = "rollout-cost",
    average: str = "integral",
    profile_description: str | None = None,
    alpha: float | None = None,
    x_max: float | None = None,
    min_replay_ratio: float = 1.0 / 16.0,
    max_replay_ratio: float = 1024.0,
) -> PaperAnswer:
    """The integer design (N, R, B) minimising the eta-optimised Thm 3.4 bound at compute ``budget``.

    Exactly one of ``batch_size`` (B) and ``rollouts_per_step`` (R) is fixed: at a finite budget the
    bound is not scale-invariant and always prefers the smallest scale (fewer samples per update, more
    updates), so the scale is the user's choice, as in practice. The search covers N >= R (x = N/R in
    [1, x_max], x_max = the profile's last measured staleness, else 1e4) and y = B/R in
    [min_replay_ratio, max_replay_ratio]. The answer is labelled step-limited (eta* at its cap) or
    noise-limited, and compared with the paper's J optimum at the same fixed B or R.
    """
    _check_budget_inputs(budget, mu, rho, smoothness, bias, f0, convention)
    fixed, batch_fixed = _fixed_scale(batch_size, rollouts_per_step)
    require_positive("min_replay_ratio", min_replay_ratio)
    if not max_replay_ratio > min_replay_ratio:
        raise ValueError(f"max_replay_ratio must be > min_replay_ratio = {min_replay_ratio:g}")
    require_one_of("average", average, AVERAGES)
    upper = _horizon_limit(profile, x_max)
    free_lo, free_hi = _free_range(fixed, batch_fixed, min_replay_ratio, max_replay_ratio)
    bound_at = partial(finite_budget_bound, budget=budget, mu=mu, profile=profile, rho=rho, smoothness=smoothness,
                       bias=bias, f0=f0, convention=convention, average=average)
    discrete = average == "discrete"
    _require_affordable(budget, fixed, free_lo, batch_fixed, mu, convention)

    def bound_score(N, R, B):
        return bound_at(N, R, B).value

    def j_score(N, R, B):
        return paper_objective(N / R, B / R, mu=mu, profile=profile, rho=rho, convention=convention, average=average)

    N, R, B = _search_integer_design(bound_score, fixed, free_lo, free_hi, upper, batch_fixed=batch_fixed,
                                     discrete=discrete)
    result = bound_at(N, R, B)
    Nj, Rj, Bj = _search_integer_design(j_score, fixed, free_lo, free_hi, upper, batch_fixed=batch_fixed,
                                        discrete=discrete)
    at_j = bound_at(Nj, Rj, Bj)

    mu_sec3 = float(mu_sec3_of(mu, convention))
    mu_rollout = float(rollout_mu_of_convention(mu, convention))
    x, y = N / R, B / R
    at_upper = x >= upper * (1 - 1e-9) - 1.0 / R
    regime = classify_regime(x, y, unbounded=at_upper)
    y_lo, y_hi = (fixed / free_hi, fixed / free_lo) if batch_fixed else (free_lo / fixed, free_hi / fixed)
    notes = _search_edge_notes(y, upper, at_upper, y_lo, y_hi)
    terms = {k: (bool(v) if k == "step_limited" else float(v)) for k, v in result.terms.items()}
    budget_regime = "step-limited" if terms["step_limited"] else "noise-limited"
    notes.append(_budget_regime_note(result, terms))
    wpt = mu_rollout / y
    gamma = float(compute_ratio_from_split_ratio(wpt, mu_rollout))
    text, advice = describe_regime(regime, x=x, y=y, mu_rollout=mu_rollout, gamma=gamma)
    if convention == "paper-sec3":
        notes.append(f"paper-sec3 reads mu = {mu:g} as update cost / rollout cost, "
                     f"i.e. rollouts cost {mu_rollout:.3g}x an update; the budget is in rollout costs")
    large = {
        "fixed": "B" if batch_fixed else "R", "x": Nj / Rj, "y": Bj / Rj, "capacity": Nj, "rollouts_per_step": Rj,
        "batch_size": Bj,
        "regime": classify_regime(Nj / Rj, Bj / Rj),
        "bound_at_budget": float(at_j.value), "updates_at_budget": float(at_j.updates),
        "paper_J": float(j_score(np.asarray(float(Nj)), np.asarray(float(Rj)), np.asarray(float(Bj)))),
    }
    fixed_text = f"B = {fixed}" if batch_fixed else f"R = {fixed}"
    return PaperAnswer(
        mu=mu, convention=convention, mu_rollout_cost=mu_rollout, mu_sec3=mu_sec3, alpha=alpha, rho=rho,
        profile=profile_description or type(profile).__name__,
        method=(f"integer search over (N, {'R' if batch_fixed else 'B'}) at {fixed_text} of the Thm 3.4 bound, "
                f"eta optimised per design (closed-form cubic root, capped at eta_max)"),
        x_star=x, y_star=y, x_star_unconstrained=x, y_star_unconstrained=y, regime=regime,
        rollouts_per_step=R, capacity=N, batch_size=B, workers_per_trainer=wpt, compute_ratio=gamma,
        notes=notes, regime_text=text, advice=advice, constraint=None, objective="finite-budget", budget=budget,
        budget_regime=budget_regime, smoothness=smoothness, bias=bias, f0=f0, eta=float(result.eta),
        eta_max=terms["eta_max"], updates=float(result.updates), bound=float(result.value), bound_terms=terms,
        large_budget_limit=large,
    )

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

import numpy as np
from numpy.typing import ArrayLike

from replay_theory.theory.checks import (
    require_finite,
    require_in_range,
    require_nonnegative,
    require_positive,
)
from replay_theory.theory.compute import compute_ratio_from_split_ratio
from replay_theory.theory.profiles import Profile, sigma_bar_sq

CONVENTIONS = ("rollout-cost", "paper-sec3")
REGIMES = ("replay", "on-policy", "unbounded")

# Defaults of `replay-theory optimal`, justified in README ("Assumptions").
DEFAULT_ALPHA = 0.25
DEFAULT_RHO = 0.1


def mu_sec3_of(mu: ArrayLike, convention: str) -> np.ndarray | float:
    """The Sec. 3 cost ratio (update cost / rollout cost) for a mu given in ``convention``."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {', '.join(CONVENTIONS)}, got {convention!r}")
    mu_arr = np.asarray(mu, dtype=float)
    require_positive("mu", mu_arr)
    converted = 1.0 / mu_arr if convention == "rollout-cost" else mu_arr
    return converted if converted.ndim else float(converted)


def rollout_cost_mu_of(mu: ArrayLike, convention: str) -> np.ndarray | float:
    """The Sec. 2 / Table 1 ratio (rollout cost / update cost) for a mu given in ``convention``."""
    converted = 1.0 / np.asarray(mu_sec3_of(mu, convention), dtype=float)
    return converted if converted.ndim else float(converted)


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

    from scipy.optimize import minimize_scalar  # lazy: keeps `optimal` startup light

    log_grid = np.linspace(math.log(x_min), math.log(upper), grid_points)  # (G,)
    values = objective(np.exp(log_grid))
    best = int(np.argmin(values))
    lo = log_grid[max(best - 1, 0)]
    hi = log_grid[min(best + 1, grid_points - 1)]
    refined = minimize_scalar(lambda u: float(objective(np.exp(u))), bounds=(lo, hi), method="bounded",
                              options={"xatol": 1e-10})
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
    """What `replay-theory optimal` is asked. Field docs are the CLI help."""

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
        if self.convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {', '.join(CONVENTIONS)}, got {self.convention!r}")
        if self.alpha is not None:
            require_finite("alpha", self.alpha)
            require_nonnegative("alpha", self.alpha)
        if self.rho is not None:
            require_in_range("rho", self.rho, 0.0, 1.0)
        if self.rollouts_per_step is not None and self.rollouts_per_step < 1:
            raise ValueError(f"rollouts-per-step must be an integer >= 1, got {self.rollouts_per_step}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch-size must be an integer >= 1, got {self.batch_size}")
        if self.rollouts_per_step is not None and self.batch_size is not None:
            raise ValueError("give either rollouts-per-step or batch-size, not both")
        if self.average not in ("integral", "discrete"):
            raise ValueError(f"average must be 'integral' or 'discrete', got {self.average!r}")
        return self


@dataclass(frozen=True)
class Design:
    """The answer: optimal ratios, regime, and (if R or B was given) integer N, B and the GPU split."""

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
    buffer_size: int | None
    batch_size: int | None
    workers_per_trainer: float | None
    compute_ratio: float | None
    notes: list[str] = field(default_factory=list)

    def to_json_dict(self) -> dict:
        """Plain JSON types; infinities and NaN become null."""

        def clean(value):
            if isinstance(value, float) and not math.isfinite(value):
                return None
            if isinstance(value, list):
                return [clean(v) for v in value]
            return value

        return {key: clean(value) for key, value in asdict(self).items()}


def optimal_design(query: DesignQuery) -> Design:
    """Thm 3.5 turned into advice: (x*, y*), the regime, integer N and B, W/T and gamma."""
    query = query.validated()
    mu_sec3 = float(mu_sec3_of(query.mu, query.convention))
    mu_rollout = query.mu if query.convention == "rollout-cost" else 1.0 / query.mu
    notes: list[str] = []

    if query.profile is None:
        alpha = DEFAULT_ALPHA if query.alpha is None else query.alpha
        rho = DEFAULT_RHO if query.rho is None else query.rho
        x_free, y_free = power_law_optimum(mu_sec3, alpha, rho)
        method = "closed form (power law, App. C.3.2)"
        profile_text = f"power law sigma(s) = (s/tau)^{alpha:g}"
        if alpha >= 0.5:
            regime = "on-policy"
            notes.append("alpha >= 1/2: the bound grows with the horizon, so no buffer beats on-policy")
        elif alpha == 0.0:
            regime = "unbounded"
            notes.append("alpha = 0: staleness costs nothing in this model, "
                         "so the buffer should be as large as possible")
        elif x_free < 1.0:
            regime = "on-policy"
            notes.append(f"x* = {x_free:.3g} < 1 would mean N < R; the feasible optimum is the on-policy corner")
        else:
            regime = "replay"
    else:
        alpha = None
        rho_source = query.rho if query.rho is not None else query.profile_rho
        rho = DEFAULT_RHO if rho_source is None else rho_source
        optimum = numeric_optimum(query.profile, mu_sec3, rho, average=query.average)
        x_free, y_free = optimum.x_star, optimum.y_star
        method = f"numerical minimisation of I(x) ({query.average} average of sigma^2)"
        profile_text = query.profile_description or type(query.profile).__name__
        if optimum.at_lower_edge:
            regime = "on-policy"
            notes.append("I(x) is smallest at the shortest horizon x = N/R = 1: stay on-policy")
        elif optimum.at_upper_edge:
            regime = "unbounded"
            notes.append(f"I(x) still falls at the largest horizon considered (x = {x_free:.4g}): "
                         "the buffer should be as large as the profile allows; measure further out")
        else:
            regime = "replay"

    if regime == "replay":
        x_star, y_star = x_free, y_free
    elif regime == "on-policy":
        x_star, y_star = 1.0, 1.0
        notes.append("on-policy: each rollout used once, N = B = R, W/T = rollout-cost mu, gamma = 1")
    else:
        x_star, y_star = math.inf, (y_free if query.profile is None else float(y_star_given_x(math.inf, mu_sec3, rho)))

    R = query.rollouts_per_step
    N = B = None
    if query.batch_size is not None and math.isfinite(y_star):
        R = max(1, round(query.batch_size / y_star))
    if R is not None:
        B = (query.batch_size if query.batch_size is not None
             else (max(1, round(y_star * R)) if math.isfinite(y_star) else None))
        N = max(R, round(x_star * R)) if math.isfinite(x_star) else None

    realised_y = (B / R) if (B is not None and R is not None) else y_star
    if math.isfinite(realised_y) and realised_y > 0:
        wpt = mu_rollout / realised_y  # W/T = mu / y, rollout-cost meaning
        gamma = float(compute_ratio_from_split_ratio(wpt, mu_rollout))  # Eq. (2)
    else:
        wpt = gamma = None
    if query.convention == "paper-sec3":
        notes.append(f"paper-sec3 reads mu = {query.mu:g} as update cost / rollout cost, "
                     f"i.e. rollouts cost {mu_rollout:.3g}x an update")

    return Design(
        mu=query.mu,
        convention=query.convention,
        mu_rollout_cost=mu_rollout,
        mu_sec3=mu_sec3,
        alpha=alpha,
        rho=rho,
        profile=profile_text,
        method=method,
        x_star=x_star,
        y_star=y_star,
        x_star_unconstrained=x_free,
        y_star_unconstrained=y_free,
        regime=regime,
        rollouts_per_step=R,
        buffer_size=N,
        batch_size=B,
        workers_per_trainer=wpt,
        compute_ratio=gamma,
        notes=notes,
    )

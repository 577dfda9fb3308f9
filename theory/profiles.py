"""Gradient-noise profiles sigma^2(s) versus staleness s, and their buffer average.

Paper: "Efficient RL training for LLMs with experience replay"
(experience-replay, docs/REFERENCES.md), Assumption 3.3 and App. C.3.

| code name              | paper symbol          | meaning                                               |
|------------------------|-----------------------|-------------------------------------------------------|
| ``staleness``, ``s``   | t - t_i               | steps since the sample was generated                  |
| ``sigma_sq(s)``        | sigma^2(s)            | per-sample gradient-noise bound at staleness s (A3.3) |
| ``horizon``, ``x``     | H = x = N/R           | staleness horizon: oldest age in a FIFO buffer        |
| ``sigma_bar_sq(x)``    | sigmabar^2(x)         | sigma^2 averaged over the ages 0..x of the buffer     |
| ``PowerLawProfile``    | sigma(s) = (s/tau)^a  | App. C.3.2, plus an optional fresh-sample floor       |
| ``rho``                | rho                   | correlation coefficient of Assumption 3.3             |
| ``fit_profiles``       | alpha, tau            | the power laws fitted to a measured sigma^2(s) table  |

Two averages (``sigma_bar_sq``): the paper's integral and the exact discrete mean. The records a calibration writes
into a profile file (``memory_record``, ``curvature_pairs_record``) are built here; the files themselves are read and
written by advise/profile_files.py.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from ..checks import (
    invalid,
    one_of,
    require_finite,
    require_int,
    require_nonnegative,
    require_positive,
)

AVERAGES = ("integral", "discrete")


@dataclass(frozen=True)
class PowerLawProfile:
    """sigma^2(s) = scale * (floor + (s / tau)^(2 alpha)).

    ``floor = 0`` is the paper's power law sigma(s) = (s/tau)^alpha (scale 1);
    ``floor = 1`` is the profile with a non-zero fresh-sample noise
    sigma0^2 (1 + (s/tau)^(2 alpha)) with sigma0^2 = scale.
    """

    alpha: float
    tau: float = 1.0
    scale: float = 1.0
    floor: float = 0.0

    def __post_init__(self) -> None:
        require_nonnegative("alpha", self.alpha)
        require_positive("tau", self.tau)
        require_positive("scale", self.scale)
        require_nonnegative("floor", self.floor)

    @property
    def max_staleness(self) -> float:
        return math.inf

    def sigma_sq(self, staleness: ArrayLike) -> np.ndarray:
        s = np.asarray(staleness, dtype=float)
        return self.scale * (self.floor + (s / self.tau) ** (2.0 * self.alpha))

    def integral_average(self, horizon: ArrayLike) -> np.ndarray:
        # (1/x) int_0^x (s/tau)^(2a) ds = (x/tau)^(2a) / (2a + 1), App. C.3.2
        x = np.asarray(horizon, dtype=float)
        power = 2.0 * self.alpha
        return self.scale * (self.floor + (x / self.tau) ** power / (power + 1.0))


@dataclass(frozen=True)
class TabulatedProfile:
    """Measured sigma^2 at a few staleness values, linearly interpolated.

    The profile is only known on [staleness[0], staleness[-1]]; below the first
    point it is held at its first value, and optimisation never looks past the
    last point (a horizon beyond what was measured would be extrapolation).
    """

    staleness: tuple[float, ...]
    sigma_sq_values: tuple[float, ...]

    def __post_init__(self) -> None:
        s = np.asarray(self.staleness, dtype=float)
        v = np.asarray(self.sigma_sq_values, dtype=float)
        if s.ndim != 1 or s.shape != v.shape or s.size < 2:
            raise ValueError(
                f"profile table needs matching 1-D staleness and sigma_sq columns with >= 2 rows, "
                f"got {s.size} and {v.size}"
            )
        require_finite("staleness", s)
        require_finite("sigma_sq", v)
        require_nonnegative("staleness", s)
        require_positive("sigma_sq", v)
        if np.any(np.diff(s) <= 0):
            raise ValueError("staleness must be strictly increasing in a profile table")

    @property
    def max_staleness(self) -> float:
        return float(self.staleness[-1])

    def sigma_sq(self, staleness: ArrayLike) -> np.ndarray:
        return np.interp(np.asarray(staleness, dtype=float), self.staleness, self.sigma_sq_values)

    def integral_average(self, horizon: ArrayLike) -> np.ndarray:
        """Exact integral of the piecewise-linear interpolant, divided by x."""
        x = np.asarray(horizon, dtype=float)
        knots = np.concatenate([[0.0], np.asarray(self.staleness, dtype=float)])
        knots = np.unique(knots)  # (K,)
        values = self.sigma_sq(knots)  # (K,)
        cumulative = np.concatenate([[0.0], np.cumsum(np.diff(knots) * (values[1:] + values[:-1]) / 2)])
        # integral up to x = cumulative at the knot below + trapezoid to x
        idx = np.clip(np.searchsorted(knots, x, side="right") - 1, 0, knots.size - 1)
        base = knots[idx]
        partial = (x - base) * (values[idx] + self.sigma_sq(x)) / 2
        return (cumulative[idx] + partial) / x


@dataclass(frozen=True)
class FunctionProfile:
    """Any callable sigma^2(s) (vectorised over numpy arrays is best, scalars work)."""

    function: Callable[[np.ndarray], np.ndarray]
    max_staleness: float = math.inf

    def sigma_sq(self, staleness: ArrayLike) -> np.ndarray:
        return np.asarray(np.vectorize(self.function, otypes=[float])(np.asarray(staleness, dtype=float)))

    def integral_average(self, horizon: ArrayLike) -> np.ndarray:
        from scipy.integrate import quad  # only this profile needs quadrature

        def one(x: float) -> float:
            return quad(lambda s: float(self.function(s)), 0.0, x, limit=200)[0] / x

        return np.vectorize(one, otypes=[float])(np.asarray(horizon, dtype=float))


Profile = PowerLawProfile | TabulatedProfile | FunctionProfile


def sigma_bar_sq(profile: Profile, horizon: ArrayLike, average: str = "integral") -> np.ndarray:
    """sigmabar^2(x): sigma^2 averaged over the ages held by a FIFO buffer of horizon x = N/R.

    ``"integral"``: (1/x) int_0^x sigma^2(s) ds (App. C.3.2 approximation).
    ``"discrete"``: (1/H) sum_{s=0}^{H-1} sigma^2(s) with H = x, x an integer >= 1.

    Two averages are offered. ``"integral"`` is the paper's approximation
    (1/x) int_0^x sigma^2(s) ds, smooth in x; ``"discrete"`` is the exact mean over
    the integer ages 0..H-1 of a buffer holding H = N/R steps of rollouts. They
    differ most for the pure power law, whose sigma(0) = 0 makes fresh samples
    noiseless (see docs/ERRATA.md).
    """
    x = np.asarray(horizon, dtype=float)
    if average == "integral":
        require_positive("horizon", x, allow_inf=False)
        return np.asarray(profile.integral_average(x), dtype=float)
    if average == "discrete":
        require_int("horizon", x, 1, note=" for the discrete average")
        h_max = int(x.max())
        cumulative = np.cumsum(profile.sigma_sq(np.arange(h_max)))  # (h_max,)
        return cumulative[x.astype(int) - 1] / x
    raise invalid("average", one_of(AVERAGES), average)


def fit_profiles(staleness: np.ndarray, sigma_sq: np.ndarray) -> dict:
    """Fit the pure power law (s >= 1) and the floor profile sigma0^2 (1 + (s/tau)^(2 alpha)) to a measured table.

    Both calibrations (the simulator's and the language model's) write these fits into their profile's ``fits``,
    as ``PowerLawProfile`` records (App. C.3.2).
    """
    from scipy.optimize import OptimizeWarning, curve_fit

    fits: dict = {}
    pos = staleness >= 1
    if pos.sum() >= 2:
        slope, intercept = np.polyfit(np.log(staleness[pos]), np.log(sigma_sq[pos]), 1)
        fits["power_law"] = {"kind": "power_law", "alpha": float(max(slope / 2, 0.0)), "tau": 1.0,
                             "scale": float(math.exp(intercept)), "floor": 0.0}
    sigma0 = float(sigma_sq[staleness == 0][0]) if np.any(staleness == 0) else float(sigma_sq.min())

    def floor_model(s, alpha, tau):
        return sigma0 * (1.0 + (s / tau) ** (2 * alpha))

    try:
        with warnings.catch_warnings():  # too few points for a covariance is fine: only the fit is kept
            warnings.simplefilter("ignore", OptimizeWarning)
            (alpha, tau), _ = curve_fit(floor_model, staleness, sigma_sq, p0=(0.5, 10.0),
                                        bounds=([0.0, 1e-3], [3.0, 1e6]), maxfev=20000)
        fits["floor_power_law"] = {"kind": "power_law", "alpha": float(alpha), "tau": float(tau),
                                   "scale": sigma0, "floor": 1.0}
    except (RuntimeError, ValueError):
        pass
    return fits


def drift_line(record: dict, how: str) -> str:
    """One line for a profile's "drift" record (``staleness`` from 0, ``m2``): M2(s) by age, ``how`` it was measured,
    and what ``optimal --profile`` prices with it (r(s) = 1 + M2(s), ``forgetting.staleness_of_drift``)."""
    ages = ", ".join(f"{s:g}" for s in record["staleness"][1:])
    values = ", ".join(f"{m:.3g}" for m in record["m2"][1:])
    return f"drift M2(s) at ages {ages}: {values} ({how}; optimal --profile prices a sample of age s at 1 + M2(s))"


def memory_record(estimate, reason: str | None = None) -> dict:
    """The profile's ``memory`` record of a ``theory.forgetting.KappaEstimate``: its ``to_dict()`` when kappa is a
    finite number > 0; otherwise kappa null, the measured value kept as ``kappa_measured`` and a ``reason`` (given,
    or: the curvature along the noise is not positive, so the optimizer's memory 1/kappa is not defined there)."""
    record = estimate.to_dict()
    value = estimate.kappa
    if reason is None and math.isfinite(value) and value > 0:
        return record
    if reason is None:
        lo, hi = estimate.interval
        reason = (f"kappa measured {value:.3g} ({estimate.level:.0%} interval [{lo:.3g}, {hi:.3g}]) by "
                  f"{estimate.method}: the curvature along the gradient noise is not positive, so the optimizer's "
                  "memory 1/kappa is not defined at the measured checkpoints")
    return {**record, "kappa": None, "kappa_measured": value if math.isfinite(value) else None, "reason": reason}


def curvature_pairs_record(numerators: ArrayLike, denominators: ArrayLike, step: ArrayLike, rng: np.random.Generator,
                           *, optimizer: str, beta1: float, pilot_batch: float | None = None, level: float = 0.9,
                           n_boot: int = 1000, detail: dict | None = None) -> dict:
    """The ``memory`` record of curvature pairs (``theory.forgetting.kappa_from_curvature_pairs``: kappa = eta sum
    num / sum den, bootstrap over pairs), ``detail`` merged in.

    A pair with xi = 0 (both minibatch gradients equal: e.g. every prompt group's rewards equal, so no advantage)
    adds 0 to both sums: it is left out and counted (``pairs_without_noise``), the estimate unchanged. ``step``: the
    learning rate, or one per pair (a schedule): then kappa = sum eta_i num_i / sum den_i. Fewer than 2 pairs with
    noise, or a kappa that is not > 0: kappa null and the reason."""
    from .forgetting import kappa_from_curvature_pairs  # the profile reader needs forgetting only here

    num, den = np.asarray(numerators, dtype=float).ravel(), np.asarray(denominators, dtype=float).ravel()
    eta = np.broadcast_to(np.asarray(step, dtype=float), num.shape)
    detail = dict(detail or {})
    method = detail.pop("method", "curvature-pairs")
    keep = den > 0
    extra: dict[str, int | list[float]] = {"pairs_without_noise": int((~keep).sum())}
    if eta.size and np.ptp(eta) > 0:
        extra["step_range"] = [float(eta.min()), float(eta.max())]
    if keep.sum() < 2:
        reason = (f"{int(keep.sum())} of {num.size} curvature pairs have a gradient difference xi != 0 (the minibatch "
                  "gradients were equal: no reward variation within their prompt groups); need >= 2")
        return {**unmeasured_memory(reason, method=method, optimizer=optimizer, beta1=beta1, pilot_batch=pilot_batch),
                **extra, **detail}
    scalar = np.ptp(eta[keep]) == 0
    estimate = kappa_from_curvature_pairs(num[keep] * (1.0 if scalar else eta[keep]), den[keep],
                                          float(eta[keep][0]) if scalar else 1.0, rng, optimizer=optimizer,
                                          beta1=beta1, pilot_batch=pilot_batch, n_boot=n_boot, level=level)
    if not scalar:  # the step lives in the numerators; say the mean learning rate
        estimate = dataclasses.replace(estimate, detail={**estimate.detail, "step": float(eta[keep].mean()),
                                                         "lambda_eff": None})
    estimate = dataclasses.replace(estimate, method=method, detail={**estimate.detail, **extra, **detail})
    return memory_record(estimate)


def unmeasured_memory(reason: str, *, method: str, optimizer: str, beta1: float,
                      pilot_batch: float | None = None) -> dict:
    """A ``memory`` record for a kappa that could not be formed at all: kappa null and the ``reason``."""
    return {"kappa": None, "kappa_interval": [None, None], "level": None, "method": method, "optimizer": optimizer,
            "beta1": float(beta1), "pilot_batch": pilot_batch, "units": 0, "reason": reason}

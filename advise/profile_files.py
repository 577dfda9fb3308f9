"""Profile files: the JSON or CSV files ``replay-theory optimal --profile FILE`` reads and the calibrations write.

``load_profile`` reads one (any problem is one line), ``profile_from_dict`` checks its schema and builds a
:class:`LoadedProfile` (the sigma^2(s) table or power law of theory/profiles.py, with the records the file carries:
rho, the measured noise scale B_noise, mu and the optimizer's memory kappa), ``save_profile`` writes one (never over
another) and ``next_optimal_line`` prints the ``optimal`` command that reads it. The formulas (the profiles,
sigma_bar_sq, the fits, the memory records) are theory/profiles.py's; this module only reads and writes files.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from ..checks import invalid, one_of, require_in_range, require_number, require_one_of
from ..theory.profiles import PowerLawProfile, Profile, TabulatedProfile

SIGMA_SQ_FORMS = ("plain", "signal-normalised")


@dataclass(frozen=True)
class LoadedProfile:
    """A profile read from a file, with the correlation it carries (if any)."""

    profile: Profile | None
    """The sigma^2(s) table or power law; None for a file of kind noise_scale (a measured B_noise only)."""
    rho: float | None
    description: str
    rho_fit: dict | None = None
    """The calibration's rho fit (value, ci, in_range, ...) when the file has one."""
    sigma_sq_form: str | None = None
    """plain or signal-normalised (measured tables); None when the file does not say."""
    noise_scale: dict | None = None
    """The measured noise-scale record (``b_noise``, ``b_noise_interval``, ``batch``, ``method``, ``source``) that
    the noise-scale rule reads (theory/noise_scale.py), or None."""
    mu: dict | None = None
    """The measured rollout cost ratio the file carries (``calibrate --from-log`` writes ``{"value", "ci",
    "source", "convention"}``), which ``optimal`` uses when ``--mu`` is not given; None when the file has none."""
    memory: dict | None = None
    """The measured optimizer memory (``KappaEstimate.to_dict()``: kappa, its interval, the optimizer, beta1, the
    method, the pilot batch), checked by ``_memory_record``; None when the file has none. Its kappa may be None
    (measured without a usable signal), then ``reason`` says why."""
    memory_estimators: dict | None = None
    """Other estimates of the same kappa (name -> record shaped like ``memory``), for comparison; None if absent."""
    zero_share: dict | None = None
    """The measured share z of groups whose rewards are all equal (``{"value", "source", ...}``, value in [0, 1):
    ``calibrate --from-log`` writes it), which ``optimal`` reads as --zero-share; None when the file has none."""
    drift: dict | None = None
    """The drift of the run's policy with age (``{"staleness": [0, 1, 2, 4, ...], "m2": [0, ...], "source", ...}``:
    M2(s) = mean (log pi_T / pi_{T-s})^2 of rollouts of step T - s re-scored at the last policy T; ``calibrate
    --from-log --drift`` writes it), which ``optimal`` prices the forgetting rule's staleness cost at, r(s) = 1 + M2(s)
    (``theory.forgetting.staleness_of_drift``), before a sigma^2(s) table; None when the file has none."""

    def memory_model(self):
        """The ``theory.forgetting.Memory`` of the file's ``memory`` record; a one-line ValueError when the file has
        none or its kappa could not be measured (the record's reason)."""
        from ..theory.forgetting import Memory  # the profile reader needs forgetting only here

        record = self.memory
        if record is None:
            raise ValueError("the profile has no memory record (kappa): measure it (calibrate-simulator, validate "
                             "calibrate-model, calibrate --from-log --grad-norms with curvature pairs) or give kappa")
        if record["kappa"] is None:
            raise ValueError(f"the profile's kappa was not measured: {record['reason']}")
        return Memory(float(record["kappa"]), record["optimizer"], float(record["beta1"]),
                      None if record.get("pilot_batch") is None else float(record["pilot_batch"]))

    def rho_problem(self) -> str | None:
        """Why the file's rho cannot be used (an out-of-range fit, no ``rho``), or None."""
        fit = self.rho_fit
        if self.rho is not None or not fit or fit.get("in_range", True):
            return None
        if fit.get("measurable") is False:
            return f"the profile has no rho: {fit.get('note') or 'it was not measured'}"
        value = fit.get("value")
        ci = fit.get("ci") or [None, None]
        low, high = ci[0], ci[1]

        def fmt(x):
            return "nan" if x is None else f"{x:.3g}"

        hint = ""
        if low is not None and high is not None and (low <= 0 <= high or low <= 1 <= high):
            edge = 0 if low <= 0 <= high else 1
            hint = f" (the interval reaches {edge}: --rho {edge} is consistent with it)"
        return (f"the profile's rho fit {fmt(value)} (90% interval [{fmt(low)}, {fmt(high)}]) is outside [0, 1], "
                f"the range Assumption 3.3 allows{hint}")


    def rho_for_design(self) -> tuple[float | None, str | None]:
        """(rho, note) for a design: the file's rho; 0 with a note when the fit lies below 0 but its interval
        covers 0 (no correlation is measurable); a one-line ValueError when the fit is out of range otherwise."""
        problem, fit = self.rho_problem(), self.rho_fit
        if problem is None or fit is None:  # a problem is always the fit's (rho_problem)
            return self.rho, None
        ci = fit.get("ci") or [None, None]
        low, high = ci[0], ci[1]
        if low is not None and high is not None and low <= 0.0 <= high and fit.get("value", 0) < 0:
            return 0.0, f"rho = 0 used: {problem}"
        raise ValueError(f"{problem}; give rho explicitly")


def _noise_scale_record(data: dict) -> dict | None:
    """The file's ``noise_scale`` record, checked: a JSON object whose ``b_noise`` is a finite number > 0, or null for
    a record measured without signal (the rule then has no input: ``optimal`` says so, never a default)."""
    record = data.get("noise_scale")
    if record is None:
        return None
    if not isinstance(record, dict):
        raise ValueError("profile 'noise_scale' must be a JSON object")
    value = record.get("b_noise")
    if value is None:  # measured without signal: kept (its interval still bounds B_noise); the rule says so when read
        return record
    require_number("profile 'noise_scale.b_noise'", value, above=0, finite=True)
    return record


MEMORY_OPTIMIZERS = ("sgd", "momentum", "adam")  # theory.forgetting.OPTIMIZERS


def _number(value: object) -> TypeGuard[float]:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def _memory_record(record, name: str = "memory") -> dict:
    """A ``memory`` record checked: a JSON object whose ``kappa`` is a finite number > 0, or null with a non-empty
    ``reason``; ``optimizer`` one of sgd, momentum, adam; ``beta1`` a number in [0, 1); ``kappa_interval`` (when
    present) two numbers or nulls; ``pilot_batch`` (when present) null or a finite number > 0."""
    if not isinstance(record, dict):
        raise ValueError(f"profile {name!r} must be a JSON object")
    kappa = record.get("kappa")
    if kappa is None:
        reason = record.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"profile '{name}.kappa' is null without a 'reason' (say why it was not measured)")
    elif not _number(kappa) or not (0 < kappa < math.inf):
        raise ValueError(f"profile '{name}.kappa' must be a finite number > 0 or null with a reason, got {kappa!r}")
    optimizer = record.get("optimizer")
    if optimizer not in MEMORY_OPTIMIZERS:  # a missing key (None) or a JSON number is refused too
        raise invalid(f"profile '{name}.optimizer'", one_of(MEMORY_OPTIMIZERS), optimizer)
    beta1 = record.get("beta1")
    if not _number(beta1) or not (0.0 <= beta1 < 1.0):
        raise ValueError(f"profile '{name}.beta1' must be a number in [0, 1), got {beta1!r}")
    interval = record.get("kappa_interval")
    if interval is not None and not (isinstance(interval, list) and len(interval) == 2
                                     and all(v is None or (_number(v) and math.isfinite(v)) for v in interval)):
        raise ValueError(f"profile '{name}.kappa_interval' must be [low, high] (numbers or nulls), got {interval!r}")
    pilot = record.get("pilot_batch")
    if pilot is not None and (not _number(pilot) or not (0 < pilot < math.inf)):
        raise ValueError(f"profile '{name}.pilot_batch' must be null or a finite number > 0, got {pilot!r}")
    return record


def _memory_records(data: dict) -> tuple[dict | None, dict | None]:
    """The file's ``memory`` record and its ``memory_estimators`` (name -> record), each checked, or None."""
    memory = None if data.get("memory") is None else _memory_record(data["memory"])
    others = data.get("memory_estimators")
    if others is not None:
        if not isinstance(others, dict):
            raise ValueError("profile 'memory_estimators' must be a JSON object (name -> memory record)")
        others = {str(k): _memory_record(v, f"memory_estimators.{k}") for k, v in others.items()}
    return memory, others


def _mu_record(data: dict) -> dict | None:
    """The file's measured mu as {"value", "convention", ...} (a bare number is a rollout-cost mu), or None."""
    record = data.get("mu")
    if record is None:
        return None
    if not isinstance(record, dict):
        record = {"value": record}
    value, convention = record.get("value"), record.get("convention", "rollout-cost")
    number = require_number("profile 'mu'", value, above=0, finite=True)
    if convention not in ("rollout-cost", "paper-sec3"):
        raise ValueError(f"profile 'mu.convention' must be rollout-cost or paper-sec3, got {convention!r}")
    return {**record, "value": number, "convention": convention}


def _zero_share_record(data: dict) -> dict | None:
    """The file's measured zero share as {"value", ...} (value in [0, 1)), or None."""
    record = data.get("zero_share")
    if record is None:
        return None
    if not isinstance(record, dict):
        raise ValueError(f"profile 'zero_share' must be a JSON object with a value, got {record!r}")
    value = record.get("value")
    if not (_number(value) and 0 <= value < 1):
        raise ValueError(f"profile 'zero_share.value' must be a number in [0, 1), got {value!r}")
    return {**record, "value": float(value)}


def _drift_record(data: dict) -> dict | None:
    """The file's drift table as {"staleness", "m2", ...}, checked: ages from 0 increasing, M2 finite and >= 0, M2(0) =
    0 (a policy against itself); or None."""
    record = data.get("drift")
    if record is None:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("staleness"), list) or not isinstance(
            record.get("m2"), list):
        raise ValueError("profile 'drift' must be a JSON object with 'staleness' and 'm2' lists")
    ages, m2 = record["staleness"], record["m2"]
    if not all(_number(v) for v in ages + m2):
        raise ValueError("profile 'drift.staleness' and 'drift.m2' must hold numbers")
    if m2 and m2[0] != 0:
        raise ValueError(f"profile 'drift.m2' must be 0 at age 0 (a policy against itself), got {m2[0]!r}")
    from ..theory.forgetting import staleness_of_drift  # checks lengths, age 0 first, M2 >= 0

    staleness_of_drift(ages, m2, "check")
    if any(b <= a for a, b in zip(ages, ages[1:])):
        raise ValueError("profile 'drift.staleness' must increase")
    return {**record, "staleness": [float(v) for v in ages], "m2": [float(v) for v in m2]}


def profile_from_dict(data: dict) -> LoadedProfile:
    """Build a profile from the JSON schema below.

    Profile files (written by the simulator and validator, read by
    ``replay-theory optimal --profile FILE``) are JSON::

        {"kind": "power_law", "alpha": 0.3, "tau": 1.0, "scale": 1.0, "floor": 0.0, "rho": 0.1}
        {"kind": "table", "staleness": [0, 1, 2, 4], "sigma_sq": [1.0, 1.2, 1.5, 2.1], "rho": 0.05}
        {"kind": "noise_scale", "noise_scale": {"b_noise": 3000, "batch": 256, ...}}

    or CSV with a header row ``staleness,sigma_sq``. ``rho`` is optional.

    Any of them may carry a ``noise_scale`` record (the measured B_noise the noise-scale rule reads; its fields are
    written by every calibration: ``b_noise``, ``b_noise_interval``, ``level``, ``method``, ``batch``, ``unit_size``,
    ``source``), and beside it a ``memory`` record: the optimizer's memory kappa = eta tr(H Sigma) / tr Sigma that the
    forgetting-aware rule reads (``theory.forgetting.KappaEstimate.to_dict()``: ``kappa`` (finite > 0, or null with a
    ``reason``), ``kappa_interval``, ``level``, ``method``, ``optimizer`` (sgd, momentum or adam), ``beta1`` in [0, 1),
    ``pilot_batch``, ``units``, ...); other estimates of the same kappa may sit under ``memory_estimators`` (name ->
    record of the same shape, checked the same way), e.g. the exact value and the lag-1 autocorrelation's. A
    ``zero_share`` record (``value`` in [0, 1), ``source``) is the share of groups whose rewards are all equal, which
    ``optimal`` reads as --zero-share (selective replay priced). A ``drift`` record (``staleness`` from 0, ``m2`` with
    M2(0) = 0: the run's re-scored drift, ``calibrate --from-log --drift``) is the staleness cost r(s) = 1 + M2(s) the
    forgetting rule reads, before the sigma^2(s) table.

    Measured profiles (``calibrate-simulator``, ``validate calibrate-model``) add, among others:

    * ``sigma_sq_form``: which sigma^2 the table holds, ``plain`` (E||eps||^2, for an unbiased
      importance-weighted loss) or ``signal-normalised`` (sigma^2 / r(s)^2, for a clipped loss: the noise
      of a stale sample rescaled to carry the full signal); the calibration picks the form that matches
      its probe's ``loss`` (``simulate/calibrate.py::loss_form``), so ``optimal --profile`` uses it as is;
      both forms and r(s) are kept under ``forms``;
    * ``rho_fit``: ``{"value", "ci", "in_range", ...}``, the fitted rho with its bootstrap interval, never
      clamped. ``rho`` itself is written only when the fit lies in [0, 1]; a file with an out-of-range
      fit carries ``rho_fit`` alone and ``optimal`` then needs ``--rho``.
    """
    if not isinstance(data, dict):
        raise ValueError("profile must be a JSON object")
    memory, others = _memory_records(data)
    return dataclasses.replace(_profile_from_dict(data), mu=_mu_record(data), memory=memory,
                               memory_estimators=others, zero_share=_zero_share_record(data),
                               drift=_drift_record(data))


def _profile_from_dict(data: dict) -> LoadedProfile:
    noise_scale = _noise_scale_record(data)
    if data.get("kind") == "noise_scale":
        if noise_scale is None:
            raise ValueError("profile of kind noise_scale needs a 'noise_scale' object with b_noise")
        return LoadedProfile(None, None, "measured noise scale only (no sigma^2 table)", noise_scale=noise_scale)
    kind = data.get("kind", "table" if "staleness" in data else None)
    rho = data.get("rho")
    if rho is not None:
        rho = float(rho)
        require_in_range("rho", rho, 0.0, 1.0)
    rho_fit = data.get("rho_fit")
    if rho_fit is not None and not isinstance(rho_fit, dict):
        raise ValueError("profile 'rho_fit' must be a JSON object")
    form = data.get("sigma_sq_form")
    if form is not None:
        require_one_of("profile 'sigma_sq_form'", form, SIGMA_SQ_FORMS)
    if kind == "power_law":
        unknown = set(data) - {"kind", "alpha", "tau", "scale", "floor", "rho", "source", "fit", "notes", "noise_scale",
                               "mu", "memory", "memory_estimators", "zero_share", "drift"}
        if unknown:
            raise ValueError(f"profile has unknown power_law keys: {', '.join(sorted(unknown))}")
        if "alpha" not in data:
            raise ValueError("profile of kind power_law needs 'alpha'")
        profile = PowerLawProfile(
            alpha=float(data["alpha"]),
            tau=float(data.get("tau", 1.0)),
            scale=float(data.get("scale", 1.0)),
            floor=float(data.get("floor", 0.0)),
        )
        desc = (
            f"power law sigma^2(s) = {profile.scale:g} ({profile.floor:g} + (s/{profile.tau:g})^{2 * profile.alpha:g})"
        )
        return LoadedProfile(profile, rho, desc, noise_scale=noise_scale)
    if kind == "table":
        if "staleness" not in data or "sigma_sq" not in data:
            raise ValueError("profile of kind table needs 'staleness' and 'sigma_sq' lists")
        profile = TabulatedProfile(tuple(map(float, data["staleness"])), tuple(map(float, data["sigma_sq"])))
        what = "measured table" if form is None else (
            f"measured table of {form} sigma^2" + (f" (loss {data['loss']})" if data.get("loss") else ""))
        desc = (f"{what}, {len(profile.staleness)} points, "
                f"staleness {profile.staleness[0]:g}..{profile.staleness[-1]:g}")
        return LoadedProfile(profile, rho, desc, rho_fit, form, noise_scale)
    raise ValueError(f"profile kind must be 'power_law', 'table' or 'noise_scale', got {kind!r}")


def load_profile(path: str | Path) -> LoadedProfile:
    """Read a JSON or CSV profile file; any problem is a one-line ``ValueError``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (some editors add one) is accepted
    except OSError as err:
        raise ValueError(f"profile file {str(path)!r} cannot be read: {err.strerror or err}") from None
    if path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
        if not rows or not {"staleness", "sigma_sq"} <= set(rows[0]):
            raise ValueError(f"profile file {str(path)!r} must be CSV with columns staleness,sigma_sq")
        try:
            data = {
                "kind": "table",
                "staleness": [float(r["staleness"]) for r in rows],
                "sigma_sq": [float(r["sigma_sq"]) for r in rows],
            }
        except (TypeError, ValueError):
            raise ValueError(f"profile file {str(path)!r} has a non-numeric value") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"profile file {str(path)!r} is not valid JSON: {err.msg} (line {err.lineno})") from None
    try:
        return profile_from_dict(data)
    except (TypeError, KeyError) as err:
        raise ValueError(f"profile file {str(path)!r} is malformed: {err}") from None


def save_profile(path: str | Path, data: dict) -> None:
    """Write a profile dict as JSON after checking it loads; refuses to overwrite."""
    path = Path(path)
    profile_from_dict(data)
    with path.open("x") as handle:  # "x": never overwrite a saved result
        json.dump(data, handle, indent=2)


def next_optimal_line(out: str | Path, mu: float | None, data: dict) -> str:
    """The ``next:`` line a calibrating command prints after writing profile ``data`` to ``out``: the ``optimal``
    command that reads it, runnable as printed, with the probe's batch and prompt groups (the halves kept groups
    whole: without --group-size optimal would answer in single responses) and ``mu`` as --mu where the profile
    carries no measured mu (None: it does)."""
    record = data.get("noise_scale") or {}
    given = "" if mu is None else f" --mu {mu:g}"
    if record.get("b_noise") is None or record.get("batch") is None:
        why = (data.get("noise_scale_unresolved") or {}).get("reason") or "see above"
        return f"next: no B_noise was measured ({why}), so optimal has no b to read: measure over more steps or samples"
    unit = int(record.get("unit_size") or 1)
    groups = f" --group-size {unit}" if unit > 1 and record["batch"] % unit == 0 else ""
    return f"next: replay-theory optimal --profile {out}{given} -B {record['batch']}{groups}"

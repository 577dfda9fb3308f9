"""``replay-theory optimal | gamma | derive``: the theory from the command line.

``optimal`` answers with the noise-scale rule by default (theory/noise_scale.py; McCandlish et al. 2018 with the
FIFO long-run variance): at a fixed batch B, replay ratio y* = B/R = sqrt(mu (1 + 1/b)) when 4 b (1 + b) < mu
(b = B_noise / B), else on-policy; without a measured noise scale it prints that decision as a function of b and
how to measure b. ``--objective paper`` gives the experience-replay paper's Thm 3.5 staleness horizon x* = N/R and
replay ratio y* = B/R (or, with ``--budget``, the Thm 3.4 bound at a finite budget). Every answer carries an
``evidence:`` line: what the prediction benchmark found for its objective (theory/evidence.py). ``gamma`` is Eq. 2's
compute ratio of a (W, T) GPU split; ``derive`` prints the sympy derivations.

``optimal`` must start fast (bench/bench_optimal_startup.py, at most 0.6x ``import typer, numpy, scipy.optimize``):
this module and the theory modules it imports need numpy only; scipy is imported where a search needs it
(theory/design.py::numeric_optimum for a sigma^2(s) table, theory/profiles.py's quadrature), sympy inside ``derive``
only (tests/integration/test_cli_lazy.py checks the module set ``optimal --mu 5.28`` loads).
"""

from __future__ import annotations

import math
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..theory import noise_scale as ns
from ..theory.checks import invalid, require_integer
from ..theory.design import (
    DEFAULT_ALPHA,
    DEFAULT_RHO,
    OBJECTIVE_LABELS,
    DesignQuery,
    finite_budget_design,
    optimal_design,
    rollout_mu_of_convention,
    split_design,
)
from ..theory.evidence import evidence_line, floor_ratio_of, verdict_line
from ..theory.profiles import PowerLawProfile, load_profile
from .common import PROG, UserError, emit_json, option_message

# Valid ranges appended when typer rejects a value before the theory's own checks run (cli/app.py::main).
VALID_RANGES = {
    "mu": "a finite number > 0",
    "alpha": "a finite number >= 0",
    "rho": "a number in [0, 1]",
    "convention": "rollout-cost or paper-sec3",
    "rollouts_per_step": "an integer >= 1",
    "batch_size": "an integer >= 1",
    "workers": "a number > 0",
    "trainers": "a number > 0",
    "average": "integral or discrete",
    "budget": "a finite number > 0 (compute, in per-sample update costs)",
    "smoothness": "a finite number > 0 (L of Assumption 3.1)",
    "bias": "a finite number >= 0 (kappa of Assumption 3.2)",
    "f0": "a finite number > 0 (F(theta_0) - inf F)",
    "noise_scale": "a number in [1e-06, 1e+12] (B_noise = tr Sigma / |E G|^2, in samples)",
    "objective": "forgetting, noise-scale or paper",
    "kappa": "a finite number > 0 (the optimizer's memory, 1/kappa steps)",
    "optimizer": "sgd, momentum or adam",
    "beta1": "a number in [0, 1)",
    "pilot_batch": "an integer >= 1",
    "group_size": "an integer >= 1 that divides -B",
    "latency_floor": "a finite number >= 0 (rollouts)",
    "max_steps_ratio": "a finite number >= 1",
    "max_horizon": "an integer in [1, 4096]",
}


class Objective(str, Enum):
    forgetting = "forgetting"
    noise_scale = "noise-scale"
    paper = "paper"


class Optimizer(str, Enum):
    sgd = "sgd"
    momentum = "momentum"
    adam = "adam"


class Convention(str, Enum):
    rollout_cost = "rollout-cost"
    paper_sec3 = "paper-sec3"


class Average(str, Enum):
    integral = "integral"
    discrete = "discrete"


def _fmt(value: Optional[float], digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return f"{value:.{digits}g}"


CONVENTION_TEXT = {
    "rollout-cost": "rollout-cost: mu = cost of one rollout / cost of one sample's update (Sec. 2, Table 1)",
    "paper-sec3": "paper-sec3: mu = cost of one sample's update / cost of one rollout (literal Sec. 3, c = R + mu B)",
}


REGIME_SHORT = {
    "replay": "reuse rollouts",
    "on-policy": "use each rollout once",
    "over-generation": "NOT replay: more generation than training absorbs (gamma > 1)",
    "stale-buffer": "buffer without reuse (gamma = 1)",
    "unbounded": "largest buffer you can afford",
}


def _todo_line(d) -> str:
    """The paper's (or the finite-budget) answer in one line: the design, then the advice."""
    if d.regime != "replay":  # the advice of the other regimes says what to do in full
        return f"what to do: {d.advice}."
    where = (f"N = {d.capacity}, B = {d.batch_size}, R = {d.rollouts_per_step}"
             if d.rollouts_per_step is not None and d.capacity is not None and d.batch_size is not None
             else "give -R or -B for whole N, B and R")
    return (f"what to do: replay at x = N/R = {_fmt(d.x_star, 3)}, y = B/R = {_fmt(d.y_star, 3)} ({where}); "
            f"{d.advice}.")


def _render_design(design) -> str:
    d = design
    finite = d.objective == "finite-budget"
    rows = [
        ("staleness horizon", "x = N/R" if finite else "x* = N/R", _fmt(d.x_star),
         "steps a rollout stays in the FIFO buffer"),
        ("replay ratio", "y = B/R" if finite else "y* = B/R", _fmt(d.y_star), "updates each rollout contributes to"),
        ("regime", "", d.regime, REGIME_SHORT[d.regime]),
        ("workers per trainer", "W/T = mu/y", _fmt(d.workers_per_trainer, 3),
         "inference GPUs per trainer GPU, none idle"),
        ("compute ratio", "gamma", _fmt(d.compute_ratio, 3), "compute per update vs on-policy (Eq. 2)"),
    ]
    if d.rollouts_per_step is not None:
        rows += [
            ("rollouts per step", "R", str(d.rollouts_per_step), "fresh rollouts generated each step"),
            ("buffer size", "N", "-" if d.capacity is None else str(d.capacity), "FIFO capacity"),
            ("batch size", "B", "-" if d.batch_size is None else str(d.batch_size),
             "samples per update, drawn uniformly"),
        ]
    if finite:
        rows += [
            ("updates", "T = C/c", _fmt(d.updates),
             f"updates the budget buys (c = {_fmt(d.bound_terms['cost_per_update'])})"),
            ("step size", "eta*", _fmt(d.eta), f"optimal for this design (cap eta_max = {_fmt(d.eta_max)})"),
            ("bound", "Thm 3.4", _fmt(d.bound), "guaranteed mean squared gradient norm"),
            ("budget regime", "", d.budget_regime, "step-size cap binds" if d.budget_regime == "step-limited"
             else "step size below its cap"),
        ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    head = f"{PROG} optimal: mu = {d.mu:g} ({CONVENTION_TEXT[d.convention]})"
    if finite:
        head += f", budget C = {d.budget:g}"
    lines = [_todo_line(d), head, f"objective: {OBJECTIVE_LABELS[d.objective]}", ""]  # the answer first
    for name, symbol, value, meaning in rows:
        lines.append(f"  {name:<{widths[0]}}  {symbol:<{widths[1]}}  {value:>{widths[2]}}  {meaning}")
    lines.append("")
    lines.append(f"what it is: {d.regime_text}.")
    if d.constraint:
        lines.append(f"constraint: {d.constraint}.")
    alpha_text = "" if d.alpha is None else f"alpha = {d.alpha:g}, "
    constants = (f"; L = {d.smoothness:g}, kappa = {d.bias:g}, F0 = {d.f0:g}" if finite else "")
    lines.append(f"assumptions: {d.profile}; {alpha_text}rho = {d.rho:g}{constants}; {d.method}.")
    if (not finite and d.x_star_unconstrained != d.x_star) and d.regime != "unbounded":
        lines.append(f"unconstrained optimum: x = {_fmt(d.x_star_unconstrained)}, y = {_fmt(d.y_star_unconstrained)}.")
    if finite and d.large_budget_limit is not None:
        j = d.large_budget_limit
        lines.append(f"large-budget limit (Thm 3.5's J at the same {j['fixed']}): "
                     f"N = {j['N']}, R = {j['R']}, B = {j['B']} (x = {_fmt(j['x'])}, y = {_fmt(j['y'])}, "
                     f"{j['regime']}); its bound at this budget = {_fmt(j['bound_at_budget'])} "
                     f"({_fmt(d.large_budget_bound_ratio, 3)}x this design's).")
    for note in d.notes:
        lines.append(f"note: {note}.")
    return "\n".join(lines)


def _check_budget_options(budget, smoothness, bias, f0, rollouts_per_step, batch_size) -> None:
    """The finite-budget options, checked before any work: one line naming the option and its range."""
    given = {"--smoothness": smoothness, "--bias": bias, "--f0": f0}
    if budget is None:
        extra = [name for name, value in given.items() if value is not None]
        if extra:
            raise UserError(f"{extra[0]} only applies with --budget (the finite-budget objective)")
        return
    checks = (("--budget", budget, VALID_RANGES["budget"], False), ("--smoothness", smoothness,
              VALID_RANGES["smoothness"], False), ("--bias", bias, VALID_RANGES["bias"], True),
              ("--f0", f0, VALID_RANGES["f0"], False))
    for name, value, valid, zero_ok in checks:
        if value is None:
            raise UserError(f"--budget needs {name}: {valid} (Thm 3.4's constants; see docs/THEORY.md)")
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
            raise invalid(name, valid, value, fmt="g")
    if rollouts_per_step is None and batch_size is None:
        raise UserError("--budget needs --batch-size or --rollouts-per-step: at a finite budget the bound prefers "
                        "the smallest batch, so the scale must be fixed")


TABLE_BS = (0.03, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
"""The values of b at which ``optimal`` without a noise scale shows the rule's decision (plus its threshold)."""

MEASURE_B = (
    "how to measure b = B_noise / B (B_noise = tr Sigma / |E G|^2 of your loss's gradient, per prompt group):",
    "  a run of TRL: replay-theory trl-replay ... logs |g|^2 of two micro-batches and their sum each step "
    "(RUN/noise_scale.jsonl);",
    "    replay-theory calibrate --from-log LOG --grad-norms RUN/noise_scale.jsonl --out profile.json",
    "  a language model: replay-theory validate calibrate-model --out DIR (per-group gradients)",
    "  the simulator: replay-theory calibrate-simulator --out profile.json",
    "then: replay-theory optimal --mu MU --noise-scale B_NOISE -B B   (or --profile profile.json -B B)",
)


def _paper_options_given(alpha, rho, average, budget, smoothness, bias, f0, rollouts_per_step) -> list[str]:
    given = {"--alpha": alpha, "--rho": rho, "--average": average, "--budget": budget, "--smoothness": smoothness,
             "--bias": bias, "--f0": f0, "--rollouts-per-step": rollouts_per_step}
    return [flag for flag, value in given.items() if value is not None]


def _forgetting_options_given(kappa, optimizer, beta1, pilot_batch, group_size, latency_floor, max_steps_ratio,
                              max_horizon) -> list[str]:
    given = {"--kappa": kappa, "--optimizer": optimizer, "--beta1": beta1, "--pilot-batch": pilot_batch,
             "--group-size": None if group_size == 1 else group_size,
             "--latency-floor": None if latency_floor == 0.0 else latency_floor,
             "--max-steps-ratio": None if max_steps_ratio == 2.0 else max_steps_ratio,
             "--max-horizon": None if max_horizon == 64 else max_horizon}
    return [flag for flag, value in given.items() if value is not None]


def _check_forgetting_options(batch_size, kappa, beta1, pilot_batch, group_size, latency_floor, max_steps_ratio,
                              max_horizon) -> None:
    """One line naming the option and its valid range, before any work."""
    checks = [
        ("--kappa", kappa, "kappa", kappa is None or (math.isfinite(kappa) and kappa > 0)),
        ("--beta1", beta1, "beta1", beta1 is None or 0 <= beta1 < 1),
        ("--pilot-batch", pilot_batch, "pilot_batch", pilot_batch is None or pilot_batch >= 1),
        ("--group-size", group_size, "group_size", group_size >= 1 and (batch_size is None
                                                                          or batch_size % group_size == 0)),
        ("--latency-floor", latency_floor, "latency_floor", math.isfinite(latency_floor) and latency_floor >= 0),
        ("--max-steps-ratio", max_steps_ratio, "max_steps_ratio", math.isfinite(max_steps_ratio)
         and max_steps_ratio >= 1),
        ("--max-horizon", max_horizon, "max_horizon", 1 <= max_horizon <= 4096),
    ]
    for flag, value, key, ok in checks:
        if not ok:
            raise invalid(flag, VALID_RANGES[key], value, fmt="g")
    if batch_size is not None:
        require_integer("--batch-size", batch_size, 1)


def _memory_inputs(kappa, optimizer, beta1, pilot_batch, loaded, profile) -> tuple:
    """(kappa, optimizer, beta1, pilot batch, source): the options, else the profile's memory record; given twice
    and different is an error, never a silent choice."""
    record = None if loaded is None else loaded.memory
    if record is not None and kappa is not None:
        raise UserError("give kappa once: --kappa or --profile's memory record, not both")
    if record is None:
        source = "--kappa" if kappa is not None else ""
        return (kappa, (optimizer or Optimizer.adam).value, 0.9 if beta1 is None else beta1, pilot_batch, source)
    if record.get("kappa") is None:
        raise UserError(f"--profile {profile}: its kappa was not measured ({record.get('reason', 'no reason given')}); "
                        f"measure again or pass --kappa")
    for flag, given, stored in (("--optimizer", None if optimizer is None else optimizer.value, record["optimizer"]),
                                ("--beta1", beta1, record["beta1"]), ("--pilot-batch", pilot_batch,
                                                                      record.get("pilot_batch"))):
        if given is not None and stored is not None and given != stored:
            raise UserError(f"{flag} {given} differs from the {stored} that --profile {profile}'s memory was "
                            f"measured with: leave {flag} out")
    interval = record.get("kappa_interval") or [None, None]
    span = "" if None in interval else f", 90% interval [{interval[0]:.3g}, {interval[1]:.3g}]"
    pilot = record.get("pilot_batch") if pilot_batch is None else pilot_batch
    return (float(record["kappa"]), record["optimizer"], float(record["beta1"]),
            None if pilot is None else int(pilot), f"--profile {profile} ({record.get('method', 'measured')}{span})")


def _staleness_of(loaded):
    """r(s) = sigma^2(s) / sigma^2(0) of a profile's measured table (the forgetting rule's staleness cost)."""
    from ..theory.forgetting import NO_STALENESS, staleness_of_table
    from ..theory.profiles import TabulatedProfile

    if loaded is None or not isinstance(loaded.profile, TabulatedProfile):
        return NO_STALENESS
    return staleness_of_table(loaded.profile.staleness, loaded.profile.sigma_sq_values,
                              loaded.sigma_sq_form or "form not stated")


def _forgetting_answer(mu, convention, batch_size, noise_scale, kappa, optimizer, beta1, pilot_batch, group_size,
                       latency_floor, max_steps_ratio, max_horizon, profile, as_json) -> None:
    from ..theory import advice

    _check_forgetting_options(batch_size, kappa, beta1, pilot_batch, group_size, latency_floor, max_steps_ratio,
                              max_horizon)
    b_noise, batch, source = _noise_scale_inputs(noise_scale, batch_size, profile)
    if b_noise is not None and batch is None:
        raise UserError("--noise-scale needs -B (the batch size: b = B_noise / B)")
    if b_noise is not None and batch % group_size:
        raise UserError(f"--group-size must be {VALID_RANGES['group_size']}, got {group_size} for -B {batch}")
    loaded = None if profile is None else load_profile(profile)
    k, opt, b1, pilot, k_source = _memory_inputs(kappa, optimizer, beta1, pilot_batch, loaded, profile)
    query = advice.Query(mu=rollout_mu_of_convention(mu, convention), batch=batch, b_noise=b_noise,
                         b_noise_source=source, kappa=k, kappa_source=k_source, optimizer=opt, beta1=b1,
                         pilot_batch=pilot, group_size=group_size, floor=latency_floor,
                         max_steps_ratio=max_steps_ratio, max_horizon=max_horizon, staleness=_staleness_of(loaded))
    try:
        record = advice.advise(query)
    except ValueError as err:
        raise UserError(str(err)) from None
    floor_ratio = floor_ratio_of(latency_floor, batch)  # the benchmark's cost model nearest the user's
    verdict = verdict_line(floor_ratio=floor_ratio)
    evidence = evidence_line("forgetting", floor_ratio=floor_ratio)
    if as_json:
        emit_json({**record, "verdict": verdict, "evidence": evidence, "convention": convention,
                   "paper_evidence": evidence_line("paper")})
        return
    text = advice.render(record, [evidence])
    typer.echo((verdict + ".\n" if verdict else "") + text)


NOISE_SCALE_RANGE = (1e-6, 1e12)
"""B_noise is a number of samples: below a millionth of one the rules' y* overflows into nonsense (y* = 1.8e151 at
1e-300), above 1e12 no batch is large enough to matter; both ends are beyond any measurement."""


def _check_noise_scale(value: Optional[float]) -> None:
    if value is not None and not (math.isfinite(value) and NOISE_SCALE_RANGE[0] <= value <= NOISE_SCALE_RANGE[1]):
        raise invalid("--noise-scale", VALID_RANGES["noise_scale"], value, fmt="g")


def _check_mu(mu: float) -> None:
    """mu far from 1 overflows the products of the rule and the paper's closed form: a range, said up front."""
    if not (math.isfinite(mu) and 1e-100 <= mu <= 1e100):
        raise invalid("--mu", "a finite number > 0, in [1e-100, 1e100]", mu, fmt="g")


def _resolve_mu(mu: Optional[float], convention: Optional[Convention], profile: Optional[Path]
                ) -> tuple[float, Convention, Optional[str]]:
    """--mu, else the measured mu the --profile file carries (so a calibrate --from-log profile feeds optimal with
    the user's own numbers); never a silent default: where it came from is the note optimal prints on stderr once
    the answer is out (an input error stays one line)."""
    if mu is not None:
        return mu, convention or Convention.rollout_cost, None
    if profile is None:
        raise UserError("--mu is required (or a --profile file that carries a measured mu, as calibrate --from-log "
                        "writes)")
    record = load_profile(profile).mu
    if record is None:
        raise UserError(f"--mu is required: --profile {profile} carries no measured mu")
    measured = Convention(record["convention"])
    if convention is not None and convention is not measured:
        raise UserError(f"--convention {convention.value} differs from the {measured.value} mu that --profile "
                        f"{profile} carries: give --mu in that convention")
    ci = record.get("ci") or [None, None]
    span = f", 90% CI {ci[0]:.4g}-{ci[1]:.4g}" if None not in ci else ""
    return record["value"], measured, f"mu = {record['value']:.4g} from --profile {profile} " \
                                      f"({record.get('source', 'measured')}{span})"


def optimal(
    mu: Annotated[Optional[float], typer.Option("--mu", help="Rollout cost ratio (default meaning: rollout cost / "
                                                             "per-sample update cost, Table 1; 5.28 for "
                                                             "Qwen2.5-7B). Required unless --profile carries a "
                                                             "measured mu (calibrate --from-log writes one).")
                  ] = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", "-B", help="Your batch B (responses per "
                                                      "update, on-policy today): the rules' b = B_noise / B; paper: "
                                                      "gives R and N.")] = None,
    noise_scale: Annotated[Optional[float], typer.Option("--noise-scale", help="Measured gradient noise scale "
                                                         "B_noise = tr Sigma / |E G|^2 in samples (with -B).")
                           ] = None,
    kappa: Annotated[Optional[float], typer.Option("--kappa", help="forgetting: the optimizer's measured memory "
                                                   "kappa = eta tr(H Sigma) / tr Sigma (1/kappa steps) at "
                                                   "--pilot-batch; or a profile's memory record.")] = None,
    optimizer: Annotated[Optional[Optimizer], typer.Option("--optimizer", help="forgetting: the optimizer kappa "
                                                           "belongs to (default adam, or the profile's).")] = None,
    beta1: Annotated[Optional[float], typer.Option("--beta1", help="forgetting: momentum / Adam's beta1 (default "
                                                   "0.9, or the profile's).")] = None,
    pilot_batch: Annotated[Optional[int], typer.Option("--pilot-batch", help="forgetting: the on-policy batch "
                                                       "kappa was measured at (default -B, or the profile's).")
                           ] = None,
    group_size: Annotated[int, typer.Option("--group-size", help="forgetting: responses per prompt group; B and R "
                                            "in whole groups.")] = 1,
    latency_floor: Annotated[float, typer.Option("--latency-floor", help="forgetting: generation latency floor in "
                                                 "rollouts (a step costs mu max(R, floor) + B).")] = 0.0,
    max_steps_ratio: Annotated[float, typer.Option("--max-steps-ratio", help="forgetting: steps allowed, relative "
                                                   "to on-policy at B (the wall-time budget).")] = 2.0,
    max_horizon: Annotated[int, typer.Option("--max-horizon", help="forgetting: the longest buffer horizon x = "
                                             "N/R considered.")] = 64,
    objective: Annotated[Objective, typer.Option("--objective", help="forgetting (default: the whole design, the "
                                                 "rule the benchmark tests), noise-scale (y at a fixed B, the "
                                                 "optimizer never forgetting) or paper (Thm 3.5 J, or Thm 3.4 at "
                                                 "--budget).")] = Objective.forgetting,
    alpha: Annotated[Optional[float], typer.Option("--alpha", help="paper: power-law exponent of the noise profile "
                                                   "sigma(s) = (s/tau)^alpha, >= 0 (default 0.25).")] = None,
    rho: Annotated[Optional[float], typer.Option("--rho", help="paper: sample correlation coefficient of "
                                                 "Assumption 3.3, in [0, 1] (default 0.1, or the profile's).")] = None,
    convention: Annotated[Optional[Convention], typer.Option("--convention", help="Meaning of mu: rollout-cost "
                                                             "(Table 1; the default) or paper-sec3 (literal Sec. "
                                                             "3: c = R + mu B).")] = None,
    rollouts_per_step: Annotated[Optional[int], typer.Option("--rollouts-per-step", "-R", help="paper: fresh "
                                                             "rollouts per step R: gives integer N and B.")] = None,
    profile: Annotated[Optional[Path], typer.Option("--profile", help="Profile file (JSON or CSV, see docs): its "
                                                    "noise_scale and memory records feed the rules, its mu the "
                                                    "cost, its sigma^2(s) table the staleness cost (forgetting) or "
                                                    "the paper objective's noise profile.")] = None,
    average: Annotated[Optional[Average], typer.Option("--average", help="paper: average of sigma^2 over the "
                                                       "buffer for --profile: integral (default) or discrete.")
                       ] = None,
    budget: Annotated[Optional[float], typer.Option("--budget", help="paper: compute budget C (per-sample update "
                                                    "costs): minimise the Thm 3.4 bound itself at C.")] = None,
    smoothness: Annotated[Optional[float], typer.Option("--smoothness", help="paper: L of Assumption 3.1 (> 0; "
                                                        "with --budget).")] = None,
    bias: Annotated[Optional[float], typer.Option("--bias", help="paper: kappa of Assumption 3.2 (>= 0; with "
                                                  "--budget).")] = None,
    f0: Annotated[Optional[float], typer.Option("--f0", help="paper: F(theta_0) - inf F (> 0; with "
                                                "--budget).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (infinite values as null).")] = False,
) -> None:
    """What to do with your rollouts: the cheapest on-policy batch against the best replay design (B, R, N).

    Default (forgetting): from mu, b = B_noise / B at your batch and the optimizer's memory kappa, the whole design
    (docs/THEORY.md, "Forgetting"). --objective noise-scale: the replay ratio at a fixed B with psi = 1.
    --objective paper: Thm 3.5's J (large-budget limit), or with --budget C --smoothness L --bias KAPPA --f0 F0 and
    -B or -R the integer design minimising the Thm 3.4 bound at compute C.
    """
    mu, convention, note = _resolve_mu(mu, convention, profile)
    _check_mu(mu)
    forgetting_given = _forgetting_options_given(kappa, optimizer, beta1, pilot_batch, group_size, latency_floor,
                                                 max_steps_ratio, max_horizon)
    if objective is not Objective.forgetting and forgetting_given:
        raise UserError(f"{forgetting_given[0]} applies to the forgetting-aware rule (the default --objective), not "
                        f"--objective {objective.value}")
    if objective is not Objective.paper:
        extra = _paper_options_given(alpha, rho, average, budget, smoothness, bias, f0, rollouts_per_step)
        if extra:
            why = (" (at a fixed R replay cannot beat on-policy at batch R; give -B)"
                   if extra[0] == "--rollouts-per-step" else "")
            raise UserError(f"{extra[0]} applies to --objective paper; the {objective.value} rule reads --mu, "
                            f"--noise-scale (or --profile) and -B{why}")
        _check_noise_scale(noise_scale)
        if objective is Objective.forgetting:
            _forgetting_answer(mu, convention.value, batch_size, noise_scale, kappa, optimizer, beta1, pilot_batch,
                               group_size, latency_floor, max_steps_ratio, max_horizon, profile, as_json)
        else:
            _noise_scale_answer(mu, noise_scale, batch_size, profile, convention.value, as_json)
        _stderr_note(note)
        return
    if noise_scale is not None:
        raise UserError("--noise-scale applies to the forgetting-aware and noise-scale rules, not --objective paper")
    _check_budget_options(budget, smoothness, bias, f0, rollouts_per_step, batch_size)
    loaded = None if profile is None else load_profile(profile)
    if loaded is not None and loaded.profile is None:
        raise UserError(f"--profile {profile} holds a noise scale only; --objective paper needs a sigma^2(s) table "
                        f"or power law")
    if loaded is not None and rho is None and loaded.rho_problem():  # never a silent default for a failed fit
        raise UserError(f"--profile {profile}: {loaded.rho_problem()}; pass --rho explicitly")
    query = DesignQuery(
        mu=mu,
        alpha=alpha,
        rho=rho,
        convention=convention.value,
        rollouts_per_step=rollouts_per_step,
        batch_size=batch_size,
        profile=None if loaded is None else loaded.profile,
        profile_description=None if loaded is None else loaded.description,
        profile_rho=None if loaded is None else loaded.rho,
        average=(average or Average.integral).value,
    )
    if loaded is not None and alpha is not None:
        raise UserError("alpha cannot be combined with --profile (the profile replaces the power law)")
    if budget is None:
        design = optimal_design(query)
    else:
        query.validated()  # the shared checks (mu, rho, -R/-B, ...) before the search
        try:
            design = _finite_budget(query, loaded, budget, smoothness, bias, f0)
        except ValueError as err:  # "budget must be >= ..." names the option as typed
            raise UserError(option_message(str(err), ("budget", "smoothness", "bias", "f0"))) from None
    evidence = evidence_line("paper" if budget is None else "finite-budget")
    if as_json:
        emit_json({**design.to_json_dict(), "evidence": evidence})
    else:
        typer.echo(_render_design(design))
        typer.echo(evidence + ".")
    _stderr_note(note)


def _stderr_note(note: Optional[str]) -> None:
    if note is not None:
        typer.echo(note, err=True)


def _noise_scale_inputs(noise_scale, batch_size, profile) -> tuple[Optional[float], Optional[int], str]:
    """(B_noise, B, where B_noise came from): --noise-scale, or the profile's noise_scale record."""
    if profile is None:
        return noise_scale, batch_size, "--noise-scale"
    if noise_scale is not None:
        raise UserError("give the noise scale once: --noise-scale or --profile, not both")
    loaded = load_profile(profile)
    record = loaded.noise_scale
    if record is None:
        raise UserError(f"--profile {profile} has no noise_scale record (b is missing): measure B_noise (replay-theory "
                        f"calibrate-simulator, validate calibrate-model, calibrate --from-log --grad-norms) or pass "
                        f"--noise-scale")
    interval = record.get("b_noise_interval") or [None, None]
    if record.get("b_noise") is None:
        low = "" if interval[0] is None else (f"; its interval's lower end is {interval[0]:.4g}: --mu MU --noise-scale "
                                              f"{interval[0]:.4g} -B B gives the most replay-friendly answer the data "
                                              f"allow")
        why = record.get("reason") or record.get("note")
        said = f": {why}" if why else ""
        raise UserError(f"--profile {profile} has no B_noise (its noise_scale record has b_noise: null{said}){low}; "
                        f"or measure again over more steps or a larger batch")
    span = "" if None in interval else f", 90% interval [{interval[0]:.4g}, {interval[1]:.4g}]"
    return float(record["b_noise"]), batch_size, f"--profile {profile} ({record.get('method', 'measured')}{span})"


def _noise_scale_answer(mu: float, noise_scale, batch_size, profile, convention: str, as_json: bool) -> None:
    b_noise, batch, source = _noise_scale_inputs(noise_scale, batch_size, profile)
    mu_rollout = rollout_mu_of_convention(mu, convention)
    evidence = evidence_line("noise-scale")
    paper = evidence_line("paper")
    if b_noise is not None and batch is None:
        raise UserError("--noise-scale needs -B (the batch size: the rule's b = B_noise / B)")
    if batch is not None and batch < 1:
        raise UserError(f"--batch-size must be {VALID_RANGES['batch_size']}, got {batch}")
    if b_noise is None:
        rows = [ns.rule_at(b, mu_rollout) for b in sorted({*TABLE_BS, ns.replay_threshold(mu_rollout)})]
        if as_json:
            emit_json({"objective": "noise-scale", "verdict": verdict_line(), "horizon": HORIZON_TEXT, "mu": mu,
                       "convention": convention, "mu_rollout_cost": mu_rollout,
                       "threshold_b": ns.replay_threshold(mu_rollout), "rows": rows, "evidence": evidence,
                       "measure_b": list(MEASURE_B), "paper_evidence": paper})
        else:
            paper_design = optimal_design(DesignQuery(mu=mu, convention=convention))
            typer.echo(_render_table(mu, mu_rollout, convention, rows, evidence, paper_design, paper))
        return
    design = ns.noise_scale_design(b_noise, batch, mu_rollout)
    paper_design = optimal_design(DesignQuery(mu=mu, convention=convention, batch_size=batch))
    if as_json:
        emit_json({"objective": "noise-scale", "verdict": verdict_line(), "horizon": HORIZON_TEXT, "mu": mu,
                   "convention": convention, "noise_scale_source": source,
                   **design.__dict__, "x": design.x, "workers_per_trainer": design.workers_per_trainer,
                   "compute_ratio": design.compute_ratio, "evidence": evidence,
                   "paper": {"x_star": paper_design.x_star, "y_star": paper_design.y_star,
                             "regime": paper_design.regime, "evidence": paper}})
    else:
        typer.echo(_render_rule(mu, convention, design, source, evidence, paper_design, paper))


HORIZON_TEXT = ("horizon: this rule keeps N = R (x = 1) and assumes the optimizer never forgets (psi = 1); the "
                "forgetting-aware rule, the default --objective, predicts the horizon and compares a smaller "
                "on-policy batch")


def _render_table(mu, mu_rollout, convention, rows, evidence, paper_design, paper) -> str:
    threshold = ns.replay_threshold(mu_rollout)
    verdict = verdict_line()
    lines = ([verdict + "."] if verdict else []) + [f"{PROG} optimal: mu = {mu:g} ({CONVENTION_TEXT[convention]})",
             "objective: the noise-scale rule (McCandlish et al. 2018, steps S = S_min (1 + B_noise V), V the long-run "
             "variance of a FIFO drawn with replacement, 1/B + 1/R; docs/THEORY.md)",
             f"{evidence}.", "",
             f"no noise scale given: replay pays only if b = B_noise / B < {threshold:.3g} (4 b (1 + b) < mu); "
             f"above it, use each rollout once.", "",
             "       b  regime     y* = B/R  W/T = mu/y  gamma  steps vs on-policy  compute saved"]
    for r in rows:
        mark = "  <- threshold" if math.isclose(r["b"], threshold) else ""
        lines.append(f"  {r['b']:>6.3g}  {r['regime']:<9}  {r['y_star']:>8.3g}  {r['workers_per_trainer']:>10.3g}  "
                     f"{r['compute_ratio']:>5.2f}  {r['steps_factor']:>17.2f}x  {r['saving']:>12.2f}x{mark}")
    lines += ["", HORIZON_TEXT + ".",
              *MEASURE_B, "",
              f"the paper's rule (--objective paper) answers x* = {_fmt(paper_design.x_star, 3)}, y* = "
              f"{_fmt(paper_design.y_star, 3)} ({paper_design.regime}) whatever b; {paper}."]
    return "\n".join(lines)


def _render_rule(mu, convention, d, source, evidence, paper_design, paper) -> str:
    rows = [("noise scale", "B_noise", _fmt(d.b_noise), source),
            ("noise scale / batch", "b = B_noise/B", _fmt(d.b, 3), f"replay pays iff b < {d.threshold_b:.3g}"),
            ("regime", "", d.regime, REGIME_SHORT[d.regime]),
            ("replay ratio", "y = B/R", _fmt(d.y, 4), f"updates each rollout contributes to (y* = "
                                                      f"{_fmt(d.y_continuous, 4)} before rounding R)"),
            ("rollouts per step", "R", str(d.rollouts_per_step), "fresh rollouts generated each step"),
            ("buffer size", "N = R", str(d.capacity), "x = 1: the shortest horizon"),
            ("batch size", "B", str(d.batch_size), "samples per update, drawn uniformly with replacement"
             if d.regime == "replay" else "each fresh rollout used once"),
            ("workers per trainer", "W/T = mu/y", _fmt(d.workers_per_trainer, 3),
             "inference GPUs per trainer GPU, none idle"),
            ("compute ratio", "gamma", _fmt(d.compute_ratio, 3), "compute per update vs on-policy (Eq. 2)"),
            ("steps vs on-policy", "S/S_on", _fmt(d.steps_vs_on_policy, 3), "more updates to the same target"),
            ("compute saved", "", f"{d.saving:.3g}x", "on-policy compute / this design's, to the same target")]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    if d.regime == "replay":
        todo = (f"what to do: generate R = {d.rollouts_per_step} rollouts per step, keep only them (N = R), and "
                f"train on B = {d.batch_size} drawn from them with replacement; W/T = {d.workers_per_trainer:.3g}.")
    elif d.rounding_lost_replay:  # replay would pay, but R = B / y* rounds up to B (or its saving is lost)
        y_star = ns.optimal_replay_ratio(d.b, d.mu)
        todo = (f"what to do: stay on-policy (b = {d.b:.3g} < {d.threshold_b:.3g}, so replay would pay at "
                f"y* = {y_star:.3g}, but R = B / y* rounded to a whole rollout is {d.batch_size} = B or loses "
                f"the saving: use a larger B).")
    else:
        todo = (f"what to do: stay on-policy (b = {d.b:.3g} >= {d.threshold_b:.3g}: replay's extra noise "
                f"costs more steps than its cheaper steps save).")
    verdict = verdict_line()
    lines = ([verdict + "."] if verdict else []) + [todo,  # the answer first, after the benchmark's verdict
        f"{PROG} optimal: mu = {mu:g} ({CONVENTION_TEXT[convention]}), B = {d.batch_size}",
        "objective: the noise-scale rule (docs/THEORY.md)", f"{evidence}.", ""]
    lines += [f"  {n:<{widths[0]}}  {s:<{widths[1]}}  {v:>{widths[2]}}  {m}" for n, s, v, m in rows]
    lines.append("")
    if d.regime == "replay":
        lines.append(HORIZON_TEXT + ".")
    lines.append(f"the paper's rule (--objective paper) would say x* = {_fmt(paper_design.x_star, 3)}, y* = "
                 f"{_fmt(paper_design.y_star, 3)} ({paper_design.regime}); {paper}.")
    return "\n".join(lines)


def _finite_budget(query: DesignQuery, loaded, budget: float, smoothness: float, bias: float, f0: float):
    """finite_budget_design for an `optimal` query: the power law (default alpha) or the loaded profile."""
    alpha = query.alpha
    if loaded is None:
        alpha = DEFAULT_ALPHA if alpha is None else alpha
    rho = query.rho if query.rho is not None else (loaded.rho if loaded is not None and loaded.rho is not None
                                                   else DEFAULT_RHO)
    return finite_budget_design(
        budget=budget, mu=query.mu, smoothness=smoothness, bias=bias, f0=f0,
        profile=PowerLawProfile(alpha) if loaded is None else loaded.profile,
        profile_description=(f"power law sigma(s) = (s/tau)^{alpha:g}" if loaded is None else loaded.description),
        alpha=alpha if loaded is None else None, rho=rho,
        batch_size=query.batch_size, rollouts_per_step=query.rollouts_per_step, convention=query.convention,
        average=query.average)


def gamma(
    workers: Annotated[float, typer.Option("--workers", "-W", help="Inference GPUs W (> 0).")],
    trainers: Annotated[float, typer.Option("--trainers", "-T", help="Trainer GPUs T (> 0).")],
    mu: Annotated[float, typer.Option("--mu", help="Rollout cost / per-sample update cost (Table 1 meaning, > 0).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Compute ratio gamma = (1 + W/T) / (1 + mu) of a buffered (W, T) split versus on-policy (Eq. 2)."""
    try:
        split = split_design(workers, trainers, mu)
    except ValueError as err:  # "workers must be ..." as the user typed it
        raise UserError(option_message(str(err), ("workers", "trainers", "mu"))) from None
    value, replay, regime = split.compute_ratio, split.replay_ratio, split.regime
    if regime == "on-policy":
        verdict = "the on-policy split (W/T = mu): an update costs what it costs on-policy"
    elif regime == "over-generation":  # gamma > 1 exactly when y = mu T / W < 1: inference outruns training
        verdict = (f"gamma > 1: this split is worse than on-policy - more generation than training can absorb "
                   f"(W/T = {split.workers_per_trainer:.3g} > mu = {mu:g}), so each update costs {value:.3g}x its "
                   f"on-policy compute and some rollouts are never trained on; move GPUs to training "
                   f"(W/T <= mu), e.g. W/T = mu is on-policy")
    else:
        verdict = (f"replay: each rollout is used {replay:.3g} times on average and an update costs "
                   f"{value:.1%} of its on-policy compute")
    if as_json:
        emit_json({"workers": workers, "trainers": trainers, "mu": mu, "gamma": value, "replay_ratio": replay,
                   "regime": regime, "verdict": verdict})
    else:
        typer.echo(f"gamma = (1 + W/T) / (1 + mu) = (1 + {workers:g}/{trainers:g}) / (1 + {mu:g}) = {value:.4f}")
        if regime != "replay":  # the replay verdict already says how often a rollout is used and what an update costs
            typer.echo(f"each rollout is used y = mu T / W = {replay:.3g} times on average; "
                       f"an update costs {value:.1%} of its on-policy compute.")
        typer.echo(verdict + ".")


def derive(
    name: Annotated[Optional[str], typer.Argument(help="Derivation to print; omit to list them.")] = None,
    latex: Annotated[bool, typer.Option("--latex", help="Print LaTeX instead of plain text.")] = False,
) -> None:
    """Print a sympy derivation (y-star, reduction, power-law-quadratic, ...) step by step."""
    from ..theory import symbolic  # sympy: heavy, kept out of `optimal`'s start-up

    if name is None:
        width = max(map(len, symbolic.DERIVATIONS))
        for key in symbolic.DERIVATIONS:
            typer.echo(f"{key:<{width}}  {symbolic.derive(key).title}")
        return
    typer.echo(symbolic.render(symbolic.derive(name), latex=latex))


def register(app: typer.Typer) -> None:
    """Add optimal, gamma and derive to ``app``."""
    app.command()(optimal)
    app.command()(gamma)
    app.command()(derive)

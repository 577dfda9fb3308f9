"""``replay-theory optimal | gamma | derive``: the theory from the command line.

Paper: experience-replay (docs/REFERENCES.md). ``optimal`` gives Thm 3.5's staleness horizon x* = N/R
(N: buffer capacity ``--buffer-size``, R: rollouts per step ``-R``) and replay ratio y* = B/R (B: batch
size ``-B``) for a rollout cost ratio mu; ``gamma`` is Eq. 2's compute ratio of a (W, T) GPU split;
``derive`` prints the sympy derivations. Each command builds one typed query and calls ``theory/``.

``optimal`` must start fast (bench/bench_optimal_startup.py): sympy is imported inside ``derive`` only.
"""

from __future__ import annotations

import math
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from replay_theory.cli.common import PROG, UserError, emit_json, option_message
from replay_theory.theory.compute import compute_ratio, replay_ratio_of_split
from replay_theory.theory.design import (
    DEFAULT_ALPHA,
    DEFAULT_RHO,
    OBJECTIVE_LABELS,
    DesignQuery,
    finite_budget_design,
    optimal_design,
)
from replay_theory.theory.profiles import PowerLawProfile, load_profile

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
}


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
            ("buffer size", "N", "-" if d.buffer_size is None else str(d.buffer_size), "FIFO capacity"),
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
    lines = [head, f"objective: {OBJECTIVE_LABELS[d.objective]}", ""]
    for name, symbol, value, meaning in rows:
        lines.append(f"  {name:<{widths[0]}}  {symbol:<{widths[1]}}  {value:>{widths[2]}}  {meaning}")
    lines.append("")
    lines.append(f"what it is: {d.regime_text}.")
    lines.append(f"what to do: {d.advice}.")
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
                     f"({_fmt(j['bound_at_budget'] / d.bound, 3)}x this design's).")
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
            raise UserError(f"{name} must be {valid}, got {value:g}")
    if rollouts_per_step is None and batch_size is None:
        raise UserError("--budget needs --batch-size or --rollouts-per-step: at a finite budget the bound prefers "
                        "the smallest batch, so the scale must be fixed")


def optimal(
    mu: Annotated[float, typer.Option("--mu", help="Rollout cost ratio (default meaning: rollout cost / per-sample "
                                                   "update cost, Table 1; 5.28 for Qwen2.5-7B).")],
    alpha: Annotated[Optional[float], typer.Option("--alpha", help="Power-law exponent of the noise profile "
                                                   "sigma(s) = (s/tau)^alpha, >= 0 (default 0.25).")] = None,
    rho: Annotated[Optional[float], typer.Option("--rho", help="Sample correlation coefficient of Assumption 3.3, "
                                                 "in [0, 1] (default 0.1, or the profile's).")] = None,
    convention: Annotated[Convention, typer.Option("--convention", help="Meaning of mu: rollout-cost (Table 1) or "
                                                   "paper-sec3 (literal Sec. 3: c = R + mu B).")
                          ] = Convention.rollout_cost,
    rollouts_per_step: Annotated[Optional[int], typer.Option("--rollouts-per-step", "-R", help="Fresh rollouts per "
                                                             "step R: gives integer N and B.")] = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", "-B", help="Batch size B (instead of R): "
                                                      "gives R and N.")] = None,
    profile: Annotated[Optional[Path], typer.Option("--profile", help="Noise profile sigma^2(s) file (JSON or CSV, "
                                                    "see docs) to optimise numerically; a calibrated file holds the "
                                                    "sigma^2 form of its probe's loss (plain: unbiased IS, "
                                                    "signal-normalised: clipped).")] = None,
    average: Annotated[Average, typer.Option("--average", help="Average of sigma^2 over the buffer for --profile: "
                                             "integral (paper) or discrete (exact, integer horizons).")
                       ] = Average.integral,
    budget: Annotated[Optional[float], typer.Option("--budget", help="Compute budget C (per-sample update costs; "
                                                    "rollout costs with paper-sec3): minimise the Thm 3.4 bound "
                                                    "itself at C. Without it: Thm 3.5's J, the large-budget "
                                                    "limit.")] = None,
    smoothness: Annotated[Optional[float], typer.Option("--smoothness", help="L of Assumption 3.1 (> 0; with "
                                                        "--budget).")] = None,
    bias: Annotated[Optional[float], typer.Option("--bias", help="kappa of Assumption 3.2 (>= 0; with "
                                                  "--budget).")] = None,
    f0: Annotated[Optional[float], typer.Option("--f0", help="F(theta_0) - inf F (> 0; with --budget).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (infinite values as null).")] = False,
) -> None:
    """Optimal staleness horizon x = N/R and replay ratio y = B/R, with the GPU split they imply.

    Without --budget: Thm 3.5's J, the large-budget limit. With --budget C --smoothness L --bias KAPPA --f0 F0
    and -B or -R: the integer design minimising the Thm 3.4 bound at compute C (docs/THEORY.md).
    """
    _check_budget_options(budget, smoothness, bias, f0, rollouts_per_step, batch_size)
    loaded = None if profile is None else load_profile(profile)
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
        average=average.value,
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
    if as_json:
        emit_json(design.to_json_dict())
    else:
        typer.echo(_render_design(design))


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
    value = compute_ratio(workers, trainers, mu)
    replay = replay_ratio_of_split(workers, trainers, mu)
    # gamma > 1 exactly when W/T > mu, i.e. y = mu T / W < 1: inference outruns training.
    if abs(value - 1.0) <= 1e-12:
        regime, verdict = "on-policy", "the on-policy split (W/T = mu): an update costs what it costs on-policy"
    elif value > 1.0:
        regime = "over-generation"
        verdict = (f"gamma > 1: this split is worse than on-policy - more generation than training can absorb "
                   f"(W/T = {workers / trainers:.3g} > mu = {mu:g}), so each update costs {value:.3g}x its "
                   f"on-policy compute and some rollouts are never trained on; move GPUs to training "
                   f"(W/T <= mu), e.g. W/T = mu is on-policy")
    else:
        regime = "replay"
        verdict = (f"replay: each rollout is used {replay:.3g} times on average and an update costs "
                   f"{value:.1%} of its on-policy compute")
    if as_json:
        emit_json({"workers": workers, "trainers": trainers, "mu": mu, "gamma": value, "replay_ratio": replay,
                   "regime": regime, "verdict": verdict})
    else:
        typer.echo(f"gamma = (1 + W/T) / (1 + mu) = (1 + {workers:g}/{trainers:g}) / (1 + {mu:g}) = {value:.4f}")
        typer.echo(f"each rollout is used y = mu T / W = {replay:.3g} times on average; "
                   f"an update costs {value:.1%} of its on-policy compute.")
        typer.echo(verdict + ".")


def derive(
    name: Annotated[Optional[str], typer.Argument(help="Derivation to print; omit to list them.")] = None,
    latex: Annotated[bool, typer.Option("--latex", help="Print LaTeX instead of plain text.")] = False,
) -> None:
    """Print a sympy derivation (y-star, reduction, power-law-quadratic, ...) step by step."""
    from replay_theory.theory import symbolic  # sympy: heavy, kept out of `optimal`'s start-up

    if name is None:
        for key in symbolic.DERIVATIONS:
            typer.echo(f"{key:<22} {symbolic.derive(key).title}")
        return
    typer.echo(symbolic.render(symbolic.derive(name), latex=latex))


def register(app: typer.Typer) -> None:
    """Add optimal, gamma and derive to ``app``."""
    app.command()(optimal)
    app.command()(gamma)
    app.command()(derive)

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

from replay_theory.cli.common import PROG, UserError, emit_json
from replay_theory.theory.compute import compute_ratio, replay_ratio_of_split
from replay_theory.theory.design import DesignQuery, optimal_design
from replay_theory.theory.profiles import load_profile

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


def _render_design(design) -> str:
    d = design
    rows = [
        ("staleness horizon", "x* = N/R", _fmt(d.x_star), "steps a rollout stays in the FIFO buffer"),
        ("replay ratio", "y* = B/R", _fmt(d.y_star), "updates each rollout contributes to"),
        ("regime", "", d.regime, {"replay": "reuse rollouts", "on-policy": "use each rollout once",
                                  "unbounded": "largest buffer you can afford"}[d.regime]),
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
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{PROG} optimal: mu = {d.mu:g} ({CONVENTION_TEXT[d.convention]})", ""]
    for name, symbol, value, meaning in rows:
        lines.append(f"  {name:<{widths[0]}}  {symbol:<{widths[1]}}  {value:>{widths[2]}}  {meaning}")
    lines.append("")
    alpha_text = "" if d.alpha is None else f"alpha = {d.alpha:g}, "
    lines.append(f"assumptions: {d.profile}; {alpha_text}rho = {d.rho:g}; {d.method}.")
    if (d.x_star_unconstrained != d.x_star) and d.regime != "unbounded":
        lines.append(f"unconstrained optimum: x = {_fmt(d.x_star_unconstrained)}, y = {_fmt(d.y_star_unconstrained)}.")
    for note in d.notes:
        lines.append(f"note: {note}.")
    return "\n".join(lines)


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
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (infinite values as null).")] = False,
) -> None:
    """Optimal staleness horizon x* = N/R and replay ratio y* = B/R (Thm 3.5), with the GPU split they imply."""
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
    design = optimal_design(query)
    if as_json:
        emit_json(design.to_json_dict())
    else:
        typer.echo(_render_design(design))


def gamma(
    workers: Annotated[float, typer.Option("--workers", "-W", help="Inference GPUs W (> 0).")],
    trainers: Annotated[float, typer.Option("--trainers", "-T", help="Trainer GPUs T (> 0).")],
    mu: Annotated[float, typer.Option("--mu", help="Rollout cost / per-sample update cost (Table 1 meaning, > 0).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Compute ratio gamma = (1 + W/T) / (1 + mu) of a buffered (W, T) split versus on-policy (Eq. 2)."""
    value = compute_ratio(workers, trainers, mu)
    replay = replay_ratio_of_split(workers, trainers, mu)
    if as_json:
        emit_json({"workers": workers, "trainers": trainers, "mu": mu, "gamma": value, "replay_ratio": replay})
    else:
        typer.echo(f"gamma = (1 + W/T) / (1 + mu) = (1 + {workers:g}/{trainers:g}) / (1 + {mu:g}) = {value:.4f}")
        typer.echo(f"each rollout is used y = mu T / W = {replay:.3g} times on average; "
                   f"an update costs {value:.1%} of its on-policy compute.")


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

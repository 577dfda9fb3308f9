"""The ``replay-theory`` command line.

Each sub-command builds one typed config (``DesignQuery`` for ``optimal``) and
calls the theory package; heavy imports (sympy for ``derive``) happen inside the
command that needs them, so ``replay-theory optimal`` loads only typer, numpy
and scipy.optimize (bench/bench_optimal_startup.py measures it).

Bad input never shows a traceback: ``main`` prints one line naming the
parameter and its valid range and exits with code 2.
"""

from __future__ import annotations

import json
import math
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

try:  # typer >= 0.20 vendors click
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer with the click package
    from click import exceptions as click_exceptions

PROG = "replay-theory"

# Valid ranges shown when click rejects a value before our own checks run.
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

app = typer.Typer(
    name=PROG,
    help="How large a replay buffer, what replay ratio, which GPU split: theory-backed answers for LLM RL.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


class Convention(str, Enum):
    rollout_cost = "rollout-cost"
    paper_sec3 = "paper-sec3"


class Average(str, Enum):
    integral = "integral"
    discrete = "discrete"


class UserError(Exception):
    """A problem with the user's input: one line, exit code 2."""


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
        ("workers per trainer", "W/T = mu/y", _fmt(d.workers_per_trainer, 3), "inference GPUs per trainer GPU, none idle"),
        ("compute ratio", "gamma", _fmt(d.compute_ratio, 3), "compute per update vs on-policy (Eq. 2)"),
    ]
    if d.rollouts_per_step is not None:
        rows += [
            ("rollouts per step", "R", str(d.rollouts_per_step), "fresh rollouts generated each step"),
            ("buffer size", "N", "-" if d.buffer_size is None else str(d.buffer_size), "FIFO capacity"),
            ("batch size", "B", "-" if d.batch_size is None else str(d.batch_size), "samples per update, drawn uniformly"),
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


def _emit_json(payload: dict) -> None:
    typer.echo(json.dumps(payload, indent=2, allow_nan=False))


@app.command()
def optimal(
    mu: float = typer.Option(..., "--mu", help="Rollout cost ratio (default meaning: rollout cost / per-sample update cost, Table 1; 5.28 for Qwen2.5-7B)."),
    alpha: Optional[float] = typer.Option(None, "--alpha", help="Power-law exponent of the noise profile sigma(s) = (s/tau)^alpha, >= 0 (default 0.25)."),
    rho: Optional[float] = typer.Option(None, "--rho", help="Sample correlation coefficient of Assumption 3.3, in [0, 1] (default 0.1, or the profile's)."),
    convention: Convention = typer.Option(Convention.rollout_cost, "--convention", help="Meaning of mu: rollout-cost (Table 1) or paper-sec3 (literal Sec. 3: c = R + mu B)."),
    rollouts_per_step: Optional[int] = typer.Option(None, "--rollouts-per-step", "-R", help="Fresh rollouts per step R: gives integer N and B."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", "-B", help="Batch size B (instead of R): gives R and N."),
    profile: Optional[Path] = typer.Option(None, "--profile", help="Noise profile sigma^2(s) file (JSON or CSV, see docs) to optimise numerically."),
    average: Average = typer.Option(Average.integral, "--average", help="Average of sigma^2 over the buffer for --profile: integral (paper) or discrete (exact, integer horizons)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (infinite values as null)."),
) -> None:
    """Optimal staleness horizon x* = N/R and replay ratio y* = B/R (Thm 3.5), with the GPU split they imply."""
    from replay_theory.theory.design import DesignQuery, optimal_design

    loaded = None
    if profile is not None:
        from replay_theory.theory.profiles import load_profile

        loaded = load_profile(profile)
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
        _emit_json(design.to_json_dict())
    else:
        typer.echo(_render_design(design))


@app.command()
def gamma(
    workers: float = typer.Option(..., "--workers", "-W", help="Inference GPUs W (> 0)."),
    trainers: float = typer.Option(..., "--trainers", "-T", help="Trainer GPUs T (> 0)."),
    mu: float = typer.Option(..., "--mu", help="Rollout cost / per-sample update cost (Table 1 meaning, > 0)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Compute ratio gamma = (1 + W/T) / (1 + mu) of a buffered (W, T) split versus on-policy (Eq. 2)."""
    from replay_theory.theory.compute import compute_ratio, replay_ratio_of_split

    value = compute_ratio(workers, trainers, mu)
    replay = replay_ratio_of_split(workers, trainers, mu)
    if as_json:
        _emit_json({"workers": workers, "trainers": trainers, "mu": mu, "gamma": value, "replay_ratio": replay})
    else:
        typer.echo(f"gamma = (1 + W/T) / (1 + mu) = (1 + {workers:g}/{trainers:g}) / (1 + {mu:g}) = {value:.4f}")
        typer.echo(f"each rollout is used y = mu T / W = {replay:.3g} times on average; "
                   f"an update costs {value:.1%} of its on-policy compute.")


@app.command()
def derive(
    name: Optional[str] = typer.Argument(None, help="Derivation to print; omit to list them."),
    latex: bool = typer.Option(False, "--latex", help="Print LaTeX instead of plain text."),
) -> None:
    """Print a sympy derivation (y-star, reduction, power-law-quadratic, ...) step by step."""
    from replay_theory.theory import symbolic

    if name is None:
        for key in symbolic.DERIVATIONS:
            typer.echo(f"{key:<22} {symbolic.derive(key).title}")
        return
    typer.echo(symbolic.render(symbolic.derive(name), latex=latex))


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: run the app, turning every input error into one line and exit code 2."""
    args = sys.argv[1:] if argv is None else argv
    try:
        result = app(args=args, prog_name=PROG, standalone_mode=False)
    except click_exceptions.BadParameter as err:
        param = getattr(err, "param", None)
        pname = getattr(param, "name", None) or ""
        hint = VALID_RANGES.get(pname)
        message = err.format_message() + (f" (valid: {hint})" if hint else "")
        print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr)
        sys.exit(2)
    except click_exceptions.UsageError as err:
        print(f"{PROG}: error: {_one_line(err.format_message())}", file=sys.stderr)
        sys.exit(2)
    except (UserError, ValueError) as err:
        print(f"{PROG}: error: {_one_line(str(err))}", file=sys.stderr)
        sys.exit(2)
    except typer.Abort:
        print(f"{PROG}: aborted", file=sys.stderr)
        sys.exit(1)
    sys.exit(result if isinstance(result, int) else 0)


def _register_simulator_commands() -> None:
    from replay_theory.cli.diagnose_cmds import register as register_diagnose
    from replay_theory.cli.figures_cmds import register as register_figures
    from replay_theory.cli.simulate_cmds import register

    register(app)
    register_figures(app)
    register_diagnose(app)


_register_simulator_commands()

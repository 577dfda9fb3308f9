"""``replay-theory optimal | gamma | derive``: the theory from the command line.

``optimal`` takes every field of :class:`~replay_theory.theory.optimal.OptimalQuery` as an option and prints the
answer theory/optimal.py computes and renders: by default the forgetting-aware whole design (B, R, N), with
``--objective noise-scale`` the noise-scale rule (McCandlish et al. 2018), with ``--objective paper`` the
experience-replay paper's Thm 3.5 (or Thm 3.4 at ``--budget``). ``gamma`` is Eq. 2's compute ratio of a (W, T)
GPU split (:class:`~replay_theory.theory.optimal.SplitQuery`); ``derive`` prints the sympy derivations.

``optimal`` must start fast (bench/bench_optimal_startup.py): this module and the theory modules it imports need
numpy only; scipy is imported where a search needs it, sympy inside ``derive`` only (tests/integration/test_cli_lazy.py
checks the module set ``optimal --mu 5.28`` loads).
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from ..theory.answer import render_split, split_record
from ..theory.optimal import OptimalQuery, SplitQuery, answer
from .common import emit_json
from .config_options import with_field_options

OPTIMAL_ALIASES = {"batch_size": ("-B",), "rollouts_per_step": ("-R",)}
GAMMA_ALIASES = {"workers": ("-W",), "trainers": ("-T",)}
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object (infinite values as null).")]


@with_field_options(OptimalQuery, aliases=OPTIMAL_ALIASES)
def optimal(fields: dict[str, Any], as_json: JsonOption = False) -> None:
    """What to do with your rollouts: the cheapest on-policy batch against the best replay design (B, R, N).

    Default (forgetting): from mu, b = B_noise / B at your batch and the optimizer's memory kappa, the whole design
    (docs/THEORY.md, "Forgetting"). --objective noise-scale: the replay ratio at a fixed B with psi = 1.
    --objective paper: Thm 3.5's J (large-budget limit), or with --budget C --smoothness L --bias KAPPA --f0 F0 and
    -B or -R the integer design minimising the Thm 3.4 bound at compute C.
    """
    result = answer(OptimalQuery(**fields))
    if as_json:
        emit_json(result.record)
    else:
        typer.echo(result.text)
    if result.note is not None:
        typer.echo(result.note, err=True)


@with_field_options(SplitQuery, aliases=GAMMA_ALIASES)
def gamma(fields: dict[str, Any], as_json: JsonOption = False) -> None:
    """Compute ratio gamma = (1 + W/T) / (1 + mu) of a buffered (W, T) split versus on-policy (Eq. 2)."""
    split = SplitQuery(**fields).split()
    if as_json:
        emit_json(split_record(split))
    else:
        typer.echo(render_split(split))


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

"""``replay-theory optimal | gamma | derive``: the theory from the command line.

``optimal`` takes every field of :class:`~replay_theory.advise.optimal.OptimalQuery` as an option and prints the
answer advise/optimal.py computes and renders for the ``--objective`` asked (its ``OBJECTIVES`` table). ``gamma`` is
Eq. 2's compute ratio of a (W, T) GPU split (:class:`~replay_theory.advise.optimal.SplitQuery`); ``derive`` prints
the sympy derivations.

``optimal`` must start fast (bench/bench_optimal_startup.py): this module and the theory modules it imports need
numpy only; scipy is imported where a search needs it, sympy inside ``derive`` only (tests/integration/test_cli_lazy.py
checks the module set ``optimal --mu 5.28`` loads).
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from ..advise.answer import render_split, split_record
from ..advise.optimal import OptimalQuery, SplitQuery, answer
from .common import emit_json
from .config_options import with_field_options

OPTIMAL_ALIASES = {"batch_size": ("-B",), "rollouts_per_step": ("-R",)}
GAMMA_ALIASES = {"workers": ("-W",), "trainers": ("-T",)}
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object (infinite values as null).")]


@with_field_options(OptimalQuery, aliases=OPTIMAL_ALIASES)
def optimal(fields: dict[str, Any], as_json: JsonOption = False) -> None:
    """What to do with your rollouts: the cheapest on-policy batch against the best replay design (B, R, N).

    --objective picks the rule that answers (its choices are listed under it; docs/THEORY.md); an option marked with
    an objective's name applies to that objective only.
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
            typer.echo(f"{key:<{width}}  {symbolic.TITLES[key]}")  # no derivation built to list them
        return
    typer.echo(symbolic.render(symbolic.derive(name), latex=latex))


def register(app: typer.Typer) -> None:
    """Add optimal, gamma and derive to ``app``."""
    app.command()(optimal)
    app.command()(gamma)
    app.command()(derive)

"""The ``replay-theory`` command line: the root app, ``--version`` and the one error handler.

Paper: experience-replay (docs/REFERENCES.md) and the replay designs it is compared with. Commands live
in one module per family, each with ``register(app)`` so it can be loaded and tested on its own:

| module                  | commands                                                    |
|-------------------------|-------------------------------------------------------------|
| ``cli/theory_cmds.py``  | optimal (Thm 3.5: x* = N/R, y* = B/R), gamma (Eq. 2), derive |
| ``cli/simulate_cmds.py``| simulate, calibrate-simulator, sweep, experiment            |
| ``cli/validate_cmds.py``| validate calibrate-model / predict / verify / all           |
| ``cli/figures_cmds.py`` | figures                                                     |
| ``cli/diagnose_cmds.py``| diagnose                                                    |
| ``cli/calibrate_log_cmds.py`` | calibrate --from-log (mu and sigma^2(s) from a run's log) |
| ``cli/trl_cmds.py``     | trl-replay (TRL's GRPOTrainer with the replay buffer)       |

Heavy optional dependencies (sympy, matplotlib, torch, transformers, pyarrow) are imported inside
the commands that need them, so ``replay-theory optimal`` loads only typer, numpy and scipy
(bench/bench_optimal_startup.py measures it).

Bad input never shows a traceback: ``main`` prints one line naming the option and its valid range
and exits with code 2.
"""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from .. import __version__
from . import (
    calibrate_log_cmds,
    diagnose_cmds,
    figures_cmds,
    simulate_cmds,
    theory_cmds,
    trl_cmds,
    validate_cmds,
)
from .common import PROG, UserError, help_without_command

# Valid ranges shown when typer rejects a value before the commands' own checks run, by parameter name.
VALID_RANGES = {**theory_cmds.VALID_RANGES, **simulate_cmds.VALID_RANGES}

# rich_markup_mode=None: click's plain help, option and metavar on the left, the text wrapped beside it in all the
# width left (48 of 80 columns). typer's rich panels give the text 22 of 80 columns (optimal's help ran to 100
# lines for 16 options) and show flags as taking a <bool> value, which they refuse (--json true is an error).
app = typer.Typer(
    name=PROG,
    help="How large a replay buffer, what replay ratio, which GPU split: theory-backed answers for LLM RL.",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"{PROG} {__version__}")
        raise typer.Exit(0)


@app.callback(invoke_without_command=True)
def root(
    ctx: typer.Context,
    version: Annotated[Optional[bool], typer.Option("--version", callback=_print_version, is_eager=True,
                                                    help="Print the package version and exit.")] = None,
) -> None:
    """How large a replay buffer, what replay ratio, which GPU split: theory-backed answers for LLM RL."""
    help_without_command(ctx)


for family in (theory_cmds, simulate_cmds, validate_cmds, figures_cmds, diagnose_cmds, calibrate_log_cmds, trl_cmds):
    family.register(app)


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


def _fail(message: str) -> None:
    print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr)
    sys.exit(2)


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: run the app, turning every input error into one line and exit code 2."""
    args = sys.argv[1:] if argv is None else argv
    try:
        result = app(args=args, prog_name=PROG, standalone_mode=False)
    except typer.BadParameter as err:
        param = getattr(err, "param", None)
        hint = VALID_RANGES.get(getattr(param, "name", None) or "")
        _fail(err.format_message() + (f" (valid: {hint})" if hint else ""))
    except typer.TyperException as err:  # every usage error typer/click raises (unknown option, missing value)
        _fail(err.format_message())
    except (UserError, ValueError) as err:
        _fail(str(err))
    except typer.Abort:
        print(f"{PROG}: aborted", file=sys.stderr)
        sys.exit(1)
    sys.exit(result if isinstance(result, int) else 0)

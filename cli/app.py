"""The ``replay-theory`` command line: the root app, ``--version``, lazy command loading and the one error handler.

Each command family is a module with ``register(app)``; ``COMMANDS`` says which, and a family is imported only when
one of its commands runs or shows its help (tests/integration/test_cli_lazy.py). Bad input is one line naming the
option and its valid range, exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
import typing
from collections.abc import Iterator, MutableMapping
from typing import Annotated, NamedTuple, NoReturn, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from .. import __version__
from .common import PROG, UserError, help_without_command
from .plain_values import PlainValuesCommand, PlainValuesParams


class Entry(NamedTuple):
    module: str
    """The command's family, ``cli/<module>.py``, whose ``register(app)`` adds it."""
    help: str
    """Its root-help summary: the first sentence of its own help (tests/integration/test_cli_lazy.py checks both)."""


# Every command, in the order the root help lists them (typer listed a group, here validate, after the commands).
COMMANDS: dict[str, Entry] = {
    "optimal": Entry("theory_cmds", "What to do with your rollouts: the cheapest on-policy batch against the best "
                                    "replay design (B, R, N)."),
    "gamma": Entry("theory_cmds", "Compute ratio gamma = (1 + W/T) / (1 + mu) of a buffered (W, T) split versus "
                                  "on-policy (Eq. 2)."),
    "derive": Entry("theory_cmds", "Print a sympy derivation (y-star, reduction, power-law-quadratic, ...) step by "
                                   "step."),
    "simulate": Entry("simulate_cmds", "Run one simulator configuration (all seeds vectorised) and print its "
                                       "summary."),
    "calibrate-simulator": Entry("simulate_cmds", "Measure sigma^2(s), rho, B_noise and kappa on a simulator probe "
                                                  "run; writes the profile `optimal --profile` reads."),
    "sweep": Entry("simulate_cmds", "Run a grid of simulator configurations in parallel; resumable, never "
                                    "overwrites."),
    "experiment": Entry("simulate_cmds", "Run one of the docs/SIMULATION.md experiments and print its table (rebuilt "
                                         "from the saved runs)."),
    "figures": Entry("figures_cmds", "Regenerate figures (matplotlib): theory figures always, results figures whose "
                                     "results exist."),
    "diagnose": Entry("diagnose_cmds", "Off-policy health of logged rollouts (ESS, chi^2, KL, M2, the theory bounds, "
                                       "KL drift) and a what-if table of corrections."),
    "calibrate": Entry("calibrate_log_cmds", "mu and a noise profile sigma^2(s) for `optimal --profile`, from a run's "
                                             "exported diagnose log."),
    "trl-replay": Entry("trl_cmds", "Run TRL's GRPOTrainer with the replay buffer on Countdown; writes the log "
                                    "`diagnose` and `calibrate --from-log` read."),
    "validate": Entry("validate_cmds", "Check the theory's predictions on a Qwen2-architecture language model (needs "
                                       "the validate extra)."),
}

# rich_markup_mode=None: click's plain help, the text in all the width left of the option (typer's rich panels leave it
# 22 of 80 columns and show flags as taking a value they refuse). Families are built with them too (``load_family``).
SETTINGS = {"add_completion": False, "pretty_exceptions_enable": False, "rich_markup_mode": None}


def load_family(module: str):  # the commands' class is click's, or the click that newer typer vendors
    """The click commands ``cli/<module>.py`` registers, by name, built as typer builds them for the root app, their
    values converted without pydantic where typer's conversion needs none (cli/plain_values.py)."""
    family = typer.Typer(**SETTINGS)
    importlib.import_module(f".{module}", __package__).register(family)
    for info in family.registered_commands:  # as app.command(cls=...) would; a command's own class is kept
        if info.cls in (None, TyperCommand):
            info.cls = PlainValuesCommand
    return dict(typer.main.get_group(family).commands)


class LazyCommands(MutableMapping):
    """name -> click command, keyed by ``COMMANDS``: reading a name imports its family (once); listing imports
    nothing. A command added directly (``add_command``) is kept as it is."""

    def __init__(self, table: dict[str, Entry]) -> None:
        self.table = table
        self.loaded: dict = {}

    def __getitem__(self, name: str):
        if name not in self.loaded and name in self.table:
            self.loaded.update(load_family(self.table[name].module))
        return self.loaded[name]

    def __setitem__(self, name: str, command) -> None:
        self.loaded[name] = command

    def __delitem__(self, name: str) -> None:
        raise TypeError(f"the command {name!r} cannot be removed")

    def __iter__(self) -> Iterator[str]:
        yield from self.table
        yield from (name for name in self.loaded if name not in self.table)

    def __len__(self) -> int:
        return len(self.table) + sum(name not in self.table for name in self.loaded)

    def __contains__(self, name: object) -> bool:
        return name in self.table or name in self.loaded


class LazyGroup(PlainValuesParams, TyperGroup):
    """The root group: commands from ``COMMANDS``, imported on first use; the root help imports none of them."""

    def __init__(self, **attrs) -> None:
        super().__init__(**attrs)
        added = dict(self.commands)
        self.commands = LazyCommands(COMMANDS)
        self.commands.update(added)

    # ctx and formatter take TyperGroup's types: click's, or the click that newer typer vendors
    def list_commands(self, ctx) -> list[str]:
        return list(self.commands)

    def get_command(self, ctx, cmd_name: str):
        return self.commands.get(cmd_name)

    def format_commands(self, ctx, formatter) -> None:
        """TyperGroup.format_commands with each summary shortened from the table (a stand-in command carrying the
        table's text shortens it exactly as click shortens the command's own help) instead of the loaded command."""
        commands = [(name, TyperCommand(name, help=COMMANDS[name].help) if name in COMMANDS else self.commands[name])
                    for name in self.commands]
        commands = [(name, command) for name, command in commands if not command.hidden]
        if not commands:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in commands)  # as TyperGroup.format_commands
        summaries = [(name, command.get_short_help_str(limit)) for name, command in commands]
        with formatter.section("Commands"):
            formatter.write_dl(summaries)


app = typer.Typer(
    name=PROG,
    help="How large a replay buffer, what replay ratio, which GPU split: theory-backed answers for LLM RL.",
    cls=LazyGroup,
    **SETTINGS,
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


def valid_range(name: str, command=None) -> Optional[str]:
    """The valid range of the parameter ``name`` as its field states it (``command``'s ``valid_ranges``, set by
    cli/config_options.py from the field's metadata); None for an option not built from a field."""
    return getattr(getattr(command, "callback", None), "valid_ranges", {}).get(name)


def _integer_option(name: str, command=None) -> bool:
    """Whether the parameter ``name`` of ``command`` takes an integer (its annotation: int or Optional[int])."""
    hint = getattr(getattr(command, "callback", None), "__annotations__", {}).get(name)
    if typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    return hint is int or int in typing.get_args(hint)


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


def _fail(message: str) -> NoReturn:
    print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr)
    sys.exit(2)


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: run the app, turning every input error into one line and exit code 2."""
    args = sys.argv[1:] if argv is None else argv
    try:
        result = app(args=args, prog_name=PROG, standalone_mode=False)
    except typer.BadParameter as err:
        param, ctx = getattr(err, "param", None), getattr(err, "ctx", None)
        hint = valid_range(getattr(param, "name", None) or "", getattr(ctx, "command", None))
        if hint is None and _integer_option(getattr(param, "name", None) or "", getattr(ctx, "command", None)):
            from ..core.memory import MAX_SIZE  # the every-size ceiling (core/memory.py), loaded only here

            hint = f"an integer; a size is at most {MAX_SIZE} and what this machine's memory holds"  # 1e30, 2.5
        _fail(err.format_message() + (f" (valid: {hint})" if hint else ""))
    except typer.TyperException as err:  # every usage error typer/click raises (unknown option, missing value)
        _fail(err.format_message())
    except (UserError, ValueError) as err:
        _fail(str(err))
    except typer.Abort:
        print(f"{PROG}: aborted", file=sys.stderr)
        sys.exit(1)
    sys.exit(result if isinstance(result, int) else 0)

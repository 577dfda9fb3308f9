"""What every command family shares: the user-error type, strict JSON, output-path checks.

Bad input is one line naming the option as the user typed it (``--out``, ``--jobs``) with its valid
range, exit code 2 (``cli/app.py::main``), and it is found before any work starts.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Iterable, Iterator

import typer

from ..outputs import strict

PROG = "replay-theory"


class UserError(Exception):
    """A problem with the user's input: one line, exit code 2."""


def emit_json(payload: dict) -> None:
    """Print one strict JSON object (infinite and NaN values as null, as RFC 8259 requires)."""
    typer.echo(json.dumps(strict(payload), indent=2, allow_nan=False))


def option_message(message: str, fields: Iterable[str]) -> str:
    """A config error ``"lr must be > 0"`` as the user typed the option: ``"--lr must be > 0"``.

    Only a leading field name is rewritten, so the rest of the message stays as written.
    """
    head, _, rest = message.partition(" ")
    if head in set(fields) and rest:
        return "--" + head.replace("_", "-") + " " + rest
    return message


def help_without_command(ctx: typer.Context) -> None:
    """Group callback: with no sub-command, print the group's help and exit 2, with no error line.

    Exit 2 is typer's own ``no_args_is_help`` convention (a command is required, so none is a usage
    error), kept so scripts see the same code; the help itself is the whole message.
    """
    if ctx.invoked_subcommand is None:
        help_text = ctx.get_help()  # typer's rich formatter prints it and returns ""; plain click returns it
        if help_text:
            typer.echo(help_text)
        raise typer.Exit(2)


@contextmanager
def on_ctrl_c(kept: str) -> Iterator[None]:
    """Ctrl-C inside: one line on stderr saying what is kept and how to go on, then exit code 130 (the shell's for
    SIGINT), no traceback. ``kept`` is the command's line; an interruption that carries its own (``message()``:
    a sweep's, trl-replay's) says that instead. Caught here, inside the command: click would turn it into an
    "Aborted!" after a blank line."""
    try:
        yield
    except KeyboardInterrupt as err:
        said = err.message() if callable(getattr(err, "message", None)) else kept
        typer.echo(said, err=True)
        raise typer.Exit(130) from None

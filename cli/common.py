"""What every command family shares: the user-error type, strict JSON, the help of a bare group, Ctrl-C."""

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
    """A config error ``"lr must be > 0"`` as the user typed the option: ``"--lr must be > 0"`` (a leading name)."""
    head, _, rest = message.partition(" ")
    if head in set(fields) and rest:
        return "--" + head.replace("_", "-") + " " + rest
    return message


def help_without_command(ctx: typer.Context) -> None:
    """Group callback: with no sub-command, print the group's help and exit 2 (typer's ``no_args_is_help`` code)."""
    if ctx.invoked_subcommand is None:
        help_text = ctx.get_help()  # typer's rich formatter prints it and returns ""; plain click returns it
        if help_text:
            typer.echo(help_text)
        raise typer.Exit(2)


@contextmanager
def on_ctrl_c(kept: str) -> Iterator[None]:
    """Ctrl-C inside: one line on stderr, ``kept`` (or the interruption's own ``message()``: a sweep's, trl-replay's)
    saying what is kept and how to go on, then exit code 130 (the shell's for SIGINT), no traceback."""
    try:
        yield
    except KeyboardInterrupt as err:
        message = getattr(err, "message", None)
        said = message() if callable(message) else kept
        typer.echo(said, err=True)
        raise typer.Exit(130) from None

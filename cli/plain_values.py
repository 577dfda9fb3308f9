"""Option values converted without pydantic, exactly as typer converts them.

typer (0.29) converts every option's value, the defaults included, through a pydantic ``TypeAdapter`` it builds on
first use, and the first one imports pydantic: most of what ``optimal`` spends beyond its imports
(bench/bench_optimal_startup.py). No typer declaration avoids it (``parser=`` goes through an adapter too), so the
commands' parameters get this conversion instead: the values our options take (a missing one; a number in plain
decimal notation within the option's bounds; a word; a ``parser``'s result) are converted here to what typer's adapter
returns for them, and every other value (a bad number, one out of bounds, anything a parser rejects) goes to typer's own
conversion, so each message and result is typer's (tests/unit/test_cli_plain_values.py compares the two). A typer
without ``get_runtime_param`` (before pydantic) keeps its own conversion.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from typer.core import TyperCommand

UNDECIDED = object()  # plain_value's answer for a value it leaves to typer
PLAIN_TYPES = (bool, int, float, str)
# the notation both pydantic and Python read as the same number (ASCII digits: no "1_000", "inf", " 5", "0x10")
NOTATION = {int: re.compile(r"[+-]?[0-9]+", flags=re.ASCII),
            float: re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", flags=re.ASCII)}


def plain_value(value: Any, annotation: Any, info: Any) -> Any:
    """``value`` (not None) as typer's adapter converts it for an option of type ``annotation`` (one of
    ``PLAIN_TYPES``) declared with ``info`` (its ``typer.Option``), or ``UNDECIDED`` where typer must decide."""
    if info.parser is not None:  # typer's adapter returns the parser's result as it is
        try:
            return info.parser(value)
        except Exception:  # its error, as typer words it
            return UNDECIDED
    converted = value if type(value) is annotation else _from_text(value, annotation)
    if annotation in (int, float) and converted is not UNDECIDED and not _within(converted, info.min, info.max):
        return UNDECIDED  # typer's message names the bound (or clamps it)
    return converted


def _from_text(value: Any, annotation: Any) -> Any:
    """A number typed in plain notation (``NOTATION``) as ``annotation``, else ``UNDECIDED``."""
    notation = NOTATION.get(annotation)
    if type(value) is not str or notation is None or not notation.fullmatch(value):
        return UNDECIDED
    try:
        return annotation(value)
    except ValueError:  # an integer past Python's digit limit
        return UNDECIDED


def _within(number: Any, low: Any, high: Any) -> bool:
    """Whether ``number`` is in [low, high] (None: no bound), bounds of its own kind (pydantic refuses an integer
    option a fractional bound, and typer words that)."""
    kinds = (int,) if type(number) is int else (int, float)
    return all(bound is None or type(bound) in kinds for bound in (low, high)) and (
        (low is None or number >= low) and (high is None or number <= high))


class PlainValues:
    """The conversion of one typer parameter (typer's runtime-parameter interface, ``coerce``): plain values here,
    any other value typer's own, which then stays the parameter's."""

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None:  # typer's runtime parameter returns None for a single value that is missing
            return None
        descriptor = param.type_descriptor
        converted = plain_value(value, descriptor.annotation, descriptor.parameter_info)
        if converted is not UNDECIDED:
            return converted
        param._runtime_param = None  # typer builds its own (pydantic) on the next line, and keeps it
        return param.get_runtime_param().coerce(value, param=param, ctx=ctx)


def use_plain_values(params: Iterable[Any]) -> None:
    """Give each single-valued parameter of a plain type in ``params`` the conversion here where typer has built none
    yet (it builds its own on first use); leave any other, and every parameter of a typer without runtime parameters,
    as it is."""
    for param in params:
        descriptor = getattr(param, "type_descriptor", None)
        if (descriptor is not None and getattr(param, "_runtime_param", UNDECIDED) is None
                and hasattr(param, "get_runtime_param") and not getattr(param, "multiple", False)
                and param.nargs == 1 and descriptor.file_annotation is None
                and any(descriptor.annotation is kind for kind in PLAIN_TYPES)):
            param._runtime_param = PlainValues()


class PlainValuesParams:
    """Command mixin: its parameters, the ``--help`` click adds when the command runs included, convert their values
    here (``use_plain_values``)."""

    def get_params(self, ctx):
        params = super().get_params(ctx)  # type: ignore[misc]
        use_plain_values(params)
        return params


class PlainValuesCommand(PlainValuesParams, TyperCommand):
    """typer's command class, its values converted here: the class cli/app.py gives each registered command."""

"""The one error type of ``diagnose`` that names a config field, so a front end can name its own option.

The library speaks in :class:`~replay_theory.diagnose.DiagnoseConfig` /
:class:`~replay_theory.diagnose.WhatIfConfig` field names (``ppo_clip``, ``freshper_tau``); the command line calls
the same values ``--clip`` and ``--tau``.  A :class:`ConfigError` keeps the field and the rest of the message apart,
and ``cli/diagnose_cmds.py`` swaps in the option as the user typed it.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A bad value of one field: ``str(err)`` is ``"<field> <detail>"``, one line."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field} {detail}")
        self.field = field
        self.detail = detail

    def named(self, name: str) -> str:
        """The same message with ``name`` (e.g. ``--clip``) in place of the field."""
        return f"{name} {self.detail}"


def check_field(check: Callable[..., T], field: str, *args: Any, **kwargs: Any) -> T:
    """``check(field, *args, **kwargs)``, a rule of ``checks.py``, whose one-line ValueError
    (``"<field> must be ..."``) is raised as a :class:`ConfigError` on ``field``: the message is the checks module's."""
    try:
        return check(field, *args, **kwargs)
    except ValueError as err:
        raise ConfigError(field, str(err).removeprefix(f"{field} ")) from None

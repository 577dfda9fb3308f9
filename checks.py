"""Input checks for every layer: one function per rule, so each message is written once.

Every check raises ``ValueError("<name> must be <valid range>, got <value>")``: one line naming the parameter
(or the option, as the caller names it) and its valid range; the CLI prints it with exit code 2. It imports
numpy only, so ``theory/`` (the lowest layer) uses it, and so do ``core/``, ``integrations/``, ``validate/`` and
``cli/``.

| function                   | accepts                                                 | says                         |
|----------------------------|---------------------------------------------------------|------------------------------|
| ``invalid``                | (builds the ValueError every check raises)              | ``must be <valid>, got <v>`` |
| ``require_integer``        | a Python int, not a bool (a config field, an option)    | an integer >= m / in [m, M]  |
| ``require_number``         | an int or a float, not a bool, not NaN                  | [a finite number] > b / >= b |
| ``require_unit_interval``  | a number                                                | in [0, 1] / in [0, 1)        |
| ``require_one_of``         | one of the names given (``one_of``: the phrase)         | one of a, b, c               |
| ``require_int``            | integer-valued numbers or arrays (whole floats too)     | an integer >= m              |
| ``require_finite``         | numbers or arrays                                       | a finite number              |
| ``require_positive``       | numbers or arrays                                       | [a finite number] > 0        |
| ``require_nonnegative``    | numbers or arrays                                       | [a finite number] >= 0       |
| ``require_in_range``       | a number                                                | in [low, high]               |
| ``require_open_interval``  | an int or a float, not a bool, not NaN                  | [a finite number] in (a, b)  |

The field checks show the value as given (its ``repr``, or the caller's format: ``fmt="g"`` for an option
typed on the command line); the array checks show the first bad element as a float.

A config field or an option states its values once, as a :class:`Range` in its metadata (``Range(...).field()``,
read back with ``range_of``): the field's check (``Range.check``) and the valid range its messages and ``--help``
state (``Range.text``) come from that one value (cli/config_options.py builds the options from it).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

Name = TypeVar("Name", bound=str)


def _shown(value: object, fmt: str) -> str:
    return repr(value) if fmt == "r" else format(value, fmt)


def invalid(name: str, valid: str, value: object, *, fmt: str = "r") -> ValueError:
    """The error every check raises: ``"<name> must be <valid>, got <value>"`` (``fmt``: "r" for repr, else a format
    spec such as "g")."""
    return ValueError(f"{name} must be {valid}, got {_shown(value, fmt)}")


# --- one value of a config field or an option, shown as given --------------------------------------


def require_integer(name: str, value: object, minimum: int, *, maximum: int | None = None, note: str = "",
                    whole_floats: bool = False) -> int:
    """A Python int (a bool is not one) >= ``minimum`` (and <= ``maximum``); with ``whole_floats`` a float of whole
    value too (a JSON file's 64.0). ``note`` follows the range, e.g. ``" (0: off)"``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= minimum and (
            maximum is None or value <= maximum) and (
            isinstance(value, int) or (whole_floats and math.isfinite(value) and value == int(value))):
        return int(value)
    valid = f"an integer >= {minimum}" if maximum is None else f"an integer in [{minimum}, {maximum}]"
    raise invalid(name, valid + note, value)


def require_number(name: str, value: object, *, above: float | None = None, at_least: float | None = None,
                   finite: bool = False, note: str = "", fmt: str = "r") -> float:
    """An int or a float (not a bool, not NaN) > ``above`` or >= ``at_least``; +-inf refused when ``finite``."""
    if above is not None and at_least is None:
        bound, limit, strict = f"> {above:g}", above, True
    elif at_least is not None and above is None:
        bound, limit, strict = f">= {at_least:g}", at_least, False
    else:
        raise TypeError("give exactly one of above and at_least")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value) \
            and (value > limit if strict else value >= limit) and (math.isfinite(value) or not finite):
        return float(value)
    raise invalid(name, f"{'a finite number ' if finite else ''}{bound}{note}", value, fmt=fmt)


def require_unit_interval(name: str, value: float, *, closed: bool = True) -> float:
    """0 <= value <= 1 (``closed``) or 0 <= value < 1; NaN fails both."""
    v = float(value)
    if not (0.0 <= v <= 1.0 if closed else 0.0 <= v < 1.0):
        raise invalid(name, "in [0, 1]" if closed else "in [0, 1)", value)
    return v


def one_of(options: Iterable[str]) -> str:
    """The valid range of a name: ``"one of a, b, c"`` (``invalid(name, one_of(names), value)``)."""
    return f"one of {', '.join(options)}"


def require_one_of(name: str, value: object, options: Iterable[Name], *, where: str = "") -> Name:
    """``value`` is one of ``options`` (a str; listed in their order, ``where`` after them): the option, typed as
    ``options`` are (a Literal's names stay that Literal)."""
    names = tuple(options)
    if not isinstance(value, str) or value not in names:
        raise invalid(name, one_of(names) + where, value)
    return names[names.index(value)]


# --- one field's values, said once: its check, the range its messages and --help state, its choices -------------

RANGE = "range"
"""Field-metadata key of a field's :class:`Range` (``Range.field()`` writes it, ``range_of`` reads it)."""

Choices = Mapping[str, str] | Callable[[], Mapping[str, str]]
"""{name: one-line help}, or a function returning it (a registry's entries, a table defined after the field)."""


@dataclass(frozen=True)
class Range:
    """The values a config field or an option takes: a number between ``low`` and ``high`` (None: unbounded;
    ``low_open`` / ``high_open``: the end excluded), a Python int if ``integer`` (a bool is neither), finite if
    ``finite``, or else one of ``special`` ({value: meaning}, e.g. ``{-1: "all cores"}``); or, with ``choices``, one
    of their names. ``text`` is the valid range every message and ``--help`` state: ``noun`` (default "an integer"
    for an integer, "a finite number" for a finite number bounded below only), the bounds, then ``note``; a value is
    shown as given (``fmt``: "r" its repr, "g" as an option typed on the command line is). A tuple field's values
    are each in the range. ``at_parse``: the command line refuses a value below ``low`` as it parses it (typer's
    ``min``), for a field whose own check runs late or not at all.

    ``check`` is the field's check, ``"<name> must be <text>, got <value>"`` as every check here raises it.
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    finite: bool = False
    noun: str | None = None
    note: str = ""
    fmt: str = "r"
    special: Mapping[int, str] | None = None
    choices: Choices | None = None
    at_parse: bool = False

    def field(self) -> dict:
        """The metadata of a dataclass field that takes these values: ``field(default=..., metadata=r.field())``."""
        return {RANGE: self}

    def named(self) -> Mapping[str, str] | None:
        """{choice: one-line help} of a field that names one of a few choices, else None."""
        return self.choices() if callable(self.choices) else self.choices

    @property
    def text(self) -> str:
        """The valid range, as messages and ``--help`` state it."""
        named = self.named()
        if named is not None:
            return one_of(named) + self.note
        special = "".join(f"{value} ({meaning}) or " for value, meaning in (self.special or {}).items())
        noun = self.noun if self.noun is not None else (
            "an integer" if self.integer else "a finite number" if self.finite and self.high is None else "")
        return special + " ".join(part for part in (noun, self._bounds()) if part) + self.note

    def _bounds(self) -> str:
        def shown(v: float) -> str:
            return str(int(v)) if self.integer else format(v, "g")

        if self.low is not None and self.high is not None:
            return (f"in {'(' if self.low_open else '['}{shown(self.low)}, {shown(self.high)}"
                    f"{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {shown(self.low)}"
        return "" if self.high is None else f"{'<' if self.high_open else '<='} {shown(self.high)}"

    def holds(self, value: object) -> bool:
        """Whether ``value`` is one of these values."""
        if isinstance(value, tuple):
            return all(self.holds(v) for v in value)
        named = self.named()
        if named is not None:
            return isinstance(value, str) and value in named
        if isinstance(value, bool) or not isinstance(value, int if self.integer else numbers.Real):
            return False
        if self.special and value in self.special:
            return True
        v = float(value)  # NaN fails every comparison below
        return (not math.isnan(v) and (math.isfinite(v) or not self.finite)
                and (self.low is None or (v > self.low if self.low_open else v >= self.low))
                and (self.high is None or (v < self.high if self.high_open else v <= self.high)))

    def check(self, name: str, value: Any) -> Any:
        """``value`` unchanged if it is one of these values, else the one-line ValueError naming ``name``."""
        if not self.holds(value):
            shown = self.fmt if isinstance(value, numbers.Real) and not isinstance(value, bool) else "r"
            raise invalid(name, self.text, value, fmt=shown)
        return value


def range_of(field: Any) -> Range | None:
    """The :class:`Range` a dataclass field's metadata holds, or None."""
    return field.metadata.get(RANGE)


# --- numbers or arrays, converted with numpy ----------------------------------------------------------


def _first(arr: np.ndarray, bad: np.ndarray) -> float:
    return float(np.atleast_1d(arr)[np.atleast_1d(bad)][0])


def require_finite(name: str, value: object) -> None:
    arr = np.asarray(value, dtype=float)
    bad = ~np.isfinite(arr)
    if np.any(bad):
        raise invalid(name, "a finite number", _first(arr, bad))


def require_positive(name: str, value: object, *, allow_inf: bool = False) -> None:
    """value > 0 (and not NaN; +inf only if ``allow_inf``)."""
    arr = np.asarray(value, dtype=float)
    bad = np.isnan(arr) | (arr <= 0)
    if not allow_inf:
        bad |= np.isinf(arr)
    if np.any(bad):
        raise invalid(name, "> 0" if allow_inf else "a finite number > 0", _first(arr, bad))


def require_nonnegative(name: str, value: object, *, allow_inf: bool = False, note: str = "") -> None:
    """value >= 0 (and not NaN; +inf only if ``allow_inf``). ``note`` follows the range."""
    arr = np.asarray(value, dtype=float)
    bad = np.isnan(arr) | (arr < 0)
    if not allow_inf:
        bad |= np.isinf(arr)
    if np.any(bad):
        raise invalid(name, (">= 0" if allow_inf else "a finite number >= 0") + note, _first(arr, bad))


def require_in_range(name: str, value: float, low: float, high: float, *, note: str = "", fmt: str = "r") -> None:
    """low <= value <= high, NaN rejected. ``note`` follows the range; ``fmt`` shows the value (``invalid``)."""
    if not (low <= value <= high):  # NaN fails every comparison
        raise invalid(name, f"in [{low:g}, {high:g}]{note}", value, fmt=fmt)


def require_open_interval(name: str, value: object, low: float, high: float, *, finite: bool = False,
                          note: str = "", fmt: str = "r") -> float:
    """low < value < high for an int or a float (not a bool, not NaN); +-inf refused when ``finite``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and low < value < high \
            and (math.isfinite(value) or not finite):
        return float(value)
    raise invalid(name, f"{'a finite number ' if finite else ''}in ({low:g}, {high:g}){note}", value, fmt=fmt)


def require_int(name: str, value: object, minimum: int, *, note: str = "") -> np.ndarray:
    """Integer-valued (ints or whole floats) and >= minimum; returns an int64 array. ``note`` follows the range."""
    valid = f"an integer >= {minimum}{note}"
    arr = np.asarray(value)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number):
        raise invalid(name, valid, value)
    arr_f = arr.astype(float)
    bad = ~(np.isfinite(arr_f) & (arr_f == np.floor(arr_f)) & (arr_f >= minimum))
    if np.any(bad):
        raise invalid(name, valid, arr_f[bad].ravel()[0], fmt="g")
    return arr_f.astype(np.int64)

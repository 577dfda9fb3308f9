"""Argument checks shared by the theory modules.

Every check raises ``ValueError`` with a one-line message that names the
parameter and its valid range; the CLI turns that into exit code 2.
"""

from __future__ import annotations

import numpy as np


def _first(arr: np.ndarray, bad: np.ndarray) -> float:
    return float(np.atleast_1d(arr)[np.atleast_1d(bad)][0])


def require_finite(name: str, value: object) -> None:
    arr = np.asarray(value, dtype=float)
    bad = ~np.isfinite(arr)
    if np.any(bad):
        raise ValueError(f"{name} must be a finite number, got {_first(arr, bad)}")


def require_positive(name: str, value: object, *, allow_inf: bool = False) -> None:
    """value > 0 (and not NaN; +inf only if ``allow_inf``)."""
    arr = np.asarray(value, dtype=float)
    bad = np.isnan(arr) | (arr <= 0)
    if not allow_inf:
        bad |= np.isinf(arr)
    if np.any(bad):
        valid = "> 0" if allow_inf else "a finite number > 0"
        raise ValueError(f"{name} must be {valid}, got {_first(arr, bad)}")


def require_nonnegative(name: str, value: object, *, allow_inf: bool = False) -> None:
    """value >= 0 (and not NaN; +inf only if ``allow_inf``)."""
    arr = np.asarray(value, dtype=float)
    bad = np.isnan(arr) | (arr < 0)
    if not allow_inf:
        bad |= np.isinf(arr)
    if np.any(bad):
        valid = ">= 0" if allow_inf else "a finite number >= 0"
        raise ValueError(f"{name} must be {valid}, got {_first(arr, bad)}")


def require_in_range(name: str, value: float, low: float, high: float) -> None:
    """low <= value <= high, NaN rejected."""
    if not (low <= value <= high):  # NaN fails every comparison
        raise ValueError(f"{name} must be in [{low:g}, {high:g}], got {value!r}")


def require_int(name: str, value: object, minimum: int) -> np.ndarray:
    """Integer-valued (ints or whole floats) and >= minimum; returns an int64 array."""
    arr = np.asarray(value)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    arr_f = arr.astype(float)
    bad = ~(np.isfinite(arr_f) & (arr_f == np.floor(arr_f)) & (arr_f >= minimum))
    if np.any(bad):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {arr_f[bad].ravel()[0]:g}")
    return arr_f.astype(np.int64)

"""Shared matplotlib style for replay-theory figures (figures are saved, never shown).

Importing this module selects the non-interactive ``Agg`` backend only when no
backend has been chosen yet (neither by ``matplotlib.use`` nor by the
``MPLBACKEND`` environment variable), so it never overrides a user's choice.
"""

from __future__ import annotations

import os

import matplotlib

# rcParams._get_backend_or_none() returns None while the backend is still the auto sentinel.
_get = getattr(matplotlib.rcParams, "_get_backend_or_none", None)
if "MPLBACKEND" not in os.environ and (_get is None or _get() is None):
    matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (after the backend choice)
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

__all__ = ["FIGSIZE", "COLORS", "apply_style", "new_axes", "new_axes_row"]

#: Default single-panel size in inches (width, height).
FIGSIZE: tuple[float, float] = (4.0, 3.0)

#: Colour cycle (Okabe-Ito, colour-blind safe).
COLORS: tuple[str, ...] = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")

_STYLE = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 6,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.3,
    "lines.markersize": 4,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
}


def apply_style() -> None:
    """Small fonts, no top/right spines, the Okabe-Ito colour cycle (updates global rcParams)."""
    plt.rcParams.update(_STYLE)
    plt.rcParams["axes.prop_cycle"] = matplotlib.cycler(color=list(COLORS))


def new_axes(ax: Axes | None = None, figsize: tuple[float, float] = FIGSIZE) -> tuple[Figure, Axes]:
    """(fig, ax): ``ax``'s figure if given, else a new styled figure with one axes."""
    if ax is not None:
        return ax.figure, ax
    apply_style()
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    return fig, ax


def new_axes_row(axes=None, n: int = 2, figsize: tuple[float, float] | None = None) -> tuple[Figure, list[Axes]]:
    """(fig, [ax, ...]) with ``n`` panels side by side; reuses ``axes`` (a sequence of n Axes) if given."""
    if axes is not None:
        axes = list(axes)
        if len(axes) != n:
            raise ValueError(f"expected {n} axes, got {len(axes)}")
        return axes[0].figure, axes
    apply_style()
    size = figsize if figsize is not None else (FIGSIZE[0] * n * 0.85, FIGSIZE[1])
    fig, axs = plt.subplots(1, n, figsize=size, layout="constrained")
    return fig, list(axs)

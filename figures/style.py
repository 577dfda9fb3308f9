"""Shared matplotlib style for replay-theory figures (figures are saved, never shown).

Importing this module selects the non-interactive ``Agg`` backend only when no
backend has been chosen yet (neither by ``matplotlib.use`` nor by the
``MPLBACKEND`` environment variable), so it never overrides a user's choice.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

import matplotlib

# rcParams._get_backend_or_none() returns None while the backend is still the auto sentinel.
_get = getattr(matplotlib.rcParams, "_get_backend_or_none", None)
if "MPLBACKEND" not in os.environ and (_get is None or _get() is None):
    matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (after the backend choice)
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.legend import Legend  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.rcsetup import cycler  # noqa: E402  (matplotlib.cycler, which matplotlib's stub leaves out)
from matplotlib.text import Text  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from .defaults import DPI, DPI_RANGE, MIN_FONT_PT  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType  # matplotlib >= 3.8: the names rcParams takes

__all__ = ["FIGSIZE", "COLORS", "DPI", "DPI_RANGE", "MIN_FONT_PT", "FORMATS", "apply_style", "new_axes",
           "new_axes_row", "render", "print_problems"]

#: Default single-panel size in inches (width, height).
FIGSIZE: tuple[float, float] = (4.0, 3.0)

#: Colour cycle (Okabe-Ito, colour-blind safe).
COLORS: tuple[str, ...] = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")

#: Output formats and the metadata each drops (version and date stamps), so the same data gives the same bytes.
FORMATS: dict[str, dict] = {"png": {"Software": None}, "pdf": {"CreationDate": None, "Producer": None},
                            "svg": {"Date": None}}

_STYLE: dict[RcKeyType, Any] = {
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "xtick.labelsize": MIN_FONT_PT,
    "ytick.labelsize": MIN_FONT_PT,
    "legend.fontsize": MIN_FONT_PT,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.3,
    "lines.markersize": 4,
    "savefig.dpi": DPI,
    "savefig.bbox": "tight",
}


def apply_style() -> None:
    """Print-size fonts (>= 8 pt), no top/right spines, the Okabe-Ito colour cycle (updates global rcParams)."""
    plt.rcParams.update(_STYLE)
    plt.rcParams["axes.prop_cycle"] = cycler(color=list(COLORS))


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


def render(fig: Figure, fmt: str = "png", dpi: int = DPI) -> bytes:
    """The figure saved as ``fmt`` (png, pdf or svg) at ``dpi``, cropped to its content, without date stamps.

    Rendering to bytes first lets a caller write every file only after every figure has rendered, so an
    error never leaves a half-written output directory.
    """
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=dpi, bbox_inches="tight", metadata=FORMATS[fmt])
    return buffer.getvalue()


def _outside_mathtext(text: str) -> str:
    """``text`` with every $...$ (mathtext) span removed."""
    parts = text.split("$")
    return "".join(parts[0::2])


def _segment_points(line: Line2D) -> np.ndarray:
    """(n, 2) display-space points along a line, 20 per segment, so a long straight segment is not skipped."""
    xy = line.get_transform().transform(np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float))
    xy = xy[np.all(np.isfinite(xy), axis=1)]
    if len(xy) < 2:
        return xy
    t = np.linspace(0.0, 1.0, 20)[None, :, None]
    return (xy[:-1, None, :] + t * (xy[1:, None, :] - xy[:-1, None, :])).reshape(-1, 2)


def _legends(fig: Figure) -> list[Legend]:
    """The figure's own legends and its axes'."""
    return list(fig.legends) + [legend for legend in (ax.get_legend() for ax in fig.axes) if legend is not None]


def print_problems(fig: Figure) -> list[str]:
    """What keeps ``fig`` from going into a paper or onto a slide as it is; empty when it is print-ready.

    Checks, at the figure's own size: every visible text (ticks, labels, titles, legends,
    annotations) is at least MIN_FONT_PT points; no raw TeX (``^{`` or ``_{``) outside $...$
    mathtext; no legend covers a data line (sampled along each segment), a bar or a text in any
    axes. Draws the figure once (needs a renderer for the legends' extents).
    """
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    problems = []
    for text in fig.findobj(Text):
        content = text.get_text()
        if not (text.get_visible() and content.strip()):
            continue
        size = text.get_fontproperties().get_size_in_points()  # get_fontsize(), typed as a float here
        if size < MIN_FONT_PT:
            problems.append(f"{content!r} is {size:g} pt < {MIN_FONT_PT:g} pt")
        if "^{" in _outside_mathtext(content) or "_{" in _outside_mathtext(content):
            problems.append(f"{content!r} has raw braces outside $...$ (use mathtext)")
    for legend in _legends(fig):
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            # Only what is drawn counts: data outside the axes (a bar under a raised y-axis start) is clipped.
            area = Bbox.intersection(box, ax.bbox)
            if area is None:
                continue
            for line in ax.lines:
                points = _segment_points(line)
                inside = ((points[:, 0] > area.x0) & (points[:, 0] < area.x1)
                          & (points[:, 1] > area.y0) & (points[:, 1] < area.y1))
                if inside.any():
                    problems.append(f"legend covers line {line.get_label()!r} in {ax.get_title()!r}")
            for container in ax.containers:
                for patch in getattr(container, "patches", []):
                    if patch.get_window_extent(renderer).overlaps(area):
                        problems.append(f"legend covers a bar in {ax.get_title()!r}")
                        break
            for text in ax.texts:
                if text.get_visible() and text.get_window_extent(renderer).overlaps(box):
                    problems.append(f"legend covers the text {text.get_text()!r}")
    return problems

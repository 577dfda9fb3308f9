"""Print defaults of every figure, importable without matplotlib (the CLI's ``--help`` shows them).

Chosen so that a figure goes into a paper or onto a slide without edits (issue 11, "Figures
people can print").
"""

from __future__ import annotations

__all__ = ["DPI", "DPI_RANGE", "MIN_FONT_PT"]

#: Default raster resolution: 200 dpi prints sharp on paper and on a projected slide (150 looked soft in print).
DPI: int = 200

#: Resolutions ``replay-theory figures --dpi`` accepts: below 50 text is unreadable, above 1200 a three-panel
#: figure is over 40 million pixels (hundreds of MB in memory) for no visible gain.
DPI_RANGE: tuple[int, int] = (50, 1200)

#: Smallest text in any figure, in points at the figure's saved size: smaller text is unreadable in print.
MIN_FONT_PT: float = 8.0

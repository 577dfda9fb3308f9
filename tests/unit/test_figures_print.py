"""Figures people can print: every theory figure at its default size passes style.print_problems.

Each property is checked numerically: the default dpi, every text's size in points, no raw TeX
outside mathtext, no legend over a line, a bar or a text; and the checker itself catches each
kind of problem on a figure built to have it.

Fast tier; the slower tests of this module (every theory figure rendered) are in
tests/integration/test_figures_print_render.py.
"""

from __future__ import annotations

import io

import matplotlib.pyplot as plt  # noqa: E402  (style import chose the backend)
import numpy as np
import pytest
from PIL import Image

from replay_theory.figures import defaults, style
from replay_theory.figures import theory as ft

pytestmark = pytest.mark.usefixtures("close_figures")  # conftest: plt.close("all") after each test


def test_default_resolution_and_font_floor():
    assert defaults.DPI >= 200 and defaults.DPI_RANGE == (50, 1200) and defaults.MIN_FONT_PT == 8.0
    style.apply_style()
    assert plt.rcParams["savefig.dpi"] == defaults.DPI
    for key in ("xtick.labelsize", "ytick.labelsize", "legend.fontsize", "font.size", "axes.labelsize"):
        assert plt.rcParams[key] >= 8.0


def test_render_writes_png_at_the_default_dpi():
    fig = ft.plot_k_curve()
    image = Image.open(io.BytesIO(style.render(fig)))
    dpi_x, dpi_y = image.info["dpi"]
    assert dpi_x == pytest.approx(200, abs=0.01) and dpi_y == pytest.approx(200, abs=0.01)
    # bbox_inches="tight" crops, but a 4 x 3 inch figure stays within 10% of 800 x 600 pixels
    assert 0.9 * 800 <= image.width <= 1.1 * 800 and 0.9 * 600 <= image.height <= 1.1 * 600


def test_mathtext_replaces_raw_braces():
    fig = ft.plot_ess_vs_divergence()
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[0] == r"exact $e^{-D_2(\mathrm{new}\,\|\,\mathrm{behav})}$"
    assert labels[1].split("$")[0::2] == ["bound ", " (FreshPER Eq. 11)"]  # the TeX is all inside $...$


def test_print_problems_catches_each_kind():
    fig, ax = style.new_axes()
    ax.plot([0, 1], [0, 1], label="diagonal")
    ax.set_title("e^{-KL}", fontsize=6)  # raw braces and too small
    ax.legend(loc="center")  # on top of the diagonal
    problems = style.print_problems(fig)
    assert "'e^{-KL}' is 6 pt < 8 pt" in problems
    assert "'e^{-KL}' has raw braces outside $...$ (use mathtext)" in problems
    assert "legend covers line 'diagonal' in 'e^{-KL}'" in problems
    assert len(problems) == 3
    # a two-point line whose vertices are both outside the legend is still caught (sampled segments)
    fig, ax = style.new_axes()
    ax.plot([0, 1], [0.5, 0.5], label="flat")
    ax.legend(loc="center")
    assert style.print_problems(fig) == ["legend covers line 'flat' in ''"]
    # bars under a legend
    fig, ax = style.new_axes()
    ax.bar(np.arange(3), [1.0, 1.0, 1.0], label="bars")
    ax.legend(loc="center")
    assert style.print_problems(fig) == ["legend covers a bar in ''"]

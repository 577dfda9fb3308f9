"""Figures people can print: every theory figure at its default size passes style.print_problems.

Each property is checked numerically: the default dpi, every text's size in points, no raw TeX
outside mathtext, no legend over a line, a bar or a text; and the checker itself catches each
kind of problem on a figure built to have it.

Integration tier: the slower tests of this module (every theory figure rendered); the fast ones are in
tests/unit/test_figures_print.py.
"""

from __future__ import annotations

import pytest
from matplotlib.text import Text  # noqa: E402

from replay_theory.figures import style
from replay_theory.figures import theory as ft

pytestmark = pytest.mark.usefixtures("close_figures")  # conftest: plt.close("all") after each test


@pytest.mark.parametrize("name", list(ft.THEORY_FIGURES))
def test_every_theory_figure_is_print_ready(name):
    fig = ft.THEORY_FIGURES[name][1]()
    assert style.print_problems(fig) == []
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    assert len(texts) >= 10  # ticks, labels, title, legend: the check above looked at real text
    assert min(t.get_fontsize() for t in texts) >= 8.0


def test_optimal_vs_mu_has_one_legend_outside_the_panels():
    fig = ft.plot_optimal_vs_mu()
    assert [ax.get_legend() for ax in fig.axes] == [None, None, None]
    assert len(fig.legends) == 1
    fig.canvas.draw()
    legend_box = fig.legends[0].get_window_extent()
    for ax in fig.axes:  # below every panel: it can cover no data
        assert legend_box.y1 < ax.get_window_extent().y0
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["α = 0.1", "α = 0.25", "α = 0.4", "ρ = 0.05", "ρ = 0.2", "x* < 1: on-policy"]

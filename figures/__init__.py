"""Figures (matplotlib), each a data function (plain arrays, tested) and a plot function (``ax=None``).

* ``theory.py``: seven figures computed from the theory package alone (ER Figs. 4-5 and Table 2,
  FreshPER, M2PO and ExGRPO quantities).
* ``results.py``: six figures read from saved simulator experiments and validation runs; its
  ``plot_report_bars`` also draws the ``report.png`` of ``replay-theory validate all``.
* ``diagnose.py``: the figure of ``replay-theory diagnose`` (ESS and KL drift against sample age).
* ``style.py``: the shared style, ``render`` (a figure to PNG/PDF/SVG bytes without date stamps)
  and ``print_problems`` (what keeps a figure from print).
* ``defaults.py``: the print defaults (200 dpi, 8 pt minimum text), importable without matplotlib.

``replay-theory figures`` (cli/figures_cmds.py) builds them into ``figures-out/``; the gallery and
how to refresh it are in figures/README.md.
"""

r"""Figure of ``replay-theory diagnose``: ESS fraction and KL drift against sample age.

Rebuilt from a saved report (``replay-theory diagnose LOG --save report.json``,
then ``replay-theory diagnose --from-report report.json --figure out.png``) or
drawn straight after the pass (``--figure out.png``).

Left: the measured Kish ESS fraction per age bucket next to the FreshPER
bound e^{-KL(new || behav)} (FreshPER Eqs. 10-11) evaluated on the same
bucket.  Right: the per-age KL (k3) with the linear and quadratic drift fits
of ``diagnose/drift.py`` (KL = k0 + c a, FreshPER Eq. 12) and the tau = 1/c it
implies (Eq. 13).  Legends sit under the panels, outside the data; all text is
mathtext (``$e^{-\mathrm{KL}}$``) at 8 pt or more.
"""

from __future__ import annotations

import numpy as np
from matplotlib.ticker import MaxNLocator

from .style import COLORS, new_axes_row


def ess_by_age_data(report: dict) -> dict[str, np.ndarray]:
    """Arrays (k,) of bucket mean age, measured ESS fraction, bound, KL k3 and tokens."""
    rows = report.get("by_age") or []
    if not rows:
        raise ValueError("the report has no age column (by_age is empty): log an age / policy-version gap per token")

    def col(key: str) -> np.ndarray:
        return np.array([np.nan if r.get(key) is None else r[key] for r in rows], dtype=np.float64)

    return {"age": col("age"), "ess_frac": col("ess_frac"), "ess_bound": col("ess_bound"),
            "kl_k3": col("kl_k3"), "n_tokens": col("n_tokens")}


#: legend and tick text in points at the figure's printed size (issue 11: >= 8 pt).
TEXT_PT = 8


def _legend_below(ax, ncols: int = 1) -> None:
    """The legend under the axes, outside the data area, so it never hides a point."""
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.2), ncols=ncols, fontsize=TEXT_PT, borderaxespad=0.0,
              frameon=False)


def plot_ess_by_age(report: dict, axes=None):
    """Two panels (ESS fraction with its bound; KL with the drift fits); returns the figure."""
    data = ess_by_age_data(report)
    fig, (left, right) = new_axes_row(axes, 2)
    left.plot(data["age"], data["ess_frac"], "o-", color=COLORS[0], label=r"measured ESS$/n$ (Kish)")
    left.plot(data["age"], data["ess_bound"], "s--", color=COLORS[1],
              label=r"bound $\exp(-\mathrm{KL}(\pi_\mathrm{new}\,\|\,\pi_\mathrm{behav}))$")
    left.set_xlabel(r"sample age $a$ (policy versions)", fontsize=TEXT_PT)
    left.set_ylabel(r"ESS fraction", fontsize=TEXT_PT)
    left.set_ylim(top=1.0 + 0.02 * (1.0 - np.nanmin(data["ess_frac"])) + 1e-3)
    _legend_below(left)
    right.plot(data["age"], data["kl_k3"], "o", color=COLORS[2], label=r"KL ($k_3$ estimate) per age")
    drift = report.get("drift") or {}
    if drift.get("linear"):
        grid = np.linspace(0.0, float(np.nanmax(data["age"])), 50)
        lin, quad = drift["linear"], drift["quadratic"]
        tau = drift.get("tau")
        tau_text = r"\infty" if tau is None else f"{tau:.3g}"
        right.plot(grid, lin["floor"] + lin["slope"] * grid, "-", color=COLORS[0],
                   label=rf"linear $k_0 + c\,a$: $c$ = {lin['slope']:.3g}, $\tau = 1/c$ = ${tau_text}$")
        right.plot(grid, quad["floor"] + quad["coef"] * grid**2, ":", color=COLORS[3],
                   label=rf"quadratic $k_0 + q\,a^2$: $q$ = {quad['coef']:.3g}")
        right.set_title(f"drift looks {drift.get('shape', '?')}", fontsize=TEXT_PT)
    right.set_xlabel(r"sample age $a$ (policy versions)", fontsize=TEXT_PT)
    right.set_ylabel(r"$\mathrm{KL}(\pi_\mathrm{behav}\,\|\,\pi_\mathrm{current})$", fontsize=TEXT_PT)
    _legend_below(right)
    for ax in (left, right):
        ax.tick_params(labelsize=TEXT_PT)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # ages count policy versions
    return fig


#: formats and raster resolution of ``diagnose --figure``: print quality (issue 11 asks for >= 200 dpi).
FIGURE_FORMATS = ("png", "pdf", "svg")
FIGURE_DPI = 200


def save_figure(report: dict, path) -> None:
    """Draw the ESS-by-age figure of ``report`` into the new file ``path`` (format from the suffix; never
    overwrites: ``outputs.write_new``)."""
    import matplotlib.pyplot as plt

    from ..outputs import write_new

    figure = plot_ess_by_age(report)
    try:
        fmt = path.suffix.lower().lstrip(".")
        write_new(path, lambda tmp: figure.savefig(tmp, format=fmt, dpi=FIGURE_DPI), "--figure")
    finally:
        plt.close(figure)


def figure_from_report(saved, path) -> None:
    """``diagnose --from-report SAVED --figure PATH``: the figure of a report saved with ``--save``, without the log."""
    from ..diagnose import ConfigError, load_report

    report = load_report(saved)
    if not report["by_age"]:
        raise ConfigError("report", f"{saved} has no by-age table (its log had no age column): there is no figure to "
                                    "draw")
    save_figure(report, path)

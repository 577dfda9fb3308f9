"""Figure of ``replay-theory diagnose``: ESS fraction and KL drift against sample age.

Rebuilt from a saved report (``replay-theory diagnose LOG --save report.json``,
then ``replay-theory diagnose --from-report report.json --figure out.png``) or
drawn straight after the pass (``--figure out.png``).

Left: the measured Kish ESS fraction per age bucket next to the FreshPER
bound e^{-KL(new || behav)} (Eqs. 10-11, shared/papers/freshper-prioritized-replay.txt)
evaluated on the same bucket.  Right: the per-age KL (k3) with the linear and
quadratic drift fits of ``diagnose/drift.py`` and the tau = 1/c it implies.
"""

from __future__ import annotations

import numpy as np

from replay_theory.figures.style import COLORS, new_axes_row


def ess_by_age_data(report: dict) -> dict[str, np.ndarray]:
    """Arrays (k,) of bucket mean age, measured ESS fraction, bound, KL k3 and tokens."""
    rows = report.get("by_age") or []
    if not rows:
        raise ValueError("the report has no age column (by_age is empty): log an age / policy-version gap per token")

    def col(key: str) -> np.ndarray:
        return np.array([np.nan if r.get(key) is None else r[key] for r in rows], dtype=np.float64)

    return {"age": col("age"), "ess_frac": col("ess_frac"), "ess_bound": col("ess_bound"),
            "kl_k3": col("kl_k3"), "n_tokens": col("n_tokens")}


def plot_ess_by_age(report: dict, axes=None):
    """Two panels (ESS fraction with its bound; KL with the drift fits); returns the figure."""
    data = ess_by_age_data(report)
    fig, (left, right) = new_axes_row(axes, 2)
    left.plot(data["age"], data["ess_frac"], "o-", color=COLORS[0], label="measured ESS / n (Kish)")
    left.plot(data["age"], data["ess_bound"], "s--", color=COLORS[1], label="bound e^{-KL(new||behav)}")
    left.set_xlabel("sample age (policy versions)")
    left.set_ylabel("ESS fraction")
    left.set_ylim(top=1.0 + 0.02 * (1.0 - np.nanmin(data["ess_frac"])) + 1e-3)
    left.legend(loc="lower left")
    right.plot(data["age"], data["kl_k3"], "o", color=COLORS[2], label="KL k3 per age")
    drift = report.get("drift") or {}
    if drift.get("linear"):
        grid = np.linspace(0.0, float(np.nanmax(data["age"])), 50)
        lin, quad = drift["linear"], drift["quadratic"]
        tau = drift.get("tau")
        tau_text = "inf" if tau is None else f"{tau:.3g}"
        right.plot(grid, lin["floor"] + lin["slope"] * grid, "-", color=COLORS[0],
                   label=f"linear c = {lin['slope']:.3g} (tau = {tau_text})")
        right.plot(grid, quad["floor"] + quad["coef"] * grid**2, ":", color=COLORS[3], label="quadratic")
        right.set_title(f"drift looks {drift.get('shape', '?')}")
    right.set_xlabel("sample age (policy versions)")
    right.set_ylabel("KL(behav || current)")
    right.legend(loc="upper left")
    return fig

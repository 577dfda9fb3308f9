"""Theory figures: each figure is a DATA function (pure numpy, testable) and a PLOT function.

Papers (short names; titles, authors and arXiv ids in docs/REFERENCES.md)
------
* ER = "Efficient RL training for LLMs with experience replay": Figs. 4-5, Table 2, Eqs. (2), (5).
* FreshPER (prioritized replay with age decay): Eqs. (5), (9), (11), (13)-(14).
* M2PO (stale data with a second-moment trust region): Eq. (4), Thm 5.1.
* ExGRPO (experience-managed GRPO): Alg. 1 line 6 (bucket weights).

Conventions
-----------
* Plot functions take ``ax=None`` (``axes=None`` for multi-panel figures), draw on
  the given axes or on a new styled figure, and return the ``Figure``. At their own
  size they are print-ready (``style.print_problems`` finds nothing; the tests check it).
* Everything is deterministic. The only sample estimate (Kish ESS) uses
  ``np.random.default_rng(0)``.
* ``mu`` without a suffix is in the *rollout-cost* convention (rollout cost /
  per-sample update cost, ER Table 1); ``mu_sec3`` is the literal Sec. 3 reading
  (see ``theory/design.py`` and docs/ERRATA.md E3).

| code name            | paper symbol          | meaning                                           |
|----------------------|-----------------------|---------------------------------------------------|
| ``x_star, y_star``   | x*, y* (ER Thm 3.5)   | optimal horizon N/R and replay ratio B/R          |
| ``k_norm``           | K(x)/K(1) (ER Eq. 5)  | power-law objective normalised at x = 1           |
| ``gamma``            | gamma (ER Eq. 2)      | compute per update with a buffer / without        |
| ``ess_exact``        | e^{-D_2} (FreshPER 9) | exact ESS / n                                     |
| ``ess_bound``        | e^{-KL} (FreshPER 11) | bound with KL(pi_new || pi_behav)                 |
| ``chi2, m2``         | chi^2, M_2 (M2PO)     | chi^2(new || behav), E_behav[(log r)^2]           |
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..theory.compute import compute_ratio
from ..theory.design import mu_sec3_of, power_law_k, power_law_optimum
from ..theory.divergences import chi2_exact, d2_exact, ess_kish_fraction, kl_exact, m2_exact
from ..theory.exgrpo import bucket_probabilities
from ..theory.freshper import age_decay_weight, effective_time_constant
from .style import COLORS, new_axes, new_axes_row

__all__ = [
    "THEORY_FIGURES",
    "optimal_vs_mu_data", "plot_optimal_vs_mu",
    "k_curve_data", "plot_k_curve",
    "gamma_table_data", "plot_gamma_table",
    "policy_family", "ess_vs_divergence_data", "plot_ess_vs_divergence",
    "chi2_vs_m2_data", "plot_chi2_vs_m2",
    "freshper_weights_data", "plot_freshper_weights",
    "exgrpo_buckets_data", "plot_exgrpo_buckets",
]

_LINESTYLES = ("-", "--", ":", "-.")

# --------------------------------------------------------------------------- 1. x*, y* versus mu (ER Fig. 4)

OPT_MUS = np.geomspace(0.5, 20.0, 60)
OPT_ALPHAS = (0.1, 0.25, 0.4)
OPT_RHOS = (0.05, 0.2)


def optimal_vs_mu_data(mus: Sequence[float] = OPT_MUS, alphas: Sequence[float] = OPT_ALPHAS,
                       rhos: Sequence[float] = OPT_RHOS, convention: str = "rollout-cost") -> dict:
    """Unconstrained power-law optimum (x*, y*) on a grid of mu given in ``convention``.

    Returns ``mus`` (M,), ``mu_sec3`` (M,), ``alphas`` (A,), ``rhos`` (P,),
    ``x_star`` and ``y_star`` (A, P, M), ``feasible`` (A, P, M) = x* >= 1
    (x* < 1 means N < R: the feasible optimum is the on-policy corner), and
    ``convention``. Values are NOT clipped: the plot shows them raw and shades x < 1.
    """
    mu_grid = np.asarray(mus, dtype=float)  # (M,)
    mu_sec3 = np.atleast_1d(np.asarray(mu_sec3_of(mu_grid, convention), dtype=float))  # (M,)
    x_star = np.empty((len(alphas), len(rhos), mu_grid.size))  # (A, P, M)
    y_star = np.empty_like(x_star)
    for i, alpha in enumerate(alphas):
        for j, rho in enumerate(rhos):
            for k, m in enumerate(mu_sec3):
                x_star[i, j, k], y_star[i, j, k] = power_law_optimum(float(m), float(alpha), float(rho))  # App. C.3.2
    return {"mus": mu_grid, "mu_sec3": mu_sec3, "alphas": np.asarray(alphas, float), "rhos": np.asarray(rhos, float),
            "x_star": x_star, "y_star": y_star, "feasible": x_star >= 1.0, "convention": convention}


def _draw_family(ax: Axes, data: dict, key: str) -> None:
    """One line per (alpha, rho): colour = alpha, line style = rho."""
    for i, alpha in enumerate(data["alphas"]):
        for j, rho in enumerate(data["rhos"]):
            ax.plot(data["mus"], data[key][i, j], color=COLORS[i], linestyle=_LINESTYLES[j],
                    label=f"α={alpha:g}, ρ={rho:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("μ (rollout cost / update cost)" if data["convention"] == "rollout-cost"
                  else "μ (Sec. 3: update cost / rollout cost)")


def _family_legend_handles(data: dict) -> list[Artist]:
    """Legend keys for colour = alpha and line style = rho (5 entries instead of 6 combinations)."""
    handles: list[Artist] = [Line2D([], [], color=COLORS[i], label=f"α = {a:g}") for i, a in enumerate(data["alphas"])]
    handles += [Line2D([], [], color="0.3", linestyle=_LINESTYLES[j], label=f"ρ = {r:g}")
                for j, r in enumerate(data["rhos"])]
    return handles


def plot_optimal_vs_mu(axes: Sequence[Axes] | None = None) -> Figure:
    """Three panels: x* and y* vs mu (rollout-cost convention, ER Fig. 4), and x* under the literal Sec. 3 reading.

    Infeasible points (x* < 1, i.e. N < R: stay on-policy) are drawn at their raw
    value over a grey band marking x < 1; they are not clipped or masked. The panels
    share their series, so one legend below them names colour (alpha), line style (rho)
    and the band; inside a panel it would cover the curves.
    """
    fig, (ax_x, ax_y, ax_lit) = new_axes_row(axes, n=3, figsize=(10.2, 3.4))
    rollout = optimal_vs_mu_data(convention="rollout-cost")
    literal = optimal_vs_mu_data(convention="paper-sec3")
    _draw_family(ax_x, rollout, "x_star")
    ax_x.set_ylabel("x* = N/R (staleness horizon, steps)")
    ax_x.set_title("x*, rollout-cost μ (Fig. 4)")
    _draw_family(ax_y, rollout, "y_star")
    ax_y.set_ylabel("y* = B/R (replay ratio)")
    ax_y.set_title("y*, rollout-cost μ (Fig. 4)")
    _draw_family(ax_lit, literal, "x_star")
    ax_lit.set_ylabel("x* = N/R (staleness horizon, steps)")
    ax_lit.set_title("x*, literal Sec. 3 μ (trend inverts)")
    for ax in (ax_x, ax_lit):
        lo = min(ax.get_ylim()[0], 1.0)
        ax.axhspan(lo, 1.0, color="0.9", zorder=0)
    handles = _family_legend_handles(rollout) + [Patch(color="0.9", label="x* < 1: on-policy")]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles))
    return fig


# --------------------------------------------------------------------------- 2. K(x) curves (ER Fig. 5)

K_ALPHAS = (0.0, 0.1, 0.25, 0.4, 0.5)
K_MU_SEC3 = 1.0 / 5.28  # Table 1's mu = 5.28 (rollout-cost) in the Sec. 3 parametrisation
K_RHO = 0.1
K_XS = np.geomspace(0.05, 200.0, 2001)


def k_curve_data(alphas: Sequence[float] = K_ALPHAS, mu: float = K_MU_SEC3, rho: float = K_RHO,
                 xs: Sequence[float] = K_XS) -> dict:
    """K(x)/K(1) for each alpha (``mu`` is mu_sec3) and the closed-form x* (ER Eq. 5, App. C.3.2).

    Returns ``xs`` (X,), ``alphas`` (A,), ``k`` and ``k_norm`` (A, X), ``x_star`` (A,)
    (0 for alpha >= 1/2, inf for alpha = 0: then no marker is drawn), ``k_star_norm`` (A,)
    = K(x*)/K(1) (nan where x* is not finite and positive), ``mu_sec3``, ``rho``.
    """
    xs = np.asarray(xs, dtype=float)  # (X,)
    k = np.stack([power_law_k(xs, mu, a, rho) for a in alphas])  # (A, X), Eq. (5)
    k_at_1 = np.array([float(power_law_k(1.0, mu, a, rho)) for a in alphas])  # (A,)
    x_star = np.array([power_law_optimum(mu, a, rho)[0] for a in alphas])  # (A,)
    marked = np.isfinite(x_star) & (x_star > 0)
    k_star = np.full(len(alphas), np.nan)
    k_star[marked] = [float(power_law_k(x, mu, a, rho)) / k1
                      for x, a, k1 in zip(x_star[marked], np.asarray(alphas)[marked], k_at_1[marked])]
    return {"xs": xs, "alphas": np.asarray(alphas, float), "k": k, "k_norm": k / k_at_1[:, None],
            "x_star": x_star, "marked": marked, "k_star_norm": k_star, "mu_sec3": mu, "rho": rho}


def plot_k_curve(ax: Axes | None = None) -> Figure:
    """K(x)/K(1) vs x for alpha in {0, .1, .25, .4, .5}, x* marked (ER Fig. 5).

    One line per alpha plus one marker per finite x*.
    """
    fig, ax = new_axes(ax)
    d = k_curve_data()
    for i, alpha in enumerate(d["alphas"]):
        ax.plot(d["xs"], d["k_norm"][i], color=COLORS[i], label=f"α={alpha:g}")
        if d["marked"][i]:
            ax.plot([d["x_star"][i]], [d["k_star_norm"][i]], "o", color=COLORS[i], markeredgecolor="k")
    ax.axvline(1.0, color="0.6", linewidth=0.8, linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("x = N/R (staleness horizon, steps)")
    ax.set_ylabel("K(x) / K(1)")
    ax.set_title(rf"K(x), $\mu_{{\mathrm{{sec3}}}}$ = 1/5.28, ρ = {d['rho']:g}; ● = x*")
    ax.legend(loc="upper left")
    return fig


# --------------------------------------------------------------------------- 3. Table 2 gamma (ER Eq. 2)

TABLE2_SPLITS = ((7, 1), (6, 2), (5, 3), (4, 4), (2, 6), (1, 7))
TABLE2_PRINTED = (1.02, 0.41, 0.34, 0.26, 0.17, 0.15)  # as printed; (6, 2) is erratum E1
TABLE2_MU = 6.84


def gamma_table_data(splits: Sequence[tuple[int, int]] = TABLE2_SPLITS, mu: float = TABLE2_MU,
                     printed: Sequence[float] = TABLE2_PRINTED) -> dict:
    """gamma = (1 + W/T)/(1 + mu) (Eq. 2) per (W, T) split, with Table 2's printed values.

    Returns ``splits`` (S, 2), ``labels`` (S,), ``gamma`` (S,), ``printed`` (S,), ``mu``,
    ``erratum_index`` (index of (6, 2), whose printed 0.41 should be 0.510; ERRATA E1).
    """
    splits_arr = np.asarray(splits, dtype=int)  # (S, 2)
    gamma = np.asarray(compute_ratio(splits_arr[:, 0], splits_arr[:, 1], mu), dtype=float)  # Eq. (2)
    erratum = [i for i, s in enumerate(splits) if tuple(s) == (6, 2)]
    return {"splits": splits_arr, "labels": [f"({w},{t})" for w, t in splits], "gamma": gamma,
            "printed": np.asarray(printed, dtype=float), "mu": mu,
            "erratum_index": erratum[0] if erratum else None}


def plot_gamma_table(ax: Axes | None = None) -> Figure:
    """Bars of Eq. 2's gamma per (W, T) at mu = 6.84, Table 2's printed values as markers, E1 annotated."""
    fig, ax = new_axes(ax)
    d = gamma_table_data()
    pos = np.arange(len(d["labels"]))
    ax.bar(pos, d["gamma"], color=COLORS[0], alpha=0.8, label="Eq. 2: (1 + W/T)/(1 + μ)")
    ax.plot(pos, d["printed"], "x", color=COLORS[1], markersize=6, label="Table 2 (printed)")
    ax.axhline(1.0, color="0.5", linewidth=0.8, linestyle="--", label="γ = 1 (no buffer)")
    i = d["erratum_index"]
    if i is not None:
        ax.annotate(f"E1: printed {d['printed'][i]:.2f},\nEq. 2 gives {d['gamma'][i]:.3f}",
                    xy=(pos[i], d["printed"][i]), xytext=(pos[i] + 0.7, 0.72),
                    arrowprops={"arrowstyle": "->", "linewidth": 0.7})
    ax.set_xticks(pos, d["labels"])
    ax.set_xlabel("split (W inference GPUs, T trainer GPUs)")
    ax.set_ylabel("γ (compute per update, buffer / none)")
    ax.set_title(f"Table 2, μ = {d['mu']:g} (rollout-cost)")
    ax.set_ylim(0, 1.6)  # headroom above gamma = 1 so the legend covers no bar
    ax.legend(loc="upper right")
    return fig


# --------------------------------------------------------------------------- 4-5. categorical policy family

FAMILY_K = 10
FAMILY_TS = np.linspace(0.0, 2.0, 41)
KISH_N = 1000


def policy_family(ts: Sequence[float] = FAMILY_TS, K: int = FAMILY_K, seed: int = 0) -> dict:
    """behav = softmax(z), new_t = softmax(z + t v), z and v ~ N(0, I_K) from default_rng(seed).

    Returns ``ts`` (T,), ``z`` (K,), ``v`` (K,), ``logp_behav`` (K,), ``logp_new`` (T, K).
    """
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(K)  # (K,)
    v = rng.standard_normal(K)  # (K,)
    t_grid = np.asarray(ts, dtype=float)  # (T,)
    logits = z[None, :] + t_grid[:, None] * v[None, :]  # (T, K)
    logp_new = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)  # (T, K) log softmax
    logp_behav = z - np.logaddexp.reduce(z)  # (K,)
    return {"ts": t_grid, "z": z, "v": v, "logp_behav": logp_behav, "logp_new": logp_new}


def ess_vs_divergence_data(ts: Sequence[float] = FAMILY_TS, K: int = FAMILY_K, n: int = KISH_N,
                           seed: int = 0) -> dict:
    """Exact ESS/n = e^{-D_2(new||behav)}, the bound e^{-KL(new||behav)}, and Kish estimates.

    FreshPER Eqs. (9), (11). The Kish estimate (sum w)^2/(n sum w^2) uses n draws from
    pi_behav taken once with ``default_rng(seed)`` (after z and v are drawn) and reused
    for every t (common random numbers, so the estimated curve is smooth in t).
    Returns the family's arrays plus ``d2``, ``kl``, ``ess_exact``, ``ess_bound``, ``ess_kish`` (T,).
    """
    fam = policy_family(ts, K, seed)
    lb, ln = fam["logp_behav"], fam["logp_new"]  # (K,), (T, K)
    d2 = np.asarray(d2_exact(ln, np.broadcast_to(lb, ln.shape)))  # (T,), FreshPER Eq. (23)
    kl = np.asarray(kl_exact(ln, np.broadcast_to(lb, ln.shape)))  # (T,) KL(new || behav), Eq. (25)
    rng = np.random.default_rng(seed)
    rng.standard_normal(2 * K)  # skip the draws that made z and v
    idx = rng.choice(K, size=n, p=np.exp(lb) / np.exp(lb).sum())  # (n,) samples from pi_behav
    log_ratio = ln[:, idx] - lb[idx][None, :]  # (T, n)
    kish = np.asarray(ess_kish_fraction(log_ratio))  # (T,)
    return {**fam, "n": n, "d2": d2, "kl": kl, "ess_exact": np.exp(-d2), "ess_bound": np.exp(-kl),
            "ess_kish": kish}


def plot_ess_vs_divergence(ax: Axes | None = None) -> Figure:
    """ESS/n versus the perturbation scale t: exact e^{-D_2}, the bound e^{-KL(new||behav)}, Kish (n = 1000)."""
    fig, ax = new_axes(ax)
    d = ess_vs_divergence_data()
    ax.plot(d["ts"], d["ess_exact"], color=COLORS[0], label=r"exact $e^{-D_2(\mathrm{new}\,\|\,\mathrm{behav})}$")
    ax.plot(d["ts"], d["ess_bound"], color=COLORS[1], linestyle="--",
            label=r"bound $e^{-\mathrm{KL}(\mathrm{new}\,\|\,\mathrm{behav})}$ (FreshPER Eq. 11)")
    ax.plot(d["ts"], d["ess_kish"], "o", color=COLORS[2], markersize=2.5,
            label=f"Kish estimate, n = {d['n']} draws (rng 0)")
    ax.set_xlabel("t (new = softmax(z + t v), K = 10)")
    ax.set_ylabel("ESS / n")
    ax.set_ylim(0, 1.05)
    ax.set_title("ESS fraction vs policy shift")
    ax.legend(loc="lower left")
    return fig


def chi2_vs_m2_data(ts: Sequence[float] = FAMILY_TS[1:], K: int = FAMILY_K, seed: int = 0) -> dict:
    """chi^2(new||behav), M_2 and the two upper bounds for the policy family (t = 0 dropped: M_2 = 0).

    M2PO Thm 5.1: chi^2 <= R^2 M_2 with R = max(sup r, 1/inf r); sharpened: chi^2 <= max(1, sup r)^2 M_2
    (from |r - 1| <= max(1, r) |log r|). Returns family arrays plus ``chi2``, ``m2``, ``R``,
    ``sup_r``, ``bound_thm51``, ``bound_sharp`` (T,).
    """
    fam = policy_family(ts, K, seed)
    lb, ln = fam["logp_behav"], fam["logp_new"]
    lb_t = np.broadcast_to(lb, ln.shape)
    chi2 = np.asarray(chi2_exact(ln, lb_t))  # (T,), FreshPER Eq. (24)
    m2 = np.asarray(m2_exact(ln, lb_t))  # (T,), M2PO Eq. (4)
    log_r = ln - lb_t  # (T, K)
    sup_r = np.exp(log_r.max(axis=-1))  # (T,)
    R = np.exp(np.maximum(log_r.max(axis=-1), -log_r.min(axis=-1)))  # (T,) max(sup r, 1/inf r)
    return {**fam, "chi2": chi2, "m2": m2, "R": R, "sup_r": sup_r,
            "bound_thm51": R**2 * m2,  # Thm 5.1, M2PO
            "bound_sharp": np.maximum(1.0, sup_r) ** 2 * m2}  # sharpened Thm 5.1


def plot_chi2_vs_m2(ax: Axes | None = None) -> Figure:
    """chi^2 vs M_2 (log-log) with the Thm 5.1 bound R^2 M_2 and the sharper max(1, sup r)^2 M_2."""
    fig, ax = new_axes(ax)
    d = chi2_vs_m2_data()
    ax.plot(d["m2"], d["chi2"], color=COLORS[0], label="exact χ²(new‖behav)")
    ax.plot(d["m2"], d["bound_sharp"], color=COLORS[2], linestyle="--", label="max(1, sup r)² M₂ (sharp)")
    ax.plot(d["m2"], d["bound_thm51"], color=COLORS[1], linestyle=":", label="R² M₂ (M2PO Thm 5.1)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("M₂ = E_behav[(log r)²]")
    ax.set_ylabel("χ² and its bounds")
    ax.set_title("χ² vs M₂, softmax(z + t v), K = 10")
    ax.legend(loc="upper left")
    return fig


# --------------------------------------------------------------------------- 6. FreshPER and ExGRPO weights

FRESH_AGES = np.arange(0, 1501, dtype=float)
FRESH_TAUS = (250.0, 500.0, 1000.0)
FRESH_ALPHA = 0.6


def freshper_weights_data(ages: Sequence[float] = FRESH_AGES, taus: Sequence[float] = FRESH_TAUS,
                          alpha: float = FRESH_ALPHA) -> dict:
    """Age decay exp(-age/tau) (FreshPER Eq. 13) and the sampling-level exp(-age alpha/tau) = exp(-age/(tau/alpha)).

    Returns ``ages`` (G,), ``taus`` (S,), ``alpha``, ``weight`` (S, G), ``tau_eff`` (S,) = tau/alpha,
    ``weight_eff`` (S, G) = exp(-age/tau_eff) (the age factor of (p e^{-age/tau})^alpha).
    """
    ages = np.asarray(ages, dtype=float)
    taus_arr = np.asarray(taus, dtype=float)
    weight = np.stack([np.asarray(age_decay_weight(ages, t)) for t in taus_arr])  # (S, G), Eq. (13)
    tau_eff = np.asarray(effective_time_constant(taus_arr, alpha), dtype=float)  # (S,)
    weight_eff = np.stack([np.asarray(age_decay_weight(ages, t)) for t in tau_eff])  # (S, G)
    return {"ages": ages, "taus": taus_arr, "alpha": alpha, "weight": weight, "tau_eff": tau_eff,
            "weight_eff": weight_eff}


def plot_freshper_weights(ax: Axes | None = None) -> Figure:
    """exp(-age/tau) (solid) and the effective sampling decay with time constant tau/alpha (dashed).

    Colour is tau and line style the decay, so the legend has five keys; it sits right of the axes,
    since the curves fill the panel from corner to corner.
    """
    fig, ax = new_axes(ax, figsize=(5.2, 3.0))
    d = freshper_weights_data()
    for i in range(len(d["taus"])):
        ax.plot(d["ages"], d["weight"][i], color=COLORS[i])
        ax.plot(d["ages"], d["weight_eff"][i], color=COLORS[i], linestyle="--")
    handles = [Line2D([], [], color=COLORS[i], label=f"τ = {tau:g}") for i, tau in enumerate(d["taus"])]
    handles += [Line2D([], [], color="0.3", label=r"$e^{-\mathrm{age}/\tau}$ (Eq. 13)"),
                Line2D([], [], color="0.3", linestyle="--",
                       label=r"$(p\,e^{-\mathrm{age}/\tau})^{\alpha}$" + "\n" + r"(time constant $\tau/\alpha$)")]
    ax.set_xlabel("age Δ (policy updates since generation)")
    ax.set_ylabel("age weight")
    ax.set_title(f"FreshPER age decay (α = {d['alpha']:g})")
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return fig


EXGRPO_K = 8
EXGRPO_CONVENTIONS = (("success-count", 4.0, 1.0), ("accuracy", 0.5, 1.0))


def exgrpo_buckets_data(K: int = EXGRPO_K, conventions=EXGRPO_CONVENTIONS) -> dict:
    """Bucket probabilities over k = 1..K-1 for each (units, mu, sigma) (ExGRPO Alg. 1 line 6).

    Returns ``k`` (K-1,), ``conventions`` (list of (units, mu, sigma)), ``probs`` (C, K-1).
    """
    probs = np.stack([bucket_probabilities(K, mu=m, sigma=s, units=u) for u, m, s in conventions])  # (C, K-1)
    return {"k": np.arange(1, K), "conventions": list(conventions), "probs": probs}


def plot_exgrpo_buckets(ax: Axes | None = None) -> Figure:
    """Grouped bars: bucket probability per success count k in both unit conventions."""
    fig, ax = new_axes(ax)
    d = exgrpo_buckets_data()
    n_conv = len(d["conventions"])
    width = 0.8 / n_conv
    for i, (units, mu, sigma) in enumerate(d["conventions"]):
        ax.bar(d["k"] + (i - (n_conv - 1) / 2) * width, d["probs"][i], width=width, color=COLORS[i],
               label=f"{units}: N(·; μ={mu:g}, σ={sigma:g})")
    ax.set_xticks(d["k"])
    ax.set_xlabel("bucket k (latest successes out of K = 8)")
    ax.set_ylabel("bucket probability $p_k$")
    ax.set_title("ExGRPO bucket weights, two unit readings")
    ax.set_ylim(0, 1.3 * d["probs"].max() + 0.04)  # headroom: the legend sits above the tallest bar
    ax.legend(loc="upper left")
    return fig


# --------------------------------------------------------------------------- registry

THEORY_FIGURES: dict[str, tuple[str, Callable[[], Figure]]] = {
    "optimal-vs-mu": ("x*, y* vs mu for the power law (ER Fig. 4) and the inverted Sec. 3 reading", plot_optimal_vs_mu),
    "k-curve": ("K(x)/K(1) for alpha in {0, .1, .25, .4, .5} with x* marked (ER Fig. 5)", plot_k_curve),
    "gamma-table": ("gamma = (1 + W/T)/(1 + mu) for Table 2's splits, printed values and erratum E1",
                    plot_gamma_table),
    "ess-vs-divergence": ("exact ESS/n = e^-D2, bound e^-KL, and Kish estimates for a softmax family",
                          plot_ess_vs_divergence),
    "chi2-vs-m2": ("chi^2 vs M2 with M2PO Thm 5.1's R^2 M2 and the sharper max(1, sup r)^2 M2", plot_chi2_vs_m2),
    "freshper-weights": ("FreshPER exp(-age/tau) and the effective tau/alpha decay (alpha = 0.6)",
                         plot_freshper_weights),
    "exgrpo-buckets": ("ExGRPO bucket probabilities, success-count vs accuracy units", plot_exgrpo_buckets),
}

"""Theory figures: the data behind each figure, and that each renders small (figures/theory.py)."""

from __future__ import annotations

import inspect

import matplotlib.pyplot as plt  # noqa: E402  (style import chose the backend)
import numpy as np
import pytest

from replay_theory.figures import theory as ft
from replay_theory.figures.style import new_axes
from replay_theory.theory.compute import compute_ratio
from replay_theory.theory.design import mu_sec3_of, power_law_k, power_law_optimum
from replay_theory.theory.exgrpo import bucket_probabilities

pytestmark = pytest.mark.usefixtures("close_figures")  # conftest: plt.close("all") after each test


# --------------------------------------------------------------------------- 1. x*, y* vs mu


@pytest.mark.parametrize("convention", ["rollout-cost", "paper-sec3"])
def test_optimal_vs_mu_equals_closed_form(convention):
    d = ft.optimal_vs_mu_data(convention=convention)
    assert d["mus"].min() == pytest.approx(0.5) and d["mus"].max() == pytest.approx(20.0)
    assert d["x_star"].shape == (3, 2, d["mus"].size)
    for i, alpha in enumerate(ft.OPT_ALPHAS):
        for j, rho in enumerate(ft.OPT_RHOS):
            for k, mu in enumerate(d["mus"]):
                x, y = power_law_optimum(mu_sec3_of(mu, convention), alpha, rho)
                np.testing.assert_allclose(d["x_star"][i, j, k], x, rtol=1e-12)
                np.testing.assert_allclose(d["y_star"][i, j, k], y, rtol=1e-12)
    np.testing.assert_array_equal(d["feasible"], d["x_star"] >= 1.0)


def test_optimal_vs_mu_trend_inverts_between_conventions():
    rollout = ft.optimal_vs_mu_data(convention="rollout-cost")
    literal = ft.optimal_vs_mu_data(convention="paper-sec3")
    assert np.all(np.diff(rollout["x_star"], axis=-1) > 0)  # Fig. 4 caption holds
    assert np.all(np.diff(rollout["y_star"], axis=-1) > 0)
    assert np.all(np.diff(literal["x_star"], axis=-1) < 0)  # literal Sec. 3: shrinks with mu


def test_optimal_vs_mu_plot_draws_the_data():
    fig = ft.plot_optimal_vs_mu()
    ax_x, ax_y, ax_lit = fig.axes
    rollout = ft.optimal_vs_mu_data(convention="rollout-cost")
    np.testing.assert_allclose(ax_x.lines[0].get_ydata(), rollout["x_star"][0, 0], rtol=1e-12)
    np.testing.assert_allclose(ax_y.lines[-1].get_ydata(), rollout["y_star"][-1, -1], rtol=1e-12)


# --------------------------------------------------------------------------- 2. K(x)


def test_k_curve_marked_optimum_is_argmin_and_closed_form():
    d = ft.k_curve_data()
    np.testing.assert_allclose(d["k_norm"][:, np.searchsorted(d["xs"], 1.0)], 1.0, rtol=2e-3)  # grid near x = 1
    step = np.log(d["xs"][1] / d["xs"][0])  # log-grid resolution
    for i, alpha in enumerate(d["alphas"]):
        x_cf = power_law_optimum(ft.K_MU_SEC3, alpha, ft.K_RHO)[0]
        assert d["x_star"][i] == x_cf
        np.testing.assert_allclose(d["k"][i], power_law_k(d["xs"], ft.K_MU_SEC3, alpha, ft.K_RHO), rtol=1e-12)
        x_grid = d["xs"][np.argmin(d["k_norm"][i])]
        if 0 < alpha < 0.5:
            assert d["marked"][i]
            assert abs(np.log(x_grid / d["x_star"][i])) <= step
            assert d["k_star_norm"][i] <= d["k_norm"][i].min() + 1e-12
        else:  # alpha = 0: x* = inf (curve decreasing); alpha = 0.5: x* = 0 (increasing)
            assert not d["marked"][i]
            assert x_grid == (d["xs"][-1] if alpha == 0 else d["xs"][0])


# --------------------------------------------------------------------------- 3. gamma table


def test_gamma_bars_equal_compute_ratio_and_erratum_e1():
    d = ft.gamma_table_data()
    for (w, t), g in zip(ft.TABLE2_SPLITS, d["gamma"]):
        assert g == compute_ratio(w, t, 6.84)
    i = d["erratum_index"]
    assert tuple(d["splits"][i]) == (6, 2)
    assert d["printed"][i] == 0.41
    assert d["gamma"][i] == pytest.approx(0.510, abs=5e-4)
    assert abs(d["printed"][i] - d["gamma"][i]) > 0.09
    others = np.delete(np.arange(len(d["gamma"])), i)
    np.testing.assert_allclose(d["gamma"][others], d["printed"][others], atol=0.005 + 1e-12)


# --------------------------------------------------------------------------- 4-5. divergences


def test_ess_under_bound_and_kish_close_to_exact():
    d = ft.ess_vs_divergence_data()
    assert d["ess_exact"][0] == 1.0 and d["ess_kish"][0] == pytest.approx(1.0)
    assert np.all(d["ess_exact"] <= d["ess_bound"] + 1e-15)  # e^{-D2} <= e^{-KL}
    assert np.all(d["d2"] >= d["kl"])
    small = d["d2"] < 1.0
    assert small.sum() >= 10
    assert np.all(np.abs(d["ess_kish"][small] - d["ess_exact"][small]) < 0.05)
    again = ft.ess_vs_divergence_data()  # deterministic
    np.testing.assert_array_equal(again["ess_kish"], d["ess_kish"])


def test_chi2_below_sharp_below_thm51():
    d = ft.chi2_vs_m2_data()
    assert np.all(d["m2"] > 0)
    assert np.all(d["chi2"] <= d["bound_sharp"] * (1 + 1e-12))
    assert np.all(d["bound_sharp"] <= d["bound_thm51"] * (1 + 1e-12))
    assert np.all(d["R"] >= d["sup_r"]) and np.all(d["R"] >= 1.0)


def test_policy_family_is_softmax_and_deterministic():
    fam = ft.policy_family()
    rng = np.random.default_rng(0)
    z, v = rng.standard_normal(10), rng.standard_normal(10)
    np.testing.assert_array_equal(fam["z"], z)
    np.testing.assert_array_equal(fam["v"], v)
    logits = z + 1.0 * v
    p = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(np.exp(fam["logp_new"][np.argmin(np.abs(fam["ts"] - 1.0))]), p, rtol=1e-12)


# --------------------------------------------------------------------------- 6. FreshPER, ExGRPO


def test_freshper_curves_are_exponential_decay():
    d = ft.freshper_weights_data()
    assert d["ages"][0] == 0 and d["ages"][-1] == 1500
    for i, tau in enumerate((250.0, 500.0, 1000.0)):
        np.testing.assert_allclose(d["weight"][i], np.exp(-d["ages"] / tau), rtol=1e-12)
        assert d["tau_eff"][i] == pytest.approx(tau / 0.6)
        np.testing.assert_allclose(d["weight_eff"][i], np.exp(-d["ages"] * 0.6 / tau), rtol=1e-12)


def test_exgrpo_buckets_sum_to_one_in_both_conventions():
    d = ft.exgrpo_buckets_data()
    assert d["probs"].shape == (2, 7)
    np.testing.assert_allclose(d["probs"].sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(d["probs"][0], bucket_probabilities(8, 4.0, 1.0, "success-count"))
    np.testing.assert_allclose(d["probs"][0][3], 0.399, atol=5e-4)
    np.testing.assert_allclose(d["probs"][1][0], 0.137, atol=5e-4)


# --------------------------------------------------------------------------- rendering

# name -> (panels, lines per panel, bars (Rectangle patches from ax.bar) per panel)
EXPECTED = {
    "optimal-vs-mu": (3, [6, 6, 6], [0, 0, 0]),
    "k-curve": (1, [5 + 3 + 1], [0]),  # 5 curves, 3 finite x* markers, the x = 1 guide
    "gamma-table": (1, [2], [6]),  # printed markers + gamma = 1 line; 6 bars
    "ess-vs-divergence": (1, [3], [0]),
    "chi2-vs-m2": (1, [3], [0]),
    "freshper-weights": (1, [6], [0]),
    "exgrpo-buckets": (1, [0], [14]),  # 2 conventions x 7 buckets
}


def _bars(ax):
    return sum(len(c.patches) for c in ax.containers)


def test_registry_names_and_descriptions():
    assert set(ft.THEORY_FIGURES) == set(EXPECTED)
    for desc, fn in ft.THEORY_FIGURES.values():
        assert isinstance(desc, str) and desc and "\n" not in desc
        assert callable(fn)


@pytest.mark.filterwarnings("ignore:constrained_layout not applied")  # 2 x 1.5 inches is tiny on purpose
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_figure_renders_small(name, tmp_path):
    _, fn = ft.THEORY_FIGURES[name]
    n_panels, lines, bars = EXPECTED[name]
    params = inspect.signature(fn).parameters
    if "axes" in params:
        fig, axes = plt.subplots(1, n_panels, figsize=(2, 1.5))
        out = fn(axes=axes)
    else:
        fig, ax = new_axes(figsize=(2, 1.5))
        out = fn(ax=ax)
    assert out is fig
    assert len(fig.axes) == n_panels
    assert [len(ax.lines) for ax in fig.axes] == lines
    assert [_bars(ax) for ax in fig.axes] == bars
    path = tmp_path / f"{name}.png"
    fig.savefig(path, dpi=50)
    assert path.stat().st_size > 0


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_figure_makes_its_own_figure_without_ax(name):
    fig = ft.THEORY_FIGURES[name][1]()
    assert len(fig.axes) == EXPECTED[name][0]


def test_figures_cli_lists_renders_and_is_deterministic(cli, tmp_path):
    code, out, _ = cli("figures", "--list")
    assert code == 0 and out.splitlines()[0].startswith("optimal-vs-mu")
    code, out, _ = cli("figures", "gamma-table", "k-curve", "--out", str(tmp_path / "a"), "--format", "png,pdf")
    assert code == 0 and sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "gamma-table.pdf", "gamma-table.png", "k-curve.pdf", "k-curve.png"]
    cli("figures", "gamma-table", "--out", str(tmp_path / "b"))
    # same data, same bytes: no version or date stamps in the files
    assert (tmp_path / "a" / "gamma-table.png").read_bytes() == (tmp_path / "b" / "gamma-table.png").read_bytes()
    code, out, err = cli("figures", "nope")
    assert code == 2 and out == "" and "unknown figure(s) nope" in err

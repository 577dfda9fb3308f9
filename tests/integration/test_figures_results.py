"""Results figures: the data they plot equals the saved runs; missing results name the command."""

import copy
import json

import numpy as np
import pytest

from replay_theory.experiments import paper_tables as experiments
from replay_theory.figures import results as fig
from replay_theory.figures.style import print_problems
from replay_theory.simulate.sweep import load_runs, run_sweep


@pytest.fixture(scope="module")
def results_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    spec = copy.deepcopy(experiments.EXPERIENCE_REPLAY)
    spec["base"].update(seeds=3, num_prompts=16, eval_every=5)
    spec["configs"] = [{"mu": 5.28, "buffer": "on-policy", "steps": 20},
                       {"mu": 5.28, "buffer": "fifo", "capacity": 128, "workers": 6, "trainers": 2, "steps": 31},
                       {"mu": 5.28, "buffer": "fifo", "capacity": 512, "workers": 4, "trainers": 4, "steps": 40}]
    run_sweep(spec, root / "experience-replay", n_jobs=1, show_progress=False)
    rloo = copy.deepcopy(experiments.RLOO)
    rloo["base"].update(seeds=2, steps=12, eval_every=6)
    rloo["configs"] = [c for c in rloo["configs"] if c.get("lr", 0.05) == 0.05][:8]
    run_sweep(rloo, root / "rloo", n_jobs=1, show_progress=False)
    return root


def test_staleness_distributions_are_the_saved_counts(results_root):
    data = fig.staleness_diversity_data(results_root)
    assert set(data) == {"N=128, (W,T)=(6,2)", "N=512, (W,T)=(4,4)"}
    for d in data.values():
        assert d["staleness"].sum() == pytest.approx(1.0) and d["time_since_last_use"].sum() == pytest.approx(1.0)
    # the bigger buffer with more trainers is staler on average
    mean = {k: (d["staleness"] * np.arange(d["staleness"].size)).sum() for k, d in data.items()}
    assert mean["N=512, (W,T)=(4,4)"] > mean["N=128, (W,T)=(6,2)"]


def test_pareto_frontier_is_the_running_best():
    compute = np.array([3.0, 1.0, 2.0, 4.0, 5.0])
    accuracy = np.array([0.5, 0.2, 0.6, 0.55, 0.7])
    c, a = fig.pareto_frontier(compute, accuracy)
    np.testing.assert_array_equal(c, [1.0, 2.0, 5.0])
    np.testing.assert_array_equal(a, [0.2, 0.6, 0.7])


def test_reward_vs_compute_uses_the_saved_curves(results_root):
    data = fig.reward_vs_compute_data(results_root)
    on_policy = data["designs"]["on-policy"]
    assert np.all(np.diff(on_policy["compute"]) > 0)
    assert np.all(on_policy["q25"] <= on_policy["median"]) and np.all(on_policy["median"] <= on_policy["q75"])
    frontier_c, frontier_a = data["frontier"]
    assert np.all(np.diff(frontier_c) > 0) and np.all(np.diff(frontier_a) > 0)


def test_rloo_heatmap_cells_equal_the_run_summaries(results_root):
    data = fig.rloo_heatmap_data(results_root)
    for run in load_runs(results_root / "rloo"):
        c = run["config"]
        if c["max_age"] == 2 and c["replay_ratio_groups"] in data["rhos"] and c["clip_c"] in data["cs"]:
            cell = data["rho_c"][data["rhos"].index(c["replay_ratio_groups"]), data["cs"].index(c["clip_c"])]
            assert cell == run["summary"]["final_reward"]
    assert data["fresh"][0.0] > data["fresh"][1.0]  # replay saves fresh verifier evaluations


def test_every_results_figure_renders_or_names_its_command(results_root, tmp_path):
    import matplotlib.pyplot as plt

    for name in ("staleness-diversity", "reward-vs-compute", "rloo-heatmap"):
        figure = fig.RESULTS_FIGURES[name][1](results_root)
        figure.savefig(tmp_path / f"{name}.png", dpi=60)
        assert (tmp_path / f"{name}.png").stat().st_size > 0
        plt.close(figure)
    with pytest.raises(fig.MissingResults, match="replay-theory experiment m2po --out"):
        fig.plot_m2po_collapse(results_root)
    with pytest.raises(fig.MissingResults, match="replay-theory validate all --out"):
        fig.plot_validation(results_root)
    (results_root / "validation").mkdir()
    (results_root / "validation" / "report.json").write_text(json.dumps({
        "warm_start": {"mean_reward": 0.2}, "designs": [
            {"name": "on-policy", "final_reward_mean": 0.25, "final_reward_std": 0.01},
            {"name": "predicted", "final_reward_mean": 0.22, "final_reward_std": 0.02}]}))
    figure = fig.plot_validation(results_root)
    bars = figure.axes[0].patches
    assert [b.get_height() for b in bars] == [0.25, 0.22]
    assert figure.axes[0].lines[0].get_ydata()[0] == 0.2  # a report without the spread: seed 0's warm start
    plt.close(figure)
    # a report with the warm start's spread and an RLOO design: the band spans mean +- sd, RLOO is hatched
    (results_root / "validation" / "report.json").write_text(json.dumps({
        "warm_start": {"mean_reward": 0.21}, "warm_start_reward": {"mean": 0.2, "std": 0.01}, "designs": [
            {"name": "on-policy", "buffer": "on-policy", "final_reward_mean": 0.25, "final_reward_std": 0.01},
            {"name": "predicted", "buffer": "fifo", "final_reward_mean": 0.22, "final_reward_std": 0.02},
            {"name": "RLOO rho=1", "buffer": "group-replay", "final_reward_mean": 0.24, "final_reward_std": 0.0}]}))
    figure = fig.plot_validation(results_root)
    ax = figure.axes[0]
    assert ax.lines[0].get_ydata()[0] == 0.2
    band = ax.patches[-1]  # axhspan: y from mean - sd, height 2 sd (data units)
    assert band.get_y() == pytest.approx(0.19) and band.get_y() + band.get_height() == pytest.approx(0.21)
    assert [b.get_hatch() for b in ax.patches[:3]] == [None, None, "//"]
    # predicted orange; on-policy and the first RLOO design share the first colour (hatching tells them apart)
    from matplotlib.colors import to_rgba

    assert ax.patches[1].get_facecolor() == to_rgba(fig.COLORS[1])
    assert ax.patches[0].get_facecolor() == ax.patches[2].get_facecolor() == to_rgba(fig.COLORS[0])
    plt.close(figure)


def test_figures_all_skips_missing_results_with_the_command(cli, tmp_path):
    (tmp_path / "empty").mkdir()  # a results folder with no experiment in it yet (a missing one is an error)
    code, out, _ = cli("figures", "all", "--results", str(tmp_path / "empty"), "--out", str(tmp_path / "f"))
    assert code == 0
    assert "skipped validation: " in out and "replay-theory validate all --out" in out
    # the theory figures are still built, identical to building them on their own
    cli("figures", "gamma-table", "--out", str(tmp_path / "g"))
    assert (tmp_path / "f" / "gamma-table.png").read_bytes() == (tmp_path / "g" / "gamma-table.png").read_bytes()
    assert sorted(p.stem for p in (tmp_path / "f").iterdir()) == sorted(
        ["optimal-vs-mu", "k-curve", "gamma-table", "ess-vs-divergence", "chi2-vs-m2", "freshper-weights",
         "exgrpo-buckets"])


def test_freshper_and_m2po_figures_read_their_runs(tmp_path):
    import matplotlib.pyplot as plt

    root = tmp_path / "results"
    spec = copy.deepcopy(experiments.FRESHPER)
    spec["base"].update(seeds=2, steps=24, num_prompts=16, eval_every=6)
    spec["configs"] = [c for c in spec["configs"] if c.get("per_tau", 3.0) in (3.0, float("inf"))
                       or c["buffer"] != "prioritized"]
    run_sweep(spec, root / "freshper", n_jobs=1, show_progress=False)
    data = fig.freshper_data(root)
    assert sorted(data) == [0.02, 0.2]
    for entry in data.values():
        # the every-update variant stays out of the figure; Alg. 1 with alpha = 0 is its uniform control
        assert set(entry["designs"]) == {"on-policy", "uniform", "uniform (Alg. 1)", "PER (tau = inf)", "tau = 3"}
        assert entry["drift"] > 0
        per = {k: v for k, v in entry["designs"].items() if k.startswith(("PER", "tau"))}
        best = max(per, key=per.get)
        assert (entry["best_tau"] == float("inf")) == best.startswith("PER")
    figure = fig.plot_freshper(root)
    assert len(figure.axes[0].patches) == 2 * 5  # one bar per (lr, design)
    plt.close(figure)
    m2po = copy.deepcopy(experiments.M2PO)
    m2po["base"].update(seeds=2, steps=12, eval_every=6, stale_k=4)
    m2po["configs"] = [{"loss": "grpo"}, {"loss": "m2po"}]
    run_sweep(m2po, root / "m2po", n_jobs=1, show_progress=False)
    data = fig.m2po_data(root)
    assert {d["fraction_kind"] for d in data.values()} == {"clipped", "masked"}
    figure = fig.plot_m2po_collapse(root)
    assert len(figure.axes[0].lines) == 2
    plt.close(figure)


REPORT = {"mu_measured": 3.2, "warm_start": {"mean_reward": 0.21},
          "warm_start_reward": {"mean": 0.2, "std": 0.01}, "designs": [
              {"name": "on-policy", "buffer": "on-policy", "final_reward_mean": 0.25, "final_reward_std": 0.01},
              {"name": "predicted", "buffer": "fifo", "final_reward_mean": 0.22, "final_reward_std": 0.04},
              {"name": "RLOO rho=1", "buffer": "group-replay", "final_reward_mean": 0.24, "final_reward_std": 0.0}]}


def test_report_bars_data_is_the_report():
    d = fig.report_bars_data(REPORT)
    assert d["names"] == ["on-policy", "predicted", "RLOO rho=1"]
    np.testing.assert_array_equal(d["means"], [0.25, 0.22, 0.24])
    np.testing.assert_array_equal(d["stds"], [0.01, 0.04, 0.0])
    assert d["group_replay"].tolist() == [False, False, True]
    # predicted orange; the others numbered within their kind (FIFO, RLOO), black left to the warm start
    assert d["colors"] == [fig.COLORS[0], fig.COLORS[1], fig.COLORS[0]]
    assert (d["warm_mean"], d["warm_std"], d["mu"]) == (0.2, 0.01, 3.2)
    # lowest of bar - sd (0.22 - 0.04 = 0.18) and band (0.2 - 0.01 = 0.19), minus 0.05
    assert d["bottom"] == pytest.approx(0.13)


def test_validate_report_png_is_the_validation_figures_left_panel(tmp_path, monkeypatch):
    """One drawing: validate verify's report.png is save_report_figure, handed to the loop by the CLI, whose panel
    plot_validation reuses."""
    import matplotlib.pyplot as plt
    from PIL import Image

    from replay_theory.cli import validate_cmds

    assert validate_cmds._report_figure() is fig.save_report_figure  # report.png is drawn by the figures module
    fig.save_report_figure(REPORT, tmp_path / "report.png")
    with Image.open(tmp_path / "report.png") as image:  # closed: an unclosed file is a ResourceWarning
        assert image.info["dpi"][0] == pytest.approx(200, abs=0.01)
    alone = fig.plot_report_bars(REPORT)
    (tmp_path / "validation").mkdir()
    (tmp_path / "validation" / "report.json").write_text(json.dumps(REPORT))
    both = fig.plot_validation(tmp_path)
    for ax in (alone.axes[0], both.axes[0]):
        assert [b.get_height() for b in ax.patches[:3]] == [0.25, 0.22, 0.24]
        assert [b.get_hatch() for b in ax.patches[:3]] == [None, None, "//"]
        assert ax.get_ylim()[0] == pytest.approx(0.13)
    title = "equal compute, μ = 3.2: predicted orange, RLOO hatched"
    assert alone.axes[0].get_title() == both.axes[0].get_title() == title
    # a report priced at --price-mu shows the price, not this machine's timing mu
    priced = fig.plot_report_bars({**REPORT, "mu": 5.28})
    assert priced.axes[0].get_title() == "equal compute, μ = 5.28: predicted orange, RLOO hatched"
    assert print_problems(alone) == [] and print_problems(both) == []
    plt.close("all")


def test_fixed_b_report_names_both_rules_picks():
    """A fixed-b report: each rule's prediction outlined and named above its bar; the 6 other designs get 6 colours
    (grey added to the palette, so the 6th does not repeat on-policy's blue); no RLOO key in the title."""
    import matplotlib.pyplot as plt

    names = ["on-policy", "replay y=2", "replay y=4", "replay y=8", "on-policy B/2", "on-policy B/4", "predicted"]
    report = {"mu": 5.28, "warm_start_reward": {"mean": 0.2, "std": 0.01},
              "designs": [{"name": n, "buffer": "fifo", "final_reward_mean": 0.25, "final_reward_std": 0.02}
                          for n in names],
              "predictions": [{"rule": "noise-scale", "design": "on-policy"}, {"rule": "paper", "design": "predicted"}]}
    d = fig.report_bars_data(report)
    assert d["picks"] == {0: ["noise-scale"], 6: ["paper"]}
    assert len(set(d["colors"])) == 7 and d["colors"][5] == "#999999" and d["colors"][6] == fig.COLORS[1]
    figure = fig.plot_report_bars(report)
    ax = figure.axes[0]
    assert [b.get_linewidth() for b in ax.patches[:7]] == [1.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.5]  # style default 1
    assert [t.get_text() for t in ax.texts] == ["noise-scale\nrule's\npick", "paper's\npick"]
    assert ax.get_title() == "equal compute, μ = 5.28: predicted orange, rules' picks outlined"
    # both rules picking the same design: one label naming both
    both = fig.report_bars_data({**report, "predictions": [{"rule": "noise-scale", "design": "on-policy"},
                                                           {"rule": "paper", "design": "on-policy"}]})
    assert both["picks"] == {0: ["noise-scale", "paper"]}
    assert print_problems(figure) == []
    # the horizon family's 8 designs besides the prediction: 8 colours, none repeating on-policy's blue
    horizon = {**report, "designs": report["designs"] + [{"name": n, "buffer": "fifo", "final_reward_mean": 0.24,
                                                          "final_reward_std": 0.02}
                                                         for n in ("replay y=4 x=16", "replay y=4 x=32")]}
    colors = fig.report_bars_data(horizon)["colors"]
    assert len(set(colors)) == 9 and colors[7:] == ["#882255", "#332288"]
    plt.close("all")


def test_results_figures_are_print_ready(results_root):
    import matplotlib.pyplot as plt

    for name in ("staleness-diversity", "reward-vs-compute", "rloo-heatmap"):
        figure = fig.RESULTS_FIGURES[name][1](results_root)
        assert print_problems(figure) == [], name
        plt.close(figure)
    figure = fig.plot_staleness_diversity(results_root)
    assert [ax.get_legend() for ax in figure.axes] == [None, None, None] and len(figure.legends) == 1
    plt.close(figure)


def test_corrupt_saved_files_are_named(tmp_path):
    runs = tmp_path / "m2po" / "runs"
    runs.mkdir(parents=True)
    (runs / "k.json").write_text(json.dumps({"key": "k", "config": {}}))
    (runs / "k.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"m2po/runs/k\.npz cannot be read .*: delete it and its \.json and rerun"):
        fig.m2po_data(tmp_path)
    (runs / "k.json").write_text("{")
    with pytest.raises(ValueError, match=r"m2po/runs/k\.json is not valid JSON"):
        fig.m2po_data(tmp_path)

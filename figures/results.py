"""Figures rebuilt from saved results: simulator experiments (docs/SIMULATION.md) and validation runs.

Each figure reads a results directory written by a command, and says which command
when it is missing:

| figure              | reads                                | written by (``replay-theory ...``)                   |
|---------------------|--------------------------------------|------------------------------------------------------|
| staleness-diversity | RESULTS/experience-replay/runs/*.npz | experiment experience-replay --out RESULTS/exp...  (*) |
| reward-vs-compute   | RESULTS/experience-replay/runs/*.npz | (same)                                               |
| rloo-heatmap        | RESULTS/rloo/runs/*.json             | experiment rloo --out RESULTS/rloo                   |
| m2po-collapse       | RESULTS/m2po/runs/*.npz              | experiment m2po --out RESULTS/m2po                   |
| freshper            | RESULTS/freshper/runs/*.npz          | experiment freshper --out RESULTS/freshper           |
| validation          | RESULTS/validation/report.json       | validate all --out RESULTS/validation                |
| theory-test         | RESULTS/theory-test/summary.json     | experiment theory-test --out RESULTS/theory-test     |

(*) ``--out RESULTS/experience-replay``.

Data functions return plain arrays (what the tests check); plot functions take ``ax``/``axes``
and return the figure, as in figures/theory.py. ``plot_report_bars`` (data: ``report_bars_data``)
is the one drawing of a validation report: the validation figure's left panel and the
``report.png`` that ``replay-theory validate all`` writes (``save_report_figure``).

A corrupt saved file raises ValueError naming the file (``read_json``); ``check_results``
tells, before any rendering, whether a figure's results exist.

Symbols: mu = rollout cost / per-sample update cost (ER Table 1), rho = replayed groups per fresh
group, L = maximum group age, c = clip constant (RLOO group replay), tau = FreshPER's age-decay
time constant (FreshPER Eq. 13), c (freshper figure) = measured KL drift per step.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from .style import COLORS, DPI, new_axes, new_axes_row, render

COMMANDS = {
    "experience-replay": "replay-theory experiment experience-replay --out {path}",
    "rloo": "replay-theory experiment rloo --out {path}",
    "m2po": "replay-theory experiment m2po --out {path}",
    "freshper": "replay-theory experiment freshper --out {path}",
    "validation": "replay-theory validate all --out {path}",
    "theory-test": "replay-theory experiment theory-test --out {path}",
}


#: figure -> (results sub-directory, the file or folder in it that must exist)
REQUIRES = {
    "staleness-diversity": ("experience-replay", "runs"),
    "reward-vs-compute": ("experience-replay", "runs"),
    "rloo-heatmap": ("rloo", "runs"),
    "m2po-collapse": ("m2po", "runs"),
    "freshper": ("freshper", "runs"),
    "validation": ("validation", "report.json"),
    "theory-test": ("theory-test", "summary.json"),
}


class MissingResults(ValueError):
    """The results a figure needs are not there; the message names the command that makes them."""


def _require(results: Path, name: str, marker: str = "runs") -> Path:
    path = Path(results) / name
    if not (path / marker).exists():
        raise MissingResults(f"{path / marker} not found: run `{COMMANDS[name].format(path=path)}`")
    return path


def check_results(figure: str, results: Path) -> None:
    """Raise MissingResults (naming the command that makes them) if ``figure``'s results are not under ``results``.

    Cheap (one ``exists``): the CLI calls it for every requested figure before it renders any.
    """
    name, marker = REQUIRES[figure]
    _require(results, name, marker)


def read_json(path: Path) -> dict:
    """A saved JSON file; a corrupt one raises ValueError naming the file (json's own message names none)."""
    try:
        return json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}): delete it and rerun the command that wrote it") from None


def read_runs(path: Path) -> list[dict]:
    """Every finished configuration's JSON payload under ``path``/runs, sorted by file name (as the sweep sorts)."""
    return [read_json(p) for p in sorted((Path(path) / "runs").glob("*.json")) if not p.name.endswith(".tmp.json")]


def _runs(path: Path) -> list[tuple[dict, dict]]:
    """(payload, arrays) of every finished configuration of a sweep directory."""
    out = []
    for payload in read_runs(path):
        npz = path / "runs" / f"{payload['key']}.npz"
        try:
            with np.load(npz) as data:
                out.append((payload, {k: data[k] for k in data.files}))
        except (OSError, ValueError, zipfile.BadZipFile) as err:
            raise ValueError(f"{npz} cannot be read ({err}): delete it and its .json and rerun the sweep") from None
    return out


def _label(config: dict) -> str:
    if config["buffer"] == "on-policy":
        return "on-policy"
    return f"N={config['capacity']}, (W,T)=({config['workers']:g},{config['trainers']:g})"


# --------------------------------------------------------------------------- Fig. 2: staleness and diversity


def staleness_diversity_data(results: Path, mu: float = 5.28) -> dict:
    """Normalised staleness, replay-count and time-since-last-use distributions of each buffered design."""
    path = _require(results, "experience-replay")
    designs = {}
    for payload, arrays in _runs(path):
        config = payload["config"]
        if config["buffer"] != "fifo" or config["mu"] != mu:
            continue
        staleness = arrays["staleness_counts"] / arrays["staleness_counts"].sum()
        replay = np.bincount(arrays["replay_counts"].astype(int)) if arrays["replay_counts"].size else np.zeros(1)
        tslu = arrays["time_since_last_use_counts"]
        designs[_label(config)] = {
            "staleness": staleness,  # fraction of uses at each staleness 0, 1, ...
            "replay_count": replay / max(replay.sum(), 1),  # fraction of rollouts used k times over their life
            "time_since_last_use": tslu / max(tslu.sum(), 1),
            "capacity": config["capacity"], "workers": config["workers"], "trainers": config["trainers"],
        }
    return designs


def plot_staleness_diversity(results: Path = Path("results"), axes=None) -> Figure:
    """Fig. 2: off-policiness, global diversity (replay count) and local diversity (time since last use).

    The three panels share their series: one legend below them.
    """
    data = staleness_diversity_data(results)
    fig, axes = new_axes_row(axes, n=3, figsize=(10.2, 3.4))
    chosen = sorted(data.items(), key=lambda kv: (kv[1]["workers"] / kv[1]["trainers"], kv[1]["capacity"]))
    capacities = sorted({d["capacity"] for d in data.values()})
    splits = sorted({d["workers"] / d["trainers"] for d in data.values()})
    styles = ("-", "--", ":", "-.")
    for label, d in chosen:
        color = COLORS[capacities.index(d["capacity"]) % len(COLORS)]  # colour: buffer size N
        style = styles[splits.index(d["workers"] / d["trainers"]) % len(styles)]  # line style: W/T
        for ax, key in zip(axes, ("staleness", "replay_count", "time_since_last_use")):
            ax.plot(np.arange(d[key].size), d[key], color=color, ls=style, lw=1, label=label)
    for ax, title in zip(axes, ("staleness of used samples", "uses per rollout (evicted)", "steps since last use")):
        ax.set_title(title)
        ax.set_xscale("symlog")
        ax.set_ylabel("fraction")
    axes[0].set_xlabel("staleness (steps)")
    axes[1].set_xlabel("replay count")
    axes[2].set_xlabel("time since last use (steps)")
    # one column per W/T split (the lines are ordered by split, then N; legends fill column by column)
    fig.legend(handles=axes[0].lines, loc="outside lower center", ncol=max(1, len(splits)))
    return fig


# --------------------------------------------------------------------------- reward vs compute


def pareto_frontier(compute: np.ndarray, accuracy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points not beaten by any point with less or equal compute: (compute, best accuracy so far), sorted."""
    order = np.argsort(compute, kind="stable")
    best = np.maximum.accumulate(accuracy[order])
    keep = np.concatenate([[True], best[1:] > best[:-1]])
    return compute[order][keep], best[keep]


def reward_vs_compute_data(results: Path, mu: float = 5.28) -> dict:
    """Per design: compute at each evaluation and the median / IQR of accuracy over seeds."""
    path = _require(results, "experience-replay")
    out = {}
    for payload, arrays in _runs(path):
        config = payload["config"]
        if config["mu"] != mu:
            continue
        steps = arrays["eval_steps"] - 1
        compute = arrays["curve__compute"].mean(axis=0)[steps]  # (E,) identical across seeds
        acc = arrays["eval__accuracy"]  # (S, E)
        out[_label(config)] = {"compute": compute, "median": np.median(acc, axis=0),
                               "q25": np.percentile(acc, 25, axis=0), "q75": np.percentile(acc, 75, axis=0),
                               "capacity": config["capacity"], "workers": config["workers"],
                               "trainers": config["trainers"]}
    all_compute = np.concatenate([d["compute"] for d in out.values()])
    all_median = np.concatenate([d["median"] for d in out.values()])
    frontier = pareto_frontier(all_compute, all_median)
    return {"designs": out, "frontier": frontier}


def plot_reward_vs_compute(results: Path = Path("results"), ax=None) -> Figure:
    """Accuracy vs compute (median and IQR over seeds) per design, with the Pareto frontier (Fig. 1/3 style)."""
    data = reward_vs_compute_data(results)
    fig, ax = new_axes(ax, figsize=(7.0, 3.4))
    # As in staleness-diversity: colour = buffer size N, line style = W/T split (a colour cycle repeats past 7).
    buffered = [d for label, d in data["designs"].items() if label != "on-policy"]
    capacities = sorted({d["capacity"] for d in buffered})
    splits = sorted({d["workers"] / d["trainers"] for d in buffered})
    palette = [c for c in COLORS if c != "#000000"]  # black is the on-policy queue
    styles = ("-", "--", ":", "-.")
    for label, d in sorted(data["designs"].items(),
                           key=lambda kv: (kv[0] != "on-policy", kv[1]["workers"] / kv[1]["trainers"],
                                           kv[1]["capacity"])):
        if label == "on-policy":
            color, style, width = "k", "-", 1.6
        else:
            color = palette[capacities.index(d["capacity"]) % len(palette)]
            style, width = styles[splits.index(d["workers"] / d["trainers"]) % len(styles)], 1.0
        ax.plot(d["compute"], d["median"], color=color, ls=style, lw=width, label=label)
        ax.fill_between(d["compute"], d["q25"], d["q75"], color=color, alpha=0.15, lw=0)
    ax.plot(*data["frontier"], color="grey", ls=":", lw=1.5, label="Pareto frontier")
    ax.set_xlabel("compute (sample-update units, Eq. 1-2)")
    ax.set_ylabel("accuracy (median, IQR over seeds)")
    ax.set_title("bandit, async pipeline, μ = 5.28")
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5))  # many designs: beside the axes, not over the curves
    return fig


# --------------------------------------------------------------------------- RLOO heatmaps


def rloo_heatmap_data(results: Path, lr: float = 0.05) -> dict:
    """Final reward over (rho, c) at L = 2 and over (L, c) at rho = 1, plus fresh evaluations per rho."""
    path = _require(results, "rloo")
    runs = [r for r in read_runs(path) if r["config"]["lr"] == lr]
    cs = sorted({r["config"]["clip_c"] for r in runs if r["config"]["clip_c"] < 100})
    rhos = sorted({r["config"]["replay_ratio_groups"] for r in runs if r["config"]["replay_ratio_groups"] > 0})
    ages = sorted({r["config"]["max_age"] for r in runs})
    rho_c = np.full((len(rhos), len(cs)), np.nan)
    age_c = np.full((len(ages), len(cs)), np.nan)
    fresh = {}
    for r in runs:
        c = r["config"]
        if c["clip_c"] in cs and c["max_age"] == 2 and c["replay_ratio_groups"] in rhos:
            rho_c[rhos.index(c["replay_ratio_groups"]), cs.index(c["clip_c"])] = r["summary"]["final_reward"]
        if c["clip_c"] in cs and c["replay_ratio_groups"] == 1.0:
            age_c[ages.index(c["max_age"]), cs.index(c["clip_c"])] = r["summary"]["final_reward"]
        fresh[c["replay_ratio_groups"]] = r["counts"]["K_inference"]
    return {"cs": cs, "rhos": rhos, "ages": ages, "rho_c": rho_c, "age_c": age_c, "fresh": fresh}


def plot_rloo_heatmap(results: Path = Path("results"), axes=None) -> Figure:
    """Final reward over (rho, c) and (L, c), and fresh verifier evaluations per rho (RLOO group replay)."""
    data = rloo_heatmap_data(results)
    fig, axes = new_axes_row(axes, n=3, figsize=(10.2, 3.2))
    for ax, grid, rows, name in ((axes[0], data["rho_c"], data["rhos"], "ρ (L = 2)"),
                                 (axes[1], data["age_c"], data["ages"], "L (ρ = 1)")):
        image = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis")
        ax.set_xticks(range(len(data["cs"])), [f"{c:g}" for c in data["cs"]])
        ax.set_yticks(range(len(rows)), [f"{r:g}" for r in rows])
        ax.set_xlabel("clip c")
        ax.set_ylabel(name)
        for (i, j), value in np.ndenumerate(grid):
            if np.isfinite(value):
                ax.text(j, i, f"{value:.3f}", ha="center", va="center", color="w")
        fig.colorbar(image, ax=ax, shrink=0.8)
    rhos = sorted(data["fresh"])
    axes[2].bar(range(len(rhos)), [data["fresh"][r] for r in rhos], color=COLORS[0])
    axes[2].set_xticks(range(len(rhos)), [f"{r:g}" for r in rhos])
    axes[2].set_xlabel("ρ (replayed groups per fresh group)")
    axes[2].set_ylabel("fresh verifier evaluations")
    axes[0].set_title("final reward")
    axes[1].set_title("final reward")
    return fig


# --------------------------------------------------------------------------- M2PO


def m2po_data(results: Path) -> dict:
    """Per loss: mean reward over evaluations, and the per-update clip or masked fraction (mean over seeds)."""
    path = _require(results, "m2po")
    out = {}
    for payload, arrays in _runs(path):
        c = payload["config"]
        fraction = arrays.get("curve__pg_clipfrac", arrays.get("curve__masked_frac"))
        out[f"{c['loss']} (stale-{c['stale_k']})"] = {
            "steps": arrays["eval_steps"], "reward": arrays["eval__reward"].mean(axis=0),
            "fraction": None if fraction is None else np.nanmean(fraction, axis=0),
            "fraction_kind": "clipped" if "curve__pg_clipfrac" in arrays else "masked",
        }
    return out


def plot_m2po_collapse(results: Path = Path("results"), axes=None) -> Figure:
    """Reward over training at staleness 32 per loss, and the clip / masked token fractions (token MDP).

    One colour per loss in both panels, so one legend below them.
    """
    data = m2po_data(results)
    fig, axes = new_axes_row(axes, n=2, figsize=(7.0, 3.4))
    for i, (label, d) in enumerate(sorted(data.items())):
        color = COLORS[i % len(COLORS)]
        axes[0].plot(d["steps"], d["reward"], color=color, lw=1, label=label)
        if d["fraction"] is not None and np.nanmax(d["fraction"]) > 0:
            axes[1].plot(np.arange(d["fraction"].size), d["fraction"], color=color, lw=0.8)
    axes[0].set_xlabel("update")
    axes[0].set_ylabel("expected reward (mean over seeds)")
    axes[1].set_xlabel("update")
    axes[1].set_ylabel("tokens clipped (GRPO) / masked (M2PO)")
    fig.legend(handles=axes[0].lines, loc="outside lower center", ncol=min(4, max(1, len(data))))
    return fig


# --------------------------------------------------------------------------- FreshPER


def freshper_data(results: Path) -> dict:
    """Per learning rate: final accuracy per design, the measured KL drift c, and the best tau."""
    path = _require(results, "freshper")
    by_lr: dict[float, dict] = {}
    for payload, arrays in _runs(path):
        c, s = payload["config"], payload["summary"]
        entry = by_lr.setdefault(c["lr"], {"designs": {}, "drift": None, "best_tau": None})
        if c["buffer"] == "on-policy":
            name = "on-policy"
            kl = arrays["drift_kl"].mean(axis=0)
            entry["drift"] = float(kl[0] / arrays["drift_lags"][0])  # KL(pi_t || pi_t-1) per step
        elif c["buffer"] == "fifo":
            name = "uniform"
        elif c.get("per_schedule", "algorithm1") != "algorithm1":
            continue  # the earlier every-update variant: in the table, not in the figure
        elif c.get("per_alpha", 0.6) == 0:
            name = "uniform (Alg. 1)"
        else:
            name = "PER (tau = inf)" if np.isinf(c["per_tau"]) else f"tau = {c['per_tau']:g}"
        entry["designs"][name] = s["final_accuracy"]
    for entry in by_lr.values():
        taus = {k: v for k, v in entry["designs"].items() if k.startswith(("PER", "tau"))}
        best = max(taus, key=lambda name: taus[name])
        entry["best_tau"] = float("inf") if best.startswith("PER") else float(best.split("= ")[1])
    return by_lr


def plot_freshper(results: Path = Path("results"), axes=None) -> Figure:
    """Final accuracy of on-policy, uniform, standard PER and age-decayed PER per lr; best tau vs 1/drift."""
    data = freshper_data(results)
    fig, axes = new_axes_row(axes, n=2, figsize=(7.0, 3.4))
    lrs = sorted(data)

    def order(name: str) -> tuple:
        if name in ("on-policy", "uniform", "uniform (Alg. 1)"):
            return (0, ("on-policy", "uniform", "uniform (Alg. 1)").index(name), 0.0)
        return (1, 0, -float("inf") if name.startswith("PER") else -float(name.split("= ")[1]))

    names = sorted(data[lrs[0]]["designs"], key=order)  # on-policy, uniform, PER, then decreasing tau
    width = 0.8 / len(lrs)
    for j, lr in enumerate(lrs):
        values = [data[lr]["designs"].get(n, np.nan) for n in names]
        axes[0].bar(np.arange(len(names)) + j * width, values, width=width, color=COLORS[j], label=f"lr = {lr:g}")
    axes[0].set_xticks(np.arange(len(names)) + width * (len(lrs) - 1) / 2, names, rotation=30, ha="right")
    axes[0].set_ylabel("final accuracy")
    low = min(min(d["designs"].values()) for d in data.values())
    high = max(max(d["designs"].values()) for d in data.values())
    axes[0].set_ylim(low - 0.02, high + 0.06)  # headroom: the legend sits above the bars
    axes[0].legend(loc="upper right", ncol=len(lrs))
    inv_drift = [1.0 / data[lr]["drift"] for lr in lrs]
    best = [data[lr]["best_tau"] for lr in lrs]
    shown = [b if np.isfinite(b) else 2 * max(inv_drift) for b in best]
    axes[1].scatter(inv_drift, shown, color=COLORS[1], zorder=3)
    for x, y, b, lr in zip(inv_drift, shown, best, lrs):
        right = x == max(inv_drift)  # the rightmost label goes left of its point, inside the axes
        axes[1].annotate(f"lr {lr:g}" + ("" if np.isfinite(b) else " (τ = ∞)"), (x, y),
                         xytext=(-6, -3) if right else (6, 3), textcoords="offset points",
                         ha="right" if right else "left", va="top" if right else "bottom")
    line = np.array([min(inv_drift) / 2, max(inv_drift) * 2])
    axes[1].plot(line, line, color="grey", ls=":", lw=1, label="τ = 1/c (FreshPER heuristic)")
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("1 / measured KL drift per step")
    axes[1].set_ylabel("best τ among the runs")
    axes[1].set_title("dotted: τ = 1/c (FreshPER heuristic)")  # a legend would cover labels
    return fig


# --------------------------------------------------------------------------- validation


def validation_data(results: Path) -> dict:
    """The report ``replay-theory validate all`` saved under RESULTS/validation/report.json."""
    path = _require(results, "validation", marker="report.json")
    return read_json(path / "report.json")


def validation_curves(results: Path) -> dict:
    """Per design: mean training reward against compute, from the verify runs' saved records.

    Compute after update t is t times the run's mean compute per update (a group-replay run's first
    update, all fresh, costs more than the later ones; the curve spreads that evenly).
    """
    path = _require(results, "validation", marker="report.json")
    curves: dict[str, list] = {}
    for record_file in sorted((path / "verify").glob("*.json")):
        record = read_json(record_file)
        per_update = record["compute"] / record["steps"]
        curves.setdefault(record["design"]["name"], []).append(
            (per_update * np.arange(1, record["steps"] + 1), np.asarray(record["train_reward"])))
    return {name: (runs[0][0], np.mean([r for _, r in runs], axis=0)) for name, runs in curves.items()}


def _design_colors(designs: list[dict]) -> list[str]:
    """The predicted design in orange; the others numbered within their kind (GRPO + FIFO, RLOO group replay).

    Eight designs outrun a colour-blind-safe cycle without orange (predicted) and black (the warm
    start), so the RLOO designs reuse the FIFO designs' colours, told apart by hatching and dashes:
    on-policy and RLOO rho = 0, the no-replay baseline of each kind, share the first colour.
    """
    # + grey, wine, indigo: the fixed-b family's 6 designs besides the prediction, and the horizon family's 8, would
    # otherwise wrap to on-policy's blue
    palette = [c for c in COLORS if c not in (COLORS[1], "#000000")] + ["#999999", "#882255", "#332288"]
    counts = {False: 0, True: 0}
    colors = []
    for design in designs:
        if design["name"] == "predicted":
            colors.append(COLORS[1])
            continue
        kind = design.get("buffer") == "group-replay"
        colors.append(palette[counts[kind] % len(palette)])
        counts[kind] += 1
    return colors


def report_bars_data(report: dict) -> dict:
    """What the bar chart of a validation report shows (one implementation for the gallery and validate's report.png).

    Returns ``names``, ``means``, ``stds`` (D,) held-out reward per design in report order, ``colors``
    (predicted orange), ``group_replay`` (D,) bool (RLOO whole-group replay: hatched),
    ``picks`` ({design index: [rule, ...]}: the rules whose prediction it is, in a fixed-b report), ``warm_mean`` and
    ``warm_std`` (the warm start over its evaluation seeds; reports made before the spread was recorded
    give evaluation seed 0 and sd 0), ``bottom`` (y-axis start: the differences are a few hundredths, so
    the axis starts 0.05 under the lowest bar or band, not at 0) and ``mu`` (the mu compute was priced at:
    ``--price-mu``, or the measured mu of reports made before it; or None).
    """
    designs = report["designs"]
    warm = report.get("warm_start_reward") or {"mean": report["warm_start"]["mean_reward"], "std": 0.0}
    means = np.array([d["final_reward_mean"] for d in designs], dtype=float)
    stds = np.array([d["final_reward_std"] for d in designs], dtype=float)
    low = min(float(np.min(means - stds)), warm["mean"] - warm["std"])
    names = [d["name"] for d in designs]
    picks: dict[int, list[str]] = {}  # fixed-b: design index -> the rules that picked it
    for prediction in report.get("predictions") or ():
        if prediction.get("design") in names:
            picks.setdefault(names.index(prediction["design"]), []).append(prediction["rule"])
    return {"names": names, "means": means, "stds": stds,
            "colors": _design_colors(designs),
            "group_replay": np.array([d.get("buffer") == "group-replay" for d in designs], dtype=bool),
            "picks": picks, "warm_mean": float(warm["mean"]), "warm_std": float(warm["std"]),
            "bottom": max(0.0, low - 0.05), "mu": report.get("mu", report.get("mu_measured"))}


def plot_report_bars(report: dict, ax: Axes | None = None, legend: bool = True) -> Figure:
    """Held-out reward per design at equal compute: bars (+- sd), predicted orange, RLOO hatched, warm start dashed.

    ``legend=False`` leaves the warm start's key to the caller (plot_validation puts one legend under both panels).
    """
    d = report_bars_data(report)
    fig, ax = new_axes(ax, figsize=(6.0, 3.4))
    bars = ax.bar(range(len(d["names"])), d["means"], yerr=d["stds"], color=d["colors"])
    for bar, hatched in zip(bars, d["group_replay"]):
        if hatched:
            bar.set_hatch("//")
    ax.axhline(d["warm_mean"], color="k", ls="--", lw=1, label="warm start (± sd)")
    if d["warm_std"] > 0:
        ax.axhspan(d["warm_mean"] - d["warm_std"], d["warm_mean"] + d["warm_std"], color="k", alpha=0.1, lw=0)
    picks: dict[int, list[str]] = d["picks"]
    for i, rules in picks.items():  # fixed-b: each rule's prediction outlined and named above its bar
        bars[i].set_edgecolor("k")
        bars[i].set_linewidth(1.5)
        label = " + ".join({"noise-scale": "noise-scale\nrule's", "paper": "paper's"}.get(r, r) for r in rules)
        ax.annotate(f"{label}\npick", (i, d["means"][i] + d["stds"][i]), xytext=(0, 2),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(d["names"])), d["names"], rotation=25, ha="right")
    top = float(np.max(d["means"] + d["stds"]))
    ax.set_ylim(d["bottom"], top + (0.3 if d["picks"] else 0.1) * (top - d["bottom"]))  # room for the labels
    ax.set_ylabel("held-out reward (mean ± sd)")
    mu = "" if d["mu"] is None else f", μ = {d['mu']:.3g}"
    keys = ["predicted orange"] + (["RLOO hatched"] if d["group_replay"].any() else []) + (
        ["rules' picks outlined"] if d["picks"] else [])
    ax.set_title(f"equal compute{mu}: {', '.join(keys)}")
    if legend:
        ax.legend(loc="best")
    return fig


def save_report_figure(report: dict, path: Path, dpi: int = DPI) -> None:
    """Write ``plot_report_bars(report)`` as a PNG (validate's report.png)."""
    fig = plot_report_bars(report)
    try:
        Path(path).write_bytes(render(fig, "png", dpi))
    finally:
        plt.close(fig)


def plot_validation(results: Path = Path("results"), axes=None) -> Figure:
    """Held-out reward per design at equal compute (plot_report_bars) and training reward vs compute.

    The warm start is the dashed line with its seed spread shaded. Group-replay (RLOO) designs are
    hatched and dashed. Both panels show the same designs in the same colours: one legend below them.
    """
    report = validation_data(results)
    fig, axes = new_axes_row(axes, n=2, figsize=(9.0, 3.8))
    plot_report_bars(report, ax=axes[0], legend=False)
    colors = report_bars_data(report)["colors"]
    lines: dict[bool, list] = {False: [], True: []}  # legend rows: GRPO + FIFO designs, then RLOO designs
    if (Path(results) / "validation" / "verify").exists():
        curves = validation_curves(results)
        for i, design in enumerate(report["designs"]):
            if design["name"] in curves:
                compute, reward = curves[design["name"]]
                window = min(5, reward.size)  # single updates are noisy: a trailing 5-update mean
                reward = np.convolve(reward, np.ones(window) / window, mode="valid")
                compute = compute[window - 1:]
                rloo = design.get("buffer") == "group-replay"
                lines[rloo] += axes[1].plot(compute, reward, color=colors[i], lw=1, ls="--" if rloo else "-",
                                            label=design["name"])
    # Legends fill column by column: pad to two rows so FIFO designs sit above RLOO ones, warm start first.
    blank = Line2D([], [], alpha=0, label=" ")
    width = max(len(lines[False]), len(lines[True]))
    rows = [lines[False] + [blank] * (width - len(lines[False])), lines[True] + [blank] * (width - len(lines[True]))]
    handles = [Line2D([], [], color="k", ls="--", lw=1, label="warm start (± sd)"), blank]
    handles += [h for column in zip(*rows) for h in column]
    axes[1].set_xlabel("compute (μ × fresh rollouts + samples trained)")
    axes[1].set_ylabel("training reward (seed mean, 5-update avg.)")
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles) // 2)
    return fig


# --------------------------------------------------------------------------- does the theory predict?

THEORY_TEST_OBJECTIVES = (("printed", "optimal, as printed", "-"),
                          ("printed_steps2", "optimal, --max-steps-ratio 2", "-"),
                          ("on_policy_floor", "trivial: max(floor, min B)", "-."),
                          ("forgetting_b_simple", "rule's pick in the grid", "-"),
                          ("on_policy_oracle", "oracle on-policy batch", ":"), ("paper_J", "paper J", "--"),
                          ("forgetting", "b fitted to the grid", "-"), ("on_policy", "always on-policy", "-."))
"""The objectives the figure shows: the answer optimal prints from a one-run pilot (at its default, least compute, and
within 2x on-policy's steps), the trivial rule it must beat and the rule's own pick over the grid first: the right
panel draws these four."""
REGRET_TICKS = (0.5, 1.0, 1.2, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0)
"""A printed answer off the grid can beat the grid's best: regrets go below 1 (down to 0.35 at floor 64 in the run of
docs/SIMULATION.md), so the axes start at 0.25."""


def theory_test_cells(results: Path) -> tuple[list[dict], int]:
    """Every cell of the benchmark at its headline latency floor: setting, optimizer, instance, mu, b (from steps)
    and each objective's free-batch regret; and that floor."""
    summary = read_json(_require(results, "theory-test", "summary.json") / "summary.json")
    floor = summary["protocol"]["headline_floor"]
    cells = []
    for c in summary["cells"]:
        if c["floor"] != floor:
            continue
        regret = {name: (c["by_objective"].get(name) or {}).get("free_regret") for name, _, _ in
                  THEORY_TEST_OBJECTIVES}
        scored = {name: name in c["by_objective"] for name, _, _ in THEORY_TEST_OBJECTIVES}
        cells.append({"setting": f"{c['setting']}/{c['optimizer']}", "instance": c["instance"], "mu": c["mu"],
                      "b": c.get("b"), "regret": regret, "scored": scored})
    return cells, floor


def plot_theory_test(results: Path = Path("results"), axes=None) -> Figure:
    """Left: every cell's free-batch regret (compute of the pick / the whole grid's cheapest design) per objective
    at the headline latency floor, the 1.2 target dashed. Right: the regret against b = B_noise / 256 measured from
    on-policy steps, at mu = 5.28, one marker per unit (setting, optimizer, instance)."""
    cells, floor = theory_test_cells(results)
    fig, axes = new_axes_row(axes, n=2, figsize=(6.5, 3.4))
    rng = np.random.default_rng(0)  # jitter only
    for i, (name, _label, _) in enumerate(THEORY_TEST_OBJECTIVES):
        values = np.array([c["regret"][name] for c in cells if c["regret"][name] is not None], dtype=float)
        if not values.size:
            continue
        # the share of every cell the objective is scored in, as the targets count it: a cell without a pick (or a
        # pick that never reached the target, None in strict JSON) is a miss, not left out
        scored = sum(1 for c in cells if c["scored"][name])
        within = float((values <= 1.2).sum() / scored)
        axes[0].scatter(i + rng.uniform(-0.25, 0.25, values.size), values, s=6, color=COLORS[i % len(COLORS)],
                        alpha=0.6, lw=0)
        # the share sits above the panel, where no point can cover it
        axes[0].text(i, 1.01, f"{100 * within:.0f}%", ha="center", va="bottom", fontsize=8,
                     transform=axes[0].get_xaxis_transform())
    axes[0].set_xticks(range(len(THEORY_TEST_OBJECTIVES)),
                       [label for _, label, _ in THEORY_TEST_OBJECTIVES],
                       rotation=35, ha="right", rotation_mode="anchor", fontsize=8)
    for ax in axes:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(FixedLocator(REGRET_TICKS))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_locator(NullLocator())
    axes[0].set_ylim(0.25, None)
    axes[0].axhline(1.2, color="0.5", lw=0.8, ls="--")
    axes[0].set_ylabel(f"regret, free batch, floor {floor} (share <= 1.2)")
    at = [c for c in cells if c["mu"] == 5.28 and c["b"] is not None and np.isfinite(c["b"])]
    for i, (name, label, _style) in enumerate(THEORY_TEST_OBJECTIVES[:4]):
        pts = [(c["b"], c["regret"][name]) for c in at if c["regret"][name] is not None]
        if pts:
            axes[1].scatter(*zip(*pts), s=12, color=COLORS[i], marker="o^sD"[i], label=label, alpha=0.8, lw=0)
    axes[1].set_xscale("log")
    axes[1].set_ylim(0.25, None)
    axes[1].axhline(1.2, color="0.5", lw=0.8, ls="--")
    axes[1].set_xlabel("b = B_noise / 256, measured (μ = 5.28)")
    axes[1].set_ylabel("regret, free batch")
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, fontsize=8)
    return fig


RESULTS_FIGURES = {
    "staleness-diversity": ("Fig. 2: staleness, replay count and time since last use per buffer design",
                            plot_staleness_diversity),
    "reward-vs-compute": ("accuracy vs compute per buffer design with the Pareto frontier (mu = 5.28)",
                          plot_reward_vs_compute),
    "rloo-heatmap": ("RLOO group replay: reward over (rho, c) and (L, c), fresh evaluations per rho",
                     plot_rloo_heatmap),
    "m2po-collapse": ("M2PO: reward over training at staleness 32, and clip / masked fractions", plot_m2po_collapse),
    "freshper": ("FreshPER: on-policy vs uniform vs PER vs age decay per lr; best tau vs 1/drift", plot_freshper),
    "validation": ("validation: predicted vs measured design at equal compute, reward vs compute", plot_validation),
    "theory-test": ("does a rule predict? every cell's free-batch regret per objective, and the regret against b",
                    plot_theory_test),
}

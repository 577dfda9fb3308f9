"""Figures rebuilt from saved results: simulator experiments (docs/SIMULATION.md) and validation runs.

Each figure reads a results directory written by a command, and says which command
when it is missing:

| figure               | reads                                  | written by                                                       |
|----------------------|----------------------------------------|------------------------------------------------------------------|
| staleness-diversity  | RESULTS/experience-replay/runs/*.npz   | replay-theory experiment experience-replay --out RESULTS/experience-replay |
| reward-vs-compute    | RESULTS/experience-replay/runs/*.npz   | (same)                                                           |
| rloo-heatmap         | RESULTS/rloo/runs/*.json               | replay-theory experiment rloo --out RESULTS/rloo                 |
| m2po-collapse        | RESULTS/m2po/runs/*.npz                | replay-theory experiment m2po --out RESULTS/m2po                 |
| freshper             | RESULTS/freshper/runs/*.npz            | replay-theory experiment freshper --out RESULTS/freshper         |
| validation           | RESULTS/validation/report.json         | replay-theory validate all --out RESULTS/validation              |

Data functions return plain arrays (what the tests check); plot functions take ``ax``/``axes``
and return the figure, as in figures/theory.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from replay_theory.figures.style import COLORS, new_axes, new_axes_row

COMMANDS = {
    "experience-replay": "replay-theory experiment experience-replay --out {path}",
    "rloo": "replay-theory experiment rloo --out {path}",
    "m2po": "replay-theory experiment m2po --out {path}",
    "freshper": "replay-theory experiment freshper --out {path}",
    "validation": "replay-theory validate all --out {path}",
}


class MissingResults(ValueError):
    """The results a figure needs are not there; the message names the command that makes them."""


def _require(results: Path, name: str, marker: str = "runs") -> Path:
    path = Path(results) / name
    if not (path / marker).exists():
        raise MissingResults(f"{path / marker} not found: run `{COMMANDS[name].format(path=path)}`")
    return path


def _runs(path: Path) -> list[tuple[dict, dict]]:
    """(payload, arrays) of every finished configuration of a sweep directory."""
    from replay_theory.simulate.sweep import load_runs

    out = []
    for payload in load_runs(path):
        with np.load(path / "runs" / f"{payload['key']}.npz") as data:
            out.append((payload, {k: data[k] for k in data.files}))
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


def plot_staleness_diversity(results: Path = Path("results"), axes=None):
    """Fig. 2: off-policiness, global diversity (replay count) and local diversity (time since last use)."""
    data = staleness_diversity_data(results)
    fig, axes = new_axes_row(axes, n=3)
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
        ax.set_title(title, fontsize=8)
        ax.set_xscale("symlog")
        ax.set_ylabel("fraction")
    axes[0].set_xlabel("staleness (steps)")
    axes[1].set_xlabel("replay count")
    axes[2].set_xlabel("time since last use (steps)")
    axes[0].legend(fontsize=5)
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
                               "q25": np.percentile(acc, 25, axis=0), "q75": np.percentile(acc, 75, axis=0)}
    all_compute = np.concatenate([d["compute"] for d in out.values()])
    all_median = np.concatenate([d["median"] for d in out.values()])
    frontier = pareto_frontier(all_compute, all_median)
    return {"designs": out, "frontier": frontier}


def plot_reward_vs_compute(results: Path = Path("results"), ax=None):
    """Accuracy vs compute (median and IQR over seeds) per design, with the Pareto frontier (Fig. 1/3 style)."""
    data = reward_vs_compute_data(results)
    fig, ax = new_axes(ax, figsize=(5, 3.2))
    for i, (label, d) in enumerate(sorted(data["designs"].items(), key=lambda kv: kv[0] != "on-policy")):
        color = "k" if label == "on-policy" else COLORS[i % len(COLORS)]
        ax.plot(d["compute"], d["median"], color=color, lw=1.5 if label == "on-policy" else 0.8, label=label)
        ax.fill_between(d["compute"], d["q25"], d["q75"], color=color, alpha=0.15, lw=0)
    ax.plot(*data["frontier"], color="grey", ls=":", lw=1.5, label="Pareto frontier")
    ax.set_xlabel("compute (sample-update units, Eq. 1-2)")
    ax.set_ylabel("accuracy (median, IQR over seeds)")
    ax.set_title("bandit, async pipeline, mu = 5.28", fontsize=8)
    ax.legend(fontsize=5, ncol=2)
    return fig


# --------------------------------------------------------------------------- RLOO heatmaps


def rloo_heatmap_data(results: Path, lr: float = 0.05) -> dict:
    """Final reward over (rho, c) at L = 2 and over (L, c) at rho = 1, plus fresh evaluations per rho."""
    from replay_theory.simulate.sweep import load_runs

    path = _require(results, "rloo")
    runs = [r for r in load_runs(path) if r["config"]["lr"] == lr]
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


def plot_rloo_heatmap(results: Path = Path("results"), axes=None):
    """Final reward over (rho, c) and (L, c), and fresh verifier evaluations per rho (RLOO group replay)."""
    data = rloo_heatmap_data(results)
    fig, axes = new_axes_row(axes, n=3)
    for ax, grid, rows, name in ((axes[0], data["rho_c"], data["rhos"], "rho (L = 2)"),
                                 (axes[1], data["age_c"], data["ages"], "L (rho = 1)")):
        image = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis")
        ax.set_xticks(range(len(data["cs"])), [f"{c:g}" for c in data["cs"]])
        ax.set_yticks(range(len(rows)), [f"{r:g}" for r in rows])
        ax.set_xlabel("clip c")
        ax.set_ylabel(name)
        for (i, j), value in np.ndenumerate(grid):
            if np.isfinite(value):
                ax.text(j, i, f"{value:.3f}", ha="center", va="center", fontsize=5, color="w")
        fig.colorbar(image, ax=ax, shrink=0.8)
    rhos = sorted(data["fresh"])
    axes[2].bar(range(len(rhos)), [data["fresh"][r] for r in rhos], color=COLORS[0])
    axes[2].set_xticks(range(len(rhos)), [f"{r:g}" for r in rhos])
    axes[2].set_xlabel("rho")
    axes[2].set_ylabel("fresh verifier evaluations")
    axes[0].set_title("final reward", fontsize=8)
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


def plot_m2po_collapse(results: Path = Path("results"), axes=None):
    """Reward over training at staleness 32 per loss, and the clip / masked token fractions (token MDP)."""
    data = m2po_data(results)
    fig, axes = new_axes_row(axes, n=2)
    for i, (label, d) in enumerate(sorted(data.items())):
        color = COLORS[i % len(COLORS)]
        axes[0].plot(d["steps"], d["reward"], color=color, lw=1, label=label)
        if d["fraction"] is not None and np.nanmax(d["fraction"]) > 0:
            axes[1].plot(np.arange(d["fraction"].size), d["fraction"], color=color, lw=0.8,
                         label=f"{label}: {d['fraction_kind']}")
    axes[0].set_xlabel("update")
    axes[0].set_ylabel("expected reward (mean over seeds)")
    axes[1].set_xlabel("update")
    axes[1].set_ylabel("fraction of tokens clipped / masked")
    axes[0].legend(fontsize=5)
    axes[1].legend(fontsize=5)
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
        else:
            name = "PER (tau = inf)" if np.isinf(c["per_tau"]) else f"tau = {c['per_tau']:g}"
        entry["designs"][name] = s["final_accuracy"]
    for entry in by_lr.values():
        taus = {k: v for k, v in entry["designs"].items() if k.startswith(("PER", "tau"))}
        best = max(taus, key=taus.get)
        entry["best_tau"] = float("inf") if best.startswith("PER") else float(best.split("= ")[1])
    return by_lr


def plot_freshper(results: Path = Path("results"), axes=None):
    """Final accuracy of on-policy, uniform, standard PER and age-decayed PER per lr; best tau vs 1/drift."""
    data = freshper_data(results)
    fig, axes = new_axes_row(axes, n=2)
    lrs = sorted(data)

    def order(name: str) -> tuple:
        if name in ("on-policy", "uniform"):
            return (0, name != "on-policy", 0.0)
        return (1, 0, -float("inf") if name.startswith("PER") else -float(name.split("= ")[1]))

    names = sorted(data[lrs[0]]["designs"], key=order)  # on-policy, uniform, PER, then decreasing tau
    width = 0.8 / len(lrs)
    for j, lr in enumerate(lrs):
        values = [data[lr]["designs"].get(n, np.nan) for n in names]
        axes[0].bar(np.arange(len(names)) + j * width, values, width=width, color=COLORS[j], label=f"lr = {lr:g}")
    axes[0].set_xticks(np.arange(len(names)) + width * (len(lrs) - 1) / 2, names, rotation=30, fontsize=6)
    axes[0].set_ylabel("final accuracy")
    low = min(min(d["designs"].values()) for d in data.values())
    axes[0].set_ylim(low - 0.02, None)
    axes[0].legend(fontsize=6)
    inv_drift = [1.0 / data[lr]["drift"] for lr in lrs]
    best = [data[lr]["best_tau"] for lr in lrs]
    shown = [b if np.isfinite(b) else 2 * max(inv_drift) for b in best]
    axes[1].scatter(inv_drift, shown, color=COLORS[1], zorder=3)
    for x, y, b, lr in zip(inv_drift, shown, best, lrs):
        axes[1].annotate(f"lr {lr:g}" + ("" if np.isfinite(b) else " (tau = inf)"), (x, y), fontsize=6)
    line = np.array([min(inv_drift) / 2, max(inv_drift) * 2])
    axes[1].plot(line, line, color="grey", ls=":", lw=1, label="tau = 1/c (FreshPER heuristic)")
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("1 / measured KL drift per step")
    axes[1].set_ylabel("best tau among the runs")
    axes[1].legend(fontsize=6)
    return fig


# --------------------------------------------------------------------------- validation


def validation_data(results: Path) -> dict:
    path = _require(results, "validation", marker="report.json")
    return json.loads((path / "report.json").read_text())


def validation_curves(results: Path) -> dict:
    """Per design: mean training reward against compute, from the verify runs' saved records.

    Compute after update t is t times the run's mean compute per update (a group-replay run's first
    update, all fresh, costs more than the later ones; the curve spreads that evenly).
    """
    path = _require(results, "validation", marker="report.json")
    curves: dict[str, list] = {}
    for record_file in sorted((path / "verify").glob("*.json")):
        record = json.loads(record_file.read_text())
        per_update = record["compute"] / record["steps"]
        curves.setdefault(record["design"]["name"], []).append(
            (per_update * np.arange(1, record["steps"] + 1), np.asarray(record["train_reward"])))
    return {name: (runs[0][0], np.mean([r for _, r in runs], axis=0)) for name, runs in curves.items()}


def _design_color(index: int, design: dict) -> str:
    """The predicted design in orange; every other design its own colour of the cycle (orange skipped)."""
    if design["name"] == "predicted":
        return COLORS[1]
    others = [c for c in COLORS if c != COLORS[1]]
    return others[index % len(others)]


def plot_validation(results: Path = Path("results"), axes=None):
    """Held-out reward per design at equal compute (prediction highlighted) and training reward vs compute.

    The warm start is the dashed line with its seed spread shaded (reports made before the spread
    was recorded show evaluation seed 0 alone). Group-replay (RLOO) designs are hatched and dashed.
    """
    report = validation_data(results)
    fig, axes = new_axes_row(axes, n=2)
    ax = axes[0]
    designs = report["designs"]
    colors = [_design_color(i, d) for i, d in enumerate(designs)]
    bars = ax.bar(range(len(designs)), [d["final_reward_mean"] for d in designs],
                  yerr=[d["final_reward_std"] for d in designs], color=colors)
    for bar, design in zip(bars, designs):
        if design.get("buffer") == "group-replay":
            bar.set_hatch("//")
    warm = report.get("warm_start_reward") or {"mean": report["warm_start"]["mean_reward"], "std": 0.0}
    ax.axhline(warm["mean"], color="k", ls="--", lw=1, label="warm start (+- sd)")
    if warm["std"] > 0:
        ax.axhspan(warm["mean"] - warm["std"], warm["mean"] + warm["std"], color="k", alpha=0.1, lw=0)
    ax.set_xticks(range(len(designs)), [d["name"] for d in designs], rotation=20, fontsize=6)
    ax.set_ylabel("held-out reward (mean +- sd)")
    ax.set_title("equal compute: predicted orange, RLOO hatched", fontsize=8)
    ax.legend(fontsize=6)
    if (Path(results) / "validation" / "verify").exists():
        curves = validation_curves(results)
        for i, design in enumerate(designs):
            if design["name"] in curves:
                compute, reward = curves[design["name"]]
                window = min(5, reward.size)  # single updates are noisy: a trailing 5-update mean
                reward = np.convolve(reward, np.ones(window) / window, mode="valid")
                compute = compute[window - 1:]
                dashed = design.get("buffer") == "group-replay"
                axes[1].plot(compute, reward, color=colors[i], lw=1, ls="--" if dashed else "-",
                             label=design["name"])
        axes[1].legend(fontsize=5)
    axes[1].set_xlabel("compute (mu x fresh rollouts + samples trained)")
    axes[1].set_ylabel("training reward (seed mean, 5-update average)")
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
}

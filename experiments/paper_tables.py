"""The six result tables of docs/SIMULATION.md, each an experiment = a sweep spec + a table function.

``replay-theory experiment NAME --out DIR`` runs the spec (resumable, never overwrites) and prints
the table, rebuilt from the saved runs. Numbers are whatever the simulator measures; what it does
not reproduce is reported as such.

| name              | paper                                | question                                                 |
|-------------------|--------------------------------------|----------------------------------------------------------|
| sanity            | experience-replay Sec. 3; FreshPER   | replay ratio B/R, staleness (N/R-1)/2; exact vs sampled  |
| experience-replay | experience-replay Sec. 2, 4, Thm 3.5 | accuracy vs compute for N and W/T; prediction vs best    |
| freshper          | FreshPER                             | PER vs uniform, on-policy, age decay; best tau vs drift  |
| m2po              | M2PO                                 | prosperity before collapse at large staleness            |
| rloo              | RLOO group replay                    | rho halves fresh evals; c = 1000 collapses ESS; rho vs c |
| exgrpo            | ExGRPO                               | bucket sampling and shaping                              |
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..advise.profile_files import load_profile, save_profile
from ..checks import require_one_of
from ..simulate.calibrate import calibrate
from ..simulate.config import config_from_dict
from ..simulate.sweep import load_runs
from ..theory.design import DesignQuery, optimal_design
from ..theory.profiles import TabulatedProfile
from .theory_bench import SPEC as THEORY_TEST_SPEC
from .theory_bench import theory_test_table

BANDIT = {"env": "bandit", "seeds": 8, "measure_drift": False, "lr": 0.01, "eval_every": 10}


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    spec: dict
    table: Callable[[Path], str]
    prepare: Callable[[Path], None] | None = None
    """Extra saved artifacts the table needs (written once, never overwritten)."""


def _curves(out_dir: Path, key: str) -> dict:
    with np.load(out_dir / "runs" / f"{key}.npz") as data:
        return {name: data[name] for name in data.files}


def _md(header: list[str], rows: list[list]) -> str:
    def cell(v):
        if isinstance(v, float):
            return "nan" if math.isnan(v) else f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------- 1. sanity

SANITY = {
    "name": "sanity",
    "base": {**BANDIT, "buffer": "fifo", "rollouts_per_step": 64, "steps": 200, "seeds": 4},
    "grid": {"capacity": [64, 128, 256, 512], "batch_size": [32, 128]},
    "configs": [{"buffer": "stale-k", "stale_k": k, "lr": 0.05, "batch_size": 256, "rollouts_per_step": 256,
                 "eval_every": 5, "seeds": 8} for k in (1, 4, 16)],
}


def sanity_table(out_dir: Path) -> str:
    runs = load_runs(out_dir)
    fifo = sorted((r for r in runs if r["config"]["buffer"] == "fifo"),
                  key=lambda r: (r["config"]["capacity"], r["config"]["batch_size"]))
    rows = []
    for r in fifo:
        c, s = r["config"], r["summary"]
        N, R, B = c["capacity"], c["rollouts_per_step"], c["batch_size"]
        rows.append([N, R, B, s["replay_ratio"], B / R, s["mean_staleness"], (N / R - 1) / 2, s["max_staleness"],
                     N // R - 1])
    first = _md(["N", "R", "B", "replay ratio (measured)", "B/R", "mean staleness (measured)", "(N/R-1)/2",
                 "max staleness", "N/R-1"], rows)
    pairs = [("chi2", "exact_chi2", "chi^2 = E r^2 - 1"), ("d2", "exact_d2", "D_2 = log E r^2"),
             ("kl_k1", "exact_kl_behav_new", "KL(behav||new), k1"),
             ("kl_k3", "exact_kl_behav_new", "KL(behav||new), k3"),
             ("m2", "exact_m2", "M2 = E (log r)^2"), ("ess_frac", "exact_ess_frac", "ESS/n vs e^{-D_2}")]
    rows = []
    for r in sorted((r for r in runs if r["config"]["buffer"] == "stale-k"), key=lambda r: r["config"]["stale_k"]):
        curves = _curves(out_dir, r["key"])
        for estimate, exact, label in pairs:
            e = curves[f"curve__{exact}"]
            sel = ~np.isnan(e)
            est = curves[f"curve__{estimate}"][sel]
            rows.append([r["config"]["stale_k"], label, float(e[sel].mean()), float(est.mean()),
                         float(est.mean() / e[sel].mean() - 1)])
        e = curves["curve__exact_kl_new_behav"]
        sel = ~np.isnan(e)
        ess_bound = float(np.exp(-e[sel]).mean())
        rows.append([r["config"]["stale_k"], "FreshPER bound e^{-KL(new||behav)} >= ESS/n",
                     ess_bound, float(curves["curve__exact_ess_frac"][sel].mean()), float("nan")])
    second = _md(["staleness k", "quantity", "exact (policy pair)", "sample estimate (batch of 256)",
                  "relative gap"], rows)
    return first + "\n\n" + second


# --------------------------------------------------------------------------- 2. experience replay

_ER_BASE = {**BANDIT, "pipeline": "async", "batch_size": 64, "capacity": 256}
_ER_STEPS = 300  # the on-policy budget; buffered runs get the same COMPUTE, i.e. 300 / gamma updates


def _equal_compute(mu: float, w: float, t: float) -> int:
    return round(_ER_STEPS * (1 + mu) / (1 + w / t))  # steps x C (1 + W/T) = 300 x C (1 + mu), Eq. (1)-(2)


EXPERIENCE_REPLAY = {
    "name": "experience-replay",
    "base": _ER_BASE,
    "configs": (
        [{"mu": 5.28, "buffer": "on-policy", "steps": _ER_STEPS},
         {"mu": 0.5, "buffer": "on-policy", "steps": _ER_STEPS}]
        + [{"mu": 5.28, "buffer": "fifo", "capacity": n, "workers": w, "trainers": t,
            "steps": _equal_compute(5.28, w, t)}
           for n in (128, 512, 2048) for (w, t) in ((6, 2), (5, 3), (4, 4))]
        + [{"mu": 0.5, "buffer": "fifo", "capacity": n, "workers": w, "trainers": t, "steps": _equal_compute(0.5, w, t)}
           for n in (128, 512) for (w, t) in ((2, 6), (1, 7))]
    ),
}


def compute_to_reach(curves: dict, target: float) -> float:
    """Compute (seed-mean) at the first evaluation whose seed-mean accuracy reaches ``target``."""
    accuracy = curves["eval__accuracy"].mean(axis=0)  # (E,)
    steps = curves["eval_steps"] - 1  # step index of each evaluation
    compute = curves["curve__compute"].mean(axis=0)[steps]  # (E,)
    hit = np.nonzero(accuracy >= target)[0]
    return float(compute[hit[0]]) if hit.size else float("inf")


PROBE = {**BANDIT, "buffer": "fifo", "capacity": 256, "rollouts_per_step": 64, "batch_size": 64, "steps": 200}


def experience_replay_prepare(out_dir: Path) -> None:
    """Measure the noise profile on a synchronous FIFO probe: out_dir/profile.json."""
    path = Path(out_dir) / "profile.json"
    if not path.exists():
        result = calibrate(config_from_dict(PROBE), checkpoints=3, samples=256)
        save_profile(path, result.profile_dict(source=f"calibrate {PROBE}"))


def experience_replay_table(out_dir: Path) -> str:
    runs = load_runs(out_dir)
    rows = []
    for mu in (5.28, 0.5):
        group = [r for r in runs if r["config"]["mu"] == mu]
        base = next(r for r in group if r["config"]["buffer"] == "on-policy")
        base_curves = _curves(out_dir, base["key"])
        target = float(base_curves["eval__accuracy"].mean(axis=0)[-1])
        base_compute = compute_to_reach(base_curves, target)
        for r in sorted(group, key=lambda r: (r["config"]["buffer"] != "on-policy", r["config"]["capacity"],
                                              -r["config"]["workers"])):
            c = r["config"]
            curves = _curves(out_dir, r["key"])
            reach = compute_to_reach(curves, target)
            design = ("on-policy queue" if c["buffer"] == "on-policy"
                      else f"N={c['capacity']}, (W,T)=({c['workers']:g},{c['trainers']:g})")
            rows.append([mu, design, r["summary"]["compute_ratio"], r["summary"]["final_accuracy"],
                         reach, reach / base_compute, r["summary"]["mean_staleness"], r["summary"]["replay_ratio"]])
    table = _md(["mu", "design", "gamma (Eq. 2)", "accuracy at equal compute", "compute to on-policy final accuracy",
                 "vs on-policy", "mean staleness", "replay ratio"], rows)
    return table + "\n\n" + _prediction_vs_best(out_dir, runs)


def _prediction_vs_best(out_dir: Path, runs: list[dict]) -> str:
    """Thm 3.5 from the measured profile vs the sweep's best design at mu = 5.28."""
    path = Path(out_dir) / "profile.json"
    if not path.exists():
        return "(no profile.json: run `replay-theory experiment experience-replay` to measure it)"
    loaded = load_profile(path)
    try:
        rho_used, rho_note = loaded.rho_for_design()
    except ValueError as err:
        return f"(profile.json: {err}: no prediction)"
    lines = [f"Note: {rho_note}."] if rho_note else []
    for profile_name, profile, rho in [("measured table", loaded.profile, rho_used)]:
        design = optimal_design(DesignQuery(mu=5.28, profile=profile, profile_rho=rho,
                                            profile_description=loaded.description))
        lines.append(f"Prediction ({profile_name}, rho = {design.rho:.3g}): regime {design.regime}, "
                     f"x* = {design.x_star:.3g}, y* = {design.y_star:.3g}, "
                     f"W/T = {design.workers_per_trainer or float('nan'):.3g}.")
    group = [r for r in runs if r["config"]["mu"] == 5.28 and r["config"]["buffer"] == "fifo"]
    base = next(r for r in runs if r["config"]["mu"] == 5.28 and r["config"]["buffer"] == "on-policy")
    target = float(_curves(out_dir, base["key"])["eval__accuracy"].mean(axis=0)[-1])
    best = min(group, key=lambda r: compute_to_reach(_curves(out_dir, r["key"]), target))
    c = best["config"]
    rollouts_per_update = c["batch_size"] * c["workers"] / (c["trainers"] * c["mu"])  # R in the async model
    x_best, y_best = c["capacity"] / rollouts_per_update, c["mu"] * c["trainers"] / c["workers"]
    lines.append(f"Empirical best at mu = 5.28: N = {c['capacity']}, (W,T) = ({c['workers']:g},{c['trainers']:g}), "
                 f"i.e. x = N/R = {x_best:.3g}, y = B/R = {y_best:.3g}, W/T = {c['workers'] / c['trainers']:.3g}.")
    if isinstance(loaded.profile, TabulatedProfile):  # a measured table: its sigma^2(s)
        sigma = np.asarray(loaded.profile.sigma_sq_values)
        lines.append("Measured sigma^2(s) at s = " + ", ".join(
            f"{s:g}: {v:.3g}" for s, v in zip(loaded.profile.staleness, sigma)) + ".")
    return "\n".join(lines)


# --------------------------------------------------------------------------- 3. FreshPER

FRESHPER = {
    "name": "freshper",
    "base": {**BANDIT, "steps": 300, "rollouts_per_step": 32, "capacity": 1024, "batch_size": 128,
             "measure_drift": True, "eval_every": 10},
    "configs": (
        [{"buffer": "on-policy", "batch_size": 32, "lr": lr} for lr in (0.02, 0.2)]
        + [{"buffer": "fifo", "lr": lr} for lr in (0.02, 0.2)]
        # FreshPER Algorithm 1 (p_base = |r| + eps, K = 2 replay updates per on-policy update, beta 0.4 -> 1)
        + [{"buffer": "prioritized", "per_tau": tau, "lr": lr}
           for lr in (0.02, 0.2) for tau in (math.inf, 3.0, 10.0, 30.0, 100.0)]
        # the same schedule with uniform sampling (alpha = 0, beta = 0): what the priorities add
        + [{"buffer": "prioritized", "per_alpha": 0.0, "per_beta": 0.0, "per_beta_final": 0.0, "lr": lr}
           for lr in (0.02, 0.2)]
        # the earlier every-step variant (|A| + eps, beta fixed at 0.4), kept as a labelled option
        + [{"buffer": "prioritized", "per_schedule": "every-step", "per_base": "advantage", "per_beta_final": 0.4,
            "per_tau": tau, "lr": lr} for lr in (0.02, 0.2) for tau in (math.inf, 10.0)]
    ),
}


def freshper_table(out_dir: Path) -> str:
    runs = [r for r in load_runs(out_dir) if "per_tau" in r["config"]]
    order = {"on-policy": 0, "fifo": 1, "prioritized": 2}
    blocks = []
    for lr in sorted({r["config"]["lr"] for r in runs}):
        group = [r for r in runs if r["config"]["lr"] == lr and r["config"]["buffer"] in order]
        on_policy = next(r for r in group if r["config"]["buffer"] == "on-policy")
        curves = _curves(out_dir, on_policy["key"])
        kl = curves["drift_kl"].mean(axis=0)  # (lags,) exact KL(pi_t || pi_t-lag), averaged over evaluations
        lags = curves["drift_lags"]
        drift = float(kl[0] / lags[0])
        growth = float(np.polyfit(np.log(lags), np.log(np.maximum(kl, 1e-300)), 1)[0])
        rows = []
        def sort_key(r):
            c = r["config"]
            return (order[c["buffer"]], c.get("per_schedule", "") != "algorithm1", c.get("per_alpha", 0.6) > 0,
                    -c["per_tau"])

        for r in sorted(group, key=sort_key):
            c, s = r["config"], r["summary"]
            name = {"on-policy": "on-policy (B = R = 32)", "fifo": "uniform FIFO (every update)"}.get(c["buffer"])
            if name is None:
                schedule = "Alg. 1" if c["per_schedule"] == "algorithm1" else "every update, |A| + eps, beta 0.4"
                if c["per_alpha"] == 0:
                    name = f"uniform replay ({schedule}, alpha = 0)"
                else:
                    kind = ("standard PER (tau = inf)" if math.isinf(c["per_tau"])
                            else f"FreshPER tau = {c['per_tau']:g}")
                    name = f"{kind} ({schedule})"
            rows.append([name, s["final_accuracy"], s["peak_accuracy"], s["peak_accuracy"] - s["final_accuracy"],
                         s["mean_staleness"], int(r["counts"]["K_inference"])])
        per = [r for r in group if r["config"]["buffer"] == "prioritized" and r["config"]["per_alpha"] > 0
               and r["config"]["per_schedule"] == "algorithm1"]
        best = max(per, key=lambda r: r["summary"]["final_accuracy"])["config"]["per_tau"]
        blocks.append(f"lr = {lr:g}: measured drift KL(pi_t || pi_t-1) = {drift:.3g} per step, so the FreshPER "
                      f"heuristic tau = 1/c = {1 / drift:.3g} steps; KL grows with the lag as lag^{growth:.2f} "
                      f"(1 = random-walk drift, 2 = steady drift). Best tau among the prioritized runs: {best:g}.\n\n"
                      + _md(["design", "final accuracy", "peak accuracy", "peak - final", "mean staleness",
                             "responses generated"], rows))
    return "\n\n".join(blocks)


# --------------------------------------------------------------------------- 4. M2PO

M2PO = {
    "name": "m2po",
    "base": {"env": "token-mdp", "seeds": 8, "steps": 300, "eval_every": 10, "measure_drift": False,
             "rollouts_per_step": 64, "batch_size": 64, "lr": 0.3, "buffer": "stale-k", "stale_k": 32},
    "configs": [{"stale_k": 0, "loss": "grpo"}, {"loss": "no-trust-region"}, {"loss": "grpo"}, {"loss": "m2po"},
                {"loss": "m2po-reference"}],
}


def m2po_table(out_dir: Path) -> str:
    rows = []
    order = {"grpo": 1, "no-trust-region": 0, "m2po": 2, "m2po-reference": 3}
    for r in sorted(load_runs(out_dir), key=lambda r: (r["config"]["stale_k"] > 0, order[r["config"]["loss"]])):
        c = r["config"]
        curves = _curves(out_dir, r["key"])
        reward = curves["eval__reward"].mean(axis=0)  # (E,)
        quarter = reward[len(reward) // 4]
        clip = curves.get("curve__pg_clipfrac")
        masked = curves.get("curve__masked_frac")
        rows.append([f"{c['loss']} (stale-{c['stale_k']})", float(reward[0]), float(quarter), float(reward.max()),
                     float(reward[-1]), float(reward.max() - reward[-1]),
                     float(np.nanmean(clip)) if clip is not None else float("nan"),
                     float(np.nanmean(masked)) if masked is not None else float("nan")])
    return _md(["loss (staleness)", "reward at start", "reward at 25% of steps", "peak reward", "final reward",
                "peak - final", "clip fraction", "masked fraction"], rows)


# --------------------------------------------------------------------------- 5. RLOO group replay

_RLOO_BASE = {"env": "token-mdp", "seeds": 6, "steps": 100, "eval_every": 10, "measure_drift": False,
              "buffer": "group-replay", "loss": "rloo", "advantage": "leave-one-out", "group_size": 8,
              "rollouts_per_step": 8, "batch_size": 128, "lr": 0.05}  # B = 16 groups of 8 responses
RLOO = {
    "name": "rloo",
    "base": _RLOO_BASE,
    "configs": (
        [{"replay_ratio_groups": 0.0, "max_age": 2, "clip_c": 1.0}]
        + [{"replay_ratio_groups": rho, "max_age": 2, "clip_c": c}
           for rho in (0.5, 1.0, 1.5, 2.0) for c in (1.0, 3.0, 10.0)]
        + [{"replay_ratio_groups": 1.0, "max_age": L, "clip_c": c} for L in (1, 3) for c in (1.0, 3.0, 10.0)]
        + [{"replay_ratio_groups": 1.0, "max_age": 1, "clip_c": 1000.0}]
        # stress probe: a fast-moving policy (lr 0.5) makes replayed sequence ratios large
        + [{"replay_ratio_groups": 1.0, "max_age": L, "clip_c": c, "lr": 0.5}
           for L in (1, 2) for c in (1.0, 3.0, 1000.0)]
        + [{"replay_ratio_groups": 0.0, "max_age": 1, "clip_c": 1.0, "lr": 0.5}]
    ),
}


def rloo_table(out_dir: Path) -> str:
    rows = []
    for r in sorted(load_runs(out_dir), key=lambda r: (r["config"]["lr"], r["config"]["max_age"] != 2,
                                                      r["config"]["replay_ratio_groups"], r["config"]["max_age"],
                                                      r["config"]["clip_c"])):
        c, s = r["config"], r["summary"]
        curves = _curves(out_dir, r["key"])
        ess = curves.get("curve__ess_frac")
        rows.append([c["lr"], c["replay_ratio_groups"], c["max_age"], c["clip_c"], s["final_reward"],
                     s["final_accuracy"],
                     int(r["counts"]["K_inference"]), float(np.nanmean(ess)) if ess is not None else float("nan"),
                     float(np.nanmin(np.nanmean(ess, axis=0))) if ess is not None else float("nan"),
                     s.get("clip_frac", float("nan"))])
    return _md(["lr", "rho", "L", "c", "final reward", "final accuracy", "fresh verifier evaluations",
                "mean ESS/n (replayed)", "worst-step ESS/n", "clip fraction"], rows)


# --------------------------------------------------------------------------- 6. ExGRPO

_EX = {**BANDIT, "seeds": 16, "steps": 300, "group_size": 8, "lr": 0.05, "batch_size": 64, "rollouts_per_step": 64,
       "eval_every": 10}  # B = 8 questions x 8 responses
EXGRPO = {
    "name": "exgrpo",
    "base": {**_EX, "buffer": "exgrpo", "loss": "exgrpo"},
    "configs": [
        {"buffer": "on-policy", "loss": "grpo"},
        {"exgrpo_rho": 0.0},
        {},
        {"exgrpo_shaping": False},
        {"exgrpo_question_selection": "uniform"},
        {"exgrpo_shaping": False, "exgrpo_question_selection": "uniform"},
        {"exgrpo_skip_retired": False},
        {"exgrpo_skip_retired": False, "exgrpo_shaping": False},
    ],
}


def exgrpo_table(out_dir: Path) -> str:
    rows = []
    for r in load_runs(out_dir):
        c, s, k = r["config"], r["summary"], r["counts"]
        if c["buffer"] == "on-policy":
            name = "on-policy GRPO (8 questions x 8)"
        else:
            parts = [f"rho = {c['exgrpo_rho']:g}", "shaping" if c["exgrpo_shaping"] else "no shaping",
                     f"{c['exgrpo_question_selection']} questions",
                     "retired leave fresh sampling" if c["exgrpo_skip_retired"] else "retired stay in fresh sampling"]
            name = "ExGRPO: " + ", ".join(parts)
        per_seed = np.asarray(r["per_seed"]["final_accuracy"])
        rows.append([name, s["final_accuracy"], float(per_seed.std(ddof=1) / np.sqrt(per_seed.size)),
                     k.get("gain_hard", float("nan")), k.get("gain_medium", float("nan")),
                     k.get("gain_easy", float("nan")),
                     k.get("retired", float("nan"))])
    rows.sort(key=lambda row: (not row[0].startswith("on-policy"), row[0]))
    return _md(["design", "final accuracy", "s.e. over seeds", "gain hard", "gain medium", "gain easy",
                "retired questions"], rows)


EXPERIMENTS: dict[str, Experiment] = {
    "sanity": Experiment("sanity", "FIFO replay ratio and staleness formulas; exact vs sampled divergences",
                         SANITY, sanity_table),
    "experience-replay": Experiment("experience-replay",
                                    "accuracy vs compute for buffer sizes and W/T, mu = 5.28 and 0.5",
                                    EXPERIENCE_REPLAY, experience_replay_table, experience_replay_prepare),
    "freshper": Experiment("freshper", "standard PER vs uniform vs on-policy vs age decay", FRESHPER, freshper_table),
    "m2po": Experiment("m2po", "no trust region vs clipped GRPO vs M2PO at staleness 32 (token MDP)", M2PO, m2po_table),
    "rloo": Experiment("rloo", "RLOO whole-group replay: rho, L, c (token MDP)", RLOO, rloo_table),
    "exgrpo": Experiment("exgrpo", "ExGRPO buckets, shaping and retirement ablations", EXGRPO, exgrpo_table),
    "theory-test": Experiment("theory-test", "does the theory predict? regret of predicted designs (own runner)",
                              THEORY_TEST_SPEC, theory_test_table),
}


def get_experiment(name: str) -> Experiment:
    require_one_of("experiment", name, EXPERIMENTS)
    return EXPERIMENTS[name]


def write_table(out_dir: Path, table: str) -> Path:
    """OUT/table.md, written once: an identical existing table is kept as is, a different one is refused.

    Tables are rebuilt from the saved runs, so a different table means other code made the old one;
    it is never overwritten (the same rule as every other result).
    """
    path = Path(out_dir) / "table.md"
    text = table + "\n"
    if path.exists():
        if path.read_text() == text:
            return path
        raise ValueError(f"{path} exists and holds a different table (made by other code?); tables are never "
                         f"overwritten: move it away to write this one")
    with path.open("x") as handle:  # "x": a table another process wrote meanwhile is not clobbered either
        handle.write(text)
    return path

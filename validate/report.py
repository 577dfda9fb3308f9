"""verify's report: each design's row, the rules' predictions, and report.md / report.json.

Paper: experience-replay (docs/REFERENCES.md), Thm 3.5: the predicted design (x*, y*) against the designs
trained at equal compute. Pure functions over the run records ``validate/loop.py`` writes (one a design x
learning rate x seed, its held-out reward under ``held_out``):

| code name            | meaning                                                                                  |
|----------------------|------------------------------------------------------------------------------------------|
| ``best_lr_row``      | a design's row at its best learning rate: mean held-out reward, its sd and se over seeds, |
|                      | the gain over the warm start with its se, x = N/R and y = B/R                            |
| ``prediction_rows``  | each rule's prediction (noise-scale, forgetting-aware, the paper's Thm 3.5) in the fixed-b |
|                      | family, its verdict (``validate/verdict.py``) and issue 23's criterion                   |
| ``report_markdown``  | report.md: the table of rows, the verdict and the rules' predictions                     |
| ``write_report``     | report.md, report.png (drawn by the ``figure`` the CLI hands in) and report.json, last    |

N, B, R are DesignConfig's ``capacity``, ``batch_size``, ``rollouts_per_step``; rho, L, c group replay's
``replay_ratio_groups``, ``max_age``, ``clip_c``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from ..outputs import write_new
from ..theory.noise_scale import noise_scale_pick
from .config import report_stem
from .families import NamedDesign


def best_lr_row(design: NamedDesign, lrs: tuple[float, ...], records: dict, seeds: int, warm_mean: float,
                 warm_sd: float) -> dict:
    """The design's row at its best learning rate (highest mean held-out reward), with every rate's result.

    ``lr_edge``: the best rate is the grid's smallest or largest, so the optimum may lie outside it. Choosing on the
    held-out reward that is then reported favours every design alike (each gets its best of len(lrs) tries).
    """
    rows = [_design_row(design, records[(design.name, lr)], seeds, warm_mean, warm_sd) for lr in lrs]
    best = max(range(len(lrs)), key=lambda i: rows[i]["final_reward_mean"])
    sweep = [{"lr": lr, "final_reward_mean": r["final_reward_mean"], "final_reward_se": r["final_reward_se"]}
             for lr, r in zip(lrs, rows)]
    edge = None if len(lrs) == 1 else best in (0, len(lrs) - 1)
    return {**rows[best], "lr": lrs[best], "lr_edge": edge, "lr_sweep": sweep}


def _design_row(design: NamedDesign, records: list[dict], seeds: int, warm_mean: float, warm_sd: float) -> dict:
    finals = [r["held_out"]["mean_reward"] for r in records]
    mean, sd = mean_sd(finals)
    c, fresh_per_step = design.config, design.fresh_per_step  # group replay: K B_fresh after the all-fresh first step
    return {**design.report_fields(), "x": None if design.group_replay else c.capacity / fresh_per_step,
            "y": None if design.group_replay else c.batch_size / fresh_per_step, "K": c.group_size,
            "steps": records[0]["steps"], "seeds": seeds,
            "final_reward_mean": mean, "final_reward_std": sd, "final_reward_se": sd / math.sqrt(seeds),
            "final_rewards": finals,
            "final_pass_at_1_mean": mean_sd([r["held_out"]["pass@1"] for r in records])[0],
            "gain": mean - warm_mean, "gain_se": math.sqrt(sd ** 2 / seeds + warm_sd ** 2 / seeds),
            "fresh_rollouts": float(np.mean([r.get("fresh_rollouts", r["steps"] * fresh_per_step) for r in records])),
            "compute": float(np.mean([r["compute"] for r in records]))}


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof 1; 0 for one value)."""
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def prediction_rows(rows: list[dict], centres: dict[str, str], pick: dict | None, noise_record: dict,
                    predicted: dict, verdict_of, group_size: int, forgetting: dict | None = None,
                    memory: dict | None = None, optimal: dict | None = None) -> list[dict]:
    """Each rule's prediction in the fixed-b family (noise-scale, forgetting-aware when ``memory`` is given (its kappa
    record, ``forgetting_memory``), paper, and in the reuse family ``optimal``'s printed answer, whose record is
    ``optimal``): design, input, and ``verdict_of(name)`` (validate/verdict.py).

    ``separation``: the pair (prediction - strongest rival) of that verdict, the rival being the family design
    other than the prediction with the highest mean reward (the best when the prediction is not), with the seeds
    a 2-se separation of the two needs.
    """
    means = {r["name"]: r["final_reward_mean"] for r in rows if r["family"]}
    out = []
    rules = [("noise-scale", centres.get("noise-scale")), ("forgetting", centres.get("forgetting")),
             ("paper", centres["paper"])]
    rules = rules if memory is not None else rules[::2]  # no memory given: the two rules of issue 23
    if "optimal" in centres:  # the reuse family: optimal's printed answer (the guarded rule)
        rules.append(("optimal", centres["optimal"]))
    for rule, name in rules:
        entry = {"rule": rule, "design": name,
                 **({"input": {k: v for k, v in optimal.items() if k != "design"}} if rule == "optimal" and optimal
                    else _rule_input(rule, pick, noise_record, predicted, group_size, forgetting, memory))}
        if name is None:
            entry["verdict"], entry["separation"] = None, None
            out.append(entry)
            continue
        verdict = verdict_of(name)
        entry["verdict"] = verdict
        rivals = [n for n in means if n != name]
        rival = max(rivals, key=means.__getitem__) if rivals else None
        entry["separation"] = (None if verdict is None or rival is None else
                               next(p for p in verdict["pairs"] if p["design"] == rival))
        entry["criterion"] = _criterion(verdict, entry["separation"])
        out.append(entry)
    return out


def _rule_input(rule: str, pick: dict | None, noise_record: dict, predicted: dict, group_size: int,
                forgetting: dict | None, memory: dict | None) -> dict:
    """A rule's ``input`` (what it read) and ``pick`` in ``prediction_rows``; the noise-scale rule also at both ends
    of B_noise's interval."""
    if rule == "forgetting":
        assert memory is not None  # prediction_rows asks the forgetting rule only when memory is given
        return {"input": {"b_noise": noise_record.get("b_noise"), **memory}, "pick": forgetting}
    if rule == "paper":
        return {"input": {k: predicted[k] for k in ("x_star", "y_star", "regime", "capacity", "batch_size",
                                                    "rollouts_per_step")}}
    entry = {"input": {k: noise_record.get(k) for k in ("b_noise", "b_noise_interval", "level", "method", "batch",
                                                        "unit_size", "source")},
             "pick": pick}
    if pick:  # the rule at both ends of B_noise's interval (None: no signal, b = inf, on-policy)
        entry["pick_at_interval"] = [None if v is None else
                                     noise_scale_pick(v, pick["batch_size"], group_size, pick["mu"])
                                     for v in noise_record["b_noise_interval"]]
    return entry


def _criterion(verdict: dict | None, separation: dict | None) -> dict | None:
    """Issue 23's test of a prediction: it ranks first (the highest mean reward) or lies within one paired se of the
    best. ``separation`` is (prediction - strongest rival), the rival being the best when the prediction is not."""
    if verdict is None or separation is None:
        return None
    first = verdict["family"]["rank"] == 1
    difference, se = separation["difference"], separation["se"]
    return {"first": first, "within_one_se": first or -difference <= se, "rival": separation["design"],
            "difference": difference, "se": se, "in_se": difference / se if se > 0 else None}


def write_report(report: dict, out_dir: Path, stem: str, figure=None) -> None:
    """``stem``.md, ``stem``.png when ``figure`` draws it, and ``stem``.json last: it marks a complete report. A .md or
    .png without it is what an interrupted write left behind, so only those two are replaced."""
    markdown = out_dir / f"{stem}.md"
    markdown.with_name(f".{stem}.md.tmp").write_text(report_markdown(report, figure is not None))
    os.replace(markdown.with_name(f".{stem}.md.tmp"), markdown)
    if figure is not None:
        figure(report, out_dir / f".{stem}.tmp.png")  # the validation figure's left panel
        os.replace(out_dir / f".{stem}.tmp.png", out_dir / f"{stem}.png")
    write_new(out_dir / f"{stem}.json", lambda tmp: tmp.write_text(json.dumps(report, indent=1,
                                                                              default=lambda v: None)))


def report_markdown(report: dict, figure: bool = True) -> str:
    warm = report["warm_start_reward"]
    lines = ["# Validation report", "",
             f"Compute priced at mu = {report['mu']:g} (--price-mu); this machine's timing mu (generation / update "
             f"time per completion): {report['mu_measured']:.3g}", "",
             f"mu from App. E counts (K_training / T) / (K_inference / W) in a "
             f"{report['count_window'].get('seconds', float('nan')):g} s window: {_fmt(report.get('mu_count'))} "
             f"(K_inference = {report['count_window'].get('k_inference', '-')}, "
             f"K_training = {report['count_window'].get('k_training', '-')}, W = T = 1)", "",
             f"Predicted (Thm 3.5 on the measured profile): regime {report['predicted']['regime']}, "
             f"x* = {_fmt(report['predicted']['x_star'])}, y* = {_fmt(report['predicted']['y_star'])}, "
             f"N = {report['predicted']['capacity']}, B = {report['predicted']['batch_size']}, "
             f"R = {report['predicted']['rollouts_per_step']}", "",
             f"Warm start: held-out mean reward {warm['mean']:.3f} +- {warm['std']:.3f} over {warm['seeds']} "
             f"evaluation seeds (seed 0: pass@1 {report['warm_start']['pass@1']:.3f})", "",
             f"Budget: the compute of {report['budget']['updates']} on-policy updates = "
             f"{report['budget']['compute']:.4g} (compute = mu x fresh rollouts + samples trained); "
             f"{report['budget']['seeds']} seeds per design.", "",
             "| design | loss | N | B | R | x = N/R | y = B/R | rho | L | c | lr | updates | fresh rollouts | compute "
             "| held-out reward (mean +- sd) | pass@1 | gain over warm start (+- se) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["designs"]:
        lines.append(f"| {r['name']} | {r['loss']} | {_fmt(r['capacity'], 'd')} | {r['batch_size']} | "
                     f"{r['rollouts_per_step']} | {_fmt(r['x'])} | {_fmt(r['y'])} | "
                     f"{_fmt(r.get('replay_ratio_groups'), 'g')} | {_fmt(r.get('max_age'), 'd')} | "
                     f"{_fmt(r.get('clip_c'), 'g')} | {_lr_cell(r, report['config'].get('lr'))} | "
                     f"{r['steps']} | {r['fresh_rollouts']:.0f} | {r['compute']:.4g} | "
                     f"{r['final_reward_mean']:.3f} +- {r['final_reward_std']:.3f} | {r['final_pass_at_1_mean']:.3f} | "
                     f"{r['gain']:+.3f} +- {r['gain_se']:.3f} |")
    lrs = report["budget"].get("lr_grid", [])
    if len(lrs) > 1:
        lines += ["", f"Step size tuned per design: each row above is the design at its best of lr in "
                  f"{{{', '.join(f'{lr:.3g}' for lr in lrs)}}} (highest mean held-out reward; 'edge': the best is the "
                  "grid's end, so the optimum may lie beyond it).", "",
                  "| design | " + " | ".join(f"lr {lr:.3g}" for lr in lrs) + " |",
                  "|---|" + "---|" * len(lrs)]
        for r in report["designs"]:
            lines.append(f"| {r['name']} | " + " | ".join(f"{c['final_reward_mean']:.3f} +- {c['final_reward_se']:.3f}"
                                                          for c in r["lr_sweep"]) + " |")
    best, gap = report["measured_best"], report["gap"]
    knobs = (f"rho = {best['replay_ratio_groups']:g}, L = {best['max_age']}, c = {best['clip_c']:g}"
             if best["buffer"] == "group-replay"
             else f"x = {best['x']:.3g}, y = {best['y']:.3g}")
    lines += ["", f"Measured best at equal compute: {best['name']} ({knobs}), "
              f"{best['gain']:+.3f} +- {best['gain_se']:.3f} over the warm start "
              f"(se = sqrt(sd_design^2 / n + sd_warm^2 / n), n = {report['budget']['seeds']})."]
    if gap["reward_gap"] is not None:
        lines += ["", f"Predicted design ({gap['design_predicted']}): {gap['reward_predicted']:.3f}; "
                  f"measured best: {gap['reward_best']:.3f}; gap {gap['reward_gap']:.3f}."]
    lines += verdict_markdown(report.get("verdict"), gap["design_predicted"])
    lines += predictions_markdown(report)
    if figure:
        lines += ["", f"![reward vs design]({report_stem(report['budget'].get('family', 'neighbours'))}.png)"]
    lines.append("")
    return "\n".join(lines)


def verdict_markdown(verdict: dict | None, centre: str) -> list[str]:
    """The verdict's lines: rank and regret with intervals, then the paired comparisons and their power."""
    if verdict is None:
        return ["", "No verdict: it needs >= 2 seeds per design."]
    pct = f"{100 * verdict['level']:g}%"
    lines = ["", f"## Verdict ({centre}, {verdict['seeds']} paired seeds, {pct} seed-bootstrap intervals)", ""]
    for scope, label in (("family", "FIFO designs (what Thm 3.5 ranks)"), ("all", "all designs")):
        v = verdict[scope]
        lines.append(f"- among {v['designs']} {label}: rank {v['rank']} [{v['rank_ci'][0]:.0f}, {v['rank_ci'][1]:.0f}]"
                     f", P(best) {v['probability_predicted_best']:.2f}; best {v['best']}; regret (reward gap at "
                     f"equal compute) {v['regret']:.4f} [{v['regret_ci'][0]:.4f}, {v['regret_ci'][1]:.4f}]")
    lines += ["", f"| {centre} - design | difference | se (paired) | beyond 2 se | seeds for 2 se |",
              "|---|---|---|---|---|"]
    for pair in verdict["pairs"]:
        needed = "-" if pair["seeds_needed"] is None else str(pair["seeds_needed"])
        lines.append(f"| {pair['design']} | {pair['difference']:+.4f} | {pair['se']:.4f} | "
                     f"{'yes' if pair['separated'] else 'no'} | {needed} |")
    return lines


def predictions_markdown(report: dict) -> list[str]:
    """fixed-b: the table of both rules' predictions (rank, P(best), regret, seeds for 2 se), then each one's pairs."""
    predictions = report.get("predictions")
    if not predictions:
        return []
    family = report.get("budget", {}).get("family", "fixed-b")
    lines = ["", f"## The rules' predictions in the {family} family (equal compute)", ""]
    lines.append(_noise_scale_rule_line(next(p for p in predictions if p["rule"] == "noise-scale")))
    lines += _forgetting_rule_lines(next((p for p in predictions if p["rule"] == "forgetting"), None),
                                    report.get("forgetting_input"))
    paper = next(p for p in predictions if p["rule"] == "paper")["input"]
    lines += ["", f"Paper (Thm 3.5): regime {paper['regime']}, x* = {_fmt(paper['x_star'])}, "
              f"y* = {_fmt(paper['y_star'])}, N = {_fmt(paper['capacity'], 'd')}, "
              f"B = {_fmt(paper['batch_size'], 'd')}, R = {paper['rollouts_per_step']}.", ""]
    printed = next((p for p in predictions if p["rule"] == "optimal"), None)
    if printed is not None:  # the reuse family
        lines += [f"optimal (the guarded rule, what `replay-theory optimal` prints for these inputs, epochs up to 4): "
                  f"{printed['input']['what_to_do']}.", ""]
    lines += _predictions_table(predictions)
    lines.append("")
    lines += [_criterion_line(p) for p in predictions if p.get("criterion") is not None]
    for p in predictions:
        if p["rule"] == "noise-scale" and p["verdict"] is not None:
            lines += verdict_markdown(p["verdict"], p["design"])
    return lines


def _noise_scale_rule_line(rule: dict) -> str:
    """The noise-scale rule's line: B_noise with its interval, b, the threshold and the pick (at both ends too)."""
    record, pick = rule["input"], rule["pick"]
    if pick is None:
        return "The noise-scale rule made no prediction: the calibration has no measured B_noise."
    lo, hi = record["b_noise_interval"]
    at_ends = ", ".join("on-policy (b = inf)" if p is None else
                        f"{p['regime']} R = {p['rollouts_per_step']}" for p in rule["pick_at_interval"])
    y_star = f"y* = {pick['y_star']:.3g}; " if pick["regime"] == "replay" else ""
    return (f"Noise-scale rule: B_noise = {record['b_noise']:.4g} ({record['method']}, "
            f"{100 * record['level']:g}% interval [{_fmt(lo, '.4g')}, {_fmt(hi, '.4g')}]; calibration "
            f"batch {record['batch']}, unit {record['unit_size']}), b = B_noise / B = {pick['b']:.4g} at "
            f"B = {pick['batch_size']}, mu = {pick['mu']:g}: replay pays iff b < {pick['threshold_b']:.4g}; "
            f"{y_star}pick {pick['regime']} R = N = {pick['rollouts_per_step']} (y = {pick['y']:.3g}), "
            f"predicted cost {pick['cost']:.4g} vs on-policy {pick['on_policy_cost']:.4g} (S_min B units); "
            f"at the interval's ends: {at_ends}.")


def _forgetting_rule_lines(forgetting: dict | None, forgetting_input: dict | None) -> list[str]:
    """The forgetting-aware rule's line: kappa and its pick, or why it made none; nothing when it was not asked."""
    if forgetting is None:
        if not forgetting_input:
            return []
        return ["", f"Forgetting-aware rule: no prediction ({forgetting_input.get('reason')})."]
    memory, fpick = forgetting["input"], forgetting["pick"]
    if fpick is None:
        return ["", f"Forgetting-aware rule: no prediction ({memory.get('reason')})."]
    return ["", f"Forgetting-aware rule: kappa = {fpick['kappa']:.4g} ({memory['source']}; optimizer "
            f"{fpick['optimizer']}, beta1 {fpick['beta1']:g}), b = {fpick['b']:.4g} at B = {fpick['batch_size']}, "
            f"mu = {fpick['mu']:g}: pick {fpick['regime']} R = {fpick['rollouts_per_step']}, "
            f"N = {fpick['capacity']} (x = {fpick['x']:.3g}, y = {fpick['y']:.3g}, psi = {fpick['psi']:.3g}), "
            f"predicted cost {fpick['cost']:.4g} vs on-policy {fpick['on_policy_cost']:.4g}."]


def _predictions_table(predictions: list[dict]) -> list[str]:
    """One row a rule: its design's rank [CI], P(best), regret [CI] and the strongest rival's paired difference."""
    lines = ["| rule | design | rank [CI] | P(best) | regret [CI] | strongest rival | difference +- se | "
             "seeds for 2 se |", "|---|---|---|---|---|---|---|---|"]
    for p in predictions:
        v = p["verdict"]
        if v is None:
            lines.append(f"| {p['rule']} | {p['design'] or '-'} | - | - | - | - | - | - |")
            continue
        f, sep = v["family"], p["separation"]
        rival = "- | - | -" if sep is None else (f"{sep['design']} | {sep['difference']:+.4f} +- {sep['se']:.4f} | "
                                                 f"{'-' if sep['seeds_needed'] is None else sep['seeds_needed']}")
        lines.append(f"| {p['rule']} | {p['design']} | {f['rank']} of {f['designs']} [{f['rank_ci'][0]:.0f}, "
                     f"{f['rank_ci'][1]:.0f}] | {f['probability_predicted_best']:.2f} | {f['regret']:.4f} "
                     f"[{f['regret_ci'][0]:.4f}, {f['regret_ci'][1]:.4f}] | {rival} |")
    return lines


def _criterion_line(prediction: dict) -> str:
    """Issue 23's test of one rule's prediction: first, or within one paired se of the best."""
    c = prediction["criterion"]
    in_se = "se 0" if c["in_se"] is None else f"{abs(c['in_se']):.1f} paired se"
    size = f"{abs(c['difference']):.4f} ({in_se})"
    if c["first"]:
        said = f"ranks first, ahead of {c['rival']} by {size}"
    else:
        said = (f"{'within' if c['within_one_se'] else 'NOT within'} one paired se of the best ({c['rival']}): "
                f"behind by {size}")
    return f"- {prediction['rule']} rule ({prediction['design']}): {said}"


def _lr_cell(row: dict, default_lr) -> str:
    lr = row.get("lr", default_lr)
    return "-" if lr is None else f"{lr:.3g}{' (edge)' if row.get('lr_edge') else ''}"


def _fmt(value, spec: str = ".3g") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


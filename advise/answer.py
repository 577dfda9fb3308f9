"""The text ``replay-theory optimal`` prints for the paper's design and the noise-scale rule (the forgetting-aware
answer's text is advise/advice.py's ``render``).

Paper: experience-replay (docs/REFERENCES.md): Thm 3.5's x* = N/R, y* = B/R and the GPU split W/T = mu/y with its
compute ratio gamma (Eq. 2); with a budget, the Thm 3.4 bound. The noise-scale rule: McCandlish et al. 2018 with the
FIFO long-run variance (theory/noise_scale.py). Every number comes from the records; this module only formats.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the paper's and the noise-scale rule's modules are imported where their answers are rendered,
    # out of the default rule's start-up
    from ..theory import noise_scale as ns
    from ..theory.design import PaperAnswer, Split

PROG = "replay-theory"

CONVENTIONS = {
    "rollout-cost": "mu = cost of one rollout / cost of one sample's update (Sec. 2, Table 1)",
    "paper-sec3": "mu = cost of one sample's update / cost of one rollout (literal Sec. 3, c = R + mu B)",
}
"""Each meaning of mu in one line (``--convention``'s choices)."""
CONVENTION_TEXT = {name: f"{name}: {meaning}" for name, meaning in CONVENTIONS.items()}

REGIME_SHORT = {
    "replay": "reuse rollouts",
    "on-policy": "use each rollout once",
    "over-generation": "NOT replay: more generation than training absorbs (gamma > 1)",
    "stale-buffer": "buffer without reuse (gamma = 1)",
    "unbounded": "largest buffer you can afford",
}

TABLE_BS = (0.03, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
"""The values of b at which ``optimal`` without a noise scale shows the rule's decision (plus its threshold)."""

MEASURE_B = (
    "how to measure b = B_noise / B (B_noise = tr Sigma / |E G|^2 of your loss's gradient, per prompt group):",
    "  a run of TRL: replay-theory trl-replay ... logs |g|^2 of two micro-batches and their sum each step "
    "(RUN/noise_scale.jsonl);",
    "    replay-theory calibrate --from-log LOG --grad-norms RUN/noise_scale.jsonl --out profile.json",
    "  a language model: replay-theory validate calibrate-model --out DIR (per-group gradients)",
    "  the simulator: replay-theory calibrate-simulator --out profile.json",
    "then: run the next: line the command prints (replay-theory optimal --profile ... with your batch, groups and "
    "mu); typed by hand: replay-theory optimal --objective noise-scale --mu MU --noise-scale B_NOISE -B B",
)

HORIZON_TEXT = ("horizon: this rule keeps N = R (x = 1) and assumes the optimizer never forgets (psi = 1); the "
                "forgetting-aware rule, the default --objective, predicts the horizon and compares a smaller "
                "on-policy batch")


def fmt(value: float | None, digits: int = 4) -> str:
    """A number as the tables print it: "-" for none, "inf", else ``digits`` significant digits."""
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return f"{value:.{digits}g}"


def _table(rows: list[tuple[str, str, str, str]]) -> list[str]:
    """Rows of (name, symbol, value, meaning) in aligned columns, the value right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return [f"  {n:<{widths[0]}}  {s:<{widths[1]}}  {v:>{widths[2]}}  {m}" for n, s, v, m in rows]


# --- the paper's design (Thm 3.5's J, or the Thm 3.4 bound at a budget) -----------------------------------------


def todo_line(d: PaperAnswer) -> str:
    """The paper's (or the finite-budget) answer in one line: the design, then the advice."""
    if d.regime != "replay":  # the advice of the other regimes says what to do in full
        return f"what to do: {d.advice}."
    where = (f"N = {d.capacity}, B = {d.batch_size}, R = {d.rollouts_per_step}"
             if d.rollouts_per_step is not None and d.capacity is not None and d.batch_size is not None
             else "give -R or -B for whole N, B and R")
    return (f"what to do: replay at x = N/R = {fmt(d.x_star, 3)}, y = B/R = {fmt(d.y_star, 3)} ({where}); "
            f"{d.advice}.")


def _design_rows(d: PaperAnswer, finite: bool) -> list[tuple[str, str, str, str]]:
    rows = [
        ("staleness horizon", "x = N/R" if finite else "x* = N/R", fmt(d.x_star),
         "steps a rollout stays in the FIFO buffer"),
        ("replay ratio", "y = B/R" if finite else "y* = B/R", fmt(d.y_star), "updates each rollout contributes to"),
        ("regime", "", d.regime, REGIME_SHORT[d.regime]),
        ("workers per trainer", "W/T = mu/y", fmt(d.workers_per_trainer, 3),
         "inference GPUs per trainer GPU, none idle"),
        ("compute ratio", "gamma", fmt(d.compute_ratio, 3), "compute per update vs on-policy (Eq. 2)"),
    ]
    if d.rollouts_per_step is not None:
        rows += [
            ("rollouts per step", "R", str(d.rollouts_per_step), "fresh rollouts generated each step"),
            ("buffer size", "N", "-" if d.capacity is None else str(d.capacity), "FIFO capacity"),
            ("batch size", "B", "-" if d.batch_size is None else str(d.batch_size),
             "samples per update, drawn uniformly"),
        ]
    if finite:
        assert d.bound_terms is not None  # finite_budget_design, the one source of finite-budget designs, sets them
        rows += [
            ("updates", "T = C/c", fmt(d.updates),
             f"updates the budget buys (c = {fmt(d.bound_terms['cost_per_update'])})"),
            ("step size", "eta*", fmt(d.eta), f"optimal for this design (cap eta_max = {fmt(d.eta_max)})"),
            ("bound", "Thm 3.4", fmt(d.bound), "guaranteed mean squared gradient norm"),
            ("budget regime", "", d.budget_regime, "step-size cap binds" if d.budget_regime == "step-limited"
             else "step size below its cap"),
        ]
    return rows


def _design_footer(d: PaperAnswer, finite: bool) -> list[str]:
    """What the design is, its constraint, its assumptions, the unclamped or large-budget design, its notes."""
    lines = [f"what it is: {d.regime_text}."] + ([f"constraint: {d.constraint}."] if d.constraint else [])
    alpha_text = "" if d.alpha is None else f"alpha = {d.alpha:g}, "
    constants = (f"; L = {d.smoothness:g}, kappa = {d.bias:g}, F0 = {d.f0:g}" if finite else "")
    lines.append(f"assumptions: {d.profile}; {alpha_text}rho = {d.rho:g}{constants}; {d.method}.")
    if (not finite and d.x_star_unconstrained != d.x_star) and d.regime != "unbounded":
        lines.append(f"unconstrained optimum: x = {fmt(d.x_star_unconstrained)}, y = {fmt(d.y_star_unconstrained)}.")
    if finite and d.large_budget_limit is not None:
        j = d.large_budget_limit
        lines.append(f"large-budget limit (Thm 3.5's J at the same {j['fixed']}): "
                     f"N = {j['capacity']}, R = {j['rollouts_per_step']}, B = {j['batch_size']} (x = {fmt(j['x'])}, "
                     f"y = {fmt(j['y'])}, {j['regime']}); its bound at this budget = {fmt(j['bound_at_budget'])} "
                     f"({fmt(d.large_budget_bound_ratio, 3)}x this design's).")
    return lines + [f"note: {note}." for note in d.notes]


def render_design(d: PaperAnswer) -> str:
    """The paper objective's answer: what to do first, the header, the design table, then what it assumes."""
    finite = d.objective == "finite-budget"
    head = f"{PROG} optimal: mu = {d.mu:g} ({CONVENTION_TEXT[d.convention]})"
    if finite:
        head += f", budget C = {d.budget:g}"
    from ..theory.design import OBJECTIVE_LABELS

    lines = [todo_line(d), head, f"objective: {OBJECTIVE_LABELS[d.objective]}", ""]  # the answer first
    lines += _table(_design_rows(d, finite)) + [""] + _design_footer(d, finite)
    return "\n".join(lines)


# --- the noise-scale rule (y* at a fixed B, N = R) ---------------------------------------------------------------


def _verdict(verdict: str | None) -> list[str]:
    """The benchmark's one-sentence verdict, printed right after what to do (none when a rule passes)."""
    return [verdict + "."] if verdict else []


def render_rule_table(mu: float, mu_rollout: float, convention: str, rows: list[dict], verdict: str | None,
                      evidence: str, paper_design: PaperAnswer, paper: str) -> str:
    """The noise-scale rule without a measured noise scale: its decision at each b of ``rows`` and how to measure b."""
    from ..theory import noise_scale as ns

    threshold = ns.replay_threshold(mu_rollout)
    lines = [f"what to do: measure b = B_noise / B at your batch (commands below), then ask again with -B and "
             f"--noise-scale; under this rule replay pays only if b < {threshold:.3g}."] + _verdict(verdict) + [
        f"{PROG} optimal: mu = {mu:g} ({CONVENTION_TEXT[convention]})",
        "objective: the noise-scale rule (McCandlish et al. 2018, steps S = S_min (1 + B_noise V), V the long-run "
        "variance of a FIFO drawn with replacement, 1/B + 1/R; docs/THEORY.md)",
        f"{evidence}.", "",
        f"no noise scale given: replay pays only if b = B_noise / B < {threshold:.3g} (4 b (1 + b) < mu); "
        f"above it, use each rollout once.", "",
        "       b  regime     y* = B/R  W/T = mu/y  gamma  steps vs on-policy  compute saved"]
    for r in rows:
        mark = "  <- threshold" if math.isclose(r["b"], threshold) else ""
        lines.append(f"  {r['b']:>6.3g}  {r['regime']:<9}  {r['y_star']:>8.3g}  {r['workers_per_trainer']:>10.3g}  "
                     f"{r['compute_ratio']:>5.2f}  {r['steps_factor']:>17.2f}x  {r['saving']:>12.2f}x{mark}")
    lines += ["", HORIZON_TEXT + ".", *MEASURE_B, "",
              f"the paper's rule (--objective paper) answers x* = {fmt(paper_design.x_star, 3)}, y* = "
              f"{fmt(paper_design.y_star, 3)} ({paper_design.regime}) whatever b; {paper}."]
    return "\n".join(lines)


def _rule_rows(d: ns.NoiseScaleDesign, source: str) -> list[tuple[str, str, str, str]]:
    return [("noise scale", "B_noise", fmt(d.b_noise), source),
            ("noise scale / batch", "b = B_noise/B", fmt(d.b, 3), f"replay pays iff b < {d.threshold_b:.3g}"),
            ("regime", "", d.regime, REGIME_SHORT[d.regime]),
            ("replay ratio", "y = B/R", fmt(d.y, 4), f"updates each rollout contributes to (y* = "
                                                     f"{fmt(d.y_continuous, 4)} before rounding R)"),
            ("rollouts per step", "R", str(d.rollouts_per_step), "fresh rollouts generated each step"),
            ("buffer size", "N = R", str(d.capacity), "x = 1: the shortest horizon"),
            ("batch size", "B", str(d.batch_size), "samples per update, drawn uniformly with replacement"
             if d.regime == "replay" else "each fresh rollout used once"),
            ("workers per trainer", "W/T = mu/y", fmt(d.workers_per_trainer, 3),
             "inference GPUs per trainer GPU, none idle"),
            ("compute ratio", "gamma", fmt(d.compute_ratio, 3), "compute per update vs on-policy (Eq. 2)"),
            ("steps vs on-policy", "S/S_on", fmt(d.steps_vs_on_policy, 3), "more updates to the same target"),
            ("compute saved", "", f"{d.saving:.3g}x", "on-policy compute / this design's, to the same target")]


def rule_todo_line(d: ns.NoiseScaleDesign) -> str:
    """The noise-scale rule's answer in one line: replay's (R, N = R, B), or why it stays on-policy."""
    if d.regime == "replay":
        return (f"what to do: generate R = {d.rollouts_per_step} rollouts per step, keep only them (N = R), and "
                f"train on B = {d.batch_size} drawn from them with replacement; W/T = {d.workers_per_trainer:.3g}.")
    if d.rounding_lost_replay:  # replay would pay, but R = B / y* rounds up to B (or its saving is lost)
        from ..theory import noise_scale as ns

        y_star = ns.optimal_replay_ratio(d.b, d.mu)
        return (f"what to do: stay on-policy (b = {d.b:.3g} < {d.threshold_b:.3g}, so replay would pay at "
                f"y* = {y_star:.3g}, but R = B / y* rounded to a whole rollout is {d.batch_size} = B or loses "
                f"the saving: use a larger B).")
    return (f"what to do: stay on-policy (b = {d.b:.3g} >= {d.threshold_b:.3g}: replay's extra noise "
            f"costs more steps than its cheaper steps save).")


def render_rule(mu: float, convention: str, d: ns.NoiseScaleDesign, source: str, verdict: str | None, evidence: str,
                paper_design: PaperAnswer, paper: str) -> str:
    """The noise-scale rule at a measured B_noise and B: what to do (after the benchmark's verdict), the design."""
    lines = [rule_todo_line(d)] + _verdict(verdict) + [
        f"{PROG} optimal: mu = {mu:g} ({CONVENTION_TEXT[convention]}), B = {d.batch_size}",
        "objective: the noise-scale rule (docs/THEORY.md)", f"{evidence}.", ""]
    lines += _table(_rule_rows(d, source)) + [""]
    if d.regime == "replay":
        lines.append(HORIZON_TEXT + ".")
    lines.append(f"the paper's rule (--objective paper) would say x* = {fmt(paper_design.x_star, 3)}, y* = "
                 f"{fmt(paper_design.y_star, 3)} ({paper_design.regime}); {paper}.")
    return "\n".join(lines)


# --- a (W, T) GPU split (Eq. 2; ``replay-theory gamma``) ---------------------------------------------------------


def split_verdict(s: Split) -> str:
    """What the split means: on-policy, over-generation (gamma > 1, y = mu T / W < 1) or replay."""
    if s.regime == "on-policy":
        return "the on-policy split (W/T = mu): an update costs what it costs on-policy"
    if s.regime == "over-generation":  # gamma > 1 exactly when y = mu T / W < 1: inference outruns training
        return (f"gamma > 1: this split is worse than on-policy - more generation than training can absorb "
                f"(W/T = {s.workers_per_trainer:.3g} > mu = {s.mu:g}), so each update costs {s.compute_ratio:.3g}x "
                f"its on-policy compute and some rollouts are never trained on; move GPUs to training "
                f"(W/T <= mu), e.g. W/T = mu is on-policy")
    return (f"replay: each rollout is used {s.replay_ratio:.3g} times on average and an update costs "
            f"{s.compute_ratio:.1%} of its on-policy compute")


def split_record(s: Split) -> dict:
    """What ``gamma --json`` prints."""
    return {"workers": s.workers, "trainers": s.trainers, "mu": s.mu, "gamma": s.compute_ratio,
            "replay_ratio": s.replay_ratio, "regime": s.regime, "verdict": split_verdict(s)}


def render_split(s: Split) -> str:
    """Eq. 2 with the split's numbers, how often a rollout is used, and the verdict."""
    lines = [f"gamma = (1 + W/T) / (1 + mu) = (1 + {s.workers:g}/{s.trainers:g}) / (1 + {s.mu:g}) = "
             f"{s.compute_ratio:.4f}"]
    if s.regime != "replay":  # the replay verdict already says how often a rollout is used and what an update costs
        lines.append(f"each rollout is used y = mu T / W = {s.replay_ratio:.3g} times on average; "
                     f"an update costs {s.compute_ratio:.1%} of its on-policy compute.")
    return "\n".join(lines + [split_verdict(s) + "."])

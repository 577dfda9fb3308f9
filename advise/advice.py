"""What ``replay-theory optimal`` answers by default: the whole design (B, R, N) from the forgetting-aware rule.

Paper and model: ``theory/forgetting.py`` (McCandlish et al. 2018's steps with the FIFO noise the optimizer keeps,
psi(x, kappa); docs/THEORY.md, "Forgetting"). This module turns measured inputs into an answer record and its text;
the first line of the text says what to do. Numbers come from ``forgetting`` only.

| code name         | symbol         | meaning                                                                   |
|-------------------|----------------|---------------------------------------------------------------------------|
| ``batch_size``    | B              | the user's batch (responses per update), on-policy today                  |
| ``b_noise``       | B_noise        | gradient noise scale in samples; b = B_noise / B                          |
| ``kappa``         | kappa          | the optimizer's memory (1/kappa steps) measured at ``pilot_batch``        |
| ``floor``         | R_floor        | generation latency floor in rollouts: a step costs mu max(R, R_floor) + B |
| ``max_steps_ratio``| --            | steps allowed relative to on-policy at B (the wall-time budget)           |
| ``max_work_ratio``| --             | work allowed relative to on-policy at B (the compute budget, [W1])         |
| ``max_staleness`` | k              | overlapped generation allowed up to k updates ahead (0: none priced)      |
| ``zero_share``    | z              | share of groups whose rewards are all equal (0: selective replay not priced) |
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ..theory import forgetting as fg
from ..theory.compute import refill_rounds
from ..theory.guarded import B_FACTORS, MARGIN, OVERLAP_MARGIN, floor_batch, guarded_design, max_batch_or

NO_BUDGET = 1000.0
"""--max-steps-ratio at or above this is no steps budget: least compute whatever the steps (optimal's default)."""
MEMORY_ROWS = (0.01, 0.1, 1.0)
"""kappa values of the no-measurement table: a memory of 100, 10 and 1 steps."""
TABLE_HORIZONS = (4, 16, 64)


@dataclass(frozen=True)
class Query:
    """Everything ``optimal`` was given (and where each input came from), checked by ``check``."""

    mu: float
    batch_size: int | None = None
    b_noise: float | None = None
    b_noise_source: str = ""
    kappa: float | None = None
    kappa_source: str = ""
    optimizer: str = "adam"
    beta1: float = 0.9
    pilot_batch: int | None = None
    group_size: int = 1
    floor: float = 0.0
    max_steps_ratio: float = 1000.0
    max_horizon: int = 64
    max_epochs: int = 1
    max_staleness: int = 0
    staleness: fg.Staleness = field(default_factory=lambda: fg.NO_STALENESS)
    max_work_ratio: float = 1000.0
    zero_share: float = 0.0
    zero_share_source: str = ""

    @property
    def work_budget(self) -> float:
        """--max-work-ratio as the searches read it: inf at or above ``NO_BUDGET`` (no work budget)."""
        return math.inf if self.max_work_ratio >= NO_BUDGET else self.max_work_ratio


def _design_row(p: fg.Prediction, ref: fg.Prediction, work: bool = False, zero_share: float = 0.0) -> dict:
    """A design's record; ``work``: with its work against on-policy at B's (asked for by a work budget only, so
    records without one read as before); a selective design's with the zero share it was priced at and the horizon
    its admitted samples see, N / ((1 - z) R); dynamic sampling's with its mean generation rounds of R an update
    ([E11])."""
    d = p.design
    return {"batch_size": d.batch_size, "rollouts_per_step": d.rollouts_per_step, "capacity": d.capacity, "x": d.x,
            "y": d.y, "on_policy": d.on_policy, "steps_vs_B": p.steps / ref.steps,
            "compute_vs_B": p.compute / ref.compute, **({"work_vs_B": p.work / ref.work} if work else {}),
            "psi": p.psi,
            "kappa_at_design": None if math.isnan(p.kappa) else p.kappa, "staleness_factor": p.staleness,
            **({"epochs": d.epochs, "mini_batches": d.mini_batches} if d.updates_per_generation > 1 else {}),
            **({"max_staleness": d.max_staleness} if d.max_staleness else {}),
            **({"selective": True, "zero_share": zero_share,
                "admitted_horizon": d.capacity / ((1 - zero_share) * d.rollouts_per_step)}
               if d.selective and not d.dynamic else {}),
            **({"dynamic": True, "zero_share": zero_share,
                "refill_rounds": refill_rounds(d.batch_size // d.group_size, zero_share)} if d.dynamic else {})}


def advise(q: Query) -> dict:
    """The answer record: with B_noise and B, the whole design; without, what to measure and what decides it."""
    thr_y, thr = fg.loosest_equal_steps(q.mu)
    base = {"objective": "forgetting", "mu": q.mu, "optimizer": q.optimizer, "beta1": q.beta1,
            "loosest_threshold": {"psi": thr, "y": thr_y}, "floor": q.floor, "max_steps_ratio": q.max_steps_ratio,
            "group_size": q.group_size, "max_horizon": q.max_horizon, "staleness": q.staleness.source,
            **({"max_work_ratio": q.max_work_ratio} if q.max_work_ratio < NO_BUDGET else {}),
            **({"zero_share": q.zero_share, "zero_share_source": q.zero_share_source} if q.zero_share > 0 else {})}
    if q.b_noise is None:
        return _unmeasured_record(q, base, thr)
    if q.batch_size is None:
        raise ValueError("b_noise needs batch_size (the rule's b = B_noise / B)")
    memory = None
    if q.kappa is not None:
        memory = fg.Memory(q.kappa, q.optimizer, q.beta1, float(q.pilot_batch or q.batch_size))
    guarded = guarded_design(q.b_noise, q.batch_size, q.mu, memory, optimizer=q.optimizer, group_size=q.group_size,
                             staleness=q.staleness, floor=q.floor, max_steps_ratio=q.max_steps_ratio,
                             max_horizon=q.max_horizon, max_epochs=q.max_epochs, max_staleness=q.max_staleness,
                             max_work_ratio=q.work_budget, zero_share=q.zero_share)
    answer, choice = guarded.search, guarded.choice
    ref = answer.at_batch
    best = choice.design  # the design to run, under the names the trainers read (integrations/replay_config.py)
    regime = ("epochs" if best.updates_per_generation > 1 else "overlapped" if best.max_staleness
              else "dynamic" if best.dynamic else "selective" if best.selective
              else "on-policy" if best.on_policy else "replay")
    replay = choice if regime == "replay" else answer.replay
    row = partial(_design_row, ref=ref, work=q.max_work_ratio < NO_BUDGET, zero_share=q.zero_share)
    rows = _design_rows(q, guarded, regime, row)
    winner = regime if regime != "on-policy" else fg.on_policy_winner(best.batch_size, q.batch_size)
    record = {**base, "measured": True, "batch": q.batch_size, "b_noise": q.b_noise, "b": q.b_noise / q.batch_size,
              "b_noise_source": q.b_noise_source, "kappa": q.kappa, "kappa_source": q.kappa_source,
              "pilot_batch": q.pilot_batch or q.batch_size, "winner": winner, "designs": rows,
              "guard": {"default": row(guarded.default), "moved": guarded.moved,
                        "worst_regret": guarded.worst_choice, "default_worst_regret": guarded.worst_default,
                        "b_factors": list(B_FACTORS), "margin": MARGIN, "limits": list(guarded.limits),
                        **({"overlap_margin": OVERLAP_MARGIN} if q.max_staleness >= 1 or q.zero_share > 0 else {})}}
    if replay is not None:
        y = replay.design.y
        record["condition"] = {"psi": replay.psi, "x": replay.design.x, "y": y,
                               "threshold_at_y": fg.equal_steps_threshold(y, q.mu)}
    record.update(regime=regime, batch_size=best.batch_size, rollouts_per_step=best.rollouts_per_step,
                  capacity=best.capacity)
    if regime == "epochs":
        record.update(epochs=best.epochs, mini_batches=best.mini_batches)
    if regime == "overlapped":
        _, low, high = fg.overlapped_split(best.rollouts_per_step, best.batch_size, q.mu, q.floor)
        record.update(max_staleness=best.max_staleness, generation_share=[low, high])
    if regime == "dynamic":
        record.update(dynamic=True, refill_rounds=rows["dynamic"]["refill_rounds"])
    record["what_to_do"], record["why"] = _measured_advice(record)
    record["notes"] = _notes(q, record)
    return record


def _unmeasured_record(q: Query, base: dict, thr: float) -> dict:
    """The answer without b: what to measure, the memory table, and the floor rule's batch where it needs no b."""
    record = {**base, "measured": False, "what_to_do": _unmeasured_advice(q, thr), "why": _unmeasured_why(q, thr),
              "memory_table": memory_table(q.optimizer, q.beta1, thr)}
    batch = unmeasured_batch(q)
    if batch is not None:  # the floor rule needs no b at least compute: the best-tested answer without one
        record.update(regime="on-policy", batch=q.batch_size, batch_size=batch, rollouts_per_step=batch,
                      capacity=batch, what_to_do=_floor_rule_advice(q, batch))
    return record


def _design_rows(q: Query, guarded, regime: str, row: Callable[[fg.Prediction], dict]) -> dict:
    """The records of on-policy at B, the on-policy answer, replay's best and (when asked) the epoch and overlapped
    bests, the chosen design in its family's place."""
    answer, choice = guarded.search, guarded.choice
    pick = {"on_policy": answer.on_policy, "replay": answer.replay, "epochs": answer.epochs,
            "overlapped": answer.overlapped, "selective": answer.selective, "dynamic": answer.dynamic}
    pick[{"on-policy": "on_policy"}.get(regime, regime)] = choice
    keys = (["on_policy", "replay"] + ["epochs"] * (q.max_epochs > 1) + ["overlapped"] * (q.max_staleness >= 1)
            + ["selective", "dynamic"] * (q.zero_share > 0))
    # epochs, overlapped and selective only when asked: records without them read as before
    return {"at_batch": row(answer.at_batch), **{k: None if pick[k] is None else row(pick[k]) for k in keys}}


def memory_table(optimizer: str, beta1: float, threshold: float) -> list[dict]:
    """Per memory kappa: psi at a few horizons and the shortest horizon whose psi is below ``threshold`` (where a
    replay design can start to beat a smaller on-policy batch)."""
    rows = []
    for kappa in MEMORY_ROWS:
        xs = np.arange(1, 4097)
        values = np.asarray(fg.psi(xs, kappa, optimizer, beta1))  # (4096,): psi is an array for an array of x
        below = np.flatnonzero(values < threshold)
        rows.append({"kappa": kappa, "psi": {str(x): float(values[x - 1]) for x in TABLE_HORIZONS},
                     "shortest_horizon": int(xs[below[0]]) if below.size else None})
    return rows


def unmeasured_batch(q: Query) -> int | None:
    """The floor rule's batch without a measured b: the smallest whole-group batch at or above the latency floor
    (``guarded.floor_batch``, which reads b only through the steps cap; at no budget that cap asks for less than
    B / 1000 whatever b, so b = 0 stands for "not measured"). None without -B or with a steps budget, which needs b."""
    if q.batch_size is None or q.max_steps_ratio < NO_BUDGET:
        return None
    top = fg.work_top(max_batch_or(None, q.batch_size) // q.group_size * q.group_size, 0.0, q.batch_size,
                      q.group_size, q.work_budget)  # C B: within a work budget whatever b is ([W1])
    return floor_batch(0.0, q.batch_size, q.group_size, q.floor, q.max_steps_ratio, top)


def _floor_rule_advice(q: Query, batch: int) -> str:
    where = "stay on-policy at your batch" if batch == q.batch_size else f"train on-policy at B = R = N = {batch}"
    capped = ""
    if batch < q.floor:  # the floor is out of reach: the work budget's batch, or the largest searched (4 B)
        by_work = batch == fg.work_top(batch + q.group_size, 0.0, q.batch_size, q.group_size, q.work_budget)
        capped = (f", at most {q.max_work_ratio:g}x your batch for --max-work-ratio" if by_work else
                  ", at most 4x your batch, the largest searched")
    return (f"{where}, the floor rule's batch (the smallest whole-group batch at or above the latency floor{capped}, "
            f"the best-tested answer without b: it needs none at least compute), and measure b = B_noise / B and the "
            f"optimizer's memory kappa (commands below), then ask again with -B, --noise-scale and --kappa")


def _unmeasured_advice(q: Query, threshold: float) -> str:
    return ("stay on-policy at your batch until you have measured b = B_noise / B and the optimizer's memory kappa "
            "(commands below), then ask again with -B, --noise-scale and --kappa")


def _unmeasured_why(q: Query, threshold: float) -> str:
    return (f"replay saves generation, but a reused rollout brings its noise back into every update that draws it; "
            f"at mu = {q.mu:g} it beats a smaller on-policy batch only if the optimizer forgets that noise within the "
            f"buffer's horizon (psi, the share it keeps, below {threshold:.2f}: the table below), which an unmeasured "
            f"run gives no reason to assume")


def _measured_advice(r: dict) -> tuple[str, str]:
    """(what to do, why): the action in one short sentence, the numbers and the condition that decided it apart."""
    at, on, rep = r["designs"]["at_batch"], r["designs"]["on_policy"], r["designs"]["replay"]
    if r["winner"] == "epochs":
        ep = r["designs"]["epochs"]
        m = ep["mini_batches"]
        if ep["epochs"] == 1:  # one pass (PPO's single epoch): nothing reused, the updates share one generation
            action = (f"generate R = {ep['rollouts_per_step']} per generation and train it once, in {m} mini-batches "
                      f"of B = {ep['batch_size']}")
            why = (f"{_versus(r, ep, on)}: each rollout is trained once (no noise reused), and the {m} updates share "
                   f"one generation, the last on rollouts {m - 1} update{'s' if m > 2 else ''} old")
            return action, why
        action = (f"generate R = {ep['rollouts_per_step']} per generation and train {ep['epochs']} epochs over "
                  f"{m} mini-batch{'es' if m > 1 else ''} of B = {ep['batch_size']}")
        why = (f"{_versus(r, ep, on)}: the optimizer keeps psi_E = {ep['psi']:.2f} of the reused rollouts' noise "
               f"(1: none kept; {ep['epochs']}: all)")
        return action, why
    if r["winner"] == "overlapped":
        ov, (low, high) = r["designs"]["overlapped"], r["generation_share"]
        share = f"{low:.2f}" if high - low < 0.005 else f"{low:.2f}-{high:.2f}"
        action = (f"overlap generation with training, one step off (max_staleness = {ov['max_staleness']}), at "
                  f"B = R = {ov['batch_size']} with a share {share} of the GPUs generating")
        why = (f"{ov['compute_vs_B']:.2f}x the GPU time of on-policy at B = {r['batch']} in {ov['steps_vs_B']:.2f}x "
               f"its steps, {on['compute_vs_B'] / ov['compute_vs_B']:.2f}x less than the cheapest synchronous "
               f"on-policy batch (B = {on['batch_size']}): below the latency floor the generating GPUs wait anyway, so "
               f"training beside them costs no time, while each rollout's noise grows by r(1) = "
               f"{ov['staleness_factor']:.3g} for being one update old")
        return action, why
    if r["winner"] == "selective":
        sel = r["designs"]["selective"]
        action = (f"replay only the groups whose rewards are not all equal: B = {sel['batch_size']}, R = "
                  f"{sel['rollouts_per_step']}, N = {sel['capacity']} (a FIFO admitting the {1 - r['zero_share']:.2f} "
                  f"of each generation with a non-zero advantage: horizon N / ((1 - z) R) = "
                  f"{sel['admitted_horizon']:.3g} steps)")
        why = (f"{_versus(r, sel, on)}: a share z = {r['zero_share']:.3g} of the groups ({r['zero_share_source']}) "
               f"has all rewards equal, no gradient, and is never stored or trained on, so every update draws "
               f"informative samples; the optimizer keeps psi = {sel['psi']:.2f} of the buffer's extra noise")
        return action, why
    if r["winner"] == "dynamic":
        dy = r["designs"]["dynamic"]
        b = dy["batch_size"]  # rounds of R = B: the generation batch is the training batch ([E11])
        action = (f"train on-policy at B = {b} with dynamic sampling: drop the groups whose rewards are all equal and "
                  f"generate again, rounds of {b}, until {b} rollouts with a non-zero advantage are in hand")
        why = (f"{_versus(r, dy, on, 'the cheapest on-policy batch that keeps them')}: a share z = "
               f"{r['zero_share']:.3g} of the groups ({r['zero_share_source']}) has all rewards equal and no "
               f"gradient, so a batch of B informative rollouts takes the steps of one of B / (1 - z) that keeps "
               f"them, without training on the rest; it generates {dy['refill_rounds']:.2f} rounds an update on "
               f"average, the last one's surplus dropped")
        return action, why
    if r["winner"] == "replay":
        action = (f"replay with B = {rep['batch_size']}, R = {rep['rollouts_per_step']}, N = {rep['capacity']} "
                  f"(horizon x = {rep['x']}, replay ratio y = {rep['y']:.3g})")
        why = (f"{_versus(r, rep, on)}: the optimizer keeps psi = {rep['psi']:.2f} of the buffer's extra noise, "
               f"below the {r['condition']['threshold_at_y']:.2f} a smaller on-policy batch allows at "
               f"y = {rep['y']:.3g}")
        return action, why
    replay = ("no replay design offered (the notes say why)" if rep is None else
              f"replay's best (B = {rep['batch_size']}, R = {rep['rollouts_per_step']}, N = {rep['capacity']}) needs "
              f"{rep['compute_vs_B']:.2f}x: the optimizer keeps psi = {rep['psi']:.2f} of its extra noise at "
              f"x = {rep['x']}, above the {r['condition']['threshold_at_y']:.2f} a smaller on-policy batch allows at "
              f"y = {rep['y']:.3g}")
    if r["winner"] == "on-policy at B":
        return (f"stay on-policy at B = {r['batch']}", f"{_guard_text(r)}; {replay}")
    side = "smaller" if on["batch_size"] < at["batch_size"] else "larger"
    return (f"train on-policy at a {side} batch, B = R = N = {on['batch_size']}",
            f"{on['compute_vs_B']:.2f}x the compute of on-policy at B = {r['batch']} in {on['steps_vs_B']:.2f}x its "
            f"steps; {_guard_text(r)}; {replay}")


def _versus(r: dict, d: dict, on: dict, rival: str = "the cheapest on-policy batch") -> str:
    """A family's design row ``d`` against on-policy at B and ``rival``, the on-policy answer ``on``: its compute and
    steps ratios, and how much cheaper it is."""
    return (f"{d['compute_vs_B']:.2f}x the compute of on-policy at B = {r['batch']} in {d['steps_vs_B']:.2f}x its "
            f"steps, {on['compute_vs_B'] / d['compute_vs_B']:.2f}x cheaper than {rival} (B = {on['batch_size']})")


def _guard_text(r: dict) -> str:
    """Why the on-policy answer is this batch: the floor rule's (kept) or the model's (moved), in worst regrets."""
    g = r["guard"]
    low, high = min(g["b_factors"]), max(g["b_factors"])
    low_text = f"1/{1 / low:g}" if low < 1 else f"{low:g}x"  # b_factors are powers of 2 and 4: 1/16 reads exactly
    span = f"b from {low_text} to {high:g}x the measured {r['b']:.3g}"
    if g["moved"]:
        return (f"it beats the floor rule's B = {g['default']['batch_size']} by more than {g['margin']:g}x in worst "
                f"predicted regret over {span} ({g['worst_regret']:.2f} against {g['default_worst_regret']:.2f})")
    return ("the floor rule's batch (the smallest whole-group batch at or above the latency floor"
            + ("" if r["max_steps_ratio"] >= NO_BUDGET else f" within {r['max_steps_ratio']:g}x the steps")
            + (f", at most the largest within {r['max_work_ratio']:g}x the work" if "max_work_ratio" in r else "")
            + f"), since no design beats it by {g['margin']:g}x in worst predicted regret over {span}")


def _notes(q: Query, r: dict) -> list[str]:
    notes = []
    if q.kappa is None:
        notes.append("no memory given (--kappa or a profile's memory): the answer assumes the optimizer never "
                     "forgets (psi = 1, the noise-scale rule), the assumption least kind to replay; measure kappa to "
                     "see whether a long buffer pays")
    rep = r["designs"]["replay"]
    if rep is not None and rep["x"] >= q.max_horizon and q.staleness.flat:
        notes.append(f"no staleness cost ({q.staleness.source}): in this model a longer buffer only helps, so "
                     f"replay's horizon sits at --max-horizon {q.max_horizon}; stale rollouts' importance weights set "
                     f"the real limit (replay-theory diagnose shows them by age)")
    notes += [f"{limit}" for limit in r["guard"]["limits"]]
    if q.max_steps_ratio < NO_BUDGET and r["designs"]["on_policy"]["steps_vs_B"] >= 0.95 * q.max_steps_ratio:
        notes.append(f"the cheapest on-policy batch sits at (or near) the steps budget ({q.max_steps_ratio:g}x "
                     f"on-policy's at B, --max-steps-ratio): a smaller batch is cheaper still in compute and slower "
                     f"in wall time")
    if q.floor == 0:
        notes.append("no latency floor given (--latency-floor): a step's generation is priced in proportion to R "
                     "however small, which favours small batches; a GPU decodes a small batch in about the time "
                     "of a full one")
    return notes


def _kappa_text(r: dict) -> str:
    if r["kappa"] is None:
        return "kappa not given (psi = 1: the optimizer is taken never to forget)"
    beta = f", beta1 = {r['beta1']:g}" if r["optimizer"] != "sgd" else ""
    return (f"kappa = {r['kappa']:.3g} ({r['optimizer']}{beta}, measured on-policy at B = {r['pilot_batch']}), "
            f"{r['kappa_source']}")


def _budget_text(r: dict) -> str:
    work = ("" if "max_work_ratio" not in r else
            f"; work (GPU time spent, the floor's waiting not counted) at most {r['max_work_ratio']:g}x on-policy's at "
            f"B")
    if r["max_steps_ratio"] >= NO_BUDGET:
        return "no steps budget (least compute)" + work
    return f"steps at most {r['max_steps_ratio']:g}x on-policy's at B" + work


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}"


def render(r: dict, evidence: list[str], verdict: str | None = None) -> str:
    """The text ``optimal`` prints: what to do first, then the benchmark's verdict where no rule passes (one
    sentence), why, the evidence, the inputs and the designs."""
    lines = [f"what to do: {r['what_to_do']}."] + ([f"{verdict}."] if verdict else [])
    lines += [f"why: {r['why']}."] if r.get("why") else []
    lines += [f"{e}." for e in evidence if e]
    thr = r["loosest_threshold"]
    if not r["measured"]:
        lines += ["", f"what decides it: psi(x, kappa), the share of a replay buffer's extra noise the optimizer "
                      f"keeps over a horizon of x = N/R steps; at mu = {r['mu']:g} replay can beat a smaller "
                      f"on-policy batch only where psi < {thr['psi']:.2f} (reached at y = B/R = {thr['y']:.2f}; "
                      f"replay-theory derive free-batch). {r['optimizer']}"
                      + (f" (beta1 = {r['beta1']:g})" if r["optimizer"] != "sgd" else "") + ":", "",
                  "  kappa  memory   " + "  ".join(f"psi(x={x:<2})" for x in TABLE_HORIZONS)
                  + "  shortest x with psi < " + f"{thr['psi']:.2f}"]
        for row in r["memory_table"]:
            shortest = "beyond 4096" if row["shortest_horizon"] is None else str(row["shortest_horizon"])
            lines.append(f"  {row['kappa']:>5g}  {1 / row['kappa']:>6g}   "
                         + "  ".join(f"{row['psi'][str(x)]:>9.2f}" for x in TABLE_HORIZONS) + f"  {shortest:>18}")
        lines += ["", *MEASURE]
        return "\n".join(lines)
    lines += ["",
              f"inputs: mu = {r['mu']:g}; B = {r['batch']}; B_noise = {r['b_noise']:.4g} (b = {r['b']:.3g}), "
              f"{r['b_noise_source']}; " + _kappa_text(r) + f"; latency floor {r['floor']:g} rollouts; "
              f"{_budget_text(r)}; whole groups of {r['group_size']}; staleness: {r['staleness']}"
              + (f"; zero share z = {r['zero_share']:.3g}, {r['zero_share_source']}" if "zero_share" in r else ""), "",
              "  design                    B       R        N     x      y  steps vs B  compute vs B     psi"
              + ("  work vs B" if "max_work_ratio" in r else ""), *_design_table(r)]
    if r.get("condition"):
        c = r["condition"]
        lines += ["", f"the condition: replay at (R, B = y R) beats the on-policy batch with as many steps iff psi < "
                      f"mu (y - 1) / (y (mu + y)) = {c['threshold_at_y']:.3f} at y = {c['y']:.3g} (at most "
                      f"{thr['psi']:.3f}, at y = {thr['y']:.2f}; replay-theory derive free-batch); its best design "
                      f"keeps psi = {c['psi']:.3f} at x = {c['x']}"
                  + (" (with a latency floor the comparison also prices the floor)" if r["floor"] else "") + "."]
    lines += [f"note: {n}." for n in r["notes"]]
    return "\n".join(lines)


def _design_table(r: dict) -> list[str]:
    """The design table's rows: on-policy at B, the on-policy answer, and each family's best that was priced."""
    d, lines = r["designs"], []
    best_key = {"replay": "replay", "epochs": "epochs", "overlapped": "overlapped", "selective": "selective",
                "dynamic": "dynamic", "on-policy at B": "at_batch"}.get(r["winner"], "on_policy")
    for name, key in (("on-policy at your B", "at_batch"), ("on-policy answer", "on_policy"),
                      ("best replay", "replay"), ("best epochs", "epochs"), ("overlapped, 1 step off", "overlapped"),
                      ("best selective replay", "selective"), ("dynamic sampling", "dynamic")):
        if key not in d:
            continue
        row = d[key]
        if row is None:
            lines.append(f"  {name:<22}  none offered")
            continue
        if key == "epochs":
            name = f"epochs e={row['epochs']} m={row['mini_batches']}"
        mark = "  <- best" if key == best_key else ""
        x, y = ("-", "-") if key == "epochs" else (row["x"], f"{row['y']:.3g}")  # a generation is no FIFO
        lines.append(f"  {name:<22}  {row['batch_size']:>5} {row['rollouts_per_step']:>7} {row['capacity']:>8} "
                     f"{x:>5} {y:>6}  {row['steps_vs_B']:>9.2f}x  {row['compute_vs_B']:>11.2f}x  "
                     f"{row['psi']:>6.2f}" + (f"  {row['work_vs_B']:>9.2f}x" if "work_vs_B" in row else "") + mark)
    return lines


MEASURE = (
    "measure b = B_noise / B over a whole logged run at your batch (it grows toward the target: a run's first steps "
    "read it low), kappa on its first steps, and the staleness cost: the drift M2(s) of 64 rollouts of steps T - 1, "
    "T - 2, T - 4, ... re-scored at the last policy T (--drift: a log of them with an age column):",
    "  TRL: replay-theory trl-replay ... logs two micro-batches' |g|^2 each step, a curvature pair every K steps, and "
    "re-scores RUN/drift.parquet at its end; replay-theory calibrate --from-log RUN/rollouts.parquet --preset trl "
    "--grad-norms RUN/noise_scale.jsonl --drift RUN/drift.parquet --out profile.json",
    "  verl: replay-theory calibrate --from-log LOG --preset verl --grad-norms FILE [--drift FILE] --out profile.json",
    "  the tiny language model: replay-theory validate calibrate-model --out DIR; the simulator: replay-theory "
    "calibrate-simulator --out profile.json",
    "then: run the next: line the command prints (replay-theory optimal --profile ... with your batch, groups and "
    "mu); typed by hand: replay-theory optimal --mu MU -B B --noise-scale B_NOISE --kappa K",
)

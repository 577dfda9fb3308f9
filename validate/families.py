"""The designs verify trains (issues 4, 23, 30, 40): the neighbours, fixed-b, horizon and reuse families, and their
cost.

Paper: experience-replay (docs/REFERENCES.md), Thm 3.5's design and the equal-compute budget; RLOO note for the
whole-group replay cells. Each design is a ``NamedDesign``: its name in the report, whether Thm 3.5 ranks it, and the
registry's ``DesignConfig`` (core/designs.py), which ``validate/loop.py`` trains as it is (``RLConfig``) and whose
rules are the registry's alone. A ranked design is the one design type (``theory.designs.Design``: ``capacity``,
``batch_size``, ``rollouts_per_step``, ``group_size``) put into a config by ``DesignConfig.from_design``: the same names
from predicted.json to the buffer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.designs import DesignConfig, fresh_groups, validate_design
from ..theory.designs import Design
from ..theory.group_replay import fresh_verifier_evaluations
from .config import (
    FIXED_B_REPLAY_RATIOS,
    FIXED_B_SMALLER,
    HORIZON_XS,
    HORIZON_Y,
    REUSE_EPOCHS,
    REUSE_HORIZON,
    REUSE_STALENESS,
    ValidateConfig,
)

# The verify sweep's RLOO whole-group replay cells (rho, L, c), RLOO note (docs/REFERENCES.md):
# the fresh-only baseline (rho = 0: c and L have no effect), the paper's best-reward cell (1, 1, 1),
# and rho = 1 with the older pool L = 2 and the looser clip c = 3.
GROUP_REPLAY_CELLS = ((0.0, 0, 1.0), (1.0, 1, 1.0), (1.0, 2, 3.0))


@dataclass(frozen=True)
class NamedDesign:
    """One design verify trains: its ``name`` in the report, ``family`` (a FIFO or on-policy design, which Thm 3.5
    ranks; RLOO group replay is not) and its design ``config``."""

    name: str
    family: bool
    config: DesignConfig

    @property
    def group_replay(self) -> bool:
        return self.config.buffer == "group-replay"

    @property
    def fresh_per_step(self) -> int:
        """R: fresh rollouts per step; group replay: G x round(B/G / (1 + rho)) once the pool is full (App. B)."""
        c = self.config
        return c.group_size * fresh_groups(c) if self.group_replay else c.rollouts_per_step

    def report_fields(self) -> dict:
        """The design's part of its report row: name, buffer, loss, N, B and R (``fresh_per_step``) under
        DesignConfig's names, group replay's rho, L, c (it has no N: its pool is the groups of ages 1..L), family."""
        c = self.config
        knobs = (dict(replay_ratio_groups=c.replay_ratio_groups, max_age=c.max_age, clip_c=c.clip_c)
                 if self.group_replay else {})
        return {"name": self.name, "buffer": c.buffer, "loss": c.loss,
                "capacity": None if self.group_replay else c.capacity, "batch_size": c.batch_size,
                "rollouts_per_step": self.fresh_per_step, **knobs, "family": self.family}


def _ranked(name: str, design: Design) -> NamedDesign:
    """A FIFO or on-policy design of the family Thm 3.5 ranks, trained with GRPO."""
    return NamedDesign(name, True, DesignConfig.from_design(design, loss="grpo"))


def _fifo(config: ValidateConfig, capacity: int, batch_size: int, rollouts_per_step: int | None = None) -> Design:
    """A FIFO design in the run's groups; R: the run's unless given."""
    R = config.rollouts_per_step if rollouts_per_step is None else rollouts_per_step
    return Design(batch_size, R, capacity, group_size=config.group_size)


def _on_policy(config: ValidateConfig, batch_size: int) -> Design:
    return Design.on_policy_at(batch_size, config.group_size)


def _accepted(config: ValidateConfig, name: str, capacity: int, batch_size: int) -> NamedDesign | None:
    """The FIFO neighbour when it is a design and the registry's rules hold (``core.designs.validate_design``): e.g. a
    FIFO smaller than one step's rollouts would drop fresh data unseen, a batch of 0 trains nothing; else None."""
    try:
        design = _ranked(name, _fifo(config, capacity, batch_size))
        validate_design(design.config)
    except ValueError:
        return None
    return design


def paper_design(config: ValidateConfig, predicted: dict, rollouts_per_step: int | None = None) -> Design | None:
    """The paper's prediction (predicted.json read by ``loop.load_predicted``, in DesignConfig's names) as a FIFO
    design at R = ``rollouts_per_step`` (default the run's) when it is a replay design; None when it is not
    (on-policy has no N, B)."""
    if predicted["regime"] == "replay" and bool(predicted["capacity"]) and bool(predicted["batch_size"]):
        return _fifo(config, int(predicted["capacity"]), int(predicted["batch_size"]), rollouts_per_step)
    return None


def neighbour_designs(config: ValidateConfig, predicted: dict, group_replay: bool = False) -> list[NamedDesign]:
    """On-policy, the prediction and its four neighbours (N and B doubled and halved, R fixed), then RLOO cells.

    The neighbours are what the verdict needs: if the prediction is right, none of them beats it at equal
    compute. When the prediction is not a replay design, the neighbours are on-policy's. FIFO designs train
    with GRPO; group-replay designs (RLOO loss, leave-one-out advantage) carry rho, L, c and B = R completions
    per update, i.e. B / K groups of which round(B/K / (1 + rho)) are fresh. All FIFO designs form the
    family the theory ranks (``family``).
    """
    R = config.rollouts_per_step
    designs = [_ranked("on-policy", _on_policy(config, R))]
    paper = paper_design(config, predicted)
    N0, B0 = (R, R) if paper is None else (paper.capacity, paper.batch_size)
    if paper is not None:
        designs.append(_ranked("predicted", paper))
    centre = "predicted" if paper is not None else "on-policy"
    for label, N, B in (("N x2", 2 * N0, B0), ("N x0.5", N0 // 2, B0), ("B x2", N0, 2 * B0),
                         ("B x0.5", N0, B0 // 2)):
        neighbour = _accepted(config, f"{centre}, {label}", N, B)
        if neighbour is not None:
            designs.append(neighbour)
    unique, seen = [], set()
    for d in designs:
        if (d.config.capacity, d.config.batch_size) not in seen:
            seen.add((d.config.capacity, d.config.batch_size))
            unique.append(d)
    return unique + group_replay_designs(config, group_replay)


def group_replay_designs(config: ValidateConfig, group_replay: bool) -> list[NamedDesign]:
    """The RLOO cells (``GROUP_REPLAY_CELLS``) at B = R completions per update; none unless ``group_replay``."""
    R = config.rollouts_per_step
    designs = []
    for rho, L, c in GROUP_REPLAY_CELLS if group_replay else ():
        name = "RLOO rho=0" if rho == 0 else f"RLOO rho={rho:g}, L={L}, c={c:g}"
        designs.append(NamedDesign(name, False, DesignConfig(
            buffer="group-replay", loss="rloo", capacity=R, batch_size=R, rollouts_per_step=R,
            group_size=config.group_size, replay_ratio_groups=rho, max_age=L, clip_c=c)))
    return designs


def _add_design(designs: list[NamedDesign], design: NamedDesign) -> str:
    """Append ``design`` unless one with its buffer, N, B and R (and e, m, k) is there; the name of the one in the
    list."""
    def key(d: NamedDesign) -> tuple:
        c = d.config
        return c.buffer, c.capacity, c.batch_size, c.rollouts_per_step, c.epochs, c.mini_batches, c.stale_k

    for d in designs:
        if key(d) == key(design):
            return d.name
    designs.append(design)
    return design.name


def fixed_b_designs(config: ValidateConfig, predicted: dict, pick: dict | None, group_replay: bool = False,
                    forgetting: dict | None = None) -> tuple[list[NamedDesign], dict[str, str]]:
    """The family where replay can win (issue 23; docs/THEORY.md, the noise-scale rule) and where each rule's pick is.

    At B = --rollouts-per-step: on-policy (R = N = B), FIFO replay at R = N = B / y for y in 2, 4, 8 (the shortest
    horizon x = 1), on-policy at B / 2 and B / 4, then the noise-scale rule's design (``pick``; None: no measured
    B_noise), the forgetting-aware rule's (``forgetting``, ``theory.forgetting.forgetting_pick``; None: no kappa) and
    the paper's (predicted.json; R = B) where they are not already in the list. Every design carries its own R (fresh
    rollouts per step). Returns the designs and {"noise-scale", "forgetting", "paper"} -> design name.
    """
    B = config.rollouts_per_step
    designs = [_ranked("on-policy", _on_policy(config, B))]
    designs += [_ranked(f"replay y={y}", _fifo(config, B // y, B, B // y)) for y in FIXED_B_REPLAY_RATIOS]
    designs += [_ranked(f"on-policy B/{d}", _on_policy(config, B // d)) for d in FIXED_B_SMALLER]
    centres = {}
    for rule, name, chosen in (("noise-scale", "noise-scale rule", pick),
                               ("forgetting", "forgetting-aware rule", forgetting)):
        if chosen is not None:
            centres[rule] = _add_design(designs, designs[0] if chosen["regime"] == "on-policy" else _ranked(
                name, _fifo(config, chosen["capacity"], B, chosen["rollouts_per_step"])))
    paper = paper_design(config, predicted, B)
    centres["paper"] = "on-policy" if paper is None else _add_design(designs, _ranked("predicted", paper))
    return designs + group_replay_designs(config, group_replay), centres


def horizon_designs(config: ValidateConfig, designs: list[NamedDesign]) -> list[NamedDesign]:
    """The fixed-b family plus replay at y = B/R = HORIZON_Y with the horizons x = N/R in HORIZON_XS (issue 30): where
    the optimizer's forgetting could make replay pay (docs/THEORY.md, "Forgetting"); names "replay y=4 x=16", ..."""
    designs = list(designs)
    B = config.rollouts_per_step
    r = B // HORIZON_Y
    for x in HORIZON_XS:
        _add_design(designs, _ranked(f"replay y={HORIZON_Y} x={x}", _fifo(config, x * r, B, r)))
    return designs


def reuse_designs(config: ValidateConfig, designs: list[NamedDesign], printed: Design | None
                  ) -> tuple[list[NamedDesign], str | None]:
    """The fixed-b family plus the reuse knobs the trainers have, at B = --rollouts-per-step (issue 40):
    num_iterations e in REUSE_EPOCHS (R = B, one mini-batch), k-step-off staleness for k in REUSE_STALENESS (R = B,
    each batch trained once, k updates late, GRPO's clipped ratio to the stored behaviour log-probs: the M2PO
    reference's and the async trainers' correction), selective and uniform replay at N = REUSE_HORIZON x B (R = B),
    and ``printed`` (optimal's answer for this run's inputs; None: it made none). Returns the designs and the printed
    answer's name in them (None without one)."""
    designs = list(designs)
    B, g = config.rollouts_per_step, config.group_size
    for e in REUSE_EPOCHS:
        _add_design(designs, _ranked(f"num_iterations {e}", Design.epochs_of(B, e, 1, g)))
    for k in REUSE_STALENESS:
        _add_design(designs, _ranked(f"{k}-step-off", Design.overlapped_at(B, k, g)))
    fifo = _fifo(config, REUSE_HORIZON * B, B, B)
    _add_design(designs, NamedDesign(f"selective replay x={REUSE_HORIZON}", True,
                                     DesignConfig.from_design(fifo, loss="grpo", buffer="selective")))
    _add_design(designs, _ranked(f"replay x={REUSE_HORIZON}", fifo))
    name = None if printed is None else _add_design(designs, _ranked("optimal's answer", printed))
    return designs, name


def design_cost(design: DesignConfig, steps: int, mu: float) -> dict:
    """Fresh rollouts, samples trained and compute of ``steps`` updates of ``design``, in sample-update units.

    Compute = mu * fresh rollouts + samples trained (an update of B samples costs B, a rollout mu).
    FIFO / on-policy: R fresh per step, so compute = T (mu R + B). Group replay: B / K groups per update,
    the first step all fresh, then round(B/K / (1 + rho)) fresh groups: K (B/K + (T - 1) B_fresh) fresh
    rollouts (RLOO budget, theory/group_replay.py; rho <= L, so the pool covers the replay demand). Stale-k:
    (T + k) R fresh rollouts, the k pre-filled batches with the T generated.
    """
    if design.buffer == "group-replay":  # App. B, Replay-RLOO
        fresh = int(fresh_verifier_evaluations(design.group_size, design.groups_per_update, steps,
                                               design.replay_ratio_groups))
    elif design.buffer == "epochs":  # one generation of R every e m updates, at the first (core/designs.epochs_step)
        fresh = -(-steps // (design.epochs * design.mini_batches)) * design.rollouts_per_step
    elif design.buffer == "stale-k":  # k base-policy batches pre-fill the queue at step 0 (core/designs.stale_k_step):
        fresh = (steps + design.stale_k) * design.rollouts_per_step  # an async trainer's k batches still in flight
    else:
        fresh = steps * design.rollouts_per_step
    trained = steps * design.batch_size
    return {"fresh_rollouts": fresh, "samples_trained": trained, "compute": mu * fresh + trained}


def steps_at_budget(design: DesignConfig, budget: float, mu: float) -> int:
    """The most updates (at least 1) whose ``design_cost`` compute fits in ``budget``: equal compute.

    Every step after the first costs the same (mu * fresh per step + B); the first step may cost more
    (group replay: all of its groups are fresh; stale-k: its k pre-filled batches), so
    T = 1 + floor((budget - first) / per_step).
    """
    slack = 1e-9 * budget  # budget = 40 (mu R + R) must buy 40 on-policy updates, not 39 after rounding
    if design.buffer == "epochs":  # generations come in lumps: the most T whose cost fits, counted up from below
        per_update = mu * design.rollouts_per_step / (design.epochs * design.mini_batches) + design.batch_size
        steps = max(1, math.floor((budget + slack) / per_update))  # the cost's lower bound: an upper bound on T
        while steps > 1 and design_cost(design, steps, mu)["compute"] > budget + slack:
            steps -= 1
        return steps
    first = design_cost(design, 1, mu)["compute"]
    per_step = design_cost(design, 2, mu)["compute"] - first
    if design.buffer not in ("group-replay", "stale-k"):
        return max(1, math.floor((budget + slack) / per_step))  # T (mu R + B) <= budget
    return max(1, 1 + math.floor((budget + slack - first) / per_step))

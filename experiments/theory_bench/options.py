"""The prediction benchmark's protocol constants, settings and options (``replay-theory experiment theory-test``).

Papers: experience-replay (docs/REFERENCES.md), Sec. 3, Thm 3.4, Thm 3.5 / App. C.3; McCandlish et al. 2018
(arXiv 1812.06162), Eq. 2.7; the forgetting-aware rule of ``theory/forgetting.py`` (docs/THEORY.md, "Forgetting").
Protocol: docs/SIMULATION.md, 'Does a design rule predict?'.

| code name | symbol | meaning |
|---|---|---|
| ``BATCH`` | B = 256 | the pinned batch (the user's recipe) |
| ``GROUP`` | G | rollouts per prompt group |
| ``X_GRID``, ``Y_GRID`` | N/R, B/R | staleness horizon, replay ratio |
| ``MUS`` | mu | rollout cost / per-sample update cost |
| ``FLOORS`` | R_floor | generation latency floor |
| ``FAMILIES``, ``EPOCHS_GRID`` | (e, m) | design families beyond the grid (opt-in): epochs at R = B, overlap |
| ``SELECTIVE_GRID`` | (x, y) | --families selective: [E8]'s FIFO admitting the unequal-reward groups |
| ``INSTANCES``, ``HELD_OUT`` | -- | the instances scored (dev + held out) |
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from ...checks import Range, invalid, require_integer
from ...core.memory import MAX_SIZE, Estimate, Size, check_sizes
from ...simulate import to_target
from ...simulate.config import SimConfig
from ...simulate.config import peak_bytes as sim_peak_bytes
from ...simulate.envs.quadratic import QuadraticConfig
from ...theory import forgetting

#: What ``theory_bench`` re-exports from here (``from .options import *``).
__all__ = [
    "BATCH", "BETA1", "BOOTS", "CAP_FACTOR", "CURVATURE_EVERY", "DEFAULT_SETTINGS", "DEV_INSTANCES", "EPOCHS_GRID",
    "EXACT_LR_RATIO", "FAMILIES", "FLOORS", "FORWARD_SAMPLE_UPDATES", "GROUP", "HEADLINE_FLOOR", "HELD_OUT",
    "HVP_SAMPLES", "HVP_SAMPLE_UPDATES",
    "INSTANCES", "LR_RATIO", "MAX_EXTEND", "MAX_STEP_SIZES", "MUS", "NEXT_HELD_OUT", "ON_POLICY_BATCHES", "OPTIMIZERS",
    "Options", "PILOT_BUDGET", "PILOT_FRACTION", "PILOT_MAX_STEPS", "PILOT_RUNS", "PILOT_SEED", "PRINTED_STEPS_RATIOS",
    "PRINTED_WORK_RATIO", "QUADRATIC_CONDITION", "QUADRATIC_NOISE", "QUICK_EPOCHS_GRID", "QUICK_FLOORS",
    "QUICK_ON_POLICY_BATCHES", "QUICK_SELECTIVE_GRID", "QUICK_X_GRID", "QUICK_Y_GRID", "READINGS", "RESCORE_SAMPLES",
    "RESCORE_STEPS", "SEEDS", "SELECTIVE_GRID",
    "SETTINGS", "STALENESS", "SelectiveDesign", "Setting", "TARGET_FRACTION", "X_GRID", "Y_GRID", "check_options",
    "command_line", "has_groups", "is_selective", "number_list", "options_from", "peak_bytes"]

BATCH = 256
GROUP = 8
X_GRID = (1, 4, 16)
Y_GRID = (1, 2, 4, 8, 16, 32)
ON_POLICY_BATCHES = (8, 16, 32, 64, 128, 256)
QUICK_X_GRID = (1, 16)
QUICK_Y_GRID = (1, 4, 16)
QUICK_ON_POLICY_BATCHES = (32, 64, 128, 256)
QUICK_FLOORS = (0, 64)
"""--quick's latency floors unless --floor: each floor's printed answers are trained, so fewer floors keep it short."""
EPOCHS_GRID = ((2, 1), (2, 4), (4, 1), (4, 4))
"""--families epochs: (e, m) of the epoch designs at R = B = 256 (e passes over m mini-batches of B / m)."""
QUICK_EPOCHS_GRID = ((2, 4),)
SELECTIVE_GRID = ((4, 2), (16, 2), (4, 8), (16, 8))
"""--families selective: (x, y) of the selective designs, each beside the grid's uniform FIFO at the same (B, R, N) so
that the two compare at one step cost. A subset of the grid, not all of it: x = 1 holds one step, so dropping the
equal-reward groups only shortens what is drawn from (no older sample to keep longer), while at x = 4 and 16 the
buffer keeps admitted samples x / (1 - z) steps ([E8]); y = 2 and 8 are a moderate and a heavy reuse. Each selective
design costs as much training as its uniform twin (a rollout setting's slowest designs are these long, reused ones)."""
QUICK_SELECTIVE_GRID = ((16, 4),)
"""--quick's one selective design: the quick grid's x = 16, y = 4 (its longest horizon at its middle reuse)."""
FAMILIES = {"epochs": f"epoch designs at R = {BATCH}: e passes over m mini-batches of R / m, (e, m) in "
                      f"{', '.join(f'({e}, {m})' for e, m in EPOCHS_GRID)} (--quick: (2, 4))",
            "overlap": "overlapped designs at every on-policy batch: each rollout trained once, one update after the "
                       "policy that generated it (the simulator's stale-k at k = 1), a step costing max(mu floor, "
                       "mu R + B) (forgetting.step_cost)",
            "selective": "selective replay designs (the simulator's buffer selective, [E8]: a FIFO of N admitting only "
                         "the groups whose rewards are not all equal, B drawn uniformly) at (x, y) in "
                         f"{', '.join(f'({x}, {y})' for x, y in SELECTIVE_GRID)} (--quick: (16, 4)), beside the "
                         "uniform FIFO at the same sizes; rollout settings only (the quadratic has no groups of "
                         "rewards); and dynamic sampling at every on-policy batch (the simulator's buffer dynamic, "
                         "[E11]: rounds of B until B rollouts have a non-zero advantage, each used once); optimal's "
                         "printed answer prices both from the pilot's zero share (--zero-share)"}
"""The design families ``--families`` adds to the grid (none by default: the protocol evidence.json was written by)."""
HELD_OUT = (811, 821, 823)
"""The held-out instances the default command reads (the first of ``READINGS``, which advise/evidence.json pools):
named as NEXT_HELD_OUT at be1e85f before their first run, and first run by the protocol whose drift M2(s) is the user's
estimate from RESCORE_SAMPLES re-scored rollouts an age (``inputs.measure_drift``), whose re-scoring is reserved in
the pilot's budget (``inputs.pilot_affordable``, ``RESCORE_STEPS``) and whose pilot's own re-scoring is counted in its
compute, the rule unchanged (docs/SIMULATION.md). 719, 727 and 733, named as NEXT_HELD_OUT at 4c04c83 before their
first run, held out the protocol before it: first run by the protocol that reads the drift M2(s) off the
user's logged run as well as b (``measure.measure_recipe_log``: B_simple pooled over the whole run and the drift of
the run's last policy against each age's, in every cell; the pilot's kappa, and its drift where larger, where the pilot
is affordable: ``inputs.drift_staleness``), chosen on 0, 691, 701, 709 and 673, 677, 683 (docs/SIMULATION.md). 653,
659 and 661, named at cb71c0b and first run by the protocol that read b alone from the log, held it out, read again on
691, 701 and 709; 563, 569 and 571, named at the commit that capped SGD's tuned step at the Newton step (c5412de) and
first run by that rule, held out the protocol before it (b from the pilot's first 8% of the run), read again on
577-593 and 613-619. The sets before them, each named before its first run and read once a rule or the protocol
changed, are development instances now: 269, 271, 281 (named as NEXT_HELD_OUT at c388869) and 431, 439, 443 (at
fcb3a90), the first reading of issue 38's pilot-budget protocol (the pilot sized to PILOT_FRACTION = 8% of the recipe,
and none where one step of it costs more: ``pilot_affordable``); 457, 461, 463 and 467, 479, 487, its second and third
readings, the rule unchanged (NEXT_HELD_OUT says when each was named). The printed answer is scored at optimal's
default --max-steps-ratio 1000 (least compute) and at 2. The previous protocol (the pilot sized to 10% of the recipe,
always run) was held out by 181, 193, 197 and 239, 241, 251 (its margin PILOT_FRACTION was read off their units); the
rule before the guard's factors below 1 by 137, 139, 149 (named at aa6cc23, first run at 765a591) and 167, 173, 179
(named at 87386dd, first run at 416f828), and before its margin changed by 89, 97, 101 and 103, 107, 109
(docs/SIMULATION.md keeps each set's own result)."""
INSTANCES = (0, *HELD_OUT)
DEV_INSTANCES = (0,)
"""Instance 0 is the one the benchmark and the rule were developed on (with 1 and 2, which the earlier benchmark and
the audits looked at). 3 and 4, the first held-out pair, were scored at commit cc02c48 and read again since; 47, 53
and 59, the second, were first run at commit a46489a by the first pilot-only protocol (docs/SIMULATION.md keeps that
result) and read before the protocol changed (the pilot's length counting its curvature steps, the least-compute
printed row): all are development instances now. 17 and 23 were run at full size by the review of issue 38, 0-30 with
--quick by the robustness check (bench/), 112, 127 and 131 by the tests and the stop checks, 1019-1021 and 1031 by a
stop's --quick check (with --families on 1031); 89-109 as HELD_OUT
says; 73, 79 and 83 (named at commit 70bca03) by the first --families epochs run (docs/SIMULATION.md); 61, 67 and 71
(held out until the guarded rule) by the protocol of commit a46489a and again by the guarded rule's development, whose
B_FACTORS and first MARGIN were chosen on them and on 47, 53 and 59; 137, 139, 149, 167, 173 and 179 held out the
rule before the guard's factors below 1 (HELD_OUT says how), and 223, 227 and 229, first run by the --families selective
run, are where those factors were chosen. The next held-out set is ``NEXT_HELD_OUT``."""
NEXT_HELD_OUT = (1061, 1063, 1069)
"""Named here, before their first run: the instances the next evidence is read on once a rule or the protocol changes
(which makes HELD_OUT development instances). Nothing may be tuned on them. (151, 157 and 163, named before 181, 193
and 197, were first run by the --families overlap run of docs/SIMULATION.md; 191 by a stop's --quick check; 223, 227
and 229 by the first --families selective run. 331, 337 and 347 are named here, before their first run, for the
--families epochs,overlap,selective run of the guard priced from b/16: issue 40's held-out targets with every family
in the grid. 349, 353 and 359 are named here, before their first run, for the same --families run with the rows of
time within a work budget, PRINTED_WORK_RATIO: issue 40's targets read a second time, on instances nobody has run.
457, 461 and 463, named as NEXT_HELD_OUT at fcb3a90, are read by the default protocol with the rule and the protocol
unchanged, a second held-out reading of HELD_OUT's evidence; 491, 499 and 503 are named here, before their first run,
for the --families epochs,overlap,selective run of the pilot-budget protocol: issue 40's targets read a third time.
509, 521 and 523 are named here, before their first run, for the same --families run with selective replay priced
from the pilot's zero share (optimal --zero-share, ``Options.prices_zero_share``): issue 40's targets read a fourth
time. 467, 479 and 487, named as NEXT_HELD_OUT at 91a390e, were read by the default
protocol with the rule unchanged (heldout3-467, a third reading of it); then SGD's tuned step was capped at the
Newton step and the guard given the whole epoch family (forgetting.TUNED_KAPPA, guarded.py), chosen on families-509's
and the default readings' stored runs, which made all of them development instances. 563, 569 and 571 are named
here, before their first run, for the default protocol's reading of that rule, and 541, 547 and 557 for its
--families epochs,overlap,selective reading: issue 40's targets read a fifth time. 599, 601 and 607 are named here,
before their first run, for the same --families run with dynamic sampling in the selective family and in the printed
answer's search (docs/THEORY.md [E11]): issue 40's targets read a sixth time. 577, 587 and 593, named as
NEXT_HELD_OUT at c5412de, were then read by the default protocol with the rule unchanged (heldout5-577, the capped
rule's second reading; docs/SIMULATION.md), and 613, 617 and 619 named as the next. 631, 641 and 643 are named here,
before their first run, for the next --families epochs,overlap,selective reading: issue 40's targets read a seventh
time (families-631, read with one pass over mini-batches offered under every optimizer, commit b801367). 613, 617
and 619, NEXT_HELD_OUT since 4bf7919, were then read by the default protocol with the rule unchanged (heldout6-613,
the capped rule's third reading; docs/SIMULATION.md), and 653, 659 and 661 named as the next, which became HELD_OUT
when b came from the user's logged run (which made 613, 617 and 619 development instances); 673, 677 and 683 are
named here, before their first run, for that protocol's --families epochs,overlap,selective reading: issue 40's
targets read an eighth time. 691, 701 and 709, NEXT_HELD_OUT since 0c7fa7f, were then read by the default protocol
with the rule unchanged (heldout8-691, its second reading; docs/SIMULATION.md), and 719, 727 and 733 named as the
next. 743, 751 and 757 are named here, before their first run, for the --families epochs,overlap,selective reading
of the protocol that reads the drift M2(s) off the user's logged run too (``inputs.drift_staleness``): issue 40's
targets read a ninth time (famheld-743), and 719, 727 and 733 were first run by that protocol's default reading,
HELD_OUT now (heldout9-719). 761, 769 and 773 were named then, before their first run, as the next default
reading's, and 787, 797 and 809 for the next --families epochs,overlap,selective reading: issue 40's targets read
a tenth time. 761, 769 and 773 were then read by the default protocol with the rule and the protocol unchanged
(heldout10-761, its second reading, at 47d76db; docs/SIMULATION.md), and 811, 821 and 823 named, before their
first run, as the next, HELD_OUT now: first run by the protocol with the sampled drift (heldout11-811). 853, 859 and
863 were named then, before their first run, as the next default reading's, and 881, 887 and 907 for the
--families epochs,overlap,selective reading after 787, 797 and 809's (famheld11-787, the sampled drift's). 853, 859
and 863 were then read by the default protocol with the rule and the protocol unchanged (heldout12-853, its second
reading, at e5b8c5f; docs/SIMULATION.md), and 929, 937 and 941 named, before their first run, as the next. They
were then read by the default protocol with the rule and the protocol unchanged (heldout13-929, its third reading, at
e6dfbe2; docs/SIMULATION.md), and 947, 953 and 967 named, before their first run, as the next. They are read by
the default protocol with the rule and the protocol unchanged (heldout14-947, its fourth reading, at f2e9d66), and
1039, 1049 and 1051 named, before their first run, as the next. They are read by the default protocol with the rule
and the protocol unchanged (heldout15-1039, its fifth reading, with 811-823 rerun from scratch at 927d027, which
reproduced advise/evidence.json's every number), and 1061, 1063 and 1069 named here, before their first run, as the
next.
787, 797 and 809 were then read by the --families epochs,overlap,selective protocol with the sampled drift, the rule
unchanged (famheld11-787, at adeca76; docs/SIMULATION.md); 881, 887 and 907 stay named for the next such reading.)"""
READINGS = ((811, 821, 823), (853, 859, 863), (929, 937, 941), (947, 953, 967), (1039, 1049, 1051))
"""Every held-out set the current rule and protocol were read on, each named before its first run and read once, in
the order they were read (HELD_OUT first: the default command's). advise/evidence.json pools the five runs
(experiments/theory_pool: 1200 held-out cells a floor), so that ``optimal`` quotes every reading, not one chosen
among them; tests/unit/test_evidence_current.py checks that the record pools exactly these."""
SEEDS = 16
BOOTS = 200
MUS = (0.5, 1.0, 2.0, 5.28, 20.0)
FLOORS = (0, 16, 64, 128)
"""Latency floors in rollouts per step: 0 (the paper's cost), 16, 64 = B/4 (the headline: a small batch is not free),
128 = B/2."""
HEADLINE_FLOOR = 64
TARGET_FRACTION = 0.9
LR_RATIO = math.sqrt(2.0)
MAX_EXTEND = 4
"""Rounds of two more step sizes beyond an edge where the best one sits (factor sqrt(2) apart)."""
EXACT_LR_RATIO = 2 ** 0.25
CAP_FACTOR = 4.0
"""A design runs until its compute is CAP_FACTOR x on-policy's at B = 256 under the cost model kindest to it; beyond
that it is not reached (censored, counted)."""
PILOT_MAX_STEPS = 6000
STALENESS = forgetting.DRIFT_AGES
PILOT_BUDGET = 0.1
"""Issue 38's bound on the pilot: 10% of on-policy at B's compute to the target (the scored replicates' mean), what the
tables count the pilot against."""
PILOT_FRACTION = 0.08
"""The pilot a user plans: 8% of on-policy at B's compute to the target as the user's recipe (``RECIPE``, one tuned
run on the pilot's seeds) measures it, never a scored run. A fifth below ``PILOT_BUDGET`` because the recipe is an
estimate: on the held-out units of heldout-pool2 it ran to 1.33x the scored runs' steps (bandit-grpo / SGD / 197: the
pilot's ``recipe_steps`` 61 against the on-policy B=256 row's 46), so a pilot of 10% of the recipe cost over 10% of
the scored run there (margin set from that run's units, a protocol choice: the rule and its inputs are not tuned by
it). A run too short for a pilot of one step and its curvature pairs within that share (``pilot_affordable``) is run
without one: the user asks optimal with the log's --noise-scale alone (``measure.measure_recipe_log``; no --kappa, no
drift: on-policy answers only), and with nothing measured in records from before the log (the floor rule's batch)."""
PILOT_SEED = 10_000
"""The pilot's seeds (its run, the recipe's search) start at PILOT_SEED + instance; every scored run's at instance."""
PILOT_RUNS = 1
"""The pilot is one run, as one user has: its estimates carry one run's noise (pooling seeds would claim a pilot
PILOT_RUNS times the compute counted)."""
CURVATURE_EVERY = 8
"""Curvature pairs and B_crit's HVPs on every 8th pilot step (counted from the last, so the last step has them): three
HVPs each, counted in the pilot's compute (``HVP_SAMPLE_UPDATES``, ``HVP_SAMPLES``)."""
HVP_SAMPLE_UPDATES = 2.0
"""An HVP counted as 2 sample-updates per sample it runs over (Pearlmutter's R-op: a forward and a backward pass over
the gradient's graph, about twice a gradient), in the cost model's unit (a step costs mu max(R, floor) + B)."""
HVP_SAMPLES = BATCH // 4
"""The samples an HVP is counted over: a quarter of the step's batch (the pairs' quarters). The simulator applies the
expected loss's Hessian (exact, or central differences of the exact gradient); a trainer's HVP over 64 samples
estimates it with noise this benchmark does not add."""
RESCORE_SAMPLES = BATCH // 4
"""The drift M2(s) over the user's logged run (``measure.measure_recipe_log``): at each age s > 0 of the table, a
quarter batch of the rollouts the run generated at step T - s, their log-probs at generation (every trainer logs them:
TRL's old_per_token_logps, verl's old_log_prob) against one forward pass at the run's last policy T. The simulator
does the same on RESCORE_SAMPLES rollouts of each age's policy (``inputs.measure_drift``: the rule reads that estimate,
the exact M2(s) of the two policies is stored beside it), and the forward passes are counted: the logged run's in every
cell and reserved in the pilot's budget (``inputs.pilot_affordable``), the pilot's own table in its compute."""
FORWARD_SAMPLE_UPDATES = 1.0 / 3.0
"""A forward pass over one sample counted as 1/3 sample-update (an update is a forward and a backward pass, about three
forward passes), in the cost model's unit; the re-scoring above costs (ages - 1) x RESCORE_SAMPLES of them."""
RESCORE_STEPS = 1
"""The two drift re-scorings a pilot's length leaves room for, in steps of on-policy at B = 256: each reads at most
len(DRIFT_AGES) - 1 = 7 ages and the run's first policy, 8 x RESCORE_SAMPLES forward passes, 171 sample-updates; the
two, 341, are less than the cheapest step's 384 (mu = 0.5, floor 0)."""

BETA1 = 0.9
QUADRATIC_CONDITION = 100.0
QUADRATIC_NOISE = (1.0, 3.0, 10.0, 30.0, 100.0)
"""The noisy quadratic's noise levels: B_simple / 256 at the median of its noise-free path."""


@dataclass(frozen=True)
class Setting:
    """An environment, its loss and where each optimizer's step-size search starts."""

    name: str
    env: str  # simulate.envs registry name
    env_config: dict
    loss: tuple[str, str] | None  # (simulator loss, advantage) on a rollout environment; None: the quadratic's F
    description: str
    sgd_lr0: float  # the pilot's first step sizes centre on this, in units of 1/L
    adam_lr0: float  # absolute


SETTINGS = {
    **{f"quadratic-noise{n:g}": Setting(f"quadratic-noise{n:g}", "quadratic",
                                        {"condition": QUADRATIC_CONDITION, "noise_scale": n * BATCH,
                                         "target_fraction": TARGET_FRACTION}, None,
                                        f"noisy quadratic, d = 16, condition {QUADRATIC_CONDITION:g}, Sigma = s^2 H, "
                                        f"B_simple / 256 = {n:g}", 0.25, 0.05)
       for n in QUADRATIC_NOISE},
    "two-prompts": Setting("two-prompts", "bandit", {"num_prompts": 2, "feature_dim": 4, "skill_alignment": 0.3},
                           ("no-trust-region", "leave-one-out"),
                           "bandit, 2 prompts, 4 features: steps nearly independent of B (b << 1); IS loss", 4.0, 0.5),
    "bandit-grpo": Setting("bandit-grpo", "bandit", {}, ("grpo", "grpo"),
                           "bandit, 64 prompts, 16 actions; the clipped GRPO loss", 0.5, 0.25),
    "noisy-reward": Setting("noisy-reward", "noisy-bandit", {"reward_noise": 2.0}, ("no-trust-region", "leave-one-out"),
                            "the bandit observed through N(0, 2^2) reward noise (b >> 1); IS loss", 0.5, 0.25),
}
DEFAULT_SETTINGS = tuple(SETTINGS)
OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class SelectiveDesign(forgetting.Design):
    """A FIFO design (B, R, N) trained by the buffer selective ([E8], ``core/buffers/uniform.py``
    ``SelectiveFifoBuffer``): only the groups whose rewards are not all equal enter, B drawn uniformly. Its step costs
    what its uniform twin's does (R generated, B trained); its own type keeps it apart from that twin in the records,
    the run keys and the rules' menus (``is_selective``). On-policy, it is dynamic sampling ([E11], the buffer
    dynamic), whose step costs the rounds it draws (``refill_rounds`` in its row)."""

    selective: bool = True
    buffer: ClassVar[str] = "selective"


def is_selective(design: forgetting.Design) -> bool:
    """Whether a design is a selective one: a --families selective grid design (in no objective's menu but the
    printed answer's: the objectives give it inf) or an answer ``optimal`` priced with the pilot's zero share."""
    return design.selective


def has_groups(setting: str) -> bool:
    """Whether a setting draws groups of rewards (a rollout environment; the quadratic's F has none, so no group is
    ever of equal rewards and a selective design would be its uniform twin, number for number)."""
    return SETTINGS[setting].loss is not None


@dataclass(frozen=True)
class Options:
    """The benchmark's options: ``experiment theory-test``'s options are these fields (``options_from``)."""

    instances: tuple[int, ...] = INSTANCES
    """Comma-separated instance seeds (the quadratic's start, the bandit's features): 0 is the development instance,
    811, 821 and 823 held out (HELD_OUT); 0 with --quick."""
    settings: tuple[str, ...] = field(default=DEFAULT_SETTINGS, metadata=Range(choices=lambda: {
        name: setting.description for name, setting in SETTINGS.items()}).field())
    """Comma-separated settings."""
    optimizers: tuple[str, ...] = OPTIMIZERS
    """sgd, adam or both (comma-separated)."""
    mus: tuple[float, ...] = MUS
    """Comma-separated rollout-cost ratios at which the same runs are re-priced."""
    floors: tuple[int, ...] = FLOORS
    """Comma-separated generation latency floors in rollouts per step (a step costs mu max(R, floor) + B)."""
    seeds: int = SEEDS
    """Seeds for each design and step size, an integer >= 2; 8 with --quick."""
    quick: bool = False
    """A 2 x 3 grid, on-policy at 4 batches, 8 seeds unless --seeds, instance 0 unless --instance, floors 0 and 64
    unless --floor (a smoke run)."""
    families: tuple[str, ...] = field(default=(), metadata=Range(choices=lambda: FAMILIES).field())
    """Comma-separated design families trained and scored beside the grid (none by default, the protocol
    advise/evidence.json quotes): epochs adds epoch designs, overlap overlapped (one-step-off) designs, and optimal's
    printed answer may then be one; selective adds selective replay designs on the rollout settings (a subset of the
    grid's (x, y): SELECTIVE_GRID), scored in the whole grid's best, and optimal's printed answer prices them from the
    pilot's zero share (--zero-share, [E8]), so it may be one (trained off the grid where it falls)."""

    @property
    def grid(self) -> list[tuple[int, int]]:
        xs, ys = (QUICK_X_GRID, QUICK_Y_GRID) if self.quick else (X_GRID, Y_GRID)
        return [(x, y) for y in ys for x in xs]

    @property
    def on_policy_batches(self) -> tuple[int, ...]:
        return QUICK_ON_POLICY_BATCHES if self.quick else ON_POLICY_BATCHES

    @property
    def units(self) -> list[tuple[str, str, int]]:
        return [(s, o, i) for i in self.instances for s in self.settings for o in self.optimizers]

    def designs(self, setting: str | None = None) -> list[tuple[str, forgetting.Design]]:
        """(label, design): on-policy at each batch, then the pinned-B FIFO grid, then the families' designs; a
        ``setting``'s (None: every design any setting trains): the selective designs on a rollout setting only."""
        out = [(f"on-policy B={b}", forgetting.Design.on_policy_at(b)) for b in sorted(self.on_policy_batches)]
        out += [(f"x={x} y={y}", forgetting.Design(BATCH, BATCH // y, x * BATCH // y)) for x, y in self.grid]
        out += [(f"epochs e={e} m={m}", forgetting.Design.epochs_of(BATCH, e, m)) for e, m in self.epochs_grid]
        out += [(f"overlapped B={b}", forgetting.Design.overlapped_at(b)) for b in self.overlap_batches]
        if setting is None or has_groups(setting):  # the quadratic has no groups of rewards: no selective design
            out += [(f"selective x={x} y={y}", SelectiveDesign(BATCH, BATCH // y, x * BATCH // y))
                    for x, y in self.selective_grid]
            out += [(f"dynamic B={b}", SelectiveDesign(b, b, b, True)) for b in self.dynamic_batches]
        return out

    @property
    def dynamic_batches(self) -> tuple[int, ...]:
        """The batches of the dynamic sampling designs trained on a rollout setting (none without --families
        selective): the on-policy ones, each beside on-policy at the same B."""
        return tuple(sorted(self.on_policy_batches)) if "selective" in self.families else ()

    @property
    def selective_grid(self) -> tuple[tuple[int, int], ...]:
        """(x, y) of the selective designs trained on a rollout setting (none without --families selective)."""
        if "selective" not in self.families:
            return ()
        return QUICK_SELECTIVE_GRID if self.quick else SELECTIVE_GRID

    @property
    def overlap_batches(self) -> tuple[int, ...]:
        """The batches of the overlapped designs trained (none without --families overlap): the on-policy ones."""
        return tuple(sorted(self.on_policy_batches)) if "overlap" in self.families else ()

    @property
    def max_staleness(self) -> int:
        """optimal's --max-staleness for the printed answer: 1 with --families overlap (it prices k = 1), else 0."""
        return 1 if "overlap" in self.families else 0

    @property
    def prices_zero_share(self) -> bool:
        """Whether optimal's printed answer reads the pilot's zero share (--zero-share, pricing selective replay):
        with --families selective, whose grid trains selective designs to score it against."""
        return "selective" in self.families

    @property
    def epochs_grid(self) -> tuple[tuple[int, int], ...]:
        """(e, m) of the epoch designs trained (none without --families epochs)."""
        if "epochs" not in self.families:
            return ()
        return QUICK_EPOCHS_GRID if self.quick else EPOCHS_GRID

    @property
    def max_epochs(self) -> int:
        """The most passes optimal may answer with: the grid's largest e (1 without --families epochs)."""
        return max((e for e, _ in self.epochs_grid), default=1)


MAX_STEP_SIZES = 8
"""The most step sizes a design trains at once (the pilot's coarse grid and its refinement: 6 + 2), each with --seeds
rows."""


def peak_bytes(values: dict) -> Estimate:
    """Peak bytes of the benchmark at ``values["--seeds"]``: its largest run at once, the FIFO at x = 16, y = 1 (N = 16
    B, R = B = 256) on the largest rollout environment (bandit-grpo's 64 prompts x 16 actions) at MAX_STEP_SIZES x
    seeds rows (``simulate.config.peak_bytes`` for one step: the runs stop at their target, so the step count is not
    known before), and the noisy quadratic's stored noise vectors (rows x N x d)."""
    rows = MAX_STEP_SIZES * values["--seeds"]
    largest = forgetting.Design(BATCH, BATCH // min(Y_GRID), max(X_GRID) * BATCH // min(Y_GRID),
                                group_size=to_target.GROUP)
    run = asdict(SimConfig.from_design(largest, seeds=rows, steps=1))
    dim = QuadraticConfig().dim
    return Estimate({**sim_peak_bytes(run).terms,
                     f"the quadratic's stored noise: rows x N x d = {rows} x {largest.capacity} x {dim}":
                         rows * largest.capacity * dim * 8})


def _bad_choices(values, allowed) -> bool:
    """Whether a list option is empty or names a value outside ``allowed``."""
    return not values or any(v not in allowed for v in values)


def _bad_mus(mus) -> bool:
    """Whether --mu is empty, holds a value not finite and > 0, or repeats one."""
    return not mus or any(not (0 < mu < math.inf) for mu in mus) or len(set(mus)) != len(mus)


def _is_count(value) -> bool:
    """Whether a value is an integer (not a bool)."""
    return not isinstance(value, bool) and isinstance(value, int)


def _bad_counts(values) -> bool:
    """Whether a list option is empty, repeats a value, or holds one that is not an integer >= 0."""
    return not values or len(set(values)) != len(values) or any(not _is_count(v) or v < 0 for v in values)


def check_options(options: Options) -> None:
    """One-line ValueErrors naming the option and its valid values, before any work."""
    if _bad_choices(options.settings, SETTINGS):
        raise ValueError(f"--setting must be a comma-separated list of {', '.join(SETTINGS)}, got "
                         f"{','.join(options.settings) or 'nothing'}")
    if _bad_choices(options.optimizers, OPTIMIZERS):
        raise ValueError(f"--optimizer must be a comma-separated list of {', '.join(OPTIMIZERS)}, got "
                         f"{','.join(options.optimizers) or 'nothing'}")
    if _bad_mus(options.mus):
        raise ValueError(f"--mu must be a comma-separated list of distinct finite numbers > 0, got "
                         f"{','.join(f'{m:g}' for m in options.mus) or 'nothing'}")
    if _bad_counts(options.floors):
        raise ValueError(f"--floor must be a comma-separated list of distinct integers >= 0 (rollouts), got "
                         f"{','.join(map(str, options.floors)) or 'nothing'}")
    require_integer("--seeds", options.seeds, 2, note=" (the bootstrap resamples seeds)")
    if any(floor > MAX_SIZE for floor in options.floors):
        raise invalid("--floor", f"a comma-separated list of distinct integers in [0, {MAX_SIZE}]",
                      ",".join(map(str, options.floors)), fmt="s")
    check_sizes((Size("--seeds", 2),), {"--seeds": options.seeds}, peak_bytes)
    if any(v not in FAMILIES for v in options.families) or len(set(options.families)) != len(options.families):
        raise ValueError(f"--families must be a comma-separated list of distinct names from {', '.join(FAMILIES)}, "
                         f"got {','.join(options.families)}")
    if _bad_counts(options.instances):
        raise ValueError(f"--instance must be a comma-separated list of distinct integers >= 0, got "
                         f"{','.join(map(str, options.instances)) or 'nothing'}")


def number_list(text: str, flag: str, valid: str, kind=float) -> tuple:
    """A comma-separated list of numbers. For a list of reals, two bare integers (``5,28``) are refused: in a
    decimal-comma locale that is one number (5.28, the paper's mu), and reading it as two would run other settings
    than the user meant without a word; the line says how to write either."""
    parts = text.split(",")
    if kind is float and len(parts) == 2 and all(re.fullmatch(r"\d+", part.strip()) for part in parts):
        a, b = (part.strip() for part in parts)
        raise ValueError(f"{flag} {text} is ambiguous: the two values {a} and {b}, or {a}.{b} with a decimal comma? "
                         f"Write {a}.{b} for one value (the decimal separator is a point), or {a}.0,{b} for two")
    try:
        return tuple(kind(part) for part in parts)
    except ValueError:
        raise invalid(flag, valid, text) from None


def options_from(typed: dict) -> Options:
    """The options from the values typed on the command line (text for the lists), --quick's smaller defaults where
    one was not typed, checked before any work (one line naming the option)."""
    quick = bool(typed.get("quick"))
    counts = "a comma-separated list of distinct integers >= 0"
    numbers = {"mus": ("--mu", "a comma-separated list of finite numbers > 0", float),
               "floors": ("--floor", counts, int), "instances": ("--instance", counts, int)}
    given = {name: number_list(typed[name], *how) for name, how in numbers.items() if name in typed}
    given.update({name: tuple(part.strip() for part in typed[name].split(","))
                  for name in ("settings", "optimizers", "families") if name in typed})
    quick_defaults = {"instances": (0,), "seeds": 8, "floors": QUICK_FLOORS} if quick else {}
    options = Options(**{**quick_defaults, **given, "seeds": typed.get("seeds", quick_defaults.get("seeds", SEEDS)),
                         "quick": quick})
    check_options(options)
    return options


def command_line(out, given: list[tuple[str, object]]) -> str:
    """The command line that produced a benchmark, as evidence.json records it: the (flag, typed value) pairs."""
    parts = ["replay-theory experiment theory-test --out", Path(out).name]
    parts += [f"{flag} {value}" for flag, value in given if flag != "--quick"]
    return " ".join(parts + (["--quick"] if any(flag == "--quick" for flag, _ in given) else []))


PRINTED_STEPS_RATIOS = (1000.0, 2.0)
"""``optimal``'s --max-steps-ratio for the printed rows: its default and largest (least compute whatever the steps:
the question the grid's best answers) and 2 (a design may take up to 2x on-policy at B's steps: a wall-time budget)."""

PRINTED_WORK_RATIO = 2.0
"""``optimal``'s --max-work-ratio for the printed row that answers for time within a compute budget (issue 40): at a
latency floor, the fastest design whose work (GPU time spent, the floor's waiting not counted: its compute at floor 0)
is within 2x on-policy at B's; scored against the fastest grid design within that budget, per replicate. Trained and
scored at floors > 0 only (at floor 0 time is work) and not with --quick."""

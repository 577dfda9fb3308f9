"""The guarded answer: the trivial floor rule's design unless the forgetting model finds one cheaper by a margin at
every b it cannot rule out.

Model: ``theory/forgetting.py`` (McCandlish et al. 2018's steps with the FIFO noise the optimizer keeps, psi(x,
kappa)). Why a guard (issue 38; docs/SIMULATION.md, "The guarded rule"): fed a pilot's inputs, the bare argmin lost to
"on-policy at max(floor, smallest batch)" on held-out benchmark instances, for three measured reasons, each met by one
guard here:

1. **b is known to within decades.** A pilot reads B_simple early in a run, where |G| is large; on the development
   units it was below the b that sets the steps in 36 of 44, by up to two decades, and it can be above it (on
   instance 229, quadratic-noise30 under SGD, 9.6x above: 6908 against 717). Every candidate is priced at b / 16,
   b / 4, b, 4b, ..., 256b (``B_FACTORS``) and ranked by its worst regret over those (minimax regret).
2. **Staleness is priced only where measured.** No candidate trains on a sample older than the staleness table
   reaches (``Staleness.oldest_measured``): a one-step pilot, or no table, leaves reuse within one step only.
3. **Reuse only under the optimizers it was right for.** The benchmark's horizon ratio steps(x=16)/steps(x=1) was
   within 25% of the prediction for 115 of 120 quadratic pairs under SGD, 58 of 120 under Adam and 29 of 119 on the
   bandits (instances 0, 61, 67, 71; on the held-out 89, 97, 101 afterwards: 105 of 114, 39 of 102, 26 of 121);
   replay and epochs are offered under ``REUSE_OPTIMIZERS`` only. Overlapped generation (``max_staleness``) reuses
nothing (psi = 1), so it is offered under every optimizer, but only where the staleness cost reaches age 1; so is one
pass over m mini-batches (e = 1, with ``max_epochs`` > 1: each sample trained once, at ages 0..m - 1, where the
staleness cost reaches age m - 1).

The default is the floor rule's design: on-policy at the smallest whole-group batch at or above the latency floor
that keeps the steps within the cap at b. The candidates are each search's answers (one search per b factor, each
keeping the cheapest design of every family at its b) and, when epochs are offered, the whole epoch family
(``forgetting.epoch_family``): a design cheapest at no single b can be the least in worst regret over all of them
(4 epochs over 4 mini-batches was the grid's best in most epoch cells of the --families runs, and no search at one b
returned it). Another candidate replaces it only if the default's worst regret exceeds
the candidate's by ``MARGIN`` (an overlapped design by ``OVERLAP_MARGIN``). ``B_FACTORS`` were chosen on development
instances (47, 53, 59, 61, 67, 71), ``MARGIN`` on those and 0 after the held-out runs of 89-109 (see its note); the
held-out set that tests it is named in experiments/theory_bench/options.py.

| code name       | symbol      | meaning                                                             |
|-----------------|-------------|---------------------------------------------------------------------|
| ``b_noise``     | B_noise     | the measured noise scale in samples, priced from b / 16 to 256 b     |
| ``worst``       | max_f reg   | a candidate's largest compute / (least compute) over b_noise x f     |
| ``default``     | --          | the floor rule's design                                              |
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from . import forgetting as fg
from .designs import Design

B_FACTORS = (1.0, 1 / 16, 1 / 4, 4.0, 16.0, 64.0, 256.0)
"""b is priced at these multiples of the measured one (the measured b first: the search at it is the answer's): the
pilot's B_simple was below the b that sets the steps by up to about two decades on the development units, and above it
by up to a decade (the factors below 1, added after the --families selective run on 223, 227 and 229, whose worst
cell read b 9.6x too high: upward factors alone then chose a batch and buffer sized for noise that was not there)."""
MARGIN = 2.0
"""The factor by which a candidate's worst regret must beat the floor rule's before it replaces it. Chosen on the
development runs whose printed answers are this guard's (instances 0, 61, 67, 71 and 47, 53, 59: 278 cells where the
first margin, 1.2, moved the answer) as the smallest margin with the most cells within 1.2x of the grid's best: 253 of
278 at 2.0, 2.5 and 3, against 241 at 1.2, 250 at 1.75 and 224 never moving (the floor rule); the held-out runs of
89-109, read before the change, agree (323 of their 358 at 2.0, 293 at 1.2 and 293 never moving). A 1.2 margin moved
the answer on the model's errors as well as on its gains (``python -m replay_theory.experiments.guard_margin``)."""
OVERLAP_MARGIN = 1.2
"""An overlapped design's margin, dynamic sampling's and one pass's over mini-batches (e = 1, m > 1): the guard's first
margin, for the designs that reuse nothing. One pass was offered under every optimizer at this margin after the
--families run of 599, 601 and 607, whose stored runs were rescored with it (docs/SIMULATION.md): where the answer
moved (133 cells) its median regret was 0.99 against 1.03, within 1.2x in 113 against 117.
The benchmark trains no overlapped design, so nothing chose another. 2.0 would rule it out wherever the floor rule's
batch is the best synchronous design: an overlapped step (R = B) is at most a share 1 / (2 + mu) shorter than the
synchronous one (forgetting.step_cost), never half. Dynamic sampling saves at most the zero groups' training, a share
z / (1 + mu) of plain on-policy's step at the same informative batch ([E11]), which 2.0 would rule out at every mu."""
REUSE_OPTIMIZERS = ("sgd",)
"""The optimizers under which the benchmark found the replay prediction right (module docstring, item 3). Epochs too:
offering epoch designs under Adam (FIFO replay still not) was tried on the --families run of 491, 499 and 503 after
its reading (families-491's runs rescored, a trial not kept) and lost: within 1.2x in 66, 56, 48 and 47% of cells at
floors 0-128 against 72, 63, 55 and 54%: the 109 Adam answers that moved, epoch designs of m = 2-128 mini-batches a
generation, were within 1.2x of the grid's best in 23 (the answers they replaced in 88), median 1.57x against 1.07x
(docs/SIMULATION.md; docs/trials/adam-epochs.patch reproduces it). With the quadratic's exact inputs the epoch model's
steps against on-policy at B were within 25% in 45-62 of 65 units per design under SGD and 30-54 under Adam, where it
was optimistic by up to 16x (``python -m replay_theory.experiments.epochs_check`` on the four --families runs).
Offering epochs under Adam only where the measured kappa < 1, the regime where that check found the epoch model right,
lost too (docs/trials/adam-epochs-linear.patch on families-509's runs: 19 of 84 moved cells within 1.2x against 71).
FIFO replay under Adam behind this guard (its b range and margin) lost too: on heldout5-577's runs rescored, 20 of the
53 moved cells within 1.2x against 50 (docs/trials/adam-fifo-guarded.patch, docs/SIMULATION.md).
One pass over mini-batches (e = 1) is not reuse: offered under every optimizer (``_reuses_nothing``, OVERLAP_MARGIN).
Selective replay (``zero_share``) is reuse too: offered under these optimizers only; dynamic sampling reuses nothing
and is offered under every optimizer."""


@dataclass(frozen=True)
class Guarded:
    """The guarded answer: the search at the measured b (``search``), the design to run (``choice``) and the floor
    rule's (``default``), each priced at the measured b, their worst regrets over b_noise x ``B_FACTORS``, and which
    guards limited reuse (``limits``: short phrases, empty when none did)."""

    search: fg.WholeDesign
    choice: fg.Prediction
    default: fg.Prediction
    worst_choice: float
    worst_default: float
    limits: tuple[str, ...]
    candidates: tuple[Design, ...] = ()  # every design compared, the default first
    worst: tuple[float, ...] = ()  # each candidate's worst regret over b_noise x the factors

    @property
    def moved(self) -> bool:
        """Whether the model moved the answer off the floor rule's design."""
        return self.choice.design != self.default.design


def reuse_limits(optimizer: str, staleness: fg.Staleness, reach: float = math.inf,
                 single_pass: bool = False) -> tuple[float, tuple[str, ...]]:
    """(the oldest age a design may train on, in updates; below 0: no reuse at all) and why, in words: said only where
    it limits something, i.e. below ``reach``, the oldest age the search would otherwise consider. ``single_pass``:
    one pass over mini-batches is searched beside (it reuses nothing), which the words say."""
    if optimizer not in REUSE_OPTIMIZERS:
        what = "no replay or epochs" if not single_pass else "no replay or second epoch (one pass over mini-batches, "\
                                                              "which reuses nothing, is priced)"
        return -1.0, (f"{what} under {optimizer}: the benchmark found the replay prediction right under "
                      f"{', '.join(REUSE_OPTIMIZERS)} only",)
    oldest = staleness.oldest_measured
    if oldest >= reach:
        return oldest, ()
    if oldest == 0:
        return oldest, ("no sample reused after the update it was generated for: no staleness cost measured beyond "
                        "age 0 (a profile's sigma^2(s) table by age gives one)",)
    return oldest, (f"no sample reused past age {oldest:g} updates, the oldest its staleness cost was measured at "
                    f"({staleness.source})",)


def overlap_limit(max_staleness: int, staleness: fg.Staleness) -> tuple[int, tuple[str, ...]]:
    """(the staleness bound the search may use: 0 or 1, see ``forgetting.whole_design``) and why it is 0 when the
    user allowed more: an overlapped rollout is trained at age 1, whose cost must have been measured."""
    if max_staleness < 1:
        return 0, ()
    if staleness.oldest_measured < 1:
        return 0, ("no overlapped generation: its rollouts are trained one update old, and no staleness cost was "
                   "measured beyond age 0 (a profile's sigma^2(s) table by age gives one)",)
    return 1, ()


def max_batch_or(max_batch: int | None, batch_size: int) -> int:
    """The largest batch the searches consider: ``max_batch``, by default 4 B (``forgetting.whole_design``'s)."""
    return int(4 * batch_size if max_batch is None else max_batch)


def floor_batch(b_noise: float, batch_size: int, group_size: int, floor: float, max_steps_ratio: float,
                top: int) -> int:
    """The floor rule's batch: the smallest whole-group batch >= max(floor, one group) whose on-policy steps
    1 + B_noise / B' stay within ``max_steps_ratio`` x on-policy's at B (at most ``top``, the largest searched)."""
    need = b_noise / (max_steps_ratio * (1 + b_noise / batch_size) - 1) if max_steps_ratio > 1 else batch_size
    low = max(float(floor), float(group_size), min(need, float(batch_size)))
    batch = math.ceil(low / group_size) * group_size
    return int(min(batch, top))


def guarded_design(b_noise: float, batch_size: int, mu: float, memory: fg.Memory | None, *, optimizer: str,
                   group_size: int = 1, staleness: fg.Staleness = fg.NO_STALENESS, floor: float = 0.0,
                   max_steps_ratio: float = 2.0, max_horizon: int = 64, max_batch: int | None = None,
                   max_epochs: int = 1, b_factors: tuple[float, ...] = B_FACTORS,
                   margin: float = MARGIN, max_staleness: int = 0, overlap_margin: float = OVERLAP_MARGIN,
                   max_work_ratio: float = math.inf, zero_share: float = 0.0) -> Guarded:
    """The guarded answer (module docstring). Candidates: the floor rule's design and ``forgetting.whole_design``'s
    on-policy, replay and epoch answers at every b_noise x f, kept where their steps at the measured b are within the
    cap; each is priced at every b_noise x f, and the one with the least worst regret replaces the default only if
    it beats the default's worst regret by ``margin`` (an overlapped one by ``overlap_margin``); of those that do, the
    least worst. ``b_factors`` starts at 1: the measured b itself. ``max_work_ratio``: every candidate's work at the
    measured b within that many times on-policy's at B (``forgetting.whole_design``), the floor rule's batch too (its
    batch stops at ``forgetting.work_batch_limit``, [W1]). A budget that the answer without it keeps changes nothing:
    that answer is returned (with the budgeted searches' family bests), so a budget never trades the guard's
    robustness for a design it would not pick unconstrained; only a budget that answer breaks re-runs the guard over
    the designs within it (whose worst regrets are then against the best within the budget). ``zero_share`` z > 0:
    selective replay designs are candidates too ([E8], under ``REUSE_OPTIMIZERS`` only, at ``margin``), and dynamic
    sampling under every optimizer ([E9], [E11]: it reuses nothing), at ``overlap_margin``."""
    if not b_factors or b_factors[0] != 1.0:
        raise ValueError(f"b_factors must start at 1 (the measured b), got {b_factors}")
    guard = partial(_guarded, b_noise, batch_size, mu, memory, optimizer, group_size, staleness, floor,
                    max_steps_ratio, max_horizon, max_batch, max_epochs, zero_share=zero_share)
    rest = (margin, max_staleness, overlap_margin)
    free = guard(b_factors, *rest, math.inf)
    if math.isinf(max_work_ratio):
        return free
    if not fg.within_budgets(free.choice, math.inf, max_work_ratio * free.search.at_batch.work):
        return guard(b_factors, *rest, max_work_ratio)
    # the answer keeps the budget: only the family bests within it are needed, from the search at the measured b
    budgeted = guard((1.0,), *rest, max_work_ratio)
    return replace(free, search=budgeted.search)


def _guarded(b_noise: float, batch_size: int, mu: float, memory: fg.Memory | None, optimizer: str, group_size: int,
             staleness: fg.Staleness, floor: float, max_steps_ratio: float, max_horizon: int, max_batch: int | None,
             max_epochs: int, b_factors: tuple[float, ...], margin: float, max_staleness: int, overlap_margin: float,
             max_work_ratio: float, *, zero_share: float = 0.0) -> Guarded:
    """``guarded_design`` over the designs within ``max_work_ratio`` (inf: every design)."""
    epochs_reach = max_epochs * (max_batch_or(max_batch, batch_size) // group_size) - 1 if max_epochs > 1 else 0
    reach = max(max_horizon - 1, epochs_reach)  # the oldest age the searches would consider: x - 1 or e m - 1
    # one pass over m mini-batches (e = 1) reuses nothing: every optimizer, within the ages the staleness reaches
    pass_age = staleness.oldest_measured if max_epochs > 1 else -1.0
    max_age, limits = reuse_limits(optimizer, staleness, reach, single_pass=pass_age >= 1)
    overlap, overlap_limits = overlap_limit(max_staleness, staleness)
    limits += overlap_limits
    searches = [fg.whole_design(b_noise * f, batch_size, mu, memory, group_size=group_size, staleness=staleness,
                                floor=floor, max_steps_ratio=max_steps_ratio, max_horizon=max_horizon,
                                max_batch=max_batch, max_epochs=max_epochs, max_age=max_age, max_staleness=overlap,
                                max_work_ratio=max_work_ratio, zero_share=zero_share, pass_age=pass_age)
                for f in b_factors]
    top = fg.work_top(max_batch_or(max_batch, batch_size) // group_size * group_size, b_noise, batch_size, group_size,
                   max_work_ratio)
    default = Design.on_policy_at(floor_batch(b_noise, batch_size, group_size, floor, max_steps_ratio, top))
    candidates = [default, searches[0].at_batch.design]
    for s in searches:
        candidates += [p.design for p in (s.on_policy, s.replay, s.epochs, s.overlapped, s.selective, s.dynamic)
                       if p is not None]
    if searches[0].epochs is not None:  # the whole epoch family: a design cheap at no one b can be the most robust
        candidates += fg.epoch_family(top, group_size, max_epochs, max_age)
        candidates += fg.epoch_family(top, group_size, 1, pass_age)  # one pass, within its own ages
    candidates = list(dict.fromkeys(candidates))  # unique, the default first (ties keep it)
    price = partial(fg.predict_many, mu=mu, memory=memory, staleness=staleness, floor=floor, zero_share=zero_share)
    at_b = price(candidates, b_noise)
    cap, work_cap = max_steps_ratio * searches[0].at_batch.steps, max_work_ratio * searches[0].at_batch.work
    keep = [i for i, p in enumerate(at_b) if i == 0 or fg.within_budgets(p, cap * (1 + 1e-12), work_cap)]
    candidates, at_b = [candidates[i] for i in keep], [at_b[i] for i in keep]
    rows = [[p.compute for p in at_b]] + [  # the measured b's row is at_b's: priced once
        [p.compute for p in price(candidates, b_noise * f)]
        for f in b_factors[1:]]
    compute = np.array(rows)  # (factors, candidates)
    worst = (compute / compute.min(axis=1, keepdims=True)).max(axis=0)  # (candidates,)
    # a design that reuses nothing (overlapped generation, dynamic sampling, one pass over mini-batches) clears the
    # first margin, a reuse design the second: the margins were chosen against the model's reuse errors
    need = np.array([overlap_margin if _reuses_nothing(d) else margin for d in candidates])  # (candidates,)
    clears = worst[0] > need * worst  # never the default itself
    pick = int(np.argmin(np.where(clears, worst, np.inf))) if clears.any() else 0
    return Guarded(searches[0], at_b[pick], at_b[0], float(worst[pick]), float(worst[0]), limits,
                   tuple(candidates), tuple(float(w) for w in worst))


def _reuses_nothing(design: Design) -> bool:
    """Each sample trained once, off-policy or not: overlapped generation, dynamic sampling, one pass (e = 1) over
    m > 1 mini-batches. On-policy designs are the default's family and need no margin."""
    return bool(design.max_staleness or design.dynamic or (design.epochs == 1 and design.mini_batches > 1))

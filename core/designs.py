"""Every buffer design and loss in one registry: its typed parameters, buffer, loss, advantage, rules and batch step.

The one place every name is mapped to its implementation (docs/CONTRIBUTING.md): ``BUFFER_DESIGNS`` (name ->
``BufferDesign``) and ``LOSSES`` (name -> ``LossDesign``), each with its help, parameters, rules (``validate_design``,
``validate_trainer_design``, ``check_capacity``) and whether a trainer runs it. The simulator, the validator (both
through ``core/pipeline.py``), the trainers (``integrations/``) and the command line all read these two tables.
Papers (docs/REFERENCES.md): experience-replay, FreshPER, RLOO group replay, ExGRPO, M2PO.

Units (one per name): ``rollouts_per_step`` and ``batch_size`` count RESPONSES
(completions) for every design; groups of ``group_size`` responses to one prompt
are ``groups``; ExGRPO's prompts are ``questions`` (``batch_size // group_size``).

| code name               | paper symbol | meaning                                                          |
|-------------------------|--------------|------------------------------------------------------------------|
| ``rollouts_per_step``   | R            | fresh responses generated per step (sync pipeline)               |
| ``batch_size``          | B            | responses per update                                             |
| ``group_size``          | G / K        | responses per prompt                                             |
| ``capacity``            | N            | FIFO / positive-bias / PER capacity, in responses                |
| ``replay_ratio_groups`` | rho          | RLOO replayed groups per fresh group                             |
| ``max_age``             | L            | RLOO maximum replay age                                          |
| ``clip_c``              | c            | RLOO one-sided sequence-weight clip                              |
| ``delta``               | delta        | positive-bias share of correct rollouts                          |
| ``per_alpha/beta/tau``  | alpha/beta/tau | FreshPER priority exponent, IS exponent, age decay             |
| ``stale_k``             | k            | M2PO stale-k delay in updates                                    |
| ``exgrpo_rho``          | rho          | ExGRPO experience share of the questions                         |
| ``tau_m2``              | tau_M2       | M2PO second-moment budget                                        |
| ``eps_low/high``        | eps          | GRPO clip range                                                  |
| ``epochs``              | e            | passes over each generation of R (PPO epochs, TRL num_iterations)|
| ``mini_batches``        | m            | updates per pass, each on b = R / m responses                    |
"""

from __future__ import annotations

import dataclasses
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, TypeVar

import numpy as np

from ..checks import Range, invalid, require_integer, require_number, require_one_of, require_unit_interval
from ..theory.designs import Design
from ..theory.group_replay import fresh_groups_per_step
from . import advantages, losses
from .buffers import (
    PER_BASES,
    EpochSchedule,
    ExGRPOBuffer,
    FifoBuffer,
    GroupReplayBuffer,
    PositiveBiasBuffer,
    PrioritizedBuffer,
    ReplayBuffer,
    SelectiveFifoBuffer,
    StaleKQueue,
    UniformQuestionBuffer,
)
from .metrics import zero_std_groups
from .rng import RandomSource
from .rollouts import RolloutBatch


class RegistryEntry(Protocol):
    """What ``choices`` reads of a ``BufferDesign`` or a ``LossDesign``."""

    @property
    def help(self) -> str: ...

    @property
    def trainer(self) -> bool: ...


def choices(registry: Mapping[str, RegistryEntry], trainer: bool = False) -> dict[str, str]:
    """{name: one-line help} of a registry (``BUFFER_DESIGNS`` or ``LOSSES``), in registry order.

    ``trainer``: only the entries a trainer can run (``entry.trainer``): the TRL trainer's and ``trl-replay``'s
    choices are these, so an entry marked there is available to the trainer with no other edit.
    """
    return {name: entry.help for name, entry in registry.items() if entry.trainer or not trainer}


def check_choice(option: str, value: object, registry: Mapping[str, RegistryEntry], trainer: bool = False,
                 where: str = "") -> None:
    """A one-line ValueError naming ``option`` and the registry's valid names unless ``value`` is one of them."""
    require_one_of(option, value, choices(registry, trainer), where=where)


# --------------------------------------------------------------------------- typed parameters


@dataclass(frozen=True)
class BatchParams:
    """Sizes every design shares."""

    rollouts_per_step: int = 64
    """R: fresh responses generated per step (sync pipeline; a multiple of group_size)."""
    batch_size: int = 64
    """B: responses per update, for every design (group replay: B / G groups; ExGRPO: B / G questions)."""
    group_size: int = 8
    """G: responses per prompt (group-relative advantages)."""


@dataclass(frozen=True)
class FifoParams:
    """FIFO buffer, experience-replay Sec. 3 (uniform) and App. B (without replacement)."""

    capacity: int = 256
    """N: FIFO capacity in responses (fifo, positive-bias, prioritized)."""
    replacement: bool = True
    """Sample the FIFO buffer with replacement (Sec. 3 theory) or without (App. B code)."""


@dataclass(frozen=True)
class PositiveBiasParams:
    """Positive-bias FIFO, experience-replay Sec. 4.3."""

    delta: float = 0.2
    """Positive-bias buffer: share of the N slots kept for the freshest correct rollouts, in [0, 1)."""


@dataclass(frozen=True)
class FreshPERParams:
    """FreshPER prioritised replay with age decay, Eqs. (2), (14)-(15) and Algorithm 1."""

    per_schedule: str = "algorithm1"
    """FreshPER schedule: algorithm1 (Alg. 1: an on-policy update on the R fresh responses, then per_replay_updates
    prioritised replay updates of B) or every-step (each update adds R fresh responses and samples B)."""
    per_replay_updates: int = 2
    """FreshPER K: prioritised replay updates after each on-policy update (algorithm1 schedule)."""
    per_alpha: float = 0.6
    """FreshPER priority exponent alpha (0: uniform)."""
    per_beta: float = 0.4
    """FreshPER importance-weight exponent beta at the first update."""
    per_beta_final: float = 1.0
    """FreshPER beta at the last update: beta anneals linearly from per_beta (set it to per_beta to keep beta fixed)."""
    per_tau: float = math.inf
    """FreshPER age-decay time constant tau in updates (inf: standard PER)."""
    per_base: str = "reward"
    """FreshPER base priority: reward (|r| + eps, the paper's critic-free choice) or advantage (|A| + eps)."""


@dataclass(frozen=True)
class GroupReplayParams:
    """RLOO whole-group replay, Sec. 3.2 and App. B."""

    replay_ratio_groups: float = 1.0
    """RLOO rho: replayed groups per fresh group (fresh groups = round(B / G / (1 + rho)))."""
    max_age: int = 2
    """RLOO L: groups of age 1..L can be replayed."""


@dataclass(frozen=True)
class StaleKParams:
    """M2PO's stale-k setting, Sec. 3."""

    stale_k: int = 4
    """M2PO stale-k: each update trains on the batch generated k updates earlier."""


@dataclass(frozen=True)
class EpochParams:
    """Epochs over mini-batches (issue 40; TRL num_iterations x steps_per_generation, verl ppo_epochs)."""

    epochs: int = 2
    """e: passes over each generation of R rollouts (TRL num_iterations, verl ppo_epochs); e m updates a generation."""
    mini_batches: int = 1
    """m: updates per pass, each on R / m rollouts, so batch_size must be R / m (TRL steps_per_generation)."""
    epoch_shuffle: bool = False
    """Reshuffle the generation every epoch (textbook PPO) or keep one order per generation (TRL, verl FSDP)."""


@dataclass(frozen=True)
class ExGRPOParams:
    """ExGRPO experience management, Sec. 4 and Algs. 1-2."""

    exgrpo_rho: float = 0.5
    """ExGRPO share of questions drawn from experience, in [0, 1)."""
    exgrpo_units: str = "success-count"
    """Units of ExGRPO's bucket Gaussian: success-count (reference code) or accuracy (paper text)."""
    exgrpo_selection: str = "lowest"
    """Replayed trajectory: lowest (entropy under the current policy), highest or random."""
    exgrpo_start_pass_rate: float = 0.35
    """ExGRPO delayed start: replay switches on once batch pass@1 exceeds this."""
    exgrpo_shaping: bool = True
    """ExGRPO policy shaping f(w) = w/(w + beta) on replayed trajectories (False: the w/o-shaping ablation)."""
    exgrpo_question_selection: str = "buckets"
    """ExGRPO question sampling: buckets (Gaussian over success count) or uniform (the ablation)."""
    exgrpo_skip_retired: bool = True
    """Retired (all-correct) questions also leave fresh sampling."""


@dataclass(frozen=True)
class ClipParams:
    """The GRPO / PPO clip, experience-replay App. E.2."""

    eps_low: float = 0.2
    """GRPO lower clip: ratios below 1 - eps_low are clipped (inf: no trust region)."""
    eps_high: float = 0.2
    """GRPO upper clip: ratios above 1 + eps_high are clipped."""


@dataclass(frozen=True)
class M2POParams:
    """M2PO's second-moment trust region, Sec. 5.2 and Algorithm 1."""

    tau_m2: float = 0.04
    """M2PO budget tau_M2 on the mean (log r)^2 of the candidate tokens."""


@dataclass(frozen=True)
class RLOOParams:
    """RLOO's one-sided sequence-weight clip, Eq. (2)."""

    clip_c: float = 3.0
    """RLOO one-sided clip c of the sequence importance weight."""


@dataclass(frozen=True)
class AsymREParams:
    """AsymRE's shifted baseline (experience-replay App. E)."""

    asymre_delta_v: float = -0.1
    """AsymRE baseline shift delta V in r - (V-hat + delta V)."""


@dataclass(frozen=True)
class ExGRPOShapingParams:
    """ExGRPO's policy shaping, Sec. 4.2."""

    exgrpo_beta: float = 0.1
    """ExGRPO policy-shaping beta in f(w) = w / (w + beta)."""


@dataclass(frozen=True)
class DesignChoice:
    """Which buffer design, loss and advantage: the first fields of every design config (and of ``--help``)."""

    buffer: str = dataclasses.field(default="fifo", metadata=Range(choices=lambda: choices(BUFFER_DESIGNS)).field())
    """Buffer design."""
    loss: str = dataclasses.field(default="grpo", metadata=Range(choices=lambda: choices(LOSSES)).field())
    """Loss (off-policy correction)."""
    advantage: str = "auto"
    """grpo (std-normalised group), group-mean (REINFORCE baseline), leave-one-out (RLOO) or auto (the loss's own)."""


@dataclass(frozen=True)
class DesignConfig(ExGRPOShapingParams, AsymREParams, RLOOParams, M2POParams, ClipParams, ExGRPOParams,
                   EpochParams, StaleKParams, GroupReplayParams, FreshPERParams, PositiveBiasParams, FifoParams,
                   BatchParams, DesignChoice):
    """A buffer design and its loss: the fields the simulator's ``SimConfig`` and the validator's ``RLConfig`` share.

    Fields come from the dataclasses above (``dataclasses`` collects them last base class
    first: the choice, the sizes, then each buffer's and each loss's parameters).
    """

    def params(self, cls: type):
        """The typed view ``cls(**fields of cls)`` of this config, e.g. ``config.params(FifoParams)``."""
        return cls(**{f.name: getattr(self, f.name) for f in dataclasses.fields(cls)})

    @property
    def groups_per_update(self) -> int:
        """B / G: groups (RLOO) or questions (ExGRPO) per update."""
        return self.batch_size // self.group_size

    def resolved_advantage(self) -> str:
        return LOSSES[self.loss].advantage if self.advantage == "auto" else self.advantage

    def validated_design(self, pipeline: str = "sync"):
        """Raise a one-line ValueError naming the field for any inconsistent design; resolve ``advantage``."""
        validate_design(self, pipeline)
        return dataclasses.replace(self, advantage=self.resolved_advantage())

    @property
    def design(self) -> Design:
        """(B, R, N) and G as the one design type (theory/designs.py); on-policy when the buffer is; the epochs
        buffer's e and m (its N is one generation, R); stale-k at k >= 1 with B = R, an overlapped design; the
        selective buffer's, a selective one; the dynamic buffer's, dynamic sampling (selective on-policy)."""
        if self.buffer == "epochs":
            return Design.epochs_of(self.rollouts_per_step, self.epochs, self.mini_batches, self.group_size)
        if self.buffer == "stale-k" and self.stale_k >= 1 and self.batch_size == self.rollouts_per_step:
            return Design.overlapped_at(self.batch_size, self.stale_k, self.group_size)  # each batch once, k late
        return Design(self.batch_size, self.rollouts_per_step, self.capacity, self.buffer in ("on-policy", "dynamic"),
                      self.group_size, selective=self.buffer in ("selective", "dynamic"))

    @classmethod
    def from_design(cls, design: Design, **fields: Any):
        """The config that trains ``design``: its sizes, the on-policy buffer for an on-policy design and the FIFO
        otherwise unless ``fields`` name another buffer (a selective design: the selective buffer); ``fields`` set the
        rest."""
        asked = fields.pop("buffer", "fifo")
        if design.dynamic:  # dynamic sampling: its own batch step, on-policy sizes
            return cls(buffer="dynamic", batch_size=design.batch_size, rollouts_per_step=design.rollouts_per_step,
                       capacity=design.capacity, group_size=design.group_size, **fields)
        buffer = "selective" if design.selective else asked  # a selective design is the selective buffer's
        if design.updates_per_generation > 1:  # an epoch design: the epochs buffer, its e and m
            buffer = "epochs"
            fields = {"epochs": design.epochs, "mini_batches": design.mini_batches, **fields}
        if design.max_staleness:  # an overlapped design: M2PO's stale-k queue trains each batch once, k updates late
            return cls(buffer="stale-k", stale_k=design.max_staleness, batch_size=design.batch_size,
                       rollouts_per_step=design.rollouts_per_step, capacity=design.capacity,
                       group_size=design.group_size, **fields)
        return cls(buffer="on-policy" if design.on_policy else buffer, batch_size=design.batch_size,
                   rollouts_per_step=design.rollouts_per_step, capacity=design.capacity, group_size=design.group_size,
                   **fields)

    @classmethod
    def from_record(cls, record: Mapping[str, Any], **fields: Any) -> "DesignConfig":
        """The design a saved record names, N, B, R from whichever keys it has (``record_key``); ``fields`` set the
        rest. Each size must be an integer >= 1 (a JSON 64.0 reads as 64); a missing or null one is a one-line
        ValueError."""
        sizes = {}
        for name, keys in RECORD_KEYS.items():
            key = record_key(record, name)
            if key is None:
                raise ValueError(f"the record has no {name} (one of {', '.join(keys)})")
            sizes[name] = require_integer(key, record[key], 1, whole_floats=True)
        return cls(**sizes, **fields)


RECORD_KEYS: dict[str, tuple[str, ...]] = {
    "capacity": ("capacity", "buffer_size", "N"),
    "batch_size": ("batch_size", "B"),
    "rollouts_per_step": ("rollouts_per_step", "R"),
}
"""The keys a saved record gives N, B, R under, the current name first. ``replay-theory optimal --json`` (its design
rows too), ``validate predict``'s predicted.json, verify's report rows and the rules' picks (``noise_scale_pick``,
``forgetting_pick``) say ``capacity``, ``batch_size``, ``rollouts_per_step``; files saved before say ``buffer_size``
(optimal) or ``N``, ``B``, ``R`` (predicted.json, report rows, optimal's design rows, the picks)."""


def record_key(record: Mapping[str, Any], name: str) -> str | None:
    """The key ``record`` gives design size ``name`` under (the first of ``RECORD_KEYS[name]`` that is not null)."""
    return next((key for key in RECORD_KEYS[name] if record.get(key) is not None), None)


def in_design_names(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with N, B, R under DesignConfig's names, None where it has none: the one adapter that reads a
    saved file of either shape (``RECORD_KEYS``)."""
    sizes = {name: None if (key := record_key(record, name)) is None else record[key] for name in RECORD_KEYS}
    old = {key for keys in RECORD_KEYS.values() for key in keys}
    return {**{k: v for k, v in record.items() if k not in old}, **sizes}


def design_field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(DesignConfig)]


# --------------------------------------------------------------------------- what a step trains on


@dataclass
class StepBatch:
    """What one step trains on and what it generated (seed axis first)."""

    train: RolloutBatch  # (S, B, ...) the training batch
    weight: np.ndarray  # (S, B) sampler weights (FreshPER IS weights; ones otherwise)
    staleness: np.ndarray  # (S, B) step - created
    time_since_last_use: np.ndarray  # (S, B) steps since the sample's previous use, -1 on first use
    is_fresh: np.ndarray | None  # (S, B) for the losses that treat fresh and replayed differently (RLOO, ExGRPO)
    fresh: RolloutBatch | None  # responses generated this step (None if none)
    generated: int | np.ndarray  # fresh responses generated this step: an int, or (S,) where seeds differ
    fresh_keep: np.ndarray | None = None  # (S, B) ExGRPO: the train items that are fresh (reward, entropy)
    curves: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # design-specific per-step values

    def fresh_view(self) -> tuple[RolloutBatch, np.ndarray] | None:
        """(batch, keep (S, n)): the fresh responses, as a batch and the items of it that are fresh."""
        if self.fresh_keep is not None:
            return self.train, self.fresh_keep
        if self.fresh is None:
            return None
        return self.fresh, np.ones(self.fresh.prompt.shape, bool)


class PipelineState(Protocol):
    """What a design's batch step uses of ``core.pipeline.Pipeline`` (and of the trainers' ``RowReplayBuffer``)."""

    @property
    def config(self) -> DesignConfig: ...

    @property
    def buffer(self) -> ReplayBuffer | None: ...

    @property
    def rng(self) -> RandomSource: ...

    @property
    def state(self) -> dict: ...

    @property
    def settings(self) -> Any: ...  # core.pipeline.PipelineSettings (a trainer's: a namespace with total_steps)

    def fresh_rollouts(self, step: int, weights, *, on_policy: bool = False) -> RolloutBatch | None: ...

    def generate(self, weights, num_groups: int, version) -> RolloutBatch: ...

    def sample_responses(self, weights, prompts: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]: ...

    def score(self, prompts, tokens, mask, logp_behav, reward, created, group) -> RolloutBatch: ...

    def entropy_fn(self, weights) -> Callable: ...


BufferT = TypeVar("BufferT", bound=ReplayBuffer)
UpdateT = TypeVar("UpdateT")  # what a trainer's update returns (stale_k_overlapped)


def design_buffer(pipe: PipelineState, cls: type[BufferT]) -> BufferT:
    """``pipe.buffer`` as the class a design's batch step works on (its ``BufferDesign.make`` built it)."""
    buffer = pipe.buffer
    if not isinstance(buffer, cls):
        raise TypeError(f"buffer {pipe.config.buffer} steps on a {cls.__name__}, the pipeline holds a "
                        f"{type(buffer).__name__}")
    return buffer


# --------------------------------------------------------------------------- batch steps


def _every_step_rollouts(pipe: PipelineState, step: int, weights, *, on_policy: bool = False) -> RolloutBatch:
    """This step's fresh responses, for a design that trains on them at every step: the sync pipeline always has
    them (R), the async one's on-policy queue too (B); only async replay's workers may deliver none."""
    fresh = pipe.fresh_rollouts(step, weights, on_policy=on_policy)
    if fresh is None:
        raise ValueError(f"buffer {pipe.config.buffer} needs fresh rollouts at every step, none came at step {step}")
    return fresh


def _fresh_only(batch: RolloutBatch, step: int) -> StepBatch:
    shape = batch.prompt.shape
    return StepBatch(batch, np.ones(shape), step - batch.created, np.full(shape, -1), None, batch, batch.size)


def on_policy_step(pipe: PipelineState, step: int, weights) -> StepBatch:
    """Train once on the fresh responses (sync: R of them; async: the queue's B)."""
    return _fresh_only(_every_step_rollouts(pipe, step, weights, on_policy=True), step)


def uniform_buffer_step(pipe: PipelineState, step: int, weights) -> StepBatch:
    """FIFO-style designs: generate, add, (FreshPER: refresh priorities), sample B (experience-replay Sec. 3)."""
    buffer = design_buffer(pipe, ReplayBuffer)
    fresh = pipe.fresh_rollouts(step, weights)
    if fresh is not None:
        buffer.add(fresh, step)
    if isinstance(buffer, PrioritizedBuffer):
        buffer.refresh(step)  # FreshPER Alg. 1 step 5: priorities decay with age
    sample = buffer.sample(pipe.config.batch_size, step, pipe.rng)
    return StepBatch(sample.batch, sample.weight, sample.staleness, sample.time_since_last_use, None, fresh,
                     0 if fresh is None else fresh.size)


def per_beta_at(config: DesignConfig, step: int, total_steps: int) -> float:
    """FreshPER's IS exponent at ``step``: linear from per_beta at the first update to per_beta_final at the last."""
    progress = min(1.0, step / max(total_steps - 1, 1))
    return config.per_beta + (config.per_beta_final - config.per_beta) * progress  # "beta anneals to 1" (Sec. 3.5)


def prioritized_step(pipe: PipelineState, step: int, weights) -> StepBatch:
    """FreshPER: Algorithm 1 (one on-policy update on the fresh batch, then K prioritised replay updates) or every-step.

    Algorithm 1, one cycle of K + 1 updates: roll out R responses from the current policy, store them with
    their base priority (lines 1-3), train once on them on-policy (line 4); then K times: refresh every
    priority with its age (line 5), sample B with P ~ p^alpha from the sum tree, weight by Eq. (15), update
    (line 6). Ages count updates. beta anneals linearly (``per_beta_at``).
    """
    config, buffer = pipe.config, design_buffer(pipe, PrioritizedBuffer)
    buffer.beta = per_beta_at(config, step, pipe.settings.total_steps)
    if config.per_schedule == "every-step":
        return uniform_buffer_step(pipe, step, weights)
    if step % (config.per_replay_updates + 1) == 0:  # line 4: the on-policy update of the cycle
        fresh = _every_step_rollouts(pipe, step, weights)
        buffer.add(fresh, step)  # lines 2-3: stored with p_base for the replay updates that follow
        return _fresh_only(fresh, step)
    buffer.refresh(step)  # line 5: priorities decay with age
    sample = buffer.sample(config.batch_size, step, pipe.rng)  # line 6: stratified, P ~ p^alpha, Eq. (15) weights
    return StepBatch(sample.batch, sample.weight, sample.staleness, sample.time_since_last_use, None, None, 0)


def stale_k_step(pipe: PipelineState, step: int, weights) -> StepBatch:
    """M2PO stale-k: push this step's batch, train on the one generated k updates earlier.

    Before the first update the queue is pre-filled with k DISTINCT batches of the base policy (the M2PO
    reference code fills its FIFO of k entries before training), so update t < k trains on base batch t,
    once, and every later update on the batch generated exactly k updates earlier. The pre-fill is
    generated compute, counted at step 0.
    """
    prefill = _stale_k_prefill(pipe, step, weights)
    fresh = _stale_k_generate(pipe, step, weights)
    drawn = design_buffer(pipe, StaleKQueue).sample(pipe.config.batch_size, step, pipe.rng)  # k updates earlier
    return StepBatch(drawn.batch, drawn.weight, drawn.staleness, drawn.time_since_last_use, None, fresh,
                     fresh.size + prefill)


def _stale_k_prefill(pipe: PipelineState, step: int, weights) -> int:
    """Step 0: the queue's k base-policy batches (slots -k .. -1, version 0); the responses generated (0 after)."""
    queue = design_buffer(pipe, StaleKQueue)
    prefill = 0
    if step == 0:
        for j in range(queue.k):
            batch = _every_step_rollouts(pipe, 0, weights)
            queue.add(batch, j - queue.k)
            prefill += batch.size
    return prefill


def _stale_k_generate(pipe: PipelineState, step: int, weights) -> RolloutBatch:
    """This step's fresh batch, pushed for update step + k."""
    fresh = _every_step_rollouts(pipe, step, weights)
    design_buffer(pipe, StaleKQueue).add(fresh, step)
    return fresh


def stale_k_overlapped(pipe: PipelineState, step: int, weights, generation_weights,
                       update: Callable[[StepBatch], UpdateT]) -> tuple[StepBatch, UpdateT]:
    """``stale_k_step`` with this step's generation run beside the update: a k-step-off trainer's overlap (k >= 1).

    The batch update ``step`` trains on was generated k updates earlier, so it is ready before this step's
    generation starts: ``update`` (the trainer's optimizer step, given that batch with no fresh responses yet) runs in
    the calling thread while a second thread generates this step's batch from ``generation_weights`` (a copy of
    ``weights`` the update does not change: generation on its own share of the devices). Returns the step's batch,
    as ``stale_k_step`` makes it, and what ``update`` returned.

    Same numbers as ``stale_k_step`` followed by the update: the pop draws no random number and never returns the
    batch pushed at this step (k >= 1), so taking it before the push changes nothing, and only the generation draws
    from ``pipe.rng`` (``tests/integration/test_validate_overlap.py``, bit for bit on the language model). The
    update must not draw from ``pipe.rng`` either.
    """
    queue = design_buffer(pipe, StaleKQueue)
    if queue.k < 1:
        raise ValueError(f"an overlapped step needs stale_k >= 1 (the batch trained must exist before this step's "
                         f"generation), got {queue.k}")
    prefill = _stale_k_prefill(pipe, step, weights)  # step 0: the base batches, before any update (nothing to overlap)
    drawn = queue.sample(pipe.config.batch_size, step, pipe.rng)  # the batch of k updates earlier
    train = StepBatch(drawn.batch, drawn.weight, drawn.staleness, drawn.time_since_last_use, None, None, prefill)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="generation") as pool:
        generation = pool.submit(_stale_k_generate, pipe, step, generation_weights)
        try:
            result = update(train)
        finally:
            fresh = generation.result()  # an update that raised still waits for the generation (nothing half-pushed)
    return dataclasses.replace(train, fresh=fresh, generated=fresh.size + prefill), result


def epochs_step(pipe: PipelineState, step: int, weights) -> StepBatch:
    """Epochs over mini-batches: R fresh responses every e m updates; update j of a generation trains on mini-batch
    j mod m of epoch j div m (``EpochSchedule``), staleness j. Only a generation step generates (and is charged mu R).
    """
    schedule = design_buffer(pipe, EpochSchedule)
    fresh = None
    if schedule.due():
        fresh = _every_step_rollouts(pipe, step, weights)
        schedule.add(fresh, step)
    drawn = schedule.sample(pipe.config.batch_size, step, pipe.rng)
    return StepBatch(drawn.batch, drawn.weight, drawn.staleness, drawn.time_since_last_use, None, fresh,
                     0 if fresh is None else fresh.size)


MAX_REFILL_ROUNDS = 64
"""Dynamic sampling's most generation rounds in one update: at a zero share z a seed needs more with probability
P(Bin(64 g, 1 - z) < g), below 1e-6 for every g >= 1 at z <= 0.8 (``theory.compute.refill_rounds``). A seed still
short then trains on what it has (the step says so in its ``refill_short`` curve; verl 0.9.1's v1 buffer waits
instead)."""


def dynamic_step(pipe: PipelineState, step: int, weights) -> StepBatch:
    """Dynamic sampling (DAPO; verl ``filter_groups``; docs/THEORY.md [E9], [E11]): rounds of R = B fresh responses
    until every seed holds B / G groups whose rewards are not all equal; each seed trains once on its first B / G such
    groups (generation order) and drops the rest, and is charged mu R for each round up to the one that filled it.

    Every seed draws every round until the last one is full (seed axis first), so a seed's later draws depend on the
    seeds run beside it; the same config gives the same numbers. A seed short after ``MAX_REFILL_ROUNDS`` rounds fills
    its batch with its earliest zero-advantage groups (zero gradient under a group-relative advantage). Curves:
    ``refill_rounds`` (the rounds each seed needed), ``refill_zero_share`` (z over the groups of those rounds) and
    ``refill_short`` (1 where a seed hit the cap)."""
    config = pipe.config
    G, need = config.group_size, config.batch_size // config.group_size  # g: informative groups an update trains
    per_round = config.rollouts_per_step // G
    rounds: list[RolloutBatch] = []
    informative: list[np.ndarray] = []  # (S, per_round) per round: the group's rewards are not all equal
    while True:
        fresh = pipe.generate(weights, per_round, step)
        equal, _ = zero_std_groups(fresh.reward, fresh.group)  # (S, R) each response's group flag
        rounds.append(fresh)
        informative.append(~equal[:, ::G])  # generate lays a group's G responses side by side
        have = np.concatenate(informative, axis=1)  # (S, rounds x per_round)
        if (have.sum(axis=1) >= need).all() or len(rounds) == MAX_REFILL_ROUNDS:
            break
    total = have.shape[1]
    counts = np.cumsum(have, axis=1)  # (S, groups) informative groups so far
    full = counts[:, -1] >= need
    # the round that filled each seed: the one holding its need-th informative group (the cap where none did)
    filled_at = np.where(full, np.argmax(counts >= need, axis=1) // per_round + 1, len(rounds))  # (S,)
    order = np.where(have, np.arange(total), total + np.arange(total))  # informative first, then zero, each in order
    chosen = np.sort(np.argsort(order, axis=1, kind="stable")[:, :need], axis=1)  # (S, g) group indices
    index = (chosen[:, :, None] * G + np.arange(G)).reshape(chosen.shape[0], need * G)  # (S, B) response indices
    train = RolloutBatch.concatenate(rounds).take(index)
    drawn = np.arange(total)[None, :] < (filled_at * per_round)[:, None]  # (S, groups) the rounds each seed needed
    zero_share = ((~have) & drawn).sum(axis=1) / drawn.sum(axis=1)
    shape = train.prompt.shape
    return StepBatch(train, np.ones(shape), step - train.created, np.full(shape, -1), None, train,
                     filled_at * config.rollouts_per_step,
                     curves={"refill_rounds": filled_at.astype(float), "refill_zero_share": zero_share,
                             "refill_short": (~full).astype(float)})


def group_replay_step(pipe: PipelineState, step: int, weights) -> StepBatch:
    """RLOO App. B: replay groups of age 1..L, fresh groups for the rest (a replay shortfall is filled fresh)."""
    config, buffer = pipe.config, design_buffer(pipe, GroupReplayBuffer)
    _, n_replay = buffer.split(config.groups_per_update, config.replay_ratio_groups, step)
    replay = buffer.sample_groups(n_replay, step, pipe.rng) if n_replay else None
    fresh = pipe.generate(weights, config.groups_per_update - n_replay, step)
    if replay is None:
        data = _fresh_only(fresh, step)
        data.is_fresh = np.ones(fresh.prompt.shape, bool)
        return data
    train = RolloutBatch.concatenate([fresh, replay.batch])
    is_fresh = np.concatenate([np.ones(fresh.prompt.shape, bool), np.zeros(replay.batch.prompt.shape, bool)], axis=1)
    tslu = np.concatenate([np.full(fresh.prompt.shape, -1), replay.time_since_last_use], axis=1)
    return StepBatch(train, np.ones(train.prompt.shape), step - train.created, tslu, is_fresh, fresh, fresh.size)


def group_replay_after_update(pipe: PipelineState, step: int, data: StepBatch) -> None:
    assert data.fresh is not None  # group_replay_step generates fresh groups at every step
    design_buffer(pipe, GroupReplayBuffer).add(data.fresh, step)  # RLOO order: sample, update, add fresh, evict


def fresh_questions(retired: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Uniform draws (S, m) with replacement over each seed's non-retired prompts (all if none left)."""
    available = ~retired  # (S, P)
    available[~available.any(axis=1)] = True
    order = np.argsort(~available, axis=1, kind="stable")  # (S, P): available prompts first
    count = available.sum(axis=1, keepdims=True)  # (S, 1)
    pos = np.minimum((u * count).astype(np.int64), count - 1)  # (S, m)
    return np.take_along_axis(order, pos, axis=1)


def exgrpo_step(pipe: PipelineState, step: int, weights) -> StepBatch:
    """ExGRPO Alg. 1: B/G questions, a share from experience with G - 1 fresh responses + the stored o*.

    1. |B_exp| = min(floor(rho B/G), |E|) once the delayed start switched replay on (``ExGRPOBuffer.split``).
    2. Experience questions by bucket weights (Alg. 2; uniform in the ablation) and their o* (lowest entropy
       under the CURRENT policy by default).
    3. Fresh questions uniform over the non-retired prompts.
    4. G fresh responses per fresh question, G - 1 + o* per experience question; advantages over each mixed
       group. The simulator draws a response at the o* slot too and discards it (not counted as generated).
    """
    config, buffer, rng = pipe.config, design_buffer(pipe, ExGRPOBuffer), pipe.rng
    G, B = config.group_size, config.groups_per_update  # B: QUESTIONS per step
    S = buffer.num_seeds
    n = B * G
    active = buffer.active.copy()
    retired_before = buffer.retired.copy()  # (S, P) the retired set when the questions are drawn
    n_exp, _ = buffer.split(B)  # (S,): min(floor(rho B), |E|) once active, else 0
    n_exp = np.asarray(n_exp, dtype=np.int64).reshape(S)
    m = int(n_exp.max())
    if m:
        sample = buffer.sample(m, step, rng, entropy_fn=pipe.entropy_fn(weights))
        assert sample.valid is not None  # ExGRPOBuffer.sample always marks its padding
        exp_valid = sample.valid & (np.arange(m) < n_exp[:, None])  # (S, m)
        if not np.array_equal(exp_valid, sample.valid):
            raise RuntimeError("ExGRPOBuffer.sample and split disagree on |B_exp|")
        exp_valid = np.pad(exp_valid, ((0, 0), (0, B - m)))  # (S, B)
        exp_q = np.pad(sample.batch.prompt, ((0, 0), (0, B - m)))  # (S, B)
    else:
        sample = None
        exp_valid = np.zeros((S, B), bool)
        exp_q = np.zeros((S, B), np.int64)
    not_offered = buffer.retired if config.exgrpo_skip_retired else np.zeros_like(buffer.retired)
    questions = np.where(exp_valid, exp_q, fresh_questions(not_offered, rng.random((S, B))))  # (S, B)
    prompts = np.repeat(questions, G, axis=1)  # (S, n)
    tokens, logp_behav, mask, reward = pipe.sample_responses(weights, prompts)  # (S, n, L) x3, (S, n)
    created = np.full((S, n), step, np.int64)
    tslu = np.full((S, n), -1, np.int64)
    o_star_slot = np.zeros((B, G), bool)
    o_star_slot[:, -1] = True  # the last response of each question's group
    o_star_slot = o_star_slot.ravel()  # (n,)
    replayed = np.repeat(exp_valid, G, axis=1) & o_star_slot  # (S, n) o* positions
    if sample is not None:
        r, j = np.nonzero(exp_valid)  # question j (< m) of the batch is sample item j
        it = np.flatnonzero(o_star_slot)[j]  # item index of its group's o* slot
        stored = sample.batch
        tokens[r, it], mask[r, it] = stored.tokens[r, j], stored.mask[r, j]
        logp_behav[r, it] = stored.logp_behav[r, j]  # pi_past: o*'s stored behaviour log-probs
        reward[r, it] = stored.reward[r, j]
        created[r, it] = stored.created[r, j]
        tslu[r, it] = sample.time_since_last_use[r, j]
    group = np.broadcast_to(step * B + np.repeat(np.arange(B), G), (S, n)).copy()
    train = pipe.score(prompts, tokens, mask, logp_behav, reward, created, group)  # advantage over the mixed group
    fresh = ~replayed
    is_fresh = fresh if config.exgrpo_shaping else np.ones_like(fresh)  # no shaping: o* gets the GRPO clip too
    curves = {"exp_frac": n_exp / B, "replay_active": active.astype(float), "_n_exp": n_exp,
              "_exp_questions": exp_q, "_exp_valid": exp_valid, "_replayed": replayed,
              "_retired_before": retired_before}
    return StepBatch(train, np.ones((S, n)), step - created, tslu, is_fresh, None, n - n_exp, fresh_keep=fresh,
                     curves=curves)


def exgrpo_after_update(pipe: PipelineState, step: int, data: StepBatch) -> dict[str, np.ndarray]:
    """Delayed start sees the fresh pass@1; every group of the step is recorded (Alg. 1 lines 22-29).

    So the step that crosses the threshold is already collected and replay starts at the next
    step; a question whose G - 1 fresh responses all succeed is retired. o*, an exact duplicate,
    is not stored twice.
    """
    buffer, keep = design_buffer(pipe, ExGRPOBuffer), data.fresh_keep
    assert keep is not None  # exgrpo_step always says which train items are fresh
    correct = np.where(keep, data.train.reward == 1.0, 0.0).sum(axis=1) / np.maximum(keep.sum(axis=1), 1)
    buffer.observe_pass_rate(correct)  # (S,) batch pass@1 of the fresh responses (Sec. 4.2 delayed start)
    buffer.add(data.train, step)  # collects only in active seeds; retires all-correct questions
    pipe.state["exp_questions"] = pipe.state.get("exp_questions", 0) + data.curves["_n_exp"]
    return {"n_experience": buffer.n_experience(), "retired": buffer.retired.sum(axis=1)}


def exgrpo_counts(pipe: PipelineState) -> dict[str, float]:
    """ExGRPO's ablation switches (1.0 / 0.0), retired questions at the end and experience questions used."""
    c = pipe.config
    return {"shaping": 1.0 if c.exgrpo_shaping else 0.0,
            "uniform_questions": 1.0 if c.exgrpo_question_selection == "uniform" else 0.0,
            "skip_retired": 1.0 if c.exgrpo_skip_retired else 0.0,
            "retired": float(design_buffer(pipe, ExGRPOBuffer).retired.sum(axis=1).mean()),
            "exp_questions": float(np.mean(pipe.state.get("exp_questions", 0)))}


# --------------------------------------------------------------------------- buffers


@dataclass(frozen=True)
class BufferSpec:
    """Storage facts a buffer constructor needs beyond the design: seeds, sequence length, prompts, dtypes."""

    num_seeds: int
    seq_len: int
    num_prompts: int = 0
    token_dtype: type = np.int16


def _fifo(c: DesignConfig, s: BufferSpec) -> ReplayBuffer:
    return FifoBuffer(s.num_seeds, c.capacity, s.seq_len, replacement=c.replacement, token_dtype=s.token_dtype)


def _selective(c: DesignConfig, s: BufferSpec) -> ReplayBuffer:
    return SelectiveFifoBuffer(s.num_seeds, c.capacity, s.seq_len, token_dtype=s.token_dtype)


def _positive_bias(c: DesignConfig, s: BufferSpec) -> ReplayBuffer:
    return PositiveBiasBuffer(s.num_seeds, c.capacity, s.seq_len, delta=c.delta, token_dtype=s.token_dtype)


def _prioritized(c: DesignConfig, s: BufferSpec) -> ReplayBuffer:
    return PrioritizedBuffer(s.num_seeds, c.capacity, s.seq_len, alpha=c.per_alpha, beta=c.per_beta, tau=c.per_tau,
                             base=require_one_of("per_base", c.per_base, PER_BASES), token_dtype=s.token_dtype)


def _group_replay(c: DesignConfig, s: BufferSpec) -> ReplayBuffer:
    return GroupReplayBuffer(s.num_seeds, c.max_age, c.group_size, s.seq_len, token_dtype=s.token_dtype)


def _stale_k(c: DesignConfig, s: BufferSpec) -> ReplayBuffer:
    return StaleKQueue(s.num_seeds, c.stale_k)


def _epochs(c: DesignConfig, s: BufferSpec) -> ReplayBuffer:
    return EpochSchedule(s.num_seeds, c.epochs, c.mini_batches, shuffle=c.epoch_shuffle)


def _exgrpo(c: DesignConfig, s: BufferSpec) -> ReplayBuffer:
    cls = {"buckets": ExGRPOBuffer, "uniform": UniformQuestionBuffer}[c.exgrpo_question_selection]
    return cls(s.num_seeds, s.num_prompts, c.group_size, s.seq_len, rho=c.exgrpo_rho, units=c.exgrpo_units,
               selection=c.exgrpo_selection, start_pass_rate=c.exgrpo_start_pass_rate, token_dtype=s.token_dtype)


# --------------------------------------------------------------------------- rules (one line each, naming the field)


def capacity_holds_a_step(capacity: int, rollouts_per_step: int) -> bool:
    """N >= R: a FIFO holds at least one step's fresh rollouts (horizon x = N/R >= 1, experience-replay Sec. 3)."""
    return capacity >= rollouts_per_step


def check_capacity(capacity: int, rollouts_per_step: int, names: tuple[str, str] = ("capacity", "rollouts_per_step")
                   ) -> None:
    """The rule ``capacity_holds_a_step`` as a one-line ValueError; ``names``: how the caller calls N and R."""
    if not capacity_holds_a_step(capacity, rollouts_per_step):
        raise invalid(names[0], f">= {names[1]} = {rollouts_per_step} (a FIFO holds at least one step)", capacity)


def _fifo_rules(c: DesignConfig, pipeline: str) -> None:
    if pipeline == "sync":
        check_capacity(c.capacity, c.rollouts_per_step)
    if pipeline == "sync" and not c.replacement and c.batch_size > c.rollouts_per_step:
        raise ValueError(f"batch_size must be <= rollouts_per_step = {c.rollouts_per_step} when sampling "
                         f"without replacement (after the first step the buffer holds only R rollouts), "
                         f"got {c.batch_size}")


def _selective_rules(c: DesignConfig, pipeline: str) -> None:
    check_capacity(c.capacity, c.rollouts_per_step)
    if not c.replacement:  # what enters varies by step and seed: fewer than B may be there to draw without
        raise ValueError("replacement must be true for buffer selective (it admits a varying number of rollouts "
                         "per step), got false")


def _whole_groups(c: DesignConfig, unit: str) -> None:
    if c.batch_size % c.group_size:
        raise ValueError(f"batch_size must be a multiple of group_size = {c.group_size} (whole {unit}), "
                         f"got {c.batch_size}")


def _group_replay_rules(c: DesignConfig, pipeline: str) -> None:
    _whole_groups(c, "groups")
    if c.replay_ratio_groups > c.max_age:
        raise ValueError(f"replay_ratio_groups (rho) must be <= max_age (L) = {c.max_age}, "
                         f"got {c.replay_ratio_groups}")
    if c.loss != "rloo":
        raise ValueError(f"buffer group-replay trains with loss rloo, got loss {c.loss!r}")


def _exgrpo_rules(c: DesignConfig, pipeline: str) -> None:
    _whole_groups(c, "questions")
    if c.loss != "exgrpo":
        raise ValueError(f"buffer exgrpo trains with loss exgrpo, got loss {c.loss!r}")
    require_one_of("exgrpo_question_selection", c.exgrpo_question_selection, ("buckets", "uniform"))
    require_one_of("exgrpo_units", c.exgrpo_units, ("success-count", "accuracy"))
    require_one_of("exgrpo_selection", c.exgrpo_selection, ("lowest", "highest", "random"))


def _prioritized_rules(c: DesignConfig, pipeline: str) -> None:
    _fifo_rules(c, pipeline)
    require_one_of("per_base", c.per_base, PER_BASES)
    require_one_of("per_schedule", c.per_schedule, ("algorithm1", "every-step"))
    require_integer("per_replay_updates", c.per_replay_updates, 1)
    require_unit_interval("per_beta_final", c.per_beta_final)


def _epochs_rules(c: DesignConfig, pipeline: str) -> None:
    require_integer("epochs", c.epochs, 1)
    require_integer("mini_batches", c.mini_batches, 1)
    if c.rollouts_per_step % c.mini_batches:
        raise ValueError(f"rollouts_per_step must be a multiple of mini_batches = {c.mini_batches} (equal "
                         f"mini-batches of one generation), got {c.rollouts_per_step}")
    if c.batch_size * c.mini_batches != c.rollouts_per_step:
        raise ValueError(f"batch_size must be rollouts_per_step / mini_batches = {c.rollouts_per_step} / "
                         f"{c.mini_batches} = {c.rollouts_per_step // c.mini_batches} (each update trains one "
                         f"mini-batch of the generation), got {c.batch_size}")


def _dynamic_rules(c: DesignConfig, pipeline: str) -> None:
    _whole_groups(c, "groups")
    for name, value in (("rollouts_per_step", c.rollouts_per_step), ("capacity", c.capacity)):
        if value != c.batch_size:
            raise ValueError(f"{name} must equal batch_size = {c.batch_size} with buffer dynamic (rounds of B "
                             f"generated until B are informative, each trained once), got {value}")


def _no_rules(c: DesignConfig, pipeline: str) -> None:
    return None


@dataclass(frozen=True)
class BufferDesign:
    """One buffer design: its help, parameters, buffer, rules, and how a step's training batch is made."""

    help: str  # one line: what it keeps and draws, with its paper anchor (the --buffer choice help)
    params: type | None  # its typed parameters (a dataclass mixed into DesignConfig)
    make: Callable[[DesignConfig, BufferSpec], ReplayBuffer] | None  # None: no buffer (on-policy)
    step: Callable[[PipelineState, int, object], StepBatch]
    rules: Callable[[DesignConfig, str], None] = _no_rules
    after_update: Callable[[PipelineState, int, StepBatch], dict | None] | None = None
    final_counts: Callable[[PipelineState], dict[str, float]] | None = None  # design-specific run totals
    pipelines: tuple[str, ...] = ("sync",)
    needs_entropy: bool = False  # the batch step asks the backend for token entropies (ExGRPO's o* choice)
    trainer: bool = False  # a trainer can run it: one batch of B per step from generation batches of R
    # (integrations/buffer.py's RowReplayBuffer; epochs: TRL's own generation buffer, integrations/trl.py; stale-k:
    # the queue's batch of k updates earlier, generated in the trainer's own step, not beside it; dynamic: whole
    # generation batches of R = B until B are informative, the refills' prompts drawn by the trainer);
    # group-replay and exgrpo generate a number of groups that is no whole generation batch


BUFFER_DESIGNS: dict[str, BufferDesign] = {
    "on-policy": BufferDesign("no buffer, each rollout trained once in its own step", None, None, on_policy_step,
                              pipelines=("sync", "async"), trainer=True),
    "fifo": BufferDesign("FIFO of N, B drawn uniformly (experience-replay Sec. 3)", FifoParams, _fifo,
                         uniform_buffer_step, _fifo_rules, pipelines=("sync", "async"), trainer=True),
    "positive-bias": BufferDesign("FIFO keeping a share delta for correct rollouts (experience-replay Sec. 4.3)",
                                  PositiveBiasParams, _positive_bias, uniform_buffer_step, _fifo_rules, trainer=True),
    "prioritized": BufferDesign("FreshPER priorities with age decay and IS weights (FreshPER Alg. 1)", FreshPERParams,
                                _prioritized, prioritized_step, _prioritized_rules, trainer=True),
    "group-replay": BufferDesign("RLOO whole-group replay of ages 1..L (Replay-RLOO App. B)", GroupReplayParams,
                                 _group_replay, group_replay_step, _group_replay_rules, group_replay_after_update),
    "exgrpo": BufferDesign("ExGRPO experience buckets by success count (ExGRPO Sec. 4)", ExGRPOParams, _exgrpo,
                           exgrpo_step, _exgrpo_rules, exgrpo_after_update, exgrpo_counts, needs_entropy=True),
    "stale-k": BufferDesign("each update trains on the batch of k updates earlier (M2PO Sec. 3)", StaleKParams,
                            _stale_k, stale_k_step, trainer=True),
    "epochs": BufferDesign("e epochs over m mini-batches of each generation of R (PPO; TRL num_iterations)",
                           EpochParams, _epochs, epochs_step, _epochs_rules, trainer=True),
    "selective": BufferDesign("FIFO of N admitting only groups with a non-zero advantage, B drawn uniformly",
                              FifoParams, _selective, uniform_buffer_step, _selective_rules, trainer=True),
    "dynamic": BufferDesign("rounds of B until B rollouts have a non-zero advantage, each used once (DAPO)", None,
                            None, dynamic_step, _dynamic_rules, trainer=True),
}


def make_design_buffer(config: DesignConfig, spec: BufferSpec) -> ReplayBuffer | None:
    """The buffer of ``config.buffer`` (None for on-policy)."""
    design = BUFFER_DESIGNS[config.buffer]
    return None if design.make is None else design.make(config, spec)


# --------------------------------------------------------------------------- losses and advantages


@dataclass(frozen=True)
class LossInputs:
    """One training batch as every loss reads it, seed axis first: from a ``RolloutBatch`` (simulator, validator)
    or from a trainer's rows (``integrations/loss.py``, S = 1)."""

    logp_new: np.ndarray  # (S, B, L) log pi_theta of the sampled tokens
    logp_behav: np.ndarray  # (S, B, L) log pi_behav: the policy that generated each row
    advantage: np.ndarray  # (S, B) A_i
    mask: np.ndarray  # (S, B, L) bool, the real tokens
    is_fresh: np.ndarray | None = None  # (S, B) generated this step (rloo, exgrpo); None: every row is fresh
    reward: np.ndarray | None = None  # (S, B) r_i (asymre's baseline is V-hat = r - A)

    @classmethod
    def of(cls, batch: RolloutBatch, logp_new: np.ndarray, is_fresh: np.ndarray | None = None) -> "LossInputs":
        return cls(logp_new, batch.logp_behav, batch.advantage, batch.mask, is_fresh, batch.reward)


def _reinforce(c, x: LossInputs, agg: losses.Aggregation):
    return losses.reinforce(x.logp_new, x.advantage, x.mask, aggregation=agg)


def _grpo(c, x: LossInputs, agg: losses.Aggregation):
    return losses.grpo(x.logp_new, x.logp_behav, x.advantage, x.mask, eps_low=c.eps_low, eps_high=c.eps_high,
                       aggregation=agg)


def _no_trust_region(c, x: LossInputs, agg: losses.Aggregation):
    return losses.no_trust_region(x.logp_new, x.logp_behav, x.advantage, x.mask, aggregation=agg)


def _m2po(c, x: LossInputs, agg: losses.Aggregation):
    return losses.m2po(x.logp_new, x.logp_behav, x.advantage, x.mask, tau_m2=c.tau_m2, variant="algorithm1",
                       aggregation=agg)


def _m2po_reference(c, x: LossInputs, agg: losses.Aggregation):
    return losses.m2po(x.logp_new, x.logp_behav, x.advantage, x.mask, tau_m2=c.tau_m2, variant="reference",
                       aggregation=agg)


def _rloo(c, x: LossInputs, agg: losses.Aggregation):
    fresh = np.ones(x.advantage.shape, bool) if x.is_fresh is None else x.is_fresh
    return losses.rloo(x.logp_new, x.logp_behav, x.advantage, x.mask, c=c.clip_c, is_fresh=fresh, aggregation=agg)


def _tis(c, x: LossInputs, agg: losses.Aggregation):
    # every row, fresh ones included, gets min(c, w): a fresh row's w is 1 at its first use (pi_theta = pi_behav)
    return losses.rloo(x.logp_new, x.logp_behav, x.advantage, x.mask, c=c.clip_c,
                       is_fresh=np.zeros(x.advantage.shape, bool), aggregation=agg)


def _asymre(c, x: LossInputs, agg: losses.Aggregation):
    if x.reward is None:
        raise ValueError("loss asymre needs the rewards (its baseline is r - A): give LossInputs.reward")
    return losses.asymre(x.logp_new, x.reward, x.reward - x.advantage, x.mask, delta_v=c.asymre_delta_v,
                         aggregation=agg)


def _exgrpo_loss(c, x: LossInputs, agg: losses.Aggregation):
    replayed = np.zeros(x.advantage.shape, bool) if x.is_fresh is None else ~x.is_fresh
    return losses.exgrpo_shaped(x.logp_new, x.logp_behav, x.advantage, x.mask, is_replayed=replayed,
                                beta=c.exgrpo_beta, eps_low=c.eps_low, eps_high=c.eps_high, aggregation=agg)


@dataclass(frozen=True)
class LossDesign:
    """One loss: its help, parameters, the advantage it is defined with, and who can run it.

    ``compute(config, inputs, aggregation)`` calls the function of ``core/losses.py`` with the config's parameters
    (the fields of ``params``, read from any DesignConfig) and returns its ``LossOutput``.
    """

    help: str  # one line: the correction and its paper anchor (the --loss choice help)
    params: type | None  # its typed parameters (a dataclass mixed into DesignConfig)
    compute: Callable[[DesignConfig, LossInputs, losses.Aggregation], losses.LossOutput]
    advantage: str  # the advantage of ``advantage="auto"``
    advantages: tuple[str, ...] = ("grpo", "group-mean", "leave-one-out")  # the ones it accepts
    buffers: tuple[str, ...] | None = None  # None: any buffer whose own rules accept it
    aggregation: losses.Aggregation = "token-mean"  # how token terms become one loss (the function's default; a
    # trainer may override)
    trainer: bool = False  # a trainer can run it: it reads only logp_new, logp_behav, advantage and mask, and
    # corrects for the behaviour policy (reinforce does not; rloo/exgrpo need is_fresh, asymre the rewards)
    unbiased: bool = False  # importance-weighted and unclipped: calibrate's plain sigma^2 form (else signal-normalised)
    sequence_coupled: str = ""  # why a token's gradient depends on its whole response beyond its advantage ("":
    # it does not); such a loss has no exact enumeration over the token MDP's states (simulate/calibrate.py)


_M2_MASK = "masks a token by the M2 of the whole response"

LOSSES: dict[str, LossDesign] = {
    "reinforce": LossDesign("REINFORCE, no off-policy correction", None, _reinforce, "group-mean"),
    "grpo": LossDesign("PPO clip of the token ratio to [1 - eps_low, 1 + eps_high] (M2PO Eq. 1)", ClipParams, _grpo,
                       "grpo", trainer=True),
    "no-trust-region": LossDesign("token importance weight, unclipped", None, _no_trust_region, "grpo",
                                  trainer=True, unbiased=True),
    "m2po": LossDesign("M2PO second-moment trust region tau_m2 (M2PO Algorithm 1)", M2POParams, _m2po, "grpo",
                       trainer=True, sequence_coupled=_M2_MASK),
    "m2po-reference": LossDesign("M2PO as its reference code computes it", M2POParams, _m2po_reference, "grpo",
                                 trainer=True, sequence_coupled=_M2_MASK),
    "rloo": LossDesign("replayed rows weighted min(c, w) of the sequence, fresh rows 1 (Replay-RLOO Eq. 2)",
                       RLOOParams, _rloo, "leave-one-out", buffers=("group-replay", "on-policy"),
                       aggregation="seq-mean-token-sum"),
    "tis": LossDesign("truncated sequence IS, every row weighted min(c, w) (Replay-RLOO Eq. 2)", RLOOParams, _tis,
                      "grpo", aggregation="seq-mean-token-sum", trainer=True,
                      sequence_coupled="weights a token by its whole response's ratio min(c, w)"),
    "asymre": LossDesign("AsymRE, REINFORCE with the shifted baseline V-hat + delta V", AsymREParams, _asymre,
                         "group-mean", advantages=("group-mean",), aggregation="seq-mean-token-sum"),
    "exgrpo": LossDesign("ExGRPO, PPO clip on fresh rows and f(w) = w/(w + beta) on replayed (ExGRPO Eq. 4)",
                         ExGRPOShapingParams, _exgrpo_loss, "grpo"),
}

ADVANTAGES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "grpo": lambda r: advantages.group_advantage(r, normalize_std=True),  # GRPO Eq. (2) in M2PO
    "group-mean": advantages.group_mean_baseline,  # r - V-hat (REINFORCE, Dr. GRPO, AsymRE)
    "leave-one-out": advantages.leave_one_out,  # RLOO Eq. (1)
}


def loss_aggregation(config: DesignConfig, aggregation: str | None = None) -> losses.Aggregation:
    """The aggregation a loss runs with: ``aggregation`` when given (one of ``losses.AGGREGATIONS``), else the
    registry entry's own."""
    if aggregation is None:
        return LOSSES[config.loss].aggregation
    return require_one_of("aggregation", aggregation, losses.AGGREGATIONS)


def loss_output(config: DesignConfig, inputs: LossInputs, aggregation: str | None = None) -> losses.LossOutput:
    """The loss named in ``config`` (its parameters too) on ``inputs``: a ``losses.LossOutput`` (value, d / d logp_new).

    The one name -> implementation route: the simulator's engine, the validator (``compute_loss``) and the
    trainers (``integrations/loss.py``) all call it. ``aggregation`` None: the loss's own (``LossDesign``).
    """
    return LOSSES[config.loss].compute(config, inputs, loss_aggregation(config, aggregation))


def compute_loss(config: DesignConfig, batch: RolloutBatch, logp_new: np.ndarray, is_fresh: np.ndarray | None = None):
    """The loss named in ``config`` on ``batch``: a ``losses.LossOutput`` (value and d loss / d logp_new)."""
    return loss_output(config, LossInputs.of(batch, logp_new, is_fresh))


def make_advantage(config: DesignConfig, reward_groups: np.ndarray) -> np.ndarray:
    """Group-relative advantages (S, g, G) from rewards (S, g, G), with the config's (resolved) advantage."""
    return ADVANTAGES[config.resolved_advantage()](reward_groups)


def loss_form(loss: str) -> str:
    """The sigma^2 form the theory needs for ``loss``: plain (unbiased IS) or signal-normalised (the rest).

    Both calibrations (simulate/calibrate.py, validate/calibrate.py) write their profile's table in this form."""
    return "plain" if LOSSES[loss].unbiased else "signal-normalised"  # the registry entry's flag


# --------------------------------------------------------------------------- validation


def validate_design(c: DesignConfig, pipeline: str = "sync") -> None:
    """Every rule of the design in one place: one-line ValueErrors naming the field and its valid range."""
    check_choice("buffer", c.buffer, BUFFER_DESIGNS)
    check_choice("loss", c.loss, LOSSES)
    require_one_of("advantage", c.advantage, ("auto", *ADVANTAGES))
    for name, least in (("rollouts_per_step", 1), ("batch_size", 1), ("capacity", 1), ("max_age", 0)):
        require_integer(name, getattr(c, name), least)
    require_integer("group_size", c.group_size, 2)
    for name in ("clip_c", "per_tau", "exgrpo_beta"):
        require_number(name, getattr(c, name), above=0)
    for name in ("eps_low", "eps_high", "tau_m2", "replay_ratio_groups", "per_alpha", "per_beta"):
        require_number(name, getattr(c, name), at_least=0)
    require_integer("stale_k", c.stale_k, 0)
    require_unit_interval("delta", c.delta, closed=False)
    require_unit_interval("exgrpo_rho", c.exgrpo_rho, closed=False)
    if c.rollouts_per_step % c.group_size:
        raise ValueError(f"rollouts_per_step must be a multiple of group_size = {c.group_size}, "
                         f"got {c.rollouts_per_step}")
    design = BUFFER_DESIGNS[c.buffer]
    if pipeline not in design.pipelines:
        supported = ", ".join(name for name, d in BUFFER_DESIGNS.items() if pipeline in d.pipelines)
        raise ValueError(f"the {pipeline} pipeline supports buffer {supported}, got {c.buffer!r}")
    design.rules(c, pipeline)
    loss = LOSSES[c.loss]
    if loss.buffers is not None and c.buffer not in loss.buffers:
        raise ValueError(f"loss {c.loss} needs buffer {' or '.join(loss.buffers)}, got buffer {c.buffer!r}")
    advantage = c.resolved_advantage()
    if advantage not in loss.advantages:
        raise ValueError(f"loss {c.loss} uses the {' or '.join(loss.advantages)} advantage: set advantage "
                         f"{loss.advantages[0]} (or auto), got {c.advantage!r}")


def validate_trainer_design(c: DesignConfig) -> None:
    """The rules of a trainer's design before the trainer's group size is known (``integrations.ReplayConfig``).

    N, B, R whole and N >= R (the generation batch must fit, whatever the buffer), a loss and a buffer a trainer
    runs, the loss's parameters, on-policy B = R (every rollout trained once), stale-k N = B = R (one generation a
    step, trained whole k updates late) and epochs as TRL runs them (N = R, B m = R, one order per generation). The
    rest, with G, is ``validate_design``, which the trainer's buffer applies (``integrations.buffer.RowReplayBuffer``).
    """
    for name in ("capacity", "batch_size", "rollouts_per_step"):
        require_integer(name, getattr(c, name), 1)
    check_capacity(c.capacity, c.rollouts_per_step)
    check_choice("loss", c.loss, LOSSES, trainer=True)
    for name in ("eps_low", "eps_high", "tau_m2"):
        require_number(name, getattr(c, name), at_least=0)
    require_number("clip_c", c.clip_c, above=0)
    check_choice("buffer", c.buffer, BUFFER_DESIGNS, trainer=True)
    if c.buffer == "on-policy" and c.batch_size != c.rollouts_per_step:
        raise ValueError(f"batch_size must equal rollouts_per_step = {c.rollouts_per_step} on-policy (every "
                         f"rollout trained once), got {c.batch_size}")
    if c.buffer == "stale-k":  # one generation trained whole, once, k updates after it was generated
        require_integer("stale_k", c.stale_k, 0)
        for name, value in (("batch_size", c.batch_size), ("capacity", c.capacity)):
            if value != c.rollouts_per_step:
                raise ValueError(f"{name} must equal rollouts_per_step = {c.rollouts_per_step} with buffer stale-k "
                                 f"(each update trains one whole generation, once, k updates late), got {value}")
    if c.buffer == "epochs":
        _epochs_rules(c, "sync")  # e, m whole, B m = R
        if c.capacity != c.rollouts_per_step:
            raise ValueError(f"capacity must equal rollouts_per_step = {c.rollouts_per_step} (an epoch design holds "
                             f"one generation), got {c.capacity}")
        if c.epoch_shuffle:  # TRL shuffles a generation once and replays the same slices each of its passes
            raise ValueError("epoch_shuffle must be False in a trainer: TRL keeps one order per generation for its "
                             "num_iterations passes (GRPOTrainer._prepare_inputs); run a reshuffled design in the "
                             "simulator")


def fresh_groups(config: DesignConfig) -> int:
    """RLOO's fresh groups per step once the pool is full: round(B/G / (1 + rho)) (App. B)."""
    return int(fresh_groups_per_step(config.groups_per_update, config.replay_ratio_groups))

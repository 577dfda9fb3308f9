"""The one typed config of a simulation run (``replay-theory simulate`` and every sweep row).

Flat on purpose: a sweep is a grid over these fields, and a result row is the
config plus its measurements, so every field is a scalar that fits a CSV cell.

| field                   | paper symbol | meaning                                                            |
|-------------------------|--------------|--------------------------------------------------------------------|
| ``capacity``            | N            | FIFO buffer size (experience-replay paper, Sec. 3)                 |
| ``rollouts_per_step``   | R            | fresh rollouts generated per step (synchronous model)              |
| ``batch_size``          | B            | samples per update (responses; groups for group replay)            |
| ``group_size``          | G / K        | responses per prompt                                               |
| ``workers``/``trainers``| W / T        | inference and trainer GPUs (asynchronous model, Sec. 2)            |
| ``mu``                  | mu           | rollout cost / per-sample update cost (Table 1 meaning)            |
| ``eps_low/high``        | eps          | GRPO clip range                                                    |
| ``tau_m2``              | tau_M2       | M2PO second-moment budget                                          |
| ``replay_ratio_groups`` | rho          | RLOO reused groups per fresh group                                 |
| ``max_age``             | L            | RLOO maximum replay age                                            |
| ``clip_c``              | c            | RLOO one-sided sequence-weight clip                                |
| ``delta``               | delta        | positive-bias share of correct rollouts                            |
| ``per_alpha/beta/tau``  | alpha/beta/tau | FreshPER priority exponent, IS exponent, age-decay constant      |
| ``stale_k``             | k            | M2PO stale-k: train on data generated k updates earlier            |
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass

ENVS = ("bandit", "token-mdp")
PIPELINES = ("sync", "async")
BUFFER_NAMES = ("on-policy", "fifo", "positive-bias", "prioritized", "group-replay", "exgrpo", "stale-k")
LOSS_NAMES = ("reinforce", "grpo", "no-trust-region", "m2po", "m2po-reference", "rloo", "asymre", "exgrpo")
ADVANTAGE_NAMES = ("grpo", "group-mean", "leave-one-out")


@dataclass(frozen=True)
class SimConfig:
    """One simulated training run over ``seeds`` seeds (all seeds in one vectorised process)."""

    env: str = "bandit"
    """Environment: bandit (K-armed prompts) or token-mdp (Countdown-like sequences)."""
    pipeline: str = "sync"
    """sync (Sec. 3: generate R, push, sample B) or async (Sec. 2: W workers, T trainers, cost mu)."""
    buffer: str = "fifo"
    """on-policy, fifo, positive-bias, prioritized, group-replay, exgrpo or stale-k."""
    loss: str = "grpo"
    """reinforce, grpo, no-trust-region, m2po, m2po-reference, rloo, asymre or exgrpo."""
    advantage: str = "grpo"
    """grpo (std-normalised group), group-mean (REINFORCE baseline) or leave-one-out (RLOO)."""
    steps: int = 200
    """Training steps (updates)."""
    seeds: int = 8
    """Independent runs, vectorised along the leading axis."""
    seed: int = 0
    """Base seed of the np.random.Generator; same seed, same result."""
    instance_seed: int = 0
    """Seed of the task instance (prompts, features), shared by all training seeds."""
    capacity: int = 256
    """N: FIFO capacity in responses."""
    rollouts_per_step: int = 64
    """R: fresh responses per step (sync pipeline)."""
    batch_size: int = 64
    """B: responses per update (groups per update for group-replay)."""
    group_size: int = 8
    """G: responses per prompt (group-relative advantages)."""
    replacement: bool = True
    """Sample the FIFO buffer with replacement (Sec. 3 theory) or without (App. B code)."""
    lr: float = 0.05
    """Learning rate."""
    optimizer: str = "adam"
    """adam (the paper's choice) or sgd."""
    eps_low: float = 0.2
    """GRPO lower clip: ratios below 1 - eps_low are clipped (inf: no trust region)."""
    eps_high: float = 0.2
    """GRPO upper clip: ratios above 1 + eps_high are clipped."""
    tau_m2: float = 0.04
    """M2PO budget tau_M2 on the mean (log r)^2 of the candidate tokens."""
    replay_ratio_groups: float = 1.0
    """RLOO rho: replayed groups per fresh group (B_fresh = round(B / (1 + rho)))."""
    max_age: int = 2
    """RLOO L: groups of age 1..L can be replayed."""
    clip_c: float = 3.0
    """RLOO one-sided clip c of the sequence importance weight."""
    delta: float = 0.2
    """Positive-bias buffer: share of the N slots kept for the freshest correct rollouts."""
    per_alpha: float = 0.6
    """FreshPER priority exponent alpha (0: uniform)."""
    per_beta: float = 0.4
    """FreshPER importance-weight exponent beta."""
    per_tau: float = math.inf
    """FreshPER age-decay time constant tau in steps (inf: standard PER)."""
    per_base: str = "advantage"
    """FreshPER base priority: advantage (|A| + eps) or reward (|r| + eps)."""
    stale_k: int = 4
    """M2PO stale-k: each update trains on the batch generated k updates earlier."""
    exgrpo_rho: float = 0.5
    """ExGRPO share of questions drawn from experience, in [0, 1)."""
    exgrpo_beta: float = 0.1
    """ExGRPO policy-shaping beta in f(w) = w / (w + beta)."""
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
    asymre_delta_v: float = -0.1
    """AsymRE baseline shift delta V in r - (V-hat + delta V)."""
    workers: float = 6.0
    """W: inference GPUs (async pipeline)."""
    trainers: float = 2.0
    """T: trainer GPUs (async pipeline)."""
    mu: float = 5.28
    """Rollout cost / per-sample update cost (Table 1 meaning); prices compute in both pipelines."""
    sync_interval: int = 1
    """Async: trainer steps between weight syncs to the inference workers."""
    num_prompts: int = 64
    """Prompts (questions) in the task instance."""
    num_actions: int = 16
    """Bandit: answers per prompt (one token each)."""
    vocab_size: int = 6
    """Token MDP: token values 0..vocab_size-1."""
    seq_len: int = 8
    """Token MDP: tokens per response."""
    eval_every: int = 10
    """Steps between exact evaluations of the policy (reward, accuracy)."""
    measure_drift: bool = False
    """At each evaluation, exact KL(pi_t || pi_t-lag) for lags 1..32 (the FreshPER drift rate; costs about as much as the run)."""

    def with_updates(self, **changes) -> "SimConfig":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown config field(s): {', '.join(sorted(unknown))}; valid: {', '.join(field_names())}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def key(self) -> str:
        """A stable short hash of the full config (result file names)."""
        text = json.dumps(self.to_dict(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def validated(self) -> "SimConfig":
        """Raise a one-line ValueError for any inconsistent design, before any work."""
        def choice(name, options):
            value = getattr(self, name)
            if value not in options:
                raise ValueError(f"{name} must be one of {', '.join(options)}, got {value!r}")

        choice("env", ENVS)
        choice("pipeline", PIPELINES)
        choice("buffer", BUFFER_NAMES)
        choice("loss", LOSS_NAMES)
        choice("advantage", ADVANTAGE_NAMES)
        choice("optimizer", ("adam", "sgd"))
        choice("exgrpo_question_selection", ("buckets", "uniform"))
        choice("exgrpo_units", ("success-count", "accuracy"))
        for name in ("steps", "seeds", "capacity", "rollouts_per_step", "batch_size", "eval_every", "max_age",
                     "num_prompts", "num_actions", "vocab_size", "seq_len", "sync_interval"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.group_size, int) or self.group_size < 2:
            raise ValueError(f"group_size must be an integer >= 2, got {self.group_size!r}")
        for name in ("lr", "mu", "workers", "trainers", "clip_c", "per_tau", "exgrpo_beta"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0) or math.isnan(value):
                raise ValueError(f"{name} must be > 0, got {value!r}")
        for name in ("eps_low", "eps_high", "tau_m2", "replay_ratio_groups", "per_alpha", "per_beta"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0) or math.isnan(value):
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        if not 0 <= self.delta < 1:
            raise ValueError(f"delta must be in [0, 1), got {self.delta!r}")
        if not 0 <= self.exgrpo_rho < 1:
            raise ValueError(f"exgrpo_rho must be in [0, 1), got {self.exgrpo_rho!r}")
        if self.stale_k < 0:
            raise ValueError(f"stale_k must be an integer >= 0, got {self.stale_k!r}")
        if self.rollouts_per_step % self.group_size:
            raise ValueError(f"rollouts_per_step must be a multiple of group_size = {self.group_size}, "
                             f"got {self.rollouts_per_step}")
        if self.pipeline == "sync" and self.buffer in ("fifo", "positive-bias", "prioritized"):
            if self.capacity < self.rollouts_per_step:
                raise ValueError(f"capacity must be >= rollouts_per_step = {self.rollouts_per_step} "
                                 f"(a FIFO holds at least one step), got {self.capacity}")
            if not self.replacement and self.batch_size > self.rollouts_per_step:
                raise ValueError(f"batch_size must be <= rollouts_per_step = {self.rollouts_per_step} when sampling "
                                 f"without replacement (after the first step the buffer holds only R rollouts), "
                                 f"got {self.batch_size}")
        if self.buffer == "group-replay":
            if self.replay_ratio_groups > self.max_age:
                raise ValueError(f"replay_ratio_groups (rho) must be <= max_age (L) = {self.max_age}, "
                                 f"got {self.replay_ratio_groups}")
            if self.loss != "rloo":
                raise ValueError(f"buffer group-replay trains with loss rloo, got loss {self.loss!r}")
        if self.loss == "rloo" and self.buffer != "group-replay" and self.buffer != "on-policy":
            raise ValueError(f"loss rloo needs buffer group-replay or on-policy, got buffer {self.buffer!r}")
        if self.buffer == "exgrpo" and self.loss != "exgrpo":
            raise ValueError(f"buffer exgrpo trains with loss exgrpo, got loss {self.loss!r}")
        if self.pipeline == "async" and self.buffer not in ("fifo", "on-policy"):
            raise ValueError(f"the async pipeline supports buffer fifo or on-policy, got {self.buffer!r}")
        if self.loss == "asymre" and self.advantage != "group-mean":
            raise ValueError(f"loss asymre uses the group-mean baseline: set advantage group-mean, got {self.advantage!r}")
        return self


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(SimConfig)]


def config_from_dict(data: dict) -> SimConfig:
    """Build a config from plain values (a sweep row or CLI options); typos are errors."""
    base = SimConfig()
    kinds = {f.name: type(getattr(base, f.name)) for f in dataclasses.fields(SimConfig)}
    converted = {}
    for name, value in data.items():
        if name not in kinds:
            raise ValueError(f"unknown config field {name!r}; valid: {', '.join(field_names())}")
        kind = kinds[name]
        if kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false, got {value!r}")
            converted[name] = value
        elif kind is int:
            if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            converted[name] = int(value)
        elif kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ValueError(f"{name} must be a number, got {value!r}")
            try:
                converted[name] = float(value)  # accepts "inf"
            except ValueError:
                raise ValueError(f"{name} must be a number, got {value!r}") from None
        else:
            converted[name] = value
    return base.with_updates(**converted).validated()

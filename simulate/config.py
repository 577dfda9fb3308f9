"""The one typed config of a simulation run (``replay-theory simulate`` and every sweep row).

Flat on purpose: a sweep is a grid over these fields, and a result row is the
config plus its measurements, so every field is a scalar that fits a CSV cell.
The design fields (buffer, loss, sizes and each design's parameters) come from
``core.designs.DesignConfig``, which the validator's ``RLConfig`` shares; the
fields defined here say how the simulated run goes (environment, pipeline, seeds).
Each field's docstring is its ``--help`` text.

| field                   | paper symbol | meaning                                                            |
|-------------------------|--------------|--------------------------------------------------------------------|
| ``workers``/``trainers``| W / T        | inference and trainer GPUs (asynchronous model, experience-replay Sec. 2) |
| ``mu``                  | mu           | rollout cost / per-sample update cost (Table 1 meaning)            |
| ``sync_interval``       | k            | async: trainer steps between weight syncs                          |
(design fields: see ``core/designs.py``)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..checks import Range, require_integer, require_number, require_one_of
from ..core.designs import MAX_REFILL_ROUNDS, DesignConfig
from ..core.memory import Estimate, Size, check_sizes, count
from ..core.pipeline import PipelineSettings
from .envs import ENV_NAMES, engine_choices
from .store import run_key

ENVS = ENV_NAMES  # the registry's engine environments (simulate/envs/__init__.py)
PIPELINES = ("sync", "async")


@dataclass(frozen=True)
class SimConfig(DesignConfig):
    """One simulated training run over ``seeds`` seeds (all seeds in one vectorised process)."""

    env: str = dataclasses.field(default="bandit", metadata=Range(choices=engine_choices).field())
    """Environment (simulate/envs registry)."""
    pipeline: str = "sync"
    """sync (Sec. 3: generate R, push, sample B) or async (Sec. 2: W workers, T trainers, cost mu)."""
    steps: int = 200
    """Training steps (updates)."""
    seeds: int = 8
    """Independent runs, vectorised along the leading axis."""
    seed: int = 0
    """Base seed of the np.random.Generator; same seed, same result."""
    instance_seed: int = 0
    """Seed of the task instance (prompts, features), shared by all training seeds."""
    lr: float = 0.05
    """Learning rate."""
    optimizer: str = "adam"
    """adam (the paper's choice) or sgd."""
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
    """At each evaluation, exact KL(pi_t || pi_t-lag) for lags 1..32 (the FreshPER drift rate; costs about as much as
    the run)."""

    def with_updates(self, **changes) -> "SimConfig":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown config field(s): {', '.join(sorted(unknown))}; "
                             f"valid: {', '.join(field_names())}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def key(self) -> str:
        """A stable short hash of the full config and the package version (result file names).

        The version is in the key so that a resumed sweep never mixes results of older code.
        """
        return run_key(self.to_dict())

    def pipeline_settings(self) -> PipelineSettings:
        return PipelineSettings(self.pipeline, self.mu, self.workers, self.trainers, self.sync_interval, self.steps)

    def validated(self) -> "SimConfig":
        """Raise a one-line ValueError for any inconsistent run or design, before any work; resolve ``advantage``."""
        for name, options in (("env", ENVS), ("pipeline", PIPELINES), ("optimizer", ("adam", "sgd"))):
            require_one_of(name, getattr(self, name), options)
        for name in ("steps", "seeds", "eval_every", "num_prompts", "num_actions", "vocab_size", "seq_len",
                     "sync_interval"):
            require_integer(name, getattr(self, name), 1)
        for name in ("lr", "mu", "workers", "trainers"):
            require_number(name, getattr(self, name), above=0, finite=True)
        for name in ("seed", "instance_seed"):  # numpy's generators take any integer >= 0
            require_integer(name, getattr(self, name), 0)
        design = self.validated_design(self.pipeline)
        check_sizes(SIZES, dataclasses.asdict(self), peak_bytes, defaults=_DEFAULTS)  # every size an int >= 1 here
        return design


#: The sizes the simulator allocates by (each estimate term below grows with them), in the order a refusal prefers
#: to name when several are over; ``workers`` is the async pipeline's rate of fresh responses per update.
SIZES = (*(Size(name) for name in ("batch_size", "rollouts_per_step", "capacity", "seeds", "steps", "num_prompts",
                                    "num_actions", "vocab_size", "seq_len")),
         Size("max_age", 0), Size("stale_k", 0), Size("workers", integer=False),
         Size("group_size", 2, memory=False), Size("eval_every", memory=False), Size("sync_interval", memory=False),
         Size("per_replay_updates", memory=False))

# Bytes per element of the engine's arrays, with the copies it makes (read off simulate/engine.py, core/designs.py,
# core/buffers/ and the environments; tests/integration/test_sizes.py measures the total against a real run).
_ITEM = 64  # per response and seed in a step: prompt, reward, advantage, created, group, weight, staleness, ...
_TOKEN = 160  # per token and seed in a step: tokens, mask, behaviour and new log-probs, loss terms, metrics
_SLOT = 60  # per buffer slot and seed: prompt, reward, advantage, created, group, use count, last use, valid
_SLOT_TOKEN = 11  # per buffer slot, token and seed: int16 token, bool mask, float64 behaviour log-prob
_CURVES = 40  # per step and seed: the recorder's (S, steps) float64 curves, 8 bytes each, about 40 of them
_BANDIT_FEATURES = 16  # the bandit's feature_dim (BanditConfig's default; the simulator does not change it)
_TOKEN_FEATURES = 5  # the token MDP's K = 4 base features + prompt_feature_dim 1


def policy_shape(values: Mapping[str, Any]) -> tuple[int, int, int]:
    """(tokens per response L, actions per token V, parameters d) of the environment ``values`` names."""
    if values["env"] == "bandit":
        return 1, values["num_actions"], _BANDIT_FEATURES
    return values["seq_len"], values["vocab_size"], _TOKEN_FEATURES * values["vocab_size"] + 1


def response_bytes(values: Mapping[str, Any]) -> float:
    """Bytes one response of one seed takes in a step: its arrays, its tokens' and the policy's terms at them (the
    bandit's inverse-CDF row; the token MDP's (S, n, V) log-policy terms of one position)."""
    L, V, _ = policy_shape(values)
    return _ITEM + _TOKEN * L + (6 * V if values["env"] == "bandit" else 8 * (6 * V + _TOKEN_FEATURES))


def peak_bytes(values: Mapping[str, Any]) -> Estimate:
    """Peak bytes of ``simulate`` on the config ``values`` (SimConfig's fields as a dict): the step's responses, the
    buffer, the policy tables of the environment and the per-step curves, each a shape times its bytes."""
    S, B, R, N = values["seeds"], values["batch_size"], values["rollouts_per_step"], values["capacity"]
    G, P, steps = values["group_size"], values["num_prompts"], values["steps"]
    bandit = values["env"] == "bandit"
    L, V, d = policy_shape(values)
    fresh = R
    if values["pipeline"] == "async":  # B W / (T mu) a step, one batch of B before the first update
        fresh = B + B * values["workers"] / (values["trainers"] * values["mu"]) + G
    buffer = values["buffer"]
    if buffer == "dynamic":  # dynamic sampling holds every round of a step at once: at most MAX_REFILL_ROUNDS
        fresh = MAX_REFILL_ROUNDS * R
    items = max(fresh, B)
    slots = {"fifo": N, "positive-bias": N, "prioritized": N, "group-replay": (values["max_age"] + 2) * B,
             "exgrpo": 16 * P, "stale-k": (values["stale_k"] + 1) * R, "epochs": R, "on-policy": 0,
             "dynamic": 0}.get(buffer, N)
    if buffer == "prioritized":
        slot_bytes = _SLOT + 48 + _SLOT_TOKEN * L  # + base priority, its log, the sum tree's two levels
    elif buffer in ("stale-k", "epochs"):
        slot_bytes = 48 + 17 * L  # whole RolloutBatches: int64 tokens
    else:
        slot_bytes = _SLOT + _SLOT_TOKEN * L
    step_items = S * items * response_bytes(values)
    states = 1 if bandit else L * (V - 1) + 1  # the token MDP's reachable partial sums
    if bandit:
        policy, cache = S * P * V * 8 * 8 + P * V * d * 8 * 2, 0  # log pi, pi, cached copies, gradient scatter
    else:
        policy = S * P * states * V * 8 * 8  # the exact DP's (S, P, states, V) log-policy and its products
        cache = P * L * states / 2 * (_TOKEN_FEATURES + 2 * V) * 8  # its seed-free terms, every position's
    return Estimate({
        f"the step's responses: seeds x max(B, fresh) x (per response + per token) = {S} x {count(items)} x "
        f"{L} token(s)": step_items,
        f"the {buffer} buffer: seeds x slots x tokens = {S} x {count(slots)} x {L}": S * slots * slot_bytes,
        f"the policy tables: seeds x prompts x states x actions = {S} x {P} x {states} x {V}": policy,
        f"the exact evaluation's state terms: prompts x positions x partial sums = {P} x {L} x {states}": cache,
        f"the per-step curves and parameters: seeds x steps = {S} x {steps}": S * steps * (_CURVES * 8 + 8 * d),
        f"the use counts of the rollouts the buffer evicts: seeds x fresh x steps = {S} x {count(fresh)} x {steps}":
            0 if buffer in ("on-policy", "stale-k", "dynamic") else S * fresh * steps * 16,  # int64, concatenated
    })


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SimConfig) if isinstance(f.default, (int, float))}


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
            if isinstance(value, bool) or not (isinstance(value, int)
                                               or (isinstance(value, float) and value.is_integer())):
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

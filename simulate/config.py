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
import hashlib
import json
from dataclasses import dataclass

from .. import __version__
from ..core.designs import CHOICES, DesignConfig
from ..core.pipeline import PipelineSettings
from ..theory.checks import require_integer, require_number, require_one_of
from .envs import ENV_NAMES, engine_choices

ENVS = ENV_NAMES  # the registry's engine environments (simulate/envs/__init__.py)
PIPELINES = ("sync", "async")


@dataclass(frozen=True)
class SimConfig(DesignConfig):
    """One simulated training run over ``seeds`` seeds (all seeds in one vectorised process)."""

    env: str = dataclasses.field(default="bandit", metadata={CHOICES: engine_choices})
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
        text = json.dumps({**self.to_dict(), "code_version": __version__}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

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
        return self.validated_design(self.pipeline)


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

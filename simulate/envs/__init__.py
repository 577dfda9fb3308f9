"""Environments of the replay simulator, in one registry (shaped like ``core.designs.BUFFER_DESIGNS``).

Each entry names a config dataclass (every random draw of an instance comes from its ``instance_seed``) and the class
it builds. Rollout environments implement ``core.rollouts.Environment`` (seed axis first, vectorised over seeds,
randomness only through an explicit ``rng``) and run in the engine (``simulate``, sweeps) and in the benchmark; the
noisy quadratic has no rollouts (a sample is a noise vector) and runs only where an exact expected loss is wanted
(``experiment theory-test``, through ``simulate/to_target.py``). All of them expose ``init_params``, ``evaluate``
(exact expected reward) and ``exact_grad`` (its exact gradient) to the target-based benchmark.

A new environment: its module here, plus one ``EnvSpec`` entry below (``simulate --env`` lists it, and the engine
sets its config's fields named like the run config's, ``simulate/engine.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ...checks import invalid, one_of
from .bandit import BanditConfig, BanditEnv, NoisyBanditConfig, NoisyRewardBandit
from .quadratic import QuadraticConfig, QuadraticEnv
from .token_mdp import TokenMDPConfig, TokenMDPEnv

__all__ = ["ENVIRONMENTS", "ENV_NAMES", "BanditConfig", "BanditEnv", "EnvSpec", "NoisyBanditConfig",
           "NoisyRewardBandit", "QuadraticConfig", "QuadraticEnv", "TokenMDPConfig", "TokenMDPEnv", "engine_choices",
           "make_env"]


@dataclass(frozen=True)
class EnvSpec:
    config: type
    build: Callable[[Any], Any]
    help: str
    engine: bool
    """True: ``simulate --env`` runs it (a ``core.rollouts.Environment`` whose config fields the engine's SimConfig
    sets); False: the target-based benchmark only."""


ENVIRONMENTS: dict[str, EnvSpec] = {
    "bandit": EnvSpec(BanditConfig, BanditEnv, "K-armed prompts, one-token responses, reward 1 / 0.1 / 0", True),
    "noisy-bandit": EnvSpec(NoisyBanditConfig, NoisyRewardBandit,
                            "the bandit observed through a verifier with Gaussian reward noise", False),
    "token-mdp": EnvSpec(TokenMDPConfig, TokenMDPEnv, "L-token responses, Countdown-like sum target", True),
    "quadratic": EnvSpec(QuadraticConfig, QuadraticEnv,
                         "noisy quadratic F = 1/2 (theta - theta*)^T H (theta - theta*), noise fixed at draw", False),
}


def engine_choices() -> dict[str, str]:
    """{name: help} of the environments the simulation engine runs, in registry order (``simulate --env``'s
    choices)."""
    return {name: spec.help for name, spec in ENVIRONMENTS.items() if spec.engine}


#: names of the environments the simulation engine runs (``simulate --env``).
ENV_NAMES = tuple(engine_choices())


def make_env(name: str, **config: object):
    """Environment ``name`` built from its config fields ``config``."""
    try:
        spec = ENVIRONMENTS[name]
    except KeyError:
        raise invalid("env", one_of(ENVIRONMENTS), name) from None
    return spec.build(spec.config(**config))

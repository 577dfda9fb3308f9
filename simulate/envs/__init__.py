"""Environments of the replay simulator: verifiable-reward tasks with log-linear policies.

Both implement ``core.rollouts.Environment`` (seed axis first, everything
vectorised over seeds, randomness only through an explicit ``rng``):

| name          | class                         | models                                                        |
|---------------|-------------------------------|---------------------------------------------------------------|
| ``bandit``    | ``bandit.BanditEnv``          | one-token responses; prompts of spread difficulty (ExGRPO)    |
| ``token-mdp`` | ``token_mdp.TokenMDPEnv``     | L-token responses, Countdown-like sum target, reward 1/0.1/0  |

``make_env(name, **config)`` builds one from its config fields
(``BanditConfig`` / ``TokenMDPConfig``).
"""

from __future__ import annotations

from ...core.rollouts import Environment
from .bandit import BanditConfig, BanditEnv
from .token_mdp import TokenMDPConfig, TokenMDPEnv

__all__ = ["ENV_NAMES", "BanditConfig", "BanditEnv", "TokenMDPConfig", "TokenMDPEnv", "make_env"]

#: environment names accepted by :func:`make_env`.
ENV_NAMES = ("bandit", "token-mdp")


def make_env(name: str, **config: object) -> Environment:
    """Environment ``name`` ("bandit" or "token-mdp") with config fields ``config``."""
    if name == "bandit":
        return BanditEnv(BanditConfig(**config))  # type: ignore[arg-type]
    if name == "token-mdp":
        return TokenMDPEnv(TokenMDPConfig(**config))  # type: ignore[arg-type]
    raise ValueError(f"env must be one of {', '.join(ENV_NAMES)}, got {name!r}")

"""Rollout batches and the environment protocol shared by the simulator and the validator.

Axis convention (everywhere in simulate/): the SEED axis comes first, then the
item axis (responses or groups), then tokens. ``S`` seeds, ``n`` responses,
``L`` tokens per response (L = 1 for the bandit).

| field          | shape      | meaning                                                          |
|----------------|------------|------------------------------------------------------------------|
| ``prompt``     | (S, n)     | prompt index                                                     |
| ``tokens``     | (S, n, L)  | sampled tokens (the bandit's action is one token)                |
| ``mask``       | (S, n, L)  | True on real tokens (False on padding)                           |
| ``logp_behav`` | (S, n, L)  | log pi_behav(token | prefix), stored at sampling time            |
| ``reward``     | (S, n)     | verifier reward: 1 correct, 0.1 well-formed but wrong, 0         |
| ``advantage``  | (S, n)     | advantage computed at generation time (group-relative)           |
| ``created``    | (S, n)     | policy version (training step) that generated the response       |
| ``group``      | (S, n)     | group id: responses to the same prompt drawn together            |
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Protocol

import numpy as np


@dataclass
class RolloutBatch:
    """Responses for S seeds at once; see the module docstring for shapes."""

    prompt: np.ndarray  # (S, n) int64
    tokens: np.ndarray  # (S, n, L) int64
    mask: np.ndarray  # (S, n, L) bool
    logp_behav: np.ndarray  # (S, n, L) float64
    reward: np.ndarray  # (S, n) float64
    advantage: np.ndarray  # (S, n) float64
    created: np.ndarray  # (S, n) int64
    group: np.ndarray  # (S, n) int64

    @property
    def num_seeds(self) -> int:
        return self.prompt.shape[0]

    @property
    def size(self) -> int:
        return self.prompt.shape[1]

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[2]

    def take(self, index: np.ndarray) -> "RolloutBatch":
        """Items ``index`` (S, m) of each seed (fancy indexing along the item axis)."""
        rows = np.arange(self.num_seeds)[:, None]  # (S, 1)
        return RolloutBatch(**{f.name: getattr(self, f.name)[rows, index] for f in fields(self)})

    @staticmethod
    def concatenate(batches: list["RolloutBatch"]) -> "RolloutBatch":
        """Join along the item axis."""
        return RolloutBatch(
            **{f.name: np.concatenate([getattr(b, f.name) for b in batches], axis=1) for f in fields(RolloutBatch)}
        )


class Environment(Protocol):
    """A verifiable-reward task with a log-linear policy over shared parameters theta (S, d).

    Implementations: ``simulate.envs.bandit.BanditEnv``, ``simulate.envs.token_mdp.TokenMDPEnv``.
    Every method is vectorised over seeds; randomness only through the ``rng`` argument.
    """

    num_prompts: int
    seq_len: int
    param_dim: int

    def init_params(self, num_seeds: int) -> np.ndarray:
        """theta_0, (S, d): the warm-start policy (identical across seeds)."""
        ...

    def sample(self, params: np.ndarray, prompts: np.ndarray, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample responses: tokens (S, n, L), token log-probs (S, n, L), mask (S, n, L)."""
        ...

    def reward(self, prompts: np.ndarray, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Verifier reward (S, n): 1.0 correct, 0.1 well-formed but wrong, 0 otherwise."""
        ...

    def logp(self, params: np.ndarray, prompts: np.ndarray, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Token log-probs (S, n, L) of given responses under ``params`` (0 on padding)."""
        ...

    def grad_logp_contract(self, params: np.ndarray, prompts: np.ndarray, tokens: np.ndarray, mask: np.ndarray,
                           coef: np.ndarray) -> np.ndarray:
        """sum over (n, L) of coef * grad_theta log pi(token | prefix): (S, d).

        A loss that depends on theta only through the sampled tokens' log-probs has
        gradient sum dL/dlogp * grad logp, so every loss here supplies ``coef = dL/dlogp``.
        """
        ...

    def token_entropy(self, params: np.ndarray, prompts: np.ndarray, tokens: np.ndarray, mask: np.ndarray
                      ) -> np.ndarray:
        """Full-vocabulary entropy of pi(. | prefix) at each position (S, n, L)."""
        ...

    def evaluate(self, params: np.ndarray) -> dict[str, np.ndarray]:
        """Exact (or exhaustively enumerated) policy quality over all prompts, each (S,):
        ``reward`` (expected reward) and ``accuracy`` (probability of a correct response)."""
        ...

    def exact_divergences(self, params_new: np.ndarray, params_behav: np.ndarray) -> dict[str, np.ndarray]:
        """Exact divergences between two policies, averaged over prompts, each (S,):
        ``chi2``, ``d2``, ``kl_new_behav``, ``kl_behav_new``, ``m2`` (sequence level)."""
        ...

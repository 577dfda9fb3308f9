"""The shared losses of ``replay_theory.core`` on a trainer's replay batch, in a torch autograd graph.

Paper: experience-replay (docs/REFERENCES.md); the corrections are the ``LOSSES`` entries of ``core/designs.py`` a
trainer can run (``trainer=True``: M2PO Eq. (1) PPO clip ``grpo``, Replay-RLOO Eq. (2) truncated sequence weight
min(c, pi_theta / pi_behav) ``tis``, M2PO Algorithm 1 ``m2po`` and its reference code ``m2po-reference``,
``no-trust-region``). Code names -> symbols: ``logp_new`` log pi_theta, ``logp_behav`` log pi_behav (the policy that
generated the row), ``advantages`` A_i, ``mask`` the real tokens, ``row_weight`` FreshPER's w_i (Eq. (15)).

Nothing is re-implemented and no name is looked up here: the registry's ``loss_output`` (the simulator's and the
validator's route) returns the loss's value and d loss / d logp_new, and ``core/surrogate.py`` (the validator's
surrogate) turns them into a torch scalar with that value and that gradient. Framework-free (torch only), so the
TRL trainer and a verl hook share it.
"""

from __future__ import annotations

import numpy as np
import torch

from ..core import losses
from ..core.designs import LossInputs, loss_output
from ..core.surrogate import as_numpy, surrogate
from .buffer import ReplayConfig

__all__ = ["shared_loss", "shared_loss_tensor", "as_numpy"]


def shared_loss(replay: ReplayConfig, logp_new: np.ndarray, logp_behav: np.ndarray, advantages: np.ndarray,
                mask: np.ndarray) -> losses.LossOutput:
    """The shared loss of ``replay.loss`` on one batch: arrays (B, L) / (B,), as one seed (S = 1).

    Returns the LossOutput of ``replay_theory.core.losses`` (loss (1,), grad_logp (1, B, L), metrics).
    """
    inputs = LossInputs(logp_new[None], logp_behav[None], advantages[None], mask[None].astype(bool))  # S = 1
    return loss_output(replay.loss_config(), inputs, replay.aggregation)


def shared_loss_tensor(replay: ReplayConfig, logp_new: torch.Tensor, logp_behav: torch.Tensor,
                       advantages: torch.Tensor, mask: torch.Tensor, row_weight: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, losses.LossOutput]:
    """The shared loss as a torch scalar in logp_new's graph: its value is the numpy loss, its gradient the numpy one.

    ``logp_new``, ``logp_behav``, ``mask`` (B, L); ``advantages`` (B,). ``row_weight`` (B,): the sampler's
    importance weights (FreshPER Eq. (15)), multiplied into each row's gradient as the simulator's engine does;
    the value stays the loss's own.
    """
    out = shared_loss(replay, as_numpy(logp_new), as_numpy(logp_behav), as_numpy(advantages), as_numpy(mask))
    scalar = surrogate(out.grad_logp[0], logp_new, mask=mask, row_weight=row_weight, value=out.loss[0])  # (B, L) grad
    return scalar, out

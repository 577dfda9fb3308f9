"""The shared losses of ``replay_theory.core.losses`` on a replay batch, in a torch autograd graph.

Paper: experience-replay (docs/REFERENCES.md); the corrections are M2PO Eq. (1) (PPO clip, ``grpo``),
Replay-RLOO Eq. (2) (truncated sequence importance weight min(c, pi_theta / pi_behav), ``tis``), M2PO Algorithm 1
(``m2po``) and its reference code (``m2po-reference``). Code names -> symbols: ``logp_new`` log pi_theta,
``logp_behav`` log pi_behav (the policy that generated the row), ``advantages`` A_i, ``mask`` the real tokens.

Nothing is re-implemented: the numpy loss returns its value and d loss / d logp_new, and
:func:`shared_loss_tensor` turns them into a torch scalar with that value and that gradient. Framework-free
(torch only), so the TRL trainer and a verl hook share it.
"""

from __future__ import annotations

import numpy as np
import torch

from ..core import losses
from .buffer import ReplayConfig

__all__ = ["shared_loss", "shared_loss_tensor", "as_numpy"]


def as_numpy(x: torch.Tensor) -> np.ndarray:
    """A detached CPU numpy copy; floating tensors in float64 (the shared losses' precision)."""
    return x.detach().to("cpu", torch.float64).numpy() if x.is_floating_point() else x.detach().cpu().numpy()


def shared_loss(replay: ReplayConfig, logp_new: np.ndarray, logp_behav: np.ndarray, advantages: np.ndarray,
                mask: np.ndarray) -> losses.LossOutput:
    """The shared loss of ``replay.loss`` on one batch: arrays (B, L) / (B,), as one seed (S = 1).

    Returns the LossOutput of ``replay_theory.core.losses`` (loss (1,), grad_logp (1, B, L), metrics).
    """
    lp, lb, m = logp_new[None], logp_behav[None], mask[None].astype(bool)
    adv = advantages[None]
    agg = {} if replay.aggregation is None else {"aggregation": replay.aggregation}
    if replay.loss == "grpo":
        return losses.grpo(lp, lb, adv, m, replay.eps_low, replay.eps_high, **agg)
    if replay.loss == "no-trust-region":
        return losses.no_trust_region(lp, lb, adv, m, **agg)
    if replay.loss == "tis":
        # Every row, fresh ones included, gets min(c, w): a fresh row's w is 1 at its first use (pi_theta = pi_behav).
        return losses.rloo(lp, lb, adv, m, c=replay.clip_c, is_fresh=np.zeros(adv.shape, bool), **agg)
    variant = "reference" if replay.loss == "m2po-reference" else "algorithm1"
    return losses.m2po(lp, lb, adv, m, tau_m2=replay.tau_m2, variant=variant, **agg)


def shared_loss_tensor(replay: ReplayConfig, logp_new: torch.Tensor, logp_behav: torch.Tensor,
                       advantages: torch.Tensor, mask: torch.Tensor, row_weight: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, losses.LossOutput]:
    """The shared loss as a torch scalar in logp_new's graph: its value is the numpy loss, its gradient the numpy one.

    The numpy loss returns d loss / d logp_new; ``(grad.detach() * logp_new).sum()`` has exactly that gradient
    (the validator's route), and adding ``value - surrogate.detach()`` makes the value the loss itself.
    ``logp_new``, ``logp_behav``, ``mask`` (B, L); ``advantages`` (B,). ``row_weight`` (B,): the sampler's
    importance weights (FreshPER Eq. (15)), multiplied into each row's gradient as the simulator's engine does;
    the value stays the loss's own.
    """
    out = shared_loss(replay, as_numpy(logp_new), as_numpy(logp_behav), as_numpy(advantages), as_numpy(mask))
    grad_logp = out.grad_logp[0]  # (B, L)
    if row_weight is not None:
        grad_logp = grad_logp * as_numpy(row_weight)[:, None]  # FreshPER IS weights (ones for uniform designs)
    grad = torch.as_tensor(grad_logp, dtype=logp_new.dtype, device=logp_new.device)
    surrogate = (grad * torch.where(mask.bool(), logp_new, 0.0)).sum()  # padding may hold anything: never read
    value = torch.as_tensor(float(out.loss[0]), dtype=logp_new.dtype, device=logp_new.device)
    return surrogate + (value - surrogate.detach()), out

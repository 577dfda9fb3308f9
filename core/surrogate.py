"""The one bridge from a shared numpy loss to a torch model: a surrogate scalar whose gradient is the loss's.

Papers (docs/REFERENCES.md): the losses are experience-replay's GRPO, M2PO, Replay-RLOO, AsymRE and ExGRPO
(``core/losses.py``); FreshPER Eq. (15) for the per-row importance weights. Code names -> symbols:
``logp_new`` log pi_theta(y_t) of the sampled tokens, ``grad_logp`` d loss / d log pi_theta(y_t) (what every
loss returns as ``LossOutput.grad_logp``), ``row_weight`` FreshPER's w_i, ``value`` the loss itself.

Why a surrogate: the losses are numpy (one implementation for the simulator, the validator and the trainers), so
torch cannot differentiate them. By the chain rule, d loss / d theta = sum_t (d loss / d logp_t)(d logp_t / d theta),
which is the gradient of ``sum(grad_logp * logp_new)`` with ``grad_logp`` held constant. The validator
(``validate/rl.py``) and the trainers (``integrations/loss.py``: TRL, verl hooks) build it here and nowhere else.
torch only: the modules that import this already train a torch model.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["as_numpy", "gradient_tensor", "surrogate"]


def as_numpy(x: torch.Tensor) -> np.ndarray:
    """A detached CPU numpy copy; floating tensors in float64 (the shared losses' precision)."""
    return x.detach().to("cpu", torch.float64).numpy() if x.is_floating_point() else x.detach().cpu().numpy()


def gradient_tensor(grad_logp: np.ndarray | torch.Tensor, like: torch.Tensor,
                    row_weight: torch.Tensor | None = None) -> torch.Tensor:
    """d loss / d logp_new (rows, L) as a constant tensor in ``like``'s dtype and device.

    ``row_weight`` (rows,): FreshPER's importance weights (Eq. (15)), multiplied into each row's gradient in float64
    before the cast, as the simulator's engine multiplies them (ones for uniform designs). A tensor already in
    ``like``'s dtype and device is returned as it is (no copy), so a caller may convert once and slice.
    """
    if row_weight is not None:
        grad_logp = np.asarray(grad_logp) * as_numpy(row_weight)[:, None]  # (rows, L) FreshPER Eq. (15) w_i
    return torch.as_tensor(grad_logp, dtype=like.dtype, device=like.device)


def surrogate(grad_logp: np.ndarray | torch.Tensor, logp_new: torch.Tensor, *, mask: torch.Tensor | None = None,
              row_weight: torch.Tensor | None = None, value: float | None = None) -> torch.Tensor:
    """A torch scalar in ``logp_new``'s graph whose gradient with respect to ``logp_new`` is ``grad_logp``.

    ``grad_logp``, ``logp_new``, ``mask`` (rows, L). ``mask``: zero ``logp_new`` outside the real tokens first
    (a trainer's padding may hold anything, NaN included; the losses' gradient is 0 there already, so the
    gradient is the same). ``value``: add ``value - surrogate.detach()`` so the scalar's value is the loss itself
    (what a trainer logs and returns); its gradient is unchanged. Without either, this is exactly the validator's
    ``(grad * logp_new).sum()``.
    """
    grad = gradient_tensor(grad_logp, logp_new, row_weight)  # (rows, L), held constant
    lp = logp_new if mask is None else torch.where(mask.bool(), logp_new, 0.0)  # padding is never read
    total = (grad * lp).sum()  # d total / d logp_new = grad_logp (chain rule: the model gets the loss's gradient)
    if value is None:
        return total
    loss = torch.as_tensor(float(value), dtype=logp_new.dtype, device=logp_new.device)
    return total + (loss - total.detach())

"""TRL's step pieces without the trainer: the shared loss with vLLM's engine ratio, each row's share, the GRPOConfig.

Paper: experience-replay (docs/REFERENCES.md), Sec. 3 (N, B, R); the off-policy corrections are the shared losses
of ``replay_theory.core.losses`` (M2PO Eq. (1) PPO clip, Replay-RLOO Eq. (2) truncated sequence IS). Code names ->
paper symbols: ``replay.rollouts_per_step`` R (TRL's generation batch), ``num_generations`` G, ``is_ratio`` rho_it
(TRL's pi_old / pi_vllm), ``logp_behav`` log pi_old, ``logp_new`` log pi_theta. Used by integrations/trl.py's
``ReplayGRPOTrainer`` and its noise-scale and kappa parts (trl_noise.py, trl_kappa.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from trl import GRPOConfig  # pyright: ignore[reportPrivateImportUsage]  # trl's lazy __init__ exports it

from ..core import losses
from ..core.surrogate import surrogate
from .buffer import ReplayConfig
from .loss import as_numpy, shared_loss, shared_loss_tensor

#: TRL 1.16's ``vllm_importance_sampling_mode`` values (grpo_trainer.py:2667, 2680, 2686).
VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def engine_corrected_loss(replay: ReplayConfig, logp_new: torch.Tensor, logp_behav: torch.Tensor,
                          advantages: torch.Tensor, mask: torch.Tensor, is_ratio: torch.Tensor | None = None,
                          row_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, losses.LossOutput]:
    """The shared loss with TRL's vLLM importance-sampling ratio multiplied into every token's term, as TRL does.

    TRL (grpo_trainer.py:3146-3147) multiplies its per-token loss by ``importance_sampling_ratio`` rho_it, a constant
    computed at generation (pi_old / pi_vllm with its mode and cap, L2660-2707), before aggregating. Every trainer
    loss is loss = -sum_it a_it objective_it with objective_it's dependence on other tokens held constant (the PPO
    clip, M2PO's mask and Replay-RLOO's sequence weight are not differentiated), so weighting the terms gives
    value -sum_it a_it rho_it objective_it and d / d logp_it = rho_it * (the loss's own d / d logp_it): the shared
    loss's gradient times rho, nothing re-implemented. ``logp_new``, ``logp_behav`` (= pi_old), ``mask``,
    ``is_ratio`` (B, L); ``advantages``, ``row_weight`` (B,). ``is_ratio`` None: :func:`shared_loss_tensor`.

    Why two factors (vLLM, ``use_vllm=True`` with TRL's default ``vllm_importance_sampling_correction``): a row
    generated at step v by the engine (log mu, TRL's ``sampling_per_token_logps``), scored then by the trainer
    (log pi_old, ``old_per_token_logps``) and trained at step t (pi_theta) has pi_theta / mu = (pi_theta / pi_old)
    (pi_old / mu). The engine factor rho = pi_old / mu is fixed at generation (``token_truncate`` clip(e^d, C_min,
    C_max), ``token_mask`` e^d 1[C_min <= e^d <= C_max], ``sequence_*`` the same on e^(sum_t d), d = log pi_old -
    log mu) and the buffer stores it with the row; the staleness factor r = pi_theta / pi_old is the shared loss's
    correction, recomputed at every draw.
    """
    if is_ratio is None:
        return shared_loss_tensor(replay, logp_new, logp_behav, advantages, mask, row_weight=row_weight)
    out = shared_loss(replay, as_numpy(logp_new), as_numpy(logp_behav), as_numpy(advantages), as_numpy(mask))
    rho = as_numpy(is_ratio)  # (B, L) rho_it, fixed with the row at generation
    real = as_numpy(mask).astype(bool)  # (B, L)
    a = losses._token_weights(real[None], replay.resolved_aggregation)[0]  # (B, L) a_it of the loss's value
    live = real & (rho > 0)  # a masked token (rho = 0, *_mask modes) adds 0, even to an infinite objective
    with np.errstate(invalid="ignore", over="ignore"):
        grad = np.where(live, out.grad_logp[0] * rho, 0.0)  # (B, L) d loss / d logp_it = rho_it * loss's own
        objective = out.objective
        assert objective is not None  # every shared loss returns through core.losses._output, which sets it
        value = -np.sum(np.where(live & (a > 0), a * rho * objective[0], 0.0))  # -sum a rho objective
    scalar = surrogate(grad, logp_new, mask=mask, row_weight=row_weight, value=value)
    return scalar, losses.LossOutput(loss=np.array([value]), grad_logp=grad[None], metrics=out.metrics,
                                     objective=out.objective)


def row_shares(replay: ReplayConfig, mask: torch.Tensor) -> np.ndarray:
    """a_i: each row's weight in the shared loss (the aggregation's token weights summed over the row; sum 1).

    The aggregation is ``replay.resolved_aggregation``: ``replay.aggregation``, else the loss's own (its registry
    entry; tis seq-mean-token-sum, the others token-mean). ``mask`` (B, L) real tokens; returns (B,).
    """
    return losses._token_weights(as_numpy(mask).astype(bool)[None], replay.resolved_aggregation)[0].sum(axis=1)


def trl_epochs(replay: ReplayConfig) -> dict[str, int]:
    """TRL's fields of buffer epochs (GRPOConfig's per_device_train_batch_size = B, steps_per_generation = m,
    num_iterations = e); {} for any other buffer (the replay step: one update per generation of R)."""
    if replay.buffer != "epochs":
        return {}
    return dict(per_device_train_batch_size=replay.batch_size, steps_per_generation=replay.shared.mini_batches,
                num_iterations=replay.shared.epochs)


def replay_grpo_args(replay: ReplayConfig, num_generations: int, **kwargs: Any) -> GRPOConfig:
    """A GRPOConfig whose generation batch is R completions and whose every step is one update.

    per_device_train_batch_size = R (TRL's generation batch on one process), steps_per_generation = 1,
    num_iterations = 1, gradient_accumulation_steps = 1, num_generations = G; ``kwargs`` set the rest. Buffer
    epochs (e epochs over m mini-batches) is TRL's own: per_device_train_batch_size = B = R / m,
    steps_per_generation = m, num_iterations = e (the generation batch is still R).
    """
    fixed = dict(per_device_train_batch_size=replay.rollouts_per_step, steps_per_generation=1, num_iterations=1,
                 gradient_accumulation_steps=1, num_generations=num_generations) | trl_epochs(replay)
    clash = sorted(k for k in fixed if k in kwargs and kwargs[k] != fixed[k])
    if clash:
        raise ValueError(f"the replay design sets {', '.join(clash)} (R = {replay.rollouts_per_step}, "
                         f"G = {num_generations}): leave {'it' if len(clash) == 1 else 'them'} out")
    return GRPOConfig(**{**kwargs, **fixed})

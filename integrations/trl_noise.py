"""The gradient noise scale of a TRL replay trainer's steps, at no extra backward pass: two halves of whole groups.

Paper: McCandlish et al. 2018 (arXiv 1812.06162, App. A.1), the two-batch estimator; experience-replay
(docs/REFERENCES.md) for B. Code names -> symbols: ``grad_sq_small`` |g_small|^2 (the halves' mean of |g_hat_k|^2),
``grad_sq_big`` |g_big|^2 (the full batch), ``batch_small`` B_small = 2 b_1 b_2 / (b_1 + b_2), ``batch_big`` B,
``shares`` W_k (half k's weight in the loss). :class:`NoiseScaleMixin` is a part of integrations/trl.py's
``ReplayGRPOTrainer``: the state it reads (``replay``, ``noise_records``, ...) is set by that trainer's
``__init__``.
"""

from __future__ import annotations

from typing import Any

import torch
from trl import GRPOTrainer  # pyright: ignore[reportPrivateImportUsage]  # trl's lazy __init__ exports it

from ..core import losses
from ..diagnose.calibrate_log import GRAD_NORM_COLUMNS
from .buffer import ReplayConfig
from .trl_loss import engine_corrected_loss, row_shares


def noise_halves(group_id: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Two halves of a batch's rows, each prompt group's rows all in one half, as equal in rows as a greedy split
    makes them; None when the rows hold a single group (no split keeps it whole).

    Greedy (longest-processing-time): groups by row count, largest first (ties: first appearance in the batch),
    each into the half with fewer rows so far (ties: the first half). ``group_id`` (B,); returns two sorted index
    tensors (b_1,), (b_2,) with b_1 + b_2 = B. A batch of whole groups of G (on-policy) with an even number of
    groups splits into B/2 and B/2.
    """
    ids = group_id.detach().cpu().tolist()
    first: dict[int, int] = {}
    count: dict[int, int] = {}
    for row, g in enumerate(ids):
        first.setdefault(g, row)
        count[g] = count.get(g, 0) + 1
    if len(count) < 2:
        return None
    half_of: dict[int, int] = {}
    rows = [0, 0]
    for g in sorted(count, key=lambda g: (-count[g], first[g])):
        k = 0 if rows[0] <= rows[1] else 1
        half_of[g] = k
        rows[k] += count[g]
    side = torch.tensor([half_of[g] for g in ids])
    return torch.nonzero(side == 0).flatten(), torch.nonzero(side == 1).flatten()


class NoiseScaleMixin(GRPOTrainer):
    """The noise-scale part of ``ReplayGRPOTrainer``: the loss in two halves and the squared norms of each step."""

    replay: ReplayConfig
    noise_records: list[dict[str, Any]]  # one per measured step: GRAD_NORM_COLUMNS, then the kappa fields
    _noise_pending: dict[str, Any] | None  # half 1's gradient copy, between compute_loss and the step's end

    def _loss_in_halves(self, inputs: dict[str, Any], logp_new: torch.Tensor, mask: torch.Tensor,
                        halves: tuple[torch.Tensor, torch.Tensor], logp_halves: list[torch.Tensor]
                        ) -> tuple[torch.Tensor, losses.LossOutput]:
        """The shared loss on the whole batch, half 1's share backpropagated here and its gradient copied; returns
        the loss to hand TRL (value: the full loss; gradient: half 2's share) and the loss's output.

        ``logp_new`` (B, L) in batch order; ``logp_halves`` [(b_1, L), (b_2, L)], the halves' own graphs.

        How the noise scale hooks into TRL at no extra backward pass:

        1. ``compute_loss`` splits the B drawn rows into two halves that keep every prompt group whole
           (:func:`noise_halves`: the group baseline correlates a group's rows, so the group is the independent
           unit) and runs the model forward on each half separately (both graphs alive: the memory of one forward
           over B). The shared loss is computed ONCE on the whole batch's log-probs, so training is unchanged (the
           clip, M2PO's batch mask and the token-mean normaliser see all B rows); its d loss / d logp_new is split
           into the two halves' surrogates S_1 + S_2 = the full loss's surrogate.
        2. Here, S_1 is backpropagated through ``accelerator.backward`` (scaled as TRL's ``training_step`` scales its
           loss) and the accumulated gradient g_1 copied (one copy of the gradients: the memory this costs); the
           loss returned has the full loss's value and S_2's gradient.
        3. TRL's own ``training_step`` backpropagates that loss, so ``.grad`` holds g_1 + g_2, the full-batch
           gradient, each half's graph traversed once. ``training_step`` (overridden, around TRL's) then reads the
           norms (``_record_noise``), before TRL clips the gradient and steps the optimizer.
        """
        leaf = logp_new.detach().requires_grad_(True)  # (B, L): the loss's d / d logp_new, without the model
        full, out = engine_corrected_loss(self.replay, leaf, inputs["old_per_token_logps"], inputs["advantages"],
                                          mask, is_ratio=inputs.get("importance_sampling_ratio"),
                                          row_weight=inputs.get("sampler_weight"))
        (coef,) = torch.autograd.grad(full, leaf)  # (B, L), 0 on padding: the full loss's per-token gradient
        surrogates = [(coef[h] * torch.where(mask[h], lp, 0.0)).sum()  # S_1 + S_2 = the full loss's surrogate
                      for h, lp in zip(halves, logp_halves)]
        # scaled as TRL's training_step scales the loss it backpropagates (1 / gradient accumulation steps)
        self.accelerator.backward(surrogates[0] / self.current_gradient_accumulation_steps)
        params = self._trainable()
        shares = row_shares(self.replay, mask)  # (B,) a_i
        self._noise_pending = {
            "step": self.state.global_step,
            "first": [None if p.grad is None else p.grad.detach().clone() for p in params],  # g_1 (one copy)
            "shares": [float(shares[h.cpu().numpy()].sum()) for h in halves],  # W_1, W_2
            "rows": [int(h.numel()) for h in halves],  # b_1, b_2
        }
        value = full.detach()
        return surrogates[1] + (value - surrogates[1].detach()), out

    @torch.no_grad()
    def _record_noise(self, pending: dict[str, Any]) -> None:
        """|g_small|^2, |g_big|^2 from half 1's gradient copy and the accumulated full-batch gradient
        (``_loss_in_halves``); logged (``noise/grad_sq_small``, ``noise/grad_sq_big``, ``noise/batch_small``,
        ``noise/batch_big``, batch sizes in responses), kept in ``noise_records`` and appended to ``noise_log`` for
        ``calibrate --from-log --grad-norms`` (``theory.noise_scale.pooled_two_batch``).

        What is measured. With the loss L = sum_i a_i l_i (a_i the aggregation's weight of row i, sum 1: token-mean
        a_i = T_i / T, seq-mean a_i = 1 / B) and W_k = sum_{i in half k} a_i, g_hat_k = g_k / W_k is the gradient of
        half k's own mean loss, g_big = g_1 + g_2 = W_1 g_hat_1 + W_2 g_hat_2 the full-batch one: |g_small|^2 =
        (|g_hat_1|^2 + |g_hat_2|^2) / 2 and |g_big|^2 = |g_1 + g_2|^2. With halves of b_1, b_2 rows, E|g_hat_k|^2 =
        |G|^2 + tr Sigma / b_k, so B_small = 2 b_1 b_2 / (b_1 + b_2) (the harmonic mean) and B_big = B. Rows of
        unequal length make a token-mean's effective batch slightly below B: rows are the samples here. FreshPER's
        importance weights are part of each row's gradient. The norms are divided by the square of accelerate's fp16
        loss scale when it has one. A step holding one group only, or a half with no real token, is not measured.
        """
        params = self._trainable()
        sq_first = sq_second = sq_full = 0.0
        for p, g1 in zip(params, pending["first"]):
            g = p.grad
            if g is None:  # a parameter the loss does not reach
                continue
            g1 = torch.zeros_like(g) if g1 is None else g1
            sq_first += float(torch.linalg.vector_norm(g1, dtype=torch.float64) ** 2)  # |g_1|^2
            sq_second += float(torch.linalg.vector_norm(g - g1, dtype=torch.float64) ** 2)  # |g_2|^2
            sq_full += float(torch.linalg.vector_norm(g, dtype=torch.float64) ** 2)  # |g_1 + g_2|^2
        w1, w2 = pending["shares"]
        if not (w1 > 0 and w2 > 0):  # a half without a real token has no mean loss: the step is not measured
            return
        scaler = getattr(self.accelerator, "scaler", None)
        scale = float(scaler.get_scale()) if scaler is not None else 1.0  # fp16: gradients carry the loss scale
        b1, b2 = pending["rows"]
        record = {
            "step": int(pending["step"]),
            "grad_sq_small": (sq_first / w1**2 + sq_second / w2**2) / 2 / scale**2,  # mean of |g_hat_k|^2
            "grad_sq_big": sq_full / scale**2,  # |g_big|^2 = |W_1 g_hat_1 + W_2 g_hat_2|^2
            "batch_small": 2 * b1 * b2 / (b1 + b2),  # E mean_k |g_hat_k|^2 = |G|^2 + tr Sigma / B_small
            "batch_big": float(b1 + b2),  # B
        }
        self.noise_records.append(record)
        metrics = self._metrics["train"]
        for key in GRAD_NORM_COLUMNS[1:]:
            metrics[f"noise/{key}"].append(record[key])

    def _noise_record_of(self, step: int) -> dict[str, float] | None:
        """The noise record of ``step`` (the last one, if it is that step's), where the kappa fields are added."""
        last = self.noise_records[-1] if self.noise_records else None
        return last if last is not None and last["step"] == step else None

    def _model(self) -> torch.nn.Module:
        """Trainer's model (typed optional there: GRPOTrainer's __init__ takes one, or a name it loads)."""
        if self.model is None:
            raise ValueError("the trainer has no model")
        return self.model

    def _trainable(self) -> list[torch.Tensor]:
        return [p for p in self._model().parameters() if p.requires_grad]

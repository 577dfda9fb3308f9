"""The optimizer's memory kappa of a TRL replay trainer: curvature pairs on the next step's rows, lag-1 products.

Paper: experience-replay (docs/REFERENCES.md) and theory/forgetting.py (kappa = eta tr(D H D Sigma) / tr(D Sigma),
issue 30). Code names -> symbols: ``xi`` g_hat_1 - g_hat_2 (the noise scale's halves, trl_noise.py), ``w`` D xi
(D: AdamW's diagonal preconditioner), ``curvature_num`` w^T H w, ``curvature_den`` xi^T D xi, ``curvature_lr``
eta, ``curvature_step`` |h w| / |theta|, ``lag1_dot_raw`` g_t . g_{t-1}. :class:`KappaMixin` is a part of
integrations/trl.py's ``ReplayGRPOTrainer``: the state it reads (``curvature_every``, ``_lag_index``, ...) is set
by that trainer's ``__init__``.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from ..checks import require_integer, require_open_interval
from .trl_loss import engine_corrected_loss
from .trl_noise import NoiseScaleMixin

DEFAULT_CURVATURE_EVERY = 10
"""Steps between curvature pairs for kappa (issue 30): each costs two forward+backward passes of one step's R fresh
rows, against an update's one forward+backward pass of B rows: 2 R / (K B) of the updates' compute at one pair every K
steps (on-policy, R = B: 2 / K, 20% at K = 10)."""
CURVATURE_FD_STEP = 1e-4
"""|h w| / |theta| of the central difference: on the tiny Qwen2 in float32 the product agrees with autograd's to 4e-4
(tests/integration/test_validate_kappa.py); 1e-2 is past the loss's curvature scale."""
KAPPA_STATE = "kappa_pending.safetensors"
"""In a checkpoint: the pending curvature pair's w (``_save_kappa_state``)."""
DEFAULT_LAG_COORDS = 4096
"""Coordinates of the fixed random subset the lag-1 gradient products go through (two k-vectors, on the CPU)."""


def noise_options(measure_noise: bool, noise_log: str | os.PathLike | None, curvature_every: int | None,
                  curvature_step: float, lag_coords: int | None) -> tuple[int, int]:
    """The trainer's noise-scale options checked, and ``(curvature_every, lag_coords)`` with their defaults: None is
    DEFAULT_CURVATURE_EVERY / DEFAULT_LAG_COORDS with ``measure_noise``, off without it."""
    for name, value in (("curvature_every", curvature_every), ("lag_coords", lag_coords)):
        if value is not None:
            require_integer(name, value, 0, note=" (0: off)")
        if value and not measure_noise:
            raise ValueError(f"{name} > 0 needs measure_noise=True (it works on the two halves' gradients and "
                             "their records)")
    require_open_interval("curvature_step", curvature_step, 0, 1, note=" (|h w| / |theta|)")
    if noise_log is not None:  # checked first, as the diagnose log
        if not measure_noise:
            raise ValueError("noise_log needs measure_noise=True (it holds the measured norms)")
        if Path(noise_log).exists():
            raise ValueError(f"noise log {noise_log} exists: a log is never overwritten, give a new path")
    curvature_every = (DEFAULT_CURVATURE_EVERY if measure_noise else 0) if curvature_every is None \
        else curvature_every
    lag_coords = (DEFAULT_LAG_COORDS if measure_noise else 0) if lag_coords is None else lag_coords
    return curvature_every, lag_coords


class KappaMixin(NoiseScaleMixin):
    """The kappa part of ``ReplayGRPOTrainer``: curvature pairs (w saved across checkpoints) and lag-1 products."""

    curvature_every: int
    curvature_step: float
    lag_coords: int
    curvature_skipped: dict[str, int]  # why a due pair was not measured -> how often
    _curvature_pending: dict[str, Any] | None  # w = D xi of step t, until the next fresh rows
    _lag_index: list | None  # (parameter, its coordinates in the subset), drawn at the first use
    _lag_scale: float
    _lag_previous: tuple[int, torch.Tensor] | None  # (step, subset of its gradient)

    def _save_kappa_state(self, folder: Path) -> dict:
        """What a resumed run needs to log what an uninterrupted one logs: a pending pair's w (safetensors, no pickle:
        one gradient-sized file) and its scalars, the last lag-1 gradient subset, the skip counts (JSON)."""
        from safetensors.torch import save_file

        pending = self._curvature_pending
        if pending is not None:
            save_file({f"w{i}": x.contiguous().cpu() for i, x in enumerate(pending["w"])}, str(folder / KAPPA_STATE))
        previous = self._lag_previous
        return {"pending": None if pending is None else {k: v for k, v in pending.items() if k != "w"},
                "lag_previous": None if previous is None else [previous[0], previous[1].tolist()],
                "skipped": self.curvature_skipped}

    def _load_kappa_state(self, folder: Path, state: dict | None) -> None:
        """``_save_kappa_state``'s counterpart (a checkpoint written before kappa existed has none: nothing pending)."""
        from safetensors.torch import load_file

        state = state or {}
        self.curvature_skipped = dict(state.get("skipped") or {})
        previous = state.get("lag_previous")
        self._lag_previous = None if previous is None else (int(previous[0]),
                                                            torch.tensor(previous[1], dtype=torch.float64))
        pending = state.get("pending")
        self._curvature_pending = None
        if pending is not None:
            saved = load_file(str(folder / KAPPA_STATE))
            params = self._trainable()
            self._curvature_pending = {**pending, "w": [saved[f"w{i}"].to(p.device) for i, p in enumerate(params)]}

    @torch.no_grad()
    def _start_curvature(self, pending: dict[str, Any]) -> None:
        """At a measured step t (every ``curvature_every``): xi = g_hat_1 - g_hat_2 of the two halves (their own mean
        losses' gradients, ``_record_noise``), w = D xi with D = 1 / (sqrt(v_hat) + eps) the diagonal this step's
        AdamW update applies (v = beta2 exp_avg_sq + (1 - beta2) g^2 with this step's gradient g as Trainer clips
        it, ``max_grad_norm``, bias-corrected at the step's count: the state before the update alone would put
        1 / eps = 1e8 on a coordinate whose gradient first appears now), and xi^T D xi. w (one gradient-sized
        buffer) waits for the next step's fresh rows (``_finish_curvature``); the update itself is untouched (its
        gradients are only read).

        kappa = eta tr(D H D Sigma) / tr(D Sigma) (issue 30; theory/forgetting.py): ``calibrate --from-log
        --grad-norms`` pools the pairs (ratio of sums, bootstrap over pairs) into the profile's ``memory``. Why
        curvature pairs and not the lag-1 autocorrelation of successive gradients: under Adam the lag-1 signal is
        positive, about 0.4 kappa at beta1 = 0.9, biased upward by the mean gradient's drift and tiny at small kappa
        (calibrate-simulator measured 5x the exact kappa with it); under replay the reused rows' noise adds C(1) > 0.
        xi costs no extra pass: it is the two halves the noise scale already backpropagates."""
        step = int(pending["step"])
        record = self._noise_record_of(step)
        if record is None or not self.curvature_every or step % self.curvature_every:
            return
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate wraps torch's AdamW
        if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
            self._skip_curvature(f"step {step}: the optimizer is {type(optimizer).__name__}: kappa's preconditioner "
                                 "is Adam's (AdamW, TRL's default)")
            return
        params = self._trainable()
        states = [optimizer.state.get(p, {}) for p in params]  # empty before the first update
        groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        scaler = getattr(self.accelerator, "scaler", None)
        scale = float(scaler.get_scale()) if scaler is not None else 1.0  # fp16: gradients carry the loss scale
        w1, w2 = pending["shares"]
        # Trainer clips the gradient (max_grad_norm, torch's clip_grad_norm_) before AdamW folds it into v
        norm = math.sqrt(sum(float(((p.grad.double() / scale) ** 2).sum()) for p in params if p.grad is not None))
        max_norm = self.args.max_grad_norm
        clip = min(1.0, max_norm / (norm + 1e-6)) if max_norm is not None and max_norm > 0 else 1.0
        w, den = [], 0.0
        for p, g1, state in zip(params, pending["first"], states):
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            g1 = torch.zeros_like(g) if g1 is None else g1
            xi = (g1 / w1 - (g - g1) / w2).float() / scale  # g_hat_1 - g_hat_2 (float32: w's buffer)
            group = groups[id(p)]
            beta2, count = group["betas"][1], float(state.get("step", 0.0)) + 1.0  # this step's update
            previous = state["exp_avg_sq"].double() if "exp_avg_sq" in state else 0.0
            v_hat = (beta2 * previous + (1.0 - beta2) * (clip * g.double() / scale) ** 2) / (1.0 - beta2 ** count)
            d = (1.0 / (v_hat.sqrt() + group["eps"])).float()
            w.append(d * xi)
            den += float((xi.double() * w[-1].double()).sum())
        lrs = {float(optimizer.param_groups[0]["lr"])} | {float(g["lr"]) for g in optimizer.param_groups}
        if len(lrs) != 1:
            self._skip_curvature(f"step {step}: the parameter groups have different learning rates {sorted(lrs)}: "
                                 "kappa needs one eta")
            return
        self._curvature_pending = {"step": step, "w": w, "den": den, "lr": lrs.pop(),
                                   "beta1": float(optimizer.param_groups[0]["betas"][0])}

    def _finish_curvature(self, pending: dict[str, Any], rows: dict[str, torch.Tensor]) -> None:
        """At the next step that generates (theta_{t+1}, its fresh rows, which xi's rows never were): the numerator
        w^T H w, H w by central differences of the rows' score-reweighted on-policy gradient (``_curvature_grad``),
        theta +- h w with h = ``curvature_step`` |theta| / |w|; the parameters are restored bit for bit from a copy,
        the gradients come from autograd.grad (``.grad`` untouched), the random streams are forked. Adds
        ``curvature_num``, ``curvature_den``, ``curvature_lr``, ``curvature_hvp_step``, ``curvature_hvp_rows`` to
        step t's noise record.

        Why the next step's fresh rows: a Hessian taken on one of xi's own halves shares samples with xi and adds a
        third-moment term E[e^T h e] / B that a policy gradient makes large (1.7x the exact kappa on the simulator's
        bandit under SGD); the next step's rows are independent of xi, its theta one update away. Why the
        score-reweighted on-policy gradient (ratio pi_theta' / pi_old): its derivative is the on-policy field's
        Jacobian, the H of the linearised dynamics, with the score cross terms between a completion's tokens that
        the loss's own Hessian on fixed rows lacks (2.7x off on the simulator's token MDP). Costs two
        forward+backward passes of R rows and two parameter-sized buffers; needs float32 parameters (bfloat16 rounds
        theta + h w back to theta) and no active dropout, else the pair is skipped and said (``curvature_skipped``).
        """
        self._curvature_pending = None  # ``pending``, measured now or skipped
        params = self._trainable()
        reason = self._curvature_blocker(params)
        if reason is not None:
            self._skip_curvature(f"step {pending['step']}: {reason}")
            return
        w = pending["w"]
        theta_norm = math.sqrt(float(sum((p.detach().double() ** 2).sum() for p in params)))  # IEEE sqrt, as torch's
        w_norm = math.sqrt(float(sum((x.double() ** 2).sum() for x in w)))
        if not w_norm > 0:
            self._skip_curvature(f"step {pending['step']}: xi = 0 (the halves' gradients are equal)")
            return
        h = self.curvature_step * theta_norm / w_norm
        num = self._central_difference(rows, params, w, h)
        record = next((r for r in reversed(self.noise_records) if r["step"] == pending["step"]), None)
        if record is None:
            return
        record.update({"curvature_num": num / (2 * h), "curvature_den": pending["den"],
                       "curvature_lr": pending["lr"], "curvature_beta1": pending["beta1"],
                       "curvature_hvp_step": int(self.state.global_step),
                       "curvature_hvp_rows": int(rows["completion_ids"].shape[0])})
        if pending["den"] > 0:  # one pair's kappa: a noisy monitor; calibrate --from-log pools the pairs
            self._metrics["train"]["noise/kappa_pair"].append(pending["lr"] * record["curvature_num"] / pending["den"])

    def _curvature_blocker(self, params: list[torch.Tensor]) -> str | None:
        """Why theta +- h w cannot be differenced here (None: it can): parameters below float32, active dropout."""
        if any(p.dtype not in (torch.float32, torch.float64) for p in params):
            return (f"parameters in {params[0].dtype}: theta +- h w rounds back to theta below float32 (train the "
                    "model in float32, or with float32 master weights)")
        dropout = [m for m in self._model().modules() if isinstance(m, torch.nn.Dropout) and m.training and m.p > 0]
        if dropout:
            return (f"dropout p = {dropout[0].p:g} is active: the two sides of the difference would see different "
                    "masks (GRPOConfig(disable_dropout=True))")
        return None

    def _central_difference(self, rows: dict[str, torch.Tensor], params: list[torch.Tensor],
                            w: list[torch.Tensor], h: float) -> float:
        """w . g(theta + h w) - w . g(theta - h w) on ``rows`` (``_curvature_grad``); the parameters restored bit for
        bit from a copy, the training's random streams never advanced."""
        saved = [p.detach().clone() for p in params]  # restored exactly: the update sees the same theta
        devices = sorted({p.device.index for p in params if p.device.type == "cuda"})
        num = 0.0
        try:
            with torch.random.fork_rng(devices=devices):
                for sign in (1.0, -1.0):
                    with torch.no_grad():
                        for p, s, x in zip(params, saved, w):
                            p.copy_(s + sign * h * x.to(p.dtype))
                    grads = self._curvature_grad(rows, params)
                    num += sign * sum(float((g.double() * x.double()).sum()) for g, x in zip(grads, w)
                                      if g is not None)
                    del grads
        finally:
            with torch.no_grad():
                for p, s in zip(params, saved):
                    p.copy_(s)
        return num

    def _curvature_grad(self, rows: dict[str, torch.Tensor], params: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """rho g_on of the fresh ``rows`` at the model's current parameters: the shared loss with the behaviour
        log-probs set to the current ones (ratio 1, the on-policy gradient) times each row's sequence ratio rho =
        pi_theta / pi_old (a constant weight), and TRL's vLLM ratio where there is one. Its derivative at pi_old is
        the on-policy field's Jacobian (score cross terms between tokens included, which the loss's own Hessian on
        fixed rows lacks: simulate/calibrate.py measures both). autograd.grad: nothing accumulates in ``.grad``."""
        ids = torch.cat([rows["prompt_ids"], rows["completion_ids"]], dim=1)
        attention = torch.cat([rows["prompt_mask"], rows["completion_mask"]], dim=1)
        logp = self._get_per_token_logps_and_entropies(self.model, ids, attention, rows["completion_ids"].size(1))[0]
        mask = (rows["completion_mask"] * rows["tool_mask"]).bool()
        current = logp.detach()
        rho = torch.exp(torch.where(mask, current - rows["old_per_token_logps"], 0.0).sum(dim=1))  # (R,)
        loss, _ = engine_corrected_loss(self.replay, logp, current, rows["advantages"], mask,
                                        is_ratio=rows.get("importance_sampling_ratio"), row_weight=rho)
        return list(torch.autograd.grad(loss, params, allow_unused=True))

    def _skip_curvature(self, reason: str) -> None:
        """A curvature pair that could not be formed: counted and said once per reason (never silently)."""
        first = reason.split(":", 1)[-1].strip()
        if first not in self.curvature_skipped:
            warnings.warn(f"curvature pair not measured at {reason}", stacklevel=2)
        self.curvature_skipped[first] = self.curvature_skipped.get(first, 0) + 1

    @torch.no_grad()
    def _record_lag(self, step: int) -> None:
        """The lag-1 products of successive full-batch gradients through a fixed random subset of ``lag_coords``
        coordinates (drawn once, seeded by ``args.seed``), scaled by P / k: ``lag1_dot_raw`` = g_t . g_{t-1} and
        ``lag1_sq_raw`` = |g_{t-1}|^2 on step t's noise record. Raw (unpreconditioned) coordinates: SGD's estimator
        (``theory.forgetting.kappa_from_gradient_series``: corr = -kappa / 2 on an on-policy run); under Adam the
        signal is ~ +0.4 kappa, the sign of the mean gradient's drift, and under replay the reused rows' noise adds
        C(1) > 0: use the curvature pairs there. A checkpoint keeps a pending w (``KAPPA_STATE``, safetensors) and the
        last subset (JSON), so a resumed run logs what an uninterrupted one logs."""
        record = self._noise_record_of(step)
        params = self._trainable()
        if self._lag_index is None:
            sizes = torch.tensor([p.numel() for p in params])
            total = int(sizes.sum())
            generator = torch.Generator().manual_seed(int(self.args.seed) + 7907)
            flat = torch.randint(0, total, (self.lag_coords,), generator=generator).sort().values
            which = torch.searchsorted(torch.cumsum(sizes, 0), flat, right=True)
            starts = torch.cumsum(sizes, 0) - sizes
            self._lag_index = [(i, (flat[which == i] - starts[i]).to(params[i].device))
                               for i in range(len(params)) if bool((which == i).any())]
            self._lag_scale = total / self.lag_coords
        scaler = getattr(self.accelerator, "scaler", None)
        scale = float(scaler.get_scale()) if scaler is not None else 1.0
        vec = torch.cat([(params[i].grad.reshape(-1)[idx] if params[i].grad is not None
                          else torch.zeros(len(idx), device=idx.device)).double().cpu() for i, idx in self._lag_index])
        vec = vec / scale
        previous, self._lag_previous = self._lag_previous, (step, vec)
        if record is not None and previous is not None and previous[0] == step - 1:
            record["lag1_dot_raw"] = self._lag_scale * float(vec @ previous[1])
            record["lag1_sq_raw"] = self._lag_scale * float(previous[1] @ previous[1])
            record["lag1_coords"] = self.lag_coords

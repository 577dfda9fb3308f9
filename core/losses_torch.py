"""The policy-gradient losses of ``core/losses.py`` in torch: value and d loss / d logp_new on the model's device.

Same losses, same papers, same conventions (module docstring of ``core/losses.py``, the numpy reference): M2PO
("Prosperity before Collapse", arXiv:2510.01161) Eqs. (1), (4), (5) and Algorithm 1; Replay-RLOO Eqs. (2)-(3);
AsymRE (experience-replay App. E); ExGRPO (arXiv:2510.02245) Eq. (4). Each function mirrors its numpy namesake line
by line, in float64, so the two agree to rounding (``tests/unit/test_losses_torch.py``: every loss the validator
trains with, on random batches, to 1e-6; measured ~1e-15). Why a second library rather than one array-API
implementation: the numpy functions are the simulator's and the CPU validator's bit-exact reference and stay
untouched; these run where the validator's model runs (CUDA), so an update never copies log-probs to the host and a
gradient back (``validate/rl.py``, ``update_step``).

What differs from the reference, by design:

* no input checks that need the host (finite values, 0/1 masks): the inputs are the validator's own forward pass and
  buffer. ``TorchLossOutput.finite`` is a (S,) device flag (logp_new finite on real tokens) that the caller reads
  once per update, before the optimizer step, and raises on, as the reference raises;
* ``metrics`` holds what the validator logs per step (``validate.rl.step_metrics``): the clip fractions, M2PO's
  mask statistics, RLOO's weight statistics, ExGRPO's replay share and ``is_ratio_{min,mean,max,std}`` (the
  statistics kernel's ``ratio_*``, ``theory/moments.py``), each (S,) on the device. The rest of the reference's
  diagnostics (kl_k3, chi2, ...) the validator computes from the log-ratios on the host (``core/metrics.py``).

| code name     | paper symbol         | shape       |
|---------------|----------------------|-------------|
| ``logp_new``  | log pi_theta         | (S, n, L)   |
| ``logp_behav``| log pi_behav / mu    | (S, n, L)   |
| ``advantage`` | A_i                  | (S, n)      |
| ``mask``      | real tokens          | (S, n, L)   |
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import overload

import torch

from ..checks import invalid, one_of, require_finite, require_nonnegative, require_positive
from .losses import AGGREGATIONS, clip_log_bounds

__all__ = ["TorchLossOutput", "TORCH_LOSSES", "loss_output_torch", "reinforce", "grpo", "no_trust_region", "m2po",
           "rloo", "asymre", "exgrpo_shaped"]

Tensor = torch.Tensor


@dataclass
class TorchLossOutput:
    """A loss per seed, its derivative with respect to ``logp_new``, and the logged metrics, on one device."""

    loss: Tensor  # (S,) float64
    grad_logp: Tensor  # (S, n, L) float64, 0 on padding
    metrics: dict[str, Tensor] = field(default_factory=dict)  # each (S,)
    finite: Tensor | None = None  # (S,) bool: logp_new (and logp_behav) finite on every real token


@overload
def _inputs(logp_new: Tensor, mask: Tensor, logp_behav: None = None) -> tuple[Tensor, Tensor, None, None, Tensor]: ...
@overload
def _inputs(logp_new: Tensor, mask: Tensor, logp_behav: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]: ...
@overload
def _inputs(logp_new: Tensor, mask: Tensor, logp_behav: Tensor | None
            ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor]: ...
def _inputs(logp_new: Tensor, mask: Tensor, logp_behav: Tensor | None = None
            ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor]:
    """(logp_new, mask, logp_behav or None, log_ratio or None, finite (S,)), float64, padding zeroed."""
    m = mask.bool()
    lp = torch.where(m, logp_new.double(), 0.0)
    finite = torch.isfinite(lp).flatten(1).all(1)  # (S,)
    if logp_behav is None:
        return lp, m, None, None, finite
    lb = torch.where(m, logp_behav.double(), 0.0)
    finite = finite & torch.isfinite(lb).flatten(1).all(1)
    return lp, m, lb, lp - lb, finite


def _token_advantage(advantage: Tensor, m: Tensor) -> Tensor:
    a = advantage.double()
    if a.dim() == 2:
        a = a[..., None]  # Eq. (2), M2PO: A constant over the tokens of o_i
    return torch.where(m, a, 0.0)  # (S, n, L)


def _token_weights(m: Tensor, aggregation: str) -> Tensor:
    """(S, n, L) weights a_it >= 0 with loss = -sum a_it objective_it (``core.losses._token_weights``)."""
    mf = m.double()
    if aggregation == "token-mean":
        return mf / mf.sum(dim=(1, 2), keepdim=True)
    n = m.shape[1]
    if aggregation == "seq-mean-token-sum":
        return mf / n
    if aggregation == "seq-mean-token-mean":
        length = mf.sum(dim=2, keepdim=True)  # (S, n, 1)
        return torch.where(length > 0, mf / (n * length.clamp(min=1.0)), 0.0)
    raise invalid("aggregation", one_of(AGGREGATIONS), aggregation)


def _output(objective: Tensor, d_objective: Tensor, weights: Tensor, metrics: dict, finite: Tensor
            ) -> TorchLossOutput:
    live = weights > 0
    loss = -torch.where(live, weights * objective, 0.0).sum(dim=(1, 2))  # (S,)
    grad = torch.where(live, -weights * d_objective, 0.0)  # (S, n, L)
    return TorchLossOutput(loss, grad, metrics, finite)


def _token_mean(x: Tensor, m: Tensor) -> Tensor:
    """Mean of x over each seed's real tokens (S,)."""
    if x.dtype == torch.bool:
        return (x & m).sum(dim=(1, 2)).double() / m.sum(dim=(1, 2))
    return torch.where(m, x, 0.0).sum(dim=(1, 2)) / m.sum(dim=(1, 2))


def _ratio_metrics(log_ratio: Tensor, m: Tensor) -> dict[str, Tensor]:
    """is_ratio_{min,mean,max,std} over each seed's real tokens, in log space as ``Moments.from_rows`` computes them:
    shifted by the row maximum M, mean r = e^M A / n, std = e^M sqrt(Q / n) with Q the centred sum."""
    lr, mf = log_ratio.flatten(1), m.flatten(1)  # (S, n L)
    n = mf.sum(1).double()  # (S,)
    top = torch.where(mf, lr, -math.inf).amax(1, keepdim=True)  # (S, 1) M
    e = torch.where(mf, torch.exp(lr - top), 0.0)  # (S, n L) e^{log r - M}
    A = e.sum(1)
    centred = torch.where(mf, e - (A / n)[:, None], 0.0)
    Q = (centred * centred).sum(1)
    top = top[:, 0]
    return {"is_ratio_min": torch.exp(torch.where(mf, lr, math.inf).amin(1)),
            "is_ratio_mean": torch.exp(top + torch.log(A / n)),
            "is_ratio_max": torch.exp(top),
            "is_ratio_std": torch.sqrt(torch.exp(2.0 * top) * (Q / n))}


def _clipped_surrogate(log_ratio: Tensor, adv: Tensor, m: Tensor, log_lo, log_hi):
    """PPO's min(r A, clip(r) A) and its derivative in logp_new (``core.losses._clipped_surrogate``)."""
    pos = m & (adv > 0)
    neg = m & (adv < 0)
    high = pos & (log_ratio > log_hi)  # A > 0, r > 1 + eps_high
    low = neg & (log_ratio < log_lo)  # A < 0, r < 1 - eps_low
    log_lo_t = torch.as_tensor(log_lo, dtype=log_ratio.dtype, device=log_ratio.device)
    log_hi_t = torch.as_tensor(log_hi, dtype=log_ratio.dtype, device=log_ratio.device)
    log_value = torch.where(high, log_hi_t, torch.where(low, log_lo_t, log_ratio))
    ratio = torch.exp(log_value)
    live = pos | neg
    objective = torch.where(live, ratio * adv, 0.0)  # Eq. (1), M2PO
    d_objective = torch.where(live & ~(high | low), ratio * adv, 0.0)  # d(r A)/d log pi = r A
    return objective, d_objective, low, high


def reinforce(logp_new: Tensor, advantage: Tensor, mask: Tensor, *, aggregation: str = "token-mean",
              logp_behav: Tensor | None = None) -> TorchLossOutput:
    """REINFORCE, -mean A log pi (``core.losses.reinforce``)."""
    lp, m, _, lr, finite = _inputs(logp_new, mask, logp_behav)
    adv = _token_advantage(advantage, m)
    metrics = _ratio_metrics(lr, m) if lr is not None else {}
    return _output(adv * lp, adv, _token_weights(m, aggregation), metrics, finite)


def grpo(logp_new: Tensor, logp_behav: Tensor, advantage: Tensor, mask: Tensor, eps_low: float = 0.2,
         eps_high: float = 0.2, *, aggregation: str = "token-mean") -> TorchLossOutput:
    """GRPO / PPO clipped surrogate with token ratios (M2PO Eq. 1; ``core.losses.grpo``)."""
    lp, m, lb, lr, finite = _inputs(logp_new, mask, logp_behav)
    adv = _token_advantage(advantage, m)
    log_lo, log_hi = clip_log_bounds(eps_low, eps_high)
    objective, d_objective, low, high = _clipped_surrogate(lr, adv, m, log_lo, log_hi)
    clipped = _token_mean(low | high, m)
    metrics = {"clip_ratio/low_mean": _token_mean(low, m), "clip_ratio/high_mean": _token_mean(high, m),
               "clip_ratio/region_mean": clipped, "pg_clipfrac": clipped.clone(), **_ratio_metrics(lr, m)}
    return _output(objective, d_objective, _token_weights(m, aggregation), metrics, finite)


def no_trust_region(logp_new: Tensor, logp_behav: Tensor, advantage: Tensor, mask: Tensor, *,
                    aggregation: str = "token-mean") -> TorchLossOutput:
    """Importance-weighted PG, GRPO with eps = inf (M2PO Sec. 4)."""
    return grpo(logp_new, logp_behav, advantage, mask, math.inf, math.inf, aggregation=aggregation)


def _reverse_cumsum(values: Tensor) -> Tensor:
    """suffix[:, k] = sum of values[:, k:] (S, N). torch refuses a floating cumsum on CUDA under deterministic
    algorithms (the validator runs with them): there it is summed on the host, the one copy of M2PO's update."""
    if values.is_cuda and torch.are_deterministic_algorithms_enabled():
        return values.cpu().flip(1).cumsum(1).flip(1).to(values.device)
    return values.flip(1).cumsum(1).flip(1)


def _m2po_drop_and_cap(log_ratio: Tensor, adv: Tensor, m: Tensor, tau_m2: float, variant: str):
    """(drop (S, n, L), cap (S,)) of ``core.losses._m2po_drop_and_cap`` for one variant: the sorted-suffix form of
    Algorithm 1 (M2PO) or the reference code's winsorised cap, computed for every row, then kept only where the
    constraint may bind (elsewhere nothing is dropped and the cap is inf, as the reference's early exit)."""
    if variant not in ("algorithm1", "reference"):
        raise ValueError(f"variant must be 'algorithm1' or 'reference', got {variant!r}")
    S = m.shape[0]
    cand = (m & (((adv > 0) & (log_ratio > 0)) | ((adv < 0) & (log_ratio < 0)))).flatten(1)  # (S, N) T
    lr = log_ratio.flatten(1)  # (S, N)
    m2_tok = lr * lr  # (S, N) M2_i, Eq. (4)
    count = cand.sum(1).double()  # (S,) |T| (float64: a Python float times an int64 tensor is float32)
    may_bind = (m2_tok * cand).sum(1) > tau_m2 * (1.0 - 1e-9) * count
    v_sorted = torch.where(cand, m2_tok, 0.0).sort(dim=1, descending=True).values  # (S, N)
    N = lr.shape[1]
    suffix = torch.cat([_reverse_cumsum(v_sorted), v_sorted.new_zeros(S, 1)], dim=1)  # (S, N + 1)
    rows = torch.arange(S, device=lr.device)
    inf = torch.full((S,), math.inf, dtype=lr.dtype, device=lr.device)
    if variant == "algorithm1":
        k = torch.arange(N + 1, device=lr.device)[None, :]
        remaining = count[:, None] - k  # (S, N + 1)
        mean_rest = suffix / remaining
        stop = (remaining <= 0) | (mean_rest <= tau_m2)  # Algorithm 1, line 3
        n_drop = stop.to(torch.uint8).argmax(1)  # (S,) first k at which the loop exits
        last = torch.where(n_drop > 0, v_sorted[rows, (n_drop - 1).clamp(min=0)], inf)
        above = cand & (m2_tok > last[:, None])
        tied = cand & (m2_tok == last[:, None])
        drop = above | (tied & (tied.cumsum(1) <= (n_drop - above.sum(1))[:, None]))
        cap = inf
    else:
        kk = torch.arange(1, N + 1, device=lr.device)[None, :]
        g_at_breaks = kk * v_sorted + suffix[:, 1:]  # (S, N) |T| g(c_k)
        total = tau_m2 * count  # (S,)
        n_capped = ((kk <= count[:, None]) & (g_at_breaks > total[:, None])).sum(1)  # (S,) K
        rest = suffix[rows, n_capped]
        c_star = torch.where(n_capped > 0, (total - rest) / n_capped.clamp(min=1), inf)
        cap = torch.sqrt(c_star.clamp(min=0.0))  # (S,) tau
        drop = cand & (lr.abs() > cap[:, None])
    drop = drop & may_bind[:, None]
    cap = torch.where(may_bind, cap, inf)
    return drop.reshape(m.shape), cap


def m2po(logp_new: Tensor, logp_behav: Tensor, advantage: Tensor, mask: Tensor, tau_m2: float = 0.04,
         variant: str = "algorithm1", *, aggregation: str = "token-mean") -> TorchLossOutput:
    """M2PO, second-moment trust region by token masking (Eqs. (4)-(5), Algorithm 1; ``core.losses.m2po``)."""
    require_nonnegative("tau_m2", tau_m2, allow_inf=True)
    lp, m, lb, lr, finite = _inputs(logp_new, mask, logp_behav)
    adv = _token_advantage(advantage, m)
    weights = _token_weights(m, aggregation)
    drop, cap = _m2po_drop_and_cap(lr, adv, m, tau_m2, variant)
    keep = m & ~drop
    if variant == "algorithm1":
        live = keep & (adv != 0)
        ratio = torch.exp(torch.where(live, lr, 0.0))
        objective = torch.where(live, ratio * adv, 0.0)  # Eq. (5), M2PO: M_it r_it A_it
        d_objective = objective
    else:
        objective, d_objective, _, _ = _clipped_surrogate(lr, adv, m, -cap[:, None, None], cap[:, None, None])
    kept_count = keep.sum(dim=(1, 2))
    m2_after = torch.where(keep, lr * lr, 0.0).sum(dim=(1, 2)) / kept_count
    metrics = {"masked_frac": _token_mean(drop, m), "m2_after": torch.where(kept_count > 0, m2_after, math.nan),
               "m2_cap": cap, **_ratio_metrics(lr, m)}
    return _output(objective, d_objective, weights, metrics, finite)


def _kish(log_w: Tensor, real: Tensor) -> Tensor:
    """Kish (sum w)^2 / (n sum w^2) of each row's real weights, from sums shifted by the row maximum (S,)."""
    top = torch.where(real, log_w, -math.inf).amax(1, keepdim=True)
    e = torch.where(real, torch.exp(log_w - top), 0.0)
    A, B, n = e.sum(1), (e * e).sum(1), real.sum(1).double()
    return torch.where(A > 0, torch.clamp(A * A / (n * B), max=1.0), 0.0)


def rloo(logp_new: Tensor, logp_behav: Tensor, advantage: Tensor, mask: Tensor, c: float, is_fresh: Tensor, *,
         aggregation: str = "seq-mean-token-sum") -> TorchLossOutput:
    """Replay-RLOO with the clipped sequence weight w = min(c, e^{sum log r}), detached (Eqs. (2)-(3))."""
    require_positive("c", c, allow_inf=True)
    lp, m, lb, lr, finite = _inputs(logp_new, mask, logp_behav)
    adv = advantage.double()  # (S, n)
    fresh = is_fresh.bool()  # (S, n)
    weights = _token_weights(m, aggregation)
    seq_lr = torch.where(m, lr, 0.0).sum(2)  # (S, n) log pi_theta(y|x) - log mu(y|x)
    log_c = math.log(c)
    w = torch.where(fresh, 1.0, torch.exp(torch.clamp(seq_lr, max=log_c)))  # Eq. (2), Replay-RLOO
    coef = torch.where(adv != 0, w * adv, 0.0)  # (S, n)
    coef_tok = coef[..., None].expand(m.shape)
    objective = coef_tok * lp  # Eq. (3), Replay-RLOO
    replayed = ~fresh
    n_rep = replayed.sum(1)  # (S,)
    has_rep = n_rep > 0
    log_w = torch.clamp(seq_lr, max=log_c)
    safe = torch.where(has_rep[:, None], replayed, torch.ones_like(replayed))
    clip_frac = (replayed & (seq_lr >= log_c)).sum(1).double() / n_rep
    weight_mean = torch.where(replayed, w, 0.0).sum(1) / n_rep
    metrics = {"ess_frac": torch.where(has_rep, _kish(log_w, safe), 1.0),
               "clip_frac": torch.where(has_rep, clip_frac, 0.0),
               "weight_mean": torch.where(has_rep, weight_mean, 1.0),
               "replay_frac": n_rep.double() / m.shape[1], **_ratio_metrics(lr, m)}
    return _output(objective, coef_tok, weights, metrics, finite)


def asymre(logp_new: Tensor, reward: Tensor, value_baseline: Tensor, mask: Tensor, delta_v: float = 0.0, *,
           aggregation: str = "seq-mean-token-sum", logp_behav: Tensor | None = None) -> TorchLossOutput:
    """AsymRE, -(1/n) sum_i (r_i - (V + delta V)) log pi(z_i|q) (experience-replay App. E)."""
    require_finite("delta_v", delta_v)
    lp, m, _, lr, finite = _inputs(logp_new, mask, logp_behav)
    coef = (reward.double() - (value_baseline.double() + delta_v))[..., None].expand(m.shape)
    metrics = _ratio_metrics(lr, m) if lr is not None else {}
    return _output(coef * lp, coef, _token_weights(m, aggregation), metrics, finite)


def exgrpo_shaped(logp_new: Tensor, logp_behav: Tensor, advantage: Tensor, mask: Tensor, is_replayed: Tensor,
                  beta: float = 0.1, eps_low: float = 0.2, eps_high: float = 0.2, *,
                  aggregation: str = "token-mean") -> TorchLossOutput:
    """ExGRPO: the GRPO clip on fresh rows, f(w) = w / (w + beta) on replayed ones (Eq. (4), Sec. 4.2)."""
    require_positive("beta", beta, allow_inf=True)
    lp, m, lb, lr, finite = _inputs(logp_new, mask, logp_behav)
    adv = _token_advantage(advantage, m)
    rep = is_replayed.bool()[..., None].expand(m.shape)
    weights = _token_weights(m, aggregation)
    log_lo, log_hi = clip_log_bounds(eps_low, eps_high)
    fresh_tok, rep_tok = m & ~rep, m & rep
    clip_obj, clip_d, low, high = _clipped_surrogate(lr, adv, fresh_tok, log_lo, log_hi)
    w = torch.exp(torch.where(rep_tok, lr, 0.0))
    f_w = torch.where(torch.isinf(w), 1.0, w / (w + beta))  # Sec. 4.2, ExGRPO: f(w) = w / (w + beta)
    g_w = torch.where(torch.isinf(w), 0.0, beta * w / (w + beta) ** 2)  # d f(w) / d log w
    objective = torch.where(rep_tok, f_w * adv, clip_obj)
    d_objective = torch.where(rep_tok, g_w * adv, clip_d)
    n_rep_tok = rep_tok.sum(dim=(1, 2))
    shaping_mean = torch.where(rep_tok, g_w, 0.0).sum(dim=(1, 2)) / n_rep_tok
    metrics = {"clip_ratio/low_mean": _token_mean(low, m), "clip_ratio/high_mean": _token_mean(high, m),
               "clip_ratio/region_mean": _token_mean(low | high, m), "pg_clipfrac": _token_mean(low | high, m),
               "replay_frac": _token_mean(rep_tok, m),
               "shaping_weight_mean": torch.where(n_rep_tok > 0, shaping_mean, math.nan), **_ratio_metrics(lr, m)}
    return _output(objective, d_objective, weights, metrics, finite)


# --------------------------------------------------------------------------- the registry's names


def _fresh_rows(x: dict) -> Tensor:
    return x["is_fresh"] if x["is_fresh"] is not None else torch.ones(x["advantage"].shape, dtype=torch.bool,
                                                                    device=x["advantage"].device)


TORCH_LOSSES = {
    "reinforce": lambda c, x, agg: reinforce(x["logp_new"], x["advantage"], x["mask"], aggregation=agg),
    "grpo": lambda c, x, agg: grpo(x["logp_new"], x["logp_behav"], x["advantage"], x["mask"], c.eps_low, c.eps_high,
                                   aggregation=agg),
    "no-trust-region": lambda c, x, agg: no_trust_region(x["logp_new"], x["logp_behav"], x["advantage"], x["mask"],
                                                         aggregation=agg),
    "m2po": lambda c, x, agg: m2po(x["logp_new"], x["logp_behav"], x["advantage"], x["mask"], c.tau_m2,
                                   "algorithm1", aggregation=agg),
    "m2po-reference": lambda c, x, agg: m2po(x["logp_new"], x["logp_behav"], x["advantage"], x["mask"], c.tau_m2,
                                             "reference", aggregation=agg),
    "rloo": lambda c, x, agg: rloo(x["logp_new"], x["logp_behav"], x["advantage"], x["mask"], c.clip_c,
                                   _fresh_rows(x), aggregation=agg),
    "tis": lambda c, x, agg: rloo(x["logp_new"], x["logp_behav"], x["advantage"], x["mask"], c.clip_c,
                                  torch.zeros_like(_fresh_rows(x)), aggregation=agg),  # every row min(c, w)
    "asymre": lambda c, x, agg: asymre(x["logp_new"], x["reward"], x["reward"] - x["advantage"], x["mask"],
                                       c.asymre_delta_v, aggregation=agg),
    "exgrpo": lambda c, x, agg: exgrpo_shaped(x["logp_new"], x["logp_behav"], x["advantage"], x["mask"],
                                              ~_fresh_rows(x), c.exgrpo_beta, c.eps_low, c.eps_high,
                                              aggregation=agg),
}
"""Registry name (``core.designs.LOSSES``) -> the torch loss with the config's parameters, as ``LossDesign.compute``
calls the numpy one: ``(config, inputs, aggregation)``, inputs a dict of device tensors named as ``LossInputs``."""


def loss_output_torch(config, logp_new: Tensor, logp_behav: Tensor, advantage: Tensor, mask: Tensor,
                      is_fresh: Tensor | None = None, reward: Tensor | None = None) -> TorchLossOutput:
    """The loss named in ``config`` (a ``DesignConfig``) on device tensors, with the registry's aggregation:
    ``core.designs.loss_output`` in torch."""
    from .designs import loss_aggregation  # designs imports losses; this module is imported only with torch

    if config.loss not in TORCH_LOSSES:
        raise ValueError(f"loss {config.loss!r} has no torch implementation; known: {', '.join(TORCH_LOSSES)}")
    if config.loss == "asymre" and reward is None:
        raise ValueError("loss asymre needs the rewards (its baseline is r - A): pass reward")
    inputs = {"logp_new": logp_new, "logp_behav": logp_behav, "advantage": advantage, "mask": mask,
              "is_fresh": is_fresh, "reward": reward}
    return TORCH_LOSSES[config.loss](config, inputs, loss_aggregation(config))

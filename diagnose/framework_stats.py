"""The off-policy statistics TRL, verl and M2PO users already read in their logs, under the frameworks' own names.

Each statistic is a transcription of the code that logs it (the file and function
are named next to its formula below), over one batch of padded arrays
``(rows, tokens)`` with a 0/1 ``mask``.  Roles: ``logp_behav`` is the policy that
sampled the tokens (verl ``rollout_log_probs``, TRL ``sampling_per_token_logps``,
M2PO ``old_log_prob``), ``logp_current`` the policy being trained (verl
``old_log_probs`` / ``log_prob``, TRL ``old_per_token_logps`` / ``per_token_logps``),
and log r = logp_current - logp_behav throughout.  Only numpy is needed, so the
TRL trainer can log :func:`framework_statistics` and ``diagnose`` can stream the
same quantities (:class:`FrameworkSums`): both go through :func:`finish`, so a
streamed log and the same log as one batch give the same numbers.

Conventions copied from the code (they matter at the 1e-8 level and for
which average is meant):

* verl's ``masked_mean`` divides by ``mask.sum() + 1e-8`` (verl/utils/torch_functional.py,
  ``masked_mean``); per-sequence means (``axis=-1``) likewise, and a batch mean of
  per-sequence values runs over ALL rows, empty ones included.
* verl exponentiates log-ratios only after clamping them to [-20, 20]
  (``SAFETY_BOUND``, rollout_corr_helper.py; core_algos.py ``compute_policy_loss_vanilla``).
* TRL's per-sequence quantities are means over ALL rows; ``clip_ratio/low_min`` and
  ``high_max`` take ``nanmin`` / ``nanmax`` over per-sequence token means (an empty
  row gives 0/0 = NaN and is skipped).

Not a transcription: comparisons of a ratio with a threshold are made on log r
(``lr > log c`` for ``exp(lr) > c``) where the ratio may overflow; they differ from
the frameworks' float32 ``exp`` only for a ratio within an ulp of the threshold.
Sequence log-ratios are summed, never exponentiated unbounded, so |log R| = 4096
gives finite numbers.  ``rollout_corr/k3_kl`` is left out: verl computes it
without the clamp (so it is inf where r overflows); ``diagnose``'s ``kl_k3`` is the
same quantity.

Two ESS-like numbers, not to be confused (TRL computes no ESS at all):
``rollout_corr/rollout_is_eff_sample_size`` is verl's
1 / masked_mean((w~ / (mean w~ + 1e-8))^2) with w~ = clamp(w, 1/C, C), w = r
clamped to [e^-20, e^20] (token mode: the Kish fraction of the token ratios clamped
to [1/C, C]; sequence mode: of the sequence ratio clamped likewise, token-weighted),
which differs from the Kish ESS of the weights verl trains with (min(w, C), no
lower clamp; ``diagnose``'s ``tis`` what-if row at c = C) and from ``diagnose``'s
``ess_frac`` (Kish of the raw r).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

#: verl/utils/torch_functional.py masked_mean: values.sum() / (mask.sum() + 1e-8)
VERL_EPS = 1e-8
#: verl rollout_corr_helper.py SAFETY_BOUND and core_algos.py compute_policy_loss_vanilla's clamp
SAFETY_BOUND = 20.0
#: M2PO core_algos.py _get_trust_region_tokens_delta_sq: |A| > 1e-12, r > 1 + 1e-12 or r < 1 - 1e-12
M2PO_TOL = 1e-12
RS_LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class FrameworkParams:
    """The frameworks' knobs, named as in their configs."""

    clip_low: float = 0.2  # verl clip_ratio_low, TRL epsilon
    clip_high: float = 0.28  # verl clip_ratio_high, TRL epsilon_high (DAPO's 0.28; TRL's default is epsilon)
    dual_clip_c: float = 3.0  # verl clip_ratio_c (dual-clip PPO)
    is_cap: float = 3.0  # TRL vllm_importance_sampling_clip_max (default mode sequence_mask, clip_min None)
    rollout_is_threshold: float = 2.0  # verl algorithm.rollout_correction.rollout_is_threshold

    def __post_init__(self) -> None:
        for name, lo, hi in (("clip_low", 0.0, 1.0), ("clip_high", 0.0, math.inf), ("dual_clip_c", 1.0, math.inf),
                             ("is_cap", 0.0, math.inf), ("rollout_is_threshold", 0.0, math.inf)):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and lo < v < hi):
                raise ValueError(f"{name} must be a finite number in ({lo:g}, {hi:g}), got {v!r}")


def _verl_w(lr: np.ndarray) -> np.ndarray:
    """verl's ratio: exp(clamp(log r, -20, 20)) (rollout_corr_helper.py, SAFETY_BOUND)."""
    return np.exp(np.clip(lr, -SAFETY_BOUND, SAFETY_BOUND))


@dataclass
class FrameworkSums:
    """Mergeable token sums plus per-sequence sums: everything :func:`finish` needs.

    Token sums run over the valid tokens; the per-sequence arrays have one entry
    per sequence (row), empty rows included where the caller has them.
    """

    has_advantage: bool
    n: float = 0.0
    kl: float = 0.0  # sum (logp_behav - logp_current)             verl kl
    ppo_kl: float = 0.0  # sum -clamp(log r, -20, 20)              verl actor/ppo_kl
    w: float = 0.0  # sum w, w = exp(clamp(log r))                 verl rollout_is_mean (token)
    w_sq: float = 0.0  # sum w^2                                   verl chi2_token
    w_high: float = 0.0  # #{w > C}                                verl rollout_is_ratio_fraction_high (token)
    w_low: float = 0.0  # #{w < 1/C}
    wc: float = 0.0  # sum clamp(w, 1/C, C)                        verl rollout_is_std / eff_sample_size
    wc_sq: float = 0.0  # sum clamp(w, 1/C, C)^2
    lmax: float = -math.inf  # max log r                            verl rollout_is_max (token)
    lmin: float = math.inf
    absdiff: float = 0.0  # sum |log r|                            TRL sampling_logp_difference/mean
    absdiff_max: float = 0.0
    pg_clip: float = 0.0  # #{-A clip(r) > -A r}                   verl actor/pg_clipfrac
    pg_clip_lower: float = 0.0  # #{A < 0, max(..) > -A c}         verl actor/pg_clipfrac_lower
    trl_low: float = 0.0  # #{r < 1 - eps_low, A < 0}               TRL clip_ratio/low_mean
    trl_high: float = 0.0  # #{r > 1 + eps_high, A > 0}
    m2_sum: float = 0.0  # sum (log r)^2 over M2PO's trust-region tokens T
    m2_count: float = 0.0  # |T|
    # per sequence (n_seq,)
    seq_len: np.ndarray = field(default_factory=lambda: np.zeros(0))
    seq_lr: np.ndarray = field(default_factory=lambda: np.zeros(0))  # sum log r
    seq_cur: np.ndarray = field(default_factory=lambda: np.zeros(0))  # sum logp_current
    seq_behav: np.ndarray = field(default_factory=lambda: np.zeros(0))  # sum logp_behav
    seq_w: np.ndarray = field(default_factory=lambda: np.zeros(0))  # sum w (token-mode verl seq_mean_weights)
    seq_trl_low: np.ndarray = field(default_factory=lambda: np.zeros(0))  # TRL low-clipped tokens
    seq_trl_high: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def add_tokens(self, lr: np.ndarray, cur: np.ndarray, behav: np.ndarray, seq: np.ndarray, n_seq: int,
                   adv: np.ndarray | None, seq_adv_tok: np.ndarray | None, params: FrameworkParams) -> None:
        """Fold valid tokens: ``lr``, ``cur``, ``behav``, ``seq`` (n,) sequence index in [0, n_seq);
        ``adv`` (n,) the token's advantage, ``seq_adv_tok`` (n,) its sequence's advantage (M2PO)."""
        if self.seq_len.size < n_seq:
            grow = n_seq - self.seq_len.size
            for f in ("seq_len", "seq_lr", "seq_cur", "seq_behav", "seq_w", "seq_trl_low", "seq_trl_high"):
                setattr(self, f, np.concatenate([getattr(self, f), np.zeros(grow)]))
        if lr.size == 0:
            return
        C = params.rollout_is_threshold
        w = _verl_w(lr)
        wc = np.clip(w, 1.0 / C, C)
        absdiff = np.abs(lr)  # TRL: torch.abs(old_per_token_logps - sampling_per_token_logps)
        self.n += lr.size
        self.kl += float(np.sum(behav - cur))
        self.ppo_kl += float(np.sum(-np.clip(lr, -SAFETY_BOUND, SAFETY_BOUND)))
        self.w += float(w.sum())
        self.w_sq += float(np.sum(w * w))
        self.w_high += float(np.count_nonzero(w > C))
        self.w_low += float(np.count_nonzero(w < 1.0 / C))
        self.wc += float(wc.sum())
        self.wc_sq += float(np.sum(wc * wc))
        self.lmax = max(self.lmax, float(lr.max()))
        self.lmin = min(self.lmin, float(lr.min()))
        self.absdiff += float(absdiff.sum())
        self.absdiff_max = max(self.absdiff_max, float(absdiff.max()))

        def per_seq(values: np.ndarray | None) -> np.ndarray:
            return np.bincount(seq, weights=values, minlength=n_seq).astype(np.float64)

        self.seq_len[:n_seq] += per_seq(None)
        self.seq_lr[:n_seq] += per_seq(lr)
        self.seq_cur[:n_seq] += per_seq(cur)
        self.seq_behav[:n_seq] += per_seq(behav)
        self.seq_w[:n_seq] += per_seq(w)
        if adv is None:
            return
        # verl core_algos.py compute_policy_loss_vanilla (ratio clamped to [e^-20, e^20], so exp is safe)
        loss1 = -adv * w
        loss2 = -adv * np.clip(w, 1.0 - params.clip_low, 1.0 + params.clip_high)
        self.pg_clip += float(np.count_nonzero(loss2 > loss1))
        clip_loss1 = np.maximum(loss1, loss2)
        self.pg_clip_lower += float(np.count_nonzero((clip_loss1 > -adv * params.dual_clip_c) & (adv < 0)))
        # TRL grpo_trainer.py compute_loss: coef_1 = exp(log_ratio) (token level), compared in log space
        low = (lr < math.log1p(-params.clip_low)) & (adv < 0)
        high = (lr > math.log1p(params.clip_high)) & (adv > 0)
        self.trl_low += float(np.count_nonzero(low))
        self.trl_high += float(np.count_nonzero(high))
        self.seq_trl_low[:n_seq] += per_seq(low.astype(np.float64))
        self.seq_trl_high[:n_seq] += per_seq(high.astype(np.float64))
        # M2PO core_algos.py _get_trust_region_tokens_delta_sq: T = (A > 1e-12, r > 1 + 1e-12) or
        # (A < -1e-12, r < 1 - 1e-12), A = the sequence's advantage (advantages[:, 0] there)
        with np.errstate(over="ignore"):
            r = np.exp(lr)  # only compared: inf > 1 + 1e-12 is right
        a = adv if seq_adv_tok is None else seq_adv_tok
        trust = ((a > M2PO_TOL) & (r > 1.0 + M2PO_TOL)) | ((a < -M2PO_TOL) & (r < 1.0 - M2PO_TOL))
        self.m2_sum += float(np.sum(lr[trust] ** 2))
        self.m2_count += float(np.count_nonzero(trust))

    def fold(self, other: "FrameworkSums") -> None:
        """Add ``other`` (same sequences indexing) into ``self``."""
        for f in fields(self):
            name = f.name
            if name == "has_advantage":
                continue
            mine, theirs = getattr(self, name), getattr(other, name)
            if name in ("lmax", "absdiff_max"):
                setattr(self, name, max(mine, theirs))
            elif name == "lmin":
                setattr(self, name, min(mine, theirs))
            elif isinstance(mine, np.ndarray):
                size = max(mine.size, theirs.size)
                out = np.zeros(size)
                out[: mine.size] += mine
                out[: theirs.size] += theirs
                setattr(self, name, out)
            else:
                setattr(self, name, mine + theirs)


def _is_tail(n: float, sum_wc: float, sum_wc_sq: float, seq_mean_weights: np.ndarray, C: float) -> dict[str, float]:
    """compute_is_metrics after the level-specific part: std, eff_sample_size, the seq_* family."""
    out: dict[str, float] = {}
    mean_wc = sum_wc / (n + VERL_EPS)
    if n > 1:
        var = sum_wc_sq / (n + VERL_EPS) - mean_wc**2
        out["rollout_is_std"] = math.sqrt(max(var, 0.0))
    else:
        out["rollout_is_std"] = 0.0
    # 1 / masked_mean((wc / (mean wc + 1e-8))^2): the (1e-8-regularised) Kish fraction of clamp(w, 1/C, C)
    out["rollout_is_eff_sample_size"] = 1.0 / ((sum_wc_sq / (mean_wc + VERL_EPS) ** 2) / (n + VERL_EPS))
    s = seq_mean_weights
    out["rollout_is_seq_mean"] = float(s.mean())
    out["rollout_is_seq_std"] = float(s.std(ddof=1)) if s.size > 1 else 0.0  # torch .std(): unbiased
    out["rollout_is_seq_max"] = float(s.max())
    out["rollout_is_seq_min"] = float(s.min())
    out["rollout_is_seq_max_deviation"] = float(np.abs(s - 1.0).max())
    out["rollout_is_seq_fraction_high"] = float(np.mean(s > C))
    out["rollout_is_seq_fraction_low"] = float(np.mean(s < 1.0 / C))
    return out


def rollout_is_metrics(sums: FrameworkSums, params: FrameworkParams, rollout_is: str = "token") -> dict[str, float]:
    """verl's ``rollout_corr/rollout_is_*`` metrics at aggregation level ``rollout_is`` (token or sequence)."""
    if rollout_is not in RS_LEVELS:
        raise ValueError(f"rollout_is must be token or sequence, got {rollout_is!r}")
    C, n = params.rollout_is_threshold, sums.n
    if rollout_is == "sequence":
        # compute_rollout_correction_weights: w = exp(clamp(sum log r, -20, 20)) broadcast over the row;
        # compute_is_metrics' sequence branch takes max / min / fractions over the (B, 1) sums (all rows)
        L, slr = sums.seq_len, sums.seq_lr
        w_seq = _verl_w(slr)
        wc = np.clip(w_seq, 1.0 / C, C)
        out = {"rollout_is_max": math.exp(min(float(slr.max()), SAFETY_BOUND)),
               "rollout_is_min": math.exp(float(slr.min())),
               "rollout_is_mean": float(np.sum(L * w_seq)) / (n + VERL_EPS),
               "rollout_is_ratio_fraction_high": float(np.mean(slr > math.log(C))),
               "rollout_is_ratio_fraction_low": float(np.mean(slr < math.log(1.0 / C)))}
        out.update(_is_tail(n, float(np.sum(L * wc)), float(np.sum(L * wc * wc)), L * w_seq / (L + VERL_EPS), C))
    else:
        # token mode: compute_is_metrics on w = exp(clamp(log r)) before truncation
        out = {"rollout_is_mean": sums.w / (n + VERL_EPS),
               "rollout_is_ratio_fraction_high": sums.w_high / (n + VERL_EPS),
               "rollout_is_ratio_fraction_low": sums.w_low / (n + VERL_EPS),
               "rollout_is_max": float(_verl_w(np.array(sums.lmax))),
               "rollout_is_min": float(_verl_w(np.array(sums.lmin)))}
        out.update(_is_tail(n, sums.wc, sums.wc_sq, sums.seq_w / (sums.seq_len + VERL_EPS), C))
    order = ("rollout_is_mean", "rollout_is_max", "rollout_is_min", "rollout_is_ratio_fraction_high",
             "rollout_is_ratio_fraction_low", "rollout_is_std", "rollout_is_eff_sample_size", "rollout_is_seq_mean",
             "rollout_is_seq_std", "rollout_is_seq_max", "rollout_is_seq_min", "rollout_is_seq_max_deviation",
             "rollout_is_seq_fraction_high", "rollout_is_seq_fraction_low")
    return {f"rollout_corr/{k}": out[k] for k in order}


def finish(sums: FrameworkSums, params: FrameworkParams, rollout_is: str = "token") -> dict[str, float]:
    """The metrics dict from the sums (the frameworks' own keys; see the module docstring)."""
    n = sums.n
    out: dict[str, float] = {}
    L = sums.seq_len
    # verl rollout_corr_helper.py compute_offpolicy_metrics (old_log_prob = current, rollout_log_prob = behav)
    mean_cur = sums.seq_cur / (L + VERL_EPS)  # masked_mean(old_log_prob, response_mask, axis=-1)
    mean_behav = sums.seq_behav / (L + VERL_EPS)
    log_ppl_diff = mean_behav - mean_cur
    with np.errstate(over="ignore"):  # a per-sequence mean log-prob below -709 is a perplexity beyond float
        out["rollout_corr/training_ppl"] = float(np.exp(-mean_cur).mean())
        out["rollout_corr/training_log_ppl"] = float((-mean_cur).mean())
        out["rollout_corr/kl"] = sums.kl / (n + VERL_EPS)
        out["rollout_corr/rollout_ppl"] = float(np.exp(-mean_behav).mean())
        out["rollout_corr/rollout_log_ppl"] = float((-mean_behav).mean())
        out["rollout_corr/log_ppl_diff"] = float(log_ppl_diff.mean())
        out["rollout_corr/log_ppl_abs_diff"] = float(np.abs(log_ppl_diff).mean())
        out["rollout_corr/log_ppl_diff_max"] = float(log_ppl_diff.max())
        out["rollout_corr/log_ppl_diff_min"] = float(log_ppl_diff.min())
        out["rollout_corr/ppl_ratio"] = float(np.exp(log_ppl_diff).mean())
    out["rollout_corr/chi2_token"] = sums.w_sq / (n + VERL_EPS) - 1.0
    out["rollout_corr/chi2_seq"] = float(np.mean(_verl_w(sums.seq_lr) ** 2)) - 1.0
    out.update(rollout_is_metrics(sums, params, rollout_is))
    # verl core_algos.py compute_policy_loss_vanilla
    out["actor/ppo_kl"] = sums.ppo_kl / (n + VERL_EPS)
    if sums.has_advantage:
        out["actor/pg_clipfrac"] = sums.pg_clip / (n + VERL_EPS)
        out["actor/pg_clipfrac_lower"] = sums.pg_clip_lower / (n + VERL_EPS)
    # TRL grpo_trainer.py _generate_and_score_completions: |old - sampling| over the mask
    out["sampling/sampling_logp_difference/mean"] = sums.absdiff / n if n else 0.0
    out["sampling/sampling_logp_difference/max"] = sums.absdiff_max
    # default vllm_importance_sampling_mode="sequence_mask": R = exp(sum log r) per row, R > C_max -> 0;
    # min / mean / max over all rows (flatten of a (B, 1) tensor); R <= C_max where kept, so exp is safe
    kept = sums.seq_lr <= math.log(params.is_cap)
    R = np.where(kept, np.exp(np.minimum(sums.seq_lr, math.log(params.is_cap))), 0.0)
    out["sampling/importance_sampling_ratio/min"] = float(R.min()) if R.size else 0.0
    out["sampling/importance_sampling_ratio/mean"] = float(R.mean()) if R.size else 0.0
    out["sampling/importance_sampling_ratio/max"] = float(R.max()) if R.size else 0.0
    if sums.has_advantage:
        # TRL grpo_trainer.py compute_loss (importance_sampling_level="token"): global_masked_mean and
        # nanmin / nanmax of masked_seq_mean over the rows
        denom = max(n, 1.0)
        out["clip_ratio/low_mean"] = sums.trl_low / denom
        out["clip_ratio/high_mean"] = sums.trl_high / denom
        out["clip_ratio/region_mean"] = (sums.trl_low + sums.trl_high) / denom
        with np.errstate(invalid="ignore", divide="ignore"):
            low_seq = sums.seq_trl_low / L
            high_seq = sums.seq_trl_high / L
        out["clip_ratio/low_min"] = float(np.nanmin(low_seq)) if np.any(L > 0) else math.nan
        out["clip_ratio/high_max"] = float(np.nanmax(high_seq)) if np.any(L > 0) else math.nan
        # M2PO core_algos.py kpo_clip_harmful_tokens: M2_now = mean delta^2 over T, 0.0 when T is empty
        out["m2po/M2"] = sums.m2_sum / sums.m2_count if sums.m2_count else 0.0
    return out


def _as_rows(x: np.ndarray | None, shape: tuple[int, int], name: str) -> np.ndarray | None:
    if x is None:
        return None
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1 and a.shape[0] == shape[0]:
        return np.broadcast_to(a[:, None], shape)
    if a.shape == (shape[0], 1):
        return np.broadcast_to(a, shape)
    if a.shape != shape:
        raise ValueError(f"{name} must have shape (rows,), (rows, 1) or {shape}, got {a.shape}")
    return a


def batch_sums(logp_behav, logp_current, mask, advantages=None, params: FrameworkParams | None = None
               ) -> FrameworkSums:
    """:class:`FrameworkSums` of one padded batch (each row one sequence, empty rows kept)."""
    params = params or FrameworkParams()
    behav = np.asarray(logp_behav, dtype=np.float64)
    cur = np.asarray(logp_current, dtype=np.float64)
    if behav.ndim != 2 or cur.shape != behav.shape:
        raise ValueError(f"logp_behav and logp_current must be (rows, tokens) of one shape, got {behav.shape} "
                         f"and {cur.shape}")
    m = np.asarray(mask).astype(bool)
    if m.shape != behav.shape:
        raise ValueError(f"mask must have shape {behav.shape}, got {m.shape}")
    adv = _as_rows(advantages, behav.shape, "advantages")
    rows = behav.shape[0]
    seq = np.broadcast_to(np.arange(rows)[:, None], behav.shape)[m]
    b, c = behav[m], cur[m]
    lr = c - b
    sums = FrameworkSums(has_advantage=adv is not None)
    seq_adv_tok = None
    if adv is not None:
        # a sequence's advantage = its first valid token's (M2PO reads advantages[:, 0]: the same for
        # right-padded rows, where the response starts at column 0)
        first = np.argmax(m, axis=1)
        seq_adv = adv[np.arange(rows), first]
        seq_adv_tok = seq_adv[seq]
    sums.add_tokens(lr, c, b, seq, rows, None if adv is None else adv[m], seq_adv_tok, params)
    return sums


def framework_statistics(logp_behav, logp_current, mask, advantages=None, *, clip_low: float = 0.2,
                         clip_high: float = 0.28, dual_clip_c: float = 3.0, is_cap: float = 3.0,
                         rollout_is_threshold: float = 2.0, rollout_is: str = "token") -> dict[str, float]:
    """TRL's, verl's and M2PO's logged off-policy metrics for one padded batch, under their own keys.

    ``logp_behav``, ``logp_current``: (rows, tokens) log-probs of the sampling and the
    trained policy; ``mask`` (rows, tokens) 0/1; ``advantages`` (rows,), (rows, 1) or
    (rows, tokens), or None (then the advantage-dependent keys are left out).
    ``clip_low`` / ``clip_high``: the PPO clip (verl clip_ratio_low/high, TRL
    epsilon/epsilon_high); ``dual_clip_c``: verl clip_ratio_c; ``is_cap``: TRL's
    vllm_importance_sampling_clip_max in its default ``sequence_mask`` mode;
    ``rollout_is_threshold`` / ``rollout_is``: verl's rollout correction threshold and level.
    Returns plain floats keyed ``rollout_corr/...``, ``actor/...``, ``sampling/...``,
    ``clip_ratio/...``, ``m2po/M2`` (see the module docstring for each source).
    """
    params = FrameworkParams(clip_low=clip_low, clip_high=clip_high, dual_clip_c=dual_clip_c, is_cap=is_cap,
                             rollout_is_threshold=rollout_is_threshold)
    if rollout_is not in RS_LEVELS:
        raise ValueError(f"rollout_is must be token or sequence, got {rollout_is!r}")
    sums = batch_sums(logp_behav, logp_current, mask, advantages, params)
    if sums.n == 0:
        raise ValueError("mask selects no token")
    return finish(sums, params, rollout_is)


def gspo_sequence_log_ratio(seq_lr: np.ndarray, seq_len: np.ndarray) -> np.ndarray:
    """GSPO's geometric-mean sequence log-ratio: sum log r / max(|y|, 1).

    TRL grpo_trainer.py compute_loss, importance_sampling_level="sequence":
    (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0); verl core_algos.py
    compute_policy_loss_gspo likewise (clamp(min=1)).
    """
    return np.asarray(seq_lr, dtype=np.float64) / np.maximum(np.asarray(seq_len, dtype=np.float64), 1.0)

"""The off-policy statistics TRL, verl and M2PO users already read in their logs, under the frameworks' own names.

Each statistic is a transcription of the code that logs it (the file and function are named next to its formula
below), over one batch of padded arrays ``(rows, tokens)`` with a 0/1 ``mask``.  Roles: ``logp_behav`` is the
policy that sampled the tokens (verl ``rollout_log_probs``, TRL ``sampling_per_token_logps``, M2PO
``old_log_prob``), ``logp_current`` the policy being trained (verl ``old_log_probs`` / ``log_prob``, TRL
``old_per_token_logps`` / ``per_token_logps``), and log r = logp_current - logp_behav throughout.  Only numpy;
:func:`framework_statistics` (the TRL trainer) and :class:`FrameworkSums` (``diagnose``, streamed) both end in
:func:`finish`, so a streamed log and the same log as one batch give the same numbers.

Conventions copied from the code (they matter at the 1e-8 level and for which average is meant):

* verl's ``masked_mean`` divides by ``mask.sum() + 1e-8`` (verl/utils/torch_functional.py); per-sequence means
  (``axis=-1``) likewise, and a batch mean of per-sequence values runs over ALL rows, empty ones included.
* verl exponentiates log-ratios only after clamping them to [-20, 20] (``SAFETY_BOUND``, rollout_corr_helper.py;
  core_algos.py ``compute_policy_loss_vanilla``).
* TRL's per-sequence quantities are means over ALL rows; ``clip_ratio/low_min`` and ``high_max`` take ``nanmin`` /
  ``nanmax`` over per-sequence token means (an empty row gives 0/0 = NaN and is skipped).

Not a transcription: comparisons of a ratio with a threshold are made on log r (``lr > log c`` for
``exp(lr) > c``) where the ratio may overflow; they differ from the frameworks' float32 ``exp`` only for a ratio
within an ulp of the threshold.  Sequence log-ratios are summed, never exponentiated unbounded, so |log R| = 4096
gives finite numbers.  ``rollout_corr/k3_kl`` is left out: verl computes it without the clamp (so it is inf where
r overflows); ``diagnose``'s ``kl_k3`` is the same quantity.

Two ESS-like numbers, not to be confused (docs/DIAGNOSE.md, 'A worked example'): verl's
``rollout_corr/rollout_is_eff_sample_size`` is the Kish fraction of r clamped to [1/C, C] (after [e^-20, e^20]), not
the Kish ESS of the weights verl trains with (min(w, C): the ``tis`` what-if row) nor ``diagnose``'s ``ess_frac``
(Kish of raw r); TRL computes no ESS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checks import require_open_interval
from ..core.losses import clip_log_bounds, gspo_sequence_log_ratio, m2po_trust_set, ppo_clip_flags
from .accumulators import Running

__all__ = ["FrameworkParams", "FrameworkSums", "framework_statistics", "batch_sums", "finish", "rollout_is_metrics",
           "sequence_quantities", "gspo_sequence_log_ratio"]

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
            require_open_interval(name, getattr(self, name), lo, hi, finite=True)


def _verl_w(lr: np.ndarray) -> np.ndarray:
    """verl's ratio: exp(clamp(log r, -20, 20)) (rollout_corr_helper.py, SAFETY_BOUND)."""
    return np.exp(np.clip(lr, -SAFETY_BOUND, SAFETY_BOUND))


#: rows of :func:`sequence_quantities` that are logs of verl's perplexities and ppl_ratio (their means of e^x)
EXP_OF = ("training_log_ppl", "rollout_log_ppl", "log_ppl_diff")
#: per-sequence sums a run of tokens contributes (:meth:`FrameworkSums.add_tokens`), in this order
SEQ_FIELDS = ("seq_len", "seq_lr", "seq_cur", "seq_behav", "seq_w", "seq_trl_low", "seq_trl_high")


def sequence_quantities(seq: dict[str, np.ndarray], params: FrameworkParams) -> dict[str, np.ndarray]:
    """The per-sequence values (n_seq,) whose means, extremes and spread :func:`finish` reports, from the
    per-sequence sums ``seq`` (``SEQ_FIELDS``); streamed through :class:`Running` so no array is kept."""
    L, slr = seq["seq_len"], seq["seq_lr"]
    C = params.rollout_is_threshold
    mean_cur = seq["seq_cur"] / (L + VERL_EPS)  # masked_mean(old_log_prob, response_mask, axis=-1)
    mean_behav = seq["seq_behav"] / (L + VERL_EPS)
    log_ppl_diff = mean_behav - mean_cur
    w_seq = _verl_w(slr)  # sequence-mode rollout IS: exp(clamp(sum log r, -20, 20)) over the row
    wc_seq = np.clip(w_seq, 1.0 / C, C)
    is_weights = seq["seq_w"] / (L + VERL_EPS)  # token mode's seq_mean_weights
    seq_weights = L * w_seq / (L + VERL_EPS)  # sequence mode's
    # TRL's default sequence_mask: R = exp(sum log r), R > C_max -> 0; R <= C_max where kept, so exp is safe
    kept = slr <= math.log(params.is_cap)
    # the perplexities exp(-mean log p) and ppl_ratio exp(log_ppl_diff) overflow past e^709: they are streamed as
    # their logs (the rows of EXP_OF), whose means of e^x Running keeps in log space
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return {
            "training_log_ppl": -mean_cur, "rollout_log_ppl": -mean_behav,
            "log_ppl_diff": log_ppl_diff, "log_ppl_abs_diff": np.abs(log_ppl_diff),
            "chi2_seq": w_seq**2,
            "trl_is_ratio": np.where(kept, np.exp(np.minimum(slr, math.log(params.is_cap))), 0.0),
            "trl_low": seq["seq_trl_low"] / L, "trl_high": seq["seq_trl_high"] / L,  # 0/0 = NaN: nanmin skips
            "is_weights": is_weights, "is_weights_high": (is_weights > C) * 1.0,
            "is_weights_low": (is_weights < 1.0 / C) * 1.0,
            "seq_lr": slr, "seq_lr_high": (slr > math.log(C)) * 1.0, "seq_lr_low": (slr < math.log(1.0 / C)) * 1.0,
            "seq_Lw": L * w_seq, "seq_Lwc": L * wc_seq, "seq_Lwc_sq": L * wc_seq * wc_seq,
            "seq_weights": seq_weights, "seq_weights_high": (seq_weights > C) * 1.0,
            "seq_weights_low": (seq_weights < 1.0 / C) * 1.0,
        }


@dataclass
class FrameworkSums:
    """Mergeable token sums plus streamed per-sequence summaries: everything :func:`finish` needs.

    Token sums run over the valid tokens; ``seq`` summarises the per-sequence values of :func:`sequence_quantities`
    over every sequence (row) given to :meth:`add_sequences`, empty rows included where the caller has them.
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
    seq: Running | None = None  # summaries of sequence_quantities(...), one row per name

    def add_tokens(self, lr: np.ndarray, cur: np.ndarray, behav: np.ndarray, starts: np.ndarray,
                   adv: np.ndarray | None, seq_adv_tok: np.ndarray | None, params: FrameworkParams,
                   ratio: np.ndarray | None = None, moments=None) -> dict[str, np.ndarray]:
        """Fold valid tokens ``lr``, ``cur``, ``behav`` (n,), ``adv`` (n,) the token's advantage and
        ``seq_adv_tok`` (n,) its sequence's (M2PO); return the ``SEQ_FIELDS`` sums (R,) of the runs of tokens
        starting at ``starts`` (R,) (a run lies in one sequence; the caller adds runs up to sequences).
        ``ratio`` (n,) = np.exp(lr) and ``moments`` (the runs' ``Moments``) if the caller has them: same numbers."""
        C = params.rollout_is_threshold
        top, low = (float(lr.max()), float(lr.min())) if moments is None else \
            (float(moments.lmax.max()), float(moments.lmin.min()))  # the runs' extremes are the chunk's
        inside = -SAFETY_BOUND <= low and top <= SAFETY_BOUND  # the usual case: the clamp changes nothing
        clamped = lr if inside else np.clip(lr, -SAFETY_BOUND, SAFETY_BOUND)
        # verl's ratio (rollout_corr_helper.py, SAFETY_BOUND)
        w = ratio if inside and ratio is not None else np.exp(clamped)
        w_high, w_low = np.count_nonzero(w > C), np.count_nonzero(w < 1.0 / C)
        wc = np.clip(w, 1.0 / C, C) if w_high or w_low else w  # clamp(w, 1/C, C) is w when nothing is outside
        self.n += lr.size
        lr_sum = float(np.sum(lr))
        self.kl -= lr_sum  # sum (behav - cur): IEEE subtraction is antisymmetric, so this is -sum lr exactly
        self.ppo_kl -= lr_sum if inside else float(np.sum(clamped))
        w_sum, w_sq = float(w.sum()), float(np.sum(w * w))
        self.w += w_sum
        self.w_sq += w_sq
        self.w_high += float(w_high)
        self.w_low += float(w_low)
        self.wc += float(wc.sum()) if wc is not w else w_sum
        self.wc_sq += float(np.sum(wc * wc)) if wc is not w else w_sq
        self.lmax, self.lmin = max(self.lmax, top), min(self.lmin, low)
        self.absdiff += float(np.sum(np.abs(lr)))  # TRL: torch.abs(old_per_token_logps - sampling_per_token_logps)
        self.absdiff_max = max(self.absdiff_max, top, -low)

        def per_run(values: np.ndarray) -> np.ndarray:
            return np.add.reduceat(values, starts)

        if moments is None:
            seq_len, seq_lr = np.diff(np.append(starts, lr.size)).astype(np.float64), per_run(lr)
        else:  # the same reduceat, taken once
            seq_len, seq_lr = moments.n, moments.s1
        runs = {"seq_len": seq_len, "seq_lr": seq_lr, "seq_cur": per_run(cur), "seq_behav": per_run(behav),
                "seq_w": per_run(w)}
        if adv is None:
            return runs
        # verl core_algos.py compute_policy_loss_vanilla (ratio clamped to [e^-20, e^20], so exp is safe), on the
        # few tokens it can count: where lo_w <= w <= hi_w, clip(w) = w and loss2 == loss1; and as fl(-A x) is
        # monotone in x, max(loss1, loss2) > -A c needs max(w, lo_w) > c, i.e. w > c (lo_w < 1 < c)
        lo_w, hi_w, c = 1.0 - params.clip_low, 1.0 + params.clip_high, params.dual_clip_c
        some = np.flatnonzero((w < lo_w) | (w > min(hi_w, c)))
        neg_adv, w_some = -adv[some], w[some]
        loss1 = neg_adv * w_some
        loss2 = neg_adv * np.clip(w_some, lo_w, hi_w)
        self.pg_clip += float(np.count_nonzero(loss2 > loss1))
        clip_loss1 = np.maximum(loss1, loss2)
        self.pg_clip_lower += float(np.count_nonzero((clip_loss1 > neg_adv * c) & (neg_adv > 0)))
        # TRL grpo_trainer.py compute_loss: coef_1 = exp(log_ratio) (token level), compared in log space; the
        # clipped tokens are found first and counted per run: O(R log k) for k of them, whatever k
        bounds = np.append(starts, lr.size)  # (R + 1,)
        # the losses' clip test on both sides; the advantage's sign is checked on the few flagged tokens only
        low_side, high_side = ppo_clip_flags(lr, *clip_log_bounds(params.clip_low, params.clip_high))
        for key, side, sign in (("trl_low", low_side, -1.0), ("trl_high", high_side, 1.0)):
            at = np.flatnonzero(side)
            at = at[adv[at] * sign > 0]  # (k,) A < 0 below the clip, A > 0 above it
            setattr(self, key, getattr(self, key) + at.size)
            runs["seq_" + key] = np.diff(np.searchsorted(at, bounds)).astype(np.float64)  # (R,) per run
        # M2PO core_algos.py _get_trust_region_tokens_delta_sq: T = (A > 1e-12, r > 1 + 1e-12) or
        # (A < -1e-12, r < 1 - 1e-12), A = the sequence's advantage (advantages[:, 0] there): the losses' trust set
        # at the reference code's tolerance, compared in log space (r is never formed)
        a = adv if seq_adv_tok is None else seq_adv_tok
        trust = m2po_trust_set(lr, a, M2PO_TOL)
        self.m2_sum += float(np.sum(lr * lr * trust))
        self.m2_count += float(np.count_nonzero(trust))
        return runs

    def add_sequences(self, seq: dict[str, np.ndarray], params: FrameworkParams) -> None:
        """Fold whole sequences: ``seq`` maps ``SEQ_FIELDS`` to (k,) sums (the TRL fields may be absent)."""
        full = {f: seq.get(f, np.zeros_like(seq["seq_len"])) for f in SEQ_FIELDS}
        values = sequence_quantities(full, params)
        if self.seq is None:
            self.seq = Running(tuple(values), exp_of=EXP_OF)
        self.seq.update(np.stack(list(values.values())))

    @property
    def n_seq(self) -> int:
        return self.seq.n if self.seq is not None else 0

    @property
    def sequences(self) -> Running:
        """``seq``, which :func:`finish` and :func:`rollout_is_metrics` read: none before :meth:`add_sequences`."""
        if self.seq is None:
            raise ValueError("no sequence folded: call add_sequences before finish or rollout_is_metrics")
        return self.seq


def _is_tail(n: float, sum_wc: float, sum_wc_sq: float, sums: FrameworkSums, prefix: str, C: float
             ) -> dict[str, float]:
    """compute_is_metrics after the level-specific part: std, eff_sample_size, the seq_* family."""
    out: dict[str, float] = {}
    mean_wc = sum_wc / (n + VERL_EPS)
    out["rollout_is_std"] = math.sqrt(max(sum_wc_sq / (n + VERL_EPS) - mean_wc**2, 0.0)) if n > 1 else 0.0
    # 1 / masked_mean((wc / (mean wc + 1e-8))^2): the (1e-8-regularised) Kish fraction of clamp(w, 1/C, C)
    out["rollout_is_eff_sample_size"] = 1.0 / ((sum_wc_sq / (mean_wc + VERL_EPS) ** 2) / (n + VERL_EPS))
    q = sums.sequences
    s = q[prefix]
    out["rollout_is_seq_mean"] = s.total / s.n
    out["rollout_is_seq_std"] = s.std  # torch .std(): unbiased
    out["rollout_is_seq_max"] = s.high
    out["rollout_is_seq_min"] = s.low
    out["rollout_is_seq_max_deviation"] = max(s.high - 1.0, 1.0 - s.low)  # max |s - 1|
    out["rollout_is_seq_fraction_high"] = q[prefix + "_high"].total / s.n
    out["rollout_is_seq_fraction_low"] = q[prefix + "_low"].total / s.n
    return out


def rollout_is_metrics(sums: FrameworkSums, params: FrameworkParams, rollout_is: str = "token") -> dict[str, float]:
    """verl's ``rollout_corr/rollout_is_*`` metrics at aggregation level ``rollout_is`` (token or sequence)."""
    if rollout_is not in RS_LEVELS:
        raise ValueError(f"rollout_is must be token or sequence, got {rollout_is!r}")
    C, n, q = params.rollout_is_threshold, sums.n, sums.sequences
    if rollout_is == "sequence":
        # compute_rollout_correction_weights: w = exp(clamp(sum log r, -20, 20)) broadcast over the row;
        # compute_is_metrics' sequence branch takes max / min / fractions over the (B, 1) sums (all rows)
        slr = q["seq_lr"]
        out = {"rollout_is_max": math.exp(min(slr.high, SAFETY_BOUND)),
               "rollout_is_min": math.exp(slr.low),
               "rollout_is_mean": q["seq_Lw"].total / (n + VERL_EPS),
               "rollout_is_ratio_fraction_high": q["seq_lr_high"].total / slr.n,
               "rollout_is_ratio_fraction_low": q["seq_lr_low"].total / slr.n}
        out.update(_is_tail(n, q["seq_Lwc"].total, q["seq_Lwc_sq"].total, sums, "seq_weights", C))
    else:
        # token mode: compute_is_metrics on w = exp(clamp(log r)) before truncation
        out = {"rollout_is_mean": sums.w / (n + VERL_EPS),
               "rollout_is_ratio_fraction_high": sums.w_high / (n + VERL_EPS),
               "rollout_is_ratio_fraction_low": sums.w_low / (n + VERL_EPS),
               "rollout_is_max": float(_verl_w(np.array(sums.lmax))),
               "rollout_is_min": float(_verl_w(np.array(sums.lmin)))}
        out.update(_is_tail(n, sums.wc, sums.wc_sq, sums, "is_weights", C))
    order = ("rollout_is_mean", "rollout_is_max", "rollout_is_min", "rollout_is_ratio_fraction_high",
             "rollout_is_ratio_fraction_low", "rollout_is_std", "rollout_is_eff_sample_size", "rollout_is_seq_mean",
             "rollout_is_seq_std", "rollout_is_seq_max", "rollout_is_seq_min", "rollout_is_seq_max_deviation",
             "rollout_is_seq_fraction_high", "rollout_is_seq_fraction_low")
    return {f"rollout_corr/{k}": out[k] for k in order}


def finish(sums: FrameworkSums, params: FrameworkParams, rollout_is: str = "token") -> dict[str, float]:
    """The metrics dict from the sums (the frameworks' own keys; see the module docstring)."""
    n, q = sums.n, sums.sequences
    n_seq = sums.n_seq
    out: dict[str, float] = {}
    # verl rollout_corr_helper.py compute_offpolicy_metrics (old_log_prob = current, rollout_log_prob = behav):
    # batch means over the rows of per-row masked means; the perplexities are means of e^{log ppl} (inf past 1.8e308)
    out["rollout_corr/training_ppl"] = q["training_log_ppl"].mean_exp
    out["rollout_corr/training_log_ppl"] = q["training_log_ppl"].total / n_seq
    out["rollout_corr/kl"] = sums.kl / (n + VERL_EPS)
    out["rollout_corr/rollout_ppl"] = q["rollout_log_ppl"].mean_exp
    for key in ("rollout_log_ppl", "log_ppl_diff", "log_ppl_abs_diff"):
        out[f"rollout_corr/{key}"] = q[key].total / n_seq
    out["rollout_corr/log_ppl_diff_max"] = q["log_ppl_diff"].high
    out["rollout_corr/log_ppl_diff_min"] = q["log_ppl_diff"].low
    out["rollout_corr/ppl_ratio"] = q["log_ppl_diff"].mean_exp
    out["rollout_corr/chi2_token"] = sums.w_sq / (n + VERL_EPS) - 1.0
    out["rollout_corr/chi2_seq"] = q["chi2_seq"].total / n_seq - 1.0
    out.update(rollout_is_metrics(sums, params, rollout_is))
    # verl core_algos.py compute_policy_loss_vanilla
    out["actor/ppo_kl"] = sums.ppo_kl / (n + VERL_EPS)
    if sums.has_advantage:
        out["actor/pg_clipfrac"] = sums.pg_clip / (n + VERL_EPS)
        out["actor/pg_clipfrac_lower"] = sums.pg_clip_lower / (n + VERL_EPS)
    # TRL grpo_trainer.py _generate_and_score_completions: |old - sampling| over the mask
    out["sampling/sampling_logp_difference/mean"] = sums.absdiff / n if n else 0.0
    out["sampling/sampling_logp_difference/max"] = sums.absdiff_max
    # default vllm_importance_sampling_mode="sequence_mask": min / mean / max over all rows
    ratio = q["trl_is_ratio"]
    out["sampling/importance_sampling_ratio/min"] = ratio.low if n_seq else 0.0
    out["sampling/importance_sampling_ratio/mean"] = ratio.total / n_seq if n_seq else 0.0
    out["sampling/importance_sampling_ratio/max"] = ratio.high if n_seq else 0.0
    if sums.has_advantage:
        # TRL grpo_trainer.py compute_loss (importance_sampling_level="token"): global_masked_mean and
        # nanmin / nanmax of masked_seq_mean over the rows
        denom = max(n, 1.0)
        out["clip_ratio/low_mean"] = sums.trl_low / denom
        out["clip_ratio/high_mean"] = sums.trl_high / denom
        out["clip_ratio/region_mean"] = (sums.trl_low + sums.trl_high) / denom
        low, high = q["trl_low"].low, q["trl_high"].high
        out["clip_ratio/low_min"] = low if math.isfinite(low) else math.nan  # every row empty: NaN
        out["clip_ratio/high_max"] = high if math.isfinite(high) else math.nan
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
        seq_adv_tok = adv[np.arange(rows), np.argmax(m, axis=1)][seq]
    lengths = m.sum(axis=1)  # (rows,) every row's tokens are one run of the flattened valid tokens
    full = lengths > 0
    starts = (np.cumsum(lengths) - lengths)[full]
    runs = sums.add_tokens(lr, c, b, starts, None if adv is None else adv[m], seq_adv_tok, params) if lr.size else {}
    per_row = {}
    for name, values in runs.items():  # empty rows are rows too (verl's batch means run over all of them)
        per_row[name] = np.zeros(rows)
        per_row[name][full] = values
    sums.add_sequences(per_row or {"seq_len": np.zeros(rows)}, params)
    return sums


def framework_statistics(logp_behav, logp_current, mask, advantages=None, *, clip_low: float = 0.2,
                         clip_high: float = 0.28, dual_clip_c: float = 3.0, is_cap: float = 3.0,
                         rollout_is_threshold: float = 2.0, rollout_is: str = "token") -> dict[str, float]:
    """TRL's, verl's and M2PO's logged off-policy metrics for one padded batch, under their own keys.

    ``logp_behav``, ``logp_current``: (rows, tokens) log-probs of the sampling and the trained policy; ``mask``
    (rows, tokens) 0/1; ``advantages`` (rows,), (rows, 1) or (rows, tokens), or None (then the advantage-dependent
    keys are left out).  ``clip_low`` / ``clip_high``: the PPO clip (verl clip_ratio_low/high, TRL
    epsilon/epsilon_high); ``dual_clip_c``: verl clip_ratio_c; ``is_cap``: TRL's vllm_importance_sampling_clip_max in
    its default ``sequence_mask`` mode; ``rollout_is_threshold`` / ``rollout_is``: verl's rollout correction
    threshold and level.  Returns plain floats keyed ``rollout_corr/...``, ``actor/...``, ``sampling/...``,
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


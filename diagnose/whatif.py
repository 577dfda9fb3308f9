"""What-if: the same logged tokens under other off-policy corrections.

Each correction turns the logged ratio r = pi_current / pi_behav into an effective weight w (0 for a token that no
longer carries gradient), reported over ALL tokens (or sequences): ``flagged_frac`` (share clipped, truncated or
masked; ``ppo_clip`` rows with advantages equal TRL's ``clip_ratio/region_mean`` and verl's ``actor/pg_clipfrac``),
``ess_frac`` (Kish ESS of w, a dropped token as w = 0) and ``bias_proxy`` = mean(r - w), the IS mass removed
(E[(r - c)_+] for truncation at c, Replay-RLOO Sec. 3.2).  Corrections (FreshPER, M2PO, docs/REFERENCES.md):

=======================  ==========================================================================================
``ppo_clip`` eps         PPO / GRPO clip: a token with A > 0 and r > 1 + eps or A < 0 and r < 1 - eps gets no
                         gradient (w = 0). Without advantages both sides count (the worst case).
``tis`` c                truncated IS, w = min(r, c) (token) or min(R_seq, c).
``mask`` c               rejection / icepop-style mask: w = 0 when r (token) or R_seq (sequence) is outside [1/c, c].
``m2po`` tau_M2          M2PO masking (Algorithm 1 and the reference-code variant, labelled), per block of
                         ``m2po_batch_tokens`` consecutive tokens as the reference code applies it per micro-batch.
                         Needs advantages (the candidate set depends on their sign).
``freshper`` tau         FreshPER age decay w = r e^{-age/tau} (Eq. 13). Needs ages; from the per-age sums.
``ppo_clip_asym`` lo,hi  asymmetric PPO clip as one correction (DAPO's 0.2 / 0.28; verl clip_ratio_low/high, TRL
                         epsilon/epsilon_high): A > 0 and r > 1 + hi, or A < 0 and r < 1 - lo, gets w = 0.
``trl_is_mask`` C        TRL's default vLLM importance sampling (vllm_importance_sampling_mode="sequence_mask",
                         clip_max 3, clip_min None; grpo_trainer.py _generate_and_score_completions): one-sided, a
                         sequence with R_seq > C gets w = 0, else w = R_seq.
``gspo`` lo,hi           GSPO: the geometric-mean sequence ratio s = exp(sum log r / |y|) clipped to [1 - lo, 1 + hi]
                         as TRL's importance_sampling_level="sequence" (compute_loss): a sequence with A > 0 and
                         s > 1 + hi, or A < 0 and s < 1 - lo, gets w = 0, else w = s (the paper's eps 3e-4 / 4e-4;
                         A = the sequence's first token's advantage; both sides without advantages).
``m2_trust_region``      not a correction: M2 = mean (log r)^2 over M2PO's trust-region tokens T ((A > 0, r > 1) or
                         (A < 0, r < 1)), what M2PO thresholds at tau_M2 and logs as ``m2po/M2``; flagged = |T| / n.
=======================  ==========================================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..checks import require_integer
from ..core.losses import clip_log_bounds, gspo_sequence_log_ratio, m2po_masks, m2po_may_bind, ppo_clip_flags
from ..theory.group_replay import clipping_bias_proxy
from ..theory.moments import ess_frac_from_log_sums
from .accumulators import Moments, WeightSums
from .errors import ConfigError, check_field

M2PO_VARIANTS = ("algorithm1", "reference")
EXP_MAX = 709.78  # math.exp overflows above


@dataclass(frozen=True)
class WhatIfConfig:
    """The corrections to replay over the log, each with its parameter values."""

    ppo_clip: tuple[float, ...] = (0.2, 0.28)
    """What-if PPO clip eps values, each strictly between 0 and 1."""
    tis: tuple[float, ...] = (2.0, 5.0)
    """What-if truncated-IS caps c > 1 (token and sequence; Replay-RLOO Sec. 3.2)."""
    mask: tuple[float, ...] = (2.0, 5.0)
    """What-if masks c > 1: drop r outside [1/c, c]."""
    m2po: tuple[float, ...] = (0.04,)
    """What-if M2PO tau_M2 values > 0 (needs advantages; M2PO Algorithm 1)."""
    m2po_batch_tokens: int = 32768
    """Tokens per M2PO masking batch, an integer >= 1."""
    freshper_tau: tuple[float, ...] = (2.0, 8.0)
    """What-if FreshPER age-decay tau values > 0 (needs ages; FreshPER Eq. 13)."""
    ppo_clip_asym: tuple[tuple[float, float], ...] = ((0.2, 0.28),)
    trl_is_mask: tuple[float, ...] = (3.0,)
    gspo: tuple[tuple[float, float], ...] = ((3e-4, 4e-4),)

    def __post_init__(self) -> None:
        # (field, open interval of valid values): the lower clip edge log(1 - eps) needs eps < 1
        for name, lo, hi, values in (("ppo_clip", 0.0, 1.0, self.ppo_clip), ("tis", 1.0, math.inf, self.tis),
                                     ("mask", 1.0, math.inf, self.mask), ("m2po", 0.0, math.inf, self.m2po),
                                     ("freshper_tau", 0.0, math.inf, self.freshper_tau),
                                     ("trl_is_mask", 0.0, math.inf, self.trl_is_mask)):
            valid = f"in ({lo:g}, {hi:g})" if math.isfinite(hi) else f"> {lo:g}"
            for v in values:
                if not (isinstance(v, (int, float)) and math.isfinite(v) and lo < v < hi):
                    raise ConfigError(name, f"values must be finite numbers {valid}, got {v!r}")
        for name, pairs in (("ppo_clip_asym", self.ppo_clip_asym), ("gspo", self.gspo)):
            for pair in pairs:
                ok = (isinstance(pair, (tuple, list)) and len(pair) == 2
                      and all(isinstance(v, (int, float)) and math.isfinite(v) for v in pair)
                      and 0 < pair[0] < 1 and pair[1] > 0)
                if not ok:
                    raise ConfigError(name, f"values must be pairs (lo, hi) with lo in (0, 1) and hi > 0, got {pair!r}")
        check_field(require_integer, "m2po_batch_tokens", self.m2po_batch_tokens, 1)


def _row(correction: str, level: str, param, result: dict | None, note: str = "") -> dict:
    row = {"correction": correction, "level": level, "param": param,
           "flagged_frac": None, "ess_frac": None, "bias_proxy": None}
    if result:
        row.update(result)
    if note:
        row["note"] = note
    return row


def _rows(sums: dict[tuple, WeightSums], level: str) -> list[dict]:
    """A row per (correction, param) key; M2PO's (tau, variant) is labelled m2po_<variant> with param tau."""
    out = []
    for (name, param), weights in sums.items():
        if name == "m2po":
            name, param = f"m2po_{param[1]}", param[0]
        out.append(_row(name, level, list(param) if isinstance(param, tuple) else param, weights.result()))
    return out


def _clip_active(lr: np.ndarray, signs: tuple[np.ndarray, np.ndarray] | None, lo: float, hi: float) -> np.ndarray:
    """Where a PPO clip [1 - lo, 1 + hi] takes the gradient (the clipped term is the min): the losses' clip test.
    ``signs``: (A > 0, A < 0), or None without advantages (both sides count, the worst case)."""
    low, high = ppo_clip_flags(lr, *clip_log_bounds(lo, hi), *(signs or (None, None)))
    return low | high


#: a truncation whose cap is this far (in log) below the largest ratio gets its own shift
SHARED_SHIFT_RANGE = 600.0
#: kept weights summing above this (shifted by the largest ratio) lose nothing to underflow: the largest kept
#: e^{log r - top} is >= 1e-100 / n, and every term below 1e-154 adds less than 1e-300 to sums of at least 1e-200
SHARED_SHIFT_FLOOR = 1e-100


class _Shifted:
    """One chunk's ratios shifted by their maximum, shared by every correction: e = e^{log r - top}."""

    def __init__(self, lr: np.ndarray) -> None:
        self.lr = lr
        self.top = float(lr.max())
        self.e = np.exp(lr - self.top)  # (n,) in (0, 1]
        self.e2 = self.e * self.e
        self.A, self.B = float(self.e.sum()), float(self.e2.sum())

    def kept(self, flagged: np.ndarray) -> tuple[int, float, float, float]:
        """(#flagged, sum e and sum e^2 over the tokens not ``flagged``, sum e over the flagged)."""
        n_flagged = int(np.count_nonzero(flagged))
        if not n_flagged:
            return 0, self.A, self.B, 0.0
        if 8 * n_flagged < flagged.size:  # the usual few clipped tokens: gather them, O(flagged) after one scan
            gone = self.e[np.flatnonzero(flagged)]
            gone_A, gone_B = float(gone.sum()), float(np.sum(gone * gone))
        else:  # products with the 0/1 flags: np.sum(where=) branches per element, 8x slower on a 50% mask
            gone_A, gone_B = float(np.sum(self.e * flagged)), float(np.sum(self.e2 * flagged))
        if gone_A <= 0.5 * self.A:  # at least half is left: the difference loses no digit
            return n_flagged, self.A - gone_A, self.B - gone_B, gone_A
        keep = ~flagged
        return n_flagged, float(np.sum(self.e * keep)), float(np.sum(self.e2 * keep)), gone_A

    def masked(self, sums: WeightSums, flagged: np.ndarray) -> None:
        """Fold w = r where not ``flagged``, 0 where flagged (a clip that takes the gradient, a mask)."""
        n_flagged, A, B, gone = self.kept(flagged)
        log_removed = self.top + math.log(gone) if gone > 0 else -math.inf
        removed = math.exp(log_removed) if log_removed < EXP_MAX else math.inf  # sum of r over the dropped tokens
        top = self.top
        if A <= SHARED_SHIFT_FLOOR:  # the kept ratios are all far below the largest: shift them by their own
            kept = self.lr[~flagged]
            top = float(kept.max()) if kept.size else -math.inf
            e = np.exp(kept - top)
            A, B = float(e.sum()), float(np.sum(e * e))
        sums.add(self.lr.size, n_flagged, removed, top, A, B)

    def truncated(self, sums: WeightSums, c: float) -> None:
        """Fold w = min(r, c) (truncated IS): the truncated tokens weigh c each."""
        log_c = math.log(c)
        trunc = self.lr > log_c
        over = self.lr[trunc]  # only these have (r - c)_+ > 0
        excess = clipping_bias_proxy(over, c) * over.size if over.size else 0.0  # sum (r - c)_+, Sec. 3.2
        if self.top - log_c > SHARED_SHIFT_RANGE:  # shifted by log c instead: the truncated weigh 1 each
            e = np.exp(self.lr[~trunc] - log_c)
            sums.add(self.lr.size, over.size, excess, log_c, float(e.sum()) + over.size,
                     float(np.sum(e * e)) + over.size)
            return
        n_trunc, A, B, _ = self.kept(trunc)
        cap = math.exp(log_c - self.top)
        sums.add(self.lr.size, n_trunc, float(excess), self.top, A + n_trunc * cap, B + n_trunc * cap * cap)


def _fold_shared(sums: Callable[[tuple], WeightSums], shared: _Shifted, config: WhatIfConfig) -> None:
    """The corrections both levels have: none, truncated IS and the two-sided mask."""
    sums(("none", None)).add(shared.lr.size, 0, 0.0, shared.top, shared.A, shared.B)
    for c in config.tis:
        shared.truncated(sums(("tis", c)), c)
    if config.mask:
        size = np.abs(shared.lr)
        for c in config.mask:
            shared.masked(sums(("mask", c)), size > math.log(c))


class TokenWhatIf:
    """Streams token-level corrections; state: one :class:`WeightSums` each and the M2PO block in progress.

    With advantages the tokens are processed in whole M2PO blocks (``m2po_batch_tokens``), so every correction sees
    the same arrays and the M2PO masks are those of the blocks.
    """

    def __init__(self, config: WhatIfConfig, has_advantage: bool) -> None:
        self.config = config
        self.has_advantage = has_advantage
        keys = [("none", None), *(("ppo_clip", eps) for eps in config.ppo_clip),
                *(("ppo_clip_asym", (float(lo), float(hi))) for lo, hi in config.ppo_clip_asym),
                *(("tis", c) for c in config.tis), *(("mask", c) for c in config.mask),
                *(("m2po", (tau, v)) for tau in config.m2po for v in M2PO_VARIANTS if has_advantage)]
        self.sums = {key: WeightSums() for key in keys}  # in the order of the report's rows
        self._pending_lr = self._pending_adv = np.zeros(0)  # the tokens of the M2PO block in progress

    def update(self, lr: np.ndarray, advantage: np.ndarray | None) -> None:
        """Add one chunk: ``lr`` (n,) token log-ratios, ``advantage`` (n,) or None."""
        if not self.has_advantage:
            self._fold(lr, None)
            return
        if advantage is None:
            raise ValueError("this what-if was made with has_advantage: update needs the advantages")
        if self._pending_lr.size:  # the block in progress first
            lr, advantage = np.concatenate([self._pending_lr, lr]), np.concatenate([self._pending_adv, advantage])
        full = (lr.size // self.config.m2po_batch_tokens) * self.config.m2po_batch_tokens
        if full:
            self._fold(lr[:full], advantage[:full])
        self._pending_lr, self._pending_adv = lr[full:], advantage[full:]

    def _fold(self, lr: np.ndarray, adv: np.ndarray | None) -> None:
        """Every correction over ``lr`` (n,); with ``adv``, n is whole M2PO blocks (or the log's last block)."""
        if lr.size == 0:
            return
        shared, signs = _Shifted(lr), None if adv is None else (adv > 0, adv < 0)
        _fold_shared(self.sums.__getitem__, shared, self.config)
        for eps in self.config.ppo_clip:  # PPO clips only where the clipped term is the min
            shared.masked(self.sums[("ppo_clip", eps)], _clip_active(lr, signs, eps, eps))
        for lo, hi in self.config.ppo_clip_asym:
            shared.masked(self.sums[("ppo_clip_asym", (float(lo), float(hi)))], _clip_active(lr, signs, lo, hi))
        if adv is None:
            return
        block = min(self.config.m2po_batch_tokens, lr.size)
        lr_blocks, adv_blocks = lr.reshape(-1, block), adv.reshape(-1, block)  # (blocks, T): a block is a "seed"
        for tau in self.config.m2po:
            binds = m2po_may_bind(lr_blocks, adv_blocks, tau)  # (blocks,) most blocks mask nothing: no sort
            keep = m2po_masks(lr_blocks[binds, None], adv_blocks[binds, None],
                              np.ones((int(binds.sum()), 1, block), dtype=bool), tau, M2PO_VARIANTS) \
                if binds.any() else None  # both variants from one sort
            for variant in M2PO_VARIANTS:
                masked = np.zeros(lr_blocks.shape, dtype=bool)
                if keep is not None:
                    masked[binds] = ~keep[variant][:, 0]
                shared.masked(self.sums[("m2po", (tau, variant))], masked.reshape(-1))

    def rows(self) -> list[dict]:
        """Finish the M2PO block in progress and return one row per correction."""
        if self.has_advantage and self._pending_lr.size:
            self._fold(self._pending_lr, self._pending_adv)
            self._pending_lr = self._pending_adv = np.zeros(0)
        out = _rows(self.sums, "token")
        if not self.has_advantage:
            out += [_row("m2po", "token", tau, None, "needs an advantage column") for tau in self.config.m2po]
        return out


class SequenceWhatIf:
    """Sequence-level corrections, streamed over batches of whole sequences (one :class:`WeightSums` each)."""

    def __init__(self, config: WhatIfConfig) -> None:
        self.config = config
        self.sums: dict[tuple, WeightSums] = {}

    def _sums(self, key: tuple) -> WeightSums:
        return self.sums.setdefault(key, WeightSums())

    def update(self, seq_log_ratio: np.ndarray, seq_len: np.ndarray | None = None,
               seq_advantage: np.ndarray | None = None) -> None:
        """Add sequences: log-ratios (k,); GSPO needs the lengths (k,), and uses the advantages (k,) when given."""
        lr = np.asarray(seq_log_ratio, dtype=np.float64)
        if lr.size == 0:
            return
        shared = _Shifted(lr)
        _fold_shared(self._sums, shared, self.config)
        for c in self.config.trl_is_mask:  # TRL sequence_mask: R > C_max -> 0 (one-sided; clip_min None)
            shared.masked(self._sums(("trl_is_mask", float(c))), lr > math.log(c))
        if seq_len is not None:
            geo = gspo_sequence_log_ratio(lr, seq_len)  # log s, s = geometric-mean token ratio
            geo_shared = _Shifted(geo)
            for lo, hi in self.config.gspo:
                signs = None if seq_advantage is None else (seq_advantage > 0, seq_advantage < 0)
                active = _clip_active(geo, signs, lo, hi)
                geo_shared.masked(self._sums(("gspo", (float(lo), float(hi)))), active)

    def rows(self) -> list[dict]:
        return _rows(self.sums, "sequence")


def sequence_rows(seq_log_ratio: np.ndarray, config: WhatIfConfig, seq_len: np.ndarray | None = None,
                  seq_advantage: np.ndarray | None = None) -> list[dict]:
    """Sequence-level corrections on the sequence log-ratios (n_seq,) in one batch (see :class:`SequenceWhatIf`)."""
    what_if = SequenceWhatIf(config)
    what_if.update(seq_log_ratio, seq_len, seq_advantage)
    return what_if.rows()


def freshper_rows(by_age: Moments, ages: np.ndarray, taus) -> list[dict]:
    """FreshPER age decay from the per-age sums: w = r e^{-age/tau} (Eq. 13), no second pass.

    sum w = sum_a e^{-a/tau} e^{M_a} A_a and sum w^2 = sum_a e^{-2a/tau} e^{2 M_a} B_a, combined in log space
    (``by_age`` groups are exact age values ``ages``).
    """
    seen = by_age.n > 0
    a, A, B, top, n_age = ages[seen], by_age.A[seen], by_age.B[seen], by_age.lmax[seen], by_age.n[seen]
    n = float(n_age.sum())
    rows = []
    for tau in taus:
        if not (math.isfinite(tau) and tau > 0):
            continue
        log_decay = -a / tau  # Eq. (13), FreshPER: priority factor e^{-Delta / tau}
        with np.errstate(divide="ignore"):
            log_sum_w = np.logaddexp.reduce(log_decay + top + np.log(A))
            log_sum_w2 = np.logaddexp.reduce(2.0 * (log_decay + top) + np.log(B))
        ess = float(ess_frac_from_log_sums(log_sum_w, log_sum_w2, n))  # Kish of w, the kernel's; NaN if n = 0
        rows.append(_row("freshper", "token", float(tau),
                         {"ess_frac": ess,
                          "mean_age_weight": float(np.sum(n_age * np.exp(log_decay)) / n)}))
    return rows

"""Per-age sums a log carries about the per-sample gradient noise, and the per-step time columns.

Paper: experience-replay (docs/REFERENCES.md), Assumption 3.3 (sigma^2(s), s = age = staleness) and App. E
(mu). Used by ``diagnose/calibrate_log.py`` (``replay-theory calibrate --from-log``); the derivation of the proxy
is in docs/THEORY.md, section "Calibrating from a run's log".

| code name        | symbol                          | meaning                                                     |
|------------------|---------------------------------|-------------------------------------------------------------|
| ``lr``           | log w_t = log pi_theta/pi_behav | a token's log importance weight (logp_current - logp_behav) |
| ``p``            | pi_theta(token)                 | exp(logp_current)                                           |
| ``score``        | k_t ~ ||grad log pi_theta||^2   | ``logit``: (1 - p)^2; ``constant``: 1                       |
| ``q``            | E||G_i||^2 / kappa              | sum_t c_t^2 k_t times the aggregation weight (one sequence) |
| ``c_t``          | d loss / d logp_t               | w_t A_t (token weights) or W A_t, W = prod_t w_t (sequence) |

The sums are folded chunk by chunk from :class:`~replay_theory.diagnose.reader.TokenChunk` s (the diagnose
reader), one slot per sequence code, in log space (``log q`` = log-sum-exp of the tokens' log terms), so a
sequence weight prod w_t over 8k tokens cannot overflow. The log's ``step`` is streamed through the reader's
spare ``reward`` field (``ColumnMap`` is public; calibration never reads rewards), so a sequence's step is
known in both layouts without a second token pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..checks import require_one_of
from .reader import (
    LOGP_ROUNDOFF,
    TokenChunk,
    detect_format,
    grow,
    iter_batches,
    require_pyarrow,
    to_numpy,
)
from .schema import STEP_TIME_COLUMNS

WEIGHTS = ("token", "sequence")
#: the aggregation names of ``core/losses.py`` (how a loss averages its tokens).
AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
SCORES = ("logit", "constant")


@dataclass
class SequenceSums:
    """Per-sequence log-space sums for the second-moment proxy; fold chunks, then :meth:`per_sequence`."""

    weight: str = "token"
    aggregation: str = "token-mean"
    score: str = "logit"

    def __post_init__(self) -> None:
        for name, valid in (("weight", WEIGHTS), ("aggregation", AGGREGATIONS), ("score", SCORES)):
            require_one_of(name, getattr(self, name), valid)
        self.term_max = np.zeros(0)  # (n_seq,) running max of the log terms (-inf: none yet)
        self.term_sum = np.zeros(0)  # (n_seq,) sum of exp(term - term_max)
        self.log_w = np.zeros(0)  # (n_seq,) sum of token log w (log of the sequence weight)
        self.n_tokens = np.zeros(0, dtype=np.int64)  # (n_seq,)
        self.age = np.zeros(0)  # (n_seq,) NaN: unseen
        self.step = np.zeros(0)  # (n_seq,) NaN: unseen or no step column
        self.max_abs_advantage = np.zeros(0)  # (n_seq,) max |A| over the sequence's tokens (a group's spread, or 0)
        self.tokens = 0

    def fold(self, chunk: TokenChunk, path: str = "log") -> None:
        """Add one chunk; a non-finite or positive log-prob, a bad age or advantage is a one-line ValueError."""
        if chunk.age is None or chunk.advantage is None:
            raise ValueError("the proxy needs an age and an advantage per token")
        behav, cur, adv, age = chunk.logp_behav, chunk.logp_current, chunk.advantage, chunk.age
        bad = ~np.isfinite(behav) | ~np.isfinite(cur) | ~np.isfinite(adv) | ~np.isfinite(age) | (age < 0)
        with np.errstate(invalid="ignore"):
            bad |= (behav > LOGP_ROUNDOFF) | (cur > LOGP_ROUNDOFF)
        if bad.any():
            raise ValueError(f"{path}: {int(bad.sum())} tokens with NaN/inf/positive log-probs, a NaN advantage or a "
                             f"negative/NaN age in the rows from {chunk.first_row}; fix the log (calibrate reads every "
                             "token)")
        behav, cur = np.minimum(behav, 0.0), np.minimum(cur, 0.0)  # round-off positives read as 0
        lr = cur - behav  # (n,) log w_t
        # logit: log (1 - p)^2, -inf at p = 1 (no gradient through the softmax); constant: log 1
        with np.errstate(divide="ignore"):
            log_k = 2.0 * np.log(-np.expm1(cur)) if self.score == "logit" else np.zeros_like(cur)
            log_a2 = 2.0 * np.log(np.abs(adv))  # -inf at A = 0
        term = log_a2 + log_k + (2.0 * lr if self.weight == "token" else 0.0)  # (n,)
        self.tokens += int(lr.size)
        seq = chunk.seq
        size = int(seq.max()) + 1 if seq.size else 0
        for name, fill in (("term_max", -np.inf), ("term_sum", 0.0), ("log_w", 0.0), ("n_tokens", 0), ("age", np.nan),
                           ("step", np.nan), ("max_abs_advantage", 0.0)):
            setattr(self, name, grow(getattr(self, name), size, fill))
        if not seq.size:
            return
        uniq, first, inv = np.unique(seq, return_index=True, return_inverse=True)  # first: a sequence's first token
        inv = inv.reshape(-1)
        chunk_max = np.full(uniq.size, -np.inf)
        np.maximum.at(chunk_max, inv, term)
        new_max = np.maximum(self.term_max[uniq], chunk_max)  # (u,)
        shift = np.where(np.isfinite(new_max), new_max, 0.0)
        with np.errstate(invalid="ignore"):
            old = self.term_sum[uniq] * np.exp(np.where(np.isfinite(self.term_max[uniq]),
                                                        self.term_max[uniq] - shift, -np.inf))
        add = np.bincount(inv, weights=np.exp(term - shift[inv]), minlength=uniq.size)
        self.term_sum[uniq] = np.nan_to_num(old) + add
        self.term_max[uniq] = new_max
        self.log_w[uniq] += np.bincount(inv, weights=lr, minlength=uniq.size)
        self.n_tokens[uniq] += np.bincount(inv, minlength=uniq.size)
        np.maximum.at(self.max_abs_advantage, uniq[inv], np.abs(adv))
        self.age[uniq] = age[first]  # a sequence has one age
        if chunk.reward is not None:  # the step column, streamed as the reward field
            self.step[uniq] = chunk.reward[first]

    def per_sequence(self) -> dict[str, np.ndarray]:
        """Sequences seen: ``log_q`` (n,), ``age``, ``step`` (NaN without a step column), ``n_tokens``,
        ``max_abs_advantage`` (max |A| over its tokens: about 0 for a group whose rewards are all equal)."""
        seen = self.n_tokens > 0
        n = self.n_tokens[seen].astype(float)
        with np.errstate(divide="ignore"):
            log_q = self.term_max[seen] + np.log(self.term_sum[seen])  # log sum_t exp(term_t)
        if self.weight == "sequence":
            log_q = log_q + 2.0 * self.log_w[seen]  # c_t = W A_t: W^2 factors out of the sum
        if self.aggregation == "seq-mean-token-mean":
            log_q = log_q - 2.0 * np.log(n)  # the sequence's gradient is divided by its length
        # token-mean (over the batch's tokens) and seq-mean-token-sum weight every token of a batch alike
        return {"log_q": log_q, "age": self.age[seen], "step": self.step[seen], "n_tokens": n,
                "max_abs_advantage": self.max_abs_advantage[seen]}


def age_step_sums(per_sequence: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Sums of q by (step, age): ``ages`` (K,), ``steps`` (U,), ``q`` and ``count`` (U, K), ``shift``.

    q is exp(log q - shift) with one global shift (the largest log q), so every ratio of sums is exact up to
    float underflow of negligible terms. Without a step column every sequence is in one unit.
    """
    log_q, age, step = per_sequence["log_q"], per_sequence["age"], per_sequence["step"]
    finite = np.isfinite(log_q)
    shift = float(log_q[finite].max()) if finite.any() else 0.0
    q = np.exp(log_q - shift)  # (n,) 0 where log q = -inf (A = 0 or every token clipped)
    ages, age_idx = np.unique(age, return_inverse=True)
    step_key = np.where(np.isfinite(step), step, -1.0)
    steps, step_idx = np.unique(step_key, return_inverse=True)
    qs = np.zeros((steps.size, ages.size))
    counts = np.zeros((steps.size, ages.size))
    np.add.at(qs, (step_idx.reshape(-1), age_idx.reshape(-1)), q)
    np.add.at(counts, (step_idx.reshape(-1), age_idx.reshape(-1)), 1.0)
    return {"ages": ages, "steps": steps, "q": qs, "count": counts, "shift": shift}


def read_step_times(path: str | Path, step_column: str, fmt: str = "auto") -> dict[str, np.ndarray]:
    """One value per step of each per-row scalar ``STEP_TIME_COLUMNS`` (the first row of the step), streamed.

    Returns ``step`` (U,) and each column (U,), in step order. Only these columns are decoded (Parquet by row
    groups, CSV and JSON lines by blocks: ``reader.iter_batches``). Rows of one step that disagree in a
    time column are a one-line ValueError: the columns are per-step values repeated on each row.
    """
    require_pyarrow()
    path = Path(path)
    chosen = detect_format(path, fmt)
    names = [step_column, *STEP_TIME_COLUMNS]
    first: dict[float, tuple[float, ...]] = {}

    for batch, _ in iter_batches(path, chosen, names, 65536, names):
        stacked = np.stack([np.asarray(to_numpy(batch.column(n)), dtype=np.float64) for n in names], axis=1)
        if not np.all(np.isfinite(stacked)):
            raise ValueError(f"{path.name}: null or non-finite values in {', '.join(names)}")
        for row in np.unique(stacked, axis=0):
            key = float(row[0])
            seen = first.setdefault(key, tuple(row[1:]))
            if seen != tuple(row[1:]):
                raise ValueError(f"{path.name}: step {key:g} has different values of {', '.join(names[1:])} on its "
                                 "rows; they must be one value per step")
    keys = sorted(first)
    return {"step": np.asarray(keys, dtype=np.float64),
            **{name: np.asarray([first[k][i] for k in keys], dtype=np.float64) for i, name in enumerate(names[1:])}}

"""One streaming pass over a rollout log -> the off-policy health report.

``diagnose(DiagnoseConfig(path=...))`` reads the log chunk by chunk
(``reader.py``), checks every token (finite, non-positive log-probs; ages
>= 0), and folds each chunk into:

* the overall token-level :class:`~.accumulators.Moments` and a log-ratio
  histogram (quantiles);
* one ``Moments`` group per distinct age value (merged into at most
  ``max_age_buckets`` buckets at the end; the exact per-age sums also give the
  KL drift fit and the FreshPER what-if);
* per-sequence sums of log r (sequence ratio = product of token ratios, summed
  in log space, so an 8k-token response cannot overflow);
* the streaming what-if corrections (``whatif.py``);
* the sums behind TRL's, verl's and M2PO's logged metrics
  (``framework_stats.FrameworkSums``: token sums plus per-sequence sums of
  log r, log-probs and verl's clamped weights; a sequence's advantage is its
  first token's), finished by the same ``framework_stats.finish`` as the
  batch function ``framework_statistics``, so the report's ``framework``
  equals that function on the whole log as one batch.

Memory is O(row group + sequences + distinct ages), whatever the number of tokens (about 330 bytes a
sequence: 280 MiB at 10M tokens / 0.3M sequences, 1.25 GB at 100M / 3.2M; bench/bench_diagnose.py).

Invalid data is never silently dropped: by default the first NaN / infinite /
positive log-prob, negative or NaN age, NaN advantage or mismatched wide row
raises a one-line ``ValueError``; with ``skip_invalid`` such tokens are
dropped, counted in ``report["skipped"]``, and every sequence that lost a
token is left out of the sequence-level statistics.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import numpy as np

from replay_theory.diagnose.accumulators import LogRatioHistogram, Moments
from replay_theory.diagnose.drift import fit_kl_drift
from replay_theory.diagnose.errors import ConfigError
from replay_theory.diagnose.framework_stats import FrameworkParams, FrameworkSums, finish, rollout_is_metrics
from replay_theory.diagnose.reader import FORMATS, LogReader, TokenChunk
from replay_theory.diagnose.schema import resolve_columns
from replay_theory.diagnose.whatif import TokenWhatIf, WhatIfConfig, freshper_rows, sequence_rows

#: log-probs in (0, LOGP_ROUNDOFF] are round-off from bf16 / fused kernels and read as 0.
LOGP_ROUNDOFF = 1e-6
QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
#: the statistics reported per group (token level, sequence level, each age bucket).
STAT_KEYS = ("n_tokens", "ess_frac", "chi2", "d2", "kl_k1", "kl_k2", "kl_k3", "m2", "ratio_min", "ratio_mean",
             "ratio_max", "ratio_std", "kl_new_behav", "chi2_pearson")


@dataclass(frozen=True)
class DiagnoseConfig:
    """Everything ``replay-theory diagnose`` needs; saved in the report as ``config``."""

    path: str
    preset: str = "default"
    columns: Optional[str] = None  # "field=name,..." overrides of the preset
    format: str = "auto"
    chunk_rows: int = 65536
    skip_invalid: bool = False
    max_age_buckets: int = 16
    what_if: WhatIfConfig = field(default_factory=WhatIfConfig)
    run_what_if: bool = True
    framework: FrameworkParams = field(default_factory=FrameworkParams)

    def __post_init__(self) -> None:
        # every field is checked here, before the file is opened: a bad value costs no work
        if self.format not in ("auto", *FORMATS):
            raise ConfigError("format", f"must be auto, {', '.join(FORMATS)}; got {self.format!r}")
        if self.chunk_rows < 1:
            raise ConfigError("chunk_rows", f"must be an integer >= 1, got {self.chunk_rows}")
        if self.max_age_buckets < 1:
            raise ConfigError("max_age_buckets", f"must be an integer >= 1, got {self.max_age_buckets}")
        resolve_columns(self.preset, self.columns)


def grow(a: np.ndarray, size: int, fill) -> np.ndarray:
    """``a`` (n,) extended to at least ``size`` entries filled with ``fill`` (capacity doubles: amortised O(1))."""
    if size <= a.size:
        return a
    out = np.full(max(size, 2 * a.size), fill, dtype=a.dtype)
    out[: a.size] = a
    return out


class _State:
    """Everything accumulated during the pass."""

    def __init__(self, config: DiagnoseConfig, has_age: bool, has_advantage: bool) -> None:
        self.tokens = Moments.empty(1)
        self.hist = LogRatioHistogram()
        self.age_codes: dict[float, int] = {}
        self.by_age = Moments.empty(0)
        self.seq_sum = np.zeros(0, dtype=np.float64)  # (n_seq,) sum of token log r
        self.seq_len = np.zeros(0, dtype=np.int64)  # (n_seq,)
        self.seq_bad = np.zeros(0, dtype=bool)  # (n_seq,) lost a token to --skip-invalid
        self.has_age = has_age
        self.reward_sum, self.reward_n = 0.0, 0
        self.skipped = {"nan_or_inf_logp": 0, "positive_logp": 0, "bad_age": 0, "bad_advantage": 0,
                        "mismatched_rows": 0}
        self.what_if = TokenWhatIf(config.what_if, has_advantage) if config.run_what_if else None
        # the TRL / verl / M2PO metrics (framework_stats.py); a sequence's advantage is its first token's
        self.framework = FrameworkSums(has_advantage=has_advantage)
        self.framework_params = config.framework
        self.seq_adv = np.zeros(0, dtype=np.float64)  # (n_seq,) NaN until the sequence's first kept token


def _check(chunk: TokenChunk, skip: bool, state: _State, path: str) -> np.ndarray:
    """Boolean (n,) of the tokens to keep; raises on the first problem unless ``skip``."""
    problems = []
    behav, cur = chunk.logp_behav, chunk.logp_current
    nonfinite = ~np.isfinite(behav) | ~np.isfinite(cur)
    problems.append(("nan_or_inf_logp", nonfinite, "NaN, null or infinite log-probs"))
    with np.errstate(invalid="ignore"):
        positive = ~nonfinite & ((behav > LOGP_ROUNDOFF) | (cur > LOGP_ROUNDOFF))
    problems.append(("positive_logp", positive, f"positive log-probs (> {LOGP_ROUNDOFF:g})"))
    if chunk.age is not None:
        with np.errstate(invalid="ignore"):
            bad_age = ~np.isfinite(chunk.age) | (chunk.age < 0)
        problems.append(("bad_age", bad_age, "negative, null or non-finite ages"))
    if chunk.advantage is not None:
        problems.append(("bad_advantage", ~np.isfinite(chunk.advantage), "null or non-finite advantages"))
    keep = np.ones(len(chunk), dtype=bool)
    for key, bad, text in problems:
        count = int(np.count_nonzero(bad))
        if not count:
            continue
        if not skip:
            raise ValueError(f"{path}: {count} tokens with {text} in the rows from {chunk.first_row}; "
                             "fix the log or pass --skip-invalid to drop and count them")
        state.skipped[key] += count
        keep &= ~bad
    return keep


def _fold_chunk(chunk: TokenChunk, state: _State, keep: np.ndarray) -> None:
    behav = np.minimum(chunk.logp_behav[keep], 0.0)  # round-off positives read as 0
    cur = np.minimum(chunk.logp_current[keep], 0.0)
    lr = cur - behav  # (n,) log r = log pi_current - log pi_behav, never exponentiated here
    seq = chunk.seq  # (n_all,)

    # sequences: log R_seq = sum of token log r; a sequence that lost a token is marked bad
    uniq, inverse = np.unique(seq, return_inverse=True)
    size = int(uniq[-1]) + 1 if uniq.size else 0
    state.seq_sum = grow(state.seq_sum, size, 0.0)
    state.seq_len = grow(state.seq_len, size, 0)
    state.seq_bad = grow(state.seq_bad, size, False)
    kept_inverse = inverse.reshape(-1)[keep]
    state.seq_sum[uniq] += np.bincount(kept_inverse, weights=lr, minlength=uniq.size)
    state.seq_len[uniq] += np.bincount(kept_inverse, minlength=uniq.size)
    if not keep.all():
        state.seq_bad[seq[~keep]] = True
    state.n_seq = max(getattr(state, "n_seq", 0), size)

    if lr.size == 0:
        return
    seq_kept = seq[keep]
    adv = None if chunk.advantage is None else chunk.advantage[keep]
    seq_adv_tok = None
    if adv is not None:
        state.seq_adv = grow(state.seq_adv, size, np.nan)
        codes, first = np.unique(seq_kept, return_index=True)
        unset = np.isnan(state.seq_adv[codes])
        state.seq_adv[codes[unset]] = adv[first[unset]]
        seq_adv_tok = state.seq_adv[seq_kept]
    state.framework.add_tokens(lr, cur, behav, seq_kept, state.seq_sum.size, adv, seq_adv_tok,
                               state.framework_params)
    state.tokens.fold(Moments.from_samples(lr))
    state.hist.update(lr)
    if chunk.age is not None:
        age = chunk.age[keep]
        values, inv = np.unique(age, return_inverse=True)
        codes = np.fromiter((state.age_codes.setdefault(v, len(state.age_codes)) for v in values.tolist()),
                            dtype=np.int64, count=values.size)
        state.by_age.grow(len(state.age_codes))
        state.by_age.fold(Moments.from_samples(lr, codes[inv.reshape(-1)], state.by_age.size))
    if chunk.reward is not None:
        state.reward_sum += float(np.sum(chunk.reward[keep]))
        state.reward_n += int(np.count_nonzero(keep))
    if state.what_if is not None:
        state.what_if.update(lr, None if chunk.advantage is None else chunk.advantage[keep])


def _clean(x):
    """JSON-safe: numpy scalars to Python, NaN / inf to None."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else None
    return x


def _group_stats(moments: Moments, group: int) -> dict:
    stats = moments.statistics()
    out = {k: float(stats[k][group]) for k in STAT_KEYS}
    out["n_tokens"] = int(stats["n_tokens"][group])
    out["ess"] = out["ess_frac"] * out["n_tokens"]
    return out


def _relations(moments: Moments, group: int = 0) -> list[dict]:
    return [{"name": r.name, "relation": r.relation, "lhs": float(r.lhs), "rhs": float(r.rhs),
             "holds": bool(r.holds), "slack": float(r.slack), "source": r.source}
            for r in moments.relations(group)]


def _age_buckets(ages: np.ndarray, counts: np.ndarray, max_buckets: int) -> tuple[np.ndarray, int]:
    """Label each exact age value with a bucket: one per age if few, else equal-token buckets."""
    order = np.argsort(ages)
    labels = np.empty(ages.size, dtype=np.int64)
    if ages.size <= max_buckets:
        labels[order] = np.arange(ages.size)
        return labels, ages.size
    before = np.cumsum(counts[order]) - counts[order]  # tokens at younger ages
    raw = np.floor(before / counts.sum() * max_buckets).astype(np.int64)
    _, dense = np.unique(raw, return_inverse=True)
    labels[order] = dense.reshape(-1)
    return labels, int(dense.max()) + 1


def _by_age(state: _State, max_buckets: int) -> tuple[list[dict], np.ndarray]:
    ages = np.array(list(state.age_codes), dtype=np.float64)  # (G,) exact age of each group
    counts = state.by_age.n
    labels, n_buckets = _age_buckets(ages, counts, max_buckets)
    buckets = state.by_age.combined(labels, n_buckets)
    rows = []
    for b in range(n_buckets):
        members = labels == b
        stats = _group_stats(buckets, b)
        weights = counts[members]
        row = {"age": float(np.sum(ages[members] * weights) / weights.sum()),
               "age_min": float(ages[members].min()), "age_max": float(ages[members].max())}
        row.update(stats)
        row["ess_bound"] = math.exp(-stats["kl_new_behav"])  # FreshPER Eq. (11) per bucket
        rows.append(row)
    return sorted(rows, key=lambda r: r["age"]), ages


def _framework(state: _State, good: np.ndarray, n_seq: int) -> tuple[dict, dict]:
    """TRL / verl / M2PO metrics (framework_stats.finish) over the whole log as one batch.

    Token sums cover every kept token; the per-sequence sums the sequences that
    kept all their tokens (the same ones as the sequence statistics).
    """
    fw = state.framework
    sums = FrameworkSums(**{k: getattr(fw, k) for k in fw.__dataclass_fields__})
    for name in ("seq_len", "seq_lr", "seq_cur", "seq_behav", "seq_w", "seq_trl_low", "seq_trl_high"):
        full = getattr(fw, name)
        padded = np.zeros(max(n_seq, full.size))
        padded[: full.size] = full
        setattr(sums, name, padded[:n_seq][good])
    if sums.seq_len.size == 0:
        return {}, {}
    params = state.framework_params
    return finish(sums, params, "token"), rollout_is_metrics(sums, params, "sequence")


def diagnose(config: DiagnoseConfig, progress: Optional[Callable[[int, int], None]] = None) -> dict:
    """Read ``config.path`` once and return the report (a JSON-safe dict; see the CLI's ``--json``)."""
    columns = resolve_columns(config.preset, config.columns)
    reader = LogReader(config.path, columns, fmt=config.format, chunk_rows=config.chunk_rows,
                       skip_invalid=config.skip_invalid)
    state = _State(config, "age" in reader.used, "advantage" in reader.used)
    for chunk in reader:
        state.skipped["mismatched_rows"] += chunk.mismatched_rows
        keep = _check(chunk, config.skip_invalid, state, reader.path.name)
        _fold_chunk(chunk, state, keep)
        if progress is not None:
            progress(reader.bytes_done, reader.total_bytes)
    if state.tokens.n[0] == 0:
        raise ValueError(f"{reader.path.name}: no valid tokens to diagnose")

    report: dict = {
        "file": str(reader.path), "format": reader.format, "layout": reader.layout, "preset": config.preset,
        "columns": reader.used, "n_rows": reader.rows_done,
    }
    report.update(_group_stats(state.tokens, 0))
    report["n_tokens"] = int(state.tokens.n[0])
    top, low = float(state.tokens.lmax[0]), float(state.tokens.lmin[0])
    report["ratio_quantiles"] = {f"p{int(round(q * 100)):02d}": math.exp(v)
                                 for q, v in zip(QUANTILES, state.hist.quantiles(QUANTILES, low, top))}
    if state.reward_n:
        report["mean_reward"] = state.reward_sum / state.reward_n

    n_seq = getattr(state, "n_seq", 0)
    seen = state.seq_len[:n_seq] > 0
    good = seen & ~state.seq_bad[:n_seq]
    seq_lr = state.seq_sum[:n_seq][good]  # (n_seq_ok,) sequence log-ratios
    report["n_sequences"] = int(np.count_nonzero(seen))
    sequence = {"n_sequences": int(seq_lr.size), "mean_length": float(state.seq_len[:n_seq][good].mean())
                if seq_lr.size else None}
    seq_moments = Moments.from_samples(seq_lr) if seq_lr.size else None
    if seq_moments is not None:
        stats = _group_stats(seq_moments, 0)
        stats.pop("n_tokens")
        sequence.update(stats)
    report["sequence"] = sequence
    report["skipped"] = dict(state.skipped, sequences_excluded=int(np.count_nonzero(seen & state.seq_bad[:n_seq])))
    report["bounds"] = {"token": _relations(state.tokens),
                        "sequence": _relations(seq_moments) if seq_moments is not None else []}

    report["framework"], report["framework_rollout_is_sequence"] = _framework(state, good, n_seq)
    report["framework_params"] = asdict(config.framework)

    if state.has_age and state.by_age.size:
        report["by_age"], ages = _by_age(state, config.max_age_buckets)
        age_stats = state.by_age.statistics()
        report["drift"] = fit_kl_drift(ages, age_stats["kl_k3"], state.by_age.n)
    else:
        report["by_age"], ages, report["drift"] = [], None, None

    if state.what_if is not None:
        rows = state.what_if.rows()
        if state.framework.has_advantage:
            # M2 over M2PO's trust-region tokens, next to the M2PO rows: the number M2PO compares with tau_M2
            last = max(i for i, r in enumerate(rows) if r["correction"].startswith("m2po"))
            fw = state.framework
            rows.insert(last + 1, {"correction": "m2_trust_region", "level": "token", "param": None,
                                   "flagged_frac": fw.m2_count / fw.n, "ess_frac": None, "bias_proxy": None,
                                   "m2": report["framework"]["m2po/M2"]})
        if seq_lr.size:
            seq_adv = state.seq_adv[:n_seq][good] if state.framework.has_advantage else None
            rows += sequence_rows(seq_lr, config.what_if, state.seq_len[:n_seq][good], seq_adv)
        if ages is not None:
            taus = list(config.what_if.freshper_tau)
            fitted = (report["drift"] or {}).get("tau")
            if fitted is not None and math.isfinite(fitted) and fitted > 0:
                taus.append(fitted)
            rows += freshper_rows(state.by_age, ages, taus)
        else:
            rows += [{"correction": "freshper", "level": "token", "param": t, "flagged_frac": None,
                      "ess_frac": None, "bias_proxy": None, "note": "needs an age column"}
                     for t in config.what_if.freshper_tau]
        report["what_if"] = rows
    config_dict = asdict(config)
    report["config"] = config_dict
    return _clean(report)

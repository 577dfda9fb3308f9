"""One streaming pass over a rollout log -> the off-policy health report.

``diagnose(DiagnoseConfig(path=...))`` reads the log chunk by chunk (``reader.py``), checks every token
(finite, non-positive log-probs; ages >= 0) and cuts each chunk into runs of tokens with one sequence and one
age.  Every per-token sum is taken once per run (``np.add.reduceat``); the report's groups are unions of runs,
merged exactly at O(runs) cost (``accumulators.Moments``):

* one group per distinct age value (merged into at most ``max_age_buckets`` buckets at the end; the exact
  per-age sums also give the token level, the KL drift fit and the FreshPER what-if);
* per-sequence sums of log r (the sequence ratio, summed in log space: an 8k-token response cannot
  overflow), of the log-probs and of verl's clamped weights, folded into the sequence statistics, the
  sequence what-if rows and the TRL / verl / M2PO metrics (``framework_stats.finish``, the same code as the
  batch ``framework_statistics``) once the sequence is complete;
* a log-ratio histogram (quantiles) and the token what-if corrections (``whatif.py``).

These folds are independent: with ``threads`` > 1 the costliest so far run in worker threads and the rest in the
reading thread, each fold in chunk order, so every thread count gives the same numbers, bit for bit. With integer
sequence ids that never decrease (TRL's and verl's exports) a sequence is folded when the next begins, so memory is
flat in the length of the log; any other order is detected at the first decreasing id and the log is read again with
every sequence held (about 370 bytes a sequence).

Invalid data is never silently dropped: the first NaN / infinite / positive log-prob, negative or NaN age,
NaN advantage or mismatched wide row raises a one-line ``ValueError``; with ``skip_invalid`` such tokens are
dropped, counted in ``report["skipped"]``, and a sequence that lost a token leaves the sequence statistics.
"""

from __future__ import annotations

import ctypes
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import numpy as np

from ..checks import require_integer, require_one_of
from ..core.memory import Estimate, Size, check_sizes
from ..theory.bounds import moments_relations
from .accumulators import LOG_FLOAT_MAX, UNSHIFTED_MAX, LogRatioHistogram, Moments
from .drift import fit_kl_drift
from .errors import ConfigError, check_field
from .framework_stats import (
    SEQ_FIELDS,
    FrameworkParams,
    FrameworkSums,
    finish,
    rollout_is_metrics,
)
from .reader import FORMATS, LOGP_ROUNDOFF, LogReader, TokenChunk, UnsortedIds, grow
from .schema import resolve_columns
from .whatif import SequenceWhatIf, TokenWhatIf, WhatIfConfig, freshper_rows

QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


@dataclass(frozen=True)
class DiagnoseConfig:
    """Everything ``replay-theory diagnose`` needs; saved in the report as ``config``. The command's options are
    these fields (cli/diagnose_cmds.py), their help the docstrings below."""

    path: str
    """Log file: Parquet, CSV or JSON lines; with the nemo-rl, skyrl or slime preset the framework's own step file,
    or a folder of them."""
    preset: str = "default"
    """Column names: default, trl or verl; or read the files a framework writes at every step: nemo-rl
    (train_data_step{N}.jsonl), skyrl (global_step_N_training_input.pkl), slime (train_data/{rollout_id}.pt, needs
    torch). Pickles are read with a whitelist."""
    columns: Optional[str] = None
    """Overrides of the preset's column names, e.g. 'logp_behav=old_logp,age=version_gap'."""
    format: str = "auto"
    """auto (from the suffix), parquet, csv or jsonl; must match the file's contents."""
    chunk_rows: int = 262144
    """Rows read per chunk, an integer >= 1 (bounds the memory)."""
    threads: int = 2
    """Threads that fold each chunk side by side, an integer >= 1 (1: all in the calling thread; 2 splits the work
    about evenly, more helps only with more cores); every count gives the same numbers."""
    skip_invalid: bool = False
    """Drop and count NaN/inf/positive log-probs, bad ages and mismatched rows instead of stopping."""
    max_age_buckets: int = 16
    """Age buckets in the by-age table, an integer >= 1."""
    what_if: WhatIfConfig = field(default_factory=WhatIfConfig)
    run_what_if: bool = True
    framework: FrameworkParams = field(default_factory=FrameworkParams)

    def __post_init__(self) -> None:
        # every field is checked here, before the file is opened: a bad value costs no work
        check_field(require_one_of, "format", self.format, ("auto", *FORMATS))
        for name in ("chunk_rows", "threads", "max_age_buckets"):
            check_field(require_integer, name, getattr(self, name), 1)
        values = {"chunk_rows": self.chunk_rows, "m2po_batch_tokens": self.what_if.m2po_batch_tokens,
                  "threads": self.threads, "max_age_buckets": self.max_age_buckets}
        try:
            check_sizes(DIAGNOSE_SIZES, values, peak_bytes, defaults={**values, "chunk_rows": 262144,
                                                                       "m2po_batch_tokens": 32768})
        except ValueError as err:  # "<field> ...": the front end names its option
            field_name, _, detail = str(err).partition(" ")
            raise ConfigError(field_name, detail) from None
        resolve_columns(self.preset, self.columns)


#: diagnose's sizes: a chunk's rows and an M2PO block's tokens are held at once (``peak_bytes``); the threads fold
#: at most len(FOLDS) chunks side by side and the buckets are a table's rows, so those two get the ceiling alone.
DIAGNOSE_SIZES = (Size("chunk_rows"), Size("m2po_batch_tokens"), Size("threads", memory=False),
                  Size("max_age_buckets", memory=False))
ROW_BYTES = 160
"""Bytes a chunk holds per row while it is folded (measured 122 on a one-token-a-row log: the columns read, the
runs, each fold's arrays); a wide row (a whole sequence) holds that per token, which the file alone tells."""
M2PO_TOKEN_BYTES = 160
"""Bytes per token of an M2PO masking block in flight (measured 115: log-ratios, advantages, masks, both variants)."""


def peak_bytes(values: dict) -> Estimate:
    """Peak bytes of ``diagnose`` at least: one chunk of ``chunk_rows`` rows (a token each) and one M2PO block of
    ``m2po_batch_tokens`` tokens in flight (a log shorter than a chunk holds less: the file's length is not read
    before the check)."""
    return Estimate({f"a chunk: rows = {values['chunk_rows']}": values["chunk_rows"] * ROW_BYTES,
                     f"an M2PO block: tokens = {values['m2po_batch_tokens']}":
                         values["m2po_batch_tokens"] * M2PO_TOKEN_BYTES})


#: what a sequence carries from token runs to its sequence-level statistics: the framework sums, its first
#: kept token's advantage (NaN until seen) and whether it lost a token to --skip-invalid
_SEQ_SUMS = (*SEQ_FIELDS, "adv", "bad")
#: the independent folds of a chunk (``_fold_chunk``), usually heaviest first; ``_pass`` places them by their cost
FOLDS = ("tokens", "what_if", "histogram")
#: complete sequences are folded in batches of at least this many (about 0.6 MB of sums): few numpy calls, flat memory
CLOSE_EVERY = 8192


class _Sequences:
    """Per-sequence sums, folded into the sequence-level statistics once a sequence is complete.

    With sorted ids (the reader's ``sorted_ids``) a sequence is complete when the next one starts, so only the last,
    open one is held: memory is flat in the number of sequences.  Otherwise every sequence is held (arrays indexed
    by the reader's codes) until the end of the log.
    """

    def __init__(self, state: "_State", sorted_ids: bool) -> None:
        self.state = state
        self.sorted_ids = sorted_ids
        self.sums = {f: np.zeros(0) for f in _SEQ_SUMS}  # open sequences, by code (sorted: just the last one)
        self.code0 = 0  # code of sums[...][0]

    def first_advantage(self, codes: np.ndarray, starts: np.ndarray, adv: np.ndarray) -> np.ndarray:
        """Each run's sequence advantage (R,): its first kept token's, possibly from an earlier chunk."""
        self._reserve(codes)
        held = self.sums["adv"]
        index = codes - self.code0
        first = np.unique(index, return_index=True)[1]  # first run of each sequence in this chunk
        unset = np.isnan(held[index[first]])
        held[index[first][unset]] = adv[starts[first][unset]]
        return held[index]

    def add(self, codes: np.ndarray, runs: dict[str, np.ndarray], bad_codes: np.ndarray) -> None:
        """Add the run sums ``runs`` (R,) of sequences ``codes`` (R,), mark ``bad_codes`` as having lost a token,
        and (sorted ids) close every sequence before the chunk's last."""
        every = np.concatenate([codes, bad_codes])
        self._reserve(every)
        if codes.size:  # only the sequences in this chunk are touched: O(runs), however many are held
            held, inverse = np.unique(codes - self.code0, return_inverse=True)
            for f, values in runs.items():
                self.sums[f][held] += np.bincount(inverse.reshape(-1), weights=values, minlength=held.size)
        if bad_codes.size:
            self.sums["bad"][bad_codes - self.code0] = 1.0
        complete = int(every.max()) - self.code0 if every.size else 0
        if self.sorted_ids and complete >= CLOSE_EVERY:
            self.close(complete)

    def _reserve(self, codes: np.ndarray) -> None:
        if codes.size == 0:
            return
        size = int(codes.max()) - self.code0 + 1
        for f in _SEQ_SUMS:
            self.sums[f] = grow(self.sums[f], size, np.nan if f == "adv" else 0.0)

    def close(self, count: int) -> None:
        """Fold sequences [0, count) of the held ones into the sequence-level statistics and drop them."""
        done = {f: v[:count] for f, v in self.sums.items()}
        self.sums = {f: v[count:].copy() for f, v in self.sums.items()}
        self.code0 += count
        seen = done["seq_len"] > 0  # a sequence that lost every token was never seen
        good = seen & (done["bad"] == 0)
        st = self.state
        st.n_sequences += int(np.count_nonzero(seen))
        st.sequences_excluded += int(np.count_nonzero(seen & (done["bad"] != 0)))
        if not good.any():
            return
        kept = {f: v[good] for f, v in done.items()}
        st.seq_tokens += float(kept["seq_len"].sum())
        st.seq_moments.fold(Moments.from_samples(kept["seq_lr"]))
        st.framework.add_sequences(kept, st.framework_params)
        if st.seq_what_if is not None:
            st.seq_what_if.update(kept["seq_lr"], kept["seq_len"], kept["adv"] if st.has_advantage else None)


class _State:
    """Everything accumulated during the pass."""

    def __init__(self, config: DiagnoseConfig, has_age: bool, has_advantage: bool, sorted_ids: bool) -> None:
        self.tokens = Moments.empty(1)
        self.hist = LogRatioHistogram()
        self.age_codes: dict[float, int] = {}
        self.by_age = Moments.empty(0)
        self.has_age, self.has_advantage = has_age, has_advantage
        self.reward_sum, self.reward_n = 0.0, 0
        self.skipped = {"nan_or_inf_logp": 0, "positive_logp": 0, "bad_age": 0, "bad_advantage": 0,
                        "mismatched_rows": 0}
        self.what_if = TokenWhatIf(config.what_if, has_advantage) if config.run_what_if else None
        self.seq_what_if = SequenceWhatIf(config.what_if) if config.run_what_if else None
        # the TRL / verl / M2PO metrics (framework_stats.py); a sequence's advantage is its first token's
        self.framework = FrameworkSums(has_advantage=has_advantage)
        self.framework_params = config.framework
        self.seq_moments = Moments.empty(1)  # of the sequence log-ratios
        self.n_sequences = self.sequences_excluded = 0
        self.seq_tokens = 0.0
        self.sequences = _Sequences(self, sorted_ids)


def _check(chunk: TokenChunk, skip: bool, state: _State, path: str) -> np.ndarray | None:
    """Boolean (n,) of the tokens to keep, or None for all; raises on the first problem unless ``skip``."""
    behav, cur, age, adv = chunk.logp_behav, chunk.logp_current, chunk.age, chunk.advantage
    # the usual chunk has no problem, and a few reductions show it: a NaN makes numpy's max / min / sum NaN and every
    # comparison with NaN is False (Python's max() is no help: max(-1.0, nan) is -1.0)
    if behav.size == 0 or (behav.max() <= LOGP_ROUNDOFF and cur.max() <= LOGP_ROUNDOFF and behav.min() > -np.inf
                           and cur.min() > -np.inf and (age is None or (age.min() >= 0 and age.max() < np.inf))
                           and (adv is None or np.isfinite(adv.sum()))):
        return None
    problems = []
    nonfinite = ~(np.isfinite(behav) & np.isfinite(cur))
    problems.append(("nan_or_inf_logp", nonfinite, "NaN, null or infinite log-probs"))
    with np.errstate(invalid="ignore"):
        positive = ~nonfinite & ((behav > LOGP_ROUNDOFF) | (cur > LOGP_ROUNDOFF))
    problems.append(("positive_logp", positive, f"positive log-probs (> {LOGP_ROUNDOFF:g})"))
    if age is not None:
        with np.errstate(invalid="ignore"):
            bad_age = ~(age >= 0) | np.isinf(age)  # NaN fails >= 0
        problems.append(("bad_age", bad_age, "negative, null or non-finite ages"))
    if adv is not None:
        problems.append(("bad_advantage", ~np.isfinite(adv), "null or non-finite advantages"))
    keep = None
    for key, bad, text in problems:
        count = int(np.count_nonzero(bad))
        if not count:
            continue
        if not skip:
            raise ValueError(f"{path}: {count} tokens with {text} in the rows from {chunk.first_row}; "
                             "fix the log or pass --skip-invalid to drop and count them")
        state.skipped[key] += count
        keep = ~bad if keep is None else keep & ~bad
    return keep


def _fold_chunk(chunk: TokenChunk, state: _State, keep: np.ndarray | None) -> dict[str, Callable[[], None]]:
    """The chunk's folds, by accumulator (``FOLDS``): each reads only this chunk's arrays and writes only its
    own accumulators, so folds of different names may run side by side."""
    def kept(x: np.ndarray) -> np.ndarray:
        return x if keep is None else x[keep]

    def kept_if(x: np.ndarray | None) -> np.ndarray | None:  # a column the log may lack
        return None if x is None else kept(x)

    seq, age, adv = kept(chunk.seq), kept_if(chunk.age), kept_if(chunk.advantage)
    bad_codes = np.zeros(0, dtype=np.int64) if keep is None else np.unique(chunk.seq[~keep])
    behav, cur = kept(chunk.logp_behav), kept(chunk.logp_current)
    behav = np.minimum(behav, 0.0) if behav.size and behav.max() > 0 else behav  # round-off positives read as 0
    cur = np.minimum(cur, 0.0) if cur.size and cur.max() > 0 else cur
    lr = cur - behav  # (n,) log r = log pi_current - log pi_behav, never exponentiated here
    if chunk.reward is not None:
        state.reward_sum += float(np.sum(kept(chunk.reward)))
        state.reward_n += lr.size
    if lr.size == 0:
        return {"tokens": lambda: state.sequences.add(seq, {}, bad_codes)}
    # runs of tokens with one sequence and one age: every token sum is taken per run (reduceat), and the
    # token, per-age and per-sequence groups are unions of runs
    change = seq[1:] != seq[:-1]
    if age is not None:
        change |= age[1:] != age[:-1]
    starts = np.concatenate([[0], np.flatnonzero(change) + 1])  # (R,)
    run_seq = seq[starts]  # (R,)

    def tokens() -> None:  # moments, framework and sequence sums: one thread, so they share r and the run sums
        ratio = np.exp(lr) if max(float(lr.max()), -float(lr.min())) <= UNSHIFTED_MAX else None  # (n,) or None
        runs = Moments.from_segments(lr, starts, ratio)
        if age is None:  # with ages, the token level is the union of the ages (``_pass``)
            state.tokens.fold(runs.reduce(np.zeros(starts.size, dtype=np.int64), 1))
        else:
            values, inv = np.unique(age[starts], return_inverse=True)
            codes = np.fromiter((state.age_codes.setdefault(v, len(state.age_codes)) for v in values.tolist()),
                                dtype=np.int64, count=values.size)
            state.by_age.fold(runs.reduce(codes[inv.reshape(-1)], len(state.age_codes)))
        seq_adv_tok = None
        if adv is not None:
            run_adv = state.sequences.first_advantage(run_seq, starts, adv)  # (R,)
            seq_adv_tok = np.repeat(run_adv, runs.n.astype(np.int64))
        sums = state.framework.add_tokens(lr, cur, behav, starts, adv, seq_adv_tok, state.framework_params, ratio,
                                          runs)
        state.sequences.add(run_seq, sums, bad_codes)

    folds = {"tokens": tokens, "histogram": lambda: state.hist.update(lr)}
    what_if = state.what_if
    if what_if is not None:
        folds["what_if"] = lambda: what_if.update(lr, adv)
    return folds


def _clean(report: dict) -> dict:
    """JSON-safe: numpy scalars to Python, tuples to lists, NaN / inf to None (a JSON round trip)."""
    return json.loads(json.dumps(report, default=lambda x: x.item()), parse_constant=lambda _: None)


def _group_stats(moments: Moments, group: int) -> dict:
    stats = moments.statistics()
    out = {k: float(v[group]) for k, v in stats.items()}  # every estimator of theory/moments.py, in its order
    out["n_tokens"] = int(stats["n_tokens"][group])
    out["ess"] = out["ess_frac"] * out["n_tokens"]
    return out


def _relations(moments: Moments, group: int = 0) -> list[dict]:
    return [{"name": r.name, "relation": r.relation, "lhs": float(r.lhs), "rhs": float(r.rhs),
             "holds": bool(r.holds), "slack": float(r.slack), "source": r.source}
            for r in moments_relations(moments, group)]


def sample_note(n_tokens: int, n_sequences: int) -> str | None:
    """The report's warning when it rests on one sequence: nothing then varies between sequences, so every statistic,
    quantile, bound and by-age row describes that sequence and estimates nothing about the run; None otherwise."""
    if n_sequences >= 2:
        return None
    return (f"one sequence ({n_tokens:,} token{'s' if n_tokens != 1 else ''}): every statistic below describes this "
            "sequence alone, not the run (nothing varies between sequences to estimate a spread from); log more "
            "rollouts")


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
    buckets = state.by_age.reduce(labels, n_buckets)
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


def keep_freed_memory(trim_bytes: int = 32 << 20, mmap_bytes: int = 32 << 20) -> bool:
    """Let glibc keep up to ``trim_bytes`` of freed heap and serve blocks below ``mmap_bytes`` from it.

    Every chunk allocates and frees the same few dozen megabytes of numpy temporaries; by default glibc hands them
    back to the kernel after each chunk and takes page faults to get them again: on the 10M-token bench log, 0.24-0.46
    s of system time and 0.50-0.67 s in all, against 0.03-0.04 s and 0.35-0.37 s after this call (three fresh
    processes each).  Process-wide and permanent (the thresholds glibc would otherwise adapt become fixed at about
    the values it adapts to); a no-op returning False off glibc.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS, Windows): nothing to tune
        return False
    return bool(mallopt(-1, trim_bytes)) and bool(mallopt(-3, mmap_bytes))  # malloc.h M_TRIM / M_MMAP_THRESHOLD


def _timed(fold: Callable[[], None], cost: dict[str, float], name: str) -> Callable[[], None]:
    def run() -> None:
        start = time.thread_time()
        fold()
        cost[name] += time.thread_time() - start
    return run


def _pass(config: DiagnoseConfig, sorted_ids: bool, progress) -> tuple[LogReader, _State]:
    columns = resolve_columns(config.preset, config.columns)
    reader = LogReader(config.path, columns, fmt=config.format, chunk_rows=config.chunk_rows,
                       skip_invalid=config.skip_invalid, sorted_ids=sorted_ids)
    state = _State(config, "age" in reader.used, "advantage" in reader.used, sorted_ids)
    # worker lanes (one-thread executors) and the reading thread each run their folds in chunk order, so every
    # accumulator sees the chunks in file order and the numbers do not depend on the thread count; a lane may
    # run two chunks behind the reader
    lanes = [ThreadPoolExecutor(1) for _ in range(min(config.threads - 1, len(FOLDS)))]
    cost: dict[str, float] = dict.fromkeys(FOLDS, 0.0)  # CPU seconds each fold has taken so far
    placed: dict[str, tuple] = {}  # fold -> (its worker lane, the future of its last chunk there)
    pending: list[list] = []
    try:
        for chunk in reader:
            state.skipped["mismatched_rows"] += chunk.mismatched_rows
            keep = _check(chunk, config.skip_invalid, state, reader.path.name)
            folds = _fold_chunk(chunk, state, keep)
            # the costliest folds so far run in the workers (one there stays unless another costs 25% more: M2PO's
            # sort can make the what-if the heaviest), the rest here; a fold that moves first waits for its chunk
            order = sorted(folds, key=lambda n: -cost[n] * (1.25 if n in placed else 1.0))
            top = order[:len(lanes)]
            free = sorted(set(range(len(lanes))) - {placed[n][0] for n in top if n in placed})
            futures = []
            for name in order:
                lane = (placed[name][0] if name in placed else free.pop(0)) if name in top else None
                if name in placed and placed[name][0] != lane:
                    placed.pop(name)[1].result()
                fold = _timed(folds[name], cost, name)
                if lane is None:
                    fold()
                else:
                    placed[name] = (lane, lanes[lane].submit(fold))
                    futures.append(placed[name][1])
            pending.append(futures)
            while len(pending) > 2:  # bounds the chunks in flight (memory)
                for future in pending.pop(0):
                    future.result()  # re-raises a fold's exception here
            if progress is not None:
                progress(reader.bytes_done, reader.total_bytes)
        for futures in pending:
            for future in futures:
                future.result()
    finally:
        for lane in lanes:
            lane.shutdown(cancel_futures=True)
    state.sequences.close(state.sequences.sums["seq_len"].size)  # the last sequences
    if state.has_age:
        state.tokens = state.by_age.reduce(np.zeros(state.by_age.size, dtype=np.int64), 1)
    return reader, state


def _read(config: DiagnoseConfig, progress) -> tuple[LogReader, _State]:
    """Sequence ids are first read as sorted (flat memory); at the first id below an earlier one the log is read again
    from the start with every sequence held."""
    try:
        reader, state = _pass(config, True, progress)
    except UnsortedIds:
        reader, state = _pass(config, False, progress)
    if state.tokens.n[0] == 0:
        raise ValueError(f"{reader.path.name}: no valid tokens to diagnose")
    return reader, state


def _token_section(state: _State) -> dict:
    """The per-token ratio statistics and quantiles over the whole log."""
    section = _group_stats(state.tokens, 0)
    section["n_tokens"] = int(state.tokens.n[0])
    top, low = float(state.tokens.lmax[0]), float(state.tokens.lmin[0])
    values, widths = state.hist.quantiles(QUANTILES, low, top)
    names = [f"p{int(round(q * 100)):02d}" for q in QUANTILES]
    section["log_ratio_quantiles"] = dict(zip(names, values))
    # r itself leaves float64 past log r = 709.78 (null in the JSON, e^{log r} in the table, as for ratio_max)
    section["ratio_quantiles"] = {k: math.exp(v) if v < LOG_FLOAT_MAX else math.inf for k, v in zip(names, values)}
    # the most any quantile's log r can be off: the histogram's bin width, wider only where its sparse tail had to
    # coarsen (report.py prints it then)
    section["ratio_quantiles_log_error"] = max(widths)
    if state.reward_n:
        section["mean_reward"] = state.reward_sum / state.reward_n
    return section


def _sequence_section(state: _State, n_tokens: int) -> dict:
    """The sequence counts, the per-sequence ratio statistics, the skipped rows and the bounds at both levels."""
    n_good = int(state.seq_moments.n[0])
    seq_moments = state.seq_moments if n_good else None
    sequence = {"n_sequences": n_good, "mean_length": state.seq_tokens / n_good if n_good else None}
    if seq_moments is not None:
        stats = _group_stats(seq_moments, 0)
        stats.pop("n_tokens")
        sequence.update(stats)
    return {
        "n_sequences": state.n_sequences, "sample_note": sample_note(n_tokens, state.n_sequences),
        "sequence": sequence, "skipped": dict(state.skipped, sequences_excluded=state.sequences_excluded),
        "bounds": {"token": _relations(state.tokens),
                   "sequence": _relations(seq_moments) if seq_moments is not None else []},
    }


def _framework_section(config: DiagnoseConfig, state: _State) -> dict:
    """TRL / verl / M2PO metrics over the whole log as one batch (empty without sequences)."""
    fw = state.framework
    section: dict = {"framework": {}, "framework_rollout_is_sequence": {}}
    if fw.n_seq:
        section["framework"] = finish(fw, config.framework, "token")
        section["framework_rollout_is_sequence"] = rollout_is_metrics(fw, config.framework, "sequence")
    section["framework_params"] = asdict(config.framework)
    return section


def _age_section(config: DiagnoseConfig, state: _State) -> tuple[dict, Optional[np.ndarray]]:
    """The by-age rows and the KL drift fitted over them, and the ages (None without an age column)."""
    if not (state.has_age and state.by_age.size):
        return {"by_age": [], "drift": None}, None
    by_age, ages = _by_age(state, config.max_age_buckets)
    age_stats = state.by_age.statistics()
    return {"by_age": by_age, "drift": fit_kl_drift(ages, age_stats["kl_k3"], state.by_age.n)}, ages


def _freshper_taus(config: DiagnoseConfig, drift: Optional[dict]) -> list:
    """The configured FreshPER taus, and the fitted drift's tau when it is a finite positive number."""
    taus = list(config.what_if.freshper_tau)
    fitted = (drift or {}).get("tau")
    if fitted is not None and math.isfinite(fitted) and fitted > 0:
        taus.append(fitted)
    return taus


def _what_if_rows(config: DiagnoseConfig, state: _State, report: dict, ages: Optional[np.ndarray]) -> list[dict]:
    """Every correction's what-if row: token level, M2PO's trust region, sequence level, FreshPER by age."""
    assert state.what_if is not None and state.seq_what_if is not None  # both made when config.run_what_if
    rows = state.what_if.rows()
    if state.has_advantage:
        # M2 over M2PO's trust-region tokens, next to the M2PO rows: the number M2PO compares with tau_M2
        last = max(i for i, r in enumerate(rows) if r["correction"].startswith("m2po"))
        rows.insert(last + 1, {"correction": "m2_trust_region", "level": "token", "param": None,
                               "flagged_frac": state.framework.m2_count / state.framework.n, "ess_frac": None,
                               "bias_proxy": None, "m2": report["framework"]["m2po/M2"]})
    rows += state.seq_what_if.rows()
    if ages is not None:
        rows += freshper_rows(state.by_age, ages, _freshper_taus(config, report["drift"]))
    else:
        rows += [{"correction": "freshper", "level": "token", "param": t, "flagged_frac": None,
                  "ess_frac": None, "bias_proxy": None, "note": "needs an age column"}
                 for t in config.what_if.freshper_tau]
    return rows


def diagnose(config: DiagnoseConfig, progress: Optional[Callable[[int, int], None]] = None) -> dict:
    """Read ``config.path`` and return the report (a JSON-safe dict; see the CLI's ``--json``)."""
    keep_freed_memory()
    reader, state = _read(config, progress)
    report: dict = {
        "file": str(reader.path), "format": reader.format, "layout": reader.layout, "preset": config.preset,
        "columns": reader.used, "n_rows": reader.rows_done,
    }
    report.update(_token_section(state))
    report.update(_sequence_section(state, report["n_tokens"]))
    report.update(_framework_section(config, state))
    ages_section, ages = _age_section(config, state)
    report.update(ages_section)
    if state.what_if is not None:
        report["what_if"] = _what_if_rows(config, state, report, ages)
    report["config"] = asdict(config)
    return _clean(report)

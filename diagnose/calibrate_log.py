"""``calibrate --from-log``: mu and a noise profile sigma^2(s) from a run's exported diagnose log.

Paper: "Efficient RL training for LLMs with experience replay" (experience-replay, docs/REFERENCES.md):
Assumption 3.3 (sigma^2(s), rho), Thm 3.5 (J = c sigmabar^2(x)(1/B + 1/N + rho/R)), Sec. 2 / App. E (mu).
The proxy's derivation, with every assumption, is docs/THEORY.md section 8 ("Calibrating from a run's log");
the per-token symbols (q, c_t, k_t) are in ``by_age.py``.

| code name          | paper symbol         | how it is obtained here                                               |
|--------------------|----------------------|-----------------------------------------------------------------------|
| ``staleness``      | s = t - t_i          | the log's ``age`` column                                              |
| ``sigma_sq``       | sigma^2(s)/sigma^2(0)| proxy E_s[q] / E_0[q], plain form, relative to the youngest age      |
| ``mu``             | mu (rollout-cost)    | (sum gen s / sum generated rows) / (sum update s / sum trained rows)  |
| ``rho``            | rho                  | NOT measurable from a log: ``--rho`` or recorded as not measured      |
| ``b_noise``        | B_noise              | ``--grad-norms``: tr Sigma / |G|^2, two batch sizes (App. A.1)        |
| ``memory.kappa``   | kappa (issue 30)     | ``--grad-norms`` with curvature pairs: lr sum w^T H w / sum xi^T D xi |

Checked against exact profiles on the simulator (``python -m replay_theory.experiments.proxy_check``).

The noise scale B_noise (McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training",
arXiv 1812.06162, Eq. 2.11 and App. A.1) needs gradients: a log of log-probs and advantages cannot give it.
``--grad-norms FILE`` reads per-step squared norms of the mean-loss gradient at two batch sizes (the TRL trainer
writes them to ``noise_scale.jsonl``: ``integrations/trl.py``) and pools them with
``theory.noise_scale.pooled_two_batch`` into the profile's "noise_scale" record. Where the file also carries
curvature pairs (``curvature_num``, ``curvature_den``, ``curvature_lr``, ``curvature_beta1``: the TRL trainer's,
``integrations/trl.py``), the optimizer's memory kappa = sum eta_i num_i / sum den_i with a bootstrap over pairs
(``theory.profiles.curvature_pairs_record``) goes beside it into the profile's "memory" record.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np

from ..checks import require_in_range, require_integer, require_number, require_one_of, require_open_interval
from ..theory.noise import DEFAULT_DRAWS, DEFAULT_LEVEL
from ..theory.noise_scale import noise_scale_two_batch, pooled_two_batch
from ..theory.profiles import curvature_pairs_record, drift_line
from ..theory.resampling import percentile_interval, unit_weights
from .by_age import AGGREGATIONS, SCORES, WEIGHTS, SequenceSums, age_step_sums, read_step_times
from .errors import ConfigError, check_field
from .reader import (
    FORMATS,
    LogReader,
    check_log_options,
    detect_format,
    missing_column,
    read_schema,
    require_pyarrow,
)
from .schema import REQUIRED, STEP_TIME_COLUMNS, ColumnMap, resolve_columns

#: the log column with the optimizer step a row was trained at (TRL export and verl hook).
STEP_COLUMN = "step"
#: an age enters the table only with at least this many sequences (one sequence is no average).
MIN_SEQUENCES = 2
PROXY_NAME = "per-sample gradient second moment E||G_s||^2 / E||G_0||^2 from importance weights, advantages " \
             "and current log-probs"
ASSUMPTIONS = (
    "plain form: sigma^2(s) = E||G_s - grad F||^2 ~ E||G_s||^2 (per-sample signal small against its noise, "
    "||grad F||^2 << E||G||^2; an unbiased importance-weighted loss, c_t = w_t A_t)",
    "the score vectors grad log pi_theta of different tokens are uncorrelated",
    "||grad log pi_theta(y_t)||^2 = kappa k_t, kappa a constant independent of age and importance weight; "
    "k_t = (1 - pi_theta(y_t))^2 (score=logit: the logit-space softmax score norm, within a factor 2) or 1 "
    "(score=constant)",
    "sigma_sq is relative: sigma^2(s) / sigma^2(youngest age); the absolute scale needs gradients (it cancels in "
    "Thm 3.5's design, not in the finite-budget bound)",
    "mu = (generation seconds per generated row) / (update seconds per trained row), the rollout-cost convention; "
    "wall seconds on the run's own hardware, rows trained at a step = sequences logged at that step",
)
NOT_MEASURED = (
    "rho (Assumption 3.3's cross-step gradient correlation): needs per-sample gradients",
    "the retained signal r(s) and hence the signal-normalised sigma^2 a clipped loss (GRPO's PPO clip) needs",
    "the absolute noise scale sigma^2(0)",
)
#: the per-step columns of a two-batch gradient-norm file (``noise_scale.jsonl``); ``unit_size`` is optional.
GRAD_NORM_COLUMNS = ("step", "grad_sq_small", "grad_sq_big", "batch_small", "batch_big")
#: optional per-step columns of a curvature pair (kappa, issue 30), on the steps that measured one.
CURVATURE_COLUMNS = ("curvature_num", "curvature_den", "curvature_lr", "curvature_beta1")
KAPPA_NOT_MEASURED = ("kappa (the optimizer's memory) needs curvature pairs: --grad-norms from `replay-theory "
                      "trl-replay` (its trainer logs a pair every --curvature-every steps), or `replay-theory validate "
                      "calibrate-model` / calibrate-simulator")
GRAD_NORM_FORMATS = ("jsonl", "csv")
DRIFT_NOT_MEASURED = ("the drift M2(s) of older rollouts (--drift FILE: rollouts of steps T - 1, T - 2, T - 4, ... "
                      "re-scored at the last policy T, with an age column; trl-replay writes RUN/drift.parquet); "
                      "without it optimal prices staleness from the sigma^2(s) table, or none")
B_NOISE_NOT_MEASURED = ("b = B_noise / B cannot be measured from log-probs alone (it needs gradients): pass "
                        "--grad-norms DIR/noise_scale.jsonl from `replay-theory trl-replay` (the TRL trainer's "
                        "two-batch measurement) or the noise log of a verl run (+trainer.noise_log with "
                        "integrations.verl.VerlGradNoiseMixin on its engine), or run `replay-theory validate "
                        "calibrate-model`")


@dataclass(frozen=True)
class CalibrateLogConfig:
    """Everything ``calibrate --from-log`` needs; every field is checked in ``__post_init__`` (before any work)."""

    path: str
    """Exported diagnose log (Parquet, CSV or JSON lines) with ages, advantages and log-probs, plus the step time
    columns for mu (NeMo-RL's, SkyRL's and slime's step files carry neither ages nor times)."""
    preset: str = "default"
    """Column names, as ``diagnose --preset`` reads them: default, trl, verl, nemo-rl, skyrl or slime."""
    columns: Optional[str] = None
    """Overrides of the preset's column names, e.g. 'logp_behav=old_logp,age=version_gap'."""
    format: str = "auto"
    """auto (from the suffix), parquet, csv or jsonl; must match the file's contents."""
    mu: Optional[float] = None
    """mu = rollout cost / per-sample update cost, a finite number > 0, instead of measuring it from the time
    columns (Sec. 2, App. E)."""
    rho: Optional[float] = None
    """rho of Assumption 3.3 in [0, 1], recorded as given (a log cannot measure it)."""
    weight: str = "token"
    """Importance weight the loss uses: token or sequence (w_t, or prod w_t)."""
    aggregation: str = "token-mean"
    """How the loss averages tokens: token-mean, seq-mean-token-sum or seq-mean-token-mean."""
    score: str = "logit"
    """Per-token score norm: logit ((1 - p)^2, p = current token prob) or constant."""
    level: float = DEFAULT_LEVEL
    draws: int = DEFAULT_DRAWS
    seed: int = 0
    chunk_rows: int = 65536
    grad_norms: Optional[str] = None
    """Per-step squared gradient norms at two batch sizes (JSON lines or CSV with step, grad_sq_small, grad_sq_big,
    batch_small, batch_big; trl-replay's noise_scale.jsonl): adds B_noise with its bootstrap interval to the profile,
    and kappa where the file has curvature pairs (curvature_num, curvature_den, curvature_lr, curvature_beta1)."""
    drift: Optional[str] = None
    """A re-scored log, read with the same --preset and --columns (trl-replay's drift.parquet, the TRL trainer's
    drift_log): rollouts of steps T - s with their log-probs at generation and at the run's last policy T, an age
    column s; adds the drift M2(s) by age, which optimal --profile prices staleness at (r(s) = 1 + M2(s))."""

    def __post_init__(self) -> None:
        if self.mu is not None:
            check_field(require_number, "mu", self.mu, above=0, finite=True,
                        note=" (rollout cost / per-sample update cost)", fmt="g")
        if self.rho is not None:
            check_field(require_in_range, "rho", self.rho, 0, 1, note=" (the range Assumption 3.3 and optimal allow)")
        for name, value, valid in (("weight", self.weight, WEIGHTS), ("aggregation", self.aggregation, AGGREGATIONS),
                                   ("score", self.score, SCORES)):
            check_field(require_one_of, name, value, valid)
        if self.format not in ("auto", *FORMATS):
            raise ConfigError("format", f"must be auto, {', '.join(FORMATS)}; got {self.format!r}")
        check_field(require_open_interval, "level", self.level, 0, 1, fmt="g")
        check_field(require_integer, "draws", self.draws, 2)
        resolve_columns(self.preset, self.columns)


def _dump_names(config: CalibrateLogConfig, dump: str, age: Optional[str], path: Path) -> list[str]:
    """The columns of a framework's own files (``dump``, dumps.py: the first file gives them), which calibrate can
    read only with a per-row ``age`` column and ``--mu``."""
    from .dumps import MISSING, DumpSource

    names = list(DumpSource(dump, path).schema.names)
    has_age = bool(age and age in names)
    if config.mu is None or not has_age:
        # one line: what the files lack and what calibrate then needs; diagnose reads them as they are
        needs = [need for lacking, need in ((not has_age, "a per-row age (--columns age=NAME)"),
                                            (config.mu is None, "--mu MU")) if lacking]
        raise ConfigError("preset", f"{config.preset}: {MISSING[dump]}, so calibrate --from-log needs "
                                    f"{' and '.join(needs)} (mu = rollout cost / per-sample update cost, > 0); "
                                    "diagnose reads the files as they are")
    return names


def _check_columns(config: CalibrateLogConfig, columns: ColumnMap, names: list[str], path: Path) -> None:
    """The log has the required columns, an age and an advantage, and (without ``--mu``) the step time columns."""
    for field in REQUIRED:  # first, as diagnose does: a log of another preset gets the --preset to pass
        if getattr(columns, field) not in names:
            raise ValueError(missing_column(path.name, field, getattr(columns, field), names))
    for field in ("age", "advantage"):
        name = getattr(columns, field)
        if not name or name not in names:
            raise ConfigError("columns", f"must map {field}: the log has no {field} column "
                                         f"{name!r} (columns: {', '.join(names[:14])}); give --columns {field}=NAME")
    missing = [c for c in (STEP_COLUMN, *STEP_TIME_COLUMNS) if c not in names]
    if config.mu is None and missing:
        raise ConfigError("mu", f"is needed: {path.name} has no {', '.join(missing)} column"
                                f"{'s' if len(missing) > 1 else ''} to measure it; give --mu MU (> 0, rollout cost / "
                                "per-sample update cost)")


def check_drift(config: CalibrateLogConfig) -> None:
    """``--drift``'s file, schema only, before any work: readable, the two log-prob columns and an age column."""
    if config.drift is None:
        return
    path = Path(config.drift)
    columns = resolve_columns(config.preset, config.columns)
    if columns.dump:
        raise ConfigError("drift", f"is read as a table (--preset trl, verl or default), not {config.preset}'s "
                                   "step files")
    check_log_options(path, columns, "auto", config.chunk_rows)
    names = list(read_schema(path, detect_format(path, "auto")).names)
    for field in REQUIRED:
        if getattr(columns, field) not in names:
            raise ValueError(missing_column(path.name, field, getattr(columns, field), names))
    if not columns.age or columns.age not in names:
        raise ConfigError("drift", f"{path.name} has no age column {columns.age!r}: give the re-scored log "
                                   "(trl-replay's drift.parquet)")


def plan(config: CalibrateLogConfig) -> LogReader:
    """Check the log and its columns (schema only) and build the reader: one-line errors, no data read.

    The step rides in the reader's ``reward`` field (calibration reads no reward), mapped only when the log has it.
    """
    path = Path(config.path)
    columns = resolve_columns(config.preset, config.columns)
    check_log_options(path, columns, config.format, config.chunk_rows)
    require_pyarrow()
    if columns.dump:
        names = _dump_names(config, columns.dump, columns.age, path)
    else:
        names = list(read_schema(path, detect_format(path, config.format)).names)
    _check_columns(config, columns, names, path)
    streamed = replace(columns, reward=STEP_COLUMN if STEP_COLUMN in names else None)  # a sequence's step, any layout
    return LogReader(path, streamed, fmt=config.format, chunk_rows=config.chunk_rows)


def sha256(path: str | Path) -> str:
    """The file's SHA-256; a folder (a dump preset's step files): that of its files' names and hashes, in order."""
    digest = hashlib.sha256()
    path = Path(path)
    if path.is_dir():
        for child in sorted(p for p in path.iterdir() if p.is_file()):
            digest.update(f"{child.name}\0{sha256(child)}\n".encode())
        return digest.hexdigest()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def estimate_mu(times: dict[str, np.ndarray], trained: dict[float, int], level: float, draws: int,
                seed: int) -> dict:
    """mu from one value per step, with a bootstrap over steps (``level`` percentile interval)."""
    steps = times["step"]
    gen_s, upd_s, gen_rows = (times[c] for c in STEP_TIME_COLUMNS)  # generation s, update s, generated rows
    rows = np.asarray([trained.get(float(s), 0) for s in steps], dtype=np.float64)
    if np.any(gen_s < 0) or np.any(upd_s < 0) or np.any(gen_rows < 0):
        raise ValueError("the log's step time columns hold negative values")
    if gen_rows.sum() <= 0 or upd_s.sum() <= 0 or rows.sum() <= 0 or gen_s.sum() <= 0:
        raise ConfigError("mu", "cannot be measured: the log's time columns sum to 0 generated rows, generation or "
                                "update seconds; give --mu MU (> 0)")
    per_row_gen = gen_s.sum() / gen_rows.sum()
    per_row_upd = upd_s.sum() / rows.sum()
    w = unit_weights(steps.size, draws, np.random.default_rng(seed))  # (draws, U)
    with np.errstate(invalid="ignore", divide="ignore"):
        ci = percentile_interval((w @ gen_s) * (w @ rows) / ((w @ gen_rows) * (w @ upd_s)), level) \
            if steps.size >= 2 else (math.nan, math.nan)
    return {"value": float(per_row_gen / per_row_upd), "ci": [c if math.isfinite(c) else None for c in ci],
            "level": level, "source": "log", "steps": int(steps.size), "generation_seconds_per_row": float(per_row_gen),
            "update_seconds_per_row": float(per_row_upd), "generated_rows": float(gen_rows.sum()),
            "trained_rows": float(rows.sum()), "convention": "rollout-cost",
            "units": "bootstrap over steps (one value per step of each time column)"}


def profile_table(sums: dict[str, np.ndarray], level: float, draws: int, seed: int) -> dict:
    """The relative table by age, with a bootstrap over steps; ages with < MIN_SEQUENCES or q = 0 are left out."""
    ages, q, count = sums["ages"], sums["q"], sums["count"]
    seqs = count.sum(0)  # (K,)
    mean = np.divide(q.sum(0), seqs, out=np.zeros_like(seqs), where=seqs > 0)
    keep = (seqs >= MIN_SEQUENCES) & (mean > 0)
    if keep.sum() < 2:
        raise ValueError(f"the log has usable sequences (>= {MIN_SEQUENCES} with a non-zero advantage) at "
                         f"{int(keep.sum())} age(s) ({', '.join(f'{a:g}' for a in ages[keep]) or 'none'}): a profile "
                         "needs >= 2 ages; log a run whose buffer holds stale rows (N > R)")
    base = int(np.flatnonzero(keep)[0])
    values = mean[keep] / mean[base]
    U = q.shape[0]
    cis = [[None, None]] * int(keep.sum())  # no interval from one unit
    if U >= 2:
        w = unit_weights(U, draws, np.random.default_rng(seed))  # (draws, U)
        with np.errstate(invalid="ignore", divide="ignore"):
            boot = (w @ q) / (w @ count)  # (draws, K)
            boot = boot[:, keep] / boot[:, [base]]
        cis = [list(percentile_interval(boot[:, k], level)) for k in range(int(keep.sum()))]
    return {"staleness": [float(a) for a in ages[keep]], "sigma_sq": [float(v) for v in values],
            "ci": [[None if c is None or not math.isfinite(c) else float(c) for c in ci] for ci in cis],
            "sequences": [int(c) for c in seqs[keep]], "units": int(U),
            "left_out": {f"{a:g}": int(c) for a, c, k in zip(ages, seqs, keep) if not k},
            "normalised_at": float(ages[base])}


def _grad_norm_format(path: Path) -> str:
    """The gradient-norm file's format (its suffix), after checking it is a file of a known format."""
    if not path.is_file():
        raise ConfigError("grad_norms", f"{path} is not a file (not found, or a directory)")
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in GRAD_NORM_FORMATS:
        raise ConfigError("grad_norms", f"{path} must be JSON lines (.jsonl) or CSV (.csv) with the columns "
                                        f"{', '.join(GRAD_NORM_COLUMNS)}")
    return fmt


def _jsonl_rows(fh, path: Path) -> list[dict]:
    """The JSON objects of a JSON-lines file, one per non-blank line; each line checked to be an object."""
    import json

    rows: list[dict] = []
    for number, line in enumerate(fh, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise ConfigError("grad_norms", f"{path} line {number} is not a JSON object") from None
            if not isinstance(rows[-1], dict):
                raise ConfigError("grad_norms", f"{path} line {number} is not a JSON object")
    return rows


def _grad_norm_rows(path: Path, fmt: str) -> list[dict]:
    """The gradient-norm file's rows, one dict per step, from CSV or JSON lines."""
    import csv

    with open(path, newline="", encoding="utf-8-sig") as fh:  # a byte-order mark, as logs may have
        if fmt == "csv":
            return list(csv.DictReader(fh))
        return _jsonl_rows(fh, path)


def _grad_norm_columns(rows: list[dict], path: Path) -> tuple[str, ...]:
    """The columns to read (``unit_size`` too when the first row has it), checked on every row; >= 2 rows."""
    needed = (*GRAD_NORM_COLUMNS, "unit_size") if rows and "unit_size" in rows[0] else GRAD_NORM_COLUMNS
    missing = [c for c in needed if any(c not in r or r[c] in (None, "") for r in rows)]
    if rows and missing:
        raise ConfigError("grad_norms", f"{path} has no {', '.join(missing)} column{'s' if len(missing) > 1 else ''} "
                                        f"on every step (needs {', '.join(GRAD_NORM_COLUMNS)})")
    if len(rows) < 2:
        raise ConfigError("grad_norms", f"{path} holds {len(rows)} step{'' if len(rows) == 1 else 's'}: the two-batch "
                                        "estimate needs >= 2 (its interval resamples steps)")
    return needed


def _grad_norm_arrays(rows: list[dict], needed: tuple[str, ...], path: Path) -> dict[str, np.ndarray]:
    """The needed columns as float arrays (steps,); every value must be a number."""
    try:
        return {c: np.asarray([float(r[c]) for r in rows], dtype=np.float64) for c in needed}
    except (TypeError, ValueError):
        raise ConfigError("grad_norms", f"{path} holds a value that is not a number in {', '.join(needed)}") from None


def _first_bad(data: dict[str, np.ndarray], bad: np.ndarray, column: str) -> str:
    """The first flagged value of a column and its step, as an error message shows it."""
    i = int(np.flatnonzero(bad)[0])
    return f"{data[column][i]:g} at step {data['step'][i]:g}"


def _check_grad_norm_values(data: dict[str, np.ndarray], path: Path) -> None:
    """Squared norms finite and >= 0, batch sizes > 0, batch_big > batch_small, on every step."""
    for column in ("grad_sq_small", "grad_sq_big"):  # a squared norm: finite and >= 0
        bad = ~(np.isfinite(data[column]) & (data[column] >= 0))
        if bad.any():
            raise ConfigError("grad_norms", f"{path}: {column} must be a finite number >= 0 at every step, got "
                                            f"{_first_bad(data, bad, column)}")
    for column in ("batch_small", "batch_big"):
        bad = ~(np.isfinite(data[column]) & (data[column] > 0))
        if bad.any():
            raise ConfigError("grad_norms", f"{path}: {column} must be > 0 (samples) at every step, got "
                                            f"{_first_bad(data, bad, column)}")
    bad = ~(data["batch_big"] > data["batch_small"])
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ConfigError("grad_norms", f"{path}: batch_big must exceed batch_small at every step, got "
                                        f"{data['batch_big'][i]:g} <= {data['batch_small'][i]:g} at step "
                                        f"{data['step'][i]:g}")


def _unit_size(unit: Optional[np.ndarray], path: Path) -> Optional[int]:
    """The file's one unit size (None when it has no ``unit_size`` column), checked to be an integer >= 1."""
    if unit is not None and not (np.all(unit == unit[0]) and unit[0] >= 1 and unit[0] == int(unit[0])):
        raise ConfigError("grad_norms", f"{path}: unit_size must be one integer >= 1 on every step, got "
                                        f"{', '.join(f'{u:g}' for u in np.unique(unit))}")
    return None if unit is None else int(unit[0])


def read_grad_norms(path: str | Path) -> dict[str, np.ndarray]:
    """The per-step two-batch squared norms of a JSON-lines (.jsonl) or CSV (.csv) file, every value checked.

    Columns ``GRAD_NORM_COLUMNS`` (more are ignored; ``unit_size``, if present, must be one integer >= 1 on every
    step). Returns float arrays (steps,) by column, plus ``unit_size`` (int, or None when the file has none).
    Raises a one-line :class:`ConfigError` on the field ``grad_norms``: a missing file, an unknown format, a missing
    column, fewer than 2 steps (the interval resamples steps), a negative or non-finite squared norm, a batch size
    <= 0 or a batch_big <= batch_small.
    """
    path = Path(path)
    rows = _grad_norm_rows(path, _grad_norm_format(path))
    needed = _grad_norm_columns(rows, path)
    data = _grad_norm_arrays(rows, needed, path)
    _check_grad_norm_values(data, path)
    data["unit_size"] = _unit_size(data.pop("unit_size", None), path)
    data["curvature"] = _curvature_pairs(rows, path)
    return data


def _curvature_pairs(rows: list[dict], path: Path) -> Optional[dict[str, np.ndarray]]:
    """The curvature pairs of a gradient-norm file (``CURVATURE_COLUMNS`` on the steps that carry
    ``curvature_num``), checked, as arrays; None when no step carries one. One-line :class:`ConfigError` on the field
    ``grad_norms``: a pair without all its columns, a non-finite value, a denominator < 0, a learning rate <= 0, or
    beta1 outside [0, 1) or not one value (kappa is one optimizer's)."""
    pairs = [r for r in rows if r.get("curvature_num") not in (None, "")]
    if not pairs:
        return None
    missing = [c for c in CURVATURE_COLUMNS if any(r.get(c) in (None, "") for r in pairs)]
    if missing:
        raise ConfigError("grad_norms", f"{path}: a step with curvature_num has no {', '.join(missing)} (a curvature "
                                        f"pair needs {', '.join(CURVATURE_COLUMNS)})")
    try:
        data = {c: np.asarray([float(r[c]) for r in pairs], dtype=np.float64) for c in ("step", *CURVATURE_COLUMNS)}
    except (TypeError, ValueError):
        raise ConfigError("grad_norms", f"{path} holds a curvature value that is not a number") from None
    for column, ok, text in (("curvature_num", np.isfinite(data["curvature_num"]), "a finite number"),
                             ("curvature_den", np.isfinite(data["curvature_den"]) & (data["curvature_den"] >= 0),
                              "a finite number >= 0"),
                             ("curvature_lr", np.isfinite(data["curvature_lr"]) & (data["curvature_lr"] > 0),
                              "a finite number > 0"),
                             ("curvature_beta1", (data["curvature_beta1"] >= 0) & (data["curvature_beta1"] < 1),
                              "in [0, 1)")):
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            raise ConfigError("grad_norms", f"{path}: {column} must be {text} on every curvature pair, got "
                                            f"{data[column][i]:g} at step {data['step'][i]:g}")
    if not np.all(data["curvature_beta1"] == data["curvature_beta1"][0]):
        raise ConfigError("grad_norms", f"{path}: curvature_beta1 must be one value (one optimizer), got "
                                        f"{', '.join(f'{b:g}' for b in np.unique(data['curvature_beta1']))}")
    data["batch"] = np.asarray([float(r["batch_big"]) for r in pairs])
    return data


def memory_record(norms: dict[str, np.ndarray], *, source: str, level: float = DEFAULT_LEVEL, draws: int = 1000,
                  seed: int = 0) -> Optional[dict]:
    """The profile's "memory" record from a gradient-norm file's curvature pairs (``read_grad_norms``' arrays):
    kappa = sum eta_i num_i / sum den_i (Adam's preconditioned coordinates: the TRL trainer's AdamW), a bootstrap
    over pairs (``theory.profiles.curvature_pairs_record``; a pair with xi = 0 adds 0 / 0: left out, counted).
    None when the file carries no pairs."""
    pairs = norms.get("curvature")
    if pairs is None:
        return None
    batch = pairs["batch"]
    return {**curvature_pairs_record(pairs["curvature_num"], pairs["curvature_den"], pairs["curvature_lr"],
                                     np.random.default_rng(seed + 1), optimizer="adam",
                                     beta1=float(pairs["curvature_beta1"][0]),
                                     pilot_batch=float(batch[0]) if np.all(batch == batch[0]) else None,
                                     level=level, n_boot=draws),
            "source": source}


def memory_lines(record: dict) -> list[str]:
    """The summary line of a "memory" record: kappa, its interval and the memory 1/kappa in steps."""
    if record["kappa"] is None:
        return [f"kappa: not measured: {record['reason']}"]
    lo, hi = record["kappa_interval"]
    interval = "[" + ", ".join("nan" if v is None else f"{v:.4g}" for v in (lo, hi)) + "]"
    return [f"kappa = {record['kappa']:.4g} ({record['level']:.0%} interval {interval}, bootstrap over "
            f"{record['units']} curvature pairs, {record['optimizer']} beta1 {record['beta1']:g}): the optimizer's "
            f"memory 1/kappa = {1 / record['kappa']:.3g} steps"]


def _kappa_flags(data: dict) -> str:
    """``optimal``'s flags for a measured kappa (the profile carries it too), else nothing."""
    record = data.get("memory")
    if not record or record["kappa"] is None:
        return ""
    return f" --kappa {record['kappa']:.4g} --optimizer {record['optimizer']} --beta1 {record['beta1']:g}"


def noise_scale_record(norms: dict[str, np.ndarray], *, unit_size: int, source: str, level: float = DEFAULT_LEVEL,
                       draws: int = 1000, seed: int = 0) -> dict:
    """The profile file's "noise_scale" record from per-step two-batch squared norms (``read_grad_norms``' arrays).

    B_noise = ratio of the step means of tr Sigma and |G|^2 (McCandlish App. A.1, ``pooled_two_batch``) with a
    bootstrap interval over steps; batch sizes are in samples, so B_noise is in samples whatever ``unit_size`` (the
    group size kept whole in each half: recorded, not multiplied in). Steps whose batch sizes differ (halves that
    keep groups whole are unequal) are first mapped, exactly, onto common sizes B_s*, B_b* (the harmonic means):
    each step's unbiased parts |G|^2_t, tr Sigma_t (Eqs. A.2-A.3) give |g|^2 at B* as |G|^2_t + tr Sigma_t / B*,
    so the pooled ratio is mean_t tr Sigma_t / mean_t |G|^2_t, as with equal sizes. ``batch``: the run's B (the
    big batch) when every step has the same whole one, else None.
    """
    small, big = norms["grad_sq_small"], norms["grad_sq_big"]  # (steps,)
    b_small, b_big = norms["batch_small"], norms["batch_big"]  # (steps,)
    if np.all(b_small == b_small[0]) and np.all(b_big == b_big[0]):
        ref_small, ref_big = float(b_small[0]), float(b_big[0])
    else:
        ref_small, ref_big = 1 / float(np.mean(1 / b_small)), 1 / float(np.mean(1 / b_big))  # B_s* < B_b* stepwise
        parts = [noise_scale_two_batch(s, g, bs, bb) for s, g, bs, bb in zip(small, big, b_small, b_big)]
        grad_sq = np.array([p.grad_sq for p in parts])  # (steps,) |G|^2_t, Eq. A.2
        trace = np.array([p.trace_sigma for p in parts])  # (steps,) tr Sigma_t, Eq. A.3
        small, big = grad_sq + trace / ref_small, grad_sq + trace / ref_big  # E|g_B|^2 = |G|^2 + tr Sigma / B
    pooled = pooled_two_batch(small, big, ref_small, ref_big, np.random.default_rng(seed), n_boot=draws, level=level)
    whole = np.all(b_big == b_big[0]) and b_big[0] == int(b_big[0])
    return {**pooled.to_dict(), "batch": int(b_big[0]) if whole else None, "unit_size": int(unit_size),
            "source": source}


def noise_scale_lines(record: dict) -> list[str]:
    """The summary lines of a "noise_scale" record (B_noise, its interval, b = B_noise / B)."""
    lo, hi = record["b_noise_interval"]
    interval = "[" + ", ".join("inf" if v is None else f"{v:.4g}" for v in (lo, hi)) + "]"  # None: infinite
    if record["b_noise"] is None:
        return [f"B_noise: no measurable signal over {record['checkpoints']} steps (the two-batch |G|^2 <= 0; "
                f"{record['level']:.0%} interval {interval}): the gradient noise swamps its mean at this batch; "
                "measure more steps, or a larger batch"]
    unit = f"groups of {record['unit_size']} kept whole" if record["unit_size"] > 1 else "one sample a unit"
    line = (f"B_noise = {record['b_noise']:.4g} samples ({record['level']:.0%} interval {interval}, bootstrap over "
            f"{record['checkpoints']} steps, {record['method']}, {unit})")
    if record["batch"] is not None:
        line += f"; b = B_noise / B = {record['b_noise'] / record['batch']:.4g} at B = {record['batch']}"
    return [line]


def calibrate_from_log(config: CalibrateLogConfig, reader: Optional[LogReader] = None,
                       norms: Optional[dict[str, np.ndarray]] = None) -> dict:
    """One pass over the log (``reader``: :func:`plan`'s) -> the profile dict ``optimal --profile`` reads.

    With ``config.grad_norms`` (``norms``: :func:`read_grad_norms`' arrays, read here when None) the profile gets the
    "noise_scale" record; without, ``not_measured`` says that B_noise needs gradients and how to get them.
    """
    from .. import __version__

    if config.grad_norms is not None and norms is None:
        norms = read_grad_norms(config.grad_norms)  # checked before the log is read
    reader = reader or plan(config)
    sums = SequenceSums(config.weight, config.aggregation, config.score)
    for chunk in reader:
        sums.fold(chunk, reader.path.name)
    per_seq = sums.per_sequence()
    if per_seq["log_q"].size == 0:
        raise ValueError(f"{reader.path.name}: no valid tokens to calibrate from")
    no_table = ""  # why there is no sigma^2(s) table, when there is none
    try:
        table = profile_table(age_step_sums(per_seq), config.level, config.draws, config.seed)
    except ValueError as err:  # an on-policy pilot has one age: with --grad-norms its B_noise is still the answer
        if norms is None:
            raise
        table, no_table = None, str(err)
    if config.mu is None:
        times = read_step_times(reader.path, STEP_COLUMN, config.format)
        steps, counts = np.unique(per_seq["step"][np.isfinite(per_seq["step"])], return_counts=True)
        mu = estimate_mu(times, dict(zip(steps.tolist(), counts.tolist())), config.level, config.draws, config.seed)
    else:
        mu = {"value": config.mu, "ci": [None, None], "source": "--mu (given by the user)",
              "convention": "rollout-cost"}
    rho_note = ("rho is Assumption 3.3's correlation of per-sample gradient noise across steps: a log of log-probs "
                "and advantages cannot measure it (validate calibrate-model or calibrate-simulator measure it with "
                "gradients)")
    provenance = {"log": str(reader.path.resolve()), "sha256": sha256(reader.path), "preset": config.preset,
                  "columns": reader.used, "format": reader.format, "layout": reader.layout, "code_version": __version__}
    zero = zero_share_record(per_seq["max_abs_advantage"], reader.path)
    if table is None:  # {"kind": "noise_scale"}: the profile file of a measured noise scale alone (optimal reads it)
        data = {"kind": "noise_scale", "source": f"replay-theory calibrate --from-log {reader.path}", "mu": mu,
                "not_measured": [f"sigma^2(s): {no_table}"], "provenance": provenance, **zero}
        return _with_noise_scale(data, config, norms)
    data: dict = {
        "kind": "table", "staleness": table["staleness"], "sigma_sq": table["sigma_sq"], "sigma_sq_form": "plain",
        "source": f"replay-theory calibrate --from-log {reader.path}",
        "proxy": {"name": PROXY_NAME, "weight": config.weight, "aggregation": config.aggregation,
                  "score": config.score, "scale": f"relative: sigma_sq = 1 at age {table['normalised_at']:g}",
                  "ci": table["ci"], "level": config.level, "sequences_by_age": table["sequences"],
                  "units": f"{table['units']} steps (bootstrap units)" if "reward" in reader.used else
                  "1 (no step column: no interval)", "ages_left_out": table["left_out"],
                  "tokens": sums.tokens, "sequences": int(per_seq["log_q"].size)},
        "mu": mu, "assumptions": list(ASSUMPTIONS), "not_measured": list(NOT_MEASURED), "provenance": provenance,
        **zero,
    }
    if config.rho is not None:
        data["rho"] = float(config.rho)
        data["rho_record"] = {"value": float(config.rho), "source": "--rho (given by the user, not measured)"}
    else:
        # no "rho" key and an unusable fit: optimal --profile refuses to run without --rho (never a silent default)
        data["rho_fit"] = {"value": None, "ci": [None, None], "in_range": False, "measurable": False, "note": rho_note}
        data["rho_record"] = {"value": None, "source": "not measured", "note": rho_note}
    data["notes"] = ["sigma_sq is the plain form; for a clipped loss (GRPO) the theory needs the signal-normalised "
                     "form, which needs gradients (validate calibrate-model)"]
    return _with_noise_scale(data, config, norms)


ZERO_ADVANTAGE_RTOL = 1e-3
"""A sequence's advantage counts as zero when its largest |A| is at most this share of the log's largest: a group of
equal rewards leaves only rounding (TRL's (r - mean) / (std + 1e-4) in float32 logs |A| = 7.4e-05 for eight rewards
of 0.1), while an informative group's |A| is a sizeable share of the largest (GRPO's scale: 0.1 to 2.5 in the TRL
probe of docs/TRL.md, whose share below the cut, 0.466, is TRL's own frac_reward_zero_std, 0.469)."""


def zero_share_record(max_abs_advantage: np.ndarray, path: Path) -> dict:
    """{"zero_share": {...}}: the share z of logged sequences whose advantage is zero on every token, up to the
    rounding ``ZERO_ADVANTAGE_RTOL`` allows: the sequences of groups whose rewards are all equal (TRL's
    frac_reward_zero_std for groups of one size; optimal --profile prices selective replay with it, docs/THEORY.md
    [E8]); {} when every sequence has a zero advantage (no gradient at all, a z of 1 prices nothing)."""
    largest = np.asarray(max_abs_advantage, dtype=float)  # (n,) max |A| per sequence
    top = float(largest.max()) if largest.size else 0.0
    zero = largest <= ZERO_ADVANTAGE_RTOL * top
    if not top > 0 or zero.all():
        return {}
    return {"zero_share": {"value": float(zero.mean()), "sequences": int(largest.size),
                           "cut": ZERO_ADVANTAGE_RTOL * top,
                           "source": f"calibrate --from-log {path.name}: {int(zero.sum())} of {largest.size} sequences "
                                     f"with |A| <= {ZERO_ADVANTAGE_RTOL:g} x the log's largest on every token"}}


DRIFT_MAX_AGES = 1024
"""The most distinct ages a --drift file may hold: diagnose pools ages into buckets beyond it, which a table by age
cannot use."""


def drift_record(path: str | Path, preset: str = "default", columns: Optional[str] = None, fmt: str = "auto") -> dict:
    """The profile's "drift" record from a re-scored log: M2(s) = token mean of (logp_current - logp_behav)^2 at each
    age s > 0 (``diagnose``'s by-age m2, one implementation: theory/moments.py), with M2(0) = 0 (the last policy
    against itself); rows at age 0 are left out (their ratio is a sampler's mismatch, not drift). A one-line
    ValueError without an age column or an age > 0."""
    from .pipeline import DiagnoseConfig, diagnose

    report = diagnose(DiagnoseConfig(path=str(path), preset=preset, columns=columns, format=fmt, run_what_if=False,
                                     max_age_buckets=DRIFT_MAX_AGES))
    if any(r["age_min"] != r["age_max"] for r in report["by_age"]):  # diagnose pooled ages: refuse, never drop them
        raise ConfigError("drift", f"{Path(path).name} holds more than {DRIFT_MAX_AGES} distinct ages; a drift table "
                                   "needs a few (trl-replay's: 1, 2, 4, ..., 64 and the run's first)")
    rows = [r for r in report["by_age"] if r["age"] > 0]
    if not rows:
        raise ConfigError("drift", f"{Path(path).name} has no rows of age > 0 (an age column mapped: "
                                   f"{report['columns'].get('age')!r}): give the re-scored log (trl-replay's "
                                   "drift.parquet)")
    return {"staleness": [0.0] + [float(r["age"]) for r in rows], "m2": [0.0] + [float(r["m2"]) for r in rows],
            "tokens": [0] + [int(r["n_tokens"]) for r in rows], "sha256": sha256(path),
            "source": f"calibrate --from-log --drift {Path(path).name}: rollouts of step T - s re-scored at T, "
                      "M2(s) = token mean of (log pi_T - log pi_T-s)^2"}


def drift_lines(record: dict) -> list[str]:
    """The drift table's line: M2(s) by age, what optimal --profile prices a sample of age s at (1 + M2(s))."""
    return [drift_line(record, f"{sum(record['tokens'])} tokens re-scored at the run's last policy")]


def _with_noise_scale(data: dict, config: CalibrateLogConfig, norms: Optional[dict[str, np.ndarray]]) -> dict:
    """``data`` with the "noise_scale" record of ``--grad-norms``, or with B_noise listed as not measured; and the
    "drift" record of ``--drift``, or the drift listed as not measured."""
    if config.drift is not None:
        data["drift"] = drift_record(config.drift, config.preset, config.columns)
        data["provenance"]["drift"] = {"path": str(Path(config.drift).resolve()), "sha256": data["drift"]["sha256"]}
    else:
        data["not_measured"].append(DRIFT_NOT_MEASURED)
    if config.grad_norms is not None:
        assert norms is not None  # calibrate_from_log reads them whenever config.grad_norms is set
        path = Path(config.grad_norms)
        unit = norms["unit_size"]
        data["noise_scale"] = noise_scale_record(
            norms, unit_size=unit or 1, level=config.level, draws=config.draws, seed=config.seed,
            source=f"replay-theory calibrate --grad-norms {path}: two-batch squared norms of the mean-loss gradient, "
                   f"{norms['step'].size} steps" + ("" if unit else " (no unit_size column: one sample is the unit)"))
        data["provenance"]["grad_norms"] = {"path": str(path.resolve()), "sha256": sha256(path)}
        memory = memory_record(norms, level=config.level, draws=config.draws, seed=config.seed,
                               source=f"replay-theory calibrate --grad-norms {path}: curvature pairs")
        if memory is not None:
            data["memory"] = memory
        else:
            data["not_measured"].append(f"kappa: no curvature pairs logged in {path.name}; {KAPPA_NOT_MEASURED}")
    else:
        data["not_measured"].append(KAPPA_NOT_MEASURED)
        data["not_measured"].append(B_NOISE_NOT_MEASURED)
    return data


def summary(data: dict, out: Path) -> str:
    """The printed summary and the next command."""
    prov, mu = data["provenance"], data["mu"]

    def ci(c):
        return "no interval" if c[0] is None or c[1] is None else f"[{c[0]:.3g}, {c[1]:.3g}]"

    lines = [f"calibrated from {prov['log']} (sha256 {prov['sha256'][:12]}, preset {prov['preset']})"]
    if data["kind"] == "table":
        lines[0] += (f": {data['proxy']['sequences']} sequences, {data['proxy']['tokens']} tokens, "
                     f"{data['proxy']['units']}")
    lines.append((f"mu = {mu['value']:.4g} (90% CI {ci(mu['ci'])} over {mu['steps']} steps): "
                  f"{mu['generation_seconds_per_row']:.4g} s per generated row / "
                  f"{mu['update_seconds_per_row']:.4g} s per trained row") if mu["source"] == "log" else
                 f"mu = {mu['value']:g} (given with --mu)")
    if data["kind"] == "noise_scale":  # no sigma^2(s) table: the noise-scale rule only
        lines += [f"no {data['not_measured'][0]}"] + noise_scale_lines(data["noise_scale"]) + _memory(data)
        lines += _zero_share_lines(data) + _drift(data)
        lines += [f"wrote {out}"] + _noise_scale_next(out, mu, data["noise_scale"], _kappa_flags(data))
        return "\n".join(lines)
    proxy = data["proxy"]  # kind "table" from here
    lines += [f"sigma^2(s) / sigma^2({data['staleness'][0]:g}), plain form, proxy ({proxy['weight']} weights, "
              f"{proxy['score']} score, {proxy['aggregation']}):", "  age  sequences  sigma^2 ratio  90% CI"]
    for k, (s, n, v, c) in enumerate(zip(data["staleness"], proxy["sequences_by_age"], data["sigma_sq"],
                                         proxy["ci"])):
        lines.append(f"  {s:>3g}  {n:>9d}  {v:>13.4g}  {ci(c) if k else '(the reference age)'}")
    if proxy["ages_left_out"]:
        lines.append("  left out (fewer than 2 sequences or zero advantages): ages "
                     + ", ".join(f"{a} ({n} seq)" for a, n in proxy["ages_left_out"].items()))
    lines.append(f"rho = {data['rho']:g} (given with --rho, not measured)" if "rho" in data else
                 "rho: not measurable from a log (a gradient correlation); optimal will ask for --rho")
    lines += noise_scale_lines(data["noise_scale"]) if "noise_scale" in data else [B_NOISE_NOT_MEASURED]
    lines += _memory(data) + _zero_share_lines(data) + _drift(data)
    if data["staleness"][-1] <= 1:
        lines.append("note: the table ends at age 1; optimal needs ages beyond 1 (log a run whose buffer holds "
                     "older rows, N > 2R)")
    rho = f" --rho {data['rho']:g}" if "rho" in data else " --rho RHO"
    lines.append(f"wrote {out}")
    record = data.get("noise_scale")
    rule = _noise_scale_next(out, mu, record, _kappa_flags(data)) if record is not None else []
    # optimal reads mu from the profile (--mu only where it is not the file's): the steps chain with the user's numbers
    given = "" if mu["source"] == "log" else f" --mu {mu['value']:g}"
    lines += rule + [f"{'or' if rule else 'next'}: replay-theory optimal --objective paper --profile {out}{given}{rho}"]
    return "\n".join(lines)


def _drift(data: dict) -> list[str]:
    """The drift table's lines, or one line saying how to measure it."""
    if "drift" in data:
        return drift_lines(data["drift"])
    return [f"not measured: {DRIFT_NOT_MEASURED}"]


def _zero_share_lines(data: dict) -> list[str]:
    """The zero share's line: what optimal --profile reads it for."""
    record = data.get("zero_share")
    if record is None:
        return ["zero share: every logged sequence has a zero advantage (no gradient in this log)"]
    what = ("optimal --profile prices selective replay with it" if record["value"] > 0 else
            "no group of equal rewards, so optimal --profile prices no selective replay (a run that drops them, "
            "dynamic sampling or verl's filter_groups, logs none: give the share it generated with --zero-share)")
    return [f"zero share z = {record['value']:.3g} ({record['source'].split(': ', 1)[1]}): {what}"]


def _memory(data: dict) -> list[str]:
    """The kappa line: measured (``memory_lines``), or why not (with --grad-norms only: without it B_noise's line
    already says that gradients are needed)."""
    if "memory" in data:
        return memory_lines(data["memory"])
    return [line.split(";")[0] for line in data["not_measured"] if line.startswith("kappa: no curvature pairs")]


def _noise_scale_next(out, mu: dict, record: dict, kappa: str = "") -> list[str]:
    """The ``next:`` line of the noise-scale rule (optimal's default objective) for a measured record; ``kappa``:
    the measured memory's flags (``_kappa_flags``)."""
    batch = record["batch"] if record["batch"] is not None else "B"
    given = "" if mu["source"] == "log" else f" --mu {mu['value']:g}"
    # the run's prompt groups (the halves kept them whole): without them optimal would answer in single responses
    unit = record.get("unit_size") or 1
    groups = f" --group-size {unit}" if unit > 1 and (batch == "B" or batch % unit == 0) else ""
    if record["b_noise"] is not None:  # the profile carries the memory record too: optimal reads kappa from it
        return [f"next: replay-theory optimal --profile {out}{given} -B {batch}{groups}"]
    low = (record.get("b_noise_interval") or [None])[0]
    if low is None:
        return []
    # no point estimate: the interval's lower end is the most replay-friendly B_noise the data allow
    return [f"next: replay-theory optimal --mu {mu['value']:.4g} --noise-scale {low:.4g} -B {batch}{groups}{kappa}   "
            f"(B_noise's lower bound: if even that says on-policy, so does every B_noise the data allow)"]

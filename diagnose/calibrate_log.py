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

Checked against exact profiles on the simulator (``python -m replay_theory.diagnose.proxy_check``).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np

from replay_theory.diagnose.by_age import AGGREGATIONS, SCORES, WEIGHTS, SequenceSums, age_step_sums, read_step_times
from replay_theory.diagnose.errors import ConfigError
from replay_theory.diagnose.reader import FORMATS, LogReader, detect_format, read_schema, require_pyarrow
from replay_theory.diagnose.schema import STEP_TIME_COLUMNS, resolve_columns
from replay_theory.theory.noise import DEFAULT_DRAWS, DEFAULT_LEVEL, percentile_interval, unit_weights

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


@dataclass(frozen=True)
class CalibrateLogConfig:
    """Everything ``calibrate --from-log`` needs; every field is checked in ``__post_init__`` (before any work)."""

    path: str
    preset: str = "trl"
    columns: Optional[str] = None
    format: str = "auto"
    mu: Optional[float] = None
    rho: Optional[float] = None
    weight: str = "token"
    aggregation: str = "token-mean"
    score: str = "logit"
    level: float = DEFAULT_LEVEL
    draws: int = DEFAULT_DRAWS
    seed: int = 0
    chunk_rows: int = 65536

    def __post_init__(self) -> None:
        if self.mu is not None and not (math.isfinite(self.mu) and self.mu > 0):
            raise ConfigError("mu", f"must be a finite number > 0 (rollout cost / per-sample update cost), "
                                    f"got {self.mu:g}")
        if self.rho is not None and not (0.0 <= self.rho <= 1.0):
            raise ConfigError("rho", f"must be in [0, 1] (the range Assumption 3.3 and optimal allow), "
                                     f"got {self.rho:g}")
        for name, value, valid in (("weight", self.weight, WEIGHTS), ("aggregation", self.aggregation, AGGREGATIONS),
                                   ("score", self.score, SCORES)):
            if value not in valid:
                raise ConfigError(name, f"must be one of {', '.join(valid)}, got {value!r}")
        if self.format not in ("auto", *FORMATS):
            raise ConfigError("format", f"must be auto, {', '.join(FORMATS)}; got {self.format!r}")
        if not 0.0 < self.level < 1.0:
            raise ConfigError("level", f"must be in (0, 1), got {self.level:g}")
        if self.draws < 2:
            raise ConfigError("draws", f"must be an integer >= 2, got {self.draws}")
        resolve_columns(self.preset, self.columns)


def plan(config: CalibrateLogConfig) -> LogReader:
    """Check the log and its columns (schema only) and build the reader: one-line errors, no data read.

    The step rides in the reader's ``reward`` field (calibration reads no reward), mapped only when the log has it.
    """
    path = Path(config.path)
    if not path.is_file():
        raise ConfigError("path", f"{path} is not a file (not found, or a directory)")
    columns = resolve_columns(config.preset, config.columns)
    require_pyarrow()
    names = list(read_schema(path, detect_format(path, config.format)).names)
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
    streamed = replace(columns, reward=STEP_COLUMN if STEP_COLUMN in names else None)  # a sequence's step, any layout
    return LogReader(path, streamed, fmt=config.format, chunk_rows=config.chunk_rows)


def sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
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


def calibrate_from_log(config: CalibrateLogConfig, reader: Optional[LogReader] = None) -> dict:
    """One pass over the log (``reader``: :func:`plan`'s) -> the profile dict ``optimal --profile`` reads."""
    from replay_theory import __version__

    reader = reader or plan(config)
    sums = SequenceSums(config.weight, config.aggregation, config.score)
    for chunk in reader:
        sums.fold(chunk, reader.path.name)
    per_seq = sums.per_sequence()
    if per_seq["log_q"].size == 0:
        raise ValueError(f"{reader.path.name}: no valid tokens to calibrate from")
    table = profile_table(age_step_sums(per_seq), config.level, config.draws, config.seed)
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
    data: dict = {
        "kind": "table", "staleness": table["staleness"], "sigma_sq": table["sigma_sq"], "sigma_sq_form": "plain",
        "source": f"replay-theory calibrate --from-log {reader.path}",
        "proxy": {"name": PROXY_NAME, "weight": config.weight, "aggregation": config.aggregation,
                  "score": config.score, "scale": f"relative: sigma_sq = 1 at age {table['normalised_at']:g}",
                  "ci": table["ci"], "level": config.level, "sequences_by_age": table["sequences"],
                  "units": f"{table['units']} steps (bootstrap units)" if "reward" in reader.used else
                  "1 (no step column: no interval)", "ages_left_out": table["left_out"],
                  "tokens": sums.tokens, "sequences": int(per_seq["log_q"].size)},
        "mu": mu, "assumptions": list(ASSUMPTIONS), "not_measured": list(NOT_MEASURED),
        "provenance": {"log": str(reader.path.resolve()), "sha256": sha256(reader.path), "preset": config.preset,
                       "columns": reader.used, "format": reader.format, "layout": reader.layout,
                       "code_version": __version__},
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
    return data


def summary(data: dict, out: Path) -> str:
    """The printed summary and the next command."""
    prov, mu, proxy = data["provenance"], data["mu"], data["proxy"]

    def ci(c):
        return "no interval" if c[0] is None or c[1] is None else f"{c[0]:.3g}-{c[1]:.3g}"

    lines = [f"calibrated from {prov['log']} (sha256 {prov['sha256'][:12]}, preset {prov['preset']}): "
             f"{proxy['sequences']} sequences, {proxy['tokens']} tokens, {proxy['units']}"]
    lines.append((f"mu = {mu['value']:.4g} (90% CI {ci(mu['ci'])} over {mu['steps']} steps): "
                  f"{mu['generation_seconds_per_row']:.4g} s per generated row / "
                  f"{mu['update_seconds_per_row']:.4g} s per trained row") if mu["source"] == "log" else
                 f"mu = {mu['value']:g} (given with --mu)")
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
    if data["staleness"][-1] <= 1:
        lines.append("note: the table ends at age 1; optimal needs ages beyond 1 (log a run whose buffer holds "
                     "older rows, N > 2R)")
    rho = f" --rho {data['rho']:g}" if "rho" in data else " --rho RHO"
    lines += [f"wrote {out}", f"next: replay-theory optimal --profile {out} --mu {mu['value']:.4g}{rho}"]
    return "\n".join(lines)

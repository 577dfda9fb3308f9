"""``replay-theory calibrate --from-log LOG --out PROFILE.json``: mu and sigma^2(s) from a run's diagnose log.

Paper: experience-replay (docs/REFERENCES.md): mu (Sec. 2, App. E; rollout cost / per-sample update cost),
sigma^2(s) and rho (Assumption 3.3), for Thm 3.5's J = c sigmabar^2(x)(1/B + 1/N + rho/R). The work is in
``diagnose/calibrate_log.py`` (the proxy and its assumptions: docs/THEORY.md section 8); this module maps the
options onto :class:`~replay_theory.diagnose.calibrate_log.CalibrateLogConfig`, checks every input and the
output path before the log is read, writes the profile whole or not at all (``outputs.write_new``), and prints
a summary with the ``optimal`` command to run next.

``--grad-norms FILE`` adds the gradient noise scale B_noise (McCandlish et al. 2018, arXiv 1812.06162, App. A.1:
two batch sizes at the same theta) from per-step squared gradient norms, e.g. the ``noise_scale.jsonl`` that
``replay-theory trl-replay`` writes; a log of log-probs alone cannot give it, and the summary says so. Where that
file carries curvature pairs (the TRL trainer logs one every ``--curvature-every`` steps), the optimizer's memory
kappa goes beside B_noise into the profile's "memory" record, and the ``next:`` line passes it to ``optimal``
(``--kappa K --optimizer adam --beta1 B1``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..diagnose.by_age import AGGREGATIONS, WEIGHTS
from ..diagnose.errors import ConfigError
from ..outputs import check_new_file, write_new
from .common import on_ctrl_c, strict
from .diagnose_cmds import (  # the log is read as diagnose reads it
    ColumnsOption,
    FormatOption,
    PresetOption,
)

#: config field -> the option as the user types it.
OPTION_OF_FIELD = {"path": "--from-log", "preset": "--preset", "columns": "--columns", "format": "--format",
                   "mu": "--mu", "rho": "--rho", "weight": "--weight", "aggregation": "--aggregation",
                   "score": "--score", "grad_norms": "--grad-norms"}

FromLogOption = Annotated[Optional[Path], typer.Option(
    "--from-log", help="Exported diagnose log (Parquet, CSV or JSON lines) with ages, advantages and log-probs, "
                       "plus the step time columns for mu (NeMo-RL's, SkyRL's and slime's step files carry neither "
                       "ages nor times).", show_default=False)]
OutOption = Annotated[Optional[Path], typer.Option(
    "--out", help="New profile file (.json) for `optimal --profile`; never overwrites.", show_default=False)]
MuOption = Annotated[Optional[float], typer.Option(
    "--mu", help="mu = rollout cost / per-sample update cost (> 0), instead of measuring it from the time columns.")]
RhoOption = Annotated[Optional[float], typer.Option(
    "--rho", help="rho of Assumption 3.3 in [0, 1], recorded as given (a log cannot measure it).")]
WeightOption = Annotated[str, typer.Option(
    "--weight", help=f"Importance weight the loss uses: {' or '.join(WEIGHTS)} (w_t, or prod w_t).")]
AggregationOption = Annotated[str, typer.Option(
    "--aggregation", help=f"How the loss averages tokens: {', '.join(AGGREGATIONS)}.")]
GradNormsOption = Annotated[Optional[Path], typer.Option(
    "--grad-norms", help="Per-step squared gradient norms at two batch sizes (JSON lines or CSV with step, "
                         "grad_sq_small, grad_sq_big, batch_small, batch_big; trl-replay's noise_scale.jsonl): "
                         "adds B_noise with its bootstrap interval to the profile, and kappa where the file has "
                         "curvature pairs (curvature_num, curvature_den, curvature_lr, curvature_beta1).",
                         show_default=False)]
ScoreOption = Annotated[str, typer.Option(
    "--score", help="Per-token score norm: logit ((1 - p)^2, p = current token prob) or constant.")]


def calibrate_command(
    from_log: FromLogOption = None,
    out: OutOption = None,
    preset: PresetOption = "default",
    columns: ColumnsOption = None,
    fmt: FormatOption = "auto",
    mu: MuOption = None,
    rho: RhoOption = None,
    weight: WeightOption = "token",
    aggregation: AggregationOption = "token-mean",
    score: ScoreOption = "logit",
    grad_norms: GradNormsOption = None,
) -> None:
    """mu and a noise profile sigma^2(s) for `optimal --profile`, from a run's exported diagnose log (and B_noise from
    the run's gradient norms with --grad-norms)."""
    from ..diagnose.calibrate_log import (
        CalibrateLogConfig,
        calibrate_from_log,
        plan,
        read_grad_norms,
        summary,
    )

    try:
        if from_log is None:
            raise ValueError("--from-log LOG is required: the diagnose log a run exported (Parquet, CSV or JSON lines)")
        if out is None:
            raise ValueError("--out PROFILE.json is required: the new profile file for `optimal --profile`")
        config = CalibrateLogConfig(path=str(from_log), preset=preset, columns=columns, format=fmt, mu=mu, rho=rho,
                                    weight=weight, aggregation=aggregation, score=score,
                                    grad_norms=None if grad_norms is None else str(grad_norms))
        check_new_file(out, "--out", ("json",))
        norms = None if grad_norms is None else read_grad_norms(grad_norms)  # the whole file, checked first
        with on_ctrl_c(f"interrupted: calibrate writes --out {out} only after its passes over the log, so nothing "
                       "was written; run the same command to start again"):
            ready = plan(config)
            data = calibrate_from_log(config, ready, norms)
    except ConfigError as err:
        raise ValueError(err.named(OPTION_OF_FIELD.get(err.field, err.field))) from None
    write_new(out, lambda tmp: tmp.write_text(json.dumps(strict(data), indent=1, allow_nan=False)), "--out")
    typer.echo(summary(data, out))


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` to ``app``."""
    app.command("calibrate")(calibrate_command)

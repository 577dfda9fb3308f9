"""``replay-theory calibrate --from-log LOG --out PROFILE.json``: mu and sigma^2(s) from a run's diagnose log.

Options are the fields of ``CalibrateLogConfig``; the work is diagnose/calibrate_log.py (docs/THEORY.md section 8).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..diagnose.calibrate_log import CalibrateLogConfig
from ..diagnose.errors import ConfigError
from ..outputs import check_new_file, write_new
from .common import on_ctrl_c, strict
from .config_options import config_from_options, with_field_options

OPTIONS = {name: ("--" + name.replace("_", "-"),) for name in ("preset", "columns", "format", "mu", "rho", "weight",
                                                                "aggregation", "score", "grad_norms", "drift")}
OPTION_OF_FIELD = {"path": "--from-log", **{name: names[0] for name, names in OPTIONS.items()}}


@with_field_options((CalibrateLogConfig, OPTIONS))
def calibrate_command(
    typed: dict,
    from_log: Annotated[Optional[Path], typer.Option("--from-log", help="Exported diagnose log (Parquet, CSV or JSON "
                                                     "lines) with ages, advantages and log-probs.",
                                                     show_default=False)] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="New profile file (.json) for `optimal --profile`; "
                                                "never overwrites.", show_default=False)] = None,
) -> None:
    """mu and a noise profile sigma^2(s) for `optimal --profile`, from a run's exported diagnose log.

    With --grad-norms, B_noise from the run's gradient norms too; with --drift, the drift M2(s) of re-scored
    rollouts."""
    from ..diagnose.calibrate_log import calibrate_from_log, check_drift, plan, read_grad_norms, summary

    try:
        if from_log is None:
            raise ValueError("--from-log LOG is required: the diagnose log a run exported (Parquet, CSV or JSON lines)")
        if out is None:
            raise ValueError("--out PROFILE.json is required: the new profile file for `optimal --profile`")
        config = config_from_options(CalibrateLogConfig, OPTIONS, typed, path=str(from_log))
        check_new_file(out, "--out", ("json",))
        norms = None if config.grad_norms is None else read_grad_norms(config.grad_norms)  # checked first
        check_drift(config)  # its schema too, before the log is read
        with on_ctrl_c(f"interrupted: calibrate writes --out {out} only after its passes over the log, so nothing "
                       "was written; run the same command to start again"):
            data = calibrate_from_log(config, plan(config), norms)
    except ConfigError as err:
        raise ValueError(err.named(OPTION_OF_FIELD.get(err.field, err.field))) from None
    write_new(out, lambda tmp: tmp.write_text(json.dumps(strict(data), indent=1, allow_nan=False)), "--out")
    typer.echo(summary(data, out))


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` to ``app``."""
    app.command("calibrate")(calibrate_command)

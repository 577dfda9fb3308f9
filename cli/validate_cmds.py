"""``replay-theory validate calibrate-model | predict | verify | all``: the theory checked on a language model.

Options are the fields of validate/config.py's configs (``ValidateConfig``, ``VerifyConfig``, ``AllConfig``,
``RunOptions``, ``RunOverrides``); the loop (validate/loop.py) needs the validate extra, imported when a command runs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import typer

from .. import install_hint
from ..validate.config import (
    FULL_SIZES,
    AllConfig,
    RunOptions,
    RunOverrides,
    ValidateConfig,
    VerifyConfig,
    apply_preset,
    check_run_dir,
    load_run_config,
    protocol,
    report_stem,
)
from .common import help_without_command, on_ctrl_c
from .config_options import with_field_options

ALIASES = {"micro_batch_size": ("--micro-batch",), "mu_window_seconds": ("--mu-window",)}
RUN = {"out": ("--out",), "tiny": ("--tiny/--full",), "thorough": ("--thorough",), "rho": ("--rho",),
       "no_progress": ("--no-progress",), "preset": ("--preset",)}
OVERRIDES = {"price_mu": ("--price-mu", "--mu"), "device": ("--device",), "engine": ("--engine",),
             "sync_every": ("--sync-every",), "micro_batch_size": ("--micro-batch",),
             "gpu_memory_utilization": ("--gpu-memory-utilization",), "threads": ("--threads",)}


def run_options(*names: str) -> tuple[type, dict[str, tuple[str, ...]]]:
    """The option table of the ``RunOptions`` fields ``names``."""
    return RunOptions, {name: RUN[name] for name in names}


validate_app = typer.Typer(help="Check the theory's predictions on a Qwen2-architecture language model "
                                "(needs the validate extra).", add_completion=False)
validate_app.callback(invoke_without_command=True)(help_without_command)


def _loop():
    """validate/loop.py, imported when a command runs: it needs the validate extra (torch, transformers)."""
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"validate needs {' and '.join(missing)}: {install_hint('validate')}")
    from ..validate import loop

    return loop


def _report_figure():
    """verify's report.png drawing (figures/results.py; validate/ does not import figures/), with matplotlib."""
    from ..figures.results import save_report_figure

    return save_report_figure


def kept(out: Path) -> str:
    """The Ctrl-C line of calibrate-model, verify and all (validate/loop.py skips the steps whose files exist)."""
    return (f"interrupted: what finished is kept in {out} (the warm start, calibration.json, predicted.json, verify's "
            "runs and their checkpoints every 5 steps); run the same command to continue from there")


def _sized(cls, fields: dict[str, Any], tiny: bool):
    """``cls(**fields)`` with --full's sizes where a size was left at its default."""
    if not tiny:
        defaults = ValidateConfig()
        fields = {**fields, **{k: v for k, v in FULL_SIZES.items()
                               if fields.get(k, getattr(defaults, k)) == getattr(defaults, k)}}
    return cls(**fields).validated()


def _plan(verify: VerifyConfig, thorough: bool) -> VerifyConfig:
    return protocol(verify.seeds, verify.budget_updates, thorough, verify.group_replay, verify.lr_grid, verify.batched,
                    verify.family, verify.jobs, verify.kappa)


def _report_line(report: dict, out: Path, plan: VerifyConfig) -> None:
    typer.echo(f"measured best: {report['measured_best']['name']}; report: {out / (report_stem(plan.family) + '.md')}")


@validate_app.command("calibrate-model")
@with_field_options(run_options("out", "tiny", "no_progress"), ValidateConfig, aliases=ALIASES)
def calibrate_model(typed_run: dict, fields: dict[str, Any]) -> None:
    """Warm-start, probe and measure mu, sigma^2(s), rho, KL drift, the noise scale B_noise (per prompt group,
    with a bootstrap interval) and the optimizer's memory kappa (curvature pairs under the probe's AdamW) of the
    language model; writes calibration.json and profile.json."""
    how = RunOptions(**typed_run)
    config = _sized(ValidateConfig, fields, how.tiny)
    check_run_dir(how.out)
    with on_ctrl_c(kept(how.out)):
        calibration = _loop().run_calibrate(config, how.out, log=typer.echo, progress=not how.no_progress)
    from ..validate.calibrate import calibration_summary

    for line in calibration_summary(calibration, how.out / "calibration.json"):
        typer.echo(line)
    typer.echo(_loop().calibrate_next_line(config, how.out))


@validate_app.command("predict")
@with_field_options(run_options("out", "rho", "no_progress"), (RunOverrides, {"price_mu": OVERRIDES["price_mu"]}))
def predict(typed_run: dict, typed_overrides: dict) -> None:
    """Thm 3.5 on the measured profile at --price-mu: predicted.json with x*, y* and integer N, B, R."""
    changes, how = RunOverrides(**typed_overrides).validated(), RunOptions(**typed_run).validated()
    check_run_dir(how.out, needs="calibration.json")
    config = load_run_config(how.out, **dataclasses.asdict(changes)).validated(memory=False)
    _loop().run_predict(config, how.out, log=typer.echo, rho=how.rho)


VERIFY_OVERRIDES = {name: names for name, names in OVERRIDES.items() if name != "price_mu"}


@validate_app.command("verify")
@with_field_options(run_options("out", "thorough", "no_progress"), VerifyConfig, (RunOverrides, VERIFY_OVERRIDES))
def verify(typed_run: dict, fields: dict[str, Any], typed_overrides: dict) -> None:
    """Train on-policy, the prediction and its neighbours at equal compute; writes report.json/.md/.png
    (never overwritten: a re-run with the same settings prints the saved report's best design)."""
    how = RunOptions(**typed_run)
    plan = _plan(VerifyConfig(**fields), how.thorough)
    changes = RunOverrides(**typed_overrides).validated()
    check_run_dir(how.out, needs="predicted.json")
    config = load_run_config(how.out, **dataclasses.asdict(changes)).validated(memory=False)
    plan.check_sizes(config.rollouts_per_step, config.group_size)
    plan.check_verify_memory(config)
    with on_ctrl_c(kept(how.out)):
        report = _loop().run_verify(config, how.out, plan, log=typer.echo, progress=not how.no_progress,
                                    figure=_report_figure())
    _report_line(report, how.out, plan)


@validate_app.command("all")
@with_field_options(run_options(*RUN), AllConfig, aliases=ALIASES)
def validate_all(typed_run: dict, fields: dict[str, Any]) -> None:
    """calibrate-model -> predict -> verify."""
    how = RunOptions(**typed_run)
    config = _sized(AllConfig, apply_preset({**dataclasses.asdict(AllConfig()), **fields}, how.preset, AllConfig()),
                    how.tiny)
    plan = _plan(config, how.thorough)
    how.validated()
    check_run_dir(how.out)
    loop = _loop()
    with on_ctrl_c(kept(how.out)):
        loop.run_calibrate(config.calibration(), how.out, log=typer.echo, progress=not how.no_progress)
        loop.run_predict(config.calibration(), how.out, log=typer.echo, rho=how.rho)
        report = loop.run_verify(config.calibration(), how.out, plan, log=typer.echo, progress=not how.no_progress,
                                 figure=_report_figure())
    _report_line(report, how.out, plan)


def register(app: typer.Typer) -> None:
    """Add the `validate` group to ``app``."""
    app.add_typer(validate_app, name="validate")


__all__ = ["register", "validate_app"]

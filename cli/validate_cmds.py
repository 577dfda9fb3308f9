"""``replay-theory validate calibrate-model | predict | verify | all``: the theory checked on a language model.

Paper: experience-replay (docs/REFERENCES.md): ``calibrate-model`` measures mu (rollout cost / per-sample
update cost, Table 1) and the noise profile sigma^2(s) of a Qwen2-architecture model, ``predict`` gives
Thm 3.5's design (x* = N/R, y* = B/R) and ``verify`` trains designs at equal compute (Eq. 1-2), priced at
``--price-mu``. The loop itself is ``validate/loop.py``; it needs the validate extra (torch, transformers),
imported when a validate command runs, so this module loads without them.

Options are the fields of ``ValidateConfig`` / ``VerifyConfig`` / ``AllConfig`` (validate/config.py), their help
the field docstrings; every value is checked (``.validated()``) before any work or any file is written.
``calibrate-model`` is named apart from the top-level ``calibrate-simulator``: this one measures a
language model, that one the simulator.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .. import install_hint
from ..theory.checks import require_unit_interval
from ..validate.config import (
    FULL_SIZES,
    PRESETS,
    AllConfig,
    ValidateConfig,
    VerifyConfig,
    apply_preset,
    check_integer,
    check_positive,
    check_run_dir,
    load_run_config,
    protocol,
    report_stem,
)
from .common import help_without_command, on_ctrl_c
from .config_options import with_dataclass_options

ALIASES = {"micro_batch_size": ("--micro-batch",), "mu_window_seconds": ("--mu-window",)}
OutOption = Annotated[Path, typer.Option("--out", help="Run directory (resumed: finished steps are skipped).")]
TinyOption = Annotated[bool, typer.Option("--tiny/--full", help="Small problem and probe sizes for a CPU (--full: "
                                                              "n-train 5000, probe-steps 64, samples 4096 where "
                                                              "left at their defaults).")]
ThoroughOption = Annotated[bool, typer.Option("--thorough", help="The decisive verify: 16 seeds, budget 96 updates, "
                                                                "the FIFO family only, --lr-grid auto.")]
RhoOption = Annotated[Optional[float], typer.Option(
    "--rho", help="Correlation rho of Assumption 3.3 in [0, 1] for the prediction (default: the profile's fit; an "
                  "out-of-range fit gives 0, said in the output).")]
NoProgressOption = Annotated[bool, typer.Option("--no-progress", help="Hide the progress bars (stderr).")]
PresetOption = Annotated[Optional[str], typer.Option("--preset", help="Options for a named run, applied where an "
                                                     "option is left at its default: " + "; ".join(
                                                         f"{name}: " + " ".join(f"--{k.replace('_', '-')} {v}"
                                                                                for k, v in opts.items())
                                                         for name, opts in PRESETS.items()) + ".")]

validate_app = typer.Typer(help="Check the theory's predictions on a Qwen2-architecture language model "
                                "(needs the validate extra).", add_completion=False)
validate_app.callback(invoke_without_command=True)(help_without_command)


def _loop():
    """validate/loop.py, imported when a validate command runs: it needs torch and transformers (the validate
    extra), which every other command, `optimal` first, must start without."""
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"validate needs {' and '.join(missing)}: {install_hint('validate')}")
    from ..validate import loop

    return loop


def _report_figure():
    """The report's figure (figures/results.py), which verify draws as report.png: figures/ sits beside validate/, so
    the command hands the drawing in; matplotlib is imported when verify runs."""
    from ..figures.results import save_report_figure

    return save_report_figure


def kept(out: Path) -> str:
    """The Ctrl-C line of calibrate-model, verify and all: each step's files are written when it ends and skipped
    when present (validate/loop.py), and verify's runs checkpoint every 5 steps."""
    return (f"interrupted: what finished is kept in {out} (the warm start, calibration.json, predicted.json, verify's "
            "runs and their checkpoints every 5 steps); run the same command to continue from there")


def _sized(cls, fields: dict[str, Any], tiny: bool):
    """``cls(**fields)`` with --full's sizes where a size was left at its default."""
    if not tiny:
        defaults = ValidateConfig()
        fields = {**fields, **{k: v for k, v in FULL_SIZES.items() if fields[k] == getattr(defaults, k)}}
    return cls(**fields).validated()


def _check_rho(rho: Optional[float]) -> None:
    if rho is not None:
        require_unit_interval("--rho", rho)


@validate_app.command("calibrate-model")
@with_dataclass_options(ValidateConfig, aliases=ALIASES)
def calibrate_model(fields: dict[str, Any], out: OutOption, tiny: TinyOption = True,
                    no_progress: NoProgressOption = False) -> None:
    """Warm-start, probe and measure mu, sigma^2(s), rho, KL drift, the noise scale B_noise (per prompt group,
    with a bootstrap interval) and the optimizer's memory kappa (curvature pairs under the probe's AdamW) of the
    language model; writes calibration.json and profile.json."""
    config = _sized(ValidateConfig, fields, tiny)
    check_run_dir(out)
    with on_ctrl_c(kept(out)):
        calibration = _loop().run_calibrate(config, out, log=typer.echo, progress=not no_progress)
    from ..validate.calibrate import calibration_summary

    for line in calibration_summary(calibration, out / "calibration.json"):
        typer.echo(line)


@validate_app.command("predict")
def predict(
    out: Annotated[Path, typer.Option("--out", help="Run directory holding calibration.json.")],
    price_mu: Annotated[Optional[float], typer.Option("--price-mu", "--mu", help="Rollout cost in updates to "
                                                     "price compute (default: calibrate's --price-mu).")] = None,
    rho: RhoOption = None,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="Accepted as by the other validate commands "
                                                                    "(predict draws no progress bar).")] = False,
) -> None:
    """Thm 3.5 on the measured profile at --price-mu: predicted.json with x*, y* and integer N, B, R."""
    if price_mu is not None:
        check_positive("--price-mu", price_mu)
    _check_rho(rho)
    check_run_dir(out, needs="calibration.json")
    config = load_run_config(out, price_mu=price_mu).validated()
    _loop().run_predict(config, out, log=typer.echo, rho=rho)


@validate_app.command("verify")
@with_dataclass_options(VerifyConfig)
def verify(
    fields: dict[str, Any],
    out: Annotated[Path, typer.Option("--out", help="Run directory holding predicted.json.")],
    thorough: ThoroughOption = False,
    device: Annotated[Optional[str], typer.Option("--device", help="cpu or cuda (default: calibrate's).")] = None,
    engine: Annotated[Optional[str], typer.Option("--engine", help="hf, vllm or auto (default: calibrate's).")
                      ] = None,
    sync_every: Annotated[Optional[int], typer.Option("--sync-every", help="Default: calibrate's.")] = None,
    micro_batch: Annotated[Optional[int], typer.Option("--micro-batch", help="Default: calibrate's.")] = None,
    gpu_memory: Annotated[Optional[float], typer.Option("--gpu-memory-utilization",
                                                        help="Default: calibrate's.")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch CPU threads (default: calibrate's; "
                                                                      "results do not depend on it).")] = None,
    no_progress: NoProgressOption = False,
) -> None:
    """Train on-policy, the prediction and its neighbours at equal compute; writes report.json/.md/.png
    (never overwritten: a re-run with the same settings prints the saved report's best design)."""
    plan = protocol(fields["seeds"], fields["budget_updates"], thorough, fields["group_replay"], fields["lr_grid"],
                    fields["batched"], fields["family"], fields["jobs"], fields["kappa"])
    if threads is not None:
        check_integer("--threads", threads, 1)
    check_run_dir(out, needs="predicted.json")
    config = load_run_config(out, device=device, engine=engine, sync_every=sync_every, micro_batch_size=micro_batch,
                             gpu_memory_utilization=gpu_memory, threads=threads).validated()
    plan.check_sizes(config.rollouts_per_step, config.group_size)
    with on_ctrl_c(kept(out)):
        report = _loop().run_verify(config, out, plan, log=typer.echo, progress=not no_progress,
                                    figure=_report_figure())
    typer.echo(f"measured best: {report['measured_best']['name']}; report: {out / (report_stem(plan.family) + '.md')}")


@validate_app.command("all")
@with_dataclass_options(AllConfig, aliases=ALIASES)
def validate_all(fields: dict[str, Any], out: OutOption, tiny: TinyOption = True, thorough: ThoroughOption = False,
                 rho: RhoOption = None, no_progress: NoProgressOption = False, preset: PresetOption = None) -> None:
    """calibrate-model -> predict -> verify."""
    config = _sized(AllConfig, apply_preset(fields, preset, AllConfig()), tiny)
    plan = protocol(config.seeds, config.budget_updates, thorough, config.group_replay, config.lr_grid,
                    config.batched, config.family, config.jobs, config.kappa)
    _check_rho(rho)
    check_run_dir(out)
    loop = _loop()
    with on_ctrl_c(kept(out)):
        loop.run_calibrate(config.calibration(), out, log=typer.echo, progress=not no_progress)
        loop.run_predict(config.calibration(), out, log=typer.echo, rho=rho)
        report = loop.run_verify(config.calibration(), out, plan, log=typer.echo, progress=not no_progress,
                                 figure=_report_figure())
    typer.echo(f"measured best: {report['measured_best']['name']}; report: {out / (report_stem(plan.family) + '.md')}")


def register(app: typer.Typer) -> None:
    """Add the `validate` group to ``app``."""
    app.add_typer(validate_app, name="validate")


__all__ = ["register", "validate_app"]

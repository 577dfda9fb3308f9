"""``replay-theory validate calibrate-model | predict | verify | all``: the theory checked on a language model.

Paper: experience-replay (docs/REFERENCES.md): ``calibrate-model`` measures mu (rollout cost / per-sample
update cost, Table 1) and the noise profile sigma^2(s) of a Qwen2-architecture model, ``predict`` gives
Thm 3.5's design (x* = N/R, y* = B/R) and ``verify`` trains designs at equal compute (Eq. 1-2). The loop
itself is ``validate/loop.py``; it needs the validate extra (torch, transformers), imported there by
the functions that train, so this module loads without them.

``calibrate-model`` is named apart from the top-level ``calibrate-simulator``: this one measures a
language model, that one the simulator.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Optional

import typer

from replay_theory.cli.common import help_without_command
from replay_theory.validate.config import (
    VERIFY_BUDGET_UPDATES,
    VERIFY_SEEDS,
    ValidateConfig,
    check_run_dir,
    load_run_config,
)

DEFAULTS = ValidateConfig()  # the CLI's defaults are the config's: written once

# Options shared by `validate calibrate-model` and `validate all`: one definition and one help text each.
_ENGINE_HELP = "Rollout engine: hf (HF sampling loop, any device), vllm (CUDA) or auto (vllm when installed, on CUDA)."
OutOption = Annotated[Path, typer.Option("--out", help="Run directory (resumed: finished steps are skipped).")]
ModelOption = Annotated[str, typer.Option("--model", help="'tiny' or a local checkpoint / hub id.")]
DeviceOption = Annotated[str, typer.Option("--device", help="cpu or cuda (bf16 autocast over fp32 weights on cuda).")]
EngineOption = Annotated[str, typer.Option("--engine", help=_ENGINE_HELP)]
SyncEveryOption = Annotated[int, typer.Option("--sync-every", help="Updates between weight syncs trainer -> engine.")]
MicroBatchOption = Annotated[int, typer.Option("--micro-batch",
                                               help="Completions per forward/backward (0: whole batch).")]
GpuMemoryOption = Annotated[float, typer.Option("--gpu-memory-utilization", help="vLLM's share of the GPU.")]
LrOption = Annotated[float, typer.Option("--lr", help="AdamW learning rate of the probe and verify runs.")]
MuWindowOption = Annotated[float, typer.Option("--mu-window",
                                               help="Seconds of the App. E count-based mu (0: skip).")]
TinyOption = Annotated[bool, typer.Option("--tiny/--full", help="Small problem and probe sizes for a CPU.")]
SeedOption = Annotated[int, typer.Option("--seed", help="Seed of the problems, the model and the probe.")]
RhoOption = Annotated[Optional[float], typer.Option(
    "--rho", help="Correlation rho of Assumption 3.3 in [0, 1] for the prediction (default: the profile's fit; an "
                  "out-of-range fit gives 0, said in the output).")]
SeedsOption = Annotated[int, typer.Option("--seeds", help="Seeds per design in verify.")]
BudgetOption = Annotated[int, typer.Option("--budget-updates", help="verify's compute budget, in on-policy updates.")]

validate_app = typer.Typer(help="Check the theory's predictions on a Qwen2-architecture language model "
                                "(needs the validate extra).", add_completion=False)
validate_app.callback(invoke_without_command=True)(help_without_command)


def _loop():
    """validate/loop.py, imported when a validate command runs: it needs torch and transformers (the validate
    extra), which every other command, `optimal` first, must start without."""
    from replay_theory.validate import loop

    return loop


def _run_options(engine, sync_every, micro_batch, gpu_memory, lr) -> dict:
    return {"engine": engine, "sync_every": sync_every, "micro_batch_size": micro_batch,
            "gpu_memory_utilization": gpu_memory, "lr": lr}


def calibrate_config(model, device, engine, sync_every, micro_batch, gpu_memory, lr, mu_window, tiny, seed
                     ) -> ValidateConfig:
    """The ValidateConfig of `validate calibrate-model` and `validate all` (--full: larger problem and probe)."""
    config = ValidateConfig(model=model, device=device, seed=seed, mu_window_seconds=mu_window,
                            **_run_options(engine, sync_every, micro_batch, gpu_memory, lr))
    return config if tiny else dataclasses.replace(config, n_train=5000, probe_steps=64, samples=256)


@validate_app.command("calibrate-model")
def calibrate_model(
    out: OutOption,
    model: ModelOption = DEFAULTS.model,
    device: DeviceOption = DEFAULTS.device,
    engine: EngineOption = DEFAULTS.engine,
    sync_every: SyncEveryOption = DEFAULTS.sync_every,
    micro_batch: MicroBatchOption = DEFAULTS.micro_batch_size,
    gpu_memory: GpuMemoryOption = DEFAULTS.gpu_memory_utilization,
    lr: LrOption = DEFAULTS.lr,
    mu_window: MuWindowOption = DEFAULTS.mu_window_seconds,
    tiny: TinyOption = True,
    seed: SeedOption = DEFAULTS.seed,
) -> None:
    """Warm-start, probe and measure mu, sigma^2(s), rho and KL drift of the language model; writes
    calibration.json and profile.json."""
    config = calibrate_config(model, device, engine, sync_every, micro_batch, gpu_memory, lr, mu_window, tiny, seed)
    _loop().run_calibrate(config, out, log=typer.echo)


@validate_app.command("predict")
def predict(
    out: Annotated[Path, typer.Option("--out", help="Run directory holding calibration.json.")],
    mu: Annotated[Optional[float], typer.Option("--mu", help="Override the measured mu (rollout-cost meaning).")
                  ] = None,
    rho: RhoOption = None,
) -> None:
    """Thm 3.5 on the measured profile: predicted.json with x*, y* and integer N, B, R."""
    check_run_dir(out, needs="calibration.json")
    _loop().run_predict(load_run_config(out), out, mu=mu, log=typer.echo, rho=rho)


@validate_app.command("verify")
def verify(
    out: Annotated[Path, typer.Option("--out", help="Run directory holding predicted.json.")],
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds per design.")] = VERIFY_SEEDS,
    budget: BudgetOption = VERIFY_BUDGET_UPDATES,
    device: Annotated[Optional[str], typer.Option("--device", help="cpu or cuda (default: calibrate's).")] = None,
    engine: Annotated[Optional[str], typer.Option("--engine", help=_ENGINE_HELP + " Default: calibrate's.")] = None,
    sync_every: Annotated[Optional[int], typer.Option("--sync-every", help="Default: calibrate's.")] = None,
    micro_batch: Annotated[Optional[int], typer.Option("--micro-batch", help="Default: calibrate's.")] = None,
    gpu_memory: Annotated[Optional[float], typer.Option("--gpu-memory-utilization",
                                                        help="Default: calibrate's.")] = None,
) -> None:
    """Train on-policy, the prediction and designs around it at equal compute; writes report.json/.md/.png
    (never overwritten: a re-run with the same settings prints the saved report's best design)."""
    check_run_dir(out, needs="predicted.json")
    config = load_run_config(out, device=device, **_run_options(engine, sync_every, micro_batch, gpu_memory,
                                                                     None))
    report = _loop().run_verify(config, out, seeds=seeds, budget_updates=budget, log=typer.echo)
    typer.echo(f"measured best: {report['measured_best']['name']}; report: {out / 'report.md'}")


@validate_app.command("all")
def validate_all(
    out: OutOption,
    model: ModelOption = DEFAULTS.model,
    device: DeviceOption = DEFAULTS.device,
    engine: EngineOption = DEFAULTS.engine,
    sync_every: SyncEveryOption = DEFAULTS.sync_every,
    micro_batch: MicroBatchOption = DEFAULTS.micro_batch_size,
    gpu_memory: GpuMemoryOption = DEFAULTS.gpu_memory_utilization,
    lr: LrOption = DEFAULTS.lr,
    mu_window: MuWindowOption = DEFAULTS.mu_window_seconds,
    tiny: TinyOption = True,
    seeds: SeedsOption = VERIFY_SEEDS,
    budget: BudgetOption = VERIFY_BUDGET_UPDATES,
    seed: SeedOption = DEFAULTS.seed,
    rho: RhoOption = None,
) -> None:
    """calibrate-model -> predict -> verify."""
    if rho is not None and not 0.0 <= rho <= 1.0:  # before any work
        raise ValueError(f"--rho must be in [0, 1], got {rho}")
    config = calibrate_config(model, device, engine, sync_every, micro_batch, gpu_memory, lr, mu_window, tiny, seed)
    check_run_dir(out)
    _loop().run_calibrate(config, out, log=typer.echo)
    _loop().run_predict(config, out, log=typer.echo, rho=rho)
    report = _loop().run_verify(config, out, seeds=seeds, budget_updates=budget, log=typer.echo)
    typer.echo(f"measured best: {report['measured_best']['name']}; report: {out / 'report.md'}")


def register(app: typer.Typer) -> None:
    """Add the `validate` group to ``app``."""
    app.add_typer(validate_app, name="validate")

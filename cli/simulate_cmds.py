"""``replay-theory simulate`` and ``replay-theory sweep``: the simulator from the command line.

``simulate`` takes every SimConfig field as an option (``--capacity 256``, ``--buffer fifo``;
``--batch`` is short for ``--batch-size``) and prints a summary, or JSON with ``--json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

# Options shared by `validate calibrate` and `validate all`: one definition and one help text each.
_ENGINE_HELP = "Rollout engine: hf (HF sampling loop, any device), vllm (CUDA) or auto (vllm when installed, on CUDA)."
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


def _run_options(engine, sync_every, micro_batch, gpu_memory, lr) -> dict:
    return {"engine": engine, "sync_every": sync_every, "micro_batch_size": micro_batch,
            "gpu_memory_utilization": gpu_memory, "lr": lr}


def calibrate_config(model, device, engine, sync_every, micro_batch, gpu_memory, lr, mu_window, tiny, seed):
    """The ValidateConfig of `validate calibrate` and `validate all` (--full: larger problem and probe)."""
    from replay_theory.validate.loop import ValidateConfig

    config = ValidateConfig(model=model, device=device, seed=seed, mu_window_seconds=mu_window,
                            **_run_options(engine, sync_every, micro_batch, gpu_memory, lr))
    return config if tiny else dataclasses.replace(config, n_train=5000, probe_steps=64, samples=256)

ALIASES = {"batch": "batch_size", "n": "capacity", "r": "rollouts_per_step", "b": "batch_size"}
SUMMARY_KEYS = ("mean_staleness", "max_staleness", "replay_ratio", "mean_time_since_last_use", "compute_ratio",
                "final_reward", "ess_frac")


def field_help() -> dict[str, str]:
    """Attribute docstrings of SimConfig (the text right under each field)."""
    import ast
    import inspect

    from replay_theory.simulate import config as config_module

    tree = ast.parse(inspect.getsource(config_module.SimConfig))
    body = tree.body[0].body
    docs = {}
    for node, following in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            docs[node.target.id] = " ".join(str(following.value.value).split())
    return docs


def parse_field_options(args: list[str]) -> dict[str, object]:
    """``--field value`` pairs into raw values (strings parsed as JSON scalars where possible)."""
    from replay_theory.simulate.config import field_names

    valid = set(field_names())
    values: dict[str, object] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("--"):
            raise ValueError(f"unexpected argument {token!r}; options look like --capacity 256")
        name = token[2:].replace("-", "_")
        if "=" in name:
            name, raw = name.split("=", 1)
        else:
            if i + 1 >= len(args):
                raise ValueError(f"option --{name.replace('_', '-')} needs a value")
            raw = args[i + 1]
            i += 1
        name = ALIASES.get(name, name)
        if name not in valid:
            raise ValueError(f"unknown option --{token[2:].split('=')[0]}; see replay-theory simulate --help")
        try:
            values[name] = json.loads(raw) if raw not in ("inf", "Infinity") else math.inf
        except json.JSONDecodeError:
            values[name] = raw
        i += 1
    return values


def print_simulate_help() -> None:
    from replay_theory.simulate.config import SimConfig

    defaults = SimConfig()
    docs = field_help()
    typer.echo("Usage: replay-theory simulate [--FIELD VALUE ...] [--json] [--out DIR] [--no-progress]\n")
    typer.echo("Run one simulated configuration (all seeds vectorised) and print its summary.\n")
    typer.echo("Fields (defaults in brackets):")
    for name in SimConfig.__dataclass_fields__:
        typer.echo(f"  --{name.replace('_', '-'):<24} [{getattr(defaults, name)}] {docs.get(name, '')}")
    typer.echo("\n  --json        print one JSON object (summary + config)\n  --out DIR     also save curves and summary "
               "(as a one-configuration sweep)\n  --no-progress hide the progress bar")


def register(app: typer.Typer) -> None:
    @app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
    def simulate(ctx: typer.Context) -> None:
        """Run one configuration of the simulator: --buffer fifo --capacity N --rollouts-per-step R --batch B --steps S --seed K (see --help)."""
        args = list(ctx.args)
        if "--help" in args or "-h" in args:
            print_simulate_help()
            return
        as_json = _pop_flag(args, "--json")
        no_progress = _pop_flag(args, "--no-progress")
        out = _pop_value(args, "--out")
        from replay_theory.simulate.config import config_from_dict

        config = config_from_dict(parse_field_options(args))
        if out is not None:
            from replay_theory.simulate.sweep import load_runs, run_sweep

            run_sweep({"name": "simulate", "base": config.to_dict()}, out, n_jobs=1, show_progress=not no_progress)
            payload = next(p for p in load_runs(out) if p["key"] == config.key())
            summary = payload["summary"]
        else:
            summary = _run_with_progress(config, show=not no_progress)
        if as_json:
            clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
            typer.echo(json.dumps({**clean, "config": config.to_dict()}, indent=2,
                                  default=lambda v: None if isinstance(v, float) else str(v)))
        else:
            for key in SUMMARY_KEYS + tuple(k for k in summary if k not in SUMMARY_KEYS):
                typer.echo(f"{key:<28} {summary[key]}")

    @app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
    def calibrate(ctx: typer.Context) -> None:
        """Measure the noise profile sigma^2(s), rho and KL drift on a probe run: --out FILE [--FIELD VALUE ...]."""
        args = list(ctx.args)
        if "--help" in args or "-h" in args:
            typer.echo("Usage: replay-theory calibrate --out PROFILE.json [--checkpoints 3] [--samples 256] "
                       "[--FIELD VALUE ...]\n\nRuns the simulator config given by the fields (see replay-theory "
                       "simulate --help) and writes the measured profile that `replay-theory optimal --profile` reads.")
            return
        out = _pop_value(args, "--out")
        if out is None:
            raise ValueError("calibrate needs --out FILE (the profile file to write; never overwritten)")
        if Path(out).exists():
            raise ValueError(f"--out {out!r} exists; profiles are never overwritten, choose a new file")
        checkpoints = int(_pop_value(args, "--checkpoints") or 3)
        samples = int(_pop_value(args, "--samples") or 256)
        from replay_theory.simulate.calibrate import calibrate as measure
        from replay_theory.simulate.config import config_from_dict
        from replay_theory.theory.profiles import save_profile

        config = config_from_dict(parse_field_options(args))
        result = measure(config, checkpoints=checkpoints, samples=samples)
        save_profile(out, result.profile_dict(source=f"replay-theory calibrate {' '.join(ctx.args)}"))
        typer.echo(f"staleness  {' '.join(f'{s:7g}' for s in result.staleness)}")
        typer.echo(f"sigma^2    {' '.join(f'{v:7.4f}' for v in result.sigma_sq)}")
        typer.echo(f"rho = {result.rho:.3g}; KL drift per step = {result.kl_drift_per_step:.3g}; profile written to {out}")

    @app.command()
    def experiment(
        name: str = typer.Argument(..., help="sanity, experience-replay, freshper, m2po, rloo or exgrpo."),
        out: Path = typer.Option(..., "--out", help="Results directory (resumed if it holds this experiment)."),
        jobs: int = typer.Option(-1, "--jobs", "-j", help="Parallel configurations (-1: all cores)."),
        no_progress: bool = typer.Option(False, "--no-progress", help="Hide the progress bar."),
    ) -> None:
        """Run one of the docs/SIMULATION.md experiments and print its table (rebuilt from saved runs)."""
        from replay_theory.simulate.experiments import get_experiment
        from replay_theory.simulate.sweep import run_sweep

        chosen = get_experiment(name)
        run_sweep(chosen.spec, out, n_jobs=jobs, show_progress=not no_progress)
        if chosen.prepare is not None:
            chosen.prepare(Path(out))
        table = chosen.table(Path(out))
        (Path(out) / "table.md").write_text(table + "\n")
        typer.echo(table)

    validate_app = typer.Typer(help="Check the theory's predictions on a Qwen2-architecture language model "
                                    "(needs the validate extra).", no_args_is_help=True)
    app.add_typer(validate_app, name="validate")

    from replay_theory.validate.loop import VERIFY_BUDGET_UPDATES, VERIFY_SEEDS, ValidateConfig

    defaults = ValidateConfig()  # the CLI's defaults are the config's: written once


    @validate_app.command("calibrate")
    def validate_calibrate(
        out: Path = typer.Option(..., "--out", help="Run directory (resumed: finished steps are skipped)."),
        model: ModelOption = defaults.model,
        device: DeviceOption = defaults.device,
        engine: EngineOption = defaults.engine,
        sync_every: SyncEveryOption = defaults.sync_every,
        micro_batch: MicroBatchOption = defaults.micro_batch_size,
        gpu_memory: GpuMemoryOption = defaults.gpu_memory_utilization,
        lr: LrOption = defaults.lr,
        mu_window: MuWindowOption = defaults.mu_window_seconds,
        tiny: TinyOption = True,
        seed: int = typer.Option(0, "--seed"),
    ) -> None:
        """Warm-start, probe and measure mu, sigma^2(s), rho and KL drift; writes calibration.json and profile.json."""
        from replay_theory.validate.loop import run_calibrate

        config = calibrate_config(model, device, engine, sync_every, micro_batch, gpu_memory, lr, mu_window, tiny, seed)
        run_calibrate(config, out, log=typer.echo)

    @validate_app.command("predict")
    def validate_predict(
        out: Path = typer.Option(..., "--out", help="Run directory holding calibration.json."),
        mu: Optional[float] = typer.Option(None, "--mu", help="Override the measured mu (rollout-cost meaning)."),
    ) -> None:
        """Thm 3.5 on the measured profile: predicted.json with x*, y* and integer N, B, R."""
        from replay_theory.validate.loop import load_run_config, run_predict

        run_predict(load_run_config(out), out, mu=mu, log=typer.echo)

    @validate_app.command("verify")
    def validate_verify(
        out: Path = typer.Option(..., "--out", help="Run directory holding predicted.json."),
        seeds: int = typer.Option(VERIFY_SEEDS, "--seeds", help="Seeds per design."),
        budget: int = typer.Option(VERIFY_BUDGET_UPDATES, "--budget-updates",
                                   help="Compute budget, in on-policy updates."),
        device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda (default: calibrate's)."),
        engine: Optional[str] = typer.Option(None, "--engine", help=_ENGINE_HELP + " Default: calibrate's."),
        sync_every: Optional[int] = typer.Option(None, "--sync-every", help="Default: calibrate's."),
        micro_batch: Optional[int] = typer.Option(None, "--micro-batch", help="Default: calibrate's."),
        gpu_memory: Optional[float] = typer.Option(None, "--gpu-memory-utilization", help="Default: calibrate's."),
    ) -> None:
        """Train on-policy, the prediction and designs around it at equal compute; writes report.json/.md/.png."""
        from replay_theory.validate.loop import load_run_config, run_verify

        config = load_run_config(out, device=device, **_run_options(engine, sync_every, micro_batch, gpu_memory, None))
        report = run_verify(config, out, seeds=seeds, budget_updates=budget, log=typer.echo)
        typer.echo(f"measured best: {report['measured_best']['name']}; report: {out / 'report.md'}")

    @validate_app.command("all")
    def validate_all(
        out: Path = typer.Option(..., "--out", help="Run directory (resumed)."),
        model: ModelOption = defaults.model,
        device: DeviceOption = defaults.device,
        engine: EngineOption = defaults.engine,
        sync_every: SyncEveryOption = defaults.sync_every,
        micro_batch: MicroBatchOption = defaults.micro_batch_size,
        gpu_memory: GpuMemoryOption = defaults.gpu_memory_utilization,
        lr: LrOption = defaults.lr,
        mu_window: MuWindowOption = defaults.mu_window_seconds,
        tiny: TinyOption = True,
        seeds: int = typer.Option(VERIFY_SEEDS, "--seeds", help="Seeds per design in verify."),
        budget: int = typer.Option(VERIFY_BUDGET_UPDATES, "--budget-updates",
                                   help="verify's compute budget, in on-policy updates."),
        seed: int = typer.Option(0, "--seed"),
    ) -> None:
        """calibrate -> predict -> verify."""
        from replay_theory.validate.loop import run_calibrate, run_predict, run_verify

        config = calibrate_config(model, device, engine, sync_every, micro_batch, gpu_memory, lr, mu_window, tiny, seed)
        run_calibrate(config, out, log=typer.echo)
        run_predict(config, out, log=typer.echo)
        report = run_verify(config, out, seeds=seeds, budget_updates=budget, log=typer.echo)
        typer.echo(f"measured best: {report['measured_best']['name']}; report: {out / 'report.md'}")

    @app.command()
    def sweep(
        spec: Path = typer.Argument(..., help="Sweep spec (JSON): base config, grid, extra configs."),
        out: Path = typer.Option(..., "--out", help="Results directory (created; resumed if it holds this spec)."),
        jobs: int = typer.Option(-1, "--jobs", "-j", help="Parallel configurations (-1: all cores)."),
        backend: str = typer.Option("loky", "--backend", help="joblib backend: loky, threading, dask or ray."),
        no_progress: bool = typer.Option(False, "--no-progress", help="Hide the progress bar."),
    ) -> None:
        """Run a grid of simulator configurations in parallel; resumable, never overwrites."""
        from replay_theory.simulate.sweep import load_spec, run_sweep

        table = run_sweep(load_spec(spec), out, n_jobs=jobs, backend=backend, show_progress=not no_progress)
        typer.echo(f"results: {table}")


def _pop_flag(args: list[str], flag: str) -> bool:
    if flag in args:
        args.remove(flag)
        return True
    return False


def _pop_value(args: list[str], option: str) -> Optional[str]:
    if option in args:
        i = args.index(option)
        if i + 1 >= len(args):
            raise ValueError(f"option {option} needs a value")
        value = args[i + 1]
        del args[i : i + 2]
        return value
    return None


def _run_with_progress(config, show: bool) -> dict:
    from replay_theory.simulate.engine import run

    if not show:
        return run(config).summary()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress("simulate", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(file=sys.stderr), transient=True) as bar:
        task = bar.add_task("steps", total=config.steps)
        result = run(config, progress=lambda step: bar.advance(task))
    return result.summary()

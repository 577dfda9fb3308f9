"""``replay-theory simulate | calibrate-simulator | sweep | experiment``: the simulator from the command line.

Options are the fields of ``SimConfig``, ``ProbeOptions``, ``SweepOptions`` and the theory test's ``Options``; every
argument is checked before any work, and results are never overwritten.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Annotated, Any

import typer

from ..advise.profile_files import next_optimal_line, save_profile
from ..core.jobs import check_jobs
from ..core.progress import ProgressBar
from ..experiments.paper_tables import EXPERIMENTS, get_experiment, write_table
from ..experiments.theory_bench import Options as TheoryTestOptions
from ..experiments.theory_bench import check_out as check_theory_test_out
from ..experiments.theory_bench import command_line, options_from, run_theory_test, summary_table, write_evidence
from ..outputs import check_new_file
from ..simulate.calibrate import (
    PROBE_ARGUMENTS,
    ProbeOptions,
    calibration_lines,
    check_probe,
    check_probe_sizes,
    probe_config,
)
from ..simulate.calibrate import calibrate as measure_profile
from ..simulate.config import SimConfig, config_from_dict, field_names
from ..simulate.engine import run
from ..simulate.sweep import SweepInterrupted, SweepOptions, load_runs, load_spec, parquet_available, run_sweep
from .common import UserError, emit_json, on_ctrl_c, option_message
from .config_options import config_from_options, option_name, with_field_options

ALIASES = {"batch_size": ("--batch",)}
THEORY_TEST_OPTIONS = {"instances": ("--instance",), "settings": ("--setting",), "optimizers": ("--optimizer",),
                       "mus": ("--mu",), "floors": ("--floor",), "seeds": ("--seeds",), "quick": ("--quick",),
                       "families": ("--families",)}
SUMMARY_KEYS = ("mean_staleness", "max_staleness", "replay_ratio", "mean_time_since_last_use", "compute_ratio",
                "final_reward", "ess_frac")
SWEEP_OPTIONS = {"out": ("--out",), "jobs": ("--jobs", "-j"), "backend": ("--backend",),
                 "scheduler": ("--scheduler",), "no_progress": ("--no-progress",)}
RUN_OPTIONS = {name: SWEEP_OPTIONS[name] for name in ("out", "jobs", "no_progress")}  # experiment's
NoProgressOption = Annotated[bool, typer.Option("--no-progress", help="Hide the progress bar.")]


def build_config(fields: dict[str, Any]) -> SimConfig:
    """The validated SimConfig of the options; an invalid value is one line naming its option."""
    try:
        return config_from_dict(fields)
    except ValueError as err:
        raise UserError(option_message(str(err), field_names())) from None


def jobs_checked(jobs: int) -> int:
    try:
        return check_jobs(jobs)
    except ValueError as err:
        raise UserError(str(err)) from None


@with_field_options(SimConfig, aliases=ALIASES)
def simulate(
    fields: dict[str, Any],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (summary + config; "
                                                         "infinite values as null).")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Also save curves and summary here, as a "
                                                           "one-configuration sweep (never overwritten).")] = None,
    no_progress: NoProgressOption = False,
) -> None:
    """Run one simulator configuration (all seeds vectorised) and print its summary."""
    config = build_config(fields)
    with on_ctrl_c("interrupted: simulate without --out keeps nothing; run the same command to start again (with "
                   "--out DIR the run is saved, and the same command reuses it)"):  # with --out: the sweep's line
        if out is not None:
            run_sweep({"name": "simulate", "configs": [config.to_dict()]}, out, n_jobs=1,
                      show_progress=not no_progress)
            summary = next(p for p in load_runs(out) if p["key"] == config.key())["summary"]
        else:
            summary = _run_with_progress(config, show=not no_progress)
    if as_json:
        emit_json({**summary, "config": config.to_dict()})
    else:
        for key in SUMMARY_KEYS + tuple(k for k in summary if k not in SUMMARY_KEYS):
            typer.echo(f"{key:<28} {summary[key]}")


@with_field_options(SimConfig, ProbeOptions, aliases=ALIASES)
def calibrate_simulator(
    fields: dict[str, Any],
    typed_probe: dict[str, Any],
    out: Annotated[Path, typer.Option("--out", help="Profile file to write (JSON; its folder must exist; "
                                                    "never overwritten).")],
) -> None:
    """Measure sigma^2(s), rho, B_noise and kappa on a simulator probe run; writes the profile `optimal --profile`
    reads.

    sigma^2(s) plain and signal-normalised with the retained signal, rho unclamped with a bootstrap interval and the
    within-group correlation, B_noise per sample (and with the exact |E G|^2 where it can be enumerated), and the
    optimizer's memory kappa (exact, curvature pairs, lag-1 autocorrelation); the probe is the config the options
    give."""
    check_new_file(out)  # before the probe: a run whose result cannot be saved is not started
    config = build_config(fields)
    probe = config_from_options(ProbeOptions, None, typed_probe)
    try:
        check_probe(probe_config(config, probe.max_gap), probe.staleness, probe.samples, probe.max_gap, probe.reference,
                    probe.reference_samples, probe.noise_checkpoints, probe.noise_groups, probe.kappa_pairs)
    except ValueError as err:
        raise UserError(_as_options(str(err))) from None
    try:  # its memory: the line's leading name as an option (its text names shapes, not options)
        check_probe_sizes(config, **dataclasses.asdict(probe))
    except ValueError as err:
        raise UserError(option_message(str(err), [f.name for f in dataclasses.fields(ProbeOptions)])) from None
    with on_ctrl_c(f"interrupted during the probe: nothing was written (--out {out} is written when it ends); run "
                   "the same command to start again"):
        result = measure_profile(config, **dataclasses.asdict(probe))
    changed = {k: v for k, v in config.to_dict().items() if v != getattr(SimConfig(), k)}
    source = " ".join(["replay-theory calibrate-simulator"] + [f"{option_name(k)} {v}" for k, v in changed.items()])
    profile = result.profile_dict(source=source)
    try:
        save_profile(out, profile)
    except ValueError as err:
        raise UserError(f"--out {out}: nothing written: {err}") from None
    for line in calibration_lines(result, config.capacity):
        typer.echo(line)
    typer.echo(f"profile written to {out}")
    # the simulator prices generation at its config's mu and measures none: --mu is that one
    typer.echo(next_optimal_line(out, config.mu, profile))


def _as_options(message: str) -> str:
    """A probe check's message with every argument named as the user types it (``max_gap`` -> ``--max-gap``)."""
    names = "|".join(sorted({*PROBE_ARGUMENTS, "group_size", "steps", "env"}, key=len, reverse=True))
    return re.sub(rf"(?<![\w-])({names})\b", lambda m: "--" + m.group(1).replace("_", "-"), message)


@with_field_options((SweepOptions, SWEEP_OPTIONS))
def sweep(typed: dict, spec: Annotated[Path, typer.Argument(help="Sweep spec (JSON): base config, grid, extra "
                                                                 "configs.")]) -> None:
    """Run a grid of simulator configurations in parallel; resumable, never overwrites. Writes results.csv and,
    with pyarrow installed, results.parquet (one row per configuration and seed)."""
    loaded, how = load_spec(spec), config_from_options(SweepOptions, SWEEP_OPTIONS, typed)
    try:
        table = run_sweep(loaded, how.out, n_jobs=jobs_checked(how.jobs), backend=how.backend,
                          show_progress=not how.no_progress, scheduler=how.scheduler)
    except SweepInterrupted as stop:  # Ctrl-C: what is kept and how to resume, then the shell's code for SIGINT
        typer.echo(stop.message(), err=True)
        raise typer.Exit(130) from None
    if parquet_available():
        typer.echo(f"results: {table}, {table.with_suffix('.parquet')}")
    else:
        typer.echo(f"results: {table} (results.parquet not written: pyarrow is not installed; "
                   f"pip install 'replay-theory[dask]' or pip install pyarrow)")


@with_field_options((SweepOptions, RUN_OPTIONS), (TheoryTestOptions, THEORY_TEST_OPTIONS))
def experiment(typed_run: dict, typed: dict, name: Annotated[str, typer.Argument(help=", ".join(EXPERIMENTS) + ".")]
               ) -> None:
    """Run one of the docs/SIMULATION.md experiments and print its table (rebuilt from the saved runs). The
    theory-test options apply to theory-test only."""
    chosen, how = get_experiment(name), config_from_options(SweepOptions, RUN_OPTIONS, typed_run)
    out, jobs, progress = how.out, jobs_checked(how.jobs), not how.no_progress
    given = [(THEORY_TEST_OPTIONS[path][0], value) for path, value in typed.items()]
    if name == "theory-test":
        return _theory_test(out, given, options_from(typed), jobs, progress)
    if given:
        raise UserError(f"{', '.join(flag for flag, _ in given)} only apply to the theory-test experiment, not {name}")
    with on_ctrl_c(f"interrupted: the finished runs are kept in {out}; run the same command to go on from them"):
        run_sweep(chosen.spec, out, n_jobs=jobs, show_progress=progress)  # or the sweep's line
        if chosen.prepare is not None:
            chosen.prepare(out)
    table = chosen.table(out)
    write_table(out, table)
    typer.echo(table)


def _theory_test(out: Path, given: list, options: TheoryTestOptions, jobs: int, progress: bool) -> None:
    check_theory_test_out(out, options)
    with on_ctrl_c(f"interrupted: every finished run is kept in {out}/runs and every finished unit in "
                   f"{out}/units; run the same command to go on from them"):
        summary = run_theory_test(out, options, progress=progress, jobs=jobs)
    table = summary_table(summary)
    write_table(out, table)
    write_evidence(out, summary, command_line(out, given))
    typer.echo(table)


def register(app: typer.Typer) -> None:
    """Add simulate, calibrate-simulator, sweep and experiment to ``app``."""
    app.command("simulate")(simulate)
    app.command("calibrate-simulator")(calibrate_simulator)
    app.command("sweep")(sweep)
    app.command("experiment")(experiment)


def _run_with_progress(config: SimConfig, show: bool) -> dict:
    bar = ProgressBar("simulate steps", config.steps, enabled=show)
    try:
        result = run(config, progress=lambda step: bar.advance())
    finally:
        bar.close()
    return result.summary()

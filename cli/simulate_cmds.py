"""``replay-theory simulate | calibrate-simulator | sweep | experiment``: the simulator from the command line.

Paper: experience-replay (docs/REFERENCES.md), Sec. 3's synchronous FIFO model: ``--capacity`` is the
buffer size N, ``--rollouts-per-step`` R, ``--batch-size`` B (``--batch`` for short), so the staleness
horizon is x = N/R and the replay ratio y = B/R. ``simulate`` and ``calibrate-simulator`` take every
:class:`~replay_theory.simulate.config.SimConfig` field as an option, built by
``cli/config_options.py`` from the dataclass (its help is the field's docstring). ``sweep`` runs a JSON
grid of configurations and ``experiment`` one of the docs/SIMULATION.md tables.

Every argument is checked before any work: output paths (``--out``), ``--jobs``, ``--backend``, the
spec and the config; results are never overwritten.
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..core.jobs import check_jobs
from ..core.progress import ProgressBar
from ..experiments.paper_tables import EXPERIMENTS, get_experiment, write_table
from ..experiments.theory_test import Options as TheoryTestOptions
from ..experiments.theory_test import check_out as check_theory_test_out
from ..experiments.theory_test import command_line, options_from, run_theory_test, summary_table, write_evidence
from ..outputs import check_new_file
from ..simulate.calibrate import (
    DEFAULT_KAPPA_PAIRS,
    DEFAULT_MAX_GAP,
    DEFAULT_NOISE_CHECKPOINTS,
    DEFAULT_NOISE_GROUPS,
    DEFAULT_REFERENCE_SAMPLES,
    DEFAULT_STALENESS,
    PROBE_ARGUMENTS,
    calibration_lines,
    check_probe,
    probe_config,
)
from ..simulate.calibrate import calibrate as measure_profile
from ..simulate.config import SimConfig, config_from_dict, field_names
from ..simulate.engine import run
from ..simulate.sweep import (
    BACKENDS,
    SweepInterrupted,
    load_runs,
    load_spec,
    parquet_available,
    run_sweep,
)
from ..theory.profiles import save_profile
from .common import UserError, emit_json, on_ctrl_c, option_message
from .config_options import option_name, with_dataclass_options, with_field_options

ALIASES = {"batch_size": ("--batch",)}
THEORY_TEST_OPTIONS = {"instances": ("--instance",), "settings": ("--setting",), "optimizers": ("--optimizer",),
                       "mus": ("--mu",), "floors": ("--floor",), "seeds": ("--seeds",), "quick": ("--quick",)}
SUMMARY_KEYS = ("mean_staleness", "max_staleness", "replay_ratio", "mean_time_since_last_use", "compute_ratio",
                "final_reward", "ess_frac")
# Valid ranges appended when typer rejects a value of these options (cli/app.py::main).
VALID_RANGES = {
    "checkpoints": "an integer >= 1",
    "samples": "an integer >= 1, a multiple of --group-size",
    "jobs": "-1 (all cores) or an integer >= 1",
    "noise_checkpoints": "an integer >= 1",
    "noise_groups": "an integer >= 2",
    "kappa_pairs": "an integer >= 0",
}

Backend = Enum("Backend", {name: name for name in BACKENDS}, type=str)  # typer shows the choices in --help

OutDirOption = Annotated[Path, typer.Option("--out", help="Results directory: created if absent, resumed if it "
                                                         "holds this very sweep; any other content is refused.")]
JobsOption = Annotated[int, typer.Option("--jobs", "-j", help="Parallel configurations: -1 (all cores) or >= 1.")]
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


@with_dataclass_options(SimConfig, aliases=ALIASES)
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


@with_dataclass_options(SimConfig, aliases=ALIASES)
def calibrate_simulator(
    fields: dict[str, Any],
    out: Annotated[Path, typer.Option("--out", help="Profile file to write (JSON; its folder must exist; "
                                                    "never overwritten).")],
    checkpoints: Annotated[int, typer.Option("--checkpoints", min=1,
                                             help="Training steps at which the noise is measured.")] = 3,
    samples: Annotated[int, typer.Option("--samples", min=1, help="Responses per staleness value and checkpoint "
                                                                  "(a multiple of --group-size).")] = 256,
    staleness: Annotated[str, typer.Option("--staleness", help="Staleness values s of sigma^2(s), comma-separated "
                                                               "increasing integers >= 0.")
                         ] = ",".join(map(str, DEFAULT_STALENESS)),
    max_gap: Annotated[int, typer.Option("--max-gap", help="Largest creation-step gap for rho, >= 1 (the horizon "
                                                           "x = N/R of a design grid); the probe's FIFO capacity is "
                                                           "raised to (gap + 1) R if smaller.")] = DEFAULT_MAX_GAP,
    reference: Annotated[str, typer.Option("--reference", help="grad F: exact (enumerated; bandit, or token-mdp "
                                                               "except m2po), sampled (a held-out batch, its error "
                                                               "subtracted) or auto.")
                         ] = "auto",
    reference_samples: Annotated[int, typer.Option("--reference-samples", help="Responses in the sampled "
                                                   "reference batch (a multiple of --group-size).")
                                 ] = DEFAULT_REFERENCE_SAMPLES,
    noise_checkpoints: Annotated[int, typer.Option("--noise-checkpoints", help="Steps, evenly spread over the run, "
                                                   "at which the noise scale B_noise is measured on fresh groups "
                                                   "(those before the reward plateau are kept), >= 1.")
                                 ] = DEFAULT_NOISE_CHECKPOINTS,
    noise_groups: Annotated[int, typer.Option("--noise-groups", help="Fresh prompt groups per seed and "
                                              "noise-scale checkpoint, >= 2 (the units of B_noise).")
                            ] = DEFAULT_NOISE_GROUPS,
    kappa_pairs: Annotated[Optional[int], typer.Option(
        "--kappa-pairs", min=0, help="Curvature pairs per seed and kept noise-scale checkpoint for the optimizer's "
                                     "memory kappa, >= 0 (each: three fresh minibatches of B and Hessian-vector "
                                     "products; 0: kappa not measured). Default: "
                                     + ", ".join(f"{v} on the {k}" for k, v in DEFAULT_KAPPA_PAIRS.items())
                                     + ".", show_default=False)] = None,
) -> None:
    """Measure sigma^2(s) (plain and signal-normalised), the retained signal, rho (unclamped, with a bootstrap
    interval), the within-group correlation, the noise scale B_noise (per-sample, and with the exact |E G|^2
    where it can be enumerated) and the optimizer's memory kappa (exact, curvature pairs, lag-1 autocorrelation) on
    a probe run (the config given by the options); writes the profile that `replay-theory optimal --profile`
    reads."""
    check_new_file(out)  # before the probe: a run whose result cannot be saved is not started
    config = build_config(fields)
    try:
        probe_staleness = tuple(int(v) for v in staleness.split(","))
    except ValueError:
        raise UserError(f"--staleness must be comma-separated integers >= 0, got {staleness!r}") from None
    try:
        check_probe(probe_config(config, max_gap), probe_staleness, samples, max_gap, reference, reference_samples,
                    noise_checkpoints, noise_groups, kappa_pairs)
    except ValueError as err:
        raise UserError(_as_options(str(err))) from None
    with on_ctrl_c(f"interrupted during the probe: nothing was written (--out {out} is written when it ends); run "
                   "the same command to start again"):
        result = measure_profile(config, staleness=probe_staleness, checkpoints=checkpoints, samples=samples,
                                 max_gap=max_gap, reference=reference, reference_samples=reference_samples,
                                 noise_checkpoints=noise_checkpoints, noise_groups=noise_groups,
                                 kappa_pairs=kappa_pairs)
    changed = {k: v for k, v in config.to_dict().items() if v != getattr(SimConfig(), k)}
    source = " ".join(["replay-theory calibrate-simulator"] + [f"{option_name(k)} {v}" for k, v in changed.items()])
    try:
        save_profile(out, result.profile_dict(source=source))
    except ValueError as err:
        raise UserError(f"--out {out}: nothing written: {err}") from None
    for line in calibration_lines(result, config.capacity):
        typer.echo(line)
    typer.echo(f"profile written to {out}")


def _as_options(message: str) -> str:
    """A probe check's message with every argument named as the user types it (``max_gap`` -> ``--max-gap``)."""
    names = "|".join(sorted({*PROBE_ARGUMENTS, "group_size", "steps", "env"}, key=len, reverse=True))
    return re.sub(rf"(?<![\w-])({names})\b", lambda m: "--" + m.group(1).replace("_", "-"), message)


def sweep(
    spec: Annotated[Path, typer.Argument(help="Sweep spec (JSON): base config, grid, extra configs.")],
    out: OutDirOption,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Parallel configurations: -1 (all cores) or >= 1; with "
                                                            "dask or ray and no --scheduler, the local cluster's "
                                                            "workers.")] = -1,
    backend: Annotated[Backend, typer.Option("--backend", help="Engine: loky (processes here), threading, dask "
                                                               "(pip install 'replay-theory[dask]') or ray "
                                                               "(pip install 'replay-theory[ray]'). Results are "
                                                               "bit-identical across loky, dask and ray.")
                       ] = Backend.loky,
    scheduler: Annotated[str | None, typer.Option("--scheduler", help="dask or ray only: a running cluster, "
                                                                      "tcp://HOST:PORT (dask) or auto, HOST:PORT, "
                                                                      "ray://HOST:PORT (ray); default: a local "
                                                                      "cluster of --jobs workers, closed after.")
                         ] = None,
    no_progress: NoProgressOption = False,
) -> None:
    """Run a grid of simulator configurations in parallel; resumable, never overwrites. Writes results.csv and,
    with pyarrow installed, results.parquet (one row per configuration and seed)."""
    loaded = load_spec(spec)
    try:
        table = run_sweep(loaded, out, n_jobs=jobs_checked(jobs), backend=backend.value,
                          show_progress=not no_progress, scheduler=scheduler)
    except SweepInterrupted as stop:  # Ctrl-C: what is kept and how to resume, then the shell's code for SIGINT
        typer.echo(stop.message(), err=True)
        raise typer.Exit(130) from None
    if parquet_available():
        typer.echo(f"results: {table}, {table.with_suffix('.parquet')}")
    else:
        typer.echo(f"results: {table} (results.parquet not written: pyarrow is not installed; "
                   f"pip install 'replay-theory[dask]' or pip install pyarrow)")


@with_field_options(TheoryTestOptions, THEORY_TEST_OPTIONS)
def experiment(
    typed: dict,
    name: Annotated[str, typer.Argument(help=", ".join(EXPERIMENTS) + ".")],
    out: OutDirOption,
    jobs: JobsOption = -1,
    no_progress: NoProgressOption = False,
) -> None:
    """Run one of the docs/SIMULATION.md experiments and print its table (rebuilt from the saved runs). The
    theory-test options apply to theory-test only."""
    chosen = get_experiment(name)
    given = [(THEORY_TEST_OPTIONS[path][0], value) for path, value in typed.items()]
    if name == "theory-test":
        return _theory_test(out, given, options_from(typed), jobs_checked(jobs), not no_progress)
    if given:
        raise UserError(f"{', '.join(flag for flag, _ in given)} only apply to the theory-test experiment, not {name}")
    with on_ctrl_c(f"interrupted: the finished runs are kept in {out}; run the same command to go on from them"):
        run_sweep(chosen.spec, out, n_jobs=jobs_checked(jobs), show_progress=not no_progress)  # or the sweep's line
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

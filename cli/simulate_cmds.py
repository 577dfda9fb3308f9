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
from ..experiments.theory_test import check_options as check_theory_test
from ..experiments.theory_test import check_out as check_theory_test_out
from ..experiments.theory_test import run_theory_test, summary_table, write_evidence
from ..outputs import check_new_file
from ..simulate.calibrate import (
    DEFAULT_KAPPA_PAIRS,
    DEFAULT_MAX_GAP,
    DEFAULT_NOISE_CHECKPOINTS,
    DEFAULT_NOISE_GROUPS,
    DEFAULT_REFERENCE_SAMPLES,
    DEFAULT_STALENESS,
    PROBE_ARGUMENTS,
    Calibration,
    check_probe,
    kappa_lines,
    noise_scale_lines,
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
from .config_options import option_name, with_dataclass_options

ALIASES = {"batch_size": ("--batch",)}
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
    memory = ["optimizer memory kappa not measured (--kappa-pairs 0)"] if result.memory is None else \
        kappa_lines(result.memory)
    for line in calibration_lines(result, config.capacity) + noise_scale_lines(result.noise_scale) + memory:
        typer.echo(line)
    typer.echo(f"profile written to {out}")


def _as_options(message: str) -> str:
    """A probe check's message with every argument named as the user types it (``max_gap`` -> ``--max-gap``)."""
    names = "|".join(sorted({*PROBE_ARGUMENTS, "group_size", "steps", "env"}, key=len, reverse=True))
    return re.sub(rf"(?<![\w-])({names})\b", lambda m: "--" + m.group(1).replace("_", "-"), message)


def calibration_lines(result: Calibration, asked_capacity: int) -> list[str]:
    """The printed report of ``calibrate-simulator``: both sigma^2 forms, r(s), rho and the correlations."""
    p = result.noise
    lines = [f"{'staleness':>10} {'sigma^2 plain':>14} {'retained r':>11} {'sigma^2/r^2':>12}"]
    for s, plain, r, norm in zip(p.staleness, p.plain, p.retained, p.signal_normalised):
        lines.append(f"{s:>10g} {plain:>14.4g} {r:>11.3f} {norm:>12.4g}")
    lines.append(f"reference grad F: {result.reference}; ||grad F||^2 = {p.true_grad_sq:.4g}; "
                 f"profile table: {result.form} (loss {result.loss})")
    if result.probe_capacity != asked_capacity:
        lines.append(f"probe capacity raised from {asked_capacity} to {result.probe_capacity} to hold gaps up to "
                     f"--max-gap")
    for label, fit in (("rho", result.rho_fit), ("rho (uncentred eps)", result.rho_fit_uncentred)):
        if fit is None or (label != "rho" and result.rho_noise != "centred"):
            continue
        reaches = [b for b in (0, 1) if fit.ci[0] <= b <= fit.ci[1]]
        status = "in [0, 1]" if fit.in_range else (
            "OUT OF [0, 1], not clamped" + (f"; its interval covers {reaches[0]}" if reaches else "")
            + "; optimal needs --rho")
        lines.append(f"{label} = {fit.value:.4g}, {fit.level:.0%} interval [{fit.ci[0]:.4g}, {fit.ci[1]:.4g}] "
                     f"({status}); corr at gap 1 / {fit.max_gap // 2} / {fit.max_gap} = "
                     f"{fit.correlation[1]:.4f} / {fit.correlation[fit.max_gap // 2]:.4f} / "
                     f"{fit.correlation[fit.max_gap]:.4f}")
    if result.rho_fit is not None:
        fit = result.rho_fit
        lines.append(f"within-group correlation (t_i = t_j, not in rho) = {fit.within_group:.4g}, "
                     f"interval [{fit.within_group_ci[0]:.4g}, {fit.within_group_ci[1]:.4g}]")
    else:
        lines.append("rho not measured: the buffer has no FIFO items (buffer fifo, positive-bias or prioritized)")
    lines.append(f"KL drift per step = {result.kl_drift_per_step:.3g}")
    return lines


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


def experiment(
    name: Annotated[str, typer.Argument(help=", ".join(EXPERIMENTS) + ".")],
    out: OutDirOption,
    jobs: JobsOption = -1,
    no_progress: NoProgressOption = False,
    instance: Annotated[str | None, typer.Option("--instance", help="theory-test only: comma-separated instance "
                                                                    "seeds (the quadratic's start, the bandit's "
                                                                    "features); default 0,3,4 (0 is the development "
                                                                    "instance, 3 and 4 held out).")] = None,
    setting: Annotated[str | None, typer.Option("--setting", help="theory-test only: comma-separated settings "
                                                                  "(quadratic-noise1, -3, -10, -30, -100, "
                                                                  "two-prompts, bandit-grpo, noisy-reward); default "
                                                                  "all.")] = None,
    optimizer: Annotated[str | None, typer.Option("--optimizer", help="theory-test only: sgd, adam or both "
                                                                      "(comma-separated); default both.")] = None,
    mu: Annotated[str | None, typer.Option("--mu", help="theory-test only: comma-separated rollout-cost ratios "
                                                        "at which the same runs are re-priced; default "
                                                        "0.5,1,2,5.28,20.")] = None,
    floor: Annotated[str | None, typer.Option("--floor", help="theory-test only: comma-separated generation "
                                                              "latency floors in rollouts per step (a step costs "
                                                              "mu max(R, floor) + B); default 64,0.")] = None,
    seeds: Annotated[int | None, typer.Option("--seeds", help="theory-test only: seeds per (design, step size); "
                                                              "default 16.")] = None,
    quick: Annotated[bool | None, typer.Option("--quick", help="theory-test only: a 2 x 3 grid, on-policy at 4 "
                                                               "batches, 8 seeds unless --seeds, instance 0 unless "
                                                               "--instance (a smoke run).")] = None,
) -> None:
    """Run one of the docs/SIMULATION.md experiments and print its table (rebuilt from the saved runs)."""
    chosen = get_experiment(name)
    given = {"--instance": instance, "--setting": setting, "--optimizer": optimizer, "--mu": mu, "--floor": floor,
             "--seeds": seeds, "--quick": quick}
    if name != "theory-test":
        extra = [flag for flag, value in given.items() if value is not None]
        if extra:
            raise UserError(f"{', '.join(extra)} only apply to the theory-test experiment, not {name}")
    else:
        options = theory_test_options(instance, setting, optimizer, mu, floor, seeds, quick)
        n_jobs = jobs_checked(jobs)
        try:
            check_theory_test_out(out, options)
        except ValueError as err:
            raise UserError(str(err)) from None
        with on_ctrl_c(f"interrupted: every finished run is kept in {out}/runs and every finished unit in "
                       f"{out}/units; run the same command to go on from them"):
            try:
                summary = run_theory_test(out, options, progress=not no_progress, jobs=n_jobs)
            except ValueError as err:
                raise UserError(str(err)) from None
        table = summary_table(summary)
        write_table(out, table)
        write_evidence(out, summary, _theory_test_command(out, given))
        typer.echo(table)
        return
    with on_ctrl_c(f"interrupted: the finished runs are kept in {out}; run the same command to go on from them"):
        run_sweep(chosen.spec, out, n_jobs=jobs_checked(jobs), show_progress=not no_progress)  # or the sweep's line
        if chosen.prepare is not None:
            chosen.prepare(out)
    table = chosen.table(out)
    write_table(out, table)
    typer.echo(table)


def _theory_test_command(out, given: dict) -> str:
    """The command line that produced a benchmark, as evidence.json records it."""
    parts = ["replay-theory experiment theory-test --out", Path(out).name]
    parts += [f"{flag} {value}" for flag, value in given.items() if value is not None and flag != "--quick"]
    return " ".join(parts + (["--quick"] if given.get("--quick") else []))


def _number_list(text: str, flag: str, valid: str, kind=float) -> tuple:
    """A comma-separated list of numbers. For a list of reals, two bare integers (``5,28``) are refused: in a
    decimal-comma locale that is one number (5.28, the paper's mu), and reading it as two would run other settings
    than the user meant without a word; the line says how to write either."""
    parts = text.split(",")
    if kind is float and len(parts) == 2 and all(re.fullmatch(r"\d+", part.strip()) for part in parts):
        a, b = (part.strip() for part in parts)
        raise UserError(f"{flag} {text} is ambiguous: the two values {a} and {b}, or {a}.{b} with a decimal comma? "
                        f"Write {a}.{b} for one value (the decimal separator is a point), or {a}.0,{b} for two")
    try:
        values = tuple(kind(part) for part in parts)
    except ValueError:
        raise UserError(f"{flag} must be {valid}, got {text!r}") from None
    return values


def theory_test_options(instance, setting, optimizer, mu, floor, seeds, quick) -> TheoryTestOptions:
    """The benchmark's options from the CLI's, checked before any work (one line naming the option)."""
    def names(text, default):
        return tuple(part.strip() for part in text.split(",")) if text is not None else default

    mus = (_number_list(mu, "--mu", "a comma-separated list of finite numbers > 0") if mu is not None
           else TheoryTestOptions.mus)
    floors = (_number_list(floor, "--floor", "a comma-separated list of distinct integers >= 0", int)
              if floor is not None else TheoryTestOptions.floors)
    instances = (_number_list(instance, "--instance", "a comma-separated list of distinct integers >= 0", int)
                 if instance is not None else ((0,) if quick else TheoryTestOptions.instances))
    options = TheoryTestOptions(instances=instances, settings=names(setting, TheoryTestOptions.settings),
                                optimizers=names(optimizer, TheoryTestOptions.optimizers), mus=mus, floors=floors,
                                seeds=seeds if seeds is not None else (8 if quick else TheoryTestOptions.seeds),
                                quick=bool(quick))
    try:
        check_theory_test(options)
    except ValueError as err:
        raise UserError(str(err)) from None
    return options


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

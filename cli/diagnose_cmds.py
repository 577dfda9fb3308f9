"""``replay-theory diagnose``: off-policy health and what-if analysis of a logged rollout file.

Builds one :class:`~replay_theory.diagnose.DiagnoseConfig` from the options and
runs :func:`~replay_theory.diagnose.diagnose`; the analysis itself lives in
``diagnose/`` and needs pyarrow, not torch.  The what-if options map to the
papers' parameters: ``--clip`` is PPO's eps, ``--tis`` / ``--mask`` the
truncation cap c (Replay-RLOO Sec. 3.2), ``--m2po`` M2PO's tau_M2 (Algorithm 1),
``--tau`` FreshPER's age-decay tau (Eq. 13).

The command is importable and testable on its own: :func:`diagnose_command`
is the plain function, :func:`register` adds it to any typer app as
``diagnose``.  Every input problem is one ``ValueError`` line naming the
option as typed (the CLI's ``main`` prints it and exits 2), raised before the
log is read; outputs (``--save``, ``--figure``) are new files only, written
whole or not at all, with the permissions the umask gives.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ..diagnose.errors import ConfigError
from .common import on_ctrl_c

if TYPE_CHECKING:
    from ..diagnose import DiagnoseConfig
from ..outputs import check_new_file, write_new

#: config field (DiagnoseConfig, WhatIfConfig, the report) -> the option a user types for it.
OPTION_OF_FIELD = {
    "path": "LOG", "preset": "--preset", "columns": "--columns", "format": "--format", "chunk_rows": "--chunk-rows",
    "threads": "--threads",
    "max_age_buckets": "--max-age-buckets", "ppo_clip": "--clip", "tis": "--tis", "mask": "--mask",
    "m2po": "--m2po", "m2po_batch_tokens": "--m2po-batch-tokens", "freshper_tau": "--tau",
    "report": "--from-report",
}
FIGURE_FORMATS = ("png", "pdf", "svg")
#: raster resolution of --figure: print quality (issue 11 asks for >= 200 dpi).
FIGURE_DPI = 200

# One definition and one help text per option.
LogArgument = Annotated[Optional[Path], typer.Argument(
    metavar="LOG", help="Log file: Parquet, CSV or JSON lines (see --preset); with --preset nemo-rl, skyrl or slime "
                        "the framework's own step file, or a folder of them.", show_default=False)]
PresetOption = Annotated[str, typer.Option(
    "--preset", help="Column names: default, trl or verl; or read the files a framework writes at every step: nemo-rl "
                     "(train_data_step{N}.jsonl), skyrl (global_step_N_training_input.pkl), slime "
                     "(train_data/{rollout_id}.pt, needs torch). Pickles are read with a whitelist.")]
ColumnsOption = Annotated[Optional[str], typer.Option(
    "--columns", help="Overrides of the preset's column names, e.g. 'logp_behav=old_logp,age=version_gap'.")]
FormatOption = Annotated[str, typer.Option(
    "--format", help="auto (from the suffix), parquet, csv or jsonl; must match the file's contents.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")]
FigureOption = Annotated[Optional[Path], typer.Option(
    "--figure", help=f"Write the ESS-by-age and KL-drift figure to this new file "
                     f"(.png at {FIGURE_DPI} dpi, .pdf or .svg); never overwrites.")]
SaveOption = Annotated[Optional[Path], typer.Option(
    "--save", help="Save the report (with its config) as JSON to this new file; never overwrites.")]
FromReportOption = Annotated[Optional[Path], typer.Option(
    "--from-report", help="Rebuild --figure from a report saved with --save, instead of reading a LOG.")]
SkipInvalidOption = Annotated[bool, typer.Option(
    "--skip-invalid", help="Drop and count NaN/inf/positive log-probs, bad ages and mismatched rows "
                           "instead of stopping.")]
ClipOption = Annotated[str, typer.Option("--clip", help="What-if PPO clip eps values, in (0, 1).")]
TisOption = Annotated[str, typer.Option("--tis", help="What-if truncated-IS caps c > 1 (token and sequence).")]
MaskOption = Annotated[str, typer.Option("--mask", help="What-if masks c > 1: drop r outside [1/c, c].")]
M2poOption = Annotated[str, typer.Option("--m2po", help="What-if M2PO tau_M2 values > 0 (needs advantages).")]
M2poBatchOption = Annotated[int, typer.Option("--m2po-batch-tokens", help="Tokens per M2PO masking batch (>= 1).")]
TauOption = Annotated[str, typer.Option("--tau", help="What-if FreshPER age-decay tau values > 0 (needs ages).")]
NoWhatIfOption = Annotated[bool, typer.Option("--no-what-if", help="Statistics only.")]
MaxAgeBucketsOption = Annotated[int, typer.Option("--max-age-buckets", help="Age buckets in the by-age table (>= 1).")]
ChunkRowsOption = Annotated[int, typer.Option("--chunk-rows", help="Rows read per chunk (>= 1; bounds the memory).")]
ThreadsOption = Annotated[int, typer.Option("--threads", help="Threads that fold each chunk side by side (>= 1; 2 "
                                            "splits the work about evenly, more helps only with more cores); every "
                                            "count gives the same numbers.")]
NoProgressOption = Annotated[bool, typer.Option(
    "--no-progress", help="No progress bar (none either when stderr is not a terminal).")]


def _floats(text: str, option: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{option} must be comma-separated numbers, got {text!r}") from None


def save_figure(report: dict, path: Path) -> None:
    """Draw the ESS-by-age figure of ``report`` into the new file ``path`` (format from the suffix)."""
    import matplotlib.pyplot as plt

    from ..figures.diagnose import plot_ess_by_age

    figure = plot_ess_by_age(report)
    try:
        fmt = path.suffix.lower().lstrip(".")
        write_new(path, lambda tmp: figure.savefig(tmp, format=fmt, dpi=FIGURE_DPI), "--figure")
    finally:
        plt.close(figure)


def _run(config: "DiagnoseConfig", log: Path, show_progress: bool) -> dict:
    from ..diagnose import diagnose

    if not show_progress:
        # rich writes a newline to a stderr that is not a terminal when the bar stops: keep a
        # redirected stderr empty on success and exactly one line on error
        return diagnose(config)
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeElapsedColumn

    with Progress("diagnose", BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                  console=Console(file=sys.stderr), transient=True) as bar:
        task = bar.add_task("bytes", total=log.stat().st_size if log.is_file() else None)
        return diagnose(config, progress=lambda done, total: bar.update(task, completed=done))


def diagnose_command(
    log: LogArgument = None,
    preset: PresetOption = "default",
    columns: ColumnsOption = None,
    fmt: FormatOption = "auto",
    as_json: JsonOption = False,
    figure: FigureOption = None,
    save: SaveOption = None,
    from_report: FromReportOption = None,
    skip_invalid: SkipInvalidOption = False,
    clip: ClipOption = "0.2,0.28",
    tis: TisOption = "2,5",
    mask: MaskOption = "2,5",
    m2po: M2poOption = "0.04",
    m2po_batch_tokens: M2poBatchOption = 32768,
    tau: TauOption = "2,8",
    no_what_if: NoWhatIfOption = False,
    max_age_buckets: MaxAgeBucketsOption = 16,
    chunk_rows: ChunkRowsOption = 262144,
    threads: ThreadsOption = 2,
    no_progress: NoProgressOption = False,
) -> None:
    """Off-policy health of logged rollouts: ESS, chi^2, KL, M2 overall / per sequence / by age, the theory
    bounds with their slack, KL drift and FreshPER tau, and a what-if table of corrections."""
    from ..diagnose import DiagnoseConfig, WhatIfConfig, load_report, render  # loaded when run
    try:
        if from_report is not None:
            if log is not None:
                raise ValueError(f"give a LOG or --from-report, not both (got {log} and --from-report {from_report})")
            if save is not None:
                raise ValueError("--save needs a LOG: --from-report only rebuilds --figure from a saved report")
            if figure is None:
                raise ValueError("--from-report needs --figure PATH (the figure to rebuild)")
            check_new_file(figure, "--figure", FIGURE_FORMATS)
            report = load_report(from_report)
            if not report["by_age"]:
                raise ConfigError("report", f"{from_report} has no by-age table (its log had no age column): "
                                            "there is no figure to draw")
            save_figure(report, figure)
            typer.echo(f"wrote {figure}")
            return
        if log is None:
            raise ValueError("missing LOG: give a Parquet, CSV or JSON-lines file (or --from-report REPORT.json)")
        # outputs first: a bad path must not cost a pass over a large log
        if save is not None:
            check_new_file(save, "--save")
        if figure is not None:
            check_new_file(figure, "--figure", FIGURE_FORMATS)
        if save is not None and figure is not None and save.resolve() == figure.resolve():
            raise ValueError(f"--save and --figure both name {save}: choose two paths")
        what_if = WhatIfConfig(ppo_clip=_floats(clip, "--clip"), tis=_floats(tis, "--tis"),
                               mask=_floats(mask, "--mask"), m2po=_floats(m2po, "--m2po"),
                               m2po_batch_tokens=m2po_batch_tokens, freshper_tau=_floats(tau, "--tau"))
        config = DiagnoseConfig(path=str(log), preset=preset, columns=columns, format=fmt, chunk_rows=chunk_rows,
                                threads=threads, skip_invalid=skip_invalid, max_age_buckets=max_age_buckets,
                                what_if=what_if, run_what_if=not no_what_if)
        with on_ctrl_c("interrupted: diagnose writes --save and --figure only after its pass over the log, so "
                       "nothing was written; run the same command to start again"):
            report = _run(config, log, show_progress=not no_progress and sys.stderr.isatty())
    except ConfigError as err:
        raise ValueError(err.named(OPTION_OF_FIELD.get(err.field, err.field))) from None
    except MemoryError:  # memory is chunks x folds in flight, whatever the log's length
        raise ValueError(f"out of memory while diagnosing {log}: lower --chunk-rows (now {chunk_rows}) or --threads "
                         f"(now {threads}); with unsorted sequence ids every sequence is held") from None
    if figure is not None and report["by_age"]:
        save_figure(report, figure)
    if save is not None:
        write_new(save, lambda tmp: tmp.write_text(json.dumps(report, indent=1)), "--save")
    if as_json:
        typer.echo(json.dumps(report))
        return
    typer.echo(render(report))
    if figure is not None:
        typer.echo(f"\nfigure: {figure}" if report["by_age"] else "\nno figure: the log has no age column")
    if save is not None:
        typer.echo(f"report: {save}")


def register(app: typer.Typer) -> None:
    """Add ``diagnose`` to ``app``."""
    app.command("diagnose")(diagnose_command)

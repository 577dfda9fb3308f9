"""``replay-theory diagnose``: off-policy health and what-if analysis of a logged rollout file (diagnose/).

Options are the fields of ``DiagnoseConfig`` and its nested ``WhatIfConfig``; inputs are checked before the log is
read, and ``--save`` / ``--figure`` are new files, written whole or not at all.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..diagnose.errors import ConfigError
from ..diagnose.pipeline import DiagnoseConfig
from ..outputs import check_new_file, write_new
from .common import on_ctrl_c
from .config_options import config_from_options, with_field_options

#: DiagnoseConfig field (dotted into WhatIfConfig) -> the option a user types for it.
OPTIONS = {"preset": ("--preset",), "columns": ("--columns",), "format": ("--format",),
           "skip_invalid": ("--skip-invalid",), "what_if.ppo_clip": ("--clip",), "what_if.tis": ("--tis",),
           "what_if.mask": ("--mask",), "what_if.m2po": ("--m2po",),
           "what_if.m2po_batch_tokens": ("--m2po-batch-tokens",), "what_if.freshper_tau": ("--tau",),
           "max_age_buckets": ("--max-age-buckets",), "chunk_rows": ("--chunk-rows",), "threads": ("--threads",)}
OPTION_OF_FIELD = {"path": "LOG", "report": "--from-report",
                   **{path.rpartition(".")[2]: names[0] for path, names in OPTIONS.items()}}


def _run(config: DiagnoseConfig, log: Path, show_progress: bool) -> dict:
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


def _rebuild_figure(log: Optional[Path], save: Optional[Path], figure: Optional[Path], from_report: Path) -> None:
    """``--from-report``: the figure of a saved report, nothing else."""
    from ..figures.diagnose import FIGURE_FORMATS, figure_from_report

    if log is not None:
        raise ValueError(f"give a LOG or --from-report, not both (got {log} and --from-report {from_report})")
    if save is not None:
        raise ValueError("--save needs a LOG: --from-report only rebuilds --figure from a saved report")
    if figure is None:
        raise ValueError("--from-report needs --figure PATH (the figure to rebuild)")
    check_new_file(figure, "--figure", FIGURE_FORMATS)
    figure_from_report(from_report, figure)
    typer.echo(f"wrote {figure}")


def _check_outputs(log: Optional[Path], save: Optional[Path], figure: Optional[Path]) -> Path:
    """The outputs first: a bad path must not cost a pass over a large log. Returns the LOG, now known given."""
    if log is None:
        raise ValueError("missing LOG: give a Parquet, CSV or JSON-lines file (or --from-report REPORT.json)")
    if save is not None:
        check_new_file(save, "--save")
    if figure is not None:
        from ..figures.diagnose import FIGURE_FORMATS

        check_new_file(figure, "--figure", FIGURE_FORMATS)
    if save is not None and figure is not None and save.resolve() == figure.resolve():
        raise ValueError(f"--save and --figure both name {save}: choose two paths")
    return log


def _write_and_print(report: dict, save: Optional[Path], figure: Optional[Path], as_json: bool) -> None:
    if figure is not None and report["by_age"]:
        from ..figures.diagnose import save_figure

        save_figure(report, figure)
    if save is not None:
        write_new(save, lambda tmp: tmp.write_text(json.dumps(report, indent=1)), "--save")
    if as_json:
        typer.echo(json.dumps(report))
        return
    from ..diagnose import render

    typer.echo(render(report))
    if figure is not None:
        typer.echo(f"\nfigure: {figure}" if report["by_age"] else "\nno figure: the log has no age column")
    if save is not None:
        typer.echo(f"report: {save}")


@with_field_options((DiagnoseConfig, OPTIONS))
def diagnose_command(
    typed: dict,
    log: Annotated[Optional[Path], typer.Argument(metavar="LOG", help="Log file: Parquet, CSV or JSON lines (see "
                                                  "--preset).", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    figure: Annotated[Optional[Path], typer.Option("--figure", help="Write the ESS-by-age and KL-drift figure to "
                                                   "this new file (.png at print resolution, .pdf or .svg).")] = None,
    save: Annotated[Optional[Path], typer.Option("--save", help="Save the report (with its config) as JSON to this "
                                                 "new file.")] = None,
    from_report: Annotated[Optional[Path], typer.Option("--from-report", help="Rebuild --figure from a report saved "
                                                        "with --save, instead of reading a LOG.")] = None,
    no_what_if: Annotated[bool, typer.Option("--no-what-if", help="Statistics only.")] = False,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress bar (none either when stderr is not "
                                              "a terminal).")] = False,
) -> None:
    """Off-policy health of logged rollouts (ESS, chi^2, KL, M2, the theory bounds, KL drift) and a what-if table of
    corrections.

    Overall, per sequence and by age; the bounds with their slack, and FreshPER's tau."""
    try:
        if from_report is not None:
            return _rebuild_figure(log, save, figure, from_report)
        log = _check_outputs(log, save, figure)
        config = config_from_options(DiagnoseConfig, OPTIONS, typed, path=str(log), run_what_if=not no_what_if)
        try:
            with on_ctrl_c("interrupted: diagnose writes --save and --figure only after its pass over the log, so "
                           "nothing was written; run the same command to start again"):
                report = _run(config, log, show_progress=not no_progress and sys.stderr.isatty())
        except MemoryError:  # memory is chunks x folds in flight, whatever the log's length
            raise ValueError(f"out of memory while diagnosing {log}: lower --chunk-rows (now {config.chunk_rows}) or "
                             f"--threads (now {config.threads}); with unsorted sequence ids every sequence is held"
                             ) from None
    except ConfigError as err:
        raise ValueError(err.named(OPTION_OF_FIELD.get(err.field, err.field))) from None
    _write_and_print(report, save, figure, as_json)


def register(app: typer.Typer) -> None:
    """Add ``diagnose`` to ``app``."""
    app.command("diagnose")(diagnose_command)

"""``replay-theory diagnose``: off-policy health and what-if analysis of a logged rollout file.

Builds one :class:`~replay_theory.diagnose.DiagnoseConfig` from the
options and runs :func:`~replay_theory.diagnose.diagnose`; the
analysis itself lives in ``diagnose/`` and needs pyarrow, not torch.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer


def _floats(text: str, name: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{name} must be comma-separated numbers, got {text!r}") from None


def _atomic_write(path: Path, write) -> None:
    """Write through a temporary file in the same folder and rename: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _save_figure(report: dict, path: Path) -> None:
    from replay_theory.figures.diagnose import plot_ess_by_age

    figure = plot_ess_by_age(report)
    import matplotlib.pyplot as plt

    try:
        fmt = path.suffix.lstrip(".") or "png"
        _atomic_write(path, lambda tmp: figure.savefig(tmp, format=fmt, dpi=150, bbox_inches="tight"))
    finally:
        plt.close(figure)


def register(app: typer.Typer) -> None:
    @app.command()
    def diagnose(
        log: Optional[Path] = typer.Argument(None, help="Log file: Parquet, CSV or JSON lines (see --preset)."),
        preset: str = typer.Option("default", "--preset", help="Column names: default, trl or verl."),
        columns: Optional[str] = typer.Option(None, "--columns",
                                              help="Overrides, e.g. 'logp_behav=old_logp,age=version_gap'."),
        fmt: str = typer.Option("auto", "--format", help="auto, parquet, csv or jsonl."),
        as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
        figure: Optional[Path] = typer.Option(None, "--figure", help="Write ESS-by-age and KL-drift figure here."),
        save: Optional[Path] = typer.Option(None, "--save", help="Save the report (with its config) as JSON; "
                                                                 "never overwrites."),
        from_report: Optional[Path] = typer.Option(None, "--from-report",
                                                   help="Rebuild --figure from a saved report instead of a log."),
        skip_invalid: bool = typer.Option(False, "--skip-invalid",
                                          help="Drop and count NaN/inf/positive log-probs, bad ages and "
                                               "mismatched rows instead of stopping."),
        clip: str = typer.Option("0.2,0.28", "--clip", help="What-if PPO clip eps values."),
        tis: str = typer.Option("2,5", "--tis", help="What-if truncated-IS caps c (token and sequence)."),
        mask: str = typer.Option("2,5", "--mask", help="What-if masks: drop r outside [1/c, c]."),
        m2po: str = typer.Option("0.04", "--m2po", help="What-if M2PO tau_M2 values (needs advantages)."),
        m2po_batch_tokens: int = typer.Option(32768, "--m2po-batch-tokens",
                                              help="Tokens per M2PO masking batch."),
        tau: str = typer.Option("2,8", "--tau", help="What-if FreshPER age-decay tau values (needs ages)."),
        no_what_if: bool = typer.Option(False, "--no-what-if", help="Statistics only."),
        max_age_buckets: int = typer.Option(16, "--max-age-buckets", help="Age buckets in the by-age table."),
        chunk_rows: int = typer.Option(65536, "--chunk-rows", help="Rows read per chunk (memory bound)."),
        no_progress: bool = typer.Option(False, "--no-progress",
                                         help="No progress bar (none either when stderr is not a terminal)."),
    ) -> None:
        """Off-policy health of logged rollouts: ESS, chi^2, KL, M2 overall / per sequence / by age, the theory
        bounds with their slack, KL drift and FreshPER tau, and a what-if table of corrections."""
        if from_report is not None:
            if figure is None:
                raise ValueError("--from-report needs --figure PATH (the figure to rebuild)")
            try:
                report = json.loads(Path(from_report).read_text())
            except (OSError, json.JSONDecodeError) as err:
                raise ValueError(f"cannot read report {from_report}: {err}") from None
            _save_figure(report, figure)
            typer.echo(f"wrote {figure}")
            return
        if log is None:
            raise ValueError("missing LOG: give a Parquet, CSV or JSON-lines file (or --from-report REPORT.json)")
        if save is not None and save.exists():
            raise ValueError(f"--save {save} exists; results are never overwritten: choose a new path")
        from replay_theory.diagnose import DiagnoseConfig, WhatIfConfig, diagnose as run

        what_if = WhatIfConfig(ppo_clip=_floats(clip, "clip"), tis=_floats(tis, "tis"), mask=_floats(mask, "mask"),
                               m2po=_floats(m2po, "m2po"), m2po_batch_tokens=m2po_batch_tokens,
                               freshper_tau=_floats(tau, "tau"))
        config = DiagnoseConfig(path=str(log), preset=preset, columns=columns, format=fmt, chunk_rows=chunk_rows,
                                skip_invalid=skip_invalid, max_age_buckets=max_age_buckets, what_if=what_if,
                                run_what_if=not no_what_if)
        if no_progress or not sys.stderr.isatty():
            # rich writes a newline to a stderr that is not a terminal when the bar stops: keep a
            # redirected stderr empty on success and exactly one line on error
            report = run(config)
        else:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TimeElapsedColumn

            with Progress("diagnose", BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                          console=Console(file=sys.stderr), transient=True) as bar:
                task = bar.add_task("bytes", total=log.stat().st_size if log.is_file() else None)
                report = run(config, progress=lambda done, total: bar.update(task, completed=done))
        if figure is not None and report["by_age"]:
            _save_figure(report, figure)
        if save is not None:
            _atomic_write(save, lambda tmp: Path(tmp).write_text(json.dumps(report, indent=1)))
        if as_json:
            typer.echo(json.dumps(report))
            return
        from replay_theory.diagnose.report import render

        typer.echo(render(report))
        if figure is not None:
            typer.echo(f"\nfigure: {figure}" if report["by_age"] else "\nno figure: the log has no age column")
        if save is not None:
            typer.echo(f"report: {save}")

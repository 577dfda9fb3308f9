"""``replay-theory figures``: regenerate the theory figures and, where results exist, the results figures.

Output rules (issue 11): figures go to ``figures-out/`` unless ``--out`` says otherwise, never to the
tracked gallery by default (``figures/gallery/`` changes only when someone asks for it with
``--out figures/gallery``, so a casual run never dirties the checkout). ``--out`` must be new or empty (issue 32:
figures never mix with other files, so none is ever overwritten) and writable, checked before any work, with one
line otherwise (outputs.check_out_dir).
Every figure is rendered in memory first and the files are written only afterwards, so an error
leaves neither an empty nor a half-written directory behind. Every bad value is one line naming its
option, exit code 2 (``cli/app.py``'s ``main`` turns ValueError into that line); a ``--results`` folder given for
``all`` that does not exist is one (a typo there would otherwise skip every results figure and exit 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from ..figures.defaults import DPI, DPI_RANGE
from ..outputs import check_out_dir
from .common import on_ctrl_c

#: Default output directory: not the tracked gallery (see the module docstring); ignored by git.
DEFAULT_OUT = Path("figures-out")
FORMATS = ("png", "pdf", "svg")

NamesArgument = Annotated[Optional[list[str]], typer.Argument(help="Figures to build, or 'all' (default).")]
OutOption = Annotated[Path, typer.Option(
    "--out", help="Output directory, new or empty (created when the figures are written); files are never "
                  "overwritten.")]
FormatOption = Annotated[str, typer.Option("--format", help="Comma-separated formats: png, pdf, svg.")]
ListOption = Annotated[bool, typer.Option("--list", help="Name each figure with one line on what it shows.")]
DpiOption = Annotated[int, typer.Option(
    "--dpi", help=f"Resolution of raster output, {DPI_RANGE[0]}..{DPI_RANGE[1]} dots per inch.")]
ResultsOption = Annotated[Path, typer.Option(
    "--results", help="Results root: RESULTS/<experiment>/ from `replay-theory experiment`, "
                      "RESULTS/validation/ from `replay-theory validate all`.")]


def parse_formats(fmt: str) -> list[str]:
    """``--format``'s comma-separated list, each format once, in the order given."""
    formats = list(dict.fromkeys(f.strip() for f in fmt.split(",") if f.strip()))
    if not formats or any(f not in FORMATS for f in formats):
        raise ValueError(f"--format must be a comma-separated subset of {', '.join(FORMATS)}, got {fmt!r}")
    return formats


def check_results_dir(results: Path, given: bool) -> None:
    """A ``--results`` the user ``given`` must be a folder (a typo would otherwise skip every results figure and
    exit 0); the default ``results/`` may be absent (then the theory figures only)."""
    if not given:
        return
    if not results.exists():
        raise ValueError(f"--results {results}: no such folder; give the folder `replay-theory experiment` or "
                         "`replay-theory validate all` wrote into (RESULTS/<experiment>/, RESULTS/validation/)")
    if not results.is_dir():
        raise ValueError(f"--results {results} is a file; give the results folder")


def check_dpi(dpi: int) -> None:
    """Refuse a --dpi outside DPI_RANGE: 0 cannot render, 100000 asks for gigabytes of pixels."""
    low, high = DPI_RANGE
    if not low <= dpi <= high:
        raise ValueError(f"--dpi must be an integer in {low}..{high}, got {dpi}")


def write_all(out: Path, files: list[tuple[str, bytes]]) -> list[Path]:
    """Write every (file name, bytes) under ``out``, creating it; on any error remove what this call wrote.

    Files are opened in exclusive mode (never overwriting one that appeared meanwhile) with the
    process's umask (0644 normally). Returns the written paths.
    """
    created = [p for p in (out, *out.parents) if not p.exists()]
    written: list[Path] = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, data in files:
            path = out / name
            with open(path, "xb") as handle:
                written.append(path)
                handle.write(data)
    except OSError as err:
        for path in written:
            path.unlink(missing_ok=True)
        for directory in created:  # deepest first: out, then the parents this call made
            if directory.exists() and not any(directory.iterdir()):
                directory.rmdir()
        raise ValueError(f"--out {out}: cannot write {Path(err.filename or out).name} ({err.strerror}); "
                         f"nothing was written") from None
    return written


def register(app: typer.Typer) -> None:
    @app.command()
    def figures(
        ctx: typer.Context,
        names: NamesArgument = None,
        out: OutOption = DEFAULT_OUT,
        fmt: FormatOption = "png",
        list_only: ListOption = False,
        dpi: DpiOption = DPI,
        results: ResultsOption = Path("results"),
    ) -> None:
        """Regenerate figures (matplotlib): theory figures always, results figures whose results exist."""
        # matplotlib loads here, not at import, so that other commands start without it.
        import matplotlib.pyplot as plt

        from ..figures.results import RESULTS_FIGURES, MissingResults, check_results
        from ..figures.style import render
        from ..figures.theory import THEORY_FIGURES

        available: dict[str, tuple[str, Callable]] = dict(THEORY_FIGURES)
        available.update({name: (text, lambda plot=plot: plot(results))
                          for name, (text, plot) in RESULTS_FIGURES.items()})
        if list_only:
            for name, (description, _) in available.items():
                typer.echo(f"{name:<20} {description}")
            return
        # Every check before any work: nothing is rendered or created until all of them pass.
        formats = parse_formats(fmt)
        check_dpi(dpi)
        everything = not names or names == ["all"]
        chosen = list(available) if everything else list(dict.fromkeys(names))
        unknown = [n for n in chosen if n not in available]
        if unknown:
            raise ValueError(f"unknown figure(s) {', '.join(unknown)}; choose from {', '.join(available)} or all")
        if everything:  # a named results figure says which experiment's folder it misses; `all` would skip them all
            check_results_dir(results, ctx.get_parameter_source("results").name != "DEFAULT")
        check_out_dir(out, ours=lambda folder: False)  # new or empty: figures never mix with other files
        skipped = []
        for name in [n for n in chosen if n in RESULTS_FIGURES]:
            try:
                check_results(name, results)
            except MissingResults as err:
                if not everything:
                    raise
                skipped.append(f"{name}: {err}")
                chosen.remove(name)
        files = []
        with on_ctrl_c(f"interrupted: the figures are written together once all are drawn, so nothing was written "
                       f"to {out}; run the same command to start again"):
            for name in chosen:
                figure = available[name][1]()
                try:
                    files += [(f"{name}.{f}", render(figure, f, dpi)) for f in formats]
                finally:
                    plt.close(figure)
        for path in write_all(out, files):
            typer.echo(str(path))
        for line in skipped:
            typer.echo(f"skipped {line}")

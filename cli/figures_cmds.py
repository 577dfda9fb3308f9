"""``replay-theory figures``: regenerate the theory figures and, where results exist, the results figures.

They go to ``figures-out/`` unless ``--out`` says otherwise (``--out figures/gallery`` for the tracked gallery); the
checks and the all-or-nothing write are figures/files.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..figures.defaults import DPI, DPI_RANGE
from ..figures.files import build, check_dpi, descriptions, parse_formats, write_all
from .common import on_ctrl_c

#: Default output directory: not the tracked gallery (see the module docstring); ignored by git.
DEFAULT_OUT = Path("figures-out")


def register(app: typer.Typer) -> None:
    @app.command()
    def figures(
        ctx: typer.Context,
        names: Annotated[Optional[list[str]], typer.Argument(help="Figures to build, or 'all' (default).")] = None,
        out: Annotated[Path, typer.Option("--out", help="Output directory, new or empty (created when the figures "
                                          "are written); files are never overwritten.")] = DEFAULT_OUT,
        fmt: Annotated[str, typer.Option("--format", help="Comma-separated formats: png, pdf, svg.")] = "png",
        list_only: Annotated[bool, typer.Option("--list", help="Name each figure with one line on what it "
                                                "shows.")] = False,
        dpi: Annotated[int, typer.Option("--dpi", help=f"Resolution of raster output, {DPI_RANGE[0]}..{DPI_RANGE[1]} "
                                         "dots per inch.")] = DPI,
        results: Annotated[Path, typer.Option("--results", help="Results root: RESULTS/<experiment>/ from "
                                              "`replay-theory experiment`, RESULTS/validation/ from `replay-theory "
                                              "validate all`.")] = Path("results"),
    ) -> None:
        """Regenerate figures (matplotlib): theory figures always, results figures whose results exist."""
        if list_only:
            for line in descriptions():
                typer.echo(line)
            return
        formats = parse_formats(fmt)
        check_dpi(dpi)
        with on_ctrl_c(f"interrupted: the figures are written together once all are drawn, so nothing was written "
                       f"to {out}; run the same command to start again"):
            source = ctx.get_parameter_source("results")
            assert source is not None  # click records the source of every parameter of the running command
            files, skipped = build(names, results, formats, dpi, source.name != "DEFAULT", out)
        for path in write_all(out, files):
            typer.echo(str(path))
        for line in skipped:
            typer.echo(f"skipped {line}")

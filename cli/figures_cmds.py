"""``replay-theory figures``: regenerate figures (theory figures today; results figures are issue 5's rest)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

FORMATS = ("png", "pdf", "svg")
# Strip the version and date stamps so the same data gives byte-identical files.
METADATA = {"png": {"Software": None}, "pdf": {"CreationDate": None, "Producer": None}, "svg": {"Date": None}}


def register(app: typer.Typer) -> None:
    @app.command()
    def figures(
        names: Optional[list[str]] = typer.Argument(None, help="Figures to build, or 'all' (default)."),
        out: Path = typer.Option(Path("figures/gallery"), "--out", help="Output directory."),
        fmt: str = typer.Option("png", "--format", help="Comma-separated formats: png, pdf, svg."),
        list_only: bool = typer.Option(False, "--list", help="Name each figure with one line on what it shows."),
        dpi: int = typer.Option(120, "--dpi", help="Resolution of raster formats."),
    ) -> None:
        """Regenerate figures (matplotlib) from the theory; one file per figure and format."""
        from replay_theory.figures.theory import THEORY_FIGURES

        if list_only:
            for name, (description, _) in THEORY_FIGURES.items():
                typer.echo(f"{name:<20} {description}")
            return
        formats = [f.strip() for f in fmt.split(",") if f.strip()]
        bad = [f for f in formats if f not in FORMATS]
        if bad or not formats:
            raise ValueError(f"format must be a comma-separated subset of {', '.join(FORMATS)}, got {fmt!r}")
        chosen = list(THEORY_FIGURES) if not names or names == ["all"] else names
        unknown = [n for n in chosen if n not in THEORY_FIGURES]
        if unknown:
            raise ValueError(f"unknown figure(s) {', '.join(unknown)}; choose from {', '.join(THEORY_FIGURES)} or all")
        import matplotlib.pyplot as plt

        out.mkdir(parents=True, exist_ok=True)
        for name in chosen:
            figure = THEORY_FIGURES[name][1]()
            for f in formats:
                path = out / f"{name}.{f}"
                figure.savefig(path, dpi=dpi, bbox_inches="tight", metadata=METADATA[f])
                typer.echo(str(path))
            plt.close(figure)

"""``replay-theory figures``: regenerate the theory figures and, where results exist, the results figures."""

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
        results: Path = typer.Option(Path("results"), "--results",
                                     help="Results root: RESULTS/<experiment>/ from `replay-theory experiment`, "
                                          "RESULTS/validation/ from `replay-theory validate all`."),
    ) -> None:
        """Regenerate figures (matplotlib): theory figures always, results figures whose results exist."""
        from functools import partial

        from replay_theory.figures.results import RESULTS_FIGURES, MissingResults
        from replay_theory.figures.theory import THEORY_FIGURES

        available = dict(THEORY_FIGURES)
        available.update({name: (text, partial(plot, results)) for name, (text, plot) in RESULTS_FIGURES.items()})
        if list_only:
            for name, (description, _) in available.items():
                typer.echo(f"{name:<20} {description}")
            return
        formats = [f.strip() for f in fmt.split(",") if f.strip()]
        bad = [f for f in formats if f not in FORMATS]
        if bad or not formats:
            raise ValueError(f"format must be a comma-separated subset of {', '.join(FORMATS)}, got {fmt!r}")
        everything = not names or names == ["all"]
        chosen = list(available) if everything else names
        unknown = [n for n in chosen if n not in available]
        if unknown:
            raise ValueError(f"unknown figure(s) {', '.join(unknown)}; choose from {', '.join(available)} or all")
        import matplotlib.pyplot as plt

        out.mkdir(parents=True, exist_ok=True)
        missing = []
        for name in chosen:
            try:
                figure = available[name][1]()
            except MissingResults as err:
                if not everything:
                    raise
                missing.append(f"{name}: {err}")
                continue
            for f in formats:
                path = out / f"{name}.{f}"
                figure.savefig(path, dpi=dpi, bbox_inches="tight", metadata=METADATA[f])
                typer.echo(str(path))
            plt.close(figure)
        for line in missing:
            typer.echo(f"skipped {line}")

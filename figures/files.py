"""The files of ``replay-theory figures``: the checks of its options and the all-or-nothing write (issue 11, 32).

Every figure is rendered in memory first and written only afterwards (``write_all``), so an error leaves neither an
empty nor a half-written directory behind; each bad value is one ``ValueError`` line naming its option. Importable
without matplotlib (``build`` imports it when it draws).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .defaults import DPI_RANGE

FORMATS = ("png", "pdf", "svg")


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


def build(names: list[str] | None, results: Path, formats: list[str], dpi: int, results_given: bool,
          out: Path) -> tuple[list[tuple[str, bytes]], list[str]]:
    """(file name, bytes) of every figure ``names`` asks for (None or ``["all"]``: every one, skipping the results
    figures whose results are missing), and the skipped lines; every check runs before anything is drawn."""
    import matplotlib.pyplot as plt

    from ..outputs import check_out_dir
    from .results import RESULTS_FIGURES, MissingResults, check_results
    from .style import render
    from .theory import THEORY_FIGURES

    available: dict[str, tuple[str, Callable]] = {**THEORY_FIGURES, **{
        name: (text, lambda plot=plot: plot(results)) for name, (text, plot) in RESULTS_FIGURES.items()}}
    everything = not names or names == ["all"]
    chosen = list(available) if everything else list(dict.fromkeys(names or ()))
    unknown = [n for n in chosen if n not in available]
    if unknown:
        raise ValueError(f"unknown figure(s) {', '.join(unknown)}; choose from {', '.join(available)} or all")
    if everything:  # a named results figure says which experiment's folder it misses; `all` would skip them all
        check_results_dir(results, results_given)
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
    for name in chosen:
        figure = available[name][1]()
        try:
            files += [(f"{name}.{f}", render(figure, f, dpi)) for f in formats]
        finally:
            plt.close(figure)
    return files, skipped


def descriptions() -> list[str]:
    """``figures --list``: each figure's name and what it shows."""
    from .results import RESULTS_FIGURES
    from .theory import THEORY_FIGURES

    return [f"{name:<20} {text}" for name, (text, _) in {**THEORY_FIGURES, **RESULTS_FIGURES}.items()]

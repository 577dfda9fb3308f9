"""One progress bar for every long simulator job (sweeps, experiments, the theory-test benchmark).

rich (typer's own dependency) draws it on stderr, so stdout keeps only results; it shows the count,
elapsed time and an ETA, and is a no-op when disabled (``--no-progress``, tests).
"""

from __future__ import annotations

import sys
import time


class ProgressBar:
    """``label`` done / ``total`` with elapsed time and ETA; ``tick()`` keeps the clock live inside a long item."""

    def __init__(self, label: str, total: int, done: int = 0, enabled: bool = True):
        self.bar = None
        self.last = 0.0
        if enabled:
            from rich.console import Console  # imported only when a bar is shown: `optimal` starts without it
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                TimeRemainingColumn(), console=Console(file=sys.stderr))
            self.bar.start()
            self.task = self.bar.add_task(label, total=total, completed=done)

    def tick(self) -> None:
        """Redraw at most twice a second (a redraw costs about one training step)."""
        if self.bar is not None and time.monotonic() - self.last > 0.5:
            self.last = time.monotonic()
            self.bar.refresh()

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)

    def update(self, done: int) -> None:
        """Set the count (for work reported as a running total, e.g. seconds of a window)."""
        if self.bar is not None:
            self.bar.update(self.task, completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()

"""One progress bar for every long simulator job (sweeps, experiments, the theory-test benchmark).

On a terminal rich (typer's own dependency) draws it on stderr, so stdout keeps only results; it shows the count,
elapsed time and an ETA, and is a no-op when disabled (``--no-progress``, tests). Where stderr is a file or a pipe
(``nohup``, a batch scheduler's log, CI) a live bar never draws, so the same facts go out as plain lines instead:
one every ``LINE_EVERY_S`` seconds at most (none in a short command), one at the end.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO

LINE_EVERY_S = 30.0
"""Seconds between two plain progress lines (stderr not a terminal): a log of a long run stays readable."""


def clock_text(seconds: float) -> str:
    """h:mm:ss, as rich's bar shows it: 3725.4 -> '1:02:05'."""
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class ProgressBar:
    """``label`` done / ``total`` with elapsed time and ETA; ``tick()`` keeps the clock live inside a long item.

    ``stream`` and ``clock`` default to stderr and ``time.monotonic`` (tests pass their own). The ETA counts only the
    work done since this bar started (items done before, ``done``, as a resumed run's, took no time here)."""

    def __init__(self, label: str, total: int, done: int = 0, enabled: bool = True,
                 stream: Optional[TextIO] = None, clock: Callable[[], float] = time.monotonic):
        self.bar = None
        self.lines: Optional[TextIO] = None
        self.last = 0.0
        if not enabled:
            return
        from rich.console import Console  # imported only when a bar is shown: `optimal` starts without it

        console = Console(file=sys.stderr if stream is None else stream)
        if console.is_terminal or console.is_jupyter:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                TimeRemainingColumn(), console=console)
            self.bar.start()
            self.task = self.bar.add_task(label, total=total, completed=done)
            return
        self.lines = console.file
        self.label, self.total, self.done, self.first = label, total, done, done
        self.clock = clock
        self.started = self.printed = clock()

    def _line(self) -> None:
        """'label: done/total (pct%), elapsed h:mm:ss, ETA h:mm:ss' (ETA '?' before the first item done here)."""
        elapsed = self.clock() - self.started
        new = self.done - self.first
        left = "?" if new <= 0 else clock_text(elapsed / new * max(self.total - self.done, 0))
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total > 0 else ""
        self.lines.write(f"{self.label}: {self.done}/{self.total}{share}, elapsed {clock_text(elapsed)}, "
                         f"ETA {left}\n")
        self.lines.flush()
        self.printed = self.clock()

    def _maybe_line(self) -> None:
        if self.clock() - self.printed >= LINE_EVERY_S:
            self._line()

    def tick(self) -> None:
        """Redraw at most twice a second (a redraw costs about one training step); a plain line when one is due."""
        if self.lines is not None:
            self._maybe_line()
        elif self.bar is not None and time.monotonic() - self.last > 0.5:
            self.last = time.monotonic()
            self.bar.refresh()

    def advance(self) -> None:
        if self.lines is not None:
            self.done += 1
            self._maybe_line()
        elif self.bar is not None:
            self.bar.advance(self.task)

    def update(self, done: int) -> None:
        """Set the count (for work reported as a running total, e.g. seconds of a window)."""
        if self.lines is not None:
            self.done = done
            self._maybe_line()
        elif self.bar is not None:
            self.bar.update(self.task, completed=done)

    def close(self) -> None:
        """The last line (plain mode) or the bar's final state; a second close adds nothing."""
        if self.lines is not None:
            self._line()
            self.lines = None
        elif self.bar is not None:
            self.bar.stop()
            self.bar = None

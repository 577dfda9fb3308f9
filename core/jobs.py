"""Worker processes for independent runs: the one ``--jobs`` rule of the simulator's sweeps and verify.

Both run units that share nothing (a sweep's configurations, verify's design x learning rate x seed runs) on
joblib's process pool (loky: it restarts a crashed worker and stops every worker on Ctrl-C, which a hand-written
``multiprocessing`` pool does not). Each unit fixes its own seeds, so what it returns does not depend on which
worker ran it or how many there were.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any


def check_jobs(n_jobs: int) -> int:
    """joblib's n_jobs as this package allows it: -1 (all cores) or a count >= 1."""
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or (n_jobs != -1 and n_jobs < 1):
        raise ValueError(f"--jobs must be -1 (all cores) or an integer >= 1, got {n_jobs!r}")
    return n_jobs


def local_workers(n_jobs: int, n_units: int) -> int:
    """Workers of a local pool: ``n_jobs`` (-1: every core), never more than the units to run.

    -1 counts cores as loky does (joblib.cpu_count: the CPUs this process may use, cgroup limits included).
    """
    import joblib  # a command that runs nothing in parallel does not load it

    cores = n_jobs if n_jobs != -1 else joblib.cpu_count()
    return max(1, min(cores, n_units))


def run_unordered(function: Callable[..., Any], units: Iterable[tuple], n_jobs: int, backend: str = "loky",
                  batch_size: int | str = "auto") -> Iterator[Any]:
    """``function(*unit)`` for every unit on ``n_jobs`` joblib workers, yielded as each finishes (any order).

    ``batch_size``: units sent to a worker at once. joblib's "auto" groups short units to save round trips, but a
    group's results come back only when all of it is done: pass 1 for units of minutes (verify's runs), so that
    each is reported as it finishes and no worker idles at the end while another works through a group.
    """
    import joblib

    with joblib.parallel_config(backend=backend, n_jobs=n_jobs):
        # joblib is untyped: pyright reads its batch_size="auto" default as `str`, but it takes an int too
        yield from joblib.Parallel(return_as="generator_unordered", batch_size=batch_size)(  # pyright: ignore[reportArgumentType]
            joblib.delayed(function)(*u) for u in units)

"""Size options bounded before any work: an absolute integer ceiling, and the memory the command would allocate.

Every size a command allocates by (seeds, batch, capacity, steps, samples, tokens, ...) is checked twice, in the
config's validation, before any allocation, warm-up, cache, checkpoint or output folder:

1. ``MAX_SIZE`` (2**31 - 1): whatever the memory, an integer size above it is refused, so that a product of a few
   sizes (seeds x batch x tokens) stays exact in int64 and float64 and no index overflows;
2. the peak bytes the command's own estimate gives (one function per command family, next to its config:
   ``simulate.config.peak_bytes``, ``simulate.calibrate.probe_peak_bytes``, ``validate.trl_run.peak_bytes``,
   ``validate.config.peak_bytes``, ``diagnose.pipeline.peak_bytes``), against ``memory_limit()``: the machine's
   physical memory, or the cgroup's limit where that is lower. A run that needs more cannot finish here whatever
   else runs, so refusing it loses nothing; one that fits may still meet other processes' memory, which the
   operating system reports. Physical memory, not a small constant: a large machine runs large configs.

The estimates count the dominant arrays (their shapes times their bytes, with the copies the code makes) and are
meant to be right within a factor of about 2 (tests/integration/test_sizes.py measures one against the real peak).
A refusal is one line naming the option, what it would need and its valid range with the other options as given
(``check_sizes``): the largest value that fits, found by bisection on the estimate (which grows with each size).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

MAX_SIZE = 2**31 - 1
"""The absolute ceiling of every integer size: products of three such sizes stay below 2**93 in Python and the
int64 products the arrays index (2**31 x 2**31 < 2**63)."""

_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def memory_limit() -> int:
    """The most memory a process here can hold, in bytes: physical memory (``SC_PHYS_PAGES x SC_PAGE_SIZE``), or the
    cgroup's limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) when it is lower."""
    try:
        limit = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): no machine bound, the ceiling remains
        limit = 2**62
    for path in _CGROUP_LIMITS:
        try:
            with open(path, encoding="ascii") as handle:
                text = handle.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < limit:
            limit = int(text)
    return limit


def show_bytes(n: float) -> str:
    """Bytes as a person reads them: ``745 GiB``, ``1.5 GiB``, ``380 MiB``."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            value = n / size
            return f"{value:.3g} {unit}" if value < 100 or value >= 1e6 else f"{value:,.0f} {unit}"
    return f"{n:.0f} bytes"


def count(n: float) -> str:
    """A count in a message: exact while it reads as one (``8192``), else three digits (``6.06e+30``)."""
    return f"{int(n)}" if n < 1e15 else f"{n:.3g}"


@dataclass(frozen=True)
class Estimate:
    """Peak bytes of a run, by what holds them: ``{description: bytes}`` (a description says its shape)."""

    terms: Mapping[str, float]

    @property
    def total(self) -> float:
        return float(sum(self.terms.values()))

    def dominant(self) -> str:
        """The term that holds the most, as written in the message."""
        return max(self.terms.items(), key=lambda item: item[1])[0]


@dataclass(frozen=True)
class Size:
    """One size of a command: its name as the caller's message names it (an option, a config field), its smallest
    valid value, whether it is an integer (a float rate such as ``workers`` is bounded by the estimate alone) and
    whether the estimate grows with it (False: a count no array grows with, bounded by ``MAX_SIZE`` alone)."""

    name: str
    low: float = 1
    integer: bool = True
    memory: bool = True


def check_ceiling(name: str, value: object, low: int) -> int:
    """``value`` an int (not a bool) in [low, MAX_SIZE]: else a one-line ValueError naming ``name`` and that range."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_SIZE:
        from ..checks import invalid

        raise invalid(name, f"an integer in [{low}, {MAX_SIZE}]", value)
    return value


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform says, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_threads(name: str, value: object) -> int:
    """A thread count in [1, the CPUs this process may use]: more only wait for a core (and a huge count would
    reserve a stack per thread), so a larger one is refused as a typo, in one line."""
    cpus = usable_cpus()
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= cpus:
        from ..checks import invalid

        raise invalid(name, f"an integer in [1, {cpus}] (the CPUs this process may use)", value)
    return value


def _largest_fitting(size: Size, value: float, fits: Callable[[float], bool]) -> float | None:
    """The largest value of ``size`` in [low, value] for which ``fits`` holds (None: not even ``low``), by bisection
    (``fits`` is monotone: every estimate grows with each of its sizes)."""
    low = size.low if size.integer else 0.0
    if size.integer:
        if not fits(low):
            return None
        lo, hi = int(low), int(value)  # fits(lo), not fits(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo
    lo, hi = 0.0, float(value)  # a rate > 0: bisect in log space between a tiny value and the one given
    tiny = hi * 1e-300 if hi > 0 else 0.0
    if not fits(tiny):
        return None
    lo = tiny
    for _ in range(200):
        mid = math.sqrt(lo * hi) if lo > 0 else hi / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        if hi <= lo * (1 + 1e-6):
            break
    return lo


def check_sizes(sizes: Sequence[Size], values: Mapping[str, float], estimate: Callable[[Mapping[str, float]], Estimate],
                *, defaults: Mapping[str, float] | None = None, limit: int | None = None,
                where: str = "with the other options as given") -> Estimate:
    """Refuse, in one line, sizes above ``MAX_SIZE`` or whose ``estimate`` exceeds ``limit`` (default
    ``memory_limit()``); returns the estimate when everything fits.

    ``values`` maps each ``Size.name`` to its value (plus whatever else ``estimate`` reads). Of the sizes that alone
    could be lowered until the run fits, the line names the one furthest above its default (``defaults``: most likely
    the one typed), then the one furthest above the largest value that fits; when none can, it names them all.
    """
    for size in sizes:
        if size.integer:
            check_ceiling(size.name, values[size.name], int(size.low))
    limit = memory_limit() if limit is None else limit
    need = estimate(values)
    if need.total <= limit:
        return need
    machine = f"more than the {show_bytes(limit)} of memory this machine has"
    worst: tuple[tuple[float, float], Size, float] | None = None
    for size in sizes:
        value = values[size.name]
        if not size.memory or value <= size.low:
            continue
        best = _largest_fitting(size, value, lambda v, s=size: estimate({**values, s.name: v}).total <= limit)
        if best is None:
            continue
        default = (defaults or {}).get(size.name)
        unusual = value / default if default else 1.0
        excess = (max(unusual, 1.0), value / best if best > 0 else math.inf)
        if worst is None or excess > worst[0]:
            worst = (excess, size, best)
    if worst is None:
        given = ", ".join(f"{s.name} {values[s.name]:g}" for s in sizes if s.memory)
        raise ValueError(f"{given} need about {show_bytes(need.total)} together (mostly {need.dominant()}), {machine}; "
                         "valid: lower these until they fit")
    _, size, best = worst
    shown = f"{values[size.name]}" if size.integer else f"{values[size.name]:g}"
    valid = (f"an integer in [{int(size.low)}, {int(best)}]" if size.integer
             else f"a number in (0, {best:.4g}]")
    raise ValueError(f"{size.name} {shown} needs about {show_bytes(need.total)} (mostly {need.dominant()}), "
                     f"{machine}; valid: {valid} {where}")

"""One BLAS thread for the simulator's small matrix products.

The engine's products are small: (S, d) @ (d, P A) and (S, P A) @ (P A, d) for
the bandit (64 x 16 x 1024 at 64 seeds), a few thousand rows by tens of columns
for the token MDP. OpenBLAS splits any product above ~2.6e5 multiply-adds
over all cores, and waking its threads costs more than the product: on two
cores, 64 x 16 @ 16 x 1024 takes ~65 us on one thread, ~260 us on two, and
milliseconds when another process holds the second core. Every output element
is computed by the same kernel either way (the threads split rows and columns,
not the inner sum), so results are bit-identical; only the time changes.

``single_threaded_blas()`` sets OpenBLAS to one thread for a block and restores
the previous count after it. It finds the OpenBLAS libraries this process has
loaded (numpy's and scipy's bundled ``scipy_openblas``, or a system OpenBLAS)
through ``/proc/self/maps`` and calls their ``openblas_set_num_threads``, which
is what threadpoolctl does. Elsewhere (no /proc, MKL, Accelerate) it does
nothing. The setting is process-wide: a block running in one Python thread also
affects BLAS calls made meanwhile from other threads.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from typing import Iterator

# (getter, setter) symbol pairs of the OpenBLAS builds numpy and scipy ship or link against
_SYMBOLS = (
    ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
    ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
    ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
    ("openblas_get_num_threads", "openblas_set_num_threads"),
)


@functools.lru_cache(maxsize=1)
def _openblas_controls() -> tuple[tuple[ctypes._CFuncPtr, ctypes._CFuncPtr], ...]:
    """(get_num_threads, set_num_threads) of every OpenBLAS library loaded in this process."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps
                            if len(line.split()) >= 6 and "openblas" in os.path.basename(line.split()[-1]).lower()})
    except OSError:
        return ()
    controls = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)  # already loaded: this only returns its handle
        except OSError:
            continue
        for get_name, set_name in _SYMBOLS:
            get, put = getattr(lib, get_name, None), getattr(lib, set_name, None)
            if get is not None and put is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                put.restype, put.argtypes = None, [ctypes.c_int]
                controls.append((get, put))
                break
    return tuple(controls)


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Run the block with one OpenBLAS thread (a no-op where OpenBLAS cannot be found)."""
    controls = _openblas_controls()
    before = [get() for get, _ in controls]
    for _, put in controls:
        put(1)
    try:
        yield
    finally:
        for (_, put), threads in zip(controls, before):
            put(threads)

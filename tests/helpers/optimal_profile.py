"""What a user gives ``replay-theory optimal`` for a replay or epochs answer since the guarded rule (theory/guarded.py,
issue 38): ``--optimizer sgd`` and a ``--profile`` whose sigma^2(s) table by age reaches as far as the reuse may go
(``Staleness.oldest_measured``). The ``optimal_profile`` fixture (tests/conftest.py) writes such a file; tests price
the same table with ``staleness`` to compare optimal's answer with ``theory.guarded.guarded_design``.
"""

from __future__ import annotations

import json
from pathlib import Path

from replay_theory.theory import forgetting as fg

FLAT_TO_63 = ((0.0, 63.0), (1.0, 1.0))
"""(ages, sigma^2): no staleness cost up to age 63, the oldest sample a FIFO of optimal's --max-horizon 64 steps trains
on. Priced as ``NO_STALENESS`` is, but measured: the guard on unmeasured staleness leaves replay's whole horizon
open."""


def staleness(table: tuple = FLAT_TO_63) -> fg.Staleness:
    """The staleness cost optimal reads from a profile carrying ``table`` (advise/optimal.py, ``_staleness_of``)."""
    return fg.staleness_of_table(table[0], table[1], "plain")


def write_profile(path: Path, b_noise: float, table: tuple = FLAT_TO_63, memory: dict | None = None) -> str:
    """A profile of kind table: ``table``'s sigma^2(s), a measured B_noise (--noise-scale and --profile together are
    refused, so the profile carries it) and, when given, a ``memory`` record; returns the path as a string."""
    ages, sigma_sq = table
    data = {"kind": "table", "staleness": list(ages), "sigma_sq": list(sigma_sq), "sigma_sq_form": "plain",
            "noise_scale": {"b_noise": b_noise, "method": "test"}}
    if memory is not None:
        data["memory"] = memory
    path.write_text(json.dumps(data))
    return str(path)

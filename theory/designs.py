"""One synchronous replay design (B, R, N): the type every layer names a design by.

Paper: experience-replay (docs/REFERENCES.md), Sec. 3: each step generates R fresh responses into a FIFO of N and
draws B uniformly with replacement for one update; on-policy uses the R = N = B fresh responses once each. The
forgetting model (theory/forgetting.py) predicts a ``Design``'s steps and compute, ``optimal`` answers with one,
``core.designs.DesignConfig`` reads and builds one (``.design``, ``from_design``), the simulator and the benchmark
train one. The field names are DesignConfig's and the command line's, from the option to the buffer.

| code name            | symbol  | meaning                                                      |
|----------------------|---------|--------------------------------------------------------------|
| ``batch_size``       | B       | responses per update                                         |
| ``rollouts_per_step``| R       | fresh responses generated per step                           |
| ``capacity``         | N       | FIFO capacity in responses (>= R)                            |
| ``group_size``       | G       | responses per prompt (each buffer's rules say what it needs) |
| ``x``                | x = N/R | the buffer's horizon in steps                                |
| ``y``                | y = B/R | the replay ratio                                             |
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import require_int


@dataclass(frozen=True)
class Design:
    """One synchronous design: B drawn per update from a FIFO of N holding R fresh samples a step (on-policy:
    N = R = B, each fresh sample used once, no replacement)."""

    batch_size: int  # B
    rollouts_per_step: int  # R
    capacity: int  # N
    on_policy: bool = False
    group_size: int = 1  # G

    def __post_init__(self) -> None:
        B, R, N, G = self.batch_size, self.rollouts_per_step, self.capacity, self.group_size
        for name, value in (("batch B", B), ("rollouts R", R), ("capacity N", N), ("group size G", G)):
            if not (type(value) is int and value >= 1):  # the common case checked without numpy: searches build many
                require_int(name, value, 1)
        if self.on_policy and not B == R == N:
            raise ValueError(f"on-policy needs N = R = B, got N={N}, R={R}, B={B}")
        if N < R:
            raise ValueError(f"capacity N must be >= rollouts R (a FIFO holds at least one step), got N={N}, R={R}")

    @property
    def x(self) -> int:
        """N / R in whole steps: the buffer's horizon (the forgetting model takes N a multiple of R)."""
        return self.capacity // self.rollouts_per_step

    @property
    def y(self) -> float:
        """B / R: the replay ratio."""
        return self.batch_size / self.rollouts_per_step

    @classmethod
    def on_policy_at(cls, batch_size: int, group_size: int = 1) -> "Design":
        """On-policy at B: R = N = B."""
        B = int(batch_size)
        return cls(B, B, B, True, group_size)

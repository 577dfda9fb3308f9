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
| ``epochs``           | e       | passes over one generation of R (PPO epochs, TRL num_iterations) |
| ``mini_batches``     | m       | updates per pass, each on B = R/m of the generation          |
| ``max_staleness``    | k       | asynchronous generation k updates ahead: each rollout used once, at age k |
| ``selective``        | --      | only groups whose rewards are not all equal are trained ([E8], [E11]) |
| ``x``                | x = N/R | the buffer's horizon in steps                                |
| ``y``                | y = B/R | the replay ratio                                             |

An epoch design (e m > 1, issue 40) generates R every e m updates and trains e passes over m mini-batches of B = R/m:
N = R (nothing outlives its generation), B m = R, never on-policy; e = m = 1 is the FIFO / on-policy design above.
An overlapped design (k >= 1, issue 40: one-step-off generation, TRL / verl / AReaL ``max_staleness``) is on-policy in
its sizes (N = R = B, each rollout used once) but trained k updates after the policy that generated it, while the next
generation runs on its own share of the GPUs (``forgetting.overlapped_split``). A selective design (issue 40,
docs/THEORY.md [E8]) is a FIFO (B, R, N) whose buffer admits only the groups with a non-zero advantage (RLEP,
ExGRPO; TRL logs the rest as frac_reward_zero_std): every generated R is charged, (1 - z) R enter. A selective
on-policy design is dynamic sampling (DAPO; verl ``filter_groups``, NeMo-RL ``use_dynamic_sampling``, SkyRL's
``dynamic_sampling`` filter; docs/THEORY.md [E9], [E11]): rounds of R = B rollouts are generated until B of them are in
groups with unequal rewards, the rest are dropped, and each kept rollout is trained once.
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
    epochs: int = 1  # e
    mini_batches: int = 1  # m
    max_staleness: int = 0  # k: 0 synchronous; k >= 1 generation overlapped, each rollout trained at age k
    selective: bool = False  # only groups with unequal rewards: the FIFO admits only them ([E8]); on-policy, dynamic
    # sampling: rounds of R = B regenerated until B are theirs ([E11])

    def __post_init__(self) -> None:
        B, R, N, G = self.batch_size, self.rollouts_per_step, self.capacity, self.group_size
        for name, value in (("batch B", B), ("rollouts R", R), ("capacity N", N), ("group size G", G),
                            ("epochs e", self.epochs), ("mini-batches m", self.mini_batches)):
            if not (type(value) is int and value >= 1):  # the common case checked without numpy: searches build many
                require_int(name, value, 1)
        if self.on_policy and not B == R == N:
            raise ValueError(f"on-policy needs N = R = B, got N={N}, R={R}, B={B}")
        if N < R:
            raise ValueError(f"capacity N must be >= rollouts R (a FIFO holds at least one step), got N={N}, R={R}")
        if self.updates_per_generation > 1 and (self.on_policy or N != R or B * self.mini_batches != R):
            raise ValueError(f"an epoch design needs N = R and B m = R, not on-policy; got N={N}, R={R}, B={B}, "
                             f"m={self.mini_batches}")
        if self.max_staleness and not (type(self.max_staleness) is int and self.max_staleness >= 1):
            require_int("max staleness k", self.max_staleness, 0)
        if self.max_staleness and not self.on_policy:  # staleness with reuse: no trainer runs it, no model prices it
            raise ValueError(f"an overlapped design (max staleness k = {self.max_staleness}) uses each rollout once: "
                             f"it needs on-policy sizes N = R = B")
        if self.selective and (self.updates_per_generation > 1 or self.max_staleness):
            raise ValueError("a selective design is a FIFO (B, R, N) that admits only groups with unequal rewards, or "
                             "on-policy dynamic sampling: not epochs or overlapped")

    @property
    def updates_per_generation(self) -> int:
        """e m: the updates one generation of R feeds (1 for the FIFO and on-policy designs)."""
        return self.epochs * self.mini_batches

    @property
    def dynamic(self) -> bool:
        """Dynamic sampling: on-policy, rounds of R = B regenerated until B rollouts are in groups with unequal
        rewards, each trained once ([E11])."""
        return self.on_policy and self.selective

    @property
    def x(self) -> int:
        """N / R in whole steps: the buffer's horizon (the forgetting model takes N a multiple of R)."""
        return self.capacity // self.rollouts_per_step

    @property
    def y(self) -> float:
        """B / R: the replay ratio."""
        return self.batch_size / self.rollouts_per_step

    @property
    def oldest_age(self) -> int:
        """The oldest age, in updates, at which a sample is trained on: 0 on-policy, x - 1 for a FIFO of x steps,
        e m - 1 for e epochs over m mini-batches of one generation, k for an overlapped design."""
        if self.on_policy:
            return self.max_staleness
        return self.updates_per_generation - 1 if self.updates_per_generation > 1 else self.x - 1

    @classmethod
    def on_policy_at(cls, batch_size: int, group_size: int = 1) -> "Design":
        """On-policy at B: R = N = B."""
        B = int(batch_size)
        return cls(B, B, B, True, group_size)

    @classmethod
    def dynamic_at(cls, batch_size: int, group_size: int = 1) -> "Design":
        """Dynamic sampling at B: on-policy sizes R = N = B, zero-advantage groups dropped and regenerated."""
        B = int(batch_size)
        return cls(B, B, B, True, group_size, selective=True)

    @classmethod
    def overlapped_at(cls, batch_size: int, max_staleness: int = 1, group_size: int = 1) -> "Design":
        """On-policy sizes at B (R = N = B) with generation overlapped k = ``max_staleness`` updates ahead."""
        B = int(batch_size)
        return cls(B, B, B, True, group_size, max_staleness=int(max_staleness))

    @classmethod
    def epochs_of(cls, rollouts_per_step: int, epochs: int, mini_batches: int, group_size: int = 1) -> "Design":
        """e epochs over m mini-batches of one generation of R: B = R/m, N = R."""
        R, m = int(rollouts_per_step), int(mini_batches)
        if R % m:
            raise ValueError(f"rollouts R must be whole mini-batches, got R={R}, m={m}")
        return cls(R // m, R, R, False, group_size, int(epochs), m)

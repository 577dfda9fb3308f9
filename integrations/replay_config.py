"""The replay design a trainer runs: N, B, R, the buffer design and the off-policy correction (no torch).

Paper: experience-replay (docs/REFERENCES.md), Sec. 3: each step generates R fresh rollouts into a buffer of N and
trains on B; staleness horizon x = N/R, replay ratio y = B/R. Code names -> paper symbols: ``buffer_size`` N,
``batch_size`` B, ``rollouts_per_step`` R. Torch-free, so the command line checks a design (``trl-replay``) without
importing torch; the buffer itself is ``integrations/buffer.py``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from ..core.designs import DesignConfig, design_field_names

__all__ = ["REPLAY_LOSSES", "ROW_DESIGNS", "ReplayConfig", "age_buckets", "fifo_max_age"]

#: Off-policy corrections the trainer takes from ``replay_theory.core.losses``.
#: ``tis`` is the truncated sequence importance weight min(c, pi_new / pi_behav) of losses.rloo (Replay-RLOO Eq. 2).
REPLAY_LOSSES: tuple[str, ...] = ("grpo", "tis", "m2po", "m2po-reference", "no-trust-region")

#: Buffer designs of the shared registry (``core/designs.py``) a trainer can run: each generates one fixed-size
#: batch per step or none. group-replay, exgrpo and stale-k need a different number of groups per step.
ROW_DESIGNS: tuple[str, ...] = ("on-policy", "fifo", "positive-bias", "prioritized")

#: DesignConfig fields a ReplayConfig sets itself (N, B, R, G, the buffer and the loss): not allowed in ``design``.
_DESIGN_SET_HERE = ("capacity", "batch_size", "rollouts_per_step", "group_size", "buffer", "loss", "eps_low",
                    "eps_high", "clip_c", "tau_m2")


def fifo_max_age(buffer_size: int, rollouts_per_step: int) -> int:
    """Oldest age (in steps) a FIFO buffer of N rows fed R rows a step holds once full: ceil(N/R) - 1."""
    return math.ceil(buffer_size / rollouts_per_step) - 1


def age_buckets(max_age: int) -> list[tuple[int, int, str]]:
    """Age buckets [lo, hi] covering 0 .. max_age: 0, 1, 2-3, 4-7, ... (powers of two), with their metric names."""
    buckets = [(0, 0, "age_0")]
    lo = 1
    while lo <= max_age:
        hi = 2 * lo - 1
        buckets.append((lo, hi, f"age_{lo}" if lo == hi else f"age_{lo}-{hi}"))
        lo *= 2
    return buckets


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class ReplayConfig:
    """N, B, R and the off-policy correction of a replay run (experience-replay Sec. 3; losses of core/losses.py)."""

    buffer_size: int
    """N: FIFO capacity in completions; a multiple of the group size (whole groups are stored), >= R."""
    batch_size: int
    """B: completions drawn uniformly with replacement from the buffer for each update."""
    rollouts_per_step: int
    """R: fresh completions generated per update (TRL: per_device_train_batch_size on one process)."""
    loss: Literal["grpo", "tis", "m2po", "m2po-reference", "no-trust-region"] = "grpo"
    """Off-policy correction: PPO clip (grpo), truncated sequence IS (tis), M2PO (m2po, m2po-reference), none."""
    eps_low: float = 0.2
    """PPO clip: the ratio is clipped below at 1 - eps_low (grpo)."""
    eps_high: float = 0.2
    """PPO clip: the ratio is clipped above at 1 + eps_high (grpo; DAPO uses 0.28)."""
    clip_c: float = 3.0
    """tis: the sequence weight min(c, pi_new / pi_behav) (Replay-RLOO Eq. 2; RLOOParams' default)."""
    tau_m2: float = 0.04
    """m2po: the second-moment budget tau_M2 (M2PO Sec. 5.2)."""
    aggregation: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] | None = None
    """How token terms become one loss; None: the loss's own default (token-mean, tis: seq-mean-token-sum)."""
    buffer: str = "fifo"
    """Buffer design of the shared registry (core/designs.py): on-policy, fifo, positive-bias or prioritized."""
    design: Mapping[str, Any] = field(default_factory=dict)
    """Other DesignConfig fields of that buffer, e.g. {"delta": 0.2} or {"per_alpha": 0.6, "per_tau": 8.0}; each is
    documented once, on DesignConfig."""
    seed: int = 0
    """Seed of the uniform draws from the buffer (a generator of its own: TRL's RNG streams are left alone)."""
    notes: tuple[str, ...] = field(default=(), compare=False)
    """What ``from_optimal_json`` changed (e.g. N rounded to whole groups)."""

    def __post_init__(self) -> None:
        _positive_int("buffer_size", self.buffer_size)
        _positive_int("batch_size", self.batch_size)
        _positive_int("rollouts_per_step", self.rollouts_per_step)
        if self.buffer_size < self.rollouts_per_step:
            raise ValueError(f"buffer_size must be >= rollouts_per_step = {self.rollouts_per_step} (the fresh "
                             f"rollouts must fit), got {self.buffer_size}")
        if self.loss not in REPLAY_LOSSES:
            raise ValueError(f"loss must be one of {', '.join(REPLAY_LOSSES)}, got {self.loss!r}")
        for name in ("eps_low", "eps_high", "tau_m2"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        if isinstance(self.clip_c, bool) or not isinstance(self.clip_c, (int, float)) or not self.clip_c > 0:
            raise ValueError(f"clip_c must be > 0, got {self.clip_c!r}")
        if self.buffer not in ROW_DESIGNS:
            raise ValueError(f"buffer must be one of {', '.join(ROW_DESIGNS)}, got {self.buffer!r}")
        if self.buffer == "on-policy" and self.batch_size != self.rollouts_per_step:
            raise ValueError(f"batch_size must equal rollouts_per_step = {self.rollouts_per_step} on-policy (every "
                             f"rollout trained once), got {self.batch_size}")
        unknown = sorted(set(self.design) - set(design_field_names()))
        if unknown:
            raise ValueError(f"design has unknown field(s) {', '.join(unknown)}; DesignConfig's fields are "
                             f"{', '.join(k for k in design_field_names() if k not in _DESIGN_SET_HERE)}")
        clash = sorted(set(self.design) & set(_DESIGN_SET_HERE))
        if clash:
            raise ValueError(f"design sets {', '.join(clash)}, which ReplayConfig sets itself: leave "
                             f"{'it' if len(clash) == 1 else 'them'} out of design")
        if self.aggregation not in (None, "token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
            raise ValueError("aggregation must be one of token-mean, seq-mean-token-sum, seq-mean-token-mean, "
                             f"got {self.aggregation!r}")

    def design_config(self, group_size: int) -> DesignConfig:
        """The shared registry's DesignConfig of this replay design (N, B, R, G, buffer and ``design``)."""
        return DesignConfig(buffer=self.buffer, capacity=self.buffer_size, batch_size=self.batch_size,
                            rollouts_per_step=self.rollouts_per_step, group_size=group_size, **dict(self.design))

    @property
    def replay_ratio(self) -> float:
        """y = B/R: how many times each rollout is trained on, on average."""
        return self.batch_size / self.rollouts_per_step

    @property
    def max_age(self) -> int:
        """Oldest age a trained row can have under the FIFO law: ceil(N/R) - 1."""
        return fifo_max_age(self.buffer_size, self.rollouts_per_step)

    @classmethod
    def from_optimal_json(cls, source: str | Path | Mapping[str, Any], *, group_size: int | None = None,
                          **overrides: Any) -> "ReplayConfig":
        """N, B, R from ``replay-theory optimal ... -R R --json`` output (a path, a JSON string, or its dict).

        The JSON's ``buffer_size``, ``batch_size`` and ``rollouts_per_step`` are null unless ``optimal`` was given
        -R or -B; then this raises. With ``group_size`` G, N is rounded to the nearest multiple of G (whole groups
        are stored), at least R; the rounding is recorded in ``notes``. ``overrides`` set the other fields
        (``loss``, ``eps_high``, ...).
        """
        data = _load_json(source)
        missing = [k for k in ("buffer_size", "batch_size", "rollouts_per_step") if data.get(k) is None]
        if missing and data.get("regime") == "unbounded":  # the objective still fell at the last measured staleness
            raise ValueError("the design is unbounded (the objective still falls at the largest staleness the profile "
                             f"measured): there is no buffer_size to read; choose N = x R by hand with x at most the "
                             f"profile's last staleness + 1, B = {data.get('batch_size')}, or measure sigma^2(s) "
                             "further out")
        if missing:
            raise ValueError(f"the optimal --json output has no {', '.join(missing)}: run `replay-theory optimal` "
                             "with -R (rollouts per step) or -B (batch size) to get an integer design")
        n, b, r = int(data["buffer_size"]), int(data["batch_size"]), int(data["rollouts_per_step"])
        notes: list[str] = []
        if group_size is not None:
            _positive_int("group_size", group_size)
            if r % group_size:
                raise ValueError(f"rollouts_per_step = {r} from the design is not a multiple of group_size = "
                                 f"{group_size}: rerun `replay-theory optimal` with -R a multiple of {group_size}")
            rounded = max(r, group_size * round(n / group_size))
            if rounded != n:
                notes.append(f"buffer_size {n} rounded to {rounded}, a whole number of groups of {group_size}")
                n = rounded
        return cls(buffer_size=n, batch_size=b, rollouts_per_step=r, notes=tuple(notes), **overrides)


def _load_json(source: str | Path | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(source, Mapping):
        return source
    text = str(source)
    if isinstance(source, Path) or not text.lstrip().startswith("{"):
        text = Path(source).read_text()
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("the optimal --json output must be one JSON object")
    return data

"""A FIFO replay buffer of whole GRPO groups, sized N, B, R by the experience-replay paper's theory.

Paper: experience-replay (docs/REFERENCES.md), Sec. 3: each step generates R fresh rollouts, pushes them into a
FIFO buffer of capacity N, and trains on B rollouts drawn uniformly with replacement from the buffer; the staleness
horizon is x = N/R and the replay ratio y = B/R. Code names -> paper symbols:

| code name           | symbol | meaning                                                      |
|---------------------|--------|--------------------------------------------------------------|
| ``buffer_size``     | N      | FIFO capacity, in completions (rows)                         |
| ``batch_size``      | B      | completions trained on per update                            |
| ``rollouts_per_step`` | R    | fresh completions generated per update                       |
| ``version``         | -      | optimizer steps done when a row was generated; age s = t - v |

Under the FIFO law a row is trained on while its age s is 0 .. ceil(N/R) - 1 steps.

The buffer is framework-free (torch only): ``integrations/trl.py`` feeds it TRL's generation output. Every stored
field is a tensor whose FIRST dimension is the row (one completion): per-row scalars are (rows,), per-token fields
(rows, L). A push is refused unless every field has exactly ``rows`` entries along dim 0, and a draw gathers every
field with the SAME row indices, so a field shaped per group (groups, generations) can neither be stored nor
mis-indexed. That is the failure of TRL's experimental ``GRPOWithReplayBufferTrainer`` (huggingface/trl#6804):
it passed flat (B,) tensors to code written for (groups, generations), a whole-batch reduction collapsed to one
scalar, and only group 0 was ever buffered.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

import torch

__all__ = [
    "ReplayConfig",
    "GroupFifoBuffer",
    "REPLAY_LOSSES",
    "age_buckets",
    "fifo_max_age",
    "LEFT_PADDED",
    "RIGHT_PADDED",
]

#: Off-policy corrections the trainer takes from ``replay_theory.simulate.losses``.
#: ``tis`` is the truncated sequence importance weight min(c, pi_new / pi_behav) of losses.rloo (Replay-RLOO Eq. 2).
REPLAY_LOSSES: tuple[str, ...] = ("grpo", "tis", "m2po", "m2po-reference", "no-trust-region")

#: Per-token fields padded on the left (TRL left-pads prompts) and on the right (completions), with their pad value.
LEFT_PADDED: dict[str, int] = {"prompt_ids": 0, "prompt_mask": 0}
RIGHT_PADDED: dict[str, float] = {
    "completion_ids": 0,
    "completion_mask": 0,
    "tool_mask": 1,  # TRL pads tool_mask with 1; completion_mask is 0 there anyway
    "old_per_token_logps": 0.0,  # the behaviour log-probs (TRL's name): pi_behav of the loss
    "sampling_per_token_logps": 0.0,  # the inference engine's log-probs, when TRL returns them (vLLM)
}


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
    """N, B, R and the off-policy correction of a replay run (experience-replay Sec. 3; losses of simulate/losses)."""

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
        if self.aggregation not in (None, "token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
            raise ValueError("aggregation must be one of token-mean, seq-mean-token-sum, seq-mean-token-mean, "
                             f"got {self.aggregation!r}")

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


def _pad_to(x: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    extra = width - x.shape[1]
    if extra == 0:
        return x
    pad = x.new_full((x.shape[0], extra), value)
    return torch.cat([pad, x] if left else [x, pad], dim=1)


class GroupFifoBuffer:
    """FIFO of whole groups, stored row-wise: every field has the row (completion) as its first dimension.

    ``push`` appends R rows (R/G whole groups, consecutive rows of a group, as TRL lays them out) and evicts the
    oldest rows beyond ``capacity``; capacity and R being multiples of G, eviction removes whole groups.
    ``sample`` draws rows uniformly with replacement and gathers EVERY field with the same indices.
    """

    def __init__(self, capacity: int, group_size: int, seed: int = 0) -> None:
        _positive_int("capacity", capacity)
        _positive_int("group_size", group_size)
        if capacity % group_size:
            raise ValueError(f"buffer_size must be a multiple of num_generations = {group_size} (whole groups are "
                             f"stored), got {capacity}")
        self.capacity = capacity
        self.group_size = group_size
        self.data: dict[str, torch.Tensor] = {}
        self.pushed_rows = 0  # rows ever pushed (the next sample id; the next group id is pushed_rows // group_size)
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return 0 if not self.data else int(self.data["version"].shape[0])

    @property
    def num_groups(self) -> int:
        return len(self) // self.group_size

    def push(self, rows: Mapping[str, torch.Tensor], version: int) -> None:
        """Append one generation batch: every tensor (rows, ...) with the same number of rows, a multiple of G."""
        if not rows:
            raise ValueError("nothing to push")
        counts = {k: (tuple(v.shape) if isinstance(v, torch.Tensor) else None) for k, v in rows.items()}
        bad = {k: s for k, s in counts.items() if s is None or len(s) == 0}
        if bad:
            raise ValueError(f"every buffered field must be a tensor with the row as dim 0, got {bad}")
        n = counts.get("completion_ids", next(iter(counts.values())))[0]
        wrong = {k: s for k, s in counts.items() if s[0] != n}
        if wrong:
            # The TRL #6804 condition: a field laid out per group (groups, generations), or per batch, next to
            # per-row fields. Refusing it here is what keeps every draw aligned.
            raise ValueError(f"every buffered field must have one entry per row ({n} rows), got shapes {wrong}")
        if n % self.group_size:
            raise ValueError(f"a push must hold whole groups: {n} rows is not a multiple of num_generations = "
                             f"{self.group_size}")
        for k, s in counts.items():
            if k in ("advantages", "rewards") and len(s) != 1:
                raise ValueError(f"{k} must be one value per row, shape ({n},), got {s}")
        device = rows["completion_ids"].device if "completion_ids" in rows else None
        fresh = {k: v.detach() for k, v in rows.items()}
        fresh["version"] = torch.full((n,), int(version), dtype=torch.long, device=device)
        fresh["sample_id"] = torch.arange(n, device=device) + self.pushed_rows  # the completion, across replays
        fresh["group_id"] = fresh["sample_id"] // self.group_size
        self.pushed_rows += n
        if not self.data:
            merged = fresh
        else:
            if set(fresh) != set(self.data):
                raise ValueError(f"a push must carry the same fields as the buffer: {sorted(self.data)}, got "
                                 f"{sorted(fresh)}")
            merged = {k: self._cat(k, self.data[k], fresh[k]) for k in fresh}
        keep = max(0, int(merged["version"].shape[0]) - self.capacity)  # FIFO: drop the oldest rows
        self.data = _trim_padding({k: v[keep:] for k, v in merged.items()})

    @staticmethod
    def _cat(name: str, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        if old.dim() == 2 and old.shape[1] != new.shape[1]:  # per-token fields of two pushes: re-pad to one width
            width = max(old.shape[1], new.shape[1])
            if name in LEFT_PADDED:
                old, new = (_pad_to(x, width, LEFT_PADDED[name], left=True) for x in (old, new))
            else:
                value = RIGHT_PADDED.get(name, 0)
                old, new = (_pad_to(x, width, value, left=False) for x in (old, new))
        return torch.cat([old, new.to(old.device)], dim=0)

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        """B rows drawn uniformly with replacement; every field gathered with the same row indices."""
        _positive_int("batch_size", batch_size)
        if not self.data:
            raise ValueError("the buffer is empty: push a generation batch first")
        index = torch.randint(len(self), (batch_size,), generator=self.generator)
        drawn = {k: v[index.to(v.device)] for k, v in self.data.items()}
        drawn["buffer_index"] = index
        return _trim_padding(drawn)

    def ages(self, step: int) -> torch.Tensor:
        """Age in steps of every stored row at optimizer step ``step`` (rows,)."""
        return step - self.data["version"]


def _trim_padding(data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop columns that are padding in every row: prompt columns on the left, completion columns on the right."""
    out = dict(data)
    if "prompt_mask" in data and data["prompt_mask"].numel():
        used = data["prompt_mask"].bool().any(dim=0)
        first = int(used.nonzero()[0]) if used.any() else data["prompt_mask"].shape[1]
        for k in LEFT_PADDED:
            if k in out:
                out[k] = out[k][:, first:]
    if "completion_mask" in data and data["completion_mask"].numel():
        used = data["completion_mask"].bool().any(dim=0)
        last = int(used.nonzero()[-1]) + 1 if used.any() else 1  # keep one column: TRL needs logits_to_keep >= 1
        for k in RIGHT_PADDED:
            if k in out:
                out[k] = out[k][:, :last]
    return out

"""Replay buffers for trainers: the shared buffer designs over whole GRPO groups, sized N, B, R by the theory.

Paper: experience-replay (docs/REFERENCES.md), Sec. 3: each step generates R fresh rollouts, pushes them into a
FIFO buffer of capacity N, and trains on B rollouts drawn uniformly with replacement from the buffer; the staleness
horizon is x = N/R and the replay ratio y = B/R. Code names -> paper symbols:

| code name           | symbol | meaning                                                      |
|---------------------|--------|--------------------------------------------------------------|
| ``capacity``        | N      | buffer size, in completions (rows)                           |
| ``batch_size``      | B      | completions trained on per update                            |
| ``rollouts_per_step`` | R    | fresh completions generated per update                       |
| ``version``         | -      | optimizer steps done when a row was generated; age s = t - v |

Under the FIFO law a row is trained on while its age s is 0 .. ceil(N/R) - 1 steps.

One buffer implementation: the trainer's rows (torch tensors, whole TRL rows) live in :class:`RowReplayBuffer`,
but WHICH rows are kept, evicted and drawn is decided by the design's own buffer from the shared registry
(``core/designs.py``: the ``BUFFER_DESIGNS`` entries with ``trainer=True``), the same class and the
same batch step the simulator and the validator run, fed one item per row whose token is the row's id. Every
stored field has the row (one completion) as its FIRST dimension: per-row scalars (rows,), per-token fields
(rows, L). A push is refused unless every field has exactly ``rows`` entries along dim 0, and a draw gathers every
field with the SAME row ids, so a field shaped per group (groups, generations) can neither be stored nor
mis-indexed. That was the failure of TRL's experimental ``GRPOWithReplayBufferTrainer`` (huggingface/trl#6804):
it passed flat (B,) tensors to code written for (groups, generations), a whole-batch reduction collapsed to one
scalar, and only group 0 was ever buffered.  TRL 1.16.0, the version tested, no longer ships it (``trl/experimental/``
has no replay-buffer trainer; its ``async_grpo`` is an asynchronous GRPO trainer without a replay buffer).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Mapping

import numpy as np
import torch

from ..checks import require_integer
from ..core.buffers import SlotBuffer, StaleKQueue
from ..core.designs import (
    BUFFER_DESIGNS,
    BufferSpec,
    DesignConfig,
    StepBatch,
    check_choice,
    make_design_buffer,
    validate_trainer_design,
)
from ..core.rollouts import RolloutBatch
from ..core.state import load_object_state, load_state, object_state, save_state
from .replay_config import (
    ReplayConfig,
    age_buckets,
    fifo_max_age,
)

__all__ = [
    "ReplayConfig",
    "RowReplayBuffer",
    "age_buckets",
    "fifo_max_age",
    "LEFT_PADDED",
    "RIGHT_PADDED",
]

#: Per-token fields padded on the left (TRL left-pads prompts) and on the right (completions), with their pad value.
LEFT_PADDED: dict[str, int] = {"prompt_ids": 0, "prompt_mask": 0}
RIGHT_PADDED: dict[str, float] = {
    "completion_ids": 0,
    "completion_mask": 0,
    "tool_mask": 1,  # TRL pads tool_mask with 1; completion_mask is 0 there anyway
    "old_per_token_logps": 0.0,  # the behaviour log-probs (TRL's name): pi_behav of the loss
    "sampling_per_token_logps": 0.0,  # the inference engine's log-probs, when TRL returns them (vLLM)
    "importance_sampling_ratio": 1.0,  # TRL's vLLM correction pi_old / pi_vllm per token (padding: never read)
}


def _pad_to(x: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    extra = width - x.shape[1]
    if extra == 0:
        return x
    pad = x.new_full((x.shape[0], extra), value)
    return torch.cat([pad, x] if left else [x, pad], dim=1)


class RowReplayBuffer:
    """A trainer's rows (torch, any width) selected by a buffer design of the shared registry.

    The design's own buffer (``core.designs.make_design_buffer``: the simulator's and the validator's classes)
    holds one item per row whose token is the row's ``sample_id``; it decides what is kept, evicted and drawn, with
    the design's batch step (``BUFFER_DESIGNS[buffer].step``) called exactly as the simulator calls it. This class
    only stores the rows those ids point to (every field with the row as dim 0, re-padded on its side when widths
    differ) and drops the rows the design no longer holds. It is the design's ``PipelineState``: ``config``,
    ``buffer``, ``rng``, ``state``, ``settings`` and ``fresh_rollouts``, which generates lazily through the
    callable given to :meth:`step`, so a design that trains without generating (FreshPER Algorithm 1's replay
    updates) generates nothing.
    """

    def __init__(self, design: DesignConfig, seed: int = 0, total_steps: int = 1) -> None:
        design = design.validated_design()
        simulator_only = ", ".join(name for name, d in BUFFER_DESIGNS.items() if not d.trainer)
        check_choice("buffer", design.buffer, BUFFER_DESIGNS, trainer=True,
                     where=f" in a trainer ({simulator_only} generate a different number of groups per step than the "
                           "trainer's fixed generation batch; run them in the simulator)")
        if design.buffer != "on-policy" and design.capacity % design.group_size:
            raise ValueError(f"capacity must be a multiple of num_generations = {design.group_size} (whole "
                             f"groups are stored), got {design.capacity}")
        if design.buffer == "stale-k":  # validate_design has no stale-k rules: the simulator's queue ignores B
            validate_trainer_design(design)
        self.config = design
        buffer = make_design_buffer(design, BufferSpec(num_seeds=1, seq_len=1, token_dtype=np.int64))
        # the rows' ids must live in store slots, or in the stale-k queue's batches
        if buffer is not None and not isinstance(buffer, (SlotBuffer, StaleKQueue)):
            raise ValueError(f"buffer {design.buffer} keeps no slots a trainer's rows can be found in: "
                             "ReplayGRPOTrainer runs it through TRL's own generation buffer (num_iterations, "
                             "steps_per_generation), not through RowReplayBuffer")
        self.buffer: SlotBuffer | StaleKQueue | None = buffer
        self.rng = np.random.default_rng(seed)
        self.state: dict = {}
        self.settings = SimpleNamespace(total_steps=int(total_steps))  # FreshPER anneals beta over the run
        self.data: dict[str, torch.Tensor] = {}
        self.pushed_rows = 0  # rows ever pushed (the next sample id; the next group id is pushed_rows // G)
        self._generate: Callable[[], Mapping[str, torch.Tensor]] | None = None

    @property
    def group_size(self) -> int:
        return self.config.group_size

    # ------------------------------------------------------------------ resume

    def save_state(self, path_stem: str | os.PathLike) -> list[Path]:
        """Write everything that decides the next draws (the rows, the design's buffer, the generator, the design's
        running state) to ``<stem>.json`` + ``<stem>.npz``, without pickle (core/state.py); returns the paths."""
        tree, arrays = object_state(self, skip=("_generate",))
        return save_state(path_stem, tree, arrays)

    def load_state(self, path_stem: str | os.PathLike) -> None:
        """Restore :meth:`save_state`'s files into this buffer, built with the same design config: its next draws
        are then the saved buffer's. A file of another design is a one-line ValueError."""
        tree, arrays = load_state(path_stem)
        load_object_state(self, tree, arrays)

    def __len__(self) -> int:
        return 0 if not self.data else int(self.data["version"].shape[0])

    @property
    def num_groups(self) -> int:
        return len(self) // self.group_size

    def ages(self, step: int) -> torch.Tensor:
        """Age in steps of every stored row at optimizer step ``step`` (rows,)."""
        return step - self.data["version"]

    # ------------------------------------------------------------------ rows in, ids to the design

    def push(self, rows: Mapping[str, torch.Tensor], version: int) -> RolloutBatch:
        """Store one generation batch (every tensor (rows, ...), whole groups); returns its id batch (1, rows).

        Only stores the rows: adding their ids to the design's buffer is the design step's job (``step``); call
        ``self.buffer.add(ids, version)`` to fill the buffer by hand.
        """
        n = self._checked_row_count(rows)
        device = rows["completion_ids"].device if "completion_ids" in rows else None
        fresh = {k: v.detach() for k, v in rows.items()}
        fresh["version"] = torch.full((n,), int(version), dtype=torch.long, device=device)
        fresh["sample_id"] = torch.arange(n, device=device) + self.pushed_rows  # the completion, across replays
        fresh["group_id"] = fresh["sample_id"] // self.group_size
        self.pushed_rows += n
        merged = fresh if not self.data else {k: self._cat(k, self.data[k], fresh[k]) for k in fresh}
        self.data = _trim_padding(merged)
        return self._id_batch(fresh)

    def _checked_row_count(self, rows: Mapping[str, torch.Tensor]) -> int:
        """The push's row count: every field a tensor with one entry per row, whole groups, one advantage and reward
        per row, the buffer's fields."""
        if not rows:
            raise ValueError("nothing to push")
        counts = {k: (tuple(v.shape) if isinstance(v, torch.Tensor) else None) for k, v in rows.items()}
        bad = {k: s for k, s in counts.items() if s is None or len(s) == 0}
        if bad:
            raise ValueError(f"every buffered field must be a tensor with the row as dim 0, got {bad}")
        shapes = {k: s for k, s in counts.items() if s is not None}  # every field: bad is empty
        n = shapes.get("completion_ids", next(iter(shapes.values())))[0]
        wrong = {k: s for k, s in shapes.items() if s[0] != n}
        if wrong:
            # The TRL #6804 condition: a field laid out per group (groups, generations), or per batch, next to
            # per-row fields. Refusing it here is what keeps every draw aligned.
            raise ValueError(f"every buffered field must have one entry per row ({n} rows), got shapes {wrong}")
        if n % self.group_size:
            raise ValueError(f"a push must hold whole groups: {n} rows is not a multiple of num_generations = "
                             f"{self.group_size}")
        for k, s in shapes.items():
            if k in ("advantages", "rewards") and len(s) != 1:
                raise ValueError(f"{k} must be one value per row, shape ({n},), got {s}")
        if self.config.buffer in ("selective", "dynamic") and ("rewards" not in rows
                                                               or not torch.isfinite(rows["rewards"]).all()):
            raise ValueError(f"buffer {self.config.buffer} admits a group by its rewards (all equal: no gradient, "
                             "never trained), so "
                             "every pushed row needs a finite 'rewards' value, got "
                             + ("none" if "rewards" not in rows else "a non-finite one"))
        if self.data and set(rows) | {"version", "sample_id", "group_id"} != set(self.data):
            raise ValueError(f"a push must carry the same fields as the buffer: "
                             f"{sorted(set(self.data) - {'version', 'sample_id', 'group_id'})}, got {sorted(rows)}")
        return n

    @staticmethod
    def _id_batch(rows: Mapping[str, torch.Tensor]) -> RolloutBatch:
        """The rows as the design's buffer stores them: token = sample_id, one token per row, seed axis first."""
        ids = rows["sample_id"].cpu().numpy().astype(np.int64)  # (n,)
        n = ids.shape[0]
        per_row = {k: (rows[k].detach().to("cpu", torch.float64).numpy() if k in rows else np.zeros(n))
                   for k in ("rewards", "advantages")}
        group = rows["group_id"].cpu().numpy().astype(np.int64)
        return RolloutBatch(
            prompt=group[None],  # (1, n): the group stands for its prompt
            tokens=ids[None, :, None],  # (1, n, 1)
            mask=np.ones((1, n, 1), bool),
            logp_behav=np.zeros((1, n, 1)),  # unused by the selection; the rows keep the real log-probs
            reward=per_row["rewards"][None],  # positive-bias keeps reward == 1 rows, FreshPER ranks |r| + eps
            advantage=per_row["advantages"][None],
            created=rows["version"].cpu().numpy().astype(np.int64)[None],
            group=group[None],
        )

    def generate(self, weights: Any, num_groups: int, version: int) -> RolloutBatch:
        """One more generation batch of ``num_groups`` groups, pushed with ``version`` (PipelineState protocol; the
        dynamic design's refill rounds: ``core.designs.dynamic_step``); the callable given to :meth:`step` decides
        the prompts of each call."""
        if self._generate is None:
            raise ValueError("generate is called by a design step: use RowReplayBuffer.step")
        rows = self._generate()
        n = self._checked_row_count(rows)
        if n != num_groups * self.group_size:  # the trainer's generation batch is R = B rows: an invariant
            raise ValueError(f"the design asked for {num_groups} groups of {self.group_size}, the trainer generated "
                             f"{n} rows")
        return self.push(rows, version=version)

    def fresh_rollouts(self, step: int, weights: Any = None, *, on_policy: bool = False) -> RolloutBatch | None:
        """The design asks for this step's fresh rows: generate them now (PipelineState protocol)."""
        if self._generate is None:
            raise ValueError("fresh_rollouts is called by a design step: use RowReplayBuffer.step")
        return self.push(self._generate(), version=step)

    def step(self, step: int, generate: Callable[[], Mapping[str, torch.Tensor]]
             ) -> tuple[dict[str, torch.Tensor], StepBatch]:
        """One step of the design: generate (if it asks), add, draw; the drawn rows and the design's StepBatch.

        ``generate()`` returns one generation batch of rows (as :meth:`push` takes them); buffer dynamic calls it
        once a round, so each call after the first must bring new prompts. The drawn rows carry
        ``sampler_weight`` (FreshPER's importance weights; ones otherwise) and ``buffer_index`` (their position
        in :attr:`data` before rows the design dropped are removed).
        """
        self._generate = generate
        try:
            data = BUFFER_DESIGNS[self.config.buffer].step(self, step, None)
        finally:
            self._generate = None
        drawn = self.gather(data.train.tokens[0, :, 0])
        drawn["sampler_weight"] = torch.as_tensor(data.weight[0], dtype=torch.float64)
        self._drop_evicted()
        return drawn, data

    def sample(self, batch_size: int, step: int | None = None) -> dict[str, torch.Tensor]:
        """B rows drawn by the design's own sampler (FIFO: uniformly with replacement), every field aligned."""
        require_integer("batch_size", batch_size, 1)
        if self.buffer is None or not len(self):
            raise ValueError("the buffer is empty: push a generation batch first")
        step = int(self.data["version"].max()) if step is None else step
        drawn = self.buffer.sample(batch_size, step, self.rng)
        rows = self.gather(drawn.batch.tokens[0, :, 0])
        rows["sampler_weight"] = torch.as_tensor(drawn.weight[0], dtype=torch.float64)
        return rows

    def gather(self, ids: np.ndarray) -> dict[str, torch.Tensor]:
        """The stored rows with these sample ids (B,), every field gathered with the same positions."""
        ids_t = torch.as_tensor(np.asarray(ids, dtype=np.int64))
        stored = self.data["sample_id"].cpu()
        index = torch.searchsorted(stored, ids_t).clamp(max=len(stored) - 1)
        if not torch.equal(stored[index], ids_t):
            raise ValueError("the design drew a row the buffer no longer stores")  # an invariant, not user input
        drawn = {k: v[index.to(v.device)] for k, v in self.data.items()}
        drawn["buffer_index"] = index
        return _trim_padding(drawn)

    def _drop_evicted(self) -> None:
        """Forget the rows whose ids the design's buffer no longer holds (on-policy: all of them)."""
        if not self.data:
            return
        if self.buffer is None:
            self.data = {}
            return
        if isinstance(self.buffer, StaleKQueue):  # the k + 1 queued generations' ids
            live = self.buffer.held_tokens(0)
        else:
            live = self.buffer.store.tokens[0, self.buffer.valid[0], 0]  # (kept,) sample ids
        keep = torch.as_tensor(np.isin(self.data["sample_id"].cpu().numpy(), live))
        if not bool(keep.all()):
            self.data = _trim_padding({k: v[keep.to(v.device)] for k, v in self.data.items()})

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

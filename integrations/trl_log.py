"""The rows a TRL replay trainer trains on, every step, as a resumable ``diagnose --preset trl`` log.

Paper: experience-replay (docs/REFERENCES.md), Sec. 3: each row's age s = step - policy version (its staleness)
and the per-step generation and update wall times that ``calibrate --from-log`` turns into the cost ratio mu
(App. E). Columns: integrations/export.py (``DiagnoseLogWriter``); the trainer that calls :meth:`record`:
integrations/trl.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from .export import DiagnoseLogWriter, require_pyarrow


class DiagnoseLogCallback(TrainerCallback):
    """Writes the rows a :class:`ReplayGRPOTrainer` trains on, every step, as a ``diagnose --preset trl`` log.

    A callback alone cannot see what a step trains on (TRL hands callbacks the state between steps), so the
    trainer's ``compute_loss`` calls :meth:`record` with the step's rows. ``path`` must not exist: checked here,
    before any training.

    Resumable (issue 32): while training, the rows go to parts, ``<path>.parts/<first step>.parquet``, and each
    checkpoint closes the open part (Parquet's footer written), so every part a checkpoint lists is complete and
    holds exactly the steps before it. A resumed run deletes the parts the checkpoint does not list (the steps after
    it, trained again identically) and goes on. When the last step is done (``on_train_end`` at ``max_steps``) the
    parts are joined, row group by row group, into ``path`` (one row group per step) and removed; an interrupted
    run leaves its parts and its checkpoint, not ``path``. Each row carries its per-token log-probs under the policy
    being trained and the behaviour policy, masks, advantages, rewards and age (columns:
    ``replay_theory.integrations.export``), and each step its generation and update wall times
    (``STEP_TIME_COLUMNS``), which ``replay-theory calibrate --from-log`` turns into mu.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if self.path.exists():
            raise ValueError(f"diagnose log {self.path} exists: a log is never overwritten, give a new path")
        self.parts = self.path.with_name(self.path.name + ".parts")
        require_pyarrow()  # now, not at the first step
        self.writer: DiagnoseLogWriter | None = None  # the open part
        self.closed_parts: list[str] = []  # complete parts, in step order
        self._pending: dict[str, Any] | None = None
        self._pending_time = (float("nan"), 0)
        self._step_started: float | None = None

    def start(self, parts: list[str] | None) -> None:
        """Before training: ``parts`` None for a fresh run (no part may be there), else a checkpoint's complete
        parts, kept while every other part (steps after the checkpoint) is removed."""
        found = sorted(p.name for p in self.parts.glob("*.parquet")) if self.parts.is_dir() else []
        if parts is None:
            if found:
                raise ValueError(f"diagnose log parts {self.parts} exist from an interrupted run: resume it "
                                 "(train(resume_from_checkpoint=True)) or give a new path")
            self.closed_parts = []
            return
        missing = [name for name in parts if name not in found]
        if missing:
            raise ValueError(f"diagnose log parts {self.parts}: the checkpoint lists {', '.join(missing)}, which "
                             "are gone; the run cannot resume with its log")
        for name in found:
            if name not in parts:  # written after the checkpoint: its steps are trained again
                (self.parts / name).unlink()
        self.closed_parts = list(parts)

    def checkpoint(self) -> list[str]:
        """Close the open part (its footer written): the complete parts, which a checkpoint records."""
        self._close_part()
        return list(self.closed_parts)

    def record(self, step: int, inputs: dict[str, Any], logp_new: torch.Tensor, *,
               generation_seconds: float = float("nan"), generated_rows: int = 0) -> None:
        """Hold one step's trained rows: ``inputs`` as drawn from the buffer, ``logp_new`` (B, L) at the update.

        They are written at ``on_step_end``, once the step's update time is known: the step's wall time (from
        ``on_step_begin``) minus ``generation_seconds``, the time it spent generating its ``generated_rows`` fresh
        rows. These three per-step columns are what ``replay-theory calibrate --from-log`` turns into mu.
        """
        version = inputs["version"].detach().cpu().long()
        rows = version.shape[0]
        self._pending = {
            "step": torch.full((rows,), int(step), dtype=torch.long),
            "sample_id": inputs["sample_id"],
            "group_id": inputs["group_id"],
            "policy_version": version,
            "age": int(step) - version,
            "advantages": inputs["advantages"],
            "rewards": inputs["rewards"],
            "per_token_logps": logp_new,
            "old_per_token_logps": inputs["old_per_token_logps"],
            "sampling_per_token_logps": inputs["sampling_per_token_logps"],
            "completion_mask": inputs["completion_mask"],
            "tool_mask": inputs["tool_mask"],
        }
        self._pending_time = (float(generation_seconds), int(generated_rows))

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: D102 (TrainerCallback hook)
        self._step_started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: D102 (TrainerCallback hook)
        self._flush(time.perf_counter())

    def _flush(self, now: float | None) -> None:
        if self._pending is None:
            return
        rows = int(self._pending["step"].shape[0])
        generation, generated = self._pending_time
        started = self._step_started
        update = float("nan") if now is None or started is None else now - started - generation
        if self.writer is None:  # the first step after the start or a checkpoint opens a part
            self.writer = DiagnoseLogWriter(self.parts / f"{int(self._pending['step'][0]):06d}.parquet")
        self.writer.write({**self._pending,
                           "step_generation_seconds": torch.full((rows,), generation, dtype=torch.float64),
                           "step_update_seconds": torch.full((rows,), update, dtype=torch.float64),
                           "step_generated_rows": torch.full((rows,), generated, dtype=torch.long)})
        self._pending = None

    def _close_part(self) -> None:
        if self.writer is not None:
            self.writer.close()
            if self.writer.rows_written:
                self.closed_parts.append(self.writer.path.name)
            self.writer = None

    def on_train_end(self, args, state, control, **kwargs):  # noqa: D102 (TrainerCallback hook)
        self._flush(None)  # a step that never ended keeps its rows, its update time unknown (NaN)
        self._close_part()
        if state.global_step >= state.max_steps:  # finished (a stop on Ctrl-C keeps its parts to resume from)
            self.finish()

    def finish(self) -> None:
        """Join the parts into ``path`` (whole or not at all, never over a file) and remove them."""
        import pyarrow.parquet as pq

        from ..outputs import write_new

        if not self.closed_parts:
            return  # nothing trained, nothing left behind

        def join(tmp: Path) -> None:
            writer = None
            for name in self.closed_parts:
                part = pq.ParquetFile(self.parts / name)
                for group in range(part.num_row_groups):  # one per step: the log reads the same as one file
                    table = part.read_row_group(group)
                    writer = writer or pq.ParquetWriter(tmp, table.schema)
                    writer.write_table(table)
            assert writer is not None  # every closed part holds rows (_close_part keeps only those)
            writer.close()

        write_new(self.path, join, option="diagnose log")
        for name in self.closed_parts:
            (self.parts / name).unlink()
        if not any(self.parts.iterdir()):
            self.parts.rmdir()
        self.closed_parts = []

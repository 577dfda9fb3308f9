"""The replay trainer's checkpoints on disk, readable without torch (``trl-replay`` checks ``--out`` before it
imports TRL).

A checkpoint is Trainer's folder ``checkpoint-<step>`` (model, optimizer, scheduler, RNG states, trainer_state.json)
plus what :class:`~replay_theory.integrations.trl.ReplayGRPOTrainer` adds: the replay buffer (``replay_buffer.json``
+ ``.npz``, core/state.py, no pickle), its counters and the diagnose log's complete parts (``replay_state.json``),
and last the marker ``replay_checkpoint_complete``. A folder without the marker (a crash while saving) is never
resumed from.
"""

from __future__ import annotations

from pathlib import Path

CHECKPOINT_PREFIX = "checkpoint-"  # Trainer's PREFIX_CHECKPOINT_DIR + "-"
REPLAY_BUFFER_STATE = "replay_buffer"
REPLAY_STATE = "replay_state.json"
CHECKPOINT_DONE = "replay_checkpoint_complete"


def checkpoint_step(folder: Path) -> int:
    """The optimizer step a checkpoint folder was saved after."""
    return int(Path(folder).name[len(CHECKPOINT_PREFIX):])


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The complete checkpoints (marker written) in ``run_dir``, oldest first."""
    found = [p for p in Path(run_dir).glob(f"{CHECKPOINT_PREFIX}*")
             if p.name[len(CHECKPOINT_PREFIX):].isdigit() and (p / CHECKPOINT_DONE).is_file()]
    return sorted(found, key=checkpoint_step)

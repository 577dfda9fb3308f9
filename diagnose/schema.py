"""Column schema of a rollout log, and ready mappings for the names TRL and verl use.

A log is a table in one of two layouts.  ``long``: one row per token, columns (default names):

  ============== ======== ===================================================
  column         required meaning
  ============== ======== ===================================================
  seq_id         yes      sequence (response) identifier, any type
  logp_behav     yes      log pi_behav(token): the sampler's log-prob
  logp_current   yes      log pi_current(token): the learner's (or proximal)
  position       no       token index in the response (reported, not needed)
  mask           no       0/1: 0 drops the token (padding); absent = all 1
  tool_mask      no       0/1: 0 drops the token (a tool result, TRL); absent = all 1
  age            no       policy versions between sampling and use (>= 0)
  advantage      no       advantage of the token (or of its sequence)
  reward         no       reward of the sequence (repeated on its tokens)
  ============== ======== ===================================================

``wide``: one row per sequence, the per-token quantities as lists of equal length (``mask`` and ``tool_mask``
optional 0/1 lists; ``age``, ``advantage`` and ``reward`` scalars or lists): TRL's and verl's per-batch tensors
written out row by row.  The ratio studied is r = pi_current / pi_behav, ``log r = logp_current - logp_behav``
(samples are drawn under pi_behav).  Presets (``--preset``): ``default`` (the long layout), ``trl``
(``GRPOTrainer`` / ``DiagnoseLogCallback``), ``verl`` (``DataProto`` / ``VerlDiagnoseLogger``), ``nemo-rl``,
``skyrl``, ``slime`` (their per-step dumps, ``dumps.py``); which columns each reads: docs/DIAGNOSE.md, 'Column
names: TRL, verl and your own'.  Every name can be overridden with ``--columns field=name,...``; a mapped column the
file lacks is not used (only the two log-prob columns are required).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal, Optional

from ..checks import require_one_of
from .errors import ConfigError, check_field

Layout = Literal["auto", "long", "wide"]

#: columns that must be present (``seq_id`` only in the long layout).
REQUIRED = ("logp_behav", "logp_current")
#: Per-step timing columns of a trainer's log (repeated on every row of the step), which ``calibrate --from-log``
#: turns into mu = (generation seconds / generated rows) / (update seconds / trained rows): wall seconds the step
#: spent generating its fresh rows, wall seconds it spent on the update (forward, backward, optimizer), and the
#: fresh rows it generated (0 on a step that only replays). Rows trained at a step = log rows with that step.
STEP_TIME_COLUMNS: tuple[str, ...] = ("step_generation_seconds", "step_update_seconds", "step_generated_rows")

@dataclass(frozen=True)
class ColumnMap:
    """Which column of the file holds which quantity; ``None`` = not logged."""

    seq_id: Optional[str] = "seq_id"
    logp_behav: str = "logp_behav"
    logp_current: str = "logp_current"
    position: Optional[str] = "position"
    age: Optional[str] = "age"
    advantage: Optional[str] = "advantage"
    reward: Optional[str] = "reward"
    mask: Optional[str] = None
    tool_mask: Optional[str] = None  # multiplies ``mask``: TRL's 0 on tool-result tokens
    layout: Layout = "auto"
    dump: Optional[str] = None  # a framework's own dump files (``dumps.py``: nemo-rl, skyrl, slime), not a table

    def columns(self) -> dict[str, str]:
        """field -> column name, for the fields that name a column (``layout`` and ``dump`` do not)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in NOT_COLUMNS and getattr(self, f.name)}


#: ColumnMap fields that name no column
NOT_COLUMNS = ("layout", "dump")


PRESETS: dict[str, ColumnMap] = {
    "default": ColumnMap(),
    "trl": ColumnMap(seq_id=None, logp_behav="sampling_per_token_logps", logp_current="per_token_logps", position=None,
                     age="age", advantage="advantages", reward="rewards", mask="completion_mask", tool_mask="tool_mask",
                     layout="wide"),
    "verl": ColumnMap(seq_id=None, logp_behav="rollout_log_probs", logp_current="old_log_probs", position=None,
                      age="age", advantage="advantages", reward="scores", mask="response_mask", layout="wide"),
    # the files these frameworks write at every step (``dumps.py`` reads them and cites each writer)
    "nemo-rl": ColumnMap(seq_id=None, logp_behav="generation_logprobs", logp_current="prev_logprobs", position=None,
                         age=None, advantage="advantages", reward="rewards", mask="token_loss_mask",
                         tool_mask="sample_loss_mask", layout="wide", dump="nemo-rl"),
    "skyrl": ColumnMap(seq_id=None, logp_behav="rollout_logprobs", logp_current="action_log_probs", position=None,
                       age=None, advantage="advantages", reward=None, mask="loss_mask", tool_mask="response_mask",
                       layout="wide", dump="skyrl"),
    "slime": ColumnMap(seq_id=None, logp_behav="rollout_log_probs", logp_current="log_probs", position=None,
                       age=None, advantage="advantages", reward="rewards", mask="loss_masks", layout="wide",
                       dump="slime"),
}


def resolve_columns(preset: str = "default", overrides: Optional[str] = None) -> ColumnMap:
    """The preset's map with ``overrides`` ("field=name,field=name"; ``field=`` drops it) applied."""
    check_field(require_one_of, "preset", preset, PRESETS)
    cmap = PRESETS[preset]
    if not overrides:
        return cmap
    changes: dict[str, Optional[str]] = {}
    valid = {f.name for f in fields(ColumnMap) if f.name != "dump"}  # the preset decides how files are read
    for item in filter(None, (part.strip() for part in overrides.split(","))):  # empty items are skipped
        if "=" not in item:
            raise ConfigError("columns", f"must be field=name pairs separated by commas, got {item!r}")
        key, value = (part.strip() for part in item.split("=", 1))
        if key not in valid:
            raise ConfigError("columns", f"names an unknown field {key!r} (valid: {', '.join(sorted(valid))})")
        if key == "layout":
            if value not in ("auto", "long", "wide"):
                raise ConfigError("columns", f"sets layout to {value!r} (valid: auto, long, wide)")
        elif key in REQUIRED and not value:
            raise ConfigError("columns", f"cannot drop {key}: it is required")
        changes[key] = value or None
    return replace(cmap, **changes)

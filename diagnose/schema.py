"""Column schema of a rollout log, and ready mappings for the names TRL and verl use.

A log is a table in one of two layouts:

* ``long``: one row per token.  Columns (default names):

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

* ``wide``: one row per sequence, the per-token quantities as lists of equal length, padding marked by an optional
  0/1 list ``mask`` (and tool-result tokens by an optional 0/1 list ``tool_mask``); ``age``, ``advantage`` and
  ``reward`` may be scalars (per sequence) or lists.  This is the shape of TRL's and verl's per-batch tensors
  written out row by row.

The ratio the whole module studies is r = pi_current / pi_behav, computed as ``log r = logp_current - logp_behav``
(samples are drawn under pi_behav).

Presets (``--preset``):

* ``default``: the long layout above.
* ``trl``: TRL ``GRPOTrainer`` inputs (``trl/trainer/grpo_trainer.py``), and exactly what
  ``replay_theory.integrations.trl``'s ``DiagnoseLogCallback`` writes: behaviour = ``sampling_per_token_logps`` (the
  sampler's log-probs), current = ``per_token_logps`` (the learner at the update), padding = ``completion_mask``,
  times ``tool_mask`` (0 on tool-result tokens, whose sampling log-prob TRL sets to 0: TRL's loss leaves them out,
  and so does every count and statistic here), ``advantages``, ``rewards``, ``age`` (the export's steps since the
  row was generated).  TRL's own vLLM importance-sampling correction uses ``old_per_token_logps`` as the current
  side: pass ``--columns logp_current=old_per_token_logps`` for that pair; the replay trainer's loss corrects
  ``per_token_logps`` against ``old_per_token_logps``: ``--columns logp_behav=old_per_token_logps``.
* ``verl``: verl ``DataProto`` batch keys, and exactly what ``replay_theory.integrations.verl``'s
  ``VerlDiagnoseLogger`` writes: behaviour = ``rollout_log_probs`` (the rollout engine), current = ``old_log_probs``
  (the actor's recomputation at the step, before its update: the pair verl's rollout correction weights with),
  padding = ``response_mask`` (verl's mask is also 0 on multi-turn tool-result tokens), per-token ``advantages``,
  reward = ``scores`` (the row's sum of verl's ``token_level_scores``; ``--columns reward=rewards`` for the
  KL-penalised ``token_level_rewards``), ``age`` (current weights version minus the version the rollout started
  under, from verl's per-sample ``min_global_steps`` / ``max_global_steps``, named ``param_version_start`` /
  ``param_version_end`` in the fully-async trainer before verl 0.9; ``--columns age=age_end`` for the gap to the
  version it ended under).

TRL's GRPOTrainer stores no per-sample policy-version gap in these tensors (the replay trainer's export writes one,
``age``). For any other log, write one (e.g. ``current_version - rollout_version``) and map it with
``--columns age=NAME`` to get the by-age table, the drift fit and FreshPER. A mapped column that the file lacks is
simply not used (only the two log-prob columns are required).

* ``nemo-rl``, ``skyrl``, ``slime``: the per-step files these frameworks already write (``dumps.py``, which cites
  each writer): NeMo-RL's ``train_data_step{N}.jsonl`` (behaviour = ``generation_logprobs``, current =
  ``prev_logprobs``, padding and prompt = ``token_loss_mask`` times ``sample_loss_mask``, per-token
  ``advantages``, ``rewards``); SkyRL's ``global_step_N_training_input.pkl`` (``rollout_logprobs``,
  ``action_log_probs``, ``loss_mask`` times ``response_mask``, ``advantages``; SkyRL drops ``rewards`` before the
  dump); slime's ``train_data/{rollout_id}.pt`` (``rollout_log_probs``, ``log_probs``, ``loss_masks``,
  ``advantages``, ``rewards``). A file or a folder of them; each row gets ``step`` from the file. None of the three
  stores a per-row policy version (no ``age``) or step times.

Every name can be overridden with ``--columns field=name,...``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal, Optional

from ..theory.checks import require_one_of
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

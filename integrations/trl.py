"""TRL replay trainer: GRPO with a replay buffer sized by the experience-replay paper's theory (``ReplayGRPOTrainer``).

Paper: experience-replay (docs/REFERENCES.md), Sec. 3 (N, B, R; staleness x = N/R, replay ratio y = B/R); the
off-policy corrections are the shared losses of ``replay_theory.core.losses`` (M2PO Eq. (1) PPO clip,
Replay-RLOO Eq. (2) truncated sequence IS, M2PO Algorithm 1); the gradient noise scale is McCandlish et al. 2018
(arXiv 1812.06162, App. A.1); the optimizer's memory kappa is theory/forgetting.py's. Code names -> paper symbols:

| code name                          | symbol          | where                                        |
|------------------------------------|-----------------|----------------------------------------------|
| ``replay.capacity``                | N               | buffer size (completions)                    |
| ``replay.batch_size``              | B               | completions per update, drawn uniformly      |
| ``replay.rollouts_per_step``       | R               | fresh completions per update                 |
| ``old_per_token_logps``            | log pi_behav    | the trainer's log-probs at generation        |
| logp of the model in compute_loss  | log pi_theta    | the policy being trained                     |
| age = global_step - version        | s               | staleness of a row, 0 .. ceil(N/R) - 1       |

Where each part is explained: the step (generate, push, draw, the shared loss) and why a subclass,
:class:`ReplayGRPOTrainer`; vLLM's engine ratio, :func:`engine_corrected_loss`; the diagnose log,
:class:`DiagnoseLogCallback`; the logged metrics, ``ReplayGRPOTrainer._log_replay``; the noise scale's two halves,
``_loss_in_halves`` and ``_record_noise``; kappa's curvature pairs, ``_start_curvature`` and ``_finish_curvature``;
the lag-1 products, ``_record_lag``; checkpoints and resume, ``train`` (files: integrations/checkpoints.py).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer  # pyright: ignore[reportPrivateImportUsage]  # trl's lazy __init__ exports them
from trl.trainer.utils import RepeatSampler

from .. import __version__
from ..core import losses
from ..core.metrics import ess_by_age, sequence_log_ratio, step_metrics
from ..core.surrogate import surrogate
from ..diagnose.calibrate_log import GRAD_NORM_COLUMNS
from ..diagnose.framework_stats import framework_statistics
from ..diagnose.whatif import TokenWhatIf, WhatIfConfig, sequence_rows
from ..theory.checks import require_integer, require_one_of, require_open_interval
from .buffer import ReplayConfig, RowReplayBuffer, age_buckets, fifo_max_age
from .checkpoints import CHECKPOINT_DONE, CHECKPOINT_PREFIX, REPLAY_BUFFER_STATE, REPLAY_STATE, complete_checkpoints
from .export import DiagnoseLogWriter, require_pyarrow
from .loss import as_numpy, shared_loss, shared_loss_tensor

__all__ = ["DiagnoseLogCallback", "ReplayConfig", "ReplayGRPOTrainer", "VLLM_IS_MODES", "engine_corrected_loss",
           "noise_halves", "replay_grpo_args", "shared_loss", "shared_loss_tensor"]

#: Fields of TRL's generation output that are kept per row in the buffer (the rest is recomputed or unused).
_BUFFERED = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask",
             "old_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio", "advantages")

#: TRL 1.16's ``vllm_importance_sampling_mode`` values (grpo_trainer.py:2667, 2680, 2686).
VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")

#: TRL's own running counters that a checkpoint does not keep (GRPOTrainer.__init__): its step count and the
#: train tokens seen, logged as num_tokens.
_TRL_COUNTERS = ("_step", "_total_train_tokens")

DEFAULT_CURVATURE_EVERY = 10
"""Steps between curvature pairs for kappa (issue 30): each costs two forward+backward passes of one step's R fresh
rows (2 R / B of an update when it is on-policy: 20% of the update time at every 10th step, 2% overall)."""
CURVATURE_FD_STEP = 1e-4
"""|h w| / |theta| of the central difference: on the tiny Qwen2 in float32 the product agrees with autograd's to 4e-4
(tests/integration/test_validate_kappa.py); 1e-2 is past the loss's curvature scale."""
KAPPA_STATE = "kappa_pending.safetensors"
"""In a checkpoint: the pending curvature pair's w (``_save_kappa_state``)."""
DEFAULT_LAG_COORDS = 4096
"""Coordinates of the fixed random subset the lag-1 gradient products go through (two k-vectors, on the CPU)."""


class _FinishCallback(TrainerCallback):
    """Calls the trainer's ``_finish`` when training reaches ``max_steps`` (not on a stop before it)."""

    def __init__(self, trainer: "ReplayGRPOTrainer") -> None:
        self.trainer = trainer

    def on_train_end(self, args, state, control, **kwargs):  # noqa: D102 (TrainerCallback hook)
        if state.global_step >= state.max_steps:
            self.trainer._finish()


def noise_halves(group_id: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Two halves of a batch's rows, each prompt group's rows all in one half, as equal in rows as a greedy split
    makes them; None when the rows hold a single group (no split keeps it whole).

    Greedy (longest-processing-time): groups by row count, largest first (ties: first appearance in the batch),
    each into the half with fewer rows so far (ties: the first half). ``group_id`` (B,); returns two sorted index
    tensors (b_1,), (b_2,) with b_1 + b_2 = B. A batch of whole groups of G (on-policy) with an even number of
    groups splits into B/2 and B/2.
    """
    ids = group_id.detach().cpu().tolist()
    first: dict[int, int] = {}
    count: dict[int, int] = {}
    for row, g in enumerate(ids):
        first.setdefault(g, row)
        count[g] = count.get(g, 0) + 1
    if len(count) < 2:
        return None
    half_of: dict[int, int] = {}
    rows = [0, 0]
    for g in sorted(count, key=lambda g: (-count[g], first[g])):
        k = 0 if rows[0] <= rows[1] else 1
        half_of[g] = k
        rows[k] += count[g]
    side = torch.tensor([half_of[g] for g in ids])
    return torch.nonzero(side == 0).flatten(), torch.nonzero(side == 1).flatten()


def engine_corrected_loss(replay: ReplayConfig, logp_new: torch.Tensor, logp_behav: torch.Tensor,
                          advantages: torch.Tensor, mask: torch.Tensor, is_ratio: torch.Tensor | None = None,
                          row_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, losses.LossOutput]:
    """The shared loss with TRL's vLLM importance-sampling ratio multiplied into every token's term, as TRL does.

    TRL (grpo_trainer.py:3146-3147) multiplies its per-token loss by ``importance_sampling_ratio`` rho_it, a constant
    computed at generation (pi_old / pi_vllm with its mode and cap, L2660-2707), before aggregating. Every trainer
    loss is loss = -sum_it a_it objective_it with objective_it's dependence on other tokens held constant (the PPO
    clip, M2PO's mask and Replay-RLOO's sequence weight are not differentiated), so weighting the terms gives
    value -sum_it a_it rho_it objective_it and d / d logp_it = rho_it * (the loss's own d / d logp_it): the shared
    loss's gradient times rho, nothing re-implemented. ``logp_new``, ``logp_behav`` (= pi_old), ``mask``,
    ``is_ratio`` (B, L); ``advantages``, ``row_weight`` (B,). ``is_ratio`` None: :func:`shared_loss_tensor`.

    Why two factors (vLLM, ``use_vllm=True`` with TRL's default ``vllm_importance_sampling_correction``): a row
    generated at step v by the engine (log mu, TRL's ``sampling_per_token_logps``), scored then by the trainer
    (log pi_old, ``old_per_token_logps``) and trained at step t (pi_theta) has pi_theta / mu = (pi_theta / pi_old)
    (pi_old / mu). The engine factor rho = pi_old / mu is fixed at generation (``token_truncate`` clip(e^d, C_min,
    C_max), ``token_mask`` e^d 1[C_min <= e^d <= C_max], ``sequence_*`` the same on e^(sum_t d), d = log pi_old -
    log mu) and the buffer stores it with the row; the staleness factor r = pi_theta / pi_old is the shared loss's
    correction, recomputed at every draw.
    """
    if is_ratio is None:
        return shared_loss_tensor(replay, logp_new, logp_behav, advantages, mask, row_weight=row_weight)
    out = shared_loss(replay, as_numpy(logp_new), as_numpy(logp_behav), as_numpy(advantages), as_numpy(mask))
    rho = as_numpy(is_ratio)  # (B, L) rho_it, fixed with the row at generation
    real = as_numpy(mask).astype(bool)  # (B, L)
    a = losses._token_weights(real[None], replay.resolved_aggregation)[0]  # (B, L) a_it of the loss's value
    live = real & (rho > 0)  # a masked token (rho = 0, *_mask modes) adds 0, even to an infinite objective
    with np.errstate(invalid="ignore", over="ignore"):
        grad = np.where(live, out.grad_logp[0] * rho, 0.0)  # (B, L) d loss / d logp_it = rho_it * loss's own
        objective = out.objective
        assert objective is not None  # every shared loss returns through core.losses._output, which sets it
        value = -np.sum(np.where(live & (a > 0), a * rho * objective[0], 0.0))  # -sum a rho objective
    scalar = surrogate(grad, logp_new, mask=mask, row_weight=row_weight, value=value)
    return scalar, losses.LossOutput(loss=np.array([value]), grad_logp=grad[None], metrics=out.metrics,
                                     objective=out.objective)


def _row_shares(replay: ReplayConfig, mask: torch.Tensor) -> np.ndarray:
    """a_i: each row's weight in the shared loss (the aggregation's token weights summed over the row; sum 1).

    The aggregation is ``replay.resolved_aggregation``: ``replay.aggregation``, else the loss's own (its registry
    entry; tis seq-mean-token-sum, the others token-mean). ``mask`` (B, L) real tokens; returns (B,).
    """
    return losses._token_weights(as_numpy(mask).astype(bool)[None], replay.resolved_aggregation)[0].sum(axis=1)


def replay_grpo_args(replay: ReplayConfig, num_generations: int, **kwargs: Any) -> GRPOConfig:
    """A GRPOConfig whose generation batch is R completions and whose every step is one update.

    per_device_train_batch_size = R (TRL's generation batch on one process), steps_per_generation = 1,
    num_iterations = 1, gradient_accumulation_steps = 1, num_generations = G; ``kwargs`` set the rest.
    """
    fixed = dict(per_device_train_batch_size=replay.rollouts_per_step, steps_per_generation=1, num_iterations=1,
                 gradient_accumulation_steps=1, num_generations=num_generations)
    clash = sorted(k for k in fixed if k in kwargs and kwargs[k] != fixed[k])
    if clash:
        raise ValueError(f"the replay design sets {', '.join(clash)} (R = {replay.rollouts_per_step}, "
                         f"G = {num_generations}): leave {'it' if len(clash) == 1 else 'them'} out")
    return GRPOConfig(**{**kwargs, **fixed})


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


def _noise_options(measure_noise: bool, noise_log: str | os.PathLike | None, curvature_every: int | None,
                   curvature_step: float, lag_coords: int | None) -> tuple[int, int]:
    """The trainer's noise-scale options checked, and ``(curvature_every, lag_coords)`` with their defaults: None is
    DEFAULT_CURVATURE_EVERY / DEFAULT_LAG_COORDS with ``measure_noise``, off without it."""
    for name, value in (("curvature_every", curvature_every), ("lag_coords", lag_coords)):
        if value is not None:
            require_integer(name, value, 0, note=" (0: off)")
        if value and not measure_noise:
            raise ValueError(f"{name} > 0 needs measure_noise=True (it works on the two halves' gradients and "
                             "their records)")
    require_open_interval("curvature_step", curvature_step, 0, 1, note=" (|h w| / |theta|)")
    if noise_log is not None:  # checked first, as the diagnose log
        if not measure_noise:
            raise ValueError("noise_log needs measure_noise=True (it holds the measured norms)")
        if Path(noise_log).exists():
            raise ValueError(f"noise log {noise_log} exists: a log is never overwritten, give a new path")
    curvature_every = (DEFAULT_CURVATURE_EVERY if measure_noise else 0) if curvature_every is None \
        else curvature_every
    lag_coords = (DEFAULT_LAG_COORDS if measure_noise else 0) if lag_coords is None else lag_coords
    return curvature_every, lag_coords


def loaded_through_a_tie(model: torch.nn.Module, missing_keys: list[str]) -> set[str]:
    """The ``missing_keys`` of a ``load_state_dict`` that were loaded all the same: parameters shared with a key that
    was not missing (tied weights, e.g. the tiny model's ``lm_head.weight``, which is its ``embed_tokens.weight``).

    Why: safetensors stores a tied tensor once, under one name, so a checkpoint lacks the other name; the tensor
    loaded under its twin's is the same Parameter, so it is exact, not missing."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    missing = set(missing_keys)
    return {key for aliases in names.values() if any(a not in missing for a in aliases)
            for key in aliases if key in missing}


class ReplayGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that generates R completions a step into a replay buffer of N and trains on B drawn from it.

    ``replay``: a :class:`ReplayConfig` (by hand, or ``ReplayConfig.from_optimal_json``). ``args`` must make TRL's
    generation batch R completions with one update per generation (see :func:`replay_grpo_args`); the buffer is
    per process, and one process is supported. Evaluation is TRL's, unchanged.

    The training loss is ``replay``'s, not TRL's: GRPOConfig's loss options (``loss_type``, ``epsilon``,
    ``epsilon_high``, ``delta``, ``importance_sampling_level``, ``off_policy_mask_threshold``,
    ``top_entropy_quantile``, the entropy bonus) do not act on it; ``beta`` must be 0.

    ``diagnose_log``: a new Parquet path; every step's trained rows are written there for ``replay-theory diagnose
    LOG --preset trl`` (a :class:`DiagnoseLogCallback`; passing one in ``callbacks`` does the same).

    ``measure_noise`` (default True): the two-batch noise-scale norms every step (``_loss_in_halves``), kept in
    ``noise_records`` and logged under ``noise/*``; ``noise_log``: a new JSON-lines path that gets one line a step
    when training reaches ``max_steps``
    (``GRAD_NORM_COLUMNS`` plus ``unit_size``, the group size), for ``calibrate --from-log LOG --grad-norms``.

    ``curvature_every`` (default ``DEFAULT_CURVATURE_EVERY`` with ``measure_noise``, 0: off): the steps between the
    curvature pairs of kappa, and ``curvature_step`` the central difference's |h w| / |theta|; ``lag_coords``
    (default ``DEFAULT_LAG_COORDS``, 0: off): the lag-1 products' coordinates (``_record_lag``). Both add their
    fields to the noise records.

    Each optimizer step: TRL generates and scores R completions (its own ``_generate_and_score_completions``), they
    are pushed into a :class:`~replay_theory.integrations.buffer.RowReplayBuffer` as whole groups with their
    behaviour log-probs, advantages, rewards, masks (``tool_mask`` included) and policy version, and B rows are
    drawn. Which rows are kept and drawn is the shared design's decision (``replay.buffer``), made by the same
    buffer classes and batch step the simulator runs. The loss is the shared numpy loss on those rows: its
    derivative d loss / d logp_new is backpropagated through the model's log-probs as
    ``(grad_logp.detach() * logp_new).sum()`` (the validator's route), so the gradient IS the shared loss's.

    Why a subclass and not a callback: a TRL callback sees the trainer only between steps and cannot change what a
    step trains on; the buffer has to sit between generation and the loss. The subclass overrides three TRL
    methods: ``_prepare_inputs`` (generate -> push -> draw instead of TRL's split of one generation batch),
    ``compute_loss`` (the shared losses), ``_calculate_rewards`` (to keep the per-row rewards TRL does not return);
    and calls ``_generate_and_score_completions`` and ``_get_per_token_logps_and_entropies``. These are TRL
    internals: tested against TRL 1.16.0, they may change on upgrade.
    """

    def __init__(self, *args: Any, replay: ReplayConfig, diagnose_log: str | os.PathLike | None = None,
                 measure_noise: bool = True, noise_log: str | os.PathLike | None = None,
                 curvature_every: int | None = None, curvature_step: float = CURVATURE_FD_STEP,
                 lag_coords: int | None = None, **kwargs: Any) -> None:
        curvature_every, lag_coords = _noise_options(measure_noise, noise_log, curvature_every, curvature_step,
                                                     lag_coords)
        log_callback = DiagnoseLogCallback(diagnose_log) if diagnose_log is not None else None  # checked first
        super().__init__(*args, **kwargs)
        if log_callback is not None:
            self.add_callback(log_callback)
        self.add_callback(_FinishCallback(self))
        self._resume_step = 0  # the checkpoint's step when resuming: TRL's sampler is advanced to its epoch
        self._check_trl_args(replay)
        self.replay = replay
        group_size = self.num_generations
        assert group_size is not None  # GRPOConfig refuses None (its num_generations < 2 check)
        self.replay_buffer = RowReplayBuffer(replay.design_config(group_size), seed=replay.seed,
                                             total_steps=max(int(self.args.max_steps), 1))
        self.replay_generated = 0  # fresh completions generated for training
        self.replay_trained = 0  # completions trained on (with repetition)
        self._fifo_max_age = fifo_max_age(replay.capacity, replay.rollouts_per_step)
        self._last_rewards_per_func: torch.Tensor | None = None
        self._step_generation_seconds = 0.0  # wall seconds this step spent in TRL's generation (for the log)
        self._step_generated_rows = 0
        self.measure_noise = bool(measure_noise)
        self.noise_log = None if noise_log is None else Path(noise_log)
        self.noise_records: list[dict[str, float]] = []  # one per measured step: GRAD_NORM_COLUMNS
        self._noise_pending: dict[str, Any] | None = None  # half 1's gradient copy, between compute_loss and the end
        self._noise_armed = False  # True inside training_step only
        self.curvature_every, self.curvature_step, self.lag_coords = curvature_every, float(curvature_step), lag_coords
        self._curvature_pending: dict[str, Any] | None = None  # w = D xi of step t, until the next fresh rows
        self.curvature_skipped: dict[str, int] = {}  # why a due pair was not measured -> how often
        self._lag_index: list | None = None  # (parameter, its coordinates in the subset), drawn at the first use
        self._lag_scale = 1.0
        self._lag_previous: tuple[int, torch.Tensor] | None = None  # (step, subset of its gradient)

    def _check_trl_args(self, replay: ReplayConfig) -> None:
        """TRL's arguments the replay step supports: one process, one generation and one pass per step, R rows a
        step, no KL term, a vLLM importance-sampling mode the shared losses apply."""
        a = cast(GRPOConfig, self.args)  # GRPOTrainer's args are a GRPOConfig (Trainer types them as its base)
        world = self.accelerator.num_processes
        checks = [
            (world == 1, f"one process is supported (the buffer is per process), got {world}"),
            (a.steps_per_generation == 1, f"steps_per_generation must be 1, got {a.steps_per_generation}"),
            (self.num_iterations == 1, f"num_iterations must be 1, got {self.num_iterations}"),
            (a.gradient_accumulation_steps == 1,
             f"gradient_accumulation_steps must be 1, got {a.gradient_accumulation_steps}"),
            (a.per_device_train_batch_size == replay.rollouts_per_step,
             f"per_device_train_batch_size must equal rollouts_per_step = {replay.rollouts_per_step}, "
             f"got {a.per_device_train_batch_size}"),
            (self.beta == 0.0, f"beta must be 0 (the shared losses have no KL term), got {self.beta}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if self.use_vllm and self.vllm_importance_sampling_correction:
            require_one_of("vllm_importance_sampling_mode", getattr(self, "vllm_importance_sampling_mode", None),
                           VLLM_IS_MODES)

    # ------------------------------------------------------------------ checkpoints: resume exactly

    def _diagnose_callback(self) -> DiagnoseLogCallback | None:
        return next((c for c in self.callback_handler.callbacks if isinstance(c, DiagnoseLogCallback)), None)

    def _save_checkpoint(self, model, trial):  # noqa: D102 (Trainer's, then the replay state and the marker)
        super()._save_checkpoint(model, trial)  # model, optimizer, scheduler, RNG states, trainer_state.json
        run_dir = Path(self._get_output_dir(trial=trial))
        folder = run_dir / f"{CHECKPOINT_PREFIX}{self.state.global_step}"
        log = self._diagnose_callback()
        self.replay_buffer.save_state(folder / REPLAY_BUFFER_STATE)
        state = {"replay_theory_version": __version__, "global_step": int(self.state.global_step),
                 "replay_generated": self.replay_generated, "replay_trained": self.replay_trained,
                 "noise_records": self.noise_records,
                 "diagnose_parts": None if log is None else log.checkpoint(),
                 "trl": {name: getattr(self, name) for name in _TRL_COUNTERS},
                 "kappa": self._save_kappa_state(folder)}
        (folder / REPLAY_STATE).write_text(json.dumps(state))
        # the marker last, whole: a checkpoint without it (a crash while saving) is never resumed from
        tmp = folder / f".{CHECKPOINT_DONE}.tmp"
        tmp.write_text(str(self.state.global_step))
        tmp.replace(folder / CHECKPOINT_DONE)
        for older in complete_checkpoints(run_dir)[:-1]:  # Trainer's save_total_limit would delete before the marker
            shutil.rmtree(older)

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """Trainer's warning of the keys a resumed checkpoint lacked, without the tied ones (``loaded_through_a_tie``):
        transformers 5 recognises a tie only through ``_keys_to_ignore_on_save``, which Qwen2 leaves empty, so every
        resume said ``missing keys ... ['lm_head.weight']`` of a checkpoint that loads exactly. Any other missing or
        unexpected key is still reported."""
        tied = loaded_through_a_tie(self.model, list(load_result.missing_keys))
        if tied:
            load_result = load_result._replace(missing_keys=[k for k in load_result.missing_keys if k not in tied])
        super()._issue_warnings_after_load(load_result)

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None,
              ignore_keys_for_eval: list[str] | None = None, **kwargs: Any):
        """TRL's train; ``resume_from_checkpoint`` (True: the newest complete checkpoint in ``output_dir``, or a
        path) also restores the replay buffer, its counters, the noise records and the diagnose log's parts, so
        the run goes on exactly as if it had not stopped."""
        if resume_from_checkpoint is True:
            output_dir = self.args.output_dir
            assert output_dir is not None  # TrainingArguments.__post_init__ sets "trainer_output" in place of None
            found = complete_checkpoints(Path(output_dir))
            resume_from_checkpoint = str(found[-1]) if found else None
        log = self._diagnose_callback()
        if resume_from_checkpoint:
            folder = Path(resume_from_checkpoint)
            if not (folder / CHECKPOINT_DONE).is_file():
                raise ValueError(f"{folder} is not a complete replay checkpoint (no {CHECKPOINT_DONE})")
            state = json.loads((folder / REPLAY_STATE).read_text())
            self.replay_buffer.load_state(folder / REPLAY_BUFFER_STATE)
            self.replay_generated, self.replay_trained = state["replay_generated"], state["replay_trained"]
            self.noise_records = state["noise_records"]
            for name, value in state["trl"].items():
                setattr(self, name, value)
            self._resume_step = int(state["global_step"])
            self._load_kappa_state(folder, state.get("kappa"))
            if log is not None:
                log.start(state["diagnose_parts"] or [])
        elif log is not None:
            log.start(None)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial,
                             ignore_keys_for_eval=ignore_keys_for_eval, **kwargs)

    def _get_train_sampler(self, dataset=None):  # noqa: D102 (TRL's RepeatSampler, advanced when resuming)
        sampler = cast(RepeatSampler, super()._get_train_sampler(dataset))  # what GRPOTrainer's returns
        generator = getattr(sampler, "generator", None)
        if self._resume_step and generator is not None:
            # Trainer makes the sampler afresh (seeded) and skips only the resumed epoch's first batches: the
            # epochs before it drew one permutation each from the generator, drawn again here
            per_epoch = sampler.num_samples // sampler.batch_size  # batches (steps) per epoch, as Trainer counts
            for _ in range(self._resume_step // max(per_epoch, 1)):
                torch.randperm(sampler.num_samples, generator=generator)
        return sampler

    def _finish(self) -> None:
        """The last step is done: the noise log, whole (the checkpoints held its lines until now)."""
        if self.noise_log is not None and self.noise_records:
            from ..outputs import write_new

            self.noise_log.parent.mkdir(parents=True, exist_ok=True)
            lines = "".join(json.dumps({**r, "unit_size": self.num_generations}) + "\n" for r in self.noise_records)
            write_new(self.noise_log, lambda tmp: tmp.write_text(lines), option="noise log")

    # ------------------------------------------------------------------ generation -> buffer -> draw

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # noqa: D102 (TRL internal)
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func  # (rows, reward funcs); TRL does not return per-row rewards
        return rewards_per_func

    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        if not self._model().training:
            return super()._prepare_inputs(generation_batch)
        # The design's batch step decides whether to generate (FreshPER Algorithm 1's replay updates do not),
        # what to keep and what to draw; TRL's generation runs only when it asks.
        self._step_generation_seconds = 0.0

        fresh: list[dict[str, torch.Tensor]] = []

        def generate() -> dict[str, torch.Tensor]:
            started = time.perf_counter()
            rows = self.fresh_rows(self._generate_and_score_completions(generation_batch))
            self._step_generation_seconds += time.perf_counter() - started
            fresh.append(rows)
            return rows

        drawn, data = self.replay_buffer.step(self.state.global_step, generate)
        if self._curvature_pending is not None and fresh:  # kappa's H w on rows xi's halves never held
            self._finish_curvature(self._curvature_pending, fresh[0])
        self._step_generated_rows = int(np.sum(data.generated))
        self.replay_generated += self._step_generated_rows
        self.replay_trained += int(data.train.size)
        return drawn

    def fresh_rows(self, output: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The per-row fields of one TRL generation output (whole groups) that the buffer stores."""
        unsupported = sorted(k for k in ("pixel_values", "ref_per_token_logps") if k in output)
        if unsupported:
            raise ValueError(f"the replay trainer does not buffer {', '.join(unsupported)} yet (multimodal inputs, "
                             "beta > 0)")
        if "importance_sampling_ratio" in output:  # vLLM: TRL's pi_old / pi_vllm after its mode and cap
            ratio = output["importance_sampling_ratio"]  # (rows, L) token_* modes, (rows, 1) sequence_* modes
            # one value per token (a sequence mode's row value repeated, as TRL's (B, 1) * (B, L) broadcasts), so
            # it is stored, padded and trimmed with the completion
            output["importance_sampling_ratio"] = ratio.expand_as(output["completion_mask"]).to(torch.float64)
        if "old_per_token_logps" not in output:  # TRL skips it when generation and update are aligned: we need it
            output["old_per_token_logps"] = self._behaviour_logps(output)
        rows = {k: output[k] for k in _BUFFERED if k in output}
        if "tool_mask" not in rows:
            rows["tool_mask"] = torch.ones_like(rows["completion_mask"])  # every push carries the same fields
        rows["rewards"] = self._row_rewards(rows["completion_ids"].shape[0])
        if "sampling_per_token_logps" not in rows:
            rows["sampling_per_token_logps"] = rows["old_per_token_logps"]  # HF generate: the sampler is the model
        return rows

    @torch.no_grad()
    def _behaviour_logps(self, output: dict[str, Any]) -> torch.Tensor:
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        out = self._get_per_token_logps_and_entropies(
            self.model, ids, attention, output["completion_ids"].size(1),
            batch_size=self.args.per_device_train_batch_size)
        return out[0]  # TRL 1.0-1.5 return (logps, entropies); 1.8 and later add the MoE aux loss

    def _row_rewards(self, rows: int) -> torch.Tensor:
        per_func = self._last_rewards_per_func
        if per_func is None or per_func.shape[0] != rows:
            return torch.full((rows,), float("nan"))
        weights = self.reward_weights.to(per_func.device)
        return (per_func * weights.unsqueeze(0)).nansum(dim=1).detach().cpu()

    # ------------------------------------------------------------------ loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not model.training or "version" not in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if return_outputs:
            raise ValueError("The GRPOTrainer does not support returning outputs")
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        width = inputs["completion_ids"].size(1)
        # only inside training_step (which finishes the measurement): a direct call returns the plain loss
        halves = noise_halves(inputs["group_id"]) if self.measure_noise and self._noise_armed else None
        split = None  # with the noise scale: the halves and their log-probs' own graphs (_loss_in_halves)
        if halves is None:
            logp_new, entropies = self._get_per_token_logps_and_entropies(model, ids, attention, width,
                                                                          compute_entropy=True)[:2]
        else:  # two micro-batches (_loss_in_halves): each half's graph is backpropagated once, separately
            halves = (halves[0].to(ids.device), halves[1].to(ids.device))
            parts = [self._get_per_token_logps_and_entropies(model, ids[h], attention[h], width,
                                                             compute_entropy=True)[:2] for h in halves]
            order = torch.argsort(torch.cat(halves))  # back to the batch's row order
            logp_new = torch.cat([lp for lp, _ in parts])[order]  # (B, L)
            entropies = torch.cat([e for _, e in parts])[order]  # (B, L)
            split = (halves, [lp for lp, _ in parts])
        mask = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
        if not mask.any():  # every drawn row fully masked (e.g. all truncated): nothing to learn from
            return (logp_new * 0.0).sum()
        if split is None:
            loss, out = engine_corrected_loss(self.replay, logp_new, inputs["old_per_token_logps"],
                                              inputs["advantages"], mask,
                                              is_ratio=inputs.get("importance_sampling_ratio"),
                                              row_weight=inputs.get("sampler_weight"))
        else:
            loss, out = self._loss_in_halves(inputs, logp_new, mask, *split)
        self._log_replay(inputs, logp_new.detach(), mask, entropies, out)
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, DiagnoseLogCallback):
                callback.record(self.state.global_step, inputs, logp_new.detach(),
                                generation_seconds=self._step_generation_seconds,
                                generated_rows=self._step_generated_rows)
        return loss

    def _loss_in_halves(self, inputs: dict[str, Any], logp_new: torch.Tensor, mask: torch.Tensor,
                        halves: tuple[torch.Tensor, torch.Tensor], logp_halves: list[torch.Tensor]
                        ) -> tuple[torch.Tensor, losses.LossOutput]:
        """The shared loss on the whole batch, half 1's share backpropagated here and its gradient copied; returns
        the loss to hand TRL (value: the full loss; gradient: half 2's share) and the loss's output.

        ``logp_new`` (B, L) in batch order; ``logp_halves`` [(b_1, L), (b_2, L)], the halves' own graphs.

        How the noise scale hooks into TRL at no extra backward pass:

        1. ``compute_loss`` splits the B drawn rows into two halves that keep every prompt group whole
           (:func:`noise_halves`: the group baseline correlates a group's rows, so the group is the independent
           unit) and runs the model forward on each half separately (both graphs alive: the memory of one forward
           over B). The shared loss is computed ONCE on the whole batch's log-probs, so training is unchanged (the
           clip, M2PO's batch mask and the token-mean normaliser see all B rows); its d loss / d logp_new is split
           into the two halves' surrogates S_1 + S_2 = the full loss's surrogate.
        2. Here, S_1 is backpropagated through ``accelerator.backward`` (scaled as TRL's ``training_step`` scales its
           loss) and the accumulated gradient g_1 copied (one copy of the gradients: the memory this costs); the
           loss returned has the full loss's value and S_2's gradient.
        3. TRL's own ``training_step`` backpropagates that loss, so ``.grad`` holds g_1 + g_2, the full-batch
           gradient, each half's graph traversed once. ``training_step`` (overridden, around TRL's) then reads the
           norms (``_record_noise``), before TRL clips the gradient and steps the optimizer.
        """
        leaf = logp_new.detach().requires_grad_(True)  # (B, L): the loss's d / d logp_new, without the model
        full, out = engine_corrected_loss(self.replay, leaf, inputs["old_per_token_logps"], inputs["advantages"],
                                          mask, is_ratio=inputs.get("importance_sampling_ratio"),
                                          row_weight=inputs.get("sampler_weight"))
        (coef,) = torch.autograd.grad(full, leaf)  # (B, L), 0 on padding: the full loss's per-token gradient
        surrogates = [(coef[h] * torch.where(mask[h], lp, 0.0)).sum()  # S_1 + S_2 = the full loss's surrogate
                      for h, lp in zip(halves, logp_halves)]
        # scaled as TRL's training_step scales the loss it backpropagates (1 / gradient accumulation steps)
        self.accelerator.backward(surrogates[0] / self.current_gradient_accumulation_steps)
        params = self._trainable()
        shares = _row_shares(self.replay, mask)  # (B,) a_i
        self._noise_pending = {
            "step": self.state.global_step,
            "first": [None if p.grad is None else p.grad.detach().clone() for p in params],  # g_1 (one copy)
            "shares": [float(shares[h.cpu().numpy()].sum()) for h in halves],  # W_1, W_2
            "rows": [int(h.numel()) for h in halves],  # b_1, b_2
        }
        value = full.detach()
        return surrogates[1] + (value - surrogates[1].detach()), out

    def training_step(self, model, inputs, num_items_in_batch=None):  # noqa: D102 (TRL's, then the noise norms)
        self._noise_pending, self._noise_armed = None, True
        try:
            loss = super().training_step(model, inputs, num_items_in_batch)  # compute_loss + TRL's backward
        finally:
            self._noise_armed = False
        if self._noise_pending is not None:
            self._record_noise(self._noise_pending)
            if self.curvature_every:
                self._start_curvature(self._noise_pending)  # before TRL's optimizer step: the gradients are read only
            self._noise_pending = None  # free half 1's gradient copy
        if self.lag_coords and self.measure_noise:
            self._record_lag(int(self.state.global_step))
        return loss

    @torch.no_grad()
    def _record_noise(self, pending: dict[str, Any]) -> None:
        """|g_small|^2, |g_big|^2 from half 1's gradient copy and the accumulated full-batch gradient
        (``_loss_in_halves``); logged (``noise/grad_sq_small``, ``noise/grad_sq_big``, ``noise/batch_small``,
        ``noise/batch_big``, batch sizes in responses), kept in ``noise_records`` and appended to ``noise_log`` for
        ``calibrate --from-log --grad-norms`` (``theory.noise_scale.pooled_two_batch``).

        What is measured. With the loss L = sum_i a_i l_i (a_i the aggregation's weight of row i, sum 1: token-mean
        a_i = T_i / T, seq-mean a_i = 1 / B) and W_k = sum_{i in half k} a_i, g_hat_k = g_k / W_k is the gradient of
        half k's own mean loss, g_big = g_1 + g_2 = W_1 g_hat_1 + W_2 g_hat_2 the full-batch one: |g_small|^2 =
        (|g_hat_1|^2 + |g_hat_2|^2) / 2 and |g_big|^2 = |g_1 + g_2|^2. With halves of b_1, b_2 rows, E|g_hat_k|^2 =
        |G|^2 + tr Sigma / b_k, so B_small = 2 b_1 b_2 / (b_1 + b_2) (the harmonic mean) and B_big = B. Rows of
        unequal length make a token-mean's effective batch slightly below B: rows are the samples here. FreshPER's
        importance weights are part of each row's gradient. The norms are divided by the square of accelerate's fp16
        loss scale when it has one. A step holding one group only, or a half with no real token, is not measured.
        """
        params = self._trainable()
        sq_first = sq_second = sq_full = 0.0
        for p, g1 in zip(params, pending["first"]):
            g = p.grad
            if g is None:  # a parameter the loss does not reach
                continue
            g1 = torch.zeros_like(g) if g1 is None else g1
            sq_first += float(torch.linalg.vector_norm(g1, dtype=torch.float64) ** 2)  # |g_1|^2
            sq_second += float(torch.linalg.vector_norm(g - g1, dtype=torch.float64) ** 2)  # |g_2|^2
            sq_full += float(torch.linalg.vector_norm(g, dtype=torch.float64) ** 2)  # |g_1 + g_2|^2
        w1, w2 = pending["shares"]
        if not (w1 > 0 and w2 > 0):  # a half without a real token has no mean loss: the step is not measured
            return
        scaler = getattr(self.accelerator, "scaler", None)
        scale = float(scaler.get_scale()) if scaler is not None else 1.0  # fp16: gradients carry the loss scale
        b1, b2 = pending["rows"]
        record = {
            "step": int(pending["step"]),
            "grad_sq_small": (sq_first / w1**2 + sq_second / w2**2) / 2 / scale**2,  # mean of |g_hat_k|^2
            "grad_sq_big": sq_full / scale**2,  # |g_big|^2 = |W_1 g_hat_1 + W_2 g_hat_2|^2
            "batch_small": 2 * b1 * b2 / (b1 + b2),  # E mean_k |g_hat_k|^2 = |G|^2 + tr Sigma / B_small
            "batch_big": float(b1 + b2),  # B
        }
        self.noise_records.append(record)
        metrics = self._metrics["train"]
        for key in GRAD_NORM_COLUMNS[1:]:
            metrics[f"noise/{key}"].append(record[key])

    # ------------------------------------------------------------------ the optimizer's memory kappa (issue 30)

    def _save_kappa_state(self, folder: Path) -> dict:
        """What a resumed run needs to log what an uninterrupted one logs: a pending pair's w (safetensors, no pickle:
        one gradient-sized file) and its scalars, the last lag-1 gradient subset, the skip counts (JSON)."""
        from safetensors.torch import save_file

        pending = self._curvature_pending
        if pending is not None:
            save_file({f"w{i}": x.contiguous().cpu() for i, x in enumerate(pending["w"])}, str(folder / KAPPA_STATE))
        previous = self._lag_previous
        return {"pending": None if pending is None else {k: v for k, v in pending.items() if k != "w"},
                "lag_previous": None if previous is None else [previous[0], previous[1].tolist()],
                "skipped": self.curvature_skipped}

    def _load_kappa_state(self, folder: Path, state: dict | None) -> None:
        """``_save_kappa_state``'s counterpart (a checkpoint written before kappa existed has none: nothing pending)."""
        from safetensors.torch import load_file

        state = state or {}
        self.curvature_skipped = dict(state.get("skipped") or {})
        previous = state.get("lag_previous")
        self._lag_previous = None if previous is None else (int(previous[0]),
                                                            torch.tensor(previous[1], dtype=torch.float64))
        pending = state.get("pending")
        self._curvature_pending = None
        if pending is not None:
            saved = load_file(str(folder / KAPPA_STATE))
            params = self._trainable()
            self._curvature_pending = {**pending, "w": [saved[f"w{i}"].to(p.device) for i, p in enumerate(params)]}

    def _noise_record_of(self, step: int) -> dict[str, float] | None:
        """The noise record of ``step`` (the last one, if it is that step's), where the kappa fields are added."""
        last = self.noise_records[-1] if self.noise_records else None
        return last if last is not None and last["step"] == step else None

    def _model(self) -> torch.nn.Module:
        """Trainer's model (typed optional there: GRPOTrainer's __init__ takes one, or a name it loads)."""
        if self.model is None:
            raise ValueError("the trainer has no model")
        return self.model

    def _trainable(self) -> list[torch.Tensor]:
        return [p for p in self._model().parameters() if p.requires_grad]

    @torch.no_grad()
    def _start_curvature(self, pending: dict[str, Any]) -> None:
        """At a measured step t (every ``curvature_every``): xi = g_hat_1 - g_hat_2 of the two halves (their own mean
        losses' gradients, ``_record_noise``), w = D xi with D = 1 / (sqrt(v_hat) + eps) the diagonal this step's
        AdamW update applies (v = beta2 exp_avg_sq + (1 - beta2) g^2 with this step's gradient g as Trainer clips
        it, ``max_grad_norm``, bias-corrected at the step's count: the state before the update alone would put
        1 / eps = 1e8 on a coordinate whose gradient first appears now), and xi^T D xi. w (one gradient-sized
        buffer) waits for the next step's fresh rows (``_finish_curvature``); the update itself is untouched (its
        gradients are only read).

        kappa = eta tr(D H D Sigma) / tr(D Sigma) (issue 30; theory/forgetting.py): ``calibrate --from-log
        --grad-norms`` pools the pairs (ratio of sums, bootstrap over pairs) into the profile's ``memory``. Why
        curvature pairs and not the lag-1 autocorrelation of successive gradients: under Adam the lag-1 signal is
        positive, about 0.4 kappa at beta1 = 0.9, biased upward by the mean gradient's drift and tiny at small kappa
        (calibrate-simulator measured 5x the exact kappa with it); under replay the reused rows' noise adds C(1) > 0.
        xi costs no extra pass: it is the two halves the noise scale already backpropagates."""
        step = int(pending["step"])
        record = self._noise_record_of(step)
        if record is None or not self.curvature_every or step % self.curvature_every:
            return
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate wraps torch's AdamW
        if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
            self._skip_curvature(f"step {step}: the optimizer is {type(optimizer).__name__}: kappa's preconditioner "
                                 "is Adam's (AdamW, TRL's default)")
            return
        params = self._trainable()
        states = [optimizer.state.get(p, {}) for p in params]  # empty before the first update
        groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        scaler = getattr(self.accelerator, "scaler", None)
        scale = float(scaler.get_scale()) if scaler is not None else 1.0  # fp16: gradients carry the loss scale
        w1, w2 = pending["shares"]
        # Trainer clips the gradient (max_grad_norm, torch's clip_grad_norm_) before AdamW folds it into v
        norm = math.sqrt(sum(float(((p.grad.double() / scale) ** 2).sum()) for p in params if p.grad is not None))
        max_norm = self.args.max_grad_norm
        clip = min(1.0, max_norm / (norm + 1e-6)) if max_norm is not None and max_norm > 0 else 1.0
        w, den = [], 0.0
        for p, g1, state in zip(params, pending["first"], states):
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            g1 = torch.zeros_like(g) if g1 is None else g1
            xi = (g1 / w1 - (g - g1) / w2).float() / scale  # g_hat_1 - g_hat_2 (float32: w's buffer)
            group = groups[id(p)]
            beta2, count = group["betas"][1], float(state.get("step", 0.0)) + 1.0  # this step's update
            previous = state["exp_avg_sq"].double() if "exp_avg_sq" in state else 0.0
            v_hat = (beta2 * previous + (1.0 - beta2) * (clip * g.double() / scale) ** 2) / (1.0 - beta2 ** count)
            d = (1.0 / (v_hat.sqrt() + group["eps"])).float()
            w.append(d * xi)
            den += float((xi.double() * w[-1].double()).sum())
        lrs = {float(optimizer.param_groups[0]["lr"])} | {float(g["lr"]) for g in optimizer.param_groups}
        if len(lrs) != 1:
            self._skip_curvature(f"step {step}: the parameter groups have different learning rates {sorted(lrs)}: "
                                 "kappa needs one eta")
            return
        self._curvature_pending = {"step": step, "w": w, "den": den, "lr": lrs.pop(),
                                   "beta1": float(optimizer.param_groups[0]["betas"][0])}

    def _finish_curvature(self, pending: dict[str, Any], rows: dict[str, torch.Tensor]) -> None:
        """At the next step that generates (theta_{t+1}, its fresh rows, which xi's rows never were): the numerator
        w^T H w, H w by central differences of the rows' score-reweighted on-policy gradient (``_curvature_grad``),
        theta +- h w with h = ``curvature_step`` |theta| / |w|; the parameters are restored bit for bit from a copy,
        the gradients come from autograd.grad (``.grad`` untouched), the random streams are forked. Adds
        ``curvature_num``, ``curvature_den``, ``curvature_lr``, ``curvature_hvp_step``, ``curvature_hvp_rows`` to
        step t's noise record.

        Why the next step's fresh rows: a Hessian taken on one of xi's own halves shares samples with xi and adds a
        third-moment term E[e^T h e] / B that a policy gradient makes large (1.7x the exact kappa on the simulator's
        bandit under SGD); the next step's rows are independent of xi, its theta one update away. Why the
        score-reweighted on-policy gradient (ratio pi_theta' / pi_old): its derivative is the on-policy field's
        Jacobian, the H of the linearised dynamics, with the score cross terms between a completion's tokens that
        the loss's own Hessian on fixed rows lacks (2.7x off on the simulator's token MDP). Costs two
        forward+backward passes of R rows and two parameter-sized buffers; needs float32 parameters (bfloat16 rounds
        theta + h w back to theta) and no active dropout, else the pair is skipped and said (``curvature_skipped``).
        """
        self._curvature_pending = None  # ``pending``, measured now or skipped
        params = self._trainable()
        reason = self._curvature_blocker(params)
        if reason is not None:
            self._skip_curvature(f"step {pending['step']}: {reason}")
            return
        w = pending["w"]
        theta_norm = math.sqrt(float(sum((p.detach().double() ** 2).sum() for p in params)))  # IEEE sqrt, as torch's
        w_norm = math.sqrt(float(sum((x.double() ** 2).sum() for x in w)))
        if not w_norm > 0:
            self._skip_curvature(f"step {pending['step']}: xi = 0 (the halves' gradients are equal)")
            return
        h = self.curvature_step * theta_norm / w_norm
        num = self._central_difference(rows, params, w, h)
        record = next((r for r in reversed(self.noise_records) if r["step"] == pending["step"]), None)
        if record is None:
            return
        record.update({"curvature_num": num / (2 * h), "curvature_den": pending["den"],
                       "curvature_lr": pending["lr"], "curvature_beta1": pending["beta1"],
                       "curvature_hvp_step": int(self.state.global_step),
                       "curvature_hvp_rows": int(rows["completion_ids"].shape[0])})
        if pending["den"] > 0:  # one pair's kappa: a noisy monitor; calibrate --from-log pools the pairs
            self._metrics["train"]["noise/kappa_pair"].append(pending["lr"] * record["curvature_num"] / pending["den"])

    def _curvature_blocker(self, params: list[torch.Tensor]) -> str | None:
        """Why theta +- h w cannot be differenced here (None: it can): parameters below float32, active dropout."""
        if any(p.dtype not in (torch.float32, torch.float64) for p in params):
            return (f"parameters in {params[0].dtype}: theta +- h w rounds back to theta below float32 (train the "
                    "model in float32, or with float32 master weights)")
        dropout = [m for m in self._model().modules() if isinstance(m, torch.nn.Dropout) and m.training and m.p > 0]
        if dropout:
            return (f"dropout p = {dropout[0].p:g} is active: the two sides of the difference would see different "
                    "masks (GRPOConfig(disable_dropout=True))")
        return None

    def _central_difference(self, rows: dict[str, torch.Tensor], params: list[torch.Tensor],
                            w: list[torch.Tensor], h: float) -> float:
        """w . g(theta + h w) - w . g(theta - h w) on ``rows`` (``_curvature_grad``); the parameters restored bit for
        bit from a copy, the training's random streams never advanced."""
        saved = [p.detach().clone() for p in params]  # restored exactly: the update sees the same theta
        devices = sorted({p.device.index for p in params if p.device.type == "cuda"})
        num = 0.0
        try:
            with torch.random.fork_rng(devices=devices):
                for sign in (1.0, -1.0):
                    with torch.no_grad():
                        for p, s, x in zip(params, saved, w):
                            p.copy_(s + sign * h * x.to(p.dtype))
                    grads = self._curvature_grad(rows, params)
                    num += sign * sum(float((g.double() * x.double()).sum()) for g, x in zip(grads, w)
                                      if g is not None)
                    del grads
        finally:
            with torch.no_grad():
                for p, s in zip(params, saved):
                    p.copy_(s)
        return num

    def _curvature_grad(self, rows: dict[str, torch.Tensor], params: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """rho g_on of the fresh ``rows`` at the model's current parameters: the shared loss with the behaviour
        log-probs set to the current ones (ratio 1, the on-policy gradient) times each row's sequence ratio rho =
        pi_theta / pi_old (a constant weight), and TRL's vLLM ratio where there is one. Its derivative at pi_old is
        the on-policy field's Jacobian (score cross terms between tokens included, which the loss's own Hessian on
        fixed rows lacks: simulate/calibrate.py measures both). autograd.grad: nothing accumulates in ``.grad``."""
        ids = torch.cat([rows["prompt_ids"], rows["completion_ids"]], dim=1)
        attention = torch.cat([rows["prompt_mask"], rows["completion_mask"]], dim=1)
        logp = self._get_per_token_logps_and_entropies(self.model, ids, attention, rows["completion_ids"].size(1))[0]
        mask = (rows["completion_mask"] * rows["tool_mask"]).bool()
        current = logp.detach()
        rho = torch.exp(torch.where(mask, current - rows["old_per_token_logps"], 0.0).sum(dim=1))  # (R,)
        loss, _ = engine_corrected_loss(self.replay, logp, current, rows["advantages"], mask,
                                        is_ratio=rows.get("importance_sampling_ratio"), row_weight=rho)
        return list(torch.autograd.grad(loss, params, allow_unused=True))

    def _skip_curvature(self, reason: str) -> None:
        """A curvature pair that could not be formed: counted and said once per reason (never silently)."""
        first = reason.split(":", 1)[-1].strip()
        if first not in self.curvature_skipped:
            warnings.warn(f"curvature pair not measured at {reason}", stacklevel=2)
        self.curvature_skipped[first] = self.curvature_skipped.get(first, 0) + 1

    @torch.no_grad()
    def _record_lag(self, step: int) -> None:
        """The lag-1 products of successive full-batch gradients through a fixed random subset of ``lag_coords``
        coordinates (drawn once, seeded by ``args.seed``), scaled by P / k: ``lag1_dot_raw`` = g_t . g_{t-1} and
        ``lag1_sq_raw`` = |g_{t-1}|^2 on step t's noise record. Raw (unpreconditioned) coordinates: SGD's estimator
        (``theory.forgetting.kappa_from_gradient_series``: corr = -kappa / 2 on an on-policy run); under Adam the
        signal is ~ +0.4 kappa, the sign of the mean gradient's drift, and under replay the reused rows' noise adds
        C(1) > 0: use the curvature pairs there. A checkpoint keeps a pending w (``KAPPA_STATE``, safetensors) and the
        last subset (JSON), so a resumed run logs what an uninterrupted one logs."""
        record = self._noise_record_of(step)
        params = self._trainable()
        if self._lag_index is None:
            sizes = torch.tensor([p.numel() for p in params])
            total = int(sizes.sum())
            generator = torch.Generator().manual_seed(int(self.args.seed) + 7907)
            flat = torch.randint(0, total, (self.lag_coords,), generator=generator).sort().values
            which = torch.searchsorted(torch.cumsum(sizes, 0), flat, right=True)
            starts = torch.cumsum(sizes, 0) - sizes
            self._lag_index = [(i, (flat[which == i] - starts[i]).to(params[i].device))
                               for i in range(len(params)) if bool((which == i).any())]
            self._lag_scale = total / self.lag_coords
        scaler = getattr(self.accelerator, "scaler", None)
        scale = float(scaler.get_scale()) if scaler is not None else 1.0
        vec = torch.cat([(params[i].grad.reshape(-1)[idx] if params[i].grad is not None
                          else torch.zeros(len(idx), device=idx.device)).double().cpu() for i, idx in self._lag_index])
        vec = vec / scale
        previous, self._lag_previous = self._lag_previous, (step, vec)
        if record is not None and previous is not None and previous[0] == step - 1:
            record["lag1_dot_raw"] = self._lag_scale * float(vec @ previous[1])
            record["lag1_sq_raw"] = self._lag_scale * float(previous[1] @ previous[1])
            record["lag1_coords"] = self.lag_coords

    def _log_replay(self, inputs: dict[str, Any], logp_new: torch.Tensor, mask: torch.Tensor,
                    entropies: torch.Tensor, out: losses.LossOutput) -> None:
        """This step's metrics, through TRL's ``self._metrics`` (averaged by its ``log``).

        ``replay/staleness_mean``, ``replay/staleness_max``, ``replay/staleness_frac/age_*`` (buckets 0, 1, 2-3,
        4-7, ...), ``replay/replay_ratio`` (samples trained / fresh generated, cumulative; = B/R), ``replay/ess`` and
        ``replay/ess/age_*`` (Kish fraction of the SEQUENCE log-ratios: ``core.metrics``' ``step_metrics`` and
        ``ess_by_age``), ``replay/buffer_rows``, ``replay/buffer_max_age``, the loss's own metrics under
        ``replay/<name>``, for the PPO clip TRL's ``clip_ratio/*``, TRL's ``entropy``; the what-if flags
        ``replay/whatif/<correction>_<param>/flagged_frac`` and ``.../ess_frac`` of ``replay-theory diagnose``'s
        what-if table; and verl's, TRL's and M2PO's own statistics under their keys
        (``diagnose.framework_stats.framework_statistics``).
        """
        metrics = self._metrics["train"]
        step = self.state.global_step
        age = (step - inputs["version"]).cpu().numpy()  # (B,)
        token_lr = as_numpy(logp_new - inputs["old_per_token_logps"])[None]  # (1, B, L): one seed
        real_tok = as_numpy(mask).astype(bool)[None]  # (1, B, L)
        # the shared per-step metrics (core/metrics.py), logged under replay/; the loss's metrics carry the
        # token-level estimators already
        shared = step_metrics(token_lr, real_tok, age[None], {k: np.reshape(v, -1) for k, v in out.metrics.items()})
        metrics["replay/staleness_mean"].append(float(shared["staleness_mean"][0]))
        metrics["replay/staleness_max"].append(float(shared["staleness_max"][0]))
        metrics["replay/ess"].append(float(shared["ess_frac"][0]))
        seq_lr = sequence_log_ratio(token_lr, real_tok)[1]  # (1, B)
        buckets = age_buckets(max(self._fifo_max_age, int(age.max())))  # positive bias keeps older rows
        which = np.searchsorted([lo for lo, _, _ in buckets], age, side="right") - 1  # (B,) bucket of each row
        ess, count = ess_by_age(seq_lr, which[None], len(buckets))  # (1, K) each
        for b, (_, _, name) in enumerate(buckets):
            metrics[f"replay/staleness_frac/{name}"].append(float(count[0, b] / age.size))
            if count[0, b]:  # an empty bucket has no ESS; TRL's log averages the steps that have one
                metrics[f"replay/ess/{name}"].append(float(ess[0, b]))
        metrics["replay/replay_ratio"].append(self.replay_trained / max(self.replay_generated, 1))
        metrics["replay/buffer_rows"].append(float(len(self.replay_buffer)))
        stored_age = self.replay_buffer.ages(step) if len(self.replay_buffer) else torch.zeros(1)
        metrics["replay/buffer_max_age"].append(float(stored_age.max()))
        metrics["replay/loss"].append(float(out.loss[0]))
        if "importance_sampling_ratio" in inputs:  # the engine correction rho of the rows trained on (fresh and old)
            rho = inputs["importance_sampling_ratio"][mask]
            metrics["replay/vllm_is_ratio_mean"].append(float(rho.mean()))
            metrics["replay/vllm_is_masked_frac"].append(float((rho == 0).double().mean()))
        for key, value in out.metrics.items():
            name = key if key.startswith("clip_ratio/") else f"replay/{key}"  # TRL's names where TRL has them
            metrics[name].append(float(np.asarray(value).reshape(-1)[0]))
        real = mask.sum().clamp(min=1)
        metrics["entropy"].append(float((entropies.detach() * mask).sum() / real))
        self._log_whatif(metrics, token_lr[0], real_tok[0], as_numpy(inputs["advantages"]), seq_lr[0])
        # The statistics verl, TRL and M2PO log, under their keys, on the pair diagnose --preset trl reads (the
        # sampler's log-probs vs the policy being trained). clip_ratio/* name a clip TRL applied: only the PPO clip
        # loss logs them (above), so they are not repeated for a loss that does not clip.
        framework = framework_statistics(as_numpy(inputs["sampling_per_token_logps"]), as_numpy(logp_new),
                                         as_numpy(mask).astype(bool), as_numpy(inputs["advantages"]),
                                         clip_low=self.replay.eps_low, clip_high=self.replay.eps_high)
        for key, value in framework.items():
            if not key.startswith("clip_ratio/"):
                metrics[key].append(float(value))

    def _log_whatif(self, metrics, log_ratio: np.ndarray, mask: np.ndarray, advantages: np.ndarray,
                    seq_lr: np.ndarray) -> None:
        """diagnose's what-if table on this step's rows: what each other correction would flag, and its ESS.

        The same accumulators as ``replay-theory diagnose`` (diagnose/whatif.py), one step at a time; M2PO's mask
        acts on the whole step as one block (its reference code masks per micro-batch: here, the update).
        ``log_ratio``, ``mask`` (B, L); ``advantages`` (B,); ``seq_lr`` (B,) sequence log-ratios.
        """
        config = WhatIfConfig(m2po_batch_tokens=max(int(mask.sum()), 1))
        token = TokenWhatIf(config, has_advantage=True)
        token.update(log_ratio[mask], np.broadcast_to(advantages[:, None], mask.shape)[mask])
        for level, rows in (("token", token.rows()), ("sequence", sequence_rows(seq_lr, config))):
            for row in rows:
                if row["correction"] == "none" or row["flagged_frac"] is None:
                    continue
                params = row["param"] if isinstance(row["param"], (list, tuple)) else [row["param"]]  # asym clip: 2
                param = "_".join(p if isinstance(p, str) else f"{p:g}" for p in params)
                name = f"replay/whatif/{'seq_' if level == 'sequence' else ''}{row['correction']}_{param}"
                metrics[f"{name}/flagged_frac"].append(float(row["flagged_frac"]))
                if row["ess_frac"] is not None:  # the M2 trust-region row counts tokens, it weights none
                    metrics[f"{name}/ess_frac"].append(float(row["ess_frac"]))

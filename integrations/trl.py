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
:class:`ReplayGRPOTrainer` (here); vLLM's engine ratio, :func:`engine_corrected_loss` (trl_loss.py); the diagnose
log, :class:`DiagnoseLogCallback` (trl_log.py); the logged metrics, ``_log_replay`` (trl_metrics.py); the noise
scale's two halves, ``_loss_in_halves`` and ``_record_noise`` (trl_noise.py); kappa's curvature pairs,
``_start_curvature`` and ``_finish_curvature``, and the lag-1 products, ``_record_lag`` (trl_kappa.py); checkpoints
and resume, ``train`` (here; files: integrations/checkpoints.py). The trainer is those parts' mixins over TRL's
``GRPOTrainer``; every public name is importable from this module.

Buffer ``epochs`` (e epochs over m mini-batches of each generation of R, PPO's epochs) is TRL's own generation
buffering, not a buffer of ours: ``num_iterations`` = e, ``steps_per_generation`` = m, a mini-batch of B = R / m
(``trl_epochs``). TRL 1.16's ``_prepare_inputs`` generates every m e updates, shuffles the generation once
(``shuffle_sequence_dict``) and trains update j on slice j mod m of that one order: a row is used e times, m updates
apart, at ages 0 .. e m - 1 (``core.buffers.EpochSchedule`` with ``shuffle=False``). The rows carry our fields
(version, ids, rewards, the behaviour log-probs) from ``_generate_and_score_completions``, so the loss, metrics and
diagnose log are the replay step's.

Buffer ``stale-k`` (k-step-off, M2PO Sec. 3; ``core.buffers.StaleKQueue``, the simulator's and the validator's
queue) trains each update on the whole generation of k updates earlier, once, with the loss's importance ratio
against the behaviour log-probs stored with the rows; updates 0..k-1 train the base model's k generations, made at
step 0 from that step's prompts. TRL 1.16's GRPOTrainer generates in the update's own step, so the queue gives the
staleness's statistics and its cost in reward, not the wall time that an overlapped trainer (TRL's
``experimental.async_grpo``, verl's one-step-off) buys with it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from transformers import TrainerCallback
from trl import GRPOConfig  # pyright: ignore[reportPrivateImportUsage]  # trl's lazy __init__ exports it
from trl.trainer.utils import RepeatSampler

from .. import __version__
from ..checks import require_one_of
from .buffer import ReplayConfig, RowReplayBuffer, fifo_max_age
from .checkpoints import CHECKPOINT_DONE, CHECKPOINT_PREFIX, REPLAY_BUFFER_STATE, REPLAY_STATE, complete_checkpoints
from .loss import shared_loss, shared_loss_tensor
from .trl_drift import DRIFT_SAMPLES, DriftProbe
from .trl_drift import STATE_FILE as DRIFT_STATE
from .trl_kappa import (
    CURVATURE_FD_STEP,
    DEFAULT_CURVATURE_EVERY,
    DEFAULT_LAG_COORDS,
    KAPPA_STATE,
    KappaMixin,
    noise_options,
)
from .trl_log import DiagnoseLogCallback
from .trl_loss import VLLM_IS_MODES, engine_corrected_loss, replay_grpo_args, trl_epochs
from .trl_metrics import ReplayMetricsMixin
from .trl_noise import noise_halves

# the public names stay importable from here (docs and users: ``from replay_theory.integrations.trl import ...``),
# wherever they are defined
__all__ = ["CURVATURE_FD_STEP", "DEFAULT_CURVATURE_EVERY", "DEFAULT_LAG_COORDS", "DiagnoseLogCallback", "KAPPA_STATE",
           "ReplayConfig", "ReplayGRPOTrainer", "VLLM_IS_MODES", "engine_corrected_loss", "loaded_through_a_tie",
           "noise_halves", "replay_grpo_args", "shared_loss", "shared_loss_tensor"]

#: Fields of TRL's generation output that are kept per row in the buffer (the rest is recomputed or unused).
_BUFFERED = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask",
             "old_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio", "advantages")

#: TRL's own running counters that a checkpoint does not keep (GRPOTrainer.__init__): its step count and the
#: train tokens seen, logged as num_tokens.
_TRL_COUNTERS = ("_step", "_total_train_tokens")


class _FinishCallback(TrainerCallback):
    """Calls the trainer's ``_finish`` when training reaches ``max_steps`` (not on a stop before it)."""

    def __init__(self, trainer: "ReplayGRPOTrainer") -> None:
        self.trainer = trainer

    def on_train_end(self, args, state, control, **kwargs):  # noqa: D102 (TrainerCallback hook)
        if state.global_step >= state.max_steps:
            self.trainer._finish()


def _epoch_schedule(replay: ReplayConfig) -> tuple[int, int] | None:
    """(e, m) of buffer epochs, None for a buffer of ours."""
    return (replay.shared.epochs, replay.shared.mini_batches) if replay.buffer == "epochs" else None


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


class ReplayGRPOTrainer(KappaMixin, ReplayMetricsMixin):
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

    ``drift_log``: a new Parquet path; ``drift_samples`` rollouts of each step's generation are kept (the steps 1, 2,
    4, ..., 64 before the end and the first) and, when training reaches ``max_steps``, re-scored at the last policy
    and written there by age (``integrations/trl_drift.py``): the drift M2(s) that ``calibrate --from-log LOG --drift
    DRIFT`` turns into the staleness cost ``optimal --profile`` prices, for one forward pass over ``drift_samples``
    rollouts an age.

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
                 lag_coords: int | None = None, drift_log: str | os.PathLike | None = None,
                 drift_samples: int = DRIFT_SAMPLES, **kwargs: Any) -> None:
        curvature_every, lag_coords = noise_options(measure_noise, noise_log, curvature_every, curvature_step,
                                                    lag_coords)
        log_callback = DiagnoseLogCallback(diagnose_log) if diagnose_log is not None else None  # checked first
        self.drift_probe = DriftProbe(drift_log, drift_samples) if drift_log is not None else None  # so is this
        super().__init__(*args, **kwargs)
        if log_callback is not None:
            self.add_callback(log_callback)
        self.add_callback(_FinishCallback(self))
        self._resume_step = 0  # the checkpoint's step when resuming: TRL's sampler is advanced to its epoch
        self.epoch_schedule = _epoch_schedule(replay)  # (e, m): TRL's own buffering runs the design, no buffer of ours
        self._check_trl_args(replay)
        self.replay = replay
        group_size = self.num_generations
        assert group_size is not None  # GRPOConfig refuses None (its num_generations < 2 check)
        design = replay.design_config(group_size).validated_design()  # with G: the registry's whole rules
        self.replay_buffer = None if self.epoch_schedule else RowReplayBuffer(design, seed=replay.seed,
                                                                      total_steps=max(int(self.args.max_steps), 1))
        self.replay_generated = 0  # fresh completions generated for training (epochs: the next row's sample id)
        self.replay_trained = 0  # completions trained on (with repetition)
        self._fifo_max_age = (self.epoch_schedule[0] * self.epoch_schedule[1] - 1 if self.epoch_schedule
                              else replay.shared.stale_k if replay.buffer == "stale-k"
                              else fifo_max_age(replay.capacity, replay.rollouts_per_step))
        self._last_rewards_per_func: torch.Tensor | None = None
        self._step_generation_seconds = 0.0  # wall seconds this step spent in TRL's generation (for the log)
        self._step_generated_rows = 0
        self._step_refill_rounds: float | None = None  # buffer dynamic: the generation rounds this step took
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
        self.drift_report: dict | None = None  # what the drift log holds, once written (``DriftProbe.write``)

    def _check_trl_args(self, replay: ReplayConfig) -> None:
        """TRL's arguments the replay step supports: one process, one generation and one pass per step, R rows a
        step (buffer epochs: TRL's m mini-batches of B = R / m and e passes, ``trl_epochs``), no KL term, a vLLM
        importance-sampling mode the shared losses apply."""
        a = cast(GRPOConfig, self.args)  # GRPOTrainer's args are a GRPOConfig (Trainer types them as its base)
        world = self.accelerator.num_processes
        want = {"per_device_train_batch_size": replay.rollouts_per_step, "steps_per_generation": 1,
                "num_iterations": 1} | trl_epochs(replay)
        why = (f" (buffer epochs: B = {replay.batch_size}, m = {want['steps_per_generation']}, "
               f"e = {want['num_iterations']}; replay_grpo_args sets them)" if self.epoch_schedule else
               f" (rollouts_per_step = {replay.rollouts_per_step})")
        checks = [
            (world == 1, f"one process is supported (the buffer is per process), got {world}"),
            *((value == want[name], f"{name} must be {want[name]}{why}, got {value}")
              for name, value in (("steps_per_generation", a.steps_per_generation),
                                  ("num_iterations", self.num_iterations),
                                  ("per_device_train_batch_size", a.per_device_train_batch_size))),
            (a.gradient_accumulation_steps == 1,
             f"gradient_accumulation_steps must be 1, got {a.gradient_accumulation_steps}"),
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
        if self.epoch_schedule and self.state.global_step % (self.epoch_schedule[0] * self.epoch_schedule[1]):
            return  # buffer epochs mid-generation: TRL holds the generation in memory only; the last one stays
        super()._save_checkpoint(model, trial)  # model, optimizer, scheduler, RNG states, trainer_state.json
        run_dir = Path(self._get_output_dir(trial=trial))
        folder = run_dir / f"{CHECKPOINT_PREFIX}{self.state.global_step}"
        log = self._diagnose_callback()
        if self.replay_buffer is not None:  # buffer epochs: saved at a generation's start only, nothing held
            self.replay_buffer.save_state(folder / REPLAY_BUFFER_STATE)
        if self.drift_probe is not None:
            self.drift_probe.save_state(folder / DRIFT_STATE)
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
            self._check_epoch_resume(int(state["global_step"]))
            if self.replay_buffer is not None:
                self.replay_buffer.load_state(folder / REPLAY_BUFFER_STATE)
            self.replay_generated, self.replay_trained = state["replay_generated"], state["replay_trained"]
            self.noise_records = state["noise_records"]
            for name, value in state["trl"].items():
                setattr(self, name, value)
            self._resume_step = int(state["global_step"])
            self._load_kappa_state(folder, state.get("kappa"))
            if self.drift_probe is not None:
                self.drift_probe.load_state(folder / DRIFT_STATE)
            if log is not None:
                log.start(state["diagnose_parts"] or [])
        elif log is not None:
            log.start(None)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial,
                             ignore_keys_for_eval=ignore_keys_for_eval, **kwargs)

    def _check_epoch_resume(self, step: int) -> None:
        """Buffer epochs resumes at a generation's start only: TRL keeps the generation in memory (its
        ``_buffered_inputs``, not in a checkpoint) and would generate a new one mid-way."""
        if self.epoch_schedule and step % (self.epoch_schedule[0] * self.epoch_schedule[1]):
            e, m = self.epoch_schedule
            raise ValueError(f"buffer epochs resumes only from a checkpoint at a generation's start (a multiple of "
                             f"e m = {e * m} steps), got step {step}: TRL keeps the generation in memory only")

    def _get_train_sampler(self, dataset=None):  # noqa: D102 (TRL's RepeatSampler, advanced when resuming)
        sampler = cast(RepeatSampler, super()._get_train_sampler(dataset))  # what GRPOTrainer's returns
        generator = getattr(sampler, "generator", None)
        if self._resume_step and generator is not None:
            # Trainer makes the sampler afresh (seeded) and skips only the resumed epoch's first batches: the
            # epochs before it drew one permutation each from the generator, drawn again here
            # batches (steps) per epoch, as Trainer counts: each generation batch is repeated e m times (epochs)
            per_epoch = sampler.num_samples // sampler.batch_size * sampler.repeat_count
            for _ in range(self._resume_step // max(per_epoch, 1)):
                torch.randperm(sampler.num_samples, generator=generator)
        return sampler

    def _finish(self) -> None:
        """The last step is done: the drift log (the kept rollouts re-scored at the last policy) and the noise log,
        each whole (the checkpoints held their rows and lines until now)."""
        if self.drift_probe is not None:
            self.drift_report = self.drift_probe.write(int(self.state.global_step), self._rescore)
        if self.noise_log is not None and self.noise_records:
            from ..outputs import write_new

            self.noise_log.parent.mkdir(parents=True, exist_ok=True)
            lines = "".join(json.dumps({**r, "unit_size": self.num_generations}) + "\n" for r in self.noise_records)
            write_new(self.noise_log, lambda tmp: tmp.write_text(lines), option="noise log")

    @torch.no_grad()
    def _rescore(self, rows: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-token log-probs (n, L) of kept rows at the current policy: one forward pass, TRL's own."""
        device = self.accelerator.device
        ids = torch.cat([rows["prompt_ids"], rows["completion_ids"]], dim=1).to(device)
        attention = torch.cat([rows["prompt_mask"], rows["completion_mask"]], dim=1).to(device)
        out = self._get_per_token_logps_and_entropies(self.model, ids, attention, rows["completion_ids"].size(1),
                                                      batch_size=self.args.per_device_train_batch_size)
        return out[0]

    # ------------------------------------------------------------------ generation -> buffer -> draw

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # noqa: D102 (TRL internal)
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func  # (rows, reward funcs); TRL does not return per-row rewards
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:  # noqa: D102 (TRL internal)
        if not (self.epoch_schedule and self._model().training):
            return super()._generate_and_score_completions(inputs)
        # buffer epochs: TRL's _prepare_inputs buffers what this returns (shuffled once, sliced in m): the rows
        # with our fields, every one with the row as dim 0 so TRL's shuffle and slices keep them aligned
        started = time.perf_counter()
        rows = self.fresh_rows(super()._generate_and_score_completions(inputs))
        self._step_generation_seconds += time.perf_counter() - started
        n = int(rows["completion_ids"].shape[0])
        device = rows["completion_ids"].device
        rows["version"] = torch.full((n,), int(self.state.global_step), dtype=torch.long, device=device)
        rows["sample_id"] = torch.arange(n, device=device) + self.replay_generated
        rows["group_id"] = rows["sample_id"] // self.num_generations
        rows["sampler_weight"] = torch.ones(n, dtype=torch.float64)
        self.replay_generated += n
        self._step_generated_rows = n
        if self.drift_probe is not None:
            self.drift_probe.keep(int(self.state.global_step), rows)
        if self._curvature_pending is not None:  # kappa's H w on rows xi's halves never held
            self._finish_curvature(self._curvature_pending, rows)
        return rows

    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        if not self._model().training:
            return super()._prepare_inputs(generation_batch)
        if self.epoch_schedule:  # TRL's own: a generation every e m updates, update j on slice j mod m of its one order
            self._step_generation_seconds, self._step_generated_rows = 0.0, 0
            inputs = super()._prepare_inputs(generation_batch)
            self.replay_trained += int(inputs["version"].shape[0])
            return inputs
        # The design's batch step decides whether to generate (FreshPER Algorithm 1's replay updates do not),
        # what to keep and what to draw; TRL's generation runs only when it asks.
        self._step_generation_seconds = 0.0

        fresh: list[dict[str, torch.Tensor]] = []
        step = int(self.state.global_step)

        def generate() -> dict[str, torch.Tensor]:
            started = time.perf_counter()
            prompts = generation_batch if not fresh else self._refill_prompts(step, len(fresh), len(generation_batch))
            rows = self.fresh_rows(self._generate_and_score_completions(prompts))
            self._step_generation_seconds += time.perf_counter() - started
            fresh.append(rows)
            return rows

        assert self.replay_buffer is not None  # every buffer but epochs (returned above)
        drawn, data = self.replay_buffer.step(step, generate)
        self._step_refill_rounds = float(data.curves["refill_rounds"][0]) if "refill_rounds" in data.curves else None
        if self._curvature_pending is not None and fresh:  # kappa's H w on rows xi's halves never held
            self._finish_curvature(self._curvature_pending, fresh[0])
        if self.drift_probe is not None and fresh:
            self.drift_probe.keep(step, fresh[0])
        self._step_generated_rows = int(np.sum(data.generated))
        self.replay_generated += self._step_generated_rows
        self.replay_trained += int(data.train.size)
        return drawn

    def _refill_prompts(self, step: int, round_: int, rows: int) -> list[dict[str, Any]]:
        """A dynamic-sampling refill round's generation batch: ``rows`` / G prompts drawn uniformly from the train
        dataset, each repeated G times as TRL's RepeatSampler lays them out. Drawn from a stream of their own
        (seeded by the replay seed, the step and the round, so a resumed run draws the same), not TRL's sampler,
        whose next batch belongs to the next step: verl's DAPO loop takes the refill from its dataloader instead;
        both are uniform over the prompts."""
        groups = rows // self.num_generations
        rng = np.random.default_rng([int(self.replay.seed), step, round_])
        index = rng.integers(0, len(self.train_dataset), size=groups)  # (g,) prompt rows
        return [self.train_dataset[int(i)] for i in index for _ in range(self.num_generations)]

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

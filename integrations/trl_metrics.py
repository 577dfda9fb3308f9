"""What a TRL replay trainer logs each step: staleness, ESS by age, the loss's metrics, the what-if flags.

Paper: experience-replay (docs/REFERENCES.md), Sec. 3: age s = step - version (staleness, 0 .. ceil(N/R) - 1),
replay ratio y = B/R (``replay/replay_ratio``); the ESS is the Kish fraction of the sequence log-ratios
log(pi_theta / pi_behav) (core/metrics.py). :class:`ReplayMetricsMixin` is a part of integrations/trl.py's
``ReplayGRPOTrainer``: the state it reads (``replay_buffer``, ``replay_trained``, ...) is set by that trainer's
``__init__``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from trl import GRPOTrainer  # pyright: ignore[reportPrivateImportUsage]  # trl's lazy __init__ exports it

from ..core import losses
from ..core.metrics import ess_by_age, sequence_log_ratio, step_metrics
from ..diagnose.framework_stats import framework_statistics
from ..diagnose.whatif import TokenWhatIf, WhatIfConfig, sequence_rows
from .buffer import ReplayConfig, RowReplayBuffer, age_buckets
from .loss import as_numpy


class ReplayMetricsMixin(GRPOTrainer):
    """The logging part of ``ReplayGRPOTrainer``: this step's metrics into TRL's ``self._metrics``."""

    replay: ReplayConfig
    replay_buffer: RowReplayBuffer | None  # None: buffer epochs, TRL's own generation buffer
    replay_generated: int
    replay_trained: int
    _fifo_max_age: int
    _step_refill_rounds: float | None

    def _log_replay(self, inputs: dict[str, Any], logp_new: torch.Tensor, mask: torch.Tensor,
                    entropies: torch.Tensor, out: losses.LossOutput) -> None:
        """This step's metrics, through TRL's ``self._metrics`` (averaged by its ``log``).

        ``replay/staleness_mean``, ``replay/staleness_max``, ``replay/staleness_frac/age_*`` (buckets 0, 1, 2-3,
        4-7, ...), ``replay/replay_ratio`` (samples trained / fresh generated, cumulative; = B/R), ``replay/ess`` and
        ``replay/ess/age_*`` (Kish fraction of the SEQUENCE log-ratios: ``core.metrics``' ``step_metrics`` and
        ``ess_by_age``), ``replay/buffer_rows``, ``replay/buffer_max_age``, ``replay/refill_rounds`` (buffer
        dynamic: the generation batches the step took), the loss's own metrics under
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
        stored_age = self._stored_ages(step)
        metrics["replay/buffer_rows"].append(float(stored_age.numel()))
        metrics["replay/buffer_max_age"].append(float(stored_age.max()) if stored_age.numel() else 0.0)
        metrics["replay/loss"].append(float(out.loss[0]))
        if self._step_refill_rounds is not None:  # buffer dynamic: generation batches this step took ([E11]'s T)
            metrics["replay/refill_rounds"].append(self._step_refill_rounds)
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

    def _stored_ages(self, step: int) -> torch.Tensor:
        """Ages at ``step`` of the rows held for later updates: the replay buffer's, or (buffer epochs) those of
        TRL's buffered generation (``_buffered_inputs``, its m slices)."""
        if self.replay_buffer is not None:
            return self.replay_buffer.ages(step) if len(self.replay_buffer) else torch.zeros(0)
        held = [part["version"] for part in (self._buffered_inputs or [])]
        return step - torch.cat(held) if held else torch.zeros(0)

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

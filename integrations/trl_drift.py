"""The drift of a TRL run's policy with age: rollouts of past steps re-scored at the last policy (issue 38).

The forgetting rule prices a sample of age s at r(s) = 1 + M2(s), M2(s) = E_{pi_{T-s}}[(log pi_T / pi_{T-s})^2]
(M2PO's statistic; ``theory.forgetting.staleness_of_drift``). An on-policy run trains every rollout at age 0, so its
log says nothing about older ones. This probe keeps ``samples`` rollouts of each step's generation (their tokens and
the log-probs the trainer computed at generation, ``old_per_token_logps``) for the steps the drift table needs
(``theory.forgetting.drift_ages``: 1, 2, 4, ..., 64 and the run's first), and when the run reaches ``max_steps``
re-scores them with one forward pass at the last policy T, writing one ``diagnose --preset trl`` row per rollout with
its age s = T - v. ``replay-theory diagnose DRIFT --preset trl`` prints M2 by age; ``calibrate --from-log LOG --drift
DRIFT`` puts the table in the profile ``optimal --profile`` reads. The benchmark's printed answer is priced the same
way (``experiments/theory_bench/measure.py::measure_recipe_log``: ``RESCORE_SAMPLES`` = 64 rollouts an age, each
forward pass counted).

Columns of the file: ``integrations/export.py`` (TRL_LOG_COLUMNS), with ``per_token_logps`` at T and
``sampling_per_token_logps`` = ``old_per_token_logps`` (the policy's own log-probs at generation: the ratio is the
policy's drift alone, not a vLLM sampler's mismatch, which ``diagnose`` of the training log shows at age 0).

| code name     | symbol | meaning                                                    |
|---------------|--------|------------------------------------------------------------|
| ``version``   | v      | optimizer steps done when the rollouts were generated     |
| ``last_step`` | T      | the run's last policy (global_step at the end)            |
| ``age``       | s      | T - v                                                      |
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..theory.forgetting import DRIFT_AGES, drift_ages
from .export import DiagnoseLogWriter, require_pyarrow

DRIFT_SAMPLES = 64
"""Rollouts kept per step and re-scored per age: a quarter of the benchmark's batch (``RESCORE_SAMPLES``)."""
KEPT = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask", "old_per_token_logps",
        "advantages", "rewards")
"""The fields of a generation's rows the probe keeps (every push of the replay trainer carries them)."""
STATE_FILE = "drift_probe.npz"
"""The probe's rows in a checkpoint (numpy arrays, read with allow_pickle=False), so a resumed run re-scores the
same rollouts as an uninterrupted one."""


class DriftProbe:
    """The rollouts of recent steps (and of the first), kept to be re-scored at the run's last policy.

    ``path``: the new Parquet file written at the end (checked now: never overwritten); ``samples``: rollouts kept
    a step (whole rows in generation order, so whole groups when ``samples`` is a multiple of the group size).
    """

    def __init__(self, path: str | os.PathLike, samples: int = DRIFT_SAMPLES) -> None:
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"drift_samples must be an integer >= 1, got {samples!r}")
        self.path = Path(path)
        if self.path.exists():
            raise ValueError(f"drift log {self.path} exists: a log is never overwritten, give a new path")
        require_pyarrow()
        self.samples = samples
        self.rows: dict[int, dict[str, torch.Tensor]] = {}  # version v -> its kept rows, each (n, ...) on the CPU

    def keep(self, version: int, rows: dict[str, torch.Tensor]) -> None:
        """Hold the first ``samples`` rows of the generation at ``version`` (the first generation of a step only),
        and drop the versions no table will reach: older than the table's oldest age from now, but the first."""
        version = int(version)
        if version not in self.rows:
            n = min(self.samples, int(rows["completion_ids"].shape[0]))
            self.rows[version] = {k: rows[k][:n].detach().cpu().clone() for k in KEPT if k in rows}
        oldest = version - max(DRIFT_AGES)
        for v in [v for v in self.rows if 0 < v < oldest]:  # version 0 stays: the table's age T
            del self.rows[v]

    def plan(self, last_step: int) -> tuple[list[int], list[int]]:
        """(ages re-scored, ages of the table with no generation kept: a step that only replayed, or epochs' steps
        between generations) for a run whose last policy is ``last_step``."""
        wanted = [s for s in drift_ages(last_step) if s > 0]
        return ([s for s in wanted if last_step - s in self.rows],
                [s for s in wanted if last_step - s not in self.rows])

    def write(self, last_step: int, logps: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> dict:
        """Re-score the kept rows of each age at the last policy (``logps(rows)``: (n, L) per-token log-probs, no
        gradient) and write the file whole; returns {"ages", "missing", "rows"}. Nothing is written without an age."""
        from ..outputs import write_new

        ages, missing = self.plan(last_step)
        if not ages:
            return {"ages": [], "missing": missing, "rows": 0}
        scored = {s: logps(self.rows[last_step - s]).detach().cpu() for s in ages}  # before the file is opened

        def fill(tmp: Path) -> None:
            tmp.unlink()  # DiagnoseLogWriter creates its file exclusively
            writer = DiagnoseLogWriter(tmp)
            for s in ages:
                rows, n = self.rows[last_step - s], int(scored[s].shape[0])
                tool = rows.get("tool_mask", torch.ones_like(rows["completion_mask"]))
                writer.write({"step": torch.full((n,), last_step, dtype=torch.long),
                              "policy_version": torch.full((n,), last_step - s, dtype=torch.long),
                              "age": torch.full((n,), s, dtype=torch.long),
                              "advantages": rows["advantages"], "rewards": rows["rewards"],
                              "per_token_logps": scored[s], "old_per_token_logps": rows["old_per_token_logps"],
                              "sampling_per_token_logps": rows["old_per_token_logps"],
                              "completion_mask": rows["completion_mask"], "tool_mask": tool})
            writer.close()

        write_new(self.path, fill, option="drift log")
        return {"ages": ages, "missing": missing, "rows": sum(int(scored[s].shape[0]) for s in ages)}

    # ------------------------------------------------------------------ checkpoints

    def save_state(self, path: Path) -> None:
        """The kept rows as plain arrays (``v{version}.{field}``)."""
        arrays = {f"v{v}.{k}": t.numpy() if t.dtype != torch.bfloat16 else t.double().numpy()
                  for v, rows in self.rows.items() for k, t in rows.items()}
        with open(path, "wb") as handle:
            np.savez(handle, **arrays)

    def load_state(self, path: Path) -> None:
        """The rows a checkpoint kept (a checkpoint without the file: a run started without the probe keeps none)."""
        self.rows = {}
        if not path.is_file():
            return
        with np.load(path, allow_pickle=False) as data:
            for key in data.files:
                version, field = key[1:].split(".", 1)
                self.rows.setdefault(int(version), {})[field] = torch.from_numpy(data[key].copy())

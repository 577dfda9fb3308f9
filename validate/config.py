"""The validation run's one typed config, and the checks the command line runs before any work.

Paper: experience-replay (docs/REFERENCES.md), Thm 3.5 checked on a language model. Light on purpose
(numpy and the Countdown task only): the command line reads the defaults and checks ``--out`` from
here without importing torch; ``validate/loop.py`` does the work.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from replay_theory.outputs import check_out_dir
from replay_theory.validate import countdown


@dataclass(frozen=True)
class ValidateConfig:
    """The validation run. Field docs are the CLI help."""

    model: str = "tiny"
    """'tiny' (a small Qwen2 built from its config) or a local checkpoint path / hub id."""
    device: str = "cpu"
    """cpu or cuda."""
    seed: int = 0
    n_train: int = 1000
    """Training problems (Countdown, seeded)."""
    n_test: int = 64
    """Held-out problems."""
    sft_steps: int = 600
    """SFT warm-start steps on solver solutions (tiny model only)."""
    rollouts_per_step: int = 64
    """R of the probe run and of the concrete advice."""
    group_size: int = 8
    probe_steps: int = 24
    """RL steps of the calibration probe (FIFO buffer, GRPO)."""
    samples: int = 64
    """Completions per staleness value when measuring sigma^2(s)."""
    max_new_tokens: int = 16
    lr: float = 3e-4
    engine: str = "hf"
    """Rollout engine: hf (any device), vllm (CUDA) or auto (vllm when installed, on CUDA)."""
    sync_every: int = 1
    """Updates between weight syncs trainer -> rollout engine."""
    micro_batch_size: int = 0
    """Completions per forward/backward pass of an update (0: whole batch)."""
    gpu_memory_utilization: float = 0.3
    """vLLM only: its share of the GPU (weights + KV cache); the trainer uses the rest."""
    mu_window_seconds: float = 3.0
    """Wall-clock window of the App. E count-based mu in calibrate (0: skip)."""

    def problems(self) -> tuple[list[countdown.Problem], list[countdown.Problem]]:
        """Three-number problems with small numbers: learnable by the tiny model (pass@1 ~ 0.2 after SFT)."""
        return countdown.make_splits(self.n_train, self.n_test, seed=self.seed, num_numbers=(3,),
                                     number_range=(1, 9), target_range=(1, 40))


TINY_MODEL = dict(hidden_size=96, num_layers=3, num_heads=4, num_kv_heads=2, intermediate_size=192)

VERIFY_SEEDS = 4
"""Seeds per design in verify (CLI default of ``validate verify`` and ``validate all``)."""
VERIFY_BUDGET_UPDATES = 48
"""verify's equal-compute budget, in on-policy updates (CLI default of ``validate verify`` and ``validate all``)."""


def load_run_config(out_dir: Path, **overrides) -> ValidateConfig:
    """The config calibrate ran with (``calibration_summary.json``), with ``overrides`` (None = keep).

    predict and verify read it so that a standalone ``validate verify --out DIR`` trains with the
    sizes, learning rate and engine of the calibration instead of the defaults.
    """
    summary = Path(out_dir) / "calibration_summary.json"
    saved = json.loads(summary.read_text()).get("config", {}) if summary.exists() else {}
    known = {f.name for f in dataclasses.fields(ValidateConfig)}
    values = {k: v for k, v in saved.items() if k in known}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return ValidateConfig(**values)


def check_run_dir(out_dir: Path, needs: str | None = None) -> None:
    """``--out`` names a run directory (existing or not), never a file; ``needs``: a file it must hold."""
    out_dir = check_out_dir(out_dir)
    if needs is not None and not (out_dir / needs).exists():
        step = {"calibration.json": "calibrate", "predicted.json": "predict"}[needs]
        raise ValueError(f"{str(out_dir)!r} has no {needs}: run `replay-theory validate "
                         f"{'calibrate-model' if step == 'calibrate' else step} --out {out_dir}` first")

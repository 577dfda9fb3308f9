"""What bench/gpu_check.py and its workers share: the section names, the model shapes, the plan sent to the
workers as JSON, and the two small helpers (one-line errors, atomic JSON).  See bench/gpu_check.py."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Section names in report order, and the order they run in (5 compiles: last, it takes what is left).
SECTIONS = ("environment", "validate_all", "batched_verify", "mu", "decode", "logprob_mismatch", "verdict")
RUN_ORDER = ("environment", "validate_all", "batched_verify", "verdict", "mu", "logprob_mismatch", "decode")
TITLES = {
    "environment": "1. Environment",
    "validate_all": "2. validate all --device cuda (defaults), end to end",
    "batched_verify": "3. Batched vs sequential verify-style training",
    "mu": "4. mu of the validator's loop at real shapes (random weights)",
    "decode": "5. Decode speed: the validator's loop against transformers' compiled generate",
    "logprob_mismatch": "6. bf16 sampler-vs-trainer log-prob mismatch",
    "verdict": "7. The fixed-B verdict where replay should win (validate all --preset gpu-fixed-b)",
}
WORKER_SECTIONS = ("mu", "decode", "logprob_mismatch")  # sections that run in a worker subprocess


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Shape:
    """A Qwen2 architecture: what ``transformers.Qwen2Config`` needs for timing (weights are random)."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int


QWEN25_05B = Shape("Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151936)  # config.json of Qwen/Qwen2.5-0.5B
QWEN25_15B = Shape("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936)  # config.json of Qwen/Qwen2.5-1.5B
SMOKE_SHAPE = Shape("smoke-64", 64, 2, 4, 2, 128, 1000)


@dataclass(frozen=True)
class Plan:
    """Everything a section needs, derived from the config (GPU or smoke sizes); sent to the workers as JSON."""

    out: str
    smoke: bool
    device: str
    threads: int
    rollouts: int  # R
    group_size: int  # G
    shapes: tuple[Shape, ...]  # section 4: each shape at each length
    lengths: tuple[int, ...]  # section 4: completion lengths L
    tokens_per_micro_batch: int  # section 4: update chunk = max(1, this // L) completions (<= R)
    decode_tokens: int  # section 5: L
    mismatch_tokens: int  # section 6: L
    batched_seeds: int  # section 3
    batched_steps: int  # section 3
    validate_args: tuple[str, ...]  # section 2: arguments after `validate all --out DIR`
    verdict_args: tuple[str, ...]  # section 7: arguments after `validate all --out DIR` (the preset and its sizes)
    verdict_large_args: tuple[str, ...]  # section 7's second case (B = 16384 on the GPU), appended to verdict_args
    compile_backend: str  # torch.compile backend of the validator's decoder in sections 4-6 (smoke: eager)
    kappa: float | None = None  # section 7: --kappa (None: not given)
    budgets: dict[str, float] = field(default_factory=dict)  # section -> at most this many seconds
    min_start: dict[str, float] = field(default_factory=dict)  # section -> skip when fewer seconds are left
    min_case_s: float = 10.0  # a worker starts no case with fewer seconds left



# --------------------------------------------------------------------------- small helpers


def one_line(err: BaseException | str, limit: int = 300) -> str:
    """An exception as one line: its type and message, whitespace collapsed, cut at ``limit`` characters."""
    text = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def write_json(path: Path, data: Any) -> None:
    """Atomic: a reader (or a kill mid-write) never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)

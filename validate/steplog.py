"""Per-step metric logs of validation runs: JSON lines always, TensorBoard when it is installed."""

from __future__ import annotations

import json
import math
from pathlib import Path


class StepLog:
    """Appends one JSON object per step to ``path``; mirrors scalars to TensorBoard if available.

    Used as the ``progress`` callback of ``validate.rl.train``: ``log(step, metrics)``.
    """

    def __init__(self, path: Path, tensorboard_dir: Path | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.writer = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
            except ImportError:
                self.writer = None
            else:
                self.writer = SummaryWriter(str(tensorboard_dir))

    def __call__(self, step: int, metrics: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        with self.path.open("a") as handle:
            handle.write(json.dumps(clean) + "\n")
        if self.writer is not None:
            for name, value in metrics.items():
                if isinstance(value, (int, float)) and name != "step" and math.isfinite(value):
                    self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def truncate_log(path: Path, next_step: int) -> None:
    """Keep only the lines of steps before ``next_step`` (a resumed run logs the later steps again)."""
    path = Path(path)
    if path.exists():
        kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] < next_step]
        path.write_text("".join(line + "\n" for line in kept))


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]

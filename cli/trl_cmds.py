"""``replay-theory trl-replay``: TRL's GRPO trainer with a replay buffer sized by the theory, in one command.

Paper: experience-replay (docs/REFERENCES.md), Sec. 3 (N, B, R). Options are the fields of ``TrlRunConfig``
(integrations/trl_run.py), their help the field docstrings; every value is checked before any work or file. It
needs the trl extra (TRL, transformers, torch, datasets), imported when the command runs, so this module loads
without them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Any

import typer

from replay_theory.cli.config_options import with_dataclass_options
from replay_theory.integrations.trl_run import TrlRunConfig, check_out_dir

OutOption = Annotated[Path, typer.Option(
    "--out", help="New (or empty) run directory: rollouts.parquet, run.json, noise_scale.jsonl, noise_profile.json.")]
NoProgressOption = Annotated[bool, typer.Option("--no-progress", help="Hide the progress bars (stderr).")]


def register(app: typer.Typer) -> None:
    app.command("trl-replay")(trl_replay)


@with_dataclass_options(TrlRunConfig)
def trl_replay(fields: dict[str, Any], out: OutOption, no_progress: NoProgressOption = False) -> None:
    """Run TRL's GRPOTrainer with the replay buffer (N, B, R from --design or by hand) on Countdown; writes the
    diagnose log that `diagnose --preset trl` and `calibrate --from-log` read, and the gradient noise scale B_noise
    (two batch sizes a step, no extra backward pass)."""
    config = TrlRunConfig(**fields).validated()
    check_out_dir(out)
    missing = [m for m in ("trl", "datasets", "torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"trl-replay needs {', '.join(missing)}: pip install torch==2.13.0 && "
                         "pip install 'replay-theory[trl]'")
    from replay_theory.integrations.trl_run import run

    run(config, out, log=typer.echo, progress=not no_progress)

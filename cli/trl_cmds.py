"""``replay-theory trl-replay``: TRL's GRPO trainer with a replay buffer sized by the theory (validate/trl_run.py).

Options are the fields of ``TrlRunConfig``; the trl extra is imported when the command runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .. import install_hint
from ..validate.trl_run import CACHE_ENV, TrlRunConfig, check_out_dir, default_cache_dir
from .common import on_ctrl_c
from .config_options import with_field_options

OutOption = Annotated[Path, typer.Option(
    "--out", help="New (or empty) run directory: rollouts.parquet, run.json, trainer_log.jsonl (TRL's per-step "
                  "logs), noise_scale.jsonl, noise_profile.json; an unfinished run's (checkpoints/) is continued.")]
NoProgressOption = Annotated[bool, typer.Option("--no-progress", help="Hide the progress bars (stderr).")]
CacheDirOption = Annotated[Optional[Path], typer.Option(
    "--cache-dir", help="Where the tiny model's warm-start weights are cached, by code version and warm-start "
                        "options (default: $REPLAY_THEORY_CACHE, else $XDG_CACHE_HOME/replay-theory, else "
                        "~/.cache/replay-theory).")]


def register(app: typer.Typer) -> None:
    app.command("trl-replay")(trl_replay)


@with_field_options(TrlRunConfig)
def trl_replay(fields: dict[str, Any], out: OutOption, no_progress: NoProgressOption = False,
               cache_dir: CacheDirOption = None) -> None:
    """Run TRL's GRPOTrainer with the replay buffer on Countdown; writes the log `diagnose` and `calibrate --from-log`
    read.

    N, B, R from --design or by hand; also the gradient noise scale B_noise (two batch sizes a step, no extra backward
    pass) and kappa's curvature pairs (two forward+backward passes of one update's rows every --curvature-every
    steps). stdout: the regime when it is not replay, then the summary; TRL's per-step logs go to
    OUT/trainer_log.jsonl, a progress bar to stderr."""
    config = TrlRunConfig(**fields).validated()
    check_out_dir(out, config)
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    if cache_dir.exists() and not cache_dir.is_dir():
        raise ValueError(f"--cache-dir (or ${CACHE_ENV}) {cache_dir} is not a directory")
    missing = [m for m in ("trl", "datasets", "torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"trl-replay needs {', '.join(missing)}: {install_hint('trl')}")
    from ..validate.trl_run import run

    with on_ctrl_c(f"interrupted before training started: nothing to resume from in {out}; run the same command "
                   "to start again"):  # the run's own line (what its checkpoint holds) once training started
        run(config, out, log=typer.echo, progress=not no_progress, cache_dir=cache_dir)

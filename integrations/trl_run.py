"""One command from a buffer design to a TRL replay run: ``replay-theory trl-replay --out DIR``.

Paper: experience-replay (docs/REFERENCES.md), Sec. 3 (N, B, R); the task is the Replay-RLOO paper's Countdown
(validate/countdown.py, verifier reward 1 / 0.1 / 0). Code names -> paper symbols: ``buffer_size`` N,
``batch_size`` B, ``rollouts_per_step`` R, ``group_size`` G (TRL's ``num_generations``).

What it runs, in order, every value checked first (one-line errors, nothing written on bad input):

1. the policy: ``--model tiny`` builds the validator's small Qwen2 (validate/model.py, the same builder and sizes
   as ``validate``) and warm-starts it by SFT on solved problems, so the reward has a signal to climb; a
   checkpoint path (``--model ./Qwen2.5-0.5B-Instruct``) is loaded as it is, with its own tokenizer;
2. TRL's real ``GRPOTrainer`` loop through :class:`~replay_theory.integrations.trl.ReplayGRPOTrainer`, N, B, R
   from ``--design`` (``replay-theory optimal ... -R R --json`` saved to a file) or by hand, the buffer design and
   loss from the shared registry;
3. the diagnose log ``DIR/rollouts.parquet`` (``replay-theory diagnose DIR/rollouts.parquet --preset trl``,
   ``replay-theory calibrate --from-log DIR/rollouts.parquet``) and ``DIR/run.json`` (config, code version,
   per-step reward and metrics);
4. the gradient noise scale (McCandlish et al. 2018, arXiv 1812.06162, App. A.1), measured by the trainer every
   step from two batch sizes at no extra backward pass (``integrations/trl.py``): the per-step squared norms in
   ``DIR/noise_scale.jsonl`` (``calibrate --from-log ... --grad-norms`` reads them), B_noise with its bootstrap
   interval over steps (``theory.noise_scale.pooled_two_batch``) in ``run.json`` and in the profile file
   ``DIR/noise_profile.json`` ({"kind": "noise_scale", "noise_scale": {...}}), and in the printed summary.

``DIR`` must not exist or be empty: a run is never overwritten. It is not resumable (TRL's checkpoints do not hold
the replay buffer); an interrupted run leaves its log with the steps it finished.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from replay_theory import __version__
from replay_theory.integrations.replay_config import REPLAY_LOSSES, ROW_DESIGNS, ReplayConfig

LOG_NAME = "rollouts.parquet"
RUN_NAME = "run.json"
NOISE_NAME = "noise_scale.jsonl"
NOISE_PROFILE_NAME = "noise_profile.json"


@dataclass(frozen=True)
class TrlRunConfig:
    """The replay run of ``replay-theory trl-replay``: design, model, task and training sizes."""

    design: Optional[str] = None
    """`replay-theory optimal ... -R R --json` saved to a file: N, B, R from it (N rounded to whole groups)."""
    buffer_size: Optional[int] = None
    """N by hand (completions kept); with --batch-size and --rollouts-per-step instead of --design."""
    batch_size: Optional[int] = None
    """B by hand: completions trained on per update."""
    rollouts_per_step: Optional[int] = None
    """R by hand: fresh completions generated per update (a multiple of --group-size)."""
    group_size: int = 8
    """G: completions per prompt (TRL's num_generations)."""
    buffer: str = "fifo"
    """Buffer design: on-policy, fifo, positive-bias or prioritized (the shared registry's)."""
    loss: str = "grpo"
    """Off-policy correction: grpo (PPO clip), tis, m2po, m2po-reference or no-trust-region."""
    steps: int = 40
    """Optimizer steps (updates) of the replay run."""
    learning_rate: float = 3e-4
    """AdamW step size of the replay run."""
    model: str = "tiny"
    """tiny (the validator's small Qwen2, built from config and warm-started) or a local checkpoint directory."""
    sft_steps: int = 600
    """Tiny model: supervised warm-start steps on solved problems before RL (0: none; the reward then stays ~0)."""
    n_train: int = 1000
    """Countdown training problems (three numbers 1-9, targets 1-40, as the validator's)."""
    max_completion_length: int = 16
    """Longest completion, in tokens."""
    temperature: float = 1.0
    """Sampling temperature of TRL's generation."""
    seed: int = 0
    """Seed of the model's initialisation, the warm start, TRL and the buffer's draws."""
    threads: int = 1
    """torch CPU threads (1: torch's default oversubscribes a shared machine; see validate --threads)."""

    def validated(self) -> "TrlRunConfig":
        """Every option checked before any work: a one-line ValueError naming the option and its valid range."""
        by_hand = (self.buffer_size, self.batch_size, self.rollouts_per_step)
        if self.design is not None and any(v is not None for v in by_hand):
            raise ValueError("--design and --buffer-size/--batch-size/--rollouts-per-step exclude each other: "
                             "give one")
        if self.design is None and any(v is None for v in by_hand):
            raise ValueError("give --design FILE (replay-theory optimal ... -R R --json > FILE) or all of "
                             "--buffer-size, --batch-size, --rollouts-per-step")
        if self.design is not None and not Path(self.design).is_file():
            raise ValueError(f"--design {self.design} is not a file")
        for option, value, low in (("--group-size", self.group_size, 2), ("--steps", self.steps, 1),
                                   ("--sft-steps", self.sft_steps, 0), ("--n-train", self.n_train, 1),
                                   ("--max-completion-length", self.max_completion_length, 1),
                                   ("--threads", self.threads, 1), ("--seed", self.seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{option} must be an integer >= {low}, got {value!r}")
        for option, value in (("--learning-rate", self.learning_rate), ("--temperature", self.temperature)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{option} must be > 0, got {value!r}")
        if self.buffer not in ROW_DESIGNS:
            raise ValueError(f"--buffer must be one of {', '.join(ROW_DESIGNS)}, got {self.buffer!r}")
        if self.loss not in REPLAY_LOSSES:
            raise ValueError(f"--loss must be one of {', '.join(REPLAY_LOSSES)}, got {self.loss!r}")
        if self.model != "tiny" and not Path(self.model).is_dir():
            raise ValueError(f"--model must be tiny or a local checkpoint directory, got {self.model!r} "
                             "(this machine reaches no model hub)")
        self.replay_config()  # N, B, R and their rules, named as options
        return self

    def replay_config(self) -> ReplayConfig:
        """The ReplayConfig of this run (raises a one-line ValueError naming the option)."""
        common = dict(loss=self.loss, buffer=self.buffer, seed=self.seed)
        try:
            if self.design is not None:
                return ReplayConfig.from_optimal_json(Path(self.design), group_size=self.group_size, **common)
            return ReplayConfig(self.buffer_size, self.batch_size, self.rollouts_per_step, **common)
        except (ValueError, json.JSONDecodeError) as err:
            first, _, rest = str(err).splitlines()[0].partition(" ")
            if first in ("buffer_size", "batch_size", "rollouts_per_step"):  # name the option the user typed
                first = "--" + first.replace("_", "-")
            raise ValueError(f"{first} {rest}" if self.design is None else f"--design {self.design}: {first} {rest}"
                             ) from None


def check_out_dir(out: Path) -> None:
    """A new run directory: absent or empty (a run is never overwritten)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out} exists and is not an empty directory: a run is never overwritten")


def _hf_tokenizer(tokenizer) -> Any:
    """A Hugging Face fast tokenizer with exactly the validator's CharTokenizer ids (one token per character)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from replay_theory.validate.tokenizer import CharTokenizer

    if not isinstance(tokenizer, CharTokenizer):
        return tokenizer.hf  # a real checkpoint's own tokenizer
    vocab = {"<pad>": tokenizer.pad_token_id, "<bos>": tokenizer.bos_token_id, "<eos>": tokenizer.eos_token_id}
    vocab.update({c: tokenizer.encode(c)[0] for c in tokenizer.alphabet})
    hf = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    hf.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    hf.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=hf, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")


def countdown_reward(completions: list[str], numbers: list[list[int]], target: list[int], **_: Any) -> list[float]:
    """The Countdown verifier (1 correct, 0.1 well formed, 0 otherwise) as a TRL reward function."""
    from replay_theory.validate import countdown

    return [countdown.verify(countdown.Problem(tuple(n), int(t)), c) for c, n, t in zip(completions, numbers, target)]


def run(config: TrlRunConfig, out: Path, log: Callable[[str], None] = print, progress: bool = True) -> dict:
    """Warm start (tiny), the TRL replay run, the diagnose log; returns (and writes) the run summary."""
    config = config.validated()
    check_out_dir(out)
    replay = config.replay_config()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from datasets import Dataset

    from replay_theory.integrations.trl import ReplayGRPOTrainer, replay_grpo_args
    from replay_theory.simulate.progress import ProgressBar
    from replay_theory.validate import countdown
    from replay_theory.validate.config import TINY_MODEL, ValidateConfig
    from replay_theory.validate.loop import configure_torch
    from replay_theory.validate.model import ModelConfig, load_policy, sft_warm_start

    configure_torch(config.threads)
    # TRL 1.16 calls transformers 5's deprecated gradient-checkpointing names every step: not the user's to fix
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    problems, _ = ValidateConfig(n_train=config.n_train, seed=config.seed).problems()
    started = time.perf_counter()
    if config.model == "tiny":
        policy = load_policy(ModelConfig(seed=config.seed, **TINY_MODEL), countdown.ALPHABET)
        if config.sft_steps:
            bar = ProgressBar("warm start (SFT steps)", config.sft_steps, enabled=progress)
            sft_warm_start(policy, [(p.prompt_text(), countdown.solve(p)) for p in problems], steps=config.sft_steps,
                           batch_size=64, lr=3e-3, generator=torch.Generator().manual_seed(config.seed),
                           on_step=lambda step, loss: bar.advance())
            bar.close()
    else:
        policy = load_policy(ModelConfig(source=config.model, seed=config.seed))
    tokenizer = _hf_tokenizer(policy.tokenizer)
    dataset = Dataset.from_dict({"prompt": [p.prompt_text() for p in problems],
                                 "numbers": [list(p.numbers) for p in problems],
                                 "target": [p.target for p in problems]})
    out.mkdir(parents=True, exist_ok=True)
    args = replay_grpo_args(replay, config.group_size, output_dir=str(out / "trainer"), max_steps=config.steps,
                            learning_rate=config.learning_rate, logging_steps=1, report_to="none",
                            use_cpu=policy.device.type == "cpu", save_strategy="no", seed=config.seed,
                            max_completion_length=config.max_completion_length, temperature=config.temperature,
                            disable_tqdm=not progress)
    trainer = ReplayGRPOTrainer(model=policy.model, reward_funcs=countdown_reward, args=args, train_dataset=dataset,
                                processing_class=tokenizer, replay=replay, diagnose_log=out / LOG_NAME,
                                noise_log=out / NOISE_NAME)
    if not progress:
        from transformers import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # without a bar, Trainer prints every step's metrics dict
    trainer.train()
    history = [h for h in trainer.state.log_history if "replay/replay_ratio" in h]
    rewards = [h["reward"] for h in history]
    k = max(1, len(rewards) // 4)
    summary = {
        "config": asdict(config),
        "replay": {k2: v for k2, v in asdict(replay).items() if k2 != "notes"} | {"notes": list(replay.notes)},
        "replay_theory_version": __version__,
        "seconds": time.perf_counter() - started,
        "log": str(out / LOG_NAME),
        "reward_first_quarter": sum(rewards[:k]) / k,
        "reward_last_quarter": sum(rewards[-k:]) / k,
        "generated": trainer.replay_generated,
        "trained": trainer.replay_trained,
        "history": history,
        "noise_scale": noise_record(trainer.noise_records, config.group_size, config.seed, out / NOISE_NAME),
    }
    (out / RUN_NAME).write_text(json.dumps(summary, indent=1, default=str))
    if summary["noise_scale"] is not None:
        (out / NOISE_PROFILE_NAME).write_text(json.dumps({"kind": "noise_scale",
                                                           "noise_scale": summary["noise_scale"]}, indent=1))
    log(f"trained {config.steps} steps in {summary['seconds']:.0f} s: N = {replay.buffer_size}, "
        f"B = {replay.batch_size}, R = {replay.rollouts_per_step}, buffer {replay.buffer}, loss {replay.loss}"
        + (f" ({'; '.join(replay.notes)})" if replay.notes else ""))
    log(f"reward: {summary['reward_first_quarter']:.3f} (first {k} steps) -> {summary['reward_last_quarter']:.3f} "
        f"(last {k}); replay ratio {trainer.replay_trained / max(trainer.replay_generated, 1):.3f} (B/R = "
        f"{replay.replay_ratio:.3f})")
    from replay_theory.diagnose.calibrate_log import noise_scale_lines

    measured = len(trainer.noise_records)
    if summary["noise_scale"] is None:
        log(f"B_noise: not measured ({measured} of {config.steps} steps measured; the two-batch estimate needs 2)")
    else:
        log(noise_scale_lines(summary["noise_scale"])[0] + f" [{measured} of {config.steps} steps measured]")
    wrote = [out / LOG_NAME, out / RUN_NAME] + ([out / NOISE_NAME] if measured else []) + \
        ([out / NOISE_PROFILE_NAME] if summary["noise_scale"] is not None else [])
    log(f"wrote {', '.join(str(p) for p in wrote)}")
    log(f"next: replay-theory diagnose {out / LOG_NAME} --preset trl")
    return summary


def noise_record(records: list[dict], group_size: int, seed: int, path: Path) -> Optional[dict]:
    """The profile's "noise_scale" record of the run's per-step two-batch norms (None with fewer than 2 steps).

    The same pooling as ``calibrate --from-log LOG --grad-norms`` (``diagnose.calibrate_log.noise_scale_record``),
    bootstrap seeded by the run's seed; unit_size = G (the halves keep groups whole).
    """
    import numpy as np

    from replay_theory.diagnose.calibrate_log import GRAD_NORM_COLUMNS, noise_scale_record

    if len(records) < 2:
        return None
    norms = {c: np.asarray([r[c] for r in records], dtype=np.float64) for c in GRAD_NORM_COLUMNS}
    return noise_scale_record(norms, unit_size=group_size, seed=seed,
                              source=f"replay-theory trl-replay: two-batch squared gradient norms ({path.name}), "
                                     f"{len(records)} steps, halves of whole groups of {group_size}")

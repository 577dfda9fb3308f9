"""One command from a buffer design to a TRL replay run: ``replay-theory trl-replay --out DIR``.

Paper: experience-replay (docs/REFERENCES.md), Sec. 3 (N, B, R); the task is the Replay-RLOO paper's Countdown
(validate/countdown.py, verifier reward 1 / 0.1 / 0). Code names -> paper symbols: ``capacity`` N,
``batch_size`` B, ``rollouts_per_step`` R, ``group_size`` G (TRL's ``num_generations``). The option names are our
configs' (``--lr``, ``--max-new-tokens`` as ``validate``'s); TRL's own field names appear only where GRPOConfig is
built (``run``).

What it runs, the files it writes and how it resumes: :func:`run`; what is checked before any work:
:meth:`TrlRunConfig.validated`. It lives beside the validator because it trains the validator's model on the
validator's task (tiny Qwen2, Countdown, SFT warm start, memory terms); integrations/ stays the library a TRL user
imports and never imports validate/.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from .. import __version__
from ..checks import Range, require_in_range, require_integer, require_number
from ..core.designs import BUFFER_DESIGNS, LOSSES, MAX_REFILL_ROUNDS, EpochParams, StaleKParams, check_choice, choices
from ..core.memory import Estimate, Size, check_ceiling, check_sizes, check_threads
from ..integrations.checkpoints import CHECKPOINT_PREFIX, checkpoint_step, complete_checkpoints
from ..integrations.replay_config import ReplayConfig
from ..outputs import NEVER, check_writable, write_new
from ..outputs import check_out_dir as check_out_path
from ..theory.design import classify_regime
from .config import LIBRARIES_BYTES, SFT_BATCH_SIZE, SFT_LR, lm_terms, model_shape
from .countdown import THREE_NUMBER_FAMILY

LOG_NAME = "rollouts.parquet"
RUN_NAME = "run.json"
NOISE_NAME = "noise_scale.jsonl"
NOISE_PROFILE_NAME = "noise_profile.json"
DRIFT_NAME = "drift.parquet"
"""The last policy's re-scoring of rollouts of steps T - 1, T - 2, T - 4, ... (``integrations/trl_drift.py``)."""
TRAINER_LOG_NAME = "trainer_log.jsonl"
"""TRL's per-step log dicts (what its PrinterCallback would print), one JSON line each."""
CHECKPOINT_DIR = "checkpoints"
"""While a run is unfinished: Trainer's output_dir, with the checkpoints it resumes from (removed when it ends)."""
COMMAND_NAME = "command.json"
"""In CHECKPOINT_DIR: the run's config and code version, which the command that continues it must match."""

CACHE_ENV = "REPLAY_THEORY_CACHE"
"""Environment variable naming the warm-start cache folder (``--cache-dir`` wins over it)."""

#: Distinct Countdown problems of the validator's family (``countdown.solvable_family``) and how many the split
#: holds out.
COUNTDOWN_DISTINCT = THREE_NUMBER_FAMILY
COUNTDOWN_HELD_OUT = 64
MAX_N_TRAIN = COUNTDOWN_DISTINCT - COUNTDOWN_HELD_OUT

_NO_DESIGN = ("give --design FILE (replay-theory optimal ... -B B --json > FILE) or all of "
              "--capacity, --batch-size, --rollouts-per-step (--buffer epochs, stale-k or dynamic: "
              "--rollouts-per-step)")

#: The internal names a design's rules use (core/designs.py, integrations/buffer.py) -> the options typed.
_OPTION_OF = {"capacity": "--capacity", "batch_size": "--batch-size",
              "rollouts_per_step": "--rollouts-per-step", "group_size": "--group-size",
              "num_generations": "--group-size", "epochs": "--epochs", "mini_batches": "--mini-batches",
              "epoch_shuffle": "--epoch-shuffle", "stale_k": "--stale-k"}


@dataclass(frozen=True)
class TrlRunConfig(EpochParams, StaleKParams):
    """The replay run of ``replay-theory trl-replay``: design, model, task and training sizes; with ``--buffer
    epochs``, the registry's epoch fields (``EpochParams``: e, m), which TRL runs as num_iterations and
    steps_per_generation; with ``--buffer stale-k``, M2PO's k (``StaleKParams``): each update trains the generation
    of k updates earlier, generated in the trainer's own step (TRL 1.16's GRPOTrainer generates synchronously, so
    this gives k-step-off staleness's statistics, not the wall time an overlapped trainer gains)."""

    design: Optional[str] = None
    """`replay-theory optimal ... -B B --json` saved to a file: N, B, R from it (R and N rounded to whole groups)."""
    capacity: Optional[int] = None
    """N: buffer size in completions, by hand; with --batch-size and --rollouts-per-step instead of --design
    (--buffer epochs, stale-k or dynamic: R, one generation, when not given)."""
    batch_size: Optional[int] = None
    """B by hand: completions trained on per update (--buffer epochs: R / --mini-batches, stale-k and dynamic: R,
    when not given)."""
    rollouts_per_step: Optional[int] = None
    """R by hand: fresh completions generated per update (a multiple of --group-size)."""
    group_size: int = 8
    """G: completions per prompt (TRL's num_generations)."""
    buffer: str = field(default="fifo", metadata=Range(
        choices=lambda: choices(BUFFER_DESIGNS, trainer=True)).field())
    """Buffer design."""
    loss: str = field(default="grpo", metadata=Range(
        choices=lambda: choices(LOSSES, trainer=True)).field())
    """Off-policy correction."""
    steps: int = 40
    """Optimizer steps (updates) of the replay run."""
    save_every: int = 10
    """Steps between checkpoints (model, optimizer, buffer, random state) that a crashed run resumes from; Ctrl-C
    saves one at once. The same command on the same --out continues the run."""
    lr: float = 3e-4
    """AdamW learning rate of the replay run."""
    model: str = "tiny"
    """tiny (the validator's small Qwen2, built from config and warm-started) or a local checkpoint directory."""
    sft_steps: int = 600
    """Tiny model: supervised warm-start steps on solved problems before RL (0: none; the reward then stays ~0)."""
    n_train: int = 1000
    """Countdown training problems (three numbers 1-9, targets 1-40, as the validator's)."""
    max_new_tokens: int = 16
    """Completion length limit, in tokens."""
    temperature: float = 1.0
    """Sampling temperature of TRL's generation."""
    seed: int = 0
    """Seed of the model's initialisation, the warm start, TRL and the buffer's draws."""
    threads: int = 1
    """torch CPU threads (1: torch's default oversubscribes a shared machine; see validate --threads)."""
    device: str = "cpu"
    """cpu or cuda (cuda:N). On cuda the passes run under bfloat16 autocast over float32 weights (TRL's bf16), as
    validate does; generation is TRL's own (HF generate)."""
    curvature_every: int = 10
    """Steps between the curvature pairs of the optimizer's memory kappa (0: none; the trainer's
    DEFAULT_CURVATURE_EVERY). Each pair costs two forward+backward passes of the next step's R fresh rows; they go
    into noise_scale.jsonl (calibrate --from-log --grad-norms makes them the profile's memory), and kappa with its
    interval into run.json and the summary (integrations/trl.py)."""

    def validated(self) -> "TrlRunConfig":
        """Every option checked before any work: a one-line ValueError naming the option and its valid range.

        In the options' names: besides each option's own range, what TRL's
        GRPOConfig / GRPOTrainer would refuse on the values passed (R a multiple of G: TRL's ``generation_batch_size %
        num_generations``; G >= 2), what the trainer's buffer and the shared design refuse (N whole groups, N >= R, B =
        R on-policy) and what TRL's prompt sampler needs (R/G <= --n-train <= the Countdown family's distinct problems
        less the held-out ones). A design that is not replay says so in one line before training: on-policy (N = B = R)
        or over-generation (y = B/R < 1; ``theory.design.classify_regime``).
        """
        by_hand = (self.capacity, self.batch_size, self.rollouts_per_step)
        if self.design is not None and any(v is not None for v in by_hand):
            raise ValueError("--design and --capacity/--batch-size/--rollouts-per-step exclude each other: "
                             "give one")
        if self.design is None and (self.rollouts_per_step is None if self.buffer in ("epochs", "stale-k", "dynamic")
                                    else any(v is None for v in by_hand)):
            raise ValueError(_NO_DESIGN)
        if self.design is not None and not Path(self.design).is_file():
            raise ValueError(f"--design {self.design} is not a file")
        for option, value, low in (("--group-size", self.group_size, 2), ("--steps", self.steps, 1),
                                   ("--save-every", self.save_every, 1),
                                   ("--sft-steps", self.sft_steps, 0), ("--n-train", self.n_train, 1),
                                   ("--max-new-tokens", self.max_new_tokens, 1),
                                   ("--threads", self.threads, 1), ("--seed", self.seed, 0),
                                   ("--curvature-every", self.curvature_every, 0)):
            require_integer(option, value, low)
        for option, value in (("--lr", self.lr), ("--temperature", self.temperature)):
            require_number(option, value, above=0, finite=True)
        check_choice("--buffer", self.buffer, BUFFER_DESIGNS, trainer=True)
        check_choice("--loss", self.loss, LOSSES, trainer=True)
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"--device must be cpu or cuda (cuda:N), got {self.device!r}")
        if self.model != "tiny" and not Path(self.model).is_dir():
            raise ValueError(f"--model must be tiny or a local checkpoint directory, got {self.model!r} "
                             "(this machine reaches no model hub)")
        replay = self.replay_config()  # N, B, R and their rules, named as options
        if replay.buffer == "stale-k":  # k base generations are made at step 0: at most one an update
            from_answer = any(note.startswith("overlapped generation") for note in replay.notes)  # k: its max_staleness
            option = "--design's max_staleness" if from_answer else "--stale-k"
            require_in_range(option, replay.shared.stale_k, 0, self.steps,
                             note=f" (--steps = {self.steps}: the first k updates train the base model's generations)")
        period = replay.shared.epochs * replay.shared.mini_batches  # e m updates a generation (from --design too)
        if replay.buffer == "epochs" and self.save_every % period:
            raise ValueError(f"--save-every must be a multiple of --epochs x --mini-batches = "
                             f"{period} with --buffer epochs (a checkpoint is saved at a "
                             f"generation's start: TRL keeps the generation in memory only), got {self.save_every}")
        self._check_trl_rules(replay)
        self._check_sizes(replay)
        return self

    def _check_sizes(self, replay: ReplayConfig) -> None:
        """Every size within ``MAX_SIZE`` (--seed and --threads within what seeds and CPUs are) and the run's estimated
        peak (:func:`peak_bytes`) within this machine's memory: before the warm start, the cache or a checkpoint."""
        check_ceiling("--seed", self.seed, 0)
        check_threads("--threads", self.threads)
        values = {**asdict(self), "--capacity": replay.capacity, "--batch-size": replay.batch_size,
                  "--rollouts-per-step": replay.rollouts_per_step, "--max-new-tokens": self.max_new_tokens,
                  "--steps": self.steps, "--group-size": self.group_size, "--save-every": self.save_every,
                  "--sft-steps": self.sft_steps, "--curvature-every": self.curvature_every}
        where = ("with the other options as given" if self.design is None
                 else f"with the other options as given (N, B, R from --design {self.design})")
        check_sizes(TRL_SIZES, values, peak_bytes, defaults=_TRL_DEFAULTS, where=where)

    def _check_trl_rules(self, replay: ReplayConfig) -> None:
        """What TRL's GRPOConfig / GRPOTrainer, the trainer's buffer and TRL's prompt sampler would refuse later
        (after the warm start, in their own names), checked here in the options' names."""
        g, n, r = self.group_size, replay.capacity, replay.rollouts_per_step
        if r % g:  # GRPOConfig: generation_batch_size % num_generations (generation_batch_size = R here)
            raise ValueError(f"--rollouts-per-step must be a multiple of --group-size = {g} (whole prompt groups), "
                             f"got {r}")
        if replay.buffer != "on-policy" and n % g:  # RowReplayBuffer: whole groups are stored
            raise ValueError(f"--capacity must be a multiple of --group-size = {g} (whole groups are stored), "
                             f"got {n}")
        try:  # the shared design's own rules (core/designs.py), as the trainer's buffer applies them
            replay.design_config(g).validated_design()
        except ValueError as err:
            raise ValueError(_option_names(str(err).splitlines()[0])) from None
        # TRL's RepeatSampler drops an incomplete batch of R/G prompts: fewer problems than that train no step;
        # more than the family holds cannot be drawn (validate/countdown.make_splits)
        require_in_range("--n-train", self.n_train, r // g, MAX_N_TRAIN,
                         note=f" (R/G = {r}/{g} prompts a step; {COUNTDOWN_DISTINCT} distinct problems, "
                              f"{COUNTDOWN_HELD_OUT} held out)")

    def regime_line(self) -> Optional[str]:
        """One line when the design is not replay (theory.design.classify_regime on x = N/R, y = B/R), else None."""
        replay = self.replay_config()
        n, b, r = replay.capacity, replay.batch_size, replay.rollouts_per_step
        if replay.buffer == "stale-k":  # one generation a step, trained once, k updates late: not the FIFO's x, y
            k = replay.shared.stale_k  # --stale-k, or --design's max_staleness
            return (f"regime: {k}-step-off (stale-k, M2PO Sec. 3): each update trains the whole generation of R = {r} "
                    f"made {k} update(s) earlier, once, with the loss's importance ratio; generated in the same step "
                    f"(no overlap: TRL's trainer is synchronous)")
        if replay.buffer == "dynamic":  # on-policy rounds until B are informative: not the FIFO's x, y
            return (f"regime: dynamic sampling (DAPO): generation batches of R = B = {r} until {r} rollouts have "
                    f"unequal group rewards, each trained once in its own step; a refill's prompts are drawn "
                    f"uniformly from the training problems, every round's generation counted")
        if replay.buffer == "epochs":  # one generation, e passes over m mini-batches: not the FIFO's x, y
            e, m = replay.shared.epochs, replay.shared.mini_batches  # --epochs, --mini-batches or --design's
            return (f"regime: {e} epochs over {m} mini-batches of each generation of R = {r} (TRL num_iterations = "
                    f"{e}, steps_per_generation = {m}): every rollout trained {e} times, at ages 0..{e * m - 1}")
        regime = classify_regime(n / r, b / r)
        if regime == "on-policy":
            return (f"regime: on-policy (N = B = R = {r}): every rollout is trained once, in the step that "
                    "generated it; no replay")
        if regime == "over-generation":
            return (f"regime: over-generation, not replay (y = B/R = {b}/{r} = {b / r:.3g} < 1): some rollouts "
                    "are never trained on; raise --batch-size to R or cut --rollouts-per-step to B")
        return None

    def warm_start_key(self) -> dict[str, Any]:
        """Everything the tiny model's warm-start weights depend on (the code through its version)."""
        from .config import TINY_MODEL

        return {"replay_theory_version": __version__, "model": dict(TINY_MODEL), "seed": self.seed,
                "sft_steps": self.sft_steps, "n_train": self.n_train, "held_out": COUNTDOWN_HELD_OUT,
                "sft_batch_size": SFT_BATCH_SIZE, "sft_lr": SFT_LR, "threads": self.threads, "device": self.device}

    def _by_hand(self) -> tuple[int, int, int]:
        """N, B, R as given without --design (--capacity, --batch-size, --rollouts-per-step; --buffer epochs: N = R
        and B = R / m unless given; stale-k and dynamic: N = B = R unless given)."""
        n, b, r = self.capacity, self.batch_size, self.rollouts_per_step
        if self.buffer in ("stale-k", "dynamic") and r is not None:
            r = require_integer("--rollouts-per-step", r, 1)
            n, b = (r if n is None else n), (r if b is None else b)
        if self.buffer == "epochs" and r is not None:
            r = require_integer("--rollouts-per-step", r, 1)
            n = r if n is None else n
            b = r // require_integer("--mini-batches", self.mini_batches, 1) if b is None else b
        if n is None or b is None or r is None:
            raise ValueError(_NO_DESIGN)
        return n, b, r

    def _buffer_fields(self) -> dict[str, Any]:
        """The buffer's own DesignConfig fields (--buffer epochs: e, m and the order; stale-k: k), else none."""
        if self.buffer == "stale-k":
            return {"stale_k": self.stale_k}
        if self.buffer != "epochs":
            return {}
        return {"epochs": self.epochs, "mini_batches": self.mini_batches, "epoch_shuffle": self.epoch_shuffle}

    def replay_config(self) -> ReplayConfig:
        """The ReplayConfig of this run (raises a one-line ValueError naming the option)."""
        try:
            if self.design is not None:
                return ReplayConfig.from_optimal_json(Path(self.design), group_size=self.group_size, loss=self.loss,
                                                      buffer=self.buffer, design=self._buffer_fields(),
                                                      seed=self.seed)
            return ReplayConfig(*self._by_hand(), loss=self.loss, buffer=self.buffer, design=self._buffer_fields(),
                                seed=self.seed)
        except (ValueError, json.JSONDecodeError) as err:
            message = str(err).splitlines()[0]
            if self.design is not None:  # the names are the design file's keys
                raise ValueError(f"--design {self.design}: {message}") from None
            raise ValueError(_option_names(message)) from None


#: trl-replay's sizes, by option: the memory grows with the first five (``peak_bytes``); the rest only count steps.
TRL_SIZES = (Size("--batch-size"), Size("--rollouts-per-step"), Size("--capacity"), Size("--max-new-tokens"),
             Size("--steps"), Size("--group-size", 2, memory=False), Size("--save-every", memory=False),
             Size("--sft-steps", 0, memory=False), Size("--curvature-every", 0, memory=False))
_TRL_DEFAULTS = {"--batch-size": 64, "--rollouts-per-step": 64, "--capacity": 256, "--max-new-tokens": 16,
                 "--steps": 40}
STEP_RECORD_BYTES = 8192
"""Bytes a step's records take until the run ends (TRL's log_history entry, run.json's history, the noise log)."""


def peak_bytes(values: dict) -> Estimate:
    """Peak bytes of ``trl-replay`` (``values``: the options by name): the model with AdamW (``--model``'s shape),
    one update's activations over max(B, R) rows (TRL runs the B drawn rows forward at once, the curvature pairs R),
    TRL's generation of R completions, the buffer's N rows, the diagnose log's B rows of a step and the per-step
    records (``validate.config.lm_terms``)."""

    B, R, N = values["--batch-size"], values["--rollouts-per-step"], values["--capacity"]
    if values.get("buffer") == "dynamic":  # a step holds every round until B are informative: at most the cap's
        N = MAX_REFILL_ROUNDS * R
    terms = lm_terms(model_shape(values["model"]), train_rows=max(B, R), generate_rows=R, stored_rows=N + B,
                     new_tokens=values["--max-new-tokens"])
    terms[f"the per-step records: steps = {values['--steps']}"] = values["--steps"] * STEP_RECORD_BYTES
    terms["the libraries (torch, transformers, TRL, datasets)"] = LIBRARIES_BYTES
    return Estimate(terms)


def _option_names(message: str) -> str:
    """A design rule's message with its internal names (capacity, batch_size, ...) as the options typed."""
    for name, option in _OPTION_OF.items():
        message = re.sub(rf"(?<![-\w]){name}\b", option, message)
    return message


def default_cache_dir() -> Path:
    """$REPLAY_THEORY_CACHE, else $XDG_CACHE_HOME/replay-theory, else ~/.cache/replay-theory."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "replay-theory"


def warm_start_path(config: TrlRunConfig, cache_dir: Path) -> Path:
    """The cached warm-start weights of ``config``: named by the code version and a hash of the warm-start key."""
    key = json.dumps(config.warm_start_key(), sort_keys=True)
    return cache_dir / f"warm-start-{__version__}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"


def check_out_dir(out: Path, config: Optional[TrlRunConfig] = None) -> Optional[Path]:
    """``--out``: a new or empty directory, or an unfinished run of this very command (options and code version
    as saved). Returns the newest complete checkpoint to continue from (None: start at step 0). One-line
    ValueError otherwise, before any work; writes nothing."""
    out = Path(out)
    if (out / RUN_NAME).exists():
        raise ValueError(f"--out {out} holds a finished run ({RUN_NAME}); {NEVER}: choose a new --out")
    command = out / CHECKPOINT_DIR / COMMAND_NAME
    check_out_path(out, "--out", ours=lambda folder: (folder / CHECKPOINT_DIR / COMMAND_NAME).is_file(),
                   holds=f"holds no unfinished trl-replay run (no {CHECKPOINT_DIR}/{COMMAND_NAME})")
    if not command.is_file():
        return None
    saved = json.loads(command.read_text())
    if saved.get("replay_theory_version") != __version__:
        raise ValueError(f"--out {out} holds an unfinished run of replay-theory {saved.get('replay_theory_version')}, "
                         f"this is {__version__}: it cannot be continued; choose a new --out")
    if config is not None:
        now = asdict(config)
        changed = [f"--{k.replace('_', '-')} {saved['config'].get(k)!r} (now {v!r})"
                   for k, v in now.items() if saved["config"].get(k) != v]
        if changed:
            raise ValueError(f"--out {out} holds an unfinished run with other options: {', '.join(changed)}; run "
                             "its own command to continue it, or choose a new --out")
    found = complete_checkpoints(out / CHECKPOINT_DIR)
    return found[-1] if found else None


def _hf_tokenizer(tokenizer) -> Any:
    """A Hugging Face fast tokenizer with exactly the validator's CharTokenizer ids (one token per character)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from .tokenizer import CharTokenizer

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
    from . import countdown

    return [countdown.verify(countdown.Problem(tuple(n), int(t)), c) for c, n, t in zip(completions, numbers, target)]


def run(config: TrlRunConfig, out: Path, log: Callable[[str], None] = print, progress: bool = True,
        cache_dir: Optional[Path] = None) -> dict:
    """Warm start (tiny; cached in ``cache_dir``, default :func:`default_cache_dir`), the TRL replay run, the
    diagnose log; returns (and writes) the run summary. stdout (``log``) gets the regime, the summary and the files;
    TRL's per-step dicts go to ``DIR/trainer_log.jsonl``, a progress bar to stderr.

    Resumable: a checkpoint every ``config.save_every`` steps and at the first Ctrl-C (``DIR/checkpoints``); the
    same call on the same ``out`` continues from the newest one, with the numbers of an uninterrupted run. An
    interruption raises :class:`TrlRunInterrupted`, whose ``message()`` says what is saved and how to go on.

    What it runs, in order, every value checked first (one-line errors, nothing written on bad input):

    1. the policy: ``--model tiny`` builds the validator's small Qwen2 (validate/policy.py, the same builder and sizes
       as ``validate``) and warm-starts it by SFT on solved problems, so the reward has a signal to climb; a
       checkpoint path (``--model ./Qwen2.5-0.5B-Instruct``) is loaded as it is, with its own tokenizer;
    2. TRL's real ``GRPOTrainer`` loop through :class:`~replay_theory.integrations.trl.ReplayGRPOTrainer`, N, B, R
       from ``--design`` (``replay-theory optimal ... -B B --json`` saved to a file) or by hand, the buffer design and
       loss from the shared registry;
    3. the diagnose log ``DIR/rollouts.parquet`` (``replay-theory diagnose DIR/rollouts.parquet --preset trl``,
       ``replay-theory calibrate --from-log DIR/rollouts.parquet``) and ``DIR/run.json`` (config, code version,
       per-step reward and metrics);
    4. the gradient noise scale (McCandlish et al. 2018, arXiv 1812.06162, App. A.1), measured by the trainer every
       step from two batch sizes at no extra backward pass (``integrations/trl.py``): the per-step squared norms in
       ``DIR/noise_scale.jsonl`` (``calibrate --from-log ... --grad-norms`` reads them), B_noise with its bootstrap
       interval over steps (``theory.noise_scale.pooled_two_batch``) in ``run.json`` and in the profile file
       ``DIR/noise_profile.json`` ({"kind": "noise_scale", "noise_scale": {...}}), and in the printed summary;
    5. the drift: 64 rollouts of each of the steps T - 1, T - 2, T - 4, ... (and the first) re-scored at the last
       policy T (``integrations/trl_drift.py``) into ``DIR/drift.parquet``, their M2(s) by age printed and put in
       ``DIR/noise_profile.json`` as its "drift" record (the staleness cost ``optimal --profile`` prices:
       ``calibrate --from-log ... --drift DIR/drift.parquet`` reads the same file).

    stdout carries that line, the summary and the files written; the progress bars go to stderr and TRL's per-step log
    dicts (what Trainer prints) to ``DIR/trainer_log.jsonl`` (``run.json`` keeps the per-step metrics too). The tiny
    model's warm-start weights are cached in ``--cache-dir`` (default ``$REPLAY_THEORY_CACHE``, else
    ``$XDG_CACHE_HOME/replay-theory``, else ``~/.cache/replay-theory``) under a name made of the code version
    (``replay_theory.__version__``) and a hash of every warm-start input (``TrlRunConfig.warm_start_key``): a second
    run with the same warm start loads them instead of repeating the SFT, and trains bit for bit the same.

    ``DIR`` must not exist or be empty: a run is never overwritten. It is resumable: while it trains,
    ``DIR/checkpoints`` holds Trainer's checkpoint every ``--save-every`` steps plus the replay buffer, its counters and
    random state (integrations/trl.py, integrations/checkpoints.py), and the first Ctrl-C saves one after the current
    step and stops (a second stops at once). The same command on the same ``DIR`` continues from the newest complete
    checkpoint and trains the numbers an uninterrupted run trains (tests/integration/test_trl_run_cli.py). The result
    files are written when the last step is done, whole, and the checkpoints are then removed.
    """
    config = config.validated()
    resume = check_out_dir(out, config)
    replay = config.replay_config()
    cache_dir = default_cache_dir() if cache_dir is None else Path(cache_dir)
    _check_cache_dir(config, resume, cache_dir)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _load_training_stack()
    from datasets import Dataset

    from .loop import configure_torch

    configure_torch(config.threads)
    from .policy import resolve_device

    device = resolve_device(config.device)  # cuda without a GPU: one line, before any work
    # TRL 1.16 calls transformers 5's deprecated gradient-checkpointing names every step: not the user's to fix
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    problems = _countdown_problems(config)
    regime = config.regime_line()
    if regime is not None:
        log(regime)
    started = time.perf_counter()
    done_before = _resumed_step(config, resume, log)
    policy = _run_policy(config, resume, cache_dir, problems, log, progress)
    tokenizer = _hf_tokenizer(policy.tokenizer)
    dataset = Dataset.from_dict({"prompt": [p.prompt_text() for p in problems],
                                 "numbers": [list(p.numbers) for p in problems],
                                 "target": [p.target for p in problems]})
    checkpoints = _prepare_checkpoints(out, resume, config)
    trainer = _trainer(config, replay, policy.model, tokenizer, dataset, checkpoints, device, out)
    _train(trainer, config, out, resume, done_before, progress)
    summary = _summary(config, replay, trainer, started, done_before, resume, out)
    _write_results(out, trainer, summary, checkpoints)
    _log_results(config, replay, trainer, summary, resume, done_before, out, log)
    return summary


#: what a run imports before any work, in this order (a missing extra fails here): torch, datasets, the validator's
#: training code, the TRL trainer
def _load_training_stack() -> None:
    """Import the training stack before any work, torch first, so a missing or broken extra fails first; the steps
    that use a module import it again where they need it (a cached lookup)."""
    import torch  # noqa: I001, F401 (torch first: its absence is the usual one)
    import datasets  # noqa: F401

    from ..core import progress  # noqa: F401
    from . import countdown, config, loop, policy, sft  # noqa: F401
    from ..integrations import trl  # noqa: F401


def _check_cache_dir(config: TrlRunConfig, resume: Optional[Path], cache_dir: Path) -> None:
    """Refuse an unwritable ``cache_dir`` before the SFT, where a fresh tiny run will cache its warm start there."""
    if resume is None and config.model == "tiny" and config.sft_steps and not warm_start_path(config,
                                                                                            cache_dir).is_file():
        check_writable(cache_dir, "--cache-dir")  # the warm start is cached there: refused before the SFT


def _countdown_problems(config: TrlRunConfig) -> list:
    """The run's training problems; a one-line error naming ``--n-train`` where the generator stalls."""
    from .config import ValidateConfig

    try:
        problems, _ = ValidateConfig(n_train=config.n_train, n_test=COUNTDOWN_HELD_OUT, seed=config.seed).problems()
    except ValueError as err:  # the generator stalls short of the family's size (a rare problem never drawn)
        reason = str(err).splitlines()[0]
        raise ValueError(f"--n-train {config.n_train}: seed {config.seed}'s problem generator stalls before "
                         f"{config.n_train} + {COUNTDOWN_HELD_OUT} held-out distinct problems ({reason}): use a "
                         "smaller --n-train") from None
    return problems


def _resumed_step(config: TrlRunConfig, resume: Optional[Path], log: Callable[[str], None]) -> int:
    """The steps done before this call (0 on a fresh run); a resumed run says where it continues from."""
    done_before = 0 if resume is None else checkpoint_step(resume)
    if resume is not None:
        log(f"resuming from step {done_before} of {config.steps} ({resume}): model, optimizer, buffer and random "
            "state as saved")
    return done_before


def _run_policy(config: TrlRunConfig, resume: Optional[Path], cache_dir: Path, problems: list,
                log: Callable[[str], None], progress: bool) -> Any:
    """The policy: the tiny model (warm-started on a fresh run) or the checkpoint ``--model`` names."""
    from . import countdown
    from .config import TINY_MODEL
    from .policy import ModelConfig, load_policy

    if config.model != "tiny":
        return load_policy(ModelConfig(source=config.model, seed=config.seed, device=config.device))
    policy = load_policy(ModelConfig(seed=config.seed, device=config.device, **TINY_MODEL), countdown.ALPHABET)
    if resume is None and config.sft_steps:  # resumed: the weights come from the checkpoint
        _warm_start(policy, config, warm_start_path(config, cache_dir), problems, log, progress)
    return policy


def _warm_start(policy: Any, config: TrlRunConfig, cached: Path, problems: list, log: Callable[[str], None],
                progress: bool) -> None:
    """Load the cached warm-start weights, or run the SFT and cache them."""
    import torch

    from ..core.progress import ProgressBar
    from . import countdown
    from .sft import sft_warm_start

    if cached.is_file():
        policy.model.load_state_dict(torch.load(cached, map_location=policy.device, weights_only=True))
        log(f"warm start: loaded {cached} (delete it to redo the SFT)")
        return
    bar = ProgressBar("warm start (SFT steps)", config.sft_steps, enabled=progress)
    sft_warm_start(policy, [(p.prompt_text(), countdown.solve(p)) for p in problems],
                   steps=config.sft_steps, batch_size=SFT_BATCH_SIZE, lr=SFT_LR,
                   generator=torch.Generator().manual_seed(config.seed),
                   on_step=lambda step, loss: bar.advance())
    bar.close()
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
    torch.save(policy.model.state_dict(), partial)
    partial.replace(cached)  # atomic: a concurrent run never reads half a file
    cached.with_suffix(".json").write_text(json.dumps(config.warm_start_key(), indent=1))
    log(f"warm start: cached {cached}")


def _prepare_checkpoints(out: Path, resume: Optional[Path], config: TrlRunConfig) -> Path:
    """The checkpoint folder, cleared of what the continuation does not use, with the command a rerun must match."""
    checkpoints = out / CHECKPOINT_DIR
    checkpoints.mkdir(parents=True, exist_ok=True)
    _clear_unfinished(out, resume)
    if not (checkpoints / COMMAND_NAME).exists():  # what a rerun must match to continue this run
        command = json.dumps({"replay_theory_version": __version__, "config": asdict(config)}, indent=1)
        write_new(checkpoints / COMMAND_NAME, lambda tmp: tmp.write_text(command))
    return checkpoints


def _trainer(config: TrlRunConfig, replay: Any, model: Any, tokenizer: Any, dataset: Any, checkpoints: Path,
             device: Any, out: Path) -> Any:
    """TRL's trainer with the replay buffer, its arguments from the config, without its per-step printer."""
    from ..integrations.trl import ReplayGRPOTrainer, replay_grpo_args

    # the boundary to TRL's GRPOConfig: its learning_rate is our lr, its max_completion_length our max_new_tokens;
    # Trainer's checkpoints every --save-every steps (save_total_limit off: the trainer deletes an older one only
    # once a newer is complete)
    args = replay_grpo_args(replay, config.group_size, output_dir=str(checkpoints), max_steps=config.steps,
                            learning_rate=config.lr, logging_steps=1, report_to="none",
                            use_cpu=device.type == "cpu", bf16=device.type == "cuda",  # validate's precision
                            save_strategy="steps", save_steps=config.save_every, save_total_limit=None,
                            seed=config.seed, max_completion_length=config.max_new_tokens,
                            temperature=config.temperature, disable_tqdm=True)
    trainer = ReplayGRPOTrainer(model=model, reward_funcs=countdown_reward, args=args, train_dataset=dataset,
                                processing_class=tokenizer, replay=replay, diagnose_log=out / LOG_NAME,
                                noise_log=out / NOISE_NAME, curvature_every=config.curvature_every,
                                drift_log=out / DRIFT_NAME)
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # it prints every step's metrics dict: they go to TRAINER_LOG_NAME
    return trainer


def _train(trainer: Any, config: TrlRunConfig, out: Path, resume: Optional[Path], done_before: int,
           progress: bool) -> None:
    """Train to ``config.steps`` with a progress bar; a Ctrl-C raises :class:`TrlRunInterrupted`."""
    from ..core.progress import ProgressBar

    bar = ProgressBar("TRL replay (steps)", config.steps, done_before, enabled=progress)
    stop = _stop_on_interrupt(bar)
    trainer.add_callback(stop)
    try:
        with stop.installed():
            trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
    except KeyboardInterrupt:  # a second Ctrl-C, mid-step: the newest complete checkpoint is what is kept
        raise TrlRunInterrupted(out, config.steps, int(trainer.state.global_step), during_step=True) from None
    finally:
        bar.close()
    if trainer.state.global_step < config.steps:  # stopped at the first Ctrl-C, after saving this step
        raise TrlRunInterrupted(out, config.steps, int(trainer.state.global_step), during_step=False)


def _quarter(history: list) -> int:
    """How many steps the first and last quarter rewards average over (at least 1)."""
    return max(1, len(history) // 4)


def reward_quarters(history: list[dict]) -> tuple[float | None, float | None, int, str]:
    """(mean reward of the first quarter, of the last, how many entries each averages, and what they are) over the
    steps whose log has a reward: every step, except under buffer epochs, where TRL logs a generation's reward at the
    step that made it only ("generations"). (None, None, 1, ...) when no step logged one."""
    rewards = [h["reward"] for h in history if "reward" in h]
    k = _quarter(rewards)
    unit = "steps" if len(rewards) == len(history) else "generations"
    if not rewards:
        return None, None, k, unit
    return sum(rewards[:k]) / k, sum(rewards[-k:]) / k, k, unit


def zero_share_of_history(history: list[dict]) -> dict | None:
    """The run's zero share z ([E8]): TRL's ``frac_reward_zero_std`` (the share of a generation's groups whose rewards
    are all equal) averaged over the steps that logged one; None when none did or every group was of equal rewards (a
    z of 1 prices nothing). ``optimal --profile`` reads it from ``noise_profile.json`` as --zero-share."""
    values = [float(h["frac_reward_zero_std"]) for h in history if h.get("frac_reward_zero_std") is not None]
    if not values or not sum(values) / len(values) < 1:
        return None
    return {"value": sum(values) / len(values), "generations": len(values),
            "source": f"trl-replay: TRL's frac_reward_zero_std, the mean over {len(values)} logged generations"}


def _summary(config: TrlRunConfig, replay: Any, trainer: Any, started: float, done_before: int,
             resume: Optional[Path], out: Path) -> dict:
    """The run summary (``run.json``): config, replay design, rewards, counters, history, noise scale, memory."""
    history = [h for h in trainer.state.log_history if "replay/replay_ratio" in h]
    first, last, _, _ = reward_quarters(history)
    return {
        "config": asdict(config),
        "replay": replay.record(),
        "replay_theory_version": __version__,
        "seconds": time.perf_counter() - started,
        "resumed_from_step": done_before if resume is not None else None,
        "log": str(out / LOG_NAME),
        "reward_first_quarter": first,
        "reward_last_quarter": last,
        "generated": trainer.replay_generated,
        "trained": trainer.replay_trained,
        "history": history,
        "noise_scale": noise_record(trainer.noise_records, config.group_size, config.seed, out / NOISE_NAME),
        "memory": kappa_record(trainer.noise_records, config.seed, out / NOISE_NAME),
        "curvature_skipped": trainer.curvature_skipped,
        "zero_share": zero_share_of_history(trainer.state.log_history),
        "drift": drift_of_run(trainer, out / DRIFT_NAME),
        "refill_rounds": refill_record(history, trainer.state.log_history, replay.batch_size // config.group_size),
    }


def drift_of_run(trainer: Any, path: Path) -> dict | None:
    """The run's drift M2(s) (``calibrate --from-log --drift``'s record of the file the trainer re-scored), with the
    table's ages no generation was kept for; None when no age was re-scored (a one-step run)."""
    report = trainer.drift_report or {}
    if not report.get("ages"):
        return None
    from ..diagnose.calibrate_log import drift_record

    return {**drift_record(path, "trl"), "ages_without_rollouts": report["missing"]}


def refill_record(history: list[dict], log_history: list[dict], groups: int) -> dict | None:
    """Buffer dynamic: the generation rounds a step took (``replay/refill_rounds``), their mean over the steps, and
    E[T] of docs/THEORY.md [E11] (``theory.compute.refill_rounds``) at the run's z over every round drawn (TRL's
    frac_reward_zero_std) for g = B / G informative groups an update; None for every other buffer."""
    rounds = [float(h["replay/refill_rounds"]) for h in history if "replay/refill_rounds" in h]
    if not rounds:
        return None
    z = zero_share_of_history(log_history)
    from ..theory.compute import refill_rounds

    return {"mean": sum(rounds) / len(rounds), "steps": len(rounds), "groups": groups,
            "zero_share": None if z is None else z["value"],
            "predicted": None if z is None else float(refill_rounds(groups, z["value"]))}


def _write_results(out: Path, trainer: Any, summary: dict, checkpoints: Path) -> None:
    """The trainer log, ``run.json`` and the noise profile (when measured); then the checkpoints go."""
    lines = "".join(json.dumps({"step": h["step"], **{k2: v for k2, v in h.items() if k2 != "step"}},
                               default=str) + "\n" for h in trainer.state.log_history)
    write_new(out / TRAINER_LOG_NAME, lambda tmp: tmp.write_text(lines))
    write_new(out / RUN_NAME, lambda tmp: tmp.write_text(json.dumps(summary, indent=1, default=str)))
    if summary["noise_scale"] is not None:
        profile = json.dumps({"kind": "noise_scale", "noise_scale": summary["noise_scale"],
                              **({"zero_share": summary["zero_share"]} if summary.get("zero_share") else {}),
                              **({"drift": summary["drift"]} if summary.get("drift") else {})}, indent=1)
        write_new(out / NOISE_PROFILE_NAME, lambda tmp: tmp.write_text(profile))
    shutil.rmtree(checkpoints)  # the run is complete: its results are the files listed below


def _log_results(config: TrlRunConfig, replay: Any, trainer: Any, summary: dict, resume: Optional[Path],
                 done_before: int, out: Path, log: Callable[[str], None]) -> None:
    """The printed summary: steps and design, reward, B_noise and kappa, the files written, what to run next."""
    _, _, k, unit = reward_quarters(summary["history"])
    trained = (f"trained {config.steps} steps" if resume is None else
               f"trained steps {done_before + 1}-{config.steps} of {config.steps} (resumed)")
    log(f"{trained} in {summary['seconds']:.0f} s: N = {replay.capacity}, "
        f"B = {replay.batch_size}, R = {replay.rollouts_per_step}, buffer {replay.buffer}, loss {replay.loss}"
        + (f" ({'; '.join(replay.notes)})" if replay.notes else ""))
    reward = ("none logged" if summary["reward_first_quarter"] is None else
              f"{summary['reward_first_quarter']:.3f} (first {k} {unit}) -> {summary['reward_last_quarter']:.3f} "
              f"(last {k})")
    ratio = ("1 / the refill rounds: each round generates R" if replay.buffer == "dynamic" else
             f"B/R = {replay.replay_ratio:.3f}")
    log(f"reward: {reward}; replay ratio {trainer.replay_trained / max(trainer.replay_generated, 1):.3f} ({ratio})")
    refill = summary.get("refill_rounds")
    if refill is not None:
        exact = ("" if refill["predicted"] is None else
                 f"; E[T] = {refill['predicted']:.2f} at the run's z = {refill['zero_share']:.3f} for "
                 f"g = {refill['groups']} groups (docs/THEORY.md [E11])")
        log(f"refill rounds: {refill['mean']:.2f} generation batches a step over {refill['steps']} steps{exact}")
    from ..diagnose.calibrate_log import noise_scale_lines

    measured = len(trainer.noise_records)
    if summary["noise_scale"] is None:
        log(f"B_noise: not measured ({measured} of {config.steps} steps measured; the two-batch estimate needs 2)")
    else:
        log(noise_scale_lines(summary["noise_scale"])[0] + f" [{measured} of {config.steps} steps measured]; "
            + _kappa_text(summary["memory"], config, trainer.curvature_skipped))
    if summary.get("drift"):
        from ..diagnose.calibrate_log import drift_lines

        for line in drift_lines(summary["drift"]):
            log(line)
    wrote = [out / LOG_NAME, out / RUN_NAME, out / TRAINER_LOG_NAME] + ([out / NOISE_NAME] if measured else []) + \
        ([out / DRIFT_NAME] if summary.get("drift") else []) + \
        ([out / NOISE_PROFILE_NAME] if summary["noise_scale"] is not None else [])
    log(f"wrote {', '.join(str(p) for p in wrote)}")
    log(f"next: replay-theory diagnose {out / LOG_NAME} --preset trl")


def _clear_unfinished(out: Path, resume: Optional[Path]) -> None:
    """An unfinished run's files that its continuation does not use: every checkpoint but ``resume`` (older ones, and
    any a crash left without its marker) and, starting from step 0, the diagnose log's parts (a resumed trainer
    keeps the parts ``resume`` lists and drops the rest itself)."""
    for folder in (out / CHECKPOINT_DIR).glob(f"{CHECKPOINT_PREFIX}*"):
        if folder.is_dir() and (resume is None or folder.resolve() != Path(resume).resolve()):
            shutil.rmtree(folder)
    if resume is None:
        shutil.rmtree(out / f"{LOG_NAME}.parts", ignore_errors=True)


class TrlRunInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run`: what is saved and how to go on (:meth:`message`, one line)."""

    def __init__(self, out: Path, total: int, step: int, during_step: bool) -> None:
        super().__init__(out, total, step, during_step)
        self.out, self.total, self.step, self.during_step = Path(out), total, step, during_step

    def message(self) -> str:
        found = complete_checkpoints(self.out / CHECKPOINT_DIR)
        when = f"during step {self.step + 1}" if self.during_step else f"after step {self.step}"
        if not found:
            return (f"interrupted {when} of {self.total}, before the first checkpoint: nothing to resume from in "
                    f"{self.out}; run the same command to start again")
        saved = checkpoint_step(found[-1])
        return (f"interrupted {when} of {self.total}: model, optimizer, buffer and random state of step {saved} are "
                f"saved in {found[-1]}; run the same command to continue from step {saved + 1}")


def _stop_on_interrupt(bar: Any) -> Any:
    """A TrainerCallback that advances ``bar`` every step and turns the first Ctrl-C into "save this step, then
    stop" (Trainer saves a checkpoint and leaves its loop); a second Ctrl-C interrupts at once."""
    from transformers import TrainerCallback

    class StopOnInterrupt(TrainerCallback):
        requested = False

        def on_step_end(self, args, state, control, **kwargs):  # noqa: D102 (TrainerCallback hook)
            bar.advance()
            if self.requested:
                control.should_save = True
                control.should_training_stop = True

        def _handler(self, signum, frame):
            if self.requested:
                raise KeyboardInterrupt
            self.requested = True
            print("Ctrl-C: saving a checkpoint after this step (Ctrl-C again to stop at once)", file=sys.stderr)

        @contextmanager
        def installed(self):
            """The handler while training, in the main thread only (no other thread receives signals)."""
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = signal.signal(signal.SIGINT, self._handler)
            try:
                yield
            finally:
                signal.signal(signal.SIGINT, previous)

    return StopOnInterrupt()


def noise_record(records: list[dict], group_size: int, seed: int, path: Path) -> Optional[dict]:
    """The profile's "noise_scale" record of the run's per-step two-batch norms (None with fewer than 2 steps).

    The same pooling as ``calibrate --from-log LOG --grad-norms`` (``diagnose.calibrate_log.noise_scale_record``),
    bootstrap seeded by the run's seed; unit_size = G (the halves keep groups whole).
    """
    import numpy as np

    from ..diagnose.calibrate_log import GRAD_NORM_COLUMNS, noise_scale_record

    if len(records) < 2:
        return None
    norms = {c: np.asarray([r[c] for r in records], dtype=np.float64) for c in GRAD_NORM_COLUMNS}
    return noise_scale_record(norms, unit_size=group_size, seed=seed,
                              source=f"replay-theory trl-replay: two-batch squared gradient norms ({path.name}), "
                                     f"{len(records)} steps, halves of whole groups of {group_size}")


def _kappa_text(record: Optional[dict], config: TrlRunConfig, skipped: dict) -> str:
    """kappa for the summary's B_noise line: its value and interval, or why it is not there."""
    if record is None:
        why = "--curvature-every 0" if not config.curvature_every else (
            f"no curvature pair completed in {config.steps} steps at --curvature-every {config.curvature_every}"
            + (f"; skipped: {skipped}" if skipped else ""))
        return f"kappa not measured ({why})"
    if record["kappa"] is None:
        return f"kappa not measured: {record['reason']}"
    lo, hi = record["kappa_interval"]
    interval = "[" + ", ".join("nan" if v is None else f"{v:.3g}" for v in (lo, hi)) + "]"
    return (f"kappa = {record['kappa']:.3g} ({record['level']:.0%} interval {interval}, {record['units']} curvature "
            f"pairs, one every {config.curvature_every} steps)")


def kappa_record(records: list[dict], seed: int, path: Path) -> Optional[dict]:
    """The profile's "memory" record of the run's curvature pairs (None when no pair was completed): the same
    pooling as ``calibrate --from-log LOG --grad-norms`` (``diagnose.calibrate_log.memory_record``), bootstrap
    seeded by the run's seed."""
    import numpy as np

    from ..diagnose.calibrate_log import CURVATURE_COLUMNS, memory_record

    pairs = [r for r in records if "curvature_num" in r]
    if not pairs:
        return None
    curvature = {c: np.asarray([r[c] for r in pairs], dtype=np.float64) for c in ("step", *CURVATURE_COLUMNS)}
    curvature["batch"] = np.asarray([r["batch_big"] for r in pairs], dtype=np.float64)
    return memory_record({"curvature": curvature}, seed=seed,
                         source=f"replay-theory trl-replay: curvature pairs ({path.name}), {len(pairs)} pairs")

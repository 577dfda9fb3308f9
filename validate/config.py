"""The validation run's one typed config, and the checks the command line runs before any work.

Paper: experience-replay (docs/REFERENCES.md), Thm 3.5 checked on a language model. Light on purpose
(numpy and the Countdown task only): the command line reads the defaults and checks ``--out`` from
here without importing torch; ``validate/loop.py`` does the work.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from ..checks import Range, require_integer, require_number, require_one_of, require_unit_interval
from ..core.jobs import check_jobs
from ..core.memory import Estimate, Size, check_ceiling, check_sizes, check_threads, count, usable_cpus
from ..outputs import check_out_dir
from . import countdown


@dataclass(frozen=True)
class ValidateConfig:
    """The validation run (``validate calibrate-model``; predict and verify read it back). Field docs: CLI help."""

    model: str = "tiny"
    """'tiny' (a small Qwen2 built from its config) or a local checkpoint path / hub id."""
    device: str = "cpu"
    """cpu or cuda (bf16 autocast over fp32 weights on cuda)."""
    seed: int = 0
    """Seed of the problems, the model, the warm start and the probe (>= 0)."""
    n_train: int = 1000
    """Training problems (Countdown, seeded)."""
    n_test: int = 64
    """Held-out problems."""
    sft_steps: int = 600
    """SFT warm-start steps on solver solutions (tiny model only)."""
    rollouts_per_step: int = 64
    """R of the probe run and of every verify design (completions, a multiple of --group-size)."""
    group_size: int = 8
    """Completions per prompt (GRPO group)."""
    probe_steps: int = 24
    """RL steps of the calibration probe (FIFO buffer, GRPO); more than the largest staleness probed (8)."""
    samples: int = 1024
    """Completions per staleness value when measuring sigma^2(s) (a multiple of --group-size; the held-out reference
    batch is 4x). 1024 resolves the tiny model's retained signal r(s) above 0 at every s <= 8; 64 did not."""
    max_new_tokens: int = 16
    """Longest completion, in tokens."""
    lr: float = 3e-4
    """AdamW learning rate of the probe and verify runs."""
    engine: str = "hf"
    """Rollout engine: hf (HF sampling loop, any device), vllm (CUDA) or auto (vllm when installed, on CUDA)."""
    sync_every: int = 1
    """Updates between weight syncs trainer -> rollout engine."""
    micro_batch_size: int = 0
    """Completions per forward/backward pass of an update (0: whole batch)."""
    gpu_memory_utilization: float = 0.3
    """vLLM only: its share of the GPU (weights + KV cache); the trainer uses the rest."""
    mu_window_seconds: float = 3.0
    """Wall-clock window of the App. E count-based mu in calibrate (0: skip)."""
    price_mu: float = 5.28
    """Rollout cost in updates used to PRICE compute in predict and verify (Table 1's 5.28: Qwen2.5-7B on GPUs).
    The CPU's own timing mu is still measured and reported; give it here to price at this machine's cost."""
    threads: int = 1
    """torch CPU threads of this process. 1 by default: a second thread was slower on a 2-core machine, busy or idle
    (bench/bench_validate_threads.py measures it); results do not depend on it."""
    decode: str = "auto"
    """HF engine's decoding: auto (a static KV cache and a torch.compile'd step with CUDA graphs on cuda, the eager
    loop on cpu: its numbers unchanged), eager, static (static cache, eager step) or compiled."""

    def problems(self) -> tuple[list[countdown.Problem], list[countdown.Problem]]:
        """Three-number problems with small numbers: learnable by the tiny model (pass@1 ~ 0.2 after SFT)."""
        return countdown.make_splits(self.n_train, self.n_test, seed=self.seed, num_numbers=(3,),
                                     number_range=(1, 9), target_range=(1, 40))

    def validated(self, memory: bool = True) -> "ValidateConfig":
        """Every option checked before any work: one-line ValueError naming the option and its valid range.

        ``memory``: also calibrate-model's estimated peak against this machine's memory (``calibrate_peak_bytes``);
        predict and verify, which read a finished calibration's config back, check only its values (verify its own
        estimate, ``VerifyConfig.check_verify_memory``)."""
        check_integer("--seed", self.seed, 0)
        for option, value, low in (("--n-train", self.n_train, self.group_size), ("--n-test", self.n_test, 1),
                                   ("--sft-steps", self.sft_steps, 0), ("--group-size", self.group_size, 2),
                                   ("--rollouts-per-step", self.rollouts_per_step, self.group_size),
                                   ("--probe-steps", self.probe_steps, MAX_STALENESS + 1),
                                   ("--samples", self.samples, 2 * self.group_size),
                                   ("--max-new-tokens", self.max_new_tokens, 1), ("--sync-every", self.sync_every, 1),
                                   ("--micro-batch-size", self.micro_batch_size, 0), ("--threads", self.threads, 1)):
            check_integer(option, value, low)
        family = countdown.THREE_NUMBER_FAMILY  # make_splits cannot draw more distinct problems than the family has
        for option, value, low, high in (("--n-test", self.n_test, 1, family - self.group_size),
                                         ("--n-train", self.n_train, self.group_size, family - self.n_test)):
            if value > high:
                raise ValueError(f"{option} must be an integer in [{low}, {high}] (--n-train + --n-test <= the "
                                 f"{family} distinct problems of the family), got {value}")
        for option, value in (("--rollouts-per-step", self.rollouts_per_step), ("--samples", self.samples)):
            if value % self.group_size:
                raise ValueError(f"{option} must be a multiple of --group-size = {self.group_size}, got {value}")
        check_positive("--lr", self.lr)
        check_positive("--price-mu", self.price_mu)
        if not (math.isfinite(self.mu_window_seconds) and self.mu_window_seconds >= 0):
            raise ValueError(f"--mu-window-seconds must be a finite number >= 0 (0: skip), "
                             f"got {self.mu_window_seconds}")
        if not (math.isfinite(self.gpu_memory_utilization) and 0 < self.gpu_memory_utilization <= 1):
            raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.decode not in DECODE_MODES:
            raise ValueError(f"--decode must be one of {', '.join(DECODE_MODES)}, got {self.decode!r}")
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"--device must be cpu or cuda (cuda:N), got {self.device!r}")
        check_ceiling("--seed", self.seed, 0)
        check_threads("--threads", self.threads)
        if memory:
            self.check_calibrate_memory()
        return self

    def check_calibrate_memory(self) -> None:
        """calibrate-model's sizes within ``MAX_SIZE`` and its estimated peak within this machine's memory."""
        G = self.group_size  # the lows the checks above hold: R and --n-train whole groups, --samples two
        sizes = [dataclasses.replace(size, low={"--rollouts-per-step": G, "--n-train": G, "--samples": 2 * G}.get(
            size.name, size.low)) for size in CALIBRATE_SIZES]
        check_sizes(sizes, option_values(self), calibrate_peak_bytes, defaults=option_values(ValidateConfig()))


@dataclass(frozen=True)
class VerifyConfig:
    """verify's protocol: seeds and equal-compute budget. Field docs are the CLI help."""

    seeds: int = 4
    """Seeds per design (the default loop; --thorough: 16)."""
    budget_updates: int = 48
    """Equal-compute budget, in on-policy updates at --price-mu (default loop; --thorough: 96)."""
    group_replay: bool = False
    """Also train the three RLOO whole-group replay cells, which lie outside the (x, y) family Thm 3.5 ranks
    (12 more runs at the defaults)."""
    lr_grid: str = ""
    """Learning rates to train every design at, comma-separated (>= 3 distinct values > 0, e.g. 1.5e-4,3e-4,6e-4), or
    auto (--lr / 2, --lr, 2 --lr; the --thorough default); each design is reported at its best (grid edge flagged).
    Empty: --lr only."""
    batched: bool = False
    """Train all seeds of a design at once (validate/batched.py; bit-identical to the one-seed-at-a-time reference
    loop). Off by default: on the 2-core CPU it measured 1.11x at 16 seeds with 5.7x the peak memory (--jobs 2:
    1.98x; bench/bench_validate_batched.py); meant for a GPU, where it was not measured."""
    family: str = "neighbours"
    """Designs to train: neighbours (on-policy, the paper's prediction and its N, B doubled and halved at R =
    --rollouts-per-step) or fixed-b (at B = --rollouts-per-step: on-policy, replay at R = B/2, B/4, B/8 with N = R,
    on-policy at B/2 and B/4, the noise-scale rule's, the forgetting-aware rule's and the paper's predictions; writes
    report-fixed-b.*) or horizon (fixed-b plus replay at y = 4 with horizons x = 16 and 32; report-horizon.*) or
    reuse (fixed-b plus the trainers' knobs at B: num_iterations 2 and 4, selective and uniform replay at N = 2B, and
    optimal's printed answer; report-reuse.*). Opt-in, also under --thorough."""
    jobs: int = 1
    """Worker processes training verify's runs at once (-1: one per core), each with --threads torch threads; the
    runs are independent, so the results are the same at any count. 2 on the 2-core CPU: 1.98x (docs/VALIDATION.md)."""
    kappa: float | None = None
    """fixed-b: the optimizer's memory kappa (per-step contraction along the noise) for the forgetting-aware rule
    (theory/forgetting.py), AdamW with beta1 0.9 as verify trains. Not given: profile.json's measured memory record;
    with neither, that rule makes no prediction (said in the report)."""

    def validated(self) -> "VerifyConfig":
        check_integer("--seeds", self.seeds, 1)
        if self.kappa is not None:
            check_positive("--kappa", self.kappa)
        check_jobs(self.jobs)
        check_integer("--budget-updates", self.budget_updates, 1)
        self.learning_rates(1.0)  # the grid's own checks (auto needs no --lr to be checked)
        if self.family not in FAMILIES:
            raise ValueError(f"--family must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        k = max(REUSE_STALENESS)  # the k-step-off arm's k pre-filled batches, then two updates, fit at any mu
        if self.family == "reuse" and self.budget_updates < k + 2:
            raise ValueError(f"--budget-updates must be an integer >= {k + 2} with --family reuse (its {k}-step-off "
                             f"arm pre-fills {k} batches at step 0), got {self.budget_updates}")
        return self

    def check_verify_memory(self, config: ValidateConfig) -> None:
        """verify's sizes (--seeds, --jobs, --budget-updates) within ``MAX_SIZE`` and its estimated peak with the
        run's ``config`` (``verify_peak_bytes``) within this machine's memory, before any run is trained."""
        values = {**option_values(config), **option_values(self)}
        check_sizes(VERIFY_SIZES, values, verify_peak_bytes, defaults={**option_values(ValidateConfig()),
                                                                       **option_values(VerifyConfig())})

    def check_sizes(self, rollouts_per_step: int, group_size: int) -> None:
        """fixed-b's smallest R = B / 8 must be whole prompt groups: B a multiple of 8 x --group-size."""
        step = max(FIXED_B_REPLAY_RATIOS) * group_size
        if self.family in FIXED_B_FAMILIES and rollouts_per_step % step:
            raise ValueError(f"--family {self.family} needs --rollouts-per-step (its B) a multiple of 8 x --group-size "
                             f"= {step} (R = B/8 whole groups), got {rollouts_per_step}")

    def learning_rates(self, lr: float) -> tuple[float, ...]:
        """The grid, ascending: ``lr_grid``'s values, (lr / 2, lr, 2 lr) for ``auto``, or (lr,) when empty."""
        text = self.lr_grid.strip()
        if not text:
            return (lr,)
        if text == "auto":
            return (lr / 2, lr, 2 * lr)
        try:
            values = [float(v) for v in text.split(",")]
        except ValueError:
            raise ValueError(f"--lr-grid must be comma-separated numbers > 0 or auto, got {self.lr_grid!r}") from None
        if len(values) < 3 or any(not (math.isfinite(v) and v > 0) for v in values) or len(set(values)) < len(values):
            raise ValueError(f"--lr-grid must be >= 3 distinct finite numbers > 0 (e.g. 1.5e-4,3e-4,6e-4) or auto, "
                             f"got {self.lr_grid!r}")
        return tuple(sorted(values))


@dataclass(frozen=True)
class AllConfig(ValidateConfig, VerifyConfig):
    """``validate all``: calibrate-model's config and verify's protocol."""

    def validated(self) -> "AllConfig":
        ValidateConfig.validated(self)
        VerifyConfig.validated(self)
        self.check_sizes(self.rollouts_per_step, self.group_size)
        self.check_verify_memory(self.calibration())
        return self

    def calibration(self) -> ValidateConfig:
        names = {f.name for f in dataclasses.fields(ValidateConfig)}
        return ValidateConfig(**{k: v for k, v in dataclasses.asdict(self).items() if k in names})

    def verify(self) -> VerifyConfig:
        return VerifyConfig(self.seeds, self.budget_updates, self.group_replay, self.lr_grid, self.batched,
                            self.family, self.jobs, self.kappa)



@dataclass(frozen=True)
class RunOptions:
    """How a ``validate`` command runs, beside its config: the run directory, the sizes, the protocol, the preset."""

    out: Path
    """Run directory: new, or a validate run's to go on from (finished steps are skipped; predict reads its
    calibration.json, verify its predicted.json)."""
    tiny: bool = True
    """Small problem and probe sizes for a CPU (--full: n-train 1657, the family's 1721 problems less 64 held out;
    probe-steps 64, samples 4096 where left at their defaults)."""
    thorough: bool = False
    """The decisive verify: 16 seeds, budget 96 updates, the FIFO family only, --lr-grid auto."""
    rho: float | None = None
    """Correlation rho of Assumption 3.3 in [0, 1] for the prediction (default: the profile's fit; an out-of-range fit
    gives 0, said in the output)."""
    no_progress: bool = False
    """Hide the progress bars (stderr)."""
    preset: str | None = dataclasses.field(default=None, metadata=Range(choices=lambda: {
        name: " ".join(f"--{k.replace('_', '-')} {v}" for k, v in values.items())
        for name, values in PRESETS.items()}).field())
    """Options for a named run, applied where an option is left at its default."""

    def validated(self) -> "RunOptions":
        if self.rho is not None:
            require_unit_interval("--rho", self.rho)
        return self


@dataclass(frozen=True)
class RunOverrides:
    """predict's and verify's changes to the config calibrate-model ran with (None: keep; ``load_run_config``)."""

    price_mu: float | None = None
    """Rollout cost in updates to price compute (default: calibrate's --price-mu)."""
    device: str | None = None
    """cpu or cuda (default: calibrate's)."""
    engine: str | None = None
    """hf, vllm or auto (default: calibrate's)."""
    sync_every: int | None = None
    """Updates between weight syncs trainer -> rollout engine (default: calibrate's)."""
    micro_batch_size: int | None = None
    """Completions per forward/backward pass of an update (default: calibrate's)."""
    gpu_memory_utilization: float | None = None
    """vLLM only: its share of the GPU (default: calibrate's)."""
    threads: int | None = None
    """torch CPU threads (default: calibrate's; results do not depend on it)."""

    def validated(self) -> "RunOverrides":
        if self.price_mu is not None:
            check_positive("--price-mu", self.price_mu)
        if self.threads is not None:
            check_integer("--threads", self.threads, 1)
        return self


ENGINES = ("hf", "vllm", "auto")
DECODE_MODES = ("auto", "eager", "static", "compiled")
"""--decode (validate/sampling.py): auto is compiled on CUDA and eager on the CPU."""
FAMILIES = ("neighbours", "fixed-b", "horizon", "reuse")
FIXED_B_FAMILIES = ("fixed-b", "horizon", "reuse")
"""The families trained at a fixed B = --rollouts-per-step with the rules' picks placed in them."""
HORIZON_Y = 4
HORIZON_XS = (16, 32)
"""horizon: the fixed-b family plus replay at y = B/R = 4 with the horizons x = N/R = 16 and 32 (issue 30)."""
FIXED_B_REPLAY_RATIOS = (2, 4, 8)
"""fixed-b: replay at R = B / y, N = R (the shortest horizon), for these y (issue 23)."""
FIXED_B_SMALLER = (2, 4)
"""fixed-b: on-policy at B / these."""
REUSE_EPOCHS = (2, 4)
"""reuse: e passes over each generation of R = B in one mini-batch (TRL num_iterations, verl ppo_epochs; issue 40)."""
REUSE_STALENESS = (1, 4)
"""reuse: bounded staleness at B = R, each generation trained once, k updates after it was generated (the core stale-k
queue; k = 4 is TRL ``AsyncGRPOConfig.max_staleness``'s default, k = 1 one-step-off; docs/FRAMEWORKS.md; issue 40)."""
REUSE_HORIZON = 2
"""reuse: selective replay (only groups with unequal rewards enter the FIFO) and uniform replay at N = this x B, R = B:
the same sizes, so the pair isolates what dropping the zero-advantage groups does."""


def report_stem(family: str) -> str:
    """report.json/.md/.png for the neighbours family, report-fixed-b.* for fixed-b: both families of one calibration
    live in one run directory and share their common runs (on-policy at B, the paper's prediction)."""
    return "report" if family == "neighbours" else f"report-{family}"
MAX_STALENESS = 8
"""Largest staleness of the LM noise profile (s = 0, 1, 2, 4, 8) and largest KL lag."""
FULL_SIZES = dict(n_train=countdown.THREE_NUMBER_FAMILY - 64, probe_steps=64, samples=4096)
"""--full: the sizes --tiny (the defaults) shrinks for a CPU."""
THOROUGH = VerifyConfig(seeds=16, budget_updates=96, group_replay=False, lr_grid="auto")
"""verify --thorough: the decisive protocol (measured wall time in docs/VALIDATION.md); the step size tuned per
design on --lr / 2, --lr, 2 --lr."""



class TinyModelShape(TypedDict):
    """The tiny Qwen2's shape, as ``validate.policy.ModelConfig`` fields: ``ModelConfig(**TINY_MODEL)``."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int


TINY_MODEL = TinyModelShape(hidden_size=96, num_layers=3, num_heads=4, num_kv_heads=2, intermediate_size=192)

SFT_BATCH_SIZE = 64
SFT_LR = 3e-3
"""The tiny model's supervised warm start (validate/sft.py): batch size (completions) and AdamW learning rate, the
same for the validator (validate/loop.py) and trl-replay (validate/trl_run.py)."""

PROMPT_TOKENS = len("nums 9 9 9 target 40 =") + 1
"""Tokens of the family's longest prompt (one a character, and BOS): the rows' width is this plus max_new_tokens."""
PROBLEM_BYTES = 400
"""Bytes per generated Countdown problem while the splits are drawn (measured 171: the object and its key)."""


@dataclass(frozen=True)
class ModelShape:
    """What the memory of a Qwen2-style model grows with: its widths, depth and vocabulary."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    @property
    def params(self) -> int:
        kv = self.hidden // self.heads * self.kv_heads
        per_layer = 2 * self.hidden**2 + 2 * self.hidden * kv + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return 2 * self.vocab * self.hidden + self.layers * per_layer


def model_shape(model: str) -> ModelShape:
    """The shape of ``model``: the tiny Qwen2 (its vocabulary the Countdown alphabet and 3 special tokens), or a
    checkpoint directory's config.json (read as text, before torch is imported); the tiny one where that cannot be
    read (the loader then says why)."""
    tiny = ModelShape(TINY_MODEL["hidden_size"], TINY_MODEL["num_layers"], TINY_MODEL["num_heads"],
                      TINY_MODEL["num_kv_heads"], TINY_MODEL["intermediate_size"], len(countdown.ALPHABET) + 3)
    if model == "tiny":
        return tiny
    try:
        data = json.loads((Path(model) / "config.json").read_text())
        heads = int(data["num_attention_heads"])
        return ModelShape(int(data["hidden_size"]), int(data["num_hidden_layers"]), heads,
                          int(data.get("num_key_value_heads") or heads), int(data["intermediate_size"]),
                          int(data["vocab_size"]))
    except (OSError, ValueError, KeyError, TypeError):
        return tiny


def lm_terms(shape: ModelShape, *, train_rows: float, generate_rows: float, stored_rows: float,
             new_tokens: int, copies: float = 1) -> dict[str, float]:
    """Peak bytes of training ``shape`` in float32 with AdamW: the weights, their gradient and the two moments; one
    update's activations over ``train_rows`` rows (each layer's projections, MLP, attention weights and the logits,
    kept for the backward pass); generation of ``generate_rows`` (KV cache, logits) and ``stored_rows`` buffered
    rows (ids, masks, log-probs); ``copies`` runs of it at once (verify's workers, its batched seeds)."""
    T = PROMPT_TOKENS + new_tokens
    h, layers = shape.hidden, shape.layers
    kv = h // shape.heads * shape.kv_heads
    per_token = layers * (10 * h + 4 * shape.intermediate + 2 * shape.heads * T) + 4 * shape.vocab
    runs = "" if copies == 1 else f"{count(copies)} runs x "
    return {
        f"the model: params x (weights, gradient, AdamW's 2 moments) = {shape.params} x 4 x 4 bytes":
            copies * shape.params * 16,
        f"an update's activations: {runs}rows x tokens x layers = {count(train_rows)} x {T} x {layers}":
            copies * train_rows * T * per_token * 4,
        f"generation: rows x tokens (KV cache, logits) = {count(generate_rows)} x {T}":
            copies * generate_rows * T * (layers * 2 * kv + 4 * h + 3 * shape.vocab) * 4,
        f"the buffer's rows: rows x tokens = {count(stored_rows)} x {T}": copies * stored_rows * T * 64,
    }


LIBRARIES_BYTES = 800 * 2**20
"""Resident memory of the training stack a run imports (torch, transformers; TRL and datasets for trl-replay):
about 0.85 GiB measured for trl-replay's imports, per process."""


def option_values(config: object) -> dict[str, object]:
    """A validate config's fields by option name (``rollouts_per_step`` -> ``--rollouts-per-step``): what the size
    checks name, and what the estimates read."""
    return {"--" + f.name.replace("_", "-"): getattr(config, f.name) for f in dataclasses.fields(config)}


#: calibrate-model's sizes: the memory grows with the first five (``calibrate_peak_bytes``); the rest count steps.
CALIBRATE_SIZES = (Size("--rollouts-per-step"), Size("--samples"), Size("--max-new-tokens"), Size("--n-train"),
                   Size("--n-test"), Size("--group-size", 2, memory=False), Size("--sft-steps", 0, memory=False),
                   Size("--probe-steps", memory=False), Size("--sync-every", memory=False),
                   Size("--micro-batch-size", 0, memory=False))
#: verify's own sizes: workers (--jobs) and batched seeds multiply a run's memory; the budget counts updates.
VERIFY_SIZES = (Size("--jobs"), Size("--seeds"), Size("--budget-updates", memory=False))
GRADIENT_COORDS = 1 << 22
"""validate/calibrate.py's MAX_GRAD_COORDS: the per-sample gradients keep at most this many coordinates."""
GRADIENT_BLOCK = 32
"""validate/calibrate.py's GRAD_BLOCK: per-sample gradients held at once (reduced to group means block by block)."""
NOISE_CHECKPOINTS = 3
"""calibrate_lm's noise-scale checkpoints (validate/calibrate.py's default)."""


def _run_terms(values: dict, copies: float = 1) -> dict[str, float]:
    """One training run of the validator: its model and AdamW, a pass over min(micro-batch, R) rows, generation of R
    and the probe's FIFO of 2 R rows (``lm_terms``)."""
    R, micro = values["--rollouts-per-step"], values["--micro-batch-size"]
    rows = micro if 0 < micro < R else R
    return lm_terms(model_shape(values["--model"]), train_rows=rows, generate_rows=R, stored_rows=2 * R,
                    new_tokens=values["--max-new-tokens"], copies=copies)


def calibrate_peak_bytes(values: dict) -> Estimate:
    """Peak bytes of ``validate calibrate-model`` (``values``: ValidateConfig by option name): the probe run, the
    weight snapshots it keeps for the staleness probe, the group means of one B_noise checkpoint at a time (the
    largest, the last, holds about 5 --samples / --group-size units of k = min(params, 2^22) float64 each, factored
    in place), a block of per-sample gradients, the problems and the libraries."""
    shape = model_shape(values["--model"])
    k = min(shape.params, GRADIENT_COORDS)
    units = 5 * values["--samples"] / values["--group-size"]
    block = min(GRADIENT_BLOCK, 4 * values["--samples"])  # the reference batch is 4 --samples
    problems = values["--n-train"] + values["--n-test"]
    return Estimate({
        **_run_terms(values),
        f"the weight snapshots: {MAX_STALENESS + 1 + NOISE_CHECKPOINTS} x params = {shape.params}":
            (MAX_STALENESS + 1 + NOISE_CHECKPOINTS) * shape.params * 4,
        f"one checkpoint's gradient group means: units x coordinates = {count(units)} x {k}": units * k * 8,
        f"a block of per-sample gradients: rows x coordinates = {block} x {k}": block * k * 20,  # float32, float64,
        # scaled
        f"the problems drawn: n-train + n-test = {problems}": problems * PROBLEM_BYTES,
        "the libraries (torch, transformers)": LIBRARIES_BYTES,
    })


def verify_peak_bytes(values: dict) -> Estimate:
    """Peak bytes of ``validate verify`` (``values``: the run's ValidateConfig and VerifyConfig by option name):
    --jobs worker processes (-1: one per CPU), each with the libraries and one run, or a design's --seeds runs at once
    when --batched."""
    workers = usable_cpus() if values["--jobs"] == -1 else values["--jobs"]
    runs = workers * (values["--seeds"] if values["--batched"] else 1)
    problems = values["--n-train"] + values["--n-test"]
    return Estimate({**_run_terms(values, copies=runs),
                     f"the problems drawn: workers x (n-train + n-test) = {workers} x {problems}":
                         workers * problems * PROBLEM_BYTES,
                     f"the libraries (torch, transformers) in each of {workers} worker(s)": workers * LIBRARIES_BYTES})


VERIFY_SEEDS = VerifyConfig.seeds
"""Seeds per design in verify (CLI default of ``validate verify`` and ``validate all``)."""
VERIFY_BUDGET_UPDATES = VerifyConfig.budget_updates
"""verify's equal-compute budget, in on-policy updates (CLI default of ``validate verify`` and ``validate all``)."""


def check_integer(option: str, value, low: int) -> None:
    require_integer(option, value, low)


def check_positive(option: str, value: float) -> None:
    require_number(option, value, above=0, finite=True)


PRESETS = {
    "gpu-fixed-b": dict(device="cuda", rollouts_per_step=4096, family="fixed-b", seeds=16, batched=True,
                        budget_updates=6, samples=256, probe_steps=10,
                        n_train=countdown.THREE_NUMBER_FAMILY - 64, micro_batch_size=1024,
                        mu_window_seconds=1.0),
}
"""``validate all --preset NAME``: options for a run, each applied where the option was left at its default.
gpu-fixed-b: the fixed-B verdict where the noise-scale rule says replay pays on the tiny model (B_noise ~ 2383 per
group of 8 there, docs/VALIDATION.md: b = 0.58 at B = 4096, below the threshold 0.753 at mu = 5.28; give
--rollouts-per-step 16384 for b = 0.15), 16 seeds trained as one batch on one GPU; --samples 256 and 10 probe steps
keep the calibration's per-sample gradients to minutes; micro-batches of 1024 completions per seed bound the update's
memory (bench/gpu_check.py runs it as its verdict section)."""


def apply_preset(fields: dict, name: str | None, defaults) -> dict:
    """``fields`` (option name -> value) with preset ``name``'s values where a field equals ``defaults``' (an
    AllConfig); one-line ValueError for an unknown name. None: ``fields`` unchanged."""
    if name is None:
        return fields
    require_one_of("--preset", name, PRESETS)
    return {**fields, **{k: v for k, v in PRESETS[name].items() if fields[k] == getattr(defaults, k)}}


def protocol(seeds: int, budget_updates: int, thorough: bool, group_replay: bool = False, lr_grid: str = "",
             batched: bool = False, family: str = "neighbours", jobs: int = 1,
             kappa: float | None = None) -> VerifyConfig:
    """--thorough's seeds and budget, or the ones given; both at once is refused (which would win is a guess).

    --lr-grid may be given with --thorough: it replaces the default grid (auto)."""
    if thorough and ((seeds, budget_updates) != (VERIFY_SEEDS, VERIFY_BUDGET_UPDATES) or group_replay):
        raise ValueError("--thorough sets --seeds 16 --budget-updates 96 --group-replay false; give --thorough or "
                         "those options, not both")
    if thorough:
        return dataclasses.replace(THOROUGH, lr_grid=lr_grid or THOROUGH.lr_grid, batched=batched,
                                   family=family, jobs=jobs, kappa=kappa).validated()
    return VerifyConfig(seeds, budget_updates, group_replay, lr_grid, batched, family, jobs, kappa).validated()


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


#: What a validate run directory holds (any one marks a folder as a run of these commands, an interrupted one too).
RUN_DIR_FILES = ("warm_start", "calibration.json", "profile.json", "calibration_summary.json", "predicted.json")


def check_run_dir(out_dir: Path, needs: str | None = None) -> None:
    """``--out`` names a run directory (new, empty, or a validate run's), never a file or a folder of other files,
    and one this process can write in; ``needs``: a file it must hold."""
    out_dir = check_out_dir(out_dir, ours=lambda folder: any((folder / name).exists() for name in RUN_DIR_FILES),
                            holds=f"holds no validate run (none of {', '.join(RUN_DIR_FILES)})")
    if needs is not None and not (out_dir / needs).exists():
        step = {"calibration.json": "calibrate", "predicted.json": "predict"}[needs]
        raise ValueError(f"{str(out_dir)!r} has no {needs}: run `replay-theory validate "
                         f"{'calibrate-model' if step == 'calibrate' else step} --out {out_dir}` first")

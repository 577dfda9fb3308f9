"""RL on a Qwen2-architecture language model with the simulator's buffers and losses (not copies).

Papers (docs/REFERENCES.md): experience-replay for the FIFO buffer (N, B, R) and GRPO; M2PO,
RLOO and FreshPER for the other losses and samplers. The buffer, each step's training batch and
the compute accounting come from ``core.pipeline.Pipeline`` with a language-model backend
(``LMBackend``): the simulator and the validator run the same pipeline code.

| code name            | paper symbol | meaning                                                        |
|----------------------|--------------|----------------------------------------------------------------|
| ``rollouts_per_step``| R            | fresh completions per step (R / G prompts x G samples)          |
| ``capacity``         | N            | FIFO buffer size, in completions                                |
| ``batch_size``       | B            | completions per update                                          |
| ``group_size``       | G            | samples per prompt (group-relative advantage)                   |
| ``logp_behav``       | log mu       | behaviour token log-probs stored when the completion is added   |
| ``logp_new``         | log pi_theta | token log-probs under the current model (teacher forcing)       |

A shared numpy loss (``core/losses.py``) returns d loss / d logp_new for the sampled tokens, so the model trains on
the surrogate sum(grad_logp * logp_new) with grad_logp held constant (``core/surrogate.py``, as the trainers do).
The buffer stores completions as a ``RolloutBatch`` with one seed (S = 1).  Behaviour log-probs come from the
sampler (``logp_source="sampler"``) or from a trainer pass on the fresh completions before any update
(``"trainer"``: fresh log-ratios exactly 0); the mismatch is logged either way (``logp_mismatch_max``).  Engines,
``sync_every`` and micro-batches: docs/VALIDATION.md, 'Rollout engines'; the CUDA path (device generators, the
torch loss, a synchronised update so mu charges it its own time): 'GPU path'.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..checks import require_integer, require_number, require_one_of
from ..core.buffers import ReplayBuffer
from ..core.designs import BUFFER_DESIGNS, DesignConfig, compute_loss
from ..core.losses_torch import loss_output_torch
from ..core.metrics import TOKEN_STATS
from ..core.metrics import step_metrics as off_policy_metrics
from ..core.pipeline import Pipeline, PipelineSettings, score
from ..core.rollouts import RolloutBatch
from ..core.surrogate import gradient_tensor, surrogate
from . import countdown
from .engines import HFSampler, Sampler
from .logprobs import encode_prompts, prompt_width, sequence_logprobs
from .overlap import GenerationWorker
from .policy import Policy
from .sampling import compile_seconds


@dataclass(frozen=True)
class RLConfig(DesignConfig):
    """One RL run on the language model: a design (the simulator's ``DesignConfig`` fields) plus training settings.

    Field docs are the CLI help. Sizes count completions (``batch_size`` included, for every buffer).
    """

    steps: int = 30
    """Training steps (updates)."""
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts."""
    max_new_tokens: int = 24
    """Completion length limit L, in tokens."""
    logp_source: str = "trainer"
    """Behaviour log-probs from the trainer's forward pass (fresh log-ratios exactly 0) or the sampler."""
    sync_every: int = 1
    """Updates between weight syncs trainer -> sampler (1: every step; k: rollouts trail by up to k-1 updates)."""
    micro_batch_size: int = 0
    """Completions per forward/backward pass of an update (0: the whole batch); the update itself is the same."""
    seed: int = 0
    """Seed of the prompt draws, the buffer's sampler and the rollout engine."""

    def validated(self) -> "RLConfig":
        """One-line ValueErrors naming the field, before any work; resolves ``advantage`` to the loss's own."""
        require_one_of("logp_source", self.logp_source, ("trainer", "sampler"))
        for name in ("steps", "max_new_tokens", "sync_every"):
            require_integer(name, getattr(self, name), 1)
        require_integer("micro_batch_size", self.micro_batch_size, 0, note=" (0: whole batch)")
        for name in ("lr", "temperature"):
            require_number(name, getattr(self, name), above=0, finite=True)
        if BUFFER_DESIGNS.get(self.buffer) is not None and BUFFER_DESIGNS[self.buffer].needs_entropy:
            raise ValueError(f"buffer {self.buffer} picks replayed completions by token entropy, which the language-"
                             f"model backend does not compute; use it in the simulator")
        return self.validated_design("sync")


@dataclass
class RLResult:
    config: RLConfig
    metrics: list[dict] = field(default_factory=list)  # one dict per step
    generation_seconds: float = 0.0
    update_seconds: float = 0.0
    sync_seconds: float = 0.0  # trainer -> sampler weight copies (in neither mu side)
    compile_seconds: float = 0.0  # first calls of newly compiled decode steps (in neither mu side)
    wall_seconds: float = 0.0  # every step end to end, syncs included (overlapped: generation beside the update)
    k_inference: int = 0  # completions generated
    k_training: int = 0  # completions processed by backprop
    compute: float = math.nan  # mu x fresh completions + completions trained (the pipeline's Eq. 1-2 charge; needs mu)
    buffer: ReplayBuffer | None = None  # the buffer at the end of the run (None on-policy)

    def mu_timing(self) -> float:
        """Measured rollout cost / per-sample update cost (the tiny setting's mu, Table 1 meaning)."""
        per_rollout = self.generation_seconds / max(self.k_inference, 1)
        per_sample = self.update_seconds / max(self.k_training, 1)
        return per_rollout / per_sample if per_sample > 0 else math.nan


class LMBackend:
    """The language model as the pipeline's rollout backend (one seed): sample G completions per prompt, score them.

    ``weights`` is the ``Policy``; the ``sampler`` (HF loop or vLLM) generates, a no-grad trainer
    forward pass gives the trainer's log-probs, and the Countdown verifier gives the rewards.
    ``info`` holds the last call's sampler-vs-trainer mismatch and reward; ``generation_seconds``
    accumulates the time of every call (the generation side of mu) less the compiling of new decode steps, which
    ``compile_seconds`` accumulates apart (``validate.sampling.compile_seconds``).
    """

    def __init__(self, problems: list[countdown.Problem], config: RLConfig,
                 generator: torch.Generator | list[torch.Generator], sampler: Sampler | None = None):
        self.problems, self.config, self.generator = problems, config, generator
        self.sampler = HFSampler() if sampler is None else sampler
        self.num_prompts, self.seq_len = len(problems), config.max_new_tokens
        self.info: list[dict[str, float]] = []  # per seed
        self.generation_seconds = 0.0
        self.compile_seconds = 0.0
        self.prompt_width: int | None = None  # train_loop: the problem set's longest prompt (encode_prompts)

    def sample(self, policy: Policy, prompts: np.ndarray):
        """Completions for prompts (S, n), seed-major rows; S > 1 needs a seed-stacked policy and S generators."""
        started, compiled_before = time.perf_counter(), compile_seconds()
        config, G = self.config, self.config.group_size
        S, n = prompts.shape
        texts = [self.problems[i].prompt_text() for row in prompts for i in row[::G]]  # one prompt per group
        rollouts = self.sampler.generate(policy, texts, G, config.max_new_tokens, config.temperature, self.generator,
                                         prompt_width=self.prompt_width)
        L = config.max_new_tokens
        ids = _pad_to(rollouts.completion_ids, L, policy.tokenizer.pad_token_id)  # (S n, L)
        mask = _pad_to(rollouts.completion_mask, L, 0)  # (S n, L)
        sampler_logp = _pad_to(rollouts.logp_behav, L, 0.0)  # (S n, L)
        with torch.no_grad():
            trainer_logp = sequence_logprobs(policy, rollouts.prompt_ids, rollouts.prompt_mask, ids, mask,
                                             temperature=config.temperature)  # (S n, L)
        logp = trainer_logp if config.logp_source == "trainer" else sampler_logp
        reward = countdown.verify_batch([self.problems[i] for i in prompts.reshape(-1)],
                                        rollouts.completion_text).reshape(S, n)  # (S, n)
        mismatch = (trainer_logp - sampler_logp).abs().reshape(S, n * L).amax(dim=1)  # (S,)
        self.info = [{"logp_mismatch_max": float(mismatch[s]), "reward": float(reward[s].mean()),
                      "accuracy": float((reward[s] == 1.0).mean())} for s in range(S)]
        out = (ids.cpu().numpy().reshape(S, n, L).astype(np.int64),  # (S, n, L) each; the copies end the GPU work
               logp.cpu().numpy().reshape(S, n, L).astype(np.float64),
               mask.cpu().numpy().reshape(S, n, L).astype(bool),
               reward)  # (S, n)
        compiling = compile_seconds() - compiled_before
        self.compile_seconds += compiling
        self.generation_seconds += time.perf_counter() - started - compiling
        return out

    def entropy(self, policy, prompts, tokens, mask):
        raise ValueError("the language-model backend does not compute token entropies (RLConfig.validated refuses "
                         "the designs that need them)")

    def snapshot(self, policy):
        raise ValueError("the language-model backend runs the synchronous pipeline; stale rollouts come from "
                         "--sync-every")


def make_generator(device: torch.device | str, seed: int) -> torch.Generator:
    """The token stream of seed ``seed`` for a policy on ``device``: a CPU generator on the CPU (the numbers of every
    earlier version), one on the device on CUDA (sampling never leaves the card, ``validate/sampling.py``)."""
    device = torch.device(device)
    return torch.Generator(device=device if device.type == "cuda" else "cpu").manual_seed(seed)


LOSS_LIBRARIES = ("numpy", "torch")


def loss_library(device: torch.device | str) -> str:
    """numpy (``core/losses.py``, the reference: the CPU's numbers bit for bit) on the CPU, torch
    (``core/losses_torch.py``, equal to 1e-6) on CUDA, where the log-probs then never leave the device."""
    return "torch" if torch.device(device).type == "cuda" else "numpy"


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (CUDA), so that a timer around a step measures the step."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclasses.dataclass
class StepLoss:
    """What a step logs of its loss, on the host: value (S,) and the loss's metrics, each (S,) (``step_metrics``)."""

    loss: np.ndarray
    metrics: dict[str, np.ndarray]


def _pad_to(t: torch.Tensor, length: int, value) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, length - t.shape[1]), value=value)


def generate_batch(policy: Policy, problems: list[countdown.Problem], prompt_index: np.ndarray, config: RLConfig,
                   step: int, group_offset: int, generator: torch.Generator,
                   sampler: Sampler | None = None) -> tuple[RolloutBatch, dict]:
    """Sample G completions for each chosen prompt and score them: a one-seed RolloutBatch (1, R, L) and its info.

    The pipeline's own generation (``LMBackend`` + ``core.pipeline.score``) for callers that choose the
    prompts themselves (calibration probes, benchmarks).
    """
    backend = LMBackend(problems, config, generator, sampler)
    G = config.group_size
    prompts = np.repeat(np.asarray(prompt_index, np.int64), G)[None]  # (1, R)
    tokens, logp, mask, reward = backend.sample(policy, prompts)
    R = prompts.shape[1]
    group = (group_offset + np.repeat(np.arange(R // G), G))[None]
    batch = score(config, prompts, tokens, mask, logp, reward, np.full((1, R), step, np.int64), group)
    return batch, backend.info[0]


def _device_loss(config: RLConfig, batch: RolloutBatch, is_fresh, device: torch.device):
    """``loss_output_torch`` with the batch's fixed data on ``device``, copied once per update: a function of
    logp_new (S, B, L) alone."""
    return functools.partial(
        loss_output_torch, config,
        logp_behav=torch.as_tensor(batch.logp_behav, device=device),  # (S, B, L) float64
        advantage=torch.as_tensor(batch.advantage, device=device),  # (S, B)
        mask=torch.as_tensor(batch.mask, device=device),  # (S, B, L) bool
        is_fresh=None if is_fresh is None else torch.as_tensor(is_fresh, device=device),  # (S, B)
        reward=None if batch.reward is None else torch.as_tensor(batch.reward, device=device))


def update_step(policy: Policy, optimizer: torch.optim.Optimizer, problems: list[countdown.Problem],
                config: RLConfig, batch: RolloutBatch, is_fresh=None, prompt_width: int | None = None,
                library: str | None = None):
    """One optimizer step on a training batch (S, B, ...); returns (logp_new (S B, L) detached, the loss output).

    S = 1 for a plain policy; S seeds of a seed-stacked policy (``validate/batched.py``) train at once, rows
    seed-major: the loss is per seed, and seed s's parameters get only seed s's gradient.
    The shared numpy loss gives d loss / d logp_new; the model's gradient is that of the
    surrogate sum(grad_logp * logp_new). With ``config.micro_batch_size`` smaller than the batch,
    a no-grad pass first computes every logp_new (the losses need the whole batch at once: token
    means, M2PO's batch-level masks), then forward/backward runs chunk by chunk (micro_batch_size
    completions of every seed per chunk); the summed chunk gradients equal the whole-batch gradient.
    ``prompt_width``: pad prompts to this width (``train_loop`` passes the problem set's longest prompt).
    ``library``: the loss's array library, numpy or torch (None: ``loss_library(policy.device)``). With torch the loss
    and its gradient stay on the device; the loss output returned is then a ``StepLoss`` (value and metrics copied
    to the host once, after the backward pass, with the finite check the numpy loss makes). On CUDA the step ends
    with a device synchronisation.
    """
    library = loss_library(policy.device) if library is None else library
    require_one_of("library", library, LOSS_LIBRARIES)
    S, n = batch.prompt.shape
    prompt_ids, prompt_mask = encode_prompts(policy, [problems[i].prompt_text() for i in batch.prompt.reshape(-1)],
                                             prompt_width)  # (S B, P)
    ids = torch.as_tensor(batch.tokens.reshape(S * n, -1), device=policy.device)  # (S B, L)
    mask = torch.as_tensor(batch.mask.reshape(S * n, -1).astype(np.int64), device=policy.device)  # (S B, L)
    chunk = config.micro_batch_size or n

    def rows_of(a: int):  # rows a .. a + chunk of every seed
        if S == 1:
            return slice(a, a + chunk)
        return (torch.arange(S)[:, None] * n + torch.arange(a, min(a + chunk, n))).reshape(-1).to(policy.device)

    def logp_of(rows) -> torch.Tensor:  # (rows, L)
        return sequence_logprobs(policy, prompt_ids[rows], prompt_mask[rows], ids[rows], mask[rows],
                                 temperature=config.temperature)

    torch_loss = _device_loss(config, batch, is_fresh, policy.device) if library == "torch" else None

    def loss_of(logp: torch.Tensor):  # the shared loss on (S, B, L): numpy on the host, or torch on the device
        if torch_loss is None:
            return compute_loss(config, batch, logp.detach().cpu().double().numpy().reshape(S, n, -1), is_fresh)
        return torch_loss(logp.detach().reshape(S, n, -1))

    def to_host(out) -> StepLoss:  # torch: one copy of the value, the metrics and the finite flags, before the step
        if library == "numpy":
            return out
        names = list(out.metrics)
        host = torch.stack([out.finite.double(), out.loss, *(out.metrics[k].double() for k in names)]).cpu().numpy()
        if not host[0].all():  # as the numpy loss refuses it (core/losses.py, _logp)
            raise ValueError("logp_new must be finite on real (unmasked) tokens")
        return StepLoss(loss=host[1], metrics=dict(zip(names, host[2:])))

    optimizer.zero_grad(set_to_none=True)
    if chunk >= n:
        logp_new = logp_of(slice(None))
        out = loss_of(logp_new)
        # d surrogate / d theta = sum dL/dlogp * d logp / d theta (core/surrogate.py, the trainers' too)
        surrogate(out.grad_logp.reshape(S * n, -1), logp_new).backward()  # grad_logp (S B, L)
        logp_value = logp_new.detach()
    else:
        with torch.no_grad():
            logp_value = torch.empty(ids.shape, dtype=torch.float32, device=policy.device)  # (S B, L)
            for a in range(0, n, chunk):
                logp_value[rows_of(a)] = logp_of(rows_of(a))
        out = loss_of(logp_value)
        grad = gradient_tensor(out.grad_logp.reshape(S * n, -1), logp_value)  # (S B, L), converted once
        for a in range(0, n, chunk):
            rows = rows_of(a)
            surrogate(grad[rows], logp_of(rows)).backward()  # gradients accumulate over chunks
    out = to_host(out)
    optimizer.step()
    synchronize(policy.device)  # CUDA: the update's time is its own, not the next generation's
    return logp_value, out


def train(policy: Policy, problems: list[countdown.Problem], config: RLConfig,
          progress: Callable[[int, dict], None] | None = None, checkpoint: Path | None = None,
          checkpoint_every: int = 10, sampler: Sampler | None = None, mu: float | None = None,
          generation_threads: int = 0) -> RLResult:
    """Run ``config.steps`` RL updates on ``problems`` (the training split) and log one dict per step.

    With ``checkpoint`` (a file path) the full state (model, optimizer, buffer, both random
    generators, metrics) is saved every ``checkpoint_every`` steps, and a run started with an
    existing checkpoint continues from it exactly: the same seed gives the same result
    whether or not the run was interrupted. (With ``sync_every > 1`` the sampler's stale weights
    are not checkpointed: a resumed run syncs at its first step, so it is exact only when it
    resumes at a multiple of ``sync_every``.)

    ``sampler`` generates the rollouts (default: the HF loop; with ``sync_every > 1`` on a stale
    copy of the weights). It is synced with the trainer at the run's first step and then every
    ``sync_every`` steps, before that step's generation.

    ``generation_threads`` (stale-k designs, k >= 1, ``sync_every`` 1, the HF loop on the CPU): 0 generates in this
    process between updates; n >= 1 generates each step's batch in a worker process with n intra-op threads
    (``validate.overlap.GenerationWorker``, weights copied to it before every step) while this process updates, as an
    asynchronous k-step-off trainer does on its own share of the devices. The numbers are the same either way
    (``tests/integration/test_validate_overlap.py``); the wall time is ``RLResult.wall_seconds``
    (``bench/bench_overlap.py`` compares them).
    """
    on_step = None if progress is None else (lambda step, seed_metrics: progress(step, seed_metrics[0]))
    return train_loop(policy, problems, config, [config.seed], on_step, checkpoint, checkpoint_every, sampler, mu,
                      generation_threads)[0]


def train_loop(policy: Policy, problems: list[countdown.Problem], config: RLConfig, seeds: list[int],
               progress: Callable[[int, list[dict]], None] | None = None, checkpoint: Path | None = None,
               checkpoint_every: int = 10, sampler: Sampler | None = None,
               mu: float | None = None, generation_threads: int = 0) -> list[RLResult]:
    """``train`` for S = len(seeds) seeds at once: the one RL loop (``train`` is S = 1).

    S > 1 needs a seed-stacked ``policy`` (``validate.batched.stack_policy``). Seed s draws its prompts and buffer
    samples from ``np.random.default_rng(seeds[s])`` and its tokens from ``torch.Generator().manual_seed(seeds[s])``,
    the streams a one-seed run with ``config.seed = seeds[s]`` uses, so each seed reproduces that run
    (``tests/integration/test_validate_batched.py``). ``progress(step, metrics of every seed)``. Timings in the results
    are the whole batch's. ``generation_threads``: as ``train``'s.
    """
    config = config.validated()
    _check_overlap(config, generation_threads, sampler, policy)
    sampler = HFSampler(stale_copy=config.sync_every > 1) if sampler is None else sampler
    rng, generators = _seed_streams(policy.device, seeds)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    if generation_threads:  # a worker process generates; its token generators are these, handed over
        backend = GenerationWorker(policy, functools.partial(LMBackend, problems, config,
                                                             sampler=HFSampler(decode=sampler.decode)),
                                   generators, generation_threads)
    else:
        backend = LMBackend(problems, config, generators, sampler)
    try:
        return _run_steps(policy, problems, config, seeds, progress, checkpoint, checkpoint_every, sampler, mu,
                          optimizer, rng, generators, backend)
    finally:
        if isinstance(backend, GenerationWorker):
            backend.close()


def _check_overlap(config: RLConfig, generation_threads: int, sampler: Sampler | None, policy: Policy) -> None:
    """One-line ValueErrors for ``generation_threads`` (``train``), before any work."""
    require_integer("generation_threads", generation_threads, 0, note=" (0: no worker process)")
    if not generation_threads:
        return
    if config.buffer != "stale-k" or config.stale_k < 1 or config.sync_every != 1:
        raise ValueError(f"generation_threads >= 1 needs a stale-k design with stale_k >= 1 and sync_every = 1 (each "
                         f"batch trained at least one update after the weights it was generated from), got buffer "
                         f"{config.buffer}, stale_k = {config.stale_k}, sync_every = {config.sync_every}")
    if sampler is not None and not isinstance(sampler, HFSampler):
        raise ValueError(f"generation_threads >= 1 generates with the HF loop in a worker process, got the "
                         f"{getattr(sampler, 'name', type(sampler).__name__)} engine; use --engine hf")
    if torch.device(policy.device).type != "cpu":
        raise ValueError(f"generation_threads >= 1 runs on the CPU, the policy is on {policy.device}")


def _run_steps(policy: Policy, problems, config: RLConfig, seeds: list[int], progress, checkpoint, checkpoint_every,
               sampler: Sampler, mu: float | None, optimizer, rng, generators, backend) -> list[RLResult]:
    """``train_loop``'s steps on ``backend`` (in this process, or a ``GenerationWorker``)."""
    backend.prompt_width = fixed_prompt_width(policy, problems)
    settings = PipelineSettings(total_steps=config.steps) if mu is None else PipelineSettings(mu=mu,
                                                                                             total_steps=config.steps)
    pipeline = Pipeline(config, backend, rng, len(seeds), settings, token_dtype=np.int32)  # int32: 150K vocabularies
    results = [RLResult(dataclasses.replace(config, seed=seed), buffer=pipeline.buffer) for seed in seeds]
    first_step = 0
    if checkpoint is not None and Path(checkpoint).exists():
        first_step, rng, results = _resume(Path(checkpoint), config, seeds, policy, optimizer, rng, generators,
                                           pipeline, mu)
    synced_at = first_step
    worker = backend if isinstance(backend, GenerationWorker) else None
    if worker is not None and first_step:
        worker.push_generators()  # the resumed token streams
    for step in range(first_step, config.steps):
        t_step = time.perf_counter()
        if worker is not None:  # theta_t for this step's generation, in the worker: the update cannot change it
            worker.sync(policy)
            synced_at = step
        elif step == first_step or step % config.sync_every == 0:
            sampler.sync(policy)
            synced_at = step
        sync_seconds = time.perf_counter() - t_step
        for result in results:
            result.sync_seconds += sync_seconds
        seed_metrics = _train_step(step, step - synced_at, policy, optimizer, problems, config, backend, pipeline,
                                   results, mu, overlapped=worker is not None)
        for result in results:
            result.wall_seconds += time.perf_counter() - t_step
        if progress is not None:
            progress(step, seed_metrics)
        if checkpoint is not None and ((step + 1) % checkpoint_every == 0 or step + 1 == config.steps):
            if worker is not None:
                worker.pull_generators()  # the token streams live in the worker
            _save_state(Path(checkpoint), config, seeds, policy, optimizer, rng, generators, pipeline, results,
                        step + 1)
    return results


def _seed_streams(device, seeds: list[int]):
    """The numpy stream (prompts, buffer samples) and the torch generator(s) (tokens) of ``seeds``: one seed's own,
    or per-seed streams with the same seeds (``validate.batched.SeedStreams``)."""
    if len(seeds) == 1:
        return np.random.default_rng(seeds[0]), make_generator(device, seeds[0])
    from .batched import SeedStreams  # a PerSeedGenerator with the given seeds

    return SeedStreams(seeds), [make_generator(device, seed) for seed in seeds]


def _resume(checkpoint: Path, config: RLConfig, seeds: list[int], policy: Policy, optimizer, rng, generators,
            pipeline: Pipeline, mu: float | None) -> tuple[int, object, list[RLResult]]:
    """Load ``checkpoint`` into the model, the optimizer, the random streams and the pipeline; (the next step, the
    numpy stream, the results so far)."""
    state = _load_state(checkpoint, config, seeds)
    policy.model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if len(seeds) == 1:
        rng.bit_generator.state = state["rng"]
        generators.set_state(state["torch_rng"])
        results = [state["result"]]
    else:
        pipeline.rng = rng = state["rng"]
        for generator, torch_state in zip(generators, state["torch_rng"]):
            generator.set_state(torch_state)
        results = state["result"]
    pipeline.buffer = state["buffer"]
    pipeline.group_counter = state["group_counter"]
    for result in results:
        result.buffer = pipeline.buffer
    pipeline.k_inference, pipeline.k_training = float(results[0].k_inference), float(results[0].k_training)
    pipeline.compute[:] = 0.0 if mu is None else [result.compute for result in results]
    return state["next_step"], rng, results


def _train_step(step: int, since_sync: int, policy: Policy, optimizer, problems, config: RLConfig,
                backend: LMBackend | GenerationWorker, pipeline: Pipeline, results: list[RLResult], mu: float | None,
                overlapped: bool = False) -> list[dict]:
    """One update of every seed: the pipeline's batch (generation timed by the backend), the update, the compute
    charged, and each seed's timings, counts and metrics (returned, one dict a seed). ``overlapped``: the step's
    generation (a ``GenerationWorker``'s) runs beside the update (``Pipeline.next_batch_overlapped``), each timed on
    its own."""
    t0 = time.perf_counter()
    generation_before, compiling_before = backend.generation_seconds, backend.compile_seconds

    def update(data) -> tuple[torch.Tensor, object, float]:
        started = time.perf_counter()
        policy.model.train()
        logp, out = update_step(policy, optimizer, problems, config, data.train, data.is_fresh, backend.prompt_width)
        return logp, out, time.perf_counter() - started

    policy.model.eval()
    if not overlapped:
        data = pipeline.next_batch(step, policy)  # generation (timed by the backend) and the buffer's work
        logp_new, out, _ = update(data)
    else:  # the worker generates from its copy of this step's weights (the weights passed are not read)
        data, (logp_new, out, update_seconds) = pipeline.next_batch_overlapped(step, policy, policy, update)
    train_batch = data.train
    pipeline.after_update(step, data)  # RLOO: add the fresh groups after the update
    compute = pipeline.account(data)  # (S,) running total
    generation = backend.generation_seconds - generation_before
    compiling = backend.compile_seconds - compiling_before
    if not overlapped:
        update_seconds = time.perf_counter() - t0 - generation - compiling  # the step less its generation
    token_lr = logp_new.cpu().double().numpy().reshape(train_batch.logp_behav.shape) - train_batch.logp_behav
    seed_metrics = step_metrics(step, backend.info, out, train_batch, token_lr, data, since_sync)
    for s, result in enumerate(results):
        result.generation_seconds += generation
        result.update_seconds += update_seconds
        result.compile_seconds += compiling
        result.k_inference, result.k_training = int(pipeline.k_inference), int(pipeline.k_training)
        result.compute = math.nan if mu is None else float(compute[s])
        result.metrics.append(seed_metrics[s])
    return seed_metrics


def fixed_prompt_width(policy: Policy, problems: list[countdown.Problem]) -> int:
    """The left-padding width of every batch of a run: the problem set's longest prompt plus one.

    Why fixed: a seed's arithmetic must not depend on the prompts of the other seeds sharing its batch (S > 1),
    and S = 1 must run the same arithmetic. Why plus one: every row then has a padding column, so the Hugging Face
    model always builds its explicit attention mask; a batch without any padding would take its mask-free fast
    path, equal only up to float32 rounding (4.8e-7 in a log-prob, measured).
    """
    return prompt_width(policy, [p.prompt_text() for p in problems]) + 1


def step_metrics(step: int, info: list[dict], out, train_batch: RolloutBatch, token_lr: np.ndarray, data,
                 policy_lag: int) -> list[dict]:
    """One dict per seed: the backend's sampling info, the loss, ESS and log-ratio statistics of the trained batch.

    ``token_lr`` (S, B, L): log pi_theta - log mu of the trained tokens (before the update's step).
    """
    S = token_lr.shape[0]
    # the shared per-step metrics (core/metrics.py): sequence-level Kish ESS, token-level estimators, staleness
    fresh = data.fresh
    generated = None if fresh is None or fresh.size == 0 else (fresh.reward, fresh.group)  # z of the generated groups
    shared = off_policy_metrics(token_lr, train_batch.mask, data.staleness,
                                **({} if generated is None else {"reward": generated[0], "group": generated[1]}))
    loss_metrics = {k: np.asarray(v).reshape(S, -1)[:, 0] for k, v in out.metrics.items()
                    if k.startswith(("clip_ratio", "pg_clipfrac", "masked_frac", "is_ratio"))}
    return [{
        "step": step,
        **info[s],
        "loss": float(out.loss[s]),
        "ess_frac": float(shared["ess_frac"][s]),
        "log_ratio_abs_max": float(shared["log_ratio_abs_max"][s]),
        "staleness_mean": float(shared["staleness_mean"][s]),
        "policy_lag": policy_lag,  # updates the sampler's weights trail the trainer's
        **({} if generated is None else {"frac_reward_zero_std": float(shared["frac_reward_zero_std"][s])}),
        **{k: float(shared[k][s]) for k in TOKEN_STATS},
        **{k: float(v[s]) for k, v in loss_metrics.items()},
    } for s in range(S)]


def _save_state(path: Path, config, seeds, policy, optimizer, rng, generators, pipeline, results,
                next_step: int) -> None:
    """Atomic: written to a temporary file, then renamed over the previous checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    one = len(seeds) == 1
    torch.save({"config": asdict(config), "seeds": list(seeds), "model": policy.model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "rng": rng.bit_generator.state if one else rng,  # S > 1: the SeedStreams object (its block)
                "torch_rng": generators.get_state() if one else [g.get_state() for g in generators],
                "buffer": pipeline.buffer, "group_counter": pipeline.group_counter,
                "result": (dataclasses.replace(results[0], buffer=None) if one
                           else [dataclasses.replace(r, buffer=None) for r in results]),
                "next_step": next_step}, tmp)
    os.replace(tmp, path)


def checkpoint_next_step(path: Path) -> int:
    """The step a checkpointed run continues from (0 if there is no checkpoint)."""
    if not Path(path).exists():
        return 0
    try:
        return int(torch.load(path, weights_only=False)["next_step"])
    except Exception:  # noqa: BLE001 - train() reports the corrupt file with the fix
        return 0


def _load_state(path: Path, config, seeds) -> dict:
    try:
        state = torch.load(path, weights_only=False)  # our own file: it holds the buffer object
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same user error
        raise ValueError(f"checkpoint {str(path)!r} is corrupt or incomplete ({type(err).__name__}); "
                         f"delete it to start the run over") from None
    if state.get("config") != asdict(config) or state.get("seeds", [config.seed]) != list(seeds):
        raise ValueError(f"checkpoint {str(path)!r} belongs to a different run configuration; delete it or "
                         f"use another --out")
    return state


def evaluate_policy(policy: Policy, problems: list[countdown.Problem], num_samples: int, temperature: float,
                    max_new_tokens: int, seed: int, ks=(1, 4), sampler: Sampler | None = None) -> dict:
    """Mean reward, fraction correct, pass@1 and unbiased pass@k on ``problems`` (seeded).

    ``sampler`` (default: the HF loop) is first synced to ``policy``: evaluation is always on-policy.
    """
    return evaluate_policies(policy, problems, num_samples, temperature, max_new_tokens, [seed], ks, sampler)[0]


def evaluate_policies(policy: Policy, problems: list[countdown.Problem], num_samples: int, temperature: float,
                      max_new_tokens: int, seeds: list[int], ks=(1, 4), sampler: Sampler | None = None) -> list[dict]:
    """``evaluate_policy`` of each seed of a seed-stacked policy (S = len(seeds)), all at once; seed s samples with
    ``torch.Generator().manual_seed(seeds[s])``, as ``evaluate_policy(..., seed=seeds[s])`` on its own weights."""
    generators = [make_generator(policy.device, seed) for seed in seeds]
    policy.model.eval()
    sampler = HFSampler() if sampler is None else sampler
    sampler.sync(policy)
    S, P = len(seeds), len(problems)
    rollouts = sampler.generate(policy, [p.prompt_text() for p in problems] * S, num_samples, max_new_tokens,
                                temperature, generators[0] if S == 1 else generators,
                                prompt_width=fixed_prompt_width(policy, problems))
    owners = [p for p in problems for _ in range(num_samples)] * S
    reward = countdown.verify_batch(owners, rollouts.completion_text).reshape(S, P, num_samples)
    return [countdown.evaluate_samples(reward[s] == 1.0, ks=ks, rewards=reward[s]) for s in range(S)]

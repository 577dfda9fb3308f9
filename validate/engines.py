"""Rollout engines of the validator: what turns prompts into completions and behaviour log-probs.

Paper: experience-replay (docs/REFERENCES.md), Sec. 2 and App. E:
inference workers generate rollouts with weights pushed from the trainers, so a rollout's
behaviour policy mu can trail the trainer's pi_theta by a few updates (off-policiness).

Two engines implement one interface, ``Sampler``:

* ``HFSampler`` (``--engine hf``, any device): ``validate.sampling.generate``, the hand-written
  KV-cached loop, decoding as ``--decode`` says (``validate.sampling.default_decode``: the eager loop on the CPU, a
  static KV cache and a compiled step on CUDA). With ``sync_every = 1`` it samples from the trainer's own model
  (syncing is free); with ``sync_every > 1`` it keeps a copy of the weights that is refreshed only at sync
  steps, so the staleness semantics of the vLLM path can be run and tested on a CPU.
* ``VLLMSampler`` (``--engine vllm``, CUDA only; ``validate/vllm_engine.py``): ``vllm.LLM`` with
  weights copied from the trainer at sync steps.

Only generation and weight loading differ. Prompt encoding (the trainer's tokenizer), rewards,
buffers, losses, the update and all logging are the same code for both (``validate/rl.py``).

| code name     | paper symbol | meaning                                                        |
|---------------|--------------|----------------------------------------------------------------|
| ``sync``      | -            | copy theta_t into the engine: later rollouts come from pi_t     |
| ``sync_every``| -            | updates between syncs; rollouts trail the trainer by < sync_every |
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Protocol, Sequence

import torch

from ..checks import require_one_of
from . import vllm_engine as _vllm_engine  # module reference: tests patch vllm_engine.vllm_available
from .policy import Policy, resolve_device
from .sampling import DECODE_MODES, Rollouts, default_decode, generate
from .vllm_engine import VLLMSampler  # imports vllm itself only when one is built

ENGINES = ("hf", "vllm", "auto")


class Sampler(Protocol):
    """Generates ``num_samples`` completions per prompt, prompt-major, with per-token behaviour log-probs.

    ``generate`` returns a ``validate.sampling.Rollouts`` with the conventions documented in
    ``validate/sampling.py`` and ``validate/logprobs.py`` (left-padded prompts, right-padded
    completions including the stop token, ``logp_behav`` under the temperature-scaled sampling
    distribution, 0 on padding).
    ``sync(policy)`` makes later calls sample from ``policy``'s current weights.
    """

    name: str

    def sync(self, policy: Policy) -> None: ...

    def generate(self, policy: Policy, prompts: Sequence[str], num_samples: int, max_new_tokens: int,
                 temperature: float, generator: torch.Generator | Sequence[torch.Generator], *,
                 prompt_width: int | None = None) -> Rollouts: ...


class HFSampler:
    """``validate.sampling.generate`` on the trainer's model, or on a copy refreshed only by ``sync``."""

    name = "hf"

    def __init__(self, stale_copy: bool = False, decode: str = "auto"):
        require_one_of("--decode", decode, DECODE_MODES)
        self.stale_copy = stale_copy
        self.decode = decode
        self._copy: Policy | None = None

    def sync(self, policy: Policy) -> None:
        if not self.stale_copy:
            return  # generation reads the trainer's weights directly: always in sync
        if self._copy is None:
            self._copy = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
        else:
            self._copy.model.load_state_dict(policy.model.state_dict())

    def generate(self, policy: Policy, prompts: Sequence[str], num_samples: int, max_new_tokens: int,
                 temperature: float, generator: torch.Generator | Sequence[torch.Generator], *,
                 prompt_width: int | None = None) -> Rollouts:
        decode = default_decode(policy.device, self.decode)
        if not self.stale_copy:
            return generate(policy, prompts, num_samples, max_new_tokens, temperature, generator,
                            prompt_width=prompt_width, decode=decode)
        if self._copy is None:
            raise RuntimeError("HFSampler(stale_copy=True).generate called before sync(policy)")
        return generate(self._copy, prompts, num_samples, max_new_tokens, temperature, generator,
                        prompt_width=prompt_width, decode=decode)


def resolve_engine(engine: str, device: str) -> str:
    """'hf' or 'vllm' for ``--engine hf|vllm|auto`` on ``--device``; one-line ValueError with the fix otherwise.

    ``auto`` picks vLLM when it is installed, a GPU is visible and the trainer is on CUDA
    (a CPU trainer would pay a GPU-to-CPU weight copy every sync), else the HF loop.
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine '{engine}'; use --engine hf, vllm or auto")
    is_cuda = _device_type(device) == "cuda"
    if engine == "auto":
        return "vllm" if (_vllm_engine.vllm_available() and is_cuda and torch.cuda.is_available()) else "hf"
    if engine == "vllm":
        _vllm_engine.require_vllm()
        if not is_cuda:
            raise ValueError(f"--engine vllm generates on a GPU but --device is '{device}'; "
                             "add --device cuda, or use --engine hf on a CPU")
        resolve_device(device)  # CUDA requested without a GPU: the same one-line error as the trainer's
    return engine


def _device_type(device: str) -> str:
    try:
        return torch.device(device).type
    except (RuntimeError, TypeError):
        return resolve_device(device).type  # raises the one-line "unknown device" error


def make_sampler(engine: str, *, device: str = "cpu", sync_every: int = 1, model_path: str | None = None,
                 seed: int = 0, gpu_memory_utilization: float = 0.3, max_model_len: int | None = None,
                 decode: str = "auto") -> Sampler:
    """The sampler for a resolved or unresolved ``engine`` name (vLLM needs ``model_path``: a checkpoint directory).
    ``decode``: the HF loop's ``--decode`` (``validate.sampling.DECODE_MODES``)."""
    engine = resolve_engine(engine, device)
    if engine == "hf":
        return HFSampler(stale_copy=sync_every > 1, decode=decode)
    if model_path is None:
        raise ValueError("the vLLM engine needs a checkpoint directory (model_path) to start from")
    return VLLMSampler(model_path, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                       max_model_len=max_model_len)

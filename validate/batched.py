"""Seeds as a batch axis: S copies of the policy trained at once, each with its own random streams.

Paper: experience-replay (docs/REFERENCES.md): verify trains every design of Thm 3.5's family with several
seeds; here the seeds of one design train together, as the simulator's engine does (purejaxrl-style: the seed
axis first). The sequential loop (one seed after another, ``validate.rl.train``) stays the reference; one RL
loop serves both (``validate.rl.train_loop`` with S seeds), and the buffers, losses and compute accounting are
the simulator's (``core/pipeline.py``), which already take a leading seed axis.

How S models run as one: ``stack_policy`` copies the Qwen2 model and replaces each module that holds weights by a
seed-stacked one whose parameters gain a leading axis S: ``nn.Linear`` -> ``SeedLinear`` (a batched matmul,
``torch.bmm`` / ``baddbmm``, weight (S, out, in)), the token embedding -> ``SeedEmbedding`` (weight (S, V, d), the
tied LM head reads the same tensor) and ``Qwen2RMSNorm`` -> ``SeedRMSNorm`` (weight (S, d)). Everything else
(rotary embeddings, masks, attention, the KV cache, sampling, log-probs) is the unchanged Hugging Face,
``validate/sampling.py`` and ``validate/logprobs.py`` code running on S x n rows, seed-major:
rows s n .. (s + 1) n - 1 belong to seed s, and a seed-stacked module reshapes its input to (S, n ..., d) so that
seed s's rows meet only seed s's weights. This is the "equivalent batched model" of issue 23 rather than
``torch.func.vmap(functional_call)``: the HF forward builds masks and caches with Python control flow that vmap
cannot trace, and the batched matmul of one seed runs the same kernel as the sequential ``F.linear`` (the tests
measure the two equal to the bit on the forward pass).

| code name      | meaning                                                                   |
|----------------|---------------------------------------------------------------------------|
| ``S``          | seeds trained together (a design's seeds, or those of them not finished)  |
| ``seeds``      | each seed's own stream seed: numpy (prompts, buffer draws) and torch (tokens) |
| ``SeedStreams``| the per-seed numpy generators, drawn as one with the seed axis first      |
"""

from __future__ import annotations

import copy
import dataclasses
from typing import cast

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..checks import require_integer
from ..core.rng import PerSeedGenerator
from .policy import Policy

__all__ = ["SeedEmbedding", "SeedLinear", "SeedRMSNorm", "SeedStreams", "num_seeds", "seed_state_dict",
           "stack_policy"]


class SeedStreams(PerSeedGenerator):
    """``PerSeedGenerator`` whose seed s is ``np.random.default_rng(seeds[s])``: the generator a one-seed run with
    ``RLConfig.seed = seeds[s]`` uses (``validate.rl.train``), so batched draws equal sequential ones bit for bit."""

    def __init__(self, seeds: list[int]):
        super().__init__(0, len(seeds))
        self._generators = [np.random.default_rng(seed) for seed in seeds]
        if self._batched:
            self._load_words()  # each seed's half-used 32-bit word, from its own bit generator


class SeedLinear(nn.Module):
    """S linear maps y = x W_s^T + b_s, one per seed; input rows seed-major (S n, ..., in)."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None):
        super().__init__()
        self.weight = weight  # (S, out, in)
        self.bias = bias  # (S, out) or None
        self.num_seeds = weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x3 = x.reshape(self.num_seeds, -1, shape[-1])  # (S, n ..., in)
        weight_t = self.weight.transpose(1, 2)  # (S, in, out), a view as in F.linear's x @ W.T
        y = torch.bmm(x3, weight_t) if self.bias is None else torch.baddbmm(self.bias.unsqueeze(1), x3, weight_t)
        return y.reshape(*shape[:-1], y.shape[-1])  # (S n, ..., out)


class SeedEmbedding(nn.Module):
    """S token embeddings; ids (S n, T) seed-major -> (S n, T, d). ``padding_idx`` as ``nn.Embedding``'s: a look-up
    of it passes no gradient to the table (the tied LM head still trains that row, as in the original)."""

    def __init__(self, weight: nn.Parameter, padding_idx: int | None):
        super().__init__()
        self.weight = weight  # (S, V, d)
        self.padding_idx = padding_idx
        self.num_seeds = weight.shape[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        S, V, d = self.weight.shape
        offset = torch.arange(S, device=ids.device)[:, None] * V  # (S, 1): seed s reads rows s V .. (s + 1) V - 1
        flat = ids.reshape(S, -1) + offset  # (S, n T)
        out = F.embedding(flat, self.weight.reshape(S * V, d)).reshape(*ids.shape, d)  # (S n, T, d)
        if self.padding_idx is None:
            return out
        return torch.where((ids == self.padding_idx)[..., None], out.detach(), out)  # same values, no gradient


class SeedRMSNorm(nn.Module):
    """S copies of ``Qwen2RMSNorm``: the same float32 arithmetic, weight (S, d)."""

    def __init__(self, weight: nn.Parameter, eps: float):
        super().__init__()
        self.weight = weight  # (S, d)
        self.variance_epsilon = eps
        self.num_seeds = weight.shape[0]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype, shape = hidden_states.dtype, hidden_states.shape
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        scaled = self.weight[:, None, :] * hidden_states.to(input_dtype).reshape(self.num_seeds, -1, shape[-1])
        return scaled.reshape(shape)  # (S n, ..., d)


def _stacked(tensor: torch.Tensor, S: int) -> nn.Parameter:
    return nn.Parameter(tensor.detach().unsqueeze(0).repeat(S, *([1] * tensor.dim())).contiguous())  # (S, ...)


def stack_policy(policy: Policy, num_seeds: int) -> Policy:
    """A ``Policy`` whose model is ``num_seeds`` copies of ``policy``'s, stacked on a leading seed axis.

    Every seed starts from ``policy``'s weights (verify's seeds all start from the warm start). The model is a
    deep copy with its weight-holding modules replaced (module docstring); the tied LM head and the embedding share
    one (S, V, d) parameter, as they share one (V, d) in the original. A model with any other kind of weight is
    refused (one line), rather than trained with one copy shared by every seed.
    """
    require_integer("num_seeds", num_seeds, 1)
    model = copy.deepcopy(policy.model)
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    tied = model.lm_head.weight is inner.embed_tokens.weight
    embedding = SeedEmbedding(_stacked(inner.embed_tokens.weight, num_seeds), inner.embed_tokens.padding_idx)
    inner.embed_tokens = embedding
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and not (module is model and name == "lm_head"):
                bias = None if child.bias is None else _stacked(child.bias, num_seeds)
                setattr(module, name, SeedLinear(_stacked(child.weight, num_seeds), bias))
            elif type(child).__name__.endswith("RMSNorm"):
                eps = cast(float, child.variance_epsilon)  # a float attribute (Module.__getattr__'s stub: a Tensor)
                setattr(module, name, SeedRMSNorm(_stacked(child.weight, num_seeds), eps))
    head = model.lm_head
    model.lm_head = SeedLinear(embedding.weight if tied else _stacked(head.weight, num_seeds),
                               None if head.bias is None else _stacked(head.bias, num_seeds))
    seeded = (SeedLinear, SeedEmbedding, SeedRMSNorm)
    plain = [f"{name}.{p}" for name, m in model.named_modules() if not isinstance(m, seeded)
             for p, _ in m.named_parameters(recurse=False)]
    if plain:
        raise ValueError(f"cannot stack seeds of this model: parameters {plain[:3]} are not in a stacked module; "
                         "train its seeds one after another (leave out --batched)")
    return dataclasses.replace(policy, model=model)


def num_seeds(policy: Policy) -> int:
    """S of a seed-stacked policy (1 for a plain one)."""
    head = policy.model.lm_head
    return head.num_seeds if isinstance(head, SeedLinear) else 1


def seed_state_dict(stacked: Policy, seed: int) -> dict[str, torch.Tensor]:
    """Seed ``seed``'s weights under the original model's names: ``load_state_dict`` of a plain copy takes them."""
    out = {}
    for name, value in stacked.model.state_dict().items():
        out[name] = value[seed].clone()  # (S, ...) -> (...)
    return out

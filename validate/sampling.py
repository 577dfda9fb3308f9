"""The validator's sampler: a KV-cached sampling loop that records the behaviour log-probs.

Paper: RLOO group replay (docs/REFERENCES.md), Sec. 3.1-3.3: K responses are sampled per prompt
(Eq. (1)'s group) and the behaviour log-probability log mu(y_i | x_i) of Eq. (2) is stored when a
group is sampled.

* ``generate``: a hand-written KV-cached sampling loop (``torch.multinomial``
  with an explicit ``torch.Generator``, so the same seed gives the same
  samples) that records the behaviour log-probs ``logp_behav`` of the sampled
  tokens from the sampling forward pass itself; it returns ``Rollouts``.
* ``_cache_argument``: the KV cache as the next forward's keyword, across transformers versions.

This is the HF engine of ``validate/engines.py``; the vLLM one (``validate/vllm_engine.py``) returns
the same ``Rollouts``. Padding, positions and log-prob conventions are those of ``validate/logprobs.py``.
In addition:

* Rows: ``generate`` returns ``B * num_samples`` rows, prompt-major: row
  ``i * num_samples + k`` is sample k of prompt i (``Rollouts.prompt_index``),
  i.e. a ``(B, K)`` reshape gives the RLOO groups.
* Temperature: ``logp_behav`` is the log-prob under the SAMPLING distribution,
  ``log_softmax(logits / T)`` (after top-k/top-p truncation if those are used,
  renormalised). ``sequence_logprobs(..., temperature=T)`` computes the same
  distribution, so with equal weights the log-ratio of fresh data is ~0.

| code name          | paper symbol                    | where                      |
|--------------------|---------------------------------|----------------------------|
| ``logp_behav``     | log mu(y_t given x, y_<t)       | RLOO Eq. (2): stored at sampling time |
| ``num_samples``    | K (8)                           | RLOO Eq. (1)               |
| ``temperature``    | sampling temperature (1.0)      | RLOO Sec. 4, training configuration |
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Sequence

import torch

from .logprobs import encode_prompts
from .policy import Policy


@dataclass
class Rollouts:
    """Sampled completions, ``N = B * num_samples`` rows, prompt-major (row i*K + k)."""

    prompt_ids: torch.Tensor  # (N, P) long, left-padded
    prompt_mask: torch.Tensor  # (N, P) long
    completion_ids: torch.Tensor  # (N, L) long, right-padded with pad_token_id; L <= max_new_tokens
    completion_mask: torch.Tensor  # (N, L) long; 1 on sampled tokens including the EOS
    completion_text: list[str]  # N strings, special tokens removed
    logp_behav: torch.Tensor  # (N, L) float32, log mu of the sampled tokens at temperature T; 0 on padding
    prompt_index: torch.Tensor  # (N,) long: which prompt each row answers
    finished: torch.Tensor  # (N,) bool: stopped at a stop token (False = cut at max_new_tokens)


def _truncate(logp: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then top-p (nucleus) truncation of log-probs (N, V), renormalised."""
    if top_k and top_k < logp.shape[-1]:
        kth = logp.topk(top_k, dim=-1).values[:, -1:]  # (N, 1)
        logp = logp.masked_fill(logp < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logp, order = logp.sort(dim=-1, descending=True)  # (N, V)
        mass_before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()  # probability above each token
        drop_sorted = mass_before >= top_p  # always keeps the most likely token
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = logp.masked_fill(drop, float("-inf"))
    return torch.log_softmax(logp, dim=-1)


@torch.no_grad()
def generate(
    policy: Policy,
    prompts: Sequence[str],
    num_samples: int,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator | Sequence[torch.Generator],
    *,
    top_k: int = 0,
    top_p: float = 1.0,
    prompt_width: int | None = None,
) -> Rollouts:
    """Sample ``num_samples`` completions per prompt with a KV-cached loop; deterministic given ``generator``.

    Each step takes the logits of the last position, forms the sampling
    distribution ``log_softmax(logits / temperature)`` in float32 (then top-k /
    top-p if asked, renormalised), draws with ``torch.multinomial(.., generator)``
    and records the drawn token's log-prob under that distribution as
    ``logp_behav``. A row stops after a stop token (EOS); later columns are padding.
    ``generator`` may live on the CPU or on ``policy.device``. A list of S generators splits the rows into S
    equal consecutive blocks (the seeds of a seed-stacked policy, ``validate/batched.py``) and draws block s
    with generator s only, so each seed's tokens are what its own generator gives it sampling alone.
    ``prompt_width``: pad prompts to at least this many tokens (``encode_prompts``).
    """
    if num_samples < 1 or max_new_tokens < 1:
        raise ValueError(f"num_samples={num_samples}, max_new_tokens={max_new_tokens}; both must be >= 1")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature}; must be > 0 (use top_k=1 for greedy decoding)")
    if not 0.0 < top_p <= 1.0 or top_k < 0:
        raise ValueError(f"top_k={top_k}, top_p={top_p}; need top_k >= 0 and 0 < top_p <= 1")
    model, device = policy.model, policy.device
    pad_id = policy.tokenizer.pad_token_id
    was_training = model.training
    model.eval()

    prompt_ids, prompt_mask = encode_prompts(policy, prompts, prompt_width)  # (B, P)
    prompt_ids = prompt_ids.repeat_interleave(num_samples, dim=0)  # (N, P), row i*K + k
    prompt_mask = prompt_mask.repeat_interleave(num_samples, dim=0)  # (N, P)
    prompt_index = torch.arange(len(prompts)).repeat_interleave(num_samples)  # (N,)
    n_rows = prompt_ids.shape[0]
    prompt_len = prompt_mask.sum(1)  # (N,)
    stop_ids = torch.tensor(policy.stop_token_ids, device=device)
    generators = [generator] if isinstance(generator, torch.Generator) else list(generator)
    if not generators or n_rows % len(generators):
        raise ValueError(f"{len(generators)} generators for {n_rows} rows; the rows must split into equal blocks")
    block = n_rows // len(generators)  # rows per generator (per seed)

    tokens = torch.full((n_rows, max_new_tokens), pad_id, dtype=torch.long, device=device)  # (N, T)
    logp_behav = torch.zeros((n_rows, max_new_tokens), dtype=torch.float32, device=device)  # (N, T)
    alive_cols = torch.zeros((n_rows, max_new_tokens), dtype=torch.long, device=device)  # (N, T)
    finished = torch.zeros(n_rows, dtype=torch.bool, device=device)  # (N,)

    def forward(**inputs):
        with policy.autocast():  # bf16 on CUDA, as in training; nothing on CPU
            return model(**inputs)

    attention_mask = prompt_mask
    out = forward(
        input_ids=prompt_ids,
        attention_mask=attention_mask,
        position_ids=(prompt_mask.cumsum(1) - 1).clamp(min=0),
        use_cache=True,
        logits_to_keep=1,
    )
    steps = 0
    for t in range(max_new_tokens):
        logp_all = torch.log_softmax(out.logits[:, -1].float() / temperature, dim=-1)  # (N, V)
        if top_k or top_p < 1.0:
            logp_all = _truncate(logp_all, top_k, top_p)
        probs = logp_all.exp()  # (N, V)
        if generators[0].device.type != probs.device.type:
            probs = probs.to(generators[0].device)
        token = torch.cat([torch.multinomial(probs[i * block:(i + 1) * block], 1, generator=g)
                           for i, g in enumerate(generators)]).to(device).squeeze(1)  # (N,): block i from stream i
        alive = ~finished  # (N,)
        token = torch.where(alive, token, torch.full_like(token, pad_id))
        tokens[:, t] = token
        logp_behav[:, t] = torch.where(alive, logp_all.gather(-1, token[:, None]).squeeze(1), 0.0)
        alive_cols[:, t] = alive.long()
        finished = finished | (alive & torch.isin(token, stop_ids))
        steps = t + 1
        if bool(finished.all()) or steps == max_new_tokens:
            break
        attention_mask = torch.cat([attention_mask, alive.long()[:, None]], dim=1)  # (N, P + t + 1)
        out = forward(
            input_ids=token[:, None],
            attention_mask=attention_mask,
            position_ids=(prompt_len + t)[:, None],  # same positions as sequence_logprobs
            use_cache=True,
            **_cache_argument(model, out),
        )
    model.train(was_training)

    completion_ids = tokens[:, :steps]
    completion_mask = alive_cols[:, :steps]
    texts = [
        policy.tokenizer.decode(row[m.bool()].tolist())
        for row, m in zip(completion_ids.cpu(), completion_mask.cpu())
    ]
    return Rollouts(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        completion_text=texts,
        logp_behav=logp_behav[:, :steps],
        prompt_index=prompt_index.to(device),
        finished=finished,
    )


def _cache_argument(model, out) -> dict:
    """The KV cache of ``out`` as the next forward's keyword: ``cache`` from transformers 5.24 on (``past_key_values``
    is deprecated there and removed in 5.40), ``past_key_values`` before (the validate extra allows >= 4.44)."""
    return {"cache": out.cache} if _takes_cache(type(model)) else {"past_key_values": out.past_key_values}


@functools.lru_cache(maxsize=None)
def _takes_cache(model_class: type) -> bool:
    return "cache" in inspect.signature(model_class.forward).parameters

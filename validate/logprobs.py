"""Prompt encoding and teacher-forced log-probs of a validator policy.

Paper: RLOO group replay (docs/REFERENCES.md), Sec. 3.3-3.4: the current log-probabilities
log pi_theta(y_i | x_i) of Eq. (2) are recomputed at every reuse of a group, and the entropy
bonus of Eq. (3) is taken over the same next-token distributions.  Prompt encoding is shared by sampling, the vLLM
sampler and SFT; ``next_token_logprobs`` (the whole vocabulary) serves the exact KL of ``validate/calibrate.py``.

Conventions (shared with ``validate/sampling.py``, whose ``Rollouts`` these functions read):

* Padding: prompts are LEFT-padded (every prompt ends at the same column, so
  generation appends on the right); completions are RIGHT-padded with
  ``pad_token_id`` and ``completion_mask == 0``. A completion includes its EOS
  token (mask 1) when it stopped; it is cut at ``max_new_tokens`` otherwise.
* Positions: ``position_ids = cumsum(mask) - 1`` over ``[prompt, completion]``,
  so left padding never shifts the positions of real tokens.
* Log-probs are per token, float32, exactly 0.0 on padding; a sequence log-prob
  is their sum over the completion (RLOO Eq. (2) uses the sequence ratio).
* Temperature: ``sequence_logprobs(..., temperature=T)`` computes ``log_softmax(logits / T)``, the
  distribution the sampler draws from, so with equal weights the log-ratio of fresh data is ~0 (1e-6
  in float32); at T = 1 (the paper's training temperature) it is plain log pi.

| code name          | paper symbol                    | where                      |
|--------------------|---------------------------------|----------------------------|
| ``token_logp``     | log pi_theta(y_t given x, y_<t) | RLOO Eq. (2), (3)          |
| ``token_entropy``  | H[pi_theta(. given x, y_<t)]    | RLOO Eq. (3), beta_H term (here without grad) |
| ``logp_all``       | log pi_theta(. given x, y_<t)   | the whole vocabulary, (B, L, V) |
"""

from __future__ import annotations

from typing import Literal, Sequence, overload

import torch

from ..checks import require_number
from .policy import Policy
from .tokenizer import pad_batch


def prompt_token_ids(policy: Policy, prompts: Sequence[str]) -> list[list[int]]:
    """Token ids of each prompt, with BOS where the tokenizer has one; shared by sampling and SFT."""
    seqs = [policy.tokenizer.encode(p, add_bos=True) for p in prompts]
    if any(len(s) == 0 for s in seqs):
        raise ValueError("a prompt encodes to zero tokens; every prompt needs at least one token")
    return seqs


def encode_prompts(policy: Policy, prompts: Sequence[str],
                   width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(prompt_ids, prompt_mask)``, ``(B, P)`` long, on ``policy.device``; P >= ``width``.

    A fixed ``width`` (the longest prompt of the problem set, ``prompt_width``) makes a row's arithmetic independent
    of which other prompts share its batch: left padding shifts the columns attention reduces over, which moves
    log-probs by float32 rounding (2.4e-7 measured on the tiny model).
    """
    ids, mask = pad_batch(prompt_token_ids(policy, prompts), policy.tokenizer.pad_token_id, left_pad=True,
                          width=width)
    return ids.to(policy.device), mask.to(policy.device)


def prompt_width(policy: Policy, prompts: Sequence[str]) -> int:
    """The longest of ``prompts`` in tokens: the fixed left-padding width of every batch drawn from them."""
    return max(len(ids) for ids in prompt_token_ids(policy, prompts))


def next_token_logprobs(policy: Policy, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                        completion_ids: torch.Tensor, completion_mask: torch.Tensor, *,
                        temperature: float = 1.0) -> torch.Tensor:
    """The full teacher-forced next-token log-distribution at every completion position: (B, L, V), float32.

    ``logp_all[b, t] = log_softmax(logits / temperature)[b, P - 1 + t]``, the distribution
    pi(. given x, y_<t) the t-th completion token is drawn from, over the whole vocabulary
    (computed in float32). Rows at padding positions (``completion_mask == 0``) are the model's
    distribution after the padding tokens: callers mask them. Differentiable w.r.t. the model.
    Memory is B * L * V floats: chunk the rows for a large vocabulary.
    Prompts left-padded (B, P), completions right-padded (B, L).
    """
    require_number("temperature", temperature, above=0)
    if not bool((prompt_mask.sum(1) > 0).all()):
        raise ValueError("a prompt row is all padding; every prompt needs at least one token")
    num_completion = completion_ids.shape[1]  # L
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, P + L)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1).long()  # (B, P + L)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)  # (B, P + L): pads never shift real tokens
    with policy.autocast():
        out = policy.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            logits_to_keep=num_completion + 1,  # positions P-1 .. P+L-1
        )
    logits = out.logits[:, :-1].float()  # (B, L, V): position P-1+t predicts completion token t
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)  # (B, L, V)


@overload
def sequence_logprobs(policy: Policy, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      completion_ids: torch.Tensor, completion_mask: torch.Tensor, *, temperature: float = 1.0,
                      with_entropy: Literal[False] = False) -> torch.Tensor: ...


@overload
def sequence_logprobs(policy: Policy, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      completion_ids: torch.Tensor, completion_mask: torch.Tensor, *, temperature: float = 1.0,
                      with_entropy: Literal[True]) -> tuple[torch.Tensor, torch.Tensor]: ...


def sequence_logprobs(policy: Policy, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      completion_ids: torch.Tensor, completion_mask: torch.Tensor, *, temperature: float = 1.0,
                      with_entropy: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced per-token log-probs of the completion tokens: ``token_logp`` (B, L), float32.

    ``token_logp[b, t] = log_softmax(logits / temperature)[b, P - 1 + t, completion_ids[b, t]]``
    (the logits at the position before the token; ``next_token_logprobs`` gathered), computed in float32 and
    exactly 0.0 where ``completion_mask == 0``. Differentiable w.r.t. the model.
    With ``with_entropy=True`` returns ``(token_logp, token_entropy)``, the
    entropy of the same (temperature-scaled) distributions, without gradient,
    0.0 on padding. Prompts left-padded (B, P), completions right-padded (B, L).
    """
    logp_all = next_token_logprobs(policy, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                   temperature=temperature)  # (B, L, V)
    token_logp = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # (B, L)
    pad = completion_mask == 0
    token_logp = token_logp.masked_fill(pad, 0.0)
    if not with_entropy:
        return token_logp
    with torch.no_grad():
        token_entropy = -(logp_all.exp() * logp_all).sum(-1).masked_fill(pad, 0.0)  # (B, L)
    return token_logp, token_entropy

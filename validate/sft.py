"""Supervised warm start of a validator policy: cross-entropy on completion tokens only.

Paper: RLOO group replay (docs/REFERENCES.md), Sec. 4: the policy (and the frozen reference) start
from a supervised fine-tuning checkpoint, and RLOO with replay runs from there (SFT before RL).

* ``sft_warm_start``: AdamW on the mean cross-entropy of the ``answer + EOS`` tokens given the prompt
  (prompt tokens masked), batches without replacement with an explicit ``torch.Generator``. The
  log-probs are ``validate/logprobs.py``'s ``sequence_logprobs``, the ones RL training uses.

| code name          | paper symbol                      | meaning                                  |
|--------------------|-----------------------------------|------------------------------------------|
| ``examples``       | (x, y) pairs                      | prompt and reference answer              |
| ``token_logp``     | log pi_theta(y_t given x, y_<t)   | teacher-forced, RLOO Eq. (2)'s log pi    |
| ``loss``           | -(1/T) sum_t log pi_theta(y_t ..) | mean CE per completion token (nats)      |
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .logprobs import prompt_token_ids, sequence_logprobs
from .policy import Policy
from .tokenizer import pad_batch


def sft_warm_start(
    policy: Policy,
    examples: Sequence[tuple[str, str]],
    steps: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
    *,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Supervised warm start: AdamW on the mean cross-entropy of completion tokens (prompt masked).

    ``examples`` are ``(prompt, answer)`` pairs; the target is ``answer + EOS``.
    Batches are drawn without replacement, reshuffling every epoch with
    ``generator``. Returns the loss of every step (nats per completion token); ``on_step(step, loss)``
    is called after each (progress display).
    """
    if not examples or steps < 0 or batch_size < 1 or lr <= 0:
        raise ValueError(
            f"{len(examples)} examples, steps={steps}, batch_size={batch_size}, lr={lr}; "
            "need examples, steps >= 0, batch_size >= 1, lr > 0"
        )
    tok, model, device = policy.tokenizer, policy.model, policy.device
    prompt_seqs = prompt_token_ids(policy, [p for p, _ in examples])
    answer_seqs = [tok.encode(a, add_eos=True) for _, a in examples]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    was_training = model.training
    model.train()
    losses: list[float] = []
    order: list[int] = []
    for _ in range(steps):
        if len(order) < batch_size:  # new epoch: keep the leftovers, append a fresh permutation
            order += torch.randperm(len(examples), generator=generator, device=generator.device).tolist()
        batch, order = order[:batch_size], order[batch_size:]
        p_ids, p_mask = pad_batch([prompt_seqs[i] for i in batch], tok.pad_token_id, left_pad=True)  # (b, P)
        c_ids, c_mask = pad_batch([answer_seqs[i] for i in batch], tok.pad_token_id, left_pad=False)  # (b, L)
        c_mask = c_mask.to(device)
        token_logp = sequence_logprobs(policy, p_ids.to(device), p_mask.to(device), c_ids.to(device), c_mask)
        loss = -token_logp.sum() / c_mask.sum()  # mean CE per completion token
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(len(losses), losses[-1])
    model.train(was_training)
    return losses

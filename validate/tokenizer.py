"""A character-level tokenizer for the tiny Qwen2-architecture validator model.

Real Qwen checkpoints come with their own BPE tokenizer; on a machine without
hub access the validator trains a tiny model from scratch, and for Countdown a
character vocabulary is all it needs (digits, operators, spaces and the few
letters of the prompt template). Ids:

| id            | token                                   |
|---------------|-----------------------------------------|
| 0             | PAD (``pad_token_id``)                  |
| 1             | BOS (``bos_token_id``)                  |
| 2             | EOS (``eos_token_id``)                  |
| 3 + i         | ``alphabet[i]``                         |

``batch_encode`` left-pads by default: generation appends tokens on the right,
so every prompt must end at the same column (the HF convention for decoder-only
generation). The same minimal interface (``encode``, ``decode``,
``batch_encode``, ``pad/bos/eos_token_id``, ``vocab_size``) is what
``validate/policy.py`` wraps a Hugging Face tokenizer in (``HFTokenizer``) for real checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
_NUM_SPECIAL = 3
FILENAME = "char_tokenizer.json"


def pad_batch(
    seqs: Sequence[Sequence[int]], pad_id: int, left_pad: bool = True, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack token lists into ``(input_ids, attention_mask)``, both ``(B, T)`` long, T = max(T_max, ``width``).

    Left padding puts the pads before the tokens (prompts for generation);
    right padding after them (completions). Shared by both tokenizer kinds.
    """
    width = max(max((len(s) for s in seqs), default=0), width or 0)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)  # (B, T)
    for row, seq in enumerate(seqs):
        n = len(seq)
        if n == 0:
            continue
        cols = slice(width - n, width) if left_pad else slice(0, n)
        ids[row, cols] = torch.as_tensor(list(seq), dtype=torch.long)
        mask[row, cols] = 1
    return ids, mask


class CharTokenizer:
    """One id per character of ``alphabet`` plus PAD, BOS and EOS (see module table)."""

    def __init__(self, alphabet: str):
        if len(set(alphabet)) != len(alphabet):
            dup = sorted({c for c in alphabet if alphabet.count(c) > 1})
            raise ValueError(f"alphabet has repeated characters {dup!r}; pass each character once")
        if not alphabet:
            raise ValueError("alphabet is empty; pass every character prompts and answers use")
        self.alphabet = alphabet
        self._char_to_id = {c: _NUM_SPECIAL + i for i, c in enumerate(alphabet)}
        self.pad_token_id = PAD_ID
        self.bos_token_id = BOS_ID
        self.eos_token_id = EOS_ID

    @property
    def vocab_size(self) -> int:
        return _NUM_SPECIAL + len(self.alphabet)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = [BOS_ID] if add_bos else []
        for ch in text:
            try:
                ids.append(self._char_to_id[ch])
            except KeyError:
                raise ValueError(
                    f"character {ch!r} is not in the tokenizer alphabet; "
                    "add it to the alphabet the tokenizer was built from"
                ) from None
        if add_eos:
            ids.append(EOS_ID)
        return ids

    def decode(self, ids: Sequence[int] | torch.Tensor, skip_special: bool = True) -> str:
        names = {PAD_ID: "<pad>", BOS_ID: "<bos>", EOS_ID: "<eos>"}
        out = []
        for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids):
            if i < _NUM_SPECIAL:
                if not skip_special:
                    out.append(names[i])
            elif i < self.vocab_size:
                out.append(self.alphabet[i - _NUM_SPECIAL])
            else:
                raise ValueError(f"token id {i} is outside the vocabulary (size {self.vocab_size})")
        return "".join(out)

    def batch_encode(
        self,
        texts: Sequence[str],
        left_pad: bool = True,
        add_bos: bool = False,
        add_eos: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask)``, ``(B, T_max)`` long; left-padded by default."""
        seqs = [self.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]
        return pad_batch(seqs, self.pad_token_id, left_pad=left_pad)

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / FILENAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"kind": "char", "alphabet": self.alphabet}))
        return path

    @classmethod
    def load(cls, directory: str | Path) -> "CharTokenizer":
        path = Path(directory) / FILENAME
        try:
            data = json.loads(path.read_text())
            return cls(data["alphabet"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            msg = " ".join(str(e).split())
            raise ValueError(f"cannot read character tokenizer '{path}': {msg}") from None

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, alphabet={self.alphabet!r})"

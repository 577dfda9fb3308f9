"""The tiny character-level Qwen2 the TRL integration tests train (tests/conftest.py puts this folder on sys.path).

Imported after each test module's ``pytest.importorskip("torch")`` / ``("trl")``: it needs torch, tokenizers and
transformers.
"""

from __future__ import annotations

import torch


def char_tokenizer():
    """A word-level tokenizer over the characters a-h and space, one token a character; <pad> = 0, <eos> = 1."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate("abcdefgh ")}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def tiny_qwen2(tokenizer, dtype: torch.dtype = torch.float32):
    """A 2-layer, hidden-32 Qwen2 for ``tokenizer``, initialised from torch seed 0 without touching the global
    random state."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                         tie_word_embeddings=True, use_sliding_window=False, pad_token_id=0, eos_token_id=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Qwen2ForCausalLM(config).to(dtype)

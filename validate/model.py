"""The validator's policy: a Qwen2-architecture causal LM, its sampler and its log-probs.

Computes, for the RLOO-with-group-replay validation on Countdown
(``RLOO group replay              `` in shared papers; notes in
``docs/REFERENCES.md``):

* ``load_policy``: either a TINY Qwen2 model built from ``transformers.Qwen2Config``
  with the character tokenizer of ``validate/tokenizer.py`` (``source="tiny"``;
  no hub access needed), or a REAL checkpoint (a local directory or a hub id such
  as ``Qwen/Qwen2.5-0.5B-Instruct``) loaded with ``AutoModelForCausalLM`` /
  ``AutoTokenizer``. Only the loading differs: both yield a ``Policy`` whose
  tokenizer has the same minimal interface, and everything below is shared.
* ``generate``: a hand-written KV-cached sampling loop (``torch.multinomial``
  with an explicit ``torch.Generator``, so the same seed gives the same
  samples) that records the behaviour log-probs ``logp_behav`` of the sampled
  tokens from the sampling forward pass itself.
* ``sequence_logprobs``: teacher-forced per-token log-probs of completion tokens
  (differentiable), optionally with their entropies; ``next_token_logprobs``: the full
  next-token log-distribution over the vocabulary at each completion position, which it gathers
  from (exact KL between two policies, ``validate/calibrate.py``).
* ``sft_warm_start``: the supervised warm start (paper: SFT before RL) as
  cross-entropy on completion tokens only.
* ``save_checkpoint`` / ``load_checkpoint``.

The vLLM sampler lives in ``validate/vllm_engine.py`` (the sampler interface both
engines implement is in ``validate/engines.py``); this module only offers
``vllm_available()`` and ``require_vllm()``.

Precision: parameters (and so AdamW's moments) are float32 on every device; on
CUDA the forward/backward passes and HF sampling run under bfloat16 autocast
(``Policy.autocast``), on CPU there is no autocast at all.

Conventions (read these before writing the RL loop):

* Padding: prompts are LEFT-padded (every prompt ends at the same column, so
  generation appends on the right); completions are RIGHT-padded with
  ``pad_token_id`` and ``completion_mask == 0``. A completion includes its EOS
  token (mask 1) when it stopped; it is cut at ``max_new_tokens`` otherwise.
* Positions: ``position_ids = cumsum(mask) - 1`` over ``[prompt, completion]``,
  so left padding never shifts the positions of real tokens.
* Rows: ``generate`` returns ``B * num_samples`` rows, prompt-major: row
  ``i * num_samples + k`` is sample k of prompt i (``Rollouts.prompt_index``),
  i.e. a ``(B, K)`` reshape gives the RLOO groups.
* Log-probs are per token, float32, exactly 0.0 on padding; a sequence log-prob
  is their sum over the completion (RLOO Eq. (2) uses the sequence ratio).
* Temperature: ``logp_behav`` is the log-prob under the SAMPLING distribution,
  ``log_softmax(logits / T)`` (after top-k/top-p truncation if those are used,
  renormalised). ``sequence_logprobs(..., temperature=T)`` computes the same
  distribution, so with equal weights the log-ratio of fresh data is ~0 (1e-6
  in float32); at T = 1 (the paper's training temperature) it is plain log pi.

| code name          | paper symbol                    | where                      |
|--------------------|---------------------------------|----------------------------|
| ``token_logp``     | log pi_theta(y_t given x, y_<t) | RLOO Eq. (2), (3)          |
| ``logp_behav``     | log mu(y_t given x, y_<t)       | RLOO Eq. (2): stored at sampling time |
| ``token_entropy``  | H[pi_theta(. given x, y_<t)]    | RLOO Eq. (3), beta_H term (here without grad) |
| ``num_samples``    | K (8)                           | RLOO Eq. (1)               |
| ``temperature``    | sampling temperature (1.0)      | Design, notes              |
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import inspect
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .tokenizer import CharTokenizer, pad_batch

META_FILENAME = "replay_theory_policy.json"
_META_FORMAT = 1
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class ModelConfig:
    source: str = "tiny"
    """'tiny' builds a small Qwen2 model; else a local checkpoint directory or a hub id (Qwen/Qwen2.5-0.5B-Instruct)."""
    hidden_size: int = 64
    """Tiny model only: width of the residual stream."""
    num_layers: int = 2
    """Tiny model only: number of decoder layers."""
    num_heads: int = 4
    """Tiny model only: query heads (head dim = hidden_size / num_heads)."""
    num_kv_heads: int = 2
    """Tiny model only: key/value heads (grouped-query attention, as in Qwen2)."""
    intermediate_size: int = 128
    """Tiny model only: SwiGLU hidden width."""
    max_position_embeddings: int = 128
    """Tiny model only: longest prompt + completion the model is meant for."""
    device: str = "cpu"
    """Torch device: cpu or cuda (cuda:N)."""
    dtype: str | None = None
    """Parameter (master-weight) dtype: float32, bfloat16 or float16; None = float32 on every device."""
    compute_dtype: str | None = None
    """Forward/backward dtype: None = bfloat16 autocast on CUDA, the parameter dtype on CPU."""
    seed: int = 0
    """Seed of the tiny model's initialisation (does not touch the global RNG)."""


def _dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype '{name}'; use one of {', '.join(_DTYPES)}")
    return _DTYPES[name]


def resolve_dtype(config: ModelConfig) -> torch.dtype:
    """The parameter (master-weight) dtype: ``config.dtype``, else float32 on every device.

    Why float32 on CUDA too: AdamW keeps its moments in the parameter dtype, and an
    update of lr ~ 3e-7 (the paper's Qwen3-0.6B rate) relative to weights of ~1e-2 is
    far below bfloat16's resolution (2^-8), so pure-bf16 weights would not move at all.
    bfloat16 enters through autocast (``resolve_compute_dtype``) instead.
    """
    return torch.float32 if config.dtype is None else _dtype(config.dtype)


def resolve_compute_dtype(config: ModelConfig) -> torch.dtype:
    """The matmul dtype of forward/backward passes: ``config.compute_dtype``, else bfloat16 on CUDA
    (autocast over float32 master weights) and the parameter dtype on CPU (no autocast: CPU runs
    stay bit-identical to plain float32)."""
    if config.compute_dtype is not None:
        return _dtype(config.compute_dtype)
    return torch.bfloat16 if torch.device(config.device).type == "cuda" else resolve_dtype(config)


def resolve_device(name: str) -> torch.device:
    """``torch.device(name)``, refusing CUDA when there is no GPU."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"unknown device '{name}': {_one_line(e)}; use --device cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("CUDA requested but torch.cuda.is_available() is False; use --device cpu")
    return device


def _one_line(err: BaseException | str, limit: int = 300) -> str:
    text = " ".join(str(err).split()).rstrip(".")
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- policy


class HFTokenizer:
    """A Hugging Face tokenizer behind ``CharTokenizer``'s minimal interface."""

    def __init__(self, hf_tokenizer: Any):
        self.hf = hf_tokenizer
        self.eos_token_id: int = hf_tokenizer.eos_token_id
        if self.eos_token_id is None:
            raise ValueError(
                "the checkpoint's tokenizer has no EOS token; pass a checkpoint whose tokenizer defines eos_token"
            )
        pad = hf_tokenizer.pad_token_id
        self.pad_token_id: int = self.eos_token_id if pad is None else pad  # masked anyway
        self.bos_token_id: int | None = hf_tokenizer.bos_token_id  # None for Qwen
        self.vocab_size: int = len(hf_tokenizer)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = list(self.hf(text, add_special_tokens=False)["input_ids"])
        if add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        return ids + [self.eos_token_id] if add_eos else ids

    def decode(self, ids: Sequence[int] | torch.Tensor, skip_special: bool = True) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return self.hf.decode(ids, skip_special_tokens=skip_special)

    def batch_encode(
        self, texts: Sequence[str], left_pad: bool = True, add_bos: bool = False, add_eos: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        seqs = [self.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]
        return pad_batch(seqs, self.pad_token_id, left_pad=left_pad)


Tokenizer = CharTokenizer | HFTokenizer


@dataclass
class Policy:
    """A causal LM, its tokenizer and where it lives. Built only by ``load_policy`` / ``load_checkpoint``."""

    model: Any  # transformers PreTrainedModel (causal LM)
    tokenizer: Tokenizer
    device: torch.device
    config: ModelConfig
    stop_token_ids: tuple[int, ...] = field(default=())
    """Token ids that end a completion: the tokenizer's EOS plus the checkpoint's generation_config EOS ids."""

    def autocast(self):
        """Mixed precision for forward passes: bf16 autocast on CUDA over fp32 weights; a no-op on CPU."""
        param_dtype = next(self.model.parameters()).dtype
        compute = resolve_compute_dtype(self.config)
        enabled = self.device.type == "cuda" and compute != param_dtype
        return torch.autocast(device_type=self.device.type, dtype=compute, enabled=enabled)


def load_policy(config: ModelConfig, alphabet: str | None = None) -> Policy:
    """Build the tiny model (``alphabet`` required) or load a real checkpoint (``alphabet`` ignored)."""
    device = resolve_device(config.device)
    dtype = resolve_dtype(config)
    if config.source == "tiny":
        if alphabet is None:
            raise ValueError("the tiny model needs an alphabet; pass countdown.ALPHABET")
        tokenizer: Tokenizer = CharTokenizer(alphabet)
        model = _build_tiny(config, tokenizer)
    else:
        model, tokenizer = _load_pretrained(config.source, dtype)
    return _finish(model, tokenizer, device, dtype, config)


def _build_tiny(config: ModelConfig, tokenizer: CharTokenizer) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if config.hidden_size % config.num_heads or config.num_heads % config.num_kv_heads:
        raise ValueError(
            f"hidden_size={config.hidden_size}, num_heads={config.num_heads}, num_kv_heads={config.num_kv_heads}: "
            "hidden_size must be a multiple of num_heads and num_heads a multiple of num_kv_heads"
        )
    hf_config = Qwen2Config(
        vocab_size=tokenizer.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,  # as in Qwen2.5-0.5B
        use_sliding_window=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    # Deterministic init from config.seed without disturbing anyone's global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return Qwen2ForCausalLM(hf_config)


def _looks_like_path(source: str) -> bool:
    return os.path.exists(source) or source.startswith(("/", "./", "../", "~", ".\\")) or source.count("/") > 1


def _load_pretrained(source: str, dtype: torch.dtype) -> tuple[Any, HFTokenizer]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    fix = "pass a local directory with config.json or a reachable hub id"
    if _looks_like_path(source):
        path = Path(source).expanduser()
        if not path.is_dir():
            raise ValueError(f"cannot load model '{source}': no such directory; {fix}")
        if not (path / "config.json").is_file():
            raise ValueError(f"cannot load model '{source}': the directory has no config.json; {fix}")
        source = str(path)
    try:
        hf_config = AutoConfig.from_pretrained(source)
    except Exception as e:  # OSError, ValueError, hub errors: all mean "cannot load"
        raise ValueError(f"cannot load model '{source}': {_one_line(e)}; {fix}") from None
    if type(hf_config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ValueError(
            f"model '{source}' is a '{hf_config.model_type}' checkpoint, not a causal LM; "
            "pass a decoder-only checkpoint such as Qwen/Qwen2.5-0.5B-Instruct"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        hf_tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as e:
        raise ValueError(f"cannot load model '{source}': {_one_line(e)}; {fix}") from None
    return model, HFTokenizer(hf_tokenizer)


def _finish(model: Any, tokenizer: Tokenizer, device: torch.device, dtype: torch.dtype, config: ModelConfig) -> Policy:
    model = model.to(device=device, dtype=dtype)
    model.eval()
    stop = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        stop.update([gen_eos] if isinstance(gen_eos, int) else gen_eos)
    return Policy(model=model, tokenizer=tokenizer, device=device, config=config, stop_token_ids=tuple(sorted(stop)))


def num_parameters(policy: Policy) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in policy.model.parameters())


# --------------------------------------------------------------------------- log-probs


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


def next_token_logprobs(
    policy: Policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """The full teacher-forced next-token log-distribution at every completion position: (B, L, V), float32.

    ``logp_all[b, t] = log_softmax(logits / temperature)[b, P - 1 + t]``, the distribution
    pi(. given x, y_<t) the t-th completion token is drawn from, over the whole vocabulary
    (computed in float32). Rows at padding positions (``completion_mask == 0``) are the model's
    distribution after the padding tokens: callers mask them. Differentiable w.r.t. the model.
    Memory is B * L * V floats: chunk the rows for a large vocabulary.
    Prompts left-padded (B, P), completions right-padded (B, L).
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature}; must be > 0")
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


def sequence_logprobs(
    policy: Policy,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
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


# --------------------------------------------------------------------------- sampling


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


# --------------------------------------------------------------------------- SFT


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


# --------------------------------------------------------------------------- checkpoints


def save_checkpoint(policy: Policy, path: str | Path) -> Path:
    """Write model (``save_pretrained``), tokenizer and ``replay_theory_policy.json`` (written last)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta_path = path / META_FILENAME
    meta_path.unlink(missing_ok=True)  # an interrupted overwrite must read as incomplete
    policy.model.save_pretrained(path)
    if isinstance(policy.tokenizer, CharTokenizer):
        policy.tokenizer.save(path)
        kind = "char"
    else:
        policy.tokenizer.hf.save_pretrained(path)
        kind = "hf"
    meta = {"format": _META_FORMAT, "tokenizer": kind, "config": dataclasses.asdict(policy.config)}
    tmp = path / (META_FILENAME + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2))
    os.replace(tmp, meta_path)
    return path


def load_checkpoint(path: str | Path, device: str | None = None, dtype: str | None = None) -> Policy:
    """Load a ``save_checkpoint`` directory; ``device`` / ``dtype`` override the saved config."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    fix = "delete it or point --resume elsewhere"

    def corrupt(why: str) -> ValueError:
        return ValueError(f"checkpoint '{path}' is corrupt or incomplete: {_one_line(why)}; {fix}")

    if not path.is_dir():
        raise ValueError(f"checkpoint '{path}' does not exist; pass a directory written by save_checkpoint")
    try:
        meta = json.loads((path / META_FILENAME).read_text())
        if meta.get("format") != _META_FORMAT or meta.get("tokenizer") not in ("char", "hf"):
            raise ValueError(f"unknown format {meta.get('format')!r} / tokenizer {meta.get('tokenizer')!r}")
        config = ModelConfig(**meta["config"])
    except Exception as e:
        raise corrupt(f"{META_FILENAME}: {e}") from None
    overrides = {k: v for k, v in (("device", device), ("dtype", dtype)) if v is not None}
    config = dataclasses.replace(config, **overrides)
    torch_device = resolve_device(config.device)
    torch_dtype = resolve_dtype(config)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, output_loading_info=True)
        if info.get("missing_keys") or info.get("mismatched_keys"):
            missing = list(info.get("missing_keys") or []) + [str(k) for k in info.get("mismatched_keys") or []]
            raise ValueError(f"weights missing or mismatched: {missing[:3]}")
        if meta["tokenizer"] == "char":
            tokenizer: Tokenizer = CharTokenizer.load(path)
        else:
            tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(path))
    except Exception as e:
        raise corrupt(str(e)) from None
    return _finish(model, tokenizer, torch_device, torch_dtype, config)


# --------------------------------------------------------------------------- vLLM


def vllm_available() -> bool:
    """Whether the optional vLLM package is importable (the vLLM sampler is a separate module)."""
    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> None:
    """Raise a one-line ValueError with the install hint when vLLM is absent."""
    if not vllm_available():
        raise ValueError("vLLM requested but not installed: pip install 'replay-theory[gpu]' (needs a CUDA GPU)")

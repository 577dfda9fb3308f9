"""The validator's policy: a Qwen2-architecture causal LM and its tokenizer, built, loaded and checkpointed.

Paper: RLOO group replay (docs/REFERENCES.md), Sec. 4: the policy pi_theta of the RLOO-with-group-replay
validation on Countdown (Qwen2.5-0.5B from an SFT checkpoint there).

* ``load_policy``: either a TINY Qwen2 model built from ``transformers.Qwen2Config``
  with the character tokenizer of ``validate/tokenizer.py`` (``source="tiny"``;
  no hub access needed), or a REAL checkpoint (a local directory or a hub id such
  as ``Qwen/Qwen2.5-0.5B-Instruct``) loaded with ``AutoModelForCausalLM`` /
  ``AutoTokenizer``. Only the loading differs: both yield a ``Policy`` whose
  tokenizer has the same minimal interface (``HFTokenizer`` wraps a Hugging Face one),
  and everything that uses a policy is shared.
* ``save_checkpoint`` / ``load_checkpoint``: a ``save_pretrained`` directory plus
  ``replay_theory_policy.json`` (written last, so an interrupted write reads as incomplete).
* ``resolve_dtype`` / ``resolve_compute_dtype`` / ``resolve_device``: where and in what precision it runs.

Precision: parameters (and so AdamW's moments) are float32 on every device; on
CUDA the forward/backward passes and HF sampling run under bfloat16 autocast
(``Policy.autocast``), on CPU there is no autocast at all (why: docs/VALIDATION.md, 'Rollout engines').

| code name                  | paper symbol   | where                                          |
|----------------------------|----------------|------------------------------------------------|
| ``Policy.model``           | pi_theta       | RLOO Eq. (2), (3)                              |
| ``Policy.stop_token_ids``  | EOS            | a completion ends at (and includes) one of them |
| ``ModelConfig.dtype``      | -              | master-weight dtype (float32 by default)       |
| ``ModelConfig.compute_dtype`` | -           | autocast dtype (bfloat16 on CUDA by default)   |
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, cast

import torch

from .tokenizer import CharTokenizer, pad_batch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

META_FILENAME = "replay_theory_policy.json"
_META_FORMAT = 1
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class TinyArchitecture:
    """The tiny Qwen2's shape (``ModelConfig``'s fields that only ``source="tiny"`` reads; validate/config.py's
    ``TINY_MODEL`` is the validator's)."""

    hidden_size: int = 64
    """Width of the residual stream."""
    num_layers: int = 2
    """Number of decoder layers."""
    num_heads: int = 4
    """Query heads (head dim = hidden_size / num_heads)."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention, as in Qwen2)."""
    intermediate_size: int = 128
    """SwiGLU hidden width."""
    max_position_embeddings: int = 128
    """Longest prompt + completion the model is meant for."""


@dataclass(frozen=True)
class ModelConfig(TinyArchitecture):
    """Which model (the tiny one, of its ``TinyArchitecture``, or a checkpoint), where and in what precision."""

    source: str = "tiny"
    """'tiny' builds a small Qwen2 model; else a local checkpoint directory or a hub id (Qwen/Qwen2.5-0.5B-Instruct)."""
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
        loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, output_loading_info=True)
        # output_loading_info=True: (model, info); transformers' annotation says the model alone
        model, info = cast("tuple[PreTrainedModel, dict[str, list]]", loaded)
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
